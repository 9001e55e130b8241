"""The compile backend (torch.compile of manual, ops/_baselines.compiled) refuses a backward
whose saved inputs were modified in place after the forward, as eager autograd does.

AOTAutograd saves its inputs as views made inside the graph, each with a version counter of
its own, so without the check the gradient is silently computed from the new values. Each
case: the error names the op and the argument; the same call without the in-place change
gives eager's gradients; an argument the backward does not read may change freely."""

from __future__ import annotations

import pytest
import torch

import kernellab

pytestmark = pytest.mark.skipif(
    kernellab.get("matmul", "compile").why_unavailable("cpu") is not None, reason="torch.compile unavailable"
)


def _leaves(*shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g).requires_grad_() for s in shapes]


# op, shapes of the tensor arguments, options, arguments whose values the backward reads,
# and one it does not (None: every argument is read).
CASES = [
    ("matmul", [(5, 7), (7, 3)], {}, ["a", "b"], None),
    ("attention", [(2, 3, 5, 8)] * 3, {"causal": True}, ["q", "k", "v"], None),
    ("layer_norm", [(4, 16), (16,), (16,)], {}, ["x", "weight"], "bias"),
]


def _call(op, args, opts):
    return getattr(kernellab, op)(*args, **opts, backend="compile")


def _grads(op, args, opts):
    out = _call(op, args, opts)
    return torch.autograd.grad(out, args, torch.ones_like(out))


@pytest.mark.parametrize("op,shapes,opts,read,unread", CASES, ids=[c[0] for c in CASES])
def test_compile_refuses_saved_input_modified_in_place(op, shapes, opts, read, unread):
    names = read + ([unread] if unread else [])
    args = _leaves(*shapes)
    want = [_grads(op, [a.detach().clone().requires_grad_() for a in args], opts)]
    # Untouched: the compiled gradients are eager's (the check adds no false alarm).
    got = _grads(op, args, opts)
    for g, w in zip(got, want[0]):
        torch.testing.assert_close(g, w)
    for name in read:
        args = _leaves(*shapes)
        out = _call(op, args, opts)
        with torch.no_grad():
            args[names.index(name)].mul_(3.0)
        with pytest.raises(RuntimeError, match=rf"{op}/compile: argument '{name}' was modified in place"):
            out.backward(torch.ones_like(out))


@pytest.mark.parametrize("op,shapes,opts,read,unread", [c for c in CASES if c[4]], ids=lambda c: str(c))
def test_compile_allows_unread_input_modified_in_place(op, shapes, opts, read, unread):
    args = _leaves(*shapes)
    want = _grads(op, [a.detach().clone().requires_grad_() for a in args], opts)
    out = _call(op, args, opts)
    with torch.no_grad():
        args[len(read)].mul_(3.0)  # the bias: dx, dweight, dbias do not read its values
    got = torch.autograd.grad(out, args, torch.ones_like(out))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


def test_compile_refuses_output_modified_in_place_when_saved():
    """An output the compiled backward reads, changed in place: eager raises, and so must
    compile (exp's derivative is its output: the compiled graph saves it)."""
    from kernellab.ops._baselines import compiled

    def manual_exp(x):
        return torch.exp(x)

    f = compiled(manual_exp)
    (x,) = _leaves((6, 5))
    y = f(x)
    if not any(t.data_ptr() == y.data_ptr() for t in y.grad_fn.saved_tensors):
        pytest.skip("this torch's compiled exp does not save its output")
    with torch.no_grad():
        y.add_(1.0)
    with pytest.raises(RuntimeError, match=r"exp/compile: the output was modified in place"):
        y.backward(torch.ones_like(y))
