"""The rotations of rope's two layouts and the cos / sin gather by position ids, shared by
the reference and the backends."""

from __future__ import annotations

import torch


def gather_cos_sin(q, cos, sin, position_ids):
    """cos, sin as ``(B or 1, 1, S, R)`` (broadcast over heads): rows ``position_ids`` of
    the tables, else the given rows."""
    if position_ids is not None:
        cos, sin = cos[position_ids], sin[position_ids]  # (B or 1, S, R)
    if cos.dim() == 2:
        return cos[None, None], sin[None, None]
    return cos[:, None], sin[:, None]


def rotate_half(x):
    """Hugging Face's rotate_half: cat(-x2, x1) of the two halves of the last dim."""
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def rotate_every_two(x):
    """Hugging Face GPT-J's rotate_every_two: (x0, x1, x2, x3, ..) -> (-x1, x0, -x3, x2, ..)."""
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)
