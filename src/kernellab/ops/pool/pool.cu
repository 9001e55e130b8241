// max_pool2d (NCHW, no padding), forward and backward; fp32 / fp16 / bf16 storage, exact
// (the output is one of the inputs). x, y, dy, dx contiguous; offsets int8 (r * k + s of
// the window's first maximum, a NaN winning as in PyTorch: take v when v > max or v != v).
//
//   maxpool2d_fwd_*  one thread per output: k x k loads from one (n, c) plane; consecutive
//                    threads hold consecutive q, so the loads of a warp stride by s
//                    elements (half of each 32-byte sector used at s = 2: x is read once
//                    from DRAM, the other half is served from L1/L2 by the neighbour row).
//   maxpool2d_bwd_*  one thread per input element, a gather over the ceil(k/s)^2 windows
//                    that can cover it: no atomics, no zero-fill pass, deterministic.
#include "common.cuh"

// Flat index i of a contiguous [N C, rows, cols] tensor: its row and col; returns its plane n c.
__device__ __forceinline__ long long plane_of(long long i, int rows, int cols, int& row, int& col) {
    col = (int)(i % cols);
    row = (int)((i / cols) % rows);
    return i / ((long long)rows * cols);
}

template <typename T>
__device__ void pool_fwd(const T* __restrict__ x, T* __restrict__ y, signed char* __restrict__ idx,
                         long long total, int H, int W, int P, int Q, int k, int s) {
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= total) return;
    int p, q;
    const long long nc = plane_of(i, P, Q, p, q);
    const T* win = x + nc * H * W + (long long)(p * s) * W + q * s;
    float best = kl::to_f(win[0]);
    int arg = 0;
    for (int j = 1; j < k * k; ++j) {
        const float v = kl::to_f(win[(j / k) * W + j % k]);
        if (v > best || v != v) {
            best = v;
            arg = j;
        }
    }
    y[i] = kl::from_f<T>(best);
    idx[i] = (signed char)arg;
}

template <typename T>
__device__ void pool_bwd(const T* __restrict__ dy, const signed char* __restrict__ idx, T* __restrict__ dx,
                         long long total, int H, int W, int P, int Q, int k, int s) {
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= total) return;
    int h, w;
    const long long nc = plane_of(i, H, W, h, w);
    const int p_hi = min(h / s, P - 1), q_hi = min(w / s, Q - 1);
    float acc = 0.0f;
    for (int p = p_hi; p >= 0 && h - p * s < k; --p) {
        for (int q = q_hi; q >= 0 && w - q * s < k; --q) {
            const long long o = (nc * P + p) * Q + q;
            if (idx[o] == (h - p * s) * k + (w - q * s)) acc += kl::to_f(dy[o]);
        }
    }
    dx[i] = kl::from_f<T>(acc);
}

#define KL_POOL(NAME, T)                                                                           \
    extern "C" __global__ void maxpool2d_fwd_##NAME(const T* x, T* y, signed char* idx, long long total, \
                                                    int H, int W, int P, int Q, int k, int s) {    \
        pool_fwd<T>(x, y, idx, total, H, W, P, Q, k, s);                                           \
    }                                                                                              \
    extern "C" __global__ void maxpool2d_bwd_##NAME(const T* dy, const signed char* idx, T* dx,    \
                                                    long long total, int H, int W, int P, int Q,   \
                                                    int k, int s) {                                \
        pool_bwd<T>(dy, idx, dx, total, H, W, P, Q, k, s);                                         \
    }
KL_FOR_EACH_DTYPE(KL_POOL)
