"""Every ladder measured again in one process: each op's numbered rungs and its references at
the key ``kernellab ladder`` shows from the committed rows, so one commit's rows replace
tables that mix commits and days (docs/ladders.md says which).

    PYTHONPATH=src python lab/gpu_ladder.py --out $OUT [--quick] [--ops all | --ops softmax,sum]
    PYTHONPATH=src python lab/gpu_ladder.py --out /tmp/x --dry      # the plumbing, on the CPU

Per op and key (shape, dtype, mode, options of each table ``harness.ladder.build`` picks from
benchmarks/results/; where a rung has no row, the op's largest bench shape of at most 2^28
elements too; an op without rows: that shape and a dtype every rung takes),
``kernellab.harness.bench`` times every rung and reference (torch, the peers, triton, cuda;
not compile, manual or default): the admission check against the float64 reference first
(odd shapes, NaN/inf, layouts; --quick skips it), then CUDA events with the L2 flushed, the
timed outputs re-checked, and the measured copy bandwidth and matmul rates behind % of peak
(``kernellab peaks``, measured once in this run). TF32 is off throughout (the fp32 matmul and
conv rows are full fp32, as the committed ones). By default only the ops whose committed
tables need it run: a table of several commits or days, or a rung not measured (``--ops all``:
every ladder; matmul's fp32 v1 alone takes ~0.3 s a call). No op starts after --max-seconds
(default 170). A case that raises is reported and the run goes on.

Writes $OUT/ladder.jsonl (rows as they come) and $OUT/ladders.md (the tables from this run's
rows alone), and prints those tables last. Commit the JSONL under benchmarks/results/ and
regenerate docs/ladders.md with ``kernellab ladder --all --markdown > docs/ladders.md``.
"""

from __future__ import annotations

import argparse
import ast
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402

torch.backends.cuda.matmul.allow_tf32 = False  # stated above: full fp32 everywhere
torch.backends.cudnn.allow_tf32 = False

from kernellab.core import registry  # noqa: E402
from kernellab.core.spec import get_spec, parse_dtype, parse_shape  # noqa: E402
from kernellab.harness import bench as kbench  # noqa: E402
from kernellab.harness import ladder  # noqa: E402
from kernellab.harness.results import write_jsonl  # noqa: E402

SKIP = ("compile", "manual", "default")  # builds per shape, naive, or a choice among the others
# First: the ladders whose committed tables mix commits or lack a rung (docs/ladders.md).
FIRST = (
    "relu",
    "gelu",
    "cross_entropy",
    "rms_norm",
    "conv2d",
    "layer_norm",
    "softmax",
    "sum",
    "add",
    "matmul",
)


def _options(text: str) -> dict:
    """'padding=1,check_targets=False' -> {'padding': 1, 'check_targets': False}."""
    out = {}
    for part in filter(None, text.split(",")):
        k, v = part.split("=", 1)
        try:
            out[k] = ast.literal_eval(v)
        except (ValueError, SyntaxError):
            out[k] = v
    return out


def needs_rows(op: str, rows) -> bool:
    """Whether the committed tables of ``op`` mix commits or days, or lack a rung."""
    for lad in ladder.build(op, rows):
        if lad.key is None or any("mixed rows" in n for n in lad.notes):
            return True
        if any(ln.kind == "rung" and ln.status != "ok" for ln in lad.lines):
            return True
    return False


def representative(spec) -> str:
    """The op's largest bench shape of at most 2^28 elements (dims multiplied: the memory-bound
    ops' whole tensor), else its first: a size where bandwidth, not launches, decides."""
    import math

    fits = [s for s in spec.bench_shapes if math.prod(s) <= 1 << 28]
    return "x".join(map(str, max(fits, key=math.prod) if fits else spec.bench_shapes[0]))


def cases(op: str, rows, dry: bool) -> list[tuple]:
    """(shape, dtype name, mode, options, backends) to time for ``op``."""
    spec = get_spec(op)
    rungs = [r for fam in ladder.rungs(op).values() for r in fam]
    usable = {i.backend for i in registry.impls(op)}
    out = []
    for lad in ladder.build(op, rows):
        if lad.key is None or dry:
            shape = "x".join(map(str, spec.cpu_bench_shapes[0])) if dry else representative(spec)
            dtype = "fp32" if all(r.dtypes is None or "fp32" in r.dtypes for r in rungs) else "bf16"
            mode, opts = "fwd", ""
            if lad.key is not None:
                dtype, mode, opts = lad.key[2], lad.key[3], lad.key[4]
        else:
            _, shape, dtype, mode, opts, _ = lad.key
        backends = [ln.backend for ln in lad.lines]
        backends += [b for b in ("torch", "triton", "cuda") if b in usable and b not in backends]
        backends = [b for b in dict.fromkeys(backends) if b not in SKIP and b in usable]
        todo = [(shape, dtype, mode, opts, backends)]
        if any(ln.kind == "rung" and ln.status != "ok" for ln in lad.lines) and not dry:
            # a rung never timed here: the op's representative shape too (the key above may
            # be a tiny shape where only some rungs were timed)
            todo.append((representative(spec), dtype, mode, opts, backends))
        out += [c for c in todo if c not in out]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="folder for ladder.jsonl and ladders.md")
    ap.add_argument("--ops", help="comma list, or 'all' (default: the ops whose committed tables need rows)")
    ap.add_argument("--quick", action="store_true", help="skip the admission check; shorter timing")
    ap.add_argument("--dry", action="store_true", help="CPU, tiny shapes, two ops: exercise the script")
    ap.add_argument("--budget", type=float, default=None, help="seconds of timing per row (default 0.4)")
    ap.add_argument("--max-seconds", type=float, default=170.0, help="no op starts after this")
    args = ap.parse_args(argv)
    dev = "cpu" if args.dry else "cuda"
    if dev == "cuda" and not torch.cuda.is_available():
        print("gpu_ladder: needs a GPU (--dry runs the plumbing on the CPU)", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    jsonl = out / "ladder.jsonl"
    if jsonl.exists():
        jsonl.unlink()
    budget = args.budget or (0.05 if args.dry else 0.25 if args.quick else 0.4)
    committed, _ = ladder.load()
    if args.ops == "all":
        ops = ladder.ladder_ops()
    elif args.ops:
        ops = args.ops.split(",")
    elif args.dry:
        ops = ["softmax", "sum"]
    else:
        ops = [op for op in ladder.ladder_ops() if needs_rows(op, committed)]
    ops = sorted(ops, key=lambda o: FIRST.index(o) if o in FIRST else len(FIRST))
    gpu = torch.cuda.get_device_name() if dev == "cuda" else "cpu (dry run)"
    print(f"{gpu}  torch {torch.__version__}  TF32 off  ops: {', '.join(ops)}", flush=True)
    t0 = time.perf_counter()
    rows, failures = [], 0

    def on_row(r):
        write_jsonl([r], jsonl)  # row by row: a run cut short keeps what it timed
        rows.append(r)
        what = (
            f"{r['median_ms']:.4g} ms" if r.get("median_ms") else f"{r.get('status')}: {r.get('reason', '')}"
        )
        print(
            f"  {r['op']:13s} {r['backend']:10s} {r['shape']} {r['dtype']} {r['mode']}: {what[:140]}",
            flush=True,
        )

    for op in ops:
        spent = time.perf_counter() - t0
        if spent > args.max_seconds:
            print(f"{op}: skipped, {spent:.0f} s used of --max-seconds {args.max_seconds:.0f}", flush=True)
            continue
        try:
            todo = cases(op, committed, args.dry)
        except Exception as e:  # noqa: BLE001 - reported, the run goes on
            print(f"{op}: no cases: {type(e).__name__}: {e}", flush=True)
            failures += 1
            continue
        for shape, dtype, mode, opts, backends in todo:
            t1 = time.perf_counter()
            admitted = {(op, b, parse_dtype(dtype)): "" for b in backends} if args.quick else None
            try:
                kbench.bench(op, backends, [parse_shape(shape)], [parse_dtype(dtype)], (mode,), device=dev,
                             budget_s=budget, options=_options(opts) if opts else None, on_row=on_row,
                             admitted=admitted)  # fmt: skip
            except Exception as e:  # noqa: BLE001 - reported, the run goes on
                failures += 1
                print(f"{op} {shape} {dtype} {mode}: {type(e).__name__}: {e}", flush=True)
                traceback.print_exc(limit=3)
            print(f"{op} {shape} {dtype} {mode} [{opts}]: {time.perf_counter() - t1:.0f} s", flush=True)

    timed = [r for r in rows if ladder.is_timing_row(r)]
    tables = {}
    for op in ops:
        try:
            tables[op] = ladder.build(op, timed)
        except Exception as e:  # noqa: BLE001
            print(f"{op}: no table: {type(e).__name__}: {e}", flush=True)
    (out / "ladders.md").write_text(ladder.document(tables, [str(jsonl)]))
    bad = [r for r in rows if r.get("status") not in ("ok", "unavailable")]
    print(
        f"\n{len(rows)} rows ({len(bad)} not ok), {failures} failed cases, {time.perf_counter() - t0:.0f} s\n"
    )
    print(ladder.to_text([lad for lads in tables.values() for lad in lads]), flush=True)
    return 1 if failures or bad else 0


if __name__ == "__main__":
    sys.exit(main())
