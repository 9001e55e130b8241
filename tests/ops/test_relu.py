"""relu: every backend that runs here x odd shapes x dtypes, forward and gradient against
the float64 reference (exact: relu rounds nothing); NaN / inf / signed zeros; layouts;
bad inputs; the check engine; custom ops; GPU cases (marked ``gpu``)."""

from __future__ import annotations

import pytest
import torch

import kernellab
from kernellab import triton_support
from kernellab.core import registry
from kernellab.harness.check import FAIL, PASS, check_impl
from kltest import (
    BLOCK_EDGES,
    DTYPES,
    LAYOUTS,
    ODD_SHAPES,
    backend_matrix,
    block_edge,
    check_planted,
    dtype_id,
    seed_for,
    shape_id,
)

OP = "relu"
SPEC = kernellab.get_spec(OP)
MATRIX = backend_matrix(OP)


def _expected(x, dy):
    """relu and PyTorch's threshold_backward, written out: y = x where x > 0 or NaN,
    else 0; dx = 0 where x <= 0, else dy (a NaN x passes dy, as autograd of the reference)."""
    y = torch.where((x > 0) | torch.isnan(x), x, torch.zeros_like(x))
    dx = torch.where(x <= 0, torch.zeros_like(dy), dy)
    return y, dx


def _run(backend, x, dy):
    leaf = x.detach().clone().requires_grad_()
    y = kernellab.relu(leaf, backend=backend)
    (dx,) = torch.autograd.grad(y, leaf, dy)
    return y.detach(), dx


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", ODD_SHAPES, ids=shape_id)
@pytest.mark.parametrize("dev,backend", MATRIX)
def test_forward_and_grad_exact(dev, backend, shape, dtype):
    (x,) = SPEC.make_inputs(shape, dtype, dev, seed_for(OP, backend, shape, dtype))
    dy = torch.randn(shape, device=dev).to(dtype)
    y, dx = _run(backend, x, dy)
    ey, edx = _expected(x, dy)
    assert y.dtype == dtype and y.shape == x.shape
    assert torch.equal(y, ey) and torch.equal(dx, edx)
    # and against the float64 reference through autograd
    x64 = x.double().requires_grad_()
    (g64,) = torch.autograd.grad(SPEC.reference(x64), x64, dy.double())
    assert torch.equal(dx.double(), g64)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("edge", list(BLOCK_EDGES))
def test_triton_counts_around_a_block(device, edge, dtype):
    """The Triton backend at counts around its program size (fp32 4096, 16-bit 8192): a
    partial program alone, whole ones (unmasked), whole ones then a partial one; exact,
    forward and gradient, as test_forward_and_grad_exact checks."""
    if kernellab.get(OP, "triton").why_unavailable(device):
        pytest.skip("triton does not run here")
    n = block_edge(edge, triton_support.block_for(dtype.itemsize))
    test_forward_and_grad_exact(device, "triton", (n,), dtype)


@pytest.mark.parametrize("dev,backend", MATRIX)
def test_specials(dev, backend):
    nan, inf = float("nan"), float("inf")
    x = torch.tensor([nan, inf, -inf, 0.0, -0.0, 1e-45, -1e-45, 2.5, -2.5], device=dev)
    dy = torch.arange(1.0, 10.0, device=dev)
    y, dx = _run(backend, x, dy)
    assert torch.isnan(y[0]), "relu(NaN) must be NaN"
    tiny = x[5].item()  # the fp32 subnormal nearest 1e-45, kept (not flushed to 0)
    assert y[1:].tolist() == [inf, 0.0, 0.0, 0.0, tiny, 0.0, 2.5, 0.0]
    # relu'(0) = 0; NaN passes dy through (PyTorch's threshold_backward)
    assert dx.tolist() == [1.0, 2.0, 0.0, 0.0, 0.0, 6.0, 0.0, 8.0, 0.0]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dev,backend", MATRIX)
def test_layouts(dev, backend, layout):
    (x,) = SPEC.make_inputs((37, 129), torch.float32, dev, seed_for(backend, layout), layout)
    dy = torch.randn(37, 258, device=dev)[:, ::2]  # strided grad_output too
    y, dx = _run(backend, x, dy)
    ey, edx = _expected(x, dy)
    assert torch.equal(y, ey) and torch.equal(dx, edx)


def test_bad_inputs_name_the_argument():
    for backend in ("triton", "torch", "manual"):
        with pytest.raises(TypeError, match=r"\bx\b"):
            kernellab.relu(torch.arange(4), backend=backend)
        with pytest.raises(TypeError, match=r"\bx\b"):
            kernellab.relu([1.0, -1.0], backend=backend)
    for backend in ("cuda", "cuda_v1"):
        with pytest.raises(ValueError, match=r"\bx\b is on cpu"):
            kernellab.relu(torch.randn(4), backend=backend)


@pytest.mark.parametrize("backend", ["triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_check_engine_passes(backend, dtype):
    rep = check_impl(registry.get(OP, backend), dtype, device="cpu", quick=True, seed=1)
    assert rep.status == PASS, [(c.kind, c.name, c.detail) for c in rep.failures]


PLANTED = {
    "fmax_drops_nan": lambda x: torch.clamp_min(torch.nan_to_num(x, nan=0.0), 0),
    "leaky": lambda x: torch.where(x > 0, x, 0.01 * x),
    "grad_at_zero_is_one": lambda x: _GradAtZero.apply(x),
}


class _GradAtZero(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.relu(x)

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        return torch.where(x >= 0, dy, torch.zeros_like(dy))


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_planted_mistakes_are_rejected(name):
    if name == "grad_at_zero_is_one":
        # the check's random inputs hold no exact zeros: this one is caught here
        x = torch.tensor([0.0, 1.0, -1.0]).requires_grad_()
        PLANTED[name](x).backward(torch.ones(3))
        assert x.grad.tolist() != _expected(x.detach(), torch.ones(3))[1].tolist()
        return
    rep = check_planted(OP, name, PLANTED[name])
    assert rep.status == FAIL


def test_custom_ops_opcheck():
    impl = registry.get(OP, "triton")
    gen = torch.Generator().manual_seed(0)

    def make(rg):
        return torch.randn(4, 33, generator=gen).requires_grad_(bool(rg))

    make.args = lambda rg: (make(rg),)
    for op, build, _ in impl.custom_ops:
        torch.library.opcheck(op, build(make))


@pytest.mark.slow  # Inductor on the CPU
def test_compile_backend():
    x = torch.randn(5, 7)
    assert torch.equal(kernellab.relu(x, backend="compile"), torch.relu(x))


# relu.cu compiling for sm_80 and sm_90: tests/test_cuda_runtime.py compiles every .cu.


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "cuda_v1", "triton"])
def test_gpu_check_engine(backend):
    for dtype in DTYPES:
        rep = check_impl(registry.get(OP, backend), dtype, device="cuda", quick=True)
        assert rep.status == PASS, [(c.kind, c.name, c.detail) for c in rep.failures]


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "cuda_v1", "triton"])
@pytest.mark.parametrize("n", [1, 7, 4097, 64 * 32 * 28 * 28, 2**24 + 3])
def test_gpu_large_and_misaligned(backend, n):
    for dtype in DTYPES:
        flat = torch.randn(n + 1, device="cuda").to(dtype)
        for x in (flat[:n], flat[1:]):  # aligned, then one element off (the scalar path)
            dy = torch.randn(n, device="cuda").to(dtype)
            y, dx = _run(backend, x, dy)
            ey, edx = _expected(x, dy)
            assert torch.equal(y, ey) and torch.equal(dx, edx)
