"""Transpose in Triton: kernel, config, launcher, custom op, registration.

One program moves one tile of BM input rows x BN input columns (16 KB: 64 x 64 fp32,
64 x 128 fp16/bf16). It loads the tile along input rows and stores ``tl.trans`` of it
along output rows; Triton moves the tile from the load's register layout to the store's
through shared memory, so both global accesses are coalesced (what cuda_v3..v5 do by
hand). x is read through its strides: sliced, transposed and expanded inputs need no
packing (Triton specializes a unit column stride, and then loads 16 bytes at a time).
"""

from __future__ import annotations

import torch
import triton.language as tl

from kernellab import triton_support
from kernellab.ops._register import register_triton
from kernellab.ops.transpose.decl import out_shape, transpose_op


@triton_support.jit
def _transpose_kernel(x_ptr, y_ptr, R, C, sxb, sxr, sxc, tiles_r, tiles_c,
                      BM: tl.constexpr, BN: tl.constexpr):  # fmt: skip
    # x: [B, R, C] with strides (sxb, sxr, sxc), any; y: [B, C, R] contiguous.
    # Program p: column tile fastest, p = (b * tiles_r + row tile) * tiles_c + column tile,
    # so neighbouring programs read neighbouring pieces of the same input rows.
    pid = tl.program_id(0)
    pc = pid % tiles_c
    t = pid // tiles_c
    pr = t % tiles_r
    b = (t // tiles_r).to(tl.int64)
    rows = (pr * BM + tl.arange(0, BM)).to(tl.int64)
    cols = (pc * BN + tl.arange(0, BN)).to(tl.int64)  # int64: B * R * C may pass 2^31
    tile = tl.load(
        x_ptr + b * sxb + rows[:, None] * sxr + cols[None, :] * sxc,
        mask=(rows[:, None] < R) & (cols[None, :] < C),
    )
    out = tl.trans(tile)  # [BN, BM]: output rows cols, output columns rows
    tl.store(
        y_ptr + b * R * C + cols[:, None] * R + rows[None, :],
        out,
        mask=(cols[:, None] < C) & (rows[None, :] < R),
    )


def transpose_config(element_size: int) -> tuple[int, int, int]:
    """(BM, BN, num_warps): 16 KB tiles whose output rows are 128 bytes (BM elements) or
    more and input rows 256 bytes, 4 warps (lab/gpu_transpose.py times the neighbours)."""
    return (64, 64, 4) if element_size >= 4 else (64, 128, 4)


def transpose_triton(x: torch.Tensor, config: tuple[int, int, int] | None = None) -> torch.Tensor:
    """y [..., C, R] contiguous from x [..., R, C] of any strides (``config``: (BM, BN,
    num_warps), default ``transpose_config``)."""
    y = torch.empty(out_shape(x), dtype=x.dtype, device=x.device)
    if y.numel() == 0:
        return y
    r, c = x.shape[-2], x.shape[-1]
    b = y.numel() // (r * c)
    x3 = x if x.dim() == 3 else x.reshape(b, r, c)  # a view where the leading dims collapse
    bm, bn, warps = config or transpose_config(x.element_size())
    tiles_r, tiles_c = triton_support.cdiv(r, bm), triton_support.cdiv(c, bn)
    grid = (b * tiles_r * tiles_c,)
    sb, sr, sc = x3.stride()
    _transpose_kernel[grid](x3, y, r, c, sb, sr, sc, tiles_r, tiles_c, BM=bm, BN=bn, num_warps=warps)
    return y


def _kernel_specs(dtype: str):
    """For `kernellab asm`: the kernel as launched on a contiguous input (unit column stride,
    which Triton specializes as a constant)."""
    es = 4 if dtype == "fp32" else 2
    bm, bn, warps = transpose_config(es)
    sig = {"x_ptr": f"*{dtype}", "y_ptr": f"*{dtype}", "R": "i32", "C": "i32", "sxb": "i32",
           "sxr": "i32", "sxc": "constexpr", "tiles_r": "i32", "tiles_c": "i32",
           "BM": "constexpr", "BN": "constexpr"}  # fmt: skip
    return [(_transpose_kernel, sig, {"sxc": 1, "BM": bm, "BN": bn}, warps)]


register_triton(
    "transpose",
    transpose_op("triton", transpose_triton, triton=True),
    _kernel_specs,
    "Triton: 16 KB tiles, tl.trans through shared memory, coalesced both ways; any strides",
)
