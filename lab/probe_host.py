"""Where the host time of one op's forward+backward goes (GPU): the same op through
PyTorch, through a bare ``autograd.Function`` wrapping PyTorch's own kernels (the floor
of any Python autograd node), through our raw launchers, and through kernellab's public
call; eager and inside ``torch.compile``. Per-call microseconds at a tiny shape, where
the device time is negligible.

    PYTHONPATH=src python lab/probe_host.py [--out DIR] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys

import torch
import torch.nn.functional as F

import kernellab
from kernellab.harness import timer
from kernellab.harness.bench import git_sha, versions


def per_call_us(fn, calls=300) -> float:
    """us per call in a plain loop (harness.timer.loop_ms: median of 5 rounds)."""
    return timer.loop_ms(fn, calls) * 1e3


def print_cprofile(title: str, fn, calls: int, top: int) -> None:
    """cProfile of ``calls`` calls of ``fn`` (GPU work synchronized at both ends): the
    ``top`` functions by their own time."""
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    print(f"--- cProfile: {title}")
    print("\n".join(ln[:180] for ln in buf.getvalue().splitlines() if ln.strip()))


class _TorchGelu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.ops.aten.gelu(x, approximate="tanh")

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        return torch.ops.aten.gelu_backward(dy, x, approximate="tanh")


class _TorchLN(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b):
        y, mean, rstd = torch.ops.aten.native_layer_norm(x, (x.shape[-1],), w, b, 1e-5)
        ctx.save_for_backward(x, w, b, mean, rstd)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w, b, mean, rstd = ctx.saved_tensors
        return torch.ops.aten.native_layer_norm_backward(
            dy, x, (x.shape[-1],), mean, rstd, w, b, (True, True, True)
        )


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    p.add_argument("--profile", action="store_true")
    args = p.parse_args()
    dev, bf = "cuda", torch.bfloat16
    rows = []

    def rec(name, us, base=None):
        r = {"probe": name, "us": round(us, 2)}
        if base:
            r["vs_torch"] = round(us / base, 2)
        rows.append(r)
        print(f"{name:60s} {us:8.2f} us" + (f"   {us / base:5.2f}x" if base else ""), flush=True)

    x = torch.randn(64, 256, device=dev, dtype=bf, requires_grad=True)
    w = torch.randn(256, device=dev, dtype=bf, requires_grad=True)
    b = torch.randn(256, device=dev, dtype=bf, requires_grad=True)
    dy = torch.randn(64, 256, device=dev, dtype=bf)

    def fb(f):
        return lambda: f().backward(dy)

    # -- the floor: an empty-ish autograd graph
    base = per_call_us(fb(lambda: F.gelu(x, approximate="tanh")))
    rec("gelu fwdbwd torch", base)
    rec("gelu fwdbwd autograd.Function(aten gelu, aten gelu_backward)", per_call_us(fb(lambda: _TorchGelu.apply(x))), base)
    rec("gelu fwdbwd kernellab triton", per_call_us(fb(lambda: kernellab.gelu(x, backend="triton"))), base)
    rec("gelu fwdbwd kernellab cuda", per_call_us(fb(lambda: kernellab.gelu(x, backend="cuda"))), base)
    impl = kernellab.get("gelu", "triton")
    rec("gelu fwdbwd triton impl.fn (no registry, no validation)", per_call_us(fb(lambda: impl.fn(x))), base)
    with torch.no_grad():
        b0 = per_call_us(lambda: F.gelu(x, approximate="tanh"))
        rec("gelu fwd torch", b0)
        rec("gelu fwd autograd.Function", per_call_us(lambda: _TorchGelu.apply(x)), b0)
        rec("gelu fwd kernellab triton", per_call_us(lambda: kernellab.gelu(x, backend="triton")), b0)
        rec("gelu fwd triton impl.fn", per_call_us(lambda: impl.fn(x)), b0)

    base = per_call_us(fb(lambda: F.layer_norm(x, (256,), w, b)))
    rec("layer_norm fwdbwd torch", base)
    rec("layer_norm fwdbwd autograd.Function(aten native_layer_norm)", per_call_us(fb(lambda: _TorchLN.apply(x, w, b))), base)
    for be in ("triton", "cuda"):
        rec(f"layer_norm fwdbwd kernellab {be}", per_call_us(fb(lambda: kernellab.layer_norm(x, w, b, backend=be))), base)
    lnimpl = kernellab.get("layer_norm", "triton")
    rec("layer_norm fwdbwd triton impl.fn", per_call_us(fb(lambda: lnimpl.fn(x, w, b))), base)
    from kernellab.ops.norm_kernels import triton_kernels as lt

    xd, wd, bd = x.detach(), w.detach(), b.detach()
    y, mean, rstd = lt.norm_fwd(xd, wd, bd, 1e-5, False)
    rec("layer_norm raw norm_fwd launcher", per_call_us(lambda: lt.norm_fwd(xd, wd, bd, 1e-5, False)))
    rec("layer_norm raw norm_bwd launcher", per_call_us(lambda: lt.norm_bwd(dy, xd, wd, mean, rstd, False, True)))
    rec("torch.empty(64,256) bf16", per_call_us(lambda: torch.empty((64, 256), dtype=bf, device=dev)))
    rec("torch.empty_like(x)", per_call_us(lambda: torch.empty_like(xd)))

    # -- attention and cross_entropy: eager, and inside torch.compile
    q = torch.randn(1, 2, 64, 64, device=dev, dtype=bf, requires_grad=True)
    do = torch.randn_like(q)
    base = per_call_us(lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True).backward(do))
    rec("attention fwdbwd torch", base)
    ka = lambda: kernellab.attention(q, q, q, causal=True, backend="triton")  # noqa: E731
    rec("attention fwdbwd triton eager", per_call_us(lambda: ka().backward(do)), base)
    ca = torch.compile(lambda q: kernellab.attention(q, q, q, causal=True, backend="triton"), fullgraph=True)
    ct = torch.compile(lambda q: F.scaled_dot_product_attention(q, q, q, is_causal=True), fullgraph=True)
    rec("attention fwdbwd torch compiled", per_call_us(lambda: ct(q).backward(do)), base)
    rec("attention fwdbwd triton compiled", per_call_us(lambda: ca(q).backward(do)), base)
    with torch.no_grad():
        qd = q.detach()
        b0 = per_call_us(lambda: F.scaled_dot_product_attention(qd, qd, qd, is_causal=True))
        rec("attention fwd torch", b0)
        rec("attention fwd triton eager", per_call_us(lambda: kernellab.attention(qd, qd, qd, causal=True, backend="triton")), b0)
        from kernellab.ops.attention import triton as at

        rec("attention raw forward launcher", per_call_us(lambda: at.forward(qd, qd, qd, True, 0.125)), b0)

    lg = torch.randn(64, 256, device=dev, dtype=bf, requires_grad=True)
    tg = torch.randint(0, 256, (64,), device=dev)
    base = per_call_us(lambda: F.cross_entropy(lg, tg).backward())
    rec("cross_entropy fwdbwd torch", base)
    rec("cross_entropy fwdbwd triton eager", per_call_us(lambda: kernellab.cross_entropy(lg, tg, backend="triton").backward()), base)
    cc = torch.compile(lambda a, t: kernellab.cross_entropy(a, t, backend="triton"), fullgraph=True)
    rec("cross_entropy fwdbwd triton compiled", per_call_us(lambda: cc(lg, tg).backward()), base)
    cl = torch.compile(lambda a: kernellab.layer_norm(a, w, b, backend="triton"), fullgraph=True)
    ctl = torch.compile(lambda a: F.layer_norm(a, (256,), w, b), fullgraph=True)
    b1 = per_call_us(fb(lambda: ctl(x)))
    rec("layer_norm fwdbwd torch compiled", b1)
    rec("layer_norm fwdbwd triton compiled", per_call_us(fb(lambda: cl(x))), b1)

    if args.profile:
        for name, fn in (
            ("layer_norm triton fwdbwd", fb(lambda: kernellab.layer_norm(x, w, b, backend="triton"))),
            ("attention triton compiled fwdbwd", lambda: ca(q).backward(do)),
        ):
            print_cprofile(f"{name}, 200 calls", fn, calls=200, top=22)
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as pr:
            for _ in range(50):
                ca(q).backward(do)
            torch.cuda.synchronize()
        print(pr.key_averages().table(sort_by="self_cpu_time_total", row_limit=20, max_name_column_width=70))
    if args.out:
        meta = {"gpu": torch.cuda.get_device_name(), "git_sha": git_sha(), **versions()}
        with open(f"{args.out}/probe_host.jsonl", "a") as f:
            for r in rows:
                f.write(json.dumps({**meta, **r}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
