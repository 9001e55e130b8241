// Matmul C = A @ B in CUDA C++, from naive to tensor cores (compiled by NVRTC).
//
// Contract (every kernel): A [batch, M, K], B [batch, K, N], C [batch, M, N], all
// contiguous row-major (the launcher packs strided operands); blockIdx.z is the batch
// index. Any M, N, K: every load and store is guarded. fp32 variants accumulate in fp32.
//
// The fp32 ladder (after siboehm's SGEMM_CUDA; the numbers are the reasoning, the measured
// table lives in benchmarks/). Per output element the naive kernel reads 2K floats; a 4096^3
// product is 137 GFLOP and the H100 has ~60 TFLOP/s of fp32 FMA, so a kernel must reuse
// each loaded value many times (arithmetic intensity) to get near the compute ceiling.
//   v1 naive: one thread per output, threadIdx.x walks down a *column* of C, so a warp
//      reads 32 different rows of A (32 transactions) and writes C with a stride of N.
//   v2 coalesced: threadIdx.x walks along a *row* of C; a warp reads one broadcast element
//      of A and 32 consecutive floats of B (one 128-byte transaction): ~5-10x over v1.
//   v3 shared-memory tiling: a 32x32 block stages 32x32 tiles of A and B in shared memory;
//      each global value is read once per block instead of once per thread (32x reuse).
//   v4 1-D block tiling: each thread computes TM=8 outputs of a column; the B value it
//      reads from shared memory is reused 8 times from a register (fewer shared loads per FMA).
//   (v1-v4 keep four partial sums per output over k % 4, for accuracy: see KL_SPLIT_NOTE.)
//   v5 2-D block tiling: 8x8 outputs per thread (128x128 block tile, BK=8): per k step a
//      thread loads 8+8 values and does 64 FMAs (4 FMA per shared load instead of ~1).
//   v6 vectorized: 16-byte (float4) global loads and an A tile stored transposed in shared
//      memory, so the 8 A values a thread needs per k are contiguous and come in two
//      LDS.128; 4x fewer load instructions. Vector loads only when K and N are multiples of
//      4 and the pointers 16-byte aligned; otherwise the same kernel takes a guarded scalar path.
//   v7 warp tiling + double buffering: a 128x256 block tile of 8 warps, each warp owning a
//      64x64 tile computed as 2x4 sub-tiles of 32x16 (a lane does 4x4 of each: 128 outputs),
//      so the lanes of a warp read 8 distinct float4 of A and 4 of B per k (conflict-free
//      broadcasts); BK=8 and the next tile is fetched into registers while the current one is
//      computed (one barrier per tile). The shape was chosen by a measured sweep (see below).
// Tensor cores (fp16 / bf16 inputs, fp32 accumulation):
//   v8 mma.sync.m16n8k16 through inline PTX: 128x128x32 block tile, 8 warps each 64x32,
//      operands moved shared -> registers with ldmatrix (.trans for B), global -> shared
//      with cp.async (16-byte, zero-fill past the edges) into two stages so the copy of
//      tile k+1 overlaps the MMAs on tile k. Padded shared rows (40 and 136 halfs) make
//      every ldmatrix phase conflict-free.
//   v9 v8 with 128x256x32 block tiles (warp tile 64x64: each A fragment feeds 8 MMAs instead
//      of 4) and a 3-stage cp.async pipeline in 81 KB of dynamic shared memory.

#include <cuda_fp16.h>
#include <cuda_bf16.h>

#define KL_BATCH_OFFSETS                                        \
    const long long bz = blockIdx.z;                            \
    A += bz * (long long)M * K;                                 \
    B += bz * (long long)K * N;                                 \
    C += bz * (long long)M * N;

// KL_SPLIT_NOTE (v1-v4): each thread keeps four partial sums, one per k % 4, and adds them
// pairwise at the end. One sequential fp32 FMA chain over K accumulates rounding error
// ~linearly in K, and loses to cuBLAS's order: with TF32 off it misses the 2x-cuBLAS
// error rule already at K=65. A CPU model of the orders (20 seeds, K = 65, 997, 4096)
// puts the 4-chain error at
// 0.57-0.88x the single chain's on the same draw (worst over seeds). The chains are also
// independent FMAs (ILP: no FMA waits for the previous one's 4-cycle latency), which helps
// these one-output-per-thread kernels. The cost is 3 registers per output: affordable here,
// not in v5-v7 (64 outputs per thread; v7 already uses all 128 registers that
// __launch_bounds__(256, 2) allows). For those the launcher (cuda.py, SPLIT_K) cuts K into 4
// slices when the grid has fewer blocks than the GPU has SMs: the small problems, where
// cuBLAS's error is furthest below a single chain's.

// ------------------------------------------------------------------ v1 naive
// grid (ceil(M/32), ceil(N/32), batch), block 32x32: x -> row, y -> column.
extern "C" __global__ void matmul_v1_f32(const float* __restrict__ A, const float* __restrict__ B,
                                         float* __restrict__ C, int M, int N, int K) {
    KL_BATCH_OFFSETS
    const int row = blockIdx.x * blockDim.x + threadIdx.x;
    const int col = blockIdx.y * blockDim.y + threadIdx.y;
    if (row < M && col < N) {
        // Four independent chains (k % 4), summed pairwise at the end: see KL_SPLIT_NOTE.
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        int k = 0;
        for (; k + 4 <= K; k += 4) {
#pragma unroll
            for (int q = 0; q < 4; ++q) acc[q] += A[(long long)row * K + k + q] * B[(long long)(k + q) * N + col];
        }
        for (int q = 0; k < K; ++k, ++q) acc[q] += A[(long long)row * K + k] * B[(long long)k * N + col];
        C[(long long)row * N + col] = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    }
}

// ------------------------------------------------------------------ v2 coalesced
// grid (ceil(N/32), ceil(M/32), batch), block 32x32: x -> column (consecutive lanes,
// consecutive addresses of B and C), y -> row.
extern "C" __global__ void matmul_v2_f32(const float* __restrict__ A, const float* __restrict__ B,
                                         float* __restrict__ C, int M, int N, int K) {
    KL_BATCH_OFFSETS
    const int col = blockIdx.x * blockDim.x + threadIdx.x;
    const int row = blockIdx.y * blockDim.y + threadIdx.y;
    if (row < M && col < N) {
        // Four independent chains (k % 4), summed pairwise at the end: see KL_SPLIT_NOTE.
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        int k = 0;
        for (; k + 4 <= K; k += 4) {
#pragma unroll
            for (int q = 0; q < 4; ++q) acc[q] += A[(long long)row * K + k + q] * B[(long long)(k + q) * N + col];
        }
        for (int q = 0; k < K; ++k, ++q) acc[q] += A[(long long)row * K + k] * B[(long long)k * N + col];
        C[(long long)row * N + col] = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    }
}

// ------------------------------------------------------------------ v3 shared tiling
// grid (ceil(N/32), ceil(M/32), batch), block 32x32. Out-of-range tile entries are 0.
#define V3_T 32
extern "C" __global__ void matmul_v3_f32(const float* __restrict__ A, const float* __restrict__ B,
                                         float* __restrict__ C, int M, int N, int K) {
    KL_BATCH_OFFSETS
    __shared__ float As[V3_T][V3_T];
    __shared__ float Bs[V3_T][V3_T];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int col = blockIdx.x * V3_T + tx;
    const int row = blockIdx.y * V3_T + ty;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};  // chains k % 4: see KL_SPLIT_NOTE
    for (int k0 = 0; k0 < K; k0 += V3_T) {
        As[ty][tx] = (row < M && k0 + tx < K) ? A[(long long)row * K + k0 + tx] : 0.f;
        Bs[ty][tx] = (k0 + ty < K && col < N) ? B[(long long)(k0 + ty) * N + col] : 0.f;
        __syncthreads();
#pragma unroll
        for (int k = 0; k < V3_T; ++k) acc[k % 4] += As[ty][k] * Bs[k][tx];
        __syncthreads();
    }
    if (row < M && col < N) C[(long long)row * N + col] = (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

// ------------------------------------------------------------------ v4 1-D block tiling
// Block tile 64x64, BK=8, 512 threads; thread t computes rows (t/64)*8 .. +7 of column t%64.
#define V4_BM 64
#define V4_BN 64
#define V4_BK 8
#define V4_TM 8
extern "C" __global__ void matmul_v4_f32(const float* __restrict__ A, const float* __restrict__ B,
                                         float* __restrict__ C, int M, int N, int K) {
    KL_BATCH_OFFSETS
    __shared__ float As[V4_BM][V4_BK];
    __shared__ float Bs[V4_BK][V4_BN];
    const int t = threadIdx.x;
    const int m0 = blockIdx.y * V4_BM, n0 = blockIdx.x * V4_BN;
    const int tcol = t % V4_BN, trow = (t / V4_BN) * V4_TM;
    // loaders: A tile 64x8 (one per thread), B tile 8x64 (one per thread)
    const int a_r = t / V4_BK, a_c = t % V4_BK;
    const int b_r = t / V4_BN, b_c = t % V4_BN;
    float acc[4][V4_TM] = {};  // [chain k % 4][row]: see KL_SPLIT_NOTE
    for (int k0 = 0; k0 < K; k0 += V4_BK) {
        As[a_r][a_c] = (m0 + a_r < M && k0 + a_c < K) ? A[(long long)(m0 + a_r) * K + k0 + a_c] : 0.f;
        Bs[b_r][b_c] = (k0 + b_r < K && n0 + b_c < N) ? B[(long long)(k0 + b_r) * N + n0 + b_c] : 0.f;
        __syncthreads();
#pragma unroll
        for (int k = 0; k < V4_BK; ++k) {
            const float b = Bs[k][tcol];  // reused TM times from a register
#pragma unroll
            for (int i = 0; i < V4_TM; ++i) acc[k % 4][i] += As[trow + i][k] * b;
        }
        __syncthreads();
    }
    const int col = n0 + tcol;
#pragma unroll
    for (int i = 0; i < V4_TM; ++i) {
        const int row = m0 + trow + i;
        if (row < M && col < N) C[(long long)row * N + col] = (acc[0][i] + acc[1][i]) + (acc[2][i] + acc[3][i]);
    }
}

// ------------------------------------------------------------------ v5 2-D block tiling
// Block tile 128x128, BK=8, 256 threads as 16x16; thread (ty, tx) computes the 8x8 outputs
// rows ty*8.., columns tx*8...
#define V5_BM 128
#define V5_BN 128
#define V5_BK 8
#define V5_TM 8
#define V5_TN 8
extern "C" __global__ void __launch_bounds__(256) matmul_v5_f32(const float* __restrict__ A,
                                                                const float* __restrict__ B,
                                                                float* __restrict__ C, int M, int N, int K) {
    KL_BATCH_OFFSETS
    __shared__ float As[V5_BM][V5_BK];
    __shared__ float Bs[V5_BK][V5_BN];
    const int t = threadIdx.x;
    const int tx = t % 16, ty = t / 16;
    const int m0 = blockIdx.y * V5_BM, n0 = blockIdx.x * V5_BN;
    float acc[V5_TM][V5_TN] = {{0.f}};
    float ra[V5_TM], rb[V5_TN];
    for (int k0 = 0; k0 < K; k0 += V5_BK) {
        // A tile 128x8 = 1024 values, B tile 8x128 = 1024 values: 4 of each per thread.
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int e = t + i * 256;
            const int ar = e / V5_BK, ac = e % V5_BK;
            As[ar][ac] = (m0 + ar < M && k0 + ac < K) ? A[(long long)(m0 + ar) * K + k0 + ac] : 0.f;
            const int br = e / V5_BN, bc = e % V5_BN;
            Bs[br][bc] = (k0 + br < K && n0 + bc < N) ? B[(long long)(k0 + br) * N + n0 + bc] : 0.f;
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < V5_BK; ++k) {
#pragma unroll
            for (int i = 0; i < V5_TM; ++i) ra[i] = As[ty * V5_TM + i][k];
#pragma unroll
            for (int j = 0; j < V5_TN; ++j) rb[j] = Bs[k][tx * V5_TN + j];
#pragma unroll
            for (int i = 0; i < V5_TM; ++i)
#pragma unroll
                for (int j = 0; j < V5_TN; ++j) acc[i][j] += ra[i] * rb[j];
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < V5_TM; ++i) {
        const int row = m0 + ty * V5_TM + i;
#pragma unroll
        for (int j = 0; j < V5_TN; ++j) {
            const int col = n0 + tx * V5_TN + j;
            if (row < M && col < N) C[(long long)row * N + col] = acc[i][j];
        }
    }
}

// ------------------------------------------------------------------ v6 vectorized
// As v5 (128x128, BK=8, 8x8 per thread) with float4 global loads and As stored transposed
// (As[k][m]) so a thread's 8 A values are two float4 shared loads. vec != 0 promises
// K % 4 == 0, N % 4 == 0 and 16-byte aligned A, B, C (checked by the launcher).
#define V6_BM 128
#define V6_BN 128
#define V6_BK 8
extern "C" __global__ void __launch_bounds__(256) matmul_v6_f32(const float* __restrict__ A,
                                                                const float* __restrict__ B,
                                                                float* __restrict__ C, int M, int N, int K,
                                                                int vec) {
    KL_BATCH_OFFSETS
    __shared__ __align__(16) float As[V6_BK][V6_BM];
    __shared__ __align__(16) float Bs[V6_BK][V6_BN];
    const int t = threadIdx.x;
    const int tx = t % 16, ty = t / 16;
    const int m0 = blockIdx.y * V6_BM, n0 = blockIdx.x * V6_BN;
    // A tile 128x8: thread t loads a float4 of row t/2, columns (t%2)*4..+3.
    const int a_r = t / 2, a_c = (t % 2) * 4;
    // B tile 8x128: thread t loads a float4 of row t/32, columns (t%32)*4..+3.
    const int b_r = t / 32, b_c = (t % 32) * 4;
    float acc[8][8] = {{0.f}};
    for (int k0 = 0; k0 < K; k0 += V6_BK) {
        float4 av, bv;
        const int ar = m0 + a_r, ac = k0 + a_c;
        const int br = k0 + b_r, bc = n0 + b_c;
        if (vec) {
            // K % 4 == 0 and ac % 4 == 0: the float4 is either wholly inside or outside.
            av = (ar < M && ac < K) ? *reinterpret_cast<const float4*>(A + (long long)ar * K + ac)
                                    : make_float4(0.f, 0.f, 0.f, 0.f);
            bv = (br < K && bc < N) ? *reinterpret_cast<const float4*>(B + (long long)br * N + bc)
                                    : make_float4(0.f, 0.f, 0.f, 0.f);
        } else {
            const float* pa = A + (long long)ar * K;
            const bool ra = ar < M;
            av.x = (ra && ac + 0 < K) ? pa[ac + 0] : 0.f;
            av.y = (ra && ac + 1 < K) ? pa[ac + 1] : 0.f;
            av.z = (ra && ac + 2 < K) ? pa[ac + 2] : 0.f;
            av.w = (ra && ac + 3 < K) ? pa[ac + 3] : 0.f;
            const float* pb = B + (long long)br * N;
            const bool rb = br < K;
            bv.x = (rb && bc + 0 < N) ? pb[bc + 0] : 0.f;
            bv.y = (rb && bc + 1 < N) ? pb[bc + 1] : 0.f;
            bv.z = (rb && bc + 2 < N) ? pb[bc + 2] : 0.f;
            bv.w = (rb && bc + 3 < N) ? pb[bc + 3] : 0.f;
        }
        As[a_c + 0][a_r] = av.x;  // transposed store
        As[a_c + 1][a_r] = av.y;
        As[a_c + 2][a_r] = av.z;
        As[a_c + 3][a_r] = av.w;
        *reinterpret_cast<float4*>(&Bs[b_r][b_c]) = bv;
        __syncthreads();
#pragma unroll
        for (int k = 0; k < V6_BK; ++k) {
            float ra[8], rb[8];
            *reinterpret_cast<float4*>(ra) = *reinterpret_cast<const float4*>(&As[k][ty * 8]);
            *reinterpret_cast<float4*>(ra + 4) = *reinterpret_cast<const float4*>(&As[k][ty * 8 + 4]);
            *reinterpret_cast<float4*>(rb) = *reinterpret_cast<const float4*>(&Bs[k][tx * 8]);
            *reinterpret_cast<float4*>(rb + 4) = *reinterpret_cast<const float4*>(&Bs[k][tx * 8 + 4]);
#pragma unroll
            for (int i = 0; i < 8; ++i)
#pragma unroll
                for (int j = 0; j < 8; ++j) acc[i][j] += ra[i] * rb[j];
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int row = m0 + ty * 8 + i;
        if (row >= M) break;
        float* pc = C + (long long)row * N;
#pragma unroll
        for (int j = 0; j < 8; j += 4) {
            const int col = n0 + tx * 8 + j;
            if (vec && col < N) {
                *reinterpret_cast<float4*>(pc + col) = make_float4(acc[i][j], acc[i][j + 1], acc[i][j + 2], acc[i][j + 3]);
            } else {
#pragma unroll
                for (int q = 0; q < 4; ++q)
                    if (col + q < N) pc[col + q] = acc[i][j + q];
            }
        }
    }
}

// ------------------------------------------------------------------ v7 warp tiling
// One body, templated on the tile shape: block tile BM x BN, BK deep; WARPS_M x WARPS_N warps,
// warp tile (BM/WARPS_M) x (BN/WARPS_N) made of sub-tiles of 32x16 in which lane l computes
// rows (l/4)*4..+3 and columns (l%4)*4..+3 (so a warp reads 8 distinct float4 of A and 4 of B
// per k: conflict-free broadcasts). Global tiles for step k+1 are loaded into registers before
// the math of step k (latency hidden behind the FMAs) and stored to the other shared buffer
// after it: one barrier per BK step. `matmul_v7_f32` is the shape chosen by measurement;
// the `matmul_v7s_*` instantiations are the candidates.
template <int BM, int BN, int BK, int WARPS_M, int WARPS_N>
__device__ __forceinline__ void v7_body(const float* __restrict__ A, const float* __restrict__ B,
                                        float* __restrict__ C, int M, int N, int K, int vec) {
    constexpr int NT = 32 * WARPS_M * WARPS_N;
    constexpr int WTM = BM / WARPS_M, WTN = BN / WARPS_N;  // warp tile
    constexpr int SUBM = WTM / 32, SUBN = WTN / 16;         // 32x16 sub-tiles per warp
    constexpr int A4 = BM * BK / 4 / NT, B4 = BK * BN / 4 / NT;  // float4 per thread per tile
    static_assert(WTM % 32 == 0 && WTN % 16 == 0, "warp tile must be made of 32x16 sub-tiles");
    static_assert(A4 * 4 * NT == BM * BK && B4 * 4 * NT == BK * BN, "tiles must split evenly");
    __shared__ __align__(16) float As[2][BK][BM];
    __shared__ __align__(16) float Bs[2][BK][BN];
    const int t = threadIdx.x, lane = t % 32, warp = t / 32;
    const int wm = (warp / WARPS_N) * WTM, wn = (warp % WARPS_N) * WTN;
    const int lm = (lane / 4) * 4, ln = (lane % 4) * 4;
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    float4 pa[A4], pb[B4];

    auto fetch = [&](int k0) {
#pragma unroll
        for (int h = 0; h < A4; ++h) {
            const int c = t + h * NT;
            const int ar = m0 + c / (BK / 4), ac = k0 + (c % (BK / 4)) * 4;
            if (vec) {
                pa[h] = (ar < M && ac < K) ? *reinterpret_cast<const float4*>(A + (long long)ar * K + ac)
                                           : make_float4(0.f, 0.f, 0.f, 0.f);
            } else {
                const float* q = A + (long long)ar * K;
                const bool r = ar < M;
                pa[h].x = (r && ac + 0 < K) ? q[ac + 0] : 0.f;
                pa[h].y = (r && ac + 1 < K) ? q[ac + 1] : 0.f;
                pa[h].z = (r && ac + 2 < K) ? q[ac + 2] : 0.f;
                pa[h].w = (r && ac + 3 < K) ? q[ac + 3] : 0.f;
            }
        }
#pragma unroll
        for (int h = 0; h < B4; ++h) {
            const int c = t + h * NT;
            const int br = k0 + c / (BN / 4), bc = n0 + (c % (BN / 4)) * 4;
            if (vec) {
                pb[h] = (br < K && bc < N) ? *reinterpret_cast<const float4*>(B + (long long)br * N + bc)
                                           : make_float4(0.f, 0.f, 0.f, 0.f);
            } else {
                const float* q = B + (long long)br * N;
                const bool r = br < K;
                pb[h].x = (r && bc + 0 < N) ? q[bc + 0] : 0.f;
                pb[h].y = (r && bc + 1 < N) ? q[bc + 1] : 0.f;
                pb[h].z = (r && bc + 2 < N) ? q[bc + 2] : 0.f;
                pb[h].w = (r && bc + 3 < N) ? q[bc + 3] : 0.f;
            }
        }
    };
    auto stash = [&](int s) {
#pragma unroll
        for (int h = 0; h < A4; ++h) {
            const int c = t + h * NT;
            const int r = c / (BK / 4), k = (c % (BK / 4)) * 4;
            As[s][k + 0][r] = pa[h].x;  // transposed: a lane's 4 rows of one k are contiguous
            As[s][k + 1][r] = pa[h].y;
            As[s][k + 2][r] = pa[h].z;
            As[s][k + 3][r] = pa[h].w;
        }
#pragma unroll
        for (int h = 0; h < B4; ++h) {
            const int c = t + h * NT;
            *reinterpret_cast<float4*>(&Bs[s][c / (BN / 4)][(c % (BN / 4)) * 4]) = pb[h];
        }
    };

    float acc[SUBM][SUBN][4][4] = {};  // [sub-tile m][sub-tile n][row][col]
    fetch(0);
    stash(0);
    __syncthreads();
    int s = 0;
    for (int k0 = 0; k0 < K; k0 += BK) {
        const bool more = k0 + BK < K;
        if (more) fetch(k0 + BK);
#pragma unroll
        for (int k = 0; k < BK; ++k) {
            float ra[SUBM][4], rb[SUBN][4];
#pragma unroll
            for (int i = 0; i < SUBM; ++i)
                *reinterpret_cast<float4*>(ra[i]) = *reinterpret_cast<const float4*>(&As[s][k][wm + i * 32 + lm]);
#pragma unroll
            for (int j = 0; j < SUBN; ++j)
                *reinterpret_cast<float4*>(rb[j]) = *reinterpret_cast<const float4*>(&Bs[s][k][wn + j * 16 + ln]);
#pragma unroll
            for (int i = 0; i < SUBM; ++i)
#pragma unroll
                for (int j = 0; j < SUBN; ++j)
#pragma unroll
                    for (int r = 0; r < 4; ++r)
#pragma unroll
                        for (int c = 0; c < 4; ++c) acc[i][j][r][c] += ra[i][r] * rb[j][c];
        }
        if (more) {
            stash(s ^ 1);  // the other buffer: nobody reads it during this step
            __syncthreads();
            s ^= 1;
        }
    }
#pragma unroll
    for (int i = 0; i < SUBM; ++i)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const int row = m0 + wm + i * 32 + lm + r;
            if (row >= M) continue;
            float* pc = C + (long long)row * N;
#pragma unroll
            for (int j = 0; j < SUBN; ++j) {
                const int col = n0 + wn + j * 16 + ln;
                if (vec && col < N) {
                    *reinterpret_cast<float4*>(pc + col) =
                        make_float4(acc[i][j][r][0], acc[i][j][r][1], acc[i][j][r][2], acc[i][j][r][3]);
                } else {
#pragma unroll
                    for (int c = 0; c < 4; ++c)
                        if (col + c < N) pc[col + c] = acc[i][j][r][c];
                }
            }
        }
}

#define KL_V7_KERNEL(NAME, BM, BN, BK, WARPS_M, WARPS_N, MIN_BLOCKS)                                   \
    extern "C" __global__ void __launch_bounds__(32 * WARPS_M * WARPS_N, MIN_BLOCKS)                    \
        NAME(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C, int M,   \
             int N, int K, int vec) {                                                                  \
        KL_BATCH_OFFSETS                                                                               \
        v7_body<BM, BN, BK, WARPS_M, WARPS_N>(A, B, C, M, N, K, vec);                                  \
    }

// The shipped v7: 128x256 block tile, BK=8, 8 warps (2x4) of 64x64 = 2x4 sub-tiles, so 128
// outputs per thread (255 registers, one block per SM): the fastest of the candidates below
// on Hopper (TF32 off, 4096^3 and 8192^3), ahead of 64 outputs per thread at two blocks per
// SM. More outputs per thread mean fewer shared-memory loads per FMA (6 LDS.128 per 128 FMAs
// instead of 4 per 64); BK=8 keeps the register-staged prefetch at 3 float4 per thread.
KL_V7_KERNEL(matmul_v7_f32, 128, 256, 8, 2, 4, 1)
// Tuning candidates (name: BM x BN x BK, warps M x N), compiled only with
// -DKL_V7_CANDIDATES: the library's own build stays one v7.
#ifdef KL_V7_CANDIDATES
KL_V7_KERNEL(matmul_v7s_128x128x16_2x4_f32, 128, 128, 16, 2, 4, 2)
KL_V7_KERNEL(matmul_v7s_256x128x8_4x2_f32, 256, 128, 8, 4, 2, 1)
KL_V7_KERNEL(matmul_v7s_128x256x8_4x2_f32, 128, 256, 8, 4, 2, 1)
KL_V7_KERNEL(matmul_v7s_256x128x8_2x4_f32, 256, 128, 8, 2, 4, 1)
#endif

// ------------------------------------------------------------------ v8 tensor cores
// fp16 / bf16 in, fp32 accumulate, fp16 / bf16 out. grid (ceil(N/128), ceil(M/128), batch),
// 256 threads. vec != 0 promises K % 8 == 0, N % 8 == 0 and 16-byte aligned A, B (cp.async
// 16-byte chunks); otherwise tiles are filled with guarded scalar loads.
#define V8_BM 128
#define V8_BN 128
#define V8_BK 32
#define V8_APITCH 40   // halfs per A row in shared memory (32 + 8 padding)
#define V8_BPITCH 136  // halfs per B row in shared memory (128 + 8 padding)

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}

template <typename T>
__device__ __forceinline__ void v8_load_tile(const T* __restrict__ A, const T* __restrict__ B,
                                             unsigned short* As, unsigned short* Bs, int M, int N,
                                             int K, int m0, int n0, int k0, int vec) {
    const int t = threadIdx.x;
    if (vec) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int c = t + h * 256;
            // A: 128 rows x 4 chunks of 8 halfs
            const int ar = c / 4, ac = (c % 4) * 8;
            const bool ina = (m0 + ar < M) && (k0 + ac < K);
            const T* ga = ina ? A + (long long)(m0 + ar) * K + k0 + ac : A;
            cp_async16(smem_addr(As + ar * V8_APITCH + ac), ga, ina ? 16 : 0);
            // B: 32 rows x 16 chunks of 8 halfs
            const int br = c / 16, bc = (c % 16) * 8;
            const bool inb = (k0 + br < K) && (n0 + bc < N);
            const T* gb = inb ? B + (long long)(k0 + br) * N + n0 + bc : B;
            cp_async16(smem_addr(Bs + br * V8_BPITCH + bc), gb, inb ? 16 : 0);
        }
    } else {
        const unsigned short* A16 = reinterpret_cast<const unsigned short*>(A);
        const unsigned short* B16 = reinterpret_cast<const unsigned short*>(B);
        for (int e = t; e < V8_BM * V8_BK; e += 256) {
            const int r = e / V8_BK, c = e % V8_BK;
            As[r * V8_APITCH + c] = (m0 + r < M && k0 + c < K) ? A16[(long long)(m0 + r) * K + k0 + c] : 0;
        }
        for (int e = t; e < V8_BK * V8_BN; e += 256) {
            const int r = e / V8_BN, c = e % V8_BN;
            Bs[r * V8_BPITCH + c] = (k0 + r < K && n0 + c < N) ? B16[(long long)(k0 + r) * N + n0 + c] : 0;
        }
    }
}

template <bool BF16>
__device__ __forceinline__ void mma16816(float* c, const unsigned* a, const unsigned* b) {
    if (BF16) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    } else {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
}

__device__ __forceinline__ void store2(__nv_bfloat16* p, float x, float y) {
    *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(x, y);
}
__device__ __forceinline__ void store2(__half* p, float x, float y) {
    *reinterpret_cast<__half2*>(p) = __floats2half2_rn(x, y);
}
__device__ __forceinline__ void store1(__nv_bfloat16* p, float x) { *p = __float2bfloat16_rn(x); }
__device__ __forceinline__ void store1(__half* p, float x) { *p = __float2half_rn(x); }

template <typename T, bool BF16>
__device__ __forceinline__ void v8_body(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C,
                                        int M, int N, int K, int vec) {
    KL_BATCH_OFFSETS
    __shared__ __align__(128) unsigned short As[2][V8_BM * V8_APITCH];
    __shared__ __align__(128) unsigned short Bs[2][V8_BK * V8_BPITCH];
    const int t = threadIdx.x, lane = t % 32, warp = t / 32;
    const int wm = (warp / 4) * 64, wn = (warp % 4) * 32;  // warp tile 64x32
    const int m0 = blockIdx.y * V8_BM, n0 = blockIdx.x * V8_BN;
    float acc[4][4][4] = {};  // [m16 tile][n8 tile][fragment]
    const int ktiles = (K + V8_BK - 1) / V8_BK;

    if (ktiles > 0) v8_load_tile<T>(A, B, As[0], Bs[0], M, N, K, m0, n0, 0, vec);
    asm volatile("cp.async.commit_group;\n" ::);
    for (int kt = 0; kt < ktiles; ++kt) {
        const int s = kt & 1;
        if (kt + 1 < ktiles) {
            v8_load_tile<T>(A, B, As[s ^ 1], Bs[s ^ 1], M, N, K, m0, n0, (kt + 1) * V8_BK, vec);
            asm volatile("cp.async.commit_group;\n" ::);
            asm volatile("cp.async.wait_group 1;\n" ::);  // tile kt has landed, kt+1 in flight
        } else {
            asm volatile("cp.async.wait_group 0;\n" ::);
        }
        __syncthreads();
        const unsigned short* as = As[s];
        const unsigned short* bs = Bs[s];
#pragma unroll
        for (int kk = 0; kk < V8_BK; kk += 16) {
            unsigned af[4][4], bf[4][2];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                // lanes 0-15 give rows 0-15 at column kk, lanes 16-31 the same rows at kk+8
                const unsigned short* p = as + (wm + i * 16 + (lane % 16)) * V8_APITCH + kk + (lane / 16) * 8;
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                             : "=r"(af[i][0]), "=r"(af[i][1]), "=r"(af[i][2]), "=r"(af[i][3])
                             : "r"(smem_addr(p)));
            }
#pragma unroll
            for (int j = 0; j < 4; j += 2) {
                // matrices: (k 0-7, n j*8), (k 8-15, n j*8), (k 0-7, n j*8+8), (k 8-15, n j*8+8)
                const unsigned short* p =
                    bs + (kk + (lane % 8) + ((lane / 8) % 2) * 8) * V8_BPITCH + wn + j * 8 + (lane / 16) * 8;
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                             : "=r"(bf[j][0]), "=r"(bf[j][1]), "=r"(bf[j + 1][0]), "=r"(bf[j + 1][1])
                             : "r"(smem_addr(p)));
            }
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) mma16816<BF16>(acc[i][j], af[i], bf[j]);
        }
        __syncthreads();  // the next iteration's cp.async overwrites this stage
    }
    // Fragment of an m16n8 tile: lane holds (g, 2q), (g, 2q+1), (g+8, 2q), (g+8, 2q+1).
    const int g = lane / 4, q = lane % 4;
    const bool pair_ok = (N % 2) == 0;
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = m0 + wm + i * 16 + g + h * 8;
                const int col = n0 + wn + j * 8 + 2 * q;
                if (row >= M) continue;
                T* pc = C + (long long)row * N + col;
                if (pair_ok && col + 1 < N) {
                    store2(pc, acc[i][j][2 * h], acc[i][j][2 * h + 1]);
                } else {
                    if (col < N) store1(pc, acc[i][j][2 * h]);
                    if (col + 1 < N) store1(pc + 1, acc[i][j][2 * h + 1]);
                }
            }
}

extern "C" __global__ void __launch_bounds__(256) matmul_v8_bf16(const __nv_bfloat16* __restrict__ A,
                                                                 const __nv_bfloat16* __restrict__ B,
                                                                 __nv_bfloat16* __restrict__ C, int M, int N,
                                                                 int K, int vec) {
    v8_body<__nv_bfloat16, true>(A, B, C, M, N, K, vec);
}

extern "C" __global__ void __launch_bounds__(256) matmul_v8_f16(const __half* __restrict__ A,
                                                                const __half* __restrict__ B,
                                                                __half* __restrict__ C, int M, int N, int K,
                                                                int vec) {
    v8_body<__half, false>(A, B, C, M, N, K, vec);
}

// ------------------------------------------------------------------ v9 bigger tiles, 3 stages
// v8 with a 128x256x32 block tile (8 warps of 64x64: twice the MMAs per ldmatrix of A)
// and a 3-stage cp.async pipeline (two tiles in flight while one is computed). 81 KB of
// dynamic shared memory (the launcher raises the 48 KB default), one block per SM.
#define V9_BM 128
#define V9_BN 256
#define V9_BK 32
#define V9_STAGES 3
#define V9_APITCH 40   // halfs per A row (32 + 8): ldmatrix rows 80 B apart, conflict-free
#define V9_BPITCH 264  // halfs per B row (256 + 8): rows 528 B apart, conflict-free
#define V9_A_STAGE (V9_BM * V9_APITCH)
#define V9_B_STAGE (V9_BK * V9_BPITCH)

template <typename T>
__device__ __forceinline__ void v9_load_tile(const T* __restrict__ A, const T* __restrict__ B,
                                             unsigned short* As, unsigned short* Bs, int M, int N,
                                             int K, int m0, int n0, int k0, int vec) {
    const int t = threadIdx.x;
    if (vec) {
#pragma unroll
        for (int h = 0; h < (V9_BM * V9_BK / 8) / 256; ++h) {  // A: 128 rows x 4 chunks
            const int c = t + h * 256;
            const int r = c / (V9_BK / 8), col = (c % (V9_BK / 8)) * 8;
            const bool in = (m0 + r < M) && (k0 + col < K);
            const T* g = in ? A + (long long)(m0 + r) * K + k0 + col : A;
            cp_async16(smem_addr(As + r * V9_APITCH + col), g, in ? 16 : 0);
        }
#pragma unroll
        for (int h = 0; h < (V9_BK * V9_BN / 8) / 256; ++h) {  // B: 32 rows x 32 chunks
            const int c = t + h * 256;
            const int r = c / (V9_BN / 8), col = (c % (V9_BN / 8)) * 8;
            const bool in = (k0 + r < K) && (n0 + col < N);
            const T* g = in ? B + (long long)(k0 + r) * N + n0 + col : B;
            cp_async16(smem_addr(Bs + r * V9_BPITCH + col), g, in ? 16 : 0);
        }
    } else {
        const unsigned short* A16 = reinterpret_cast<const unsigned short*>(A);
        const unsigned short* B16 = reinterpret_cast<const unsigned short*>(B);
        for (int e = t; e < V9_BM * V9_BK; e += 256) {
            const int r = e / V9_BK, c = e % V9_BK;
            As[r * V9_APITCH + c] = (m0 + r < M && k0 + c < K) ? A16[(long long)(m0 + r) * K + k0 + c] : 0;
        }
        for (int e = t; e < V9_BK * V9_BN; e += 256) {
            const int r = e / V9_BN, c = e % V9_BN;
            Bs[r * V9_BPITCH + c] = (k0 + r < K && n0 + c < N) ? B16[(long long)(k0 + r) * N + n0 + c] : 0;
        }
    }
}

template <typename T, bool BF16>
__device__ __forceinline__ void v9_body(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C,
                                        int M, int N, int K, int vec) {
    KL_BATCH_OFFSETS
    extern __shared__ __align__(128) unsigned short v9_smem[];
    unsigned short* As = v9_smem;                          // [STAGES][BM * APITCH]
    unsigned short* Bs = v9_smem + V9_STAGES * V9_A_STAGE;  // [STAGES][BK * BPITCH]
    const int t = threadIdx.x, lane = t % 32, warp = t / 32;
    const int wm = (warp / 4) * 64, wn = (warp % 4) * 64;  // warp tile 64x64
    const int m0 = blockIdx.y * V9_BM, n0 = blockIdx.x * V9_BN;
    float acc[4][8][4] = {};  // [m16 tile][n8 tile][fragment]
    const int ktiles = (K + V9_BK - 1) / V9_BK;

    // Prologue: tiles 0 .. STAGES-2 in flight. One commit per tile slot, even when empty,
    // so that "wait until at most STAGES-2 groups are pending" always means "tile kt landed".
#pragma unroll
    for (int s = 0; s < V9_STAGES - 1; ++s) {
        if (s < ktiles) v9_load_tile<T>(A, B, As + s * V9_A_STAGE, Bs + s * V9_B_STAGE, M, N, K, m0, n0, s * V9_BK, vec);
        asm volatile("cp.async.commit_group;\n" ::);
    }
    for (int kt = 0; kt < ktiles; ++kt) {
        asm volatile("cp.async.wait_group %0;\n" ::"n"(V9_STAGES - 2));
        __syncthreads();  // tile kt visible to all; everyone is done with tile kt-1's stage
        const int pf = kt + V9_STAGES - 1;  // prefetch into the stage tile kt-1 used
        if (pf < ktiles) {
            const int s = pf % V9_STAGES;
            v9_load_tile<T>(A, B, As + s * V9_A_STAGE, Bs + s * V9_B_STAGE, M, N, K, m0, n0, pf * V9_BK, vec);
        }
        asm volatile("cp.async.commit_group;\n" ::);
        const unsigned short* as = As + (kt % V9_STAGES) * V9_A_STAGE;
        const unsigned short* bs = Bs + (kt % V9_STAGES) * V9_B_STAGE;
#pragma unroll
        for (int kk = 0; kk < V9_BK; kk += 16) {
            unsigned af[4][4], bf[8][2];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const unsigned short* p = as + (wm + i * 16 + (lane % 16)) * V9_APITCH + kk + (lane / 16) * 8;
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                             : "=r"(af[i][0]), "=r"(af[i][1]), "=r"(af[i][2]), "=r"(af[i][3])
                             : "r"(smem_addr(p)));
            }
#pragma unroll
            for (int j = 0; j < 8; j += 2) {
                const unsigned short* p =
                    bs + (kk + (lane % 8) + ((lane / 8) % 2) * 8) * V9_BPITCH + wn + j * 8 + (lane / 16) * 8;
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                             : "=r"(bf[j][0]), "=r"(bf[j][1]), "=r"(bf[j + 1][0]), "=r"(bf[j + 1][1])
                             : "r"(smem_addr(p)));
            }
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 8; ++j) mma16816<BF16>(acc[i][j], af[i], bf[j]);
        }
    }
    asm volatile("cp.async.wait_group 0;\n" ::);  // no copy may outlive the block
    const int g = lane / 4, q = lane % 4;
    const bool pair_ok = (N % 2) == 0;
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = m0 + wm + i * 16 + g + h * 8;
                const int col = n0 + wn + j * 8 + 2 * q;
                if (row >= M) continue;
                T* pc = C + (long long)row * N + col;
                if (pair_ok && col + 1 < N) {
                    store2(pc, acc[i][j][2 * h], acc[i][j][2 * h + 1]);
                } else {
                    if (col < N) store1(pc, acc[i][j][2 * h]);
                    if (col + 1 < N) store1(pc + 1, acc[i][j][2 * h + 1]);
                }
            }
}

extern "C" __global__ void __launch_bounds__(256) matmul_v9_bf16(const __nv_bfloat16* __restrict__ A,
                                                                 const __nv_bfloat16* __restrict__ B,
                                                                 __nv_bfloat16* __restrict__ C, int M, int N,
                                                                 int K, int vec) {
    v9_body<__nv_bfloat16, true>(A, B, C, M, N, K, vec);
}

extern "C" __global__ void __launch_bounds__(256) matmul_v9_f16(const __half* __restrict__ A,
                                                                const __half* __restrict__ B,
                                                                __half* __restrict__ C, int M, int N, int K,
                                                                int vec) {
    v9_body<__half, false>(A, B, C, M, N, K, vec);
}
