"""The check's reach past regime boundaries (issue 40): wrong implementations that are
wrong only past a block, chunk, rows-per-program or head-dim boundary, under an option
combination, or with tied maxima, and that the quick check used to pass.

Each one is planted under a throw-away backend name (``planted`` fixture), checked with
``check_impl(..., quick=True)`` on the CPU in fp32, and must fail in the stage that
reaches its boundary (``boundary``: ``OpSpec.boundary_cases``); every other stage passes
it, which is why it got through before (the run's random draws, ``fuzz``, may catch it
too). Then the run's random draws themselves, and a correct kernel whose backward is
``@once_differentiable``, which must pass.
"""

from __future__ import annotations

import math
import random

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

import kernellab
from kernellab.core.spec import get_spec
from kernellab.harness import check as ck
from kernellab.harness.check import FAIL, PASS, REFUSED, check_impl

SEED = 1234


def _correct(op):
    return kernellab.get(op, "torch").fn


def _run(impl, seed=SEED):
    return check_impl(impl, torch.float32, device="cpu", quick=True, seed=seed)


def _caught_at_boundary(rep, name):
    """``rep`` failed the boundary case ``name``, and no stage but the boundaries and the
    random draws failed it."""
    failed = {(c.kind, c.name) for c in rep.failures}
    assert rep.status == FAIL
    at_boundary = {n for k, n in failed if k == "boundary"}
    assert name in at_boundary or any(n.startswith(name + " d") for n in at_boundary), rep.failures
    assert {c.kind for c in rep.failures} <= {"boundary", "fuzz"}, rep.failures


# --------------------------------------------------------------------------- attention


def test_attention_ignoring_causal_past_64_keys_fails_at_the_boundary(planted):
    attn = _correct("attention")

    def short_causal(q, k, v, causal=False, scale=None, window=None, softcap=None):
        return attn(q, k, v, causal and k.shape[-2] <= 64, scale, window=window, softcap=softcap)

    rep = _run(planted("attention", "planted_causal64", short_causal))
    _caught_at_boundary(rep, "1x1x35x70x16 causal=True")


def test_attention_ignoring_window_under_gqa_fails_at_the_boundary(planted):
    attn = _correct("attention")

    def no_window_gqa(q, k, v, causal=False, scale=None, window=None, softcap=None):
        gqa = q.dim() == 4 and q.shape[1] != k.shape[1]
        return attn(q, k, v, causal, scale, window=None if gqa else window, softcap=softcap)

    rep = _run(planted("attention", "planted_windowgqa", no_window_gqa))
    _caught_at_boundary(rep, "1x4x2x17x33x16 softcap=5.0,window=(6, 2)")
    failed = {(c.kind, c.name) for c in rep.failures}
    assert ("boundary", "1x4x2x19x13x16 causal=True,window=(4, -1)") in failed, rep.failures


def test_attention_ignoring_softcap_under_gqa_fails_at_the_boundary(planted):
    attn = _correct("attention")

    def no_softcap_gqa(q, k, v, causal=False, scale=None, window=None, softcap=None):
        gqa = q.dim() == 4 and q.shape[1] != k.shape[1]
        return attn(q, k, v, causal, scale, window=window, softcap=None if gqa else softcap)

    rep = _run(planted("attention", "planted_softcapgqa", no_softcap_gqa))
    _caught_at_boundary(rep, "1x4x2x17x33x16 softcap=5.0,window=(6, 2)")


def test_attention_with_a_wrong_default_scale_at_head_dim_128_fails_at_the_boundary(planted):
    attn = _correct("attention")

    def tile_scale(q, k, v, causal=False, scale=None, window=None, softcap=None):
        if scale is None:  # 1/sqrt of the head dim, capped at a 64-wide tile: wrong past 64
            scale = 1.0 / math.sqrt(min(q.shape[-1], 64))
        return attn(q, k, v, causal, scale, window=window, softcap=softcap)

    rep = _run(planted("attention", "planted_scale128", tile_scale))
    _caught_at_boundary(rep, "1x2x3x5x128")


# --------------------------------------------------------------------------- cross_entropy


def test_cross_entropy_dropping_columns_past_8192_fails_at_the_boundary(planted):
    ce = _correct("cross_entropy")

    def two_chunks(logits, target, ignore_index=-100, reduction="mean", **kw):
        v = logits.shape[-1]
        if v > 8192:  # the columns past two 4096-wide chunks never enter the sum
            tail = torch.full_like(logits[..., 8192:], -1e4)
            logits = torch.cat([logits[..., :8192], tail], -1)
        return ce(logits, target, ignore_index, reduction, **kw)

    rep = _run(planted("cross_entropy", "planted_vocab8192", two_chunks))
    _caught_at_boundary(rep, "2x8197")


# --------------------------------------------------------------------------- norms


def _stats_of_first_4096(x, weight, bias, eps, rms):
    head = x[..., :4096].float()
    if rms:
        y = x * torch.rsqrt(head.square().mean(-1, keepdim=True) + eps) * weight
        return y.to(x.dtype)
    mean = head.mean(-1, keepdim=True)
    var = (head - mean).square().mean(-1, keepdim=True)
    y = (x - mean) * torch.rsqrt(var + eps) * weight
    return (y + bias if bias is not None else y).to(x.dtype)


def test_layer_norm_with_statistics_of_the_first_4096_columns_fails_at_the_boundary(planted):
    ln = _correct("layer_norm")

    def first_block(x, weight, bias=None, eps=1e-5):
        if x.shape[-1] <= 4096:
            return ln(x, weight, bias, eps)
        return _stats_of_first_4096(x, weight, bias, eps, rms=False)

    rep = _run(planted("layer_norm", "planted_d4096", first_block))
    _caught_at_boundary(rep, "17x4099")


def test_rms_norm_with_statistics_of_the_first_4096_columns_fails_at_the_boundary(planted):
    rms = _correct("rms_norm")

    def first_block(x, weight, eps=1e-6, **kw):
        if x.shape[-1] <= 4096:
            return rms(x, weight, eps, **kw)
        return _stats_of_first_4096(x, weight, None, eps, rms=True)

    rep = _run(planted("rms_norm", "planted_rms4096", first_block))
    _caught_at_boundary(rep, "17x4099")


class _WeightGradOfFirst64Rows(torch.autograd.Function):
    """layer_norm whose dweight and dbias sum the first 64 rows only (one program's rows,
    the others' partial sums lost); dx right."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        ctx.save_for_backward(x, weight, bias)
        ctx.eps = eps
        return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)

    @staticmethod
    def backward(ctx, dy):
        if torch.is_grad_enabled():
            raise RuntimeError("planted: double backward is not supported")
        x, weight, bias = ctx.saved_tensors
        with torch.enable_grad():
            xd = x.detach().requires_grad_()
            b = None if bias is None else bias.detach()
            y = F.layer_norm(xd, (x.shape[-1],), weight.detach(), b, ctx.eps)
            (dx,) = torch.autograd.grad(y, xd, dy)
        rows = x.reshape(-1, x.shape[-1])[:64].float()
        g = dy.reshape(-1, x.shape[-1])[:64].float()
        mean = rows.mean(-1, keepdim=True)
        xhat = (rows - mean) * torch.rsqrt((rows - mean).square().mean(-1, keepdim=True) + ctx.eps)
        dw = (g * xhat).sum(0).to(weight.dtype)
        db = None if bias is None else g.sum(0).to(bias.dtype)
        return dx, dw, db, None


def test_layer_norm_weight_grad_of_the_first_64_rows_fails_at_the_boundary(planted):
    def wgrad64(x, weight, bias=None, eps=1e-5):
        return _WeightGradOfFirst64Rows.apply(x, weight, bias, eps)

    rep = _run(planted("layer_norm", "planted_dw64", wgrad64))
    _caught_at_boundary(rep, "67x40")
    (case,) = [c for c in rep.failures if c.kind == "boundary"]
    assert case.name in ("67x40 dweight", "67x40 dbias"), case


# --------------------------------------------------------------------------- ties


def test_max_pool2d_sending_gradients_to_the_last_tied_maximum_fails_at_the_boundary(planted):
    def last_of_ties(x, kernel_size=2, stride=None):
        # The windows of the image flipped in H and W are the same windows in reverse
        # row-major order: PyTorch's first maximum there is the last one here.
        s = kernel_size if stride is None else stride
        h, w = x.shape[-2:]
        hu = (h - kernel_size) // s * s + kernel_size
        wu = (w - kernel_size) // s * s + kernel_size
        return F.max_pool2d(x[..., :hu, :wu].flip(-1, -2), kernel_size, s).flip(-1, -2)

    rep = _run(planted("max_pool2d", "planted_lasttie", last_of_ties))
    _caught_at_boundary(rep, "2x3x6x7 ties")
    failed = {c.name for c in rep.failures}
    assert "1x2x7x7 kernel_size=3,stride=1 ties dx" in failed, rep.failures


def test_max_sending_its_gradient_to_the_last_tied_maximum_fails_at_the_boundary(planted):
    mx = _correct("max")

    def last_of_ties(x):
        values = x.flip(-1).max(-1).values  # the same values; the gradient to the last tie
        return values, mx(x)[1]

    rep = _run(planted("max", "planted_maxlasttie", last_of_ties))
    _caught_at_boundary(rep, "6x33 ties")


def test_argmax_returning_the_last_tied_index_fails_at_the_boundary(planted):
    def last_of_ties(x):
        return x.shape[-1] - 1 - x.flip(-1).argmax(-1)

    rep = _run(planted("argmax", "planted_argmaxlast", last_of_ties))
    assert ("boundary", "6x33 ties") in {(c.kind, c.name) for c in rep.failures}, rep.failures


def test_the_ties_are_there():
    """The boundary inputs hold their maxima more than once: every row of 33, and many 2x2
    windows (else the ties tests above would prove nothing)."""
    spec = get_spec("max_pool2d")
    (x,) = ck.with_ties(spec.make_inputs((2, 3, 6, 7), torch.float32, "cpu", 3), spec.scale)
    win = x[..., :6, :6].unfold(-2, 2, 2).unfold(-2, 2, 2).reshape(2, 3, 3, 3, 4)
    tied = (win == win.amax(-1, keepdim=True)).sum(-1) > 1
    assert tied.float().mean() > 0.3
    (r,) = ck.with_ties(get_spec("max").make_inputs((6, 33), torch.float32, "cpu", 3), get_spec("max").scale)
    assert bool(((r == r.amax(-1, keepdim=True)).sum(-1) > 1).all())


# --------------------------------------------------------------------------- random draws each run


def test_quick_mode_draws_fresh_problems_per_seed_replayable(planted):
    """Without --fuzz, every quick run draws QUICK_DRAWS problems from the op's generator:
    the same for the same seed (--seed replays a failure), others for another seed."""
    impl = kernellab.get("gelu", "torch")

    def drawn(seed):  # (the draws alone: a whole quick run draws them the same way, below)
        rep = check_impl(impl, torch.float32, device="cpu", quick=True, seed=seed, only_fuzz=True)
        assert rep.status == PASS, rep.failures
        return [c.name for c in rep.cases if c.kind == "fuzz" and not c.name.startswith("grad ")]

    first = drawn(11)
    assert len(first) == ck.QUICK_DRAWS
    assert drawn(11) == first
    assert drawn(12) != first


def test_a_kernel_right_only_at_the_listed_shapes_fails_the_random_draws(planted):
    """Tuned to the shapes the spec names (KernelBench's lesson): right there, wrong
    everywhere else; only the run's own random problems see it."""
    spec = get_spec("gelu")
    listed = spec.quick_shapes + spec.test_shapes + spec.gradient_shapes
    listed = {tuple(s) for s in listed + [spec.layout_shape, spec.reach, spec.rows_shape]}
    g = _correct("gelu")

    def listed_only(x):
        y = g(x)
        return y if tuple(x.shape) in listed else y * 1.01

    rep = _run(planted("gelu", "planted_listed", listed_only))
    assert rep.status == FAIL
    assert {c.kind for c in rep.failures} == {"fuzz"}, rep.failures


def test_quick_draws_stay_small():
    """The extra draws must stay cheap under the Triton interpreter: at most QUICK_WORK,
    and a leading dim (batch, rows) of at most QUICK_LEAD."""
    for op in ("attention", "matmul", "conv2d", "cross_entropy", "layer_norm"):
        spec = get_spec(op)
        impl = kernellab.get(op, "torch")
        for seed in range(8):
            runner = ck._Runner(impl, spec, torch.float32, "cpu", seed, quick=True)
            rng = random.Random(seed)
            for _ in range(ck.QUICK_DRAWS):
                shape, opts = runner._draw(rng, big=False)
                assert ck._work(spec, shape, opts) <= ck.QUICK_WORK, (op, shape, opts)
                assert len(shape) < 2 or shape[0] <= ck.QUICK_LEAD, (op, shape, opts)


# --------------------------------------------------------------------------- once_differentiable


class _OnceDifferentiableGelu(torch.autograd.Function):
    """A correct gelu (tanh) whose backward is ``@once_differentiable``: PyTorch refuses its
    double backward with a deferred error, a refusal the check must accept."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return F.gelu(x, approximate="tanh")

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        xf = x.float()
        k = 0.7978845608028654
        t = torch.tanh(k * (xf + 0.044715 * xf**3))
        d = 0.5 * (1 + t) + 0.5 * xf * (1 - t * t) * k * (1 + 3 * 0.044715 * xf * xf)
        return (dy.float() * d).to(x.dtype)


def test_a_once_differentiable_backward_is_a_refusal_of_double_backward(planted):
    rep = _run(planted("gelu", "planted_once", _OnceDifferentiableGelu.apply))
    assert rep.status == PASS, rep.failures
    (dd,) = [c for c in rep.cases if c.kind == "double"]
    assert dd.status == REFUSED and "once_differentiable" in dd.detail, dd
    # declared double backward: the same refusal is then a failure
    rep = _run(planted("gelu", "planted_once_claims", _OnceDifferentiableGelu.apply, double_backward=True))
    assert {(c.kind, c.name) for c in rep.failures} == {("double", "backward")}, rep.failures
