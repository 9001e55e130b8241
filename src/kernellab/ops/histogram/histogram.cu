// histogram.cu - counts of integer keys, the privatization lecture step by step.
//
//   v1  hist_v1   one thread per element, one global atomicAdd per element on the int64
//                 output. Every increment of one bin serializes in the L2 slice that owns
//                 its address: on uniform keys over 256 bins the L2 atomic units keep up
//                 (~n / (atomics per clock) of work spread over many addresses), but when
//                 90% of the keys are one bin, 0.9 n increments queue on one address.
//   v2  hist_v2   privatization: each block counts its 256 elements into a private
//                 histogram in shared memory (uint32, bins x 4 bytes, dynamic), then adds
//                 its non-zero counts to the output with global atomics. Same-address
//                 contention moves from the L2 into one SM's shared memory (~30x faster
//                 per conflicting atomic), but a block of 256 elements now pays a zero
//                 fill of `bins` words and up to min(bins, 256) global atomics: at 4096
//                 bins the merge costs more than the counting.
//   v3  hist_v3   thread coarsening: a grid of about one resident wave strides over the
//                 input with 16-byte loads (16 uint8 / 4 int32 / 2 int64 keys per load,
//                 4 loads in flight per thread), so each block counts ~n / grid elements
//                 and the fill + merge are paid ~1000 times instead of n / 256 times.
//   v4  hist_v4   warp aggregation on top of v3: before the shared atomic, the lanes of a
//                 warp that hold the same key find each other (__match_any_sync, sm_70+)
//                 and one of them adds the group's size. With 90% of the keys in one bin a
//                 warp issues ~4 shared atomics per step instead of 32 that serialize on
//                 one bank; on uniform keys it costs a match per key (more issue, no gain).
//   v5  hist_v5   cheaper aggregation: two rounds of "broadcast one pending lane's key
//                 (__shfl_sync), ballot the lanes that hold it"; a group of two or more is
//                 added by one lane, everything else takes v3's plain atomic. A hot bin is
//                 caught in round one or two (~0.99 of warps at 90% skew); on uniform keys
//                 the cost is ~12 ALU instructions per 32 keys, no extra shared atomics,
//                 where v4's match.any is a multi-pass instruction per key.
//   v6  hist_v6   16-bit counters: two bins per 32-bit shared word, so 65536 bins take
//                 128 KB (fits one block on an A100's 163 KB or a Hopper's 227 KB) where
//                 uint32 counters (256 KB) fit nowhere. A bin's 16-bit field wraps after
//                 65535 increments; the atomic's returned old word says exactly when (its
//                 field was 0xffff), and that thread credits 65536 to the output in global
//                 memory (see add16: a low field's carry lands in the high field, and a
//                 carry out of the word is lost; both are credited back). Under 90% skew
//                 the hot bin wraps once per 65536 keys: one global atomic per 65536 keys.
//   v7  hist_v7   a thread-block cluster (sm_90) shares one histogram: its C blocks each
//                 hold every C-th bin (bin b lives in block b % C at word b / C) in their
//                 own shared memory, and a key's increment goes to whichever block owns it
//                 through distributed shared memory (mapa + red.shared::cluster). 65536
//                 uint32 bins over 2 blocks are 128 KB each. The flush is C times shorter
//                 per block and there are C times fewer copies of the histogram to merge
//                 into the output (the merge is what v3-v6 pay per block: at 65536 bins up
//                 to 65536 global atomics per block, as many as half a block's share of
//                 2^24 keys on 132 SMs).
//                 Skewed keys are aggregated in the warp first (v5's ballot rounds): the
//                 hot bin's owner takes the increments of C blocks.
// `cuda` runs v3 while the private histogram fits in 48 KB of shared memory, beyond it v7
// on sm_90, v6 elsewhere, v1 where neither fits (cuda.py).
//
// Contract (every variant): x is contiguous, n elements of T (uint8, int32 or int64);
// out is int64 [bins], zeroed by the host; a key v counts in bin v when 0 <= v < bins and
// is ignored otherwise (one unsigned compare: a negative key wraps to a huge value);
// 1 <= bins < 2^31. v2-v5: blockDim.x == 256 and bins x 4 bytes of dynamic shared memory;
// v6: blockDim.x <= 1024, ceil(bins / 2) x 4 bytes; v7: blockDim.x <= 1024, launched in
// clusters of C blocks (C a power of two, 2..16), ceil(bins / C) x 4 bytes each.
// Integer atomics are exact and commutative: every variant gives the same bits on every
// run, whatever order the atomics land in.
#include "common.cuh"

namespace {

constexpr unsigned FULL = 0xffffffffu;
constexpr int U = 4;  // 16-byte packs in flight per thread and loop step (as in sum.cu)

typedef unsigned long long u64;

// The bin of key v, or `bins` (out of range) when v < 0 or v >= bins.
template <typename T>
__device__ __forceinline__ unsigned bin_of(T v, int bins) {
    const u64 u = (u64)(long long)v;  // a negative key becomes >= 2^63: out of range
    return u < (u64)bins ? (unsigned)u : (unsigned)bins;
}

template <typename T>
__device__ void hist_v1(const T* __restrict__ x, u64* __restrict__ out, long long n, int bins) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const unsigned b = bin_of(x[i], bins);
    if (b < (unsigned)bins) atomicAdd(out + b, 1ull);
}

// Zero the block's private histogram, (caller counts), then add its non-zero bins to out.
__device__ __forceinline__ void zero_private(unsigned* sh, int bins) {
    for (int b = threadIdx.x; b < bins; b += blockDim.x) sh[b] = 0u;
    __syncthreads();
}

__device__ __forceinline__ void merge_private(const unsigned* sh, u64* __restrict__ out, int bins) {
    __syncthreads();
    for (int b = threadIdx.x; b < bins; b += blockDim.x) {
        const unsigned c = sh[b];
        if (c) atomicAdd(out + b, (u64)c);  // skip empty bins: most of them at 4096 bins
    }
}

template <typename T>
__device__ void hist_v2(const T* __restrict__ x, u64* __restrict__ out, long long n, int bins) {
    extern __shared__ unsigned sh[];
    zero_private(sh, bins);
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const unsigned b = bin_of(x[i], bins);
        if (b < (unsigned)bins) atomicAdd(sh + b, 1u);
    }
    merge_private(sh, out, bins);
}

// How a key reaches the private histogram: v3 plain, v4 match.any, v5 ballot rounds.
enum Agg { PLAIN = 0, MATCH = 1, BALLOT = 2 };

// One key into the private histogram: add(b, c) adds c to bin b (a shared atomic in
// v3-v5, v6's 16-bit add, v7's remote add). `ok` false: no key (a lane past the end) or a
// key out of range. MATCH and BALLOT must be called by all 32 lanes (the loops below are
// warp-uniform).
template <int AGG, typename Add>
__device__ __forceinline__ void count(Add add, unsigned b, bool ok) {
    const int lane = threadIdx.x & 31;
    if (AGG == MATCH) {
        const unsigned key = ok ? b : FULL;  // every lane without a key joins one group
        const unsigned peers = __match_any_sync(FULL, key);
        if (ok && lane == __ffs(peers) - 1) add(b, (unsigned)__popc(peers));
        return;
    }
    if (AGG == BALLOT) {
        bool tried = false;  // this lane's key was a candidate and had no twin
#pragma unroll
        for (int round = 0; round < 2; ++round) {
            const unsigned pending = __ballot_sync(FULL, ok && !tried);
            if (!pending) break;  // (uniform: the ballot is the warp's)
            const int src = __ffs(pending) - 1;
            const unsigned cand = __shfl_sync(FULL, b, src);
            const unsigned same = __ballot_sync(FULL, ok && b == cand);
            if (__popc(same) > 1) {  // uniform branch: a group worth one atomic
                if (lane == src) add(cand, (unsigned)__popc(same));
                ok = ok && b != cand;
            } else if (lane == src) {
                tried = true;
            }
        }
    }
    if (ok) add(b, 1u);
}

// v3-v7's counting: a grid-stride loop over 16-byte packs of x + head (16-byte aligned),
// the `head` scalar keys before it and the tail after the last whole pack done one per
// thread; every key in range goes to add(b, c). The pack loop runs in whole warps: lane l
// of a warp takes pack p0 + l, and p0 is the same for the 32 lanes, so every lane runs the
// same iterations (v4's match and the ballots need all).
template <typename T, int AGG, typename Add>
__device__ __forceinline__ void count_keys(const T* __restrict__ x, long long n, long long head, int bins,
                                           Add add) {
    using V = kl::Vec16<T>;
    const int lane = threadIdx.x & 31;
    const long long gid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long stride = (long long)gridDim.x * blockDim.x;  // packs per step and load
    const long long npacks = (n - head) / V::N;
    const int4* p = reinterpret_cast<const int4*>(x + head);
    for (long long p0 = gid - lane; p0 < npacks; p0 += stride * U) {
        V r[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {  // all loads first: U x 16 B in flight per thread
            const long long q = p0 + lane + (long long)u * stride;
            if (q < npacks) r[u].raw = kl::load16(p + q);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const bool have = p0 + lane + (long long)u * stride < npacks;
            if (AGG == PLAIN && !have) continue;
#pragma unroll
            for (int j = 0; j < V::N; ++j) {
                const unsigned b = have ? bin_of(r[u].e[j], bins) : (unsigned)bins;
                count<AGG>(add, b, b < (unsigned)bins);
            }
        }
    }
    // head (< 16 / sizeof(T) keys) and tail (< V::N keys): a few scalar loads, one add each
    if (gid < head) {
        const unsigned b = bin_of(x[gid], bins);
        if (b < (unsigned)bins) add(b, 1u);
    }
    const long long t = head + npacks * V::N + gid;
    if (t < n) {
        const unsigned b = bin_of(x[t], bins);
        if (b < (unsigned)bins) add(b, 1u);
    }
}

// v3 / v4 / v5: one private uint32 histogram per block.
template <typename T, int AGG>
__device__ void hist_coarse(const T* __restrict__ x, u64* __restrict__ out, long long n, long long head,
                            int bins) {
    extern __shared__ unsigned sh[];
    unsigned* priv = sh;  // (a lambda captures locals, not the __shared__ array itself)
    zero_private(priv, bins);
    count_keys<T, AGG>(x, n, head, bins, [priv](unsigned b, unsigned c) { atomicAdd(priv + b, c); });
    merge_private(sh, out, bins);
}

// v6: c increments of bin b into the packed 16-bit histogram (bin b in the low half of
// word b / 2 when b is even, the high half when odd), exactly. The word is one integer
// A = L + 65536 H (L, H: the two bins' counts since the zero fill) kept mod 2^32; the
// fields read back as L mod 65536 and (H + carries out of L) mod 65536. So every time an
// add makes the low field wrap, the low bin lost 65536 and the high bin gained a stray 1;
// every time an add carries out of the whole word, the high bin lost 65536. Each wrap
// happens in exactly one atomic (adds of c < 65536 cross each multiple once), whose old
// value shows it: that thread credits the difference to `out` with global atomics. The
// credits and the flush of the fields add up to L and H, in any order of the atomics.
// The high half of the last word when bins is odd is no bin: its credits are skipped.
__device__ __forceinline__ void add16(unsigned* sh, u64* __restrict__ out, int bins, unsigned b, unsigned c) {
    const bool high = b & 1u;
    const unsigned d = high ? c << 16 : c;
    const unsigned old = atomicAdd(sh + (b >> 1), d);
    const unsigned hb = b | 1u;  // the high bin of the word
    const bool has_high = hb < (unsigned)bins;
    if (old > 0xffffffffu - d && has_high) atomicAdd(out + hb, 65536ull);  // carried out of the word
    if (!high && (old & 0xffffu) + c > 0xffffu) {                          // the low field wrapped
        atomicAdd(out + b, 65536ull);
        if (has_high) atomicAdd(out + hb, ~0ull);  // minus the stray carry (two's complement -1)
    }
}

template <typename T>
__device__ void hist_v6(const T* __restrict__ x, u64* __restrict__ out, long long n, long long head, int bins) {
    extern __shared__ unsigned sh[];
    unsigned* priv = sh;
    const int words = (bins + 1) >> 1;
    zero_private(priv, words);
    count_keys<T, PLAIN>(x, n, head, bins, [=](unsigned b, unsigned c) { add16(priv, out, bins, b, c); });
    __syncthreads();
    for (int w = threadIdx.x; w < words; w += blockDim.x) {
        const unsigned v = sh[w];
        const unsigned lo = v & 0xffffu, hi = v >> 16;
        if (lo) atomicAdd(out + 2 * w, (u64)lo);
        if (hi && 2 * w + 1 < bins) atomicAdd(out + 2 * w + 1, (u64)hi);
    }
}

// Thread-block clusters (sm_90): the block's rank in its cluster, the cluster's size, a
// barrier of all threads of the cluster (release / acquire: the shared-memory writes
// before it, local or remote, are seen by every block after it), the address of a word of
// another block's shared memory, and an atomic add there.
#if __CUDA_ARCH__ >= 900
__device__ __forceinline__ unsigned cluster_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
__device__ __forceinline__ unsigned cluster_blocks() {
    unsigned c;
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(c));
    return c;
}
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// `addr`: a shared-memory address of this block (cvta to shared); the same offset in block `rank`.
__device__ __forceinline__ unsigned map_to_rank(unsigned addr, unsigned rank) {
    unsigned r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(rank));
    return r;
}
__device__ __forceinline__ void remote_add(unsigned cluster_addr, unsigned c) {
    asm volatile("red.relaxed.cluster.shared::cluster.add.u32 [%0], %1;" ::"r"(cluster_addr), "r"(c) : "memory");
}
#endif

template <typename T, int AGG>
__device__ void hist_v7(const T* __restrict__ x, u64* __restrict__ out, long long n, long long head, int bins) {
#if __CUDA_ARCH__ >= 900
    extern __shared__ unsigned sh[];
    const unsigned C = cluster_blocks(), rank = cluster_rank();
    const int lg = __ffs(C) - 1;  // C is a power of two: bin b -> block b & (C - 1), word b >> lg
    const int slice = (bins + C - 1) >> lg;
    zero_private(sh, slice);
    cluster_sync();  // every block's slice is zero before any block adds to it
    const unsigned base = (unsigned)__cvta_generic_to_shared(sh);
    count_keys<T, AGG>(x, n, head, bins, [base, lg, C](unsigned b, unsigned c) {
        remote_add(map_to_rank(base + ((b >> lg) << 2), b & (C - 1)), c);
    });
    cluster_sync();  // every add has landed; and no block exits while others still write into it
    for (int i = threadIdx.x; i < slice; i += blockDim.x) {
        const unsigned b = ((unsigned)i << lg) | rank;
        const unsigned v = sh[i];
        if (v && b < (unsigned)bins) atomicAdd(out + b, (u64)v);
    }
#else
    __trap();  // clusters need sm_90; the host never launches this elsewhere
#endif
}

}  // namespace

#define KL_HIST_KERNELS(S, T)                                                                                 \
    extern "C" __global__ void hist_v1_##S(const T* x, u64* out, long long n, int bins) {                     \
        hist_v1<T>(x, out, n, bins);                                                                          \
    }                                                                                                         \
    extern "C" __global__ void hist_v2_##S(const T* x, u64* out, long long n, int bins) {                     \
        hist_v2<T>(x, out, n, bins);                                                                          \
    }                                                                                                         \
    extern "C" __global__ void hist_v3_##S(const T* x, u64* out, long long n, long long head, int bins) {     \
        hist_coarse<T, PLAIN>(x, out, n, head, bins);                                                         \
    }                                                                                                         \
    extern "C" __global__ void hist_v4_##S(const T* x, u64* out, long long n, long long head, int bins) {     \
        hist_coarse<T, MATCH>(x, out, n, head, bins);                                                         \
    }                                                                                                         \
    extern "C" __global__ void hist_v5_##S(const T* x, u64* out, long long n, long long head, int bins) {     \
        hist_coarse<T, BALLOT>(x, out, n, head, bins);                                                        \
    }

// v6 and v7 run 1024-thread blocks (cuda.py's WIDE_THREADS): at most 64 registers a thread.
// hist_v7_plain: v7 without the warp aggregation (a tuning option; lab/gpu_histogram.py).
#define KL_HIST_LARGE_KERNELS(S, T)                                                                           \
    extern "C" __global__ void __launch_bounds__(1024)                                                        \
        hist_v6_##S(const T* x, u64* out, long long n, long long head, int bins) {                            \
        hist_v6<T>(x, out, n, head, bins);                                                                    \
    }                                                                                                         \
    extern "C" __global__ void __launch_bounds__(1024)                                                        \
        hist_v7_##S(const T* x, u64* out, long long n, long long head, int bins) {                            \
        hist_v7<T, BALLOT>(x, out, n, head, bins);                                                            \
    }                                                                                                         \
    extern "C" __global__ void __launch_bounds__(1024)                                                        \
        hist_v7_plain_##S(const T* x, u64* out, long long n, long long head, int bins) {                      \
        hist_v7<T, PLAIN>(x, out, n, head, bins);                                                             \
    }

// The file compiles as two modules (cuda.py): v1-v5, and with KL_HIST_LARGE defined v6-v7,
// so a call of the small-histogram rungs does not wait for the large ones' compile.
#ifndef KL_HIST_LARGE
KL_HIST_KERNELS(u8, unsigned char)
KL_HIST_KERNELS(i32, int)
KL_HIST_KERNELS(i64, long long)
#else
KL_HIST_LARGE_KERNELS(u8, unsigned char)
KL_HIST_LARGE_KERNELS(i32, int)
KL_HIST_LARGE_KERNELS(i64, long long)
#endif
