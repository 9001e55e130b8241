"""The pointer matmul kernel's tiles at the small family, where cuBLAS leads by 1.4-1.6x.

    python lab/gpu_mm_small.py --out DIR [--cpu-dry-run] [--dtype fp32]

H200 table (device time): 256x10x128 bf16 forward 9.8 us in triton against cuBLAS 6.4
(N = 10: rows of 20 bytes, no TMA), 64x128x3136 13.7 (triton_tma, 8 K slices) against 10.0.
Below TUNE_MIN_WORK the pointer kernel runs ``fixed_config``'s 128x128x64 tiles with 8
warps and 3 stages: two programs at 256x10x128. Per product (each forward and the two
products of its backward, as autograd makes them from the same views), device time
(kernellab's timer, L2 flushed) of cuBLAS, the triton launcher, and ``_matmul_kernel``
over tiles x warps x stages, each output checked against cuBLAS's (2e-2 of its largest
value). Rows go to DIR/mm_small.jsonl, the best per product to DIR/mm_small.txt.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402

from kernellab import triton_support  # noqa: E402
from kernellab.ops.matmul import triton as tm  # noqa: E402
from kernellab.ops.matmul import triton_tma as tt  # noqa: E402

# name: (M, N, K, a transposed view?, b transposed view?)
CASES = {
    "fc2_256x10x128": (256, 10, 128, False, False),
    "fc2_dA_256x128x10": (256, 128, 10, False, True),
    "fc2_dB_128x10x256": (128, 10, 256, True, False),
    "fc1_64x128x3136": (64, 128, 3136, False, False),
    "fc1_bt_64x128x3136": (64, 128, 3136, False, True),
    "fc1_dA_64x3136x128": (64, 3136, 128, False, True),
    "fc1_dB_3136x128x64": (3136, 128, 64, True, False),
    # other products below TUNE_MIN_WORK (the fixed config's domain), to check a rule on
    "mid_512x512x512": (512, 512, 512, False, False),
    "mid_512x768x768_linear": (512, 768, 768, False, True),
    "mid_256x1024x1024": (256, 1024, 1024, False, False),
    "mid_1024x1024x512": (1024, 1024, 512, False, False),
    "mid_2048x256x1024_dB": (2048, 256, 1024, True, False),
}
TILES = [(16, 16, 64), (16, 32, 64), (16, 64, 64), (32, 16, 64), (32, 32, 64), (64, 16, 64), (64, 32, 32),
         (64, 64, 64), (32, 64, 128), (64, 64, 128), (64, 128, 64), (128, 64, 64), (128, 128, 64)]
# fp32 FMA dots: K steps of at most 32 (prune_configs' rule), tiles from 16x16
FP32_TILES = [(16, 16, 32), (32, 16, 32), (16, 32, 32), (32, 32, 32), (64, 16, 32), (16, 64, 32),
              (64, 32, 32), (32, 64, 32), (64, 64, 32), (32, 32, 16), (64, 64, 16)]  # fmt: skip
WARPS = (4, 8)
STAGES = (1, 2, 3)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--cpu-dry-run", action="store_true")
    ap.add_argument("--cases", default=None, help="comma-separated names (default: all)")
    ap.add_argument("--budget", type=float, default=0.3, help="timing budget per config, s")
    ap.add_argument("--no-grid", action="store_true", help="cuBLAS and the launchers only (and --skinny)")
    ap.add_argument("--dtype", default="bf16", help="bf16 or fp32 (TF32 off: FMA dots, tiles up to 32 deep)")
    ap.add_argument("--skinny", action="store_true",
                    help="also the skinny kernel (M <= 128) over its tiles and K slices")  # fmt: skip
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dry = args.cpu_dry_run
    dev = "cpu" if dry else "cuda"
    fp32 = args.dtype == "fp32"
    dtype = torch.float32 if dry or fp32 else torch.bfloat16
    torch.backends.cuda.matmul.allow_tf32 = False
    from kernellab.harness import timer

    def timed(fn):
        if dry:
            fn()
            return float("nan")
        t = timer.time_cuda(fn, warmup_s=0.02, min_reps=10, min_time_s=0.05, budget_s=args.budget)
        return t.median_ms * 1e3

    sha = os.environ.get("KERNELLAB_GIT_SHA", "")
    rows = open(out / "mm_small.jsonl", "w")
    lines = []
    grid_cfgs = (
        [(16, 16, 16, 4, 1)]
        if dry
        else [t + (w, s) for t, w, s in itertools.product(FP32_TILES, (2, 4), (2,))]
        if fp32
        else [t + (w, s) for t, w, s in itertools.product(TILES, WARPS, STAGES)]
    )
    if args.no_grid:
        grid_cfgs = []
    cases = (
        {k: v for k, v in CASES.items() if k.startswith("fc2")} if dry else CASES
    )  # the interpreter is slow
    if args.cases:
        cases = {k: v for k, v in cases.items() if k in args.cases.split(",")}
    for name, (m, n, k, a_t, b_t) in cases.items():
        g = torch.Generator(device=dev).manual_seed(0)
        a = torch.randn((k, m) if a_t else (m, k), generator=g, device=dev).to(dtype)
        b = torch.randn((n, k) if b_t else (k, n), generator=g, device=dev).to(dtype)
        a, b = (a.t() if a_t else a), (b.t() if b_t else b)
        ref = (a.double() @ b.double()).float()
        scale = ref.abs().max().item() or 1.0
        base = dict(case=name, m=m, n=n, k=k, a_t=a_t, b_t=b_t, git_sha=sha)
        res = {}
        paths = [("cublas", lambda: torch.matmul(a, b)), ("triton", lambda: tm.triton_matmul_fwd(a, b))]
        # the TMA launcher's choice, and its config before SMALL_TMA (128x128x64, 8 warps); 16-bit only
        if not dry and not fp32:
            n_sm = torch.cuda.get_device_properties(0).multi_processor_count
            old = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_stages=3, num_warps=8,
                       split=tt.tma_split(m, n, k, 1, n_sm))  # fmt: skip
            paths += [("triton_tma", lambda: tt.tma_matmul_fwd(a, b)),
                      ("tma_128x128", lambda old=old: tt.tma_matmul_fwd(a, b, config=old))]  # fmt: skip
        for path, fn in paths:
            res[path] = timed(fn)
            rows.write(json.dumps(dict(base, path=path, us=res[path])) + "\n")
        if args.skinny and m <= tm.SKINNY_M_MAX:
            sk_best = (float("inf"), None)
            for cfg in itertools.product((32, 64, 128), (64, 128, 256), (1, 2, 4, 7, 8, 14), (4,), (3, 4)):
                row = dict(base, path="skinny", config=list(cfg))
                try:
                    y = tm.triton_skinny_fwd(a, b, config=cfg)
                    row["rel_err"] = (y.float() - ref).abs().max().item() / scale
                    if row["rel_err"] <= 2e-2:
                        row["us"] = timed(lambda cfg=cfg: tm.triton_skinny_fwd(a, b, config=cfg))
                        sk_best = min(sk_best, (row["us"], cfg))
                    else:
                        row["error"] = "mismatch"
                except Exception as e:  # noqa: BLE001
                    row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                rows.write(json.dumps(row) + "\n")
            print(f"{name}: skinny best {sk_best[0]:.1f} us {sk_best[1]}", flush=True)
        best = (float("inf"), None)
        for bm, bn, bk, w, st in grid_cfgs:
            c = torch.empty(m, n, dtype=dtype, device=dev)
            kw = dict(HAS_BIAS=False, ACT=0, PRECISION=tm._precision(dtype, dev), UPCAST=dry, BLOCK_M=bm,
                      BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, num_warps=w, num_stages=st)  # fmt: skip
            grid = (triton_support.cdiv(m, bm) * triton_support.cdiv(n, bn), 1)

            def run(c=c, kw=kw, grid=grid):
                tm._matmul_kernel[grid](a, b, c, c, m, n, k, 0, a.stride(0), a.stride(1), 0, b.stride(0),
                                        b.stride(1), 0, n, 1, 1, 1, 1, **kw)  # fmt: skip
                return c

            row = dict(base, path="grid", config=[bm, bn, bk, w, st])
            try:
                err = (run().float() - ref).abs().max().item() / scale
                row["rel_err"] = err
                if err <= 2e-2:
                    row["us"] = timed(run)
                    best = min(best, (row["us"], row["config"]))
                else:
                    row["error"] = "mismatch"
            except Exception as e:  # noqa: BLE001 (a config that cannot launch is a row too)
                row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
            rows.write(json.dumps(row) + "\n")
        rows.flush()
        cub = res["cublas"]
        tri = res["triton"]
        lines.append(f"{name:22s} cublas {cub:.1f} us  triton {tri:.1f} x{cub / tri:.3f}  "
                     f"best {best[0]:.1f} x{cub / best[0]:.3f} {best[1]}")  # fmt: skip
        print(lines[-1], flush=True)
    (out / "mm_small.txt").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
