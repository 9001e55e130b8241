"""manual, torch and compile backends of matmul."""

from __future__ import annotations

import torch

from kernellab.core.registry import register
from kernellab.core.spec import REFERENCE_DTYPES, wide_dtype
from kernellab.ops._baselines import _compile_unavailable, compiled
from kernellab.ops.matmul.epilogue import apply_epilogue

# Largest [rows, K, N] product (elements) the manual backend materializes at once.
_CHUNK = 1 << 24


def manual_matmul(a, b, bias=None, activation=None):
    """Broadcast-multiply-sum, no GEMM library: (a[..., :, :, None] * b[..., None, :, :]).sum(-2).

    Row chunks keep the [rows, K, N] product under 64 MB; ~3 memory passes per FLOP.
    Accumulates in fp32 for fp16/bf16 inputs and in fp64 for fp32 inputs: a plain fp32
    ``sum`` of the K products is up to ~2.2x less accurate than MKL's blocked GEMM on the
    CPU (K=29, expanded operands) and fails the 2x rule now and then."""
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    acc = wide_dtype(a.dtype)
    a_, b_ = a.to(acc), b.to(acc)
    rows = max(1, _CHUNK // max(1, k * n))
    parts = [(a_[..., i : i + rows, :, None] * b_[..., None, :, :]).sum(-2) for i in range(0, m, rows)]
    # M = 0: an empty product that still carries a_ (and b_) in its graph (requires_grad kept)
    z = torch.cat(parts, dim=-2) if parts else (a_[..., :, :1, None] * b_[..., None, :1, :]).sum(-2)
    return apply_epilogue(z, None if bias is None else bias.to(acc), activation).to(a.dtype)


def torch_matmul(a, b, bias=None, activation=None):
    """torch.matmul (cuBLAS on the GPU), then bias and activation as PyTorch ops."""
    return apply_epilogue(torch.matmul(a, b), bias, activation)


def _product_with_epilogue(a, b, bias=None, activation=None):
    """torch.compile target: Inductor keeps the product on cuBLAS (extern mm) and fuses
    bias + activation into one pointwise kernel. (Compiling manual's broadcast-multiply-sum
    would build the [M, K, N] product in memory.)"""
    return apply_epilogue(torch.matmul(a, b), bias, activation)


# float64 too (REFERENCE_DTYPES): torch.autograd.gradcheck runs through the reference backends
register("matmul", "manual", builtin=True, double_backward=True, dtypes=REFERENCE_DTYPES)(manual_matmul)
register("matmul", "torch", builtin=True, double_backward=True, dtypes=REFERENCE_DTYPES)(torch_matmul)
register(
    "matmul",
    "compile",
    builtin=True,
    available=_compile_unavailable,
    dtypes=REFERENCE_DTYPES,
    description="torch.compile of torch.matmul + bias + activation (epilogue fused by Inductor)",
    builds_per_shape=True,
)(compiled(_product_with_epilogue, op="matmul"))
