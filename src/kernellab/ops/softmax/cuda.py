"""Softmax in CUDA C++ (softmax.cu, compiled by NVRTC): launchers and registrations.

Backends ``cuda_v1`` (a thread per row), ``cuda_v2`` (a block per row, shared-memory tree),
``cuda_v3`` (warp shuffles, 16-byte loads, the row in registers, online softmax for long
rows) and ``cuda`` (v4: v3 with the block fitted to the row, up to 1024 threads, and a warp
per short row);
the variant list with what each changes is at the top of softmax.cu.
"""

from __future__ import annotations

from pathlib import Path

import torch

from kernellab.cuda.runtime import Module
from kernellab.ops._elementwise import unary_op
from kernellab.ops._elementwise_cuda import SUFFIX
from kernellab.ops._register import register_cuda

MODULE = Module(Path(__file__).with_name("softmax.cu"))

MAX_PACKS = 4  # softmax.cu: packs a thread keeps in registers
RESIDENT_MAX_THREADS = 512
LONG_MAX_THREADS = 1024  # the l entries: resident rows of up to 4 x 1024 packs
STREAM_THREADS = 1024
V3_THREADS = 256
WARP_BLOCK = 256  # warp-per-row kernels: 8 rows per block
_FWD_SIG = ("ptr", "ptr", "i64", "i32")
_BWD_SIG = ("ptr", "ptr", "ptr", "i64", "i32")


def _rows_cols(t: torch.Tensor):
    cols = t.shape[-1] if t.dim() else 1
    return (t.numel() // cols if cols else 0), cols


def plan(variant: int, cols: int, elem_size: int, aligned: bool):
    """(entry kind, threads per block, rows per block) for a row width; kind as in
    softmax.cu: 'v1', 'v2', or r/l/o/w followed by v (16-byte packs) or s (scalar)."""
    if variant == 1:
        return "v1", 128, 128
    if variant == 2:
        return "v2", 256, 1
    n = 16 // elem_size
    vec = aligned and cols % n == 0
    npacks = cols // n if vec else cols
    sfx = "v" if vec else "s"
    if variant == 3:
        return ("r" if npacks <= MAX_PACKS * V3_THREADS else "o") + sfx, V3_THREADS, 1
    # v4: a warp per short row; otherwise a block fitted to the row, in registers up to
    # 4 x 1024 packs (bf16 32768, fp32 16384 columns): r up to 512 threads, l beyond.
    if npacks <= MAX_PACKS * 32:
        return "w" + sfx, WARP_BLOCK, WARP_BLOCK // 32
    if npacks <= MAX_PACKS * LONG_MAX_THREADS:
        threads = max(64, -(-npacks // (MAX_PACKS * 32)) * 32)
        return ("r" if threads <= RESIDENT_MAX_THREADS else "l") + sfx, threads, 1
    return "o" + sfx, STREAM_THREADS, 1


def _launch(variant: int, direction: str, inputs) -> torch.Tensor:
    inputs = [t if t.is_contiguous() else t.contiguous() for t in inputs]
    out = torch.empty(inputs[0].shape, dtype=inputs[0].dtype, device=inputs[0].device)
    rows, cols = _rows_cols(out)
    if rows == 0 or cols == 0:
        return out
    aligned = not any(t.data_ptr() & 15 for t in (*inputs, out))
    kind, threads, rows_per_block = plan(variant, cols, out.element_size(), aligned)
    dev = out.device.index
    name = f"softmax_{direction}_{kind}_{SUFFIX[out.dtype]}"
    kernel = MODULE.kernel(name, _FWD_SIG if direction == "fwd" else _BWD_SIG, dev)
    grid = -(-rows // rows_per_block)
    kernel(grid, threads, *inputs, out, rows, cols, device_index=dev)
    return out


def _make(variant: int):
    return unary_op(
        f"softmax_cuda_v{variant}",
        lambda x: _launch(variant, "fwd", [x]),
        lambda dy, y: _launch(variant, "bwd", [y, dy]),
        save_output=True,
    )


VARIANTS = [
    ("cuda_v1", 1, "CUDA v1: one thread per row, three passes"),
    ("cuda_v2", 2, "CUDA v2: one block per row, shared-memory tree"),
    ("cuda_v3", 3, "CUDA v3: warp shuffles, 16-byte loads, row in registers / online"),
    ("cuda", 4, "CUDA v4: block fitted to the row, a warp per short row"),
]

for _backend, _variant, _what in VARIANTS:
    _fn = _make(_variant)
    register_cuda("softmax", _backend, _fn, MODULE, _what)
