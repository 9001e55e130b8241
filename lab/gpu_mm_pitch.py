"""Is 3000^3's 0.69x cuBLAS the row pitch, and which load path avoids it?

    python lab/gpu_mm_pitch.py --out DIR [--cases 3000,3072,fp16_1000x3000x5000] [--cpu-dry-run]

H200 table: bf16 3000^3 runs 117 us in triton_tma against cuBLAS 81; 3072^3 takes the same
plan at 0.84x, so the 6000-byte rows (16-byte aligned, not 128) cost ~28% per flop
(benchmarks/NOTES.md, "3000^3 is the row pitch"). The pointer kernel is 841 us there: Triton
cannot tell that a stride of 3000 elements keeps rows on 16-byte boundaries, so it loads 2
bytes at a time. Per case, device time (kernellab's timer, L2 flushed) of:

- ``cublas``: torch.matmul;
- ``tma_auto``: the triton_tma launcher's own choice;
- ``tma_pitch``: a tile kernel of TMA loads whose descriptors take the row pitch as an
  argument, on the operands as given (pitch K and N), and ``tma_padded``: the same kernel on
  copies whose rows are padded to a multiple of 64 elements (128 bytes; the copy not timed);
- ``ptr``: a pointer (cp.async) tile kernel as given, and ``ptr_hint``: the same with the
  strides rewritten as (s // 8) * 8, so Triton sees 16-byte rows and vectorizes.

Each kernel at a few tiles, each output checked against cuBLAS's (2e-2 of its largest value).
Rows go to DIR/mm_pitch.jsonl, the best of each path per case to DIR/mm_pitch.txt.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from kernellab import triton_support  # noqa: E402
from kernellab.ops.matmul.triton import grouped_tile  # noqa: E402

CASES = {
    "3000": (3000, 3000, 3000, torch.bfloat16),
    "3072": (3072, 3072, 3072, torch.bfloat16),
    "fp16_1000x3000x5000": (1000, 3000, 5000, torch.float16),
}
DRY = {"dry": (40, 56, 72, torch.float32)}
# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages)
TILES = [(128, 256, 64, 8, 3), (128, 128, 64, 4, 4), (128, 128, 64, 8, 4), (256, 128, 64, 8, 3)]
DRY_TILES = [(16, 16, 16, 4, 1)]


@triton_support.jit
def mm_tma_pitch(a_ptr, b_ptr, c_ptr, M, N, K, pa, pb, pc, BM: tl.constexpr, BN: tl.constexpr,
                 BK: tl.constexpr, GROUP_M: tl.constexpr):  # fmt: skip
    # a [M, K] with row pitch pa, b [K, N] pitch pb, c [M, N] pitch pc (elements).
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BM, BN, GROUP_M)
    a_d = tl.make_tensor_descriptor(a_ptr, [M, K], [pa, 1], [BM, BK])
    b_d = tl.make_tensor_descriptor(b_ptr, [K, N], [pb, 1], [BK, BN])
    c_d = tl.make_tensor_descriptor(c_ptr, [M, N], [pc, 1], [BM, BN])
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for kk in range(0, tl.cdiv(K, BK)):
        acc = tl.dot(a_d.load([pid_m * BM, kk * BK]), b_d.load([kk * BK, pid_n * BN]), acc)
    c_d.store([pid_m * BM, pid_n * BN], acc.to(c_ptr.dtype.element_ty))


@triton_support.jit
def mm_ptr(a_ptr, b_ptr, c_ptr, M, N, K, sa, sb, sc, HINT: tl.constexpr, BM: tl.constexpr,
           BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr):  # fmt: skip
    # a [M, K] row stride sa, b [K, N] row stride sb, c [M, N] row stride sc; unit column
    # strides. HINT: the strides and K, N rewritten as multiples of 8 (the same values where
    # they are), which Triton's analysis keeps (a tl.multiple_of on a scalar is dropped).
    if HINT:
        sa = (sa // 8) * 8
        sb = (sb // 8) * 8
        sc = (sc // 8) * 8
        K = (K // 8) * 8
        N = (N // 8) * 8
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BM, BN, GROUP_M)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    a_p = a_ptr + rm[:, None] * sa + rk[None, :]
    b_p = b_ptr + rk[:, None] * sb + rn[None, :]
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        a = tl.load(a_p, mask=(rm[:, None] < M) & (k0 + rk[None, :] < K), other=0.0)
        b = tl.load(b_p, mask=(k0 + rk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
        a_p += BK
        b_p += BK * sb
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    tl.store(c_ptr + rm[:, None] * sc + rn[None, :], acc.to(c_ptr.dtype.element_ty), mask=mask)


def padded(t: torch.Tensor, mult: int) -> torch.Tensor:
    """A copy of 2-D t in rows padded to a multiple of mult elements (a strided view)."""
    rows, cols = t.shape
    buf = torch.zeros(rows, -(-cols // mult) * mult, dtype=t.dtype, device=t.device)
    buf[:, :cols] = t
    return buf[:, :cols]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--cpu-dry-run", action="store_true")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dry = args.cpu_dry_run
    dev = "cpu" if dry else "cuda"
    cases = DRY if dry else {k: v for k, v in CASES.items() if k in args.cases.split(",")}
    tiles = DRY_TILES if dry else TILES
    from kernellab.harness import timer
    from kernellab.ops.matmul.triton_tma import tma_matmul_fwd
    from kernellab.triton_support import install_tma_allocator

    install_tma_allocator()
    sha = os.environ.get("KERNELLAB_GIT_SHA", "")
    gpu = "cpu" if dry else torch.cuda.get_device_name(0)

    def timed(fn):
        if dry:
            fn()
            return float("nan")
        return timer.time_cuda(fn, warmup_s=0.02, min_reps=10, min_time_s=0.05, budget_s=0.3).median_ms * 1e3

    rows = open(out / "mm_pitch.jsonl", "w")
    lines = []
    t0 = time.time()
    for name, (m, n, k, dtype) in cases.items():
        g = torch.Generator(device=dev).manual_seed(0)
        a = torch.randn(m, k, generator=g, device=dev).to(dtype)
        b = torch.randn(k, n, generator=g, device=dev).to(dtype)
        ref = (a.double() @ b.double()).float() if dry else torch.matmul(a, b).float()
        scale = ref.abs().max().item() or 1.0
        base = dict(case=name, m=m, n=n, k=k, dtype=str(dtype)[6:], gpu=gpu, git_sha=sha)
        best = {}

        def record(path, fn, cfg=None):
            try:
                y = fn()
                err = (y.float() - ref).abs().max().item() / scale
                us = timed(fn) if err <= 2e-2 else float("nan")
                row = dict(base, path=path, config=cfg, us=us, rel_err=err)
            except Exception as e:  # noqa: BLE001 (a launch that fails is a row too)
                row = dict(base, path=path, config=cfg, error=f"{type(e).__name__}: {str(e)[:200]}")
            rows.write(json.dumps(row) + "\n")
            rows.flush()
            us = row.get("us", float("nan"))
            if us == us and (path not in best or us < best[path][0]):
                best[path] = (us, cfg)

        if not dry:
            record("cublas", lambda: torch.matmul(a, b))
        record("tma_auto", lambda: tma_matmul_fwd(a, b))
        ap_, bp_ = padded(a, 64), padded(b, 64)
        for bm, bn, bk, w, st in tiles:
            cfg = [bm, bn, bk, w, st]
            grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
            kw = dict(BM=bm, BN=bn, BK=bk, GROUP_M=8, num_warps=w, num_stages=st)

            def run_tma(x, y_, pitch_c):
                cbuf = torch.empty(m, pitch_c, dtype=dtype, device=dev)
                mm_tma_pitch[grid](x, y_, cbuf, m, n, k, x.stride(0), y_.stride(0), pitch_c, **kw)
                return cbuf[:, :n]

            record("tma_pitch", lambda: run_tma(a, b, n), cfg)
            record("tma_padded", lambda: run_tma(ap_, bp_, bp_.stride(0)), cfg)
            for hint in (False, True):

                def run_ptr(hint=hint):
                    c = torch.empty(m, n, dtype=dtype, device=dev)
                    mm_ptr[grid](a, b, c, m, n, k, a.stride(0), b.stride(0), n, HINT=hint, **kw)
                    return c

                record("ptr_hint" if hint else "ptr", run_ptr, cfg)
        cub = best.get("cublas", (float("nan"), None))[0]
        parts = [f"{p} {u:.1f} us x{cub / u:.3f} {c}" for p, (u, c) in best.items()]
        lines.append(f"{name}: " + " | ".join(parts))
        print(lines[-1], f"({time.time() - t0:.0f} s)", flush=True)
    (out / "mm_pitch.txt").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
