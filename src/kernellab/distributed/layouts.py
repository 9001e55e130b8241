"""How a sequence is cut across the W ranks of a ring, and which attention blocks each
ring step computes.

Layouts (S = W * S_local tokens in all; rank r holds S_local of them, in increasing
global order, so a rank's own block is always "causal on the diagonal"):

- ``contiguous``: rank r holds tokens [r S_local, (r+1) S_local). Causal attention is
  lopsided: rank W-1 computes W blocks (one of them half), rank 0 one half block, so the
  ring runs at the pace of the last rank (causal efficiency ~ (W+1)/(2W) at best).
- ``zigzag``: the sequence cut in 2W chunks of c = S_local / 2; rank r holds chunks r and
  2W-1-r. Every rank does the same work at every step: its diagonal block at step 0, then
  either all its queries against the first half of the visiting K/V (the visitor is an
  earlier rank) or the second half of its queries against all of it (a later rank). Each
  of those is a full (unmasked) block of c x 2c, so no step needs a custom mask.
- ``striped``: token t on rank t mod W (rank r holds r, r + W, r + 2W, ...). Local query i
  is token r + W i, local key j of rank src is src + W j, and the causal rule
  ``src + W j <= r + W i`` becomes ``j <= i`` when src <= r and ``j < i`` when src > r. The
  strict case is the diagonal block of queries 1.. against keys ..S_local-2 (query 0 sees
  nothing from that rank): an equal-length causal block again.

Every block call is (query slice, key slice, causal) with causal only on equal-length
blocks, where top-left and bottom-right alignment agree: the local kernels are used as they
are, whatever their alignment convention.
"""

from __future__ import annotations

import torch

LAYOUTS = ("contiguous", "zigzag", "striped")

Call = tuple[slice, slice, bool]  # (query rows, key rows, causal)


def check_layout(layout) -> str:
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(map(repr, LAYOUTS))}, got {layout!r}")
    return layout


def _check_world(rank: int, world: int) -> None:
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise ValueError(f"world must be a positive int, got {world!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world:
        raise ValueError(f"rank must be an int in [0, {world}), got {rank!r}")


def granule(layout: str, world: int) -> int:
    """The global sequence length must be a multiple of this (2W chunks for zigzag)."""
    return 2 * world if check_layout(layout) == "zigzag" else world


def positions(rank: int, world: int, s_local: int, layout: str) -> torch.Tensor:
    """Global token indices held by ``rank``, in local order (int64, length s_local)."""
    _check_world(rank, world)
    check_layout(layout)
    if layout == "contiguous":
        return torch.arange(rank * s_local, (rank + 1) * s_local)
    if layout == "striped":
        return torch.arange(s_local) * world + rank
    if s_local % 2:
        raise ValueError(f"zigzag needs an even local sequence length, got {s_local}")
    c = s_local // 2
    return torch.cat(
        [
            torch.arange(rank * c, (rank + 1) * c),
            torch.arange((2 * world - 1 - rank) * c, (2 * world - rank) * c),
        ]
    )


def shard(x: torch.Tensor, rank: int, world: int, layout: str = "contiguous", dim: int = -2) -> torch.Tensor:
    """The part of ``x`` (the full sequence along ``dim``) that ``rank`` holds; a fresh
    contiguous tensor."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"shard: x must be a torch.Tensor, got {type(x).__name__}")
    _check_world(rank, world)
    check_layout(layout)
    s = x.shape[dim]
    g = granule(layout, world)
    if s == 0 or s % g:
        raise ValueError(
            f"shard: x has {s} tokens along dim {dim}; layout {layout!r} over {world} ranks needs a "
            f"positive multiple of {g}"
            + (" (2 x world: zigzag cuts the sequence in 2W chunks)" if layout == "zigzag" else "")
        )
    s_local = s // world
    if layout == "contiguous":
        return x.narrow(dim, rank * s_local, s_local).contiguous()
    if layout == "striped":
        d = dim % x.dim()
        return x.unflatten(d, (s_local, world)).select(d + 1, rank).contiguous()
    c = s_local // 2
    return torch.cat(
        [x.narrow(dim, rank * c, c), x.narrow(dim, (2 * world - 1 - rank) * c, c)], dim=dim
    ).contiguous()


def unshard(shards, layout: str = "contiguous", dim: int = -2) -> torch.Tensor:
    """The full sequence from every rank's shard (``shards[r]`` from rank r): the inverse of
    ``shard``."""
    shards = list(shards)
    check_layout(layout)
    if not shards:
        raise ValueError("unshard: shards is empty")
    shapes = {tuple(t.shape) for t in shards}
    if len(shapes) != 1:
        raise ValueError(
            f"unshard: shards have different shapes {sorted(shapes)}; every rank holds as many tokens"
        )
    if layout == "contiguous":
        return torch.cat(shards, dim=dim)
    if layout == "striped":
        d = dim % shards[0].dim()
        return torch.stack(shards, dim=d + 1).flatten(d, d + 1)
    s_local = shards[0].shape[dim]
    if s_local % 2:
        raise ValueError(f"unshard: zigzag shards need an even length along dim {dim}, got {s_local}")
    c = s_local // 2
    firsts = [t.narrow(dim, 0, c) for t in shards]
    seconds = [t.narrow(dim, c, c) for t in shards]
    return torch.cat(firsts + seconds[::-1], dim=dim)


def block_calls(layout: str, causal: bool, rank: int, src: int, world: int, s_local: int) -> list[Call]:
    """The attention blocks ``rank``'s queries compute against the K/V block that ``src``
    holds (module docstring). Causal calls are always square."""
    every = slice(0, s_local)
    if not causal:
        return [(every, every, False)]
    if src == rank:
        return [(every, every, True)]
    if layout == "contiguous":
        return [(every, every, False)] if src < rank else []
    if layout == "zigzag":
        c = s_local // 2
        return [(every, slice(0, c), False)] if src < rank else [(slice(c, s_local), every, False)]
    # striped
    if src < rank:
        return [(every, every, True)]
    return [(slice(1, s_local), slice(0, s_local - 1), True)] if s_local > 1 else []
