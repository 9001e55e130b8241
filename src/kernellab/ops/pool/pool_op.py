"""What max_pool2d's Triton and CUDA backends share: the custom-op / eager-autograd
plumbing around a backend's launchers.

    fwd(x, k, s) -> (y [N, C, P, Q] contiguous, idx [N, C, P, Q] int8: r * k + s of the max)
    bwd(dy, idx, H, W, k, s) -> dx [N, C, H, W] contiguous (in dy's dtype)
"""

from __future__ import annotations

import torch
from torch import Tensor

from kernellab.core.kit import OpDecl, build
from kernellab.ops.pool.windows import MAX_KERNEL, geometry


def fwd_outputs(x, k, s) -> tuple[Tensor, Tensor]:
    """Uninitialized (y, idx) [N, C, P, Q], x's dtype and int8: what the forward launchers
    fill, and the fake kernel's outputs."""
    _, _, p, q = geometry(x.shape[2], x.shape[3], k, s)
    shape = (x.shape[0], x.shape[1], p, q)
    return x.new_empty(shape), x.new_empty(shape, dtype=torch.int8)


def grad_input(dy, h, w) -> Tensor:
    """Uninitialized dx [N, C, H, W] in dy's dtype: what the backward launchers fill."""
    return dy.new_empty((dy.shape[0], dy.shape[1], h, w))


def pool_op(name: str, fwd, bwd, triton: bool = False):
    """Custom ops ``kernellab::<name>`` and ``kernellab::<name>_backward``; returns the
    registry callable ``(x, kernel_size=2, stride=None)``."""

    def _fwd(x: Tensor, k: int, s: int) -> tuple[Tensor, Tensor]:
        return fwd(x, k, s)

    def _bwd(dy: Tensor, idx: Tensor, h: int, w: int, k: int, s: int) -> Tensor:
        return bwd(dy if dy.is_contiguous() else dy.contiguous(), idx, h, w, k, s)

    def _bwd_sample(make):
        (x,) = make.args(False)
        y, idx = fwd(x, 2, 2)
        return (torch.randn(y.shape, device=x.device).to(x.dtype), idx, x.shape[2], x.shape[3], 2, 2)

    call = build(
        OpDecl(
            name=name,
            fwd=_fwd,
            bwd=_bwd,
            fwd_fake=fwd_outputs,
            bwd_fake=lambda dy, idx, h, w, k, s: grad_input(dy, h, w),
            # saved: the int8 offsets alone (not x): (H, W, k, s) rebuild dx's geometry
            save=lambda inputs, out: ((out[1],), (*inputs[0].shape[2:], inputs[1], inputs[2])),
            bwd_args=lambda saved, extra, dy: (dy, saved[0], *extra),
            grads=lambda g, extra: (g[0], None, None),
            needs_grad=lambda x, k, s: x.requires_grad,
            samples=(lambda make: (*make.args(True), 2, 2), _bwd_sample),
            triton=triton,
        )
    )

    def max_pool2d(x: Tensor, kernel_size: int = 2, stride: int | None = None) -> Tensor:
        k, s, _, _ = geometry(x.shape[2], x.shape[3], kernel_size, stride)
        if k > MAX_KERNEL:
            raise ValueError(
                f"max_pool2d ({name}): kernel_size {k} > {MAX_KERNEL} (the int8 offsets of the "
                "backward hold 11 x 11 windows); use backend='torch'"
            )
        return call(x, k, s)

    max_pool2d.custom_ops, max_pool2d.ops, max_pool2d.__name__ = call.custom_ops, call.ops, name
    max_pool2d.forward_saving, max_pool2d.backward_from = call.forward_saving, call.backward_from
    return max_pool2d
