"""Merging one block's partial attention into the running result, by log-sum-exp.

Per row: lse = logaddexp(acc_lse, lse_b); acc_o = acc_o e^(acc_lse - lse) + o_b e^(lse_b - lse),
in the accumulators' dtype (fp32; float64 for float64 inputs), never the inputs' 16-bit one.

PyTorch ops, any device. A fused Triton merge would make one pass over acc and o_b instead
of ~6, but an in-place tiled merge is not yet correct on Hopper GPUs (rows 4k and 4k+1 of
updated tiles come out wrong, differently from run to run), so the merge stays in PyTorch.
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
