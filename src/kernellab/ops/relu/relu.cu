// ReLU, forward and backward, fp32 / fp16 / bf16 storage (values pass through fp32, which
// holds every fp16/bf16 value exactly: the result is bit-exact).
//
//   relu(x)  = x > 0 ? x : 0,  NaN -> NaN  (fmaxf(x, 0) returns 0 for NaN: not used)
//   dx       = x <= 0 ? 0 : dy             (PyTorch's threshold_backward; relu'(0) = 0)
//
// Variants (registered as backends of op "relu"):
//   v1  relu_fwd_v1_*  one element per thread. Teaching baseline; also the fallback for
//                      storage that is not 16-byte aligned.
//   v2  relu_fwd_*     (backend "cuda") 16-byte vector loads/stores through common.cuh's
//                      map loops (4 packs per thread; x1: one pack, for mid sizes; the
//                      backward's w8: 8-byte packs for large 16-bit tensors). ReLU moves
//                      8 B (fp32 fwd) per compare: the copy ceiling is the whole story.
#include "common.cuh"
#include "../_elementwise.cuh"  // relu_bwd_v1_* and the vectorized kernels: common.cuh's
                                  // map1_vec16 / map2_vec16 / map2_vec8 loops

namespace {
struct ReluFwd {
    __device__ __forceinline__ float operator()(float x) const { return (x > 0.0f || x != x) ? x : 0.0f; }
};
struct ReluBwd {
    __device__ __forceinline__ float operator()(float dy, float x) const { return x <= 0.0f ? 0.0f : dy; }
};
}  // namespace

template <typename T>
__device__ void relu_v1(const T* x, T* y, long long n) {
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = kl::from_f<T>(ReluFwd{}(kl::to_f(x[i])));
}

#define KL_RELU(NAME, T)                                                                          \
    extern "C" __global__ void relu_fwd_v1_##NAME(const T* x, T* y, long long n) { relu_v1<T>(x, y, n); } \
    KL_UNARY_KERNELS(relu, NAME, T, ReluFwd{}, ReluBwd{})
KL_FOR_EACH_DTYPE(KL_RELU)
