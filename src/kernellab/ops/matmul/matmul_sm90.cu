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
#define V10_REGS128                                     \
    "{%0, %1, %2, %3, %4, %5, %6, %7, "                 \
    "%8, %9, %10, %11, %12, %13, %14, %15, "            \
    "%16, %17, %18, %19, %20, %21, %22, %23, "          \
    "%24, %25, %26, %27, %28, %29, %30, %31, "          \
    "%32, %33, %34, %35, %36, %37, %38, %39, "          \
    "%40, %41, %42, %43, %44, %45, %46, %47, "          \
    "%48, %49, %50, %51, %52, %53, %54, %55, "          \
    "%56, %57, %58, %59, %60, %61, %62, %63, "          \
    "%64, %65, %66, %67, %68, %69, %70, %71, "          \
    "%72, %73, %74, %75, %76, %77, %78, %79, "          \
    "%80, %81, %82, %83, %84, %85, %86, %87, "          \
    "%88, %89, %90, %91, %92, %93, %94, %95, "          \
    "%96, %97, %98, %99, %100, %101, %102, %103, "      \
    "%104, %105, %106, %107, %108, %109, %110, %111, "  \
    "%112, %113, %114, %115, %116, %117, %118, %119, "  \
    "%120, %121, %122, %123, %124, %125, %126, %127}"

// D[64x256] += A[64x16] (K-major, desc da) * B[16x256] (N-major, desc db). Operands: the
// 128 accumulators, the two descriptors; scale-d = 1 (accumulate: d starts at zero),
// imm-scale-a = imm-scale-b = 1 (no negation), imm-trans-a = 0, imm-trans-b = 1.
template <bool BF16>
__device__ __forceinline__ void v10_wgmma_m64n256k16(float (&d)[128], unsigned long long da, unsigned long long db) {
    if (BF16) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " V10_REGS128
            ", %128, %129, p, 1, 1, 0, 1;\n}\n"
            : V10_D128
            : "l"(da), "l"(db), "r"(1));
    } else {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 " V10_REGS128
            ", %128, %129, p, 1, 1, 0, 1;\n}\n"
            : V10_D128
            : "l"(da), "l"(db), "r"(1));
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
            v10_wgmma_m64n256k16<BF16>(acc, da, db);
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
