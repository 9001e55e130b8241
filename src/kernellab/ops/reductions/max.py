"""max (values and indices) and argmax over the last dimension (issue 3, reductions).

    max(x, dim=-1)    -> (values, indices), as torch.max(x, dim)
    argmax(x, dim=-1) -> indices (int64), as torch.argmax(x, dim)

Semantics are torch's: the index of the *first* occurrence of the largest value; a row
that holds NaN gives NaN and the index of its first NaN (torch.max propagates NaN); a
row of -inf gives -inf and index 0. The check compares indices exactly, so ties (common
in bf16) must break to the first index. A reduction over an empty dim has no answer:
refused with a ValueError, as torch refuses it. fp32 / fp16 / bf16; values keep the
input's dtype (they are input elements, exact).

Gradient of max: dy scattered to the argmax positions (zeros elsewhere), what torch's
own backward does. argmax is not differentiable.

Registered as two ops sharing the kernels: ``max`` (two outputs) and ``argmax`` (the
same kernel without the values store).
"""

from __future__ import annotations

import math
from collections import namedtuple

import torch

from kernellab.core import registry
from kernellab.core.spec import FLOAT_DTYPES, BadInput, Boundary, OpSpec, define, fuzz_rows
from kernellab.ops.reductions._kit import check_x

MaxResult = namedtuple("MaxResult", ["values", "indices"])


def max_reference(x: torch.Tensor):
    v, i = torch.max(x, dim=-1)
    return v, i


def argmax_reference(x: torch.Tensor):
    return torch.argmax(x, dim=-1)


def _rows(shape):
    return math.prod(shape[:-1]) if len(shape) else 1


def _max_bytes(shape, dtype, mode):
    es = torch.empty((), dtype=dtype).element_size()
    n, r = math.prod(shape), _rows(shape)
    fwd = n * es + r * (es + 8)  # read x; write values and int64 indices
    # backward: read dy and the indices, write dx (zeros and the scattered dy)
    return fwd if mode == "fwd" else fwd + r * (es + 8) + n * es


def _argmax_bytes(shape, dtype, mode):
    es = torch.empty((), dtype=dtype).element_size()
    return math.prod(shape) * es + _rows(shape) * 8


def _flops(shape, mode):
    return math.prod(shape)  # one comparison per element


def validate_rows(op: str):
    def validate(args, kwargs, devices, dtypes=FLOAT_DTYPES) -> None:
        if len(args) != 1:
            raise TypeError(f"{op}() takes 1 tensor argument (x), got {len(args)}")
        x = args[0]
        check_x(x, devices, op, dtypes)
        if kwargs:
            raise TypeError(f"{op}() got unexpected keyword arguments {sorted(kwargs)}")
        if x.dim() and x.shape[-1] == 0:
            raise ValueError(
                f"{op}: x has shape {tuple(x.shape)}: its last dim is empty, and there is no "
                "maximum of zero elements"
            )

    return validate


def _plant_rows(x: torch.Tensor) -> None:
    """A fully -inf row (answer: index 0), a tie at both ends of a row (the first wins),
    and a row with two NaNs (the first NaN's index)."""
    if not x.is_contiguous() or x.dim() < 2 or x.shape[-1] < 8:
        return
    rows = x.reshape(-1, x.shape[-1])
    if rows.shape[0] < 4:
        return
    rows[1].fill_(float("-inf"))
    top = rows[2].float().nan_to_num(0.0, 0.0, 0.0).abs().max() + 1
    rows[2, 3] = top
    rows[2, -1] = top
    rows[3, 5] = float("nan")
    rows[3, 7] = float("nan")


def _empty_rows(device, dtype):
    return (torch.empty(3, 0, device=device, dtype=dtype),), {}


def _unknown_kw(device, dtype):
    return (torch.randn(3, 4, device=device).to(dtype),), {"dim": 0}


_COMMON = dict(
    arg_names=("x",),
    flops=_flops,
    test_shapes=[
        (0, 7),
        (1,),
        (17,),
        (1023,),
        (3, 123),
        (5, 1025),
        (2, 3, 257),
        (65537, 3),
        (4, 4097),
        (2, 20000),
        (129, 1000),
    ],
    quick_shapes=[(0, 7), (1,), (3, 123), (2, 9000)],
    bench_shapes=[(32768, 4096)],
    cpu_bench_shapes=[(64, 1024)],
    layout_shape=(37, 1025),
    reach_shape=(5, 1025),
    scale=3.0,
    plant_extra=_plant_rows,
    rows_shape=(65537, 3),
    fuzz=fuzz_rows(6000, 160000),  # argmax over a vocabulary: greedy decoding
    # every row holds its maximum several times: the first index wins, and max's gradient
    # goes there alone (the specials plant one tie, forward only)
    boundary_cases=[Boundary((6, 33), ties=True)],
    default_backends=("cuda", "triton", "torch"),
    key_validates=True,
    extra_bad_inputs=[
        BadInput("empty last dim", _empty_rows, "x"),
        BadInput("unknown keyword", _unknown_kw, "dim", exc=(TypeError,)),
    ],
)

SPEC = define(
    OpSpec(
        name="max",
        reference=max_reference,
        bytes_moved=_max_bytes,
        grad_args=(0,),
        modes=("fwd", "fwdbwd"),
        validator=validate_rows("max"),
        doc="max over the last dim: values and indices (torch.max(x, -1))",
        **_COMMON,
    )
)

ARGMAX_SPEC = define(
    OpSpec(
        name="argmax",
        reference=argmax_reference,
        bytes_moved=_argmax_bytes,
        modes=("fwd",),
        validator=validate_rows("argmax"),
        doc="argmax over the last dim (torch.argmax(x, -1)), int64",
        **_COMMON,
    )
)


def _last(x, dim, op):
    if not isinstance(x, torch.Tensor):
        return x  # the registry's validation names x
    nd = x.dim() or 1  # (the builtin max is shadowed in this module)
    if isinstance(dim, bool) or not isinstance(dim, int) or not -nd <= dim < nd:
        raise ValueError(f"{op}: dim must be an int in [{-nd}, {nd - 1}], got {dim!r}")
    if x.dim() and dim % x.dim() != x.dim() - 1:
        return x.movedim(dim, -1)  # the reduced dim last; the others keep their order
    return x


def max(x: torch.Tensor, dim: int = -1, *, backend: str | None = None) -> MaxResult:  # noqa: A001
    """(values, indices) of the maximum of ``x`` along ``dim``, as ``torch.max(x, dim)``."""
    v, i = registry.call("max", backend, _last(x, dim, "max"))
    return MaxResult(v, i)


def argmax(x: torch.Tensor, dim: int = -1, *, backend: str | None = None) -> torch.Tensor:
    """Index (int64) of the first maximum of ``x`` along ``dim`` (NaN counts as the
    maximum), as ``torch.argmax(x, dim)``."""
    return registry.call("argmax", backend, _last(x, dim, "argmax"))
