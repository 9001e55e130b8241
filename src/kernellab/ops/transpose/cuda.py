"""Transpose in CUDA C++ (transpose.cu, compiled by NVRTC): launcher, custom ops,
registrations.

Backends ``cuda_v1`` .. ``cuda_v5`` are the lecture's steps (the list with what each
changes is at the top of transpose.cu); ``cuda`` runs v5 (16-byte accesses both ways
through a swizzled 64-row tile), which falls back to v4 (32x8 threads, 4 elements each)
where sizes or alignment rule out 16-byte accesses. ``copy_tile`` (not a backend) is v5's
access pattern without the transpose: the ceiling lab/gpu_transpose.py measures v5 against.
"""

from __future__ import annotations

from pathlib import Path

import torch

from kernellab.cuda.runtime import DTYPE_SUFFIX as SUFFIX
from kernellab.cuda.runtime import Module, _get_device
from kernellab.ops._register import register_cuda
from kernellab.ops.transpose.decl import out_shape, transpose_op

MODULE = Module(Path(__file__).with_name("transpose.cu"))
MODULE.asm_aliases = {"cuda": ("cuda_v5",)}  # `kernellab asm transpose --backend cuda`

_SIG = ("ptr", "ptr", "i64", "i64", "i64", "i64", "i64")  # x, y, R, C, ldx, bsx, B
GRID_Y = 65535  # bands (batch x row tiles) past this are walked by the kernels' y loop

# variant -> (threads per block, input rows per tile, input columns per tile for a given
# element size): transpose.cu's T32 and V5<T>
_TILE32 = ((32, 32), 32, lambda es: 32)
_GEOMETRY = {
    1: _TILE32,
    2: _TILE32,
    3: _TILE32,
    4: ((32, 8), 32, lambda es: 32),
    5: (256, 64, lambda es: 16 * (16 // es)),
    "copy": (256, 64, lambda es: 16 * (16 // es)),
}

_KERNELS: dict = {}


def _kernel(name: str, dev: int):
    k = _KERNELS.get((name, dev))
    if k is None:
        k = _KERNELS[(name, dev)] = MODULE.kernel(name, _SIG, dev)
    return k


def _rows(x: torch.Tensor):
    """x as [B, R, C] with a unit column stride (packed first where it has none), and
    (B, R, C, row stride, batch stride); strides of dims of size 1 reported as 0 (unused)."""
    r, c = x.shape[-2], x.shape[-1]
    if c > 1 and x.stride(-1) != 1:
        x = x.contiguous()
    b = x.numel() // (r * c)
    x3 = x if x.dim() == 3 else x.reshape(b, r, c)  # a view where the leading dims collapse
    return x3, b, r, c, (x3.stride(1) if r > 1 else 0), (x3.stride(0) if b > 1 else 0)


def vector_ok(x3: torch.Tensor, r: int, c: int, ldx: int, bsx: int) -> bool:
    """Whether v5's 16-byte accesses apply: R and C multiples of a 16-byte chunk of
    elements (the output's rows are R long) and every input row 16-byte aligned."""
    v = 16 // x3.element_size()
    return r % v == 0 and c % v == 0 and ldx % v == 0 and bsx % v == 0 and x3.data_ptr() % 16 == 0


def transpose_cuda(x: torch.Tensor, variant) -> torch.Tensor:
    """y [..., C, R] contiguous from x [..., R, C] (``variant``: 1..5, or "copy": v5's
    access pattern copying x to a [..., R, C] output, for the ceiling measurement)."""
    y = torch.empty(out_shape(x) if variant != "copy" else x.shape, dtype=x.dtype, device=x.device)
    if y.numel() == 0:
        return y
    dev = x.device.index
    if dev != _get_device():  # launch in the tensors' device context
        with torch.cuda.device(dev):
            return transpose_cuda(x, variant)
    x3, b, r, c, ldx, bsx = _rows(x)
    if variant in (5, "copy") and not vector_ok(x3, r, c, ldx, bsx):
        if variant == "copy":
            raise ValueError("copy_tile needs sizes and rows aligned for 16-byte accesses")
        variant = 4
    block, tile_r, tile_c = _GEOMETRY[variant]
    tile_c = tile_c(x.element_size())
    name = "copy_tile" if variant == "copy" else f"transpose_v{variant}"
    kernel = _kernel(f"{name}_{SUFFIX[x.dtype]}", dev)
    grid = (-(-c // tile_c), min(b * -(-r // tile_r), GRID_Y))
    kernel(grid, block, x3, y, r, c, ldx, bsx, b, device_index=dev)
    return y


VARIANTS = [
    ("cuda_v1", 1, "CUDA v1: naive, thread per element; coalesced reads, writes R elements apart"),
    ("cuda_v2", 2, "CUDA v2: through a 32x32 shared tile, coalesced both ways; 32-way bank conflicts"),
    ("cuda_v3", 3, "CUDA v3: tile padded to 32x33: column reads conflict-free"),
    ("cuda_v4", 4, "CUDA v4: 32x8 threads, 4 elements each: 4 loads in flight per thread"),
    ("cuda_v5", 5, "CUDA v5: 16-byte accesses both ways, 64-row swizzled tile (else v4)"),
    ("cuda", 5, "CUDA best (v5): 16-byte accesses, swizzled 64-row tile; v4 where unaligned"),
]


def _make(backend: str, variant: int):
    return transpose_op(backend, lambda x: transpose_cuda(x, variant))


for _backend, _variant, _what in VARIANTS:
    register_cuda("transpose", _backend, _make(_backend, _variant), MODULE, _what)
