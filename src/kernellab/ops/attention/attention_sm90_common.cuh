// What the Hopper attention kernels share (attention_sm90.cu's forward and
// attention_sm90_bwd.cu's backward): the tensor-map parameter, the swizzled tile layout
// (attention_sm90.cu's header describes it), wgmma descriptors, fences and waits, 16-bit
// packing, the shared-memory check and TMA tile loads.
#pragma once

// A CUtensorMap (cuda.h's, 128 bytes, 64-byte aligned): built on the host by
// cuTensorMapEncodeTiled (cuda_sm90.py) and passed by value as a __grid_constant__ kernel
// parameter, which TMA instructions address directly.
struct alignas(64) TensorMap {
    unsigned long long opaque[16];
};

namespace {

// Swizzled tile layout of a D-wide tile (attention_sm90.cu's header describes it).
template <int D>
struct Layout {
    static constexpr int W = (D % 64 == 0) ? 128 : (D % 32 == 0) ? 64 : 32;  // swizzle width, bytes
    static constexpr int CPR = W / 16;                                       // 16-byte chunks per slab row
    static constexpr int E = W / 2;                                          // elements per slab row
    static constexpr unsigned long long MODE = W == 128 ? 1 : W == 64 ? 2 : 3;
    static_assert(D % 16 == 0 && D % E == 0, "head dim must be a multiple of 16 and of the slab width");
};

__device__ __forceinline__ unsigned smem_u32(const void* p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); }

// Generic-proxy writes (cp.async, st.shared) -> visible to the async proxy (wgmma's reads).
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }

// The wgmma wait names no register: these keep the compiler from moving reads of the
// accumulators above it, or reusing the A operand's registers before it (the MMA reads them
// asynchronously).
__device__ __forceinline__ void fence_reg(float& r) { asm volatile("" : "+f"(r)::"memory"); }
__device__ __forceinline__ void fence_reg(unsigned& r) { asm volatile("" : "+r"(r)::"memory"); }

__device__ __forceinline__ unsigned long long make_desc(unsigned addr, unsigned lbo, unsigned sbo,
                                                        unsigned long long mode) {
    return static_cast<unsigned long long>((addr & 0x3FFFF) >> 4) |
           (static_cast<unsigned long long>((lbo >> 4) & 0x3FFF) << 16) |
           (static_cast<unsigned long long>((sbo >> 4) & 0x3FFF) << 32) | (mode << 62);
}

// K-major operand: rows [row0, row0 + 64 or N) of a tile of R rows, k step kk. ADD (DESC_ADD
// of V7Tiles / BwdBuild): the k step's offset is added to the descriptor of the rows' start
// (its start-address field, bits 0-13: address / 16) instead of to the address make_desc
// masks and shifts, so one descriptor per tile serves every k step.
// The same descriptors: every shared address is below 2^18 and every offset a multiple of 16.
template <int D, int R, bool ADD = false>
__device__ __forceinline__ unsigned long long desc_kmajor(unsigned tile, int row0, int kk) {
    using L = Layout<D>;
    if constexpr (ADD) {
        const unsigned step = (kk * 16 / L::E) * (R * L::W) + (kk * 16 % L::E) * 2;  // a multiple of 32
        return make_desc(tile + row0 * L::W, 16, 8 * L::W, L::MODE) + (step >> 4);
    } else {
        const unsigned addr = tile + (kk * 16 / L::E) * (R * L::W) + (kk * 16 % L::E) * 2 + row0 * L::W;
        return make_desc(addr, 16, 8 * L::W, L::MODE);
    }
}

// MN-major operand: rows [row0, row0 + 16) of a D-wide tile of R rows (the k step), all D
// columns (N; the E-wide slabs LBO apart). ADD as desc_kmajor's.
template <int D, int R, bool ADD = false>
__device__ __forceinline__ unsigned long long desc_mnmajor(unsigned tile, int row0) {
    using L = Layout<D>;
    static_assert(L::W % 16 == 0, "row offsets must be whole 16-byte units");
    if constexpr (ADD)
        return make_desc(tile, R * L::W, 8 * L::W, L::MODE) + static_cast<unsigned long long>(row0 * (L::W / 16));
    else
        return make_desc(tile + row0 * L::W, R * L::W, 8 * L::W, L::MODE);
}

// 2^x for a softmax: exp2f, or with FAST (FAST_EXP of V7Tiles / BwdBuild) ex2.approx.ftz.f32
// alone. exp2f's ex2.approx.f32 keeps results below 2^-126, for which ptxas adds a compare and
// two predicated multiplies around every MUFU; flushed to 0 such a value changes nothing a
// 16-bit P or an fp32 row sum can hold.
// 2^-inf = 0 either way.
template <bool FAST>
__device__ __forceinline__ float softmax_exp2(float x) {
    if constexpr (FAST) {
        float y;
        asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
        return y;
    } else {
        return exp2f(x);
    }
}

// Byte offset of 16-byte chunk gc (columns 8gc..8gc+7) of row r in a swizzled tile of R rows.
template <int D, int R>
__device__ __forceinline__ unsigned tile_offset(int r, int gc) {
    using L = Layout<D>;
    const int c = gc % L::CPR;
    const int sw = ((r * L::W) >> 7) & (L::CPR - 1);
    return (gc / L::CPR) * (R * L::W) + r * L::W + ((c ^ sw) << 4);
}

__device__ __forceinline__ unsigned pack2(float x, float y, bool bf16) {
    if (bf16) {
        __nv_bfloat162 v = __floats2bfloat162_rn(x, y);
        return *reinterpret_cast<unsigned*>(&v);
    }
    __half2 v = __floats2half2_rn(x, y);
    return *reinterpret_cast<unsigned*>(&v);
}

__device__ __forceinline__ void store2(__nv_bfloat16* p, float x, float y) {
    *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(x, y);
}
__device__ __forceinline__ void store2(__half* p, float x, float y) {
    *reinterpret_cast<__half2*>(p) = __floats2half2_rn(x, y);
}

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

// 1 / x and log2(x) by the MUFU alone (rcp / lg2.approx.ftz: about an ulp, and 2^-22 absolute),
// without the refinement and range checks of 1.f / x and log2f: for a softmax row sum (>= 1).
__device__ __forceinline__ float rcp_approx(float x) {
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
__device__ __forceinline__ float lg2_approx(float x) {
    float y;
    asm("lg2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// The launcher passes the dynamic shared memory each variant needs (cuda_sm90.py,
// smem_bytes); a block given less traps rather than write past it.
__device__ __forceinline__ void check_smem(unsigned need) {
    unsigned have;
    asm volatile("mov.u32 %0, %%dynamic_smem_size;\n" : "=r"(have));
    if (have < need) __trap();
}

// Box (c0, c1, c2, c3) = (column, row, head, batch) of a 4-D tensor map into shared memory
// at dst, completing `bar` (TMA, the async proxy: no fence needed before wgmma reads it).
__device__ __forceinline__ void tma_load_4d(unsigned dst, const TensorMap* map, unsigned bar, int c0, int c1, int c2,
                                            int c3) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], "
        "[%2];\n" ::"r"(dst),
        "l"(reinterpret_cast<unsigned long long>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
        : "memory");
}

// Rows [row0, row0 + R) of head (h, z) into a swizzled tile: one box of E columns x R rows
// per slab (the map's box; its swizzle is the tile's, so the layouts agree). Rows past the
// map's length arrive as zeros (and count toward the transaction bytes).
template <int D, int R>
__device__ __forceinline__ void tma_tile(unsigned dst, const TensorMap* map, unsigned bar, int row0, int h, int z) {
    using L = Layout<D>;
#pragma unroll
    for (int sl = 0; sl < D / L::E; ++sl) tma_load_4d(dst + sl * (R * L::W), map, bar, sl * L::E, row0, h, z);
}

}  // namespace
