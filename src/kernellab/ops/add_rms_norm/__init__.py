"""Residual add + RMSNorm, the step between two transformer blocks, forward and backward.

    new_residual = x + residual                              (rounded to x's dtype)
    normed       = new_residual / sqrt(mean(new_residual^2) + eps) * weight   (per row)

Returns ``(normed, new_residual)``, both differentiable: the next block reads ``normed``,
the residual stream carries ``new_residual`` on. x and residual: one shape (any rank, any
strides), weight: [D] with D = x.shape[-1]; one dtype (fp32 / fp16 / bf16). The norm is
taken of the rounded sum, in fp32 through the weight multiply, rounded once (as
``h = x + residual; F.rms_norm(h, (D,), weight, eps)`` computes it). Gradients for x,
residual and weight, from the grad_outputs of both outputs: d(x) = d(residual) =
rms_norm's input gradient + the gradient of new_residual.

The Triton backend is rms_norm's kernels with the residual fused (``RES`` in
ops/norm_kernels/triton_kernels.py): one kernel reads x and residual and writes normed,
new_residual and the fp32 rstd of each row; one backward kernel adds the residual stream's
gradient into dx. NaN and inf follow rms_norm's (an inf in a row makes its rstd 0: the inf
becomes NaN, the rest 0).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from kernellab.core import registry
from kernellab.core.spec import (
    FLOAT_DTYPES,
    BadInput,
    check_like,
    device_of,
    layout_checking,
    make_tensor,
    per_element_flops,
)
from kernellab.ops.norm_kernels import spec_parts


def add_rms_norm_reference(x, residual, weight, eps=1e-6):
    """The formula in the inputs' dtype (float64 in checks): (normed, new_residual)."""
    h = x + residual
    return h / torch.sqrt(h.square().mean(-1, keepdim=True) + eps) * weight, h


# x, weight and eps follow rms_norm's rules (and its fast accept); residual is x's twin.
_NORM_ARGS = spec_parts.make_validator("add_rms_norm", ("x", "weight"))


def _validate(args, kwargs, devices, dtypes=FLOAT_DTYPES) -> None:
    op = "add_rms_norm"
    if len(args) != 3:
        raise TypeError(f"{op}() takes 3 tensor arguments (x, residual, weight), got {len(args)}")
    x, r, w = args
    _NORM_ARGS((x, w), kwargs, devices, dtypes)
    if (isinstance(r, Tensor) and r.dtype is x.dtype and r.layout is torch.strided and r.shape == x.shape
            and device_of(r) == device_of(x)):  # fmt: skip
        return
    check_like(op, "residual", r, "x", x, devices, dtypes)


def _inputs(shape, dtype, device, gen, layout, scale):
    """x and residual of ``shape`` in ``layout``; weight ~ 1 + N(0, 0.1^2), contiguous [D]."""
    x = make_tensor(shape, dtype, device, gen, layout, scale)
    r = make_tensor(shape, dtype, device, gen, layout, scale)
    if x is None or r is None:
        return None
    d = shape[-1] if shape else 1
    w = (1.0 + make_tensor((d,), torch.float32, device, gen, "contiguous", 0.1)).to(dtype)
    return x, r, w


def _bytes(shape, dtype, mode, **options):
    # fwd: read x, residual, weight; write normed, new_residual and the fp32 rstd per row.
    # bwd: read dy, dres, new_residual, weight, rstd; write dx (= dresidual, one tensor), dw.
    es = torch.empty((), dtype=dtype).element_size()
    n = math.prod(shape)
    d = shape[-1] if shape else 1
    rows = n // d if d else 0
    fwd = 4 * n * es + d * es + 4 * rows
    bwd = 4 * n * es + 2 * d * es + 4 * rows
    return {"fwd": fwd, "bwd": bwd, "fwdbwd": fwd + bwd}[mode]


# per element: the add, square-sum, scale, weight; bwd products, sums, dres add
_flops = per_element_flops(5, 10)


def _case(device, dtype, r_shape=(4, 8), r_dtype=None, w_shape=(8,), w_dtype=None, **kwargs):
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(4, 8, generator=g, device=device).to(dtype)
    r = torch.randn(r_shape, generator=g, device=device).to(r_dtype or dtype)
    w = torch.ones(w_shape, device=device, dtype=w_dtype or dtype)
    return (x, r, w), kwargs


SPEC = spec_parts.define_norm(
    "add_rms_norm",
    ("x", "residual", "weight"),
    add_rms_norm_reference,
    (_flops, _bytes),
    __doc__,
    grad_outputs=2,  # normed and new_residual, each with its own grad_output
    inputs=_inputs,
    validator=layout_checking(_validate),
    option_sets=[{"eps": 1e-2}],
    extra_bad_inputs=[
        BadInput("residual of another shape", lambda d, t: _case(d, t, r_shape=(4, 9)), "residual"),
        BadInput("residual dtype differs from x",
                 lambda d, t: _case(d, torch.float32, r_dtype=torch.float16), "residual"),  # fmt: skip
        BadInput("integer residual", lambda d, t: _case(d, t, r_dtype=torch.int32), "residual"),
        BadInput("weight of the wrong shape", lambda d, t: _case(d, t, w_shape=(4, 8)), "weight"),
        BadInput("weight dtype differs from x",
                 lambda d, t: _case(d, torch.float32, w_dtype=torch.bfloat16), "weight"),  # fmt: skip
        BadInput("eps not a number", lambda d, t: _case(d, t, eps="small"), "eps"),
        BadInput("unknown keyword", lambda d, t: _case(d, t, offset=1.0), "offset"),
    ],
)


def add_rms_norm(
    x: Tensor, residual: Tensor, weight: Tensor, eps: float = 1e-6, *, backend: str | None = None
) -> tuple[Tensor, Tensor]:
    """``(rms_norm(x + residual) * weight, x + residual)`` over the last dimension with the
    chosen backend."""
    return registry.call("add_rms_norm", backend, x, residual, weight, eps=eps)


# The backends register themselves, after the spec exists.
from kernellab.ops.add_rms_norm import liger as _liger  # noqa: E402,F401
from kernellab.ops.add_rms_norm import reference as _reference  # noqa: E402,F401
from kernellab.ops.add_rms_norm import triton as _triton  # noqa: E402,F401
