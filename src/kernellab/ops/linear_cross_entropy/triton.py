"""linear_cross_entropy in Triton: the row kernel, its launcher, the chunked declaration
(_chunked), registration.

The matmuls are cuBLAS's (torch.mm in the chunk loop); the kernel does what sits between
them: one program per row of a chunk's fp32 logits z [C, V] streams the row once in
BLOCK-wide pieces with the online-softmax recurrence (running max m and sum s of
exp(z - m)) and the row sum (label smoothing), writes the row's loss, and with
WRITE_GRAD streams the row again and overwrites it with g * dloss/dz. Traffic per chunk:
2 reads + 1 write of C * V fp32 against PyTorch ops' ~8 passes (logsumexp, gather, sub,
exp, mul, sub, scatter, mul) in the ``chunked`` backend.

The loss is formed as PyTorch's log_softmax forms it, from z - m and log s kept apart:
loss = log s - (1 - eps)(z_t - m) - eps (mean_j z_j - m) + zc (m + log s)^2, so a row with
+inf logits gives NaN as PyTorch does, and p = exp((z - m) - log s) carries no rounding
of a summed lse (at |lse| ~ 10 one fp32 ulp of it is a 1e-6 relative error in every p).
"""

from __future__ import annotations

import triton.language as tl

from kernellab import triton_support
from kernellab.ops.linear_cross_entropy import OP
from kernellab.ops.linear_cross_entropy._chunked import chunked_backend

BLOCK_MAX = 4096  # columns per piece: 16 fp32 per thread at 8 warps


@triton_support.jit
def _lce_rows_kernel(
    z_ptr, t_ptr, g_ptr, loss_ptr, n_cols, ignore_index, eps, zc,
    HAS_G: tl.constexpr, WRITE_GRAD: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    # z: fp32 contiguous [C, n_cols], overwritten by the gradient with WRITE_GRAD; t: int64
    # [C] (in range or ignore_index: the callable checked; an out-of-range one is never
    # used as an address, it gives NaN); g: fp32 [C] per-row scale (HAS_G) ; loss: fp32 [C].
    row = tl.program_id(0).to(tl.int64)
    z_row = z_ptr + row * n_cols
    cols = tl.arange(0, BLOCK)
    m = tl.max(tl.full([BLOCK], -float("inf"), tl.float32), axis=0)
    s = tl.sum(tl.zeros([BLOCK], tl.float32), axis=0)
    tot = tl.sum(tl.zeros([BLOCK], tl.float32), axis=0)
    for start in range(0, n_cols, BLOCK):
        mask = start + cols < n_cols
        z = tl.load(z_row + start + cols, mask=mask, other=-float("inf"))
        m_new = tl.maximum(m, tl.max(z, axis=0))
        # -inf entries add 0 (no -inf - -inf = NaN while the row is all -inf so far)
        e = tl.where(z == -float("inf"), 0.0, tl.exp(z - m_new))
        alpha = tl.where(m == m_new, 1.0, tl.exp(m - m_new))
        s = s * alpha + tl.sum(e, axis=0)
        m = m_new
        tot += tl.sum(tl.where(mask, z, 0.0), axis=0)
    log_s = tl.log(s)
    lse = m + log_s
    t = tl.load(t_ptr + row)
    keep = t != ignore_index
    in_range = (t >= 0) & (t < n_cols)
    zt = tl.load(z_row + tl.where(in_range, t, 0))
    loss = log_s - (1.0 - eps) * (zt - m)
    # (a zero coefficient adds nothing: 0 * inf would be NaN)
    loss += tl.where(eps != 0.0, -eps * (tot / n_cols - m), 0.0)
    loss += tl.where(zc != 0.0, zc * lse * lse, 0.0)
    loss = tl.where(in_range, loss, float("nan"))
    tl.store(loss_ptr + row, tl.where(keep, loss, 0.0))
    if WRITE_GRAD:
        g = 1.0
        if HAS_G:
            g = tl.load(g_ptr + row)
        g = tl.where(in_range, g, float("nan"))
        c1 = tl.where(zc != 0.0, 1.0 + 2.0 * zc * lse, 1.0)
        for start in range(0, n_cols, BLOCK):
            mask = start + cols < n_cols
            z = tl.load(z_row + start + cols, mask=mask, other=0.0)
            p = tl.exp((z - m) - log_s)
            d = p * c1 - eps / n_cols
            d = tl.where(start + cols == t, d - (1.0 - eps), d)
            tl.store(z_row + start + cols, tl.where(keep, g * d, 0.0), mask=mask)


def _config(n_cols: int):
    """(BLOCK, num_warps): a whole row in one piece up to BLOCK_MAX columns."""
    if type(n_cols) is not int:  # symbolic under torch.compile: BLOCK needs a value
        n_cols = int(n_cols)
    block = min(triton_support.next_pow2(max(n_cols, 1)), BLOCK_MAX)
    return block, 8 if block >= 2048 else 4


def _rows(z, t, g, loss, ignore_index, eps, zc, write_grad) -> None:
    c, v = z.shape
    if not c:
        return
    block, warps = _config(v)
    _lce_rows_kernel[(c,)](
        z, t, g if g is not None else loss, loss, v, ignore_index, float(eps), float(zc),
        HAS_G=g is not None, WRITE_GRAD=bool(write_grad), BLOCK=block, num_warps=warps,
    )  # fmt: skip


# On a GPU the ops are triton_ops: under torch.compile Inductor traces the chunk loop (the
# matmuls as aten ops, _lce_rows_kernel through wrap_triton) and launches it itself.
linear_cross_entropy_triton = chunked_backend("linear_cross_entropy_triton", _rows, triton=True)


def _kernel_specs(dtype: str):
    """For `kernellab asm`: the row kernel as launched for a 128256-wide vocabulary (its
    logits are fp32 whatever the op's dtype)."""
    block, warps = _config(128256)
    sig = {
        "z_ptr": "*fp32",
        "t_ptr": "*i64",
        "g_ptr": "*fp32",
        "loss_ptr": "*fp32",
        "n_cols": "i32",
        "ignore_index": "i32",
        "eps": "fp32",
        "zc": "fp32",
        "HAS_G": "constexpr",
        "WRITE_GRAD": "constexpr",
        "BLOCK": "constexpr",
    }
    return [(_lce_rows_kernel, sig, {"HAS_G": False, "WRITE_GRAD": True, "BLOCK": block}, warps)]


triton_support.register_triton(
    OP,
    linear_cross_entropy_triton,
    _kernel_specs,
    "Triton: rows in chunks; cuBLAS logits, one kernel for loss and dlogits in place, cuBLAS dx, dW",
)
