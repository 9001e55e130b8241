// Skinny matmul y [M, N] = x [M, K] @ B [K, N] for M <= 128 (decode and small batches),
// fp16 / bf16 in and out, fp32 accumulation; compiled by NVRTC, one module per config (the
// SK_* macros below, set by cuda_skinny.py).
//
// Why a kernel of its own (napkin math): at M = 1-16 a linear layer is a weight stream. An
// 8B model's 14336x4096 bf16 weight is 117 MB, 28 us at the H200's ~4.2 TB/s copy rate,
// while x and y are M (K + N) 2 B < 0.6 MB. cuBLAS reads that weight at ~2.9 TB/s. The gemv
// and tile kernels put the weight in the A slot of mma.sync m16n8k16 (16 weight rows = 16
// outputs n, by 16 k) and x in the B slot (8 columns = 8 rows m of x), so every weight
// element is loaded once and one MMA applies it to 8 rows of x. M = 1 wastes 7/8 of each
// MMA, but at M <= 16 the tensor cores have time to spare: one MMA per 512 B of weight.
//
// Operand layouts (read in place with their strides; cuda_skinny.py packs a weight in neither):
//   nt: B = W.t() with W [N, ldw] row-major (nn.Linear's weight): B[k, n] = w[n * ldw + k]
//   nn: B [K, ldw] row-major (a plain contiguous B):              B[k, n] = w[k * ldw + n]
//   x [M, ldx] row-major, unit stride along K; y [M, N] contiguous.
// vec != 0 promises 16-byte aligned x and w, ldx, ldw and K multiples of 8 (and N for nn):
// every 8-element chunk is then whole and aligned (16-byte loads, cp.async). vec == 0 (odd K such as 4095,
// misaligned views) loads the same chunks through sk_ld8_shift: aligned 16-byte loads, shifted.
//
// Kernels:
//   skinny_gemv_m{8,16}_{bf16,f16} (nt, M <= 8 / M <= 16): no shared memory for the weight.
//     Lane (g = lane / 4, q = lane % 4) of a warp loads 16 bytes (k = 8q .. 8q+7 of a
//     32-wide k step) of weight rows g and g + 8 straight into registers: those are the
//     A fragments of two MMAs once the 8 k values are given to them in a permuted order
//     (MMA j takes elements 4j, 4j+1 as its k = 2q, 2q+1 and 4j+2, 4j+3 as k = 2q+8, 2q+9).
//     x's B fragment is read from shared memory with the same permutation (16 bytes of row
//     m = g at the same k): a dot product does not depend on the order of its k terms. A
//     warp streams GR x 16 rows by 32 k per step; GU steps are loaded as one batch while the
//     previous batch is multiplied (2 x GU x GR x 32 B of loads in flight per thread). x is
//     staged once per block: M x kchunk halfs (kchunk <= the config's kc, host-chosen).
//   skinny_tile_{nt,nn}_{bf16,f16} (any M, grid y = ceil(M / BM)): a STAGES-deep cp.async
//     pipeline of BN x BK weight tiles and BM x BK x tiles in shared memory, fragments by
//     ldmatrix (.trans for the nn weight: its k-major rows are the A fragment's columns),
//     WN x WM warps over the BN x BM output tile. For 16 < M <= 128, where each weight
//     element meets up to 128 rows of x and the MMAs start to cost as much as the stream.
//   skinny_rows_m{1,2,4,8}_* (nt, M <= 8) and skinny_cols_m{1,2,4,8,16}_* (nn, M <= 16): whole
//     512-byte runs of one weight row per warp instruction into CUDA-core FMAs (see their
//     sections below).
//
// Split-K: grid z = S slices of kchunk elements of K (host-chosen so that small N still
// fills the GPU). Each block writes its fp32 partial to ws [S, M, N], fences, and counts
// itself in counters[tile] (atomicAdd). The block that counts last sums the S partials in
// slice order 0 .. S-1, converts and writes y, and resets the counter to 0 for the next
// launch. The sum order is fixed, whichever block comes last:
// deterministic. One launch and no second reduction kernel: at 4096x4096, M = 1 the whole
// product is ~10 us and a dependent second launch would add ~2 us.

#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include "common.cuh"  // Vec16, to_f

// ------------------------------------------------------------------ config (per module)
#ifndef SK_GW
#define SK_GW 4  // gemv: warps per block
#endif
#ifndef SK_GR
#define SK_GR 1  // gemv: 16-row groups per warp (block: GW x GR x 16 weight rows)
#endif
#ifndef SK_GU
#define SK_GU 4  // gemv: 32-wide k steps per load batch
#endif
#ifndef SK_BN
#define SK_BN 64  // tile: weight rows (outputs n) per block
#endif
#ifndef SK_BM
#define SK_BM 16  // tile: rows of x per block
#endif
#ifndef SK_BK
#define SK_BK 64  // tile: k per pipeline stage
#endif
#ifndef SK_STAGES
#define SK_STAGES 4
#endif
#ifndef SK_WN
#define SK_WN 4  // tile: warps along n
#endif
#ifndef SK_WM
#define SK_WM 1  // tile: warps along m
#endif
#ifndef SK_RW
#define SK_RW 4  // rows: warps per block, each on its own 256 RJ-wide range of the K slice
#endif
#ifndef SK_RJ
#define SK_RJ 4  // rows: 16-byte chunks per lane per weight row (a warp reads 512 RJ bytes of it)
#endif
#ifndef SK_RN
#define SK_RN 16  // rows: weight rows (outputs n) per block
#endif
#ifndef SK_RU
#define SK_RU 2  // rows: weight rows per load group (two groups in flight)
#endif
// Both: the L2 prefetch-size hint on weight loads (0 none, 128 or 256 bytes). A warp takes
// 64 B of a weight row per gemv step (32 B to 256 B per tile stage): the hint has the L2
// fetch the rest of the row's next bytes in the same DRAM access.
#ifndef SK_PF
#define SK_PF 0
#endif
#if SK_PF == 256
#define SK_PF_HINT ".L2::256B"
#elif SK_PF == 128
#define SK_PF_HINT ".L2::128B"
#else
#define SK_PF_HINT ""
#endif

// ------------------------------------------------------------------ helpers
__device__ __forceinline__ unsigned sk_smem(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// 16-byte cp.async, bypassing L1; src_bytes < 16 zero-fills the rest (0: all zeros).
__device__ __forceinline__ void sk_cp16(unsigned dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
// The same for a weight chunk, with the prefetch hint.
__device__ __forceinline__ void sk_cp16_w(unsigned dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global" SK_PF_HINT " [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes));
}

// A weight chunk that is read exactly once: read-only path, no L1 allocation.
__device__ __forceinline__ uint4 sk_ld_stream(const void* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate" SK_PF_HINT ".v4.u32 {%0,%1,%2,%3}, [%4];\n"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

// Up to 8 halfs from p at any 2-byte alignment (odd K, odd row strides); zeros past
// `valid` (>= 1). It reads the one or two aligned 16-byte chunks that hold them, never a
// chunk without a valid element (so never past the allocation: an aligned chunk that holds
// one of its bytes lies inside it), and shifts the 8 halfs out of the pair of chunks. The
// chunks go through L1 (__ldg): the second chunk of one lane is the first of the next.
__device__ __forceinline__ uint4 sk_ld8_shift(const unsigned short* p, int valid) {
    const unsigned long long addr = reinterpret_cast<unsigned long long>(p);
    const int off = static_cast<int>(addr & 15) >> 1;  // halfs into the first chunk
    const uint4* c = reinterpret_cast<const uint4*>(addr & ~15ull);
    const int need = valid < 8 ? valid : 8;
    const uint4 lo = __ldg(c);
    const uint4 hi = off + need > 8 ? __ldg(c + 1) : make_uint4(0u, 0u, 0u, 0u);
    unsigned w0, w1, w2, w3, w4;  // the five words from word off / 2 on
    switch (off >> 1) {
        case 0: w0 = lo.x; w1 = lo.y; w2 = lo.z; w3 = lo.w; w4 = hi.x; break;
        case 1: w0 = lo.y; w1 = lo.z; w2 = lo.w; w3 = hi.x; w4 = hi.y; break;
        case 2: w0 = lo.z; w1 = lo.w; w2 = hi.x; w3 = hi.y; w4 = hi.z; break;
        default: w0 = lo.w; w1 = hi.x; w2 = hi.y; w3 = hi.z; w4 = hi.w; break;
    }
    const unsigned sh = (off & 1) * 16;  // an odd off: each word straddles two
    uint4 v = make_uint4(__funnelshift_r(w0, w1, sh), __funnelshift_r(w1, w2, sh), __funnelshift_r(w2, w3, sh),
                         __funnelshift_r(w3, w4, sh));
    if (need < 8) {  // the tail of a row or slice: the halfs past it belong to others
        v.x &= need >= 2 ? ~0u : 0xFFFFu;
        v.y &= need >= 4 ? ~0u : need == 3 ? 0xFFFFu : 0u;
        v.z &= need >= 6 ? ~0u : need == 5 ? 0xFFFFu : 0u;
        v.w &= need == 7 ? 0xFFFFu : 0u;
    }
    return v;
}

__device__ __forceinline__ unsigned sk_word(const uint4& v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

template <bool BF16>
__device__ __forceinline__ void sk_mma(float* c, unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                       unsigned b0, unsigned b1) {
    if (BF16) {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    } else {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
}

template <typename T>
__device__ __forceinline__ void sk_store(T* p, float v) { *p = kl::from_f<T>(v); }

// Split K, after each thread of the block stored its share of the block's fp32 partial
// (outputs n0 .. n0 + width - 1 of rows m0 .. m0 + height - 1) to its slice of ws: the
// block that counts last in counters[tile] sums the S slices in slice order 0 .. S-1
// (deterministic, whichever block comes last), writes y and resets the counter for the next
// launch. Consecutive threads take consecutive n: coalesced reads of ws and writes of y.
// Every thread of the block calls it.
template <typename T>
__device__ __forceinline__ void sk_slices_sum(T* __restrict__ y, const float* __restrict__ ws,
                                              int* __restrict__ counters, int tile, int M, int N, int n0,
                                              int width, int m0, int height) {
    __shared__ int sk_last;
    const int S = gridDim.z;
    const long long slice = (long long)M * N;
    __threadfence();  // the partial is visible device-wide before the count says so
    __syncthreads();
    if (threadIdx.x == 0) sk_last = atomicAdd(counters + tile, 1) == S - 1;
    __syncthreads();
    if (!sk_last) return;
    __threadfence();
#pragma unroll 1
    for (int t = threadIdx.x; t < width * height; t += blockDim.x) {
        const int n = n0 + t % width, m = m0 + t / width;
        if (n < N && m < M) {
            const float* p = ws + (long long)m * N + n;
            float v = 0.f;
#pragma unroll 1
            for (int z = 0; z < S; ++z) v += __ldcg(p + z * slice);
            sk_store(y + (long long)m * N + n, v);
        }
    }
    if (threadIdx.x == 0) counters[tile] = 0;
}

// ------------------------------------------------------------------ epilogue (both kernels)
// acc[i][j] is the m16n8 accumulator fragment of weight rows nb + 16 i .. +15 (outputs n)
// by x rows mb + 8 j .. +7: lane (g, q) holds (n = g, m = 2q), (g, 2q+1), (g+8, 2q),
// (g+8, 2q+1). With one K slice it goes straight to y. Otherwise every block stores it to
// its slice of ws, and sk_slices_sum has the last block of the tile (the block's TILE_N x
// TILE_M outputs at n_blk, m_blk) sum the slices. Every thread of the block must call this.
template <typename T, int NI, int MJ, int TILE_N, int TILE_M>
__device__ __forceinline__ void sk_finish(float (&acc)[NI][MJ][4], T* __restrict__ y, float* __restrict__ ws,
                                          int* __restrict__ counters, int M, int N, int nb, int mb, int n_blk,
                                          int m_blk) {
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int S = gridDim.z;
    if (S == 1) {
#pragma unroll
        for (int i = 0; i < NI; ++i)
#pragma unroll
            for (int j = 0; j < MJ; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int n = nb + i * 16 + g + (e >> 1) * 8, m = mb + j * 8 + 2 * q + (e & 1);
                    if (n < N && m < M) sk_store(y + (long long)m * N + n, acc[i][j][e]);
                }
        return;
    }
    const long long slice = (long long)M * N;
    float* mine = ws + blockIdx.z * slice;
#pragma unroll
    for (int i = 0; i < NI; ++i)
#pragma unroll
        for (int j = 0; j < MJ; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int n = nb + i * 16 + g + (e >> 1) * 8, m = mb + j * 8 + 2 * q + (e & 1);
                if (n < N && m < M) mine[(long long)m * N + n] = acc[i][j][e];
            }
    sk_slices_sum(y, ws, counters, blockIdx.x + gridDim.x * blockIdx.y, M, N, n_blk, TILE_N, m_blk, TILE_M);
}

// ------------------------------------------------------------------ gemv (nt, M <= 8 MG)
// grid (ceil(N / (GW GR 16)), 1, S), block 32 GW, dynamic shared memory M (kchunk + 32)
// halfs. kchunk (a multiple of 64) is the K slice per block; the x row pitch kchunk + 32
// puts rows g and g + 1 64 bytes apart mod 128: the 16-byte reads of a quarter warp (two
// rows x 64 B) hit 32 distinct banks.
template <int GU, int GR>
__device__ __forceinline__ void sk_gemv_load(uint4 (&buf)[GU][GR][2], const unsigned short* const (&wp)[GR][2],
                                             const bool (&rok)[GR][2], int s0, int nsteps, int klen, int q,
                                             int vec) {
#pragma unroll
    for (int u = 0; u < GU; ++u) {
        const int step = s0 + u;
        const int kk = step * 32 + q * 8;  // this lane's first k, relative to the slice
#pragma unroll
        for (int r = 0; r < GR; ++r)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                uint4 v = make_uint4(0u, 0u, 0u, 0u);
                if (step < nsteps && rok[r][h] && kk < klen)
                    v = vec ? sk_ld_stream(wp[r][h] + step * 32) : sk_ld8_shift(wp[r][h] + step * 32, klen - kk);
                buf[u][r][h] = v;
            }
    }
}

template <bool BF16, int GU, int GR, int MG>
__device__ __forceinline__ void sk_gemv_mma(float (&acc)[GR][MG][4], const uint4 (&buf)[GU][GR][2],
                                            const unsigned short* xs, int xp, int M, int s0, int nsteps, int g,
                                            int q) {
#pragma unroll
    for (int u = 0; u < GU; ++u) {
        const int step = s0 + u;
        if (step < nsteps) {  // the same for the whole warp
            const int kx = step * 32 + q * 8;
#pragma unroll
            for (int mg = 0; mg < MG; ++mg) {
                const int m = mg * 8 + g;
                const uint4 xv =
                    m < M ? *reinterpret_cast<const uint4*>(xs + m * xp + kx) : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
                for (int r = 0; r < GR; ++r)
#pragma unroll
                    for (int j = 0; j < 2; ++j)
                        sk_mma<BF16>(acc[r][mg], sk_word(buf[u][r][0], 2 * j), sk_word(buf[u][r][1], 2 * j),
                                     sk_word(buf[u][r][0], 2 * j + 1), sk_word(buf[u][r][1], 2 * j + 1),
                                     sk_word(xv, 2 * j), sk_word(xv, 2 * j + 1));
            }
        }
    }
}

template <typename T, bool BF16, int MG>
__device__ __forceinline__ void sk_gemv_body(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y,
                                             float* __restrict__ ws, int* __restrict__ counters, int M, int N,
                                             int K, int ldx, int ldw, int kchunk, int vec) {
    constexpr int GW = SK_GW, GR = SK_GR, GU = SK_GU;
    extern __shared__ __align__(128) unsigned short sk_dyn[];
    unsigned short* xs = sk_dyn;  // [M][kchunk + 32]
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
    const int kbeg = blockIdx.z * kchunk;
    const int klen = min(K - kbeg, kchunk);  // > 0: the host makes no empty slice
    const int nsteps = (klen + 31) / 32;
    const int xp = kchunk + 32;
    const int nw = blockIdx.x * (GW * GR * 16) + warp * (GR * 16);
    const unsigned short* w16 = reinterpret_cast<const unsigned short*>(w);
    const unsigned short* x16 = reinterpret_cast<const unsigned short*>(x);

    const unsigned short* wp[GR][2];
    bool rok[GR][2];
#pragma unroll
    for (int r = 0; r < GR; ++r)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int n = nw + r * 16 + g + h * 8;
            rok[r][h] = n < N;
            wp[r][h] = w16 + (long long)(n < N ? n : 0) * ldw + kbeg + q * 8;
        }
    uint4 wa[GU][GR][2], wb[GU][GR][2];
    float acc[GR][MG][4] = {};

    // The first batch of weights is in flight while x is staged.
    sk_gemv_load<GU, GR>(wa, wp, rok, 0, nsteps, klen, q, vec);
    const int chunks = kchunk / 8;
    for (int c = threadIdx.x; c < M * chunks; c += 32 * GW) {
        const int m = c / chunks, kk = (c % chunks) * 8;
        const unsigned short* src = x16 + (long long)m * ldx + kbeg + kk;
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (kk < klen) v = vec ? __ldg(reinterpret_cast<const uint4*>(src)) : sk_ld8_shift(src, klen - kk);
        *reinterpret_cast<uint4*>(xs + m * xp + kk) = v;
    }
    __syncthreads();

    for (int s = 0; s < nsteps; s += 2 * GU) {
        sk_gemv_load<GU, GR>(wb, wp, rok, s + GU, nsteps, klen, q, vec);
        sk_gemv_mma<BF16, GU, GR, MG>(acc, wa, xs, xp, M, s, nsteps, g, q);
        sk_gemv_load<GU, GR>(wa, wp, rok, s + 2 * GU, nsteps, klen, q, vec);
        sk_gemv_mma<BF16, GU, GR, MG>(acc, wb, xs, xp, M, s + GU, nsteps, g, q);
    }
    sk_finish<T, GR, MG, GW * GR * 16, MG * 8>(acc, y, ws, counters, M, N, nw, 0,
                                                       blockIdx.x * (GW * GR * 16), 0);
}

// ------------------------------------------------------------------ tile (nt / nn, any M)
// grid (ceil(N / BN), ceil(M / BM), S), block 32 WN WM, dynamic shared memory
// STAGES (W_STAGE + X_STAGE) halfs (cuda_skinny.py computes the same). Padded rows (+8
// halfs: 16 bytes) make every ldmatrix phase conflict-free.
template <typename T, bool NN>
__device__ __forceinline__ void sk_tile_load(const T* __restrict__ x, const T* __restrict__ w, unsigned short* ws_,
                                             unsigned short* xs_, int M, int N, int ldx, int ldw, int n0, int m0,
                                             int k0, int kl, int vec) {
    constexpr int BN = SK_BN, BM = SK_BM, BK = SK_BK, THREADS = 32 * SK_WN * SK_WM;
    constexpr int WP = NN ? BN + 8 : BK + 8, XP = BK + 8;
    const unsigned short* w16 = reinterpret_cast<const unsigned short*>(w);
    const unsigned short* x16 = reinterpret_cast<const unsigned short*>(x);
    const int t = threadIdx.x;
    if (vec) {
        if (NN) {  // BK k-rows x BN/8 chunks of n
#pragma unroll 4
            for (int c = t; c < BK * (BN / 8); c += THREADS) {
                const int r = c / (BN / 8), cc = (c % (BN / 8)) * 8;
                const bool in = r < kl && n0 + cc < N;
                const unsigned short* src = in ? w16 + (long long)(k0 + r) * ldw + n0 + cc : w16;
                sk_cp16_w(sk_smem(ws_ + r * WP + cc), src, in ? 16 : 0);
            }
        } else {  // BN n-rows x BK/8 chunks of k
#pragma unroll 4
            for (int c = t; c < BN * (BK / 8); c += THREADS) {
                const int r = c / (BK / 8), cc = (c % (BK / 8)) * 8;
                const bool in = n0 + r < N && cc < kl;
                const unsigned short* src = in ? w16 + (long long)(n0 + r) * ldw + k0 + cc : w16;
                sk_cp16_w(sk_smem(ws_ + r * WP + cc), src, in ? 16 : 0);
            }
        }
#pragma unroll 4
        for (int c = t; c < BM * (BK / 8); c += THREADS) {
            const int r = c / (BK / 8), cc = (c % (BK / 8)) * 8;
            const bool in = m0 + r < M && cc < kl;
            const unsigned short* src = in ? x16 + (long long)(m0 + r) * ldx + k0 + cc : x16;
            sk_cp16(sk_smem(xs_ + r * XP + cc), src, in ? 16 : 0);
        }
    } else {  // unaligned: 8-half chunks by sk_ld8_shift, stored before the barrier that precedes their use
        const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
        if (NN) {
#pragma unroll 2
            for (int c = t; c < BK * (BN / 8); c += THREADS) {
                const int r = c / (BN / 8), cc = (c % (BN / 8)) * 8;
                const bool in = r < kl && n0 + cc < N;
                *reinterpret_cast<uint4*>(ws_ + r * WP + cc) =
                    in ? sk_ld8_shift(w16 + (long long)(k0 + r) * ldw + n0 + cc, N - n0 - cc) : zero;
            }
        } else {
#pragma unroll 2
            for (int c = t; c < BN * (BK / 8); c += THREADS) {
                const int r = c / (BK / 8), cc = (c % (BK / 8)) * 8;
                const bool in = n0 + r < N && cc < kl;
                *reinterpret_cast<uint4*>(ws_ + r * WP + cc) =
                    in ? sk_ld8_shift(w16 + (long long)(n0 + r) * ldw + k0 + cc, kl - cc) : zero;
            }
        }
#pragma unroll 2
        for (int c = t; c < BM * (BK / 8); c += THREADS) {
            const int r = c / (BK / 8), cc = (c % (BK / 8)) * 8;
            const bool in = m0 + r < M && cc < kl;
            *reinterpret_cast<uint4*>(xs_ + r * XP + cc) =
                in ? sk_ld8_shift(x16 + (long long)(m0 + r) * ldx + k0 + cc, kl - cc) : zero;
        }
    }
}

template <typename T, bool BF16, bool NN>
__device__ __forceinline__ void sk_tile_body(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y,
                                             float* __restrict__ ws, int* __restrict__ counters, int M, int N,
                                             int K, int ldx, int ldw, int kchunk, int vec) {
    constexpr int BN = SK_BN, BM = SK_BM, BK = SK_BK, ST = SK_STAGES, WN = SK_WN;
    constexpr int TN = BN / SK_WN, TM = BM / SK_WM;  // warp tile
    constexpr int NI = TN / 16, MJ = TM / 8;
    static_assert(TN % 16 == 0 && TM % 8 == 0 && BK % 16 == 0, "warp tile: 16k x 8j, BK: 16k");
    constexpr int WP = NN ? BN + 8 : BK + 8, XP = BK + 8;
    constexpr int W_STAGE = (NN ? BK : BN) * WP, X_STAGE = BM * XP;
    extern __shared__ __align__(128) unsigned short sk_dyn[];
    unsigned short* Ws = sk_dyn;                 // [ST][W_STAGE]
    unsigned short* Xs = sk_dyn + ST * W_STAGE;  // [ST][X_STAGE]
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int wn = (warp % WN) * TN, wm = (warp / WN) * TM;
    const int n0 = blockIdx.x * BN, m0 = blockIdx.y * BM;
    const int kbeg = blockIdx.z * kchunk;
    const int klen = min(K - kbeg, kchunk);  // > 0
    const int ktiles = (klen + BK - 1) / BK;
    float acc[NI][MJ][4] = {};

#pragma unroll
    for (int s = 0; s < ST - 1; ++s) {  // one commit per slot, even empty: see v9 in matmul.cu
        if (s < ktiles)
            sk_tile_load<T, NN>(x, w, Ws + s * W_STAGE, Xs + s * X_STAGE, M, N, ldx, ldw, n0, m0, kbeg + s * BK,
                                klen - s * BK, vec);
        asm volatile("cp.async.commit_group;\n" ::);
    }
    for (int kt = 0; kt < ktiles; ++kt) {
        asm volatile("cp.async.wait_group %0;\n" ::"n"(ST - 2));
        __syncthreads();  // tile kt landed for everyone; tile kt-1's stage is free
        const int pf = kt + ST - 1;
        if (pf < ktiles) {
            const int s = pf % ST;
            sk_tile_load<T, NN>(x, w, Ws + s * W_STAGE, Xs + s * X_STAGE, M, N, ldx, ldw, n0, m0, kbeg + pf * BK,
                                klen - pf * BK, vec);
        }
        asm volatile("cp.async.commit_group;\n" ::);
        const unsigned short* wt = Ws + (kt % ST) * W_STAGE;
        const unsigned short* xt = Xs + (kt % ST) * X_STAGE;
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            unsigned af[NI][4], bf[MJ][2];
#pragma unroll
            for (int i = 0; i < NI; ++i) {
                if (NN) {
                    // matrices (k 0-7, n 0-7), (k 0-7, n 8-15), (k 8-15, n 0-7), (k 8-15, n 8-15),
                    // transposed: the A fragment's (n, k) quarters in order
                    const unsigned short* p =
                        wt + (kk + (lane % 8) + (lane / 16) * 8) * WP + wn + i * 16 + ((lane / 8) % 2) * 8;
                    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                                 : "=r"(af[i][0]), "=r"(af[i][1]), "=r"(af[i][2]), "=r"(af[i][3])
                                 : "r"(sk_smem(p)));
                } else {
                    // lanes 0-15: rows n 0-15 at k, lanes 16-31: the same rows at k + 8
                    const unsigned short* p = wt + (wn + i * 16 + (lane % 16)) * WP + kk + (lane / 16) * 8;
                    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                                 : "=r"(af[i][0]), "=r"(af[i][1]), "=r"(af[i][2]), "=r"(af[i][3])
                                 : "r"(sk_smem(p)));
                }
            }
#pragma unroll
            for (int j = 0; j < MJ; j += 2) {
                // matrices (m 0-7, k 0-7), (m 0-7, k 8-15), (m 8-15, k 0-7), (m 8-15, k 8-15): x's
                // rows are the B fragment's columns
                const unsigned short* p = xt + (wm + j * 8 + (lane % 8) + (lane / 16) * 8) * XP + kk + ((lane / 8) % 2) * 8;
                if (j + 1 < MJ) {
                    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                                 : "=r"(bf[j][0]), "=r"(bf[j][1]), "=r"(bf[j + 1][0]), "=r"(bf[j + 1][1])
                                 : "r"(sk_smem(p)));
                } else {  // an odd last column group: lanes 0-15's addresses, two matrices
                    const unsigned short* p2 = xt + (wm + j * 8 + (lane % 8)) * XP + kk + ((lane / 8) % 2) * 8;
                    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
                                 : "=r"(bf[j][0]), "=r"(bf[j][1])
                                 : "r"(sk_smem(p2)));
                }
            }
#pragma unroll
            for (int i = 0; i < NI; ++i)
#pragma unroll
                for (int j = 0; j < MJ; ++j)
                    sk_mma<BF16>(acc[i][j], af[i][0], af[i][1], af[i][2], af[i][3], bf[j][0], bf[j][1]);
        }
    }
    asm volatile("cp.async.wait_group 0;\n" ::);  // no copy outlives the block
    sk_finish<T, NI, MJ, BN, BM>(acc, y, ws, counters, M, N, n0 + wn, m0 + wm, n0, m0);
}

// ------------------------------------------------------------------ rows (nt, M <= MR)
// grid (ceil(N / RN), 1, S), block 32 RW, no dynamic shared memory. The gemv kernel's
// loads each cover 8 weight rows x 64 bytes (the MMA fragment's layout); here a warp
// instruction reads 512 contiguous bytes of one row, and a warp streams RN rows one after
// another: longer runs per row for the DRAM. Warp wp of the block owns k in
// [wp KW, wp KW + KW) of the slice (KW = 256 RJ), lane l the 8-half chunks at
// l 8 + 256 j: x's values there stay in registers (fp32, MR x RJ x 8) for all RN rows.
// Per row the lane multiplies on the CUDA cores (fp32 FMA: at M <= 8 the SM has the issue
// slots to spare against one SM's share of the weight stream), a butterfly sums the 32
// lanes, and part[] holds each warp's sum; the block adds its warps in order. Split K
// through sk_slices_sum, as the gemv and tile kernels.

// 8 halfs of storage type T (one 16-byte load) as fp32.
template <typename T>
__device__ __forceinline__ void sk_unpack8(const uint4& v, float (&f)[8]) {
    kl::Vec16<T> pack;
    pack.raw = make_int4(static_cast<int>(v.x), static_cast<int>(v.y), static_cast<int>(v.z), static_cast<int>(v.w));
#pragma unroll
    for (int i = 0; i < 8; ++i) f[i] = kl::to_f(pack.e[i]);
}

template <int RU, int RJ>
__device__ __forceinline__ void sk_rows_load(uint4 (&buf)[RU][RJ], const unsigned short* w16, int ldw, int N,
                                             int nr, int kb, int kw, int klen, int lane, int vec) {
#pragma unroll
    for (int u = 0; u < RU; ++u)
#pragma unroll
        for (int j = 0; j < RJ; ++j) {
            const int kk = kw + j * 256 + lane * 8;  // relative to the slice
            const int n = nr + u;
            uint4 v = make_uint4(0u, 0u, 0u, 0u);
            if (n < N && kk < klen) {
                const unsigned short* p = w16 + (long long)n * ldw + kb + kk;
                v = vec ? sk_ld_stream(p) : sk_ld8_shift(p, klen - kk);
            }
            buf[u][j] = v;
        }
}

// The lane sums of V = RU x MR values (each lane holds a partial of every one) in
// P - 1 + 5 - log2(P) shuffles, P = V rounded up to a power of two <= 32 (the values past
// V are zeros), instead of 5 V:
// each of the first log2(P) butterfly steps hands half of the values still held to the
// partner and keeps the other half (lane bit o set: the upper half), so the value count
// halves per step; the last steps add the one value left. Lane l then holds the sum of
// value l >> (5 - log2 P), written by the lanes whose low bits are zero.
template <int V>
struct SkPow2 {
    static constexpr int P = V <= 1 ? 1 : 2 * SkPow2<(V + 1) / 2>::P;
};
template <>
struct SkPow2<1> {
    static constexpr int P = 1;
};

// One step of the lane sums: H of the 2H values held go across lane bit O (a lane with
// the bit set keeps the upper half), then the next step with H / 2 values.
template <int H, int O>
struct SkHalve {
    static __device__ __forceinline__ void run(float* v, int lane) {
        const bool up = lane & O;
#pragma unroll
        for (int i = 0; i < H; ++i) {
            const float give = up ? v[i] : v[i + H];
            const float keep = up ? v[i + H] : v[i];
            v[i] = keep + __shfl_xor_sync(0xffffffffu, give, O);
        }
        SkHalve<H / 2, O / 2>::run(v, lane);
    }
};
template <int O>
struct SkHalve<0, O> {
    static __device__ __forceinline__ void run(float*, int) {}
};

template <typename T, int MR, int RU, int RJ, int RW, int RN>
__device__ __forceinline__ void sk_rows_dot(const uint4 (&buf)[RU][RJ], const float (&xf)[MR][RJ][8],
                                            float (*part)[RN][MR], int r0, int wp, int lane) {
    constexpr int V = RU * MR, P = SkPow2<V>::P;
    static_assert(P <= 32, "at most 32 sums per load group");
    float v[P];
#pragma unroll
    for (int i = 0; i < P; ++i) v[i] = 0.f;
#pragma unroll
    for (int u = 0; u < RU; ++u)
#pragma unroll
        for (int j = 0; j < RJ; ++j) {
            float wf[8];
            sk_unpack8<T>(buf[u][j], wf);
#pragma unroll
            for (int m = 0; m < MR; ++m)
#pragma unroll
                for (int e = 0; e < 8; ++e) v[u * MR + m] = fmaf(wf[e], xf[m][j][e], v[u * MR + m]);
        }
    constexpr int L = P == 1 ? 0 : P == 2 ? 1 : P == 4 ? 2 : P == 8 ? 3 : P == 16 ? 4 : 5;  // log2 P
    SkHalve<P / 2, 16>::run(v, lane);
#pragma unroll
    for (int st = L; st < 5; ++st) v[0] += __shfl_xor_sync(0xffffffffu, v[0], 16 >> st);
    constexpr int SHIFT = 5 - L;
    const int idx = lane >> SHIFT;
    if ((lane & ((1 << SHIFT) - 1)) == 0 && idx < V) part[wp][r0 + idx / MR][idx % MR] = v[0];
}

template <typename T, int MR>
__device__ __forceinline__ void sk_rows_body(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y,
                                             float* __restrict__ ws, int* __restrict__ counters, int M, int N,
                                             int K, int ldx, int ldw, int kchunk, int vec) {
    constexpr int RW = SK_RW, RJ = SK_RJ, RN = SK_RN, RU = SK_RU, KW = 256 * RJ;
    static_assert(RN % (2 * RU) == 0, "RN is a multiple of two load groups");
    __shared__ float part[RW][RN][MR];
    const int lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
    const int kb = blockIdx.z * kchunk;
    const int klen = min(K - kb, kchunk);  // > 0: the host makes no empty slice
    const int kw = wp * KW;                // this warp's range of the slice
    const int n0 = blockIdx.x * RN;
    const unsigned short* w16 = reinterpret_cast<const unsigned short*>(w);
    const unsigned short* x16 = reinterpret_cast<const unsigned short*>(x);

    uint4 wa[RU][RJ], wb[RU][RJ];
    sk_rows_load<RU, RJ>(wa, w16, ldw, N, n0, kb, kw, klen, lane, vec);  // in flight while x loads
    float xf[MR][RJ][8];
#pragma unroll
    for (int m = 0; m < MR; ++m)
#pragma unroll
        for (int j = 0; j < RJ; ++j) {
            const int kk = kw + j * 256 + lane * 8;
            uint4 v = make_uint4(0u, 0u, 0u, 0u);
            if (m < M && kk < klen) {
                const unsigned short* p = x16 + (long long)m * ldx + kb + kk;
                v = vec ? __ldg(reinterpret_cast<const uint4*>(p)) : sk_ld8_shift(p, klen - kk);
            }
            sk_unpack8<T>(v, xf[m][j]);
        }
#pragma unroll 1
    for (int r0 = 0; r0 < RN; r0 += 2 * RU) {
        sk_rows_load<RU, RJ>(wb, w16, ldw, N, n0 + r0 + RU, kb, kw, klen, lane, vec);
        sk_rows_dot<T, MR, RU, RJ, RW, RN>(wa, xf, part, r0, wp, lane);
        if (r0 + 2 * RU < RN) sk_rows_load<RU, RJ>(wa, w16, ldw, N, n0 + r0 + 2 * RU, kb, kw, klen, lane, vec);
        sk_rows_dot<T, MR, RU, RJ, RW, RN>(wb, xf, part, r0 + RU, wp, lane);
    }
    __syncthreads();

    const int S = gridDim.z;
    const long long slice = (long long)M * N;
#pragma unroll 1
    for (int t = threadIdx.x; t < RN * M; t += 32 * RW) {
        const int m = t / RN, r = t % RN, n = n0 + r;  // consecutive threads: consecutive n
        if (n < N) {
            float v = 0.f;
#pragma unroll
            for (int q = 0; q < RW; ++q) v += part[q][r][m];  // warp order: deterministic
            if (S == 1)
                sk_store(y + (long long)m * N + n, v);
            else
                ws[blockIdx.z * slice + (long long)m * N + n] = v;
        }
    }
    if (S > 1) sk_slices_sum(y, ws, counters, blockIdx.x, M, N, n0, RN, 0, M);
}

// ------------------------------------------------------------------ cols (nn, M <= MR <= 16)
// grid (ceil(N / (256 CJ)), 1, S), block 32 CW, dynamic shared memory
// max(kchunk, CW 256 CJ) x MR floats (cuda_skinny.py computes the same). In the nn layout
// a weight row is one k and its elements are the outputs n: a warp instruction reads 512
// contiguous bytes of one row, lane l taking outputs n0 + 256 j + 8 l .. +7 (j < CJ), so
// each lane keeps its own outputs' sums in registers (MR x CJ x 8 fp32) and no sum crosses
// lanes. The CW warps of a block split the slice's rows (warp w: rows w, w + CW, ...; CU
// rows per load group, two groups in flight). x's values at the slice's rows are staged
// once per block as fp32 [k][MR] (every lane of a warp reads the same row: a broadcast).
// After the loop the warps' sums meet in the same shared memory and are added in warp
// order (deterministic). Split K through sk_slices_sum, as the other kernels.
// Odd row strides (vec == 0: a row's runs are not 16-byte aligned): every run of a row is
// misaligned by the same `off` halfs, so a warp's 32 aligned 16-byte chunks (512 bytes from
// the run's start rounded down) hold 248 + 8 - off >= 248 of the run's outputs. A run is
// then 248 outputs (31 lanes; a block owns 248 CJ): lane l loads chunk l as it lies (in
// flight like the aligned loads), and at use takes chunk l + 1 from the next lane (a
// shuffle) and shifts its 8 outputs out of the pair; lane 31 only lends its chunk.
#ifndef SK_CW
#define SK_CW 8  // cols: warps per block, splitting the slice's k rows
#endif
#ifndef SK_CJ
#define SK_CJ 1  // cols: 16-byte chunks per lane per row (a block's outputs: 256 CJ)
#endif
#ifndef SK_CU
#define SK_CU 4  // cols: rows per load group (two groups in flight)
#endif
#ifndef SK_CB
#define SK_CB 1  // cols: blocks per SM the registers must allow (__launch_bounds__)
#endif

// Odd row strides: lane l's 8 outputs, `off` halfs into its chunk `lo` and the next lane's
// (shuffled in). `off` is the same for the whole warp, so each case is a branch the warp
// takes together: only the words it needs cross lanes, no selects. Halfs past the row's end
// belong to no output that is stored (their sums are never written).
__device__ __forceinline__ uint4 sk_cols_shift(const uint4& lo, int off) {
    const auto nx = [](unsigned v) { return __shfl_down_sync(~0u, v, 1); };
    const auto f = [](unsigned a, unsigned b) { return __funnelshift_r(a, b, 16); };  // halfs 1, 2 of (a, b)
    switch (off) {
        case 0:
            return lo;
        case 1: {
            const unsigned h0 = nx(lo.x);
            return make_uint4(f(lo.x, lo.y), f(lo.y, lo.z), f(lo.z, lo.w), f(lo.w, h0));
        }
        case 2:
            return make_uint4(lo.y, lo.z, lo.w, nx(lo.x));
        case 3: {
            const unsigned h0 = nx(lo.x), h1 = nx(lo.y);
            return make_uint4(f(lo.y, lo.z), f(lo.z, lo.w), f(lo.w, h0), f(h0, h1));
        }
        case 4:
            return make_uint4(lo.z, lo.w, nx(lo.x), nx(lo.y));
        case 5: {
            const unsigned h0 = nx(lo.x), h1 = nx(lo.y), h2 = nx(lo.z);
            return make_uint4(f(lo.z, lo.w), f(lo.w, h0), f(h0, h1), f(h1, h2));
        }
        case 6:
            return make_uint4(lo.w, nx(lo.x), nx(lo.y), nx(lo.z));
        default: {
            const unsigned h0 = nx(lo.x), h1 = nx(lo.y), h2 = nx(lo.z), h3 = nx(lo.w);
            return make_uint4(f(lo.w, h0), f(h0, h1), f(h1, h2), f(h2, h3));
        }
    }
}

// A run's first output: 256 (aligned) or 248 (odd row strides) outputs a run.
template <bool VEC>
__device__ __forceinline__ int sk_cols_run(int n0, int j) {
    return n0 + j * (VEC ? 256 : 248);
}

template <int CU, int CJ, bool VEC>
__device__ __forceinline__ void sk_cols_load(uint4 (&buf)[CU][CJ], const unsigned short* w16, int ldw, int N,
                                             int kb, int r0, int klen, int n0, int lane) {
#pragma unroll
    for (int u = 0; u < CU; ++u)
#pragma unroll
        for (int j = 0; j < CJ; ++j) {
            const int r = r0 + u * SK_CW;  // this warp's rows are CW apart
            const unsigned short* run = w16 + (long long)(kb + r) * ldw + sk_cols_run<VEC>(n0, j);
            uint4 v = make_uint4(0u, 0u, 0u, 0u);
            if constexpr (VEC) {
                if (r < klen && sk_cols_run<VEC>(n0, j) + lane * 8 < N) v = sk_ld_stream(run + lane * 8);
            } else {  // chunk `lane` from the run's start rounded down, where it holds an output < N
                const unsigned long long at = reinterpret_cast<unsigned long long>(run);
                const int off = static_cast<int>(at & 15) >> 1;
                if (r < klen && sk_cols_run<VEC>(n0, j) - off + lane * 8 < N)
                    v = sk_ld_stream(reinterpret_cast<const uint4*>(at & ~15ull) + lane);
            }
            buf[u][j] = v;
        }
}

template <typename T, int MR, int CU, int CJ, bool VEC>
__device__ __forceinline__ void sk_cols_dot(const uint4 (&buf)[CU][CJ], const float* xs, float (&acc)[MR][CJ][8],
                                            int r0, int klen, int woff, int ldw, int kb, int n0) {
#pragma unroll
    for (int u = 0; u < CU; ++u) {
        const int r = r0 + u * SK_CW;
        if (r < klen) {  // the same for the whole warp
            float xv[MR];
            if constexpr (MR % 4 == 0) {
#pragma unroll
                for (int m = 0; m < MR; m += 4) {
                    const float4 f = *reinterpret_cast<const float4*>(xs + r * MR + m);
                    xv[m] = f.x;
                    xv[m + 1] = f.y;
                    xv[m + 2] = f.z;
                    xv[m + 3] = f.w;
                }
            } else {
#pragma unroll
                for (int m = 0; m < MR; ++m) xv[m] = xs[r * MR + m];
            }
#pragma unroll
            for (int j = 0; j < CJ; ++j) {
                uint4 wv = buf[u][j];
                if constexpr (!VEC) {  // this lane's 8 outputs from its chunk and the next lane's
                    const int first = sk_cols_run<VEC>(n0, j);
                    // the run's start in halfs past a 16-byte boundary (mod 8: 32-bit products do)
                    wv = sk_cols_shift(wv, (woff + (kb + r) * ldw + first) & 7);
                }
                float wf[8];
                sk_unpack8<T>(wv, wf);
#pragma unroll
                for (int m = 0; m < MR; ++m)
#pragma unroll
                    for (int e = 0; e < 8; ++e) acc[m][j][e] = fmaf(wf[e], xv[m], acc[m][j][e]);
            }
        }
    }
}

// The block's K slice: x's stage, then every row of the warp's share into acc (this lane's
// outputs). VEC: aligned 16-byte loads; else the shifted loads of odd rows.
template <typename T, int MR, bool VEC>
__device__ __forceinline__ void sk_cols_stream(float (&acc)[MR][SK_CJ][8], const T* __restrict__ x,
                                               const unsigned short* __restrict__ w16, float* xs, int M, int N,
                                               int ldx, int ldw, int kb, int klen, int n0, int lane, int wp) {
    constexpr int CW = SK_CW, CJ = SK_CJ, CU = SK_CU, STEP = CW * CU;
    const int woff = static_cast<int>(reinterpret_cast<unsigned long long>(w16) >> 1) & 7;  // (odd strides)
    uint4 wa[CU][CJ], wb[CU][CJ];
    sk_cols_load<CU, CJ, VEC>(wa, w16, ldw, N, kb, wp, klen, n0, lane);  // in flight while x is staged
#pragma unroll 1
    for (int t = threadIdx.x; t < klen * MR; t += 32 * CW) {
        const int m = t / klen, r = t % klen;  // consecutive threads: consecutive k of one row of x
        xs[r * MR + m] = m < M ? kl::to_f(x[(long long)m * ldx + kb + r]) : 0.f;
    }
    __syncthreads();

#pragma unroll
    for (int m = 0; m < MR; ++m)
#pragma unroll
        for (int j = 0; j < CJ; ++j)
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[m][j][e] = 0.f;
    const int groups = (klen + STEP - 1) / STEP;  // load groups per warp, the same for every warp
#pragma unroll 1
    for (int g = 0; g < groups; g += 2) {
        const int ra = wp + g * STEP;
        sk_cols_load<CU, CJ, VEC>(wb, w16, ldw, N, kb, ra + STEP, klen, n0, lane);
        sk_cols_dot<T, MR, CU, CJ, VEC>(wa, xs, acc, ra, klen, woff, ldw, kb, n0);
        if (g + 2 < groups) sk_cols_load<CU, CJ, VEC>(wa, w16, ldw, N, kb, ra + 2 * STEP, klen, n0, lane);
        sk_cols_dot<T, MR, CU, CJ, VEC>(wb, xs, acc, ra + STEP, klen, woff, ldw, kb, n0);
    }
}

template <typename T, int MR>
__device__ __forceinline__ void sk_cols_body(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y,
                                             float* __restrict__ ws, int* __restrict__ counters, int M, int N,
                                             int K, int ldx, int ldw, int kchunk, int vec) {
    constexpr int CW = SK_CW, CJ = SK_CJ, CN = 256 * CJ;
    extern __shared__ __align__(128) unsigned short sk_dyn[];
    float* xs = reinterpret_cast<float*>(sk_dyn);  // [kchunk][MR]; after the loop the sums [CW][MR][CN]
    const int lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
    const int kb = blockIdx.z * kchunk;
    const int klen = min(K - kb, kchunk);  // > 0: the host makes no empty slice
    const int run = vec ? 256 : 248;     // outputs a run (see the odd row strides above)
    const int n0 = blockIdx.x * run * CJ;
    const unsigned short* w16 = reinterpret_cast<const unsigned short*>(w);

    float acc[MR][CJ][8];
    if (vec)  // one loop per load kind: a runtime branch per load slows the aligned stream
        sk_cols_stream<T, MR, true>(acc, x, w16, xs, M, N, ldx, ldw, kb, klen, n0, lane, wp);
    else
        sk_cols_stream<T, MR, false>(acc, x, w16, xs, M, N, ldx, ldw, kb, klen, n0, lane, wp);
    __syncthreads();  // every warp is done with x's stage: its space takes the sums

    float* part = xs;
#pragma unroll
    for (int m = 0; m < MR; ++m)
#pragma unroll
        for (int j = 0; j < CJ; ++j) {
            float* p = part + (wp * MR + m) * CN + j * 256 + lane * 8;
            *reinterpret_cast<float4*>(p) = make_float4(acc[m][j][0], acc[m][j][1], acc[m][j][2], acc[m][j][3]);
            *reinterpret_cast<float4*>(p + 4) = make_float4(acc[m][j][4], acc[m][j][5], acc[m][j][6], acc[m][j][7]);
        }
    __syncthreads();
    const int S = gridDim.z;
    const long long slice = (long long)M * N;
#pragma unroll 1
    for (int t = threadIdx.x; t < M * CN; t += 32 * CW) {
        const int m = t / CN, c = t % CN, n = n0 + (c / 256) * run + c % 256;  // consecutive threads: consecutive n
        if (c % 256 < run && n < N) {
            float v = 0.f;
#pragma unroll
            for (int q = 0; q < CW; ++q) v += part[(q * MR + m) * CN + c];  // warp order: deterministic
            if (S == 1)
                sk_store(y + (long long)m * N + n, v);
            else
                ws[blockIdx.z * slice + (long long)m * N + n] = v;
        }
    }
    if (S > 1) sk_slices_sum(y, ws, counters, blockIdx.x, M, N, n0, run * CJ, 0, M);
}

// ------------------------------------------------------------------ entry points
#define SK_ARGS(T)                                                                                     \
    const T *__restrict__ x, const T *__restrict__ w, T *__restrict__ y, float *__restrict__ ws,     \
        int *__restrict__ counters, int M, int N, int K, int ldx, int ldw, int kchunk, int vec
#define SK_PASS x, w, y, ws, counters, M, N, K, ldx, ldw, kchunk, vec

// Without SK_ONE every entry point is compiled (the default module: `kernellab asm`, the
// CPU compile check); the launcher builds one module per (config, kernel) with SK_ONE and
// SK_WANT_<name>, so that a config costs one kernel's compile (~0.3-1 s), not eight.
#if !defined(SK_ONE) || defined(SK_WANT_skinny_gemv_m8_bf16)
extern "C" __global__ void __launch_bounds__(32 * SK_GW) skinny_gemv_m8_bf16(SK_ARGS(__nv_bfloat16)) {
    sk_gemv_body<__nv_bfloat16, true, 1>(SK_PASS);
}
#endif
#if !defined(SK_ONE) || defined(SK_WANT_skinny_gemv_m16_bf16)
extern "C" __global__ void __launch_bounds__(32 * SK_GW) skinny_gemv_m16_bf16(SK_ARGS(__nv_bfloat16)) {
    sk_gemv_body<__nv_bfloat16, true, 2>(SK_PASS);
}
#endif
#if !defined(SK_ONE) || defined(SK_WANT_skinny_gemv_m8_f16)
extern "C" __global__ void __launch_bounds__(32 * SK_GW) skinny_gemv_m8_f16(SK_ARGS(__half)) {
    sk_gemv_body<__half, false, 1>(SK_PASS);
}
#endif
#if !defined(SK_ONE) || defined(SK_WANT_skinny_gemv_m16_f16)
extern "C" __global__ void __launch_bounds__(32 * SK_GW) skinny_gemv_m16_f16(SK_ARGS(__half)) {
    sk_gemv_body<__half, false, 2>(SK_PASS);
}
#endif
#if !defined(SK_ONE) || defined(SK_WANT_skinny_tile_nt_bf16)
extern "C" __global__ void __launch_bounds__(32 * SK_WN * SK_WM) skinny_tile_nt_bf16(SK_ARGS(__nv_bfloat16)) {
    sk_tile_body<__nv_bfloat16, true, false>(SK_PASS);
}
#endif
#if !defined(SK_ONE) || defined(SK_WANT_skinny_tile_nn_bf16)
extern "C" __global__ void __launch_bounds__(32 * SK_WN * SK_WM) skinny_tile_nn_bf16(SK_ARGS(__nv_bfloat16)) {
    sk_tile_body<__nv_bfloat16, true, true>(SK_PASS);
}
#endif
#if !defined(SK_ONE) || defined(SK_WANT_skinny_tile_nt_f16)
extern "C" __global__ void __launch_bounds__(32 * SK_WN * SK_WM) skinny_tile_nt_f16(SK_ARGS(__half)) {
    sk_tile_body<__half, false, false>(SK_PASS);
}
#endif
#if !defined(SK_ONE) || defined(SK_WANT_skinny_tile_nn_f16)
extern "C" __global__ void __launch_bounds__(32 * SK_WN * SK_WM) skinny_tile_nn_f16(SK_ARGS(__half)) {
    sk_tile_body<__half, false, true>(SK_PASS);
}
#endif
#if !defined(SK_ONE) || defined(SK_WANT_skinny_rows_m1_bf16)
extern "C" __global__ void __launch_bounds__(32 * SK_RW) skinny_rows_m1_bf16(SK_ARGS(__nv_bfloat16)) {
    sk_rows_body<__nv_bfloat16, 1>(SK_PASS);
}
#endif
#if !defined(SK_ONE) || defined(SK_WANT_skinny_rows_m1_f16)
extern "C" __global__ void __launch_bounds__(32 * SK_RW) skinny_rows_m1_f16(SK_ARGS(__half)) {
    sk_rows_body<__half, 1>(SK_PASS);
}
#endif
#if !defined(SK_ONE) || defined(SK_WANT_skinny_rows_m2_bf16)
extern "C" __global__ void __launch_bounds__(32 * SK_RW) skinny_rows_m2_bf16(SK_ARGS(__nv_bfloat16)) {
    sk_rows_body<__nv_bfloat16, 2>(SK_PASS);
}
#endif
#if !defined(SK_ONE) || defined(SK_WANT_skinny_rows_m2_f16)
extern "C" __global__ void __launch_bounds__(32 * SK_RW) skinny_rows_m2_f16(SK_ARGS(__half)) {
    sk_rows_body<__half, 2>(SK_PASS);
}
#endif
#if !defined(SK_ONE) || defined(SK_WANT_skinny_rows_m4_bf16)
extern "C" __global__ void __launch_bounds__(32 * SK_RW) skinny_rows_m4_bf16(SK_ARGS(__nv_bfloat16)) {
    sk_rows_body<__nv_bfloat16, 4>(SK_PASS);
}
#endif
#if !defined(SK_ONE) || defined(SK_WANT_skinny_rows_m4_f16)
extern "C" __global__ void __launch_bounds__(32 * SK_RW) skinny_rows_m4_f16(SK_ARGS(__half)) {
    sk_rows_body<__half, 4>(SK_PASS);
}
#endif
#if !defined(SK_ONE) || defined(SK_WANT_skinny_rows_m8_bf16)
extern "C" __global__ void __launch_bounds__(32 * SK_RW) skinny_rows_m8_bf16(SK_ARGS(__nv_bfloat16)) {
    sk_rows_body<__nv_bfloat16, 8>(SK_PASS);
}
#endif
#if !defined(SK_ONE) || defined(SK_WANT_skinny_rows_m8_f16)
extern "C" __global__ void __launch_bounds__(32 * SK_RW) skinny_rows_m8_f16(SK_ARGS(__half)) {
    sk_rows_body<__half, 8>(SK_PASS);
}
#endif
#if !defined(SK_ONE) || defined(SK_WANT_skinny_cols_m1_bf16)
extern "C" __global__ void __launch_bounds__(32 * SK_CW, SK_CB) skinny_cols_m1_bf16(SK_ARGS(__nv_bfloat16)) {
    sk_cols_body<__nv_bfloat16, 1>(SK_PASS);
}
#endif
#if !defined(SK_ONE) || defined(SK_WANT_skinny_cols_m1_f16)
extern "C" __global__ void __launch_bounds__(32 * SK_CW, SK_CB) skinny_cols_m1_f16(SK_ARGS(__half)) {
    sk_cols_body<__half, 1>(SK_PASS);
}
#endif
#if !defined(SK_ONE) || defined(SK_WANT_skinny_cols_m2_bf16)
extern "C" __global__ void __launch_bounds__(32 * SK_CW, SK_CB) skinny_cols_m2_bf16(SK_ARGS(__nv_bfloat16)) {
    sk_cols_body<__nv_bfloat16, 2>(SK_PASS);
}
#endif
#if !defined(SK_ONE) || defined(SK_WANT_skinny_cols_m2_f16)
extern "C" __global__ void __launch_bounds__(32 * SK_CW, SK_CB) skinny_cols_m2_f16(SK_ARGS(__half)) {
    sk_cols_body<__half, 2>(SK_PASS);
}
#endif
#if !defined(SK_ONE) || defined(SK_WANT_skinny_cols_m4_bf16)
extern "C" __global__ void __launch_bounds__(32 * SK_CW, SK_CB) skinny_cols_m4_bf16(SK_ARGS(__nv_bfloat16)) {
    sk_cols_body<__nv_bfloat16, 4>(SK_PASS);
}
#endif
#if !defined(SK_ONE) || defined(SK_WANT_skinny_cols_m4_f16)
extern "C" __global__ void __launch_bounds__(32 * SK_CW, SK_CB) skinny_cols_m4_f16(SK_ARGS(__half)) {
    sk_cols_body<__half, 4>(SK_PASS);
}
#endif
#if !defined(SK_ONE) || defined(SK_WANT_skinny_cols_m8_bf16)
extern "C" __global__ void __launch_bounds__(32 * SK_CW, SK_CB) skinny_cols_m8_bf16(SK_ARGS(__nv_bfloat16)) {
    sk_cols_body<__nv_bfloat16, 8>(SK_PASS);
}
#endif
#if !defined(SK_ONE) || defined(SK_WANT_skinny_cols_m8_f16)
extern "C" __global__ void __launch_bounds__(32 * SK_CW, SK_CB) skinny_cols_m8_f16(SK_ARGS(__half)) {
    sk_cols_body<__half, 8>(SK_PASS);
}
#endif
#if !defined(SK_ONE) || defined(SK_WANT_skinny_cols_m16_bf16)
extern "C" __global__ void __launch_bounds__(32 * SK_CW, SK_CB) skinny_cols_m16_bf16(SK_ARGS(__nv_bfloat16)) {
    sk_cols_body<__nv_bfloat16, 16>(SK_PASS);
}
#endif
#if !defined(SK_ONE) || defined(SK_WANT_skinny_cols_m16_f16)
extern "C" __global__ void __launch_bounds__(32 * SK_CW, SK_CB) skinny_cols_m16_f16(SK_ARGS(__half)) {
    sk_cols_body<__half, 16>(SK_PASS);
}
#endif
