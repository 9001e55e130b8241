// Cross-entropy over [N, V] logits with int64 targets, forward and backward; fp32 / fp16 /
// bf16 storage, fp32 math. One block per row in every kernel (a row of 50304 bf16 is
// 100 KB: plenty of work for one block; N = 8192 rows is ~8 waves of 8 blocks per SM).
//
//   forward:  lse = log sum_j exp(x_j),  loss = lse - x[t]   (0 where t == ignore_index)
//   backward: dx_j = g * (exp(x_j - lse) - [j == t])          (0 where t == ignore_index)
//
// The forward writes loss and lse (fp32, one each per row); the backward recomputes the
// softmax from the logits and lse, so the softmax is never stored. dx may alias x
// (in-place backward): every element is loaded before it is stored, by the same thread.
// Targets out of [0, V) give a NaN loss and are never used as an address; the range check
// that raises for them is its own kernel (ce_check_targets, below), queued before the
// forward.
//
// Variants (backends of op "cross_entropy"):
//   v1  ce_fwd_v1_* / ce_bwd_v1_*  (backend "cuda_v1") one block per row, one element per
//       thread per step, three passes in the forward: max (block reduction), sum of
//       exp(x - max) (block reduction), then the target. The teaching baseline, and the
//       Traffic: the row is read twice in the forward (the second read mostly from L2).
//   v2  ce_fwd_* / ce_bwd_*  (backend "cuda") the forward reads the row once: each thread
//       keeps an online (max, sum) pair over 16-byte packs (8 bf16 per load, 4 packs in
//       flight per thread), the block combines the pairs with one warp-shuffle reduction
//       (kl::block_allreduce(MaxSum)); one exp per element plus one per pack. Rows of any
//       V and alignment: a scalar head up to the first 16-byte boundary and a scalar tail
//       (odd vocabularies such as 32001 keep the vector loop). The backward uses the same
//       16-byte loads and stores (v1 when dx and x rows are not equally aligned, e.g. an
//       offset input with a fresh dx), and ignored rows only write zeros.
#include "common.cuh"
#include "reduce.cuh"

namespace {

constexpr int kUnroll = 4;  // 16-byte packs in flight per thread (64 B: see common.cuh)

// exp for the row's values (argument <= 0 except for NaN/inf rows). 16-bit logits use the
// SFU's ex2.approx (error far below their rounding); fp32 keeps the accurate expf.
template <typename T> __device__ __forceinline__ float row_exp(float v) { return __expf(v); }
template <> __device__ __forceinline__ float row_exp<float>(float v) { return expf(v); }

// lse = m + log(s) kept as an unevaluated pair hi + lo (TwoSum): one rounded fp32 lse
// costs every exp(x - lse) of the backward up to half an ulp of |lse| (PyTorch keeps x - m
// and log s apart), which misses the 2x-PyTorch rule for fp32 at small V. The lse buffer
// is [2, N]: hi at [row], lo at [N + row] (N = gridDim.x, one block per row). 16-bit
// logits keep hi alone ([1, N]): their dx rounds to 8-11 bits, far above hi's rounding,
// and lo would add 32 KB per 8192 rows to the in-place fwd+bwd's extra memory.
template <typename T>
__device__ constexpr bool lse_pair() { return sizeof(T) == 4; }

template <typename T>
__device__ __forceinline__ void store_lse(float* lse_out, long long row, float m, float log_s, float& hi, float& lo) {
    hi = m + log_s;
    const float bb = hi - m;
    lo = (m - (hi - bb)) + (log_s - bb);
    if (!isfinite(hi)) lo = 0.0f;  // inf / NaN rows: hi alone carries the value
    lse_out[row] = hi;
    if (lse_pair<T>()) lse_out[gridDim.x + row] = lo;
}

// The saved lse of a row (hi, lo) and the row's gradient scale g[row * gs] (gs = 0: one
// scale for every row, e.g. the "mean" reduction's, read without a copy per row).
template <typename T>
__device__ __forceinline__ void load_lse_g(const float* lse, const float* g, long long gs, long long row, float& hi,
                                           float& lo, float& gr) {
    hi = lse[row];
    lo = lse_pair<T>() ? lse[gridDim.x + row] : 0.0f;
    gr = g[row * gs];
}

// The targets' statistics, a kernel of its own (one block, queued before the forward):
// out[0] = 1 if a target is neither ignore_index nor in [0, V) (the range check, whose
// flag the host reads on a side stream while the forward runs), else 0; out[1] = the
// number of targets != ignore_index (the "mean" reduction's divisor: counted here, PyTorch's
// sum of a bool mask made a 64 KB int64 temporary per 8192 rows). Always written: a fresh
// buffer per call, no memset. U loads per thread are issued before they are used.
__device__ __forceinline__ void target_stats(const long long* __restrict__ t, int* out, int* flag, long long n,
                                             long long V, long long ii) {
    constexpr int U = 8;
    __shared__ int total;
    if (threadIdx.x == 0) total = 0;
    __syncthreads();
    int bad = 0, count = 0;
    for (long long base = threadIdx.x; base < n; base += (long long)blockDim.x * U) {
        long long v[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const long long i = base + (long long)u * blockDim.x;
            v[u] = i < n ? t[i] : ii;
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            bad |= v[u] != ii && (v[u] < 0 || v[u] >= V);
            count += v[u] != ii;
        }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) count += __shfl_down_sync(0xffffffffu, count, off);
    if ((threadIdx.x & 31) == 0) atomicAdd(&total, count);  // integer: the same sum in any order
    bad = __syncthreads_or(bad);                            // also the barrier after the adds
    if (threadIdx.x == 0) {
        out[0] = bad;
        out[1] = total;
        if (flag != nullptr) *flag = bad;  // mapped host memory: the host reads it after an event
    }
}

// The loss of one row from its lse pair and its target.
template <typename T>
__device__ __forceinline__ float row_loss(const T* xr, long long t, long long V, long long ii, float hi, float lo) {
    if (t == ii) return 0.0f;
    if (t < 0 || t >= V) return __int_as_float(0x7fc00000);  // NaN: never an address
    return (hi - kl::to_f(xr[t])) + lo;
}

// Adds v into the running (m, s) pair: -inf entries contribute nothing (no -inf - -inf),
// NaN and +inf rows end as NaN, as in PyTorch.
template <typename T>
__device__ __forceinline__ void online_add(float& m, float& s, const float* v, int n) {
    float mb = v[0];
#pragma unroll
    for (int j = 1; j < 8; ++j)
        if (j < n) mb = fmaxf(mb, v[j]);
    const float m_new = fmaxf(m, mb);
    if (m_new == kl::neg_inf()) {  // nothing but -inf so far (fmaxf dropped any NaN: keep it in s)
#pragma unroll
        for (int j = 0; j < 8; ++j)
            if (j < n && v[j] != v[j]) s = v[j];
        return;
    }
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j)
        if (j < n) acc += row_exp<T>(v[j] - m_new);
    s = (m == m_new ? s : s * row_exp<T>(m - m_new)) + acc;
    m = m_new;
}

// ----------------------------------------------------------------------------- v1

template <typename T>
__device__ void ce_fwd_v1(const T* __restrict__ x, const long long* __restrict__ target, float* __restrict__ loss,
                          float* __restrict__ lse_out, long long V, long long ii) {
    __shared__ float scratch[32];
    const long long row = blockIdx.x;
    const T* xr = x + row * V;
    float m = kl::neg_inf();
    for (long long j = threadIdx.x; j < V; j += blockDim.x) m = fmaxf(m, kl::to_f(xr[j]));
    m = kl::block_allreduce(m, kl::MaxOp{}, scratch);
    float s = 0.0f;
    if (m != kl::neg_inf())  // an all -inf row keeps s = 0: lse = -inf, loss NaN (as PyTorch)
        for (long long j = threadIdx.x; j < V; j += blockDim.x) s += row_exp<T>(kl::to_f(xr[j]) - m);
    s = kl::block_allreduce(s, kl::SumOp{}, scratch);
    if (threadIdx.x == 0) {
        // A NaN anywhere in the row: fmaxf dropped it from m, but exp(NaN - m) made s NaN.
        float hi, lo;
        store_lse<T>(lse_out, row, m, logf(s), hi, lo);
        loss[row] = row_loss(xr, target[row], V, ii, hi, lo);
    }
}

template <typename T>
__device__ void ce_bwd_v1(const T* x, const long long* __restrict__ target, const float* __restrict__ lse,
                          const float* __restrict__ g, long long gs, T* dx, long long V, long long ii) {
    const long long row = blockIdx.x;
    const T* xr = x + row * V;
    T* dr = dx + row * V;
    const long long t = target[row];
    if (t == ii) {
        for (long long j = threadIdx.x; j < V; j += blockDim.x) dr[j] = kl::from_f<T>(0.0f);
        return;
    }
    float l, lo, gr;
    load_lse_g<T>(lse, g, gs, row, l, lo, gr);
    if (t < 0 || t >= V) gr = __int_as_float(0x7fc00000);  // unchecked bad target: a NaN row, as its loss
    for (long long j = threadIdx.x; j < V; j += blockDim.x) {
        const float p = row_exp<T>((kl::to_f(xr[j]) - l) - lo);
        dr[j] = kl::from_f<T>(gr * (j == t ? p - 1.0f : p));
    }
}

// ----------------------------------------------------------------------------- v2

// A row [xr, xr + V) split for 16-byte access: ``head`` scalar elements up to the first
// 16-byte boundary (< N of them), ``npacks`` aligned packs, then a scalar tail (< N). Any
// V and any element-aligned row start work, so odd vocabularies (V = 32001 in bf16:
// rows 64002 B apart, each starting at a different offset) keep the vector loop.
template <typename T>
struct RowSplit {
    long long head, npacks, tail_start;
    __device__ __forceinline__ RowSplit(const T* xr, long long V) {
        constexpr int N = kl::Vec16<T>::N;
        const unsigned mis = static_cast<unsigned>(reinterpret_cast<unsigned long long>(xr) & 15ull);
        head = mis ? (16 - mis) / sizeof(T) : 0;
        if (head > V) head = V;
        npacks = (V - head) / N;
        tail_start = head + npacks * N;
    }
};

template <typename T>
__device__ void ce_fwd_v2(const T* __restrict__ x, const long long* __restrict__ target, float* __restrict__ loss,
                          float* __restrict__ lse_out, long long V, long long ii) {
    using Vec = kl::Vec16<T>;
    __shared__ float scratch[64];
    const long long row = blockIdx.x;
    const T* xr = x + row * V;
    const RowSplit<T> sp(xr, V);
    const int4* x4 = reinterpret_cast<const int4*>(xr + sp.head);
    float m = kl::neg_inf(), s = 0.0f;
    if (threadIdx.x < sp.head) {  // scalar head
        const float v = kl::to_f(xr[threadIdx.x]);
        online_add<T>(m, s, &v, 1);
    }
    for (long long base = threadIdx.x; base < sp.npacks; base += (long long)blockDim.x * kUnroll) {
        Vec r[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {  // all loads first: 4 x 16 B in flight
            const long long p = base + (long long)u * blockDim.x;
            if (p < sp.npacks) r[u].raw = kl::load16(x4 + p);
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const long long p = base + (long long)u * blockDim.x;
            if (p < sp.npacks) {
                float v[8];
#pragma unroll
                for (int j = 0; j < Vec::N; ++j) v[j] = kl::to_f(r[u].e[j]);
                online_add<T>(m, s, v, Vec::N);
            }
        }
    }
    const long long jt = sp.tail_start + threadIdx.x;  // scalar tail
    if (jt < V) {
        const float v = kl::to_f(xr[jt]);
        online_add<T>(m, s, &v, 1);
    }
    kl::MaxSum ms = kl::block_allreduce(kl::MaxSum{m, s}, scratch);
    if (threadIdx.x == 0) {
        float hi, lo;
        store_lse<T>(lse_out, row, ms.m, logf(ms.s), hi, lo);
        loss[row] = row_loss(xr, target[row], V, ii, hi, lo);
    }
}

// Contract (host-checked): x and dx rows share their offset modulo 16 bytes (both from
// the allocator, or dx == x), so one RowSplit serves both.
template <typename T>
__device__ void ce_bwd_v2(const T* x, const long long* __restrict__ target, const float* __restrict__ lse,
                          const float* __restrict__ g, long long gs, T* dx, long long V, long long ii) {
    using Vec = kl::Vec16<T>;
    const long long row = blockIdx.x;
    const T* xr = x + row * V;
    T* dr = dx + row * V;
    const RowSplit<T> sp(xr, V);
    const int4* x4 = reinterpret_cast<const int4*>(xr + sp.head);
    int4* d4 = reinterpret_cast<int4*>(dr + sp.head);
    const long long t = target[row];
    const long long jh = threadIdx.x, jt = sp.tail_start + threadIdx.x;  // this thread's head / tail element
    if (t == ii) {  // ignored row: zeros, without reading the logits
        const int4 z = make_int4(0, 0, 0, 0);
        if (jh < sp.head) dr[jh] = kl::from_f<T>(0.0f);
        for (long long p = threadIdx.x; p < sp.npacks; p += blockDim.x) kl::store16(d4 + p, z);
        if (jt < V) dr[jt] = kl::from_f<T>(0.0f);
        return;
    }
    float l, lo, gr;
    load_lse_g<T>(lse, g, gs, row, l, lo, gr);
    if (t < 0 || t >= V) gr = __int_as_float(0x7fc00000);  // unchecked bad target: a NaN row, as its loss
    if (jh < sp.head) {
        const float pr = row_exp<T>((kl::to_f(xr[jh]) - l) - lo);
        dr[jh] = kl::from_f<T>(gr * (jh == t ? pr - 1.0f : pr));
    }
    for (long long base = threadIdx.x; base < sp.npacks; base += (long long)blockDim.x * kUnroll) {
        Vec r[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const long long p = base + (long long)u * blockDim.x;
            if (p < sp.npacks) r[u].raw = kl::load16(x4 + p);
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const long long p = base + (long long)u * blockDim.x;
            if (p < sp.npacks) {
                Vec o;
#pragma unroll
                for (int j = 0; j < Vec::N; ++j) {
                    const float pr = row_exp<T>((kl::to_f(r[u].e[j]) - l) - lo);
                    o.e[j] = kl::from_f<T>(gr * (sp.head + p * Vec::N + j == t ? pr - 1.0f : pr));
                }
                kl::store16(d4 + p, o.raw);
            }
        }
    }
    if (jt < V) {
        const float pr = row_exp<T>((kl::to_f(xr[jt]) - l) - lo);
        dr[jt] = kl::from_f<T>(gr * (jt == t ? pr - 1.0f : pr));
    }
}

}  // namespace

#define KL_CE_KERNELS(SFX, T)                                                                               \
    extern "C" __global__ void ce_fwd_v1_##SFX(const T* x, const long long* t, float* loss, float* lse,      \
                                               long long V, long long ii) {                                \
        ce_fwd_v1<T>(x, t, loss, lse, V, ii);                                                               \
    }                                                                                                       \
    extern "C" __global__ void ce_bwd_v1_##SFX(const T* x, const long long* t, const float* lse,            \
                                               const float* g, long long gs, T* dx, long long V,            \
                                               long long ii) {                                              \
        ce_bwd_v1<T>(x, t, lse, g, gs, dx, V, ii);                                                          \
    }                                                                                                       \
    extern "C" __global__ void ce_fwd_##SFX(const T* x, const long long* t, float* loss, float* lse,         \
                                            long long V, long long ii) {                                   \
        ce_fwd_v2<T>(x, t, loss, lse, V, ii);                                                               \
    }                                                                                                       \
    extern "C" __global__ void ce_bwd_##SFX(const T* x, const long long* t, const float* lse, const float* g, \
                                            long long gs, T* dx, long long V, long long ii) {               \
        ce_bwd_v2<T>(x, t, lse, g, gs, dx, V, ii);                                                          \
    }

KL_FOR_EACH_DTYPE(KL_CE_KERNELS)

extern "C" __global__ void __launch_bounds__(1024)
    ce_target_stats(const long long* t, int* out, int* flag, long long n, long long V, long long ii) {
    target_stats(t, out, flag, n, V, ii);
}
