"""Sweep the knobs of the Triton layer_norm / rms_norm kernels on a GPU (issue 3).

    python lab/tune_norm_bwd.py [--out DIR] [--shape 16384x4096] [--dtype bf16]

Backward: times the launcher alone (``norm_bwd``: the kernel plus the sum of the
dweight/dbias partials) for Config.bwd_prefetch (load row i + 1 before row i's reductions) x
bwd_programs_per_sm x bwd_warps. Forward: ``norm_fwd`` for fwd_warps x fwd_evict (the
eviction policy of the x load and the y store), beside liger's forward when liger-kernel is
installed. ``triton.testing.do_bench`` (L2 flushed between calls, median); the bytes floor
(backward: read x, dy, write dx; forward: read x, write y) at the measured copy rate. Each
configuration's outputs are compared with the first one's (same math: a few ulp at most).
Rows -> DIR/tune_norm_bwd.jsonl; the fastest configurations are printed last.
(The first H100 sweep also tried one paired tl.reduce for the two layer_norm row sums:
no gain, removed.)
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

import kernellab.ops.norm_kernels.triton_kernels as lt  # noqa: E402


def _copy_gbps() -> float:
    x = torch.empty(2**28, device="cuda")
    y = torch.empty_like(x)
    ms = triton.testing.do_bench(lambda: y.copy_(x), warmup=50, rep=300)
    return 2 * x.numel() * 4 / ms / 1e6


def _diff(got, ref) -> float:
    return max(float((g.float() - r.float()).abs().max()) for g, r in zip(got, ref) if g is not None)


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
    nbytes = x.numel() * x.element_size()
    print(f"copy {copy:.0f} GB/s; floors: fwd {2 * nbytes / copy / 1e6:.4f} ms, bwd {3 * nbytes / copy / 1e6:.4f} ms")
    rows = []

    def record(row):
        rows.append(row)
        print(json.dumps(row), flush=True)

    for rms in (False, True):
        op = "rms_norm" if rms else "layer_norm"
        bias = None if rms else b
        ref_f = lt.norm_fwd(x, w, bias, 1e-5, rms)
        for warps, evict in itertools.product((4, 8, 16), ("", "evict_first")):
            cfg = lt.Config(fwd_warps=warps, fwd_evict=evict)
            diff = _diff(lt.norm_fwd(x, w, bias, 1e-5, rms, cfg=cfg), ref_f)
            ms = triton.testing.do_bench(lambda: lt.norm_fwd(x, w, bias, 1e-5, rms, cfg=cfg), warmup=25, rep=200)
            record(dict(op=op, pass_="fwd", warps=warps, evict=evict, ms=ms, max_diff=diff))
        try:
            if rms:
                from liger_kernel.transformers.functional import liger_rms_norm as lf

                def liger():
                    return lf(x, w, 1e-5)
            else:
                from liger_kernel.transformers.functional import liger_layer_norm as lf

                def liger():
                    return lf(x, w, b, 1e-5)

            ms = triton.testing.do_bench(liger, warmup=25, rep=200)
            record(dict(op=op, pass_="fwd", backend="liger", ms=ms))
        except Exception as e:  # noqa: BLE001
            record(dict(op=op, pass_="fwd", backend="liger", error=f"{type(e).__name__}: {e}"[:160]))
        _, mean, rstd = ref_f
        ref_b = None
        for pre, per_sm, warps in itertools.product((True, False), (1, 2, 3, 4), (4, 8)):
            cfg = lt.Config(bwd_prefetch=pre, bwd_programs_per_sm=per_sm, bwd_warps=warps)
            got = lt.norm_bwd(dy, x, w, mean, rstd, rms, not rms, cfg=cfg)
            ref_b = ref_b or got
            diff = _diff(got, ref_b)
            ms = triton.testing.do_bench(
                lambda: lt.norm_bwd(dy, x, w, mean, rstd, rms, not rms, cfg=cfg), warmup=25, rep=200
            )
            record(dict(op=op, pass_="bwd", prefetch=pre, per_sm=per_sm, warps=warps, ms=ms, max_diff=diff))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = dict(shape=args.shape, dtype=args.dtype, gpu=torch.cuda.get_device_name(), copy_gbps=copy, time=time.time())
    with open(out / "tune_norm_bwd.jsonl", "w") as fh:
        for r in rows:
            fh.write(json.dumps(dict(r, **meta)) + "\n")
    print("\nfastest:")
    for op in ("layer_norm", "rms_norm"):
        for p in ("fwd", "bwd"):
            ok = sorted((r for r in rows if r["op"] == op and r["pass_"] == p and "ms" in r), key=lambda r: r["ms"])
            print(f"  {op} {p}: " + "; ".join(
                f"{r['ms']:.4f} " + ",".join(f"{k}={v}" for k, v in r.items() if k not in ("op", "pass_", "ms"))
                for r in ok[:4]
            ))
    print(f"shipped: {lt.CONFIG}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
