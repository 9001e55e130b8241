"""manual, torch and compile backends of layer_norm."""

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


register_baseline("layer_norm", manual_layer_norm, torch_layer_norm, compiled(manual_layer_norm))
