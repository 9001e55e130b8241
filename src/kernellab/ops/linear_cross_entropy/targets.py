"""linear_cross_entropy's targets: the ignore index and the check of target values every
backend runs."""

from __future__ import annotations

import torch

DEFAULT_IGNORE = -100


OP = "linear_cross_entropy"


def check_targets(target: torch.Tensor, v: int, ignore_index: int) -> None:
    """ValueError naming ``target`` when a target is neither ignore_index nor in [0, V)."""
    if not target.numel():
        return
    t = target.reshape(-1)
    lo, hi = torch.stack(torch.aminmax(torch.where(t == ignore_index, 0, t))).tolist()
    if lo < 0 or hi >= v:
        first = int((((t < 0) | (t >= v)) & (t != ignore_index)).nonzero()[0, 0])
        raise ValueError(
            f"{OP}: target (flattened) [{first}] = {int(t[first])} is out of range: targets must be in "
            f"[0, {v}) (V = weight.shape[0]) or equal ignore_index ({ignore_index})"
        )
