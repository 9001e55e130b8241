"""The op kit (ops/kit.py): what every backend built on it gets."""

from __future__ import annotations

import pytest
import torch

import kernellab
from kernellab import registry

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
