"""Autograd and torch.library plumbing shared by the Triton and CUDA matmul backends.

A backend supplies ``fwd(a, b, bias, activation) -> y``: any strides in, a fresh contiguous
``[..., M, N]`` out. From it come a custom op ``kernellab::<name>`` (fake kernel for
torch.compile, autograd registered) and the registry callable, which in eager mode calls
``fwd`` directly without grad and a plain ``torch.autograd.Function`` with grad (the custom
op's dispatcher round trips cost host time; see ops/_elementwise.py for the measurement).

Backward, with z = a @ b + bias and dz = dy * act'(z):
    da = dz @ b^T, db = a^T @ dz  (the same kernel on transposed views), dbias = sum_rows dz.
relu needs only the output (z > 0 exactly where y > 0); gelu recomputes z with one more
matmul rather than keeping a second [M, N] output alive between forward and backward.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

_K = 0.7978845608028654


def _gelu_grad(z32: Tensor) -> Tensor:
    """d/dz of 0.5 z (1 + tanh(k (z + 0.044715 z^3))), fp32."""
    t = torch.tanh(_K * (z32 + 0.044715 * z32 * z32 * z32))
    return 0.5 * (1.0 + t) + 0.5 * z32 * (1.0 - t * t) * _K * (1.0 + 3 * 0.044715 * z32 * z32)


def _backward(mm: Callable, dy, a, b, bias, y, activation, need):
    """need = (da?, db?, dbias?); ``mm(a, b, bias, activation)`` is the forward to reuse."""
    dz32 = None
    if activation == "relu":
        dz = dy * (y > 0).to(dy.dtype)
    elif activation == "gelu":
        z = mm(a, b, bias, None)
        dz32 = dy.float() * _gelu_grad(z.float())
        dz = dz32.to(dy.dtype)
    else:
        dz = dy
    da = mm(dz, b.transpose(-1, -2), None, None) if need[0] else None
    db = mm(a.transpose(-1, -2), dz, None, None) if need[1] else None
    dbias = None
    if need[2]:
        src = dz32 if dz32 is not None else dz.float()
        dbias = src.sum(dim=tuple(range(src.dim() - 1))).to(dy.dtype)
    return da, db, dbias


def matmul_op(name: str, fwd: Callable):
    """Custom op ``kernellab::<name>(a, b, bias?, activation?)`` and the registry callable
    ``call(a, b, bias=None, activation=None)`` (with ``.custom_ops`` for opcheck)."""

    def _fwd(a: Tensor, b: Tensor, bias: Tensor | None, activation: str | None) -> Tensor:
        return fwd(a, b, bias, activation)

    op = torch.library.custom_op(f"kernellab::{name}", _fwd, mutates_args=())

    @op.register_fake
    def _(a, b, bias, activation):
        return a.new_empty(tuple(a.shape[:-1]) + (b.shape[-1],))

    def setup_context(ctx, inputs, output):
        a, b, bias, activation = inputs
        ctx.activation = activation
        ctx.has_bias = bias is not None
        ctx.save_for_backward(a, b, bias, output)

    def backward(ctx, dy):
        a, b, bias, y = ctx.saved_tensors
        need = (ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.has_bias and ctx.needs_input_grad[2])
        da, db, dbias = _backward(op, dy.contiguous(), a, b, bias, y, ctx.activation, need)
        return da, db, dbias, None

    op.register_autograd(backward, setup_context=setup_context)

    class Eager(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b, bias, activation):
            y = fwd(a, b, bias, activation)
            ctx.activation = activation
            ctx.has_bias = bias is not None
            ctx.save_for_backward(a, b, bias, y)
            return y

        @staticmethod
        def backward(ctx, dy):
            a, b, bias, y = ctx.saved_tensors
            need = (
                ctx.needs_input_grad[0],
                ctx.needs_input_grad[1],
                ctx.has_bias and ctx.needs_input_grad[2],
            )
            # create_graph=True (grad mode on in here): the backward's matmuls go through the
            # custom op, whose autograd is registered, so a second derivative is exact (every
            # other step of _backward is torch ops); otherwise the launcher directly.
            mm = op if torch.is_grad_enabled() else fwd
            da, db, dbias = _backward(mm, dy.contiguous(), a, b, bias, y, ctx.activation, need)
            return da, db, dbias, None

    def call(a: Tensor, b: Tensor, bias: Tensor | None = None, activation: str | None = None) -> Tensor:
        if bias is not None and not bias.is_contiguous():
            bias = bias.contiguous()  # the kernels read bias with unit stride
        if torch.compiler.is_compiling():
            return op(a, b, bias, activation)
        if torch.is_grad_enabled() and (
            a.requires_grad or b.requires_grad or (bias is not None and bias.requires_grad)
        ):
            return Eager.apply(a, b, bias, activation)
        return fwd(a, b, bias, activation)

    def _with_bias(make):
        a, b = make.args(1)[:2]
        bias = torch.randn(b.shape[-1], dtype=a.dtype, device=a.device, requires_grad=True)
        return (a, b, bias, "gelu")

    call.custom_ops = [
        (op, lambda make: tuple(make.args(1)[:2]) + (None, None), True),
        (op, _with_bias, True),
    ]
    call.op = op
    call.__name__ = name
    return call
