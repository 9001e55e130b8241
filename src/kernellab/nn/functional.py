"""kernellab ops behind PyTorch's functional signatures (``torch.nn.functional``).

``import kernellab.nn.functional as F`` in place of ``import torch.nn.functional as F``
changes an import, not a call. Each function takes PyTorch's arguments in PyTorch's order
and gives PyTorch's result; it runs the kernellab op (``backend=`` as everywhere in
kernellab) when the op computes what was asked, and PyTorch's own function for the
options no kernellab op implements (named in each docstring), so an answer is never wrong.
The kernellab ops themselves keep their own documented signatures
(``kernellab.layer_norm(x, weight, bias, eps)`` and so on).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as _F

from kernellab.ops import public as _kl


def _normalized_dims(normalized_shape, x: torch.Tensor, name: str = "normalized_shape") -> int:
    """How many trailing dims of x the norm covers; a ValueError naming the argument when
    normalized_shape is not x's trailing shape."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"input must be a torch.Tensor, got {type(x).__name__}")
    if isinstance(normalized_shape, int):
        shape = (normalized_shape,)
    elif isinstance(normalized_shape, (tuple, list, torch.Size)):
        shape = tuple(normalized_shape)
    else:
        raise TypeError(f"{name} must be an int or a sequence of ints, got {type(normalized_shape).__name__}")
    k = len(shape)
    if k == 0 or k > x.dim() or tuple(x.shape[x.dim() - k :]) != shape:
        raise ValueError(f"{name}={shape} must be the trailing shape of input {tuple(x.shape)}")
    return k


def _flat(t: torch.Tensor | None, k: int) -> torch.Tensor | None:
    return None if t is None else t.reshape(*t.shape[: t.dim() - k], -1) if k > 1 else t


def _affine(t, input: torch.Tensor, k: int, name: str):
    """``t`` (weight or bias) flattened as the rows are; a ValueError naming it when its shape
    is not normalized_shape (PyTorch's rule; a flattened (6,) weight would pass the op's own
    check for (3, 2) rows and be applied in another order)."""
    shape = tuple(input.shape[input.dim() - k :])
    if isinstance(t, torch.Tensor) and tuple(t.shape) != shape:
        raise ValueError(f"{name} of shape {tuple(t.shape)} must have normalized_shape {shape}")
    return _flat(t, k)


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5, *, backend=None):
    """``torch.nn.functional.layer_norm``: over the trailing ``normalized_shape`` (several
    trailing dims are flattened into one row, which is the same normalization).
    ``weight=None`` normalizes with a weight of ones."""
    k = _normalized_dims(normalized_shape, input)
    x = _flat(input, k)
    if weight is None:
        weight = torch.ones(input.shape[input.dim() - k :], device=input.device, dtype=input.dtype)
    y = _kl.layer_norm(x, _affine(weight, input, k, "weight"), _affine(bias, input, k, "bias"), eps=eps,
                       backend=backend)  # fmt: skip
    return y.view(input.shape) if k > 1 else y


def rms_norm(input, normalized_shape, weight=None, eps=None, *, backend=None):
    """``torch.nn.functional.rms_norm``: ``eps=None`` is PyTorch's default, the machine
    epsilon of the dtype it computes in (``torch.finfo(torch.float32).eps`` for fp16 and
    bf16 input, ``torch.finfo(input.dtype).eps`` otherwise); ``weight=None`` is a weight of
    ones."""
    k = _normalized_dims(normalized_shape, input)
    x = _flat(input, k)
    if eps is None:
        if not input.is_floating_point():
            raise TypeError(f"input must be a floating-point tensor, got dtype {input.dtype}")
        eps = torch.finfo(torch.float32 if input.element_size() < 4 else input.dtype).eps
    if weight is None:
        weight = torch.ones(input.shape[input.dim() - k :], device=input.device, dtype=input.dtype)
    y = _kl.rms_norm(x, _affine(weight, input, k, "weight"), eps=eps, backend=backend)
    return y.view(input.shape) if k > 1 else y


def gelu(input, approximate="none", *, backend=None):
    """``torch.nn.functional.gelu``: ``approximate="tanh"`` runs kernellab.gelu;
    ``"none"`` (the exact erf form, which kernellab.gelu does not compute) runs PyTorch's."""
    if approximate == "tanh":
        return _kl.gelu(input, backend=backend)
    if approximate == "none":
        return _F.gelu(input)
    raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")


def cross_entropy(
    input,
    target,
    weight=None,
    size_average=None,
    ignore_index=-100,
    reduce=None,
    reduction="mean",
    label_smoothing=0.0,
    *,
    backend=None,
):
    """``torch.nn.functional.cross_entropy`` with class indices as targets.

    Shapes: ``(N, C)`` with ``(N,)``; ``(C,)`` with ``()``; ``(N, C, d1, ...)`` with
    ``(N, d1, ...)`` (class dim 1, as PyTorch); and language-model logits ``(B, T, V)``
    with targets ``(B, T)`` (class dim last) where PyTorch's class-dim-1 reading does not
    fit the target's shape (when both fit, PyTorch's reading is the one taken).
    ``reduction="none"`` returns the loss in the target's shape. ``weight``,
    ``label_smoothing`` > 0, probability targets and the legacy ``size_average`` /
    ``reduce`` run PyTorch's function (kernellab.cross_entropy implements none of them).
    """
    for name, t in (("input", input), ("target", target)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if input.dim() == 0:
        raise ValueError("input must have at least one dim (the classes), got a 0-d tensor")
    if (
        weight is not None
        or label_smoothing != 0.0
        or size_average is not None
        or reduce is not None
        or target.is_floating_point()
    ):
        return _F.cross_entropy(
            input, target, weight, size_average, ignore_index, reduce, reduction, label_smoothing
        )
    if input.dim() == 1:
        if target.dim() != 0:
            raise ValueError(
                f"target of shape {tuple(target.shape)} must be 0-d for a 1-d input (one sample)"
            )
        logits, tgt = input.unsqueeze(0), target.reshape(1)
    elif input.dim() == 2:
        logits, tgt = input, target
    else:
        torch_shape = (input.shape[0], *input.shape[2:])
        if tuple(target.shape) == torch_shape:
            logits = input.movedim(1, -1).reshape(-1, input.shape[1])
        elif tuple(target.shape) == tuple(input.shape[:-1]):
            logits = input.reshape(-1, input.shape[-1])
        else:
            raise ValueError(
                f"target of shape {tuple(target.shape)} fits neither {torch_shape} (class dim 1) "
                f"nor {tuple(input.shape[:-1])} (class dim last) for input {tuple(input.shape)}"
            )
        tgt = target.reshape(-1)
    loss = _kl.cross_entropy(logits, tgt, ignore_index=ignore_index, reduction=reduction, backend=backend)
    return loss.view(target.shape) if reduction == "none" else loss


def scaled_dot_product_attention(
    query,
    key,
    value,
    attn_mask=None,
    dropout_p=0.0,
    is_causal=False,
    scale=None,
    enable_gqa=False,
    *,
    backend=None,
):
    """``torch.nn.functional.scaled_dot_product_attention``. kernellab.attention runs
    no mask, causal with ``S_q == S_k`` (PyTorch's causal mask is aligned top-left,
    kernellab's bottom-right: the same square), and GQA with ``enable_gqa=True``. An
    ``attn_mask``, ``dropout_p > 0``, causal with ``S_q != S_k``, differing head counts
    without ``enable_gqa`` (PyTorch's error), a scale that is not positive and finite, or
    4-D shapes kernellab refuses run PyTorch's."""
    if not sdpa_supported(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa, scale):
        gqa = {"enable_gqa": True} if enable_gqa else {}  # (the keyword is torch >= 2.5)
        return _F.scaled_dot_product_attention(
            query, key, value, attn_mask, dropout_p, is_causal, scale=scale, **gqa
        )
    return _kl.attention(query, key, value, causal=bool(is_causal), scale=scale, backend=backend)


def sdpa_supported(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, enable_gqa=False, scale=None
) -> bool:
    """Whether kernellab.attention computes this SDPA call exactly (see
    scaled_dot_product_attention)."""
    if attn_mask is not None or dropout_p != 0.0 or query.dim() < 3 or query.dim() != key.dim():
        return False
    if scale is not None and not (isinstance(scale, (int, float)) and 0 < scale < math.inf):
        return False  # kernellab.attention takes a positive finite scale; PyTorch any
    if key.shape != value.shape or query.shape[-1] != key.shape[-1]:
        return False
    if is_causal and query.shape[-2] != key.shape[-2]:
        return False
    if query.dim() >= 4 and query.shape[-3] != key.shape[-3]:
        hq, hkv = query.shape[-3], key.shape[-3]
        if not enable_gqa or hq % hkv:
            return False
        lead_q, lead_k = query.shape[:-3], key.shape[:-3]
    else:
        lead_q, lead_k = query.shape[:-2], key.shape[:-2]
    return tuple(lead_q) == tuple(lead_k)


__all__ = ["cross_entropy", "gelu", "layer_norm", "rms_norm", "scaled_dot_product_attention"]
