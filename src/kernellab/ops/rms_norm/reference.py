"""manual, torch and compile backends of rms_norm."""

from __future__ import annotations

import torch

from kernellab.core.spec import upcast
from kernellab.ops._baselines import compiled, register_baseline


def manual_rms_norm(x, weight, eps=1e-6):
    """square, mean, rsqrt, scale, weight in fp32: ~6 kernels, as many trips to memory."""
    x32 = upcast(x)
    return (x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + eps) * upcast(weight)).to(x.dtype)


def torch_rms_norm(x, weight, eps=1e-6):
    """torch.nn.functional.rms_norm (PyTorch >= 2.4)."""
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps)


register_baseline("rms_norm", manual_rms_norm, torch_rms_norm, compiled(manual_rms_norm))
