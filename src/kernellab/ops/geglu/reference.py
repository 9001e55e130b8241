"""manual, torch and compile backends of geglu. ``inplace_backward`` is accepted and
ignored: PyTorch's autograd allocates the gradients (see ops/glu_kernels/__init__.py)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from kernellab.core.spec import upcast
from kernellab.ops._baselines import compiled, register_baseline

_K = math.sqrt(2.0 / math.pi)


def manual_geglu(
    a: torch.Tensor, b: torch.Tensor, approximate: str = "none", inplace_backward: bool = False
) -> torch.Tensor:
    """0.5 a (1 + erf(a / sqrt 2)) * b (or the tanh form) from PyTorch primitives in fp32."""
    a32 = upcast(a)
    if approximate == "tanh":
        g = 0.5 * a32 * (1.0 + torch.tanh(_K * (a32 + 0.044715 * a32 * a32 * a32)))
    else:
        g = 0.5 * a32 * (1.0 + torch.erf(a32 * (1.0 / math.sqrt(2.0))))
    return (g * upcast(b)).to(a.dtype)


def torch_geglu(
    a: torch.Tensor, b: torch.Tensor, approximate: str = "none", inplace_backward: bool = False
) -> torch.Tensor:
    """F.gelu(a, approximate) * b: two ATen kernels."""
    return F.gelu(a, approximate=approximate) * b


register_baseline("geglu", manual_geglu, torch_geglu, compiled(manual_geglu))
