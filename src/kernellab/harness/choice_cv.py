"""How the default's choice does at shapes nobody tuned, from a GPU's committed table,
on any machine: leave-one-out cross-validation of ``core.choice.choose``.

    python -m kernellab.harness.choice_cv [--gpu NAME ...] [--by queued|loop] [--worst N] [--json]

At a tuned shape the choice reads that shape's own row, so it cannot miss there; a model's
shapes are mostly not tuned. Each row of the table in turn is taken out and the choice for
its shape (key, dtype, mode, options) made from the other rows, as ``choose_for_gpu`` makes
it (every backend of the op that runs on CUDA counts as usable, less ``default_excludes``).
The row's own times then score the pick: its time over the row's fastest, by the times
the rule ranks by (``choice.deciding_times``). A pick the row did not time is counted as
unscored; a row that timed one backend alone (``rows_from_verify``) is not scored. Only
the table's own rows are used (not rows borrowed from another GPU model).

``cross_validate`` is a pure function of the rows (tested); the numbers come from real GPU
rows, so they estimate the default's miss rate at new shapes without a GPU. The real
measure stays ``vendor_gap`` on the GPU.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from collections import defaultdict

WITHIN = 0.03  # a pick this close to the row's fastest counts as a hit


def cross_validate(rows: list[dict], candidates, by: str = "queued", score=None) -> list[dict]:
    """One result per row (per row ``score(row)`` accepts, if given; the others still speak
    for their neighbours): the choice made without it, scored by its times.

    ``candidates(op, key)`` -> (usable backends, preferred backend, small backend or None,
    exact key dims, key bands): what ``choice.choose`` is given for a call
    (``registry.choice_inputs``)."""
    from kernellab.core import choice

    out = []
    for i, row in enumerate(rows):
        if len(row["times"]) < 2 or (score is not None and not score(row)):
            continue  # (a row of one backend, a verify run's, compares nothing to score a pick by)
        key = tuple(row["key"])
        usable, preferred, small, exact, bands = candidates(row["op"], key)
        rest = {"rows": rows[:i] + rows[i + 1 :]}
        pick, why = choice.choose(rest, "table", row["op"], key, row["dtype"], row["mode"],
                                  row.get("options", ""), usable=usable, preferred=preferred, small=small,
                                  by=by, exact=exact, bands=bands)  # fmt: skip
        times = choice.deciding_times(row, by)
        fastest = min(times, key=times.get)
        ratio = times[pick] / times[fastest] if pick in times and times[fastest] > 0 else None
        out.append({
            "op": row["op"], "dtype": row["dtype"], "mode": row["mode"], "options": row.get("options", ""),
            "shape": row["shape"], "pick": pick, "fastest": fastest, "ratio": ratio, "why": why,
        })  # fmt: skip
    return out


def summarize(results: list[dict], within: float = WITHIN) -> dict:
    """Counts overall and per (op, dtype, mode): rows, scored, hits (ratio <= 1 + within),
    geometric mean and worst of the scored ratios."""

    def stats(rs):
        scored = [r["ratio"] for r in rs if r["ratio"] is not None]
        return {
            "rows": len(rs), "scored": len(scored), "hits": sum(x <= 1 + within for x in scored),
            "geomean": math.exp(sum(map(math.log, scored)) / len(scored)) if scored else None,
            "worst": max(scored) if scored else None,
        }  # fmt: skip

    groups = defaultdict(list)
    for r in results:
        groups[(r["op"], r["dtype"], r["mode"])].append(r)
    return {"all": stats(results), "groups": {k: stats(v) for k, v in sorted(groups.items())}}


def registry_candidates(op: str, key, device: str | None = None):
    """What the default passes ``choice.choose`` for ``op`` on ``device`` (None: a CUDA
    device it cannot see, ``registry.choose_for_gpu``'s view): ``registry.choice_inputs``."""
    from kernellab.core import registry

    return registry.choice_inputs(op, key, device)


def group_line(rows: list[dict], op: str, dn: str, mode: str, options: str, by: str = "queued",
               device: str | None = None, within: float = WITHIN) -> str | None:
    """One line for ``kernellab explain``: how the choice did for ``op`` / ``dn`` / ``mode`` /
    ``options`` at this table's shapes, each of those rows left out in turn; None without
    such rows."""
    def cands(o, k):
        return registry_candidates(o, k, device)

    def mine(r):
        return (r.get("op") == op and r.get("dtype") == dn and r.get("mode") == mode
                and r.get("options", options) == options)  # fmt: skip

    res = cross_validate([r for r in rows if r.get("op") == op], cands, by, score=mine)
    s = summarize(res, within)["all"]
    if not s["scored"]:
        return None
    return (f"at shapes no row holds: each of this table's {s['rows']} {op} {dn} {mode} rows left out in "
            f"turn, the choice from the others was within {within:.0%} of that row's fastest at "
            f"{s['hits']} of {s['scored']} (geomean {_fmt(s['geomean'])}, worst {_fmt(s['worst'])}; "
            "python -m kernellab.harness.choice_cv)")  # fmt: skip


def _fmt(x):
    return "-" if x is None else f"{x:.2f}"


def main(argv=None) -> int:
    from kernellab.core import tables

    ap = argparse.ArgumentParser(prog="python -m kernellab.harness.choice_cv",
                                 description=__doc__.split("\n")[0])  # fmt: skip
    ap.add_argument("--gpu", nargs="*", default=None, help="GPU models (default: every table here)")
    ap.add_argument("--by", default="queued", choices=("queued", "loop"),
                    help="the rule's ranking (choice.BY)")  # fmt: skip
    ap.add_argument("--within", type=float, default=WITHIN,
                    help="a hit: the pick within this fraction of the fastest (finite, >= 0)")  # fmt: skip
    ap.add_argument("--worst", type=int, default=15, help="list this many of the worst misses (>= 0)")
    ap.add_argument("--json", action="store_true", help="print every result as JSON lines")
    a = ap.parse_args(argv)
    if not math.isfinite(a.within) or a.within < 0:  # (nan compares False with anything: a hit never)
        ap.error(f"--within must be a finite number >= 0, got {a.within}")
    if a.worst < 0:  # (a negative count would slice from the end: all but the last misses)
        ap.error(f"--worst must be >= 0, got {a.worst}")
    known = tables.table_gpus()
    gpus = a.gpu or known
    for g in gpus:
        if g not in known:
            ap.error(f"--gpu: no table for {g!r}; tables: {', '.join(known)}")
    for gpu in gpus:
        rows = tables.read_table(tables.table_path(gpu))["rows"]
        res = cross_validate(rows, registry_candidates, a.by)
        if a.json:
            for r in res:
                print(json.dumps({"gpu": gpu, **r}))
            continue
        s = summarize(res, a.within)
        al = s["all"]
        print(f"{gpu} ({os.path.basename(tables.table_path(gpu))}), by {a.by}: each row left out in turn, "
              f"the pick within {a.within:.0%} of the row's fastest at {al['hits']} of {al['scored']} "
              f"scored rows ({al['rows'] - al['scored']} unscored), geomean {_fmt(al['geomean'])}, "
              f"worst {_fmt(al['worst'])}")  # fmt: skip
        for (op, dn, mode), g in s["groups"].items():
            print(f"  {op:22s} {dn:5s} {mode:7s} {g['hits']:3d}/{g['scored']:<3d} "
                  f"geomean {_fmt(g['geomean'])}  worst {_fmt(g['worst'])}")  # fmt: skip
        worst = sorted((r for r in res if r["ratio"] is not None), key=lambda r: -r["ratio"])[: a.worst]
        if worst:
            print("  worst:")
        for r in worst:
            shape = "x".join(map(str, r["shape"]))
            opts = f" {r['options']}" if r["options"] else ""
            print(f"    {r['ratio']:.2f}x {r['op']} {r['dtype']} {r['mode']} {shape}{opts}: "
                  f"{r['pick']} (fastest {r['fastest']}); {r['why']}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
