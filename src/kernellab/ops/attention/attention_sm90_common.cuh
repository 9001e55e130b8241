// What the Hopper attention kernels share (attention_sm90.cu's forward and
// attention_sm90_bwd.cu's backward): the tensor-map parameter, the swizzled tile layout
// (attention_sm90.cu's header describes it), wgmma descriptors, fences and waits.
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

// K-major operand: rows [row0, row0 + 64 or N) of a tile of R rows, k step kk.
template <int D, int R>
__device__ __forceinline__ unsigned long long desc_kmajor(unsigned tile, int row0, int kk) {
    using L = Layout<D>;
    const unsigned addr = tile + (kk * 16 / L::E) * (R * L::W) + (kk * 16 % L::E) * 2 + row0 * L::W;
    return make_desc(addr, 16, 8 * L::W, L::MODE);
}


// Byte offset of 16-byte chunk gc (columns 8gc..8gc+7) of row r in a swizzled tile of R rows.
template <int D, int R>
__device__ __forceinline__ unsigned tile_offset(int r, int gc) {
    using L = Layout<D>;
    const int c = gc % L::CPR;
    const int sw = ((r * L::W) >> 7) & (L::CPR - 1);
    return (gc / L::CPR) * (R * L::W) + r * L::W + ((c ^ sw) << 4);
}

}  // namespace
