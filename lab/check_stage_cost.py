"""Where one implementation's `kernellab check` time goes, stage by stage: every stage in
its own process, all at once (as `check -j` runs a heavy item), with each Triton compile
timed (kernel, constexprs, seconds). Prints one line per stage and the slowest compiles.

    PYTHONPATH=src python lab/check_stage_cost.py attention triton fp32 [--full] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time


def _timed_compiles():
    """Wrap Triton's compile so that every build is recorded; returns the list it fills."""
    import triton.compiler as tc
    import triton.compiler.compiler as tcc

    log = []
    real = tcc.compile

    def compile(src, *a, **kw):
        t0 = time.perf_counter()
        out = real(src, *a, **kw)
        name = getattr(getattr(src, "fn", None), "__name__", str(src)[:40])
        cx = {str(k): v for k, v in (getattr(src, "constants", None) or {}).items() if not isinstance(v, type)}
        log.append((name, round(time.perf_counter() - t0, 3), repr(cx)[:300]))
        return out

    tc.compile = tcc.compile = compile
    return log


def _stage(args):
    op, backend, dtype, stage, quick, seed = args
    log = _timed_compiles()
    from kernellab.core import registry
    from kernellab.core.spec import parse_dtype
    from kernellab.harness import check as chk

    t0 = time.perf_counter()
    rep = chk.check_impl(registry.get(op, backend), parse_dtype(dtype), quick=quick, seed=seed, stages=(stage,))
    return dict(stage=stage, seconds=round(time.perf_counter() - t0, 2), status=rep.status,
                cases=len(rep.cases), compiles=log)  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("op")
    p.add_argument("backend")
    p.add_argument("dtype")
    p.add_argument("--full", action="store_true")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    from kernellab.harness.check import STAGE_GROUPS

    stages = [s for g in STAGE_GROUPS for s in g]
    t0 = time.perf_counter()
    with mp.get_context("spawn").Pool(len(stages)) as pool:
        rows = pool.map(_stage, [(a.op, a.backend, a.dtype, s, not a.full, a.seed) for s in stages])
    print(f"{a.op}/{a.backend} {a.dtype}: wall {time.perf_counter() - t0:.1f}s, one process per stage")
    for r in sorted(rows, key=lambda r: -r["seconds"]):
        c = r["compiles"]
        kinds = {}
        for name, s, _ in c:
            kinds[name] = kinds.get(name, 0) + s
        top = ", ".join(f"{k} {v:.0f}s" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])[:4])
        print(f"  {r['stage']:22s} {r['seconds']:7.1f}s {r['status']:5s} cases {r['cases']:4d}"
              f"  compiles {len(c):3d} {sum(s for _, s, _ in c):6.1f}s  {top}")  # fmt: skip
    allc = sorted((x for r in rows for x in r["compiles"]), key=lambda x: -x[1])
    print("slowest compiles:")
    for name, s, cx in allc[:12]:
        print(f"  {s:6.1f}s {name} {cx}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
