"""matmul's skinny Triton path (M <= 128, split-K): the kernels under the interpreter against
float64 at odd shapes, both weight layouts, bias and activations, one slice and several;
the config chooser's invariants; the routing; GPU runs at model shapes."""

from __future__ import annotations

import itertools

import pytest
import torch

import kernellab.ops.matmul as mm
from kernellab import triton_support
from kernellab.harness.compare import judge
from kernellab.ops.matmul import triton as tm
from kltest import dtype_id, seed_for

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _operands(m, n, k, dtype, layout, device="cpu", seed=0, bias=False):
    """a [M, K]; b [K, N] as a linear's weight.t() ("wt": unit stride along K) or contiguous
    ("kn": unit stride along N); bias [N] or None."""
    gen = torch.Generator(device=device).manual_seed(seed)
    a = torch.randn(m, k, generator=gen, device=device).to(dtype)
    if layout == "wt":
        b = torch.randn(n, k, generator=gen, device=device).to(dtype).t()
    else:
        b = torch.randn(k, n, generator=gen, device=device).to(dtype)
    c = torch.randn(n, generator=gen, device=device).to(dtype) if bias else None
    return a, b, c


def _check(y, a, b, bias, activation, dtype):
    ref = mm.matmul_reference(a.double(), b.double(), None if bias is None else bias.double(), activation)
    base = mm.apply_epilogue(torch.matmul(a, b), bias, activation)
    v = judge(y, ref, dtype, base)
    assert v.ok, v.detail


# Forced configs: one slice (epilogue in the first kernel) and several (the sum kernel).
ONE_SLICE = (32, 32, 1, 4, 1)
SLICES = (32, 32, 3, 4, 1)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("m", [1, 3, 16, 17, 64, 128])
def test_skinny_matches_float64(m, dtype):
    for layout, config in itertools.product(("wt", "kn"), (ONE_SLICE, SLICES)):
        a, b, _ = _operands(m, 200, 300, dtype, layout, seed=seed_for(m, layout, config))
        _check(tm.triton_skinny_fwd(a, b, config=config), a, b, None, None, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("activation", [None, "relu", "gelu"])
def test_skinny_bias_and_activation_odd_shape(activation, dtype):
    for layout, config in itertools.product(("wt", "kn"), (ONE_SLICE, SLICES, None)):
        a, b, bias = _operands(5, 65, 129, dtype, layout, seed=seed_for(activation, layout), bias=True)
        _check(tm.triton_skinny_fwd(a, b, bias, activation, config=config), a, b, bias, activation, dtype)


@pytest.mark.parametrize("layout", ["wt", "kn"])
def test_skinny_one_wave_tiles_under_the_interpreter(layout):
    """The one-wave launches' tiles (BLOCK_N x BLOCK_K of 64x256 and 256x64, one slice) with
    N and K off their multiples: the partial last K block and N tile give float64's answer."""
    for config in ((64, 256, 1, 4, 4), (256, 64, 1, 4, 4)):
        a, b, _ = _operands(3, 300, 600, torch.bfloat16, layout, seed=11)
        _check(tm.triton_skinny_fwd(a, b, config=config), a, b, None, None, torch.bfloat16)


@pytest.mark.parametrize("layout", ["wt", "kn"])
def test_skinny_long_k_slices_under_the_interpreter(layout):
    """A long K over a small output (MNIST's fc1, 64x128x3136) runs the config
    ``skinny_config`` gives it: 32-wide tiles, 128-deep blocks, 9 slices summed in order."""
    config = tm.skinny_config(64, 128, 3136, 132, 2)
    assert config[:3] == (32, 128, 9)
    a, b, _ = _operands(64, 128, 3136, torch.bfloat16, layout, seed=12)
    _check(tm.triton_skinny_fwd(a, b, config=config), a, b, None, None, torch.bfloat16)


def _empty_last_slice(kernel, m, layout, seed, activation, **consts):
    """``kernel`` over K = 129 in 32-blocks (5 blocks) as 4 slices of 2: the last has none
    and must store zeros into its partial (poisoned here), which the sum then adds."""
    n, k = 40, 129
    a, b, bias = _operands(m, n, k, torch.float32, layout, seed=seed, bias=True)
    w = torch.full((4, m, n), float("nan"))
    c = torch.full((m, n), float("nan"))
    args = (a, b, c, w, bias, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), n, 1)
    act = tm._ACT[activation]
    kernel[(2, 4)](*args, HAS_BIAS=True, ACT=act, SPLIT_K=4, BLOCK_N=32, BLOCK_K=32, **consts)
    assert torch.equal(w[3], torch.zeros(m, n))
    tm._split_sum_kernel[(1,)](w, c, bias, m * n, n, HAS_BIAS=True, ACT=act, SPLIT_K=4, BLOCK=512)
    _check(c, a, b, bias, activation, torch.float32)


def test_skinny_empty_slice_writes_zeros():
    _empty_last_slice(tm._skinny_kernel, 7, "wt", 3, "relu", PRECISION="ieee", UPCAST=False, BLOCK_M=16)


def test_fma_empty_slice_writes_zeros():
    # the FMA kernel's slices as _skinny_kernel's
    _empty_last_slice(tm._skinny_fma_kernel, 3, "kn", 6, "gelu", BLOCK_M=4, FLUSH=1)


def test_fma_path_taken_for_fp32_without_tf32():
    # fp32, M <= FMA_M_MAX: the FMA kernel (BLOCK_M the power of two at or above M, 1 for
    # M = 1); 16-bit operands and M past FMA_M_MAX: the tl.dot kernel
    def kernel(m, dtype, k=300):
        a, b, _ = _operands(m, 50, k, dtype, "wt")
        return tm._skinny_setup(a, b, False, None, None, None).main

    for m, bm in ((1, 1), (3, 4), (4, 4)):
        launch = kernel(m, torch.float32)
        assert launch.kernel is tm._skinny_fma_kernel and launch.kw["BLOCK_M"] == bm
    assert kernel(5, torch.float32).kernel is tm._skinny_kernel
    assert kernel(3, torch.bfloat16).kernel is tm._skinny_kernel
    # K steps past FLUSH (running sums added into the output's more than once), one row
    # and three, both layouts, one slice and several
    for m, layout in itertools.product((1, 3), ("kn", "wt")):
        a, b, _ = _operands(m, 50, 4000, torch.float32, layout, seed=seed_for(m, layout))
        for config in (None, ONE_SLICE, SLICES, (32, 8, 2, 4, 1)):
            _check(tm.triton_skinny_fwd(a, b, config=config), a, b, None, None, torch.float32)


def test_fma_one_row_against_n_inner_b_takes_the_wide_tile():
    """One row against a [K, N] row-major b: FMA_ROW_KN's 256 x 8 tile, with a bias and
    relu, matches float64 under the interpreter; the same b as W.t() keeps fma_config's."""
    a, b, bias = _operands(1, 300, 2000, torch.float32, "kn", seed=5, bias=True)
    plan = tm._skinny_setup(a, b, True, "relu", None, None)
    assert (plan.main.kw["BLOCK_N"], plan.main.kw["BLOCK_K"]) == tm.FMA_ROW_KN
    _check(plan(a, b, bias), a, b, bias, "relu", torch.float32)
    wt = b.t().contiguous().t()
    kw = tm._skinny_setup(a, wt, True, "relu", None, None).main.kw
    assert (kw["BLOCK_N"], kw["BLOCK_K"]) == tm.fma_config(1, 300, 2000, tm._SKINNY_CPU_SMS)[:2]


@pytest.mark.parametrize("n_sm", [132, 20])
def test_fma_config_invariants(n_sm):
    for m, (n, k) in itertools.product(range(1, tm.FMA_M_MAX + 1), SHAPES):
        for kn in (False, True):
            _fma_config_ok(m, n, k, n_sm, kn)
    # decode against a 64 MB fp32 weight: 33 tiles of 128, K in slices for ~4 waves
    assert tm.fma_config(1, 4097, 4095, 132) == (128, 32, 16, 4, tm.FMA_STAGES)
    assert tm.fma_config(4, 1024, 1024, 132)[2] == 1  # 4 MB: one launch
    # one row against an N-inner b: FMA_ROW_KN's wide, short tiles (more rows: as before)
    assert tm.fma_config(1, 4097, 4095, 132, True) == (256, 8, 32, 4, tm.FMA_STAGES)
    assert tm.fma_config(1, 50, 70000, 132, True)[:2] == (64, 32)  # N tile cut to N
    assert tm.fma_config(2, 4097, 4095, 132, True) == tm.fma_config(2, 4097, 4095, 132)


def _fma_config_ok(m, n, k, n_sm, kn):
    bn, bk, split, warps, stages = cfg = tm.fma_config(m, n, k, n_sm, kn)
    bm = triton_support.next_pow2(m)
    where = (m, n, k, n_sm, kn, cfg)
    assert bm * bk * bn <= tm.FMA_TERMS * 32 * warps, where  # the sums a thread holds
    assert bk <= max(1, triton_support.next_pow2(k)) and bn in (32, 64, 128, 256), where
    kb = triton_support.cdiv(k, bk)
    per = triton_support.cdiv(kb, split)
    assert (split - 1) * per < kb, where  # no empty slice
    assert split == 1 or per >= tm.FMA_MIN_STEPS, where
    assert split * m * n * 8 <= max(n * k, 1 << 21) or split == 1, where


def test_skinny_layouts_and_leading_dims():
    a, b, _ = _operands(7, 40, 129, torch.float32, "wt", seed=4)
    # leading dims of size 1; a wider N tile than N; BLOCK_K past K
    y = tm.triton_skinny_fwd(a[None], b[None], config=(64, 64, 1, 4, 1))
    assert y.shape == (1, 7, 40)
    _check(y[0], a, b, None, None, torch.float32)
    # sliced a (row stride 2 K) and a weight with a storage offset
    big = torch.randn(9, 2 * 129)
    wt = torch.randn(41 * 129 + 1)[1:].view(41, 129)[1:].t()
    _check(tm.triton_skinny_fwd(big[:, ::2], wt, config=SLICES), big[:, ::2], wt, None, None, torch.float32)
    # K = 0: the epilogue of zeros
    bias = torch.randn(40)
    y = tm.triton_skinny_fwd(torch.empty(3, 0), torch.empty(0, 40), bias, "relu")
    assert torch.equal(y, torch.relu(bias).expand(3, 40))


def test_skinny_default_cpu_config_splits():
    # the interpreter's default: 32 x 32 tiles, slices as for 4 SMs: a long K is split
    m, n, k = 3, 40, 600
    assert tm._skinny_splits(m, n, k, 32, 32, tm._SKINNY_CPU_SMS, 4) > 1
    a, b, _ = _operands(m, n, k, torch.float32, "wt", seed=5)
    y1 = tm.triton_skinny_fwd(a, b)
    _check(y1, a, b, None, None, torch.float32)
    assert torch.equal(y1, tm.triton_skinny_fwd(a, b))  # slices summed in a fixed order


def test_skinny_refuses_what_it_does_not_take():
    a, b, _ = _operands(129, 8, 8, torch.float32, "kn")
    with pytest.raises(ValueError, match="1 to 128 rows"):
        tm.triton_skinny_fwd(a, b)
    with pytest.raises(ValueError, match="one product"):
        tm.triton_skinny_fwd(torch.randn(2, 3, 8), torch.randn(2, 8, 8))


def test_skinny_routing():
    def applies(shape_a, shape_b):
        return tm.skinny_applies(torch.empty(shape_a, device="meta"), torch.empty(shape_b, device="meta"))

    assert applies((1, 4096), (4096, 14336))
    assert applies((128, 768), (768, 50257))
    assert applies((1, 16, 1024), (1, 1024, 1024))  # one product with a leading dim
    assert not applies((129, 4096), (4096, 4096))  # too many rows: the tiled kernel
    assert not applies((16, 512), (512, 1024))  # N K < 2^20: launch-bound either way
    assert applies((64, 3136), (3136, 128))  # MNIST's fc1: a long K over two 64x64 tiles
    assert tm.skinny_config(64, 128, 3136, 132, 2) == (32, 128, 9, 4, 4)  # 9 slices of 3 blocks
    assert not applies((64, 128), (128, 3136))  # its input gradient: a short K
    assert not applies((128, 2048), (2048, 256))  # 8 tiles of 64x64: the tiled kernel
    assert not applies((2, 16, 1024), (2, 1024, 1024))  # a batch
    assert not applies((0, 4096), (4096, 4096))


# --------------------------------------------------------------------------- the chooser

SHAPES = [(14336, 4096), (4096, 14336), (4096, 4096), (50257, 768), (128256, 2048), (3072, 768), (1024, 1024)]
SHAPES += [(128, 8192), (8192, 128), (1000, 1048577 // 1000 + 1), (65, 20000), (128, 3136), (10, 4096)]


@pytest.mark.parametrize("elem", [2, 4])
@pytest.mark.parametrize("n_sm", [108, 132, 20])
def test_skinny_config_invariants(n_sm, elem):
    for m, (n, k) in itertools.product([1, 2, 7, 16, 17, 32, 64, 100, 128], SHAPES):
        bn, bk, split, warps, stages = cfg = tm.skinny_config(m, n, k, n_sm, elem)
        bm = tm.skinny_block_m(m)
        where = (m, n, k, n_sm, elem, cfg)
        assert bm >= m and bm in (16, 32, 64, 128), where
        assert bn in (32, 64, 128, 256) and bk in (16, 32, 64, 128, 256), where
        assert warps in (4, 8) and 2 <= stages <= 4, where
        one_wave = bm <= 32 and elem == 2 and n * k * elem >= tm.SKINNY_SPLIT_MIN_BYTES
        one_wave = one_wave and triton_support.cdiv(n, 32 if m >= 16 else 64) >= tm.ONE_WAVE_FILL * n_sm
        if one_wave:  # no split, N tiles for most of a wave, ~ONE_WAVE_TILE weight elements a step
            assert split == 1 and triton_support.cdiv(n, bn) >= tm.ONE_WAVE_FILL * n_sm, where
            assert bn >= 64 or m >= 16, where
            assert bn * bk == tm.ONE_WAVE_TILE or bk == 256 or bk == triton_support.next_pow2(k), where
            assert (bm * bk + bk * bn) * elem * stages <= tm.ONE_WAVE_SMEM, where
            continue
        if n * k * elem < tm.SKINNY_SPLIT_MIN_BYTES and tm.long_k_small_output(m, n, k):
            # a small weight under a long K: 32-wide tiles, K slices of two blocks or more
            kb = triton_support.cdiv(k, bk)
            per = triton_support.cdiv(kb, split)
            assert (bn, bk) == (32, 256 // elem) and (split - 1) * per < kb, where
            assert per >= tm.SKINNY_MIN_K_BLOCKS and 1 < split <= tm.SKINNY_SPLIT_MAX, where
            assert triton_support.cdiv(n, bn) * split <= tm.SKINNY_WAVES * n_sm, where
            assert (bm * bk + bk * bn) * elem * stages <= tm.SKINNY_SMEM, where
            continue
        assert bn <= 128 and bk <= 128, where
        assert (bm * bk + bk * bn) * elem * stages <= tm.SKINNY_SMEM, where
        # slices: each a whole number of BLOCK_K, none empty, none shorter than the minimum
        kb = triton_support.cdiv(k, bk)
        per = triton_support.cdiv(kb, split)
        assert 1 <= split <= tm.SKINNY_SPLIT_MAX and (split - 1) * per < kb, where
        if split > 1:
            assert per >= tm.SKINNY_MIN_K_BLOCKS, where
            assert 32 * m * split <= k * elem, where  # partials: <= 1/4 of the weight's bytes
            assert n * k * elem >= tm.SKINNY_SPLIT_MIN_BYTES, where
        # enough programs (the waves wanted, within a third: slices are whole numbers of
        # blocks), unless the split cap is reached or the weight is small; at most ~4 waves
        programs = triton_support.cdiv(n, bn) * split
        cap = tm._skinny_split_cap(m, k, kb, elem)
        small = n * k * elem < tm.SKINNY_SPLIT_MIN_BYTES
        target = tm.SKINNY_WAVES * n_sm
        assert 3 * programs >= 2 * target or split >= cap // 2 or small, where
        if split > 1:
            assert programs <= target + triton_support.cdiv(n, bn), where


def test_skinny_config_examples():
    # decode against Llama-3-8B's down projection (K = 14336) on an H100: at M = 16, one
    # wave of 128 programs 32 columns wide, no split; at M = 1 (and in fp32) 32 N tiles x 9
    # slices; the LM head has N tiles for 7 waves and takes no split
    assert tm.skinny_config(16, 4096, 14336, 132, 2)[:3] == (32, 256, 1)
    assert tm.skinny_config(1, 4096, 14336, 132, 2)[:3] == (128, 128, 9)
    assert tm.skinny_config(1, 4096, 14336, 132, 4)[:3] == (128, 64, 9)
    assert tm.skinny_config(1, 6144, 4096, 132, 2)[:3] == (64, 256, 1)
    assert tm.skinny_config(8, 28672, 4096, 132, 2)[:3] == (256, 64, 1)  # 112 programs
    assert tm.skinny_config(1, 128256, 2048, 132, 2)[:3] == (128, 128, 1)
    assert tm.skinny_config(64, 4096, 4096, 132, 2)[2] > 1  # M > 32: the split heuristic
    assert tm.skinny_config(128, 4096, 4096, 132, 2)[2] <= 2  # the partials cost M N bytes
    assert tm.skinny_config(1, 3072, 768, 132, 2)[2] == 1  # 4.7 MB: one launch


def test_skinny_candidates_and_pruning():
    for m, (n, k), elem in itertools.product([1, 16, 64, 128], SHAPES, [2, 4]):
        cands = tm.skinny_candidates(m, n, k, 132, elem)
        assert cands[0] == tm.skinny_config(m, n, k, 132, elem)
        assert 1 <= len(cands) <= 12 and len(set(cands)) == len(cands)
        assert len({c[2] for c in cands}) == 1  # SPLIT_K is the heuristic's
        a = torch.empty(m, k, dtype=torch.float16 if elem == 2 else torch.float32)
        kept = tm.skinny_prune(tm._skinny_tuned.configs, {"a_ptr": a, "M": m, "N": n, "K": k}, BLOCK_M=16)
        first = kept[0]
        bn, bk, _, w, st = cands[0]
        assert (first.kwargs["BLOCK_N"], first.kwargs["BLOCK_K"], first.num_warps, first.num_stages) == (
            bn,
            bk,
            w,
            st,
        )
        assert len(kept) <= 12
    assert list(tm._skinny_tuned.keys) == ["N", "K", "BLOCK_M", "SPLIT_K", "PRECISION"]


# --------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_gpu_skinny_matches_float64(dtype):
    shapes = [(4096, 1024), (1000, 1100), (128, 3136)]  # the last: long-K slices with config None
    for m, (n, k), layout in itertools.product([1, 7, 16, 33, 128], shapes, ("wt", "kn")):
        a, b, bias = _operands(m, n, k, dtype, layout, "cuda", seed=seed_for(m, n, layout), bias=True)
        for config in (None, (128, 64, 1, 4, 3), (64, 64, 4, 4, 3)):
            y = tm.triton_skinny_fwd(a, b, bias, "gelu", config=config, tune=False)
            _check(y, a, b, bias, "gelu", dtype)
            assert torch.equal(y, tm.triton_skinny_fwd(a, b, bias, "gelu", config=config, tune=False))


@pytest.mark.gpu
def test_gpu_skinny_routed_with_gradients():
    # [16, 1024] @ W.t(), W [2048, 1024]: the forward and da = dz @ W take the skinny path
    gen = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(16, 1024, generator=gen, device="cuda").bfloat16().requires_grad_()
    w = torch.randn(2048, 1024, generator=gen, device="cuda").bfloat16().requires_grad_()
    assert tm.skinny_applies(x, w.t())
    y = mm.matmul(x, w.t(), backend="triton")
    dy = torch.randn(y.shape, generator=gen, device="cuda").bfloat16()
    got = torch.autograd.grad(y, (x, w), dy)
    x64, w64 = x.double().detach().requires_grad_(), w.double().detach().requires_grad_()
    ref = torch.autograd.grad(x64 @ w64.t(), (x64, w64), dy.double())
    xt, wt = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    base = torch.autograd.grad(xt @ wt.t(), (xt, wt), dy)
    assert judge(y, x64 @ w64.t(), torch.bfloat16, x @ w.t()).ok
    for g, r, t in zip(got, ref, base):
        v = judge(g, r, torch.bfloat16, t)
        assert v.ok, v.detail


@pytest.mark.gpu
def test_gpu_skinny_under_torch_compile():
    # the triton_op traces the skinny launcher: both kernels (split K)
    gen = torch.Generator(device="cuda").manual_seed(2)
    w = torch.randn(2048, 4096, generator=gen, device="cuda").bfloat16()
    bias = torch.randn(2048, generator=gen, device="cuda").bfloat16()
    f = torch.compile(lambda x: mm.matmul(x, w.t(), bias, "gelu", backend="triton"), fullgraph=True)
    for m in (1, 16):
        x = torch.randn(m, 4096, generator=gen, device="cuda").bfloat16()
        assert tm.skinny_config(m, 2048, 4096, triton_support.sm_count(0), 2)[2] > 1
        _check(f(x), x, w.t(), bias, "gelu", torch.bfloat16)
