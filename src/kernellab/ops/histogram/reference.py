"""manual, torch and compile backends of histogram."""

from __future__ import annotations

import torch

from kernellab.core.registry import register
from kernellab.ops._baselines import _compile_unavailable, compiled


def _in_range_or_dump(x: torch.Tensor, bins: int) -> torch.Tensor:
    """int64 keys with every key outside [0, bins) replaced by ``bins`` (a dump bin that the
    callers drop): no boolean indexing, so no device-to-host sync."""
    k = x.to(torch.int64)
    return torch.where((k >= 0) & (k < bins), k, bins)


def manual_histogram(x: torch.Tensor, bins: int) -> torch.Tensor:
    """PyTorch primitives: keys to int64, out-of-range keys to a dump bin, scatter_add of ones."""
    k = _in_range_or_dump(x, bins)
    out = torch.zeros(bins + 1, dtype=torch.int64, device=x.device)
    out.scatter_add_(0, k, torch.ones_like(k))
    return out[:bins]


def torch_histogram(x: torch.Tensor, bins: int) -> torch.Tensor:
    """torch.bincount(minlength=bins) (shared-memory histogram on CUDA; it syncs for max(x))."""
    if x.dtype == torch.uint8 and bins >= 256:  # every uint8 key is in range
        return torch.bincount(x, minlength=bins)
    return torch.bincount(_in_range_or_dump(x, bins), minlength=bins + 1)[:bins]


_DTYPES = (torch.uint8, torch.int32, torch.int64)

# (histogram has no float64 twin of its dtypes, so the registrations are spelled out
# rather than taken from register_baseline, which adds float64 for gradcheck.)
register("histogram", "manual", builtin=True, description=manual_histogram.__doc__.split("\n")[0],
         dtypes=_DTYPES)(manual_histogram)  # fmt: skip
register("histogram", "torch", builtin=True, description=torch_histogram.__doc__.split("\n")[0],
         dtypes=_DTYPES)(torch_histogram)  # fmt: skip
register("histogram", "compile", builtin=True, available=_compile_unavailable,
         description="torch.compile of manual", dtypes=_DTYPES,
         builds_per_shape=True)(compiled(manual_histogram))  # fmt: skip
