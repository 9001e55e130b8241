"""liger-kernel's fused linear cross-entropy as a peer backend (``liger``), when installed.

Called through ``liger_kernel.transformers.functional.liger_fused_linear_cross_entropy``
with keyword arguments (its positional order changed between releases): z_loss is Liger's
``lse_square_scale`` (the same z * lse^2 per non-ignored row, reduced like the loss).
Liger computes the gradients in its forward, as the chunked backends here do; it has no
target range check of its own (it is run here first), and x of any rank is flattened to
[N, H] as Liger expects. An empty batch is answered without launching Liger (PyTorch's
result: NaN for "mean", 0 for "sum", an empty tensor for "none").
"""

from __future__ import annotations

import torch

from kernellab.ops._peers import first_order_only, register_liger
from kernellab.ops.linear_cross_entropy.targets import DEFAULT_IGNORE, OP, wants_check
from kernellab.ops.linear_cross_entropy.targets import check_targets as _check


def liger_linear_cross_entropy(x, weight, target, bias=None, ignore_index=DEFAULT_IGNORE, reduction="mean",
                               label_smoothing=0.0, z_loss=0.0, chunk=None, check_targets=None):  # fmt: skip
    """liger_fused_linear_cross_entropy (chunked, gradients in the forward)."""
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    v, h = weight.shape
    if wants_check(check_targets, x.is_cuda, False):
        _check(target, v, ignore_index)
    t = target.reshape(-1)
    x2 = x.reshape(t.shape[0], h)
    if t.shape[0] == 0:
        empty = torch.nn.functional.linear(x2, weight, bias).sum(-1).float()  # keeps autograd's links
        out = {"none": empty, "sum": empty.sum(), "mean": empty.sum() / 0.0}[reduction]
    else:
        out = liger_fused_linear_cross_entropy(
            x2.contiguous(), weight, t.contiguous(), bias, ignore_index=ignore_index,
            lse_square_scale=float(z_loss), label_smoothing=float(label_smoothing), reduction=reduction,
        )  # fmt: skip
        if isinstance(out, tuple):
            out = out[0]
        out = first_order_only(out, "linear_cross_entropy (liger)")
    if reduction == "none":
        out = out.reshape(target.shape)
    return out.to(x.dtype)


register_liger(
    OP, liger_linear_cross_entropy, "liger-kernel fused linear cross-entropy (gradients in the forward)",
    limits=None,  # (chunked: its cross-entropy walks the vocabulary in blocks)
)
