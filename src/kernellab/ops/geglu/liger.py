"""liger-kernel's GeGLU as a peer backend (``liger``), when liger-kernel is installed.

Called as liger users call it: ``LigerGELUMulFunction.apply(a, b)`` (Triton, a program per
row). Liger's GeGLU is the tanh approximation only: ``approximate="none"`` is refused (a
documented limit, ``limits``), as are rows wider than liger's 65536-element block. liger's
backward writes da and db into the buffers of the a and b it saved; a caller's tensors must
not change, so a call that will run a backward hands liger private contiguous copies, as
swiglu's liger backend does. ``inplace_backward`` is accepted and ignored. An empty input is
answered by PyTorch's formula: liger would launch a grid of zero programs.
"""

from __future__ import annotations

import torch.nn.functional as F

from kernellab.core.registry import register
from kernellab.ops._peers import (
    first_order_only,
    liger_row_limits,
    liger_unavailable,
    owned_inputs,
    refuse_wide_rows,
)

TANH_ONLY = "liger's GeGLU computes the tanh approximation only"


def _geglu_limits(a, b, approximate="none", inplace_backward=False):
    return TANH_ONLY if approximate != "tanh" else liger_row_limits(a)


def liger_geglu(a, b, approximate="none", inplace_backward=False):
    """liger-kernel LigerGELUMulFunction (Triton, tanh GeLU only)."""
    if approximate != "tanh":
        raise ValueError(f"geglu (liger): approximate={approximate!r}: {TANH_ONLY}; pass approximate='tanh'")
    refuse_wide_rows("geglu (liger)", "a", a)
    from liger_kernel.ops.geglu import LigerGELUMulFunction

    if a.numel() == 0:
        return F.gelu(a, approximate="tanh") * b
    return first_order_only(LigerGELUMulFunction.apply(*owned_inputs(a, b)), "geglu (liger)")


register("geglu", "liger", devices=("cuda",), available=liger_unavailable, builtin=True, limits=_geglu_limits,
         description="liger-kernel LigerGELUMulFunction, tanh only (peer)")(liger_geglu)  # fmt: skip
