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
// Variants (registered as backends cuda_v1.., "cuda" = v4):
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
//   v3  wo_v3_*   8 warps x 2 weight rows = 16 rows per block, and MT = 1, 4 or 8 rows
//                 of x per block: x is staged in shared memory in K chunks
//                 (MT x 1024-2048 values), so the weight is read once per 8 rows of x
//                 (M = 16: twice) and every weight byte feeds MT FMAs. 4 x 16-byte weight
//                 loads in flight per lane. At MT = 8 the FMAs (8 per byte) approach the
//                 H200's fp32 rate: beyond it the Triton kernel's tensor cores win.
//   v4  wo_v4_*   (backend "cuda") tensor cores: mma.sync m16n8k16 with 16 weight rows as
//                 A and up to 16 rows of x as B, the int8 -> bf16/fp16 conversion done
//                 with bit operations in registers (1.25-1.75 instructions per weight),
//                 every load of a step in flight before its first mma (8 x 16 B of weight
//                 per lane), x read through L1 (no staging, no barrier in the loop), K
//                 split across the warps of a block and, where N alone gives too few
//                 blocks, across blocks (fp32 partials + wo_v4_reduce). One weight load
//                 serves all 16 rows: M = 16 costs about what M = 1 does. wo_v4p_* (built
//                 with KL_WO_V4_EXTRA) pipeline the steps: the next step's loads fly
//                 while a step computes.
//   v5  wo_v5_*   (sm_90, built only with KL_WO_V5; no backend yet) v4's math fed from a
//                 shared-memory ring that a producer warp fills with bulk async copies
//                 (cp.async.bulk + mbarrier transaction counts): up to ~200 KB of weight
//                 in flight per SM without registers.
//   int4: wo4_v1_* (v1 with nibbles) and wo4_v3_* (v3: 16 bytes = 32 weights per load,
//   nibbles offset by +8 and turned into floats with the same 2^23 trick).
#include "common.cuh"
#include "mbarrier.cuh"
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


// ---------------------------------------------------------------------------- v4
// Tensor cores for decode: mma.sync m16n8k16 with the weight as the A operand (16 weight
// rows) and x as B (MT = 8 or 16 rows of x: one or two n8 tiles), fp32 accumulators.
// Each 16-byte weight load feeds every row of x, and the multiply is off the CUDA
// cores: per weight only the int8 -> 16-bit conversion remains (1.75 instructions for
// bf16, 1.25 for fp16, below v2/v3's ~3.5 with the FMA and x's conversion).
//
// The K order inside a step is free (a dot product does not care) as long as the weight
// and x fragments agree, so a lane loads 16 contiguous bytes of its rows and uses them
// as they lie: lane (g = lane / 4, c = lane % 4) loads weight rows g and g + 8 of its
// 16-row tile at k = k0 + 64 u + 16 c (u < U), i.e. a warp load reads 64 contiguous bytes
// of 8 rows. Word s of those 16 bytes (k + 4 s .. k + 4 s + 3) is mma step s: bytes 0 and
// 2 make the fragment pair (kk = 2c, 2c + 1), bytes 1 and 3 the pair (kk = 2c + 8, 2c + 9),
// so x's pairs are permuted to match, (x[k], x[k + 2]) and (x[k + 1], x[k + 3]), one
// prmt per pair (amortized over the RT row tiles that share them).
//
// int8 pair -> 16-bit pair without a float detour (bytes 0 and 2 of a word sit where
// the two halves of a 32-bit pair go):
//   fp16: 0x6400 | (q + 128) is the half 1024 + q + 128; one sub.f16x2 of 1152 gives q.
//   bf16: only 7 mantissa bits, so q = (q & 127) - 128 * sign: 0x4300 | (q & 127) is
//         128 + (q & 127), 0x4300 | (q & 128) is 128 or 256; one fma.bf16x2 subtracts them.
//   Both exact (|q| <= 128 fits either format).
//
// Grid: blockIdx.x owns 16 * RT * WN weight rows (WN warps side by side), blockIdx.y one
// of gridDim.y K slices of KS values, blockIdx.z one group of MT rows of x. The WK warps
// of a WN column split the slice's steps (64 U values each) round robin, so a block keeps
// WN * WK warps x 2 RT U 16-byte loads in flight (WK = 8, RT U = 4: 32 KB) and its warps
// read x from L1 (the WN warps of a step share it). Partial sums meet in shared memory
// (WK of them, added in warp order); one K slice writes y (scale, bias), several write
// fp32 partials [slices, M, N] that wo_v4_reduce adds in slice order (deterministic).
// Pipelined (PIPE, wo_v4p_*): a warp issues its next step's weight loads before this
// step's conversions and mmas, so 2 RT U loads per lane stay in flight while it computes
// (x, an L1 / L2 hit, is loaded by the step that uses it: its second register set does
// not fit).
// Requires K % 16 == 0, 16-byte aligned x and w, KS % 16 == 0 (the host checks).
__device__ __forceinline__ unsigned i8pair_to(unsigned w, __half*) {
    const unsigned magic = (w & 0x00FF00FFu) ^ 0x64806480u;  // halves 1024 + (q + 128)
    unsigned d;
    asm("sub.f16x2 %0, %1, %2;" : "=r"(d) : "r"(magic), "r"(0x64806480u));  // - 1152
    return d;
}
__device__ __forceinline__ unsigned i8pair_to(unsigned w, __nv_bfloat16*) {
    const unsigned magic = (w & 0x007F007Fu) | 0x43004300u;  // 128 + (q & 127)
    const unsigned off = (w & 0x00800080u) | 0x43004300u;    // 128 + 128 * sign
    unsigned d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(off), "r"(0xBF80BF80u), "r"(magic));  // magic - off
    return d;
}

__device__ __forceinline__ void mma_16816(float* c, const unsigned* a, const unsigned* b, __half*) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ void mma_16816(float* c, const unsigned* a, const unsigned* b, __nv_bfloat16*) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Streamed weights: read once, so they skip L1 (which keeps x for the block's warps),
// and ask L2 to fetch 256 bytes around each miss: a warp load covers 64 bytes of each of
// its 8 rows, so the rest of a row's 256 bytes (the step's other chunks, or with U = 1 the
// next steps') is on its way before the loads for it issue. KL_WO_HINT 1 drops the
// prefetch, 0 is a plain ld.global.nc (lab/gpu_quant_sweep.py times all three builds).
#ifndef KL_WO_HINT
#define KL_WO_HINT 2
#endif
__device__ __forceinline__ int4 ld_weight(const uint8_t* p) {
    int4 v;
#if KL_WO_HINT == 2
    asm("ld.global.nc.L1::no_allocate.L2::256B.v4.s32 {%0,%1,%2,%3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
#elif KL_WO_HINT == 1
    asm("ld.global.nc.L1::no_allocate.v4.s32 {%0,%1,%2,%3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
#else
    v = __ldg(reinterpret_cast<const int4*>(p));
#endif
    return v;
}

__device__ __forceinline__ unsigned word_of(const int4& v, int s) {
    return (unsigned)(s == 0 ? v.x : s == 1 ? v.y : s == 2 ? v.z : v.w);
}

// One warp step of v4: U chunks of 16 K values of the lane's 2 RT weight rows and J x
// rows, at kc = k0 + 16 c (+ 64 u): v4_load issues the loads into a V4Regs, v4_mma
// converts and multiplies one chunk. TAIL: chunks at or past k_hi are zeros (weight and
// x both, so an inf in x past the slice adds nothing), the loads behind a predicate.
template <int MT, int RT, int U>
struct V4Regs {
    int4 w[RT][2][U];
    int4 x[MT / 8][U][2];
};

// chunk u (K values kb .. kb + 15 of the lane) of the weight rows, or of the x rows
template <typename T, int MT, int RT, int U, bool TAIL>
__device__ __forceinline__ void v4_load_w(V4Regs<MT, RT, U>& r, const uint8_t* const (&wrow)[RT][2], int u, int kb,
                                          int k_hi) {
    const bool in = !TAIL || kb < k_hi;  // whole chunks (K, KS multiples of 16)
#pragma unroll
    for (int t = 0; t < RT; ++t)
#pragma unroll
        for (int h = 0; h < 2; ++h) r.w[t][h][u] = in ? ld_weight(wrow[t][h] + kb) : make_int4(0, 0, 0, 0);
}
template <typename T, int MT, int RT, int U, bool TAIL>
__device__ __forceinline__ void v4_load_x(V4Regs<MT, RT, U>& r, const T* const (&xrow)[MT / 8], int u, int kb,
                                          int k_hi) {
    const bool in = !TAIL || kb < k_hi;
#pragma unroll
    for (int j = 0; j < MT / 8; ++j) {
        const int4* xp = reinterpret_cast<const int4*>(xrow[j] + kb);
        r.x[j][u][0] = in ? __ldg(xp) : make_int4(0, 0, 0, 0);
        r.x[j][u][1] = in ? __ldg(xp + 1) : make_int4(0, 0, 0, 0);
    }
}
// every chunk of a step: weight and x chunk by chunk (ALL), or the weight alone
template <typename T, int MT, int RT, int U, bool TAIL, bool ALL>
__device__ __forceinline__ void v4_load(V4Regs<MT, RT, U>& r, const uint8_t* const (&wrow)[RT][2],
                                        const T* const (&xrow)[MT / 8], int kc, int k_hi) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
        v4_load_w<T, MT, RT, U, TAIL>(r, wrow, u, kc + 64 * u, k_hi);
        if (ALL) v4_load_x<T, MT, RT, U, TAIL>(r, xrow, u, kc + 64 * u, k_hi);
    }
}

// chunk u of a step: x's pairs permuted to the weight's order, the weight converted, the mmas
template <typename T, int MT, int RT, int U>
__device__ __forceinline__ void v4_mma(float (&acc)[RT][MT / 8][4], const V4Regs<MT, RT, U>& r, int u) {
    constexpr int J = MT / 8;
#pragma unroll
    for (int s = 0; s < 4; ++s) {
        unsigned b[J][2];
#pragma unroll
        for (int j = 0; j < J; ++j) {
            // x[k + 4s .. k + 4s + 3] are words 2s, 2s + 1 of the lane's 32 bytes
            const unsigned lo = word_of(r.x[j][u][s >> 1], (2 * s) & 3);
            const unsigned hi = word_of(r.x[j][u][s >> 1], (2 * s + 1) & 3);
            b[j][0] = __byte_perm(lo, hi, 0x5410);  // (x[k + 4s], x[k + 4s + 2])
            b[j][1] = __byte_perm(lo, hi, 0x7632);  // (x[k + 4s + 1], x[k + 4s + 3])
        }
#pragma unroll
        for (int t = 0; t < RT; ++t) {
            const unsigned w0 = word_of(r.w[t][0][u], s), w1 = word_of(r.w[t][1][u], s);
            unsigned a[4];
            a[0] = i8pair_to(w0, (T*)nullptr);       // row g: bytes 0, 2
            a[1] = i8pair_to(w1, (T*)nullptr);       // row g + 8
            a[2] = i8pair_to(w0 >> 8, (T*)nullptr);  // row g: bytes 1, 3
            a[3] = i8pair_to(w1 >> 8, (T*)nullptr);
#pragma unroll
            for (int j = 0; j < J; ++j) mma_16816(acc[t][j], a, b[j], (T*)nullptr);
        }
    }
}

// A whole step: every load, then every chunk's mmas.
template <typename T, int MT, int RT, int U, bool TAIL>
__device__ __forceinline__ void v4_step(float (&acc)[RT][MT / 8][4], const uint8_t* const (&wrow)[RT][2],
                                        const T* const (&xrow)[MT / 8], int kc, int k_hi) {
    V4Regs<MT, RT, U> r;
    v4_load<T, MT, RT, U, TAIL, true>(r, wrow, xrow, kc, k_hi);
#pragma unroll
    for (int u = 0; u < U; ++u) v4_mma<T, MT, RT, U>(acc, r, u);
}

template <typename T, int MT, int RT, int U, bool PIPE>
__device__ void wo_v4(const T* __restrict__ x, const uint8_t* __restrict__ w, const float* __restrict__ scale,
                      const T* __restrict__ bias, T* __restrict__ y, float* __restrict__ part, int M, int N, int K,
                      int KS, int WN, int has_bias) {
    constexpr int J = MT / 8;       // n8 tiles of x rows
    constexpr int STEP = 64 * U;    // K values per warp step
    extern __shared__ float red[];  // [WK][MT][16 RT WN] partial sums
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, c = lane & 3;
    const int WK = (int)(blockDim.x >> 5) / WN;
    const int wn = warp % WN, wk = warp / WN;
    const int rows = 16 * RT * WN;  // weight rows of the block
    const int n_block = blockIdx.x * rows;
    const int n_warp = n_block + wn * 16 * RT;
    const long long m0 = (long long)blockIdx.z * MT;
    const int k_lo = blockIdx.y * KS;
    const int k_hi = min(K, k_lo + KS);

    // weight rows past N read row N - 1 and x rows past M read row M - 1: in bounds, and
    // their sums (other rows / columns of the mma) are never stored
    const uint8_t* wrow[RT][2];
#pragma unroll
    for (int t = 0; t < RT; ++t)
#pragma unroll
        for (int h = 0; h < 2; ++h) wrow[t][h] = w + (long long)min(n_warp + 16 * t + 8 * h + g, N - 1) * K;
    const T* xrow[J];
#pragma unroll
    for (int j = 0; j < J; ++j) xrow[j] = x + min(m0 + 8 * j + g, (long long)M - 1) * K;
    float acc[RT][J][4];
#pragma unroll
    for (int t = 0; t < RT; ++t)
#pragma unroll
        for (int j = 0; j < J; ++j)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[t][j][i] = 0.0f;

    // whole steps without a predicate (so that every load issues before the first
    // use), then at most one step that ends past k_hi
    int k0 = k_lo + wk * STEP;
    const int stride = WK * STEP;
    if (!PIPE) {
        for (; k0 + STEP <= k_hi; k0 += stride) v4_step<T, MT, RT, U, false>(acc, wrow, xrow, k0 + 16 * c, k_hi);
    } else if (k0 + STEP <= k_hi) {
        // PIPE: the next whole step's weight loads issue before this step's x loads,
        // conversions and mmas (two register sets, alternating: the loop is unrolled by
        // two, nothing is copied)
        V4Regs<MT, RT, U> ra, rb;
        v4_load<T, MT, RT, U, false, false>(ra, wrow, xrow, k0 + 16 * c, k_hi);
        for (;;) {
            int k1 = k0 + stride;
            bool more = k1 + STEP <= k_hi;
            if (more) v4_load<T, MT, RT, U, false, false>(rb, wrow, xrow, k1 + 16 * c, k_hi);
#pragma unroll
            for (int u = 0; u < U; ++u) v4_load_x<T, MT, RT, U, false>(ra, xrow, u, k0 + 16 * c + 64 * u, k_hi);
#pragma unroll
            for (int u = 0; u < U; ++u) v4_mma<T, MT, RT, U>(acc, ra, u);
            k0 = k1;
            if (!more) break;
            k1 = k0 + stride;
            more = k1 + STEP <= k_hi;
            if (more) v4_load<T, MT, RT, U, false, false>(ra, wrow, xrow, k1 + 16 * c, k_hi);
#pragma unroll
            for (int u = 0; u < U; ++u) v4_load_x<T, MT, RT, U, false>(rb, xrow, u, k0 + 16 * c + 64 * u, k_hi);
#pragma unroll
            for (int u = 0; u < U; ++u) v4_mma<T, MT, RT, U>(acc, rb, u);
            k0 = k1;
            if (!more) break;
        }
    }
    if (k0 < k_hi) v4_step<T, MT, RT, U, true>(acc, wrow, xrow, k0 + 16 * c, k_hi);

    // C fragment: acc[t][j][i] is weight row 16 t + g + 8 (i >> 1), x row 8 j + 2 c + (i & 1)
#pragma unroll
    for (int t = 0; t < RT; ++t)
#pragma unroll
        for (int j = 0; j < J; ++j)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int r = wn * 16 * RT + 16 * t + g + 8 * (i >> 1);
                const int mm = 8 * j + 2 * c + (i & 1);
                red[(wk * MT + mm) * rows + r] = acc[t][j][i];
            }
    __syncthreads();
    const int mt = (int)min((long long)MT, M - m0);
    for (int e = threadIdx.x; e < mt * rows; e += blockDim.x) {
        const int mm = e / rows, r = e - mm * rows;
        const int n = n_block + r;
        if (n >= N) continue;
        float v = 0.0f;
        for (int q = 0; q < WK; ++q) v += red[(q * MT + mm) * rows + r];
        const long long m = m0 + mm;
        if (gridDim.y == 1) {
            write_out(y, scale, bias, has_bias, m, n, N, v);
        } else {
            part[((long long)blockIdx.y * M + m) * N + n] = v;
        }
    }
}

// y [M, N] = (sum over S slices of part [S, M, N], in slice order) * scale + bias
template <typename T>
__device__ void wo_v4_reduce(const float* __restrict__ part, const float* __restrict__ scale,
                             const T* __restrict__ bias, T* __restrict__ y, int M, int N, int S, int has_bias) {
    const long long mn = (long long)M * N;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < mn; e += (long long)gridDim.x * blockDim.x) {
        float v = 0.0f;
        for (int s = 0; s < S; ++s) v += part[s * mn + e];
        const int n = (int)(e % N);
        write_out(y, scale, bias, has_bias, e / N, n, N, v);
    }
}

// ---------------------------------------------------------------------------- v5
// v4's math with the weight streamed into shared memory by the copy engine (sm_90): a ring
// of S stages, each holding KC bytes of K of the block's R = 16 RT weight rows and KC
// values of its MT x rows, filled by one-dimensional bulk copies (cp.async.bulk, one per
// row) that complete the stage's "full" mbarrier by their byte count. Bytes in flight per
// SM are the ring's (S x stage, up to ~200 KB), not registers' (v4: 8 x 16 B per lane).
//
// Block: warp 0 produces (its 32 lanes issue the copies of a stage after lane 0 announced
// the bytes with arrive.expect_tx), warps 1..CW consume: a stage's KC bytes are KC / 64
// columns of 64 bytes, column q to consumer warp q % CW, each read in v4's fragment layout
// (lane (g, c): rows g and g + 8 of each 16-row tile at 64 q + 16 c, x rows g (+ 8) at
// the same K) with ld.shared.v4, converted and multiplied as v4 does; then each consumer
// warp arrives once on the stage's "empty" barrier (count CW) and the producer refills it.
// Blocks are persistent along N: block bx takes row tiles bx, bx + gridDim.x, ... with the
// ring running on across tiles (the next tile's copies land during a tile's epilogue).
// blockIdx.y is a K slice of KS (a multiple of KC), blockIdx.z a group of MT x rows; as in
// v4 one slice writes y, several write fp32 partials for wo_v4_reduce.
//
// Shared memory (dynamic, 128-byte aligned): 2 S mbarriers (128 B), the consumers' partial
// sums [CW][MT][R] fp32, then S stages of
//   weight: even rows at (r / 2) KC, odd rows at R / 2 KC + 64 + (r / 2) KC: rows g and
//           g + 1 sit 64 bytes apart mod 128, so a quarter warp's 8 x 16 B (rows g, g + 1,
//           c = 0..3) hit 8 different 16-byte bank groups (a plain KC stride: 2-way conflicts);
//   x:      MT rows of 2 KC bytes at a stride of 2 KC + 16 (rows 16 bytes apart mod 128).
// The last stage of a slice may hold kv < KC bytes (K % KC): only kv are copied (the
// expected bytes are the bytes copied) and lanes at or past kv use x = 0 (the stale
// weight bytes there are finite int8, so they add nothing). Weight rows past N and x rows
// past M are not copied: their smem is stale, and so are the sums that use them (other
// rows / columns of the mma, never stored).
// Requires sm_90, K % 16 == 0, 16-byte aligned x and w, KC % 128 == 0, KS % KC == 0.
__host__ __device__ constexpr int v5_w_bytes(int R, int KC) { return (R * KC + 64 + 127) / 128 * 128; }
__host__ __device__ constexpr int v5_stage_bytes(int R, int MT, int KC) {
    return v5_w_bytes(R, KC) + (MT * (2 * KC + 16) + 127) / 128 * 128;
}

__device__ __forceinline__ unsigned smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
// bytes (a multiple of 16, 16-byte aligned ends) from global src to shared dst, completing bar
__device__ __forceinline__ void bulk_g2s(unsigned dst, const void* src, unsigned bytes, unsigned bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
        "l"(src), "r"(bytes), "r"(bar)
        : "memory");
#endif
}
__device__ __forceinline__ int4 lds16(unsigned a) {
    int4 v;
    asm volatile("ld.shared.v4.s32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a));
    return v;
}

template <typename T, int MT, int RT>
__device__ void wo_v5(const T* __restrict__ x, const uint8_t* __restrict__ w, const float* __restrict__ scale,
                      const T* __restrict__ bias, T* __restrict__ y, float* __restrict__ part, int M, int N, int K,
                      int KS, int KC, int S, int has_bias) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    constexpr int J = MT / 8;
    constexpr int R = 16 * RT;
    extern __shared__ __align__(128) unsigned char v5_smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int CW = (int)(blockDim.x >> 5) - 1;  // consumer warps
    const unsigned full0 = smem_addr(v5_smem), empty0 = full0 + 8 * S;
    float* red = reinterpret_cast<float*>(v5_smem + 128);
    const unsigned ring = smem_addr(v5_smem) + 128 + CW * MT * R * 4;
    const int WB = v5_w_bytes(R, KC), SB = v5_stage_bytes(R, MT, KC), XS = 2 * KC + 16;
    const int tiles = (N + R - 1) / R;
    const long long m0 = (long long)blockIdx.z * MT;
    const int mv = (int)min((long long)MT, M - m0);  // x rows of the group
    const int k_lo = blockIdx.y * KS;
    const int k_hi = min(K, k_lo + KS);
    if (threadIdx.x == 0) {
        for (int s = 0; s < S; ++s) {
            mbar_init(full0 + 8 * s, 1);
            mbar_init(empty0 + 8 * s, CW);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (warp == 0) {
        // producer: stage it % S once the consumers released its previous use
        int it = 0;
        for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
            const int n0 = tile * R;
            const int rv = min(R, N - n0);
            for (int k0 = k_lo; k0 < k_hi; k0 += KC, ++it) {
                const int s = it % S;
                if (it >= S) mbar_wait(empty0 + 8 * s, (it / S - 1) & 1);
                const unsigned kv = (unsigned)min(KC, k_hi - k0);
                const unsigned full = full0 + 8 * s;
                if (lane == 0) mbar_expect_tx(full, (unsigned)(rv + 2 * mv) * kv);
                __syncwarp();
                const unsigned st = ring + s * SB;
                for (int r = lane; r < rv; r += 32) {
                    const unsigned dst = st + (r & 1) * (R / 2 * KC + 64) + (r >> 1) * KC;
                    bulk_g2s(dst, w + (long long)(n0 + r) * K + k0, kv, full);
                }
                for (int j = lane; j < mv; j += 32) bulk_g2s(st + WB + j * XS, x + (m0 + j) * K + k0, 2 * kv, full);
            }
        }
        return;
    }

    const int g = lane >> 2, c = lane & 3;
    const int wc = warp - 1;
    int it = 0;
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const int n0 = tile * R;
        float acc[RT][J][4];
#pragma unroll
        for (int t = 0; t < RT; ++t)
#pragma unroll
            for (int j = 0; j < J; ++j)
#pragma unroll
                for (int i = 0; i < 4; ++i) acc[t][j][i] = 0.0f;
        for (int k0 = k_lo; k0 < k_hi; k0 += KC, ++it) {
            const int s = it % S;
            mbar_wait(full0 + 8 * s, (it / S) & 1);
            const int kv = min(KC, k_hi - k0);
            const unsigned st = ring + s * SB;
            // this lane's rows g (h = 0) and g + 8 (h = 1) of tile t: (16 t + g + 8 h) is odd
            // exactly when g is (16 t + 8 h is even)
            const unsigned wl = st + (g & 1) * (R / 2 * KC + 64) + (g >> 1) * KC + 16 * c;
            const unsigned xl = st + WB + g * XS + 32 * c;
            for (int q = wc; 64 * q < kv; q += CW) {
                V4Regs<MT, RT, 1> r;
                const bool in = 64 * q + 16 * c < kv;
#pragma unroll
                for (int t = 0; t < RT; ++t)
#pragma unroll
                    for (int h = 0; h < 2; ++h) r.w[t][h][0] = lds16(wl + (8 * t + 4 * h) * KC + 64 * q);
#pragma unroll
                for (int j = 0; j < J; ++j) {
                    const unsigned xa = xl + 8 * j * XS + 128 * q;
                    r.x[j][0][0] = in ? lds16(xa) : make_int4(0, 0, 0, 0);
                    r.x[j][0][1] = in ? lds16(xa + 16) : make_int4(0, 0, 0, 0);
                }
                v4_mma<T, MT, RT, 1>(acc, r, 0);
            }
            __syncwarp();
            if (lane == 0) mbar_arrive(empty0 + 8 * s);
        }

        // partial sums of the CW consumers meet in shared memory (named barrier 1: the
        // producer warp does not take part), summed in warp order
#pragma unroll
        for (int t = 0; t < RT; ++t)
#pragma unroll
            for (int j = 0; j < J; ++j)
#pragma unroll
                for (int i = 0; i < 4; ++i)
                    red[(wc * MT + 8 * j + 2 * c + (i & 1)) * R + 16 * t + g + 8 * (i >> 1)] = acc[t][j][i];
        asm volatile("bar.sync 1, %0;\n" ::"r"(32 * CW) : "memory");
        for (int e = threadIdx.x - 32; e < mv * R; e += 32 * CW) {
            const int mm = e / R, r = e - mm * R;
            const int n = n0 + r;
            if (n >= N) continue;
            float v = 0.0f;
            for (int q = 0; q < CW; ++q) v += red[(q * MT + mm) * R + r];
            const long long m = m0 + mm;
            if (gridDim.y == 1) {
                write_out(y, scale, bias, has_bias, m, n, N, v);
            } else {
                part[((long long)blockIdx.y * M + m) * N + n] = v;
            }
        }
        asm volatile("bar.sync 1, %0;\n" ::"r"(32 * CW) : "memory");  // red is free again
    }
#else
    __trap();  // sm_90 only (the host refuses other GPUs)
#endif
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

// v4: MT = 8 (M <= 8) or 16 x rows per group; (RT, U) = row tiles per warp and 16-byte
// chunks per row per step, the weight loads in flight per lane being 2 RT U (8 for all three).
// Launch bounds with a minimum of one block per SM: without it ptxas aims at 64 registers
// (full occupancy) and sinks the loads of a step between its mmas (2-6 in flight instead
// of all); with it a step's 12-16 loads issue together (~100-128 registers, 16-20 warps
// per SM). KL_WO_V4_MINB 0 drops the minimum (lab/gpu_quant_sweep.py compares the two).
#ifndef KL_WO_V4_MINB
#define KL_WO_V4_MINB 1
#endif
#if KL_WO_V4_MINB > 0
#define KL_WO_V4_BOUNDS __launch_bounds__(512, KL_WO_V4_MINB)
#else
#define KL_WO_V4_BOUNDS __launch_bounds__(512)
#endif
#define KL_WO_V4(S, T, MT, RT, U)                                                                            \
    extern "C" __global__ void KL_WO_V4_BOUNDS                                                               \
        wo_v4_m##MT##_r##RT##_u##U##_##S(KL_WO_ARGS(T), float* part, int KS, int WN, int has_bias) {         \
        wo_v4<T, MT, RT, U, false>(x, w, scale, bias, y, part, M, N, K, KS, WN, has_bias);                    \
    }
// wo_v4p_*: the same with PIPE (the next step's weight loads in flight during this step's mmas)
#define KL_WO_V4P(S, T, MT, RT, U)                                                                           \
    extern "C" __global__ void KL_WO_V4_BOUNDS                                                               \
        wo_v4p_m##MT##_r##RT##_u##U##_##S(KL_WO_ARGS(T), float* part, int KS, int WN, int has_bias) {        \
        wo_v4<T, MT, RT, U, true>(x, w, scale, bias, y, part, M, N, K, KS, WN, has_bias);                     \
    }
#define KL_WO_V4_ALL(S, T)                                                                                   \
    KL_WO_V4(S, T, 8, 1, 4) KL_WO_V4(S, T, 8, 2, 2) KL_WO_V4(S, T, 8, 4, 1)                                  \
    KL_WO_V4(S, T, 16, 1, 4) KL_WO_V4(S, T, 16, 2, 2) KL_WO_V4(S, T, 16, 4, 1)                               \
    extern "C" __global__ void __launch_bounds__(256)                                                        \
        wo_v4_reduce_##S(const float* part, const float* scale, const T* bias, T* y, int M, int N, int S_,   \
                         int has_bias) {                                                                     \
        wo_v4_reduce<T>(part, scale, bias, y, M, N, S_, has_bias);                                           \
    }
// KL_WO_V4_EXTRA: candidates for lab/gpu_quant_sweep.py, left out of the default build (no
// plan uses them; they would double its compile time), those that fit 128 registers
// without spilling (cuda.py's V4_EXTRA_KERNELS): 16 weight loads per lane and step
// ((RT, U) = (2, 4), (4, 2); ptxas issues 8-13 of them before the first mma, the rest
// between the mmas), and the pipelined kernels (the next step's 8 loads issued before
// this step's 8 are consumed). m16 (4, 2) and pipelined m16 (2, 2), (4, 1) spill.
#define KL_WO_V4_EXTRA_ALL(S, T)                                                                             \
    KL_WO_V4(S, T, 8, 2, 4) KL_WO_V4(S, T, 8, 4, 2) KL_WO_V4(S, T, 16, 2, 4)                                 \
    KL_WO_V4P(S, T, 8, 1, 4) KL_WO_V4P(S, T, 8, 2, 2) KL_WO_V4P(S, T, 8, 4, 1) KL_WO_V4P(S, T, 16, 1, 4)

// KL_WO_V4_ONLY: v4 alone (the sweep's other builds compile in a third of the time)
#ifndef KL_WO_V4_ONLY
KL_WO_V1(f32, float)
KL_WO_KERNELS(f16, __half)
KL_WO_KERNELS(bf16, __nv_bfloat16)
#endif
KL_WO_V4_ALL(f16, __half)
KL_WO_V4_ALL(bf16, __nv_bfloat16)
#ifdef KL_WO_V4_EXTRA
KL_WO_V4_EXTRA_ALL(f16, __half)
KL_WO_V4_EXTRA_ALL(bf16, __nv_bfloat16)
#endif

// KL_WO_V5: v5 (sm_90; lab/gpu_quant_sweep.py's candidates, no backend yet), MT = 8 or
// 16 x rows and RT = 2, 4 or 8 row tiles (32-128 weight rows) per block; 1 producer + up
// to 8 consumer warps (cuda.py's V5_KERNELS, V5Config)
#ifdef KL_WO_V5
#define KL_WO_V5K(S, T, MT, RT)                                                                              \
    extern "C" __global__ void __launch_bounds__(288)                                                        \
        wo_v5_m##MT##_r##RT##_##S(KL_WO_ARGS(T), float* part, int KS, int KC, int S_, int has_bias) {        \
        wo_v5<T, MT, RT>(x, w, scale, bias, y, part, M, N, K, KS, KC, S_, has_bias);                         \
    }
#define KL_WO_V5_ALL(S, T)                                                                                   \
    KL_WO_V5K(S, T, 8, 2) KL_WO_V5K(S, T, 8, 4) KL_WO_V5K(S, T, 8, 8)                                        \
    KL_WO_V5K(S, T, 16, 2) KL_WO_V5K(S, T, 16, 4) KL_WO_V5K(S, T, 16, 8)
KL_WO_V5_ALL(f16, __half)
KL_WO_V5_ALL(bf16, __nv_bfloat16)
#endif
