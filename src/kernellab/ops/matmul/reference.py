"""manual, torch and compile backends of matmul."""

from __future__ import annotations

import torch

from kernellab.ops._baselines import _compile_unavailable, compiled
from kernellab.ops.matmul import apply_epilogue
from kernellab.registry import register

# Largest [rows, K, N] fp32 product the manual backend materializes at once (64 MB).
_CHUNK = 1 << 24


def manual_matmul(a, b, bias=None, activation=None):
    """Broadcast-multiply-sum in fp32, no GEMM library: (a[..., :, :, None] * b[..., None, :, :]).sum(-2).

    Row chunks keep the [rows, K, N] product under 64 MB; cost ~ 3 memory passes per FLOP."""
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    a32, b32 = a.float(), b.float()
    rows = max(1, _CHUNK // max(1, k * n))
    parts = [(a32[..., i : i + rows, :, None] * b32[..., None, :, :]).sum(-2) for i in range(0, m, rows)]
    z = torch.cat(parts, dim=-2) if parts else a32.new_zeros(tuple(a.shape[:-1]) + (n,))
    return apply_epilogue(z, None if bias is None else bias.float(), activation).to(a.dtype)


def torch_matmul(a, b, bias=None, activation=None):
    """torch.matmul (cuBLAS on the GPU), then bias and activation as PyTorch ops."""
    return apply_epilogue(torch.matmul(a, b), bias, activation)


def _product_with_epilogue(a, b, bias=None, activation=None):
    """torch.compile target: Inductor keeps the product on cuBLAS (extern mm) and fuses
    bias + activation into one pointwise kernel. (Compiling manual's broadcast-multiply-sum
    would build the [M, K, N] product in memory.)"""
    return apply_epilogue(torch.matmul(a, b), bias, activation)


register("matmul", "manual", builtin=True)(manual_matmul)
register("matmul", "torch", builtin=True)(torch_matmul)
register(
    "matmul",
    "compile",
    builtin=True,
    available=_compile_unavailable,
    description="torch.compile of torch.matmul + bias + activation (epilogue fused by Inductor)",
)(compiled(_product_with_epilogue))
