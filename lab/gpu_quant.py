"""Weight-only int8 / int4 matmuls on a lent GPU: every backend checked, then timed against
the bf16 cuBLAS product with the unquantized weight and against torchao's int8 weight-only.

    PYTHONPATH=src python lab/gpu_quant.py --out $OUT [--quick] [--max-seconds 180]
    PYTHONPATH=src python lab/gpu_quant.py --out /tmp/q --dry     # tiny, CPU, plumbing only

torchao (optional) is not on the GPU machine: carry its wheel and put it on the path first
(``pip install --no-deps --target /tmp/site .whl/torchao-*.whl; export PYTHONPATH=/tmp/site:src``).

1. check: every registered backend of int8_weight_only_matmul and int4_weight_only_matmul
   that runs here (torchao too, when it imports), bf16 and fp16, at decode, tiled, split-K
   and odd shapes, against the float64 reference of the dequantized weight (kernellab's
   rule: error <= 2 x the torch backend's + a floor). One failing case does not stop the rest.
2. ceiling: device-to-device copy bandwidth (bytes read + written per second).
3. bench (bf16 x): weights (N, K) = (14336, 4096), (4096, 14336), (4096, 4096); M in
   1, 2, 4, 8, 16, 32, 64 (--quick: 1, 16, 64). Timed with kernellab's device timer
   (L2 flushed before every call; a spin kernel holds the device while the host queues
   the calls, so host cost is not counted; median, p20, p80), and the host cost of one
   call issued to an idle device ("host us"; an eager decode loop pays the larger):
     bf16      F.linear(x, w) with the unquantized bf16 weight (cuBLAS)
     int8 *    our int8 backends (triton, cuda_v1..v4, torch, compile at M 1 / 16,
               manual at M 1), torch._weight_int8pack_mm where CUDA has it
     int4 *    our int4 backends (triton, cuda, cuda_v1, torch)
     torchao   torchao int8 weight-only through F.linear, eager; torchao_compile: a Linear
               holding torchao's weight under torch.compile (M 1 and 16)
   GB/s = weight bytes (int8: N K, int4: N K / 2, bf16: 2 N K) / time; "%copy" is that
   against the measured copy bandwidth; "x bf16" = bf16 cuBLAS ms / ms.
4. SQNR (dB) of the int8 and int4 products against the bf16 product with the original
   weight (x and w ~ N(0, 1), K^-1/2 scaled).

Rows go to $OUT/quant.jsonl (kernellab's row fields); a short table is printed last, with
the issue's targets: int8 at M = 1 and 16 on the 4096 x 14336 weights >= 1.6x bf16 cuBLAS
and >= torchao. No stage or shape starts after --max-seconds (default 180).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import kernellab  # noqa: E402
from kernellab.core import registry  # noqa: E402
from kernellab.harness.bench import git_sha, versions  # noqa: E402
from kernellab.harness.compare import judge  # noqa: E402
from kernellab.harness.results import write_jsonl  # noqa: E402
from kernellab.ops.weight_only_matmul import SPEC, SPEC_INT4, quantize_weight, sqnr, wo_reference  # noqa: E402
from kernellab.ops.weight_only_matmul.reference import torchao_int8_weight, torchao_unavailable  # noqa: E402

OPS = {"int8": ("int8_weight_only_matmul", SPEC, 8), "int4": ("int4_weight_only_matmul", SPEC_INT4, 4)}
PUBLIC = {
    "int8_weight_only_matmul": kernellab.int8_weight_only_matmul,
    "int4_weight_only_matmul": kernellab.int4_weight_only_matmul,
}


def call(op, backend, x, w_q, s, b=None):
    return PUBLIC[op](x, w_q, s, b, backend=backend)


WEIGHTS = ((14336, 4096), (4096, 14336), (4096, 4096))
MS = (1, 2, 4, 8, 16, 32, 64)
CHECK_SHAPES = [
    (1, 4096, 4096),
    (16, 14336, 4096),
    (1, 4096, 14336),
    (8, 1024, 14336),
    (5, 1000, 1040),
    (33, 4096, 4096),
    (64, 512, 4096),
    (7, 77, 130),
    (3, 2, 2048),
]
COMPILE_MS = (1, 16)


def timer(dev):
    if dev == "cuda":
        from kernellab.harness.timer import host_cost_us, time_cuda

        def run(fn):
            t = time_cuda(fn, flush=True, budget_s=0.6)
            return t.median_ms, t.p20_ms, t.p80_ms, host_cost_us(fn, calls=50, budget_s=0.2)

        return run

    def run(fn):
        ts = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e3)
        ts.sort()
        return ts[1], ts[0], ts[2], ts[1] * 1e3

    return run


def row(meta, op, backend, m, n, k, dname, q, wbytes, copy_gbps, status="ok", **extra):
    gbps = wbytes / q[0] / 1e6 if q else None
    return {
        "op": op,
        "bench": "quant",
        "backend": backend,
        "mode": "fwd",
        "shape": f"{m}x{n}x{k}",
        "dtype": dname,
        "median_ms": q[0] if q else None,
        "p20_ms": q[1] if q else None,
        "p80_ms": q[2] if q else None,
        "host_us": q[3] if q else None,
        "gbps": gbps,
        "pct_copy": round(100 * gbps / copy_gbps, 1) if gbps and copy_gbps else None,
        "status": status,
        **meta,
        **extra,
    }


def backends_here(op: str, dev: str) -> list[str]:
    out = []
    for impl in registry.impls(op):
        if dev not in impl.devices:
            continue
        if impl.why_unavailable(dev) is None:
            out.append(impl.backend)
    return out


# --------------------------------------------------------------------------- 1. check


def check_stage(args, dev, meta, jsonl, t_start):
    print(
        "\n## check: every backend against float64 (err / bound; bound = 2 x torch's error + floor)",
        flush=True,
    )
    failures = 0
    shapes = [(1, 40, 130), (3, 24, 66), (17, 33, 258), (2, 8, 2048)] if args.dry else CHECK_SHAPES
    dtypes = (torch.bfloat16,) if args.dry else (torch.bfloat16, torch.float16)
    for op, spec, bits in OPS.values():
        backends = backends_here(op, dev)
        if args.dry:
            backends = [b for b in backends if b != "compile"]
        print(f"{op}: {', '.join(backends)}", flush=True)
        for dtype in dtypes:
            for shape in shapes:
                if time.perf_counter() - t_start > args.max_seconds:
                    print("check: stopped at --max-seconds", flush=True)
                    return failures
                x, w_q, s = spec.make_inputs(shape, dtype, dev, seed=sum(shape))
                b = torch.randn(shape[1], device=dev).to(dtype) if shape[0] % 2 else None
                ref = wo_reference(x.double(), w_q, s.double(), None if b is None else b.double(), bits=bits)
                base = call(op, "torch", x, w_q, s, b)
                line = []
                for backend in backends:
                    if backend == "compile" and (dtype != dtypes[0] or shape not in shapes[:2]):
                        continue  # a build per shape: two shapes are enough to check it
                    try:
                        y = call(op, backend, x, w_q, s, b)
                        v = judge(y, ref, dtype, base)
                        ok, ratio, detail = v.ok, v.ratio, v.detail
                    except Exception as e:  # noqa: BLE001 - reported, the run goes on
                        ok, ratio, detail = False, float("inf"), f"{type(e).__name__}: {str(e)[:160]}"
                    peer = backend == "torchao"  # scales rounded to x's dtype: reported, not counted
                    failures += not ok and not peer
                    line.append(f"{backend} {ratio:.2f}" + ("" if ok else " FAIL"))
                    write_jsonl(
                        [
                            {
                                "op": op,
                                "bench": "quant_check",
                                "backend": backend,
                                "shape": "x".join(map(str, shape)),
                                "dtype": str(dtype).replace("torch.", ""),
                                "status": "ok" if ok else "rejected",
                                "err_ratio": ratio,
                                "detail": detail,
                                **meta,
                            }
                        ],
                        jsonl,
                    )
                    if not ok:
                        print(f"  FAIL {op} {backend} {shape} {dtype}: {detail}", flush=True)
                print(
                    f"  {str(dtype)[6:]:8s} {'x'.join(map(str, shape)):14s} " + " | ".join(line), flush=True
                )
    return failures


# --------------------------------------------------------------------------- 2-4. bench


def _weight(n, k, dev, dtype):
    """(the generator that then draws x, the bf16 weight, its int8 q and scales) for (n, k):
    the same every time it is made (torchao's compiled pass remakes it)."""
    gen = torch.Generator(device=dev).manual_seed(n + k)
    w = (torch.randn(n, k, generator=gen, device=dev) * k**-0.5).to(dtype)
    return (gen, w, *quantize_weight(w, 8))


def _weint8pack(x, w_q, s):
    return torch._weight_int8pack_mm(x, w_q, s.to(x.dtype))


def bench_stage(args, dev, meta, jsonl, t_start, timeit, copy_gbps):
    print("\n## bench (bf16 x): device ms | weight GB/s | %copy | x bf16 cuBLAS | host us per call",
          flush=True)
    weights = ((256, 512), (512, 256)) if args.dry else WEIGHTS
    ms = (1, 16) if args.dry else ((1, 16, 64) if args.quick else MS)
    dtype, dname = torch.bfloat16, "bf16"
    ao = torchao_unavailable() is None and dev == "cuda"
    summary = {}  # (n, k, m) -> {name: ms}
    broken = set()  # (kind, name) that raised once: an unsupported path, not retried
    sq = []
    failures = 0
    for n, k in weights:
        gen, w, q8, s8 = _weight(n, k, dev, dtype)
        q4, s4 = quantize_weight(w, 4)
        for m in ms:
            if time.perf_counter() - t_start > args.max_seconds:
                print("bench: stopped at --max-seconds", flush=True)
                return failures, summary, sq
            x = torch.randn(m, k, generator=gen, device=dev).to(dtype)
            y_bf16 = F.linear(x, w)
            cases = [("bf16", "cublas", lambda: F.linear(x, w), 2 * n * k)]
            int8 = [b for b in backends_here(OPS["int8"][0], dev) if b != "cuda"]  # cuda = cuda_v4
            int4 = [b for b in backends_here(OPS["int4"][0], dev)]
            for b in int8:
                if (b == "compile" and m not in COMPILE_MS) or (b == "manual" and m != 1) or b == "torchao":
                    continue
                cases.append(("int8", b, lambda b=b: call(OPS["int8"][0], b, x, q8, s8), n * k))
            if ao:
                cases.append(("int8", "torchao", lambda: call(OPS["int8"][0], "torchao", x, q8, s8), n * k))
            if dev == "cuda":
                cases.append(("int8", "aten_int8pack", lambda: _weint8pack(x, q8, s8), n * k))
            for b in int4:
                if b in ("compile", "manual") or (b == "cuda_v1" and m > 16):
                    continue
                cases.append(("int4", b, lambda b=b: call(OPS["int4"][0], b, x, q4, s4), n * k // 2))
            res, refs = {}, {}
            for kind, name, fn, wbytes in cases:
                if (kind, name) in broken:
                    continue
                try:
                    y = fn()
                    if kind == "bf16":
                        status, ratio = "ok", None
                    else:
                        if kind not in refs:  # float64 reference and torch's output, once per kind
                            qw, sc = (q8, s8) if kind == "int8" else (q4, s4)
                            ref = wo_reference(x.double(), qw, sc.double(), bits=8 if kind == "int8" else 4)
                            refs[kind] = (ref, call(OPS[kind][0], "torch", x, qw, sc))
                        v = judge(y, refs[kind][0], dtype, refs[kind][1])
                        status, ratio = ("ok" if v.ok else "rejected"), v.ratio
                        if not v.ok and name not in ("torchao", "torchao_compile", "aten_int8pack"):
                            failures += 1
                    q = timeit(fn)
                except Exception as e:  # noqa: BLE001 - reported, the run goes on
                    print(
                        f"  {m}x{n}x{k} {kind} {name}: {type(e).__name__}: {str(e)[:160]} (not tried again)",
                        flush=True,
                    )
                    broken.add((kind, name))
                    if args.verbose:
                        traceback.print_exc()
                    continue
                op = "matmul" if kind == "bf16" else OPS[kind][0]
                write_jsonl(
                    [row(meta, op, name, m, n, k, dname, q, wbytes, copy_gbps, status, err_ratio=ratio)],
                    jsonl,
                )
                res[f"{kind} {name}"] = (q[0], wbytes, status, q[3])
            summary[(n, k, m)] = res
            base_ms = res.get("bf16 cublas", (float("nan"),))[0]
            print(f"\n  M={m:3d} N={n:5d} K={k:5d}", flush=True)
            for name, (t, wb, status, host) in res.items():
                gbps = wb / t / 1e6
                pct = 100 * gbps / copy_gbps if copy_gbps else float("nan")
                flag = "" if status == "ok" else "  REJECTED"
                print(
                    f"    {name:22s} {t:8.4f} ms {gbps:7.0f} GB/s {pct:5.1f}% {base_ms / t:5.2f}x"
                    f" host {host:6.1f} us{flag}",
                    flush=True,
                )
            if m == (16 if not args.dry else 1):
                y8 = kernellab.int8_weight_only_matmul(x, q8, s8, backend="torch")
                y4 = kernellab.int4_weight_only_matmul(x, q4, s4, backend="torch")
                sq.append((n, k, sqnr(y8, y_bf16), sqnr(y4, y_bf16)))
                write_jsonl(
                    [
                        {
                            "op": "int8_weight_only_matmul",
                            "bench": "quant_sqnr",
                            "shape": f"{m}x{n}x{k}",
                            "sqnr_int8_db": sq[-1][2],
                            "sqnr_int4_db": sq[-1][3],
                            **meta,
                        }
                    ],
                    jsonl,
                )
        del w, q8, q4
        if dev == "cuda":
            torch.cuda.empty_cache()
    if ao:
        _torchao_compiled(weights, ms, dev, dtype, dname, meta, jsonl, timeit, copy_gbps, summary)
    return failures, summary, sq


def _torchao_compiled(weights, ms, dev, dtype, dname, meta, jsonl, timeit, copy_gbps, summary):
    """torchao's weight in a compiled Linear, timed after every other case: in an earlier run
    (2026-11-29 c6) our kernels timed after its first compile ran up to 2x slower than in a
    run without it, cuBLAS unchanged, so the compiled peer goes last."""
    print("\n## torchao in a compiled Linear (after the rest)", flush=True)
    for n, k in weights:
        gen, w, q8, s8 = _weight(n, k, dev, dtype)
        try:
            lin = torch.nn.Linear(k, n, bias=False, device=dev, dtype=dtype)
            lin.weight = torch.nn.Parameter(torchao_int8_weight(q8, s8, dtype), requires_grad=False)
            ao_lin = torch.compile(lin, dynamic=False)
        except Exception as e:  # noqa: BLE001
            print(f"  torchao Linear: {type(e).__name__}: {str(e)[:160]}", flush=True)
            return
        for m in ms:
            x = torch.randn(m, k, generator=gen, device=dev).to(dtype)  # the bench's x for (n, k, m)
            if m not in COMPILE_MS or (n, k, m) not in summary:
                continue
            try:
                y = ao_lin(x)
                ref = wo_reference(x.double(), q8, s8.double(), bits=8)
                v = judge(y, ref, dtype, call(OPS["int8"][0], "torch", x, q8, s8))
                q = timeit(lambda: ao_lin(x))
            except Exception as e:  # noqa: BLE001
                print(f"  {m}x{n}x{k} torchao_compile: {type(e).__name__}: {str(e)[:160]}", flush=True)
                return
            status = "ok" if v.ok else "rejected"
            write_jsonl([row(meta, OPS["int8"][0], "torchao_compile", m, n, k, dname, q, n * k, copy_gbps,
                             status, err_ratio=v.ratio)], jsonl)
            summary[(n, k, m)]["int8 torchao_compile"] = (q[0], n * k, status, q[3])
            base = summary[(n, k, m)].get("bf16 cublas", (float("nan"),))[0]
            print(f"  M={m:3d} N={n:5d} K={k:5d} torchao_compile {q[0]:8.4f} ms {base / q[0]:5.2f}x",
                  flush=True)
        del w, q8, ao_lin


def print_summary(summary, sq, copy_gbps, ao):
    print(
        "\n## summary (bf16 x): best of our kernels (triton, cuda_v*) per kind, then PyTorch's int8 "
        "(torch, compile, aten) and torchao; x = speedup vs bf16 cuBLAS",
        flush=True,
    )
    print(f"copy bandwidth {copy_gbps:.0f} GB/s (read + write)", flush=True)
    print(
        f"{'M':>3s} {'N':>6s} {'K':>6s} | {'bf16 ms':>8s} | {'best int8':>22s} {'x':>5s} {'%copy':>5s} | "
        f"{'pytorch int8':>22s} {'x':>5s} | {'torchao best':>22s} {'x':>5s} | {'best int4':>18s} {'x':>5s}",
        flush=True,
    )
    verdicts = []
    ours = ("triton", "cuda_v1", "cuda_v2", "cuda_v3", "cuda_v4")
    for (n, k, m), res in summary.items():
        base = res.get("bf16 cublas")
        if base is None:
            continue

        def best(prefix, names):
            got = [
                (res[f"{prefix} {b}"][0], b)
                for b in names
                if f"{prefix} {b}" in res and res[f"{prefix} {b}"][2] == "ok"
            ]
            return min(got) if got else (math.nan, "-")

        t8, b8 = best("int8", ours)
        ta, ba = best("int8", ("torchao", "torchao_compile"))
        tp, bp = best("int8", ("torch", "compile", "aten_int8pack"))
        t4, b4 = best("int4", ("triton", "cuda", "cuda_v1", "torch"))
        pct = 100 * n * k / t8 / 1e6 / copy_gbps if copy_gbps and t8 == t8 else math.nan
        print(
            f"{m:3d} {n:6d} {k:6d} | {base[0]:8.4f} | "
            f"{b8 + f' {t8:.4f}':>22s} {base[0] / t8:5.2f} {pct:5.1f} | "
            f"{bp + f' {tp:.4f}':>22s} {base[0] / tp:5.2f} | {ba + f' {ta:.4f}':>22s} {base[0] / ta:5.2f} | "
            f"{b4 + f' {t4:.4f}':>18s} {base[0] / t4:5.2f}",
            flush=True,
        )
        if m in (1, 16) and {n, k} == {4096, 14336}:
            ok = base[0] / t8 >= 1.6 and (not ao or not ta == ta or t8 <= ta)
            verdicts.append(
                f"M={m} {n}x{k}: int8 {base[0] / t8:.2f}x bf16"
                + (f", torchao {base[0] / ta:.2f}x" if ta == ta else "")
                + (" -> target met" if ok else " -> TARGET MISSED")
            )
    for n, k, a, b in sq:
        print(f"SQNR vs bf16 product, {n}x{k}: int8 {a:.1f} dB, int4 {b:.1f} dB", flush=True)
    for v in verdicts:
        print(v, flush=True)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--quick", action="store_true", help="M in 1, 16, 64 only")
    p.add_argument("--dry", action="store_true", help="tiny shapes on the CPU: exercises the script")
    p.add_argument("--max-seconds", type=float, default=180.0)
    p.add_argument("--verbose", action="store_true")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.dry and not torch.cuda.is_available():
        print("no GPU (use --dry to exercise the script on the CPU)")
        return 2
    dev = "cpu" if args.dry else "cuda"
    gpu = "cpu dry run" if args.dry else torch.cuda.get_device_name()
    meta = {"gpu": gpu, **versions(), "git_sha": git_sha(), "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
    ao_why = torchao_unavailable()
    ao_ver = None
    if ao_why is None:
        import torchao

        ao_ver = getattr(torchao, "__version__", "?")
    meta["torchao"] = ao_ver
    print(
        f"{gpu}  torch {meta['torch']}  triton {meta['triton']}  torchao {ao_ver or ao_why}  "
        f"sha {meta['git_sha']}",
        flush=True,
    )
    jsonl = out / "quant.jsonl"
    t_start = time.perf_counter()
    fails = check_stage(args, dev, meta, jsonl, t_start)
    copy_gbps = None
    if dev == "cuda":
        from kernellab import device

        copy_gbps = device._copy_gbps((1 << 30) // 4)
        print(f"\ncopy bandwidth: {copy_gbps:.0f} GB/s", flush=True)
    f2, summary, sq = bench_stage(args, dev, meta, jsonl, t_start, timer(dev), copy_gbps)
    fails += f2
    print_summary(summary, sq, copy_gbps or float("nan"), ao_why is None and dev == "cuda")
    print(f"total {time.perf_counter() - t_start:.0f}s; {fails} failures; rows in {jsonl}", flush=True)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
