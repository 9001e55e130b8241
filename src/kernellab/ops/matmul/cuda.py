"""Matmul in CUDA C++ (matmul.cu, compiled by NVRTC): launchers, custom ops, registrations.

Backends ``cuda_v1`` ... ``cuda_v7`` (fp32 ladder, see the list at the top of matmul.cu),
``cuda_v8`` and ``cuda_v9`` (tensor cores, fp16/bf16), ``cuda_v10`` ... ``cuda_v15``
(Hopper wgmma, fp16/bf16, matmul_sm90.cu, sm_90 GPUs only; v11 warp-specialized and persistent,
its operands copied by TMA from tensor maps built here; v12 the same with CUTLASS's ping-pong
consumers, one 128x128 tile per warpgroup, epilogues overlapping the other's MMAs; v13 v11
with C staged in shared memory and written by TMA stores through a third tensor map; v14 v13
reading either major order of each operand, with a 128x192 tile, and K slices in clusters for
small grids; v15 v14 in clusters of two blocks sharing the B tile by TMA multicast) and ``cuda`` (the best
per dtype: v7 for fp32; for fp16/bf16 v15 on sm_90, v9 elsewhere). v1-v13 take contiguous
row-major operands: strided inputs (transposed, sliced, expanded) are packed with
``.contiguous()`` first, which costs a copy but computes correctly; the backward calls the
same kernels on transposed (hence packed) views. v14 and v15 read row- or column-major windows as
they lie (a weight [N, K] as B, the backward's transposed views) and packs only the rest.
v1-v7 on grids smaller than the GPU split K into 4-16 slices (SPLIT_K_MIN below: accuracy
against cuBLAS, and idle SMs get work).

The epilogue (bias, activation) runs as PyTorch ops after the kernel: the ladder is about the
product; Triton's kernel is the one with a fused epilogue.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import torch

from kernellab.cuda.runtime import DTYPE_SUFFIX as _SUFFIX
from kernellab.cuda.runtime import (
    Module,
    nvrtc_unavailable,  # noqa: F401 (the tests ask this module)
    sm90_unavailable,
    tensor_map,
)
from kernellab.device import is_sm90
from kernellab.ops._register import register_builtin
from kernellab.ops.matmul._autograd import matmul_op
from kernellab.ops.matmul.epilogue import apply_epilogue

MODULE = Module(Path(__file__).with_name("matmul.cu"))
MODULE.asm_aliases = {"cuda": ("cuda_v7", "cuda_v9")}  # `kernellab asm matmul --backend cuda`
# wgmma is an arch-specific (sm_90a) instruction: this module compiles only for sm_90a, also
# in the CPU check ("compiled, not run"), and runs only on sm_90 GPUs (H100, H200).
MODULE_SM90 = Module(Path(__file__).with_name("matmul_sm90.cu"), archs=("sm_90a",))
# `kernellab asm matmul --backend cuda` on sm_90: fp32 v7, fp16/bf16 v15 (as _best_fwd)
MODULE.asm_parts = {
    "cuda": lambda arch: (
        [(MODULE, ("cuda_v7",)), (MODULE_SM90, ("cuda_v15",))]
        if arch.startswith("sm_90")
        else [(MODULE, ("cuda_v7", "cuda_v9"))]
    )
}
_FP32 = (torch.float32,)
_HALF = (torch.float16, torch.bfloat16)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# variant -> (grid(M, N, batch), block, has the `vec` argument, dtypes)
def _grid32_rows(m, n, bt):
    return (_cdiv(m, 32), _cdiv(n, 32), bt)


def _grid32_cols(m, n, bt):
    return (_cdiv(n, 32), _cdiv(m, 32), bt)


def _tiles(bm, bn):
    return lambda m, n, bt: (_cdiv(n, bn), _cdiv(m, bm), bt)


VARIANTS = {
    "v1": (_grid32_rows, (32, 32, 1), False, _FP32, "CUDA v1: naive, one thread per output (uncoalesced)"),
    "v2": (_grid32_cols, (32, 32, 1), False, _FP32, "CUDA v2: coalesced global access"),
    "v3": (_tiles(32, 32), (32, 32, 1), False, _FP32, "CUDA v3: 32x32 shared-memory tiles"),
    "v4": (_tiles(64, 64), 512, False, _FP32, "CUDA v4: 1-D block tiling, 8 outputs per thread"),
    "v5": (_tiles(128, 128), 256, False, _FP32, "CUDA v5: 2-D block tiling, 8x8 outputs per thread"),
    "v6": (_tiles(128, 128), 256, True, _FP32, "CUDA v6: float4 loads, transposed A tile"),
    "v7": (_tiles(128, 256), 256, True, _FP32, "CUDA v7: warp tiling, 128 outputs per thread, BK=8"),
    "v8": (
        _tiles(128, 128),
        256,
        True,
        _HALF,
        "CUDA v8: tensor cores (mma.sync m16n8k16, ldmatrix, cp.async)",
    ),
    "v9": (_tiles(128, 256), 256, True, _HALF, "CUDA v9: v8 with 128x256 tiles and a 3-stage pipeline"),
    "v10": (
        _tiles(128, 256),
        256,
        False,
        _HALF,
        "CUDA v10: Hopper wgmma (m64n256k16 from 128B-swizzled smem, cp.async, 4 stages; sm_90 only)",
    ),
    "v11": (
        _tiles(128, 256),  # (the launcher's persistent grid is v11_grid's, not this)
        384,
        False,
        _HALF,
        "CUDA v11: Hopper wgmma, warp-specialized (TMA producer, mbarrier ring), persistent; sm_90 only",
    ),
    "v12": (
        _tiles(128, 128),  # (the launcher's persistent grid is v12's, not this)
        384,
        False,
        _HALF,
        "CUDA v12: v11 with ping-pong consumers (a 128x128 tile per warpgroup, turns at the tensor "
        "cores, epilogue under the other's MMAs); sm_90 only",
    ),
    "v13": (
        _tiles(128, 256),  # (the launcher's persistent grid is v11's, not this)
        384,
        False,
        _HALF,
        "CUDA v13: v11 with the epilogue through shared memory and TMA stores (drain under the next "
        "tile's MMAs); sm_90 only",
    ),
    "v14": (
        _tiles(128, 256),  # (the launcher's persistent grid and tile width are v14's, not this)
        384,
        False,
        _HALF,
        "CUDA v14: v13 reading the operands as they lie (either major order, no packing copies) with "
        "128x192 tiles beside 128x256 and 128x128 for wave fit, and small grids' tiles in clusters of "
        "2-8 blocks taking slices of K; sm_90 only",
    ),
    "v15": (
        _tiles(128, 256),  # (the launcher's clusters, grid and tile width are v15's, not this)
        384,
        False,
        _HALF,
        "CUDA v15: v14 in clusters of two blocks that share the B tile (TMA multicast: a third less "
        "operand traffic through L2); sm_90 only",
    ),
}
# Dynamic shared memory per block (bytes) of the variants that use it: v9 keeps 3 stages of
# a 128x40 A tile and a 32x264 B tile (padded halfs); v10 4 stages of a 128x64 A tile and a
# 64x256 B tile, plus 1 KB to align the base to 1024 bytes (128-byte swizzle atoms); v11 the
# same stages, and 6 stages of 128x64 + 64x128 in its 128x128 form (V11Tile in the .cu); v12
# the 128x128 form's stages (its warpgroups' tiles are 128x128); v13 v11's stages (both
# forms) and a 32 KB C staging buffer after them (64 rows x 128 columns per consumer
# warpgroup; V13Smem in the .cu).
DYN_SHARED = {
    "v9": 3 * (128 * 40 + 32 * 264) * 2,
    "v10": 4 * (128 * 64 + 64 * 256) * 2 + 1024,
    "v11": 4 * (128 * 64 + 64 * 256) * 2 + 1024,
    "v11_n128": 6 * (128 * 64 + 64 * 128) * 2 + 1024,
    "v12": 6 * (128 * 64 + 64 * 128) * 2 + 1024,
    "v13": 4 * (128 * 64 + 64 * 256) * 2 + 1024 + 2 * 64 * 128 * 2,
    "v13_n128": 6 * (128 * 64 + 64 * 128) * 2 + 1024 + 2 * 64 * 128 * 2,
    "v14_n256": 4 * (128 * 64 + 64 * 256) * 2 + 1024 + 2 * 64 * 128 * 2,
    "v14_n192": 4 * (128 * 64 + 64 * 192) * 2 + 1024 + 2 * 64 * 128 * 2,
    "v14_n128": 6 * (128 * 64 + 64 * 128) * 2 + 1024 + 2 * 64 * 128 * 2,
}
DYN_SHARED.update({f"v15_n{bn}": DYN_SHARED[f"v14_n{bn}"] for bn in (192, 256)})  # v14's rings and C buffer
DYN_SHARED["v14_ks"] = 6 * (128 * 64 + 64 * 128) * 2 + 1024  # the 128x128 ring; the slices' sum reuses it
# The module of each variant that is not in matmul.cu.
MODULES = {v: MODULE_SM90 for v in ("v10", "v11", "v12", "v13", "v14", "v15")}
# The best variant per dtype (v9 is faster than v8 in bf16; v13 where the GPU has wgmma,
# see _best_fwd: the fastest of v10-v13 at the shapes of lab/gpu_mm_v11.py, NOTES).
BEST = {torch.float32: "v7", torch.float16: "v9", torch.bfloat16: "v9"}


def _aligned16(*ts) -> bool:
    return all(t.data_ptr() % 16 == 0 for t in ts)


# Split-K for the fp32 ladder on small grids. When the output tiles do not fill the GPU
# (fewer blocks than SMs), the launcher cuts K into s contiguous slices (s = 4, doubled while
# the blocks still fit on the SMs, at most 16), runs the unchanged kernel on each slice as
# extra batch entries (the otherwise idle SMs get work, as cuBLAS does for such shapes), and
# adds the partial products pairwise, (p0 + p1) + (p2 + p3) ..., in a fixed order
# (deterministic). Each output then sums s chains of K/s FMAs instead of one of K (v1-v4 keep
# four partial sums inside each slice as well, see KL_SPLIT_NOTE in matmul.cu). The reason is
# accuracy: cuBLAS splits small problems too, and the 2x-cuBLAS rule follows it. A single
# chain misses the rule at 17x33x65 and four slices still miss it at 64x64x997 on some
# seeds, so small grids take up to 16 (chains of ~62 at K=997). A CPU model of the orders
# puts the error of s chunks at roughly 1/sqrt(s) of one chain's. Big problems (4096^3) are
# unchanged.
SPLIT_K_MIN, SPLIT_K_MAX = 4, 16
SPLIT_K_VARIANTS = ("v1", "v2", "v3", "v4", "v5", "v6", "v7")


@functools.cache
def _sm_count(dev: int) -> int:
    return torch.cuda.get_device_properties(dev).multi_processor_count


def split_k_slices(variant: str, m: int, n: int, k: int, bt: int, sms: int) -> int:
    """How many K slices the launcher uses (1: none); see SPLIT_K_MIN above."""
    if variant not in SPLIT_K_VARIANTS:
        return 1
    blocks = math.prod(VARIANTS[variant][0](m, n, bt))
    if blocks >= sms:
        return 1
    s = SPLIT_K_MIN
    while s < SPLIT_K_MAX and blocks * s < sms:
        s *= 2
    while s > 1 and (k < 2 * s or bt * s > 65535):  # slices of at least 2; the grid's z limit
        s //= 2
    return s


def _device_index(t: torch.Tensor) -> int:
    return t.device.index if t.device.index is not None else torch.cuda.current_device()


def _launch(variant: str, a3: torch.Tensor, b3: torch.Tensor, dev: int) -> torch.Tensor:
    """One kernel launch: contiguous a3 [bt, M, K] @ b3 [bt, K, N] -> fresh [bt, M, N]."""
    launch = _LAUNCHERS.get(variant)
    return launch(a3, b3, dev) if launch is not None else _launch_kernel(variant, a3, b3, dev)


def _whole_chunks(a3: torch.Tensor, b3: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """a3, b3 with K and N zero-padded up to multiples of 8 halfs (rows of whole 16-byte
    chunks; the extra products are exact zeros) and 16-byte aligned bases (a misaligned
    view, one with a storage offset, is copied to a fresh, aligned tensor)."""
    k, n = a3.shape[-1], b3.shape[-1]
    kp, np8 = _cdiv(k, 8) * 8, _cdiv(n, 8) * 8
    if kp != k:
        a3 = torch.nn.functional.pad(a3, (0, kp - k))
    if kp != k or np8 != n:
        b3 = torch.nn.functional.pad(b3, (0, np8 - n, 0, kp - k))
    a3 = a3 if _aligned16(a3) else a3.clone()
    b3 = b3 if _aligned16(b3) else b3.clone()
    return a3, b3


def _launch_v10(a3: torch.Tensor, b3: torch.Tensor, dev: int) -> torch.Tensor:
    """v10 copies whole 16-byte chunks (cp.async): its contract needs K and N multiples of 8
    halfs and 16-byte aligned operands (_whole_chunks pads or copies; the output's extra
    columns are sliced off). Partial tiles (M, N, K not multiples of 128, 256, 64) are
    handled in the kernel."""
    n = b3.shape[-1]
    a3, b3 = _whole_chunks(a3, b3)
    c = _launch_kernel("v10", a3, b3, dev)
    return c if b3.shape[-1] == n else c[..., :n].contiguous()


# v11's kernels take two tensor maps (A, B), C, M, N, K and the batch.
V11_SIGNATURE = ("tmap", "tmap", "ptr", "i32", "i32", "i32", "i32")
V11_THREADS = 384  # a producer warpgroup and two consumer warpgroups
V11_BM, V11_BK = 128, 64


def v11_block_n(m: int, n: int, bt: int, sms: int) -> int:
    """v11's tile width: 256 (128x256 tiles, 128 x 256 x 64 MMAs per 48 KB k-tile), or 128
    where that finishes in fewer tile-times. Estimated time = waves x tile cost: a 128x128
    tile costs half a 128x256 one, plus 10% (half the MMAs per byte copied, more epilogues).
    128 x 14336 on 132 SMs: 56 wide tiles (one wave, 2.0) or 112 narrow ones (one wave,
    1.1): 128. 4096^2: 4 waves x 2 = 8 against 8 x 1.1: 256."""
    tiles_m = _cdiv(m, V11_BM)
    wide = _cdiv(bt * tiles_m * _cdiv(n, 256), sms) * 2.0
    narrow = _cdiv(bt * tiles_m * _cdiv(n, 128), sms) * 1.1
    return 128 if narrow < wide else 256


def v11_tensor_maps(a3: torch.Tensor, b3: torch.Tensor) -> tuple:
    """The TMA maps of contiguous a3 [bt, M, K] and b3 [bt, K, N] (K, N multiples of 8, 16-byte
    aligned): dims innermost first, byte strides of the outer dims, boxes of 64 elements (128
    bytes, the widest a 128-byte swizzle takes) x 128 rows of A (the whole A tile) and x 64
    k-rows of B (one 64-column slab of the B tile), swizzled 128 bytes as the tiles are."""
    bt, m, k = a3.shape
    n = b3.shape[-1]
    ta = tensor_map(a3.data_ptr(), 2, (k, m, bt), (2 * k, 2 * m * k), (V11_BK, V11_BM, 1), 128)
    tb = tensor_map(b3.data_ptr(), 2, (n, k, bt), (2 * n, 2 * k * n), (64, V11_BK, 1), 128)
    return ta, tb


def _launch_v11(a3: torch.Tensor, b3: torch.Tensor, dev: int, block_n: int | None = None) -> torch.Tensor:
    """v11: a persistent grid of min(SMs, tiles) blocks of 384 threads; TMA needs row strides
    of whole 16-byte units and aligned bases (_whole_chunks pads or copies, as for v10), and
    dims of at least one element (K = 0 is answered with zeros, no launch). Edge tiles in M,
    N, K and the batch are zero-filled by TMA. ``block_n`` forces the tile width (tests)."""
    return _launch_persistent("v11", a3, b3, dev, block_n)


# v12's kernels take v11's arguments (the same tensor maps: its k-tiles are v11's 128x128 ones).
V12_SIGNATURE = V11_SIGNATURE
V12_BM, V12_BN = 128, 128  # one output tile per consumer warpgroup at a time


def _launch_v12(a3: torch.Tensor, b3: torch.Tensor, dev: int) -> torch.Tensor:
    """v12: as _launch_v11 (padding, tensor maps, K = 0, persistent grid of min(SMs, tiles)
    blocks of 384 threads) with one tile width, 128x128: each block's tiles alternate between
    its two consumer warpgroups."""
    return _launch_persistent("v12", a3, b3, dev, V12_BN)


# v13's kernels take three tensor maps (A, B as v11's; C, see v13_c_map), M, N, K and the batch.
V13_SIGNATURE = ("tmap", "tmap", "tmap", "i32", "i32", "i32", "i32")


def v13_c_map(c: torch.Tensor):
    """The TMA map of v13's output c [bt, M, N] (N the padded width, a multiple of 8): dims
    innermost first, byte strides, boxes of 64 columns x 64 rows (a consumer warpgroup's rows
    of one box), 128-byte swizzle (the staging buffer's layout). TMA stores clip at the dims:
    rows past M and columns past N are not written."""
    bt, m, n = c.shape
    return tensor_map(c.data_ptr(), 2, (n, m, bt), (2 * n, 2 * m * n), (64, 64, 1), 128)


def _launch_v13(a3: torch.Tensor, b3: torch.Tensor, dev: int, block_n: int | None = None) -> torch.Tensor:
    """v13: as _launch_v11 (padding, A and B maps, K = 0, the tile width v11_block_n picks,
    persistent grid), the output written through a C tensor map instead of a pointer."""
    return _launch_persistent("v13", a3, b3, dev, block_n)


def _launch_persistent(variant: str, a3: torch.Tensor, b3: torch.Tensor, dev: int, block_n) -> torch.Tensor:
    """The launch v11-v13 share: pad or copy to whole 16-byte rows, v11's tensor maps,
    min(SMs, tiles) blocks of 384 threads; v11 and v13 pick their tile width (block_n None);
    v13 takes C as a third tensor map instead of a pointer."""
    bt, m, k = a3.shape
    n = b3.shape[-1]
    if k == 0:
        return torch.zeros((bt, m, n), dtype=a3.dtype, device=a3.device)
    a3, b3 = _whole_chunks(a3, b3)
    kp, np8 = a3.shape[-1], b3.shape[-1]
    sms = _sm_count(dev)
    bn = block_n or v11_block_n(m, np8, bt, sms)
    tiles = bt * _cdiv(m, V11_BM) * _cdiv(np8, bn)
    if tiles >= 2**31:
        raise ValueError(f"matmul: cuda_{variant} counts output tiles in 32 bits; {tiles} is too many")
    c = torch.empty((bt, m, np8), dtype=a3.dtype, device=a3.device)
    ta, tb = v11_tensor_maps(a3, b3)
    form = variant + ("_n128" if variant in ("v11", "v13") and bn == 128 else "")
    tma_c = variant == "v13"
    kern = MODULE_SM90.kernel(
        f"matmul_{form}_{_SUFFIX[a3.dtype]}", V13_SIGNATURE if tma_c else V11_SIGNATURE, dev
    )
    shared = DYN_SHARED[form]
    kern.set_max_dynamic_shared(shared)  # (a no-op once allowed)
    out = v13_c_map(c) if tma_c else c
    kern(min(sms, tiles), V11_THREADS, ta, tb, out, m, np8, kp, bt, shared=shared, device_index=dev)
    return c if np8 == n else c[..., :n].contiguous()


# v14 (matmul_sm90.cu): v13's kernels reading either major order of each operand, and a
# 128x192 tile. Per-tile cost of each width relative to one 128x128 tile's MMAs: a tile's
# MMAs scale with its width, plus a share for operand traffic per MAC (32, 39 and 43 MACs per
# byte copied at 128, 192 and 256 wide) and the epilogue.
V14_TILE_COST = {256: 2.0, 192: 1.56, 128: 1.1}
_AS_THEY_LIE = ("v14", "v15")  # the variants _product hands strided windows unpacked


def v14_block_n(m: int, n: int, bt: int, sms: int) -> int:
    """v14's tile width: the fewest waves x tile cost over 256, 192 and 128 (ties to the
    wider). 3000^2: 288 wide tiles (3 waves, 6.0), 384 of 192 (3 waves, 4.7), 576 of 128
    (5 waves, 5.5): 192. 4096^2: 4 waves x 2.0 against 6 x 1.56 and 8 x 1.1: 256."""
    tiles_m = _cdiv(m, V11_BM)

    def cost(bn: int) -> float:
        return _cdiv(bt * tiles_m * _cdiv(n, bn), sms) * V14_TILE_COST[bn]

    return min((256, 192, 128), key=cost)


def v14_window(t: torch.Tensor) -> tuple[str, int, int] | None:
    """How TMA reads a 16-bit [bt, rows, cols] window as it lies: ("r", pitch, batch stride)
    when its rows are unit-stride, ("c", ...) when its columns are (the transpose of a
    row-major tensor), strides in elements; None when neither works without a copy (a pitch
    or batch stride that is not a whole number of 16-byte units or that overlaps, a base not
    16-byte aligned). A pitch only one row or column uses is free: the map gets a valid one."""
    bt, rows, cols = t.shape
    if t.data_ptr() % 16:
        return None
    for major, inner, outer, s_in, s_out in (
        ("r", cols, rows, t.stride(2), t.stride(1)),
        ("c", rows, cols, t.stride(1), t.stride(2)),
    ):
        if s_in != 1 and inner > 1:
            continue
        pitch = s_out if outer > 1 else _cdiv(inner, 8) * 8
        if pitch % 8 or pitch < inner:
            continue
        batch_stride = t.stride(0) if bt > 1 else pitch * outer
        if batch_stride % 8 or batch_stride < pitch * outer:
            continue
        return major, pitch, batch_stride
    return None


def _v14_operand(t: torch.Tensor) -> tuple[torch.Tensor, tuple[str, int, int]]:
    """t and its window (v14_window); a window TMA cannot read is packed row-major with its
    rows padded to whole 16-byte units (the padding is never read: the maps keep the real
    widths, and TMA fills past them with zeros)."""
    w = v14_window(t)
    if w is not None:
        return t, w
    bt, rows, cols = t.shape
    pitch = _cdiv(cols, 8) * 8
    packed = torch.empty((bt, rows, pitch), dtype=t.dtype, device=t.device)
    packed[..., :cols].copy_(t)
    return packed[..., :cols], ("r", pitch, rows * pitch)


def v14_tensor_maps(
    a3: torch.Tensor, wa: tuple, b3: torch.Tensor, wb: tuple, bn: int, b_half: bool = False
) -> tuple:
    """The A and B maps of v14's kernels, dims innermost first, byte strides, 128-byte
    swizzle: A row-major ("mk") as v11's (box 64 k x 128 m) or column-major ("km": box 64 m
    x 64 k, one slab per consumer warpgroup); B row-major ("kn") as v11's (box 64 n x 64 k)
    or column-major ("nk": box 64 k x bn n, the whole B tile). ``b_half`` (v15): B's box is
    the half a block of a cluster copies, 64 n x 32 k ("kn") or 64 k x bn / 2 n ("nk")."""
    bt, m, k = a3.shape
    n = b3.shape[-1]
    (ma, pa, sa), (mb, pb, sb) = wa, wb
    if ma == "r":
        ta = tensor_map(a3.data_ptr(), 2, (k, m, bt), (2 * pa, 2 * sa), (V11_BK, V11_BM, 1), 128)
    else:
        ta = tensor_map(a3.data_ptr(), 2, (m, k, bt), (2 * pa, 2 * sa), (64, V11_BK, 1), 128)
    if mb == "r":
        tb = tensor_map(b3.data_ptr(), 2, (n, k, bt), (2 * pb, 2 * sb), (64, V11_BK // (1 + b_half), 1), 128)
    else:
        tb = tensor_map(b3.data_ptr(), 2, (k, n, bt), (2 * pb, 2 * sb), (V11_BK, bn // (1 + b_half), 1), 128)
    return ta, tb


def v14_kernel_name(
    wa: tuple, wb: tuple, bn: int, dtype: torch.dtype, variant: str = "v14", ks: bool = False
) -> str:
    """The kernel for the operands' windows: ``variant``'s of width ``bn``, or (``ks``) v14's
    K-slice kernel (always 128 wide)."""
    a_order = "mk" if wa[0] == "r" else "km"
    b_order = "kn" if wb[0] == "r" else "nk"
    if ks:
        return f"matmul_v14_ks_{a_order}_{b_order}_{_SUFFIX[dtype]}"
    return f"matmul_{variant}_n{bn}_{a_order}_{b_order}_{_SUFFIX[dtype]}"


# v14's K slices in a cluster (matmul_sm90.cu, v14_ks_body): each 128x128 tile in a cluster of
# s blocks, block j taking the j-th s-th of K; the blocks sum their fp32 partials through
# distributed shared memory, in slice order, and write C: no workspace, no second kernel.
V14_KS_SIGNATURE = ("tmap", "tmap", "ptr", "i32", "i32", "i32")
V14_KS_MAX = 8  # the largest portable cluster
V14_KS_MIN_KTILES = 8  # a slice keeps >= 8 k-tiles (512 of K): shorter ones are mostly fill and the sum


@functools.cache
def _ks_blocks(name: str, s: int, dev: int) -> int:
    """How many blocks of v14's K-slice kernel ``name`` run at once on device ``dev`` in
    clusters of ``s`` (whole clusters sit in one GPC)."""
    kern = MODULE_SM90.kernel(name, V14_KS_SIGNATURE, dev)
    kern.set_max_dynamic_shared(DYN_SHARED["v14_ks"])  # (the occupancy counts no more than is allowed)
    return s * kern.max_active_clusters(V11_THREADS, s, DYN_SHARED["v14_ks"])


def v14_slices(m: int, n: int, k: int, bt: int, sms: int, blocks) -> int:
    """K slices (cluster size) for one product whose 128x128 tiles fill at most half the
    SMs: the most s <= 8 whose tiles x s blocks run at once (``blocks(s)``: co-resident
    blocks in clusters of s) and leave each slice >= 8 k-tiles; 1 (no split) otherwise.
    768 x 768 over K = 8192 on an H200: 36 tiles, s = 3 (108 blocks; 4 would be 144)."""
    tiles = _cdiv(m, V11_BM) * _cdiv(n, 128)
    if bt != 1 or 2 * tiles > sms:
        return 1
    best = 1
    for s in range(2, V14_KS_MAX + 1):
        if _cdiv(k, V11_BK) // s >= V14_KS_MIN_KTILES and tiles * s <= blocks(s):
            best = s
    return best


def _launch_v14_ks(a3, wa, b3, wb, s: int, np8: int, dev: int) -> torch.Tensor:
    """One product in s K slices, each 128x128 tile in a cluster of s blocks (v14_slices)."""
    m, k, n = a3.shape[-2], a3.shape[-1], b3.shape[-1]
    c = torch.empty((m, np8), dtype=a3.dtype, device=a3.device)
    ta, tb = v14_tensor_maps(a3, wa, b3, wb, 128)
    kern = MODULE_SM90.kernel(v14_kernel_name(wa, wb, 128, a3.dtype, ks=True), V14_KS_SIGNATURE, dev)
    shared = DYN_SHARED["v14_ks"]
    kern.set_max_dynamic_shared(shared)  # (a no-op once allowed)
    tiles = _cdiv(m, V11_BM) * _cdiv(np8, 128)
    kern.launch_cluster(tiles * s, V11_THREADS, s, ta, tb, c, m, np8, k, shared=shared, device_index=dev)
    return (c if np8 == n else c[:, :n].contiguous()).unsqueeze(0)


# v15 (matmul_sm90.cu): v14's kernels in clusters of two blocks, tiles m0 and m0 + 128 of the
# same columns, each block copying half of the shared B tile into both (TMA multicast).
V15_CLUSTER = 2


@functools.cache
def _v15_clusters(name: str, shared: int, dev: int) -> int:
    """How many two-block clusters of kernel ``name`` with ``shared`` bytes of dynamic shared
    memory run at once on device ``dev`` (whole clusters sit in one GPC: at most SMs / 2)."""
    kern = MODULE_SM90.kernel(name, V13_SIGNATURE, dev)
    kern.set_max_dynamic_shared(shared)  # (the occupancy counts no more than is allowed)
    return kern.max_active_clusters(V11_THREADS, V15_CLUSTER, shared)


def v15_block_n(m: int, n: int, bt: int, clusters: int) -> int:
    """v15's tile width: the fewest waves of tile pairs over the co-resident clusters x tile
    cost, 256 or 192 (ties to the wider). 3000^2 on 66 clusters: 144 wide pairs (3 waves,
    6.0) against 192 of 192 (3 waves, 4.7): 192."""
    pairs_m = _cdiv(_cdiv(m, V11_BM), V15_CLUSTER)

    def cost(bn: int) -> float:
        return _cdiv(bt * pairs_m * _cdiv(n, bn), clusters) * V14_TILE_COST[bn]

    return min((256, 192), key=cost)


def _launch_v14(
    a3: torch.Tensor, b3: torch.Tensor, dev: int, block_n: int | None = None, clusters: bool = False
) -> torch.Tensor:
    """v14: a3 [bt, M, K] and b3 [bt, K, N] as they lie (v14_window; packed only where TMA
    cannot read them), the tile width v14_block_n picks (``block_n`` forces one: tests), C
    [bt, M, N rounded up to 8] through v13's C map, min(SMs, tiles) blocks of 384 threads.
    ``clusters`` (v15): in two-block clusters sharing B, 2 x min(co-resident clusters, tile
    pairs) blocks at the width v15_block_n picks, where the product is not cut into K slices,
    its v14 tiles are 192 or 256 wide, it has more than one row tile (else the pair's second
    block would only copy B) and a cluster fits; ``block_n`` then forces 192 or 256 and a
    cluster."""
    if clusters and block_n not in (None, 192, 256):
        raise ValueError(f"matmul: cuda_v15's tiles are 192 or 256 wide, not {block_n}")
    bt, m, k = a3.shape
    n = b3.shape[-1]
    if k == 0:
        return torch.zeros((bt, m, n), dtype=a3.dtype, device=a3.device)
    a3, wa = _v14_operand(a3)
    b3, wb = _v14_operand(b3)
    np8 = _cdiv(n, 8) * 8
    sms = _sm_count(dev)
    if block_n is None:  # (the K-slice kernel's occupancy is asked only where the tiles are few)
        s = v14_slices(
            m, np8, k, bt, sms, lambda s: _ks_blocks(v14_kernel_name(wa, wb, 128, a3.dtype, ks=True), s, dev)
        )
        if s > 1:
            return _launch_v14_ks(a3, wa, b3, wb, s, np8, dev)
    bn = block_n or v14_block_n(m, np8, bt, sms)
    live = 0  # co-resident two-block clusters (v15); 0: one block a tile (v14)
    if clusters and (block_n is not None or (bn != 128 and m > V11_BM)):
        names = {w: v14_kernel_name(wa, wb, w, a3.dtype, variant="v15") for w in (192, 256)}
        live = min(_v15_clusters(names[w], DYN_SHARED[f"v15_n{w}"], dev) for w in (192, 256))
        if live < 1 and block_n is not None:
            raise RuntimeError(f"matmul: no cluster of two cuda_v15 blocks fits on device {dev}")
        if live >= 1:
            bn = block_n or v15_block_n(m, np8, bt, live)
    variant, per_launch = ("v15", V15_CLUSTER) if live >= 1 else ("v14", 1)
    tiles = bt * _cdiv(m, V11_BM * per_launch) * _cdiv(np8, bn)  # (v15: tile pairs)
    if tiles >= 2**31:
        raise ValueError(f"matmul: cuda_{variant} counts output tiles in 32 bits; {tiles} is too many")
    c = torch.empty((bt, m, np8), dtype=a3.dtype, device=a3.device)
    ta, tb = v14_tensor_maps(a3, wa, b3, wb, bn, b_half=variant == "v15")
    kern = MODULE_SM90.kernel(v14_kernel_name(wa, wb, bn, a3.dtype, variant=variant), V13_SIGNATURE, dev)
    shared = DYN_SHARED[f"{variant}_n{bn}"]
    kern.set_max_dynamic_shared(shared)  # (a no-op once allowed)
    args = (ta, tb, v13_c_map(c), m, np8, k, bt)
    if variant == "v15":
        grid = V15_CLUSTER * min(live, tiles)
        kern.launch_cluster(grid, V11_THREADS, V15_CLUSTER, *args, shared=shared, device_index=dev)
    else:
        kern(min(sms, tiles), V11_THREADS, *args, shared=shared, device_index=dev)
    return c if np8 == n else c[..., :n].contiguous()


def _launch_v15(a3: torch.Tensor, b3: torch.Tensor, dev: int, block_n: int | None = None) -> torch.Tensor:
    """v15: _launch_v14 in two-block clusters sharing B (its ``clusters``)."""
    return _launch_v14(a3, b3, dev, block_n, clusters=True)


# The variants that are not one plain grid launch of a matmul.cu kernel, and those of them
# that fold the batch into their tile schedule (no grid z limit of 65535).
_LAUNCHERS = {
    "v10": _launch_v10,
    "v11": _launch_v11,
    "v12": _launch_v12,
    "v13": _launch_v13,
    "v14": _launch_v14,
    "v15": _launch_v15,
}
_BATCH_IN_SCHEDULE = ("v11", "v12", "v13", "v14", "v15")


def _launch_kernel(variant: str, a3: torch.Tensor, b3: torch.Tensor, dev: int) -> torch.Tensor:
    grid_fn, block, has_vec, _, _ = VARIANTS[variant]
    bt, m, k = a3.shape
    n = b3.shape[-1]
    c = torch.empty((bt, m, n), dtype=a3.dtype, device=a3.device)
    kern = MODULES.get(variant, MODULE).kernel(
        f"matmul_{variant}_{_SUFFIX[a3.dtype]}",
        ("ptr", "ptr", "ptr", "i32", "i32", "i32") + (("i32",) if has_vec else ()),
        dev,
    )
    args = [a3, b3, c, m, n, k]
    if has_vec:
        # 16-byte vectors need rows that start on 16-byte boundaries: K and N multiples
        # of 4 floats (8 halfs) and aligned base pointers.
        per16 = 16 // a3.element_size()
        args.append(int(k % per16 == 0 and n % per16 == 0 and _aligned16(a3, b3, c)))
    shared = DYN_SHARED.get(variant, 0)
    kern.set_max_dynamic_shared(shared)  # (a no-op once allowed)
    kern(grid_fn(m, n, bt), block, *args, shared=shared, device_index=dev)
    return c


def _product(variant: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a [..., M, K] @ b [..., K, N] with one kernel of the ladder; fresh contiguous output."""
    dtypes = VARIANTS[variant][3]
    if a.dtype not in dtypes:
        names = "/".join(_SUFFIX[d] for d in dtypes)
        raise TypeError(f"matmul: cuda_{variant} takes {names} tensors; a has dtype {a.dtype}")
    batch = tuple(a.shape[:-2])
    m, k = a.shape[-2], a.shape[-1]
    n = b.shape[-1]
    a3 = a.reshape(math.prod(batch), m, k)
    b3 = b.reshape(math.prod(batch), k, n)
    if variant not in _AS_THEY_LIE:
        a3, b3 = a3.contiguous(), b3.contiguous()
    bt = a3.shape[0]
    if not (bt and m and n):
        return torch.empty(batch + (m, n), dtype=a.dtype, device=a.device)
    if bt > 65535 and variant not in _BATCH_IN_SCHEDULE:
        raise ValueError(f"matmul: a batch of {bt} products exceeds the CUDA grid's z limit (65535)")
    dev = _device_index(a)
    s = split_k_slices(variant, m, n, k, bt, _sm_count(dev))
    if s == 1:
        return _launch(variant, a3, b3, dev).reshape(batch + (m, n))
    ks = _cdiv(k, s)
    if ks * s != k:  # zero padding: the extra FMAs add exact zeros
        a3 = torch.nn.functional.pad(a3, (0, ks * s - k))
        b3 = torch.nn.functional.pad(b3, (0, 0, 0, ks * s - k))
    # slice-major batches: entry j * bt + i is slice j of product i
    a_s = a3.reshape(bt, m, s, ks).permute(2, 0, 1, 3).reshape(s * bt, m, ks).contiguous()
    b_s = b3.reshape(bt, s, ks, n).transpose(0, 1).reshape(s * bt, ks, n).contiguous()
    p = _launch(variant, a_s, b_s, dev).reshape(s, bt, m, n)
    while p.shape[0] > 1:  # pairwise, fixed order
        p = p[0::2] + p[1::2]
    return p[0].reshape(batch + (m, n))


def _make_fwd(variant: str):
    def fwd(a, b, bias=None, activation=None):
        c = _product(variant, a, b)
        if bias is None and activation is None:
            return c
        return apply_epilogue(c, bias, activation)

    return fwd


def _best_fwd(a, b, bias=None, activation=None):
    variant = BEST[a.dtype]
    if a.dtype != torch.float32 and a.is_cuda and is_sm90(_device_index(a)):
        variant = "v15"  # Hopper: v14 in clusters sharing B (v14 itself where v15 does not apply)
    return _make_fwd(variant)(a, b, bias, activation)


# v10-v13's wgmma exists on sm_90 only (an sm_90a cubin runs nowhere else)
_available_sm90 = sm90_unavailable


def _register(backend: str, fwd, dtypes, description: str, module=MODULE, available=None) -> None:
    register_builtin(
        "matmul",
        backend,
        matmul_op(f"matmul_{backend}", fwd),
        description,
        module=module,
        available=available,
        dtypes=dtypes,
        double_backward=True,  # _autograd.matmul_op: the backward's matmuls are the custom op
    )


for _v, (_g, _b, _hv, _dt, _desc) in VARIANTS.items():
    if _v in MODULES:
        _register(f"cuda_{_v}", _make_fwd(_v), _dt, _desc, MODULES[_v], _available_sm90)
    else:
        _register(f"cuda_{_v}", _make_fwd(_v), _dt, _desc)
_register(
    "cuda", _best_fwd, _FP32 + _HALF, "CUDA: best per dtype (v7 fp32; v15 wgmma on sm_90, else v9, fp16/bf16)"
)
