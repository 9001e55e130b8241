"""Transpose on a lent GPU: every backend checked, the CUDA ladder, Triton and PyTorch timed
against the measured copy bandwidth, and (with ncu) v2's bank conflicts against v3's.

    PYTHONPATH=src python lab/gpu_transpose.py --out DIR [--quick] [--max-seconds 170]
    PYTHONPATH=src python lab/gpu_transpose.py --out DIR --dry     # the plumbing, on the CPU

Stages (each case catches its own exceptions; each stage starts no case past its share of
--max-seconds, so the bench keeps its time):
1. check: ``check_impl`` (quick, no opcheck) of cuda, cuda_v1..v5 and triton in fp32 and bf16
   (fp16 with --fp16: the CUDA kernels move fp16 and bf16 as the same 2-byte words)
   -> DIR/check.jsonl. A backend that fails is not timed in that dtype; one the check had no
   time for is admitted by the bench's own forward check.
2. bench: ``harness.bench`` (L2 flushed, median of CUDA events, output re-checked, rows with
   ``pct_bw`` = GB/s over ``kernellab peaks``' device-to-device copy) of every rung, cuda,
   triton and torch at 4096x4096, 8192x8192, 4096x14336 (fp32, bf16) and 1023x1025
   -> DIR/transpose.jsonl. GB/s count x read once and y written once.
3. ceilings: at the same aligned shapes, torch's copy (``y.copy_(x)``, same bytes) and
   ``copy_tile`` (v5's grid and 16-byte accesses without the transpose)
   -> DIR/ceilings.jsonl: what v5's pattern can reach, apart from the transpose.
4. ncu (when ``ncu`` is on PATH, 120 s at most): shared-memory bank conflicts of v2, v3 and
   v5 at 4096x4096 fp32 (l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld/st.sum and
   the shared wavefronts) -> DIR/ncu_bank_conflicts.txt (the raw CSV and a summary).
5. triton tiles (not with --quick): (BM, BN, warps) around ``transpose_config`` at
   8192x8192 fp32 and bf16 -> DIR/triton_tiles.jsonl.
Last: a table per shape and dtype of each backend's ms and % of copy bandwidth, and whether
the best rung reaches the target (90%).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402

import kernellab  # noqa: E402
from kernellab import device as kl_device  # noqa: E402
from kernellab.core.spec import dtype_name, shape_str  # noqa: E402
from kernellab.harness import timer  # noqa: E402
from kernellab.harness.bench import bench, git_sha, versions  # noqa: E402
from kernellab.harness.check import PASS, check_impl  # noqa: E402
from kernellab.harness.results import write_jsonl  # noqa: E402

OP = "transpose"
RUNGS = ["cuda_v1", "cuda_v2", "cuda_v3", "cuda_v4", "cuda_v5", "cuda"]
OURS = RUNGS + ["triton"]
TARGET_PCT = 90.0
BIG = [(4096, 4096), (8192, 8192), (4096, 14336)]
ODD = [(1023, 1025)]
TRITON_TILES = [(64, 64, 4), (64, 128, 4), (128, 64, 4), (64, 64, 8), (128, 128, 8), (32, 128, 4)]
NCU_METRICS = [
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum",
]


# Each stage starts no case after its share of --max-seconds: the bench (the point of the
# run) keeps its time whatever the check takes.
SHARE = {"check": 0.35, "bench": 0.8, "ceilings": 0.85, "ncu": 0.88, "triton tiles": 1.0}


class Clock:
    def __init__(self, limit: float):
        self.t0, self.limit = time.perf_counter(), limit

    def left(self, stage: str | None = None) -> float:
        share = SHARE.get(stage, 1.0) if stage else 1.0
        return share * self.limit - (time.perf_counter() - self.t0)

    def over(self, stage: str) -> bool:
        if self.left(stage) <= 0:
            print(f"[{stage}: stopped at {SHARE.get(stage, 1.0):.0%} of --max-seconds]", flush=True)
            return True
        return False


def _fail(what: str, e: BaseException) -> None:
    print(f"  {what}: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}", flush=True)
    tb = traceback.format_exc(limit=3).strip().splitlines()
    print("    " + "\n    ".join(tb[-4:]), flush=True)


def stage_check(args, dev, dtypes, out: Path, clock: Clock) -> dict:
    """(backend, dtype) -> '' (passed) or why not; rows to check.jsonl."""
    print("\n## check (quick) against the float64 reference", flush=True)
    admitted = {}
    backends = OURS if dev == "cuda" else ["triton", "torch", "manual"]
    rows = []
    for dt in dtypes:
        for b in backends:
            if clock.over("check"):
                break
            t0 = time.perf_counter()
            try:
                rep = check_impl(
                    kernellab.get(OP, b), dt, device=dev, quick=True, seed=args.seed, opcheck=False
                )  # (opcheck: the gpu tests and `kernellab check`)
                bad = rep.failures
                why = f"{bad[0].kind} {bad[0].name}: {bad[0].detail}" if bad else rep.reason or rep.status
                why = "" if rep.status == PASS else why
                n_ok = sum(c.status == PASS for c in rep.cases)
                line = f"{rep.status} {n_ok}/{len(rep.cases)} cases"
            except Exception as e:  # noqa: BLE001 - reported, the run goes on
                _fail(f"check {b} {dtype_name(dt)}", e)
                why, line = f"{type(e).__name__}: {e}", "error"
            admitted[(OP, b, dt)] = why
            rows.append(
                {
                    "op": OP,
                    "backend": b,
                    "dtype": dtype_name(dt),
                    "status": "ok" if not why else "rejected",
                    "check": line,
                    "why": why[:400],
                    "seconds": round(time.perf_counter() - t0, 1),
                }
            )
            print(
                f"  {b:8s} {dtype_name(dt):4s} {line}{'' if not why else '  <- ' + why[:200]}"
                f"  ({time.perf_counter() - t0:.1f} s)",
                flush=True,
            )
    write_jsonl(rows, out / "check.jsonl")
    return admitted


def stage_bench(args, dev, cases, admitted, out: Path, clock: Clock) -> list:
    print("\n## bench (fwd; L2 flushed; GB/s = read + write; % of measured copy bandwidth)", flush=True)
    backends = (OURS + ["torch"]) if dev == "cuda" else ["triton", "torch", "manual"]
    rows = []
    for shape, dt in cases:  # one bench call per case (bench reports a backend's crash as its row)
        if clock.over("bench"):
            break
        try:
            got = bench(
                OP,
                backends=backends,
                shapes=[shape],
                dtypes=[dt],
                modes=("fwd",),
                device=dev,
                budget_s=args.budget,
                admitted=admitted,
            )
        except Exception as e:  # noqa: BLE001 - reported, the run goes on
            _fail(f"bench {shape_str(shape)} {dtype_name(dt)}", e)
            continue
        write_jsonl(got, out / "transpose.jsonl")
        rows += got
        for r in got:
            pct = r.get("pct_bw")
            extra = f"{pct:5.1f}%" if pct is not None else (r.get("reason") or "")[:120]
            ms = r.get("median_ms")
            print(
                f"  {shape_str(shape):10s} {dtype_name(dt):4s} {r['backend']:8s} {r['status']:8s} "
                f"{'-' if ms is None else f'{ms:.4f}'} ms  {r.get('gbps') or 0:7.0f} GB/s  {extra}",
                flush=True,
            )
    return rows


def _time(fn, dev, budget):
    if dev == "cuda":
        return timer.time_cuda(fn, budget_s=budget)
    return timer.time_host(fn, budget_s=budget)


def _ceiling_row(meta, backend, shape, dt, t, nbytes, peak, **extra) -> dict:
    gbps = nbytes / (t.median_ms * 1e-3) / 1e9
    return {
        "op": OP,
        "bench": "ceiling",
        "backend": backend,
        "mode": "fwd",
        "shape": shape_str(shape),
        "dtype": dtype_name(dt),
        "median_ms": t.median_ms,
        "p20_ms": t.p20_ms,
        "p80_ms": t.p80_ms,
        "gbps": gbps,
        "pct_bw": round(100 * gbps / peak, 1) if peak else None,
        "status": "ok",
        **meta,
        **extra,
    }


def stage_ceilings(args, dev, cases, peak, meta, out: Path, clock: Clock) -> dict:
    """(shape, dtype) -> {'copy_torch': pct, 'copy_tile': pct}."""
    print("\n## ceilings: the same bytes copied (torch copy_, and v5's pattern as a copy)", flush=True)
    from kernellab.ops.transpose import cuda as tcuda

    res = {}
    for shape, dt in cases:
        if clock.over("ceilings"):
            break
        x = torch.randn(shape, device=dev).to(dt)
        y = torch.empty_like(x)
        nbytes = 2 * x.numel() * x.element_size()
        got = {}
        fns = {"copy_torch": lambda: y.copy_(x)}
        if dev == "cuda":
            fns["copy_tile"] = lambda: tcuda.transpose_cuda(x, "copy")
        for name, fn in fns.items():
            try:
                if name == "copy_tile":
                    assert torch.equal(fn(), x), "copy_tile copied wrong"
                t = _time(fn, dev, args.budget)
                row = _ceiling_row(meta, name, shape, dt, t, nbytes, peak)
                write_jsonl([row], out / "ceilings.jsonl")
                got[name] = row["pct_bw"]
                pct = f"{row['pct_bw']:5.1f}%" if row["pct_bw"] is not None else ""
                print(
                    f"  {shape_str(shape):10s} {dtype_name(dt):4s} {name:10s} {t.median_ms:.4f} ms "
                    f"{row['gbps']:7.0f} GB/s {pct}",
                    flush=True,
                )
            except Exception as e:  # noqa: BLE001
                _fail(f"{name} {shape_str(shape)} {dtype_name(dt)}", e)
        res[(shape, dt)] = got
        del x, y
    return res


def stage_triton_tiles(args, dev, shape, dtypes, peak, meta, out: Path, clock: Clock) -> None:
    print(f"\n## triton tiles at {shape_str(shape)}: (BM, BN, warps)", flush=True)
    from kernellab.ops.transpose import triton as ttr

    for dt in dtypes:
        x = torch.randn(shape, device=dev).to(dt)
        want = x.t().contiguous()
        default = ttr.transpose_config(x.element_size())
        line = []
        for cfg in TRITON_TILES:
            if clock.over("triton tiles"):
                return
            try:
                assert torch.equal(ttr.transpose_triton(x, cfg), want), "wrong output"
                t = _time(lambda cfg=cfg: ttr.transpose_triton(x, cfg), dev, args.budget)
                row = _ceiling_row(
                    meta,
                    "triton_tile",
                    shape,
                    dt,
                    t,
                    2 * x.numel() * x.element_size(),
                    peak,
                    config=list(cfg),
                    default=cfg == default,
                )
                write_jsonl([row], out / "triton_tiles.jsonl")
                line.append(
                    f"{cfg}{'*' if cfg == default else ''} {t.median_ms:.4f} ms"
                    + (f" {row['pct_bw']:.1f}%" if row["pct_bw"] else "")
                )
            except Exception as e:  # noqa: BLE001
                _fail(f"triton {cfg} {dtype_name(dt)}", e)
        print(f"  {dtype_name(dt)}: " + "; ".join(line) + "   (* the default)", flush=True)
        del x, want


_NCU_CHILD = """
import torch, kernellab
x = torch.randn(4096, 4096, device="cuda")
for b in ("cuda_v2", "cuda_v3", "cuda_v5"):
    kernellab.transpose(x, backend=b)
torch.cuda.synchronize()
"""


def stage_ncu(out: Path, clock: Clock) -> None:
    print("\n## ncu: shared-memory bank conflicts, 4096x4096 fp32", flush=True)
    ncu = shutil.which("ncu") or next(
        (p for p in ("/usr/local/cuda/bin/ncu", "/opt/nvidia/nsight-compute/ncu") if os.access(p, os.X_OK)),
        None,
    )
    report = out / "ncu_bank_conflicts.txt"
    if ncu is None:
        print("  ncu not found: skipped", flush=True)
        report.write_text("ncu not found on PATH: not measured\n")
        return
    limit = max(20.0, min(120.0, clock.left()))
    cmd = [
        ncu,
        "--metrics",
        ",".join(NCU_METRICS),
        "--kernel-name",
        "regex:transpose_v[235]_f32",
        "--csv",
        sys.executable,
        "-c",
        _NCU_CHILD,
    ]
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1] / "src"))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=limit, env=env)
        text, err = proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as e:
        text = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = f"ncu timed out after {limit:.0f} s"
    except Exception as e:  # noqa: BLE001
        text, err = "", f"{type(e).__name__}: {e}"
    summary = _parse_ncu(text)
    lines = [f"{k}: {m} = {v}" for (k, m), v in sorted(summary.items())]
    report.write_text(
        "\n".join(
            [
                "# summary (kernel: metric = value)",
                *lines,
                "",
                "# ncu stdout",
                text,
                "# ncu stderr",
                err[-4000:],
            ]
        )
        + "\n"
    )
    if not summary:
        print(f"  no metrics parsed (see {report}): {err.strip()[-300:]}", flush=True)
    for line in lines:
        print("  " + line, flush=True)


def _parse_ncu(text: str) -> dict:
    """ncu --csv rows -> {(kernel, metric): value}."""
    import csv
    import io

    rows = [ln for ln in text.splitlines() if ln.startswith('"')]
    out = {}
    if not rows:
        return out
    for r in csv.DictReader(io.StringIO("\n".join(rows))):
        k, m, v = r.get("Kernel Name"), r.get("Metric Name"), r.get("Metric Value")
        if k and m:
            out[(k.split("(")[0], m)] = v
    return out


def summary_table(rows, ceilings, cases) -> int:
    print("\n## summary: ms / % of copy bandwidth (fwd)", flush=True)
    names = OURS + ["torch"]
    by = {(r["shape"], r["dtype"], r["backend"]): r for r in rows}
    hdr = f"{'shape':10s} {'dtype':5s} | " + " | ".join(f"{n:>14s}" for n in names)
    hdr += " | copy_tile | best rung"
    print(hdr)
    misses = 0
    for shape, dt in cases:
        s, d = shape_str(shape), dtype_name(dt)
        cells, best = [], None
        for n in names:
            r = by.get((s, d, n))
            if r is None or r.get("status") != "ok":
                cells.append(f"{'-' if r is None else r.get('status', '?')[:14]:>14s}")
                continue
            pct = r.get("pct_bw")
            cells.append(f"{r['median_ms']:7.4f} " + (f"{pct:5.1f}%" if pct is not None else "     -"))
            if n in RUNGS and (best is None or r["median_ms"] < best[1]["median_ms"]):
                best = (n, r)
        ct = (ceilings.get((shape, dt)) or {}).get("copy_tile")
        verdict = "-"
        if best is not None:
            pct = best[1].get("pct_bw")
            ok = pct is not None and pct >= TARGET_PCT
            misses += pct is not None and not ok and shape not in ODD
            verdict = f"{best[0]} {pct}% {'>= target' if ok else '< target ' + str(TARGET_PCT)}"
        print(f"{s:10s} {d:5s} | " + " | ".join(cells) + f" | {ct if ct is not None else '-':>9} | {verdict}")
    return misses


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--quick", action="store_true", help="two big shapes, no Triton tile sweep")
    p.add_argument(
        "--dry", action="store_true", help="tiny shapes on the CPU (Triton interpreter): the plumbing"
    )
    p.add_argument("--max-seconds", type=float, default=170.0, help="start no stage or case after this")
    p.add_argument("--budget", type=float, default=0.3, help="timing budget per case (s)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--no-ncu", action="store_true")
    p.add_argument("--fp16", action="store_true", help="check fp16 too")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.dry and not torch.cuda.is_available():
        print("no GPU (use --dry to exercise the script on the CPU)")
        return 2
    dev = "cpu" if args.dry else "cuda"
    clock = Clock(args.max_seconds)
    gpu = "cpu dry run" if args.dry else torch.cuda.get_device_name()
    meta = {"gpu": gpu, **versions(), "git_sha": git_sha(), "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
    print(f"{gpu}  torch {meta['torch']}  triton {meta['triton']}  sha {meta['git_sha']}", flush=True)
    peak = None
    if dev == "cuda":
        try:
            peaks = kl_device.peaks()
            peak = peaks["copy_gbps"]
            print(f"measured device-to-device copy: {peak:.0f} GB/s (read + write)", flush=True)
            (out / "peaks.json").write_text(json.dumps(peaks, indent=1))
        except Exception as e:  # noqa: BLE001
            _fail("peaks", e)
    f32, f16, bf16 = torch.float32, torch.float16, torch.bfloat16
    if args.dry:
        check_dtypes = [f32]
        cases = [((256, 256), f32), ((131, 67), f32)]
    else:
        # fp16 runs the CUDA kernels bf16 runs (2-byte raw moves): checked with --fp16
        check_dtypes = [f32, bf16, f16] if args.fp16 else [f32, bf16]
        big = BIG[:2] if args.quick else BIG
        cases = [(s, dt) for dt in (f32, bf16) for s in big] + [(s, dt) for s in ODD for dt in (f32, bf16)]
    admitted = stage_check(args, dev, check_dtypes, out, clock)
    rows = stage_bench(args, dev, cases, admitted, out, clock)
    aligned = [(s, dt) for s, dt in cases if s not in ODD] if dev == "cuda" else cases
    ceilings = stage_ceilings(args, dev, aligned, peak, meta, out, clock)
    if dev == "cuda" and not args.no_ncu and not clock.over("ncu"):
        stage_ncu(out, clock)
    if not args.quick and not clock.over("triton tiles"):
        stage_triton_tiles(
            args,
            dev,
            (512, 512) if args.dry else (8192, 8192),
            [f32] if args.dry else [f32, bf16],
            peak,
            meta,
            out,
            clock,
        )
    misses = summary_table(rows, ceilings, cases)
    failed = [f"{b} {dtype_name(d)}" for (_, b, d), why in admitted.items() if why]
    print(
        f"\n{len(failed)} check failures{': ' + ', '.join(failed) if failed else ''};"
        f" {misses} aligned case(s) where the best rung is under {TARGET_PCT:.0f}% of copy;"
        f" {time.perf_counter() - clock.t0:.0f} s; rows in {out}",
        flush=True,
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
