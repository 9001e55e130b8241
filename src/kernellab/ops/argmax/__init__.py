"""argmax over the last dimension (issue 3, reductions).

    argmax(x, dim=-1) -> indices (int64), as torch.argmax(x, dim)

The index of the first maximum of each row, NaN counting as the maximum (torch's
semantics; see ops/max/, whose kernels compute it: argmax's backends are max's launchers
without the values store). Not differentiable.
"""

from __future__ import annotations

import math

import torch

from kernellab.core import registry
from kernellab.core.spec import OpSpec, define
from kernellab.ops._reductions import ROW_CASES, last_dim, validate_rows


def argmax_reference(x: torch.Tensor):
    return torch.argmax(x, dim=-1)


def _argmax_bytes(shape, dtype, mode):
    es = torch.empty((), dtype=dtype).element_size()
    return math.prod(shape) * es + (math.prod(shape[:-1]) if len(shape) else 1) * 8


SPEC = define(
    OpSpec(
        name="argmax",
        reference=argmax_reference,
        bytes_moved=_argmax_bytes,
        modes=("fwd",),
        validator=validate_rows("argmax"),
        doc="argmax over the last dim (torch.argmax(x, -1)), int64",
        **ROW_CASES,
    )
)


def argmax(x: torch.Tensor, dim: int = -1, *, backend: str | None = None) -> torch.Tensor:
    """Index (int64) of the first maximum of ``x`` along ``dim`` (NaN counts as the
    maximum), as ``torch.argmax(x, dim)``."""
    return registry.call("argmax", backend, last_dim(x, dim, "argmax"))


# The backends register themselves, after the spec exists.
from kernellab.ops.argmax import cuda as _cuda  # noqa: E402,F401
from kernellab.ops.argmax import reference as _reference  # noqa: E402,F401
from kernellab.ops.argmax import triton as _triton  # noqa: E402,F401
