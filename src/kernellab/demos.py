"""The lecture's demonstrations, as numbers.

``demo_gelu``: manual, torch, cuda, triton, compile GeLU side by side - time, GB/s, % of the
measured copy bandwidth (the benchmark engine), and how many kernels each launches per call
(the profiler): one for the fused ones, several for manual.

``demo_mlp``: the MLP trained for a few steps twice - once letting the CPU run ahead, once
with ``loss.item()`` every step - and, from a profiler trace of each, how far the CPU runs
ahead of the GPU and how much of the GPU's time is idle.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from kernellab import device as _device
from kernellab.core import registry
from kernellab.harness.bench import bench
from kernellab.models import mlp as mlp_model
from kernellab.profile.torchprof import op_call, profile_call, trace_summary

GELU_BACKENDS = ("manual", "torch", "cuda", "triton", "compile")


def demo_gelu(shape=None, dtype=torch.float32, budget_s: float = 0.5) -> list[dict]:
    dev = _device.default_device()
    shape = tuple(shape or ((2**24,) if dev == "cuda" else (2**14,)))
    names = [b for b in GELU_BACKENDS if registry.get("gelu", b).why_unavailable(dev) is None]
    rows = bench("gelu", backends=names, shapes=[shape], dtypes=[dtype], budget_s=budget_s)
    for r in rows:
        if r["status"] != "ok":
            continue
        if dev == "cuda":
            prof = profile_call(op_call("gelu", r["backend"], shape, dtype), iters=5)
            r["kernels_per_call"] = prof.kernels_per_call
            r["kernels"] = [k.name for k in prof.rows]
        else:
            r["kernels_per_call"] = None  # no GPU: nothing is launched
    return rows


def demo_mlp(dim=128, layers=16, batch=128, steps=5, gelu_backend=None, trace_dir=None) -> dict:
    dev = _device.default_device()
    model, x, opt = mlp_model.make(dim, layers, batch, dev, gelu_backend)
    for i in range(3):  # warm-up: kernels compiled, allocator and cuBLAS handles ready
        mlp_model.train_step(model, x, opt, i)
    trace_dir = Path(trace_dir or tempfile.mkdtemp(prefix="kernellab-mlp-"))
    trace_dir.mkdir(parents=True, exist_ok=True)
    out = {
        "device": _device.gpu_name(),
        "dim": dim,
        "layers": layers,
        "batch": batch,
        "steps": steps,
        "gelu_backend": model.gelu_backend or registry.default_backend("gelu", dev),
        "runs": [],
    }
    for sync in (False, True):
        label = "loss.item() every step" if sync else "no sync (CPU runs ahead)"
        step_ms = mlp_model.run(model, x, opt, steps, sync_loss=sync)  # timed without the profiler
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev == "cuda" else [])
        with profile(activities=activities) as prof:
            mlp_model.run(model, x, opt, steps, sync_loss=sync)
        path = trace_dir / f"mlp_{'sync' if sync else 'nosync'}.json"
        prof.export_chrome_trace(str(path))
        summ = trace_summary(path)
        out["runs"].append(
            {
                "mode": label,
                "sync_loss": sync,
                "step_ms": step_ms,
                "mean_run_ahead_us": summ["mean_run_ahead_us"],
                "gpu_idle_us": summ["gpu_idle_us"] if summ["kernels"] else None,
                "gpu_idle_frac": summ["gpu_idle_frac"],
                "kernels_per_step": (summ["kernels"] / steps) if summ["kernels"] else None,
                "trace": str(path),
                "per_step_run_ahead_us": [s.run_ahead_us for s in summ["steps"]],
            }
        )
    if dev != "cuda":
        out["note"] = "no CUDA device: step times only; run-ahead and GPU idle need a GPU"
    return out
