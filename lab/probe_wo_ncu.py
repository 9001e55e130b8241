"""Kernels for an ncu profile of the int8 weight-only decode product against bf16 cuBLAS:
M = 1 and 16 on the 4096 x 14336 and 14336 x 4096 weights, each launched 3 times.

    ncu -k regex:'wo_v4|gemv|gemm|nvjet' --section SpeedOfLight --section MemoryWorkloadAnalysis \
        --section Occupancy --section WarpStateStats python3 lab/probe_wo_ncu.py
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import kernellab  # noqa: E402
from kernellab.ops.weight_only_matmul import quantize_weight  # noqa: E402

torch.manual_seed(0)
for n, k in ((14336, 4096), (4096, 14336)):
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
    w_q, s = quantize_weight(w)
    for m in (1, 16):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        for _ in range(3):
            F.linear(x, w)
            kernellab.int8_weight_only_matmul(x, w_q, s, None, backend="cuda")
        torch.cuda.synchronize()
        print(f"M={m} N={n} K={k}", flush=True)
