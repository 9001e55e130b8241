// kernellab/cuda/common.cuh - shared helpers for kernellab's CUDA kernels (NVRTC-compiled).
//
// - float <-> storage type conversions for fp32 / fp16 / bf16 (math is always fp32),
// - 16-byte vector access (int4) and the elementwise "map" loops built on it,
// - ceil_div.
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>

namespace kl {

__host__ __device__ constexpr long long ceil_div(long long a, long long b) { return (a + b - 1) / b; }

// Storage type -> fp32 and back (round to nearest even, as PyTorch does).
__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_f<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}

// 16 bytes seen as raw int4 (one ld.global.v4 / st.global.v4) or as N elements of T.
template <typename T> union Vec16 {
    static constexpr int N = 16 / sizeof(T);
    int4 raw;
    T e[N];
};

// Streaming elementwise loops over 16-byte packs.
//
// Contract: x, y (and a, b) are contiguous and 16-byte aligned (the host checks and
// falls back to a scalar kernel otherwise); n may be any count, the n % N tail is done
// element by element. Each thread keeps UNROLL independent 16-byte loads in flight
// before the first use: at ~1 us of DRAM latency and ~3.3 TB/s an H100 needs ~25 KB in
// flight per SM; 2048 threads x 4 packs x 16 B x (1 or 2 inputs) is 128-256 KB.
// The grid is a grid-stride loop over tiles of blockDim * UNROLL packs.
constexpr int UNROLL = 4;

template <typename T, typename F>
__device__ __forceinline__ void map1_vec16(const T* __restrict__ x, T* __restrict__ y, long long n, F f) {
    using V = Vec16<T>;
    const long long npacks = n / V::N;
    const int4* x4 = reinterpret_cast<const int4*>(x);
    int4* y4 = reinterpret_cast<int4*>(y);
    const long long tile = (long long)blockDim.x * UNROLL;
    for (long long base = blockIdx.x * tile + threadIdx.x; base < npacks; base += gridDim.x * tile) {
        V r[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            long long p = base + (long long)u * blockDim.x;
            if (p < npacks) r[u].raw = x4[p];
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            long long p = base + (long long)u * blockDim.x;
            if (p < npacks) {
                V o;
#pragma unroll
                for (int j = 0; j < V::N; ++j) o.e[j] = from_f<T>(f(to_f(r[u].e[j])));
                y4[p] = o.raw;
            }
        }
    }
    const long long i = npacks * V::N + blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = from_f<T>(f(to_f(x[i])));
}

template <typename T, typename F>
__device__ __forceinline__ void map2_vec16(const T* __restrict__ a, const T* __restrict__ b,
                                           T* __restrict__ y, long long n, F f) {
    using V = Vec16<T>;
    const long long npacks = n / V::N;
    const int4* a4 = reinterpret_cast<const int4*>(a);
    const int4* b4 = reinterpret_cast<const int4*>(b);
    int4* y4 = reinterpret_cast<int4*>(y);
    const long long tile = (long long)blockDim.x * UNROLL;
    for (long long base = blockIdx.x * tile + threadIdx.x; base < npacks; base += gridDim.x * tile) {
        V ra[UNROLL], rb[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            long long p = base + (long long)u * blockDim.x;
            if (p < npacks) {
                ra[u].raw = a4[p];
                rb[u].raw = b4[p];
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            long long p = base + (long long)u * blockDim.x;
            if (p < npacks) {
                V o;
#pragma unroll
                for (int j = 0; j < V::N; ++j) o.e[j] = from_f<T>(f(to_f(ra[u].e[j]), to_f(rb[u].e[j])));
                y4[p] = o.raw;
            }
        }
    }
    const long long i = npacks * V::N + blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = from_f<T>(f(to_f(a[i]), to_f(b[i])));
}

}  // namespace kl

// One extern "C" entry point per storage type, so the host looks kernels up by plain
// names: NAME_f32, NAME_f16, NAME_bf16.
#define KL_FOR_EACH_DTYPE(M) M(f32, float) M(f16, __half) M(bf16, __nv_bfloat16)
