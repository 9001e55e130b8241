"""Sweep the Triton layer_norm / rms_norm backward's knobs on a GPU (issue 3).

    python scripts/tune_norm_bwd.py [--out DIR] [--shape 16384x4096] [--dtype bf16]

Times the backward launcher alone (``norm_bwd``: the kernel plus the reduction of the
dweight/dbias partials) with ``triton.testing.do_bench`` (L2 flushed between calls,
median) for every combination of
    BWD_PREFETCH   (load row i + 1 before row i's reductions),
    BWD_PAIR_SUM   (layer_norm: both row sums in one tl.reduce),
    BWD_PROGRAMS_PER_SM (2, 4, 8) and BWD_WARPS (4, 8, 16),
then torch.compile's backward of the same op for reference (fwd+bwd minus fwd, both by
do_bench), and the bytes floor (read x, dy; write dx) at the measured copy rate. Each
configuration's dx / dweight are compared with the default's (identical math, so they
must agree to a few ulp). Rows -> DIR/tune_norm_bwd.jsonl; the table is printed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402
import triton  # noqa: E402

import kernellab.ops.layer_norm.triton as lt  # noqa: E402


def _copy_gbps() -> float:
    x = torch.empty(2**28, device="cuda")
    y = torch.empty_like(x)
    ms = triton.testing.do_bench(lambda: y.copy_(x), warmup=50, rep=300)
    return 2 * x.numel() * 4 / ms / 1e6


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--shape", default="16384x4096")
    ap.add_argument("--dtype", default="bf16")
    args = ap.parse_args()
    n, d = (int(s) for s in args.shape.split("x"))
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(n, d, device="cuda", generator=gen).to(dtype)
    dy = torch.randn(n, d, device="cuda", generator=gen).to(dtype)
    w = (1 + 0.1 * torch.randn(d, device="cuda", generator=gen)).to(dtype)
    b = (0.1 * torch.randn(d, device="cuda", generator=gen)).to(dtype)
    copy = _copy_gbps()
    floor_ms = 3 * x.numel() * x.element_size() / copy / 1e6
    print(f"copy {copy:.0f} GB/s; bytes floor of the backward (read x, dy; write dx): {floor_ms:.4f} ms", flush=True)
    rows = []
    knobs0 = (lt.BWD_PREFETCH, lt.BWD_PAIR_SUM, lt.BWD_PROGRAMS_PER_SM, lt.BWD_WARPS)
    for rms in (False, True):
        op = "rms_norm" if rms else "layer_norm"
        _, mean, rstd = lt.norm_fwd(x, w, None if rms else b, 1e-5, rms)
        ref = lt.norm_bwd(dy, x, w, mean, rstd, rms, not rms)
        pairs = (False,) if rms else (False, True)
        for pre, pair, per_sm, warps in itertools.product((False, True), pairs, (2, 4, 8), (4, 8, 16)):
            lt.BWD_PREFETCH, lt.BWD_PAIR_SUM, lt.BWD_PROGRAMS_PER_SM, lt.BWD_WARPS = pre, pair, per_sm, warps
            try:
                got = lt.norm_bwd(dy, x, w, mean, rstd, rms, not rms)
                diff = max(float((g.float() - r.float()).abs().max()) for g, r in zip(got, ref) if g is not None)
                ms = triton.testing.do_bench(lambda: lt.norm_bwd(dy, x, w, mean, rstd, rms, not rms), warmup=25, rep=200)
                row = dict(op=op, prefetch=pre, pair_sum=pair, per_sm=per_sm, warps=warps, ms=ms, max_diff=diff)
            except Exception as e:  # noqa: BLE001
                row = dict(op=op, prefetch=pre, pair_sum=pair, per_sm=per_sm, warps=warps, error=f"{type(e).__name__}: {e}"[:200])
            rows.append(row)
            print(json.dumps(row), flush=True)
        lt.BWD_PREFETCH, lt.BWD_PAIR_SUM, lt.BWD_PROGRAMS_PER_SM, lt.BWD_WARPS = knobs0
        # torch.compile of the same math: fwd+bwd minus fwd.
        xr = x.detach().clone().requires_grad_()
        wr = w.detach().clone().requires_grad_()
        br = b.detach().clone().requires_grad_()
        if rms:
            f = torch.compile(lambda x_, w_: torch.nn.functional.rms_norm(x_, (d,), w_, 1e-5), dynamic=False)
            fargs = (xr, wr)
        else:
            f = torch.compile(lambda x_, w_, b_: torch.nn.functional.layer_norm(x_, (d,), w_, b_, 1e-5), dynamic=False)
            fargs = (xr, wr, br)
        t_f = triton.testing.do_bench(lambda: f(*fargs), warmup=25, rep=200)
        t_fb = triton.testing.do_bench(lambda: f(*fargs).backward(dy), warmup=25, rep=200, grad_to_none=list(fargs))
        row = dict(op=op, backend="compile", fwd_ms=t_f, fwdbwd_ms=t_fb, bwd_ms=t_fb - t_f)
        rows.append(row)
        print(json.dumps(row), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "tune_norm_bwd.jsonl", "w") as fh:
        for r in rows:
            fh.write(json.dumps(dict(r, shape=args.shape, dtype=args.dtype, gpu=torch.cuda.get_device_name(), time=time.time())) + "\n")
    print("\nfastest per op:")
    for op in ("layer_norm", "rms_norm"):
        ok = sorted((r for r in rows if r["op"] == op and "ms" in r), key=lambda r: r["ms"])
        comp = [r for r in rows if r["op"] == op and r.get("backend") == "compile"]
        default = [r for r in ok if (r["prefetch"], r["pair_sum"], r["per_sm"], r["warps"]) == (False, False, 4, 8)]
        for r in ok[:5]:
            print(f"  {op}: {r['ms']:.4f} ms ({floor_ms / r['ms']:.0%} of floor) prefetch={r['prefetch']} pair={r['pair_sum']} per_sm={r['per_sm']} warps={r['warps']} diff={r['max_diff']:.2e}")
        if default:
            print(f"  {op}: default {default[0]['ms']:.4f} ms")
        if comp:
            print(f"  {op}: compile bwd ~{comp[0]['bwd_ms']:.4f} ms (fwdbwd {comp[0]['fwdbwd_ms']:.4f} - fwd {comp[0]['fwd_ms']:.4f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
