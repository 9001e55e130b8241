"""Offline weight quantization for the weight-only matmuls (pure PyTorch: it runs once per
weight, so clarity beats speed here).

Layout: the weight is nn.Linear's, ``(N, K) = (out_features, in_features)``, and the
product is ``y = x @ dequant(w_q).T`` as ``F.linear`` computes it. One scale per output
channel (row n), symmetric (no zero point):

    bits=8: scale = max|w[n]| / 127, w_q[n, k] = round(w[n, k] / scale), int8 in [-127, 127]
    bits=4: scale = max|w[n]| / 7,   values in [-7, 7], two per byte along K:
            w_q[n, j] (uint8) = (q[n, 2j] & 0xF) | (q[n, 2j+1] & 0xF) << 4
            (low nibble first, each a 4-bit two's complement value); K must be even.

-128 (-8) is never produced, so the grid is symmetric and ``-w`` quantizes to ``-w_q``.
Scales are fp32 (N x 4 bytes: 0.1% of an int8 4096-wide row). A row of zeros gets scale 1
(any scale reproduces it; 1 avoids a division by zero).
"""

from __future__ import annotations

import math

import torch

QMAX = {8: 127, 4: 7}


def _check_bits(bits, op: str) -> int:
    if isinstance(bits, bool) or bits not in QMAX:
        raise ValueError(f"{op}: bits must be 8 or 4, got {bits!r}")
    return bits


def quantize_weight(w: torch.Tensor, bits: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """``(w_q, scales)`` of a floating weight ``w`` of shape ``(N, K)`` (nn.Linear's
    ``(out_features, in_features)``): per-output-channel symmetric quantization.

    bits=8: ``w_q`` int8 ``(N, K)``; bits=4: ``w_q`` uint8 ``(N, K // 2)``, two signed
    4-bit values per byte along K (low nibble = even k; K must be even). ``scales``: fp32
    ``(N,)``, so that ``w ~= w_q * scales[:, None]`` (``dequantize_weight``)."""
    _check_bits(bits, "quantize_weight")
    if not isinstance(w, torch.Tensor):
        raise TypeError(f"quantize_weight: w must be a torch.Tensor, got {type(w).__name__}")
    if not w.is_floating_point():
        raise TypeError(f"quantize_weight: w must be a floating-point tensor, got dtype {w.dtype}")
    if w.dim() != 2:
        raise ValueError(
            f"quantize_weight: w must be 2-d (N, K) = (out_features, in_features), got shape {tuple(w.shape)}"
        )
    n, k = w.shape
    if bits == 4 and k % 2:
        raise ValueError(f"quantize_weight: bits=4 packs two values per byte along K; w has an odd K = {k}")
    if not torch.isfinite(w).all():
        raise ValueError("quantize_weight: w holds NaN or inf; a finite scale cannot represent it")
    qmax = QMAX[bits]
    w32 = w.detach().float()
    amax = w32.abs().amax(dim=1) if k else torch.zeros(n, device=w.device)
    scales = torch.where(amax > 0, amax / qmax, torch.ones_like(amax))
    q = torch.clamp(torch.round(w32 / scales[:, None]), -qmax, qmax).to(torch.int8)
    if bits == 4:
        q = pack_int4(q)
    return q.contiguous(), scales.contiguous()


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """int8 ``(N, K)`` with values in [-8, 7] -> uint8 ``(N, K // 2)``: k = 2j in the low
    nibble of byte j, k = 2j + 1 in the high one."""
    if q.dtype != torch.int8:
        raise TypeError(f"pack_int4: q must be int8, got {q.dtype}")
    if q.dim() != 2 or q.shape[1] % 2:
        raise ValueError(f"pack_int4: q must be 2-d with an even K, got shape {tuple(q.shape)}")
    if q.numel() and (q.min() < -8 or q.max() > 7):
        raise ValueError("pack_int4: q holds values outside [-8, 7]")
    u = q.to(torch.int16) & 0xF
    return (u[:, 0::2] | (u[:, 1::2] << 4)).to(torch.uint8)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """uint8 ``(N, K // 2)`` -> int8 ``(N, K)`` in [-8, 7] (inverse of ``pack_int4``)."""
    if packed.dtype != torch.uint8:
        raise TypeError(f"unpack_int4: packed must be uint8, got {packed.dtype}")
    p = packed.to(torch.int16)
    lo = ((p & 0xF) ^ 8) - 8  # sign-extend a 4-bit two's complement value
    hi = ((p >> 4) ^ 8) - 8
    return torch.stack((lo, hi), dim=-1).reshape(*packed.shape[:-1], -1).to(torch.int8)


def int_values(w_q: torch.Tensor, bits: int) -> torch.Tensor:
    """The integer weight ``(N, K)`` (int8) behind ``w_q``."""
    return w_q if bits == 8 else unpack_int4(w_q)


def dequantize_weight(
    w_q: torch.Tensor, scales: torch.Tensor, bits: int = 8, dtype=torch.float32
) -> torch.Tensor:
    """``w_q * scales[:, None]`` in ``dtype`` (``(N, K)``), computed in fp32 (float64 for a
    float64 ``dtype``). ``w_q`` and ``scales`` as ``quantize_weight(w, bits)`` returned them."""
    _check_bits(bits, "dequantize_weight")
    want = torch.int8 if bits == 8 else torch.uint8
    for name, t in (("w_q", w_q), ("scales", scales)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"dequantize_weight: {name} must be a torch.Tensor, got {type(t).__name__}")
    if w_q.dtype != want:
        raise TypeError(f"dequantize_weight: w_q must be {want} for bits={bits}, got {w_q.dtype}")
    if w_q.dim() != 2:
        raise ValueError(f"dequantize_weight: w_q must be 2-d, got shape {tuple(w_q.shape)}")
    if not scales.is_floating_point() or tuple(scales.shape) != (w_q.shape[0],):
        raise ValueError(f"dequantize_weight: scales must be floating-point of shape ({w_q.shape[0]},) "
                         f"(one per row of w_q), got {scales.dtype} {tuple(scales.shape)}")  # fmt: skip
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dequantize_weight: dtype must be a floating-point torch.dtype, got {dtype!r}")
    wide = torch.float64 if dtype == torch.float64 else torch.float32
    return (int_values(w_q, bits).to(wide) * scales.to(wide)[:, None]).to(dtype)


def sqnr(y: torch.Tensor, y_ref: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio in dB: 10 log10(sum y_ref^2 / sum (y - y_ref)^2),
    in float64 (inf when equal). Per-channel int8 weights give ~40 dB on Gaussian weights,
    int4 ~20 dB (each bit is ~6 dB)."""
    a, b = y.detach().double(), y_ref.detach().double()
    noise = (a - b).pow(2).sum().item()
    signal = b.pow(2).sum().item()
    if noise == 0:
        return math.inf
    return 10.0 * math.log10(signal / noise) if signal > 0 else -math.inf
