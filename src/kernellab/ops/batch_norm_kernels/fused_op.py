"""What every bn_relu_pool2d backend shares: argument validation, byte and flop counts,
and the op-kit declaration around a backend's launchers.

Contract of a backend's launchers, x NCHW [N, C, H, W] with H, W >= 2, P = H // 2,
Q = W // 2:

    fwd(x, w, b, eps) -> (z, code, mean, rstd)
        x contiguous; w, b contiguous [C] in x's dtype. z [N, C, P, Q] contiguous, x's
        dtype: max over each 2x2 window of relu(xhat * w + b), computed in fp32 and
        rounded once. code [N, C, P, Q] int8: r * 2 + s of the window's maximum (row r,
        column s inside the window) where the maximum's pre-activation is > 0 (or NaN),
        -1 where the relu closed (z = 0: no gradient flows into the window). mean, rstd:
        fp32 [C], batch statistics over all N * H * W values (the row and column an odd
        size drops from the pool included).
    bwd(dz, x, w, code, mean, rstd) -> (dx, dw, db)
        dz [N, C, P, Q] contiguous; dx like x (contiguous), dw and db [C] in w's dtype.

What the forward saves: x (the batch-norm backward needs xhat at every position, see
below), w, the int8 codes (a quarter of x's elements, one byte each) and the fp32 stats.
No normalized tensor, full or pooled, is kept.

Math per channel c, M = N * H * W, xhat = (x - mean) * rstd, and g the gradient that
reaches the batch-norm output: dz at the window's argmax where code >= 0, 0 everywhere
else (the other three positions of a window, the windows the relu closed, the row and
column an odd size drops):
    db = sum(g),  dw = sum(g * xhat)        (non-zero terms only at the <= M / 4 argmaxes)
    dx = w * rstd * (g - db / M - xhat * dw / M)
dx is dense: the batch-statistics terms (db / M, xhat * dw / M) reach every position,
so the backward reads x in full once more and writes dx in full.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from kernellab.core.kit import OpDecl, build, contig
from kernellab.core.spec import FLOAT_DTYPES
from kernellab.ops.batch_norm_kernels.batch_norm_op import validate_channels

OP = "bn_relu_pool2d"

# --------------------------------------------------------------------------- validation


def validate(args, kwargs, devices, dtypes=FLOAT_DTYPES) -> None:
    """``bn_relu_pool2d(x, weight, bias, eps=...)``: x [N, C, H, W] with H, W >= 2,
    weight and bias [C] in x's dtype (batch_norm2d's checks, no relu option)."""
    validate_channels(args, kwargs, devices, OP, relu=False, min_hw=2, dtypes=dtypes)


# --------------------------------------------------------------------------- counts


def pooled(shape) -> tuple[int, int]:
    """(P, Q): the 2x2 / stride 2 pool floors odd sizes."""
    return shape[2] // 2, shape[3] // 2


def count_bytes(shape, dtype, mode, **options):
    """The minimum, each tensor once. fwd: read x, w, b; write z, the int8 codes and the
    fp32 stats. bwd: read dz, the codes, x, w and the stats; write dx, dw, db. (The Triton
    kernels read x twice forward (stats, then apply) and backward x once in full plus a
    quarter gathered at the argmaxes.)"""
    es = torch.empty((), dtype=dtype).element_size()
    n, c = shape[0], shape[1]
    full = math.prod(shape)
    p, q = pooled(shape)
    quarter = n * c * p * q
    stats = 2 * 4 * c
    fwd = full * es + 2 * c * es + quarter * (es + 1) + stats
    bwd = quarter * (es + 1) + full * es + c * es + stats + full * es + 2 * c * es
    return {"fwd": fwd, "bwd": bwd, "fwdbwd": fwd + bwd}[mode]


def count_flops(shape, mode, **options):
    full = math.prod(shape)
    p, q = pooled(shape)
    quarter = shape[0] * shape[1] * p * q
    # fwd: sum and deviation^2 (4), normalize (2) per element, 3 compares + relu per window;
    # bwd: two products and sums per window, 5 per element of dx
    f, b = 6 * full + 4 * quarter, 5 * full + 4 * quarter
    return {"fwd": f, "bwd": b, "fwdbwd": f + b}[mode]


# --------------------------------------------------------------------------- the op


def sizes(x) -> tuple[int, int, int, int, int, int, int]:
    """(C, H, W, P, Q, M, MO) of x [N, C, H, W]: a channel's M = N * H * W values and its
    MO = N * P * Q pooled outputs."""
    n, c, h, w = x.shape
    p, q = pooled(x.shape)
    return c, h, w, p, q, n * h * w, n * p * q


def fwd_outputs(x) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Uninitialized (z, code, mean, rstd) for x: what the launchers fill, and the fake
    kernel's outputs."""
    n, c = x.shape[0], x.shape[1]
    p, q = pooled(x.shape)
    stats = x.new_empty(c, dtype=torch.float32)
    return x.new_empty((n, c, p, q)), x.new_empty((n, c, p, q), dtype=torch.int8), stats, torch.empty_like(stats)


def _fwd_fake(x, w, b, eps):
    return fwd_outputs(x)


def bn_relu_pool_op(name: str, fwd, bwd, triton: bool = False):
    """Custom ops ``kernellab::<name>`` (x, w, b, eps) -> (z, code, mean, rstd) and
    ``kernellab::<name>_backward`` (dz, x, w, code, mean, rstd) -> (dx, dw, db); returns
    the registry callable ``(x, weight, bias, eps=1e-5)``."""

    def _fwd(x: Tensor, w: Tensor, b: Tensor, eps: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        return fwd(contig(x), w, b, eps)

    def _bwd(
        dz: Tensor, x: Tensor, w: Tensor, code: Tensor, mean: Tensor, rstd: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        return bwd(contig(dz), contig(x), w, code, mean, rstd)

    def _bwd_sample(make):
        x, w, b = make.args(False)
        z, code, mean, rstd = fwd(contig(x), w, b, 1e-5)
        dz = torch.randn(z.shape, device=x.device).to(x.dtype)
        return (dz, x, w, code, mean, rstd)

    call = build(
        OpDecl(
            name=name,
            fwd=_fwd,
            bwd=_bwd,
            fwd_fake=_fwd_fake,
            bwd_fake=lambda dz, x, w, code, mean, rstd: (
                x.new_empty(x.shape), torch.empty_like(w), torch.empty_like(w)
            ),
            # x, w, the codes and the stats; not b (the codes say where the relu was open)
            save=lambda inputs, out: ((inputs[0], inputs[1], out[1], out[2], out[3]), None),
            bwd_args=lambda saved, extra, dz: (dz, *saved),
            grads=lambda g, extra: (g[0], g[1], g[2], None),
            needs_grad=lambda x, w, b, eps: x.requires_grad or w.requires_grad or b.requires_grad,
            samples=(lambda make: (*make.args(True), 1e-5), _bwd_sample),
            triton=triton,
            label=f"bn_relu_pool2d ({name})",
        )
    )

    def bn_relu_pool2d(x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5) -> Tensor:
        # the launchers read weight and bias with unit stride: a strided one is packed first
        return call(x, contig(weight), contig(bias), float(eps))

    bn_relu_pool2d.custom_ops, bn_relu_pool2d.ops, bn_relu_pool2d.__name__ = call.custom_ops, call.ops, name
    bn_relu_pool2d.forward_saving, bn_relu_pool2d.backward_from = call.forward_saving, call.backward_from
    return bn_relu_pool2d
