"""manual, torch and compile backends of gelu."""

from __future__ import annotations

import torch

from kernellab.core.spec import upcast
from kernellab.ops._baselines import compiled, register_baseline

_K = 0.7978845608028654


def manual_gelu(x: torch.Tensor) -> torch.Tensor:
    """The formula from PyTorch primitives: ~8 kernels, each a round trip to memory."""
    x32 = upcast(x)  # the naive version still computes in fp32, as the fused ones do
    y = 0.5 * x32 * (1.0 + torch.tanh(_K * (x32 + 0.044715 * x32 * x32 * x32)))
    return y.to(x.dtype)


def torch_gelu(x: torch.Tensor) -> torch.Tensor:
    """torch.nn.functional.gelu(approximate='tanh'): one fused ATen kernel."""
    return torch.nn.functional.gelu(x, approximate="tanh")


register_baseline("gelu", manual_gelu, torch_gelu, compiled(manual_gelu))
