"""What swiglu's and geglu's specs share: the validator, byte and flop counts, bad inputs
and the common spec fields (semantics: the package docstring)."""

from __future__ import annotations

import math

import torch

from kernellab.core.spec import (
    FLOAT_DTYPES,
    BadInput,
    OpSpec,
    check_float_tensor,
    check_like,
    define,
    device_of,
    elementwise_shapes,
    layout_checking,
    runs_on,
)

# --------------------------------------------------------------------------- validation


def make_validator(op: str, options: tuple[str, ...]):
    """validator(args, kwargs, devices, dtypes) for ``op(a, b, **options)``: two dense
    float tensors of one shape, dtype and device; ``approximate`` (geglu) one of
    ``options``; ``inplace_backward`` a bool. Errors name the argument."""

    def plain(kwargs) -> bool:
        # every keyword known and well formed (the checks below say which is not)
        for k, v in kwargs.items():
            if k == "inplace_backward":
                if v.__class__ is not bool:
                    return False
            elif k != "approximate" or v not in options:
                return False
        return True

    def validate(args, kwargs, devices, dtypes=FLOAT_DTYPES) -> None:
        # Fast accept (runs on every call: a few attribute reads); anything else takes the
        # checks below, which name the offending argument.
        if len(args) == 2 and (not kwargs or plain(kwargs)):
            a, b = args
            if (
                isinstance(a, torch.Tensor)
                and isinstance(b, torch.Tensor)
                and a.dtype in dtypes
                and b.dtype is a.dtype
                and a.layout is torch.strided
                and b.layout is torch.strided
                and a.shape == b.shape
                and runs_on(a, devices)
                and device_of(b) == device_of(a)
            ):
                return
        if len(args) != 2:
            raise TypeError(f"{op}() takes 2 tensor arguments (a, b), got {len(args)}")
        a, b = args
        check_float_tensor(op, "a", a, devices, dtypes)
        check_like(op, "b", b, "a", a, devices, dtypes)
        for k, v in kwargs.items():
            if k == "inplace_backward":
                if not isinstance(v, bool):
                    raise TypeError(f"{op}: inplace_backward must be a bool, got {v!r}")
                continue
            if k != "approximate" or not options:
                raise TypeError(f"{op}() got an unexpected keyword argument {k!r}")
            if not isinstance(v, str) or v not in options:
                allowed = ", ".join(map(repr, options))
                raise ValueError(f"{op}: approximate must be one of {allowed}, got {v!r}")

    return layout_checking(validate)


# --------------------------------------------------------------------------- counts


def _bytes(shape, dtype, mode, **options):
    n = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    # fwd: read a, b, write y. bwd: read dy, a, b, write da, db (the activation recomputed
    # from a: nothing saved beyond the inputs). fwdbwd: both.
    return {"fwd": 3 * n, "bwd": 5 * n, "fwdbwd": 8 * n}[mode]


# --------------------------------------------------------------------------- bad inputs


def _pair(device, dtype):
    g = torch.Generator(device=device).manual_seed(0)
    return tuple(torch.randn(4, 33, generator=g, device=device).to(dtype) for _ in range(2))


def _int_b(device, dtype):
    a, b = _pair(device, dtype)
    return (a, b.to(torch.int32)), {}


def bad_approximate(device, dtype):
    return _pair(device, dtype), {"approximate": "erf"}


def _unknown_option(device, dtype):
    return _pair(device, dtype), {"alpha": 1.0}


def _int_inplace(device, dtype):
    return _pair(device, dtype), {"inplace_backward": 1}


# --------------------------------------------------------------------------- spec


def define_glu(
    name: str, reference, flops, options: tuple[str, ...], doc: str, *, option_sets, bad_options=()
) -> OpSpec:
    """Define the OpSpec of one GLU: its own ``name``, ``reference``, ``flops``, ``options``
    (the ``approximate`` values it takes), the first line of ``doc``, ``option_sets`` and the
    bad inputs of its own options (``bad_options``), over what both share: arguments (a, b),
    bytes, shapes, specials, the in-place mode, the shared bad inputs."""
    return define(
        OpSpec(
            name=name,
            reference=reference,
            flops=flops,
            validator=make_validator(name, options),
            option_sets=option_sets,
            extra_bad_inputs=[
                BadInput("integer b", _int_b, "b"),
                *bad_options,
                BadInput("unknown keyword", _unknown_option, "alpha"),
                BadInput("inplace_backward not a bool", _int_inplace, "inplace_backward"),
            ],
            arg_names=("a", "b"),
            bytes_moved=_bytes,
            test_shapes=elementwise_shapes(),
            quick_shapes=[(0,), (1,), (1025,), (129, 1000)],
            bench_shapes=[(2**p,) for p in (16, 20, 24, 26)],
            cpu_bench_shapes=[(2**p,) for p in (10, 14, 18)],
            layout_shape=(37, 1025),
            reach_shape=(5, 1025),
            grad_args=(0, 1),
            scale=3.0,  # both tails of the activation
            # |a| up to 1e3: with |b| ~ 3 the product stays finite in fp16
            specials=(float("nan"), float("inf"), float("-inf"), 1e3, -1e3, 60.0, -60.0),
            rows_shape=(65537, 3),
            default_backends=("triton", "torch"),
            # documented in-place mode: the backward writes da and db into a's and b's buffers
            inplace_options={"inplace_backward": ("a", "b")},
            key_validates=True,
            doc=doc.strip().split("\n")[0],
        )
    )
