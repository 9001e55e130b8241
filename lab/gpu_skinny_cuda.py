"""Skinny matmuls (M = 1-128) in CUDA C++ on a lent GPU: cuda_skinny against cuBLAS and Triton.

    python lab/gpu_skinny_cuda.py --out $OUT [--quick] [--max-seconds 170] [--compile-only]
        [--layout nt|nn] [--ms 1,2,4] [--weights 14336x4096,4097x4095]

y = x @ W.t() with W [N, K] contiguous (nn.Linear's layout; --layout nn: b = W.t() packed
row-major [K, N], the layout the tune and vendor_gap time). Stages:

1. compile: every (config, kernel) module the run launches (TABLE's, the sweep's
   candidates), NVRTC in parallel worker processes into the disk cache (~1-2 s each).
   --compile-only stops here (it runs without a GPU too).
2. correctness: ``cuda_skinny.skinny_product`` against float64 with kernellab's rule (error
   <= 2 x cuBLAS's + a floor) at M = 1, 3, 16, 17, 64, 128 and odd (N, K): 4095 x 4095 bf16,
   3000 x 5000 fp16, 17 x 4101 bf16, 4096 x 14336 bf16; weights nt (W.t()), nn (contiguous
   [K, N]), sliced (packed by the launcher) and misaligned (the guarded element path); two
   calls bitwise equal (the split-K sum is ordered). Every sweep candidate at one odd shape.
   Gradients through ``kernellab.matmul(..., backend="cuda_skinny")``.
3. bench + sweep, bf16, weights (N, K) in (14336, 4096), (4096, 14336), (4096, 4096),
   (128256, 4096), (3072, 768), (50257, 768), M in 1, 2, 4, 8, 16, 32, 64, 128
   (--quick: M 1, 16, 64, 128 and no LM head): ``triton.testing.do_bench`` (median; it
   zeroes a 256 MB buffer before every call, so W never comes from the L2) of cuBLAS
   (``F.linear``), Triton (``kernellab.matmul(x, W.t(), backend="triton")``), cuda_skinny
   with TABLE's config, and every candidate config x waves of its M class (deduplicated by
   the launch they make). Every output is judged against float64 first.

Printed per shape: microseconds, weight GB/s, x cuBLAS (cuBLAS time / ours: >= 0.95 is the
issue's bar) for Triton, TABLE and the best candidate; last, per M bucket the candidate with
the best geometric-mean x cuBLAS over the weights, as TABLE rows to paste into
src/kernellab/ops/matmul/cuda_skinny.py. Rows go to $OUT/skinny_cuda.jsonl.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402

from kernellab.ops.matmul import cuda_skinny as cs  # noqa: E402
from kernellab.ops.matmul.cuda_skinny import ColsConfig, GemvConfig, RowsConfig, TileConfig  # noqa: E402

WEIGHTS = ((14336, 4096), (4096, 14336), (4096, 4096), (128256, 4096), (3072, 768), (50257, 768))
MS = (1, 2, 4, 8, 16, 32, 64, 128)
QUICK_WEIGHTS = WEIGHTS[:3] + WEIGHTS[4:]
QUICK_MS = (1, 16, 64, 128)
BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)  # TABLE's M bounds

# Candidates per M bucket (configs; each is tried at several waves). gemv only where M <= 16.
GEMV = [
    GemvConfig(warps=4, rows=1, unroll=4, kc=2048),
    GemvConfig(warps=4, rows=1, unroll=8, kc=2048),
    GemvConfig(warps=8, rows=1, unroll=4, kc=2048),
    GemvConfig(warps=4, rows=2, unroll=4, kc=2048),
    GemvConfig(warps=2, rows=1, unroll=8, kc=4096),
    GemvConfig(warps=4, rows=1, unroll=4, kc=2048, prefetch=256),
]
# The rows kernel (M <= 8); a config whose x registers do not fit an M is left out there.
ROWS = [
    RowsConfig(warps=4, chunks=4, rows=16, unroll=2),
    RowsConfig(warps=4, chunks=4, rows=8, unroll=2),
    RowsConfig(warps=4, chunks=4, rows=32, unroll=2),
    RowsConfig(warps=4, chunks=4, rows=16, unroll=2, prefetch=256),
    RowsConfig(warps=2, chunks=4, rows=8, unroll=2),
    RowsConfig(warps=4, chunks=2, rows=16, unroll=4),
    RowsConfig(warps=8, chunks=2, rows=16, unroll=2),
    RowsConfig(warps=4, chunks=2, rows=8, unroll=2),
    RowsConfig(warps=8, chunks=1, rows=32, unroll=4),
    RowsConfig(warps=16, chunks=1, rows=16, unroll=4),
]
# Tiles for the row-major [K, N] weight: a stage holds bk rows of bn halfs each, so a wider
# bn reads longer runs of each k row (bn 64: 128 bytes a row and block; bn 256: 512)
NN_TILES = [
    TileConfig(bn=64, bm=8, bk=128, stages=4, wn=4, wm=1),
    TileConfig(bn=128, bm=8, bk=64, stages=4, wn=4, wm=1),
    TileConfig(bn=256, bm=8, bk=32, stages=4, wn=4, wm=1),
    TileConfig(bn=256, bm=8, bk=64, stages=3, wn=8, wm=1),
]
NN_TILES_16 = [TileConfig(bn=256, bm=16, bk=32, stages=4, wn=4, wm=1)]
# The cols kernel (nn, M <= 16); a config whose sums or stage do not fit an M is left out there.
COLS = [
    ColsConfig(warps=8, chunks=1, unroll=4),
    ColsConfig(warps=8, chunks=1, unroll=8),
    ColsConfig(warps=4, chunks=1, unroll=8),
    ColsConfig(warps=4, chunks=2, unroll=4),
    ColsConfig(warps=8, chunks=2, unroll=2),
    ColsConfig(warps=16, chunks=1, unroll=4, kc=1024),
    ColsConfig(warps=16, chunks=1, unroll=8, kc=1024),
    ColsConfig(warps=32, chunks=1, unroll=4, kc=512),
    ColsConfig(warps=16, chunks=1, unroll=2, kc=1024),
    ColsConfig(warps=16, chunks=1, unroll=2, kc=1024, blocks=2),
    ColsConfig(warps=16, chunks=1, unroll=4, kc=1024, blocks=2),
    ColsConfig(warps=8, chunks=1, unroll=4, kc=2048, blocks=3),
    ColsConfig(warps=8, chunks=1, unroll=4, prefetch=256),
]
CANDIDATES = {
    1: GEMV + ROWS + NN_TILES + COLS,
    2: GEMV + ROWS + NN_TILES + COLS,
    4: GEMV + ROWS + NN_TILES + COLS,
    8: GEMV
    + ROWS
    + COLS
    + NN_TILES[1:]
    + [
        TileConfig(bn=64, bm=8, bk=128, stages=4, wn=4, wm=1),
        TileConfig(bn=64, bm=16, bk=128, stages=4, wn=4, wm=1),
        TileConfig(bn=64, bm=16, bk=128, stages=4, wn=4, wm=1, prefetch=256),
    ],
    16: GEMV
    + COLS
    + NN_TILES_16
    + [
        TileConfig(bn=64, bm=16, bk=128, stages=4, wn=4, wm=1),
        TileConfig(bn=128, bm=16, bk=64, stages=4, wn=4, wm=1),
    ],
    32: [
        TileConfig(bn=64, bm=32, bk=64, stages=4, wn=4, wm=1),
        TileConfig(bn=128, bm=32, bk=64, stages=4, wn=4, wm=1),
        TileConfig(bn=64, bm=32, bk=128, stages=3, wn=4, wm=1),
    ],
    64: [
        TileConfig(bn=128, bm=64, bk=64, stages=3, wn=4, wm=2),
        TileConfig(bn=64, bm=64, bk=64, stages=4, wn=2, wm=2),
        TileConfig(bn=128, bm=64, bk=32, stages=4, wn=4, wm=1),
    ],
    128: [
        TileConfig(bn=128, bm=128, bk=32, stages=4, wn=4, wm=2),
        TileConfig(bn=128, bm=128, bk=64, stages=3, wn=4, wm=2),
        TileConfig(bn=64, bm=128, bk=64, stages=4, wn=2, wm=2),
        TileConfig(bn=256, bm=128, bk=32, stages=3, wn=8, wm=2),
        TileConfig(bn=128, bm=128, bk=32, stages=4, wn=4, wm=2, prefetch=128),
    ],
}
WAVES = {"gemv": (1.0, 2.0, 4.0), "rows": (1.0, 2.0), "cols": (1.0, 2.0, 4.0), "tile": (1.0, 2.0)}
CORRECT_MS = (1, 3, 16, 17, 64, 128)
CORRECT_SHAPES = (("bf16", 4095, 4095), ("fp16", 3000, 5000), ("bf16", 17, 4101), ("bf16", 4096, 14336))
DT = {"bf16": torch.bfloat16, "fp16": torch.float16}


def bucket(m: int) -> int:
    return next(b for b in BUCKETS if m <= b)


def with_waves(cfg, waves):
    return type(cfg)(**{**cfg.__dict__, "waves": waves})


def candidates(m: int, layout: str | None = None):
    """The configs tried at M (in ``layout`` only, when given), each at its kind's waves."""
    out = []
    for cfg in CANDIDATES[bucket(m)]:
        if cfg.kind == "gemv" and m > 16:
            continue
        if cfg.kind in ("rows", "cols"):
            try:
                cfg.kernel(m, LAYOUTS[cfg.kind][0], torch.bfloat16)
            except ValueError:  # the registers at this M
                continue
            if cfg.shared(m, LAYOUTS[cfg.kind][0], cfg.max_chunk()) > cs.SMEM_MAX:
                continue
        if layout is not None and layout not in LAYOUTS[cfg.kind]:
            continue
        cand = [with_waves(cfg, w) for w in WAVES[cfg.kind]]
        out += [c for c in cand if c not in out]
    return out


LAYOUTS = {"gemv": ("nt",), "rows": ("nt",), "cols": ("nn",), "tile": ("nt", "nn")}


def fmt_cfg(cfg) -> str:
    if cfg.kind == "gemv":
        return f"gemv(w{cfg.warps} r{cfg.rows} u{cfg.unroll} kc{cfg.kc} wv{cfg.waves:g} pf{cfg.prefetch})"
    if cfg.kind == "rows":
        return f"rows(w{cfg.warps} c{cfg.chunks} r{cfg.rows} u{cfg.unroll} wv{cfg.waves:g} pf{cfg.prefetch})"
    if cfg.kind == "cols":
        return (
            f"cols(w{cfg.warps} c{cfg.chunks} u{cfg.unroll} kc{cfg.kc} b{cfg.blocks} "
            f"wv{cfg.waves:g} pf{cfg.prefetch})"
        )
    return (
        f"tile({cfg.bn}x{cfg.bm}x{cfg.bk} s{cfg.stages} {cfg.wn}x{cfg.wm} wv{cfg.waves:g} pf{cfg.prefetch})"
    )


# --------------------------------------------------------------------------- 1. compile


def _compile_one(job):
    """Worker: one module for one arch into the disk cache; (name, seconds, error or None)."""
    options, kernel, arch = job
    from kernellab.cuda.runtime import Module

    t0 = time.perf_counter()
    try:
        Module(cs.SOURCE, options=options).compile(arch)
        return kernel, time.perf_counter() - t0, None
    except Exception as e:  # noqa: BLE001 - reported by the parent
        return kernel, time.perf_counter() - t0, f"{type(e).__name__}: {str(e)[:300]}"


def compile_stage(arch: str, pairs) -> int:
    jobs = sorted({(cs.module_for(c, k).options, k, arch) for c, k in pairs})
    workers = max(1, min(16, os.cpu_count() or 1, len(jobs)))
    t0 = time.perf_counter()
    ctx = multiprocessing.get_context("spawn")  # no CUDA state crosses into the workers
    fails = 0
    try:
        with ProcessPoolExecutor(workers, mp_context=ctx) as ex:
            done = list(ex.map(_compile_one, jobs))
    except Exception as e:  # noqa: BLE001 - no worker processes here: compile in this one
        print(f"  worker pool failed ({type(e).__name__}: {e}); compiling here", flush=True)
        done, workers = [_compile_one(j) for j in jobs], 1
    for kernel, _sec, err in done:
        if err:
            fails += 1
            print(f"  compile FAILED {kernel}: {err}", flush=True)
    print(f"compiled {len(jobs)} modules for {arch} in {time.perf_counter() - t0:.1f}s "
          f"({workers} processes), {fails} failures", flush=True)  # fmt: skip
    return fails


def all_pairs(ms):
    pairs = list(cs.table_kernels())
    for m in set(ms) | set(CORRECT_MS):
        for cfg in candidates(m):  # (bf16 only: the sweep and the candidates' check)
            for layout in LAYOUTS[cfg.kind]:
                pairs.append((cfg, cfg.kernel(m, layout, torch.bfloat16)))
    return pairs


# --------------------------------------------------------------------------- helpers


def timer():
    import triton.testing

    def run(fn):
        q = triton.testing.do_bench(fn, warmup=5, rep=20, quantiles=[0.5, 0.2, 0.8])
        return tuple(float(x) for x in q)

    return run


def judged(y, ref, dtype, base):
    from kernellab.harness.compare import judge

    return judge(y, ref, dtype, base)


def weight_views(w, layout):
    """b [K, N] holding W.t() in ``layout``."""
    n, k = w.shape
    if layout == "nt":
        return w.t()
    if layout == "nn":
        return w.t().contiguous()
    if layout == "sliced":  # strides (2, 2 K): neither layout, packed by the launcher
        return torch.stack([w, w], 2).reshape(n, 2 * k)[:, ::2].t()
    flat = torch.empty(n * k + 1, dtype=w.dtype, device=w.device)  # misaligned by one element
    flat[1:].copy_(w.flatten())
    return flat[1:].view(n, k).t()


def row(meta, backend, m, n, k, dname, q, status, **extra):
    return {
        "op": "matmul",
        "bench": "skinny_cuda",
        "backend": backend,
        "mode": "fwd",
        "shape": f"{m}x{n}x{k}",
        "dtype": dname,
        "median_ms": q[0] if q else None,
        "p20_ms": q[1] if q else None,
        "p80_ms": q[2] if q else None,
        "gbps": n * k * 2 / q[0] / 1e6 if q else None,
        "status": status,
        **meta,
        **extra,
    }


# --------------------------------------------------------------------------- 2. correctness


def correctness_stage(meta, jsonl, write) -> int:
    print(
        "\n## correctness against float64 (TABLE's configs; layouts nt, nn, sliced, misaligned)", flush=True
    )
    fails = cases = 0
    for dname, n, k in CORRECT_SHAPES:
        dtype = DT[dname]
        gen = torch.Generator(device="cuda").manual_seed(n * 7 + k)
        w = (torch.randn(n, k, generator=gen, device="cuda") * k**-0.5).to(dtype)
        for m in CORRECT_MS:
            x = torch.randn(m, k, generator=gen, device="cuda").to(dtype)
            ref = x.double() @ w.double().t()
            base = torch.nn.functional.linear(x, w)
            bad = []
            for layout in ("nt", "nn", "sliced", "misaligned"):
                b = weight_views(w, layout)
                cases += 1
                try:
                    y = cs.skinny_product(x, b)
                    v = judged(y, ref, dtype, base)
                    same = torch.equal(y, cs.skinny_product(x, b))
                except Exception as e:  # noqa: BLE001 - reported, the run goes on
                    bad.append(f"{layout}: {type(e).__name__}: {str(e)[:200]}")
                    continue
                if not v.ok or not same:
                    bad.append(f"{layout}: {v.detail if not v.ok else 'not bitwise repeatable'}")
            fails += len(bad)
            p = cs.plan(m, n, k, "nt", dtype, torch.cuda.get_device_properties(0).multi_processor_count)
            status = "ok" if not bad else "FAIL " + "; ".join(bad)
            print(
                f"  {dname} {m:4d}x{n:5d}x{k:5d} {fmt_cfg(p.config):38s} S={p.splits:<3d} {status}",
                flush=True,
            )
            write([row(meta, "cuda_skinny_check", m, n, k, dname, None, "ok", verdict=status)])
    # every candidate at one odd, misaligned shape (both layouts): the element paths
    n, k = 1000, 3000
    gen = torch.Generator(device="cuda").manual_seed(5)
    w = (torch.randn(n, k + 3, generator=gen, device="cuda") / 50).bfloat16()[:, :k]  # row stride k + 3
    for m in (1, 9, 16, 33, 64, 128):
        x = torch.randn(m, k, generator=gen, device="cuda").bfloat16()
        ref = x.double() @ w.double().t()
        base = torch.nn.functional.linear(x, w)
        for cfg in candidates(m):
            for b in (w.t(), w.t().contiguous()):
                if ("nn" if b.stride(1) == 1 else "nt") not in LAYOUTS[cfg.kind]:
                    continue
                cases += 1
                try:
                    v = judged(cs.skinny_product(x, b, cfg), ref, torch.bfloat16, base)
                    ok, why = v.ok, v.detail
                except Exception as e:  # noqa: BLE001
                    ok, why = False, f"{type(e).__name__}: {str(e)[:200]}"
                if not ok:
                    fails += 1
                    print(
                        f"  candidate {fmt_cfg(cfg)} M={m} {'nt' if b.stride(0) == 1 else 'nn'}: FAIL {why}"
                    )
    # gradients through the registered backend
    import kernellab

    x = torch.randn(16, 1024, device="cuda").bfloat16().requires_grad_()
    w = (torch.randn(2048, 1024, device="cuda") / 32).bfloat16().requires_grad_()
    dy = torch.randn(16, 2048, device="cuda").bfloat16()
    got = torch.autograd.grad(kernellab.matmul(x, w.t(), backend="cuda_skinny"), (x, w), dy)
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    ref = torch.autograd.grad(x64 @ w64.t(), (x64, w64), dy.double())
    xt, wt = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    base = torch.autograd.grad(xt @ wt.t(), (xt, wt), dy)
    gok = all(judged(g, r, torch.bfloat16, t).ok for g, r, t in zip(got, ref, base))
    cases += 1
    fails += not gok
    print(f"  gradients through kernellab.matmul(backend='cuda_skinny'): {'ok' if gok else 'FAIL'}")
    print(f"correctness: {cases} cases, {fails} failures", flush=True)
    return fails


# --------------------------------------------------------------------------- 3. bench + sweep


def bench_stage(args, meta, write, t_start, weights, ms):
    import kernellab

    timeit = timer()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(
        f"\n## bf16 y = x @ b, b {args.layout}: us (median, L2 flushed), weight GB/s, x = cuBLAS time / this",
        flush=True,
    )
    hdr = f"{'M':>4s} {'N':>6s} {'K':>6s} | {'cuBLAS':>7s} {'GB/s':>5s} | {'triton':>7s} {'x':>5s} | "
    hdr += f"{'table':>7s} {'GB/s':>5s} {'x':>5s} {'S':>3s} | {'best':>7s} {'x':>5s}  best config (S)"
    print(hdr, flush=True)
    results = {}  # (m, n, k) -> {cfg: x cuBLAS}
    summary = []
    fails = 0
    for n, k in weights:
        gen = torch.Generator(device="cuda").manual_seed(n + k)
        w = (torch.randn(n, k, generator=gen, device="cuda") * k**-0.5).bfloat16()
        w64t = w.double().t()
        for m in ms:
            if time.perf_counter() - t_start > args.max_seconds:
                print(f"bench: stopped at --max-seconds {args.max_seconds}", flush=True)
                return results, summary, fails
            x = torch.randn(m, k, generator=gen, device="cuda").bfloat16()
            ref = x.double() @ w64t
            base = torch.nn.functional.linear(x, w)
            wt = w.t() if args.layout == "nt" else w.t().contiguous()  # nn: b [K, N] row-major

            def measure(name, fn, **extra):
                nonlocal fails
                try:
                    v = judged(fn(), ref, torch.bfloat16, base)
                    q = timeit(fn)
                except Exception as e:  # noqa: BLE001 - reported, the run goes on
                    print(f"  {m}x{n}x{k} {name}: {type(e).__name__}: {str(e)[:200]}", flush=True)
                    fails += 1
                    return None
                fails += not v.ok
                write([row(meta, name, m, n, k, "bf16", q, "ok" if v.ok else "rejected",
                           err_ratio=v.ratio, verdict=v.detail or "ok", **extra)])  # fmt: skip
                return q[0] if v.ok else None

            t_cublas = measure("torch", lambda: torch.matmul(x, wt))
            t_triton = measure("triton", lambda: kernellab.matmul(x, wt, backend="triton"))
            p = cs.plan(m, n, k, args.layout, torch.bfloat16, sms)
            t_table = measure("cuda_skinny", lambda: kernellab.matmul(x, wt, backend="cuda_skinny"),
                              config=fmt_cfg(p.config), splits=p.splits)  # fmt: skip
            times, seen = {}, {}
            if not args.no_sweep:
                for cfg in candidates(m, args.layout):
                    cp = cs.plan(m, n, k, args.layout, torch.bfloat16, sms, cfg)
                    key = (cp.kernel, cfg.macros(), cp.grid, cp.kchunk)
                    if key not in seen:
                        fn = lambda cfg=cfg: cs.skinny_product(x, wt, cfg)  # noqa: E731
                        seen[key] = measure("cuda_skinny_sweep", fn, config=fmt_cfg(cfg), splits=cp.splits)
                    if seen[key] is not None:
                        times[cfg] = (seen[key], cp.splits)
            if t_cublas is None:
                continue
            results[(m, n, k)] = {c: t_cublas / t for c, (t, _) in times.items()}
            best = min(times, key=lambda c: times[c][0]) if times else None

            def us(t):
                return f"{t * 1e3:7.1f}" if t else f"{'-':>7s}"

            def x_(t):
                return f"{t_cublas / t:5.2f}" if t else f"{'-':>5s}"

            gb = n * k * 2 / 1e6
            line = f"{m:4d} {n:6d} {k:6d} | {us(t_cublas)} {gb / t_cublas:5.0f} | "
            line += f"{us(t_triton)} {x_(t_triton)} | "
            line += f"{us(t_table)} {gb / t_table if t_table else 0:5.0f} {x_(t_table)} {p.splits:3d} | "
            if best is not None:
                line += f"{us(times[best][0])} {x_(times[best][0])}  {fmt_cfg(best)} (S={times[best][1]})"
            print(line, flush=True)
            top = times[best][0] if best is not None else None
            summary.append((m, n, k, t_cublas / t_table if t_table else 0.0, t_cublas / top if top else 0.0))
        del w, w64t
    return results, summary, fails


def suggest_table(results, layout: str = "nt") -> list[str]:
    """Per M bucket, the candidate with the best geometric mean of x cuBLAS over every shape
    of the bucket that measured it (a candidate missing a shape is left out)."""
    lines = []
    for b in BUCKETS:
        keys = [key for key in results if bucket(key[0]) == b]
        if not keys:
            continue
        cands = set.intersection(*(set(results[key]) for key in keys))
        if not cands:
            continue

        def gmean(c):
            return math.exp(sum(math.log(results[key][c]) for key in keys) / len(keys))

        best = max(cands, key=gmean)
        worst = min(results[key][best] for key in keys)
        note = f"  # geomean {gmean(best):.2f}x cuBLAS, worst {worst:.2f}x over {len(keys)} shapes"
        lines.append(f'    ({b}, ("{layout}",), {best!r}),{note}')
    return lines


# --------------------------------------------------------------------------- main


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--quick", action="store_true", help="M 1, 16, 64, 128 and no LM head")
    p.add_argument("--no-sweep", action="store_true", help="TABLE's configs only")
    p.add_argument(
        "--compile-only", action="store_true", help="compile every module, then stop (no GPU needed)"
    )
    p.add_argument("--max-seconds", type=float, default=170.0, help="start no shape after this")
    p.add_argument("--layout", choices=("nt", "nn"), default="nt", help="b as W.t() (nt) or row-major [K, N]")
    p.add_argument("--ms", default=None, help="comma-separated M values (instead of --quick's or all)")
    p.add_argument("--weights", default=None, help="comma-separated NxK weights, e.g. 14336x4096,4097x4095")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    weights, ms = (QUICK_WEIGHTS, QUICK_MS) if args.quick else (WEIGHTS, MS)
    if args.ms:
        ms = tuple(int(v) for v in args.ms.split(","))
    if args.weights:
        weights = tuple(tuple(int(d) for d in v.split("x")) for v in args.weights.split(","))
    has_gpu = torch.cuda.is_available()
    if has_gpu:
        major, minor = torch.cuda.get_device_capability(0)
        arch = f"sm_{major}{minor}"
    else:
        arch = "sm_90"
    fails = compile_stage(arch, all_pairs(ms))
    if args.compile_only:
        return 1 if fails else 0
    if not has_gpu:
        print("no GPU: --compile-only is what runs here")
        return 2
    from kernellab.harness.bench import git_sha, versions
    from kernellab.harness.results import write_jsonl

    gpu = torch.cuda.get_device_name()
    meta = {"gpu": gpu, **versions(), "git_sha": git_sha(), "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
    print(f"{gpu}  torch {meta['torch']}  triton {meta['triton']}  sha {meta['git_sha']}", flush=True)
    jsonl = out / "skinny_cuda.jsonl"

    def write(rows):
        write_jsonl([{**r, "layout": args.layout} for r in rows], jsonl)

    fails += correctness_stage(meta, jsonl, write)
    results, summary, bfails = bench_stage(args, meta, write, t_start, weights, ms)
    fails += bfails
    if summary:
        below = [s for s in summary if s[3] < 0.95]
        below_best = [s for s in summary if s[4] < 0.95]
        worst = min(summary, key=lambda s: s[3])
        print(
            f"\ncuda_skinny (TABLE) vs cuBLAS: worst {worst[3]:.2f}x at {worst[0]}x{worst[1]}x{worst[2]}; "
            f"{len(below)} of {len(summary)} below 0.95x (best candidate per shape: {len(below_best)} below)"
        )
    rows = suggest_table(results, args.layout)
    if rows:
        print("\nsuggested TABLE (src/kernellab/ops/matmul/cuda_skinny.py), best geomean per M bucket:")
        print("TABLE = (\n" + "\n".join(rows) + "\n)")
    print(f"total {time.perf_counter() - t_start:.0f}s; {fails} failures; rows in {jsonl}", flush=True)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
