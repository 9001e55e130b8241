"""kernellab.nn.SwiGLUMLP / GeGLUMLP: Hugging Face's gated MLP layout on kernellab.swiglu /
geglu, against the same module written with PyTorch ops (values and every gradient), the
state_dict keys a Llama / Gemma MLP has, and the constructor's argument errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kernellab.nn as knn
from kltest import cpu_backends

BACKENDS = [b for b in cpu_backends("swiglu") if b in ("manual", "torch", "triton")]


def _plain(mlp, x):
    gate, up = mlp.gate_proj(x), mlp.up_proj(x)
    if isinstance(mlp, knn.GeGLUMLP):
        act = F.gelu(gate, approximate=mlp.approximate)
    else:
        act = F.silu(gate)
    return mlp.down_proj(act * up)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cls,kw", [(knn.SwiGLUMLP, {}), (knn.GeGLUMLP, {"approximate": "tanh"}),
                                    (knn.GeGLUMLP, {"approximate": "none"})])  # fmt: skip
def test_gated_mlp_matches_the_pytorch_formula(cls, kw, backend):
    # (Triton has no float64: fp32 there, to fp32 rounding)
    dtype, tol = (torch.float32, 2e-5) if backend == "triton" else (torch.float64, 1e-12)
    torch.manual_seed(0)
    mlp = cls(16, 40, backend=backend, dtype=dtype, **kw)
    x = torch.randn(3, 5, 16, dtype=dtype, requires_grad=True)
    out = mlp(x)
    want = _plain(mlp, x)
    torch.testing.assert_close(out, want, rtol=tol, atol=tol)
    dy = torch.randn_like(out)
    got = torch.autograd.grad(out, [x, *mlp.parameters()], dy)
    ref = torch.autograd.grad(want, [x, *mlp.parameters()], dy)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)


def test_gated_mlp_state_dict_has_hugging_faces_keys():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=16, intermediate_size=40, num_hidden_layers=1,
                                   num_attention_heads=2, vocab_size=32)  # fmt: skip
    from transformers.models.llama.modeling_llama import LlamaMLP

    hf = LlamaMLP(cfg)
    ours = knn.SwiGLUMLP(16, 40)
    assert set(ours.state_dict()) == set(hf.state_dict())
    ours.load_state_dict(hf.state_dict())
    x = torch.randn(2, 3, 16)
    torch.testing.assert_close(ours(x), hf(x), rtol=1e-5, atol=1e-6)


def test_gated_mlp_bias_and_repr():
    mlp = knn.GeGLUMLP(8, 12, bias=True)
    assert mlp.gate_proj.bias is not None and mlp.down_proj.bias is not None
    assert "intermediate_size=12" in repr(mlp) and "approximate='tanh'" in repr(mlp)
    assert knn.SwiGLUMLP(8, 12).gate_proj.bias is None


@pytest.mark.parametrize(
    "make,name",
    [
        (lambda: knn.SwiGLUMLP(0, 8), "hidden_size"),
        (lambda: knn.SwiGLUMLP(8, -1), "intermediate_size"),
        (lambda: knn.SwiGLUMLP(8.0, 8), "hidden_size"),
        (lambda: knn.SwiGLUMLP(True, 8), "hidden_size"),
        (lambda: knn.GeGLUMLP(8, 8, approximate="erf"), "approximate"),
        (lambda: knn.SwiGLUMLP(8, 8, bias="yes"), "bias"),
    ],
)
def test_gated_mlp_bad_arguments_name_the_argument(make, name):
    with pytest.raises((TypeError, ValueError), match=name):
        make()


@pytest.mark.parametrize("backend", BACKENDS)
def test_gated_mlp_does_not_keep_the_activation(backend):
    # The down projection's input act(gate) * up is remade in the backward: the graph
    # keeps the gate and up projections (and what the backend saves) but not it.
    from kernellab.nn import _gated

    torch.manual_seed(0)
    mlp = knn.SwiGLUMLP(16, 40, backend=backend)
    x = torch.randn(3, 5, 16, requires_grad=True)
    remade = []
    real = _gated._Remade.make
    try:
        _gated._Remade.make = lambda self: remade.append(self.op) or real(self)
        out = mlp(x)
        out.sum().backward()
    finally:
        _gated._Remade.make = real
    assert remade == ["swiglu"]
    ref = x.detach().clone().requires_grad_()
    want = torch.autograd.grad(_plain(mlp, ref).sum(), ref)[0]
    torch.testing.assert_close(x.grad, want, rtol=2e-5, atol=2e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("cls", [knn.SwiGLUMLP, knn.GeGLUMLP])
def test_gated_mlp_memory_after_forward_is_below_the_composition(cls):
    # Alive after the forward: the plain composition keeps a, b and c (and act(a) where
    # PyTorch's silu saves it); the module keeps a and b only: at least one [N, I] less.
    torch.manual_seed(0)
    mlp = cls(256, 1024, device="cuda", dtype=torch.bfloat16, backend="triton")
    x = torch.randn(8, 512, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    one = x.shape[0] * x.shape[1] * 1024 * 2

    def kept(fn):
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        out = fn()
        torch.cuda.synchronize()
        return out, torch.cuda.memory_allocated() - base - out.numel() * out.element_size()

    for f in (lambda: mlp(x), lambda: _plain(mlp, x)):  # warm: cuBLAS's workspace (32 MiB) is
        f().float().sum().backward()  # allocated by the first product and stays
    out, ours = kept(lambda: mlp(x))
    out.float().sum().backward()
    out, plain = kept(lambda: _plain(mlp, x))
    assert plain - ours >= one, (plain, ours)
    assert ours <= 2 * one + 4096, ours


def test_gated_mlp_second_backward_refused_then_allowed_without_inplace():
    torch.manual_seed(0)
    mlp = knn.SwiGLUMLP(8, 24, backend="triton")
    x = torch.randn(2, 3, 8, requires_grad=True)
    out = mlp(x).sum()
    out.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="second backward|modified"):
        out.backward()
    from kernellab.nn._gated import gated_mlp

    x.grad = None
    out = gated_mlp(x, mlp.gate_proj, mlp.up_proj, mlp.down_proj, "swiglu", {}, "triton",
                    inplace_backward=False)  # fmt: skip
    g1 = torch.autograd.grad(out.sum(), x, retain_graph=True)[0]
    g2 = torch.autograd.grad(out.sum(), x)[0]
    torch.testing.assert_close(g1, g2)


def test_gated_mlp_without_grad_keeps_nothing():
    mlp = knn.SwiGLUMLP(8, 24)
    with torch.no_grad():
        out = mlp(torch.randn(2, 8))
    assert out.grad_fn is None and out.shape == (2, 8)
