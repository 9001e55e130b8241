"""Cross-entropy in Triton: kernels, launchers, the op kit's declaration (_fused), registration.

Forward: one program per row streams the row once in BLOCK-wide chunks with the
online-softmax recurrence (running max m and sum s of exp(x - m), s rescaled by
exp(m_old - m_new) when the max grows: one exp per element), loads the target logit
directly, and writes loss = m + log(s) - x[t] and lse = m + log(s) as a pair hi + lo
(fp32, [2, N]: see the kernel).
Traffic: N*V*es read + ~16 N bytes; the softmax is never stored.

Backward: one program per row reads the row again and writes
dx = g * (exp(x - lse) - [j == t]): 1 read + 1 write per element, any reduction (the
per-row scale g comes from autograd, see _fused.py). Ignored rows write zeros without
reading the logits.
"""

from __future__ import annotations

import torch
import triton.language as tl

from kernellab import triton_support
from kernellab.ops._register import register_triton
from kernellab.ops.cross_entropy._fused import fused_backend, lse_rows

BLOCK_MAX = 4096  # columns per chunk: 16 fp32 / 8-16 elements per thread at 8 warps
REDUCE_BLOCK = 1024  # rows per step of the "sum" / "mean" kernel


@triton_support.jit
def _ce_fwd_kernel(x_ptr, t_ptr, loss_ptr, lse_ptr, n_cols, ignore_index, BLOCK: tl.constexpr):
    # x: contiguous [N, n_cols] (fp32/fp16/bf16); t: int64 [N]; loss, lse: fp32 [N].
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * n_cols
    cols = tl.arange(0, BLOCK)
    m = tl.max(tl.full([BLOCK], -float("inf"), tl.float32), axis=0)  # running max
    s = tl.sum(tl.zeros([BLOCK], tl.float32), axis=0)  # running sum of exp(x - m)
    for start in range(0, n_cols, BLOCK):
        mask = start + cols < n_cols
        x = tl.load(x_row + start + cols, mask=mask, other=-float("inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        # -inf entries contribute 0 (no -inf - -inf = NaN while the row is still all -inf);
        # NaN and +inf propagate to NaN, as in PyTorch.
        e = tl.where(x == -float("inf"), 0.0, tl.exp(x - m_new))
        alpha = tl.where(m == m_new, 1.0, tl.exp(m - m_new))
        s = s * alpha + tl.sum(e, axis=0)
        m = m_new
    # lse as an unevaluated sum hi + lo (TwoSum of m and log s): one fp32 lse rounds away
    # up to half an ulp of m + log s, which the backward's exp(x - lse) turns into a
    # relative error of p that misses the 2x-PyTorch rule at small V (PyTorch keeps x - m
    # and log s apart). lse_ptr holds [2, N]: hi in row 0, lo in row 1.
    log_s = tl.log(s)
    hi = m + log_s
    bb = hi - m
    lo = (m - (hi - bb)) + (log_s - bb)
    lo = tl.where(hi == hi, lo, 0.0)  # inf / NaN rows: lo is meaningless, keep hi's value
    lo = tl.where((hi == float("inf")) | (hi == -float("inf")), 0.0, lo)
    t = tl.load(t_ptr + row)
    in_range = (t >= 0) & (t < n_cols)
    xt = tl.load(x_row + tl.where(in_range, t, 0)).to(tl.float32)
    # Out-of-range targets give NaN and are never read out of bounds (the check that raises
    # for them reads _stats_kernel's flag, queued before this one).
    loss = tl.where(in_range, (hi - xt) + lo, float("nan"))
    loss = tl.where(t == ignore_index, 0.0, loss)
    tl.store(loss_ptr + row, loss)
    tl.store(lse_ptr + row, hi)
    if x_ptr.dtype.element_ty == tl.float32:  # 16-bit logits keep hi alone (see _fused)
        tl.store(lse_ptr + tl.num_programs(0) + row, lo)


@triton_support.jit
def _stats_kernel(
    t_ptr, out_ptr, flag_ptr, n_rows, n_cols, ignore_index, BLOCK: tl.constexpr, FLAG: tl.constexpr
):
    # One program: out[0] = 1 if a target is neither ignore_index nor in [0, n_cols), else 0;
    # out[1] = the number of targets != ignore_index (see _fused: the range check and the
    # "mean" divisor); with FLAG, out[0] also to flag_ptr (a mapped host slot).
    offs = tl.arange(0, BLOCK)
    bad = tl.zeros([BLOCK], tl.int32)
    count = tl.zeros([BLOCK], tl.int32)
    for start in range(0, n_rows, BLOCK):
        t = tl.load(t_ptr + start + offs, mask=start + offs < n_rows, other=ignore_index)
        bad = bad | ((t != ignore_index) & ((t < 0) | (t >= n_cols))).to(tl.int32)
        count += (t != ignore_index).to(tl.int32)
    flag = tl.max(bad, axis=0)
    tl.store(out_ptr, flag)
    tl.store(out_ptr + 1, tl.sum(count, axis=0))
    if FLAG:
        tl.store(flag_ptr, flag)


@triton_support.jit
def _reduce_kernel(t_ptr, loss_ptr, out_ptr, count_ptr, n_rows, ignore_index, BLOCK: tl.constexpr,
                   MEAN: tl.constexpr):  # fmt: skip
    # One program, after the forward: out[0] = sum of the row losses, / the number of
    # targets != ignore_index with MEAN (0 / 0 = NaN when all are ignored), rounded once to
    # out's dtype; count_ptr[0] = that number as fp32 (the backward's divisor). The sum is
    # kept in fp64: in fp32 its partial sums (N x the mean) round at N times the mean's
    # ulp, which the division carries into the mean as an error of a few of its ulps.
    offs = tl.arange(0, BLOCK)
    total = tl.zeros([BLOCK], tl.float64)
    count = tl.zeros([BLOCK], tl.int32)
    for start in range(0, n_rows, BLOCK):
        ok = start + offs < n_rows
        total += tl.load(loss_ptr + start + offs, mask=ok, other=0.0).to(tl.float64)
        t = tl.load(t_ptr + start + offs, mask=ok, other=ignore_index)
        count += (t != ignore_index).to(tl.int32)
    s = tl.sum(total, axis=0)
    n = tl.sum(count, axis=0)
    if MEAN:
        s = s / n.to(tl.float64)
    tl.store(out_ptr, s.to(tl.float32).to(out_ptr.dtype.element_ty))  # 16-bit: rounded through fp32
    tl.store(count_ptr, n.to(tl.float32))


@triton_support.jit
def _ce_bwd_kernel(x_ptr, t_ptr, lse_ptr, g_ptr, g_stride, dx_ptr, n_cols, ignore_index, BLOCK: tl.constexpr):
    # x, dx: contiguous [N, n_cols] (dx may alias x: each element is loaded before it is
    # stored, by the same program); t: int64 [N]; lse, g: fp32 [N].
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * n_cols
    dx_row = dx_ptr + row * n_cols
    cols = tl.arange(0, BLOCK)
    t = tl.load(t_ptr + row)
    if t == ignore_index:
        for start in range(0, n_cols, BLOCK):
            mask = start + cols < n_cols
            tl.store(
                dx_row + start + cols, tl.zeros([BLOCK], tl.float32).to(dx_ptr.dtype.element_ty), mask=mask
            )
    else:
        lse = tl.load(lse_ptr + row)  # hi; lo in row 1 of a [2, N] lse (fp32 logits only)
        lo = 0.0
        if x_ptr.dtype.element_ty == tl.float32:
            lo = tl.load(lse_ptr + tl.num_programs(0) + row)
        g = tl.load(g_ptr + row * g_stride)  # g_stride 0: one scale for every row
        # A target neither ignored nor in [0, n_cols) (unchecked: check_targets=False, or the
        # GPU default) has a NaN loss; its row's gradient is NaN too, not a softmax.
        g = tl.where((t >= 0) & (t < n_cols), g, float("nan"))
        for start in range(0, n_cols, BLOCK):
            mask = start + cols < n_cols
            x = tl.load(x_row + start + cols, mask=mask, other=0.0).to(tl.float32)
            p = tl.exp((x - lse) - lo)
            d = tl.where(start + cols == t, p - 1.0, p)
            tl.store(dx_row + start + cols, (g * d).to(dx_ptr.dtype.element_ty), mask=mask)


def _config(n_cols: int):
    """(BLOCK, num_warps): a whole row in one chunk up to BLOCK_MAX columns."""
    if type(n_cols) is not int:  # symbolic (dynamic shapes under torch.compile): BLOCK needs a value
        n_cols = int(n_cols)
    block = min(triton_support.next_pow2(max(n_cols, 1)), BLOCK_MAX)
    return block, 8 if block >= 2048 else 4


def _fwd(logits: torch.Tensor, target: torch.Tensor, ignore_index: int):
    n, v = logits.shape
    loss = torch.empty(n, dtype=torch.float32, device=logits.device)
    lse = torch.empty((lse_rows(logits.dtype), n), dtype=torch.float32, device=logits.device)
    if n:
        block, warps = _config(v)
        _ce_fwd_kernel[(n,)](
            logits,
            target,
            loss,
            lse,
            v,
            ignore_index,
            BLOCK=block,
            num_warps=warps,
        )
    return loss, lse


def _bwd(logits, target, lse, scale, ignore_index, out) -> None:
    n, v = logits.shape
    if n:
        block, warps = _config(v)
        _ce_bwd_kernel[(n,)](
            logits, target, lse, scale, scale.stride(0), out, v, ignore_index, BLOCK=block, num_warps=warps
        )


class _Address:
    """A raw device address as a Triton pointer argument (Triton takes any object with
    ``data_ptr()`` and ``dtype``)."""

    __slots__ = ("ptr",)
    dtype = torch.int32

    def __init__(self, ptr: int):
        self.ptr = ptr

    def data_ptr(self) -> int:
        return self.ptr


def _stats(target: torch.Tensor, n_cols: int, ignore_index: int, out: torch.Tensor, flag_ptr: int = 0):
    flag = _Address(flag_ptr) if flag_ptr else out
    _stats_kernel[(1,)](
        target, out, flag, target.shape[0], n_cols, ignore_index, BLOCK=1024, FLAG=bool(flag_ptr), num_warps=4
    )


def _reduce(target, loss_rows, out, count, ignore_index: int, mean: bool) -> None:
    _reduce_kernel[(1,)](target, loss_rows, out, count, target.shape[0], ignore_index, BLOCK=REDUCE_BLOCK,
                         MEAN=mean, num_warps=4)  # fmt: skip


# On a GPU the ops are triton_ops: under torch.compile Inductor traces _fwd / _bwd and
# launches _ce_fwd_kernel / _ce_bwd_kernel itself. _stats (the range check's kernel,
# which writes a raw host address) and _reduce run only in eager mode, outside the ops (_fused).
cross_entropy_triton = fused_backend(
    "cross_entropy_triton", _fwd, _bwd, _stats, triton=True, reduce_fn=_reduce
)


def _kernel_specs(dtype: str):
    """For `kernellab asm`: both kernels as launched for a 50304-wide vocabulary."""
    block, warps = _config(50304)
    cx = {"BLOCK": block}
    fwd = {
        "x_ptr": f"*{dtype}",
        "t_ptr": "*i64",
        "loss_ptr": "*fp32",
        "lse_ptr": "*fp32",
        "n_cols": "i32",
        "ignore_index": "i32",
        "BLOCK": "constexpr",
    }
    bwd = {
        "x_ptr": f"*{dtype}",
        "t_ptr": "*i64",
        "lse_ptr": "*fp32",
        "g_ptr": "*fp32",
        "g_stride": "i32",
        "dx_ptr": f"*{dtype}",
        "n_cols": "i32",
        "ignore_index": "i32",
        "BLOCK": "constexpr",
    }
    return [(_ce_fwd_kernel, fwd, cx, warps), (_ce_bwd_kernel, bwd, cx, warps)]


register_triton(
    "cross_entropy",
    cross_entropy_triton,
    _kernel_specs,
    "Triton: one program per row, online log-sum-exp; backward recomputes softmax from lse",
)
