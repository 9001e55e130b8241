// batch_norm2d (training mode: batch statistics) over NCHW, forward and backward; fp32 /
// fp16 / bf16 storage, fp32 math. One variant (the "cuda" backend), the Triton backend's
// plan in CUDA C++:
//
//   A channel's M = N * H * W elements are cut into `split` chunks of its flat index
//   i in [0, M) (image i / HW, pixel i % HW); block b = c * split + s of 256 threads takes
//   chunk s of channel c, so C * split blocks fill the GPU when C alone (32, 64) would not.
//
//   bn_stats     (batch_norm.cuh, shared with bn_relu_pool2d.cu) each thread sums its
//                elements of the chunk shifted by the chunk's first value in fp64; the
//                block merges the (count, mean, M2) triples (Chan's formula, fp64);
//                thread 0 writes the chunk's triple to part[3][C][split] (fp64).
// relu (an int argument): y = max(y, 0) forward (NaN kept); backward, dy counts where the forward's
// pre-activation (recomputed with the same fp32 expression) was > 0.
//
//   bn_fwd_apply every thread merges the channel's `split` triples in fp64 (a few dozen
//                values, cached) and rounds mean and rstd once; block s == 0 stores them,
//                and the block writes its chunk of y = (x - mean) * (rstd * w) + b.
//   bn_bwd_sums  per chunk: sum(dy * (x - mean)) and sum(dy) -> part[2][C][split], terms
//                and sums in double (an fp32 product and difference are exact there), so
//                dweight and dbias are the exact sums rounded once; rstd is applied once,
//                at the end. The fp64 work (3 flops per element) hides under the loads.
//   bn_bwd_apply dw, db = the sums of the channel's partials (block s == 0 stores them);
//                dx = w * rstd * (dy - db / M - xhat * dw / M) over the chunk.
//
// Traffic per pass: x read twice and y written once forward; x and dy read twice and dx
// written once backward (the second reads are L2 hits when a layer fits in the 50 MB L2).
// Indexing: i is 32-bit (M < 2^31), element offsets 64-bit. The element loops are unrolled
// by 4 so each thread has 4 independent loads in flight (Little's law on an H100: ~3.35 TB/s
// x ~0.6 us = ~2 MB in flight, ~15 KB per SM; 8 blocks x 256 threads x 4 x 4 B = 32 KB).
#include "common.cuh"
#include "reduce.cuh"

namespace {

constexpr int THREADS = 256;

#include "batch_norm.cuh"

// g where relu is off or the forward's pre-activation (x - mean) * scale + shift,
// recomputed with the forward's expression (so the same sign), is > 0; else 0.
__device__ __forceinline__ float relu_grad(float g, float xv, float mean, float scale, float shift, int relu) {
    if (relu && (xv - mean) * scale + shift <= 0.0f) g = 0.0f;  // (a NaN passes g, as torch.relu's)
    return g;
}

template <typename T>
__device__ void bn_fwd_apply(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                             T* __restrict__ y, const double* __restrict__ part, float* __restrict__ mean_out,
                             float* __restrict__ rstd_out, int C, int HW, int M, int chunk, float eps, int relu) {
    const auto [split, c, s] = channel_chunk(C);
    // Every thread merges the channel's partials itself (split is small): no barrier.
    const auto [mean, scale, shift] = normalize_params(part, C, split, c, s, eps, w, b, mean_out, rstd_out);
    const auto [start, end] = chunk_range(s, chunk, M);
#pragma unroll 4
    for (int i = start + threadIdx.x; i < end; i += THREADS) {
        const long long o = bn_offset(i, c, C, HW);
        const float v = (kl::to_f(x[o]) - mean) * scale + shift;
        y[o] = kl::from_f<T>(relu && v <= 0.0f ? 0.0f : v);  // NaN passes (fmaxf(NaN, 0) is 0)
    }
}

template <typename T>
__device__ void bn_bwd_sums(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ w,
                            const T* __restrict__ b, const float* __restrict__ mean_in,
                            const float* __restrict__ rstd_in, double* __restrict__ part, int C, int HW, int M,
                            int chunk, int relu) {
    __shared__ double red[THREADS];
    const auto [split, c, s] = channel_chunk(C);
    const float mean = mean_in[c];
    const float scale = rstd_in[c] * kl::to_f(w[c]), shift = kl::to_f(b[c]);
    const auto [start, end] = chunk_range(s, chunk, M);
    double sw = 0.0, sb = 0.0;
#pragma unroll 4
    for (int i = start + threadIdx.x; i < end; i += THREADS) {
        const long long o = bn_offset(i, c, C, HW);
        const float xv = kl::to_f(x[o]);
        const float g = relu_grad(kl::to_f(dy[o]), xv, mean, scale, shift, relu);
        sw += (double)g * ((double)xv - (double)mean);
        sb += (double)g;
    }
    store_grad_partials(sw, sb, red, part, C, split, c, s);
}

template <typename T>
__device__ void bn_bwd_apply(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ w,
                             const T* __restrict__ b, const float* __restrict__ mean_in,
                             const float* __restrict__ rstd_in, const double* __restrict__ part,
                             T* __restrict__ dx, T* __restrict__ dw, T* __restrict__ db, int C, int HW, int M,
                             int chunk, int relu) {
    const auto [split, c, s] = channel_chunk(C);
    const float mean = mean_in[c], rstd = rstd_in[c];
    const GradSums t = channel_grads(part, C, split, c, s, rstd, dw, db);
    const float k = rstd * kl::to_f(w[c]);  // = the forward's scale
    const float shift = kl::to_f(b[c]);
    const float mdb = t.sb / M, mdw = t.sw / M;
    const auto [start, end] = chunk_range(s, chunk, M);
#pragma unroll 4
    for (int i = start + threadIdx.x; i < end; i += THREADS) {
        const long long o = bn_offset(i, c, C, HW);
        const float xv = kl::to_f(x[o]);
        const float g = relu_grad(kl::to_f(dy[o]), xv, mean, k, shift, relu);
        const float xhat = (xv - mean) * rstd;
        dx[o] = kl::from_f<T>(k * (g - mdb - xhat * mdw));
    }
}

}  // namespace

// Entry points: bn_{stats,fwd_apply,bwd_sums,bwd_apply}_<dtype>; grid C * split, 256 threads.
#define KL_BN(SFX, T)                                                                                        \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                    \
        bn_stats_##SFX(const T* x, double* part, int C, int HW, int M, int chunk) {                           \
        bn_stats<T>(x, part, C, HW, M, chunk);                                                               \
    }                                                                                                        \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                    \
        bn_fwd_apply_##SFX(const T* x, const T* w, const T* b, T* y, const double* part, float* mean,         \
                           float* rstd, int C, int HW, int M, int chunk, float eps, int relu) {              \
        bn_fwd_apply<T>(x, w, b, y, part, mean, rstd, C, HW, M, chunk, eps, relu);                           \
    }                                                                                                        \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                    \
        bn_bwd_sums_##SFX(const T* dy, const T* x, const T* w, const T* b, const float* mean,                \
                          const float* rstd, double* part, int C, int HW, int M, int chunk, int relu) {      \
        bn_bwd_sums<T>(dy, x, w, b, mean, rstd, part, C, HW, M, chunk, relu);                                \
    }                                                                                                        \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                    \
        bn_bwd_apply_##SFX(const T* dy, const T* x, const T* w, const T* b, const float* mean,               \
                           const float* rstd, const double* part, T* dx, T* dw, T* db, int C, int HW, int M, \
                           int chunk, int relu) {                                                            \
        bn_bwd_apply<T>(dy, x, w, b, mean, rstd, part, dx, dw, db, C, HW, M, chunk, relu);                   \
    }

KL_FOR_EACH_DTYPE(KL_BN)
