// max.cu - max (values and indices) and argmax over the last dim, as torch.max(x, -1).
//
// Semantics (torch's, on CPU and CUDA): the largest value and the index of its first
// occurrence; a row holding NaN gives NaN and the index of its first NaN; a row of -inf
// gives -inf and index 0. `beats` below is that order on (value, index) pairs; it is a
// total order, so any combine tree (and any assignment of elements to threads) gives the
// same answer: bitwise deterministic.
//
// Variants:
//   v1   max_rows_v1_*     one thread per row, a serial scan (neighbouring threads read
//                          addresses a row apart: uncoalesced) - the naive baseline.
//   cuda max_rows_warp_* / max_rows_block_*: a warp per row (rows <= 1024 columns) or a
//                          256-thread block per row; each thread keeps U 16-byte loads in
//                          flight and a running (value, index); warp shuffles, then one
//                          shared-memory step across warps. A row that starts off a 16-byte
//                          boundary (odd widths) reads its first few elements one a lane and
//                          the rest in 16-byte packs. Read once, 12 bytes written per row.
//        max_grad_*        the backward (both CUDA variants): dx written in one pass, zero
//                          but dy at the argmax, 16-byte stores the same way.
// vals may be null (argmax): only indices are written.
#include "common.cuh"
#include "reduce.cuh"

namespace {

constexpr int U = 4;  // 16-byte packs in flight per thread and loop step
constexpr int NO_INDEX = 0x7fffffff;

// Whether (av, ai) comes before (bv, bi): NaN first (the earlier NaN among NaNs), then the
// larger value, then the smaller index. The identity (-inf, NO_INDEX) loses to every element.
__device__ __forceinline__ bool beats(float av, int ai, float bv, int bi) {
    if (av != av) return bv == bv || ai < bi;
    if (bv != bv) return false;
    return av > bv || (av == bv && ai < bi);
}

struct Best {
    float v = kl::neg_inf();
    int i = NO_INDEX;
    __device__ __forceinline__ void take(float v2, int i2) {
        if (beats(v2, i2, v, i)) {
            v = v2;
            i = i2;
        }
    }
};

__device__ __forceinline__ Best warp_best(Best b) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const float v = __shfl_xor_sync(kl::FULL_MASK, b.v, off);
        const int i = __shfl_xor_sync(kl::FULL_MASK, b.i, off);
        b.take(v, i);
    }
    return b;
}

template <typename T>
__device__ __forceinline__ void write(T* vals, long long* idx, long long r, Best b) {
    idx[r] = b.i;
    if (vals) vals[r] = kl::from_f<T>(b.v);
}

template <typename T>
__device__ void max_rows_v1(const T* __restrict__ x, T* vals, long long* __restrict__ idx, long long rows, int cols) {
    const long long r = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const T* row = x + r * cols;
    Best b;
    for (int j = 0; j < cols; ++j) b.take(kl::to_f(row[j]), j);
    write(vals, idx, r, b);
}

// Of the n elements at p, how many come before the first 16-byte aligned address.
template <typename T>
__device__ __forceinline__ int head_elems(const T* p, int n) {
    return min(n, (int)(((16 - ((unsigned long long)p & 15)) & 15) / sizeof(T)));
}

// The running best of one thread of a G-thread group (G >= 32) that owns the row. The
// elements before the row's first 16-byte aligned address (`head`, fewer than 16 bytes'
// worth) are read one each by the first lanes, the rest as 16-byte packs, U in flight per
// thread, and the last partial pack one element a lane: every row gets 16-byte loads,
// whatever its width.
template <typename T>
__device__ __forceinline__ Best group_row_best(const T* __restrict__ row, int cols, int lane, int G) {
    using V = kl::Vec16<T>;
    Best b;
    const int head = head_elems(row, cols);
    if (lane < head) b.take(kl::to_f(row[lane]), lane);
    const int npacks = (cols - head) / V::N;
    const int4* p = reinterpret_cast<const int4*>(row + head);
    for (int base = lane; base < npacks; base += G * U) {
        V r[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int q = base + u * G;
            if (q < npacks) r[u].raw = kl::load16(p + q);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int q = base + u * G;
            if (q < npacks) {
#pragma unroll
                for (int j = 0; j < V::N; ++j) b.take(kl::to_f(r[u].e[j]), head + q * V::N + j);
            }
        }
    }
    for (int j = head + npacks * V::N + lane; j < cols; j += G) b.take(kl::to_f(row[j]), j);
    return b;
}

template <typename T>
__device__ void max_rows_warp(const T* __restrict__ x, T* vals, long long* __restrict__ idx, long long rows, int cols) {
    const long long r = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (r >= rows) return;  // whole warps leave together
    const int lane = threadIdx.x & 31;
    const Best b = warp_best(group_row_best<T>(x + r * cols, cols, lane, 32));
    if (lane == 0) write(vals, idx, r, b);
}

template <typename T>
__device__ void max_rows_block(const T* __restrict__ x, T* vals, long long* __restrict__ idx, long long rows, int cols) {
    __shared__ float sv[32];
    __shared__ int si[32];
    const long long r = blockIdx.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    Best b = warp_best(group_row_best<T>(x + r * cols, cols, threadIdx.x, blockDim.x));
    if (lane == 0) {
        sv[warp] = b.v;
        si[warp] = b.i;
    }
    __syncthreads();
    if (warp == 0) {
        Best c;
        if (lane < warps) {
            c.v = sv[lane];
            c.i = si[lane];
        }
        c = warp_best(c);
        if (lane == 0) write(vals, idx, r, c);
    }
}

// Gradient of max: one pass over dx (torch's backward writes zeros, then scatters: two
// launches). Short rows: a row of n elements that is zero but for g at `hit`, stored as the
// forward reads (the elements before the first 16-byte aligned address one a lane, then
// 16-byte packs, then the last partial pack).
template <typename T>
__device__ __forceinline__ void group_seg_grad(T* __restrict__ seg, int n, int hit, T g, int lane, int G) {
    using V = kl::Vec16<T>;
    const T zero = kl::from_f<T>(0.0f);
    const int head = head_elems(seg, n);
    if (lane < head) seg[lane] = lane == hit ? g : zero;
    const int npacks = (n - head) / V::N;
    int4* p = reinterpret_cast<int4*>(seg + head);
    for (int q = lane; q < npacks; q += G) {
        const int k = hit - head - q * V::N;
        V v;
#pragma unroll
        for (int j = 0; j < V::N; ++j) v.e[j] = j == k ? g : zero;
        kl::store16(p + q, v.raw);
    }
    for (int j = head + npacks * V::N + lane; j < n; j += G) seg[j] = j == hit ? g : zero;
}

// A warp per row (rows up to WARP_ROW_MAX columns).
template <typename T>
__device__ void max_grad_warp(const T* __restrict__ dv, const long long* __restrict__ idx, T* dx, long long rows,
                              int cols) {
    const long long r = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (r >= rows) return;
    group_seg_grad<T>(dx + r * cols, cols, (int)idx[r], dv[r], threadIdx.x & 31, 32);
}

// Long rows (more columns than a pack has elements): dx seen as the flat run of 16-byte
// packs it is (a fresh allocation, so its base is aligned). Row r owns the packs from the
// one holding its first element up to the one holding row r + 1's first: every store is a
// whole aligned pack, even at odd widths (a row's block writing its own partial first and
// last packs, its neighbours writing the rest of them at other times, ran ~15% slower than
// torch's zero fill at fp32 8191x50257). The first of a row's packs may end the previous
// row: its dy at the previous row's argmax is written there. A block per `chunk_packs` packs
// of a row (blockIdx.y > 0 when there are too few rows to fill the device); the last row's
// last block also writes the tensor's last partial pack, one element a thread.
template <typename T>
__device__ void max_grad_block(const T* __restrict__ dv, const long long* __restrict__ idx, T* dx, long long rows,
                               int cols, int chunk_packs) {
    using V = kl::Vec16<T>;
    const T zero = kl::from_f<T>(0.0f);
    const long long r = blockIdx.x;
    const long long first = r * cols / V::N;
    const long long stop = (r + 1) * cols;  // the next row's first element (the last row's: the end)
    const long long end = stop / V::N;
    const long long q0 = first + (long long)blockIdx.y * chunk_packs;
    const long long q1 = min(q0 + chunk_packs, end);
    const long long hit = r * cols + idx[r];
    const long long prev_hit = r > 0 ? (r - 1) * cols + idx[r - 1] : -1;
    const T g = dv[r], prev_g = r > 0 ? dv[r - 1] : zero;
    int4* p = reinterpret_cast<int4*>(dx);
    for (long long q = q0 + threadIdx.x; q < q1; q += blockDim.x) {
        V v;
#pragma unroll
        for (int j = 0; j < V::N; ++j) {
            const long long e = q * V::N + j;
            v.e[j] = e == hit ? g : (e == prev_hit ? prev_g : zero);
        }
        kl::store16(p + q, v.raw);
    }
    if (r + 1 == rows && blockIdx.y + 1 == gridDim.y) {
        for (long long e = end * V::N + threadIdx.x; e < stop; e += blockDim.x) dx[e] = e == hit ? g : zero;
    }
}

}  // namespace

// One entry point NAME_S(x, vals, idx, rows, cols) around the kernel template given last.
#define KL_MAX_ENTRY(NAME, S, T, ...)                                                                     \
    extern "C" __global__ void NAME##_##S(const T* x, T* vals, long long* idx, long long rows, int cols) { \
        __VA_ARGS__(x, vals, idx, rows, cols);                                                            \
    }

#define KL_MAX_KERNELS(S, T)                                                                                  \
    KL_MAX_ENTRY(max_rows_v1, S, T, max_rows_v1<T>)                                                           \
    KL_MAX_ENTRY(max_rows_warp, S, T, max_rows_warp<T>)                                                       \
    KL_MAX_ENTRY(max_rows_block, S, T, max_rows_block<T>)                                                     \
    extern "C" __global__ void max_grad_warp_##S(const T* dv, const long long* idx, T* dx, long long rows,   \
                                                 int cols) {                                                  \
        max_grad_warp<T>(dv, idx, dx, rows, cols);                                                            \
    }                                                                                                         \
    extern "C" __global__ void max_grad_block_##S(const T* dv, const long long* idx, T* dx, long long rows,  \
                                                  int cols, int chunk_packs) {                                \
        max_grad_block<T>(dv, idx, dx, rows, cols, chunk_packs);                                              \
    }

KL_FOR_EACH_DTYPE(KL_MAX_KERNELS)
