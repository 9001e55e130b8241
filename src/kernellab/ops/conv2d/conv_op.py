"""What conv2d's Triton and CUDA backends share: the custom-op / eager-autograd plumbing
around a backend's launchers, and the host-side limits of the kernels.

Contract of a backend's launchers:

    fwd(x, w, bias, sh, sw, ph, pw) -> y
        x [N, C, H, W] (strides as the backend accepts them, see each file), w [K, C, R, S]
        contiguous, bias [K] or None, same dtype. y [N, K, P, Q] contiguous.
    bwd(dy, x, w, need_dx, sh, sw, ph, pw) -> (dx, dw, dbias)
        dy [N, K, P, Q] contiguous (any strides where the backend says ``strided_dy``).
        dx like x (contiguous) when need_dx, else an empty tensor (a network's first
        layer: its input needs no gradient, and the dgrad GEMM is the backward's largest
        part there); dw like w, dbias [K] (computed even without a
        bias: a row sum of dy, cheap beside the two GEMMs; the autograd drops it).
"""

from __future__ import annotations

import torch
from torch import Tensor

from kernellab.core.kit import OpDecl, build
from kernellab.ops.conv2d.geometry import as_pair, out_size

# The kernels index with 32-bit ints (cheaper address math; 2^31 elements is 8 GiB of
# fp32 activations, far past any one conv call of the models here): larger is refused.
INT32_MAX = 2**31 - 1


def check_int32(x: Tensor, w: Tensor, p: int, q: int, label: str) -> None:
    n, _, _, _ = x.shape
    k = w.shape[0]
    for name, numel in (("x", x.numel()), ("w", w.numel()), ("the output", n * k * p * q)):
        if numel > INT32_MAX:
            raise ValueError(
                f"conv2d ({label}): {name} has {numel} elements; this backend indexes with 32-bit "
                "ints (at most 2^31 - 1); split the batch or use backend='torch'"
            )


def _contig(t):
    return t if t is None or t.is_contiguous() else t.contiguous()


def _need_dx(inputs) -> bool:
    """Whether the backward computes dx: under autograd (some input requires grad), only
    when x does; through ``forward_saving`` with detached inputs (a fused caller that owns
    the backward, no input requiring grad), always."""
    x, w, bias = inputs[:3]
    return x.requires_grad or not (w.requires_grad or (bias is not None and bias.requires_grad))


def _out_shape(x, w, sh, sw, ph, pw):
    p, q = out_size(x.shape[2], x.shape[3], w.shape[2], w.shape[3], (sh, sw), (ph, pw))
    return (x.shape[0], w.shape[0], p, q)


def conv_op(name: str, fwd, bwd, triton: bool = False, label: str | None = None, strided_dy: bool = False):
    """Custom ops ``kernellab::<name>`` (x, w, bias?, sh, sw, ph, pw) -> y and
    ``kernellab::<name>_backward``; returns the registry callable
    ``(x, w, bias=None, stride=1, padding=0)`` (see kit.build for the eager path).
    ``strided_dy``: bwd takes dy at any strides (no contiguous copy first)."""

    def _fwd(x: Tensor, w: Tensor, bias: Tensor | None, sh: int, sw: int, ph: int, pw: int) -> Tensor:
        return fwd(x, w, bias, sh, sw, ph, pw)

    def _bwd(
        dy: Tensor, x: Tensor, w: Tensor, need_dx: bool, sh: int, sw: int, ph: int, pw: int
    ) -> tuple[Tensor, Tensor, Tensor]:
        return bwd(dy if strided_dy else _contig(dy), x, w, need_dx, sh, sw, ph, pw)

    def _bwd_sample(make):
        x, w, _ = make.args(False)
        dy = torch.randn(_out_shape(x, w, 1, 1, 0, 0), device=x.device).to(x.dtype)
        return (dy, x, w, True, 1, 1, 0, 0)

    call = build(
        OpDecl(
            name=name,
            fwd=_fwd,
            bwd=_bwd,
            fwd_fake=lambda x, w, bias, sh, sw, ph, pw: x.new_empty(_out_shape(x, w, sh, sw, ph, pw)),
            bwd_fake=lambda dy, x, w, need_dx, sh, sw, ph, pw: (
                x.new_empty(x.shape if need_dx else (0,)),
                torch.empty_like(w),
                w.new_empty(w.shape[0]),
            ),
            save=lambda inputs, out: ((inputs[0], inputs[1]), (inputs[2] is not None, _need_dx(inputs), *inputs[3:])),
            bwd_args=lambda saved, extra, dy: (dy, *saved, *extra[1:]),
            grads=lambda g, extra: (
                g[0] if extra[1] else None, g[1], g[2] if extra[0] else None, None, None, None, None
            ),
            needs_grad=lambda x, w, bias, *geom: (
                x.requires_grad or w.requires_grad or (bias is not None and bias.requires_grad)
            ),
            samples=(lambda make: (*make.args(True), 1, 1, 0, 0), _bwd_sample),
            triton=triton,
            label=label or name,
        )
    )

    def conv2d(x: Tensor, w: Tensor, bias: Tensor | None = None, stride=1, padding=0) -> Tensor:
        sh, sw = as_pair(stride, "stride", 1)
        ph, pw = as_pair(padding, "padding", 0)
        # The kernels read w and bias with unit strides: a strided one is packed first
        # (autograd carries its gradient back through the copy).
        return call(x, _contig(w), _contig(bias), sh, sw, ph, pw)

    conv2d.custom_ops, conv2d.ops, conv2d.__name__ = call.custom_ops, call.ops, name
    conv2d.forward_saving, conv2d.backward_from = call.forward_saving, call.backward_from
    return conv2d
