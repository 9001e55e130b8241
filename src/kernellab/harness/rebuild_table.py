"""Rebuild a GPU's tuning table from committed tune rows (JSONL written by
``kernellab.harness.tune_all`` / ``kernellab tune``), with today's table rules
(``kernellab.tuner.table_rows``: device times kept beside the effective ones, ties within
``TIE`` told apart by device time). No GPU needed: the rows hold the measurements.

    python -m kernellab.harness.rebuild_table benchmarks/results/tune-NVIDIA_H100_80GB_HBM3-part*.jsonl

Files are read in the order given; a later row of the same case and backend replaces an
earlier one, as a later ``kernellab tune`` run does. Prints which choices changed. The
table's rows at cases the files do not hold are kept, and so are the files and commits its
provenance names for them (``rebuilt_from`` gains the files given, ``git_sha`` their commits).

``--verify FILE ...`` (``tune_all.py --phases verify`` rows or ``kernellab.harness.host_cost`` rows,
both paired): where the paired rounds of a tuned shape (the ``heldout`` family is never fed
back) put another backend the row measured more than MARGIN ahead of the table's choice
(PyTorch's op, or at a launch-bound shape the backend whose launch costs less host time),
the fastest of them becomes the choice and the row keeps the paired medians under
``verified``. Paired rounds (the backends taking turns, each round's
time the larger of device and loop time) are what a default is judged by; the tune rows'
loop times are taken one backend after another on a host whose speed drifts, which makes
some launch-bound choices by noise. A changed table needs a new verify run to be judged.

``--family-shapes-only`` leaves out rows at shapes no tuned family holds now (a family
edited after its tune run), from the files and from the table being rebuilt.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import sys

from kernellab.core import shapes, tables
from kernellab.core.spec import parse_shape
from kernellab.harness import timer
from kernellab.harness import tune as tuner


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--out", default=None, help="table path (default: the package's table of the rows' GPU)")
    ap.add_argument("--verify", nargs="+", default=[], help="verify.jsonl files whose paired verdicts apply")
    ap.add_argument("--rows-from-verify", nargs="+", default=[], metavar="VERIFY_JSONL",
                    help="verify.jsonl files whose cases of an op, dtype and mode no tune row measured "
                         "become rows of their own (the backends the verify timed: torch and the choice)")  # fmt: skip
    ap.add_argument("--family-shapes-only", action="store_true",
                    help="leave out rows at shapes no tuned family holds now (a family edited after the run)")  # fmt: skip
    a = ap.parse_args(argv)
    rows = [json.loads(line) for f in a.files for line in open(f) if line.strip()]
    if a.family_shapes_only:
        rows, dropped = _at_family_shapes(rows)
        for what in sorted(dropped):
            print(f"left out (no tuned family holds it): {what}")
    for what in mixed_nodes(rows):
        print(f"{what}: its backends' rows were taken with and without the C++ nodes (cpp_nodes), so their "
              "loop times, and a launch-bound choice made by them, do not compare")  # fmt: skip
    gpus = {r["gpu"] for r in rows if r.get("gpu")}
    if len(gpus) != 1:
        print(f"rows from {len(gpus)} GPU models ({sorted(gpus)}): one table per GPU", file=sys.stderr)
        return 2
    gpu = gpus.pop()
    path = a.out or os.path.join(tables.PACKAGE_TABLES, tables.gpu_slug(gpu) + ".json")
    old = json.load(open(path)) if os.path.exists(path) else {"rows": []}
    ops = sorted({r["op"] for r in rows})
    new_rows = [t for op in ops for t in tuner.table_rows(op, rows)]

    def ident(r):
        return (r["op"], r["dtype"], r["mode"], tuple(r["shape"]), r.get("options", ""))

    done = {ident(r) for r in new_rows}
    kept = [r for r in old["rows"] if ident(r) not in done]
    if a.family_shapes_only:  # (the old table's rows at such shapes go too)
        kept = [r for r in kept if tuple(r["shape"]) in _family_held(r["op"])]
    before = {ident(r): r["best"] for r in old["rows"]}
    for r in new_rows:
        was = before.get(ident(r))
        if was is not None and was != r["best"]:
            print(f"{r['op']} {r['dtype']} {r['mode']} {r['shape']} {r['options']}: {was} -> {r['best']} "
                  f"(device {r['device']})")  # fmt: skip
    for f in a.rows_from_verify:
        added = _rows_from_verify(kept + new_rows, [json.loads(line) for line in open(f) if line.strip()])
        new_rows += added
        print(f"{os.path.basename(f)}: {len(added)} rows of untuned op/dtype/modes")
    if a.verify:
        tuned_at = _latest(rows)
        for f in a.verify:  # one run's paired rounds at a time; a later file has the last word
            _apply_verify(kept + new_rows, [json.loads(line) for line in open(f) if line.strip()], tuned_at)
    first = rows[-1]
    given = [os.path.basename(f) for f in a.files]
    was = old.get("provenance", {}) if kept else {}  # rows kept: their sources stay named
    shas = {r["git_sha"] for r in rows if r.get("git_sha")}
    shas |= {s for s in was.get("git_sha", "").split(",") if s}
    table = {
        "gpu": gpu,
        "rows": sorted(kept + new_rows, key=lambda r: (r["op"], r["dtype"], r["mode"], r["shape"], r.get("options", ""))),
        "provenance": {
            **old.get("provenance", {}),
            "git_sha": ",".join(sorted(shas)),
            "torch": first.get("torch"), "triton": first.get("triton"), "cuda": first.get("cuda"),
            "device": gpu, "how": tuner.HOW,
            "rebuilt_from": [f for f in was.get("rebuilt_from", []) if f not in given] + given,
            **({"verified_by": [os.path.basename(f) for f in a.verify]} if a.verify else {}),
            **({"family_shapes_only": True} if a.family_shapes_only else {}),
            **({"rows_from_verify": [os.path.basename(f) for f in a.rows_from_verify]}
               if a.rows_from_verify else {}),
        },
    }  # fmt: skip
    with open(path, "w") as fh:
        json.dump(table, fh, indent=1, sort_keys=True)
        fh.write("\n")
    print(f"{path}: {len(table['rows'])} rows ({len(new_rows)} from the files, {len(kept)} kept)")
    return 0


def mixed_nodes(rows) -> list[str]:
    """The cases ("op dtype mode shape options") whose rows, the last measured one of each
    backend (as the table takes them), say both that the C++ nodes were in use and that
    they were not (rows without the ``cpp_nodes`` field say nothing)."""
    last: dict = {}
    for r in rows:
        if r.get("status", "ok") == "ok" and r.get("effective_ms") is not None:
            case = (r["op"], r["dtype"], r["mode"], r["shape"], str(r.get("options") or ""))
            last[case, r["backend"]] = r.get("cpp_nodes")
    states: dict = {}
    for (case, _), v in last.items():
        if v is not None:
            states.setdefault(case, set()).add(bool(v))
    return [" ".join(c for c in case if c) for case, v in states.items() if len(v) > 1]


@functools.cache
def _family_held(op: str) -> frozenset:
    """The shapes of ``op`` that a tuned family holds now."""
    return frozenset(shapes.family_shapes(op))


def _at_family_shapes(rows) -> tuple[list, set]:
    """(the tune rows whose op and shape a tuned family holds, "op shape" of those left out)."""
    kept, dropped = [], set()
    for r in rows:
        if parse_shape(r["shape"]) in _family_held(r["op"]):
            kept.append(r)
        else:
            dropped.add(f"{r['op']} {r['shape']}")
    return kept, dropped


MARGIN = 0.05
_DTYPE_NAMES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def _case_key(r) -> tuple:
    """(op, dtype, mode, shape, options) of a verify or host-cost row, spelled as table rows."""
    from kernellab.core.spec import options_str

    o = r.get("options") or ""
    o = options_str(o) if isinstance(o, dict) else o
    shape = r["shape"] if isinstance(r["shape"], str) else "x".join(map(str, r["shape"]))
    return (r["op"], _DTYPE_NAMES.get(r["dtype"], r["dtype"]), r["mode"], shape, o)


def _paired_cases(vrows) -> dict:
    """(op, dtype, mode, shape, options) -> {backend: paired rounds} from one run's rows:
    ``tune_all.py --phases verify`` rows (``paired_rounds_ms``; the heldout family, never
    tuned, is left out) or ``kernellab.harness.host_cost`` rows (``rounds_us``: every backend of
    the op at its tiny and model shapes, in turn)."""
    cases: dict = {}
    for r in vrows:
        rounds = r.get("paired_rounds_ms") or r.get("rounds_us")
        if r.get("family") == "heldout" or not rounds or r.get("backend") == "default":
            continue
        cases.setdefault(_case_key(r), {})[r["backend"]] = rounds
    return cases


def _when(r):
    """When a row was measured (its ``time``, an aware datetime), or None."""
    return datetime.datetime.fromisoformat(r["time"]) if r.get("time") else None


def _latest(rows) -> dict:
    """(op, dtype, mode, shape, options) -> the latest ``_when`` of its rows (cases whose
    rows say nothing of when are left out)."""
    at: dict = {}
    for r in rows:
        when = _when(r)
        if when is not None:
            key = _case_key(r)
            at[key] = max(at[key], when) if key in at else when
    return at


def _apply_verify(table_rows, vrows, tuned_at: dict | None = None) -> None:
    """Where a tuned shape's paired rounds (one run's, ``_paired_cases``) put another of
    the row's measured backends more than MARGIN ahead of its choice, the fastest of them
    becomes the choice and the row keeps the paired medians under ``verified``; in place.
    Only backends the row measured (those the tune admitted) are candidates: PyTorch's
    bf16 rms_norm, refused by the admission check, never becomes a choice this way.
    Where the row's tune rows are dated (``tuned_at``), a verify run older than them, or
    of no date (host_cost rows), timed other code than the row did, or may have: it is
    passed over."""
    import statistics

    cases = _paired_cases(vrows)
    timed = _latest(vrows)
    for t in table_rows:
        key = _case_key(t)
        got = cases.get(key)
        if not got or t["best"] not in got:
            continue
        tuned, verified = (tuned_at or {}).get(key), timed.get(key)
        if tuned is not None and (verified is None or verified < tuned):
            continue  # (stale, or of unknown date beside a dated tune)
        cands = [b for b in got if b != t["best"] and b in t.get("times", {})]
        ratios = {b: timer.paired_ratio(got[t["best"]], got[b]) for b in cands}
        if not ratios:
            continue
        alt = max(ratios, key=ratios.get)
        if ratios[alt] > 1 + MARGIN:
            print(f"{t['op']} {t['dtype']} {t['mode']} {t['shape']} {t.get('options', '')}: {t['best']} -> {alt} "
                  f"(paired {t['best']}/{alt} {ratios[alt]:.2f})")  # fmt: skip
            t["verified"] = {"was": t["best"], "paired_ratio": round(ratios[alt], 3), "vs": alt,
                             "paired_median_ms": {b: round(statistics.median(v), 5) for b, v in got.items()}}  # fmt: skip
            if alt == "torch":
                t["verified"]["paired_ratio_vs_torch"] = round(ratios[alt], 3)
            t["best"] = alt


def _rows_from_verify(table_rows, vrows) -> list[dict]:
    """Rows for the paired cases (``_paired_cases``) of an op, dtype and mode that no table
    row has: a 16-bit dtype served by its sibling's rows (``choice.SIBLING_DTYPES``; the
    MNIST ops are tuned in fp32 only, so a 16-bit call can get a choice no 16-bit row
    backs). Each row holds the backends the verify
    timed (torch and the default's choice): ``times`` their paired medians, ``device``
    their median device times; the choice stays unless another is more than MARGIN ahead
    in the paired rounds. Marked ``from_verify``: a later tune of the dtype replaces them."""
    import statistics

    have = {(t["op"], t["dtype"], t["mode"]) for t in table_rows}
    device: dict = {}
    chosen: dict = {}
    for r in vrows:
        if r.get("backend") != "default" and r.get("median_ms"):
            k = _case_key(r)
            device.setdefault(k, {})[r["backend"]] = round(r["median_ms"], 6)
            chosen[k] = r.get("chosen")
    out = []
    for key, got in sorted(_paired_cases(vrows).items()):
        op, dt, mode, shape, opts = key
        pick = chosen.get(key)
        if (op, dt, mode) in have or pick not in got:
            continue
        # (a case whose choice was torch timed torch alone: its row holds torch alone)
        ratios = {b: timer.paired_ratio(got[pick], got[b]) for b in got if b != pick}
        alt = max(ratios, key=ratios.get, default=None)
        best = alt if alt is not None and ratios[alt] > 1 + MARGIN else pick
        dims = [int(v) for v in shape.split("x")]
        out.append({"op": op, "dtype": dt, "mode": mode, "shape": dims, "key": list(shapes.key_of_shape(op, dims)),
                    "options": opts, "best": best, "from_verify": True,
                    "times": {b: round(statistics.median(v), 5) for b, v in got.items()},
                    "device": {b: t for b, t in device.get(key, {}).items() if b in got}})  # fmt: skip
    return out


if __name__ == "__main__":
    raise SystemExit(main())
