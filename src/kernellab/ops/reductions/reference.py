"""manual, torch and compile backends of sum, max and argmax."""

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


def manual_argmax(x: torch.Tensor) -> torch.Tensor:
    """manual max's indices."""
    return manual_max(x)[1]


def torch_argmax(x: torch.Tensor) -> torch.Tensor:
    """torch.argmax(x, -1)."""
    return torch.argmax(x, dim=-1)


register_baseline("sum", manual_sum, torch_sum, compiled(manual_sum))
register_baseline("max", manual_max, torch_max, compiled(manual_max))
register_baseline("argmax", manual_argmax, torch_argmax, compiled(manual_argmax))
