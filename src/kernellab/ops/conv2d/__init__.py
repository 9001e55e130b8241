"""2-D convolution (cross-correlation, as PyTorch's), NCHW, forward and backward (issue 18).

    y[n, k, p, q] = bias[k] + sum_{c, r, s} x[n, c, p*sh - ph + r, q*sw - pw + s] * w[k, c, r, s]

x [N, C, H, W], w [K, C, R, S], bias [K] or None; y [N, K, P, Q] with
P = (H + 2 ph - R) // sh + 1, Q = (W + 2 pw - S) // sw + 1 (zero padding, no dilation,
no groups). ``stride`` (>= 1) and ``padding`` (>= 0) are an int or an (h, w) pair.
fp32 / fp16 / bf16 storage (x, w and bias share one dtype), fp32 accumulation, one
rounding at the end. Gradients for x, w and bias. As ``torch.nn.functional.conv2d``.

Problem shape for the harness: (N, C, H, W, K, R, S); stride and padding are options.

Backends (see each file): manual (unfold + matmul), torch (cuDNN), compile, triton
(implicit GEMM, forward / dgrad / wgrad), cuda_v1 (one output per thread), cuda_v2
(input tile and filter in shared memory), cuda (implicit GEMM, shared-memory tiles,
register blocking; v1 and v2 reuse its backward), fft (convolution theorem via torch.fft,
for teaching).
"""

from __future__ import annotations

import math

import torch

from kernellab.core import registry
from kernellab.core.spec import (
    FLOAT_DTYPES,
    BadInput,
    check_float_tensor,
    declare,
    fuzz_dim,
    fuzz_nchw,
    make_tensor,
)
from kernellab.ops.conv2d.geometry import as_pair, out_size


def conv2d_reference(x, w, bias=None, stride=1, padding=0):
    """torch's conv2d in x's dtype (float64 in checks)."""
    return torch.nn.functional.conv2d(x, w, bias, stride=stride, padding=padding)


# --------------------------------------------------------------------------- counts


def _geom(shape, options):
    n, c, h, w, k, r, s = shape
    stride = as_pair(options.get("stride", 1), "stride", 1)
    padding = as_pair(options.get("padding", 0), "padding", 0)
    p, q = out_size(h, w, r, s, stride, padding)
    return n, c, h, w, k, r, s, p, q


def _flops(shape, mode, **options):
    n, c, h, w, k, r, s, p, q = _geom(shape, options)
    one = 2 * n * k * p * q * c * r * s  # a multiply and an add per (output, c, r, s)
    # backward: dgrad and wgrad are each one forward's worth of products
    return {"fwd": one, "bwd": 2 * one, "fwdbwd": 3 * one}[mode]


def _bytes(shape, dtype, mode, **options):
    n, c, h, w, k, r, s, p, q = _geom(shape, options)
    e = torch.empty((), dtype=dtype).element_size()
    xb, wb, bb, yb = n * c * h * w * e, k * c * r * s * e, k * e, n * k * p * q * e
    fwd = xb + wb + bb + yb  # read x, w, bias; write y
    bwd = yb + xb + wb + xb + wb + bb  # read dy, x, w; write dx, dw, dbias
    return {"fwd": fwd, "bwd": bwd, "fwdbwd": fwd + bwd}[mode]


# --------------------------------------------------------------------------- inputs


def make_conv_inputs(shape, dtype, device, gen, layout="contiguous", scale=1.0):
    """x [N, C, H, W] in ``layout``; w [K, C, R, S] ~ N(0, 1 / (C R S)) (outputs ~ N(0, 1)),
    bias [K] ~ N(0, 1), both contiguous."""
    n, c, h, wd, k, r, s = shape
    x = make_tensor((n, c, h, wd), dtype, device, gen, layout, scale)
    if x is None:
        return None
    fan = max(1, c * r * s)
    w = make_tensor((k, c, r, s), torch.float32, device, gen, "contiguous", 1.0 / math.sqrt(fan)).to(dtype)
    b = make_tensor((k,), dtype, device, gen, "contiguous", 1.0)
    return x, w, b


# --------------------------------------------------------------------------- validation


def validate_conv2d(args, kwargs, devices=("cuda", "cpu"), dtypes=FLOAT_DTYPES) -> None:
    """Raise TypeError/ValueError naming the argument (x, w, bias, stride, padding)."""
    if len(args) != 3:
        raise TypeError(f"conv2d() takes 3 tensor arguments (x, w, bias), got {len(args)}")
    x, w, b = args
    check_float_tensor("conv2d", "x", x, devices, dtypes)
    check_float_tensor("conv2d", "w", w, devices, dtypes)
    if x.dim() != 4:
        raise ValueError(f"conv2d: x must be 4-D [N, C, H, W], got a {x.dim()}-d tensor {tuple(x.shape)}")
    if w.dim() != 4:
        raise ValueError(f"conv2d: w must be 4-D [K, C, R, S], got a {w.dim()}-d tensor {tuple(w.shape)}")
    if w.device != x.device:
        raise ValueError(f"conv2d: w is on {w.device} but x is on {x.device}")
    if w.dtype != x.dtype:
        raise TypeError(f"conv2d: w has dtype {w.dtype} but x has {x.dtype}; they must match")
    if w.shape[1] != x.shape[1]:
        raise ValueError(
            f"conv2d: w has {w.shape[1]} input channels (w [K, C, R, S] = {tuple(w.shape)}) but x has "
            f"{x.shape[1]} (x [N, C, H, W] = {tuple(x.shape)})"
        )
    if b is not None:
        check_float_tensor("conv2d", "bias", b, devices, dtypes)
        if b.device != x.device:
            raise ValueError(f"conv2d: bias is on {b.device} but x is on {x.device}")
        if b.dtype != x.dtype:
            raise TypeError(f"conv2d: bias has dtype {b.dtype} but x has {x.dtype}; they must match")
        if tuple(b.shape) != (w.shape[0],):
            raise ValueError(f"conv2d: bias must have shape [{w.shape[0]}] (K), got {list(b.shape)}")
    unknown = sorted(set(kwargs) - {"stride", "padding"})
    if unknown:
        raise TypeError(f"conv2d() got unexpected keyword arguments {unknown}")
    as_pair(kwargs.get("stride", 1), "stride", 1)  # (refuses a bad stride, naming it)
    padding = as_pair(kwargs.get("padding", 0), "padding", 0)
    r, s = w.shape[2], w.shape[3]
    h, wd = x.shape[2] + 2 * padding[0], x.shape[3] + 2 * padding[1]
    if r > h or s > wd:
        raise ValueError(
            f"conv2d: the kernel w ({r}x{s}) is larger than the padded input x "
            f"({h}x{wd} = {tuple(x.shape[2:])} + 2 x padding {padding})"
        )
    if min(r, s) < 1 or w.shape[0] < 1 or x.shape[1] < 1:
        raise ValueError(
            f"conv2d: w must have K >= 1, C >= 1 and a kernel of at least 1x1, got {tuple(w.shape)}"
        )


# --------------------------------------------------------------------------- bad inputs


def _xw(device, dtype, xs=(2, 3, 6, 6), ws=(4, 3, 3, 3)):
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(xs, generator=g, device=device).to(dtype)
    w = torch.randn(ws, generator=g, device=device).to(dtype)
    return x, w


_EXTRA_BAD = [
    BadInput("3-d x", lambda d, t: ((*_xw(d, t, xs=(3, 6, 6)), None), {}), "x"),
    BadInput("5-d w", lambda d, t: ((*_xw(d, t, ws=(4, 3, 3, 3, 1)), None), {}), "w"),
    BadInput("mismatched channels", lambda d, t: ((*_xw(d, t, ws=(4, 5, 3, 3)), None), {}), "w"),
    BadInput(
        "bias of the wrong length",
        lambda d, t: ((*_xw(d, t), torch.zeros(3, device=d, dtype=t)), {}),
        "bias",
    ),
    BadInput(
        "bias dtype differs",
        lambda d, t: ((*_xw(d, t), torch.zeros(4, device=d, dtype=torch.float64)), {}),
        "bias",
    ),
    BadInput(
        "mismatched dtypes",
        lambda d, t: ((lambda p: (p[0].float(), p[1].half(), None))(_xw(d, t)), {}),
        "w",
    ),
    BadInput("negative padding", lambda d, t: ((*_xw(d, t), None), {"padding": -1}), "padding"),
    BadInput("stride 0", lambda d, t: ((*_xw(d, t), None), {"stride": 0}), "stride"),
    BadInput("float stride", lambda d, t: ((*_xw(d, t), None), {"stride": 1.5}), "stride"),
    BadInput(
        "kernel larger than the padded input",
        lambda d, t: ((*_xw(d, t, xs=(2, 3, 2, 2)), None), {}),
        "w",
    ),
    BadInput("unknown keyword", lambda d, t: ((*_xw(d, t), None), {"dilation": 2}), "dilation"),
]


def _fuzz(rng, big):
    """(N, C, H, W, K, R, S) with strides 1-3 and paddings 0 to past half the kernel per
    side (at least what a kernel larger than the image needs), no bias a fifth of the time."""
    n, c, h, w = fuzz_nchw(rng, big)
    k = fuzz_dim(rng, 1, 128 if big else 16)
    r = rng.choice((1, 3, 3, 5, 7))
    s = r if rng.random() < 0.8 else rng.choice((1, 3, 5))
    pad = tuple(max(rng.randint(0, e // 2 + 1), -(-(e - size) // 2)) for e, size in ((r, h), (s, w)))
    stride = (rng.choice((1, 1, 2, 3)), rng.choice((1, 1, 2, 3))) if rng.random() < 0.3 else (1, 1)
    opts = {}
    if stride != (1, 1):
        opts["stride"] = stride if stride[0] != stride[1] else stride[0]
    if pad != (0, 0):
        opts["padding"] = pad if pad[0] != pad[1] else pad[0]
    if rng.random() < 0.2:
        opts["bias"] = None
    return (n, c, h, w, k, r, s), opts


SPEC = declare(
    "conv2d", ("x", "w", "bias"), conv2d_reference, _flops, _bytes,
    problem_ranks=(7,), problem_dims="(N, C, H, W, K, R, S): x N x C x H x W, K filters of R x S",
    # (N, C, H, W, K, R, S): a 1x1 image, odd sizes, batch 1, channels not a multiple
    # of 8, kernels 1, 3 and 5, an empty batch (stride and padding: option_sets)
    test_shapes=[
        (1, 1, 1, 1, 1, 1, 1),
        (2, 3, 5, 7, 4, 3, 3),
        (1, 5, 9, 9, 6, 5, 5),
        (2, 17, 6, 5, 9, 1, 1),
        (3, 1, 12, 12, 8, 3, 3),
        (0, 3, 5, 5, 4, 3, 3),
        (2, 9, 11, 10, 33, 3, 3),
    ],
    quick_shapes=[(1, 1, 1, 1, 1, 1, 1), (2, 3, 5, 7, 4, 3, 3), (1, 5, 9, 9, 6, 5, 5)],
    # the MNIST model's layers (padding 1, see bench_options) and a large layer
    bench_shapes=[
        (64, 1, 28, 28, 32, 3, 3),
        (64, 32, 14, 14, 64, 3, 3),
        (256, 1, 28, 28, 32, 3, 3),
        (256, 32, 14, 14, 64, 3, 3),
        (1024, 1, 28, 28, 32, 3, 3),
        (1024, 32, 14, 14, 64, 3, 3),
        (32, 64, 56, 56, 64, 3, 3),
    ],
    cpu_bench_shapes=[(4, 1, 28, 28, 8, 3, 3)],
    bench_options=[{"padding": 1}],
    layout_shape=(2, 3, 7, 6, 5, 3, 3),
    reach_shape=(2, 3, 5, 6, 4, 3, 3),
    option_shape=(2, 3, 7, 6, 5, 3, 3),
    option_sets=[
        {"padding": 1},
        {"padding": 2},
        {"stride": 2},
        {"stride": 2, "padding": 1},
        {"stride": (2, 1), "padding": (1, 2)},
        {"bias": None},
    ],
    grad_args=(0, 1, 2),
    grad_shapes=[(2, 3, 7, 6, 5, 3, 3), (1, 4, 5, 5, 3, 5, 5)],
    bad_shape=(1, 2, 4, 4, 3, 3, 3),
    rows_shape=None,
    metric="tflops",
    inputs=make_conv_inputs,
    validator=validate_conv2d,
    key_validates=True,  # reads each tensor's class, dtype, shape, device, layout; the keyword values
    fuzz=_fuzz,
    extra_bad_inputs=_EXTRA_BAD,
    default_backends=("torch",),
    doc=__doc__.strip().split("\n")[0],
)


def conv2d(
    x: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None = None,
    stride=1,
    padding=0,
    *,
    backend: str | None = None,
) -> torch.Tensor:
    """2-D convolution of ``x`` [N, C, H, W] with ``w`` [K, C, R, S] (+ ``bias`` [K]) with
    the chosen backend."""
    return registry.call("conv2d", backend, x, w, bias, stride=stride, padding=padding)


from kernellab.ops.conv2d import cuda as _cuda  # noqa: E402,F401  (registrations)
from kernellab.ops.conv2d import reference as _reference  # noqa: E402,F401
from kernellab.ops.conv2d import triton as _triton  # noqa: E402,F401
