// fp32 GEMV prototype (lab/gpu_fp32_gemv.py): y [M, N] = x [M, K] @ b, M <= 4, no TF32.
// Two weight layouts, any row stride (scalar 4-byte loads: a warp's 32 lanes read 128
// consecutive bytes, coalesced at any alignment, so odd K / N / strides need no shifting):
//   gv_cols_m{1,2,4}: b row-major [K, N] (row stride ldw): one output column per thread,
//       GV_U k rows of loads in flight per thread, the block's K slice of x in shared memory.
//   gv_rows_m{1,2,4}: b = W.t(), W row-major [N, K] (row stride ldw): GV_R weight rows per
//       warp, lanes along K, GV_U 128-byte loads a row in flight, a butterfly at the end.
// blockIdx.y is the K slice (kc rows each). With S > 1 slices every block writes its fp32
// sums to ws [S, M, N] and gv_sum adds them in slice order (deterministic); with S = 1 the
// blocks write y directly.
#ifndef GV_THREADS
#define GV_THREADS 256
#endif
#ifndef GV_U
#define GV_U 8
#endif
#ifndef GV_R
#define GV_R 1
#endif

namespace {

__device__ __forceinline__ float ld_stream(const float* p) { return __ldcs(p); }

// x [M, K] (row stride ldx) rows k0 .. k0 + klen of the slice into xs, M rows of `pitch`
// floats (zeros past klen and past M up to MR).
template <int MR, bool KMAJOR>
__device__ __forceinline__ void stage_x(float* xs, const float* x, int M, int ldx, int k0, int klen, int pitch) {
    for (int i = threadIdx.x; i < MR * pitch; i += blockDim.x) {
        int m, kk;
        if constexpr (KMAJOR) {  // xs[kk * MR + m]
            kk = i / MR;
            m = i - kk * MR;
        } else {  // xs[m * pitch + kk]
            m = i / pitch;
            kk = i - m * pitch;
        }
        xs[i] = (m < M && kk < klen) ? x[(long long)m * ldx + k0 + kk] : 0.0f;
    }
    __syncthreads();
}

template <int MR>
__device__ __forceinline__ void cols(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ out,
                                     int M, int N, int K, int ldx, int ldw, int kc) {
    extern __shared__ float xs[];  // [kc][MR]
    const int s = blockIdx.y;
    const int k0 = s * kc;
    const int klen = min(K - k0, kc);
    stage_x<MR, true>(xs, x, M, ldx, k0, klen, kc);
    const int n = blockIdx.x * GV_THREADS + threadIdx.x;
    if (n >= N) return;
    float acc[MR];
#pragma unroll
    for (int m = 0; m < MR; ++m) acc[m] = 0.0f;
    const float* p = w + (long long)k0 * ldw + n;
    int kk = 0;
    for (; kk + GV_U <= klen; kk += GV_U) {
        float v[GV_U];
#pragma unroll
        for (int u = 0; u < GV_U; ++u) v[u] = ld_stream(p + (long long)(kk + u) * ldw);
#pragma unroll
        for (int u = 0; u < GV_U; ++u)
#pragma unroll
            for (int m = 0; m < MR; ++m) acc[m] = fmaf(xs[(kk + u) * MR + m], v[u], acc[m]);
    }
    for (; kk < klen; ++kk) {
        const float v = ld_stream(p + (long long)kk * ldw);
#pragma unroll
        for (int m = 0; m < MR; ++m) acc[m] = fmaf(xs[kk * MR + m], v, acc[m]);
    }
#pragma unroll
    for (int m = 0; m < MR; ++m)
        if (m < M) out[((long long)s * M + m) * N + n] = acc[m];
}

template <int MR>
__device__ __forceinline__ void rows(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ out,
                                     int M, int N, int K, int ldx, int ldw, int kc) {
    extern __shared__ float xs[];  // [MR][pitch], pitch = kc rounded up to 32 x GV_U
    constexpr int STEP = 32 * GV_U;
    const int pitch = (kc + STEP - 1) / STEP * STEP;
    const int s = blockIdx.y;
    const int k0 = s * kc;
    const int klen = min(K - k0, kc);
    stage_x<MR, false>(xs, x, M, ldx, k0, klen, pitch);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int n0 = (blockIdx.x * (GV_THREADS / 32) + warp) * GV_R;
    float acc[GV_R][MR];
    const float* p[GV_R];
#pragma unroll
    for (int r = 0; r < GV_R; ++r) {
        p[r] = w + (long long)min(n0 + r, N - 1) * ldw + k0;  // rows past N read row N - 1, never stored
#pragma unroll
        for (int m = 0; m < MR; ++m) acc[r][m] = 0.0f;
    }
    for (int kb = 0; kb < klen; kb += STEP) {
        float v[GV_R][GV_U];
#pragma unroll
        for (int r = 0; r < GV_R; ++r)
#pragma unroll
            for (int u = 0; u < GV_U; ++u) {
                const int kk = kb + u * 32 + lane;
                v[r][u] = kk < klen ? ld_stream(p[r] + kk) : 0.0f;
            }
#pragma unroll
        for (int u = 0; u < GV_U; ++u)
#pragma unroll
            for (int m = 0; m < MR; ++m) {
                const float xv = xs[m * pitch + kb + u * 32 + lane];  // zero past klen
#pragma unroll
                for (int r = 0; r < GV_R; ++r) acc[r][m] = fmaf(xv, v[r][u], acc[r][m]);
            }
    }
#pragma unroll
    for (int r = 0; r < GV_R; ++r)
#pragma unroll
        for (int m = 0; m < MR; ++m) {
            float t = acc[r][m];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
            if (lane == 0 && m < M && n0 + r < N) out[((long long)s * M + (m)) * N + n0 + r] = t;
        }
}

}  // namespace

#define GV_ENTRY(KIND, MR)                                                                                   \
    extern "C" __global__ void __launch_bounds__(GV_THREADS) gv_##KIND##_m##MR(                               \
        const float* x, const float* w, float* out, int M, int N, int K, int ldx, int ldw, int kc) {         \
        KIND<MR>(x, w, out, M, N, K, ldx, ldw, kc);                                                          \
    }
GV_ENTRY(cols, 1)
GV_ENTRY(cols, 2)
GV_ENTRY(cols, 4)
GV_ENTRY(rows, 1)
GV_ENTRY(rows, 2)
GV_ENTRY(rows, 4)

// y [M, N] = sum over s of ws [S, M, N], in slice order.
extern "C" __global__ void gv_sum(const float* __restrict__ ws, float* __restrict__ y, int mn, int S) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= mn) return;
    float t = 0.0f;
    for (int s = 0; s < S; ++s) t += ws[(long long)s * mn + i];
    y[i] = t;
}
