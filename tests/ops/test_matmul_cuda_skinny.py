"""matmul's cuda_skinny backend (skinny.cu, M <= 128): the launch plan and split-K as pure
functions; TABLE and the config checks; the weight layouts it reads in place; the limits
and the launcher's argument checks; every kernel TABLE can launch compiles with NVRTC for
sm_80 and sm_90; GPU runs against float64 at odd shapes, both layouts, and the gradients."""

from __future__ import annotations

import itertools

import pytest
import torch

import kernellab
import kernellab.ops.matmul as mm
from kernellab.cuda.runtime import nvrtc_unavailable
from kernellab.harness.compare import judge
from kernellab.ops.matmul import cuda_skinny as cs
from kltest import dtype_id, nvrtc_log, seed_for

HALF = [torch.bfloat16, torch.float16]
WEIGHTS = [(14336, 4096), (4096, 14336), (4096, 4096), (128256, 4096), (3072, 768), (50257, 768)]
ODD = [(1, 1), (4095, 4095), (17, 4101), (3000, 5000), (8, 100000)]


# --------------------------------------------------------------------------- plan (pure)


@pytest.mark.parametrize("sms", [132, 108, 20])
def test_split_k_slices_cover_k_without_empty_ones(sms):
    for tiles, k, granule, waves, max_chunk in itertools.product(
        [1, 24, 64, 224, 2004], [1, 63, 64, 768, 4095, 4096, 14336, 100000], [32, 64, 128], [0.5, 1, 2, 4],
        [None, 2048],
    ):  # fmt: skip
        s, kchunk = cs.split_k(tiles, k, granule, sms, waves, max_chunk)
        where = (tiles, k, granule, sms, waves, max_chunk, s, kchunk)
        assert kchunk % granule == 0 and kchunk > 0, where
        assert s * kchunk >= k > (s - 1) * kchunk, where  # every slice holds some K
        if max_chunk is not None:
            assert kchunk <= max(max_chunk, granule), where
        else:
            assert s <= cs.SPLIT_MAX, where
            if s > 1:  # slices no shorter than the minimum; the smallest count that fills
                assert kchunk >= cs.MIN_SLICE_K, where
                assert tiles * (s - 1) < cs.FILL * waves * sms, where


def test_split_k_examples():
    # 32 output tiles (M = 128 at 4096 x 4096, 128-wide) on 132 SMs: 4 slices fill a wave
    assert cs.split_k(32, 4096, 32, 132, 1.0) == (4, 1024)
    # the LM head has tiles for many waves: no split
    assert cs.split_k(2004, 4096, 64, 132, 2.0) == (1, 4096)
    # ... unless a slice may hold at most 2048 of K (the gemv kernel's copy of x)
    assert cs.split_k(2004, 4096, 64, 132, 2.0, max_chunk=2048) == (2, 2048)
    # K = 768 is cut into 256-long slices at most
    assert cs.split_k(48, 768, 64, 132, 2.0) == (3, 256)
    # asked-for slice counts: rounded so that none is empty
    assert cs.split_k(64, 4096, 64, 132, 2.0, splits=3) == (3, 1408)
    assert cs.split_k(64, 100, 64, 132, 2.0, splits=8) == (2, 64)
    with pytest.raises(ValueError, match="splits"):
        cs.split_k(64, 4096, 64, 132, 2.0, splits=0)


def test_plan_follows_table_and_fits():
    for m, (n, k), layout, dtype in itertools.product(
        [1, 2, 3, 8, 9, 16, 17, 32, 33, 64, 100, 128], WEIGHTS + ODD, ("nt", "nn"), HALF
    ):
        p = cs.plan(m, n, k, layout, dtype, 132)
        cfg = cs.choose_config(m, layout)
        assert p.config == cfg
        assert p.kernel == cfg.kernel(m, layout, dtype)
        gx, gy, gz = p.grid
        assert gx * cfg.block_n >= n > (gx - 1) * cfg.block_n
        assert gy * cfg.block_m(m) >= m and gz == p.splits and p.block == cfg.threads
        assert p.splits * p.kchunk >= k > (p.splits - 1) * p.kchunk and p.kchunk % cfg.granule == 0
        assert p.shared == cfg.shared(m, layout, p.kchunk) <= cs.SMEM_MAX


def test_plan_examples():
    # decode against Llama-3-8B's down projection on an H100/H200: 256 row groups of 16,
    # K in 4 equal slices of 14 warp ranges of 256 (of the block's 16)
    p = cs.plan(1, 4096, 14336, "nt", torch.bfloat16, 132)
    assert p.kernel == "skinny_rows_m1_bf16" and p.grid == (256, 1, 4) and p.kchunk == 3584
    assert p.shared == 0 and p.block == 512
    # M = 3 runs the rows kernel's M = 4 build: K in 4 slices of 7 warp ranges of 512 (of the block's 8)
    p = cs.plan(3, 4096, 14336, "nt", torch.bfloat16, 132)
    assert p.kernel == "skinny_rows_m4_bf16" and p.grid == (256, 1, 4) and p.kchunk == 3584
    assert p.shared == 0 and p.block == 256
    p = cs.plan(5, 4096, 14336, "nt", torch.bfloat16, 132)
    assert p.kernel == "skinny_gemv_m8_bf16" and p.grid == (64, 1, 7) and p.kchunk == 2048
    assert p.shared == 5 * (2048 + 32) * 2
    assert cs.plan(2, 4096, 4096, "nt", torch.bfloat16, 132).kernel == "skinny_rows_m2_bf16"
    assert cs.plan(1, 4096, 4096, "nn", torch.bfloat16, 132).kernel == "skinny_cols_m1_bf16"
    assert cs.plan(2, 4096, 4096, "nn", torch.bfloat16, 132).kernel == "skinny_cols_m2_bf16"
    assert cs.plan(3, 4096, 4096, "nn", torch.bfloat16, 132).kernel == "skinny_tile_nn_bf16"
    assert cs.plan(8, 4096, 4096, "nt", torch.float16, 132).kernel == "skinny_gemv_m8_f16"
    assert cs.plan(16, 4096, 4096, "nt", torch.float16, 132).kernel == "skinny_tile_nt_f16"
    assert cs.plan(16, 4096, 4096, "nn", torch.float16, 132).kernel == "skinny_tile_nn_f16"
    assert cs.plan(128, 4096, 4096, "nt", torch.bfloat16, 132).grid == (64, 1, 2)
    # a config and a slice count asked for (the sweep's knobs)
    cfg = cs.TileConfig(bn=128, bm=32, bk=64, stages=3, wn=4, wm=1)
    p = cs.plan(20, 1000, 3000, "nt", torch.bfloat16, 132, cfg, splits=5)
    assert (p.kernel, p.grid, p.kchunk) == ("skinny_tile_nt_bf16", (8, 1, 5), 640)


def test_rows_config_plans_whole_warp_ranges():
    cfg = cs.RowsConfig(warps=4, chunks=4, rows=16, unroll=2)
    # an 8B model's up projection at M = 1: 896 row groups, one slice of all of K
    p = cs.plan(1, 14336, 4096, "nt", torch.bfloat16, 132, cfg)
    assert (p.kernel, p.grid, p.block, p.kchunk, p.shared) == (
        "skinny_rows_m1_bf16",
        (896, 1, 1),
        128,
        4096,
        0,
    )
    # the down projection: K = 14336 is 14 warp ranges of 1024, in slices of 4 warps
    p = cs.plan(1, 4096, 14336, "nt", torch.float16, 132, cfg)
    assert (p.kernel, p.grid, p.kchunk) == ("skinny_rows_m1_f16", (256, 1, 4), 4096)
    # M = 3 runs the M <= 4 build; 2 chunks (ranges of 512): 28 ranges, slices of 4
    p = cs.plan(3, 4096, 14336, "nt", torch.float16, 132, cs.RowsConfig(chunks=2))
    assert (p.kernel, p.grid, p.kchunk) == ("skinny_rows_m4_f16", (256, 1, 7), 2048)
    assert "-DSK_RJ=4" in cfg.macros() and "-DSK_RN=16" in cfg.macros()
    # x's registers: M rounds up to 1, 2, 4, 8 and M x chunks x 8 values must stay <= 64
    assert [cfg.block_m(m) for m in (1, 2, 3, 5, 8)] == [1, 2, 4, 8, 8]
    with pytest.raises(ValueError, match="fewer chunks"):
        cfg.kernel(3, "nt", torch.bfloat16)
    assert cs.RowsConfig(chunks=1).kernel(8, "nt", torch.bfloat16) == "skinny_rows_m8_bf16"
    with pytest.raises(ValueError, match="nt weight layout"):
        cfg.kernel(1, "nn", torch.bfloat16)
    with pytest.raises(ValueError, match="M <= 8"):
        cs.RowsConfig(chunks=1).kernel(9, "nt", torch.bfloat16)
    with pytest.raises(ValueError, match="multiple of 2 x unroll"):
        cs.RowsConfig(rows=6, unroll=2)
    with pytest.raises(ValueError, match="unroll x chunks"):
        cs.RowsConfig(chunks=4, unroll=4)
    # TABLE rows of the rows kernel build each M class their bound reaches, and no more
    table = ((3, ("nt",), cs.RowsConfig(chunks=1)), (128, ("nt", "nn"), cs.TileConfig()))
    names = {k for _, k in cs.table_kernels(table)}
    assert {n for n in names if "rows" in n} == {
        f"skinny_rows_m{m}_{s}" for m in (1, 2, 4) for s in ("bf16", "f16")
    }


def test_cols_config_plans_and_refuses():
    cfg = cs.ColsConfig(warps=8, chunks=1, unroll=4, kc=2048, waves=2.0)
    # M = 1 against a row-major 4096 x 4096 b: 16 blocks of 256 outputs; 16 slices of 256 k
    # fill two waves of 132 SMs
    p = cs.plan(1, 4096, 4096, "nn", torch.bfloat16, 132, cfg)
    assert (p.kernel, p.grid, p.block, p.kchunk) == ("skinny_cols_m1_bf16", (16, 1, 16), 256, 256)
    assert p.shared == 4 * 1 * max(256, 8 * 256)  # the warps' sums outgrow x's stage
    # odd sizes: N = 4097 needs a 17th block; K = 4095 in 15 slices of 288, the last shorter
    p = cs.plan(3, 4097, 4095, "nn", torch.float16, 132, cfg)
    assert (p.kernel, p.grid, p.kchunk) == ("skinny_cols_m4_f16", (17, 1, 15), 288)
    # a long K: x's stage (kc) caps the slice
    p = cs.plan(16, 256, 14336, "nn", torch.bfloat16, 132, cfg)
    assert (p.kernel, p.grid, p.kchunk) == ("skinny_cols_m16_bf16", (1, 1, 56), 256)
    p = cs.plan(16, 256, 14336, "nn", torch.bfloat16, 132, cs.ColsConfig(waves=0.01))
    assert p.grid == (1, 1, 7) and p.kchunk == 2048 and p.shared == 4 * 16 * 2048
    assert "-DSK_CW=8" in cfg.macros() and "-DSK_CU=4" in cfg.macros()
    assert [cfg.block_m(m) for m in (1, 2, 3, 5, 9, 16)] == [1, 2, 4, 8, 16, 16]
    with pytest.raises(ValueError, match="nn weight layout"):
        cfg.kernel(1, "nt", torch.bfloat16)
    with pytest.raises(ValueError, match="M <= 16"):
        cfg.kernel(17, "nn", torch.bfloat16)
    with pytest.raises(ValueError, match="fewer chunks"):
        cs.ColsConfig(chunks=2, unroll=2).kernel(9, "nn", torch.bfloat16)
    with pytest.raises(ValueError, match="unroll x chunks"):
        cs.ColsConfig(chunks=2, unroll=8)
    with pytest.raises(ValueError, match="kc"):
        cs.ColsConfig(kc=100)
    # a block that cannot get its shared memory is refused by the plan, not launched
    with pytest.raises(ValueError, match="shared memory"):
        cs.plan(16, 4096, 4096, "nn", torch.bfloat16, 132, cs.ColsConfig(warps=16, chunks=1))
    table = ((8, ("nn",), cs.ColsConfig()), (128, ("nt", "nn"), cs.TileConfig()))
    assert {k for _, k in cs.table_kernels(table) if "cols" in k} == {
        f"skinny_cols_m{m}_{s}" for m in (1, 2, 4, 8) for s in ("bf16", "f16")
    }


def _cols_model(x, w, cfg, kchunk):
    """skinny_cols's loops in numpy, block by block: the rows each warp's load groups reach
    (two groups a pass), the outputs each lane's chunks hold, the warps' sums added in warp
    order, then the slices in slice order. Every (k, n) product must be counted once."""
    import numpy as np

    m, k = x.shape
    n = w.shape[1]
    cw, cu, cn, step = cfg.warps, cfg.unroll, cfg.block_n, cfg.warps * cfg.unroll
    seen = np.zeros((k, n), dtype=np.int64)
    y = np.zeros((m, n))
    for z in range(-(-k // kchunk)):
        kb = z * kchunk
        klen = min(k - kb, kchunk)
        for bx in range(-(-n // cn)):
            n0 = bx * cn
            part = np.zeros((cw, m, cn))
            groups = -(-klen // step)
            for wp in range(cw):
                for g in range(0, groups, 2):
                    for r0 in (wp + g * step, wp + (g + 1) * step):
                        for u in range(cu):
                            r = r0 + u * cw
                            if r >= klen:
                                continue
                            for j in range(cfg.chunks):
                                for lane in range(32):
                                    c = j * 256 + lane * 8
                                    cols = [c + e for e in range(8) if n0 + c + e < n]
                                    for cc in cols:
                                        seen[kb + r, n0 + cc] += 1
                                        part[wp, :, cc] += x[:, kb + r] * w[kb + r, n0 + cc]
            width = min(cn, n - n0)
            y[:, n0 : n0 + width] += part.sum(0)[:, :width]
    return y, seen


@pytest.mark.parametrize("n,k,kchunk", [(300, 70, 32), (513, 100, 64), (40, 5, 32)])
@pytest.mark.parametrize(
    "cfg", [cs.ColsConfig(warps=3, chunks=1, unroll=2), cs.ColsConfig(warps=2, chunks=2, unroll=3)], ids=str
)
def test_cols_loops_cover_every_product_once(n, k, kchunk, cfg):
    import numpy as np

    rng = np.random.default_rng(n * k)
    x, w = rng.standard_normal((3, k)), rng.standard_normal((k, n))
    y, seen = _cols_model(x, w, cfg, kchunk)
    assert (seen == 1).all()
    np.testing.assert_allclose(y, x @ w, rtol=1e-12, atol=1e-12)


def _cols_odd_model(x, w, woff, ldw, cfg, kchunk):
    """skinny_cols's vec == 0 path in Python: the weight [k, n] lies in a flat buffer at half
    offset ``woff`` from a 16-byte boundary with row pitch ``ldw`` (odd); a run is 248
    outputs; lane l loads aligned chunk l from the run's start rounded down (where it holds
    an output < n), takes chunk l + 1 from lane l + 1 and shifts out its 8 outputs (lane 31
    none); the epilogue maps the 256-wide sums back to the run's outputs. Returns y and, per
    (k, n), how often the value of w[k, n] met output n (an element of another column
    counted as that column's would show)."""
    import numpy as np

    m, k = x.shape
    n = w.shape[1]
    flat = np.full(woff + k * ldw + 16, np.nan)  # halfs; past the weight: values never to be used
    for r in range(k):
        flat[woff + r * ldw : woff + r * ldw + n] = w[r]
    ids = np.full(flat.shape, -1)
    for r in range(k):
        ids[woff + r * ldw : woff + r * ldw + n] = r * n + np.arange(n)
    run, cn = 248, 248 * cfg.chunks
    plan = cs.plan(m, n, k, "nn", torch.bfloat16, 132, cfg, -(-k // kchunk), aligned=False)
    assert plan.grid[0] == -(-n // cn)
    seen = np.zeros((k, n), dtype=np.int64)
    y = np.zeros((m, n))
    for z in range(-(-k // kchunk)):
        kb = z * kchunk
        for bx in range(plan.grid[0]):
            n0 = bx * cn
            for r in range(min(k - kb, kchunk)):
                for j in range(cfg.chunks):
                    first = n0 + j * run
                    start = woff + (kb + r) * ldw + first  # the run's first half in the buffer
                    off = (woff + (kb + r) * ldw + first) & 7
                    assert start % 8 == off
                    chunks = []
                    for lane in range(32):
                        at = start - off + 8 * lane
                        ok = first - off + 8 * lane < n
                        none = (np.zeros(8), -np.ones(8))
                        chunks.append((flat[at : at + 8], ids[at : at + 8]) if ok else none)
                    for lane in range(31):
                        need = min(8, n - (first + 8 * lane))
                        if need <= 0:
                            continue
                        vals = np.concatenate([chunks[lane][0], chunks[lane + 1][0]])[off : off + need]
                        got = np.concatenate([chunks[lane][1], chunks[lane + 1][1]])[off : off + need]
                        for e in range(need):
                            col = first + 8 * lane + e
                            assert got[e] == (kb + r) * n + col, (r, col, got[e])
                            seen[kb + r, col] += 1
                            y[:, col] += x[:, kb + r] * vals[e]
    return y, seen


def test_cols_odd_strides_fill_one_wave_of_block_slots():
    """At odd row strides (aligned False) the cols kernel's K slices fill the blocks x SMs
    slots in one wave, never past it (1x4097x4095 on 132 SMs: two blocks an SM, 17 runs of
    248 outputs x 15 slices = 255 blocks of 264; TABLE's odd row, one block an SM, 17 x 7 =
    119 of 132); an explicit count, the aligned kernel and the tile kernel keep split_k's;
    the slices stay within SPLIT_MAX and MIN_SLICE_K."""
    cfg = cs.choose_config(1, "nn")
    assert cfg.kind == "cols" and cfg.blocks == 2
    p = cs.plan(1, 4097, 4095, "nn", torch.bfloat16, 132, cfg, aligned=False)
    assert p.grid == (17, 1, 15) and 17 * 15 <= 2 * 132 < 17 * 16
    assert p.kchunk * 14 < 4095 <= p.kchunk * 15
    odd = cs.choose_config(1, "nn", aligned=False)
    assert odd.kind == "cols" and odd.blocks == 1
    p = cs.plan(1, 4097, 4095, "nn", torch.bfloat16, 132, aligned=False)
    assert p.grid == (17, 1, 7) and 17 * 7 <= 132 < 17 * 8
    aligned = cs.plan(1, 4096, 4096, "nn", torch.bfloat16, 132)
    assert aligned.grid == (16, 1, cs.split_k(16, 4096, cfg.granule, 132, cfg.waves, cfg.max_chunk())[0])
    assert cs.plan(1, 4097, 4095, "nn", torch.bfloat16, 132, splits=12, aligned=False).grid[2] == 12
    cases = ((17, 4095, 2, 132), (1, 100000, 2, 132), (300, 4095, 2, 132), (5, 600, 3, 78))
    for tiles, k, blocks, sms in cases:
        s = cs.odd_splits(tiles, k, blocks, sms)
        assert 1 <= s <= min(cs.SPLIT_MAX, max(1, k // cs.MIN_SLICE_K))
        assert tiles * s <= blocks * sms or s == 1
    assert cs.odd_splits(1, 100000, 2, 132) == cs.SPLIT_MAX and cs.odd_splits(5, 600, 3, 78) == 2
    tile = cs.plan(9, 4097, 4095, "nn", torch.bfloat16, 132, aligned=False)
    assert tile.config.kind == "tile"
    assert tile.grid == cs.plan(9, 4097, 4095, "nn", torch.bfloat16, 132).grid


@pytest.mark.parametrize(
    "n,k,ldw,woff", [(300, 70, 301, 3), (513, 37, 515, 0), (40, 9, 41, 7), (249, 5, 253, 5)]
)
@pytest.mark.parametrize(
    "cfg", [cs.ColsConfig(warps=3, chunks=1, unroll=2), cs.ColsConfig(warps=2, chunks=2, unroll=3)], ids=str
)
def test_cols_odd_strides_model_every_product_once(n, k, ldw, woff, cfg):
    import numpy as np

    rng = np.random.default_rng(n * k)
    x, w = rng.standard_normal((2, k)), rng.standard_normal((k, n))
    y, seen = _cols_odd_model(x, w, woff, ldw, cfg, 32)
    assert (seen == 1).all()
    np.testing.assert_allclose(y, x @ w, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("m", cs.COLS_M)
def test_cols_kernels_compile_for_sm80_and_sm90(m):
    if nvrtc_unavailable():
        pytest.skip(nvrtc_unavailable())
    cfg = cs.ColsConfig(warps=8, chunks=2 if m <= 8 else 1, unroll=4)
    for dtype in HALF:
        kernel = cfg.kernel(m, "nn", dtype)
        mod = cs.module_for(cfg, kernel)
        for arch in ("sm_80", "sm_90"):
            ptx = mod.compile(arch, target="ptx").decode()
            assert f".entry {kernel}(" in ptx and ptx.count(".entry ") == 1, arch
            assert "mma.sync" not in ptx and "cp.async" not in ptx
            assert "ld.global.nc.L1::no_allocate.v4.u32" in ptx  # the aligned weight stream
            assert mod.compile(arch)[:4] == b"\x7fELF"


def test_plan_refuses_what_it_cannot_launch():
    with pytest.raises(ValueError, match="M <= 128"):
        cs.plan(129, 64, 64, "nt", torch.bfloat16, 132)
    with pytest.raises(ValueError, match="M <= 128"):
        cs.plan(0, 64, 64, "nt", torch.bfloat16, 132)
    with pytest.raises(ValueError, match="layout"):
        cs.plan(1, 64, 64, "tn", torch.bfloat16, 132)
    with pytest.raises(TypeError, match="float16"):
        cs.plan(1, 64, 64, "nt", torch.float32, 132)
    gemv = cs.GemvConfig()
    with pytest.raises(ValueError, match="nt weight layout"):
        cs.plan(1, 64, 64, "nn", torch.bfloat16, 132, gemv)
    with pytest.raises(ValueError, match="M <= 16"):
        cs.plan(17, 64, 64, "nt", torch.bfloat16, 132, gemv)


def test_table_covers_every_m_and_layout():
    for m, layout in itertools.product(range(1, cs.M_MAX + 1), ("nt", "nn")):
        cfg = cs.choose_config(m, layout)
        assert cfg.kind == "tile" or (layout == "nt" and m <= 16) or (cfg.kind == "cols" and m <= 16)
        assert cfg.kind != "cols" or layout == "nn"
        assert cfg.kind != "tile" or cfg.bm >= m  # one row block: the weight is read once
        assert cfg.kind != "rows" or m <= cs.ROWS_M[-1]
    with pytest.raises(ValueError, match="no config"):
        cs.choose_config(129, "nt")
    custom = ((8, ("nt",), cs.GemvConfig(warps=8)), (128, ("nt", "nn"), cs.TileConfig()))
    assert cs.choose_config(8, "nt", custom).warps == 8
    assert cs.choose_config(9, "nt", custom).kind == "tile"


def test_unaligned_nn_takes_the_odd_rows_first():
    """An nn product that is not 16-byte aligned takes TABLE's "nn-odd" rows (the cols
    kernel up to their bound), the plain nn rows past it; nt and aligned nn never do."""
    odd = [row for row in cs.TABLE if "nn-odd" in row[1]]
    assert odd and all(cfg.kind == "cols" for _, _, cfg in odd)
    bound = max(b for b, _, _ in odd)
    for m in range(1, cs.M_MAX + 1):
        cfg = cs.choose_config(m, "nn", aligned=False)
        if m <= bound:
            assert cfg in [c for b, _, c in odd if m <= b]
        else:
            assert cfg == cs.choose_config(m, "nn")
        assert cs.choose_config(m, "nt", aligned=False) == cs.choose_config(m, "nt")
    # the plan follows it: 4097 x 4095 (odd K, odd row stride) at M = 4
    p = cs.plan(4, 4097, 4095, "nn", torch.bfloat16, 132, aligned=False)
    assert p.config.kind == "cols" and p.kernel == "skinny_cols_m4_bf16"
    assert cs.plan(4, 4096, 4096, "nn", torch.bfloat16, 132).config == cs.choose_config(4, "nn")
    # a table without odd rows: unaligned nn falls back to the nn rows
    custom = ((128, ("nt", "nn"), cs.TileConfig()),)
    assert cs.choose_config(4, "nn", custom, aligned=False).kind == "tile"
    # every odd row's kernels are among those TABLE builds, under the nn names
    names = {k for _, k in cs.table_kernels()}
    assert {"skinny_cols_m4_bf16", "skinny_cols_m8_f16"} <= names


def test_configs_refuse_bad_shapes():
    with pytest.raises(ValueError, match="multiple of 16 wn"):
        cs.TileConfig(bn=64, wn=8)  # 8-row warp tiles: not an m16 MMA
    with pytest.raises(ValueError, match="multiple of 16 wn"):
        cs.TileConfig(bm=16, wm=4)  # 4 rows of x per warp
    with pytest.raises(ValueError, match="shared memory"):
        cs.TileConfig(bn=256, bm=128, bk=128, stages=4, wn=4, wm=2)
    with pytest.raises(ValueError, match="kc"):
        cs.GemvConfig(kc=1000)
    with pytest.raises(ValueError, match="unroll"):
        cs.GemvConfig(unroll=8, rows=2)
    with pytest.raises(ValueError, match="waves"):
        cs.TileConfig(waves=0)
    with pytest.raises(ValueError, match="prefetch"):
        cs.GemvConfig(prefetch=64)
    assert "-DSK_PF=256" in cs.TileConfig(prefetch=256).macros()
    # the shared-memory formula follows skinny.cu's layout: padded rows of 8 halfs
    t = cs.TileConfig(bn=64, bm=16, bk=64, stages=4)
    assert t.shared(1, "nt", 0) == 4 * (64 * 72 + 16 * 72) * 2
    assert t.shared(1, "nn", 0) == 4 * (64 * 72 + 16 * 72) * 2
    assert (
        cs.TileConfig(bn=128, bm=16, bk=32, stages=2, wn=4).shared(5, "nn", 0) == 2 * (32 * 136 + 16 * 40) * 2
    )
    assert cs.GemvConfig().shared(3, "nt", 1024) == 3 * 1056 * 2


# --------------------------------------------------------------------------- layouts, limits


def test_weight_layout_reads_linear_weights_and_row_major_b_in_place():
    w = torch.empty(48, 40)  # [N, K]
    assert cs.weight_layout(w.t()) == ("nt", 40)
    assert cs.weight_layout(torch.empty(40, 48)) == ("nn", 48)
    assert cs.weight_layout(torch.empty(48, 80)[:, :40].t()) == ("nt", 80)  # row stride 80
    assert cs.weight_layout(torch.empty(40, 96)[:, ::2]) is None  # sliced columns: packed
    assert cs.weight_layout(torch.empty(1, 48).expand(40, 48)) == ("nn", 0)  # stride 0 reads fine
    # size-1 dims: any stride; a [K, 1] column is one weight row
    assert cs.weight_layout(torch.empty(40, 1)) == ("nt", 40)
    assert cs.weight_layout(torch.empty(1, 48)) == ("nt", 1)


def test_limits_name_what_is_refused():
    a, b = torch.empty(4, 8, dtype=torch.bfloat16), torch.empty(8, 16, dtype=torch.bfloat16)
    assert cs.skinny_limits(a, b) is None
    assert "one 2-D product" in cs.skinny_limits(a[None], b[None])
    assert "M <= 128" in cs.skinny_limits(torch.empty(129, 8, dtype=torch.bfloat16), b)
    assert "float16" in cs.skinny_limits(a.float(), b.float())
    impl = kernellab.registry.get("matmul", "cuda_skinny")
    assert impl.limits is cs.skinny_limits and impl.devices == ("cuda",)
    assert impl.dtypes == (torch.float16, torch.bfloat16) and impl.double_backward
    assert impl.precompile == cs.MODULE.precompile


def test_launcher_checks_arguments_before_any_launch():
    a, b = torch.randn(4, 8).bfloat16(), torch.randn(8, 16).bfloat16()
    with pytest.raises(ValueError, match="one 2-D product"):
        cs.skinny_product(a[None], b[None])
    with pytest.raises(ValueError, match="M <= 128"):
        cs.skinny_product(torch.randn(200, 8).bfloat16(), b)
    with pytest.raises(TypeError, match="float16"):
        cs.skinny_product(a.float(), b.float())
    with pytest.raises(ValueError, match="a \\(4, 8\\)"):
        cs.skinny_product(a, b.half())
    with pytest.raises(ValueError, match="CUDA device"):
        cs.skinny_product(a, b)
    with pytest.raises(TypeError, match="tensors"):
        cs.skinny_product(a, None)
    # the registered backend: GPU-only, a clear refusal of CPU tensors
    with pytest.raises((ValueError, RuntimeError)):
        mm.matmul(a, b, backend="cuda_skinny")


# --------------------------------------------------------------------------- NVRTC (CPU)


@pytest.mark.parametrize(
    "config,kernel", cs.table_kernels(), ids=lambda v: v if isinstance(v, str) else type(v).__name__
)
def test_table_kernels_compile_for_sm80_and_sm90(config, kernel):
    if nvrtc_unavailable():
        pytest.skip(nvrtc_unavailable())
    mod = cs.module_for(config, kernel)
    for arch in ("sm_80", "sm_90"):
        ptx = mod.compile(arch, target="ptx").decode()
        assert f".entry {kernel}(" in ptx, arch
        assert ptx.count(".entry ") == 1  # one kernel per module (-DSK_ONE)
        assert ("mma.sync.aligned.m16n8k16" in ptx) == (config.kind not in ("rows", "cols"))
        assert ("cp.async" in ptx) == (config.kind == "tile")
        assert mod.compile(arch)[:4] == b"\x7fELF"


def _ptxas_log(config, kernel: str) -> str:
    """ptxas's verbose output for one TABLE module compiled for sm_90."""
    err, log = nvrtc_log(cs.SOURCE, cs.module_for(config, kernel).options, "sm_90")
    assert err == 0, log
    return log


@pytest.mark.parametrize(
    "config,kernel",
    [(c, k) for c, k in cs.table_kernels() if c.kind == "cols"],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_table_cols_kernels_fit_their_register_bound_without_spills(config, kernel):
    """blocks=2 caps the registers (__launch_bounds__): a later edit must not make it spill."""
    if nvrtc_unavailable():
        pytest.skip(nvrtc_unavailable())
    log = _ptxas_log(config, kernel)
    assert " 0 bytes spill stores, 0 bytes spill loads" in log, log
    regs = int(log.split("Used ")[1].split(" registers")[0])
    assert regs * config.threads * config.blocks <= 65536, log


def test_table_kernel_names_cover_both_dtypes_and_layouts():
    names = {k for _, k in cs.table_kernels()}
    for sfx in ("bf16", "f16"):
        assert {f"skinny_gemv_m8_{sfx}", f"skinny_tile_nt_{sfx}", f"skinny_tile_nn_{sfx}"} <= names


# --------------------------------------------------------------------------- GPU


def _operands(m, n, k, dtype, layout, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, generator=gen, device="cuda").to(dtype)
    w = (torch.randn(n, k, generator=gen, device="cuda") * k**-0.5).to(dtype)
    if layout == "nt":
        return a, w.t()
    if layout == "nn":
        return a, w.t().contiguous()
    if layout == "sliced":  # strides (2, 2 K): neither layout, packed by the launcher
        return a, torch.stack([w, w], 2).reshape(n, 2 * k)[:, ::2].t()
    # misaligned: a storage offset of one element (the shifted-load path)
    flat = torch.empty(n * k + 1, dtype=dtype, device="cuda")
    flat[1:].copy_(w.flatten())
    return a, flat[1:].view(n, k).t()


def _judge(y, a, b, dtype):
    ref = a.double() @ b.double()
    v = judge(y, ref, dtype, torch.matmul(a, b))
    assert v.ok, v.detail


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", HALF, ids=dtype_id)
def test_gpu_table_matches_float64(dtype):
    for m, (n, k), layout in itertools.product(
        [1, 3, 16, 17, 64, 128], [(4095, 4095), (3000, 5000), (64, 8192), (17, 4101)],
        ("nt", "nn", "sliced", "misaligned"),
    ):  # fmt: skip
        a, b = _operands(m, n, k, dtype, layout, seed_for(m, n, k, layout))
        y = cs.skinny_product(a, b)
        _judge(y, a, b, dtype)
        assert torch.equal(y, cs.skinny_product(a, b)), "split-K sum is not deterministic"


def _offset_view(t: torch.Tensor, off: int) -> torch.Tensor:
    """t's values in a fresh buffer that starts ``off`` elements past an aligned one."""
    flat = torch.zeros(t.numel() + off, dtype=t.dtype, device=t.device)
    flat[off:].copy_(t.flatten())
    return flat[off:].view(t.shape)


@pytest.mark.gpu
def test_gpu_unaligned_loads_every_offset_and_tail():
    """The vec == 0 path (sk_ld8_shift): x and the weight starting at each of the 8 half
    offsets into a 16-byte chunk, K and N tails of 1-9 halfs, in the gemv (M <= 8, nt)
    and tile kernels, split K or not."""
    gen = torch.Generator(device="cuda").manual_seed(11)
    for off, k, layout, m in itertools.product(
        range(8), [1, 2, 3, 7, 9, 15, 33, 199], ("nt", "nn"), [1, 8, 20]
    ):
        n = 37
        a = _offset_view(torch.randn(m, k, generator=gen, device="cuda").bfloat16(), (off + 3) % 8)
        w = torch.randn(n, k, generator=gen, device="cuda").bfloat16()
        b = _offset_view(w, off).t() if layout == "nt" else _offset_view(w.t().contiguous(), off)
        assert k == 1 or cs.weight_layout(b)[0] == layout  # (a size-1 K reads as nt)
        cfgs = [None] + [cs.RowsConfig(warps=2, chunks=1, rows=8, unroll=2)] * (
            (layout == "nt" or k == 1) and m <= 8
        )
        cfgs += [cs.ColsConfig(warps=3, chunks=1, unroll=2)] * (layout == "nn" and k > 1 and m <= 16)
        for cfg, splits in itertools.product(cfgs, (None, 2) if k >= 128 else (None,)):
            _judge(cs.skinny_product(a, b, cfg, splits), a, b, torch.bfloat16)


@pytest.mark.gpu
def test_gpu_cols_odd_row_strides_every_offset():
    """The cols kernel's odd row strides (sk_ld8_warp: one aligned chunk a lane, the chunk
    after it from the next lane, the last lane's own): N just below and past one and two
    warps' runs (256 and 512 halfs), the weight starting at each of the 8 half offsets, one
    and two runs a lane, split K or not."""
    gen = torch.Generator(device="cuda").manual_seed(13)
    cfgs = [cs.ColsConfig(warps=4, chunks=1, unroll=2), cs.ColsConfig(warps=8, chunks=2, unroll=4)]
    ns, ms = [255, 257, 511, 513, 4097], [1, 3, 8]
    for off, n, m, cfg, splits in itertools.product(range(8), ns, ms, cfgs, (None, 3)):
        if cfg.block_m(m) * cfg.chunks > 16:
            continue
        k = 301
        a = torch.randn(m, k, generator=gen, device="cuda").bfloat16()
        b = _offset_view(torch.randn(k, n, generator=gen, device="cuda").bfloat16(), off)
        assert cs.weight_layout(b)[0] == "nn"
        _judge(cs.skinny_product(a, b, cfg, splits), a, b, torch.bfloat16)


@pytest.mark.gpu
def test_gpu_every_kernel_shape_and_slice_count():
    cfgs = [
        cs.GemvConfig(warps=2, rows=2, unroll=2, kc=512),
        cs.TileConfig(bn=64, bm=8, bk=32, stages=2, wn=4, wm=1),  # an odd column group (ldmatrix x2)
        cs.TileConfig(bn=32, bm=48, bk=64, stages=3, wn=2, wm=2),  # 24-row warp tiles
        cs.RowsConfig(warps=3, chunks=1, rows=12, unroll=3),  # 1000 rows: a partial last group
        cs.RowsConfig(warps=2, chunks=4, rows=8, unroll=2),
        cs.ColsConfig(warps=3, chunks=1, unroll=3, kc=512),  # 3 warps: rows in uneven shares
        cs.ColsConfig(warps=8, chunks=2, unroll=4),
        cs.ColsConfig(warps=4, chunks=1, unroll=8),
    ]
    for cfg, m, splits, layout in itertools.product(cfgs, [1, 2, 5, 16, 40], [1, 3, 64], ("nt", "nn")):
        if cfg.kind == "cols":
            if layout == "nt" or m > 16 or cfg.block_m(m) * cfg.chunks > 16:
                continue
        elif cfg.kind != "tile" and (layout == "nn" or m > {"gemv": 16, "rows": 8}[cfg.kind]):
            continue
        if cfg.kind == "rows" and cfg.block_m(m) * cfg.chunks > 8:
            continue
        a, b = _operands(m, 1000, 3000, torch.bfloat16, layout, seed_for(m, splits, layout))
        _judge(cs.skinny_product(a, b, cfg, splits), a, b, torch.bfloat16)


@pytest.mark.gpu
def test_gpu_backend_gradients_and_epilogue():
    gen = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(16, 1024, generator=gen, device="cuda").bfloat16().requires_grad_()
    w = (torch.randn(2048, 1024, generator=gen, device="cuda") / 32).bfloat16().requires_grad_()
    bias = torch.randn(2048, generator=gen, device="cuda").bfloat16().requires_grad_()
    y = mm.matmul(x, w.t(), bias, "gelu", backend="cuda_skinny")
    dy = torch.randn(y.shape, generator=gen, device="cuda").bfloat16()
    got = torch.autograd.grad(y, (x, w, bias), dy)
    leaves64 = [t.detach().double().requires_grad_() for t in (x, w, bias)]
    y64 = mm.matmul_reference(leaves64[0], leaves64[1].t(), leaves64[2], "gelu")
    ref = torch.autograd.grad(y64, leaves64, dy.double())
    leaves = [t.detach().clone().requires_grad_() for t in (x, w, bias)]
    yt = mm.apply_epilogue(leaves[0] @ leaves[1].t(), leaves[2], "gelu")
    base = torch.autograd.grad(yt, leaves, dy)
    assert judge(y, y64, torch.bfloat16, yt).ok
    for g, r, t in zip(got, ref, base):
        v = judge(g, r, torch.bfloat16, t)
        assert v.ok, v.detail
