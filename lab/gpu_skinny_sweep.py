"""The Triton skinny kernel's configs at the decode shapes where cuBLAS leads (M = 8-32).

    python lab/gpu_skinny_sweep.py --out DIR [--cases a,b] [--max-seconds 300] [--jobs 12]

H200 table: 8x6144x4096 and 8x28672x4096 forward 0.89x cuBLAS, 32x4096x4096 0.88x, with
``skinny_config``'s heuristic tiles. For each case (a [M, K] contiguous; b [K, N]
contiguous, or b = W.t() of an nn.Linear weight W [N, K]): cuBLAS (torch.matmul on the
same views), the heuristic's launch, and a grid of (BLOCK_N, BLOCK_K, SPLIT_K, warps,
stages) around it, each launch with its split sum, timed with kernellab's device timer
(L2 flushed). Every output is compared with cuBLAS's (bound 2e-2 of its largest value)
before it is timed. The configs compile first in a pool of processes (Triton's disk cache
is shared). Writes DIR/skinny_sweep.jsonl and DIR/skinny_sweep.txt (per case: cuBLAS, the
heuristic, the five best configs).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

# name: (M, N, K, b is W.t()?)
CASES = {
    "m8_6144x4096": (8, 6144, 4096, False),
    "m8_6144x4096_linear": (8, 6144, 4096, True),
    "m8_28672x4096": (8, 28672, 4096, False),
    "m8_28672x4096_linear": (8, 28672, 4096, True),
    "m32_4096x4096": (32, 4096, 4096, False),
    "m32_4096x4096_linear": (32, 4096, 4096, True),
    "m16_14336x4096": (16, 14336, 4096, False),
    "m1_6144x4096": (1, 6144, 4096, False),
    "m1_4096x14336": (1, 4096, 14336, False),
    "m16_4096x14336": (16, 4096, 14336, False),
    "m16_4096x14336_linear": (16, 4096, 14336, True),
    "m1_14336x4096_linear": (1, 14336, 4096, True),
    "m4_14336x4096": (4, 14336, 4096, False),
    "m32_14336x4096": (32, 14336, 4096, False),
    "m2_4096x4096": (2, 4096, 4096, False),
    "m1_128256x2048_linear": (1, 128256, 2048, True),
}
BN_WARPS = [(32, 4), (64, 4), (128, 4), (128, 8), (256, 4), (256, 8)]
BKS = (64, 128, 256)
STAGES = (3, 4)
SMEM = 200 * 1024


def make_case(spec, device="cuda"):
    import torch

    m, n, k, lin = spec
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(m, k, generator=g, device=device).to(torch.bfloat16)
    if lin:
        b = torch.randn(n, k, generator=g, device=device).to(torch.bfloat16).t()
    else:
        b = torch.randn(k, n, generator=g, device=device).to(torch.bfloat16)
    return a, b


def configs_for(spec, n_sm):
    from kernellab.ops.matmul import triton as tm

    m, n, k, _ = spec
    bm = tm.skinny_block_m(m)
    out = []
    for (bn, w), bk, st in [(bw, bk, st) for bw in BN_WARPS for bk in BKS for st in STAGES]:
        if (bm * bk + bk * bn) * 2 * st > SMEM:
            continue
        kb = -(-k // bk)
        s0 = tm._skinny_splits(m, n, k, bn, bk, n_sm, 2)
        for s in sorted({max(1, s0 // 2), s0, min(kb // 2, 2 * s0)}):
            out.append((bn, bk, s, w, st))
    return out


def _compile_worker(job):
    name, spec, cfgs = job
    import torch

    from kernellab.ops.matmul.triton import triton_skinny_fwd

    a, b = make_case(spec)
    bad = []
    for cfg in cfgs:
        try:
            triton_skinny_fwd(a, b, config=cfg, plan=False)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001
            bad.append((cfg, f"{type(e).__name__}: {str(e)[:200]}"))
    return name, bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-seconds", type=float, default=300)
    ap.add_argument("--jobs", type=int, default=12)
    ap.add_argument("--cases", default=None)
    ap.add_argument("--heuristic-only", action="store_true", help="cuBLAS and the heuristic's launch only")
    args = ap.parse_args()
    t0 = time.time()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import torch

    from kernellab.harness import timer
    from kernellab.ops.matmul import triton as tm

    cases = CASES
    if args.cases:
        cases = {k: v for k, v in CASES.items() if k in args.cases.split(",")}
    n_sm = torch.cuda.get_device_properties(0).multi_processor_count
    gpu = torch.cuda.get_device_name(0)
    sha = os.environ.get("KERNELLAB_GIT_SHA", "")
    plan = {name: [] if args.heuristic_only else configs_for(spec, n_sm) for name, spec in cases.items()}
    print(f"{sum(map(len, plan.values()))} configs over {len(plan)} cases", flush=True)
    jobs = [(name, cases[name], cfgs[i : i + 8]) for name, cfgs in plan.items()
            for i in range(0, len(cfgs), 8)]  # fmt: skip
    failed = {}
    ctx = torch.multiprocessing.get_context("spawn")
    with cf.ProcessPoolExecutor(args.jobs, mp_context=ctx) as pool:
        for name, bad in pool.map(_compile_worker, jobs):
            failed.update({(name, tuple(c)): why for c, why in bad})
    print(f"compiled in {time.time() - t0:.0f} s ({len(failed)} launches raised)", flush=True)

    def timed(fn):
        return timer.time_cuda(fn, warmup_s=0.02, min_reps=10, min_time_s=0.05, budget_s=0.3).median_ms * 1e3

    lines = []
    rows_f = open(out / "skinny_sweep.jsonl", "w")
    for name, spec in cases.items():
        if time.time() - t0 > args.max_seconds:
            lines.append(f"{name}: skipped (time)")
            continue
        m, n, k, lin = spec
        a, b = make_case(spec)
        ref = torch.matmul(a, b).float()
        scale = ref.abs().max().item() or 1.0
        base = dict(case=name, m=m, n=n, k=k, linear=lin, gpu=gpu, git_sha=sha)
        t_cublas = timed(lambda: torch.matmul(a, b))
        heur = tm.skinny_config(m, n, k, n_sm, 2)
        t_heur = timed(lambda: tm.triton_skinny_fwd(a, b, plan=False))
        rows_f.write(json.dumps(dict(base, backend="torch", us=t_cublas)) + "\n")
        rows_f.write(json.dumps(dict(base, backend="heuristic", config=heur, us=t_heur)) + "\n")
        res = []
        for cfg in plan[name]:
            row = dict(base, backend="skinny", config=cfg)
            if (name, cfg) in failed:
                row["error"] = failed[(name, cfg)]
            else:
                y = tm.triton_skinny_fwd(a, b, config=cfg, plan=False)
                err = (y.float() - ref).abs().max().item() / scale
                row["rel_err"] = err
                if err > 2e-2:
                    row["error"] = "mismatch"
                else:
                    row["us"] = timed(lambda cfg=cfg: tm.triton_skinny_fwd(a, b, config=cfg, plan=False))
                    res.append((row["us"], cfg))
            rows_f.write(json.dumps(row) + "\n")
        rows_f.flush()
        res.sort()
        top = "  ".join(f"{c} {u:.1f} x{t_cublas / u:.3f}" for u, c in res[:5]) or "-"
        ratio = t_cublas / t_heur
        lines.append(
            f"{name:24s} cublas {t_cublas:.1f} us  heuristic {heur} {t_heur:.1f} x{ratio:.3f}  best: {top}"
        )
        print(lines[-1], flush=True)
    rows_f.close()
    (out / "skinny_sweep.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
