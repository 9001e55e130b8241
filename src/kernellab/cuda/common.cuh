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

// The accumulator of a long sum of T values: fp64 for fp32 data (an fp32 running sum of
// thousands of terms is several ulps off where PyTorch's trees are one or two), fp32 for
// 16-bit data (their storage rounding dominates).
template <typename T> struct WideAcc { using type = float; };
template <> struct WideAcc<float> { using type = double; };

// 16 bytes seen as raw int4 (one ld.global.v4 / st.global.v4) or as N elements of T.
template <typename T> union Vec16 {
    using Raw = int4;
    static constexpr int N = 16 / sizeof(T);
    int4 raw;
    T e[N];
};
// 8 bytes (one ld.global.v2 / st.global.v2): the two-input 16-bit kernels at large sizes
// (see map2_vec8).
template <typename T> union Vec8 {
    using Raw = int2;
    static constexpr int N = 8 / sizeof(T);
    int2 raw;
    T e[N];
};

// Streaming elementwise loops over 16-byte packs.
//
// Contract: x, y (and a, b) are contiguous and 16-byte aligned (the host checks and
// falls back to a scalar kernel otherwise); n may be any count, the n % N tail is done
// element by element. Each thread issues all its 16-byte loads before the first use: at
// ~1 us of DRAM latency and ~3.3 TB/s an H100 needs ~25 KB in flight per SM; 2048 threads
// x 64 B is 128 KB. The host launches one tile (blockDim x packs per thread) per block;
// the loop is grid-stride, so any grid size stays correct.
// 16-byte packs each thread keeps in flight per input: 4 for one input, 2 for two, so
// either way 64 B per thread are in flight. At 2^28 elements on Hopper 1 is slower and 8
// no better; a capped grid-stride grid (8-32 blocks per SM) is slower than one tile per
// block, and so are evict-first cache hints.
#ifndef KL_UNROLL
#define KL_UNROLL 4
#endif
// Cache hints for streaming data that is touched once (tuning knob): 0 plain ld/st, 1
// ld.global.nc (read-only path), 2 ld.global.cs / st.global.cs (evict-first: keep the L2
// for data that is reused).
// Threads per block of the vectorized kernels (the host launches exactly this many).
#ifndef KL_THREADS
#define KL_THREADS 256
#endif
// The x1 kernels may be launched with up to this many threads (the host launches 512 for
// large 16-bit one-input tensors, see cuda/elementwise.py).
#ifndef KL_X1_MAX_THREADS
#define KL_X1_MAX_THREADS 512
#endif
#ifndef KL_CACHE_HINT
#define KL_CACHE_HINT 0
#endif
constexpr int UNROLL = KL_UNROLL;             // map1: packs per thread
constexpr int UNROLL2 = (KL_UNROLL + 1) / 2;  // map2: packs per thread and input
// Kernels come in two widths: the default (UNROLL packs per thread, for large tensors)
// and "x1" (one pack per thread): a 1M-element bf16 tensor is only 128 tiles of
// 256 x 4 packs, one per SM, too few blocks to hide latency; the host picks x1 below a
// size threshold (cuda/elementwise.py).

__device__ __forceinline__ int4 load16(const int4* p) {
#if KL_CACHE_HINT == 1
    return __ldg(p);
#elif KL_CACHE_HINT == 2
    return __ldcs(p);
#else
    return *p;
#endif
}

__device__ __forceinline__ void store16(int4* p, int4 v) {
#if KL_CACHE_HINT == 2
    __stcs(p, v);
#else
    *p = v;
#endif
}

template <int U, typename T, typename F>
__device__ __forceinline__ void map1_vec16(const T* __restrict__ x, T* __restrict__ y, long long n, F f) {
    using V = Vec16<T>;
    const long long npacks = n / V::N;
    const int4* x4 = reinterpret_cast<const int4*>(x);
    int4* y4 = reinterpret_cast<int4*>(y);
    const long long tile = (long long)blockDim.x * U;
    for (long long base = blockIdx.x * tile + threadIdx.x; base < npacks; base += gridDim.x * tile) {
        V r[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            long long p = base + (long long)u * blockDim.x;
            if (p < npacks) r[u].raw = load16(x4 + p);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            long long p = base + (long long)u * blockDim.x;
            if (p < npacks) {
                V o;
#pragma unroll
                for (int j = 0; j < V::N; ++j) o.e[j] = from_f<T>(f(to_f(r[u].e[j])));
                store16(y4 + p, o.raw);
            }
        }
    }
    const long long i = npacks * V::N + blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = from_f<T>(f(to_f(x[i])));
}

__device__ __forceinline__ int4 load_raw(const int4* p) { return load16(p); }
__device__ __forceinline__ int2 load_raw(const int2* p) { return *p; }
__device__ __forceinline__ void store_raw(int4* p, int4 v) { store16(p, v); }
__device__ __forceinline__ void store_raw(int2* p, int2 v) { *p = v; }

// y = f(a, b) over packs V (Vec16<T> or Vec8<T>), U packs per thread and input.
template <int U, typename V, typename T, typename F>
__device__ __forceinline__ void map2_packs(const T* __restrict__ a, const T* __restrict__ b,
                                           T* __restrict__ y, long long n, F f) {
    using R = typename V::Raw;
    const long long npacks = n / V::N;
    const R* a4 = reinterpret_cast<const R*>(a);
    const R* b4 = reinterpret_cast<const R*>(b);
    R* y4 = reinterpret_cast<R*>(y);
    const long long tile = (long long)blockDim.x * U;
    for (long long base = blockIdx.x * tile + threadIdx.x; base < npacks; base += gridDim.x * tile) {
        V ra[U], rb[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            long long p = base + (long long)u * blockDim.x;
            if (p < npacks) {
                ra[u].raw = load_raw(a4 + p);
                rb[u].raw = load_raw(b4 + p);
            }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            long long p = base + (long long)u * blockDim.x;
            if (p < npacks) {
                V o;
#pragma unroll
                for (int j = 0; j < V::N; ++j) o.e[j] = from_f<T>(f(to_f(ra[u].e[j]), to_f(rb[u].e[j])));
                store_raw(y4 + p, o.raw);
            }
        }
    }
    const long long i = npacks * V::N + blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = from_f<T>(f(to_f(a[i]), to_f(b[i])));
}

template <int U, typename T, typename F>
__device__ __forceinline__ void map2_vec16(const T* __restrict__ a, const T* __restrict__ b,
                                           T* __restrict__ y, long long n, F f) {
    map2_packs<U, Vec16<T>>(a, b, y, n, f);
}

// 8-byte packs: at 2^28 bf16 elements on Hopper, add with one 8-byte pack per thread and
// input at 256 threads, and GeLU's backward with two 8-byte packs at 128 threads, are ~1%
// faster than with 16-byte packs (and than torch).
template <int U, typename T, typename F>
__device__ __forceinline__ void map2_vec8(const T* __restrict__ a, const T* __restrict__ b,
                                          T* __restrict__ y, long long n, F f) {
    map2_packs<U, Vec8<T>>(a, b, y, n, f);
}

}  // namespace kl

// One extern "C" entry point per storage type, so the host looks kernels up by plain
// names: NAME_f32, NAME_f16, NAME_bf16.
#define KL_FOR_EACH_DTYPE(M) M(f32, float) M(f16, __half) M(bf16, __nv_bfloat16)
