// GeLU (tanh approximation), forward and backward, fp32 / fp16 / bf16 storage, fp32 math.
//
//   gelu(x)  = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
//            = x * sigmoid(2u)                       (same function, no 1 + tanh cancellation)
//   gelu'(x) = s + 2 x s (1 - s) sqrt(2/pi) (1 + 3 * 0.044715 x^2),   s = sigmoid(2u)
//
// Variants (registered as backends of op "gelu"):
//   v1  gelu_fwd_v1_*  one element per thread, the lecture's formula with tanhf. Teaching
//                      baseline; also the fallback for storage that is not 16-byte aligned.
//   v2  gelu_fwd_*     (backend "cuda") 16-byte vector loads/stores (4 fp32 or 8 fp16/bf16
//                      per access), 4 packs in flight per thread (2 per input for bwd),
//                      exp2 + rcp instead of expf + division (KL_GELU_FAST), tanh.approx
//                      for 16-bit outputs; gelu_*_x1_* one pack per thread, for mid sizes. GeLU is memory-bound: 1 read + 1 write per element (8 B fp32),
//                      ~20 flops; at 3.3 TB/s the tanh math is hidden under the traffic.
//       gelu_bwd_*     dx = dy * gelu'(x): 2 reads + 1 write, same vector loop; large
//                      16-bit tensors take gelu_bwd_w8_* (two 8-byte packs per thread and
//                      input, see common.cuh map2_vec8).
#include "common.cuh"
#include "../_elementwise.cuh"  // gelu_bwd_v1_* and the vectorized kernels: common.cuh's
                                  // map1_vec16 / map2_vec16 / map2_vec8 loops

namespace {
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCoeff = 0.044715f;

// sigmoid(2u) and sigmoid(2u) * (1 - sigmoid(2u)) without overflow or cancellation:
// with t = exp(-2|u|) <= 1 and q = 1 / (1 + t), s = q (u >= 0) or t q (u < 0), and
// s (1 - s) = t q^2 for either sign. (1 - s computed directly loses ~10 bits near s = 1.)
#ifndef KL_GELU_FAST
#define KL_GELU_FAST 1
#endif
__device__ __forceinline__ void sigmoid2(float u, float& s, float& s1s) {
#if KL_GELU_FAST
    // exp2 on the SFU (ex2.approx, ~2 ulp) and a correctly rounded reciprocal instead of
    // expf + IEEE division: ~8 fewer instructions per element, within the 2x-PyTorch rule.
    const float t = exp2f(-2.8853900817779268f * fabsf(u));  // exp(-2|u|) = 2^(-2 log2(e) |u|)
    const float q = __frcp_rn(1.0f + t);
#else
    const float t = expf(-2.0f * fabsf(u));
    const float q = 1.0f / (1.0f + t);
#endif
    s = u >= 0.0f ? q : t * q;
    s1s = t * q * q;
}

// One SFU instruction (MUFU.TANH, sm_75+), max relative error ~2^-11: below the rounding
// of a bf16 output (2^-9) and about that of fp16 (2^-11), so 16-bit outputs use it; fp32
// keeps the accurate path. At 1M-64M bf16 elements the accurate math costs a few percent
// against torch: 16-bit GeLU has twice the flops per byte of fp32.
__device__ __forceinline__ float tanh_approx(float u) {
    float r;
    asm("tanh.approx.f32 %0, %1;" : "=f"(r) : "f"(u));
    return r;
}

template <bool kApproxTanh>
struct GeluFwd {
    __device__ __forceinline__ float operator()(float x) const {
        const float u = kSqrt2OverPi * (x + kCoeff * x * x * x);
        if constexpr (kApproxTanh) {
            return 0.5f * x * (1.0f + tanh_approx(u));  // x = -inf: -inf * 0 = NaN, as the formula
        } else {
            float s, s1s;
            sigmoid2(u, s, s1s);
            return x * s;  // x = -inf gives -inf * 0 = NaN, as the formula does
        }
    }
};

struct GeluBwd {
    __device__ __forceinline__ float operator()(float dy, float x) const {
        float s, s1s;
        sigmoid2(kSqrt2OverPi * (x + kCoeff * x * x * x), s, s1s);
        const float du = kSqrt2OverPi * (1.0f + 3.0f * kCoeff * x * x);
        // s1s == 0 for |x| >~ 10, where du may overflow: the term is exactly 0 there.
        // At x = +-inf the formula's derivative is inf * 0 = NaN (PyTorch's too), not the
        // limits 1 and 0: NaN, as the forward follows the formula to NaN at -inf.
        if (isinf(x)) return __int_as_float(0x7fc00000);
        return dy * (s + (s1s > 0.0f ? 2.0f * x * s1s * du : 0.0f));
    }
};
}  // namespace

// v1: one element per thread (the lecture's kernel).
template <typename T>
__device__ void gelu_v1(const T* x, T* y, long long n) {
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) {
        const float v = kl::to_f(x[i]);
        y[i] = kl::from_f<T>(0.5f * v * (1.0f + tanhf(kSqrt2OverPi * (v + kCoeff * v * v * v))));
    }
}

#define KL_GELU(NAME, T)                                                                          \
    extern "C" __global__ void gelu_fwd_v1_##NAME(const T* x, T* y, long long n) { gelu_v1<T>(x, y, n); } \
    KL_UNARY_KERNELS(gelu, NAME, T, GeluFwd<(sizeof(T) == 2)>{}, GeluBwd{})
KL_FOR_EACH_DTYPE(KL_GELU)
