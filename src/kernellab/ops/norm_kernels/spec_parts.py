"""What the norms' specs share (layer_norm, rms_norm, add_rms_norm): argument validation,
input builders, byte and flop counts, and the family's test, bench and check fields."""

from __future__ import annotations

import math
import numbers

import torch
from torch import Tensor

from kernellab.core.spec import (
    FLOAT_DTYPES,
    Boundary,
    OpSpec,
    check_float_tensor,
    define,
    device_of,
    fuzz_rows,
    layout_checking,
    make_tensor,
    per_element_flops,
    runs_on,
)

# --------------------------------------------------------------------------- validation


def check_eps(op: str, eps) -> float:
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
        raise TypeError(f"{op}: eps must be a float, got {type(eps).__name__}")
    eps = float(eps)
    if not (eps >= 0.0 and math.isfinite(eps)):
        raise ValueError(f"{op}: eps must be finite and >= 0, got {eps!r}")
    return eps


def make_validator(op: str, arg_names: tuple[str, ...]):
    """validator(args, kwargs, devices) for ``op(x, weight[, bias], *, eps)``; it checks
    every tensor's layout (the fast accept and check_float_tensor both do)."""
    n = len(arg_names)

    def validate(args, kwargs, devices, dtypes=FLOAT_DTYPES) -> None:
        # Fast accept for well-formed calls (this runs on every call: a few attribute reads);
        # anything else takes the checks below, which name the offending argument.
        if len(args) == n and (not kwargs or (len(kwargs) == 1 and type(kwargs.get("eps")) is float)):
            x, w = args[0], args[1]
            b = args[2] if n == 3 else None
            if isinstance(x, Tensor) and isinstance(w, Tensor) and (b is None or isinstance(b, Tensor)):
                # (device_of / runs_on / ndim: the cheapest reads of each fact)
                dt, dev = x.dtype, device_of(x)
                eps = kwargs.get("eps", 0.0) if kwargs else 0.0
                if (
                    dt in dtypes
                    and x.layout is torch.strided
                    and x.ndim
                    and runs_on(x, devices)
                    and w.dtype is dt
                    and w.layout is torch.strided
                    and w.ndim == 1
                    and w.shape[0] == x.shape[-1]
                    and device_of(w) == dev
                    and (
                        b is None
                        or (
                            b.dtype is dt
                            and b.layout is torch.strided
                            and b.ndim == 1
                            and b.shape[0] == w.shape[0]
                            and device_of(b) == dev
                        )
                    )
                    and 0.0 <= eps < math.inf
                ):
                    return
        if len(args) != n:
            raise TypeError(f"{op}() takes {n} tensor arguments ({', '.join(arg_names)}), got {len(args)}")
        x = args[0]
        check_float_tensor(op, "x", x, devices, dtypes)
        if x.dim() == 0:
            raise ValueError(f"{op}: x must have at least one dimension, got a 0-d tensor")
        d = x.shape[-1]
        for name, t in zip(arg_names[1:], args[1:]):
            if t is None and name == "bias":
                continue
            check_float_tensor(op, name, t, devices, dtypes)
            if t.device != x.device:
                raise ValueError(f"{op}: {name} is on {t.device} but x is on {x.device}")
            if t.dtype != x.dtype:
                raise TypeError(f"{op}: {name} has dtype {t.dtype} but x has {x.dtype}; they must match")
            if t.shape != (d,):
                raise ValueError(
                    f"{op}: {name} must have shape [{d}] (the last dimension of x), got {list(t.shape)}"
                )
        for k, v in kwargs.items():
            if k != "eps":
                raise TypeError(f"{op}() got an unexpected keyword argument {k!r}")
            check_eps(op, v)

    return layout_checking(validate)


# --------------------------------------------------------------------------- inputs


def make_inputs_fn(with_bias: bool):
    """inputs(shape, dtype, device, gen, layout, scale): x of ``shape`` in ``layout``,
    weight (and bias) ~ 1 + N(0, 0.1^2), contiguous [D]."""

    def inputs(shape, dtype, device, gen, layout, scale):
        x = make_tensor(shape, dtype, device, gen, layout, scale)
        if x is None:
            return None
        d = shape[-1] if shape else 1
        w = (1.0 + make_tensor((d,), torch.float32, device, gen, "contiguous", 0.1)).to(dtype)
        if not with_bias:
            return x, w
        b = (1.0 + make_tensor((d,), torch.float32, device, gen, "contiguous", 0.1)).to(dtype)
        return x, w, b

    return inputs


def plant_constant_rows(x: Tensor) -> None:
    """Row 1 constant (0.5: its fp32 sum is exact, so the variance is exactly 0) and row 2
    all zeros: both normalize through the eps term alone (layer_norm: y = bias there)."""
    if x.dim() < 2 or not x.is_contiguous():
        return
    rows = x.reshape(-1, x.shape[-1])
    if rows.shape[0] >= 2:
        rows[1].fill_(0.5)
    if rows.shape[0] >= 3:
        rows[2].zero_()


def counts(with_bias: bool, rms: bool):
    """(flops, bytes_moved) for the spec. Bytes: fwd reads x (+ w, b) and writes y and the
    fp32 row statistics; bwd reads dy, x, w and the statistics and writes dx, dw (, db)."""

    def _bytes(shape, dtype, mode, **options):
        es = torch.empty((), dtype=dtype).element_size()
        n = math.prod(shape)
        d = shape[-1] if shape else 1
        rows = n // d if d else 0
        stats = (1 if rms else 2) * 4 * rows
        params = (2 if with_bias else 1) * d * es
        fwd = 2 * n * es + params + stats
        bwd = 3 * n * es + stats + 2 * params
        return {"fwd": fwd, "bwd": bwd, "fwdbwd": fwd + bwd}[mode]

    # per element: fwd sum/sq/scale, bwd products + sums
    return per_element_flops(4, 9) if rms else per_element_flops(7, 12), _bytes


# --------------------------------------------------------------------------- spec fields


def define_norm(name: str, arg_names: tuple[str, ...], reference, counts, doc: str, **fields) -> OpSpec:
    """Define the OpSpec of one norm of the family: its own ``name``, ``arg_names`` (every one
    differentiable), ``reference``, ``counts`` (flops, bytes_moved), the first line of
    ``doc`` and ``fields`` (inputs, validator, options, bad inputs), over what the family's
    specs share: test, bench and check shapes (rows of odd widths, one very tall narrow
    tensor, widths past one block), defaults, and validation that also builds the shape key
    (fresh lists per spec: no spec shares a mutable field with another)."""
    flops, bytes_moved = counts
    return define(
        OpSpec(
            name=name,
            arg_names=arg_names,
            reference=reference,
            flops=flops,
            bytes_moved=bytes_moved,
            grad_args=tuple(range(len(arg_names))),
            doc=doc.strip().split("\n")[0],
            key_validates=True,
            test_shapes=[(0, 7), (1,), (17,), (3, 123), (5, 1025), (2, 3, 257), (65537, 3), (4, 4097),
                         (3, 8192)],  # fmt: skip
            quick_shapes=[(0, 7), (1,), (3, 123), (4, 1025)],
            bench_shapes=[(16384, 4096)],
            cpu_bench_shapes=[(64, 1024)],
            layout_shape=(37, 1025),
            reach_shape=(5, 1025),
            rows_shape=(65537, 3),
            grad_shapes=[(37, 1025), (1025,)],
            bad_shape=(4, 33),
            scale=2.0,
            plant_extra=plant_constant_rows,
            default_backends=("cuda", "triton", "torch"),
            fuzz=fuzz_rows(5000, 20000),
            # (17, 4099): a row past 4096 (the quick widths stop at 1025) and, at 69,683
            # elements, the Triton backward's row-group kernel and partial sums (smaller
            # inputs take the one-launch backward). (67, 40): more rows than one program
            # holds (64 in the forward, 64 a step in the small backward at this width), with
            # a short last group: dweight and dbias must sum every group.
            boundary_cases=[Boundary((17, 4099)), Boundary((67, 40))],
            **fields,
        )
    )
