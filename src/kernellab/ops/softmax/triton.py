"""Softmax in Triton: kernels, launchers, custom op, registration.

Rows that fit one block (next power of two <= MAX_SINGLE) are loaded once, reduced in
registers and written: 1 read + 1 write per element, the minimum; short rows share a
program (ROWS of them, ~4096 elements; ~1024 for rows of 256 or fewer). Rows of up to
MAX_WHOLE columns (128 KB of fp32) are held whole too, by a warp per 1024 columns, except
in the 16-bit forward, where streaming them is faster. A longer row is streamed twice with the
online-softmax recurrence: the first pass keeps a running bound m and the running sum s,
in base 2 with m an integer, so that the rescale when m grows is an exact power of two
(_stream_step); the second writes 2^(x log2(e) - m) / s: 2 reads + 1 write per element
instead of the 3 reads + 1 write of max / sum / write passes. Rows whose width is not a
multiple of 16 bytes start off 16-byte boundaries; they are streamed as the aligned chunks
that hold them (_fwd_row_shifted), so that reads and writes stay 16 bytes wide, and a whole
row one a program is read once as those chunks (_fwd_row_whole_shifted) where they fit its
block.

Backward, dx = y * (dy - sum(dy * y)), has the same two shapes (one block, or a sum pass and
a write pass). For fp32 rows the sum is compensated fp32 (a pair hi + lo, see
_softmax_bwd_kernel), as accurate as an fp64 sum.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton.language as tl

from kernellab import triton_support
from kernellab.ops._elementwise import unary_op
from kernellab.ops._register import register_triton
from kernellab.ops._triton_rows import shifted_span

MAX_SINGLE = 8192  # widest row kept in one block (fp32: 32 KB of registers per row program)
MAX_WHOLE = 32768  # widest row held whole by whole_warps warps (fp32: 128 KB)


@dataclass(frozen=True)
class Config:
    """Launch knobs of the Triton softmax forward, passed to ``_fwd`` (``CONFIG`` when not
    given; tuning scripts pass their own). Measurements behind the defaults: benchmarks/
    NOTES.md, "Softmax fp32 forward, the last 0.2%" and "Row-wise forwards".

    fwd_even: unmasked loads and stores when the rows fill the blocks exactly.
    fwd_narrow: 32-bit offsets below 2^31 elements.
    fwd_warps: forward warps (None: _config's choice, 16 for fp32 rows that re-read).
    fwd_reread: whole rows take the statistics from x in registers and the output from x
        read again (from L2: the first read evict_last, the second evict_first); None:
        from reread_min_cols columns up.
    rows, warps: whole-row programs' rows per program and warps (None: _config's).
    min_per_sm: rows of up to 1024 columns that would fill fewer programs than this many
        per SM run one row a program (0: never).
    stream_block, stream_warps: a streamed row's columns per step and warps.
    stream_waves: streamed rows run on stream_waves x SMs programs, each walking rows
        (0: one program per row).
    bwd_hints: the streamed backward's sum pass reads evict_last, its write pass evict_first.
    max_single: the widest block of whole rows at rows x warps (wider rows stream, or
        up to max_whole are held whole).
    max_whole, whole_warps: rows wider than max_single up to a block of max_whole held
        whole, one per program of whole_warps warps (None: one per 1024 columns), never
        re-read: fp32 both ways, 16-bit in the backward (the 16-bit forward streams them).
    whole_shifted: whole rows one a program off 16-byte boundaries read and written as the
        aligned chunks that hold them, 16 bytes at a time (_align; not the fp32 backward's);
        False: one element at a time."""

    fwd_even: bool = True
    fwd_narrow: bool = True
    fwd_warps: int | None = None
    fwd_reread: bool | None = None
    reread_min_cols: int = 2048
    rows: int | None = None
    warps: int | None = None
    min_per_sm: int = 4
    stream_block: int = 8192
    stream_warps: int = 16
    stream_waves: int = 0
    bwd_hints: bool = True
    max_single: int = MAX_SINGLE
    max_whole: int = MAX_WHOLE
    whole_warps: int | None = None
    whole_shifted: bool = True


CONFIG = Config()


LOG2E = tl.constexpr(1.4426950408889634)


@triton_support.jit
def _stream_step(m, s, x):
    # One step of a streamed row's statistics, in base 2: m an integer (held in a float)
    # at or above every x log2(e) seen so far, s the sum of 2^(x log2(e) - m). A grown m
    # rescales s by 2^(old - new), a power of two, so exactly (the natural-base recurrence,
    # s e^(m_old - m_new), rounds at every rescale: about an ulp each, more than the check
    # allows fp32 rows). Until a finite value arrives m is -inf and s stays 0 (a row
    # opening with whole steps of -inf, as masks make).
    m_new = tl.maximum(m, tl.math.ceil(tl.max(x, axis=0) * LOG2E))
    seen = m_new > -float("inf")
    scale = tl.where(seen, tl.math.exp2(m - m_new), 0.0)
    terms = tl.math.exp2(tl.fma(x, LOG2E, -tl.where(seen, m_new, 0.0)))
    return m_new, s * scale + tl.sum(terms, axis=0)


@triton_support.jit
def _stream_out(x, m, s):
    # the softmax of x from a streamed row's statistics (_stream_step); a row of -inf only
    # (m = -inf) gives NaN, as torch
    return tl.math.exp2(tl.fma(x, LOG2E, -m)) / s


@triton_support.jit
def _tail_chunk(p, lim, lo, r1, A: tl.constexpr, other):
    # the tensor's last partial chunk of a shifted row, past lim (only the tensor's last row
    # has elements there), read apart so that no load passes the tensor; fp32
    tj = lim + tl.arange(0, A)
    return tl.load(p + tj, mask=(tj >= lo) & (tj < r1), other=other).to(tl.float32)


@triton_support.jit
def _fwd_write_end(xp, yp, j, emask, m, s, STREAM: tl.constexpr):
    # elements j (emask) of a row read and written one at a time from its statistics:
    # STREAM, _stream_step's (base 2); else the max and the sum of exp(x - max)
    x = tl.load(xp + j, mask=emask, other=0.0).to(tl.float32)
    y = _stream_out(x, m, s) if STREAM else tl.exp(x - m) / s
    tl.store(yp + j, y.to(yp.dtype.element_ty), mask=emask)


@triton_support.jit
def _fwd_write_ends(xp, yp, lo, r1, b0, b1, m, s, A: tl.constexpr, STREAM: tl.constexpr):
    # the < A elements at each end of a shifted row (offsets from its aligned start)
    ends = tl.arange(0, A)
    _fwd_write_end(xp, yp, ends, (ends >= lo) & (ends < b0), m, s, STREAM)  # [lo, b0)
    _fwd_write_end(xp, yp, b1 + ends, b1 + ends < r1, m, s, STREAM)  # [b1, r1)


@triton_support.jit
def _fwd_row_shifted(x_ptr, y_ptr, r0, n, total, BLOCK: tl.constexpr, A: tl.constexpr):
    # The softmax of one row whose rows do not start on 16-byte boundaries (shifted_span).
    # It is read as the aligned chunks that hold it, 16 bytes a load (the neighbours'
    # values taken as -inf), and written as its aligned interior, 16 bytes a store, plus
    # the < A elements at each end one at a time. The tensor's last partial chunk (the last
    # row's end, past lim) is read apart, so that no load passes the tensor.
    cols = tl.arange(0, BLOCK)
    a0, lo, r1, hi, lim, b0, b1 = shifted_span(r0, n, total, A)
    xp = x_ptr + a0
    yp = y_ptr + a0
    m = tl.max(tl.full([BLOCK], -float("inf"), tl.float32), axis=0)
    s = tl.sum(tl.zeros([BLOCK], tl.float32), axis=0)
    for start in range(0, hi, BLOCK):
        j = start + cols
        x = tl.load(xp + j, mask=j < lim, other=-float("inf"), eviction_policy="evict_last")
        x = tl.where((j >= lo) & (j < r1), x.to(tl.float32), -float("inf"))
        m, s = _stream_step(m, s, x)
    m, s = _stream_step(m, s, _tail_chunk(xp, lim, lo, r1, A, -float("inf")))
    for start in range(0, hi, BLOCK):
        j = start + cols
        x = tl.load(xp + j, mask=j < lim, other=0.0, eviction_policy="evict_first")
        y = _stream_out(x.to(tl.float32), m, s).to(y_ptr.dtype.element_ty)
        tl.store(yp + j, y, mask=(j >= b0) & (j < b1))
    _fwd_write_ends(xp, yp, lo, r1, b0, b1, m, s, A, True)


@triton_support.jit
def _fwd_row_whole_shifted(x_ptr, y_ptr, r0, n, total, BLOCK: tl.constexpr, A: tl.constexpr):
    # _fwd_row_shifted for a row whose aligned chunks fit one BLOCK: read once, 16 bytes a
    # load, kept in registers for the write (the ends and the tensor's last partial chunk
    # one element at a time, as there).
    cols = tl.arange(0, BLOCK)
    a0, lo, r1, hi, lim, b0, b1 = shifted_span(r0, n, total, A)
    xp = x_ptr + a0
    yp = y_ptr + a0
    x = tl.load(xp + cols, mask=cols < lim, other=-float("inf"))
    x = tl.where((cols >= lo) & (cols < r1), x.to(tl.float32), -float("inf"))
    t = _tail_chunk(xp, lim, lo, r1, A, -float("inf"))
    m = tl.maximum(tl.max(x, axis=0), tl.max(t, axis=0))
    e = tl.exp(x - m)
    s = tl.sum(e, axis=0) + tl.sum(tl.exp(t - m), axis=0)
    tl.store(yp + cols, (e / s).to(y_ptr.dtype.element_ty), mask=(cols >= b0) & (cols < b1))
    _fwd_write_ends(xp, yp, lo, r1, b0, b1, m, s, A, False)


@triton_support.jit
def _softmax_fwd_kernel(
    x_ptr,
    y_ptr,
    n_rows,
    n_cols,
    BLOCK: tl.constexpr,
    ROWS: tl.constexpr,
    SINGLE: tl.constexpr,
    EVEN: tl.constexpr,  # SINGLE, n_cols == BLOCK and ROWS divides n_rows: no masks
    WIDE: tl.constexpr,  # 64-bit offsets (2^31 elements or more)
    REREAD: tl.constexpr,  # SINGLE: the output from x read again (L2), not from registers
    VEC: tl.constexpr,  # a power of two dividing n_cols (see _vec)
    ALIGN: tl.constexpr,  # rows off 16-byte boundaries (_align): elements per 16 bytes, else 1
):
    # x, y: contiguous [n_rows, n_cols]; math in fp32. SINGLE: ROWS whole rows per program
    # (short rows share a program: one 3-wide row per program would leave it idle);
    # otherwise one row per program, streamed BLOCK columns at a time.
    pid = tl.program_id(0)
    if WIDE:
        pid = pid.to(tl.int64)
    n_cols = (n_cols // VEC) * VEC  # == n_cols; Triton now knows it divides by VEC
    cols = tl.arange(0, BLOCK)
    if SINGLE and ALIGN > 1:  # one whole row a program, its aligned chunks in one block
        n_cols64 = n_cols.to(tl.int64)
        r0 = pid.to(tl.int64) * n_cols64
        _fwd_row_whole_shifted(x_ptr, y_ptr, r0, n_cols, n_cols64 * n_rows, BLOCK, ALIGN)
    elif SINGLE:
        rows = pid * ROWS + tl.arange(0, ROWS)
        mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
        offs = rows[:, None] * n_cols + cols[None, :]
        hint: tl.constexpr = "evict_last" if REREAD else ""
        if EVEN:
            x = tl.load(x_ptr + offs, eviction_policy=hint).to(tl.float32)
        else:
            x = tl.load(x_ptr + offs, mask=mask, other=-float("inf"), eviction_policy=hint).to(tl.float32)
        m = tl.max(x, axis=1)[:, None]
        e = tl.exp(x - m)
        s = tl.sum(e, axis=1)[:, None]
        if REREAD:
            if EVEN:
                x = tl.load(x_ptr + offs, eviction_policy="evict_first").to(tl.float32)
            else:
                x = tl.load(x_ptr + offs, mask=mask, other=-float("inf"), eviction_policy="evict_first")
                x = x.to(tl.float32)
            e = tl.exp(x - m)
        y = (e / s).to(y_ptr.dtype.element_ty)
        if EVEN:
            tl.store(y_ptr + offs, y)
        else:
            tl.store(y_ptr + offs, y, mask=mask)
    else:
        # a program per row, or fewer programs each walking rows (Config.stream_waves)
        FIRST: tl.constexpr = "evict_last"
        SECOND: tl.constexpr = "evict_first"
        n_cols64 = n_cols.to(tl.int64)
        total = n_cols64 * n_rows  # (n_rows may arrive as a constant 1)
        for row in range(tl.program_id(0), n_rows, tl.num_programs(0)):
            if ALIGN > 1:
                _fwd_row_shifted(x_ptr, y_ptr, row * n_cols64, n_cols, total, BLOCK, ALIGN)
            else:
                x_row = x_ptr + row * n_cols64
                y_row = y_ptr + row * n_cols64
                m = tl.max(tl.full([BLOCK], -float("inf"), tl.float32), axis=0)  # (_stream_step)
                s = tl.sum(tl.zeros([BLOCK], tl.float32), axis=0)
                # First pass: keep the row in L2 (evict_last) for the second, which reads it
                # from there and lets it go (evict_first), as Inductor's looped softmax does.
                for start in range(0, n_cols, BLOCK):
                    mask = start + cols < n_cols
                    x = tl.load(x_row + start + cols, mask=mask, other=-float("inf"), eviction_policy=FIRST)
                    x = x.to(tl.float32)
                    m, s = _stream_step(m, s, x)
                for start in range(0, n_cols, BLOCK):
                    mask = start + cols < n_cols
                    x = tl.load(x_row + start + cols, mask=mask, other=-float("inf"), eviction_policy=SECOND)
                    x = x.to(tl.float32)
                    y = _stream_out(x, m, s).to(y_ptr.dtype.element_ty)
                    tl.store(y_row + start + cols, y, mask=mask)


@triton_support.jit
def _two_sum(a, b):
    # a + b = s + e exactly, s = fl(a + b) (Knuth's two-sum: any order of magnitudes)
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


@triton_support.jit
def _dot2_combine(h1, l1, h2, l2):
    # (h1 + l1) + (h2 + l2) as a pair: the his by two_sum, its error added to the los
    s, e = _two_sum(h1, h2)
    return s, (l1 + l2) + e


@triton_support.jit
def _dot2_terms(y, dy):
    # y * dy = p + e exactly. p by an fma with +0: a plain product could be contracted
    # into an fma with the sum that takes it, which would break the two_sum.
    p = tl.fma(y, dy, 0.0)
    return p, tl.fma(y, dy, -p)


@triton_support.jit
def _dot2_reduce(hi, lo, axis: tl.constexpr):
    # The pairs of a row summed to one. An inf or NaN dot (inf in dy) leaves lo NaN: lo = 0
    # there, so that dx = y * (dy - hi), as torch.
    hi, lo = tl.reduce((hi, lo), axis, _dot2_combine)
    return hi, tl.where(tl.abs(hi) <= 3.4028234663852886e38, lo, 0.0)


@triton_support.jit
def _dot64_pair(s, e):
    # an fp64 sum s (plus the fp32 sum e of its terms' rounding errors) as the fp32 pair
    # hi + lo that _dot2_dx takes; lo = 0 where hi is inf or NaN, as _dot2_reduce
    hi = s.to(tl.float32)
    lo = (s - hi.to(tl.float64)).to(tl.float32) + e
    return hi, tl.where(tl.abs(hi) <= 3.4028234663852886e38, lo, 0.0)


@triton_support.jit
def _dot_step(acc, acc_lo, acc64, y, dy, COMP: tl.constexpr):
    # one step of a streamed row's per-lane dot: COMP 2 the products in fp64 (acc64), their
    # fma errors in fp32 (acc_lo); 0 a plain fp32 sum (acc). (Dot2 pairs, COMP 1, serve
    # whole rows only: _comp.)
    tl.static_assert(COMP != 1, "streamed rows take COMP 0 or 2 (_comp)")
    if COMP == 2:
        p, ep = _dot2_terms(y, dy)
        acc64 += p.to(tl.float64)
        acc_lo += ep
    else:
        acc += y * dy
    return acc, acc_lo, acc64


@triton_support.jit
def _dot2_dx(y, dy, hi, lo):
    # y * (dy - (hi + lo)), rounded twice; dy - hi is exact where it cancels (Sterbenz):
    # within one ulp of the row's largest |dx| (an fp64 dx: half), the check's floor
    return tl.fma(y, dy - hi, -(y * lo))


@triton_support.jit
def _bwd_write_end(yp, dyp, dxp, j, emask, hi_, lo_, COMP: tl.constexpr):
    # dx at elements j (emask) of a row, read and written one at a time, from its dot
    # (COMP: the pair hi_ + lo_)
    y = tl.load(yp + j, mask=emask, other=0.0).to(tl.float32)
    dy = tl.load(dyp + j, mask=emask, other=0.0).to(tl.float32)
    dx = _dot2_dx(y, dy, hi_, lo_) if COMP else y * (dy - hi_)
    tl.store(dxp + j, dx.to(dxp.dtype.element_ty), mask=emask)


@triton_support.jit
def _bwd_write_ends(yp, dyp, dxp, lo, r1, b0, b1, hi_, lo_, A: tl.constexpr, COMP: tl.constexpr):
    # the < A elements at each end of a shifted row (offsets from its aligned start)
    ends = tl.arange(0, A)
    _bwd_write_end(yp, dyp, dxp, ends, (ends >= lo) & (ends < b0), hi_, lo_, COMP)  # [lo, b0)
    _bwd_write_end(yp, dyp, dxp, b1 + ends, b1 + ends < r1, hi_, lo_, COMP)  # [b1, r1)


@triton_support.jit
def _bwd_row_shifted(y_ptr, dy_ptr, dx_ptr, r0, n, total, BLOCK: tl.constexpr, A: tl.constexpr,
                     COMP: tl.constexpr, FIRST: tl.constexpr, SECOND: tl.constexpr):  # fmt: skip
    # The backward of one row off 16-byte boundaries, read and written as _fwd_row_shifted
    # does (the neighbours' y and dy taken as 0).
    cols = tl.arange(0, BLOCK)
    a0, lo, r1, hi, lim, b0, b1 = shifted_span(r0, n, total, A)
    yp = y_ptr + a0
    dyp = dy_ptr + a0
    dxp = dx_ptr + a0
    acc = tl.zeros([BLOCK], tl.float32)
    acc_lo = tl.zeros([BLOCK], tl.float32)
    acc64 = tl.zeros([BLOCK], tl.float64)
    for start in range(0, hi, BLOCK):
        j = start + cols
        inside = (j >= lo) & (j < r1)
        y = tl.load(yp + j, mask=j < lim, other=0.0, eviction_policy=FIRST)
        dy = tl.load(dyp + j, mask=j < lim, other=0.0, eviction_policy=FIRST)
        y = tl.where(inside, y.to(tl.float32), 0.0)
        dy = tl.where(inside, dy.to(tl.float32), 0.0)
        acc, acc_lo, acc64 = _dot_step(acc, acc_lo, acc64, y, dy, COMP)
    ty, tdy = _tail_chunk(yp, lim, lo, r1, A, 0.0), _tail_chunk(dyp, lim, lo, r1, A, 0.0)
    if COMP == 2:
        s = tl.sum(acc64, axis=0) + tl.sum(ty.to(tl.float64) * tdy.to(tl.float64), axis=0)
        hi_, lo_ = _dot64_pair(s, tl.sum(acc_lo, axis=0))
    else:
        hi_ = tl.sum(acc, axis=0) + tl.sum(ty * tdy, axis=0)
        lo_ = 0.0
    for start in range(0, hi, BLOCK):
        j = start + cols
        y = tl.load(yp + j, mask=j < lim, other=0.0, eviction_policy=SECOND).to(tl.float32)
        dy = tl.load(dyp + j, mask=j < lim, other=0.0, eviction_policy=SECOND).to(tl.float32)
        dx = _dot2_dx(y, dy, hi_, lo_) if COMP else y * (dy - hi_)
        tl.store(dxp + j, dx.to(dx_ptr.dtype.element_ty), mask=(j >= b0) & (j < b1))
    _bwd_write_ends(yp, dyp, dxp, lo, r1, b0, b1, hi_, lo_, A, COMP)


@triton_support.jit
def _bwd_row_whole_shifted(y_ptr, dy_ptr, dx_ptr, r0, n, total, BLOCK: tl.constexpr, A: tl.constexpr):
    # _bwd_row_shifted for a 16-bit row whose aligned chunks fit one BLOCK: y and dy read
    # once, 16 bytes a load, kept in registers for the write; the dot a plain fp32 sum, as
    # 16-bit whole rows take it (_align leaves fp32 rows, whose dot is compensated, out).
    cols = tl.arange(0, BLOCK)
    a0, lo, r1, hi, lim, b0, b1 = shifted_span(r0, n, total, A)
    yp = y_ptr + a0
    dyp = dy_ptr + a0
    dxp = dx_ptr + a0
    inside = (cols >= lo) & (cols < r1)
    y = tl.load(yp + cols, mask=cols < lim, other=0.0)
    dy = tl.load(dyp + cols, mask=cols < lim, other=0.0)
    y = tl.where(inside, y.to(tl.float32), 0.0)
    dy = tl.where(inside, dy.to(tl.float32), 0.0)
    ty, tdy = _tail_chunk(yp, lim, lo, r1, A, 0.0), _tail_chunk(dyp, lim, lo, r1, A, 0.0)
    dot = tl.sum(y * dy, axis=0) + tl.sum(ty * tdy, axis=0)
    tl.store(dxp + cols, (y * (dy - dot)).to(dx_ptr.dtype.element_ty), mask=(cols >= b0) & (cols < b1))
    _bwd_write_ends(yp, dyp, dxp, lo, r1, b0, b1, dot, 0.0, A, False)


@triton_support.jit
def _softmax_bwd_kernel(
    y_ptr,
    dy_ptr,
    dx_ptr,
    n_rows,
    n_cols,
    BLOCK: tl.constexpr,
    ROWS: tl.constexpr,
    SINGLE: tl.constexpr,
    COMP: tl.constexpr,  # fp32 rows: the dot compensated (1: Dot2 pairs, whole rows; 2: in fp64)
    VEC: tl.constexpr,  # a power of two dividing n_cols (see _vec)
    HINTS: tl.constexpr,  # streamed: the sum pass evict_last, the write pass evict_first
    ALIGN: tl.constexpr,  # rows off 16-byte boundaries (_align): elements per 16 bytes, else 1
):
    # y, dy, dx: contiguous [n_rows, n_cols]; dx = y * (dy - sum(dy * y)) per row. COMP (fp32
    # rows): the dot as a pair hi + lo, dx from both (_dot2_dx). A plain fp32 dot's rounding,
    # cancelled against dy where one y is near 1, puts dx past the check's bound (2x
    # PyTorch's error). COMP 1: Ogita, Rump and Oishi's Dot2 (each product split exactly by
    # an fma, each sum by two_sum, the errors added in lo); COMP 2: the sum in fp64 (whole
    # rows: the products exact in fp64; streamed: the fp32 products in fp64, their fma errors
    # in fp32), split into the pair once. 16-bit rows keep fp32.
    pid = tl.program_id(0).to(tl.int64)
    n_cols = (n_cols // VEC) * VEC  # == n_cols; Triton now knows it divides by VEC
    cols = tl.arange(0, BLOCK)
    FIRST: tl.constexpr = "evict_last" if HINTS else ""
    SECOND: tl.constexpr = "evict_first" if HINTS else ""
    if SINGLE and ALIGN > 1:  # one whole 16-bit row a program, its aligned chunks in one block
        tl.static_assert(not COMP, "fp32 whole rows are read one element a load (_align)")
        n_cols64 = n_cols.to(tl.int64)
        total = n_cols64 * n_rows
        _bwd_row_whole_shifted(y_ptr, dy_ptr, dx_ptr, pid * n_cols64, n_cols, total, BLOCK, ALIGN)
    elif SINGLE:
        rows = pid * ROWS + tl.arange(0, ROWS)
        mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
        offs = rows[:, None] * n_cols + cols[None, :]
        y = tl.load(y_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        if COMP == 2:
            hi, lo = _dot64_pair(tl.sum(y.to(tl.float64) * dy.to(tl.float64), axis=1), 0.0)
            dx = _dot2_dx(y, dy, hi[:, None], lo[:, None])
        elif COMP:
            p, ep = _dot2_terms(y, dy)
            hi, lo = _dot2_reduce(p, ep, 1)
            dx = _dot2_dx(y, dy, hi[:, None], lo[:, None])
        else:
            dx = y * (dy - tl.sum(y * dy, axis=1)[:, None])
        tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=mask)
    else:
        # a program per row, or fewer programs each walking rows (Config.stream_waves)
        n_cols64 = n_cols.to(tl.int64)
        total = n_cols64 * n_rows  # (n_rows may arrive as a constant 1)
        for row in range(tl.program_id(0), n_rows, tl.num_programs(0)):
            if ALIGN > 1:
                _bwd_row_shifted(y_ptr, dy_ptr, dx_ptr, row * n_cols64, n_cols, total, BLOCK, ALIGN, COMP,
                                 FIRST, SECOND)  # fmt: skip
            else:
                base = row * n_cols64
                # fp32: per lane a running fp64 sum (COMP 2) or pair (two_sum of the his), one
                # reduction after the sweep
                acc = tl.zeros([BLOCK], tl.float32)
                acc_lo = tl.zeros([BLOCK], tl.float32)
                acc64 = tl.zeros([BLOCK], tl.float64)
                for start in range(0, n_cols, BLOCK):
                    mask = start + cols < n_cols
                    y = tl.load(y_ptr + base + start + cols, mask=mask, other=0.0, eviction_policy=FIRST)
                    dy = tl.load(dy_ptr + base + start + cols, mask=mask, other=0.0, eviction_policy=FIRST)
                    y = y.to(tl.float32)
                    dy = dy.to(tl.float32)
                    acc, acc_lo, acc64 = _dot_step(acc, acc_lo, acc64, y, dy, COMP)
                if COMP == 2:
                    hi, lo = _dot64_pair(tl.sum(acc64, axis=0), tl.sum(acc_lo, axis=0))
                else:
                    hi = tl.sum(acc, axis=0)
                for start in range(0, n_cols, BLOCK):
                    mask = start + cols < n_cols
                    y = tl.load(y_ptr + base + start + cols, mask=mask, other=0.0, eviction_policy=SECOND)
                    dy = tl.load(dy_ptr + base + start + cols, mask=mask, other=0.0, eviction_policy=SECOND)
                    y = y.to(tl.float32)
                    dy = dy.to(tl.float32)
                    if COMP:
                        dx = _dot2_dx(y, dy, hi, lo)
                    else:
                        dx = y * (dy - hi)
                    tl.store(dx_ptr + base + start + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)


def _config(n_cols: int, cfg: Config = CONFIG, element_size: int = 4, fwd: bool = False,
            n_rows: int | None = None, sms: int = 0):  # fmt: skip
    """(BLOCK, ROWS, SINGLE, num_warps) for a row width: whole rows in one block up to
    MAX_SINGLE columns, ~4096 elements per program (several short rows share one; rows of
    256 or fewer ~1024 at 2 warps; rows of 1025-2048 one each), one row per program up to
    max_whole (not the 16-bit forward), else streamed. Short rows that would fill fewer
    than cfg.min_per_sm programs per SM of ``sms`` run one row a program (1 warp up to 256
    columns, 2 at 512, 4 at 1024, 8 in the fp32 backward, whose rows of 513-1024 always run
    so). The forward of rows of 513-1024 takes 4 warps, one fp32 row or two 16-bit ones a
    program. The fp32 backward of an 8192-wide block takes 32 warps."""
    block = triton_support.next_pow2(max(n_cols, 1))
    # a 16-bit row of 4097-6144 columns would leave a quarter or more of its 8192-wide
    # block idle: it streams, in quarter-block steps; fp32 ones stay whole
    quarter_idle = element_size < 4 and 4 * n_cols <= 3 * block
    if block <= cfg.max_single and (block <= 4096 or not quarter_idle):
        if block == 2048:  # one row per program: 4 warps, 8 for the fp32 backward
            return block, cfg.rows or 1, True, cfg.warps or (8 if element_size >= 4 and not fwd else 4)
        rows = cfg.rows or max(1, min(64, (1024 if block <= 256 else 4096) // block))
        few = n_rows is not None and triton_support.cdiv(n_rows, rows) < cfg.min_per_sm * sms
        few = few or (block == 1024 and element_size >= 4 and not fwd)  # fp32 backward: always
        if few and block <= 1024 and not cfg.rows:
            warps = 1 if block <= 256 else 2 if block == 512 else 8 if element_size >= 4 and not fwd else 4
            return block, 1, True, cfg.warps or warps
        if fwd and block == 1024 and not cfg.rows:  # 32 bytes a thread: fp32 rows one a
            return block, 1 if element_size >= 4 else 2, True, cfg.warps or 4  # program, 16-bit two
        per = block * rows
        if block == 8192 and element_size >= 4 and not fwd:  # the fp32 backward's dot pair
            return block, rows, True, cfg.warps or 32  # in registers: 8 elements a thread
        return block, rows, True, cfg.warps or (2 if per <= 1024 else 4 if per <= 2048 else 8)
    if cfg.max_single < block <= cfg.max_whole and (element_size >= 4 or not fwd):
        return block, 1, True, cfg.whole_warps or max(1, block // 1024)
    step = min(cfg.stream_block, max(block // 4, 1024))
    return step, 1, False, cfg.stream_warps if step >= cfg.stream_block else 8


def _comp(dtype: torch.dtype, single: bool, block: int, cfg: Config = CONFIG) -> int:
    """COMP of the backward: 0 for 16-bit rows (an fp32 dot); fp32 rows 2 (the dot summed in
    fp64), but 1 (Dot2 pairs) for whole rows wider than max_single, where the fp64 sum was
    slower on an H200 (lab/probe_softmax_bwd_dot.py; benchmarks/NOTES.md (at))."""
    if dtype != torch.float32:
        return 0
    return 1 if single and block > cfg.max_single else 2


def _align(n_cols: int, single: bool, element_size: int, rows: int = 1, block: int = 0,
           cfg: Config = CONFIG, comp: bool = False, n_rows: int | None = None,
           sms: int = 0) -> int:  # fmt: skip
    """ALIGN: for rows whose starts are off 16-byte boundaries (n_cols not a multiple of 16
    bytes' elements), streamed or whole one a program (``rows`` 1, ``cfg.whole_shifted``)
    with the aligned chunks that hold them within ``block`` columns, the elements per 16
    bytes; else 1 (whole rows several a program, or wider than their block's chunks: one
    element a load). Whole rows stay one element a load in the fp32 backward (``comp``: its
    compensated dot) and where ``n_rows`` are fewer than ``sms``: shifted, those were slower
    on an H200 (lab/probe_softmax_whole_shifted.py; benchmarks/NOTES.md (as))."""
    per16 = 16 // element_size
    if not n_cols % per16:
        return 1
    if not single:
        return per16
    span = -(-(per16 - 1 + n_cols) // per16) * per16  # the chunks of a row at the worst shift
    few = n_rows is not None and n_rows < sms
    return per16 if cfg.whole_shifted and not comp and not few and rows == 1 and span <= block else 1


def _grid(n_rows: int, rows: int, single: bool, device: torch.device, cfg: Config = CONFIG) -> int:
    """Programs launched: one per ROWS rows, or for streamed rows with stream_waves set,
    at most stream_waves per SM (each walks rows n_rows / programs apart)."""
    programs = triton_support.cdiv(n_rows, rows)
    if single or not cfg.stream_waves:
        return programs
    sms = triton_support.sm_count(device.index or 0) if device.type == "cuda" else 1  # (interpreter: 1)
    return min(programs, cfg.stream_waves * sms)


def _vec(n_cols: int) -> int:
    """The largest power of two <= 16 that divides ``n_cols``. Triton specializes an int
    argument only as divisible by 16 or not; at a width such as 7000 (8 x 875) the row
    starts and the masks' edges it then cannot place on a 16-byte boundary, and every access
    is scalar. The kernels rewrite n_cols as (n_cols // VEC) * VEC, the same value, which
    Triton sees divides by VEC (a tl.multiple_of on a scalar argument is dropped): at 7000
    columns fp32 and 16-bit rows then load and store 16 bytes at a time (PTX, sm_90)."""
    return min(16, n_cols & -n_cols) if n_cols else 16


def _fwd_choice(n_cols: int, block: int, single: bool, elem_size: int, warps: int, cfg: Config = CONFIG):
    """(REREAD, num_warps) of the forward. Rows off 16-byte boundaries never re-read
    (their loads are one element wide: a second read costs more than it saves), nor do
    16-bit rows of 8192-wide blocks (bf16 4096x8192 on an H200: 36.4 us at 8 warps against
    40.2 re-reading, lab/probe_softmax_fwd_reread.py); fp32 whole rows of 2048 columns and
    more take 16 warps or more."""
    reread = cfg.fwd_reread
    if reread is None:
        aligned = n_cols % (16 // elem_size) == 0
        wide16 = elem_size < 4 and block >= 8192
        reread = (
            single and cfg.reread_min_cols <= n_cols and block <= cfg.max_single and aligned and not wide16
        )
    if cfg.fwd_warps:
        return bool(reread), cfg.fwd_warps
    if single and elem_size == 4 and block >= 2048 and (reread or block >= 8192):
        return bool(reread), 16 if reread else max(16, warps)
    return bool(reread), warps


def _launch(kernel, inputs, fwd=False, cfg: Config = CONFIG):
    inputs = [t.contiguous() for t in inputs]
    out = torch.empty_like(inputs[0])
    n_cols = out.shape[-1] if out.dim() else 1
    n_rows = out.numel() // n_cols if n_cols else 0
    if n_rows and n_cols:
        sms = triton_support.sm_count(out.device.index) if out.device.type == "cuda" else 0
        block, rows, single, warps = _config(n_cols, cfg, out.element_size(), fwd, n_rows, sms)
        grid = (_grid(n_rows, rows, single, out.device, cfg),)
        if fwd:
            even = cfg.fwd_even and single and block == n_cols and n_rows % rows == 0
            reread, warps = _fwd_choice(n_cols, block, single, out.element_size(), warps, cfg)
            extra = dict(EVEN=even, WIDE=not (cfg.fwd_narrow and out.numel() < 2**31), REREAD=reread)
        else:  # the backward: fp32 rows compensated
            extra = {"COMP": _comp(out.dtype, single, block, cfg), "HINTS": cfg.bwd_hints and not single}
        comp = extra.get("COMP", False)
        extra["ALIGN"] = _align(n_cols, single, out.element_size(), rows, block, cfg, comp, n_rows, sms)
        kernel[grid](
            *inputs, out, n_rows, n_cols, BLOCK=block, ROWS=rows, SINGLE=single, VEC=_vec(n_cols),
            num_warps=warps, **extra,
        )  # fmt: skip
    return out


def _fwd(x: torch.Tensor, cfg: Config = CONFIG) -> torch.Tensor:
    return _launch(_softmax_fwd_kernel, [x], fwd=True, cfg=cfg)


def _bwd(dy: torch.Tensor, y: torch.Tensor, cfg: Config = CONFIG) -> torch.Tensor:
    return _launch(_softmax_bwd_kernel, [y, dy], cfg=cfg)


# The backward needs the output, not the input.
softmax_triton = unary_op("softmax_triton", _fwd, _bwd, save_output=True, triton=True)


def _kernel_specs(dtype: str):
    """For `kernellab asm`: both kernels as launched for 4096-wide rows."""
    block, rows, single, warps = _config(4096)
    cx = {"BLOCK": block, "ROWS": rows, "SINGLE": single, "VEC": _vec(4096)}
    tail = {
        "n_rows": "i32",
        "n_cols": "i32",
        "BLOCK": "constexpr",
        "ROWS": "constexpr",
        "SINGLE": "constexpr",
    }
    fwd = {
        "x_ptr": f"*{dtype}",
        "y_ptr": f"*{dtype}",
        **tail,
        "EVEN": "constexpr",
        "WIDE": "constexpr",
        "REREAD": "constexpr",
        "VEC": "constexpr",
        "ALIGN": "constexpr",
    }
    bwd = {"y_ptr": f"*{dtype}", "dy_ptr": f"*{dtype}", "dx_ptr": f"*{dtype}", **tail, "COMP": "constexpr",
           "VEC": "constexpr", "HINTS": "constexpr", "ALIGN": "constexpr"}  # fmt: skip
    reread, fwarps = _fwd_choice(4096, block, single, 4 if dtype == "fp32" else 2, warps)
    fcx = dict(cx, EVEN=CONFIG.fwd_even and single, WIDE=not CONFIG.fwd_narrow, REREAD=reread, ALIGN=1)
    return [
        (_softmax_fwd_kernel, fwd, fcx, fwarps),
        (_softmax_bwd_kernel, bwd, dict(cx, COMP=2 if dtype == "fp32" else 0, HINTS=False, ALIGN=1), warps),
    ]


register_triton(
    "softmax", softmax_triton, _kernel_specs, "Triton: one program per row, online softmax for long rows"
)
