"""Reductions on a lent GPU (issue 3): sum, max, argmax - every backend checked, then timed.

    python lab/gpu_reductions.py --out $OUT [--budget 0.6] [--skip compile]

1. ``kernellab.harness.check`` (quick) for every backend of sum, max and argmax x fp32 /
   fp16 / bf16 (``compile`` is left to the bench's admission check: each of its shapes
   is a fresh Inductor compile); one line each, failures with their first case;
2. v4's determinism: five runs of cuda_v4 on 2^24 + 3 values are bitwise equal;
3. benchmarks (kernellab.harness.bench: L2 flushed, CUDA events, outputs re-checked
   against float64 with the 2x-torch rule): sum fp32 and bf16 2^28 (fwd, fwdbwd), max and
   argmax fp32 and bf16 32768x4096 (fwd) - every backend side by side;
4. the sum ladder: GB/s, % of the measured copy bandwidth and the error ratio against
   torch's (``check_ratio``: our error / the bound, < 1 passes) per variant.
Rows -> $OUT/reductions.jsonl; tables -> $OUT/reductions.md (printed last).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402

import kernellab  # noqa: E402
import kernellab.ops.argmax  # noqa: E402,F401  (registers sum, max and argmax)
import kernellab.ops.max  # noqa: E402,F401
import kernellab.ops.sum  # noqa: E402,F401
from kernellab.core.spec import dtype_name  # noqa: E402
from kernellab.harness import bench as kbench  # noqa: E402
from kernellab.harness.check import check_impl  # noqa: E402
from kernellab.harness.results import pivot_table, write_jsonl  # noqa: E402

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
BENCH = [
    ("sum", [(2**28,)], ["fwd", "fwdbwd"]),
    ("max", [(32768, 4096)], ["fwd"]),
    ("argmax", [(32768, 4096)], ["fwd"]),
]
LADDER = ["cuda_v1", "cuda_v2", "cuda_v3", "cuda_v4", "cuda", "triton", "torch", "compile", "manual"]


def checks(lines) -> bool:
    ok_all = True
    for op in ("sum", "max", "argmax"):
        for impl in kernellab.impls(op):
            if impl.backend == "compile":
                continue
            for dtype in DTYPES:
                t0 = time.perf_counter()
                rep = check_impl(impl, dtype, device="cuda", quick=True, seed=17)
                bad = rep.failures
                # torch's own sum is judged by a tolerance relative to |result| (no baseline
                # to compare with), which a cancelling N(0, 1) sum can exceed: reported, not fatal.
                fatal = bad and not (op == "sum" and impl.backend == "torch")
                ok_all &= not fatal
                what = rep.status if not bad else f"FAIL {bad[0].kind} {bad[0].name}: {bad[0].detail[:150]}"
                took = time.perf_counter() - t0
                line = f"check {op:6s} {impl.backend:8s} {dtype_name(dtype)}: {what} [{took:.1f}s]"
                print(line, flush=True)
                lines.append(line)
    return ok_all


def determinism(lines) -> bool:
    impl = kernellab.get("sum", "cuda_v4")
    x = torch.randn((1 << 24) + 3, device="cuda")
    outs = [impl(x) for _ in range(5)]
    same = all(torch.equal(outs[0], o) for o in outs)
    v3 = kernellab.get("sum", "cuda_v3")
    v3_outs = {float(v3(x)) for _ in range(5)}
    line = (
        f"determinism: cuda_v4 5 runs bitwise equal: {same}; cuda_v3 (global atomics) distinct "
        f"fp32 results over 5 runs: {len(v3_outs)}"
    )
    print(line, flush=True)
    lines.append(line)
    return same


def ladder_table(rows) -> str:
    from kernellab.core.registry import get

    out = [
        "| dtype | mode | backend | what it is | ms | GB/s | % copy BW | error / bound |",
        "|---|---|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        if r["op"] != "sum" or r["backend"] not in LADDER or r.get("status") == "unavailable":
            continue
        desc = get("sum", r["backend"]).description.split(": ", 1)[-1][:70]
        if r.get("status") != "ok":
            out.append(
                f"| {r['dtype']} | {r['mode']} | {r['backend']} | {desc} | {r.get('status')}: "
                f"{(r.get('reason') or '')[:80]} | | | |"
            )
            continue
        out.append(
            f"| {r['dtype']} | {r['mode']} | {r['backend']} | {desc} | {r['median_ms']:.4f} | "
            f"{r['gbps']:.0f} | {r.get('pct_bw', '-')} | {r.get('check_ratio', '-')} |"
        )
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--budget", type=float, default=0.6, help="seconds of timing per row")
    p.add_argument(
        "--skip",
        nargs="*",
        default=[],
        help="backends left out of the bench (e.g. compile: its Inductor compiles)",
    )
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not torch.cuda.is_available():
        print("no GPU")
        return 2
    t_start = time.perf_counter()
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}", flush=True)
    lines: list[str] = []
    ok = checks(lines)
    ok &= determinism(lines)
    print(f"checks: {'all ok' if ok else 'FAILURES'} ({time.perf_counter() - t_start:.0f}s)", flush=True)

    rows = []
    for op, shapes, modes in BENCH:
        for dtype in (torch.float32, torch.bfloat16):
            t0 = time.perf_counter()
            got = kbench.bench(
                op, shapes=shapes, dtypes=[dtype], modes=modes, device="cuda", budget_s=args.budget
            )
            rows += got
            write_jsonl(got, out / "reductions.jsonl")
            for r in got:
                if r.get("status") == "ok":
                    print(
                        f"  {op} {r['shape']} {r['dtype']} {r['mode']:6s} {r['backend']:8s} "
                        f"{r['median_ms']:.4f} ms {r['gbps']:.0f} GB/s {r.get('pct_bw')}%",
                        flush=True,
                    )
                elif r.get("status") != "unavailable":
                    print(
                        f"  {op} {r['dtype']} {r['mode']} {r['backend']}: {r.get('status')} "
                        f"{r.get('reason', '')[:120]}"
                    )
            print(f"bench {op} {dtype_name(dtype)}: {time.perf_counter() - t0:.0f}s", flush=True)

    md = [
        f"# Reductions on {torch.cuda.get_device_name()} (torch {torch.__version__})",
        "",
        "Command: `python lab/gpu_reductions.py --out $OUT`",
        "",
        "## All backends (median ms, % of measured copy bandwidth)",
        "",
        pivot_table(rows),
        "",
        "## The sum ladder (2^28 elements)",
        "",
        ladder_table(rows),
        "",
        "## Checks",
        "",
        "```",
        *lines,
        "```",
    ]
    text = "\n".join(md)
    (out / "reductions.md").write_text(text + "\n")
    print(text)
    print(f"total {time.perf_counter() - t_start:.0f}s; {'OK' if ok else 'SOME CHECKS FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
