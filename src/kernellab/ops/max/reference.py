"""manual, torch and compile backends of max."""

from __future__ import annotations

import torch

from kernellab.ops._baselines import compiled, register_baseline


def manual_max(x: torch.Tensor):
    """amax (propagates NaN), the first position equal to it (or the first NaN), then a
    gather of the values (whose backward scatters dy to that index, as torch.max's does;
    amax's own backward would share dy among ties): four passes over the row."""
    xr = x.reshape(1) if x.dim() == 0 else x
    m = xr.detach().amax(dim=-1, keepdim=True)
    hit = (xr == m) | (xr.isnan() & m.isnan())
    idx = hit.to(torch.uint8).argmax(dim=-1, keepdim=True)  # argmax of 0/1: the first 1
    return xr.gather(-1, idx).squeeze(-1), idx.squeeze(-1)


def torch_max(x: torch.Tensor):
    """torch.max(x, -1): one ATen reduction with indices."""
    v, i = torch.max(x, dim=-1)
    return v, i


register_baseline("max", manual_max, torch_max, compiled(manual_max))
