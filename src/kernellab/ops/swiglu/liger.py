"""liger-kernel's SwiGLU as a peer backend (``liger``), when liger-kernel is installed.

Called as liger users call it: ``LigerSiLUMulFunction.apply(a, b)`` (Triton, a program per
row). liger's backward writes da and db into the buffers of the a and b it saved (its
memory saving inside an MLP, where they are dead after the backward); a caller's tensors
must not change, so a call that will run a backward hands liger private contiguous copies
(two extra copies in its fwdbwd time). ``inplace_backward`` is accepted and ignored:
liger's in-place write does not advance the version counters the option promises. An
empty input is answered by PyTorch's formula: liger would launch a grid of zero programs.
"""

from __future__ import annotations

import torch.nn.functional as F

from kernellab.ops._peers import first_order_only, owned_inputs, refuse_wide_rows, register_liger


def liger_swiglu(a, b, inplace_backward=False):
    """liger-kernel LigerSiLUMulFunction (Triton)."""
    refuse_wide_rows("swiglu (liger)", "a", a)
    from liger_kernel.ops.swiglu import LigerSiLUMulFunction

    if a.numel() == 0:
        return F.silu(a) * b
    return first_order_only(LigerSiLUMulFunction.apply(*owned_inputs(a, b)), "swiglu (liger)")


register_liger("swiglu", liger_swiglu, "liger-kernel LigerSiLUMulFunction (peer)")
