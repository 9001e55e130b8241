"""What sum, max and argmax share: validation of x (check_x), and the autograd plumbing
shared by the Triton and CUDA sum backends.

Each backend supplies two launchers over contiguous-or-not tensors:
``fwd_all(x) -> 0-d tensor`` and ``fwd_rows(x) -> x.shape[:-1]`` (sum of each row of the
last dim), both in x's dtype. This module makes them ``torch.library`` custom ops
(``kernellab::sum_<name>_all`` / ``_rows``, fake kernels for torch.compile, autograd)
and the registry callable ``fn(x, dim=None)`` with an eager fast path (launcher directly
without grad, a plain ``autograd.Function`` with grad), as ``ops/_elementwise.py`` does.

Backward: a sum's gradient is dy broadcast to x's shape; ``expand`` makes it a view (no
kernel, no memory), as torch's own SumBackward does.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from kernellab.ops.spec import FLOAT_DTYPES, dtype_name

# --------------------------------------------------------------------------- validation


def check_x(x, devices, op: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{op}: x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in FLOAT_DTYPES:
        allowed = ", ".join(dtype_name(d) for d in FLOAT_DTYPES)
        raise TypeError(f"{op}: x has dtype {x.dtype}; expected one of {allowed}")
    if x.device.type not in devices:
        raise ValueError(
            f"{op}: x is on {x.device}, but this backend runs on {' or '.join(devices)} tensors only"
        )


# --------------------------------------------------------------------------- sum


def split_dim(x: torch.Tensor, dim):
    """For backends: (tensor whose last dim is reduced, or None for the whole tensor)."""
    if dim is None:
        return None
    nd = x.dim()
    if nd and dim % nd != nd - 1:
        return x.movedim(dim, -1)
    return x


def _grad_all(dy: Tensor, shape) -> Tensor:
    return dy.expand(shape)


def _grad_rows(dy: Tensor, shape) -> Tensor:
    return dy.unsqueeze(-1).expand(shape) if len(shape) else dy.expand(shape)


def sum_backend(name: str, fwd_all: Callable, fwd_rows: Callable):
    def _all(x: Tensor) -> Tensor:
        return fwd_all(x)

    def _rows(x: Tensor) -> Tensor:
        return fwd_rows(x)

    all_op = torch.library.custom_op(f"kernellab::sum_{name}_all", _all, mutates_args=())
    rows_op = torch.library.custom_op(f"kernellab::sum_{name}_rows", _rows, mutates_args=())
    all_op.register_fake(lambda x: x.new_empty(()))
    rows_op.register_fake(lambda x: x.new_empty(x.shape[:-1]))

    def setup(ctx, inputs, output):
        ctx.shape = inputs[0].shape

    all_op.register_autograd(lambda ctx, dy: _grad_all(dy, ctx.shape), setup_context=setup)
    rows_op.register_autograd(lambda ctx, dy: _grad_rows(dy, ctx.shape), setup_context=setup)

    class EagerAll(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.shape = x.shape
            return fwd_all(x)

        @staticmethod
        def backward(ctx, dy):
            return _grad_all(dy, ctx.shape)

    class EagerRows(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.shape = x.shape
            return fwd_rows(x)

        @staticmethod
        def backward(ctx, dy):
            return _grad_rows(dy, ctx.shape)

    def call(x: Tensor, dim=None) -> Tensor:
        rows = split_dim(x, dim)
        if torch.compiler.is_compiling():
            return all_op(x) if rows is None else rows_op(rows)
        t = x if rows is None else rows
        if t.requires_grad and torch.is_grad_enabled():
            return EagerAll.apply(t) if rows is None else EagerRows.apply(t)
        return fwd_all(t) if rows is None else fwd_rows(t)

    call.custom_ops = [
        (all_op, lambda make: (make(1),), True),
        (rows_op, lambda make: (make(1),), True),
    ]
    call.__name__ = f"sum_{name}"
    return call
