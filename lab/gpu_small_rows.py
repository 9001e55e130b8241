"""Short-row norms and softmax at model-family shapes where Liger's kernels beat ours (H200
table: layer_norm fp32 1024x768 forward 0.84x, softmax fp32 128x1024 fwd+bwd 0.86x, ...).

    python lab/gpu_small_rows.py [--out DIR] [--budget 0.15] [--ops softmax --softmax-shapes 4096x4097
                                 --dtypes fp32 --rows 1 --warps 8,16,32]
    python lab/gpu_small_rows.py --ops layer_norm,rms_norm,add_rms_norm --norm-shapes 4099x1025
                                 --rows 1,2 --warps 4,8 --w-first 0,1e9 [--shift 1024,0
                                 --shift-per-sm 4,8] --no-bwd [--rounds 2]

Our row kernels pack several short rows into a program (~4096 elements; softmax ~1024 at
rows of 256 or fewer), so at 64-1024 rows they launch 16-256 programs where Liger launches
one per row. Here, per (op, shape, dtype), device time (harness.timer.time_cuda, L2
flushed) of:
- the peers' forward and forward+backward (torch, liger) through autograd;
- our Triton forward over ROWS x num_warps (norms also x where the weight loads,
  --w-first, and with --shift the shifted forward's threshold x programs per SM x
  warps), and our backward (norms: the one-launch
  small backward over strip x step x warps, and the partials path; softmax: ROWS x warps),
  each kernel alone, checked against float64.
Rows go to DIR/small_rows.jsonl; the best config of each kernel is printed beside the
default's time and the best peer's.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from kernellab.harness.timer import time_cuda  # noqa: E402
from kernellab.ops.norm_kernels import triton_kernels as nk  # noqa: E402
from kernellab.ops.softmax import triton as sm  # noqa: E402

NORM_SHAPES = [(64, 256), (128, 768), (1024, 768)]
SOFTMAX_SHAPES = [(64, 256), (128, 1024)]
DTYPES = [torch.float32, torch.bfloat16]
ROWS = (1, 2, 4)
WARPS = (1, 2, 4, 8)
# the one-launch backward's (strip, elements a step, warps); the partials path beside them
SMALL_BWD = [(16, 16384, 8), (32, 16384, 8), (32, 16384, 16), (64, 16384, 8), (32, 4096, 4)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/small_rows")
    ap.add_argument("--budget", type=float, default=0.15)
    ap.add_argument("--ops", default="layer_norm,rms_norm,softmax")
    ap.add_argument("--norm-shapes", nargs="+", default=None, metavar="RxC")
    ap.add_argument("--softmax-shapes", nargs="+", default=None, metavar="RxC")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--rows", default=None, help="ROWS values, comma-separated (default: 1,2,4)")
    ap.add_argument("--warps", default=None, help="num_warps values, comma-separated (default: 1,2,4,8)")
    ap.add_argument("--w-first", default="0", help="norms: fwd_w_first_per_sm values (0: weight after the "
                    "reductions; 1e9: always first), comma-separated")
    ap.add_argument("--shift", default=None, help="norms: shift_fwd_min_cols values, comma-separated (also "
                    "swept with rows, warps and --w-first)")
    ap.add_argument("--shift-per-sm", default="4", help="norms: shift_fwd_per_sm values (with --shift)")
    ap.add_argument("--no-bwd", action="store_true", help="norms: time the forward configs only")
    ap.add_argument("--rounds", type=int, default=1, help="repeat every measurement this many times, "
                    "each row carrying its round (a config's gain counts where every round shows it)")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows_out = open(out / "small_rows.jsonl", "w")
    t0 = time.perf_counter()

    def t(fn):
        return time_cuda(fn, budget_s=a.budget, min_time_s=0.03, warmup_s=0.03).median_ms * 1e3  # us

    rnd = [0]

    def emit(**r):
        rows_out.write(json.dumps({**r, "round": rnd[0]}) + "\n")
        rows_out.flush()

    from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction
    from liger_kernel.ops.layer_norm import LigerLayerNormFunction
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    from liger_kernel.ops.softmax import LigerSoftmaxFunction

    def shapes_of(arg, default):
        return [tuple(int(v) for v in s.split("x")) for s in arg] if arg else default

    names = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    dtypes = [names[d] for d in a.dtypes.split(",")]
    rows_set = tuple(int(v) for v in a.rows.split(",")) if a.rows else ROWS
    warps_set = tuple(int(v) for v in a.warps.split(",")) if a.warps else WARPS
    for rnd[0] in range(a.rounds):
        for op in a.ops.split(","):
            if op == "softmax":
                shapes = shapes_of(a.softmax_shapes, SOFTMAX_SHAPES)
            else:
                shapes = shapes_of(a.norm_shapes, NORM_SHAPES)
            for (n, d), dt in itertools.product(shapes, dtypes):
                g = torch.Generator(device="cuda").manual_seed(0)
                x = torch.randn(n, d, device="cuda", generator=g).to(dt)
                w = (1 + 0.1 * torch.randn(d, device="cuda", generator=g)).to(dt)
                b = (0.1 * torch.randn(d, device="cuda", generator=g)).to(dt)
                dy = torch.randn(n, d, device="cuda", generator=g).to(dt)
                rms = op in ("rms_norm", "add_rms_norm")
                res = torch.randn(n, d, device="cuda", generator=g).to(dt) if op == "add_rms_norm" else None
                name = f"{op} {n}x{d} {str(dt)[6:]}"
                peers = {}
                if op == "softmax":
                    peers["torch"] = lambda z: torch.softmax(z, -1)
                    peers["liger"] = lambda z: LigerSoftmaxFunction.apply(z)
                    ref = torch.softmax(x.double(), -1)
                elif res is not None:
                    peers["liger"] = lambda z: LigerFusedAddRMSNormFunction.apply(
                        z, res, w, 1e-6, 0.0, "gemma", False)[0]  # fmt: skip
                    ref = F.rms_norm((x.double() + res.double()).to(dt).double(), (d,), w.double(), 1e-6)
                elif rms:
                    peers["torch"] = lambda z: F.rms_norm(z, (d,), w, 1e-6)
                    peers["liger"] = lambda z: LigerRMSNormFunction.apply(z, w, 1e-6, 0.0, "gemma", False)
                    ref = F.rms_norm(x.double(), (d,), w.double(), 1e-6)
                else:
                    peers["torch"] = lambda z: F.layer_norm(z, (d,), w, b, 1e-5)
                    peers["liger"] = lambda z: LigerLayerNormFunction.apply(z, w, b, 1e-5)
                    ref = F.layer_norm(x.double(), (d,), w.double(), b.double(), 1e-5)
                best_peer = {}
                for pname, fn in peers.items():
                    xr = x.clone().requires_grad_(True)
                    fwd = t(lambda: fn(x))

                    def fb():
                        xr.grad = None
                        fn(xr).backward(dy)

                    fwdbwd = t(fb)
                    emit(case=name, kind="peer", name=pname, fwd_us=fwd, fwdbwd_us=fwdbwd)
                    best_peer[pname] = (fwd, fwdbwd)
                tol = 2e-2 if dt != torch.float32 else 1e-4

                def ok(y):
                    return (y.double() - ref).abs().max().item() <= tol * max(1.0, ref.abs().max().item())

                fwd_times, bwd_times = {}, {}
                if op == "softmax":
                    for r, wp in itertools.product(rows_set, warps_set):
                        cfg = replace(sm.CONFIG, rows=r, warps=wp)
                        y = sm._fwd(x, cfg)
                        fwd_times[(r, wp)] = (t(lambda: sm._fwd(x, cfg)), ok(y))
                        bwd_times[(r, wp)] = (t(lambda: sm._bwd(dy, y, cfg)), True)
                    dflt_f = t(lambda: sm._fwd(x))
                    y = sm._fwd(x)
                    dflt_b = t(lambda: sm._bwd(dy, y))
                else:
                    bb = None if rms else b
                    eps = 1e-6 if rms else 1e-5
                    kw = dict(res=res, h=torch.empty_like(x) if res is not None else None)

                    def fwd(cfg=nk.CONFIG):
                        return nk.norm_fwd(x, w, bb, eps, rms, cfg=cfg, **kw)

                    wf_set = [float(v) for v in a.w_first.split(",")]
                    sc_set = [int(v) for v in a.shift.split(",")] if a.shift else [nk.CONFIG.shift_fwd_min_cols]
                    for r, wp, wf, sc in itertools.product(rows_set, warps_set, wf_set, sc_set):
                        cfg = replace(nk.CONFIG, row_elems=r * nk._row_block(d), fwd_warps=wp, fwd_row_1d=False,
                                      fwd_w_first_per_sm=wf, fwd_min_per_sm=0, shift_fwd_min_cols=sc)  # fmt: skip
                        y = nk.norm_fwd(x, w, bb, eps, rms, cfg=cfg, **kw)[0]
                        fwd_times[(r, wp, wf) if len(sc_set) == 1 else (r, wp, wf, sc)] = (t(lambda: fwd(cfg)), ok(y))
                    if dt != torch.float32:
                        for wp in warps_set:
                            cfg = replace(nk.CONFIG, fwd_row_1d=True, row_elems=nk._row_block(d), fwd_warps=wp)
                            y = nk.norm_fwd(x, w, bb, eps, rms, cfg=cfg, **kw)[0]
                            fwd_times[("row1d", wp)] = (t(lambda: fwd(cfg)), ok(y))
                    shifts = [int(v) for v in a.shift.split(",")] if a.shift else []
                    shift_grid = itertools.product(shifts, [int(v) for v in a.shift_per_sm.split(",")], warps_set)
                    for sc, ps, wp in shift_grid:
                        cfg = replace(nk.CONFIG, shift_fwd_min_cols=sc, shift_fwd_per_sm=ps, shift_fwd_warps=wp)
                        y = nk.norm_fwd(x, w, bb, eps, rms, cfg=cfg, **kw)[0]
                        fwd_times[("shift", sc, ps, wp)] = (t(lambda: fwd(cfg)), ok(y))
                    dflt_f = t(lambda: nk.norm_fwd(x, w, bb, eps, rms, **kw))
                    fwd_times[("default",)] = (dflt_f, ok(nk.norm_fwd(x, w, bb, eps, rms, **kw)[0]))
                    _, mean, rstd = nk.norm_fwd(x, w, bb, eps, rms, **kw)
                    for strip, step, wp in [] if a.no_bwd else SMALL_BWD:
                        big = 1 << 20
                        cfg = replace(nk.CONFIG, small_strip=strip, small_step_elems=step, small_warps=wp,
                                      small_fp32_elems=big, small_fp32_rows=big, bwd_small_elems=big)
                        bwd_times[("small", strip, step, wp)] = (
                            t(lambda: nk.norm_bwd(dy, x, w, mean, rstd, rms, not rms, cfg=cfg)), True)  # fmt: skip
                    cfg = replace(nk.CONFIG, bwd_small_elems=0)
                    if not a.no_bwd:
                        bwd_times[("partials",)] = (
                            t(lambda: nk.norm_bwd(dy, x, w, mean, rstd, rms, not rms, cfg=cfg)), True)  # fmt: skip
                    dflt_b = 0.0 if a.no_bwd else t(lambda: nk.norm_bwd(dy, x, w, mean, rstd, rms, not rms))
                for k, (us, good) in fwd_times.items():
                    emit(case=name, kind="fwd", config=list(k), us=us, ok=good)
                for k, (us, good) in bwd_times.items():
                    emit(case=name, kind="bwd", config=list(k), us=us, ok=good)
                emit(case=name, kind="default", fwd_us=dflt_f, bwd_us=dflt_b)
                bf = min(((v[0], k) for k, v in fwd_times.items() if v[1]), key=lambda r: r[0])
                bb_ = min(((v[0], k) for k, v in bwd_times.items()), key=lambda r: r[0], default=(0.0, ()))
                lf = min(v[0] for v in best_peer.values())
                lfb = min(v[1] for v in best_peer.values())
                print(f"{name:28s} fwd: default {dflt_f:5.2f} best {bf[0]:5.2f} {bf[1]} peers {lf:5.2f} | "
                      f"bwd: default {dflt_b:5.2f} best {bb_[0]:5.2f} {bb_[1]} | fwd+bwd peers {lfb:5.2f} "
                      f"{ {k: round(v[1], 2) for k, v in best_peer.items()} }", flush=True)  # fmt: skip
    print(f"{time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
