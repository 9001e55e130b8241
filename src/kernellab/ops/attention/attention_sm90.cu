// Attention forward on Hopper tensor cores (wgmma), fp16 / bf16, in the FlashAttention-3
// design. Compiled by NVRTC for sm_90a only (wgmma and setmaxnreg are arch-specific: the
// Module in cuda_sm90.py is built with archs=("sm_90a",)).
//
//   o = softmax(q k^T * scale) v,  bottom-right causal (query i sees keys j <= i + S_k - S_q)
//   lse = log2(sum_j 2^(s_ij * scale * log2 e)): the log-sum-exp in log2 units, what the
//   Triton backward reads (triton.py, lse_shape); -inf for a row that sees no key (o = 0).
//
// Variants (registered as backends of op "attention"; v1 is the fp32 teaching kernel in
// attention.cu):
//   v2  attn_fwd_v2_d<D>_<dtype>  (backend "cuda_v2") 128 query rows per block, two
//       warpgroups of 64 rows each; all 256 threads copy K/V tiles (cp.async, 16 bytes) into
//       swizzled shared memory, double buffered (tile t+1 lands while tile t is computed);
//       S = Q K^T with wgmma from shared memory (fp32 accumulators in registers), online
//       softmax in registers (exp2 of log2e-scaled scores), P converted to 16 bits in
//       registers and fed as the register A operand of the second wgmma, O += P V.
//   v3  attn_fwd_v3_d<D>_<dtype>  (backend "cuda_v3") v2's math, warp-specialized: a
//       producer warpgroup (setmaxnreg down to 56 registers) copies Q and the K/V tiles
//       through a ring of 2-3 stages guarded by mbarriers ("full": the copies of a stage
//       landed, completed by cp.async.mbarrier.arrive; "empty": both consumer warpgroups are
//       done with it); two consumer warpgroups (setmaxnreg up to 224) only compute. The
//       consumers never wait for their own copies, and the two of them drift apart, so one
//       warpgroup's softmax runs while the other's wgmmas occupy the tensor cores.
//   v4  attn_fwd_v4_d<D>_<dtype>  (backend "cuda_v4") v3 with TMA: one producer thread
//       issues a bulk tensor copy per column slab of a tile (the tensor maps come from the
//       host, cuTensorMapEncodeTiled, and swizzle exactly as the tiles are laid out); the
//       stage's full barrier counts the bytes. The 128 threads' ~32 cp.async per tile (and
//       their address arithmetic, competing with the softmax for issue slots) are gone;
//       rows past S_q / S_k arrive as zeros. setmaxnreg 40 / 232.
//   v5  attn_fwd_v5_d<D>_<dtype>  (backend "cuda_v5") v4 with FlashAttention-3's
//       intra-warpgroup overlap: per key tile j, S_j = Q K_j^T and O += P_{j-1} V_{j-1}
//       are issued together, the softmax of S_j runs while that P V is in flight, and O is
//       rescaled once it is done (registers: S_j and P_{j-1} live at once, 64 + 32 + 64 for
//       O at D = 128).
//   v6  attn_fwd_v6_d<D>_<dtype>  (backend "cuda_v6") v4 with FlashAttention-3's
//       inter-warpgroup ping-pong: the two consumer warpgroups take turns at the tensor
//       cores through two named barriers, so one warpgroup's softmax runs exactly while the
//       other's GEMMs do (v3/v4 leave that to drift, which the barriers on the shared K/V
//       stages keep pulling back into step). A warpgroup's turn is the GEMMs between two of
//       its softmaxes: S_0 = Q K_0^T first, then O += P_{j-1} V_{j-1} with S_j = Q K_j^T,
//       then the last P V. Per key tile, warpgroup 0 / 1:
//           WG0: [GEMMs j] softmax j          [GEMMs j+1] softmax j+1 ...
//           WG1:           [GEMMs j] softmax j            [GEMMs j+1] ...
//       Barrier PP_BAR + w (ids 1 and 2; id 0 is __syncthreads, v6 uses no other)
//       is warpgroup w's turn: it bar.syncs on it (128 threads) before issuing its GEMMs,
//       and the other warpgroup bar.arrives on it (128 more: count 256) once its own GEMMs
//       are issued. Warpgroup 1 arrives on warpgroup 0's barrier once at the start, so 0
//       goes first. Both warpgroups of a block see the same n key tiles and take n + 1
//       turns; 0 arrives after each of its turns, 1 after all but its last, so every
//       barrier phase meets exactly 256 threads and none is left half full at exit. A
//       warpgroup waits for a stage's full barrier before its turn, never while holding
//       it (the producer needs both warpgroups' releases of older stages, not a turn).
//       The arithmetic is v4's (O rescaled before the P V that follows the softmax).
//   v7  attn_fwd_v7_d<D>_<dtype>  (backend "cuda_v7") FlashAttention-3's whole consumer
//       schedule: v6's turns with v5's overlap inside each. A turn issues S_j = Q K_j^T,
//       rescales O by the previous tile's alpha while S_j runs, issues O += P_{j-1} V_{j-1}
//       and hands the tensor cores over; the warpgroup then waits for S_j alone
//       (wgmma.wait_group 1) and runs the softmax of tile j while its own P V and the other
//       warpgroup's GEMMs are in flight: the softmax hides under three GEMMs instead of
//       two (v6) or one (v5). The turns and barriers are v6's (same ids, counts and
//       arrivals). Epilogue: each warpgroup writes its 64 normalized O rows, 16-bit, into
//       its own 64 rows of the Q tile (free once its last Q K^T is done; the other
//       warpgroup reads only its own rows) in the tile's swizzled layout, fences them to
//       the async proxy, meets its 128 threads at named barrier EPI_BAR + w (ids 3, 4,
//       count 128), and one thread stores them with one TMA box per column slab (a fourth
//       tensor map, of o; rows past S_q are clipped by the map, never written). lse is
//       written by the threads as in v2-v6. Registers: S_j, P_{j-1} and O live at once,
//       as in v5 and v6 (no spills at any head dim: tests/ops/test_attention_sm90.py).
//       Split rings (V7Tiles' SPLIT_KV, v7's default at D = 256; tilings "80x2s" ...:
//       cuda_sm90.py, Tiles.split_kv) give K and V rings of their own, as FlashAttention-3
//       does: the producer loads K_j, then V_{j-1}; K_j is released once S_j is done,
//       V_{j-1} once its P V is (produce_tma_split, consume_v7).
//
// All: head dims 64, 80, 96, 128 (BN = 128 keys per tile) and 256 (BN = 64; v7's per head dim: V7Tiles); causal blocks
// skip every key tile above the diagonal and are issued heaviest first (the block of the
// last query rows sees the most keys: blockIdx.x counts down the query blocks), so the light
// blocks fill the tail of the grid. Only the key tiles that cut the diagonal or the S_k tail
// are masked.
//
// Why (napkin math, H100 SXM, bf16, D = 128, BN = 128): per key tile a block (two
// warpgroups) does 2 x 2 x 64 x 128 x 128 x 2 = 8.4 MFLOP of MMA, ~2050 cycles at the
// tensor cores' ~4096 FLOP per cycle per SM; and 2 x 64 x 128 = 16k exponentials, ~1020
// cycles at the SFU's 16 per cycle per SM, plus ~5 FP32 operations per score (scale, max,
// sum, convert) at 128 per cycle, ~640 cycles. The softmax is most of the MMA time: it has
// to run under the MMAs (v3's drifting warpgroups, v5's overlap) rather than between
// them. K and V tiles are 2 x 32 KB; 128 query rows reuse each tile 128 times.
//
// ---------------------------------------------------------------------------------------
// Shared-memory layout (what the descriptors must describe exactly)
//
// A tile of R rows x D columns (16-bit, row-major in global memory) is stored as D / E
// column slabs of E = W / 2 elements, W the swizzle width in bytes: 128 where 64 divides D
// (D = 64, 128, 256), 64 where only 32 does (D = 96), 32 otherwise (D = 80). A slab holds the
// R rows at W bytes each (R x W bytes, slabs one after the other). Within a slab, 16-byte
// chunk c of row r is stored at chunk position c ^ ((r * W / 128) % (W / 16)): the
// hardware's Swizzle<log2(W/16), 4, 3> pattern (address bits [4, 4+b) ^= bits [7, 7+b)),
// which repeats every 8 rows (8 x W bytes); every tile and slab starts on a 1024-byte
// boundary, so the pattern over absolute addresses equals the pattern over tile offsets.
// The head dim is never padded: D = 80 is five 16-column slabs, not a 128-wide tile.
//
// Q (A of S = Q K^T) and K (B of it, as K^T: [N = keys, K = D] rows) are K-major (the
// head dim is contiguous): a descriptor for the 16-deep k step kk points at slab
// (16 kk) / E, (16 kk % E) x 2 bytes into its rows (inside the swizzle row; the hardware
// swizzles the final address); SBO = 8 x W (from one group of 8 rows to the next); LBO
// unused (16). A warpgroup's 64 rows of Q start 64 x W bytes into each slab.
// V (B of O = P V: [K = keys, N = D]) is MN-major (imm-trans-b = 1, N contiguous): the
// descriptor of k step kk points 16 kk rows into the tile (16 x W bytes); LBO = R x W (from
// one E-wide slab of N to the next), SBO = 8 x W (from one group of 8 key rows to the next).
// Descriptor bits: [0,14) address >> 4, [16,30) LBO >> 4, [32,46) SBO >> 4, [62,64) swizzle
// (1 = 128B, 2 = 64B, 3 = 32B); base offset 0.
//
// Register fragments (kernellab/cuda/wgmma.py): S's accumulator of m64nBNk16 holds, in warp
// w of the warpgroup, lane l (g = l / 4, q = l % 4), s[4j + 2h + e] = S(16w + g + 8h,
// 8j + 2q + e). The A operand of m64nNk16 from registers is the mma.sync m16n8k16 A
// fragment, which for the 16 keys 16kk..16kk+15 is exactly s[8kk .. 8kk+7] packed in pairs
// (low half = lower column): P never leaves the registers. Each thread owns two rows
// (h = 0, 1); a row's 128 scores are spread over the 4 threads of a quad (reduced with two
// shuffles).
//
// Contract (the launcher in cuda_sm90.py guarantees it): q (Z, H, S_q, D), k and v
// (Z, H_kv, S_k, D), o (Z, H, S_q, D) with element strides (z, h, s) given and a unit
// stride over D, every stride a multiple of 8 and every base 16-byte aligned (whole 16-byte
// chunks per row); lse (Z, H, S_q) fp32 contiguous. H = H_kv x group (GQA: q head h reads
// k/v head h / group). Grid (ceil(S_q / 128), H, Z). v4-v7 take q, k, v as tensor maps
// instead: dims (D, S, H, Z), a box of one slab (E columns x 128 query rows or BN keys),
// the tile's swizzle; v7 takes o as a tensor map too (a box of E columns x 64 rows).
// S_k = 0 is never launched (the launcher writes o = 0, lse = -inf).
// (The layouts above are checked against CUTLASS's canonical wgmma layouts on the CPU:
// tests/ops/test_attention_sm90.py, test_descriptors_read_what_the_copies_wrote.)
// ---------------------------------------------------------------------------------------

#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include "attention_sm90_common.cuh"
#include "attention_sm90_wgmma.cuh"
#include "mbarrier.cuh"

#if !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "attention_sm90.cu uses wgmma: compile it for sm_90a (Module(..., archs=(\"sm_90a\",)))"
#endif


namespace {

constexpr int BM = 128;  // query rows per block: two consumer warpgroups of 64

// Keys per tile: 128 (S and P are 64 + 32 registers), 64 at D = 256 (O alone is 128).
template <int D>
struct Tiles {
    static constexpr int BN = D > 128 ? 64 : 128;
    static constexpr unsigned Q_BYTES = BM * D * 2;
    static constexpr unsigned KV_BYTES = BN * D * 2;  // one K (or V) tile
    static_assert(Q_BYTES % 1024 == 0 && KV_BYTES % 1024 == 0, "tiles must keep 1024-byte alignment");
};

__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, int src_bytes) {
    // src_bytes 0: 16 zero bytes written, nothing read (rows past S_q or S_k)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// Copy rows [row0, row0 + R) of a (rows, D) matrix with row stride `stride` into the tile at
// `dst`, NT threads (thread `t` of them), zero-filling rows >= rows. Consecutive threads
// take consecutive 16-byte chunks of a row (coalesced). UNROLL: chunks whose addresses are
// formed at once (v3's producer has 56 registers: a fully unrolled loop spills there).
template <typename T, int D, int R, int NT, int UNROLL = R * D / 8 / NT>
__device__ __forceinline__ void load_tile(unsigned dst, const T* __restrict__ src, long long stride, int row0,
                                          int rows, int t) {
    constexpr int CH = D / 8;
    static_assert((R * CH) % NT == 0, "tile chunks must divide evenly among the threads");
#pragma unroll UNROLL
    for (int i = 0; i < R * CH / NT; ++i) {
        const int e = t + i * NT;
        const int r = e / CH, gc = e % CH;
        const bool in = row0 + r < rows;
        const T* g = in ? src + (row0 + r) * stride + gc * 8 : src;
        cp_async16(dst + tile_offset<D, R>(r, gc), g, in ? 16 : 0);
    }
}

// What a block does: its query rows and the key tiles they see.
struct Block {
    int m0;       // first query row
    int n_tiles;  // key tiles 0 .. n_tiles-1
    int off;      // S_k - S_q: query i sees keys j <= i + off (causal)
};

// The keys query block mb's rows see: 0 .. key_end - 1 (under causal, past its last row's limit).
template <int R = BM>
__device__ __forceinline__ int key_end(int mb, int S_q, int S_k, int causal) {
    return causal ? max(0, min(S_k, (mb + 1) * R + S_k - S_q)) : S_k;
}

// Query block mb's rows and key tiles; R query rows a block (v7 with three consumer warpgroups: 192).
template <int BN, int R = BM>
__device__ __forceinline__ Block block_at(int mb, int S_q, int S_k, int causal) {
    Block b;
    b.m0 = mb * R;
    b.off = S_k - S_q;
    b.n_tiles = (key_end<R>(mb, S_q, S_k, causal) + BN - 1) / BN;
    return b;
}

// This block's query block: heaviest first under causal (the last query block sees the most keys).
template <int BN, int R = BM>
__device__ __forceinline__ Block block_of(int S_q, int S_k, int causal) {
    return block_at<BN, R>(causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x, S_q, S_k, causal);
}

// A row's partial results as one: v[0] alone, or (v[0] op v[1]) op (v[2] op v[3]).
template <int P, class Op>
__device__ __forceinline__ float combine_parts(const float (&v)[P], Op op) {
    static_assert(P == 1 || P == 4, "one part or four");
    if constexpr (P == 4) {
        return op(op(v[0], v[1]), op(v[2], v[3]));
    } else {
        return v[0];
    }
}

// Per-warpgroup online-softmax state and its math on one key tile: ``scores`` turns S into
// P in place and returns the factor alpha by which O must be rescaled (it does not touch O,
// so v5 runs it while the previous tile's P V is still in flight); ``rescale`` applies it.
// FAST: the exponentials by ex2.approx.ftz.f32 (v7's; softmax_exp2 in attention_sm90_common.cuh).
// COLMASK (V7Tiles' COLMASK): a masked tile that needs no causal compare for any row of this
// thread's warp tests each column once against S_k.
// TREE (V7Tiles' TREE): the row's max and sum over four partial results rather than one
// running one, so that the exponentials wait on a chain of BN / 32 maxima rather than BN / 8.
template <int D, int BN, bool FAST = false, bool COLMASK = false, bool TREE = false>
struct Softmax {
    float m[2];  // running max of the row's scaled scores (log2 units); -inf: no key yet
    float l[2];  // this thread's share of the running sum of 2^(x - m)

    __device__ __forceinline__ void init() {
        m[0] = m[1] = neg_inf();
        l[0] = l[1] = 0.f;
    }

    // s: raw scores of key columns n0 .. n0 + BN - 1 for rows row_lo (h = 0) and row_lo + 8.
    __device__ __forceinline__ void scores(float (&s)[BN / 2], float (&alpha)[2], float scale_log2, bool masked,
                                           int n0, int row_lo, int S_k, int causal, int off, int q) {
        // the warp's rows are row_lo - g .. row_lo - g + 15 (g = lane / 4)
        const int warp_row = row_lo - (int)((threadIdx.x & 31) >> 2);
        const bool cols_only = COLMASK && !(causal && n0 + BN - 1 > warp_row + off);
        if (masked && cols_only) {
#pragma unroll
            for (int j = 0; j < BN / 8; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e)
                    if (n0 + 8 * j + 2 * q + e >= S_k) s[4 * j + e] = s[4 * j + 2 + e] = neg_inf();
        } else if (masked) {
            // row h keeps columns n0 + 8 j + 2 q + e <= its last key: one compare an element
            // against a constant, the row's limit taken once
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int last = causal ? min(S_k - 1, row_lo + 8 * h + off) : S_k - 1;
                const int lim = last - n0 - 2 * q;
#pragma unroll
                for (int j = 0; j < BN / 8; ++j)
#pragma unroll
                    for (int e = 0; e < 2; ++e)
                        if (8 * j + e > lim) s[4 * j + 2 * h + e] = neg_inf();
            }
        }
        constexpr int P = TREE ? 4 : 1;  // partial maxima and sums a row
        const auto add = [](float a, float b) { return a + b; };
        const auto max = [](float a, float b) { return fmaxf(a, b); };
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float mq[P], sq[P];
#pragma unroll
            for (int i = 0; i < P; ++i) mq[i] = neg_inf(), sq[i] = 0.f;
#pragma unroll
            for (int j = 0; j < BN / 8; ++j) mq[j % P] = fmaxf(mq[j % P], fmaxf(s[4 * j + 2 * h], s[4 * j + 2 * h + 1]));
            float mx = combine_parts(mq, max);
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));
            const float m_new = fmaxf(m[h], mx * scale_log2);
            // a row with no key so far keeps m = -inf: subtract 0 instead (its p are all 0)
            const float m_use = m_new == neg_inf() ? 0.f : m_new;
            alpha[h] = softmax_exp2<FAST>(m[h] - m_use);  // 0 when m[h] = -inf
            m[h] = m_new;
#pragma unroll
            for (int j = 0; j < BN / 8; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const float x = softmax_exp2<FAST>(fmaf(s[4 * j + 2 * h + e], scale_log2, -m_use));
                    s[4 * j + 2 * h + e] = x;
                    sq[(2 * j + e) % P] += x;
                }
            const float sum = combine_parts(sq, add);
            l[h] = fmaf(l[h], alpha[h], sum);
        }
    }

    __device__ __forceinline__ static void rescale(float (&o)[D / 2], const float (&alpha)[2]) {
#pragma unroll
        for (int j = 0; j < D / 8; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                o[4 * j + 2 * h] *= alpha[h];
                o[4 * j + 2 * h + 1] *= alpha[h];
            }
    }

    __device__ __forceinline__ void step(float (&s)[BN / 2], float (&o)[D / 2], float scale_log2, bool masked,
                                         int n0, int row_lo, int S_k, int causal, int off, int q) {
        float alpha[2];
        scores(s, alpha, scale_log2, masked, n0, row_lo, S_k, causal, off, q);
        rescale(o, alpha);
    }
};

template <bool BF16, int BN>
__device__ __forceinline__ void pack_p(const float (&s)[BN / 2], unsigned (&p)[BN / 4]) {
#pragma unroll
    for (int i = 0; i < BN / 4; ++i) p[i] = pack2(s[2 * i], s[2 * i + 1], BF16);
}

// Issue S = Q K^T for one warpgroup's 64 rows (sQ: the Q tile, rows 64 wg..; sK: the K
// tile) as one wgmma group; s is not readable before a wait (and fence_s). DADD: each k step
// added to the tile's descriptor (v7's; desc_kmajor in attention_sm90_common.cuh). R: the Q
// tile's rows; TR: the K tile's rows (BN, or more where the BN keys are its first rows).
template <bool BF16, int D, int BN, bool DADD = false, int R = BM, int TR = BN>
__device__ __forceinline__ void issue_qk(float (&s)[BN / 2], unsigned sQ, unsigned sK, int wg) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
        kl_wgmma_ss<BN, BF16>(s, desc_kmajor<D, R, DADD>(sQ, 64 * wg, kk), desc_kmajor<D, TR, DADD>(sK, 0, kk),
                              kk > 0);
    wgmma_commit();
}

// Issue O += P V (P from registers, V: the tile at sV) as one wgmma group; neither o nor p
// may be touched before a wait (and fence_pv). TR: the V tile's rows (issue_qk's).
template <bool BF16, int D, int BN, bool DADD = false, int TR = BN>
__device__ __forceinline__ void issue_pv(float (&o)[D / 2], unsigned (&p)[BN / 4], unsigned sV) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk)
        kl_wgmma_rs<D, BF16>(o, p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3],
                             desc_mnmajor<D, TR, DADD>(sV, 16 * kk), 1);
    wgmma_commit();
}

template <int BN>
__device__ __forceinline__ void fence_s(float (&s)[BN / 2]) {
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) fence_reg(s[i]);
}

template <int D, int BN>
__device__ __forceinline__ void fence_pv(float (&o)[D / 2], unsigned (&p)[BN / 4]) {
#pragma unroll
    for (int i = 0; i < D / 2; ++i) fence_reg(o[i]);
#pragma unroll
    for (int i = 0; i < BN / 4; ++i) fence_reg(p[i]);
}

template <bool BF16, int D, int BN>
__device__ __forceinline__ void mma_qk(float (&s)[BN / 2], unsigned sQ, unsigned sK, int wg) {
    issue_qk<BF16, D, BN>(s, sQ, sK, wg);
    wgmma_wait<0>();
    fence_s<BN>(s);
}

template <bool BF16, int D, int BN>
__device__ __forceinline__ void mma_pv(float (&o)[D / 2], unsigned (&p)[BN / 4], unsigned sV) {
    issue_pv<BF16, D, BN>(o, p, sV);
    wgmma_wait<0>();
    fence_pv<D, BN>(o, p);
}

// o = O / l and lse = m + log2(l) for the thread's two rows (0 and -inf for a row with no key).
template <typename T, int D, int BN>
__device__ __forceinline__ void epilogue(const Softmax<D, BN>& sm, const float (&o)[D / 2], T* __restrict__ ob,
                                         long long sos, float* __restrict__ lse_b, int row_lo, int S_q, int q) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float l = sm.l[h];
        l += __shfl_xor_sync(0xffffffff, l, 1);
        l += __shfl_xor_sync(0xffffffff, l, 2);
        const float inv = l > 0.f ? 1.f / l : 0.f;
        const int row = row_lo + 8 * h;
        if (row < S_q) {
            T* orow = ob + row * sos;
#pragma unroll
            for (int j = 0; j < D / 8; ++j) store2(orow + 8 * j + 2 * q, o[4 * j + 2 * h] * inv, o[4 * j + 2 * h + 1] * inv);
            if (q == 0) lse_b[row] = l > 0.f ? sm.m[h] + log2f(l) : neg_inf();
        }
    }
}

// --------------------------------------------------------------------------------------- v2

template <typename T, bool BF16, int D>
__device__ __forceinline__ void fwd_v2(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                                       T* __restrict__ o, float* __restrict__ lse, int S_q, int S_k, int H,
                                       int group, float scale_log2, int causal, long long sqz, long long sqh,
                                       long long sqs, long long skz, long long skh, long long sks, long long svz,
                                       long long svh, long long svs, long long soz, long long soh, long long sos) {
    constexpr int BN = Tiles<D>::BN, NT = 256;
    constexpr unsigned Q_BYTES = Tiles<D>::Q_BYTES, KV_BYTES = Tiles<D>::KV_BYTES;
    extern __shared__ unsigned char smem[];
    check_smem(1024 + Q_BYTES + 2 * 2 * KV_BYTES);
    const unsigned sQ = (smem_u32(smem) + 1023u) & ~1023u;  // swizzle atoms need 1024-byte alignment
    const unsigned sKV = sQ + Q_BYTES;                       // stage st: K at sKV + 2 st KV_BYTES, V after it

    const int t = threadIdx.x, wg = t / 128, warp = (t % 128) / 32, lane = t % 32;
    const int g = lane / 4, qd = lane % 4;
    const Block blk = block_of<BN>(S_q, S_k, causal);
    const int h = blockIdx.y, z = blockIdx.z, hk = h / group;
    const T* qb = q + z * sqz + h * sqh;
    const T* kb = k + z * skz + hk * skh;
    const T* vb = v + z * svz + hk * svh;
    const int row_lo = blk.m0 + wg * 64 + warp * 16 + g;  // this thread's rows: row_lo, row_lo + 8

    if (blk.n_tiles > 0) {
        load_tile<T, D, BM, NT>(sQ, qb, sqs, blk.m0, S_q, t);
        load_tile<T, D, BN, NT>(sKV, kb, sks, 0, S_k, t);
        load_tile<T, D, BN, NT>(sKV + KV_BYTES, vb, svs, 0, S_k, t);
        cp_async_commit();
    }
    float acc[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; ++i) acc[i] = 0.f;
    Softmax<D, BN> sm;
    sm.init();

    for (int it = 0; it < blk.n_tiles; ++it) {
        cp_async_wait<0>();   // this thread's chunks of tile it (and Q) landed
        fence_proxy_async();  // ... and are visible to wgmma
        __syncthreads();      // everyone's chunks are in; everyone is past tile it-1's MMAs
        if (it + 1 < blk.n_tiles) {  // tile it+1 into the other stage (tile it-1's, free now)
            const unsigned st = sKV + ((it + 1) & 1) * 2 * KV_BYTES;
            load_tile<T, D, BN, NT>(st, kb, sks, (it + 1) * BN, S_k, t);
            load_tile<T, D, BN, NT>(st + KV_BYTES, vb, svs, (it + 1) * BN, S_k, t);
            cp_async_commit();
        }
        const unsigned sK = sKV + (it & 1) * 2 * KV_BYTES;
        float s[BN / 2];
        mma_qk<BF16, D, BN>(s, sQ, sK, wg);
        const int n0 = it * BN;
        const bool masked = n0 + BN > S_k || (causal && n0 + BN - 1 > blk.m0 + blk.off);
        sm.step(s, acc, scale_log2, masked, n0, row_lo, S_k, causal, blk.off, qd);
        unsigned p[BN / 4];
        pack_p<BF16, BN>(s, p);
        mma_pv<BF16, D, BN>(acc, p, sK + KV_BYTES);
    }
    cp_async_wait_all();  // (nothing is pending; no copy may outlive the block)
    epilogue<T, D, BN>(sm, acc, o + z * soz + h * soh, sos, lse + ((long long)z * H + h) * S_q, row_lo, S_q, qd);
}

// --------------------------------------------------------------------------------------- v3-v7

// One arrival on `bar` when all of this thread's earlier cp.async copies have landed (the
// barrier's count includes it: .noinc).
__device__ __forceinline__ void mbar_arrive_cp_async(unsigned bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

constexpr int WS_THREADS = 384;  // producer warpgroup + two consumer warpgroups

// Stages of the K/V ring: 3 where they fit in 227 KB (D <= 128), else 2.
template <int D>
struct WsStages {
    static constexpr int value = (Tiles<D>::Q_BYTES + 3 * 2 * Tiles<D>::KV_BYTES + 1024 <= 227 * 1024) ? 3 : 2;
};

#ifndef KL_ATTN_V7_COLMASK  // V7Tiles' flags, off unless a module of another tiling sets them
#define KL_ATTN_V7_COLMASK 0
#endif
#ifndef KL_ATTN_V7_LEAN_EPI
#define KL_ATTN_V7_LEAN_EPI 0
#endif
#ifndef KL_ATTN_V7_TREE
#define KL_ATTN_V7_TREE 0
#endif
#ifndef KL_ATTN_V7_NARROW
#define KL_ATTN_V7_NARROW 0
#endif

// v7's tiling per head dim (cuda_sm90.py's V7_TILES mirrors it; a test reads it back from the
// PTX). A module built with -DKL_ATTN_V7_BN=n -DKL_ATTN_V7_STAGES=s and -DKL_ATTN_V7_SPLIT_KV,
// -DKL_ATTN_FAST_EXP, -DKL_ATTN_DESC_ADD, -DKL_ATTN_V7_QUEUE (each 0 or 1),
// -DKL_ATTN_V7_PERSIST (0, 1, 2), -DKL_ATTN_V7_TURNS (0 or 1) and optionally -DKL_ATTN_V7_WG
// (consumer warpgroups, 2 or 3) holds only v7's kernels, at that tiling: how the lab runs
// another one. D <= 128:
// v2-v6's 128 keys x 3 stages. D = 256: FlashAttention-3's 80 keys x 2 stages, 1 + 64 (Q) +
// 2 x 2 x 40 = 225 KB of the 227: each 80-key tile feeds 2 x 2 x 64 x 80 x 256 x 2 = 10.5 MFLOP
// of MMA per block against 8.4 at v2-v6's 64 keys, for the same per-tile costs (two full /
// empty barrier round trips, two turn hand-overs, one row max and sum with its shuffles, one
// rescale of the 128 O registers): 20% fewer per key. Registers: O 128 + S 40 + P 20 = 188.
template <int D>
struct V7Tiles {
#if defined(KL_ATTN_V7_BN)
    static constexpr int BN = KL_ATTN_V7_BN;
    static constexpr int STAGES = KL_ATTN_V7_STAGES;
    static constexpr bool SPLIT_KV = KL_ATTN_V7_SPLIT_KV, FAST_EXP = KL_ATTN_FAST_EXP, DESC_ADD = KL_ATTN_DESC_ADD;
    static constexpr int PERSIST = KL_ATTN_V7_PERSIST;
    static constexpr bool QUEUE = KL_ATTN_V7_QUEUE;
    static constexpr bool TURNS = KL_ATTN_V7_TURNS;
#else
    static constexpr int BN = D == 256 ? 80 : Tiles<D>::BN;
    static constexpr int STAGES = D == 256 ? 2 : WsStages<D>::value;
    // SPLIT_KV: K and V in rings of their own (produce_tma_split, consume_v7), at D = 256;
    // FAST_EXP: the softmax's exponentials by ex2.approx.ftz.f32; DESC_ADD: each wgmma k step
    // added to its tile's descriptor (softmax_exp2, desc_kmajor and desc_mnmajor in
    // attention_sm90_common.cuh say why). Each was faster on an H200 (benchmarks/NOTES.md).
    static constexpr bool SPLIT_KV = D == 256, FAST_EXP = true, DESC_ADD = true;
    // PERSIST: 1, one block an SM walks (query block, head, batch) items in turn (fwd_v7), o
    // staged in Q's buffer; 2, the same with o staged in a buffer of its own after the ring,
    // so that Q's buffer is free once an item's last S = Q K^T is done. 2 at D <= 96, where
    // three stages and o's tile fit; at D = 128 (1 would be its persistent tiling) one block a
    // (query block, head) was faster under causal on an H200, D = 256 has split rings.
    static constexpr int PERSIST = D <= 96 ? 2 : 0;
    // QUEUE (persistent only): a block's first item is blockIdx.x, each next one the value a
    // launch-wide counter hands out (gridDim.x + 0, 1, ...), claimed once the block has issued
    // the current item's last copy: items go to the blocks that are free, as a grid of one
    // block an item is scheduled, rather than blockIdx.x + k gridDim.x.
    static constexpr bool QUEUE = false;
    // TURNS: the consumer warpgroups issue their wgmma groups in turns (named barriers), so
    // that one's softmax runs while the other's GEMMs do; without, each issues when ready.
    static constexpr bool TURNS = true;
#endif
    // WG: consumer warpgroups, 64 query rows each (-DKL_ATTN_V7_WG=3 in a lab module: 192 rows
    // a block, FlashAttention-3's block at head dim 64). Their turns go round in warpgroup order;
    // with three, setmaxnreg 24 / 160 (128 x 24 + 384 x 160 = 64512 of the 512 x 128 at launch).
#if defined(KL_ATTN_V7_WG)
    static constexpr int WG = KL_ATTN_V7_WG;
#else
    static constexpr int WG = 2;
#endif
    // COLMASK, LEAN_EPI (-DKL_ATTN_V7_COLMASK=1 / _LEAN_EPI=1 in a module of another tiling:
    // cuda_sm90.py's V7_SHORT, the lab's): masked tiles that need no causal compare for a warp's
    // rows masking by column alone; the epilogue's 1 / l and log2(l) by rcp / lg2.approx.
    static constexpr bool COLMASK = KL_ATTN_V7_COLMASK, LEAN_EPI = KL_ATTN_V7_LEAN_EPI;
    // TREE (-DKL_ATTN_V7_TREE=1, cuda_sm90.py's V7_MANY): Softmax's row max and sum as four
    // partial ones (Softmax's TREE).
    static constexpr bool TREE = KL_ATTN_V7_TREE;
    // NARROW (-DKL_ATTN_V7_NARROW=1, persistent, BN past Tiles<D>::BN; cuda_sm90.py's V7_SHORT
    // under causal): an item whose keys all fit in Tiles<D>::BN (128) computes that many, the
    // first rows of the ring's wider tile, rather than BN: under causal at 129-208 keys the
    // first query block's one tile is 128 keys wide, the second's one tile BN wide.
    static constexpr bool NARROW = KL_ATTN_V7_NARROW;
    static constexpr int NB = Tiles<D>::BN;  // a narrow item's keys
    static_assert(!NARROW || (PERSIST && BN > NB), "a narrow item is a persistent v7's, narrower than its ring");
    static_assert(WG == 2 || WG == 3, "two or three consumer warpgroups");
    static constexpr int BM = 64 * WG;  // query rows a block
    static constexpr int THREADS = 128 * (WG + 1);
    static constexpr int PRODUCER_REGS = WG == 2 ? 40 : 24, CONSUMER_REGS = WG == 2 ? 232 : 160;
    static_assert(128 * PRODUCER_REGS + 128 * WG * CONSUMER_REGS <= 65536, "setmaxnreg's pool");
    static_assert(!QUEUE || PERSIST, "the item queue feeds the persistent v7");
    static_assert(!(PERSIST && SPLIT_KV), "the persistent v7 has the one K/V ring");
    static constexpr unsigned KV_BYTES = BN * D * 2;
    static constexpr unsigned Q_BYTES = BM * D * 2;
    static constexpr unsigned O_BYTES = PERSIST == 2 ? Q_BYTES : 0;  // o's own staging buffer
    static_assert(BN % 16 == 0 && BN <= 256, "keys per tile: whole 16-key steps of P V, one TMA box");
    static_assert((BN * Layout<D>::W) % 1024 == 0, "K/V slabs must keep 1024-byte alignment");
    static_assert(Q_BYTES + STAGES * 2 * KV_BYTES + O_BYTES + 1024 <= 227 * 1024, "v7's ring must fit 227 KB");
};

// The barriers of v3-v7 (static shared memory): full[st] (the copies of stage st landed),
// empty[st] (count `warps`: every consumer warp is done with it; 8, 12 with v7's three
// consumer warpgroups), q_full. `arrivals`: the full barriers' count (v3: one cp.async
// arrival per producer thread, 128; TMA: 1).
// SPLIT (v7 with V7Tiles' SPLIT_KV): K and V have rings of their own over the same stages:
// full / empty guard the K tiles only, v_full / v_empty (after q_full, 4 x STAGES + 1
// barriers in all) the V tiles.
template <int STAGES, bool SPLIT = false>
struct Bars {
    unsigned full0, empty0, q_full;
    unsigned v_full0, v_empty0;  // SPLIT only

    __device__ __forceinline__ Bars(unsigned long long* bars, unsigned arrivals, unsigned warps = 8) {
        full0 = smem_u32(&bars[0]);
        empty0 = smem_u32(&bars[STAGES]);
        q_full = smem_u32(&bars[2 * STAGES]);
        if constexpr (SPLIT) {
            v_full0 = smem_u32(&bars[2 * STAGES + 1]);
            v_empty0 = smem_u32(&bars[3 * STAGES + 1]);
        }
        if (threadIdx.x == 0) {
            for (int st = 0; st < STAGES; ++st) {
                mbar_init(full0 + 8 * st, arrivals);
                mbar_init(empty0 + 8 * st, warps);
                if constexpr (SPLIT) {
                    mbar_init(v_full0 + 8 * st, arrivals);
                    mbar_init(v_empty0 + 8 * st, warps);
                }
            }
            mbar_init(q_full, arrivals);
            asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        }
        __syncthreads();
    }
    __device__ __forceinline__ unsigned full(int it) const { return full0 + 8 * (it % STAGES); }
    __device__ __forceinline__ unsigned empty(int it) const { return empty0 + 8 * (it % STAGES); }
    __device__ __forceinline__ unsigned v_full(int it) const { return v_full0 + 8 * (it % STAGES); }
    __device__ __forceinline__ unsigned v_empty(int it) const { return v_empty0 + 8 * (it % STAGES); }
};

// v3's producer warpgroup (128 threads): Q, then K/V tile it into stage it % STAGES once
// the consumers released the tile that used it before; each thread's arrival on the
// stage's full barrier fires when its own copies have landed.
template <typename T, int D, int STAGES>
__device__ __forceinline__ void produce_cp_async(const Block& blk, const Bars<STAGES>& b, unsigned sQ, unsigned sKV,
                                                 const T* qb, long long sqs, const T* kb, long long sks,
                                                 const T* vb, long long svs, int S_q, int S_k, int t) {
    constexpr int BN = Tiles<D>::BN;
    constexpr unsigned KV_BYTES = Tiles<D>::KV_BYTES;
    load_tile<T, D, BM, 128, 2>(sQ, qb, sqs, blk.m0, S_q, t);
    mbar_arrive_cp_async(b.q_full);
    for (int it = 0; it < blk.n_tiles; ++it) {
        if (it >= STAGES) mbar_wait(b.empty(it), (it / STAGES - 1) & 1);  // tile it-STAGES consumed
        const unsigned sK = sKV + (it % STAGES) * 2 * KV_BYTES;
        load_tile<T, D, BN, 128, 2>(sK, kb, sks, it * BN, S_k, t);
        load_tile<T, D, BN, 128, 2>(sK + KV_BYTES, vb, svs, it * BN, S_k, t);
        mbar_arrive_cp_async(b.full(it));
    }
    cp_async_wait_all();  // no copy outlives its thread
}

// Key tile `it` of K and V (head hk, batch z) into the ring's use u (stage u % STAGES) once
// the consumers released the tile that used the stage before; one full barrier, both tiles.
template <int D, int STAGES, int BN>
__device__ __forceinline__ void load_kv_tile(const Bars<STAGES>& b, unsigned sKV, const TensorMap* tk,
                                             const TensorMap* tv, int u, int it, int hk, int z) {
    constexpr unsigned KV_BYTES = BN * D * 2;
    if (u >= STAGES) mbar_wait(b.empty(u), (u / STAGES - 1) & 1);
    const unsigned sK = sKV + (u % STAGES) * 2 * KV_BYTES, bar = b.full(u);
    mbar_expect_tx(bar, 2 * KV_BYTES);
    tma_tile<D, BN>(sK, tk, bar, it * BN, hk, z);
    tma_tile<D, BN>(sK + KV_BYTES, tv, bar, it * BN, hk, z);
}

// v4-v7's producer: one thread issues every copy (TMA boxes).
template <int D, int STAGES, int BN = Tiles<D>::BN, int R = BM>
__device__ __forceinline__ void produce_tma(const Block& blk, const Bars<STAGES>& b, unsigned sQ, unsigned sKV,
                                            const TensorMap* tq, const TensorMap* tk, const TensorMap* tv, int h,
                                            int hk, int z) {
    mbar_expect_tx(b.q_full, R * D * 2);
    tma_tile<D, R>(sQ, tq, b.q_full, blk.m0, h, z);
    for (int it = 0; it < blk.n_tiles; ++it) load_kv_tile<D, STAGES, BN>(b, sKV, tk, tv, it, it, hk, z);
}

// One item of the persistent v7 (fwd_v7): query block, head and batch.
struct Item {
    int mb, h, z;
};

// The (batch, head) pairs whose K and V fit in L2 together (32 MB of H100's and H200's 50):
// under causal a chunk of them is walked heaviest query block first, so the blocks running at
// once read the K / V of a chunk's heads, not of every head.
constexpr long long ITEM_L2_BYTES = 32ll << 20;

template <int D>
__device__ __forceinline__ int heads_per_chunk(int S_k, int ZH) {
    const long long n = ITEM_L2_BYTES / (4ll * D * (S_k > 0 ? S_k : 1));  // a head's K and V, 16-bit
    return n < 1 ? 1 : n > ZH ? ZH : (int)n;
}

// Item i of n_mb query blocks x H heads x Z batches: under causal, chunk after chunk of
// heads_per_chunk (batch, head) pairs, each chunk's heaviest query blocks first (its pairs'
// last blocks, then the blocks before them); else a head's query blocks one after another
// (its K / V tiles read again from L2).
template <int D>
__device__ __forceinline__ Item item_of(int i, int n_mb, int H, int Z, int causal, int S_k) {
    if (!causal) {
        const int zh = i / n_mb;
        return Item{i % n_mb, zh % H, zh / H};
    }
    const int hc = heads_per_chunk<D>(S_k, Z * H), c = i / (hc * n_mb), w = i - c * hc * n_mb;
    const int base = c * hc, cs = min(hc, Z * H - base), zh = base + w % cs;
    return Item{n_mb - 1 - w / cs, zh % H, zh / H};
}

// The persistent v7's producer (one thread, one ring): per item of the block's (items
// blockIdx.x, + gridDim.x, ...), its first STAGES K/V tiles (their stages were released by
// earlier items: they load while the consumers finish the item before), then Q once the
// consumers gave its buffer back (q_empty: after the epilogue's store read o out of it, or
// with o staged apart, after the last S = Q K^T), then the rest. Q
// loads for every item, with or without key tiles, so that q_full and q_empty count items.
// With V7Tiles' QUEUE the next item comes from the counter `sched` (zeroed before the launch)
// once this one's last copy is issued, and each item is announced to the consumers in
// `item_slot`, written before its Q's q_full arrival (the end, an item past the last, by a
// plain arrival); the slot is rewritten only after q_empty, which the consumers reach after
// reading it.
template <int D, int STAGES, int BN>
__device__ __forceinline__ void produce_tma_persist(const Bars<STAGES>& b, unsigned q_empty, unsigned sQ,
                                                    unsigned sKV, const TensorMap* tq, const TensorMap* tk,
                                                    const TensorMap* tv, int S_q, int S_k, int H, int group, int Z,
                                                    int causal, int* sched, int* item_slot) {
    constexpr bool QUEUE = V7Tiles<D>::QUEUE;
    constexpr int R = V7Tiles<D>::BM;
    const int n_mb = (S_q + R - 1) / R, items = n_mb * H * Z;
    int r = 0;  // the ring's uses so far
    for (int i = blockIdx.x, k = 0; QUEUE || i < items; ++k) {
        if (QUEUE && i >= items) {  // the end
            if (k > 0) mbar_wait(q_empty, (k - 1) & 1);
            *item_slot = i;
            mbar_arrive(b.q_full);
            break;
        }
        const Item w = item_of<D>(i, n_mb, H, Z, causal, S_k);
        const int n = block_at<BN, R>(w.mb, S_q, S_k, causal).n_tiles, hk = w.h / group;
        const int pre = n < STAGES ? n : STAGES;
        for (int it = 0; it < pre; ++it) load_kv_tile<D, STAGES, BN>(b, sKV, tk, tv, r + it, it, hk, w.z);
        if (k > 0) mbar_wait(q_empty, (k - 1) & 1);
        if constexpr (QUEUE) *item_slot = i;
        mbar_expect_tx(b.q_full, V7Tiles<D>::Q_BYTES);
        tma_tile<D, R>(sQ, tq, b.q_full, w.mb * R, w.h, w.z);
        for (int it = pre; it < n; ++it) load_kv_tile<D, STAGES, BN>(b, sKV, tk, tv, r + it, it, hk, w.z);
        r += n;
        i = QUEUE ? (int)gridDim.x + atomicAdd(sched, 1) : i + (int)gridDim.x;
    }
}

// v7's producer with split K / V rings (FlashAttention-3's order): Q and K_0, then per key
// tile it >= 1 K_it followed by V_{it-1}, and V_{n-1} last. K_it waits only for the K of tile
// it - STAGES (released once both warpgroups' S of it are done, before their softmax), V_it
// for the V of tile it - STAGES (released after its P V): a K load is not held back by the
// P V and softmax of older tiles. Each full barrier counts one tile's bytes.
template <int D, int STAGES, int BN>
__device__ __forceinline__ void produce_tma_split(const Block& blk, const Bars<STAGES, true>& b, unsigned sQ,
                                                  unsigned sKV, const TensorMap* tq, const TensorMap* tk,
                                                  const TensorMap* tv, int h, int hk, int z) {
    constexpr unsigned KV_BYTES = BN * D * 2;
    auto load_k = [&](int it) {
        if (it >= STAGES) mbar_wait(b.empty(it), (it / STAGES - 1) & 1);  // K_{it - STAGES} consumed
        mbar_expect_tx(b.full(it), KV_BYTES);
        tma_tile<D, BN>(sKV + (it % STAGES) * 2 * KV_BYTES, tk, b.full(it), it * BN, hk, z);
    };
    auto load_v = [&](int it) {
        if (it >= STAGES) mbar_wait(b.v_empty(it), (it / STAGES - 1) & 1);  // V_{it - STAGES} consumed
        mbar_expect_tx(b.v_full(it), KV_BYTES);
        tma_tile<D, BN>(sKV + (it % STAGES) * 2 * KV_BYTES + KV_BYTES, tv, b.v_full(it), it * BN, hk, z);
    };
    mbar_expect_tx(b.q_full, V7Tiles<D>::Q_BYTES);
    tma_tile<D, V7Tiles<D>::BM>(sQ, tq, b.q_full, blk.m0, h, z);
    load_k(0);
    for (int it = 1; it < blk.n_tiles; ++it) {
        load_k(it);
        load_v(it - 1);
    }
    load_v(blk.n_tiles - 1);
}

// A consumer thread of the ring (threads 128..383): its warpgroup cw, its lane, its
// fragment's first row, and per K/V tile it: the stage's shared address, the wait for it,
// the release of the stage by this warp, and whether the tile needs the mask. BN: keys per
// tile. r0: the ring's use count before the block's tile 0 (the persistent v7's earlier items).
template <int D, int STAGES, int BN = Tiles<D>::BN, bool SPLIT = false>
struct Consumer {
    const Block& blk;
    const Bars<STAGES, SPLIT>& b;
    unsigned sKV;
    int S_k, causal, cw, lane, qd, row_lo, r0;
    __device__ __forceinline__ Consumer(const Block& blk_, const Bars<STAGES, SPLIT>& b_, unsigned sKV_, int S_k_,
                                        int causal_, int t, int r0_ = 0)
        : blk(blk_), b(b_), sKV(sKV_), S_k(S_k_), causal(causal_), r0(r0_) {
        cw = t / 128 - 1;
        const int warp = (t % 128) / 32;
        lane = t % 32;
        const int g = lane / 4;
        qd = lane % 4;
        row_lo = blk.m0 + cw * 64 + warp * 16 + g;
    }
    __device__ __forceinline__ unsigned stage(int it) const {
        return sKV + ((r0 + it) % STAGES) * 2 * (BN * D * 2);
    }
    __device__ __forceinline__ void wait_full(int it) const {
        mbar_wait(b.full(r0 + it), ((r0 + it) / STAGES) & 1);
    }
    __device__ __forceinline__ void wait_v_full(int it) const {
        mbar_wait(b.v_full(r0 + it), ((r0 + it) / STAGES) & 1);
    }
    __device__ __forceinline__ void release(int it) const {
        __syncwarp();
        if (lane == 0) mbar_arrive(b.empty(r0 + it));  // this warp is done with the stage
    }
    // Split rings: ``release`` gives back K_it alone, this V_it.
    __device__ __forceinline__ void release_v(int it) const {
        __syncwarp();
        if (lane == 0) mbar_arrive(b.v_empty(r0 + it));  // this warp is done with V_it
    }
    // NB: the keys a tile computes (BN, or fewer of a wider ring's tile: v7's NARROW)
    template <int NB = BN>
    __device__ __forceinline__ bool masked(int it) const {
        const int n0 = it * NB;
        return n0 + NB > S_k || (causal && n0 + NB - 1 > blk.m0 + blk.off);
    }
};

// The two consumer warpgroups of v3-v5 (threads 128..383). OVERLAP (v5): the QK^T of tile
// it and the P V of tile it-1 are in flight together, and the softmax of tile it runs
// while the P V does (FlashAttention-3's intra-warpgroup pipelining); O is rescaled once
// that P V is done. FENCE: the stages were written by cp.async (generic proxy).
template <typename T, bool BF16, int D, int STAGES, bool OVERLAP, bool FENCE>
__device__ __forceinline__ void consume(const Block& blk, const Bars<STAGES>& b, unsigned sQ, unsigned sKV,
                                        T* __restrict__ ob, long long sos, float* __restrict__ lse_b, int S_q,
                                        int S_k, float scale_log2, int causal, int t) {
    constexpr int BN = Tiles<D>::BN;
    constexpr unsigned KV_BYTES = Tiles<D>::KV_BYTES;
    const Consumer<D, STAGES> c(blk, b, sKV, S_k, causal, t);
    const int cw = c.cw, qd = c.qd, row_lo = c.row_lo;
    float acc[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; ++i) acc[i] = 0.f;
    Softmax<D, BN> sm;
    sm.init();
    auto wait_full = [&](int it) {
        mbar_wait(b.full(it), (it / STAGES) & 1);
        if (FENCE) fence_proxy_async();  // the copies (generic proxy) before wgmma's reads (async proxy)
    };
    if (blk.n_tiles > 0) mbar_wait(b.q_full, 0);
    if (!OVERLAP) {
        for (int it = 0; it < blk.n_tiles; ++it) {
            wait_full(it);
            float s[BN / 2];
            mma_qk<BF16, D, BN>(s, sQ, c.stage(it), cw);
            sm.step(s, acc, scale_log2, c.masked(it), it * BN, row_lo, S_k, causal, blk.off, qd);
            unsigned p[BN / 4];
            pack_p<BF16, BN>(s, p);
            mma_pv<BF16, D, BN>(acc, p, c.stage(it) + KV_BYTES);
            c.release(it);
        }
    } else if (blk.n_tiles > 0) {
        unsigned p[BN / 4];  // P of the tile before the current one
        {
            wait_full(0);
            float s[BN / 2], alpha[2];
            mma_qk<BF16, D, BN>(s, sQ, c.stage(0), cw);
            sm.scores(s, alpha, scale_log2, c.masked(0), 0, row_lo, S_k, causal, blk.off, qd);  // (O = 0)
            pack_p<BF16, BN>(s, p);
        }
        for (int it = 1; it < blk.n_tiles; ++it) {
            wait_full(it);
            float s[BN / 2], alpha[2];
            issue_qk<BF16, D, BN>(s, sQ, c.stage(it), cw);           // S = Q K_it^T
            issue_pv<BF16, D, BN>(acc, p, c.stage(it - 1) + KV_BYTES);  // O += P V_{it-1}
            wgmma_wait<1>();                                       // the older group, S, is done
            fence_s<BN>(s);
            sm.scores(s, alpha, scale_log2, c.masked(it), it * BN, row_lo, S_k, causal, blk.off, qd);
            wgmma_wait<0>();
            fence_pv<D, BN>(acc, p);
            c.release(it - 1);
            Softmax<D, BN>::rescale(acc, alpha);
            pack_p<BF16, BN>(s, p);
        }
        issue_pv<BF16, D, BN>(acc, p, c.stage(blk.n_tiles - 1) + KV_BYTES);
        wgmma_wait<0>();
        fence_pv<D, BN>(acc, p);
        c.release(blk.n_tiles - 1);
    }
    epilogue<T, D, BN>(sm, acc, ob, sos, lse_b, row_lo, S_q, qd);
}

// v6's turns: named barriers PP_BAR (warpgroup 0's turn) and PP_BAR + 1 (warpgroup 1's),
// each met by 256 threads: 128 bar.sync (the warpgroup whose turn it is) + 128 bar.arrive
// (the other). Id 0 is __syncthreads' (Bars' constructor); v7 adds EPI_BAR (3, 4).
constexpr int PP_BAR = 1;
constexpr int PP_COUNT = 256;

__device__ __forceinline__ void named_sync(int id) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(PP_COUNT) : "memory");
}
__device__ __forceinline__ void named_arrive(int id) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(PP_COUNT) : "memory");
}

// v6's consumers (threads 128..383): v4's arithmetic, the GEMMs in turns (the schedule is
// in the header). A turn issues O += P_{it-1} V_{it-1} and S_it = Q K_it^T as two wgmma
// groups, hands the tensor cores to the other warpgroup, then waits for both (the other
// warpgroup's GEMMs queue behind them) and runs the softmax of S_it, rescaling O.
template <typename T, bool BF16, int D, int STAGES>
__device__ __forceinline__ void consume_pingpong(const Block& blk, const Bars<STAGES>& b, unsigned sQ, unsigned sKV,
                                                 T* __restrict__ ob, long long sos, float* __restrict__ lse_b,
                                                 int S_q, int S_k, float scale_log2, int causal, int t) {
    constexpr int BN = Tiles<D>::BN;
    constexpr unsigned KV_BYTES = Tiles<D>::KV_BYTES;
    const Consumer<D, STAGES> c(blk, b, sKV, S_k, causal, t);
    const int cw = c.cw, qd = c.qd, row_lo = c.row_lo;
    const int mine = PP_BAR + cw, other = PP_BAR + 1 - cw;
    float acc[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; ++i) acc[i] = 0.f;
    Softmax<D, BN> sm;
    sm.init();
    const int n = blk.n_tiles;
    if (n > 0) {
        if (cw == 1) named_arrive(other);  // warpgroup 0 takes the first turn
        mbar_wait(b.q_full, 0);
        unsigned p[BN / 4];  // P of the tile before the current one
        {
            mbar_wait(b.full(0), 0);
            float s[BN / 2];
            named_sync(mine);  // turn 0: S_0
            issue_qk<BF16, D, BN>(s, sQ, c.stage(0), cw);
            named_arrive(other);  // (n >= 1 turns remain for both)
            wgmma_wait<0>();
            fence_s<BN>(s);
            sm.step(s, acc, scale_log2, c.masked(0), 0, row_lo, S_k, causal, blk.off, qd);
            pack_p<BF16, BN>(s, p);
        }
        for (int it = 1; it < n; ++it) {
            mbar_wait(b.full(it), (it / STAGES) & 1);
            float s[BN / 2];
            named_sync(mine);  // turn it: S_it and O += P V_{it-1}
            issue_qk<BF16, D, BN>(s, sQ, c.stage(it), cw);
            issue_pv<BF16, D, BN>(acc, p, c.stage(it - 1) + KV_BYTES);
            named_arrive(other);
            wgmma_wait<0>();
            fence_s<BN>(s);
            fence_pv<D, BN>(acc, p);
            c.release(it - 1);
            sm.step(s, acc, scale_log2, c.masked(it), it * BN, row_lo, S_k, causal, blk.off, qd);
            pack_p<BF16, BN>(s, p);
        }
        named_sync(mine);  // turn n: the last P V
        issue_pv<BF16, D, BN>(acc, p, c.stage(n - 1) + KV_BYTES);
        if (cw == 0) named_arrive(other);  // warpgroup 1's last turn follows; 0 has none left
        wgmma_wait<0>();
        fence_pv<D, BN>(acc, p);
        c.release(n - 1);
    }
    epilogue<T, D, BN>(sm, acc, ob, sos, lse_b, row_lo, S_q, qd);
}

// v7's epilogue barriers: EPI_BAR + w, met by warpgroup w's 128 threads once they wrote
// their O rows to shared memory (ids 1 and 2 are the turns, 0 is __syncthreads'). With three
// consumer warpgroups the turns take ids 1-3 and the epilogue's start at EPI_BAR + 1
// (epi_bar: 4-6).
constexpr int EPI_BAR = 3;
constexpr int EPI_COUNT = 128;

template <int WG>
__device__ __forceinline__ int epi_bar(int cw) {
    return EPI_BAR + (WG - 2) + cw;
}

__device__ __forceinline__ void named_sync_wg(int id) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(EPI_COUNT) : "memory");
}

__device__ __forceinline__ void st_shared_u32(unsigned addr, unsigned v) {
    asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}

// Box (c0, c1, c2, c3) of a 4-D tensor map from shared memory at src to global memory
// (TMA store: elements outside the map's dims are not written). One bulk group.
__device__ __forceinline__ void tma_store_4d(const TensorMap* map, unsigned src, int c0, int c1, int c2, int c3) {
    asm volatile(
        "cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
            reinterpret_cast<unsigned long long>(map)),
        "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
        : "memory");
}
// Commit this thread's bulk stores and wait until they have read their shared memory (the
// block's shared memory must outlive the reads; the global writes complete by the kernel's end).
__device__ __forceinline__ void tma_store_drain() {
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
    asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}

// v7: o = O / l through shared memory and a TMA store; lse = m + log2(l) as ``epilogue``
// writes it (0 and -inf for a row with no key). sQ: the Q tile, whose rows 64 cw .. 64 cw
// + 63 this warpgroup alone has read (its wgmmas are all done) and now overwrites (or, with
// V7Tiles' PERSIST 2, o's own buffer, laid out as the Q tile).
// SM: the consumer's Softmax (its m and l).
template <bool BF16, int D, int WG, bool LEAN, class SM>
__device__ __forceinline__ void epilogue_tma(const SM& sm, const float (&o)[D / 2], unsigned sQ, const TensorMap* to,
                                             float* __restrict__ lse_b, int m0, int cw, int row_lo, int S_q, int h_q,
                                             int z, int t) {
    using L = Layout<D>;
    constexpr int R = 64 * WG;  // the tile's rows
    const int q = t % 4, r_lo = row_lo - m0;  // r_lo: the thread's first row within the tile
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float l = sm.l[h];
        l += __shfl_xor_sync(0xffffffff, l, 1);
        l += __shfl_xor_sync(0xffffffff, l, 2);
        // LEAN (V7Tiles' LEAN_EPI): 1 / l and log2(l) by the MUFU alone (l >= 1 where > 0)
        const float inv = l > 0.f ? (LEAN ? rcp_approx(l) : 1.f / l) : 0.f;
        const int r = r_lo + 8 * h;
#pragma unroll
        for (int j = 0; j < D / 8; ++j)  // columns 8j + 2q, 8j + 2q + 1: bytes 4q of chunk j
            st_shared_u32(sQ + tile_offset<D, R>(r, j) + 4 * q,
                          pack2(o[4 * j + 2 * h] * inv, o[4 * j + 2 * h + 1] * inv, BF16));
        const int row = row_lo + 8 * h;
        if (row < S_q && q == 0) lse_b[row] = l > 0.f ? sm.m[h] + (LEAN ? lg2_approx(l) : log2f(l)) : neg_inf();
    }
    fence_proxy_async();  // these st.shared (generic proxy) before the TMA's reads (async proxy)
    named_sync_wg(epi_bar<WG>(cw));
    const int row0 = m0 + 64 * cw;
    if (t % 128 == 0 && row0 < S_q) {
#pragma unroll
        for (int sl = 0; sl < D / L::E; ++sl)
            tma_store_4d(to, sQ + sl * (R * L::W) + 64 * cw * L::W, sl * L::E, row0, h_q, z);
        tma_store_drain();
    }
}

// v7's consumers (threads 128..383): v6's turns with v5's overlap in each (the schedule is
// in the header). O is rescaled by the previous tile's alpha inside the turn, after S_it is
// issued (the tensor cores are busy with it) and before the P V that adds to O, so O =
// alpha O + P V in emulate's order. BN: V7Tiles' keys per tile.
// With V7Tiles' SPLIT_KV (produce_tma_split's rings): the full barrier waited before a turn
// is K's; V_{it-1} is waited inside the turn, after S_it is issued (the producer loads it after
// K_it, and everything it waits for is released by earlier turns or outside the turns, so the
// wait cannot hold up a turn the producer needs); K_it is released as soon as S_it is done
// (wgmma_wait<1>), V_{it-1} once its P V is.
// With V7Tiles' PERSIST this is one item of the block's: its key tiles are the ring's uses
// r0 .. r0 + n - 1, its Q is q_full's phase q_phase (waited even with no key tile: the
// producer loads every item's Q, and the epilogue must not stage o over a Q still landing),
// and Q's buffer goes back by q_empty: at PERSIST 1 once the epilogue's store has read o out
// of it (an arrival a warpgroup), at PERSIST 2 (o staged at sO) once the item's last S is
// done (an arrival a warp).
template <bool BF16, int D, int STAGES, int BN, bool SPLIT, int NB = BN>
__device__ __forceinline__ void consume_v7(const Block& blk, const Bars<STAGES, SPLIT>& b, unsigned sQ, unsigned sKV,
                                           unsigned sO, const TensorMap* to, float* __restrict__ lse_b, int S_q,
                                           int S_k, float scale_log2, int causal, int h_q, int z, int t, int r0 = 0,
                                           int q_phase = 0, unsigned q_empty = 0) {
    constexpr unsigned KV_BYTES = BN * D * 2;
    constexpr bool DADD = V7Tiles<D>::DESC_ADD;
    constexpr int PERSIST = V7Tiles<D>::PERSIST;
    constexpr int WG = V7Tiles<D>::WG, R = V7Tiles<D>::BM;
    using SM = Softmax<D, NB, V7Tiles<D>::FAST_EXP, V7Tiles<D>::COLMASK, V7Tiles<D>::TREE>;
    const Consumer<D, STAGES, BN, SPLIT> c(blk, b, sKV, S_k, causal, t, r0);
    const int cw = c.cw, qd = c.qd, row_lo = c.row_lo;
    // turns go round: warpgroup cw hands over to the next one (1 - cw with two)
    const int mine = PP_BAR + cw, other = WG == 2 ? PP_BAR + 1 - cw : PP_BAR + (cw + 1) % WG;
    // the turns (V7Tiles' TURNS): wait for this warpgroup's, hand the next to the other
    auto turn = [&]() {
        if constexpr (V7Tiles<D>::TURNS) named_sync(mine);
    };
    auto hand_over = [&]() {
        if constexpr (V7Tiles<D>::TURNS) named_arrive(other);
    };
    float acc[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; ++i) acc[i] = 0.f;
    SM sm;
    sm.init();
    const int n = blk.n_tiles;
    auto q_done = [&](bool last) {  // PERSIST 2: this warp has read Q for the last time
        if constexpr (PERSIST == 2) {
            if (last) {
                __syncwarp();
                if (c.lane == 0) mbar_arrive(q_empty);
            }
        }
    };
    if constexpr (PERSIST) mbar_wait(b.q_full, q_phase);
    q_done(n == 0);
    if (n > 0) {
        if (cw == WG - 1) hand_over();  // warpgroup 0 takes the first turn
        if constexpr (!PERSIST) mbar_wait(b.q_full, 0);
        unsigned p[NB / 4];  // P of the tile before the current one
        float alpha[2];      // O's factor for that tile's max
        {
            c.wait_full(0);
            float s[NB / 2];
            turn();  // turn 0: S_0
            issue_qk<BF16, D, NB, DADD, R, BN>(s, sQ, c.stage(0), cw);
            hand_over();  // (n >= 1 turns remain for both)
            wgmma_wait<0>();
            q_done(n == 1);
            if constexpr (SPLIT) {
                c.release(0);  // K_0
            }
            fence_s<NB>(s);
            sm.scores(s, alpha, scale_log2, c.template masked<NB>(0), 0, row_lo, S_k, causal, blk.off, qd);
            pack_p<BF16, NB>(s, p);
        }
        for (int it = 1; it < n; ++it) {
            c.wait_full(it);
            float s[NB / 2];
            turn();  // turn it: S_it, then O = alpha O + P V_{it-1}
            issue_qk<BF16, D, NB, DADD, R, BN>(s, sQ, c.stage(it), cw);
            SM::rescale(acc, alpha);
            if constexpr (SPLIT) {
                c.wait_v_full(it - 1);
            }
            issue_pv<BF16, D, NB, DADD, BN>(acc, p, c.stage(it - 1) + KV_BYTES);
            hand_over();
            wgmma_wait<1>();  // the older group, S_it, is done; the P V runs on
            q_done(it == n - 1);
            if constexpr (SPLIT) {
                c.release(it);  // K_it
            }
            fence_s<NB>(s);
            sm.scores(s, alpha, scale_log2, c.template masked<NB>(it), it * NB, row_lo, S_k, causal, blk.off, qd);
            wgmma_wait<0>();
            fence_pv<D, NB>(acc, p);
            if constexpr (SPLIT) {
                c.release_v(it - 1);
            } else {
                c.release(it - 1);
            }
            pack_p<BF16, NB>(s, p);
        }
        SM::rescale(acc, alpha);  // (nothing in flight: before the turn)
        turn();  // turn n: the last P V
        if constexpr (SPLIT) {
            c.wait_v_full(n - 1);
        }
        issue_pv<BF16, D, NB, DADD, BN>(acc, p, c.stage(n - 1) + KV_BYTES);
        if (cw != WG - 1) hand_over();  // the next warpgroup's last turn follows; the last one's is the end
        wgmma_wait<0>();
        fence_pv<D, NB>(acc, p);
        if constexpr (SPLIT) {
            c.release_v(n - 1);
        } else {
            c.release(n - 1);
        }
    }
    // PERSIST 2: the item before's store has read sO (its drain, by this warpgroup's first
    // thread, before it reached this barrier)
    if constexpr (PERSIST == 2) named_sync_wg(epi_bar<WG>(cw));
    epilogue_tma<BF16, D, WG, V7Tiles<D>::LEAN_EPI>(sm, acc, sO, to, lse_b, blk.m0, cw, row_lo, S_q, h_q, z, t);
    if constexpr (PERSIST == 1) {
        // every thread of the warpgroup wrote its o rows before the store (epilogue_tma's
        // named sync), and the store has read them (its drain): Q's buffer is free
        if (t % 128 == 0) mbar_arrive(q_empty);
    }
}

template <typename T, bool BF16, int D>
__device__ __forceinline__ void fwd_v3(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                                       T* __restrict__ o, float* __restrict__ lse, int S_q, int S_k, int H,
                                       int group, float scale_log2, int causal, long long sqz, long long sqh,
                                       long long sqs, long long skz, long long skh, long long sks, long long svz,
                                       long long svh, long long svs, long long soz, long long soh, long long sos) {
    constexpr int STAGES = WsStages<D>::value;
    extern __shared__ unsigned char smem[];
    __shared__ __align__(8) unsigned long long bars[2 * STAGES + 1];
    check_smem(1024 + Tiles<D>::Q_BYTES + STAGES * 2 * Tiles<D>::KV_BYTES);
    const unsigned sQ = (smem_u32(smem) + 1023u) & ~1023u;
    const unsigned sKV = sQ + Tiles<D>::Q_BYTES;  // stage st: K at sKV + 2 st KV_BYTES, V after it
    const Bars<STAGES> b(bars, 128);
    const Block blk = block_of<Tiles<D>::BN>(S_q, S_k, causal);
    const int t = threadIdx.x, h = blockIdx.y, z = blockIdx.z, hk = h / group;
    if (t < 128) {  // producer: copies only (128 x 56 + 256 x 224 = 64512 = 384 x 168 registers)
        asm volatile("setmaxnreg.dec.sync.aligned.u32 56;\n");
        if (blk.n_tiles > 0)
            produce_cp_async<T, D, STAGES>(blk, b, sQ, sKV, q + z * sqz + h * sqh, sqs, k + z * skz + hk * skh, sks,
                                           v + z * svz + hk * svh, svs, S_q, S_k, t);
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 224;\n");
    consume<T, BF16, D, STAGES, false, true>(blk, b, sQ, sKV, o + z * soz + h * soh, sos,
                                             lse + ((long long)z * H + h) * S_q, S_q, S_k, scale_log2, causal, t);
}

template <typename T, bool BF16, int D, bool OVERLAP, bool PINGPONG = false>
__device__ __forceinline__ void fwd_tma(const TensorMap* tq, const TensorMap* tk, const TensorMap* tv,
                                        T* __restrict__ o, float* __restrict__ lse, int S_q, int S_k, int H,
                                        int group, float scale_log2, int causal, long long soz, long long soh,
                                        long long sos) {
    constexpr int STAGES = WsStages<D>::value;
    extern __shared__ unsigned char smem[];
    __shared__ __align__(8) unsigned long long bars[2 * STAGES + 1];
    check_smem(1024 + Tiles<D>::Q_BYTES + STAGES * 2 * Tiles<D>::KV_BYTES);
    const unsigned sQ = (smem_u32(smem) + 1023u) & ~1023u;
    const unsigned sKV = sQ + Tiles<D>::Q_BYTES;
    const Bars<STAGES> b(bars, 1);
    const Block blk = block_of<Tiles<D>::BN>(S_q, S_k, causal);
    const int t = threadIdx.x, h = blockIdx.y, z = blockIdx.z;
    if (t < 128) {  // producer: one thread issues the TMA copies (128 x 40 + 256 x 232 = 64512)
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
        if (t == 0 && blk.n_tiles > 0) produce_tma<D, STAGES>(blk, b, sQ, sKV, tq, tk, tv, h, h / group, z);
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
    if (PINGPONG)
        consume_pingpong<T, BF16, D, STAGES>(blk, b, sQ, sKV, o + z * soz + h * soh, sos,
                                             lse + ((long long)z * H + h) * S_q, S_q, S_k, scale_log2, causal, t);
    else
        consume<T, BF16, D, STAGES, OVERLAP, false>(blk, b, sQ, sKV, o + z * soz + h * soh, sos,
                                                    lse + ((long long)z * H + h) * S_q, S_q, S_k, scale_log2, causal,
                                                    t);
}

// v7: v4-v6's block (producer thread, ring, setmaxnreg 40 / 232) with consume_v7, tiled by
// V7Tiles<D> (BN keys, STAGES); o is written through the tensor map `to` (dims (D, S_q, H,
// Z), box E columns x 64 rows); the K / V maps' boxes are E columns x BN rows. With
// V7Tiles' PERSIST the grid is one-dimensional (about one block an SM) and each block walks
// the items blockIdx.x, + gridDim.x, ... of item_of's order; the ring and the barriers carry
// on from one item to the next, so an item's first K / V tiles load during the one before.
template <bool BF16, int D>
__device__ __forceinline__ void fwd_v7(const TensorMap* tq, const TensorMap* tk, const TensorMap* tv,
                                       const TensorMap* to, float* __restrict__ lse, int S_q, int S_k, int H,
                                       int group, float scale_log2, int causal, int Z, int* sched) {
    using V7 = V7Tiles<D>;
    constexpr int STAGES = V7::STAGES, BN = V7::BN, R = V7::BM, WARPS = 4 * V7::WG;
    constexpr bool SPLIT = V7::SPLIT_KV;
    extern __shared__ unsigned char smem[];
    // full / empty, q_full (and with SPLIT: V's full / empty after them)
    __shared__ __align__(8) unsigned long long bars[(SPLIT ? 4 : 2) * STAGES + 1];
    check_smem(1024 + V7::Q_BYTES + STAGES * 2 * V7::KV_BYTES + V7::O_BYTES);
    const unsigned sQ = (smem_u32(smem) + 1023u) & ~1023u;
    const unsigned sKV = sQ + V7::Q_BYTES;
    if constexpr (V7::PERSIST) {
        constexpr bool OWN_O = V7::PERSIST == 2;
        const unsigned sO = OWN_O ? sKV + STAGES * 2 * V7::KV_BYTES : sQ;
        __shared__ __align__(8) unsigned long long q_empty_bar;
        const unsigned q_empty = smem_u32(&q_empty_bar);
        __shared__ int item_slot;  // (QUEUE) the item q_full's phase announces
        // an arrival a consumer warp (OWN_O) or warpgroup; Bars' constructor fences and syncs
        if (threadIdx.x == 0) mbar_init(q_empty, OWN_O ? WARPS : V7::WG);
        const Bars<STAGES> b(bars, 1, WARPS);
        const int t = threadIdx.x;
        if (t < 128) {
            asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(V7::PRODUCER_REGS));
            if (t == 0)
                produce_tma_persist<D, STAGES, BN>(b, q_empty, sQ, sKV, tq, tk, tv, S_q, S_k, H, group, Z, causal,
                                                   sched, &item_slot);
            return;
        }
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(V7::CONSUMER_REGS));
        const int n_mb = (S_q + R - 1) / R, items = n_mb * H * Z;
        int r = 0;
        for (int i = blockIdx.x, k = 0; V7::QUEUE || i < items; ++k) {
            if constexpr (V7::QUEUE) {  // the producer's item (or the end) in item_slot
                mbar_wait(b.q_full, k & 1);
                i = item_slot;
                if (i >= items) break;
            }
            const Item w = item_of<D>(i, n_mb, H, Z, causal, S_k);
            const Block blk = block_at<BN, R>(w.mb, S_q, S_k, causal);
            float* lse_b = lse + ((long long)w.z * H + w.h) * S_q;
            // V7's NARROW: an item whose keys fit in NB computes NB keys of its one tile (without
            // NARROW both calls are the BN-wide consume_v7, the first one dead)
            if (V7::NARROW && key_end<R>(w.mb, S_q, S_k, causal) <= V7::NB)
                consume_v7<BF16, D, STAGES, BN, false, V7::NARROW ? V7::NB : BN>(
                    blk, b, sQ, sKV, sO, to, lse_b, S_q, S_k, scale_log2, causal, w.h, w.z, t, r, k & 1, q_empty);
            else
                consume_v7<BF16, D, STAGES, BN>(blk, b, sQ, sKV, sO, to, lse_b, S_q, S_k, scale_log2, causal, w.h,
                                                w.z, t, r, k & 1, q_empty);
            r += blk.n_tiles;
            if constexpr (!V7::QUEUE) i += gridDim.x;
        }
    } else {
        const Bars<STAGES, SPLIT> b(bars, 1, WARPS);
        const Block blk = block_of<BN, R>(S_q, S_k, causal);
        const int t = threadIdx.x, h = blockIdx.y, z = blockIdx.z;
        if (t < 128) {
            asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(V7::PRODUCER_REGS));
            if constexpr (SPLIT) {
                if (t == 0 && blk.n_tiles > 0)
                    produce_tma_split<D, STAGES, BN>(blk, b, sQ, sKV, tq, tk, tv, h, h / group, z);
            } else {
                if (t == 0 && blk.n_tiles > 0)
                    produce_tma<D, STAGES, BN, R>(blk, b, sQ, sKV, tq, tk, tv, h, h / group, z);
            }
            return;
        }
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(V7::CONSUMER_REGS));
        consume_v7<BF16, D, STAGES, BN>(blk, b, sQ, sKV, sQ, to, lse + ((long long)z * H + h) * S_q, S_q, S_k,
                                        scale_log2, causal, h, z, t);
    }
}

}  // namespace

#define KL_ATTN_ARGS(T)                                                                                        \
    const T *q, const T *k, const T *v, T *o, float *lse, int S_q, int S_k, int H, int group, float scale_log2, \
        int causal, long long sqz, long long sqh, long long sqs, long long skz, long long skh, long long sks,     \
        long long svz, long long svh, long long svs, long long soz, long long soh, long long sos
#define KL_ATTN_PASS                                                                                        \
    q, k, v, o, lse, S_q, S_k, H, group, scale_log2, causal, sqz, sqh, sqs, skz, skh, sks, svz, svh, svs, soz, \
        soh, sos

#define KL_ATTN_TMA_ARGS(T)                                                                                   \
    const __grid_constant__ TensorMap tq, const __grid_constant__ TensorMap tk,                              \
        const __grid_constant__ TensorMap tv, T *o, float *lse, int S_q, int S_k, int H, int group,            \
        float scale_log2, int causal, long long soz, long long soh, long long sos
#define KL_ATTN_TMA_PASS &tq, &tk, &tv, o, lse, S_q, S_k, H, group, scale_log2, causal, soz, soh, sos

#define KL_ATTN_V7_ARGS0                                                                                      \
    const __grid_constant__ TensorMap tq, const __grid_constant__ TensorMap tk,                              \
        const __grid_constant__ TensorMap tv, const __grid_constant__ TensorMap to, float *lse, int S_q,        \
        int S_k, int H, int group, float scale_log2, int causal
// v7 takes the batch count Z (a persistent v7's grid is one-dimensional; the others' Z is
// gridDim.z) and the item counter of V7Tiles' QUEUE (zeroed before the launch; unused else).
#define KL_ATTN_V7_ARGS KL_ATTN_V7_ARGS0, int Z, int *sched
#define KL_ATTN_V7_PASS &tq, &tk, &tv, &to, lse, S_q, S_k, H, group, scale_log2, causal, Z, sched

#define KL_ATTN_SM90_T(D, T, BF16, SFX)                                                                       \
    extern "C" __global__ void __launch_bounds__(256, 1) attn_fwd_v2_d##D##_##SFX(KL_ATTN_ARGS(T)) {          \
        fwd_v2<T, BF16, D>(KL_ATTN_PASS);                                                                    \
    }                                                                                                        \
    extern "C" __global__ void __launch_bounds__(WS_THREADS, 1) attn_fwd_v3_d##D##_##SFX(KL_ATTN_ARGS(T)) {   \
        fwd_v3<T, BF16, D>(KL_ATTN_PASS);                                                                    \
    }                                                                                                        \
    extern "C" __global__ void __launch_bounds__(WS_THREADS, 1) attn_fwd_v4_d##D##_##SFX(KL_ATTN_TMA_ARGS(T)) { \
        fwd_tma<T, BF16, D, false>(KL_ATTN_TMA_PASS);                                                        \
    }                                                                                                        \
    extern "C" __global__ void __launch_bounds__(WS_THREADS, 1) attn_fwd_v5_d##D##_##SFX(KL_ATTN_TMA_ARGS(T)) { \
        fwd_tma<T, BF16, D, true>(KL_ATTN_TMA_PASS);                                                         \
    }                                                                                                        \
    extern "C" __global__ void __launch_bounds__(WS_THREADS, 1) attn_fwd_v6_d##D##_##SFX(KL_ATTN_TMA_ARGS(T)) { \
        fwd_tma<T, BF16, D, false, true>(KL_ATTN_TMA_PASS);                                                  \
    }
#define KL_ATTN_SM90_V7_T(D, T, BF16, SFX)                                                                     \
    extern "C" __global__ void __launch_bounds__(V7Tiles<D>::THREADS, 1) attn_fwd_v7_d##D##_##SFX(KL_ATTN_V7_ARGS) { \
        fwd_v7<BF16, D>(KL_ATTN_V7_PASS);                                                                    \
    }
// A module with another v7 tiling (-DKL_ATTN_V7_BN) holds v7's kernels alone.
#if defined(KL_ATTN_V7_BN)
#define KL_ATTN_SM90(D)                             \
    KL_ATTN_SM90_V7_T(D, __nv_bfloat16, true, bf16) \
    KL_ATTN_SM90_V7_T(D, __half, false, f16)
#else
#define KL_ATTN_SM90(D)                             \
    KL_ATTN_SM90_T(D, __nv_bfloat16, true, bf16)    \
    KL_ATTN_SM90_V7_T(D, __nv_bfloat16, true, bf16) \
    KL_ATTN_SM90_T(D, __half, false, f16)           \
    KL_ATTN_SM90_V7_T(D, __half, false, f16)
#endif

#if defined(KL_ATTN_V7_BN) && (!defined(KL_ATTN_D) || !defined(KL_ATTN_V7_STAGES))
#error "-DKL_ATTN_V7_BN tiles one head dim: give -DKL_ATTN_D and -DKL_ATTN_V7_STAGES with it"
#endif
#if defined(KL_ATTN_V7_BN) && !(defined(KL_ATTN_V7_SPLIT_KV) && defined(KL_ATTN_FAST_EXP) &&   \
                                defined(KL_ATTN_DESC_ADD) && defined(KL_ATTN_V7_PERSIST) &&       \
                                defined(KL_ATTN_V7_QUEUE) && defined(KL_ATTN_V7_TURNS))
#error "-DKL_ATTN_V7_BN: give -DKL_ATTN_V7_{SPLIT_KV,PERSIST,QUEUE,TURNS} and -DKL_ATTN_{FAST_EXP,DESC_ADD}"
#endif

// One head dim per module (-DKL_ATTN_D=80: a first call compiles its own twelve kernels,
// ~3 s, not all sixty); every head dim without it.
#if !defined(KL_ATTN_D) || KL_ATTN_D == 64
KL_ATTN_SM90(64)
#endif
#if !defined(KL_ATTN_D) || KL_ATTN_D == 80
KL_ATTN_SM90(80)
#endif
#if !defined(KL_ATTN_D) || KL_ATTN_D == 96
KL_ATTN_SM90(96)
#endif
#if !defined(KL_ATTN_D) || KL_ATTN_D == 128
KL_ATTN_SM90(128)
#endif
#if !defined(KL_ATTN_D) || KL_ATTN_D == 256
KL_ATTN_SM90(256)
#endif
