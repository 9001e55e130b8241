"""Lab: a skinny product y = x @ b (M <= 8) for a contiguous b [K, N] of any N, read in
aligned 16-byte vectors.

With N odd (the H200 table's 1 x 4097 x 4095 bf16), every other row of b starts 2 bytes off
a 4-byte boundary, so a kernel that walks b by rows cannot use vector loads; the Triton and
CUDA skinny kernels then load 2 bytes at a time and reach 0.4-1.2 TB/s against cuBLAS's 1.6
(benchmarks/results/gemv_odd-H200-*.jsonl).

Here b is read as one flat array cut into "super-rows" of 8 rows: 8 N elements, starting on a
multiple of 8 elements (16 bytes), whatever N is. Program p of a K slice reads the same
BLOCK elements [p BLOCK, (p + 1) BLOCK) of each super-row of its slice; element i of that
range always sits at row offset r = i // N and column c = i % N, so its fp32 sum of
x[m, 8 s + r] * b[8 s + r, c] over the slice's super-rows s stays in one register. Each
(r, c) of a super-row is one element of it, so the program stores its sums as partial
(slice, r) of column c, and the skinny path's in-order sum (``_split_sum_kernel``) adds the
8 x SPLIT partials of every output: deterministic, no atomics.

    python lab/gemv_flat.py --cpu-dry-run     # the arithmetic under the Triton interpreter
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

ROWS = 8  # rows of b per super-row: 8 N elements of 2 bytes are a whole number of 16 bytes


@triton.jit
def _x_rows(a_ptr, s_am, M, K, s, r, rm, ok, BLOCK_M: tl.constexpr, BLOCK: tl.constexpr, XSEL: tl.constexpr):
    """x[m, 8 s + r] for each element (fp32, [BLOCK_M, BLOCK]; 0 where not ``ok``)."""
    if XSEL:
        x = tl.zeros((BLOCK_M, BLOCK), dtype=tl.float32)
        for j in tl.static_range(8):
            kj = rm * 0 + (8 * s + j)  # (a tensor: the interpreter's loop index is an int)
            xj = tl.load(a_ptr + rm * s_am + kj, mask=(rm < M) & (kj < K), other=0.0)
            x = tl.where((r == j)[None, :], xj.to(tl.float32)[:, None], x)
        return tl.where(ok[None, :], x, 0.0)
    k = 8 * s + r
    x = tl.load(a_ptr + rm[:, None] * s_am + k[None, :], mask=(rm[:, None] < M) & ok[None, :], other=0.0)
    return x.to(tl.float32)


@triton.jit
def _gemv_flat_kernel(a_ptr, b_ptr, w_ptr, M, N, K, s_am, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK: tl.constexpr, XSEL: tl.constexpr):  # fmt: skip
    # XSEL 0: x[m, 8 s + r] gathered per element; 1: x[m, 8 s .. 8 s + 7] loaded as 8 values
    # and each element's picked by its r (selects in registers, 8 loads per row of x)
    # program (p, slice): elements [p BLOCK, +BLOCK) of every super-row of its slice
    p = tl.program_id(0)
    sl = tl.program_id(1)
    span = 8 * N  # elements of a super-row (a multiple of 8: aligned)
    supers = tl.cdiv(K, 8)
    per = tl.cdiv(supers, SPLIT)
    s_lo = sl * per
    s_hi = tl.minimum(s_lo + per, supers)
    i = p * BLOCK + tl.arange(0, BLOCK)
    inside = i < span
    r = i // N  # row offset in the super-row, 0-7
    c = i - r * N  # column
    rm = tl.arange(0, BLOCK_M)
    acc = tl.zeros((BLOCK_M, BLOCK), dtype=tl.float32)
    # whole super-rows: the only mask is the end of the super-row, a multiple of 8
    # elements, so the loads of b stay 16-byte vectors
    s_full = tl.minimum(s_hi, K // 8)
    for s in range(s_lo, s_full):
        b = tl.load(b_ptr + s * span + i, mask=inside, other=0.0).to(tl.float32)  # (K N < 2^31)
        acc += _x_rows(a_ptr, s_am, M, K, s, r, rm, inside, BLOCK_M, BLOCK, XSEL) * b[None, :]
    # the last, partial super-row (K not a multiple of 8), if this slice holds it
    for s in range(tl.maximum(s_lo, s_full), s_hi):
        ok = inside & (8 * s + r < K)
        b = tl.load(b_ptr + s * span + i, mask=ok, other=0.0).to(tl.float32)
        acc += _x_rows(a_ptr, s_am, M, K, s, r, rm, ok, BLOCK_M, BLOCK, XSEL) * b[None, :]
    # partial (slice, r) of column c: w [SPLIT * 8, M, N]
    w_ptrs = w_ptr + ((sl * 8 + r)[None, :] * M + rm[:, None]) * N + c[None, :]
    tl.store(w_ptrs, acc, mask=(rm[:, None] < M) & inside[None, :])


def splits_for(n: int, k: int, block: int, n_sm: int, waves: float = 2.0, cap: int = 16) -> int:
    """K slices: enough programs for ``waves`` per SM, at most ``cap`` (each slice adds 8 M N
    fp32 partials to write and sum), none empty."""
    programs = triton.cdiv(ROWS * n, block)
    supers = triton.cdiv(k, ROWS)
    s = max(1, min(cap, supers, triton.cdiv(int(waves * n_sm), programs)))
    return triton.cdiv(supers, triton.cdiv(supers, s))


def gemv_flat(a: torch.Tensor, b: torch.Tensor, block: int = 1024, warps: int = 4, split: int | None = None,
              n_sm: int | None = None, xsel: int = 0) -> torch.Tensor:  # fmt: skip
    """a [M, K] (unit stride along K) @ b [K, N] contiguous, 16-bit, M <= 8 -> y [M, N]."""
    from kernellab.ops.matmul import triton as tm

    m, k = a.shape
    n = b.shape[1]
    if not (1 <= m <= 8 and b.shape[0] == k and b.is_contiguous() and a.stride(1) == 1):
        raise ValueError(
            f"gemv_flat: a [M<=8, K] unit-stride @ contiguous b [K, N]; got {a.shape} @ {b.shape}"
        )
    if b.numel() >= 2**31:
        raise ValueError("gemv_flat: b of 2^31 elements or more (int32 offsets)")
    if n_sm is None:
        n_sm = torch.cuda.get_device_properties(a.device).multi_processor_count if a.is_cuda else 4
    split = split or splits_for(n, k, block, n_sm)
    w = torch.empty((split * ROWS, m, n), dtype=torch.float32, device=a.device)
    bm = max(1, triton.next_power_of_2(m))
    grid = (triton.cdiv(ROWS * n, block), split)
    _gemv_flat_kernel[grid](
        a, b, w, m, n, k, a.stride(0), SPLIT=split, BLOCK_M=bm, BLOCK=block, XSEL=xsel, num_warps=warps
    )
    c = torch.empty((m, n), dtype=a.dtype, device=a.device)
    sb = 1024
    tm._split_sum_kernel[(triton.cdiv(m * n, sb),)](w, c, c, m * n, n, HAS_BIAS=False, ACT=0,
                                                    SPLIT_K=split * ROWS, BLOCK=sb)  # fmt: skip
    return c


def _cpu_dry_run() -> int:
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    bad = 0
    g = torch.Generator().manual_seed(0)
    cases = ((1, 37, 29, 64, None), (3, 41, 70, 128, 3), (8, 9, 8, 32, 1), (2, 17, 3, 64, 2),
             (1, 5, 100, 64, 4), (4, 33, 65, 256, None))  # fmt: skip
    for m, n, k, block, split in cases:
        a = torch.randn(m, k, generator=g).to(torch.bfloat16)
        b = torch.randn(k, n, generator=g).to(torch.bfloat16)
        ref = a.double() @ b.double()
        err = max((gemv_flat(a, b, block=block, split=split, xsel=xs).double() - ref).abs().max().item()
                  for xs in (0, 1))  # fmt: skip
        bound = 2**-7 * ref.abs().max().item() + 1e-3  # (one bf16 rounding of the output)
        ok = err <= bound
        bad += not ok
        print(f"M={m} N={n} K={k} BLOCK={block} split={split}: max |err| {err:.3g} (bound {bound:.3g}) "
              f"{'ok' if ok else 'WRONG'}")  # fmt: skip
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu-dry-run", action="store_true")
    a = ap.parse_args()
    if a.cpu_dry_run:
        return _cpu_dry_run()
    ap.error("time it with lab/gpu_gemv_odd.py on a GPU, or --cpu-dry-run here")


if __name__ == "__main__":
    sys.exit(main())
