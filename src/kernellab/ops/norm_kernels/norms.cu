// LayerNorm and RMSNorm over the last dimension, forward and backward; fp32 / fp16 / bf16
// storage, fp32 math. One source for both ops: template flag RMS (no mean, no bias).
//
//   forward   y = xhat * w (+ b),  xhat = (x - mean) * rstd   (RMS: xhat = x * rstd)
//             rstd = 1 / sqrt(var + eps)  (two-pass variance; RMS: mean(x^2) + eps)
//             mean and rstd (fp32, one per row) are written for the backward.
//   backward  g = w * dy,  dx = rstd * (g - xhat * mean(g * xhat) - mean(g))  (RMS: no mean(g))
//             dw = sum over rows of dy * xhat, db = sum of dy: each block accumulates its
//             rows into one fp32 partial row; the host sums the [partials, D] buffer.
//
// Variants (backends of ops "layer_norm" and "rms_norm"):
//   v1  *_v1_*   (cuda_v1) one block of 256 threads per row, a strided loop over the
//                columns, shared-memory tree reductions; the row is re-read from global
//                memory for each pass (fwd: 3 reads of x, 4 for fp32 to correct the
//                mean; bwd: 2 reads of x and dy) and the backward adds into its block's
//                partial row in global memory (read-modify-write, no atomics: each
//                column belongs to one thread).
//                Any D, any alignment: also the fallback of v2.
//   v2  *_p{P}_*   (cuda) the row is held in registers: each thread loads P 16-byte packs
//                of the row once (P in 1, 2, 4, 8; up to 256 threads per row, so
//                D <= 2048 packs: 16384 fp16/bf16, 8192 fp32), warp-shuffle reductions (plus one
//                shared-memory step across the warps of a row), several rows per block
//                for short rows (one warp per row up to 32 * P packs), fp32 dw/db partials
//                kept in registers across all the rows a block walks, written once.
//                1 read + 1 write per element forward, 2 reads + 1 write backward (the
//                minimum); needs D % (16 / sizeof(T)) == 0 and 16-byte aligned rows.
#include "common.cuh"
#include "reduce.cuh"

namespace {

constexpr int V1_THREADS = 256;
// v2 blocks have exactly this many threads (the host launches 256): the register budget
// per thread is then up to 255 (P = 8 packs of x, g and two fp32 partials fit).
constexpr int V2_THREADS = 256;

// ---------------------------------------------------------------------------- v1

// Sum over the block through shared memory, each step halving the active threads
// (kl::smem_block_sum); ``red`` holds V1_THREADS values (float, or double for the
// backward's sums); every thread gets the result.
template <typename A>
__device__ __forceinline__ A v1_block_sum(A v, A* red) {
    return kl::smem_block_sum<V1_THREADS>(v, red);
}

// This thread's part of sum(x - mean) over a row: the corrected two-pass mean. fp32 x
// only: the fp32 mean is rounded, and rstd times that rounding shifts every xhat; rows of
// nearly equal values (rstd up to 1/sqrt(eps)) turn it into 1e-5-2e-5 of error in y, past
// the check's 2x-PyTorch bound. The correction corr = mean(x - mean) is subtracted from
// x - mean, not added to the mean: mean + corr is mostly the same fp32 number (folded in,
// the correction is lost). The saved mean is mean + corr, the nearest fp32.
template <typename T>
__device__ __forceinline__ float mean_residual(const T* xr, int d, float mean) {
    float r = 0.0f;
    for (int j = threadIdx.x; j < d; j += V1_THREADS) r += kl::to_f(xr[j]) - mean;
    return r;
}

template <typename T, bool RMS>
__device__ void norm_fwd_v1(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                            T* __restrict__ y, float* __restrict__ mean_out, float* __restrict__ rstd_out,
                            int d, float eps) {
    __shared__ float red[V1_THREADS];
    const long long row = blockIdx.x;
    const T* xr = x + row * d;
    T* yr = y + row * d;
    float mean = 0.0f, corr = 0.0f;
    if (!RMS) {
        float s = 0.0f;
        for (int j = threadIdx.x; j < d; j += V1_THREADS) s += kl::to_f(xr[j]);
        mean = v1_block_sum(s, red) / d;
        if (sizeof(T) == 4) corr = v1_block_sum(mean_residual(xr, d, mean), red) / d;
    }
    float ss = 0.0f;
    for (int j = threadIdx.x; j < d; j += V1_THREADS) {
        const float c = (kl::to_f(xr[j]) - mean) - corr;
        ss += c * c;
    }
    const float rstd = 1.0f / sqrtf(v1_block_sum(ss, red) / d + eps);
    if (threadIdx.x == 0) {
        if (!RMS) mean_out[row] = mean + corr;
        rstd_out[row] = rstd;
    }
    for (int j = threadIdx.x; j < d; j += V1_THREADS) {
        float v = ((kl::to_f(xr[j]) - mean) - corr) * rstd * kl::to_f(w[j]);
        if (!RMS && b != nullptr) v += kl::to_f(b[j]);
        yr[j] = kl::from_f<T>(v);
    }
}

// grid: the number of partial rows; block i takes rows i, i + gridDim.x, ...
// dw_part, db_part: [gridDim.x, d] fp32, zero-filled by the host.
template <typename T, bool RMS>
__device__ void norm_bwd_v1(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ w,
                            const float* __restrict__ mean_in, const float* __restrict__ rstd_in,
                            T* __restrict__ dx, float* __restrict__ dw_part, float* __restrict__ db_part,
                            long long rows, int d) {
    __shared__ double red64[V1_THREADS];
    float* dwp = dw_part + (long long)blockIdx.x * d;
    float* dbp = db_part + (long long)blockIdx.x * d;
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
        const T* xr = x + row * d;
        const T* dyr = dy + row * d;
        // The row mean again, in float64: xhat = (x - mean) * rstd inherits the saved fp32
        // mean's rounding as a shift rstd * dmean, and dx carries it times rstd again. Rows of
        // nearly equal values (rstd ~ 1/sqrt(eps) = 316) turn half an ulp of the mean into
        // dx errors of ~1e-3, past the 2x-PyTorch rule. One more read of the row (from
        // L1/L2) removes it.
        double mean64 = 0.0;
        if (!RMS) {
            double sx = 0.0;
            for (int j = threadIdx.x; j < d; j += V1_THREADS) sx += (double)kl::to_f(xr[j]);
            mean64 = v1_block_sum(sx, red64) / d;
        }
        (void)mean_in;
        const float rstd = rstd_in[row];
        // The row sums and dx in float64 too: for a row of one element dx is g * rstd *
        // (1 - xhat^2), a difference of two numbers near 1, which fp32 loses. This kernel takes
        // the widths the vectorized one cannot (not a multiple of 16 bytes): memory-bound
        // either way.
        double s1 = 0.0, s2 = 0.0;
        for (int j = threadIdx.x; j < d; j += V1_THREADS) {
            const float g = __fmul_rn(kl::to_f(dyr[j]), kl::to_f(w[j]));
            const double xhat = ((double)kl::to_f(xr[j]) - mean64) * rstd;  // as in the dx loop
            s1 += g * xhat;
            s2 += g;
        }
        const double c1 = v1_block_sum(s1, red64) / d;
        const double c2 = RMS ? 0.0 : v1_block_sum(s2, red64) / d;
        for (int j = threadIdx.x; j < d; j += V1_THREADS) {
            const float dyv = kl::to_f(dyr[j]);
            const double xhat = ((double)kl::to_f(xr[j]) - mean64) * rstd;
            const float g = __fmul_rn(dyv, kl::to_f(w[j]));  // rounded as in c2: no fma
            dx[row * d + j] = kl::from_f<T>((float)((g - (xhat * c1 + c2)) * rstd));
            dwp[j] += dyv * (float)xhat;
            if (!RMS) dbp[j] += dyv;
        }
    }
}

// ---------------------------------------------------------------------------- v2

// Sum over the ``tpr`` threads of one row (tpr a power of two in 32..256 dividing blockDim.x;
// uniform over the block). Within a warp: shuffles. Across the warps of a row: one slot
// per warp in ``scratch`` (blockDim.x / 32 floats), read back by every thread of the row
// in the same order, so all of them get the same value. All threads of the block must
// call it (it has barriers), including those of rows past the end.
__device__ __forceinline__ float row_sum(float v, int tpr, float* scratch) {
    v = kl::warp_allreduce(v, kl::SumOp());
    if (tpr <= 32) return v;
    const int warp = threadIdx.x >> 5, wpr = tpr >> 5, first = (warp / wpr) * wpr;
    __syncthreads();  // scratch may still be read by the previous call
    if ((threadIdx.x & 31) == 0) scratch[warp] = v;
    __syncthreads();
    float s = 0.0f;
    for (int i = 0; i < wpr; ++i) s += scratch[first + i];
    return s;
}

// Block: rows_per_block = blockDim.x / tpr rows, each read by tpr threads; thread ``lt`` of
// a row holds packs lt, lt + tpr, ..., lt + (P - 1) tpr (a warp reads 32 consecutive
// packs: 512 contiguous bytes per load instruction).
template <typename T, int P, bool RMS>
__device__ void norm_fwd_v2(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                            T* __restrict__ y, float* __restrict__ mean_out, float* __restrict__ rstd_out,
                            long long rows, int d, int tpr, float eps) {
    using V = kl::Vec16<T>;
    constexpr int N = V::N;
    __shared__ float scratch[32];
    const int rpb = blockDim.x / tpr, lt = threadIdx.x % tpr;
    const long long row = (long long)blockIdx.x * rpb + threadIdx.x / tpr;
    const bool live = row < rows;
    const int packs = d / N;
    const int4* xr = reinterpret_cast<const int4*>(x + (live ? row : 0) * d);
    float v[P][N];
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < P; ++k) {
        const int p = lt + k * tpr;
        V pk;
        pk.raw = (live && p < packs) ? xr[p] : make_int4(0, 0, 0, 0);
#pragma unroll
        for (int j = 0; j < N; ++j) {
            v[k][j] = kl::to_f(pk.e[j]);
            s += v[k][j];
        }
    }
    float mean = 0.0f, corr = 0.0f;
    if (!RMS) {
        mean = row_sum(s, tpr, scratch) / d;
        if (sizeof(T) == 4) {  // fp32: the corrected two-pass mean (see mean_residual)
            float r = 0.0f;
#pragma unroll
            for (int k = 0; k < P; ++k)
                if (lt + k * tpr < packs)
#pragma unroll
                    for (int j = 0; j < N; ++j) r += v[k][j] - mean;
            corr = row_sum(r, tpr, scratch) / d;
        }
    }
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < P; ++k) {
        if (lt + k * tpr < packs) {
#pragma unroll
            for (int j = 0; j < N; ++j) {
                v[k][j] = (v[k][j] - mean) - corr;
                ss += v[k][j] * v[k][j];
            }
        }
    }
    const float rstd = 1.0f / sqrtf(row_sum(ss, tpr, scratch) / d + eps);
    if (!live) return;  // no barrier below
    if (lt == 0) {
        if (!RMS) mean_out[row] = mean + corr;
        rstd_out[row] = rstd;
    }
    const int4* w4 = reinterpret_cast<const int4*>(w);
    const int4* b4 = reinterpret_cast<const int4*>(b);
    int4* yr = reinterpret_cast<int4*>(y + row * d);
#pragma unroll
    for (int k = 0; k < P; ++k) {
        const int p = lt + k * tpr;
        if (p < packs) {
            V wk, bk, o;
            wk.raw = w4[p];
            if (!RMS && b != nullptr) bk.raw = b4[p];
#pragma unroll
            for (int j = 0; j < N; ++j) {
                float r = v[k][j] * rstd * kl::to_f(wk.e[j]);
                if (!RMS && b != nullptr) r += kl::to_f(bk.e[j]);
                o.e[j] = kl::from_f<T>(r);
            }
            yr[p] = o.raw;
        }
    }
}

// grid: any number of blocks; block i walks row groups i, i + gridDim.x, ... (rows_per_block
// rows each). dw_part, db_part: [gridDim.x * rows_per_block, d] fp32, every element written
// (zeros for a slot that got no rows).
template <typename T, int P, bool RMS>
__device__ void norm_bwd_v2(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ w,
                            const float* __restrict__ mean_in, const float* __restrict__ rstd_in,
                            T* __restrict__ dx, float* __restrict__ dw_part, float* __restrict__ db_part,
                            long long rows, int d, int tpr) {
    using V = kl::Vec16<T>;
    constexpr int N = V::N;
    __shared__ float scratch[32];
    const int rpb = blockDim.x / tpr, lt = threadIdx.x % tpr, sub = threadIdx.x / tpr;
    const int packs = d / N;
    const int4* w4 = reinterpret_cast<const int4*>(w);
    float dw[P][N], db[P][N];
#pragma unroll
    for (int k = 0; k < P; ++k)
#pragma unroll
        for (int j = 0; j < N; ++j) dw[k][j] = db[k][j] = 0.0f;
    // Raw 16-byte packs of x and dy of one row of this thread's slot (zeros past the end).
    auto load_row = [&](long long row, int4 (&xa)[P], int4 (&da)[P]) {
        const bool live = row < rows;
        const int4* xr = reinterpret_cast<const int4*>(x + (live ? row : 0) * d);
        const int4* dyr = reinterpret_cast<const int4*>(dy + (live ? row : 0) * d);
#pragma unroll
        for (int k = 0; k < P; ++k) {
            const int p = lt + k * tpr;
            const bool in = live && p < packs;
            xa[k] = in ? xr[p] : make_int4(0, 0, 0, 0);
            da[k] = in ? dyr[p] : make_int4(0, 0, 0, 0);
        }
    };
    const long long stride = (long long)gridDim.x * rpb;
    int4 xa[P], da[P];
    load_row((long long)blockIdx.x * rpb + sub, xa, da);
    // The loop bound is uniform over the block (row_sum has barriers). The next row's
    // packs are loaded before this row is reduced: two rows of loads in flight per thread
    // (a block walks its rows one after another; with ~2 resident blocks per SM one row
    // in flight is ~16 KB per SM, too little to cover DRAM latency).
    for (long long r0 = (long long)blockIdx.x * rpb; r0 < rows; r0 += stride) {
        const long long row = r0 + sub;
        const bool live = row < rows;
        const float mean = (RMS || !live) ? 0.0f : mean_in[row];
        const float rstd = live ? rstd_in[row] : 0.0f;
        int4 xn[P], dn[P];
        load_row(r0 + stride + sub, xn, dn);
        float xh[P][N], g[P][N];
        float s1 = 0.0f, s2 = 0.0f;
#pragma unroll
        for (int k = 0; k < P; ++k) {
            const int p = lt + k * tpr;
            V xk, dk, wk;
            xk.raw = xa[k];
            dk.raw = da[k];
            wk.raw = (live && p < packs) ? w4[p] : make_int4(0, 0, 0, 0);
#pragma unroll
            for (int j = 0; j < N; ++j) {
                const float dyv = kl::to_f(dk.e[j]);
                xh[k][j] = (kl::to_f(xk.e[j]) - mean) * rstd;
                g[k][j] = __fmul_rn(dyv, kl::to_f(wk.e[j]));  // never fused: dx of d = 1 is exactly 0
                s1 += g[k][j] * xh[k][j];
                s2 += g[k][j];
                dw[k][j] += dyv * xh[k][j];
                if (!RMS) db[k][j] += dyv;
            }
        }
#pragma unroll
        for (int k = 0; k < P; ++k) {
            xa[k] = xn[k];
            da[k] = dn[k];
        }
        const float c1 = row_sum(s1, tpr, scratch) / d;
        const float c2 = RMS ? 0.0f : row_sum(s2, tpr, scratch) / d;
        if (live) {
            int4* dxr = reinterpret_cast<int4*>(dx + row * d);
#pragma unroll
            for (int k = 0; k < P; ++k) {
                const int p = lt + k * tpr;
                if (p < packs) {
                    V o;
#pragma unroll
                    for (int j = 0; j < N; ++j) o.e[j] = kl::from_f<T>((g[k][j] - (xh[k][j] * c1 + c2)) * rstd);
                    dxr[p] = o.raw;
                }
            }
        }
    }
    // One partial row per block: the block's row slots (rpb of them, each tpr threads holding
    // the same columns) are summed in shared memory in slot order, pack by pack, so the
    // partial buffer (and the sum over it after this kernel) has gridDim.x rows, not
    // gridDim.x * rpb (with 4 slots a block at D = 768 the sum of 2112 rows cost about as
    // much as this kernel). The order is fixed: the result does not depend on scheduling.
    __shared__ float red_w[V2_THREADS * N], red_b[RMS ? 1 : V2_THREADS * N];
    float* dwp = dw_part + (long long)blockIdx.x * d;
    float* dbp = db_part + (long long)blockIdx.x * d;
#pragma unroll
    for (int k = 0; k < P; ++k) {
        const int p = lt + k * tpr;
        if (rpb == 1) {
            if (p < packs) {
#pragma unroll
                for (int j = 0; j < N; ++j) {
                    dwp[p * N + j] = dw[k][j];
                    if (!RMS) dbp[p * N + j] = db[k][j];
                }
            }
            continue;
        }
        __syncthreads();  // the previous pack's sums were read
#pragma unroll
        for (int j = 0; j < N; ++j) {
            red_w[threadIdx.x * N + j] = dw[k][j];
            if (!RMS) red_b[threadIdx.x * N + j] = db[k][j];
        }
        __syncthreads();
        if (sub == 0 && p < packs) {
#pragma unroll
            for (int j = 0; j < N; ++j) {
                float sw = red_w[lt * N + j], sb = RMS ? 0.0f : red_b[lt * N + j];
                for (int s2 = 1; s2 < rpb; ++s2) {
                    sw += red_w[(s2 * tpr + lt) * N + j];
                    if (!RMS) sb += red_b[(s2 * tpr + lt) * N + j];
                }
                dwp[p * N + j] = sw;
                if (!RMS) dbp[p * N + j] = sb;
            }
        }
    }
}

}  // namespace

// Entry points: {ln,rms}_{fwd,bwd}_v1_<dtype>, {ln,rms}_{fwd,bwd}_p<P>_<dtype> (v2: no version tag, the "cuda" backend's names).
#define KL_NORM_V1(SFX, T)                                                                              \
    extern "C" __global__ void __launch_bounds__(V1_THREADS)                                            \
        ln_fwd_v1_##SFX(const T* x, const T* w, const T* b, T* y, float* mean, float* rstd, int d,      \
                        float eps) {                                                                    \
        norm_fwd_v1<T, false>(x, w, b, y, mean, rstd, d, eps);                                          \
    }                                                                                                   \
    extern "C" __global__ void __launch_bounds__(V1_THREADS)                                            \
        rms_fwd_v1_##SFX(const T* x, const T* w, const T* b, T* y, float* mean, float* rstd, int d,     \
                         float eps) {                                                                   \
        norm_fwd_v1<T, true>(x, w, b, y, mean, rstd, d, eps);                                           \
    }                                                                                                   \
    extern "C" __global__ void __launch_bounds__(V1_THREADS)                                            \
        ln_bwd_v1_##SFX(const T* dy, const T* x, const T* w, const float* mean, const float* rstd,      \
                        T* dx, float* dwp, float* dbp, long long rows, int d) {                         \
        norm_bwd_v1<T, false>(dy, x, w, mean, rstd, dx, dwp, dbp, rows, d);                             \
    }                                                                                                   \
    extern "C" __global__ void __launch_bounds__(V1_THREADS)                                            \
        rms_bwd_v1_##SFX(const T* dy, const T* x, const T* w, const float* mean, const float* rstd,     \
                         T* dx, float* dwp, float* dbp, long long rows, int d) {                        \
        norm_bwd_v1<T, true>(dy, x, w, mean, rstd, dx, dwp, dbp, rows, d);                              \
    }

#define KL_NORM_V2(SFX, T, P)                                                                           \
    extern "C" __global__ void __launch_bounds__(V2_THREADS)                                                  \
        ln_fwd_p##P##_##SFX(const T* x, const T* w, const T* b, T* y, float* mean, float* rstd,      \
                               long long rows, int d, int tpr, float eps) {                             \
        norm_fwd_v2<T, P, false>(x, w, b, y, mean, rstd, rows, d, tpr, eps);                            \
    }                                                                                                   \
    extern "C" __global__ void __launch_bounds__(V2_THREADS)                                                  \
        rms_fwd_p##P##_##SFX(const T* x, const T* w, const T* b, T* y, float* mean, float* rstd,     \
                                long long rows, int d, int tpr, float eps) {                            \
        norm_fwd_v2<T, P, true>(x, w, b, y, mean, rstd, rows, d, tpr, eps);                             \
    }                                                                                                   \
    extern "C" __global__ void __launch_bounds__(V2_THREADS)                                                  \
        ln_bwd_p##P##_##SFX(const T* dy, const T* x, const T* w, const float* mean,                  \
                               const float* rstd, T* dx, float* dwp, float* dbp, long long rows, int d, \
                               int tpr) {                                                               \
        norm_bwd_v2<T, P, false>(dy, x, w, mean, rstd, dx, dwp, dbp, rows, d, tpr);                     \
    }                                                                                                   \
    extern "C" __global__ void __launch_bounds__(V2_THREADS)                                                  \
        rms_bwd_p##P##_##SFX(const T* dy, const T* x, const T* w, const float* mean,                 \
                                const float* rstd, T* dx, float* dwp, float* dbp, long long rows,       \
                                int d, int tpr) {                                                       \
        norm_bwd_v2<T, P, true>(dy, x, w, mean, rstd, dx, dwp, dbp, rows, d, tpr);                      \
    }

// The partial rows of dw summed in column order, rounded once to T: [rows, d] fp32 -> [d].
// The C++ autograd node's backward (kernellab/cuda/nodes.cpp) launches it, one thread per
// column: a launch costs the host a few microseconds where torch's sum(0, dtype) costs ~10.
#define KL_NORM_PSUM(SFX, T)                                                                            \
    extern "C" __global__ void norm_psum_##SFX(const float* part, T* out, int rows, int d) {           \
        int j = blockIdx.x * blockDim.x + threadIdx.x;                                                  \
        if (j >= d) return;                                                                             \
        float acc = 0.0f;                                                                               \
        for (int r = 0; r < rows; ++r) acc += part[(long long)r * d + j];                               \
        out[j] = kl::from_f<T>(acc);                                                                    \
    }

#define KL_NORM_ALL(SFX, T) \
    KL_NORM_PSUM(SFX, T)    \
    KL_NORM_V1(SFX, T)      \
    KL_NORM_V2(SFX, T, 1)   \
    KL_NORM_V2(SFX, T, 2)   \
    KL_NORM_V2(SFX, T, 4)   \
    KL_NORM_V2(SFX, T, 8)

KL_FOR_EACH_DTYPE(KL_NORM_ALL)
