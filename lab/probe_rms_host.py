"""Where rms_norm's forward+backward host time goes at 64x256 bf16 (issue 41's last item).

Paired plain-loop rounds (``timer.paired_us``), us per call, against PyTorch's F.rms_norm:
the public default, the Triton backend's kit callable with no registry, the launchers alone
(no autograd node), a Python node whose forward and backward only allocate (the floor of a
Python node), each with autograd's device threads as is and off; then a cProfile of the
default's forward+backward with the threads off (the backward's Python on this thread).

    PYTHONPATH=src python lab/probe_rms_host.py
"""

from __future__ import annotations

import contextlib
import cProfile
import pstats

import torch
import torch.nn.functional as F

import kernellab
from kernellab.core import registry
from kernellab.harness import timer
from kernellab.ops.norm_kernels.triton_kernels import norm_bwd, norm_fwd


class _Alloc(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return torch.empty_like(x)

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        return torch.empty_like(x), torch.empty_like(w)


def _nodes(x0, w0, eps):
    """Minimal nodes around the launchers: which half of the forward+backward costs what."""
    from kernellab.ops.norm_kernels.triton_kernels import norm_bwd, norm_fwd

    class FwdBwd(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            y, _, rstd = norm_fwd(x, w, None, eps, True)
            ctx.save_for_backward(x, w, rstd)
            return y

        @staticmethod
        def backward(ctx, dy):
            x, w, rstd = ctx.saved_tensors
            dx, dw, _ = norm_bwd(dy, x, w, None, rstd, True, False)
            return dx, dw

    class FwdOnly(FwdBwd):
        @staticmethod
        def backward(ctx, dy):
            x, w, rstd = ctx.saved_tensors
            return torch.empty_like(x), torch.empty_like(w)

    class BwdOnly(FwdBwd):
        @staticmethod
        def forward(ctx, x, w):
            rstd = torch.empty(x.shape[0], device=x.device, dtype=torch.float32)
            ctx.save_for_backward(x, w, rstd)
            return torch.empty_like(x)

    return FwdBwd.apply, FwdOnly.apply, BwdOnly.apply


def _launch_kinds():
    from kernellab.ops.norm_kernels import triton_kernels as tk

    for key, plan in tk._PLANS.items():
        for b in plan:
            if hasattr(b, "hit") and b.hit is not None:
                launch = b.hit[0]
                name = getattr(launch, "__qualname__", None) or type(launch).__name__
                scratch = [getattr(launch, k, None) for k in ("global_scratch_size", "profile_scratch_size")]
                print("plan", key[0], key[1], "launch:", name, "scratch", scratch, "tensors", b.tensors)


def main() -> int:
    dev, bf = "cuda", torch.bfloat16
    x = torch.randn(64, 256, device=dev, dtype=bf, requires_grad=True)
    w = (1 + 0.1 * torch.randn(256, device=dev)).to(bf).requires_grad_()
    dy = torch.randn(64, 256, device=dev, dtype=bf)
    xd, wd = x.detach(), w.detach()
    y0, _, rstd = norm_fwd(xd, wd, None, 1e-6, True)
    kit = registry.get("rms_norm", "triton").fn

    def fb(f, args):
        return lambda: torch.autograd.grad(f(*args), args, dy)

    fb_node, f_node, b_node = _nodes(xd, wd, 1e-6)
    cases = {
        "node fwd+bwd launches": fb(fb_node, (x, w)),
        "node fwd launch only": fb(f_node, (x, w)),
        "node bwd launch only": fb(b_node, (x, w)),
        "torch": fb(lambda x, w: F.rms_norm(x, (256,), w, 1e-6), (x, w)),
        "default": fb(lambda x, w: kernellab.rms_norm(x, w), (x, w)),
        "triton backend": fb(lambda x, w: kernellab.rms_norm(x, w, backend="triton"), (x, w)),
        "kit callable": fb(lambda x, w: kit(x, w, 1e-6), (x, w)),
        "py node, alloc only": fb(_Alloc.apply, (x, w)),
        "launchers, no node": lambda: (
            norm_fwd(xd, wd, None, 1e-6, True),
            norm_bwd(dy, xd, wd, None, rstd, True, False),
        ),
        "torch fwd (grad on)": lambda: F.rms_norm(x, (256,), w, 1e-6),
        "default fwd (grad on)": lambda: kernellab.rms_norm(x, w),
        "torch fwd (no grad)": lambda: F.rms_norm(xd, (256,), wd, 1e-6),
        "default fwd (no grad)": lambda: kernellab.rms_norm(xd, wd),
        "norm_fwd alone": lambda: norm_fwd(xd, wd, None, 1e-6, True),
        "norm_bwd alone": lambda: norm_bwd(dy, xd, wd, None, rstd, True, False),
        "empty_like": lambda: torch.empty_like(xd),
    }
    for setting in ("threads as is", "threads off"):
        off = setting == "threads off"
        with torch.autograd.set_multithreading_enabled(False) if off else contextlib.nullcontext():
            got = timer.paired_us(cases, lambda k: "torch", 11)
        for k, r in got.items():
            if isinstance(r, Exception):
                print(f"{setting:14s} {k:26s} error {r!r}")
            else:
                print(f"{setting:14s} {k:26s} {r[0]:8.1f} us  {r[1]:5.2f}x torch fwd+bwd", flush=True)
    _launch_kinds()
    import triton.testing

    for k in ("norm_fwd alone", "norm_bwd alone"):
        print(k, "device us", round(1e3 * triton.testing.do_bench(cases[k], warmup=20, rep=100), 2))
    from torch.profiler import ProfilerActivity, profile

    for k in ("default", "torch", "node fwd launch only"):
        for _ in range(50):
            cases[k]()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                cases[k]()
            torch.cuda.synchronize()
        print("profile", k)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
    f = cases["default"]
    with torch.autograd.set_multithreading_enabled(False):
        for _ in range(200):
            f()
        torch.cuda.synchronize()
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(3000):
            f()
        torch.cuda.synchronize()
        pr.disable()
    pstats.Stats(pr).sort_stats("tottime").print_stats(30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
