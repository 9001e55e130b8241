"""Autograd plumbing shared by the Triton and CUDA max / argmax backends.

A backend supplies one launcher ``rows(x, want_values) -> (values or None, indices)``
over the last dim. This module makes the ``torch.library`` custom ops
``kernellab::max_<name>`` (two outputs; fake kernel; autograd) and
``kernellab::argmax_<name>`` (indices only, no gradient), and the registry callables with
the eager fast path of ``ops/_elementwise.py``.

Backward of max: dy scattered to the argmax positions of a zero tensor (torch's
value_selecting_reduction_backward): a fill and a scatter, plain PyTorch ops.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


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
