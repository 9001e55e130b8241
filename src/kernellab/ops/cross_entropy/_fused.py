"""Plumbing shared by the fused backends (Triton, CUDA): custom ops, autograd, the eager
fast path and the reduction.

A backend supplies three launchers over contiguous tensors:

- ``fwd(logits, target, ignore_index) -> (loss_rows, lse)``: per-row loss (0 on ignored rows),
  fp32 [N], and log-sum-exp, fp32 [lse_rows(dtype), N]: for fp32 logits an unevaluated
  pair (lse = lse[0] + lse[1]: one rounded fp32 lse cost the backward up to half an ulp of
  |lse| in every exp(x - lse), which failed the 2x-PyTorch rule for fp32 at small V), for
  16-bit logits lse[0] alone (their dx rounds far coarser); one read of the logits. A row
  whose target is neither ignore_index nor in [0, V) gets a NaN loss (never an address).
- ``bwd(logits, target, lse, scale, ignore_index, out) -> None``: writes
  ``out = scale[:, None] * (exp((logits - lse[0]) - lse[1]) - onehot(target))`` (0 on ignored rows) in the
  logits' dtype; ``scale`` is fp32 [N] with any stride (stride 0: the "mean" and "sum"
  reductions' one scale, never copied to N floats). ``out`` may be ``logits`` itself (in-place backward):
  each element is read before it is written, by the same thread.
- ``stats(target, V, ignore_index, out, flag_ptr) -> None``: one small kernel that writes
  ``out`` (int32 [2]) = [1 if a target is neither ignore_index nor in [0, V) else 0, the
  number of targets != ignore_index], and the flag also to the device address ``flag_ptr``
  (a mapped host slot) unless it is 0.

The range check: the stats kernel is queued on the current stream with a mapped host
slot for its flag, and an event right after it; the forward and the reduction are queued
behind them, and only then does the host wait, for that event alone. So the GPU's
timeline gains the stats kernel (one block over N targets) and nothing else, and the
host waits only until the GPU has reached the check, not the end of the forward. A bad
target then raises ValueError naming ``target`` (the outputs of this call are dropped).
Measured on the H100 at bf16 8192 x 50304 (forward, check vs none): a flag written by
the forward and read after it cost 0.08 ms of 0.38 ms (the GPU idled while the host came
back after the sync); a check kernel with the copy on the same stream 0.016 ms; the copy
on a side stream up to 0.033 ms; the mapped flag nothing measurable (see PendingCheck).

The reduction ("none" / "sum" / "mean") is done by PyTorch on the N per-row losses, so the
per-row scale of the backward comes out of autograd for every reduction (dy, dy broadcast,
dy / count) and one backward kernel serves all three; its cost is a few tiny kernels on N
floats. The row count for "mean" is the stats kernel's (on the device, no sync; under
torch.compile a PyTorch sum that Inductor fuses).
"""

from __future__ import annotations

import itertools
import os

import torch
from torch import Tensor

# The debug switch for the default call's range check on a GPU (see cross_entropy/__init__).
CHECK_ON_GPU = os.environ.get("KERNELLAB_CHECK_TARGETS", "0") not in ("", "0")


def lse_rows(dtype: torch.dtype) -> int:
    """Rows of the saved lse: 2 (hi, lo) for fp32 logits, 1 for 16-bit ones."""
    return 2 if dtype == torch.float32 else 1


def _tracing() -> bool:
    return torch.compiler.is_compiling()


def check_targets(logits: Tensor, target: Tensor, ignore_index: int) -> None:
    """ValueError naming ``target`` when a target is neither ignore_index nor in [0, V).

    PyTorch ops on the targets: three tiny kernels (where, aminmax, stack) and one
    device->host copy, which on a GPU waits for everything queued before it (122 us per
    call measured on an H100 inside the bench loop). The backends without a fused kernel
    call it on every eager call; the fused backends only after their check kernel flagged
    a target, to find it."""
    n, v = logits.shape
    if not n:
        return
    lo, hi = torch.stack(torch.aminmax(torch.where(target == ignore_index, 0, target))).tolist()
    if lo < 0 or hi >= v:
        bad = ((target < 0) | (target >= v)) & (target != ignore_index)
        first = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"cross_entropy: target[{first}] = {int(target[first])} is out of range: targets must be "
            f"in [0, {v}) or equal ignore_index ({ignore_index})"
        )


class _Mailbox:
    """Range-check flags on their way to the host, per device: a ring of int32 slots in
    mapped page-locked memory (``runtime.mapped_host_int32``) that the stats kernel writes
    directly. A slot is set to -1 ("not written") before its kernel is queued."""

    SLOTS = 256

    def __init__(self, device_index: int):
        from kernellab.cuda.runtime import mapped_host_int32

        self.host, self.dev_ptr = mapped_host_int32(self.SLOTS, device_index)
        self.events = [torch.cuda.Event() for _ in range(self.SLOTS)]
        self._next = itertools.count()

    def take(self) -> int:
        i = next(self._next) % self.SLOTS  # itertools.count: one atomic step under the GIL
        self.host[i] = -1
        return i


_MAILBOXES: dict = {}


class PendingCheck:
    """The range check's flag on its way to the host.

    On a GPU the stats kernel stores the flag into a mapped host slot (``flag_ptr``) as
    well as into ``stats[0]``; an event is recorded right after it on the current stream,
    and ``flag()`` waits for that event alone, so the forward queued behind it never
    waits and no copy is involved. The host cost per call is what changed (H100, bf16
    8192 x 50304 forward, bench host_us): cuda 164 -> 114 us, triton 293 -> 147 us against
    a side stream copying ``stats[0]`` into fresh pinned memory; each call waits for its
    own check, so a host slower than the GPU shows up in the timing (an earlier official
    run measured the side-stream check 0.033 ms slower than no check; this design
    measured 0.2976 against 0.2981 ms). On the CPU ``flag()`` reads ``stats[0]``."""

    __slots__ = ("box", "slot", "flag_ptr", "stats")

    def __init__(self, target: Tensor):
        self.box = self.stats = None
        self.slot, self.flag_ptr = -1, 0
        if target.is_cuda:
            dev = target.device.index if target.device.index is not None else torch.cuda.current_device()
            box = _MAILBOXES.get(dev)
            if box is None:
                box = _MAILBOXES[dev] = _Mailbox(dev)
            self.box, self.slot = box, box.take()
            self.flag_ptr = box.dev_ptr + 4 * self.slot

    def started(self, stats: Tensor) -> None:
        """Called right after the stats kernel was queued."""
        self.stats = stats
        if self.box is not None:
            self.box.events[self.slot].record()

    def flag(self) -> int:
        """1: a target is out of range; 0: none is; -1: the flag never arrived (the
        caller then runs the full check rather than trust it)."""
        if self.box is None:
            return int(self.stats[0])
        self.box.events[self.slot].synchronize()
        return int(self.box.host[self.slot])


def target_stats(stats_fn, target: Tensor, n_cols: int, ignore_index: int, pending=None) -> Tensor:
    """int32 [2]: [bad-target flag, count of targets != ignore_index] from the backend's
    stats kernel (zeros for an empty batch); with ``pending`` the kernel also stores the
    flag into its host slot."""
    if not target.shape[0]:
        return torch.zeros(2, dtype=torch.int32, device=target.device)
    out = torch.empty(2, dtype=torch.int32, device=target.device)
    stats_fn(target, n_cols, ignore_index, out, pending.flag_ptr if pending is not None else 0)
    if pending is not None:
        pending.started(out)
    return out


def start_check(target: Tensor) -> PendingCheck | None:
    """A pending range check for ``target``, or None where no waiting is allowed (a CUDA
    graph being captured: the check is skipped, as under torch.compile)."""
    if target.is_cuda and torch.cuda.is_current_stream_capturing():
        return None
    return PendingCheck(target)


def finish_check(pending: PendingCheck | None, logits: Tensor, target: Tensor, ignore_index: int) -> None:
    """Wait for the flag; ValueError naming ``target`` when it is set."""
    if pending is None:
        return
    flag = pending.flag()
    if flag:
        check_targets(logits, target, ignore_index)  # finds the row and raises
        if flag == 1:
            raise ValueError("cross_entropy: a target is out of range (neither ignore_index nor in [0, V))")


def reduce_rows(
    loss_rows: Tensor, target: Tensor, ignore_index: int, reduction: str, dtype, count=None
) -> Tensor:
    if reduction == "none":
        return loss_rows.to(dtype)
    if reduction == "sum":
        return loss_rows.sum().to(dtype)
    if count is None:
        count = (target != ignore_index).sum()
    return (loss_rows.sum() / count).to(dtype)  # all ignored: 0 / 0 = NaN, as PyTorch


def fused_backend(name: str, fwd, bwd, stats_fn):
    """Custom ops ``kernellab::<name>_fwd`` / ``_bwd`` and the registry callable."""

    def _fwd(logits: Tensor, target: Tensor, ignore_index: int) -> tuple[Tensor, Tensor]:
        return fwd(logits.contiguous(), target.contiguous(), ignore_index)  # no range check: traced

    def _bwd(logits: Tensor, target: Tensor, lse: Tensor, scale: Tensor, ignore_index: int) -> Tensor:
        logits = logits.contiguous()
        out = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        bwd(logits, target.contiguous(), lse, scale.float().contiguous(), ignore_index, out)
        return out

    op = torch.library.custom_op(f"kernellab::{name}_fwd", _fwd, mutates_args=())
    bop = torch.library.custom_op(f"kernellab::{name}_bwd", _bwd, mutates_args=())

    @op.register_fake
    def _(logits, target, ignore_index):
        n = logits.shape[0]
        return (
            logits.new_empty((n,), dtype=torch.float32),
            logits.new_empty((lse_rows(logits.dtype), n), dtype=torch.float32),
        )

    @bop.register_fake
    def _(logits, target, lse, scale, ignore_index):
        return torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)

    def setup_context(ctx, inputs, output):
        logits, target, ignore_index = inputs
        ctx.save_for_backward(logits, target, output[1])
        ctx.ignore_index = ignore_index

    def backward(ctx, g_loss, g_lse):
        logits, target, lse = ctx.saved_tensors
        return bop(logits, target, lse, g_loss, ctx.ignore_index), None, None

    op.register_autograd(backward, setup_context=setup_context)

    class Eager(torch.autograd.Function):
        @staticmethod
        def forward(ctx, logits, target, ignore_index, inplace):
            lc, tc = logits.contiguous(), target.contiguous()
            loss_rows, lse = fwd(lc, tc, ignore_index)
            # In place, the logits are saved as a detached alias: after this node's saved
            # tensors are released, the returned gradient is the only reference to that
            # alias, and autograd's AccumulateGrad then adopts it as .grad instead of
            # cloning it (saving ``logits`` itself, also held by the caller, made it clone:
            # a logits-sized copy, the memory the option exists to avoid).
            ctx.save_for_backward(lc.detach() if inplace else lc, tc, lse)
            ctx.ignore_index, ctx.inplace = ignore_index, inplace
            ctx.mark_non_differentiable(lse)
            # No zeros for the lse's (never used) gradient: autograd would otherwise
            # materialize an [rows, N] fp32 tensor of them for every backward.
            ctx.set_materialize_grads(False)
            return loss_rows, lse

        @staticmethod
        def backward(ctx, g_loss, g_lse):
            if torch.is_grad_enabled():  # create_graph=True: the fused backward has no derivative
                raise RuntimeError(
                    f"cross_entropy ({name}): double backward (create_graph=True) is not supported by "
                    "this backend (its backward is a fused kernel); use backend='torch' or 'manual'"
                )
            if g_loss is None:  # the loss was not used: no gradient to give
                return None, None, None, None
            lc, tc, lse = ctx.saved_tensors
            # In place: dlogits overwrite the (contiguous) logits; they are returned as
            # the gradient, so no logits-sized buffer is allocated.
            out = lc if ctx.inplace else torch.empty(lc.shape, dtype=lc.dtype, device=lc.device)
            g = g_loss.float()  # [N]; stride 0 when it is one scale broadcast ("mean", "sum")
            bwd(lc, tc, lse, g if g.stride(0) in (0, 1) else g.contiguous(), ctx.ignore_index, out)
            return out, None, None, None

    def call(logits, target, ignore_index=-100, reduction="mean", inplace_backward=False, check_targets=None):
        # The target range check runs beside the forward (see the module docstring); under
        # torch.compile, with check_targets=False, or by default on a GPU (None, unless
        # KERNELLAB_CHECK_TARGETS=1), it is skipped (no host sync) and an out-of-range
        # target gives a NaN loss for its row.
        if check_targets is None:
            check_targets = CHECK_ON_GPU or not logits.is_cuda
        if _tracing():
            loss_rows, _ = op(logits, target, ignore_index)
            return reduce_rows(loss_rows, target, ignore_index, reduction, logits.dtype)
        tc = target.contiguous()
        stats = None
        pending = start_check(tc) if check_targets and tc.shape[0] else None
        if pending is not None or reduction == "mean":
            stats = target_stats(stats_fn, tc, logits.shape[1], ignore_index, pending)
        if logits.requires_grad and torch.is_grad_enabled():
            loss_rows, _ = Eager.apply(logits, tc, ignore_index, inplace_backward)
        else:
            loss_rows, _ = fwd(logits.contiguous(), tc, ignore_index)
        count = stats[1] if reduction == "mean" else None
        out = reduce_rows(loss_rows, target, ignore_index, reduction, logits.dtype, count)
        finish_check(pending, logits, target, ignore_index)
        return out

    def _fwd_args(make):
        logits, target = make.args(1)
        return (logits, target, -100)

    def _bwd_args(make):
        logits, target = make.args(0)
        _, lse = _fwd(logits, target, -100)
        scale = torch.randn(logits.shape[0], device=logits.device)
        return (logits, target, lse, scale, -100)

    call.custom_ops = [(op, _fwd_args, True), (bop, _bwd_args, False)]
    call.__name__ = name
    return call
