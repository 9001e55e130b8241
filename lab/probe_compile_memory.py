"""Where a compiled user-model step's memory goes, for one variant per process:

    PYTHONPATH=src python lab/probe_compile_memory.py --model hf-qwen2 --variant kernellab

After two warm-up steps of torch.compile(loss): the peak above the resident state during
the forward and during the backward, what the compiled forward leaves for the backward
(the saved tensors packed by the compiled autograd function, largest first), and Dynamo's
graph and break counters.
"""

from __future__ import annotations

import argparse
import collections
import sys

import torch

from kernellab.models import user_models as um


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="hf-qwen2")
    p.add_argument("--variant", default="hf")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--backend", action="append", default=[], metavar="OP=NAME")
    p.add_argument("--small", action="store_true")
    a = p.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    with torch.device(dev):
        m = um.hf_model(a.model, a.small)
    m = m.to(dev, torch.bfloat16)
    if a.variant == "kernellab":
        um.kernellab_patch(m, dict(b.split("=", 1) for b in a.backend) or None)
    elif a.variant == "liger":
        um.liger_patch(a.model, m)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4, fused=dev == "cuda")
    fwd = torch.compile(lambda i, t: m(input_ids=i, labels=t).loss)
    idx = torch.randint(0, m.config.vocab_size, (a.batch, a.seq), device=dev)
    for _ in range(2):
        fwd(idx, idx).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    saved = []

    def pack(t):
        saved.append((t.numel() * t.element_size(), tuple(t.shape), str(t.dtype).removeprefix("torch.")))
        return t

    if dev == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = fwd(idx, idx)
    if dev == "cuda":
        torch.cuda.synchronize()
        f_peak, after_f = torch.cuda.max_memory_allocated() - base, torch.cuda.memory_allocated() - base
        torch.cuda.reset_peak_memory_stats()
    loss.backward()
    if dev == "cuda":
        torch.cuda.synchronize()
        b_peak = torch.cuda.max_memory_allocated() - base
        gib = 2**30
        print(f"{a.model} {a.variant}: forward peak {f_peak / gib:.2f} GiB, left for backward {after_f / gib:.2f},"
              f" backward peak {b_peak / gib:.2f} (above the resident state)")
    print(f"saved by the compiled forward: {len(saved)} tensors, {sum(s[0] for s in saved) / 2**30:.3f} GiB")
    by = collections.Counter()
    for nbytes, shape, dtype in saved:
        by[(shape, dtype)] += nbytes
    for (shape, dtype), nbytes in by.most_common(12):
        print(f"  {nbytes / 2**20:10.1f} MiB  {dtype:9s} {shape}")
    from torch._dynamo.utils import counters

    print("dynamo:", {k: dict(v) for k, v in counters.items() if k in ("stats", "graph_break", "recompiles")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
