"""batch_norm2d: every backend that runs here x edge shapes (1x1 images, batch 1 with 1x1
images: variance 0, odd sizes, channels not a multiple of 8, an empty batch) x dtypes,
forward and the three gradients against the float64 reference; layouts; constant channels
(the eps path); the check engine passes the CPU backends and rejects planted mistakes; bad
input names the argument; custom ops (opcheck, torch.compile fullgraph); GPU cases
(marked ``gpu``)."""

from __future__ import annotations

import pytest
import torch

import kernellab
from kernellab.core import registry
from kernellab.harness.check import FAIL, PASS, check_impl
from kernellab.harness.compare import judge
from kernellab.ops.batch_norm2d import batch_norm2d_reference
from kltest import (
    DTYPES,
    assert_per_channel_refusals,
    backend_dtype_shape_params,
    check_planted,
    compile_grads_match,
    cpu_backends,
    cuda_backends,
    dtype_id,
    impl_grads,
    opcheck_custom_ops,
    seed_for,
    shape_id,
)

OP = "batch_norm2d"
SPEC = kernellab.get_spec(OP)
CPU = cpu_backends(OP)
# 1x1 images; batch 1 with 1x1 images (one value per channel: variance 0); odd sizes;
# channels not a multiple of 8; an empty batch; one of the model's layers (triton: its
# interpreter runs programs one by one, so the big shape is left to the other backends).
SHAPES = [(1, 1, 1, 1), (1, 5, 1, 1), (3, 6, 1, 1), (3, 7, 5, 5), (2, 13, 9, 11), (1, 3, 17, 19), (0, 3, 4, 4)]
BIG = (4, 32, 14, 14)


def _torch(x, w, b, eps=1e-5, relu=False):
    y = torch.batch_norm(x, w, b, None, None, True, 0.0, eps, False)
    return torch.relu(y) if relu else y


def _assert_fwd_bwd(backend, args, dtype, eps=1e-5, seed=0, relu=False):
    x, w, b = args
    y = kernellab.batch_norm2d(x, w, b, eps, relu, backend=backend)
    v = judge(y, SPEC.ref(x, w, b, eps=eps, relu=relu), dtype, _torch(x, w, b, eps, relu))
    assert v.ok, f"forward: {v.detail}"
    if relu:
        assert bool((y >= 0).all())
    dy = torch.randn(x.shape, generator=torch.Generator().manual_seed(seed)).to(dtype).to(x.device)
    got = impl_grads(lambda *a: kernellab.batch_norm2d(*a, eps, relu, backend=backend), SPEC, args, dy)
    ref = impl_grads(lambda *a: batch_norm2d_reference(*a, eps, relu), SPEC, [a.double() for a in args], dy.double())
    base = impl_grads(lambda *a: _torch(*a, eps, relu), SPEC, args, dy)
    for name, g, r, t in zip(("dx", "dweight", "dbias"), got, ref, base):
        v = judge(g, r, dtype, t)
        assert v.ok, f"{name}: {v.detail}"
    return y, got


def _matrix():
    return backend_dtype_shape_params(CPU, DTYPES, SHAPES, BIG)


@pytest.mark.parametrize("backend,dtype,shape", _matrix())
def test_forward_and_gradients(backend, dtype, shape):
    seed = seed_for(backend, shape, dtype)
    _assert_fwd_bwd(backend, SPEC.make_inputs(shape, dtype, "cpu", seed), dtype, seed=seed)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
@pytest.mark.parametrize("block,split", [(16, 3), (32, 2), (512, 3)])
def test_triton_chunks_and_blocks(dtype, block, split):
    """The Triton launchers with small blocks: several chunks per channel (the partials'
    merge) of several blocks each (the block loop, Chan's running merge) and a masked
    tail; (4, 5, 7, 9) has 252 values per channel. Statistics and gradients vs float64."""
    from kernellab.ops.batch_norm_kernels import triton_kernels as bt

    cfg = bt.Config(interp_block=block, interp_split=split)
    _, got_split, chunk = bt.grid_of(5, 252, torch.device("cpu"), cfg)
    assert got_split == (split if block < 252 else 1) and chunk % block == 0
    x, w, b = SPEC.make_inputs((4, 5, 7, 9), dtype, "cpu", block)
    y, mean, rstd = bt.bn_fwd(x, w, b, 1e-5, cfg=cfg)
    x64 = x.double()
    torch.testing.assert_close(mean.double(), x64.mean((0, 2, 3)), rtol=0, atol=1e-6)
    torch.testing.assert_close(rstd.double(), (x64.var((0, 2, 3), unbiased=False) + 1e-5).rsqrt(), rtol=1e-6, atol=0)
    v = judge(y, SPEC.ref(x, w, b), dtype, _torch(x, w, b))
    assert v.ok, f"forward: {v.detail}"
    dy = torch.randn(x.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    got = bt.bn_bwd(dy, x, w, b, mean, rstd, cfg=cfg)
    ref = impl_grads(lambda *a: batch_norm2d_reference(*a), SPEC, [a.double() for a in (x, w, b)], dy.double())
    base = impl_grads(_torch, SPEC, (x, w, b), dy)
    for name, g, r, t in zip(("dx", "dweight", "dbias"), got, ref, base):
        v = judge(g, r, dtype, t)
        assert v.ok, f"{name}: {v.detail}"


def _layout_params():
    out = []
    for backend in CPU:
        for layout in ("transposed", "sliced", "offset", "expanded"):
            marks = ()
            if backend == "manual" and layout == "expanded":
                # Found by this test: the naive composition's dweight on an expanded x (every
                # channel the same 7 values repeated) lands at 1.0003x the 2x-PyTorch bound
                # (4.790e-6 against 4.789e-6) under torch 2.13's CPU kernels; a property of the
                # baseline, and so close to the bound that another torch may pass it.
                marks = pytest.mark.xfail(strict=False, reason="manual dweight at the bound on expanded x")
            out.append(pytest.param(backend, layout, marks=marks, id=f"{layout}-{backend}"))
    return out


@pytest.mark.parametrize("backend,layout", _layout_params())
def test_layouts(backend, layout):
    args = SPEC.make_inputs((3, 5, 6, 7), torch.float32, "cpu", 11, layout)
    assert not args[0].is_contiguous() or layout == "offset"
    _assert_fwd_bwd(backend, args, torch.float32)
    # strided weight and bias (every other element of a longer buffer)
    x, w, b = SPEC.make_inputs((3, 5, 6, 7), torch.float32, "cpu", 12)
    _assert_fwd_bwd(backend, (x, torch.stack([w, w], 1)[:, 0], torch.stack([b, b], 1)[:, 0]), torch.float32)


@pytest.mark.parametrize("backend", CPU)
def test_variance_zero_channels_give_the_bias(backend):
    """Constant channels and one value per channel: y = bias exactly, dx = 0, no NaN
    (PyTorch's kernel gives the same; F.batch_norm refuses one value in Python)."""
    x, w, b = SPEC.make_inputs((2, 4, 3, 3), torch.float32, "cpu", 5)
    x[:, 1] = 0.5
    x[:, 2] = 0.0
    y, (dx, dw, db) = _assert_fwd_bwd(backend, (x, w, b), torch.float32)
    # PyTorch's CPU kernel computes y = x * (rstd * w) + (b - mean * rstd * w): with rstd =
    # 1/sqrt(eps) = 316 that leaves ~316 * |x| * 2^-24 of rounding (1.2e-5 measured) where the
    # exact answer is b. Ours (and the naive composition) subtract the mean first: exactly b.
    exact = backend != "torch"
    same = torch.equal if exact else (lambda a, b: torch.allclose(a, b, rtol=0, atol=1e-4))
    assert same(y[:, 1], b[1].expand(2, 3, 3)) and same(y[:, 2], b[2].expand(2, 3, 3))
    one = SPEC.make_inputs((1, 6, 1, 1), torch.float32, "cpu", 6)
    y, (dx, dw, db) = _assert_fwd_bwd(backend, one, torch.float32)
    assert same(y.view(-1), one[2]) and same(dx, torch.zeros_like(dx))
    assert torch.isfinite(dw).all() and torch.isfinite(db).all()


@pytest.mark.parametrize("backend", CPU)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", [(3, 7, 5, 5), (2, 13, 9, 11), (1, 4, 1, 1)], ids=shape_id)
def test_fused_relu(backend, dtype, shape):
    """relu=True: relu(batch_norm(x)) forward, and the backward through both (the mask
    recomputed from x in the kernels), against float64."""
    seed = seed_for(backend, shape, dtype, "relu")
    _assert_fwd_bwd(backend, SPEC.make_inputs(shape, dtype, "cpu", seed), dtype, seed=seed, relu=True)


@pytest.mark.parametrize("backend", CPU)
def test_fused_relu_keeps_nan(backend):
    # relu(NaN) is NaN, as torch.relu's: a NaN in x makes its channel's statistics and every
    # output of the channel NaN, a NaN bias the whole channel; the other channels stay finite
    x, w, b = torch.randn(2, 3, 2, 2), torch.ones(3), torch.zeros(3)
    x[0, 0, 0, 0] = float("nan")
    b[2] = float("nan")
    y = kernellab.batch_norm2d(x, w, b, relu=True, backend=backend)
    assert torch.isnan(y[:, 0]).all() and torch.isnan(y[:, 2]).all()
    torch.testing.assert_close(y[:, 1], _torch(x, w, b, relu=True)[:, 1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", CPU)
def test_other_eps_and_default(backend):
    x, w, b = SPEC.make_inputs((2, 3, 4, 5), torch.bfloat16, "cpu", 3)
    _assert_fwd_bwd(backend, (x, w, b), torch.bfloat16, eps=1e-1)
    y = kernellab.batch_norm2d(x.float(), w.float(), b.float(), backend=backend)  # default eps 1e-5
    torch.testing.assert_close(y, _torch(x.float(), w.float(), b.float()), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", CPU)
def test_bad_inputs_name_the_argument(backend):
    assert_per_channel_refusals(kernellab.batch_norm2d, backend)
    x, w, b = torch.randn(2, 3, 4, 4), torch.ones(3), torch.zeros(3)
    with pytest.raises(TypeError, match="relu"):
        kernellab.batch_norm2d(x, w, b, 1e-5, "yes", backend=backend)


# triton only: on the CPU PyTorch's kernel accumulates in fp64 and the check bounds every
# other backend by twice its error. Found by this check: the naive composition (manual)
# misses that bound by ~5% on dweight for a sliced x (1.77e-6 against 1.69e-6), and
# PyTorch's own op misses the documented fp32 tolerance on a 1x1x1 batch of one (1.2e-5
# against 2e-6: its y = x * a + c form, see test_variance_zero_channels_give_the_bias).
@pytest.mark.parametrize("backend", [b for b in CPU if b == "triton"])
def test_check_engine_passes(backend):
    rep = check_impl(registry.get(OP, backend), torch.float32, device="cpu", quick=True, opcheck=False, seed=1)
    assert rep.status == PASS, [(c.kind, c.name, c.detail) for c in rep.failures]


# Planted mistakes, each caught by some stage of the check.
def _bn(x, w, b, eps, *, unbiased=False, eps_out=False, per_image=False, dims=(0, 2, 3)):
    x32 = x.float()
    dims = (2, 3) if per_image else dims
    mean = x32.mean(dims, keepdim=True)
    var = x32.var(dims, keepdim=True, unbiased=unbiased)
    r = 1.0 / (torch.sqrt(var) + eps) if eps_out else torch.rsqrt(var + eps)
    c = (1, -1, 1, 1)
    return ((x32 - mean) * r * w.float().view(c) + b.float().view(c)).to(x.dtype)


class _NoStatsGrad(torch.autograd.Function):
    # right forward; dx treats the batch statistics as constants (dx = w * rstd * dy)
    @staticmethod
    def forward(ctx, x, w, b, eps):
        ctx.save_for_backward(x, w, b)
        ctx.eps = eps
        return _bn(x, w, b, eps)

    @staticmethod
    def backward(ctx, dy):
        x, w, b = ctx.saved_tensors
        with torch.enable_grad():
            ws, bs = w.detach().requires_grad_(), b.detach().requires_grad_()
            dw, db = torch.autograd.grad(_bn(x, ws, bs, ctx.eps), (ws, bs), dy)
        rstd = torch.rsqrt(x.float().var((0, 2, 3), unbiased=False) + ctx.eps)
        dx = dy.float() * (w.float() * rstd).view(1, -1, 1, 1)
        return dx.to(x.dtype), dw, db, None


PLANTED = {
    "unbiased_variance": lambda x, w, b, eps=1e-5: _bn(x, w, b, eps, unbiased=True),
    "eps_outside_sqrt": lambda x, w, b, eps=1e-5: _bn(x, w, b, eps, eps_out=True),
    "stats_per_image": lambda x, w, b, eps=1e-5: _bn(x, w, b, eps, per_image=True),
    "stats_over_channels": lambda x, w, b, eps=1e-5: _bn(x, w, b, eps, dims=(1, 2, 3)),
    "stats_not_differentiated": lambda x, w, b, eps=1e-5: _NoStatsGrad.apply(x, w, b, eps),
}


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_planted_mistakes_are_rejected(name):
    rep = check_planted(OP, name, PLANTED[name])
    assert rep.status == FAIL, f"planted {name} passed the check"


def test_custom_ops_opcheck():
    opcheck_custom_ops(registry.get(OP, "triton").custom_ops, SPEC, (2, 3, 5, 4))


def test_under_torch_compile_fullgraph():
    x, w, b = SPEC.make_inputs((2, 3, 5, 4), torch.float32, "cpu", 4)
    compile_grads_match(lambda x, w, b: kernellab.batch_norm2d(x, w, b, backend="triton"), _torch, (x, w, b))


def test_compile_backend_quick():
    x, w, b = SPEC.make_inputs((3, 4, 5, 5), torch.float32, "cpu", 6)
    torch.testing.assert_close(kernellab.batch_norm2d(x, w, b, backend="compile"), _torch(x, w, b))


def test_cuda_source_compiles():
    from kernellab.cuda.runtime import nvrtc_unavailable

    if nvrtc_unavailable():
        pytest.skip(nvrtc_unavailable())
    impl = registry.get(OP, "cuda")
    lines = impl.precompile()
    assert any("sm_90" in line for line in lines), lines


# --------------------------------------------------------------------------- GPU

GPU_SHAPES = [(1, 1, 1, 1), (1, 5, 1, 1), (3, 7, 5, 5), (2, 13, 9, 11), (64, 32, 28, 28), (256, 64, 14, 14),
              (1024, 32, 28, 28), (7, 3, 300, 301)]  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("backend", cuda_backends(OP))
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_gpu_forward_and_gradients(backend, dtype):
    impl = registry.get(OP, backend)
    if impl.why_unavailable("cuda"):
        pytest.skip(impl.why_unavailable("cuda"))
    for shape in GPU_SHAPES:
        args = SPEC.make_inputs(shape, dtype, "cuda", seed_for(backend, shape))
        _assert_fwd_bwd(backend, args, dtype, seed=1)
    x, w, b = SPEC.make_inputs((3, 5, 6, 7), dtype, "cuda", 2, "transposed")
    _assert_fwd_bwd(backend, (x, w, b), dtype, eps=1e-2)
    for shape in [(3, 7, 5, 5), (64, 32, 28, 28)]:
        args = SPEC.make_inputs(shape, dtype, "cuda", seed_for(backend, shape, "relu"))
        _assert_fwd_bwd(backend, args, dtype, seed=2, relu=True)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_gpu_check_engine(backend):
    for dtype in DTYPES:
        rep = check_impl(registry.get(OP, backend), dtype, device="cuda", quick=True)
        assert rep.status == PASS, [(c.kind, c.name, c.detail) for c in rep.failures]
