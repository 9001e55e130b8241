"""matmul's autograd, declared once through the op kit for the Triton and CUDA backends.

A backend supplies ``fwd(a, b, bias, activation) -> y``: any strides in, a fresh contiguous
``[..., M, N]`` out. ``matmul_op`` hands it to the kit (core/kit.py) with a composed
backward: the custom op ``kernellab::<name>`` (a ``triton_op`` for a Triton backend on a
GPU), its fake kernel, the eager fast path and the registry callable.

Backward, with z = a @ b + bias and dz = dy * act'(z):
    da = dz @ b^T, db = a^T @ dz  (the same forward on transposed views), dbias = sum_rows dz.
relu needs only the output (z > 0 exactly where y > 0); gelu recomputes z with one more
matmul rather than keeping a second [M, N] output alive between forward and backward.
Every step is a PyTorch op or the forward, so second derivatives are exact (the kit passes
the custom op as the forward when the backward is differentiated). A backend whose forward
takes only some shapes (cuda_skinny: M <= 128, while db = a^T @ dz has K rows) names the
product its backward uses instead (``backward_mm``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from kernellab.core.kit import OpDecl, build

_K = 0.7978845608028654


def _gelu_grad(z32: Tensor) -> Tensor:
    """d/dz of 0.5 z (1 + tanh(k (z + 0.044715 z^3))), fp32."""
    t = torch.tanh(_K * (z32 + 0.044715 * z32 * z32 * z32))
    return 0.5 * (1.0 + t) + 0.5 * z32 * (1.0 - t * t) * _K * (1.0 + 3 * 0.044715 * z32 * z32)


def _backward(mm: Callable, saved, activation, dy, need):
    """The kit's composed backward: ``mm(a, b, bias, activation)`` is the forward to reuse;
    ``need`` says which of (a, b, bias) want a gradient (None: all)."""
    a, b, bias, y = saved
    need = need or (True, True, True)
    dy = dy.contiguous()
    dz32 = None
    if activation == "relu":
        dz = dy * (~(y <= 0)).to(dy.dtype)  # NaN outputs pass dy, as torch.relu's backward
    elif activation == "gelu":
        z = mm(a, b, bias, None)
        dz32 = dy.float() * _gelu_grad(z.float())
        dz = dz32.to(dy.dtype)
    else:
        dz = dy
    da = mm(dz, b.transpose(-1, -2), None, None) if need[0] else None
    db = mm(a.transpose(-1, -2), dz, None, None) if need[1] else None
    dbias = None
    if bias is not None and need[2]:
        src = dz32 if dz32 is not None else dz.float()
        dbias = src.sum(dim=tuple(range(src.dim() - 1))).to(dy.dtype)
    return da, db, dbias, None


def _with_bias(make):
    a, b = make.args(1)[:2]
    bias = torch.randn(b.shape[-1], dtype=a.dtype, device=a.device, requires_grad=True)
    return (a, b, bias, "gelu")


def matmul_op(name: str, fwd: Callable, triton: bool = False, backward_mm: Callable | None = None):
    """Custom op ``kernellab::<name>(a, b, bias?, activation?)`` and the registry callable
    ``call(a, b, bias=None, activation=None)`` (with ``.custom_ops`` for opcheck and
    ``.op``, the custom op). ``backward_mm(a, b, bias, activation)``: the product the
    backward calls (default: the forward itself)."""
    backward = _backward
    if backward_mm is not None:

        def backward(mm, saved, activation, dy, need):
            return _backward(backward_mm, saved, activation, dy, need)

    def _fwd(a: Tensor, b: Tensor, bias: Tensor | None, activation: str | None) -> Tensor:
        return fwd(a, b, bias, activation)

    op = build(
        OpDecl(
            name=name,
            fwd=_fwd,
            fwd_fake=lambda a, b, bias, activation: a.new_empty(tuple(a.shape[:-1]) + (b.shape[-1],)),
            save=lambda inputs, out: ((inputs[0], inputs[1], inputs[2], out[0]), inputs[3]),
            needs_grad=lambda a, b, bias, activation: (
                a.requires_grad or b.requires_grad or (bias is not None and bias.requires_grad)
            ),
            samples=(lambda make: tuple(make.args(1)[:2]) + (None, None), _with_bias),
            backward=backward,
            triton=triton,
        )
    )

    def call(a: Tensor, b: Tensor, bias: Tensor | None = None, activation: str | None = None) -> Tensor:
        if bias is not None and not bias.is_contiguous():
            bias = bias.contiguous()  # the kernels read bias with unit stride
        return op(a, b, bias, activation)

    call.custom_ops = op.custom_ops
    call.op = op.ops[0]
    call.__name__ = name
    return call
