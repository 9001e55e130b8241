// bn_relu_pool2d: training batch norm -> relu -> 2x2 / stride 2 max pool over NCHW, forward
// and backward; fp32 / fp16 / bf16 storage, fp32 math. One variant (the "cuda" backend), the
// Triton backend's plan in CUDA C++ (see triton.py for the traffic it saves):
//
//   A channel's work is cut into `split` chunks of a flat index; block b = c * split + s of
//   256 threads takes chunk s of channel c (C alone, 32 or 64, would not fill the GPU).
//
//   (stats)      batch_norm2d's bn_stats (batch_norm.cuh): fp64 shifted sums per thread,
//                Chan merge per block, a (count, mean, M2) triple per chunk in
//                part[3][C][split_s] (fp64), over all N * H * W values (an odd size's
//                dropped row and column included).
//   brp_fwd      one thread per pooled output (index over N * P * Q): every thread merges
//                its channel's split_s triples in fp64 and rounds mean and rstd once (block
//                s == 0 stores them), loads the 2x2 window, finds its first maximum on
//                x * sign(rstd * w) (the normalization is monotone in x: comparing x is
//                exact, the float64 choice; a NaN wins),
//                normalizes that value with batch_norm2d's expression (x - mean) * (rstd * w)
//                + b and writes z = relu of it and code = r * 2 + s of the maximum, or -1
//                where the value is <= 0 (the relu closed the window).
//   brp_bwd_sums one thread per pooled output: where code >= 0, g = dz and x is read at the
//                argmax; sum(g * (x - mean)) and sum(g) per chunk, in double across the block
//                -> part[2][C][split_g].
//   brp_bwd_dx   one thread per input element (index over N * H * W): its window (h / 2,
//                w / 2; none for an odd size's last row / column), g = dz where the window's
//                code points at it, dx = w * rstd * (g - db / M - xhat * dw / M); block
//                s == 0 stores dw and db.
// Indexing: flat indices are 32-bit (< 2^31 per channel), element offsets 64-bit.
#include "common.cuh"
#include "reduce.cuh"

namespace {

constexpr int THREADS = 256;

#include "../batch_norm2d/batch_norm.cuh"

template <typename T>
__device__ void brp_fwd(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                        T* __restrict__ z, signed char* __restrict__ code, const double* __restrict__ part,
                        float* __restrict__ mean_out, float* __restrict__ rstd_out, int C, int H, int W, int P,
                        int Q, int split_s, int MO, int chunk, float eps) {
    const auto [split, c, s] = channel_chunk(C);
    const auto [mean, scale, shift] = normalize_params(part, C, split_s, c, s, eps, w, b, mean_out, rstd_out);
    const float sgn = scale > 0.0f ? 1.0f : (scale < 0.0f ? -1.0f : 0.0f);
    const int PQ = P * Q;
    const auto [start, end] = chunk_range(s, chunk, MO);
#pragma unroll 2
    for (int i = start + threadIdx.x; i < end; i += THREADS) {
        const int n = i / PQ;
        const int r = i - n * PQ;
        const int p = r / Q, q = r - p * Q;
        const long long plane = (long long)n * C + c;
        const long long top = (plane * H + 2 * p) * W + 2 * q;
        const float v0 = kl::to_f(x[top]), v1 = kl::to_f(x[top + 1]);
        const float v2 = kl::to_f(x[top + W]), v3 = kl::to_f(x[top + W + 1]);
        float best = v0 * sgn, bx = v0;
        int arg = 0;
        // row-major, the first maximum kept, a NaN wins (PyTorch's rule)
        float key = v1 * sgn;
        if (key > best || key != key) { best = key; bx = v1; arg = 1; }
        key = v2 * sgn;
        if (key > best || key != key) { best = key; bx = v2; arg = 2; }
        key = v3 * sgn;
        if (key > best || key != key) { bx = v3; arg = 3; }
        const float a = (bx - mean) * scale + shift;
        const bool open = a > 0.0f || a != a;  // relu; a NaN passes, as torch.relu's does
        const long long o = plane * PQ + r;
        z[o] = kl::from_f<T>(open ? a : 0.0f);
        code[o] = (signed char)(open ? arg : -1);
    }
}

template <typename T>
__device__ void brp_bwd_sums(const T* __restrict__ dz, const signed char* __restrict__ code,
                             const T* __restrict__ x, const float* __restrict__ mean_in, double* __restrict__ part,
                             int C, int H, int W, int P, int Q, int MO, int chunk) {
    __shared__ double red[THREADS];
    const auto [split, c, s] = channel_chunk(C);
    const float mean = mean_in[c];
    const int PQ = P * Q;
    const auto [start, end] = chunk_range(s, chunk, MO);
    // fp32 storage: per-element products and running sums in fp64; 16-bit: fp32 (the
    // block's total is fp64 either way)
    using Acc = typename kl::WideAcc<T>::type;
    Acc sw = 0, sb = 0;
#pragma unroll 2
    for (int i = start + threadIdx.x; i < end; i += THREADS) {
        const int n = i / PQ;
        const int r = i - n * PQ;
        const long long plane = (long long)n * C + c;
        const long long o = plane * PQ + r;
        const int k = code[o];
        if (k >= 0) {
            const int p = r / Q, q = r - p * Q;
            const Acc xv = kl::to_f(x[(plane * H + 2 * p + (k >> 1)) * W + 2 * q + (k & 1)]);
            const Acc g = kl::to_f(dz[o]);
            sw += g * (xv - (Acc)mean);
            sb += g;
        }
    }
    store_grad_partials(sw, sb, red, part, C, split, c, s);
}

template <typename T>
__device__ void brp_bwd_dx(const T* __restrict__ dz, const signed char* __restrict__ code, const T* __restrict__ x,
                           const T* __restrict__ w, const float* __restrict__ mean_in,
                           const float* __restrict__ rstd_in, const double* __restrict__ part, T* __restrict__ dx,
                           T* __restrict__ dw, T* __restrict__ db, int C, int H, int W, int P, int Q, int split_g,
                           int M, int chunk) {
    const auto [split, c, s] = channel_chunk(C);
    const float mean = mean_in[c], rstd = rstd_in[c];
    const auto [tw, tb, sw, sb] = channel_grads(part, C, split_g, c, s, rstd, dw, db);
    const float k = rstd * kl::to_f(w[c]);
    const float mdb = sb / M, mdw = sw / M;
    // fp32 storage: the per-element formula in fp64 (in fp32, five roundings put dx at the
    // check's bound); 16-bit: fp32
    const double k64 = (double)rstd * (double)kl::to_f(w[c]), mdb64 = tb / M, mdw64 = tw * (double)rstd / M;
    const int HW = H * W, PQ = P * Q;
    const auto [start, end] = chunk_range(s, chunk, M);
#pragma unroll 4
    for (int i = start + threadIdx.x; i < end; i += THREADS) {
        const int n = i / HW;
        const int hw = i - n * HW;
        const int h = hw / W, wc = hw - h * W;
        const int p = h >> 1, q = wc >> 1;
        const long long plane = (long long)n * C + c;
        float g = 0.0f;
        if (p < P && q < Q) {  // an odd size's last row / column has no window
            const long long o = plane * PQ + p * Q + q;
            if (code[o] == ((h & 1) << 1) + (wc & 1)) g = kl::to_f(dz[o]);
        }
        const long long off = plane * HW + hw;
        if constexpr (sizeof(T) == 4) {
            const double xhat = ((double)kl::to_f(x[off]) - mean) * rstd;
            dx[off] = kl::from_f<T>((float)(k64 * ((double)g - mdb64 - xhat * mdw64)));
        } else {
            const float xhat = (kl::to_f(x[off]) - mean) * rstd;
            dx[off] = kl::from_f<T>(k * (g - mdb - xhat * mdw));
        }
    }
}

}  // namespace

// Entry points: brp_{fwd,bwd_sums,bwd_dx}_<dtype>; grid C * split, 256 threads.
#define KL_BRP(SFX, T)                                                                                         \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                      \
        brp_fwd_##SFX(const T* x, const T* w, const T* b, T* z, signed char* code, const double* part,         \
                      float* mean, float* rstd, int C, int H, int W, int P, int Q, int split_s, int MO,        \
                      int chunk, float eps) {                                                                  \
        brp_fwd<T>(x, w, b, z, code, part, mean, rstd, C, H, W, P, Q, split_s, MO, chunk, eps);                \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                      \
        brp_bwd_sums_##SFX(const T* dz, const signed char* code, const T* x, const float* mean, double* part,  \
                           int C, int H, int W, int P, int Q, int MO, int chunk) {                             \
        brp_bwd_sums<T>(dz, code, x, mean, part, C, H, W, P, Q, MO, chunk);                                    \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                      \
        brp_bwd_dx_##SFX(const T* dz, const signed char* code, const T* x, const T* w, const float* mean,      \
                         const float* rstd, const double* part, T* dx, T* dw, T* db, int C, int H, int W,      \
                         int P, int Q, int split_g, int M, int chunk) {                                        \
        brp_bwd_dx<T>(dz, code, x, w, mean, rstd, part, dx, dw, db, C, H, W, P, Q, split_g, M, chunk);         \
    }

KL_FOR_EACH_DTYPE(KL_BRP)
