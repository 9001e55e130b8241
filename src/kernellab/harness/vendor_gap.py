"""Our own kernels against the vendors' at model shapes nobody tuned for, and the default
against the fastest backend there (issue 43's measure).

    python -m kernellab.harness.vendor_gap --out DIR [--ops matmul attention ...] [--only SHAPE ...]
    python -m kernellab.harness.vendor_gap --summarize RUN1.jsonl RUN2.jsonl ...   (no GPU)
    python -m kernellab.harness.vendor_gap --table [GPU ...] [--ops ...] [--lines] [--floor F]  (no GPU)

Every case of ``CASES`` (op, shape, dtype, mode, options) is timed by ``harness.bench``
for every backend of the op that runs here (device time, L2 flushed, outputs checked
against float64), ``default`` included. Per case, three numbers:

- **own / vendor**: the best vendor kernel's time over our best own kernel's (``triton*``,
  ``cuda*``): >= 1.0 where ours is faster. Vendors are PyTorch's op, torch.compile, the
  SDPA kernels (cuDNN, FlashAttention-2, efficient) and Liger (``results.VENDOR``).
- **default / best**: the fastest backend's time over the default's: >= 0.97 is "within 3%";
  by device time, and by call time (``effective_ms``: the larger of device and loop time,
  what a standalone eager call costs and what the default chooses by: a backend whose host
  cost exceeds its kernel can win by device time and lose every eager call).
- which backends those were.

The summary counts the cases where ours >= 1.0x and where ours < 0.9x, and where the
default is within 3% of the best by either measure. ``summarize`` is a pure function of the
rows (tested).

``--table`` reads no run: it scores our kernels against the vendors' at the model-family
shapes, from a GPU's committed tuning table (each row: every candidate backend timed
side by side by ``tune``, device times kept), per op and in all (``table_rows``). That is
the issue's bar (ours >= 1.0x the best vendor at 80% of the model-family cases, none below
0.9x); the default's side of it is ``harness.choice_cv``. Rows made from a verify run
(``from_verify``: torch and one choice timed) and rows without device times are left out.
The report also counts the model-family shapes (``core.shapes.FAMILIES``) that no row of
the table scores (``unscored_family_shapes``): the ops and shapes the bar does not yet see.
``--floor`` adds how many of the losses ``harness.floor`` runs found to be ties at the
copy floor (memory-bound cases where the vendor already moves the bytes as fast as a copy).
"""

from __future__ import annotations

import argparse
import json
import math
import os

from kernellab.core.spec import options_str, shape_str
from kernellab.harness.results import VENDOR, is_ours

# (op, shape, dtype, mode, options). Model-family shapes absent from the tuning families,
# and the cases the issue names.
CASES: list[tuple] = [
    # attention (B, H, S, D) or GQA (B, Hq, Hkv, Sq, Sk, D)
    ("attention", (1, 32, 2048, 80), "bf16", "fwd", {"causal": True}),
    ("attention", (1, 32, 2048, 80), "bf16", "fwdbwd", {"causal": True}),
    ("attention", (1, 32, 8, 4096, 4096, 128), "bf16", "fwd", {"causal": True}),
    ("attention", (1, 32, 8, 4096, 4096, 128), "bf16", "fwdbwd", {"causal": True}),
    ("attention", (4, 16, 1024, 64), "bf16", "fwd", {"causal": True}),
    ("attention", (4, 16, 1024, 64), "bf16", "fwdbwd", {"causal": True}),
    ("attention", (8, 16, 256, 96), "bf16", "fwdbwd", {"causal": False}),
    ("attention", (2, 16, 2048, 128), "bf16", "fwd", {"causal": False}),
    ("attention", (2, 16, 2048, 128), "bf16", "fwdbwd", {"causal": False}),
    ("attention", (1, 8, 4096, 256), "bf16", "fwd", {"causal": True}),
    # matmul (M, N, K): decode and prefill against 8B-class weights, an LM head, odd sizes
    ("matmul", (1, 14336, 4096), "bf16", "fwd", {}),
    ("matmul", (16, 4096, 14336), "bf16", "fwd", {}),
    ("matmul", (64, 4096, 4096), "bf16", "fwd", {}),
    ("matmul", (128, 14336, 4096), "bf16", "fwd", {}),
    ("matmul", (128, 14336, 4096), "bf16", "fwdbwd", {}),
    ("matmul", (1000, 3000, 5000), "fp16", "fwd", {}),
    ("matmul", (2048, 2048, 2048), "fp32", "fwd", {}),
    ("matmul", (4096, 5120, 5120), "bf16", "fwd", {}),
    ("matmul", (4096, 5120, 5120), "bf16", "fwdbwd", {}),
    ("matmul", (8192, 50257, 768), "bf16", "fwd", {}),
    # norms: odd widths in fp32, a Llama-1B-sized bf16 layer
    ("layer_norm", (2000, 3000), "fp32", "fwd", {}),
    ("layer_norm", (2000, 3000), "fp32", "fwdbwd", {}),
    ("layer_norm", (4096, 2048), "bf16", "fwdbwd", {}),
    ("layer_norm", (12288, 1024), "bf16", "fwdbwd", {}),
    ("rms_norm", (2000, 3000), "fp32", "fwd", {}),
    ("rms_norm", (2000, 3000), "fp32", "fwdbwd", {}),
    ("rms_norm", (4096, 2048), "bf16", "fwdbwd", {}),
    ("rms_norm", (8192, 5120), "bf16", "fwdbwd", {}),
    # softmax and cross-entropy
    ("softmax", (8192, 1000), "fp32", "fwdbwd", {}),
    ("softmax", (3000, 7000), "fp32", "fwd", {}),
    ("softmax", (3000, 7000), "fp32", "fwdbwd", {}),
    ("softmax", (256, 262144), "fp32", "fwd", {}),
    ("softmax", (2048, 32000), "bf16", "fwdbwd", {}),
    ("cross_entropy", (4096, 32000), "bf16", "fwdbwd", {}),
    ("cross_entropy", (2048, 151936), "bf16", "fwdbwd", {}),
    # the LM head and its loss in one op: Gemma-2-2B's head (vocab 256000) and Qwen2-0.5B's
    ("linear_cross_entropy", (8192, 2304, 256000), "bf16", "fwdbwd", {}),
    ("linear_cross_entropy", (4096, 896, 151936), "bf16", "fwdbwd", {}),
]

WITHIN = 0.97  # the default within 3% of the fastest backend
NONE_BELOW = 0.9
FLOOR_TOL = 0.02  # harness.floor: the vendor at most 2% above a copy of the bytes ...
TIE_TOL = 0.01  # ... and ours within 1% of the vendor: a tie at the copy floor


def summarize(rows) -> tuple[list[dict], dict]:
    """(one line per case, totals) from bench rows: per (op, shape, dtype, mode, options)
    the best own and best vendor backend by device time (``median_ms``), their ratio
    (vendor / own), the default's time and the fastest backend's over it."""
    cases: dict[tuple, dict[str, float]] = {}
    calls: dict[tuple, dict[str, float]] = {}  # the same by call time
    resolved: dict[tuple, str] = {}  # what the default ran, where the rows say
    for r in rows:
        if r.get("status") != "ok" or r.get("bench", "bench") != "bench":
            continue
        key = (r["op"], r["shape"], r["dtype"], r["mode"], r.get("options") or "")
        by = cases.setdefault(key, {})
        ms = r["median_ms"]
        by[r["backend"]] = min(ms, by.get(r["backend"], math.inf))
        if r["backend"] == "default" and r.get("resolved"):
            resolved[key] = r["resolved"]
        call = calls.setdefault(key, {})
        cms = max(ms, r.get("effective_ms") or ms)
        call[r["backend"]] = min(cms, call.get(r["backend"], math.inf))
    lines = []
    for key, by in cases.items():
        own = {b: t for b, t in by.items() if is_ours(b)}
        ven = {b: t for b, t in by.items() if b in VENDOR}
        line = dict(zip(("op", "shape", "dtype", "mode", "options"), key))
        if own and ven:
            ob, vb = min(own, key=own.get), min(ven, key=ven.get)
            line.update(
                own=ob,
                own_ms=own[ob],
                vendor=vb,
                vendor_ms=ven[vb],
                own_vs_vendor=round(ven[vb] / own[ob], 3),
            )
        cand = {b: t for b, t in by.items() if b != "default" and (is_ours(b) or b in VENDOR)}
        if "default" in by and cand:
            best = min(cand, key=cand.get)
            line.update(best=best, best_ms=cand[best], default_ms=by["default"],
                        default_vs_best=round(cand[best] / by["default"], 3),
                        default_is=resolved.get(key, "?"))  # fmt: skip
            call = {b: t for b, t in calls[key].items() if b in cand or b == "default"}
            best_call = min((b for b in call if b != "default"), key=call.get)
            line.update(best_call=best_call, default_vs_best_call=round(call[best_call] / call["default"], 3))
        lines.append(line)
    ratios = [ln["own_vs_vendor"] for ln in lines if "own_vs_vendor" in ln]
    dflt = [ln["default_vs_best"] for ln in lines if "default_vs_best" in ln]
    dflt_call = [ln["default_vs_best_call"] for ln in lines if "default_vs_best_call" in ln]
    totals = {
        "cases": len(lines),
        "own_cases": len(ratios),
        **_own_counts(ratios),
        "default_cases": len(dflt),
        "default_within_3pct": sum(r >= WITHIN for r in dflt),
        "default_within_3pct_call": sum(r >= WITHIN for r in dflt_call),
    }
    return lines, totals


def table_rows(table: dict) -> list[dict]:
    """Bench-like rows (``summarize``'s input) from a tuning table: per table row and
    backend, ``median_ms`` = its device time, ``effective_ms`` = its effective time."""
    out = []
    for r in table["rows"]:
        device = r.get("device")
        if r.get("from_verify") or not device:
            continue
        case = {"op": r["op"], "shape": "x".join(map(str, r["shape"])), "dtype": r["dtype"],
                "mode": r["mode"], "options": r.get("options") or "", "status": "ok"}  # fmt: skip
        for b, ms in device.items():
            out.append({**case, "backend": b, "median_ms": ms, "effective_ms": r["times"].get(b, ms)})
    return out


def _own_counts(ratios) -> dict:
    """Of own / vendor ratios: how many >= 1.0, how many below NONE_BELOW, their geomean."""
    return {
        "own_at_least_vendor": sum(r >= 1.0 for r in ratios),
        "own_below_0.9": sum(r < NONE_BELOW for r in ratios),
        "own_geomean": round(math.exp(sum(map(math.log, ratios)) / len(ratios)), 3) if ratios else None,
    }


def op_totals(lines) -> dict:
    """``summarize``'s own-vs-vendor totals per op."""
    by: dict[str, list] = {}
    for ln in lines:
        if "own_vs_vendor" in ln:
            by.setdefault(ln["op"], []).append(ln["own_vs_vendor"])
    return {op: {"cases": len(r), **_own_counts(r), "worst": min(r)} for op, r in sorted(by.items())}


# Families whose shapes are not the model-family bar: the CPU's tiny shapes, and the
# held-out shapes kept out of tuning to test the default's choice where no row is.
NOT_SCORED_FAMILIES = ("cpu-tiny", "heldout")


def family_shapes(ops=None) -> dict[str, list[str]]:
    """op -> the model families' shapes of it ("AxB"), first seen first (core.shapes.FAMILIES
    less NOT_SCORED_FAMILIES; only ``ops`` where given)."""
    from kernellab.core import shapes

    out: dict[str, list[str]] = {}
    for fam, by_op in shapes.FAMILIES.items():
        if fam in NOT_SCORED_FAMILIES:
            continue
        for op, shape_list in by_op.items():
            if ops and op not in ops:
                continue
            for shape in shape_list:
                key = shape_str(shape)
                if key not in out.setdefault(op, []):
                    out[op].append(key)
    return out


def unscored_family_shapes(lines, ops=None) -> dict[str, list[str]]:
    """op -> its model-family shapes that no scored line (ours and a vendor timed, any dtype,
    mode or options) covers: the scoreboard's blind spots on this table."""
    scored = {(ln["op"], ln["shape"]) for ln in lines if "own_vs_vendor" in ln}
    out = {op: [s for s in shapes if (op, s) not in scored] for op, shapes in family_shapes(ops).items()}
    return {op: v for op, v in out.items() if v}


def _table_report(gpus, ops, all_lines: bool, floor_files=()) -> str:
    from kernellab.core import tables

    known = tables.table_gpus()
    out = []
    for gpu in gpus or known:
        if gpu not in known:
            raise SystemExit(f"--table: no table for {gpu!r}; tables: {', '.join(known)}")
        path = tables.table_path(gpu)
        rows = [r for r in table_rows(tables.read_table(path)) if not ops or r["op"] in ops]
        lines, totals = summarize(rows)
        lines = [ln for ln in lines if "own_vs_vendor" in ln]
        t = totals
        won, n = t["own_at_least_vendor"], t["own_cases"]
        out.append(f"{gpu} ({os.path.basename(path)}): ours >= the best vendor at {won} of {n} model-family "
                   f"cases ({won / max(n, 1):.0%}), below 0.9x at {t['own_below_0.9']}, geomean "
                   f"{t['own_geomean']} (device time, the table's rows)")  # fmt: skip
        for op, o in op_totals(lines).items():
            out.append(f"  {op:22s} {o['own_at_least_vendor']:3d}/{o['cases']:<3d} "
                       f"below 0.9x {o['own_below_0.9']:3d}  geomean {o['own_geomean']:.2f}  "
                       f"worst {o['worst']:.2f}")  # fmt: skip
        unscored = unscored_family_shapes(lines, ops)
        if unscored:
            n_fam = sum(len(v) for v in family_shapes(ops).values())
            n_un = sum(len(v) for v in unscored.values())
            by_op = ", ".join(f"{op} {len(v)}" for op, v in unscored.items())
            out.append(f"  not scored here: {n_un} of the {n_fam} model-family shapes (no row of this table "
                       f"timing ours and a vendor): {by_op}")  # fmt: skip
        if floor_files:
            out.append("  " + _floor_line(lines, gpu, floor_files))
        if all_lines:
            out += ["  " + ln for ln in format_lines(lines, totals).splitlines()[:-1]]
    return "\n".join(out)


def floor_class(row, floor_tol: float = FLOOR_TOL, tie_tol: float = TIE_TOL) -> str:
    """'floor tie', 'win' (ours >= the vendor in the paired rounds), or 'loss' for a row of
    ``harness.floor`` (its docstring says why a vendor faster than the copy is no tie)."""
    ratio = row["own_vs_vendor"]
    if ratio >= 1.0:
        return "win"
    if 1.0 <= row["vendor_over_copy"] <= 1.0 + floor_tol and ratio >= 1.0 - tie_tol:
        return "floor tie"
    return "loss"


def floor_classes(rows, floor_tol: float = FLOOR_TOL, tie_tol: float = TIE_TOL) -> dict:
    """{case: (class, row)} of ``harness.floor``'s ok rows, the last row of a case winning."""
    out = {}
    for r in rows:
        if r.get("bench") == "floor" and r.get("status") == "ok":
            out[_case(r)] = (floor_class(r, floor_tol, tie_tol), r)
    return out


def _floor_line(lines, gpu: str, floor_files) -> str:
    """How many of the table's losses the floor runs (``harness.floor``) on ``gpu`` found
    to be ties at the copy floor, and how many they measured."""
    rows = [r for f in floor_files for r in map(json.loads, open(f)) if r.get("gpu") == gpu]
    classes = floor_classes(rows)
    losses = [_case(ln) for ln in lines if ln["own_vs_vendor"] < 1.0]
    measured = [classes[c][0] for c in losses if c in classes]
    ties = measured.count("floor tie")
    tols = f"the vendor at most {FLOOR_TOL:.0%} above the copy, ours within {TIE_TOL:.0%} of it"
    return (f"of the {len(losses)} cases below 1.0x, {len(measured)} memory-bound ones timed beside a copy "
            f"of their bytes: {ties} ties at the copy floor ({tols}), {measured.count('win')} wins in the "
            f"paired rounds, {measured.count('loss')} losses")  # fmt: skip


def _resolved(op, shape, dtype, mode, opts) -> dict:
    """What ``backend=None`` runs for the case: for a plain call and by device time."""
    from kernellab.core import registry, shapes

    key, ok = shapes.key_of_shape(op, shape), shapes.option_key(op, opts)
    call, why = registry.choose_key(op, key, dtype, "cuda", mode, ok)
    by_device = registry.choose_key(op, key, dtype, "cuda", mode, ok, by="device")[0]
    by_loop = registry.choose_key(op, key, dtype, "cuda", mode, ok, by="loop")[0]
    by_queued = registry.choose_key(op, key, dtype, "cuda", mode, ok, by="queued")[0]
    return {"resolved": call, "resolved_why": why, "resolved_by_device": by_device,
            "resolved_by_loop": by_loop, "resolved_by_queued": by_queued}  # fmt: skip


def select(cases: list[tuple], ops=None, shapes=None) -> list[tuple]:
    """The cases of ``ops`` (all if None) whose shape, written as the rows write it
    ("x"-joined), is in ``shapes`` (all if None); with ``ops``, in their order (a run cut
    short by its time limit has timed the ops named first)."""
    chosen = [
        c for c in cases if (not ops or c[0] in ops) and (not shapes or "x".join(map(str, c[1])) in shapes)
    ]
    if ops:
        order = {op: i for i, op in enumerate(dict.fromkeys(ops))}
        chosen.sort(key=lambda c: order[c[0]])  # stable: each op's cases keep their order
    return chosen


def _case(r) -> tuple:
    return (r.get("op"), r.get("shape"), r.get("dtype"), r.get("mode"), r.get("options") or "")


def latest_rows(files: list[list[dict]]) -> list[dict]:
    """The rows of every case from the last of ``files`` (row lists, oldest first) that
    measured it: runs of some ops at a time make one current picture, each case from one run."""
    last: dict[tuple, int] = {}
    for i, rows in enumerate(files):
        for r in rows:
            last[_case(r)] = i
    return [r for i, rows in enumerate(files) for r in rows if last[_case(r)] == i]


def format_lines(lines, totals) -> str:
    out = [f"{'op':14s} {'shape':26s} {'dtype':5s} {'mode':7s} {'opts':12s} {'own':14s} {'vendor':12s} "
           f"{'own/vendor':>10s} {'best':12s} {'default/best':>12s} {'default is':12s} {'best call':12s} "
           f"{'by call':>7s}"]  # fmt: skip
    for ln in lines:
        out.append(
            f"{ln['op']:14s} {ln['shape']:26s} {ln['dtype']:5s} {ln['mode']:7s} {ln['options'][:12]:12s} "
            f"{ln.get('own', '-'):14s} {ln.get('vendor', '-'):12s} "
            f"{ln.get('own_vs_vendor', float('nan')):10.3f} "
            f"{ln.get('best', '-'):12s} {ln.get('default_vs_best', float('nan')):12.3f} "
            f"{ln.get('default_is', '-'):12s} "
            f"{ln.get('best_call', '-'):12s} {ln.get('default_vs_best_call', float('nan')):7.3f}"
        )
    t = totals
    out.append(
        f"own >= vendor: {t['own_at_least_vendor']}/{t['own_cases']}, below 0.9x: {t['own_below_0.9']}, "
        f"geomean {t['own_geomean']}; "
        f"default within 3% of the best: {t['default_within_3pct']}/{t['default_cases']} by device time, "
        f"{t.get('default_within_3pct_call', '-')}/{t['default_cases']} by call time"
    )
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None, help="directory for vendor_gap.jsonl and the summary")
    p.add_argument("--ops", nargs="+", default=None, help="only these ops' cases")
    p.add_argument("--only", nargs="+", default=None, metavar="SHAPE",
                   help="only the cases whose shape (as written in the rows, e.g. 8192x50257x768) is one of these")  # fmt: skip
    p.add_argument("--budget", type=float, default=0.4, help="seconds of timing per measurement (max)")
    p.add_argument("--with-compile", action="store_true",
                   help="also time torch.compile (a compile per case: minutes in all)")  # fmt: skip
    p.add_argument("--summarize", nargs="+", default=None, metavar="VENDOR_GAP_JSONL",
                   help="time nothing: summarize these runs' rows, each case from the last file "
                        "that has it (oldest first; with --ops, only those ops)")  # fmt: skip
    p.add_argument("--table", nargs="*", default=None, metavar="GPU",
                   help="time nothing: ours against the vendors at the model-family shapes, from these GPU "
                        "models' tuning tables (none named: every table here)")  # fmt: skip
    p.add_argument("--lines", action="store_true", help="with --table: every case's line too")
    p.add_argument("--floor", nargs="+", default=(), metavar="FLOOR_JSONL",
                   help="with --table: count the losses these harness.floor runs found tied at the copy floor")  # fmt: skip
    args = p.parse_args(argv)
    if args.table is not None:
        print(_table_report(args.table, args.ops, args.lines, args.floor))
        return 0
    if args.summarize:
        missing = [f for f in args.summarize if not os.path.isfile(f)]
        if missing:
            p.error(f"--summarize: no such file: {missing[0]}")
        runs = [[r for r in map(json.loads, open(f)) if not args.ops or r.get("op") in args.ops]
                for f in args.summarize]  # fmt: skip
        lines, totals = summarize(latest_rows(runs))
        text = format_lines(lines, totals) + "\n" + json.dumps(totals)
        print(text)
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "vendor_gap-summary.txt"), "w") as f:
                f.write(f"from {', '.join(os.path.basename(f) for f in args.summarize)}\n{text}\n")
        return 0
    from kernellab import device as _device
    from kernellab.harness import bench as _bench
    from kernellab.harness.tune import candidates

    if _device.default_device() != "cuda":
        raise SystemExit("vendor_gap times GPU kernels: no CUDA device here")
    cases = select(CASES, args.ops, args.only)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
    dt = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
    import torch

    rows = []
    meta = {"git_sha": _bench.git_sha(), **_bench.versions()}
    for op, shape, dtype, mode, opts in cases:
        # ours and the peers (no teaching rungs or naive baselines), the default
        backends = candidates(op) + ["default"] + (["compile"] if args.with_compile else [])
        tdtype = getattr(torch, dt[dtype])
        resolved = {}
        try:
            got = _bench.bench(op, backends, [shape], [tdtype], (mode,), budget_s=args.budget, options=opts)
            resolved = _resolved(op, shape, tdtype, mode, opts)
        except Exception as e:  # noqa: BLE001 - one case's failure is its row
            why = f"{type(e).__name__}: {e}"[:300]
            got = [{"op": op, "shape": "x".join(map(str, shape)), "dtype": dtype, "mode": mode,
                    "options": options_str(opts), "status": "error", "reason": why}]  # fmt: skip
        for r in got:
            r.update(meta, bench="bench", suite="vendor_gap")
            if r.get("backend") == "default":
                r.update(resolved)
            if args.out:
                with open(os.path.join(args.out, "vendor_gap.jsonl"), "a") as f:
                    f.write(json.dumps(r) + "\n")
        rows += got
        one = summarize(got)
        print(format_lines(*one).splitlines()[1] if one[0] else f"{op} {shape}: no rows", flush=True)
    lines, totals = summarize(rows)
    text = format_lines(lines, totals)
    print(text)
    if args.out:
        with open(os.path.join(args.out, "vendor_gap-summary.txt"), "w") as f:
            f.write(text + "\n" + json.dumps(totals) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
