"""attention's arguments: scale, masks (causal, sliding window), softcap and GQA, and the
refusals backends share."""

from __future__ import annotations

import math

import torch


def _dtype_name(dt) -> str:
    return str(dt).replace("torch.", "")


def check_head_dim(q: torch.Tensor, allowed, backend: str) -> None:
    """Per-backend head-dim restriction, with an error naming q."""
    d = q.shape[-1]
    if d not in allowed:
        raise ValueError(
            f"attention/{backend}: q has head dim {d}; this backend supports {', '.join(map(str, allowed))}"
        )


def is_gqa(q: torch.Tensor, k: torch.Tensor) -> bool:
    """k/v with fewer heads than q (validated: a divisor)."""
    return q.dim() >= 4 and k.shape[-3] != q.shape[-3]


def refuse_gqa(q: torch.Tensor, k: torch.Tensor, backend: str) -> None:
    """For a backend without GQA: a ValueError naming k/v heads (the default dispatcher
    then serves the call from torch)."""
    if is_gqa(q, k):
        raise ValueError(
            f"attention/{backend}: k/v have {k.shape[-3]} heads and q has {q.shape[-3]}; this backend "
            "takes no grouped-query attention (k/v heads must equal q's)"
        )


def expand_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """k, v with each head repeated H_q / H_kv times (q head h reads k/v head
    h // group): for the backends that compute GQA as plain attention (a copy)."""
    if not is_gqa(q, k):
        return k, v
    g = q.shape[-3] // k.shape[-3]
    return k.repeat_interleave(g, dim=-3), v.repeat_interleave(g, dim=-3)


def check_dtype(q: torch.Tensor, allowed, backend: str) -> None:
    if q.dtype not in allowed:
        names = ", ".join(_dtype_name(d) for d in allowed)
        raise TypeError(
            f"attention/{backend}: q has dtype {_dtype_name(q.dtype)}; this backend supports {names}"
        )


def resolve_scale(q: torch.Tensor, scale) -> float:
    return float(scale) if scale is not None else 1.0 / math.sqrt(q.shape[-1]) if q.shape[-1] else 1.0


def window_bounds(window, causal: bool) -> tuple[int, int] | None:
    """(left, right) of an active window, -1 = unbounded, right clipped to 0 under causal;
    None when the window restricts nothing beyond ``causal`` (None, (-1, -1), or causal
    with no left bound)."""
    if window is None:
        return None
    left, right = window
    if causal:
        right = 0
    if left < 0 and right < 0:
        return None
    if causal and left < 0:
        return None
    return left, right


def has_softcap(softcap) -> bool:
    return softcap is not None and softcap > 0


def refuse_options(backend: str, window=None, softcap=None, causal: bool = False) -> None:
    """For a backend without windows or softcaps: a ValueError naming the option."""
    if window_bounds(window, causal) is not None:
        raise ValueError(f"attention/{backend}: window={window!r} is not supported by this backend")
    if has_softcap(softcap):
        raise ValueError(f"attention/{backend}: softcap={softcap!r} is not supported by this backend")


def allowed_mask(s_q: int, s_k: int, causal: bool, window, device) -> torch.Tensor | None:
    """(S_q, S_k) bool, True where query i may attend key j (bottom-right causal and the
    window, module docstring); None when every pair is allowed."""
    bounds = window_bounds(window, causal)
    if not causal and bounds is None:
        return None
    i = torch.arange(s_q, device=device)[:, None] + (s_k - s_q)
    j = torch.arange(s_k, device=device)[None, :]
    ok = j <= i if causal else torch.ones(s_q, s_k, dtype=torch.bool, device=device)
    if bounds is not None:
        left, right = bounds
        if left >= 0:
            ok = ok & (j >= i - left)
        if right >= 0:
            ok = ok & (j <= i + right)
    return ok


def causal_allowed(s_q: int, s_k: int, device) -> torch.Tensor:
    """Bottom-right causal mask (S_q, S_k), True where query i may attend key j:
    j <= i + S_k - S_q."""
    return torch.ones(s_q, s_k, dtype=torch.bool, device=device).tril(diagonal=s_k - s_q)
