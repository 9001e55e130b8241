"""max over the last dim in CUDA C++ (max.cu, NVRTC): launchers, custom ops,
registrations. ``cuda_v1``: one thread per row (naive); ``cuda``: a warp or a block per
row with 16-byte loads and shuffles (see the top of max.cu). Both take the one-pass
backward ``max_grad``. argmax's CUDA backends
(ops/argmax/cuda.py) are these launchers without the values store."""

from __future__ import annotations

from pathlib import Path

import torch

from kernellab.cuda.runtime import DTYPE_SUFFIX as SUFFIX
from kernellab.cuda.runtime import Module, _get_device
from kernellab.ops._reductions import max_backend
from kernellab.ops._register import register_cuda

MODULE = Module(Path(__file__).with_name("max.cu"))
THREADS = 256
WARP_ROW_MAX = 1024  # rows up to this many columns get one warp each
_SIG = ("ptr", "ptr", "ptr", "i64", "i32")
_KERNELS: dict = {}


def _kernel(name: str, dtype, dev: int, sig=_SIG):
    key = (name, dtype, dev)
    k = _KERNELS.get(key)
    if k is None:
        k = _KERNELS[key] = MODULE.kernel(f"{name}_{SUFFIX[dtype]}", sig, dev)
    return k


def max_rows(x: torch.Tensor, want_values: bool, variant: str):
    x = x.contiguous()
    n_cols = x.shape[-1] if x.dim() else 1
    if n_cols == 0:
        raise ValueError(f"max: x has shape {tuple(x.shape)}: its last dim is empty")
    if n_cols >= 2**31:
        raise ValueError(f"max: x has rows of {n_cols} elements; at most 2^31 - 1 are supported")
    idx = torch.empty(x.shape[:-1], dtype=torch.int64, device=x.device)
    vals = torch.empty(x.shape[:-1], dtype=x.dtype, device=x.device) if want_values else None
    n_rows = idx.numel()
    if n_rows == 0:
        return vals, idx
    dev = x.device.index
    if dev != _get_device():
        with torch.cuda.device(dev):
            return max_rows(x, want_values, variant)
    vptr = vals.data_ptr() if want_values else 0  # null: argmax writes indices only
    if variant == "v1":
        _kernel("max_rows_v1", x.dtype, dev)(-(-n_rows // THREADS), THREADS, x, vptr, idx, n_rows, n_cols)
        return vals, idx
    if n_cols <= WARP_ROW_MAX:
        grid = -(-n_rows // (THREADS // 32))
        _kernel("max_rows_warp", x.dtype, dev)(grid, THREADS, x, vptr, idx, n_rows, n_cols)
    else:
        _kernel("max_rows_block", x.dtype, dev)(n_rows, THREADS, x, vptr, idx, n_rows, n_cols)
    return vals, idx


GRAD_MIN_BLOCKS = 512  # a long-row backward splits rows into chunks until this many blocks run
GRAD_MIN_CHUNK = 4096  # ... of at least this many columns


def max_grad(idx: torch.Tensor, dv: torch.Tensor, shape) -> torch.Tensor:
    """dx of ``max`` in one pass: zeros but ``dv`` at each row's argmax ``idx``."""
    dx = torch.empty(shape, dtype=dv.dtype, device=dv.device)
    n_cols = shape[-1]
    n_rows = idx.numel()
    if n_rows == 0 or n_cols == 0:
        return dx.zero_()
    dev = dv.device.index
    if dev != _get_device():
        with torch.cuda.device(dev):
            return max_grad(idx, dv, shape)
    idx, dv = idx.contiguous(), dv.contiguous()
    if n_cols <= WARP_ROW_MAX:
        k = _kernel("max_grad_warp", dv.dtype, dev)
        k(-(-n_rows // (THREADS // 32)), THREADS, dv, idx, dx, n_rows, n_cols)
    else:
        assert dx.data_ptr() % 16 == 0  # (the flat packs of max_grad_block)
        chunks = max(1, min(-(-GRAD_MIN_BLOCKS // n_rows), n_cols // GRAD_MIN_CHUNK))
        packs = -(-n_cols * dx.element_size() // 16) + 1  # the most packs a row owns
        k = _kernel("max_grad_block", dv.dtype, dev, _SIG + ("i32",))
        k((n_rows, chunks), THREADS, dv, idx, dx, n_rows, n_cols, -(-packs // chunks))
    return dx


VARIANTS = [
    ("cuda_v1", "v1", "CUDA v1: one thread per row (naive, uncoalesced)"),
    ("cuda", "good", "CUDA: warp or block per row, 16-byte loads, shuffles"),
]


def launcher(variant: str):
    """``rows(x, want_values)`` of one variant (the kit declarations' launcher)."""
    return lambda x, want_values: max_rows(x, want_values, variant)


for _backend, _variant, _what in VARIANTS:
    register_cuda("max", _backend, max_backend(_backend, launcher(_variant), grad=max_grad), MODULE, _what)
