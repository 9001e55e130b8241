"""Matmul on a lent GPU (issue 4): correctness of every backend, then the benchmarks.

    python lab/gpu_matmul.py --out $OUT [--quick] [--skip cuda_v9,triton_tma]

TF32 is OFF for the whole run (``torch.backends.cuda.matmul.allow_tf32 = False``, cuDNN too):
fp32 means full fp32 products for cuBLAS, Inductor, Triton (input_precision="ieee") and our
CUDA kernels alike; every JSONL row records ``tf32: false``.

1. correctness at 1000x1023x997 (scalar paths) and batched 3x129x65x257 and 2x264x392x136
   (16-byte paths, partial tiles) for every backend x dtype it supports (float64 reference,
   2 x PyTorch's error rule), forward and, for the batched shapes, gradients;
2. bf16: torch / compile / triton / triton_tma / cuda / cuda_v8 / cuda_v9 / cuda_v10 at 4096^3 and 8192^3
   -> $OUT/matmul_bench_bf16.md (first: the issue's tensor-core targets);
3. the same backends (and cuda = best fp32 variant) in fp32 -> $OUT/matmul_bench_fp32.md;
4. the fp32 CUDA ladder at 4096^3 (cuda_v1 ... cuda_v7 and cuBLAS): each rung's change, TFLOP/s,
   % of peak and gains (kernellab.harness.ladder's table) -> $OUT/matmul_ladder.md.
Each table is printed and written as soon as its stage ends; no stage starts after
--max-seconds (default 200 s) so the run stays under ~4 minutes. Small problems are not
autotuned (triton.TUNE_MIN_WORK), so stage 1 takes seconds, not minutes.
All timed rows (kernellab.harness.bench: L2 flushed, CUDA events, median of a stable run,
outputs re-checked) go to $OUT/matmul.jsonl. ``manual`` (a broadcast-multiply-sum) is only
checked, never timed at these sizes (it would take minutes).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402

torch.backends.cuda.matmul.allow_tf32 = False  # stated above: full fp32 everywhere
torch.backends.cudnn.allow_tf32 = False

import kernellab  # noqa: E402
import kernellab.ops.matmul as mm  # noqa: E402
from kernellab.harness import bench as kbench  # noqa: E402
from kernellab.harness.compare import judge  # noqa: E402
from kernellab.harness.results import write_jsonl  # noqa: E402

LADDER = [f"cuda_v{i}" for i in range(1, 8)]
TOP = ["torch", "compile", "triton", "triton_tma", "cuda", "cuda_v8", "cuda_v9", "cuda_v10"]
DT = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


# (problem shape, check gradients): no dim a multiple of 4 (scalar paths); batched with
# 16-byte paths (K, N multiples of 8) and partial tiles in every dim.
CHECK_SHAPES = (((1000, 1023, 997), False), ((3, 129, 65, 257), True), ((2, 264, 392, 136), True))


def supported(backend, dtype):
    impl = kernellab.registry.get("matmul", backend)
    return impl.dtypes is None or dtype in impl.dtypes


def correctness(lines, dev="cuda", shapes=CHECK_SHAPES, skip=()) -> bool:
    ok_all = True
    backends = [
        i.backend
        for i in kernellab.impls("matmul")
        if i.why_unavailable(dev) is None and i.backend not in skip
    ]
    for backend in backends:
        for name, dtype in DT.items():
            if not supported(backend, dtype):
                continue
            t0 = time.perf_counter()
            status = []
            for shape, grads in shapes if backend != "compile" else shapes[:1]:
                # compile: one shape, forward only (each shape and layout is a recompile;
                # the benchmark's admission check covers it on odd shapes and layouts)
                if backend == "manual" and shape[0] == 1000 and dtype != torch.float32:
                    continue
                gen = torch.Generator(device=dev).manual_seed(11)
                a, b = mm.make_matmul_inputs(shape, dtype, dev, gen)
                try:
                    y = mm.matmul(a, b, backend=backend)
                    v = judge(y, mm.SPEC.ref(a, b), dtype, torch.matmul(a, b))
                    good, detail = v.ok, f"ratio {v.ratio:.2f}" if v.ok else v.detail
                    if good and grads:
                        la, lb = a.clone().requires_grad_(), b.clone().requires_grad_()
                        dy = torch.randn(y.shape, device=dev, generator=gen).to(dtype)
                        got = torch.autograd.grad(mm.matmul(la, lb, backend=backend), (la, lb), dy)
                        a64, b64 = a.double().requires_grad_(), b.double().requires_grad_()
                        ref = torch.autograd.grad(a64 @ b64, (a64, b64), dy.double())
                        ta, tb = a.clone().requires_grad_(), b.clone().requires_grad_()
                        base = torch.autograd.grad(ta @ tb, (ta, tb), dy)
                        for g, r, t in zip(got, ref, base):
                            vg = judge(g, r, dtype, t)
                            if not vg.ok:
                                good, detail = False, "grad: " + vg.detail
                except Exception as e:  # noqa: BLE001 - reported, the run goes on
                    good, detail = False, f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
                status.append(f"{'x'.join(map(str, shape))} {'ok' if good else 'FAIL'} ({detail})")
                ok_all &= good
            line = f"check {backend:9s} {name}: " + "; ".join(status) + f"  [{time.perf_counter() - t0:.1f}s]"
            print(line, flush=True)
            lines.append(line)
    return ok_all


def ladder_table(rows) -> str:
    """The fp32 ladder of this run as `kernellab ladder matmul --dtype fp32` prints it."""
    from kernellab.harness import ladder

    timed = [r for r in rows if ladder.is_timing_row(r)]
    return ladder.to_markdown(ladder.build("matmul", timed, dtype="fp32"))


def top_table(rows) -> str:
    out = ["| shape | dtype | backend | ms | TFLOP/s | % of cuBLAS |", "|---|---|---|---:|---:|---:|"]
    groups = {}
    for r in rows:
        groups.setdefault((r["shape"], r["dtype"]), []).append(r)
    for (shape, dt), rs in groups.items():
        ref = next((r["tflops"] for r in rs if r["backend"] == "torch" and r.get("tflops")), None)
        for r in rs:
            if r.get("status") == "unavailable":
                continue
            if not r.get("tflops"):
                why = f"{r.get('status')}: {r.get('reason', '')[:60]}"
                out.append(f"| {shape} | {dt} | {r['backend']} | {why} | | |")
                continue
            pct = f"{100 * r['tflops'] / ref:.1f}%" if ref else ""
            ms, tf = r["median_ms"], r["tflops"]
            out.append(f"| {shape} | {dt} | {r['backend']} | {ms:.3f} | {tf:.1f} | {pct} |")
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--quick", action="store_true", help="correctness and the 4096^3 runs only")
    p.add_argument("--cpu-dry-run", action="store_true", help="tiny shapes on the CPU: tests this script")
    p.add_argument(
        "--skip",
        default="",
        help="comma-separated backends to leave out (e.g. one whose fault poisoned the CUDA context)",
    )
    p.add_argument(
        "--max-seconds",
        type=float,
        default=200.0,
        help="start no benchmark stage after this many seconds of run time (default 200)",
    )
    args = p.parse_args()
    skip = {b for b in args.skip.split(",") if b}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dry = args.cpu_dry_run
    if not dry and not torch.cuda.is_available():
        print("no GPU (use --cpu-dry-run to exercise the script on the CPU)")
        return 2
    dev = "cpu" if dry else "cuda"
    t_start = time.perf_counter()
    tf32 = torch.backends.cuda.matmul.allow_tf32
    gpu = "cpu dry run" if dry else torch.cuda.get_device_name()
    print(f"{gpu}  torch {torch.__version__}  allow_tf32 {tf32}")
    lines = []
    ok = correctness(
        lines, dev, (((33, 17, 21), False), ((2, 24, 40, 16), True)) if dry else CHECK_SHAPES, skip
    )
    print(f"correctness: {'all ok' if ok else 'FAILURES'} ({time.perf_counter() - t_start:.0f}s)", flush=True)

    jsonl = out / "matmul.jsonl"

    def on_row(r):
        write_jsonl([r], jsonl)
        ms = r.get("median_ms")
        tf = r.get("tflops")
        why = f"{r.get('status')} {r.get('reason', '')[:90]}"
        what = f"{ms:.3f} ms {tf:.1f} TFLOP/s" if ms and tf else why
        print(f"  {r['backend']:9s} {r['dtype']} {r['shape']}: {what}", flush=True)

    big = (64,) * 3 if dry else (4096,) * 3
    shapes = [big] + ([] if args.quick or dry else [(8192, 8192, 8192)])
    (out / "matmul_check.txt").write_text("\n".join(lines) + "\n")
    summary = {"correct": ok, "tf32": tf32, "stages": {}}

    def stage(name, backends, shape_list, dtypes, table, path, title):
        """One benchmark stage; its table is printed and written before the next starts.
        Skipped (and said so) once the run has used --max-seconds."""
        spent = time.perf_counter() - t_start
        if spent > args.max_seconds:
            msg = f"{name}: skipped, {spent:.0f}s used of --max-seconds {args.max_seconds}"
            print(msg, flush=True)
            summary["stages"][name] = "skipped"
            return []
        t0 = time.perf_counter()
        rows = kbench.bench(
            "matmul",
            [b for b in backends if b not in skip],
            shape_list,
            dtypes,
            ("fwd",),
            device=dev,
            budget_s=1.0,
            on_row=on_row,
        )
        text = table(rows)
        (out / path).write_text(text + "\n")
        print(f"\n## {title}\n{text}\n{name}: {time.perf_counter() - t0:.0f}s\n", flush=True)
        summary["stages"][name] = round(time.perf_counter() - t0)
        (out / "matmul_summary.json").write_text(json.dumps(summary, indent=2))
        return rows

    # Most wanted first (the bf16 targets), the slow fp32 ladder last.
    stage("bf16", TOP, shapes, [torch.bfloat16], top_table, "matmul_bench_bf16.md", "bf16, 4096^3 and 8192^3")
    stage("fp32", TOP, shapes, [torch.float32], top_table, "matmul_bench_fp32.md", "fp32 (TF32 off)")
    stage("ladder", LADDER + ["torch"], [big], [torch.float32], ladder_table, "matmul_ladder.md",
          "fp32 ladder, 4096^3 (TF32 off)")  # fmt: skip
    summary["seconds"] = round(time.perf_counter() - t_start)
    (out / "matmul_summary.json").write_text(json.dumps(summary, indent=2))
    print(f"total {summary['seconds']}s; correctness {'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
