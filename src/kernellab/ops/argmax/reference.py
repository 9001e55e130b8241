"""manual, torch and compile backends of argmax."""

from __future__ import annotations

import torch

from kernellab.ops._baselines import compiled, register_baseline
from kernellab.ops.max.reference import manual_max


def manual_argmax(x: torch.Tensor) -> torch.Tensor:
    """manual max's indices."""
    return manual_max(x)[1]


def torch_argmax(x: torch.Tensor) -> torch.Tensor:
    """torch.argmax(x, -1)."""
    return torch.argmax(x, dim=-1)


register_baseline("argmax", manual_argmax, torch_argmax, compiled(manual_argmax))
