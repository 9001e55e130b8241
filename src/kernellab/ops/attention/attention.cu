// Attention forward in CUDA C++: the teaching kernel (fp32, forward only).
//
//   o = softmax(q k^T * scale) v,  bottom-right causal (query i sees keys j <= i + S_k - S_q)
//
// Variants (registered as backends of op "attention"):
//   v1  attn_fwd_v1_d{16,32,64,128}  (backend "cuda_v1") one thread per query row, BR = 64
//       rows per thread block; K and V stream through shared memory in tiles of BC = 32
//       keys (BC x D x 4 B x 2 = 32 KB at D = 128), loaded once per tile by the whole
//       block and read by every thread (same address for all threads of a warp: a
//       broadcast, no bank conflict). Online softmax per row, a tile at a time (as
//       FlashAttention does): the tile's 32 scores in registers, its max, then one rescale
//       of the running sum l and the unnormalized accumulator acc[D] by exp(m_old - m_new)
//       per tile; o = acc / l at the end, lse = m + log(l). The tile's P V is summed
//       apart from acc with Kahan compensation: adding every key into acc in sequence
//       misses the check's bound for inputs whose rows are all equal (the exact answer
//       is v's row; the error is only the summation's).
//       Correctness, not speed: every score is a D-long dot product in FP32 FMAs on one
//       thread (no tensor cores), and acc[D] + q[D] is 2 x D registers per thread (spills
//       at D = 128). Tiled MMA (one warp per 16 rows) is what the Triton kernel does.
//
// Layout contract: q (BH, S_q, D), k and v (BH, S_k, D), o (BH, S_q, D), lse (BH, S_q),
// all contiguous fp32 (the launcher makes them so). Grid: (ceil(S_q / BR), BH).
// Rows with no allowed key (causal, S_q > S_k) give o = 0 and lse = -inf.

#include "common.cuh"

namespace {
constexpr int BR = 64;  // query rows (threads) per block
constexpr int BC = 32;  // keys per shared-memory tile

template <int D>
__device__ void attn_fwd_v1(const float* __restrict__ q, const float* __restrict__ k,
                            const float* __restrict__ v, float* __restrict__ o,
                            float* __restrict__ lse, int S_q, int S_k, float scale, int causal) {
    __shared__ float ks[BC][D];
    __shared__ float vs[BC][D];
    __shared__ float ps[BC][BR];  // each thread's tile of scores, then probabilities (a column)
    const long long bh = blockIdx.y;
    const int row0 = blockIdx.x * BR;
    const int row = row0 + threadIdx.x;
    const bool active = row < S_q;
    const int offset = S_k - S_q;  // bottom-right alignment
    const float* qb = q + bh * S_q * D;
    const float* kb = k + bh * (long long)S_k * D;
    const float* vb = v + bh * (long long)S_k * D;

    float qr[D], acc[D];
    for (int d = 0; d < D; ++d) {
        qr[d] = active ? qb[(long long)row * D + d] * scale : 0.0f;  // scale folded into q
        acc[d] = 0.0f;
    }
    const float neg_inf = __int_as_float(0xff800000);
    float m = neg_inf, l = 0.0f;
    // Causal: no key past the last row's limit is needed by this block.
    int key_end = S_k;
    if (causal) key_end = max(0, min(S_k, row0 + BR + offset));
    const int my_end = causal ? min(key_end, row + offset + 1) : S_k;  // keys j < my_end

    for (int j0 = 0; j0 < key_end; j0 += BC) {
        // Cooperative load of one K and one V tile (zero past S_k).
        for (int e = threadIdx.x; e < BC * D; e += BR) {
            const int j = j0 + e / D, d = e % D;
            const bool ok = j < S_k;
            ks[e / D][d] = ok ? kb[(long long)j * D + d] : 0.0f;
            vs[e / D][d] = ok ? vb[(long long)j * D + d] : 0.0f;
        }
        __syncthreads();
        if (active) {
            const int jn = max(0, min(BC, my_end - j0));  // keys of this tile this row may see
            if (jn > 0) {
                // Scores of the tile (kept in this thread's column of ps), its max, then one
                // rescale of l and acc per tile instead of one per key.
                float m_tile = neg_inf;
                for (int jj = 0; jj < jn; ++jj) {
                    float s = 0.0f;
#pragma unroll
                    for (int d = 0; d < D; ++d) s = fmaf(qr[d], ks[jj][d], s);
                    ps[jj][threadIdx.x] = s;
                    m_tile = fmaxf(m_tile, s);
                }
                const float m_new = fmaxf(m, m_tile);  // finite: jn > 0
                const float alpha = expf(m - m_new);   // 0 when m = -inf
                float l_tile = 0.0f;
                for (int jj = 0; jj < jn; ++jj) {
                    const float p = expf(ps[jj][threadIdx.x] - m_new);
                    ps[jj][threadIdx.x] = p;
                    l_tile += p;
                }
                l = fmaf(l, alpha, l_tile);
                // P V of the tile: Kahan-compensated, summed apart from acc, then added.
#pragma unroll
                for (int d = 0; d < D; ++d) {
                    float t = 0.0f, c = 0.0f;
#pragma unroll 1
                    for (int jj = 0; jj < jn; ++jj) {
                        const float y = fmaf(ps[jj][threadIdx.x], vs[jj][d], -c);
                        const float t2 = t + y;
                        c = (t2 - t) - y;
                        t = t2;
                    }
                    acc[d] = fmaf(acc[d], alpha, t);
                }
                m = m_new;
            }
        }
        __syncthreads();  // the next tile overwrites ks / vs
    }
    if (active) {
        float* ob = o + (bh * S_q + row) * D;
        for (int d = 0; d < D; ++d) ob[d] = l > 0.0f ? acc[d] / l : 0.0f;  // one rounding
        lse[bh * S_q + row] = l > 0.0f ? m + logf(l) : neg_inf;
    }
}
}  // namespace

#define KL_ATTN_V1(D)                                                                              \
    extern "C" __global__ void __launch_bounds__(BR) attn_fwd_v1_d##D(                             \
        const float* q, const float* k, const float* v, float* o, float* lse, int S_q, int S_k,    \
        float scale, int causal) {                                                                 \
        attn_fwd_v1<D>(q, k, v, o, lse, S_q, S_k, scale, causal);                                  \
    }

KL_ATTN_V1(16)
KL_ATTN_V1(32)
KL_ATTN_V1(64)
KL_ATTN_V1(128)
