"""Triton LayerNorm / RMSNorm for rows wider than ``triton_kernels.MAX_D`` (16384 columns),
at any width: ``norm_fwd`` and ``norm_bwd`` send such rows here (not the add_ forms).

A row that wide does not fit in registers, and at an odd width it starts off a 16-byte
boundary: its loads would be one element wide unless read as the aligned 16-byte chunks
that hold it (``_triton_rows.shifted_span``, as the shifted kernels of
``triton_kernels.py``). Those kernels load the weight once per program at the row class's
shift; a wide row's weight does not fit in registers, so here the weight (and bias) are
laid out once per call as A shifted copies, ``ws[s, s + k] = w[k]`` (A = elements per 16
bytes, each copy's row a multiple of 16 bytes): a row at shift s reads its weight chunks
from copy s, aligned like its own.

Kernels (x [R, n] contiguous; a row's span: from a0, the aligned start of its first
element, positions [lo, r1 = lo + n); interior [b0, b1) of whole chunks; ends [lo, b0),
[b1, r1); lim: past the last whole chunk inside the tensor, < the span's end only for the
last row, whose last partial chunk is read element by element):

- forward: ``_stats_kernel`` (a program per row: mean and rstd from chunk statistics
  merged pairwise, Chan et al.) and ``_out_kernel`` (programs of column strips x rows of
  one shift class: y, 16-byte stores in the interior, the ends one element at a time);
- backward: ``_row_sums_kernel`` (a program per row: c1 = mean(g xhat), c2 = mean(g),
  g = dy w), ``_dx_kernel`` (strips x class rows: dx, and the strip's partial dweight /
  dbias over its rows) and ``_dw_kernel`` (the partials summed back to columns, plus the
  last row's partial chunk). Traffic: x read twice forward; x and dy read twice backward.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import triton.language as tl

from kernellab import triton_support
from kernellab.ops._triton_rows import class_span, row_start, shifted_span


@triton_support.jit
def _merge(cnt, mean, m2, cnt_b, mean_b, m2_b):
    # two (count, mean, sum of squared deviations) summaries as one (Chan et al.)
    tot = cnt + cnt_b
    d = mean_b - mean
    f = tl.where(tot > 0, cnt_b / tl.maximum(tot, 1.0), 0.0)
    return tot, mean + d * f, m2 + m2_b + d * d * cnt * f


@triton_support.jit
def _chunk_stats(x, inside):
    cnt = tl.sum(inside.to(tl.float32), axis=0)
    mean = tl.sum(tl.where(inside, x, 0.0), axis=0) / tl.maximum(cnt, 1.0)
    d = tl.where(inside, x - mean, 0.0)
    return cnt, mean, tl.sum(d * d, axis=0)


# --------------------------------------------------------------------------- forward


@triton_support.jit
def _stats_kernel(x_ptr, mean_ptr, rstd_ptr, n_rows, n, eps, CHUNK: tl.constexpr, A: tl.constexpr,
                  RMS: tl.constexpr):  # fmt: skip
    # one program per row (or fewer, each walking rows): mean and rstd in fp32
    total = tl.cast(n, tl.int64) * n_rows
    cols = tl.arange(0, CHUNK)
    ends = tl.arange(0, A)
    for row in range(tl.program_id(0), n_rows, tl.num_programs(0)):
        a0, lo, r1, hi, lim, b0, b1 = shifted_span(tl.cast(row, tl.int64) * n, n, total, A)
        xp = x_ptr + a0
        cnt = tl.sum(tl.zeros([CHUNK], tl.float32), axis=0)
        mean = cnt
        m2 = cnt
        ss = cnt
        for start in range(0, hi, CHUNK):
            j = start + cols
            x = tl.load(xp + j, mask=j < lim, other=0.0).to(tl.float32)
            inside = (j >= lo) & (j < r1) & (j < lim)
            if RMS:
                ss += tl.sum(tl.where(inside, x * x, 0.0), axis=0)
            else:
                cb, mb, qb = _chunk_stats(x, inside)
                cnt, mean, m2 = _merge(cnt, mean, m2, cb, mb, qb)
        tj = lim + ends  # the tensor's last partial chunk (the last row only)
        tin = (tj >= lo) & (tj < r1)
        t = tl.load(xp + tj, mask=tin, other=0.0).to(tl.float32)
        if RMS:
            ss += tl.sum(tl.where(tin, t * t, 0.0), axis=0)
            tl.store(rstd_ptr + row, 1.0 / tl.sqrt_rn(ss / n + eps))
        else:
            cb, mb, qb = _chunk_stats(t, tin)
            cnt, mean, m2 = _merge(cnt, mean, m2, cb, mb, qb)
            tl.store(mean_ptr + row, mean)
            tl.store(rstd_ptr + row, 1.0 / tl.sqrt_rn(m2 / n + eps))


@triton_support.jit
def _class_rows(q, n_rows, n, C: tl.constexpr, G, A: tl.constexpr):
    # program q's class c, its rows c + C m for m in [m0, m1), and the class's span
    c = q // G
    g = q % G
    in_class = (n_rows - c + C - 1) // C
    per = (in_class + G - 1) // G
    m0 = g * per
    m1 = tl.minimum(m0 + per, in_class)
    lo, r1, hi, b0, b1 = class_span(c, n, A)
    return c, m0, m1, lo, r1, hi, b0, b1


@triton_support.jit
def _strip_ends(ws_ptr, lo, r1, b0, b1, L, t, STRIP: tl.constexpr, A: tl.constexpr):
    # A class's row ends in strip t (one element at a time): [lo, b0) in strip 0, [b1, r1)
    # in the strip holding b1; positions, masks and the shifted weight there
    e0 = tl.arange(0, A)
    e0m = (e0 >= lo) & (e0 < b0) & (e0 * 0 + t == 0)
    e1 = b1 + tl.arange(0, A)
    e1m = (e1 < r1) & (e1 >= t * STRIP) & (e1 < t * STRIP + STRIP)
    w0 = tl.load(ws_ptr + lo * L + e0, mask=e0m, other=0.0).to(tl.float32)
    w1 = tl.load(ws_ptr + lo * L + e1, mask=e1m, other=0.0).to(tl.float32)
    return e0, e0m, e1, e1m, w0, w1


@triton_support.jit
def _out_kernel(x_ptr, ws_ptr, bs_ptr, mean_ptr, rstd_ptr, y_ptr, n_rows, n, L, G, STRIP: tl.constexpr,
                A: tl.constexpr, C: tl.constexpr, RMS: tl.constexpr, HAS_BIAS: tl.constexpr):  # fmt: skip
    # grid (strips, C * G): the strip's y over the rows of one class (one shift: the
    # shifted weight and bias strips load once)
    t = tl.program_id(0)
    c, m0, m1, lo, r1, hi, b0, b1 = _class_rows(tl.program_id(1), n_rows, n, C, G, A)
    total = tl.cast(n, tl.int64) * n_rows
    j = t * STRIP + tl.arange(0, STRIP)
    w = tl.load(ws_ptr + lo * L + j, mask=j < hi, other=0.0).to(tl.float32)
    b = tl.load(bs_ptr + lo * L + j, mask=j < hi, other=0.0).to(tl.float32) if HAS_BIAS else w
    e0, e0m, e1, e1m, w0, w1 = _strip_ends(ws_ptr, lo, r1, b0, b1, L, t, STRIP, A)
    if HAS_BIAS:
        bb0 = tl.load(bs_ptr + lo * L + e0, mask=e0m, other=0.0).to(tl.float32)
        bb1 = tl.load(bs_ptr + lo * L + e1, mask=e1m, other=0.0).to(tl.float32)
    smask = (j >= b0) & (j < b1)
    for m in range(m0, m1):
        row = c + C * m
        a0, lim = row_start(tl.cast(row, tl.int64), n, total, hi, A)
        rstd = tl.load(rstd_ptr + row)
        mean = 0.0 if RMS else tl.load(mean_ptr + row)
        x = tl.load(x_ptr + a0 + j, mask=(j < lim) & smask, other=0.0).to(tl.float32)
        y = (x - mean) * rstd * w
        if HAS_BIAS:
            y += b
        tl.store(y_ptr + a0 + j, y.to(y_ptr.dtype.element_ty), mask=smask)
        x0 = tl.load(x_ptr + a0 + e0, mask=e0m, other=0.0).to(tl.float32)
        x1 = tl.load(x_ptr + a0 + e1, mask=e1m, other=0.0).to(tl.float32)
        y0 = (x0 - mean) * rstd * w0
        y1 = (x1 - mean) * rstd * w1
        if HAS_BIAS:
            y0 += bb0
            y1 += bb1
        tl.store(y_ptr + a0 + e0, y0.to(y_ptr.dtype.element_ty), mask=e0m)
        tl.store(y_ptr + a0 + e1, y1.to(y_ptr.dtype.element_ty), mask=e1m)


# --------------------------------------------------------------------------- backward


@triton_support.jit
def _row_sums_kernel(dy_ptr, x_ptr, ws_ptr, mean_ptr, rstd_ptr, c1_ptr, c2_ptr, n_rows, n, L,
                     CHUNK: tl.constexpr, A: tl.constexpr, RMS: tl.constexpr):  # fmt: skip
    # one program per row (or fewer, walking rows): c1 = mean(g xhat), c2 = mean(g)
    total = tl.cast(n, tl.int64) * n_rows
    cols = tl.arange(0, CHUNK)
    ends = tl.arange(0, A)
    for row in range(tl.program_id(0), n_rows, tl.num_programs(0)):
        a0, lo, r1, hi, lim, b0, b1 = shifted_span(tl.cast(row, tl.int64) * n, n, total, A)
        rstd = tl.load(rstd_ptr + row)
        mean = 0.0 if RMS else tl.load(mean_ptr + row)
        s1 = tl.zeros([CHUNK], tl.float32)
        s2 = tl.zeros([CHUNK], tl.float32)
        for start in range(0, hi, CHUNK):
            j = start + cols
            x = tl.load(x_ptr + a0 + j, mask=j < lim, other=0.0).to(tl.float32)
            dy = tl.load(dy_ptr + a0 + j, mask=j < lim, other=0.0).to(tl.float32)
            w = tl.load(ws_ptr + lo * L + j, mask=j < hi, other=0.0).to(tl.float32)
            inside = (j >= lo) & (j < r1) & (j < lim)
            g = tl.where(inside, dy * w, 0.0)
            s1 += g * ((x - mean) * rstd)
            s2 += g
        tj = lim + ends
        tin = (tj >= lo) & (tj < r1)
        x = tl.load(x_ptr + a0 + tj, mask=tin, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + a0 + tj, mask=tin, other=0.0).to(tl.float32)
        w = tl.load(ws_ptr + lo * L + tj, mask=tin, other=0.0).to(tl.float32)
        g = tl.where(tin, dy * w, 0.0)
        tl.store(c1_ptr + row, (tl.sum(s1, axis=0) + tl.sum(g * ((x - mean) * rstd), axis=0)) / n)
        tl.store(c2_ptr + row, (tl.sum(s2, axis=0) + tl.sum(g, axis=0)) / n)


@triton_support.jit
def _dx_ends(x_ptr, dy_ptr, dx_ptr, a0, e, em, w, mean, rstd, c1, c2):
    # dx at a row's end positions (one element at a time)
    x = tl.load(x_ptr + a0 + e, mask=em, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + a0 + e, mask=em, other=0.0).to(tl.float32)
    dx = (dy * w - ((x - mean) * rstd * c1 + c2)) * rstd
    tl.store(dx_ptr + a0 + e, dx.to(dx_ptr.dtype.element_ty), mask=em)


@triton_support.jit
def _dx_kernel(dy_ptr, x_ptr, ws_ptr, mean_ptr, rstd_ptr, c1_ptr, c2_ptr, dx_ptr, dwp_ptr, dbp_ptr, n_rows, n,
               L, G, STRIP: tl.constexpr, A: tl.constexpr, C: tl.constexpr, RMS: tl.constexpr,
               HAS_DB: tl.constexpr, ACC: tl.constexpr):  # fmt: skip
    # grid (strips, C * G): dx of the strip over the rows of one class, and the strip's
    # partial dweight / dbias over them (in ACC), at span positions: dwp[q, j]
    t = tl.program_id(0)
    q = tl.program_id(1)
    c, m0, m1, lo, r1, hi, b0, b1 = _class_rows(q, n_rows, n, C, G, A)
    total = tl.cast(n, tl.int64) * n_rows
    j = t * STRIP + tl.arange(0, STRIP)
    w = tl.load(ws_ptr + lo * L + j, mask=j < hi, other=0.0).to(tl.float32)
    e0, e0m, e1, e1m, w0, w1 = _strip_ends(ws_ptr, lo, r1, b0, b1, L, t, STRIP, A)
    inside = (j >= lo) & (j < r1)
    smask = (j >= b0) & (j < b1)
    acc_w = tl.zeros([STRIP], ACC)
    acc_b = tl.zeros([STRIP], ACC)
    for m in range(m0, m1):
        row = c + C * m
        a0, lim = row_start(tl.cast(row, tl.int64), n, total, hi, A)
        rstd = tl.load(rstd_ptr + row)
        mean = 0.0 if RMS else tl.load(mean_ptr + row)
        c1 = tl.load(c1_ptr + row)
        c2 = 0.0 if RMS else tl.load(c2_ptr + row)
        live = inside & (j < lim)
        x = tl.load(x_ptr + a0 + j, mask=j < lim, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + a0 + j, mask=j < lim, other=0.0).to(tl.float32)
        xhat = tl.where(live, (x - mean) * rstd, 0.0)
        dy = tl.where(live, dy, 0.0)
        dx = (dy * w - (xhat * c1 + c2)) * rstd
        tl.store(dx_ptr + a0 + j, dx.to(dx_ptr.dtype.element_ty), mask=smask)
        acc_w += (dy * xhat).to(ACC)
        if HAS_DB:
            acc_b += dy.to(ACC)
        _dx_ends(x_ptr, dy_ptr, dx_ptr, a0, e0, e0m, w0, mean, rstd, c1, c2)
        _dx_ends(x_ptr, dy_ptr, dx_ptr, a0, e1, e1m, w1, mean, rstd, c1, c2)
    tl.store(dwp_ptr + q * L + j, acc_w, mask=j < hi)
    if HAS_DB:
        tl.store(dbp_ptr + q * L + j, acc_b, mask=j < hi)


@triton_support.jit
def _dw_kernel(dwp_ptr, dbp_ptr, x_ptr, dy_ptr, mean_ptr, rstd_ptr, dw_ptr, db_ptr, n_rows, n, L, G,
               BLOCK: tl.constexpr, A: tl.constexpr, C: tl.constexpr, RMS: tl.constexpr,
               HAS_DB: tl.constexpr, ACC: tl.constexpr):  # fmt: skip
    # dweight[k] = sum over the C * G partial rows of dwp[q, lo(q's class) + k], plus the
    # last row's columns past its lim (its partial chunk, which _dx_kernel left out)
    k = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    kmask = k < n
    acc_w = tl.zeros([BLOCK], ACC)
    acc_b = tl.zeros([BLOCK], ACC)
    for q in range(0, C * G):
        lo = ((q // G) * n) % A
        acc_w += tl.load(dwp_ptr + q * L + lo + k, mask=kmask, other=0.0).to(ACC)
        if HAS_DB:
            acc_b += tl.load(dbp_ptr + q * L + lo + k, mask=kmask, other=0.0).to(ACC)
    last = n_rows - 1
    total = tl.cast(n, tl.int64) * n_rows
    a0, lo, r1, hi, lim, b0, b1 = shifted_span(tl.cast(last, tl.int64) * n, n, total, A)
    tmask = kmask & (k + lo >= lim)  # the last row's columns past lim
    base = tl.cast(last, tl.int64) * n
    x = tl.load(x_ptr + base + k, mask=tmask, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + base + k, mask=tmask, other=0.0).to(tl.float32)
    rstd = tl.load(rstd_ptr + last)
    mean = 0.0 if RMS else tl.load(mean_ptr + last)
    acc_w += tl.where(tmask, dy * (x - mean) * rstd, 0.0).to(ACC)
    tl.store(dw_ptr + k, acc_w.to(tl.float32).to(dw_ptr.dtype.element_ty), mask=kmask)
    if HAS_DB:
        acc_b += tl.where(tmask, dy, 0.0).to(ACC)
        tl.store(db_ptr + k, acc_b.to(tl.float32).to(db_ptr.dtype.element_ty), mask=kmask)


# --------------------------------------------------------------------------- launchers


@triton_support.jit
def _shift_copy_kernel(v_ptr, u_ptr, vs_ptr, us_ptr, n, L, BLOCK: tl.constexpr, TWO: tl.constexpr):
    # grid (A, cdiv(L, BLOCK)): vs[s, j] = v[j - s] where 0 <= j - s < n, else 0 (and us of u)
    s = tl.program_id(0)
    j = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    k = j - s
    m = (k >= 0) & (k < n)
    jm = j < L
    tl.store(vs_ptr + s * L + j, tl.load(v_ptr + k, mask=m, other=0.0), mask=jm)
    if TWO:
        tl.store(us_ptr + s * L + j, tl.load(u_ptr + k, mask=m, other=0.0), mask=jm)


class WidePlan(NamedTuple):
    n_rows: int
    n: int
    a: int  # elements per 16 bytes
    c: int  # shift classes (1: every row on a 16-byte boundary; the weight is used as is)
    L: int  # a shifted copy's row (and a partial row): a multiple of 16 elements
    g: int  # programs per class
    first: triton_support.Bound  # _stats_kernel / _row_sums_kernel
    second: triton_support.Bound  # _out_kernel / _dx_kernel
    last: triton_support.Bound | None  # _dw_kernel
    copy: triton_support.Bound | None  # _shift_copy_kernel (c > 1)


_PLANS: dict = {}


def _classes(n: int, a: int) -> int:
    return a // math.gcd(n, a)


def _groups(n_rows: int, strips: int, c: int, waves: int, dev: torch.device) -> int:
    if dev.type != "cuda":
        return max(1, min(2, n_rows // c))
    sms = triton_support.sm_count(dev.index or 0)
    return max(1, min(-(-n_rows // c), -(-waves * sms // (strips * c))))


def _geometry(x, strip, waves):
    n_rows, n = x.shape
    a = 16 // x.element_size()
    c = _classes(n, a)
    L = -(-(n + a) // 16) * 16
    strips = -(-(n + a) // strip)
    return n_rows, n, a, c, L, strips, _groups(n_rows, strips, c, waves, x.device)


def _copy_bound(c, a, L, two):
    if c == 1:
        return None
    block = 1024
    return triton_support.Bound(_shift_copy_kernel, (a, triton_support.cdiv(L, block)),
                                dict(BLOCK=block, TWO=two, num_warps=4), (0, 1))  # fmt: skip


def _shifted(plan: WidePlan, v, u=None):
    """The weight (and bias) as A shifted copies [A, L] (copy s holds v at [s, s + n)), or
    v itself when every row starts on a 16-byte boundary. L is a multiple of 16 elements:
    Triton specializes such an int argument as divisible by 16, and so knows every copy
    (and the partial rows of _dx_kernel, L apart) starts on a 16-byte boundary."""
    if plan.copy is None:
        return v, u
    vs = torch.empty((plan.a, plan.L), dtype=v.dtype, device=v.device)
    us = torch.empty((plan.a, plan.L), dtype=u.dtype, device=u.device) if u is not None else None
    plan.copy(v, u if u is not None else v, vs, us if us is not None else vs, plan.n, plan.L)
    return vs, us


def _fwd_plan(x, has_bias, rms, strip, warps, waves, chunk, stats_warps) -> WidePlan:
    n_rows, n, a, c, L, strips, g = _geometry(x, strip, waves)
    # x and the weight and bias (c = 1) come from outside: checked for alignment on every call
    kw = dict(CHUNK=chunk, A=a, RMS=rms, num_warps=stats_warps)
    stats = triton_support.Bound(_stats_kernel, (n_rows,), kw, (0,))
    out = triton_support.Bound(_out_kernel, (strips, c * g),
                               dict(STRIP=strip, A=a, C=c, RMS=rms, HAS_BIAS=has_bias, num_warps=warps),
                               (0, 1, 2))  # fmt: skip
    return WidePlan(n_rows, n, a, c, L, g, stats, out, None, _copy_bound(c, a, L, has_bias))


def wide_fwd(x, w, b, eps, rms, *, strip, warps, waves, chunk=4096, stats_warps=8):
    """(y, mean, rstd) of x [R, n] contiguous (mean None for rms); R >= 1. strip, warps,
    waves: ``triton_kernels.Config``'s wide_fwd_strip, wide_warps, wide_waves."""
    key = ("f", x.shape, x.dtype, w.dtype, x.device, rms, b is None, strip, warps, waves, chunk, stats_warps)
    plan = triton_support.kept_plan(
        _PLANS, key if type(x) is torch.Tensor else None,
        lambda: _fwd_plan(x, b is not None, rms, strip, warps, waves, chunk, stats_warps),
    )  # fmt: skip
    ws, bs = _shifted(plan, w, b)
    y = torch.empty_like(x)
    mean = torch.empty(plan.n_rows, dtype=torch.float32, device=x.device)
    rstd = torch.empty_like(mean)
    plan.first(x, mean, rstd, plan.n_rows, plan.n, eps)
    plan.second(x, ws, bs if bs is not None else ws, mean, rstd, y, plan.n_rows, plan.n, plan.L, plan.g)
    return y, (None if rms else mean), rstd


def _bwd_plan(x, w, has_bias, rms, strip, warps, waves, chunk, sums_warps) -> WidePlan:
    n_rows, n, a, c, L, strips, g = _geometry(x, strip, waves)
    acc = tl.float64 if w.dtype == torch.float32 else tl.float32
    want_db = has_bias and not rms
    # dy, x, the weight (c = 1), mean and rstd come from outside: checked for alignment on every call
    kw = dict(CHUNK=chunk, A=a, RMS=rms, num_warps=sums_warps)
    sums = triton_support.Bound(_row_sums_kernel, (n_rows,), kw, (0, 1, 2, 3, 4))
    dx = triton_support.Bound(_dx_kernel, (strips, c * g),
                              dict(STRIP=strip, A=a, C=c, RMS=rms, HAS_DB=want_db, ACC=acc, num_warps=warps),
                              (0, 1, 2, 3, 4))  # fmt: skip
    block = 1024
    dw = triton_support.Bound(_dw_kernel, (triton_support.cdiv(n, block),),
                              dict(BLOCK=block, A=a, C=c, RMS=rms, HAS_DB=want_db, ACC=acc, num_warps=4),
                              (2, 3, 4, 5))  # fmt: skip
    return WidePlan(n_rows, n, a, c, L, g, sums, dx, dw, _copy_bound(c, a, L, False))


def wide_bwd(dy, x, w, mean, rstd, rms, has_bias, *, strip, warps, waves, chunk=4096, sums_warps=8):
    """(dx, dw, db) of the norm of x [R, n] (dy, x contiguous; R >= 1). strip, warps,
    waves: ``triton_kernels.Config``'s wide_bwd_strip, wide_warps, wide_waves."""
    key = ("b", x.shape, x.dtype, w.dtype, x.device, rms, has_bias, strip, warps, waves, chunk, sums_warps)
    plan = triton_support.kept_plan(
        _PLANS, key if type(x) is torch.Tensor else None,
        lambda: _bwd_plan(x, w, has_bias, rms, strip, warps, waves, chunk, sums_warps),
    )  # fmt: skip
    n_rows, n, L, g = plan.n_rows, plan.n, plan.L, plan.g
    ws, _ = _shifted(plan, w)
    c1 = torch.empty(n_rows, dtype=torch.float32, device=x.device)
    c2 = torch.empty_like(c1)
    m = mean if mean is not None else rstd
    plan.first(dy, x, ws, m, rstd, c1, c2, n_rows, n, L)
    part = torch.float64 if w.dtype == torch.float32 else torch.float32
    want_db = has_bias and not rms
    dwp = torch.empty((plan.c * g, L), dtype=part, device=x.device)
    dbp = torch.empty_like(dwp) if want_db else dwp
    dx = torch.empty_like(x)
    plan.second(dy, x, ws, m, rstd, c1, c2, dx, dwp, dbp, n_rows, n, L, g)
    dw = torch.empty_like(w)
    db = torch.empty_like(w) if want_db else None
    plan.last(dwp, dbp, x, dy, m, rstd, dw, db if db is not None else dw, n_rows, n, L, g)
    return dx, dw, db
