"""rms_norm: every backend that runs here x odd shapes x dtypes, forward and both
gradients against the float64 reference; all-zero rows (the eps path); fp32 math through
the weight multiply like PyTorch; the check engine passes the CPU backends and rejects
planted mistakes; custom ops (opcheck, torch.compile fullgraph); GPU cases (``gpu``)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kernellab
import kernellab.ops.rms_norm as rn
from kernellab.core import registry
from kernellab.harness.check import FAIL, PASS, check_impl
from kernellab.harness.compare import judge
from kltest import (
    DTYPES,
    check_planted,
    compile_grads_match,
    cpu_backends,
    cuda_backends,
    dtype_id,
    opcheck_custom_ops,
    rounds_like_torch,
    seed_for,
    shape_id,
)

OP = "rms_norm"
SPEC = kernellab.get_spec(OP)
CPU = cpu_backends(OP)
SHAPES = [(1,), (17,), (3, 123), (5, 1025), (2, 3, 257), (70, 3), (2, 4097)]


def _torch(x, w, eps=1e-6):
    return F.rms_norm(x, (x.shape[-1],), w, eps)


def _grads(fn, args, dy):
    leaves = [a.detach().clone().requires_grad_() for a in args]
    return torch.autograd.grad(fn(*leaves), leaves, dy)


def _assert_fwd_bwd(backend, args, dtype, eps=1e-6, seed=0):
    x, w = args
    y = rn.rms_norm(x, w, eps, backend=backend)
    v = judge(y, SPEC.ref(x, w, eps=eps), dtype, _torch(x, w, eps))
    assert v.ok, f"forward: {v.detail}"
    dy = torch.randn(x.shape, generator=torch.Generator().manual_seed(seed)).to(dtype).to(x.device)
    got = _grads(lambda *a: rn.rms_norm(*a, eps, backend=backend), args, dy)
    ref = _grads(lambda *a: rn.rms_norm_reference(*a, eps), [a.double() for a in args], dy.double())
    base = _grads(lambda *a: _torch(*a, eps), args, dy)
    for name, g, r, t in zip(("dx", "dweight"), got, ref, base):
        v = judge(g, r, dtype, t)
        assert v.ok, f"{name}: {v.detail}"


@pytest.mark.parametrize("backend", CPU)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_forward_and_gradients(backend, dtype, shape):
    seed = seed_for(backend, shape, dtype)
    _assert_fwd_bwd(backend, SPEC.make_inputs(shape, dtype, "cpu", seed), dtype, seed=seed)


@pytest.mark.parametrize("backend", CPU)
def test_other_eps_and_defaults(backend):
    x, w = SPEC.make_inputs((6, 300), torch.bfloat16, "cpu", 3)
    _assert_fwd_bwd(backend, (x, w), torch.bfloat16, eps=1e-2)
    y = rn.rms_norm(x, w, backend=backend)  # default eps 1e-6
    v = judge(y, SPEC.ref(x, w), torch.bfloat16, _torch(x, w))
    assert v.ok, v.detail


@pytest.mark.parametrize("backend", CPU)
def test_zero_rows_normalize_through_eps(backend):
    x, w = SPEC.make_inputs((4, 257), torch.float32, "cpu", 5)
    x[2] = 0.0  # rstd = 1 / sqrt(eps): y = 0, dx = dy * w / sqrt(eps)
    x[1] = 0.5  # constant: y = w * 0.5 / sqrt(0.25 + eps)
    y = rn.rms_norm(x, w, backend=backend)
    assert torch.equal(y[2], torch.zeros_like(y[2]))
    torch.testing.assert_close(y[1], w * (0.5 / (0.25 + 1e-6) ** 0.5))
    _assert_fwd_bwd(backend, (x, w), torch.float32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=dtype_id)
def test_weight_multiply_in_fp32_like_torch(dtype):
    # Rounding x * rstd to 16 bits before the weight multiply ("llama" casting) changes
    # ~25% of the outputs against torch; computing through the weight in fp32 and rounding
    # once (what torch does) changes almost none (only where rstd's last fp32 bit differs).
    x, w = SPEC.make_inputs((64, 1000), dtype, "cpu", 8)
    ref = _torch(x, w)
    x32 = x.float()
    llama = (x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + 1e-6)).to(dtype) * w
    assert (llama != ref).float().mean() > 0.1  # the test can tell the two apart
    for backend in CPU:
        if not rounds_like_torch(backend, dtype, "cpu"):
            continue  # the Triton interpreter truncates fp32 -> bf16 (see kltest)
        frac = (rn.rms_norm(x, w, backend=backend) != ref).float().mean().item()
        assert frac < 1e-3, (backend, frac)


@pytest.mark.parametrize("backend", [b for b in CPU if b in ("triton", "manual")])
def test_check_engine_passes(backend):
    rep = check_impl(
        registry.get(OP, backend), torch.float32, device="cpu", quick=True, opcheck=False, seed=1
    )
    assert rep.status == PASS, [(c.kind, c.name, c.detail) for c in rep.failures]


def _rms(x, w, eps, *, eps_out=False, mean_sq=True):
    x32 = x.float()
    ms = x32.square().mean(-1, keepdim=True) if mean_sq else x32.square().sum(-1, keepdim=True)
    r = 1.0 / (torch.sqrt(ms) + eps) if eps_out else torch.rsqrt(ms + eps)
    return (x32 * r * w.float()).to(x.dtype)


class _WrongDW(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, eps):
        ctx.save_for_backward(x, w)
        ctx.eps = eps
        return _rms(x, w, eps)

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        with torch.enable_grad():
            xs = x.detach().requires_grad_()
            (dx,) = torch.autograd.grad(_rms(xs, w, ctx.eps), xs, dy)
        # dweight = sum(dy * x): forgets rstd
        dw = (dy.float() * x.float()).reshape(-1, x.shape[-1]).sum(0)
        return dx, dw.to(w.dtype), None


PLANTED = {
    "ignores_eps": lambda x, w, eps=1e-6: _rms(x, w, 0.0),  # NaN on all-zero rows
    "eps_outside_sqrt": lambda x, w, eps=1e-6: _rms(x, w, eps, eps_out=True),
    "sum_not_mean": lambda x, w, eps=1e-6: _rms(x, w, eps, mean_sq=False),
    "wrong_dweight": lambda x, w, eps=1e-6: _WrongDW.apply(x, w, eps),
    "centers_like_layer_norm": lambda x, w, eps=1e-6: _rms(
        x - x.float().mean(-1, keepdim=True).to(x.dtype), w, eps
    ),
}


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_planted_mistakes_are_rejected(name):
    rep = check_planted(OP, name, PLANTED[name])
    assert rep.status == FAIL, f"planted {name} passed the check"


def test_bad_inputs_name_the_argument():
    x = torch.randn(3, 8)
    with pytest.raises(ValueError, match="weight"):
        rn.rms_norm(x, torch.ones(3, 8), backend="triton")
    with pytest.raises(TypeError, match="weight"):
        rn.rms_norm(x, torch.ones(8, dtype=torch.bfloat16), backend="triton")
    with pytest.raises(ValueError, match="eps"):
        rn.rms_norm(x, torch.ones(8), eps=-1e-6, backend="manual")
    with pytest.raises(TypeError, match="offset"):
        kernellab.registry.call(OP, "triton", x, torch.ones(8), offset=1.0)
    with pytest.raises(TypeError, match="rms_norm"):
        kernellab.registry.call(OP, "triton", x, torch.ones(8), torch.ones(8))  # a bias it has not


@pytest.mark.parametrize("shape", [(3, 16411), (2, 16392)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_triton_rows_wider_than_the_register_limit(shape, dtype):
    """Rows past the Triton norms' register limit (16384) take the streamed kernels of
    wide.py (interpreter here): output and gradients within the float64 bounds."""
    _assert_fwd_bwd("triton", SPEC.make_inputs(shape, dtype, "cpu", 5), dtype, seed=2)


def test_custom_ops_opcheck():
    opcheck_custom_ops(registry.get(OP, "triton").custom_ops, SPEC, (4, 33))


def test_under_torch_compile_fullgraph():
    x, w = SPEC.make_inputs((5, 40), torch.float32, "cpu", 4)
    compile_grads_match(lambda x, w: rn.rms_norm(x, w, backend="triton"), _torch, (x, w))


def test_compile_backend_quick():
    x, w = SPEC.make_inputs((4, 100), torch.float32, "cpu", 6)
    torch.testing.assert_close(rn.rms_norm(x, w, backend="compile"), _torch(x, w))


# --------------------------------------------------------------------------- GPU

GPU_SHAPES = [(1,), (3, 123), (70000, 3), (17, 1025), (256, 4096), (64, 8192), (8, 16384), (3, 20000),
              (65, 50257), (9, 32768)]  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("backend", cuda_backends(OP))
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_gpu_forward_and_gradients(backend, dtype):
    impl = registry.get(OP, backend)
    if impl.why_unavailable("cuda"):
        pytest.skip(impl.why_unavailable("cuda"))
    for shape in GPU_SHAPES:
        _assert_fwd_bwd(
            backend, SPEC.make_inputs(shape, dtype, "cuda", seed_for(backend, shape)), dtype, seed=1
        )
    _, w = SPEC.make_inputs((33, 4096), dtype, "cuda", 2)
    flat = torch.randn(33 * 4096 + 1, device="cuda").to(dtype)
    _assert_fwd_bwd(backend, (flat[1:].view(33, 4096), w), dtype)  # misaligned rows
    _assert_fwd_bwd(backend, SPEC.make_inputs((33, 4096), dtype, "cuda", 3), dtype, eps=1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "cuda_v1", "triton"])
def test_gpu_check_engine(backend):
    for dtype in DTYPES:
        rep = check_impl(registry.get(OP, backend), dtype, device="cuda", quick=True)
        assert rep.status == PASS, [(c.kind, c.name, c.detail) for c in rep.failures]
