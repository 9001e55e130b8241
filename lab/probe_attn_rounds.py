"""Attention forward and forward+backward of a few backends timed in alternating rounds, to
tell a kernel's cost from the device's drift over a long run (a Llama-3-8B 8192-key row of
the tuning table has read 7.3-8.3 ms for `cuda` over four sessions):

    python lab/probe_attn_rounds.py [--out FILE.jsonl] [--shapes B,H[/HKV],S,D[,c];...]
                                    [--backends cuda,sdpa_cudnn,triton] [--rounds 3]

Per shape (bf16) and round, each backend in turn: the forward alone and the forward +
backward through autograd (harness.timer.time_cuda, L2 flushed). A row per shape with
every round's ms, the medians and each backend's median x the first backend's."""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def parse_shapes(text: str) -> list[tuple]:
    """'B,H[/HKV],S,D[,c];...' as (B, H, HKV, S, D, causal)."""
    out = []
    for part in filter(None, text.split(";")):
        f = part.split(",")
        if len(f) not in (4, 5) or (len(f) == 5 and f[4] != "c"):
            raise SystemExit(f"--shapes: B,H[/HKV],S,D[,c] separated by ';', got {part!r}")
        h, _, hkv = f[1].partition("/")
        out.append((int(f[0]), int(h), int(hkv or h), int(f[2]), int(f[3]), len(f) == 5))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--shapes", default="1,32,8192,128;1,32,8192,128,c;4,32,2048,128")
    ap.add_argument("--backends", default="sdpa_cudnn,cuda,triton")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args(argv)

    import torch

    import kernellab
    from kernellab.harness import timer
    from kernellab.harness.bench import git_sha

    backends = [b for b in a.backends.split(",") if b]
    tkw = dict(min_time_s=0.1, budget_s=0.6)
    for b, h, hkv, s, d, causal in parse_shapes(a.shapes):
        gen = torch.Generator("cuda").manual_seed(0)

        def make(heads):
            return torch.randn(b, heads, s, d, device="cuda", dtype=torch.bfloat16, generator=gen)

        q, k, v = make(h), make(hkv), make(hkv)
        do = make(h)
        qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
        scale = 1 / math.sqrt(d)
        rounds = {f"{be}/{m}": [] for be in backends for m in ("fwd", "fwdbwd")}
        for _ in range(a.rounds):
            for be in backends:

                def fwd(be=be):
                    with torch.no_grad():
                        return kernellab.attention(q, k, v, causal=causal, scale=scale, backend=be)

                def fwdbwd(be=be):
                    o = kernellab.attention(qg, kg, vg, causal=causal, scale=scale, backend=be)
                    o.backward(do)
                    qg.grad = kg.grad = vg.grad = None

                rounds[f"{be}/fwd"].append(round(timer.time_cuda(fwd, **tkw).median_ms, 4))
                rounds[f"{be}/fwdbwd"].append(round(timer.time_cuda(fwdbwd, **tkw).median_ms, 4))
        med = {n: statistics.median(v) for n, v in rounds.items()}
        first = backends[0]
        x_first = {n: round(med[f"{first}/{n.split('/')[1]}"] / t, 3) for n, t in med.items()}
        row = dict(gpu=torch.cuda.get_device_name(), git_sha=git_sha(), B=b, H=h, H_kv=hkv, S=s, D=d,
                   causal=causal, rounds_ms=rounds, median_ms=med, x_first=x_first)  # fmt: skip
        print(json.dumps(row), flush=True)
        if a.out:
            with open(a.out, "a") as f:
                f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
