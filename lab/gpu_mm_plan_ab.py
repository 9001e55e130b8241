"""A/B of triton_tma's persistent plan against the whole-tile 128x256 persistent launch it
replaced, in one process, the two taking turns for several rounds (big products drift by
~10% between runs: only same-round ratios are compared).

    python lab/gpu_mm_plan_ab.py --out FILE.jsonl [--rounds 5] [--cases a,b]

Cases are lab/gpu_mm_tma_sweep.py's. Per case and round: cuBLAS, the plan (the launcher
with no config), and the old launch (config 128x256x64, 3 stages, 8 warps, persistent,
no tail); each output checked against cuBLAS first. Prints per case the median over rounds
of old/plan and cuBLAS/plan.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from gpu_mm_tma_sweep import CASES, make_case  # noqa: E402

DEFAULT = ",".join([
    "gpt_8192x768x768", "gpt_8192x768x768_dB", "gpt_8192x3072x768_dB",
    "odd_3000x3000x3000", "odd_3072x3072x3072",
    "llama_8192x28672x4096", "llama_8192x28672x4096_dB", "llama_8192x4096x14336_dB", "gpt_50432x768x3072_dB",
])  # fmt: skip


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cases", default=DEFAULT)
    args = ap.parse_args()
    import torch

    from kernellab.harness import timer
    from kernellab.ops.matmul import triton_tma as tt

    old_cfg = dict(tt.PERSISTENT_TILES[0][0], persistent=True)
    sha = os.environ.get("KERNELLAB_GIT_SHA", "")
    gpu = torch.cuda.get_device_name(0)
    with open(args.out, "w") as f:
        for name in args.cases.split(","):
            spec = CASES[name]
            a, b = make_case(spec, "cuda")
            ref = torch.matmul(a, b).float()
            scale = ref.abs().max().item() or 1.0
            fns = {"torch": lambda: torch.matmul(a, b), "plan": lambda: tt.tma_matmul_fwd(a, b),
                   "old": lambda: tt.tma_matmul_fwd(a, b, config=old_cfg)}  # fmt: skip
            for k in ("plan", "old"):
                err = (fns[k]().float() - ref).abs().max().item() / scale
                assert err <= 2e-2, (name, k, err)
            per = {k: [] for k in fns}
            for r in range(args.rounds):
                for k, fn in fns.items():
                    t = timer.time_cuda(fn, warmup_s=0.02, min_reps=10, min_time_s=0.1, budget_s=0.4)
                    ms = t.median_ms
                    per[k].append(ms)
                    row = dict(case=name, shape=spec[:3], a_t=spec[4], b_t=spec[5], round=r, launch=k, ms=ms)
                    f.write(json.dumps(dict(row, gpu=gpu, git_sha=sha)) + "\n")
            old_plan = statistics.median(o / p for o, p in zip(per["old"], per["plan"]))
            cub_plan = statistics.median(c / p for c, p in zip(per["torch"], per["plan"]))
            print(f"{name:28s} old/plan {old_plan:.3f}  cuBLAS/plan {cub_plan:.3f}  "
                  f"plan {statistics.median(per['plan']) * 1e3:.1f} us", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
