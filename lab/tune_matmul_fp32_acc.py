"""Accuracy of the Triton matmul in fp32 (TF32 off: fused multiply-adds on the FMA units)
against cuBLAS (torch) by the check's rule: max |C - C64| over the bound
2 x cuBLAS's error + eps x scale, over 20 seeds at small and large K.

    python lab/tune_matmul_fp32_acc.py OUT.jsonl

Why: the full check on the H100 failed the triton fp32 backend at 64x48x80 (seed 813205113:
1.33e-5 against 1.1e-5) and 17x33x65 (seed 3). The version at ef7290c also timed and
judged each BLOCK_K chunk's dot summed from zero and then added (``acc += tl.dot(a, b)``)
against one chain (``acc = tl.dot(a, b, acc)``): identical outputs at every seed and the
same speed (4096^3: 3.0388 and 3.0392 ms), because Triton's combine pass rewrites
add(dot(a, b, 0), acc) into dot(a, b, acc). Rows: tune_matmul_fp32_acc-H100.jsonl.
"""

from __future__ import annotations

import json
import sys

import torch

import kernellab.ops.matmul.triton as tm


def main():
    torch.backends.cuda.matmul.allow_tf32 = False
    rows = []
    for m, n, k in ((64, 48, 80), (17, 33, 65), (127, 129, 1000), (512, 512, 4096)):
        ratios = []
        for seed in range(20):
            g = torch.Generator(device="cuda").manual_seed(seed)
            a = torch.randn(m, k, device="cuda", generator=g)
            b = torch.randn(k, n, device="cuda", generator=g)
            ref = a.double() @ b.double()
            scale = max(1.0, ref.abs().max().item())
            bound = 2 * ((a @ b).double() - ref).abs().max().item() + torch.finfo(torch.float32).eps * scale
            ratios.append((tm.triton_matmul_fwd(a, b).double() - ref).abs().max().item() / bound)
        r = dict(
            shape=f"{m}x{n}x{k}",
            max_err_over_bound=max(ratios),
            mean_err_over_bound=sum(ratios) / len(ratios),
            seeds_over_bound=sum(x > 1 for x in ratios),
            gpu=torch.cuda.get_device_name(),
            torch=torch.__version__,
        )
        rows.append(r)
        print(json.dumps(r), flush=True)
    with open(sys.argv[1] if len(sys.argv) > 1 else "tune_matmul_fp32_acc.jsonl", "w") as fh:
        for r in rows:
            fh.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
