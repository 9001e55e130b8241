"""attention: every backend against the float64 reference (2x PyTorch's error), forward
and the three gradients; odd sequence lengths, S_q != S_k both ways, causal and not,
non-contiguous q/k/v and grad_output; bad input; reruns bitwise equal; the saved LSE;
torch.compile(fullgraph=True) over the Triton custom op.

CPU: small shapes (the Triton interpreter runs one program after another). GPU (marked
``gpu``): the issue's sequence lengths and head dims, every backend including the SDPA
peers and cuda_v1."""

from __future__ import annotations

import math

import pytest
import torch

import kernellab
import kernellab.ops.attention as A  # registers the op and its backends
from kernellab.harness.compare import judge
from kernellab.ops.attention import args as AA
from kernellab.ops.attention import cuda_sm90
from kltest import cpu_backends, cuda_backends, dtype_id, seed_for

SPEC = kernellab.get_spec("attention")


@pytest.fixture(autouse=True, scope="module")
def _no_autotuning():
    # Hundreds of (length, head dim, dtype, causal) keys here: tune none of them (each
    # tuned key compiles and times every candidate tile); the benchmark script tunes.
    from kernellab.options import config

    with config.override(attn_autotune=False):
        yield


DTYPES = [torch.float32, torch.float16, torch.bfloat16]
CPU_BACKENDS = cpu_backends("attention")  # manual, torch, tiled, triton (interpreted)
GPU_BACKENDS = cuda_backends("attention")  # + the SDPA peers and cuda_v1
# cuda_v2 .. v7 (attention_sm90.cu), v8 and v9 (its backward in CUDA) and cuda (the fastest of them)
SM90_BACKENDS = tuple(f"cuda_{v}" for v in cuda_sm90.VARIANTS) + ("cuda_v8", "cuda_v9", "cuda")


def _supported(backend, dtype, shape, causal) -> str | None:
    """Why ``backend`` refuses this case by design (None: it must compute it)."""
    lead, lead_kv, s_q, s_k, d = A.parse_gqa(shape)
    if backend == "cuda_v1":
        if dtype != torch.float32:
            return "cuda_v1 is fp32 only"
        if d not in (16, 32, 64, 128):
            return "cuda_v1 head dims 16..128"
        if lead != lead_kv:
            return "cuda_v1 takes no GQA"
    if backend == "triton" and (d % 8 or d > 256):
        return "triton head dims: multiples of 8 up to 256"
    if backend in SM90_BACKENDS:  # Hopper (test_attention_sm90.py): 16-bit
        impl = kernellab.registry.get("attention", backend)
        if dtype not in impl.dtypes:
            return f"{backend} is fp16 / bf16 only"
        q = torch.empty(lead + (s_q, d), dtype=dtype, device="meta")
        k = torch.empty(lead_kv + (s_k, d), dtype=dtype, device="meta")
        return impl.outside_limits((q, k, k), {"causal": causal})
    if backend.startswith("sdpa_"):
        # The peer's declared limits (what it refuses; test_peer_limits_are_refused_clearly).
        q = torch.empty(lead + (s_q, d), dtype=dtype, device="meta")
        k = torch.empty(lead_kv + (s_k, d), dtype=dtype, device="meta")
        return kernellab.registry.get("attention", backend).outside_limits((q, k, k), {"causal": causal})
    return None


def _differentiable(backend) -> bool:
    return getattr(kernellab.registry.get("attention", backend).fn, "differentiable", True) is not False


def _check_case(
    backend, shape, dtype, device, causal, layout="contiguous", strided_dy=False, grads=True, **options
):
    why = _supported(backend, dtype, shape, causal)
    if why:
        pytest.skip(why)
    seed = seed_for(backend, shape, dtype, causal, layout, *([str(options)] if options else []))
    args = SPEC.make_inputs(shape, dtype, device, seed, layout)
    if args is None:
        pytest.skip(f"layout {layout} does not apply to {shape}")
    opts = {"causal": causal, **options}
    # float64 reference: output and gradients
    a64 = [a.detach().double().requires_grad_() for a in args]
    ref = SPEC.reference(*a64, **opts)
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    if strided_dy:
        dy = torch.randn(ref.shape[:-1] + (2 * ref.shape[-1],), generator=gen, device=device).to(dtype)[
            ..., ::2
        ]
    else:
        dy = torch.randn(ref.shape, generator=gen, device=device).to(dtype)
    ref_g = torch.autograd.grad(ref, a64, dy.double())

    def run(b, with_grads):
        leaves = [a.detach().clone().requires_grad_(with_grads) for a in args]
        out = A.attention(*leaves, backend=b, **opts)
        if not with_grads:
            return (out,)
        return (out,) + torch.autograd.grad(out, leaves, dy)

    with_grads = grads and _differentiable(backend)
    base = run("torch", with_grads)
    got = run(backend, with_grads)
    for name, g, r, b in zip(("o", "dq", "dk", "dv"), got, (ref,) + ref_g, base):
        v = judge(g, r, dtype, b)
        assert v.ok, f"{name}: {v.detail} (err {v.err:.3g}, bound {v.bound:.3g})"


# --------------------------------------------------------------------------- CPU

CPU_SHAPES = [
    (1, 1, 1, 1, 16),  # one query, one key
    (2, 17, 32),  # 3-D (B, S, D)
    (1, 2, 45, 70, 64),  # S_q < S_k
    (1, 2, 70, 45, 32),  # S_q > S_k: causal leaves 25 rows without a key
    (1, 1, 127, 113, 16),
]


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
@pytest.mark.parametrize("shape", CPU_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_cpu_forward_and_grads(backend, dtype, shape, causal, request):
    if backend == "manual" and dtype == torch.float32:
        # Measured over 24 seeds at 127x113: the naive fp32 PV / P^T dO matmuls have 1.0-1.2x
        # the allowed error in ~1 case in 5 (torch's CPU SDPA is a blocked flash kernel with
        # a smaller error). Reported, not hidden: non-strict xfail for manual in fp32 only.
        request.applymarker(
            pytest.mark.xfail(reason="naive fp32 manual: dv/dk near 2x torch's CPU error", strict=False)
        )
    _check_case(backend, shape, dtype, "cpu", causal)


@pytest.mark.parametrize("backend", ["tiled", "triton"])
def test_cpu_fp16(backend):
    _check_case(backend, (1, 2, 33, 50, 32), torch.float16, "cpu", True)


@pytest.mark.parametrize("backend", ["tiled", "triton", "manual"])
@pytest.mark.parametrize("layout", ["transposed", "sliced", "offset", "expanded"])
def test_cpu_noncontiguous(backend, layout):
    # q, k, v all in the layout, and a strided grad_output.
    _check_case(backend, (1, 2, 37, 29, 32), torch.float32, "cpu", True, layout=layout, strided_dy=True)


@pytest.mark.parametrize(
    "s_q,s_k",
    [(1, 16), (16, 1), (31, 33), (33, 31), (48, 16), (16, 48), (32, 32)],
)
def test_cpu_triton_tile_edges(s_q, s_k):
    # Lengths around the interpreter's tiles (BLOCK_M 32, BLOCK_N 16; dK/dV 16 x 32).
    for causal in (False, True):
        _check_case("triton", (1, 1, s_q, s_k, 16), torch.float32, "cpu", causal)
    if s_k == 1:
        # Every row's P is exactly 1, so dS = P (dP - delta) = 0 and dq = 0 exactly, as
        # torch's softmax backward gives: fp32 delta is rowsum(P * dP) of the same P and
        # dP (from rowsum(dO * O), summed in another order, it left a few ulps of |dO.v|).
        q, k, v = (t.requires_grad_() for t in SPEC.make_inputs((1, 1, s_q, 1, 16), torch.float32, "cpu", 4))
        o = A.attention(q, k, v, backend="triton")
        do = torch.randn(o.shape, generator=torch.Generator().manual_seed(s_q))
        dq, dk, dv = torch.autograd.grad(o, (q, k, v), do)
        assert (dq == 0).all() and (dk == 0).all()
        torch.testing.assert_close(dv, do.sum(-2, keepdim=True), rtol=1e-5, atol=1e-6)


def test_cpu_triton_fp32_one_key_rows_and_exact_stats():
    """A window (0, -1) under causal: each query sees only its own key, PyTorch's dq is
    exactly 0 and so is ours: the fp32 backward recomputes the exact row statistics (row
    max, log2 l) rather than reading the rounded lse. With ``exact_stats=False`` (ring
    attention's merged lse) the backward uses the lse as given: the same gradients within
    fp32 rounding, and a wrong lse then gives wrong gradients (the flag is honoured). An
    lse of any shape but q.shape[:-1] (the old two-plane (..., 2, S_q) form too) is
    refused by name."""
    from kernellab.ops.attention import triton as at

    q, k, v = SPEC.make_inputs((1, 2, 37, 40), torch.float32, "cpu", 5)
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(6))
    o, lse = at.forward(q, k, v, True, 0.103, 0, -1)
    assert lse.shape == q.shape[:-1]
    dq, dk, dv = at.backward(do, q, k, v, o, lse, True, 0.103, 0, -1)
    assert (dq == 0).all() and (dk == 0).all()
    torch.testing.assert_close(dv, do, rtol=0, atol=0)  # P = 1: dv = dO exactly
    q, k, v = SPEC.make_inputs((1, 2, 37, 45, 40), torch.float32, "cpu", 7)
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(8))
    o, lse = at.forward(q, k, v, False, 0.2)
    exact = at.backward(do, q, k, v, o, lse, False, 0.2)
    given = at.backward_into(do, q, k, v, o, lse, False, 0.2, None, None, None, exact_stats=False)
    for a, b in zip(exact, given):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    off = at.backward_into(do, q, k, v, o, lse + 1.0, False, 0.2, None, None, None, exact_stats=False)
    assert (off[2] - exact[2]).abs().max() > 0.1  # P halved: dv off by half
    for bad in (lse[..., :-1], torch.stack([lse, lse], -2), lse.double(), lse.transpose(-1, -2)):
        with pytest.raises(ValueError, match=r"lse must be a contiguous fp32 tensor of shape \(1, 2, 37\)"):
            at.backward(do, q, k, v, o, bad, False, 0.2)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_triton_backward_reads_the_lse_in_16_bit_and_recomputes_it_in_fp32(dtype):
    """fp32's backward recomputes the row statistics from q and k (the forward kernel in
    STATS mode) and does not read the saved lse: an lse off by one gives the very same
    gradients. fp16 / bf16 read it (their path is unchanged, no extra pass): the same lse
    off by one halves every P."""
    from kernellab.ops.attention import triton as at

    q, k, v = SPEC.make_inputs((1, 2, 19, 23, 16), dtype, "cpu", 3)
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(4)).to(dtype)
    o, lse = at.forward(q, k, v, True, 0.25)
    good = at.backward(do, q, k, v, o, lse, True, 0.25)
    off = at.backward(do, q, k, v, o, lse + 1.0, True, 0.25)
    if dtype == torch.float32:
        for a, b in zip(good, off):
            assert torch.equal(a, b)
    else:
        assert (off[2].float() - good[2].float()).abs().max() > 0.1


# GQA / MQA: k and v with H_q / H_kv = 1, 2, 4 times fewer heads than q; odd lengths both
# ways; every gradient against the float64 reference (whose k/v are expanded, so its dk, dv
# sum over each group through autograd).
GQA_SHAPES = [
    (1, 2, 2, 17, 33, 16),  # group 1 written in the GQA form
    (2, 4, 2, 33, 17, 32),  # group 2, S_q > S_k (causal: 16 rows without a key)
    (1, 4, 1, 17, 17, 16),  # MQA: group 4, one k/v head
]


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("shape", GQA_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_cpu_gqa_forward_and_grads(backend, shape, causal):
    _check_case(backend, shape, torch.float32, "cpu", causal)


@pytest.mark.parametrize("backend", ["triton", "tiled"])
def test_cpu_gqa_bf16_and_layouts(backend):
    _check_case(backend, (1, 4, 2, 17, 33, 16), torch.bfloat16, "cpu", True)
    shape = (1, 4, 2, 33, 17, 16)
    _check_case(backend, shape, torch.float32, "cpu", True, layout="transposed", strided_dy=True)


def test_triton_gqa_reads_kv_in_place_and_matches_expanded_kv():
    """Triton's GQA equals attention over k/v expanded by repeat_interleave (the same
    kernels, group 1) exactly in the forward, and dk/dv equal the expanded gradients summed
    over each group (up to fp32 summation order); no copy of k/v is made: k and v keep
    H_kv heads in the saved tensors."""
    q, k, v = (t.requires_grad_() for t in SPEC.make_inputs((2, 6, 2, 19, 23, 16), torch.float32, "cpu", 3))
    o = A.attention(q, k, v, causal=True, backend="triton")
    saved = o.grad_fn.saved_tensors
    assert saved[1].shape == k.shape and saved[2].shape == v.shape
    ke, ve = (t.detach().repeat_interleave(3, dim=1).requires_grad_() for t in (k, v))
    qe = q.detach().clone().requires_grad_()
    oe = A.attention(qe, ke, ve, causal=True, backend="triton")
    assert torch.equal(o, oe)
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(4))
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), do)
    dqe, dke, dve = torch.autograd.grad(oe, (qe, ke, ve), do)
    assert torch.equal(dq, dqe)
    torch.testing.assert_close(dk, dke.unflatten(1, (2, 3)).sum(2), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dv, dve.unflatten(1, (2, 3)).sum(2), rtol=1e-5, atol=1e-6)
    # deterministic: the group is summed in one program, in one order
    dq2, dk2, dv2 = torch.autograd.grad(A.attention(q, k, v, causal=True, backend="triton"), (q, k, v), do)
    assert torch.equal(dk, dk2) and torch.equal(dv, dv2)


def test_gqa_refused_where_a_backend_has_none():
    """sdpa_efficient (no GQA in torch's constraints for it) declares the refusal, naming
    k/v heads; check counts it refused. cuda_v1 refuses in its own body (GPU tests)."""
    q, k, v = SPEC.make_inputs((1, 4, 2, 9, 9, 64), torch.bfloat16, "cpu", 0)
    q, k, v = (t.to("meta") for t in (q, k, v))
    why = kernellab.registry.get("attention", "sdpa_efficient").outside_limits((q, k, v), {})
    assert why and "k/v have 2 heads" in why and "q has 4" in why
    for peer in ("sdpa_flash", "sdpa_cudnn"):
        assert kernellab.registry.get("attention", peer).outside_limits((q, k, v), {}) is None


# Head dims: any multiple of 8 up to 256 for Triton (tiles padded to a power of two >= 16,
# masked). On the interpreter a sample with every padding case: 8 (-> 16: below tl.dot's
# minimum), 24, 40, 80, 96 (-> 128), 136 (-> 256: the wide-tile pruning), 256 (no padding);
# the full sweep 8..256 runs on the GPU (test_gpu_head_dim_sweep).
CPU_HEAD_DIMS = [8, 24, 40, 80, 96, 136, 256]


@pytest.mark.parametrize("d", CPU_HEAD_DIMS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_cpu_triton_head_dims(d, causal):
    _check_case("triton", (1, 2, 17, 33, d), torch.float32, "cpu", causal)
    if d in (40, 96):  # GQA, S_q > S_k, 16-bit storage with padding together
        _check_case("triton", (1, 4, 2, 33, 17, d), torch.bfloat16, "cpu", causal)


def test_cpu_triton_padded_head_dim_layouts():
    # padded D with q, k, v transposed / sliced (head-dim stride != 1) and a strided dO
    for layout in ("transposed", "sliced"):
        _check_case("triton", (1, 2, 37, 29, 40), torch.float32, "cpu", True, layout=layout, strided_dy=True)


def test_cpu_triton_padded_columns_never_written():
    """o, dq, dk, dv of a padded head dim are written through masks: a view of a wider
    buffer keeps its columns past D untouched (NaN stays NaN)."""
    from kernellab.ops.attention import triton as at

    q, k, v = SPEC.make_inputs((1, 2, 21, 19, 24), torch.float32, "cpu", 6)
    o_buf = torch.full((1, 2, 21, 32), float("nan"))
    o, lse = at.forward_into(q, k, v, True, 0.2, o_buf[..., :24])
    assert torch.isnan(o_buf[..., 24:]).all() and torch.isfinite(o).all()
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(2))
    bufs = [torch.full(t.shape[:-1] + (32,), float("nan")) for t in (q, k, v)]
    at.backward_into(do, q, k, v, o, lse, True, 0.2, *(b[..., :24] for b in bufs))
    for b in bufs:
        assert torch.isnan(b[..., 24:]).all() and torch.isfinite(b[..., :24]).all()


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def test_head_dim_tiles_cover_d_in_fewer_columns_than_one_padded_tile():
    """_d_tiles, the rule: fp32 (or split=False) takes one power-of-two tile; 16-bit takes
    two, the largest power of two below D and the rest rounded up to a power of two >= 16,
    exactly where they cover D in fewer columns than the one padded tile, whose columns
    every dot, shared-memory tile and accumulator pays for."""
    from kernellab.ops.attention import triton as at
    from kernellab.triton_support import next_pow2

    for d in at.HEAD_DIMS:
        full = at._block_d(d)
        assert at._d_tiles(d, torch.float32) == (full, 0)
        for dtype in (torch.float16, torch.bfloat16):
            assert at._d_tiles(d, dtype, split=False) == (full, 0)
            bd, bd2 = at._d_tiles(d, dtype)
            two = (full // 2, max(16, next_pow2(d - full // 2)))
            if d > 16 and two[0] >= 16 and sum(two) == d < full:
                assert (bd, bd2) == two, d
                # both tiles hold real columns only: no mask over D
                assert _pow2(bd) and _pow2(bd2) and bd2 >= 16 and bd < d == bd + bd2 < full, d
            else:
                assert (bd, bd2) == (full, 0), d
    tiles = {d: at._d_tiles(d, torch.bfloat16) for d in (64, 72, 80, 96, 112, 128, 160, 192, 256)}
    assert tiles == {64: (64, 0), 72: (128, 0), 80: (64, 16), 96: (64, 32), 112: (128, 0), 128: (128, 0),
                     160: (128, 32), 192: (128, 64), 256: (256, 0)}  # fmt: skip


def test_tile_pruning_judges_the_tiled_head_dim():
    """_fit judges shared memory at BLOCK_D + BLOCK_D2: 16-bit D = 80 (64 + 16) keeps the
    configs D = 64 and D = 128 keep; D = 160 (128 + 32), wider than 128, keeps the small
    tiles D = 256 keeps, as its one padded 256-wide tile did."""
    from kernellab.ops.attention import triton as at

    def kept(configs, **tiles):
        nargs = {"Q": torch.empty(1, dtype=torch.bfloat16), "S_Q_KEY": 64, "S_K_KEY": 64}
        return [(c.kwargs, c.num_warps, c.num_stages) for c in at._fit(configs, nargs, **tiles)]

    for configs in (at.fwd_configs(), at.bwd_dkdv_configs(), at.bwd_dq_configs()):
        narrow = kept(configs, BLOCK_D=128, BLOCK_D2=0)
        assert kept(configs, BLOCK_D=64, BLOCK_D2=16) == narrow == kept(configs, BLOCK_D=64, BLOCK_D2=0)
        wide = kept(configs, BLOCK_D=256, BLOCK_D2=0)
        assert kept(configs, BLOCK_D=128, BLOCK_D2=32) == wide and len(wide) < len(narrow)


def _launch_spec(kernel: str, d: int, tiles, cfg) -> dict:
    """compile_for_sm90's arguments for one of attention's kernels as a contiguous bf16
    causal launch at head dim d with the given (BLOCK_D, BLOCK_D2) and triton.Config."""
    from kernellab.ops.attention import triton as at

    fn = getattr(at, kernel).fn
    sig, cx = {}, {}
    for n in fn.arg_names:
        if n in ("LSE", "DELTA"):
            sig[n] = "*fp32"
        elif n in ("Q", "K", "V", "O", "DO", "DQ", "DK", "DV"):
            sig[n] = "*bf16"
        elif n in ("qk_scale", "sm_scale", "cap_in", "cap_out"):
            sig[n] = "fp32"
        elif n.startswith("stride_") and n.endswith("d"):
            sig[n], cx[n] = "constexpr", 1
        else:
            sig[n] = "i32"
    cx.update(HEAD_D=d, BLOCK_D=tiles[0], BLOCK_D2=tiles[1], CAUSAL=True, PREC="tf32", F32_DOTS=False,
              WINDOW=False, SOFTCAP=0, GQA=False, RAW_M=False, **cfg.kwargs)  # fmt: skip
    cx.update({k: False for k in ("STATS", "DELTA_ONLY") if k in fn.arg_names})
    sig.update({k: "constexpr" for k in cx})
    aligned = [i for i, n in enumerate(fn.arg_names) if sig[n] != "constexpr"]  # sizes too, as at 2048
    options = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    return {"kernel": f"kernellab.ops.attention.triton.{kernel}", "signature": sig, "constexprs": cx,
            "options": options, "aligned_args": aligned}  # fmt: skip


def test_two_tile_head_dim_compiles_for_sm90_smaller_than_the_padded_tile():
    """No GPU needed: at D = 80 the forward, dK/dV and dQ kernels with their first configs
    (what problems too short to tune take) compile for sm_90 with the 64 + 16 tiles to
    wgmma, without local memory, in less shared memory and no more registers than with one
    padded 128-wide tile; and the 64 x 128 dK/dV tile (8 warps), which spills at 128 wide,
    fits in registers."""
    from kernellab.ops.attention import triton as at
    from kltest import sm90_resources

    firsts = {"_attn_fwd": at.fwd_configs()[0], "_attn_bwd_dkdv": at.bwd_dkdv_configs()[0],
              "_attn_bwd_dq": at.bwd_dq_configs()[0]}  # fmt: skip
    two, one = at._d_tiles(80, torch.bfloat16), at._d_tiles(80, torch.bfloat16, split=False)
    assert two == (64, 16) and one == (128, 0)
    specs = [_launch_spec(k, 80, t, c) for k, c in firsts.items() for t in (two, one)]
    big = next(c for c in at.bwd_dkdv_configs() if c.kwargs == {"BLOCK_M": 64, "BLOCK_N": 128})
    specs.append(_launch_spec("_attn_bwd_dkdv", 80, two, big))
    res = sm90_resources(specs)
    for i, kernel in enumerate(firsts):
        split, padded = res[2 * i], res[2 * i + 1]
        assert split["wgmma"] > 0 and split["shared"] < padded["shared"], (kernel, split, padded)
        if split["registers"] is not None:  # (cuobjdump found)
            assert split["local_bytes"] == 0, (kernel, split)
            assert split["registers"] <= padded["registers"], (kernel, split, padded)
    if res[-1]["registers"] is not None:
        assert res[-1]["local_bytes"] == 0, res[-1]


# Head dims that take two tiles, in 16-bit (48 = 32 + 16, 80, 96, 160 = 128 + 32).
SPLIT_HEAD_DIMS = [48, 80, 96, 160]


@pytest.mark.parametrize("d", SPLIT_HEAD_DIMS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_cpu_triton_two_tile_head_dims(d, causal):
    from kernellab.ops.attention import triton as at

    assert at._d_tiles(d, torch.bfloat16)[1] > 0
    _check_case("triton", (1, 2, 37, 29, d), torch.bfloat16, "cpu", causal)
    if d == 80:  # fp16; GQA with S_q > S_k; strided q, k, v and dO
        _check_case("triton", (1, 2, 29, 37, d), torch.float16, "cpu", causal)
        _check_case("triton", (1, 4, 2, 33, 17, d), torch.bfloat16, "cpu", causal)
        _check_case("triton", (1, 2, 21, 19, d), torch.bfloat16, "cpu", causal, "sliced", strided_dy=True)


def test_cpu_triton_two_tile_head_dim_with_window_and_softcap():
    _check_case("triton", (1, 2, 33, 29, 80), torch.bfloat16, "cpu", True, window=(5, -1), softcap=7.0)
    _check_case("triton", (1, 4, 2, 29, 33, 72), torch.float16, "cpu", False, window=(3, 4), softcap=5.0)


def test_cpu_triton_two_tiles_agree_with_one_padded_tile_and_never_write_the_padding():
    """The two-tile kernels (D = 80: 64 + 16) against the one padded
    128-wide tile, 48 columns masked (kernellab.config.attn_split_d False): the same o, lse and gradients up to
    summation order; o, dq, dk, dv written through masks (a view of a wider buffer keeps
    its columns past D)."""
    from kernellab.ops.attention import triton as at
    from kernellab.options import config

    q, k, v = SPEC.make_inputs((1, 2, 21, 19, 80), torch.bfloat16, "cpu", 4)
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    outs = {}
    for split in (True, False):
        with config.override(attn_split_d=split):
            o_buf = torch.full((1, 2, 21, 96), float("nan"), dtype=torch.bfloat16)
            o, lse = at.forward_into(q, k, v, True, 0.15, o_buf[..., :80])
            bufs = [torch.full(t.shape[:-1] + (96,), float("nan"), dtype=torch.bfloat16) for t in (q, k, v)]
            at.backward_into(do, q, k, v, o, lse, True, 0.15, *(b[..., :80] for b in bufs))
        for b in (o_buf, *bufs):
            assert torch.isnan(b[..., 80:]).all() and torch.isfinite(b[..., :80]).all()
        outs[split] = [o.float(), lse] + [b[..., :80].float() for b in bufs]
    for name, a, b in zip(("o", "lse", "dq", "dk", "dv"), outs[True], outs[False]):
        fin = torch.isfinite(b)  # (lse: -inf at the causal rows that see no key)
        assert torch.equal(a[~fin], b[~fin]) and fin.any(), name
        assert (a[fin] - b[fin]).abs().max().item() <= 0.02 * b[fin].abs().max().item() + 1e-3, name


def test_cpu_triton_launch_plans_are_kept_per_key_and_reused():
    """The forward and backward launchers keep one launch plan per (shapes, strides, dtypes,
    device, options) key: a second call at a key reuses it and computes the same values; a
    call at another layout or with other options gets its own plan, and is right too."""
    from kernellab.ops.attention import triton as at

    q, k, v = SPEC.make_inputs((1, 2, 19, 23, 16), torch.float32, "cpu", 8)
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(3))
    at._PLANS.clear()
    o1, lse1 = at.forward(q, k, v, True, 0.25)
    g1 = at.backward(do, q, k, v, o1, lse1, True, 0.25)
    assert len(at._PLANS) == 2
    plans = dict(at._PLANS)
    o2, lse2 = at.forward(q, k, v, True, 0.25)
    g2 = at.backward(do, q, k, v, o2, lse2, True, 0.25)
    assert at._PLANS == plans  # the same plan objects, none added
    torch.testing.assert_close(o2, o1, rtol=0, atol=0)
    for a, b in zip(g2, g1):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # another layout (k, v read through transposed views) and other options: new plans
    kt, vt = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (k, v))
    o3, _ = at.forward(q, kt, vt, True, 0.25)
    torch.testing.assert_close(o3, o1, rtol=0, atol=0)
    o4, _ = at.forward(q, k, v, False, 0.25, 3, 2, 1.5)
    assert len(at._PLANS) == 4
    a64 = [t.double() for t in (q, k, v)]
    ref = SPEC.reference(*a64, causal=False, scale=0.25, window=(3, 2), softcap=1.5)
    torch.testing.assert_close(o4.double(), ref, rtol=1e-4, atol=1e-5)


# Sliding windows and softcap: every backend that computes them (triton in its kernels,
# tiled in its tiles; manual, torch, compile with explicit masks), against the float64
# reference; the others refuse with an error naming the option.
WINDOW_CASES = [
    ((1, 2, 33, 17, 16), True, {"window": (5, -1)}),  # causal sliding window, S_q > S_k
    ((1, 2, 17, 33, 16), False, {"window": (4, 6)}),  # two-sided, S_q < S_k
    ((1, 2, 40, 40, 24), False, {"window": (0, 0)}),  # each row sees one key; padded D
    ((1, 2, 45, 12, 16), False, {"window": (3, -1)}),  # rows of the first 30 see no key
    ((1, 2, 33, 37, 16), False, {"window": (-1, 2)}),  # left unbounded
    ((1, 2, 17, 33, 16), False, {"softcap": 0.5}),  # strong cap: tanh far from linear
    ((1, 2, 33, 17, 40), True, {"softcap": 5.0}),
    ((1, 4, 2, 33, 17, 16), True, {"window": (7, 3), "softcap": 2.0}),  # GQA + window + softcap
]
OPTION_BACKENDS = ["manual", "torch", "tiled", "triton"]


@pytest.mark.parametrize("backend", OPTION_BACKENDS)
@pytest.mark.parametrize("case", range(len(WINDOW_CASES)))
def test_cpu_window_and_softcap(backend, case):
    shape, causal, options = WINDOW_CASES[case]
    _check_case(backend, shape, torch.float32, "cpu", causal, **options)


def test_cpu_window_and_softcap_bf16_triton():
    _check_case("triton", (1, 4, 2, 33, 17, 40), torch.bfloat16, "cpu", True, window=(9, -1), softcap=3.0)
    opts = {"window": (6, 2), "softcap": 1.5}
    shape = (1, 2, 37, 29, 16)
    _check_case("triton", shape, torch.float32, "cpu", False, layout="transposed", strided_dy=True, **opts)


def test_window_semantics():
    """The window is FlashAttention's: bottom-right aligned like causal, -1 unbounded,
    causal forcing the right bound to 0; (-1, -1) and causal-without-left are no window."""
    m = AA.allowed_mask(4, 6, False, (1, 0), "cpu")  # query i sees keys i + 2 - 1 .. i + 2
    assert m.tolist()[0] == [False, True, True, False, False, False]
    assert torch.equal(AA.allowed_mask(4, 6, True, (-1, 5), "cpu"), AA.causal_allowed(4, 6, "cpu"))
    assert AA.allowed_mask(4, 6, False, (-1, -1), "cpu") is None
    assert torch.equal(AA.allowed_mask(4, 6, True, (2, 3), "cpu"), AA.allowed_mask(4, 6, False, (2, 0), "cpu"))
    # softcap: scores capped before the softmax
    q, k, v = SPEC.make_inputs((1, 1, 5, 7, 16), torch.float64, "cpu", 1)
    s = 4.0 * torch.tanh(q @ k.transpose(-1, -2) * 0.25 / 4.0)
    torch.testing.assert_close(SPEC.reference(q, k, v, softcap=4.0), torch.softmax(s, -1) @ v)


def test_window_skips_key_blocks_in_triton():
    """A narrow window visits only the key blocks near the diagonal. Keys 80.. hold NaN:
    a query block that visited their key block would get NaN even where the mask gives
    P = 0 (0 * NaN in P V). With window (4, 4), the interpreter's 32-row query blocks 0 and
    1 see keys < 68 only, so they must stay finite and right; rows 76.. see NaN keys."""
    q, k, v = SPEC.make_inputs((1, 1, 96, 96, 16), torch.float32, "cpu", 2)
    k2, v2 = k.clone(), v.clone()
    k2[..., 80:, :] = float("nan")
    v2[..., 80:, :] = float("nan")
    o = A.attention(q, k2, v2, window=(4, 4), backend="triton")
    ok = torch.isfinite(o).all(-1)
    assert ok[..., :64].all() and not ok[..., 76:].any()
    ref = SPEC.reference(q.double(), k.double(), v.double(), window=(4, 4))
    assert (o[..., :64, :].double() - ref[..., :64, :]).abs().max() < 1e-5


@pytest.mark.parametrize("backend", ["sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "cuda_v1"])
def test_window_softcap_gqa_declared_as_limits(backend):
    """Backends without windows / softcap declare them (Impl.limits, naming the option),
    so `check` counts their refusal as refused, not failed; no-op windows are no limit."""
    impl = kernellab.registry.get("attention", backend)
    dt = torch.float32 if backend == "cuda_v1" else torch.bfloat16
    q, k, v = (t.to("meta") for t in SPEC.make_inputs((1, 2, 9, 9, 64), dt, "cpu", 0))
    for opts, name in (({"window": (3, 3)}, "window"), ({"softcap": 5.0}, "softcap")):
        assert name in impl.outside_limits((q, k, v), opts)
    assert impl.outside_limits((q, k, v), {"window": (-1, -1), "softcap": 0.0}) is None
    assert impl.outside_limits((q, k, v), {"causal": True, "window": (-1, 7)}) is None


def test_triton_opcheck_with_window_and_softcap():
    from kernellab.ops.attention import triton as at

    def make(seed):
        return SPEC.make_inputs((1, 2, 9, 16), torch.float32, "cpu", seed)[0]

    args = at._opcheck_fwd_options(make)
    torch.library.opcheck(at.triton_attention.ops[0], args)


def test_cpu_compile_backend():
    _check_case("compile", (1, 2, 33, 40, 32), torch.float32, "cpu", True, grads=False)


# --------------------------------------------------------------------------- semantics


@pytest.mark.parametrize("backend", ["manual", "torch", "tiled", "triton"])
def test_rows_without_keys_are_zero(backend):
    """Causal with S_q > S_k: the first S_q - S_k rows see no key; they are 0, with zero
    gradients, as PyTorch's SDPA gives for a fully masked row of a boolean mask."""
    q, k, v = SPEC.make_inputs((1, 2, 20, 6, 16), torch.float32, "cpu", 3)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o = A.attention(*leaves, causal=True, backend=backend)
    assert torch.equal(o[..., :14, :], torch.zeros_like(o[..., :14, :]))
    mask = torch.ones(20, 6, dtype=torch.bool).tril(6 - 20)
    torch_o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(o, torch_o, rtol=1e-5, atol=1e-6)
    (dq,) = torch.autograd.grad(o.sum(), leaves[:1])
    assert torch.equal(dq[..., :14, :], torch.zeros_like(dq[..., :14, :]))
    assert torch.isfinite(dq).all()


def test_bottom_right_differs_from_torch_top_left():
    # The convention is FlashAttention-2's, not SDPA's is_causal (top-left): S_q < S_k.
    q, k, v = SPEC.make_inputs((1, 1, 4, 9, 16), torch.float64, "cpu", 5)
    ours = SPEC.reference(q, k, v, causal=True)
    top_left = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert not torch.allclose(ours, top_left)
    # Last query row sees every key (bottom-right): full attention for that row.
    full = SPEC.reference(q, k, v, causal=False)
    torch.testing.assert_close(ours[..., -1, :], full[..., -1, :])


# What the autograd node of each backend whose node is kernellab's (tiled, triton) saves:
# q, k, v, o and exactly one more tensor, the log-sum-exp of the scaled scores, fp32, of
# q.shape[:-1] (docs/guide.md; course test suites read o.grad_fn.saved_tensors for it). tiled's
# is in natural-log units, triton's in log2 units.
SAVED_CASES = [
    ((2, 3, 21, 26, 32), True),  # 4-D, S_q < S_k
    ((2, 17, 32), False),  # 3-D (B, S, D): lse (B, S)
    ((1, 4, 2, 17, 23, 16), True),  # GQA (k, v with 2 heads for q's 4)
    ((1, 1, 9, 4, 16), True),  # causal S_q > S_k: rows without a key have lse -inf
]


def _check_saved_lse(backend, shape, dtype, device, causal):
    q, k, v = (t.requires_grad_() for t in SPEC.make_inputs(shape, dtype, device, 7))
    o = A.attention(q, k, v, causal=causal, backend=backend)
    saved = o.grad_fn.saved_tensors
    assert len(saved) == 5, "forward saves q, k, v, o and exactly one extra tensor (the LSE)"
    assert torch.equal(saved[0], q) and torch.equal(saved[3], o)
    lse = saved[4]
    assert lse.shape == q.shape[:-1] and lse.dtype == torch.float32, (tuple(lse.shape), lse.dtype)
    ke, _ = AA.expand_kv(q, k, v)
    s = (q.double() @ ke.double().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    allowed = AA.allowed_mask(q.shape[-2], k.shape[-2], causal, None, device)
    if allowed is not None:
        s = s.masked_fill(~allowed, float("-inf"))
    expect = s.logsumexp(-1)
    if backend == "triton":  # in log2 units (the backward's exponent base)
        expect = expect / math.log(2)
    tol = dict(rtol=2e-6, atol=2e-6) if dtype == torch.float32 else dict(rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(lse.double(), expect, **tol)


@pytest.mark.parametrize("backend", ["tiled", "triton"])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("case", SAVED_CASES, ids=lambda c: "x".join(map(str, c[0])))
def test_saved_tensors_are_inputs_output_and_lse(backend, dtype, case):
    _check_saved_lse(backend, case[0], dtype, "cpu", case[1])


def _graph_saved(o):
    """(node name, saved tensor) over o's autograd graph: PyTorch nodes' ``_saved_*``
    tensors and custom Functions' ``saved_tensors``."""
    out, seen, todo = [], set(), [o.grad_fn]
    while todo:
        fn = todo.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        for name in dir(fn):
            if name.startswith("_saved_") and isinstance(getattr(fn, name), torch.Tensor):
                out.append((type(fn).__name__ + "." + name, getattr(fn, name)))
        out += [(type(fn).__name__, t) for t in getattr(fn, "saved_tensors", ())]
        todo += [n for n, _ in fn.next_functions]
    return out


@pytest.mark.parametrize("shape", [(2, 3, 21, 26, 32), (2, 17, 32)], ids=lambda s: "x".join(map(str, s)))
def test_pytorch_autograd_backends_save_what_the_readme_says(shape):
    """manual, torch and compile run under PyTorch's own autograd, and what it keeps is
    PyTorch's (docs/guide.md): manual the (..., S_q, S_k) probabilities and no log-sum-exp; torch
    on the CPU (SDPA's CPU flash kernel, non-causal) q, k, v, o and a natural-log
    logsumexp of its 4-D view (1, B, S_q for 3-D q); compile an AOTAutograd node whose
    saved tensors its partitioner picks."""
    q, k, v = (t.requires_grad_() for t in SPEC.make_inputs(shape, torch.float32, "cpu", 7))
    s_q, s_k = q.shape[-2], k.shape[-2]
    saved = _graph_saved(A.attention(q, k, v, backend="manual"))
    assert any(t.shape == q.shape[:-1] + (s_k,) and "Softmax" in n for n, t in saved), [n for n, _ in saved]
    assert not any(t.shape == q.shape[:-1] for _, t in saved)
    assert not any(n.endswith("Backward") and "_saved_" not in n for n, _ in saved)  # no custom Function
    saved = dict(_graph_saved(A.attention(q, k, v, backend="torch")))
    lse = saved["ScaledDotProductFlashAttentionForCpuBackward0._saved_logsumexp"]
    lead4 = q.shape[:-2] if q.dim() == 4 else (1, q.shape[0])
    assert lse.shape == lead4 + (s_q,) and lse.dtype == torch.float32
    s = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    torch.testing.assert_close(lse.double(), s.logsumexp(-1).reshape(lse.shape), rtol=2e-6, atol=2e-6)
    assert saved["ScaledDotProductFlashAttentionForCpuBackward0._saved_output"].shape == lead4 + (s_q, q.shape[-1])
    if shape == (2, 17, 32):  # (one compile: it takes seconds)
        o = A.attention(q, k, v, backend="compile")
        assert type(o.grad_fn).__name__ == "CompiledFunctionBackward"


@pytest.mark.parametrize("backend", ["tiled", "triton"])
@pytest.mark.parametrize("shape", [(1, 2, 19, 23, 16), (2, 19, 16)], ids=lambda s: "x".join(map(str, s)))
def test_inplace_op_on_the_output(backend, shape):
    """With grad on, an in-place op on o is allowed, as with SDPA (o is no view made inside
    the autograd Function). The backward reads o (delta = rowsum(dO * O)): after o was
    modified it is refused with an error naming o and the fix, never run on the modified
    values; an in-place op on a clone gives the right gradients."""
    args = SPEC.make_inputs(shape, torch.float32, "cpu", 9)
    q, k, v = (t.clone().requires_grad_() for t in args)
    o = A.attention(q, k, v, causal=True, backend=backend)
    assert not o._is_view()
    o.mul_(2.0)  # allowed
    with pytest.raises(RuntimeError, match=r"attention \((tiled|triton)\): .*output o was modified in place.*o\.clone\(\)"):
        o.sum().backward()
    o = A.attention(q, k, v, causal=True, backend=backend).clone()
    o.mul_(2.0)
    got = torch.autograd.grad(o.sum(), (q, k, v))
    qt, kt, vt = (t.clone().requires_grad_() for t in args)
    want = torch.autograd.grad((2.0 * A.attention(qt, kt, vt, causal=True, backend="torch")).sum(), (qt, kt, vt))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_lse_of_empty_rows_is_minus_inf(dtype):
    from kernellab.ops.attention import triton as at

    q, k, v = SPEC.make_inputs((1, 1, 9, 4, 16), dtype, "cpu", 8)
    _, lse = at.forward(q, k, v, True, 0.25)
    assert lse.shape == q.shape[:-1] and lse.dtype == torch.float32
    assert torch.isneginf(lse[..., :5]).all() and torch.isfinite(lse[..., 5:]).all()


def test_scale_argument():
    q, k, v = SPEC.make_inputs((1, 2, 19, 23, 32), torch.float32, "cpu", 9)
    for backend in ("manual", "tiled", "triton"):
        o = A.attention(q, k, v, scale=0.3, backend=backend)
        v_ = judge(
            o, SPEC.ref(q, k, v, scale=0.3), torch.float32, A.attention(q, k, v, scale=0.3, backend="torch")
        )
        assert v_.ok, (backend, v_.detail)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=dtype_id)
def test_cpu_triton_launchers_take_a_negative_scale(dtype):
    """The public op refuses a negative scale; the launchers (which ring attention and the
    models call with a float) compute it: a negative scale flips which score is the row's
    max, and fp32 keeps that max in score units with the sign folded in (lse_shape)."""
    from kernellab.ops.attention import triton as at

    with pytest.raises(ValueError, match="scale"):
        A.attention(*SPEC.make_inputs((1, 1, 4, 16), dtype, "cpu", 1), scale=-0.3, backend="triton")
    q, k, v = SPEC.make_inputs((1, 2, 21, 26, 32), dtype, "cpu", 11)
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(12)).to(dtype)
    a64 = [t.double().requires_grad_() for t in (q, k, v)]
    allowed = AA.causal_allowed(21, 26, "cpu")
    s = (a64[0] @ a64[1].transpose(-1, -2) * -0.3).masked_fill(~allowed, float("-inf"))
    ref = torch.softmax(s, -1) @ a64[2]
    grads = torch.autograd.grad(ref, a64, do.double())
    o, lse = at.forward(q, k, v, True, -0.3)
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    torch.testing.assert_close(o.double(), ref, **tol)
    for got, want in zip(at.backward(do, q, k, v, o, lse, True, -0.3), grads):
        torch.testing.assert_close(got.double(), want, **tol)


def test_cpu_reruns_bitwise_equal():
    q, k, v = SPEC.make_inputs((1, 2, 40, 40, 32), torch.float32, "cpu", 10)
    first = A.attention(q, k, v, causal=True, backend="triton")
    for _ in range(3):
        assert torch.equal(A.attention(q, k, v, causal=True, backend="triton"), first)


def test_triton_under_torch_compile_fullgraph():
    def f(q, k, v):
        return A.attention(q, k, v, causal=True, backend="triton") * 2

    cf = torch.compile(f, fullgraph=True)
    args = SPEC.make_inputs((1, 2, 24, 40, 16), torch.float32, "cpu", 11)
    a1 = [t.clone().requires_grad_() for t in args]
    a2 = [t.clone().requires_grad_() for t in args]
    out = cf(*a1)
    out.sum().backward()
    ref = f(*a2)
    ref.sum().backward()
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    for x, y in zip(a1, a2):
        torch.testing.assert_close(x.grad, y.grad, rtol=1e-4, atol=1e-6)


# --------------------------------------------------------------------------- counts


def test_flops_and_bytes():
    shape = (4, 16, 4096, 128)
    fwd = 4 * 4 * 16 * 4096 * 4096 * 128
    assert SPEC.count_flops(shape, "fwd") == fwd
    assert SPEC.count_flops(shape, "fwd", {"causal": True}) == fwd // 2
    assert SPEC.count_flops(shape, "bwd") == 2.5 * fwd
    assert SPEC.count_flops(shape, "fwdbwd", {"causal": True}) == 3.5 * fwd // 2
    assert SPEC.count_flops((1, 2, 8, 16, 32), "fwd") == 4 * 2 * 8 * 16 * 32
    qkvo = 4 * 4 * 16 * 4096 * 128 * 2  # bf16
    assert SPEC.count_bytes(shape, torch.bfloat16, "fwd") == qkvo + 4 * 16 * 4096 * 4


# --------------------------------------------------------------------------- bad input


def _qkv(shape=(1, 2, 9, 16), dtype=torch.float32, device="cpu"):
    return SPEC.make_inputs(shape, dtype, device, 0)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_bad_inputs_refused(backend):
    q, k, v = _qkv()
    cases = [
        ((q, k[..., :8], v), {}, ValueError, r"\bk\b.*head dim"),
        ((q, k, v[..., :8]), {}, ValueError, r"\bv\b.*head dim"),
        ((q.int(), k, v), {}, TypeError, r"\bq\b"),
        ((q, k.half(), v), {}, TypeError, r"\bk\b"),
        ((q, k[:, :1], v), {}, ValueError, r"\bk\b has 1 heads.*\bv\b has 2"),
        ((q, k, v.expand(2, -1, -1, -1)), {}, ValueError, r"\bv\b.*leading"),
        ((q[:, :1].expand(1, 3, -1, -1), k, v), {}, ValueError, r"q has 3 heads.*k/v have 2"),
        ((q[0], k[0, :1], v[0, :1]), {}, ValueError, r"\bk\b.*leading"),  # 3-D: dim -3 is the batch
        ((q, k, v[..., :4, :]), {}, ValueError, r"\bv\b"),
        ((q, k, v), {"causal": 1}, TypeError, "causal"),
        ((q, k, v), {"scale": 0.0}, ValueError, "scale"),
        ((q, k, v), {"scale": "x"}, TypeError, "scale"),
        ((q, k, v), {"window": (3, -2)}, ValueError, "window"),
        ((q, k, v), {"window": [3, 3]}, TypeError, "window"),
        ((q, k, v), {"window": (3.0, 1)}, TypeError, "window"),
        ((q, k, v), {"softcap": -1.0}, ValueError, "softcap"),
        ((q, k, v), {"softcap": "x"}, TypeError, "softcap"),
        ((q.tolist(), k, v), {}, TypeError, r"\bq\b"),
    ]
    if torch.float64 not in (kernellab.registry.get("attention", backend).dtypes or ()):
        cases.append(((q.double(), k.double(), v.double()), {}, TypeError, r"\bq\b.*float64"))
    for args, kw, exc, pattern in cases:
        with pytest.raises(exc, match=pattern):
            A.attention(*args, backend=backend, **kw)
    with pytest.raises(TypeError, match="dropout_p"):
        kernellab.registry.get("attention", backend)(q, k, v, dropout_p=0.1)


def test_validator_fast_accept_takes_well_formed_calls_only():
    """attention's validator accepts the common call in a few attribute reads
    (``_fast_accept``); everything else goes to the checks that name the argument: a k on
    another device (meta), sparse tensors, a bool or NaN scale, a Parameter (not a plain
    Tensor: the full checks), GQA heads that do not divide."""
    from kernellab.ops.attention import _fast_accept, validate

    q, k, v = _qkv()
    dev = ("cuda", "cpu")
    assert _fast_accept((q, k, v), {"causal": True, "scale": None}, dev)
    assert _fast_accept((q, k, v), {"scale": 2, "window": None, "softcap": None}, dev)
    assert _fast_accept((q, k[:, :1], v[:, :1]), {}, dev)  # GQA 2:1
    assert not _fast_accept((q, k, v), {}, ("cuda",))  # a CPU call to a GPU-only backend
    assert not _fast_accept((q[0], k[0], v[0]), {}, dev)  # 3-D: the full checks
    for args, kw in [
        ((q, k.to("meta"), v), {}),
        ((q.to_sparse(), k, v), {}),
        ((q, k, v), {"scale": True}),
        ((q, k, v), {"scale": float("nan")}),
        ((q, k, v), {"window": (1, 1)}),
        ((torch.nn.Parameter(q), k, v), {}),
        ((q[:, :1].expand(1, 3, -1, -1), k, v), {}),
    ]:
        assert not _fast_accept(args, kw, dev), kw
    with pytest.raises(ValueError, match=r"\bk\b is on meta"):
        validate((q, k.to("meta"), v), {}, dev)
    with pytest.raises(TypeError, match=r"\bq\b has layout torch.sparse_coo"):
        validate((q.to_sparse(), k, v), {}, dev)
    with pytest.raises(TypeError, match="scale"):
        validate((q, k, v), {"scale": True}, dev)
    validate((torch.nn.Parameter(q), k, v), {}, dev)  # well-formed, through the full checks


@pytest.mark.parametrize("causal", [False, True])
def test_torch_backend_takes_a_models_strided_views(causal):
    """The torch backend hands 4-D q/k/v to SDPA as they are (no fold to (1, B*H, S, D),
    which copied them): a GPT's q/k/v, views of one [B, T, 3, H, D] projection, give the
    float64 reference's output and gradients."""
    torch.manual_seed(0)
    b, t, h, d = 2, 13, 3, 16
    qkv = torch.randn(b, t, 3, h, d, requires_grad=True)
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    assert not q.is_contiguous()
    out = A.attention(q, k, v, causal=causal, backend="torch")
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    ref = SPEC.reference(q64, k64, v64, causal=causal)  # float64 in, graph kept
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    dy = torch.randn_like(out)
    (g,) = torch.autograd.grad(out, qkv, dy)
    grads = torch.autograd.grad(ref, (q64, k64, v64), dy.double())
    want = torch.stack(grads, 0).permute(1, 3, 0, 2, 4)  # back to [B, T, 3, H, D]
    torch.testing.assert_close(g.double(), want, rtol=1e-4, atol=1e-5)


def test_unsupported_head_dim_and_dtype_per_backend():
    for d in (12, 100, 264):  # not a multiple of 8, or over 256
        q, k, v = _qkv((1, 2, 9, d))
        with pytest.raises(ValueError, match=rf"q has head dim {d}; .*multiples of 8 from 8 to 256"):
            A.attention(q, k, v, backend="triton")
        # manual and tiled take any head dim; the default backend serves it (torch)
        ref = SPEC.ref(q, k, v)
        for backend in ("tiled", None):
            got = A.attention(q, k, v, backend=backend)
            v_ = judge(got, ref, torch.float32, A.attention(q, k, v, backend="torch"))
            assert v_.ok, (d, backend, v_.detail)


@pytest.mark.parametrize(
    "backend,shape,dtype,causal,pattern",
    [
        ("sdpa_cudnn", (2, 3, 1, 1, 64), torch.bfloat16, False, r"\bk\b has 1 key"),
        ("sdpa_cudnn", (1, 2, 9, 1, 64), torch.float16, False, r"\bk\b has 1 key"),
        ("sdpa_flash", (1, 2, 9, 12, 64), torch.bfloat16, True, r"S_q != S_k"),
        ("sdpa_cudnn", (1, 2, 9, 16, 256), torch.bfloat16, False, r"\bq\b has head dim 256"),
        ("sdpa_flash", (1, 2, 9, 16, 64), torch.float32, False, r"\bq\b has dtype float32"),
    ],
)
def test_peer_limits_are_refused_clearly(backend, shape, dtype, causal, pattern):
    """Each peer declares what its forced SDPA kernel cannot compute (Impl.limits), and
    refuses exactly those calls with an error naming the argument, before SDPA's own
    "No available kernel"; `check` counts such a case as refused, not failed."""
    impl = kernellab.registry.get("attention", backend)
    dev = "cuda" if torch.cuda.is_available() else "meta"
    q, k, v = SPEC.make_inputs(shape, dtype, "cpu", 0)
    q, k, v = (t.to(dev) for t in (q, k, v))
    assert impl.outside_limits((q, k, v), {"causal": causal})
    with pytest.raises((ValueError, TypeError), match=pattern):
        impl.fn(q, k, v, causal=causal)
    inside = SPEC.make_inputs((1, 2, 9, 9, 64), torch.bfloat16, "cpu", 0)
    assert impl.outside_limits(inside, {"causal": causal}) is None


def test_check_counts_a_declared_limit_as_refused():
    from kernellab.harness import check as C

    impl = kernellab.registry.get("attention", "sdpa_cudnn")
    runner = C._Runner(impl, SPEC, torch.bfloat16, "cpu", 0, True)
    args = SPEC.make_inputs((2, 3, 1, 1, 64), torch.bfloat16, "cpu", 1)
    # On this machine the peer refuses every CPU tensor: only the case outside its limits
    # (one key) counts as a refusal; a case inside them that raises is a failure.
    assert runner.run_forward("shape", "one key", args).status == C.REFUSED
    args = SPEC.make_inputs((1, 2, 9, 9, 64), torch.bfloat16, "cpu", 1)
    assert runner.run_forward("shape", "nine keys", args).status == C.FAIL


@pytest.mark.parametrize("backend", ["cuda_v1", "sdpa_flash", "sdpa_cudnn", "sdpa_efficient"])
def test_cpu_tensor_to_gpu_backend_refused(backend):
    q, k, v = _qkv((1, 2, 9, 64))
    if torch.cuda.is_available():
        pytest.skip("checked on a machine without a GPU (where every tensor is a CPU tensor)")
    with pytest.raises(ValueError, match=r"\bq\b is on cpu"):
        A.attention(q, k, v, backend=backend)


# --------------------------------------------------------------------------- GPU

GPU_SHAPES = [
    (2, 3, 1, 1, 64),
    (2, 4, 17, 17, 32),
    (1, 4, 113, 127, 64),
    (1, 4, 127, 113, 128),
    (2, 2, 1023, 1023, 64),
    (1, 2, 1025, 1023, 128),
    (1, 2, 1023, 1025, 16),
    (2, 257, 32),  # 3-D
    (1, 2, 300, 256),  # D = 256
    (1, 2, 257, 96),  # D = 96: tiles padded to 128
    (1, 2, 129, 130, 200),  # D = 200: padded to 256 (cuDNN's peer refuses D > 128)
    (1, 8, 2, 257, 255, 64),  # GQA, group 4
    (2, 4, 1, 129, 129, 128),  # MQA
]


# bf16 (the benchmark dtype) on every shape; fp16 and fp32 on a subset with fewer head dims
# (each head dim x dtype x causal is a fresh compile of three Triton kernels).
GPU_CASES = [(s, torch.bfloat16) for s in GPU_SHAPES] + [
    (s, dt) for dt in (torch.float16, torch.float32) for s in GPU_SHAPES if s[-1] in (64, 128) or s[-2] == 17
]


@pytest.mark.gpu
@pytest.mark.parametrize("backend", GPU_BACKENDS)
@pytest.mark.parametrize(
    "shape,dtype",
    GPU_CASES,
    ids=lambda c: dtype_id(c) if isinstance(c, torch.dtype) else "x".join(map(str, c)),
)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gpu_forward_and_grads(backend, dtype, shape, causal, request):
    if backend == "manual" and dtype == torch.float32:
        # H100, TF32 off, 2x4x1023x1025x64 full: the naive fp32 softmax + cuBLAS P^T dO had
        # dv error 5.37e-06 against a bound of 4.36e-06 (2 x SDPA's fused kernel, which
        # recomputes P in blocks). Same status as on the CPU: non-strict xfail, reported.
        request.applymarker(
            pytest.mark.xfail(reason="naive fp32 manual: dv near 2x SDPA's GPU error", strict=False)
        )
    if backend == "triton" and dtype == torch.float32 and len(shape) == 6 and causal:
        # H200 (torch 2.11, Triton 3.6), eleventh session: MQA 2x4x1x129x129x128 causal fp32
        # dq 2.47e-06 against a bound of 2.05e-06 (1.2x; the non-causal case and every bf16 /
        # fp16 GQA case passed). H100, fifteenth session, at dfbc072 (fp32 (m, log2 l) and
        # delta = rowsum(P dP)): passed under --runxfail. At 129 keys the delta is
        # rowsum(dO O) again since 868e2f5, not re-run there: the mark stays until it is.
        request.applymarker(
            pytest.mark.xfail(reason="fp32 GQA causal dq 1.2x over 2x torch's error", strict=False)
        )
    _check_case(backend, shape, dtype, "cuda", causal)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["triton", "tiled", "cuda_v1", "sdpa_efficient"])
@pytest.mark.parametrize("layout", ["transposed", "sliced", "offset", "expanded"])
def test_gpu_noncontiguous(backend, layout):
    dtype = torch.float32 if backend == "cuda_v1" else torch.bfloat16
    _check_case(backend, (2, 3, 129, 130, 64), dtype, "cuda", True, layout=layout, strided_dy=True)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=dtype_id)
def test_gpu_reruns_bitwise_equal(dtype):
    q, k, v = SPEC.make_inputs((2, 4, 1025, 64), dtype, "cuda", 12)
    first = A.attention(q, k, v, causal=True, backend="triton")
    for _ in range(50):
        assert torch.equal(A.attention(q, k, v, causal=True, backend="triton"), first)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["tiled", "triton"])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize(
    "case", SAVED_CASES + [((1, 2, 1024, 128), False)], ids=lambda c: "x".join(map(str, c[0]))
)
def test_gpu_saved_tensors_are_inputs_output_and_lse(backend, dtype, case):
    # + 1x2x1024x128 non-causal: 16-bit takes the warp-specialized forward on Hopper
    _check_saved_lse(backend, case[0], dtype, "cuda", case[1])


@pytest.mark.gpu
def test_gpu_fp32_tf32_follows_the_matmul_flag():
    # TF32 on: triton's fp32 dots and the torch baseline both round to TF32 (package doc).
    old = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        _check_case("triton", (1, 4, 257, 255, 64), torch.float32, "cuda", True)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


@pytest.mark.gpu
def test_gpu_peak_memory_linear_in_s():
    """fwd + bwd of the Triton kernels holds O(S) memory: doubling S doubles the peak
    above the inputs' footprint, it does not quadruple it."""
    peaks = []
    for s in (2048, 4096):
        q, k, v = (t.requires_grad_() for t in SPEC.make_inputs((1, 8, s, 64), torch.bfloat16, "cuda", 13))
        do = torch.randn_like(q)
        A.attention(q, k, v, causal=True, backend="triton").backward(do)  # autotune outside the measure
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        A.attention(q, k, v, causal=True, backend="triton").backward(do)
        torch.cuda.synchronize()
        peaks.append(torch.cuda.max_memory_allocated() - base)
        del q, k, v, do
    assert peaks[1] < 2.5 * peaks[0], peaks


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=dtype_id)
def test_gpu_triton_under_torch_compile_fullgraph(dtype):
    # fp32: Inductor also traces the backward's STATS launch of the forward kernel
    def f(q, k, v):
        return A.attention(q, k, v, causal=True, backend="triton")

    args = SPEC.make_inputs((2, 4, 300, 64), dtype, "cuda", 14)
    a1 = [t.clone().requires_grad_() for t in args]
    a2 = [t.clone().requires_grad_() for t in args]
    out = torch.compile(f, fullgraph=True)(*a1)
    out.float().square().sum().backward()
    ref = f(*a2)
    ref.float().square().sum().backward()
    torch.testing.assert_close(out, ref)  # same kernels: equal up to the dO rounding of each path
    for x, y in zip(a1, a2):
        torch.testing.assert_close(x.grad, y.grad)


@pytest.mark.gpu
def test_gpu_cuda_v1_is_forward_only():
    q, k, v = (t.requires_grad_() for t in SPEC.make_inputs((1, 2, 33, 64), torch.float32, "cuda", 15))
    with pytest.raises(NotImplementedError, match="forward only"):
        A.attention(q, k, v, backend="cuda_v1")
    with pytest.raises(TypeError, match=r"\bq\b.*bfloat16"):
        A.attention(*(t.detach().bfloat16() for t in (q, k, v)), backend="cuda_v1")


@pytest.mark.gpu
@pytest.mark.parametrize("d", list(range(8, 257, 8)))
def test_gpu_head_dim_sweep(d):
    """Every head dim Triton takes, bf16, causal, odd lengths both ways (S_q > S_k leaves
    rows without a key), forward and the three gradients."""
    _check_case("triton", (1, 3, 131, 77, d), torch.bfloat16, "cuda", True)


@pytest.mark.gpu
@pytest.mark.parametrize("d", [8, 40, 96, 136, 200])
def test_gpu_head_dims_fp32_and_fp16(d):
    _check_case("triton", (1, 2, 130, 129, d), torch.float32, "cuda", False)
    _check_case("triton", (1, 2, 130, 129, d), torch.float16, "cuda", True)


@pytest.mark.gpu
@pytest.mark.parametrize("s", [1024, 2048])
def test_gpu_llama3_8b_gqa(s):
    """Llama-3-8B's attention (32 q heads over 8 k/v heads, D=128, causal, bf16) against
    the float64 reference at S = 1024 and 2048 (the reference's scores: 32 x 2048^2 float64,
    1 GiB, chunked)."""
    _check_case("triton", (1, 32, 8, s, s, 128), torch.bfloat16, "cuda", True)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gpu_head_dim_96_issue_shape(causal):
    """4x16x2000x96 (the issue's refused row): Triton computes it, forward and gradients
    against the float64 reference (chunked: 64 x 2000^2 float64 scores are 2 GB)."""
    _check_case("triton", (4, 16, 2000, 96), torch.bfloat16, "cuda", causal)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=dtype_id)
def test_warp_specialized_forward_kernel_matches_the_reference(dtype):
    """The warp-specialized non-causal forward (_attn_fwd_ws, Hopper only in the public
    path) run directly under the interpreter: o in empty_bshd's layout; o and the lse
    (log2 units) against float64."""
    from kernellab.ops.attention import triton as at

    b, h, s, d = 1, 2, 256, 128
    gen = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(b, h, s, d, generator=gen).to(dtype) for _ in range(3))
    o = at.empty_bshd((b, h), s, d, dtype, "cpu")
    lse = torch.empty(b, h, s, dtype=torch.float32)
    scale = d**-0.5
    at._launch_ws(q, k, v, o, lse, scale * at.LOG2E, h, s)
    scores = (q.double() @ k.double().transpose(-1, -2)) * scale
    ref = torch.softmax(scores, -1) @ v.double()
    v_o = judge(o, ref, dtype, torch.nn.functional.scaled_dot_product_attention(q, k, v))
    assert v_o.ok, v_o.detail
    torch.testing.assert_close(lse.double() * math.log(2), torch.logsumexp(scores, -1), atol=1e-5, rtol=1e-6)


WS_BWD_LAYOUTS = ["contiguous", "fused_qkv"]


def _ws_bwd_inputs(b, h, s, d, dtype, layout, device, seed=12):
    """q, k, v, dO for the warp-specialized backward: contiguous (B, H, S, D), or as a model
    has them (q, k, v views of one (B, S, 3, H, D) projection, dO in (B, S, H, D) memory)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    if layout == "contiguous":
        return [torch.randn(b, h, s, d, generator=gen, device=device).to(dtype) for _ in range(4)]
    qkv = torch.randn(b, s, 3, h, d, generator=gen, device=device).to(dtype)
    do = torch.randn(b, s, h, d, generator=gen, device=device).to(dtype).transpose(1, 2)
    return [*qkv.permute(2, 0, 3, 1, 4).unbind(0), do]


@pytest.mark.parametrize("layout", WS_BWD_LAYOUTS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_warp_specialized_backward_kernels_match_the_plain_backward(causal, layout, monkeypatch):
    """The warp-specialized backward passes (_attn_bwd_dkdv_ws, _attn_bwd_dq_ws: Hopper only
    in the public path) run under the interpreter through the backward's launch plan, on
    contiguous inputs and on a fused projection's views: dq, dk, dv against the plain
    passes' on the same inputs, and _ws_layout reads both layouts."""
    from kernellab.ops.attention import triton as at

    b, h, s, d = 1, 2, 256, 128
    q, k, v, do = _ws_bwd_inputs(b, h, s, d, torch.float16, layout, "cpu")
    assert all(at._ws_layout(t, d) is not None for t in (q, k, v, do))
    scale = d**-0.5
    o, lse = at.forward(q, k, v, causal, scale)
    at._PLANS.clear()
    want = at.backward(do, q, k, v, o, lse, causal, scale)
    at._PLANS.clear()
    monkeypatch.setattr(at, "_ws_bwd_fits", lambda *args: True)
    monkeypatch.setattr(at, "WS_BWD_MIN_S", 128)
    monkeypatch.setitem(at._WS_BWD_DKDV, "BLOCK_M", 32)  # (smaller tiles: the interpreter's time)
    monkeypatch.setitem(at._WS_BWD_DQ, "BLOCK_N", 32)
    launched = []

    class Counted:  # the kernels as the plan launches them: kernel[grid](...)
        def __init__(self, fn):
            self.fn = fn

        def __getitem__(self, grid):
            launched.append(self.fn.__name__)
            return self.fn[grid]

    for name in ("_attn_bwd_dkdv_ws", "_attn_bwd_dq_ws"):
        monkeypatch.setattr(at, name, Counted(getattr(at, name)))
    got = at.backward(do, q, k, v, o, lse, causal, scale)
    at._PLANS.clear()
    assert launched == ["_attn_bwd_dkdv_ws", "_attn_bwd_dq_ws"]
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        err = (g.float() - w.float()).abs().max() / w.float().abs().max()
        assert err < 1e-2, f"{name}: relative error {err:.2e}"


def test_warp_specialized_backward_layout_refuses_what_tma_cannot_read():
    from kernellab.ops.attention import triton as at

    x = torch.randn(2, 4, 64, 128, dtype=torch.bfloat16)
    assert at._ws_layout(x, 128) == (2 * 4 * 64, 4 * 64 * 128, 64 * 128, 128)
    bshd = torch.randn(2, 64, 4, 128, dtype=torch.bfloat16).transpose(1, 2)
    assert at._ws_layout(bshd, 128) == (2 * 64, 64 * 4 * 128, 128, 4 * 128)
    assert at._ws_layout(x.transpose(-1, -2).contiguous().transpose(-1, -2), 128) is None  # D not unit-stride
    assert at._ws_layout(torch.randn(2, 4, 64, 130, dtype=torch.bfloat16)[..., :128], 128) is None  # 260-byte rows


def test_warp_specialized_backward_takes_column_views_only_when_asked(monkeypatch):
    """By default the warp-specialized backward takes head-major layouts only (what the H100
    verified); a fused projection's views need KERNELLAB_ATTN_WS_BWD=views; 0 turns it off.
    (On the CPU the device test fails every mode: the layout rule is read without it.)"""
    from kernellab.ops.attention import triton as at

    monkeypatch.setattr(at._device, "is_sm90", lambda index: True)
    monkeypatch.setattr(at, "_WS_TRITON", True)
    monkeypatch.setattr(at.triton_support, "_REAL_TENSORS", (torch.Tensor,))
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    args = (False, 1, False, 0, 128, 0.1, 2048, 2048, False)
    flat = _ws_bwd_inputs(1, 2, 2048, 128, torch.bfloat16, "contiguous", "cpu")
    fused = _ws_bwd_inputs(1, 2, 2048, 128, torch.bfloat16, "fused_qkv", "cpu")
    for mode, want in (("1", (True, False)), ("views", (True, True)), ("0", (False, False))):
        monkeypatch.setattr(kernellab.config, "attn_ws_bwd", mode)
        assert (at._ws_bwd_fits(*flat, *args), at._ws_bwd_fits(*fused, *args)) == want, mode


def test_warp_specialized_backward_compiles_for_sm90_with_the_loops_specialized():
    """No GPU needed: both warp-specialized backward passes compiled ahead of time for sm_90
    with their launch tiles, causal or not: the TTGIR holds the specialized region."""
    from kernellab.ops.attention import triton as at
    from kltest import compile_for_sm90

    for name, outs, tile in (("_attn_bwd_dkdv_ws", ("DK", "DV"), at._WS_BWD_DKDV), ("_attn_bwd_dq_ws", ("DQ",), at._WS_BWD_DQ)):
        fn = getattr(at, name)
        sig = {n: "*bf16" for n in ("Q", "K", "V", "DO", *outs)}
        sig.update(LSE="*fp32", DELTA="*fp32", qk_scale="fp32", sm_scale="fp32")
        sig.update({n: "i32" for n in fn.arg_names if n not in sig})
        sig.update({c: "constexpr" for c in ("HEAD_D", "BLOCK_M", "BLOCK_N", "CAUSAL")})
        ptrs = [i for i, n in enumerate(fn.arg_names) if sig[n].startswith("*")]
        for causal in (False, True):
            cx = dict(HEAD_D=128, BLOCK_M=tile["BLOCK_M"], BLOCK_N=tile["BLOCK_N"], CAUSAL=causal)
            opts = {"num_warps": tile["num_warps"], "num_stages": tile["num_stages"]}
            ttgir = compile_for_sm90(f"kernellab.ops.attention.triton.{name}", sig, cx, opts, ptrs, "ttgir")
            assert "warp_specialize" in ttgir, (name, causal, ttgir[-400:])


def test_warp_specialized_forward_compiles_for_sm90_with_the_loop_specialized():
    """No GPU needed: _attn_fwd_ws compiled ahead of time for sm_90 with its launch tile.
    The warp-specialization pass fails on some kernel forms (a pointer load of Q, 4-D
    descriptors) and can also leave the loop plain (8 warps): the compile must succeed and
    its TTGIR hold the specialized region."""
    from kernellab.ops.attention import triton as at
    from kltest import compile_for_sm90

    sig = {n: "*bf16" for n in "QKVO"}
    sig.update(LSE="*fp32", qk_scale="fp32", HEAD_D="constexpr", BLOCK_M="constexpr", BLOCK_N="constexpr",
               F32_DOTS="constexpr")  # fmt: skip
    sig.update({n: "i32" for n in ("stride_oz", "stride_oh", "stride_os", "NH", "S", "ROWS")})
    tile = at._WS_TILE
    cx = dict(HEAD_D=128, BLOCK_M=tile["BLOCK_M"], BLOCK_N=tile["BLOCK_N"], F32_DOTS=False)
    opts = {"num_warps": tile["num_warps"], "num_stages": tile["num_stages"]}
    ttgir = compile_for_sm90("kernellab.ops.attention.triton._attn_fwd_ws", sig, cx, opts, range(5), "ttgir")
    assert "warp_specialize" in ttgir, ttgir[-400:]


@pytest.mark.gpu
@pytest.mark.parametrize("s", [1024, 2048])
def test_gpu_warp_specialized_forward(s, monkeypatch):
    """On an H100 (sm_90) a contiguous non-causal bf16 D=128 call takes _attn_fwd_ws; its
    output and the gradients the backward computes from its lse against float64, and equal
    to within rounding of the plain kernel's (KERNELLAB_ATTN_WS=0)."""
    from kernellab.ops.attention import triton as at

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the warp-specialized forward runs on sm_90 only")
    shape = (2, 4, s, 128)
    q, k, v = SPEC.make_inputs(shape, torch.bfloat16, "cuda", 3)
    q4, k4, v4 = at._split(q), at._split(k), at._split(v)
    o4 = at._split(at.empty_bshd(q.shape[:-2], s, 128, q.dtype, q.device))
    assert at._ws_fits(q4, k4, v4, o4, False, 1, 0, 0, 128, 128**-0.5 * at.LOG2E, s, s)
    assert not at._ws_fits(q4, k4, v4, o4, True, 1, 0, 0, 128, 128**-0.5 * at.LOG2E, s, s)
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)  # (B, S, H, D) memory: the autotuned kernel
    assert not at._ws_fits(at._split(qt), k4, v4, o4, False, 1, 0, 0, 128, 128**-0.5 * at.LOG2E, s, s)
    _check_case("triton", shape, torch.bfloat16, "cuda", False)
    o_ws, lse_ws = at.forward(q, k, v, False, 128**-0.5)
    monkeypatch.setattr(kernellab.config, "attn_ws", "0")
    o_plain, lse_plain = at.forward(q, k, v, False, 128**-0.5)
    torch.testing.assert_close(lse_ws, lse_plain, atol=2e-6, rtol=1e-6)
    torch.testing.assert_close(o_ws.float(), o_plain.float(), atol=1e-2, rtol=1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(2, 3, 200, 64), (1, 4, 1024, 128)])
def test_gpu_launch_plans_go_direct_and_survive_a_misaligned_call(shape):
    """After its first calls at a key the Triton attention launches straight from its plan
    (triton_support.Bound: the compiled launcher with the tensors' addresses); a later call
    at the same key whose q, k, v (and gradient) start 2 bytes off a 16-byte boundary must
    not reuse a launcher specialized for aligned pointers (nor the TMA path at 1024 x 128):
    every call's outputs and gradients equal the first call's on copies of the same values."""
    from kernellab import triton_support
    from kernellab.ops.attention import triton as at

    q, k, v = SPEC.make_inputs(shape, torch.bfloat16, "cuda", 4)
    do = torch.randn(q.shape, device="cuda", dtype=torch.bfloat16)
    scale = shape[-1] ** -0.5

    def run(q, k, v, do):
        o, lse = at.forward(q, k, v, False, scale)
        return (o, *at.backward(do, q, k, v, o, lse, False, scale))

    want = run(q, k, v, do)
    for _ in range(3):  # the plans' TunedBound, then Bound, take their direct launches
        got = run(q, k, v, do)
    key_f = next(key for key in at._PLANS if key[0] == "f" and key[1] == q.shape)
    fwd = at._PLANS[key_f]
    bounds = [c.cell_contents for c in (fwd.__closure__ or ()) if isinstance(c.cell_contents, triton_support.TunedBound)]
    if bounds:  # (the warp-specialized forward launches through Triton's own launcher)
        assert bounds[0].bound is not None and bounds[0].bound.hit is not None
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)

    def misaligned(t):
        buf = torch.empty(t.numel() + 1, device="cuda", dtype=t.dtype)
        m = buf[1:].view(t.shape)
        m.copy_(t)
        assert m.data_ptr() % 16 and m.stride() == t.stride()
        return m

    got = run(misaligned(q), misaligned(k), misaligned(v), misaligned(do))
    for a, b in zip(got, want):  # (at 1024 x 128 the aligned forward was the warp-specialized one)
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", WS_BWD_LAYOUTS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gpu_warp_specialized_backward(causal, layout, monkeypatch):
    """On an H100 (sm_90) a bf16 D=128 call at S = 2048, contiguous or through a fused
    projection's views with dO in (B, S, H, D) memory, takes the warp-specialized backward
    passes: dq, dk, dv against float64 within the check's rule, with the plain passes'
    error (KERNELLAB_ATTN_WS_BWD=0) as the baseline; and a misaligned call at the same key
    falls back to the plain passes."""
    from kernellab.ops.attention import triton as at

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the warp-specialized backward runs on sm_90 only")
    b, h, s, d = 1, 4, 2048, 128
    q, k, v, do = _ws_bwd_inputs(b, h, s, d, torch.bfloat16, layout, "cuda")
    scale = d**-0.5
    mode = "1" if layout == "contiguous" else "views"  # (column-offset views: opt-in, kernellab.config.attn_ws_bwd)
    monkeypatch.setattr(kernellab.config, "attn_ws_bwd", mode)
    assert at._ws_bwd_fits(q, k, v, do, causal, 1, False, 0, d, scale * at.LOG2E, s, s, False)
    o, lse = at.forward(q, k, v, causal, scale)
    launched = []
    real = at._attn_bwd_dq_ws

    class Counted:
        def __getitem__(self, grid):
            launched.append(grid)
            return real[grid]

    monkeypatch.setattr(at, "_attn_bwd_dq_ws", Counted())
    got = at.backward(do, q, k, v, o, lse, causal, scale)
    assert launched, "the warp-specialized passes did not run"
    monkeypatch.setattr(kernellab.config, "attn_ws_bwd", "0")
    plain = at.backward(do, q, k, v, o, lse, causal, scale)
    assert len(launched) == 1
    a64 = [t.double().requires_grad_() for t in (q, k, v)]
    ref = torch.autograd.grad(SPEC.reference(*a64, causal=causal, scale=scale), a64, do.double())
    for name, g, p, r in zip(("dq", "dk", "dv"), got, plain, ref):
        verdict = judge(g, r, torch.bfloat16, p)
        assert verdict.ok, f"{name}: {verdict.detail}"
    monkeypatch.setattr(kernellab.config, "attn_ws_bwd", mode)
    buf = torch.empty(do.numel() + 1, device="cuda", dtype=do.dtype)
    do_off = buf[1:].view(do.shape)  # contiguous strides, 2 bytes off alignment
    if layout != "contiguous":
        do_off = buf[1:].view(b, s, h, d).transpose(1, 2)
    do_off.copy_(do)
    assert do_off.stride() == do.stride()  # the same plan key
    again = at.backward(do_off, q, k, v, o, lse, causal, scale)
    assert len(launched) == 1  # TMA needs 16-byte aligned bases: the plain passes ran
    for g, p in zip(again, plain):
        torch.testing.assert_close(g.float(), p.float(), rtol=1e-2, atol=1e-2)


GPU_WINDOW_CASES = [
    ((1, 4, 2, 1023, 1025, 128), torch.bfloat16, True, {"window": (256, -1)}),  # Mistral-style sliding
    # Gemma-2-like: sliding window and softcap 50, at D = 256
    ((1, 8, 4, 1025, 1025, 256), torch.bfloat16, True, {"window": (511, -1), "softcap": 50.0}),
    ((2, 4, 513, 80), torch.float16, False, {"window": (64, 64)}),
    ((1, 4, 300, 257, 64), torch.float32, False, {"window": (17, 5), "softcap": 2.0}),
    ((2, 4, 517, 64), torch.bfloat16, False, {"softcap": 1.0}),
]


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["triton", "torch", "manual"])
@pytest.mark.parametrize("case", range(len(GPU_WINDOW_CASES)))
def test_gpu_window_and_softcap(backend, case):
    shape, dtype, causal, options = GPU_WINDOW_CASES[case]
    _check_case(backend, shape, dtype, "cuda", causal, **options)


@pytest.mark.gpu
def test_gpu_gqa_refusals():
    q, k, v = SPEC.make_inputs((1, 4, 2, 33, 33, 64), torch.float32, "cuda", 1)
    with pytest.raises(ValueError, match=r"k/v have 2 heads"):
        A.attention(q, k, v, backend="cuda_v1")
    with pytest.raises(ValueError, match=r"k/v have 2 heads"):
        A.attention(q.half(), k.half(), v.half(), backend="sdpa_efficient")


def test_triton_reads_packed_qkv_and_writes_gradients_in_place():
    """Triton attention takes batch and head strides: q, k, v as views of one packed
    [B, T, 3, H, D] projection are read in place, o comes back in [B, T, H, D] memory order
    (o.transpose(1, 2).reshape(B, T, H * D) is a view), and backward_into writes dq, dk, dv
    into views of one packed gradient buffer; all equal the float64 reference."""
    from kernellab.ops.attention import triton as at

    b, t, h, d = 2, 37, 3, 16
    gen = torch.Generator().manual_seed(5)
    qkv = torch.randn(b, t, 3, h, d, generator=gen)
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    o, saved = kernellab.get("attention", "triton").fn.forward_saving(q, k, v, True, 0.25)
    q64, k64, v64 = (x.double().requires_grad_(True) for x in (q, k, v))
    from kernellab.core.spec import get_spec

    ref = get_spec("attention").reference(q64, k64, v64, causal=True, scale=0.25)
    assert (o.double() - ref).abs().max().item() < 1e-5
    assert o.transpose(1, 2).reshape(b, t, h * d).data_ptr() == o.data_ptr()
    assert o.transpose(1, 2).is_contiguous()
    do = torch.randn(b, h, t, d, generator=gen)
    dq_ref, dk_ref, dv_ref = torch.autograd.grad(ref, (q64, k64, v64), do.double())
    grad = torch.full((b, t, 3, h, d), float("nan"))
    at._backward_into(saved, do, *grad.permute(2, 0, 3, 1, 4).unbind(0))
    dq, dk, dv = grad.permute(2, 0, 3, 1, 4).unbind(0)
    for got, want in ((dq, dq_ref), (dk, dk_ref), (dv, dv_ref)):
        assert (got.double() - want).abs().max().item() < 1e-4


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
@pytest.mark.parametrize("mag", [1e4, 1e12], ids=["q1e4", "q1e12"])
@pytest.mark.parametrize("opts", [{}, {"causal": True}, {"softcap": 30.0}], ids=["plain", "causal", "softcap"])
def test_tiled_gradients_at_huge_scores(dtype, mag, opts):
    """|q| ~ 1e4 and 1e12 (scores far past 2^24): the tiled spec's dq, dk, dv finite and
    within the check's rule of the float64 reference, as its output is (the fp32 LSE,
    rounded by up to half an ulp of |S|, used to land in exp(S - LSE): fp32 gradients were
    NaN at 1e12). Every row's two largest scores tie (keys 3 and 7 equal and
    aligned with the queries): an fp32 LSE of m + log 2 rounds to m once |m| > 2^24, which
    would give each of them P = 1, not 1/2."""
    q, k, v = SPEC.make_inputs((1, 2, 37, 45, 16), dtype, "cpu", 3)
    u = torch.ones(16) / 4
    q = ((u + 0.1 * q.float()) * mag).to(dtype)
    k[..., 3, :] = k[..., 7, :] = (2 * u).to(dtype)
    v[..., 7, :] = -v[..., 3, :]
    gen = torch.Generator().manual_seed(4)
    do = torch.randn(q.shape, generator=gen).to(dtype)
    xs = [t.clone().requires_grad_() for t in (q, k, v)]
    o = A.attention(*xs, backend="tiled", **opts)
    got = (o, *torch.autograd.grad(o, xs, do))
    x64 = [t.detach().double().requires_grad_() for t in (q, k, v)]
    o64 = SPEC.reference(*x64, **opts)
    want = (o64, *torch.autograd.grad(o64, x64, do.double()))
    xb = [t.clone().requires_grad_() for t in (q, k, v)]
    ob = A.attention(*xb, backend="torch", **opts)
    base = (ob, *torch.autograd.grad(ob, xb, do))
    for name, g, w, b in zip(("o", "dq", "dk", "dv"), got, want, base):
        assert torch.isfinite(g).all(), name
        v_ = judge(g.detach(), w.detach(), dtype, b.detach())
        assert v_.ok, (name, v_.detail)
    # the tied keys' dv (PyTorch's own bf16 error there is large, and so is the bound above)
    dv, dv64 = got[3][..., [3, 7], :].double(), want[3][..., [3, 7], :]
    assert (dv - dv64).abs().max() <= 0.02 * dv64.abs().max(), float((dv - dv64).abs().max() / dv64.abs().max())


@pytest.mark.parametrize("backend", [None, "torch"])
def test_torch_attention_compiles_in_one_graph_with_its_backward(backend):
    """The default inside torch.compile is PyTorch's SDPA (registry.compiled_backend):
    its gradient hooks stay out of the traced graph (fullgraph would raise on a break)."""
    q, k, v = (torch.randn(2, 3, 16, 8, requires_grad=True) for _ in range(3))
    torch._dynamo.reset()
    f = torch.compile(lambda q, k, v: kernellab.attention(q, k, v, causal=True, backend=backend), fullgraph=True)
    out = f(q, k, v)
    out.backward(torch.ones_like(out))
    ref = [t.detach().double().requires_grad_() for t in (q, k, v)]
    want = torch.nn.functional.scaled_dot_product_attention(*ref, is_causal=True)
    want.backward(torch.ones_like(want))
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)
    for t, r in zip((q, k, v), ref):
        torch.testing.assert_close(t.grad.double(), r.grad, rtol=1e-4, atol=1e-5)
