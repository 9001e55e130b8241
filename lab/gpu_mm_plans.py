"""Matmul Triton forward launch plans on a GPU: host cost per call, planned vs per call.

    PYTHONPATH=src python lab/gpu_mm_plans.py --out $OUT [--dry]

Per shape (x [M, K] @ W[N, K]^T, bf16): a plain loop's us per call of the forward and of
the forward+backward (``kernellab.matmul(x, W.t(), backend="triton")`` then
``torch.autograd.grad``), with ``kernellab.config.matmul_plans`` on and off, beside torch's
(paired rounds, ``timer.paired_us``; ratio to torch's same step). First, correctness: the
planned outputs and gradients bit-equal to the per-call ones, and within bf16's bound of
float64. Then a short cProfile of the planned forward+backward at the first shape. The
first calls autotune the big products (~5-10 s a key, ~60 s in all). Rows go to
$OUT/mm_plans.jsonl; a table is printed last. ``--dry``: tiny shapes on the CPU (the
interpreter; plans forced on with ``plan=True`` paths unused), to test the plumbing only.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time
from pathlib import Path

import torch

import kernellab
from kernellab.harness import timer
from kernellab.harness.bench import git_sha, versions
from kernellab.harness.compare import judge
from kernellab.harness.results import write_jsonl
from kernellab.ops.matmul import triton as tm

SHAPES = ((128, 4096, 4096), (16, 14336, 4096), (8192, 3072, 768))
DRY_SHAPES = ((5, 40, 33),)


def ours(a, b):
    return kernellab.matmul(a, b, backend="triton")


def planned(plans: bool, f):
    def g():
        with kernellab.config.override(matmul_plans=plans):
            return f()

    return g


def check(x, w, dy) -> str:
    """'ok', or what differs: planned vs per-call outputs and grads, both vs float64."""
    got = {}
    for plans in (True, False):
        with kernellab.config.override(matmul_plans=plans):
            xs, ws = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
            for _ in range(3):  # the third call runs the bound launches
                y = ours(xs, ws.t())
                gx, gw = torch.autograd.grad(y, (xs, ws), dy)
            got[plans] = (y, gx, gw)
    bad = [n for n, u, v in zip(("y", "dx", "dW"), got[True], got[False]) if not torch.equal(u, v)]
    if bad:
        return "planned != per call: " + ",".join(bad)
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    y64 = x64 @ w64.t()
    ref = (y64, *torch.autograd.grad(y64, (x64, w64), dy.double()))
    xt, wt = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    yt = xt @ wt.t()
    base = (yt, *torch.autograd.grad(yt, (xt, wt), dy))
    bad = [n for n, g, r, b in zip(("y", "dx", "dW"), got[True], ref, base) if not judge(g, r, x.dtype, b).ok]
    return "ok" if not bad else "vs float64: " + ",".join(bad)


def base_of(case: str) -> str:
    return "torch fwd+bwd" if "bwd" in case else "torch fwd"


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--dry", action="store_true", help="tiny shapes on the CPU: tests this script")
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.dry and not torch.cuda.is_available():
        print("no GPU (--dry runs the plumbing on the CPU)")
        return 2
    dev = "cpu" if args.dry else "cuda"
    gpu = "cpu dry run" if args.dry else torch.cuda.get_device_name()
    meta = {"gpu": gpu, **versions(), "git_sha": git_sha(), "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
    print(f"{gpu}  torch {meta['torch']}  triton {meta['triton']}  sha {meta['git_sha']}", flush=True)
    jsonl = out / "mm_plans.jsonl"
    t0 = time.perf_counter()
    table = []
    failures = 0
    for si, (m, n, k) in enumerate(DRY_SHAPES if args.dry else SHAPES):
        shape = f"{m}x{n}x{k}"
        try:
            gen = torch.Generator(device=dev).manual_seed(m + n + k)
            bf = torch.bfloat16
            x = torch.randn(m, k, generator=gen, device=dev).to(bf).requires_grad_()
            w = (torch.randn(n, k, generator=gen, device=dev) * k**-0.5).to(bf).requires_grad_()
            dy = torch.randn(m, n, generator=gen, device=dev).to(bf)
            xd, wd = x.detach(), w.detach()
            status = check(x, w, dy)
            failures += status != "ok"
            print(f"\n## {shape} bf16  check: {status}  ({time.perf_counter() - t0:.0f}s)", flush=True)

            def fb(f):
                return lambda: torch.autograd.grad(f(x, w.t()), (x, w), dy)

            cases = {
                "torch fwd": lambda: torch.matmul(xd, wd.t()),
                "triton fwd planned": planned(True, lambda: ours(xd, wd.t())),
                "triton fwd per call": planned(False, lambda: ours(xd, wd.t())),
                "torch fwd+bwd": fb(torch.matmul),
                "triton fwd+bwd planned": planned(True, fb(ours)),
                "triton fwd+bwd per call": planned(False, fb(ours)),
            }
            for f in cases.values():  # compile, tune, bind
                for _ in range(3):
                    f()
            if dev == "cuda":
                torch.cuda.synchronize()
            got = timer.paired_us(
                cases, lambda key: "torch fwd+bwd" if "bwd" in key else "torch fwd", args.rounds
            )
            for case, r in got.items():
                err = isinstance(r, Exception)
                row = {**meta, "op": "matmul", "shape": shape, "dtype": "bf16", "case": case,
                       "us_per_call": None if err else r[0], "vs_torch": None if err else r[1],
                       "status": repr(r) if err else status}  # fmt: skip
                write_jsonl([row], jsonl)
                table.append((shape, case, row["us_per_call"], row["vs_torch"], row["status"]))
                print(
                    f"  {case:26s} " + (f"error {r!r}" if err else f"{r[0]:8.1f} us  {r[1]:5.2f}x torch"),
                    flush=True,
                )
            if si == 0:
                prof(cases["triton fwd+bwd planned"], dev)
        except Exception as e:  # noqa: BLE001 - one shape's failure must not stop the rest
            failures += 1
            print(f"{shape}: {e!r}", flush=True)
            write_jsonl([{**meta, "op": "matmul", "shape": shape, "case": "error", "status": repr(e)}], jsonl)
    print(f"\n{'shape':18s} {'case':26s} {'us/call':>9s} {'x torch':>8s}  status")
    for shape, case, us, ratio, status in table:
        us_s = f"{us:9.1f}" if us is not None else "        -"
        r_s = f"{ratio:8.2f}" if ratio is not None else "       -"
        print(f"{shape:18s} {case:26s} {us_s} {r_s}  {status}")
    print(
        f"total {time.perf_counter() - t0:.0f}s; {failures} failures; "
        f"plans kept {len(tm._PLANS)}; rows in {jsonl}"
    )
    return 1 if failures else 0


def prof(f, dev):
    """Top of a cProfile of ``f`` (autograd's device threads off: the backward runs here)."""
    with torch.autograd.set_multithreading_enabled(False):
        for _ in range(5):
            f()
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(50):
            f()
        if dev == "cuda":
            torch.cuda.synchronize()
        pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(15)
    print(s.getvalue()[-3500:], flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
