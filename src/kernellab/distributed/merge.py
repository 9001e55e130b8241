"""Merging one block's partial attention into the running result, by log-sum-exp.

Per row: lse = logaddexp(acc_lse, lse_b); acc_o = acc_o e^(acc_lse - lse) + o_b e^(lse_b - lse),
in the accumulators' dtype (fp32; float64 for float64 inputs), never the inputs' 16-bit one.

PyTorch ops, any device. A fused Triton merge (one pass over acc and o_b instead of ~6:
~0.2 ms against ~0.8 ms at B=1 H=32 S_local=16k D=128, about 15% of a causal ring step)
passed under the CPU interpreter and failed on the H100 (Triton 3.6): rows 4k and 4k+1 of
in-place updated tiles came out wrong, differently from run to run, with both of
kernellab's launch paths. It was removed until it can be written so that it is correct
there (benchmarks/NOTES.md, tenth session).
"""

from __future__ import annotations

import torch


def merge_(acc_o, acc_lse, o_b, lse_b) -> None:
    """Fold one block's (o_b, lse_b) into (acc_o, acc_lse) in place."""
    o_b = o_b.to(acc_o.dtype)
    lse_b = lse_b.to(acc_lse.dtype)
    new = torch.logaddexp(acc_lse, lse_b)
    # A row that has seen no key yet (both -inf): weights exp(-inf - 0) = 0, not nan.
    m = torch.where(torch.isinf(new), torch.zeros_like(new), new)
    acc_o.mul_(torch.exp(acc_lse - m).unsqueeze(-1)).add_(o_b * torch.exp(lse_b - m).unsqueeze(-1))
    acc_lse.copy_(new)
