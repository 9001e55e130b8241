"""GPT-2 small training step, wall ms per step: PyTorch's ops against kernellab's, in each
mode (eager, torch.compile, torch.compile with CUDA graphs), in one run (GPU).

    PYTHONPATH=src python scripts/gpt_step.py --out DIR [--bt 8x1024 4x256] [--modes ...]
        [--sets pytorch kl_triton kl_triton_mm kl_default] [--profile SET:MODE:BxT]

Op sets (every set runs the same model, the same bf16 weights and the same fused AdamW):
- ``pytorch``: F.layer_norm, F.gelu(tanh), SDPA (causal), +, F.cross_entropy, F.linear.
- ``kl_triton``: kernellab's Triton kernels for layer_norm, gelu, attention, add and
  cross_entropy; the linear layers on cuBLAS (F.linear).
- ``kl_triton_mm``: as kl_triton, and the linear layers through kernellab.matmul (Triton).
- ``kl_default``: every op through kernellab with backend=None (its default per op),
  linear layers through kernellab.matmul's default.

A step is forward + loss + backward + AdamW step; the model's forward and loss are what
torch.compile sees (the optimizer stays eager, fused). Timing: warm-up steps (compilation
and autotuning included) excluded, then N steps between two synchronizations: ms/step =
wall / N, what a training loop sees. Random token ids: speed does not depend on the data
(the training run on real text is `kernellab train gpt`).
"""

from __future__ import annotations

import argparse
import json
import math
import time
import traceback

import torch
import torch.nn.functional as F
from torch import nn

import kernellab
from kernellab.harness.bench import git_sha, versions


def op_set(name: str) -> dict:
    if name == "pytorch":
        return dict(
            ln=lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b),
            gelu=lambda x: F.gelu(x, approximate="tanh"),
            attn=lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
            add=lambda a, b: a + b,
            ce=F.cross_entropy,
            linear=F.linear,
        )
    be = {"kl_triton": "triton", "kl_triton_mm": "triton", "kl_default": None}[name]
    linear = F.linear
    if name in ("kl_triton_mm", "kl_default"):

        def linear(x, w, b=None):
            y = kernellab.matmul(x.reshape(-1, x.shape[-1]), w.t(), b, backend=be)
            return y.view(*x.shape[:-1], w.shape[0])

    return dict(
        qkv_contiguous=True,
        ln=lambda x, w, b: kernellab.layer_norm(x, w, b, backend=be),
        gelu=lambda x: kernellab.gelu(x, backend=be),
        attn=lambda q, k, v: kernellab.attention(q, k, v, causal=True, backend=be),
        add=lambda a, b: kernellab.add(a, b, backend=be),
        ce=lambda logits, t: kernellab.cross_entropy(logits, t, backend=be),
        linear=linear,
    )


class GPT(nn.Module):
    """GPT-2 (pre-LN blocks, learned positions, tied embedding / head)."""

    def __init__(self, ops: dict, vocab=50304, ctx=1024, dim=768, layers=12, heads=12):
        super().__init__()
        self.ops, self.heads = ops, heads
        self.qkv_contiguous = ops.get("qkv_contiguous", False)
        self.wte = nn.Parameter(torch.randn(vocab, dim) * 0.02)
        self.wpe = nn.Parameter(torch.randn(ctx, dim) * 0.01)
        self.blocks = nn.ModuleList()
        for _ in range(layers):
            blk = nn.Module()
            blk.ln1_w, blk.ln1_b = nn.Parameter(torch.ones(dim)), nn.Parameter(torch.zeros(dim))
            blk.ln2_w, blk.ln2_b = nn.Parameter(torch.ones(dim)), nn.Parameter(torch.zeros(dim))
            blk.qkv, blk.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
            blk.fc, blk.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
            for lin in (blk.qkv, blk.proj, blk.fc, blk.fc2):
                nn.init.normal_(lin.weight, std=0.02)
                nn.init.zeros_(lin.bias)
            self.blocks.append(blk)
        self.lnf_w, self.lnf_b = nn.Parameter(torch.ones(dim)), nn.Parameter(torch.zeros(dim))

    def forward(self, idx, targets):
        o = self.ops
        b, t = idx.shape
        x = self.wte[idx] + self.wpe[:t]
        d = x.shape[-1]
        h = self.heads
        for blk in self.blocks:
            y = o["ln"](x, blk.ln1_w, blk.ln1_b)
            qkv = o["linear"](y, blk.qkv.weight, blk.qkv.bias)
            qkv = qkv.view(b, t, 3, h, d // h).permute(2, 0, 3, 1, 4)
            if self.qkv_contiguous:
                # kernellab's attention folds [B, H] into one dimension: q, k, v permuted
                # out of qkv would each be copied in its forward and again in its backward
                # (2.7 ms of copy kernels per step at 8 x 1024 in the profile); one copy here.
                qkv = qkv.contiguous()
            q, k, v = qkv.unbind(0)
            a = o["attn"](q, k, v).transpose(1, 2).reshape(b, t, d)
            x = o["add"](x, o["linear"](a, blk.proj.weight, blk.proj.bias))
            y = o["ln"](x, blk.ln2_w, blk.ln2_b)
            y = o["linear"](
                o["gelu"](o["linear"](y, blk.fc.weight, blk.fc.bias)), blk.fc2.weight, blk.fc2.bias
            )
            x = o["add"](x, y)
        x = o["ln"](x, self.lnf_w, self.lnf_b)
        logits = o["linear"](x, self.wte)
        return o["ce"](logits.view(b * t, -1), targets.view(b * t))


def time_steps(set_name, mode, bsz, t, warmup, steps, seed=0):
    torch.manual_seed(seed)
    model = GPT(op_set(set_name)).cuda().to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    fwd = model
    if mode == "compile":
        fwd = torch.compile(model)
    elif mode == "compile-cudagraphs":
        fwd = torch.compile(model, mode="reduce-overhead")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    idx = torch.randint(0, 50257, (bsz, t), device="cuda", generator=gen)
    tgt = torch.randint(0, 50257, (bsz, t), device="cuda", generator=gen)

    def step():
        if mode == "compile-cudagraphs":
            torch.compiler.cudagraph_mark_step_begin()
        loss = fwd(idx, tgt)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    t0 = time.perf_counter()
    for _ in range(warmup):
        loss = step()
    first_loss = float(loss)
    torch.cuda.synchronize()
    warm_s = time.perf_counter() - t0
    times = []
    for _ in range(3):  # three timed rounds; median
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) / steps * 1e3)
    times.sort()
    return {
        "ms_per_step": times[1],
        "ms_min": times[0],
        "ms_max": times[2],
        "warmup_s": warm_s,
        "loss": first_loss,
    }


def profile(set_name, mode, bsz, t):
    torch.manual_seed(0)
    model = GPT(op_set(set_name)).cuda().to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    fwd = torch.compile(model) if mode.startswith("compile") else model
    idx = torch.randint(0, 50257, (bsz, t), device="cuda")
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


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    p.add_argument("--bt", nargs="+", default=["8x1024", "4x256"])
    p.add_argument("--modes", nargs="+", default=["eager", "compile", "compile-cudagraphs"])
    p.add_argument("--sets", nargs="+", default=["pytorch", "kl_triton", "kl_triton_mm", "kl_default"])
    p.add_argument("--warmup", type=int, default=6)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--profile", default=None, help="SET:MODE:BxT, e.g. kl_triton:eager:8x1024")
    args = p.parse_args()
    if args.profile:
        s, m, bt = args.profile.split(":")
        b, t = map(int, bt.split("x"))
        profile(s, m, b, t)
        return 0
    torch.backends.cuda.matmul.allow_tf32 = True
    meta = {"gpu": torch.cuda.get_device_name(), "git_sha": git_sha(), **versions()}
    rows = []
    out = open(f"{args.out}/gpt_step.jsonl", "a") if args.out else None
    for bt in args.bt:
        b, t = map(int, bt.split("x"))
        for mode in args.modes:
            for s in args.sets:
                row = {
                    "bench": "gpt2_step",
                    "model": "gpt2-124M",
                    "dtype": "bf16",
                    "B": b,
                    "T": t,
                    "mode": mode,
                    "ops": s,
                }
                try:
                    row.update(time_steps(s, mode, b, t, args.warmup, args.steps))
                except Exception as e:  # noqa: BLE001 - one failing configuration does not end the run
                    row["error"] = f"{type(e).__name__}: {e}"[:400]
                    traceback.print_exc()
                torch._dynamo.reset()
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
                    ratio = f" ({v / base:.2f}x)" if base and not math.isnan(base) else ""
                    cells.append(f"{r['ops']}={v:.2f}{ratio}")
            print(f"{b}x{t} {mode:20s} " + "  ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
