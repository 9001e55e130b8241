"""Transpose of the last two dims, out of place (issue 45, memory access patterns).

    transpose(x) = x.transpose(-2, -1).contiguous()      x: [..., R, C] -> y: [..., C, R]

x has 2 or more dims; the leading ones are a batch (each [R, C] matrix is transposed on
its own). fp32 / fp16 / bf16; the output has x's dtype, is always a new contiguous tensor
(``torch`` excepted: ``.contiguous()`` returns x's storage when x already is the transpose
of a contiguous tensor), and is exact: values are moved, never rounded, so every backend's
error against the float64 reference is 0.

Layouts. The Triton kernel reads any strides in place. The CUDA kernels read rows with any
row and batch stride (slices of rows, expanded rows or batches, a storage offset) but need
a unit column stride: other inputs (``x[..., ::2]``, an input that is itself transposed)
are packed with ``.contiguous()`` first, one more pass over x. The 16-byte kernel (v5)
also needs R and C multiples of 16 bytes of elements (4 fp32, 8 fp16/bf16) and 16-byte
aligned rows; elsewhere the CUDA backends run v4, which takes any size and alignment.

The gradient of a transpose is the transpose of dy: the backward runs the same backend's
forward on dy. Bytes moved: x read once and y written once (2 x numel x element size);
the backward the same again.
"""

from __future__ import annotations

import math

import torch

from kernellab.core import registry
from kernellab.core.spec import (
    FLOAT_DTYPES,
    BadInput,
    Boundary,
    check_float_tensor,
    declare,
    fuzz_dim,
    layout_checking,
)


def transpose_reference(x: torch.Tensor) -> torch.Tensor:
    """x.transpose(-2, -1), contiguous, in x's dtype (float64 in checks): exact."""
    return x.transpose(-2, -1).contiguous()


def _bytes(shape, dtype, mode, **options):
    # read x, write y; the backward reads dy and writes dx
    n = 2 * math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    return {"fwd": n, "bwd": n, "fwdbwd": 2 * n}[mode]


def _flops(shape, mode, **options):
    return 0  # data movement only


@layout_checking
def _validate(args, kwargs, devices, dtypes=FLOAT_DTYPES) -> None:
    if len(args) != 1:
        raise TypeError(f"transpose() takes 1 tensor argument (x), got {len(args)}")
    x = args[0]
    check_float_tensor("transpose", "x", x, devices, dtypes)
    if kwargs:
        raise TypeError(f"transpose() got unexpected keyword arguments {sorted(kwargs)}")
    if x.dim() < 2:
        raise ValueError(
            f"transpose: x has {x.dim()} dim(s), shape {tuple(x.shape)}; expected 2 or more "
            "(the last two are swapped, the leading ones are a batch)"
        )


def _one_dim(device, dtype):
    return (torch.randn(33, device=device).to(dtype),), {}


def _zero_dim(device, dtype):
    return (torch.randn((), device=device).to(dtype),), {}


def _unknown_kw(device, dtype):
    return (torch.randn(4, 5, device=device).to(dtype),), {"dims": (0, 1)}


def _fuzz(rng, big: bool):
    """[R, C] or [B, R, C]: sides leaning to tile edges (powers of two and one off them),
    up to 2^13 elements (2^24 on a GPU)."""
    budget = (1 << 24) if big else (1 << 13)
    r = fuzz_dim(rng, 1, 4096 if big else 256)
    c = fuzz_dim(rng, 1, max(1, min(16384 if big else 256, budget // r)))
    if rng.random() < 0.5:
        return (r, c), {}
    return (fuzz_dim(rng, 1, max(1, min(64, budget // (r * c)))), r, c), {}


SPEC = declare(
    "transpose", ("x",), transpose_reference, _flops, _bytes,
    problem_ranks=tuple(range(2, 9)), problem_dims="(..., R, C): the last two dims swapped",
    test_shapes=[
        (0, 5),
        (5, 0),
        (1, 1),
        (1, 17),
        (17, 1),
        (17, 113),
        (113, 17),
        (1023, 1025),
        (65, 129),
        (2, 0, 3),
        (3, 17, 113),
        (2, 3, 33, 65),
        (65537, 3),
        (3, 65537),
    ],
    quick_shapes=[(0, 5), (1, 1), (17, 113), (3, 65, 129)],
    bench_shapes=[(4096, 4096), (8192, 8192), (4096, 14336), (1023, 1025)],
    cpu_bench_shapes=[(256, 256), (1023, 1025)],
    layout_shape=(67, 131),
    reach_shape=(5, 131),
    grad_args=(0,),
    validator=_validate,
    key_validates=True,
    fuzz=_fuzz,
    rows_shape=(65537, 3),  # more rows than a grid's y holds: and as output columns
    # partial 64-row and 256-byte tiles of the 16-byte kernel (sizes multiples of 8, so it
    # runs on a GPU), with a batch; and one full tile each way
    boundary_cases=[Boundary((3, 72, 136)), Boundary((64, 128))],
    bad_shape=(5, 33),
    default_backends=("cuda", "triton", "torch"),
    extra_bad_inputs=[
        BadInput("a 1-d tensor", _one_dim, "x"),
        BadInput("a 0-d tensor", _zero_dim, "x"),
        BadInput("unknown keyword", _unknown_kw, "dims", exc=(TypeError,)),
    ],
    doc=__doc__.strip().split("\n")[0],
)  # fmt: skip


def transpose(x: torch.Tensor, *, backend: str | None = None) -> torch.Tensor:
    """``x.transpose(-2, -1).contiguous()`` (x: 2 or more dims) with the chosen backend:
    a new contiguous tensor of x's dtype."""
    return registry.call("transpose", backend, x)


# The backends register themselves, after the spec exists.
from kernellab.ops.transpose import cuda as _cuda  # noqa: E402,F401
from kernellab.ops.transpose import numba as _numba  # noqa: E402,F401
from kernellab.ops.transpose import reference as _reference  # noqa: E402,F401
from kernellab.ops.transpose import triton as _triton  # noqa: E402,F401
