"""cuda_v14 (v13 reading either major order, 128x192 tiles) against cuBLAS, triton_tma and
cuda_v13 at the products a model's linear layers make, forward and both backward products.

    PYTHONPATH=src python lab/gpu_mm_v14.py --out $OUT [--max-seconds 400] [--cpu-dry-run] [--v15]

1. smoke: every width x A's order x B's order on small edge shapes, judged against float64
   (a fault or a deadlock shows on a cheap case first; gpu_mm_v11's helpers stop the run);
2. per linear layer y = x W^T (M tokens, N outputs, K inputs) its three products, named by
   the layer's mode: fwd x [M, K] @ W^T (B stored [N, K]), dA dy [M, N] @ W (row-major), dB
   dy^T @ x (A stored [M, N] read as [N, M]); plus row-major products (3000^3, fp16
   1000x3000x5000). Device time (CUDA events, L2 flushed, median) of torch.matmul, triton_tma,
   cuda_v13 (packs transposed operands), cuda_v14 with the launcher's width and with each
   width forced. Rows to DIR/mm_v14.jsonl; the table last. --v15: the smoke of cuda_v15's
   widths instead, and torch, triton_tma, cuda_v14, cuda_v15 and v15 at each width forced
   (DIR/mm_v15.jsonl).
"""

from __future__ import annotations

import argparse
import sys
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from gpu_mm_v11 import T0, Fatal, Rows, fatal_if_sticky, log, sync_or_die  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
LAYERS = [  # (M, N, K): y [M, N] = x [M, K] W^T
    (8192, 768, 768),
    (8192, 2304, 768),
    (8192, 3072, 768),
    (8192, 768, 3072),
    (8192, 4096, 4096),
    (8192, 6144, 4096),
    (8192, 14336, 4096),
    (8192, 4096, 14336),
    (8192, 4608, 3584),
    (256, 14336, 4096),
    (256, 4096, 4096),
]
PLAIN = [((3000, 3000, 3000), "bf16"), ((4096, 4096, 4096), "bf16"), ((1000, 3000, 5000), "fp16"),
         ((8192, 8192, 8192), "bf16")]  # fmt: skip
SMOKE = [(129, 200, 72), (1, 8, 8), (2, 5, 600, 72), (1000, 1023, 997), (2048, 3000, 256)]
WIDTHS = (256, 192, 128)
V15_WIDTHS = (256, 192)


def products(plain_only: bool = False, plain=None):
    """(case, mode, m, n, k, a_t, b_t, dtype) of every timed product (the row-major products
    are mode "fwd" with layout nn, as the ladder's rows are; nt / tn: one operand stored
    transposed)."""
    out = []
    for m, n, k in [] if plain_only else LAYERS:
        case = f"{m}x{n}x{k}"
        out += [(case, "fwd", m, n, k, False, True, "bf16"), (case, "dA", m, k, n, False, False, "bf16"),
                (case, "dB", n, k, m, True, False, "bf16")]  # fmt: skip
    for (m, n, k), d in PLAIN if plain is None else [(tuple(map(int, p.split("x"))), "bf16") for p in plain]:
        case = f"{m}x{n}x{k}"
        out += [(case, "fwd", m, n, k, False, False, d)]
        if d == "bf16" and m == 3000:
            out += [(case, "nt", m, n, k, False, True, d), (case, "tn", m, n, k, True, False, d)]
    return out


def operands(m, n, k, a_t, b_t, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn((k, m) if a_t else (m, k), generator=g, device="cuda").to(dtype)
    b = torch.randn((n, k) if b_t else (k, n), generator=g, device="cuda").to(dtype)
    return (a.t() if a_t else a), (b.t() if b_t else b)


def _launcher(variant: str, block_n=None):
    """a @ b by cuda.py's launcher of ``variant`` ("v14" or "v15"), its width forced or not."""
    from kernellab.ops.matmul import cuda as mc

    launch = mc._LAUNCHERS[variant]

    def run(a, b):
        a3, b3 = a.reshape(-1, *a.shape[-2:]), b.reshape(-1, *b.shape[-2:])
        c = launch(a3, b3, torch.cuda.current_device(), block_n=block_n)
        return c.reshape(*a.shape[:-1], b.shape[-1])

    return run


def v14(block_n=None):
    return _launcher("v14", block_n)


def v15(block_n=None):
    return _launcher("v15", block_n)


def backends(with_v15: bool = False):
    import kernellab

    reg = {name: kernellab.registry.get("matmul", name) for name in ("triton_tma", "cuda_v13")}
    out = {"torch": torch.matmul, "triton_tma": lambda a, b: reg["triton_tma"].fn(a, b)}
    if with_v15:  # v15 beside v14, each of its widths forced
        out.update({"cuda_v14": v14(), "cuda_v15": v15()})
        out.update({f"v15_n{bn}": v15(bn) for bn in V15_WIDTHS})
        return out
    out.update({"cuda_v13": lambda a, b: reg["cuda_v13"].fn(a, b), "cuda_v14": v14()})
    out.update({f"v14_n{bn}": v14(bn) for bn in WIDTHS})
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--max-seconds", type=float, default=400.0)
    p.add_argument("--hang-seconds", type=float, default=30.0)
    p.add_argument("--cpu-dry-run", action="store_true")
    p.add_argument("--plain-only", action="store_true", help="only the row-major products, no smoke")
    p.add_argument("--plain", nargs="+", default=None, metavar="MxNxK", help="--plain-only's bf16 products")
    p.add_argument("--v15", action="store_true", help="smoke and time cuda_v15 (clusters) beside v14")
    p.add_argument(
        "--l2",
        type=int,
        choices=(0, 64, 128, 256),
        default=None,
        help="the tensor maps' L2 promotion in bytes (0: none; default: the runtime's 128)",
    )
    args = p.parse_args()
    name = "mm_v15" if args.v15 else "mm_v14"
    out = Path(args.out) / (f"{name}.jsonl" if args.l2 is None else f"{name}-l2_{args.l2}.jsonl")
    if args.cpu_dry_run:
        rows = Rows(out, {"gpu": None, "dry_run": True})
        for c in products(args.plain_only, args.plain):
            case, mode, m, n, k, a_t, b_t, d = c
            rows.add(kind="plan", case=case, mode=mode, m=m, n=n, k=k, a_t=a_t, b_t=b_t, dtype=d)
        n_products = len(products(args.plain_only, args.plain))
        log(f"dry run: {n_products} products, smoke {len(SMOKE)} shapes x 3 widths x 4 orders; {out}")
        return 0
    import kernellab.ops.matmul  # noqa: F401
    from kernellab.harness.bench import git_sha, versions
    from kernellab.harness.compare import judge
    from kernellab.harness.timer import time_cuda

    if args.l2 is not None:  # CU_TENSOR_MAP_L2_PROMOTION_{NONE, L2_64B, L2_128B, L2_256B}
        from kernellab.cuda import runtime

        runtime._TMAP_L2_128B = {0: 0, 64: 1, 128: 2, 256: 3}[args.l2]
        runtime.tensor_map.cache_clear()
    gpu = torch.cuda.get_device_name()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    rows = Rows(out, {"gpu": gpu, **versions(), "git_sha": git_sha(), "time": stamp, "l2_promotion": args.l2})
    log(f"{gpu} torch {torch.__version__} sha {rows.meta['git_sha']}")
    ok, table = True, {}
    if args.v15:  # (0 would send every v15 call to v14)
        from kernellab.ops.matmul import cuda as mc

        for bn in V15_WIDTHS:
            n = mc._v15_clusters(f"matmul_v15_n{bn}_mk_kn_bf16", mc.DYN_SHARED[f"v15_n{bn}"], 0)
            log(f"v15 n{bn}: {n} two-block clusters at once")
            rows.add(kind="clusters", block_n=bn, clusters=n)
    try:
        for shape in [] if args.plain_only else SMOKE:
            *batch, m, n, k = shape
            for bn in V15_WIDTHS if args.v15 else WIDTHS:
                for a_t in (False, True):
                    for b_t in (False, True):
                        what = f"smoke {shape} n{bn} a_t={a_t} b_t={b_t}"
                        try:
                            a, b = operands(m, n, k, a_t, b_t, torch.bfloat16, 5)
                            if batch:
                                a, b = a.expand(*batch, m, k), b.expand(*batch, k, n)
                            y = (v15 if args.v15 else v14)(bn)(a, b)
                            sync_or_die(rows, what, args.hang_seconds)
                            ref = torch.matmul(a.double(), b.double())
                            v = judge(y, ref, torch.bfloat16, torch.matmul(a, b))
                            ok &= bool(v.ok)
                            rows.add(kind="smoke", shape=str(shape), block_n=bn, a_t=a_t, b_t=b_t,
                                     ok=bool(v.ok), detail=v.detail)  # fmt: skip
                            if not v.ok:
                                log(f"{what}: FAIL {v.detail}")
                        except Exception as e:  # noqa: BLE001
                            ok = False
                            log(f"{what}: ERROR {e}")
                            rows.add(kind="error", shape=str(shape), block_n=bn, status=repr(e))
                            fatal_if_sticky(e)
        log(f"smoke: {'all PASS' if ok else 'FAILURES'}")
        fns = backends(args.v15)
        for case, mode, m, n, k, a_t, b_t, d in products(args.plain_only, args.plain):
            if time.perf_counter() - T0 > args.max_seconds:
                log("max-seconds reached")
                break
            a, b = operands(m, n, k, a_t, b_t, DTYPES[d], zlib.crc32(f"{case}{mode}".encode()))
            for name, fn in fns.items():
                try:
                    fn(a, b)
                    sync_or_die(rows, f"{name} {case} {mode}", args.hang_seconds)
                    t = time_cuda(lambda fn=fn: fn(a, b))
                    tf = 2 * m * n * k / (t.median_ms * 1e-3) / 1e12
                    table[(case, mode, d, name)] = t.median_ms
                    rows.add(kind="time", case=case, shape=case, mode=mode, m=m, n=n, k=k, a_t=a_t, b_t=b_t,
                             dtype=d, backend=name, tflops=tf, status="ok", **t.as_dict())  # fmt: skip
                except Fatal:
                    raise
                except Exception as e:  # noqa: BLE001
                    log(f"{name} {case} {mode}: ERROR {e}")
                    rows.add(kind="error", case=case, mode=mode, backend=name, status=repr(e))
                    fatal_if_sticky(e)
            row = {nm: table.get((case, mode, d, nm)) for nm in fns}
            ref = row["torch"]
            log(f"{case:>16} {mode:3} {d}: " + "  ".join(
                f"{nm} {ms * 1e3:7.1f}us ({ref / ms:.3f})" for nm, ms in row.items() if ms))  # fmt: skip
            torch.cuda.empty_cache()
    except Fatal as e:
        ok = False
        log(f"STOPPED: {e}")
        rows.add(kind="stop", status=str(e))
    log(f"rows in {out}; smoke {'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
