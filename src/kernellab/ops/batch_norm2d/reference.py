"""manual, torch and compile backends of batch_norm2d."""

from __future__ import annotations

import torch

from kernellab.core.spec import upcast
from kernellab.ops._baselines import compiled, register_baseline


def manual_batch_norm2d(x, weight, bias, eps=1e-5, relu=False):
    """mean, subtract, square, mean, rsqrt, scale, shift in fp32 over (N, H, W): ~8 kernels."""
    x32 = upcast(x)
    mean = x32.mean((0, 2, 3), keepdim=True)
    xc = x32 - mean
    rstd = torch.rsqrt(xc.square().mean((0, 2, 3), keepdim=True) + eps)
    c = (1, -1, 1, 1)
    y = (xc * rstd * upcast(weight).view(c) + upcast(bias).view(c)).to(x.dtype)
    return torch.relu(y) if relu else y


def torch_batch_norm2d(x, weight, bias, eps=1e-5, relu=False):
    """torch.batch_norm(training=True): PyTorch's (cuDNN's) fused kernel, no running stats."""
    # torch.batch_norm, not F.batch_norm: the same kernel without F.batch_norm's Python
    # refusal of one value per channel (batch 1, 1x1 images), which the aten op computes
    # (variance 0: y = bias) and every other backend here computes too.
    y = torch.batch_norm(x, weight, bias, None, None, True, 0.0, eps, torch.backends.cudnn.enabled)
    return torch.relu(y) if relu else y


register_baseline("batch_norm2d", manual_batch_norm2d, torch_batch_norm2d, compiled(manual_batch_norm2d))
