"""Host time of one GPT-2 block, forward + backward (GPU), at a tiny token count so the
device time stays under the host's: PyTorch's ops op by op, kernellab's ops op by op, and
kernellab's fused block (one autograd node); and inside the fused block, the host time of
each op's node-free launcher (perf_counter around each call, no synchronization).

    PYTHONPATH=src python lab/probe_block.py [--bt 1x64] [--out DIR]
"""

from __future__ import annotations

import argparse
import collections
import json
import time

import torch

from kernellab.harness import timer
from kernellab.harness.bench import git_sha, versions
from kernellab.models import gpt


def per_iter_us(fn, calls=100) -> float:
    """us per iteration in a plain loop (harness.timer.loop_ms: median of 5 rounds)."""
    return timer.loop_ms(fn, calls) * 1e3


class _Timed:
    """A node-free op whose calls add their host time to ``acc[name]``."""

    def __init__(self, fn, name, acc):
        self.fn, self.name, self.acc = fn, name, acc

    def forward_saving(self, *a):
        t0 = time.perf_counter()
        r = self.fn.forward_saving(*a)
        self.acc[self.name + ".fwd"] += time.perf_counter() - t0
        return r

    def backward_from(self, *a):
        t0 = time.perf_counter()
        r = self.fn.backward_from(*a)
        self.acc[self.name + ".bwd"] += time.perf_counter() - t0
        return r


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--bt", default="1x64")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    b, t = map(int, args.bt.split("x"))
    cfg = gpt.Config(vocab=50304, ctx=1024, dim=768, layers=1, heads=12)
    rows = []
    x0 = torch.randn(b, t, 768, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn_like(x0)

    def block_fn(model, fused):
        blk = model.blocks[0]
        o = model.ops
        x = x0.clone().requires_grad_(True)
        kern = model._fused(x) if fused else None
        params = model._block_params()

        def run():
            if kern is not None:
                y = gpt._Blocks.apply(x, kern, 12, *params)
            else:
                y = model._block_ops(blk, x, o, b, t)
            y.backward(dy)

        return run, kern, params, x

    results = {}
    for name, be, fused in (("pytorch", "pytorch", False), ("kl_unfused", "triton", False), ("kl_fused", "triton", True)):
        model = gpt.GPT(cfg, be).to("cuda", torch.bfloat16)
        run, *_ = block_fn(model, fused)
        us = per_iter_us(run)
        results[name] = us
        rows.append({"probe": f"block fwd+bwd {name}", "us": round(us, 1), "BT": args.bt})
        print(f"block fwd+bwd {name:12s} {us:9.1f} us", flush=True)

    # Inside the fused block: host time of each node-free launcher.
    model = gpt.GPT(cfg, "triton").to("cuda", torch.bfloat16)
    run, kern, params, x = block_fn(model, True)
    acc = collections.defaultdict(float)
    timed = {k: _Timed(v, k, acc) for k, v in kern.items()}
    n = 200
    for _ in range(10):
        run()
    torch.cuda.synchronize()
    acc.clear()

    def run_timed():
        y = gpt._Blocks.apply(x, timed, 12, *params)
        y.backward(dy)

    t0 = time.perf_counter()
    for _ in range(n):
        run_timed()
    torch.cuda.synchronize()
    total = (time.perf_counter() - t0) / n * 1e6
    print(f"fused block, timed launchers: {total:.1f} us per fwd+bwd; of it:")
    for k, v in sorted(acc.items(), key=lambda kv: -kv[1]):
        us = v / n * 1e6
        rows.append({"probe": f"fused block part {k}", "us": round(us, 1), "BT": args.bt})
        print(f"  {k:18s} {us:8.1f} us")
    print(f"  {'rest (cuBLAS, copies, sums, autograd)':18s} {total - sum(acc.values()) / n * 1e6:8.1f} us")
    if args.out:
        meta = {"gpu": torch.cuda.get_device_name(), "git_sha": git_sha(), **versions()}
        with open(f"{args.out}/probe_block.jsonl", "a") as f:
            for r in rows:
                f.write(json.dumps({**meta, **r}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
