"""Where attention's forward + backward host time goes (issue 19: "the host path of
forward+backward at least as light as SDPA's"), at a tiny causal bf16 shape whose device
time is a few microseconds: us per call in a plain loop (paired rounds) of SDPA itself, the
public call naming each backend, the registry's callable, and the Triton launchers with no
autograd node (forward, backward, both); then a cProfile of the named Triton call.

    PYTHONPATH=src python lab/probe_attn_host.py [--out FILE.jsonl] [--shape 1,2,64,64]
                                                 [--profile triton|cuda|cuda_v8|...]

``--profile`` names the backend whose public call is cProfiled (and checked for host
synchronizations with ``torch.cuda.set_sync_debug_mode``); on an sm_90 GPU the Hopper
CUDA backends (``cuda``, ``cuda_v8``, ``cuda_v9``) are timed beside the others.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats

import torch
import torch.nn.functional as F

import kernellab
from kernellab.core import registry
from kernellab.harness import timer
from kernellab.harness.bench import git_sha, versions
from kernellab.ops.attention import triton as AT
from kernellab.ops.attention.reference import _align_grad


def _inside(q, k, v, g, scale, line, calls=200) -> None:
    """Inside a bare Python node: us per call of the launchers as the node runs them (the
    backward on autograd's device thread), which thread, its current device, and how many
    launches left the lean path for Triton's own (triton_support's LeanJIT._slow)."""
    import threading
    import time

    from kernellab import triton_support

    seen = {"fwd": 0.0, "bwd": 0.0, "threads": set(), "devices": set()}

    class Timed(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            t0 = time.perf_counter()
            o, lse = AT.forward(q, k, v, True, scale)
            seen["fwd"] += time.perf_counter() - t0
            ctx.save_for_backward(q, k, v, o, lse)
            return o

        @staticmethod
        def backward(ctx, dy):
            t0 = time.perf_counter()
            out = AT.backward(dy, *ctx.saved_tensors, True, scale)
            seen["bwd"] += time.perf_counter() - t0
            seen["threads"].add(threading.get_ident() == threading.main_thread().ident)
            if torch.cuda.is_available():
                seen["devices"].add(torch._C._cuda_getDevice())
            return out

    lean = triton_support._LEAN_JIT
    slow = {"n": 0}
    if lean is not None:
        orig = lean._slow

        def counted(self, grid, args, kw):
            slow["n"] += 1
            return orig(self, grid, args, kw)

        lean._slow = counted
    try:
        for _ in range(10):
            torch.autograd.grad(Timed.apply(q, k, v), (q, k, v), g)
        seen["fwd"] = seen["bwd"] = 0.0
        slow["n"] = 0
        for _ in range(calls):
            torch.autograd.grad(Timed.apply(q, k, v), (q, k, v), g)
        n_slow_node = slow["n"]
        slow["n"] = 0
        for _ in range(calls):
            torch.autograd.grad(kernellab.attention(q, k, v, causal=True, backend="triton"), (q, k, v), g)
        line["inside_fwd_us"] = round(seen["fwd"] / calls * 1e6, 2)
        line["inside_bwd_us"] = round(seen["bwd"] / calls * 1e6, 2)
        line["bwd_on_main_thread"] = sorted(seen["threads"])
        line["bwd_thread_devices"] = sorted(seen["devices"])
        line["slow_launches_per_call_node"] = n_slow_node / calls
        line["slow_launches_per_call_public"] = slow["n"] / calls
    finally:
        if lean is not None:
            lean._slow = orig
    for key in ("inside_fwd_us", "inside_bwd_us", "bwd_on_main_thread", "bwd_thread_devices",
                "slow_launches_per_call_node", "slow_launches_per_call_public"):  # fmt: skip
        print(f"{key:30s} {line[key]}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=None)
    p.add_argument("--shape", default="1,2,64,64")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--profile-calls", type=int, default=300)
    p.add_argument("--profile", default="triton", help="the backend whose call is cProfiled")
    a = p.parse_args(argv)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    shape = tuple(int(s) for s in a.shape.split(","))
    q, k, v = (torch.randn(*shape, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    g = torch.randn(*shape, device=dev, dtype=torch.bfloat16)
    scale = shape[-1] ** -0.5
    qd, kd, vd = q.detach(), k.detach(), v.detach()
    o, lse = AT.forward(qd, kd, vd, True, scale)
    tri = registry.get("attention", "triton")

    def grad_of(f):
        return lambda: torch.autograd.grad(f(), (q, k, v), g)

    class Noop(torch.autograd.Function):  # a Python node that launches nothing
        @staticmethod
        def forward(ctx, q, k, v):
            return torch.empty_like(q)

        @staticmethod
        def backward(ctx, dy):
            return dy, None, None

    class Direct(torch.autograd.Function):  # the launchers under a bare Python node
        @staticmethod
        def forward(ctx, q, k, v):
            o, lse = AT.forward(q, k, v, True, scale)
            ctx.save_for_backward(q, k, v, o, lse)
            return o

        @staticmethod
        def backward(ctx, dy):
            q, k, v, o, lse = ctx.saved_tensors
            return AT.backward(dy, q, k, v, o, lse, True, scale)

    fns = {
        "noop_node": lambda: torch.autograd.grad(Noop.apply(q, k, v), (q,), g),
        "mul_node": lambda: torch.autograd.grad(q * 2.0, (q,), g),
        "direct_node": grad_of(lambda: Direct.apply(q, k, v)),
        "sdpa": grad_of(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
        "sdpa_fwd": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        # the torch backend's guard: a Python hook that hands SDPA's backward an aligned dy
        "sdpa_hooked": grad_of(lambda: _align_grad(F.scaled_dot_product_attention(q, k, v, is_causal=True))),
        "triton": grad_of(lambda: kernellab.attention(q, k, v, causal=True, backend="triton")),
        "triton_fwd": lambda: kernellab.attention(q, k, v, causal=True, backend="triton"),
        "registry_triton": grad_of(lambda: tri(q, k, v, causal=True)),
        "launchers_fwd": lambda: AT.forward(qd, kd, vd, True, scale),
        "launchers_bwd": lambda: AT.backward(g, qd, kd, vd, o, lse, True, scale),
        "torch": grad_of(lambda: kernellab.attention(q, k, v, causal=True, backend="torch")),
        "default": grad_of(lambda: kernellab.attention(q, k, v, causal=True)),
    }
    if dev == "cuda":
        backends = ["sdpa_flash", "sdpa_cudnn"]
        if torch.cuda.get_device_capability() == (9, 0):
            backends += ["cuda", "cuda_v8", "cuda_v9", "cuda_v7"]
        for be in backends:
            fns[be] = grad_of(lambda be=be: kernellab.attention(q, k, v, causal=True, backend=be))
        fns["cuda_fwd"] = lambda: kernellab.attention(q, k, v, causal=True, backend="cuda")
    res = timer.paired_us(fns, lambda n: "sdpa", a.rounds)
    meta = {"git_sha": git_sha(), **versions(), "device": dev,
            "gpu": torch.cuda.get_device_name() if dev == "cuda" else None}  # fmt: skip
    line = {"probe": "attn_host", "shape": list(shape), **meta}
    for name, r in res.items():
        if isinstance(r, Exception):
            line[name] = f"{type(r).__name__}: {r}"
        else:
            line[name + "_us"], line[name + "_vs_sdpa"] = round(r[0], 2), round(r[1], 3)
    for k_, v_ in line.items():
        print(f"{k_:24s} {v_}")
    _inside(q, k, v, g, scale, line)
    f = fns[a.profile] if a.profile in fns else grad_of(
        lambda: kernellab.attention(q, k, v, causal=True, backend=a.profile)
    )
    for _ in range(20):
        f()
    if dev == "cuda":  # a host synchronization inside the call (it serializes host and device)
        import warnings

        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("warn")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            f()
        torch.cuda.set_sync_debug_mode("default")
        line["profile_backend"] = a.profile
        line["profile_syncs"] = [str(w.message)[:200] for w in caught]
        print("syncs in one call of", a.profile, ":", line["profile_syncs"])
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(a.profile_calls):
        f()
    if dev == "cuda":
        torch.cuda.synchronize()
    prof.disable()
    for key in ("tottime", "cumulative"):
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats(key).print_stats(35)
        print(s.getvalue())
    if a.out:
        with open(a.out, "a") as fh:
            fh.write(json.dumps(line) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
