// Batch-norm pieces shared by batch_norm2d.cu and bn_relu_pool2d.cu (include after
// common.cuh and reduce.cuh, inside an anonymous namespace, with THREADS defined).
//
//   channel_chunk, chunk_range   block b = c * split + s of a C * split grid: chunk s
//                   of channel c, and that chunk's flat indices.
//   bn_stats        one block per (channel c, chunk s): each thread sums (v - K) and
//                   (v - K)^2 over its elements in fp64, K the chunk's first value (a shift
//                   that keeps the sums small); the block turns them into (count, mean,
//                   M2) triples and merges them (Chan's formula, fp64) -> part[3][C][split].
//   channel_stats   a thread merges channel c's `split` triples in fp64 and rounds mean and
//                   rstd = 1 / sqrt(var + eps) to fp32 once: the float64 reference's
//                   statistics within half an ulp (the Triton backend's, too).
//   normalize_params   channel_stats, stored by block s == 0, as the forward's scale
//                   rstd * w and shift b.
//   store_grad_partials / channel_grads   the backward's per-chunk sums of g * (x - mean)
//                   and g in part[2][C][split], then their totals: dw (rstd applied once)
//                   and db.
// fp64 costs no time here: 3 flops per loaded element against 67 TFLOP/s of fp64 on an
// H100, and no division in the element loop.
#pragma once

__device__ __forceinline__ void chan_merge64(double& ca, double& ma, double& m2a, double cb, double mb,
                                             double m2b) {
    const double tot = ca + cb;
    if (tot == 0.0) return;
    const double delta = mb - ma;
    const double fb = cb / tot;
    ma += delta * fb;
    m2a += m2b + delta * delta * ca * fb;
    ca = tot;
}

// Block b = c * split + s of a C * split grid takes chunk s of channel c ...
struct ChannelChunk {
    int split, c, s;
};

__device__ __forceinline__ ChannelChunk channel_chunk(int C) {
    const int split = gridDim.x / C;
    const int c = blockIdx.x / split, s = blockIdx.x - c * split;
    return {split, c, s};
}

// ... [start, end) of the channel's `total` flat indices.
struct ChunkRange {
    int start, end;
};

__device__ __forceinline__ ChunkRange chunk_range(int s, int chunk, int total) {
    const int start = s * chunk;
    return {start, min(start + chunk, total)};
}

// Flat index i of a channel's N * HW values -> element offset of NCHW x.
__device__ __forceinline__ long long bn_offset(int i, int c, int C, int HW) {
    const int n = i / HW;
    return ((long long)n * C + c) * HW + (i - n * HW);
}

template <typename T>
__device__ void bn_stats(const T* __restrict__ x, double* __restrict__ part, int C, int HW, int M, int chunk) {
    __shared__ double sc[THREADS], sm[THREADS], sm2[THREADS];
    const auto [split, c, s] = channel_chunk(C);
    const auto [start, end] = chunk_range(s, chunk, M);
    const double shift = start < end ? (double)kl::to_f(x[bn_offset(start, c, C, HW)]) : 0.0;
    double s1 = 0.0, s2 = 0.0;
    int cnt = 0;
#pragma unroll 4
    for (int i = start + threadIdx.x; i < end; i += THREADS) {
        const double d = (double)kl::to_f(x[bn_offset(i, c, C, HW)]) - shift;
        s1 += d;
        s2 = fma(d, d, s2);
        ++cnt;
    }
    const double n = (double)cnt;
    const double dm = cnt > 0 ? s1 / n : 0.0;
    sc[threadIdx.x] = n;
    sm[threadIdx.x] = shift + dm;
    const double m2 = s2 - s1 * dm;  // a NaN stays (inf inputs); rounding below 0 clamps
    sm2[threadIdx.x] = m2 < 0.0 ? 0.0 : m2;
    __syncthreads();
    for (int h = THREADS / 2; h > 0; h >>= 1) {
        if (threadIdx.x < h) {
            double ca = sc[threadIdx.x], ma = sm[threadIdx.x], m2a = sm2[threadIdx.x];
            chan_merge64(ca, ma, m2a, sc[threadIdx.x + h], sm[threadIdx.x + h], sm2[threadIdx.x + h]);
            sc[threadIdx.x] = ca;
            sm[threadIdx.x] = ma;
            sm2[threadIdx.x] = m2a;
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        const int p = c * split + s;
        part[p] = sc[0];
        part[C * split + p] = sm[0];
        part[2 * C * split + p] = sm2[0];
    }
}

// (mean, rstd) of channel c from bn_stats' part[3][C][split], rounded to fp32 once.
__device__ __forceinline__ void channel_stats(const double* __restrict__ part, int C, int split, int c, float eps,
                                              float& mean, float& rstd) {
    double cnt = 0.0, m = 0.0, m2 = 0.0;
    for (int j = 0; j < split; ++j) {
        const int p = c * split + j;
        chan_merge64(cnt, m, m2, part[p], part[C * split + p], part[2 * C * split + p]);
    }
    mean = (float)m;
    rstd = (float)(1.0 / sqrt(m2 / cnt + (double)eps));
}

// The forward's (x - mean) * scale + shift of channel c: mean, scale = rstd * w and
// shift = b, the statistics from channel_stats; block s == 0 stores mean and rstd.
struct NormParams {
    float mean, scale, shift;
};

template <typename T>
__device__ __forceinline__ NormParams normalize_params(const double* __restrict__ part, int C, int split, int c,
                                                       int s, float eps, const T* __restrict__ w,
                                                       const T* __restrict__ b, float* __restrict__ mean_out,
                                                       float* __restrict__ rstd_out) {
    float mean, rstd;
    channel_stats(part, C, split, c, eps, mean, rstd);
    if (s == 0 && threadIdx.x == 0) {
        mean_out[c] = mean;
        rstd_out[c] = rstd;
    }
    return {mean, rstd * kl::to_f(w[c]), kl::to_f(b[c])};
}

// The block's totals (fp64) of its threads' sums of g * (x - mean) and g, written by
// thread 0 to part[2][C][split] at chunk (c, s); red: THREADS doubles of shared memory.
template <typename A>
__device__ __forceinline__ void store_grad_partials(A sw, A sb, double* red, double* __restrict__ part, int C,
                                                    int split, int c, int s) {
    const double tw = kl::smem_block_sum<THREADS>(sw, red);
    const double tb = kl::smem_block_sum<THREADS>(sb, red);
    if (threadIdx.x == 0) {
        part[c * split + s] = tw;
        part[C * split + c * split + s] = tb;
    }
}

// Channel c's totals of store_grad_partials' `split` chunks, in fp64 (tw, tb), and
// rounded once to fp32: sw = tw * rstd (dw), sb = tb (db); block s == 0 stores dw and db.
struct GradSums {
    double tw, tb;
    float sw, sb;
};

template <typename T>
__device__ __forceinline__ GradSums channel_grads(const double* __restrict__ part, int C, int split, int c, int s,
                                                  float rstd, T* __restrict__ dw, T* __restrict__ db) {
    double tw = 0.0, tb = 0.0;
    for (int j = 0; j < split; ++j) {
        tw += part[c * split + j];
        tb += part[C * split + c * split + j];
    }
    const float sw = (float)(tw * (double)rstd), sb = (float)tb;
    if (s == 0 && threadIdx.x == 0) {
        dw[c] = kl::from_f<T>(sw);
        db[c] = kl::from_f<T>(sb);
    }
    return {tw, tb, sw, sb};
}
