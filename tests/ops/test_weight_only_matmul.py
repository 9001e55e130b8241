"""Weight-only int8 / int4 matmuls: quantize round trip and int4 packing (exact), every
backend that runs here x odd shapes x dtypes against the float64 reference of the
dequantized weight, the split-K and tiled Triton paths, gradients wrt x and bias, bad
inputs named, SQNR, the CUDA kernels compiled (NVRTC), the torchao peer's registration,
and the same on a GPU (marked ``gpu``)."""

from __future__ import annotations

import math

import pytest
import torch

import kernellab
from kernellab.core import registry
from kernellab.harness.check import PASS, check_impl
from kernellab.ops.weight_only_matmul import (
    SPEC,
    SPEC_INT4,
    dequantize_weight,
    pack_int4,
    quantize_weight,
    sqnr,
    unpack_int4,
    wo_reference,
)
from kernellab.ops.weight_only_matmul.triton import WoConfig, triton_wo_fwd
from kltest import backend_matrix, dtype_id, seed_for, shape_id

OPS = {8: ("int8_weight_only_matmul", SPEC), 4: ("int4_weight_only_matmul", SPEC_INT4)}
FN = {8: kernellab.int8_weight_only_matmul, 4: kernellab.int4_weight_only_matmul}
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
# (M, N, K): decode rows, a lone output, K = 0, an odd N, a K past one Triton step, M > 16
SHAPES = [(1, 1, 2), (1, 33, 66), (3, 17, 0), (4, 40, 258), (2, 9, 130), (19, 24, 130)]
MATRIX = {bits: backend_matrix(OPS[bits][0]) for bits in OPS}


def _bound(x, w_q, scales, bits, ref, dtype):
    """Elementwise: two roundings of the output (the torch backend rounds the product, then
    the scaled value) plus 4 ulps of |x| @ |W|^T / sqrt(K), the size of a K-long random dot.
    A wrong weight, nibble or scale is off by whole terms (~|x| |w| each), well above this
    (test_wrong_weights_fail_the_bound)."""
    eps = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-23}[dtype]
    w = dequantize_weight(w_q, scales, bits, torch.float64).abs()
    mag = x.double().abs() @ w.T
    return 2 * eps * ref.abs() + 4 * eps * mag / max(1, x.shape[-1]) ** 0.5


def _case(bits, shape, dtype, dev, seed, bias=True):
    spec = OPS[bits][1]
    x, w_q, s = spec.make_inputs(shape, dtype, dev, seed)
    b = torch.randn(shape[-2], device=dev).to(dtype) if bias else None
    return x, w_q, s, b


# --------------------------------------------------------------------------- quantize


@pytest.mark.parametrize("bits", [8, 4])
def test_quantize_round_trip(bits):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(37, 130, generator=g) * torch.rand(37, 1, generator=g) * 3
    w[5] = 0  # a zero row: scale 1, all zeros
    w_q, s = quantize_weight(w, bits=bits)
    qmax = 127 if bits == 8 else 7
    assert s.dtype == torch.float32 and s.shape == (37,)
    assert w_q.dtype == (torch.int8 if bits == 8 else torch.uint8)
    assert w_q.shape == ((37, 130) if bits == 8 else (37, 65))
    q = w_q if bits == 8 else unpack_int4(w_q)
    assert q.abs().max() <= qmax and (q.abs().amax(1)[torch.arange(37) != 5] == qmax).all()
    assert s[5] == 1 and (q[5] == 0).all()
    err = (dequantize_weight(w_q, s, bits) - w).abs()
    assert (err <= s[:, None] / 2 * (1 + 1e-6)).all()  # within half a step of the grid
    # symmetric: -w quantizes to -w_q, with the same scales
    nq, ns = quantize_weight(-w, bits=bits)
    assert torch.equal(ns, s) and torch.equal(nq if bits == 8 else unpack_int4(nq), -q)
    # bf16 weights too; the result only depends on the values
    wq16, s16 = quantize_weight(w.bfloat16(), bits=bits)
    assert torch.equal(wq16, quantize_weight(w.bfloat16().float(), bits=bits)[0])


def test_int4_packing_is_exact_both_ways():
    q = torch.arange(-8, 8, dtype=torch.int8).repeat(3, 2)  # every value, at even and odd k
    p = pack_int4(q)
    assert p.shape == (3, 16) and p.dtype == torch.uint8
    assert torch.equal(unpack_int4(p), q)
    # low nibble is k = 2j: [-8, -7] -> 0x8 | 0x9 << 4
    assert p[0, 0].item() == 0x98
    every_byte = torch.arange(256, dtype=torch.int32).to(torch.uint8).reshape(4, 64)
    assert torch.equal(pack_int4(unpack_int4(every_byte)), every_byte)


_Q8 = torch.zeros(4, 8, dtype=torch.int8)


@pytest.mark.parametrize(
    "call,arg,exc",
    [
        (lambda: quantize_weight(torch.randn(4, 8), bits=3), "bits", ValueError),
        (lambda: quantize_weight(torch.randn(4, 8), bits=16), "bits", ValueError),
        (lambda: quantize_weight(torch.randn(4, 8), bits=True), "bits", ValueError),
        (lambda: quantize_weight(torch.ones(4, 8, dtype=torch.int32)), "w", TypeError),
        (lambda: quantize_weight([[1.0]]), "w", TypeError),
        (lambda: quantize_weight(torch.randn(8)), "w", ValueError),
        (lambda: quantize_weight(torch.randn(4, 7), bits=4), "odd K", ValueError),
        (lambda: quantize_weight(torch.tensor([[1.0, float("nan")]])), "NaN", ValueError),
        (
            lambda: dequantize_weight(torch.zeros(2, 2, dtype=torch.int8), torch.ones(2), bits=2),
            "bits",
            ValueError,
        ),
        (lambda: pack_int4(torch.full((2, 2), 8, dtype=torch.int8)), "outside", ValueError),
        # a weight quantized with the other bits, the float weight itself, a scale per row
        # shaped (N, 1) or of another length: refused, not broadcast into a wrong weight
        (lambda: dequantize_weight(*quantize_weight(torch.randn(4, 8), bits=4)), "w_q must be torch.int8",
         TypeError),
        (lambda: dequantize_weight(*quantize_weight(torch.randn(4, 8)), bits=4), "w_q must be torch.uint8",
         TypeError),
        (lambda: dequantize_weight(torch.randn(4, 8), torch.ones(4)), "w_q must be", TypeError),
        (lambda: dequantize_weight(_Q8, torch.ones(4, 1)), "scales", ValueError),
        (lambda: dequantize_weight(_Q8, torch.ones(1)), "scales", ValueError),
        (lambda: dequantize_weight(_Q8, [1.0] * 4), "scales", TypeError),
        (lambda: dequantize_weight(_Q8, torch.ones(4), dtype=torch.int8), "dtype", TypeError),
    ],
)
def test_quantize_refuses_bad_arguments(call, arg, exc):
    with pytest.raises(exc, match=arg):
        call()


# --------------------------------------------------------------------------- forward


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@pytest.mark.parametrize("bits", [8, 4])
def test_forward_matches_reference(bits, shape, dtype):
    for dev, backend in [p.values for p in MATRIX[bits]]:
        if dev != "cpu":
            continue
        x, w_q, s, b = _case(bits, shape, dtype, dev, seed_for(bits, shape, dtype))
        y = FN[bits](x, w_q, s, b, backend=backend)
        ref = wo_reference(x.double(), w_q, s.double(), b.double(), bits=bits)
        assert y.dtype == dtype and y.shape == ref.shape, backend
        err = (y.double() - ref).abs()
        assert (err <= _bound(x, w_q, s, bits, ref, dtype) + dtype_eps_floor(dtype)).all(), (
            backend,
            err.max().item(),
        )


def dtype_eps_floor(dtype):
    return {torch.bfloat16: 1e-3, torch.float16: 1e-4, torch.float32: 1e-6}[dtype]


@pytest.mark.parametrize("bits", [8, 4])
def test_wrong_weights_fail_the_bound(bits):
    """The bound above can fail: a weight off by one grid step in a few places, or the
    int4 nibbles swapped, is caught."""
    x, w_q, s, b = _case(bits, (4, 40, 258), torch.bfloat16, "cpu", 3)
    ref = wo_reference(x.double(), w_q, s.double(), b.double(), bits=bits)
    bad = w_q.clone()
    if bits == 8:
        bad[:, ::16] = torch.where(bad[:, ::16] < 0, bad[:, ::16] + 8, bad[:, ::16] - 8)
    else:
        bad = (bad >> 4) | (bad << 4)  # nibbles swapped: k and k + 1 exchanged
    y = FN[bits](x, bad, s, b, backend="manual")
    assert ((y.double() - ref).abs() > _bound(x, w_q, s, bits, ref, torch.bfloat16) + 1e-3).any()


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize(
    "cfg",
    [
        WoConfig("gemv", 1, 16, 64, split_k=3),
        WoConfig("dot", 16, 16, 32, split_k=4),
        WoConfig("dot", 32, 32, 64, split_k=1),
        WoConfig("dot", 16, 64, 128, split_k=2),
    ],
    ids=["gemv-split3", "dot16-split4", "dot32", "dot-wide-split2"],
)
@pytest.mark.parametrize("k", [330, 320], ids=["K330", "K320"])
def test_triton_paths(bits, cfg, k):
    """Every Triton path at shapes that cut tiles and K slices unevenly, and with K a
    multiple of BLOCK_K where there is one (the loop without masks), on the interpreter
    (the launcher's heuristic picks few of them on a CPU)."""
    m = 1 if cfg.kernel == "gemv" else 21
    x, w_q, s, b = _case(bits, (m, 37, k), torch.float16, "cpu", 5)
    y = triton_wo_fwd(x, w_q, s, b, bits, cfg)
    ref = wo_reference(x.double(), w_q, s.double(), b.double(), bits=bits)
    assert ((y.double() - ref).abs() <= _bound(x, w_q, s, bits, ref, torch.float16) + 1e-4).all()


@pytest.mark.parametrize("bits", [8, 4])
def test_leading_dims_layouts_and_bf16_scales(bits):
    """x [B, M, K] (and a transposed x), a transposed w_q, bf16 scales: computed (packed
    first), same as the reference."""
    x, w_q, s, b = _case(bits, (2, 3, 24, 66), torch.bfloat16, "cpu", 7)
    wt = w_q.t().contiguous().t()
    s16 = s.bfloat16()
    for backend in ("manual", "torch", "triton"):
        y = FN[bits](x.transpose(-1, -2).contiguous().transpose(-1, -2), wt, s16, b, backend=backend)
        ref = wo_reference(x.double(), w_q, s16.double(), b.double(), bits=bits)
        assert y.shape == (2, 3, 24)
        assert ((y.double() - ref).abs() <= _bound(x, w_q, s16, bits, ref, torch.bfloat16) + 1e-3).all()


@pytest.mark.parametrize("bits", [8, 4])
def test_specials_propagate(bits):
    x, w_q, s, _ = _case(bits, (3, 16, 64), torch.bfloat16, "cpu", 9)
    x[0, 5] = float("nan")
    x[1, 7] = float("inf")
    ref = wo_reference(x.double(), w_q, s.double(), bits=bits)
    for backend in ("manual", "torch", "triton"):
        y = FN[bits](x, w_q, s, backend=backend)
        assert torch.equal(torch.isnan(y), torch.isnan(ref)), backend
        assert torch.equal(torch.isinf(y), torch.isinf(ref)), backend
        assert torch.isfinite(y[2]).all()


# --------------------------------------------------------------------------- gradients


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("backend", ["manual", "torch", "triton"])
def test_gradient_wrt_x_and_bias(bits, backend):
    x, w_q, s, b = _case(bits, (2, 5, 24, 66), torch.float32, "cpu", 11)
    x.requires_grad_()
    b.requires_grad_()
    dy = torch.randn(2, 5, 24)
    dx, db = torch.autograd.grad(FN[bits](x, w_q, s, b, backend=backend), (x, b), dy)
    x64, b64 = x.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    rx, rb = torch.autograd.grad(wo_reference(x64, w_q, s.double(), b64, bits=bits), (x64, b64), dy.double())
    torch.testing.assert_close(dx.double(), rx, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(db.double(), rb, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("backend", ["manual", "torch", "triton", None])
def test_scales_requiring_grad_are_refused_by_every_backend(bits, backend):
    # the op's contract (its docstring): no backend gives scales a gradient, the reference
    # compositions included; under no_grad such scales are read as constants
    x, w_q, s, _ = _case(bits, (2, 8, 32), torch.float32, "cpu", 0)
    with pytest.raises(RuntimeError, match="scales requires grad"):
        FN[bits](x, w_q, s.clone().requires_grad_(), backend=backend)
    with torch.no_grad():
        torch.testing.assert_close(FN[bits](x, w_q, s.clone().requires_grad_(), backend=backend),
                                   FN[bits](x, w_q, s, backend=backend))  # fmt: skip


# --------------------------------------------------------------------------- bad inputs


def _args(bits=8, shape=(3, 8, 16), dtype=torch.bfloat16):
    x, w_q, s, _ = _case(bits, shape, dtype, "cpu", 0, bias=False)
    return x, w_q, s


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize(
    "change,arg,exc",
    [
        (lambda x, w, s: (x, w.float(), s), "w_q", TypeError),
        (lambda x, w, s: (x, w.to(torch.int16), s), "w_q", TypeError),
        (lambda x, w, s: (x, w, s.to(torch.int32)), "scales", TypeError),
        (lambda x, w, s: (x.double(), w, s), "x", TypeError),
        (lambda x, w, s: (x[..., :-2].contiguous(), w, s), "w_q", ValueError),
        (lambda x, w, s: (x, w, s[:-1]), "scales", ValueError),
        (lambda x, w, s: (x, w.reshape(-1), s), "w_q", ValueError),
        (lambda x, w, s: (x.tolist(), w, s), "x", TypeError),
    ],
    ids=["w_q-float", "w_q-int16", "scales-int", "x-float64", "K-mismatch", "scales-len", "w_q-1d", "x-list"],
)
def test_bad_inputs_name_the_argument(bits, change, arg, exc):
    op = OPS[bits][0]
    args = change(*_args(bits))
    for impl in registry.impls(op):
        if impl.why_unavailable("cpu") is not None or impl.backend == "compile":
            continue
        if (
            arg == "x"
            and exc is TypeError
            and impl.dtypes
            and torch.float64 in impl.dtypes
            and not isinstance(args[0], list)
        ):
            continue  # the reference backends take float64
        with pytest.raises(exc, match=rf"\b{arg}\b"):
            impl(*args)


@pytest.mark.parametrize("bits", [8, 4])
def test_int8_and_int4_weights_are_not_interchangeable(bits):
    x, w_q, s = _args(bits)
    other = kernellab.int4_weight_only_matmul if bits == 8 else kernellab.int8_weight_only_matmul
    with pytest.raises(TypeError, match="w_q has dtype"):
        other(x, w_q, s, backend="torch")


def test_bias_of_the_wrong_length_is_refused():
    x, w_q, s = _args()
    with pytest.raises(ValueError, match="bias"):
        kernellab.int8_weight_only_matmul(x, w_q, s, torch.zeros(9, dtype=x.dtype), backend="triton")


# --------------------------------------------------------------------------- SQNR


def test_sqnr_of_quantized_weights():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(256, 512, generator=g)
    x = torch.randn(8, 512, generator=g)
    y = x @ w.T
    q8 = sqnr(kernellab.int8_weight_only_matmul(x, *quantize_weight(w, 8), backend="manual"), y)
    q4 = sqnr(kernellab.int4_weight_only_matmul(x, *quantize_weight(w, 4), backend="manual"), y)
    assert 33 < q8 < 45 and 12 < q4 < 24 and q8 - q4 > 15  # ~6 dB a bit
    assert sqnr(y, y) == math.inf


# --------------------------------------------------------------------------- the check


@pytest.mark.parametrize("bits", [8, 4])
def test_check_engine_passes_triton(bits):
    rep = check_impl(registry.get(OPS[bits][0], "triton"), torch.bfloat16, device="cpu", quick=True, seed=1)
    assert rep.status == PASS, [(c.kind, c.name, c.detail) for c in rep.failures]


def test_check_engine_rejects_a_kernel_that_forgets_the_scale():
    def no_scale(x, w_q, scales, bias=None):
        return kernellab.int8_weight_only_matmul(x, w_q, torch.ones_like(scales), bias, backend="torch")

    registry.register("int8_weight_only_matmul", "test_no_scale", builtin=False)(no_scale)
    try:
        rep = check_impl(
            registry.get("int8_weight_only_matmul", "test_no_scale"),
            torch.float16,
            device="cpu",
            quick=True,
            seed=2,
        )
        assert rep.status != PASS
    finally:
        registry.unregister("int8_weight_only_matmul", "test_no_scale")


def test_cuda_kernels_compile_with_nvrtc():
    impl = registry.get("int8_weight_only_matmul", "cuda")  # one module holds int8 and int4
    if impl.precompile is None or impl.why_unavailable() not in (None, "no GPU"):
        pytest.skip("NVRTC unavailable")
    lines = impl.precompile(("sm_90",))  # (CI's check compiles sm_80 too)
    assert lines and "cubin" in lines[0]


def test_torchao_peer_is_registered_only_as_an_optional_gpu_backend():
    impl = registry.get("int8_weight_only_matmul", "torchao")
    assert impl.devices == ("cuda",)
    why = impl.why_unavailable("cuda")
    if why is not None and "GPU" not in why:
        assert "torchao" in why
    assert "torchao" not in [i.backend for i in registry.impls("int4_weight_only_matmul")]


# --------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize(
    "shape", [(1, 4096, 1024), (16, 1000, 2048), (64, 512, 4096), (3, 77, 130)], ids=shape_id
)
def test_gpu_every_backend(bits, shape):
    op = OPS[bits][0]
    for dev, backend in [p.values for p in MATRIX[bits]]:
        if dev != "cuda" or registry.get(op, backend).why_unavailable("cuda") is not None:
            continue
        x, w_q, s, b = _case(bits, shape, torch.bfloat16, "cuda", 0)
        y = FN[bits](x, w_q, s, b, backend=backend)
        ref = wo_reference(x.double(), w_q, s.double(), b.double(), bits=bits)
        # the product's roundings scale with the product, not with the biased sum (a bias
        # that cancels it leaves |ref| small), then one rounding of the sum
        prod = ref - b.double()
        bound = _bound(x, w_q, s, bits, prod, torch.bfloat16) + 2.0**-8 * ref.abs() + 1e-3
        if backend == "torchao":  # its weights dequantized to bf16: a rounding per term
            terms = x.double().abs() @ (w_q.double().abs() * s.double().abs()[:, None]).T
            bound = bound + 2.0**-8 * terms
        ratio = float(((y.double() - ref).abs() / bound).max())
        assert ratio <= 1, f"{backend}: error {ratio:.2f}x its bound"


# --------------------------------------------------------------------------- fp32 x (Triton)


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize(
    "shape,cfg",
    [
        ((4, 40, 258), None),  # K = 258: a masked step, two K slices on a GPU
        ((33, 24, 130), None),
        ((1, 96, 520), None),
        ((2, 8, 2048), None),  # K sliced: fp64 partials
        ((1, 37, 330), WoConfig("gemv", 1, 16, 64, split_k=3)),
        ((4, 40, 258), WoConfig("dot", 16, 16, 32, split_k=4)),
    ],
    ids=["4x40x258", "33x24x130", "1x96x520", "2x8x2048-split", "gemv-split3", "dot-split4"],
)
def test_triton_fp32_x_sums_in_fp64(bits, shape, cfg):
    """fp32 x: exact products and fp64 sums, one rounding at the end, so the error is
    within an ulp of the exact result (an fp32 sum along K, as a GPU dot's FMA chain, is
    hundreds of ulps of the result off where the terms cancel)."""
    x, w_q, s, b = _case(bits, shape, torch.float32, "cpu", seed_for(bits, shape, "fp32"))
    y = triton_wo_fwd(x, w_q, s, b, bits, cfg)
    ref = wo_reference(x.double(), w_q, s.double(), b.double(), bits=bits)
    mag = x.double().abs() @ dequantize_weight(w_q, s, bits, torch.float64).abs().T + b.double().abs()
    err = (y.double() - ref).abs()
    assert (err <= 2.0**-23 * ref.abs() + 2.0**-40 * mag).all(), (err / ref.abs()).max().item()


def test_triton_gpu_plans_resolve():
    """The GPU plan table gives a launch for every decode shape class, and K slices only
    where the N tiles leave programs below the plan's count."""
    from kernellab.ops.weight_only_matmul import triton as wt

    for m, n, k, n_sm in [
        (1, 14336, 4096, 132),
        (16, 4096, 14336, 132),
        (5, 4096, 4096, 132),
        (16, 100, 64, 8),
    ]:
        for bits in (8, 4):
            cfg = wt.wo_config(m, n, k, bits, n_sm)
            assert cfg.kernel == ("gemv" if m == 1 else "dot") and cfg.split_k >= 1
            plan = wt.TRITON_PLANS[("gemv" if m == 1 else "dot16", wt.shape_class(n, n_sm))]
            tiles = -(-n // cfg.block_n)
            assert cfg.split_k == 1 or tiles < plan.programs_per_sm * n_sm


# --------------------------------------------------------------------------- cuda_v4 (no GPU)


def _v4_names(kernels, suffixes=("f16", "bf16")):
    from kernellab.ops.weight_only_matmul import cuda as wc

    return [
        f"{wc.V4Config(mt, rt, u, pipe=pipe).kernel}_{d}" for mt, rt, u, pipe in kernels for d in suffixes
    ]


def test_cuda_v4_kernels_compile_for_sm80_and_sm90():
    """Every kernel the v4 launcher can ask for is in the module, for both archs CI checks;
    KL_WO_V4_EXTRA's candidates are not (they would double the compile time)."""
    from kernellab.cuda.runtime import nvrtc_unavailable
    from kernellab.ops.weight_only_matmul import cuda as wc

    if nvrtc_unavailable():
        pytest.skip(nvrtc_unavailable())
    names = _v4_names(wc.V4_KERNELS) + ["wo_v4_reduce_f16", "wo_v4_reduce_bf16"]
    for arch in ("sm_80", "sm_90"):
        cubin = wc.MODULE.compile(arch)
        missing = [nm for nm in names if nm.encode() not in cubin]
        assert not missing, (arch, missing)
        assert not [nm for nm in _v4_names(wc.V4_EXTRA_KERNELS) if nm.encode() in cubin]


@pytest.fixture(scope="module")
def v4_extra_build():
    """wo_matmul.cu as lab/gpu_quant_sweep.py builds it (v4 only, with KL_WO_V4_EXTRA):
    the module, and its sm_90 PTX and cubin."""
    from kernellab.cuda.runtime import Module, nvrtc_unavailable
    from kernellab.ops.weight_only_matmul import cuda as wc

    if nvrtc_unavailable():
        pytest.skip(nvrtc_unavailable())
    mod = Module(wc.MODULE.path, options=("-DKL_WO_V4_ONLY=1", wc.V4_EXTRA_OPTION))
    ptx = mod.compile("sm_90", target="ptx")
    return mod, ptx.decode() if isinstance(ptx, bytes) else ptx, mod.compile("sm_90")


def test_cuda_v4_extra_kernels_compile_without_spills(v4_extra_build):
    """The sweep's build has every default and extra v4 kernel; the extra ones fit the
    launch bounds' 128 registers with no spill (a spill shows as a stack frame and
    LDL / STL, not as LOCAL); the pipelined ones issue the next step's 8 weight loads
    before this step's first mma."""
    import re

    from kernellab.inspect import asm
    from kernellab.ops.weight_only_matmul import cuda as wc

    _, ptx, cubin = v4_extra_build
    extra = _v4_names(wc.V4_EXTRA_KERNELS)
    missing = [nm for nm in _v4_names(wc.V4_KERNELS) + extra if nm.encode() not in cubin]
    assert not missing, missing
    if asm.find_tool("cuobjdump") is None:
        pytest.skip("cuobjdump not found: registers and spills unknown")
    kernels, note = asm.analyze(ptx, cubin, lambda n: n in extra)
    assert len(kernels) == len(extra), note
    for k in kernels:
        assert k.registers <= 128 and k.stack_bytes == 0 and k.counts["LDL_STL"] == 0, k.to_dict()
        if k.name.startswith("wo_v4p_"):
            # the loop: between two HMMAs of consecutive steps, the next step's 8 loads
            # (weights skip L1: LDG...NA, one per 16-byte chunk of a row)
            runs, n = [], 0
            for line in k.sass.splitlines():
                if re.search(r"\bLDG\.E\.NA\b", line):
                    n += 1
                elif "HMMA" in line and n:
                    runs.append(n)
                    n = 0
            assert runs[0] == 16 and max(runs[1:]) == 8, (k.name, runs)


def test_cuda_v4_plans_resolve_to_launches_it_has():
    """Every plan-table entry, at decode shapes on small and large GPUs, resolves to a
    launch the .cu has (compiled (rt, u), <= 512 threads, <= 48 KB shared); K slices stay
    within the plan's blocks per SM and keep a step for each warp along K."""
    from kernellab.ops.weight_only_matmul import cuda as wc

    for m in (1, 3, 8, 9, 16, 40):
        for n, k in [(14336, 4096), (4096, 14336), (4096, 4096), (1000, 1040), (33, 16), (1, 64)]:
            for n_sm in (8, 108, 132):
                cfg = wc.v4_config(m, n, k, n_sm)
                wc.check_v4_config(cfg)
                assert cfg.mt == (8 if m <= 8 else 16)
                plan = wc.V4_PLANS[(cfg.mt, wc.shape_class(n, n_sm))]
                row_blocks = -(-n // cfg.rows)
                if cfg.split > 1:
                    assert row_blocks * cfg.split <= plan.blocks_per_sm * n_sm
                    assert k // cfg.split >= cfg.step * cfg.wk


@pytest.mark.parametrize(
    "field,cfg",
    [
        ("mt", dict(mt=12)),
        ("rt, u", dict(rt=3, u=3)),
        ("pipe", dict(rt=4, u=1, pipe=True)),  # in no build (spills)
        ("KL_WO_V4_EXTRA", dict(rt=2, u=4)),  # in the extra build only
        ("wn x wk", dict(wn=4, wk=8)),
        ("shared memory", dict(rt=4, u=1, wn=4, wk=4)),
        ("split", dict(split=0)),
    ],
)
def test_cuda_v4_config_refused_naming_the_field(field, cfg):
    from kernellab.ops.weight_only_matmul import cuda as wc

    with pytest.raises(ValueError, match=rf"V4Config.*{field}|{field}.*V4Config|V4Config \({field}\)"):
        wc.check_v4_config(wc.V4Config(**{"mt": 16, **cfg}))


def test_cuda_v4_config_extra_kernels_need_the_extra_build():
    """check_v4_config accepts KL_WO_V4_EXTRA's (mt, rt, u, pipe) with a module built with
    it (not with MODULE), and refuses in both what neither builds."""
    from kernellab.cuda.runtime import Module
    from kernellab.ops.weight_only_matmul import cuda as wc

    extra = Module(wc.MODULE.path, options=("-DKL_WO_V4_ONLY=1", wc.V4_EXTRA_OPTION))
    other = Module(wc.MODULE.path, options=("-DKL_WO_HINT=1",))
    assert wc.v4_kernels() == wc.V4_KERNELS == wc.v4_kernels(other)
    assert wc.v4_kernels(extra) == wc.V4_KERNELS + wc.V4_EXTRA_KERNELS
    for mt, rt, u, pipe in wc.V4_EXTRA_KERNELS:
        cfg = wc.V4Config(mt, rt, u, wn=1, wk=4, pipe=pipe)
        wc.check_v4_config(cfg, extra)
        with pytest.raises(ValueError, match=r"V4Config \(mt, rt, u, pipe\) = .* -DKL_WO_V4_EXTRA"):
            wc.check_v4_config(cfg)
        with pytest.raises(ValueError, match="KL_WO_V4_EXTRA"):
            wc.check_v4_config(cfg, other)
    for mt, rt, u, pipe in wc.V4_KERNELS:
        wc.check_v4_config(wc.V4Config(mt, rt, u, pipe=pipe), extra)
    for key in [(16, 4, 1, True), (16, 2, 2, True), (16, 4, 2, False), (8, 2, 4, True), (8, 3, 3, False)]:
        with pytest.raises(ValueError, match=r"V4Config \(mt, rt, u, pipe\) must be one of"):
            wc.check_v4_config(wc.V4Config(*key[:3], pipe=key[3]), extra)
    assert wc.V4Plan(1, 4, 1, 8, pipe=True).config(8, 4096, 4096, 132).pipe


class _FakeV4:
    """Stands in for the compiled v4 kernels on the CPU with their contract (block bx: rows
    [bx * rows, ...), by: K slice [by * KS, ...), bz: x rows [bz * mt, ...); one slice
    writes y = sum * scale + bias, several write fp32 partials [slices, M, N]) and
    asserts the launch the host computed (grid, threads, shared memory)."""

    def __init__(self, name, launches):
        self.name, self.launches = name, launches

    def __call__(self, grid, block, x, w, s, b, y, m, n, k, part, ks, wn, has_bias, shared=0):
        import re

        mt, rt, u = map(int, re.match(r"wo_v4p?_m(\d+)_r(\d+)_u(\d+)", self.name).groups())
        rows, wk = 16 * rt * wn, block // 32 // wn
        self.launches.append((self.name, grid, block, ks))
        assert block % (32 * wn) == 0 and shared == 4 * wk * mt * rows
        gx, gy, gz = grid
        assert (gx - 1) * rows < n <= gx * rows and (gz - 1) * mt < m <= gz * mt
        assert ks % (64 * u) == 0 and (gy - 1) * ks < k <= gy * ks
        for by in range(gy):
            lo, hi = by * ks, min(k, by * ks + ks)
            acc = x[:, lo:hi].double() @ w[:, lo:hi].double().T
            if gy == 1:
                out = acc * s.double() + (b.double() if has_bias else 0)
                y.copy_(out.to(y.dtype))
            else:
                part[by] = acc.float()


class _FakeReduce:
    def __init__(self, launches):
        self.launches = launches

    def __call__(self, grid, block, part, s, b, y, m, n, slices, has_bias, shared=0):
        self.launches.append(("reduce", grid, block, slices))
        assert part.shape == (slices, m, n)
        acc = torch.zeros(m, n)
        for i in range(slices):  # slice order
            acc += part[i]
        y.copy_((acc * s + (b.float() if has_bias else 0)).to(y.dtype))


@pytest.mark.parametrize(
    "shape,cfg",
    [
        ((1, 40, 272), (8, 1, 4, 1, 8, 1)),
        ((16, 33, 4096), (16, 2, 2, 2, 4, 5)),
        ((17, 300, 1040), (16, 4, 1, 1, 4, 3)),
        ((5, 1, 16), (8, 1, 4, 1, 1, 16)),
        ((3, 50, 1040), (8, 2, 2, 1, 4, 2, True)),
        ((16, 70, 2048), (16, 1, 4, 2, 4, 1, True)),
    ],
    ids=["m1", "m16-split5", "m17-two-groups-split3", "n1-one-chunk", "pipe-split2", "pipe-m16"],
)
def test_cuda_v4_launcher_grid_slices_and_partials(monkeypatch, shape, cfg):
    """The v4 host code on the CPU with the kernels replaced by their contract: the grid
    covers N and M, the K slices cover K once (multiples of a step), the partials are
    [slices, M, N] and the reduction runs exactly when K is sliced."""
    from kernellab.ops.weight_only_matmul import cuda as wc

    launches = []

    def fake_kernel(name, dtype, dev, sig):
        return _FakeReduce(launches) if name == "wo_v4_reduce" else _FakeV4(name, launches)

    monkeypatch.setattr(wc, "_kernel", fake_kernel)
    x, w_q, s, b = _case(8, shape, torch.bfloat16, "cpu", 3)
    m, n, k = shape
    y = torch.empty(m, n, dtype=torch.bfloat16)
    config = wc.V4Config(*cfg)
    wc._v4_launch(x, w_q, s, b, y, 1, m, n, k, 0, config)
    ref = wo_reference(x.double(), w_q, s.double(), b.double(), bits=8)
    assert ((y.double() - ref).abs() <= _bound(x, w_q, s, 8, ref, torch.bfloat16) + 1e-3).all()
    sliced = launches[0][1][1] > 1
    pipe = "p" if config.pipe else ""
    assert [e[0] for e in launches] == [f"wo_v4{pipe}_m{config.mt}_r{config.rt}_u{config.u}"] + (
        ["reduce"] if sliced else []
    )


def test_v4_launch_signatures_match_the_compiled_kernels():
    """The launch signatures' parameter sizes equal the PTX entries' (a pointer passed where
    the kernel takes M launched v4 with N = M and wrote one row)."""
    from kernellab.cuda.runtime import check_signature, ptx_param_sizes
    from kernellab.ops.weight_only_matmul import cuda as c

    ptx = c.MODULE.compile("sm_90", target="ptx")
    ptx = ptx.decode() if isinstance(ptx, bytes) else ptx
    for name in _v4_names(c.V4_KERNELS):
        check_signature(name, c._SIG_V4, ptx_param_sizes(ptx, name))
    check_signature("wo_v4_reduce_bf16", c._SIG_V4_REDUCE, ptx_param_sizes(ptx, "wo_v4_reduce_bf16"))
    with pytest.raises(Exception, match="parameter sizes"):
        check_signature(
            "wo_v4_m8_r1_u4_bf16", ("ptr",) * 6 + ("i32",) * 6, ptx_param_sizes(ptx, "wo_v4_m8_r1_u4_bf16")
        )


def test_v4_extra_launch_signatures_match_the_compiled_kernels(v4_extra_build):
    """The same for the extra build's kernels (launched through module=, as the sweep does)."""
    from kernellab.cuda.runtime import check_signature, ptx_param_sizes
    from kernellab.ops.weight_only_matmul import cuda as c

    _, ptx, _ = v4_extra_build
    for name in _v4_names(c.V4_KERNELS + c.V4_EXTRA_KERNELS):
        check_signature(name, c._SIG_V4, ptx_param_sizes(ptx, name))


@pytest.mark.parametrize("op", ["int8_weight_only_matmul", "int4_weight_only_matmul"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_triton_kernels_compile_for_sm90(op, dtype):
    """Triton compiles the launched kernels for a Hopper target without a GPU (the
    interpreter accepts an fp64 tl.dot that the GPU compiler refuses)."""
    from kernellab.inspect import asm

    kernels, note = asm.triton_report(kernellab.get(op, "triton"), dtype, "sm_90")
    assert len(kernels) == 2, note


# --------------------------------------------------------------------------- tma kernel


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=dtype_id)
@pytest.mark.parametrize("kernel", ["tma", "tma_ptr"])
@pytest.mark.parametrize(
    "shape,tiles",
    [
        ((1, 37, 320), (32, 64, 1)),  # decode: one row in a tile of 16, N cut unevenly
        ((17, 40, 336), (16, 64, 3)),  # two M tiles, a masked last step, three K slices
        ((16, 33, 4112), (32, 256, 2)),
        ((5, 1, 16), (16, 16, 1)),  # one output channel, one step
        ((3, 40, 1000), (16, 64, 1)),  # K % 16 != 0: "tma" falls back to the dot kernel
    ],
    ids=["m1", "m17-split3", "m16-split2", "n1", "K1000-fallback"],
)
def test_triton_tma_kernel(kernel, shape, tiles, dtype):
    """The TMA kernel's arithmetic on the interpreter (Triton 3.9's runs tensor
    descriptors, zero-filled past N and K), and the same body with pointer loads."""
    bn, bk, split = tiles
    x, w_q, s, b = _case(8, shape, dtype, "cpu", seed_for(8, shape, dtype))
    y = triton_wo_fwd(x, w_q, s, b, 8, WoConfig(kernel, 16, bn, bk, split_k=split))
    ref = wo_reference(x.double(), w_q, s.double(), b.double(), bits=8)
    assert y.dtype == dtype and y.shape == ref.shape
    err = (y.double() - ref).abs()
    assert (err <= _bound(x, w_q, s, 8, ref, dtype) + dtype_eps_floor(dtype)).all(), err.max().item()


def test_triton_tma_kernel_specials_propagate():
    x, w_q, s, _ = _case(8, (17, 24, 128), torch.bfloat16, "cpu", 9)
    x[0, 5] = float("nan")
    x[16, 7] = float("inf")
    ref = wo_reference(x.double(), w_q, s.double(), bits=8)
    y = triton_wo_fwd(x, w_q, s, None, 8, WoConfig("tma", 16, 16, 64, split_k=2))
    assert torch.equal(torch.isnan(y), torch.isnan(ref)) and torch.equal(torch.isinf(y), torch.isinf(ref))
    assert torch.isfinite(y[1:16]).all()


def test_triton_tma_falls_back_where_tma_cannot_run():
    """TMA's rules (K % 16 == 0, a 16-byte aligned weight) and the kernel's (int8, 16-bit
    x): elsewhere a "tma" launch runs the dot kernel (fp32 x: the GEMV) and is still right."""
    from kernellab.ops.weight_only_matmul.triton import tma_ok

    x, w_q, s, b = _case(8, (2, 24, 160), torch.bfloat16, "cpu", 4)
    assert tma_ok("tma", x, w_q, 8)
    buf = torch.empty(24 * 160 + 1, dtype=torch.int8)
    shifted = buf[1:].view(24, 160)
    shifted.copy_(w_q)
    assert not tma_ok("tma", x, shifted, 8) and tma_ok("tma_ptr", x, shifted, 8)
    assert not tma_ok("tma", x[:, :152], w_q[:, :152].contiguous(), 8)
    assert not tma_ok("tma", x.float(), w_q, 8) and not tma_ok("tma_ptr", x.float(), w_q, 8)
    x4, w4, s4, _ = _case(4, (2, 24, 160), torch.bfloat16, "cpu", 4)
    assert not tma_ok("tma", x4, w4, 4) and not tma_ok("tma_ptr", x4, w4, 4)
    cfg = WoConfig("tma", 16, 16, 64, split_k=2)
    for xx, ww, ss, bits in [(x, shifted, s, 8), (x.float(), w_q, s, 8), (x4, w4, s4, 4)]:
        y = triton_wo_fwd(xx, ww, ss, b.to(xx.dtype), bits, cfg)
        ref = wo_reference(xx.double(), ww, ss.double(), b.double(), bits=bits)
        assert ((y.double() - ref).abs() <= _bound(xx, ww, ss, bits, ref, xx.dtype) + 1e-3).all(), bits


@pytest.mark.parametrize(
    "field,kw",
    [
        ("kind", dict(kind="wgmma")),
        ("block_n", dict(block_n=8, kind="tma")),  # tl.dot needs 16
        ("block_n", dict(block_n=48)),
        ("block_k", dict(block_k=512, kind="tma")),  # a TMA box is at most 256 a dim
        ("warps", dict(warps=3)),
        ("stages", dict(stages=0)),
        ("stages", dict(block_n=256, block_k=256, stages=4, kind="tma")),  # 288 KB of shared memory
        ("programs_per_sm", dict(programs_per_sm=-1)),
    ],
)
def test_triton_plan_refused_naming_the_field(field, kw):
    from kernellab.ops.weight_only_matmul.triton import TritonPlan

    with pytest.raises(ValueError, match=rf"TritonPlan\.{field}\b"):
        TritonPlan(**{"block_n": 64, "block_k": 256, **kw})


def test_triton_plans_can_name_the_tma_kernel(monkeypatch):
    """A TRITON_PLANS entry of kind "tma" (as the sweep prints it) makes the launcher's
    config a "tma" launch for its class, M tiles of 16, K sliced by programs_per_sm."""
    from kernellab.ops.weight_only_matmul import triton as wt

    plan = wt.TritonPlan(block_n=64, block_k=256, warps=4, stages=6, programs_per_sm=2, kind="tma")
    assert eval(repr(plan), {"TritonPlan": wt.TritonPlan}) == plan  # pasteable
    wt.wo_config.cache_clear()
    monkeypatch.setitem(wt.TRITON_PLANS, ("gemv", "short"), plan)
    monkeypatch.setitem(wt.TRITON_PLANS, ("dot16", "short"), plan)
    try:
        for m in (1, 16):
            cfg = wt.wo_config(m, 4096, 14336, 8, 132)
            assert cfg == wt.WoConfig("tma", 16, 64, 256, 5, 4, 6), cfg  # 64 tiles x 5 slices
        assert wt.wo_config(1, 14336, 4096, 8, 132).kernel == "gemv"  # the other class keeps its plan
    finally:
        wt.wo_config.cache_clear()


def test_triton_tma_kernel_compiles_for_sm90_to_tma_and_wgmma(tmp_path):
    """Ahead of time for an H100 / H200 (no GPU): the weight tiles load with bulk tensor
    copies (TMA) on mbarriers, pipelined, and the product is a wgmma."""
    import os
    import subprocess
    import sys

    code = f"""
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kernellab.ops.weight_only_matmul import triton as wt
fn = wt._wo_tma_kernel
sig = {{"x_ptr": "*bf16", "w_ptr": "*i8", "s_ptr": "*fp32", "b_ptr": "*bf16", "y_ptr": "*bf16",
        "p_ptr": "*fp32", "M": "i32", "N": "i32", "K": "i32", "K_SPLIT": "i32"}}
cx = dict(HAS_BIAS=True, PARTIAL=False, UPCAST=False, TMA=True, BLOCK_M=16, BLOCK_N=64,
          BLOCK_K=256, EVEN_K=True)
sig.update({{c: "constexpr" for c in cx}})
attrs = {{(i,): [["tt.divisibility", 16]] for i, n in enumerate(sig) if sig[n] != "constexpr"}}
out = None
for c in (cx, {{(fn.arg_names.index(k),): v for k, v in cx.items()}}):  # by name (3.9), by index (3.6)
    try:
        out = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=c, attrs=attrs),
                             target=GPUTarget("cuda", 90, 32), options={{"num_warps": 4, "num_stages": 6}})
        break
    except Exception as e:
        err = e
if out is None:
    raise err
open({str(tmp_path / "k.ptx")!r}, "w").write(out.asm["ptx"])
"""
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    ptx = (tmp_path / "k.ptx").read_text()
    assert "cp.async.bulk.tensor" in ptx and "mbarrier" in ptx and "wgmma.mma_async" in ptx
    assert ptx.count("cp.async.bulk.tensor") >= 5  # the prologue's stages - 1 tiles and the loop's


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=dtype_id)
@pytest.mark.parametrize(
    "shape,cfg",
    [
        ((1, 4096, 4096), WoConfig("tma", 16, 64, 256, 1, 4, 6)),
        ((16, 1000, 14336), WoConfig("tma", 16, 128, 128, 5, 4, 8)),
        ((17, 77, 1040), WoConfig("tma", 16, 64, 256, 2, 4, 4)),  # masked last step, two M tiles
        ((3, 40, 1000), WoConfig("tma", 16, 64, 128, 1, 4, 8)),  # K % 16 != 0: the dot kernel
    ],
    ids=["1x4096x4096", "16x1000x14336-split5", "17x77x1040-split2", "3x40x1000-fallback"],
)
def test_gpu_tma_kernel(shape, cfg, dtype):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    x, w_q, s, b = _case(8, shape, dtype, "cuda", 0)
    y = triton_wo_fwd(x, w_q, s, b, 8, cfg)
    ref = wo_reference(x.double(), w_q, s.double(), b.double(), bits=8)
    prod = ref - b.double()
    bound = _bound(x, w_q, s, 8, prod, dtype) + 2.0**-8 * ref.abs() + 1e-3
    ratio = float(((y.double() - ref).abs() / bound).max())
    assert ratio <= 1, f"error {ratio:.2f}x its bound"


# --------------------------------------------------------------------------- v5 (KL_WO_V5)


def _v5_names(suffixes=("f16", "bf16")):
    from kernellab.ops.weight_only_matmul import cuda as wc

    return [f"{wc.V5Config(mt, rt).kernel}_{d}" for mt, rt in wc.V5_KERNELS for d in suffixes]


@pytest.fixture(scope="module")
def v5_build():
    """wo_matmul.cu as lab/gpu_quant_sweep.py builds it for v5: the module, and its sm_90
    PTX and cubin."""
    from kernellab.cuda.runtime import Module, nvrtc_unavailable
    from kernellab.ops.weight_only_matmul import cuda as wc

    if nvrtc_unavailable():
        pytest.skip(nvrtc_unavailable())
    mod = Module(wc.MODULE.path, options=("-DKL_WO_V4_ONLY=1", wc.V5_OPTION))
    ptx = mod.compile("sm_90", target="ptx")
    return mod, ptx.decode() if isinstance(ptx, bytes) else ptx, mod.compile("sm_90")


def test_cuda_v5_kernels_compile_for_sm90_without_spills(v5_build):
    """The v5 build has every kernel V5_KERNELS names (and the default build none); each
    streams by bulk copies into an mbarrier ring and fits its launch bounds (288 threads)
    with no spill (a stack frame, LDL / STL)."""
    from kernellab.inspect import asm
    from kernellab.ops.weight_only_matmul import cuda as wc

    _, ptx, cubin = v5_build
    names = _v5_names()
    assert not [nm for nm in names if nm.encode() not in cubin]
    assert b"wo_v5_" not in wc.MODULE.compile("sm_90")
    for nm in names:
        body = ptx[ptx.index(f".entry {nm}(") :]
        body = body[: body.find(".entry", 10)]
        for op in (
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes",
            "mbarrier.try_wait.parity",
        ):
            assert op in body, (nm, op)
        assert "mma.sync.aligned.m16n8k16" in body and "ld.shared.v4" in body, nm
    if asm.find_tool("cuobjdump") is None:
        pytest.skip("cuobjdump not found: registers and spills unknown")
    kernels, note = asm.analyze(ptx, cubin, lambda n: n in names)
    assert len(kernels) == len(names), note
    for k in kernels:
        assert k.registers <= 65536 // 288 and k.stack_bytes == 0 and k.counts["LDL_STL"] == 0, k.to_dict()


def test_v5_launch_signatures_match_the_compiled_kernels(v5_build):
    from kernellab.cuda.runtime import check_signature, ptx_param_sizes
    from kernellab.ops.weight_only_matmul import cuda as c

    _, ptx, _ = v5_build
    for name in _v5_names():
        check_signature(name, c._SIG_V5, ptx_param_sizes(ptx, name))
    check_signature("wo_v4_reduce_bf16", c._SIG_V4_REDUCE, ptx_param_sizes(ptx, "wo_v4_reduce_bf16"))


class _V5Module:
    """Stands in for the v5 build: its options, and kernels that keep v5's contract."""

    def __init__(self, launches):
        from kernellab.ops.weight_only_matmul import cuda as wc

        self.options = ("-DKL_WO_V4_ONLY=1", wc.V5_OPTION)
        self.launches = launches

    def kernel(self, name, sig, dev=None):
        return _FakeReduce(self.launches) if name.startswith("wo_v4_reduce") else _FakeV5(name, self.launches)


class _FakeV5:
    """v5's contract on the CPU (block bx: row tiles bx, bx + gridDim.x, ...; by: K slice
    [by * KS, ...) with KS a multiple of kc; bz: x rows [bz * mt, ...)); asserts the launch
    (grid, threads, shared memory opt-in)."""

    def __init__(self, name, launches):
        self.name, self.launches = name, launches
        self.max_dynamic_shared = 48 * 1024

    def set_max_dynamic_shared(self, nbytes):
        self.max_dynamic_shared = max(self.max_dynamic_shared, nbytes)

    def __call__(self, grid, block, x, w, s, b, y, m, n, k, part, ks, kc, stages, has_bias, shared=0):
        import re

        mt, rt = map(int, re.match(r"wo_v5_m(\d+)_r(\d+)", self.name).groups())
        rows, warps = 16 * rt, block // 32 - 1
        self.launches.append((self.name, grid, block, ks))
        assert shared <= self.max_dynamic_shared and warps >= 1 and kc % 128 == 0 and ks % kc == 0
        assert shared == 128 + 4 * warps * mt * rows + stages * (
            -(-(rows * kc + 64) // 128) * 128 + -(-(mt * (2 * kc + 16)) // 128) * 128
        )
        gx, gy, gz = grid
        tiles = -(-n // rows)
        assert 1 <= gx <= tiles and (gy - 1) * ks < k <= gy * ks and (gz - 1) * mt < m <= gz * mt
        seen = sorted(t for bx in range(gx) for t in range(bx, tiles, gx))
        assert seen == list(range(tiles))
        for by in range(gy):
            lo, hi = by * ks, min(k, by * ks + ks)
            acc = x[:, lo:hi].double() @ w[:, lo:hi].double().T
            if gy == 1:
                y.copy_((acc * s.double() + (b.double() if has_bias else 0)).to(y.dtype))
            else:
                part[by] = acc.float()


@pytest.mark.parametrize(
    "shape,cfg",
    [
        ((1, 40, 272), (8, 2, 128, 2, 2, 1, 0)),
        ((16, 33, 4096), (16, 4, 512, 3, 8, 3, 0)),
        ((17, 300, 1040), (16, 2, 256, 4, 4, 1, 3)),
        ((5, 1, 16), (8, 8, 512, 2, 8, 1, 0)),
    ],
    ids=["m1", "m16-split3", "m17-persistent", "n1"],
)
def test_cuda_v5_launcher_grid_slices_and_partials(shape, cfg):
    from kernellab.ops.weight_only_matmul import cuda as wc

    launches = []
    x, w_q, s, b = _case(8, shape, torch.bfloat16, "cpu", 3)
    m, n, k = shape
    y = torch.empty(m, n, dtype=torch.bfloat16)
    config = wc.V5Config(*cfg)
    wc.check_v5_config(config, _V5Module(launches))
    wc._v5_launch(x, w_q, s, b, y, 1, m, n, k, 0, config, _V5Module(launches))
    ref = wo_reference(x.double(), w_q, s.double(), b.double(), bits=8)
    assert ((y.double() - ref).abs() <= _bound(x, w_q, s, 8, ref, torch.bfloat16) + 1e-3).all()
    sliced = launches[0][1][1] > 1
    assert [e[0] for e in launches] == [f"wo_v5_m{config.mt}_r{config.rt}_bf16"] + (
        ["reduce"] if sliced else []
    )


@pytest.mark.parametrize(
    "field,cfg",
    [
        ("mt", dict(mt=12)),
        ("rt", dict(rt=3)),
        ("kc", dict(kc=192)),
        ("kc", dict(kc=64)),
        ("warps", dict(warps=9)),
        ("warps", dict(kc=128, warps=4)),
        ("stages", dict(stages=1)),
        ("shared memory", dict(rt=8, kc=1024, stages=2)),
        ("split", dict(split=0)),
        ("grid", dict(grid=-1)),
    ],
)
def test_cuda_v5_config_refused_naming_the_field(field, cfg):
    from kernellab.cuda.runtime import Module
    from kernellab.ops.weight_only_matmul import cuda as wc

    mod = Module(wc.MODULE.path, options=("-DKL_WO_V4_ONLY=1", wc.V5_OPTION))
    with pytest.raises(ValueError, match=rf"V5Config\.{field}|V5Config.*{field}"):
        wc.check_v5_config(wc.V5Config(**{"mt": 16, **cfg}), mod)
    wc.check_v5_config(wc.V5Config(16), mod)


def test_cuda_v5_needs_its_build_a_config_and_sm90(monkeypatch):
    """v5 is launched only with a V5Config and a module built with V5_OPTION, and refuses
    GPUs before sm_90 with a message that says so."""
    from kernellab.ops.weight_only_matmul import cuda as wc

    x, w_q, s, b = _case(8, (1, 16, 256), torch.bfloat16, "cpu", 3)
    with pytest.raises(ValueError, match="KL_WO_V5"):
        wc.check_v5_config(wc.V5Config(8))
    with pytest.raises(ValueError, match="KL_WO_V5"):
        wc.cuda_wo_fwd(x, w_q, s, b, 8, "v5", config=wc.V5Config(8), module=wc.MODULE)
    with pytest.raises(ValueError, match="V5Config"):
        wc.cuda_wo_fwd(x, w_q, s, b, 8, "v5", config=wc.V4Config(8))
    assert wc.v5_unavailable((9, 0)) is None and wc.v5_unavailable((10, 0)) is None
    assert "sm_90" in wc.v5_unavailable((8, 9)) and "sm_89" in wc.v5_unavailable((8, 9))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda dev=None: (8, 0))
    y = torch.empty(1, 16, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="needs sm_90 .* this GPU is sm_80"):
        wc._v5_launch(x, w_q, s, b, y, 1, 1, 16, 256, 0, wc.V5Config(8), _V5Module([]))
