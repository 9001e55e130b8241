"""What sum, max and argmax share: validation of x, and the autograd plumbing around the
Triton and CUDA backends' launchers (``torch.library`` custom ops with fake kernels for
torch.compile and autograd, and the registry callable with the eager fast path of
``ops/_elementwise.py``: the launcher directly without grad, a plain
``autograd.Function`` with grad).

sum: each backend supplies two launchers over contiguous-or-not tensors:
``fwd_all(x) -> 0-d tensor`` and ``fwd_rows(x) -> x.shape[:-1]`` (sum of each row of the
last dim), both in x's dtype; ``sum_backend`` makes them the custom ops
``kernellab::sum_<name>_all`` / ``_rows`` and the registry callable ``fn(x, dim=None)``.
Backward: a sum's gradient is dy broadcast to x's shape; ``expand`` makes it a view (no
kernel, no memory), as torch's own SumBackward does.

max / argmax: a backend supplies one launcher ``rows(x, want_values) -> (values or None,
indices)`` over the last dim; ``max_backends`` makes the custom ops
``kernellab::max_<name>`` (two outputs; fake kernel; autograd) and
``kernellab::argmax_<name>`` (indices only, no gradient), and both registry callables.
Backward of max: dy scattered to the argmax positions of a zero tensor (torch's
value_selecting_reduction_backward): a fill and a scatter, plain PyTorch ops.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from kernellab.core.spec import FLOAT_DTYPES, check_dtype

# --------------------------------------------------------------------------- validation


def check_x(x, devices, op: str, dtypes=FLOAT_DTYPES) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{op}: x must be a torch.Tensor, got {type(x).__name__}")
    check_dtype(op, "x", x, dtypes)
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


# --------------------------------------------------------------------------- max, argmax


def max_grad(dv: Tensor, idx: Tensor, shape) -> Tensor:
    if len(shape) == 0:
        return dv.clone()
    dx = torch.zeros(shape, dtype=dv.dtype, device=dv.device)
    return dx.scatter_(-1, idx.unsqueeze(-1), dv.unsqueeze(-1))


def max_backends(name: str, rows: Callable):
    """Returns (max callable, argmax callable), each with ``.custom_ops``."""

    def _max(x: Tensor) -> tuple[Tensor, Tensor]:
        v, i = rows(x, True)
        return v, i

    def _argmax(x: Tensor) -> Tensor:
        return rows(x, False)[1]

    max_op = torch.library.custom_op(f"kernellab::max_{name}", _max, mutates_args=())
    argmax_op = torch.library.custom_op(f"kernellab::argmax_{name}", _argmax, mutates_args=())
    max_op.register_fake(lambda x: (x.new_empty(x.shape[:-1]), x.new_empty(x.shape[:-1], dtype=torch.int64)))
    argmax_op.register_fake(lambda x: x.new_empty(x.shape[:-1], dtype=torch.int64))

    def setup(ctx, inputs, output):
        ctx.shape = inputs[0].shape
        ctx.save_for_backward(output[1])
        ctx.mark_non_differentiable(output[1])

    def backward(ctx, dv, di):
        (idx,) = ctx.saved_tensors
        return max_grad(dv, idx, ctx.shape)

    max_op.register_autograd(backward, setup_context=setup)

    class Eager(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            v, i = rows(x, True)
            ctx.shape = x.shape
            ctx.save_for_backward(i)
            ctx.mark_non_differentiable(i)
            return v, i

        @staticmethod
        def backward(ctx, dv, di):
            (idx,) = ctx.saved_tensors
            return max_grad(dv, idx, ctx.shape)

    def call_max(x: Tensor):
        if torch.compiler.is_compiling():
            return max_op(x)
        if x.requires_grad and torch.is_grad_enabled():
            return Eager.apply(x)
        return rows(x, True)

    def call_argmax(x: Tensor) -> Tensor:
        if torch.compiler.is_compiling():
            return argmax_op(x)
        return rows(x, False)[1]

    call_max.custom_ops = [(max_op, lambda make: (make(1),), True)]
    call_argmax.custom_ops = [(argmax_op, lambda make: (make(0),), False)]
    call_argmax.differentiable = False
    call_max.__name__, call_argmax.__name__ = f"max_{name}", f"argmax_{name}"
    return call_max, call_argmax
