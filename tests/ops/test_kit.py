"""The op kit (core/kit.py): what every backend built on it gets."""

from __future__ import annotations

import pytest
import torch

import kernellab
from kernellab.core import registry

# (op, make args) for every op whose Triton backend the kit builds; CPU: Triton interpreted.
CASES = {
    "gelu": lambda: (torch.randn(3, 7, requires_grad=True),),
    "softmax": lambda: (torch.randn(3, 7, requires_grad=True),),
    "layer_norm": lambda: (
        torch.randn(3, 7, requires_grad=True),
        torch.randn(7, requires_grad=True),
        torch.randn(7, requires_grad=True),
    ),  # fmt: skip
    "rms_norm": lambda: (torch.randn(3, 7, requires_grad=True), torch.randn(7, requires_grad=True)),
}


@pytest.mark.parametrize("op", sorted(CASES))
def test_double_backward_is_refused_clearly_not_silently_wrong(op):
    """A gradient penalty (create_graph=True) through a fused backward kernel: a clear
    RuntimeError naming the op, never a gradient that silently lacks the second-order
    term (the eager autograd.Function used to drop it without a word)."""
    args = CASES[op]()
    y = registry.get(op, "triton")(*args)
    with pytest.raises(RuntimeError, match=r"double backward \(create_graph=True\) is not supported"):
        torch.autograd.grad(y.square().sum(), args[0], create_graph=True)
    # first-order gradients are unaffected
    (g,) = torch.autograd.grad(registry.get(op, "triton")(*args).square().sum(), args[0])
    (ref,) = torch.autograd.grad(registry.get(op, "torch")(*args).square().sum(), args[0])
    torch.testing.assert_close(g, ref, rtol=1e-4, atol=1e-5)


def test_custom_op_path_refuses_double_backward_too():
    x = torch.randn(5, requires_grad=True)
    op = kernellab.get("gelu", "triton").fn.ops[0]  # the custom op torch.compile traces
    (g,) = torch.autograd.grad(op(x).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="no autograd formula"):
        g.sum().backward()


def test_add_has_no_backward_kernel():
    a = torch.randn(4, requires_grad=True)
    b = torch.randn(4, requires_grad=True)
    fn = kernellab.get("add", "triton").fn
    assert fn.ops[1] is None and len(fn.custom_ops) == 1  # dy is the gradient of both inputs
    kernellab.add(a, b, backend="triton").backward(torch.arange(4.0))
    torch.testing.assert_close(a.grad, torch.arange(4.0))
    torch.testing.assert_close(b.grad, torch.arange(4.0))


@pytest.mark.parametrize(
    "op,backend,make",
    [
        (
            "cross_entropy",
            "triton",
            lambda: (torch.randn(4, 9, requires_grad=True), torch.tensor([0, 3, 8, 1])),
        ),
        (
            "attention",
            "triton",
            lambda: tuple(torch.randn(1, 1, 5, 16, requires_grad=True) for _ in range(3)),
        ),
        ("attention", "tiled", lambda: tuple(torch.randn(1, 1, 5, 16, requires_grad=True) for _ in range(3))),
    ],
)
def test_other_fused_backwards_refuse_double_backward(op, backend, make):
    args = make()
    out = registry.get(op, backend)(*args)
    with pytest.raises(RuntimeError, match=r"double backward \(create_graph=True\) is not supported"):
        torch.autograd.grad(out.square().sum(), args[0], create_graph=True)


@pytest.mark.parametrize("activation", [None, "gelu", "relu"])
def test_triton_matmul_supports_double_backward(activation):
    """The matmul's second derivative is cheap and exact: a gradient penalty through
    kernellab.matmul(backend="triton") matches PyTorch's (the backward's matmuls go through
    the custom op, whose autograd is registered)."""
    from kernellab.ops.matmul.epilogue import apply_epilogue

    def penalty(mm, a, b, bias):
        (ga,) = torch.autograd.grad(mm(a, b, bias).square().sum(), a, create_graph=True)
        return torch.autograd.grad(ga.square().sum(), (b, bias))

    gen = torch.Generator().manual_seed(3)
    a = torch.randn(6, 5, generator=gen, dtype=torch.float64).float().requires_grad_()
    b = torch.randn(5, 7, generator=gen).requires_grad_()
    bias = torch.randn(7, generator=gen).requires_grad_()
    ours = penalty(lambda a, b, c: kernellab.matmul(a, b, c, activation, backend="triton"), a, b, bias)
    ref = penalty(lambda a, b, c: apply_epilogue(a @ b, c, activation), a, b, bias)
    for g, r in zip(ours, ref):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "op", ["matmul", "gelu", "layer_norm", "attention", "cross_entropy", "sum", "softmax"]
)
@pytest.mark.parametrize("backend", ["manual", "torch", "triton"])
def test_non_strided_layouts_are_refused_clearly(op, backend):
    """A sparse input used to come back wrong (manual matmul: a sparse result off by 7.0)
    or fail deep inside a backend: every op refuses it, naming the argument."""
    spec = kernellab.get_spec(op)
    shape = {"matmul": (4, 5, 3), "attention": (1, 1, 4, 16), "cross_entropy": (4, 9)}.get(op, (4, 6))
    args = list(spec.make_inputs(shape, torch.float32, "cpu", 0))
    args[0] = args[0].to_sparse()
    with pytest.raises(TypeError, match=rf"{spec.arg_names[0]} has layout torch.sparse_coo"):
        registry.get(op, backend)(*args)


def test_a_backend_that_is_not_a_string_is_refused_clearly():
    with pytest.raises(TypeError, match=r"backend must be a backend name \(str\) or None, got list"):
        kernellab.gelu(torch.randn(3), backend=["triton"])


@pytest.mark.parametrize("backend", ["manual", "torch", "triton", "tiled"])
def test_attention_with_no_queries_or_no_keys_returns_the_empty_or_zero_output(backend):
    """No queries: an empty output. No keys: zeros (the manual composition's answer), with
    zero gradients; these used to fail with "cannot reshape tensor of 0 elements"."""
    q0 = torch.randn(1, 1, 0, 16, requires_grad=True)
    k = torch.randn(1, 1, 5, 16, requires_grad=True)
    y = kernellab.attention(q0, k, k, backend=backend)
    assert y.shape == (1, 1, 0, 16)
    y.sum().backward()
    q = torch.randn(1, 1, 5, 16, requires_grad=True)
    k0 = torch.randn(1, 1, 0, 16, requires_grad=True)
    y = kernellab.attention(q, k0, k0, backend=backend)
    assert y.shape == (1, 1, 5, 16) and not torch.isnan(y).any() and float(y.abs().sum()) == 0.0
    y.sum().backward()
    assert float(q.grad.abs().sum()) == 0.0


def test_manual_matmul_with_no_rows_keeps_the_graph_and_manual_softmax_takes_empty_rows():
    a = torch.randn(0, 5, requires_grad=True)
    b = torch.randn(5, 3, requires_grad=True)
    y = kernellab.matmul(a, b, backend="manual")
    assert y.shape == (0, 3) and y.requires_grad
    y.sum().backward()
    assert b.grad is not None and float(b.grad.abs().sum()) == 0.0
    assert kernellab.softmax(torch.randn(3, 0), backend="manual").shape == (3, 0)


def test_triton_attention_fp32_inf_in_v_stays_inf():
    """An inf in V across more than one key block: the output is inf like the reference,
    not NaN (the fp32 two-level sum started each block from acc * 0.0: -inf * 0 = NaN)."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, n, 16, generator=gen) for n in (4, 20, 20))
    v[0, 0, 3, 0] = -float("inf")
    y = kernellab.attention(q, k, v, backend="triton")
    ref = kernellab.attention(q, k, v, backend="torch")
    assert not torch.isnan(y).any()
    assert torch.equal(torch.isinf(y), torch.isinf(ref))
    torch.testing.assert_close(y[..., 1:], ref[..., 1:], rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_gpu_compile_fullgraph_launches_attention_and_cross_entropy_kernels():
    """Triton attention and the Triton cross_entropy are kit ops. The cross_entropy one is
    a triton_op on a GPU: under torch.compile(fullgraph=True) Inductor traces its launchers
    and launches our kernels from its own code (no opaque custom-op call, which cost
    ~300-450 us of host time per call on the H100), forward and backward; so is attention
    (fp32 here: the fp64 scale Inductor passes is cast in the kernels). Same result as eager."""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    b, h, t, d, v = 2, 2, 128, 64, 1000
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, val = (torch.randn(b, h, t, d, device="cuda", generator=gen) for _ in range(3))
    w = torch.randn(h * d, v, device="cuda", generator=gen) * 0.05
    target = torch.randint(0, v, (b * t,), device="cuda", generator=gen)
    target[::7] = -100  # ignored rows

    def step(q, k, val, w):
        o = kernellab.attention(q, k, val, causal=True, backend="triton")
        logits = o.transpose(1, 2).reshape(b * t, h * d) @ w
        return kernellab.cross_entropy(logits, target, backend="triton")

    def run(fn):
        leaves = [x.clone().requires_grad_() for x in (q, k, val, w)]
        loss = fn(*leaves)
        loss.backward()
        return loss.detach(), [x.grad for x in leaves]

    ref_loss, ref_grads = run(step)
    (loss, grads), codes = run_and_get_code(lambda: run(torch.compile(step, fullgraph=True)))
    code = "\n".join(codes)
    for name in ("_ce_fwd_kernel", "_ce_bwd_kernel", "_attn_fwd", "_attn_bwd_pre", "_attn_bwd_dkdv", "_attn_bwd_dq"):
        assert name in code, name
    # neither op is left opaque to Inductor
    assert "kernellab.cross_entropy" not in code and "kernellab.attention_triton" not in code
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-6)
