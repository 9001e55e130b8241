"""The conv ladder of issue 18: cuda_v1 -> cuda_v2 -> cuda (-> cuda_v4, tensor cores, 16-bit),
triton, fft against cuDNN
(backend "torch"), at the MNIST model's conv layers (batch 64, 256, 1024) and the issue's
large layer (N 32, C 64, 56x56, K 64, 3x3), all 3x3 with padding 1; fwd and fwdbwd;
TFLOP/s from the OpSpec's count (2 N K P Q C R S per pass, fwdbwd 3x) and % of cuDNN's
time. Then where FFT convolution wins and loses: fwd by kernel size (3 .. 15, "same"
padding) at 8 x 32 x 64 x 64 -> 32, in each dtype.

    PYTHONPATH=src python lab/conv_ladder.py --out $OUT [--dtypes fp32,bf16]
        [--budget 0.5] [--tf32] [--no-kernel-sweep] [--check]

Timing through the harness (kernellab.harness.bench: CUDA events, L2 flushed, every
backend admitted by a quick correctness check first and its timed output re-checked).
TF32 is off for everyone unless --tf32 (cuDNN's fp32 convolution takes TF32 by default;
our cuda kernels never use it, the Triton kernel follows torch.backends.cudnn.allow_tf32).
The backward of cuda_v1 and cuda_v2 is cuda's (their fwdbwd rows differ in the forward
only). --check first runs `check` (quick) of every conv2d backend on the GPU.

Writes to --out: conv_ladder.jsonl (bench rows; the kernel sweep's rows carry
"sweep": "kernel_size"), conv_check.json (with --check) and conv_ladder.md, the tables
printed last. Expected: ~3-5 minutes on an H100 with the defaults (most of it the
admission checks and cuda_v1 at batch 1024).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

LADDER = ["cuda_v1", "cuda_v2", "cuda", "cuda_v4", "triton", "fft", "torch"]  # (cuda_v4: 16-bit only)
MNIST = [(b, 1, 28, 28, 32, 3, 3) for b in (64, 256, 1024)]
MNIST += [(b, 32, 14, 14, 64, 3, 3) for b in (64, 256, 1024)]
LARGE = [(32, 64, 56, 56, 64, 3, 3)]
SWEEP_KERNELS = (3, 5, 7, 9, 11, 15)


def _log(msg: str) -> None:
    print(msg, flush=True)


def run_checks(out: Path, dtypes) -> None:
    from kernellab.core import registry
    from kernellab.harness.check import check_impl

    reports = []
    for impl in registry.impls("conv2d"):
        if impl.backend == "compile":
            continue
        for dtype in dtypes:
            t = time.time()
            rep = check_impl(impl, dtype, device="cuda", quick=True)
            reports.append(rep.to_dict())
            fails = "; ".join(f"{c.kind} {c.name}: {c.detail}"[:160] for c in rep.failures[:3])
            took = time.time() - t
            _log(f"check conv2d {impl.backend:8s} {str(dtype)[6:]:9s} {rep.status:9s} {took:5.1f} s {fails}")
    (out / "conv_check.json").write_text(json.dumps(reports, indent=1, default=str))


def _table(rows, title: str) -> str:
    """Per shape x dtype x mode: each backend's median ms, TFLOP/s and % of cuDNN (cuDNN
    time / its time: above 100% is faster than cuDNN)."""
    lines = [
        f"### {title}",
        "",
        "| shape (N,C,H,W,K,R,S) | dtype | mode | backend | ms | TFLOP/s | % of cuDNN |",
        "|---|---|---|---|---:|---:|---:|",
    ]
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["shape"], r["dtype"], r["mode"], r.get("options", "")), []).append(r)
    for (shape, dtype, mode, opts), group in groups.items():
        base = next((r for r in group if r["backend"] == "torch" and r.get("status") == "ok"), None)
        for r in sorted(group, key=lambda r: LADDER.index(r["backend"]) if r["backend"] in LADDER else 99):
            if r.get("status") != "ok":
                lines.append(f"| {shape} {opts} | {dtype} | {mode} | {r['backend']} | {r.get('status')}: "
                             f"{str(r.get('reason', ''))[:60]} | | |")  # fmt: skip
                continue
            pct = f"{100 * base['median_ms'] / r['median_ms']:.0f}%" if base else "-"
            lines.append(f"| {shape} {opts} | {dtype} | {mode} | {r['backend']} | {r['median_ms']:.4f} | "
                         f"{r['tflops']:.2f} | {pct} |")  # fmt: skip
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=".", help="folder for the JSONL rows and the summary")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--budget", type=float, default=0.5, help="seconds of timing per row (at most)")
    ap.add_argument("--tf32", action="store_true", help="allow TF32 for fp32 (cuDNN and Triton)")
    ap.add_argument("--no-kernel-sweep", action="store_true")
    ap.add_argument("--check", action="store_true", help="quick check of every conv2d backend first")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("conv_ladder: needs a GPU", file=sys.stderr)
        return 2

    from kernellab.core.spec import parse_dtype
    from kernellab.harness import bench, results

    torch.backends.cudnn.allow_tf32 = args.tf32
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dtypes = [parse_dtype(d) for d in args.dtypes.split(",")]
    if args.check:
        run_checks(out, dtypes)
    path = out / "conv_ladder.jsonl"
    if path.exists():
        path.unlink()

    t0 = time.time()
    rows = bench.bench(
        "conv2d",
        backends=LADDER,
        shapes=MNIST + LARGE,
        dtypes=dtypes,
        modes=["fwd", "fwdbwd"],
        device="cuda",
        budget_s=args.budget,
        options={"padding": 1},
        on_row=lambda r: (
            results.write_jsonl([r], path),  # row by row: a run cut short keeps what it timed
            _log(
                f"{r['backend']:8s} {r['mode']:6s} {r['shape']:22s} {r['dtype']:5s} "
                f"{r.get('median_ms') or r.get('status')} ms {r.get('tflops') or ''}"
            ),
        ),
    )
    _log(f"ladder: {len(rows)} rows in {time.time() - t0:.0f} s")
    tables = [_table(rows, f"conv2d ladder, padding 1 (TF32 {'on' if args.tf32 else 'off'})")]

    if not args.no_kernel_sweep:
        sweep = []
        for k in SWEEP_KERNELS:
            got = bench.bench(
                "conv2d",
                backends=["cuda", "triton", "fft", "torch"],
                shapes=[(8, 32, 64, 64, 32, k, k)],
                dtypes=dtypes,
                modes=["fwd"],
                device="cuda",
                budget_s=args.budget,
                options={"padding": k // 2},
            )
            for r in got:
                r["sweep"] = "kernel_size"
            results.write_jsonl(got, path)
            sweep += got
            _log(f"kernel {k}x{k}: " + ", ".join(f"{r['backend']} {r.get('median_ms')} ms" for r in got))
        title = ("FFT against direct convolution by kernel size (fwd, 'same' padding; the FFT "
                 "transforms in fp64 for fp32 storage, in fp32 for 16-bit)")
        tables.append(_table(sweep, title))

    text = "\n\n".join(tables) + "\n"
    (out / "conv_ladder.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
