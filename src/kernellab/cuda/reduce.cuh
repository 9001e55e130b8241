// kernellab/cuda/reduce.cuh - reduction building blocks for row-wise kernels (softmax,
// norms, cross-entropy, sum, max): warp-level shuffles and a block-level combine through
// shared memory. Math in fp32. Include after common.cuh.
//
// A block reduction costs one shuffle tree per warp (5 steps), one shared-memory write
// per warp, a barrier, and one more shuffle tree in every warp over the per-warp
// partials, so that every thread gets the result (no second barrier to broadcast it).
#pragma once

namespace kl {

constexpr unsigned FULL_MASK = 0xffffffffu;

// Sum over a block of N threads through shared memory (``red`` holds N values of A; v is
// converted to A),
// halving the active threads each step; every thread gets the result. The plain tree in
// any type: double where fp32 partials must add without rounding (batch norm's
// backward sums), the teaching variants' reduction (norms.cu v1).
template <int N, typename A, typename V>
__device__ __forceinline__ A smem_block_sum(V v, A* red) {
    __syncthreads();  // red may still be read by the previous call
    red[threadIdx.x] = (A)v;
    __syncthreads();
    for (int h = N / 2; h > 0; h >>= 1) {
        if (threadIdx.x < h) red[threadIdx.x] += red[threadIdx.x + h];
        __syncthreads();
    }
    return red[0];
}

// -inf without <cmath> (NVRTC ships no standard headers).
__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

struct SumOp {
    __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
    static __device__ __forceinline__ float identity() { return 0.0f; }
};

// fmaxf drops a NaN operand; a reduction that must propagate NaN (max as torch.max does)
// uses NanMaxOp.
struct MaxOp {
    __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
    static __device__ __forceinline__ float identity() { return neg_inf(); }
};

struct NanMaxOp {
    __device__ __forceinline__ float operator()(float a, float b) const {
        return (a != a || a > b) ? a : b;
    }
    static __device__ __forceinline__ float identity() { return neg_inf(); }
};

// Every lane of the warp gets op over the 32 lanes' values.
template <typename Op>
__device__ __forceinline__ float warp_allreduce(float v, Op op) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v = op(v, __shfl_xor_sync(FULL_MASK, v, off));
    return v;
}

// Every thread of the block gets op over the block's values. ``scratch`` holds at least
// blockDim.x / 32 floats of shared memory; blockDim.x is a multiple of 32 (<= 1024). The
// leading barrier makes back-to-back calls with the same scratch safe.
template <typename Op>
__device__ __forceinline__ float block_allreduce(float v, Op op, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = warp_allreduce(v, op);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < warps ? scratch[lane] : Op::identity();
    return warp_allreduce(v, op);
}

// Online-softmax pair (running max m, running sum s of exp(x - m)): combining two pairs.
struct MaxSum {
    float m, s;
};

__device__ __forceinline__ MaxSum combine(MaxSum a, MaxSum b) {
    const float m = fmaxf(a.m, b.m);
    // Both empty (or fully masked): no -inf - -inf; s is 0 there, or NaN from a NaN input
    // that fmaxf left out of m, which the sum keeps.
    if (m == neg_inf()) return {m, a.s + b.s};
    return {m, a.s * __expf(a.m - m) + b.s * __expf(b.m - m)};
}

__device__ __forceinline__ MaxSum warp_allreduce(MaxSum v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        MaxSum o{__shfl_xor_sync(FULL_MASK, v.m, off), __shfl_xor_sync(FULL_MASK, v.s, off)};
        v = combine(v, o);
    }
    return v;
}

// ``scratch`` holds at least 2 * blockDim.x / 32 floats.
__device__ __forceinline__ MaxSum block_allreduce(MaxSum v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = warp_allreduce(v);
    __syncthreads();
    if (lane == 0) {
        scratch[2 * warp] = v.m;
        scratch[2 * warp + 1] = v.s;
    }
    __syncthreads();
    v = lane < warps ? MaxSum{scratch[2 * lane], scratch[2 * lane + 1]} : MaxSum{neg_inf(), 0.0f};
    return warp_allreduce(v);
}

}  // namespace kl
