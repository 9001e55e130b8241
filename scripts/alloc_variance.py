"""Does the time of a bandwidth-bound kernel depend on where its buffers land?

Times the same op on the same input several times, each time with a fresh output
allocation pattern (empty_cache + a spacer allocation of a different size), and prints
the spread of the medians. Also times out= variants with different output buffers.
"""

import torch

from kernellab.harness.timer import time_cuda

N = 2**28
for dtype in (torch.float32, torch.bfloat16):
    x = torch.randn(N, device="cuda").to(dtype)
    b = torch.randn(N, device="cuda").to(dtype)
    for name, fn in [
        ("gelu", lambda: torch.nn.functional.gelu(x, approximate="tanh")),
        ("add", lambda: torch.add(x, b)),
    ]:
        meds_keep, meds_drop = [], []
        for trial in range(6):
            torch.cuda.empty_cache()
            spacer = torch.empty(trial * 37 * 2**20 + 1, dtype=torch.uint8, device="cuda")
            box = [None]

            def keep():
                box[0] = fn()

            meds_keep.append(time_cuda(keep, budget_s=0.3).median_ms)
            meds_drop.append(time_cuda(fn, budget_s=0.3).median_ms)
            del spacer, box
        print(
            f"{name:5s} {str(dtype)[6:]:9s} keep-output medians: " + " ".join(f"{m:.4f}" for m in meds_keep)
        )
        print(
            f"{name:5s} {str(dtype)[6:]:9s} drop-output medians: " + " ".join(f"{m:.4f}" for m in meds_drop)
        )
    ys = [torch.empty_like(x) for _ in range(4)]
    print(
        "add out=y_i:",
        " ".join(f"{time_cuda(lambda y=y: torch.add(x, b, out=y), budget_s=0.3).median_ms:.4f}" for y in ys),
    )
    del x, b, ys
    torch.cuda.empty_cache()
