"""manual, torch and compile backends of layer_norm and rms_norm."""

from __future__ import annotations

import torch

from kernellab.core.spec import upcast
from kernellab.ops._baselines import compiled, register_baseline


def manual_layer_norm(x, weight, bias=None, eps=1e-5):
    """mean, subtract, square, mean, rsqrt, scale, shift in fp32: ~8 kernels, as many trips to memory."""
    x32 = upcast(x)
    mean = x32.mean(-1, keepdim=True)
    xc = x32 - mean
    y = xc * torch.rsqrt(xc.square().mean(-1, keepdim=True) + eps) * upcast(weight)
    if bias is not None:
        y = y + upcast(bias)
    return y.to(x.dtype)


def torch_layer_norm(x, weight, bias=None, eps=1e-5):
    """torch.nn.functional.layer_norm: PyTorch's fused kernel."""
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def manual_rms_norm(x, weight, eps=1e-6):
    """square, mean, rsqrt, scale, weight in fp32: ~6 kernels, as many trips to memory."""
    x32 = upcast(x)
    return (x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + eps) * upcast(weight)).to(x.dtype)


def torch_rms_norm(x, weight, eps=1e-6):
    """torch.nn.functional.rms_norm (PyTorch >= 2.4)."""
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps)


register_baseline("layer_norm", manual_layer_norm, torch_layer_norm, compiled(manual_layer_norm))
register_baseline("rms_norm", manual_rms_norm, torch_rms_norm, compiled(manual_rms_norm))


def manual_add_rms_norm(x, residual, weight, eps=1e-6):
    """add, then manual_rms_norm of the rounded sum: ~7 kernels, as many trips to memory."""
    h = x + residual
    return manual_rms_norm(h, weight, eps), h


def torch_add_rms_norm(x, residual, weight, eps=1e-6):
    """x + residual, then torch.nn.functional.rms_norm: two PyTorch kernels."""
    h = x + residual
    return torch.nn.functional.rms_norm(h, (h.shape[-1],), weight, eps), h


register_baseline("add_rms_norm", manual_add_rms_norm, torch_add_rms_norm, compiled(manual_add_rms_norm))
