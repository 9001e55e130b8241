"""Ring attention: the step schedule, the fp32 merge, the exchanges, autograd.

Variants (``ring_attention(..., variant=N)``; the same blocks, merge and block order, so
their results are the same bits):

- v1: the first ring. Each step's exchange receives into fresh tensors; the backward sends
  the dK/dV accumulators on after the step's whole block backward and brings them home in
  fp32 after the last step, with nothing left to compute meanwhile.
- v2 (the default): v1's schedule with the exchanges hidden: receives double-buffered
  (allocated once per call), the first block's output taken as the accumulator instead
  of merged into zeros, the dK/dV accumulators sent on from inside the block backward as
  soon as dK/dV are final (``BlockFns.early_dkdv``: before the dq kernel), added in place
  into the arriving buffer, and the last hop home rounded to the inputs' dtype first
  (half the bytes; the same rounding v1 does on arrival), behind the last dq kernel.

Forward, on rank r of W (q, k, v its shard, [B, H, S_local, D]):

    acc_o, acc_lse = the first block's (o_b, lse_b)           (v1: 0 and -inf, merged)
    for step in 0 .. W-1:                      the K/V block held now came from src = r - step
        post: send the held K/V to r+1, receive the next from r-1     (not on the last step)
        for each block call of (layout, causal, r, src):              (layouts.block_calls)
            o_b, lse_b = block_forward(q[rows], k[keys], v[keys])
            merge (o_b, lse_b) into (acc_o[rows], acc_lse[rows])
        wait for the exchange

The exchange of step s + 1's block is posted before step s's compute, so the two overlap:
with NCCL, batched P2P runs on the process group's own stream (c10d makes it wait for the
current stream when posted, and ``wait()`` makes the current stream wait for it, without
blocking the host), i.e. on a side stream. With bf16 K/V of B=1, H=32, S_local=16k, D=128,
one block is 2 x 128 MiB: ~0.7 ms at ~370 GB/s of NVLink, against ~5 ms of compute per
causal zigzag step (a 16k x 8k block: 2.2 TFLOP at ~450 TFLOP/s), so it hides easily -
if the P2P kernel gets SMs: a kernel on a normal-priority stream launched beside a big
attention kernel waits until the scheduler has dispatched that kernel's last thread
blocks, and the overlap shrinks to the tail. ``high_priority_group`` makes a group whose
streams are dispatched first (the P2P kernel takes a few SMs for the ~0.7 ms).

Merge (per row): lse = logaddexp(acc_lse, lse_b); acc_o = acc_o e^(acc_lse - lse) +
o_b e^(lse_b - lse), in fp32 (float64 for float64 inputs). Why never bf16: each merge
rounds acc_o to the accumulator's precision, and after W merges those errors add up (bf16
has 8 bits: up to 2^-9 relative per merge, up to ~1.5% after 8 merges, far worse than the
single-device kernel's error); fp32 costs nothing that matters (the accumulators are S_local x D per
head). For the same reason the Triton blocks hand over their partial o and their dq / dk /
dv shares in fp32 (blocks.py): the ring's result is rounded to the inputs' dtype once, at
the end, as the single-device kernel's is. Taking the first block as the accumulator is
the same bits as merging it into (0, -inf): e^(-inf) = 0, e^0 = 1, logaddexp(-inf, x) = x.

Backward (the standard ring backward): K/V travel around the ring again, and with them the
dK/dV accumulators of that block. At each step a rank computes the visiting block's share
of dq (kept locally), dk and dv (added to the accumulators that arrived with the block, then
sent on). After W sends the accumulators are back with the rank that owns the block.
Each block's share is exact because block_backward gets the GLOBAL o and lse (blocks.py).
The dK/dV accumulators travel in fp32: twice the bytes of a bf16 K/V block (512 MiB at 16k
tokens, ~1.4 ms), against ~12 ms of backward compute per zigzag step. v2, step s:

    post K/V (s + 1)
    block backward: dK/dV kernels -> [wait for the accumulators from r - 1, add this
        block's dK/dV in place, post them on to r + 1 (the last step: rounded to the
        inputs' dtype, home)] -> dq kernel
    dq += the block's dq; wait for K/V
    after the last step: wait for the accumulators of this rank's own block (home)

so each hop has the rest of its step (the dq kernel) and the next step's dK/dV kernels to
hide behind; v1's last hop (fp32, 1.4 ms at 16k) ran after all compute. With one NCCL
stream per group the K/V and dK/dV batches run one after the other: 0.7 + 1.4 ms per step
against ~12 ms.

The same step code runs a simulated ring in one process (``simulate_ring``): all W
ranks' shards in turn, each "exchange" a rotation of Python lists.

GQA: k and v may have H_kv heads with H_q a multiple of H_kv. K/V travel with their own
H_kv heads (H_q / H_kv times fewer bytes); each block call views q as [B, H_kv, g, S, D]
and broadcasts k, v over g (stride 0, no copy), and dk, dv are summed over g.

Argument check: one all_gather of every rank's shapes before any P2P, so that bad
arguments on any rank are refused on every rank instead of leaving the others waiting in
an exchange. It costs a host sync, so ``check=True`` does it once per shape (per process
group) and trusts a shape every rank has agreed on; ``check="always"`` does it every call.
"""

from __future__ import annotations

import math
import struct
import weakref

import torch
import torch.distributed as dist
from torch.autograd.function import once_differentiable

from kernellab.distributed import layouts as L
from kernellab.distributed.blocks import (
    TRITON_DTYPES,
    TRITON_HEAD_DIMS,
    BlockFns,
    cudnn_available,
    math_dtype,
    resolve_blocks,
)
from kernellab.distributed.merge import merge_

_TAG_KV, _TAG_DKV = 0, 8  # distinct tags per exchange kind (gloo matches on them; NCCL ignores them)


# --------------------------------------------------------------------------- exchanges


class _Pending:
    def __init__(self, reqs, bufs):
        self.reqs, self.bufs = reqs, bufs

    def wait(self):
        for r in self.reqs:
            r.wait()
        return self.bufs


class DistRing:
    """This process is one rank of ``group``: send to the next rank, receive from the
    previous, in one batched P2P call."""

    def __init__(self, group=None):
        self.group = group
        self.world = dist.get_world_size(group)
        rank = dist.get_rank(group)
        self.ranks = [rank]
        glob = (lambda r: r) if group is None else (lambda r: dist.get_global_rank(group, r))
        self.next = glob((rank + 1) % self.world)
        self.prev = glob((rank - 1) % self.world)

    def start(self, payload, tag: int) -> _Pending:
        (tensors,) = payload
        ops, bufs = [], []
        for i, t in enumerate(tensors):
            t = t.contiguous()
            buf = torch.empty_like(t)
            ops.append(dist.P2POp(dist.isend, t, self.next, self.group, tag + i))
            ops.append(dist.P2POp(dist.irecv, buf, self.prev, self.group, tag + i))
            bufs.append(buf)
        return _Pending(dist.batch_isend_irecv(ops), [bufs])

    def post(self, sends, recvs, tag: int) -> _Pending:
        """v2: send ``sends[0]`` (contiguous tensors) on, receive into ``recvs[0]`` (tensors
        shaped as the sends, allocated once per call by ``buffers``)."""
        (tensors,), (bufs,) = sends, recvs
        ops = []
        for i, (t, buf) in enumerate(zip(tensors, bufs)):
            ops.append(dist.P2POp(dist.isend, t, self.next, self.group, tag + i))
            ops.append(dist.P2POp(dist.irecv, buf, self.prev, self.group, tag + i))
        return _Pending(dist.batch_isend_irecv(ops), [bufs])

    def buffers(self, like, dtype=None):
        """Receive tensors shaped as ``like`` (one list per local rank)."""
        return [[torch.empty(t.shape, dtype=dtype or t.dtype, device=t.device) for t in ts] for ts in like]


class SimRing:
    """All ``world`` ranks in this process: rank r "receives" what rank r-1 sent."""

    def __init__(self, world: int):
        self.world = world
        self.ranks = list(range(world))

    def start(self, payload, tag: int) -> _Pending:
        w = self.world
        return _Pending([], [payload[(r - 1) % w] for r in range(w)])

    def post(self, sends, recvs, tag: int) -> _Pending:
        return self.start(sends, tag)  # (the sent tensors themselves: nothing is copied)

    def buffers(self, like, dtype=None):
        return [None] * len(like)


# --------------------------------------------------------------------------- blocks


def _grouped(q: torch.Tensor, hkv: int) -> torch.Tensor:
    """[B, H, S, ...] -> [B, H_kv, H / H_kv, S, ...] (a view when q's strides allow)."""
    return q.unflatten(1, (hkv, q.shape[1] // hkv))


def _bcast(k: torch.Tensor, g: int) -> torch.Tensor:
    return k.unsqueeze(2).expand(k.shape[0], k.shape[1], g, *k.shape[2:])


def _block_fwd(fns: BlockFns, q, k, v, causal, scale):
    hkv = k.shape[1]
    if hkv == q.shape[1]:
        return fns.forward(q, k, v, causal, scale)
    g = q.shape[1] // hkv
    o, lse = fns.forward(_grouped(q, hkv), _bcast(k, g), _bcast(v, g), causal, scale)
    return o.flatten(1, 2), lse.flatten(1, 2)


def _block_bwd(fns: BlockFns, do, q, k, v, o, lse, causal, scale):
    hkv = k.shape[1]
    if hkv == q.shape[1]:
        return fns.backward(do, q, k, v, o, lse, causal, scale)
    g = q.shape[1] // hkv
    gq = (_grouped(t, hkv) for t in (do, q))
    dq, dk, dv = fns.backward(
        *gq, _bcast(k, g), _bcast(v, g), _grouped(o, hkv), _grouped(lse, hkv), causal, scale
    )
    return dq.flatten(1, 2), dk.sum(2), dv.sum(2)


# --------------------------------------------------------------------------- the schedule


def step_forward(fns: BlockFns, calls, q, k, v, acc_o, acc_lse, scale: float) -> None:
    """One rank's compute at one ring step: its block calls against the K/V block it holds,
    merged into (acc_o, acc_lse) in place."""
    for rows, keys, c in calls:
        o_b, lse_b = _block_fwd(fns, q[..., rows, :], k[..., keys, :], v[..., keys, :], c, scale)
        merge_(acc_o[..., rows, :], acc_lse[..., rows], o_b, lse_b)


def step_backward(fns: BlockFns, calls, do, q, k, v, o, lse, dq_acc, scale: float):
    """One rank's backward compute at one ring step: dq's share added into ``dq_acc`` (in
    place), the held block's shares (dk, dv) returned in dq_acc's dtype."""
    dk = torch.zeros(k.shape, dtype=dq_acc.dtype, device=k.device)
    dv = torch.zeros(v.shape, dtype=dq_acc.dtype, device=v.device)
    for rows, keys, c in calls:
        dq_b, dk_b, dv_b = _block_bwd(
            fns,
            do[..., rows, :],
            q[..., rows, :],
            k[..., keys, :],
            v[..., keys, :],
            o[..., rows, :],
            lse[..., rows],
            c,
            scale,
        )
        dq_acc[..., rows, :] += dq_b
        dk[..., keys, :] += dk_b
        dv[..., keys, :] += dv_b
    return [dk, dv]


def ring_forward(ring, fns: BlockFns, qs, ks, vs, causal: bool, scale: float, layout: str):
    """Per local rank (``ring.ranks``): (o in q's dtype, lse natural units in fp32 / f64)."""
    w = ring.world
    s_local = qs[0].shape[-2]
    f = math_dtype(qs[0].dtype)
    acc_o = [torch.zeros(q.shape[:-1] + (v.shape[-1],), dtype=f, device=q.device) for q, v in zip(qs, vs)]
    acc_lse = [torch.full(q.shape[:-1], float("-inf"), dtype=f, device=q.device) for q in qs]
    kv = [[k, v] for k, v in zip(ks, vs)]
    for step in range(w):
        pending = ring.start(kv, _TAG_KV) if step + 1 < w else None
        for i, r in enumerate(ring.ranks):
            calls = L.block_calls(layout, causal, r, (r - step) % w, w, s_local)
            step_forward(fns, calls, qs[i], *kv[i], acc_o[i], acc_lse[i], scale)
        if pending is not None:
            kv = pending.wait()
    return [o.to(q.dtype) for o, q in zip(acc_o, qs)], acc_lse


def ring_backward(ring, fns: BlockFns, dos, qs, ks, vs, outs, lses, causal: bool, scale: float, layout: str):
    """Per local rank: (dq, dk, dv) in the inputs' dtypes, accumulated in fp32 / f64."""
    w = ring.world
    s_local = qs[0].shape[-2]
    f = math_dtype(qs[0].dtype)
    dq = [torch.zeros(q.shape, dtype=f, device=q.device) for q in qs]
    kv = [[k, v] for k, v in zip(ks, vs)]
    pending_dkv = None
    for step in range(w):
        pending_kv = ring.start(kv, _TAG_KV) if step + 1 < w else None
        shares = []
        for i, r in enumerate(ring.ranks):
            calls = L.block_calls(layout, causal, r, (r - step) % w, w, s_local)
            shares.append(step_backward(fns, calls, dos[i], qs[i], *kv[i], outs[i], lses[i], dq[i], scale))
        if pending_dkv is not None:  # the accumulators of the block we hold, from r - 1
            arrived = pending_dkv.wait()
            shares = [[a + b for a, b in zip(mine, theirs)] for mine, theirs in zip(shares, arrived)]
        # The accumulators move on (after the last step: one more hop brings them home;
        # with one rank they are home already).
        pending_dkv = ring.start(shares, _TAG_DKV) if w > 1 else None
        if pending_kv is not None:
            kv = pending_kv.wait()
    home = pending_dkv.wait() if pending_dkv is not None else shares
    return (
        [g.to(q.dtype) for g, q in zip(dq, qs)],
        [h[0].to(k.dtype) for h, k in zip(home, ks)],
        [h[1].to(v.dtype) for h, v in zip(home, vs)],
    )


# --------------------------------------------------------------------------- v2


def forward_block(fns: BlockFns, calls, q, k, v, acc, scale: float):
    """v2's compute at one step: the block calls against the held K/V, merged into ``acc``
    = [acc_o, acc_lse] (in place), or taken as the accumulator when ``acc`` is None and
    the call covers every row (the first step's diagonal block). Returns the accumulator
    (None while no block has been computed)."""
    f = math_dtype(q.dtype)
    for rows, keys, c in calls:
        o_b, lse_b = _block_fwd(fns, q[..., rows, :], k[..., keys, :], v[..., keys, :], c, scale)
        if acc is None and rows == slice(0, q.shape[-2]):
            acc = [o_b.to(f), lse_b.to(f)]
            continue
        if acc is None:
            acc = [
                torch.zeros(q.shape[:-1] + (v.shape[-1],), dtype=f, device=q.device),
                torch.full(q.shape[:-1], float("-inf"), dtype=f, device=q.device),
            ]
        merge_(acc[0][..., rows, :], acc[1][..., rows], o_b, lse_b)
    return acc


def backward_block(fns: BlockFns, calls, do, q, k, v, o, lse, dq, scale: float, on_dkdv):
    """v2's compute at one step: the block calls' dq shares added into ``dq`` (or taken as
    it when ``dq`` is None and the call covers every row), and ``on_dkdv(keys, dk_b,
    dv_b)`` called once per call as soon as the call's dk / dv are final (before its dq's
    work, with ``BlockFns.early_dkdv``), or ``on_dkdv(None, None, None)`` when this step
    computes nothing. ``calls``: at most one (layouts.block_calls), so each rank hands its
    share over once per step. Returns dq."""
    f = math_dtype(q.dtype)
    if not calls:
        on_dkdv(None, None, None)
    for rows, keys, c in calls:
        hook = _gqa_hook(k.shape[1], q.shape[1], lambda dk, dv, keys=keys: on_dkdv(keys, dk, dv))
        args = (
            do[..., rows, :],
            q[..., rows, :],
            k[..., keys, :],
            v[..., keys, :],
            o[..., rows, :],
            lse[..., rows],
        )
        if fns.early_dkdv:
            dq_b, _, _ = _grouped_bwd(fns, *args, c, scale, on_dkdv=hook)
        else:
            dq_b, dk_b, dv_b = _grouped_bwd(fns, *args, c, scale)
            on_dkdv(keys, dk_b, dv_b)
        if dq is None and rows == slice(0, q.shape[-2]):
            dq = dq_b.to(f)
            continue
        if dq is None:
            dq = torch.zeros(q.shape, dtype=f, device=q.device)
        dq[..., rows, :] += dq_b
    return dq


def _gqa_hook(hkv: int, hq: int, hook):
    """The block backward's on_dkdv for grouped (GQA) calls: dk, dv come per (K/V head, g)
    and are summed over g first."""
    if hkv == hq:
        return hook
    return lambda dk, dv: hook(dk.sum(2), dv.sum(2))


def _grouped_bwd(fns: BlockFns, do, q, k, v, o, lse, causal, scale, on_dkdv=None):
    """_block_bwd with on_dkdv passed through (the GQA sums of dk, dv made by the caller's
    hook, not again here: the returned dk, dv are then the raw grouped ones)."""
    hkv = k.shape[1]
    kw = {} if on_dkdv is None else {"on_dkdv": on_dkdv}
    if hkv == q.shape[1]:
        return fns.backward(do, q, k, v, o, lse, causal, scale, **kw)
    g = q.shape[1] // hkv
    gq = (_grouped(t, hkv) for t in (do, q))
    dq, dk, dv = fns.backward(
        *gq, _bcast(k, g), _bcast(v, g), _grouped(o, hkv), _grouped(lse, hkv), causal, scale, **kw
    )
    if on_dkdv is None:
        dk, dv = dk.sum(2), dv.sum(2)
    return dq.flatten(1, 2), dk, dv


def ring_forward_v2(ring, fns: BlockFns, qs, ks, vs, causal: bool, scale: float, layout: str):
    """Per local rank: (o in q's dtype, lse natural units in fp32 / f64); v1's schedule."""
    w, n = ring.world, len(ring.ranks)
    s_local = qs[0].shape[-2]
    held = [[k.contiguous(), v.contiguous()] for k, v in zip(ks, vs)]
    bufs = [ring.buffers(held), ring.buffers(held)] if w > 1 else None  # received into in turn
    acc = [None] * n
    for step in range(w):
        pending = ring.post(held, bufs[step % 2], _TAG_KV) if step + 1 < w else None
        for i, r in enumerate(ring.ranks):
            calls = L.block_calls(layout, causal, r, (r - step) % w, w, s_local)
            acc[i] = forward_block(fns, calls, qs[i], *held[i], acc[i], scale)
        if pending is not None:
            held = pending.wait()
    for i, q in enumerate(qs):
        if acc[i] is None:  # (no block at all: every layout computes its diagonal at step 0)
            acc[i] = [
                torch.zeros(q.shape, dtype=math_dtype(q.dtype), device=q.device),
                torch.full(q.shape[:-1], float("-inf"), dtype=math_dtype(q.dtype), device=q.device),
            ]
    return [a[0].to(q.dtype) for a, q in zip(acc, qs)], [a[1] for a in acc]


class _Travelling:
    """The dK/dV accumulators of the blocks this process's ranks hold at one backward
    step: each rank's block backward hands its share over (``add``); when every local
    rank has, the accumulators are posted on to the next rank (in the output dtype at the
    last step: home). One rank per process (NCCL, gloo) posts from inside its block
    backward, between the dK/dV and dq kernels."""

    def __init__(self, ring, ks, vs, f):
        self.ring, self.f = ring, f
        self.out_dtypes = [(k.dtype, v.dtype) for k, v in zip(ks, vs)]
        self.shapes = [(k.shape, v.shape) for k, v in zip(ks, vs)]
        self.devices = [k.device for k in ks]
        w = ring.world
        if w > 1:
            like = [[k, v] for k, v in zip(ks, vs)]
            self.bufs = [ring.buffers(like, f), ring.buffers(like, f)]  # the accumulators, in turn
            self.home_bufs = ring.buffers(like)  # the last hop, in the inputs' dtype
        self.pending = None  # the accumulators on their way to this process's ranks
        self.home = None

    def begin(self, step: int):
        self.step, self.arrived, self.ready = step, None, [None] * len(self.shapes)

    def add(self, i: int, keys, dk, dv):
        """Rank i's share of the block it holds at this step (keys: its rows of the block;
        None: no share) into the accumulator that travels with the block."""
        if self.step == 0:  # the block's first share: the accumulator starts here
            if keys is not None and keys == slice(0, self.shapes[i][0][-2]):
                acc = [dk.to(self.f), dv.to(self.f)]
            else:
                d = self.devices[i]
                acc = [torch.zeros(s, dtype=self.f, device=d) for s in self.shapes[i]]
                if keys is not None:
                    acc[0][..., keys, :] += dk
                    acc[1][..., keys, :] += dv
        else:
            if self.arrived is None:
                self.arrived = self.pending.wait()
            acc = self.arrived[i]
            if keys is not None:
                acc[0][..., keys, :] += dk
                acc[1][..., keys, :] += dv
        self.ready[i] = acc
        if all(a is not None for a in self.ready):
            self._post()

    def _post(self):
        w, last = self.ring.world, self.step == self.ring.world - 1
        accs = self.ready
        if last:  # home: rounded now, as v1 rounds it on arrival (the same bits, half the bytes)
            accs = [[a.to(dk), b.to(dv)] for (a, b), (dk, dv) in zip(accs, self.out_dtypes)]
        if w == 1:
            self.home = accs
            return
        recv = self.home_bufs if last else self.bufs[self.step % 2]
        self.pending = self.ring.post([[t.contiguous() for t in a] for a in accs], recv, _TAG_DKV)

    def wait_home(self):
        return self.home if self.home is not None else self.pending.wait()


def ring_backward_v2(
    ring, fns: BlockFns, dos, qs, ks, vs, outs, lses, causal: bool, scale: float, layout: str
):
    """Per local rank: (dq, dk, dv) in the inputs' dtypes, accumulated in fp32 / f64;
    v1's order of every sum (the same bits)."""
    w, n = ring.world, len(ring.ranks)
    s_local = qs[0].shape[-2]
    f = math_dtype(qs[0].dtype)
    held = [[k.contiguous(), v.contiguous()] for k, v in zip(ks, vs)]
    bufs = [ring.buffers(held), ring.buffers(held)] if w > 1 else None
    dkv = _Travelling(ring, ks, vs, f)
    dq = [None] * n
    for step in range(w):
        pending = ring.post(held, bufs[step % 2], _TAG_KV) if step + 1 < w else None
        dkv.begin(step)
        for i, r in enumerate(ring.ranks):
            calls = L.block_calls(layout, causal, r, (r - step) % w, w, s_local)
            hook = lambda keys, dk, dv, i=i: dkv.add(i, keys, dk, dv)  # noqa: E731
            dq[i] = backward_block(fns, calls, dos[i], qs[i], *held[i], outs[i], lses[i], dq[i], scale, hook)
        if pending is not None:
            held = pending.wait()
    home = dkv.wait_home()
    return (
        [
            (g if g is not None else torch.zeros(q.shape, dtype=f, device=q.device)).to(q.dtype)
            for g, q in zip(dq, qs)
        ],
        [h[0] for h in home],
        [h[1] for h in home],
    )


# --------------------------------------------------------------------------- autograd


# variant -> (forward, backward) schedule
SCHEDULES = {1: (ring_forward, ring_backward), 2: (ring_forward_v2, ring_backward_v2)}


class _DistRingFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, ring, fns, causal, scale, layout, variant):
        (o,), (lse,) = SCHEDULES[variant][0](ring, fns, [q], [k], [v], causal, scale, layout)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.args = (ring, fns, causal, scale, layout, variant)
        return o

    @staticmethod
    @once_differentiable
    def backward(ctx, do):
        do = do.contiguous()  # (o.sum().backward() passes a stride-0 expanded gradient)
        q, k, v, o, lse = ctx.saved_tensors
        ring, fns, causal, scale, layout, variant = ctx.args
        bwd = SCHEDULES[variant][1]
        (dq,), (dk,), (dv,) = bwd(ring, fns, [do], [q], [k], [v], [o], [lse], causal, scale, layout)
        return dq, dk, dv, None, None, None, None, None, None


class _SimRingFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, world, fns, causal, scale, layout, variant):
        ring = SimRing(world)
        qs, ks, vs = ([L.shard(t, r, world, layout) for r in range(world)] for t in (q, k, v))
        outs, lses = SCHEDULES[variant][0](ring, fns, qs, ks, vs, causal, scale, layout)
        o, lse = L.unshard(outs, layout), L.unshard(lses, layout, dim=-1)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.args = (world, fns, causal, scale, layout, variant)
        return o

    @staticmethod
    @once_differentiable
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        world, fns, causal, scale, layout, variant = ctx.args
        sh = [[L.shard(t, r, world, layout) for r in range(world)] for t in (do, q, k, v, o)]
        lses = [L.shard(lse, r, world, layout, dim=-1) for r in range(world)]
        dqs, dks, dvs = SCHEDULES[variant][1](SimRing(world), fns, *sh, lses, causal, scale, layout)
        return (*(L.unshard(g, layout) for g in (dqs, dks, dvs)), None, None, None, None, None, None)


# --------------------------------------------------------------------------- validation


_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# What a rank that refused its own arguments tells the others (an index in the gathered
# descriptor; the refusing rank raises its own, more detailed, message).
_REFUSALS = (
    "",
    "q/k/v (type, rank, dtype, device or head counts)",
    "layout",
    "causal or scale",
    "local sequence length",
    "blocks",
    "variant or check",
)
VARIANTS = (1, 2)


def _local_problem(q, k, v, causal, layout, scale, blocks=None, device_type=None):
    """(refusal index, exception) for this rank's own arguments, or (0, None).
    ``device_type``: the device the process group moves tensors on ("cuda" for NCCL)."""
    try:
        L.check_layout(layout)
    except ValueError as e:
        return 2, ValueError(f"ring_attention: {e}")
    if not isinstance(causal, bool):
        return 3, TypeError(f"ring_attention: causal must be a bool, got {type(causal).__name__}")
    if scale is not None and (
        isinstance(scale, bool)
        or not isinstance(scale, (int, float))
        or not (math.isfinite(scale) and scale > 0)
    ):
        return 3, ValueError(f"ring_attention: scale must be a positive finite float or None, got {scale!r}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            return 1, TypeError(f"ring_attention: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            return 1, ValueError(
                f"ring_attention: {name} must be [B, H, S_local, D], got shape {tuple(t.shape)}"
            )
        if t.dtype not in _DTYPES:
            return 1, TypeError(
                f"ring_attention: {name} has dtype {t.dtype}; expected fp16, bf16, fp32 or fp64"
            )
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            return 1, TypeError(f"ring_attention: {name} has dtype {t.dtype} but q has {q.dtype}")
        if t.device != q.device:
            return 1, ValueError(f"ring_attention: {name} is on {t.device} but q is on {q.device}")
        if t.shape[0] != q.shape[0] or t.shape[2] != q.shape[2]:
            return 1, ValueError(
                f"ring_attention: {name} has shape {tuple(t.shape)} but q has {tuple(q.shape)}; "
                "batch (dim 0) and local sequence length (dim 2) must match"
            )
    if k.shape != v.shape:
        return 1, ValueError(
            f"ring_attention: v has shape {tuple(v.shape)} but k has {tuple(k.shape)}; they must match"
        )
    if k.shape[3] != q.shape[3]:
        return 1, ValueError(
            f"ring_attention: k has head dim {k.shape[3]} but q has {q.shape[3]}; they must match"
        )
    if k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        return 1, ValueError(
            f"ring_attention: q has {q.shape[1]} heads and k, v have {k.shape[1]}; "
            "GQA needs H_q a multiple of H_kv"
        )
    if device_type is not None and q.device.type != device_type:
        return 1, ValueError(
            f"ring_attention: q is on {q.device}, but the process group's backend takes {device_type} tensors"
        )
    try:
        fns = resolve_blocks(blocks, q)
    except ValueError as e:
        return 5, ValueError(f"ring_attention: {e}")
    if fns.name == "triton" and (q.dtype not in TRITON_DTYPES or q.shape[3] not in TRITON_HEAD_DIMS):
        return 5, ValueError(
            "ring_attention: blocks 'triton' take fp16 / bf16 / fp32 and head dims that are multiples of 8 "
            "up to 256; "
            f"q is {q.dtype} with head dim {q.shape[3]} (blocks='torch' takes any)"
        )
    if fns.name == "cudnn" and not cudnn_available(q):
        return 5, ValueError(
            "ring_attention: blocks 'cudnn' take CUDA fp16 / bf16 tensors with head dims that are "
            f"multiples of 8 up to 128, in a PyTorch built with cuDNN; q is {q.dtype} on {q.device} "
            f"with head dim {q.shape[3]}"
        )
    s = q.shape[2]
    if s == 0:
        return 4, ValueError("ring_attention: q has 0 tokens (dim 2); every rank must hold at least one")
    if layout == "zigzag" and s % 2:
        return 4, ValueError(
            f"ring_attention: layout 'zigzag' needs an even local sequence length (two chunks per rank), "
            f"q has {s}"
        )
    return 0, None


def _local_options(check, variant):
    """(refusal index, exception) for ring_attention's own options, or (0, None)."""
    if isinstance(variant, bool) or variant not in VARIANTS:
        return 6, ValueError(f"ring_attention: variant must be one of {VARIANTS}, got {variant!r}")
    if not (isinstance(check, bool) or check == "always"):
        return 6, ValueError(f"ring_attention: check must be True, False or 'always', got {check!r}")
    return 0, None


# The gathered descriptor: [refusal index, then these fields (0 when refused)].
_FIELDS = (
    "batch sizes",
    "query head counts",
    "local sequence lengths (q.shape[2])",
    "head dims",
    "k/v head counts",
    "dtypes",
    "causal flags",
    "layouts",
    "scales",
    "ring variants",
)
# Compared in this order: the most likely mistake first (an unevenly cut sequence).
_ORDER = (2, 0, 1, 4, 3, 5, 6, 7, 8, 9)


def _f64_bits(x: float) -> int:
    return struct.unpack("<q", struct.pack("<d", float(x)))[0]


def _from_bits(b: int) -> float:
    return struct.unpack("<d", struct.pack("<q", b))[0]


def _descriptor(code, q, k, causal, layout, scale, variant=2) -> list[int]:
    if code:
        return [code] + [0] * len(_FIELDS)
    return [
        0,
        *q.shape,  # B, H, S_local, D
        k.shape[1],
        _DTYPES.index(q.dtype),
        int(causal),
        L.LAYOUTS.index(layout),
        _f64_bits(scale) if scale is not None else 0,
        variant,
    ]


def _shown(idx: int, vals: list[int]) -> list:
    if idx == 5:
        return [str(_DTYPES[x]) for x in vals]
    if idx == 6:
        return [bool(x) for x in vals]
    if idx == 7:
        return [L.LAYOUTS[x] for x in vals]
    if idx == 8:
        return [_from_bits(x) if x else None for x in vals]
    return vals


def _check_ranks(group, rank, world, code, err, desc, device) -> None:
    """One all_gather of every rank's descriptor; every rank raises if any rank refused its
    arguments or the ranks disagree (so no rank is left waiting in a P2P that never comes)."""
    mine = torch.tensor(desc, dtype=torch.int64, device=device)
    every = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(every, mine, group=group)
    rows = [t.tolist() for t in every]  # (a host sync: once per shape, ring_attention's check)
    bad = [(r, row[0]) for r, row in enumerate(rows) if row[0]]
    if err is not None:
        raise type(err)(f"{err} (rank {rank} of {world})")
    if bad:
        what = "; ".join(f"rank {r}: {_REFUSALS[c]}" for r, c in bad)
        raise ValueError(
            f"ring_attention: other ranks refused their arguments ({what}); every rank must pass valid ones"
        )
    for idx in _ORDER:
        vals = [row[1 + idx] for row in rows]
        if len(set(vals)) > 1:
            extra = " (shard the sequence with kernellab.distributed.shard)" if idx == 2 else ""
            raise ValueError(
                f"ring_attention: {_FIELDS[idx]} differ between ranks: {_shown(idx, vals)}; "
                f"they must be equal on every rank{extra}"
            )


# --------------------------------------------------------------------------- public


# Per process group, the descriptors every rank has agreed on (ring_attention's check=True:
# one all_gather per shape, not per call). Weak keys: a destroyed group's entries go with it.
_AGREED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_AGREED_MAX = 1024  # ever-new shapes clear it rather than grow it without bound


def ring_attention(
    q,
    k,
    v,
    causal: bool = False,
    group=None,
    layout: str = "contiguous",
    scale=None,
    *,
    blocks=None,
    check: bool | str = True,
    variant: int = 2,
):
    """Attention over a sequence sharded across the ranks of ``group`` (see the module
    docstring). q [B, H, S_local, D], k and v [B, H_kv, S_local, D] (H a multiple of H_kv),
    this rank's shard in ``layout`` (``kernellab.distributed.shard``); every rank holds
    the same number of tokens. Returns this rank's rows of the output, in q's dtype,
    differentiable (dK/dV travel back around the ring). ``blocks``: None (cuDNN, else
    Triton, on CUDA tensors they take, PyTorch otherwise: ``blocks.default_blocks``),
    "torch", "triton", "cudnn" (PyTorch's cuDNN kernels; CUDA fp16 / bf16, head dim <= 128)
    or a ``BlockFns``.

    Bad arguments on any rank are refused on every rank (one all_gather of the shapes
    before any P2P), so no rank hangs. That check makes the host wait for the device (it
    reads the gathered shapes), so ``check=True`` does it at the first call of each shape
    (per group) and then trusts that shape; a rank whose shapes change while the others'
    stay as agreed is caught only by ``check="always"`` (every call), and otherwise waits
    in the check while the others wait in their first exchange (the group's timeout).
    ``check=False`` skips it for callers that know the ranks agree (each rank still checks
    its own arguments, but a rank-local refusal then leaves the other ranks waiting).
    ``variant``: the schedule (module docstring), 2 by default; 1 is the first ring, kept
    as the baseline the benchmark compares against."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "ring_attention: torch.distributed is not initialized (init_process_group first); "
            "kernellab.distributed.simulate_ring runs the ring in one process"
        )
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    nccl = "nccl" in str(dist.get_backend(group))
    code, err = _local_problem(q, k, v, causal, layout, scale, blocks, "cuda" if nccl and world > 1 else None)
    if not code:
        code, err = _local_options(check, variant)
    if world > 1 and check is not False:
        desc = _descriptor(code, q, k, causal, layout, scale, variant)
        agreed = _AGREED.setdefault(group if group is not None else dist.group.WORLD, set())
        if code or check is not True or tuple(desc) not in agreed:
            device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
            _check_ranks(group, rank, world, code, err, desc, device)
            if len(agreed) >= _AGREED_MAX:
                agreed.clear()
            agreed.add(tuple(desc))
    elif err is not None:
        raise err
    fns = resolve_blocks(blocks, q)
    sc = float(scale) if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    return _DistRingFn.apply(q, k, v, DistRing(group), fns, causal, sc, layout, variant)


def simulate_ring(
    q, k, v, world: int, causal: bool = False, layout: str = "contiguous", scale=None, *, blocks=None,
    variant: int = 2,
):  # fmt: skip
    """The ring in one process: q, k, v are the FULL sequence [B, H, S, D]; they are
    sharded in ``layout`` over ``world`` simulated ranks, which run the same step schedule
    and merge as ``ring_attention`` one after another; the output is unsharded.
    Differentiable. S must be a multiple of ``world`` (2 x world for zigzag)."""
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise ValueError(f"simulate_ring: world must be a positive int, got {world!r}")
    code, err = _local_problem(q, k, v, causal, layout, scale, blocks)
    if err is not None and code != 4:
        raise err
    code, err = _local_options(True, variant)
    if err is not None:
        raise ValueError(str(err).replace("ring_attention", "simulate_ring"))
    g = L.granule(layout, world)
    if q.shape[2] == 0 or q.shape[2] % g:
        raise ValueError(
            f"simulate_ring: q has {q.shape[2]} tokens (dim 2); layout {layout!r} over {world} ranks needs a "
            f"positive multiple of {g}"
        )
    fns = resolve_blocks(blocks, q)
    sc = float(scale) if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    return _SimRingFn.apply(q, k, v, world, fns, causal, sc, layout, variant)


def gather_sequence(x: torch.Tensor, layout: str = "contiguous", group=None, dim: int = -2) -> torch.Tensor:
    """The full sequence on every rank from each rank's shard (all_gather + unshard)."""
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x.contiguous(), group=group)
    return L.unshard(parts, layout, dim=dim)


def high_priority_group(group=None):
    """A process group over ``group``'s ranks (default: every rank) for ring attention's
    exchanges: with NCCL, one whose streams have high priority, so that the GPU dispatches
    the P2P kernel's few thread blocks ahead of the attention kernel's waiting ones (module
    docstring); any other backend: ``group`` itself. Collective: every rank of the default
    group calls it (``dist.new_group``). Make it once and pass it as ``group``."""
    if "nccl" not in str(dist.get_backend(group)):
        return group
    opts = dist.ProcessGroupNCCL.Options()
    opts.is_high_priority_stream = True
    ranks = dist.get_process_group_ranks(group if group is not None else dist.group.WORLD)
    return dist.new_group(ranks, backend="nccl", pg_options=opts)
