"""manual, torch and compile backends of transpose."""

from __future__ import annotations

import torch

from kernellab.ops._baselines import compiled, register_baseline


def manual_transpose(x: torch.Tensor) -> torch.Tensor:
    """A gather through a computed flat index: an int64 index read per element moved.

    (A transpose written without one: index kernels, then index_select.)"""
    r, c = x.shape[-2], x.shape[-1]
    lead = x.shape[:-2]
    # output element (j, i) of each matrix is input element i * c + j
    idx = torch.arange(c, device=x.device)[:, None] + torch.arange(r, device=x.device)[None, :] * c
    return x.reshape(*lead, r * c).index_select(-1, idx.reshape(-1)).reshape(*lead, c, r)


def torch_transpose(x: torch.Tensor) -> torch.Tensor:
    """x.transpose(-2, -1).contiguous(): one ATen copy kernel."""
    return x.transpose(-2, -1).contiguous()


register_baseline("transpose", manual_transpose, torch_transpose, compiled(manual_transpose))
