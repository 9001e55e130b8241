"""Numba CUDA backends on a lent GPU: every one checked, then timed beside Triton, CUDA C++
and PyTorch; the Numba transpose kernels against torch and the copy ceiling.

    PYTHONPATH=src python lab/gpu_numba.py --out $OUT [--quick] [--budget 0.4]
    PYTHONPATH=src python lab/gpu_numba.py --out /tmp/x --dry     # CPU: Numba's simulator, tiny shapes

1. ``kernellab.harness.check`` (quick) of numba_v1, numba_v2 and numba for relu, gelu,
   add and softmax in fp32 and fp16 (bf16: Numba has no bfloat16 arrays; the check must
   report it unsupported), one line each;
2. benchmarks (``kernellab.harness.bench``: L2 flushed, CUDA events, outputs re-checked
   against float64; left out by --dry): relu, gelu, add at 2^24 and 2^26 fp32 (fwd; relu and gelu fwdbwd at
   2^24 too), softmax 4096x4096 and 8192x1000 fp32 (fwd, fwdbwd): the Numba rungs beside
   triton, cuda and torch, with % of the measured copy bandwidth;
3. host cost per call (us) at 4096 elements: what an eager model pays per launch;
4. transpose 4096x4096 fp32 (and fp16): Numba naive, Numba tiled (padded shared tile),
   torch's x.t().contiguous(), and a plain copy of the same bytes (the ceiling), as GB/s
   (bytes read + written) and the fraction of that copy's bandwidth.

Every case is caught on its own (one failure does not stop the rest). Rows ->
$OUT/numba.jsonl; the summary table -> $OUT/numba.md, printed last. ~1-2 minutes on an H100
or H200, most of it Numba's first compiles (NVVM, ~0.3 s per kernel and dtype).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402

import kernellab  # noqa: E402
from kernellab import device as kdev  # noqa: E402
from kernellab.core.spec import dtype_name, shape_str  # noqa: E402
from kernellab.harness.bench import git_sha, versions  # noqa: E402
from kernellab.harness.results import write_jsonl  # noqa: E402

OPS = ["relu", "gelu", "add", "softmax"]
NUMBA = ["numba_v1", "numba_v2", "numba"]
PEERS = ["triton", "cuda", "torch"]
BENCH = {  # op -> [(shape, modes)]
    "relu": [((2**24,), ("fwd", "fwdbwd")), ((2**26,), ("fwd",))],
    "gelu": [((2**24,), ("fwd", "fwdbwd")), ((2**26,), ("fwd",))],
    "add": [((2**24,), ("fwd",)), ((2**26,), ("fwd",))],
    "softmax": [((4096, 4096), ("fwd", "fwdbwd")), ((8192, 1000), ("fwd", "fwdbwd"))],
}


def say(line: str, lines: list) -> None:
    print(line, flush=True)
    lines.append(line)


def checks(dev: str, lines: list, quick: bool) -> int:
    from kernellab.harness.check import check_impl

    failures = 0
    for op in OPS:
        for backend in NUMBA if not quick else ["numba_v1", "numba"]:
            for dtype in (torch.float32, torch.float16, torch.bfloat16):
                t0 = time.perf_counter()
                try:
                    rep = check_impl(kernellab.get(op, backend), dtype, device=dev, quick=True, seed=11)
                    bad = rep.failures
                    if dtype == torch.bfloat16:  # declared unsupported: must not be run
                        ok = rep.status == "unavailable"
                    else:
                        ok = rep.status == "pass" and not bad
                    what = (rep.status if not bad else
                            f"FAIL {bad[0].kind} {bad[0].name}: {bad[0].detail[:150]}")  # fmt: skip
                    if rep.reason and rep.status != "pass":
                        what += f" ({rep.reason})"
                except Exception as e:  # noqa: BLE001 - reported, the run goes on
                    ok, what = False, f"ERROR {type(e).__name__}: {str(e)[:200]}"
                failures += not ok
                took = time.perf_counter() - t0
                say(f"check {op:7s} {backend:8s} {dtype_name(dtype)}: {what} [{took:.1f}s]", lines)
    return failures


def dry_checks(lines: list) -> int:
    """CPU (simulator): each Numba backend once against the reference, tiny shapes."""
    from kernellab.harness.compare import judge

    failures = 0
    for op in OPS:
        spec = kernellab.get_spec(op)
        for backend in NUMBA:
            try:
                args = spec.make_inputs((3, 37), torch.float32, "cpu", 1)
                out = getattr(kernellab, op)(*args, backend=backend)
                v = judge(out, spec.reference(*(a.double() for a in args)), torch.float32,
                          getattr(kernellab, op)(*args, backend="torch"))  # fmt: skip
                ok, what = v.ok, v.detail or "ok"
            except Exception as e:  # noqa: BLE001
                ok, what = False, f"ERROR {type(e).__name__}: {e}"
            failures += not ok
            say(f"dry {op:7s} {backend:8s} fp32: {what}", lines)
    return failures


def benches(dev: str, out: Path, budget: float, rows: list) -> int:
    from kernellab.harness import bench as kbench

    failures = 0
    admitted: dict = {}  # one admission check per (op, backend, dtype) across shapes
    for op, cases in BENCH.items():
        for shape, modes in cases:
            t0 = time.perf_counter()
            try:
                got = kbench.bench(op, backends=NUMBA + PEERS, shapes=[shape], dtypes=[torch.float32],
                                   modes=modes, device=dev, budget_s=budget, admitted=admitted)  # fmt: skip
            except Exception as e:  # noqa: BLE001
                print(f"bench {op} {shape_str(shape)}: ERROR {type(e).__name__}: {e}", flush=True)
                traceback.print_exc()
                failures += 1
                continue
            for r in got:
                r["bench"] = "numba"
            write_jsonl(got, out / "numba.jsonl")
            rows += got
            failures += sum(r.get("status") not in ("ok", "unavailable") for r in got)
            print(f"bench {op} {shape_str(shape)} {','.join(modes)}: {len(got)} rows "
                  f"[{time.perf_counter() - t0:.1f}s]", flush=True)  # fmt: skip
    return failures


def host_costs(dev: str, lines: list) -> None:
    from kernellab.harness.timer import host_cost_us

    x = torch.randn(4096 if dev == "cuda" else 64, device=dev)
    parts = []
    for backend in ["torch", "cuda", "triton", "numba_v1", "numba"]:
        try:
            impl = kernellab.get("relu", backend)
            if impl.why_unavailable(dev):
                continue
            impl(x)
            parts.append(f"{backend} {host_cost_us(lambda: impl(x)):.1f}")
        except Exception as e:  # noqa: BLE001
            parts.append(f"{backend} ERROR {type(e).__name__}")
    say(f"host us/call, relu {x.numel()} fp32: " + ", ".join(parts), lines)


def transposes(dev: str, out: Path, budget: float, dry: bool, meta: dict, rows: list) -> int:
    from kernellab.ops import _numba_transpose as nt

    if dev == "cuda":
        from kernellab.harness.timer import time_cuda

        def timeit(fn):
            t = time_cuda(fn, budget_s=budget)
            return t.median_ms, t.p20_ms, t.p80_ms
    else:

        def timeit(fn):
            ts = []
            for _ in range(3):
                t0 = time.perf_counter()
                fn()
                ts.append((time.perf_counter() - t0) * 1e3)
            ts.sort()
            return ts[1], ts[0], ts[2]

    failures = 0
    shape = (40, 33) if dry else (4096, 4096)
    for dtype in (torch.float32,) if dry else (torch.float32, torch.float16):
        x = torch.randn(shape, device=dev).to(dtype)
        expected = x.t().contiguous()
        y = torch.empty_like(x)
        nbytes = 2 * x.numel() * x.element_size()  # read + write
        cases = {
            "copy": lambda: y.copy_(x),
            "torch": lambda: x.t().contiguous(),
            "numba_naive": lambda: nt.transpose_naive(x),
            "numba_tiled": lambda: nt.transpose_tiled(x),
        }
        copy_gbps = None
        for name, fn in cases.items():
            r = {"op": "transpose", "bench": "numba", "backend": name, "mode": "fwd",
                 "shape": shape_str(shape), "dtype": dtype_name(dtype), **meta}  # fmt: skip
            try:
                res = fn()
                ok = name == "copy" or torch.equal(res, expected)
                q = timeit(fn)
                gbps = nbytes / q[0] / 1e6
                if name == "copy":
                    copy_gbps = gbps
                r.update(median_ms=q[0], p20_ms=q[1], p80_ms=q[2], gbps=round(gbps, 1),
                         status="ok" if ok else "rejected",
                         pct_copy=round(100 * gbps / copy_gbps, 1) if copy_gbps else None)  # fmt: skip
                failures += not ok
            except Exception as e:  # noqa: BLE001
                r.update(status="error", reason=f"{type(e).__name__}: {str(e)[:300]}")
                failures += 1
            write_jsonl([r], out / "numba.jsonl")
            rows.append(r)
        del x, y, expected
    return failures


def table(rows: list) -> str:
    from kernellab.core.registry import get

    out = ["| op | shape | mode | backend | what it is | ms | GB/s | % copy BW |",
           "|---|---|---|---|---|---:|---:|---:|"]  # fmt: skip
    for r in rows:
        if r.get("status") == "unavailable":
            continue
        desc = ""
        if r["op"] != "transpose":
            try:
                desc = get(r["op"], r["backend"]).description[:60]
            except KeyError:
                pass
        if r.get("status") != "ok":
            out.append(f"| {r['op']} | {r['shape']} | {r['mode']} | {r['backend']} | {desc} | "
                       f"{r.get('status')}: {(r.get('reason') or '')[:60]} | | |")  # fmt: skip
            continue
        pct = r.get("pct_bw", r.get("pct_copy"))
        out.append(f"| {r['op']} | {r['shape']} | {r['mode']} | {r['backend']} | {desc} | "
                   f"{r['median_ms']:.4f} | {r['gbps']:.0f} | {'-' if pct is None else pct} |")  # fmt: skip
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--budget", type=float, default=0.4, help="seconds of timing per row")
    p.add_argument("--quick", action="store_true", help="fewer checks (numba_v1 and numba)")
    p.add_argument("--dry", action="store_true", help="CPU: Numba's simulator, tiny shapes (plumbing only)")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.dry:
        if torch.cuda.is_available():
            print("--dry is the CPU run; on a GPU run without it")
            return 2
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"  # before numba is imported (numba_support)
        dev = "cpu"
    elif not torch.cuda.is_available():
        print("no GPU (use --dry for the CPU plumbing run)")
        return 2
    else:
        dev = "cuda"
    t_start = time.perf_counter()
    from kernellab import numba_support

    why = kernellab.get("relu", "numba").why_unavailable(dev)
    info = versions()
    try:
        import numba

        info["numba"] = numba.__version__
        import importlib.metadata as md

        info["numba_cuda"] = md.version("numba-cuda")
    except Exception:  # noqa: BLE001 - older numba without the numba-cuda package
        pass
    print(f"{kdev.gpu_name()}  {info}  simulator={numba_support.simulating()}", flush=True)
    if why:
        print(f"numba backends unavailable here: {why}")
        return 2
    meta = {"gpu": kdev.gpu_name(), "git_sha": git_sha(), **info}
    lines: list[str] = []
    rows: list[dict] = []
    failures = dry_checks(lines) if args.dry else checks(dev, lines, args.quick)
    print(f"checks: {failures} failures ({time.perf_counter() - t_start:.0f}s)", flush=True)
    if not args.dry:  # (the bench's admission checks take minutes under the simulator)
        failures += benches(dev, out, args.budget, rows)
    try:
        host_costs(dev, lines)
    except Exception as e:  # noqa: BLE001
        print(f"host costs: ERROR {e}", flush=True)
    failures += transposes(dev, out, args.budget, args.dry, meta, rows)
    md_text = "\n".join(lines) + "\n\n" + table(rows) + "\n"
    (out / "numba.md").write_text(md_text)
    print(f"\n# Numba CUDA backends ({time.perf_counter() - t_start:.0f}s, {failures} failures)\n")
    print(md_text)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
