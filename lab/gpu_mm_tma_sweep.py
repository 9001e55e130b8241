"""The TMA matmul's tiles and K slices at vendor_gap's matmul shapes, beside cuBLAS.

    python lab/gpu_mm_tma_sweep.py --out DIR [--max-seconds 300] [--jobs 12] [--cases a,b]

Each case is one product as a model makes it: the forward of vendor_gap's matmul cases
(a and b contiguous), the two products of their backward (dA = dy @ b^T with b^T a
transposed view, dB = a^T @ dy with a^T one), and nn.Linear's forward (b = weight.t()).
For every case: cuBLAS (torch.matmul on the same views), the TMA launcher's own choice
(``tma_matmul_fwd`` without a config: the autotuner and ``tma_split``), and every config
of a grid (tiles x stages x warps x K slices), each launch with its split sum, timed with
kernellab's device timer (L2 flushed). Every config's output is compared with cuBLAS's
(max |diff| / max |cuBLAS|, bound 2e-2) before it is timed. The configs compile first in
a pool of processes (Triton's disk cache is shared), so the timing loop only loads them.

Writes DIR/mm_tma_sweep.jsonl (one row per case and config) and DIR/mm_tma_sweep.txt
(per case: cuBLAS, the launcher's choice, the best config and its ratio to cuBLAS).
--cpu-dry-run runs two tiny cases under the interpreter.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import itertools
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

# name: (M, N, K, dtype, a transposed view?, b transposed view?)
CASES = {
    "dec1_14336x4096": (1, 14336, 4096, "bf16", False, False),
    "dec16_4096x14336": (16, 4096, 14336, "bf16", False, False),
    "m64_4096x4096": (64, 4096, 4096, "bf16", False, False),
    "m64_4096x4096_linear": (64, 4096, 4096, "bf16", False, True),
    "m128_14336x4096": (128, 14336, 4096, "bf16", False, False),
    "m128_14336x4096_linear": (128, 14336, 4096, "bf16", False, True),
    "m128_14336x4096_dA": (128, 4096, 14336, "bf16", False, True),
    "m128_14336x4096_dB": (4096, 14336, 128, "bf16", True, False),
    "fp16_1000x3000x5000": (1000, 3000, 5000, "fp16", False, False),
    "big_4096x5120x5120": (4096, 5120, 5120, "bf16", False, False),
    "big_4096x5120x5120_dA": (4096, 5120, 5120, "bf16", False, True),
    "big_4096x5120x5120_dB": (5120, 5120, 4096, "bf16", True, False),
    # GPT-2's products at B*T = 8192 (and 50432 rows for the MLP's 4x width), with their
    # backward's dA = dy @ b^T and dB = a^T @ dy as vendor_gap's fwdbwd rows make them
    "gpt_8192x768x768": (8192, 768, 768, "bf16", False, False),
    "gpt_8192x768x768_dA": (8192, 768, 768, "bf16", False, True),
    "gpt_8192x768x768_dB": (768, 768, 8192, "bf16", True, False),
    "gpt_8192x768x3072": (8192, 768, 3072, "bf16", False, False),
    "gpt_8192x768x3072_dA": (8192, 3072, 768, "bf16", False, True),
    "gpt_8192x768x3072_dB": (3072, 768, 8192, "bf16", True, False),
    "gpt_8192x3072x768": (8192, 3072, 768, "bf16", False, False),
    "gpt_8192x3072x768_dA": (8192, 768, 3072, "bf16", False, True),
    "gpt_8192x3072x768_dB": (768, 3072, 8192, "bf16", True, False),
    "gpt_8192x2304x768": (8192, 2304, 768, "bf16", False, False),
    "gpt_8192x2304x768_dA": (8192, 768, 2304, "bf16", False, True),
    "gpt_8192x2304x768_dB": (768, 2304, 8192, "bf16", True, False),
    "gpt_50432x768x3072": (50432, 768, 3072, "bf16", False, False),
    "gpt_50432x768x3072_dA": (50432, 3072, 768, "bf16", False, True),
    "gpt_50432x768x3072_dB": (3072, 768, 50432, "bf16", True, False),
    "odd_3000x3000x3000": (3000, 3000, 3000, "bf16", False, False),
    "odd_3072x3072x3072": (3072, 3072, 3072, "bf16", False, False),  # 3000's with 128-byte pitches
    # the other families' large products, whose launch the persistent plan also decides
    "llama_8192x28672x4096": (8192, 28672, 4096, "bf16", False, False),
    "llama_8192x28672x4096_dA": (8192, 4096, 28672, "bf16", False, True),
    "llama_8192x28672x4096_dB": (4096, 28672, 8192, "bf16", True, False),
    "llama_8192x6144x4096": (8192, 6144, 4096, "bf16", False, False),
    "llama_8192x4096x14336": (8192, 4096, 14336, "bf16", False, False),
    "llama_8192x4096x14336_dB": (14336, 4096, 8192, "bf16", True, False),
    "mistral_8192x32000x4096": (8192, 32000, 4096, "bf16", False, False),
    "qwen_8192x4608x3584": (8192, 4608, 3584, "bf16", False, False),
    "qwen_8192x3584x18944": (8192, 3584, 18944, "bf16", False, False),
    "heldout_2048x1024x4096": (2048, 1024, 4096, "bf16", False, False),
    "decode_256x4096x4096": (256, 4096, 4096, "bf16", False, False),
    "decode_256x14336x4096": (256, 14336, 4096, "bf16", False, False),
    "decode_256x14336x4096_dB": (4096, 14336, 256, "bf16", True, False),
    "decode_256x4096x4096_linear": (256, 4096, 4096, "bf16", False, True),
    "decode_256x14336x4096_linear": (256, 14336, 4096, "bf16", False, True),
    "gpt_8192x768x768_linear": (8192, 768, 768, "bf16", False, True),
    "small_64x128x3136": (64, 128, 3136, "bf16", False, False),
}
DRY_CASES = {"dry_nn": (24, 32, 48, "fp32", False, False), "dry_tt": (32, 16, 64, "fp32", True, True)}

TILES = [(64, 64, 128), (64, 128, 64), (64, 128, 128), (64, 256, 64), (128, 64, 64), (128, 128, 64),
         (128, 128, 128), (128, 256, 64), (256, 128, 64)]  # fmt: skip
STAGES = (3, 4, 5)
STAGES_SHORT_K = (1, 2, 3)  # K of one to four blocks: fewer stages, more programs per SM
WARPS = (4, 8)
SPLITS = (1, 2, 3, 4, 6, 8, 12, 16)  # split is a runtime argument: no extra compiles
SMEM = 227 * 1024


def _dtype(name):
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


def make_case(spec, device):
    import torch

    m, n, k, dt, a_t, b_t = spec
    g = torch.Generator(device=device).manual_seed(0)
    dtype = _dtype(dt)
    a = torch.randn((k, m) if a_t else (m, k), generator=g, device=device).to(dtype)
    b = torch.randn((n, k) if b_t else (k, n), generator=g, device=device).to(dtype)
    return (a.t() if a_t else a), (b.t() if b_t else b)


def configs_for(spec, n_sm, dry=False):
    """(config dict) for every tile/stage/warp/split that fits shared memory and the shape."""
    if dry:
        return [dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=2, num_stages=1, num_warps=4, split=s)
                for s in (1, 2)]  # fmt: skip
    m, n, k, dt, _, _ = spec
    elem = 2
    out = []
    stages = STAGES_SHORT_K if k <= 256 else STAGES
    for (bm, bn, bk), st, w in itertools.product(TILES, stages, WARPS):
        if (bm * bk + bk * bn) * elem * st + bm * bn * elem > SMEM:  # pipeline + the C tile
            continue
        if bm > max(64, 2 * m) or bn > max(64, 2 * n) or bk > max(64, k):
            continue
        if bm == 256 and w == 4:
            continue
        tiles = -(-m // bm) * -(-n // bn)
        kb = -(-k // bk)
        for s in SPLITS:
            if s > 1 and (tiles >= 2 * n_sm or kb // s < 2 or s * m * n * 4 > (256 << 20)):
                continue
            if s > 1 and (bm * bk + bk * bn) * elem * st + bm * bn * 4 > SMEM:  # fp32 partials
                continue
            cfg = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, num_stages=st, num_warps=w)
            out.append(dict(cfg, split=s))
            if s == 1 and tiles > n_sm:  # more tiles than SMs: the persistent kernel too
                out.append(dict(cfg, split=1, persistent=True))
    return out


def _compile_worker(job):
    """Run one (case, config) once: compiles into the shared disk cache."""
    name, spec, cfgs = job
    import torch

    from kernellab.ops.matmul.triton_tma import tma_matmul_fwd

    a, b = make_case(spec, "cuda")
    bad = []
    for cfg in cfgs:
        try:
            tma_matmul_fwd(a, b, config=cfg)
            torch.cuda.synchronize()
        except Exception as e:  # the timing loop skips it (an illegal address would end the run)
            bad.append((json.dumps(cfg, sort_keys=True), f"{type(e).__name__}: {str(e)[:200]}"))
    return name, len(cfgs), bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-seconds", type=float, default=300)
    ap.add_argument("--jobs", type=int, default=12)
    ap.add_argument("--cases", default=None)
    ap.add_argument("--cpu-dry-run", action="store_true")
    ap.add_argument("--auto-only", action="store_true", help="cuBLAS, the launcher's choice and cuda only")
    ap.add_argument("--label", default="mm_tma_sweep", help="output file stem")
    args = ap.parse_args()
    t0 = time.time()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import torch

    from kernellab.harness import timer
    from kernellab.ops.matmul.triton_tma import tma_matmul_fwd, tma_split

    dry = args.cpu_dry_run
    cases = DRY_CASES if dry else CASES
    if args.cases:
        cases = {k: v for k, v in cases.items() if k in args.cases.split(",")}
    device = "cpu" if dry else "cuda"
    n_sm = 4 if dry else torch.cuda.get_device_properties(0).multi_processor_count
    gpu = "cpu" if dry else torch.cuda.get_device_name(0)
    sha = os.environ.get("KERNELLAB_GIT_SHA", "")
    plan = {name: [] if args.auto_only else configs_for(spec, n_sm, dry) for name, spec in cases.items()}
    print(f"{sum(map(len, plan.values()))} configs over {len(plan)} cases", flush=True)
    failed = {}  # (case, config json) -> what the compile worker's launch raised
    if not dry:
        jobs = []
        for name, cfgs in plan.items():
            for i in range(0, len(cfgs), 8):
                jobs.append((name, cases[name], cfgs[i : i + 8]))
        ctx = torch.multiprocessing.get_context("spawn")
        with cf.ProcessPoolExecutor(args.jobs, mp_context=ctx) as pool:
            for name, _, bad in pool.map(_compile_worker, jobs):
                failed.update({(name, c): why for c, why in bad})
        print(f"compiled in {time.time() - t0:.0f} s ({len(failed)} launches raised)", flush=True)

    def timed(fn):
        if dry:
            fn()
            return float("nan")
        return timer.time_cuda(fn, warmup_s=0.02, min_reps=10, min_time_s=0.05, budget_s=0.3).median_ms

    lines = []
    rows_f = open(out / f"{args.label}.jsonl", "w")
    for name, spec in cases.items():
        if time.time() - t0 > args.max_seconds:
            lines.append(f"{name}: skipped (time)")
            continue
        m, n, k, dt, a_t, b_t = spec
        a, b = make_case(spec, device)
        ref = torch.matmul(a, b) if not dry else (a.double() @ b.double()).to(a.dtype)
        scale = ref.float().abs().max().item() or 1.0
        base = dict(case=name, m=m, n=n, k=k, dtype=dt, a_t=a_t, b_t=b_t, gpu=gpu, git_sha=sha)
        t_cublas = timed(lambda: torch.matmul(a, b)) if not dry else float("nan")
        auto_split = tma_split(m, n, k, 1, n_sm)
        import kernellab.ops.matmul.triton_tma as tt

        auto_plan = None
        if not dry and hasattr(tt, "_persistent_plan"):
            p = tt._persistent_plan(
                m, n, k, 1, 0, all(d * 2 % 128 == 0 for d in (m if a_t else k, k if b_t else n, n))
            )
            if p is not None:
                auto_plan = [p.config["BLOCK_N"], p.dp_tiles, p.tail_split, round(p.est_s * 1e3, 4)]
        t_auto = timed(lambda: tma_matmul_fwd(a, b))
        t_cuda = float("nan")
        if not dry:  # the cuda backend's forward on the same views (packing included)
            try:
                from kernellab.core import registry

                t_cuda = timed(lambda: registry.call("matmul", "cuda", a, b))
            except Exception as e:  # noqa: BLE001
                print(f"{name}: cuda backend: {type(e).__name__}: {e}", flush=True)
        results = []
        for cfg in plan[name]:
            row = dict(base, **cfg)
            why = failed.get((name, json.dumps(cfg, sort_keys=True)))
            if why:
                row["error"] = why
                rows_f.write(json.dumps(row) + "\n")
                continue
            try:
                y = tma_matmul_fwd(a, b, config=cfg)
                err = (y.float() - ref.float()).abs().max().item() / scale
                row["rel_err"] = err
                if not err <= 2e-2:
                    row["error"] = "mismatch"
                else:
                    row["ms"] = timed(lambda cfg=cfg: tma_matmul_fwd(a, b, config=cfg))
                    results.append((row["ms"], cfg))
            except Exception as e:  # noqa: BLE001 (a config that cannot launch is a row too)
                row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
            rows_f.write(json.dumps(row) + "\n")
        rows_f.write(json.dumps(dict(base, backend="torch", ms=t_cublas)) + "\n")
        auto = dict(base, backend="tma_auto", ms=t_auto, auto_split=auto_split, auto_plan=auto_plan)
        rows_f.write(json.dumps(auto) + "\n")
        rows_f.write(json.dumps(dict(base, backend="cuda", ms=t_cuda)) + "\n")
        rows_f.flush()
        fails = sum(1 for _ in plan[name]) - len(results)
        best = min(results, key=lambda r: r[0]) if results else (float("nan"), None)
        ones = [r for r in results if r[1]["split"] == 1 and not r[1].get("persistent")]
        pers = [r for r in results if r[1].get("persistent")]
        bestp = min(pers, key=lambda r: r[0]) if pers else (float("nan"), None)
        best1 = min(ones, key=lambda r: r[0]) if ones else (float("nan"), None)
        lines.append(
            f"{name:26s} cublas {t_cublas:.4f}  auto(split {auto_split}, plan {auto_plan}) {t_auto:.4f} "
            f"x{t_cublas / t_auto:.3f}  cuda x{t_cublas / t_cuda:.3f}  "
            f"best {best[0]:.4f} x{t_cublas / best[0]:.3f} {best[1]}  best split1 x{t_cublas / best1[0]:.3f} "
            f"{best1[1]}  best persistent x{t_cublas / bestp[0]:.3f} {bestp[1]}  (failed {fails})"
        )
        print(lines[-1], flush=True)
    rows_f.close()
    (out / f"{args.label}.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
