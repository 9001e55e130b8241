"""AdamW over a model's parameter list: PyTorch's fused AdamW against kernellab.optim.AdamW
(its ``torch`` and ``triton`` backends), device time and time per step in a plain loop (GPU).

    PYTHONPATH=src python lab/adamw_bench.py --out DIR [--config gpt2] [--dtype bf16 fp32]

The parameters are the GPT model's (``kernellab.models.gpt``: GPT-2 small, 148 tensors,
124M values) with random gradients. Device time: 10 steps captured in one CUDA graph, per
step (timer.time_cuda_graph); the bytes a step must move (read p, g, m, v; write p, m, v)
over it give GB/s and the fraction of the device's measured copy bandwidth (`kernellab
peaks`' table when present). Loop time: back-to-back steps, one sync per round, the
optimizers in turn (timer.paired_loop_ms, 9 rounds): what a training loop sees, host cost
included. Every optimizer's parameters after 3 steps are compared with PyTorch's fused AdamW's
(the same starting values and gradients; the error in storage ulps of |p| + lr is in the row).
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from kernellab import optim
from kernellab.harness import timer
from kernellab.harness.bench import git_sha, versions
from kernellab.models import gpt


def _setup(config, dtype, which):
    torch.manual_seed(0)
    model = gpt.make(config, "pytorch", "pytorch", "cuda", dtype)
    ps = list(model.parameters())
    gen = torch.Generator(device="cuda").manual_seed(1)
    for p in ps:
        p.requires_grad_(True)
        p.grad = torch.randn(p.shape, device="cuda", dtype=dtype, generator=gen)
    if which == "pytorch_fused":
        opt = torch.optim.AdamW(ps, lr=1e-4, fused=True, capturable=True)
    else:
        opt = optim.AdamW(ps, lr=1e-4, backend=which.removeprefix("kernellab_"))
    return ps, opt


@torch.no_grad()
def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--config", default="gpt2")
    ap.add_argument("--dtype", nargs="+", default=["bf16", "fp32"])
    args = ap.parse_args()
    names = ("pytorch_fused", "kernellab_torch", "kernellab_triton")
    meta = {"bench": "adamw", "gpu": torch.cuda.get_device_name(), "git_sha": git_sha(), **versions()}
    rows = []
    for dname in args.dtype:
        dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dname]
        setups = {n: _setup(args.config, dtype, n) for n in names}
        # correctness first: 3 steps from the same values and gradients
        for _ in range(3):
            for _, opt in setups.values():
                opt.step()
        ref = setups["pytorch_fused"][0]
        ulp = torch.finfo(dtype).eps
        errs = {}
        for n, (ps, _) in setups.items():
            # in storage ulps of |p| + lr (the tests' measure: an update near p = 0 has no
            # relative accuracy to speak of)
            errs[n] = max(float(((a.float() - b.float()).abs() / ((a.float().abs() + 1e-4) * ulp)).max())
                          for a, b in zip(ref, ps))  # fmt: skip
        numel = sum(p.numel() for p in ref)
        nbytes = 7 * numel * ref[0].element_size()
        dev = {n: timer.time_cuda_graph(opt.step, calls_per_graph=10) for n, (_, opt) in setups.items()}
        loop, _ = timer.paired_loop_ms({n: opt.step for n, (_, opt) in setups.items()}, dict.fromkeys(names, 20), 9)
        base = loop["pytorch_fused"]
        for n in names:
            d = dev[n].median_ms
            row = {**meta, "config": args.config, "dtype": dname, "optimizer": n, "tensors": len(ref),
                   "numel": numel, "device_ms": d, "gbps": nbytes / d / 1e6, "loop_ms": statistics.median(loop[n]),
                   "loop_rounds_ms": [round(v, 4) for v in loop[n]],
                   "loop_vs_pytorch_paired": timer.paired_ratio(loop[n], base),
                   "max_err_ulps_vs_pytorch_fused": errs[n]}  # fmt: skip
            rows.append(row)
            print(f"{dname} {n:18s} device {d:.3f} ms ({row['gbps']:.0f} GB/s)  loop {row['loop_ms']:.3f} ms "
                  f"(x{row['loop_vs_pytorch_paired']:.2f} paired)  max err {errs[n]:.2f} ulp")  # fmt: skip
    if args.out:
        import os

        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "adamw_bench.jsonl"), "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
