"""The fp32 softmax backward of whole rows at odd widths (4096x4097, 4099x1025: 0.93x Liger's
forward+backward in the H200 table): what the compensated row dot (Dot2, ``COMP``) and the warp
count cost against Liger's plain fp32 dot, backward alone:

    python lab/probe_softmax_bwd_dot.py [--out FILE.jsonl] [--shapes 4096x4097,4099x1025,...]

Per shape: kernellab's Triton backward as the default launches it (``softmax.triton._bwd``),
and a lab copy of its one-block-a-row kernel with the row dot as Dot2 (the default's), as an
fp64 sum, or as a plain fp32 sum (Liger's arithmetic: a bound, not a candidate: it misses the
check's bound where one y is near 1), each at 8, 16 and 32 warps; then Liger's backward
kernel where liger-kernel is installed. Each variant's largest |dx| error against an fp64
backward is in its row ("err"), and on hostile rows (one y near 1, where a plain fp32 dot
cancels against dy) "err_peak" beside the check's bound there (2x PyTorch's error plus one
ulp of the largest |dx|, "bound_peak"). Variants 3-4 sum the dot in fp64 and keep it as the
pair hi + lo of the default's dx: "fp64pair" (products exact in fp64: two conversions an
element), "fp64p" (fp32 products converted, their fma errors summed in fp32: one). The
streamed two-pass form of each ("loop-*", 8192 columns a step) is timed at rows wider than
8192."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from profiled import emit_row, measure  # noqa: E402

from kernellab import triton_support  # noqa: E402
from kernellab.harness.bench import git_sha  # noqa: E402
from kernellab.ops.softmax import triton as st  # noqa: E402


@triton_support.jit
def _fp64_sum(y, dy, DOT: tl.constexpr):
    # the row dot in fp64 (s) and the fp32 sum of its terms' rounding errors (e): DOT 3 the
    # products exact in fp64 (e = 0), DOT 4 the fp32 products converted, their fma errors in e
    if DOT == 3:
        return tl.sum(y.to(tl.float64) * dy.to(tl.float64), axis=0), 0.0
    p, ep = st._dot2_terms(y, dy)
    return tl.sum(p.to(tl.float64), axis=0), tl.sum(ep, axis=0)


@triton_support.jit
def _row_bwd(y_ptr, dy_ptr, dx_ptr, n_cols, BLOCK: tl.constexpr, DOT: tl.constexpr):
    # one row a program; DOT 0: Dot2 pairs (the default's arithmetic), 1: fp64 sum, 2: fp32 sum
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    offs = row * n_cols + cols
    y = tl.load(y_ptr + offs, mask=mask, other=0.0)
    dy = tl.load(dy_ptr + offs, mask=mask, other=0.0)
    if DOT == 0:
        p, ep = st._dot2_terms(y, dy)
        hi, lo = st._dot2_reduce(p, ep, 0)
        dx = st._dot2_dx(y, dy, hi, lo)
    elif DOT == 3 or DOT == 4:
        s, e = _fp64_sum(y, dy, DOT)
        hi, lo = st._dot64_pair(s, e)
        dx = st._dot2_dx(y, dy, hi, lo)
    elif DOT == 1:
        s = tl.sum(y.to(tl.float64) * dy.to(tl.float64), axis=0)
        dx = (y.to(tl.float64) * (dy.to(tl.float64) - s)).to(tl.float32)
    else:
        dx = y * (dy - tl.sum(y * dy, axis=0))
    tl.store(dx_ptr + offs, dx, mask=mask)


@triton_support.jit
def _row_bwd_loop(y_ptr, dy_ptr, dx_ptr, n_cols, BLOCK: tl.constexpr, DOT: tl.constexpr):
    # one row a program in BLOCK-column steps, two passes; DOT as _row_bwd (0, 2, 3, 4)
    base = tl.program_id(0).to(tl.int64) * n_cols
    cols = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    acc_lo = tl.zeros([BLOCK], tl.float32)
    acc64 = tl.zeros([BLOCK], tl.float64)
    for start in range(0, n_cols, BLOCK):
        mask = start + cols < n_cols
        y = tl.load(y_ptr + base + start + cols, mask=mask, other=0.0, eviction_policy="evict_last")
        dy = tl.load(dy_ptr + base + start + cols, mask=mask, other=0.0, eviction_policy="evict_last")
        if DOT == 0:
            p, ep = st._dot2_terms(y, dy)
            acc, e = st._two_sum(acc, p)
            acc_lo += ep + e
        elif DOT == 3:
            acc64 += y.to(tl.float64) * dy.to(tl.float64)
        elif DOT == 4:
            p, ep = st._dot2_terms(y, dy)
            acc64 += p.to(tl.float64)
            acc_lo += ep
        else:
            acc += y * dy
    if DOT == 0:
        hi, lo = st._dot2_reduce(acc, acc_lo, 0)
    elif DOT == 2:
        hi = tl.sum(acc, axis=0)
        lo = 0.0
    else:
        s = tl.sum(acc64, axis=0)
        hi = s.to(tl.float32)
        lo = (s - hi.to(tl.float64)).to(tl.float32) + tl.sum(acc_lo, axis=0)
        lo = tl.where(tl.abs(hi) <= 3.4028234663852886e38, lo, 0.0)
    for start in range(0, n_cols, BLOCK):
        mask = start + cols < n_cols
        y = tl.load(y_ptr + base + start + cols, mask=mask, other=0.0, eviction_policy="evict_first")
        dy = tl.load(dy_ptr + base + start + cols, mask=mask, other=0.0, eviction_policy="evict_first")
        tl.store(dx_ptr + base + start + cols, st._dot2_dx(y, dy, hi, lo), mask=mask)


@triton_support.jit
def _row_bwd_shifted(y_ptr, dy_ptr, dx_ptr, n_rows, n_cols, BLOCK: tl.constexpr, DOT: tl.constexpr):
    # an fp32 row off 16-byte boundaries read as its aligned chunks (the library's
    # _bwd_row_whole_shifted, there 16-bit only), the dot by DOT 3 or 4 (fp64), or 2 (fp32)
    n64 = n_cols.to(tl.int64)
    cols = tl.arange(0, BLOCK)
    a0, lo, r1, hi, lim, b0, b1 = st.shifted_span(
        tl.program_id(0).to(tl.int64) * n64, n_cols, n64 * n_rows, 4
    )
    yp = y_ptr + a0
    dyp = dy_ptr + a0
    dxp = dx_ptr + a0
    inside = (cols >= lo) & (cols < r1)
    y = tl.where(inside, tl.load(yp + cols, mask=cols < lim, other=0.0), 0.0)
    dy = tl.where(inside, tl.load(dyp + cols, mask=cols < lim, other=0.0), 0.0)
    ty, tdy = st._tail_chunk(yp, lim, lo, r1, 4, 0.0), st._tail_chunk(dyp, lim, lo, r1, 4, 0.0)
    if DOT == 2:
        hi_ = tl.sum(y * dy, axis=0) + tl.sum(ty * tdy, axis=0)
        lo_ = 0.0
    else:
        s, e = _fp64_sum(y, dy, DOT)
        hi_, lo_ = st._dot64_pair(s + tl.sum(ty.to(tl.float64) * tdy.to(tl.float64), axis=0), e)
    tl.store(dxp + cols, st._dot2_dx(y, dy, hi_, lo_), mask=(cols >= b0) & (cols < b1))
    st._bwd_write_ends(yp, dyp, dxp, lo, r1, b0, b1, hi_, lo_, 4, True)


def _dot2_bwd(dy, y, cfg):
    # the library's backward with its fp32 dot as Dot2 pairs in whole rows (COMP 1; streamed
    # rows keep the fp64 sum, the only form their kernel has)
    comp = st._comp
    def dot2(dtype, single, *args, **kw):
        c = comp(dtype, single, *args, **kw)
        return min(c, 1) if single else c

    st._comp = dot2
    try:
        return st._bwd(dy, y, cfg)
    finally:
        st._comp = comp


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--shapes", default="4096x4097,4099x1025,4096x4096,8192x1024")
    ap.add_argument("--defaults", action="store_true",
                    help="only the default backward, its Dot2 form (COMP 1 and, at 1024-wide "
                    "blocks, 4 rows a program as before (at)) and Liger")  # fmt: skip
    a = ap.parse_args()
    try:
        from liger_kernel.ops import softmax as liger
    except ImportError:
        liger = None
    for shape in a.shapes.split(","):
        n_rows, n_cols = (int(s) for s in shape.split("x"))
        gen = torch.Generator("cuda").manual_seed(0)
        x = torch.randn(n_rows, n_cols, device="cuda", generator=gen) * 4
        y = torch.softmax(x, -1)
        dy = torch.randn(n_rows, n_cols, device="cuda", generator=gen)
        y64, dy64 = y.double(), dy.double()
        ref = y64 * (dy64 - (y64 * dy64).sum(-1, keepdim=True))
        # hostile rows: one y near 1 a row, so that dot ~ dy there and dx cancels
        xp = x.clone()
        xp[:, n_cols // 3] += 40.0
        yp = torch.softmax(xp, -1)
        yp64 = yp.double()
        refp = yp64 * (dy64 - (yp64 * dy64).sum(-1, keepdim=True))
        torch_err = float(
            (torch._softmax_backward_data(dy, yp, -1, torch.float32).double() - refp).abs().max()
        )
        bound_peak = 2 * torch_err + torch.finfo(torch.float32).eps * float(refp.abs().max())
        block = triton.next_power_of_2(n_cols)
        base = dict(gpu=torch.cuda.get_device_name(), git_sha=git_sha(), shape=shape, dtype="fp32",
                    block=block)  # fmt: skip

        def err(dx):
            return float((dx.double() - ref).abs().max())

        cases = [("default", None, lambda yy=y: st._bwd(dy, yy))]
        if a.defaults:
            old = st.Config(rows=4) if block == 1024 else st.CONFIG
            cases.append(("default-dot2", None, lambda yy=y, c=old: _dot2_bwd(dy, yy, c)))
        names = ((0, "dot2"), (1, "fp64"), (2, "fp32"), (3, "fp64pair"), (4, "fp64p"))
        for dot, name in names if block <= 32768 and not a.defaults else ():
            for warps in (8, 16, 32) if block <= 8192 else (32,):
                out = torch.empty_like(y)

                def run(dot=dot, warps=warps, out=out, yy=y):
                    _row_bwd[(n_rows,)](yy, dy, out, n_cols, BLOCK=block, DOT=dot, num_warps=warps)
                    return out

                cases.append((f"lab-{name}", warps, run))
        span = -(-(3 + n_cols) // 4) * 4
        for dot, name in names if n_cols % 4 and span <= block and block <= 8192 and not a.defaults else ():
            if dot in (0, 1):
                continue
            for warps in (8, 16, 32):
                out = torch.empty_like(y)

                def run(dot=dot, warps=warps, out=out, yy=y):
                    _row_bwd_shifted[(n_rows,)](
                        yy, dy, out, n_rows, n_cols, BLOCK=block, DOT=dot, num_warps=warps
                    )
                    return out

                cases.append((f"shifted-{name}", warps, run))
        for dot, name in names if n_cols > 8192 and not a.defaults else ():
            if dot == 1:
                continue
            for warps in (8, 16, 32):
                out = torch.empty_like(y)

                def run(dot=dot, warps=warps, out=out, yy=y):
                    _row_bwd_loop[(n_rows,)](yy, dy, out, n_cols, BLOCK=8192, DOT=dot, num_warps=warps)
                    return out

                cases.append((f"loop-{name}", warps, run))
        if liger is not None and n_cols <= 65536:  # (calculate_settings refuses wider rows)
            bs, warps = liger.calculate_settings(n_cols)
            cases.append(("liger", warps, lambda b=bs, w=warps: liger._softmax_backward(dy, y, b, w, False)))
        for name, warps, fn in cases:
            row = dict(base, variant=name, warps=warps)
            try:
                row["err"] = err(fn())
                ya = y.clone()  # every call reads this y: the hostile rows put in its place
                y.copy_(yp)
                row["err_peak"] = float((fn().double() - refp).abs().max())
                row["bound_peak"] = bound_peak
                y.copy_(ya)
            except Exception as e:  # noqa: BLE001 (a variant that fails is a row's note)
                row["error"] = f"{type(e).__name__}: {e}"[:300]
                emit_row(row, a.out)
                continue
            measure(row, fn, top=2)
            emit_row(row, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
