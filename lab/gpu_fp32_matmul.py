"""fp32 matmul with TF32 off in the Triton backend, beside cuBLAS (torch, TF32 off). Needs a GPU.

    PYTHONPATH=src python lab/gpu_fp32_matmul.py [--json F]
        [--parts skinny,layouts,flush,sweep,dots,skinny_copy,smallk]

skinny  M <= 8 products against a weight, and MNIST's fc1: the library's path (the FMA
        kernel up to FMA_M_MAX rows) against the tl.dot skinny kernel (FMA_M_MAX = 0) and
        torch; b as W.t() ("wt") and as a contiguous [K, N] ("kn"). Error against float64
        as a ratio to torch's, and do_bench medians (ms).
sweep   forced FMA configs (BLOCK_N, BLOCK_K, warps, stages; K slices as ``fma_config``
        makes them) at three shapes, FMA_TERMS raised to 64 so larger blocks can run.
layouts the tiled kernel (FMA dots) with a M-inner or K-inner ("cm" / "rm") and b N-inner
        or K-inner ("kn" / "wt"); K-inner b with and without the copy FMA_COPY_MIN_M makes.
skinny_copy  the tl.dot skinny kernel (5-128 rows) with b = W.t() as given and copied
        N-inner first (the copy counted), beside torch.
flush   the FMA skinny kernel with one running sum a slice where FMA_WALK_MAX allows it
        (the library's) and flushed every FMA_FLUSH steps (FMA_WALK_MAX 0).
smallk  the error of short-K products (K 16-100, the check's 37x45 outputs and the
        backward's transposes) as a ratio to cuBLAS's, over many seeds, per backend
        (triton, triton_x3, cuda): the worst and the share of draws past 1.5x and 2x. The
        check's bound is about 2x cuBLAS's error: a backend near it fails some seeds.
dots    large products through the tiled kernel with fp32_dots "ieee" and "x3", each in a
        child process (the option is read once): forward and forward+backward times,
        and the error of y, da, db against float64 as a ratio to torch's.
"""

import argparse
import json
import os
import subprocess
import sys

SKINNY = [
    (1, 4097, 4095),
    (1, 14336, 4096),
    (2, 4096, 4096),
    (4, 4096, 4096),
    (8, 4096, 4096),
    (64, 128, 3136),
]
SWEEP = [(1, 4097, 4095), (16, 4096, 4096), (64, 128, 3136)]
DOTS = [(8192, 768, 3072), (8192, 768, 768), (4097, 4095, 1023), (256, 10, 128)]


def _setup():
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def _err(o, r):
    return float((o.double() - r).abs().max())


def _operands(m, n, k, layout, seed):
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, device="cuda", generator=g)
    if layout == "wt":
        b = torch.randn(n, k, device="cuda", generator=g).t()
    else:
        b = torch.randn(k, n, device="cuda", generator=g)
    return a, b


def skinny(out):
    from triton.testing import do_bench

    from kernellab.ops.matmul import triton as tm

    for (m, n, k), layout in [(s, l_) for s in SKINNY for l_ in ("wt", "kn")]:
        a, b = _operands(m, n, k, layout, m + n + k)
        ref = a.double() @ b.double()
        e_t = _err(a @ b, ref)
        row = dict(part="skinny", shape=f"{m}x{n}x{k}", layout=layout, config=tm.fma_config(m, n, k, 132))
        row["torch_ms"] = do_bench(lambda: a @ b, warmup=25, rep=100)
        y = tm.triton_skinny_fwd(a, b)
        row["fma_err_ratio"] = round(_err(y, ref) / max(e_t, 1e-30), 3)
        row["fma_ms"] = do_bench(lambda: tm.triton_skinny_fwd(a, b), warmup=25, rep=100)
        old = tm.FMA_M_MAX
        tm.FMA_M_MAX = 0
        try:
            y = tm.triton_skinny_fwd(a, b, tune=False)
            row["dot_err_ratio"] = round(_err(y, ref) / max(e_t, 1e-30), 3)
            row["dot_ms"] = do_bench(lambda: tm.triton_skinny_fwd(a, b, tune=False), warmup=25, rep=100)
        finally:
            tm.FMA_M_MAX = old
        row["fma_vs_torch"] = round(row["torch_ms"] / row["fma_ms"], 3)
        out(row)


LAYOUTS = [
    ((8192, 768, 768), "rm", "kn"),
    ((8192, 768, 768), "rm", "wt"),
    ((8192, 768, 768), "cm", "kn"),
    ((768, 768, 8192), "cm", "kn"),
    ((768, 768, 8192), "rm", "kn"),
    ((4097, 4095, 1023), "rm", "wt"),
    ((8192, 3072, 768), "rm", "wt"),
    ((8192, 3072, 768), "rm", "kn"),
    ((8192, 3072, 768), "cm", "kn"),
    ((4097, 4095, 1023), "rm", "kn"),
    ((4097, 4095, 1023), "cm", "kn"),
]


def _with_knob(row, tm, knob, choices, fn, ref, e_t):
    """Time ``fn`` (and its error as a ratio to torch's) with the module constant ``knob``
    of ``tm`` at each (name, value) of ``choices``, restored after."""
    from triton.testing import do_bench

    old = getattr(tm, knob)
    for name, value in choices:
        setattr(tm, knob, old if value is None else value)
        try:
            row[name + "_err_ratio"] = round(_err(fn(), ref) / max(e_t, 1e-30), 3)
            row[name + "_ms"] = round(do_bench(fn, warmup=25, rep=100), 5)
        finally:
            setattr(tm, knob, old)


def layouts(out):
    import torch
    from triton.testing import do_bench

    from kernellab.ops.matmul import triton as tm

    for (m, n, k), la, lb in LAYOUTS:
        a = torch.randn(m, k, device="cuda") if la == "rm" else torch.randn(k, m, device="cuda").t()
        b = torch.randn(k, n, device="cuda") if lb == "kn" else torch.randn(n, k, device="cuda").t()
        ref = a.double() @ b.double()
        row = dict(part="layouts", shape=f"{m}x{n}x{k}", a=la, b=lb)
        row["torch_ms"] = round(do_bench(lambda: a @ b, warmup=25, rep=100), 5)
        choices = (("lib", None),) + ((("nocopy", 1 << 30),) if lb == "wt" else ())
        _with_knob(
            row, tm, "FMA_COPY_MIN_M", choices, lambda: tm.triton_general_fwd(a, b), ref, _err(a @ b, ref)
        )
        out(row)


SKINNY_COPY = [(64, 128, 3136), (16, 1024, 1024), (32, 1024, 1024), (16, 4096, 4096), (64, 4096, 4096)]


def skinny_copy(out):
    """The tl.dot skinny kernel (fp32 past FMA_M_MAX rows) with b = W.t() as given against
    b copied N-inner first (the copy counted, and alone), beside torch."""
    from triton.testing import do_bench

    from kernellab.ops.matmul import triton as tm

    for m, n, k in SKINNY_COPY:
        a, b = _operands(m, n, k, "wt", m + n + k)
        ref = a.double() @ b.double()
        e_t = _err(a @ b, ref)
        row = dict(part="skinny_copy", shape=f"{m}x{n}x{k}", weight_mb=round(n * k * 4 / 2**20, 2))
        row["torch_ms"] = round(do_bench(lambda: a @ b, warmup=25, rep=100), 5)
        row["as_given_ms"] = round(do_bench(lambda: tm.triton_skinny_fwd(a, b), warmup=25, rep=100), 5)
        row["copied_ms"] = round(
            do_bench(lambda: tm.triton_skinny_fwd(a, b.contiguous()), warmup=25, rep=100), 5
        )
        row["copy_alone_ms"] = round(do_bench(lambda: b.contiguous(), warmup=25, rep=100), 5)
        y = tm.triton_skinny_fwd(a, b.contiguous())
        row["copied_err_ratio"] = round(_err(y, ref) / max(e_t, 1e-30), 3)
        out(row)


def flush(out):
    from triton.testing import do_bench

    from kernellab.ops.matmul import triton as tm

    for m, n, k in SKINNY[:4]:
        for layout in ("wt", "kn"):
            a, b = _operands(m, n, k, layout, m + n + k)
            ref = a.double() @ b.double()
            row = dict(part="flush", shape=f"{m}x{n}x{k}", layout=layout, config=tm.fma_config(m, n, k, 132))
            row["torch_ms"] = round(do_bench(lambda: a @ b, warmup=25, rep=100), 5)
            choices = (("lib", None), ("flushed", 0))
            _with_knob(
                row, tm, "FMA_WALK_MAX", choices, lambda: tm.triton_skinny_fwd(a, b), ref, _err(a @ b, ref)
            )
            out(row)


def sweep(out, layouts=("wt",), shapes=SWEEP, splits=None):
    """``splits``: K slice counts to try at every config (None: fma_split's own)."""
    from triton.testing import do_bench

    from kernellab import triton_support
    from kernellab.ops.matmul import triton as tm

    tm.FMA_TERMS = 64
    for (m, n, k), layout in [(s, lay) for s in shapes for lay in layouts]:
        a, b = _operands(m, n, k, layout, 7)
        bm = triton_support.next_pow2(m)
        ref = a.double() @ b.double()
        e_t = _err(a @ b, ref)
        torch_ms = do_bench(lambda: a @ b, warmup=10, rep=40)
        out(dict(part="sweep_torch", shape=f"{m}x{n}x{k}", layout=layout, ms=round(torch_ms, 5)))
        best = None
        for bn in (32, 64, 128, 256):
            for bk in (1, 2, 4, 8, 16, 32, 64):
                for warps in (4, 8):
                    terms = bm * bk * bn // (32 * warps)
                    if not 16 <= terms <= 64 or bk > k:
                        continue
                    for stages, split in [(2, sp) for sp in (splits or [tm.fma_split(m, n, k, bn, bk, 132)])]:
                        if split > triton_support.cdiv(k, bk):
                            continue
                        cfg = (bn, bk, split, warps, stages)
                        try:
                            err = _err(tm.triton_skinny_fwd(a, b, config=cfg), ref) / max(e_t, 1e-30)
                            ms = do_bench(
                                lambda cfg=cfg: tm.triton_skinny_fwd(a, b, config=cfg), warmup=10, rep=40
                            )
                        except Exception as e:  # noqa: BLE001
                            row = dict(part="sweep", shape=f"{m}x{n}x{k}", layout=layout, config=cfg)
                            out(dict(row, error=str(e)[:120]))
                            continue
                        if best is None or ms < best[0]:
                            best = (ms, cfg)
                        row = dict(part="sweep", shape=f"{m}x{n}x{k}", layout=layout, config=cfg)
                        out(dict(row, terms=terms, ms=round(ms, 5), err_ratio=round(err, 3)))
        out(
            dict(
                part="sweep_best",
                shape=f"{m}x{n}x{k}",
                layout=layout,
                config=best[1],
                ms=round(best[0], 5),
                torch_ms=round(torch_ms, 5),
                heuristic=tm.fma_config(m, n, k, 132, layout == "kn" and n > 1),
            )
        )


def dots(out, variant):
    import torch
    from triton.testing import do_bench

    from kernellab.core import registry

    mm = {i.backend: i for i in registry.impls("matmul")}["triton"].fn
    for m, n, k in DOTS:
        a, b = _operands(m, n, k, "wt", m + n)
        dz = torch.randn(m, n, device="cuda")

        def run(fn, dt, a=a, b=b, dz=dz):
            aa = a.to(dt).requires_grad_()
            wt = b.t().to(dt).requires_grad_()
            z = fn(aa, wt.t())
            return [z, *torch.autograd.grad(z, (aa, wt), dz.to(dt))]

        ref = run(torch.matmul, torch.float64)
        e_t = [_err(o, r) for o, r in zip(run(torch.matmul, torch.float32), ref)]
        e_o = [_err(o, r) for o, r in zip(run(mm, torch.float32), ref)]
        aa = a.clone().requires_grad_()
        wt = b.t().clone().requires_grad_()
        row = dict(part="dots", variant=variant, shape=f"{m}x{n}x{k}",
                   err_ratio=[round(o / max(r, 1e-30), 3) for o, r in zip(e_o, e_t)])  # fmt: skip
        for name, fn in (("torch", torch.matmul), ("triton", mm)):
            row[name + "_fwd"] = round(do_bench(lambda fn=fn: fn(a, b), warmup=25, rep=100), 5)
            row[name + "_fwdbwd"] = round(
                do_bench(lambda fn=fn: fn(aa, wt.t()).backward(dz), warmup=25, rep=100), 5
            )
        out(row)


SMALLK = [(37, 45, 16), (37, 45, 29), (37, 29, 45), (29, 45, 37), (37, 45, 63), (64, 64, 100)]


def smallk(out, seeds=200):
    import torch

    from kernellab.core import registry
    from kernellab.ops.matmul import triton as tm

    fns = {i.backend: i.fn for i in registry.impls("matmul") if i.backend in ("triton", "triton_x3", "cuda")}
    work0 = tm.FMA64_MAX_WORK
    for m, n, k in SMALLK:
        ratios = {b: [] for b in (*fns, "triton_chain")}
        for seed in range(seeds):
            g = torch.Generator(device="cuda").manual_seed(seed)
            a = torch.randn(m, k, device="cuda", generator=g)
            b = torch.randn(k, n, device="cuda", generator=g)
            ref = a.double() @ b.double()
            base = max(_err(a @ b, ref), 1e-30)
            for name, fn in fns.items():
                ratios[name].append(_err(fn(a, b), ref) / base)
            # the plain fp32 FMA chain (before "ieee64" dots): the same plan at FMA64_MAX_WORK 0
            tm.FMA64_MAX_WORK, tm._PLANS = 0, {}
            ratios["triton_chain"].append(_err(fns["triton"](a, b), ref) / base)
            tm.FMA64_MAX_WORK, tm._PLANS = work0, {}
        for name, r in ratios.items():
            r.sort()
            out(dict(part="smallk", shape=f"{m}x{n}x{k}", backend=name, seeds=seeds,
                     median=round(r[len(r) // 2], 3), worst=round(r[-1], 3),
                     over_1_5=sum(x > 1.5 for x in r), over_2=sum(x > 2 for x in r)))  # fmt: skip


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--parts", default="skinny,sweep,dots")
    ap.add_argument("--child")
    ap.add_argument("--dots-variants", default="ieee,x3")
    ap.add_argument("--sweep-layouts", default="wt", help="wt,kn: b as W.t() and/or [K, N]")
    ap.add_argument("--sweep-shapes", nargs="*", help="MxNxK; default SWEEP")
    ap.add_argument("--sweep-splits", default=None, help="comma list of K slice counts (default: fma_split's)")
    args = ap.parse_args()

    def out(row):
        print(json.dumps(row), flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(row) + "\n")

    _setup()
    if args.child:
        dots(out, args.child)
        return
    parts = args.parts.split(",")
    if "skinny" in parts:
        skinny(out)
    if "layouts" in parts:
        layouts(out)
    if "flush" in parts:
        flush(out)
    if "skinny_copy" in parts:
        skinny_copy(out)
    if "sweep" in parts:
        shapes = [tuple(map(int, x.split("x"))) for x in args.sweep_shapes] if args.sweep_shapes else SWEEP
        splits = [int(x) for x in args.sweep_splits.split(",")] if args.sweep_splits else None
        sweep(out, args.sweep_layouts.split(","), shapes, splits)
    if "smallk" in parts:
        smallk(out)
    if "dots" in parts:
        for v in args.dots_variants.split(","):
            env = dict(os.environ, KERNELLAB_FP32_DOTS=v)
            cmd = [sys.executable, __file__, "--child", v] + (["--json", args.json] if args.json else [])
            subprocess.run(cmd, check=False, env=env)


if __name__ == "__main__":
    main()
