"""swiglu and geglu: every backend that runs here x odd shapes x dtypes, forward and both
gradients against the float64 reference (judged by the 2 x PyTorch rule); strided and
expanded inputs; NaN/inf as documented; bad inputs naming the argument; the Triton
backend's saved tensors, custom ops (opcheck, torch.compile fullgraph) and the check
engine (passing ours, rejecting planted mistakes); the liger peer reports itself
unavailable here. GPU cases are marked ``gpu``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kernellab
from kernellab.core import registry
from kernellab.harness.check import FAIL, PASS, check_impl
from kernellab.harness.compare import judge
from kltest import (
    BLOCK_EDGES,
    DTYPES,
    LAYOUTS,
    backend_matrix,
    block_edge,
    check_planted,
    compile_grads_match,
    cpu_backends,
    dtype_id,
    opcheck_custom_ops,
    seed_for,
    shape_id,
)

# (op, options) cases: geglu with each approximation
CASES = [("swiglu", {}), ("geglu", {}), ("geglu", {"approximate": "tanh"})]
CASE_IDS = ["swiglu", "geglu-erf", "geglu-tanh"]
SHAPES = [(1,), (17,), (1025,), (3, 0, 5), (7, 129), (2, 3, 257)]
SMALL_N = 1 << 19  # glu_kernels.triton_kernels.SMALL_N (asserted below)


def _fn(op):
    return getattr(kernellab, op)


def _torch_op(op, a, b, **opts):
    return F.silu(a) * b if op == "swiglu" else F.gelu(a, approximate=opts.get("approximate", "none")) * b


def _grads(fn, args, dy):
    leaves = [t.detach().clone().requires_grad_() if t.is_contiguous() else t.detach().requires_grad_()
              for t in args]  # fmt: skip
    out = fn(*leaves)
    assert out.requires_grad, "output does not require grad: no autograd"
    return out, torch.autograd.grad(out, leaves, dy)


def _assert_fwd_bwd(op, backend, a, b, opts, seed=0):
    spec = kernellab.get_spec(op)
    dtype = a.dtype
    dy = torch.randn(a.shape, generator=torch.Generator().manual_seed(seed)).to(dtype=dtype, device=a.device)
    y, got = _grads(lambda a, b: _fn(op)(a, b, **opts, backend=backend), (a, b), dy)
    base_y, base = _grads(lambda a, b: _torch_op(op, a, b, **opts), (a, b), dy)
    ref_y, ref = _grads(lambda a, b: spec.reference(a, b, **opts), (a.double(), b.double()), dy.double())
    torch_itself = backend == "torch"  # held to the documented tolerance, as the check does
    assert y.shape == a.shape and y.dtype == dtype
    v = judge(y.detach(), ref_y.detach(), dtype, None if torch_itself else base_y.detach())
    assert v.ok, f"{op}/{backend} forward: {v.detail}"
    for name, g, r, t in zip(("da", "db"), got, ref, base):
        assert g.dtype == dtype and g.shape == a.shape
        v = judge(g, r, dtype, None if torch_itself else t)
        assert v.ok, f"{op}/{backend} {name}: {v.detail} (err {v.err:.3g}, bound {v.bound:.3g})"


@pytest.mark.parametrize("backend", cpu_backends("swiglu"))
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@pytest.mark.parametrize("op,opts", CASES, ids=CASE_IDS)
def test_forward_and_gradients(op, opts, shape, dtype, backend):
    spec = kernellab.get_spec(op)
    a, b = spec.make_inputs(shape, dtype, "cpu", seed_for(op, backend, shape, dtype))
    _assert_fwd_bwd(op, backend, a, b, opts, seed=seed_for(shape, dtype))


def test_cpu_backends_here():
    for op in ("swiglu", "geglu"):
        cpu = {p.values[1] for p in backend_matrix(op) if p.values[0] == "cpu"}
        assert {"manual", "torch", "triton"} <= cpu, cpu


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("op,opts", CASES, ids=CASE_IDS)
def test_strided_inputs(op, opts, layout):
    """Transposed, every other element of the last dim, a misaligned offset, expanded
    (stride 0): computed, not refused. One argument at a time too (a contiguous, b not)."""
    spec = kernellab.get_spec(op)
    for backend in ("manual", "torch", "triton"):
        a, b = spec.make_inputs((9, 66), torch.float32, "cpu", seed_for(op, layout, backend), layout)
        assert not (a.is_contiguous() and layout != "offset")
        _assert_fwd_bwd(op, backend, a, b, opts)
        _assert_fwd_bwd(op, backend, a.contiguous(), b, opts)


@pytest.mark.parametrize("op,opts", CASES, ids=CASE_IDS)
def test_nan_inf_follow_the_formula(op, opts):
    """The documented choice (package docstring of ops/glu_kernels): act(-inf) = NaN, act(+inf) =
    +inf, act'(+-inf) = NaN (so da is NaN there; db = dy * act(a) follows the forward),
    NaN stays NaN; large finite a keeps the limits. Positions must match the float64 reference exactly."""
    spec = kernellab.get_spec(op)
    a = torch.tensor([float("inf"), -float("inf"), float("nan"), 1e3, -1e3, 60.0, -60.0, 0.5, -2.0])
    b = torch.linspace(-1.5, 2.0, a.numel())
    ref_y, (ref_da, ref_db) = _grads(lambda a, b: spec.reference(a, b, **opts), (a.double(), b.double()),
                                     torch.ones(a.shape, dtype=torch.float64))  # fmt: skip
    assert torch.isnan(ref_y[1:3]).all() and torch.isinf(ref_y[0])
    assert torch.isnan(ref_da[:3]).all() and torch.isnan(ref_db[1:3]).all() and torch.isinf(ref_db[0])
    assert torch.isfinite(ref_da[3:]).all() and torch.isfinite(ref_db[3:]).all()
    for backend in ("manual", "torch", "triton"):
        for dtype in DTYPES:
            args, dy = (a.to(dtype), b.to(dtype)), torch.ones(a.shape, dtype=dtype)
            y, (da, db) = _grads(lambda a, b: _fn(op)(a, b, **opts, backend=backend), args, dy)
            pt_y, (pt_da, pt_db) = _grads(lambda a, b: _torch_op(op, a, b, **opts), args, dy)
            if backend == "torch" and not torch.equal(pt_y.isnan(), ref_y.isnan()):
                # PyTorch's own kernel off the formula on this CPU (AVX-512's fp32 erf GeLU at
                # +inf, module docstring): the torch backend is PyTorch's ops, bit for bit
                for g, r in ((y, pt_y), (da, pt_da), (db, pt_db)):
                    torch.testing.assert_close(g, r, rtol=0, atol=0, equal_nan=True)
                continue
            for name, g, r in (("y", y.detach(), ref_y.detach()), ("da", da, ref_da), ("db", db, ref_db)):
                v = judge(g, r, dtype, None)
                assert v.ok, f"{backend} {dtype} {name}: {v.detail}"


def test_reference_matches_pytorch_in_float64():
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(2, 100, generator=gen, dtype=torch.float64) * 4
    b = torch.randn(2, 100, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(kernellab.get_spec("swiglu").ref(a, b), F.silu(a) * b, rtol=1e-13, atol=1e-13)
    for ap in ("none", "tanh"):
        got = kernellab.get_spec("geglu").ref(a, b, approximate=ap)
        torch.testing.assert_close(got, F.gelu(a, approximate=ap) * b, rtol=1e-13, atol=1e-13)
    # the two approximations differ (the option reaches the reference and the kernels)
    geglu = kernellab.get_spec("geglu")
    assert (geglu.ref(a, b) - geglu.ref(a, b, approximate="tanh")).abs().max() > 1e-5
    a32, b32 = a.float(), b.float()
    d = kernellab.geglu(a32, b32, backend="triton") - kernellab.geglu(a32, b32, "tanh", backend="triton")
    assert d.abs().max() > 1e-5


def test_fused_kernel_rounds_once():
    """fp32 math and one rounding: at bf16 the triton output is at least as close to the
    float64 formula as F.silu(a) * b, which rounds silu(a) before the product."""
    spec = kernellab.get_spec("swiglu")
    a, b = spec.make_inputs((64, 257), torch.bfloat16, "cpu", 3)
    ref = spec.ref(a, b)
    ours = (kernellab.swiglu(a, b, backend="triton").double() - ref).abs().mean()
    torch_err = ((F.silu(a) * b).double() - ref).abs().mean()
    assert ours < torch_err, (ours, torch_err)


@pytest.mark.parametrize("n", [SMALL_N - 1, SMALL_N + 5], ids=["small-programs", "default-programs"])
def test_triton_launch_shapes_either_side_of_small_n(n):
    """Below SMALL_N elements the kernels run programs of SMALL_BLOCK elements and
    SMALL_WARPS warps; from SMALL_N up, block_for's with 8 warps. Both give the float64
    formula, forward and both gradients (the last program partial either way)."""
    from kernellab import triton_support
    from kernellab.ops.glu_kernels import triton_kernels as gk

    assert gk.SMALL_N == SMALL_N
    block, warps = gk.launch_shape(n, 2)
    if n < SMALL_N:
        assert (block, warps) == (gk.SMALL_BLOCK, gk.SMALL_WARPS)
    else:
        assert (block, warps) == (triton_support.block_for(2), 8)
    assert n % block
    spec = kernellab.get_spec("swiglu")
    a, b = spec.make_inputs((n,), torch.bfloat16, "cpu", 4)
    _assert_fwd_bwd("swiglu", "triton", a, b, {})


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("edge", list(BLOCK_EDGES))
@pytest.mark.parametrize("op,opts", CASES, ids=CASE_IDS)
def test_triton_counts_around_a_block(device, op, opts, edge, dtype):
    """The Triton backend at counts around its program size (SMALL_BLOCK, what these counts
    take): a partial program alone, whole ones (unmasked), whole ones then a partial one;
    forward and both gradients against the float64 formula. (block_for's programs, from
    SMALL_N elements: test_triton_launch_shapes_either_side_of_small_n and
    tests/test_triton_support.py.)"""
    from kernellab.ops.glu_kernels import triton_kernels as gk

    if kernellab.get(op, "triton").why_unavailable(device):
        pytest.skip("triton does not run here")
    n = block_edge(edge, gk.SMALL_BLOCK)
    assert gk.launch_shape(n, dtype.itemsize)[0] == gk.SMALL_BLOCK
    a, b = kernellab.get_spec(op).make_inputs((n,), dtype, device, seed_for(op, n, dtype))
    _assert_fwd_bwd(op, "triton", a, b, opts)


# --------------------------------------------------------------------------- bad inputs


@pytest.mark.parametrize("op", ["swiglu", "geglu"])
@pytest.mark.parametrize("backend", ["manual", "torch", "triton"])
def test_bad_inputs_name_the_argument(op, backend):
    f = _fn(op)
    a, b = torch.randn(4, 8), torch.randn(4, 8)
    with pytest.raises(ValueError, match=r"\bb\b.*shape"):
        f(a, torch.randn(4, 9), backend=backend)
    with pytest.raises(ValueError, match=r"\bb\b.*shape"):
        f(a, torch.randn(8), backend=backend)  # no broadcasting
    with pytest.raises(TypeError, match=r"\bb\b.*dtype"):
        f(a, b.half(), backend=backend)
    with pytest.raises(TypeError, match=r"\ba\b.*dtype"):
        f(a.int(), b, backend=backend)
    with pytest.raises(TypeError, match=r"\bb\b.*dtype"):
        f(a, b.long(), backend=backend)
    with pytest.raises(TypeError, match=r"\ba\b"):
        f(a.tolist(), b, backend=backend)
    with pytest.raises(TypeError, match=r"\bb\b"):
        f(a, None, backend=backend)
    if backend == "triton":
        with pytest.raises(TypeError, match=r"\ba\b"):
            f(a.double(), b.double(), backend=backend)
    for bad in (1, "yes", None):
        with pytest.raises(TypeError, match=r"\binplace_backward\b"):
            f(a, b, backend=backend, inplace_backward=bad)
    if op == "geglu":
        with pytest.raises(ValueError, match="approximate"):
            f(a, b, "erf", backend=backend)
        with pytest.raises(ValueError, match="approximate"):
            f(a, b, None, backend=backend)
        with pytest.raises(TypeError, match=r"\binplace_backward\b"):
            f(a, b, "tanh", backend=backend, inplace_backward=0)


def test_bad_inputs_through_the_default():
    with pytest.raises(ValueError, match=r"\bb\b"):
        kernellab.swiglu(torch.randn(3, 5), torch.randn(3, 6))
    with pytest.raises(ValueError, match="approximate"):
        kernellab.geglu(torch.randn(3, 5), torch.randn(3, 5), approximate="fast")
    with pytest.raises(TypeError, match=r"\binplace_backward\b"):
        kernellab.swiglu(torch.randn(3, 5), torch.randn(3, 5), inplace_backward="yes")


# --------------------------------------------------------------------------- triton contracts


@pytest.mark.parametrize("op,opts", CASES, ids=CASE_IDS)
def test_triton_saves_the_inputs_only(op, opts):
    """The backward recomputes the activation from a: the autograd node holds a and b
    themselves (no activation tensor, no copy)."""
    a, b = (torch.randn(5, 33).requires_grad_() for _ in range(2))
    y = _fn(op)(a, b, **opts, backend="triton")
    saved = y.grad_fn.saved_tensors
    assert len(saved) == 2
    assert saved[0].data_ptr() == a.data_ptr() and saved[1].data_ptr() == b.data_ptr()


@pytest.mark.parametrize("op", ["swiglu", "geglu"])
def test_triton_opcheck_and_compile_fullgraph(op):
    impl = registry.get(op, "triton")
    assert len(impl.custom_ops) == 2
    opcheck_custom_ops(impl.custom_ops, kernellab.get_spec(op), (4, 33))
    a, b = kernellab.get_spec(op).make_inputs((5, 40), torch.float32, "cpu", 4)
    ref = registry.get(op, "torch").fn
    compile_grads_match(impl.fn, ref, (a, b))
    if op == "geglu":
        compile_grads_match(lambda a, b: impl.fn(a, b, "tanh"), lambda a, b: ref(a, b, "tanh"), (a, b))


@pytest.mark.parametrize("op", ["swiglu", "geglu"])
def test_check_engine_passes_triton(op):
    impl = registry.get(op, "triton")
    rep = check_impl(impl, torch.float32, device="cpu", quick=True, opcheck=False, seed=1)
    assert rep.status == PASS, [(c.kind, c.name, c.detail) for c in rep.failures]
    # the documented in-place mode ran, its writes into a and b exempt from integrity only there
    cases = {(c.kind, c.name): c.status for c in rep.cases}
    assert cases[("grad", "grad inplace_backward=True")] == PASS


def _detached_gate(a, b):  # db right, da missing the path through the activation
    return F.silu(a).detach() * b


def _half_rounded(a, b):  # the activation rounded to fp16 inside an fp32 op
    return F.silu(a).half().float() * b


def _unit_stride(a, b):  # reads b's storage as if b were contiguous
    fits = b.untyped_storage().nbytes() >= (b.storage_offset() + b.numel()) * b.element_size()
    if not b.is_contiguous() and fits:
        b = b.as_strided(b.shape, torch.empty(b.shape).stride())
    return F.silu(a) * b


@pytest.mark.parametrize("name,fn", [("detached_gate", _detached_gate), ("half_rounded", _half_rounded),
                                     ("unit_stride", _unit_stride)])  # fmt: skip
def test_check_engine_rejects_planted_mistakes(name, fn):
    rep = check_planted("swiglu", name, fn)
    assert rep.status == FAIL, name


def test_liger_peer_is_declared_and_unavailable_here():
    for op in ("swiglu", "geglu"):
        impl = registry.get(op, "liger")
        why = impl.why_unavailable("cpu")
        assert why and "liger" in why.lower() or why == "no GPU", why
        assert impl.devices == ("cuda",)
        with pytest.raises(ValueError, match=r"\ba\b"):  # a CPU tensor: refused by name, no import
            impl(torch.randn(3, 4), torch.randn(3, 4))
    geglu = registry.get("geglu", "liger")
    assert geglu.outside_limits((None, None), {})
    assert geglu.outside_limits((None, None), {"approximate": "tanh"}) is None


# --------------------------------------------------------------------------- in-place backward


def _step(op, opts, backend, a0, b0, dy, inplace):
    """(y, a, b, da, db) of one forward and backward on fresh leaf copies of a0, b0."""
    a, b = a0.clone().requires_grad_(), b0.clone().requires_grad_()
    y = _fn(op)(a, b, **opts, backend=backend, inplace_backward=inplace)
    y.backward(dy)
    return y.detach(), a, b, a.grad, b.grad


@pytest.mark.parametrize("backend", cpu_backends("swiglu"))
@pytest.mark.parametrize("op,opts", CASES, ids=CASE_IDS)
def test_inplace_backward_same_results(op, opts, backend):
    """inplace_backward=True changes no output or gradient bit. The Triton backend wrote
    da into a's buffer and db into b's (adopted as .grad: no copy) and gave both a new
    version; the others leave a and b untouched."""
    a0, b0 = kernellab.get_spec(op).make_inputs((7, 129), torch.float32, "cpu", 21)
    dy = torch.randn(a0.shape, generator=torch.Generator().manual_seed(22))
    y0, _, _, da0, db0 = _step(op, opts, backend, a0, b0, dy, False)
    y1, a, b, da1, db1 = _step(op, opts, backend, a0, b0, dy, True)
    assert torch.equal(y1, y0) and torch.equal(da1, da0) and torch.equal(db1, db0)
    if backend == "triton":
        assert torch.equal(a.detach(), da0) and torch.equal(b.detach(), db0)
        assert a.grad.data_ptr() == a.data_ptr() and b.grad.data_ptr() == b.data_ptr()
        assert a._version > 0 and b._version > 0
    else:
        assert torch.equal(a.detach(), a0) and torch.equal(b.detach(), b0)


@pytest.mark.parametrize("op,opts", CASES, ids=CASE_IDS)
def test_inplace_backward_spares_strided_and_shared_inputs(op, opts):
    """Halves of a fused gate_up projection (strided): the launcher's private copies take
    the gradients, the caller's tensor keeps its values and version. ``op(x, x)``: a and
    b share bytes, so fresh gradients (writing both would leave db where da belongs)."""
    f = _fn(op)
    gu0 = torch.randn(5, 66, generator=torch.Generator().manual_seed(23))
    grads = []
    for inplace in (False, True):
        gu = gu0.clone().requires_grad_()
        f(gu[:, :33], gu[:, 33:], **opts, backend="triton", inplace_backward=inplace).sum().backward()
        assert torch.equal(gu.detach(), gu0) and gu._version == 0
        grads.append(gu.grad)
    assert torch.equal(grads[1], grads[0])
    grads = []
    for inplace in (False, True):
        x = gu0[:, :33].clone().requires_grad_()
        f(x, x, **opts, backend="triton", inplace_backward=inplace).sum().backward()
        assert torch.equal(x.detach(), gu0[:, :33])
        grads.append(x.grad)
    assert torch.equal(grads[1], grads[0])


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("op", ["swiglu", "geglu"])
def test_inplace_backward_twice_is_refused_or_right(op, backend):
    """A second backward through the same graph (retain_graph=True): the Triton backend's
    first one overwrote a and b, so it is refused naming the op (not computed from the
    gradients); torch ignores the flag and gives the same gradients twice."""
    a0, b0 = kernellab.get_spec(op).make_inputs((4, 33), torch.float32, "cpu", 24)
    a, b = a0.clone().requires_grad_(), b0.clone().requires_grad_()
    y = _fn(op)(a, b, backend=backend, inplace_backward=True).sum()
    g1 = torch.autograd.grad(y, (a, b), retain_graph=True)
    if backend == "triton":
        with pytest.raises(RuntimeError, match=rf"{op} \(triton\): .*retain_graph=True"):
            torch.autograd.grad(y, (a, b))
    else:
        g2 = torch.autograd.grad(y, (a, b))
        assert all(torch.equal(u, v) for u, v in zip(g1, g2))


@pytest.mark.parametrize("op", ["swiglu", "geglu"])
def test_inplace_backward_makes_other_users_of_a_raise(op):
    """An MLP-like graph where another node saved the gate ``a`` (a * a, created before the
    op, so its backward runs after ours): with inplace_backward=True it raises PyTorch's
    in-place modification error instead of reading da as a. Without the flag the
    gradient is PyTorch's."""
    f = _fn(op)
    x0 = torch.randn(4, 19, generator=torch.Generator().manual_seed(25))

    def loss(x, inplace):
        a, b = x * 1.5, x - 0.5  # intermediates, as gate_proj(x), up_proj(x)
        z = (a * a).sum()
        return f(a, b, backend="triton", inplace_backward=inplace).sum() + z

    x = x0.clone().requires_grad_()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss(x, True).backward()
    x = x0.clone().requires_grad_()
    loss(x, False).backward()
    xt = x0.clone().requires_grad_()
    at, bt = xt * 1.5, xt - 0.5
    (_torch_op(op, at, bt).sum() + (at * at).sum()).backward()
    torch.testing.assert_close(x.grad, xt.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", ["swiglu", "geglu"])
def test_inplace_backward_is_ignored_under_compile(op):
    """Traced, the custom op declares no mutation: a and b keep their values and version,
    and the gradients are the eager ones."""
    a0, b0 = kernellab.get_spec(op).make_inputs((5, 40), torch.float32, "cpu", 26)
    f = torch.compile(lambda a, b: _fn(op)(a, b, backend="triton", inplace_backward=True), fullgraph=True)
    a, b = a0.clone().requires_grad_(), b0.clone().requires_grad_()
    f(a, b).sum().backward()
    assert torch.equal(a.detach(), a0) and torch.equal(b.detach(), b0)
    assert a._version == 0 and b._version == 0
    _, _, _, da, db = _step(op, {}, "triton", a0, b0, torch.ones_like(a0), False)
    torch.testing.assert_close(a.grad, da, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(b.grad, db, rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("op,opts", CASES, ids=CASE_IDS)
def test_gpu_backends(op, opts, dtype):
    spec = kernellab.get_spec(op)
    for p in backend_matrix(op):
        dev, backend = p.values
        if dev != "cuda" or registry.get(op, backend).why_unavailable("cuda") is not None:
            continue
        if backend == "liger" and registry.get(op, backend).outside_limits((None, None), opts):
            continue
        for shape in ((4097,), (33, 1025), (2, 8192)):
            a, b = spec.make_inputs(shape, dtype, dev, seed_for(op, backend, shape))
            _assert_fwd_bwd(op, backend, a, b, opts)


def test_default_backend_rule():
    """As gelu's: the spec's order (triton, then torch) where usable; on the CPU the
    interpreter is not fast, so torch's op serves the default there."""
    for op in ("swiglu", "geglu"):
        assert kernellab.get_spec(op).default_backends == ("triton", "torch")
        assert registry.default_backend(op, "cpu") == "torch"
    a, b = (torch.randn(3, 5, requires_grad=True) for _ in range(2))
    torch.testing.assert_close(kernellab.swiglu(a, b), F.silu(a) * b)
    torch.testing.assert_close(kernellab.geglu(a, b, "tanh"), F.gelu(a, approximate="tanh") * b)


@pytest.mark.parametrize("op", ["swiglu", "geglu"])
def test_triton_kernels_compile_for_sm90_with_16_byte_accesses(op):
    from kernellab.inspect import asm

    kernels, note = asm.triton_report(registry.get(op, "triton"), "bf16", "sm_90")
    assert {k.name for k in kernels} == {"_glu_fwd_kernel", "_glu_bwd_kernel"}, note
    for k in kernels:
        assert k.counts["ptx_ld_global_v4"] >= 1 and k.counts["ptx_local"] == 0, k.name


def test_first_order_only_refuses_double_backward_and_passes_gradients():
    """The guard put on liger's GLUs: first derivatives pass through unchanged, a
    second one raises instead of returning what an untracked backward computes."""
    from kernellab.ops._peers import first_order_only

    a = torch.randn(5, requires_grad=True)
    y = first_order_only(a * 3.0, "peer")
    (g,) = torch.autograd.grad(y.sum(), a)
    torch.testing.assert_close(g, torch.full_like(a, 3.0))
    y = first_order_only(a * a, "peer")
    with pytest.raises(RuntimeError, match="peer: double backward"):
        torch.autograd.grad(y.sum(), a, create_graph=True)
    assert first_order_only(a.detach(), "peer") is not None


def test_liger_peers_refuse_double_backward(monkeypatch):
    """The liger peers of rms_norm, layer_norm and softmax (kernel backwards that record no
    graph; the H100 check measured silently wrong second derivatives) raise a clear
    RuntimeError under create_graph=True and give first derivatives unchanged. Liger's
    Functions are stood in by ones whose backward, like a kernel's, is detached."""
    import sys
    import types

    class Detached(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, *rest):
            ctx.save_for_backward(x)
            return x * 2.0

        @staticmethod
        def backward(ctx, g):
            return (g.detach() * 2.0,) + (None,) * 5

    for name, cls in (("rms_norm", "LigerRMSNormFunction"), ("layer_norm", "LigerLayerNormFunction"),
                      ("softmax", "LigerSoftmaxFunction")):  # fmt: skip
        mod = types.ModuleType(f"liger_kernel.ops.{name}")
        setattr(mod, cls, Detached)
        monkeypatch.setitem(sys.modules, f"liger_kernel.ops.{name}", mod)
    from kernellab.ops.layer_norm.liger import liger_layer_norm
    from kernellab.ops.rms_norm.liger import liger_rms_norm
    from kernellab.ops.softmax.reference import liger_softmax

    calls = {"rms_norm": lambda x, w: liger_rms_norm(x, w), "layer_norm": lambda x, w: liger_layer_norm(x, w),
             "softmax": lambda x, w: liger_softmax(x)}  # fmt: skip
    for label, call in calls.items():
        x = torch.randn(3, 4, requires_grad=True)
        w = torch.ones(4)
        (g,) = torch.autograd.grad(call(x, w).sum(), x)
        assert torch.equal(g, torch.full_like(x, 2.0)), label
        with pytest.raises(RuntimeError, match="double backward"):
            torch.autograd.grad(call(x, w).sum(), x, create_graph=True)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("op,opts", CASES, ids=CASE_IDS)
def test_gpu_inplace_backward(op, opts, dtype):
    """On the GPU (the launch the interpreter does not model): inplace_backward=True gives
    the same bits, writes da and db into a and b; under torch.compile (triton_op, launched
    by Inductor) it is ignored."""
    spec = kernellab.get_spec(op)
    for shape in ((33, 1025), (2, 8192)):
        a0, b0 = spec.make_inputs(shape, dtype, "cuda", seed_for(op, shape, dtype))
        dy = torch.randn(shape, device="cuda").to(dtype)
        y0, _, _, da0, db0 = _step(op, opts, "triton", a0, b0, dy, False)
        y1, a, b, da1, db1 = _step(op, opts, "triton", a0, b0, dy, True)
        assert torch.equal(y1, y0) and torch.equal(da1, da0) and torch.equal(db1, db0)
        assert torch.equal(a.detach(), da0) and torch.equal(b.detach(), db0)
    # One lambda (one code object) serves every case: reset, or a worker that ran more than
    # eight of the cases hits Dynamo's recompile limit (fullgraph=True fails there).
    torch._dynamo.reset()
    f = torch.compile(lambda a, b: _fn(op)(a, b, **opts, backend="triton", inplace_backward=True),
                      fullgraph=True)  # fmt: skip
    a, b = a0.clone().requires_grad_(), b0.clone().requires_grad_()
    f(a, b).backward(dy)
    assert torch.equal(a.detach(), a0) and torch.equal(b.detach(), b0)
    torch.testing.assert_close(a.grad, da0)
    torch.testing.assert_close(b.grad, db0)
