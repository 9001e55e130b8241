"""2-D max pooling, NCHW, forward and backward (issue 18).

    y[n, c, p, q] = max over r, s < kernel_size of x[n, c, p * stride + r, q * stride + s]

As ``torch.nn.functional.max_pool2d(x, kernel_size, stride)`` without padding or
dilation: ``stride`` defaults to ``kernel_size``; P = (H - kernel_size) // stride + 1
(odd sizes floor: the last row / column is dropped as PyTorch drops it). fp32 / fp16 /
bf16; the output is one of the inputs (exact). The forward keeps, per output, the offset
of its maximum inside the window (int8: r * kernel_size + s), all the backward needs:
dx gets dy at that offset (and sums where windows overlap, stride < kernel_size). Ties
go to the first maximum in the window (row-major), and a NaN wins (it propagates), as in
PyTorch (its rule: take v when v > max or v is NaN).

Problem shape for the harness: (N, C, H, W); kernel_size and stride are options.
"""

from __future__ import annotations

import numbers

import torch

from kernellab.core import registry
from kernellab.core.spec import (
    FLOAT_DTYPES,
    BadInput,
    Boundary,
    check_dtype,
    declare,
    fuzz_nchw,
    make_tensor,
)
from kernellab.ops.pool.windows import geometry


def max_pool2d_reference(x, kernel_size=2, stride=None):
    """torch's max_pool2d in x's dtype (float64 in checks)."""
    return torch.nn.functional.max_pool2d(x, kernel_size, stride if stride is not None else kernel_size)


def _opts(options):
    return options.get("kernel_size", 2), options.get("stride")


def _flops(shape, mode, **options):
    n, c, h, w = shape
    k, s, p, q = geometry(h, w, *_opts(options))
    one = n * c * p * q * k * k  # one compare per window element
    return {"fwd": one, "bwd": n * c * h * w, "fwdbwd": one + n * c * h * w}[mode]


def _bytes(shape, dtype, mode, **options):
    n, c, h, w = shape
    k, s, p, q = geometry(h, w, *_opts(options))
    e = torch.empty((), dtype=dtype).element_size()
    xb, yb, ib = n * c * h * w * e, n * c * p * q * e, n * c * p * q  # int8 offsets
    fwd = xb + yb + ib  # read x; write y and the offsets
    bwd = yb + ib + xb  # read dy and the offsets; write dx
    return {"fwd": fwd, "bwd": bwd, "fwdbwd": fwd + bwd}[mode]


def _int_option(name, v, allow_none=False):
    if v is None and allow_none:
        return None
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise TypeError(f"max_pool2d: {name} must be an int{' or None' if allow_none else ''}, got {v!r}")
    if v < 1:
        raise ValueError(f"max_pool2d: {name} must be >= 1, got {v}")
    return int(v)


def validate_max_pool2d(args, kwargs, devices=("cuda", "cpu"), dtypes=FLOAT_DTYPES) -> None:
    if len(args) != 1:
        raise TypeError(f"max_pool2d() takes 1 tensor argument (x), got {len(args)}")
    (x,) = args
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"max_pool2d: x must be a torch.Tensor, got {type(x).__name__}")
    check_dtype("max_pool2d", "x", x, dtypes)
    if x.device.type not in devices:
        raise ValueError(
            f"max_pool2d: x is on {x.device}, but this backend runs on {' or '.join(devices)} tensors only"
        )
    if x.dim() != 4:
        raise ValueError(f"max_pool2d: x must be 4-D [N, C, H, W], got a {x.dim()}-d tensor {tuple(x.shape)}")
    unknown = sorted(set(kwargs) - {"kernel_size", "stride"})
    if unknown:
        raise TypeError(f"max_pool2d() got unexpected keyword arguments {unknown}")
    k = _int_option("kernel_size", kwargs.get("kernel_size", 2))
    _int_option("stride", kwargs.get("stride"), allow_none=True)
    if k > x.shape[2] or k > x.shape[3]:
        raise ValueError(
            f"max_pool2d: kernel_size {k} is larger than the input x ({x.shape[2]}x{x.shape[3]})"
        )


def _x(device, dtype, shape=(2, 3, 6, 6)):
    g = torch.Generator(device=device).manual_seed(0)
    return torch.randn(shape, generator=g, device=device).to(dtype)


def _fuzz(rng, big):
    """Windows of 1-3, strides 1-3 or the window's, images at least one window wide."""
    ks = rng.choice((1, 2, 2, 3))
    opts = {} if ks == 2 else {"kernel_size": ks}
    if rng.random() < 0.4:
        opts["stride"] = rng.choice((1, 2, 3))
    return fuzz_nchw(rng, big, min_hw=ks), opts


SPEC = declare(
    "max_pool2d", ("x",), max_pool2d_reference, _flops, _bytes,
    problem_ranks=(4,), problem_dims="(N, C, H, W)",
    # (N, C, H, W): the smallest image a 2x2 window takes, odd sizes (floor), batch 1,
    # channels not a multiple of 8, an empty batch (1x1 images: kernel_size=1 below)
    test_shapes=[(1, 1, 2, 2), (2, 3, 5, 7), (1, 17, 28, 28), (0, 2, 4, 4), (1, 1, 2, 9), (4, 5, 13, 3)],
    quick_shapes=[(1, 1, 2, 2), (2, 3, 5, 7), (1, 17, 28, 28)],
    # the MNIST model's pools (after conv 1 and conv 2) at batch 64, 256, 1024
    bench_shapes=[(b, c, hw, hw) for b in (64, 256, 1024) for c, hw in ((32, 28), (64, 14))],
    cpu_bench_shapes=[(4, 8, 28, 28)],
    layout_shape=(2, 3, 9, 8),
    reach_shape=(2, 3, 5, 6),
    option_shape=(2, 3, 9, 8),
    option_sets=[
        {"kernel_size": 3},
        {"kernel_size": 3, "stride": 1},
        {"kernel_size": 2, "stride": 3},
        {"kernel_size": 1},
    ],
    grad_args=(0,),
    grad_shapes=[(2, 3, 9, 8), (1, 17, 28, 28)],
    bad_shape=(1, 2, 4, 4),
    fuzz=_fuzz,
    # tied maxima in most windows: dx goes to the first (row-major), in disjoint and
    # in overlapping windows (where the tied gradients also sum)
    boundary_cases=[
        Boundary((2, 3, 6, 7), ties=True),
        Boundary((1, 2, 7, 7), {"kernel_size": 3, "stride": 1}, ties=True),
    ],
    rows_shape=None,
    inputs=lambda shape, dtype, device, gen, layout, scale: (
        None if (t := make_tensor(shape, dtype, device, gen, layout, scale)) is None else (t,)
    ),
    validator=validate_max_pool2d,
    key_validates=True,  # reads each tensor's class, dtype, shape, device, layout; the keyword values
    extra_bad_inputs=[
        BadInput("3-d x", lambda d, t: ((_x(d, t, (3, 6, 6)),), {}), "x"),
        BadInput("kernel_size 0", lambda d, t: ((_x(d, t),), {"kernel_size": 0}), "kernel_size"),
        BadInput("float kernel_size", lambda d, t: ((_x(d, t),), {"kernel_size": 2.0}), "kernel_size"),
        BadInput("stride 0", lambda d, t: ((_x(d, t),), {"stride": 0}), "stride"),
        BadInput("window larger than x", lambda d, t: ((_x(d, t, (1, 1, 3, 1)),), {}), "kernel_size"),
        BadInput("unknown keyword", lambda d, t: ((_x(d, t),), {"padding": 1}), "padding"),
    ],
    default_backends=("cuda", "triton", "torch"),
    doc=__doc__.strip().split("\n")[0],
)


def max_pool2d(
    x: torch.Tensor, kernel_size: int = 2, stride: int | None = None, *, backend: str | None = None
) -> torch.Tensor:
    """Max pooling of ``x`` [N, C, H, W] over kernel_size x kernel_size windows (stride
    defaults to kernel_size) with the chosen backend."""
    return registry.call("max_pool2d", backend, x, kernel_size=kernel_size, stride=stride)


from kernellab.ops.pool import cuda as _cuda  # noqa: E402,F401  (registrations)
from kernellab.ops.pool import reference as _reference  # noqa: E402,F401
from kernellab.ops.pool import triton as _triton  # noqa: E402,F401
