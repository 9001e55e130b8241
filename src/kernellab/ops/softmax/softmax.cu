// Softmax over the last dimension, forward and backward: fp32 / fp16 / bf16 storage, fp32 math.
//
//   y  = exp(x - max(x)) / sum(exp(x - max(x)))     dx = y * (dy - sum(dy * y))
//
// x, y, dy, dx are contiguous [rows, cols]. The variants walk the reduction lecture's
// checklist; each kernel name ends in _<dtype> (f32, f16, bf16):
//
//   v1  softmax_fwd_v1 / softmax_bwd_v1: one thread per row, three passes over the row
//       (max, sum, write). Neighbouring threads read addresses a row apart: nothing is
//       coalesced, and a 4096-wide row is 12K dependent loads for one thread.
//   v2  softmax_fwd_v2 / softmax_bwd_v2: one block per row; each pass is coalesced (thread
//       t reads t, t + 256, ...) and combined by a shared-memory tree with sequential
//       addressing (no divergent warps, no bank conflicts). Still three reads of the row,
//       scalar loads, and a barrier per tree level.
//   v3  one block of 256 threads per row, warp shuffles
//       (one shared-memory exchange per reduction instead of log2(256) barriers), 16-byte
//       loads, and the row kept in registers (up to 4 packs per thread) so it is read once
//       and written once - the minimum traffic. Longer rows stream twice with the online
//       softmax recurrence (running max and rescaled sum in one pass).
//   v4  (backend "cuda"): v3 with the block fitted to the row (32-1024 threads, so that
//       every thread holds up to 4 packs: thread coarsening without idle lanes; 1024 for
//       streamed rows), and one warp per row for short rows (8 rows per block, no shared
//       memory, no barrier).
//
// v3 and v4 share the entry points softmax_{fwd,bwd}_{r,l,o,w}{v,s}_<dtype>: r = one block
// per row, row in registers (up to 512 threads); l = the same up to 1024 threads (64
// registers a thread: the backward keeps its packs as loaded, 16-bit, and converts them
// where used; v4 only); o = one block per row, streamed (online softmax); w = one warp
// per row; v = 16-byte packs, s = the scalar twin for rows that are not 16-byte aligned
// (odd widths, storage offsets). The host (cuda.py) picks.
//
// The backward's dot = sum(y * dy) for fp32 rows (r, l, o, w) is compensated fp32: error-
// free products and sums carried as a pair hi + lo through the row reduction (RowDot),
// as accurate as an fp64 sum without fp64 arithmetic. v2 keeps its fp64 dot, v1 Kahan's sum.
#include "common.cuh"
#include "reduce.cuh"

namespace {

using kl::from_f;
using kl::to_f;

// Packs a thread keeps in registers (v3, v4); a tuning knob.
#ifndef KL_SOFTMAX_PACKS
#define KL_SOFTMAX_PACKS 4
#endif
constexpr int MAX_PACKS = KL_SOFTMAX_PACKS;
// Register-resident rows use at most 512 threads per block, so the compiler may give each
// thread 128 registers: the backward holds 2 x 4 packs (64 floats for 16-bit types).
#define RESIDENT_MAX_THREADS 512
// Longer resident rows (l entries): up to 1024 threads, 64 registers a thread; the
// backward keeps 2 x 4 packs as loaded (32 registers for any dtype).
#define LONG_MAX_THREADS 1024

// exp and the final scaling: fp32 rows take expf and one division (each rounded once, as
// PyTorch's kernel does); 16-bit rows take __expf and a reciprocal, whose extra ulps
// vanish in the storage rounding. With __expf fp32 rows run ~3 ulps from float64 where
// torch's are ~1, past the check's bound.
template <typename T>
__device__ __forceinline__ float ex(float v) {
    if constexpr (sizeof(T) == 4) return expf(v);
    else return __expf(v);
}
template <typename T>
__device__ __forceinline__ float scaled(float e, float s, float inv) {
    if constexpr (sizeof(T) == 4) return __fdiv_rn(e, s);
    else return e * inv;
}

// A "pack": 16 bytes (N = 16 / sizeof(T) elements) for the vector kernels, one element
// for their scalar twins.
template <typename T, bool VEC>
struct Pack {
    static constexpr int N = VEC ? 16 / sizeof(T) : 1;
    float v[N];
    __device__ __forceinline__ void load(const T* row, long long p) {
        if constexpr (VEC) {
            kl::Vec16<T> r;
            r.raw = *reinterpret_cast<const int4*>(row + p * N);
#pragma unroll
            for (int j = 0; j < N; ++j) v[j] = to_f(r.e[j]);
        } else {
            v[0] = to_f(row[p]);
        }
    }
    __device__ __forceinline__ void store(T* row, long long p) const {
        if constexpr (VEC) {
            kl::Vec16<T> r;
#pragma unroll
            for (int j = 0; j < N; ++j) r.e[j] = from_f<T>(v[j]);
            *reinterpret_cast<int4*>(row + p * N) = r.raw;
        } else {
            row[p] = from_f<T>(v[0]);
        }
    }
    __device__ __forceinline__ void fill(float f) {
#pragma unroll
        for (int j = 0; j < N; ++j) v[j] = f;
    }
    __device__ __forceinline__ float f(int j) const { return v[j]; }
};

// A pack kept as loaded (16-bit elements stay 16-bit in registers), converted where used:
// half the registers of Pack for fp16 / bf16 (the l backward's 2 x 4 packs fit in 64).
template <typename T, bool VEC>
struct RawPack {
    static constexpr int N = 16 / sizeof(T);
    kl::Vec16<T> r;
    __device__ __forceinline__ void load(const T* row, long long p) {
        r.raw = *reinterpret_cast<const int4*>(row + p * N);
    }
    __device__ __forceinline__ void fill(float f) {
#pragma unroll
        for (int j = 0; j < N; ++j) r.e[j] = from_f<T>(f);
    }
    __device__ __forceinline__ float f(int j) const { return to_f(r.e[j]); }
};
template <typename T>
struct RawPack<T, false> {
    static constexpr int N = 1;
    T e;
    __device__ __forceinline__ void load(const T* row, long long p) { e = row[p]; }
    __device__ __forceinline__ void fill(float f) { e = from_f<T>(f); }
    __device__ __forceinline__ float f(int) const { return to_f(e); }
};

// ---------------------------------------------------------------------------- v1

// s += v with Kahan's compensation (the lost low bits are carried in comp).
__device__ __forceinline__ void kahan_add(float& s, float& comp, float v) {
    const float yv = v - comp;
    const float t = s + yv;
    comp = (t - s) - yv;
    s = t;
}

template <typename T>
__device__ void fwd_v1(const T* x, T* y, long long rows, int cols) {
    const long long r = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const T* xr = x + r * cols;
    T* yr = y + r * cols;
    float m = kl::neg_inf();
    for (int c = 0; c < cols; ++c) m = fmaxf(m, to_f(xr[c]));
    // One thread adds the whole row: a plain running sum loses ~sqrt(cols) ulps (3.5e-6 at
    // 4097 fp32 columns, 20x torch's tree); Kahan's compensation keeps it at a few ulps.
    float s = 0.0f, comp = 0.0f;
    for (int c = 0; c < cols; ++c) kahan_add(s, comp, expf(to_f(xr[c]) - m));
    const float inv = 1.0f / s;
    for (int c = 0; c < cols; ++c) yr[c] = from_f<T>(scaled<T>(expf(to_f(xr[c]) - m), s, inv));
}

template <typename T>
__device__ void bwd_v1(const T* y, const T* dy, T* dx, long long rows, int cols) {
    const long long r = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const long long o = r * cols;
    float dot = 0.0f, comp = 0.0f;
    for (int c = 0; c < cols; ++c) kahan_add(dot, comp, to_f(y[o + c]) * to_f(dy[o + c]));
    for (int c = 0; c < cols; ++c) dx[o + c] = from_f<T>(to_f(y[o + c]) * (to_f(dy[o + c]) - dot));
}

// The forward's row sum (and v2's backward dot): fp32 rows accumulate in fp64, rounding
// once; 16-bit rows keep fp32 (their output rounding dominates).
template <typename T>
using SumAcc = kl::WideAcc<T>;

// ---------------------------------------------------------------------------- v2

constexpr int V2_THREADS = 256;

// Shared-memory tree with sequential addressing: at each level the lower half of the
// active threads adds the upper half (contiguous threads stay busy; no bank conflicts).
template <typename V, typename Op>
__device__ __forceinline__ V tree_reduce(V v, V* buf, Op op) {
    buf[threadIdx.x] = v;
    __syncthreads();
    for (int half = V2_THREADS / 2; half > 0; half >>= 1) {
        if (threadIdx.x < half) buf[threadIdx.x] = op(buf[threadIdx.x], buf[threadIdx.x + half]);
        __syncthreads();
    }
    const V out = buf[0];
    __syncthreads();  // buf is reused by the next reduction
    return out;
}

template <typename T>
__device__ void fwd_v2(const T* x, T* y, int cols) {
    __shared__ float buf[V2_THREADS];
    const T* xr = x + blockIdx.x * (long long)cols;
    T* yr = y + blockIdx.x * (long long)cols;
    float m = kl::neg_inf();
    for (int c = threadIdx.x; c < cols; c += V2_THREADS) m = fmaxf(m, to_f(xr[c]));
    m = tree_reduce(m, buf, kl::MaxOp{});
    // Each thread adds cols / 256 terms in a row: for fp32 rows in fp64 (in fp32, a row of
    // 35549 whose largest term is ~1 comes out 6 ulps off; torch's 2).
    using A = typename SumAcc<T>::type;
    __shared__ A sbuf[V2_THREADS];
    A sa = 0;
    for (int c = threadIdx.x; c < cols; c += V2_THREADS) sa += A(expf(to_f(xr[c]) - m));
    const float s = float(tree_reduce(sa, sbuf, [](A a, A b) { return a + b; }));
    const float inv = 1.0f / s;
    for (int c = threadIdx.x; c < cols; c += V2_THREADS) yr[c] = from_f<T>(scaled<T>(expf(to_f(xr[c]) - m), s, inv));
}

template <typename T>
__device__ void bwd_v2(const T* y, const T* dy, T* dx, int cols) {
    // fp64 dot and dx for fp32 rows, rounded once (v3 / v4: compensated fp32, RowDot): in
    // fp32, dot's rounding, cancelled against dy where one y is near 1, puts dx past the
    // check's bound (2x PyTorch's error).
    using A = typename SumAcc<T>::type;
    __shared__ A buf[V2_THREADS];
    const long long o = blockIdx.x * (long long)cols;
    A dot = 0;
    for (int c = threadIdx.x; c < cols; c += V2_THREADS) dot += A(to_f(y[o + c])) * A(to_f(dy[o + c]));
    dot = tree_reduce(dot, buf, [](A a, A b) { return a + b; });
    for (int c = threadIdx.x; c < cols; c += V2_THREADS)
        dx[o + c] = from_f<T>(float(A(to_f(y[o + c])) * (A(to_f(dy[o + c])) - dot)));
}

// ---------------------------------------------------------------------------- v3 / v4

// Reductions over the threads that share a row: the whole block (WARP_ROWS false) or one
// warp (WARP_ROWS true: a row per warp, no shared memory, no barrier).
template <bool WARP_ROWS, typename Op>
__device__ __forceinline__ float row_allreduce(float v, Op op, float* scratch) {
    if constexpr (WARP_ROWS) return kl::warp_allreduce(v, op);
    else return kl::block_allreduce(v, op, scratch);
}

template <bool WARP_ROWS>
__device__ __forceinline__ kl::MaxSum row_allreduce(kl::MaxSum v, float* scratch) {
    if constexpr (WARP_ROWS) return kl::warp_allreduce(v);
    else return kl::block_allreduce(v, scratch);
}

// One row per block (or per warp): lane = this thread's index among the row's threads,
// width = their number. Packs p = lane, lane + width, ... of the row belong to this thread.
// The row stays in registers when npacks <= MAX_PACKS * width (the host guarantees it
// for RESIDENT), otherwise it is streamed twice (online max and sum, then the write).
template <bool WARP_ROWS>
__device__ __forceinline__ float sum_allreduce(float v, float* scratch);
template <bool WARP_ROWS>
__device__ __forceinline__ double sum_allreduce(double v, float* scratch);

template <typename T, bool VEC, bool WARP_ROWS, bool RESIDENT>
__device__ __forceinline__ void fwd_row(const T* xr, T* yr, int cols, int lane, int width, float* scratch) {
    using P = Pack<T, VEC>;
    const int npacks = cols / P::N;  // VEC: the host guarantees cols % N == 0
    if constexpr (RESIDENT) {
        P r[MAX_PACKS];
        float m = kl::neg_inf();
#pragma unroll
        for (int k = 0; k < MAX_PACKS; ++k) {
            const int p = lane + k * width;
            if (p < npacks) r[k].load(xr, p);
            else r[k].fill(kl::neg_inf());
#pragma unroll
            for (int j = 0; j < P::N; ++j) m = fmaxf(m, r[k].v[j]);
        }
        m = row_allreduce<WARP_ROWS>(m, kl::MaxOp{}, scratch);
        // fp32 rows sum in fp64 through the row reduction (SumAcc), rounding once: in fp32
        // the ~13 additions after the largest term cost 2.3 ulps where one term is ~0.78 of
        // the row, past the check's bound.
        using A = typename SumAcc<T>::type;
        A sa = 0;
#pragma unroll
        for (int k = 0; k < MAX_PACKS; ++k)
#pragma unroll
            for (int j = 0; j < P::N; ++j) {
                r[k].v[j] = ex<T>(r[k].v[j] - m);
                sa += lane + k * width < npacks ? A(r[k].v[j]) : A(0);
            }
        const float s = float(sum_allreduce<WARP_ROWS>(sa, scratch));
        const float inv = __frcp_rn(s);
#pragma unroll
        for (int k = 0; k < MAX_PACKS; ++k) {
            const int p = lane + k * width;
            if (p < npacks) {
#pragma unroll
                for (int j = 0; j < P::N; ++j) r[k].v[j] = scaled<T>(r[k].v[j], s, inv);
                r[k].store(yr, p);
            }
        }
    } else if constexpr (sizeof(typename SumAcc<T>::type) == 8) {
        // fp32 rows too long to keep: three sweeps (max, fp64 sum, write), the sum rounded
        // once as in the resident path. The online fp32 sum below loses ~2 ulps of y on
        // long rows, past the check's bound; the extra read of a row mostly hits L2.
        float m = kl::neg_inf();
        for (int p = lane; p < npacks; p += width) {
            P a;
            a.load(xr, p);
#pragma unroll
            for (int j = 0; j < P::N; ++j) m = fmaxf(m, a.v[j]);
        }
        m = row_allreduce<WARP_ROWS>(m, kl::MaxOp{}, scratch);
        double sa = 0.0;  // a NaN (which fmaxf drops) or an all -inf row: NaN, as torch
        for (int p = lane; p < npacks; p += width) {
            P a;
            a.load(xr, p);
#pragma unroll
            for (int j = 0; j < P::N; ++j) sa += double(ex<T>(a.v[j] - m));
        }
        const float s = float(sum_allreduce<WARP_ROWS>(sa, scratch));
        const float inv = __frcp_rn(s);
        for (int p = lane; p < npacks; p += width) {
            P a;
            a.load(xr, p);
#pragma unroll
            for (int j = 0; j < P::N; ++j) a.v[j] = scaled<T>(ex<T>(a.v[j] - m), s, inv);
            a.store(yr, p);
        }
    } else {
        // Online softmax: per pack, one rescale of the running sum by exp(m_old - m_new).
        kl::MaxSum acc{kl::neg_inf(), 0.0f};
        for (int p = lane; p < npacks; p += width) {
            P a;
            a.load(xr, p);
            float pm = a.v[0];
#pragma unroll
            for (int j = 1; j < P::N; ++j) pm = fmaxf(pm, a.v[j]);
            const float m = fmaxf(acc.m, pm);
            if (m == kl::neg_inf()) {  // all -inf (or NaN, which fmaxf drops) so far
                // A NaN here must still poison the sum: skipping it would return a finite
                // row where torch's is all NaN (e.g. fp32 37 x 1025, whose 1025 columns
                // take this streamed path).
#pragma unroll
                for (int j = 0; j < P::N; ++j)
                    if (a.v[j] != a.v[j]) acc.s = a.v[j];
                continue;
            }
            float ps = 0.0f;
#pragma unroll
            for (int j = 0; j < P::N; ++j) ps += ex<T>(a.v[j] - m);
            acc.s = acc.s * ex<T>(acc.m - m) + ps;
            acc.m = m;
        }
        acc = row_allreduce<WARP_ROWS>(acc, scratch);
        const float inv = __frcp_rn(acc.s);
        for (int p = lane; p < npacks; p += width) {
            P a;
            a.load(xr, p);
#pragma unroll
            for (int j = 0; j < P::N; ++j) a.v[j] = scaled<T>(ex<T>(a.v[j] - acc.m), acc.s, inv);
            a.store(yr, p);
        }
    }
}

template <bool WARP_ROWS>
__device__ __forceinline__ float sum_allreduce(float v, float* scratch) {
    return row_allreduce<WARP_ROWS>(v, kl::SumOp{}, scratch);
}

// fp64 sum over the row's threads; ``scratch``: 8-byte aligned, 2 * blockDim.x / 32 floats.
template <bool WARP_ROWS>
__device__ __forceinline__ double sum_allreduce(double v, float* scratch) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(kl::FULL_MASK, v, off);
    if constexpr (WARP_ROWS) {
        return v;
    } else {
        double* sd = reinterpret_cast<double*>(scratch);
        const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
        __syncthreads();
        if (lane == 0) sd[warp] = v;
        __syncthreads();
        v = lane < warps ? sd[lane] : 0.0;
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(kl::FULL_MASK, v, off);
        return v;
    }
}

// Error-free transformations in fp32: a + b = s + e exactly, s = fl(a + b) (Knuth's two-sum,
// any order of magnitudes). The _rn intrinsics keep the compiler from contracting a product
// and a sum into an fma, which would break the exactness.
__device__ __forceinline__ float two_sum(float a, float b, float& e) {
    const float s = __fadd_rn(a, b);
    const float bb = __fsub_rn(s, a);
    e = __fadd_rn(__fsub_rn(a, __fsub_rn(s, bb)), __fsub_rn(b, bb));
    return s;
}

// The backward's dot = sum(y * dy) over a row and dx = y * (dy - dot). 16-bit rows: fp32
// (their output rounding dominates).
template <bool COMPENSATED>
struct RowDot {
    float s = 0.0f;
    __device__ __forceinline__ void add(float y, float g) { s += y * g; }
    template <bool WARP_ROWS>
    __device__ __forceinline__ void allreduce(float* scratch) {
        s = row_allreduce<WARP_ROWS>(s, kl::SumOp{}, scratch);
    }
    __device__ __forceinline__ float dx(float y, float g) const { return y * (g - s); }
};

// fp32 rows: dot as the pair hi + lo (Ogita, Rump and Oishi's Dot2): each product split
// exactly (p + fma(y, dy, -p)), each sum by two_sum, the errors added in lo; pairs combine
// through the reduction the same way. As accurate as an fp64 sum: a plain fp32 dot's
// rounding, cancelled against dy where one y is near 1, puts dx past the check's bound
// (2x PyTorch's error). dx = fma(y, dy - hi, -y * lo): dy - hi is exact where it cancels
// (Sterbenz); dx is within one ulp of the row's largest |dx| (the fp64 form's: half),
// the check's floor.
template <>
struct RowDot<true> {
    float hi = 0.0f, lo = 0.0f;
    __device__ __forceinline__ void add(float y, float g) {
        const float p = __fmul_rn(y, g);
        float e;
        hi = two_sum(hi, p, e);
        lo = __fadd_rn(lo, __fadd_rn(__fmaf_rn(y, g, -p), e));
    }
    __device__ __forceinline__ void combine(float h, float l) {
        float e;
        hi = two_sum(hi, h, e);
        lo = __fadd_rn(__fadd_rn(lo, l), e);
    }
    __device__ __forceinline__ void warp_allreduce() {
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            const float h = __shfl_xor_sync(kl::FULL_MASK, hi, off);
            const float l = __shfl_xor_sync(kl::FULL_MASK, lo, off);
            combine(h, l);  // two_sum's s and e do not depend on the order: lanes agree
        }
    }
    // ``scratch``: 2 * blockDim.x / 32 floats (block rows).
    template <bool WARP_ROWS>
    __device__ __forceinline__ void allreduce(float* scratch) {
        warp_allreduce();
        if constexpr (!WARP_ROWS) {
            const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
            __syncthreads();
            if (lane == 0) {
                scratch[2 * warp] = hi;
                scratch[2 * warp + 1] = lo;
            }
            __syncthreads();
            hi = lane < warps ? scratch[2 * lane] : 0.0f;
            lo = lane < warps ? scratch[2 * lane + 1] : 0.0f;
            warp_allreduce();
        }
        // An inf or NaN dot (inf in dy): lo is NaN; dx = y * (dy - hi), as torch.
        if (!(fabsf(hi) <= __int_as_float(0x7f7fffff))) lo = 0.0f;
    }
    __device__ __forceinline__ float dx(float y, float g) const {
        return __fmaf_rn(y, __fsub_rn(g, hi), -__fmul_rn(y, lo));
    }
};

// S: the resident packs' storage (Pack, or RawPack for the l entries).
template <typename T, bool VEC, bool WARP_ROWS, bool RESIDENT, typename S = Pack<T, VEC>>
__device__ __forceinline__ void bwd_row(const T* yr, const T* dyr, T* dxr, int cols, int lane, int width,
                                        float* scratch) {
    using P = Pack<T, VEC>;
    const int npacks = cols / P::N;
    RowDot<sizeof(T) == 4> dot;
    if constexpr (RESIDENT) {
        S a[MAX_PACKS], g[MAX_PACKS];
#pragma unroll
        for (int k = 0; k < MAX_PACKS; ++k) {
            const int p = lane + k * width;
            if (p < npacks) {
                a[k].load(yr, p);
                g[k].load(dyr, p);
            } else {
                a[k].fill(0.0f);
                g[k].fill(0.0f);
            }
#pragma unroll
            for (int j = 0; j < P::N; ++j) dot.add(a[k].f(j), g[k].f(j));
        }
        dot.template allreduce<WARP_ROWS>(scratch);
#pragma unroll
        for (int k = 0; k < MAX_PACKS; ++k) {
            const int p = lane + k * width;
            if (p < npacks) {
                P o;
#pragma unroll
                for (int j = 0; j < P::N; ++j) o.v[j] = dot.dx(a[k].f(j), g[k].f(j));
                o.store(dxr, p);
            }
        }
    } else {
        for (int p = lane; p < npacks; p += width) {
            P a, g;
            a.load(yr, p);
            g.load(dyr, p);
#pragma unroll
            for (int j = 0; j < P::N; ++j) dot.add(a.v[j], g.v[j]);
        }
        dot.template allreduce<WARP_ROWS>(scratch);
        for (int p = lane; p < npacks; p += width) {
            P a, g;
            a.load(yr, p);
            g.load(dyr, p);
#pragma unroll
            for (int j = 0; j < P::N; ++j) a.v[j] = dot.dx(a.v[j], g.v[j]);
            a.store(dxr, p);
        }
    }
}

// Block-per-row entry: blockIdx.x is the row. Warp-per-row entry: blockDim.x / 32 rows per
// block.
template <typename T, bool VEC, bool RESIDENT>
__device__ __forceinline__ void fwd_block(const T* x, T* y, long long rows, int cols) {
    __shared__ __align__(8) float scratch[64];  // 32 doubles for fp32 rows' fp64 sum
    const long long r = blockIdx.x;
    fwd_row<T, VEC, false, RESIDENT>(x + r * cols, y + r * cols, cols, threadIdx.x, blockDim.x, scratch);
}

template <typename T, bool VEC>
__device__ __forceinline__ void fwd_warp(const T* x, T* y, long long rows, int cols) {
    const long long r = blockIdx.x * (long long)(blockDim.x >> 5) + (threadIdx.x >> 5);
    if (r >= rows) return;  // whole warps leave together: the shuffles stay full-mask
    fwd_row<T, VEC, true, true>(x + r * cols, y + r * cols, cols, threadIdx.x & 31, 32, nullptr);
}

template <typename T, bool VEC, bool RESIDENT, typename S = Pack<T, VEC>>
__device__ __forceinline__ void bwd_block(const T* y, const T* dy, T* dx, long long rows, int cols) {
    __shared__ float scratch[64];  // 32 (hi, lo) pairs for fp32 rows' dot
    const long long o = blockIdx.x * (long long)cols;
    bwd_row<T, VEC, false, RESIDENT, S>(y + o, dy + o, dx + o, cols, threadIdx.x, blockDim.x, scratch);
}

template <typename T, bool VEC>
__device__ __forceinline__ void bwd_warp(const T* y, const T* dy, T* dx, long long rows, int cols) {
    const long long r = blockIdx.x * (long long)(blockDim.x >> 5) + (threadIdx.x >> 5);
    if (r >= rows) return;
    const long long o = r * cols;
    bwd_row<T, VEC, true, true>(y + o, dy + o, dx + o, cols, threadIdx.x & 31, 32, nullptr);
}

}  // namespace

// Entry points. v3 and v4 share the row routines; the host decides the block shape
// (v3: always 256 threads per row; v4: fitted to the row, or a warp per row) and whether
// the row is register-resident (_r, _l) or streamed (_o, online).
#define KL_SOFTMAX(NAME, T)                                                                               \
    extern "C" __global__ void softmax_fwd_v1_##NAME(const T* x, T* y, long long rows, int cols) {        \
        fwd_v1<T>(x, y, rows, cols);                                                                      \
    }                                                                                                     \
    extern "C" __global__ void softmax_bwd_v1_##NAME(const T* y, const T* dy, T* dx, long long rows,      \
                                                     int cols) {                                          \
        bwd_v1<T>(y, dy, dx, rows, cols);                                                                 \
    }                                                                                                     \
    extern "C" __global__ void __launch_bounds__(V2_THREADS)                                              \
        softmax_fwd_v2_##NAME(const T* x, T* y, long long rows, int cols) {                               \
        fwd_v2<T>(x, y, cols);                                                                            \
    }                                                                                                     \
    extern "C" __global__ void __launch_bounds__(V2_THREADS)                                              \
        softmax_bwd_v2_##NAME(const T* y, const T* dy, T* dx, long long rows, int cols) {                 \
        bwd_v2<T>(y, dy, dx, cols);                                                                       \
    }                                                                                                     \
    KL_SOFTMAX_ROWS(NAME, T, v, true)                                                                     \
    KL_SOFTMAX_ROWS(NAME, T, s, false)

#define KL_SOFTMAX_ROWS(NAME, T, KIND, VEC)                                                               \
    extern "C" __global__ void __launch_bounds__(RESIDENT_MAX_THREADS)                                    \
        softmax_fwd_r##KIND##_##NAME(const T* __restrict__ x, T* __restrict__ y, long long rows, int cols) { \
        fwd_block<T, VEC, true>(x, y, rows, cols);                                                        \
    }                                                                                                     \
    extern "C" __global__ void __launch_bounds__(LONG_MAX_THREADS)                                        \
        softmax_fwd_l##KIND##_##NAME(const T* __restrict__ x, T* __restrict__ y, long long rows, int cols) { \
        fwd_block<T, VEC, true>(x, y, rows, cols);                                                        \
    }                                                                                                     \
    extern "C" __global__ void __launch_bounds__(1024)                                                    \
        softmax_fwd_o##KIND##_##NAME(const T* __restrict__ x, T* __restrict__ y, long long rows, int cols) { \
        fwd_block<T, VEC, false>(x, y, rows, cols);                                                       \
    }                                                                                                     \
    extern "C" __global__ void __launch_bounds__(256)                                                     \
        softmax_fwd_w##KIND##_##NAME(const T* __restrict__ x, T* __restrict__ y, long long rows, int cols) { \
        fwd_warp<T, VEC>(x, y, rows, cols);                                                               \
    }                                                                                                     \
    extern "C" __global__ void __launch_bounds__(RESIDENT_MAX_THREADS) softmax_bwd_r##KIND##_##NAME(                      \
        const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx, long long rows, int cols) { \
        bwd_block<T, VEC, true>(y, dy, dx, rows, cols);                                                   \
    }                                                                                                     \
    extern "C" __global__ void __launch_bounds__(LONG_MAX_THREADS) softmax_bwd_l##KIND##_##NAME(          \
        const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx, long long rows, int cols) { \
        bwd_block<T, VEC, true, RawPack<T, VEC>>(y, dy, dx, rows, cols);                                  \
    }                                                                                                     \
    extern "C" __global__ void __launch_bounds__(1024) softmax_bwd_o##KIND##_##NAME(                      \
        const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx, long long rows, int cols) { \
        bwd_block<T, VEC, false>(y, dy, dx, rows, cols);                                                  \
    }                                                                                                     \
    extern "C" __global__ void __launch_bounds__(256) softmax_bwd_w##KIND##_##NAME(                       \
        const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx, long long rows, int cols) { \
        bwd_warp<T, VEC>(y, dy, dx, rows, cols);                                                          \
    }

KL_FOR_EACH_DTYPE(KL_SOFTMAX)
