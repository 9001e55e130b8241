"""bn_relu_pool2d: every backend that runs here x edge shapes (2x2 images, batch 1, odd
sizes whose last row / column the pool drops, channels not a multiple of 8, an empty
batch) x dtypes, forward and the three gradients against the float64 reference; the
Triton launchers with small blocks (several chunks per channel); the saved int8 codes;
the odd-size, tie, relu-closed and NaN rules; agreement with the unfused kernellab chain;
layouts; bad input names the argument; the check engine passes the Triton backend and
rejects planted mistakes; custom ops (opcheck, torch.compile fullgraph); GPU cases at the
MNIST model's shapes (marked ``gpu``)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kernellab
from kernellab.core import registry
from kernellab.harness.check import FAIL, PASS, check_impl
from kernellab.harness.compare import judge
from kernellab.ops.bn_relu_pool2d import bn_relu_pool2d_reference
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

OP = "bn_relu_pool2d"
SPEC = kernellab.get_spec(OP)
CPU = cpu_backends(OP)
# 2x2 images (one window), batch 1, odd sizes (3x3: one window and a dropped row and
# column), channels not a multiple of 8, an empty batch; the interpreter runs Triton's
# programs one by one, so the model-sized shape is left to the other backends.
SHAPES = [(1, 1, 2, 2), (2, 3, 2, 2), (1, 5, 3, 3), (3, 7, 5, 5), (2, 13, 9, 11), (1, 3, 17, 19), (0, 3, 4, 4)]
BIG = (4, 32, 14, 14)


def _torch(x, w, b, eps=1e-5):
    y = torch.batch_norm(x, w, b, None, None, True, 0.0, eps, False)
    return F.max_pool2d(F.relu(y), 2, 2)


def _assert_fwd_bwd(backend, args, dtype, eps=1e-5, seed=0):
    x, w, b = args
    z = kernellab.bn_relu_pool2d(x, w, b, eps, backend=backend)
    assert z.shape == (x.shape[0], x.shape[1], x.shape[2] // 2, x.shape[3] // 2) and z.dtype == dtype
    v = judge(z, SPEC.ref(x, w, b, eps=eps), dtype, _torch(x, w, b, eps))
    assert v.ok, f"forward: {v.detail}"
    assert bool((z >= 0).all())
    dz = torch.randn(z.shape, generator=torch.Generator().manual_seed(seed)).to(dtype).to(x.device)
    got = impl_grads(lambda *a: kernellab.bn_relu_pool2d(*a, eps, backend=backend), SPEC, args, dz)
    ref = impl_grads(lambda *a: bn_relu_pool2d_reference(*a, eps), SPEC, [a.double() for a in args], dz.double())
    base = impl_grads(lambda *a: _torch(*a, eps), SPEC, args, dz)
    for name, g, r, t in zip(("dx", "dweight", "dbias"), got, ref, base):
        v = judge(g, r, dtype, t)
        assert v.ok, f"{name}: {v.detail}"
    return z, got


def _matrix():
    return backend_dtype_shape_params(CPU, DTYPES, SHAPES, BIG)


@pytest.mark.parametrize("backend,dtype,shape", _matrix())
def test_forward_and_gradients(backend, dtype, shape):
    seed = seed_for(backend, shape, dtype)
    _assert_fwd_bwd(backend, SPEC.make_inputs(shape, dtype, "cpu", seed), dtype, seed=seed)


def _codes_reference(x, w, b, eps=1e-5):
    """int8 codes from float64: argmax r * 2 + s of the window's first maximum of the
    pre-activation, -1 where that maximum is <= 0."""
    x64 = x.double()
    mean = x64.mean((0, 2, 3), keepdim=True)
    var = x64.var((0, 2, 3), unbiased=False, keepdim=True)
    c = (1, -1, 1, 1)
    a = (x64 - mean) / torch.sqrt(var + eps) * w.double().view(c) + b.double().view(c)
    p, q = x.shape[2] // 2, x.shape[3] // 2
    win = a[:, :, : 2 * p, : 2 * q].unfold(2, 2, 2).unfold(3, 2, 2).reshape(*a.shape[:2], p, q, 4)
    best, arg = win.max(-1)  # the first maximum
    return torch.where(best > 0, arg, -1).to(torch.int8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
@pytest.mark.parametrize("block,split", [(16, 3), (64, 2), (512, 3)])
def test_triton_chunks_and_blocks(dtype, block, split):
    """The Triton launchers with small blocks: several chunks per channel for each of the
    four kernels (the statistics merge, the backward partials) and several blocks per chunk
    with a masked tail. (4, 5, 9, 11): 396 values and 80 windows per channel, an odd size.
    Statistics, codes, z and the gradients against float64."""
    from kernellab.ops.batch_norm_kernels import triton_kernels as bt

    cfg = bt.Config(interp_block=block, interp_split=split)
    x, w, b = SPEC.make_inputs((4, 5, 9, 11), dtype, "cpu", block)
    z, code, mean, rstd = bt.brp_fwd(x, w, b, 1e-5, cfg=cfg)
    x64 = x.double()
    torch.testing.assert_close(mean.double(), x64.mean((0, 2, 3)), rtol=0, atol=1e-6)
    torch.testing.assert_close(rstd.double(), (x64.var((0, 2, 3), unbiased=False) + 1e-5).rsqrt(), rtol=1e-6, atol=0)
    assert torch.equal(code, _codes_reference(x, w, b))
    v = judge(z, SPEC.ref(x, w, b), dtype, _torch(x, w, b))
    assert v.ok, f"forward: {v.detail}"
    dz = torch.randn(z.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    got = bt.brp_bwd(dz, x, w, code, mean, rstd, cfg=cfg)
    ref = impl_grads(bn_relu_pool2d_reference, SPEC, [a.double() for a in (x, w, b)], dz.double())
    base = impl_grads(_torch, SPEC, (x, w, b), dz)
    for name, g, r, t in zip(("dx", "dweight", "dbias"), got, ref, base):
        v = judge(g, r, dtype, t)
        assert v.ok, f"{name}: {v.detail}"


def test_saves_codes_and_stats_not_the_activation():
    """What the forward keeps for the backward: x, weight, the int8 codes (one per pooled
    output) and the two fp32 statistics; no normalized tensor."""
    impl = registry.get(OP, "triton")
    x, w, b = SPEC.make_inputs((2, 3, 6, 8), torch.float32, "cpu", 3)
    z, (tensors, _) = impl.fn.forward_saving(x, w, b, 1e-5)
    shapes = [(tuple(t.shape), t.dtype) for t in tensors]
    assert shapes == [((2, 3, 6, 8), torch.float32), ((3,), torch.float32), ((2, 3, 3, 4), torch.int8),
                      ((3,), torch.float32), ((3,), torch.float32)]  # fmt: skip
    assert tensors[0] is x and torch.equal(tensors[2], _codes_reference(x, w, b))


@pytest.mark.parametrize("backend", CPU)
def test_odd_sizes_pool_floors_but_the_statistics_count_every_value(backend):
    """5x7 images: the pool covers rows 0-3 and columns 0-5; row 4 and column 6 (made
    large here, so that they move the statistics a lot) are in the mean and variance, get
    no gradient through the pool, and still get dx from the batch-statistics terms."""
    x, w, b = SPEC.make_inputs((2, 3, 5, 7), torch.float32, "cpu", 21)
    x[:, :, 4, :] += 5.0
    x[:, :, :, 6] -= 4.0
    z, (dx, dw, db) = _assert_fwd_bwd(backend, (x, w, b), torch.float32)
    cropped = bn_relu_pool2d_reference(x[:, :, :4, :6].double(), w.double(), b.double())
    assert (z.double() - cropped).abs().max() > 0.1  # statistics of the cropped image differ
    assert bool((dx[:, :, 4, :] != 0).all()) and bool((dx[:, :, :, 6] != 0).all())


@pytest.mark.parametrize("backend", CPU)
def test_ties_go_to_the_first_maximum_and_closed_windows_pass_nothing(backend):
    """One channel, two images of 2x4 (two windows each), dz = 10, 20, 30, 40: window 0
    ties at (0, 1) and (1, 0) (the first, (0, 1), takes dz); window 1 has its maximum at
    (1, 1); image 1's windows are all below the mean, so with bias -2 the relu closes them
    (z = 0, no gradient). weight 0 in a second channel: every pre-activation equals the
    bias (> 0): a four-way tie, the first position takes dz."""
    x = torch.tensor([[[1.0, 3.0, 0.0, 1.0], [3.0, 2.0, 2.0, 4.0]],
                      [[-3.0, -2.0, -3.0, -2.5], [-2.0, -3.0, -2.5, -3.0]]]).unsqueeze(1)  # fmt: skip
    x = torch.cat([x, x + 0.5], 1)  # [2, 2, 2, 4]
    w, b = torch.tensor([1.0, 0.0]), torch.tensor([-0.25, 0.7])
    dz = torch.tensor([10.0, 20.0, 30.0, 40.0]).view(2, 1, 1, 2).expand(2, 2, 1, 2).contiguous()
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    z = kernellab.bn_relu_pool2d(*leaves, backend=backend)
    ref = bn_relu_pool2d_reference(x.double(), w.double(), b.double())
    torch.testing.assert_close(z.double(), ref, rtol=1e-6, atol=1e-6)
    assert z[1, 0].abs().sum() == 0 and (ref[1, 0] == 0).all()  # closed by the relu
    assert torch.equal(z[:, 1], torch.full((2, 1, 2), 0.7))  # weight 0: z = bias
    dx, dw, db = torch.autograd.grad(z, leaves, dz)
    r = [t.double().requires_grad_() for t in (x, w, b)]
    rdx, rdw, rdb = torch.autograd.grad(bn_relu_pool2d_reference(*r), r, dz.double())
    torch.testing.assert_close(dx.double(), rdx, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dw.double(), rdw, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(db.double(), rdb, rtol=1e-5, atol=1e-5)
    # channel 0: db = 10 + 20 (image 1's windows closed); channel 1: every window open
    assert db.tolist() == pytest.approx([30.0, 100.0])
    # weight 0 gives k = w * rstd = 0: dx = 0 in channel 1 whatever dz
    assert torch.equal(dx[:, 1], torch.zeros_like(dx[:, 1]))


def test_ties_route_like_the_reference_in_the_triton_codes():
    """The saved codes of the tie example: (0, 1) -> 1, (1, 1) -> 3, closed -> -1, the
    four-way tie -> 0."""
    x = torch.tensor([[[1.0, 3.0, 0.0, 1.0], [3.0, 2.0, 2.0, 4.0]],
                      [[-3.0, -2.0, -3.0, -2.5], [-2.0, -3.0, -2.5, -3.0]]]).unsqueeze(1)  # fmt: skip
    x = torch.cat([x, x + 0.5], 1)
    w, b = torch.tensor([1.0, 0.0]), torch.tensor([-0.25, 0.7])
    _, (tensors, _) = registry.get(OP, "triton").fn.forward_saving(x, w, b, 1e-5)
    assert tensors[2].view(2, 2, 2).tolist() == [[[1, 3], [0, 0]], [[-1, -1], [0, 0]]]


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_triton_picks_the_maximum_exactly_where_rounding_would_tie(sign):
    """0.5 and 0.5 + 1e-6 in one window, bias 100: their fp32 pre-activations round to the
    same value near 100 (ulp 7.6e-6), so a pool over rounded activations sees a tie and
    takes the first; the Triton kernel compares x * sign(weight) and routes the gradient
    to the true maximum, the float64 reference's choice. With weight -1 the maximum is
    the window's smallest x."""
    x = torch.tensor([[0.5, 0.5 + 1e-6, 0.3, -0.2], [-1.0, -0.7, 1.1, -1.5]]).view(1, 1, 2, 4)
    w, b = torch.tensor([sign]), torch.tensor([100.0])
    mean, rstd = x.mean(), torch.rsqrt(x.var(unbiased=False) + 1e-5)
    a32 = (x - mean) * (rstd * w) + b
    if sign > 0:
        assert a32[0, 0, 0, 0] == a32[0, 0, 0, 1] and x[0, 0, 0, 0] < x[0, 0, 0, 1]  # the premise
    _, (tensors, _) = registry.get(OP, "triton").fn.forward_saving(x, w, b, 1e-5)
    assert torch.equal(tensors[2], _codes_reference(x, w, b))
    assert tensors[2].view(-1).tolist() == ([1, 2] if sign > 0 else [2, 3])
    dz = torch.tensor([3.0, 5.0]).view(1, 1, 1, 2)
    got = impl_grads(lambda *a: kernellab.bn_relu_pool2d(*a, backend="triton"), SPEC, (x, w, b), dz)
    ref = impl_grads(bn_relu_pool2d_reference, SPEC, [a.double() for a in (x, w, b)], dz.double())
    for g, r in zip(got, ref):
        torch.testing.assert_close(g.double(), r, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", CPU)
def test_nan_poisons_its_channel_only(backend):
    x, w, b = SPEC.make_inputs((2, 3, 4, 6), torch.float32, "cpu", 8)
    x[1, 1, 2, 3] = float("nan")
    z = kernellab.bn_relu_pool2d(x, w, b, backend=backend)
    ref = bn_relu_pool2d_reference(x.double(), w.double(), b.double())
    assert torch.isnan(z[:, 1]).all() and torch.isnan(ref[:, 1]).all()
    assert torch.isfinite(z[:, [0, 2]]).all()
    torch.testing.assert_close(z[:, [0, 2]].double(), ref[:, [0, 2]], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_triton_matches_the_unfused_kernellab_chain(dtype):
    """The fused forward computes batch_norm2d's fp32 expression: in fp32 z equals the
    unfused Triton chain (batch_norm2d with relu, then max_pool2d) bit for bit; the
    gradients agree to rounding. In bf16 the unfused chain rounds before pooling, so only
    closeness is asked."""
    x, w, b = SPEC.make_inputs((3, 6, 8, 10), dtype, "cpu", 31)
    dz = torch.randn(3, 6, 4, 5, generator=torch.Generator().manual_seed(2)).to(dtype)
    fused = impl_grads(lambda *a: kernellab.bn_relu_pool2d(*a, backend="triton"), SPEC, (x, w, b), dz)
    z = kernellab.bn_relu_pool2d(x, w, b, backend="triton")

    def chain(x, w, b):
        return kernellab.max_pool2d(kernellab.batch_norm2d(x, w, b, 1e-5, True, backend="triton"), 2, backend="triton")

    unfused = impl_grads(chain, SPEC, (x, w, b), dz)
    zc = chain(x, w, b)
    if dtype == torch.float32:
        assert torch.equal(z, zc)
        for g, u in zip(fused, unfused):
            torch.testing.assert_close(g, u, rtol=1e-5, atol=1e-5)
    else:
        torch.testing.assert_close(z, zc, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("backend", CPU)
@pytest.mark.parametrize("layout", ["transposed", "sliced", "offset", "expanded"])
def test_layouts(backend, layout):
    args = SPEC.make_inputs((3, 5, 6, 7), torch.float32, "cpu", 11, layout)
    assert not args[0].is_contiguous() or layout == "offset"
    _assert_fwd_bwd(backend, args, torch.float32)


@pytest.mark.parametrize("backend", CPU)
def test_strided_weight_bias_and_other_eps(backend):
    x, w, b = SPEC.make_inputs((3, 5, 6, 7), torch.float32, "cpu", 12)
    _assert_fwd_bwd(backend, (x, torch.stack([w, w], 1)[:, 0], torch.stack([b, b], 1)[:, 0]), torch.float32)
    x, w, b = SPEC.make_inputs((2, 3, 4, 5), torch.bfloat16, "cpu", 3)
    _assert_fwd_bwd(backend, (x, w, b), torch.bfloat16, eps=1e-1)


@pytest.mark.parametrize("backend", CPU)
def test_bad_inputs_name_the_argument(backend):
    f = kernellab.bn_relu_pool2d
    assert_per_channel_refusals(f, backend)
    x, w, b = torch.randn(2, 3, 4, 4), torch.ones(3), torch.zeros(3)
    for bad in (torch.randn(2, 3, 1, 1), torch.randn(2, 3, 1, 5), torch.randn(2, 3, 5, 1)):
        with pytest.raises(ValueError, match=r"\bx\b.*2x2"):
            f(bad, w, b, backend=backend)
    with pytest.raises(TypeError, match="relu"):
        registry.get(OP, backend)(x, w, b, relu=True)


def test_check_engine_passes_triton():
    rep = check_impl(registry.get(OP, "triton"), torch.float32, device="cpu", quick=True, opcheck=False, seed=1)
    assert rep.status == PASS, [(c.kind, c.name, c.detail) for c in rep.failures]


# Planted mistakes, each caught by some stage of the check.
def _brp(x, w, b, eps, *, crop_stats=False, pool_first=False, avg=False):
    x32 = x.float()
    xs = x32[:, :, : x.shape[2] // 2 * 2, : x.shape[3] // 2 * 2] if crop_stats else x32
    mean = xs.mean((0, 2, 3), keepdim=True)
    rstd = torch.rsqrt(xs.var((0, 2, 3), unbiased=False, keepdim=True) + eps)
    c = (1, -1, 1, 1)
    if pool_first:  # max of x, then normalize: wrong where w < 0
        return F.relu((F.max_pool2d(x32, 2) - mean) * rstd * w.float().view(c) + b.float().view(c)).to(x.dtype)
    a = F.relu((x32 - mean) * rstd * w.float().view(c) + b.float().view(c))
    return (F.avg_pool2d(a, 2) if avg else F.max_pool2d(a, 2)).to(x.dtype)


PLANTED = {
    "stats_without_the_dropped_row": lambda x, w, b, eps=1e-5: _brp(x, w, b, eps, crop_stats=True),
    "pool_before_normalize": lambda x, w, b, eps=1e-5: _brp(x, w, b, eps, pool_first=True),
    "average_pool": lambda x, w, b, eps=1e-5: _brp(x, w, b, eps, avg=True),
    # x detached: dx = 0 (x.sum() * 0 keeps x in the graph, so a gradient exists)
    "x_not_differentiated": lambda x, w, b, eps=1e-5: _brp(x.detach(), w, b, eps) + x.sum() * 0,
}


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_planted_mistakes_are_rejected(name):
    rep = check_planted(OP, name, PLANTED[name])
    assert rep.status == FAIL, f"planted {name} passed the check"


def test_custom_ops_opcheck():
    impl = registry.get(OP, "triton")
    assert len(impl.custom_ops) == 2
    opcheck_custom_ops(impl.custom_ops, SPEC, (2, 3, 5, 4))


def test_under_torch_compile_fullgraph():
    x, w, b = SPEC.make_inputs((2, 3, 5, 4), torch.float32, "cpu", 4)
    compile_grads_match(lambda x, w, b: kernellab.bn_relu_pool2d(x, w, b, backend="triton"), _torch, (x, w, b))


def test_compile_backend_quick():
    x, w, b = SPEC.make_inputs((3, 4, 5, 6), torch.float32, "cpu", 6)
    torch.testing.assert_close(kernellab.bn_relu_pool2d(x, w, b, backend="compile"), _torch(x, w, b))


def test_cuda_source_compiles():
    from kernellab.cuda.runtime import nvrtc_unavailable

    if nvrtc_unavailable():
        pytest.skip(nvrtc_unavailable())
    lines = registry.get(OP, "cuda").precompile()
    assert any("sm_90" in line for line in lines) and any("sm_80" in line for line in lines), lines


# --------------------------------------------------------------------------- GPU

# the MNIST model's two blocks at batch 64 and 256
GPU_SHAPES = [(n, c, hw, hw) for n in (64, 256) for c, hw in ((32, 28), (64, 14))]


# kernellab's kernels (the baselines pool rounded values: see the op's docstring)
@pytest.mark.gpu
@pytest.mark.parametrize("backend", [b for b in cuda_backends(OP) if b in ("triton", "cuda")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=shape_id)
def test_gpu_mnist_shapes(backend, dtype, shape):
    impl = registry.get(OP, backend)
    if impl.why_unavailable("cuda"):
        pytest.skip(impl.why_unavailable("cuda"))
    args = SPEC.make_inputs(shape, dtype, "cuda", seed_for(backend, shape, dtype))
    _assert_fwd_bwd(backend, args, dtype, seed=1)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", [b for b in cuda_backends(OP) if b in ("triton", "cuda")])
def test_gpu_edge_shapes_and_check_engine(backend):
    impl = registry.get(OP, backend)
    if impl.why_unavailable("cuda"):
        pytest.skip(impl.why_unavailable("cuda"))
    for dtype in DTYPES:
        for shape in SHAPES + [(3, 7, 300, 301), (1024, 32, 28, 28), (1024, 64, 14, 14)]:
            args = SPEC.make_inputs(shape, dtype, "cuda", seed_for(backend, shape, dtype, "gpu"))
            _assert_fwd_bwd(backend, args, dtype, seed=2)
        rep = check_impl(impl, dtype, device="cuda", quick=True)
        assert rep.status == PASS, [(c.kind, c.name, c.detail) for c in rep.failures]
