"""manual, torch and compile backends of max_pool2d."""

from __future__ import annotations

import torch

from kernellab.ops._baselines import compiled, register_baseline
from kernellab.ops.pool.windows import geometry


def manual_max_pool2d(x, kernel_size=2, stride=None):
    """Windows as a strided view (unfold twice), then max over the window: a max
    reduction kernel plus the copy of the overlapping windows' view. Autograd of max
    routes the gradient to the index max returns: the first maximum, and in a window
    holding several NaNs the first NaN (PyTorch's pooling kernel: the last NaN)."""
    k, s, p, q = geometry(x.shape[2], x.shape[3], kernel_size, stride)
    win = x.unfold(2, k, s).unfold(3, k, s)  # [N, C, P, Q, k, k] (a view)
    return win.reshape(*win.shape[:4], k * k).max(-1).values


def torch_max_pool2d(x, kernel_size=2, stride=None):
    """torch.nn.functional.max_pool2d (one ATen kernel; cuDNN-free native CUDA kernel)."""
    return torch.nn.functional.max_pool2d(x, kernel_size, stride if stride is not None else kernel_size)


register_baseline("max_pool2d", manual_max_pool2d, torch_max_pool2d, compiled(manual_max_pool2d))
