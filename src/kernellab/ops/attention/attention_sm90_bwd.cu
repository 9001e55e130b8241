// Attention backward on Hopper tensor cores (wgmma), fp16 / bf16, in the FlashAttention-3
// design. Compiled by NVRTC for sm_90a only (wgmma, setmaxnreg; cuda_sm90_bwd.py builds the
// Module with archs=("sm_90a",)). The forward is attention_sm90.cu's (its lse contract).
//
//   P = 2^(s * scale * log2 e - lse)   (lse: the forward's log-sum-exp in log2 units)
//   dV = P^T dO,  dP = dO V^T,  dS = P * (dP - delta),  delta = rowsum(dO * O)
//   dK = scale * dS^T Q,  dQ = scale * dS K
//   bottom-right causal: query i sees keys j <= i + S_k - S_q.
//
// Kernels (registered through backend "cuda_v8": the forward is cuda_v7's):
//   attn_bwd_pre_<dtype>      one warp per query row of the padded length S_pad (S_q rounded
//       up to a query block, BM rows): delta = rowsum(dO * O) in fp32 and lse copied, both into
//       (Z * H, S_pad) fp32 buffers; rows past S_q and rows that see no key (lse = -inf)
//       get lse = +inf, delta = 0, so their P is exactly 0 with no mask; the row's fp32
//       dQ accumulator (Z * H, S_pad, D) is zeroed.
//   attn_bwd_v8_d<D>_<dtype>  one block per (key block of BN = 128 keys, k/v head,
//       batch), or (BwdBuild's PERSIST, D <= 128) about one block an SM walking those items
//       in turn, K and V of the next item loaded once every consumer warp is done with
//       this item's (barrier kv_empty): a producer warpgroup (one thread issues TMA
//       copies; setmaxnreg 24) and two consumer warpgroups (setmaxnreg 240), each owning 64 of the block's keys. K and V
//       stay in shared memory; the block loops over its group's q heads (GQA: dK, dV sum
//       the group in registers: no atomics on them, but for PARTS) and, per head, over the
//       query blocks of BM rows that see its keys (BM = 64; 128 at D = 64, BwdBuild's
//       Q128). A query block's Q, dO (TMA, swizzled tiles) and its BM lse and delta (1-D
//       bulk copies) come through a ring of 2-3 stages (mbarriers full / empty, as the
//       forward's v4-v7). Per query block each consumer warpgroup computes, transposed so
//       that keys are the M dimension:
//           S^T  = K_w Q^T       wgmma SS, 64 x BM, fp32 accumulators
//           dP^T = V_w dO^T      wgmma SS, issued with S^T (one wait each)
//           P^T  = 2^(S^T c - lse)          (0 where masked), rounded to 16 bits
//           dV  += P^T dO        wgmma RS: P^T is the register A operand (no shared memory)
//           dS^T = P^T (dP^T - delta)       rounded to 16 bits
//           dK  += dS^T Q        wgmma RS
//           dQ_w = dS_w K_w      wgmma SS with both operands MN-major (kl_wgmma_tt): dS^T
//                                goes to shared memory (a 64 x 64 tile, double buffered)
//           dQ  += dQ_w          red.global.add.v2.f32 into the fp32 accumulator
//       At D = 128 (SPLIT: half of D is whole slabs of the tile) the two warpgroups split
//       dQ by columns instead: both dS^T tiles written, warpgroup w computes columns
//       [64 w, 64 w + 64) of dS K over all 128 keys (32 accumulators a thread instead of
//       64, which keeps ptxas from serializing the wgmmas for lack of registers, and half
//       the atomics). At D = 256 (DSPLIT) a block holds 64 keys: both warpgroups compute
//       S^T, dP^T, P^T and dS^T of them (the same tiles: 2 x 128 dK / dV accumulators a
//       thread over all 256 columns would not fit in 240 registers) and warpgroup w owns
//       columns [128 w, 128 w + 128) of dV, dK and dQ (dQ in two passes of 64 columns).
//       At D = 64 (Q128, RSPLIT) a query block is 128 rows: S^T and dP^T are m64n128, the
//       dS^T tile two 64 x 64 slabs, and the warpgroups split dQ by rows, warpgroup w
//       computing rows [64 w, 64 w + 64) over all 128 keys; P^T and dS^T are packed once
//       dP^T has landed and dV, dK issued together (an in-flight dV would hold the packed
//       P^T beside 224 other live registers). The ring's waits, copies and barriers and
//       the dQ sums then come once per 128 rows.
//       After the last query block each warpgroup writes scale * dK and dV (16-bit) of its
//       keys and columns.
//   attn_bwd_post_<dtype>     dq = scale * dQ accumulator, rounded to q's dtype.
//   attn_bwd_v9_d<D>_<dtype>  (backend "cuda_v9") v8 with dQ staged in shared memory where
//       Bulk<D>::ON (D <= 128): after the dQ wgmma each consumer warp stores its 16 rows x
//       NQ fp32 columns (float4 stores in dq_frag_index's warp-major order: conflict-free),
//       fences them to the async proxy, and its lane 0 issues one cp.reduce.async.bulk add.f32
//       of the 16 NQ floats into the query block's chunk of the accumulator, which therefore
//       holds each query block's 64 x D floats in that order; attn_bwd_post_blk_<dtype>
//       undoes it. Before rewriting its slice a warp's lane 0 waits for its previous
//       reduce-add to have read it (cp.async.bulk.wait_group.read 0, issued one query block
//       earlier), and waits for it to complete before the block exits. Per query block and
//       warpgroup that is 4 bulk instructions instead of 128 x NQ / 2 vector atomics (64 x
//       NQ x 4 B of L2 reductions either way, done by the TMA unit instead of the LSU: the
//       consumer warps go back to their wgmmas). D = 256 keeps v8's atomics (two ring stages
//       leave no room for 2 x 32 KB of staging), as float4 reductions (below). At D <= 80 (OVL, where the registers hold
//       it) a query block's dQ is staged one iteration late, right after the next block's
//       S^T and dP^T wgmmas are issued, so the tensor cores run those during the staging.
//
// dQ at D = 256 (v8 and v9 alike, one kernel there): each 64-column dQ pass goes to the
// accumulator with red.global.add.v4.f32, one per float4 of registers 4 j .. 4 j + 3 (rows
// 16 warp + g and + 8, columns 8 j + 2 q and + 1). The accumulator then holds each query
// block's 64 x 256 floats in v9's staging order (dq_frag_index with NQ = 64: chunk c0 / 64
// of 64 x 64 floats per pass), so a warp's 32 lanes cover 512 contiguous bytes per
// reduction, and attn_bwd_post_blk (NQ = 64) converts it: half the reduction instructions
// of .v2 into the row-major accumulator for the same bytes.
//
// Why (napkin math, D = 128, per query block and warpgroup): five 64 x 64 x 128 GEMMs =
// 5.2 MFLOP against 2 x 64 x 64 exponentials; K and V (64 KB) are read from HBM once per
// block while Q and dO stream through the ring (32 KB per query block, shared by both
// warpgroups). The dQ partials cost one fp32 atomic add per (query row, column, warpgroup)
// per key block: 2 x 64 x 128 x 4 B = 64 KB of L2 reductions per query block (32 KB where
// the warpgroups split dQ's columns), the price of a single pass (FlashAttention-2's
// separate dQ pass recomputes S and dP instead).
//
// Shared memory (1024-byte aligned tiles, the forward's swizzled layout: Layout<D> below,
// attention_sm90.cu's header explains it): K and V (BN x D each), per stage Q and dO
// (64 x D each), per consumer warpgroup two dS^T tiles (64 keys x 64 queries, 128-byte
// swizzle), per stage lse and delta (64 fp32 each).
//
// Barriers: kv_full (K and V landed), full[st] (stage st's four copies landed: one
// expect_tx arrival plus the bytes), empty[st] (count 8: every consumer warp is done with
// the stage), named barriers DS_BAR + w (ids 1, 2; count 128: consumer warpgroup w's dS^T
// tile is written and fenced before its dQ wgmma reads it) or, at D = 128, DQ_BAR (id 3,
// count 256: both tiles are, as both warpgroups read both). The dS^T tiles alternate per
// query block, so a tile is rewritten only after the named barrier of the next query
// block, which every warp that reads it reaches after waiting for the dQ wgmma that read
// it. Every consumer thread meets the same barrier once per query block (both warpgroups
// run the same n_it iterations), so no barrier phase is left half full.
//
// Contract (cuda_sm90_bwd.py guarantees it): q, dO (Z, H, S_q, D), k, v (Z, H_kv, S_k, D)
// as tensor maps (dims (D, S, H, Z), box E columns x BM rows for q / dO, x BN rows for k /
// v, the tile's swizzle); o and dO for the preprocess as pointers with element strides (a
// unit stride over D); lse (Z, H, S_q) fp32 contiguous; dk, dv (Z, H_kv, S_k, D) pointers
// with element strides; dq (Z, H, S_q, D) with strides. H = H_kv x group. Grid of the main
// kernel (H_kv, ceil(S_k / BN), Z): the k/v head varies fastest in launch order, so under
// causal masking every head's first (heaviest: it sees every query) key block is launched
// before any head's second, and the light last key blocks fill the tail; S_q, S_k > 0.
// PERSIST: a one-dimensional grid of at most one block an SM; block b takes item b first,
// then the next one a launch-wide counter hands out, item i being entry i of the host's
// order table (bwd_item; cuda_sm90_bwd.py's item_order): sections of (k/v head, batch)
// pairs, in a section the pair fastest, then the key block, so that the blocks at work at
// once share the Q, dO and dQ accumulator of a section sized to stay in L2, and each
// section's heavy causal key blocks go first.

#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include "attention_sm90_common.cuh"
#include "attention_sm90_wgmma.cuh"
#include "attention_sm90_bwd_wgmma.cuh"
#include "mbarrier.cuh"

#if !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "attention_sm90_bwd.cu uses wgmma: compile it for sm_90a (Module(..., archs=(\"sm_90a\",)))"
#endif

// -DKL_ATTN_BWD_NO_DQ_RED=1 (a lab build, cuda_sm90_bwd.BwdOpts.no_dq_red): dQ is computed
// (and in v9 staged in shared memory) but neither the atomics nor the bulk reduce-adds add it
// to the accumulator; dq comes back wrong. It bounds what a cheaper dQ sum could gain and is
// never checked or chosen.
#ifndef KL_ATTN_BWD_NO_DQ_RED
#define KL_ATTN_BWD_NO_DQ_RED 0
#endif

// -DKL_ATTN_BWD_PARTS=1 (cuda_sm90_bwd.BwdOpts.split, the default's where split_count splits;
// persistent builds only): an
// item is a key block of a k/v head and batch for a run of its group's q heads (the table
// entry's h0, nh), so that where H_kv x key blocks x Z is below the SM count the group's
// heads fill the grid. Several items then sum into the same keys' dK and dV: their fp32
// partials go to fp32 buffers by red.global.add (dk, dv point at them; dK already scaled),
// and the host rounds them to the 16-bit gradients.
#ifndef KL_ATTN_BWD_PARTS
#define KL_ATTN_BWD_PARTS 0
#endif

// Options of the loop, per head dim (BwdBuild<D>; cuda_sm90_bwd.BWD_DEFAULTS is the same table,
// which a test reads back from the PTX): FAST_EXP computes P = exp2(S scale log2 e - lse) with
// ex2.approx.ftz.f32 (softmax_exp2 in attention_sm90_common.cuh) instead of exp2f's
// denormal-safe sequence; MASK_BRANCH takes the masks on a branch of their own (a warpgroup's
// key block either needs them or not), where the one loop without it evaluates every
// element's two compares and select even in blocks that need no mask; DESC_ADD adds each
// wgmma k step to its tile's descriptor (desc_kmajor / desc_mnmajor: the same descriptors,
// which ptxas otherwise builds with ~5 instructions a wgmma). Each head dim has the ones that
// made its loop fastest on an H200; at D = 256 none did. The lab's builds set each of them for
// every head dim with -DKL_ATTN_BWD_FAST_EXP=0|1, -DKL_ATTN_BWD_MASK_BRANCH=0|1,
// -DKL_ATTN_BWD_DESC_ADD=0|1 and -DKL_ATTN_BWD_STSM=0|1 (cuda_sm90_bwd.BwdOpts).
template <int D>
struct BwdBuild {
#ifdef KL_ATTN_BWD_FAST_EXP
    static constexpr bool FAST_EXP = KL_ATTN_BWD_FAST_EXP;
#else
    static constexpr bool FAST_EXP = D != 256;
#endif
#ifdef KL_ATTN_BWD_MASK_BRANCH
    static constexpr bool MASK_BRANCH = KL_ATTN_BWD_MASK_BRANCH;
#else
    static constexpr bool MASK_BRANCH = D != 256;
#endif
#ifdef KL_ATTN_BWD_DESC_ADD
    static constexpr bool DESC_ADD = KL_ATTN_BWD_DESC_ADD;
#else
    static constexpr bool DESC_ADD = D != 80 && D != 256;
#endif
    // PERSIST: about one block an SM (a one-dimensional grid), each walking (key block, k/v
    // head, batch) items (bwd_item): K and V of the next item load while this one's last
    // query blocks finish, and a short item (few query blocks: ViT's 197 rows are four)
    // pays no block launch, barrier setup or first-load latency of its own.
#ifdef KL_ATTN_BWD_PERSIST
    static constexpr bool PERSIST = KL_ATTN_BWD_PERSIST;
#else
    static constexpr bool PERSIST = D <= 128;
#endif
    // Q128 (D = 64 only): query blocks of 128 rows instead of 64, so each S^T / dP^T wgmma is
    // m64n128 and a block's per-query-block costs (ring barriers, lse / delta copies, the dS^T
    // barrier, the dQ sum) are paid once per 128 rows; the two warpgroups then split dQ by
    // query rows (each its 64 over the block's 128 keys: half the dQ reduce-adds).
#ifdef KL_ATTN_BWD_Q128
    static constexpr bool Q128 = KL_ATTN_BWD_Q128 && D == 64;
#else
    static constexpr bool Q128 = D == 64;
#endif
    static constexpr int BM = Q128 ? 128 : 64;  // query rows per step of the loop (S^T's wgmma N)
    // STSM: the dS^T tiles go to shared memory by stmatrix, four 8 x 8 matrices (a pair of
    // 8-query column groups of the thread's two key rows) an instruction, in place of one
    // 4-byte st.shared a register: a quarter of the shared-store instructions.
#ifdef KL_ATTN_BWD_STSM
    static constexpr bool STSM = KL_ATTN_BWD_STSM;
#else
    static constexpr bool STSM = true;
#endif
    // without exp2f's longer sequence the two copies of the loop make ptxas serialize the
    // wgmmas at D <= 128 (C7511)
    static_assert(FAST_EXP || !MASK_BRANCH, "mask-branch builds take fast-exp too");
};

namespace {

constexpr int THREADS_B = 384;

// How a block divides its work between the two consumer warpgroups.
template <int D>
struct Cfg {
    // D <= 128: 128 keys a block, warpgroup w owns keys [64 w, 64 w + 64) over all D columns.
    // D = 256 (DSPLIT): 64 keys a block, both warpgroups compute S^T and dP^T of those
    // keys (the same 64 x 64 tiles, twice: dK and dV alone are 2 x 128 accumulators a
    // thread over all 256 columns) and warpgroup w owns columns [128 w, 128 w + 128) of
    // dK, dV and dQ.
    static constexpr bool DSPLIT = D > 128;
    static constexpr int BN = DSPLIT ? 64 : 128;   // keys per block
    static constexpr int NV = DSPLIT ? D / 2 : D;  // dK / dV columns per warpgroup
    // D = 128 (QSPLIT): the warpgroups split dQ = dS K by columns (each over all 128 keys;
    // possible where half of D is whole slabs); else each sums its own keys' share.
    static constexpr bool QSPLIT = !DSPLIT && (D / 2) % Layout<D>::E == 0;
    // Q128 (RSPLIT): the warpgroups split dQ by query rows, warpgroup w the block's rows
    // [64 w, 64 w + 64) over all 128 keys (both dS^T tiles).
    static constexpr bool RSPLIT = BwdBuild<D>::Q128;
    static_assert(!(RSPLIT && (DSPLIT || QSPLIT)), "dQ is split one way");
};

// Whether v9 sums dQ through shared memory and bulk reduce-adds (Bulk<D>::ON): every head dim
// whose two 64 x NQ fp32 staging tiles fit beside three stages (D <= 128); at D = 256 (two
// stages already) v9 keeps v8's atomics.
template <int D>
struct Bulk {
    static constexpr bool ON = !Cfg<D>::DSPLIT;
    // dQ columns a warpgroup sums per query block: D / 2 where the warpgroups split dQ, else D
    static constexpr int NQ = Cfg<D>::QSPLIT ? D / 2 : D;
    static constexpr unsigned BYTES = 64 * NQ * 4;  // one warpgroup's staging tile
};

// The block's shared memory, byte offsets from the 1024-aligned base. BULK (v9): plus one
// fp32 dQ staging tile per consumer warpgroup (Bulk<D>::BYTES each) after lse / delta.
template <int D, bool BULK = false>
struct Smem {
    static constexpr int BN = Cfg<D>::BN, BM = BwdBuild<D>::BM;
    static constexpr unsigned DQ_ALL = BULK ? 2 * Bulk<D>::BYTES : 0;
    static constexpr unsigned DS_BYTES = BM * 64 * 2;  // one dS^T tile: BM / 64 slabs of 64 keys x 64 queries
    static constexpr unsigned LD_BYTES = 8 * BM;      // a stage's lse[BM] and delta[BM]
    static constexpr int STAGES =
        (2 * BN * D * 2 + 3 * 2 * BM * D * 2 + 4 * DS_BYTES + 3 * LD_BYTES + DQ_ALL + 1024 <= 227 * 1024) ? 3 : 2;
    static constexpr unsigned KV_BYTES = BN * D * 2;  // one K (or V) tile
    static constexpr unsigned QT_BYTES = BM * D * 2;  // one Q (or dO) tile
    static constexpr unsigned K = 0, V = KV_BYTES, Q = 2 * KV_BYTES;
    static constexpr unsigned DO = Q + STAGES * QT_BYTES;
    static constexpr unsigned DS = DO + STAGES * QT_BYTES;  // [warpgroup][buffer]
    static constexpr unsigned LD = DS + 4 * DS_BYTES;       // per stage: lse[BM], delta[BM]
    static constexpr unsigned DQ = LD + STAGES * LD_BYTES;  // BULK: [warpgroup] staging tiles
    static constexpr unsigned BYTES = DQ + DQ_ALL;
    static_assert(KV_BYTES % 1024 == 0 && QT_BYTES % 1024 == 0, "tiles must keep 1024-byte alignment");
    static_assert(DQ % 16 == 0, "bulk copies need 16-byte aligned shared memory");
};

template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) fence_reg(r[i]);
}
template <int N>
__device__ __forceinline__ void fence_regs(unsigned (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) fence_reg(r[i]);
}

__device__ __forceinline__ float2 load2f(const __nv_bfloat16* p) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
}
__device__ __forceinline__ float2 load2f(const __half* p) { return __half22float2(*reinterpret_cast<const __half2*>(p)); }

__device__ __forceinline__ float pos_inf() { return __int_as_float(0x7f800000); }

// P = exp2(S scale_log2 - lse) over this thread's N / 2 scores (N queries) in place; where MASK and `masked`,
// zero the keys past S_k and (causal) above the diagonal (key > query column + off; the
// thread's columns are col0 + 8j (+ 1)). A template, not a generic lambda: NVRTC 12 takes an
// `auto` lambda parameter for a host function.
template <int N, bool MASK, bool FAST>
__device__ __forceinline__ void p_of_s(float (&s)[N / 2], const float2* sl, float scale_log2, int key_lo, int col0,
                                       int off, int S_k, bool causal, bool masked) {
#pragma unroll
    for (int j = 0; j < N / 8; ++j)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                float& x = s[4 * j + 2 * hh + e];
                const float2 l2 = sl[4 * j];  // lse of columns 8j + 2q, + 1
                const float l = e ? l2.y : l2.x;
                float p = softmax_exp2<FAST>(fmaf(x, scale_log2, -l));  // lse = +inf: 0
                if (MASK && masked) {
                    const int key = key_lo + 8 * hh, col = col0 + 8 * j + e;
                    if (key >= S_k || (causal && key > col + off)) p = 0.f;
                }
                x = p;
            }
}

// `bytes` (a multiple of 16) from global `src` (16-byte aligned) to shared `dst`, completing `bar`.
__device__ __forceinline__ void bulk_load(unsigned dst, const void* src, unsigned bytes, unsigned bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}

// Named barriers (id 0 is __syncthreads'): DS_BAR + cw (128 threads: warpgroup cw's dS^T
// tile is written), DQ_BAR (256: both tiles are, where the warpgroups split dQ's columns).
constexpr int DS_BAR = 1, DQ_BAR = 3;

__device__ __forceinline__ void named_sync(int id, int count) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// Two fp32 adds to consecutive words of global memory (one vector reduction, sm_90).
__device__ __forceinline__ void red_add2(float* p, float x, float y) {
    asm volatile("red.relaxed.gpu.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(p), "f"(x), "f"(y) : "memory");
}

// v9's dQ path: `bytes` (a multiple of 16) of fp32 in shared memory added element-wise into
// global memory by the TMA unit (one instruction for a warp's 16 rows; the adds are atomic
// per element, as red is), tracked as a bulk async-group of the issuing thread.
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, unsigned src, unsigned bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst),
                 "r"(src), "r"(bytes)
                 : "memory");
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// The issuing thread's bulk groups have finished reading shared memory (the source may be
// rewritten) ...
__device__ __forceinline__ void bulk_wait_read0() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
// ... or have completed entirely (before the block exits).
__device__ __forceinline__ void bulk_wait0() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

// Where v9's dQ staging puts register i of thread (warp, lane) of a consumer warpgroup in its
// 64 x NQ tile (and in the dq accumulator's query block, chunk by chunk): warp-major, so each
// warp's 16 rows are one contiguous run of 16 NQ floats (one bulk reduce-add a warp), and
// within it float4 j of the 32 lanes are consecutive (a conflict-free st.shared.v4 a
// quarter warp). Register i = 4 j + 2 hh + e holds row 16 warp + g + 8 hh, column 8 j + 2 q + e.
template <int NQ>
__device__ __forceinline__ int dq_frag_index(int warp, int lane, int i) {
    return warp * 16 * NQ + (i / 4) * 128 + lane * 4 + i % 4;
}

// Four fp32 adds to consecutive words of global memory (16-byte aligned; one vector reduction).
__device__ __forceinline__ void red_add4(float* p, float x, float y, float z, float w) {
    asm volatile("red.relaxed.gpu.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "f"(x), "f"(y), "f"(z),
                 "f"(w)
                 : "memory");
}

// D = 256: one 64-column dQ pass of a thread (registers in wgmma's fragment order)
// added to its query block's accumulator qb (64 x D floats) in dq_frag_index<64>'s order,
// chunk c0 / 64: float4 j of the thread is registers 4 j .. 4 j + 3.
__device__ __forceinline__ void red_dq_blocked64(float* qb, int c0, int warp, int lane, const float (&dq)[32]) {
    float* p = qb + 64 * c0 + dq_frag_index<64>(warp, lane, 0);
#pragma unroll
    for (int j = 0; j < 8; ++j) red_add4(p + 128 * j, dq[4 * j], dq[4 * j + 1], dq[4 * j + 2], dq[4 * j + 3]);
}

// What a key block does: the query blocks [m_begin, m_begin + per) of each q head of its
// group that see any of its keys (causal: from the block holding the first row that sees
// key n0); n_it = group x per iterations, head-major.
struct KeyBlock {
    int n0, off, m_begin, per, n_it;
};

template <int BN, int BM>
__device__ __forceinline__ KeyBlock key_block(int nb, int S_q, int S_k, int group, int causal) {
    KeyBlock b;
    b.n0 = nb * BN;
    b.off = S_k - S_q;
    const int n_mb = (S_q + BM - 1) / BM;
    const int first_row = causal ? max(0, b.n0 - b.off) : 0;
    b.m_begin = first_row / BM;
    b.per = first_row < S_q ? n_mb - b.m_begin : 0;
    b.n_it = group * b.per;
    return b;
}

// A block's work: key block nb of k/v head hk in batch z. One block each (grid (H_kv,
// n_kb, Z)), or with BwdBuild's PERSIST item i of H_kv x n_kb x Z, entry i of the order
// table {hk | nb << 16, z}; after the last item one entry a block {0, -1} (the end). (A table:
// the producer's 24 registers hold no divisions.) PARTS: the entry's second word is
// z | h0 << 16 | nh << 24, the item's q heads h0 .. h0 + nh - 1 of the group (-1: the end).
struct BwdItem {
    int hk, nb, z;
#if KL_ATTN_BWD_PARTS
    int h0, nh;
#endif
};

__device__ __forceinline__ BwdItem bwd_item(const int2* __restrict__ order, int i) {
    const int2 e = __ldg(order + i);
#if KL_ATTN_BWD_PARTS
    if (e.y < 0) return BwdItem{0, 0, -1, 0, 0};
    return BwdItem{e.x & 0xffff, e.x >> 16, e.y & 0xffff, (e.y >> 16) & 0xff, e.y >> 24};
#else
    return BwdItem{e.x & 0xffff, e.x >> 16, e.y};
#endif
}

// --------------------------------------------------------------------------------------- kernel

// BULK: v9 (dQ staged in shared memory and bulk reduce-added where Bulk<D>::ON); else v8.
template <typename T, bool BF16, int D, bool BULK>
__device__ __forceinline__ void bwd_main(const TensorMap* tq, const TensorMap* tk, const TensorMap* tv,
                                       const TensorMap* tdo, const float* __restrict__ lse_p,
                                       const float* __restrict__ delta_p, float* __restrict__ dq_acc,
                                       T* __restrict__ dk, T* __restrict__ dv, int S_q, int S_k, int S_pad, int H,
                                       int group, float scale, float scale_log2, int causal, long long sdkz,
                                       long long sdkh, long long sdks, long long sdvz, long long sdvh,
                                       long long sdvs, int Z, const int2* __restrict__ order,
                                       int* __restrict__ sched) {
    constexpr bool BQ = BULK && Bulk<D>::ON;  // dQ through shared memory
    // OVL (v9): a query block's dQ is staged and bulk-added only after the next query block's
    // S^T and dP^T have been issued, so the tensor cores compute those while the warps move
    // dQ through shared memory (instead of idling from the dQ wgmma's end to the next issue).
    // The dQ registers stay live across the loop's back edge (NQ / 2 a thread beside dK, dV,
    // S^T and dP^T). The dQ wgmma itself is still waited for (wait_group 0) in its own
    // iteration: ptxas cannot prove a wgmma retired by a wait_group N > 0 across a back edge
    // and serializes the whole pipeline (C7514) if its results are read after one.
    // (at D = 96, 128 and with Q128 the live dQ makes ptxas serialize: C7512)
    constexpr bool OVL = BQ && D <= 80 && !BwdBuild<D>::Q128;
    using S = Smem<D, BQ>;
    using L = Layout<D>;
    constexpr int STAGES = S::STAGES, BN = Cfg<D>::BN, NV = Cfg<D>::NV, BM = BwdBuild<D>::BM;
    constexpr bool DSPLIT = Cfg<D>::DSPLIT, SPLIT = Cfg<D>::QSPLIT, RSPLIT = Cfg<D>::RSPLIT;
    constexpr bool DADD = BwdBuild<D>::DESC_ADD, FAST = BwdBuild<D>::FAST_EXP, PERSIST = BwdBuild<D>::PERSIST;
    extern __shared__ unsigned char smem[];
    __shared__ __align__(8) unsigned long long bars[2 * STAGES + 2];
    constexpr bool PARTS = KL_ATTN_BWD_PARTS;
    static_assert(!PARTS || PERSIST, "a split group's items come from the persistent order table");
    // the item kv_full's phase announces: hk, nb, z (-1: the end); PARTS: and h0, nh
    __shared__ int item_slot[PARTS ? 5 : 3];
    check_smem(1024 + S::BYTES);
    const unsigned base = (smem_u32(smem) + 1023u) & ~1023u;
    const unsigned full0 = smem_u32(&bars[0]), empty0 = smem_u32(&bars[STAGES]), kv_full = smem_u32(&bars[2 * STAGES]);
    const unsigned kv_empty = smem_u32(&bars[2 * STAGES + 1]);  // every consumer warp is done with the item's K, V
    const int t = threadIdx.x;
    if (t == 0) {
        for (int st = 0; st < STAGES; ++st) {
            mbar_init(full0 + 8 * st, 1);
            mbar_init(empty0 + 8 * st, 8);
        }
        mbar_init(kv_full, 1);
        mbar_init(kv_empty, 8);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    // The block's items. PERSIST: item blockIdx.x first, then gridDim.x + the next value of the
    // launch's counter `sched` (zeroed by attn_bwd_pre), as a block-per-item grid would be
    // scheduled (causal items differ in work); the producer announces each item in item_slot
    // through kv_full's phase (K and V loaded, or none for an item no query sees, or the end:
    // the table's entries past the last item, one a block, hold z = -1), and takes the next
    // once kv_empty says every consumer warp is done with this one. Else one item, the block's
    // grid position. The ring's uses run on across items (it0).
    auto item_of = [&](int i) {
        return PERSIST ? bwd_item(order, i) : BwdItem{(int)blockIdx.x, (int)blockIdx.y, (int)blockIdx.z};
    };

    if (t < 128) {  // producer (128 x 24 + 256 x 240 = 64512 = 384 x 168 registers)
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
        if (t == 0) {
            int it0 = 0;
            // the next item, claimed once this one's copies are all issued (a claim made earlier
            // would hold an item back behind a long one while other blocks run out of work)
            auto claim = [&]() { return PERSIST ? (int)gridDim.x + atomicAdd(sched, 1) : 1; };
            for (int i = PERSIST ? blockIdx.x : 0, uses = 0;; ++uses) {
                if (!PERSIST && uses == 1) break;
                if (uses > 0) mbar_wait(kv_empty, (uses - 1) & 1);  // the previous item's K, V done
                const BwdItem w = item_of(i);
                item_slot[0] = w.hk;
                item_slot[1] = w.nb;
                item_slot[2] = w.z;
#if KL_ATTN_BWD_PARTS
                item_slot[3] = w.h0;
                item_slot[4] = w.nh;
                const int heads = w.nh, h_first = w.hk * group + w.h0;
#else
                const int heads = group, h_first = w.hk * group;
#endif
                if (w.z < 0) {  // the end
                    mbar_arrive(kv_full);
                    break;
                }
                const KeyBlock kb = key_block<BN, BM>(w.nb, S_q, S_k, heads, causal);
                if (kb.n_it == 0) {  // nothing to load: dK = dV = 0
                    mbar_arrive(kv_full);
                    i = claim();
                    continue;
                }
                mbar_expect_tx(kv_full, 2 * S::KV_BYTES);
                tma_tile<D, BN>(base + S::K, tk, kv_full, kb.n0, w.hk, w.z);
                tma_tile<D, BN>(base + S::V, tv, kv_full, kb.n0, w.hk, w.z);
                for (int it = 0; it < kb.n_it; ++it) {
                    const int u = it0 + it, st = u % STAGES;
                    if (u >= STAGES) mbar_wait(empty0 + 8 * st, (u / STAGES - 1) & 1);  // use u - STAGES done
                    const int h = h_first + it / kb.per, m0 = (kb.m_begin + it % kb.per) * BM;
                    const unsigned bar = full0 + 8 * st;
                    mbar_expect_tx(bar, 2 * S::QT_BYTES + S::LD_BYTES);
                    tma_tile<D, BM>(base + S::Q + st * S::QT_BYTES, tq, bar, m0, h, w.z);
                    tma_tile<D, BM>(base + S::DO + st * S::QT_BYTES, tdo, bar, m0, h, w.z);
                    const long long row = ((long long)w.z * H + h) * S_pad + m0;
                    bulk_load(base + S::LD + st * S::LD_BYTES, lse_p + row, 4 * BM, bar);
                    bulk_load(base + S::LD + st * S::LD_BYTES + 4 * BM, delta_p + row, 4 * BM, bar);
                }
                it0 += kb.n_it;
                i = claim();
            }
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n");

    // consumer warpgroup cw: keys kw0 + [0, 64) (kw0 = n0 + 64 cw; n0 where DSPLIT), dK / dV
    // columns c_kv + [0, NV); this thread's accumulator rows are keys 16 warp + g (+ 8),
    // its columns 8j + 2q (+ 1) (wgmma's fragment layout)
    const int cw = t / 128 - 1, warp = (t % 128) / 32, lane = t % 32, g = lane / 4, qd = lane % 4;
    const int kofs = DSPLIT ? 0 : 64 * cw;         // the warpgroup's first key in the block
    const int c_kv = DSPLIT ? cw * NV : 0;         // the warpgroup's first dK / dV column
    const unsigned slab_kv = (c_kv / L::E) * (BM * L::W);  // ... as a byte offset into a Q / dO tile
    const unsigned sK = base + S::K, sV = base + S::V;
    int z = 0;  // the item's batch
    // S^T = K_w Q^T and dP^T = V_w dO^T of the query block in stage st_: two groups, 64 keys
    // x 64 queries each, once the stage's copies have landed (the block's iteration it_)
    constexpr int NQ = SPLIT ? D / 2 : DSPLIT ? 64 : D;  // dQ columns a warpgroup sums per pass
    constexpr int PASSES = DSPLIT ? NV / 64 : 1;
    float s[BM / 2], dp[BM / 2];
    unsigned p16[BM / 4], ds16[BM / 4];
    float dq_o[NQ / 2];  // OVL: the previous query block's dQ, staged in this iteration (else unused)
    int prev_h = 0, prev_m0 = 0;  // ... and its query block
    auto issue_s_dp = [&](int st_) {
        const unsigned sQ_ = base + S::Q + st_ * S::QT_BYTES, sdO_ = base + S::DO + st_ * S::QT_BYTES;
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)
            kl_wgmma_ss<BM, BF16>(s, desc_kmajor<D, BN, DADD>(sK, kofs, kk), desc_kmajor<D, BM, DADD>(sQ_, 0, kk),
                                  kk > 0);
        wgmma_commit();
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)
            kl_wgmma_ss<BM, BF16>(dp, desc_kmajor<D, BN, DADD>(sV, kofs, kk), desc_kmajor<D, BM, DADD>(sdO_, 0, kk),
                                  kk > 0);
        wgmma_commit();
    };
    // The atomics' dQ path: this thread's share of a query block's dQ (columns c0_ ..) added
    // to the accumulator. D = 256: float4s in the blocked order (red_dq_blocked64); else rows
    // m0_ + 16 warp + g (+ 8) of the padded row-major accumulator (no bounds: the rows past
    // S_q are the padding), columns c0_ + 8j + 2q (+ 1).
    auto add_dq = [&](const float(&dq_)[NQ / 2], int h_, int m0_, int c0_) {
        float* dqb = dq_acc + (((long long)z * H + h_) * S_pad + m0_ + 16 * warp + g) * D + c0_ + 2 * qd;
#if !KL_ATTN_BWD_NO_DQ_RED
        if constexpr (DSPLIT) {
            static_assert(NQ == 64, "D = 256's dQ passes are 64 columns");
            red_dq_blocked64(dq_acc + (((long long)z * H + h_) * S_pad + m0_) * D, c0_, warp, lane, dq_);
        } else {
#pragma unroll
            for (int j = 0; j < NQ / 8; ++j)
#pragma unroll
                for (int hh = 0; hh < 2; ++hh)
                    red_add2(dqb + 8 * hh * D + 8 * j, dq_[4 * j + 2 * hh], dq_[4 * j + 2 * hh + 1]);
        }
#else
        if (dq_[0] == 12345.f) dqb[0] = dq_[NQ / 2 - 1];  // keeps dQ's wgmmas live; a timing bound only
#endif
    };
    // v9: the warp's 16 rows x NQ columns of a dQ share to its slice of the warpgroup's
    // staging tile (dq_frag_index's order), then one bulk reduce-add of those 16 NQ floats
    // into chunk c0_ / NQ of query block m0_'s accumulator (the same order: the postprocess
    // undoes it). The slice is free once this warp's previous reduce has read it (issued one
    // query block ago: the wait is normally immediate).
    auto stage_dq = [&](const float(&dq_)[NQ / 2], int h_, int m0_, int c0_) {
        static_assert(!BQ || NQ == Bulk<D>::NQ, "staging tile width");
        const unsigned sdq = base + S::DQ + cw * Bulk<D>::BYTES + warp * (16 * NQ * 4);
        if (lane == 0) bulk_wait_read0();
        __syncwarp();
#pragma unroll
        for (int j = 0; j < NQ / 8; ++j)
            asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(sdq + (j * 128 + lane * 4) * 4),
                         "f"(dq_[4 * j]), "f"(dq_[4 * j + 1]), "f"(dq_[4 * j + 2]), "f"(dq_[4 * j + 3])
                         : "memory");
        fence_proxy_async();  // each writer's stores before the async proxy's read
        __syncwarp();
#if !KL_ATTN_BWD_NO_DQ_RED
        if (lane == 0) {
            float* dst = dq_acc + (((long long)z * H + h_) * S_pad + m0_) * D + 64 * c0_ + dq_frag_index<NQ>(warp, 0, 0);
            bulk_reduce_add_f32(dst, sdq, 16 * NQ * 4);
        }
#endif
    };
    int it0 = 0;
    for (int uses = 0;; ++uses) {
        if (!PERSIST && uses == 1) break;
        mbar_wait(kv_full, uses & 1);
#if KL_ATTN_BWD_PARTS
        const BwdItem w{item_slot[0], item_slot[1], item_slot[2], item_slot[3], item_slot[4]};
        const int heads = w.nh, h_first = w.hk * group + w.h0;
#else
        const BwdItem w{item_slot[0], item_slot[1], item_slot[2]};
        const int heads = group, h_first = w.hk * group;
#endif
        if (w.z < 0) break;
        const int hk = w.hk;
        z = w.z;
        const KeyBlock kb = key_block<BN, BM>(w.nb, S_q, S_k, heads, causal);
        const int kw0 = kb.n0 + kofs;            // the warpgroup's first key in the sequence
        const int key_lo = kw0 + 16 * warp + g;  // this thread's keys: key_lo, key_lo + 8
        float dk_acc[NV / 2], dv_acc[NV / 2];
#pragma unroll
        for (int r = 0; r < NV / 2; ++r) dk_acc[r] = dv_acc[r] = 0.f;
        for (int it = 0; it < kb.n_it; ++it) {
            const int u = it0 + it, st = u % STAGES;  // the ring's use
            const int h = h_first + it / kb.per, m0 = (kb.m_begin + it % kb.per) * BM;
            const unsigned sQ = base + S::Q + st * S::QT_BYTES, sdO = base + S::DO + st * S::QT_BYTES;
            const unsigned sdS = base + S::DS + (2 * cw + (u & 1)) * S::DS_BYTES;
            mbar_wait(full0 + 8 * st, (u / STAGES) & 1);
            issue_s_dp(st);
            if constexpr (OVL) {
                if (it > 0) stage_dq(dq_o, prev_h, prev_m0, SPLIT ? cw * NQ : 0);  // behind S^T, dP^T
            }

            // lse and delta of the stage's 64 queries: this thread reads those of its columns
            // (8j + 2q, + 1) where it uses them (held in registers across the GEMMs, the 32 of
            // them push D = 128 past the 240 registers at which wgmma need not serialize)
            const float2* sl = reinterpret_cast<const float2*>(smem + (base - smem_u32(smem)) + S::LD + st * S::LD_BYTES) + qd;
            const bool masked = kw0 + 64 > S_k || (causal && kw0 + 63 > m0 + kb.off);

            wgmma_wait<1>();  // S^T
            fence_regs(s);
            // MASK_BRANCH: a copy of the loop without masks for the blocks that need none; else
            // one loop, its masks tested per element where `masked`
            if (BwdBuild<D>::MASK_BRANCH && !masked)
                p_of_s<BM, false, FAST>(s, sl, scale_log2, key_lo, m0 + 2 * qd, kb.off, S_k, causal, false);
            else
                p_of_s<BM, true, FAST>(s, sl, scale_log2, key_lo, m0 + 2 * qd, kb.off, S_k, causal, masked);
            // dS^T = P^T (dP^T - delta) of this thread's pair of queries (8j + 2q, + 1) at key
            // row hh, packed to 16 bits (P in fp32)
            auto ds_pair = [&](int j, int hh) {
                const int i = 4 * j + 2 * hh;
                const float2 dl = sl[BM / 2 + 4 * j];  // delta of columns 8j + 2q, + 1
                return pack2(s[i] * (dp[i] - dl.x), s[i + 1] * (dp[i + 1] - dl.y), BF16);
            };
            if constexpr (BwdBuild<D>::Q128) {
                // 128 queries: P^T, dP^T, dK and dV are 224 registers a thread before the packed
                // P^T (another 32) would be held for an in-flight dV, so both products wait for
                // dP^T: P^T and dS^T packed together (each pair of s and dp dies as it is
                // packed), then dV and dK issued as one group
                wgmma_wait<0>();  // dP^T
                fence_regs(dp);
#pragma unroll
                for (int j = 0; j < BM / 8; ++j)
#pragma unroll
                    for (int hh = 0; hh < 2; ++hh) {
                        const int i = 4 * j + 2 * hh;
                        p16[2 * j + hh] = pack2(s[i], s[i + 1], BF16);
                        ds16[2 * j + hh] = ds_pair(j, hh);
                    }
                wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < BM / 16; ++kk)
                    kl_wgmma_rs<NV, BF16>(dv_acc, p16[4 * kk], p16[4 * kk + 1], p16[4 * kk + 2], p16[4 * kk + 3],
                                          desc_mnmajor<D, BM, DADD>(sdO + slab_kv, 16 * kk), 1);
#pragma unroll
                for (int kk = 0; kk < BM / 16; ++kk)
                    kl_wgmma_rs<NV, BF16>(dk_acc, ds16[4 * kk], ds16[4 * kk + 1], ds16[4 * kk + 2], ds16[4 * kk + 3],
                                          desc_mnmajor<D, BM, DADD>(sQ + slab_kv, 16 * kk), 1);
                wgmma_commit();
            } else {
#pragma unroll
                for (int i = 0; i < BM / 4; ++i) p16[i] = pack2(s[2 * i], s[2 * i + 1], BF16);

                // dV += P^T dO (P^T from registers; dO MN-major: K = queries, N = the NV columns)
                wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < BM / 16; ++kk)
                    kl_wgmma_rs<NV, BF16>(dv_acc, p16[4 * kk], p16[4 * kk + 1], p16[4 * kk + 2], p16[4 * kk + 3],
                                          desc_mnmajor<D, BM, DADD>(sdO + slab_kv, 16 * kk), 1);
                wgmma_commit();

                wgmma_wait<1>();  // dP^T (dV still in flight)
                fence_regs(dp);
#pragma unroll
                for (int j = 0; j < BM / 8; ++j)
#pragma unroll
                    for (int hh = 0; hh < 2; ++hh) ds16[2 * j + hh] = ds_pair(j, hh);

                // dK += dS^T Q (dS^T from registers; Q MN-major)
                wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < BM / 16; ++kk)
                    kl_wgmma_rs<NV, BF16>(dk_acc, ds16[4 * kk], ds16[4 * kk + 1], ds16[4 * kk + 2], ds16[4 * kk + 3],
                                          desc_mnmajor<D, BM, DADD>(sQ + slab_kv, 16 * kk), 1);
                wgmma_commit();
            }

            // dS^T to shared memory (64 keys x BM queries, in slabs of 64 queries: 128-byte rows
            // swizzled as a D = 64 tile): row key, the pair of queries (8j + 2q, + 1) as one
            // 4-byte word
            if constexpr (BwdBuild<D>::STSM) {
                // stmatrix x4: matrix i is (key rows 8 (i % 2) .. + 7 of the warp's 16, query
                // columns 8 (j + i / 2) .. + 7), register i of lane l its row l / 4, columns
                // 2 (l % 4), + 1: the accumulator fragment as it lies (ds16[2 j + i]); lane l
                // gives the address of row l % 8 of matrix l / 8, one 16-byte chunk of the tile
                const int mi = lane >> 3, hh = mi & 1;
#pragma unroll
                for (int j = 0; j < BM / 8; j += 2) {
                    const int jj = j + (mi >> 1);
                    const unsigned addr =
                        sdS + (jj / 8) * (64 * 64 * 2) + tile_offset<64, 64>(16 * warp + (lane & 7) + 8 * hh, jj % 8);
                    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
                                 "r"(ds16[2 * j]), "r"(ds16[2 * j + 1]), "r"(ds16[2 * j + 2]), "r"(ds16[2 * j + 3])
                                 : "memory");
                }
            } else {
#pragma unroll
                for (int j = 0; j < BM / 8; ++j)
#pragma unroll
                    for (int hh = 0; hh < 2; ++hh) {
                        const unsigned addr =
                            sdS + (j / 8) * (64 * 64 * 2) + tile_offset<64, 64>(16 * warp + g + 8 * hh, j % 8) + 4 * qd;
                        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(ds16[2 * j + hh]) : "memory");
                    }
            }
            fence_proxy_async();  // the generic-proxy stores before wgmma's (async-proxy) reads
            if (SPLIT || RSPLIT) {
                // both warpgroups' tiles are written: warpgroup cw computes columns
                // [cw D/2, (cw + 1) D/2) (RSPLIT: query rows [64 cw, 64 cw + 64)) of dQ over all
                // 128 keys (half the accumulators and half the atomics of a per-warpgroup dQ over
                // its own 64 keys)
                named_sync(DQ_BAR, 256);
            } else {
                named_sync(DS_BAR + cw, 128);  // the warpgroup's own tile is written
            }

            // dQ = dS K: A = dS (M = queries, K = keys) MN-major (the dS^T tiles), B = K (K =
            // keys, N = columns) MN-major. Per warpgroup: QSPLIT, columns [64 cw, 64 cw + 64) over
            // both tiles' 128 keys; DSPLIT, its 128 columns in two passes of 64 (32 accumulators
            // at a time) over the block's 64 keys; else all D columns over its own 64 keys.
#pragma unroll 1
            for (int pass = 0; pass < PASSES; ++pass) {
                const int c0 = SPLIT ? cw * NQ : DSPLIT ? c_kv + 64 * pass : 0;  // first dQ column
                float dq[NQ / 2];
                wgmma_fence();
                if (RSPLIT) {
                    // rows [64 cw, +64): query slab cw of each warpgroup's dS^T tile, all 128 keys
#pragma unroll
                    for (int kk = 0; kk < 8; ++kk)
                        kl_wgmma_tt<NQ, BF16>(
                            dq,
                            desc_mnmajor<64, 64, DADD>(
                                base + S::DS + (2 * (kk / 4) + (u & 1)) * S::DS_BYTES + cw * (64 * 64 * 2), 16 * (kk % 4)),
                            desc_mnmajor<D, BN, DADD>(sK, 16 * kk), kk > 0);
                } else if (SPLIT) {
                    const unsigned sKc = sK + cw * (BN * L::W);  // slab cw: columns 64 cw ..
#pragma unroll
                    for (int kk = 0; kk < 8; ++kk)
                        kl_wgmma_tt<NQ, BF16>(
                            dq, desc_mnmajor<64, 64, DADD>(base + S::DS + (2 * (kk / 4) + (u & 1)) * S::DS_BYTES, 16 * (kk % 4)),
                            desc_mnmajor<D, BN, DADD>(sKc, 16 * kk), kk > 0);
                } else {
                    const unsigned sKc = sK + (c0 / L::E) * (BN * L::W);  // the slab of column c0 (0 unless DSPLIT)
#pragma unroll
                    for (int kk = 0; kk < 4; ++kk)
                        kl_wgmma_tt<NQ, BF16>(dq, desc_mnmajor<64, 64, DADD>(sdS, 16 * kk),
                                              desc_mnmajor<D, BN, DADD>(sKc, kofs + 16 * kk), kk > 0);
                }
                wgmma_commit();
                wgmma_wait<0>();  // (first pass) dV, dK and this dQ: the stage and p16 / ds16 are free
                fence_regs(dq);
                if (pass == 0) {
                    fence_regs(dv_acc);
                    fence_regs(dk_acc);
                    fence_regs(p16);
                    fence_regs(ds16);
                    __syncwarp();
                    if (lane == 0) mbar_arrive(empty0 + 8 * st);
                }

                if constexpr (OVL) {
                    // kept for the next iteration, copied by an add of +0 (exact but for the sign
                    // of a zero; ptxas folds a plain mov): ptxas treats a register a wgmma defined
                    // as possibly in flight across the back edge and would make the staging wait
                    // for the next S^T, dP^T (an injected wait_group: C7517)
                    static_assert(PASSES == 1, "OVL keeps one pass of dQ");
#pragma unroll
                    for (int i = 0; i < NQ / 2; ++i) asm volatile("add.rn.f32 %0, %1, 0f00000000;\n" : "=f"(dq_o[i]) : "f"(dq[i]));
                    prev_h = h, prev_m0 = m0;  // staged behind the next query block's S^T, dP^T
                } else if constexpr (BQ) {
                    stage_dq(dq, h, RSPLIT ? m0 + 64 * cw : m0, c0);
                } else {
                    add_dq(dq, h, RSPLIT ? m0 + 64 * cw : m0, c0);
                }
            }
        }
        __syncwarp();  // K, V and item_slot free for the next item (every wgmma that read them waited for)
        if (lane == 0) mbar_arrive(kv_empty);
        if constexpr (OVL) {
            if (kb.n_it > 0) stage_dq(dq_o, prev_h, prev_m0, SPLIT ? cw * NQ : 0);  // the last query block's
        }
        it0 += kb.n_it;

        // epilogue: dK = scale * dS^T Q and dV for this thread's two keys (zeros for a block no
        // query sees)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const int key = key_lo + 8 * hh;
            if (key < S_k) {
#if KL_ATTN_BWD_PARTS
                // fp32 partials of this run of the group's heads (dk, dv: the fp32 buffers)
                float* dkr = reinterpret_cast<float*>(dk) + z * sdkz + hk * sdkh + key * sdks + c_kv + 2 * qd;
                float* dvr = reinterpret_cast<float*>(dv) + z * sdvz + hk * sdvh + key * sdvs + c_kv + 2 * qd;
#pragma unroll
                for (int j = 0; j < NV / 8; ++j) {
                    red_add2(dkr + 8 * j, dk_acc[4 * j + 2 * hh] * scale, dk_acc[4 * j + 2 * hh + 1] * scale);
                    red_add2(dvr + 8 * j, dv_acc[4 * j + 2 * hh], dv_acc[4 * j + 2 * hh + 1]);
                }
#else
                T* dkr = dk + z * sdkz + hk * sdkh + key * sdks + c_kv + 2 * qd;
                T* dvr = dv + z * sdvz + hk * sdvh + key * sdvs + c_kv + 2 * qd;
#pragma unroll
                for (int j = 0; j < NV / 8; ++j) {
                    store2(dkr + 8 * j, dk_acc[4 * j + 2 * hh] * scale, dk_acc[4 * j + 2 * hh + 1] * scale);
                    store2(dvr + 8 * j, dv_acc[4 * j + 2 * hh], dv_acc[4 * j + 2 * hh + 1]);
                }
#endif
            }
        }
    }
    if constexpr (BQ) {
        if (lane == 0) bulk_wait0();  // the warp's last reduce-add done before the block's shared memory goes
    }
}

// --------------------------------------------------------------------------------------- pre / post

// One warp per padded row i of head (z, h): delta = rowsum(dO * O) (fp32), lse copied (+inf
// for rows past S_q and rows with no key), the row's dQ accumulator zeroed; and the main
// kernel's item counter (PERSIST) zeroed. Grid (S_pad / 8, H, Z), 256 threads.
template <typename T>
__device__ __forceinline__ void bwd_pre(const T* __restrict__ o, const T* __restrict__ dout,
                                        const float* __restrict__ lse, float* __restrict__ lse_p,
                                        float* __restrict__ delta_p, float* __restrict__ dq_acc, int* sched, int S_q,
                                        int S_pad, int H, int D, long long soz, long long soh, long long sos,
                                        long long sdz, long long sdh, long long sds) {
    const int i = blockIdx.x * 8 + threadIdx.x / 32, lane = threadIdx.x % 32, h = blockIdx.y, z = blockIdx.z;
    if (i == 0 && lane == 0 && h == 0 && z == 0) *sched = 0;
    const long long zh = (long long)z * H + h;
    float acc = 0.f;
    if (i < S_q) {
        const T* orow = o + z * soz + h * soh + i * sos;
        const T* drow = dout + z * sdz + h * sdh + i * sds;
        for (int c = 2 * lane; c < D; c += 64) {
            const float2 a = load2f(orow + c), b = load2f(drow + c);
            acc = fmaf(a.x, b.x, fmaf(a.y, b.y, acc));
        }
    }
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) acc += __shfl_xor_sync(0xffffffff, acc, m);
    float* dqr = dq_acc + (zh * S_pad + i) * D;
    for (int c = 2 * lane; c < D; c += 64) *reinterpret_cast<float2*>(dqr + c) = make_float2(0.f, 0.f);
    if (lane == 0) {
        const float l = i < S_q ? lse[zh * S_q + i] : neg_inf();
        lse_p[zh * S_pad + i] = l == neg_inf() ? pos_inf() : l;  // P = 2^(x - inf) = 0
        delta_p[zh * S_pad + i] = acc;
    }
}

// dq = scale * dQ accumulator in T: one thread per pair of columns. Grid (ceil(S_q * D / 2 /
// 256), H, Z).
template <typename T>
__device__ __forceinline__ void bwd_post(const float* __restrict__ dq_acc, T* __restrict__ dq, int S_q, int S_pad,
                                         int H, int D, float scale, long long sqz, long long sqh, long long sqs) {
    const long long e = 2 * ((long long)blockIdx.x * blockDim.x + threadIdx.x);
    if (e >= (long long)S_q * D) return;
    const int h = blockIdx.y, z = blockIdx.z;
    const int i = static_cast<int>(e / D), c = static_cast<int>(e % D);
    const float2 a = *reinterpret_cast<const float2*>(dq_acc + (((long long)z * H + h) * S_pad + i) * D + c);
    store2(dq + z * sqz + h * sqh + i * sqs + c, a.x * scale, a.y * scale);
}

// v9: the same from the accumulator in dq_frag_index's order (query block i / 64 holds D / NQ
// chunks of 64 x NQ floats, chunk c / NQ those of columns [c, c + NQ), each warp-major as the
// main kernel staged them). One thread per float4 of it, in memory order (coalesced 16-byte
// loads): float4 u of head (z, h) is a lane's registers 4 j .. 4 j + 3 of one warp, i.e.
// rows 16 warp + g and + 8, columns 8 j + 2 q and + 1 of its chunk. Grid (ceil(S_pad D / 4 /
// 256), H, Z).
template <typename T>
__device__ __forceinline__ void bwd_post_blocked(const float* __restrict__ dq_acc, T* __restrict__ dq, int S_q,
                                                 int S_pad, int H, int D, int NQ, float scale, long long sqz,
                                                 long long sqh, long long sqs) {
    const long long u = (long long)blockIdx.x * blockDim.x + threadIdx.x;  // float4 of the head
    if (u >= (long long)S_pad * D / 4) return;
    const int h = blockIdx.y, z = blockIdx.z;
    const int qb = static_cast<int>(u / (16 * D)), rem = static_cast<int>(u % (16 * D));
    const int chunk = rem / (16 * NQ), r2 = rem % (16 * NQ);
    const int warp = r2 / (4 * NQ), r3 = r2 % (4 * NQ);
    const int j = r3 / 32, lane = r3 % 32;
    const int row = qb * 64 + 16 * warp + lane / 4, col = chunk * NQ + 8 * j + 2 * (lane % 4);
    const float4 a = *reinterpret_cast<const float4*>(dq_acc + (((long long)z * H + h) * S_pad) * D + 4 * u);
    T* out = dq + z * sqz + h * sqh + col;
    if (row < S_q) store2(out + row * sqs, a.x * scale, a.y * scale);
    if (row + 8 < S_q) store2(out + (row + 8) * sqs, a.z * scale, a.w * scale);
}

}  // namespace

#define KL_ATTN_BWD_ARGS(T)                                                                                      \
    const __grid_constant__ TensorMap tq, const __grid_constant__ TensorMap tk,                                \
        const __grid_constant__ TensorMap tv, const __grid_constant__ TensorMap tdo, const float *lse_p,         \
        const float *delta_p, float *dq_acc, T *dk, T *dv, int S_q, int S_k, int S_pad, int H, int group,       \
        float scale, float scale_log2, int causal, long long sdkz, long long sdkh, long long sdks, long long sdvz, \
        long long sdvh, long long sdvs, int Z, const int2 *order, int *sched
#define KL_ATTN_BWD_PASS                                                                                         \
    &tq, &tk, &tv, &tdo, lse_p, delta_p, dq_acc, dk, dv, S_q, S_k, S_pad, H, group, scale, scale_log2, causal, sdkz, \
        sdkh, sdks, sdvz, sdvh, sdvs, Z, order, sched

#define KL_ATTN_BWD_T(D, T, BF16, SFX)                                                                               \
    extern "C" __global__ void __launch_bounds__(THREADS_B, 1) attn_bwd_v8_d##D##_##SFX(KL_ATTN_BWD_ARGS(T)) {        \
        bwd_main<T, BF16, D, false>(KL_ATTN_BWD_PASS);                                                             \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(THREADS_B, 1) attn_bwd_v9_d##D##_##SFX(KL_ATTN_BWD_ARGS(T)) {        \
        bwd_main<T, BF16, D, true>(KL_ATTN_BWD_PASS);                                                              \
    }
#define KL_ATTN_BWD(D)                          \
    KL_ATTN_BWD_T(D, __nv_bfloat16, true, bf16) \
    KL_ATTN_BWD_T(D, __half, false, f16)

#define KL_ATTN_BWD_PP(T, SFX)                                                                                     \
    extern "C" __global__ void __launch_bounds__(256) attn_bwd_pre_##SFX(                                          \
        const T *o, const T *dout, const float *lse, float *lse_p, float *delta_p, float *dq_acc, int *sched,      \
        int S_q, int S_pad, int H, int D, long long soz, long long soh, long long sos, long long sdz, long long sdh, \
        long long sds) {                                                                                           \
        bwd_pre<T>(o, dout, lse, lse_p, delta_p, dq_acc, sched, S_q, S_pad, H, D, soz, soh, sos, sdz, sdh, sds);   \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(256) attn_bwd_post_##SFX(                                         \
        const float *dq_acc, T *dq, int S_q, int S_pad, int H, int D, float scale, long long sqz, long long sqh,   \
        long long sqs) {                                                                                           \
        bwd_post<T>(dq_acc, dq, S_q, S_pad, H, D, scale, sqz, sqh, sqs);                                           \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(256) attn_bwd_post_blk_##SFX(                                     \
        const float *dq_acc, T *dq, int S_q, int S_pad, int H, int D, int NQ, float scale, long long sqz,          \
        long long sqh, long long sqs) {                                                                            \
        bwd_post_blocked<T>(dq_acc, dq, S_q, S_pad, H, D, NQ, scale, sqz, sqh, sqs);                               \
    }
KL_ATTN_BWD_PP(__nv_bfloat16, bf16)
KL_ATTN_BWD_PP(__half, f16)

// One head dim per module (-DKL_ATTN_D=96); every head dim without it.
#if !defined(KL_ATTN_D) || KL_ATTN_D == 64
KL_ATTN_BWD(64)
#endif
#if !defined(KL_ATTN_D) || KL_ATTN_D == 80
KL_ATTN_BWD(80)
#endif
#if !defined(KL_ATTN_D) || KL_ATTN_D == 96
KL_ATTN_BWD(96)
#endif
#if !defined(KL_ATTN_D) || KL_ATTN_D == 128
KL_ATTN_BWD(128)
#endif
#if !defined(KL_ATTN_D) || KL_ATTN_D == 256
KL_ATTN_BWD(256)
#endif
