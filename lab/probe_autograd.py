"""Where a Python autograd node's host time goes on a GPU host (tiny bf16 shapes, us per
call in a plain loop): PyTorch's op, a bare ``autograd.Function`` around PyTorch's own
kernels, kernellab's Triton backend; each with autograd's device threads (the default)
and with ``torch.autograd.set_multithreading_enabled(False)`` (backward on the calling
thread); the raw backward launcher on the main thread and on another thread; the
threads alive in the process; a cProfile of the backward on the calling thread.

    PYTHONPATH=src python lab/probe_autograd.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import threading

import torch
import torch.nn.functional as F

import kernellab
from kernellab.harness.bench import git_sha, versions

# Run as a script, lab/ is on sys.path: the Functions around aten's own kernels and the
# timers are probe_host's.
from probe_host import _TorchGelu as TorchGelu  # noqa: E402
from probe_host import _TorchLN as TorchLN  # noqa: E402
from probe_host import per_call_us, print_cprofile  # noqa: E402


def us(fn, calls=200) -> float:
    return per_call_us(fn, calls)


def on_thread(fn, calls=200) -> float:
    box = []
    t = threading.Thread(target=lambda: box.append(us(fn, calls)))
    t.start()
    t.join()
    return box[0]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    a = p.parse_args()
    dev, bf = "cuda", torch.bfloat16
    rows = []

    def rec(name, v):
        rows.append({"probe": name, "us": round(v, 2)})
        print(f"{name:70s} {v:8.2f} us", flush=True)

    x = torch.randn(64, 256, device=dev, dtype=bf, requires_grad=True)
    w = torch.randn(256, device=dev, dtype=bf, requires_grad=True)
    b = torch.randn(256, device=dev, dtype=bf, requires_grad=True)
    dy = torch.randn(64, 256, device=dev, dtype=bf)
    leaves = (x, w, b)

    def g(f, ls=leaves):
        return lambda: torch.autograd.grad(f(), ls, dy)

    cases = {
        "layer_norm torch": g(lambda: F.layer_norm(x, (256,), w, b)),
        "layer_norm autograd.Function(aten)": g(lambda: TorchLN.apply(x, w, b)),
        "layer_norm kernellab triton": g(lambda: kernellab.layer_norm(x, w, b, backend="triton")),
        "layer_norm kernellab cuda": g(lambda: kernellab.layer_norm(x, w, b, backend="cuda")),
        "layer_norm kernellab default": g(lambda: kernellab.layer_norm(x, w, b)),
        "gelu torch": g(lambda: F.gelu(x, approximate="tanh"), (x,)),
        "gelu autograd.Function(aten)": g(lambda: TorchGelu.apply(x), (x,)),
        "gelu kernellab triton": g(lambda: kernellab.gelu(x, backend="triton"), (x,)),
        "gelu kernellab cuda": g(lambda: kernellab.gelu(x, backend="cuda"), (x,)),
    }
    print("threads:", [t.name for t in threading.enumerate()], "switchinterval", sys.getswitchinterval())
    for name, fn in cases.items():
        rec(f"{name} fwdbwd", us(fn))
    with torch.autograd.set_multithreading_enabled(False):
        for name, fn in cases.items():
            rec(f"{name} fwdbwd (no autograd threads)", us(fn))
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    for name in ("layer_norm autograd.Function(aten)", "layer_norm kernellab triton"):
        rec(f"{name} fwdbwd (switchinterval 1us)", us(cases[name]))
    sys.setswitchinterval(old)
    print("threads after:", [t.name for t in threading.enumerate()])

    from kernellab.ops.norm_kernels import triton_kernels as lt

    xd, wd, bd = x.detach(), w.detach(), b.detach()
    y, mean, rstd = lt.norm_fwd(xd, wd, bd, 1e-5, False)
    bwd = lambda: lt.norm_bwd(dy, xd, wd, mean, rstd, False, True)  # noqa: E731
    fwd = lambda: lt.norm_fwd(xd, wd, bd, 1e-5, False)  # noqa: E731
    rec("layer_norm raw fwd launcher, main thread", us(fwd))
    rec("layer_norm raw bwd launcher, main thread", us(bwd))
    rec("layer_norm raw bwd launcher, other thread", on_thread(bwd))
    rec("aten native_layer_norm_backward, main thread", us(lambda: torch.ops.aten.native_layer_norm_backward(
        dy, xd, (256,), mean.view(64, 1), rstd.view(64, 1), wd, bd, (True, True, True))))  # fmt: skip
    rec("torch.empty x3, main thread", us(lambda: [torch.empty_like(xd) for _ in range(3)]))

    # -- layer by layer (threads on, the default): forward alone with grad on (the graph is
    # built, never run), backward alone (retain_graph), and the same with the launches
    # replaced by no-ops (what is left is Python and allocation).
    impl = kernellab.get("layer_norm", "triton")
    fwd_paths = {
        "F.layer_norm": lambda: F.layer_norm(x, (256,), w, b),
        "autograd.Function(aten)": lambda: TorchLN.apply(x, w, b),
        "kernellab.layer_norm(backend=triton)": lambda: kernellab.layer_norm(x, w, b, backend="triton"),
        "Impl.__call__": lambda: impl(x, w, b),
        "impl.fn": lambda: impl.fn(x, w, b),
    }
    for name, f in fwd_paths.items():
        rec(f"layer_norm fwd with grad on: {name}", us(f))
    for name, f in list(fwd_paths.items())[:3]:
        y0 = f()
        rec(f"layer_norm bwd alone (retain_graph): {name}",
            us(lambda y0=y0: torch.autograd.grad(y0, leaves, dy, retain_graph=True)))  # fmt: skip
    kernels = [lt._norm_fwd_kernel, lt._norm_bwd_kernel, lt._partials_sum_kernel, lt._norm_fwd_row_kernel]
    saved = [k.__class__.__getitem__ for k in kernels[:1]]
    cls = type(kernels[0])
    cls.__getitem__ = lambda self, grid: (lambda *a, **k: None)
    try:
        rec("layer_norm triton fwdbwd, launches replaced by no-ops", us(cases["layer_norm kernellab triton"]))
        rec("layer_norm triton fwd with grad on, no-op launches", us(fwd_paths["kernellab.layer_norm(backend=triton)"]))
        rec("layer_norm raw bwd launcher, no-op launches", us(bwd))
        rec("layer_norm raw fwd launcher, no-op launches", us(fwd))
    finally:
        cls.__getitem__ = saved[0]

    for name in ("layer_norm kernellab triton", "layer_norm autograd.Function(aten)"):
        fn = cases[name]
        with torch.autograd.set_multithreading_enabled(False):
            for _ in range(20):
                fn()
            print_cprofile(f"{name}, 300 calls, backward on the calling thread", fn, calls=300, top=25)

    if a.out:
        meta = {"gpu": torch.cuda.get_device_name(), "git_sha": git_sha(), **versions()}
        with open(f"{a.out}/probe_autograd.jsonl", "a") as f:
            for r in rows:
                f.write(json.dumps({**meta, **r}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
