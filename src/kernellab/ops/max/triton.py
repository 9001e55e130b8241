"""max over the last dim in Triton: kernel, launcher, custom op, registration.

One kernel for max and argmax (ops/argmax/triton.py launches it without the values
store). A program owns ROWS rows (short rows share a program, ~4096 elements per step)
and streams them BLOCK columns at a time, keeping per row the running best value, its
index and the index of the first NaN. Per step: the block's max with NaN
replaced by -inf, the first column equal to it, the first NaN column (three register
reductions); a block replaces the running best only when strictly larger, so the earlier
index wins ties. NaN is handled by hand: ``tl.max`` drops NaN on the GPU (fmaxf) while
the interpreter's numpy propagates it, and Triton's argmax never prefers NaN; torch.max
does (value NaN, index of the first NaN).
"""

from __future__ import annotations

import torch
import triton.language as tl

from kernellab import triton_support
from kernellab.ops._reductions import max_backend, rows_config
from kernellab.ops._register import register_triton

NO_INDEX = tl.constexpr(2**31 - 1)  # "no index yet" (a global used in a kernel: constexpr)


@triton_support.jit
def _max_rows_kernel(
    x_ptr, val_ptr, idx_ptr, n_rows, n_cols, BLOCK: tl.constexpr, ROWS: tl.constexpr, WRITE_VALS: tl.constexpr
):
    # x: contiguous [n_rows, n_cols], n_cols >= 1; val: [n_rows] x's dtype (unused unless
    # WRITE_VALS); idx: [n_rows] int64.
    pid = tl.program_id(0).to(tl.int64)
    rows = pid * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    rmask = rows < n_rows
    best_v = tl.full([ROWS], float("-inf"), tl.float32)
    best_i = tl.full([ROWS], NO_INDEX, tl.int32)
    nan_i = tl.full([ROWS], NO_INDEX, tl.int32)
    for start in range(0, n_cols, BLOCK):
        cc = start + cols
        mask = rmask[:, None] & (cc[None, :] < n_cols)
        x = tl.load(x_ptr + rows[:, None] * n_cols + cc[None, :], mask=mask, other=float("-inf")).to(
            tl.float32
        )
        isnan = (x != x) & mask
        xs = tl.where(isnan, float("-inf"), x)
        bm = tl.max(xs, axis=1)
        ci = cc[None, :].to(tl.int32)
        bi = tl.min(tl.where(mask & (xs == bm[:, None]), ci, NO_INDEX), axis=1)
        nan_i = tl.minimum(nan_i, tl.min(tl.where(isnan, ci, NO_INDEX), axis=1))
        take = (bm > best_v) | (best_i == NO_INDEX)
        best_i = tl.where(take, bi, best_i)
        best_v = tl.where(take, bm, best_v)
    has_nan = nan_i < NO_INDEX
    tl.store(idx_ptr + rows, tl.where(has_nan, nan_i, best_i).to(tl.int64), mask=rmask)
    if WRITE_VALS:
        val = tl.where(has_nan, float("nan"), best_v)
        tl.store(val_ptr + rows, val.to(val_ptr.dtype.element_ty), mask=rmask)


def max_rows(x: torch.Tensor, want_values: bool):
    x = x.contiguous()
    n_cols = x.shape[-1] if x.dim() else 1
    if n_cols == 0:
        raise ValueError(f"max: x has shape {tuple(x.shape)}: its last dim is empty")
    idx = torch.empty(x.shape[:-1], dtype=torch.int64, device=x.device)
    vals = torch.empty(x.shape[:-1], dtype=x.dtype, device=x.device) if want_values else None
    n_rows = idx.numel()
    if n_rows:
        block, rows, warps = rows_config(n_cols)
        grid = (triton_support.cdiv(n_rows, rows),)
        _max_rows_kernel[grid](
            x,
            vals if want_values else idx,
            idx,
            n_rows,
            n_cols,
            BLOCK=block,
            ROWS=rows,
            WRITE_VALS=want_values,
            num_warps=warps,
        )
    return vals, idx


max_triton = max_backend("triton", max_rows, triton=True)


def kernel_specs(dtype: str, write_vals: bool = True):
    """For `kernellab asm`: the kernel as launched for 4096-wide rows."""
    block, rows, warps = rows_config(4096)
    sig = {"x_ptr": f"*{dtype}", "val_ptr": f"*{dtype}", "idx_ptr": "*i64", "n_rows": "i32", "n_cols": "i32"}
    sig.update(BLOCK="constexpr", ROWS="constexpr", WRITE_VALS="constexpr")
    cx = {"BLOCK": block, "ROWS": rows, "WRITE_VALS": write_vals}
    return [(_max_rows_kernel, sig, cx, warps)]


DESCRIPTION = "Triton: rows per program, running (value, index, first NaN)"

register_triton("max", max_triton, kernel_specs, DESCRIPTION)
