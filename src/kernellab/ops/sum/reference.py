"""manual, torch and compile backends of sum."""

from __future__ import annotations

import torch

from kernellab.core.spec import upcast
from kernellab.ops._baselines import compiled, register_baseline


def manual_sum(x: torch.Tensor, dim=None) -> torch.Tensor:
    """Upcast to fp32 (a full copy for 16-bit inputs), sum in fp32, cast back."""
    x32 = upcast(x)
    s = x32.sum() if dim is None else x32.sum(dim)
    return s.to(x.dtype)


def torch_sum(x: torch.Tensor, dim=None) -> torch.Tensor:
    """torch.sum: one ATen reduction kernel (fp32 accumulation for 16-bit inputs)."""
    return torch.sum(x) if dim is None else torch.sum(x, dim)


register_baseline("sum", manual_sum, torch_sum, compiled(manual_sum))
