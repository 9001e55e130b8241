"""conv2d's forward, dgrad and wgrad timed apart, beside cuDNN's, on a GPU.

    PYTHONPATH=src python lab/gpu_conv_parts.py [--json F] [--dtypes bf16,fp32] [--parts ...]

parts:
  layout  per shape: cuDNN's forward, backward (all three gradients), dx alone, dw + db, on
          NCHW and channels_last tensors; ours: the forward, the dgrad kernel alone (the
          plan's tiles), the wgrad launch (dw and db) at dbias modes (WGRAD_DB: 2 fp32 a
          step, 0 by torch) and the whole backward, each with the tap kernels' operands
          as given (no suffix: PIXEL_RUNS off; _runs: on) and channels-innermost (_cl:
          TAPS_NHWC, the channels_last copies timed with the kernels); errors against float64 as a
          ratio to cuDNN's. (The split part it replaced: rows conv-parts-*.)
  dgrad   the dgrad and forward tap kernels at other tiles and stage counts (16-bit)
  wgrad   the bf16 tap wgrad at other tiles, dbias by torch and fp32 a step
  sums    the wgrad launch (dw and db: the kernel, then torch's sums of its fp64 split
          partials) at WGRAD_PROGRAMS_PER_SM 1-8 and each dbias mode, the default wgrad and
          backward, cuDNN's dw + db and backward beside; errors against float64 as a ratio to
          cuDNN's. Also MNIST's first layer (C 1, the GEMM wgrad).
  once    the forward and dgrad tap kernels once each at 32x64x56x56 (plan tiles), for ncu
Shapes: the table's conv2d layers with C >= 16 (padding 1, bias). do_bench medians (ms),
L2 flushed by do_bench, TF32 off.
"""

import argparse
import json

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from kernellab import triton_support
from kernellab.ops.conv2d import triton as kt

DEV = "cuda"
SHAPES = [(32, 64, 56, 56, 64), (64, 32, 14, 14, 64), (256, 32, 14, 14, 64), (1024, 32, 14, 14, 64)]
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
# (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages)
DGRAD_TILES = [(128, 64, 32, 8, 3), (128, 64, 32, 4, 3), (64, 64, 32, 4, 3), (256, 64, 32, 8, 3),
               (128, 32, 32, 4, 3), (128, 64, 64, 8, 3)]  # fmt: skip


def _inputs(n, c, h, w_, k, dtype, seed=1):
    g = torch.Generator(device=DEV).manual_seed(seed)
    x = torch.randn(n, c, h, w_, device=DEV, generator=g).to(dtype)
    w = (torch.randn(k, c, 3, 3, device=DEV, generator=g) / (3 * c**0.5)).to(dtype)
    b = torch.randn(k, device=DEV, generator=g).to(dtype)
    dy = torch.randn(n, k, h, w_, device=DEV, generator=g).to(dtype)
    return x, w, b, dy


def _ms(fn):
    return round(do_bench(fn), 5)


# wgrad tiles of the bf16 sweep: (BLOCK_M, BLOCK_N, BLOCK_K, warps[, stages])
WGRAD_TILES = [(64, 64, 64, 4), (64, 64, 32, 4), (64, 64, 128, 4), (128, 64, 64, 8), (64, 64, 64, 8),
               (64, 32, 64, 4), (64, 64, 64, 4, 4), (64, 64, 32, 4, 4), (64, 64, 128, 8, 3)]  # fmt: skip


def wgrad(out, dtypes):
    """bf16 tap wgrad (as TAPS_NHWC says: channels-innermost by default) at other tiles
    and stage counts, dbias by torch (0) and fp32 a step (2)."""
    plan0, db0 = kt.wgrad_plan, dict(kt.WGRAD_DB)
    for shape in SHAPES:
        x, w, b, dy = _inputs(*shape, torch.bfloat16)
        row = dict(part="wgrad", dtype="bf16", shape="x".join(map(str, shape)) + "x3x3")
        for t in WGRAD_TILES:
            if t[1] > 2 * shape[1]:
                continue
            cfg = dict(BLOCK_M=t[0], BLOCK_N=t[1], BLOCK_K=t[2], num_warps=t[3])
            if len(t) > 4:
                cfg["num_stages"] = t[4]
            kt.wgrad_plan = lambda *a, cfg=cfg: ("taps", cfg)
            for mode in (0, 2):
                kt.WGRAD_DB[torch.bfloat16] = mode
                name = "x".join(map(str, t)) + f"_db{mode}"
                try:
                    row["wgrad_" + name] = _ms(lambda: kt.triton_conv2d_bwd(dy, x, w, False, 1, 1, 1, 1))
                except Exception as e:  # noqa: BLE001
                    row["error_" + name] = str(e)[:200]
                finally:
                    kt.wgrad_plan = plan0
                    kt.WGRAD_DB.clear()
                    kt.WGRAD_DB.update(db0)
        out(row)


def _ratio(got, ref, base):
    return round(float((got.double() - ref).abs().max()) / max(base, 1e-30), 3)


def _dgrad(dy, x, w, cfg, stages=None, nhwc=None):
    """The tap dgrad kernel alone (the launcher's lines) at tiles cfg; nhwc (None: as
    TAPS_NHWC says): dy copied to channels_last (the copy timed with it), w tap-major."""
    nhwc = kt._nhwc("dgrad", x.dtype, x.shape[0] * x.shape[2] * x.shape[3]) if nhwc is None else nhwc
    n, c, h, wd = x.shape
    k = w.shape[0]
    dx = torch.empty_like(x)
    nhw = n * h * wd
    grid = (triton_support.cdiv(nhw, cfg["BLOCK_M"]) * triton_support.cdiv(c, cfg["BLOCK_N"]),)
    wt, ws = kt.tap_weight(w, False, nhwc)
    extra = {} if stages is None else {"num_stages": stages}
    cfg = {kk: v for kk, v in cfg.items() if kk != "ACC64"}
    acc64 = x.dtype == torch.float32

    cfg = dict(cfg, **kt.dgrad_runs(kt._channels_last(dy) if nhwc else dy, x, 1))

    def run():
        dy_t = kt._channels_last(dy) if nhwc else dy
        kt._conv_dgrad_taps_kernel[grid](
            dy_t, wt, dx, c, h, wd, k, h, wd, 3, 3, nhw, *dy_t.stride(), *dx.stride(), *ws, 1, 1, 1, 1,
            ACC64=acc64, **kt._consts(x), **cfg, **extra,
        )  # fmt: skip
        return dx

    return run


def _fwd(x, w, b, cfg, stages=None):
    n, c, h, wd = x.shape
    k = w.shape[0]
    y = torch.empty((n, k, h, wd), dtype=x.dtype, device=x.device)
    m = n * h * wd
    grid = (triton_support.cdiv(m, cfg["BLOCK_M"]) * triton_support.cdiv(k, cfg["BLOCK_N"]),)
    wt, ws = kt.tap_weight(w, True)
    extra = {} if stages is None else {"num_stages": stages}
    cfg = {kk: v for kk, v in cfg.items() if kk != "ACC64"}
    acc64 = x.dtype == torch.float32 and c * 9 > kt.TAPS_TWO_LEVEL_MAX_CRS

    def run():
        kt._conv_fwd_taps_kernel[grid](
            x, wt, b, y, c, h, wd, k, h, wd, 3, 3, m, *x.stride(), *ws, 1, 1, 1, 1,
            HAS_BIAS=True, ACC64=acc64, **kt._consts(x), **cfg, **extra,
        )  # fmt: skip

    return run


class _nhwc:
    """kt.TAPS_NHWC set for the given kernels and dtype inside the block, at every size;
    kt.PIXEL_RUNS on for every kernel or (runs=False) none."""

    def __init__(self, dtype, kernels, runs=True):
        self.dtype, self.kernels, self.runs = dtype, kernels, runs

    def __enter__(self):
        self.saved = dict(kt.TAPS_NHWC), dict(kt.PIXEL_RUNS)
        for kern in ("fwd", "dgrad", "wgrad"):
            kt.TAPS_NHWC.pop((kern, self.dtype), None)
            if kern in self.kernels:
                kt.TAPS_NHWC[(kern, self.dtype)] = 0  # (at every size)
        kt.PIXEL_RUNS.clear()
        if self.runs:
            kt.PIXEL_RUNS.update(kt.runs_everywhere())

    def __exit__(self, *exc):
        for table, saved in zip((kt.TAPS_NHWC, kt.PIXEL_RUNS), self.saved):
            table.clear()
            table.update(saved)


def layout(out, dtypes):
    """Each tap kernel reading its gathered operand as given (NCHW) or channels-innermost
    (TAPS_NHWC: channels_last copies, timed with the kernel), beside cuDNN on NCHW and
    channels_last tensors; errors against float64 as a ratio to cuDNN's."""
    db0 = dict(kt.WGRAD_DB)
    for dname in dtypes:
        dtype = DTYPES[dname]
        for shape in SHAPES:
            x, w, b, dy = _inputs(*shape, dtype)
            row = dict(part="layout", dtype=dname, shape="x".join(map(str, shape)) + "x3x3")
            k = shape[4]

            def cbwd(mask, dy=dy, x=x):
                return lambda: torch.ops.aten.convolution_backward(
                    dy, x, w, [k], [1, 1], [1, 1], [1, 1], False, [0, 0], 1, mask
                )

            xc, dyc = kt._channels_last(x), kt._channels_last(dy)
            row["cudnn_fwd"] = _ms(lambda: F.conv2d(x, w, b, padding=1))
            row["cudnn_bwd"] = _ms(cbwd([True, True, True]))
            row["cudnn_dx"] = _ms(cbwd([True, False, False]))
            row["cudnn_dw"] = _ms(cbwd([False, True, True]))
            row["cudnn_cl_fwd"] = _ms(lambda: F.conv2d(xc, w, b, padding=1))
            row["cudnn_cl_bwd"] = _ms(cbwd([True, True, True], dyc, xc))
            row["copy_x_cl"] = _ms(lambda: kt._channels_last(x))
            xr, wr, br = x.double().requires_grad_(), w.double().requires_grad_(), b.double().requires_grad_()
            ry = F.conv2d(xr, wr, br, padding=1)
            rdx, rdw, rdb = torch.autograd.grad(ry, (xr, wr, br), dy.double())
            cdx, cdw, cdb = cbwd([True, True, True])()
            e_y = float((F.conv2d(x, w, b, padding=1).double() - ry.detach()).abs().max())
            e = [float((g.double() - r).abs().max()) for g, r in ((cdx, rdx), (cdw, rdw), (cdb, rdb))]
            cfg = kt.dgrad_plan(shape[1], 3, 3, k, dtype, x.device)[1]
            for tag, nhwc, runs in (("", False, False), ("_runs", False, True), ("_cl", True, True)):
                with _nhwc(dtype, ("fwd", "dgrad", "wgrad") if nhwc else (), runs):
                    fwd = lambda: kt.triton_conv2d_fwd(x, w, b, 1, 1, 1, 1)  # noqa: E731
                    row["ours_fwd" + tag] = _ms(fwd)
                    row["y_err_ratio" + tag] = _ratio(fwd(), ry.detach(), e_y)
                    row["ours_dgrad" + tag] = _ms(_dgrad(dy, x, w, cfg, nhwc=nhwc))
                    row["dx_err_ratio" + tag] = _ratio(_dgrad(dy, x, w, cfg, nhwc=nhwc)(), rdx, e[0])
                    for mode in (0, 2):
                        name = f"db{mode}" + tag
                        try:
                            kt.WGRAD_DB[dtype] = mode
                            wgrad = lambda: kt.triton_conv2d_bwd(dy, x, w, False, 1, 1, 1, 1)  # noqa: E731
                            row["ours_wgrad_" + name] = _ms(wgrad)
                            _, dw, db = wgrad()
                            row["dw_err_ratio_" + name] = _ratio(dw, rdw, e[1])
                            row["db_err_ratio_" + name] = _ratio(db, rdb, e[2])
                        except Exception as ex:  # noqa: BLE001
                            row["error_" + name] = str(ex)[:200]
                        finally:
                            kt.WGRAD_DB.clear()
                            kt.WGRAD_DB.update(db0)
                    row["ours_bwd" + tag] = _ms(lambda: kt.triton_conv2d_bwd(dy, x, w, True, 1, 1, 1, 1))
            out(row)


SUMS_SHAPES = SHAPES[1:] + [(64, 1, 28, 28, 32), (1024, 1, 28, 28, 32)]


def sums(out, dtypes):
    """The wgrad launch at programs per SM 1-8 (at every size) and each dbias mode."""
    saved = (kt.WGRAD_PROGRAMS_PER_SM, kt.WGRAD_LARGE_NPQ, dict(kt.WGRAD_DB), dict(kt.WGRAD_DB_GEMM))
    for dname in dtypes:
        dtype = DTYPES[dname]
        for shape in SUMS_SHAPES:
            x, w, b, dy = _inputs(*shape, dtype)
            k = shape[4]
            row = dict(part="sums", dtype=dname, shape="x".join(map(str, shape)) + "x3x3")
            row["cudnn_dw"] = _ms(lambda: torch.ops.aten.convolution_backward(
                dy, x, w, [k], [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [False, True, True]))  # fmt: skip
            row["cudnn_bwd"] = _ms(lambda: torch.ops.aten.convolution_backward(
                dy, x, w, [k], [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, True, True]))  # fmt: skip
            _, cdw, cdb = torch.ops.aten.convolution_backward(
                dy, x, w, [k], [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [False, True, True])  # fmt: skip
            xr, wr, br = x.double(), w.double().requires_grad_(), b.double().requires_grad_()
            rdw, rdb = torch.autograd.grad(F.conv2d(xr, wr, br, padding=1), (wr, br), dy.double())
            e_w, e_b = float((cdw.double() - rdw).abs().max()), float((cdb.double() - rdb).abs().max())
            kind = kt.wgrad_plan(shape[1], 3, 3, k, dtype, x.device)[0]
            table = kt.WGRAD_DB_GEMM if kind == "gemm" else kt.WGRAD_DB
            row["default_wgrad"] = _ms(lambda: kt.triton_conv2d_bwd(dy, x, w, False, 1, 1, 1, 1))
            row["default_bwd"] = _ms(lambda: kt.triton_conv2d_bwd(dy, x, w, True, 1, 1, 1, 1))
            try:
                kt.WGRAD_LARGE_NPQ = 2**62  # (WGRAD_PROGRAMS_PER_SM at every size)
                for pps in (1, 2, 4, 8):
                    kt.WGRAD_PROGRAMS_PER_SM = pps
                    for mode in (0, 1, 2):
                        table[dtype] = mode
                        name = f"pps{pps}_db{mode}"
                        try:
                            run = lambda: kt.triton_conv2d_bwd(dy, x, w, False, 1, 1, 1, 1)  # noqa: E731
                            row["wgrad_" + name] = _ms(run)
                            _, dw, db = run()
                            row["dw_err_" + name] = _ratio(dw, rdw, e_w)
                            row["db_err_" + name] = _ratio(db, rdb, e_b)
                        except Exception as ex:  # noqa: BLE001
                            row["error_" + name] = str(ex)[:200]
            finally:
                kt.WGRAD_PROGRAMS_PER_SM, kt.WGRAD_LARGE_NPQ = saved[:2]
                for t, v in zip((kt.WGRAD_DB, kt.WGRAD_DB_GEMM), saved[2:]):
                    t.clear()
                    t.update(v)
            out(row)


def dgrad(out, dtypes):
    for dname in dtypes:
        dtype = DTYPES[dname]
        if dtype == torch.float32:
            continue
        for shape in SHAPES:
            x, w, b, dy = _inputs(*shape, dtype)
            row = dict(part="dgrad", dtype=dname, shape="x".join(map(str, shape)) + "x3x3")
            for t in DGRAD_TILES:
                cfg = dict(BLOCK_M=t[0], BLOCK_N=t[1], BLOCK_K=t[2], num_warps=t[3])
                name = "x".join(map(str, t))
                try:
                    row["dgrad_" + name] = _ms(_dgrad(dy, x, w, cfg, t[4]))
                    row["fwd_" + name] = _ms(_fwd(x, w, b, cfg, t[4]))
                except Exception as e:  # noqa: BLE001
                    row["error_" + name] = str(e)[:200]
            out(row)


def once(dtypes):
    dtype = DTYPES[dtypes[0]]
    x, w, b, dy = _inputs(*SHAPES[0], dtype)
    c, k = SHAPES[0][1], SHAPES[0][4]
    _fwd(x, w, b, kt.fwd_plan(c, 3, 3, k, dtype, x.device)[1])()
    _dgrad(dy, x, w, kt.dgrad_plan(c, 3, 3, k, dtype, x.device)[1])()
    torch.cuda.synchronize()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--dtypes", default="bf16,fp32")
    ap.add_argument("--parts", default="layout,dgrad")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    def out(row):
        print(json.dumps(row, default=str), flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(row, default=str) + "\n")

    dtypes = args.dtypes.split(",")
    if "dgrad" in args.parts:
        dgrad(out, dtypes)
    if "wgrad" in args.parts:
        wgrad(out, dtypes)
    if "layout" in args.parts:
        layout(out, dtypes)
    if "sums" in args.parts:
        sums(out, dtypes)
    if "once" in args.parts:
        once(dtypes)


if __name__ == "__main__":
    main()
