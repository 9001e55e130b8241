"""GeLU, tanh approximation (the lecture's formula), with backward.

    gelu(x) = 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))

Same as ``torch.nn.functional.gelu(x, approximate="tanh")``. fp32 / fp16 / bf16, math in
fp32. Like the formula (and PyTorch), gelu(-inf) is NaN and gelu(+inf) is +inf, and the
gradient at both +inf and -inf is NaN (the formula's derivative is inf * 0 there; its
limits, 1 and 0, are not what any backend returns). NaN in, NaN out, both ways.
"""

from __future__ import annotations

import math

import torch

from kernellab.core import registry
from kernellab.core.spec import elementwise_spec, per_element_flops

_K = math.sqrt(2.0 / math.pi)


def gelu_reference(x: torch.Tensor) -> torch.Tensor:
    """The formula, evaluated in whatever dtype ``x`` has (float64 in checks)."""
    return 0.5 * x * (1.0 + torch.tanh(_K * (x + 0.044715 * x * x * x)))


# ~8 flops forward (x^3, fma, scale, tanh counted as 1, 1 +, 2 mul), ~14 backward.
_flops = per_element_flops(8, 14)


SPEC = elementwise_spec(
    "gelu",
    gelu_reference,
    _flops,
    scale=3.0,  # reach both tails of tanh
    specials=(float("nan"), float("inf"), float("-inf"), 1e4, -1e4, 60.0, -60.0),
    doc=__doc__.strip().split("\n")[0],
)


def gelu(x: torch.Tensor, *, backend: str | None = None) -> torch.Tensor:
    """GeLU (tanh approximation) of ``x`` with the chosen backend (default: the fastest
    available here: cuda, then triton, then torch)."""
    return registry.call("gelu", backend, x)


from kernellab.ops.gelu import cuda as _cuda  # noqa: E402,F401  (registrations)
from kernellab.ops.gelu import numba as _numba  # noqa: E402,F401
from kernellab.ops.gelu import reference as _reference  # noqa: E402,F401
from kernellab.ops.gelu import triton as _triton  # noqa: E402,F401
