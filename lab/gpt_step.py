"""GPT-2 small training step, wall ms per step: PyTorch's ops against kernellab's, in each
mode (eager, torch.compile, torch.compile with CUDA graphs, the whole compiled step as one
CUDA graph), in one run (GPU).

    PYTHONPATH=src python lab/gpt_step.py --out DIR [--bt 8x1024 4x256] [--modes ...]
        [--sets pytorch kl_triton kl_triton_mm kl_default] [--profile SET:MODE:BxT]

Op sets (kernellab.models.gpt's model; every set runs the same bf16 weights and,
unless it says otherwise, PyTorch's fused AdamW):
- ``pytorch``: F.layer_norm, F.gelu(tanh), SDPA (causal), +, F.cross_entropy, F.linear.
- ``kl_triton``: kernellab's Triton kernels for layer_norm, gelu, attention, add and
  cross_entropy; the linear layers on cuBLAS (F.linear). In eager mode the transformer
  blocks run under one autograd node (kernellab.models.gpt's fused blocks), which
  replays CUDA graphs of itself after its first call at a shape.
- ``kl_triton_adamw`` / ``kl_default_adamw``: as kl_triton / kl_default, the optimizer
  kernellab.optim.AdamW's Triton backend (one launch for all tensors) in place of
  PyTorch's fused AdamW.
- ``kl_triton_nograph``: the same, the fused blocks launching their kernels one by one.
- ``kl_triton_unfused``: the same kernels, one autograd node per op in eager mode.
- ``kl_triton_mm``: as kl_triton, and the linear layers through kernellab.matmul (Triton).
- ``kl_default``: every op through kernellab with backend=None (its default per op),
  linear layers through kernellab.matmul's default.

A step is forward + loss + backward + AdamW step; the model's forward and loss are what
torch.compile sees (the optimizer stays eager, fused; in compile-step-graph the whole step,
optimizer included, is one CUDA graph). Timing: warm-up steps (compilation
and autotuning included) excluded, then N steps between two synchronizations: ms/step =
wall / N, what a training loop sees. The sets of one (shape, mode) are timed in
alternating rounds (see time_interleaved): this host's speed drifts between runs. Random token ids: speed does not depend on the data
(the training run on real text is `kernellab train gpt`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import traceback
from typing import NamedTuple

import torch

from kernellab.harness.bench import git_sha, versions
from kernellab.models import gpt


class OpSet(NamedTuple):
    """kernellab.models.gpt.make's backends, matmul, fuse and graphs (see its docstring) and
    the Trainer's optimizer."""

    backends: str | None
    matmul: str | None
    fuse: bool = True
    graphs: bool = True
    optimizer: str = "pytorch"


SETS = {
    "pytorch": OpSet("pytorch", "pytorch"),
    "kl_triton": OpSet("triton", "pytorch"),
    "kl_triton_adamw": OpSet("triton", "pytorch", optimizer="triton"),
    "kl_triton_nograph": OpSet("triton", "pytorch", graphs=False),
    "kl_triton_unfused": OpSet("triton", "pytorch", fuse=False),
    "kl_triton_mm": OpSet("triton", "triton"),
    "kl_default": OpSet(None, None),
    "kl_default_adamw": OpSet(None, None, optimizer="triton"),
}


def _model(set_name):
    s = SETS[set_name]
    return gpt.make("gpt2", s.backends, s.matmul, "cuda", torch.bfloat16, seed=0, fuse=s.fuse, graphs=s.graphs)


def _batch(bsz, t, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    idx = torch.randint(0, 50257, (bsz, t), device="cuda", generator=gen)
    tgt = torch.randint(0, 50257, (bsz, t), device="cuda", generator=gen)
    return idx, tgt


def time_interleaved(sets, mode, bsz, t, warmup, steps, rounds):
    """One row per op set in ``mode`` (gpt.time_interleaved: alternating rounds, the ratio
    paired with PyTorch's round): this host's speed drifts by up to 1.6x between runs
    (PyTorch's own eager step at 4x256: 15.4 to 25.1 ms), so sets timed one after the
    other are not comparable."""
    batch = _batch(bsz, t)
    builders = {s: (lambda s=s: (gpt.Trainer(_model(s), mode, lr=1e-4, optimizer=SETS[s].optimizer), batch)) for s in sets}
    return gpt.time_interleaved(builders, warmup, steps, rounds, on_error=lambda e: traceback.print_exc())


def profile(set_name, mode, bsz, t, pyprofile=False):
    model = _model(set_name)
    opt = gpt.Trainer(model, "eager", lr=1e-4, optimizer=SETS[set_name].optimizer).opt
    fwd = torch.compile(model) if mode.startswith("compile") else model
    idx = torch.randint(0, 50257, (bsz, t), device="cuda")
    print(f"profile {set_name} {mode} {bsz}x{t}")
    for _ in range(3):
        fwd(idx, idx).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprof

    with tprof(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        for _ in range(3):
            fwd(idx, idx).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
    print(p.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=60))
    print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60))
    ev = p.events()
    cpu_us = sum(e.self_cpu_time_total for e in ev) / 3
    dev_us = sum(e.self_device_time_total for e in ev if e.device_type == torch.autograd.DeviceType.CUDA) / 3
    syncs = sum(1 for e in ev if "Synchronize" in e.name or "Memcpy" in e.name or e.name == "aten::item") / 3
    print(f"per step: host self time {cpu_us / 1e3:.2f} ms, device time {dev_us / 1e3:.2f} ms, sync/copy events {syncs:.0f}")
    if pyprofile:
        # Where the host time goes in Python (cProfile over 5 steps): the torch profiler
        # above names CompiledFxGraph's own time, not the functions inside it.
        import cProfile
        import pstats

        pr = cProfile.Profile()
        pr.enable()
        for _ in range(5):
            fwd(idx, idx).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        pr.disable()
        st = pstats.Stats(pr)
        st.sort_stats("tottime").print_stats(30)
        st.sort_stats("cumulative").print_stats(40)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    p.add_argument("--bt", nargs="+", default=["8x1024", "4x256"])
    p.add_argument("--modes", nargs="+", default=list(gpt.MODES))
    p.add_argument("--sets", nargs="+", default=list(SETS), choices=list(SETS))
    p.add_argument("--warmup", type=int, default=6)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=5, help="alternating timing rounds per set")
    p.add_argument("--profile", default=None, help="SET:MODE:BxT, e.g. kl_triton:eager:8x1024")
    p.add_argument("--pyprofile", action="store_true", help="with --profile: cProfile 5 more steps")
    args = p.parse_args()
    if args.profile:
        s, m, bt = args.profile.split(":")
        b, t = map(int, bt.split("x"))
        profile(s, m, b, t, args.pyprofile)
        return 0
    torch.backends.cuda.matmul.allow_tf32 = True
    meta = {"gpu": torch.cuda.get_device_name(), "git_sha": git_sha(), **versions()}
    rows = []
    if args.out:
        os.makedirs(args.out, exist_ok=True)  # (a missing DIR cost a device call its rows once)
    out = open(f"{args.out}/gpt_step.jsonl", "a") if args.out else None
    for bt in args.bt:
        b, t = map(int, bt.split("x"))
        for mode in args.modes:
            timed = time_interleaved(args.sets, mode, b, t, args.warmup, args.steps, args.rounds)
            torch._dynamo.reset()
            for s in args.sets:
                row = {"bench": "gpt2_step", "model": "gpt2-124M", "dtype": "bf16", "B": b, "T": t,
                       "mode": mode, "ops": s, "optimizer": SETS[s].optimizer, "interleaved": True, **timed[s]}  # fmt: skip
                be, mm = SETS[s].backends, SETS[s].matmul
                if be is None or mm is None:  # what the default resolved to at this shape
                    chosen = gpt.op_set(be, mm)["chosen"]
                    row["resolved"] = gpt.resolve_defaults(chosen, gpt.CONFIGS["gpt2"], b, t, torch.bfloat16, "cuda",
                                                           compiling=mode.startswith("compile"))  # fmt: skip
                rows.append(row)
                print(json.dumps(row), flush=True)
                if out:
                    out.write(json.dumps({**meta, **row}) + "\n")
                    out.flush()
    print(
        f"\nGPT-2 small training step, bf16, {meta['gpu']}, ms/step (ratio to PyTorch ops in the same mode)"
    )
    for bt in args.bt:
        b, t = map(int, bt.split("x"))
        for mode in args.modes:
            sel = [r for r in rows if r["B"] == b and r["T"] == t and r["mode"] == mode]
            base = next((r.get("ms_per_step") for r in sel if r["ops"] == "pytorch"), None)
            cells = []
            for r in sel:
                v = r.get("ms_per_step")
                if v is None:
                    cells.append(f"{r['ops']}=error")
                else:
                    ratio = f" ({v / base:.2f}x, paired {r['ratio_paired']:.2f}x)" if base and not math.isnan(base) else ""
                    cells.append(f"{r['ops']}={v:.2f}{ratio}")
            print(f"{b}x{t} {mode:20s} " + "  ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
