"""cuda_v11, cuda_v12 and cuda_v13 (persistent TMA wgmma matmuls) against cuBLAS and cuda_v10
on an H100/H200.

    PYTHONPATH=src python lab/gpu_mm_v11.py --out $OUT [--max-seconds 200] [--cpu-dry-run]

1. smoke: cuda_v13 (TMA-store epilogue: the newest, the likeliest to fault or hang) with
   each tile width (128x256, 128x128) first, then cuda_v12 (ping-pong consumers), then
   cuda_v11 with each tile width, on small edge shapes (one exact tile,
   partial tiles, 1x8x8, a batch, padded K and N, blocks with 1, 2-3 and 3-4 tiles: odd and
   even turn counts), so a fault or a barrier deadlock shows up on a cheap, readable case
   before a big one;
2. per case, smallest first: correctness of cuda_v13, cuda_v12 and cuda_v11 (the
   launcher's tile width) against a float64 reference (inputs upcast): max |out - ref|, the same for
   torch.matmul, their ratio, the relative error max |out - ref| / max |ref| and the harness
   verdict (error <= 2x PyTorch's + a noise floor, NaN positions, every element written);
   then device time of torch.matmul (cuBLAS), cuda_v10, cuda_v11, cuda_v12 and cuda_v13
   (``kernellab.harness.timer.time_cuda``:
   CUDA events, L2 flushed before each call, median of a stable run), TFLOP/s = 2 M N K
   batch / time and the ratio to cuBLAS.
Rows go to DIR/mm_v11.jsonl as they are measured (kind: smoke / check / time / error /
stop); the table is printed last. Each case catches its own exceptions. A CUDA fault
(illegal address, ...) poisons the context: the run stops there and says so. A kernel
that never finishes (a barrier deadlock) is reported after --hang-seconds and the process
exits with status 3 (the context cannot be recovered). No new case starts after
--max-seconds. ``--cpu-dry-run``: argument parsing, the case list and the output file,
without a GPU and without launching anything.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# (shape (batch..., M, N, K), dtype): A [batch..., M, K] @ B [batch..., K, N]
CASES = [
    ((4096, 4096, 4096), "fp16"),
    ((4096, 5120, 5120), "fp16"),
    ((1000, 3000, 5000), "fp16"),
    ((8192, 8192, 8192), "bf16"),
    ((128, 14336, 4096), "bf16"),
    ((64, 4096, 4096), "bf16"),
    ((2048, 2048, 2048), "bf16"),
    ((4096, 4096, 4096), "bf16"),
    ((1000, 1000, 1000), "bf16"),
    ((1000, 1000, 1000), "fp16"),
    ((999, 1001, 1003), "bf16"),  # K, N not multiples of 8: the launcher pads
    ((8, 1024, 1024, 1024), "bf16"),  # batched: the batch is in v11's tile schedule
    ((32, 512, 512, 512), "fp16"),
]
SMOKE = [(128, 256, 64), (129, 257, 65), (1, 8, 8), (2, 5, 600, 72), (1000, 1023, 997), (2048, 4096, 256)]
# v12's extra smoke shapes: 288 and 1024 128x128 tiles (blocks with 2-3 and 7-8 turns), a
# long K inside one turn, one k-tile per turn
SMOKE_V12 = SMOKE + [(2304, 2048, 64), (4096, 4096, 512), (64, 256, 8192), (3, 129, 65, 257)]
# (backend, forced v11 / v13 tile width or None), in smoke order
SMOKE_RUNS = [("cuda_v13", 256), ("cuda_v13", 128), ("cuda_v12", None), ("cuda_v11", 256), ("cuda_v11", 128)]
CHECKED = ["cuda_v13", "cuda_v12", "cuda_v11"]
BACKENDS = ["torch", "cuda_v10", "cuda_v11", "cuda_v12", "cuda_v13"]
STICKY = ("illegal", "misaligned", "unspecified launch failure", "device-side", "launch timed out")
T0 = time.perf_counter()


class Fatal(RuntimeError):
    pass


def log(msg: str = "") -> None:
    print(f"[{time.perf_counter() - T0:6.1f}s] {msg}", flush=True)


def flops(shape) -> int:
    *batch, m, n, k = shape
    bt = 1
    for d in batch:
        bt *= d
    return 2 * bt * m * n * k


def label(shape) -> str:
    return "x".join(map(str, shape))


class Rows:
    def __init__(self, path: Path, meta: dict):
        self.path, self.meta = path, meta
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")

    def add(self, **row) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps({**self.meta, "op": "matmul", **row}, default=str) + "\n")


def inputs(shape, dtype, seed):
    *batch, m, n, k = shape
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn((*batch, m, k), generator=g, device="cuda", dtype=torch.float32).to(dtype)
    b = torch.randn((*batch, k, n), generator=g, device="cuda", dtype=torch.float32).to(dtype)
    return a, b


def sync_or_die(rows: Rows, what: str, hang_s: float) -> None:
    """Wait for the stream's work with a deadline: a deadlocked kernel never finishes, and the
    process cannot recover from it (exit 3 after recording it)."""
    ev = torch.cuda.Event()
    ev.record()
    deadline = time.perf_counter() + hang_s
    while not ev.query():
        if time.perf_counter() > deadline:
            log(f"HANG: {what} did not finish in {hang_s:.0f} s; exiting (the context is stuck)")
            rows.add(kind="stop", case=what, status=f"hang > {hang_s} s")
            sys.stdout.flush()
            os._exit(3)
        time.sleep(0.002)


def out_of_time(rows: Rows, max_seconds: float, shape, dname: str) -> bool:
    """True (and recorded) once --max-seconds have passed: no new case starts."""
    if time.perf_counter() - T0 <= max_seconds:
        return False
    log(f"--max-seconds {max_seconds:.0f} reached: no new case from {label(shape)} {dname} on")
    rows.add(kind="stop", shape=label(shape), dtype=dname, status="max-seconds")
    return True


def fatal_if_sticky(e: BaseException) -> None:
    if any(s in str(e).lower() for s in STICKY):
        raise Fatal(f"CUDA fault, the context is unusable: {e}") from e


def product(backend: str, block_n: int | None = None):
    """A callable a, b -> a @ b of one backend (the registered callable, no argument checks;
    ``block_n``: v11 or v13 with its tile width forced; v12 has one width)."""
    if backend == "torch":
        return torch.matmul
    if block_n is not None:
        assert backend in ("cuda_v11", "cuda_v13"), backend
        from kernellab.ops.matmul import cuda as mc

        launch = getattr(mc, f"_launch_{backend.removeprefix('cuda_')}")

        def forced(a, b):
            a3 = a.reshape(-1, *a.shape[-2:]).contiguous()
            b3 = b.reshape(-1, *b.shape[-2:]).contiguous()
            c = launch(a3, b3, torch.cuda.current_device(), block_n=block_n)
            return c.reshape(*a.shape[:-1], b.shape[-1])

        return forced
    import kernellab

    impl = kernellab.registry.get("matmul", backend)
    return lambda a, b: impl.fn(a, b)


def check(rows: Rows, kind: str, shape, dname: str, fn, hang_s: float, extra: dict) -> bool:
    from kernellab.harness.compare import judge

    dtype = DTYPES[dname]
    a, b = inputs(shape, dtype, seed=zlib.crc32(f"{label(shape)} {dname}".encode()))
    out = fn(a, b)
    sync_or_die(rows, f"{kind} {label(shape)} {dname} {extra}", hang_s)
    ref = torch.matmul(a.double(), b.double())
    base = torch.matmul(a, b)
    err = (out.double() - ref).abs().max().item()
    terr = (base.double() - ref).abs().max().item()
    rel = err / max(ref.abs().max().item(), 1e-30)
    v = judge(out, ref, dtype, base)
    ok = bool(v.ok) and out.shape == ref.shape
    ratio = err / terr if terr else float("inf")
    log(
        f"{kind} {dname} {label(shape):>18} {extra}: max|out-ref| {err:.3e} (torch {terr:.3e}, x{ratio:.2f})"
        f"  rel {rel:.2e}  {'PASS' if ok else 'FAIL ' + v.detail}"
    )
    rows.add(kind=kind, shape=label(shape), dtype=dname, **extra, err=err, torch_err=terr, rel_err=rel,
             ok=ok, detail=v.detail, status="ok" if ok else "rejected")  # fmt: skip
    return ok


def time_one(rows: Rows, shape, dname: str, backend: str, hang_s: float):
    from kernellab.harness.timer import time_cuda

    a, b = inputs(shape, DTYPES[dname], seed=1)
    fn = product(backend)
    fn(a, b)
    sync_or_die(rows, f"time {backend} {label(shape)} {dname}", hang_s)
    t = time_cuda(lambda: fn(a, b))
    tf = flops(shape) / (t.median_ms * 1e-3) / 1e12
    rows.add(kind="time", shape=label(shape), dtype=dname, mode="fwd", backend=backend, tflops=tf, status="ok",
             **t.as_dict())  # fmt: skip
    return t.median_ms, tf


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="directory for mm_v11.jsonl")
    p.add_argument("--max-seconds", type=float, default=200.0, help="start no new case after this")
    p.add_argument("--hang-seconds", type=float, default=30.0, help="a kernel running longer is a hang")
    p.add_argument("--cpu-dry-run", action="store_true", help="parse, list the cases, write the file; no GPU")
    p.add_argument("--no-smoke", action="store_true", help="skip the small edge shapes")
    args = p.parse_args()
    out = Path(args.out) / "mm_v11.jsonl"
    cases = sorted(CASES, key=lambda c: flops(c[0]))  # small first: a fault shows on a cheap case
    if args.cpu_dry_run:
        rows = Rows(out, {"gpu": None, "dry_run": True})
        for shape, dname in cases:
            if out_of_time(rows, args.max_seconds, shape, dname):
                break
            gflop = flops(shape) / 1e9
            rows.add(kind="plan", shape=label(shape), dtype=dname, gflop=gflop, backends=BACKENDS)
            log(f"plan {dname} {label(shape):>18}  {gflop:9.1f} GFLOP  {', '.join(BACKENDS)}")
        for backend, bn in SMOKE_RUNS:
            shapes = SMOKE_V12 if backend == "cuda_v12" else SMOKE
            rows.add(kind="plan", smoke=[label(s) for s in shapes], backend=backend, block_n=bn)
        smoke = ", then ".join(
            f"{len(SMOKE_V12 if b == 'cuda_v12' else SMOKE)} shapes of {b}" + (f" (width {bn})" if bn else "")
            for b, bn in SMOKE_RUNS
        )
        log(f"dry run: {len(cases)} cases; smoke: {smoke}; checked {', '.join(CHECKED)}; wrote {out}")
        return 0
    if not torch.cuda.is_available():
        print("no GPU: this script runs on a lent H100/H200 (--cpu-dry-run to test it here)")
        return 2
    import kernellab
    import kernellab.ops.matmul  # noqa: F401 (registers the op)
    from kernellab.harness.bench import git_sha, versions

    cap = torch.cuda.get_device_capability()
    gpu = torch.cuda.get_device_name()
    meta = {"gpu": gpu, **versions(), "git_sha": git_sha(), "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
    rows = Rows(out, meta)
    log(f"{gpu} sm_{cap[0]}{cap[1]}  torch {torch.__version__}  sha {rows.meta['git_sha']}")
    why = kernellab.registry.get("matmul", "cuda_v13").why_unavailable("cuda")
    if why:
        log(f"cuda_v11/cuda_v12/cuda_v13 unavailable here: {why}")
        rows.add(kind="stop", status=why)
        return 2
    ok, table = True, {}
    try:
        t = time.perf_counter()
        kernellab.registry.get("matmul", "cuda_v11").module.compile(f"sm_{cap[0]}{cap[1]}")
        log(f"compiled matmul_sm90.cu in {time.perf_counter() - t:.2f} s")
        if not args.no_smoke:
            for backend, bn in SMOKE_RUNS:
                for shape in SMOKE_V12 if backend == "cuda_v12" else SMOKE:
                    for dname in DTYPES:
                        try:
                            extra = {"backend": backend, "block_n": bn}
                            fn = product(backend, bn)
                            ok &= check(rows, "smoke", shape, dname, fn, args.hang_seconds, extra)
                        except Fatal:
                            raise
                        except Exception as e:  # noqa: BLE001 - record and go on
                            ok = False
                            what = f"smoke {backend} {dname} {label(shape)} bn={bn}"
                            log(f"{what}: ERROR {type(e).__name__}: {e}")
                            rows.add(kind="error", shape=label(shape), dtype=dname, backend=backend,
                                     block_n=bn, status=repr(e))  # fmt: skip
                            fatal_if_sticky(e)
        for shape, dname in cases:
            if out_of_time(rows, args.max_seconds, shape, dname):
                break
            for backend in CHECKED:
                try:
                    ok &= check(rows, "check", shape, dname, product(backend), args.hang_seconds,
                                {"backend": backend})  # fmt: skip
                except Fatal:
                    raise
                except Exception as e:  # noqa: BLE001
                    ok = False
                    log(f"check {backend} {dname} {label(shape)}: ERROR {type(e).__name__}: {e}")
                    traceback.print_exc(limit=3)
                    rows.add(kind="error", shape=label(shape), dtype=dname, backend=backend, status=repr(e))
                    fatal_if_sticky(e)
            for backend in BACKENDS:
                try:
                    ms, tf = time_one(rows, shape, dname, backend, args.hang_seconds)
                    table[(label(shape), dname, backend)] = (ms, tf)
                    log(f"time {dname} {label(shape):>18} {backend:9s}: {ms:8.3f} ms  {tf:7.1f} TFLOP/s")
                except Fatal:
                    raise
                except Exception as e:  # noqa: BLE001
                    log(f"time {dname} {label(shape)} {backend}: ERROR {type(e).__name__}: {e}")
                    rows.add(kind="error", shape=label(shape), dtype=dname, backend=backend, status=repr(e))
                    fatal_if_sticky(e)
            torch.cuda.empty_cache()
    except Fatal as e:
        ok = False
        log(f"STOPPED: {e}")
        rows.add(kind="stop", status=str(e))
    print(f"\nmatmul device time (CUDA events, L2 flushed, median), {gpu}:")
    print(f"{'shape':>18} {'dtype':>5} {'backend':>9} {'ms':>9} {'TFLOP/s':>8} {'x cuBLAS':>9}")
    for (shape, dname, backend), (ms, tf) in table.items():
        ref = table.get((shape, dname, "torch"))
        ratio = f"{tf / ref[1]:9.3f}" if ref else "        -"
        print(f"{shape:>18} {dname:>5} {backend:>9} {ms:9.3f} {tf:8.1f} {ratio}")
    log(f"correctness: {'all PASS' if ok else 'FAILURES above'}; rows in {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
