"""add_rms_norm: every backend that runs here x odd shapes x dtypes, both outputs and the
gradients of x, residual and weight (through the grad_outputs of both outputs, or either
alone) against the float64 reference; strided inputs; bad inputs naming the argument; the
Triton backend bitwise equal to add then rms_norm_triton, its custom ops (opcheck,
torch.compile fullgraph) and the check engine. GPU cases are marked ``gpu``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kernellab
from kernellab.core import registry
from kernellab.harness.check import FAIL, PASS, check_impl
from kernellab.harness.compare import judge
from kltest import (
    DTYPES,
    LAYOUTS,
    check_planted,
    cpu_backends,
    cuda_backends,
    dtype_id,
    opcheck_custom_ops,
    seed_for,
    shape_id,
)

OP = "add_rms_norm"
SPEC = kernellab.get_spec(OP)
CPU = cpu_backends(OP)
SHAPES = [(1,), (17,), (3, 123), (5, 1025), (2, 3, 257), (70, 3), (0, 7)]


def _torch(x, r, w, eps=1e-6):
    h = x + r
    return F.rms_norm(h, (h.shape[-1],), w, eps), h


def _run(fn, args, dys, use="both"):
    """Outputs and the gradients of (x, residual, weight) of ``fn`` on fresh leaves (strides
    kept), through the grad_outputs ``dys`` of the outputs ``use`` names."""
    leaves = [a.detach().clone() if a.is_contiguous() else a.detach() for a in args]
    leaves = [a.requires_grad_() for a in leaves]
    y, h = fn(*leaves)
    outs, gs = {"both": ((y, h), dys), "y": ((y,), dys[:1]), "h": ((h,), dys[1:])}[use]
    grads = torch.autograd.grad(outs, leaves, gs, allow_unused=True)
    return (y.detach(), h.detach()), [torch.zeros_like(a) if g is None else g for a, g in zip(leaves, grads)]


def _assert_matches(backend, args, eps=1e-6, seed=0, use="both"):
    dtype = args[0].dtype
    gen = torch.Generator().manual_seed(seed)
    dev = args[0].device
    dys = tuple(torch.randn(args[0].shape, generator=gen).to(device=dev, dtype=dtype) for _ in range(2))
    out, got = _run(lambda *a: kernellab.add_rms_norm(*a, eps, backend=backend), args, dys, use)
    args64, dys64 = [a.double() for a in args], tuple(d.double() for d in dys)
    ref_out, ref = _run(lambda *a: SPEC.reference(*a, eps), args64, dys64, use)
    base_out, base = _run(lambda *a: _torch(*a, eps), args, dys, use)
    torch_itself = backend == "torch"  # held to the documented tolerance, as the check does
    for name, o, r, t in zip(("normed", "new_residual"), out, ref_out, base_out):
        assert o.shape == args[0].shape and o.dtype == dtype
        v = judge(o, r, dtype, None if torch_itself else t)
        assert v.ok, f"{backend} {name}: {v.detail}"
    for name, g, r, t in zip(("dx", "dresidual", "dweight"), got, ref, base):
        assert g.dtype == dtype
        v = judge(g, r, dtype, None if torch_itself else t)
        assert v.ok, f"{backend} {name} ({use}): {v.detail} (err {v.err:.3g}, bound {v.bound:.3g})"


@pytest.mark.parametrize("backend", CPU)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_outputs_and_gradients(backend, dtype, shape):
    seed = seed_for(backend, shape, dtype)
    _assert_matches(backend, SPEC.make_inputs(shape, dtype, "cpu", seed), seed=seed)


@pytest.mark.parametrize("use", ["y", "h"])
@pytest.mark.parametrize("backend", CPU)
def test_gradients_through_one_output(backend, use):
    """An output nobody differentiates reaches the backward as None (or zeros): with only
    new_residual used, dx = dresidual = its grad_output and dweight = 0."""
    args = SPEC.make_inputs((6, 300), torch.float32, "cpu", 3)
    _assert_matches(backend, args, use=use)


def test_cpu_backends_here():
    assert {"manual", "torch", "triton"} <= set(CPU), CPU


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("backend", CPU)
def test_strided_inputs(backend, layout):
    x, r, w = SPEC.make_inputs((9, 66), torch.float32, "cpu", seed_for(layout, backend), layout)
    _assert_matches(backend, (x, r, w))
    _assert_matches(backend, (x.contiguous(), r, w))  # one argument strided, the other not
    _assert_matches(backend, (x, r, torch.stack([w, w], -1)[:, 0]))  # a strided weight too


@pytest.mark.parametrize("backend", CPU)
def test_other_eps(backend):
    args = SPEC.make_inputs((6, 300), torch.bfloat16, "cpu", 3)
    _assert_matches(backend, args, eps=1e-2)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_triton_is_add_then_rms_norm_bitwise(dtype):
    """The fused kernels round as the two ops would: new_residual is x + residual in x's
    dtype, normed is rms_norm_triton of it, and every gradient equals that of add then
    rms_norm_triton (the residual stream's gradient added after dx's rounding)."""
    x, r, w = SPEC.make_inputs((7, 129), dtype, "cpu", 11)
    dys = tuple(torch.randn(7, 129, generator=torch.Generator().manual_seed(i)).to(dtype) for i in range(2))
    out, got = _run(lambda *a: kernellab.add_rms_norm(*a, backend="triton"), (x, r, w), dys)

    def two_ops(x, r, w):
        h = x + r
        return kernellab.rms_norm(h, w, backend="triton"), h

    out2, want = _run(two_ops, (x, r, w), dys)
    for a, b in zip(list(out) + got, list(out2) + want):
        assert torch.equal(a, b)


# --------------------------------------------------------------------------- bad inputs


@pytest.mark.parametrize("backend", CPU)
def test_bad_inputs_name_the_argument(backend):
    f = kernellab.add_rms_norm
    x, r, w = torch.randn(4, 8), torch.randn(4, 8), torch.ones(8)
    with pytest.raises(ValueError, match=r"\bresidual\b.*shape"):
        f(x, torch.randn(4, 9), w, backend=backend)
    with pytest.raises(ValueError, match=r"\bresidual\b.*shape"):
        f(x, torch.randn(8), w, backend=backend)  # no broadcasting
    with pytest.raises(TypeError, match=r"\bresidual\b.*dtype"):
        f(x, r.half(), w, backend=backend)
    with pytest.raises(TypeError, match=r"\bresidual\b.*dtype"):
        f(x, r.int(), w, backend=backend)
    with pytest.raises(TypeError, match=r"\bx\b.*dtype"):
        f(x.int(), r, w, backend=backend)
    with pytest.raises(TypeError, match=r"\bweight\b.*dtype"):
        f(x, r, w.bfloat16(), backend=backend)
    with pytest.raises(TypeError, match=r"\bweight\b.*dtype"):
        f(x, r, w.long(), backend=backend)
    with pytest.raises(ValueError, match=r"\bweight\b.*shape"):
        f(x, r, torch.ones(4, 8), backend=backend)
    with pytest.raises(ValueError, match=r"\bweight\b.*shape"):
        f(x, r, torch.ones(9), backend=backend)
    with pytest.raises(ValueError, match=r"\bx\b"):
        f(torch.tensor(1.0), torch.tensor(2.0), torch.ones(1), backend=backend)
    with pytest.raises(TypeError, match=r"\bresidual\b"):
        f(x, None, w, backend=backend)
    for eps in (-1e-5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="eps"):
            f(x, r, w, eps, backend=backend)
    with pytest.raises(TypeError, match="eps"):
        f(x, r, w, "small", backend=backend)
    if backend == "triton":
        with pytest.raises(TypeError, match=r"\bx\b"):
            f(x.double(), r.double(), w.double(), backend=backend)


# --------------------------------------------------------------------------- custom ops, check


def test_triton_opcheck_and_compile_fullgraph():
    fn = registry.get(OP, "triton").fn
    assert len(fn.custom_ops) == 2
    opcheck_custom_ops(fn.custom_ops, SPEC, (4, 33))
    x, r, w = SPEC.make_inputs((5, 40), torch.float32, "cpu", 4)
    f = torch.compile(lambda x, r, w: [t * 2 for t in fn(x, r, w, 1e-6)], fullgraph=True, backend="aot_eager")
    leaves = [t.clone().requires_grad_() for t in (x, r, w)]
    y, h = f(*leaves)
    (y.sum() + (h * h).sum()).backward()
    ref = [t.clone().requires_grad_() for t in (x, r, w)]
    y2, h2 = _torch(*ref)
    (2 * y2.sum() + (2 * h2 * 2 * h2).sum()).backward()
    torch.testing.assert_close(y, 2 * y2)
    for a, b in zip(leaves, ref):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5)


def test_check_engine_passes_triton():
    impl = registry.get(OP, "triton")
    rep = check_impl(impl, torch.float32, device="cpu", quick=True, opcheck=False, seed=1)
    assert rep.status == PASS, [(c.kind, c.name, c.detail) for c in rep.failures]


def _residual_dropped(x, r, w, eps=1e-6):  # forgets the residual in the norm
    return F.rms_norm(x, (x.shape[-1],), w, eps), x + r


@pytest.mark.parametrize("name,fn", [("residual_dropped", _residual_dropped)])
def test_check_engine_rejects_planted_mistakes(name, fn):
    rep = check_planted(OP, name, fn)
    assert rep.status == FAIL, name


# --------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", [(4, 4096), (1025, 768), (70000, 3)], ids=shape_id)
def test_gpu_backends(shape, dtype):
    for backend in cuda_backends(OP):
        args = [a.cuda() for a in SPEC.make_inputs(shape, dtype, "cpu", seed_for(backend, shape, dtype))]
        _assert_matches(backend, args)
