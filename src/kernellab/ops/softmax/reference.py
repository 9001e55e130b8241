"""manual, torch and compile backends of softmax."""

from __future__ import annotations

import torch

from kernellab.core.spec import upcast
from kernellab.ops._baselines import compiled, register_baseline
from kernellab.ops._peers import first_order_only, refuse_wide_rows, register_liger


def manual_softmax(x: torch.Tensor) -> torch.Tensor:
    """max, subtract, exp, sum, divide: five kernels and as many round trips to memory."""
    x32 = upcast(x)
    if x.dim() and x.shape[-1] == 0:  # rows of no elements: nothing to normalize (amax refuses)
        return x.clone()
    m = x32.amax(dim=-1, keepdim=True)
    e = (x32 - m).exp()
    return (e / e.sum(dim=-1, keepdim=True)).to(x.dtype)


def torch_softmax(x: torch.Tensor) -> torch.Tensor:
    """torch.softmax: one fused ATen kernel."""
    return torch.softmax(x, dim=-1)


register_baseline("softmax", manual_softmax, torch_softmax, compiled(manual_softmax))


def liger_softmax(x: torch.Tensor) -> torch.Tensor:
    """liger-kernel's softmax (Triton; peer backend). Liger takes contiguous 2-D rows: other
    inputs are packed and reshaped around the call, as a user of it would."""
    refuse_wide_rows("softmax (liger)", "x", x)
    from liger_kernel.ops.softmax import LigerSoftmaxFunction

    if x.numel() == 0:
        return torch.empty_like(x)
    rows = x.contiguous().view(-1, x.shape[-1]) if x.dim() else x.reshape(1, 1)
    return first_order_only(LigerSoftmaxFunction.apply(rows).view(x.shape), "softmax (liger)")


register_liger("softmax", liger_softmax, "liger-kernel's Triton softmax (peer)")
