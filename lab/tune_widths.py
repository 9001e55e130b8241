"""Fat (4 packs/thread) vs x1 (1 pack/thread) vectorized kernels across sizes, beside
torch: where should cuda/elementwise.py switch? Prints one line per (kernel, dtype, n):
torch, vec and x1 medians (CUDA events, L2 flushed) and the fat grid in blocks per SM.
JSON rows to argv[1] (optional)."""

import json
import sys

import torch

from kernellab.harness.timer import time_cuda
from kernellab.ops import _elementwise_cuda as ew
from kernellab.ops.add import cuda as add_cuda
from kernellab.ops.gelu import cuda as gelu_cuda

rows = []
sms = torch.cuda.get_device_properties(0).multi_processor_count
for dtype in (torch.float32, torch.bfloat16):
    for p in (18, 20, 22, 23, 24, 25, 26):
        n = 2**p
        x = torch.randn(n, device="cuda").to(dtype)
        b = torch.randn(n, device="cuda").to(dtype)
        jobs = {
            "gelu_fwd": (gelu_cuda.MODULE, [x], lambda: torch.nn.functional.gelu(x, approximate="tanh")),
            "gelu_bwd": (
                gelu_cuda.MODULE,
                [b, x],
                lambda: torch.ops.aten.gelu_backward(b, x, approximate="tanh"),
            ),
            "add": (add_cuda.MODULE, [x, b], lambda: torch.add(x, b)),
        }
        for name, (mod, inputs, ref) in jobs.items():
            res = {"torch": time_cuda(ref, budget_s=0.3).median_ms}
            packs = n // (16 // x.element_size())
            for kind in ("vec", "x1"):
                k, per_block = ew._kernel(mod, name, dtype, 0, kind, len(inputs))
                grid = (packs + per_block - 1) // per_block

                def f(k=k, grid=grid):
                    y = torch.empty_like(x)
                    k.launch_1d(grid, ew.THREADS, [t.data_ptr() for t in inputs] + [y.data_ptr(), n], 0)
                    return y

                out = f()
                torch.testing.assert_close(out.float(), ref().float(), rtol=2e-2, atol=2e-2)
                res[kind] = time_cuda(f, budget_s=0.3).median_ms
            fat_per_sm = packs / (ew.THREADS * ew.UNROLL[len(inputs)]) / sms
            rows.append(
                {"kernel": name, "dtype": str(dtype)[6:], "n": n, "fat_blocks_per_sm": fat_per_sm, **res}
            )
            print(
                f"{name:9s} {str(dtype)[6:]:9s} 2^{p:<3d} fat/SM {fat_per_sm:7.1f}"
                f"  torch {res['torch'] * 1e3:8.2f} us  vec {res['vec'] * 1e3:8.2f}"
                f"  x1 {res['x1'] * 1e3:8.2f}"
            )
if len(sys.argv) > 1:
    with open(sys.argv[1], "w") as fh:
        for r in rows:
            fh.write(json.dumps({**r, "gpu": torch.cuda.get_device_name()}) + "\n")
