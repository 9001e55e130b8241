"""attention's Hopper CUDA backward (backends cuda_v8 and cuda_v9: attention_sm90_bwd.cu,
cuda_v7's forward; v9 stages dQ in shared memory and bulk reduce-adds it).

Without a GPU: every head dim's module compiles for sm_90a with the three kernels the
launcher names, no local memory, the main kernel at exactly the 168 registers a thread its
setmaxnreg budget (24 / 240) assumes, parameter sizes equal to the launcher's signatures;
the wgmma descriptors of the backward's operands (S^T's K and Q, dV's dO, dK's Q, dQ's
dS^T and K tiles, both MN-major) address the bytes the copies and the dS^T stores wrote;
the ring's and the named barriers' protocol in a model (no deadlock, no stage overwritten
while read); the launcher's arguments with the kernels replaced by a recorder; the block
schedule (every (row, key) pair a row may see is visited once per q head, masks wherever a
pair is not allowed); the kernels' arithmetic (``emulate_backward``) against the float64
reference. D = 256's dQ: float4 reductions only, no spills, no serialized wgmmas; the
blocked offsets they write cover the query block once and the postprocess maps them back.
The lab builds of P (``BwdOpts.fast_exp``, ``mask_branch``) compile as cleanly, with the
exponential they name; on a GPU each exact lab build meets the reference and the emulation.
With a GPU (``gpu``): dq, dk, dv against the float64 reference with the rule the Triton
backward's tests use (2 x PyTorch's own error + a floor), odd lengths, causal and not, GQA,
every head dim, and against ``emulate_backward``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re

import pytest
import torch

import kernellab
import kernellab.ops.attention as A
from kernellab.harness.compare import judge
from kernellab.ops.attention import args as AA
from kernellab.ops.attention import cuda_sm90 as cs
from kernellab.ops.attention import cuda_sm90_bwd as cb
from kltest import PhaseBarrier, RingModel, dtype_id, interleave_items, nvrtc_log

SPEC = kernellab.get_spec("attention")
HALF = [torch.float16, torch.bfloat16]
BACKEND = "cuda_v8"
BACKENDS = tuple(f"cuda_{v}" for v in cb.VARIANTS)


def _nvrtc():
    why = cb.nvrtc_unavailable()
    if why:
        pytest.skip(why)


def _grads_ref(q, k, v, do, causal, scale):
    """(float64 reference gradients, PyTorch's own gradients in the input dtype)."""
    a64 = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref = SPEC.reference(*a64, causal=causal, scale=scale)
    ref_g = torch.autograd.grad(ref, a64, do.double())
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = A.attention(*leaves, causal=causal, scale=scale, backend="torch")
    base_g = torch.autograd.grad(out, leaves, do)
    return ref_g, base_g


def _check_grads(got, q, k, v, do, causal, scale, what=""):
    ref_g, base_g = _grads_ref(q, k, v, do, causal, scale)
    for name, g, r, b in zip(("dq", "dk", "dv"), got, ref_g, base_g):
        assert g.shape == r.shape and g.dtype == q.dtype, (name, g.shape, g.dtype)
        verdict = judge(g, r, q.dtype, b)
        assert verdict.ok, (
            f"{what} {name}: {verdict.detail} (err {verdict.err:.3g}, bound {verdict.bound:.3g})"
        )


# --------------------------------------------------------------------------- compile (no GPU)


def _names(d):
    kinds = ("pre", "post", "post_blk", f"v8_d{d}", f"v9_d{d}")
    return {f"attn_bwd_{k}_{sfx}" for k in kinds for sfx in ("f16", "bf16")}


def test_every_head_dim_compiles_for_sm90a_with_no_local_memory():
    """Per head dim: the preprocess, main and postprocess kernels for fp16 and bf16; no
    spills; the main kernel at exactly 168 registers a thread: 384 x 168 = 64512 is the
    pool setmaxnreg redistributes (128 x 24 for the producer + 256 x 240 for the
    consumers; at fewer, the consumers' setmaxnreg.inc would wait forever)."""
    _nvrtc()
    from kernellab.inspect import asm

    for d in cb.BWD_HEAD_DIMS:
        mod = cb.MODULES[d]
        ptx = mod.compile("sm_90", target="ptx").decode()
        bodies = asm.split_ptx(ptx)
        assert set(bodies) == _names(d), (d, set(bodies))
        main = bodies[f"attn_bwd_v8_d{d}_bf16"]
        v9 = bodies[f"attn_bwd_v9_d{d}_bf16"]
        bulk = (
            "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32",
            "cp.async.bulk.commit_group",
            "cp.async.bulk.wait_group.read 0",
            "cp.async.bulk.wait_group 0",
            "st.shared.v4.f32",
        )
        if cb.bulk_dq(d, "v9"):  # v9: dQ by bulk reduce-adds, no atomics
            assert all(n in v9 for n in bulk) and "red.relaxed" not in v9, d
        else:  # D = 256: v8's kernel, float4 reductions
            assert set(_RED.findall(v9)) == {"red.relaxed.gpu.global.add.v4.f32"} and bulk[0] not in v9, d
        assert all(n not in main for n in bulk[:4])
        for needle in (
            "wgmma.mma_async", "setmaxnreg.dec.sync.aligned.u32 24", "setmaxnreg.inc.sync.aligned.u32 240",
            "cp.async.bulk.tensor.4d", "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes",
            "fence.proxy.async.shared::cta", "wgmma.wait_group.sync.aligned 1",
        ):  # fmt: skip
            assert needle in main and needle in v9, (d, needle)
        red = "v4" if cb.splits_d(d) else "v2"
        assert set(_RED.findall(main)) == {f"red.relaxed.gpu.global.add.{red}.f32"}, d
        # dV, dK: N = the warpgroup's columns; dQ = dS K: both operands MN-major (imm-trans-a =
        # imm-trans-b = 1)
        nv = d // 2 if cb.splits_d(d) else d
        assert f"m64n{nv}k16.f32.bf16.bf16" in main and "p, 1, 1, 1, 1;" in main
        _assert_res_usage(d, mod)


def _nvrtc_log(*defines: str) -> tuple[int, str]:
    """(NVRTC's error code, its log with ptxas's verbose output) for the .cu compiled for
    sm_90a with ``defines``."""
    return nvrtc_log(cb.CU, defines)


def _ptxas_log(d: int, *defines: str) -> str:
    """ptxas's verbose log of the head dim's module (NVRTC, sm_90a), plus ``defines``."""
    err, text = _nvrtc_log(f"-DKL_ATTN_D={d}", *defines)
    assert err == 0, text
    return text


def test_wgmmas_are_not_serialized_for_lack_of_registers():
    """ptxas serializes the wgmmas of a kernel whose accumulators do not fit the registers
    setmaxnreg gives it (warning C7512: each wgmma then waits for the previous one), or
    where non-wgmma code reads a wgmma's registers while it may be in flight (C7514), or
    injects a wait_group where it cannot prove a register's wgmma retired (C7517: v9's dQ
    kept across the back edge); none of them, and no spills either."""
    _nvrtc()
    for d in cb.BWD_HEAD_DIMS:
        log = _ptxas_log(d)
        assert "attn_bwd_v8" in log and "attn_bwd_v9" in log, log[-2000:]
        assert "C75" not in log and "serialized" not in log and "injected" not in log, (d, log[-2000:])
        assert "0 bytes spill stores, 0 bytes spill loads" in log and " bytes spill stores" in log
        assert all(
            line.strip().endswith("0 bytes spill stores, 0 bytes spill loads")
            for line in log.splitlines()
            if "spill stores" in line
        ), (d, log)


def _assert_build_clean(d: int, mod, *defines: str) -> None:
    """Head dim d's module ``mod``, compiled with ``defines``: no serialized wgmmas in
    ptxas's log, no spills, stack or local memory, the main kernels (v8 and v9, bf16 and
    f16) at setmaxnreg's 168 registers a thread; cuobjdump's resource usage agrees."""
    log = _ptxas_log(d, *defines)
    assert f"attn_bwd_v8_d{d}" in log and f"attn_bwd_v9_d{d}" in log, log[-2000:]
    assert "C75" not in log and "serialized" not in log and "injected" not in log, log[-2000:]
    spills = [line for line in log.splitlines() if "spill stores" in line]
    clean = "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads"
    assert spills and all(line.strip().endswith(clean) for line in spills), log
    assert not [line for line in log.splitlines() if "Used" in line and "lmem" in line], log
    main_regs = [line for line in log.splitlines() if "Used 168 registers" in line]
    assert len(main_regs) == 4, log  # v8 and v9, bf16 and f16
    _assert_res_usage(d, mod)


def _assert_res_usage(d: int, mod) -> None:
    """cuobjdump's resource usage of head dim d's module (where cuobjdump is found): no stack
    or local memory in any kernel, the main kernels (v8, v9) at 168 registers a thread."""
    import subprocess
    import tempfile

    from kernellab.inspect import asm

    cuobjdump = asm.find_tool("cuobjdump")
    if cuobjdump is None:
        return
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(mod.compile("sm_90"))
        f.flush()
        res = asm.parse_res_usage(subprocess.run([cuobjdump, "-res-usage", f.name], capture_output=True,
                                                 text=True, check=True).stdout)  # fmt: skip
    for name in _names(d):
        assert res[name]["STACK"] == 0 and res[name].get("LOCAL", 0) == 0, (name, res[name])
        if "_v8_" in name or "_v9_" in name:
            assert res[name]["REG"] == 168, (name, res[name])


_RED = re.compile(r"\bred\.[a-z0-9.:]+")


def test_d256_dq_reductions_are_float4_and_the_build_is_clean():
    """D = 256 (v8 and v9: one kernel): every dQ reduction of the main kernels is
    red.relaxed.gpu.global.add.v4.f32, 8 a pass; 168 registers, no spills, no local memory
    or stack, no serialized wgmmas."""
    _nvrtc()
    from kernellab.inspect import asm

    bodies = asm.split_ptx(cb.MODULES[256].compile("sm_90", target="ptx").decode())
    for sfx in ("bf16", "f16"):
        for v in ("v8", "v9"):
            reds = _RED.findall(bodies[f"attn_bwd_{v}_d256_{sfx}"])
            assert reds == ["red.relaxed.gpu.global.add.v4.f32"] * 8, (v, sfx, reds)
    _assert_build_clean(256, cb.MODULES[256])


def test_d256_dq_reductions_cover_the_block_and_postprocess_agrees():
    """D = 256's dQ writes as red_dq_blocked64 makes them: thread (cw, warp, lane)
    of pass p (first column c0 = 128 cw + 64 p) adds registers 4 j .. 4 j + 3 (rows 16 warp +
    g, + 8; columns c0 + 8 j + 2 q, + 1) as one float4 at 64 c0 + dq_frag_index<64>(warp,
    lane, 0) + 128 j of the query block: 16-byte aligned, a warp's 32 lanes 512 contiguous
    bytes per j; every float of the 64 x 256 block exactly once, at dq_frag_offset(row, col,
    64), where attn_bwd_post_blk with NQ = 64 reads (row, col) back."""
    src = cb.CU.read_text()
    body = src[src.index("void red_dq_blocked64(") :]
    body = body[: body.index("\n}\n")]
    assert "qb + 64 * c0 + dq_frag_index<64>(warp, lane, 0)" in body
    assert "red_add4(p + 128 * j, dq[4 * j], dq[4 * j + 1], dq[4 * j + 2], dq[4 * j + 3])" in body
    assert "for (int j = 0; j < 8; ++j) red_add4(" in body
    d, nq = 256, 64
    assert all(cb.dq_chunk(d, v) == nq for v in cb.VARIANTS)
    assert cb.dq_chunk(128, "v9") == cb.dq_cols(128) and cb.dq_chunk(128, "v8") == 0
    hits = {}
    for cw in (0, 1):
        for p in (0, 1):
            c0 = 128 * cw + 64 * p
            for warp in range(4):
                for j in range(8):
                    starts = []
                    for lane in range(32):
                        g, q = lane // 4, lane % 4
                        at0 = 64 * c0 + warp * 16 * nq + lane * 4 + 128 * j
                        assert at0 % 4 == 0  # (accumulator rows of 256 floats: 16-byte aligned)
                        starts.append(at0)
                        for k in range(4):
                            hh, e = k // 2, k % 2
                            row, col = 16 * warp + g + 8 * hh, c0 + 8 * j + 2 * q + e
                            at = at0 + k
                            assert at == cb.dq_frag_offset(d, row, col, nq)
                            assert at == _post_blocked_offset(d, row, col, nq)
                            hits[at] = hits.get(at, 0) + 1
                    assert starts == list(range(starts[0], starts[0] + 128, 4))  # 512 contiguous bytes
    assert sorted(hits) == list(range(64 * d)) and set(hits.values()) == {1}
    reads = _post_blocked_reads(d, 128, nq)
    assert sorted(reads) == list(range(128 * d))
    assert sorted(reads.values()) == [(r, c) for r in range(128) for c in range(d)]


def test_launch_signatures_match_the_kernels_parameters():
    _nvrtc()
    from kernellab.cuda.runtime import check_signature, ptx_param_sizes

    for d in (80, 128):
        ptx = cb.MODULES[d].compile("sm_90", target="ptx").decode()
        for sfx in ("f16", "bf16"):
            check_signature(
                f"attn_bwd_v8_d{d}_{sfx}", cb.SIG_MAIN, ptx_param_sizes(ptx, f"attn_bwd_v8_d{d}_{sfx}")
            )
            check_signature(f"attn_bwd_pre_{sfx}", cb.SIG_PRE, ptx_param_sizes(ptx, f"attn_bwd_pre_{sfx}"))
            check_signature(f"attn_bwd_post_{sfx}", cb.SIG_POST, ptx_param_sizes(ptx, f"attn_bwd_post_{sfx}"))
            check_signature(
                f"attn_bwd_v9_d{d}_{sfx}", cb.SIG_MAIN, ptx_param_sizes(ptx, f"attn_bwd_v9_d{d}_{sfx}")
            )
            check_signature(
                f"attn_bwd_post_blk_{sfx}", cb.SIG_POST_BLK, ptx_param_sizes(ptx, f"attn_bwd_post_blk_{sfx}")
            )


def test_module_is_sm90a_only():
    _nvrtc()
    from kernellab.cuda.runtime import CudaError

    assert cb.MODULE.archs == ("sm_90a",) and cb.MODULE.target_arch("sm_90") == "sm_90a"
    with pytest.raises(CudaError, match="sm_90a"):
        cb.MODULE.target_arch("sm_80")


def test_shared_memory_fits():
    """smem_bytes is what the kernel checks (Smem<D>::BYTES + 1 KB of alignment, check_smem
    traps below it), within the 227 KB a block may use with the static barriers; three
    stages at every head dim built but D = 256 and v9's 128-row query blocks (two)."""
    assert cb.query_rows(64) == 128 and cb.query_rows(64, dataclasses.replace(cb.BWD_DEFAULTS[64], q128=False)) == 64
    assert all(cb.query_rows(d) == 64 for d in cb.BWD_HEAD_DIMS if d != 64)
    for d in cb.BWD_HEAD_DIMS:
        for variant in cb.VARIANTS:
            for bm in {64, cb.query_rows(d)}:
                st, bn = cb.stages(d, variant, bm), cb.block_n(d)
                assert st == (2 if d == 256 or (bm == 128 and variant == "v9") else 3), (d, variant, bm)
                assert bn == (64 if d == 256 else 128)
                dq = 2 * 64 * cb.dq_cols(d) * 4 if variant == "v9" and d != 256 else 0  # staging tiles
                assert cb.dq_stage_bytes(d, variant) == dq
                assert (
                    cb.smem_bytes(d, variant, bm)
                    == 1024 + 2 * bn * d * 2 + st * (2 * bm * d * 2 + 8 * bm) + 4 * bm * 128 + dq
                )
                assert cb.smem_bytes(d, variant, bm) + 64 <= cb.SMEM_LIMIT
            assert cb.smem_bytes(d, variant) == cb.smem_bytes(d, variant, cb.query_rows(d))


# --------------------------------------------------------------------------- shared-memory layouts (no GPU)
#
# The models of tests/ops/test_attention_sm90.py (CUTLASS's canonical GMMA layouts and the
# Swizzle<log2 x, 4, 3> of the absolute address), applied to the backward's operands.


def _write_offset(d, rows, r, c):
    w = cs.swizzle_bytes(d)
    cpr = w // 16
    gc = c // 8
    sw = ((r * w) >> 7) & (cpr - 1)
    return (gc // cpr) * (rows * w) + r * w + (((gc % cpr) ^ sw) << 4) + 2 * (c % 8)


def _swizzle(addr, w):
    b = {32: 1, 64: 2, 128: 3}[w]
    return addr ^ (((addr >> 7) & ((1 << b) - 1)) << 4)


def _read_k(start, sbo, w, m, k):  # Major-K element (m, k)
    x = w // 16
    off = (m % 8) * x * 8 + (m // 8) * (sbo // 2) + (k % 8) + (k // 8) * 8
    return _swizzle(start + 2 * off, w)


def _read_mn(start, lbo, sbo, w, k, n):  # Major-MN element (k, n) (n: the contiguous dim)
    x = w // 16
    n0, n1, n2 = n % 8, (n // 8) % x, n // (8 * x)
    off = n0 + n1 * 8 + n2 * (lbo // 2) + (k % 8) * x * 8 + (k // 8) * (sbo // 2)
    return _swizzle(start + 2 * off, w)


@pytest.mark.parametrize("d", cb.BWD_HEAD_DIMS)
def test_descriptors_read_what_the_copies_wrote(d):
    w, e, base = cs.swizzle_bytes(d), cs.swizzle_bytes(d) // 2, 9 * 1024
    bn, dsplit = cb.block_n(d), cb.splits_d(d)
    nv = d // 2 if dsplit else d  # dK / dV columns of a warpgroup

    def kmajor(rows, row0, kk):  # desc_kmajor<D, rows>: (start, SBO)
        return base + (kk * 16 // e) * (rows * w) + (kk * 16 % e) * 2 + row0 * w, 8 * w

    def mnmajor(rows, row0, col0=0):  # desc_mnmajor<D, rows>(tile + the slab of col0, row0)
        return base + (col0 // e) * rows * w + row0 * w, rows * w, 8 * w

    for cw in (0, 1):
        kofs, c_kv = (0, cw * nv) if dsplit else (64 * cw, 0)
        for kk in range(d // 16):  # S^T = K_w Q^T, dP^T = V_w dO^T: A = the warpgroup's 64 keys
            start, sbo = kmajor(bn, kofs, kk)
            for m in range(64):
                for k in range(16):
                    assert _read_k(start, sbo, w, m, k) == base + _write_offset(d, bn, kofs + m, 16 * kk + k)
        for kk in range(4):  # dV += P^T dO, dK += dS^T Q: B (K = queries, N = the nv columns)
            start, lbo, sbo = mnmajor(64, 16 * kk, c_kv)
            for k in range(16):
                for n in range(nv):
                    assert _read_mn(start, lbo, sbo, w, k, n) == base + _write_offset(
                        d, 64, 16 * kk + k, c_kv + n
                    )
        if cb.splits_dq(d):  # B = K's slab cw (N = D / 2), all 128 keys
            passes = [(cw * d // 2, d // 2, range(8))]
        elif dsplit:  # B = one 64-column slab of K per pass, the block's 64 keys
            passes = [(c_kv + 64 * p, 64, range(4)) for p in range(nv // 64)]
        else:  # B = all D columns, the warpgroup's 64 keys
            passes = [(0, d, range(4))]
        for c0, nq, kks in passes:
            for kk in kks:
                start, lbo, sbo = mnmajor(bn, kofs + 16 * kk, c0)
                for k in range(16):
                    for n in range(nq):
                        want = base + _write_offset(d, bn, kofs + 16 * kk + k, c0 + n)
                        assert _read_mn(start, lbo, sbo, w, k, n) == want
    # A of dQ = dS^T stored keys x queries (a D = 64 tile: 128-byte rows); A MN-major:
    # element (m = query, k = key) is stored element (key, query)
    for kk in range(4):
        start, lbo, sbo = base + kk * 16 * 128, 64 * 128, 8 * 128  # desc_mnmajor<64, 64>(sdS, 16 kk)
        for k in range(16):
            for m in range(64):
                assert _read_mn(start, lbo, sbo, 128, k, m) == base + _write_offset(64, 64, 16 * kk + k, m)
    for rows in (64, bn):  # TMA boxes of Q / dO (64 rows) and K / V (bn rows), one slab each
        for r in range(rows):
            for c in range(d):
                assert _swizzle(base + (c // e) * rows * w + r * w + 2 * (c % e), w) == base + _write_offset(
                    d, rows, r, c
                )


def test_dq_split_only_where_half_of_d_is_whole_slabs():
    assert [d for d in cb.BWD_HEAD_DIMS if cb.splits_dq(d)] == [128]
    assert [d for d in cb.BWD_HEAD_DIMS if cb.splits_d(d)] == [256]


def test_ds_stores_cover_the_tile_once_and_conflict_free():
    """Thread (warp, lane) of a consumer warpgroup stores dS^T(16 warp + g + 8h, 8j + 2q ..
    + 1) as 4 bytes at tile_offset<64, 64>(row, j) + 4q: every element of the 64 x 64 tile
    exactly once, and the 32 lanes of a warp's store hit 32 different banks."""
    written = set()
    for warp in range(4):
        for j in range(8):
            for h in (0, 1):
                banks = set()
                for lane in range(32):
                    g, q = lane // 4, lane % 4
                    r = 16 * warp + g + 8 * h
                    addr = _write_offset(64, 64, r, 8 * j) + 4 * q
                    assert addr == _write_offset(64, 64, r, 8 * j + 2 * q)
                    banks.add((addr // 4) % 32)
                    for half in (0, 1):
                        assert (r, 8 * j + 2 * q + half) not in written
                        written.add((r, 8 * j + 2 * q + half))
                assert len(banks) == 32
    assert len(written) == 64 * 64


@pytest.mark.parametrize("d", cb.BWD_HEAD_DIMS)
def test_fragments_read_their_columns_lse_and_add_dq_once(d):
    """Thread (cw, warp, lane) holds S^T(key 16 warp + g + 8h, query 8j + 2q + e): its lse
    is float2 sl[4j] of the stage's row pointer shifted by q (float 8j + 2q + e), its delta
    float2 sl[32 + 4j] (float 64 + 8j + 2q + e); its dQ adds (row 16 warp + g + 8h, column
    c0 + 8j + 2q + e), c0 = 64 cw where the warpgroups split dQ, 128 cw + 64 p in pass p
    where they split D: every (row, column) of the 64 x D block exactly once per block
    (split) or once per warpgroup (each over its own keys)."""
    split, dsplit = cb.splits_dq(d), cb.splits_d(d)
    nq = d // 2 if split else 64 if dsplit else d
    passes = d // 2 // 64 if dsplit else 1
    adds = {}
    for cw in (0, 1):
        for warp in range(4):
            for lane in range(32):
                g, q = lane // 4, lane % 4
                for j in range(8):
                    for e in (0, 1):
                        assert 2 * (4 * j + q) + e == 8 * j + 2 * q + e  # lse
                        assert 2 * (32 + 4 * j + q) + e == 64 + 8 * j + 2 * q + e  # delta
                for p in range(passes):
                    c0 = cw * nq if split else cw * d // 2 + 64 * p if dsplit else 0
                    for h in (0, 1):
                        for j in range(nq // 8):
                            for e in (0, 1):
                                key = (16 * warp + g + 8 * h, c0 + 8 * j + 2 * q + e)
                                adds[key] = adds.get(key, 0) + 1
    assert set(adds) == {(r, c) for r in range(64) for c in range(d)}
    assert set(adds.values()) == {1 if split or dsplit else 2}


def _post_blocked_reads(d, s_pad, nq=0):
    """bwd_post_blocked's index arithmetic (the .cu), transcribed: per thread u (a float4 of
    the head's s_pad x D accumulator floats), the (row, col) of each of its four floats
    (chunks of ``nq`` columns, else v9's ``dq_cols``)."""
    nq = nq or cb.dq_cols(d)
    out = {}
    for u in range(s_pad * d // 4):
        qb, rem = u // (16 * d), u % (16 * d)
        chunk, r2 = rem // (16 * nq), rem % (16 * nq)
        warp, r3 = r2 // (4 * nq), r2 % (4 * nq)
        j, lane = r3 // 32, r3 % 32
        row, col = qb * 64 + 16 * warp + lane // 4, chunk * nq + 8 * j + 2 * (lane % 4)
        for k, rc in enumerate(((row, col), (row, col + 1), (row + 8, col), (row + 8, col + 1))):
            out[4 * u + k] = rc
    return out


@functools.cache
def _post_blocked_inverse(d, nq=0):
    return {rc: i for i, rc in _post_blocked_reads(d, 64, nq).items()}


def _post_blocked_offset(d, row, col, nq=0):
    """The float of the query block that the postprocess takes for (row, col) (row < 64)."""
    return _post_blocked_inverse(d, nq)[(row, col)]


@pytest.mark.parametrize("d", [d for d in cb.BWD_HEAD_DIMS if cb.bulk_dq(d, "v9")])
def test_v9_dq_staging_bulk_copies_and_postprocess_agree(d):
    """v9: thread (cw, warp, lane) stores register i (row 16 warp + g + 8 hh, column c0 +
    8 j + 2 q + e, i = 4 j + 2 hh + e) at dq_frag_index<NQ>(warp, lane, i) of its warpgroup's
    staging tile as float4 j (16-byte aligned; the 8 lanes of a quarter warp cover 128
    contiguous bytes: no bank conflict); warp w's bulk reduce-add copies floats [16 NQ w,
    16 NQ (w + 1)) of the tile to 64 c0 + 16 NQ w of the query block (a multiple of 16 bytes,
    16-byte aligned); so dQ(row, col) lands at dq_frag_offset(row, col), every float of the
    block's 64 x D exactly once per warpgroup share (twice where both warpgroups sum all D
    columns over their own keys), and the postprocess reads each (row, col) from there."""
    nq = cb.dq_cols(d)
    split = cb.splits_dq(d)
    assert nq == (d // 2 if split else d)
    hits = {}
    for cw in (0, 1):
        c0 = cw * nq if split else 0
        for warp in range(4):
            src0, n = warp * 16 * nq, 16 * nq  # the warp's bulk copy: tile floats [src0, src0 + n)
            dst0 = 64 * c0 + src0
            assert (4 * n) % 16 == 0 and (4 * dst0) % 16 == 0 and (4 * src0) % 16 == 0
            for j in range(nq // 8):
                banks = {}
                for lane in range(32):
                    g, q = lane // 4, lane % 4
                    base = warp * 16 * nq + j * 128 + lane * 4  # dq_frag_index(warp, lane, 4 j)
                    assert base % 4 == 0
                    banks.setdefault(lane // 8, set()).update(((4 * base) // 4 + k) % 32 for k in range(4))
                    for hh in (0, 1):
                        for e in (0, 1):
                            i = 4 * j + 2 * hh + e
                            idx = warp * 16 * nq + (i // 4) * 128 + lane * 4 + i % 4
                            assert src0 <= idx < src0 + n  # inside the warp's copy
                            row, col = 16 * warp + g + 8 * hh, c0 + 8 * j + 2 * q + e
                            at = dst0 + (idx - src0)
                            assert at == cb.dq_frag_offset(d, row, col) == _post_blocked_offset(d, row, col)
                            hits[at] = hits.get(at, 0) + 1
                assert all(len(b) == 32 for b in banks.values())  # each quarter warp: 32 banks
    assert set(hits) == set(range(64 * d))
    assert set(hits.values()) == {1 if split else 2}
    # the postprocess: one float4 a thread, every (row, col) of two query blocks read once
    reads = _post_blocked_reads(d, 128)
    assert sorted(reads) == list(range(128 * d))
    assert sorted(reads.values()) == [(r, c) for r in range(128) for c in range(d)]
    assert all(reads[i] == (64 + reads[i - 64 * d][0], reads[i - 64 * d][1]) for i in range(64 * d, 128 * d))


def test_v9_bulk_protocol_in_the_source():
    """v9's staging slice of a warp: lane 0 waits until its previous bulk reduce-add has read
    the slice, the warp syncs, every lane stores and fences its stores to the async proxy,
    the warp syncs again and lane 0 issues the reduce-add (and commits it); the last one is
    waited for entirely before the block exits. No other thread touches a warp's slice."""
    src = cb.CU.read_text()
    body = src[src.index("auto stage_dq = [&]") :]
    i_wait = body.index("if (lane == 0) bulk_wait_read0();")
    i_sync1 = body.index("__syncwarp();", i_wait)
    i_st = body.index("st.shared.v4.f32", i_sync1)
    i_fence = body.index("fence_proxy_async();", i_st)
    i_sync2 = body.index("__syncwarp();", i_fence)
    i_red = body.index("bulk_reduce_add_f32(dst, sdq, 16 * NQ * 4);", i_sync2)
    i_end = body.index("if (lane == 0) bulk_wait0();", i_red)
    assert i_wait < i_sync1 < i_st < i_fence < i_sync2 < i_red < i_end
    # OVL (D <= 80): query block it - 1's dQ is staged right after block it's S^T and dP^T are
    # issued and before they are waited for; the last block's after the loop, before the
    # final bulk wait; dQ itself is retired by wait_group 0 in its own iteration (the stage
    # released there too: the ring's protocol is v8's)
    i_issue = body.index("issue_s_dp(st);")
    i_prev = body.index("if (it > 0) stage_dq(dq_o, prev_h, prev_m0", i_issue)
    i_s = body.index("wgmma_wait<1>();  // S^T", i_prev)
    i_wait0 = body.index("wgmma_wait<0>();  // (first pass)", i_s)
    i_keep = body.index("add.rn.f32 %0, %1, 0f00000000;", i_wait0)
    i_last = body.index("if (kb.n_it > 0) stage_dq(dq_o, prev_h, prev_m0", i_keep)
    assert i_issue < i_prev < i_s < i_wait0 < i_keep < i_last < i_end
    assert "constexpr bool OVL = BQ && D <= 80 && !BwdBuild<D>::Q128;" in src
    assert "cp.async.bulk.commit_group" in src[src.index("void bulk_reduce_add_f32") :]
    assert "warp * (16 * NQ * 4)" in body  # the warp's own slice


# --------------------------------------------------------------------------- barrier protocol (no GPU)


def _simulate_ring(n_it: int, stages: int, order: list[str]) -> None:
    """A model of the ring: the producer fills stage it % stages once it >= stages and the
    stage's empty phase (it // stages - 1) completed (8 consumer-warp arrivals); a consumer
    warp reads a stage once its full phase it // stages completed. Runs the agents in the
    given interleaving preference until all finish; asserts no deadlock and that a stage
    is never refilled while a warp still reads it."""
    full = [0] * stages  # completed phases
    empty = [0] * stages
    arrivals = [0] * stages
    prod = 0
    cons = [0] * 8  # next iteration of each consumer warp
    reading = [set() for _ in range(stages)]
    steps = 0
    while prod < n_it or min(cons) < n_it:
        moved = False
        for who in order:
            if who == "p" and prod < n_it:
                st = prod % stages
                if prod < stages or empty[st] >= prod // stages:
                    assert not reading[st], "stage refilled while read"
                    full[st] += 1
                    prod += 1
                    moved = True
            elif who != "p":
                w = int(who)
                it = cons[w]
                if it < n_it:
                    st = it % stages
                    if full[st] > it // stages:
                        reading[st].add(w)
                        reading[st].discard(w)  # the warp's reads end before its arrival
                        arrivals[st] += 1
                        if arrivals[st] == 8:
                            arrivals[st] = 0
                            empty[st] += 1
                        cons[w] += 1
                        moved = True
        steps += 1
        assert moved, f"deadlock: producer {prod}, consumers {cons}"
        assert steps < 10 * (n_it + 10) * 9


@pytest.mark.parametrize("n_it", [0, 1, 2, 3, 4, 7, 30])
def test_ring_neither_deadlocks_nor_overwrites(n_it):
    for stages in (2, 3):
        for order in (["p"] + [str(i) for i in range(8)], [str(i) for i in range(8)] + ["p"],
                      ["7", "p", "0", "3", "1", "6", "2", "5", "4"]):  # fmt: skip
            _simulate_ring(n_it, stages, order)


def _simulate_items(n_its: list[int], stages: int, seed: int) -> None:
    """A model of a persistent block (BwdBuild's PERSIST) taking items with n_its query blocks
    each (0: a key block no query sees), then the end. Per item the producer waits for
    kv_empty's phase u - 1 (8 consumer-warp arrivals; u: the items so far), writes the item
    into item_slot and completes kv_full's phase u (loading K and V first where the item has
    work), then fills the ring's uses it0 + it as ``_simulate_ring``'s producer; the end is
    announced the same way. A consumer warp waits for kv_full's phase u, reads item_slot,
    reads the item's ring uses in order and arrives on kv_empty. The nine agents move one
    step at a time in a random order (``seed``) among those that can. Asserts no deadlock,
    item_slot and K / V never rewritten while a warp holds its item, every warp seeing
    every item and the end in order, and a stage never refilled while a warp reads it."""
    seq = list(n_its) + [None]  # None: the end
    total = sum(n_its)
    ring, kv_empty = RingModel(stages), PhaseBarrier(8)
    slot, kv_phases = None, 0
    prod = [0, 0, 0, False]  # the producer's item (of seq), query block in it, ring use, item announced
    cons = [[0, 0, 0, False] for _ in range(8)]  # each warp's item, query block, ring use, item held
    seen = [[] for _ in range(8)]

    def producer_step(go: bool) -> bool:
        nonlocal slot, kv_phases
        item, it, u, announced = prod
        if item >= len(seq):
            return False
        if not announced:  # kv_empty's phase item - 1, then item_slot and kv_full
            ok = item == 0 or kv_empty.phases >= item
            if ok and go:
                assert not any(c[3] for c in cons), "item_slot / K / V rewritten while held"
                slot, kv_phases = item, kv_phases + 1
                prod[:] = [item + 1, 0, u, False] if seq[item] in (None, 0) else [item, 0, u, True]
            return ok
        ok = ring.can_fill(u)
        if ok and go:
            ring.fill(u)
            it += 1
            prod[:] = [item + 1, 0, u + 1, False] if it == seq[item] else [item, it, u + 1, True]
        return ok

    def consumer_step(w: int, go: bool) -> bool:
        item, it, u, held = cons[w]
        if item >= len(seq):
            return False
        if not held:  # kv_full's phase `item`, then item_slot
            ok = kv_phases > item
            if ok and go:
                assert slot == item, "item_slot of another item"
                seen[w].append(seq[slot])
                cons[w] = [len(seq), 0, u, False] if seq[slot] is None else [item, 0, u, True]
            return ok
        if it == (seq[item] or 0):  # the item done: arrive on kv_empty
            if go:
                kv_empty.arrive()
                cons[w] = [item + 1, 0, u, False]
            return True
        if ring.is_reading(w, u):  # done with the stage: arrive on empty
            if go:
                ring.end_read(w, u)
                cons[w] = [item, it + 1, u + 1, True]
            return True
        ok = ring.can_read(u)
        if ok and go:
            ring.start_read(w, u)
        return ok

    interleave_items(producer_step, consumer_step, seq, prod, cons, seed, total)
    assert kv_phases == len(seq) and prod[2] == total and all(c[2] == total for c in cons)
    assert all(x == seq for x in seen)


@pytest.mark.parametrize("n_its", [[0], [1], [4, 4, 4], [0, 3, 0, 0, 2], [7, 1, 0, 30], [2] * 9])
def test_persistent_items_neither_deadlock_nor_overwrite_k_v(n_its):
    for stages in (2, 3):
        for seed in range(20):
            _simulate_items(n_its, stages, seed)


def test_persistent_items_cover_every_key_block_once():
    """The persistent kernel's items: entry i of the plan's order table (``item_order`` packed by
    ``order_table``, unpacked by bwd_item in attention_sm90_bwd.cu as written there) for i =
    0 .. H_kv x n_kb x Z - 1 (block b takes item b first, then gridDim.x + the launch counter's
    next value: each index once) covers every (k/v head, key block, batch) once, in sections
    of at most sw (k/v head, batch) pairs, as even as they divide, the pair fastest in a
    section, the key blocks in order; sw
    = H_kv is the block-per-item grid's order. The producer hands each item to the consumers
    through item_slot and kv_full, and both count the ring's uses on across items."""
    src = cb.CU.read_text()
    assert "const int2 e = __ldg(order + i);\n#if KL_ATTN_BWD_PARTS" in src
    assert "#else\n    return BwdItem{e.x & 0xffff, e.x >> 16, e.y};\n#endif" in src
    assert "return PERSIST ? bwd_item(order, i) :" in src
    assert src.count("const KeyBlock kb = key_block<BN, BM>(w.nb, S_q, S_k, heads, causal);") == 2
    assert src.count("const int heads = group, h_first = w.hk * group;") == 2  # (not split)
    assert src.count("const int h = h_first + it / kb.per, m0 = (kb.m_begin + it % kb.per) * BM;") == 2
    assert "if (uses > 0) mbar_wait(kv_empty, (uses - 1) & 1);" in src
    # the producer decodes the item
    assert "item_slot[2] = w.z;\n#if KL_ATTN_BWD_PARTS" in src
    assert "#endif\n                if (w.z < 0) {  // the end" in src
    assert "mbar_wait(kv_full, uses & 1);\n#if KL_ATTN_BWD_PARTS" in src
    assert (
        "        const BwdItem w{item_slot[0], item_slot[1], item_slot[2]};\n"
        "        const int heads = group, h_first = w.hk * group;\n#endif\n        if (w.z < 0) break;"
    ) in src
    assert "auto claim = [&]() { return PERSIST ? (int)gridDim.x + atomicAdd(sched, 1) : 1; };" in src
    assert src.count("i = claim();") == 2  # after an item's last copy is issued, or at once for an empty one
    assert "if (i == 0 && lane == 0 && h == 0 && z == 0) *sched = 0;" in src  # attn_bwd_pre
    for h_kv, n_kb, z in ((2, 3, 2), (12, 2, 256), (1, 1, 1), (3, 5, 7), (28, 32, 2)):
        every = [(hk, nb, zz) for zz in range(z) for nb in range(n_kb) for hk in range(h_kv)]
        assert [tuple(t) for t in cb.item_order(h_kv, n_kb, z, h_kv).tolist()] == every  # the grid's order
        for sw in sorted({1, 2, 3, 5, h_kv * z}):
            items = cb.item_order(h_kv, n_kb, z, sw)
            seen = [tuple(t) for t in items.tolist()]
            assert sorted(seen) == sorted(every)
            n = -(-h_kv * z // sw)  # sections, their sizes within one of each other
            sizes = [(k + 1) * h_kv * z // n - k * h_kv * z // n for k in range(n)]
            assert sum(sizes) == h_kv * z and max(sizes) <= sw and max(sizes) - min(sizes) <= 1
            first = 0
            for w in sizes:  # a section: its pairs only, the pair fastest, then the key block
                part = seen[first * n_kb : (first + w) * n_kb]
                assert [zz * h_kv + hk for hk, _, zz in part] == [first + i % w for i in range(w * n_kb)]
                assert [nb for _, nb, _ in part] == [i // w for i in range(w * n_kb)]
                first += w
            table = cb.order_table(items, 3)  # as bwd_item unpacks it, then 3 blocks' ends
            assert table.dtype == torch.int32 and table.shape == (len(seen) + 3, 2)
            x, y = table[:, 0].tolist(), table[:, 1].tolist()
            assert [(e & 0xFFFF, e >> 16, zz) for e, zz in zip(x, y)][: len(seen)] == seen
            assert y[len(seen) :] == [-1] * 3


def test_split_items_cover_every_q_head_once():
    """A split build's items (``split_items``, packed by ``order_table``, unpacked by bwd_item's
    PARTS branch as written in the .cu): each (k/v head, key block, batch) becomes ``parts``
    consecutive items whose runs of q heads cover its group once, in order, as even as they
    divide; the end entries stay {0, -1}. Bad counts are refused, naming the split."""
    src = cb.CU.read_text()
    assert "if (e.y < 0) return BwdItem{0, 0, -1, 0, 0};" in src
    assert "return BwdItem{e.x & 0xffff, e.x >> 16, e.y & 0xffff, (e.y >> 16) & 0xff, e.y >> 24};" in src
    assert src.count("const int heads = w.nh, h_first = w.hk * group + w.h0;") == 2
    for h_kv, n_kb, z, group in ((2, 16, 2, 7), (1, 3, 1, 1), (3, 2, 5, 4), (2, 1, 1, 127)):
        items = cb.item_order(h_kv, n_kb, z, h_kv)
        for parts in sorted({1, 2, 3, 4, group}):
            if parts > group:
                continue
            rows = cb.split_items(items, group, parts)
            assert rows.shape == (len(items) * parts, 5)
            runs = rows.view(len(items), parts, 5)
            assert torch.equal(runs[:, :, :3], items[:, None, :].expand(-1, parts, -1))
            h0, nh = runs[:, :, 3], runs[:, :, 4]
            assert (nh >= 1).all() and nh.max() - nh.min() <= 1 and (nh.sum(1) == group).all()
            assert torch.equal(h0[:, 1:], (h0 + nh)[:, :-1]) and (h0[:, 0] == 0).all()
            table = cb.order_table(rows, 2)
            x, y = table[:, 0].tolist(), table[:, 1].tolist()
            got = [(e & 0xFFFF, e >> 16, f & 0xFFFF, (f >> 16) & 0xFF, f >> 24) for e, f in zip(x, y)]
            assert got[: len(rows)] == [tuple(r) for r in rows.tolist()] and y[len(rows) :] == [-1, -1]
    for group, parts in ((4, 5), (4, 0), (128, 2)):
        with pytest.raises(ValueError, match="split"):
            cb.split_items(cb.item_order(1, 1, 1, 1), group, parts)
    with pytest.raises(ValueError, match="split builds are persistent"):
        cb.bwd_module(64, cb.BwdOpts(split=2))


def test_split_count_where_items_leave_sms_idle():
    """The default's split count at 132 SMs (``split_count``) is the fastest measured on an
    H200 (lab/probe_bwd_builds.py --split 2,4,7, attn_bwd_builds-H200-e2c24f0-split.jsonl) at
    each case: Qwen2.5-0.5B's 64 items split in 2 (3 / 4 and 7 within 5%), causal in 4; 128
    items of D = 128 not split (a wave already: every split was slower), causal in 4 (the long
    causal items end late); 256 items (two waves) never. No group, no split; nor at
    two waves or more. Each count it returns is a count its items can take."""

    def count(z, h, hkv, s, d, causal, sms=132):
        n_kb = -(-s // cb.block_n(d))
        sw = cb.section_pairs(hkv, z, h // hkv, s, d, 2, n_kb, causal, 50 * 2**20, sms)
        items = cb.item_order(hkv, n_kb, z, sw)
        return cb.split_count(items, h // hkv, s, s, d, cb.query_rows(d), causal, sms)

    measured = {  # (z, h, h_kv, s, d): (full, causal)
        (2, 14, 2, 2048, 64): (2, 4),
        (1, 28, 4, 4096, 128): (1, 4),
        (2, 32, 8, 2048, 64): (1, 1),
    }
    for shape, want in measured.items():
        assert (count(*shape, False), count(*shape, True)) == want, shape
    assert count(1, 12, 12, 1024, 64, True) == 1  # MHA: a group of one
    assert count(4, 32, 8, 4096, 128, True) == 1  # 1024 items
    assert count(2, 14, 2, 2048, 64, True, sms=16) == 1  # 64 items: four waves of 16
    for s, d in ((300, 80), (4096, 96), (129, 128)):
        for g in (2, 3, 7, 12):
            assert 1 <= count(1, 2 * g, 2, s, d, True) <= min(g, cb.SPLIT_MAX)
    assert cb.makespan([5, 1, 1, 1, 1, 1], 2) == 5 and cb.makespan([1, 1, 1, 1], 8) == 1 and cb.makespan([], 4) == 0


def test_sections_fit_l2_and_a_wave_and_causal_tails():
    """section_pairs at 132 SMs and 50 MiB of L2: without the mask, the fewer of the pairs whose
    query side (Q and dO 16-bit, the fp32 dQ accumulator) fits L2_SHARE of L2 and of the
    pairs whose key blocks fill half a wave of blocks; under causal masking with 4 or more key
    blocks a pair, at least the pairs of two waves of items; always 1 .. H_kv x Z pairs."""
    l2, sms = 50 * 2**20, 132
    cases = {  # (h_kv, z, group, s_q, d, n_kb): (full, causal)
        (28, 2, 1, 4096, 128, 32): (2, 9),  # 4 MiB a pair: 6 fit; half a wave takes 2 pairs' 32 blocks
        (32, 1, 1, 8192, 128, 64): (1, 5),
        (8, 1, 4, 8192, 128, 64): (1, 5),  # GQA: 32 MiB a k/v head
        (32, 4, 1, 2048, 128, 16): (4, 17),
        (12, 8, 1, 1024, 64, 8): (8, 33),
        (12, 256, 1, 197, 64, 2): (33, 33),  # 2 key blocks: no causal floor
        (2, 1, 1, 300, 64, 3): (2, 2),  # every pair
        (4, 1, 8, 32768, 256, 512): (1, 1),
    }
    for (h_kv, z, g, s_q, d, n_kb), want in cases.items():
        got = tuple(cb.section_pairs(h_kv, z, g, s_q, d, 2, n_kb, c, l2, sms) for c in (False, True))
        assert got == want, (h_kv, z, g, s_q, d, n_kb)
        per = g * s_q * d * 8
        assert got[0] == 1 or (got[0] * per <= l2 * cb.L2_SHARE and 2 * got[0] * n_kb <= sms)
        floor = -(-2 * sms // n_kb) if n_kb >= 4 else 1
        assert got[1] == min(h_kv * z, max(got[0], floor))


def test_named_barriers_and_proxy_fence_in_the_source():
    """The dS^T tile of a warpgroup: written by its 128 threads, fenced to the async proxy,
    then bar.sync on id 1 + cw with 128 threads (or, where the warpgroups split dQ, on id 3
    with all 256) before the dQ wgmma reads it; the tile alternates per use u of the ring (one
    a query block, counted on across a persistent block's items);
    the producer's expect_tx counts exactly the bytes of its copies (two tiles of BM x D x 2
    and two bulk copies of BM floats); with 128-row query blocks each warpgroup's dQ wgmma reads
    query slab cw of both warpgroups' tiles."""
    src = cb.CU.read_text()
    i_st, i_fence = src.index("st.shared.b32"), src.index("fence_proxy_async();  // the generic")
    i_bar, i_split = src.index("named_sync(DS_BAR + cw, 128)"), src.index("named_sync(DQ_BAR, 256)")
    i_tt = src.index("kl_wgmma_tt<NQ, BF16>")
    assert i_st < i_fence < i_split < i_bar < i_tt
    assert "constexpr int DS_BAR = 1, DQ_BAR = 3;" in src  # ids 1, 2 (per warpgroup) and 3; 0: __syncthreads
    assert "(2 * cw + (u & 1)) * S::DS_BYTES" in src and "(2 * (kk / 4) + (u & 1)) * S::DS_BYTES" in src
    assert "mbar_expect_tx(bar, 2 * S::QT_BYTES + S::LD_BYTES)" in src
    assert "static constexpr unsigned LD_BYTES = 8 * BM;" in src and "QT_BYTES = BM * D * 2;" in src
    assert src.count("bulk_load(") == 3 and src.count("4 * BM, bar)") == 2  # definition + two calls
    assert "if (SPLIT || RSPLIT) {" in src
    assert "(2 * (kk / 4) + (u & 1)) * S::DS_BYTES + cw * (64 * 64 * 2), 16 * (kk % 4)" in src
    assert "stage_dq(dq, h, RSPLIT ? m0 + 64 * cw : m0, c0);" in src


# --------------------------------------------------------------------------- launcher (no GPU)


class _Recorder:
    def __init__(self, name):
        self.name = name
        self.max_dynamic_shared = 48 * 1024
        self.calls = []

    def set_max_dynamic_shared(self, n):
        self.max_dynamic_shared = n

    def __call__(self, grid, block, *args, shared=0, device_index=None):
        self.calls.append((self.name, grid, block, args, shared))


@pytest.fixture
def recorder(monkeypatch):
    calls = []
    recs = {}

    def kernel(self, name, signature, device_index=None):
        kind = name.split("_")[2]
        if name.startswith("attn_bwd_post_blk_"):
            kind = "post_blk"
        assert signature == {"pre": cb.SIG_PRE, "post": cb.SIG_POST, "post_blk": cb.SIG_POST_BLK,
                             "v8": cb.SIG_MAIN, "v9": cb.SIG_MAIN}[kind]  # fmt: skip
        if name not in recs:
            recs[name] = _Recorder(name)
            recs[name].calls = calls
        return recs[name]

    def tensor_map(address, elem_bytes, dims, strides, box, swizzle):
        return ("map", address, elem_bytes, dims, strides, box, swizzle)

    monkeypatch.setattr(cb.Module, "kernel", kernel)
    monkeypatch.setattr(cs, "_device_index", lambda t: 0)
    monkeypatch.setattr(cs, "tensor_map", tensor_map)
    monkeypatch.setattr(cb, "sm_count", lambda dev: 132)
    monkeypatch.setattr(cs, "PLANS", {})  # (plans bind the kernels they were made with)
    monkeypatch.setattr(cb, "PLANS", {})
    return calls


def test_launcher_arguments(recorder):
    """GQA 8 q heads over 2 k/v heads, S_q 300 (padded to 320), S_k 260, D 80, causal: the preprocess
    over 320 rows, the main kernel's grid (persistent: one block for each of the 2 k/v heads x
    3 key blocks x 2 batches, at most one an SM; else (2, 3, 2)), its tensor maps (64-row
    boxes of q and dO, 128-row boxes of k and v), the group, the scale twice (plain and x log2
    e), the shared memory; the postprocess over S_q x D / 2 pairs; gradients shaped as the
    inputs, in empty_bshd's layout."""
    q = torch.randn(2, 8, 300, 80, dtype=torch.bfloat16)
    k = torch.randn(2, 2, 260, 80, dtype=torch.bfloat16)
    v = torch.randn(2, 2, 260, 80, dtype=torch.bfloat16)
    do = torch.randn(2, 8, 300, 80, dtype=torch.bfloat16)
    o = torch.randn(2, 8, 300, 80, dtype=torch.bfloat16)
    lse = torch.randn(2, 8, 300)
    unsplit = dataclasses.replace(cb.BWD_DEFAULTS[80], split=1)  # (the default splits 12 items: below)
    dq, dk, dv = cb.backward(do, q, k, v, o, lse, True, 0.3, opts=unsplit)
    assert [c[0] for c in recorder] == ["attn_bwd_pre_bf16", "attn_bwd_v8_d80_bf16", "attn_bwd_post_bf16"]
    (_, g_pre, b_pre, a_pre, _), (_, g, b, a, shared), (_, g_post, b_post, a_post, _) = recorder
    assert g_pre == (320 // 8, 8, 2) and b_pre == 256
    assert a_pre[7:11] == (300, 320, 8, 80)
    assert a_pre[2] is lse or a_pre[2].data_ptr() == lse.data_ptr()
    lse_p, delta_p, dq_acc, sched = a_pre[3:7]
    assert lse_p.shape == (16, 320) and delta_p.shape == (16 * 320 + 1,) and dq_acc.shape == (16, 320, 80)
    assert sched == delta_p.data_ptr() + 4 * 16 * 320  # the item counter: the delta buffer's last word
    assert cb.BWD_DEFAULTS[80].persist
    assert g == (12, 1, 1) and b == 384 and shared == cb.smem_bytes(80)  # items, at most one block an SM
    tq, tk, tv, tdo = a[:4]
    assert tq[3:] == ((80, 300, 8, 2), (160, 300 * 160, 8 * 300 * 160), (16, 64, 1, 1), 32)
    assert tk[5] == (16, 128, 1, 1) and tv[5] == (16, 128, 1, 1) and tdo[5] == (16, 64, 1, 1)
    assert tk[1] == k.data_ptr() and tv[1] == v.data_ptr() and tdo[1] == do.data_ptr()
    assert a[4] is lse_p and a[5] is delta_p and a[6] is dq_acc
    assert a[9:17] == (300, 260, 320, 8, 4, 0.3, pytest.approx(0.3 * cb.LOG2E), 1)
    assert a[17:24] == (260 * 2 * 80, 80, 2 * 80) * 2 + (2,) and a[25] == sched  # dk, dv (B, S, H, D); Z
    assert cb.section_pairs(2, 2, 4, 300, 80, 2, 3, True, 50 * 2**20, 132) == 4  # every pair in one section
    assert a[24].tolist() == cb.order_table(cb.item_order(2, 3, 2, 4), 12).tolist()  # the item table
    assert g_post == (math.ceil(300 * 40 / 256), 8, 2) and b_post == 256
    assert a_post[0] is dq_acc and a_post[2:7] == (300, 320, 8, 80, 0.3)
    assert a_post[7:] == (300 * 8 * 80, 80, 8 * 80)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    recorder.clear()  # a block an item: (k/v heads, key blocks, batch), heads fastest
    cb.backward(do, q, k, v, o, lse, True, 0.3, opts=dataclasses.replace(cb.BWD_DEFAULTS[80], persist=False))
    assert recorder[1][1] == (2, 3, 2) and recorder[1][3][9:-2] == a[9:-2]
    assert recorder[1][3][-2] == 0  # no item table
    recorder.clear()  # the group split over 3 items a key block: fp32 dK, dV buffers, rounded after
    split = dataclasses.replace(cb.BWD_DEFAULTS[80], split=3)
    dq3, dk3, dv3 = cb.backward(do, q, k, v, o, lse, True, 0.3, opts=split)
    g3, a3 = recorder[1][1], recorder[1][3]
    assert g3 == (36, 1, 1)  # 12 items x 3 runs of the group's 4 q heads
    dk32, dv32 = a3[7], a3[8]
    assert dk32.dtype == dv32.dtype == torch.float32 and dk32.shape == dv32.shape == (2, 2, 260, 80)
    assert a3[9:17] == a[9:17] and a3[17:23] == (2 * 260 * 80, 260 * 80, 80) * 2
    items = cb.split_items(cb.item_order(2, 3, 2, 4), 4, 3)
    assert a3[24].tolist() == cb.order_table(items, 36).tolist()
    assert dk3.shape == k.shape and dk3.dtype == k.dtype and dv3.shape == v.shape
    assert (dk3 == 0).all() and (dv3 == 0).all()  # the buffers as the (recorded, not run) kernel left them
    recorder.clear()  # the default: split_count's count of the 12 items
    parts = cb.split_count(cb.item_order(2, 3, 2, 4), 4, 300, 260, 80, 64, True, 132)
    assert parts > 1
    cb.backward(do, q, k, v, o, lse, True, 0.3)
    items = cb.split_items(cb.item_order(2, 3, 2, 4), 4, parts)
    assert recorder[1][1] == (12 * parts, 1, 1) and recorder[1][3][7].dtype == torch.float32
    assert recorder[1][3][24].tolist() == cb.order_table(items, 12 * parts).tolist()
    recorder.clear()  # under torch.use_deterministic_algorithms: never split (dK, dV reproducible)
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        cb.backward(do, q, k, v, o, lse, True, 0.3)
    finally:
        torch.use_deterministic_algorithms(False)
    assert recorder[1][1] == g and recorder[1][3][24].tolist() == a[24].tolist() and recorder[1][3][7].dtype == k.dtype
    recorder.clear()  # more items than SMs: one block an SM
    big = torch.randn(140, 2, 260, 80, dtype=torch.bfloat16)
    cb.backward(big, big, big, big, big, torch.zeros(140, 2, 260), False, 0.3)
    assert recorder[1][1] == (132, 1, 1) and recorder[1][3][-3] == 140  # Z
    assert cb.section_pairs(2, 140, 1, 260, 80, 2, 3, False, 50 * 2**20, 132) == 22  # of 280: half a wave
    assert recorder[1][3][-2].tolist() == cb.order_table(cb.item_order(2, 3, 140, 22), 132).tolist()


def test_split_build_of_a_group_of_one_runs_unsplit(recorder, monkeypatch):
    """A split build asked for where the group has one q head (MHA) has nothing to split: the
    plan takes the unsplit module, its 3-column item table and the 16-bit dK, dV themselves
    (the split module would read a run of no heads and add fp32 into 16-bit memory)."""
    built = []
    real = cb.bwd_module
    monkeypatch.setattr(cb, "bwd_module", lambda d, opts=None: built.append(opts) or real(d, opts))
    q = torch.randn(1, 3, 200, 64, dtype=torch.bfloat16)
    split4 = dataclasses.replace(cb.BWD_DEFAULTS[64], split=4)
    _, dk, dv = cb.backward(q, q, q, q, q, torch.zeros(1, 3, 200), True, 0.3, "v9", split4)
    assert built == [dataclasses.replace(cb.BWD_DEFAULTS[64], split=1)]
    assert real(64, built[0]) is cb.MODULES[64]
    a = recorder[1][3]
    assert recorder[1][1] == (6, 1, 1) and a[7].dtype == a[8].dtype == torch.bfloat16
    assert a[24].tolist() == cb.order_table(cb.item_order(3, 2, 1, 3), 6).tolist()
    assert cb._plan_backward(q, q, q, q, q, torch.zeros(1, 3, 200), True, 0.3, "v9", split4).kv_acc == ()


def test_first_backward_inside_graph_capture_is_refused_by_name(recorder, monkeypatch):
    """A persistent plan copies its item table to the GPU, which CUDA-graph capture forbids:
    the first backward at a shape inside a capture says so (and what to do) instead of
    invalidating the capture with a driver error."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    monkeypatch.setattr(cb, "l2_bytes", lambda dev: 50 * 2**20)
    q = torch.randn(1, 2, 96, 64, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="CUDA-graph capture; run it once before capturing"):
        cb.backward(q, q, q, q, q, torch.zeros(1, 2, 96), False, 0.3, "v9")
    assert not recorder


def test_launcher_v9(recorder):
    """v9: the same preprocess and main-kernel arguments as v8 (its own kernel, its shared
    memory with the dQ staging tiles), and the blocked postprocess with NQ (D = 128: the
    warpgroups' halves, 64); at D = 256 v8's postprocess (v9 keeps the atomics there)."""
    q = torch.randn(1, 4, 300, 128, dtype=torch.bfloat16)
    kv = torch.randn(1, 2, 260, 128, dtype=torch.bfloat16)
    unsplit = dataclasses.replace(cb.BWD_DEFAULTS[128], split=1)  # (6 items: the default splits them)
    cb.backward(q, q, kv, kv, q, torch.zeros(1, 4, 300), True, 0.3, "v9", unsplit)
    assert [c[0] for c in recorder] == [
        "attn_bwd_pre_bf16",
        "attn_bwd_v9_d128_bf16",
        "attn_bwd_post_blk_bf16",
    ]
    (_, _, _, a_pre, _), (_, g, b, a, shared), (_, g_post, b_post, a_post, _) = recorder
    assert g == (6, 1, 1) and b == 384 and shared == cb.smem_bytes(128, "v9") > cb.smem_bytes(128)
    assert a[6] is a_pre[5] and a_post[0] is a_pre[5]  # one dq accumulator
    assert g_post == (math.ceil(320 * 128 / 4 / 256), 4, 1) and b_post == 256  # a float4 a thread
    assert a_post[2:8] == (300, 320, 4, 128, 64, 0.3)
    recorder.clear()
    q = torch.randn(1, 2, 9, 256, dtype=torch.float16)
    cb.backward(q, q, q, q, q, torch.zeros(1, 2, 9), False, 0.1, "v9")
    assert [c[0] for c in recorder] == ["attn_bwd_pre_f16", "attn_bwd_v9_d256_f16", "attn_bwd_post_blk_f16"]
    assert recorder[1][4] == cb.smem_bytes(256, "v9") == cb.smem_bytes(256)
    assert recorder[1][1] == (2, 1, 1) and not cb.BWD_DEFAULTS[256].persist  # (k/v heads, key blocks, batch)
    with pytest.raises(ValueError, match="variant"):
        cb.backward(q, q, q, q, q, torch.zeros(1, 2, 9), False, 0.1, "v10")


def test_backward_plan_made_once_and_bound_to_each_calls_tensors(recorder):
    """A second backward at the same layout reuses the plan (one entry in cb.PLANS) and
    launches with its own tensors and fresh buffers; a misaligned do (same strides) is
    copied to an aligned one first; a transposed do (other strides) is read in place."""
    shape = (1, 4, 70, 64)
    q, k, v, o, do = (torch.randn(*shape, dtype=torch.bfloat16) for _ in range(5))
    lse = torch.zeros(1, 4, 70)
    cb.backward(do, q, k, v, o, lse, True, 0.125, "v9")
    q2, k2, v2, o2, do2 = (torch.randn(*shape, dtype=torch.bfloat16) for _ in range(5))
    cb.backward(do2, q2, k2, v2, o2, lse, True, 0.125, "v9")
    assert len(cb.PLANS) == 1 and len(recorder) == 6
    pre1, main1, post1, pre2, main2, post2 = (c[3] for c in recorder)
    assert pre2[0] is o2 and pre2[1] is do2 and pre2[7:] == pre1[7:]
    assert [m[1] for m in main2[:4]] == [q2.data_ptr(), k2.data_ptr(), v2.data_ptr(), do2.data_ptr()]
    assert main2[4] is pre2[3] and main2[6] is pre2[5] is post2[0] and main2[6] is not main1[6]
    assert main2[9:-1] == main1[9:-1] and post2[2:] == post1[2:]
    assert main2[-1] == pre2[6] == pre2[4].data_ptr() + 4 * 4 * 128 != main1[-1]  # this call's item counter
    buf = torch.randn(1 + do.numel(), dtype=torch.bfloat16)
    off = buf[1:].view(shape)  # do's strides, base 2 bytes off 16
    cb.backward(off, q, k, v, o, lse, True, 0.125, "v9")
    assert len(cb.PLANS) == 1 and recorder[-2][3][3][1] % 16 == 0
    torch.testing.assert_close(recorder[-3][3][1], off, rtol=0, atol=0)
    bshd = torch.randn(1, 70, 4, 64, dtype=torch.bfloat16).transpose(1, 2)  # a model's do: no copy
    cb.backward(bshd, q, k, v, o, lse, True, 0.125, "v9")
    assert len(cb.PLANS) == 2 and recorder[-2][3][3][1] == bshd.data_ptr()


def test_cuda_runs_the_variant_one_constant_names():
    """``cuda`` (the registered fastest Hopper attention) runs CUDA_VARIANT's backward: its
    custom ops are that variant's."""
    assert cb.CUDA_VARIANT in cb.VARIANTS
    impl = kernellab.registry.get("attention", "cuda")
    want = kernellab.registry.get("attention", f"cuda_{cb.CUDA_VARIANT}")
    assert impl.fn.custom_ops is want.fn.custom_ops
    assert f", {cb.CUDA_VARIANT} (" in impl.description
    other = [v for v in cb.VARIANTS if v != cb.CUDA_VARIANT]
    assert all(
        kernellab.registry.get("attention", f"cuda_{v}").fn.custom_ops is not impl.fn.custom_ops
        for v in other
    )


def test_launcher_empty_and_head_dim_256(recorder):
    """No query row: zero gradients, no launch. D = 256: blocks of 64 keys (grid y, the
    k / v boxes), two stages of shared memory."""
    q = torch.randn(1, 2, 0, 64, dtype=torch.float16)
    kv = torch.randn(1, 2, 5, 64, dtype=torch.float16)
    dq, dk, dv = cb.backward(q, q, kv, kv, q, torch.empty(1, 2, 0), False, 0.1)
    assert not recorder and dq.shape == q.shape and torch.equal(dk, torch.zeros_like(dk))
    q = torch.randn(1, 4, 9, 256, dtype=torch.float16)
    kv = torch.randn(1, 2, 130, 256, dtype=torch.float16)
    dq, dk, dv = cb.backward(q, q, kv, kv, q, torch.zeros(1, 4, 9), True, 0.1)
    names = [c[0] for c in recorder]
    assert names == ["attn_bwd_pre_f16", "attn_bwd_v8_d256_f16", "attn_bwd_post_blk_f16"]
    _, g, b, a, shared = recorder[1]
    assert g == (2, 3, 1) and shared == cb.smem_bytes(256) and cb.stages(256) == 2
    assert a[0][5] == (64, 64, 1, 1) and a[1][5] == (64, 64, 1, 1) and a[2][5] == (64, 64, 1, 1)
    assert all(cb.backward_kernel(d) == "cuda" for d in cs.HEAD_DIMS)


def test_launcher_d256_runs_the_blocked_postprocess(recorder):
    """D = 256 (v8 and v9: one kernel): the main kernel's float4 dQ reductions go to the
    blocked accumulator, which the blocked postprocess reads over the padded rows with NQ =
    64; one accumulator throughout."""
    q = torch.randn(1, 4, 9, 256, dtype=torch.float16)
    kv = torch.randn(1, 2, 130, 256, dtype=torch.float16)
    for variant in cb.VARIANTS:
        recorder.clear()
        cb.backward(q, q, kv, kv, q, torch.zeros(1, 4, 9), True, 0.1, variant)
        names = [c[0] for c in recorder]
        assert names == ["attn_bwd_pre_f16", f"attn_bwd_{variant}_d256_f16", "attn_bwd_post_blk_f16"]
        (_, _, _, a_pre, _), (_, g, _, a, shared), (_, g_post, b_post, a_post, _) = recorder
        assert g == (2, 3, 1) and shared == cb.smem_bytes(256)
        assert a[6] is a_pre[5] and a_post[0] is a_pre[5] and a_pre[5].shape == (4, 64, 256)
        assert g_post == (64 * 256 // 4 // 256, 4, 1) and b_post == 256
        assert a_post[2:8] == (9, 64, 4, 256, 64, 0.1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_limits_and_refusals(backend):
    BACKEND = backend  # noqa: N806
    impl = kernellab.registry.get("attention", BACKEND)
    assert impl.dtypes == (torch.float16, torch.bfloat16) and impl.devices == ("cuda",)
    q = torch.empty(1, 4, 9, 80, dtype=torch.bfloat16, device="meta")
    kv = torch.empty(1, 2, 9, 80, dtype=torch.bfloat16, device="meta")
    assert impl.outside_limits((q, kv, kv), {"causal": True}) is None
    q32 = torch.empty(1, 2, 9, 32, dtype=torch.bfloat16, device="meta")
    assert "head dim 32" in impl.outside_limits((q32, q32, q32), {})
    for kw, pat in (({"window": (3, 3)}, "window"), ({"softcap": 2.0}, "softcap")):
        assert pat in impl.outside_limits((q, kv, kv), kw)
        with pytest.raises(ValueError, match=rf"attention/{BACKEND}: {pat}"):
            impl.fn(q, kv, kv, **kw)
    assert impl.available is cs.sm90_unavailable
    assert BACKEND not in SPEC.default_backends


@pytest.mark.parametrize("backend", BACKENDS)
def test_cpu_tensors_and_fp32_refused(backend):
    BACKEND = backend  # noqa: N806
    if torch.cuda.is_available():
        pytest.skip("checked on a machine without a GPU")
    q, k, v = SPEC.make_inputs((1, 2, 9, 64), torch.bfloat16, "cpu", 0)
    with pytest.raises(ValueError, match=r"\bq\b is on cpu"):
        A.attention(q, k, v, backend=BACKEND)
    with pytest.raises(TypeError, match=rf"attention/{BACKEND}: q has dtype float32"):
        kernellab.registry.get("attention", BACKEND).fn(q.float(), k.float(), v.float())


# --------------------------------------------------------------------------- the kernels' math (no GPU)


@pytest.mark.parametrize("s_q,s_k", [(1, 1), (300, 300), (129, 500), (500, 129), (64, 64), (65, 63)])
@pytest.mark.parametrize("group", [1, 3])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_schedule_visits_every_needed_pair_once_and_masks_the_rest(s_q, s_k, group, d):
    bm = cb.query_rows(d)  # 128 at D = 64
    for causal in (False, True):
        ok = AA.allowed_mask(s_q, s_k, causal, None, "cpu")
        ok = torch.ones(s_q, s_k, dtype=torch.bool) if ok is None else ok
        seen = torch.zeros(group, s_q, s_k, dtype=torch.int32)
        sched = cb.schedule(s_q, s_k, causal, group, d)
        bn = cb.block_n(d)
        assert [n0 for n0, _ in sched] == list(range(0, s_k, bn))
        for n0, steps in sched:
            assert [g for g, _, _ in steps] == sorted(g for g, _, _ in steps)  # head-major
            for g, m0, masked in steps:
                assert m0 % bm == 0
                rows = slice(m0, min(m0 + bm, s_q))
                assert len(masked) == bn // 64
                for w in range(bn // 64):
                    keys = slice(n0 + 64 * w, min(n0 + 64 * w + 64, s_k))
                    if keys.start >= s_k:
                        assert masked[w]
                        continue
                    seen[g, rows, keys] += 1
                    if not masked[w]:  # every (row, key) of the 64 x bm tile is real and allowed
                        assert keys.stop - keys.start == 64 and ok[m0 : m0 + bm, keys].all()
        for g in range(group):
            assert (seen[g] <= 1).all()
            assert (seen[g][ok] == 1).all(), "an allowed (row, key) pair is never visited"


EMU_SHAPES = [
    (1, 2, 130, 300, 64),  # S_q < S_k
    (1, 2, 300, 130, 80),  # S_q > S_k: causal leaves rows without a key (lse = -inf)
    (1, 4, 2, 257, 129, 96),  # GQA, group 2
    (2, 131, 128),  # 3-D
    (1, 6, 2, 65, 200, 64),  # GQA, group 3
    (1, 2, 1, 1, 64),
    (1, 1, 5, 140, 256),  # D = 256: 64-key blocks, the head dim split
    (1, 4, 2, 130, 70, 256),  # ... GQA, S_q > S_k
]


@pytest.mark.parametrize("dtype", HALF, ids=dtype_id)
@pytest.mark.parametrize("shape", EMU_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_emulated_backward_matches_the_reference(shape, dtype, causal):
    q, k, v = SPEC.make_inputs(shape, dtype, "cpu", 3)
    scale = 1 / math.sqrt(q.shape[-1])
    o, lse = cs.emulate(q, k, v, causal, scale)
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    got = cb.emulate_backward(do, q, k, v, o, lse, causal, scale)
    _check_grads(got, q, k, v, do, causal, scale, str(shape))


@pytest.mark.parametrize("shape", [(1, 6, 2, 65, 200, 64), (2, 7, 1, 130, 130, 64), (1, 4, 2, 257, 129, 96)],
                         ids=lambda s: "x".join(map(str, s)))  # fmt: skip
@pytest.mark.parametrize("split", [2, 4])
def test_emulated_split_backward_matches_the_reference_and_the_whole_group(shape, split):
    """A split build's arithmetic (``emulate_backward(split=)``): dK and dV per run of q heads,
    summed in fp32 after; against the float64 reference, and within a rounding of the
    unsplit emulation (only the order of the fp32 sums differs), dq equal."""
    q, k, v = SPEC.make_inputs(shape, torch.bfloat16, "cpu", 5)
    scale = 1 / math.sqrt(q.shape[-1])
    o, lse = cs.emulate(q, k, v, True, scale)
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    got = cb.emulate_backward(do, q, k, v, o, lse, True, scale, split=split)
    _check_grads(got, q, k, v, do, True, scale, f"{shape} split {split}")
    whole = cb.emulate_backward(do, q, k, v, o, lse, True, scale)
    assert torch.equal(got[0], whole[0])
    for g, w in zip(got[1:], whole[1:]):
        torch.testing.assert_close(g.float(), w.float(), rtol=1e-2, atol=1e-2)


def test_emulated_backward_survives_large_scores():
    q, k, v = SPEC.make_inputs((1, 2, 200, 333, 128), torch.bfloat16, "cpu", 4)
    q[..., 0, :] *= 30
    o, lse = cs.emulate(q, k, v, True, 0.2)
    do = torch.randn(o.shape).to(torch.bfloat16)
    got = cb.emulate_backward(do, q, k, v, o, lse, True, 0.2)
    assert all(torch.isfinite(g).all() for g in got)
    _check_grads(got, q, k, v, do, True, 0.2)


# --------------------------------------------------------------------------- GPU


def _sm90():
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    why = cb.sm90_unavailable()
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
    (1, 8, 2, 517, 517, 128),  # GQA 4
    (2, 4, 1, 384, 130, 80),  # MQA
    (1, 6, 2, 200, 333, 96),  # GQA 3
    (1, 4, 2048, 64),
    (1, 2, 255, 256, 256),  # D = 256: 64-key blocks, the head dim split between warpgroups
    (1, 4, 2, 130, 300, 256),
]


def _run(backend, args, dy, causal):
    leaves = [a.detach().clone().requires_grad_() for a in args]
    out = A.attention(*leaves, causal=causal, backend=backend)
    return (out,) + torch.autograd.grad(out, leaves, dy)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", cb.VARIANTS)
@pytest.mark.parametrize("dtype", HALF, ids=dtype_id)
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gpu_grads_against_reference_and_emulation(dtype, shape, causal, variant):
    _sm90()
    q, k, v = SPEC.make_inputs(shape, dtype, "cuda", 5)
    scale = 1 / math.sqrt(q.shape[-1])
    o, lse = cs.forward(q, k, v, causal, scale, cb.FWD_VARIANT)
    do = torch.randn(o.shape, device="cuda").to(dtype)
    for poison in (float("nan"), 0.0):  # every gradient element is written (NaN-poisoned caching allocator)
        torch.empty(64 << 20, device="cuda").fill_(poison)
        got = cb.backward(do, q, k, v, o, lse, causal, scale, variant)
        torch.cuda.synchronize()
        for g in got:
            assert torch.isfinite(g).all()
    _check_grads(got, q, k, v, do, causal, scale, str(shape))
    if cb.backward_kernel(q.shape[-1]) == "cuda":
        emu = cb.emulate_backward(do, q, k, v, o, lse, causal, scale)
        for name, g, e in zip(("dq", "dk", "dv"), got, emu):
            torch.testing.assert_close(
                g.float(), e.float(), rtol=2e-2, atol=2e-2, msg=lambda m, n=name: f"{n}: {m}"
            )


LAB_EXACT = [(d, o) for d in cb.BWD_HEAD_DIMS for o in cb.BWD_LAB[d] if o.exact]


@pytest.mark.gpu
@pytest.mark.parametrize("d,opts", LAB_EXACT, ids=lambda x: str(x))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gpu_exact_lab_builds_against_reference_and_emulation(d, opts, causal):
    """Each lab build that computes every gradient (BWD_LAB, ``exact``), at its head dim:
    tails, GQA, S_q != S_k, against the float64 reference and the default's emulation."""
    _sm90()
    for n, shape in enumerate(((1, 2, 255, 256, d), (1, 4, 2, 130, 300, d), (2, 8, 2, 200, 77, d))):
        q, k, v = SPEC.make_inputs(shape, torch.bfloat16, "cuda", 60 + n)
        scale = 1 / math.sqrt(d)
        o, lse = cs.forward(q, k, v, causal, scale, cb.FWD_VARIANT)
        do = torch.randn(o.shape, device="cuda").to(torch.bfloat16)
        torch.empty(64 << 20, device="cuda").fill_(float("nan"))
        got = cb.backward(do, q, k, v, o, lse, causal, scale, "v9", opts)
        torch.cuda.synchronize()
        assert all(torch.isfinite(g).all() for g in got), (shape, opts)
        _check_grads(got, q, k, v, do, causal, scale, f"{shape} {opts}")
        emu = cb.emulate_backward(do, q, k, v, o, lse, causal, scale, bm=cb.query_rows(d, opts))
        for name, g, e in zip(("dq", "dk", "dv"), got, emu):
            torch.testing.assert_close(
                g.float(), e.float(), rtol=2e-2, atol=2e-2, msg=lambda m, n=name: f"{n}: {m}"
            )


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", HALF, ids=dtype_id)
@pytest.mark.parametrize("d", cs.HEAD_DIMS)
def test_gpu_forward_and_grads_every_head_dim(dtype, d, backend):
    """Through the public op and autograd, as the forward backends' test does."""
    _sm90()
    for shape, causal in (
        ((1, 4, 2, 200, 333, d), True),
        ((2, 2, 257, d), False),
        ((1, 8, 2, 700, 700, d), True),
    ):
        args = SPEC.make_inputs(shape, dtype, "cuda", 6)
        a64 = [a.detach().double().requires_grad_() for a in args]
        ref = SPEC.reference(*a64, causal=causal)
        dy = torch.randn(ref.shape, device="cuda").to(dtype)
        ref_g = torch.autograd.grad(ref, a64, dy.double())
        base, got = _run("torch", args, dy, causal), _run(backend, args, dy, causal)
        for name, g, r, b in zip(("o", "dq", "dk", "dv"), got, (ref,) + ref_g, base):
            verdict = judge(g, r, dtype, b)
            assert verdict.ok, (
                f"{shape} {name}: {verdict.detail} (err {verdict.err:.3g}, bound {verdict.bound:.3g})"
            )


@pytest.mark.gpu
@pytest.mark.parametrize("variant", cb.VARIANTS)
def test_gpu_dk_dv_bitwise_reproducible(variant):
    """Unsplit, dK and dV take no atomics: reruns are bitwise equal (dQ's atomics may reorder).
    At this shape's 36 items the default splits (``split_count``); under
    torch.use_deterministic_algorithms it does not."""
    _sm90()
    q, k, v = SPEC.make_inputs((2, 8, 2, 1025, 1025, 128), torch.bfloat16, "cuda", 12)
    o, lse = cs.forward(q, k, v, True, 0.1, cb.FWD_VARIANT)
    do = torch.randn(o.shape, device="cuda").to(torch.bfloat16)
    assert cb._plan_backward(do, q, k, v, o, lse, True, 0.1, variant).kv_acc  # the default splits here
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        assert not cb._plan_backward(do, q, k, v, o, lse, True, 0.1, variant).kv_acc
        _, dk0, dv0 = cb.backward(do, q, k, v, o, lse, True, 0.1, variant)
        for _ in range(10):
            _, dk, dv = cb.backward(do, q, k, v, o, lse, True, 0.1, variant)
            assert torch.equal(dk, dk0) and torch.equal(dv, dv0)
    finally:
        torch.use_deterministic_algorithms(False)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gpu_default_split_matches_the_unsplit_build(causal):
    """Qwen2.5-0.5B's 2 k/v heads of 7 q heads, 2 x 1024: 32 items, which the default splits
    (``split_count``): its gradients against the float64 reference and, within the fp32 sums'
    order, the unsplit build's."""
    _sm90()
    q, k, v = SPEC.make_inputs((2, 14, 2, 1024, 1024, 64), torch.bfloat16, "cuda", 14)
    o, lse = cs.forward(q, k, v, causal, 0.125, cb.FWD_VARIANT)
    do = torch.randn(o.shape, device="cuda").to(torch.bfloat16)
    assert cb._plan_backward(do, q, k, v, o, lse, causal, 0.125, "v9").kv_acc == (2, 2, 1024, 64)
    torch.empty(64 << 20, device="cuda").fill_(float("nan"))
    got = cb.backward(do, q, k, v, o, lse, causal, 0.125, "v9")
    one = cb.backward(do, q, k, v, o, lse, causal, 0.125, "v9", dataclasses.replace(cb.BWD_DEFAULTS[64], split=1))
    _check_grads(got, q, k, v, do, causal, 0.125, "split default")
    for name, g, e in zip(("dq", "dk", "dv"), got, one):
        torch.testing.assert_close(g.float(), e.float(), rtol=1e-2, atol=1e-2, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.gpu
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gpu_item_sections_change_nothing_but_the_order(d, causal):
    """Sections of at most 1, 3 (four of 2-3 pairs) and all 10 (k/v head, batch) pairs, with
    more items than blocks at work: dK and dV bitwise equal to the default's (each item's
    arithmetic is the same whichever block takes it, when), dQ within its atomics' reordering."""
    _sm90()
    q, k, v = SPEC.make_inputs((2, 10, 5, 700, 3000, d), torch.bfloat16, "cuda", 13)  # 240 items
    o, lse = cs.forward(q, k, v, causal, 0.1, cb.FWD_VARIANT)
    do = torch.randn(o.shape, device="cuda").to(torch.bfloat16)
    unsplit = dataclasses.replace(cb.BWD_DEFAULTS[d], split=1)
    dq0, dk0, dv0 = cb.backward(do, q, k, v, o, lse, causal, 0.1, "v9", unsplit)
    for pairs in (1, 3, 10):
        opts = dataclasses.replace(cb.BWD_DEFAULTS[d], pairs=pairs)
        dq, dk, dv = cb.backward(do, q, k, v, o, lse, causal, 0.1, "v9", opts)
        assert torch.equal(dk, dk0) and torch.equal(dv, dv0), pairs
        torch.testing.assert_close(dq.float(), dq0.float(), rtol=1e-2, atol=1e-2)


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
    assert saved[4].shape == q.shape[:-1] and saved[4].dtype == torch.float32


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


# --------------------------------------------------------------------------- lab builds (no GPU)


LOOP_BUILDS = [(d, o) for d in cb.BWD_HEAD_DIMS for o in (cb.BWD_DEFAULTS[d], *cb.BWD_LAB[d]) if o.exact]


@pytest.mark.parametrize("d,opts", LOOP_BUILDS, ids=lambda x: str(x))
def test_loop_builds_compile_clean(d, opts):
    """Every exact build of the main loop at every head dim, the default (BWD_DEFAULTS) and the
    lab's: the base build's kernels and wgmmas, clean (no serialized wgmmas, spills, stack or
    local memory; 168 registers); fast-exp's main kernels compute P by ex2.approx.ftz.f32
    (ptxas adds no range check around it), the others by exp2f's ex2.approx.f32 (which ptxas
    wraps in a compare and two multiplies for results below 2^-126)."""
    _nvrtc()
    from kernellab.inspect import asm

    mod = cb.bwd_module(d, opts)
    _assert_build_clean(d, mod, *opts.flags)
    ptx = mod.compile("sm_90", target="ptx").decode()
    assert _bwd_build(ptx, d) == dataclasses.replace(opts, no_dq_red=False, split=0)  # the flags set BwdBuild
    built = asm.split_ptx(ptx)
    plain = asm.split_ptx(cb.bwd_module(d, cb.BwdOpts()).compile("sm_90", target="ptx").decode())
    assert set(built) == set(plain) == _names(d)
    for sfx in ("bf16", "f16"):
        main, base = built[f"attn_bwd_v9_d{d}_{sfx}"], plain[f"attn_bwd_v9_d{d}_{sfx}"]
        # 128-row query blocks: dV and dK over 8 k steps of 16 queries instead of 4, dQ over 8
        # of 16 keys (both tiles) instead of 4: 12 more in each of the loop's two copies
        more = 12 if opts.q128 else 0
        assert main.count("wgmma.mma_async") == base.count("wgmma.mma_async") + more
        assert "ex2.approx.f32" in base and "ex2.approx.ftz.f32" not in base
        if opts.fast_exp:
            assert "ex2.approx.ftz.f32" in main and "ex2.approx.f32" not in main
        else:
            assert "ex2.approx.f32" in main and "ex2.approx.ftz.f32" not in main
        # the dS^T tiles: BM / 16 stmatrix x4 a thread (stsm) in place of BM / 4 4-byte shared
        # stores (the kernel's only ones)
        bm = 128 if opts.q128 else 64
        stsm = main.count("stmatrix.sync.aligned.m8n8.x4.shared.b16"), main.count("st.shared.b32")
        assert stsm == ((bm // 16, 0) if opts.stsm else (0, bm // 4)), stsm


def _bwd_build(ptx: str, d: int) -> cb.BwdOpts:
    """attention_sm90_bwd.cu's BwdBuild<d> as NVRTC's PTX lists its members (.global .u8
    <mangled name> [= 1])."""
    got = dict(re.findall(rf"\.global \.align 1 \.u8 _ZN8BwdBuildILi{d}EE\d+(\w+?)E(?: = (\d))?;", ptx))
    assert set(got) == {"FAST_EXP", "MASK_BRANCH", "DESC_ADD", "PERSIST", "Q128", "STSM"}, got
    return cb.BwdOpts(**{k.lower(): v == "1" for k, v in got.items()})


def test_defaults_are_the_cu_s():
    """BWD_DEFAULTS[d] is attention_sm90_bwd.cu's BwdBuild<d>: the build of MODULES[d] (no
    options but the head dim) and of head dim d in the every-head-dim MODULE that `kernellab
    check` compiles without a GPU (the same template)."""
    _nvrtc()
    for d in cb.BWD_HEAD_DIMS:
        assert cb.MODULES[d].options == (f"-DKL_ATTN_D={d}",)
        assert _bwd_build(cb.MODULES[d].compile("sm_90", target="ptx").decode(), d) == cb.BWD_DEFAULTS[d], d


def _make_desc(addr: int, lbo: int, sbo: int, mode: int) -> int:
    """attention_sm90_common.cuh's make_desc."""
    return (
        ((addr & 0x3FFFF) >> 4) | (((lbo >> 4) & 0x3FFF) << 16) | (((sbo >> 4) & 0x3FFF) << 32) | (mode << 62)
    )


@pytest.mark.parametrize("d", cb.BWD_HEAD_DIMS)
def test_desc_add_gives_the_same_descriptors(d):
    """KL_ATTN_BWD_DESC_ADD's descriptors equal the default's: for every 1024-aligned tile
    of the block's shared memory (below 2^18 bytes) and every k-step offset the loop uses
    (K-major: (kk 16 / E) R W + (kk 16 % E) 2; MN-major: row0 W), make_desc(tile + offset)
    == make_desc(tile) + offset / 16; attention_sm90_common.cuh builds them so."""
    src = cb.CU.with_name("attention_sm90_common.cuh").read_text()
    assert (
        "make_desc(tile, R * L::W, 8 * L::W, L::MODE) + static_cast<unsigned long long>(row0 * (L::W / 16))"
        in src
    )
    assert "make_desc(tile + row0 * L::W, 16, 8 * L::W, L::MODE) + (step >> 4)" in src
    w, e = cs.swizzle_bytes(d), cs.swizzle_bytes(d) // 2
    top = cb.smem_bytes(d, "v9")
    assert top < 1 << 18
    bn = cb.block_n(d)
    for r in (bn, 64):
        offsets = [
            (kk * 16 // e) * (r * w) + (kk * 16 % e) * 2 + row0 * w
            for kk in range(d // 16)
            for row0 in (0, 64)
        ]
        offsets += [row0 * w for row0 in range(0, r, 16)]
        for tile in range(0, top, 1024):
            for off in offsets:
                if tile + off + 16 > top:
                    continue
                assert off % 16 == 0
                assert _make_desc(tile + off, 16, 8 * w, 1) == _make_desc(tile, 16, 8 * w, 1) + off // 16


def test_lab_builds_named_and_built_beside_the_default():
    """BwdOpts: each head dim's default (BWD_DEFAULTS) is MODULES[d], built with its flags; a
    lab build is a module of its own, kept per (d, opts); no-dq-red (the default without dQ
    sums) drops every dQ reduce-add and keeps every wgmma, and is not exact (the lab never
    checks it); the default PTX keeps its reduce-adds."""
    import re

    assert str(cb.BwdOpts()) == "base" and cb.BwdOpts().exact
    assert str(cb.BwdOpts(fast_exp=True, desc_add=True)) == "fast-exp+desc-add"
    assert cb.BwdOpts(fast_exp=True, desc_add=True).flags == (
        "-DKL_ATTN_BWD_FAST_EXP=1",
        "-DKL_ATTN_BWD_MASK_BRANCH=0",
        "-DKL_ATTN_BWD_DESC_ADD=1",
        "-DKL_ATTN_BWD_PERSIST=0",
        "-DKL_ATTN_BWD_Q128=0",
        "-DKL_ATTN_BWD_STSM=0",
    )
    assert cb.BwdOpts(no_dq_red=True).flags[0] == "-DKL_ATTN_BWD_NO_DQ_RED=1"
    assert set(cb.BWD_DEFAULTS) == set(cb.BWD_HEAD_DIMS) and all(o.exact for o in cb.BWD_DEFAULTS.values())
    for d in cb.BWD_HEAD_DIMS:
        default = cb.BWD_DEFAULTS[d]
        assert cb.bwd_module(d) is cb.MODULES[d] and cb.bwd_module(d, default) is cb.MODULES[d]
        assert default not in cb.BWD_LAB[d] and len(set(cb.BWD_LAB[d])) == len(cb.BWD_LAB[d])
        assert cb.BWD_LAB[d][0] == cb.BwdOpts(**{**default.__dict__, "no_dq_red": True})
        assert sum(not o.exact for o in cb.BWD_LAB[d]) == 1
    nored = {d: cb.BWD_LAB[d][0] for d in cb.BWD_HEAD_DIMS}
    _nvrtc()
    reds = re.compile(r"red\.[a-z.:]*add|cp\.reduce\.async\.bulk")
    for d in (128, 256):  # v9 by bulk reduce-adds at 128, by atomics at 256
        mod = cb.bwd_module(d, nored[d])
        assert mod is cb.bwd_module(d, nored[d]) and mod is not cb.MODULES[d]
        lab_ptx = mod.compile("sm_90", target="ptx").decode()
        ptx = cb.MODULES[d].compile("sm_90", target="ptx").decode()
        assert len(reds.findall(ptx)) > 0 and not reds.findall(lab_ptx), d
        assert lab_ptx.count("wgmma.mma_async") == ptx.count("wgmma.mma_async"), d
