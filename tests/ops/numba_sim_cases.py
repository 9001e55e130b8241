"""The Numba backends under Numba's CUDA simulator, on CPU tensors: run by
tests/ops/test_numba.py in a child process started with NUMBA_ENABLE_CUDASIM=1 (the switch
must be set before numba.cuda is first imported, so not in the main test process). Skipped
when collected without it. The simulator runs each CUDA thread as a Python thread: tiny odd
shapes only (a block of 32 threads with barriers costs ~0.1 s).

Every numba backend x fp32/fp16 x odd shapes, forward and gradient, against the float64
reference (judged like the check engine, against PyTorch's own error); NaN / inf; strided
and misaligned inputs; opcheck of the custom ops; the transpose kernels."""

from __future__ import annotations

import pytest
import torch

import kernellab
from kernellab import numba_support
from kernellab.harness.compare import judge
from kltest import dtype_id, seed_for, shape_id

if not numba_support.simulating():
    pytest.skip("needs NUMBA_ENABLE_CUDASIM=1 before numba is imported (tests/ops/test_numba.py)",
                allow_module_level=True)  # fmt: skip

BACKENDS = ["numba_v1", "numba_v2", "numba"]
DTYPES = [torch.float32, torch.float16]
GELU = lambda x: torch.nn.functional.gelu(x, approximate="tanh")  # noqa: E731
TORCH = {"relu": torch.relu, "gelu": GELU, "softmax": lambda x: torch.softmax(x, -1)}
ELEMENTWISE_SHAPES = [(1,), (37,), (3, 11)]  # 37: one 32-thread block and a tail
SOFTMAX_SHAPES = [(1,), (2, 45), (2, 1, 3)]  # a row wider than the 32-thread block


def _grad(fn, x, dy):
    leaf = x.detach().clone().requires_grad_()
    y = fn(leaf)
    (g,) = torch.autograd.grad(y, leaf, dy)
    return y.detach(), g


def _judge_unary(op, backend, x, dy):
    spec = kernellab.get_spec(op)
    fn = getattr(kernellab, op)
    y, g = _grad(lambda t: fn(t, backend=backend), x, dy)
    y64, g64 = _grad(spec.reference, x.double(), dy.double())
    yt, gt = _grad(TORCH[op], x, dy) if x.dtype == torch.float32 else _grad(TORCH[op], x.float(), dy.float())
    for out, ref, base, what in ((y, y64, yt, "forward"), (g, g64, gt, "gradient")):
        assert out.dtype == x.dtype and out.shape == x.shape, what
        v = judge(out, ref, x.dtype, base.to(x.dtype))
        assert v.ok, f"{op}/{backend} {what}: {v.detail}"


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", ELEMENTWISE_SHAPES, ids=shape_id)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", ["relu", "gelu"])
def test_unary_forward_and_gradient(op, backend, shape, dtype):
    (x,) = kernellab.get_spec(op).make_inputs(shape, dtype, "cpu", seed_for(op, backend, shape, dtype))
    dy = torch.randn(shape).to(dtype)
    _judge_unary(op, backend, x, dy)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", SOFTMAX_SHAPES, ids=shape_id)
@pytest.mark.parametrize("backend", ["numba_v1", "numba_v2"])  # numba runs v2's kernels
def test_softmax_forward_and_gradient(backend, shape, dtype):
    (x,) = kernellab.get_spec("softmax").make_inputs(shape, dtype, "cpu", seed_for("softmax", backend, shape))
    dy = torch.randn(shape).to(dtype)
    _judge_unary("softmax", backend, x, dy)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("backend", BACKENDS)
def test_add(backend, dtype):
    a, b = kernellab.get_spec("add").make_inputs((5, 13), dtype, "cpu", seed_for("add", backend))
    ref = a.double() + b.double()
    v = judge(kernellab.add(a, b, backend=backend), ref, dtype, a + b)
    assert v.ok, v.detail
    la, lb = a.clone().requires_grad_(), b.clone().requires_grad_()
    dy = torch.randn(5, 13).to(dtype)
    ga, gb = torch.autograd.grad(kernellab.add(la, lb, backend=backend), (la, lb), dy)
    assert torch.equal(ga, dy) and torch.equal(gb, dy)


@pytest.mark.parametrize("backend", BACKENDS)
def test_specials(backend):
    nan, inf = float("nan"), float("inf")
    x = torch.tensor([nan, inf, -inf, 0.0, -0.0, 1e-45, -1e-45, 2.5, -2.5])
    y = kernellab.relu(x, backend=backend)
    assert torch.isnan(y[0]) and y[1:].tolist() == [inf, 0.0, 0.0, 0.0, x[5].item(), 0.0, 2.5, 0.0]
    g = kernellab.gelu(x, backend=backend)
    ref = GELU(x)
    assert torch.equal(torch.isnan(g), torch.isnan(ref)), (g, ref)  # gelu(-inf) is NaN, as the formula
    rows = torch.randn(3, 40)
    rows[1] = -inf  # fully masked: NaN, as torch
    rows[2, 7] = nan  # a NaN anywhere poisons its row
    s = kernellab.softmax(rows, backend=backend)
    assert torch.isnan(s[1]).all() and torch.isnan(s[2]).all()
    torch.testing.assert_close(s[0], torch.softmax(rows[0], -1))


@pytest.mark.parametrize("backend", ["numba_v1", "numba"])
def test_strided_and_misaligned_inputs(backend):
    base = torch.randn(3 * 6 + 1)
    offset = base[1:].view(3, 6)  # storage offset of one element
    for x in (offset, offset.t(), offset[:, ::2]):
        torch.testing.assert_close(kernellab.gelu(x, backend=backend), GELU(x))
        torch.testing.assert_close(kernellab.softmax(x, backend=backend), torch.softmax(x, -1))
        torch.testing.assert_close(kernellab.add(x, x.clone(), backend=backend), x + x)


def test_empty_tensors():
    for backend in BACKENDS:
        assert kernellab.relu(torch.empty(3, 0), backend=backend).shape == (3, 0)
        assert kernellab.softmax(torch.empty(0, 7), backend=backend).shape == (0, 7)


def test_bf16_is_refused_naming_the_argument():
    with pytest.raises(TypeError, match=r"relu \(numba\): x has dtype torch.bfloat16"):
        kernellab.relu(torch.randn(4, dtype=torch.bfloat16), backend="numba")
    with pytest.raises(TypeError, match=r"add \(numba\): a has dtype torch.bfloat16"):
        kernellab.add(torch.randn(4).bfloat16(), torch.randn(4).bfloat16(), backend="numba_v2")


@pytest.mark.parametrize("op", ["relu", "gelu", "add", "softmax"])
def test_custom_ops_opcheck(op):
    impl = kernellab.get(op, "numba")
    gen = torch.Generator().manual_seed(0)

    def make(rg):
        return torch.randn(2, 5, generator=gen).requires_grad_(bool(rg))

    make.args = lambda rg: (make(rg),)
    for custom_op, build, _ in impl.custom_ops:
        torch.library.opcheck(custom_op, build(make))


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", [(1, 1), (33, 17), (5, 40), (0, 3)], ids=shape_id)
@pytest.mark.parametrize("kind", ["naive", "tiled"])
def test_transpose(kind, shape, dtype):
    from kernellab.ops import _numba_transpose as nt

    fn = {"naive": nt.transpose_naive, "tiled": nt.transpose_tiled}[kind]
    x = torch.randn(shape).to(dtype)
    assert torch.equal(fn(x), x.t().contiguous())
    if shape == (33, 17):  # a strided input is packed first
        xt = torch.randn(17, 33).to(dtype).t()
        assert torch.equal(fn(xt), xt.t().contiguous())


def test_transpose_bad_inputs():
    from kernellab.ops import _numba_transpose as nt

    with pytest.raises(ValueError, match=r"x must be 2-D"):
        nt.transpose_tiled(torch.randn(3))
    with pytest.raises(TypeError, match=r"x has dtype torch.bfloat16"):
        nt.transpose_naive(torch.randn(3, 3, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match=r"x must be a torch.Tensor"):
        nt.transpose_naive([[1.0]])


@pytest.mark.parametrize("backend", BACKENDS)
def test_transpose_op_backends(backend):
    """The transpose op's numba backends: a batch (one matrix at a time) and the gradient
    (the transpose of dy)."""
    x = torch.randn(2, 5, 33, requires_grad=True)
    y = kernellab.transpose(x, backend=backend)
    assert torch.equal(y, x.detach().transpose(-2, -1).contiguous())
    dy = torch.randn(2, 33, 5)
    (g,) = torch.autograd.grad(y, x, dy)
    assert torch.equal(g, dy.transpose(-2, -1))
