"""One product of cuBLAS (torch.matmul) and one of cuda_v14 (or v15: --variant) per case,
inside the NVTX range ``kl_mm``, for Nsight Compute to compare: tensor pipes, L2 and DRAM.

    ncu --nvtx --nvtx-include "kl_mm/" --set full --page details --csv --clock-control none \\
        python lab/ncu_mm.py --cases 8192x3072x768:fwd 8192x4096x4096:fwd

A case is MxNxK:LAYOUT with LAYOUT one of nn (both row-major), fwd (B stored [N, K], a
linear layer's forward) or tn (A stored [K, M], a weight gradient). Each product runs twice
before the range (compiles, cuBLAS's heuristics), once inside it."""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from gpu_mm_v14 import operands, v14, v15  # noqa: E402

LAYOUTS = {"nn": (False, False), "fwd": (False, True), "tn": (True, False)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", nargs="+", default=["8192x3072x768:fwd"])
    ap.add_argument("--block-n", type=int, default=None, help="force the tile width")
    ap.add_argument("--variant", choices=("v14", "v15"), default="v14")
    a = ap.parse_args()
    run14 = (v15 if a.variant == "v15" else v14)(a.block_n)
    work = []
    for case in a.cases:
        dims, layout = case.split(":")
        m, n, k = (int(x) for x in dims.split("x"))
        x, w = operands(m, n, k, *LAYOUTS[layout], torch.bfloat16, 0)
        work.append((case, x, w))
        for _ in range(2):
            torch.matmul(x, w)
            run14(x, w)
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("kl_mm")
    for _case, x, w in work:
        torch.matmul(x, w)
        run14(x, w)
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
    print("profiled:", " ".join(c for c, _, _ in work))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
