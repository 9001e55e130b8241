"""matmul's epilogue (bias, activation) as PyTorch ops: what the baselines and the CUDA
variants without a fused epilogue apply."""

from __future__ import annotations

import torch


def apply_epilogue(z: torch.Tensor, bias, activation):
    """bias add and activation on the product ``z`` with PyTorch ops (any dtype)."""
    if bias is not None:
        z = z + bias
    if activation == "relu":
        z = torch.relu(z)
    elif activation == "gelu":
        z = torch.nn.functional.gelu(z, approximate="tanh")
    return z
