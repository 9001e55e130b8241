// Attention forward in CUDA C++: the teaching kernel (fp32, forward only).
//
//   o = softmax(q k^T * scale) v,  bottom-right causal (query i sees keys j <= i + S_k - S_q)
//
// Variants (registered as backends of op "attention"):
//   v1  attn_fwd_v1_d{16,32,64,128}  (backend "cuda_v1") one thread per query row, BR = 64
//       rows per thread block; K and V stream through shared memory in tiles of BC = 32
//       keys (BC x D x 4 B x 2 = 32 KB at D = 128), loaded once per tile by the whole
//       block and read by every thread (same address for all threads of a warp: a
//       broadcast, no bank conflict). Online softmax per row: running max m, running sum
//       l, unnormalized accumulator acc[D] in registers, rescaled by exp(m_old - m_new)
//       when the max grows; o = acc / l at the end, lse = m + log(l).
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
            const int jn = min(BC, my_end - j0);  // keys of this tile this row may see
            for (int jj = 0; jj < jn; ++jj) {
                float s = 0.0f;
#pragma unroll
                for (int d = 0; d < D; ++d) s += qr[d] * ks[jj][d];
                const float m_new = fmaxf(m, s);
                const float alpha = expf(m - m_new);  // 0 when m = -inf
                const float p = expf(s - m_new);
                l = l * alpha + p;
#pragma unroll
                for (int d = 0; d < D; ++d) acc[d] = acc[d] * alpha + p * vs[jj][d];
                m = m_new;
            }
        }
        __syncthreads();  // the next tile overwrites ks / vs
    }
    if (active) {
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        float* ob = o + (bh * S_q + row) * D;
        for (int d = 0; d < D; ++d) ob[d] = acc[d] * inv;
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
