"""Does Triton's warp specialization lift the TMA matmul where it trails cuBLAS?

    python lab/gpu_mm_ws.py --out DIR [--max-seconds 360] [--jobs 12] [--cases a,b] [--cpu-dry-run]

The H200 rows below 0.9x cuBLAS that the TMA kernel's tiles and K slices could not lift
(``mm_tma_sweep-H200-57de6b6-m256-small``): 256x14336x4096 with nn.Linear's weight 0.84x,
8192x768x768 0.86x, 256x4096x4096 0.90x, GPT-2's products 0.90x. The kernels there issue
their TMA loads and wgmma from the same warps. Triton 3.6 splits a loop marked
``tl.range(..., warp_specialize=True)`` into a producer warp and consumer warps on sm_90
(it lifted the non-causal attention forward by 11%, NOTES "Issue 19 forward probe").

Two kernels, each compiled with the mark on and off (the same code otherwise):
``tile``, one program per output tile with the mark on its K loop, and ``persistent``, one
program per SM walking the tiles with the mark on its tile loop (as Triton's persistent
matmul tutorial does). Per case, over tiles x stages x warps, device time (kernellab's
timer, L2 flushed) beside cuBLAS and the TMA launcher's own choice; every output checked
against cuBLAS's (2e-2 of its largest value) before it is timed. Configs compile first in
a pool of processes. Rows go to DIR/mm_ws.jsonl, the best of each (kernel, mark) per case
to DIR/mm_ws.txt.
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
sys.path.insert(0, str(Path(__file__).resolve().parent))

import triton.language as tl  # noqa: E402
from gpu_mm_tma_sweep import CASES as SWEEP_CASES  # noqa: E402
from gpu_mm_tma_sweep import make_case  # noqa: E402

from kernellab import triton_support  # noqa: E402
from kernellab.ops.matmul.triton import grouped_tile  # noqa: E402
from kernellab.ops.matmul.triton_tma import _ab_descs, _tile_ab  # noqa: E402

CASES = {k: SWEEP_CASES[k] for k in (
    "decode_256x14336x4096_linear", "decode_256x14336x4096", "decode_256x4096x4096",
    "decode_256x4096x4096_linear",
    "gpt_8192x768x768", "gpt_8192x768x768_linear", "gpt_8192x768x768_dA", "gpt_8192x768x768_dB",
    "gpt_8192x768x3072", "gpt_8192x3072x768", "gpt_8192x2304x768", "odd_3000x3000x3000",
    "odd_3072x3072x3072",
    "fp16_1000x3000x5000", "big_4096x5120x5120", "llama_8192x6144x4096",
) if k in SWEEP_CASES}  # fmt: skip
DRY_CASES = {"dry_nn": (24, 32, 48, "fp32", False, False), "dry_nt": (32, 16, 64, "fp32", False, True)}
TILES = [(64, 128, 128), (64, 256, 64), (128, 64, 64), (128, 128, 64), (128, 128, 128), (128, 256, 64),
         (256, 128, 64)]  # fmt: skip
STAGES = (3, 4, 5)
WARPS = (4, 8)
SMEM = 227 * 1024


@triton_support.jit
def _ws_tile_kernel(a_ptr, b_ptr, c_ptr, M, N, K, A_T: tl.constexpr, B_T: tl.constexpr,
                    WS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    GROUP_M: tl.constexpr):  # fmt: skip
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    a_desc, b_desc = _ab_descs(a_ptr, b_ptr, M, N, K, A_T, B_T, BLOCK_M, BLOCK_N, BLOCK_K)
    c_desc = tl.make_tensor_descriptor(c_ptr, [M, N], [N, 1], [BLOCK_M, BLOCK_N])
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in tl.range(0, tl.cdiv(K, BLOCK_K), warp_specialize=WS):
        a, b = _tile_ab(a_desc, b_desc, off_m, off_n, kb * BLOCK_K, A_T, B_T)
        acc = tl.dot(a, b, acc)
    c_desc.store([off_m, off_n], acc.to(c_ptr.dtype.element_ty))


@triton_support.jit
def _ws_persistent_kernel(a_ptr, b_ptr, c_ptr, M, N, K, A_T: tl.constexpr, B_T: tl.constexpr,
                          WS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):  # fmt: skip
    a_desc, b_desc = _ab_descs(a_ptr, b_ptr, M, N, K, A_T, B_T, BLOCK_M, BLOCK_N, BLOCK_K)
    c_desc = tl.make_tensor_descriptor(c_ptr, [M, N], [N, 1], [BLOCK_M, BLOCK_N])
    tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    k_blocks = tl.cdiv(K, BLOCK_K)
    for tile in tl.range(tl.program_id(0), tiles, tl.num_programs(0), flatten=True, warp_specialize=WS):
        pid_m, pid_n = grouped_tile(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kb in range(k_blocks):
            a, b = _tile_ab(a_desc, b_desc, off_m, off_n, kb * BLOCK_K, A_T, B_T)
            acc = tl.dot(a, b, acc)
        c_desc.store([off_m, off_n], acc.to(c_ptr.dtype.element_ty))


def run(a, b, cfg, n_sm):
    """Launch cfg's kernel on a @ b (a, b as make_case gives them); returns c."""
    import torch

    from kernellab.triton_support import install_tma_allocator

    install_tma_allocator()
    a_t, b_t = a.stride(0) == 1 and a.stride(1) != 1, b.stride(0) == 1 and b.stride(1) != 1
    a3, b3 = (a.t() if a_t else a), (b.t() if b_t else b)
    m, k = a.shape
    n = b.shape[1]
    c = torch.empty((m, n), dtype=a.dtype, device=a.device)
    bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
    tiles = -(-m // bm) * -(-n // bn)
    kw = dict(A_T=a_t, B_T=b_t, WS=cfg["ws"], BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=cfg["BLOCK_K"], GROUP_M=8,
              num_stages=cfg["num_stages"], num_warps=cfg["num_warps"])  # fmt: skip
    if cfg["kernel"] == "persistent":
        _ws_persistent_kernel[(min(tiles, n_sm),)](a3, b3, c, m, n, k, **kw)
    else:
        _ws_tile_kernel[(tiles,)](a3, b3, c, m, n, k, **kw)
    return c


def configs_for(spec, n_sm, dry=False):
    if dry:
        return [dict(kernel=kn, ws=False, BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, num_stages=1, num_warps=4)
                for kn in ("tile", "persistent")]  # fmt: skip
    m, n, k, dt, _, _ = spec
    out = []
    grid = itertools.product(TILES, STAGES, WARPS, (True, False), ("tile", "persistent"))
    for (bm, bn, bk), st, w, ws, kn in grid:
        if (bm * bk + bk * bn) * 2 * st + bm * bn * 2 > SMEM:
            continue
        if bm > max(64, 2 * m) or bn > max(64, 2 * n):
            continue
        if bm == 256 and w == 4:
            continue
        if kn == "persistent" and -(-m // bm) * -(-n // bn) <= n_sm:
            continue
        out.append(dict(kernel=kn, ws=ws, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_stages=st, num_warps=w))
    return out


def _compile_worker(job):
    name, spec, cfgs = job
    import torch

    a, b = make_case(spec, "cuda")
    n_sm = torch.cuda.get_device_properties(0).multi_processor_count
    bad = []
    for cfg in cfgs:
        try:
            run(a, b, cfg, n_sm)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 (the timing loop skips it)
            bad.append((json.dumps(cfg, sort_keys=True), f"{type(e).__name__}: {str(e)[:300]}"))
    return name, bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-seconds", type=float, default=360)
    ap.add_argument("--jobs", type=int, default=12)
    ap.add_argument("--cases", default=None)
    ap.add_argument("--cpu-dry-run", action="store_true")
    args = ap.parse_args()
    t0 = time.time()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import torch

    from kernellab.harness import timer
    from kernellab.ops.matmul.triton_tma import tma_matmul_fwd

    dry = args.cpu_dry_run
    cases = DRY_CASES if dry else CASES
    if args.cases:
        cases = {k: v for k, v in cases.items() if k in args.cases.split(",")}
    device = "cpu" if dry else "cuda"
    n_sm = 4 if dry else torch.cuda.get_device_properties(0).multi_processor_count
    gpu = "cpu" if dry else torch.cuda.get_device_name(0)
    sha = os.environ.get("KERNELLAB_GIT_SHA", "")
    plan = {name: configs_for(spec, n_sm, dry) for name, spec in cases.items()}
    print(f"{sum(map(len, plan.values()))} configs over {len(plan)} cases", flush=True)
    failed = {}
    if not dry:
        jobs = [(name, cases[name], cfgs[i : i + 8])
                for name, cfgs in plan.items() for i in range(0, len(cfgs), 8)]  # fmt: skip
        ctx = torch.multiprocessing.get_context("spawn")
        with cf.ProcessPoolExecutor(args.jobs, mp_context=ctx) as pool:
            for name, bad in pool.map(_compile_worker, jobs):
                failed.update({(name, c): why for c, why in bad})
        print(f"compiled in {time.time() - t0:.0f} s ({len(failed)} launches raised)", flush=True)
        for (name, c), why in list(failed.items())[:6]:
            print(f"  {name} {c}: {why}", flush=True)

    def timed(fn):
        if dry:
            fn()
            return float("nan")
        return timer.time_cuda(fn, warmup_s=0.01, min_reps=10, min_time_s=0.03, budget_s=0.12).median_ms

    lines = []
    rows_f = open(out / "mm_ws.jsonl", "w")
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
        t_auto = timed(lambda: tma_matmul_fwd(a, b)) if not dry else float("nan")
        best = {}
        for cfg in plan[name]:
            row = dict(base, **cfg)
            why = failed.get((name, json.dumps(cfg, sort_keys=True)))
            if why:
                row["error"] = why
            else:
                try:
                    y = run(a, b, cfg, n_sm)
                    err = (y.float() - ref.float()).abs().max().item() / scale
                    row["rel_err"] = err
                    if not err <= 2e-2:
                        row["error"] = "mismatch"
                    else:
                        row["ms"] = timed(lambda cfg=cfg: run(a, b, cfg, n_sm))
                        key = (cfg["kernel"], cfg["ws"])
                        if key not in best or row["ms"] < best[key][0]:
                            best[key] = (row["ms"], cfg)
                except Exception as e:  # noqa: BLE001
                    row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
            rows_f.write(json.dumps(row) + "\n")
        rows_f.write(json.dumps(dict(base, backend="torch", ms=t_cublas)) + "\n")
        rows_f.write(json.dumps(dict(base, backend="tma_auto", ms=t_auto)) + "\n")
        rows_f.flush()
        parts = [f"{name:28s} cublas {t_cublas:.4f} auto x{t_cublas / t_auto:.3f}"]
        for (kn, ws), (ms, cfg) in sorted(best.items()):
            tiles = f"{cfg['BLOCK_M']}x{cfg['BLOCK_N']}x{cfg['BLOCK_K']}"
            tiles += f"/{cfg['num_stages']}s/{cfg['num_warps']}w"
            parts.append(f"{kn}{'+ws' if ws else ''} x{t_cublas / ms:.3f} {tiles}")
        lines.append("  ".join(parts))
        print(lines[-1], flush=True)
    rows_f.close()
    (out / "mm_ws.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
