// transpose.cu - out-of-place transpose of the last two dims, y[b, c, r] = x[b, r, c]: the
// memory-access-pattern lecture (coalescing, shared-memory tiles, bank conflicts).
//
// Variants (backends "cuda_v1" .. "cuda_v5" of op "transpose"; "cuda" runs v5):
//   v1  transpose_v1_*  naive: a 32x32 block, one element per thread. A warp reads 32
//                       consecutive elements of an input row (coalesced: one 128-byte line
//                       for fp32) and writes them down an output column, R elements apart:
//                       32 different 32-byte sectors per warp store, 4 (fp32) or 2 useful
//                       bytes in each - the L2 merges some of them, DRAM still sees partial
//                       sector writes.
//   v2  transpose_v2_*  through a 32x32 shared-memory tile: a warp reads an input row into a
//                       tile row, then reads a tile column and writes it as an output row.
//                       Both global accesses are coalesced. The column read is a 32-way bank
//                       conflict: the tile's row pitch is 32 words, every row starts in bank
//                       0, so the warp's 32 words sit in one bank (32 wavefronts instead of
//                       one; 16-way for 16-bit elements, two to a word).
//   v3  transpose_v3_*  the same tile padded by one column, [32][33]: row r starts r banks
//                       further, a column's 32 words lie in 32 banks - conflict-free (16-bit:
//                       the 66-byte pitch also spreads a column over 32 distinct words).
//   v4  transpose_v4_*  thread coarsening: a 32x8 block, each thread moves 4 elements (tile
//                       rows ty, ty+8, ty+16, ty+24): 4 independent loads in flight per
//                       thread before the barrier, a quarter of the blocks, index math
//                       shared. Any alignment; the fallback of v5.
//   v5  transpose_v5_*  16-byte global accesses both ways: tiles of 64 input rows x 256 bytes
//                       (64x64 fp32, 64x128 fp16/bf16), 256 threads, each loading 4 chunks of
//                       16 B along input rows and storing 4 chunks of 16 B along output rows
//                       (64 B in flight per thread; an H200 needs ~25 KB in flight per SM to
//                       cover ~600 ns of DRAM latency at ~4.8 TB/s; 6 resident blocks of
//                       16 KB, as the launch bounds ask, hold 96 KB). The tile is
//                       XOR-swizzled instead of padded: a padded row would not start on a
//                       16-byte boundary. Needs R and C multiples of 16 B worth of elements
//                       and 16-byte aligned input rows; the host runs v4 otherwise.
//   copy_tile_*         not a transpose: v5's grid and 16-byte accesses copying x to a
//                       same-shape y, no shared memory - the ceiling of v5's access pattern
//                       (lab/gpu_transpose.py times it beside torch's copy).
//
// Contract (every kernel): x [B, R, C] with unit column stride, row stride ldx and batch
// stride bsx (elements; 0 for expanded dims is fine); y [B, C, R] contiguous. The data are
// moved as raw bits (fp16 and bf16 share the 2-byte kernels' code). Grid: x over column
// tiles (up to 2^31 - 1), y over (batch, row tile) bands with a stride loop: grid.y holds at
// most 65535 blocks, fewer than the bands of a tall matrix (rows > 65535 * 32) or of a large
// batch. Offsets are 64-bit: B * R * C may pass 2^31.
#include "common.cuh"

namespace {

constexpr int T32 = 32;  // v1-v4 tile edge (a warp's width)

template <typename T>
__device__ __forceinline__ void transpose_v1(const T* __restrict__ x, T* __restrict__ y, long long R,
                                             long long C, long long ldx, long long bsx, long long B) {
    // block (32, 32): threadIdx.x along columns (input) = along rows (output)
    const long long tiles_r = kl::ceil_div(R, T32);
    const long long c = blockIdx.x * (long long)T32 + threadIdx.x;
    for (long long t = blockIdx.y; t < B * tiles_r; t += gridDim.y) {
        const long long b = t / tiles_r;
        const long long r = (t - b * tiles_r) * T32 + threadIdx.y;
        // read: lanes 1 element apart (coalesced); write: lanes R elements apart (strided)
        if (r < R && c < C) y[(b * C + c) * R + r] = x[b * bsx + r * ldx + c];
    }
}

// v2 (PAD 0) and v3 (PAD 1): one element per thread through a [32][32 + PAD] tile.
template <typename T, int PAD>
__device__ __forceinline__ void transpose_tiled(const T* __restrict__ x, T* __restrict__ y, long long R,
                                                long long C, long long ldx, long long bsx, long long B) {
    __shared__ T tile[T32][T32 + PAD];
    const int tx = threadIdx.x, ty = threadIdx.y;  // block (32, 32)
    const long long tiles_r = kl::ceil_div(R, T32);
    const long long c0 = blockIdx.x * (long long)T32;
    for (long long t = blockIdx.y; t < B * tiles_r; t += gridDim.y) {
        const long long b = t / tiles_r;
        const long long r0 = (t - b * tiles_r) * T32;
        if (r0 + ty < R && c0 + tx < C) tile[ty][tx] = x[b * bsx + (r0 + ty) * ldx + c0 + tx];
        __syncthreads();
        // warp ty writes output row c0 + ty (input column c0 + ty), its lanes along r0 + tx;
        // it reads tile column ty: word (tx * (32 + PAD) + ty), bank tx * PAD + ty (mod 32)
        if (c0 + ty < C && r0 + tx < R) y[(b * C + c0 + ty) * R + r0 + tx] = tile[tx][ty];
        __syncthreads();  // the next band overwrites the tile
    }
}

template <typename T>
__device__ __forceinline__ void transpose_v4(const T* __restrict__ x, T* __restrict__ y, long long R,
                                             long long C, long long ldx, long long bsx, long long B) {
    constexpr int ROWS = 8;  // block (32, 8): each thread moves T32 / ROWS = 4 elements
    __shared__ T tile[T32][T32 + 1];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const long long tiles_r = kl::ceil_div(R, T32);
    const long long c0 = blockIdx.x * (long long)T32;
    for (long long t = blockIdx.y; t < B * tiles_r; t += gridDim.y) {
        const long long b = t / tiles_r;
        const long long r0 = (t - b * tiles_r) * T32;
        // Out-of-range elements load a clamped in-range address instead of branching: a load
        // behind a branch is predicated and ptxas then schedules each shared store right
        // after its load, one load in flight at a time. The tile's extra copies are never
        // stored.
        const T* xb = x + b * bsx + min(c0 + tx, C - 1);
#pragma unroll
        for (int j = 0; j < T32; j += ROWS)  // 4 independent loads, all issued before the barrier
            tile[ty + j][tx] = xb[min(r0 + ty + j, R - 1) * ldx];
        __syncthreads();
        T* yb = y + (b * C + c0) * R + r0 + tx;
#pragma unroll
        for (int j = 0; j < T32; j += ROWS)
            if (c0 + ty + j < C && r0 + tx < R) yb[(ty + j) * R] = tile[tx][ty + j];
        __syncthreads();
    }
}

// V consecutive elements of a tile column (pitch elements apart) packed into 16 bytes, the
// first in the lowest bytes. Built from words, not through a union of T[V]: NVVM splits a
// union's 16-byte store back into element stores.
__device__ __forceinline__ uint4 gather(const unsigned int* s, int pitch) {
    return make_uint4(s[0], s[pitch], s[2 * pitch], s[3 * pitch]);
}
__device__ __forceinline__ uint4 gather(const unsigned short* s, int pitch) {
    auto w = [&](int j) { return (unsigned int)s[2 * j * pitch] | ((unsigned int)s[(2 * j + 1) * pitch] << 16); };
    return make_uint4(w(0), w(1), w(2), w(3));
}

// v5's geometry for element type T (see the list at the top).
template <typename T>
struct V5 {
    static constexpr int V = 16 / sizeof(T);  // elements per 16-byte chunk: 4 fp32, 8 fp16/bf16
    static constexpr int TR = 64;             // tile rows: one output row segment of 64 elements
    static constexpr int QC = 16;             // chunks per tile row: 256 B of an input row
    static constexpr int TC = QC * V;         // tile columns: 64 fp32, 128 fp16/bf16
    static constexpr int QR = TR / V;         // chunks per output row segment: 16 fp32, 8 fp16
    static constexpr int THREADS = 256;
    static constexpr int K = TR * QC / THREADS;  // chunks per thread each way: 4
    static_assert(QR % 8 == 0 && K * THREADS == TR * QC && (QR / 8) * (TC / 4) == 8 * K, "v5 tile");
};

// Tile row r keeps its chunk q at physical chunk q ^ swz(r), swz(r) = (r / V) % 8.
//  - Stores of a tile row (load phase): a quarter warp (the unit of a 16-byte shared access)
//    writes 8 chunks q0..q0+7 of one row; XOR with a value < 8 permutes them within the same
//    aligned group of 8, which covers the 32 banks: conflict-free.
//  - Reads of a tile column (store phase): lane (u & 7, o & 3) reads column o of rows u*V + e;
//    swz(u*V + e) = u % 8, so the 8 values of u & 7 land in 8 different chunk slots (32
//    banks over 4 words each), and the 4 values of o & 3 in different words (fp32) or two
//    to a shared word (16-bit): one wavefront per read.
template <typename T>
__device__ __forceinline__ void transpose_v5(const T* __restrict__ x, T* __restrict__ y, long long R,
                                             long long C, long long ldx, long long bsx, long long B) {
    using G = V5<T>;
    constexpr int V = G::V, TR = G::TR, QC = G::QC, TC = G::TC, QR = G::QR, K = G::K;
    __shared__ uint4 tile[TR * QC];  // 16 KB
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const long long tiles_r = kl::ceil_div(R, TR);
    const long long c0 = blockIdx.x * (long long)TC;
    for (long long t = blockIdx.y; t < B * tiles_r; t += gridDim.y) {
        const long long b = t / tiles_r;
        const long long r0 = (t - b * tiles_r) * TR;
        // chunk q of rows rr, rr + 16, rr + 32, rr + 48: a warp reads 2 rows x 256 B per k
        const int q = tid % QC, rr = tid / QC;
        const T* xb = x + b * bsx + min(c0 + q * V, C - V);  // clamped as in v4 (C % V == 0)
        uint4 v[K];
#pragma unroll
        for (int k = 0; k < K; ++k)
            v[k] = *reinterpret_cast<const uint4*>(xb + min(r0 + rr + k * (TR / K), R - 1) * ldx);
#pragma unroll
        for (int k = 0; k < K; ++k) {
            const int r = rr + k * (TR / K);
            tile[r * QC + (q ^ ((r / V) & 7))] = v[k];
        }
        __syncthreads();
        const T* s = reinterpret_cast<const T*>(tile);
#pragma unroll
        for (int k = 0; k < K; ++k) {
            // a warp writes 4 output rows x 8 chunks (4 x 128 contiguous bytes)
            const int combo = warp + 8 * k;
            const int u = (combo % (QR / 8)) * 8 + (lane & 7);  // output chunk: input rows u*V ..
            const int o = (combo / (QR / 8)) * 4 + (lane >> 3);  // output row = input column o
            if (c0 + o < C && r0 + u * V < R) {  // R % V == 0: a chunk is all in or all out
                const T* col = s + (u * V) * TC + ((o / V) ^ (u & 7)) * V + o % V;
                // indexed as uint4 (R % V == 0, r0 % V == 0): NVVM splits a 16-byte store
                // through a T* cast back into four 4-byte ones
                reinterpret_cast<uint4*>(y)[(b * C + c0 + o) * (R / V) + r0 / V + u] = gather(col, TC);
            }
        }
        __syncthreads();
    }
}

// v5's access pattern without the transpose: the copy it is measured against.
template <typename T>
__device__ __forceinline__ void copy_tile(const T* __restrict__ x, T* __restrict__ y, long long R, long long C,
                                          long long ldx, long long bsx, long long B) {
    using G = V5<T>;
    constexpr int V = G::V, TR = G::TR, QC = G::QC, K = G::K;
    const int tid = threadIdx.x;
    const long long tiles_r = kl::ceil_div(R, TR);
    const long long c0 = blockIdx.x * (long long)G::TC;
    for (long long t = blockIdx.y; t < B * tiles_r; t += gridDim.y) {
        const long long b = t / tiles_r;
        const long long r0 = (t - b * tiles_r) * TR;
        uint4 v[K];
#pragma unroll
        for (int k = 0; k < K; ++k) {
            const int i = tid + G::THREADS * k, r = i / QC, q = i % QC;
            v[k] = *reinterpret_cast<const uint4*>(x + b * bsx + min(r0 + r, R - 1) * ldx +
                                                   min(c0 + q * V, C - V));
        }
#pragma unroll
        for (int k = 0; k < K; ++k) {
            const int i = tid + G::THREADS * k, r = i / QC, q = i % QC;
            if (r0 + r < R && c0 + q * V < C)
                *reinterpret_cast<uint4*>(y + (b * R + r0 + r) * C + c0 + q * V) = v[k];
        }
    }
}

}  // namespace

// Launch bounds: (256, 8) lets v4 keep its 4 loads in flight within 32 registers (full
// occupancy); v5 needs 16 registers for its 4 chunks alone, and at ptxas's default (~32-40
// registers) it issues the first load's shared store before the other loads - two trips to
// DRAM per tile. (256, 6) allows 40: all 4 loads issue first; 6 blocks x 16 KB of tile fit.
// Raw storage: a transpose moves bits, so fp16 and bf16 run the same 2-byte code under
// their own names (the host and `kernellab asm --dtype` find kernels by dtype suffix).
#define KL_TRANSPOSE(S, T)                                                                                        \
    extern "C" __global__ void __launch_bounds__(1024)                                                            \
        transpose_v1_##S(const T* x, T* y, long long R, long long C, long long ldx, long long bsx, long long B) { \
        transpose_v1<T>(x, y, R, C, ldx, bsx, B);                                                                 \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(1024)                                                            \
        transpose_v2_##S(const T* x, T* y, long long R, long long C, long long ldx, long long bsx, long long B) { \
        transpose_tiled<T, 0>(x, y, R, C, ldx, bsx, B);                                                           \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(1024)                                                            \
        transpose_v3_##S(const T* x, T* y, long long R, long long C, long long ldx, long long bsx, long long B) { \
        transpose_tiled<T, 1>(x, y, R, C, ldx, bsx, B);                                                           \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(256, 8)                                                          \
        transpose_v4_##S(const T* x, T* y, long long R, long long C, long long ldx, long long bsx, long long B) { \
        transpose_v4<T>(x, y, R, C, ldx, bsx, B);                                                                 \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(256, 6)                                                          \
        transpose_v5_##S(const T* x, T* y, long long R, long long C, long long ldx, long long bsx, long long B) { \
        transpose_v5<T>(x, y, R, C, ldx, bsx, B);                                                                 \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(256, 6)                                                          \
        copy_tile_##S(const T* x, T* y, long long R, long long C, long long ldx, long long bsx, long long B) {    \
        copy_tile<T>(x, y, R, C, ldx, bsx, B);                                                                    \
    }

KL_TRANSPOSE(f32, unsigned int)
KL_TRANSPOSE(f16, unsigned short)
KL_TRANSPOSE(bf16, unsigned short)
