"""What every batch_norm2d backend shares: argument validation (bn_relu_pool2d's too),
input builders, byte and flop counts, and the op-kit declaration around a backend's
launchers.

Contract of a backend's launchers (Triton and CUDA alike), x NCHW [N, C, H, W]:

    fwd(x, w, b, eps, relu) -> (y, mean, rstd)
        x contiguous; w, b: contiguous [C], x's dtype. y: like x (contiguous), relu(y) when
        ``relu``. mean, rstd: fp32 [C], the batch statistics over N, H, W (biased variance),
        saved for the backward.
    bwd(dy, x, w, b, mean, rstd, relu) -> (dx, dw, db)
        dy, x contiguous; dx like x, dw and db [C] in w's dtype. With ``relu`` the kernels
        recompute the pre-activation xhat * w + b from x (the forward's fp32 expression, so
        the same sign) and pass dy where it is > 0: no mask is saved, y is not re-read.

Math per channel c, over its M = N * H * W elements, with xhat = (x - mean) * rstd:
    y  = xhat * w + b,            rstd = 1 / sqrt(mean((x - mean)^2) + eps)
    db = sum(dy),  dw = sum(dy * xhat)
    dx = w * rstd * (dy - db / M - xhat * dw / M)
(the training-mode batch norm of ``torch.batch_norm(..., training=True)``; no running
statistics are kept). ``relu=True`` fuses a ReLU: y = max(y, 0), and dy above is replaced by
dy * (xhat * w + b > 0) - one read and one write of the activation fewer each way than a
separate relu (MNIST's first layer at batch 1024 fp32: 103 MB, ~60 us on an H100).
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import Tensor

from kernellab.core.kit import OpDecl, build, contig, empty_like_contig
from kernellab.core.spec import FLOAT_DTYPES, check_float_tensor, make_tensor

OP = "batch_norm2d"

# --------------------------------------------------------------------------- validation


def check_eps(eps, op: str = OP) -> float:
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
        raise TypeError(f"{op}: eps must be a float, got {type(eps).__name__}")
    eps = float(eps)
    # eps > 0, not >= 0: a channel of one value (batch 1, 1x1 images) or a constant one has
    # variance 0, and only eps keeps rstd finite there.
    if not (eps > 0.0 and math.isfinite(eps)):
        raise ValueError(f"{op}: eps must be finite and > 0, got {eps!r}")
    return eps


def _plain_kwargs(kwargs, relu: bool) -> bool:
    """Whether ``kwargs`` is {} or {eps: float[, relu: bool]} (the fast accept)."""
    if not kwargs:
        return True
    n = len(kwargs)
    return (
        n <= 1 + relu
        and type(kwargs.get("eps", 1.0)) is float
        and type(kwargs.get("relu", False)) is bool
        and ("eps" in kwargs) + ("relu" in kwargs and relu) == n
    )


def validate_channels(args, kwargs, devices, op: str = OP, relu: bool = True, min_hw: int = 0,
                      dtypes=FLOAT_DTYPES) -> None:  # fmt: skip
    """``op(x, weight, bias, eps=...[, relu=...])``: x [N, C, H, W] (H, W >= ``min_hw``),
    weight and bias [C] in x's dtype; shared by batch_norm2d and bn_relu_pool2d."""
    if len(args) == 3 and _plain_kwargs(kwargs, relu):
        x, w, b = args
        # Fast accept of a well-formed call (this runs on every call: a few attribute reads).
        if isinstance(x, Tensor) and isinstance(w, Tensor) and isinstance(b, Tensor) and x.dim() == 4:
            dt, dev, cshape = x.dtype, x.device, (x.shape[1],)
            eps = kwargs.get("eps", 1.0) if kwargs else 1.0
            if (
                dt in dtypes
                and x.layout is torch.strided
                and dev.type in devices
                and x.shape[2] >= min_hw and x.shape[3] >= min_hw
                and w.dtype is dt and b.dtype is dt
                and w.layout is torch.strided and b.layout is torch.strided
                and w.shape == cshape and b.shape == cshape
                and w.device == dev and b.device == dev
                and 0.0 < eps < math.inf
            ):  # fmt: skip
                return
    if len(args) != 3:
        raise TypeError(f"{op}() takes 3 tensor arguments (x, weight, bias), got {len(args)}")
    x = args[0]
    check_float_tensor(op, "x", x, devices, dtypes)
    if x.dim() != 4:
        raise ValueError(f"{op}: x must be 4-D [N, C, H, W], got {x.dim()}-D shape {list(x.shape)}")
    if min_hw and (x.shape[2] < min_hw or x.shape[3] < min_hw):
        raise ValueError(
            f"{op}: x's images must be at least {min_hw}x{min_hw} (one {min_hw}x{min_hw} pooling window), got "
            f"{x.shape[2]}x{x.shape[3]}"
        )
    c = x.shape[1]
    for name, t in zip(("weight", "bias"), args[1:]):
        check_float_tensor(op, name, t, devices, dtypes)
        if t.device != x.device:
            raise ValueError(f"{op}: {name} is on {t.device} but x is on {x.device}")
        if t.dtype != x.dtype:
            raise TypeError(f"{op}: {name} has dtype {t.dtype} but x has {x.dtype}; they must match")
        if t.shape != (c,):
            raise ValueError(f"{op}: {name} must have shape [{c}] (the channels of x), got {list(t.shape)}")
    for k, v in kwargs.items():
        if k == "relu" and relu:
            if not isinstance(v, bool):
                raise TypeError(f"{op}: relu must be a bool, got {v!r}")
            continue
        if k != "eps":
            raise TypeError(f"{op}() got an unexpected keyword argument {k!r}")
        check_eps(v, op)


def validate(args, kwargs, devices, dtypes=FLOAT_DTYPES) -> None:
    """``batch_norm2d(x, weight, bias, eps=..., relu=...)``: x [N, C, H, W], weight and bias [C]."""
    validate_channels(args, kwargs, devices, dtypes=dtypes)


# --------------------------------------------------------------------------- inputs


def inputs(shape, dtype, device, gen, layout, scale):
    """x [N, C, H, W] in ``layout``, weight ~ 1 + N(0, 0.1^2), bias ~ N(0, 0.5^2), contiguous [C]."""
    x = make_tensor(shape, dtype, device, gen, layout, scale)
    if x is None:
        return None
    c = shape[1] if len(shape) > 1 else 1
    w = (1.0 + make_tensor((c,), torch.float32, device, gen, "contiguous", 0.1)).to(dtype)
    b = make_tensor((c,), torch.float32, device, gen, "contiguous", 0.5).to(dtype)
    return x, w, b


def plant_constant_channel(x: Tensor) -> None:
    """Channel 1 constant (0.5) and channel 2 all zeros: variance exactly 0, normalized
    through eps alone (y = bias there)."""
    if x.dim() != 4:
        return
    if x.shape[1] >= 2:
        x[:, 1] = 0.5
    if x.shape[1] >= 3:
        x[:, 2] = 0.0


def count_bytes(shape, dtype, mode, **options):
    """fwd reads x (and w, b) and writes y (+ fp32 stats); bwd reads dy, x, w, the stats
    and writes dx, dw, db. Each input read once: the minimum (the kernels read x twice
    forward and dy, x twice backward: one pass for the statistics, one to apply them)."""
    es = torch.empty((), dtype=dtype).element_size()
    n = math.prod(shape)
    c = shape[1] if len(shape) > 1 else 1
    stats = 2 * 4 * c
    fwd = 2 * n * es + 2 * c * es + stats
    bwd = 3 * n * es + stats + 3 * c * es
    return {"fwd": fwd, "bwd": bwd, "fwdbwd": fwd + bwd}[mode]


def count_flops(shape, mode, **options):
    n = math.prod(shape)
    f, b = 7, 11  # per element: fwd sum, deviation^2, normalize, scale, shift; bwd products + sums
    return {"fwd": f * n, "bwd": b * n, "fwdbwd": (f + b) * n}[mode]


# --------------------------------------------------------------------------- helpers


def dims(x: Tensor) -> tuple[int, int, int, int]:
    """(N, C, HW, M = N * HW) of an NCHW tensor."""
    n, c, h, w = x.shape
    return n, c, h * w, n * h * w


def empty_stats(x: Tensor):
    c = x.shape[1]
    return (
        torch.empty(c, dtype=torch.float32, device=x.device),
        torch.empty(c, dtype=torch.float32, device=x.device),
    )


def _stats_fake(x: Tensor) -> Tensor:
    return x.new_empty(x.shape[1], dtype=torch.float32)


def _bwd_sample(make):
    args = make.args(False)
    x, w, b = args[0], args[1], args[2]
    dy = make(False).to(x.dtype).reshape(x.shape)
    x32 = x.float()
    mean = x32.mean((0, 2, 3))
    rstd = torch.rsqrt(x32.var((0, 2, 3), unbiased=False) + 1e-5)
    return (dy, x, w, b, mean, rstd, True)


# --------------------------------------------------------------------------- the op


def batch_norm_op(name: str, fwd, bwd, triton: bool = False):
    """Custom ops ``kernellab::<name>`` (x, w, b, eps, relu) -> (y, mean, rstd) and
    ``kernellab::<name>_backward`` (dy, x, w, b, mean, rstd, relu) -> (dx, dw, db); returns
    the registry callable ``(x, weight, bias, eps=1e-5, relu=False)`` (see kit.build for the
    eager path)."""

    def _fwd(x: Tensor, w: Tensor, b: Tensor, eps: float, relu: bool) -> tuple[Tensor, Tensor, Tensor]:
        return fwd(contig(x), w, b, eps, relu)

    def _bwd(
        dy: Tensor, x: Tensor, w: Tensor, b: Tensor, mean: Tensor, rstd: Tensor, relu: bool
    ) -> tuple[Tensor, Tensor, Tensor]:
        return bwd(contig(dy), contig(x), w, b, mean, rstd, relu)

    call = build(
        OpDecl(
            name=name,
            fwd=_fwd,
            bwd=_bwd,
            fwd_fake=lambda x, w, b, eps, relu: (empty_like_contig(x), _stats_fake(x), _stats_fake(x)),
            bwd_fake=lambda dy, x, w, b, mean, rstd, relu: (
                empty_like_contig(x), torch.empty_like(w), torch.empty_like(w)
            ),
            save=lambda inputs, out: ((inputs[0], inputs[1], inputs[2], out[1], out[2]), inputs[4]),
            bwd_args=lambda saved, relu, dy: (dy, *saved, relu),
            grads=lambda g, relu: (g[0], g[1], g[2], None, None),
            needs_grad=lambda x, w, b, eps, relu: x.requires_grad or w.requires_grad or b.requires_grad,
            samples=(lambda make: (*make.args(True), 1e-5, True), _bwd_sample),
            triton=triton,
            label=f"batch_norm2d ({name})",
        )
    )

    def batch_norm2d(x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5, relu: bool = False) -> Tensor:
        # The launchers read weight and bias with unit stride: a strided one is packed first.
        return call(x, contig(weight), contig(bias), float(eps), bool(relu))

    batch_norm2d.custom_ops, batch_norm2d.ops, batch_norm2d.__name__ = call.custom_ops, call.ops, name
    batch_norm2d.forward_saving, batch_norm2d.backward_from = call.forward_saving, call.backward_from
    return batch_norm2d
