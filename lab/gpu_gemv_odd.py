"""Skinny products at odd sizes (rows of b not on 16-byte boundaries) on a lent GPU.

    python lab/gpu_gemv_odd.py [--out DIR] [--max-seconds 200]

The H200 table's worst matmul row is 1 x 4097 x 4095 bf16 with b [K, N] row-major (the
"nn" layout; N odd, so every other row of b starts 2 bytes off a 4-byte boundary):
cuda_skinny 54 us, triton 56, cuBLAS 21. Here, per shape, with triton.testing.do_bench
(L2 flushed), against float64:
- torch (cuBLAS), kernellab's triton skinny kernel with its heuristic's config and a grid
  of configs (BLOCK_N, BLOCK_K, SPLIT_K, warps, stages), cuda_skinny;
- ``flat`` (lab/gemv_flat.py, nn with b contiguous, M <= 8): b read as 8-row super-rows in
  16-byte vectors whatever N is, over BLOCK x warps x the x-select variant x slices;
- ``fma``: a GEMV without tl.dot or a shared-memory pipeline (each program sums
  x[k] * b[k, n] over its K slice for BLOCK_N columns in fp32 registers, fp32 partials
  per slice, then the skinny path's in-order sum), over BLOCK_N x BLOCK_K x slices x warps.
Rows (ms, GB/s of b, x cuBLAS) go to DIR/gemv_odd.jsonl; the best of each family is printed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import kernellab  # noqa: E402
from kernellab.ops.matmul import triton as tm  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gemv_flat import gemv_flat, splits_for  # noqa: E402

# (M, N, K, layout): nn = b [K, N] row-major; nt = b = W.t() with W [N, K] row-major
SHAPES = [
    (1, 4097, 4095, "nn"),
    (1, 14336, 4096, "nn"),
    (4, 4097, 4095, "nn"),
]


@triton.jit
def _gemv_fma_kernel(a_ptr, b_ptr, w_ptr, M, N, K, s_am, s_bk, s_bn,
                     SPLIT_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    m = tl.program_id(2)
    k_blocks = tl.cdiv(K, BLOCK_K)
    per = tl.cdiv(k_blocks, SPLIT_K)
    k_lo = pid_k * per * BLOCK_K
    steps = tl.minimum(per, k_blocks - pid_k * per)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    nmask = rn < N
    b_ptrs = b_ptr + (k_lo + rk)[:, None].to(tl.int64) * s_bk + rn[None, :].to(tl.int64) * s_bn
    a_ptrs = a_ptr + m * s_am + k_lo + rk
    # products summed in place over the slice, the K rows of the tile added once at the end
    # (a cross-thread sum per step costs a shared-memory round trip)
    acc = tl.zeros((BLOCK_K, BLOCK_N), dtype=tl.float32)
    for i in range(0, steps):
        k_left = K - k_lo - i * BLOCK_K
        x = tl.load(a_ptrs, mask=rk < k_left, other=0.0).to(tl.float32)
        b = tl.load(b_ptrs, mask=(rk[:, None] < k_left) & nmask[None, :], other=0.0).to(tl.float32)
        acc += x[:, None] * b
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K * s_bk
    tl.store(w_ptr + pid_k * M * N + m * N + rn, tl.sum(acc, axis=0), mask=nmask)


def gemv_fma(a, b, bn, bk, split, warps):
    m, k = a.shape
    n = b.shape[1]
    w = torch.empty((split, m, n), dtype=torch.float32, device=a.device)
    grid = (triton.cdiv(n, bn), split, m)
    _gemv_fma_kernel[grid](a, b, w, m, n, k, a.stride(0), b.stride(0), b.stride(1),
                           SPLIT_K=split, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps)  # fmt: skip
    if split == 1:
        return w[0].to(a.dtype)
    c = torch.empty((m, n), dtype=a.dtype, device=a.device)
    block = 1024
    tm._split_sum_kernel[(triton.cdiv(m * n, block),)](w, c, c, m * n, n, HAS_BIAS=False, ACT=0,
                                                       SPLIT_K=split, BLOCK=block)  # fmt: skip
    return c


def bench(fn):
    return float(triton.testing.do_bench(fn, warmup=10, rep=40))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--max-seconds", type=float, default=200)
    a_ = ap.parse_args()
    t0 = time.perf_counter()
    rows = []
    n_sm = torch.cuda.get_device_properties(0).multi_processor_count
    for m, n, k, layout in SHAPES:
        if time.perf_counter() - t0 > a_.max_seconds:
            print("time is up: the remaining shapes are not run")
            break
        g = torch.Generator(device="cuda").manual_seed(0)
        a = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
        b = torch.randn(k, n, device="cuda", generator=g).to(torch.bfloat16)
        if layout == "nt":
            b = b.t().contiguous().t()
        ref = a.double() @ b.double()
        gbytes = n * k * 2 / 1e9
        err_t = (torch.matmul(a, b).double() - ref).abs().max().item()
        t_torch = bench(lambda: torch.matmul(a, b))
        name = f"{m}x{n}x{k} {layout}"
        print(f"\n{name}: cuBLAS {t_torch * 1e3:.1f} us ({gbytes / t_torch * 1e3:.0f} GB/s)", flush=True)
        rows.append({"shape": name, "family": "torch", "config": None, "ms": t_torch, "ok": True})

        def run(family, config, fn):
            try:
                out = fn()
                err = (out.double() - ref).abs().max().item()
                ok = err <= 2 * err_t + 1e-2
                ms = bench(fn)
            except Exception as e:  # noqa: BLE001 - a config that does not compile or fit
                rows.append({"shape": name, "family": family, "config": config, "error": str(e)[:160]})
                return
            rows.append({"shape": name, "family": family, "config": config, "ms": ms, "ok": ok,
                         "x_cublas": t_torch / ms})  # fmt: skip

        run("cuda_skinny", None, lambda: kernellab.matmul(a, b, backend="cuda_skinny"))
        heur = tm.skinny_config(m, n, k, n_sm, 2)
        run("triton_skinny", list(heur), lambda: tm.triton_skinny_fwd(a, b, config=heur))
        for bn, bk, warps in itertools.product((64, 128, 256), (16, 32, 64), (4, 8)):
            kb = triton.cdiv(k, bk)
            base = max(1, min(32, triton.cdiv(2 * n_sm, triton.cdiv(n, bn)), kb // 2))
            for split in sorted({base, min(64, 2 * base, kb)}):
                run("fma", [bn, bk, split, warps],
                    lambda bn=bn, bk=bk, s=split, w=warps: gemv_fma(a, b, bn, bk, s, w))  # fmt: skip
        if layout == "nn" and m <= 8:
            for block, warps, xsel in itertools.product((512, 1024, 2048, 4096), (4, 8), (0, 1)):
                base = splits_for(n, k, block, n_sm)
                for split in sorted({base, min(16, 2 * base)}):
                    fn = lambda bl=block, w=warps, x=xsel, s=split: gemv_flat(a, b, bl, w, s, n_sm, x)  # noqa: E731
                    run("flat", [block, warps, xsel, split], fn)
        for fam in ("cuda_skinny", "triton_skinny", "fma", "flat"):
            got = [r for r in rows if r["shape"] == name and r["family"] == fam and r.get("ok")]
            bad = [r for r in rows if r["shape"] == name and r["family"] == fam and r.get("ok") is False]
            if got:
                best = min(got, key=lambda r: r["ms"])
                print(f"  {fam:14s} best {best['ms'] * 1e3:7.1f} us  {t_torch / best['ms']:.2f}x cuBLAS  "
                      f"config {best['config']}  ({len(got)} ok, {len(bad)} wrong)", flush=True)  # fmt: skip
        heur_row = next((r for r in rows if r["shape"] == name and r["family"] == "triton_skinny"), None)
        if heur_row and "ms" in heur_row:
            print(f"  triton_skinny heuristic {heur_row['ms'] * 1e3:.1f} us {heur}")
    if a_.out:
        Path(a_.out).mkdir(parents=True, exist_ok=True)
        with open(Path(a_.out) / "gemv_odd.jsonl", "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
