"""Memory-bound cases against a copy of the same bytes: which of ours-below-the-vendor
cases are ties that no kernel can break.

    python -m kernellab.harness.floor --table "NVIDIA H200" [--ops rms_norm softmax ...]
                                      [--all] [--rounds 5] [--budget 0.1] --out FILE.jsonl
    python -m kernellab.harness.floor --summarize FILE.jsonl ...          (no GPU)

A memory-bound op (``OpSpec.metric`` "gbps") moves at least ``count_bytes`` through DRAM.
Per case of a GPU's tuning table (by default those where our best own kernel is slower
than the best vendor's), this times, in ``rounds`` interleaved rounds on one device and
by one timer (CUDA events, L2 flushed, as the tune):

- our best own backend and the best vendor backend of the table's row (outputs checked
  against float64 once), and
- a copy of ``count_bytes`` / 2 bytes (that many read, as many written) two ways: ``copy_``
  (cudaMemcpy device to device) and PyTorch's elementwise kernel (``torch.mul(src, 1.0,
  out=dst)``, 16-byte loads and stores); the faster of the two in each round is the round's
  copy: the time the same traffic takes with no arithmetic at all.

A case is a **tie at the floor** when the vendor's median is at most ``FLOOR_TOL`` above the
copy's (nothing, ours included, can be much faster than the vendor: the copy is what the
bytes cost) and ours is within ``TIE_TOL`` of the vendor by the median of the rounds' paired
ratios. The copy is a reference, not a proof: a kernel can beat it (on an H200 norms of
30-130 MB beat cudaMemcpy, and kernels on small grids finish before its fixed cost is
paid), and a vendor faster than the copy is never called a tie.
``classify`` and ``summarize`` (``vendor_gap.floor_class`` / ``floor_classes``) are pure
functions of the rows (tested); ``vendor_gap --table --floor FILE`` counts them beside the
table's cases.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

# The classification is the scoreboard's (vendor_gap), which imports nothing from here.
from kernellab.harness.vendor_gap import FLOOR_TOL, TIE_TOL, table_rows
from kernellab.harness.vendor_gap import floor_class as classify
from kernellab.harness.vendor_gap import floor_classes as summarize
from kernellab.harness.vendor_gap import summarize as summarize_table

__all__ = ["FLOOR_TOL", "TIE_TOL", "classify", "summarize"]


def _median_ratio(num: list, den: list) -> float:
    return statistics.median(a / b for a, b in zip(num, den))


def row_from_rounds(case: dict, own_ms: list, vendor_ms: list, copy_ms: list, **copies: list) -> dict:
    """The floor row of one case from its rounds' medians (ms, one per round each); ``copies``:
    each copy reference's own rounds, kept beside ``copy_ms`` (their per-round minimum)."""
    own, ven, cp = (statistics.median(x) for x in (own_ms, vendor_ms, copy_ms))
    return {
        **case,
        "bench": "floor",
        "status": "ok",
        "own_ms": own_ms,
        "vendor_ms": vendor_ms,
        "copy_ms": copy_ms,
        **{f"{k}_ms": v for k, v in copies.items()},
        "own_median_ms": own,
        "vendor_median_ms": ven,
        "copy_median_ms": cp,
        # paired: each round's vendor / own, then the median
        "own_vs_vendor": round(_median_ratio(vendor_ms, own_ms), 4),
        "vendor_over_copy": round(ven / cp, 4),
        "own_over_copy": round(own / cp, 4),
    }


def table_cases(gpu: str, ops=None, losing: bool = True) -> list[dict]:
    """The memory-bound cases of ``gpu``'s tuning table with their best own and vendor
    backends (``vendor_gap.summarize`` of its rows); with ``losing``, those below 1.0x."""
    from kernellab.core import tables
    from kernellab.core.spec import get_spec

    rows = table_rows(tables.read_table(tables.table_path(gpu)))
    lines, _ = summarize_table([r for r in rows if not ops or r["op"] in ops])
    out = []
    for ln in lines:
        if "own_vs_vendor" not in ln or get_spec(ln["op"]).metric != "gbps":
            continue
        if losing and ln["own_vs_vendor"] >= 1.0:
            continue
        case = {k: ln[k] for k in ("op", "shape", "dtype", "mode", "options", "own", "vendor")}
        out.append({**case, "table_own_vs_vendor": ln["own_vs_vendor"]})
    return out


def measure(case: dict, rounds: int, budget_s: float, device: str = "cuda", seed: int = 0) -> dict:
    """Time ``case``'s own and vendor backends and the copy of its bytes in ``rounds``
    rounds (the order rotated each round) and return its floor row; a backend whose
    output misses the float64 check makes an error row instead."""
    import torch

    from kernellab.core import registry
    from kernellab.core.spec import get_spec, options_from_str, parse_dtype, parse_shape
    from kernellab.harness import bench, timer

    spec = get_spec(case["op"])
    shape = parse_shape(case["shape"])
    dtype = parse_dtype(case["dtype"])
    options = options_from_str(case.get("options") or "")
    prob = bench.Problem(spec, shape, dtype, case["mode"], device, seed, options)
    nbytes = spec.count_bytes(shape, dtype, case["mode"], options)
    n = max(1, nbytes // 8)  # fp32 elements read, and as many written
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    fns = {"memcpy": lambda: dst.copy_(src), "elementwise": lambda: torch.mul(src, 1.0, out=dst)}
    boxes = {}
    for side in ("own", "vendor"):
        fns[side], boxes[side] = prob.call(registry.get(case["op"], case[side]))
    base = {**case, "bytes": nbytes, "rounds": rounds, "git_sha": bench.git_sha(), **bench.versions()}
    if device == "cuda":
        base["gpu"] = torch.cuda.get_device_name()
    for side in ("own", "vendor"):
        fns[side]()
        ok, _, detail = bench._judge_all(boxes[side][0], prob.expected, dtype, None)
        if not ok:
            return {**base, "bench": "floor", "status": "error", "reason": f"{side} ({case[side]}): {detail}"}

    def once(fn):
        if device == "cuda":
            return timer.time_cuda(
                fn, budget_s=budget_s, min_time_s=min(0.05, budget_s), warmup_s=0.02
            ).median_ms
        return timer.time_host(fn, budget_s=budget_s).median_ms

    times: dict[str, list] = {k: [] for k in fns}
    order = list(fns)
    for i in range(rounds):
        for k in order[i % len(order) :] + order[: i % len(order)]:
            times[k].append(once(fns[k]))
    copy_ms = [min(a, b) for a, b in zip(times["memcpy"], times["elementwise"])]
    return row_from_rounds(base, times["own"], times["vendor"], copy_ms,
                           memcpy=times["memcpy"], elementwise=times["elementwise"])  # fmt: skip


def format_summary(classes: dict) -> str:
    out = [f"{'op':14s} {'shape':16s} {'dtype':5s} {'mode':7s} {'own':10s} {'vendor':8s} "
           f"{'own/ven':>8s} {'ven/copy':>8s} {'own/copy':>8s}  class"]  # fmt: skip
    for (op, shape, dt, mode, _), (cls, r) in sorted(classes.items()):
        ratios = f"{r['own_vs_vendor']:8.3f} {r['vendor_over_copy']:8.3f} {r['own_over_copy']:8.3f}"
        out.append(f"{op:14s} {shape:16s} {dt:5s} {mode:7s} {r['own']:10s} {r['vendor']:8s} {ratios}  {cls}")
    counts = {c: sum(v[0] == c for v in classes.values()) for c in ("win", "floor tie", "loss")}
    out.append(", ".join(f"{c}: {n}" for c, n in counts.items()) + f" (of {len(classes)} cases)")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--table", default=None, metavar="GPU", help="the tuning table whose cases to time")
    p.add_argument("--ops", nargs="+", default=None)
    p.add_argument("--all", action="store_true", help="every memory-bound case, not only those ours loses")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--budget", type=float, default=0.1, help="seconds of timing per measurement (max)")
    p.add_argument("--out", default=None, help="JSONL file the rows are appended to")
    p.add_argument("--summarize", nargs="+", default=None, metavar="FLOOR_JSONL", help="time nothing")
    args = p.parse_args(argv)
    if args.summarize:
        missing = [f for f in args.summarize if not os.path.isfile(f)]
        if missing:
            p.error(f"--summarize: no such file: {missing[0]}")
        rows = [json.loads(line) for f in args.summarize for line in open(f) if line.strip()]
        print(format_summary(summarize(rows)))
        return 0
    if not args.table:
        p.error("give --table GPU (or --summarize FILES)")
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("floor times GPU kernels: no CUDA device here")
    rows = []
    for case in table_cases(args.table, args.ops, losing=not args.all):
        try:
            row = measure(case, args.rounds, args.budget)
        except Exception as e:  # noqa: BLE001 - one case's failure is its row
            row = {**case, "bench": "floor", "status": "error", "reason": f"{type(e).__name__}: {e}"[:300]}
        rows.append(row)
        if row["status"] == "ok":
            what = f"own/vendor {row['own_vs_vendor']:.3f}, vendor/copy {row['vendor_over_copy']:.3f}"
            what += f": {classify(row)}"
        else:
            what = row["reason"]
        print(f"{case['op']} {case['shape']} {case['dtype']} {case['mode']}: {what}", flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")
    print(format_summary(summarize(rows)))
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
