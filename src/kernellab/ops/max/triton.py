"""max over the last dim in Triton: kernel, launcher, custom op, registration.

One kernel for max and argmax (ops/argmax/triton.py launches it without the values
store). NaN is handled by hand: ``tl.max`` drops NaN on the GPU (fmaxf) while the
interpreter's numpy propagates it, and Triton's argmax never prefers NaN; torch.max does
(value NaN, index of the first NaN). Ties break to the first index, as torch's.

- Short rows (several a program, ``ROWS`` > 1, each row one step of at most BLOCK
  columns): the block's max with NaN replaced by -inf, the first column equal to it and
  the first NaN column, three register reductions.
- Long rows (one a program, streamed BLOCK columns a step): each lane keeps its own
  running best value, its column and its first NaN column, elementwise (a lane takes a
  later column only when strictly larger, so it keeps its first); the lanes are reduced
  once, at the end. A row whose start is off a 16-byte boundary (``SHIFTED``: the width is
  not a multiple of 16 bytes' elements) is read as the aligned chunks that hold it, 16
  bytes a load, the neighbours' elements masked out (``_triton_rows.shifted_span``).
"""

from __future__ import annotations

import torch
import triton.language as tl

from kernellab import triton_support
from kernellab.core.spec import GRID_YZ_LIMIT
from kernellab.ops._reductions import max_backend, max_grad_torch, rows_config
from kernellab.ops._register import register_triton
from kernellab.ops._triton_rows import shifted_span

NO_INDEX = tl.constexpr(2**31 - 1)  # "no index yet" (a global used in a kernel: constexpr)


@triton_support.jit
def _lane_step(x, ok, col, best_v, best_i, nan_i):
    # one step of per-lane running bests: x fp32, ok the lanes inside the row, col their
    # columns (int32, increasing from step to step). A lane's first in-row element is taken
    # whatever it is (a row of -inf has index 0), NaN never (its first column is kept apart).
    isnan = (x != x) & ok
    nan_i = tl.where(isnan & (nan_i == NO_INDEX), col, nan_i)
    take = ok & ~isnan & ((x > best_v) | (best_i == NO_INDEX))
    return tl.where(take, x, best_v), tl.where(take, col, best_i), nan_i


@triton_support.jit
def _max_rows_kernel(
    x_ptr, val_ptr, idx_ptr, n_rows, n_cols, total,
    BLOCK: tl.constexpr, ROWS: tl.constexpr, WRITE_VALS: tl.constexpr,
    A: tl.constexpr,  # elements per 16 bytes
    SHIFTED: tl.constexpr,  # ROWS == 1 and n_cols not a multiple of A
):  # fmt: skip
    # x: contiguous [n_rows, n_cols] (total elements), n_cols >= 1; val: [n_rows] x's
    # dtype (unused unless WRITE_VALS); idx: [n_rows] int64.
    pid = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    if ROWS == 1:
        best_v = tl.full([BLOCK], float("-inf"), tl.float32)
        best_i = tl.full([BLOCK], NO_INDEX, tl.int32)
        nan_i = tl.full([BLOCK], NO_INDEX, tl.int32)
        if SHIFTED:
            a0, lo, r1, hi, lim, b0, b1 = shifted_span(pid * n_cols, n_cols, total, A)
            xp = x_ptr + a0
            for start in range(0, hi, BLOCK):
                j = start + cols
                x = tl.load(xp + j, mask=j < lim, other=float("-inf")).to(tl.float32)
                best_v, best_i, nan_i = _lane_step(x, (j >= lo) & (j < r1), j - lo, best_v, best_i, nan_i)
            # the tensor's last partial chunk (only the last row has elements there), read
            # apart so that no load passes the tensor; its columns follow every other
            tj = lim + tl.arange(0, A)
            tok = (tj >= lo) & (tj < r1)
            t = tl.load(xp + tj, mask=tok, other=float("-inf")).to(tl.float32)
            none = tl.full([A], NO_INDEX, tl.int32)
            tv, ti, tn = _lane_step(t, tok, tj - lo, tl.full([A], float("-inf"), tl.float32), none, none)
            t_best = tl.max(tv, axis=0)
            t_idx = tl.min(tl.where(tv == t_best, ti, NO_INDEX), axis=0)
            t_nan = tl.min(tn, axis=0)
        else:
            n = (n_cols // A) * A  # (= n_cols: Triton sees it divides by A, 16-byte loads)
            xp = x_ptr + pid * n
            for start in range(0, n, BLOCK):
                j = start + cols
                ok = j < n
                x = tl.load(xp + j, mask=ok, other=float("-inf")).to(tl.float32)
                best_v, best_i, nan_i = _lane_step(x, ok, j, best_v, best_i, nan_i)
        bm = tl.max(best_v, axis=0)
        bi = tl.min(tl.where(best_v == bm, best_i, NO_INDEX), axis=0)  # (no-index lanes: NO_INDEX)
        ni = tl.min(nan_i, axis=0)
        if SHIFTED:
            tail = (t_idx < NO_INDEX) & ((bi == NO_INDEX) | (t_best > bm))
            bm = tl.where(tail, t_best, bm)
            bi = tl.where(tail, t_idx, bi)
            ni = tl.minimum(ni, t_nan)
        has_nan = ni < NO_INDEX
        tl.store(idx_ptr + pid, tl.where(has_nan, ni, bi).to(tl.int64))
        if WRITE_VALS:
            tl.store(val_ptr + pid, tl.where(has_nan, float("nan"), bm).to(val_ptr.dtype.element_ty))
    else:
        rows = pid * ROWS + tl.arange(0, ROWS)
        rmask = rows < n_rows
        mask = rmask[:, None] & (cols[None, :] < n_cols)
        x = tl.load(x_ptr + rows[:, None] * n_cols + cols[None, :], mask=mask, other=float("-inf"))
        x = x.to(tl.float32)
        isnan = (x != x) & mask
        xs = tl.where(isnan, float("-inf"), x)
        bm = tl.max(xs, axis=1)
        ci = cols[None, :].to(tl.int32)
        bi = tl.min(tl.where(mask & (xs == bm[:, None]), ci, NO_INDEX), axis=1)
        ni = tl.min(tl.where(isnan, ci, NO_INDEX), axis=1)
        has_nan = ni < NO_INDEX
        tl.store(idx_ptr + rows, tl.where(has_nan, ni, bi).to(tl.int64), mask=rmask)
        if WRITE_VALS:
            val = tl.where(has_nan, float("nan"), bm)
            tl.store(val_ptr + rows, val.to(val_ptr.dtype.element_ty), mask=rmask)


def _launch_config(n_cols: int, element_size: int):
    """(BLOCK, ROWS, num_warps, A, SHIFTED) for rows of ``n_cols`` elements."""
    block, rows, warps = rows_config(n_cols)
    a = 16 // element_size
    return block, rows, warps, a, rows == 1 and n_cols % a != 0


def max_rows(x: torch.Tensor, want_values: bool):
    x = x.contiguous()
    n_cols = x.shape[-1] if x.dim() else 1
    if n_cols == 0:
        raise ValueError(f"max: x has shape {tuple(x.shape)}: its last dim is empty")
    idx = torch.empty(x.shape[:-1], dtype=torch.int64, device=x.device)
    vals = torch.empty(x.shape[:-1], dtype=x.dtype, device=x.device) if want_values else None
    n_rows = idx.numel()
    if n_rows:
        block, rows, warps, a, shifted = _launch_config(n_cols, x.element_size())
        assert rows == 1 or n_cols <= block, (n_cols, block)  # (short rows: one step, the 2-D path)
        grid = (triton_support.cdiv(n_rows, rows),)
        _max_rows_kernel[grid](
            x,
            vals if want_values else idx,
            idx,
            n_rows,
            n_cols,
            x.numel(),
            BLOCK=block,
            ROWS=rows,
            WRITE_VALS=want_values,
            A=a,
            SHIFTED=shifted,
            num_warps=warps,
        )
    return vals, idx


@triton_support.jit
def _max_grad_kernel(dv_ptr, idx_ptr, dx_ptr, n_rows, n_cols, BLOCK: tl.constexpr, A: tl.constexpr):
    # dx: contiguous [n_rows, n_cols], 16-byte aligned, n_cols >= A (A elements per 16 bytes).
    # Seen flat, row program_id(0) owns the elements from the multiple of A at or below its
    # first to the one at or below the next row's first (so every store is whole 16-byte
    # packs at any width; the first of them may end the previous row, whose dy lands there
    # at its argmax); program_id(1) picks BLOCK of them. The last row's last program also
    # writes the tensor's last partial pack.
    r = tl.program_id(0).to(tl.int64)
    first = r * n_cols // A * A
    stop = (r + 1) * n_cols  # the next row's first element (the last row's: the tensor's end)
    end = stop // A * A
    hit = r * n_cols + tl.load(idx_ptr + r)
    g = tl.load(dv_ptr + r).to(tl.float32)
    prev_hit = tl.where(r > 0, (r - 1) * n_cols + tl.load(idx_ptr + r - 1, mask=r > 0, other=0), -1)
    prev_g = tl.load(dv_ptr + r - 1, mask=r > 0, other=0.0).to(tl.float32)
    e = first + tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    val = tl.where(e == hit, g, tl.where(e == prev_hit, prev_g, 0.0))
    tl.store(dx_ptr + e, val.to(dx_ptr.dtype.element_ty), mask=e < end)
    if (r + 1 == n_rows) & (tl.program_id(1) == tl.num_programs(1) - 1):
        t = end + tl.arange(0, A)
        tl.store(dx_ptr + t, tl.where(t == hit, g, 0.0).to(dx_ptr.dtype.element_ty), mask=t < stop)


GRAD_BLOCK = 4096


def max_grad(idx: torch.Tensor, dv: torch.Tensor, shape) -> torch.Tensor:
    """dx of ``max`` in one pass: zeros but ``dv`` at each row's argmax ``idx``. Rows
    narrower than 16 bytes take torch's zeros and scatter."""
    n_cols, n_rows = shape[-1], idx.numel()
    a = 16 // dv.element_size()
    if n_rows == 0 or n_cols < a:
        return max_grad_torch(idx, dv, shape)
    dx = torch.empty(shape, dtype=dv.dtype, device=dv.device)
    assert dx.data_ptr() % 16 == 0  # (whole 16-byte packs)
    block = max(min(GRAD_BLOCK, triton_support.next_pow2(n_cols)), 16)
    while triton_support.cdiv(n_cols + a, block) > GRID_YZ_LIMIT:
        block *= 2
    grid = (n_rows, triton_support.cdiv(n_cols + a, block))
    _max_grad_kernel[grid](
        dv.contiguous(), idx.contiguous(), dx, n_rows, n_cols, BLOCK=block, A=a, num_warps=4
    )
    return dx


max_triton = max_backend("triton", max_rows, triton=True, grad=max_grad)


def kernel_specs(dtype: str, write_vals: bool = True, n_cols: int = 4096):
    """For `kernellab asm`: the kernel as launched for rows of ``n_cols`` elements (4096:
    one row a program, 16-byte loads)."""
    elem = {"fp32": 4, "fp16": 2, "bf16": 2}[dtype]
    block, rows, warps, a, shifted = _launch_config(n_cols, elem)
    sig = {"x_ptr": f"*{dtype}", "val_ptr": f"*{dtype}", "idx_ptr": "*i64", "n_rows": "i32", "n_cols": "i32",
           "total": "i64"}  # fmt: skip
    sig.update({k: "constexpr" for k in ("BLOCK", "ROWS", "WRITE_VALS", "A", "SHIFTED")})
    cx = {"BLOCK": block, "ROWS": rows, "WRITE_VALS": write_vals, "A": a, "SHIFTED": shifted}
    return [(_max_rows_kernel, sig, cx, warps)]


DESCRIPTION = "Triton: long rows streamed with per-lane running (value, index, first NaN), 16-byte loads"

register_triton("max", max_triton, kernel_specs, DESCRIPTION)
