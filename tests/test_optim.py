"""kernellab.sgd_step: every backend x dtype against the reference update p - lr * g;
packing (one flat buffer, gradients accumulated in place by autograd); bad input names the
argument; the triton backend refuses unpacked parameters; GPU (marked ``gpu``): one launch."""

from __future__ import annotations

import pytest
import torch

import kernellab
from kernellab import optim
from kltest import DTYPES, dtype_id

SHAPES = [(3, 4), (17,), (1,), (2, 3, 5), (0,), (32, 1, 3, 3)]


def _params(dtype, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    ps = [torch.randn(s, generator=g).to(dtype).to(device) for s in SHAPES]
    gs = [torch.randn(s, generator=g).to(dtype).to(device) for s in SHAPES]
    return ps, gs


def _expect(ps, gs, lr):
    # the update in fp32, one rounding to the storage dtype (what every backend computes)
    return [(p.float() - lr * g.float()).to(p.dtype) for p, g in zip(ps, gs)]


@pytest.mark.parametrize("backend", optim.BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_update_matches_the_reference(backend, dtype):
    ps, gs = _params(dtype)
    want = _expect(ps, gs, 0.1)
    if backend == "triton":
        optim.pack_(ps)
        for p, g in zip(ps, gs):
            p.grad.copy_(g)
        gs = [p.grad for p in ps]
    kernellab.sgd_step(ps, gs, 0.1, backend=backend)
    for p, w in zip(ps, want):
        # fp32: one rounding either way; 16-bit: p + (-lr) * g may round twice in PyTorch's kernels
        tol = 0 if dtype == torch.float32 and backend == "triton" else torch.finfo(dtype).eps
        torch.testing.assert_close(p.float(), w.float(), rtol=tol, atol=tol * 4)
        assert p.dtype == dtype


def test_pack_keeps_values_and_autograd_accumulates_into_the_flat_buffer():
    lin = torch.nn.Linear(5, 3)
    before = [p.detach().clone() for p in lin.parameters()]
    flat, gflat = optim.pack_(list(lin.parameters()))
    assert flat.numel() == 18 and gflat.abs().sum() == 0
    for p, b in zip(lin.parameters(), before):
        assert torch.equal(p, b)
    assert optim.packed_span(list(lin.parameters())).data_ptr() == flat.data_ptr()
    x = torch.randn(4, 5)
    lin(x).sum().backward()
    assert torch.equal(gflat[:15].view(3, 5), x.sum(0).expand(3, 5))  # dW landed in the buffer
    assert torch.equal(gflat[15:], torch.full((3,), 4.0))
    kernellab.sgd_step(list(lin.parameters()), [p.grad for p in lin.parameters()], 0.5, backend="triton")
    torch.testing.assert_close(lin.bias.detach(), before[1] - 2.0)
    gflat.zero_()
    assert all(p.grad.abs().sum() == 0 for p in lin.parameters())


def test_triton_refuses_unpacked_tensors():
    ps, gs = _params(torch.float32)
    with pytest.raises(ValueError, match="params are not packed"):
        kernellab.sgd_step(ps, gs, 0.1, backend="triton")
    optim.pack_(ps)
    with pytest.raises(ValueError, match="grads are not packed"):
        kernellab.sgd_step(ps, gs, 0.1, backend="triton")
    reordered = [ps[1], ps[0]] + ps[2:]
    with pytest.raises(ValueError, match="params are not packed"):
        kernellab.sgd_step(reordered, [p.grad for p in reordered], 0.1, backend="triton")


def test_bad_input_names_the_argument():
    ps, gs = _params(torch.float32)
    sgd = kernellab.sgd_step
    with pytest.raises(ValueError, match="params has 6 tensors but grads has 5"):
        sgd(ps, gs[:5], 0.1)
    with pytest.raises(ValueError, match=r"grads\[0\] has shape"):
        sgd(ps, [gs[0].t()] + gs[1:], 0.1)
    with pytest.raises(TypeError, match=r"params\[1\] has dtype"):
        sgd([ps[0], ps[1].long()], [gs[0], gs[1].long()], 0.1)
    with pytest.raises(TypeError, match=r"grads\[0\] has dtype"):
        sgd(ps, [gs[0].half()] + gs[1:], 0.1)
    with pytest.raises(TypeError, match=r"grads\[2\] must be a torch.Tensor"):
        sgd(ps, gs[:2] + [None] + gs[3:], 0.1)
    with pytest.raises(TypeError, match="params must be a list"):
        sgd(ps[0], gs[0], 0.1)
    with pytest.raises(ValueError, match="lr"):
        sgd(ps, gs, float("nan"))
    with pytest.raises(TypeError, match="lr"):
        sgd(ps, gs, "0.1")
    with pytest.raises(ValueError, match="backend"):
        sgd(ps, gs, 0.1, backend="cuda_v9")
    sgd([], [], 0.1)  # nothing to do


def test_default_backend_here_is_torch_foreach():
    ps, gs = _params(torch.float32)
    want = _expect(ps, gs, 0.25)
    kernellab.sgd_step(ps, gs, 0.25)  # the interpreter is not fast: torch's foreach here
    for p, w in zip(ps, want):
        torch.testing.assert_close(p, w, rtol=1e-7, atol=1e-7)


@pytest.mark.gpu
def test_gpu_triton_is_one_launch_for_every_parameter():
    from kltest import launched_cuda_kernels

    ps, gs = _params(torch.float32, "cuda")
    want = _expect(ps, gs, 0.1)
    optim.pack_(ps)
    for p, g in zip(ps, gs):
        p.grad.copy_(g)
    grads = [p.grad for p in ps]
    kernellab.sgd_step(ps, grads, 0.1, backend="triton")  # compile outside the profile
    names = launched_cuda_kernels(lambda: kernellab.sgd_step(ps, grads, 0.0, backend="triton"))  # lr 0: no change
    assert names == ["_sgd_flat_kernel"], names
    # The kernel computes p - lr g in one FMA (one rounding), the reference in two (lr g
    # rounded first): they differ by up to half an ulp of lr g plus one of the result, which
    # is several ulps of the result where p and lr g nearly cancel (H100: 3 ulps, 3.1e-7
    # relative, at one element of 288 against a 1-ulp bound).
    eps = torch.finfo(torch.float32).eps
    for p, w, g in zip(ps, want, gs):
        bound = eps * (0.1 * g.abs() + w.abs())
        assert ((p - w).abs() <= bound).all(), ((p - w).abs() / bound).max()
