// Batch-norm statistics shared by batch_norm2d.cu and bn_relu_pool2d.cu (include after
// common.cuh, inside an anonymous namespace, with THREADS defined).
//
//   bn_stats        one block per (channel c, chunk s): each thread sums (v - K) and
//                   (v - K)^2 over its elements in fp64, K the chunk's first value (a shift
//                   that keeps the sums small); the block turns them into (count, mean,
//                   M2) triples and merges them (Chan's formula, fp64) -> part[3][C][split].
//   channel_stats   a thread merges channel c's `split` triples in fp64 and rounds mean and
//                   rstd = 1 / sqrt(var + eps) to fp32 once: the float64 reference's
//                   statistics within half an ulp (the Triton backend's, too).
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

// Flat index i of a channel's N * HW values -> element offset of NCHW x.
__device__ __forceinline__ long long bn_offset(int i, int c, int C, int HW) {
    const int n = i / HW;
    return ((long long)n * C + c) * HW + (i - n * HW);
}

template <typename T>
__device__ void bn_stats(const T* __restrict__ x, double* __restrict__ part, int C, int HW, int M, int chunk) {
    __shared__ double sc[THREADS], sm[THREADS], sm2[THREADS];
    const int split = gridDim.x / C;
    const int c = blockIdx.x / split, s = blockIdx.x - c * split;
    const int start = s * chunk;
    const int end = min(start + chunk, M);
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
