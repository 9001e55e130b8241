"""Skinny matmuls (M = 1-128) on a lent GPU: cuBLAS, the tiled Triton kernel, the skinny one.

    python lab/gpu_skinny.py --out $OUT [--tune] [--sweep] [--max-seconds 170]

For bf16 and fp16, M in {1, 2, 4, 8, 16, 32, 64, 128} and the decode / LM-head weights
(N, K) in {(14336, 4096), (4096, 14336), (4096, 4096), (50257, 768), (128256, 2048),
(3072, 768)}, y = x @ W.t() with W [N, K] contiguous (nn.Linear's layout: b has unit
stride along K). Timed with ``triton.testing.do_bench`` (median, p20, p80; it zeroes a
256 MB buffer before every call, so W never comes from the 50 MB L2):

- ``torch``: torch.matmul (cuBLAS);
- ``triton_old``: the tiled kernel (``triton_general_fwd``), untuned (no_autotune: its
  first pruned config; the tuned tiles take minutes per shape to find);
- ``triton_skinny``: ``triton_skinny_fwd`` with ``skinny_config``'s choice (no tuning);
- ``triton_skinny_tuned`` (--tune): the same, autotuned among ``skinny_candidates``
  (~15 s per new key: run it with a larger --max-seconds).

Every output is judged against float64 (kernellab's rule: error <= 2 x cuBLAS's + a floor).
The table prints ms, GB/s of weight bytes (N K elem / time) and each kernel's speed
relative to cuBLAS ("x": cuBLAS ms / its ms; the issue's target is >= 0.95). Then
forward + backward (x.requires_grad; with W too at two shapes) through
``kernellab.matmul(x, W.t(), backend="triton")`` against torch autograd.
--sweep (bf16, M in {1, 16, 64, 128}) times every autotune candidate and the heuristic's
tiles with half and twice its K slices, and prints the best against the heuristic.

Rows go to $OUT/skinny.jsonl (kernellab's row fields; ``gbps`` is weight bytes / time).
No stage starts after --max-seconds (default 170 s): the default run takes ~2-3 minutes,
first compiles included. --cpu-dry-run runs tiny shapes on the CPU (interpreter) to
exercise the script.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402

import kernellab  # noqa: E402
from kernellab import triton_support  # noqa: E402
from kernellab.harness.bench import git_sha, versions  # noqa: E402
from kernellab.harness.compare import judge  # noqa: E402
from kernellab.harness.results import write_jsonl  # noqa: E402
from kernellab.ops.matmul import triton as tm  # noqa: E402

MS = (1, 2, 4, 8, 16, 32, 64, 128)
SHAPES = ((14336, 4096), (4096, 14336), (4096, 4096), (50257, 768), (128256, 2048), (3072, 768))
DT = {"bf16": torch.bfloat16, "fp16": torch.float16}
FWDBWD = (  # (M, N, K, W needs a gradient too)
    (1, 4096, 4096, False),
    (16, 14336, 4096, False),
    (128, 4096, 14336, False),
    (8, 50257, 768, False),
    (16, 14336, 4096, True),
    (128, 4096, 4096, True),
)


def timer(dev):
    """ms (median, p20, p80) of fn(): do_bench on a GPU (L2 flushed before each call),
    a few wall-clock calls on the CPU (the dry run)."""
    if dev == "cuda":
        import triton.testing

        def run(fn):
            q = triton.testing.do_bench(fn, warmup=10, rep=50, quantiles=[0.5, 0.2, 0.8])
            return tuple(float(x) for x in q)

        return run

    def run(fn):
        ts = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e3)
        ts.sort()
        return ts[1], ts[0], ts[2]

    return run


def row(meta, backend, mode, m, n, k, dname, q, gbps, status="ok", **extra):
    return {
        "op": "matmul",
        "bench": "skinny",
        "backend": backend,
        "mode": mode,
        "shape": f"{m}x{n}x{k}",
        "dtype": dname,
        "median_ms": q[0] if q else None,
        "p20_ms": q[1] if q else None,
        "p80_ms": q[2] if q else None,
        "gbps": gbps,
        "status": status,
        **meta,
        **extra,
    }


def forward_stage(args, dev, meta, jsonl, t_start, timeit, shapes, ms, dtypes):
    print("\n## forward: y = x @ W.t(), W [N, K] contiguous; ms, weight GB/s, cuBLAS / ours", flush=True)
    hdr = f"{'dtype':5s} {'M':>4s} {'N':>6s} {'K':>6s} | {'cuBLAS ms':>9s} {'GB/s':>5s} | "
    hdr += f"{'old ms':>8s} {'x':>5s} | "
    hdr += f"{'new ms':>8s} {'GB/s':>5s} {'x':>5s} | {'config (BN,BK,S,w,st)':22s} err/cuBLAS"
    if args.tune:
        hdr += f" | {'tuned ms':>8s} {'x':>5s}"
    print(hdr, flush=True)
    n_sm = triton_support.sm_count(0) if dev == "cuda" else tm._SKINNY_CPU_SMS
    failures = 0
    summary = []
    for dname in dtypes:
        dtype = DT[dname]
        for n, k in shapes:
            if time.perf_counter() - t_start > args.max_seconds:
                print(f"forward: stopped at --max-seconds {args.max_seconds}", flush=True)
                return failures, summary
            gen = torch.Generator(device=dev).manual_seed(n + k)
            w = (torch.randn(n, k, generator=gen, device=dev) * k**-0.5).to(dtype)
            w64 = w.double()
            wt = w.t()
            wbytes = n * k * w.element_size()
            for m in ms:
                x = torch.randn(m, k, generator=gen, device=dev).to(dtype)
                ref = x.double() @ w64.t()
                y_t = torch.matmul(x, wt)
                impls = {
                    "torch": lambda: torch.matmul(x, wt),
                    "triton_old": lambda: tm.triton_general_fwd(x, wt),
                    "triton_skinny": lambda: tm.triton_skinny_fwd(x, wt, tune=False),
                }
                if args.tune:
                    impls["triton_skinny_tuned"] = lambda: tm.triton_skinny_fwd(x, wt, tune=True)
                res = {}
                for name, fn in impls.items():
                    ctx = triton_support.no_autotune() if name == "triton_old" else contextlib.nullcontext()
                    with ctx:
                        try:
                            y = fn()
                            v = judge(y, ref, dtype, y_t)
                            q = timeit(fn)
                        except Exception as e:  # noqa: BLE001 - reported, the run goes on
                            print(f"  {dname} {m}x{n}x{k} {name}: {type(e).__name__}: {e}", flush=True)
                            failures += 1
                            continue
                    ok = v.ok
                    failures += not ok
                    extra = {"verdict": v.detail or "ok", "err_ratio": v.ratio}
                    if name == "triton_skinny":
                        extra["config"] = list(tm.skinny_config(m, n, k, n_sm, w.element_size()))
                    r = row(
                        meta, name, "fwd", m, n, k, dname, q, wbytes / q[0] / 1e6, "ok" if ok else "rejected"
                    )
                    write_jsonl([{**r, **extra}], jsonl)
                    res[name] = (q[0], ok, v.ratio)
                if "torch" not in res or "triton_skinny" not in res:
                    continue
                base = res["torch"][0]

                def col(name):
                    if name not in res:
                        return f"{'-':>8s} {'-':>5s}"
                    t, ok, _ = res[name]
                    return f"{t:8.4f} {base / t:5.2f}" + ("" if ok else " FAIL")

                new = res["triton_skinny"]
                cfg = tm.skinny_config(m, n, k, n_sm, w.element_size())
                line = f"{dname:5s} {m:4d} {n:6d} {k:6d} | {base:9.4f} {wbytes / base / 1e6:5.0f} | "
                line += (
                    f"{col('triton_old')} | {new[0]:8.4f} {wbytes / new[0] / 1e6:5.0f} {base / new[0]:5.2f}"
                )
                line += f" | {str(cfg):22s} {new[2]:.2f}{'' if new[1] else ' FAIL'}"
                if args.tune:
                    line += f" | {col('triton_skinny_tuned')}"
                print(line, flush=True)
                summary.append((dname, m, n, k, base / new[0]))
            del w, w64, wt
    return failures, summary


def fwdbwd_stage(args, dev, meta, jsonl, t_start, timeit, cases):
    print("\n## forward + backward, bf16: kernellab.matmul(x, W.t(), backend='triton') vs torch", flush=True)
    failures = 0
    for m, n, k, wgrad in cases:
        if time.perf_counter() - t_start > args.max_seconds:
            print(f"fwd+bwd: stopped at --max-seconds {args.max_seconds}", flush=True)
            break
        gen = torch.Generator(device=dev).manual_seed(m + n)
        w = (torch.randn(n, k, generator=gen, device=dev) * k**-0.5).bfloat16().requires_grad_(wgrad)
        x = torch.randn(m, k, generator=gen, device=dev).bfloat16().requires_grad_()
        dy = torch.randn(m, n, generator=gen, device=dev).bfloat16()
        leaves = (x, w) if wgrad else (x,)

        def step(f):
            return torch.autograd.grad(f(x, w.t()), leaves, dy)

        def ours(a, b):
            return kernellab.matmul(a, b, backend="triton")

        res = {}
        with triton_support.no_autotune():  # (--tune tunes the forward table above only)
            for name, f in (("torch", torch.matmul), ("triton", ours)):
                got = step(f)
                q = timeit(lambda f=f: step(f))
                res[name] = (q, got)
        # gradients against torch's (float64 of the same ops would need a second autograd pass)
        x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_(wgrad)
        ref = torch.autograd.grad(x64 @ w64.t(), (x64, w64) if wgrad else (x64,), dy.double())
        ok = all(judge(g, r, torch.bfloat16, t).ok for g, r, t in zip(res["triton"][1], ref, res["torch"][1]))
        failures += not ok
        tq, oq = res["torch"][0], res["triton"][0]
        wb = n * k * 2
        for name, q in (("torch", tq), ("triton", oq)):
            r = row(
                meta,
                name,
                "fwdbwd",
                m,
                n,
                k,
                "bf16",
                q,
                wb / q[0] / 1e6,
                "ok" if ok or name == "torch" else "rejected",
            )
            write_jsonl([{**r, "wgrad": wgrad}], jsonl)
        what = "dx, dW" if wgrad else "dx"
        print(
            f"  {m:4d}x{n:6d}x{k:6d} ({what:6s}): torch {tq[0]:.4f} ms, triton {oq[0]:.4f} ms, "
            f"torch / triton {tq[0] / oq[0]:.2f}  grads {'ok' if ok else 'FAIL'}",
            flush=True,
        )
    return failures


def sweep_stage(args, dev, meta, jsonl, t_start, timeit, shapes):
    print("\n## sweep (bf16): every candidate config; best against the heuristic", flush=True)
    n_sm = triton_support.sm_count(0) if dev == "cuda" else tm._SKINNY_CPU_SMS
    for n, k in shapes:
        gen = torch.Generator(device=dev).manual_seed(n + k)
        wt = (torch.randn(n, k, generator=gen, device=dev) * k**-0.5).bfloat16().t()
        for m in (1, 16, 64, 128):
            if time.perf_counter() - t_start > args.max_seconds:
                print(f"sweep: stopped at --max-seconds {args.max_seconds}", flush=True)
                return
            x = torch.randn(m, k, generator=gen, device=dev).bfloat16()
            heur = tm.skinny_config(m, n, k, n_sm, 2)
            cands = list(tm.skinny_candidates(m, n, k, n_sm, 2))
            bn, bk, s, w, st = heur
            kb = triton_support.cdiv(k, bk)
            for s2 in (s // 2, s * 2, 1):
                if 1 <= s2 <= min(kb, tm.SKINNY_SPLIT_MAX) and (bn, bk, s2, w, st) not in cands:
                    cands.append((bn, bk, s2, w, st))
            times = {}
            for cfg in cands:
                try:
                    times[cfg] = timeit(lambda cfg=cfg: tm.triton_skinny_fwd(x, wt, config=cfg))[0]
                except Exception as e:  # noqa: BLE001 - a config that does not compile or fit
                    print(f"  {m}x{n}x{k} {cfg}: {type(e).__name__}: {str(e)[:100]}", flush=True)
            if not times:
                continue
            best = min(times, key=times.get)
            write_jsonl(
                [
                    row(
                        meta,
                        "triton_skinny_sweep",
                        "fwd",
                        m,
                        n,
                        k,
                        "bf16",
                        (t, t, t),
                        n * k * 2 / t / 1e6,
                        config=list(c),
                    )
                    for c, t in times.items()
                ],
                jsonl,
            )
            h = times.get(heur, float("nan"))
            print(
                f"  {m:4d}x{n:6d}x{k:6d}: heuristic {heur} {h:.4f} ms; best {best} {times[best]:.4f} ms "
                f"({h / times[best]:.2f}x)",
                flush=True,
            )


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--tune", action="store_true", help="also time the autotuned skinny kernel (slow)")
    p.add_argument("--sweep", action="store_true", help="time every candidate config (bf16, 4 Ms)")
    p.add_argument("--dtypes", default="bf16,fp16")
    p.add_argument("--max-seconds", type=float, default=170.0, help="start no stage or shape after this")
    p.add_argument("--cpu-dry-run", action="store_true", help="tiny shapes on the CPU: tests this script")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dry = args.cpu_dry_run
    if not dry and not torch.cuda.is_available():
        print("no GPU (use --cpu-dry-run to exercise the script on the CPU)")
        return 2
    dev = "cpu" if dry else "cuda"
    gpu = "cpu dry run" if dry else torch.cuda.get_device_name()
    meta = {"gpu": gpu, **versions(), "git_sha": git_sha(), "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
    print(f"{gpu}  torch {meta['torch']}  triton {meta['triton']}  sha {meta['git_sha']}", flush=True)
    jsonl = out / "skinny.jsonl"
    timeit = timer(dev)
    t_start = time.perf_counter()
    shapes = ((200, 300), (65, 129)) if dry else SHAPES
    ms = (1, 3, 17) if dry else MS
    dtypes = [d for d in args.dtypes.split(",") if d]
    fails, summary = forward_stage(args, dev, meta, jsonl, t_start, timeit, shapes, ms, dtypes)
    cases = ((3, 200, 300, False), (5, 65, 129, True)) if dry else FWDBWD
    if dev == "cpu":  # the routed path takes the skinny kernels on a GPU only
        print("(dry run: kernellab.matmul on the CPU runs the tiled kernel)")
    fails += fwdbwd_stage(args, dev, meta, jsonl, t_start, timeit, cases)
    if args.sweep:
        sweep_stage(args, dev, meta, jsonl, t_start, timeit, shapes)
    if summary:
        worst = min(summary, key=lambda s: s[-1])
        below = [s for s in summary if s[-1] < 0.95]
        print(
            f"\nskinny vs cuBLAS: worst {worst[-1]:.2f}x at {worst[0]} {worst[1]}x{worst[2]}x{worst[3]}; "
            f"{len(below)} of {len(summary)} cases below 0.95x",
            flush=True,
        )
    print(f"total {time.perf_counter() - t_start:.0f}s; {fails} failures; rows in {jsonl}", flush=True)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
