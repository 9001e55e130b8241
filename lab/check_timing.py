"""Where `kernellab check`'s time goes: per implementation x dtype, per stage, and the
slowest cases. Runs check_impl one report at a time (in sequence, so a shared machine's
noise hits every row alike) and prints a table; --json keeps every row for a later diff.

    PYTHONPATH=src python lab/check_timing.py add gelu -b triton,compile --dtype fp32
    PYTHONPATH=src python lab/check_timing.py softmax --full --top 20
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("ops", nargs="*")
    p.add_argument("-b", "--backend", default=None, help="comma-separated")
    p.add_argument("--dtype", default=None, help="comma-separated: fp32,fp16,bf16")
    p.add_argument("--full", action="store_true")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--top", type=int, default=10, help="slowest cases to list")
    p.add_argument("--json", default=None)
    a = p.parse_args()

    from kernellab.core import registry
    from kernellab.core.spec import get_spec, parse_dtype
    from kernellab.harness import check as chk

    backends = a.backend.split(",") if a.backend else None
    dtypes = [parse_dtype(d) for d in a.dtype.split(",")] if a.dtype else None
    rows, cases = [], []
    per_op, per_backend, per_stage = defaultdict(float), defaultdict(float), defaultdict(float)
    t_all = time.perf_counter()
    for op in a.ops or registry.op_names():
        spec = get_spec(op)
        for impl in registry.impls(op):
            if backends and impl.backend not in backends:
                continue
            for dt in dtypes or spec.dtypes:
                if dt not in spec.dtypes:
                    continue
                rep = chk.check_impl(impl, dt, quick=not a.full, seed=a.seed)
                stages = " ".join(f"{k}={v:.1f}" for k, v in rep.stage_seconds.items() if v >= 0.05)
                print(f"{op:14s} {impl.backend:12s} {rep.dtype:5s} {rep.status:8s} {rep.seconds:7.2f}s  {stages}",
                      flush=True)  # fmt: skip
                for c in rep.failures[:2]:
                    print(f"    FAIL {c.kind} {c.name}: {c.detail[:160]}")
                rows.append(dict(op=op, backend=impl.backend, dtype=rep.dtype, status=rep.status,
                                 seconds=rep.seconds, stages=rep.stage_seconds))  # fmt: skip
                per_op[op] += rep.seconds
                per_backend[impl.backend] += rep.seconds
                for k, v in rep.stage_seconds.items():
                    per_stage[k] += v
                cases += [(c.seconds, f"{op}/{impl.backend} {rep.dtype} {c.kind} {c.name}") for c in rep.cases]
    total = time.perf_counter() - t_all
    print(f"\ntotal {total:.1f}s over {len(rows)} reports")
    for title, d in (("op", per_op), ("backend", per_backend), ("stage", per_stage)):
        print(f"by {title}: " + ", ".join(f"{k} {v:.1f}" for k, v in sorted(d.items(), key=lambda kv: -kv[1])))
    print(f"slowest {a.top} cases:")
    for s, what in sorted(cases, reverse=True)[: a.top]:
        print(f"  {s:6.2f}s {what}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(rows=rows, total=total, full=a.full), f, indent=1)


if __name__ == "__main__":
    main()
