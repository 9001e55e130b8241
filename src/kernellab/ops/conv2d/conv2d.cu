// conv2d (NCHW, cross-correlation as PyTorch's), forward and backward; fp32 / fp16 / bf16
// storage, fp32 accumulation, one rounding at the end. Every tensor contiguous
// (x [N, C, H, W], w [K, C, R, S], y / dy [N, K, P, Q]); indices are 32-bit (the host
// refuses tensors of 2^31 elements or more). Geometry arguments, in this order:
// N, C, H, W, K, R, S, P, Q, sh, sw, ph, pw.
//
// Variants (backends of op "conv2d"):
//   v1  conv2d_fwd_v1_*  one output per thread, the course's naive direct convolution:
//                        C R S loads of x and of w per output, all from global memory
//                        (the L1/L2 catch the reuse, or not).
//   v2  conv2d_fwd_v2_*  a 16 x 16 output tile per block and 8 output channels: the
//                        input tile ((15 sh + R) x (15 sw + S)) and the 8 filters of one
//                        input channel are staged in shared memory, then each thread
//                        reads its R S window from there for 8 outputs. Global reads of
//                        x drop from R S per output to ~(1 + (R-1)/16)^2 / 8 per output.
//   v3  conv2d_fwd_*     (backend "cuda") implicit GEMM, y[N P Q, K] = A[N P Q, C R S] @
//                        w^T[C R S, K] with A gathered from x on the fly (no im2col copy):
//                        64 x 64 block tiles, 16-deep reduction slices staged in shared
//                        memory, 4 x 4 outputs per thread in registers (16 FMAs per 8
//                        shared loads), the next slice's global loads issued before the
//                        current slice's math (register prefetch). SIMT fp32 FMAs: no
//                        tensor cores (mma/wmma for 16-bit is not done; see cuda.py).
//   v4  conv2d_fwd_tc_*  (backend "cuda_v4", fp16 / bf16 only) v3's implicit GEMM on tensor
//                        cores: mma.sync.m16n8k16 with ldmatrix from padded shared tiles
//                        (64 x 64 x 32 block tile, 4 warps of 32 x 32). Not yet measured on
//                        a GPU: a separate backend until the gpu tests and the ladder say
//                        it is right and faster; then it becomes "cuda" for 16-bit.
//   backward (all variants): conv2d_dgrad_* and conv2d_wgrad_* are the same implicit
//                        GEMM main loop with other gathers (dgrad: the transposed
//                        convolution, dy gathered where (h + ph - r) / sh is exact;
//                        fp32: 16-deep slices summed in fp64, as wgrad's;
//                        wgrad: split over N P Q into fp64 partials, summed on the host
//                        side; fp32: 16-deep slices summed in fp64 within a split),
//                        conv2d_dbias_*: fp64 row sums per channel and batch slice.
//
// Napkin math (what the ladder should show; H100 SXM: ~60 TFLOP/s of fp32 FMA, ~990 of
// dense bf16 tensor-core MMA, ~3.3 TB/s):
//   MNIST conv 2 at batch 1024 (32 -> 64, 14x14, 3x3): 2 N K P Q C R S = 7.4 GFLOP against
//   x 25.7 MB + y 51.4 MB (fp32): compute-bound. At ~50% of the FMA peak v3 needs ~0.25 ms;
//   cuDNN on tensor cores (bf16, or TF32 for fp32 when allowed) can be several times faster:
//   v4 is the rung that can compete there.
//   MNIST conv 1 at batch 1024 (1 -> 32, 28x28): 0.46 GFLOP against y = 103 MB (fp32):
//   memory-bound, ~31 us at the copy ceiling whatever the math; C R S = 9 leaves v3's
//   16-deep slices and v4's 32-deep ones mostly zeros (wasted, but hidden under the writes).
//   The large layer (N 32, C 64, 56x56, K 64): 7.4 GFLOP, like conv 2 at batch 1024.
#include "common.cuh"

namespace {

struct Geom {
    int N, C, H, W, K, R, S, P, Q, sh, sw, ph, pw;
};

#define KL_GEOM_PARAMS \
    int N, int C, int H, int W, int K, int R, int S, int P, int Q, int sh, int sw, int ph, int pw
#define KL_GEOM Geom{N, C, H, W, K, R, S, P, Q, sh, sw, ph, pw}

// ----------------------------------------------------------------------------- v1

// Accumulator of a long fp32 sum: fp64 for fp32 data (16-bit data: fp32, its storage
// rounding dominates).
template <typename T>
using Acc = typename kl::WideAcc<T>::type;

template <typename T>
__device__ void fwd_v1(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                       T* __restrict__ y, Geom g) {
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    const long long total = (long long)g.N * g.K * g.P * g.Q;
    if (i >= total) return;
    const int q = (int)(i % g.Q);
    const int p = (int)((i / g.Q) % g.P);
    const int k = (int)((i / ((long long)g.Q * g.P)) % g.K);
    const int n = (int)(i / ((long long)g.Q * g.P * g.K));
    // One thread sums all C R S products: for fp32 in fp64 (an fp32 running sum of
    // thousands of products is several times cuDNN's error with TF32 off).
    Acc<T> acc = 0;
    for (int c = 0; c < g.C; ++c) {
        for (int r = 0; r < g.R; ++r) {
            const int ih = p * g.sh - g.ph + r;
            if (ih < 0 || ih >= g.H) continue;
            for (int s = 0; s < g.S; ++s) {
                const int iw = q * g.sw - g.pw + s;
                if (iw < 0 || iw >= g.W) continue;
                acc += kl::to_f(x[((n * g.C + c) * g.H + ih) * g.W + iw]) *
                       kl::to_f(w[((k * g.C + c) * g.R + r) * g.S + s]);
            }
        }
    }
    if (b != nullptr) acc += kl::to_f(b[k]);
    y[i] = kl::from_f<T>(float(acc));
}

// ----------------------------------------------------------------------------- v2

constexpr int kV2Tile = 16;  // outputs per block edge (16 x 16 threads)
constexpr int kV2K = 8;      // output channels per block

template <typename T>
__device__ void fwd_v2(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                       T* __restrict__ y, Geom g) {
    extern __shared__ float smem[];
    const int tin_h = (kV2Tile - 1) * g.sh + g.R;  // input rows one tile reads
    const int tin_w = (kV2Tile - 1) * g.sw + g.S;
    float* tile = smem;                         // [tin_h][tin_w]
    float* filt = smem + tin_h * tin_w;         // [kV2K][R S]
    const int tiles_q = (g.Q + kV2Tile - 1) / kV2Tile;
    const int tiles_p = (g.P + kV2Tile - 1) / kV2Tile;
    const int n = blockIdx.x / (tiles_p * tiles_q);
    const int t = blockIdx.x % (tiles_p * tiles_q);
    const int p0 = (t / tiles_q) * kV2Tile, q0 = (t % tiles_q) * kV2Tile;
    const int k0 = blockIdx.y * kV2K;
    const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * kV2Tile + tx;
    const int nthreads = kV2Tile * kV2Tile;
    const int h0 = p0 * g.sh - g.ph, w0 = q0 * g.sw - g.pw;  // input corner of the tile
    const int rs = g.R * g.S;
    float acc[kV2K];  // this channel's R S products; fp32 adds each channel's sum into acc64
    Acc<T> acc64[kV2K];
#pragma unroll
    for (int j = 0; j < kV2K; ++j) acc[j] = 0.0f, acc64[j] = 0;
    for (int c = 0; c < g.C; ++c) {
        const T* xc = x + ((long long)n * g.C + c) * g.H * g.W;
        for (int e = tid; e < tin_h * tin_w; e += nthreads) {  // zero padding at the borders
            const int ih = h0 + e / tin_w, iw = w0 + e % tin_w;
            tile[e] = (ih >= 0 && ih < g.H && iw >= 0 && iw < g.W) ? kl::to_f(xc[ih * g.W + iw]) : 0.0f;
        }
        for (int e = tid; e < kV2K * rs; e += nthreads) {
            const int k = k0 + e / rs;
            filt[e] = k < g.K ? kl::to_f(w[((long long)k * g.C + c) * rs + e % rs]) : 0.0f;
        }
        __syncthreads();
        const float* win = tile + ty * g.sh * tin_w + tx * g.sw;
        for (int r = 0; r < g.R; ++r) {
            for (int s = 0; s < g.S; ++s) {
                const float v = win[r * tin_w + s];
#pragma unroll
                for (int j = 0; j < kV2K; ++j) acc[j] += v * filt[j * rs + r * g.S + s];
            }
        }
        if constexpr (sizeof(T) == 4) {
#pragma unroll
            for (int j = 0; j < kV2K; ++j) acc64[j] += acc[j], acc[j] = 0.0f;
        }
        __syncthreads();
    }
    if constexpr (sizeof(T) == 4) {
#pragma unroll
        for (int j = 0; j < kV2K; ++j) acc[j] = float(acc64[j]);
    }
    const int p = p0 + ty, q = q0 + tx;
    if (p >= g.P || q >= g.Q) return;
#pragma unroll
    for (int j = 0; j < kV2K; ++j) {
        const int k = k0 + j;
        if (k < g.K) {
            const float bias = b != nullptr ? kl::to_f(b[k]) : 0.0f;
            y[(((long long)n * g.K + k) * g.P + p) * g.Q + q] = kl::from_f<T>(acc[j] + bias);
        }
    }
}

// ----------------------------------------------------------------------------- v3: implicit GEMM

constexpr int kBM = 64, kBN = 64, kBK = 16, kThreads = 256;  // 16 x 16 threads, 4 x 4 each

// Each problem gives: row(m) (per-thread state of one GEMM row, computed once), col(n),
// a(row, kk) = A[m, kk], b(col, kk) = B[kk, n] (0 outside), store(m, n, acc).
template <typename T>
struct FwdProblem {  // y[(n,p,q), k] = sum_{(c,r,s)} x[n, c, p sh - ph + r, q sw - pw + s] w[k, (c,r,s)]
    const T* x; const T* w; const T* b; T* y; Geom g;
    static constexpr bool kAcc64 = sizeof(T) == 4;  // fp32: slices' sums added in fp64
    struct Row { int base, ih0, iw0; bool ok; };
    struct Col { int off; bool ok; };
    __device__ Row row(int m) const {
        const int pq = g.P * g.Q;
        const bool ok = m < g.N * pq;
        const int n = ok ? m / pq : 0, rem = ok ? m % pq : 0;
        return {n * g.C * g.H * g.W, (rem / g.Q) * g.sh - g.ph, (rem % g.Q) * g.sw - g.pw, ok};
    }
    __device__ Col col(int n) const { return {n * g.C * g.R * g.S, n < g.K}; }
    __device__ float a(const Row& r, int kk) const {
        const int rs = g.R * g.S;
        const int c = kk / rs, t = kk - c * rs, dr = t / g.S, ds = t - dr * g.S;
        const int ih = r.ih0 + dr, iw = r.iw0 + ds;
        if (!r.ok || ih < 0 || ih >= g.H || iw < 0 || iw >= g.W) return 0.0f;
        return kl::to_f(x[r.base + (c * g.H + ih) * g.W + iw]);
    }
    __device__ float bv(const Col& c, int kk) const { return c.ok ? kl::to_f(w[c.off + kk]) : 0.0f; }
    __device__ void store(int m, int n, float acc) const {
        const int pq = g.P * g.Q, nb = m / pq;
        if (b != nullptr) acc += kl::to_f(b[n]);
        y[(nb * g.K + n) * pq + m % pq] = kl::from_f<T>(acc);
    }
    __device__ void store(int m, int n, double acc) const {
        const int pq = g.P * g.Q, nb = m / pq;
        if (b != nullptr) acc += kl::to_f(b[n]);
        y[(nb * g.K + n) * pq + m % pq] = kl::from_f<T>(float(acc));
    }
};

template <typename T>
struct DgradProblem {  // dx[(n,h,w), c] = sum_{(k,r,s)} dy[n, k, (h+ph-r)/sh, (w+pw-s)/sw] w[k, c, r, s]
    const T* dy; const T* w; T* dx; Geom g;
    // fp32: 16-deep slices summed in fp64, as wgrad (one fp32 chain over K R S is several
    // times cuDNN's dx error at the MNIST and large layers)
    static constexpr bool kAcc64 = sizeof(T) == 4;
    struct Row { int base, h, w; bool ok; };
    struct Col { int off; bool ok; };
    __device__ Row row(int m) const {
        const int hw = g.H * g.W;
        const bool ok = m < g.N * hw;
        const int n = ok ? m / hw : 0, rem = ok ? m % hw : 0;
        return {n * g.K * g.P * g.Q, rem / g.W, rem % g.W, ok};
    }
    __device__ Col col(int c) const { return {c * g.R * g.S, c < g.C}; }
    __device__ float a(const Row& r, int kk) const {
        const int rs = g.R * g.S;
        const int k = kk / rs, t = kk - k * rs, dr = t / g.S, ds = t - dr * g.S;
        const int hn = r.h + g.ph - dr, wn = r.w + g.pw - ds;  // = p sh, q sw when they read (h, w)
        if (!r.ok || hn < 0 || wn < 0) return 0.0f;
        const int p = hn / g.sh, q = wn / g.sw;
        if (p * g.sh != hn || q * g.sw != wn || p >= g.P || q >= g.Q) return 0.0f;
        return kl::to_f(dy[r.base + (k * g.P + p) * g.Q + q]);
    }
    __device__ float bv(const Col& c, int kk) const {
        if (!c.ok) return 0.0f;
        const int rs = g.R * g.S, k = kk / rs;
        return kl::to_f(w[k * g.C * rs + c.off + (kk - k * rs)]);
    }
    __device__ void store(int m, int c, double acc) const {
        const int hw = g.H * g.W, nb = m / hw;
        dx[(nb * g.C + c) * hw + m % hw] = kl::from_f<T>(static_cast<float>(acc));
    }
};

template <typename T>
struct WgradProblem {  // dw[k, (c,r,s)] = sum_{(n,p,q)} dy[n, k, p, q] x[n, c, p sh - ph + r, q sw - pw + s]
    const T* dy; const T* x; double* part; Geom g;
    // fp32 storage: each 16-deep slice summed in fp32, the slices in fp64 (an fp32 sum over a
    // whole chunk of N P Q, up to thousands of products, exceeds twice cuDNN's
    // error); 16-bit: fp32 over the chunk (their bound is far looser)
    static constexpr bool kAcc64 = sizeof(T) == 4;
    struct Row { int off; bool ok; };
    struct Col { int c, r, s; bool ok; };
    __device__ Row row(int k) const { return {k * g.P * g.Q, k < g.K}; }
    __device__ Col col(int n) const {
        const int rs = g.R * g.S;
        const bool ok = n < g.C * rs;
        const int c = ok ? n / rs : 0, t = ok ? n % rs : 0;
        return {c, t / g.S, t % g.S, ok};
    }
    __device__ float a(const Row& r, int kk) const {
        if (!r.ok) return 0.0f;
        const int pq = g.P * g.Q, nb = kk / pq;
        return kl::to_f(dy[nb * g.K * pq + r.off + (kk - nb * pq)]);
    }
    __device__ float bv(const Col& c, int kk) const {
        const int pq = g.P * g.Q, nb = kk / pq, rem = kk - nb * pq;
        const int ih = (rem / g.Q) * g.sh - g.ph + c.r, iw = (rem % g.Q) * g.sw - g.pw + c.s;
        if (!c.ok || ih < 0 || ih >= g.H || iw < 0 || iw >= g.W) return 0.0f;
        return kl::to_f(x[((nb * g.C + c.c) * g.H + ih) * g.W + iw]);
    }
    __device__ void store(int m, int n, double acc) const {  // fp64 partial of split blockIdx.z
        part[((long long)blockIdx.z * g.K + m) * (g.C * g.R * g.S) + n] = acc;
    }
};

// C[M, Nn] (+)= A[M, k_begin:k_end] @ B[k_begin:k_end, Nn] for the block tile (blockIdx.x,
// blockIdx.y). Thread t loads A[m0 + t % 64, kk0 + t / 64 + 4 i] and B likewise (i < 4):
// its GEMM row and column are fixed for the whole loop, so their index math (divisions
// by P Q, Q, ...) is done once. Computes rows m0 + tx + 16 i, columns n0 + ty + 16 j:
// consecutive threads hold consecutive rows, so the forward's and dgrad's stores (rows =
// pixels) are coalesced.
template <typename Prob>
__device__ __forceinline__ void igemm(const Prob& prob, int M, int Nn, int k_begin, int k_end) {
    __shared__ float As[kBK][kBM + 4];  // (+4: the A and B stores hit distinct banks)
    __shared__ float Bs[kBK][kBN + 4];
    const int t = threadIdx.x, tx = t % 16, ty = t / 16;
    const int m0 = blockIdx.x * kBM, n0 = blockIdx.y * kBN;
    const int lm = t % kBM, lk = t / kBM;
    const typename Prob::Row row = prob.row(m0 + lm);
    const typename Prob::Col col = prob.col(n0 + lm);
    float acc[4][4];
    double acc64[4][4];  // Prob::kAcc64: the running sum of the slices' fp32 sums
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f, acc64[i][j] = 0.0;
    float ra[4], rb[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int kk = k_begin + lk + 4 * i;
        ra[i] = kk < k_end ? prob.a(row, kk) : 0.0f;
        rb[i] = kk < k_end ? prob.bv(col, kk) : 0.0f;
    }
    for (int k0 = k_begin; k0 < k_end; k0 += kBK) {
        __syncthreads();  // the previous slice's math is done with As / Bs
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            As[lk + 4 * i][lm] = ra[i];
            Bs[lk + 4 * i][lm] = rb[i];
        }
        __syncthreads();
        if (k0 + kBK < k_end) {  // next slice's loads in flight during this slice's FMAs
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int kk = k0 + kBK + lk + 4 * i;
                ra[i] = kk < k_end ? prob.a(row, kk) : 0.0f;
                rb[i] = kk < k_end ? prob.bv(col, kk) : 0.0f;
            }
        }
#pragma unroll
        for (int kk = 0; kk < kBK; ++kk) {
            float av[4], bv[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) av[i] = As[kk][tx + 16 * i];
#pragma unroll
            for (int j = 0; j < 4; ++j) bv[j] = Bs[kk][ty + 16 * j];
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
        }
        if constexpr (Prob::kAcc64) {
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc64[i][j] += acc[i][j], acc[i][j] = 0.0f;
        }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int m = m0 + tx + 16 * i;
        if (m >= M) continue;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int n = n0 + ty + 16 * j;
            if (n >= Nn) continue;
            if constexpr (Prob::kAcc64) prob.store(m, n, acc64[i][j]);
            else prob.store(m, n, acc[i][j]);
        }
    }
}

// dbias[k] = sum over n, p, q of dy[n, k, p, q]. Sums are fp64 throughout (an fp32 running
// sum of a few hundred terms goes over the check's bound).
template <typename T>
__device__ void dbias(const T* __restrict__ dy, double* __restrict__ db_part, int n_per, Geom g) {
    // Block (k, j): the fp64 sum of channel k over images [j n_per, (j + 1) n_per), written
    // to db_part[j][k]; the host sums the slices.
    const int k = blockIdx.x;
    const int pq = g.P * g.Q;
    const int n0 = blockIdx.y * n_per;
    const int n1 = min(g.N, n0 + n_per);
    double sum = 0.0;
    for (int n = n0; n < n1; ++n) {
        const T* row = dy + ((long long)n * g.K + k) * pq;
        for (int i = threadIdx.x; i < pq; i += blockDim.x) sum += (double)kl::to_f(row[i]);
    }
    __shared__ double part[32];
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_down_sync(0xffffffffu, sum, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = sum;
    __syncthreads();
    if (threadIdx.x < 32) {
        sum = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : 0.0;
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_down_sync(0xffffffffu, sum, o);
        if (threadIdx.x == 0) db_part[(long long)blockIdx.y * g.K + k] = sum;
    }
}

// ----------------------------------------------------------------------------- v4: tensor cores
//
// fp16 / bf16 forward: the same implicit GEMM, its 64 x 64 x 32 block tile multiplied by
// mma.sync.m16n8k16 (fp32 accumulators) instead of FMAs. 4 warps, each a 32 x 32 warp tile
// (2 m16 x 4 n8 MMA tiles, 2 k16 steps per slice). Operands move shared -> registers with
// ldmatrix (.trans for B, stored [k][n]); rows padded to 40 and 72 halfs (80 B and 144 B
// apart) so each ldmatrix phase touches distinct banks (as matmul.cu's v8). The gather
// (im2col addresses, zero padding) cannot use cp.async's 16-byte copies (neighbouring
// reduction indices are not neighbours in x): each thread gathers 16 + 16 scalars per
// slice into registers, issued before the current slice's MMAs.
constexpr int kTcBM = 64, kTcBN = 64, kTcBK = 32, kTcThreads = 128;
constexpr int kTcAPitch = kTcBK + 8, kTcBPitch = kTcBN + 8;

__device__ __forceinline__ unsigned short bits_of(float v, __half*) { return __half_as_ushort(__float2half_rn(v)); }
__device__ __forceinline__ unsigned short bits_of(float v, __nv_bfloat16*) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}
__device__ __forceinline__ unsigned smem_u32(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

template <bool BF16>
__device__ __forceinline__ void mma_16816(float* c, const unsigned* a, const unsigned* b) {
    if (BF16) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    } else {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
}

template <typename T, bool BF16>
__device__ void fwd_tc(const FwdProblem<T>& prob, int M, int Nn, int Kred) {
    __shared__ __align__(128) unsigned short As[kTcBM * kTcAPitch];  // [m][k]
    __shared__ __align__(128) unsigned short Bs[kTcBK * kTcBPitch];  // [k][n]
    const int t = threadIdx.x, lane = t % 32, warp = t / 32;
    const int wm = (warp / 2) * 32, wn = (warp % 2) * 32;
    const int m0 = blockIdx.x * kTcBM, n0 = blockIdx.y * kTcBN;
    const int lm = t % 64, lk = t / 64;  // this thread gathers row / column lm, k = lk + 2 i
    const typename FwdProblem<T>::Row row = prob.row(m0 + lm);
    const typename FwdProblem<T>::Col col = prob.col(n0 + lm);
    float acc[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
    float ra[16], rb[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        const int kk = lk + 2 * i;
        ra[i] = kk < Kred ? prob.a(row, kk) : 0.0f;
        rb[i] = kk < Kred ? prob.bv(col, kk) : 0.0f;
    }
    for (int k0 = 0; k0 < Kred; k0 += kTcBK) {
        __syncthreads();  // the previous slice's ldmatrix reads are done
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            As[lm * kTcAPitch + lk + 2 * i] = bits_of(ra[i], (T*)nullptr);
            Bs[(lk + 2 * i) * kTcBPitch + lm] = bits_of(rb[i], (T*)nullptr);
        }
        __syncthreads();
        if (k0 + kTcBK < Kred) {  // the next slice's gathers in flight during the MMAs
#pragma unroll
            for (int i = 0; i < 16; ++i) {
                const int kk = k0 + kTcBK + lk + 2 * i;
                ra[i] = kk < Kred ? prob.a(row, kk) : 0.0f;
                rb[i] = kk < Kred ? prob.bv(col, kk) : 0.0f;
            }
        }
#pragma unroll
        for (int kk = 0; kk < kTcBK; kk += 16) {
            unsigned af[2][4], bf[4][2];
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                // lanes 0-15: rows 0-15 at column kk; lanes 16-31: the same rows at kk + 8
                const unsigned short* p = As + (wm + i * 16 + (lane % 16)) * kTcAPitch + kk + (lane / 16) * 8;
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                             : "=r"(af[i][0]), "=r"(af[i][1]), "=r"(af[i][2]), "=r"(af[i][3])
                             : "r"(smem_u32(p)));
            }
#pragma unroll
            for (int j = 0; j < 4; j += 2) {
                // matrices: (k 0-7, n j*8), (k 8-15, n j*8), (k 0-7, n j*8+8), (k 8-15, n j*8+8)
                const unsigned short* p =
                    Bs + (kk + (lane % 8) + ((lane / 8) % 2) * 8) * kTcBPitch + wn + j * 8 + (lane / 16) * 8;
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                             : "=r"(bf[j][0]), "=r"(bf[j][1]), "=r"(bf[j + 1][0]), "=r"(bf[j + 1][1])
                             : "r"(smem_u32(p)));
            }
#pragma unroll
            for (int i = 0; i < 2; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) mma_16816<BF16>(acc[i][j], af[i], bf[j]);
        }
    }
    // Fragment of an m16n8 tile: lane holds (g, 2q), (g, 2q + 1), (g + 8, 2q), (g + 8, 2q + 1).
    const int g = lane / 4, q = lane % 4;
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int m = m0 + wm + i * 16 + g + (e / 2) * 8;
                const int n = n0 + wn + j * 8 + 2 * q + (e % 2);
                if (m < M && n < Nn) prob.store(m, n, acc[i][j][e]);
            }
}

}  // namespace

// grid: v1 ceil(N K P Q / 256) x 256 threads; v2 (N tiles_p tiles_q, ceil(K / 8)) x (16, 16)
// threads, dynamic shared ((15 sh + R)(15 sw + S) + 8 R S) floats; v3 / dgrad:
// (ceil(M / 64), ceil(Nn / 64)) x 256; wgrad (ceil(K / 64), ceil(C R S / 64), splits) x 256,
// each split reducing `chunk` (a multiple of 16) indices of N P Q; dbias (K, slices) x 256.
#define KL_CONV(NAME, T)                                                                              \
    extern "C" __global__ void conv2d_fwd_v1_##NAME(const T* x, const T* w, const T* b, T* y,          \
                                                    KL_GEOM_PARAMS) {                                   \
        fwd_v1<T>(x, w, b, y, KL_GEOM);                                                                 \
    }                                                                                                   \
    extern "C" __global__ void conv2d_fwd_v2_##NAME(const T* x, const T* w, const T* b, T* y,          \
                                                    KL_GEOM_PARAMS) {                                   \
        fwd_v2<T>(x, w, b, y, KL_GEOM);                                                                 \
    }                                                                                                   \
    extern "C" __global__ void __launch_bounds__(kThreads)                                             \
        conv2d_fwd_##NAME(const T* x, const T* w, const T* b, T* y, KL_GEOM_PARAMS) {                   \
        const Geom g = KL_GEOM;                                                                         \
        igemm(FwdProblem<T>{x, w, b, y, g}, N * P * Q, K, 0, C * R * S);                                \
    }                                                                                                   \
    extern "C" __global__ void __launch_bounds__(kThreads)                                             \
        conv2d_dgrad_##NAME(const T* dy, const T* w, T* dx, KL_GEOM_PARAMS) {                           \
        const Geom g = KL_GEOM;                                                                         \
        igemm(DgradProblem<T>{dy, w, dx, g}, N * H * W, C, 0, K * R * S);                               \
    }                                                                                                   \
    extern "C" __global__ void __launch_bounds__(kThreads)                                             \
        conv2d_wgrad_##NAME(const T* dy, const T* x, double* part, int chunk, KL_GEOM_PARAMS) {          \
        const Geom g = KL_GEOM;                                                                         \
        const int npq = N * P * Q, begin = blockIdx.z * chunk;                                          \
        const int end = begin + chunk < npq ? begin + chunk : npq;                                      \
        igemm(WgradProblem<T>{dy, x, part, g}, K, C * R * S, begin, end);                               \
    }                                                                                                   \
    extern "C" __global__ void conv2d_dbias_##NAME(const T* dy, double* db_part, int n_per,          \
                                                   KL_GEOM_PARAMS) {                                    \
        dbias<T>(dy, db_part, n_per, KL_GEOM);                                                          \
    }
KL_FOR_EACH_DTYPE(KL_CONV)

// v4 (tensor cores): 16-bit only; grid (ceil(N P Q / 64), ceil(K / 64)) x 128 threads.
#define KL_CONV_TC(NAME, T, BF16)                                                                     \
    extern "C" __global__ void __launch_bounds__(kTcThreads)                                           \
        conv2d_fwd_tc_##NAME(const T* x, const T* w, const T* b, T* y, KL_GEOM_PARAMS) {                \
        const Geom g = KL_GEOM;                                                                         \
        fwd_tc<T, BF16>(FwdProblem<T>{x, w, b, y, g}, N * P * Q, K, C * R * S);                         \
    }
KL_CONV_TC(f16, __half, false)
KL_CONV_TC(bf16, __nv_bfloat16, true)
