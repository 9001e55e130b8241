"""liger-kernel's RMSNorm as a peer backend (``liger``), when liger-kernel is installed.

Called as ``LigerRMSNormFunction.apply(x, weight, eps, offset=0.0, casting_mode="gemma",
in_place=False)``: offset 0 is plain RMSNorm (Gemma's ``1 + weight`` would be offset 1);
casting mode "gemma" keeps everything in fp32 and rounds once, which is what
``torch.nn.functional.rms_norm`` computes ("llama" rounds x * rstd to bf16/fp16 before the
weight multiply and would not match PyTorch's numbers). ``in_place=False``: liger's
default writes dx into the dy buffer, which the harness reuses between timed calls.

An empty x (no rows) is answered by torch's op: liger would launch a grid of zero
programs, and a failure there would make the benchmark's admission check drop liger from
the comparison altogether.
"""

from __future__ import annotations

import torch

from kernellab.ops._peers import first_order_only, refuse_wide_rows, register_liger


def liger_rms_norm(x, weight, eps=1e-6):
    """liger-kernel LigerRMSNormFunction (Triton, casting mode gemma, offset 0)."""
    refuse_wide_rows("rms_norm (liger)", "x", x)
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction

    if x.numel() == 0:
        return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps)
    y = LigerRMSNormFunction.apply(x, weight, float(eps), 0.0, "gemma", False)
    return first_order_only(y, "rms_norm (liger)")


register_liger("rms_norm", liger_rms_norm, "liger-kernel LigerRMSNormFunction, casting mode gemma (peer)")
