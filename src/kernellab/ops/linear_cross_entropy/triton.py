"""linear_cross_entropy in Triton: the two row kernels of the blocked runner
(_chunked.run_blocks), their launchers, registration; and ``triton_rows``, the same two
kernels over row chunks (_chunked.run_chunks).

The matmuls are cuBLAS's; the kernels do what sits between them. The vocabulary is taken
in column blocks of 16M-64M logits (_chunked.block_cols). Pass 1, per block: fp32 logits
[C, B] from one matmul, and _lce_stats_kernel folds them into each row's online-softmax state (running max
m and sum s of exp(z - m)), row sum (label smoothing) and target logit. The loss of a row
follows from those. Pass 2, per block: the logits again, _lce_grad_kernel writes
g * dloss/dz in x's dtype, then dx += d @ W[block] (fp32) and dweight[block] = d^T @ x
(one product over the rows, rounded once). Against one pass over row chunks with an fp32
[V, H] dweight accumulator, this spends one more logits matmul and saves the accumulator's
read and write per chunk (memory-bound at thin chunks: 0.5 ms per chunk at V=128256, H=2048
on an H100) and its V*H*4 bytes.

The loss is formed from the row state as PyTorch's log_softmax forms it (_chunked.row_loss:
z - m and log s kept apart), so a row with +inf logits gives NaN as PyTorch does, and the
gradient kernel's p = exp((z - m) - log s) carries no rounding of a summed lse (at
|lse| ~ 10 one fp32 ulp of it is a 1e-6 relative error in every p).

``triton_rows`` takes the rows a chunk at a time with the whole vocabulary (``rows_chunk``:
up to 2^28 logits and max(N / 16, 2 H / 3) rows a chunk) and computes each chunk's logits
once: the statistics kernel over the full rows, the loss, the gradient kernel writing
dlogits in x's dtype, then dx[chunk] = d @ W and dweight += d^T @ x[chunk] into an fp32
[V, H] accumulator. Three products where ``triton`` makes four, for one read and write of
the accumulator per chunk; the chunked backend's order (Liger's), with two passes over a
chunk's logits instead of PyTorch's elementwise ops.
"""

from __future__ import annotations

import torch
import triton.language as tl

from kernellab import triton_support
from kernellab.ops._register import register_triton
from kernellab.ops.linear_cross_entropy._chunked import chunked_backend, rows_chunk, torch_reduce
from kernellab.ops.linear_cross_entropy.targets import OP

BLOCK_MAX = 4096  # columns per piece: 16 fp32 per thread at 8 warps


def _config(n_cols: int):
    """(BLOCK, num_warps): a whole row in one piece up to BLOCK_MAX columns."""
    if type(n_cols) is not int:  # symbolic under torch.compile: BLOCK needs a value
        n_cols = int(n_cols)
    block = min(triton_support.next_pow2(max(n_cols, 1)), BLOCK_MAX)
    return block, 8 if block >= 2048 else 4


@triton_support.jit
def _fold(z, m, s):
    """A piece z of a row (-inf where masked) folded into the row's running max m and sum s
    of exp(z - m): (m, s) after it. -inf entries add 0 (no -inf - -inf = NaN while the row
    is all -inf so far)."""
    m_new = tl.maximum(m, tl.max(z, axis=0))
    e = tl.where(z == -float("inf"), 0.0, tl.exp(z - m_new))
    alpha = tl.where(m == m_new, 1.0, tl.exp(m - m_new))
    return m_new, s * alpha + tl.sum(e, axis=0)


@triton_support.jit
def _lce_stats_kernel(
    z_ptr, t_ptr, m_ptr, s_ptr, zt_ptr, tot_ptr, n_cols, v0, BLOCK: tl.constexpr,
):  # fmt: skip
    # One row of a column block z [C, n_cols] fp32 (vocabulary columns v0..v0+n_cols) folded
    # into the row's running max m, sum s of exp(z - m) and row sum tot; zt takes the
    # row's target logit when the target lies in the block (fp32 [C] each, in place).
    row = tl.program_id(0).to(tl.int64)
    z_row = z_ptr + row * n_cols
    cols = tl.arange(0, BLOCK)
    m = tl.load(m_ptr + row)
    s = tl.load(s_ptr + row)
    tot = tl.load(tot_ptr + row)
    for start in range(0, n_cols, BLOCK):
        mask = start + cols < n_cols
        z = tl.load(z_row + start + cols, mask=mask, other=-float("inf"))
        m, s = _fold(z, m, s)
        tot += tl.sum(tl.where(mask, z, 0.0), axis=0)
    tl.store(m_ptr + row, m)
    tl.store(s_ptr + row, s)
    tl.store(tot_ptr + row, tot)
    rel = tl.load(t_ptr + row) - v0
    hit = (rel >= 0) & (rel < n_cols)
    zt = tl.load(z_row + tl.where(hit, rel, 0))
    tl.store(zt_ptr + row, zt, mask=hit)


@triton_support.jit
def _store_dlogits(z_row, d_row, n_cols, t_col, keep, g, m, log_s, c1, eps_v, keep_t, BLOCK: tl.constexpr):
    """A row's dlogits g * (p c1 - eps_v - keep_t [j == t_col]), p = exp((z - m) - log s),
    written over its n_cols columns into d_row in d's dtype; 0 where the row is not kept.
    t_col: the target's column in this block."""
    cols = tl.arange(0, BLOCK)
    for start in range(0, n_cols, BLOCK):
        mask = start + cols < n_cols
        z = tl.load(z_row + start + cols, mask=mask, other=0.0)
        p = tl.exp((z - m) - log_s)
        d = p * c1 - eps_v
        d = tl.where(start + cols == t_col, d - keep_t, d)
        tl.store(d_row + start + cols, tl.where(keep, g * d, 0.0).to(d_row.dtype.element_ty), mask=mask)


@triton_support.jit
def _lce_grad_kernel(
    z_ptr, d_ptr, t_ptr, g_ptr, m_ptr, ls_ptr, n_cols, v0, v_total, ignore_index, eps, zc,
    HAS_G: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    # d = g * dloss/dz of one row of a column block, from the row's m and log s of the
    # statistics pass, in d's dtype.
    row = tl.program_id(0).to(tl.int64)
    z_row = z_ptr + row * n_cols
    d_row = d_ptr + row * n_cols
    m = tl.load(m_ptr + row)
    log_s = tl.load(ls_ptr + row)
    lse = m + log_s
    t = tl.load(t_ptr + row)
    keep = t != ignore_index
    in_range = (t >= 0) & (t < v_total)
    g = 1.0
    if HAS_G:
        g = tl.load(g_ptr + row)
    g = tl.where(in_range, g, float("nan"))
    c1 = tl.where(zc != 0.0, 1.0 + 2.0 * zc * lse, 1.0)
    _store_dlogits(z_row, d_row, n_cols, t - v0, keep, g, m, log_s, c1, eps / v_total, 1.0 - eps, BLOCK)


@triton_support.jit
def _lce_row_kernel(
    z_ptr, d_ptr, t_ptr, g_ptr, loss_ptr, n_cols, ignore_index, eps, keep_t, eps_v, zc,
    HAS_G: tl.constexpr, GRAD: tl.constexpr, SMOOTH: tl.constexpr, ZLOSS: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    # One full row of z [C, n_cols] fp32 in one program: its softmax state (as
    # _lce_stats_kernel), its loss (as _chunked.row_loss: z - m and log s kept apart; NaN
    # for a target out of range, 0 where ignored) into loss, and with GRAD the dlogits
    # g * dloss/dz into d in d's dtype (as _lce_grad_kernel). keep_t = 1 - eps and
    # eps_v = eps / n_cols come rounded once from the host.
    row = tl.program_id(0).to(tl.int64)
    z_row = z_ptr + row * n_cols
    cols = tl.arange(0, BLOCK)
    m = -float("inf")
    s = 0.0
    tot = 0.0
    for start in range(0, n_cols, BLOCK):
        mask = start + cols < n_cols
        z = tl.load(z_row + start + cols, mask=mask, other=-float("inf"))
        m, s = _fold(z, m, s)
        if SMOOTH:
            tot += tl.sum(tl.where(mask, z, 0.0), axis=0)
    t = tl.load(t_ptr + row)
    keep = t != ignore_index
    in_range = (t >= 0) & (t < n_cols)
    zt = tl.load(z_row + tl.where(in_range, t, 0))
    log_s = tl.log(s)
    loss = log_s - keep_t * (zt - m)
    if SMOOTH:
        loss = loss - eps * (tot / n_cols - m)
    lse = m + log_s
    if ZLOSS:
        loss = loss + zc * lse * lse
    loss = tl.where(in_range, loss, float("nan"))
    tl.store(loss_ptr + row, tl.where(keep, loss, 0.0))
    if GRAD:
        d_row = d_ptr + row * n_cols
        g = 1.0
        if HAS_G:
            g = tl.load(g_ptr + row)
        g = tl.where(in_range, g, float("nan"))
        c1 = 1.0
        if ZLOSS:
            c1 = 1.0 + 2.0 * zc * lse
        _store_dlogits(z_row, d_row, n_cols, t, keep, g, m, log_s, c1, eps_v, keep_t, BLOCK)


@triton_support.jit
def _lce_reduce_kernel(
    rows_ptr, t_ptr, out_ptr, scale_ptr, n, v, ignore_index, MODE: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    # One program over the N targets and row losses (fp32). MODE 0 (the target check): out
    # (int64) = the first row whose target is neither ignore_index nor in [0, v), n when
    # none. MODE 1 (mean): out = sum / #kept (NaN when no row is kept), scale = 1 /
    # max(#kept, 1); MODE 2 (sum): out = sum, scale = 1. The sum is fp64, rounded once.
    idx0 = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.float64)
    cnt = tl.zeros([BLOCK], dtype=tl.int32)
    bad = tl.full([BLOCK], n, tl.int64)
    for start in range(0, n, BLOCK):
        idx = start + idx0
        mask = idx < n
        t = tl.load(t_ptr + idx, mask=mask, other=ignore_index)
        keep = t != ignore_index
        if MODE == 0:
            bad = tl.minimum(bad, tl.where(keep & ((t < 0) | (t >= v)), idx, n))
        else:
            acc += tl.load(rows_ptr + idx, mask=mask, other=0.0).to(tl.float64)
            cnt += keep.to(tl.int32)
    if MODE == 0:
        tl.store(out_ptr, tl.min(bad, axis=0))
    else:
        total = tl.sum(acc, axis=0)
        if MODE == 1:
            c = tl.sum(cnt, axis=0).to(tl.float64)
            c1 = tl.maximum(c, 1.0)
            tl.store(out_ptr, tl.where(c > 0, total / c1, float("nan")).to(tl.float32))
            tl.store(scale_ptr, (1.0 / c1).to(tl.float32))
        else:
            tl.store(out_ptr, total.to(tl.float32))
            tl.store(scale_ptr, 1.0)


@triton_support.jit
def _lce_scale_kernel(dx_ptr, dw_ptr, db_ptr, dy_ptr, scale_ptr, nx, nw, nb, BLOCK: tl.constexpr):
    # The eager backward of "mean" / "sum" in one launch: dx, dweight and dbias (same
    # dtype; nb = 0 without a bias) times g = dy * scale, in place, each element computed in
    # fp32 and rounded once. Programs take BLOCK elements of dx, then of dweight, then of dbias.
    pid = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    g = tl.load(dy_ptr).to(tl.float32) * tl.load(scale_ptr)
    bx = tl.cdiv(nx, BLOCK)
    bw = tl.cdiv(nw, BLOCK)
    if pid < bx:
        o = pid * BLOCK + cols
        m = o < nx
        y = tl.load(dx_ptr + o, mask=m).to(tl.float32) * g
        tl.store(dx_ptr + o, y.to(dx_ptr.dtype.element_ty), mask=m)
    elif pid < bx + bw:
        o = (pid - bx) * BLOCK + cols
        m = o < nw
        y = tl.load(dw_ptr + o, mask=m).to(tl.float32) * g
        tl.store(dw_ptr + o, y.to(dw_ptr.dtype.element_ty), mask=m)
    else:
        o = (pid - bx - bw) * BLOCK + cols
        m = o < nb
        y = tl.load(db_ptr + o, mask=m).to(tl.float32) * g
        tl.store(db_ptr + o, y.to(db_ptr.dtype.element_ty), mask=m)


SCALE_BLOCK = 4096


def _scale(dx, dw, db, dy, scale) -> None:
    """dx, dw and db (None: no bias) times dy * scale, in place, in one launch."""
    nx, nw, nb = dx.numel(), dw.numel(), 0 if db is None else db.numel()
    grid = (triton_support.cdiv(nx, SCALE_BLOCK) + triton_support.cdiv(nw, SCALE_BLOCK)
            + triton_support.cdiv(nb, SCALE_BLOCK),)  # fmt: skip
    if grid[0]:
        _lce_scale_kernel[grid](dx, dw, dw if db is None else db, dy, scale, nx, nw, nb, BLOCK=SCALE_BLOCK,
                                num_warps=4)  # fmt: skip
    for t in (dx, dw) if db is None else (dx, dw, db):  # a kernel's write bumps no version counter
        torch.autograd.graph.increment_version(t)


REDUCE_BLOCK = 1024


def _check(t, v: int, ignore_index: int):
    """A 0-d int64 tensor: the first of the targets ``t`` [N] neither ignore_index nor in
    [0, v), N when none (one launch of _lce_reduce_kernel)."""
    bad = torch.empty((), dtype=torch.int64, device=t.device)
    _lce_reduce_kernel[(1,)](t, t, bad, bad, t.shape[0], v, ignore_index, MODE=0, BLOCK=REDUCE_BLOCK,
                             num_warps=4)  # fmt: skip
    return bad


def _reduce(rows, t, ignore_index: int, reduction: str):
    """(loss, scale) from the row losses ``rows`` [N] (one launch of _lce_reduce_kernel for
    "mean" and "sum")."""
    if reduction == "none":
        return torch_reduce(rows, t, ignore_index, reduction)
    out = torch.empty((), dtype=torch.float32, device=rows.device)
    scale = torch.empty_like(out)
    mode = 1 if reduction == "mean" else 2
    _lce_reduce_kernel[(1,)](rows, t, out, scale, rows.shape[0], 0, ignore_index, MODE=mode,
                             BLOCK=REDUCE_BLOCK, num_warps=4)  # fmt: skip
    return out, scale


def _stats(z, t, v0, m, s, zt, tot) -> None:
    c, nb = z.shape
    if not c:
        return
    block, warps = _config(nb)
    _lce_stats_kernel[(c,)](z, t, m, s, zt, tot, nb, v0, BLOCK=block, num_warps=warps)


def _grad(z, d, t, g, m, log_s, v0, v, ignore_index, eps, zc) -> None:
    c, nb = z.shape
    if not c:
        return
    block, warps = _config(nb)
    _lce_grad_kernel[(c,)](
        z, d, t, g if g is not None else m, m, log_s, nb, v0, v, ignore_index, float(eps), float(zc),
        HAS_G=g is not None, BLOCK=block, num_warps=warps,
    )  # fmt: skip


def _rows(z, t, g, loss, ignore_index, eps, zc, write_grad, grad_dtype):
    """``run_chunks``' launcher (_chunked module docstring): one launch of _lce_row_kernel
    over a chunk's full rows writes each row's loss and, with ``write_grad``, the dlogits in
    ``grad_dtype`` (over z for fp32), returned."""
    c, v = z.shape
    d = None
    if write_grad:
        d = z if grad_dtype == torch.float32 else torch.empty(z.shape, dtype=grad_dtype, device=z.device)
    if not c:
        return d
    block, warps = _config(v)
    eps, zc = float(eps), float(zc)
    _lce_row_kernel[(c,)](
        z, z if d is None else d, t, loss if g is None else g, loss, v, ignore_index, eps, 1.0 - eps, eps / v,
        zc, HAS_G=g is not None, GRAD=write_grad, SMOOTH=eps != 0.0, ZLOSS=zc != 0.0, BLOCK=block,
        num_warps=warps,
    )  # fmt: skip
    return d


# On a GPU the ops are triton_ops: under torch.compile Inductor traces the block loop (the
# matmuls as aten ops, the row kernels through wrap_triton) and launches it itself.
linear_cross_entropy_triton = chunked_backend("linear_cross_entropy_triton", _rows, triton=True,
                                              blocks=(_stats, _grad), check=_check, reduce=_reduce,
                                              scale_grads=_scale)  # fmt: skip
linear_cross_entropy_triton_rows = chunked_backend("linear_cross_entropy_triton_rows", _rows, triton=True,
                                                   chunk_rule=rows_chunk, check=_check, reduce=_reduce,
                                                   scale_grads=_scale)  # fmt: skip


def _kernel_specs(dtype: str):
    """For `kernellab asm`: the row kernels as launched on a 4096-column block (fp32 logits
    whatever the op's dtype; dlogits in the op's dtype), and the reduction of the row losses."""
    block, warps = _config(4096)
    d = {"fp32": "*fp32", "fp16": "*fp16", "bf16": "*bf16"}[dtype]
    stats = {"z_ptr": "*fp32", "t_ptr": "*i64", "m_ptr": "*fp32", "s_ptr": "*fp32", "zt_ptr": "*fp32",
             "tot_ptr": "*fp32", "n_cols": "i32", "v0": "i32", "BLOCK": "constexpr"}  # fmt: skip
    grad = {"z_ptr": "*fp32", "d_ptr": d, "t_ptr": "*i64", "g_ptr": "*fp32", "m_ptr": "*fp32", "ls_ptr": "*fp32",
            "n_cols": "i32", "v0": "i32", "v_total": "i32", "ignore_index": "i32", "eps": "fp32", "zc": "fp32",
            "HAS_G": "constexpr", "BLOCK": "constexpr"}  # fmt: skip
    row = {"z_ptr": "*fp32", "d_ptr": d, "t_ptr": "*i64", "g_ptr": "*fp32", "loss_ptr": "*fp32",
           "n_cols": "i32", "ignore_index": "i32", "eps": "fp32", "keep_t": "fp32", "eps_v": "fp32",
           "zc": "fp32", "HAS_G": "constexpr", "GRAD": "constexpr", "SMOOTH": "constexpr",
           "ZLOSS": "constexpr", "BLOCK": "constexpr"}  # fmt: skip
    red = {"rows_ptr": "*fp32", "t_ptr": "*i64", "out_ptr": "*fp32", "scale_ptr": "*fp32", "n": "i32",
           "v": "i32", "ignore_index": "i32", "MODE": "constexpr", "BLOCK": "constexpr"}  # fmt: skip
    sc = {"dx_ptr": d, "dw_ptr": d, "db_ptr": d, "dy_ptr": d, "scale_ptr": "*fp32", "nx": "i32", "nw": "i32",
          "nb": "i32", "BLOCK": "constexpr"}  # fmt: skip
    return [
        (_lce_scale_kernel, sc, {"BLOCK": SCALE_BLOCK}, 4),
        (_lce_stats_kernel, stats, {"BLOCK": block}, warps),
        (_lce_grad_kernel, grad, {"HAS_G": False, "BLOCK": block}, warps),
        (_lce_row_kernel, row, {"HAS_G": False, "GRAD": True, "SMOOTH": False, "ZLOSS": False,
                                "BLOCK": block}, warps),
        (_lce_reduce_kernel, red, {"MODE": 1, "BLOCK": REDUCE_BLOCK}, 4),
    ]


register_triton(
    OP,
    linear_cross_entropy_triton,
    _kernel_specs,
    "Triton: vocabulary in column blocks; cuBLAS logits twice, row-state and dlogits kernels, cuBLAS dx, dW",
)
register_triton(
    OP,
    linear_cross_entropy_triton_rows,
    _kernel_specs,
    "Triton: rows in chunks of the whole vocabulary; cuBLAS logits once, row-state and dlogits kernels, "
    "cuBLAS dx, dW into an fp32 accumulator",
    backend="triton_rows",
)
