"""Where the Triton matmul backend's forward+backward host time goes (issue 43's fwd+bwd rows).

lab/gpu_skinny.py --quick measured the whole forward+backward of
``kernellab.matmul(x, W.t(), backend="triton")`` at 0.2-0.5x torch while its three products,
timed alone in CUDA graphs, were 0.7-1.0x cuBLAS: the gap is host time. This probe times a
plain loop of each piece against torch's, then prints a cProfile of the backend's
forward+backward (autograd's device threads off, so the backward's Python runs here) and a
torch.profiler table.

    PYTHONPATH=src python lab/probe_matmul_host.py [--shape 128x4096x4096] [--no-plans]

``--no-plans``: the Triton forward derives every launch per call (kernellab.config.matmul_plans
off), as before launch plans; lab/gpu_mm_plans.py times both side by side.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats

import torch

import kernellab
from kernellab.harness import timer
from kernellab.ops.matmul.triton import triton_matmul_fwd


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="128x4096x4096", help="MxNxK: x [M, K] @ W[N, K]^T")
    p.add_argument("--no-plans", action="store_true", help="kernellab.config.matmul_plans = False")
    args = p.parse_args()
    kernellab.config.matmul_plans = not args.no_plans
    m, n, k = (int(s) for s in args.shape.split("x"))
    dev, bf = "cuda", torch.bfloat16
    x = torch.randn(m, k, device=dev, dtype=bf, requires_grad=True)
    w = (torch.randn(n, k, device=dev, dtype=bf) / k**0.5).requires_grad_()
    dy = torch.randn(m, n, device=dev, dtype=bf)
    xd, wd = x.detach(), w.detach()

    def fb(f):
        return lambda: torch.autograd.grad(f(x, w.t()), (x, w), dy)

    cases = {
        "torch fwd+bwd": fb(torch.matmul),
        "triton fwd+bwd": fb(lambda a, b: kernellab.matmul(a, b, backend="triton")),
        "torch fwd": lambda: torch.matmul(xd, wd.t()),
        "triton fwd (backend)": lambda: kernellab.matmul(xd, wd.t(), backend="triton"),
        "triton_matmul_fwd y": lambda: triton_matmul_fwd(xd, wd.t()),
        "triton_matmul_fwd dx": lambda: triton_matmul_fwd(dy, wd),
        "triton_matmul_fwd dW": lambda: triton_matmul_fwd(xd.t(), dy),
        "torch dx": lambda: torch.matmul(dy, wd),
        "torch dW": lambda: torch.matmul(xd.t(), dy),
    }
    for f in cases.values():  # compile, tune
        f()
    torch.cuda.synchronize()
    got = timer.paired_us(cases, lambda key: "torch fwd+bwd", 7)
    for key, r in got.items():
        if isinstance(r, Exception):
            print(f"{key:24s} error {r!r}")
        else:
            print(f"{key:24s} {r[0]:8.1f} us per call  {r[1]:5.2f}x torch fwd+bwd", flush=True)
    f = cases["triton fwd+bwd"]
    with torch.autograd.set_multithreading_enabled(False):
        for _ in range(20):
            f()
        torch.cuda.synchronize()
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(50):
            f()
        torch.cuda.synchronize()
        pr.disable()
    pstats.Stats(pr).sort_stats("tottime").print_stats(30)
    pstats.Stats(pr).sort_stats("cumulative").print_stats(40)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            f()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
