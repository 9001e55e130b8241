"""Softmax in CUDA C++ (softmax.cu, compiled by NVRTC): launchers and registrations.

Backends ``cuda_v1`` (a thread per row), ``cuda_v2`` (a block per row, shared-memory tree),
``cuda_v3`` (warp shuffles, 16-byte loads, the row in registers, online softmax for long
rows), ``cuda`` (v4: v3 with the block fitted to the row and a warp per short row) and
``cuda_v5`` (the forward's rows brought into shared memory by Hopper bulk copies, on
sm_90+; v4 elsewhere); the variant list with what each changes is at the top of softmax.cu.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from kernellab.cuda.elementwise import SUFFIX
from kernellab.cuda.runtime import Module, register_cuda, sm_count
from kernellab.ops._elementwise import unary_op

MODULE = Module(Path(__file__).with_name("softmax.cu"))

MAX_PACKS = 4  # softmax.cu: packs a thread keeps in registers
RESIDENT_MAX_THREADS = 512
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
    softmax.cu: 'v1', 'v2', or r/o/w followed by v (16-byte packs) or s (scalar)."""
    if variant == 1:
        return "v1", 128, 128
    if variant == 2:
        return "v2", 256, 1
    n = 16 // elem_size
    vec = aligned and cols % n == 0
    npacks = cols // n if vec else cols
    sfx = "v" if vec else "s"
    if variant == 5:
        variant = 4  # v5's own forward is fwd_tma; elsewhere it is v4
    if variant == 3:
        return ("r" if npacks <= MAX_PACKS * V3_THREADS else "o") + sfx, V3_THREADS, 1
    # v4: a warp per short row; otherwise a block fitted to the row.
    if npacks <= MAX_PACKS * 32:
        return "w" + sfx, WARP_BLOCK, WARP_BLOCK // 32
    if npacks <= MAX_PACKS * RESIDENT_MAX_THREADS:
        threads = -(-npacks // MAX_PACKS)
        threads = min(RESIDENT_MAX_THREADS, max(64, -(-threads // 32) * 32))
        return "r" + sfx, threads, 1
    return "o" + sfx, STREAM_THREADS, 1


# v5 (Hopper bulk copies), softmax.cu's fwd_tma: packs per thread, and the launch shape.
TMA_PACKS = 4
TMA_THREADS = None  # None: the fewest warps that cover the row with TMA_PACKS packs each
TMA_STAGES = 2  # rows in flight per block
TMA_BLOCKS_PER_SM = 4  # persistent grid: this many blocks per SM (fewer if shared memory is short)
_TMA_SIG = ("ptr", "ptr", "i64", "i32", "i32")


@functools.cache
def _smem_optin(dev: int) -> int:
    return torch.cuda.get_device_properties(dev).shared_memory_per_block_optin


@functools.cache
def _sm90_or_newer(dev: int) -> bool:
    return torch.cuda.get_device_capability(dev) >= (9, 0)


def tma_plan(cols: int, elem_size: int, smem_optin: int, threads=None, stages=None, per_sm=None):
    """(threads, stages, blocks per SM, dynamic shared bytes) of v5's forward for rows of
    ``cols`` elements, or None where it does not apply (rows not a whole number of 16-byte
    packs, wider than 1024 threads x TMA_PACKS packs, or stages x row beyond the shared memory)."""
    row_bytes = cols * elem_size
    if row_bytes % 16:
        return None
    npacks = row_bytes // 16
    need = -(-npacks // TMA_PACKS)
    threads = threads or TMA_THREADS or max(32, -(-need // 32) * 32)
    if threads < need or threads > 1024 or threads % 32:
        return None
    stages = stages or TMA_STAGES
    buf = -(-row_bytes // 128) * 128
    smem = 128 + stages * buf  # mbarriers, then the row buffers
    if not 1 <= stages <= 16 or smem > smem_optin:
        return None
    per_sm = per_sm or TMA_BLOCKS_PER_SM
    # 228 KB of shared memory per SM on Hopper, 1 KB of it reserved per block.
    per_sm = max(1, min(per_sm, 2048 // threads, (smem_optin + 1024) // (smem + 1024 + 32 * 4)))
    return threads, stages, per_sm, smem


def fwd_tma(x: torch.Tensor, threads=None, stages=None, per_sm=None):
    """v5's forward (contiguous, 16-byte-aligned x on an sm_90+ GPU), or None where it does
    not apply. The keyword arguments override the plan (scripts/tune_rowwise_fwd.py)."""
    out = torch.empty_like(x)
    rows, cols = _rows_cols(out)
    dev = x.device.index
    if rows == 0 or (x.data_ptr() | out.data_ptr()) & 15 or not _sm90_or_newer(dev):
        return None
    plan_ = tma_plan(cols, x.element_size(), _smem_optin(dev), threads, stages, per_sm)
    if plan_ is None:
        return None
    threads, stages, per_sm, smem = plan_
    kernel = MODULE.kernel(f"softmax_fwd_t_{SUFFIX[x.dtype]}", _TMA_SIG, dev)
    kernel.set_max_dynamic_shared(smem)
    grid = min(rows, per_sm * sm_count(dev))
    kernel(grid, threads, x, out, rows, cols, stages, shared=smem, device_index=dev)
    return out


def _launch(variant: int, direction: str, inputs) -> torch.Tensor:
    inputs = [t if t.is_contiguous() else t.contiguous() for t in inputs]
    if variant == 5 and direction == "fwd" and inputs[0].numel():
        out = fwd_tma(inputs[0])
        if out is not None:
            return out
        variant = 4  # rows v5 does not take, and every backward: v4
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
    ("cuda_v5", 5, "CUDA v5: forward rows staged by Hopper bulk copies, persistent blocks (sm_90+; else v4)"),
]

for _backend, _variant, _what in VARIANTS:
    _fn = _make(_variant)
    register_cuda("softmax", _backend, _fn, MODULE, _what)
