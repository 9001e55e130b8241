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
