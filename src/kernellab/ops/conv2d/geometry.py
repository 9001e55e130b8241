"""conv2d's geometry: stride and padding pairs and the output size."""

from __future__ import annotations

import numbers


def as_pair(v, name: str, minimum: int) -> tuple[int, int]:
    """``v`` (an int or a pair of ints) as an (h, w) pair, each >= minimum; else an error
    naming ``name``."""
    vals = tuple(v) if isinstance(v, (tuple, list)) else (v, v)
    if len(vals) != 2 or not all(isinstance(a, numbers.Integral) and not isinstance(a, bool) for a in vals):
        raise TypeError(f"conv2d: {name} must be an int or a pair of ints, got {v!r}")
    vals = (int(vals[0]), int(vals[1]))
    if min(vals) < minimum:
        raise ValueError(f"conv2d: {name} must be >= {minimum}, got {v!r}")
    return vals


def out_size(h: int, w: int, r: int, s: int, stride, padding) -> tuple[int, int]:
    """(P, Q) of the output."""
    (sh, sw), (ph, pw) = stride, padding
    return (h + 2 * ph - r) // sh + 1, (w + 2 * pw - s) // sw + 1
