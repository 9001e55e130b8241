"""conv2d: every backend that runs here x edge shapes (1x1 images, odd sizes, batch 1,
channels not a multiple of 8, kernels 1 / 3 / 5, stride 1 / 2, padding 0 / 1 / 2) x
dtypes, forward and the three gradients (dx, dw, dbias) against the float64 reference,
judged by the 2 x PyTorch rule; layouts (channels_last, sliced, transposed x); bad
inputs; the check engine passes our backends and rejects planted mistakes; custom ops
(opcheck, torch.compile); the CUDA source compiles; GPU cases (marked ``gpu``)."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

import kernellab
from kernellab.core import registry
from kernellab.harness.check import FAIL, PASS, REFUSED, check_impl
from kernellab.harness.compare import judge
from kltest import DTYPES, check_planted, cpu_backends, cuda_backends, dtype_id, seed_for

OP = "conv2d"
SPEC = kernellab.get_spec(OP)
CPU = cpu_backends(OP)

# (N, C, H, W, K, R, S), stride, padding
CASES = [
    ((1, 1, 1, 1, 1, 1, 1), 1, 0),  # 1x1 image, 1x1 kernel
    ((2, 3, 1, 1, 4, 3, 3), 1, 1),  # 1x1 image, 3x3 kernel through the padding alone
    ((1, 3, 5, 7, 4, 3, 3), 1, 0),  # batch 1, odd sizes
    ((2, 5, 9, 8, 6, 5, 5), 1, 2),  # kernel 5, padding 2
    ((2, 17, 6, 5, 9, 1, 1), 2, 0),  # channels not a multiple of 8, 1x1 kernel, stride 2
    ((3, 1, 12, 12, 8, 3, 3), 1, 1),  # the MNIST model's first layer, small
    ((2, 9, 7, 9, 33, 3, 3), 2, 1),  # stride 2 on odd sizes, K past one tile
    ((1, 2, 6, 7, 3, 3, 5), (2, 1), (1, 2)),  # pairs: a non-square kernel
]


def _case_id(case):
    shape, st, pd = case
    return f"{'x'.join(map(str, shape))}-s{st}-p{pd}".replace(" ", "")


def _grads(fn, args, dy, wrt):
    leaves = [
        a.detach().clone().requires_grad_(i in wrt) if a is not None else None for i, a in enumerate(args)
    ]
    out = fn(*leaves)
    return torch.autograd.grad(out, [leaves[i] for i in wrt], dy)


def _f64(args):
    return [a.double() if a is not None else None for a in args]


def assert_fwd_bwd(backend, args, dtype, stride=1, padding=0, seed=0, dy=None, x_grad=True):
    """Forward, dx, dw (and dbias) of ``backend`` within the check's bound of float64
    (2 x PyTorch's error + one ulp; PyTorch's own backend: the documented tolerance).
    ``x_grad=False``: x needs no gradient (a network's first layer), only dw and dbias."""
    x, w, b = args
    opts = dict(stride=stride, padding=padding)
    wrt = ([0] if x_grad else []) + [1] + ([2] if b is not None else [])
    torch_fn = kernellab.get(OP, "torch").fn
    y = kernellab.conv2d(x, w, b, backend=backend, **opts)
    base = torch_fn(x, w, b, **opts) if backend != "torch" else None
    v = judge(y, SPEC.ref(x, w, b, **opts), dtype, base)
    assert v.ok, f"{backend} forward: {v.detail} (err {v.err:.3g}, bound {v.bound:.3g})"
    if dy is None:
        gen = torch.Generator(device=x.device).manual_seed(seed)
        dy = torch.randn(y.shape, generator=gen, device=x.device).to(dtype)
    got = _grads(lambda *a: kernellab.conv2d(*a, backend=backend, **opts), args, dy, wrt)
    ref = _grads(lambda *a: F.conv2d(*a, **opts), _f64(args), dy.double(), wrt)
    bgr = _grads(lambda *a: torch_fn(*a, **opts), args, dy, wrt) if backend != "torch" else [None] * 3
    names = [("dx", "dw", "dbias")[i] for i in wrt]
    for name, g, r, bb in zip(names, got, ref, bgr):
        assert g.shape == r.shape and g.dtype == dtype, f"{name}: {g.shape} {g.dtype}"
        v = judge(g, r, dtype, bb)
        assert v.ok, f"{backend} {name}: {v.detail} (err {v.err:.3g}, bound {v.bound:.3g})"


def _matrix():
    out = []
    for backend in CPU:
        for dtype in DTYPES:
            if backend == "torch" and dtype != torch.float32:
                continue  # PyTorch is the bound itself; its 16-bit CPU kernels are not ours to test
            for case in CASES:
                ids = f"{backend}-{dtype_id(dtype)}-{_case_id(case)}"
                out.append(pytest.param(backend, dtype, case, id=ids))
    return out


def test_backends_here():
    assert {"manual", "torch", "triton", "fft"} <= set(CPU)
    assert {"cuda", "cuda_v1", "cuda_v2", "cuda_v4"} <= set(cuda_backends(OP))
    assert registry.get(OP, "cuda_v4").dtypes == (torch.float16, torch.bfloat16)


@pytest.mark.parametrize("backend,dtype,case", _matrix())
def test_forward_and_gradients(backend, dtype, case):
    shape, stride, padding = case
    seed = seed_for(backend, dtype, case)
    assert_fwd_bwd(backend, SPEC.make_inputs(shape, dtype, "cpu", seed), dtype, stride, padding, seed)


@pytest.mark.parametrize("backend", [b for b in CPU if b != "torch"])
def test_without_bias_and_empty_batch(backend):
    x, w, _ = SPEC.make_inputs((2, 3, 6, 5, 4, 3, 3), torch.float32, "cpu", 1)
    assert_fwd_bwd(backend, (x, w, None), torch.float32, stride=2, padding=1)
    x0, w0, b0 = SPEC.make_inputs((0, 3, 5, 5, 4, 3, 3), torch.float32, "cpu", 2)
    y = kernellab.conv2d(x0, w0, b0, padding=1, backend=backend)
    assert y.shape == (0, 4, 5, 5)


@pytest.mark.parametrize("backend", [b for b in CPU if b != "torch"])
def test_first_layer_input_without_gradient(backend):
    """Images need no gradient: the backward returns dw and dbias only (the custom-op
    backends skip the dgrad GEMM), and they match the case where x has one."""
    x, w, b = SPEC.make_inputs((3, 1, 12, 12, 8, 3, 3), torch.float32, "cpu", 4)
    assert_fwd_bwd(backend, (x, w, b), torch.float32, padding=1, x_grad=False)
    wl, bl = w.clone().requires_grad_(), b.clone().requires_grad_()
    kernellab.conv2d(x, wl, bl, padding=1, backend=backend).square().sum().backward()
    assert x.grad is None and wl.grad is not None and bl.grad is not None


LAYOUTS = {
    "channels_last": lambda t: t.contiguous(memory_format=torch.channels_last),
    "sliced": lambda t: torch.stack([t, t.roll(1, -1)], -1).flatten(-2)[..., ::2],
    "transposed": lambda t: t.transpose(-1, -2).contiguous().transpose(-1, -2),
    "offset": lambda t: torch.cat([t.new_zeros(1), t.flatten()])[1:].view(t.shape),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("backend", [b for b in CPU if b != "torch"])
def test_layouts(backend, layout):
    """x, then w, in each layout (the values unchanged): computed as for contiguous."""
    x, w, b = SPEC.make_inputs((2, 3, 7, 6, 5, 3, 3), torch.float32, "cpu", seed_for(backend, layout))
    xl = LAYOUTS[layout](x)
    assert torch.equal(xl, x) and (layout == "offset" or not xl.is_contiguous())
    assert_fwd_bwd(backend, (xl, w, b), torch.float32, padding=1)
    assert_fwd_bwd(backend, (x, LAYOUTS[layout](w), b), torch.float32, stride=2)


@pytest.mark.parametrize("backend", [b for b in CPU if b != "torch"])
def test_strided_grad_output(backend):
    x, w, b = SPEC.make_inputs((2, 3, 6, 6, 4, 3, 3), torch.float32, "cpu", 7)
    gen = torch.Generator().manual_seed(seed_for(backend, "strided dy"))
    dy = torch.randn(2, 4, 6, 12, generator=gen)[..., ::2]  # non-contiguous dy of the output's shape
    assert_fwd_bwd(backend, (x, w, b), torch.float32, padding=1, dy=dy)


@pytest.mark.parametrize("nhwc", [False, True], ids=["as-given", "nhwc-copies"])
def test_triton_taps_read_dy_at_its_strides(nhwc, monkeypatch):
    """The tap kernels (C 16) take dy at any strides, no contiguous copy first: a sliced dy
    and a channels_last one, read as they are and through TAPS_NHWC's copies."""
    from kernellab.ops.conv2d import triton as kt

    on = {(kern, torch.float32): 0 for kern in ("fwd", "dgrad", "wgrad")}
    monkeypatch.setattr(kt, "TAPS_NHWC", on if nhwc else {})
    x, w, b = SPEC.make_inputs((2, 16, 5, 6, 5, 3, 3), torch.float32, "cpu", 8)
    gen = torch.Generator().manual_seed(9)
    sliced = torch.randn(2, 5, 5, 12, generator=gen)[..., ::2]
    cl = torch.randn(2, 5, 5, 6, generator=gen).contiguous(memory_format=torch.channels_last)
    for dy in (sliced, cl):
        assert not dy.is_contiguous()
        assert_fwd_bwd("triton", (x, w, b), torch.float32, padding=1, dy=dy)


@pytest.mark.parametrize("backend", ["triton", "manual"])
def test_nan_and_inf_propagate_like_the_reference(backend):
    x, w, b = SPEC.make_inputs((1, 2, 6, 6, 3, 3, 3), torch.float32, "cpu", 3)
    x[0, 0, 1, 1] = float("nan")
    x[0, 1, 4, 4] = float("inf")
    y = kernellab.conv2d(x, w, b, padding=1, backend=backend)
    v = judge(y, SPEC.ref(x, w, b, padding=1), torch.float32)
    assert v.ok and torch.isnan(y).any(), v.detail


def test_fft_refuses_non_finite_inputs():
    x, w, b = SPEC.make_inputs((1, 2, 6, 6, 3, 3, 3), torch.float32, "cpu", 3)
    x[0, 0, 1, 1] = float("inf")
    with pytest.raises(ValueError, match="non-finite"):
        kernellab.conv2d(x, w, b, backend="fft")


def test_bad_inputs_name_the_argument():
    x, w = torch.randn(2, 3, 6, 6), torch.randn(4, 3, 3, 3)
    cases = [
        ((x[0], w), {}, ValueError, r"\bx\b"),  # wrong rank
        ((x, w[..., 0]), {}, ValueError, r"\bw\b"),
        ((x, torch.randn(4, 5, 3, 3)), {}, ValueError, r"\bw\b.*channels"),  # x C vs w C
        ((x, w, torch.zeros(3)), {}, ValueError, r"\bbias\b"),
        ((x, w), {"padding": -1}, ValueError, r"\bpadding\b"),
        ((x, w), {"padding": (1, -2)}, ValueError, r"\bpadding\b"),
        ((x, w), {"stride": 0}, ValueError, r"\bstride\b"),
        ((x, w), {"stride": (1, 2, 3)}, TypeError, r"\bstride\b"),
        ((torch.randn(2, 3, 2, 2), w), {}, ValueError, r"\bw\b.*larger"),  # kernel > padded input
        ((x, w.half()), {}, TypeError, r"\bw\b"),  # dtype mismatch
        ((x.double(), w.double()), {}, TypeError, r"\bx\b"),
        ((x, w, torch.zeros(4, dtype=torch.float16)), {}, TypeError, r"\bbias\b"),
    ]
    for backend in ("triton", "torch", "manual", "fft"):
        for args, kw, exc, pattern in cases:
            if backend in ("torch", "manual") and args[0].dtype == torch.float64:
                # the reference backends take float64 (gradcheck runs through them)
                assert kernellab.conv2d(*args, **kw, backend=backend).dtype == torch.float64
                continue
            with pytest.raises(exc, match=pattern):
                kernellab.conv2d(*args, **kw, backend=backend)
    # a kernel that fits once padded is fine
    assert kernellab.conv2d(torch.randn(1, 3, 2, 2), w, padding=1, backend="triton").shape == (1, 4, 2, 2)
    for backend in ("cuda", "cuda_v1", "cuda_v2"):
        with pytest.raises(ValueError, match=r"\bx\b is on cpu.*cuda"):  # CPU tensor to a GPU-only backend
            kernellab.conv2d(x, w, backend=backend)


@pytest.mark.parametrize("backend", ["triton", "manual", "fft"])
def test_check_engine_passes(backend):
    impl = registry.get(OP, backend)
    rep = check_impl(impl, torch.float32, device="cpu", quick=True, opcheck=True, seed=1)
    assert rep.status == PASS, [(c.kind, c.name, c.detail) for c in rep.failures]
    if backend == "fft":  # the specials case is refused, by design (see reference.py)
        assert any(c.kind == "special" and c.status == REFUSED for c in rep.cases)


def test_check_engine_passes_triton_bf16():
    impl = registry.get(OP, "triton")
    rep = check_impl(impl, torch.bfloat16, device="cpu", quick=True, opcheck=False, seed=2)
    assert rep.status == PASS, [(c.kind, c.name, c.detail) for c in rep.failures]


# Planted mistakes, each caught by some stage of the check.
class _WrongDW(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b, stride, padding):
        ctx.save_for_backward(x, w)
        ctx.geom = (stride, padding)
        return F.conv2d(x, w, b, stride=stride, padding=padding)

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        st, pd = ctx.geom
        dx = torch.nn.grad.conv2d_input(x.shape, w, dy, stride=st, padding=pd)
        dw = torch.nn.grad.conv2d_weight(x, w.shape, dy, stride=st, padding=pd).flip(-1, -2)  # flipped
        return dx, dw, dy.sum((0, 2, 3)), None, None


PLANTED = {
    # a true convolution (flipped filter) instead of PyTorch's cross-correlation
    "flipped_filter": lambda x, w, b=None, stride=1, padding=0: F.conv2d(
        x, w.flip(-1, -2), b, stride, padding
    ),
    "ignores_bias": lambda x, w, b=None, stride=1, padding=0: F.conv2d(x, w, None, stride, padding),
    # every window read one column to the left (a wrong base address)
    "shifted_window": lambda x, w, b=None, stride=1, padding=0: F.conv2d(
        x.roll(1, -1), w, b, stride, padding
    ),
    "wrong_dw": lambda x, w, b=None, stride=1, padding=0: _WrongDW.apply(x, w, b, stride, padding),
}


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_planted_mistakes_are_rejected(name):
    rep = check_planted(OP, name, PLANTED[name], seed=3, opcheck=False)
    assert rep.status == FAIL, f"planted {name} passed the check"


@pytest.mark.slow  # 10-16 s of Inductor on the CPU
def test_compile_backend_quick():
    x, w, b = SPEC.make_inputs((2, 3, 6, 6, 4, 3, 3), torch.float32, "cpu", 6)
    torch.testing.assert_close(
        kernellab.conv2d(x, w, b, padding=1, backend="compile"),
        F.conv2d(x, w, b, padding=1),
        rtol=1e-5,
        atol=1e-5,
    )


def test_backward_without_dx_under_opcheck_and_compile():
    """The backward op's need_dx=False form (x needs no gradient): its fake kernel agrees
    with the real one (opcheck), and a compiled first layer gets w's and bias's gradients
    right with x left without one."""
    from kernellab.ops.conv2d.triton import conv2d_triton

    bwd = [op for op, _, _ in conv2d_triton.custom_ops if "backward" in str(op)][0]
    x, w, _ = SPEC.make_inputs((2, 1, 6, 5, 4, 3, 3), torch.float32, "cpu", 5)
    dy = torch.randn(2, 4, 6, 5, generator=torch.Generator().manual_seed(5))
    dx, dw, db = bwd(dy, x, w, False, 1, 1, 1, 1)
    assert dx.numel() == 0 and dw.shape == w.shape and db.shape == (4,)
    torch.library.opcheck(bwd, (dy, x, w, False, 1, 1, 1, 1))
    f = torch.compile(lambda x, w, b: kernellab.conv2d(x, w, b, 1, 1, backend="triton") * 2,
                      fullgraph=True, backend="aot_eager")  # fmt: skip
    b = torch.randn(4)
    wl, bl = w.clone().requires_grad_(), b.clone().requires_grad_()
    f(x, wl, bl).sum().backward()
    wr, br = w.clone().requires_grad_(), b.clone().requires_grad_()
    (F.conv2d(x, wr, br, padding=1) * 2).sum().backward()
    assert x.grad is None
    torch.testing.assert_close(wl.grad, wr.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(bl.grad, br.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", ["triton"])
def test_forward_saving_with_detached_inputs_returns_every_gradient(backend):
    """A fused caller hands forward_saving detached tensors and owns the backward: dx,
    dw and dbias all come back (skipping dx is for autograd, where x says it needs none)."""
    fn = kernellab.get(OP, backend).fn
    x, w, b = SPEC.make_inputs((2, 3, 6, 5, 4, 3, 3), torch.float32, "cpu", 8)
    y, saved = fn.forward_saving(x, w, b, 1, 1, 1, 1)
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(8))
    g = fn.backward_from(saved, dy)
    ref = _grads(lambda *a: F.conv2d(*a, padding=1), _f64((x, w, b)), dy.double(), [0, 1, 2])
    for got, want in zip(g[:3], ref):
        torch.testing.assert_close(got, want.float(), rtol=1e-4, atol=1e-5)


def test_triton_under_torch_compile_fullgraph():
    x, w, b = SPEC.make_inputs((2, 3, 6, 5, 4, 3, 3), torch.float32, "cpu", 4)
    f = torch.compile(
        lambda x, w, b: kernellab.conv2d(x, w, b, 2, 1, backend="triton") * 2,
        fullgraph=True,
        backend="aot_eager",
    )
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    f(*leaves).sum().backward()
    ref = [t.clone().requires_grad_() for t in (x, w, b)]
    (F.conv2d(*ref, stride=2, padding=1) * 2).sum().backward()
    for a, r in zip(leaves, ref):
        torch.testing.assert_close(a.grad, r.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "case,layout",
    [
        (((2, 20, 6, 6, 5, 5, 5), 1, 2), "contiguous"),  # the tap forward, fp32 block sums
        (((1, 16, 9, 8, 6, 3, 3), (2, 1), (1, 2)), "channels_last"),
        (((1, 130, 4, 3, 3, 3, 3), 1, 1), "contiguous"),  # C R S 1170: fp64 block sums
        (((2, 4, 7, 9, 3, 3, 1), (3, 2), (0, 1)), "contiguous"),  # the spread dgrad, strided
        (((2, 3, 9, 8, 5, 7, 7), (2, 1), (3, 2)), "contiguous"),  # the stencil dgrad (49 taps), strided
        (((2, 17, 7, 6, 35, 3, 2), (2, 3), (1, 0)), "contiguous"),  # taps, C and K past a tile, strided
        (((1, 16, 5, 9, 4, 5, 3), (1, 2), (2, 1)), "channels_last"),
    ],
    ids=["taps", "taps-nhwc", "taps-acc64", "spread", "stencil", "taps-strided", "taps-strided-nhwc"],
)
@pytest.mark.parametrize("tap_major", [True, False], ids=["tap-major-w", "w-as-given"])
def test_triton_tap_forward_and_stencil_dgrad(case, layout, tap_major, monkeypatch):
    """The kernels fwd_plan, dgrad_plan and wgrad_plan pick at these shapes
    (test_triton_config), fp32 against float64: the tap kernels at C >= 16 (every
    direction; the weight copied tap-major as fp32's default, and as given), the stencil
    dgrad at C <= 4."""
    from kernellab.ops.conv2d import triton as kt

    if not tap_major:
        monkeypatch.setattr(kt, "TAP_MAJOR_DTYPES", ())
    shape, stride, padding = case
    x, w, b = SPEC.make_inputs(shape, torch.float32, "cpu", 3)
    x = x.contiguous(memory_format=torch.channels_last) if layout == "channels_last" else x
    assert_fwd_bwd("triton", (x, w, b), torch.float32, stride, padding, seed=4)


@pytest.mark.parametrize(
    "case,layout",
    [
        (((2, 20, 6, 6, 5, 5, 5), 1, 2), "contiguous"),
        (((2, 17, 7, 6, 35, 3, 2), (2, 3), (1, 0)), "contiguous"),  # C and K past a tile, strided
        (((1, 16, 5, 9, 4, 5, 3), (1, 2), (2, 1)), "channels_last"),  # x needs no copy
    ],
    ids=["taps", "taps-strided", "taps-strided-nhwc-input"],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_triton_taps_read_channels_innermost(case, layout, dtype, monkeypatch):
    """TAPS_NHWC on for all three tap kernels: x and dy read through channels_last copies,
    w tap-major, the outputs in their usual layouts; against float64 at both dtypes."""
    from kernellab.ops.conv2d import triton as kt

    for kern in ("fwd", "dgrad", "wgrad"):
        monkeypatch.setitem(kt.TAPS_NHWC, (kern, dtype), 0)  # (at these small sizes too)
    shape, stride, padding = case
    x, w, b = SPEC.make_inputs(shape, dtype, "cpu", 3)
    x = x.contiguous(memory_format=torch.channels_last) if layout == "channels_last" else x
    assert_fwd_bwd("triton", (x, w, b), dtype, stride, padding, seed=7)
    y = kernellab.conv2d(x, w, b, stride=stride, padding=padding, backend="triton")
    assert y.is_contiguous()  # (the documented output layout, whatever the operands' copies)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_triton_spread_dgrad_falls_back_to_the_stencil_past_its_size(dtype, monkeypatch):
    """At C <= 4 dx is the spread dgrad (t = w^T dy, then a gather) unless t would hold
    more than SPREAD_MAX_ELEMS values: then the stencil, as accurate. Which one ran is told
    by the kernels launched."""
    from kernellab.ops.conv2d import triton as kt

    ran = []
    for name in ("_conv_dgrad_spread_kernel", "_conv_dgrad_stencil_kernel"):
        kernel = getattr(kt, name)

        class Spy:
            def __getitem__(self, grid, kernel=kernel, name=name):
                ran.append(name)
                return kernel[grid]

        monkeypatch.setattr(kt, name, Spy())
    x, w, b = SPEC.make_inputs((2, 2, 9, 7, 6, 3, 3), dtype, "cpu", 5)
    for limit, want in ((kt.SPREAD_MAX_ELEMS, "_conv_dgrad_spread_kernel"),
                        (100, "_conv_dgrad_stencil_kernel")):  # fmt: skip
        monkeypatch.setattr(kt, "SPREAD_MAX_ELEMS", limit)
        ran.clear()
        assert_fwd_bwd("triton", (x, w, b), dtype, (1, 2), (1, 0), seed=9)
        assert set(ran) == {want}, (limit, ran)


@pytest.mark.parametrize(
    "case",
    [
        ((2, 16, 8, 8, 8, 3, 3), 1, 1),  # taps: rows of 8, planes of 64
        ((2, 1, 12, 12, 8, 3, 3), 1, 1),  # the GEMM forward and wgrad, the spread dgrad
        ((2, 16, 6, 10, 4, 3, 3), (1, 2), 1),  # stride 2 along rows: no load runs, y runs of 5 -> 1
        ((1, 16, 4, 6, 8, 1, 1), 1, 0),  # rows of 6: runs of 2
    ],
    ids=["taps", "gemm", "strided", "rows-of-6"],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_triton_told_pixel_runs(case, dtype, monkeypatch):
    """PIXEL_RUNS on for every kernel (the hints are no-ops under the interpreter; the
    arithmetic around them runs): against float64, and the runs the launcher finds."""
    from kernellab.ops.conv2d import triton as kt

    monkeypatch.setattr(kt, "PIXEL_RUNS", kt.runs_everywhere())
    shape, stride, padding = case
    x, w, b = SPEC.make_inputs(shape, dtype, "cpu", 4)
    assert_fwd_bwd("triton", (x, w, b), dtype, stride, padding, seed=8)
    e32, e16 = torch.empty((), dtype=torch.float32), torch.empty((), dtype=torch.bfloat16)
    assert [kt._run(n, e32) for n in (8, 64, 6, 5, 784)] == [4, 4, 2, 1, 4]
    assert [kt._run(n, e16) for n in (8, 64, 6, 5, 784)] == [8, 8, 2, 1, 8]
    assert kt._run(64, e16, on=False) == 1


def test_pixel_runs_follow_the_table_by_kernel_dtype_and_size():
    """The launchers' runs as PIXEL_RUNS says: the GEMM forward always, the tap forward in
    16 bits and wgrad from its N P Q floor on, dgrad and the fp32 tap forward never; a run
    of 1 is no hint."""
    from kernellab.ops.conv2d import triton as kt

    def fwd(n, dtype, kind):
        return kt.fwd_runs(torch.empty(n, 32, 14, 14, dtype=dtype, device="meta"), 14, 14, 1, kind)

    def wgrad(n, dtype):
        x = torch.empty(n, 32, 14, 14, dtype=dtype, device="meta")
        return kt.wgrad_runs(torch.empty(n, 64, 14, 14, dtype=dtype, device="meta"), x, 1)

    def dgrad(n, dtype):
        x = torch.empty(n, 32, 14, 14, dtype=dtype, device="meta")
        return kt.dgrad_runs(torch.empty(n, 64, 14, 14, dtype=dtype, device="meta"), x, 1)

    bf, f32 = torch.bfloat16, torch.float32
    assert fwd(256, bf, "taps") == dict(XRUN=2, YRUN=4) and fwd(64, bf, "taps") == dict(XRUN=1, YRUN=1)
    assert fwd(256, f32, "taps") == dict(XRUN=1, YRUN=1) and fwd(1, f32, "gemm") == dict(XRUN=2, YRUN=4)
    assert wgrad(256, f32) == dict(XRUN=2, DYRUN=4) and wgrad(64, f32) == dict(XRUN=1, DYRUN=1)
    assert dgrad(1024, bf) == dict(DYRUN=1, XRUN=1)
    assert not any(kt._runs_on(k, d, 1 << 30) for k in ("dgrad",) for d in (f32, bf, torch.float16))


@pytest.mark.parametrize("dot64", [True, False], ids=["fp64-dots", "fp32-dots"])
def test_triton_fp32_wgrad_both_sums(dot64, monkeypatch):
    """fp32 wgrad (both kernels: taps at C 16, GEMM at C 3) with fp64 dots (WGRAD_DOT64,
    the default) and with an fp32 dot a step summed in fp64, against float64."""
    from kernellab.ops.conv2d import triton as kt

    monkeypatch.setattr(kt, "WGRAD_DOT64", dot64)
    for shape in ((2, 16, 7, 6, 5, 3, 3), (2, 3, 9, 8, 6, 3, 3)):
        x, w, b = SPEC.make_inputs(shape, torch.float32, "cpu", 5)
        assert_fwd_bwd("triton", (x, w, b), torch.float32, 1, 1, seed=6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tap_weight_strides_address_w(dtype):
    """tap_weight's copy and strides: w[k, c, r, s] at k swk + c swc + (r S + s) swt, the
    output channels (forward) or input channels (dgrad) at unit stride for fp32."""
    from kernellab.ops.conv2d import triton as kt

    w = torch.randn(5, 3, 2, 4).to(dtype)
    k, c, t = torch.meshgrid(torch.arange(5), torch.arange(3), torch.arange(8), indexing="ij")
    for out_inner in (True, False):
        wt, (swk, swc, swt) = kt.tap_weight(w, out_inner)
        got = wt.flatten()[k * swk + c * swc + t * swt]
        assert torch.equal(got, w.reshape(5, 3, 8)), out_inner
        if dtype == torch.float32:
            assert (swk if out_inner else swc) == 1 and wt.is_contiguous()
        else:
            assert wt is w


def test_wgrad_split_covers_the_reduction():
    from kernellab.ops.conv2d import cuda as kc
    from kernellab.ops.conv2d import triton as kt

    cases = [(1, 50176, 132), (5, 16, 132), (1, 1, 132), (40, 200704, 132), (1, 100000, 1)]
    for tiles, npq, sms in cases:
        splits, chunk = kc.wgrad_split(tiles, npq, sms)
        assert chunk % kc.BK == 0 and (splits - 1) * chunk < npq <= splits * chunk
        assert splits == 1 or splits * tiles < 2 * sms + tiles  # about two blocks per SM
    splits, chunk = kt._wgrad_split(1, 1000, 32, torch.device("cpu"))
    assert splits == 2 and chunk % 32 == 0 and chunk < 1000 <= 2 * chunk


def test_triton_wgrad_split_on_a_gpu_down_to_one_tile(monkeypatch):
    """On a GPU (132 SMs here by monkeypatch) a small reduction splits down to one tile a
    chunk (short fp32 running sums), a larger one stops at ~2 programs per SM, and from
    WGRAD_LARGE_NPQ at ~4."""
    from kernellab.ops.conv2d import triton as kt

    monkeypatch.setattr(kt.triton_support, "sm_count", lambda index=None: 132)
    gpu = torch.device("cuda", 0)
    assert kt._wgrad_split(1, 144, 32, gpu) == (5, 32)
    splits, chunk = kt._wgrad_split(5, 64 * 196, 32, gpu)
    assert 40 < splits <= 53 and chunk % 32 == 0 and (splits - 1) * chunk < 64 * 196 <= splits * chunk
    # from WGRAD_LARGE_NPQ reduction indices, ~4 programs per SM
    npq = 1024 * 196
    assert npq >= kt.WGRAD_LARGE_NPQ
    splits, chunk = kt._wgrad_split(9, npq, 16, gpu)
    assert 53 < splits <= 59 and (splits - 1) * chunk < npq <= splits * chunk


def test_triton_config():
    from kernellab.ops.conv2d import triton as kt

    gpu, cpu, f32, bf16 = torch.device("cuda"), torch.device("cpu"), torch.float32, torch.bfloat16
    # the tap forward: fp32 at C >= 16, two-level fp32 sums up to C R S = 1152, fp64 above
    assert kt.fwd_plan(32, 3, 3, 64, f32, gpu) == ("taps", dict(ACC64=False, BLOCK_M=128, BLOCK_N=64,
                                                                BLOCK_K=16, num_warps=4))  # fmt: skip
    assert kt.fwd_plan(129, 3, 3, 64, f32, gpu)[1]["ACC64"]  # C R S 1161
    assert not kt.fwd_plan(128, 3, 3, 64, f32, gpu)[1]["ACC64"]  # 1152
    assert kt.fwd_plan(16, 3, 3, 8, f32, cpu)[0] == "taps"
    assert kt.fwd_plan(15, 3, 3, 64, f32, gpu)[0] == "gemm" == kt.fwd_plan(15, 3, 3, 64, bf16, gpu)[0]
    # 16-bit: the tap forward at C >= 16, no fp64 sums at any C R S
    assert kt.fwd_plan(32, 3, 3, 64, bf16, gpu) == ("taps", dict(ACC64=False, BLOCK_M=128, BLOCK_N=64,
                                                                 BLOCK_K=32, num_warps=8))  # fmt: skip
    assert kt.fwd_plan(20, 5, 5, 8, torch.float16, gpu)[1]["BLOCK_K"] == 32
    assert kt.fwd_plan(16, 9, 9, 8, bf16, gpu)[1]["BLOCK_K"] == 16
    assert not kt.fwd_plan(512, 3, 3, 8, bf16, gpu)[1]["ACC64"]
    # the spread dgrad at C <= 4 (the stencil past SPREAD_MAX_RS taps), the GEMM one up to
    # C 15, taps from C 16
    assert kt.dgrad_plan(1, 3, 3, 32, f32, gpu)[0] == "spread" == kt.dgrad_plan(4, 5, 5, 8, bf16, cpu)[0]
    assert kt.dgrad_plan(1, 3, 3, 32, f32, gpu)[1] == dict(BLOCK=128, BLOCK_K=32, RS_PAD=16, num_warps=4,
                                                           GATHER=256)  # fmt: skip
    assert kt.dgrad_plan(3, 7, 7, 64, bf16, gpu) == ("stencil", dict(BLOCK=128, BLOCK_K=16, num_warps=4))
    assert kt.dgrad_plan(5, 3, 3, 32, f32, gpu) == ("gemm", dict(ACC64=True, **kt.gemm_config(5, 288, gpu)))
    assert kt.dgrad_plan(15, 3, 3, 32, bf16, gpu)[0] == "gemm"
    assert kt.dgrad_plan(32, 3, 3, 64, f32, gpu) == ("taps", dict(ACC64=True, BLOCK_M=64, BLOCK_N=32,
                                                                  BLOCK_K=32, num_warps=4))  # fmt: skip
    assert kt.dgrad_plan(64, 3, 3, 64, bf16, gpu) == ("taps", dict(ACC64=False, BLOCK_M=256, BLOCK_N=64,
                                                                   BLOCK_K=32, num_warps=8))  # fmt: skip
    assert kt.dgrad_plan(32, 3, 3, 64, bf16, gpu) == ("taps", dict(ACC64=False, BLOCK_M=128, BLOCK_N=32,
                                                                   BLOCK_K=32, num_warps=4))  # fmt: skip
    # wgrad: C R S columns below C 16 (rows fit K on a GPU), a tap's C columns from C 16
    assert kt.wgrad_config(32, 9, gpu)["BLOCK_M"] == 32 and kt.wgrad_config(200, 9, gpu)["BLOCK_M"] == 64
    assert kt.wgrad_config(3, 9, gpu)["BLOCK_M"] == 16 and kt.wgrad_config(32, 9, gpu)["BLOCK_K"] == 32
    assert kt.wgrad_plan(1, 3, 3, 32, f32, gpu) == ("gemm", kt.wgrad_config(32, 9, gpu))
    assert kt.wgrad_plan(32, 3, 3, 64, bf16, gpu) == ("taps", dict(BLOCK_M=64, BLOCK_N=32, BLOCK_K=64,
                                                                   num_warps=4))  # fmt: skip
    # fp32 (fp64 dots): 16 reduction indices a step, 64 C columns even at C 32 (measured)
    assert kt.wgrad_plan(32, 3, 3, 64, f32, gpu) == ("taps", dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=16,
                                                                  num_warps=4))  # fmt: skip
    assert kt.wgrad_plan(16, 3, 3, 16, f32, gpu)[1]["BLOCK_N"] == 64

    cfg = kt.gemm_config(32, 9, torch.device("cuda"))  # MNIST layer 1
    assert (cfg["BLOCK_N"], cfg["BLOCK_K"]) == (32, 16)
    cfg = kt.gemm_config(64, 288, torch.device("cuda"))
    assert (cfg["BLOCK_N"], cfg["BLOCK_K"]) == (64, 32)


# conv2d.cu compiling for sm_80 and sm_90: tests/test_cuda_runtime.py compiles every .cu
# of the package (6 s for this one here; not repeated).


# --------------------------------------------------------------------------- GPU


@pytest.fixture(autouse=True)
def _no_cudnn_tf32():
    """fp32 as fp32 on a GPU: PyTorch's default lets cuDNN's convolutions (the torch backend,
    and the baseline every bound is made of) take TF32; the Triton kernel follows the same
    flag. Off here, as `kernellab check` sets it."""
    old = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32 = old


GPU_CASES = CASES + [
    ((64, 1, 28, 28, 32, 3, 3), 1, 1),  # the MNIST model's layers at batch 64
    ((64, 32, 14, 14, 64, 3, 3), 1, 1),
    ((4, 64, 56, 56, 64, 3, 3), 1, 1),  # the large layer, batch 4
    ((3, 70, 17, 19, 130, 3, 3), 2, 1),  # K and C past two tiles, odd sizes
    ((2, 5, 40, 33, 7, 7, 7), 1, 3),
    ((1, 8, 9, 9, 8, 11, 11), 1, 5),
]


# The torch backend is judged by the documented tolerance (it is the bound of the others),
# and cuDNN's own fp32 wgrad is beyond it at the larger cases (H100, bbcb247: dw error
# 8.2e-3 > 9.5e-4; 6.6e-2 at scale 1.4e3 at the 32 x 64 x 56 x 56 layer,
# lab/conv_errors.py). Ours sum in fp64 slices and pass (they failed at 1.2-6.4x before).
_CUDNN_FP32_GRADS = pytest.mark.xfail(
    reason="cuDNN's fp32 dw is beyond the documented 2e-6 relative tolerance", strict=False
)


def _gpu_matrix():
    out = []
    for backend in cuda_backends(OP):
        for d in DTYPES:
            marks = [_CUDNN_FP32_GRADS] if backend == "torch" and d == torch.float32 else []
            out.append(pytest.param(backend, d, marks=marks, id=f"{dtype_id(d)}-{backend}"))
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("backend,dtype", _gpu_matrix())
def test_gpu_forward_and_gradients(backend, dtype):
    impl = registry.get(OP, backend)
    if impl.why_unavailable("cuda"):
        pytest.skip(impl.why_unavailable("cuda"))
    if dtype not in (impl.dtypes or SPEC.dtypes):
        pytest.skip(f"{backend} takes {impl.dtypes}")
    for case in GPU_CASES:
        shape, stride, padding = case
        args = SPEC.make_inputs(shape, dtype, "cuda", seed_for(backend, case))
        assert_fwd_bwd(backend, args, dtype, stride, padding, seed=1)
    x, w, b = SPEC.make_inputs((2, 3, 7, 6, 5, 3, 3), dtype, "cuda", 2)
    assert_fwd_bwd(backend, (x.contiguous(memory_format=torch.channels_last), w, None), dtype, padding=1)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_gpu_first_layer_without_input_gradient(backend):
    """MNIST's first layer at batch 256 (C = 1): dw and dbias with x needing no gradient;
    the dbias sums over batch slices (K = 32 channels alone filled a quarter of the SMs)."""
    x, w, b = SPEC.make_inputs((256, 1, 28, 28, 32, 3, 3), torch.float32, "cuda", 6)
    assert_fwd_bwd(backend, (x, w, b), torch.float32, padding=1, x_grad=False)
    x, w, b = SPEC.make_inputs((5, 3, 9, 9, 40, 3, 3), torch.bfloat16, "cuda", 7)
    assert_fwd_bwd(backend, (x, w, b), torch.bfloat16, padding=1, x_grad=False)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "backend",
    ["cuda", "cuda_v1", "cuda_v2", "cuda_v4", "triton", "fft", "manual"],
)
def test_gpu_check_engine(backend):
    # (float64 is the reference backends' extra dtype: the check engine times the three storage dtypes)
    for dtype in [t for t in (registry.get(OP, backend).dtypes or DTYPES) if t != torch.float64]:
        rep = check_impl(registry.get(OP, backend), dtype, device="cuda", quick=True)
        assert rep.status == PASS, [(c.kind, c.name, c.detail) for c in rep.failures]


@pytest.mark.gpu
def test_gpu_cuda_graph_capture():
    x, w, b = SPEC.make_inputs((8, 3, 12, 12, 16, 3, 3), torch.float32, "cuda", 5)
    for backend in ("cuda", "triton"):
        y = kernellab.conv2d(x, w, b, padding=1, backend=backend)  # compile / load outside capture
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            yg = kernellab.conv2d(x, w, b, padding=1, backend=backend)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(yg, y)


def test_triton_kernels_compile_for_sm90_ahead_of_time():
    """No GPU needed: triton.compile for an sm_90 target, so a kernel that only the GPU
    compiler refuses (a dot's precision argument, a mask's type) fails here: fp32 (IEEE
    dots) and bf16 (tensor-core dots). (max_pool2d's and relu's kernels, streaming loads
    and stores, were compiled the same way by hand: `kernellab asm max_pool2d -b triton`.)"""
    from kernellab.inspect import asm

    for dtype in ("fp32", "bf16"):
        kernels, note = asm.triton_report(kernellab.get(OP, "triton"), dtype, "sm_90")
        names = {k.name for k in kernels}
        assert names == {"_conv_fwd_kernel", "_conv_fwd_taps_kernel", "_conv_dgrad_kernel",
                         "_conv_dgrad_taps_kernel", "_conv_dgrad_stencil_kernel", "_conv_dgrad_spread_kernel",
                         "_conv_dgrad_gather_kernel", "_conv_wgrad_kernel",
                         "_conv_wgrad_taps_kernel"}, note  # fmt: skip
        assert all(k.counts["ptx_local"] == 0 for k in kernels), [k.name for k in kernels]
        for name in ("_conv_wgrad_kernel", "_conv_wgrad_taps_kernel"):
            wgrad = next(k for k in kernels if k.name == name)
            # fp32 dw through fp64 tensor-core dots (exact products, fp64 sums): fp32 dots summed
            # in fp64 failed the check's bound (2x cuDNN's error) on 7 of 27 seeds on the H100
            assert ("mma.sync.aligned" in wgrad.ptx and ".f64.f64.f64.f64" in wgrad.ptx) == (dtype == "fp32")
        # compiled as launched at 14x14 (P Q = 196, not a multiple of 16): y's stores are
        # vectors only where the forward is told its pixel runs
        from kernellab.ops.conv2d import triton as kt

        fwd_ptx = next(k for k in kernels if k.name == "_conv_fwd_taps_kernel").ptx
        told = kt._runs_on("fwd", torch.float32 if dtype == "fp32" else torch.bfloat16, 256 * 14 * 14)
        assert bool(re.search(r"st\.global\.v[24]", fwd_ptx)) == told, dtype
        if dtype == "bf16":
            # 16-bit dgrad reads channels-innermost (TAPS_NHWC): its gathered tile loads
            # as 16-byte cp.async, not 2 bytes a lane (ncu: 8 of 32 bytes of a sector
            # used with lanes a channel plane apart)
            ptx = next(k for k in kernels if k.name == "_conv_dgrad_taps_kernel").ptx
            assert re.search(r"cp\.async\.c[ag]\.shared\.global[^;]*0x10", ptx)
            assert "ld.global.b16" not in ptx


# Compiles (sm_90, no GPU) the backend's declared kernels as `kernellab asm` does (at the
# MNIST layers, integers specialized by their values: 14, 196 are not multiples of 16),
# every tap kernel reading NCHW, with the runs the launchers pass (or none); prints per
# tap kernel the TTGIR layouts of its global loads / stores, its vector (8- or 16-byte)
# global stores and its global load instructions.
_RUNS_SCRIPT = r"""
import json, re, sys, tempfile
from pathlib import Path
from kernellab.inspect.asm import compile_triton_kernels
from kernellab.ops.conv2d import triton as kt

dt, on = sys.argv[1], sys.argv[2] == "on"
kt.TAPS_NHWC.clear()
kt.PIXEL_RUNS.clear()
if on:
    kt.PIXEL_RUNS.update(kt.runs_everywhere())
d = tempfile.mkdtemp()
errors = compile_triton_kernels("conv2d", "triton", dt, "sm_90", d)
assert not errors, errors
out = {}
for name in ("fwd", "dgrad", "wgrad"):
    base = Path(d, f"_conv_{name}_taps_kernel")
    ttgir, ptx = base.with_suffix(".ttgir").read_text(), base.with_suffix(".ptx").read_text()
    lay = dict(re.findall(r"^(#\w+) = #ttg\.blocked<(.*)>$", ttgir, re.M))
    ops = []
    for line in ttgir.splitlines():
        for op in ("tt.store", "async_copy_global_to_local", "tt.load"):
            if op + " " in line and "tensor<" in line and "x" in line.split("tensor<")[1].split(">")[0]:
                ops.append([op, [lay.get(b, b) for b in sorted(set(re.findall(r"#blocked\d*", line)))]])
    loads = len(re.findall(r"(?:ld\.global|cp\.async\.c[ag]\.shared\.global)[.\w]* ", ptx))
    out[name] = dict(ops=ops, vst=len(re.findall(r"st\.global\.v[24]\.b32", ptx)), loads=loads)
print(json.dumps(out))
"""


def _run_layouts(dtype, on):
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, TRITON_INTERPRET="0")
    proc = subprocess.run([sys.executable, "-c", _RUNS_SCRIPT, dtype, on], env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_triton_taps_go_along_pixels_when_told_their_runs(dtype):
    """Told their runs (PIXEL_RUNS, lab/conv_runs.py), the NCHW tap forward's gathered x
    tile and dgrad's gathered dy tile put a warp's lanes along pixels (dim 0 first in the layout's order),
    and y / dx go out as vector stores (196 pixels a plane: 16 bytes fp32, 8 bf16);
    without the runs Triton, blind to the pixel divisions, puts the lanes along channels
    (the case this guards against). bf16 dgrad
    reads dy channels-innermost by default (TAPS_NHWC); its gather is compiled here as
    the NCHW launch would be."""
    told, blind = _run_layouts(dtype, "on"), _run_layouts(dtype, "off")
    for kernel in ("fwd", "dgrad"):
        # the gathered operand: the first [pixels, channels] load of the loop
        first = lambda ops: next(lay for op, lay in ops if op != "tt.store")[0]  # noqa: E731
        assert "order = [0, 1]" in first(told[kernel]["ops"]), (kernel, told[kernel])
        assert "order = [1, 0]" in first(blind[kernel]["ops"]), (kernel, blind[kernel])
        store = next(lay for op, lay in told[kernel]["ops"] if op == "tt.store")[0]
        assert "order = [0, 1]" in store, (kernel, store)
        assert told[kernel]["vst"] > 0 and blind[kernel]["vst"] == 0, (kernel, told[kernel], blind[kernel])
    # wgrad: the gathered x tile along pixels, and dy's [k, pixels] tile in vectors (runs
    # of 4 along its planes of 196): fewer load instructions than one element a lane
    along = [lay for op, lay in told["wgrad"]["ops"] + blind["wgrad"]["ops"] if op != "tt.store"]
    assert any("order = [0, 1]" in lay[0] for op, lay in told["wgrad"]["ops"] if op != "tt.store"), along
    assert not any("order = [0, 1]" in lay[0] for op, lay in blind["wgrad"]["ops"] if op != "tt.store"), along
    assert told["wgrad"]["loads"] < blind["wgrad"]["loads"], (told["wgrad"], blind["wgrad"])
