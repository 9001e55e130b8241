"""The check's reach (issue 16): wrong implementations that the check used to pass.

Each one is planted under a throw-away backend name (``planted`` fixture) and
``check_impl(..., quick=True)`` on the CPU must reject it, in the case kind its mistake
belongs to: option cases (bias, scale, dim, ignore_index), every tensor argument in every
layout (weights, integer targets, grad_outputs), input integrity, a re-call on inputs
modified in place, double backward, and rows past 65,535 in quick mode. Every planted
function below passed the check before these case kinds existed.
"""

from __future__ import annotations

import weakref

import torch

import kernellab
from kernellab.harness.check import FAIL, PASS, REFUSED, check_impl

SEED = 1234


def _correct(op):
    """PyTorch's own op, the correct part each planted mistake is built around."""
    return kernellab.get(op, "torch").fn


def _run(impl, dtype=torch.float32, **kw):
    return check_impl(impl, dtype, device="cpu", quick=True, seed=SEED, **kw)


def _failed(rep):
    return {(c.kind, c.name) for c in rep.failures}


def _failed_kinds(rep):
    return {c.kind for c in rep.failures}


def _unit_stride(t):
    """``t`` read as a kernel that assumes unit stride would read it: from the view's
    first element, consecutive elements of the storage."""
    return torch.as_strided(t, t.shape, (1,) if t.dim() == 1 else t.stride(), t.storage_offset())


# --------------------------------------------------------------------------- option cases


def test_matmul_ignoring_bias_fails_the_bias_options(planted):
    mm = _correct("matmul")

    def no_bias(a, b, bias=None, activation=None):
        return mm(a, b, None, activation)

    rep = _run(planted("matmul", "planted_nobias", no_bias))
    assert rep.status == FAIL
    failed = _failed(rep)
    assert ("option", "bias=tensor") in failed and ("option", "activation=gelu,bias=tensor") in failed, failed
    assert _failed_kinds(rep) == {"option", "grad", "layout", "recall"}, rep.failures
    assert ("grad", "grad bias=tensor") in failed  # "no gradient for bias"
    assert ("recall", "inputs modified in place bias=tensor") in failed


def test_matmul_relu_that_drops_nan_fails_the_option_specials(planted):
    # relu as max(z, 0) turns a NaN into 0 (as tl.maximum / fmaxf do): every plain case and
    # the relu option with plain inputs pass; NaN planted in that option's inputs fails it
    mm = _correct("matmul")

    def relu_max(a, b, bias=None, activation=None):
        if activation != "relu":
            return mm(a, b, bias, activation)
        z = mm(a, b, bias, None)
        return torch.where(torch.isnan(z), torch.zeros_like(z), torch.relu(z))

    rep = _run(planted("matmul", "planted_relu_max", relu_max))
    assert rep.status == FAIL
    failed = _failed(rep)
    relu = [name for kind, name in failed if kind == "option"]
    assert relu and all("relu" in n and n.endswith("nan/inf/extremes") for n in relu), failed
    assert _failed_kinds(rep) == {"option"}, rep.failures


def test_attention_ignoring_scale_fails_the_scale_options(planted):
    attn = _correct("attention")

    def no_scale(q, k, v, causal=False, scale=None, **kw):
        return attn(q, k, v, causal, **kw)

    rep = _run(planted("attention", "planted_noscale", no_scale))
    assert rep.status == FAIL
    failed = _failed(rep)
    assert ("option", "scale=0.5") in failed and ("option", "causal=True,scale=0.05") in failed, failed
    # causal alone (the default scale) is computed right
    assert ("option", "causal=True") not in failed
    # (the option's gradient too; the run's random draws where they draw a scale)
    assert {"option", "grad"} <= _failed_kinds(rep) <= {"option", "grad", "fuzz"}, rep.failures
    assert not [c for c in rep.failures if c.kind == "fuzz" and "scale=" not in c.name], rep.failures


def test_attention_with_top_left_causal_fails_when_s_q_differs_from_s_k(planted):
    attn = _correct("attention")

    def top_left(q, k, v, causal=False, scale=None):
        if not causal:
            return attn(q, k, v, False, scale)
        mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()  # aligned top-left
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)

    rep = _run(planted("attention", "planted_topleft", top_left))
    assert ("option", "causal=True") in _failed(rep), rep.failures


def test_sum_that_always_reduces_the_last_dim_fails_the_dim_options(planted):
    s = _correct("sum")

    def last_dim_only(x, dim=None):
        return s(x) if dim is None else s(x, dim=-1)

    rep = _run(planted("sum", "planted_lastdim", last_dim_only))
    assert rep.status == FAIL
    assert {("option", "dim=0"), ("option", "dim=1")} <= _failed(rep), rep.failures
    assert ("option", "dim=-1") not in _failed(rep)


def test_cross_entropy_ignoring_a_non_default_ignore_index_fails(planted):
    ce = _correct("cross_entropy")

    def default_ignore(logits, target, ignore_index=-100, reduction="mean", **kw):
        return ce(logits, target, -100, reduction, **kw)

    rep = _run(planted("cross_entropy", "planted_ignore", default_ignore))
    assert rep.status == FAIL
    failed = _failed(rep)
    # in range: rows of class 3 counted as class 3; negative: -1 is then out of range
    assert ("option", "ignore_index=3") in failed, failed
    assert ("option", "ignore_index=-1,reduction=sum") in failed, failed
    assert _failed_kinds(rep) == {"option", "grad"}, rep.failures


def test_layer_norm_ignoring_bias_none_fails(planted):
    ln = _correct("layer_norm")

    def bias_one(x, weight, bias=None, eps=1e-5):
        return ln(x, weight, torch.ones_like(weight) if bias is None else bias, eps)

    rep = _run(planted("layer_norm", "planted_biasnone", bias_one))
    assert ("option", "bias=None") in _failed(rep), rep.failures


# --------------------------------------------------------------------------- layouts of every argument


def test_layer_norm_reading_weight_and_bias_with_unit_stride_fails(planted):
    """The issue's first silent wrong answer: Triton layer_norm read weight and bias as
    contiguous (a [6, 2][:, 0] weight was off by 2.66, an expanded one read past its
    storage)."""
    ln = _correct("layer_norm")

    def unit_stride_params(x, weight, bias=None, eps=1e-5):
        return ln(x, _unit_stride(weight), None if bias is None else _unit_stride(bias), eps)

    rep = _run(planted("layer_norm", "planted_wstride", unit_stride_params))
    assert rep.status == FAIL
    failed = {name for kind, name in _failed(rep) if kind == "layout"}
    assert {"weight:sliced", "weight:expanded", "bias:sliced", "bias:expanded"} <= failed, rep.failures
    assert "weight:offset" not in failed  # the offset is honoured: that layout is right
    assert _failed_kinds(rep) == {"layout"}, rep.failures


def test_cross_entropy_reading_targets_with_unit_stride_fails(planted):
    ce = _correct("cross_entropy")

    def unit_stride_target(logits, target, *args, **kw):
        return ce(logits, _unit_stride(target), *args, **kw)

    rep = _run(planted("cross_entropy", "planted_tstride", unit_stride_target))
    assert rep.status == FAIL
    assert ("layout", "target:sliced") in _failed(rep), rep.failures
    assert _failed_kinds(rep) == {"layout"}, rep.failures


class _DyAsContiguous(torch.autograd.Function):
    """gelu whose backward packs a grad_output with a non-unit last stride (the strided
    dy the grad stage tries) but reads any other one as if it were contiguous: an
    expanded dy, what ``y.sum().backward()`` hands every backward, is read past its
    storage."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.nn.functional.gelu(x, approximate="tanh")

    @staticmethod
    def backward(ctx, dy):
        if torch.is_grad_enabled():
            raise RuntimeError("planted: double backward is not supported")
        (x,) = ctx.saved_tensors
        if dy.stride(-1) != 1:
            dy = dy.contiguous()
        else:  # row-major strides from the first element
            strides, acc = [], 1
            for d in reversed(dy.shape):
                strides.append(acc)
                acc *= d
            dy = torch.as_strided(dy, dy.shape, tuple(reversed(strides)), dy.storage_offset())
        with torch.enable_grad():
            xd = x.detach().requires_grad_()
            y = torch.nn.functional.gelu(xd, approximate="tanh")
            (dx,) = torch.autograd.grad(y, xd, dy)
        return dx


def test_a_backward_that_misreads_an_expanded_grad_output_fails(planted):
    rep = _run(planted("gelu", "planted_dy", _DyAsContiguous.apply))
    assert rep.status == FAIL
    assert _failed(rep) == {("layout", "dy:expanded")}, rep.failures
    assert "out of bounds" in rep.failures[0].detail  # (PyTorch's bounds check; a kernel reads garbage)


# --------------------------------------------------------------------------- integrity and re-calls


def test_an_implementation_that_overwrites_its_input_fails_integrity(planted):
    g = _correct("gelu")

    def overwrites(x):
        y = g(x.clone())  # right answer, gradient through the clone
        if 0 not in x.stride():
            x.data.mul_(-1.0)  # then scribbles over the caller's tensor
        return y

    rep = _run(planted("gelu", "planted_overwrite", overwrites))
    assert rep.status == FAIL
    assert _failed_kinds(rep) == {"integrity"}, rep.failures
    assert ("integrity", "integrity forward and backward") in _failed(rep)
    assert all("x modified by the forward" in c.detail for c in rep.failures)


class _WritesInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.nn.functional.gelu(x, approximate="tanh")

    @staticmethod
    def backward(ctx, dy):
        if torch.is_grad_enabled():
            raise RuntimeError("planted: double backward is not supported")
        (x,) = ctx.saved_tensors
        with torch.enable_grad():
            xd = x.detach().requires_grad_()
            (dx,) = torch.autograd.grad(torch.nn.functional.gelu(xd, approximate="tanh"), xd, dy)
        x.data.zero_()  # reuses the input's buffer as scratch after the backward
        return dx


def test_an_implementation_that_overwrites_its_input_in_the_backward_fails(planted):
    rep = _run(planted("gelu", "planted_bwdwrite", _WritesInBackward.apply))
    assert rep.status == FAIL
    assert _failed_kinds(rep) == {"integrity"}, rep.failures
    assert any("x modified by the backward" in c.detail for c in rep.failures)


def test_cross_entropy_inplace_backward_is_exempt_from_integrity_only_when_asked():
    impl = kernellab.get("cross_entropy", "triton")
    rep = _run(impl)
    assert rep.status == PASS, rep.failures
    cases = {(c.kind, c.name): c for c in rep.cases}
    assert cases[("grad", "grad inplace_backward=True")].status == PASS


def test_a_cache_keyed_on_data_ptr_fails_the_re_call_on_mutated_inputs(planted):
    """A cache keyed on the input's address (guarded against a recycled address by a weak
    reference): every case with fresh tensors misses it, the same tensor modified in place
    hits it and gets the stale answer."""
    g = _correct("gelu")
    cache: dict = {}

    def cached(x):
        y = g(x)
        key = (x.data_ptr(), tuple(x.shape), x.stride(), x.dtype)
        hit = cache.get(key)
        if hit is not None and hit[0]() is x:
            return y + (hit[1] - y).detach()  # stale value, correct gradient
        cache[key] = (weakref.ref(x), y.detach().clone())
        return y

    rep = _run(planted("gelu", "planted_ptrcache", cached))
    assert rep.status == FAIL
    assert _failed(rep) == {("recall", "inputs modified in place")}, rep.failures


# --------------------------------------------------------------------------- double backward


class _DetachedSecondOrder(torch.autograd.Function):
    """gelu whose backward is PyTorch ops on a detached x: first order right, create_graph
    accepted, the second derivative through x silently lost (the issue's triton gelu)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.nn.functional.gelu(x, approximate="tanh")

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        xd = x.detach()
        k = 0.7978845608028654
        t = torch.tanh(k * (xd + 0.044715 * xd**3))
        return dy * (0.5 * (1 + t) + 0.5 * xd * (1 - t * t) * k * (1 + 3 * 0.044715 * xd * xd))


def test_a_silently_wrong_second_derivative_fails(planted):
    rep = _run(planted("gelu", "planted_dd", _DetachedSecondOrder.apply))
    assert rep.status == FAIL
    assert _failed(rep) == {("double", "backward dx")}, rep.failures
    assert "should have raised a RuntimeError" in rep.failures[0].detail


def test_a_clear_refusal_of_double_backward_passes_and_a_declared_one_must_compute(planted):
    fn = kernellab.get("gelu", "triton").fn  # refuses create_graph=True with a RuntimeError
    rep = _run(planted("gelu", "planted_refuses", fn))
    assert rep.status == PASS, rep.failures
    (dd,) = [c for c in rep.cases if c.kind == "double"]
    assert dd.status == REFUSED and "double backward" in dd.detail

    rep = _run(planted("gelu", "planted_claims", fn, double_backward=True))
    assert _failed(rep) == {("double", "backward")}, rep.failures
    assert rep.failures[0].detail.startswith("declared, but raised RuntimeError")


def test_declared_double_backward_is_checked_against_float64():
    rep = _run(kernellab.get("matmul", "triton"))
    (dd,) = [c for c in rep.cases if c.kind == "double"]
    assert dd.status == PASS and dd.err is not None, dd


# --------------------------------------------------------------------------- rows past 65,535


def test_softmax_of_the_first_65535_rows_only_fails_in_quick_mode(planted):
    sm = _correct("softmax")

    def first_rows(x):
        rows = x.reshape(-1, x.shape[-1]) if x.dim() else x.reshape(1, 1)
        head = sm(rows[:65535])
        rest = torch.empty((rows.shape[0] - head.shape[0], rows.shape[1]), dtype=x.dtype)  # never written
        return torch.cat([head, rest]).reshape(x.shape)

    rep = _run(planted("softmax", "planted_65535", first_rows))
    assert rep.status == FAIL
    assert _failed(rep) == {("shape", "65537x3")}, rep.failures
    # one dtype is enough: the index arithmetic does not depend on it
    rep16 = _run(planted("softmax", "planted_65535", first_rows), torch.float16)
    assert rep16.status == PASS, rep16.failures
