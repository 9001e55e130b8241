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

Two ops share the kernels: ``max`` (two outputs, this folder) and ``argmax``
(ops/argmax/: the same kernels without the values store). What they share besides
(validation, the checked cases) is in ops/_reductions.py.
"""

from __future__ import annotations

import math
from collections import namedtuple

import torch

from kernellab.core import registry
from kernellab.core.spec import OpSpec, define
from kernellab.ops._reductions import ROW_CASES, last_dim, validate_rows

MaxResult = namedtuple("MaxResult", ["values", "indices"])


def max_reference(x: torch.Tensor):
    v, i = torch.max(x, dim=-1)
    return v, i


def _rows(shape):
    return math.prod(shape[:-1]) if len(shape) else 1


def _max_bytes(shape, dtype, mode):
    es = torch.empty((), dtype=dtype).element_size()
    n, r = math.prod(shape), _rows(shape)
    fwd = n * es + r * (es + 8)  # read x; write values and int64 indices
    # backward: read dy and the indices, write dx (zeros and the scattered dy)
    return fwd if mode == "fwd" else fwd + r * (es + 8) + n * es


SPEC = define(
    OpSpec(
        name="max",
        reference=max_reference,
        bytes_moved=_max_bytes,
        grad_args=(0,),
        modes=("fwd", "fwdbwd"),
        validator=validate_rows("max"),
        doc="max over the last dim: values and indices (torch.max(x, -1))",
        **ROW_CASES,
    )
)


def max(x: torch.Tensor, dim: int = -1, *, backend: str | None = None) -> MaxResult:  # noqa: A001
    """(values, indices) of the maximum of ``x`` along ``dim``, as ``torch.max(x, dim)``."""
    v, i = registry.call("max", backend, last_dim(x, dim, "max"))
    return MaxResult(v, i)


# The backends register themselves, after the spec exists.
from kernellab.ops.max import cuda as _cuda  # noqa: E402,F401
from kernellab.ops.max import reference as _reference  # noqa: E402,F401
from kernellab.ops.max import triton as _triton  # noqa: E402,F401
