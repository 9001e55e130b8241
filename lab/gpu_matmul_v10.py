"""cuda_v10 (Hopper wgmma matmul, matmul_sm90.cu) on a lent H100/H200: correctness, then speed.

    python lab/gpu_matmul_v10.py

1. correctness: cuda_v10 against a float64 reference (inputs upcast) for bf16 and fp16 at
   128x256x64 (one exact tile), 1000x1023x997 (partial tiles, K and N padded to multiples of
   8 by the launcher), 17x33x65, batched 3x129x65x257 and 4096^3; prints max |out - ref|,
   PyTorch's own max error on the same inputs, and the harness verdict (error <= 2x
   PyTorch's + a noise floor, NaN positions, every element written);
2. speed: cuda_v10, cuda_v9 and torch (cuBLAS) at 4096^3 and 8192^3 bf16: CUDA events
   around each call, 3 warm-up calls, 20 timed calls, median; TFLOP/s = 2 M N K / time.
   (No L2 flush: the operands of these sizes do not fit in L2 anyway; `kernellab bench`
   is the careful benchmark.)
Each case catches its own exception and the run goes on; a CUDA fault (illegal address)
poisons the context, so the script stops there and says so. Takes well under a minute.
"""

from __future__ import annotations

import statistics
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402

import kernellab  # noqa: E402
import kernellab.ops.matmul as mm  # noqa: E402
from kernellab.harness.compare import judge  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
CHECK_SHAPES = [(128, 256, 64), (1000, 1023, 997), (17, 33, 65), (3, 129, 65, 257), (4096, 4096, 4096)]
BENCH_SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192)]
BENCH_BACKENDS = ["cuda_v10", "cuda_v9", "torch"]
T0 = time.perf_counter()


class Fatal(RuntimeError):
    pass


def log(msg: str = "") -> None:
    print(f"[{time.perf_counter() - T0:5.1f}s] {msg}", flush=True)


def fatal_if_sticky(e: BaseException) -> None:
    text = str(e).lower()
    if any(s in text for s in ("illegal", "misaligned", "unspecified launch failure", "device-side")):
        raise Fatal(f"CUDA fault, the context is unusable: {e}") from e


def inputs(shape, dtype, seed):
    *batch, m, n, k = shape
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn((*batch, m, k), generator=g, device="cuda", dtype=torch.float32).to(dtype)
    b = torch.randn((*batch, k, n), generator=g, device="cuda", dtype=torch.float32).to(dtype)
    return a, b


def check_case(shape, dname):
    dtype = DTYPES[dname]
    a, b = inputs(shape, dtype, seed=hash((shape, dname)) % 2**31)
    ref = torch.matmul(a.double(), b.double())
    out = mm.matmul(a, b, backend="cuda_v10")
    torch.cuda.synchronize()
    base = torch.matmul(a, b)
    err = (out.double() - ref).abs().max().item()
    terr = (base.double() - ref).abs().max().item()
    nans = int(out.isnan().sum().item())
    v = judge(out, ref, dtype, base)
    verdict = "PASS" if v.ok and nans == 0 else "FAIL"
    ratio = err / terr if terr else float("inf")
    log(
        f"check {dname} {'x'.join(map(str, shape)):>16}: max|v10-ref| {err:.3e}  max|torch-ref| {terr:.3e}"
        f"  ratio {ratio:5.2f}  NaN {nans}  {verdict}{'' if v.ok else ' (' + v.detail + ')'}"
    )
    return verdict == "PASS"


def time_case(backend, shape, reps=20, warmup=3):
    m, n, k = shape
    a, b = inputs(shape, torch.bfloat16, seed=1)
    if backend == "torch":
        fn = lambda: torch.matmul(a, b)  # noqa: E731
    else:
        impl = kernellab.registry.get("matmul", backend)
        fn = lambda: impl.fn(a, b)  # noqa: E731  (the registered callable, no argument checks)
    for _ in range(warmup):
        out = fn()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for s, e in ev:
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    ms = statistics.median(s.elapsed_time(e) for s, e in ev)
    tflops = 2 * m * n * k / (ms * 1e-3) / 1e12
    # sanity: the timed kernel's output against cuBLAS's (not the accuracy check above)
    diff = (out.float() - torch.matmul(a, b).float()).abs().max().item()
    return ms, tflops, diff


def main() -> int:
    if not torch.cuda.is_available():
        print("no GPU: this script runs on the lent H100/H200")
        return 2
    cap = torch.cuda.get_device_capability()
    log(f"{torch.cuda.get_device_name()} sm_{cap[0]}{cap[1]}  torch {torch.__version__}")
    why = kernellab.registry.get("matmul", "cuda_v10").why_unavailable("cuda")
    if why:
        log(f"cuda_v10 unavailable here: {why}")
        return 2
    ok = True
    try:
        t = time.perf_counter()
        kernellab.registry.get("matmul", "cuda_v10").module.compile(f"sm_{cap[0]}{cap[1]}")
        log(f"compiled matmul_sm90.cu in {time.perf_counter() - t:.2f} s")
        for shape in CHECK_SHAPES:
            for dname in DTYPES:
                try:
                    ok &= check_case(shape, dname)
                except Fatal:
                    raise
                except Exception as e:  # noqa: BLE001 - report and go on
                    ok = False
                    log(f"check {dname} {shape}: ERROR {type(e).__name__}: {e}")
                    traceback.print_exc(limit=3)
                    fatal_if_sticky(e)
        rows = []
        for shape in BENCH_SHAPES:
            for backend in BENCH_BACKENDS:
                try:
                    ms, tf, diff = time_case(backend, shape)
                    rows.append((shape, backend, ms, tf))
                    log(
                        f"time bf16 {'x'.join(map(str, shape))} {backend:9s}: {ms:8.3f} ms  {tf:7.1f} TFLOP/s"
                        f"  (max|out - cuBLAS| {diff:.3g})"
                    )
                except Fatal:
                    raise
                except Exception as e:  # noqa: BLE001
                    log(f"time {backend} {shape}: ERROR {type(e).__name__}: {e}")
                    fatal_if_sticky(e)
        print("\nbf16 matmul, median of 20 (CUDA events):")
        print(f"{'shape':>16} {'backend':>9} {'ms':>9} {'TFLOP/s':>8} {'% cuBLAS':>9}")
        for shape, backend, ms, tf in rows:
            ref = next((r[3] for r in rows if r[0] == shape and r[1] == "torch"), None)
            pct = f"{100 * tf / ref:8.1f}%" if ref else "        -"
            print(f"{'x'.join(map(str, shape)):>16} {backend:>9} {ms:9.3f} {tf:8.1f} {pct}")
    except Fatal as e:
        log(f"STOPPED: {e}")
        return 1
    log(f"correctness: {'all PASS' if ok else 'FAILURES above'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
