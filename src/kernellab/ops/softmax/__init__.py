"""Softmax over the last dimension, forward and backward (issue 3, first op).

    y = exp(x - max(x)) / sum(exp(x - max(x)))       (along the row)
    dx = y * (dy - sum(dy * y))

fp32 / fp16 / bf16 storage, fp32 math. Rows of any width: the Triton kernel keeps a row in
one block when it fits and otherwise streams it with the online-softmax recurrence (running
max and sum in one pass, a second pass to write). A fully masked row (all -inf) gives NaN,
as ``torch.softmax`` does (the max is -inf and -inf - -inf is NaN). ``dim`` other than the
last is handled by moving it last.
"""

from __future__ import annotations

import math

import torch

from kernellab.core import registry
from kernellab.core.spec import declare, fuzz_rows, unary_bytes


def softmax_reference(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


def _flops(shape, mode):
    n = math.prod(shape)  # max, sub, exp, sum, div ~ 5 per element; bwd mul, sum, sub, mul ~ 4
    return {"fwd": 5 * n, "bwd": 4 * n, "fwdbwd": 9 * n}[mode]


def _mask_a_row(x: torch.Tensor) -> None:
    rows = x.reshape(-1, x.shape[-1]) if x.dim() else x.reshape(1, 1)
    if rows.shape[0] >= 2 and x.is_contiguous():
        rows[1].fill_(float("-inf"))  # a fully masked row


SPEC = declare(
    "softmax", ("x",), softmax_reference, _flops, unary_bytes,  # the backward reads y and dy
    test_shapes=[
        (0, 7),
        (1,),
        (41,),
        (3, 123),
        (17, 1024),
        (5, 1025),
        (4, 4097),
        (2, 3, 257),
        (65537, 3),
        (2, 20000),
    ],
    quick_shapes=[(0, 7), (1,), (3, 123), (2, 9000)],
    bench_shapes=[(32768, 4096)],
    cpu_bench_shapes=[(64, 1024)],
    layout_shape=(37, 1025),
    reach_shape=(5, 1025),
    grad_args=(0,),
    scale=3.0,
    plant_extra=_mask_a_row,
    fuzz=fuzz_rows(6000, 160000),  # GPU: past every vocabulary (Qwen2.5's 152064)
    rows_shape=(65537, 3),
    default_backends=("triton", "torch"),
    key_validates=True,
    doc=__doc__.strip().split("\n")[0],
)


def softmax(x: torch.Tensor, dim: int = -1, *, backend: str | None = None) -> torch.Tensor:
    """Softmax of ``x`` along ``dim`` with the chosen backend."""
    if not isinstance(x, torch.Tensor):
        return registry.call("softmax", backend, x)  # the registry's validation names x
    if x.dim() == 0:
        raise ValueError("softmax: x must have at least one dimension, got a 0-d tensor")
    if isinstance(dim, bool) or not isinstance(dim, int) or not -x.dim() <= dim < x.dim():
        raise ValueError(f"softmax: dim must be an int in [{-x.dim()}, {x.dim() - 1}], got {dim!r}")
    if dim % x.dim() != x.dim() - 1:
        return registry.call("softmax", backend, x.movedim(dim, -1)).movedim(-1, dim)
    return registry.call("softmax", backend, x)


from kernellab.ops.softmax import cuda as _cuda  # noqa: E402,F401
from kernellab.ops.softmax import numba as _numba  # noqa: E402,F401
from kernellab.ops.softmax import reference as _reference  # noqa: E402,F401  (registrations)
from kernellab.ops.softmax import triton as _triton  # noqa: E402,F401
