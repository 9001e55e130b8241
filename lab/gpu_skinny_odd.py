"""The cols kernel at odd row strides (1x4097x4095, weight [K, N] row-major): device time of
split counts and block shapes against cuBLAS, and the aligned 1x4096x4096 beside it.

    PYTHONPATH=src python lab/gpu_skinny_odd.py --out DIR

Rows to DIR/skinny_odd.jsonl (CUDA events, L2 flushed, median), each judged against float64.
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402

from kernellab.harness.compare import judge  # noqa: E402
from kernellab.harness.timer import time_cuda  # noqa: E402
from kernellab.ops.matmul import cuda_skinny as cs  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    args = p.parse_args()
    out = Path(args.out) / "skinny_odd.jsonl"
    cfgs = {"table": None}
    for warps, blocks in ((8, 2), (16, 2), (8, 3), (8, 4), (4, 8)):
        for unroll in (2, 4):
            cfgs[f"w{warps}u{unroll}b{blocks}"] = cs.ColsConfig(
                warps=warps, chunks=1, unroll=unroll, kc=1024, blocks=blocks
            )
    with out.open("w") as f:
        for m, n, k in ((1, 4097, 4095), (1, 4096, 4096), (2, 4097, 4095)):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
            ref = x.double() @ w.double()
            base = time_cuda(lambda: x @ w).median_ms
            line = [f"{m}x{n}x{k} torch {base * 1e3:.1f}us"]
            for name, cfg in cfgs.items():
                for splits in (None, 12, 16, 24, 32):
                    y = cs.skinny_product(x, w, cfg, splits)
                    ok = bool(judge(y, ref, torch.bfloat16, x @ w).ok)
                    t = time_cuda(
                        lambda cfg=cfg, splits=splits: cs.skinny_product(x, w, cfg, splits)
                    ).median_ms
                    f.write(json.dumps({"shape": f"{m}x{n}x{k}", "config": name, "splits": splits, "ok": ok,
                                        "median_ms": t, "torch_ms": base}) + "\n")  # fmt: skip
                    line.append(f"{name}/s{splits} {t * 1e3:.1f}{'' if ok else ' FAIL'}")
            print("  ".join(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
