"""Elementwise add of two tensors of the same shape and dtype (no broadcasting).

The simplest memory-bound op: 2 reads + 1 write per element, 1 flop. Its best time is
the copy ceiling scaled by 3/2 bytes, which makes it the yardstick for the launch and
streaming machinery every other kernel uses. The gradient is dy for both inputs.
"""

from __future__ import annotations

import math

import torch

from kernellab.core import registry
from kernellab.core.spec import elementwise_spec


def add_reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a + b


def _bytes(shape, dtype, mode):
    # Forward only: add's backward hands dy to both inputs without a kernel.
    return 3 * math.prod(shape) * torch.empty((), dtype=dtype).element_size()


SPEC = elementwise_spec(
    "add",
    add_reference,
    lambda shape, mode: math.prod(shape),
    arg_names=("a", "b"),
    bytes_moved=_bytes,
    grad_args=(0, 1),
    modes=("fwd",),
    doc=__doc__.strip().split("\n")[0],
)


def add(a: torch.Tensor, b: torch.Tensor, *, backend: str | None = None) -> torch.Tensor:
    """a + b with the chosen backend (default: the fastest available here)."""
    return registry.call("add", backend, a, b)


from kernellab.ops.add import cuda as _cuda  # noqa: E402,F401  (registrations)
from kernellab.ops.add import numba as _numba  # noqa: E402,F401
from kernellab.ops.add import reference as _reference  # noqa: E402,F401
from kernellab.ops.add import triton as _triton  # noqa: E402,F401
