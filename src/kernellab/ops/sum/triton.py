"""Sum in Triton: kernels, launchers, custom ops, registration.

Whole tensor (two stages, no atomics, deterministic):
  1. ``_sum_partials_kernel``: program p sums the contiguous chunk
     [p * BLOCK * ITERS, (p + 1) * BLOCK * ITERS) - each lane keeps a Kahan-compensated
     fp32 sum over ITERS loads, the program's BLOCK lanes are combined in float64 - and
     writes one float64 partial. 2^28 fp32 values: 8192 programs, 64 KB of partials.
  2. ``_sum_final_kernel``: one program adds the partials in float64 and rounds once
     to the output dtype.
Rows (sum over the last dim): ``_sum_rows_kernel`` gives ROWS rows to a program (short
rows share one), streams the row BLOCK columns at a time with the same compensated
lanes, combines a row's lanes in float64.

Why compensation and float64 (see ops/sum/__init__.py): an fp32 tree is about as
accurate as torch.sum itself, and the check admits 2 x torch's error.
"""

from __future__ import annotations

import torch
import triton.language as tl

from kernellab import triton_support
from kernellab.ops._reductions import rows_config, sum_backend
from kernellab.ops._register import register_triton

BLOCK_ALL = 4096  # elements per load step of a program (8 warps: 16 fp32 per thread)
ITERS_ALL = 8  # load steps per program: 32768 elements per program
FINAL_BLOCK = 1024


@triton_support.jit
def _kahan_add(s, c, x):
    # s + x with the rounding error carried in c (Kahan). Once s is +-inf or NaN the
    # compensation would turn inf into NaN (inf - inf); it is dropped there instead.
    y = x - c
    t = s + y
    c = tl.where(tl.abs(t) < float("inf"), (t - s) - y, 0.0)
    return t, c


@triton_support.jit
def _sum_partials_kernel(x_ptr, part_ptr, n, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    # x: contiguous, n elements; part: float64 [num_programs].
    pid = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    base = pid * (BLOCK * ITERS)
    s = tl.zeros([BLOCK], tl.float32)
    c = tl.zeros([BLOCK], tl.float32)
    for i in range(ITERS):
        idx = base + i * BLOCK + offs
        x = tl.load(x_ptr + idx, mask=idx < n, other=0.0).to(tl.float32)
        s, c = _kahan_add(s, c, x)
    total = tl.sum(s.to(tl.float64) - c.to(tl.float64), axis=0)
    tl.store(part_ptr + pid, total)


@triton_support.jit
def _sum_final_kernel(part_ptr, out_ptr, n_part, BLOCK: tl.constexpr):
    # part: float64 [n_part]; out: one element of the input dtype.
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float64)
    for start in range(0, n_part, BLOCK):
        idx = start + offs
        acc += tl.load(part_ptr + idx, mask=idx < n_part, other=0.0)
    total = tl.sum(acc, axis=0)
    tl.store(out_ptr, total.to(tl.float32).to(out_ptr.dtype.element_ty))


@triton_support.jit
def _sum_rows_kernel(x_ptr, out_ptr, n_rows, n_cols, BLOCK: tl.constexpr, ROWS: tl.constexpr):
    # x: contiguous [n_rows, n_cols]; out: [n_rows] in x's dtype.
    pid = tl.program_id(0).to(tl.int64)
    rows = pid * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    rmask = rows < n_rows
    s = tl.zeros([ROWS, BLOCK], tl.float32)
    c = tl.zeros([ROWS, BLOCK], tl.float32)
    for start in range(0, n_cols, BLOCK):
        cc = start + cols
        mask = rmask[:, None] & (cc[None, :] < n_cols)
        x = tl.load(x_ptr + rows[:, None] * n_cols + cc[None, :], mask=mask, other=0.0).to(tl.float32)
        s, c = _kahan_add(s, c, x)
    total = tl.sum(s.to(tl.float64) - c.to(tl.float64), axis=1)
    tl.store(out_ptr + rows, total.to(tl.float32).to(out_ptr.dtype.element_ty), mask=rmask)


def sum_all(x: torch.Tensor) -> torch.Tensor:
    x = x.contiguous()  # strided or expanded: pack first
    n = x.numel()
    if n == 0:
        return torch.zeros((), dtype=x.dtype, device=x.device)
    grid = triton_support.cdiv(n, BLOCK_ALL * ITERS_ALL)
    part = torch.empty(grid, dtype=torch.float64, device=x.device)
    _sum_partials_kernel[(grid,)](x, part, n, BLOCK=BLOCK_ALL, ITERS=ITERS_ALL, num_warps=8)
    out = torch.empty((), dtype=x.dtype, device=x.device)
    _sum_final_kernel[(1,)](part, out, grid, BLOCK=FINAL_BLOCK, num_warps=4)
    return out


def sum_rows(x: torch.Tensor) -> torch.Tensor:
    x = x.contiguous()
    n_cols = x.shape[-1] if x.dim() else 1
    out = torch.empty(x.shape[:-1], dtype=x.dtype, device=x.device)
    n_rows = out.numel()
    if n_rows:
        block, rows, warps = rows_config(n_cols)
        grid = (triton_support.cdiv(n_rows, rows),)
        _sum_rows_kernel[grid](x, out, n_rows, n_cols, BLOCK=block, ROWS=rows, num_warps=warps)
    return out


sum_triton = sum_backend("triton", sum_all, sum_rows, triton=True)


def _kernel_specs(dtype: str):
    """For `kernellab asm`: the three kernels as launched at the bench sizes."""
    block, rows, warps = rows_config(4096)
    part = {"x_ptr": f"*{dtype}", "part_ptr": "*fp64", "n": "i64", "BLOCK": "constexpr", "ITERS": "constexpr"}
    final = {"part_ptr": "*fp64", "out_ptr": f"*{dtype}", "n_part": "i32", "BLOCK": "constexpr"}
    rows_sig = {"x_ptr": f"*{dtype}", "out_ptr": f"*{dtype}", "n_rows": "i32", "n_cols": "i32"}
    rows_sig.update(BLOCK="constexpr", ROWS="constexpr")
    return [
        (_sum_partials_kernel, part, {"BLOCK": BLOCK_ALL, "ITERS": ITERS_ALL}, 8),
        (_sum_final_kernel, final, {"BLOCK": FINAL_BLOCK}, 4),
        (_sum_rows_kernel, rows_sig, {"BLOCK": block, "ROWS": rows}, warps),
    ]


register_triton(
    "sum",
    sum_triton,
    _kernel_specs,
    "Triton: compensated fp32 lanes, float64 combine; partials + final program",
)
