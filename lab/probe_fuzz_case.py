"""Replay the check's fuzz problems for one op and seed, and show where each backend's
error sits: per problem, forward (and, for differentiable ops, the first input's gradient
with the check's grad_output) max error against float64, the value there, and the same for
PyTorch's op. What a failing GPU fuzz case needs before a kernel is changed.

    PYTHONPATH=src python lab/probe_fuzz_case.py softmax --seed 75028 --dtype fp32 \
        --backends torch cuda cuda_v2 cuda_v3 triton [--n 2] [--exact]
"""

from __future__ import annotations

import argparse
import random

import torch

from kernellab.core import registry
from kernellab.core.spec import get_spec, shape_str
from kernellab.harness import check as chk

DT = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _err(out, ref):
    d = (out.double() - ref).abs()
    d = torch.where(torch.isfinite(ref), d, torch.zeros_like(d))
    i = int(d.flatten().argmax())
    return float(d.flatten()[i]), i, float(ref.flatten()[i])


def _floats(args, grad: bool, to64: bool = False):
    """The call's arguments with fresh floating tensors (float64 for the reference), leaves
    that take a gradient when ``grad``."""
    return [(t.detach().double() if to64 else t.detach().clone()).requires_grad_(grad)
            if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in args]  # fmt: skip


def _compare(op, spec, backends, args, kwargs, dy, title):
    """Judge each backend on ``args`` against the float64 reference: the forward's max error
    and, with a grad_output ``dy``, the first input's gradient's; where each error sits."""
    x64 = _floats(args, dy is not None, to64=True)
    ref = spec.reference(*x64, **kwargs)
    ref = ref[0] if isinstance(ref, tuple) else ref
    gref = torch.autograd.grad(ref, [x64[0]], dy.double())[0] if dy is not None else None
    ref = ref.detach()
    scale = float((gref if gref is not None else ref).abs().max())
    print(f"\n{title}: scale max|ref| {scale:.3g}")
    for b in backends:
        xs = _floats(args, dy is not None)
        try:
            out = registry.get(op, b)(*xs, **kwargs)
            out = out[0] if isinstance(out, tuple) else out
            e, i, v = _err(out.detach(), ref)
            line = f"  {b:10s} fwd err {e:.3g} at {i} (ref {v:.6g})"
            if dy is not None:
                (g,) = torch.autograd.grad(out, [xs[0]], dy)
                e, i, v = _err(g, gref)
                line += f"; dx err {e:.3g} at {i} (ref {v:.6g}, y there {float(ref.flatten()[i]):.6g})"
            print(line)
        except Exception as ex:  # noqa: BLE001
            print(f"  {b:10s} raised {type(ex).__name__}: {str(ex)[:120]}")


def exact(a, dtype, spec, dev):
    """Run the check's own fuzz stage through a wrapper of the first backend that records
    every call's inputs and the grad_output its output receives, then judge every backend
    on exactly those inputs (the replay in ``main`` draws its own grad_output)."""
    real = registry.get(a.op, a.backends[0])
    calls = []

    def wrapper(*args, **kwargs):
        out = real.fn(*args, **kwargs)
        rec = {"args": [t.detach().clone() if isinstance(t, torch.Tensor) else t for t in args],
               "kwargs": kwargs, "dy": None}  # fmt: skip
        calls.append(rec)
        y = out[0] if isinstance(out, tuple) else out
        if y.requires_grad:
            y.register_hook(lambda g, rec=rec: rec.__setitem__("dy", g.detach().clone()))
        return out

    impl = registry.Impl(a.op, "probe_capture", wrapper, devices=real.devices, _spec=spec)
    rep = chk.check_impl(impl, dtype, device=dev, quick=True, seed=a.seed, fuzz=a.n, only_fuzz=True)
    for c in rep.cases:
        print(f"check: {c.kind} {c.name}: {c.status} {c.detail}")
    for rec in calls:
        args, dy = rec["args"], rec["dy"]
        title = (f"{a.op} {shape_str(tuple(args[0].shape))} {'grad' if dy is not None else 'fwd'} "
                 f"(exact inputs; x strides {args[0].stride()})")  # fmt: skip
        _compare(a.op, spec, a.backends, args, rec["kwargs"], dy, title)


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("op")
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--dtype", default="fp32")
    p.add_argument("--backends", nargs="+", required=True)
    p.add_argument("--n", type=int, default=2)
    p.add_argument("--exact", action="store_true", help="the check's own inputs and grad_output (see exact)")
    a = p.parse_args(argv)
    dtype, spec = DT[a.dtype], get_spec(a.op)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    if a.exact:
        return exact(a, dtype, spec, dev)
    runner = chk._Runner(registry.get(a.op, "torch"), spec, dtype, dev, a.seed, True, a.n)
    rng = random.Random(a.seed)
    for _ in range(a.n):
        shape, opts = spec.draw_fuzz(rng, dev == "cuda")
        for kind in ("fwd", "grad"):
            args, kwargs = runner.option_inputs(opts, shape)
            dy = None
            if kind == "grad":  # a grad_output of the output's shape, drawn here (not the check's)
                out_shape = registry.get(a.op, "torch")(*args, **kwargs)
                out_shape = (out_shape[0] if isinstance(out_shape, tuple) else out_shape).shape
                gen = torch.Generator(device=dev).manual_seed(12345)
                dy = torch.randn(out_shape, generator=gen, device=dev).to(dtype)
            _compare(a.op, spec, a.backends, args, kwargs, dy, f"{a.op} {shape_str(shape)} {opts or ''} {kind}")


if __name__ == "__main__":
    main()
