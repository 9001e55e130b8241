"""manual, torch and compile backends of bn_relu_pool2d."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernellab.core.spec import upcast
from kernellab.ops._baselines import compiled, register_baseline
from kernellab.ops.batch_norm2d.reference import manual_batch_norm2d
from kernellab.ops.pool.reference import manual_max_pool2d


def manual_bn_relu_pool2d(x, weight, bias, eps=1e-5):
    """batch_norm2d's naive composition (relu included) and max_pool2d's unfold + max, in
    fp32, rounded once at the end (the op's contract): ~11 kernels, two full-size
    intermediates."""
    z = manual_batch_norm2d(upcast(x), upcast(weight), upcast(bias), eps, relu=True)
    return manual_max_pool2d(z, 2).to(x.dtype)


def torch_bn_relu_pool2d(x, weight, bias, eps=1e-5):
    """torch.batch_norm(training=True) + F.relu + F.max_pool2d: PyTorch's three kernels in
    x's dtype (the unfused block of the nn.Module model)."""
    # torch.batch_norm, not F.batch_norm: the same kernel without F.batch_norm's Python
    # refusal of one value per channel (see batch_norm2d's torch backend)
    y = torch.batch_norm(x, weight, bias, None, None, True, 0.0, eps, torch.backends.cudnn.enabled)
    return F.max_pool2d(F.relu(y), 2, 2)


register_baseline("bn_relu_pool2d", manual_bn_relu_pool2d, torch_bn_relu_pool2d, compiled(manual_bn_relu_pool2d))
