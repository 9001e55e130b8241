"""What the fused backends (Triton, CUDA) share: their declaration to the op kit (custom
op or triton_op, autograd, the eager fast path), the range check and the reduction.

A backend supplies three launchers over contiguous tensors:

- ``fwd(logits, target, ignore_index) -> (loss_rows, lse)``: per-row loss (0 on ignored rows),
  fp32 [N], and log-sum-exp, fp32 [lse_rows(dtype), N]: for fp32 logits an unevaluated
  pair (lse = lse[0] + lse[1]: one rounded fp32 lse cost the backward up to half an ulp of
  |lse| in every exp(x - lse), which misses the 2x-PyTorch rule for fp32 at small V), for
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
A flag written by the forward and read after it would idle the GPU while the host comes
back after the sync, and a copy of the flag (same stream or side stream) costs time of its
own; the mapped flag costs nothing measurable (see PendingCheck).

The reduction ("none" / "sum" / "mean") is done by PyTorch on the N per-row losses, so the
per-row scale of the backward comes out of autograd for every reduction (dy, dy broadcast,
dy / count) and one backward kernel serves all three; its cost is a few tiny kernels on N
floats. The row count for "mean" is the stats kernel's (on the device, no sync; under
torch.compile a PyTorch sum that Inductor fuses). A backend with a reduction kernel
(``reduce_fn``, Triton's) does "sum" and "mean" in that kernel instead wherever no check
is waited for (see fused_backend): the eager call is then two launches, as PyTorch's.
"""

from __future__ import annotations

import itertools

import torch
from torch import Tensor

from kernellab.core.kit import OpDecl, build
from kernellab.options import config

# The debug switch for the default call's range check on a GPU (see cross_entropy/__init__).


def lse_rows(dtype: torch.dtype) -> int:
    """Rows of the saved lse: 2 (hi, lo) for fp32 logits, 1 for 16-bit ones."""
    return 2 if dtype == torch.float32 else 1


def check_targets(logits: Tensor, target: Tensor, ignore_index: int) -> None:
    """ValueError naming ``target`` when a target is neither ignore_index nor in [0, V).

    PyTorch ops on the targets: three tiny kernels (where, aminmax, stack) and one
    device->host copy, which on a GPU waits for everything queued before it. The backends
    without a fused kernel call it on every eager call; the fused backends only after their
    check kernel flagged
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
    waits and no copy is involved: less host time per call than a side stream copying
    ``stats[0]`` into fresh pinned memory. Each call waits for its own check, so a host
    slower than the GPU shows up in the timing. On the CPU ``flag()`` reads ``stats[0]``."""

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
    # The sum in fp64: in fp32 its partial sums (up to N x the mean) round at N times the
    # mean's ulp, and the "mean" would carry a few of its own ulps of that error.
    total = loss_rows.sum(dtype=torch.float64)
    if reduction == "sum":
        return total.to(dtype)
    if count is None:
        count = (target != ignore_index).sum()
    return (total / count).to(dtype)  # all ignored: 0 / 0 = NaN, as PyTorch


def fused_backend(name: str, fwd, bwd, stats_fn, triton: bool = False, reduce_fn=None):
    """The registry callable of a fused backend, around its launchers declared once to the
    op kit (kit.build): the ops ``kernellab::<name>`` (logits, target, ignore_index,
    inplace_backward) -> (loss_rows, lse) and ``kernellab::<name>_backward`` (logits,
    target, lse, scale, ignore_index, inplace_backward) -> dlogits (``triton_op``s for a
    Triton backend on a GPU: Inductor launches the kernels itself; ``custom_op`` else),
    their autograd and the eager path.

    What stays out of the ops, in the callable below: the range check (its stats kernel
    writes a mapped host slot through a raw address and the host waits on an event: no
    traced op may do either; under torch.compile the check is skipped, as before), the
    stats kernel's row count for "mean" (eager; traced: a PyTorch sum that Inductor
    fuses), and the reduction (PyTorch ops on the N per-row losses).

    ``inplace_backward`` is in both schemas but only the eager path acts on it (the kit's
    ``eager_bwd``): the backward op never writes into its input, it declares no mutation.
    Under torch.compile the callable passes False.

    ``reduce_fn(target, loss_rows, out, count, ignore_index, mean) -> None`` (optional): one
    kernel after the forward that writes the "sum" or "mean" loss into ``out`` (0-d, the
    logits' dtype) and the row count into ``count`` (fp32 [1]). Where no range check is
    waited for (the GPU default) and the backward is not in place, "sum" and "mean" then
    take two launches and one autograd node (``_Reduced``) instead of the stats kernel,
    the forward and three PyTorch ops with a node each: at small N V the call's host cost
    is its time."""

    def _fwd(
        logits: Tensor, target: Tensor, ignore_index: int, inplace_backward: bool
    ) -> tuple[Tensor, Tensor]:
        return fwd(logits.contiguous(), target.contiguous(), ignore_index)

    def _bwd(
        logits: Tensor, target: Tensor, lse: Tensor, scale: Tensor, ignore_index: int, inplace_backward: bool
    ) -> Tensor:
        # The op (torch.compile, opcheck): a fresh gradient; the per-row scale packed to N
        # floats (a stride-0 "mean"/"sum" scale would be one more layout to carry through
        # Inductor for N * 4 bytes).
        logits = logits.contiguous()
        out = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        bwd(logits, target.contiguous(), lse, scale.float().contiguous(), ignore_index, out)
        return out

    def _bwd_eager(logits, target, lse, scale, ignore_index, inplace_backward):
        # Eager: logits and target are the contiguous tensors the forward read (the
        # callable packs them). In place, dlogits overwrite the logits and are returned as
        # the gradient: no logits-sized buffer (see save below for why the alias adopts).
        logits, target = logits.contiguous(), target.contiguous()
        out = logits if inplace_backward else torch.empty_like(logits, memory_format=torch.contiguous_format)
        g = scale.float()  # [N]; stride 0 when it is one scale broadcast ("mean", "sum"): not copied
        bwd(logits, target, lse, g if g.stride(0) in (0, 1) else g.contiguous(), ignore_index, out)
        return out

    def _save(inputs, out):
        # In place, the logits are saved as an alias made with set_: after the node's
        # saved tensors are released, the returned gradient is the only reference to it,
        # and autograd's AccumulateGrad then adopts it as .grad instead of cloning it
        # (saving ``logits`` itself, also held by the caller, made it clone: a
        # logits-sized copy, the memory the option exists to avoid). The alias has a
        # version counter of its own; ``logits.detach()`` in the extras shares the
        # caller's, which the backward advances once it has overwritten the logits (see
        # _bwd_args).
        logits, target, ignore_index, inplace = inputs
        if not inplace:
            return (logits, target, out[1]), (ignore_index, False)
        alias = logits.new_empty(0).set_(logits.untyped_storage(), logits.storage_offset(), logits.shape,
                                         logits.stride())  # fmt: skip
        return (alias, target, out[1]), (ignore_index, True, logits.detach(), [False])

    def _bwd_args(saved, extra, dy):
        # In place, the first backward replaces the logits with their gradient: a second
        # one (retain_graph=True) would compute from the gradient. It is refused here,
        # and the caller's logits get a new version, so that any other autograd node
        # that saved them raises PyTorch's "modified by an inplace operation" error
        # instead of reading the gradient as logits.
        if not extra[1]:
            return (*saved, dy, *extra)
        ignore_index, _, caller, done = extra
        if done[0]:
            raise RuntimeError(
                "cross_entropy: inplace_backward=True overwrote the logits with their gradient in the "
                "first backward; a second backward through this graph (retain_graph=True) cannot be "
                "computed: call it with inplace_backward=False"
            )
        done[0] = True
        torch.autograd.graph.increment_version(caller)
        return (*saved, dy, ignore_index, True)

    def _fwd_sample(make):
        logits, target = make.args(1)
        return (logits, target, -100, False)

    def _bwd_sample(make):
        logits, target = make.args(0)
        _, lse = _fwd(logits, target, -100, False)
        scale = torch.randn(logits.shape[0], device=logits.device)
        return (logits, target, lse, scale, -100, False)

    rows = build(
        OpDecl(
            name=name,
            label=f"cross_entropy ({name.removeprefix('cross_entropy_')})",
            fwd=_fwd,
            bwd=_bwd,
            eager_bwd=_bwd_eager,
            fwd_fake=lambda logits, target, ignore_index, inplace_backward: (
                logits.new_empty((logits.shape[0],), dtype=torch.float32),
                logits.new_empty((lse_rows(logits.dtype), logits.shape[0]), dtype=torch.float32),
            ),
            bwd_fake=lambda logits, target, lse, scale, ignore_index, inplace_backward: torch.empty(
                logits.shape, dtype=logits.dtype, device=logits.device
            ),
            save=_save,
            bwd_args=_bwd_args,
            grads=lambda g, extra: (g[0], None, None, None),
            needs_grad=lambda logits, target, ignore_index, inplace_backward: logits.requires_grad,
            samples=(_fwd_sample, _bwd_sample),
            triton=triton,
        )
    )
    is_compiling = torch.compiler.is_compiling
    grad_enabled = torch.is_grad_enabled

    def reduced_fwd(logits, tc, ignore_index, mean):
        loss_rows, saved = rows.forward_saving(logits, tc, ignore_index, False)
        out = torch.empty((), dtype=logits.dtype, device=logits.device)
        count = torch.empty(1, dtype=torch.float32, device=logits.device)
        reduce_fn(tc, loss_rows, out, count, ignore_index, mean)
        return out, count, saved

    class _Reduced(torch.autograd.Function):
        # "sum" / "mean" of the fused rows as one node: its backward scales dy by 1 / count
        # ("mean") and hands it, broadcast (stride 0), to the backend's backward.
        @staticmethod
        def forward(ctx, logits, tc, ignore_index, mean):
            out, count, (tensors, extra) = reduced_fwd(logits, tc, ignore_index, mean)
            ctx.save_for_backward(count, *tensors)
            ctx.extra, ctx.mean, ctx.n = extra, mean, logits.shape[0]
            return out

        @staticmethod
        def backward(ctx, dy):
            if grad_enabled():  # create_graph=True: the fused backward has no derivative
                raise RuntimeError(
                    f"cross_entropy ({name.removeprefix('cross_entropy_')}): double backward "
                    "(create_graph=True) is not supported by this backend; use backend='torch' or 'manual'"
                )
            count, *tensors = ctx.saved_tensors
            g = dy.float() / count if ctx.mean else dy.float().reshape(1)
            dlogits = rows.backward_from((tensors, ctx.extra), g.expand(ctx.n))[0]
            return dlogits, None, None, None

    reduced_apply = super(torch.autograd.Function, _Reduced).apply
    functorch_active = torch._C._are_functorch_transforms_active

    def call(logits, target, ignore_index=-100, reduction="mean", inplace_backward=False, check_targets=None):
        if is_compiling():  # traced: no range check (no wait), in-place is eager only
            loss_rows = rows(logits, target, ignore_index, False)
            return reduce_rows(loss_rows, target, ignore_index, reduction, logits.dtype)
        # The target range check runs beside the forward (see the module docstring); with
        # check_targets=False, or by default on a GPU (None, unless kernellab.config.check_targets),
        # it is skipped (no host sync) and an out-of-range target gives a NaN loss for its row.
        if check_targets is None:
            check_targets = not logits.is_cuda or config.check_targets
        tc = target.contiguous()
        if reduce_fn is not None and not check_targets and reduction != "none" and not inplace_backward:
            logits, mean = logits.contiguous(), reduction == "mean"
            if not (grad_enabled() and logits.requires_grad):
                return reduced_fwd(logits, tc, ignore_index, mean)[0]
            apply = _Reduced.apply if functorch_active() else reduced_apply
            return apply(logits, tc, ignore_index, mean)
        stats = None
        pending = start_check(tc) if check_targets and tc.shape[0] else None
        if pending is not None or reduction == "mean":
            stats = target_stats(stats_fn, tc, logits.shape[1], ignore_index, pending)
        loss_rows = rows(logits.contiguous(), tc, ignore_index, inplace_backward)
        count = stats[1] if reduction == "mean" else None
        out = reduce_rows(loss_rows, target, ignore_index, reduction, logits.dtype, count)
        finish_check(pending, logits, target, ignore_index)
        return out

    call.custom_ops, call.ops = rows.custom_ops, rows.ops
    call.__name__ = name
    return call
