"""Dot products the Triton kernels share: fp32 operands rounded to TF32 the way cuBLAS and
cuDNN round them, and the two-level summation that keeps an IEEE fp32 accumulation near a
tree's error.

PREC, a constexpr string, names the dot: "ieee" (fp32 FMAs), "tf32" (16-bit operands,
where it has no effect; or fp32 operands the tensor cores truncate), "tf32rn" (fp32
operands rounded to nearest TF32 first, then TF32 dots), "x3" (fp32 operands as a TF32
head and a TF32 rest, both rounded to nearest, in three TF32 dots: head x head, and
apart from it head x rest + rest x head; the rest x rest term, ~2^-22 of a product, is
dropped), "x3s" (the same three dots on operands split into head and rest ahead of the
kernel, ``mma_x3_split``), "ieee64" (fp32 operands widened to fp64, an fp64 dot, rounded
to fp32 once: the products exact and their sum fp64). ``dot_precision`` gives the
launchers' value.
"""

from __future__ import annotations

import torch
import triton.language as tl

from kernellab import triton_support


def dot_precision(dtype: torch.dtype, tf32: bool, interpreted: bool, fp32_dots: str = "ieee") -> str:
    """PREC for operands of ``dtype`` with TF32 allowed or not: fp32 is ``fp32_dots``
    ("ieee" or "x3"), or with TF32 "tf32rn" on a GPU ("tf32" when the launch is
    ``interpreted``: the interpreter has no PTX and computes fp32 dots exactly); 16-bit
    operands "tf32" (the setting does not apply to them)."""
    if dtype != torch.float32:
        return "tf32"
    if not tf32:
        if fp32_dots not in ("ieee", "x3"):
            raise ValueError(f"fp32_dots: 'ieee' or 'x3', got {fp32_dots!r}")
        return fp32_dots
    return "tf32" if interpreted else "tf32rn"


@triton_support.jit
def tf32_rn(x):
    # fp32 -> TF32 rounded to nearest (what cuBLAS and cuDNN do with TF32 on). Handed raw
    # fp32 registers, the tensor cores drop the low 13 mantissa bits (truncation): ~2x the
    # rounding error, enough to put attention past the check's bound (2 x PyTorch's TF32
    # error).
    return tl.inline_asm_elementwise(
        "cvt.rna.tf32.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1
    )


@triton_support.jit
def tf32_round(x):
    # fp32 -> TF32 rounded to nearest, ties away from zero (cvt.rna's rounding) in integer
    # arithmetic, so the interpreter runs it too: add half of the 13 dropped bits, clear
    # them. NaN stays NaN (a NaN of low payload bits alone would round to inf).
    bits = x.to(tl.uint32, bitcast=True)
    r = ((bits + 0x1000) & 0xFFFFE000).to(tl.float32, bitcast=True)
    return tl.where(x == x, r, x)


@triton_support.jit
def x3_dots(a_hi, a_lo, b_hi, b_lo, c=None):
    # c + a @ b from TF32 heads and rests (a = a_hi + a_lo): the head product accumulated on
    # c, the rest terms summed apart from it and added once (their own rounding is ~2^-11 of
    # the head's). A NaN among them where head x head is finite (an inf operand: inf - inf)
    # is dropped, as the head product alone then carries the inf.
    rest = tl.dot(a_lo, b_hi, input_precision="tf32")
    rest = tl.dot(a_hi, b_lo, acc=rest, input_precision="tf32")
    rest = tl.where(rest == rest, rest, 0.0)
    return tl.dot(a_hi, b_hi, acc=c, input_precision="tf32") + rest


@triton_support.jit
def dot_x3(a, b, c=None):
    # c + a @ b as "x3" (module docstring): split in registers, then ``x3_dots``.
    a_hi = tf32_round(a)
    b_hi = tf32_round(b)
    return x3_dots(a_hi, tf32_round(a - a_hi), b_hi, tf32_round(b - b_hi), c)


@triton_support.jit
def dot(a, b, PREC: tl.constexpr, c=None):
    """c + a @ b in fp32 (c None: 0) with the dot PREC names (module docstring)."""
    if PREC == "tf32rn":
        return tl.dot(tf32_rn(a), tf32_rn(b), acc=c, input_precision="tf32")
    elif PREC == "x3":
        return dot_x3(a, b, c)
    elif PREC == "ieee64":
        r = tl.dot(a.to(tl.float64), b.to(tl.float64), out_dtype=tl.float64).to(tl.float32)
        return r if c is None else c + r
    else:
        return tl.dot(a, b, acc=c, input_precision=PREC)


@triton_support.jit
def two_level(a, b, acc, PREC: tl.constexpr):
    """acc + (a @ b summed apart): two-level summation for fp32 operands. Chained through
    acc=, an IEEE fp32 dot adds every term of every K block into one accumulator in
    sequence, and that rounding walk grows with K (past the check's bound, 2 x SDPA's or
    cuBLAS's error, in attention's dv over ~1000 rows and in matmul at K = 3152). The
    block's product starts from acc * 0.0, not from a constant 0: Triton's dot-add combine
    rewrites "acc + dot(a, b, 0)" into dot(a, b, acc),
    the very chain this avoids. Where acc is +-inf, acc * 0.0 would be NaN: those lanes
    start from 0.0."""
    zero = tl.where(tl.abs(acc) < float("inf"), acc * 0.0, 0.0)
    return acc + dot(a, b, PREC, zero)


@triton_support.jit
def mma(a, b, acc, PREC: tl.constexpr):
    """acc + a @ b for a K loop: fp32-level dots ("ieee", "x3", "ieee64") summed a K block at
    a time (``two_level``), TF32 and 16-bit dots accumulated in the MMA (their operand
    rounding dominates)."""
    if PREC == "ieee" or PREC == "x3" or PREC == "ieee64":
        return two_level(a, b, acc, PREC)
    else:
        return dot(a, b, PREC, acc)


@triton_support.jit
def mma_x3_split(a_hi, a_lo, b_hi, b_lo, acc):
    """acc + a @ b as "x3" (and summed as ``two_level``) for operands split ahead into
    TF32 heads and rests (a = a_hi + a_lo, each TF32-valued, as ``dot_x3`` splits them):
    the same three dots, bit for bit, with the tiles going to the tensor cores as loaded."""
    zero = tl.where(tl.abs(acc) < float("inf"), acc * 0.0, 0.0)
    return acc + x3_dots(a_hi, a_lo, b_hi, b_lo, zero)
