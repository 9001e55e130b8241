"""rope: every registered implementation against a transcription of Hugging Face's formula
in float64 (neox and interleaved layouts, position ids, GQA, partial rotary, cos / sin in
each shape HF produces), non-contiguous q / k out of a fused qkv projection, dq and dk for
every backend on the CPU (Triton under the interpreter), the in-place mode and its
refusals, bad inputs, torch.compile, and the check engine (which must also catch planted
mistakes, dk included).
"""

from __future__ import annotations

import pytest
import torch

import kernellab
from kernellab.core import registry
from kernellab.harness.check import FAIL, PASS, check_impl
from kernellab.ops.rope import SPEC, may_self_overlap, rope_reference
from kernellab.ops.rope import triton as rope_triton_mod
from kltest import check_planted, compile_grads_match, cpu_backends, seed_for

OP = "rope"
FAST = cpu_backends(OP)  # manual, torch, triton (compile is tested apart: seconds per build)
ALL = [i.backend for i in kernellab.impls(OP)]
F64 = [b for b in ALL if torch.float64 in (registry.get(OP, b).dtypes or ())]


# --------------------------------------------------------------------------- Hugging Face


def hf_rotate_half(x):
    """transformers' rotate_half (modeling_llama)."""
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def hf_rotate_every_two(x):
    """transformers' rotate_every_two (modeling_gptj)."""
    x1 = x[:, :, :, ::2]
    x2 = x[:, :, :, 1::2]
    x = torch.stack((-x2, x1), dim=-1)
    return x.flatten(-2)


def hf_rope(q, k, cos, sin, position_ids=None, layout="neox"):
    """apply_rotary_pos_emb(q, k, cos, sin, position_ids, unsqueeze_dim=1) as transformers
    wrote it (the older signature gathers cos[position_ids]), with the partial rotary of
    GPT-NeoX / Phi (q[..., :rotary_ndims] rotated, the rest concatenated back) and GPT-J's
    rotate_every_two for the interleaved layout."""
    if position_ids is not None:
        cos, sin = cos[position_ids], sin[position_ids]
    cos, sin = cos.unsqueeze(1) if cos.dim() == 3 else cos, sin.unsqueeze(1) if sin.dim() == 3 else sin
    rot = hf_rotate_half if layout == "neox" else hf_rotate_every_two
    r = cos.shape[-1]
    q_rot, q_pass = q[..., :r], q[..., r:]
    k_rot, k_pass = k[..., :r], k[..., r:]
    q_embed = (q_rot * cos) + (rot(q_rot) * sin)
    k_embed = (k_rot * cos) + (rot(k_rot) * sin)
    return torch.cat((q_embed, q_pass), dim=-1), torch.cat((k_embed, k_pass), dim=-1)


def hf_cos_sin(positions, dim, layout="neox", base=10000.0):
    """What a rotary embedding returns at ``positions`` (any shape): LlamaRotaryEmbedding's
    cat(freqs, freqs) for neox, GPT-J's repeat_interleave(freqs, 2) for interleaved; fp64."""
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    freqs = positions.to(torch.float64)[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1) if layout == "neox" else freqs.repeat_interleave(2, dim=-1)
    return emb.cos(), emb.sin()


def make_case(case, dtype=torch.float32, seed=0, b=2, h=4, s=7, d=16):
    """(q, k, cos, sin, position_ids, layout) of a named case; cos / sin real angles
    unless the case says random (the formula must hold for any values)."""
    gen = torch.Generator().manual_seed(seed)
    layout = "interleaved" if "interleaved" in case else "neox"
    hk = 1 if "gqa" in case else h
    r = d // 2 if "partial" in case else d
    q = torch.randn(b, h, s, d, generator=gen)
    k = torch.randn(b, hk, s, d, generator=gen)
    pos = None
    if "positions" in case:
        pos = torch.randint(0, 3 * s, (b, s), generator=gen)
        cos, sin = hf_cos_sin(torch.arange(3 * s), r, layout)  # (max_pos, R) tables
    elif "random" in case:
        cos, sin = torch.randn(1, s, r, generator=gen, dtype=torch.float64), torch.randn(
            1, s, r, generator=gen, dtype=torch.float64
        )
    else:
        p = torch.arange(s).expand(b, s) + torch.arange(b)[:, None] * 5  # (B, S), per batch
        cos, sin = hf_cos_sin(p, r, layout)
        if "2d" in case:
            cos, sin = cos[0], sin[0]
        elif "one" in case:
            cos, sin = cos[:1], sin[:1]
    cast = lambda t: t.to(dtype)  # noqa: E731
    return cast(q), cast(k), cast(cos), cast(sin), pos, layout


CASES = [
    "neox",
    "interleaved",
    "positions",
    "positions interleaved",
    "gqa",
    "partial",
    "partial interleaved gqa",
    "2d",
    "one",
    "random",
    "random interleaved partial",
    "positions gqa partial",
]


def _f64(t):
    return t.to(torch.float64) if isinstance(t, torch.Tensor) and t.is_floating_point() else t


# --------------------------------------------------------------------------- forward


@pytest.mark.parametrize("case", CASES)
def test_reference_is_hugging_faces_formula(case):
    q, k, cos, sin, pos, layout = make_case(case, torch.float64)
    got = rope_reference(q, k, cos, sin, pos, layout)
    want = hf_rope(q, k, cos, sin, pos, layout)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


def test_interleaved_is_not_neox():
    # (the two layouts must differ, or the layout tests above prove nothing)
    q, k, cos, sin, pos, _ = make_case("random")
    a = kernellab.rope(q, k, cos, sin, backend="manual")[0]
    b = kernellab.rope(q, k, cos, sin, layout="interleaved", backend="manual")[0]
    assert (a - b).abs().max() > 0.1


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("backend", FAST)
def test_forward_matches_hugging_face_fp32(backend, case):
    q, k, cos, sin, pos, layout = make_case(case, seed=seed_for(backend, case))
    want = hf_rope(*[_f64(t) for t in (q, k, cos, sin)], pos, layout)
    got = kernellab.rope(q, k, cos, sin, pos, layout=layout, backend=backend)
    for g, w in zip(got, want):
        assert g.dtype == torch.float32 and g.shape == w.shape and g.is_contiguous()
        torch.testing.assert_close(g.double(), w, rtol=1e-6, atol=2e-6)


@pytest.mark.parametrize("case", ["neox", "positions interleaved gqa partial"])
@pytest.mark.parametrize("backend", F64)
def test_reference_backends_in_float64_are_exact_to_rounding(backend, case):
    q, k, cos, sin, pos, layout = make_case(case, torch.float64)
    want = hf_rope(q, k, cos, sin, pos, layout)
    got = kernellab.rope(q, k, cos, sin, pos, layout=layout, backend=backend)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-15, atol=1e-15)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("backend", FAST)
def test_16bit_within_twice_hugging_faces_error(backend, dtype):
    # HF's own code in 16 bits (the torch backend) sets the bound, as the check does.
    q, k, cos, sin, pos, layout = make_case("positions partial", dtype, seed=3)
    want = hf_rope(*[_f64(t) for t in (q, k, cos, sin)], pos, layout)
    base = kernellab.rope(q, k, cos, sin, pos, layout=layout, backend="torch")
    got = kernellab.rope(q, k, cos, sin, pos, layout=layout, backend=backend)
    for g, b, w in zip(got, base, want):
        assert g.dtype == dtype
        err, bound = (g.double() - w).abs().max(), (b.double() - w).abs().max()
        assert err <= 2 * bound + 1e-3, (err, bound)


@pytest.mark.parametrize("backend", FAST)
def test_fp32_cos_with_bf16_q(backend):
    # an fp32 table is accepted with 16-bit q; the output keeps q's dtype
    q, k, cos, sin, pos, layout = make_case("positions", torch.float32, seed=4)
    qb, kb = q.bfloat16(), k.bfloat16()
    got = kernellab.rope(qb, kb, cos, sin, pos, backend=backend)
    want = hf_rope(_f64(qb), _f64(kb), _f64(cos), _f64(sin), pos)
    for g, w in zip(got, want):
        assert g.dtype == torch.bfloat16
        torch.testing.assert_close(g.double(), w, rtol=2**-6, atol=2**-6)


@pytest.mark.parametrize("backend", FAST)
def test_fused_qkv_views(backend):
    # q, k as HF models slice them out of one projection: (B, S, 3, H, D) -> (B, H, S, D)
    gen = torch.Generator().manual_seed(5)
    b, s, h, d = 2, 5, 3, 16
    qkv = torch.randn(b, s, 3, h, d, generator=gen, requires_grad=True)
    cos, sin = hf_cos_sin(torch.arange(s)[None], d)
    cos, sin = cos.float(), sin.float()
    q, k = qkv[:, :, 0].transpose(1, 2), qkv[:, :, 1].transpose(1, 2)
    assert not q.is_contiguous()
    before = qkv.detach().clone()
    qr, kr = kernellab.rope(q, k, cos, sin, backend=backend)
    assert torch.equal(qkv.detach(), before)
    want = hf_rope(_f64(q.detach()), _f64(k.detach()), _f64(cos), _f64(sin))
    torch.testing.assert_close(qr.double(), want[0], rtol=1e-6, atol=2e-6)
    torch.testing.assert_close(kr.double(), want[1], rtol=1e-6, atol=2e-6)
    dq, dk = torch.randn_like(qr), torch.randn_like(kr)
    (g,) = torch.autograd.grad((qr, kr), qkv, (dq, dk))
    q64 = _f64(qkv.detach()).requires_grad_()
    w = hf_rope(q64[:, :, 0].transpose(1, 2), q64[:, :, 1].transpose(1, 2), _f64(cos), _f64(sin))
    (gw,) = torch.autograd.grad(w, q64, (_f64(dq), _f64(dk)))
    torch.testing.assert_close(g.double(), gw, rtol=1e-6, atol=2e-6)
    assert torch.equal(g[:, :, 2], torch.zeros_like(g[:, :, 2]))  # v takes no gradient


# --------------------------------------------------------------------------- gradients


def _grads(fn, q, k, cos, sin, pos, layout, dq, dk):
    ql, kl = q.detach().clone().requires_grad_(), k.detach().clone().requires_grad_()
    out = fn(ql, kl, cos, sin, pos, layout)
    return torch.autograd.grad(out, (ql, kl), (dq, dk))


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("backend", FAST)
def test_gradients_match_hugging_face(backend, case):
    q, k, cos, sin, pos, layout = make_case(case, seed=seed_for("grad", backend, case))
    gen = torch.Generator().manual_seed(9)
    dq, dk = torch.randn(q.shape, generator=gen), torch.randn(k.shape, generator=gen)
    want = _grads(hf_rope, *[_f64(t) for t in (q, k, cos, sin)], pos, layout, _f64(dq), _f64(dk))
    impl = lambda q, k, c, s, p, lay: kernellab.rope(q, k, c, s, p, layout=lay, backend=backend)  # noqa: E731
    got = _grads(impl, q, k, cos, sin, pos, layout, dq, dk)
    for name, g, w in zip(("dq", "dk"), got, want):
        assert g.dtype == torch.float32, name
        torch.testing.assert_close(g.double(), w, rtol=1e-6, atol=2e-6, msg=name)


@pytest.mark.parametrize("backend", FAST)
def test_gradient_through_q_alone(backend):
    # k_rot unused: dk is zero (autograd hands the op no gradient for it)
    q, k, cos, sin, pos, layout = make_case("gqa partial")
    ql, kl = q.clone().requires_grad_(), k.clone().requires_grad_()
    qr, _ = kernellab.rope(ql, kl, cos, sin, backend=backend)
    qr.sum().backward()
    assert kl.grad is None or torch.equal(kl.grad, torch.zeros_like(k))
    q64, k64 = _f64(q), _f64(k)
    want = _grads(hf_rope, q64, k64, _f64(cos), _f64(sin), None, "neox", torch.ones_like(q64), 0 * k64)
    torch.testing.assert_close(ql.grad.double(), want[0], rtol=1e-6, atol=2e-6)


def test_gradients_of_the_compile_backend():
    q, k, cos, sin, pos, layout = make_case("positions interleaved gqa partial", seed=11)
    gen = torch.Generator().manual_seed(12)
    dq, dk = torch.randn(q.shape, generator=gen), torch.randn(k.shape, generator=gen)
    want = _grads(hf_rope, *[_f64(t) for t in (q, k, cos, sin)], pos, layout, _f64(dq), _f64(dk))
    impl = lambda q, k, c, s, p, lay: kernellab.rope(q, k, c, s, p, layout=lay, backend="compile")  # noqa: E731
    for g, w in zip(_grads(impl, q, k, cos, sin, pos, layout, dq, dk), want):
        torch.testing.assert_close(g.double(), w, rtol=1e-6, atol=2e-6)


def test_triton_backward_is_the_transposed_rotation():
    # with random cos / sin (halves unequal) the backward is not a rotation by -sin:
    # it must exchange sin's halves too; gradcheck-style against float64 autograd
    q, k, cos, sin, pos, layout = make_case("random interleaved partial", seed=13)
    for lay in ("neox", "interleaved"):
        dq, dk = torch.randn_like(q), torch.randn_like(k)
        want = _grads(hf_rope, *[_f64(t) for t in (q, k, cos, sin)], None, lay, _f64(dq), _f64(dk))
        impl = lambda q, k, c, s, p, la: kernellab.rope(q, k, c, s, p, layout=la, backend="triton")  # noqa: E731
        for g, w in zip(_grads(impl, q, k, cos, sin, None, lay, dq, dk), want):
            torch.testing.assert_close(g.double(), w, rtol=1e-6, atol=2e-6)


def test_triton_double_backward_is_refused():
    q, k, cos, sin, _, _ = make_case("neox")
    ql = q.clone().requires_grad_()
    qr, _ = kernellab.rope(ql, k, cos, sin, backend="triton")
    dy = torch.ones_like(qr, requires_grad=True)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(qr, ql, dy, create_graph=True)


# --------------------------------------------------------------------------- cos / sin, ids


@pytest.mark.parametrize("backend", FAST)
def test_cos_that_requires_grad_is_refused(backend):
    q, k, cos, sin, pos, _ = make_case("neox")
    c = cos.clone().requires_grad_()
    with pytest.raises(ValueError, match=r"\bcos\b.*requires grad"):
        kernellab.rope(q, k, c, sin, backend=backend)
    with pytest.raises(ValueError, match=r"\bsin\b.*requires grad"):
        kernellab.rope(q, k, cos, sin.clone().requires_grad_(), backend=backend)
    # detached, or under no_grad: accepted, and the same answer
    want = kernellab.rope(q, k, cos, sin, backend=backend)
    got = kernellab.rope(q, k, c.detach(), sin, backend=backend)
    with torch.no_grad():
        got2 = kernellab.rope(q, k, c, sin, backend=backend)
    for a, b, c2 in zip(want, got, got2):
        assert torch.equal(a, b) and torch.equal(a, c2)


@pytest.mark.parametrize("backend", FAST)
@pytest.mark.parametrize("bad", [-1, 21])
def test_position_ids_out_of_range(backend, bad):
    q, k, cos, sin, pos, _ = make_case("positions")  # tables of 21 rows
    pos = pos.clone()
    pos[1, 3] = bad
    with pytest.raises(ValueError, match=r"position_ids.*21 rows"):
        kernellab.rope(q, k, cos, sin, pos, backend=backend)


def test_triton_kernel_gives_nan_rows_for_bad_ids_without_reading_out_of_bounds():
    # Under torch.compile the range check is skipped: the kernel itself must never use a bad
    # id as an address (the table is a view in a larger buffer whose other rows are not cos)
    q, k, cos, sin, pos, _ = make_case("positions", seed=14)
    big = torch.full((cos.shape[0] + 8, cos.shape[1]), 1e6)
    big[4 : 4 + cos.shape[0]] = cos
    tcos = big[4 : 4 + cos.shape[0]]
    pos = pos.clone()
    pos[0, 2], pos[1, 5] = -3, cos.shape[0] + 2
    qo, ko = torch.empty_like(q), torch.empty_like(k)
    rope_triton_mod.launch(q, k, tcos, sin, pos, False, False, qo, ko, True)
    bad = torch.zeros(q.shape[0], q.shape[2], dtype=torch.bool)
    bad[0, 2] = bad[1, 5] = True
    for o, x in ((qo, q), (ko, k)):
        rows = o.transpose(1, 2)  # (B, S, H, D)
        assert rows[bad].isnan().all()
        ok_pos = torch.where(bad, 0, pos)
        want = hf_rope(_f64(x), _f64(x), _f64(cos), _f64(sin), ok_pos)[0].transpose(1, 2)
        torch.testing.assert_close(rows[~bad].double(), want[~bad], rtol=1e-6, atol=2e-6)


@pytest.mark.parametrize("backend", FAST)
def test_position_ids_of_one_row_and_int32(backend):
    q, k, cos, sin, pos, _ = make_case("positions", seed=15)
    one = pos[:1].to(torch.int32)
    got = kernellab.rope(q, k, cos, sin, one, backend=backend)
    want = hf_rope(_f64(q), _f64(k), _f64(cos), _f64(sin), one.long())
    for g, w in zip(got, want):
        torch.testing.assert_close(g.double(), w, rtol=1e-6, atol=2e-6)


# --------------------------------------------------------------------------- in place


@pytest.mark.parametrize("case", ["neox", "positions interleaved gqa partial"])
@pytest.mark.parametrize("backend", FAST + ["compile"])
def test_inplace_writes_q_and_k(backend, case):
    q, k, cos, sin, pos, layout = make_case(case, seed=16)
    want = kernellab.rope(q, k, cos, sin, pos, layout=layout, backend="manual")
    q2, k2 = q.clone(), k.clone()
    got = kernellab.rope(q2, k2, cos, sin, pos, layout=layout, inplace=True, backend=backend)
    assert got[0] is q2 and got[1] is k2
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=2e-6)


def test_inplace_on_a_transposed_view_writes_through_it():
    q, k, cos, sin, pos, layout = make_case("partial gqa", seed=17)
    want = kernellab.rope(q, k, cos, sin, backend="manual")
    qt = q.transpose(1, 2).contiguous()  # the projection's (B, S, H, D)
    kt = k.transpose(1, 2).contiguous()
    q_view, k_view = qt.transpose(1, 2), kt.transpose(1, 2)
    kernellab.rope(q_view, k_view, cos, sin, inplace=True, backend="triton")
    torch.testing.assert_close(qt.transpose(1, 2), want[0], rtol=1e-6, atol=2e-6)
    torch.testing.assert_close(kt.transpose(1, 2), want[1], rtol=1e-6, atol=2e-6)


@pytest.mark.parametrize("backend", FAST)
def test_inplace_refusals(backend):
    q, k, cos, sin, pos, layout = make_case("neox", seed=18)
    with pytest.raises(ValueError, match=r"\bq\b.*requires grad"):
        kernellab.rope(q.clone().requires_grad_(), k.clone(), cos, sin, inplace=True, backend=backend)
    qn = q.clone().requires_grad_() * 1.0  # not a leaf, still recorded by autograd: refused too
    with pytest.raises(ValueError, match=r"\bq\b.*requires grad"):
        kernellab.rope(qn, k.clone(), cos, sin, inplace=True, backend=backend)
    qkv = torch.randn(2, 7, 3, 4, 16)
    with pytest.raises(ValueError, match=r"\bk\b.*shares storage"):
        kernellab.rope(qkv[:, :, 0].transpose(1, 2), qkv[:, :, 1].transpose(1, 2), cos, sin, inplace=True,
                       backend=backend)  # fmt: skip
    with pytest.raises(ValueError, match=r"\bk\b.*overlap"):
        kernellab.rope(q.clone(), k[:, :1].expand(k.shape), cos, sin, inplace=True, backend=backend)
    # a flag that is not a bool is refused naming inplace, and q and k are left as they were
    for flag in ("False", 0, 1, None):
        q2, k2 = q.clone(), k.clone()
        with pytest.raises(TypeError, match="inplace must be a bool"):
            kernellab.rope(q2, k2, cos, sin, inplace=flag, backend=backend)
        assert torch.equal(q2, q) and torch.equal(k2, k)
    # under no_grad a leaf that requires grad may be rotated in place (an explicit choice)
    ql = q.clone().requires_grad_()
    with torch.no_grad():
        kernellab.rope(ql, k.clone(), cos, sin, inplace=True, backend=backend)
    torch.testing.assert_close(ql.detach(), kernellab.rope(q, k, cos, sin, backend="manual")[0])


def test_may_self_overlap():
    x = torch.randn(2, 3, 4, 8)
    assert not may_self_overlap(x)
    assert not may_self_overlap(x.transpose(1, 2))
    assert not may_self_overlap(torch.randn(2, 5, 3, 4, 8)[:, :, 0].transpose(1, 2))
    assert may_self_overlap(x[:, :1].expand(2, 3, 4, 8))
    assert may_self_overlap(torch.randn(64).as_strided((4, 8), (4, 1)))  # rows overlap by half
    assert not may_self_overlap(torch.randn(0, 3))


# --------------------------------------------------------------------------- bad inputs


@pytest.mark.parametrize("case", SPEC.extra_bad_inputs, ids=lambda c: c.name)
@pytest.mark.parametrize("backend", FAST)
def test_bad_inputs_name_the_argument(backend, case):
    args, kwargs = case.build("cpu", torch.float32)
    with pytest.raises(case.exc, match=rf"(?<![A-Za-z0-9_]){case.arg}(?![A-Za-z0-9_])"):
        kernellab.rope(*args, **kwargs, backend=backend)


@pytest.mark.parametrize("i,name", [(0, "q"), (1, "k"), (2, "cos"), (3, "sin")])
@pytest.mark.parametrize("backend", FAST)
def test_sparse_inputs_are_refused(backend, i, name):
    args = list(make_case("neox")[:4])
    args[i] = args[i].to_sparse()
    with pytest.raises(TypeError, match=rf"\b{name} has layout torch.sparse_coo"):
        kernellab.rope(*args, backend=backend)


def test_bad_inputs_through_the_default_backend():
    args, _ = SPEC.extra_bad_inputs[0].build("cpu", torch.float32)
    with pytest.raises(ValueError, match=r"\bk\b has head dim 6"):
        kernellab.rope(*args)
    q, k, cos, sin, _, _ = make_case("neox")
    with pytest.raises(ValueError, match=r"\bcos\b.*rotary dim 15"):
        kernellab.rope(q, k, cos[..., :15], sin[..., :15])


# --------------------------------------------------------------------------- compile, check


def test_triton_under_torch_compile_fullgraph():
    q, k, cos, sin, pos, layout = make_case("positions interleaved gqa partial", seed=19)

    def fn(q, k):
        qr, kr = kernellab.rope(q, k, cos, sin, pos, layout=layout, backend="triton")
        return torch.cat((qr.flatten(), kr.flatten()))

    def ref(q, k):
        qr, kr = kernellab.rope(q, k, cos, sin, pos, layout=layout, backend="manual")
        return torch.cat((qr.flatten(), kr.flatten()))

    compile_grads_match(fn, ref, (q, k))


@pytest.mark.parametrize("backend", ["manual", "triton"])
def test_inplace_under_torch_compile_fullgraph(backend):
    """inplace=True traces whole (the shared-storage check once read storage pointers,
    which Dynamo cannot trace: fullgraph failed), writes what eager writes, and still
    refuses q and k taken from one qkv buffer."""
    q, k, cos, sin, pos, layout = make_case("positions interleaved gqa partial", seed=20)

    def fn(q, k):
        q, k = q * 2, k * 3  # intermediates, as a model's projections are
        kernellab.rope(q, k, cos, sin, pos, layout=layout, inplace=True, backend=backend)
        return q, k

    def shared(qkv):
        return kernellab.rope(qkv[:, :, 0].transpose(1, 2), qkv[:, :, 1].transpose(1, 2), cos, sin, pos,
                              layout=layout, inplace=True, backend=backend)  # fmt: skip

    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(fn, backend="aot_eager", fullgraph=True)(q, k)
        want = fn(q, k)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=0, atol=0)
        with pytest.raises(ValueError, match=r"\bk\b.*shares storage"):
            b, hk, t, d = k.shape
            torch.compile(shared, backend="aot_eager")(torch.randn(b, t, 3, hk, d))


def test_opcheck_of_the_triton_custom_ops():
    fn = registry.get(OP, "triton").fn
    shape = (1, 2, 1, 3, 8, 8)

    def make(rg):
        return torch.randn(shape[:4]).requires_grad_(bool(rg))

    def args(rg):  # (the spec's inputs; q and k take gradients)
        a = SPEC.make_inputs(shape, torch.float32, "cpu", 9)
        return (a[0].requires_grad_(bool(rg)), a[1].requires_grad_(bool(rg))) + a[2:]

    make.args = args
    assert len(fn.custom_ops) == 2
    for op, build, _ in fn.custom_ops:
        torch.library.opcheck(op, build(make))
    # with position ids, interleaved, partial rotary, GQA and strided q
    q, k, cos, sin, pos, _ = make_case("positions gqa partial", seed=20)
    fwd, bwd = fn.ops
    qs = q.transpose(1, 2).contiguous().transpose(1, 2).requires_grad_()
    torch.library.opcheck(fwd, (qs, k.requires_grad_(), cos, sin, pos, True))
    torch.library.opcheck(bwd, (torch.randn_like(q), torch.randn_like(k), cos, sin, pos, True))


def test_default_backend_runs():
    q, k, cos, sin, pos, layout = make_case("gqa")
    got = kernellab.rope(q, k, cos, sin)
    want = hf_rope(_f64(q), _f64(k), _f64(cos), _f64(sin))
    for g, w in zip(got, want):
        torch.testing.assert_close(g.double(), w, rtol=1e-6, atol=2e-6)


@pytest.mark.parametrize(
    "backend,dtype", [("manual", torch.float32), ("torch", torch.float32), ("triton", torch.bfloat16)]
)
def test_check_engine_passes(backend, dtype):
    rep = check_impl(registry.get(OP, backend), dtype, device="cpu", quick=True, seed=23)
    assert rep.status == PASS, [(c.kind, c.name, c.detail) for c in rep.failures]
    kinds = {c.kind for c in rep.cases if c.status == PASS}
    assert {"shape", "rerun", "special", "layout", "option", "boundary", "grad", "bad"} <= kinds


def _wrong_dk(q, k, cos, sin, position_ids=None, *, layout="neox", inplace=False):
    # right forward, but k's gradient is the forward rotation (sin not negated)
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, k):
            return rope_reference(k, k, cos, sin, position_ids, layout)[0]

        @staticmethod
        def backward(ctx, g):
            return rope_reference(g, g, cos, sin, position_ids, layout)[0]

    qr = rope_reference(q, q, cos, sin, position_ids, layout)[0]
    return qr, F.apply(k)


def _ignores_position_ids(q, k, cos, sin, position_ids=None, *, layout="neox", inplace=False):
    if position_ids is not None:
        cos, sin = cos[: q.shape[2]], sin[: q.shape[2]]
    return rope_reference(q, k, cos, sin, None, layout)


def _first_half_of_cos(q, k, cos, sin, position_ids=None, *, layout="neox", inplace=False):
    # reads cos / sin's first half for both halves: right only for HF's duplicated tables
    h = cos.shape[-1] // 2
    cos = torch.cat((cos[..., :h], cos[..., :h]), -1)
    sin = torch.cat((sin[..., :h], sin[..., :h]), -1)
    return rope_reference(q, k, cos, sin, position_ids, layout)


def _drops_pass_through(q, k, cos, sin, position_ids=None, *, layout="neox", inplace=False):
    qr, kr = rope_reference(q, k, cos, sin, position_ids, layout)
    r = cos.shape[-1]
    return torch.cat((qr[..., :r], 0 * qr[..., r:]), -1), kr


@pytest.mark.parametrize(
    "fn", [_wrong_dk, _ignores_position_ids, _first_half_of_cos, _drops_pass_through],
    ids=["dk with +sin", "ignores position_ids", "half of cos", "zero pass-through"],
)  # fmt: skip
def test_planted_wrong_implementations_fail_the_check(fn):
    rep = check_planted(OP, fn.__name__.strip("_"), fn, seed=29)
    assert rep.status == FAIL


def test_triton_output_keeps_a_transposed_projections_memory_order():
    # A model's q is a (B, H, S, D) view of its (B, S, H, D) projection. The rotated q keeps
    # that memory order, so SDPA's output (laid out as q) transposes back to (B, S, H * D)
    # as a view; a contiguous q there cost a copy of every layer's attention output.
    q, k, cos, sin, pos, layout = make_case("neox", seed=19)
    q_view = q.transpose(1, 2).contiguous().transpose(1, 2)
    k_view = k.transpose(1, 2).contiguous().transpose(1, 2)
    qr, kr = kernellab.rope(q_view, k_view, cos, sin, backend="triton")
    assert qr.stride() == q_view.stride() and kr.stride() == k_view.stride()
    want = kernellab.rope(q, k, cos, sin, backend="manual")
    torch.testing.assert_close(qr, want[0], rtol=1e-6, atol=2e-6)
    torch.testing.assert_close(kr, want[1], rtol=1e-6, atol=2e-6)
    qc, _ = kernellab.rope(q.contiguous(), k.contiguous(), cos, sin, backend="triton")
    assert qc.is_contiguous()
