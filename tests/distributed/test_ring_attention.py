"""Ring attention (issue 20): every layout x causal / not against float64 attention on the
full sequence, forward and dq / dk / dv; bad input refused on every rank, no hang; the
simulated ring equals the distributed one; the overlapped ring (variant 2, the default)
equals the first one (variant 1) bit for bit; the argument check runs once per shape;
shard / unshard; the block plan against the causal mask; the fp32 merge; the Triton block
functions (CPU interpreter: fp32; GPU: bf16).

The distributed part runs one ``torch.multiprocessing`` spawn per world size (2 and 4,
gloo), every case inside it (a spawn costs seconds); ranks write their findings to files
and the tests below judge them. A spawn that does not finish in time fails the tests
(and is killed) instead of blocking CI.
"""

from __future__ import annotations

import math
import os
import traceback
import zlib

import pytest
import torch
import torch.distributed as dist

import kldist
from kernellab.distributed import (
    LAYOUTS,
    TORCH,
    TRITON,
    block_calls,
    merge_,
    positions,
    shard,
    simulate_ring,
    unshard,
)
from kernellab.distributed import ring as R
from kernellab.ops.attention.reference import reference_attention

F64 = torch.float64
TOL = 1e-10
SPAWN_TIMEOUT_S = 240

# --------------------------------------------------------------------------- the spawned ranks

# (name, layout, causal, B, H_q, H_kv, S_local, D, scale)
GOOD_CASES = [
    (f"{lay}-{'causal' if c else 'full'}", lay, c, 2, 2, 2, 8, 8, None)
    for lay in LAYOUTS
    for c in (False, True)
]
GOOD_CASES += [
    ("gqa-zigzag-causal", "zigzag", True, 1, 4, 2, 6, 16, None),
    ("gqa-striped-causal-scale", "striped", True, 1, 3, 1, 5, 8, 0.3),
]
# (name, what every rank must say: a substring of each rank's message)
BAD_CASES = [
    ("uneven-seq", "sequence length"),
    ("one-rank-heads", "head counts"),
    ("unknown-layout-everywhere", "layout"),
    ("unknown-layout-rank0", "layout"),
    ("zigzag-odd", "even local sequence length"),
    ("dtype-rank-last", "dtype"),
    ("gqa-not-multiple", "multiple of H_kv"),
    ("causal-differs", "causal"),
    ("blocks-rank1", "blocks"),
    ("triton-head-dim", "blocks"),
    ("cudnn-on-cpu-rank-last", "blocks"),
    ("variant-unknown", "variant"),
    ("variant-rank-last", "ring variants differ"),
    ("check-rank0", "check"),
]


def _problem(seed, b, hq, hkv, s, d, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, s, d, generator=g, dtype=dtype)
    k = torch.randn(b, hkv, s, d, generator=g, dtype=dtype)
    v = torch.randn(b, hkv, s, d, generator=g, dtype=dtype)
    do = torch.randn(b, hq, s, d, generator=g, dtype=dtype)
    return q, k, v, do


def _reference(q, k, v, do, causal, scale):
    g = k.shape[1] and q.shape[1] // k.shape[1]
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    o = reference_attention(
        q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1), causal=causal, scale=scale
    )
    return (o.detach(), *torch.autograd.grad(o, (q, k, v), do))


def _run_good(rank, world, case, group=None, sub_rank=None, sub_world=None, check=True):
    name, layout, causal, b, hq, hkv, s_local, d, scale = case
    r, w = (rank, world) if group is None else (sub_rank, sub_world)
    q, k, v, do = _problem(zlib.crc32(name.encode()) % 1000 + w, b, hq, hkv, s_local * w, d)
    ref = _reference(q, k, v, do, causal, scale)
    loc = [shard(t, r, w, layout).requires_grad_(i < 3) for i, t in enumerate((q, k, v, do))]
    o = R.ring_attention(
        loc[0],
        loc[1],
        loc[2],
        causal=causal,
        group=group,
        layout=layout,
        scale=scale,
        blocks="torch",
        check=check,
    )
    grads = torch.autograd.grad(o, loc[:3], loc[3])
    got = (o.detach(), *grads)
    errs = [(x - shard(y, r, w, layout)).abs().max().item() for x, y in zip(got, ref)]
    # The first ring on the same shards: the same block order, the same bits.
    kw = dict(causal=causal, group=group, layout=layout, scale=scale, blocks="torch", check=check)
    o1 = R.ring_attention(*loc[:3], variant=1, **kw)
    v1 = (o1.detach(), *torch.autograd.grad(o1, loc[:3], loc[3]))
    v1_equal = all(torch.equal(x, y) for x, y in zip(got, v1))
    # The simulated ring over the same full problem: bitwise the same rows.
    qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
    so = simulate_ring(qq, kk, vv, w, causal=causal, layout=layout, scale=scale, blocks="torch")
    sg = torch.autograd.grad(so, (qq, kk, vv), do)
    sim = (so.detach(), *sg)
    sim_equal = all(torch.equal(x, shard(y, r, w, layout)) for x, y in zip(got, sim))
    sim_err = max((x - shard(y, r, w, layout)).abs().max().item() for x, y in zip(got, sim))
    return {
        "errs": errs,
        "sim_equal": sim_equal,
        "sim_err": sim_err,
        "dtype": str(o.dtype),
        "v1_equal": v1_equal,
    }


def _bad_args(name, rank, world):
    q, k, v, _ = _problem(7, 1, 2, 2, 8, 8)
    kw = {"causal": True, "layout": "contiguous"}
    if name == "uneven-seq" and rank == 0:
        q, k, v = (t[:, :, :6] for t in (q, k, v))
    elif name == "one-rank-heads" and rank == 1:
        q, k, v = (t.repeat(1, 2, 1, 1) for t in (q, k, v))
    elif name == "unknown-layout-everywhere":
        kw["layout"] = "diagonal"
    elif name == "unknown-layout-rank0" and rank == 0:
        kw["layout"] = "diagonal"
    elif name == "zigzag-odd":
        q, k, v = (t[:, :, :7] for t in (q, k, v))
        kw["layout"] = "zigzag"
    elif name == "dtype-rank-last" and rank == world - 1:
        q, k, v = (t.float() for t in (q, k, v))
    elif name == "gqa-not-multiple":
        q = torch.randn(1, 3, 8, 8, dtype=F64)
    elif name == "causal-differs" and rank == 1:
        kw["causal"] = False
    elif name == "blocks-rank1" and rank == 1:
        kw["blocks"] = "flash"
    elif name == "triton-head-dim" and rank == 0:
        kw["blocks"] = "triton"  # D = 8: the Triton kernels take 16..256
    elif name == "cudnn-on-cpu-rank-last" and rank == world - 1:
        kw["blocks"] = "cudnn"  # CPU float64 tensors: cuDNN takes CUDA fp16 / bf16
    elif name == "variant-unknown":
        kw["variant"] = 3
    elif name == "variant-rank-last" and rank == world - 1:
        kw["variant"] = 1
    elif name == "check-rank0" and rank == 0:
        kw["check"] = "sometimes"
    return (q, k, v), kw


def _gathers(fn) -> int:
    """How many all_gathers ``fn()`` makes (dist.all_gather wrapped in this spawned rank)."""
    real, n = dist.all_gather, [0]

    def counting(*a, **k):
        n[0] += 1
        return real(*a, **k)

    dist.all_gather = counting
    try:
        fn()
    finally:
        dist.all_gather = real
    return n[0]


def _check_counts(rank, world):
    """All_gathers per call: check=True validates a shape once (then trusts it, in each
    group apart), check="always" every call, check=False never."""
    q, k, v, _ = _problem(5, 1, 2, 2, 6, 8)
    call = lambda **kw: R.ring_attention(q, k, v, causal=True, layout="striped", blocks="torch", **kw)  # noqa: E731
    q2 = torch.randn(1, 2, 10, 8, dtype=F64)
    return {
        "first": _gathers(call),
        "again": _gathers(lambda: [call() for _ in range(3)]),
        "always": _gathers(lambda: [call(check="always") for _ in range(2)]),
        "off": _gathers(lambda: call(check=False)),
        "new_shape": _gathers(lambda: R.ring_attention(q2, q2, q2, causal=True, blocks="torch")),
    }


def _worker(rank, world, init_file, out_dir):
    torch.set_num_threads(1)
    res = {"good": {}, "bad": {}, "sub": {}, "single": None, "after_bad": None, "error": None}
    try:
        kldist.init_group("gloo", rank, world, init_file, 60)
        for case in GOOD_CASES:
            res["good"][case[0]] = _run_good(rank, world, case)
        for name, _ in BAD_CASES:
            args, kw = _bad_args(name, rank, world)
            kw.setdefault("blocks", "torch")
            try:
                R.ring_attention(*args, **kw)
                res["bad"][name] = None
            except Exception as e:  # noqa: BLE001 - reported to the test, judged there
                res["bad"][name] = f"{type(e).__name__}: {e}"
        # The group still works after the refusals (no P2P was left half posted).
        res["after_bad"] = _run_good(rank, world, GOOD_CASES[3])
        res["nocheck"] = _run_good(rank, world, GOOD_CASES[-1], check=False)
        res["counts"] = _check_counts(rank, world)
        # World size 1 (each rank alone) and, with 4 ranks, two rings of 2 (global ranks
        # differ from group ranks: the P2P peers must be translated).
        singles = [dist.new_group([r]) for r in range(world)]
        res["single"] = _run_good(rank, world, GOOD_CASES[5], singles[rank], 0, 1)
        if world == 4:
            pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
            res["sub"] = _run_good(rank, world, GOOD_CASES[3], pairs[rank // 2], rank % 2, 2)
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        res["error"] = traceback.format_exc()
    torch.save(res, os.path.join(out_dir, f"rank{rank}.pt"))


@pytest.fixture(scope="module", params=[2, 4], ids=lambda w: f"world{w}")
def ranks(request, tmp_path_factory):
    """Spawn ``world`` gloo ranks once; every rank's findings (list indexed by rank)."""
    return kldist.run_ranks(_worker, request.param, tmp_path_factory, "ring-attention", (), SPAWN_TIMEOUT_S)


@pytest.mark.parametrize("case", [c[0] for c in GOOD_CASES])
def test_ring_matches_full_attention(ranks, case):
    for r, res in enumerate(ranks):
        got = res["good"][case]
        for what, err in zip(("o", "dq", "dk", "dv"), got["errs"]):
            assert err <= TOL, f"rank {r} of {len(ranks)}, {case}: {what} error {err:.3g} > {TOL}"
        assert got["dtype"] == "torch.float64"


@pytest.mark.parametrize("case", [c[0] for c in GOOD_CASES])
def test_simulated_ring_equals_distributed(ranks, case):
    for r, res in enumerate(ranks):
        got = res["good"][case]
        assert got["sim_equal"], (
            f"rank {r}, {case}: simulate_ring differs from ring_attention by {got['sim_err']:.3g}"
        )


@pytest.mark.parametrize("case", [c[0] for c in GOOD_CASES])
def test_overlapped_ring_equals_first_ring(ranks, case):
    for r, res in enumerate(ranks):
        assert res["good"][case]["v1_equal"], f"rank {r} of {len(ranks)}, {case}: variant 2 differs from 1"


def test_check_once_per_shape(ranks):
    for r, res in enumerate(ranks):
        assert res["counts"] == {"first": 1, "again": 0, "always": 2, "off": 0, "new_shape": 1}, (
            f"rank {r}: all_gathers per call {res['counts']}"
        )


@pytest.mark.parametrize("case,needle", BAD_CASES, ids=[c[0] for c in BAD_CASES])
def test_bad_input_refused_on_every_rank(ranks, case, needle):
    for r, res in enumerate(ranks):
        msg = res["bad"][case]
        assert msg is not None, f"rank {r} of {len(ranks)} accepted the bad input {case!r}"
        assert msg.startswith(("ValueError", "TypeError")), msg
        assert needle in msg, f"rank {r}: {msg!r} does not name the problem ({needle!r})"


def test_group_usable_after_refusals_and_subgroups(ranks):
    for r, res in enumerate(ranks):
        assert max(res["after_bad"]["errs"]) <= TOL
        assert max(res["nocheck"]["errs"]) <= TOL, f"rank {r}, check=False"
        assert res["nocheck"]["v1_equal"] and res["single"]["v1_equal"], f"rank {r}: variant 2 differs from 1"
        assert max(res["single"]["errs"]) <= TOL, f"rank {r} alone (world size 1)"
        if len(ranks) == 4:
            assert max(res["sub"]["errs"]) <= TOL, f"rank {r} in a ring of 2 inside 4"
            assert res["sub"]["v1_equal"], f"rank {r} in a ring of 2 inside 4: variant 2 differs from 1"


# --------------------------------------------------------------------------- one process


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("world", [1, 2, 3, 4, 5])
def test_block_plan_is_the_causal_mask(layout, world):
    """The union of the block calls of every (rank, source) pair is exactly the global
    causal mask (and everything when not causal), with each pair covered once; causal
    calls are square (the kernels' alignment conventions agree there)."""
    for s_local in (2, 4, 6):
        pos = [positions(r, world, s_local, layout) for r in range(world)]
        for causal in (False, True):
            for r in range(world):
                for src in range(world):
                    cover = torch.zeros(s_local, s_local, dtype=torch.int64)
                    for rows, keys, c in block_calls(layout, causal, r, src, world, s_local):
                        n_q, n_k = rows.stop - rows.start, keys.stop - keys.start
                        assert not c or n_q == n_k, "a causal call that is not square"
                        m = torch.ones(n_q, n_k, dtype=torch.int64)
                        cover[rows, keys] += m.tril() if c else m
                    want = (
                        (pos[src][None, :] <= pos[r][:, None])
                        if causal
                        else torch.ones(s_local, s_local, dtype=torch.bool)
                    )
                    assert torch.equal(cover, want.long()), (layout, world, s_local, causal, r, src)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_shard_unshard_round_trip(layout, world):
    s = 4 * world
    x = torch.randn(2, 3, s, 5)
    parts = [shard(x, r, world, layout) for r in range(world)]
    for r, p in enumerate(parts):
        assert p.is_contiguous()
        assert torch.equal(p, x[:, :, positions(r, world, s // world, layout)])
    assert torch.equal(unshard(parts, layout), x)
    # another dim (the LSE's sequence dim is the last one)
    y = torch.randn(2, s)
    assert torch.equal(unshard([shard(y, r, world, layout, dim=-1) for r in range(world)], layout, dim=-1), y)
    # every token exactly once
    allpos = torch.cat([positions(r, world, s // world, layout) for r in range(world)])
    assert torch.equal(allpos.sort().values, torch.arange(s))


def test_shard_refuses_indivisible():
    x = torch.randn(1, 1, 12, 4)
    with pytest.raises(ValueError, match="multiple of 8"):
        shard(x, 0, 4, "zigzag")
    with pytest.raises(ValueError, match="multiple of 5"):
        shard(x, 0, 5, "striped")
    with pytest.raises(ValueError, match="layout"):
        shard(x, 0, 2, "ring")
    with pytest.raises(ValueError, match="rank"):
        shard(x, 2, 2, "contiguous")
    with pytest.raises(ValueError, match="multiple"):
        simulate_ring(x, x, x, 5, causal=True, layout="contiguous")


def test_ring_attention_needs_init():
    x = torch.randn(1, 1, 4, 8)
    with pytest.raises(RuntimeError, match="not initialized"):
        R.ring_attention(x, x, x)


def test_merge_accumulates_in_fp32():
    """16 partial results of bf16 inputs merged: with fp32 accumulators (what the ring
    uses) the merged output is within 1.01 x the rounding of the exact result to bf16;
    with bf16 accumulators (each merge rounded) the same bound fails."""
    g = torch.Generator().manual_seed(3)
    n, rows, d = 16, 64, 32
    o_parts = torch.randn(n, rows, d, generator=g).to(torch.bfloat16)
    lse_parts = (torch.randn(n, rows, generator=g) * 2).float()
    exact_lse = torch.logsumexp(lse_parts.double(), 0)
    exact = (o_parts.double() * torch.exp(lse_parts.double() - exact_lse).unsqueeze(-1)).sum(0)
    bound = 1.01 * (exact.to(torch.bfloat16).double() - exact).abs().max().item()

    def merged(dtype):
        acc_o = torch.zeros(rows, d, dtype=dtype)
        acc_lse = torch.full((rows,), float("-inf"), dtype=dtype)
        for i in range(n):
            merge_(acc_o, acc_lse, o_parts[i], lse_parts[i])
        return acc_o.to(torch.bfloat16).double()

    assert (merged(torch.float32) - exact).abs().max().item() <= bound
    assert (merged(torch.bfloat16) - exact).abs().max().item() > bound  # the bound discriminates

    # And the ring's own accumulators: bf16 inputs, 8 ranks, the output error stays at
    # one final rounding of the fp32 result.
    q, k, v, _ = _problem(11, 1, 2, 2, 64, 16, torch.bfloat16)
    o = simulate_ring(q, k, v, 8, causal=True, layout="zigzag", blocks="torch")
    assert o.dtype == torch.bfloat16
    ref = reference_attention(q.double(), k.double(), v.double(), causal=True)
    assert (o.double() - ref).abs().max().item() <= 1.01 * (
        ref.to(torch.bfloat16).double() - ref
    ).abs().max().item() + 1e-6


def test_merge_empty_rows():
    acc_o, acc_lse = torch.zeros(2, 4), torch.full((2,), float("-inf"))
    merge_(acc_o, acc_lse, torch.ones(2, 4), torch.tensor([float("-inf"), 0.5]))
    assert torch.equal(acc_o[0], torch.zeros(4)) and acc_lse[0] == float("-inf")
    assert torch.allclose(acc_o[1], torch.ones(4)) and acc_lse[1] == 0.5


def _sim_grads(q, k, v, do, world, causal, layout, blocks, variant):
    qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
    o = simulate_ring(qq, kk, vv, world, causal=causal, layout=layout, blocks=blocks, variant=variant)
    return [o.detach(), *torch.autograd.grad(o, (qq, kk, vv), do)]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_simulated_v2_equals_v1(layout):
    """The overlapped schedule (adopted first block, dK/dV added in place into the arriving
    accumulator, the last hop rounded before it travels) gives v1's bits: worlds 1-5,
    causal or not, MHA and GQA, float64 and bf16."""
    for dtype in (F64, torch.bfloat16):
        for world in (1, 2, 3, 5):
            for causal in (False, True):
                for hq, hkv in ((2, 2), (4, 2)):
                    q, k, v, do = _problem(world, 1, hq, hkv, 4 * world, 8, dtype)
                    one, two = (_sim_grads(q, k, v, do, world, causal, layout, "torch", n) for n in (1, 2))
                    for what, x, y in zip(("o", "dq", "dk", "dv"), one, two):
                        assert torch.equal(x, y), (dtype, world, causal, hq, hkv, what)


def test_simulated_v2_equals_v1_triton_interpreted():
    """The same with the Triton blocks, whose backward calls on_dkdv between its dK/dV and
    dq kernels (CPU interpreter)."""
    q, k, v, do = _problem(31, 1, 4, 2, 64, 32, torch.float32)
    one, two = (_sim_grads(q, k, v, do, 2, True, "zigzag", "triton", n) for n in (1, 2))
    for what, x, y in zip(("o", "dq", "dk", "dv"), one, two):
        assert torch.equal(x, y), what


@pytest.mark.parametrize("blocks", [TORCH, TRITON], ids=["torch", "triton"])
def test_block_backward_hands_dkdv_over_once(blocks):
    """on_dkdv gets the very dk, dv the backward returns, once; without it the results
    are the same."""
    q, k, v, do = _problem(3, 1, 2, 2, 32, 16, torch.float32)
    o, lse = blocks.forward(q, k, v, True, 0.25)
    seen = []
    got = blocks.backward(do, q, k, v, o, lse, True, 0.25, on_dkdv=lambda dk, dv: seen.append((dk, dv)))
    plain = blocks.backward(do, q, k, v, o, lse, True, 0.25)
    assert blocks.early_dkdv and len(seen) == 1
    assert seen[0][0] is got[1] and seen[0][1] is got[2]
    for x, y in zip(got, plain):
        assert torch.equal(x, y)


def test_variant_refused():
    x = torch.randn(1, 1, 4, 8)
    with pytest.raises(ValueError, match="variant"):
        simulate_ring(x, x, x, 2, variant=3)


def test_simulate_world_sizes_and_gqa():
    for world in (1, 3, 6):
        for layout in LAYOUTS:
            q, k, v, do = _problem(world, 1, 4, 2, 12 * world, 8)
            ref = _reference(q, k, v, do, True, None)
            qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
            o = simulate_ring(qq, kk, vv, world, causal=True, layout=layout)
            got = (o.detach(), *torch.autograd.grad(o, (qq, kk, vv), do))
            for what, x, y in zip(("o", "dq", "dk", "dv"), got, ref):
                assert (x - y).abs().max().item() <= TOL, (world, layout, what)


# --------------------------------------------------------------------------- Triton blocks


def test_triton_block_lse_units():
    """The Triton block functions speak natural-log LSE (the kernels' is log2): forward
    against the PyTorch block, and the backward fed the PyTorch block's natural LSE."""
    g = torch.Generator().manual_seed(5)
    q, k, v, do = (torch.randn(1, 2, 24, 16, generator=g) for _ in range(4))
    for causal in (False, True):
        o_t, lse_t = TRITON.forward(q, k, v, causal, 0.3)
        o_p, lse_p = TORCH.forward(q, k, v, causal, 0.3)
        assert (lse_t - lse_p).abs().max().item() < 1e-5
        assert (o_t - o_p).abs().max().item() < 1e-5
        gt = TRITON.backward(do, q, k, v, o_p, lse_p, causal, 0.3)
        gp = TORCH.backward(do, q, k, v, o_p, lse_p, causal, 0.3)
        for a, b in zip(gt, gp):
            assert (a - b).abs().max().item() < 1e-5
    # the conversion is not a no-op: log2 units would be off by a factor ln 2
    assert not torch.allclose(lse_t / math.log(2), lse_p, atol=1e-3)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_simulated_ring_triton_interpreted(layout):
    """The Triton blocks (CPU interpreter, fp32) in the ring, including the striped
    shifted diagonal and GQA, against float64 attention."""
    q, k, v, do = _problem(17, 1, 2, 1, 32, 16, torch.float32)
    ref = _reference(q.double(), k.double(), v.double(), do.double(), True, None)
    qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
    o = simulate_ring(qq, kk, vv, 2, causal=True, layout=layout, blocks="triton")
    got = (o.detach(), *torch.autograd.grad(o, (qq, kk, vv), do))
    for what, x, y in zip(("o", "dq", "dk", "dv"), got, ref):
        assert (x.double() - y).abs().max().item() < 2e-5, what


@pytest.mark.parametrize("blocks", ["torch", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_ring_saves_q_k_v_o_and_one_natural_lse(blocks, dtype):
    """The ring's autograd node is kernellab's and keeps attention's contract (docs/guide.md): q,
    k, v, o and one extra tensor, the log-sum-exp of q.shape[:-1] in fp32, natural-log
    units (the Triton blocks' log2 converted), here with GQA and the zigzag layout."""
    q, k, v, _ = _problem(21, 1, 4, 2, 32, 16, torch.float32)
    q, k, v = (t.to(dtype).requires_grad_() for t in (q, k, v))
    o = simulate_ring(q, k, v, 2, causal=True, layout="zigzag", blocks=blocks)
    saved = o.grad_fn.saved_tensors
    assert len(saved) == 5, "q, k, v, o and exactly one extra tensor (the LSE)"
    lse = saved[4]
    assert lse.shape == q.shape[:-1] and lse.dtype == torch.float32, (tuple(lse.shape), lse.dtype)
    ke = k.double().repeat_interleave(2, 1)
    s = (q.double() @ ke.transpose(-1, -2) / math.sqrt(16)).masked_fill(
        ~torch.ones(32, 32, dtype=torch.bool).tril(), float("-inf")
    )
    torch.testing.assert_close(lse.double(), s.logsumexp(-1), rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- GPU


def _triton_single(q, k, v, causal):
    import kernellab

    g = q.shape[1] // k.shape[1]
    return kernellab.attention(
        q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1), causal=causal, backend="triton"
    )


def _cudnn_single(q, k, v, causal):
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    g = q.shape[1] // k.shape[1]
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(
            q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1), is_causal=causal
        )


@pytest.mark.gpu
@pytest.mark.parametrize("blocks", ["triton", "cudnn", None])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "world,hq,hkv,s_local,d", [(2, 4, 4, 256, 64), (4, 4, 4, 192, 128), (4, 8, 2, 128, 64)]
)
def test_simulated_ring_bf16(cuda, blocks, layout, causal, world, hq, hkv, s_local, d):
    """simulate_ring with the Triton, cuDNN or default blocks in bf16 against one device's
    attention on the same kernel (the default: cuDNN's, which it picks here): both against
    float64, the ring within 2x the single device's error (+ a noise floor), forward and
    the three gradients."""
    g = torch.Generator(device="cuda").manual_seed(world * 100 + s_local)
    shape_q, shape_kv = (1, hq, s_local * world, d), (1, hkv, s_local * world, d)
    q = torch.randn(shape_q, generator=g, device="cuda").bfloat16()
    k, v = (torch.randn(shape_kv, generator=g, device="cuda").bfloat16() for _ in range(2))
    do = torch.randn(shape_q, generator=g, device="cuda").bfloat16()
    ref = _reference(q.double(), k.double(), v.double(), do.double(), causal, None)

    def run(fn):
        qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
        o = fn(qq, kk, vv)
        return (o.detach(), *torch.autograd.grad(o, (qq, kk, vv), do))

    ring = run(lambda a, b, c: simulate_ring(a, b, c, world, causal=causal, layout=layout, blocks=blocks))
    one = _triton_single if blocks == "triton" else _cudnn_single
    single = run(lambda a, b, c: one(a, b, c, causal))
    for what, x, y, r in zip(("o", "dq", "dk", "dv"), ring, single, ref):
        e_ring = (x.double() - r).abs().max().item()
        e_one = (y.double() - r).abs().max().item()
        assert e_ring <= 2 * e_one + 1e-3, f"{what}: ring {e_ring:.3g} vs single device {e_one:.3g}"


def _nccl_worker(rank, world, init_file, out_dir):
    """NCCL ranks on real GPUs: the ring (Triton blocks, bf16) gathered, against the
    simulated ring and single-device attention, both judged against float64; then an
    uneven sequence refused on every rank."""
    res = {"cases": {}, "bad": None, "error": None}
    try:
        torch.cuda.set_device(rank)
        kldist.init_group("nccl", rank, world, init_file, 120)
        from kernellab.distributed import gather_sequence

        for layout in LAYOUTS:
            for causal in (False, True):
                for hq, hkv in ((4, 4), (4, 2)):
                    g = torch.Generator(device="cuda").manual_seed(11)
                    s = 256 * world
                    q = torch.randn(1, hq, s, 64, generator=g, device="cuda").bfloat16()
                    k, v = (
                        torch.randn(1, hkv, s, 64, generator=g, device="cuda").bfloat16() for _ in range(2)
                    )
                    do = torch.randn(1, hq, s, 64, generator=g, device="cuda").bfloat16()
                    loc = [
                        shard(t, rank, world, layout).requires_grad_(i < 3)
                        for i, t in enumerate((q, k, v, do))
                    ]
                    o = R.ring_attention(loc[0], loc[1], loc[2], causal=causal, layout=layout)
                    got = [
                        gather_sequence(t, layout)
                        for t in (o.detach(), *torch.autograd.grad(o, loc[:3], loc[3]))
                    ]
                    if rank == 0:
                        ref = _reference(q.double(), k.double(), v.double(), do.double(), causal, None)
                        qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
                        one = _triton_single(qq, kk, vv, causal)
                        single = (one.detach(), *torch.autograd.grad(one, (qq, kk, vv), do))
                        res["cases"][(layout, causal, hkv)] = [
                            ((x.double() - r).abs().max().item(), (y.double() - r).abs().max().item())
                            for x, y, r in zip(got, single, ref)
                        ]
        q = torch.randn(1, 2, 64 + (16 if rank == 0 else 0), 64, device="cuda").bfloat16()
        try:
            R.ring_attention(q, q, q, causal=True)
        except ValueError as e:
            res["bad"] = str(e)
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        res["error"] = traceback.format_exc()
    torch.save(res, os.path.join(out_dir, f"rank{rank}.pt"))


@pytest.mark.gpu
def test_nccl_ring(cuda, tmp_path_factory, monkeypatch):
    """Needs 2+ GPUs (skipped on one): NCCL ring attention, every layout x causal, MHA and
    GQA, within 2x single-device Triton attention's error (+ a floor) against float64."""
    world = min(torch.cuda.device_count(), 4)
    if world < 2:
        pytest.skip("needs 2 or more GPUs")
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")
    out = kldist.run_ranks(_nccl_worker, world, tmp_path_factory, "nccl-ring", (), SPAWN_TIMEOUT_S)
    for r, res in enumerate(out):
        assert res["bad"] is not None and "sequence length" in res["bad"], f"rank {r}: {res['bad']!r}"
    assert len(out[0]["cases"]) == 12
    for case, errs in out[0]["cases"].items():
        for what, (e_ring, e_one) in zip(("o", "dq", "dk", "dv"), errs):
            assert e_ring <= 2 * e_one + 1e-3, (
                f"{case} {what}: ring {e_ring:.3g} vs single device {e_one:.3g}"
            )


def test_simulated_ring_triton_bf16_interpreted():
    """bf16 through the Triton blocks (CPU interpreter, bf16 tiles upcast before the dots),
    4 simulated ranks, striped, GQA: the block outputs and gradients stay fp32 until the
    end, so the ring's error is the single device's (both rounded to bf16 once), not W
    roundings of partial results."""
    world, causal, layout = 4, True, "striped"
    q, k, v, do = _problem(23, 1, 2, 1, 32 * world, 32, torch.bfloat16)
    ref = _reference(q.double(), k.double(), v.double(), do.double(), causal, None)

    def run(fn):
        qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
        o = fn(qq, kk, vv)
        return (o.detach(), *torch.autograd.grad(o, (qq, kk, vv), do))

    ring = run(lambda a, b, c: simulate_ring(a, b, c, world, causal=causal, layout=layout, blocks="triton"))
    single = run(lambda a, b, c: _triton_single(a, b, c, causal))
    for what, x, y, r in zip(("o", "dq", "dk", "dv"), ring, single, ref):
        e_ring, e_one = (x.double() - r).abs().max().item(), (y.double() - r).abs().max().item()
        assert e_ring <= 1.25 * e_one, f"{what}: ring {e_ring:.3g} vs single device {e_one:.3g}"


# --------------------------------------------------------------------------- cuDNN blocks


def test_blocks_resolve_by_name_and_default_to_torch_on_the_cpu():
    from kernellab.distributed.blocks import CUDNN, cudnn_available, default_blocks, resolve_blocks

    q = torch.randn(1, 2, 8, 16, dtype=torch.bfloat16)
    assert resolve_blocks("cudnn", q) is CUDNN and resolve_blocks("triton", q) is TRITON
    assert not cudnn_available(q) and default_blocks(q) is TORCH
    with pytest.raises(ValueError, match="'cudnn'"):
        resolve_blocks("flash", q)


def test_simulated_ring_refuses_cudnn_blocks_on_cpu_tensors():
    q = torch.randn(1, 2, 8, 16, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="blocks 'cudnn' take CUDA fp16 / bf16"):
        simulate_ring(q, q, q, 2, causal=True, layout="zigzag", blocks="cudnn")


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_cudnn_block_matches_the_torch_block_and_hands_dkdv_over(cuda, causal):
    """One cuDNN block forward and backward (given the global o and lse, as the ring
    calls it) against the PyTorch block in float64: within bf16's error of it, lse in
    natural-log units, on_dkdv called once with the returned dk, dv."""
    from kernellab.distributed.blocks import CUDNN, default_blocks

    g = torch.Generator(device="cuda").manual_seed(3)
    q, k, v, do = (torch.randn(2, 4, 256, 64, generator=g, device="cuda").bfloat16() for _ in range(4))
    assert default_blocks(q) is CUDNN
    o, lse = CUDNN.forward(q, k, v, causal, 0.125)
    o64, lse64 = TORCH.forward(q.double(), k.double(), v.double(), causal, 0.125)
    assert o.shape == q.shape and lse.shape == q.shape[:-1]
    assert (lse.double() - lse64).abs().max().item() < 1e-2
    assert (o.double() - o64).abs().max().item() < 2e-2
    seen = []
    got = CUDNN.backward(do, q, k, v, o, lse, causal, 0.125, on_dkdv=lambda dk, dv: seen.append((dk, dv)))
    ref = TORCH.backward(do.double(), q.double(), k.double(), v.double(), o64, lse64, causal, 0.125)
    assert len(seen) == 1 and seen[0][0] is got[1] and seen[0][1] is got[2]
    for x, r in zip(got, ref):
        assert (x.double() - r).abs().max().item() <= 3e-2 * r.abs().max().item()
