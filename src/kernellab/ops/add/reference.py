"""manual, torch and compile backends of add."""

from __future__ import annotations

import torch

from kernellab.ops._baselines import compiled, register_baseline


def manual_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Upcast, add, round back: three kernels for fp16/bf16 (one for fp32)."""
    if a.dtype in (torch.float32, torch.float64):
        return a + b
    return (a.float() + b.float()).to(a.dtype)


def torch_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """torch.add: one ATen kernel."""
    return torch.add(a, b)


register_baseline("add", manual_add, torch_add, compiled(manual_add))
