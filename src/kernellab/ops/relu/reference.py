"""manual, torch and compile backends of relu."""

from __future__ import annotations

import torch

from kernellab.ops._baselines import compiled, register_baseline


def manual_relu(x: torch.Tensor) -> torch.Tensor:
    """x * (x > 0) from PyTorch primitives, with NaN kept (where(isnan)): 3-4 kernels."""
    return torch.where((x > 0) | torch.isnan(x), x, torch.zeros((), dtype=x.dtype, device=x.device))


def torch_relu(x: torch.Tensor) -> torch.Tensor:
    """torch.relu: one ATen kernel (clamp_min)."""
    return torch.relu(x)


register_baseline("relu", manual_relu, torch_relu, compiled(manual_relu))
