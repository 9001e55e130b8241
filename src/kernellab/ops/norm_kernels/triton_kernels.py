"""LayerNorm and RMSNorm in Triton: kernels, config, launchers (norm_fwd, norm_bwd) and
what `kernellab asm` compiles; the ops' backends (layer_norm/triton.py, rms_norm/triton.py,
add_rms_norm/triton.py) declare their custom ops over these launchers and register them.

One set of kernels serves all three (``RMS`` constexpr: no mean, no bias; ``RES``: the
residual add fused in front of the norm).

Forward: a row of D <= MAX_D columns is loaded once into registers, reduced twice
(mean, then the variance of x - mean: the two-pass variance, exact for constant rows) and
written once: 1 read + 1 write per element, the minimum. Short rows share a program (ROWS
of them, ~4096 elements per program). The fp32 mean and rstd of each row are stored for
the backward (8 bytes per row against 2 * D bytes of x).

Rows whose width is not a multiple of 16 bytes (4097 columns) take the shifted kernels
(``_norm_fwd_shift_kernel``, ``_norm_bwd_shift_kernel``): each row is read as the aligned
chunks that hold it, so that loads and stores stay 16 bytes wide.

Backward: a fixed number of programs (a few per SM) each walks a contiguous group of
rows; per row it recomputes xhat from x, mean, rstd, writes dx, and adds dy * xhat and dy
into fp32 accumulators held in registers. Each program then writes one partial row of
dweight (and dbias); a torch.sum over the [programs, D] partials (~528 x D fp32, a few MB
against hundreds of MB of x and dy at the bench size) gives the result. No atomics, and x
and dy are read exactly once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
import triton.language as tl

from kernellab import triton_support
from kernellab.core.spec import parse_dtype
from kernellab.ops._triton_rows import class_span, row_start
from kernellab.ops.norm_kernels import plumbing, wide

MAX_D = 16384  # widest row kept in registers (fp32: 64 KB per row program, 16 warps)


@dataclass(frozen=True)
class Config:
    """Launch knobs of the Triton norms, passed to ``norm_fwd`` / ``norm_bwd`` (``CONFIG``
    when not given; tuning scripts pass their own). The defaults are the fastest settings
    on Hopper at bf16 16384 x 4096.

    row_elems: elements per forward program when rows are short (rows share a program).
    fwd_min_per_sm: short rows that would fill fewer programs than this many per SM run
        one row a program instead (more programs in flight; 0: never).
    fwd_warps: forward warps (None: ~ one warp per 512 elements, 4 to 16).
    fwd_evict: eviction policy of the forward's x load and y store ("" or "evict_first").
    fwd_even: unmasked loads and stores when the rows fill the blocks exactly.
    fwd_narrow: 32-bit offsets below 2^31 elements.
    fwd_row_1d: 16-bit x with one row per program runs ``_norm_fwd_row_kernel`` (a 1-D
        block, weight and bias loaded first, an approximate rsqrt).
    bwd_programs_per_sm: backward programs per SM (each walks a group of rows and writes
        one partial row of dweight / dbias: fewer programs, fewer partials to sum; None:
        by row width, ``_bwd_programs``).
    bwd_warps: backward warps (None: by row width, ``_bwd_warps``).
    bwd_prefetch: load row i + 1 before row i's reductions.
    psum_elems, psum_max_p: the partial sum's tile (~psum_elems fp32 values per array,
        all of a column strip's partials at once up to psum_max_p of them).
    bwd_small_elems: inputs of at most this many elements take the one-launch backward
        (``_norm_bwd_cols_kernel``; 0: never). Such calls are launch-bound: the partials'
        buffer and the second launch cost more host time than the kernels take.
    small_strip, small_step_elems: that backward's widest column strip (a program each)
        and the elements (rows x padded width) it loads a step.
    small_warps: that backward's warps (None: by the elements of a step, 4 to 16).
    small_fp32_elems, small_fp32_rows: fp32 inputs take it only up to this many elements
        or rows, or with rows of at most exact_max_block (its fp64 arithmetic costs more
        than the partials path past them: `sweep_norm_small-H200-230c4e9.jsonl`,
        `small_rows-H200-1da5c91.jsonl`).
    exact_max_block: for fp32 x, that backward recomputes each row's mean and rstd in fp64
        from the row (not the saved fp32 ones) up to rows of this padded width: the
        check's fuzz found rows of 2 columns past the bound on the saved ones; at 256
        columns and more the recomputation costs 40-70%.
    wide_fwd_strip, wide_bwd_strip, wide_warps, wide_waves: rows wider than MAX_D
        (``wide.py``): the column strip of a program of the output and dx kernels, their
        warps, and about how many programs per SM they launch.
    acc64_max_block, bwd_max_rows: fp32 weights' backward programs sum their partial
        dweight / dbias in fp64 up to rows of this block, and past it sum at most
        bwd_max_rows rows each (fp32 sums of ~250-1000 rows missed the check's bound for
        dbias at 1048577 x 13 and dweight at 333775 x 23)
    shift_fwd_min_cols, shift_bwd_min_cols: rows of at least this many columns whose width
        is not a multiple of 16 bytes take the shifted forward (``_norm_fwd_shift_kernel``)
        and backward (0: never).
    shift_fwd_per_sm, shift_fwd_warps: programs per SM and warps of the shifted forward
        (None: ``_shift_fwd_shape``).
    fwd_w_first_per_sm: ``_norm_fwd_kernel`` loads the weight and bias before the row when
        its grid has at most this many programs per SM (a grid that small waits on each
        load in turn; 0: never; off the GPU, per one SM)."""

    row_elems: int = 4096
    fwd_min_per_sm: int = 4
    fwd_warps: int | None = None
    fwd_evict: str = ""
    fwd_even: bool = True
    fwd_narrow: bool = True
    fwd_row_1d: bool = True
    bwd_programs_per_sm: int | None = None
    bwd_warps: int | None = None
    bwd_prefetch: bool = True
    psum_elems: int = 4096
    psum_max_p: int = 1024
    bwd_small_elems: int = 65536
    small_strip: int = 256
    small_step_elems: int = 16384
    small_warps: int | None = None
    small_fp32_elems: int = 8192
    small_fp32_rows: int = 16
    exact_max_block: int = 64
    wide_fwd_strip: int = 4096
    wide_bwd_strip: int = 2048
    wide_warps: int = 8
    wide_waves: int = 2
    acc64_max_block: int = 4096
    bwd_max_rows: int = 64
    shift_fwd_min_cols: int = 1024
    shift_bwd_min_cols: int = 2048
    shift_fwd_per_sm: int | None = None
    shift_fwd_warps: int | None = None
    fwd_w_first_per_sm: float = 8.0


CONFIG = Config()


@triton_support.jit
def _weight_bias(w_ptr, b_ptr, cols, cmask, EVEN: tl.constexpr, HAS_BIAS: tl.constexpr):
    # A forward's weight and bias in fp32 (b: w's again when there is none)
    if EVEN:
        w = tl.load(w_ptr + cols).to(tl.float32)
    else:
        w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    b = w
    if HAS_BIAS:
        if EVEN:
            b = tl.load(b_ptr + cols).to(tl.float32)
        else:
            b = tl.load(b_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    return w, b


@triton_support.jit
def _norm_fwd_kernel(
    x_ptr,  # [n_rows, n_cols] contiguous, storage dtype
    w_ptr,  # [n_cols]
    b_ptr,  # [n_cols] (unused unless HAS_BIAS)
    r_ptr,  # [n_rows, n_cols] contiguous residual (unused unless RES)
    h_ptr,  # [n_rows, n_cols] contiguous: x + r in x's dtype, the normalized input (RES)
    y_ptr,  # [n_rows, n_cols] contiguous, storage dtype
    mean_ptr,  # [n_rows] fp32 (unused when RMS)
    rstd_ptr,  # [n_rows] fp32
    n_rows,
    n_cols,
    eps,
    BLOCK: tl.constexpr,  # next power of two >= n_cols
    ROWS: tl.constexpr,  # rows per program
    RMS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    RES: tl.constexpr,  # normalize h = x + r (rounded to x's dtype, as a separate add would)
    EVICT: tl.constexpr,  # eviction policy of the x load and the y store
    EVEN: tl.constexpr,  # n_cols == BLOCK and ROWS divides n_rows: no masks
    WIDE: tl.constexpr,  # 64-bit offsets (2^31 elements or more)
    W_FIRST: tl.constexpr,  # load weight and bias before the row (grids too small to hide latency)
):
    pid = tl.program_id(0)
    if WIDE:
        pid = pid.to(tl.int64)
    rows = pid * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    rmask = rows < n_rows
    cmask = cols < n_cols
    mask = rmask[:, None] & cmask[None, :]
    offs = rows[:, None] * n_cols + cols[None, :]
    if W_FIRST:
        w, b = _weight_bias(w_ptr, b_ptr, cols, cmask, EVEN, HAS_BIAS)
    if EVEN:
        x = tl.load(x_ptr + offs, eviction_policy=EVICT)
    else:
        x = tl.load(x_ptr + offs, mask=mask, other=0.0, eviction_policy=EVICT)
    if RES:
        if EVEN:
            r = tl.load(r_ptr + offs, eviction_policy=EVICT)
        else:
            r = tl.load(r_ptr + offs, mask=mask, other=0.0, eviction_policy=EVICT)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(h_ptr.dtype.element_ty)
        if EVEN:
            tl.store(h_ptr + offs, x)
        else:
            tl.store(h_ptr + offs, x, mask=mask)
    x = x.to(tl.float32)
    if RMS:
        xc = x
    else:
        if x_ptr.dtype.element_ty == tl.float32:
            # fp32 x: the rounded mean's error, times rstd, would shift every xhat (rows of
            # nearly equal values go past the check's bound). The mean is taken of x
            # less the row's first element (exact for nearly equal values), whose sum
            # rounds at the scale of the row's spread, not of its magnitude.
            if EVEN:
                s = tl.load(x_ptr + rows * n_cols)
                if RES:
                    s = s + tl.load(r_ptr + rows * n_cols)
                x = x - s[:, None]
            else:
                s = tl.load(x_ptr + rows * n_cols, mask=rmask, other=0.0)
                if RES:
                    s = s + tl.load(r_ptr + rows * n_cols, mask=rmask, other=0.0)
                x = tl.where(mask, x - s[:, None], 0.0)
        mean = tl.sum(x, axis=1) / n_cols
        if EVEN:
            xc = x - mean[:, None]
        else:
            xc = tl.where(mask, x - mean[:, None], 0.0)
        if x_ptr.dtype.element_ty == tl.float32:
            mean = mean + s
        if EVEN:
            tl.store(mean_ptr + rows, mean)
        else:
            tl.store(mean_ptr + rows, mean, mask=rmask)
    var = tl.sum(xc * xc, axis=1) / n_cols
    rstd = 1.0 / tl.sqrt_rn((var + eps).to(tl.float32))  # Inductor passes eps as fp64
    # Weight and bias after the reductions where the grid hides latency: loading them
    # first there is ~4% slower (registers held across the reductions).
    if EVEN:
        tl.store(rstd_ptr + rows, rstd)
    else:
        tl.store(rstd_ptr + rows, rstd, mask=rmask)
    if not W_FIRST:
        w, b = _weight_bias(w_ptr, b_ptr, cols, cmask, EVEN, HAS_BIAS)
    y = xc * rstd[:, None] * w[None, :]
    if HAS_BIAS:
        y = y + b[None, :]
    if EVEN:
        tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), eviction_policy=EVICT)
    else:
        tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask, eviction_policy=EVICT)


@triton_support.jit
def _norm_fwd_row_kernel(
    x_ptr,  # [n_rows, n_cols] contiguous, 16-bit
    w_ptr,  # [n_cols]
    b_ptr,  # [n_cols] (unused unless HAS_BIAS)
    r_ptr,  # residual, as _norm_fwd_kernel's (RES)
    h_ptr,  # x + r (RES)
    y_ptr,  # [n_rows, n_cols] contiguous
    mean_ptr,  # [n_rows] fp32 (unused when RMS)
    rstd_ptr,  # [n_rows] fp32
    n_cols,
    eps,
    BLOCK: tl.constexpr,  # next power of two >= n_cols
    RMS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    RES: tl.constexpr,
    EVEN: tl.constexpr,  # n_cols == BLOCK: no masks
    WIDE: tl.constexpr,  # 64-bit offsets (2^31 elements or more)
):
    # One row per program as a 1-D block: weight and bias first, then the row, two
    # reductions from registers, an approximate rsqrt (rsqrt.approx: ~2 ulp of fp32, far
    # below the 16-bit output's rounding; fp32 x takes _norm_fwd_kernel's 1 / sqrt_rn).
    row = tl.program_id(0)
    if WIDE:
        row = row.to(tl.int64)
    cols = tl.arange(0, BLOCK)
    cmask = cols < n_cols
    w, b = _weight_bias(w_ptr, b_ptr, cols, cmask, EVEN, HAS_BIAS)
    if EVEN:
        x = tl.load(x_ptr + row * n_cols + cols)
        if RES:
            r = tl.load(r_ptr + row * n_cols + cols)
            x = (x.to(tl.float32) + r.to(tl.float32)).to(h_ptr.dtype.element_ty)
            tl.store(h_ptr + row * n_cols + cols, x)
    else:
        x = tl.load(x_ptr + row * n_cols + cols, mask=cmask, other=0.0)
        if RES:
            r = tl.load(r_ptr + row * n_cols + cols, mask=cmask, other=0.0)
            x = (x.to(tl.float32) + r.to(tl.float32)).to(h_ptr.dtype.element_ty)
            tl.store(h_ptr + row * n_cols + cols, x, mask=cmask)
    x = x.to(tl.float32)
    if RMS:
        xc = x
    else:
        mean = tl.sum(x, axis=0) / n_cols
        if EVEN:
            xc = x - mean
        else:
            xc = tl.where(cmask, x - mean, 0.0)
    var = tl.sum(xc * xc, axis=0) / n_cols
    rstd = tl.math.rsqrt((var + eps).to(tl.float32))
    if not RMS:
        tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, rstd)
    y = xc * rstd * w
    if HAS_BIAS:
        y = y + b
    if EVEN:
        tl.store(y_ptr + row * n_cols + cols, y.to(y_ptr.dtype.element_ty))
    else:
        tl.store(y_ptr + row * n_cols + cols, y.to(y_ptr.dtype.element_ty), mask=cmask)


@triton_support.jit
def _norm_bwd_kernel(
    dy_ptr,  # [n_rows, n_cols] contiguous
    x_ptr,  # [n_rows, n_cols] contiguous
    w_ptr,  # [n_cols]
    mean_ptr,  # [n_rows] fp32 (unused when RMS)
    rstd_ptr,  # [n_rows] fp32
    dx_ptr,  # [n_rows, n_cols] contiguous
    dres_ptr,  # [n_rows, n_cols] contiguous: added to dx (RES)
    dw_part_ptr,  # [programs, n_cols] fp32: this program's sum of dy * xhat
    db_part_ptr,  # [programs, n_cols] fp32: sum of dy (unused when RMS)
    n_rows,
    n_cols,
    rows_per_prog,
    BLOCK: tl.constexpr,
    RMS: tl.constexpr,
    PREFETCH: tl.constexpr,  # load row i + 1 (x, dy, stats) before row i's reductions
    RES: tl.constexpr,  # dx += dres (the residual stream's gradient), after dx's rounding
    ACC: tl.constexpr,  # the partials' dtype (fp64 for fp32 weights: a program sums many rows)
):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    cmask = cols < n_cols
    w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    dw_acc = tl.zeros([BLOCK], dtype=ACC)
    db_acc = tl.zeros([BLOCK], dtype=ACC)
    first = pid.to(tl.int64) * rows_per_prog
    # The last group may be short: rows past the end load zeros (dy = 0 adds nothing to
    # the partials) and store nothing; their statistics are read at a valid row.
    if PREFETCH:
        nmask = cmask & ((cols * 0 + first) < n_rows)
        x_nx = tl.load(x_ptr + first * n_cols + cols, mask=nmask, other=0.0)
        dy_nx = tl.load(dy_ptr + first * n_cols + cols, mask=nmask, other=0.0)
        srow = tl.minimum(first, n_rows - 1)
        rstd_nx = tl.load(rstd_ptr + srow)
        mean_nx = rstd_nx
        if not RMS:
            mean_nx = tl.load(mean_ptr + srow)
    for i in range(0, rows_per_prog):
        row = first + i
        mask = cmask & ((cols * 0 + row) < n_rows)
        offs = row * n_cols + cols
        if PREFETCH:
            x = x_nx.to(tl.float32)
            dy = dy_nx.to(tl.float32)
            rstd = rstd_nx
            mean = mean_nx
            nrow = row + 1
            nmask = cmask & ((cols * 0 + nrow) < tl.minimum(n_rows, first + rows_per_prog))
            x_nx = tl.load(x_ptr + nrow * n_cols + cols, mask=nmask, other=0.0)
            dy_nx = tl.load(dy_ptr + nrow * n_cols + cols, mask=nmask, other=0.0)
            nsrow = tl.minimum(nrow, n_rows - 1)
            rstd_nx = tl.load(rstd_ptr + nsrow)
            if not RMS:
                mean_nx = tl.load(mean_ptr + nsrow)
        else:
            x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            dy = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            srow = tl.minimum(row, n_rows - 1)
            rstd = tl.load(rstd_ptr + srow)
            mean = rstd
            if not RMS:
                mean = tl.load(mean_ptr + srow)
        if RMS:
            xhat = x * rstd
        else:
            xhat = tl.where(mask, (x - mean) * rstd, 0.0)
        g = dy * w
        if RMS:
            c1 = tl.sum(g * xhat, axis=0) / n_cols
            dx = (g - xhat * c1) * rstd
        else:
            c1 = tl.sum(g * xhat, axis=0) / n_cols
            c2 = tl.sum(g, axis=0) / n_cols
            dx = (g - (xhat * c1 + c2)) * rstd
            db_acc += dy.to(ACC)
        dx = dx.to(dx_ptr.dtype.element_ty)
        if RES:  # rounded as a separate add of the two would round
            dres = tl.load(dres_ptr + offs, mask=mask, other=0.0)
            dx = (dx.to(tl.float32) + dres.to(tl.float32)).to(dx_ptr.dtype.element_ty)
        tl.store(dx_ptr + offs, dx, mask=mask)
        dw_acc += (dy * xhat).to(ACC)
    tl.store(dw_part_ptr + pid * n_cols + cols, dw_acc, mask=cmask)
    if not RMS:
        tl.store(db_part_ptr + pid * n_cols + cols, db_acc, mask=cmask)


@triton_support.jit
def _norm_bwd_cols_kernel(
    dy_ptr,  # [n_rows, n_cols] contiguous
    x_ptr,  # [n_rows, n_cols] contiguous
    w_ptr,  # [n_cols]
    mean_ptr,  # [n_rows] fp32 (unused when RMS)
    rstd_ptr,  # [n_rows] fp32
    dx_ptr,  # [n_rows, n_cols] contiguous
    dres_ptr,  # [n_rows, n_cols] contiguous: added to dx (RES)
    dw_ptr,  # [n_cols] in w's dtype: sum over rows of dy * xhat, for this program's columns
    db_ptr,  # [n_cols] in w's dtype: sum over rows of dy (HAS_DB)
    n_rows,
    n_cols,
    eps,  # the forward's: with MATH fp64, rstd is recomputed from the row (the saved one is fp32)
    BLOCK: tl.constexpr,  # power of two >= n_cols: a whole row
    BLOCK_C: tl.constexpr,  # this program's strip of columns
    ROWS: tl.constexpr,  # rows per step
    RMS: tl.constexpr,
    RES: tl.constexpr,
    HAS_DB: tl.constexpr,
    MATH: tl.constexpr,  # the row sums' and dx's dtype (fp64 for fp32 x: these inputs are small)
    EXACT: tl.constexpr,  # mean and rstd recomputed in MATH from the row (eps: the forward's)
):
    # One launch for a small input: program p owns columns [p * BLOCK_C, (p + 1) * BLOCK_C)
    # of dx, dw and db. Each step loads ROWS whole rows for the row sums mean(g * xhat) and
    # mean(g), then its strip of them again (from L1/L2) for dx and the column sums. Every
    # program reads all of x and dy: (n_cols / BLOCK_C) x the bytes of _norm_bwd_kernel, a
    # few hundred KB at the sizes routed here, where the second launch and the partials'
    # buffer cost more (host time) than the extra reads.
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    cmask = cols < n_cols
    scols = pid * BLOCK_C + tl.arange(0, BLOCK_C)
    smask = scols < n_cols
    w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(MATH)
    ws = tl.load(w_ptr + scols, mask=smask, other=0.0).to(MATH)
    # The column sums accumulate in fp64 (a few thousand terms at most here): in fp32 one
    # program's sum over all rows lost to PyTorch's cascaded sum (dweight 2.8e-5 against a
    # bound of 1.85e-5 at 70 x 3 fp32, interpreter), where the partials path splits it.
    dw_acc = tl.zeros([BLOCK_C], dtype=tl.float64)
    db_acc = tl.zeros([BLOCK_C], dtype=tl.float64)
    for r0 in range(0, n_rows, ROWS):
        rows = r0 + tl.arange(0, ROWS)
        rmask = rows < n_rows
        m2 = rmask[:, None] & cmask[None, :]
        offs = rows[:, None] * n_cols + cols[None, :]
        x = tl.load(x_ptr + offs, mask=m2, other=0.0).to(MATH)
        dy = tl.load(dy_ptr + offs, mask=m2, other=0.0).to(MATH)
        mean = tl.zeros([ROWS, 1], dtype=MATH)
        if not RMS:
            if EXACT:
                # The row statistics again, in MATH, from the row in registers: the saved
                # fp32 mean's and rstd's roundings shift every xhat of a row of nearly
                # equal values, and the column sums over a few rows cancel down to that.
                mean = (tl.sum(x, axis=1) / n_cols)[:, None]
            else:
                mean = tl.load(mean_ptr + rows, mask=rmask, other=0.0).to(MATH)[:, None]
        if EXACT:
            xc = tl.where(m2, x - mean, 0.0)
            var = tl.sum(xc * xc, axis=1) / n_cols + eps
            rstd = tl.where(rmask, 1.0 / tl.sqrt(var), 0.0)[:, None]
        else:
            rstd = tl.load(rstd_ptr + rows, mask=rmask, other=0.0).to(MATH)[:, None]
        xhat = tl.where(m2, (x - mean) * rstd, 0.0)
        g = dy * w[None, :]
        c1 = (tl.sum(g * xhat, axis=1) / n_cols)[:, None]
        ms = rmask[:, None] & smask[None, :]
        soffs = rows[:, None] * n_cols + scols[None, :]
        xs = tl.load(x_ptr + soffs, mask=ms, other=0.0).to(MATH)
        dys = tl.load(dy_ptr + soffs, mask=ms, other=0.0).to(MATH)
        gs = dys * ws[None, :]
        xhs = tl.where(ms, (xs - mean) * rstd, 0.0)
        if RMS:
            dx = (gs - xhs * c1) * rstd
        else:
            c2 = (tl.sum(g, axis=1) / n_cols)[:, None]
            dx = (gs - (xhs * c1 + c2)) * rstd
        dx = dx.to(tl.float32).to(dx_ptr.dtype.element_ty)
        if RES:  # rounded as a separate add of the two would round
            dres = tl.load(dres_ptr + soffs, mask=ms, other=0.0)
            dx = (dx.to(tl.float32) + dres.to(tl.float32)).to(dx_ptr.dtype.element_ty)
        tl.store(dx_ptr + soffs, dx, mask=ms)
        dw_acc += tl.sum((dys * xhs).to(tl.float64), axis=0)
        if HAS_DB:
            db_acc += tl.sum(dys.to(tl.float64), axis=0)
    # (through fp32: the interpreter converts fp64 to bf16 wrongly; one more rounding of a
    # value already rounded to fp32's 24 bits changes a 16-bit result only at exact ties)
    tl.store(dw_ptr + scols, dw_acc.to(tl.float32).to(dw_ptr.dtype.element_ty), mask=smask)
    if HAS_DB:
        tl.store(db_ptr + scols, db_acc.to(tl.float32).to(db_ptr.dtype.element_ty), mask=smask)


# --------------------------------------------------------------------------- shifted rows
#
# A row width that is not a multiple of 16 bytes (4097 columns) starts most rows off a
# 16-byte boundary, and every load and store of the kernels above is then one element
# wide. The kernels below read such a row as the aligned chunks that hold it
# (_triton_rows.shifted_span; the neighbours' values masked out) and write its aligned
# interior 16 bytes at a time, the < A elements at each end one at a time. Row r starts
# (r * n_cols) mod A elements past a boundary, which repeats every C = A / gcd(n_cols, A)
# rows: each program walks rows of one class (r mod C), so that its weight (and bias,
# and the backward's dweight / dbias sums) sit at one shift, loaded or stored once.


@triton_support.jit
def _span_loads(ptr, a0, lim, cols, e0, e0m, e1, e1m, m, m1):
    # A row's chunks and its two ends, all masked off unless m < m1 (a row of the program)
    main = tl.load(ptr + a0 + cols, mask=(cols < lim) & (cols * 0 + m < m1), other=0.0)
    end0 = tl.load(ptr + a0 + e0, mask=e0m & (e0 * 0 + m < m1), other=0.0)
    end1 = tl.load(ptr + a0 + e1, mask=e1m & (e1 * 0 + m < m1), other=0.0)
    return main, end0, end1


@triton_support.jit
def _norm_fwd_shift_kernel(
    x_ptr,  # as _norm_fwd_kernel's (no residual: r_ptr and h_ptr unused)
    w_ptr,
    b_ptr,
    r_ptr,
    h_ptr,
    y_ptr,
    mean_ptr,
    rstd_ptr,
    n_rows,
    n_cols,
    eps,
    per,  # rows of its class per program
    BLOCK: tl.constexpr,  # power of two >= n_cols + A - 1
    A: tl.constexpr,  # elements per 16 bytes
    C: tl.constexpr,  # row classes
    RMS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    CORR: tl.constexpr,  # fp32 x: the mean of x - x[0] (as _norm_fwd_kernel)
):
    pid = tl.program_id(0)
    cls = pid % C
    m0 = (pid // C) * per
    m1 = tl.minimum(m0 + per, (n_rows - cls + C - 1) // C)
    total = n_cols.to(tl.int64) * n_rows  # (n_rows may be the constant 1)
    cols = tl.arange(0, BLOCK)
    ends = tl.arange(0, A)
    lo, r1, hi, b0, b1 = class_span(cls, n_cols, A)
    k = cols - lo  # the column at each place of a span
    kmask = (k >= 0) & (k < n_cols)
    inside = (cols >= lo) & (cols < r1)
    e0 = ends
    e0m = (e0 >= lo) & (e0 < b0)
    e1 = b1 + ends
    e1m = e1 < r1
    w = tl.load(w_ptr + k, mask=kmask, other=0.0).to(tl.float32)
    w0 = tl.load(w_ptr + e0 - lo, mask=e0m, other=0.0).to(tl.float32)
    w1 = tl.load(w_ptr + e1 - lo, mask=e1m, other=0.0).to(tl.float32)
    b = w
    bb0 = w0
    bb1 = w1
    if HAS_BIAS:
        b = tl.load(b_ptr + k, mask=kmask, other=0.0).to(tl.float32)
        bb0 = tl.load(b_ptr + e0 - lo, mask=e0m, other=0.0).to(tl.float32)
        bb1 = tl.load(b_ptr + e1 - lo, mask=e1m, other=0.0).to(tl.float32)
    # the first row's chunks and ends; each step then loads the next row's before its
    # reductions
    a0, lim = row_start((cls + C * m0).to(tl.int64), n_cols, total, hi, A)
    x_nx, x0_nx, x1_nx = _span_loads(x_ptr, a0, lim, cols, e0, e0m, e1, e1m, m0, m1)
    if CORR:
        s_nx = tl.load(x_ptr + (cls + C * m0).to(tl.int64) * n_cols, mask=m0 < m1, other=0.0)
    for m in range(m0, m1):
        x = x_nx.to(tl.float32)
        x0 = x0_nx.to(tl.float32)
        x1 = x1_nx.to(tl.float32)
        row = cls.to(tl.int64) + C * m
        a0, lim = row_start(row, n_cols, total, hi, A)
        na0, nlim = row_start(row + C, n_cols, total, hi, A)
        x_nx, x0_nx, x1_nx = _span_loads(x_ptr, na0, nlim, cols, e0, e0m, e1, e1m, m + 1, m1)
        sub = 0.0
        if CORR:
            sub = s_nx.to(tl.float32)
            s_nx = tl.load(x_ptr + (row + C) * n_cols, mask=m + 1 < m1, other=0.0)
        if lim < r1:  # the tensor's last row: its last partial chunk, one element at a time
            x += tl.load(x_ptr + a0 + cols, mask=(cols >= lim) & (cols < r1), other=0.0).to(tl.float32)
        x = tl.where(inside, x, 0.0)
        if RMS:
            xc = x
            mean = 0.0
            mc = 0.0
        else:
            if CORR:
                # the mean of x - x[0] (exact for nearly equal values, and the row's ends
                # as exact as its interior), as _norm_fwd_kernel
                x = tl.where(inside, x - sub, 0.0)
                x0 = x0 - sub
                x1 = x1 - sub
            mc = tl.sum(x, axis=0) / n_cols
            xc = tl.where(inside, x - mc, 0.0)
            mean = mc + sub
            tl.store(mean_ptr + row, mean)
        rstd = 1.0 / tl.sqrt_rn((tl.sum(xc * xc, axis=0) / n_cols + eps).to(tl.float32))
        tl.store(rstd_ptr + row, rstd)
        y = xc * rstd * w
        y0 = (x0 - mc) * rstd * w0
        y1 = (x1 - mc) * rstd * w1
        if HAS_BIAS:
            y = y + b
            y0 = y0 + bb0
            y1 = y1 + bb1
        tl.store(y_ptr + a0 + cols, y.to(y_ptr.dtype.element_ty), mask=(cols >= b0) & (cols < b1))
        tl.store(y_ptr + a0 + e0, y0.to(y_ptr.dtype.element_ty), mask=e0m)
        tl.store(y_ptr + a0 + e1, y1.to(y_ptr.dtype.element_ty), mask=e1m)


@triton_support.jit
def _norm_bwd_shift_kernel(
    dy_ptr,  # as _norm_bwd_kernel's (no residual: dres_ptr unused)
    x_ptr,
    w_ptr,
    mean_ptr,
    rstd_ptr,
    dx_ptr,
    dres_ptr,
    dw_part_ptr,  # [programs, n_cols] fp32
    db_part_ptr,
    n_rows,
    n_cols,
    per,  # rows of its class per program
    BLOCK: tl.constexpr,  # power of two >= n_cols + A - 1
    A: tl.constexpr,
    C: tl.constexpr,
    RMS: tl.constexpr,
    ACC: tl.constexpr,  # the partials' dtype (as _norm_bwd_kernel's)
):
    pid = tl.program_id(0)
    cls = pid % C
    m0 = (pid // C) * per
    m1 = tl.minimum(m0 + per, (n_rows - cls + C - 1) // C)
    total = n_cols.to(tl.int64) * n_rows  # (n_rows may be the constant 1)
    cols = tl.arange(0, BLOCK)
    ends = tl.arange(0, A)
    lo, r1, hi, b0, b1 = class_span(cls, n_cols, A)
    k = cols - lo
    kmask = (k >= 0) & (k < n_cols)
    inside = (cols >= lo) & (cols < r1)
    e0 = ends
    e0m = (e0 >= lo) & (e0 < b0)
    e1 = b1 + ends
    e1m = e1 < r1
    w = tl.load(w_ptr + k, mask=kmask, other=0.0).to(tl.float32)
    w0 = tl.load(w_ptr + e0 - lo, mask=e0m, other=0.0).to(tl.float32)
    w1 = tl.load(w_ptr + e1 - lo, mask=e1m, other=0.0).to(tl.float32)
    dw_acc = tl.zeros([BLOCK], dtype=ACC)
    db_acc = tl.zeros([BLOCK], dtype=ACC)
    row = (cls + C * m0).to(tl.int64)
    a0, lim = row_start(row, n_cols, total, hi, A)
    x_nx, x0_nx, x1_nx = _span_loads(x_ptr, a0, lim, cols, e0, e0m, e1, e1m, m0, m1)
    dy_nx, dy0_nx, dy1_nx = _span_loads(dy_ptr, a0, lim, cols, e0, e0m, e1, e1m, m0, m1)
    srow = tl.minimum(row, n_rows - 1)  # (a valid row's statistics, read or not)
    rstd_nx = tl.load(rstd_ptr + srow)
    mean_nx = rstd_nx
    if not RMS:
        mean_nx = tl.load(mean_ptr + srow)
    for m in range(m0, m1):
        x = x_nx.to(tl.float32)
        dy = dy_nx.to(tl.float32)
        x0 = x0_nx.to(tl.float32)
        dy0 = dy0_nx.to(tl.float32)
        x1 = x1_nx.to(tl.float32)
        dy1 = dy1_nx.to(tl.float32)
        rstd = rstd_nx
        mean = 0.0
        if not RMS:
            mean = mean_nx
        row = cls.to(tl.int64) + C * m
        a0, lim = row_start(row, n_cols, total, hi, A)
        na0, nlim = row_start(row + C, n_cols, total, hi, A)
        x_nx, x0_nx, x1_nx = _span_loads(x_ptr, na0, nlim, cols, e0, e0m, e1, e1m, m + 1, m1)
        dy_nx, dy0_nx, dy1_nx = _span_loads(dy_ptr, na0, nlim, cols, e0, e0m, e1, e1m, m + 1, m1)
        nsrow = tl.minimum(row + C, n_rows - 1)
        rstd_nx = tl.load(rstd_ptr + nsrow)
        if not RMS:
            mean_nx = tl.load(mean_ptr + nsrow)
        if lim < r1:  # the tensor's last row: its last partial chunk, one element at a time
            tmask = (cols >= lim) & (cols < r1)
            x += tl.load(x_ptr + a0 + cols, mask=tmask, other=0.0).to(tl.float32)
            dy += tl.load(dy_ptr + a0 + cols, mask=tmask, other=0.0).to(tl.float32)
        xhat = tl.where(inside, (x - mean) * rstd, 0.0)
        dy = tl.where(inside, dy, 0.0)
        g = dy * w
        c1 = tl.sum(g * xhat, axis=0) / n_cols
        c2 = 0.0
        if not RMS:
            c2 = tl.sum(g, axis=0) / n_cols
            db_acc += dy.to(ACC)
        dw_acc += (dy * xhat).to(ACC)
        dx = (g - (xhat * c1 + c2)) * rstd
        dx0 = (dy0 * w0 - ((x0 - mean) * rstd * c1 + c2)) * rstd
        dx1 = (dy1 * w1 - ((x1 - mean) * rstd * c1 + c2)) * rstd
        tl.store(dx_ptr + a0 + cols, dx.to(dx_ptr.dtype.element_ty), mask=(cols >= b0) & (cols < b1))
        tl.store(dx_ptr + a0 + e0, dx0.to(dx_ptr.dtype.element_ty), mask=e0m)
        tl.store(dx_ptr + a0 + e1, dx1.to(dx_ptr.dtype.element_ty), mask=e1m)
    tl.store(dw_part_ptr + pid * n_cols + k, dw_acc, mask=kmask)
    if not RMS:
        tl.store(db_part_ptr + pid * n_cols + k, db_acc, mask=kmask)


def _cols_config(n_rows: int, block: int, cfg: Config = CONFIG) -> tuple[int, int, int]:
    """(BLOCK_C, ROWS, num_warps) of the one-launch backward: strips of up to cfg.small_strip
    columns (16 programs where the row is that wide, at least 16 columns each), ~cfg.small_step_elems
    elements a step, 4 to 8 warps (16 for rows of 4096 columns and more)."""
    block_c = max(16, min(cfg.small_strip, block // 16))
    rows = max(1, min(triton_support.next_pow2(n_rows), cfg.small_step_elems // block))
    elems = rows * block
    warps = 4 if elems <= 2048 else 8 if elems <= 8192 or block < 4096 else 16
    return block_c, rows, cfg.small_warps or warps


def row_limits(x, *args, **kwargs) -> str | None:
    """``Impl.limits`` of the fused residual forms (add_rms_norm): rows wider than MAX_D
    are refused (the refusal ``_row_block`` raises, as its message). layer_norm and
    rms_norm take any width (``wide.py``)."""
    try:
        _row_block(x.shape[-1] if x.dim() else 1)
    except ValueError as e:
        return str(e)
    return None


def _row_block(n_cols: int) -> int:
    """The power-of-two block holding a whole row (ValueError past MAX_D)."""
    block = triton_support.next_pow2(max(n_cols, 1))
    if block > MAX_D:
        raise ValueError(f"x: rows of {n_cols} elements are wider than the triton backend's limit ({MAX_D})")
    return block


def _fwd_config(
    n_cols: int, cfg: Config = CONFIG, n_rows: int | None = None, sms: int = 0, elem: int = 2, res: bool = False
):
    """(BLOCK, ROWS, num_warps): whole rows in registers, ~cfg.row_elems elements per program,
    or one row a program where ``n_rows`` rows would fill fewer than cfg.fwd_min_per_sm
    programs per SM of ``sms`` (fp32 rows of 256 or fewer then take 2 warps); num_warps:
    cfg.fwd_warps when set. Where sweeps on an H200 found better (lab/gpu_small_rows.py; the
    rows and numbers: benchmarks/NOTES.md, sessions (ao) and (au)):
    - 16-bit rows of 513-1024 columns, four a program, take 4 warps;
    - 16-bit rows of 1025-2048 columns run one a program at 4 warps;
    - 4096-wide blocks: fp32 rows take 16 warps unless the grid is small, and 16-bit rows
      with a residual (``res``: two loads and two stores an element) 4 warps."""
    block = _row_block(n_cols)
    rows = max(1, min(64, cfg.row_elems // block))
    if elem == 2 and block == 2048:
        rows = 1
    small = n_rows is not None and triton_support.cdiv(n_rows, rows) < cfg.fwd_min_per_sm * sms
    if small:
        rows = 1
    elems = block * rows
    warps = 2 if elems <= 256 and elem >= 4 else 4 if elems <= 2048 else 8 if elems <= 8192 else 16
    if elem == 2 and block == 1024 and rows > 1 and elems <= 4096:
        warps = 4
    if block == 4096 and rows == 1:
        if elem >= 4 and not small:
            warps = 16
        elif elem == 2 and res:
            warps = 4
    return block, rows, cfg.fwd_warps or warps


# The backward's shape by padded row width (BLOCK) and element size, as swept by
# lab/sweep_norm_shapes.py (measurements in benchmarks/NOTES.md): fp32 rows of 4096 and
# more keep one program per SM with 16 warps; 16-bit rows two programs per SM with 4 warps
# at 4096 and one with 8 warps past it; narrower rows want more programs in flight, 8192 /
# BLOCK of them per SM (4 for fp32 rows of 1024, whose fp64 partials cost more to write),
# with 8 warps at 1024 and 4 below.


def _bwd_shape(block: int, elem: int) -> tuple[int, int]:
    """(programs per SM, warps) of the backward by row width (see above)."""
    if block >= 4096:
        if elem >= 4:
            return 1, 16
        return (2, 4) if block == 4096 else (1, 8)
    if elem >= 4 and block == 1024:
        return 4, 8
    return max(1, min(8, 8192 // block)), 8 if block == 1024 else 4


def _bwd_warps(block: int, cfg: Config = CONFIG, elem: int = 2) -> int:
    """Warps of the backward: cfg.bwd_warps, or by row width (``_bwd_shape``)."""
    return cfg.bwd_warps or _bwd_shape(block, elem)[1]


def _bwd_programs_per_sm(block: int, cfg: Config = CONFIG, elem: int = 2) -> int:
    return cfg.bwd_programs_per_sm or _bwd_shape(block, elem)[0]


def _bwd_programs(n_rows: int, block: int, dev, cfg: Config = CONFIG, elem: int = 2) -> int:
    """Programs of the backward: ``_bwd_programs_per_sm`` per SM on a GPU (each holds a row
    of x and dy and two fp32 accumulators in registers); a handful under the interpreter
    (several rows per program, so the group loop and its short last group are exercised)."""
    if dev.type == "cuda":
        per_sm = _bwd_programs_per_sm(block, cfg, elem)
        return max(1, min(n_rows, per_sm * triton_support.sm_count(dev.index)))
    return max(1, min(n_rows, 4))


def _row_1d(rows: int, dtype, cfg: Config = CONFIG) -> bool:
    return cfg.fwd_row_1d and rows == 1 and dtype != torch.float32


# Launch plans: what a launcher derives from (shape, dtypes, flags, config) - grid, tiles,
# constexprs, the bound launches (triton_support.Bound) - computed once per key. A call
# then allocates its outputs and launches (done per call, this Python would be most of
# the host cost of a GPT-2-sized model's norm calls).
_PLANS: dict = {}


def _plan(x, key, make):
    """The plan of ``key`` (triton_support.kept_plan); traced calls (torch.compile's fake
    tensors, whose shapes may be symbolic) make one and keep none."""
    return triton_support.kept_plan(_PLANS, key if type(x) is torch.Tensor else None, make)


class FwdPlan(NamedTuple):
    n_rows: int
    n_cols: int
    launch: triton_support.Bound | None  # None: nothing to launch (an empty input)
    row_kernel: bool  # _norm_fwd_row_kernel (no n_rows argument)
    per: int = 0  # _norm_fwd_shift_kernel: rows of a class per program


def _shift(n_cols: int, elem: int, cfg: Config = CONFIG, fwd: bool = False) -> tuple[int, int, int] | None:
    """(BLOCK, A, C) of the shifted kernels for rows of ``n_cols`` elements of ``elem``
    bytes, or None where they do not apply (rows on 16-byte boundaries, narrower than
    cfg.shift_fwd_min_cols / shift_bwd_min_cols, or whose chunks pass MAX_D)."""
    a = 16 // elem
    least = cfg.shift_fwd_min_cols if fwd else cfg.shift_bwd_min_cols
    if not least or n_cols < least or n_cols % a == 0:
        return None
    block = triton_support.next_pow2(n_cols + a - 1)
    return (block, a, a // math.gcd(n_cols, a)) if block <= MAX_D else None


def _bwd_acc(block: int, w_dtype, cfg: Config = CONFIG):
    """(ACC, most rows per program) of a backward: fp32 weights sum their partials in fp64
    up to blocks of cfg.acc64_max_block (a wider fp64 row would not fit in registers),
    and past it sum at most cfg.bwd_max_rows rows a program; 16-bit ones in fp32, any
    number of rows (their bound is far looser than the rounding of such sums)."""
    if w_dtype != torch.float32:
        return tl.float32, 1 << 30
    if block <= cfg.acc64_max_block:
        return tl.float64, 1 << 30
    return tl.float32, cfg.bwd_max_rows


def _class_split(n_rows: int, classes: int, programs: int) -> tuple[int, int]:
    """(programs, rows per program) of a shifted launch: about ``programs`` programs, a
    whole number per row class, each walking ``per`` rows of its class."""
    in_class = triton_support.cdiv(n_rows, classes)
    per = triton_support.cdiv(in_class, max(1, min(in_class, triton_support.cdiv(programs, classes))))
    return classes * triton_support.cdiv(in_class, per), per


class BwdPlan(NamedTuple):
    n_rows: int
    n_cols: int
    programs: int
    want_db: bool
    launch: triton_support.Bound | None
    rows_per_program: int
    psum: triton_support.Bound | None  # the partials' sum (None: nothing to launch)
    small: bool  # launch is _norm_bwd_cols_kernel (dw, db written directly)
    part_dtype: torch.dtype = torch.float32  # the partials' (ACC)


def _shift_fwd_shape(block: int, rms: bool, fp32: bool, cfg: Config = CONFIG) -> tuple[int, int]:
    """(programs per SM, warps) of the shifted forward: 4 programs of 4 warps, but fp32
    layer norms (two reductions a row in series) 8 programs up to 2048-wide blocks and 8
    warps past them (`small_rows-H200-af61f62-shift.jsonl`: 4099 x 1025 22.7 -> 20.5 us,
    4096 x 4097 63.6 -> 56.4); cfg's values when set."""
    per_sm, warps = 4, 4
    if fp32 and not rms:
        per_sm, warps = (8, 4) if block <= 2048 else (4, 8)
    return cfg.shift_fwd_per_sm or per_sm, cfg.shift_fwd_warps or warps


def _fwd_plan(x, rms, has_bias, has_res, cfg) -> FwdPlan:
    n_rows, n_cols = plumbing.rows_of(x)
    if not (n_rows and n_cols):
        return FwdPlan(n_rows, n_cols, None, False)
    shift = None if has_res else _shift(n_cols, x.element_size(), cfg, fwd=True)
    if shift is not None:
        block, a, c = shift
        on_gpu = x.device.type == "cuda"
        per_sm, warps = _shift_fwd_shape(block, rms, x.dtype == torch.float32, cfg)
        target = per_sm * triton_support.sm_count(x.device.index) if on_gpu else 4
        programs, per = _class_split(n_rows, c, target)
        kw = dict(BLOCK=block, A=a, C=c, RMS=rms, HAS_BIAS=has_bias, CORR=x.dtype == torch.float32,
                  num_warps=cfg.fwd_warps or warps)  # fmt: skip
        launch = triton_support.Bound(_norm_fwd_shift_kernel, (programs,), kw, (0, 1, 2, 3, 4))
        return FwdPlan(n_rows, n_cols, launch, False, per)
    sms = triton_support.sm_count(x.device.index) if x.device.type == "cuda" else 0
    block, rows, warps = _fwd_config(n_cols, cfg, n_rows, sms, x.element_size(), has_res)
    # tensors passed in (x, w, b, res, h) are checked for alignment on every call; the
    # launcher's own allocations need not be
    if _row_1d(rows, x.dtype, cfg):
        kw = dict(BLOCK=block, RMS=rms, HAS_BIAS=has_bias, RES=has_res, EVEN=block == n_cols,
                  WIDE=not (cfg.fwd_narrow and x.numel() < 2**31), num_warps=warps)  # fmt: skip
        return FwdPlan(n_rows, n_cols, triton_support.Bound(_norm_fwd_row_kernel, (n_rows,), kw, (0, 1, 2, 3, 4)), True)
    grid = (triton_support.cdiv(n_rows, rows),)
    kw = dict(BLOCK=block, ROWS=rows, RMS=rms, HAS_BIAS=has_bias, RES=has_res, EVICT=cfg.fwd_evict,
              EVEN=cfg.fwd_even and block == n_cols and n_rows % rows == 0,
              WIDE=not (cfg.fwd_narrow and x.numel() < 2**31),
              W_FIRST=grid[0] <= cfg.fwd_w_first_per_sm * max(sms, 1), num_warps=warps)  # fmt: skip
    return FwdPlan(n_rows, n_cols, triton_support.Bound(_norm_fwd_kernel, grid, kw, (0, 1, 2, 3, 4)), False)


def norm_fwd(x, w, b, eps, rms, res=None, h=None, cfg: Config = CONFIG):
    """See plumbing: (y, mean, rstd); x contiguous. With ``res`` (contiguous, x's shape and
    dtype) the kernel normalizes x + res and writes that sum into ``h`` (fresh, x's shape).
    Rows wider than MAX_D without ``res`` take the kernels of ``wide.py``."""
    if res is None and x.dim() and x.shape[-1] > MAX_D:
        return _wide_fwd(x, w, b, eps, rms, cfg)
    key = ("f", x.shape, x.dtype, x.device, rms, b is None, res is None, None if cfg is CONFIG else cfg)
    plan = _plan(x, key, lambda: _fwd_plan(x, rms, b is not None, res is not None, cfg))
    n_rows, n_cols, launch, row_kernel, per = plan
    y = torch.empty_like(x)
    rstd = torch.empty(n_rows, dtype=torch.float32, device=x.device)
    mean = None if rms else torch.empty(n_rows, dtype=torch.float32, device=x.device)
    if launch is not None:
        stats = mean if mean is not None else rstd
        args = (x, w, b if b is not None else w, res if res is not None else x, h if h is not None else y, y,
                stats, rstd)  # fmt: skip
        if row_kernel:
            launch(*args, n_cols, eps)
        elif per:
            launch(*args, n_rows, n_cols, eps, per)
        else:
            launch(*args, n_rows, n_cols, eps)
    return y, mean, rstd


def _wide_fwd(x, w, b, eps, rms, cfg: Config):
    n_rows, n_cols = plumbing.rows_of(x)
    if not n_rows:
        return torch.empty_like(x), *plumbing.empty_stats(x, rms)
    y, mean, rstd = wide.wide_fwd(x.view(n_rows, n_cols), w, b, float(eps), rms, strip=cfg.wide_fwd_strip,
                                  warps=cfg.wide_warps, waves=cfg.wide_waves)  # fmt: skip
    return y.view(x.shape), mean, rstd


def _wide_bwd(dy, x, w, mean, rstd, rms, has_bias, cfg: Config):
    n_rows, n_cols = plumbing.rows_of(x)
    want_db = has_bias and not rms
    if not n_rows:
        return torch.empty_like(x), torch.zeros_like(w), (torch.zeros_like(w) if want_db else None)
    x2, dy2 = x.view(n_rows, n_cols), dy.view(n_rows, n_cols)
    dx, dw, db = wide.wide_bwd(dy2, x2, w, mean, rstd, rms, has_bias, strip=cfg.wide_bwd_strip,
                               warps=cfg.wide_warps, waves=cfg.wide_waves)  # fmt: skip
    return dx.view(x.shape), dw, db


def _bwd_plan(x, w, rms, has_bias, has_dres, cfg) -> BwdPlan:
    n_rows, n_cols = plumbing.rows_of(x)
    want_db = has_bias and not rms
    if not (n_rows and n_cols):
        return BwdPlan(n_rows, n_cols, 0, want_db, None, 0, None, False)
    block = _row_block(n_cols)
    elems = n_rows * n_cols
    f32 = x.dtype == torch.float32
    small_f32 = block <= cfg.exact_max_block or elems <= cfg.small_fp32_elems or n_rows <= cfg.small_fp32_rows
    if elems <= cfg.bwd_small_elems and (not f32 or small_f32):
        block_c, rows, warps = _cols_config(n_rows, block, cfg)
        kw = dict(BLOCK=block, BLOCK_C=block_c, ROWS=rows, RMS=rms, RES=has_dres, HAS_DB=want_db,
                  MATH=tl.float64 if f32 else tl.float32, EXACT=f32 and block <= cfg.exact_max_block,
                  num_warps=warps, enable_fp_fusion=False)  # fmt: skip  (as below: g rounds alike)
        grid = (triton_support.cdiv(n_cols, block_c),)
        # dy, x, w, mean, rstd and dres come from outside: checked for alignment on every call
        cols = triton_support.Bound(_norm_bwd_cols_kernel, grid, kw, (0, 1, 2, 3, 4, 6))
        return BwdPlan(n_rows, n_cols, grid[0], want_db, cols, n_rows, None, True)
    programs = _bwd_programs(n_rows, block, x.device, cfg, x.element_size())
    warps = _bwd_warps(block, cfg, x.element_size())
    shift = None if has_dres else _shift(n_cols, x.element_size(), cfg)
    if shift is not None:
        block, a, c = shift
        acc, most = _bwd_acc(block, w.dtype, cfg)
        programs, per = _class_split(n_rows, c, programs)
        if per > most:
            programs, per = _class_split(n_rows, c, c * triton_support.cdiv(n_rows, c * most))
        # (no fused multiply-add, as below)
        kw = dict(BLOCK=block, A=a, C=c, RMS=rms, ACC=acc, num_warps=warps, enable_fp_fusion=False)
        bwd = triton_support.Bound(_norm_bwd_shift_kernel, (programs,), kw, (0, 1, 2, 3, 4, 6))
    else:
        acc, most = _bwd_acc(block, w.dtype, cfg)
        per = min(triton_support.cdiv(n_rows, programs), most)
        programs = triton_support.cdiv(n_rows, per)
        kw = dict(BLOCK=block, RMS=rms, PREFETCH=cfg.bwd_prefetch, RES=has_dres, ACC=acc, num_warps=warps,
                  # No fused multiply-add: g = w * dy must round the same way in dx as in mean(g), or
                  # dx of a one-element row (exactly 0) comes out as rstd * (rounding error of g).
                  enable_fp_fusion=False)  # fmt: skip
        # dy, x, w, mean, rstd and dres come from outside: checked for alignment on every call
        bwd = triton_support.Bound(_norm_bwd_kernel, (programs,), kw, (0, 1, 2, 3, 4, 6))
    w32 = w.dtype == torch.float32
    block_p, block_c = _psum_config(programs, n_cols, cfg, 8 if w32 else 4)
    psum = triton_support.Bound(
        _partials_sum_kernel,
        (triton_support.cdiv(n_cols, block_c),),
        dict(HAS_DB=want_db, BLOCK_P=block_p, BLOCK_C=block_c, ACC=tl.float64 if w32 else tl.float32,
             num_warps=4),
        (1,),  # db_part is rstd when there is no db
    )
    part = torch.float64 if acc is tl.float64 else torch.float32
    return BwdPlan(n_rows, n_cols, programs, want_db, bwd, per, psum, False, part)


def norm_bwd(dy, x, w, mean, rstd, rms, has_bias, dres=None, cfg: Config = CONFIG, eps: float | None = None):
    """See plumbing: (dx, dw, db); dy and x contiguous. With ``dres`` (contiguous, x's shape
    and dtype) dx is the norm's gradient plus dres, rounded as two ops would round. ``eps``:
    the forward's (None: the ops' default, 1e-6 for rms and 1e-5 otherwise)."""
    if eps is None:
        eps = 1e-6 if rms else 1e-5
    if dres is None and x.dim() and x.shape[-1] > MAX_D:
        return _wide_bwd(dy, x, w, mean, rstd, rms, has_bias, cfg)
    key = ("b", x.shape, x.dtype, w.dtype, x.device, rms, has_bias, dres is None,
           None if cfg is CONFIG else cfg)  # fmt: skip
    plan = _plan(x, key, lambda: _bwd_plan(x, w, rms, has_bias, dres is not None, cfg))
    n_rows, n_cols, programs, want_db, launch, per, psum, small, part_dtype = plan
    dx = torch.empty_like(x)  # x is contiguous
    if launch is None:
        db = torch.zeros_like(w) if want_db else None
        if dres is not None:
            dx.copy_(dres)
        return dx, torch.zeros_like(w), db
    if small:
        dw = torch.empty_like(w)
        db = torch.empty_like(w) if want_db else None
        launch(dy, x, w, mean if mean is not None else rstd, rstd, dx, dres if dres is not None else dx, dw,
               db if db is not None else dw, n_rows, n_cols, float(eps))  # fmt: skip
        return dx, dw, db
    # Separate buffers, not views of one: under torch.compile a view of a buffer that a
    # kernel writes is functionalized into copies (Inductor emitted three select/clone
    # kernels per norm backward in the GPT-2 step, 75 launches a step). RMS has no db: its
    # db_part argument is rstd, which the kernel never touches then.
    dw_part = torch.empty((programs, n_cols), dtype=part_dtype, device=x.device)
    db_part = torch.empty_like(dw_part) if not rms else rstd
    launch(dy, x, w, mean if mean is not None else rstd, rstd, dx, dres if dres is not None else dx, dw_part,
           db_part, n_rows, n_cols, per)  # fmt: skip
    dw = torch.empty(n_cols, dtype=w.dtype, device=w.device)  # (custom-op outputs may not alias)
    db = torch.empty_like(dw) if want_db else None
    # One launch sums the partials of dw (and db) and casts to w's dtype (in fp64 for fp32
    # weights); torch's sum(0).to(dtype) takes two launches per parameter.
    psum(dw_part, db_part, dw, db if db is not None else dw, programs, n_cols)
    return dx, dw, db


# The partial-sum kernel loads all of a column strip's partial rows at once (BLOCK_P >=
# programs, up to cfg.psum_max_p; more loop) in strips of BLOCK_C columns: GPT-2's 768
# columns and 264 partials are 96 programs of 512 x 8.


def _psum_config(programs: int, n_cols: int, cfg: Config = CONFIG, acc_bytes: int = 4) -> tuple[int, int]:
    """(BLOCK_P, BLOCK_C) of the partial-sum kernel (fp64 accumulators: half the tile)."""
    block_p = min(cfg.psum_max_p * 4 // acc_bytes, triton_support.next_pow2(programs))
    block_c = max(8, min(triton_support.next_pow2(n_cols), cfg.psum_elems * 4 // acc_bytes // block_p))
    return block_p, block_c


@triton_support.jit
def _partials_sum_kernel(
    dw_part_ptr,
    db_part_ptr,
    dw_ptr,
    db_ptr,
    n_parts,
    n_cols,
    HAS_DB: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_C: tl.constexpr,
    ACC: tl.constexpr,  # fp64 for fp32 weights (their bound is tight), else fp32
):
    # dw_part, db_part: [n_parts, n_cols] contiguous (fp32 or fp64); dw, db: [n_cols] in w's dtype.
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < n_cols
    acc_w = tl.zeros((BLOCK_P, BLOCK_C), dtype=ACC)
    acc_b = tl.zeros((BLOCK_P, BLOCK_C), dtype=ACC)
    for p0 in range(0, n_parts, BLOCK_P):
        parts = p0 + tl.arange(0, BLOCK_P)
        mask = (parts[:, None] < n_parts) & cmask[None, :]
        offs = parts[:, None] * n_cols + cols[None, :]
        acc_w += tl.load(dw_part_ptr + offs, mask=mask, other=0.0).to(ACC)
        if HAS_DB:
            acc_b += tl.load(db_part_ptr + offs, mask=mask, other=0.0).to(ACC)
    # (through fp32, as in _norm_bwd_cols_kernel)
    tl.store(dw_ptr + cols, tl.sum(acc_w, axis=0).to(tl.float32).to(dw_ptr.dtype.element_ty), mask=cmask)
    if HAS_DB:
        tl.store(db_ptr + cols, tl.sum(acc_b, axis=0).to(tl.float32).to(db_ptr.dtype.element_ty), mask=cmask)


def _asm_launch(bound: triton_support.Bound) -> tuple[dict, dict]:
    """(constexprs, compile options) of a plan's launch, for `kernellab asm`."""
    options = {k: v for k, v in bound.kw.items() if k in ("num_warps", "num_stages", "enable_fp_fusion")}
    return {k: v for k, v in bound.kw.items() if k not in options}, options


def kernel_specs(rms: bool):
    """For `kernellab asm`: the kernels as launched for many 4096-wide rows."""

    def specs(dtype: str):
        block, rows, warps = _fwd_config(4096, elem=4 if dtype == "fp32" else 2)
        fwd = {
            "x_ptr": f"*{dtype}",
            "w_ptr": f"*{dtype}",
            "b_ptr": f"*{dtype}",
            "r_ptr": f"*{dtype}",
            "h_ptr": f"*{dtype}",
            "y_ptr": f"*{dtype}",
            "mean_ptr": "*fp32",
            "rstd_ptr": "*fp32",
            "n_rows": "i32",
            "n_cols": "i32",
            "eps": "fp32",
            "BLOCK": "constexpr",
            "ROWS": "constexpr",
            "RMS": "constexpr",
            "HAS_BIAS": "constexpr",
            "RES": "constexpr",
            "EVICT": "constexpr",
            "EVEN": "constexpr",
            "WIDE": "constexpr",
            "W_FIRST": "constexpr",
        }
        bwd = {
            "dy_ptr": f"*{dtype}",
            "x_ptr": f"*{dtype}",
            "w_ptr": f"*{dtype}",
            "mean_ptr": "*fp32",
            "rstd_ptr": "*fp32",
            "dx_ptr": f"*{dtype}",
            "dres_ptr": f"*{dtype}",
            "dw_part_ptr": "*fp32",
            "db_part_ptr": "*fp32",
            "n_rows": "i32",
            "n_cols": "i32",
            "rows_per_prog": "i32",
            "BLOCK": "constexpr",
            "RMS": "constexpr",
            "PREFETCH": "constexpr",
            "RES": "constexpr",
            "ACC": "constexpr",
        }
        fcx = {
            "BLOCK": block,
            "ROWS": rows,
            "RMS": rms,
            "HAS_BIAS": not rms,
            "RES": False,
            "EVICT": CONFIG.fwd_evict,
            "EVEN": CONFIG.fwd_even,
            "WIDE": not CONFIG.fwd_narrow,
            "W_FIRST": False,  # (a grid of many rows)
        }
        # the backwards as their launch plans launch them: the partials kernel for many rows
        # of 4096, the one-launch kernel for 16 (constexprs, warps and the partials' dtype)
        t = parse_dtype(dtype)
        w = torch.empty(4096, dtype=t, device="meta")
        big = _bwd_plan(torch.empty(4096, 4096, dtype=t, device="meta"), w, rms, not rms, False, CONFIG)
        bwd["dw_part_ptr"] = bwd["db_part_ptr"] = "*fp64" if big.part_dtype == torch.float64 else "*fp32"
        bcx, bopts = _asm_launch(big.launch)
        ins = ("dy_ptr", "x_ptr", "w_ptr", "mean_ptr", "rstd_ptr", "dx_ptr", "dres_ptr")
        cols = {**{k: bwd[k] for k in ins},
                "dw_ptr": f"*{dtype}", "db_ptr": f"*{dtype}", "n_rows": "i32", "n_cols": "i32",
                "eps": "fp32",
                "BLOCK": "constexpr", "BLOCK_C": "constexpr", "ROWS": "constexpr", "RMS": "constexpr",
                "RES": "constexpr", "HAS_DB": "constexpr", "MATH": "constexpr",
                "EXACT": "constexpr"}  # fmt: skip
        small = _bwd_plan(torch.empty(16, 4096, dtype=t, device="meta"), w, rms, not rms, False, CONFIG)
        ccx, copts = _asm_launch(small.launch)
        if _row_1d(rows, torch.float32 if dtype == "fp32" else torch.bfloat16):
            names = (
                "x_ptr",
                "w_ptr",
                "b_ptr",
                "r_ptr",
                "h_ptr",
                "y_ptr",
                "mean_ptr",
                "rstd_ptr",
                "n_cols",
                "eps",
                "BLOCK",
                "RMS",
            )
            fwd = {k: fwd[k] for k in names} | {
                "HAS_BIAS": "constexpr",
                "RES": "constexpr",
                "EVEN": "constexpr",
                "WIDE": "constexpr",
            }
            fcx = {"BLOCK": block, "RMS": rms, "HAS_BIAS": not rms, "RES": False, "EVEN": True, "WIDE": not CONFIG.fwd_narrow}
            return [
                (_norm_fwd_row_kernel, fwd, fcx, warps),
                (_norm_bwd_kernel, bwd, bcx, bopts),
                (_norm_bwd_cols_kernel, cols, ccx, copts),
            ]
        return [
            (_norm_fwd_kernel, fwd, fcx, warps),
            (_norm_bwd_kernel, bwd, bcx, bopts),
            (_norm_bwd_cols_kernel, cols, ccx, copts),
        ]

    return specs


# add_rms_norm's launchers: (x + r) normalized with the sum written out (RES), and the
# residual stream's gradient added into dx by the backward kernel.


def add_rms_fwd(x, r, w, eps):
    h = torch.empty_like(x)
    y, _, rstd = norm_fwd(x, w, None, float(eps), True, res=r, h=h)
    return y, h, rstd


def add_rms_bwd(dy, dres, h, w, rstd, eps):
    dh, dw, _ = norm_bwd(dy, h, w, None, rstd, True, False, dres=dres, eps=eps)
    return dh, dw
