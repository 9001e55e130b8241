"""max_pool2d: every backend that runs here x edge shapes (1x1 images with a 1x1 window,
odd sizes that floor, batch 1, channels not a multiple of 8, overlapping and gapped
windows) x dtypes, forward and gradient against the float64 reference (exact: pooling
picks, it rounds nothing; overlapping windows sum); the tie and NaN rules; layouts; bad
inputs; the check engine; custom ops; GPU cases (marked ``gpu``)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kernellab
from kernellab.core import registry
from kernellab.harness.check import FAIL, PASS, check_impl
from kernellab.harness.compare import judge
from kltest import DTYPES, backend_matrix, check_planted, dtype_id, seed_for

OP = "max_pool2d"
SPEC = kernellab.get_spec(OP)
MATRIX = backend_matrix(OP)

# (N, C, H, W), kernel_size, stride
CASES = [
    ((1, 1, 1, 1), 1, None),  # 1x1 image, 1x1 window
    ((1, 1, 2, 2), 2, None),
    ((2, 3, 5, 7), 2, None),  # odd sizes: the last row and column are dropped
    ((1, 17, 28, 28), 2, 2),  # the MNIST model's pool, batch 1, 17 channels
    ((2, 3, 9, 8), 3, 1),  # overlapping windows: gradients add
    ((2, 3, 9, 8), 2, 3),  # gaps between windows: dx = 0 there
    ((3, 2, 11, 6), 3, 2),
    ((0, 2, 4, 4), 2, None),  # empty batch
]


def _grad(fn, x, dy):
    leaf = x.detach().clone().requires_grad_()
    y = fn(leaf)
    (dx,) = torch.autograd.grad(y, leaf, dy)
    return y.detach(), dx


def assert_exact(backend, x, k, s, dy=None):
    opts = dict(kernel_size=k, stride=s)
    ref = F.max_pool2d(x.double(), k, s if s is not None else k)
    if dy is None:
        dy = torch.randn(ref.shape, device=x.device).to(x.dtype)
    y, dx = _grad(lambda t: kernellab.max_pool2d(t, backend=backend, **opts), x, dy)
    ry, rdx = _grad(lambda t: F.max_pool2d(t, k, s if s is not None else k), x.double(), dy.double())
    assert y.dtype == x.dtype and y.shape == ry.shape
    assert torch.equal(y.double(), ry), "forward differs"
    if s is not None and s < k:  # overlapping windows: sums of up to ceil(k/s)^2 terms
        v = judge(dx, rdx, x.dtype)
        assert v.ok, f"dx: {v.detail}"
    else:
        assert torch.equal(dx.double(), rdx), "dx differs"


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{'x'.join(map(str, c[0]))}-k{c[1]}-s{c[2]}")
@pytest.mark.parametrize("dev,backend", MATRIX)
def test_forward_and_grad(dev, backend, case, dtype):
    shape, k, s = case
    (x,) = SPEC.make_inputs(shape, dtype, dev, seed_for(backend, case, dtype))
    assert_exact(backend, x, k, s)


@pytest.mark.parametrize("dev,backend", MATRIX)
def test_ties_go_to_the_first_maximum_and_nan_wins(dev, backend):
    nan = float("nan")
    x = torch.tensor(
        [[[[1.0, 3.0, 2.0, 2.0], [3.0, 0.0, 2.0, 2.0], [nan, 5.0, -1.0, -1.0], [9.0, nan, -1.0, -1.0]]]],
        device=dev,
    )
    dy = torch.tensor([[[[10.0, 20.0], [30.0, 40.0]]]], device=dev)
    y, dx = _grad(lambda t: kernellab.max_pool2d(t, backend=backend), x, dy)
    assert y[0, 0, 0].tolist() == [3.0, 2.0] and torch.isnan(y[0, 0, 1, 0]) and y[0, 0, 1, 1] == -1.0
    want = torch.zeros(4, 4)
    want[0, 1] = 10.0  # 3 at (0,1) before 3 at (1,0): the first in row-major order
    want[0, 2] = 20.0  # all four equal: the first
    want[2, 2] = 40.0
    # NaN window: PyTorch takes a NaN when it sees one (v > max or v is NaN), so the last NaN
    want[3, 1] = 30.0
    ry, rdx = _grad(lambda t: F.max_pool2d(t, 2), x.double(), dy.double())
    assert torch.equal(rdx.cpu().float()[0, 0], want), "the reference's rule is not what this test assumes"
    if backend == "manual":
        # the naive baseline's torch.max(dim) takes the first NaN of a window, PyTorch's
        # pooling kernel (and ours) the last: only the NaN window's gradient differs
        want[3, 1], want[2, 0] = 0.0, 30.0
    assert torch.equal(dx.cpu()[0, 0], want)


LAYOUTS = {
    "channels_last": lambda t: t.contiguous(memory_format=torch.channels_last),
    "sliced": lambda t: torch.stack([t, t.roll(1, -1)], -1).flatten(-2)[..., ::2],
    "transposed": lambda t: t.transpose(-1, -2).contiguous().transpose(-1, -2),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("dev,backend", MATRIX)
def test_layouts(dev, backend, layout):
    (x,) = SPEC.make_inputs((2, 3, 9, 8), torch.float32, dev, seed_for(backend, layout))
    xl = LAYOUTS[layout](x)
    assert torch.equal(xl, x) and not xl.is_contiguous()
    dy = torch.randn(2, 3, 4, 8, device=dev)[..., ::2]  # strided grad_output
    assert_exact(backend, xl, 2, None, dy=dy)


def test_bad_inputs_name_the_argument():
    x = torch.randn(2, 3, 6, 6)
    cases = [
        ((x[0],), {}, ValueError, r"\bx\b"),  # wrong rank
        ((x,), {"kernel_size": 0}, ValueError, r"\bkernel_size\b"),
        ((x,), {"kernel_size": 2.0}, TypeError, r"\bkernel_size\b"),
        ((x,), {"stride": 0}, ValueError, r"\bstride\b"),
        ((x,), {"kernel_size": 7}, ValueError, r"\bkernel_size\b.*larger"),
        ((x,), {"padding": 1}, TypeError, r"\bpadding\b"),
        ((x.int(),), {}, TypeError, r"\bx\b"),
    ]
    for backend in ("triton", "torch", "manual"):
        for args, kw, exc, pattern in cases:
            with pytest.raises(exc, match=pattern):
                kernellab.max_pool2d(*args, **kw, backend=backend)
    with pytest.raises(ValueError, match=r"\bkernel_size\b 12"):  # int8 offsets: windows up to 11x11
        kernellab.max_pool2d(torch.randn(1, 1, 12, 12), 12, backend="triton")
    with pytest.raises(ValueError, match=r"\bx\b is on cpu"):
        kernellab.max_pool2d(x, backend="cuda")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_check_engine_passes(dtype):
    rep = check_impl(registry.get(OP, "triton"), dtype, device="cpu", quick=True, seed=1)
    assert rep.status == PASS, [(c.kind, c.name, c.detail) for c in rep.failures]


PLANTED = {
    "nan_ignored": lambda x, kernel_size=2, stride=None: F.max_pool2d(
        torch.nan_to_num(x, nan=-1e30), kernel_size, stride or kernel_size
    ),
    "avg_pool": lambda x, kernel_size=2, stride=None: F.avg_pool2d(x, kernel_size, stride or kernel_size),
    "ignores_stride": lambda x, kernel_size=2, stride=None: F.max_pool2d(x, kernel_size, kernel_size),
}


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_planted_mistakes_are_rejected(name):
    rep = check_planted(OP, name, PLANTED[name])
    assert rep.status == FAIL


def test_custom_ops_opcheck():
    impl = registry.get(OP, "triton")

    def make(rg):
        return torch.randn(2, 3, 6, 5).requires_grad_(bool(rg))

    make.args = lambda rg: (make(rg),)
    for op, build, _ in impl.custom_ops:
        torch.library.opcheck(op, build(make))


def test_triton_under_torch_compile_fullgraph():
    x = torch.randn(2, 3, 8, 8)
    f = torch.compile(
        lambda t: kernellab.max_pool2d(t, backend="triton") * 2, fullgraph=True, backend="aot_eager"
    )
    leaf = x.clone().requires_grad_()
    f(leaf).sum().backward()
    ref = x.clone().requires_grad_()
    (F.max_pool2d(ref, 2) * 2).sum().backward()
    assert torch.equal(leaf.grad, ref.grad)


# pool.cu compiling for sm_80 and sm_90: tests/test_cuda_runtime.py compiles every .cu.


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_gpu_check_engine(backend):
    for dtype in DTYPES:
        rep = check_impl(registry.get(OP, backend), dtype, device="cuda", quick=True)
        assert rep.status == PASS, [(c.kind, c.name, c.detail) for c in rep.failures]


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_gpu_mnist_shapes(backend, dtype):
    for shape in [(1024, 32, 28, 28), (1024, 64, 14, 14), (3, 5, 17, 19)]:
        (x,) = SPEC.make_inputs(shape, dtype, "cuda", 0)
        assert_exact(backend, x, 2, None)
        assert_exact(backend, x.contiguous(memory_format=torch.channels_last), 3, 1)
