// Weight-only quantized matmul: y[m, n] = scale[n] * sum_k x[m, k] q[n, k] (+ bias[n]).
// x [M, K] fp16/bf16 (or fp32) row-major, q the nn.Linear weight [N, K] quantized per output row:
// int8 (BITS 8) or two signed 4-bit values per byte, low nibble = even k (BITS 4);
// scale [N] fp32; y [M, N] in x's dtype. fp32 accumulation; the scale is applied once per
// output, after the K sum.
//
// Decode (M = 1-16) reads each weight once and does 1-16 FMAs with it: memory-bound. The
// bf16 weight of a 4096 x 14336 layer is 117 MB (26 us at ~4.5 TB/s on an H200), int8
// 59 MB (13 us), int4 29 MB (6.5 us): the whole game is streaming the weight at the copy
// ceiling while the dequantization hides under the loads.
//
// Variants (registered as backends cuda_v1.., "cuda" = v3):
//   v1  wo_v1_*   one warp per output row n (8 rows per 256-thread block), one x row per
//                 blockIdx.y; each lane reads one weight byte per step (a warp reads 32
//                 bytes per load instruction: a quarter of a 128-byte line per request),
//                 int -> float with cvt; shuffle reduce. Teaching baseline, and the
//                 fallback for K or pointers that do not allow 16-byte loads.
//   v2  wo_v2_*   v1's grid, 16-byte weight loads (16 int8 per lane, 512 bytes per warp
//                 instruction) and 16-byte x loads, two loads in flight per lane, and the
//                 int8 -> fp32 conversion as a byte permute + one add (0x4B000000 | (q+128)
//                 is the float 2^23 + q + 128): cvt.f32.s8 runs at a quarter of the FMA
//                 rate, ~4 T/s on an H200, below the 4.8 T weights/s HBM delivers.
//                 Still one x row per block row: at M rows the weight is read M times.
//   v3  wo_v3_*   (backend "cuda") 8 warps x 2 weight rows = 16 rows per block, and MT = 1,
//                 4 or 8 rows of x per block: x is staged in shared memory in K chunks
//                 (MT x 1024-2048 values), so the weight is read once per 8 rows of x
//                 (M = 16: twice) and every weight byte feeds MT FMAs. 4 x 16-byte weight
//                 loads in flight per lane. At MT = 8 the FMAs (8 per byte) approach the
//                 H200's fp32 rate: beyond it the Triton kernel's tensor cores win.
//   int4: wo4_v1_* (v1 with nibbles) and wo4_v3_* (v3: 16 bytes = 32 weights per load,
//   nibbles offset by +8 and turned into floats with the same 2^23 trick).
#include "common.cuh"
// (NVRTC has no <stdint.h>: the fixed-width types it names are declared here)
typedef signed char int8_t;
typedef unsigned char uint8_t;

namespace {

constexpr int WARPS = 8;
constexpr int THREADS = WARPS * 32;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

template <typename T>
__device__ __forceinline__ void write_out(T* y, const float* scale, const T* bias, int has_bias, long long m,
                                          int n, int N, float acc) {
    float v = acc * scale[n];
    if (has_bias) v += kl::to_f(bias[n]);
    y[m * N + n] = kl::from_f<T>(v);
}

// signed int8 weight k of row (BITS 8), or nibble k (BITS 4)
template <int BITS>
__device__ __forceinline__ float weight_at(const uint8_t* row, int k) {
    if (BITS == 8) return (float)(int8_t)row[k];
    const int b = row[k >> 1];
    const int u = (k & 1) ? (b >> 4) : (b & 15);
    return (float)((u ^ 8) - 8);
}

// ---------------------------------------------------------------------------- v1
template <typename T, int BITS>
__device__ void wo_v1(const T* __restrict__ x, const uint8_t* __restrict__ w, const float* __restrict__ scale,
                      const T* __restrict__ bias, T* __restrict__ y, int M, int N, int K, int has_bias) {
    const int lane = threadIdx.x & 31;
    const int n = blockIdx.x * WARPS + (threadIdx.x >> 5);
    if (n >= N) return;
    const long long row_bytes = BITS == 8 ? (long long)K : (long long)K / 2;
    const uint8_t* wr = w + (long long)n * row_bytes;
    for (long long m = blockIdx.y; m < M; m += gridDim.y) {
        const T* xr = x + m * K;
        float acc = 0.0f;
        for (int k = lane; k < K; k += 32) acc += kl::to_f(xr[k]) * weight_at<BITS>(wr, k);
        acc = warp_sum(acc);
        if (lane == 0) write_out(y, scale, bias, has_bias, m, n, N, acc);
    }
}

// ---------------------------------------------------------------------------- helpers
// 16 int8 weights (one int4 load) -> 16 floats. Byte i of a word w is placed under the
// exponent of 2^23 (prmt), after the xor made it q + 128 unsigned; one subtract gives q.
__device__ __forceinline__ void int8x16_to_f32(const int4& raw, float* f) {
    const unsigned int words[4] = {(unsigned)raw.x ^ 0x80808080u, (unsigned)raw.y ^ 0x80808080u,
                                   (unsigned)raw.z ^ 0x80808080u, (unsigned)raw.w ^ 0x80808080u};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            // result bytes, low to high: byte i of the word, 0x00, 0x00, 0x4B
            const unsigned bits = __byte_perm(words[j], 0x4B000000u, 0x7540u | i);
            f[4 * j + i] = __uint_as_float(bits) - 8388736.0f;  // 2^23 + 128
        }
    }
}

// 16 bytes of packed int4 (32 weights, low nibble first) -> 32 floats, as above with
// the nibbles offset by 8 (xor 0x88888888) and a subtract of 2^23 + 8.
__device__ __forceinline__ void int4x32_to_f32(const int4& raw, float* f) {
    const unsigned int words[4] = {(unsigned)raw.x ^ 0x88888888u, (unsigned)raw.y ^ 0x88888888u,
                                   (unsigned)raw.z ^ 0x88888888u, (unsigned)raw.w ^ 0x88888888u};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const unsigned u = (words[j] >> (4 * i)) & 15u;
            f[8 * j + i] = __uint_as_float(0x4B000000u | u) - 8388616.0f;  // 2^23 + 8
        }
    }
}

// E consecutive x values (16-byte aligned, E a multiple of 16 / sizeof(T)) -> floats
template <typename T, int E>
__device__ __forceinline__ void load_x(const T* p, float* f) {
    constexpr int V = kl::Vec16<T>::N;
#pragma unroll
    for (int v = 0; v < E / V; ++v) {
        kl::Vec16<T> pack;
        pack.raw = *reinterpret_cast<const int4*>(p + V * v);
#pragma unroll
        for (int e = 0; e < V; ++e) f[V * v + e] = kl::to_f(pack.e[e]);
    }
}

// ---------------------------------------------------------------------------- v2
// Requires K % 16 == 0 and 16-byte aligned x and w (the host checks; else v1).
template <typename T>
__device__ void wo_v2(const T* __restrict__ x, const uint8_t* __restrict__ w, const float* __restrict__ scale,
                      const T* __restrict__ bias, T* __restrict__ y, int M, int N, int K, int has_bias) {
    const int lane = threadIdx.x & 31;
    const int n = blockIdx.x * WARPS + (threadIdx.x >> 5);
    if (n >= N) return;
    const int groups = K / 16;  // 16-byte groups per row
    const int4* wr = reinterpret_cast<const int4*>(w + (long long)n * K);
    for (long long m = blockIdx.y; m < M; m += gridDim.y) {
        const T* xr = x + m * K;
        float acc = 0.0f;
        int g = lane;
        for (; g + 32 < groups; g += 64) {  // two weight loads in flight before any math
            const int4 r0 = wr[g], r1 = wr[g + 32];
            float wf[16], xf[16];
            int8x16_to_f32(r0, wf);
            load_x<T, 16>(xr + 16 * g, xf);
#pragma unroll
            for (int e = 0; e < 16; ++e) acc = fmaf(xf[e], wf[e], acc);
            int8x16_to_f32(r1, wf);
            load_x<T, 16>(xr + 16 * (g + 32), xf);
#pragma unroll
            for (int e = 0; e < 16; ++e) acc = fmaf(xf[e], wf[e], acc);
        }
        for (; g < groups; g += 32) {
            float wf[16], xf[16];
            int8x16_to_f32(wr[g], wf);
            load_x<T, 16>(xr + 16 * g, xf);
#pragma unroll
            for (int e = 0; e < 16; ++e) acc = fmaf(xf[e], wf[e], acc);
        }
        acc = warp_sum(acc);
        if (lane == 0) write_out(y, scale, bias, has_bias, m, n, N, acc);
    }
}

// ---------------------------------------------------------------------------- v3
// ROWS weight rows per warp, MT rows of x per block (blockIdx.y: which group of MT rows),
// x chunk [MT, KC] in shared memory (dynamic: MT * KC * sizeof(T) bytes; KC a multiple
// of 32).
// Requires K % (16 * 8 / BITS) == 0 (whole 16-byte weight groups) and 16-byte alignment.
constexpr int ROWS = 2;
constexpr int UNROLL = 2;  // groups per lane per step and row: ROWS x UNROLL loads in flight

template <typename T, int BITS, int MT>
__device__ void wo_v3(const T* __restrict__ x, const uint8_t* __restrict__ w, const float* __restrict__ scale,
                      const T* __restrict__ bias, T* __restrict__ y, int M, int N, int K, int KC, int has_bias) {
    extern __shared__ int4 smem_raw[];
    T* xs = reinterpret_cast<T*>(smem_raw);
    constexpr int E = 16 * 8 / BITS;  // weights per 16-byte group
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int n0 = (blockIdx.x * WARPS + warp) * ROWS;
    const long long row_bytes = (long long)K * BITS / 8;
    for (long long m0 = (long long)blockIdx.y * MT; m0 < M; m0 += (long long)gridDim.y * MT) {
        const int mt = (int)min((long long)MT, M - m0);
        float acc[ROWS][MT];
#pragma unroll
        for (int r = 0; r < ROWS; ++r)
#pragma unroll
            for (int j = 0; j < MT; ++j) acc[r][j] = 0.0f;
        for (int k0 = 0; k0 < K; k0 += KC) {
            const int kc = min(KC, K - k0);  // a multiple of E (K is)
            __syncthreads();  // the previous chunk is consumed
            // stage x[m0 .. m0 + MT, k0 .. k0 + kc] (rows past M as zeros), 16 bytes a thread
            constexpr int V = kl::Vec16<T>::N;  // values of T per 16 bytes
            const int packs = kc / V;
            for (int i = threadIdx.x; i < MT * packs; i += THREADS) {
                const int j = i / packs, p = i - j * packs;
                int4 v = make_int4(0, 0, 0, 0);
                if (j < mt) v = *reinterpret_cast<const int4*>(x + (m0 + j) * K + k0 + V * p);
                *reinterpret_cast<int4*>(xs + j * KC + V * p) = v;
            }
            __syncthreads();
            const int groups = kc / E;
            for (int g0 = lane; g0 < groups; g0 += 32 * UNROLL) {
                int4 raw[ROWS][UNROLL];
#pragma unroll
                for (int r = 0; r < ROWS; ++r) {
                    const int n = n0 + r;
                    const int4* wr = reinterpret_cast<const int4*>(w + (long long)min(n, N - 1) * row_bytes +
                                                                   (long long)k0 * BITS / 8);
#pragma unroll
                    for (int u = 0; u < UNROLL; ++u) {
                        const int g = g0 + 32 * u;
                        raw[r][u] = g < groups ? wr[g] : make_int4(0, 0, 0, 0);
                    }
                }
#pragma unroll
                for (int u = 0; u < UNROLL; ++u) {
                    const int g = g0 + 32 * u;
                    if (g >= groups) break;
#pragma unroll
                    for (int r = 0; r < ROWS; ++r) {
                        float wf[E];
                        if (BITS == 8) int8x16_to_f32(raw[r][u], wf);
                        else int4x32_to_f32(raw[r][u], wf);
#pragma unroll
                        for (int j = 0; j < MT; ++j) {
                            float xf[E];
                            load_x<T, E>(xs + j * KC + g * E, xf);
                            float a = acc[r][j];
#pragma unroll
                            for (int e = 0; e < E; ++e) a = fmaf(xf[e], wf[e], a);
                            acc[r][j] = a;
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
#pragma unroll
            for (int j = 0; j < MT; ++j) {
                const float s = warp_sum(acc[r][j]);
                if (lane == 0 && j < mt && n0 + r < N) write_out(y, scale, bias, has_bias, m0 + j, n0 + r, N, s);
            }
        }
    }
}

}  // namespace

#define KL_WO_ARGS(T) const T *x, const uint8_t *w, const float *scale, const T *bias, T *y, int M, int N, int K
#define KL_WO_V1(S, T)                                                                                       \
    extern "C" __global__ void __launch_bounds__(THREADS) wo_v1_##S(KL_WO_ARGS(T), int has_bias) {          \
        wo_v1<T, 8>(x, w, scale, bias, y, M, N, K, has_bias);                                                \
    }                                                                                                        \
    extern "C" __global__ void __launch_bounds__(THREADS) wo4_v1_##S(KL_WO_ARGS(T), int has_bias) {         \
        wo_v1<T, 4>(x, w, scale, bias, y, M, N, K, has_bias);                                                \
    }
#define KL_WO_V3(S, T, MT)                                                                                   \
    extern "C" __global__ void __launch_bounds__(THREADS) wo_v3_m##MT##_##S(KL_WO_ARGS(T), int KC,         \
                                                                            int has_bias) {                  \
        wo_v3<T, 8, MT>(x, w, scale, bias, y, M, N, K, KC, has_bias);                                        \
    }                                                                                                        \
    extern "C" __global__ void __launch_bounds__(THREADS) wo4_v3_m##MT##_##S(KL_WO_ARGS(T), int KC,        \
                                                                             int has_bias) {                 \
        wo_v3<T, 4, MT>(x, w, scale, bias, y, M, N, K, KC, has_bias);                                        \
    }
// 16-bit x: every variant, v3 with 1, 4 or 8 rows of x per block (M = 2-3 takes 4: the
// weight is read once either way). fp32 x (not what these kernels are for): v1 only.
#define KL_WO_KERNELS(S, T)                                                                                  \
    KL_WO_V1(S, T)                                                                                           \
    extern "C" __global__ void __launch_bounds__(THREADS) wo_v2_##S(KL_WO_ARGS(T), int has_bias) {          \
        wo_v2<T>(x, w, scale, bias, y, M, N, K, has_bias);                                                   \
    }                                                                                                        \
    KL_WO_V3(S, T, 1) KL_WO_V3(S, T, 4) KL_WO_V3(S, T, 8)

KL_WO_V1(f32, float)
KL_WO_KERNELS(f16, __half)
KL_WO_KERNELS(bf16, __nv_bfloat16)
