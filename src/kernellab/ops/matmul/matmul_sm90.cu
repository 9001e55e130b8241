// Matmul C = A @ B on Hopper tensor cores with wgmma.mma_async (compiled by NVRTC for sm_90a
// only: wgmma is an arch-specific instruction that ptxas refuses for plain sm_90; the Module
// in cuda.py is built with archs=("sm_90a",)).
//
// Contract: as matmul.cu's. A [batch, M, K], B [batch, K, N], C [batch, M, N], contiguous
// row-major, fp16 or bf16 (fp32 accumulation); blockIdx.z is the batch index. In addition
// the launcher (cuda.py, _launch_v10) guarantees K % 8 == 0, N % 8 == 0 and 16-byte aligned
// A, B, C: every row of A and B is then a whole number of 16-byte chunks, the unit cp.async
// moves. Where K or N is not a multiple of 8, the launcher zero-pads A's K columns and B's K
// rows / N columns up to the next multiple of 8 (the extra products are exact zeros) and
// slices C. Partial tiles in M, N and K are handled here: chunks past an edge are
// zero-filled (cp.async with src-size 0), stores past an edge are skipped.
//
//   v10 wgmma.mma_async m64n256k16 (Hopper warpgroup MMA, operands read straight from shared
//       memory through descriptors, no ldmatrix): 128x256x64 block tile, two warpgroups of
//       64x256 each (128 fp32 accumulators per thread), global -> shared with 16-byte
//       cp.async written directly into the 128-byte-swizzled layout wgmma reads, 4-stage
//       pipeline with one group of MMAs kept in flight while the next tile is issued.
//   v11 v10's tiles and wgmma, in the CUTLASS sm90 warp-specialized / FlashAttention-3
//       design: a producer warpgroup (one thread) copies tiles with TMA (tensor maps from the
//       host) through a 4-stage mbarrier ring; two consumer warpgroups only issue wgmma;
//       setmaxnreg moves registers from the producer to the consumers; persistent blocks
//       (one per SM) walk the output tiles in grouped order and the producer runs ahead
//       across tile boundaries, so the next tile's operands land during an epilogue. A
//       128x128 form (6 stages) serves grids too small to fill the GPU with 128x256 tiles.
//       Details in the v11 section below.
//   v12 v11's producer and ring with CUTLASS's "ping-pong" consumers: each consumer
//       warpgroup computes whole 128x128 tiles, alternate ones of the block's sequence, and
//       the two take turns at the tensor cores through a pair of named barriers, so one
//       warpgroup's epilogue runs under the other's mainloop. Details in the v12 section.
//       The trade: a 128x128 tile loads (128 + 128) / (128 * 128) = 1/64 operand elements
//       per MAC where v11's 128x256 loads 3/256 (a third more traffic through L2 and shared
//       memory), against an epilogue hidden under MMAs. Measured (lab/gpu_mm_v11.py), the
//       hidden epilogue wins where a block's tiles are few and short (2048^3, batches of
//       1024^3) and the reuse wins at 4096 and up, so v12 stays a rung.
//   v13 v11 with the epilogue through shared memory: the consumers write the converted C
//       tile (128-byte swizzled, conflict-free) into a 32 KB staging buffer in two 128-column
//       halves and one thread per warpgroup issues TMA stores (cp.async.bulk.tensor, clipped
//       at the edges by the C tensor map) that drain during the next tile's mainloop; v11's
//       4-stage ring is kept (192 + 32 + 1 KB). Details in the v13 section.
//
// Why wgmma (napkin math): an H100 SXM has ~990 TFLOP/s of dense bf16 on paper; mma.sync
// (v8/v9) is issued warp by warp from registers fed by ldmatrix, and v9 reaches 272. wgmma
// lets one warpgroup (4 warps) issue a 64x256x16 MMA (524k MACs) per instruction reading A
// and B from shared memory directly, so the SM's issue slots and registers are free for
// the copies. Per 64-deep k-tile a block does 128*256*64 = 2.1M MACs on 48 KB of operands
// (43 MACs per byte of shared memory), ~1000 cycles at the tensor-core peak: the cp.async
// for two tiles ahead (24 16-byte copies per thread per tile) hide behind that.
//
// ---------------------------------------------------------------------------------------
// Shared-memory layouts and descriptors (the part that must be exactly right)
//
// 128-byte swizzle: the unit is an "atom" of 8 rows x 128 bytes (1024 B, 1024-byte aligned).
// A 16-byte chunk c (0..7) of atom row r (0..7) is stored at chunk position c ^ r. Hardware
// applies the swizzle to address bits: bits [4:6] ^= bits [7:9], so any tile that starts on
// a 1024-byte boundary and has 128-byte rows gets "chunk ^ (row % 8)". We write that
// pattern with cp.async (the destination address is ours to choose) and describe it to
// wgmma with swizzle mode 128B. Every stage base below is a multiple of 1024 bytes (the
// dynamic shared memory base is rounded up to 1024; the launcher adds 1 KB for that).
//
// A tile (K-major: row-major [M, K], the wgmma default, imm-trans-a = 0): 128 rows (m) x
// 64 halfs (k) = 128 rows of exactly 128 bytes; row m at byte m*128; chunk c (k = 8c..8c+7)
// at ((c ^ (m % 8)) * 16). 16 KB. A warpgroup's 64 rows start 8 KB in (1024-aligned).
//   descriptor (m64 x k16 of it): start = tile + 64*wg*128 + kk*32 (kk = 16-deep k step:
//   32 bytes further along the same swizzled rows; the hardware swizzles the final address,
//   so an offset inside the 128-byte row is correct as long as the atom is 1024-aligned and
//   base_offset = 0 - CUTLASS and DeepGEMM advance K-major SW128 descriptors the same way);
//   LBO unused for swizzled K-major layouts (PTX: "assumed 1") -> 1 (16 bytes);
//   SBO = 1024 bytes: from one group of 8 rows (m) to the next.
//
// B tile (N-major: row-major [K, N], so the transposed form, imm-trans-b = 1): 64 rows (k)
// x 256 halfs (n). An MN-major SW128 atom is 64 n x 8 k (128 bytes of n per k row), so the
// tile is stored as 4 slabs of 64 columns (n-block nb = n / 64), each slab 64 k-rows x 128
// bytes = 8 KB: k-row kr of slab nb at byte nb*8192 + kr*128, chunk c (n = 64nb + 8c ..+7)
// at ((c ^ (kr % 8)) * 16). 32 KB.
//   descriptor (k16 x n256 of it): start = tile + kk*16*128 (16 k-rows = 2 KB, still
//   1024-aligned); for MN-major swizzled layouts (PTX ISA "Leading / Stride dimension byte
//   offset"; CUTLASS make_gmma_desc<Major::MN>: ((T,8,m),(8,k)) : ((1,T,LBO),(8T,SBO))):
//   LBO = 8192 bytes: from one 64-wide n atom to the next (n256 spans 4 slabs);
//   SBO = 1024 bytes: from one group of 8 k-rows to the next (k16 spans 2 groups).
//
// Descriptor bits (sm_90, 64 bits): [0,14) start address >> 4; [16,30) LBO >> 4;
// [32,46) SBO >> 4; [49,52) base offset (0: atoms 1024-aligned); [62,64) swizzle mode
// (0 none, 1 = 128B, 2 = 64B, 3 = 32B).
//
// Accumulator fragment of m64nNk16 (fp32): warp w of the warpgroup owns rows 16w..16w+15;
// lane l holds, for each n8 block j, d[4j+0] = (g, 8j+2q), d[4j+1] = (g, 8j+2q+1),
// d[4j+2] = (g+8, 8j+2q), d[4j+3] = (g+8, 8j+2q+1) with g = l/4, q = l%4 (the mma.sync
// m16n8 fragment repeated along N; PTX ISA figure "WGMMA .m64nNk16 register fragment
// layout for accumulator matrix D").
//
// Pipeline (S = 4 stages of 48 KB, all 256 threads copy and compute; no mbarriers):
//   prologue: copy tiles 0 and 1 (one cp.async group per tile, committed even when empty)
//   iteration kt:
//     cp.async.wait_group 1      this thread's chunks of tile kt have landed
//     fence.proxy.async          ... and are visible to the async proxy (wgmma reads shared
//                                memory through it; cp.async writes through the generic one)
//     __syncthreads              everyone's chunks of tile kt are in and fenced; everyone
//                                has passed the wgmma.wait_group 1 of iteration kt-1, so the
//                                MMAs of tile kt-2 are complete
//     copy tile kt+2 into stage (kt+2) % 4 = the stage of tile kt-2 (free, see above); commit
//     wgmma.fence; 4 x wgmma (k16 steps) on stage kt % 4; wgmma.commit_group
//     wgmma.wait_group 1         tile kt-1's MMAs done; tile kt's may still run while the
//                                next iteration waits for its data and issues its copies
//   Stages in use during iteration kt: kt-1 (MMAs may run), kt, kt+1, kt+2 (landing).
//   Consecutive wgmmas on the same accumulators need no wait between them (PTX: ordered for
//   the same shape and accumulator registers).
// ---------------------------------------------------------------------------------------

#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include "mbarrier.cuh"

#if !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "matmul_sm90.cu uses wgmma: compile it for sm_90a (Module(..., archs=(\"sm_90a\",)))"
#endif

#define V10_BM 128
#define V10_BN 256
#define V10_BK 64
#define V10_STAGES 4
#define V10_THREADS 256
#define V10_A_BYTES (V10_BM * V10_BK * 2)                      // 16 KB
#define V10_B_BYTES (V10_BK * V10_BN * 2)                      // 32 KB
#define V10_STAGE_BYTES (V10_A_BYTES + V10_B_BYTES)            // 48 KB, a multiple of 1024
#define V10_SMEM_BYTES (V10_STAGES * V10_STAGE_BYTES + 1024)   // + room to align the base
#define V10_GROUP_M 8  // grouped raster: 8 row-tiles share each sweep over N (L2 reuse)

static_assert(V10_STAGE_BYTES % 1024 == 0 && V10_A_BYTES % 1024 == 0, "stages must keep 1024-B alignment");

__device__ __forceinline__ unsigned v10_smem_u32(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void v10_cp_async16(unsigned dst, const void* src, int src_bytes) {
    // src_bytes 0: writes 16 zero bytes and reads nothing (the edges)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
                 : "memory");
}

__device__ __forceinline__ void v10_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

template <int N>
__device__ __forceinline__ void v10_cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void v10_fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

__device__ __forceinline__ void v10_wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }

__device__ __forceinline__ void v10_wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }

template <int N>
__device__ __forceinline__ void v10_wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Keeps the compiler from moving reads or writes of an accumulator across the asm
// statements around it (CUTLASS's warpgroup_fence_operand): the wgmma wait does not name
// the accumulator registers, so without this the epilogue's reads could be hoisted above it.
__device__ __forceinline__ void v10_fence_operand(float& r) { asm volatile("" : "+f"(r)::"memory"); }

// Shared-memory matrix descriptor, 128-byte swizzle (see the header for the fields).
__device__ __forceinline__ unsigned long long v10_desc(unsigned addr, unsigned lbo_bytes, unsigned sbo_bytes) {
    return static_cast<unsigned long long>((addr & 0x3FFFF) >> 4) |
           (static_cast<unsigned long long>((lbo_bytes >> 4) & 0x3FFF) << 16) |
           (static_cast<unsigned long long>((sbo_bytes >> 4) & 0x3FFF) << 32) | (1ull << 62);
}

#define V10_D8(i)                                                                                  \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
        "+f"(d[i + 6]), "+f"(d[i + 7])
#define V10_D128                                                                                   \
    V10_D8(0), V10_D8(8), V10_D8(16), V10_D8(24), V10_D8(32), V10_D8(40), V10_D8(48), V10_D8(56), \
        V10_D8(64), V10_D8(72), V10_D8(80), V10_D8(88), V10_D8(96), V10_D8(104), V10_D8(112), V10_D8(120)
// The accumulators' operand lists of wgmma m64nNk16 (N / 2 fp32 registers per thread):
// %0 .. %63, then up to %95 (N = 192) and %127 (N = 256).
#define V10_R0_63                                   \
    "{%0, %1, %2, %3, %4, %5, %6, %7, "             \
    "%8, %9, %10, %11, %12, %13, %14, %15, "        \
    "%16, %17, %18, %19, %20, %21, %22, %23, "      \
    "%24, %25, %26, %27, %28, %29, %30, %31, "      \
    "%32, %33, %34, %35, %36, %37, %38, %39, "      \
    "%40, %41, %42, %43, %44, %45, %46, %47, "      \
    "%48, %49, %50, %51, %52, %53, %54, %55, "      \
    "%56, %57, %58, %59, %60, %61, %62, %63"
#define V10_R64_95                                  \
    ", %64, %65, %66, %67, %68, %69, %70, %71, "    \
    "%72, %73, %74, %75, %76, %77, %78, %79, "      \
    "%80, %81, %82, %83, %84, %85, %86, %87, "      \
    "%88, %89, %90, %91, %92, %93, %94, %95"
#define V10_R96_127                                 \
    ", %96, %97, %98, %99, %100, %101, %102, %103, "   \
    "%104, %105, %106, %107, %108, %109, %110, %111, " \
    "%112, %113, %114, %115, %116, %117, %118, %119, " \
    "%120, %121, %122, %123, %124, %125, %126, %127"
#define V10_REGS128 V10_R0_63 V10_R64_95 V10_R96_127 "}"

#define V11_REGS64 V10_R0_63 "}"
#define V11_D64 V10_D8(0), V10_D8(8), V10_D8(16), V10_D8(24), V10_D8(32), V10_D8(40), V10_D8(48), V10_D8(56)
#define V14_REGS96 V10_R0_63 V10_R64_95 "}"
#define V14_D96 V11_D64, V10_D8(64), V10_D8(72), V10_D8(80), V10_D8(88)

// The k16 step of v10-v14: D[64 x BN] += A[64 x 16] B[16 x BN], the operands' major
// order as immediates (imm-trans-a, imm-trans-b; 16-bit types from shared memory take both):
// TA = 0 A K-major (row-major [M, K]), 1 M-major; TB = 0 B K-major ([N, K]), 1 N-major
// (row-major [K, N]). After the BN / 2 accumulators come the two descriptors, the scale-d
// predicate's source (1: accumulate), TA and TB.
#define SM90_WGMMA(SHAPE, TY, REGS, DL, IA, IB, IP, ITA, ITB)                                        \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" IP ", 0;\n"                                   \
                 "wgmma.mma_async.sync.aligned." SHAPE ".f32." TY "." TY " " REGS ", %" IA ", %" IB \
                 ", p, 1, 1, %" ITA ", %" ITB ";\n}\n"                                              \
                 : DL                                                                               \
                 : "l"(da), "l"(db), "r"(1), "n"(TA), "n"(TB))

template <int BN, bool BF16, int TA, int TB>
__device__ __forceinline__ void sm90_wgmma(float (&d)[BN / 2], unsigned long long da, unsigned long long db) {
    if constexpr (BN == 256) {
        if constexpr (BF16)
            SM90_WGMMA("m64n256k16", "bf16", V10_REGS128, V10_D128, "128", "129", "130", "131", "132");
        else
            SM90_WGMMA("m64n256k16", "f16", V10_REGS128, V10_D128, "128", "129", "130", "131", "132");
    } else if constexpr (BN == 192) {
        if constexpr (BF16)
            SM90_WGMMA("m64n192k16", "bf16", V14_REGS96, V14_D96, "96", "97", "98", "99", "100");
        else
            SM90_WGMMA("m64n192k16", "f16", V14_REGS96, V14_D96, "96", "97", "98", "99", "100");
    } else {
        static_assert(BN == 128, "wgmma widths here: 128, 192, 256");
        if constexpr (BF16)
            SM90_WGMMA("m64n128k16", "bf16", V11_REGS64, V11_D64, "64", "65", "66", "67", "68");
        else
            SM90_WGMMA("m64n128k16", "f16", V11_REGS64, V11_D64, "64", "65", "66", "67", "68");
    }
}

// Copy the k-tile at k0 into one stage: A tile at shared address sa, B tile at sb (both
// 1024-aligned). 256 threads; 16-byte chunks, zero-filled past M, N, K (K % 8 == 0 and
// N % 8 == 0: a chunk is entirely inside or entirely outside).
template <typename T>
__device__ __forceinline__ void v10_load_tile(const T* __restrict__ A, const T* __restrict__ B, unsigned sa,
                                              unsigned sb, int M, int N, int K, int m0, int n0, int k0) {
    const int t = threadIdx.x;
    // A: 128 rows x 8 chunks = 1024 chunks, 4 per thread; thread t takes chunk t % 8 of rows
    // t / 8 + 32h (8 consecutive threads read one 128-byte row segment: coalesced).
    const int ac = t % 8;
#pragma unroll
    for (int h = 0; h < 4; ++h) {
        const int r = t / 8 + 32 * h;
        const bool in = (m0 + r < M) && (k0 + ac * 8 < K);
        const T* g = in ? A + (long long)(m0 + r) * K + k0 + ac * 8 : A;
        v10_cp_async16(sa + r * 128 + ((ac ^ (r & 7)) << 4), g, in ? 16 : 0);
    }
    // B: 64 k-rows x 32 chunks = 2048 chunks, 8 per thread; thread t takes chunk t % 32 of
    // k-rows t / 32 + 8h (a warp reads one 512-byte row segment). Chunk nc lives in slab
    // nc / 8 (64 columns each) at swizzled position (nc % 8) ^ (kr % 8).
    const int nc = t % 32, nb = nc / 8, cb = nc % 8;
#pragma unroll
    for (int h = 0; h < 8; ++h) {
        const int kr = t / 32 + 8 * h;
        const bool in = (k0 + kr < K) && (n0 + nc * 8 < N);
        const T* g = in ? B + (long long)(k0 + kr) * N + n0 + nc * 8 : B;
        v10_cp_async16(sb + nb * 8192 + kr * 128 + ((cb ^ (kr & 7)) << 4), g, in ? 16 : 0);
    }
}

__device__ __forceinline__ void v10_store2(__nv_bfloat16* p, float x, float y) {
    *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(x, y);
}
__device__ __forceinline__ void v10_store2(__half* p, float x, float y) {
    *reinterpret_cast<__half2*>(p) = __floats2half2_rn(x, y);
}

template <typename T, bool BF16>
__device__ __forceinline__ void v10_body(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C,
                                         int M, int N, int K) {
    const long long bz = blockIdx.z;
    A += bz * (long long)M * K;
    B += bz * (long long)K * N;
    C += bz * (long long)M * N;

    extern __shared__ __align__(1024) unsigned char v10_smem[];
    // The 128-byte swizzle needs 1024-byte aligned atoms: round the base up ourselves
    // rather than trust the dynamic shared memory base's alignment (1 KB extra is allocated).
    const unsigned smem0 = (v10_smem_u32(v10_smem) + 1023u) & ~1023u;

    const int t = threadIdx.x;
    const int wg = t / 128;              // warpgroup: rows 64*wg .. 64*wg+63 of the block tile
    const int warp = (t % 128) / 32;     // warp within the warpgroup: 16 of those rows
    const int lane = t % 32;

    // Grouped raster (Triton's GROUP_M): consecutive blocks walk down V10_GROUP_M row-tiles
    // before moving right, so blocks resident together share A row panels and B column
    // panels in L2 (at 8192^3 B alone is 128 MB, more than the 50 MB L2).
    const int tiles_n = gridDim.x, tiles_m = gridDim.y;
    const int pid = blockIdx.y * tiles_n + blockIdx.x;
    const int per_group = V10_GROUP_M * tiles_n;
    const int first_m = (pid / per_group) * V10_GROUP_M;
    const int group_m = min(tiles_m - first_m, V10_GROUP_M);
    const int m0 = (first_m + (pid % per_group) % group_m) * V10_BM;
    const int n0 = ((pid % per_group) / group_m) * V10_BN;

    float acc[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) acc[i] = 0.f;

    const int ktiles = (K + V10_BK - 1) / V10_BK;

    // Prologue: tiles 0 .. S-3 (= 0, 1). One commit per tile slot, even when empty, so that
    // "at most one group pending" always means "tile kt has landed".
#pragma unroll
    for (int s = 0; s < V10_STAGES - 2; ++s) {
        if (s < ktiles) {
            const unsigned st = smem0 + s * V10_STAGE_BYTES;
            v10_load_tile<T>(A, B, st, st + V10_A_BYTES, M, N, K, m0, n0, s * V10_BK);
        }
        v10_cp_async_commit();
    }

    for (int kt = 0; kt < ktiles; ++kt) {
        v10_cp_async_wait<V10_STAGES - 3>();  // my chunks of tile kt landed (kt+1 may be pending)
        v10_fence_proxy_async();              // generic-proxy writes -> visible to wgmma
        __syncthreads();                      // all chunks of kt in; all MMAs of kt-2 complete
        const int pf = kt + V10_STAGES - 2;   // prefetch into the stage tile kt-2 used
        if (pf < ktiles) {
            const unsigned st = smem0 + (pf % V10_STAGES) * V10_STAGE_BYTES;
            v10_load_tile<T>(A, B, st, st + V10_A_BYTES, M, N, K, m0, n0, pf * V10_BK);
        }
        v10_cp_async_commit();

        const unsigned sa = smem0 + (kt % V10_STAGES) * V10_STAGE_BYTES + wg * 64 * 128;
        const unsigned sb = smem0 + (kt % V10_STAGES) * V10_STAGE_BYTES + V10_A_BYTES;
        v10_wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < V10_BK / 16; ++kk) {
            const unsigned long long da = v10_desc(sa + kk * 32, 16, 1024);
            const unsigned long long db = v10_desc(sb + kk * 16 * 128, 8192, 1024);
            sm90_wgmma<256, BF16, 0, 1>(acc, da, db);
        }
        v10_wgmma_commit();
        v10_wgmma_wait<1>();
    }
    v10_wgmma_wait<0>();
    v10_cp_async_wait<0>();  // only empty groups can be left; no copy may outlive the block
#pragma unroll
    for (int i = 0; i < 128; ++i) v10_fence_operand(acc[i]);

    // Epilogue: fp32 -> T, straight from the fragment (see the header): 2 adjacent columns per
    // store. N % 8 == 0 and col is even, so col < N implies col + 1 < N.
    const int g = lane / 4, q = lane % 4;
    const int row0 = m0 + wg * 64 + warp * 16 + g;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
        const int col = n0 + j * 8 + 2 * q;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = row0 + 8 * h;
            if (row < M && col < N) v10_store2(C + (long long)row * N + col, acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
        }
    }
}

extern "C" __global__ void __launch_bounds__(V10_THREADS, 1)
    matmul_v10_bf16(const __nv_bfloat16* __restrict__ A, const __nv_bfloat16* __restrict__ B,
                    __nv_bfloat16* __restrict__ C, int M, int N, int K) {
    v10_body<__nv_bfloat16, true>(A, B, C, M, N, K);
}

extern "C" __global__ void __launch_bounds__(V10_THREADS, 1)
    matmul_v10_f16(const __half* __restrict__ A, const __half* __restrict__ B, __half* __restrict__ C, int M,
                   int N, int K) {
    v10_body<__half, false>(A, B, C, M, N, K);
}

// ======================================================================================= v11
//
// v11: v10's MMAs (m64nBNk16 from the same 128-byte-swizzled tiles, the same descriptors),
// fed the way CUTLASS's sm90 warp-specialized kernels and FlashAttention-3 feed them.
//
// What holds v10 back (71-77% of cuBLAS): all 256 threads both copy and compute. Per k-tile
// each thread issues 24 cp.async with their address and bounds arithmetic, and a
// __syncthreads ties the two warpgroups together every k-tile, so a late warp stalls both
// and the tensor cores idle while the copies are issued. Each block also fills its pipeline
// from empty and drains it for its epilogue (one block per output tile).
//
// Block: 384 threads = producer warpgroup (threads 0..127) + two consumer warpgroups
// (128..383; consumer cw owns rows 64cw..64cw+63 of the 128-row tile, all BN columns).
//   producer  setmaxnreg.dec 40; one thread issues per k-tile one TMA box of A (64 k x 128
//             m = the 16 KB A tile) and BN/64 boxes of B (64 n x 64 k = one 8 KB slab each),
//             after an mbarrier.arrive.expect_tx of the stage's bytes on the stage's full
//             barrier. The tensor maps carry the 128-byte swizzle, so the boxes land exactly
//             in v10's layouts (a box's rows are 128 bytes, written row-major from a
//             1024-aligned address and swizzled on address bits: chunk c of row r at c ^ (r % 8)).
//             Out-of-bounds elements (M, N, K edges, the batch's end) arrive as zeros and
//             still count toward the transaction bytes: no edge case in the kernel.
//   consumers setmaxnreg.inc 232 (128 x 40 + 256 x 232 = 64512 = 384 x 168, the registers the
//             block is launched with); per k-tile: wait for the stage's full barrier, wgmma.fence,
//             4 x wgmma (k16 steps), commit, wgmma.wait_group 1 (the previous k-tile's group
//             is done, this one runs on), then each warp releases the previous k-tile's stage
//             (one arrival per warp on its empty barrier, count 8).
//
// Ordering (why no fence.proxy.async in the main loop): TMA writes shared memory through the
// async proxy and wgmma reads it through the async proxy; the full barrier's transaction
// count completes only once the bytes are written, and a consumer's try_wait on it acquires
// them. In the other direction, a stage is released only after wgmma.wait_group says the
// MMAs reading it are complete, and the producer waits on that empty barrier before the next
// TMA overwrites it. wgmma.fence orders the accumulator registers (zeroed by ordinary
// instructions at the start of each tile) before the first wgmma that reads them.
//
// Phases (the mbarrier parity bookkeeping): the producer and both consumers walk the same
// sequence of (tile, k-tile) pairs, counted by one running index `it` that does not restart
// at tile boundaries. Stage s = it % S is used by it = s, s + S, s + 2S, ...; use number
// r = it / S completes phase r of full[s] (parity r & 1) once its bytes land, and phase r of
// empty[s] once the 8 consumer warps released it. So consumers wait full[s] with parity
// (it / S) & 1, and the producer, before reusing stage s for it >= S, waits empty[s] with
// parity (it / S - 1) & 1. Every use is released exactly once (k-tiles 0..n-2 inside the
// loop, the last after wait_group 0), so the counts never drift across tiles.
//
// Persistent schedule: grid = min(SMs, tiles); block b takes tiles b, b + grid, ... of the
// batch-major, grouped order (tile t: batch t / per_batch, then v10's GROUP_M = 8 raster:
// 8 row-tiles share each sweep over N, so the ~132 blocks at work at once read a few row
// panels of A and column panels of B from L2). The producer starts the next tile's k-tiles
// as soon as stages free up, so the next tile's first S k-tiles land during the epilogue.
//
// Napkin math (H100 SXM, bf16, 128x256 tiles): a k-tile is 128 x 256 x 64 x 2 = 4.2 MFLOP,
// ~1000 cycles at ~4096 dense FLOP per cycle per SM, against 48 KB of TMA traffic (5 copy
// instructions from one thread instead of 6144 cp.async). At 4096^3 a tile is 64 k-tiles
// (~65k cycles); its epilogue (64 two-element stores per consumer thread, 64 KB per tile)
// is a few percent and overlaps the producer's loads of the next tile. Shared memory: 4
// stages x 48 KB + 1 KB alignment = 193 KB of 227. 128x128 tiles (BN = 128): 6 stages x 32 KB.
//
// Epilogue: fp32 -> 16-bit from the accumulator fragment straight to global memory (v10's,
// bounds-checked per row and per column pair), then the next tile's accumulators are zeroed.
//
// Contract: A [batch, M, K], B [batch, K, N], C [batch, M, N] contiguous, fp16 or bf16,
// M, N, K >= 1, K % 8 == 0 and N % 8 == 0 (row strides of whole 16-byte units, what TMA
// requires), 16-byte aligned bases: the launcher (cuda.py, _launch_v11) pads or copies
// otherwise, returns zeros for K = 0, and builds the tensor maps: A dims (K, M, batch), box
// (64, 128, 1); B dims (N, K, batch), box (64, 64, 1); both 128-byte swizzled.

// A CUtensorMap (cuda.h's, 128 bytes, 64-byte aligned; the same struct as attention_sm90.cu's):
// built on the host by cuTensorMapEncodeTiled and passed by value as a __grid_constant__
// kernel parameter, which TMA instructions address directly.
struct alignas(64) TensorMap {
    unsigned long long opaque[16];
};

#define V11_BM 128
#define V11_BK 64
#define V11_THREADS 384
#define V11_GROUP_M 8

template <int BN>
struct V11Tile {
    static constexpr int STAGES = BN == 128 ? 6 : 4;  // 4 x 48 KB (256), 4 x 40 KB (192), 6 x 32 KB
    static constexpr int SLABS = BN / 64;                     // 64-column slabs of the B tile
    static constexpr unsigned A_BYTES = V11_BM * V11_BK * 2;  // 16 KB
    static constexpr unsigned SLAB_BYTES = V11_BK * 64 * 2;   // 8 KB: 64 k-rows x 128 bytes
    static constexpr unsigned B_BYTES = SLABS * SLAB_BYTES;   // 32 KB (BN = 256), 24 KB (192), 16 KB (128)
    static constexpr unsigned STAGE_BYTES = A_BYTES + B_BYTES;
    static constexpr unsigned SMEM_BYTES = STAGES * STAGE_BYTES + 1024;  // + room to align the base
    static_assert(BN == 256 || BN == 192 || BN == 128, "tiles are 128x256, 128x192 (v14) or 128x128");
    static_assert(STAGE_BYTES % 1024 == 0 && A_BYTES % 1024 == 0, "stages must keep 1024-B alignment");
    static_assert(SMEM_BYTES <= 227 * 1024, "more shared memory than a block may have");
};

// The launcher passes the dynamic shared memory the tile needs (cuda.py, DYN_SHARED); a block
// given less traps rather than write past it.
__device__ __forceinline__ void v11_check_smem(unsigned need) {
    unsigned have;
    asm volatile("mov.u32 %0, %%dynamic_smem_size;\n" : "=r"(have));
    if (have < need) __trap();
}

// Box (c0, c1, c2) (innermost first) of a 3-D tensor map into shared memory at dst, completing
// `bar` with the box's bytes (TMA; zeros where the box leaves the tensor).
__device__ __forceinline__ void v11_tma_load_3d(unsigned dst, const TensorMap* map, unsigned bar, int c0, int c1,
                                                int c2) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], "
        "[%2];\n" ::"r"(dst),
        "l"(reinterpret_cast<unsigned long long>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2)
        : "memory");
}

// v15's cluster primitives (two blocks of a thread-block cluster, see the v15 header): the
// block's rank, the same shared-memory offset in the other block (a shared::cluster
// address), an arrival on a barrier there, a barrier of both blocks' threads, and a TMA
// load written to the same offset of every block in `mask` (each block's barrier at `bar`
// gets its own bytes).
__device__ __forceinline__ unsigned v15_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}
__device__ __forceinline__ unsigned v15_peer(unsigned addr, unsigned rank) {
    unsigned r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(addr), "r"(rank));
    return r;
}
// The remote arrival and the producer's wait keep mbarrier's default semantics (release /
// acquire at CTA scope), as CUTLASS's cluster pipelines do: what they order is the
// consumers' wgmma reads (complete at wgmma.wait_group) before the other block's TMA writes.
__device__ __forceinline__ void v15_arrive_remote(unsigned cluster_addr) {
    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(cluster_addr) : "memory");
}
__device__ __forceinline__ void v15_cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void v15_tma_load_mc(unsigned dst, const TensorMap* map, unsigned bar, int c0, int c1,
                                                int c2, unsigned short mask) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster "
        "[%0], [%1, {%3, %4, %5}], [%2], %6;\n" ::"r"(dst),
        "l"(reinterpret_cast<unsigned long long>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "h"(mask)
        : "memory");
}

// The persistent schedule: output tile t -> (m0, n0, batch), batch-major, grouped raster
// inside a batch (see the v11 header); BM rows a tile (v15: a cluster's two 128-row tiles).
template <int BN, int BM = V11_BM>
struct V11Sched {
    int tiles_m, tiles_n, per_batch, total;
    __device__ __forceinline__ V11Sched(int M, int N, int batch) {
        tiles_m = (M + BM - 1) / BM;
        tiles_n = (N + BN - 1) / BN;
        per_batch = tiles_m * tiles_n;
        total = per_batch * batch;  // the launcher keeps it below 2^31
    }
    __device__ __forceinline__ void tile(int t, int& m0, int& n0, int& z) const {
        z = t / per_batch;
        const int r = t - z * per_batch;
        const int per_group = V11_GROUP_M * tiles_n;
        const int first_m = (r / per_group) * V11_GROUP_M;
        const int group_m = min(tiles_m - first_m, V11_GROUP_M);
        const int in = r - (r / per_group) * per_group;
        m0 = (first_m + in % group_m) * BM;
        n0 = (in / group_m) * BN;
    }
};

// The mbarrier ring's barriers: full[0..S) (count 1: the producer's arrive.expect_tx, plus
// the bytes) and empty[0..S) (count: one arrival per consumer warp that reads each stage,
// 8 in v11 where both warpgroups read every stage, 4 in v12 where one does). Initialized by
// thread 0 before the block's __syncthreads.
template <int S>
__device__ __forceinline__ void v11_init_ring(unsigned full0, unsigned empty0, unsigned empty_count) {
    if (threadIdx.x == 0) {
        for (int s = 0; s < S; ++s) {
            mbar_init(full0 + 8 * s, 1);
            mbar_init(empty0 + 8 * s, empty_count);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
}

// A's box of k-tile kt for the tile at row m0 into the stage at st: one box of 64 k x 128 m
// stored [M, K]; stored [K, M] (v14), two slabs of 64 m x 64 k, one per consumer warpgroup.
template <int BN, bool AT>
__device__ __forceinline__ void v11_load_a(unsigned st, const TensorMap* ta, unsigned bar, int m0, int kt, int z) {
    if constexpr (AT) {
        v11_tma_load_3d(st, ta, bar, m0, kt * V11_BK, z);
        v11_tma_load_3d(st + V11Tile<BN>::A_BYTES / 2, ta, bar, m0 + 64, kt * V11_BK, z);
    } else {
        v11_tma_load_3d(st, ta, bar, kt * V11_BK, m0, z);
    }
}

// The producer thread (thread 0 after setmaxnreg.dec): every k-tile of the block's tiles
// (t = blockIdx.x, blockIdx.x + gridDim.x, ...) in order, one running index `it` across
// tiles (the phase bookkeeping in the v11 header). v11's consumers read every k-tile; v12's
// warpgroups read alternate tiles of this same sequence.
// With MC = 2 (v15, a two-block cluster; see the v15 header): the cluster's tile pairs (pair
// = the cluster's index, then + the clusters), this block's 128 rows of A into its own ring,
// and its half of the pair's B tile into both blocks' rings at once (multicast): B stored
// [N, K] by n-rows (BN / 2 of them), B stored [K, N] by k-rows (32 of each 64-column slab's
// 64). A stage is refilled once the consumers of both blocks have released it (empty counts
// 16); at the end the producer waits for the last releases of every stage, so that no copy
// or arrival of the other block targets this block's shared memory after it exits.
// v14's K slices (v14_ks_body): `group` blocks share each tile (t = blockIdx.x / group) and
// this block copies the tile's k-tiles kt0 .. kt0 + ktiles - 1.
template <int BN, bool AT = false, bool BT = false, int MC = 1>
__device__ __forceinline__ void v11_produce(const TensorMap* ta, const TensorMap* tb,
                                            const V11Sched<BN, V11_BM * MC>& sched, int ktiles, unsigned smem0,
                                            unsigned full0, unsigned empty0, unsigned rank = 0, int kt0 = 0,
                                            int group = MC) {
    using Tile = V11Tile<BN>;
    constexpr int S = Tile::STAGES;
    // the maps' descriptors into the TMA unit's cache before the first copy needs them
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<unsigned long long>(ta)) : "memory");
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<unsigned long long>(tb)) : "memory");
    int it = 0;
    for (int t = blockIdx.x / group; t < sched.total; t += gridDim.x / group) {
        int m0, n0, z;
        sched.tile(t, m0, n0, z);
        if constexpr (MC == 2) m0 += rank * V11_BM;  // this block's half of the pair
        for (int kt = kt0; kt < kt0 + ktiles; ++kt, ++it) {
            const int s = it % S;
            if (it >= S) mbar_wait(empty0 + 8 * s, (it / S - 1) & 1);  // use it - S released (by both blocks: v15)
            const unsigned st = smem0 + s * Tile::STAGE_BYTES, bar = full0 + 8 * s;
            mbar_expect_tx(bar, Tile::STAGE_BYTES);  // (v15: A, this block's half of B and the other's)
            v11_load_a<BN, AT>(st, ta, bar, m0, kt, z);
            if constexpr (MC == 2) {
                if constexpr (BT) {
                    v15_tma_load_mc(st + Tile::A_BYTES + rank * (BN / 2) * 128, tb, bar, kt * V11_BK,
                                    n0 + rank * (BN / 2), z, 3);
                } else {
#pragma unroll
                    for (int j = 0; j < Tile::SLABS; ++j)
                        v15_tma_load_mc(st + Tile::A_BYTES + j * Tile::SLAB_BYTES + rank * 32 * 128, tb, bar,
                                        n0 + 64 * j, kt * V11_BK + 32 * rank, z, 3);
                }
            } else if constexpr (BT) {  // v14, B stored [N, K]: one box of 64 k x BN n (BN rows of 128 bytes)
                v11_tma_load_3d(st + Tile::A_BYTES, tb, bar, kt * V11_BK, n0, z);
            } else {
#pragma unroll
                for (int j = 0; j < Tile::SLABS; ++j)
                    v11_tma_load_3d(st + Tile::A_BYTES + j * Tile::SLAB_BYTES, tb, bar, n0 + 64 * j, kt * V11_BK, z);
            }
        }
    }
    if constexpr (MC == 2)
        for (int u = it > S ? it - S : 0; u < it; ++u) mbar_wait(empty0 + 8 * (u % S), (u / S) & 1);
}

// One output tile's mainloop in a v11 / v13 consumer warpgroup (rows 64cw .. 64cw+63):
// acc = the tile's A B over `ktiles` k-tiles of the ring, `it` the block's running k-tile
// count (its stage and phase); each warp hands a stage back to the producer (one arrival on
// its empty barrier) once the MMAs that read it are complete.
template <int BN, bool BF16, bool AT = false, bool BT = false, int MC = 1>
__device__ __forceinline__ void v11_mainloop(float (&acc)[BN / 2], int ktiles, int& it, unsigned smem0,
                                             unsigned full0, unsigned empty0, int cw, int lane,
                                             unsigned peer_empty0 = 0) {
    using Tile = V11Tile<BN>;
    constexpr int S = Tile::STAGES;
    auto release = [&](int used) {  // this warp is done with the stage of k-tile `used`
        __syncwarp();
        if (lane == 0) {
            mbar_arrive(empty0 + 8 * (used % S));
            if constexpr (MC == 2) v15_arrive_remote(peer_empty0 + 8 * (used % S));  // (v15)
        }
    };
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;
    for (int kt = 0; kt < ktiles; ++kt, ++it) {
        const int s = it % S;
        mbar_wait(full0 + 8 * s, (it / S) & 1);
        const unsigned sa = smem0 + s * Tile::STAGE_BYTES + cw * 64 * 128;
        const unsigned sb = smem0 + s * Tile::STAGE_BYTES + Tile::A_BYTES;
        v10_wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < V11_BK / 16; ++kk) {
            // K-major: 32 bytes further along the swizzled 128-byte rows per k16 step; MN-major
            // (v11's B, v14's A stored [K, M]): 16 k-rows = 2 KB further (see the v14 header)
            const unsigned long long da =
                AT ? v10_desc(sa + kk * 16 * 128, 8192, 1024) : v10_desc(sa + kk * 32, 16, 1024);
            const unsigned long long db =
                BT ? v10_desc(sb + kk * 32, 16, 1024) : v10_desc(sb + kk * 16 * 128, Tile::SLAB_BYTES, 1024);
            sm90_wgmma<BN, BF16, AT ? 1 : 0, BT ? 0 : 1>(acc, da, db);
        }
        v10_wgmma_commit();
        v10_wgmma_wait<1>();  // k-tile it-1's MMAs are complete: its stage may be refilled
        if (kt > 0) release(it - 1);
    }
    v10_wgmma_wait<0>();
    if (ktiles > 0) release(it - 1);
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) v10_fence_operand(acc[i]);
}

template <typename T, bool BF16, int BN>
__device__ __forceinline__ void v11_body(const TensorMap* ta, const TensorMap* tb, T* __restrict__ C, int M, int N,
                                         int K, int batch) {
    using Tile = V11Tile<BN>;
    constexpr int S = Tile::STAGES;
    extern __shared__ __align__(1024) unsigned char v11_smem[];
    __shared__ __align__(8) unsigned long long v11_bars[2 * S];  // full[0..S), empty[0..S)
    v11_check_smem(Tile::SMEM_BYTES);
    const unsigned smem0 = (v10_smem_u32(v11_smem) + 1023u) & ~1023u;
    const unsigned full0 = v10_smem_u32(&v11_bars[0]), empty0 = v10_smem_u32(&v11_bars[S]);
    const int tid = threadIdx.x;
    v11_init_ring<S>(full0, empty0, 8);  // empty: one arrival per consumer warp

    const V11Sched<BN> sched(M, N, batch);
    const int ktiles = (K + V11_BK - 1) / V11_BK;

    if (tid < 128) {  // producer warpgroup: one thread issues every copy, the rest retire
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
        if (tid == 0) v11_produce<BN>(ta, tb, sched, ktiles, smem0, full0, empty0);
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");

    const int cw = tid / 128 - 1;  // consumer warpgroup: rows 64cw .. 64cw+63 of the tile
    const int warp = (tid % 128) / 32, lane = tid % 32;
    const int g = lane / 4, q = lane % 4;
    float acc[BN / 2];
    int it = 0;
    for (int t = blockIdx.x; t < sched.total; t += gridDim.x) {
        int m0, n0, z;
        sched.tile(t, m0, n0, z);
        v11_mainloop<BN, BF16>(acc, ktiles, it, smem0, full0, empty0, cw, lane);

        // Epilogue (v10's): 2 adjacent columns per store; N % 8 == 0 and col is even, so
        // col < N implies col + 1 < N.
        T* Cz = C + (long long)z * M * N;
        const int row0 = m0 + cw * 64 + warp * 16 + g;
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
            const int col = n0 + j * 8 + 2 * q;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = row0 + 8 * h;
                if (row < M && col < N)
                    v10_store2(Cz + (long long)row * N + col, acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
            }
        }
    }
}

#define V11_ARGS(T)                                                                                         \
    const __grid_constant__ TensorMap ta, const __grid_constant__ TensorMap tb, T *__restrict__ C, int M, int N, \
        int K, int batch

// 128x256 tiles (the default) and 128x128 tiles (small grids; cuda.py, v11_block_n).
extern "C" __global__ void __launch_bounds__(V11_THREADS, 1) matmul_v11_bf16(V11_ARGS(__nv_bfloat16)) {
    v11_body<__nv_bfloat16, true, 256>(&ta, &tb, C, M, N, K, batch);
}
extern "C" __global__ void __launch_bounds__(V11_THREADS, 1) matmul_v11_f16(V11_ARGS(__half)) {
    v11_body<__half, false, 256>(&ta, &tb, C, M, N, K, batch);
}
extern "C" __global__ void __launch_bounds__(V11_THREADS, 1) matmul_v11_n128_bf16(V11_ARGS(__nv_bfloat16)) {
    v11_body<__nv_bfloat16, true, 128>(&ta, &tb, C, M, N, K, batch);
}
extern "C" __global__ void __launch_bounds__(V11_THREADS, 1) matmul_v11_n128_f16(V11_ARGS(__half)) {
    v11_body<__half, false, 128>(&ta, &tb, C, M, N, K, batch);
}

// ======================================================================================= v12
//
// v12: v11's producer, TMA boxes and mbarrier ring with CUTLASS's sm90 "ping-pong" consumer
// schedule (KernelTmaWarpSpecializedPingpong).
//
// What holds v11 back: both consumer warpgroups work on the same tile, so they run its
// epilogue (fp32 -> 16-bit, global stores) at the same moment and the tensor cores idle
// until the next tile's first MMAs issue. v12 gives each consumer warpgroup whole tiles of
// its own, alternately: of the block's tiles t_0, t_1, t_2, ... (v11's persistent schedule),
// warpgroup 0 computes t_0, t_2, ... and warpgroup 1 t_1, t_3, ...; one warpgroup's epilogue
// runs while the other's mainloop keeps the tensor cores busy:
//     WG0: [mainloop t_0] epilogue t_0              [mainloop t_2] epilogue t_2 ...
//     WG1:                [mainloop t_1] epilogue t_1              [mainloop t_3] ...
//
// Tile: 128x128 per warpgroup (a 128x256 tile would need 256 fp32 accumulators per thread,
// more than the 232 registers setmaxnreg gives): per k16 step two wgmma m64n128k16, rows
// 0..63 and 64..127 of the A tile against the same B slab pair, into acc[0] and acc[1] (64
// fp32 each, 128 per thread as in v11). A k-tile is exactly v11's 128x128 form (A box 64 k x
// 128 m, two B boxes of 64 n x 64 k; 32 KB, 6 stages), so the producer is v11_produce<128>
// unchanged: it walks the block's tiles in order, which is the order the warpgroups take
// them in turn. Napkin math (H100 SXM, bf16): a 128x128x64 k-tile is 2.1 MFLOP, ~512 cycles
// at ~4096 FLOP per cycle per SM, for 32 KB of TMA traffic (32 MACs per byte against
// v11's 43 at 128x256: more L2 traffic per output, the price of a tile that fits one
// warpgroup's registers; wgmma's shared-memory reads rise too, 6 KB per 131k MACs of
// m64n128k16 against 10 KB per 262k of m64n256k16: ~96 of the SM's 128 bytes per cycle at
// the tensor peak of ~2048 MACs per cycle, against ~80). At K = 4096 a tile's mainloop is
// 64 k-tiles, ~33k cycles; its epilogue (64 4-byte stores per thread, 32 KB) is ~1-2k
// cycles and now hides entirely under the other warpgroup's mainloop.
//
// Turns: named barrier V12_PP_BAR + w (ids 1, 2; 0 is __syncthreads') is warpgroup w's turn
// at the tensor cores, as in attention_sm90.cu's v6: warpgroup w bar.syncs on it (128
// threads) before its tile's first wgmma, and the other warpgroup bar.arrives on it (128
// more: count 256) once it has issued its own tile's last wgmma. The block has T tiles
// (T = ceil((total - blockIdx.x) / gridDim.x)); turn i (i = 0 .. T-1) is tile t_i, taken by
// warpgroup i % 2. Warpgroup 1 arrives on warpgroup 0's barrier once at the start if T >= 1
// (0 goes first), and the owner of turn i arrives on the other's barrier after it iff
// i + 1 < T. So every bar.sync (one per turn) meets exactly one bar.arrive, warpgroup 1
// with no tile (T = 1) only makes the first arrival, and no barrier phase is left half full
// at exit, whatever T's parity. Arrivals never run ahead: the other warpgroup arrives on
// barrier w again only after its own turn, which came after w's previous sync.
//
// Phases: tile t_i's k-tiles have running indices i * ktiles + kt, as in the producer; a
// warpgroup skips the other's indices. Waiting on full[s] with parity (it / S) & 1 is
// correct only if the barrier is not two phases behind (an older use of the stage still
// landing would look like this one). The turns give that: warpgroup w starts turn i after
// the other warpgroup issued all of turn i-1's MMAs, each after its full wait, and the
// turns before were w's own; so every older use of every stage has landed. The barrier
// cannot run a phase ahead either: its next use needs this warpgroup's release first. Only
// the owner reads a stage: empty barriers count 4 arrivals (its warps), and the producer's
// waits are v11's.
//
// Hand-over: a warpgroup arrives on the other's turn right after its last k-tile's
// wgmma.wait_group 1, with that k-tile's MMAs (~512 cycles of tensor work) still queued:
// the other warpgroup, already waiting at bar.sync with its first stages landed, issues
// its MMAs behind them. Then wait_group 0, release, epilogue (v11's, per 64-row half).
#define V12_PP_BAR 1
#define V12_PP_COUNT 256

__device__ __forceinline__ void v12_turn_sync(int id) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(V12_PP_COUNT) : "memory");
}
__device__ __forceinline__ void v12_turn_arrive(int id) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(V12_PP_COUNT) : "memory");
}

template <typename T, bool BF16>
__device__ __forceinline__ void v12_body(const TensorMap* ta, const TensorMap* tb, T* __restrict__ C, int M, int N,
                                         int K, int batch) {
    constexpr int BN = 128;
    using Tile = V11Tile<BN>;
    constexpr int S = Tile::STAGES;
    extern __shared__ __align__(1024) unsigned char v12_smem[];
    __shared__ __align__(8) unsigned long long v12_bars[2 * S];  // full[0..S), empty[0..S)
    v11_check_smem(Tile::SMEM_BYTES);
    const unsigned smem0 = (v10_smem_u32(v12_smem) + 1023u) & ~1023u;
    const unsigned full0 = v10_smem_u32(&v12_bars[0]), empty0 = v10_smem_u32(&v12_bars[S]);
    const int tid = threadIdx.x;
    v11_init_ring<S>(full0, empty0, 4);  // empty: one arrival per warp of the stage's owner

    const V11Sched<BN> sched(M, N, batch);
    const int ktiles = (K + V11_BK - 1) / V11_BK;

    if (tid < 128) {  // producer warpgroup: one thread issues every copy, the rest retire
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
        if (tid == 0) v11_produce<BN>(ta, tb, sched, ktiles, smem0, full0, empty0);
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");

    const int cw = tid / 128 - 1;  // consumer warpgroup: the block's tiles cw, cw + 2, ...
    const int warp = (tid % 128) / 32, lane = tid % 32;
    const int g = lane / 4, q = lane % 4;
    const int mine = V12_PP_BAR + cw, other = V12_PP_BAR + 1 - cw;
    // the block's tile count (blockIdx.x < total: the launcher's grid is min(SMs, tiles))
    const int n_tiles = blockIdx.x < sched.total ? (sched.total - blockIdx.x + gridDim.x - 1) / gridDim.x : 0;
    auto release = [&](int used) {  // this warp is done with the stage of k-tile `used`
        __syncwarp();
        if (lane == 0) mbar_arrive(empty0 + 8 * (used % S));
    };
    if (cw == 1 && n_tiles > 0) v12_turn_arrive(other);  // warpgroup 0 takes the first turn
    float acc[2][BN / 2];
    for (int i = cw; i < n_tiles; i += 2) {
        int m0, n0, z;
        sched.tile(blockIdx.x + i * gridDim.x, m0, n0, z);
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int r = 0; r < BN / 2; ++r) acc[h][r] = 0.f;
        int it = i * ktiles;
        v12_turn_sync(mine);  // turn i: the tensor cores are this warpgroup's
        for (int kt = 0; kt < ktiles; ++kt, ++it) {
            const int s = it % S;
            mbar_wait(full0 + 8 * s, (it / S) & 1);
            const unsigned sa = smem0 + s * Tile::STAGE_BYTES;
            const unsigned sb = sa + Tile::A_BYTES;
            v10_wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < V11_BK / 16; ++kk) {
                const unsigned long long db = v10_desc(sb + kk * 16 * 128, Tile::SLAB_BYTES, 1024);
#pragma unroll
                for (int h = 0; h < 2; ++h)  // rows 64h .. 64h+63 of the tile
                    sm90_wgmma<128, BF16, 0, 1>(acc[h], v10_desc(sa + h * 64 * 128 + kk * 32, 16, 1024), db);
            }
            v10_wgmma_commit();
            v10_wgmma_wait<1>();  // k-tile it-1's MMAs are complete: its stage may be refilled
            if (kt > 0) release(it - 1);
        }
        if (i + 1 < n_tiles) v12_turn_arrive(other);  // turn i + 1 is the other warpgroup's
        v10_wgmma_wait<0>();
        if (ktiles > 0) release(it - 1);
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int r = 0; r < BN / 2; ++r) v10_fence_operand(acc[h][r]);

        // Epilogue (v11's, per 64-row half): 2 adjacent columns per store; N % 8 == 0 and
        // col is even, so col < N implies col + 1 < N.
        T* Cz = C + (long long)z * M * N;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row0 = m0 + h * 64 + warp * 16 + g;
#pragma unroll
            for (int j = 0; j < BN / 8; ++j) {
                const int col = n0 + j * 8 + 2 * q;
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int row = row0 + 8 * e;
                    if (row < M && col < N)
                        v10_store2(Cz + (long long)row * N + col, acc[h][4 * j + 2 * e], acc[h][4 * j + 2 * e + 1]);
                }
            }
        }
    }
}

// 128x128 tiles per consumer warpgroup, two in flight per block (cuda.py, _launch_v12).
extern "C" __global__ void __launch_bounds__(V11_THREADS, 1) matmul_v12_bf16(V11_ARGS(__nv_bfloat16)) {
    v12_body<__nv_bfloat16, true>(&ta, &tb, C, M, N, K, batch);
}
extern "C" __global__ void __launch_bounds__(V11_THREADS, 1) matmul_v12_f16(V11_ARGS(__half)) {
    v12_body<__half, false>(&ta, &tb, C, M, N, K, batch);
}

// ======================================================================================= v13
//
// v13: v11 (producer, ring, persistent schedule, both tile widths, MMAs unchanged) with the
// epilogue through shared memory and TMA stores, as CUTLASS's sm90 TMA epilogues do.
//
// What holds v11 back: its epilogue stores C straight from the accumulator fragment, 64
// scattered 4-byte global stores per consumer thread per 128x256 tile (each warp's store
// touches 8 rows x 16 bytes), bounds-checked; the consumer warpgroups issue all of them
// before the next tile's first MMA, so the tensor cores idle for the whole store. v13 moves
// the tile through shared memory: the consumers convert and write it with conflict-free
// 4-byte st.shared, and one thread per warpgroup hands it to the TMA unit
// (cp.async.bulk.tensor ... .bulk_group), which drains it to global memory while the next
// tile's mainloop runs. TMA clips the boxes at the M and N edges (the C map's dims are the
// output's), so the epilogue has no bounds checks.
//
// Shared memory (napkin math, bytes): the whole 128x256 bf16 C tile is 64 KB, and v11's 4
// stages x 48 KB + 1 KB alignment = 193 KB; 193 + 64 = 257 KB is over the 227 KB a block
// may have. Two ways out: 3 stages (144 + 64 + 1 = 209 KB), which shortens the ring v11's
// mainloop is tuned on (each stage is ~1000 cycles of MMAs; 3 stages hide ~2000 cycles of
// TMA latency instead of ~3000), or keep 4 stages and stage C in halves: a 32 KB buffer,
// 16 KB (64 rows x 128 columns) per consumer warpgroup: 192 + 32 + 1 = 225 KB (+ 96 B of
// static barriers, under 227 KB). v13 keeps the mainloop and stages halves. The cost: a
// 128x256 tile's second half waits until the TMA unit has read the first out of shared
// memory (16 KB per warpgroup, ~32 KB per SM at ~128 B per cycle: a few hundred cycles,
// against v11's ~2-4k cycles of scattered stores); the next tile's first half then waits
// on nothing (its buffer drained during the mainloop). The 128x128 form (6 stages x 32 KB)
// has exactly one half: 192 + 32 + 1 = 225 KB as well.
//
// Layout of a warpgroup's 16 KB buffer: two 8 KB boxes of 64 rows x 64 columns (128-byte
// rows, 1024-aligned), 128-byte swizzled as the C tensor map says (box (64, 64, 1),
// swizzle 128): element (r, c) of box b at b * 8192 + r * 128 + ((c / 8) ^ (r % 8)) * 16 +
// (c % 8) * 2, the layout v11's TMA loads write, now read by the TMA store. A thread's pair
// (acc[4j + 2h], acc[4j + 2h + 1]) is row r = 16 warp + 8h + g, columns 8j + 2q, 8j + 2q + 1
// of the warpgroup's 64 rows (the m64nNk16 fragment), so r % 8 = g: for one (j, h) the 32
// lanes of a warp write rows g = 0..7 at chunk (j % 8) ^ g, word q: 32 different banks.
//
// Ordering per warpgroup and half (a named barrier per warpgroup, ids 1 and 2, 128 threads:
// the warpgroups write disjoint buffers and store them independently, so neither waits for
// the other's epilogue): the issuing thread (the warpgroup's first) waits
// cp.async.bulk.wait_group.read 0 (the TMA unit has finished reading the buffer's previous
// contents), bar.sync; every thread writes its 32 pairs, fence.proxy.async.shared::cta (its
// generic-proxy writes become visible to the async proxy), bar.sync; the issuing thread
// issues the two boxes' stores (boxes wholly past N skipped) and commits them as one bulk
// group. A warpgroup whose 64 rows start past M, or a half that starts past N, skips the
// half (the condition is uniform across the warpgroup, so the barriers stay matched).
// Before exit the issuing thread waits wait_group 0: the stores have completed, and shared
// memory is not released under a read.
//
// Contract and launch: v11's, with C passed as a third tensor map instead of a pointer: C
// [batch, M, N] (N the padded width), dims (N, M, batch), box (64, 64, 1), 128-byte
// swizzle. Shared memory:
// DYN_SHARED["v13"] / ["v13_n128"] in cuda.py.

#define V13_C_BYTES (2 * 64 * 128 * 2)  // per consumer warpgroup 64 rows x 128 columns, 16-bit
#define V13_EPI_BAR 1                  // named barriers 1 (warpgroup 0) and 2 (warpgroup 1)

template <int BN>
struct V13Smem {
    static constexpr unsigned C_OFFSET = V11Tile<BN>::STAGES * V11Tile<BN>::STAGE_BYTES;  // after the ring
    static constexpr unsigned BYTES = V11Tile<BN>::SMEM_BYTES + V13_C_BYTES;
    static_assert(BYTES + 1024 <= 227 * 1024, "ring + C staging + static barriers exceed a block's shared memory");
};

__device__ __forceinline__ void v13_tma_store_3d(const TensorMap* map, unsigned src, int c0, int c1, int c2) {
    asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
                     reinterpret_cast<unsigned long long>(map)),
                 "r"(src), "r"(c0), "r"(c1), "r"(c2)
                 : "memory");
}
__device__ __forceinline__ void v13_bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void v13_bulk_wait_read0() {
    asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
__device__ __forceinline__ void v13_bulk_wait0() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
__device__ __forceinline__ void v13_epi_sync(int id) {
    asm volatile("bar.sync %0, 128;\n" ::"r"(id) : "memory");
}

__device__ __forceinline__ unsigned v13_pack(__nv_bfloat16*, float x, float y) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(x, y);
    return *reinterpret_cast<const unsigned*>(&v);
}
__device__ __forceinline__ unsigned v13_pack(__half*, float x, float y) {
    const __half2 v = __floats2half2_rn(x, y);
    return *reinterpret_cast<const unsigned*>(&v);
}
__device__ __forceinline__ void v13_st_shared(unsigned addr, unsigned v) {
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}

__device__ __forceinline__ void v14_st_shared2(unsigned addr, float x, float y) {
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(x), "f"(y) : "memory");
}

template <typename T, bool BF16, int BN, bool AT = false, bool BT = false, int MC = 1>
__device__ __forceinline__ void v13_body(const TensorMap* ta, const TensorMap* tb, const TensorMap* tc, int M,
                                         int N, int K, int batch) {
    using Tile = V11Tile<BN>;
    constexpr int S = Tile::STAGES;
    static_assert(MC == 1 || MC == 2, "v15's clusters are of two blocks");
    extern __shared__ __align__(1024) unsigned char v13_smem[];
    __shared__ __align__(8) unsigned long long v13_bars[2 * S];  // full[0..S), empty[0..S)
    v11_check_smem(V13Smem<BN>::BYTES);
    const unsigned smem0 = (v10_smem_u32(v13_smem) + 1023u) & ~1023u;
    const unsigned full0 = v10_smem_u32(&v13_bars[0]), empty0 = v10_smem_u32(&v13_bars[S]);
    const int tid = threadIdx.x;
    v11_init_ring<S>(full0, empty0, 8 * MC);  // empty: one arrival per consumer warp (of both blocks: v15)
    unsigned rank = 0, peer_empty0 = 0;
    if constexpr (MC == 2) {
        unsigned blocks;
        asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(blocks));
        if (blocks != 2) __trap();  // launched without its cluster
        rank = v15_rank();
        peer_empty0 = v15_peer(empty0, rank ^ 1);
        v15_cluster_sync();  // both blocks' barriers are initialized before either is used
    }

    const V11Sched<BN, V11_BM * MC> sched(M, N, batch);
    const int ktiles = (K + V11_BK - 1) / V11_BK;

    if (tid < 128) {  // producer warpgroup: one thread issues every copy, the rest retire
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
        if (tid == 0) v11_produce<BN, AT, BT, MC>(ta, tb, sched, ktiles, smem0, full0, empty0, rank);
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");

    const int cw = tid / 128 - 1;  // consumer warpgroup: rows 64cw .. 64cw+63 of the tile
    const int warp = (tid % 128) / 32, lane = tid % 32;
    const int g = lane / 4, q = lane % 4;
    const bool issuer = tid % 128 == 0;  // the warpgroup's thread that issues its C stores
    const int epi_bar = V13_EPI_BAR + cw;
    // this warpgroup's C buffer, and the byte of each thread's pair in it (see the header)
    const unsigned cbuf = smem0 + V13Smem<BN>::C_OFFSET + cw * (V13_C_BYTES / 2);
    if (issuer) asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<unsigned long long>(tc)) : "memory");
    float acc[BN / 2];
    int it = 0;
    for (int t = blockIdx.x / MC; t < sched.total; t += gridDim.x / MC) {
        int m0, n0, z;
        sched.tile(t, m0, n0, z);
        if constexpr (MC == 2) m0 += rank * V11_BM;  // this block's half of the pair
        v11_mainloop<BN, BF16, AT, BT, MC>(acc, ktiles, it, smem0, full0, empty0, cw, lane, peer_empty0);

        // Epilogue: per 128-column half (a 128x192 tile's second is 64 wide), through this
        // warpgroup's buffer to a TMA store.
        const int row_c = m0 + cw * 64;  // the warpgroup's first row of C
        if (row_c >= M) continue;        // (uniform in the warpgroup)
#pragma unroll
        for (int hf = 0; hf < (BN + 127) / 128; ++hf) {
            const int col_c = n0 + 128 * hf;
            const int groups = min(16, BN / 8 - 16 * hf);  // 8-column groups in this half
            if (col_c >= N) break;  // (uniform in the warpgroup)
            if (issuer) v13_bulk_wait_read0();  // the buffer's previous contents are read out
            v13_epi_sync(epi_bar);
#pragma unroll
            for (int jj = 0; jj < 16; ++jj) {  // 8-column groups of the half: j = 16 hf + jj
                if (jj >= groups) break;
                const int j = 16 * hf + jj;
                const unsigned box = cbuf + (jj / 8) * 8192 + ((((jj % 8) ^ g) << 4) | (q << 2));
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int r = warp * 16 + 8 * h + g;
                    v13_st_shared(box + r * 128, v13_pack((T*)nullptr, acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]));
                }
            }
            v10_fence_proxy_async();  // these st.shared -> visible to the TMA unit (async proxy)
            v13_epi_sync(epi_bar);
            if (issuer) {
                v13_tma_store_3d(tc, cbuf, col_c, row_c, z);
                if (groups > 8 && col_c + 64 < N) v13_tma_store_3d(tc, cbuf + 8192, col_c + 64, row_c, z);
                v13_bulk_commit();
            }
        }
    }
    if (issuer) v13_bulk_wait0();  // every store complete before the block's shared memory goes
}

#define V13_ARGS(T)                                                                                        \
    const __grid_constant__ TensorMap ta, const __grid_constant__ TensorMap tb,                          \
        const __grid_constant__ TensorMap tc, int M, int N, int K, int batch

// 128x256 tiles (the default) and 128x128 tiles (small grids; cuda.py, v11_block_n). C is
// written only through its tensor map tc: no pointer argument.
extern "C" __global__ void __launch_bounds__(V11_THREADS, 1) matmul_v13_bf16(V13_ARGS(__nv_bfloat16)) {
    v13_body<__nv_bfloat16, true, 256>(&ta, &tb, &tc, M, N, K, batch);
}
extern "C" __global__ void __launch_bounds__(V11_THREADS, 1) matmul_v13_f16(V13_ARGS(__half)) {
    v13_body<__half, false, 256>(&ta, &tb, &tc, M, N, K, batch);
}
extern "C" __global__ void __launch_bounds__(V11_THREADS, 1) matmul_v13_n128_bf16(V13_ARGS(__nv_bfloat16)) {
    v13_body<__nv_bfloat16, true, 128>(&ta, &tb, &tc, M, N, K, batch);
}
extern "C" __global__ void __launch_bounds__(V11_THREADS, 1) matmul_v13_n128_f16(V13_ARGS(__half)) {
    v13_body<__half, false, 128>(&ta, &tb, &tc, M, N, K, batch);
}

// ======================================================================================= v14
//
// v14: v13 (producer, ring, persistent schedule, TMA-stored epilogue) with two changes that
// matter at the shapes models use.
//
// 1. Operands in either major order. v11-v13 take row-major A [M, K] and B [K, N]; the
//    launcher packs anything else with a copy, and a model's products rarely come that way:
//    nn.Linear's weight is [N, K] (B K-major), the backward's dB = A^T dC reads A [M, K] as
//    [K, M] (A M-major). wgmma reads either order of 16-bit operands from shared memory
//    (imm-trans-a / imm-trans-b), and TMA copies any 2-D window with 16-byte row pitches, so
//    v14 takes the operands as they lie:
//      A K-major ([M, K] rows): v11's box (64 k x 128 m), descriptor start + 32 B per k16,
//          LBO unused, SBO 1024 (8 m-rows); imm-trans-a = 0.
//      A M-major (stored [K, M]): two boxes of 64 m x 64 k, one 8 KB slab per consumer
//          warpgroup (k-row kr of slab at kr * 128, 64 m per row), as v11's B slabs; the
//          descriptor of warpgroup cw: slab cw + 2 KB per k16 (16 k-rows), LBO 8192 (unused:
//          m64 is one slab), SBO 1024 (8 k-rows); imm-trans-a = 1.
//      B N-major ([K, N] rows): v11's slabs; imm-trans-b = 1.
//      B K-major (stored [N, K]): one box of 64 k x BN n, BN rows of 128 bytes (A's K-major
//          layout with n for m): start + 32 B per k16, SBO 1024 (8 n-rows); imm-trans-b = 0.
//    Every descriptor still starts in a 1024-aligned atom or 32 B / 2 KB steps past it.
// 2. A 128x192 tile beside 128x256 and 128x128: wgmma m64n192k16, 96 fp32 accumulators per
//    consumer thread, 40 KB stages (4: 160 + 32 KB of C staging + 1 = 193 KB); its epilogue
//    has a 128-column half and a 64-column one. It exists for wave quantization: 3000 x 3000
//    is 288 tiles of 128x256 on 132 SMs (3 waves, the last 18% full) and 384 of 128x192
//    (3 waves, 97% full); 8192 x 768 is 192 wide tiles (2 waves, the second 45% full) and
//    256 of 192 (2 waves, 97%). The launcher picks the width (cuda.py, v14_block_n).
//
// 3. K slices in a cluster, for products whose 128x128 tiles leave most SMs idle: see "v14's
//    K slices in a cluster" below.
//
// Kernels: matmul_v14_n{128,192,256}_{mk,km}_{kn,nk}_{bf16,f16}: the tile width, A's stored
// order (mk: [M, K] rows, km: [K, M]), B's (kn: [K, N], nk: [N, K]). Contract: v13's, with A
// and B any 3-D windows whose rows are whole 16-byte units (the tensor maps carry the pitches
// and batch strides; K and the operands' widths need not be multiples of 8).

#define V14_KERNEL(NAME, T, BF, BN, AT, BT)                                          \
    extern "C" __global__ void __launch_bounds__(V11_THREADS, 1) NAME(V13_ARGS(T)) { \
        v13_body<T, BF, BN, AT, BT>(&ta, &tb, &tc, M, N, K, batch);                  \
    }
#define V14_FORM(BN)                                                                         \
    V14_KERNEL(matmul_v14_n##BN##_mk_kn_bf16, __nv_bfloat16, true, BN, false, false)         \
    V14_KERNEL(matmul_v14_n##BN##_mk_nk_bf16, __nv_bfloat16, true, BN, false, true)          \
    V14_KERNEL(matmul_v14_n##BN##_km_kn_bf16, __nv_bfloat16, true, BN, true, false)          \
    V14_KERNEL(matmul_v14_n##BN##_km_nk_bf16, __nv_bfloat16, true, BN, true, true)           \
    V14_KERNEL(matmul_v14_n##BN##_mk_kn_f16, __half, false, BN, false, false)                \
    V14_KERNEL(matmul_v14_n##BN##_mk_nk_f16, __half, false, BN, false, true)                 \
    V14_KERNEL(matmul_v14_n##BN##_km_kn_f16, __half, false, BN, true, false)                 \
    V14_KERNEL(matmul_v14_n##BN##_km_nk_f16, __half, false, BN, true, true)

V14_FORM(128)
V14_FORM(192)
V14_FORM(256)

// ----------------------------------------------------------------- v14's K slices in a cluster
//
// A product whose 128x128 tiles fill at most half the SMs (GPT-2's weight gradient: 768 x
// 768 over K = 8192 tokens is 36 tiles on 132 SMs) runs each tile in a cluster of `slices`
// blocks (2-8, the cluster's size), block `rank` taking k-tiles rank * kt / slices ..
// (rank + 1) * kt / slices - 1 of the tile's kt. The slices meet in distributed shared
// memory instead of global memory:
//   1. each block's consumers finish their MMAs (both warpgroups: a named barrier, after
//      which no wgmma reads the ring) and store their fp32 accumulators into the block's own
//      ring, a [128][V14_KS_PITCH] float tile (pair stores of row r land 8 banks past row r -
//      1's: two wavefronts per warp store, the fewest for 256 bytes);
//   2. a cluster barrier (release / acquire: every block's partial is visible to the others);
//   3. block `rank` sums rows rank, rank + slices, ... of the tile over the slices in slice
//      order 0 .. slices - 1 (ld.shared::cluster through mapa; the same order whichever
//      block finishes first: deterministic), rounds to T and stores them (4 columns a thread,
//      8-byte stores, rows and columns past M and N skipped);
//   4. a second cluster barrier: no block leaves while another still reads its shared memory.
// No fp32 workspace in global memory and no second kernel. The producer warpgroup stays for
// both barriers. One tile per cluster: grid = tiles x slices blocks, one wave (the launcher).
// Kernels: matmul_v14_ks_{mk,km}_{kn,nk}_{bf16,f16}; C a plain pointer to [M, N] (N a multiple
// of 8: 16-byte rows), A and B v14's maps of the 128x128 form.
#define V14_KS_PITCH 136  // floats per row of a block's partial tile
#define V14_KS_BAR 3      // named barrier of the two consumer warpgroups (v13's epilogue uses 1, 2)

__device__ __forceinline__ float4 v14_ld_cluster4(unsigned cluster_addr) {
    float4 v;
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(cluster_addr)
                 : "memory");
    return v;
}

template <typename T, bool BF16, bool AT, bool BT>
__device__ __forceinline__ void v14_ks_body(const TensorMap* ta, const TensorMap* tb, T* __restrict__ C, int M,
                                            int N, int K) {
    using Tile = V11Tile<128>;
    constexpr int S = Tile::STAGES;
    static_assert(128 * V14_KS_PITCH * 4 <= S * Tile::STAGE_BYTES, "the partial tile must fit in the ring");
    extern __shared__ __align__(1024) unsigned char v14k_smem[];
    __shared__ __align__(8) unsigned long long v14k_bars[2 * S];  // full[0..S), empty[0..S)
    v11_check_smem(Tile::SMEM_BYTES);
    const unsigned smem0 = (v10_smem_u32(v14k_smem) + 1023u) & ~1023u;
    const unsigned full0 = v10_smem_u32(&v14k_bars[0]), empty0 = v10_smem_u32(&v14k_bars[S]);
    const int tid = threadIdx.x;
    v11_init_ring<S>(full0, empty0, 8);
    unsigned slices;
    asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(slices));
    const unsigned rank = v15_rank();
    const V11Sched<128> sched(M, N, 1);
    const int kt = (K + V11_BK - 1) / V11_BK;
    const int kt0 = rank * kt / slices, mine = (rank + 1) * kt / slices - kt0;

    if (tid < 128) {  // producer warpgroup: thread 0 copies the slice, then all wait out the sum
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
        if (tid == 0) v11_produce<128, AT, BT>(ta, tb, sched, mine, smem0, full0, empty0, 0, kt0, slices);
        __syncwarp();
        v15_cluster_sync();
        v15_cluster_sync();
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
    const int cw = tid / 128 - 1, warp = (tid % 128) / 32, lane = tid % 32;
    const int g = lane / 4, q = lane % 4;
    int m0, n0, z;
    sched.tile(blockIdx.x / slices, m0, n0, z);
    float acc[64];
    int it = 0;
    v11_mainloop<128, BF16, AT, BT>(acc, mine, it, smem0, full0, empty0, cw, lane);

    asm volatile("bar.sync %0, 256;\n" ::"r"(V14_KS_BAR) : "memory");  // no wgmma reads the ring now
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = cw * 64 + warp * 16 + 8 * h + g;
            v14_st_shared2(smem0 + (r * V14_KS_PITCH + 8 * j + 2 * q) * 4, acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
        }
    v15_cluster_sync();
    for (int i = tid - 128;; i += 256) {  // 32 threads a row, 4 columns each
        const int r = rank + slices * (i / 32), c = 4 * (i % 32);
        if (r >= 128) break;
        const unsigned at = smem0 + (r * V14_KS_PITCH + c) * 4;
        float4 sum = v14_ld_cluster4(v15_peer(at, 0));
        for (unsigned p = 1; p < slices; ++p) {
            const float4 v = v14_ld_cluster4(v15_peer(at, p));
            sum.x += v.x;
            sum.y += v.y;
            sum.z += v.z;
            sum.w += v.w;
        }
        const int row = m0 + r, col = n0 + c;
        if (row < M && col < N)
            *reinterpret_cast<uint2*>(C + (long long)row * N + col) =
                make_uint2(v13_pack((T*)nullptr, sum.x, sum.y), v13_pack((T*)nullptr, sum.z, sum.w));
    }
    v15_cluster_sync();
}

#define V14_KS_KERNEL(AO, BO, AT, BT)                                                                      \
    extern "C" __global__ void __launch_bounds__(V11_THREADS, 1) matmul_v14_ks_##AO##_##BO##_bf16(          \
        const __grid_constant__ TensorMap ta, const __grid_constant__ TensorMap tb, __nv_bfloat16* C, int M, \
        int N, int K) {                                                                                     \
        v14_ks_body<__nv_bfloat16, true, AT, BT>(&ta, &tb, C, M, N, K);                                     \
    }                                                                                                       \
    extern "C" __global__ void __launch_bounds__(V11_THREADS, 1) matmul_v14_ks_##AO##_##BO##_f16(           \
        const __grid_constant__ TensorMap ta, const __grid_constant__ TensorMap tb, __half* C, int M, int N, \
        int K) {                                                                                            \
        v14_ks_body<__half, false, AT, BT>(&ta, &tb, C, M, N, K);                                           \
    }

V14_KS_KERNEL(mk, kn, false, false)
V14_KS_KERNEL(mk, nk, false, true)
V14_KS_KERNEL(km, kn, true, false)
V14_KS_KERNEL(km, nk, true, true)

// ======================================================================================= v15
//
// v15: v14 in thread-block clusters of two blocks that share the B tile (TMA multicast).
//
// What holds v14 back where it does: its operand traffic through L2. Per 128x192 tile and
// k-tile a block copies 16 KB of A and 24 KB of B; at 3000^3 Nsight Compute reads v14 at 83%
// of L2 throughput while its tensor pipes idle (cuBLAS's 192x192 kernel, in clusters of
// two: 66%; lab/ncu_mm.py). Two blocks whose tiles sit one above the other (rows m0 and m0 +
// 128 of the same columns) read the same B tile; in a cluster each copies half of it once,
// into both blocks' shared memory: 16 + 12 KB a block per k-tile instead of 40 (-30%; 256
// wide: 16 + 16 against 48, -33%).
//
// Protocol (per stage s of the ring, both blocks running the same tile pairs in the same
// order, so their k-tile counts `it` agree):
//   full[s]  (count 1) completes when this block's producer has arrived with the stage's
//            bytes (A, its half of B, the other block's half) and all of them have landed:
//            the other block's multicast signals this block's full[s] at the same offset.
//   empty[s] (count 16) completes when the 8 consumer warps of this block and the 8 of the
//            other have released the stage: each warp arrives on its own block's barrier
//            and, through mapa, on the other's (mbarrier.arrive.shared::cluster); a producer
//            refills stage s only then, since its multicast writes both blocks' stage s.
//   A multicast for k-tile it + S cannot reach a block whose full[s] is still in k-tile
//   it's phase: its sender first waits on empty[s], which needs this block's consumers to
//   have read k-tile it. The blocks' barriers are initialized before a cluster barrier;
//   before exit each producer waits for the last release of every stage (after which no
//   copy or arrival of the other block targets this block's shared memory).
// The pair's second block may start past M (an odd number of row tiles): its A boxes read
// zeros, it still copies its half of B, and its epilogue writes nothing.
//
// Launch: clusters of (2, 1, 1) blocks (the launcher's cuLaunchKernelEx; a block that finds
// itself in no such cluster traps), 2 x min(co-resident clusters, tile pairs) blocks; the
// schedule is v11's over 256-row pairs; v14's maps except B's box: (64 k, BN / 2 n) stored
// [N, K], (64 n, 32 k) stored [K, N]. Shared memory: v14's of the width.
//
// Kernels: matmul_v15_n{192,256}_{mk,km}_{kn,nk}_{bf16,f16}.

#define V15_KERNEL(NAME, T, BF, BN, AT, BT)                                          \
    extern "C" __global__ void __launch_bounds__(V11_THREADS, 1) NAME(V13_ARGS(T)) { \
        v13_body<T, BF, BN, AT, BT, 2>(&ta, &tb, &tc, M, N, K, batch);               \
    }
#define V15_FORM(BN)                                                                        \
    V15_KERNEL(matmul_v15_n##BN##_mk_kn_bf16, __nv_bfloat16, true, BN, false, false)        \
    V15_KERNEL(matmul_v15_n##BN##_mk_nk_bf16, __nv_bfloat16, true, BN, false, true)         \
    V15_KERNEL(matmul_v15_n##BN##_km_kn_bf16, __nv_bfloat16, true, BN, true, false)         \
    V15_KERNEL(matmul_v15_n##BN##_km_nk_bf16, __nv_bfloat16, true, BN, true, true)          \
    V15_KERNEL(matmul_v15_n##BN##_mk_kn_f16, __half, false, BN, false, false)               \
    V15_KERNEL(matmul_v15_n##BN##_mk_nk_f16, __half, false, BN, false, true)                \
    V15_KERNEL(matmul_v15_n##BN##_km_kn_f16, __half, false, BN, true, false)                \
    V15_KERNEL(matmul_v15_n##BN##_km_nk_f16, __half, false, BN, true, true)

V15_FORM(192)
V15_FORM(256)
