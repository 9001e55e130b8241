"""Triton helpers shared by the row-wise ops (softmax, the norms): rows whose starts are off
16-byte boundaries, read as the aligned chunks that hold them."""

from __future__ import annotations

import triton.language as tl

from kernellab import triton_support


@triton_support.jit
def shifted_span(r0, n, total, A: tl.constexpr):
    # A row [r0, r0 + n) of a tensor of ``total`` elements whose rows do not start on
    # 16-byte boundaries (A elements each), in offsets from a0, the start of the aligned
    # A-element chunk holding its first element (all multiples of A but lo and r1):
    # lo, r1: the row; hi: past the chunk holding its last element; lim: past the last
    # whole chunk inside the tensor (< hi only at the tensor's end); [b0, b1): the row's
    # aligned interior. 32-bit offsets (a row is < 2^31 elements).
    a0 = (r0 // A) * A
    lo = (r0 - a0).to(tl.int32)
    r1 = lo + n
    hi = ((r1 + A - 1) // A) * A
    lim = (tl.minimum(total - a0, hi.to(tl.int64)).to(tl.int32) // A) * A
    b0 = ((lo + A - 1) // A) * A
    b1 = (r1 // A) * A
    return a0, lo, r1, hi, lim, b0, b1


@triton_support.jit
def class_span(cls, n_cols, A: tl.constexpr):
    # Every row of shift class cls sits at one shift: from a0, its aligned start, the row is
    # [lo, r1), its interior [b0, b1) and its ends [lo, b0) and [b1, r1); hi: past the chunk
    # holding its last element (shifted_span's, the same for each row of the class).
    lo = (cls * n_cols) % A
    r1 = lo + n_cols
    return lo, r1, ((r1 + A - 1) // A) * A, ((lo + A - 1) // A) * A, (r1 // A) * A


@triton_support.jit
def row_start(row, n_cols, total, hi, A: tl.constexpr):
    # (a0, lim) of a row: its aligned start (= row * n_cols - lo, a multiple of A) and past
    # its last whole chunk inside the tensor (< hi only at the tensor's end)
    a0 = (row * n_cols // A) * A
    return a0, (tl.minimum(total - a0, hi).to(tl.int32) // A) * A
