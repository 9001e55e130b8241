"""manual, torch and compile backends of add_rms_norm."""

from __future__ import annotations

import torch

from kernellab.ops._baselines import compiled, register_baseline
from kernellab.ops.rms_norm.reference import manual_rms_norm


def manual_add_rms_norm(x, residual, weight, eps=1e-6):
    """add, then manual_rms_norm of the rounded sum: ~7 kernels, as many trips to memory."""
    h = x + residual
    return manual_rms_norm(h, weight, eps), h


def torch_add_rms_norm(x, residual, weight, eps=1e-6):
    """x + residual, then torch.nn.functional.rms_norm: two PyTorch kernels."""
    h = x + residual
    return torch.nn.functional.rms_norm(h, (h.shape[-1],), weight, eps), h


register_baseline("add_rms_norm", manual_add_rms_norm, torch_add_rms_norm, compiled(manual_add_rms_norm))
