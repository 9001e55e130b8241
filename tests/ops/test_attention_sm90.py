"""attention's Hopper CUDA backends (cuda_v2 .. cuda_v7: attention_sm90.cu).

Without a GPU: the generated wgmma header is the generator's; every head dim's module
compiles for sm_90a with every kernel the launcher asks for, no local memory, and v3-v7 at
exactly the register count their setmaxnreg budget assumes; v6's and v7's named barriers
(ids, counts, and a model of their turns that must neither deadlock nor leave a phase half
full; v7's epilogue barriers); the wgmma descriptors address the bytes the copies wrote (a
model of the hardware's canonical layouts), v7's O rows land where its TMA store reads them,
and the S accumulator is the P operand's register fragment; the launcher's arguments (grid,
strides, group, scale, shared memory, copies only where rows are not whole 16-byte chunks,
the TMA variants' tensor maps, v7's map of o) with the kernel replaced by a recorder; a
tensor map passed by value through the runtime's launch; refusals that name the argument;
availability; the kernel's schedule and arithmetic (``emulate``) against the float64
reference.
With a GPU (``gpu``): each kernel against ``emulate`` and the reference, odd shapes, every
head dim, causal, GQA, the saved lse, and gradients through the Triton backward.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import kernellab
import kernellab.ops.attention as A
from kernellab.harness.compare import judge
from kernellab.ops.attention import args as AA
from kernellab.ops.attention import cuda_sm90 as cs
from kltest import PhaseBarrier, RingModel, dtype_id, interleave_items

SPEC = kernellab.get_spec("attention")
HALF = [torch.float16, torch.bfloat16]
BACKENDS = [f"cuda_{v}" for v in cs.VARIANTS]


def _nvrtc():
    why = cs.nvrtc_unavailable()
    if why:
        pytest.skip(why)


def _ref_lse2(q, k, v, causal, scale):
    """The float64 log-sum-exp of the scaled scores in log2 units (the saved lse)."""
    ke, _ = AA.expand_kv(q, k, v)
    s = (q.double() @ ke.double().transpose(-1, -2)) * scale
    allowed = AA.allowed_mask(q.shape[-2], k.shape[-2], causal, None, q.device)
    if allowed is not None:
        s = s.masked_fill(~allowed, float("-inf"))
    return s.logsumexp(-1) / math.log(2)


def _check_o_lse(o, lse, q, k, v, causal, scale):
    ref = SPEC.reference(q.double(), k.double(), v.double(), causal=causal, scale=scale)
    base = A.attention(q, k, v, causal=causal, scale=scale, backend="torch")
    verdict = judge(o, ref, q.dtype, base)
    assert verdict.ok, f"o: {verdict.detail} (err {verdict.err:.3g}, bound {verdict.bound:.3g})"
    want = _ref_lse2(q, k, v, causal, scale)
    assert lse.shape == q.shape[:-1] and lse.dtype == torch.float32
    assert torch.equal(torch.isneginf(lse), torch.isneginf(want)), (
        "lse: -inf exactly at the rows that see no key"
    )
    fin = torch.isfinite(want)
    torch.testing.assert_close(lse.double()[fin], want[fin], rtol=1e-5, atol=1e-4)


# --------------------------------------------------------------------------- compile (no GPU)


def test_wgmma_header_is_the_generators():
    from kernellab.cuda import wgmma

    for rel, spec in wgmma.HEADERS.items():
        path = cs.CU.parents[2] / rel
        assert path.read_text() == wgmma.header(*spec), f"{rel}: regenerate (python -m kernellab.cuda.wgmma)"


def test_every_head_dim_compiles_for_sm90a_with_every_kernel_and_no_local_memory():
    """Per head dim: every variant's kernels for fp16 and bf16 (what the launcher names), no
    spills, and the warp-specialized ones (v3-v7) at exactly 168 registers a thread:
    384 x 168 = 64512 registers at launch is the pool setmaxnreg redistributes (v3: 128 x 56
    for the producer + 256 x 224 for the consumers; v4-v7: 128 x 40 + 256 x 232); at fewer,
    the consumers' setmaxnreg.inc would wait forever."""
    _nvrtc()
    from kernellab.inspect import asm

    cuobjdump = asm.find_tool("cuobjdump")
    for d in cs.HEAD_DIMS:
        mod = cs.MODULES[d]
        ptx = mod.compile("sm_90", target="ptx").decode()
        names = set(asm.split_ptx(ptx))
        want = {f"attn_fwd_{v}_d{d}_{sfx}" for v in cs.VARIANTS for sfx in ("f16", "bf16")}
        assert names == want, (d, names)
        assert "wgmma.mma_async" in ptx and "setmaxnreg" in ptx and "cp.async.mbarrier.arrive.noinc" in ptx
        assert "cp.async.bulk.tensor.4d" in ptx
        v7 = "\n".join(body for name, body in asm.split_ptx(ptx).items() if "_v7_" in name)
        assert "cp.async.bulk.tensor.4d.global.shared::cta.bulk_group" in v7  # v7's o: a TMA store
        assert "cp.async.bulk.wait_group.read 0" in v7 and "fence.proxy.async.shared::cta" in v7
        assert "wgmma.wait_group.sync.aligned 1" in v7  # S_j waited alone: P V_{j-1} still in flight
        cubin = mod.compile("sm_90")
        if cuobjdump is None:
            continue
        import subprocess
        import tempfile

        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(cubin)
            f.flush()
            res = asm.parse_res_usage(subprocess.run([cuobjdump, "-res-usage", f.name], capture_output=True,
                                                     text=True, check=True).stdout)  # fmt: skip
        for name in want:
            assert res[name]["STACK"] == 0 and res[name].get("LOCAL", 0) == 0, (name, res[name])
            if "_v2_" not in name:
                assert res[name]["REG"] == 168, (name, res[name])


def test_launch_signatures_match_the_kernels_parameters():
    """Each kernel's parameter sizes (its PTX) are the launcher's signature's: a tensor map
    is 128 bytes by value, pointers and strides 8, lengths, flags and the scale 4."""
    _nvrtc()
    from kernellab.cuda.runtime import check_signature, ptx_param_sizes

    for d in (80, 128):
        ptx = cs.MODULES[d].compile("sm_90", target="ptx").decode()
        for v in cs.VARIANTS:
            for sfx in ("f16", "bf16"):
                name = f"attn_fwd_{v}_d{d}_{sfx}"
                check_signature(name, cs.signature(v), ptx_param_sizes(ptx, name))


def test_pingpong_named_barriers_in_the_ptx():
    """v6's and v7's turns are bar.sync / bar.arrive on named barriers met by 256 threads
    (the two consumer warpgroups); v7's epilogue adds a bar.sync of 128 (one warpgroup);
    the only other barrier is __syncthreads' id 0; v2-v5 use none."""
    _nvrtc()
    import re

    from kernellab.inspect import asm

    for d in (64, 256):
        kernels = asm.split_ptx(cs.MODULES[d].compile("sm_90", target="ptx").decode())
        for name, body in kernels.items():
            named = re.findall(r"\bbar(?:rier)?\.(sync|arrive)\s+([^;]+);", body)
            if "_v6_" not in name and "_v7_" not in name:
                assert all(args.strip() == "0" for _, args in named), (name, named)
                continue
            ops = [(op, args.split(",")) for op, args in named if args.strip() != "0"]
            turns = [(op, a) for op, a in ops if a[-1].strip() == "256"]
            assert {op for op, _ in turns} == {"sync", "arrive"}, (name, named)
            assert all(len(a) == 2 for _, a in ops), (name, ops)
            epi = [(op, a) for op, a in ops if a[-1].strip() != "256"]
            if "_v6_" in name:
                assert not epi, (name, ops)
            else:
                assert epi and all(op == "sync" and a[1].strip() == "128" for op, a in epi), (name, ops)


def test_v7_barrier_ids_and_schedule_in_the_source():
    """v7 uses v6's turn barriers (PP_BAR = 1, 2, count 256) and, per warpgroup, EPI_BAR + w
    = 3, 4 (count 128); with three consumer warpgroups the turns take 1-3 and the epilogue
    epi_bar<3>(w) = 4-6: no id is shared between the two uses, all within the 16 a block has.
    Its consumer's barrier operations are v6's, in the same order, where its warpgroup
    conditions are read at two warpgroups (so the model below, of v6 and of v7's turns going
    round, is v7's too), and its epilogue barrier is reached by every consumer thread (not
    inside a branch)."""
    import re

    src = cs.CU.read_text()
    assert re.search(r"constexpr int PP_BAR = 1;", src) and re.search(r"constexpr int PP_COUNT = 256;", src)
    assert re.search(r"constexpr int EPI_BAR = 3;", src) and re.search(r"constexpr int EPI_COUNT = 128;", src)
    assert "return EPI_BAR + (WG - 2) + cw;" in src
    for wg in (2, 3):
        turns = {1 + w for w in range(wg)}
        epi = {3 + (wg - 2) + w for w in range(wg)}
        assert not turns & epi and max(epi) < 16, wg

    def body(fn):
        start = src.index(f"void {fn}(")
        end = src.index("\n}\n", start)
        return src[start:end]

    def barrier_ops(text):
        return re.findall(r"named_(sync|arrive)\((mine|other)\)|\b(if \(cw == [01]\))", text)

    # v7 takes its turns through two lambdas (no turns at all with V7Tiles' TURNS 0)
    v7 = body("consume_v7")
    assert "const int mine = PP_BAR + cw, other = WG == 2 ? PP_BAR + 1 - cw : PP_BAR + (cw + 1) % WG;" in v7
    guard = "\n        if constexpr (V7Tiles<D>::TURNS) "
    lambdas = (
        "    auto turn = [&]() {" + guard + "named_sync(mine);\n    };\n",
        "    auto hand_over = [&]() {" + guard + "named_arrive(other);\n    };\n",
    )
    for text in lambdas:
        assert text in v7
        v7 = v7.replace(text, "")
    v7 = v7.replace("turn()", "named_sync(mine)").replace("hand_over()", "named_arrive(other)")
    assert v7.count("if (cw == WG - 1)") == 1 and v7.count("if (cw != WG - 1)") == 1
    at_two = v7.replace("if (cw == WG - 1)", "if (cw == 1)").replace("if (cw != WG - 1)", "if (cw == 0)")
    assert barrier_ops(at_two) == barrier_ops(body("consume_pingpong"))
    epi = body("epilogue_tma")
    line = next(ln for ln in epi.splitlines() if "named_sync_wg(" in ln)
    assert line.strip() == "named_sync_wg(epi_bar<WG>(cw));"
    before = epi[: epi.index(line)]
    assert before.count("{") == before.count("}") + 1  # at the function's top level


def _pingpong_model(n: int, wg: int = 2) -> dict[int, list[tuple[str, int]]]:
    """attention_sm90.cu's consume_v7 (consume_pingpong at wg = 2) as barrier operations,
    warpgroup w in 0 .. wg - 1: (op, barrier) with op "sync" / "arrive"; barrier PP_BAR + w
    is w's turn, and w hands over to w + 1 (the last to 0)."""
    ops = {w: [] for w in range(wg)}
    if n == 0:
        return ops
    for w in range(wg):
        mine, other = 1 + w, 1 + (w + 1) % wg
        if w == wg - 1:
            ops[w].append(("arrive", other))
        for turn in range(n + 1):  # turn 0: S_0; 1..n-1: S_j and P V_{j-1}; n: the last P V
            ops[w].append(("sync", mine))
            if w != wg - 1 or turn < n:
                ops[w].append(("arrive", other))
    return ops


def _run_pingpong(ops: dict, rng) -> tuple[list[int], dict]:
    """Run the warpgroups' barrier operations, one at a time in an order ``rng`` picks: a
    phase completes when 256 threads (two warpgroups of 128) reached it; a warpgroup that
    syncs blocks until its phase completes. Returns the order of the turns and what each
    barrier holds at the end."""
    wgs = sorted(ops)
    pc, count, turns = {w: 0 for w in wgs}, {1 + w: 0 for w in wgs}, []
    waiting, released = {w: None for w in wgs}, {w: False for w in wgs}
    while any(pc[w] < len(ops[w]) for w in wgs):
        ready = []
        for w in wgs:
            if pc[w] < len(ops[w]) and (waiting[w] is None or released[w]):
                ready.append(w)
        assert ready, ("deadlock", pc, count)
        w = rng.choice(ready)
        op, bar = ops[w][pc[w]]
        if op == "sync" and released[w]:
            released[w], waiting[w] = False, None
            turns.append(w)
            pc[w] += 1
            continue
        assert count[bar] + 128 <= 256, "an arrival would join the next phase"
        count[bar] += 128
        if op == "arrive":
            pc[w] += 1
        else:
            waiting[w] = bar
        if count[bar] == 256:  # the phase completes and resets
            count[bar] = 0
            for u in wgs:
                if waiting[u] == bar:
                    released[u] = True
    return turns, count


@pytest.mark.parametrize("wg", [2, 3])
@pytest.mark.parametrize("n", [0, 1, 2, 5])
def test_pingpong_turns_alternate_and_leave_no_barrier_half_full(n, wg):
    """In many random interleavings of the warpgroups (two, or v7's three): all finish (no
    deadlock), the turns go round 0, 1 (, 2), 0, 1 ... (n + 1 each), no arrival lands on a
    full phase, and no barrier holds arrivals at the end."""
    import random

    ops = _pingpong_model(n, wg)
    for seed in range(200):
        turns, count = _run_pingpong(ops, random.Random(seed))
        assert turns == list(range(wg)) * (n + 1 if n else 0)
        assert all(c == 0 for c in count.values())


@pytest.mark.parametrize("wg", [2, 3])
def test_pingpong_turns_across_a_persistent_blocks_items(wg):
    """The persistent v7 takes the turns item after item (each item's barrier operations
    those of _pingpong_model, none for an item whose query block sees no key): in random
    interleavings the turns still go round over the whole walk, no arrival lands on a full
    phase and no barrier holds arrivals at the end. (A lab variant that handed the next
    item's first turn over early deadlocked where a block's first item saw no key:
    benchmarks/NOTES.md (ak).)"""
    import random

    for n_tiles in ([3, 1, 2], [1, 1, 1, 1], [0, 2, 0, 0, 1, 0], [2, 0], [5, 0, 0]):
        ops = {w: [] for w in range(wg)}
        for n in n_tiles:
            item = _pingpong_model(n, wg)
            for w in range(wg):
                ops[w] += item[w]
        for seed in range(50):
            turns, count = _run_pingpong(ops, random.Random(seed))
            assert turns == list(range(wg)) * sum(n + 1 for n in n_tiles if n), n_tiles
            assert all(c == 0 for c in count.values())


def test_module_is_sm90a_only():
    _nvrtc()
    from kernellab.cuda.runtime import CudaError

    assert cs.MODULE.target_arch("sm_90") == "sm_90a"
    with pytest.raises(CudaError, match="sm_90a"):
        cs.MODULES[64].compile("sm_80")


def test_shared_memory_fits_and_matches_the_kernel():
    """smem_bytes is what the kernel checks (check_smem traps below it): 1 KB of alignment,
    the Q tile and per stage a K and a V tile; all within the 227 KB a block may use. v7 is
    tiled by V7_TILES (80 keys x 2 stages at D = 256, split rings: 225 KB), the others by
    block_n."""
    for d in cs.HEAD_DIMS:
        bn = cs.block_n(d)
        assert bn == (64 if d == 256 else 128)
        assert cs.smem_bytes("v2", d) == 1024 + 128 * d * 2 + 2 * 2 * bn * d * 2
        for v in ("v3", "v4", "v5", "v6"):
            assert cs.smem_bytes(v, d) == 1024 + 128 * d * 2 + cs.stages(v, d) * 2 * bn * d * 2
            assert cs.smem_bytes(v, d) + 64 <= cs.SMEM_LIMIT  # + the static mbarriers
            assert cs.stages(v, d) == (2 if d == 256 else 3)
        for t in (cs.V7_TILES[d],) + cs.V7_TILINGS[d]:
            rows = 192 if t.three_wg else 128  # query rows a block: 64 a consumer warpgroup
            assert t.rows == rows and t.threads == 128 + 2 * rows
            o = rows * d * 2 if t.o_buffer else 0  # o's own staging tile
            assert cs.smem_bytes("v7", d, t) == 1024 + rows * d * 2 + t.stages * 2 * t.bn * d * 2 + o
            assert cs.smem_bytes("v7", d, t) + 64 <= cs.SMEM_LIMIT
            cs.check_tiles(d, t)
        assert cs.smem_bytes("v7", d) == cs.smem_bytes("v7", d, cs.V7_TILES[d])
        # v7's default: 128 x 3 (80 x 2 in split K / V rings at D = 256), fast_exp and desc_add;
        # persistent with o's own tile at D <= 96
        lean = dict(fast_exp=True, desc_add=True)
        own = dict(lean, persistent=d <= 96, o_buffer=d <= 96)
        assert cs.V7_TILES[d] == (cs.Tiles(80, 2, True, **lean) if d == 256 else cs.Tiles(128, 3, **own))
        # the lab times the default once, beside the base of its tile, the one with fast_exp
        # alone and (persistent defaults) the one a block a (query block, head)
        assert cs.V7_TILES[d] not in cs.V7_TILINGS[d]
        t = cs.V7_TILES[d]
        base = cs.Tiles(t.bn, t.stages, t.split_kv)
        assert base in (cs.V7_TILES_FIRST[d],) + cs.V7_TILINGS[d], d
        assert cs.Tiles(t.bn, t.stages, t.split_kv, fast_exp=True) in cs.V7_TILINGS[d], d
        assert cs.Tiles(t.bn, t.stages, t.split_kv, **lean) in (t,) + cs.V7_TILINGS[d], d
        assert cs.V7_TILES_FIRST[d] == cs.tiles_of("v6", d)  # v7's first tiling: v6's
    with pytest.raises(ValueError, match="227 KB"):
        cs.check_tiles(256, cs.Tiles(80, 3))
    with pytest.raises(ValueError, match="no tiling"):
        cs.check_tiles(80, cs.Tiles(176, 2))  # 176 x 32 bytes: slabs off the 1024-byte grid
    with pytest.raises(ValueError, match="only v7"):
        cs.smem_bytes("v6", 64, cs.Tiles(128, 4))
    with pytest.raises(ValueError, match="three consumer warpgroups"):
        cs.check_tiles(128, cs.Tiles(128, 2, three_wg=True))  # 160 registers: O alone is 64 at D = 128
    with pytest.raises(ValueError, match="three consumer warpgroups"):
        cs.check_tiles(64, cs.Tiles(176, 3, three_wg=True))


def _ptx_constants(ptx: str, struct: str, d: int) -> dict[str, int]:
    """The values of a template struct's static constexpr members as NVRTC's PTX lists them
    (.global .u32 <mangled name> = value; no value: 0)."""
    import re

    pat = rf"\.global \.align \d+ \.u\d+ \S*{len(struct)}{struct}ILi{d}EE\d+(\w+?)E(?: = (\d+))?;"
    return {name: int(val or 0) for name, val in re.findall(pat, ptx)}


def test_v7_lean_tilings_use_the_exponential_and_descriptors_they_name():
    """The tilings with ``fast_exp`` ("e", every V7_TILES) compute the softmax's exponentials
    by ex2.approx.ftz.f32, the others (and v2-v6) by exp2f's ex2.approx.f32; ``desc_add``
    ("d") keeps the same wgmmas and adds each k step to the tile's descriptor
    (attention_sm90_common.cuh's desc_kmajor / desc_mnmajor with ADD, which V7Tiles'
    DESC_ADD sets)."""
    _nvrtc()
    from kernellab.inspect import asm

    src = cs.CU.with_name("attention_sm90_common.cuh").read_text()
    assert (
        "make_desc(tile, R * L::W, 8 * L::W, L::MODE) + static_cast<unsigned long long>(row0 * (L::W / 16))"
        in src
    )
    assert "make_desc(tile + row0 * L::W, 16, 8 * L::W, L::MODE) + (step >> 4)" in src
    assert "desc_mnmajor<D, TR, DADD>(sV, 16 * kk)" in cs.CU.read_text()
    assert str(cs.Tiles(128, 3, fast_exp=True, desc_add=True)) == "128x3ed"
    assert str(cs.Tiles(80, 2, split_kv=True, fast_exp=True)) == "80x2se"
    for d in cs.HEAD_DIMS:
        lean = [t for t in (cs.V7_TILES[d], *cs.V7_TILINGS[d]) if t.fast_exp]
        assert lean and any(t.desc_add for t in lean), d
        own = asm.split_ptx(cs.MODULES[d].compile("sm_90", target="ptx").decode())
        for v in ("v2", "v3", "v4", "v5", "v6"):
            k = own[f"attn_fwd_{v}_d{d}_bf16"]
            assert "ex2.approx.f32" in k and "ex2.approx.ftz.f32" not in k, (d, v)
        t0 = cs.V7_TILES[d]  # the default's tile with exp2f and a descriptor built per step
        plain = cs.Tiles(t0.bn, t0.stages, t0.split_kv)
        assert plain in (cs.V7_TILES_FIRST[d], *cs.V7_TILINGS[d]), d
        base = asm.split_ptx(cs.v7_module(d, plain).compile("sm_90", target="ptx").decode())
        base = base[f"attn_fwd_v7_d{d}_bf16"]
        assert "ex2.approx.f32" in base and "ex2.approx.ftz.f32" not in base
        for t in lean:
            ptx = asm.split_ptx(cs.v7_module(d, t).compile("sm_90", target="ptx").decode())[
                f"attn_fwd_v7_d{d}_bf16"
            ]
            assert "ex2.approx.ftz.f32" in ptx and "ex2.approx.f32" not in ptx, (d, t)
            if t.bn == cs.V7_TILES[d].bn:
                assert ptx.count("wgmma.mma_async") == base.count("wgmma.mma_async"), (d, t)


def test_v7_tilings_are_what_the_modules_build():
    """V7_TILES[d] is attention_sm90.cu's default V7Tiles<d> in MODULES[d] (its BN, STAGES,
    SPLIT_KV, FAST_EXP and DESC_ADD, read from the PTX), and v7_module builds every other
    tiling (the ones the lab times) with -DKL_ATTN_V7_BN and the rest: v7's two kernels
    alone, at that tiling, no spills, 168 registers at launch (128 with three consumer
    warpgroups: 512 threads, setmaxnreg 24 / 160); a split K / V tiling with a
    full and an empty barrier per stage for K and for V (4 x stages + 1 mbarriers with
    q_full), the others 2 x stages + 1."""
    _nvrtc()
    import re
    import subprocess
    import tempfile

    from kernellab.inspect import asm

    cuobjdump = asm.find_tool("cuobjdump")

    def tiling(ptx: str, d: int) -> cs.Tiles:
        got = _ptx_constants(ptx, "V7Tiles", d)
        flags = (bool(got[k]) for k in ("SPLIT_KV", "FAST_EXP", "DESC_ADD", "PERSIST"))
        return cs.Tiles(
            got["BN"],
            got["STAGES"],
            *flags,
            o_buffer=got["PERSIST"] == 2,
            queue=bool(got["QUEUE"]),
            free=not got["TURNS"],
            three_wg=got["WG"] == 3,
            col_mask=bool(got.get("COLMASK", 0)),
            lean_epi=bool(got.get("LEAN_EPI", 0)),
            tree=bool(got.get("TREE", 0)),
            narrow=bool(got.get("NARROW", 0)),
        )

    def v7_bars(ptx: str) -> set[int]:
        return {int(n) for n in re.findall(r"fwd_v7\S*4bars\[(\d+)\];", ptx)}

    for d in cs.HEAD_DIMS:
        own = cs.V7_TILES[d]
        assert cs.v7_module(d, own) is cs.MODULES[d]
        ptx = cs.MODULES[d].compile("sm_90", target="ptx").decode()
        assert tiling(ptx, d) == own, d
        assert v7_bars(ptx) == {8 * ((4 if own.split_kv else 2) * own.stages + 1)}, d
        for t in {cs.V7_TILES_FIRST[d], *cs.V7_TILINGS[d]}:
            mod = cs.v7_module(d, t)
            assert mod is cs.v7_module(d, t) and mod is not cs.MODULES[d]
            ptx = mod.compile("sm_90", target="ptx").decode()
            assert set(asm.split_ptx(ptx)) == {f"attn_fwd_v7_d{d}_bf16", f"attn_fwd_v7_d{d}_f16"}
            assert tiling(ptx, d) == t, (d, t)
            assert v7_bars(ptx) == {8 * ((4 if t.split_kv else 2) * t.stages + 1)}, (d, t)
            if cuobjdump is None:
                continue
            with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                f.write(mod.compile("sm_90"))
                f.flush()
                cmd = [cuobjdump, "-res-usage", f.name]
                dump = subprocess.run(cmd, capture_output=True, text=True, check=True)
                res = asm.parse_res_usage(dump.stdout)
            for name, r in res.items():
                regs = 128 if t.three_wg else 168  # 512 or 384 threads x regs: 64 K of the pool
                assert r["STACK"] == 0 and r.get("LOCAL", 0) == 0 and r["REG"] == regs, (d, t, name, r)


# --------------------------------------------------------------------------- shared-memory layouts (no GPU)
#
# The copies write element (r, c) of a tile where attention_sm90.cu's tile_offset puts it;
# wgmma reads the element a descriptor names through CUTLASS's canonical layouts (GMMA
# Major-K ((8,m),(T,2)):((xT,SBO),(1,T)), Major-MN ((T,x,m),(8,k)):((1,T,LBO),(xT,SBO)),
# T = 8 elements, x = W / 16) and the Swizzle<log2 x, 4, 3> of the absolute byte address.
# The two formulations must name the same bytes for every operand, head dim and k step; so
# must a TMA box (v4-v6) of one slab, written row-major and swizzled the same way.


def _write_offset(d: int, rows: int, r: int, c: int) -> int:
    """attention_sm90.cu's tile_offset(r, c // 8) + the element's place in its chunk."""
    w = cs.swizzle_bytes(d)
    cpr = w // 16
    gc = c // 8
    sw = ((r * w) >> 7) & (cpr - 1)
    return (gc // cpr) * (rows * w) + r * w + (((gc % cpr) ^ sw) << 4) + 2 * (c % 8)


def _swizzle(addr: int, w: int) -> int:
    b = {32: 1, 64: 2, 128: 3}[w]
    return addr ^ (((addr >> 7) & ((1 << b) - 1)) << 4)


def _desc(addr: int, lbo: int, sbo: int, w: int) -> tuple[int, int, int]:
    """(start, LBO, SBO) bytes as the kernel's make_desc encodes them (4-bit units)."""
    assert addr % 16 == 0 and lbo % 16 == 0 and sbo % 16 == 0
    return addr, lbo, sbo


_D_BN = sorted(
    {(d, t.bn) for d in cs.HEAD_DIMS for t in (cs.tiles_of("v6", d), cs.V7_TILES[d]) + cs.V7_TILINGS[d]}
)


@pytest.mark.parametrize("d,bn", _D_BN)
def test_descriptors_read_what_the_copies_wrote(d, bn):
    w, base = cs.swizzle_bytes(d), 7 * 1024
    e, x = w // 2, w // 16

    def kmajor(tile_rows, row0, kk):  # desc_kmajor
        return _desc(base + (kk * 16 // e) * (tile_rows * w) + (kk * 16 % e) * 2 + row0 * w, 16, 8 * w, w)

    def mnmajor(tile_rows, kk):  # desc_mnmajor
        return _desc(base + kk * 16 * w, tile_rows * w, 8 * w, w)

    def read_k(desc, m, k):  # Major-K element (m, k)
        start, _, sbo = desc
        off = (m % 8) * x * 8 + (m // 8) * (sbo // 2) + (k % 8) + (k // 8) * 8
        return _swizzle(start + 2 * off, w)

    def read_mn(desc, k, n):  # Major-MN element (k, n)
        start, lbo, sbo = desc
        n0, n1, n2 = n % 8, (n // 8) % x, n // (8 * x)
        off = n0 + n1 * 8 + n2 * (lbo // 2) + (k % 8) * x * 8 + (k // 8) * (sbo // 2)
        return _swizzle(start + 2 * off, w)

    for kk in range(d // 16):
        for rows in (128, 192) if d == 64 else (128,):  # two or three consumer warpgroups (v7 "w")
            for wg in range(rows // 64):  # Q: A of S = Q K^T, the warpgroup's 64 rows of the tile
                desc = kmajor(rows, 64 * wg, kk)
                for m in range(64):
                    for k in range(16):
                        assert read_k(desc, m, k) == base + _write_offset(d, rows, 64 * wg + m, 16 * kk + k)
        desc = kmajor(bn, 0, kk)  # K: B of S = Q K^T (N = keys)
        for n in range(bn):
            for k in range(16):
                assert read_k(desc, n, k) == base + _write_offset(d, bn, n, 16 * kk + k)
    for kk in range(bn // 16):  # V: B of O = P V (K = keys, N = D), MN-major
        desc = mnmajor(bn, kk)
        for k in range(16):
            for n in range(d):
                assert read_mn(desc, k, n) == base + _write_offset(d, bn, 16 * kk + k, n)
    for rows in (128, 192, bn):  # v4-v7: a TMA box (one slab: E columns x rows, W bytes a row)
        for r in range(rows):  # lands row-major at its slab, swizzled on the absolute address
            for c in range(d):
                tma = _swizzle(base + (c // e) * rows * w + r * w + 2 * (c % e), w)
                assert tma == base + _write_offset(d, rows, r, c)


@pytest.mark.parametrize("d,rows", [(d, 128) for d in cs.HEAD_DIMS] + [(64, 192)])
def test_v7_o_rows_land_where_its_tma_store_reads_them(d, rows):
    """v7's epilogue: thread (warp, lane) of warpgroup cw writes O(r, 8j + 2q .. +1), r =
    64 cw + 16 warp + g + 8h, as 4 bytes at tile_offset(r, j) + 4q of the tile (128 rows, 192
    with three consumer warpgroups); one TMA box per slab, 64 rows from 64 cw W bytes into
    the slab, reads element (i, c) at the swizzled address of its row-major place. Every
    element of the warpgroup's 64 x D block is written exactly once and read back from where
    it was written; the box starts on a 1024-byte boundary (the swizzle pattern is that of
    absolute addresses)."""
    w, base = cs.swizzle_bytes(d), 5 * 1024
    e = w // 2
    for cw in range(rows // 64):
        box = {sl: base + sl * rows * w + 64 * cw * w for sl in range(d // e)}
        assert all(b % 1024 == 0 for b in box.values())
        written = {}
        for warp in range(4):
            for lane in range(32):
                g, q = lane // 4, lane % 4
                for h in (0, 1):
                    r = 64 * cw + 16 * warp + g + 8 * h
                    for j in range(d // 8):
                        for half in (0, 1):
                            c = 8 * j + 2 * q + half
                            # st.shared at tile_offset(r, j) + 4q: the pair's low half first
                            addr = base + _write_offset(d, rows, r, 8 * j) + 4 * q + 2 * half
                            assert (r - 64 * cw, c) not in written
                            written[(r - 64 * cw, c)] = addr
        assert len(written) == 64 * d
        for (i, c), addr in written.items():
            assert _swizzle(box[c // e] + i * w + 2 * (c % e), w) == addr


def test_p_fragment_is_the_a_operand():
    """S's accumulator (m64nN, fp32) holds s[4j + 2h + e] = S(g + 8h, 8j + 2q + e); the A
    operand from registers of k step kk is the m16n8k16 A fragment (a0..a7 = (g, 2q..+1),
    (g+8, 2q..+1), (g, 2q+8..+9), (g+8, 2q+8..+9) of the 16 keys): pack_p's p[4kk + i] =
    (s[8kk + 2i], s[8kk + 2i + 1]) must hold exactly those, in that order, for every lane."""
    for lane in range(32):
        g, q = lane // 4, lane % 4

        def acc(i):  # (row, col) of accumulator register i
            j, h, e = i // 4, (i % 4) // 2, i % 2
            return g + 8 * h, 8 * j + 2 * q + e

        for kk in range(128 // 16):
            want = [(g, 2 * q), (g, 2 * q + 1), (g + 8, 2 * q), (g + 8, 2 * q + 1),
                    (g, 2 * q + 8), (g, 2 * q + 9), (g + 8, 2 * q + 8), (g + 8, 2 * q + 9)]  # fmt: skip
            got = []
            for i in range(4):  # p[4kk + i] packs s[8kk + 2i] (low half) and s[8kk + 2i + 1]
                for half in range(2):
                    r, c = acc(8 * kk + 2 * i + half)
                    got.append((r, c - 16 * kk))
            assert got == want, (lane, kk)


# --------------------------------------------------------------------------- the launcher (no GPU)


class _Recorder:
    """Stands in for a loaded kernel: records the launch, writes nothing."""

    def __init__(self):
        self.max_dynamic_shared = 48 * 1024
        self.calls = []

    def set_max_dynamic_shared(self, n):
        self.max_dynamic_shared = n

    def __call__(self, grid, block, *args, shared=0, device_index=None):
        self.calls.append((grid, block, args, shared))


@pytest.fixture
def recorder(monkeypatch):
    rec = _Recorder()
    names = []

    def kernel(self, name, signature, device_index=None):
        assert signature == cs.signature(name.split("_")[2])
        names.append(name)
        return rec

    def tensor_map(address, elem_bytes, dims, strides, box, swizzle):
        return ("map", address, elem_bytes, dims, strides, box, swizzle)

    monkeypatch.setattr(cs.Module, "kernel", kernel)
    monkeypatch.setattr(cs, "_device_index", lambda t: 0)
    monkeypatch.setattr(cs, "sm_count", lambda dev: 132)
    monkeypatch.setattr(cs, "tensor_map", tensor_map)
    monkeypatch.setattr(cs, "PLANS", {})  # (plans bind the kernels they were made with)
    rec.names = names
    return rec


@pytest.mark.parametrize("variant", cs.VARIANTS)
def test_launcher_arguments(recorder, variant):
    """GQA 8 q heads over 2 k/v heads, S_q 300 (three blocks of 128), causal: grid
    (3, heads, batch) (v7, persistent at D = 80: its 3 x 8 x 2 items in one dimension, fewer
    than the SMs), the group, scale * log2 e (and v7 the batch count), strides in elements,
    o in empty_bshd's layout, lse (..., S_q) fp32, the shared memory the kernel checks."""
    q = torch.randn(2, 8, 300, 80, dtype=torch.bfloat16)
    k = torch.randn(2, 2, 200, 80, dtype=torch.bfloat16)
    v = torch.randn(2, 2, 200, 80, dtype=torch.bfloat16)
    o, lse = cs.forward(q, k, v, True, 0.3, variant)
    assert recorder.names == [f"attn_fwd_{variant}_d80_bf16"]
    ((grid, block, args, shared),) = recorder.calls
    assert grid == ((48, 1, 1) if variant == "v7" else (3, 8, 2)) and block == cs.THREADS[variant]
    assert shared == cs.smem_bytes(variant, 80) and recorder.max_dynamic_shared == shared
    o_strides = (300 * 8 * 80, 80, 8 * 80)  # o: (B, S, H, D) in memory
    if variant in cs.TMA_STORE_VARIANTS:
        tq, tk, tv, to, la = args[:5]
        assert tq[3:] == ((80, 300, 8, 2), (160, 300 * 160, 8 * 300 * 160), (16, 128, 1, 1), 32)
        assert tk[1] == k.data_ptr() and tv[1] == v.data_ptr() and tk[5] == (16, 128, 1, 1)
        # o (B, S, H, D) in memory: S stride 8 x 80 elements; a box of 64 rows (one warpgroup's)
        assert to == (
            "map",
            o.data_ptr(),
            2,
            (80, 300, 8, 2),
            (2 * 640, 2 * 80, 2 * 192000),
            (16, 64, 1, 1),
            32,
        )
        assert args[5:] == (300, 200, 8, 4, pytest.approx(0.3 * cs.LOG2E), 1, 2, 0)  # Z; no item counter
        oa = o
    elif variant in cs.TMA_VARIANTS:
        # one box = a 16-column slab (D = 80: 32-byte swizzle) of 128 query rows / 128 keys
        tq, tk, tv, oa, la = args[:5]
        assert tq == (
            "map",
            q.data_ptr(),
            2,
            (80, 300, 8, 2),
            (160, 300 * 160, 8 * 300 * 160),
            (16, 128, 1, 1),
            32,
        )
        assert tk == (
            "map",
            k.data_ptr(),
            2,
            (80, 200, 2, 2),
            (160, 200 * 160, 2 * 200 * 160),
            (16, 128, 1, 1),
            32,
        )
        assert tv[1] == v.data_ptr() and tv[3:] == tk[3:]
        assert args[5:11] == (300, 200, 8, 4, pytest.approx(0.3 * cs.LOG2E), 1)
        assert args[11:] == o_strides
    else:
        qa, ka, va, oa, la = args[:5]
        assert qa is q and ka is k and va is v  # contiguous: passed as they are
        assert args[5:11] == (300, 200, 8, 4, pytest.approx(0.3 * cs.LOG2E), 1)
        assert args[11:17] == q.stride()[:3] + k.stride()[:3]
        assert args[17:20] == v.stride()[:3]
        assert args[20:23] == o_strides
    assert oa.data_ptr() == o.data_ptr() and la is lse
    assert o.shape == q.shape and o.dtype == q.dtype
    assert lse.shape == (2, 8, 300) and lse.dtype == torch.float32 and lse.is_contiguous()


def test_launcher_takes_whole_chunk_views_in_place_and_copies_the_rest(recorder):
    """A transformer's q/k/v (views of one [B, S, 3, H, D] projection) are read in place;
    a sliced head dim or a base one element off 16 bytes is copied (aligned) first."""
    qkv = torch.randn(2, 40, 3, 4, 64, dtype=torch.float16)
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    cs.forward(q, k, v, False, 0.125, "v2")
    args = recorder.calls[-1][2]
    assert [a.data_ptr() for a in args[:3]] == [q.data_ptr(), k.data_ptr(), v.data_ptr()]
    assert args[11:14] == q.stride()[:3]
    wide = torch.randn(1, 2, 33, 128, dtype=torch.float16)
    sliced = wide[..., ::2]  # unit stride lost: copied
    cs.forward(sliced, sliced, sliced, False, 0.125, "v2")
    args = recorder.calls[-1][2]
    assert all(a.is_contiguous() and a.data_ptr() % 16 == 0 for a in args[:3])
    buf = torch.randn(1 + 2 * 33 * 64, dtype=torch.float16)
    off = buf[1:].view(1, 2, 33, 64)  # contiguous, base 2 bytes past alignment
    assert off.data_ptr() % 16
    cs.forward(off, off, off, True, 0.125, "v3")
    args = recorder.calls[-1][2]
    assert all(a.data_ptr() % 16 == 0 for a in args[:3])
    torch.testing.assert_close(args[0], off, rtol=0, atol=0)


def test_tensor_maps_of_strided_views_and_swizzles(recorder):
    """A [B, S, H, D] view (a model's q): the map keeps its strides (S before H in memory,
    no copy); a dim of length 1 gets the packed stride; the box is one W-byte slab wide."""
    qkv = torch.randn(2, 40, 3, 4, 96, dtype=torch.bfloat16)
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    cs.forward(q, k, v, False, 0.1, "v4")
    tq = recorder.calls[-1][2][0]
    assert tq[1] == q.data_ptr() and tq[3] == (96, 40, 4, 2)
    assert tq[4] == (2 * 3 * 4 * 96, 2 * 96, 2 * 40 * 3 * 4 * 96) and tq[5:] == ((32, 128, 1, 1), 64)
    one = torch.randn(1, 1, 33, 128, dtype=torch.float16)
    cs.forward(one, one, one, True, 0.1, "v5")
    tk = recorder.calls[-1][2][1]
    assert (
        tk[3] == (128, 33, 1, 1) and tk[4] == (256, 256 * 33, 256 * 33) and tk[5:] == ((64, 128, 1, 1), 128)
    )
    expanded = torch.randn(1, 1, 33, 256, dtype=torch.float16).expand(1, 2, 33, 256)  # stride 0: copied
    cs.forward(expanded, expanded, expanded, False, 0.1, "v4")
    tq = recorder.calls[-1][2][0]
    assert tq[1] != expanded.data_ptr() and tq[4][1] == 2 * 33 * 256 and tq[5] == (64, 128, 1, 1)
    assert [cs.swizzle_bytes(d) for d in cs.HEAD_DIMS] == [128, 32, 64, 128, 128]
    three = torch.randn(3, 17, 64, dtype=torch.float16)  # v7's o: (B, S, D) folds to (1, B, S, D)
    o, _ = cs.forward(three, three, three, True, 0.1, "v7")
    to = recorder.calls[-1][2][3]
    assert to[1] == o.data_ptr() and to[3] == (64, 17, 3, 1)
    assert to[4] == (2 * 3 * 64, 2 * 64, 2 * 3 * 17 * 64) and to[5:] == ((64, 64, 1, 1), 128)


def test_runtime_passes_a_tensor_map_by_value(monkeypatch):
    """A "tmap" argument: its 128 bytes are copied into the parameter slot the launch's
    pointer array points at (the driver copies them into the kernel's parameter space)."""
    import ctypes

    from kernellab.cuda import runtime

    seen = {}

    def launch(handle, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        p = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))
        seen["map"] = ctypes.string_at(p[0], 128)
        seen["n"] = ctypes.c_int32.from_address(p[1]).value
        return 0

    kern = object.__new__(runtime.Kernel)
    kern.name, kern.signature = "k", ("tmap", "i32")
    kern._slots = [runtime._CTYPE[t]() for t in kern.signature]
    kern._params = (ctypes.c_void_p * 2)(*[ctypes.addressof(x) for x in kern._slots])
    kern._nargs, kern._has_maps, kern._handle = 2, True, 0
    kern._lock, kern._launch, kern._use_core = __import__("threading").Lock(), launch, False
    monkeypatch.setattr(runtime, "_get_device", lambda: 0)
    monkeypatch.setattr(runtime, "_raw_stream", lambda i: 0)
    m = runtime.TensorMap()
    for i in range(16):
        m.opaque[i] = 0x0101010101010101 * (i + 1)
    kern(1, 1, m, 7, device_index=0)
    assert seen["map"] == bytes(m) and seen["n"] == 7
    assert ctypes.sizeof(runtime.TensorMap) == 128
    with pytest.raises(TypeError, match="k: a tensor-map argument takes a TensorMap"):
        kern(1, 1, 12345, 7, device_index=0)
    with pytest.raises(TypeError):
        kern(1, 1, m, m, device_index=0)  # a map where an int goes
    kern(1, 1, m, True, device_index=0)  # a bool is an int's value
    assert seen["n"] == 1


@pytest.mark.parametrize("tiles", [None, cs.Tiles(64, 2), cs.Tiles(80, 2)], ids=["default", "64x2", "80x2"])
def test_launcher_v7_tiling(recorder, monkeypatch, tiles):
    """v7 at D = 256: K / V boxes of the tiling's keys (80 by default, V7_TILES), the shared
    memory of its ring, the kernel from the tiling's module (MODULES[256] for the default
    80x2sed, a module of its own for any other); v2-v6 refuse a tiling."""
    modules = []
    kernel = cs.Module.kernel
    monkeypatch.setattr(
        cs.Module, "kernel", lambda self, *a, **k: modules.append(self) or kernel(self, *a, **k)
    )
    q, k, v = (torch.randn(1, 2, 300, 256, dtype=torch.bfloat16) for _ in range(3))
    cs.forward(q, k, v, True, 0.1, "v7", tiles)
    t = tiles or cs.V7_TILES[256]
    ((grid, block, args, shared),) = recorder.calls
    tq, tk, tv, to = args[:4]
    assert tq[5] == (64, 128, 1, 1) and tk[5] == tv[5] == (64, t.bn, 1, 1) and to[5] == (64, 64, 1, 1)
    assert shared == cs.smem_bytes("v7", 256, t) == 1024 + 128 * 512 + t.stages * 2 * t.bn * 512
    assert modules[0] is cs.v7_module(256, t)
    assert (modules[0] is cs.MODULES[256]) == (t == cs.V7_TILES[256])
    assert recorder.names == ["attn_fwd_v7_d256_bf16"]
    with pytest.raises(ValueError, match="only v7"):
        cs.forward(q, k, v, True, 0.1, "v6", cs.Tiles(64, 2))


_W3 = dict(fast_exp=True, desc_add=True, three_wg=True)


@pytest.mark.parametrize(
    "tiles", [cs.Tiles(128, 3, **_W3), cs.Tiles(128, 4, persistent=True, o_buffer=True, **_W3)], ids=str
)
def test_launcher_v7_three_warpgroups(recorder, monkeypatch, tiles):
    """v7 with three consumer warpgroups ("w", D = 64): 512 threads, 192 query rows a block
    (the grid's query blocks, Q's box), o's box still one warpgroup's 64 rows, the shared
    memory of a 192-row Q (and o) tile, the kernel from a module built with -DKL_ATTN_V7_WG=3."""
    monkeypatch.setattr(cs, "sm_count", lambda dev: 132)
    q, k, v = (torch.randn(2, 3, 400, 64, dtype=torch.bfloat16) for _ in range(3))
    cs.forward(q, k, v, True, 0.1, "v7", tiles)
    ((grid, block, args, shared),) = recorder.calls
    assert block == 512 and tiles.threads == 512 and tiles.rows == 192
    blocks = 3  # ceil(400 / 192)
    assert grid == ((min(blocks * 3 * 2, 132), 1, 1) if tiles.persistent else (blocks, 3, 2))
    tq, tk, tv, to = args[:4]
    assert tq[5] == (64, 192, 1, 1) and tk[5] == tv[5] == (64, 128, 1, 1) and to[5] == (64, 64, 1, 1)
    o_tile = 192 * 128 if tiles.o_buffer else 0
    ring = tiles.stages * 2 * 128 * 128
    assert shared == cs.smem_bytes("v7", 64, tiles) == 1024 + 192 * 128 + ring + o_tile
    assert "-DKL_ATTN_V7_WG=3" in cs.v7_module(64, tiles).options


def test_launcher_v7_persistent(recorder, monkeypatch):
    """A persistent v7 tiling: a one-dimensional grid of at most one block an SM (fewer when
    there are fewer items: query blocks x heads x batches), the batch count after the other
    scalars, its module's kernel; a persistent tiling with split K / V rings is refused, o's
    own buffer needs a persistent tiling and adds an o tile to the shared memory (which no
    longer fits three stages at D = 128)."""
    monkeypatch.setattr(cs, "sm_count", lambda dev: 5)
    t = cs.Tiles(128, 3, fast_exp=True, desc_add=True, persistent=True)
    assert str(t) == "128x3edp"
    for z, h, s, grid in ((2, 3, 300, (5, 1, 1)), (1, 2, 100, (2, 1, 1))):
        q, k, v = (torch.randn(z, h, s, 64, dtype=torch.bfloat16) for _ in range(3))
        cs.forward(q, k, v, True, 0.1, "v7", t)
        got, block, args, shared = recorder.calls[-1]
        assert got == grid and block == 384
        assert args[5:] == (s, s, h, 1, pytest.approx(0.1 * cs.LOG2E), 1, z, 0)
        assert shared == cs.smem_bytes("v7", 64, t)
    tq = cs.Tiles(128, 3, fast_exp=True, desc_add=True, persistent=True, o_buffer=True, queue=True)
    assert str(tq) == "128x3edpoq"
    q, k, v = (torch.randn(2, 3, 300, 64, dtype=torch.bfloat16) for _ in range(3))
    for _ in range(2):  # each launch its own counter, zeroed
        cs.forward(q, k, v, True, 0.1, "v7", tq)
        got, _, args, _ = recorder.calls[-1]
        assert got == (5, 1, 1) and args[5:-1] == (300, 300, 3, 1, pytest.approx(0.1 * cs.LOG2E), 1, 2)
        counter = args[-1]
        assert counter.dtype == torch.int32 and counter.shape == (1,) and int(counter) == 0
    assert recorder.calls[-1][2][-1] is not recorder.calls[-2][2][-1]
    with pytest.raises(ValueError, match="queue"):
        cs.check_tiles(64, cs.Tiles(128, 3, queue=True))
    with pytest.raises(ValueError, match="one K/V ring"):
        cs.check_tiles(128, cs.Tiles(128, 2, split_kv=True, persistent=True))
    with pytest.raises(ValueError, match="persistent"):
        cs.check_tiles(64, cs.Tiles(128, 3, o_buffer=True))
    with pytest.raises(ValueError, match="227 KB"):  # o's tile beside three stages at D = 128
        cs.check_tiles(128, cs.Tiles(128, 3, persistent=True, o_buffer=True))
    with pytest.raises(ValueError, match="narrow item"):  # no ring wider than the narrow tile
        cs.check_tiles(64, cs.Tiles(128, 3, persistent=True, narrow=True))
    with pytest.raises(ValueError, match="narrow item"):
        cs.check_tiles(64, cs.Tiles(208, 3, narrow=True))
    to = cs.Tiles(128, 3, fast_exp=True, desc_add=True, persistent=True, o_buffer=True)
    assert str(to) == "128x3edpo" and cs.smem_bytes("v7", 64, to) == cs.smem_bytes("v7", 64, t) + 128 * 64 * 2


def test_tiles_parse_reads_what_str_writes():
    """Tiles.parse is str's inverse over every tiling the module names (the lab's --tilings);
    flags out of order, unknown letters or a missing stage count are a ValueError."""
    for d in cs.HEAD_DIMS:
        for t in (cs.V7_TILES[d], cs.V7_TILES_FIRST[d], *cs.V7_TILINGS[d]):
            assert cs.Tiles.parse(str(t)) == t
    for bad in ("128x3fedpo", "128x3z", "128x", "x3", "128x3ee"):
        with pytest.raises(ValueError, match="KEYSxSTAGES"):
            cs.Tiles.parse(bad)


def test_v7_short_sequences_take_their_own_tilings(recorder, monkeypatch):
    """v7's default at D = 64 where every key fits one 208-key tile and not one of V7_TILES'
    (128 < S_k <= 208: ViT-B/16's 197): V7_SHORT's one 208-key tile, persistent, without the
    warpgroups' turns ("f"), masked by column where it can ("m"), the lean epilogue ("l"), and
    under causal a first query block that computes only the 128 keys it sees ("n");
    V7_TILES' elsewhere and at the other head dims; an explicit tiling wins over both. The
    launch uses the chosen tiling's module, K / V boxes of its keys and its shared memory."""
    short = cs.V7_SHORT[64]
    assert str(short) == "208x3edpofmln" and short in cs.V7_TILINGS[64]
    own = cs.V7_TILES[64]
    for s_k in (1, 128, 129, 197, 208, 209, 1024):
        want = short if 128 < s_k <= 208 else own
        assert cs.v7_tiles(64, s_k) == want, s_k
        assert cs.tiles_of("v7", 64, None, s_k) == want, s_k
        assert cs.v7_tiles(64, s_k, causal=True) == want, s_k
        assert cs.tiles_of("v7", 64, None, s_k, True) == want, s_k
    assert cs.v7_tiles(64) == own
    for d in (80, 96, 128, 256):
        assert cs.v7_tiles(d, 197) == cs.v7_tiles(d, 197, True) == cs.V7_TILES[d], d
    assert cs.tiles_of("v7", 64, cs.Tiles(128, 3), 197) == cs.Tiles(128, 3)
    assert cs.tiles_of("v6", 64, None, 197) == cs.tiles_of("v6", 64)
    modules = []
    kernel = cs.Module.kernel
    monkeypatch.setattr(
        cs.Module, "kernel", lambda self, *a, **k: modules.append(self) or kernel(self, *a, **k)
    )
    monkeypatch.setattr(cs, "sm_count", lambda dev: 132)
    for s, causal, t in ((197, False, short), (197, True, short), (256, False, own)):
        q, k, v = (torch.randn(3, 2, s, 64, dtype=torch.bfloat16) for _ in range(3))
        cs.forward(q, k, v, causal, 0.125, "v7")
        grid, block, args, shared = recorder.calls[-1]
        assert grid == (3 * 2 * 2, 1, 1) and block == 384
        assert args[1][5] == args[2][5] == (64, t.bn, 1, 1)
        assert shared == cs.smem_bytes("v7", 64, t)
        assert modules[-1] is cs.v7_module(64, t)
    assert modules[0] is modules[1] is not cs.MODULES[64] and modules[-1] is cs.MODULES[64]


def test_v7_many_items_take_their_own_tiling(recorder, monkeypatch):
    """v7's default at D = 64 past V7_SHORT's keys with at least V7_MANY_PER_SM items (query
    blocks x heads x batches) an SM: V7_MANY's tiling (persistent, no turns, the softmax's
    max and sum in four parts); below that V7_TILES'; V7_SHORT's keys and the other head dims
    keep theirs; an explicit tiling wins. The launch uses that tiling's module."""
    many = cs.V7_MANY[64]
    assert str(many) == "128x3edpofr" and many in cs.V7_TILINGS[64] and cs.V7_MANY_PER_SM == 3
    own, sms = cs.V7_TILES[64], 132
    assert cs.v7_tiles(64, 1024, False, 3 * sms, sms) == many
    assert cs.v7_tiles(64, 1024, True, 3 * sms, sms) == many
    assert cs.v7_tiles(64, 1024, False, 3 * sms - 1, sms) == own
    assert cs.v7_tiles(64, 1024, False, 10**6, 0) == own  # (no SM count: the default)
    assert cs.v7_tiles(64, 197, False, 10**6, sms) == cs.V7_SHORT[64]
    for d in (80, 96, 128, 256):
        assert cs.v7_tiles(d, 1024, False, 10**6, sms) == cs.V7_TILES[d], d
    assert cs.tiles_of("v7", 64, cs.Tiles(128, 3), 1024, False, 10**6, sms) == cs.Tiles(128, 3)
    modules = []
    kernel = cs.Module.kernel
    monkeypatch.setattr(
        cs.Module, "kernel", lambda self, *a, **k: modules.append(self) or kernel(self, *a, **k)
    )
    monkeypatch.setattr(cs, "sm_count", lambda dev: 4)
    # 3 query blocks x 2 heads x 2 batches = 12 items: 3 an SM of 4; one batch fewer, 6
    for z, t in ((2, many), (1, own)):
        q, k, v = (torch.randn(z, 2, 300, 64, dtype=torch.bfloat16) for _ in range(3))
        cs.forward(q, k, v, False, 0.125, "v7")
        grid, block, args, shared = recorder.calls[-1]
        assert grid == (4, 1, 1) and block == 384
        assert shared == cs.smem_bytes("v7", 64, t)
        assert modules[-1] is cs.v7_module(64, t)
    assert modules[0] is not cs.MODULES[64] and modules[-1] is cs.MODULES[64]


def _simulate_queue(n_tiles: list[int], stages: int, seed: int) -> None:
    """A model of a persistent v7 block with V7Tiles' QUEUE taking items of n_tiles K/V tiles
    each (0: a query block that sees no key), then the end. Per item k the producer fills the
    ring's first min(n, stages) uses of the item (each once its stage's empty phase came),
    waits for q_empty's phase k - 1 (8 consumer-warp arrivals), writes the item into
    item_slot and completes q_full's phase k (Q; the end by a plain arrival), then fills the
    item's other uses. A consumer warp waits for q_full's phase k, reads item_slot, reads
    the item's uses in order (arriving on each stage's empty) and arrives on q_empty after its
    last one (at once for an item with no tiles), as the o-buffer tiling's warps do after
    their last S = Q K^T. The nine agents move one step at a time in a random order
    (``seed``). Asserts no deadlock, item_slot and Q never rewritten while a warp still
    needs them, every warp seeing every item and the end in order, a stage never refilled
    while read."""
    seq = list(n_tiles) + [None]
    total = sum(n_tiles)
    ring, q_empty = RingModel(stages), PhaseBarrier(8)
    slot, q_phases = None, 0
    prod = [0, 0, 0, False]  # item (of seq), use within it, ring use, Q announced
    cons = [[0, 0, 0, False] for _ in range(8)]  # item, use within it, ring use, holding Q / the slot
    seen = [[] for _ in range(8)]

    def producer_step(go: bool) -> bool:
        nonlocal slot, q_phases
        item, it, u, announced = prod
        if item >= len(seq):
            return False
        n = seq[item] or 0
        if not announced and (seq[item] is None or it >= min(n, stages)):  # Q after the first tiles
            ok = item == 0 or q_empty.phases >= item
            if ok and go:
                assert not any(c[3] for c in cons), "item_slot / Q rewritten while held"
                slot, q_phases = item, q_phases + 1
                prod[:] = [item + 1, 0, u, False] if seq[item] is None or n == it else [item, it, u, True]
            return ok
        ok = ring.can_fill(u)
        if ok and go:
            ring.fill(u)
            it += 1
            prod[:] = [item + 1, 0, u + 1, False] if announced and it == n else [item, it, u + 1, announced]
        return ok

    def consumer_step(w: int, go: bool) -> bool:
        item, it, u, held = cons[w]
        if item >= len(seq):
            return False
        n = seq[item] or 0
        if not held and it == 0:  # q_full's phase `item`, then item_slot
            ok = q_phases > item
            if ok and go:
                assert slot == item, "item_slot of another item"
                seen[w].append(seq[slot])
                cons[w] = [len(seq), 0, u, False] if seq[slot] is None else [item, 0, u, True]
            return ok
        if ring.is_reading(w, u):  # done with this use
            if go:
                ring.end_read(w, u)
                cons[w] = [item, it + 1, u + 1, held]
            return True
        if held and it == n:  # the item's last S done: Q (and the slot) given back
            if go:
                q_empty.arrive()
                cons[w] = [item + 1, 0, u, False] if n == 0 else [item, it, u, False]
            return True
        if not held and it == n:  # (the o epilogue) then the next item
            if go:
                cons[w] = [item + 1, 0, u, False]
            return True
        ok = ring.can_read(u)
        if ok and go:
            ring.start_read(w, u)
        return ok

    interleave_items(producer_step, consumer_step, seq, prod, cons, seed, total)
    assert q_phases == len(seq) and all(c[2] == total for c in cons)
    assert all(x == seq for x in seen)


@pytest.mark.parametrize("n_tiles", [[0], [1], [3, 3, 3], [0, 2, 0, 0, 5], [8, 1, 0, 12], [2] * 9])
def test_queue_items_neither_deadlock_nor_overwrite_q(n_tiles):
    for stages in (2, 3):
        for seed in range(20):
            _simulate_queue(n_tiles, stages, seed)


def test_queue_in_the_source():
    """What _simulate_queue models, as attention_sm90.cu writes it: the producer claims the
    next item after the current one's last copy, writes item_slot after q_empty's wait and
    before Q's q_full arrival (the end by a plain arrival), and the consumers read item_slot
    right after q_full's wait."""
    src = cs.CU.read_text()
    body = src[src.index("void produce_tma_persist") :]
    body = body[: body.index("\n}\n")]
    i_wait = body.index(
        "if (k > 0) mbar_wait(q_empty, (k - 1) & 1);\n        if constexpr (QUEUE) *item_slot = i;"
    )
    i_q = body.index("mbar_expect_tx(b.q_full, V7Tiles<D>::Q_BYTES);", i_wait)
    i_rest = body.index("for (int it = pre; it < n; ++it)", i_q)
    i_claim = body.index("i = QUEUE ? (int)gridDim.x + atomicAdd(sched, 1) : i + (int)gridDim.x;", i_rest)
    assert i_wait < i_q < i_rest < i_claim
    end = body.index("if (QUEUE && i >= items) {")
    assert body.index("*item_slot = i;\n            mbar_arrive(b.q_full);", end) < i_wait
    pad = "\n" + " " * 16
    consumer = "mbar_wait(b.q_full, k & 1);" + pad + "i = item_slot;" + pad + "if (i >= items) break;"
    assert consumer in src


def _persistent_items(n_mb, h, z, causal, s_k, d, l2_bytes):
    """attention_sm90.cu's item_of over i = 0 .. items - 1, in Python."""
    zhn = z * h
    hc = max(1, min(zhn, l2_bytes // (4 * d * max(s_k, 1))))
    out = []
    for i in range(n_mb * zhn):
        if not causal:
            zh, mb = i // n_mb, i % n_mb
        else:
            c = i // (hc * n_mb)
            w = i - c * hc * n_mb
            base = c * hc
            cs_ = min(hc, zhn - base)
            zh, mb = base + w % cs_, n_mb - 1 - w // cs_
        out.append((mb, zh % h, zh // h))
    return out, hc


@pytest.mark.parametrize(
    "n_mb,h,z,s_k,d",
    [(2, 12, 256, 197, 64), (16, 32, 4, 2048, 128), (64, 32, 1, 8192, 128), (16, 32, 4, 2048, 80),
     (8, 32, 4, 1024, 96), (33, 8, 1, 4097, 128), (1, 3, 1, 5, 64)],
)  # fmt: skip
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_persistent_items_cover_every_block_once_in_l2_sized_chunks(n_mb, h, z, s_k, d, causal):
    """The persistent v7's items (item_of, mirrored): every (query block, head, batch) once;
    without a mask a head's query blocks one after another; under causal chunk after chunk
    of (batch, head) pairs whose K and V (4 x D x S_k bytes each) fit in ITEM_L2_BYTES, each
    chunk's query blocks heaviest (last) first, the last chunk partial."""
    import re

    src = (Path(cs.__file__).with_name("attention_sm90.cu")).read_text()
    m = re.search(r"ITEM_L2_BYTES = (\d+)ll << (\d+);", src)
    l2 = int(m.group(1)) << int(m.group(2))
    assert l2 == 32 << 20
    items, hc = _persistent_items(n_mb, h, z, causal, s_k, d, l2)
    assert "const long long n = ITEM_L2_BYTES / (4ll * D * (S_k > 0 ? S_k : 1));" in src
    assert sorted(items) == sorted((mb, hh, zz) for mb in range(n_mb) for hh in range(h) for zz in range(z))
    if not causal:
        assert items == [(mb, hh, zz) for zz in range(z) for hh in range(h) for mb in range(n_mb)]
        return
    assert hc * 4 * d * s_k <= l2 or hc == 1
    for c in range(0, len(items), hc * n_mb):
        chunk = items[c : c + hc * n_mb]
        assert len({(hh, zz) for _, hh, zz in chunk}) <= hc
        assert [mb for mb, _, _ in chunk] == sorted((mb for mb, _, _ in chunk), reverse=True)


def test_launcher_3d_and_empty(recorder):
    q = torch.randn(3, 17, 64, dtype=torch.float16)  # (B, S, D): B heads of one batch
    o, lse = cs.forward(q, q, q, False, 0.125, "v2")
    grid = recorder.calls[-1][0]
    assert grid == (1, 3, 1) and o.shape == q.shape and lse.shape == (3, 17)
    n = len(recorder.calls)
    empty = torch.randn(2, 4, 0, 64, dtype=torch.float16)
    o, lse = cs.forward(empty, q.new_zeros(2, 4, 5, 64), q.new_zeros(2, 4, 5, 64), True, 0.1, "v3")
    assert len(recorder.calls) == n and o.shape == (2, 4, 0, 64) and lse.shape == (2, 4, 0)
    no_keys = q.new_zeros(2, 4, 0, 64)
    o, lse = cs.forward(torch.randn(2, 4, 5, 64, dtype=torch.float16), no_keys, no_keys, False, 0.1, "v4")
    assert len(recorder.calls) == n  # no key: o = 0, lse = -inf without a launch (as the reference)
    assert torch.equal(o, torch.zeros_like(o)) and torch.isneginf(lse).all()


def test_launch_plan_made_once_per_layout_and_bound_to_each_calls_tensors(recorder):
    """The second call at the same shapes, strides and options reuses the first's plan
    (one entry in PLANS, no new kernel lookup) and launches with its own tensors' addresses
    and a fresh o; another stride layout or option is another plan; a refusal is no plan."""
    q, k, v = (torch.randn(1, 4, 70, 64, dtype=torch.bfloat16) for _ in range(3))
    o1, _ = cs.forward(q, k, v, True, 0.125, "v7")
    q2, k2, v2 = (torch.randn(1, 4, 70, 64, dtype=torch.bfloat16) for _ in range(3))
    o2, lse2 = cs.forward(q2, k2, v2, True, 0.125, "v7")
    assert len(cs.PLANS) == 1 and recorder.names == ["attn_fwd_v7_d64_bf16"]
    first, second = recorder.calls[0][2], recorder.calls[1][2]
    assert [m[1] for m in second[:4]] == [q2.data_ptr(), k2.data_ptr(), v2.data_ptr(), o2.data_ptr()]
    assert [m[3:] for m in second[:4]] == [m[3:] for m in first[:4]] and second[4] is lse2
    assert o2.data_ptr() != o1.data_ptr() and second[5:] == first[5:]
    cs.forward(q, k, v, False, 0.125, "v7")
    qkv = torch.randn(1, 70, 3, 4, 64, dtype=torch.bfloat16)
    cs.forward(*qkv.permute(2, 0, 3, 1, 4).unbind(0), True, 0.125, "v7")  # a model's strided views
    assert len(cs.PLANS) == 3 and recorder.calls[-1][2][0][4] == (
        2 * 3 * 4 * 64,
        2 * 64,
        2 * 64 * 70 * 4,
    )  # batch of 1: packed
    with pytest.raises(ValueError, match="scale must be positive"):
        cs.forward(q, k, v, True, -1.0, "v7")
    assert len(cs.PLANS) == 3


def test_launch_plan_steps_over_strides_of_length_one_dims(recorder):
    """A dim of length 1 is never stepped along: whatever its stride, the tensor is read in
    place (the map gives it the packed stride); a copy is made only for dims that matter."""
    base = torch.randn(4, 33, 128, dtype=torch.float16)
    odd = base.as_strided((1, 4, 33, 128), (3, 33 * 128, 128, 1))  # batch stride 3: unused
    assert cs.in_place(odd, True) and cs._chunked(cs.at._split(odd), True) is not None
    cs.forward(odd, odd, odd, True, 0.1, "v7")
    tq = recorder.calls[-1][2][0]
    assert tq[1] == odd.data_ptr() and tq[4] == (256, 256 * 33, 256 * 33 * 4)
    sliced = torch.randn(1, 4, 33, 256, dtype=torch.float16)[..., ::2]  # D stride 2: copied
    assert not cs.in_place(sliced, True)
    cs.forward(sliced, sliced, sliced, True, 0.1, "v7")
    assert recorder.calls[-1][2][0][1] != sliced.data_ptr()


@pytest.mark.parametrize("variant", cs.VARIANTS)
def test_launcher_refusals_name_the_argument(recorder, variant):
    q = torch.randn(1, 2, 9, 64)
    with pytest.raises(TypeError, match=rf"attention/cuda_{variant}: q has dtype float32"):
        cs.forward(q, q, q, False, 0.1, variant)
    q = torch.randn(1, 2, 9, 48, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=rf"attention/cuda_{variant}: q has head dim 48"):
        cs.forward(q, q, q, False, 0.1, variant)
    q = torch.randn(1, 2, 9, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=rf"attention/cuda_{variant}: scale must be positive"):
        cs.forward(q, q, q, False, -0.1, variant)
    q = torch.randn(1, 65536, 1, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="65536 heads"):
        cs.forward(q, q, q, False, 0.1, variant)
    assert not recorder.calls


@pytest.mark.parametrize("backend", BACKENDS)
def test_limits_and_refusals(backend):
    impl = kernellab.registry.get("attention", backend)
    assert impl.dtypes == (torch.float16, torch.bfloat16) and impl.devices == ("cuda",)
    q = torch.empty(1, 4, 9, 80, dtype=torch.bfloat16, device="meta")
    kv = torch.empty(1, 2, 9, 80, dtype=torch.bfloat16, device="meta")
    assert impl.outside_limits((q, kv, kv), {"causal": True}) is None  # GQA, D = 80
    q32 = torch.empty(1, 2, 9, 32, dtype=torch.bfloat16, device="meta")
    assert "head dim 32" in impl.outside_limits((q32, q32, q32), {})
    assert "window" in impl.outside_limits((q, kv, kv), {"window": (3, 3)})
    assert "softcap" in impl.outside_limits((q, kv, kv), {"softcap": 5.0})
    for kw, pat in (({"window": (3, 3)}, "window"), ({"softcap": 2.0}, "softcap")):
        with pytest.raises(ValueError, match=rf"attention/{backend}: {pat}"):
            impl.fn(q, kv, kv, **kw)


@pytest.mark.parametrize("backend", BACKENDS)
def test_cpu_tensors_and_fp32_refused(backend):
    if torch.cuda.is_available():
        pytest.skip("checked on a machine without a GPU (where every tensor is a CPU tensor)")
    q, k, v = SPEC.make_inputs((1, 2, 9, 64), torch.bfloat16, "cpu", 0)
    with pytest.raises(ValueError, match=r"\bq\b is on cpu"):
        A.attention(q, k, v, backend=backend)
    with pytest.raises(TypeError, match=rf"attention/{backend}: q has dtype float32"):
        kernellab.registry.get("attention", backend).fn(q.float(), k.float(), v.float())


def test_available_only_on_sm90(monkeypatch):
    _nvrtc()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    assert cs.available() == "needs sm_90 (Hopper wgmma); this GPU is sm_80"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (10, 0))
    assert cs.available() == "needs sm_90 (Hopper wgmma); this GPU is sm_100"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    assert cs.available() is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cs.available() is None  # no GPU: "compiled, not run"


def test_default_backend_never_picks_them():
    """Not in the op's preferred backends: the default reaches them only through a tuning
    table row that names them (none is committed)."""
    assert not set(BACKENDS) & set(SPEC.default_backends)


# --------------------------------------------------------------------------- the kernel's math (no GPU)


@pytest.mark.parametrize("s_q,s_k", [(1, 1), (300, 300), (129, 500), (500, 129), (64, 0)])
@pytest.mark.parametrize("d,bn", _D_BN)
def test_schedule_visits_every_needed_key_and_masks_every_crossing_tile(s_q, s_k, d, bn):
    """Brute force over (row, key): every key a row may see lies in a visited tile; a tile
    left unmasked holds only keys every row of its block may see; causal blocks come
    heaviest first; each query block once."""
    for causal in (False, True):
        sched = cs.schedule(s_q, s_k, d, causal, bn)
        assert sorted(mb for mb, _, _ in sched) == list(range(math.ceil(s_q / 128)))
        if causal:
            work = [len(tiles) for _, _, tiles in sched]
            assert work == sorted(work, reverse=True)
        ok = AA.allowed_mask(s_q, s_k, causal, None, "cpu")
        ok = torch.ones(s_q, s_k, dtype=torch.bool) if ok is None else ok
        for _, m0, tiles in sched:
            rows = range(m0, min(m0 + 128, s_q))
            visited = set()
            for n0, masked in tiles:
                visited.update(range(n0, min(n0 + bn, s_k)))
                if not masked:  # (rows past S_q, computed and dropped, see more keys still)
                    assert n0 + bn <= s_k and ok[m0 : m0 + 128, n0 : n0 + bn].all()
            for i in rows:
                need = set(torch.nonzero(ok[i]).flatten().tolist())
                assert need <= visited, (i, sorted(need - visited)[:5])


EMU_SHAPES = [
    (1, 2, 130, 300, 64),  # S_q < S_k, two query blocks, three key tiles
    (1, 2, 300, 130, 80),  # S_q > S_k: causal leaves 170 rows without a key
    (1, 4, 2, 257, 129, 96),  # GQA, group 2
    (2, 131, 128),  # 3-D
    (1, 1, 5, 140, 256),  # D = 256: 64-key tiles
    (1, 2, 1, 1, 64),
]


@pytest.mark.parametrize("dtype", HALF, ids=dtype_id)
@pytest.mark.parametrize("shape", EMU_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_emulated_kernel_matches_the_reference(shape, dtype, causal):
    q, k, v = SPEC.make_inputs(shape, dtype, "cpu", 3)
    scale = 1 / math.sqrt(q.shape[-1])
    o, lse = cs.emulate(q, k, v, causal, scale)
    _check_o_lse(o, lse, q, k, v, causal, scale)


# v7's tilings (V7_TILES and the ones the lab times): tails of the key tile, S_q < S_k and
# S_q > S_k, GQA, at every tiling's head dim and width.
EMU_V7 = sorted(
    {
        (d, t.bn, t.rows)
        for d in cs.HEAD_DIMS
        for t in (cs.V7_TILES[d],) + cs.V7_TILINGS[d]
        if (t.bn, t.rows) != (cs.block_n(d), cs.BM)
    }
)


@pytest.mark.parametrize("d,bn,bm", EMU_V7)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_emulated_kernel_matches_the_reference_at_v7_tilings(d, bn, bm, causal):
    for n, shape in enumerate(((1, 2, 130, 5 * bn + 7, d), (1, 4, 2, 300, bn + 1, d), (1, 2, 400, 200, d))):
        q, k, v = SPEC.make_inputs(shape, torch.bfloat16, "cpu", 30 + n)
        scale = 1 / math.sqrt(d)
        o, lse = cs.emulate(q, k, v, causal, scale, bn, bm)
        _check_o_lse(o, lse, q, k, v, causal, scale)


def test_emulated_kernel_survives_large_scores():
    """The first query row scaled x30 (the check's planted case): scores near 100 would
    overflow exp without the running max."""
    q, k, v = SPEC.make_inputs((1, 2, 200, 333, 128), torch.bfloat16, "cpu", 4)
    q[..., 0, :] *= 30
    o, lse = cs.emulate(q, k, v, True, 0.2)
    assert torch.isfinite(o).all()
    _check_o_lse(o, lse, q, k, v, True, 0.2)


# --------------------------------------------------------------------------- GPU


def _sm90():
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    why = cs.available()
    if why:
        pytest.skip(why)


GPU_SHAPES = [
    (1, 1, 1, 1, 64),
    (2, 3, 17, 17, 64),
    (1, 2, 127, 129, 80),
    (1, 2, 129, 127, 96),
    (1, 2, 300, 1000, 128),
    (1, 2, 1000, 300, 128),
    (2, 257, 64),  # 3-D
    (1, 2, 255, 256, 256),
    (1, 2, 300, 333, 256),  # v7's 80-key candidate: a 13-key tail; S_q < S_k
    (1, 8, 2, 517, 517, 128),  # GQA 4
    (2, 4, 1, 384, 130, 80),  # MQA
    (1, 4, 2048, 64),
]


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gpu_v7_many_items_default(causal):
    """v7's default at D = 64 with at least V7_MANY_PER_SM items an SM (V7_MANY's tiling):
    against its emulation and the reference, odd lengths, GQA, S_q != S_k."""
    _sm90()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for n, shape in enumerate([(8, 12, 520, 64), (4, 32, 8, 400, 333, 64)]):
        q, k, v = SPEC.make_inputs(shape, torch.bfloat16, "cuda", 90 + n)
        items = -(-q.shape[-2] // cs.BM) * q.shape[1] * q.shape[0]
        assert items >= cs.V7_MANY_PER_SM * sms, shape
        t = cs.v7_tiles(64, k.shape[-2], causal, items, sms)
        assert t == cs.V7_MANY[64]
        _check_v7(q, k, v, causal, 1 / math.sqrt(64), None, t.bn)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", HALF, ids=dtype_id)
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gpu_forward_against_emulation_and_reference(backend, dtype, shape, causal):
    _sm90()
    q, k, v = SPEC.make_inputs(shape, dtype, "cuda", 5)
    scale = 1 / math.sqrt(q.shape[-1])
    variant = backend.split("_")[1]
    o, lse = cs.forward(q, k, v, causal, scale, variant)
    torch.cuda.synchronize()
    eo, else_ = cs.emulate(q, k, v, causal, scale, cs.tiles_of(variant, q.shape[-1]).bn)
    fin = torch.isfinite(else_)
    assert torch.equal(fin, torch.isfinite(lse))
    torch.testing.assert_close(lse[fin], else_[fin], rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(o.float(), eo.float(), rtol=2e-2, atol=2e-2)
    _check_o_lse(o, lse, q, k, v, causal, scale)


V7_GPU = [(d, t) for d in cs.HEAD_DIMS for t in cs.V7_TILINGS[d]]


def _check_v7(q, k, v, causal, scale, tiles, bn):
    """v7's forward at ``tiles`` (None: its default) against its emulation at bn keys a tile
    and its query rows a block (lse where finite, and o) and against the reference
    (_check_o_lse)."""
    o, lse = cs.forward(q, k, v, causal, scale, "v7", tiles)
    torch.cuda.synchronize()
    eo, else_ = cs.emulate(q, k, v, causal, scale, bn, tiles.rows if tiles else cs.BM)
    fin = torch.isfinite(else_)
    assert torch.equal(fin, torch.isfinite(lse))
    torch.testing.assert_close(lse[fin], else_[fin], rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(o.float(), eo.float(), rtol=2e-2, atol=2e-2)
    _check_o_lse(o, lse, q, k, v, causal, scale)


@pytest.mark.gpu
@pytest.mark.parametrize("d,tiles", V7_GPU, ids=lambda x: str(x))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gpu_v7_at_every_tiling_the_lab_times(d, tiles, causal):
    """v7 at the tilings the lab times beside V7_TILES (80x2 from MODULES[256], the others
    from modules of their own): against its emulation at that tiling and the reference, odd
    lengths, GQA, S_q != S_k. A persistent tiling also at more items than SMs (each block
    walks several; under causal the first query blocks see no key)."""
    _sm90()
    shapes = [(1, 2, 130, 3 * tiles.bn + 7, d), (1, 8, 2, 517, 300, d), (2, 2, 1025, d)]
    if tiles.persistent:
        shapes.append((4, 16, 4, 517, 300, d))
    for n, shape in enumerate(shapes):
        q, k, v = SPEC.make_inputs(shape, torch.bfloat16, "cuda", 40 + n)
        scale = 1 / math.sqrt(d)
        _check_v7(q, k, v, causal, scale, tiles, tiles.bn)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", HALF, ids=dtype_id)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gpu_v7_short_sequences_default(dtype, causal):
    """v7's default at D = 64 and 129-208 keys (V7_SHORT's tiling: ViT-B/16's 197 tokens):
    against its emulation at the tiling's keys a tile and the reference, with S_q below, at
    and above S_k, GQA, and more items than SMs."""
    _sm90()
    for n, shape in enumerate([(4, 12, 197, 64), (1, 8, 2, 300, 129, 64), (2, 4, 2, 1, 208, 64),
                               (300, 2, 160, 64)]):  # fmt: skip
        q, k, v = SPEC.make_inputs(shape, dtype, "cuda", 70 + n)
        t = cs.v7_tiles(64, k.shape[-2], causal)
        assert t == cs.V7_SHORT[64]
        scale = 1 / math.sqrt(64)
        _check_v7(q, k, v, causal, scale, None, t.bn)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", HALF, ids=dtype_id)
@pytest.mark.parametrize("d", cs.HEAD_DIMS)
def test_gpu_forward_and_grads_every_head_dim(backend, dtype, d):
    _sm90()
    for shape, causal in (((1, 4, 2, 200, 333, d), True), ((2, 2, 257, d), False)):
        args = SPEC.make_inputs(shape, dtype, "cuda", 6)
        a64 = [a.detach().double().requires_grad_() for a in args]
        ref = SPEC.reference(*a64, causal=causal)
        dy = torch.randn(ref.shape, device="cuda").to(dtype)
        ref_g = torch.autograd.grad(ref, a64, dy.double())

        def run(b):
            leaves = [a.detach().clone().requires_grad_() for a in args]
            out = A.attention(*leaves, causal=causal, backend=b)
            return (out,) + torch.autograd.grad(out, leaves, dy)

        base, got = run("torch"), run(backend)
        for name, g, r, b in zip(("o", "dq", "dk", "dv"), got, (ref,) + ref_g, base):
            verdict = judge(g, r, dtype, b)
            assert verdict.ok, (
                f"{shape} {name}: {verdict.detail} (err {verdict.err:.3g}, bound {verdict.bound:.3g})"
            )


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_gpu_saved_tensors_are_inputs_output_and_lse(backend):
    _sm90()
    q, k, v = (
        t.requires_grad_() for t in SPEC.make_inputs((1, 4, 2, 150, 170, 128), torch.bfloat16, "cuda", 7)
    )
    o = A.attention(q, k, v, causal=True, backend=backend)
    saved = o.grad_fn.saved_tensors
    assert len(saved) == 5 and torch.equal(saved[0], q) and torch.equal(saved[3], o)
    want = _ref_lse2(q.detach(), k.detach(), v.detach(), True, 1 / math.sqrt(128))
    assert saved[4].shape == q.shape[:-1] and saved[4].dtype == torch.float32
    torch.testing.assert_close(saved[4].double(), want, rtol=1e-5, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_gpu_reruns_bitwise_equal(backend):
    _sm90()
    q, k, v = SPEC.make_inputs((2, 4, 1025, 128), torch.bfloat16, "cuda", 12)
    first = A.attention(q, k, v, causal=True, backend=backend)
    for _ in range(20):
        assert torch.equal(A.attention(q, k, v, causal=True, backend=backend), first)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_gpu_custom_ops_opcheck(backend):
    _sm90()
    fn = kernellab.registry.get("attention", backend).fn
    for op, build, _ in fn.custom_ops:
        gen = torch.Generator(device="cuda").manual_seed(0)

        def make(rg, gen=gen):
            t = torch.randn(2, 3, 37, 64, generator=gen, device="cuda").to(torch.bfloat16)
            return t.requires_grad_(bool(rg))

        torch.library.opcheck(op, build(make))
