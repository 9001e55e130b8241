"""Where the hand-swapped nanoGPT step spends host time that PyTorch's does not.

1. Syncs: three kernellab steps under torch.cuda.set_sync_debug_mode("error"); the first
   synchronizing call's traceback is printed (none: the step never waits for the device).
2. Host time of forward and backward apart, at 1 x 64 tokens (the GPU idle), PyTorch's ops
   and kernellab's interleaved in one process, the median of rounds.
3. cProfile of kernellab's steps at that size, by own time.

    python lab/probe_nano_host.py [--batch 8 --seq 1024]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time
import traceback

import torch

from kernellab.models.user_models import NanoGPT, nano_ops


def build(variant, seq, dev, dtype):
    torch.manual_seed(0)
    m = NanoGPT(50304, seq, 768, 12, 12, nano_ops(variant)).to(dev, dtype)
    return m, torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=1024)
    a = p.parse_args()
    dev, dtype = "cuda", torch.bfloat16
    sync = torch.cuda.synchronize

    # 1. syncs at the full size
    m, opt = build("kernellab", a.seq, dev, dtype)
    idx = torch.randint(0, 50304, (a.batch, a.seq), device=dev)
    for _ in range(3):
        m(idx, idx).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    sync()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            m(idx, idx).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        print("syncs: none in 3 kernellab steps")
    except RuntimeError:
        print("syncs: the first synchronizing call of a kernellab step:")
        traceback.print_exc()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    del m, opt
    torch.cuda.empty_cache()

    # 2. host time per forward / backward at 1 x 64 tokens
    small = torch.randint(0, 50304, (1, 64), device=dev)
    runs = {v: build(v, a.seq, dev, dtype) for v in ("torch", "kernellab")}
    fwd_t, bwd_t = {v: [] for v in runs}, {v: [] for v in runs}
    for _ in range(7):
        for v, (m, opt) in runs.items():
            for _ in range(3):
                m(small, small).backward()
                opt.zero_grad(set_to_none=True)
            sync()
            f = b = 0.0
            for _ in range(20):
                t0 = time.perf_counter()
                loss = m(small, small)
                t1 = time.perf_counter()
                loss.backward()
                t2 = time.perf_counter()
                opt.zero_grad(set_to_none=True)
                sync()
                f, b = f + t1 - t0, b + t2 - t1
            fwd_t[v].append(f / 20 * 1e3)
            bwd_t[v].append(b / 20 * 1e3)
    for v in runs:
        print(f"host at 1x64, {v:10s}: forward {statistics.median(fwd_t[v]):.3f} ms, "
              f"backward {statistics.median(bwd_t[v]):.3f} ms")  # fmt: skip

    # 3. cProfile of kernellab's forward and backward at that size
    m, opt = runs["kernellab"]

    def steps():
        for _ in range(50):
            m(small, small).backward()
            opt.zero_grad(set_to_none=True)

    prof = cProfile.Profile()
    prof.runcall(steps)
    sync()
    pstats.Stats(prof).sort_stats("tottime").print_stats(30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
