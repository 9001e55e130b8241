"""The cols kernel at an aligned and an odd row stride, for Nsight Compute (lab notes (aj)):

    ncu --kernel-name regex:skinny_cols --launch-skip 2 --launch-count 2 --section SpeedOfLight \
        --section MemoryWorkloadAnalysis --section WarpStateStats --csv --page details \
        python lab/ncu_skinny.py

Three rounds of y = x [1, K] @ w [K, N] at 1x4096x4096 then 1x4097x4095 (w row-major, the nn
layout); the skip leaves the third round's two launches.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402

from kernellab.ops.matmul import cuda_skinny as cs  # noqa: E402

pairs = []
for n, k in ((4096, 4096), (4097, 4095)):
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    pairs.append((x, torch.randn(k, n, device="cuda", dtype=torch.bfloat16)))
for _ in range(3):
    for x, w in pairs:
        cs.skinny_product(x, w)
torch.cuda.synchronize()
