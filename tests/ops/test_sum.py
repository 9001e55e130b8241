"""sum: every backend that runs here x odd shapes x dtypes, whole tensor and rows, forward
and gradient against the float64 reference (2x torch's error); dim handling; inf/NaN;
the check engine passes the real backends and rejects planted wrong ones; the CUDA
ladder compiles; GPU-marked tests for the CUDA/Triton kernels at scaled-down bench sizes."""

from __future__ import annotations

import re

import pytest
import torch

import kernellab
import kernellab.ops.sum as ksum
from kernellab.harness.check import FAIL, PASS, check_impl
from kernellab.harness.compare import judge
from kltest import DTYPES, cpu_backends, cuda_backends, dtype_id, seed_for, shape_id

SPEC = kernellab.get_spec("sum")
CPU = cpu_backends("sum")
SHAPES = [(1,), (17,), (1023,), (3, 0, 5), (5, 1025), (2, 3, 257), (300, 3), (4097,)]


def _x(shape, dtype, seed, device="cpu"):
    (x,) = SPEC.make_inputs(shape, dtype, device, seed)
    return x


def _judge_fwd_and_grad(backend, x, dim):
    dtype = x.dtype
    kw = {} if dim is None else {"dim": dim}
    y = kernellab.get("sum", backend)(x, **kw)
    v = judge(y, SPEC.ref(x, **kw), dtype, ksum.sum_reference(x, **kw))
    assert v.ok, v.detail
    leaf = x.detach().clone().requires_grad_()
    out = kernellab.get("sum", backend)(leaf, **kw)
    dy = torch.randn(out.shape, device=x.device).to(dtype)
    (g,) = torch.autograd.grad(out, leaf, dy)
    assert g.shape == x.shape and g.dtype == dtype
    expect = dy.unsqueeze(-1).expand(x.shape) if dim is not None and x.dim() else dy.expand(x.shape)
    assert torch.equal(g, expect)


@pytest.mark.parametrize("backend", CPU)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@pytest.mark.parametrize("dim", [None, -1], ids=["all", "rows"])
def test_forward_and_gradient(backend, dtype, shape, dim):
    _judge_fwd_and_grad(backend, _x(shape, dtype, seed_for(backend, shape, dim)), dim)


@pytest.mark.parametrize("backend", CPU)
def test_dim_argument(backend):
    x = torch.randn(6, 7, 5)
    for dim in (0, 1, 2, -1, -2, -3):
        torch.testing.assert_close(ksum.sum(x, dim, backend=backend), x.sum(dim), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ksum.sum(x, backend=backend), x.sum(), rtol=1e-5, atol=1e-4)
    s = torch.tensor(2.5)  # 0-d: dim -1 and 0 are valid, as for torch.sum
    assert ksum.sum(s, -1, backend=backend).item() == 2.5 and ksum.sum(s, backend=backend).item() == 2.5
    for bad in (3, -4, 1.0, True, (0, 1)):
        with pytest.raises(ValueError, match="dim"):
            ksum.sum(x, bad, backend=backend)
    with pytest.raises(TypeError, match="keepdim"):
        kernellab.get("sum", backend)(x, keepdim=True)
    with pytest.raises(TypeError, match=r"\bx\b"):
        ksum.sum([1.0, 2.0], backend=backend)
    with pytest.raises(TypeError, match=r"\bx\b"):
        ksum.sum(torch.ones(3, dtype=torch.int32), backend=backend)


@pytest.mark.parametrize("backend", CPU)
def test_inf_and_nan(backend):
    fn = kernellab.get("sum", backend)
    x = torch.randn(4, 300)
    x[0, 7] = float("inf")  # +inf alone stays +inf (a compensated sum must not make it NaN)
    x[1, 9] = float("-inf")
    x[2, 3], x[2, 200] = float("inf"), float("-inf")  # inf - inf = NaN
    x[3, 100] = float("nan")
    rows = fn(x, dim=-1)
    assert rows[0].item() == float("inf") and rows[1].item() == float("-inf")
    assert rows[2].isnan() and rows[3].isnan()
    assert fn(x[0]).item() == float("inf") and fn(x[1]).item() == float("-inf")
    assert fn(x[:2].contiguous()).isnan()


def test_triton_sum_is_correctly_rounded():
    # Kahan lanes + float64 combine: within one rounding of the exact sum, even when an
    # fp32 running sum would lose digits (an offset makes every partial sum large).
    x = torch.randn(3 * 32768 + 11) + 300.0
    exact = x.double().sum()
    got = kernellab.get("sum", "triton")(x)
    ulp = torch.finfo(torch.float32).eps * abs(exact.item())
    assert abs(got.item() - exact.item()) <= ulp
    rows = kernellab.get("sum", "triton")(x[: 3 * 9001].view(3, 9001), dim=-1)
    exact_rows = x[: 3 * 9001].view(3, 9001).double().sum(-1)
    assert ((rows.double() - exact_rows).abs() <= torch.finfo(torch.float32).eps * exact_rows.abs()).all()


@pytest.mark.parametrize("backend", ["manual", "torch", "triton"])
def test_check_engine_passes(backend):
    rep = check_impl(kernellab.get("sum", backend), torch.float32, device="cpu", quick=True, seed=11)
    assert rep.status == PASS, [(c.kind, c.name, c.detail) for c in rep.failures]
    assert any(c.kind == "option" and c.name == "dim=-1" and c.status == PASS for c in rep.cases)


def _wrong_impls():
    def ignores_dim(x, dim=None):
        return x.sum()

    def drops_last(x, dim=None):
        if dim is None:
            return x.reshape(-1)[:-1].sum() if x.numel() > 1 else x.sum()
        return x[..., :-1].sum(-1) if x.dim() and x.shape[-1] > 1 else x.sum(dim)

    def low_precision(x, dim=None):  # accumulates in bf16 (x.cumsum would be fp32 inside)
        v = x.to(torch.bfloat16)
        s = v.sum() if dim is None else v.sum(dim)
        return s.to(x.dtype)

    class DoubleGrad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.shape = x.shape
            return x.sum()

        @staticmethod
        def backward(ctx, dy):
            return (2 * dy).expand(ctx.shape)

    def wrong_grad(x, dim=None):
        return DoubleGrad.apply(x) if dim is None else x.sum(dim)

    return {
        "ignores_dim": ignores_dim,
        "drops_last": drops_last,
        "low_precision": low_precision,
        "wrong_grad": wrong_grad,
    }


@pytest.mark.parametrize("name", list(_wrong_impls()))
def test_check_engine_rejects_planted_wrong_sums(planted, name):
    impl = planted("sum", f"planted_{name}", _wrong_impls()[name], devices=("cpu",))
    rep = check_impl(impl, torch.float32, device="cpu", quick=True, seed=5, opcheck=False)
    assert rep.status == FAIL, name


def test_compile_backend_quick():  # one Inductor compile (seconds on the CPU): rows only
    x = torch.randn(4, 100)
    torch.testing.assert_close(kernellab.get("sum", "compile")(x, dim=-1), x.sum(-1))


def test_under_torch_compile_fullgraph():
    f = torch.compile(
        lambda t: ksum.sum(t, backend="triton") * 2 + ksum.sum(t, -1, backend="triton").sum(), fullgraph=True
    )
    x = torch.randn(5, 33, requires_grad=True)
    f(x).backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 3.0))


# The launchers look these kernels up by name: every one must exist in the compiled code.
_CUDA_NAMES = [
    "sum_all_v1",
    "sum_all_v2",
    "sum_all_v3",
    "sum_all_v4",
    "sum_final",
    "sum_rows_v1",
    "sum_rows_v2",
    "sum_rows_warp",
    "sum_rows_warp_vec",
    "sum_rows_block",
    "sum_rows_block_vec",
]


def test_cuda_ladder_compiles_and_exports_every_kernel():
    from kernellab.cuda.runtime import nvrtc_unavailable
    from kernellab.ops.sum import cuda as scuda

    if nvrtc_unavailable():
        pytest.skip(nvrtc_unavailable())
    assert {"cuda", "cuda_v1", "cuda_v2", "cuda_v3", "cuda_v4"} <= {i.backend for i in kernellab.impls("sum")}
    for arch in ("sm_80", "sm_90"):
        ptx = scuda.MODULE.compile(arch, target="ptx").decode()
        entries = set(re.findall(r"\.entry\s+(\w+)", ptx))
        want = {f"{n}_{s}" for n in _CUDA_NAMES for s in ("f32", "f16", "bf16")} | {"sum_partials_f64"}
        assert want <= entries, sorted(want - entries)
        assert "atom.global.add.f64" in ptx  # v3's global atomic (sm_60+)
    # The variant header lines exist (the ladder documents itself).
    src = scuda.MODULE.source
    for v in ("v1", "v2", "v3", "v4"):
        assert re.search(rf"^//\s+{v}\s+sum_all_{v}", src, re.M), v


# --------------------------------------------------------------------------- GPU

GPU_BACKENDS = [b for b in cuda_backends("sum") if b not in ("manual", "compile")]


@pytest.mark.gpu
@pytest.mark.parametrize("backend", GPU_BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_gpu_forward_and_gradient(backend, dtype):
    shapes = [(1,), (17,), (1025,), (3, 0, 5), (65537, 3), (129, 1000), (7, 4096), (3, 50001), (1 << 22,)]
    for shape in shapes:
        x = _x(shape, dtype, seed_for(backend, shape), "cuda")
        for dim in (None, -1):
            _judge_fwd_and_grad(backend, x, dim)
    # storage offset of one element: the whole-tensor kernels peel a head, rows go scalar
    gen = torch.Generator("cuda").manual_seed(seed_for(backend, "offset"))
    flat = torch.randn(37 * 1025 + 1, device="cuda", generator=gen).to(dtype)  # (seeded: a failure replays)
    x = flat[1:].view(37, 1025)
    for dim in (None, -1):
        _judge_fwd_and_grad(backend, x, dim)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_gpu_large_fp32_sum_within_twice_torch(backend):
    # The bench's 2^28 scaled down: 2^26 fp32 elements, judged by the 2x-torch rule over
    # four seeded draws at once (the worst error of each side). One unseeded draw judged a
    # scalar: where torch's sum happened to round exactly, the bound was one ulp of the
    # result and ours, 3 ulps off (sound for 2^26 terms), failed (H100, a2ddd7d).
    impl = kernellab.get("sum", backend)
    xs = [torch.randn(1 << 26, device="cuda", generator=torch.Generator("cuda").manual_seed(s)) for s in range(4)]
    ours = torch.stack([impl(x) for x in xs])
    theirs = torch.stack([x.sum() for x in xs])
    v = judge(ours, torch.stack([x.double().sum() for x in xs]), torch.float32, theirs)
    assert v.ok, v.detail


@pytest.mark.gpu
def test_gpu_v4_is_deterministic_and_reusable_on_streams():
    impl = kernellab.get("sum", "cuda_v4")
    x = torch.randn((1 << 24) + 3, device="cuda")
    a = impl(x)
    assert all(torch.equal(a, impl(x)) for _ in range(5))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())  # x was written on the default stream
    with torch.cuda.stream(s):
        b = impl(x)
    s.synchronize()
    assert torch.equal(a, b)
    g = torch.cuda.CUDAGraph()
    impl(x)
    with torch.cuda.graph(g):
        c = impl(x)
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    assert torch.equal(a, c)


@pytest.mark.gpu
def test_gpu_check_engine_quick():
    for backend in GPU_BACKENDS:
        for dtype in DTYPES:
            rep = check_impl(kernellab.get("sum", backend), dtype, device="cuda", quick=True, seed=3)
            assert rep.status == PASS, (backend, dtype, [(c.kind, c.name, c.detail) for c in rep.failures])
