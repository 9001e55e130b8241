"""A model that names no backend compiles to one graph (fullgraph) with its backward:
inside torch.compile the default is PyTorch's op (registry.compiled_backend), and nothing
on that path (alignment checks, gradient hooks, host-side tests) breaks the graph."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kernellab


def _block(x, w_qkv, ln_w, ln_b, heads):
    b, t, d = x.shape
    h = kernellab.layer_norm(x, ln_w, ln_b)
    q, k, v = (h @ w_qkv.t()).view(b, t, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
    a = kernellab.attention(q, k, v, causal=True).transpose(1, 2).reshape(b, t, d)
    return kernellab.gelu(a + x)


def _step(device, dtype):
    torch.manual_seed(0)
    b, t, d, heads, vocab = 2, 64, 64, 4, 96
    x = torch.randn(b, t, d, device=device, dtype=dtype, requires_grad=True)
    w_qkv = (0.05 * torch.randn(3 * d, d, device=device, dtype=dtype)).requires_grad_()
    ln_w = torch.ones(d, device=device, dtype=dtype, requires_grad=True)
    ln_b = torch.zeros(d, device=device, dtype=dtype, requires_grad=True)
    head = (0.05 * torch.randn(vocab, d, device=device, dtype=dtype)).requires_grad_()
    tgt = torch.randint(0, vocab, (b * t,), device=device)

    def loss_of(x, w_qkv, ln_w, ln_b, head):
        y = _block(x, w_qkv, ln_w, ln_b, heads)
        return kernellab.cross_entropy((y @ head.t()).view(b * t, vocab), tgt)

    def reference(x, w_qkv, ln_w, ln_b, head):
        hh = F.layer_norm(x, (d,), ln_w, ln_b)
        q, k, v = (hh @ w_qkv.t()).view(b, t, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        y = F.gelu(a + x, approximate="tanh")
        return F.cross_entropy((y @ head.t()).view(b * t, vocab), tgt)

    args = (x, w_qkv, ln_w, ln_b, head)
    torch._dynamo.reset()
    got = torch.compile(loss_of, fullgraph=True)(*args)
    g_got = torch.autograd.grad(got, args)
    want = reference(*args)
    g_want = torch.autograd.grad(want, args)
    tol = dict(rtol=2e-2, atol=2e-2) if dtype != torch.float32 else dict(rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got, want, **tol)
    for a, b_ in zip(g_got, g_want):
        torch.testing.assert_close(a, b_, **tol)


def test_default_ops_compile_fullgraph_cpu():
    _step("cpu", torch.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_gpu_default_ops_compile_fullgraph(dtype):
    _step("cuda", dtype)


def test_an_eager_call_after_the_first_trace_does_not_recompile():
    # The traced default must not read Impl._validate, which the first eager call sets
    # lazily: a guard on it failed after that call and recompiled the graph.
    import torch._dynamo

    from kernellab.core import registry

    impl = registry.get("gelu", registry.compiled_backend("gelu", "cpu"))
    impl._validate = None
    torch._dynamo.reset()
    graphs = []

    def count(gm, example_inputs):
        graphs.append(gm)
        return gm

    f = torch.compile(lambda t: kernellab.gelu(t) * 2, backend=count)
    x = torch.randn(4, 8)
    f(x)
    kernellab.gelu(x)
    assert impl._validate is not None  # the eager call set it
    f(x)
    f(x)
    assert len(graphs) == 1
