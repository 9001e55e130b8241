"""The weight-only matmuls' autograd, declared once through the op kit (core/kit.py) for
the Triton and CUDA backends.

A backend supplies ``fwd(x, w_q, scales, bias) -> y``: any strides in (the launchers pack
what they need), a fresh contiguous ``[..., N]`` out in x's dtype. The backward is composed
from PyTorch ops: dx = (dy * scales) @ w_q in fp32, dbias = dy summed over rows. The weight
and the scales are constants of the product (no gradient); a ``scales`` that requires grad
is refused at the call rather than silently left without one.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from kernellab.core.kit import OpDecl, build
from kernellab.ops.weight_only_matmul.quantize import int_values


def _backward_for(bits: int):
    def backward(fwd, saved, has_bias, dy, need):
        w_q, scales = saved
        need = need or (True, False, False, True)
        dx = dbias = None
        if need[0]:
            # (dy * s) @ w: the scale is per output channel, i.e. per column of dy
            w = int_values(w_q, bits).float()
            dx = ((dy.float() * scales.float()) @ w).to(dy.dtype)
        if has_bias and need[3]:
            d32 = dy.float()
            dbias = d32.sum(dim=tuple(range(d32.dim() - 1))).to(dy.dtype)
        return dx, None, None, dbias

    return backward


def wo_op(name: str, fwd: Callable, bits: int, triton: bool = False):
    """Custom op ``kernellab::<name>(x, w_q, scales, bias?)`` and the registry callable
    ``call(x, w_q, scales, bias=None)``."""

    def _fwd(x: Tensor, w_q: Tensor, scales: Tensor, bias: Tensor | None) -> Tensor:
        return fwd(x, w_q, scales, bias)

    def _sample(make):
        x, w_q, s = make.args(1)[:3]
        return (x, w_q, s, None)

    op = build(
        OpDecl(
            name=name,
            fwd=_fwd,
            fwd_fake=lambda x, w_q, scales, bias: x.new_empty(tuple(x.shape[:-1]) + (w_q.shape[0],)),
            save=lambda inputs, out: ((inputs[1], inputs[2]), inputs[3] is not None),
            needs_grad=lambda x, w_q, scales, bias: (
                x.requires_grad or (bias is not None and bias.requires_grad)
            ),
            samples=(_sample,),
            backward=_backward_for(bits),
            triton=triton,
        )
    )

    def call(x: Tensor, w_q: Tensor, scales: Tensor, bias: Tensor | None = None) -> Tensor:
        if scales.requires_grad and torch.is_grad_enabled():
            raise RuntimeError(
                f"{name}: scales requires grad, but the weight-only matmuls differentiate x and bias "
                "only; pass scales.detach()"
            )
        return op(x, w_q, scales, bias)

    call.custom_ops = op.custom_ops
    call.ops = op.ops
    call.forward_saving, call.backward_from = op.forward_saving, op.backward_from
    call.__name__ = name
    return call
