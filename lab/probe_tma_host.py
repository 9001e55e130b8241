"""Where triton_tma's host time goes: plain-loop time per call (host-bound calls show their
host cost) of each product alone and of forward+backward through the backend, beside the
triton and torch backends, and a cProfile of the forward+backward loop.

    python lab/probe_tma_host.py [--shape 8192,768,768] [--out FILE.txt]

Context: the H200 table's loop times for triton_tma are 2-10x its device times at fwd+bwd
(8192x768x768: 711 us a call against 68 of device time; triton 204, torch 122).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def loop_us(fn, n=200, warm=20):
    import torch

    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="8192,768,768")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import torch

    import kernellab
    from kernellab.ops.matmul import triton_tma as tt

    m, n, k = map(int, args.shape.split(","))
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(m, k, generator=g, device="cuda").bfloat16()
    b = torch.randn(k, n, generator=g, device="cuda").bfloat16()
    dy = torch.randn(m, n, generator=g, device="cuda").bfloat16()
    lines = [f"shape {m}x{n}x{k} bf16, {torch.cuda.get_device_name(0)}"]
    # each product alone, through the launcher (no autograd, no registry)
    prods = {
        "fwd a@b": (a, b),
        "dA dy@b^T": (dy, b.t()),
        "dB a^T@dy": (a.t(), dy),
    }
    for name, (x, y) in prods.items():
        lines.append(f"launcher {name:12s} {loop_us(lambda x=x, y=y: tt.tma_matmul_fwd(x, y)):8.1f} us/call")
        lines.append(f"torch    {name:12s} {loop_us(lambda x=x, y=y: torch.matmul(x, y)):8.1f} us/call")
    for be in ("torch", "triton", "triton_tma"):
        us = loop_us(lambda be=be: kernellab.matmul(a, b, backend=be))
        lines.append(f"backend {be:10s} fwd    {us:8.1f} us/call")
    aa = a.detach().requires_grad_()
    bb = b.detach().requires_grad_()

    def fwdbwd(be):
        y = kernellab.matmul(aa, bb, backend=be)
        y.backward(dy)
        aa.grad = bb.grad = None

    for be in ("torch", "triton", "triton_tma"):
        lines.append(f"backend {be:10s} fwdbwd {loop_us(lambda be=be: fwdbwd(be)):8.1f} us/call")
    print("\n".join(lines), flush=True)
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(100):
        fwdbwd("triton_tma")
    torch.cuda.synchronize()
    pr.disable()
    s = io.StringIO()
    st = pstats.Stats(pr, stream=s)
    st.sort_stats("tottime").print_stats(25)
    st.sort_stats("cumulative").print_stats(40)
    prof = s.getvalue()
    print(prof)
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n\n" + prof)


if __name__ == "__main__":
    main()
