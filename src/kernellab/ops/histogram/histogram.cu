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
// `cuda` runs v5 while the private histogram fits in shared memory, v1 beyond (cuda.py).
//
// Contract (every variant): x is contiguous, n elements of T (uint8, int32 or int64);
// out is int64 [bins], zeroed by the host; a key v counts in bin v when 0 <= v < bins and
// is ignored otherwise (one unsigned compare: a negative key wraps to a huge value);
// 1 <= bins < 2^31. v2-v4: blockDim.x == 256 and bins x 4 bytes of dynamic shared memory.
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

// One key into the private histogram. `ok` false: no key (a lane past the end) or a key
// out of range. MATCH and BALLOT must be called by all 32 lanes (the loops below are
// warp-uniform).
template <int AGG>
__device__ __forceinline__ void count(unsigned* sh, unsigned b, bool ok) {
    const int lane = threadIdx.x & 31;
    if (AGG == MATCH) {
        const unsigned key = ok ? b : FULL;  // every lane without a key joins one group
        const unsigned peers = __match_any_sync(FULL, key);
        if (ok && lane == __ffs(peers) - 1) atomicAdd(sh + b, (unsigned)__popc(peers));
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
                if (lane == src) atomicAdd(sh + cand, (unsigned)__popc(same));
                ok = ok && b != cand;
            } else if (lane == src) {
                tried = true;
            }
        }
    }
    if (ok) atomicAdd(sh + b, 1u);
}

// v3 / v4: a grid-stride loop over 16-byte packs of x + head (16-byte aligned), the
// `head` scalar keys before it and the tail after the last whole pack done one per thread.
// The pack loop runs in whole warps: lane l of a warp takes pack p0 + l, and p0 is the
// same for the 32 lanes, so every lane runs the same iterations (v4's match needs all).
template <typename T, int AGG>
__device__ void hist_coarse(const T* __restrict__ x, u64* __restrict__ out, long long n, long long head,
                            int bins) {
    using V = kl::Vec16<T>;
    extern __shared__ unsigned sh[];
    zero_private(sh, bins);
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
                count<AGG>(sh, b, b < (unsigned)bins);
            }
        }
    }
    // head (< 16 / sizeof(T) keys) and tail (< V::N keys): a few scalar loads, plain atomics
    if (gid < head) {
        const unsigned b = bin_of(x[gid], bins);
        if (b < (unsigned)bins) atomicAdd(sh + b, 1u);
    }
    const long long t = head + npacks * V::N + gid;
    if (t < n) {
        const unsigned b = bin_of(x[t], bins);
        if (b < (unsigned)bins) atomicAdd(sh + b, 1u);
    }
    merge_private(sh, out, bins);
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

KL_HIST_KERNELS(u8, unsigned char)
KL_HIST_KERNELS(i32, int)
KL_HIST_KERNELS(i64, long long)
