// The kernels a one-input elementwise op with a backward shares with every other (GeLU,
// ReLU): all but its forward v1 kernel, which each op writes itself. Included after
// common.cuh, once the op's functors (fp32 in, fp32 out) are defined.
#pragma once

namespace kl {

// v1 backward: one element per thread, dx = bwd(dy, x).
template <typename T, typename F>
__device__ void map2_v1(const T* dy, const T* x, T* dx, long long n, F bwd) {
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) dx[i] = from_f<T>(bwd(to_f(dy[i]), to_f(x[i])));
}

}  // namespace kl

// BASE_bwd_v1_NAME (scalar), BASE_fwd_NAME and BASE_bwd_NAME (16-byte packs, kl::UNROLL and
// kl::UNROLL2 per thread), their _x1_ twins (one pack per thread) and BASE_bwd_w8_NAME (two
// 8-byte packs per thread and input) for storage type T; FWD and BWD are functor values.
#define KL_UNARY_KERNELS(BASE, NAME, T, FWD, BWD)                                                \
    extern "C" __global__ void BASE##_bwd_v1_##NAME(const T* dy, const T* x, T* dx, long long n) { \
        kl::map2_v1<T>(dy, x, dx, n, BWD);                                                        \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(KL_THREADS)                                      \
        BASE##_fwd_##NAME(const T* __restrict__ x, T* __restrict__ y, long long n) {              \
        kl::map1_vec16<kl::UNROLL, T>(x, y, n, FWD);                                              \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(KL_X1_MAX_THREADS)                               \
        BASE##_fwd_x1_##NAME(const T* __restrict__ x, T* __restrict__ y, long long n) {           \
        kl::map1_vec16<1, T>(x, y, n, FWD);                                                       \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(KL_THREADS) BASE##_bwd_##NAME(                   \
        const T* __restrict__ dy, const T* __restrict__ x, T* __restrict__ dx, long long n) {     \
        kl::map2_vec16<kl::UNROLL2, T>(dy, x, dx, n, BWD);                                        \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(KL_X1_MAX_THREADS) BASE##_bwd_x1_##NAME(         \
        const T* __restrict__ dy, const T* __restrict__ x, T* __restrict__ dx, long long n) {     \
        kl::map2_vec16<1, T>(dy, x, dx, n, BWD);                                                  \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(KL_X1_MAX_THREADS) BASE##_bwd_w8_##NAME(         \
        const T* __restrict__ dy, const T* __restrict__ x, T* __restrict__ dx, long long n) {     \
        kl::map2_vec8<2, T>(dy, x, dx, n, BWD);                                                   \
    }
