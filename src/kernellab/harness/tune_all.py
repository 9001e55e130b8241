"""Tune every op's default over the model shape families on this GPU, then verify it in a
second, independent run.

    python -m kernellab.harness.tune_all --out DIR [--ops OP ...] [--dtypes bf16 fp32]
        [--modes fwd fwdbwd] [--phases tune verify] [--families F ...] [--budget 0.15]
        [--limit-s 540] [--shapes AxBxC ... (with --phases tune: these shapes, no families)]

tune:   ``tuner.tune`` per op over every family but ``heldout`` (ours and the peers, each
        admitted by the check engine first; outputs re-checked; each backend judged by the
        larger of device time and loop time) -> ``DIR/tables/<gpu>.json`` and every raw row
        in ``DIR/tune.jsonl``.
verify: the same shapes plus the ``heldout`` family (shapes never tuned at), timing
        ``default`` (``backend=None`` through ``registry.call``, exactly as a user calls
        ``kernellab.<op>``), ``torch`` and the backend the table names, in one group per
        case -> ``DIR/verify.jsonl``; then per op x dtype x mode: the worst default / best
        and default / torch ratios and the geometric mean of torch / default per family,
        -> ``DIR/verify_summary.json`` and stdout. With ``--paired-rounds N`` (default 11;
        0: off) the ratios are paired: the group's backends take turns in N rounds of
        ~20 ms of plain-loop calls, after one round not kept (a first round can run 3x the
        others; shorter rounds leave less drift inside one, more of them a steadier
        median), each round's effective time is the larger of the bench row's
        device time and that round's loop time, and a ratio is the median of same-round
        ratios. Timed one after another, the loop times of launch-bound calls drift by up
        to 2x on a shared host, so unpaired ratios would judge the host's minute, not the
        default.

With ``--limit-s`` the script starts no new case past that many seconds (the device
call's limit). The tune phase then says how many of its cases are done and writes the rest
to ``DIR/tune_left.json``; ``--resume FILE ...`` (earlier runs' ``tune.jsonl``) skips the
cases those files hold, so one command, run again with its earlier output, finishes a
sweep longer than one call (``--ops all``: every op with model-family shapes).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch

from kernellab.core.spec import options_str
from kernellab.harness import timer
from kernellab.harness.bench import _eff as bench_eff

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
# GPT-2's ops first: the model step reads these rows.
ORDER = ["layer_norm", "gelu", "add", "attention", "cross_entropy", "matmul", "softmax", "rms_norm", "sum",
         "max", "argmax"]  # fmt: skip


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--ops", nargs="+", default=ORDER)
    p.add_argument("--dtypes", nargs="+", default=["bf16"])
    p.add_argument("--modes", nargs="+", default=["fwd", "fwdbwd"])
    p.add_argument("--phases", nargs="+", default=["tune", "verify"])
    p.add_argument("--families", nargs="+", default=None,
                   help="only these families (default: tune all but heldout, verify all)")  # fmt: skip
    p.add_argument("--shapes", nargs="+", default=None, metavar="AxBxC",
                   help="tune these shapes of each op, not families (finishes a cut-off tune)")  # fmt: skip
    p.add_argument("--budget", type=float, default=0.15)
    p.add_argument("--limit-s", type=float, default=None)
    p.add_argument("--paired-rounds", type=int, default=11, help="paired loop rounds per verify case (0: off)")
    p.add_argument("--summarize", nargs="+", default=None, metavar="VERIFY_JSONL",
                   help="only rebuild the verify summary from these files' rows (into --out)")
    p.add_argument("--resume", nargs="+", default=(), metavar="TUNE_JSONL",
                   help="tune: skip the cases these earlier runs' rows hold")
    a = p.parse_args(argv)
    if a.ops == ["all"]:
        a.ops = all_ops()
    unknown = [d for d in a.dtypes if d not in DTYPES]
    if unknown:
        p.error(f"--dtypes: unknown {unknown}; choose from {', '.join(DTYPES)}")
    done = set()
    for f in a.resume:
        if not os.path.isfile(f):
            p.error(f"--resume: no file {f}")
        try:
            done |= done_cases(f)
        except (OSError, ValueError, KeyError) as e:
            p.error(f"--resume: cannot read {f}: {e}")
    only = None
    if a.shapes:
        if a.families:
            p.error("--shapes: give shapes or --families, not both")
        try:
            only = [tuple(int(d) for d in s.lower().split("x")) for s in a.shapes]
        except ValueError:
            p.error(f"--shapes: each shape is integers joined by x (e.g. 256x4096x4096), got {a.shapes}")
        if "verify" in a.phases:
            p.error("--shapes tunes only (verify runs the families): add --phases tune")
    if a.summarize:
        rows = [json.loads(line) for f in a.summarize for line in open(f) if line.strip()]
        summary = summarize_rows(rows)
        summary["left_out"] = []
        os.makedirs(a.out, exist_ok=True)
        with open(f"{a.out}/verify_summary.json", "w") as fh:
            json.dump(summary, fh, indent=1)
        _print_summary(summary)
        return 0
    os.makedirs(f"{a.out}/tables", exist_ok=True)
    os.environ.setdefault("KERNELLAB_TABLES", f"{a.out}/tables")

    from kernellab import device as _device
    from kernellab.core import registry, shapes
    from kernellab.core.spec import get_spec
    from kernellab.harness import tune as tuner
    from kernellab.harness.bench import bench

    dev = _device.default_device()
    dtypes = [DTYPES[d] for d in a.dtypes]
    t0 = time.perf_counter()
    admitted: dict = {}
    left_out = []

    def over() -> bool:
        return a.limit_s is not None and time.perf_counter() - t0 > a.limit_s

    deadline = t0 + a.limit_s if a.limit_s is not None else None
    if "tune" in a.phases:
        with open(f"{a.out}/tune.jsonl", "a") as raw:

            def keep(r):
                raw.write(json.dumps(r) + "\n")
                raw.flush()

            for op in a.ops:
                if over():
                    left_out.append(f"tune {op}")
                    continue
                notice = tuner.not_timed_notice(op, dev)
                if notice:
                    print(notice, flush=True)
                for fam in [None] if only else a.families or [None]:
                    if fam is not None and not shapes.FAMILIES[fam].get(op):
                        continue
                    t = time.perf_counter()
                    try:
                        tuner.tune(op, fam, dtypes, a.modes, device=dev, budget_s=a.budget, on_row=keep,
                                   admitted=admitted, shapes=only, skip=done.__contains__,
                                   deadline=deadline)  # fmt: skip
                    except Exception as e:  # noqa: BLE001 - one op's failure must not lose the others
                        left_out.append(f"tune {op}: {type(e).__name__}: {str(e)[:160]}")
                    what = fam or ("the shapes given" if only else "all families")
                    print(f"tuned {op} {what} in {time.perf_counter() - t:.0f} s", flush=True)
                    if torch.cuda.is_available():
                        torch.cuda.empty_cache()
        registry.clear_cache()
        fams = [None] if only else (a.families or [None])
        planned = planned_cases(a.ops, fams, dtypes, a.modes, only)
        have = done | done_cases(f"{a.out}/tune.jsonl")
        left = [c for c in planned if c not in have]
        with open(f"{a.out}/tune_left.json", "w") as fh:
            json.dump({"planned": len(planned), "left": [list(c) for c in left]}, fh, indent=0)
        again = f" (run again with --resume {a.out}/tune.jsonl ...)" if left else ""
        n_done = len(planned) - len(left)
        print(f"tune: {n_done} of {len(planned)} cases done, {len(left)} left{again}", flush=True)

    if "verify" in a.phases:
        cases = []
        with open(f"{a.out}/verify.jsonl", "a") as out:
            for op in a.ops:
                if over():
                    left_out.append(f"verify {op}")
                    continue
                spec = get_spec(op)
                fams = [f for f in (a.families or [f for f in shapes.FAMILIES if f != "cpu-tiny"])
                        if shapes.FAMILIES[f].get(op)]  # fmt: skip
                for fam in fams:
                    for shape in shapes.FAMILIES[fam][op]:
                        for dtype in dtypes:
                            for mode in [m for m in a.modes if m in spec.modes]:
                                for opts in spec.bench_options:
                                    key = shapes.key_of_shape(op, shape)
                                    chosen, why = registry.choose_key(
                                        op, key, dtype, dev, mode, shapes.option_key(op, opts)
                                    )
                                    names = list(dict.fromkeys(["default", "torch", chosen]))
                                    try:
                                        rows = bench(op, names, [shape], [dtype], (mode,), device=dev,
                                                     budget_s=a.budget, options=dict(opts), admitted=admitted)  # fmt: skip
                                    except Exception as e:  # noqa: BLE001 - reported, the sweep goes on
                                        left_out.append(f"verify {op} {shape}: {type(e).__name__}: {str(e)[:120]}")
                                        continue
                                    paired = None
                                    if a.paired_rounds > 0:
                                        try:
                                            paired = _paired(spec, shape, dtype, mode, dev, opts, rows,
                                                             a.paired_rounds, chosen)  # fmt: skip
                                        except Exception as e:  # noqa: BLE001 - the unpaired verdict stands
                                            why_not = f"{type(e).__name__}: {str(e)[:120]}"
                                            left_out.append(f"paired {op} {shape}: {why_not}")
                                    for r in rows:
                                        r.update(family=fam, chosen=chosen, why=why)
                                        if paired and r["backend"] in paired["rounds_ms"]:
                                            r["paired_rounds_ms"] = paired["rounds_ms"][r["backend"]]
                                            r["paired_loop_ms"] = paired["loop_ms"][r["backend"]]
                                            r["paired_floor_ms"] = paired["floor_ms"][r["backend"]]
                                        out.write(json.dumps(r) + "\n")
                                    cases.append(
                                        _case(op, fam, shape, dtype, mode, opts, chosen, rows, paired)
                                    )
                                    c = cases[-1]
                                    print(f"{op:13s} {fam:10s} {'x'.join(map(str, shape)):>18s} "
                                          f"{str(dtype)[6:]:8s} {mode:6s} {options_str(opts):12s} {chosen:12s} "
                                          f"default/best {c['default_vs_best']}  default/torch "
                                          f"{c['default_vs_torch']}", flush=True)  # fmt: skip
        summary = _summarize(cases)
        summary["left_out"] = left_out
        with open(f"{a.out}/verify_summary.json", "w") as fh:
            json.dump(summary, fh, indent=1)
        _print_summary(summary)
    if left_out:
        print("left out (time limit):", ", ".join(left_out))
    print(f"done in {time.perf_counter() - t0:.0f} s")
    return 0


def all_ops() -> list[str]:
    """Every op some model family has shapes of (``ORDER``'s first), for ``--ops all``."""
    from kernellab.core import shapes

    seen = list(ORDER)
    for fam, by_op in shapes.FAMILIES.items():
        if fam in ("cpu-tiny", "heldout"):
            continue
        seen += [op for op in by_op if op not in seen]
    return [op for op in seen if any(by_op.get(op) for by_op in shapes.FAMILIES.values())]


def done_cases(path: str) -> set:
    """The cases (``bench.case_ident``) an earlier tune's JSONL holds a row of; none where
    the file does not exist yet."""
    from kernellab.harness.bench import row_ident

    if not os.path.exists(path):
        return set()
    with open(path) as fh:
        return {row_ident(json.loads(line)) for line in fh if line.strip()}


def planned_cases(ops, families, dtypes, modes, only=None) -> list[tuple]:
    """The cases a tune of ``ops`` over ``families`` (None: every tuned family; or the
    shapes ``only``) times, in its order: ``bench.case_ident`` tuples."""
    from kernellab.core import shapes
    from kernellab.core.spec import get_spec
    from kernellab.harness.bench import case_ident

    out, seen = [], set()
    for op in ops:
        spec = get_spec(op)
        op_modes = [m for m in modes if m in spec.modes]
        for fam in families:
            op_shapes = only if only else shapes.family_shapes(op, fam)
            for dtype in dtypes:
                if dtype not in spec.dtypes:
                    continue
                for shape in op_shapes:
                    for opts in spec.bench_options:
                        for mode in op_modes:
                            c = case_ident(op, dtype, mode, tuple(shape), dict(opts))
                            if c not in seen:
                                seen.add(c)
                                out.append(c)
    return out


def _paired(spec, shape, dtype, mode, dev, opts, rows, rounds: int, chosen: str | None = None) -> dict | None:
    """Paired effective times of a verify group's backends that passed their bench row:
    ``rounds`` rounds, every backend once per round in turn (plain-loop calls, one sync),
    a round's effective time = max(the backend's device-time floor, the round's loop time).
    The floor is the row's device median, except that the default and the backend it
    chose run the same kernels and share the lesser of their two medians: those medians
    are timed one after the other, and the same kernel timed twice that way can differ by
    over 10%, a false "miss" of the default against itself. Returns {"rounds_ms", "loop_ms",
    "floor_ms", "ratio"} (ratio: the median over rounds of default / backend) or None when
    the default did not pass."""
    from kernellab.core import registry
    from kernellab.harness.bench import DefaultImpl, Problem

    ok = {r["backend"]: r for r in rows if r.get("status") == "ok"}
    if "default" not in ok:
        return None
    prob = Problem(spec, shape, dtype, mode, dev, seed=0, options=dict(opts))
    fns = {}
    for name in ok:
        impl = DefaultImpl(spec.name) if name == "default" else registry.get(spec.name, name)
        fns[name] = prob.call(impl)[0]
    calls = {name: timer.calls_for(fn, 0.02) for name, fn in fns.items()}
    loops, errors = timer.paired_loop_ms(fns, calls, rounds)
    if errors:
        raise next(iter(errors.values()))
    floor = {n: r["median_ms"] for n, r in ok.items()}
    if chosen in floor and chosen != "default":
        floor["default"] = floor[chosen] = min(floor["default"], floor[chosen])
    times = {n: [round(max(floor[n], ms), 5) for ms in ts] for n, ts in loops.items()}
    base = times["default"]
    ratio = {n: round(timer.paired_ratio(base, ts), 3) for n, ts in times.items()}
    return {"rounds_ms": times, "ratio": ratio, "floor_ms": {n: round(f, 5) for n, f in floor.items()},
            "loop_ms": {n: [round(ms, 5) for ms in ts] for n, ts in loops.items()}}


def _case(op, fam, shape, dtype, mode, opts, chosen, rows, paired=None) -> dict:
    ok = {r["backend"]: bench_eff(r) for r in rows if r.get("status") == "ok"}
    c = {"op": op, "family": fam, "shape": list(shape), "dtype": str(dtype)[6:], "mode": mode,
         "options": options_str(opts), "chosen": chosen, "ms": ok,
         "problems": {r["backend"]: r.get("reason") for r in rows if r.get("status") != "ok"}}  # fmt: skip
    d, t = ok.get("default"), ok.get("torch")
    c["default_vs_best"] = round(d / min(ok.values()), 3) if d else None
    c["default_vs_torch"] = round(d / t, 3) if d and t else None
    if paired:
        # the verdicts from same-round ratios; the unpaired ones stay beside them
        c["unpaired_default_vs_best"] = c["default_vs_best"]
        c["unpaired_default_vs_torch"] = c["default_vs_torch"]
        c["paired_ratio"] = paired["ratio"]
        c["default_vs_best"] = max(paired["ratio"].values())
        c["default_vs_torch"] = paired["ratio"].get("torch")
    return c


def _summarize(cases) -> dict:
    """The issue's verdicts: the default within 5% of the best backend of its group, never
    more than 5% slower than torch; the geometric mean of torch / default per op, family,
    dtype and mode."""
    groups: dict = {}
    for c in cases:
        groups.setdefault((c["op"], c["family"], c["dtype"], c["mode"]), []).append(c)
    out = {"groups": [], "cases": len(cases)}
    for (op, fam, dt, mode), cs in sorted(groups.items()):
        good = [c for c in cs if c["default_vs_best"]]
        vs_torch = [c for c in good if c["default_vs_torch"]]
        g = {"op": op, "family": fam, "dtype": dt, "mode": mode, "cases": len(cs), "measured": len(good),
             "torch_rejected": sum(1 for c in good if "torch" in c.get("problems", {}))}  # fmt: skip
        if good:
            g["worst_default_vs_best"] = max(c["default_vs_best"] for c in good)
            # torch refused by the admission check (rms_norm's bf16 NaN): no torch ratio there
            g["worst_default_vs_torch"] = max((c["default_vs_torch"] for c in vs_torch), default=None)
            g["geomean_torch_over_default"] = (
                round(math.exp(sum(-math.log(c["default_vs_torch"]) for c in vs_torch) / len(vs_torch)), 3)
                if vs_torch else None
            )  # fmt: skip
            g["misses"] = [f"{'x'.join(map(str, c['shape']))} {c['options']}".strip() for c in good
                           if c["default_vs_best"] > 1.05 or (c["default_vs_torch"] or 0) > 1.05]  # fmt: skip
        out["groups"].append(g)
    return out


def summarize_rows(rows) -> dict:
    """``_summarize`` of verify rows as ``verify.jsonl`` keeps them (a committed run's
    summary rebuilt with today's rules: ``--summarize FILE``)."""
    import torch as _t

    dtypes = {"fp32": _t.float32, "fp16": _t.float16, "bf16": _t.bfloat16}
    groups: dict = {}
    def opts_of(r) -> str:  # bench rows spell options as options_str does ("causal=True")
        o = r.get("options") or ""
        return o if isinstance(o, str) else options_str(o)

    for r in rows:
        key = (r["op"], r["family"], r["shape"], r["dtype"], r["mode"], opts_of(r))
        groups.setdefault(key, []).append(r)
    cases = []
    for (op, fam, shape, dt, mode, ostr), rs in groups.items():
        opts = dict(kv.split("=", 1) for kv in ostr.split(",")) if ostr else {}
        paired = None
        rounds = {r["backend"]: r["paired_rounds_ms"] for r in rs if r.get("paired_rounds_ms")}
        if "default" in rounds:
            base = rounds["default"]
            paired = {"rounds_ms": rounds,
                      "ratio": {n: round(timer.paired_ratio(base, ts), 3) for n, ts in rounds.items()}}
        shape_t = tuple(int(v) for v in shape.split("x"))
        cases.append(_case(op, fam, shape_t, dtypes[dt], mode, opts, rs[0].get("chosen"), rs, paired))
    return _summarize(cases)


def _print_summary(s) -> None:
    print(f"\n{s['cases']} cases; per op x family x dtype x mode: worst default/best, worst default/torch, "
          "geomean torch/default, misses (>5%)")  # fmt: skip
    def num(v):
        return f"{v:6.3f}" if v is not None else "     -"

    for g in s["groups"]:
        if not g.get("measured"):
            print(f"  {g['op']:13s} {g['family']:10s} {g['dtype']:8s} {g['mode']:6s} not measured")
            continue
        rejected = f"  (torch refused by the check in {g['torch_rejected']})" if g.get("torch_rejected") else ""
        print(f"  {g['op']:13s} {g['family']:10s} {g['dtype']:8s} {g['mode']:6s} "
              f"{num(g['worst_default_vs_best'])} {num(g['worst_default_vs_torch'])} "
              f"{num(g['geomean_torch_over_default'])}  {'; '.join(g['misses'])}{rejected}")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
