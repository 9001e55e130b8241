"""fp32 GEMV prototype (lab/fp32_gemv.cu) against cuBLAS and the Triton FMA kernel, M <= 4.

    python lab/gpu_fp32_gemv.py --out $W [--shapes 1x4097x4095,...] [--layouts nn,nt]
        [--max-seconds 150] [--compile-only]

Why: at fp32 M = 1 (1x4097x4095, a 67 MB weight) cuBLAS reads at 1.87 TB/s (35.9 us with b
row-major [K, N], 39.5 us as W.t()) and no config of the Triton FMA kernel gets below 42.6
us (results/fp32_sweep-H100-b9aaf6d-m1.jsonl). skinny.cu's kernels are 16-bit only.

Stages: compile every candidate module (NVRTC, sm of this GPU; --compile-only: sm_90 on
any machine, then stop); then per shape and layout ("nn": b row-major [K, N]; "nt": b =
W.t() with W [N, K] row-major) time cuBLAS (``a @ b``, TF32 off), kernellab's triton
backend and every candidate (kernel x threads x loads in flight x rows a warp x K slices),
each output judged against float64 first (error as a ratio to cuBLAS's; the check's bound
is about 2x). ``triton.testing.do_bench`` medians (it zeroes a 256 MB buffer before each
call: the weight never comes from L2); a candidate's time includes its fp32 partials'
allocation and the ordered slice sum (gv_sum) where it has K slices.
Rows (one per timing) go to $OUT/fp32_gemv.jsonl; the best candidate per shape is printed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402

from kernellab.cuda.runtime import Module  # noqa: E402

SOURCE = Path(__file__).with_name("fp32_gemv.cu")
SHAPES = ((1, 4097, 4095), (1, 4096, 4096), (2, 4096, 4096), (4, 4096, 4096), (1, 14336, 4096), (4, 4097, 4095))
SIG = ("ptr", "ptr", "ptr") + ("i32",) * 6
SUM_SIG = ("ptr", "ptr", "i32", "i32")

# (kind, threads, U, R) candidates; K slice counts are tried per shape (SLICES)
COLS = [("cols", t, u, 1) for t in (128, 256) for u in (4, 8, 16)]
ROWS = [("rows", t, u, r) for t in (128, 256) for u in (2, 4, 8) for r in (1, 2) if u * r <= 8]
SLICES = {"cols": (8, 16, 32, 64, 128), "rows": (1, 2, 4, 8)}
SHARED_MAX = 48 * 1024  # x's slice in shared memory: M x kc floats, at most this


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


_MODULES: dict[tuple, Module] = {}


def module(threads: int, u: int, r: int) -> Module:
    key = (threads, u, r)
    if key not in _MODULES:
        _MODULES[key] = Module(SOURCE, options=(f"-DGV_THREADS={threads}", f"-DGV_U={u}", f"-DGV_R={r}"))
    return _MODULES[key]


def rows_pitch(kc: int, u: int) -> int:
    """gv_rows' x row pitch in shared memory: kc rounded up to a whole 32 x U step."""
    return _cdiv(kc, 32 * u) * 32 * u


def shared_bytes(kind: str, kc: int, u: int, mr: int) -> int:
    """Dynamic shared memory of one block: x's K slice, ``mr`` rows of it."""
    return 4 * mr * (kc if kind == "cols" else rows_pitch(kc, u))


def rows_of(m: int) -> int:
    """The build (MR) that serves M rows of x."""
    return 1 if m == 1 else 2 if m == 2 else 4


def slices_for(kind: str, k: int, s: int, u: int, mr: int) -> tuple[int, int] | None:
    """(S, kc) for ``s`` asked-for slices, or None where a slice would be too short or x's
    slice (``mr`` rows) too long for SHARED_MAX."""
    kc = _cdiv(k, s)
    kc = _cdiv(kc, u) * u if kind == "cols" else _cdiv(kc, 32) * 32
    if shared_bytes(kind, kc, u, mr) > SHARED_MAX or kc < 32:
        return None
    return _cdiv(k, kc), kc


def prepare(cand, s_kc, a, b, layout):
    """A callable computing y = a @ b through one candidate (a [M, K] contiguous, b as the
    layout gives it): kernels, grid and shared memory resolved once, so that the timed
    call allocates its outputs and launches, as a library call would."""
    kind, threads, u, r = cand
    s, kc = s_kc
    m, k = a.shape
    n = b.shape[1]
    if layout == "nn":
        w, ldw = b, b.stride(0)
    else:
        w, ldw = b.t(), b.stride(1)  # W [N, K]
    mr = rows_of(m)
    dev = a.device.index
    kern = module(threads, u, r).kernel(f"gv_{kind}_m{mr}", SIG, dev)
    shared = shared_bytes(kind, kc, u, mr)
    kern.set_max_dynamic_shared(shared)
    grid = (_cdiv(n, threads if kind == "cols" else threads // 32 * r), s, 1)
    summ = module(threads, u, r).kernel("gv_sum", SUM_SIG, dev) if s > 1 else None

    def call():
        y = torch.empty((m, n), dtype=torch.float32, device=a.device)
        out = y if s == 1 else torch.empty((s, m, n), dtype=torch.float32, device=a.device)
        kern(grid, threads, a, w, out, m, n, k, a.stride(0), ldw, kc, shared=shared)
        if summ is not None:
            summ(_cdiv(m * n, 256), 256, out, y, m * n, s)
        return y

    return call


def compile_all(arch: str | None = None) -> int:
    t0 = time.time()
    count = 0
    for threads, u, r in dict.fromkeys(c[1:] for c in COLS + ROWS):
        mod = module(threads, u, r)
        if arch:
            mod.compile(arch)
        count += 1
    print(f"compiled {count} modules{' for ' + arch if arch else ''} in {time.time() - t0:.1f}s", flush=True)
    return count


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default=None, help="comma list of MxNxK (default: SHAPES)")
    ap.add_argument("--layouts", default="nn,nt")
    ap.add_argument("--max-seconds", type=float, default=150.0, help="start no shape after this")
    ap.add_argument("--compile-only", action="store_true")
    args = ap.parse_args()
    if args.compile_only:
        compile_all("sm_90")
        return 0
    if not torch.cuda.is_available():
        print("needs a CUDA GPU (or --compile-only)", file=sys.stderr)
        return 2
    from triton.testing import do_bench

    import kernellab

    torch.backends.cuda.matmul.allow_tf32 = False
    major, minor = torch.cuda.get_device_capability()
    compile_all(f"sm_{major}{minor}")
    shapes = [tuple(map(int, s.split("x"))) for s in args.shapes.split(",")] if args.shapes else SHAPES
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "fp32_gemv.jsonl")
    gpu = torch.cuda.get_device_name()
    t_start = time.time()
    print(f"{gpu}  torch {torch.__version__}", flush=True)
    print("   M      N      K layout |  cuBLAS  GB/s | triton     x |   best     x  err/cuBLAS  config", flush=True)
    for (m, n, k), layout in itertools.product(shapes, args.layouts.split(",")):
        if time.time() - t_start > args.max_seconds:
            print(f"stopped at {args.max_seconds:.0f} s", flush=True)
            break
        g = torch.Generator(device="cuda").manual_seed(m * n + k)
        a = torch.randn(m, k, generator=g, device="cuda")
        if layout == "nn":
            b = torch.randn(k, n, generator=g, device="cuda") * k**-0.5
        else:
            b = (torch.randn(n, k, generator=g, device="cuda") * k**-0.5).t()
        ref = a.double() @ b.double()
        e_cublas = float(((a @ b).double() - ref).abs().max())
        rows = []

        def record(backend, ms, err=None, config=None):
            row = dict(op="matmul", bench="fp32_gemv", backend=backend, shape=f"{m}x{n}x{k}", layout=layout,
                       dtype="fp32", mode="fwd", median_ms=ms, gbps=n * k * 4 / (ms * 1e-3) / 1e9,
                       err_ratio=err, config=config, gpu=gpu, git_sha=os.environ.get("KERNELLAB_GIT_SHA"))  # fmt: skip
            rows.append(row)
            with open(path, "a") as f:
                f.write(json.dumps(row) + "\n")

        t_cublas = do_bench(lambda: a @ b, warmup=10, rep=50)
        record("torch", t_cublas, 1.0)
        try:
            y = kernellab.matmul(a, b, backend="triton")
            e = float((y.double() - ref).abs().max()) / max(e_cublas, 1e-30)
            record("triton", do_bench(lambda: kernellab.matmul(a, b, backend="triton"), warmup=10, rep=50), e)
        except Exception as exc:  # noqa: BLE001
            print(f"  triton failed: {str(exc)[:120]}", flush=True)
        best = None
        for cand in COLS + ROWS:
            kind = cand[0]
            for s_req in SLICES[kind]:
                s_kc = slices_for(kind, k, s_req, cand[2], rows_of(m))
                if s_kc is None:
                    continue
                label = f"{kind} t{cand[1]} u{cand[2]} r{cand[3]} S{s_kc[0]} kc{s_kc[1]}"
                try:
                    call = prepare(cand, s_kc, a, b, layout)
                    y = call()
                    torch.cuda.synchronize()
                except Exception as exc:  # noqa: BLE001
                    print(f"  {label}: {str(exc)[:160]}", flush=True)
                    continue
                e = float((y.double() - ref).abs().max()) / max(e_cublas, 1e-30)
                if not math.isfinite(e) or e > 4.0:
                    print(f"  {label}: WRONG, error {e:.2f}x cuBLAS's", flush=True)
                    record("gv_wrong", None, e, label)
                    continue
                ms = do_bench(call, warmup=10, rep=50)
                record("gv", ms, e, label)
                if best is None or ms < best[0]:
                    best = (ms, e, label)
        trow = next((r for r in rows if r["backend"] == "triton"), None)
        tt = f"{trow['median_ms'] * 1e3:7.1f} {t_cublas / trow['median_ms']:5.2f}" if trow else "      -     -"
        bt = f"{best[0] * 1e3:7.1f} {t_cublas / best[0]:5.2f}  {best[1]:9.2f}   {best[2]}" if best else "-"
        gb = n * k * 4 / (t_cublas * 1e-3) / 1e9
        print(f"{m:4d} {n:6d} {k:6d} {layout:>6} | {t_cublas * 1e3:7.1f} {gb:5.0f} | {tt} | {bt}", flush=True)
    print(f"rows in {path}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
