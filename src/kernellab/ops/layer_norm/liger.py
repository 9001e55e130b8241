"""liger-kernel's LayerNorm as a peer backend (``liger``), when liger-kernel is installed.

Called as liger users call it: ``LigerLayerNormFunction.apply(x, weight, bias, eps)``
(Triton; saves mean and rstd, reduces dweight/dbias from per-program partials). liger
needs a bias tensor: ``bias=None`` is passed as zeros (one extra [D] tensor, negligible).
It makes x contiguous itself and does not write into its inputs.

An empty x (no rows) is answered by torch's op: liger would launch a grid of zero
programs, and a failure there would make the benchmark's admission check drop liger from
the comparison altogether.
"""

from __future__ import annotations

import torch

from kernellab.ops._peers import first_order_only, refuse_wide_rows, register_liger


def liger_layer_norm(x, weight, bias=None, eps=1e-5):
    """liger-kernel LigerLayerNormFunction (Triton)."""
    refuse_wide_rows("layer_norm (liger)", "x", x)
    from liger_kernel.ops.layer_norm import LigerLayerNormFunction

    if x.numel() == 0:
        return torch.nn.functional.layer_norm(x, (x.shape[-1],), weight, bias, eps)
    if bias is None:
        bias = torch.zeros_like(weight)
    return first_order_only(LigerLayerNormFunction.apply(x, weight, bias, float(eps)), "layer_norm (liger)")


register_liger("layer_norm", liger_layer_norm, "liger-kernel LigerLayerNormFunction (peer)")
