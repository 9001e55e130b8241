"""liger-kernel's SwiGLU and GeGLU as peer backends (``liger``), when liger-kernel is
installed.

Called as liger users call them: ``LigerSiLUMulFunction.apply(a, b)`` and
``LigerGELUMulFunction.apply(a, b)`` (Triton, a program per row). Liger's GeGLU is the tanh
approximation only: ``approximate="none"`` is refused (a documented limit, ``limits``).
liger's backward writes da and db into the buffers of the a and b it saved (its memory
saving inside an MLP, where they are dead after the backward); a caller's tensors must
not change, so a call that will run a backward hands liger private contiguous copies
(two extra copies in its fwdbwd time). ``inplace_backward`` is accepted and ignored: liger's
in-place write does not advance the version counters the option promises. An empty input
is answered by PyTorch's formula: liger would launch a grid of zero programs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernellab.core.registry import register
from kernellab.ops._peers import first_order_only, liger_unavailable, register_liger


def _own(a, b):
    if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad):
        return a.clone(memory_format=torch.contiguous_format), b.clone(memory_format=torch.contiguous_format)
    return a.contiguous(), b.contiguous()


def liger_swiglu(a, b, inplace_backward=False):
    """liger-kernel LigerSiLUMulFunction (Triton)."""
    from liger_kernel.ops.swiglu import LigerSiLUMulFunction

    if a.numel() == 0:
        return F.silu(a) * b
    return first_order_only(LigerSiLUMulFunction.apply(*_own(a, b)), "swiglu (liger)")


def _geglu_limits(a, b, approximate="none", inplace_backward=False):
    return None if approximate == "tanh" else "liger's GeGLU computes the tanh approximation only"


def liger_geglu(a, b, approximate="none", inplace_backward=False):
    """liger-kernel LigerGELUMulFunction (Triton, tanh GeLU only)."""
    from liger_kernel.ops.geglu import LigerGELUMulFunction

    why = _geglu_limits(a, b, approximate)
    if why:
        raise ValueError(f"geglu (liger): approximate={approximate!r}: {why}; pass approximate='tanh'")
    if a.numel() == 0:
        return F.gelu(a, approximate="tanh") * b
    return first_order_only(LigerGELUMulFunction.apply(*_own(a, b)), "geglu (liger)")


register_liger("swiglu", liger_swiglu, "liger-kernel LigerSiLUMulFunction (peer)")
register("geglu", "liger", devices=("cuda",), available=liger_unavailable, builtin=True, limits=_geglu_limits,
         description="liger-kernel LigerGELUMulFunction, tanh only (peer)")(liger_geglu)  # fmt: skip
