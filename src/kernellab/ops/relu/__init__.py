"""ReLU, elementwise, with backward (the MNIST CNN's activation, issue 18).

    relu(x) = x if x > 0 else 0          relu'(x) = 1 if x > 0 else 0

Same as ``torch.relu``: fp32 / fp16 / bf16, exact (no rounding: the output is the input
or zero). NaN propagates forward (relu(NaN) = NaN: a plain ``fmaxf(x, 0)`` would return 0
and hide it). relu'(0) = 0, as PyTorch defines it. The backward follows PyTorch's
``threshold_backward`` (dx = 0 where x <= 0, else dy): at a NaN input the comparison is
false, so dy passes through, which is what autograd of the float64 reference gives.
"""

from __future__ import annotations

import torch

from kernellab.core import registry
from kernellab.core.spec import ELEMENTWISE_BENCH_SHAPES, elementwise_spec, per_element_flops


def relu_reference(x: torch.Tensor) -> torch.Tensor:
    """torch.relu in whatever dtype ``x`` has (float64 in checks); NaN stays NaN."""
    return torch.relu(x)


_flops = per_element_flops(1, 1)  # one compare (and select) per element each way


SPEC = elementwise_spec(
    "relu",
    relu_reference,
    _flops,
    bench_shapes=[*ELEMENTWISE_BENCH_SHAPES, (64 * 32 * 28 * 28,), (1024 * 64 * 14 * 14,)],
    specials=(float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 1e-45, -1e-45),
    doc=__doc__.strip().split("\n")[0],
)


def relu(x: torch.Tensor, *, backend: str | None = None) -> torch.Tensor:
    """ReLU of ``x`` with the chosen backend (default: the fastest available here)."""
    return registry.call("relu", backend, x)


from kernellab.ops.relu import cuda as _cuda  # noqa: E402,F401  (registrations)
from kernellab.ops.relu import numba as _numba  # noqa: E402,F401
from kernellab.ops.relu import reference as _reference  # noqa: E402,F401
from kernellab.ops.relu import triton as _triton  # noqa: E402,F401
