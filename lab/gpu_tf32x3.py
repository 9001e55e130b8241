"""fp32 products of the Triton matmul and conv2d kernels through 3xTF32 tensor-core dots
("tf32x3": a = big + small, three TF32 dots) against their IEEE FMA dots: max error
against float64, as a ratio to torch's (cuBLAS / cuDNN, TF32 off) on the same inputs,
and the median time (triton.testing.do_bench) of each beside torch. Needs a GPU.

    PYTHONPATH=src python lab/gpu_tf32x3.py [--json F]

Variants run in child processes (a compiled kernel is cached per process):
  ieee     the library as it is
  x3       PRECISION "tf32x3" where it is "ieee" (mma chains the dots through acc)
  x3_2l    as x3, each K block's dot summed apart and then added (two-level)
"""

import argparse
import json
import subprocess
import sys

MM = [(4096, 4096, 4096), (8192, 768, 768), (8192, 768, 3072), (8192, 2304, 768), (4097, 4095, 1023),
      (64, 128, 3136), (256, 10, 128), (3000, 3000, 3000)]
CONV = [(1024, 32, 14, 14, 64), (256, 32, 14, 14, 64), (64, 32, 14, 14, 64), (32, 64, 56, 56, 64)]


def _mma_two_level():
    import triton
    import triton.language as tl

    from kernellab.ops._triton_dots import two_level

    globals()["two_level"] = two_level  # (a jit function resolves names in its module's globals)

    @triton.jit
    def mma_2l(a, b, acc, PREC: tl.constexpr):
        return two_level(a, b, acc, PREC)

    return mma_2l


def child(variant: str) -> list[dict]:
    import torch
    import torch.nn.functional as F
    from triton.testing import do_bench

    from kernellab.core import registry
    from kernellab.ops import _triton_dots as td
    from kernellab.ops.conv2d import triton as ct
    from kernellab.ops.matmul import triton as mt

    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    orig = td.dot_precision
    if variant != "ieee":
        def prec(dtype, tf32, interp, *rest):
            p = orig(dtype, tf32, interp, *rest)
            return "tf32x3" if p == "ieee" else p
        mt.dot_precision = prec
        ct.dot_precision = prec
    if variant == "x3_2l":
        mma_2l = _mma_two_level()
        mt.mma = mma_2l
        ct.mma = mma_2l
    impls = {i.backend: i for i in registry.impls("matmul")}
    mm = impls["triton"].fn
    cimpls = {i.backend: i for i in registry.impls("conv2d")}
    cv = cimpls["triton"].fn
    rows = []

    def err(o, r):
        return float((o.detach().double() - r.detach()).abs().max())

    for m, n, k in MM:
        g = torch.Generator(device="cuda").manual_seed(m + n + k)
        a = torch.randn(m, k, device="cuda", generator=g)
        wt = torch.randn(n, k, device="cuda", generator=g)  # nn.Linear's weight: b = wt.t()
        dz = torch.randn(m, n, device="cuda", generator=g)

        def run(fn, dt):
            aa, ww = a.to(dt).requires_grad_(), wt.to(dt).requires_grad_()
            z = fn(aa, ww.t())
            ga, gw = torch.autograd.grad(z, (aa, ww), dz.to(dt))
            return [z, ga, gw]

        ref = run(torch.matmul, torch.float64)
        e_t = [err(o, r) for o, r in zip(run(torch.matmul, torch.float32), ref)]
        e_o = [err(o, r) for o, r in zip(run(mm, torch.float32), ref)]
        aa, ww = a.requires_grad_(), wt.requires_grad_()

        def fb(fn):
            z = fn(aa, ww.t())
            z.backward(dz)

        t = {}
        for name, fn in (("torch", torch.matmul), ("triton", mm)):
            t[name + "_fwd"] = do_bench(lambda fn=fn: fn(a, wt.t()), warmup=25, rep=100)
            t[name + "_fwdbwd"] = do_bench(lambda fn=fn: fb(fn), warmup=25, rep=100)
        rows.append(dict(op="matmul", variant=variant, shape=f"{m}x{n}x{k}", b_t=True,
                         err_ratio=[round(o / max(r, 1e-30), 3) for o, r in zip(e_o, e_t)],
                         err=e_o, err_torch=e_t, **{k_: round(v, 4) for k_, v in t.items()}))
        print(rows[-1], flush=True)
    for n_, c, h, w_, k in CONV:
        g = torch.Generator(device="cuda").manual_seed(n_ + c)
        x = torch.randn(n_, c, h, w_, device="cuda", generator=g)
        w = torch.randn(k, c, 3, 3, device="cuda", generator=g) / (c * 9) ** 0.5
        b = torch.randn(k, device="cuda", generator=g)
        dy = torch.randn(n_, k, h, w_, device="cuda", generator=g)

        def crun(fn, dt):
            xx, ww, bb = (t_.to(dt).requires_grad_() for t_ in (x, w, b))
            y = fn(xx, ww, bb)
            return [y, *torch.autograd.grad(y, (xx, ww, bb), dy.to(dt))]

        def tconv(a_, b_, c_):
            return F.conv2d(a_, b_, c_, padding=1)

        def oconv(a_, b_, c_):
            return cv(a_, b_, c_, padding=1)

        ref = crun(tconv, torch.float64)
        e_t = [err(o, r) for o, r in zip(crun(tconv, torch.float32), ref)]
        e_o = [err(o, r) for o, r in zip(crun(oconv, torch.float32), ref)]
        xx, ww, bb = (t_.clone().requires_grad_() for t_ in (x, w, b))
        t = {}
        for name, fn in (("torch", tconv), ("triton", oconv)):
            t[name + "_fwd"] = do_bench(lambda fn=fn: fn(x, w, b), warmup=25, rep=100)
            t[name + "_fwdbwd"] = do_bench(lambda fn=fn: fn(xx, ww, bb).backward(dy), warmup=25, rep=100)
        rows.append(dict(op="conv2d", variant=variant, shape=f"{n_}x{c}x{h}x{w_}x{k}x3x3",
                         err_ratio=[round(o / max(r, 1e-30), 3) for o, r in zip(e_o, e_t)],
                         err=e_o, err_torch=e_t, **{k_: round(v, 4) for k_, v in t.items()}))
        print(rows[-1], flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--child")
    ap.add_argument("--variants", default="ieee,x3,x3_2l")
    args = ap.parse_args()
    if args.child:
        rows = child(args.child)
        if args.json:
            with open(args.json, "a") as f:
                for r in rows:
                    f.write(json.dumps(r) + "\n")
        return
    for v in args.variants.split(","):
        cmd = [sys.executable, __file__, "--child", v] + (["--json", args.json] if args.json else [])
        subprocess.run(cmd, check=False)


if __name__ == "__main__":
    main()
