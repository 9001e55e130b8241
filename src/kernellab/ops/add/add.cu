// Elementwise add, y = a + b, fp32 / fp16 / bf16 storage, fp32 math (one rounding, as PyTorch).
//
// Variants (registered as backends of op "add"):
//   v1  add_v1_*   one element per thread. Teaching baseline; also the fallback for storage
//                  that is not 16-byte aligned.
//   v2  add_*      (backend "cuda") 16-byte vector loads/stores, 2 packs per input in flight
//                  per thread, one tile per block. add moves 12 B per fp32 element (2 reads, 1 write)
//                  and does 1 flop: pure bandwidth, so the goal is the copy ceiling. Large
//                  16-bit tensors take add_w8_* (one 8-byte pack per thread and input:
//                  slightly faster on Hopper, see common.cuh map2_vec8).
#include "common.cuh"

namespace {
struct Add {
    __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};
}  // namespace

template <typename T>
__device__ void add_v1(const T* a, const T* b, T* y, long long n) {
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = kl::from_f<T>(kl::to_f(a[i]) + kl::to_f(b[i]));
}

#define KL_ADD(NAME, T)                                                                         \
    extern "C" __global__ void add_v1_##NAME(const T* a, const T* b, T* y, long long n) {       \
        add_v1<T>(a, b, y, n);                                                                  \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(KL_THREADS)                                    \
        add_##NAME(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ y, long long n) { \
        kl::map2_vec16<kl::UNROLL2, T>(a, b, y, n, Add{});                                      \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(KL_X1_MAX_THREADS)                                    \
        add_x1_##NAME(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ y, long long n) { \
        kl::map2_vec16<1, T>(a, b, y, n, Add{});                                                \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(KL_X1_MAX_THREADS)                             \
        add_w8_##NAME(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ y, long long n) { \
        kl::map2_vec8<1, T>(a, b, y, n, Add{});                                                 \
    }
KL_FOR_EACH_DTYPE(KL_ADD)
