"""Weights and biases in any layout: strided, expanded (stride 0) and offset parameters
must give the same answer and gradients as contiguous ones (the Triton and CUDA
launchers read them with unit stride; they used to read a strided weight as if it were
contiguous: off by 2.66 on a [6, 2][:, 0] weight, past the storage for an expanded one)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kernellab
from kernellab.core import registry


def _layouts(d, device, requires_grad=True):
    base = torch.randn(d, 3, device=device)
    return {
        "strided": base[:, 1],
        "expanded": torch.randn(1, device=device).expand(d),
        "offset": torch.randn(d + 1, device=device)[1:],
    }


def _norm_case(op, backend, device, dtype=torch.float32):
    d = 37
    for name, w in _layouts(d, device).items():
        x = torch.randn(5, d, device=device, dtype=dtype, requires_grad=True)
        w = w.to(dtype).detach().requires_grad_()
        args = (x, w) if op == "rms_norm" else (x, w, torch.randn(d, 2, device=device, dtype=dtype)[:, 0])
        ref_fn = (lambda x, w: F.rms_norm(x, (d,), w, eps=1e-6)) if op == "rms_norm" else (
            lambda x, w, b: F.layer_norm(x, (d,), w, b))  # fmt: skip
        dy = torch.randn(5, d, device=device, dtype=dtype)
        y = registry.get(op, backend)(*args)
        gx, gw = torch.autograd.grad(y, (x, w), dy)
        y_ref = ref_fn(*args)
        rx, rw = torch.autograd.grad(y_ref, (x, w), dy)
        tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(y, y_ref, **tol, msg=lambda m, n=name: f"{op}/{backend} {n}: {m}")
        torch.testing.assert_close(gx, rx, **tol)
        torch.testing.assert_close(gw, rw, **dict(tol, atol=tol["atol"] * 10))


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_cpu_triton_norms_take_strided_weights(op):
    _norm_case(op, "triton", "cpu")


def test_cpu_triton_matmul_takes_strided_bias():
    a, b = torch.randn(4, 3), torch.randn(3, 4)
    for bias in (torch.arange(8.0)[::2], torch.tensor([5.0]).expand(4), torch.randn(5)[1:]):
        torch.testing.assert_close(kernellab.matmul(a, b, bias, backend="triton"), a @ b + bias)
        bg = bias.detach().clone().requires_grad_()
        kernellab.matmul(a, b, bg, backend="triton").sum().backward()
        torch.testing.assert_close(bg.grad, torch.full((4,), 4.0))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["triton", "cuda", "cuda_v1"])
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_gpu_norms_take_strided_weights(op, backend):
    _norm_case(op, backend, "cuda", torch.float32)
    _norm_case(op, backend, "cuda", torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["triton", "cuda"])
def test_gpu_matmul_takes_strided_bias(backend):
    a, b = torch.randn(64, 48, device="cuda"), torch.randn(48, 32, device="cuda")
    bias = torch.randn(32, 2, device="cuda")[:, 1]
    torch.testing.assert_close(
        kernellab.matmul(a, b, bias, backend=backend), a @ b + bias, rtol=1e-2, atol=1e-2
    )
