"""liger-kernel's LayerNorm, RMSNorm and fused add + RMSNorm as peer backends (``liger``),
when liger-kernel is installed.

layer_norm: called as liger users call it: ``LigerLayerNormFunction.apply(x, weight, bias,
eps)`` (Triton; saves mean and rstd, reduces dweight/dbias from per-program partials). liger
needs a bias tensor: ``bias=None`` is passed as zeros (one extra [D] tensor, negligible).
It makes x contiguous itself and does not write into its inputs.

rms_norm: called as ``LigerRMSNormFunction.apply(x, weight, eps, offset=0.0,
casting_mode="gemma", in_place=False)``: offset 0 is plain RMSNorm (Gemma's ``1 + weight``
would be offset 1); casting mode "gemma" keeps everything in fp32 and rounds once, which is
what ``torch.nn.functional.rms_norm`` computes ("llama" rounds x * rstd to bf16/fp16 before
the weight multiply and would not match PyTorch's numbers). ``in_place=False``: liger's
default writes dx into the dy buffer, which the harness reuses between timed calls.

add_rms_norm: ``LigerFusedAddRMSNormFunction.apply(x, residual, weight, eps, 0.0,
"gemma", False)`` -> (normed, x + residual): the sum rounded to x's dtype, the norm of it
in fp32, rounded once, as kernellab.add_rms_norm; ``in_place=False`` for the same reason as
rms_norm's. liger makes its inputs contiguous itself (``ensure_contiguous``) and writes
only its own outputs.

All three: an empty x (no rows) is answered by torch's ops: liger would launch a grid of
zero programs, and a failure there would make the benchmark's admission check drop liger
from the comparison altogether.
"""

from __future__ import annotations

import torch

from kernellab.ops._peers import first_order_only, register_liger


def liger_layer_norm(x, weight, bias=None, eps=1e-5):
    """liger-kernel LigerLayerNormFunction (Triton)."""
    from liger_kernel.ops.layer_norm import LigerLayerNormFunction

    if x.numel() == 0:
        return torch.nn.functional.layer_norm(x, (x.shape[-1],), weight, bias, eps)
    if bias is None:
        bias = torch.zeros_like(weight)
    return first_order_only(LigerLayerNormFunction.apply(x, weight, bias, float(eps)), "layer_norm (liger)")


def liger_rms_norm(x, weight, eps=1e-6):
    """liger-kernel LigerRMSNormFunction (Triton, casting mode gemma, offset 0)."""
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction

    if x.numel() == 0:
        return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps)
    y = LigerRMSNormFunction.apply(x, weight, float(eps), 0.0, "gemma", False)
    return first_order_only(y, "rms_norm (liger)")


def liger_add_rms_norm(x, residual, weight, eps=1e-6):
    """liger-kernel LigerFusedAddRMSNormFunction (Triton, casting mode gemma, offset 0)."""
    from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction

    if x.numel() == 0:
        h = x + residual
        return torch.nn.functional.rms_norm(h, (h.shape[-1],), weight, eps), h
    y, h = LigerFusedAddRMSNormFunction.apply(x, residual, weight, float(eps), 0.0, "gemma", False)
    return first_order_only(y, "add_rms_norm (liger)"), first_order_only(h, "add_rms_norm (liger)")


register_liger("layer_norm", liger_layer_norm, "liger-kernel LigerLayerNormFunction (peer)")
register_liger("rms_norm", liger_rms_norm, "liger-kernel LigerRMSNormFunction, casting mode gemma (peer)")
register_liger("add_rms_norm", liger_add_rms_norm,
               "liger-kernel LigerFusedAddRMSNormFunction, casting mode gemma (peer)")  # fmt: skip
