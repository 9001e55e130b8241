"""triton_x3's tile configs one at a time: which candidate wins where, and what the
spilling 4-warp 128x128 tile costs or gains. Needs a GPU.

    PYTHONPATH=src python lab/gpu_x3_configs.py [--json F]

Tuned products (work >= TUNE_MIN_WORK): each candidate of ``matmul_configs`` that x3's
pruning keeps (K steps of 32 at most, the pipeline within shared memory) is forced as
the autotuner's only config and timed (do_bench, ms, L2 flushed), beside the autotuner's
own pick and torch (cuBLAS, TF32 off). The library's rule picks x3 or x3s per product.
Small products (below it, one fixed config): ``fixed_config``'s x3 tile at 4 and at 8 warps
and two narrower ones, forward and forward + backward.
"""

import argparse
import json

import torch
from triton.testing import do_bench

import kernellab
from kernellab.ops.matmul import triton as tm

TUNED = [(8192, 768, 768), (8192, 768, 3072), (8192, 3072, 768), (3000, 3000, 3000), (4097, 4095, 1023),
         (4096, 4096, 4096)]  # fmt: skip
SMALL = [(64, 128, 3136), (512, 768, 768), (1024, 768, 768), (256, 3072, 768)]
SMALL_CFGS = {
    "128x128x32 s3 w4": (128, 128, 32, 3, 4),
    "128x128x32 s3 w8": (128, 128, 32, 3, 8),
    "64x128x32 s4 w4": (64, 128, 32, 4, 4),
    "64x64x32 s4 w4": (64, 64, 32, 4, 4),
}


def cfg_name(c) -> str:
    kw = c.kwargs
    return f"{kw['BLOCK_M']}x{kw['BLOCK_N']}x{kw['BLOCK_K']} s{c.num_stages} w{c.num_warps}"


def reset(tuner):
    """Forget every tuned config and launch plan (the autotuner's cache, launch_tuned's lean
    cache, the matmul plans that bind a config)."""
    tuner.cache.clear()
    lean = tuner.__dict__.get("_kl_lean")
    if lean is not None:
        lean[1].clear()
    tm._PLANS.clear()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False

    def out(row):
        print(json.dumps(row), flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(row) + "\n")

    tuner = tm._matmul_tuned
    all_cfgs = list(tuner.configs)
    limit = tm._max_shared(0)
    for m, n, k in TUNED:
        g = torch.Generator(device="cuda").manual_seed(0)
        a = torch.randn(m, k, device="cuda", generator=g)
        b = torch.randn(n, k, device="cuda", generator=g).t()  # a linear's forward
        split = tm.X3_SPLIT_MIN_WORK <= m * n * k and (
            any(d % 4 for d in (m, n, k)) or m * n / (m + n) >= tm.X3_SPLIT_MIN_MN)
        elem = 8 if split else 4
        row = dict(shape=[m, n, k], layout="nt", variant="x3s" if split else "x3", ms={})
        row["ms"]["torch"] = round(do_bench(lambda: a @ b), 5)
        run = lambda: kernellab.matmul(a, b, backend="triton_x3")  # noqa: E731
        try:
            for c in all_cfgs:
                if c.kwargs["BLOCK_K"] > 32 or not tm._fits(c, m, n, k, elem, limit):
                    continue
                tuner.configs = [c]
                reset(tuner)
                run()
                row["ms"][cfg_name(c)] = round(do_bench(run), 5)
            tuner.configs = all_cfgs
            reset(tuner)
            run()
            row["picked"] = cfg_name(tuner.best_config)
            row["ms"]["autotuned"] = round(do_bench(run), 5)
        finally:
            tuner.configs = all_cfgs
            reset(tuner)
        out(row)

    saved = tm.fixed_config
    try:
        for m, n, k in SMALL:
            g = torch.Generator(device="cuda").manual_seed(1)
            a = torch.randn(m, k, device="cuda", generator=g, requires_grad=True)
            w = torch.randn(n, k, device="cuda", generator=g, requires_grad=True)
            dy = torch.randn(m, n, device="cuda", generator=g)

            def step(backend):
                y = kernellab.matmul(a, w.t(), backend=backend) if backend else a @ w.t()
                y.backward(dy)

            with torch.no_grad():
                row = dict(shape=[m, n, k], layout="nt", ms={"torch": round(do_bench(lambda: a @ w.t()), 5)})
            row["ms_fwdbwd"] = {"torch": round(do_bench(lambda: step(None), grad_to_none=[a, w]), 5)}
            for name, (bm, bn, bk, s, nw) in SMALL_CFGS.items():
                cfg = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, num_stages=s, num_warps=nw)
                tm.fixed_config = lambda *_a, cfg=cfg: dict(cfg)
                tm._PLANS.clear()
                with torch.no_grad():
                    fwd = lambda: kernellab.matmul(a, w.t(), backend="triton_x3")  # noqa: E731
                    row["ms"][name] = round(do_bench(fwd), 5)
                row["ms_fwdbwd"][name] = round(do_bench(lambda: step("triton_x3"), grad_to_none=[a, w]), 5)
            out(row)
    finally:
        tm.fixed_config = saved
        tm._PLANS.clear()


if __name__ == "__main__":
    main()
