"""Host cost of the launch paths, one number each (GPU): torch's op, our public call, the
same Triton kernel through Triton's own launcher and through triton_support's lean one;
forward and forward+backward; plus a torch.compile(fullgraph=True) of our Triton ops with
Inductor's output code searched for our kernel names.

    PYTHONPATH=src python lab/probe_launch.py [--out DIR]

Method: N back-to-back calls at a tiny shape (the device time is a few microseconds), the
host clock until the last call returns, then one synchronize; median of 5 rounds.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

import kernellab
from kernellab.harness import timer
from kernellab.harness.bench import git_sha, versions


def per_call_us(fn, calls=400) -> float:
    """us per call in a plain loop (harness.timer.loop_ms: median of 5 rounds)."""
    return timer.loop_ms(fn, calls) * 1e3


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    p.add_argument("--parts", action="store_true", help="raw launchers alone, and cProfile of them")
    args = p.parse_args()
    if args.parts:
        return parts()
    dev = "cuda"
    bf = torch.bfloat16
    rows = []

    def rec(name, us, base=None):
        r = {"probe": name, "us": round(us, 2)}
        if base:
            r["vs_torch"] = round(us / base, 2)
        rows.append(r)
        print(f"{name:55s} {us:8.2f} us" + (f"   {us / base:5.2f}x torch" if base else ""), flush=True)

    x = torch.randn(64, 256, device=dev, dtype=bf)
    xg = x.clone().requires_grad_(True)
    dy = torch.randn_like(x)
    w = torch.randn(256, device=dev, dtype=bf, requires_grad=True)
    b = torch.randn(256, device=dev, dtype=bf, requires_grad=True)

    # --- raw launch paths of the same Triton kernel
    from kernellab.ops.gelu import triton as gt

    y = torch.empty_like(x)
    k = gt._gelu_fwd_kernel
    n = x.numel()
    rec(
        "triton gelu kernel: Triton's JIT launcher",
        per_call_us(lambda: k._slow((1,), (x, y, n), {"BLOCK": 8192, "num_warps": 8})),
    )
    rec("triton gelu kernel: lean launcher", per_call_us(lambda: k[(1,)](x, y, n, BLOCK=8192, num_warps=8)))
    y2 = torch.empty_like(x)
    k._slow((1,), (x, y2, n), {"BLOCK": 8192, "num_warps": 8})
    k[(1,)](x, y, n, BLOCK=8192, num_warps=8)
    torch.cuda.synchronize()
    rec("lean == JIT output (1 = yes)", float(torch.equal(y, y2)))

    cases = {
        "gelu": (lambda: F.gelu(x, approximate="tanh"), lambda be: kernellab.gelu(x, backend=be)),
        "add": (lambda: x + x, lambda be: kernellab.add(x, x, backend=be)),
        "softmax": (lambda: torch.softmax(x, -1), lambda be: kernellab.softmax(x, backend=be)),
        "layer_norm": (
            lambda: F.layer_norm(x, (256,), w, b),
            lambda be: kernellab.layer_norm(x, w, b, backend=be),
        ),
        "rms_norm": (lambda: F.rms_norm(x, (256,), w), lambda be: kernellab.rms_norm(x, w, backend=be)),
    }
    with torch.no_grad():
        for op, (tfn, kfn) in cases.items():
            base = per_call_us(tfn)
            rec(f"{op} fwd torch", base)
            for be in ("triton", "cuda", None):
                try:
                    rec(f"{op} fwd {be}", per_call_us(lambda: kfn(be)), base)
                except Exception as e:  # noqa: BLE001
                    print(f"{op} {be}: {type(e).__name__}: {e}")

    def fb(f):
        def run():
            out = f()
            out.backward(dy)

        return run

    fbcases = {
        "gelu": (lambda: F.gelu(xg, approximate="tanh"), lambda be: kernellab.gelu(xg, backend=be)),
        "softmax": (lambda: torch.softmax(xg, -1), lambda be: kernellab.softmax(xg, backend=be)),
        "layer_norm": (
            lambda: F.layer_norm(xg, (256,), w, b),
            lambda be: kernellab.layer_norm(xg, w, b, backend=be),
        ),
        "rms_norm": (lambda: F.rms_norm(xg, (256,), w), lambda be: kernellab.rms_norm(xg, w, backend=be)),
    }
    for op, (tfn, kfn) in fbcases.items():
        base = per_call_us(fb(tfn))
        rec(f"{op} fwdbwd torch", base)
        for be in ("triton", "cuda", None):
            try:
                rec(f"{op} fwdbwd {be}", per_call_us(fb(lambda: kfn(be))), base)
            except Exception as e:  # noqa: BLE001
                print(f"{op} {be}: {type(e).__name__}: {e}")

    # cross_entropy, attention, matmul: as they are
    lg = torch.randn(64, 256, device=dev, dtype=bf, requires_grad=True)
    tg = torch.randint(0, 256, (64,), device=dev)
    base = per_call_us(lambda: F.cross_entropy(lg, tg).backward())
    rec("cross_entropy fwdbwd torch", base)
    for be in ("triton", "cuda"):
        rec(
            f"cross_entropy fwdbwd {be}",
            per_call_us(lambda: kernellab.cross_entropy(lg, tg, backend=be).backward()),
            base,
        )
    with torch.no_grad():
        base = per_call_us(lambda: F.cross_entropy(lg, tg))
        rec("cross_entropy fwd torch", base)
        for be in ("triton", "cuda"):
            rec(
                f"cross_entropy fwd {be}",
                per_call_us(lambda: kernellab.cross_entropy(lg, tg, backend=be)),
                base,
            )
    q = torch.randn(1, 2, 64, 64, device=dev, dtype=bf, requires_grad=True)
    do = torch.randn_like(q)
    base = per_call_us(lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True).backward(do))
    rec("attention fwdbwd torch", base)
    rec(
        "attention fwdbwd triton",
        per_call_us(lambda: kernellab.attention(q, q, q, causal=True, backend="triton").backward(do)),
        base,
    )
    a = torch.randn(64, 64, device=dev, dtype=bf, requires_grad=True)
    dm = torch.randn(64, 64, device=dev, dtype=bf)
    base = per_call_us(lambda: (a @ a).backward(dm))
    rec("matmul fwdbwd torch", base)
    rec(
        "matmul fwdbwd triton",
        per_call_us(lambda: kernellab.matmul(a, a, backend="triton").backward(dm)),
        base,
    )

    # --- torch.compile: no graph break, Inductor launches our kernels
    from torch._inductor.utils import run_and_get_code

    def block(t, w, b):
        h = kernellab.layer_norm(t, w, b, backend="triton")
        h = kernellab.gelu(h, backend="triton")
        h = kernellab.add(h, t, backend="triton")
        return kernellab.softmax(h, backend="triton")

    xin = torch.randn(64, 256, device=dev, dtype=bf, requires_grad=True)
    try:
        cf = torch.compile(block, fullgraph=True)
        out, codes = run_and_get_code(lambda: cf(xin, w, b).backward(dy))
        code = "\n".join(codes)
        for kname in (
            "_norm_fwd",
            "_gelu_fwd_kernel",
            "_add_kernel",
            "_softmax_fwd_kernel",
            "_norm_bwd_kernel",
            "_gelu_bwd_kernel",
        ):
            found = kname in code
            rows.append({"probe": f"inductor code has {kname}", "found": found})
            print(f"inductor output code contains {kname}: {found}")
        ref = block(xin, w, b)
        print("compiled == eager (max abs diff):", float((cf(xin, w, b) - ref).abs().max()))
    except Exception as e:  # noqa: BLE001
        print("compile probe failed:", type(e).__name__, str(e)[:2000])
        rows.append({"probe": "compile", "error": f"{type(e).__name__}: {e}"[:500]})

    if args.out:
        meta = {"gpu": torch.cuda.get_device_name(), "git_sha": git_sha(), **versions()}
        with open(f"{args.out}/probe_launch.jsonl", "w") as f:
            for r in rows:
                f.write(json.dumps({**meta, **r}) + "\n")
    return 0


def parts() -> int:
    """Per-call host time of the raw launchers (no autograd, no registry), then a cProfile of
    each backward launcher loop: where the host time of forward+backward goes."""
    import cProfile
    import pstats

    from kernellab.ops.attention import triton as at
    from kernellab.ops.matmul import triton as mt
    from kernellab.ops.norm_kernels import triton_kernels as lt

    dev, bf = "cuda", torch.bfloat16
    x = torch.randn(64, 256, device=dev, dtype=bf)
    w = torch.randn(256, device=dev, dtype=bf)
    b = torch.randn(256, device=dev, dtype=bf)
    dy = torch.randn_like(x)
    y, mean, rstd = lt.norm_fwd(x, w, b, 1e-5, False)
    q = torch.randn(1, 2, 64, 64, device=dev, dtype=bf)
    o, lse = at.forward(q, q, q, True, 0.125)
    a = torch.randn(64, 64, device=dev, dtype=bf)
    cases = {
        "layer_norm norm_fwd": lambda: lt.norm_fwd(x, w, b, 1e-5, False),
        "layer_norm norm_bwd": lambda: lt.norm_bwd(dy, x, w, mean, rstd, False, True),
        "attention forward": lambda: at.forward(q, q, q, True, 0.125),
        "attention backward": lambda: at.backward(q, q, q, q, o, lse, True, 0.125),
        "matmul fwd": lambda: mt.triton_matmul_fwd(a, a),
        "torch.empty_like": lambda: torch.empty_like(x),
        "torch.empty(shape, dtype, device)": lambda: torch.empty((64, 256), dtype=bf, device=dev),
    }
    for name, fn in cases.items():
        print(f"{name:40s} {per_call_us(fn):8.2f} us", flush=True)
    from kernellab import triton_support as ts

    print("launch_tuned misses:", ts._LEAN_MISSES)
    for t in (at._attn_fwd, at._attn_bwd_dkdv, at._attn_bwd_dq):
        print(getattr(t.fn, "__name__", t.fn), type(t.fn).__mro__[:2], getattr(t, "_kl_lean", None))
    for name in ("layer_norm norm_bwd", "attention backward", "matmul fwd"):
        fn = cases[name]
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(300):
            fn()
        prof.disable()
        torch.cuda.synchronize()
        print(f"--- cProfile: {name} (300 calls)")
        pstats.Stats(prof).sort_stats("tottime").print_stats(14)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
