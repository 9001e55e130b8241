"""Why a Triton launch costs more inside a forward+backward than in a plain loop (GPU, tiny
bf16 layer_norm): how often the lean launch falls back to Triton's own path, the time
spent inside each launch in both flows, inputs that require grad against detached ones,
and the cyclic garbage collector on and off.

    PYTHONPATH=src python lab/probe_launch_flow.py
"""

from __future__ import annotations

import gc
import sys
import time

import torch

import kernellab
from kernellab import triton_support
from kernellab.ops.norm_kernels import triton_kernels as lt

from probe_host import per_call_us  # noqa: E402  (lab/ is on sys.path)


def us(fn, calls=200) -> float:
    return per_call_us(fn, calls)


def main() -> int:
    dev, bf = "cuda", torch.bfloat16
    x = torch.randn(64, 256, device=dev, dtype=bf, requires_grad=True)
    w = torch.randn(256, device=dev, dtype=bf, requires_grad=True)
    b = torch.randn(256, device=dev, dtype=bf, requires_grad=True)
    dy = torch.randn(64, 256, device=dev, dtype=bf)
    fb = lambda: torch.autograd.grad(kernellab.layer_norm(x, w, b, backend="triton"), (x, w, b), dy)  # noqa: E731
    fb()
    cls = type(lt._norm_fwd_kernel)
    stats = {"slow": 0, "runs": 0, "t": 0.0}
    slow0, run0 = cls._slow, cls._lean_run

    def slow(self, grid, args, kw):
        stats["slow"] += 1
        return slow0(self, grid, args, kw)

    def run(self, grid, args, kw):
        t = time.perf_counter()
        try:
            return run0(self, grid, args, kw)
        finally:
            stats["t"] += time.perf_counter() - t
            stats["runs"] += 1

    cls._slow, cls._lean_run = slow, run
    try:
        for name, fn in (("fwdbwd", fb),
                         ("raw fwd+bwd launchers", lambda: lt.norm_bwd(dy, x.detach(), w.detach(), *lt.norm_fwd(
                             x.detach(), w.detach(), b.detach(), 1e-5, False)[1:], False, True))):  # fmt: skip
            stats.update(slow=0, runs=0, t=0.0)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(200):
                fn()
            torch.cuda.synchronize()
            total = (time.perf_counter() - t0) / 200 * 1e6
            print(f"{name:28s}: {total:7.1f} us per iteration; {stats['runs'] / 200:.1f} launches, "
                  f"{stats['t'] / max(stats['runs'], 1) * 1e6:.1f} us inside each, {stats['slow']} slow-path launches")  # fmt: skip
    finally:
        cls._slow, cls._lean_run = slow0, run0

    with torch.no_grad():
        xd, wd, bd = x.detach(), w.detach(), b.detach()
        print(f"raw norm_fwd, detached inputs      {us(lambda: lt.norm_fwd(xd, wd, bd, 1e-5, False)):7.1f} us")
        print(f"raw norm_fwd, inputs requiring grad {us(lambda: lt.norm_fwd(x, w, b, 1e-5, False)):7.1f} us")
    print(f"fwdbwd                              {us(fb):7.1f} us")
    gc.disable()
    print(f"fwdbwd, gc disabled                 {us(fb):7.1f} us")
    gc.enable()
    print("gc thresholds", gc.get_threshold(), "counts", gc.get_count())
    print("lean misses:", dict(triton_support._LEAN_MISSES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
