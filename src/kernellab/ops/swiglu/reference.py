"""manual, torch and compile backends of swiglu. ``inplace_backward`` is accepted and
ignored: PyTorch's autograd allocates the gradients (see ops/glu_kernels/__init__.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernellab.core.spec import upcast
from kernellab.ops._baselines import compiled, register_baseline


def manual_swiglu(a: torch.Tensor, b: torch.Tensor, inplace_backward: bool = False) -> torch.Tensor:
    """a * sigmoid(a) * b from PyTorch primitives in fp32: ~5 kernels, each a round trip to memory."""
    a32 = upcast(a)  # the naive version still computes in fp32, as the fused ones do
    return (a32 * torch.sigmoid(a32) * upcast(b)).to(a.dtype)


def torch_swiglu(a: torch.Tensor, b: torch.Tensor, inplace_backward: bool = False) -> torch.Tensor:
    """F.silu(a) * b: two ATen kernels (the activation rounded to the input dtype in between)."""
    return F.silu(a) * b


register_baseline("swiglu", manual_swiglu, torch_swiglu, compiled(manual_swiglu))
