"""kernellab.patch / unpatch and the drop-in modules, on the CPU: tiny models from configs
(no downloaded weights), fp32; loss, logits and every parameter's gradient against the
untouched model."""

from __future__ import annotations

import copy
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import kernellab
import kernellab.nn.functional as KF
from kernellab.patch import RULES, HFRMSNorm

RTOL, ATOL = 1e-5, 1e-5


def _close(a, b, what):
    torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL, msg=lambda m: f"{what}: {m}")


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _assert_same_step(ref, pat, run):
    ref.zero_grad(set_to_none=True)
    pat.zero_grad(set_to_none=True)
    out_r, loss_r = run(ref)
    out_p, loss_p = run(pat)
    loss_r.backward()
    loss_p.backward()
    _close(loss_p, loss_r, "loss")
    _close(out_p, out_r, "logits")
    gr, gp = _grads(ref), _grads(pat)
    assert gr.keys() == gp.keys() and gr
    for n in gr:
        _close(gp[n], gr[n], f"grad of {n}")


# ----------------------------------------------------------------------------- functional


def test_functional_layer_norm_matches_torch_signature():
    x = torch.randn(3, 5, 4, 8, dtype=torch.float64)
    w, b = torch.randn(4, 8, dtype=torch.float64), torch.randn(4, 8, dtype=torch.float64)
    _close(KF.layer_norm(x, (4, 8), w, b, 1e-3), F.layer_norm(x, (4, 8), w, b, 1e-3), "2 dims")
    _close(KF.layer_norm(x, 8), F.layer_norm(x, (8,)), "no weight")
    with pytest.raises(ValueError, match="normalized_shape"):
        KF.layer_norm(x, (7,))


def test_functional_rms_norm_default_eps():
    x = torch.randn(4, 16)
    w = torch.randn(16)
    _close(KF.rms_norm(x, (16,), w), F.rms_norm(x, (16,), w), "eps=None")


def test_functional_cross_entropy_layouts():
    torch.manual_seed(0)
    logits, t = torch.randn(2, 5, 11, dtype=torch.float64), torch.randint(0, 11, (2, 5))
    t[0, 1] = -100
    flat = F.cross_entropy(logits.view(-1, 11), t.view(-1), reduction="none").view(2, 5)
    _close(KF.cross_entropy(logits, t, reduction="none"), flat, "(B, T, V) class last")
    _close(KF.cross_entropy(logits, t), F.cross_entropy(logits.view(-1, 11), t.view(-1)), "mean")
    t2 = torch.randint(0, 5, (2, 11))  # class dim 1, as PyTorch reads (N, C, d1)
    want = F.cross_entropy(logits, t2, reduction="sum")
    _close(KF.cross_entropy(logits, t2, reduction="sum"), want, "dim 1")
    _close(KF.cross_entropy(logits.view(-1, 11), t.view(-1), label_smoothing=0.1),
           F.cross_entropy(logits.view(-1, 11), t.view(-1), label_smoothing=0.1), "label smoothing")
    with pytest.raises(ValueError, match="target"):
        KF.cross_entropy(logits, torch.zeros(3, 3, dtype=torch.long))


def test_functional_sdpa_causal_gqa_and_mask():
    q, k, v = torch.randn(2, 4, 6, 8), torch.randn(2, 2, 6, 8), torch.randn(2, 2, 6, 8)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    _close(KF.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True), ref, "gqa causal")
    assert not KF.sdpa_supported(q, k, v, is_causal=True)  # GQA without enable_gqa: PyTorch's error
    mask = torch.rand(6, 6) > 0.3
    kk, vv = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    want = F.scaled_dot_product_attention(q, kk, vv, mask)
    _close(KF.scaled_dot_product_attention(q, kk, vv, mask), want, "mask")


def test_functional_bad_arguments_are_refused_naming_them():
    # as PyTorch refuses them, each naming the argument (a flattened or transposed weight
    # of a (3, 2) norm would pass the op's own (6,) check and be applied in another order)
    x = torch.randn(4, 3, 2)
    for w in (torch.randn(2, 3), torch.randn(6)):
        with pytest.raises(ValueError, match="weight of shape"):
            KF.layer_norm(x, (3, 2), w)
        with pytest.raises(ValueError, match="weight of shape"):
            KF.rms_norm(x, (3, 2), w)
    with pytest.raises(ValueError, match="bias of shape"):
        KF.layer_norm(x, (3, 2), torch.ones(3, 2), torch.zeros(6))
    _close(KF.layer_norm(x, (3, 2)), F.layer_norm(x, (3, 2)), "2 dims, no weight")
    with pytest.raises(TypeError, match="input must be a floating-point"):
        KF.rms_norm(torch.ones(2, 3, dtype=torch.int64), (3,))
    with pytest.raises(ValueError, match="target of shape"):
        KF.cross_entropy(torch.randn(5), torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="input must have at least one dim"):
        KF.cross_entropy(torch.tensor(1.0), torch.tensor(0))
    with pytest.raises(TypeError, match="target must be a torch.Tensor"):
        KF.cross_entropy(torch.randn(2, 5), [1, 2])
    # a scale kernellab.attention refuses (not positive and finite) runs PyTorch's SDPA
    q = torch.randn(1, 2, 4, 8)
    for scale in (0.0, -0.5):
        assert not KF.sdpa_supported(q, q, q, scale=scale)
        _close(KF.scaled_dot_product_attention(q, q, q, scale=scale),
               F.scaled_dot_product_attention(q, q, q, scale=scale), f"scale {scale}")  # fmt: skip


def test_patch_refuses_unknown_backends_and_a_str_of_ops_at_patch_time():
    m = nn.Sequential(nn.LayerNorm(8))
    with pytest.raises(ValueError, match="backend: layer_norm has no backend 'nope'"):
        kernellab.patch(m, backend={"layer_norm": "nope"}, verbose=False)
    with pytest.raises(ValueError, match="backend: unknown op 'layernorm'"):
        kernellab.patch(m, backend={"layernorm": "triton"}, verbose=False)
    with pytest.raises(ValueError, match="no op patched has a backend 'nope'"):
        kernellab.patch(m, backend="nope", verbose=False)
    with pytest.raises(TypeError, match="ops must be a list or tuple"):
        kernellab.patch(m, ops="layer_norm", verbose=False)
    assert "_kernellab_patch" not in m.__dict__  # nothing was patched
    kernellab.patch(m, backend={"layer_norm": "manual", "gelu": None}, verbose=False)
    kernellab.unpatch(m)


def test_dropin_modules_keep_torch_state():
    ln = kernellab.nn.LayerNorm(8, eps=1e-4)
    assert isinstance(ln, nn.LayerNorm) and list(ln.state_dict()) == ["weight", "bias"]
    x = torch.randn(3, 8)
    _close(ln(x), F.layer_norm(x, (8,), ln.weight, ln.bias, 1e-4), "LayerNorm")
    _close(kernellab.nn.GELU("tanh")(x), F.gelu(x, approximate="tanh"), "GELU tanh")
    _close(kernellab.nn.GELU()(x), F.gelu(x), "GELU exact")
    t = torch.randint(0, 8, (3,))
    _close(kernellab.nn.CrossEntropyLoss(reduction="sum")(x, t), F.cross_entropy(x, t, reduction="sum"), "CE")
    if hasattr(nn, "RMSNorm"):
        _close(kernellab.nn.RMSNorm(8)(x), nn.RMSNorm(8)(x), "RMSNorm")


# ----------------------------------------------------------------------------- plain module


class _Block(nn.Module):
    """nanoGPT-style: LayerNorm, causal SDPA, tanh GeLU MLP, CrossEntropyLoss (and an
    RMSNorm, an exact GeLU)."""

    def __init__(self, d=32, h=4, vocab=64):
        super().__init__()
        self.h = h
        self.emb = nn.Embedding(vocab, d)
        self.ln1, self.ln2, self.ln_f = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d))
        self.act_exact = nn.GELU()
        self.rms = nn.RMSNorm(d, eps=1e-5) if hasattr(nn, "RMSNorm") else nn.Identity()
        self.head = nn.Linear(d, vocab)
        self.loss = nn.CrossEntropyLoss()

    def forward(self, idx, targets):
        x = self.emb(idx)
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        x = x + self.mlp(self.ln2(x)) + 0.1 * self.act_exact(x)
        logits = self.head(self.ln_f(self.rms(x)))
        return logits, self.loss(logits.view(-1, logits.shape[-1]), targets.view(-1))


def test_patch_plain_module_matches_and_unpatch_restores():
    torch.manual_seed(0)
    ref = _Block()
    pat = copy.deepcopy(ref)
    params_before = list(pat.parameters())
    idx, tgt = torch.randint(0, 64, (2, 12)), torch.randint(0, 64, (2, 12))
    report = kernellab.patch(pat, verbose=False)
    want = {"layer_norm": 3, "gelu": 1, "cross_entropy": 1, "attention": 1}
    if hasattr(nn, "RMSNorm"):
        want["rms_norm"] = 1
    assert report.counts() == want, report
    assert sorted(report.paths("layer_norm")) == ["ln1", "ln2", "ln_f"]
    assert any(p == "act_exact" and "tanh only" in why for _, p, why in report.left)
    assert list(pat.parameters()) == params_before and type(pat.ln1) is kernellab.nn.LayerNorm
    assert "layer_norm x3" in str(report)
    _assert_same_step(ref, pat, lambda m: m(idx, tgt))
    assert report.attention_calls == {"kernellab": 1}
    kernellab.unpatch(pat)
    assert type(pat.ln1) is nn.LayerNorm and "forward" not in pat.__dict__ and not hasattr(pat.ln1, "backend")
    _assert_same_step(ref, pat, lambda m: m(idx, tgt))
    with pytest.raises(ValueError, match="not patched"):
        kernellab.unpatch(pat)


def test_patch_rejects_bad_arguments():
    m = _Block()
    with pytest.raises(ValueError, match="ops"):
        kernellab.patch(m, ops=["nope"], verbose=False)
    with pytest.raises(ValueError, match="on_unsupported"):
        kernellab.patch(m, on_unsupported="maybe", verbose=False)
    with pytest.raises(TypeError, match="model"):
        kernellab.patch(object(), verbose=False)
    kernellab.patch(m, verbose=False)
    with pytest.raises(ValueError, match="already patched"):
        kernellab.patch(m, verbose=False)


def test_deepcopy_of_a_patched_module_is_patched_on_its_own():
    # the copy runs its own weights (not the original's forward) and unpatch(copy)
    # restores the copy, leaving the original patched
    torch.manual_seed(0)
    pat = _Block()
    kernellab.patch(pat, verbose=False)
    cp = copy.deepcopy(pat)
    with torch.no_grad():
        cp.qkv.weight.mul_(2.0)
    idx, tgt = torch.randint(0, 64, (2, 6)), torch.randint(0, 64, (2, 6))
    cp.zero_grad(set_to_none=True)
    pat.zero_grad(set_to_none=True)
    _close(cp(idx, tgt)[1], _Block.forward(cp, idx, tgt)[1], "the copy's loss")
    cp(idx, tgt)[1].backward()
    assert cp.qkv.weight.grad is not None and pat.qkv.weight.grad is None
    kernellab.unpatch(cp)
    assert type(cp.ln1) is nn.LayerNorm and "forward" not in cp.__dict__
    assert type(pat.ln1) is kernellab.nn.LayerNorm and "forward" in pat.__dict__
    kernellab.unpatch(pat)
    assert type(pat.ln1) is nn.LayerNorm and "forward" not in pat.__dict__


def test_pickle_of_a_patched_module_loads_patched():
    # a patched forward is data, not a method of a closure: pickled, a bound method came
    # back as the class's forward (the SDPA patch silently gone)
    import pickle

    torch.manual_seed(0)
    ref = _Block()
    pat = copy.deepcopy(ref)
    kernellab.patch(pat, verbose=False)
    loaded = pickle.loads(pickle.dumps(pat))
    assert type(loaded.ln1) is kernellab.nn.LayerNorm
    report = loaded._kernellab_patch.report
    before = report.attention_calls["kernellab"]
    idx, tgt = torch.randint(0, 64, (2, 6)), torch.randint(0, 64, (2, 6))
    _assert_same_step(ref, loaded, lambda m: m(idx, tgt))
    assert report.attention_calls["kernellab"] == before + 1
    assert pat._kernellab_patch.report.attention_calls["kernellab"] == 0  # (the loaded copy's own report)
    kernellab.unpatch(loaded)
    assert type(loaded.ln1) is nn.LayerNorm and "forward" not in loaded.__dict__
    assert type(pat.ln1) is kernellab.nn.LayerNorm


def test_patch_plain_sdpa_with_mask_falls_back_or_raises():
    class M(nn.Module):
        def forward(self, q, k, v, mask):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    q = torch.randn(1, 2, 5, 8)
    mask = torch.rand(5, 5) > 0.5
    m = M()
    rep = kernellab.patch(m, verbose=False)
    _close(m(q, q, q, mask), F.scaled_dot_product_attention(q, q, q, attn_mask=mask), "fallback")
    assert rep.attention_calls == {"fallback": 1}
    kernellab.unpatch(m)
    kernellab.patch(m, verbose=False, on_unsupported="raise")
    with pytest.raises(ValueError, match="exactly"):
        m(q, q, q, mask)


# ----------------------------------------------------------------------------- Hugging Face

transformers = pytest.importorskip("transformers")


def _cfg(family, **extra):
    # initializer_range 0.2: scores of order 1, so that a softcap or a window changes the result.
    common = dict(vocab_size=256, num_hidden_layers=2, attn_implementation="sdpa", initializer_range=0.2)
    llama_like = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2)
    if family == "gpt2":
        return transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=256, resid_pdrop=0.0,
                                       embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation="sdpa",
                                       initializer_range=0.2, **extra)
    if family == "llama":
        return transformers.LlamaConfig(**common, **llama_like, **extra)
    if family == "qwen2":
        return transformers.Qwen2Config(**common, **llama_like, **extra)
    if family == "qwen3":
        return transformers.Qwen3Config(**common, **llama_like, head_dim=16, **extra)
    if family == "mistral":
        return transformers.MistralConfig(**common, **llama_like, sliding_window=5, **extra)
    if family == "gemma2":  # eager: transformers' SDPA path drops the softcap
        common["attn_implementation"] = "eager"
        return transformers.Gemma2Config(**common, **llama_like, head_dim=16, sliding_window=5,
                                         attn_logit_softcapping=2.0, final_logit_softcapping=3.0,
                                         query_pre_attn_scalar=16, **extra)
    raise AssertionError(family)


_EXPECTED_NORM = {"gpt2": "layer_norm", "llama": "rms_norm", "qwen2": "rms_norm", "qwen3": "rms_norm",
                  "mistral": "rms_norm", "gemma2": "rms_norm"}
# norms per model of 2 layers: GPT-2 ln_1, ln_2 x2 + ln_f; Llama-likes 2 x2 + norm;
# Qwen3 adds q_norm, k_norm per layer; Gemma-2 four per layer.
_NORMS = {"gpt2": 5, "llama": 5, "qwen2": 5, "qwen3": 9, "mistral": 5, "gemma2": 9}


def _tiny(family, **extra):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(_cfg(family, **extra)).float()
    with torch.no_grad():  # Gemma's zero-initialized (1 + w) norms would hide the offset
        for n, p in model.named_parameters():
            if "norm" in n or "ln" in n:
                p.add_(0.1 * torch.randn_like(p))
    return model


def _hf_run(ids, mask=None):
    labels = ids.clone()
    labels[0, :2] = -100
    return lambda m: (lambda o: (o.logits, o.loss))(m(input_ids=ids, attention_mask=mask, labels=labels))


@pytest.mark.parametrize("family", ["gpt2", "llama", "qwen2", "qwen3", "mistral", "gemma2"])
def test_patch_hf_family_matches_and_unpatch_restores(family):
    ref = _tiny(family)
    pat = copy.deepcopy(ref)
    ids = torch.randint(0, 256, (2, 11))  # > sliding_window 5: the window matters
    report = kernellab.patch(pat, verbose=False)
    counts = report.counts()
    assert counts[_EXPECTED_NORM[family]] == _NORMS[family], report
    assert counts["attention"] == 2 and counts["cross_entropy"] == 1, report
    if family == "gpt2":
        assert counts["gelu"] == 2
    else:
        assert counts["rope"] == 1, report
    assert pat.config._attn_implementation == "kernellab"
    _assert_same_step(ref, pat, _hf_run(ids))
    assert report.attention_calls == {"kernellab": 2} and not report.attention_fallbacks, report
    state = {k: v.clone() for k, v in pat.state_dict().items()}
    kernellab.unpatch(pat)
    assert pat.config._attn_implementation == ref.config._attn_implementation
    assert [type(m) for m in pat.modules()] == [type(m) for m in ref.modules()]
    assert pat.state_dict().keys() == state.keys()
    for k, v in pat.state_dict().items():
        assert torch.equal(v, state[k]) and torch.equal(v, ref.state_dict()[k]), k
    pat.zero_grad(set_to_none=True)
    ref.zero_grad(set_to_none=True)
    run = _hf_run(ids)
    (lr, ll), (pr, pl) = run(ref), run(pat)
    ll.backward()
    pl.backward()
    assert torch.equal(pr, lr) and torch.equal(pl, ll)
    for (n, a), (_, b) in zip(ref.named_parameters(), pat.named_parameters()):
        assert torch.equal(a.grad, b.grad), n


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_patch_hf_padding_mask_falls_back_or_raises(family):
    ref = _tiny(family)
    pat = copy.deepcopy(ref)
    ids = torch.randint(0, 256, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :3] = 0  # left padding
    report = kernellab.patch(pat, verbose=False)
    _assert_same_step(ref, pat, _hf_run(ids, mask))
    assert report.attention_calls == {"fallback": 2}
    assert list(report.attention_fallbacks) == ["attention mask (padding or custom) given"]
    kernellab.unpatch(pat)
    kernellab.patch(pat, verbose=False, on_unsupported="raise")
    with pytest.raises(ValueError, match="padding"):
        pat(input_ids=ids, attention_mask=mask)


def test_patch_hf_dropout_in_training_falls_back():
    ref = _tiny("llama", attention_dropout=0.5)
    pat = copy.deepcopy(ref)
    report = kernellab.patch(pat, verbose=False)
    pat.train()
    pat(input_ids=torch.randint(0, 256, (1, 6)))
    assert report.attention_fallbacks == {"attention dropout > 0 in training": 2}
    pat.eval()
    ref.eval()
    _assert_same_step(ref, pat, _hf_run(torch.randint(0, 256, (1, 6))))


@pytest.mark.parametrize("family", ["mistral", "gemma2"])
def test_patch_hf_dropout_fallback_keeps_window_and_softcap(family):
    # The plain causal window mask is not materialized for kernellab; the fallback must
    # rebuild it (and keep the softcap): the same dropout draws give the same step.
    ref = _tiny(family, attention_dropout=0.3)
    pat = copy.deepcopy(ref)
    report = kernellab.patch(pat, verbose=False)
    ids = torch.randint(0, 256, (2, 11))
    run = _hf_run(ids)
    _assert_same_step(ref, pat, lambda m: (torch.manual_seed(1), run(m))[1])
    assert report.attention_fallbacks == {"attention dropout > 0 in training": 2}


@pytest.mark.parametrize("family", ["llama", "mistral"])
def test_patch_hf_generate_with_cache(family):
    # Prefill (S_q == S_k) and one-token decode steps past the sliding window of 5.
    ref = _tiny(family).eval()
    pat = copy.deepcopy(ref)
    report = kernellab.patch(pat, verbose=False)
    ids = torch.randint(0, 256, (1, 4))
    kw = dict(max_new_tokens=6, do_sample=False, output_scores=True, return_dict_in_generate=True)
    with torch.no_grad():
        r, p = ref.generate(ids, **kw), pat.generate(ids, **kw)
    assert torch.equal(r.sequences, p.sequences)
    for a, b in zip(r.scores, p.scores):
        _close(b, a, "scores")
    assert report.attention_calls == {"kernellab": 2 * 6}, report  # 2 layers x (prefill + 5 steps)


def test_patch_hf_triton_backend():
    ref = _tiny("llama")
    pat = copy.deepcopy(ref)
    ops = ["rms_norm", "attention", "cross_entropy"]
    report = kernellab.patch(pat, ops=ops, backend="triton", verbose=False)
    assert report.counts() == {"rms_norm": 5, "attention": 2, "cross_entropy": 1}
    norms = [m for m in pat.modules() if isinstance(m, HFRMSNorm)]
    assert len(norms) == 5 and all(m.backend == "triton" for m in norms)
    attn = [m for m in pat.modules() if hasattr(m, "q_proj")]
    assert len(attn) == 2 and all(m._kernellab_attention.backend == "triton" for m in attn)
    _assert_same_step(ref, pat, _hf_run(torch.randint(0, 256, (1, 8))))


def test_hf_rms_norm_mixed_dtypes_follow_the_original():
    ref = _tiny("llama")
    norm = ref.model.norm
    new = HFRMSNorm(norm, norm.variance_epsilon)
    x = torch.randn(2, 3, 64, dtype=torch.float64)
    _close(new(x), norm(x), "fp32 weight, fp64 input")
    assert new(x).dtype == norm(x).dtype == torch.float64
    assert list(new.state_dict()) == ["weight"]


def _rule_ops():
    return [r.op for r in RULES]


@pytest.mark.parametrize("op,family", [("swiglu", "llama"), ("geglu", "gemma2")])
def test_patch_gated_mlp_when_op_exists(op, family):
    if not hasattr(kernellab, op):
        pytest.skip(f"kernellab.{op} not in this build")
    assert op in _rule_ops()
    ref = _tiny(family)
    pat = copy.deepcopy(ref)
    report = kernellab.patch(pat, verbose=False)
    assert report.counts()[op] == 2
    _assert_same_step(ref, pat, _hf_run(torch.randint(0, 256, (2, 7))))
    kernellab.unpatch(pat)
    assert all("forward" not in m.__dict__ for m in pat.modules())


@pytest.mark.parametrize("op,family", [("swiglu", "llama"), ("geglu", "gemma2")])
def test_patch_gated_mlp_triton_backward_in_place(op, family, monkeypatch):
    """The patched MLP owns its gate and up projections: with the Triton backend their
    buffers take the gradients (inplace_backward=True; a new version on each shows the
    write), and the step still matches the unpatched model."""
    if not hasattr(kernellab, op):
        pytest.skip(f"kernellab.{op} not in this build")
    from kernellab.core import registry

    real, seen = registry.call, []

    def recording(name, backend, *args, **kwargs):
        if name == op and torch.is_grad_enabled():  # (the backward's remake runs without)
            seen.append((args[0], args[1], kwargs.get("inplace_backward")))
        return real(name, backend, *args, **kwargs)

    monkeypatch.setattr(registry, "call", recording)
    ref = _tiny(family)
    pat = copy.deepcopy(ref)
    report = kernellab.patch(pat, ops=[op], backend="triton", verbose=False)
    assert report.counts() == {op: 2}
    _assert_same_step(ref, pat, _hf_run(torch.randint(0, 256, (2, 7))))
    assert len(seen) == 2 and all(flag is True for _, _, flag in seen)
    assert all(a._version > 0 and b._version > 0 for a, b, _ in seen)


def test_patch_fused_gate_up_mlp_runs_swiglu_on_its_halves():
    """Phi-3's MLP projects gate and up in one gate_up_proj and chunks it: patched, swiglu
    runs on the two halves (a class whose forward is checked once against the formula),
    with the Triton backend writing the gradients into them; an MLP of that shape computing
    something else is left."""
    if not hasattr(kernellab, "swiglu"):
        pytest.skip("kernellab.swiglu not in this build")
    ref = _tiny_of("phi3")
    pat = copy.deepcopy(ref)
    report = kernellab.patch(pat, ops=["swiglu"], backend="triton", verbose=False)
    assert report.counts() == {"swiglu": 2}, report
    _assert_same_step(ref, pat, _hf_run(torch.randint(1, 256, (2, 7))))

    class UpActivated(nn.Module):  # act on the up half: not swiglu(gate, up)
        def __init__(self):
            super().__init__()
            self.gate_up_proj, self.down_proj = nn.Linear(16, 64, bias=False), nn.Linear(32, 16, bias=False)
            self.activation_fn = nn.SiLU()

        def forward(self, x):
            g, u = self.gate_up_proj(x).chunk(2, dim=-1)
            return self.down_proj(g * self.activation_fn(u))

    plain = nn.Sequential(UpActivated())
    assert "swiglu" not in kernellab.patch(plain, verbose=False).counts()


def test_patch_gated_mlp_runs_each_mlp_before_replacing_it():
    # Gemma-3n's first layers keep only the top 5% of the gate's activations, behind the same
    # gate_proj / up_proj / down_proj names: replaced by geglu, its logits were off by 3.3.
    # Each MLP is now run once against the formula; that layer keeps its own forward.
    if not hasattr(kernellab, "geglu"):
        pytest.skip("kernellab.geglu not in this build")
    ref = _tiny_of(
        "gemma3n_text", head_dim=16, hidden_size_per_layer_input=16, vocab_size_per_layer_input=256,
        laurel_rank=8, altup_num_inputs=2, num_kv_shared_layers=0, sliding_window=4,
        activation_sparsity_pattern=[0.95, 0.0], layer_types=["sliding_attention", "full_attention"],
    )
    pat = copy.deepcopy(ref)
    report = kernellab.patch(pat, verbose=False)
    assert report.counts()["geglu"] == 1, report
    _assert_same_step(ref, pat, _hf_run(torch.randint(1, 256, (2, 11))))


def test_patch_reports_ops_missing_from_build():
    m = _tiny("llama")
    report = kernellab.patch(m, verbose=False)
    for op in ("swiglu", "rope", "add_rms_norm"):
        if not hasattr(kernellab, op):
            assert (op, "", f"kernellab.{op} not in this build") in report.left
    if not hasattr(kernellab, "linear_cross_entropy"):
        kernellab.unpatch(m)
        with pytest.raises(ValueError, match="linear_cross_entropy"):
            kernellab.patch(m, fused_linear_cross_entropy=True, verbose=False)


@pytest.mark.parametrize("family", ["gpt2", "llama", "qwen2"])
def test_patch_hf_fused_linear_cross_entropy(family):
    """fused_linear_cross_entropy=True: with labels, the loss and every gradient of the
    untouched model, the logits not returned; without labels, the model's own logits."""
    if not hasattr(kernellab, "linear_cross_entropy"):
        pytest.skip("kernellab.linear_cross_entropy not in this build")
    ref = _tiny(family)
    pat = copy.deepcopy(ref)
    ids = torch.randint(0, 256, (2, 11))
    report = kernellab.patch(pat, fused_linear_cross_entropy=True, verbose=False)
    assert report.counts()["linear_cross_entropy"] == 1 and "cross_entropy" not in report.counts(), report
    labels = ids.clone()
    labels[0, :3] = -100
    for n_items in (None, torch.tensor(17)):
        ref.zero_grad(set_to_none=True)
        pat.zero_grad(set_to_none=True)
        kw = {} if n_items is None else {"num_items_in_batch": n_items}
        out_r = ref(input_ids=ids, labels=labels, **kw)
        out_p = pat(input_ids=ids, labels=labels, **kw)
        assert out_p.logits is None
        out_r.loss.backward()
        out_p.loss.backward()
        _close(out_p.loss, out_r.loss, "loss")
        gr, gp = _grads(ref), _grads(pat)
        assert gr.keys() == gp.keys() and gr
        for n in gr:
            _close(gp[n], gr[n], f"grad of {n}")
    _close(pat(input_ids=ids).logits, ref(input_ids=ids).logits, "logits without labels")
    kernellab.unpatch(pat)
    assert "forward" not in pat.__dict__


def test_patch_hf_fused_linear_cross_entropy_left_for_a_final_softcap():
    if not hasattr(kernellab, "linear_cross_entropy"):
        pytest.skip("kernellab.linear_cross_entropy not in this build")
    pat = _tiny("gemma2")
    report = kernellab.patch(pat, fused_linear_cross_entropy=True, verbose=False)
    assert any(op == "linear_cross_entropy" and "softcap" in why for op, _, why in report.left), report
    assert report.counts()["cross_entropy"] == 1  # the loss still runs on kernellab.cross_entropy


def test_linear_cross_entropy_loss_module_matches_head_and_loss():
    x = torch.randn(2, 7, 16, requires_grad=True)
    head = nn.Linear(16, 50)
    t = torch.randint(0, 50, (2, 7))
    t[0, 0] = -100
    mod = kernellab.nn.LinearCrossEntropyLoss(label_smoothing=0.1)
    got = mod(x, head.weight, t, head.bias)
    want = F.cross_entropy(head(x).view(-1, 50), t.view(-1), label_smoothing=0.1)
    _close(got, want, "loss")
    gx, gw = torch.autograd.grad(got, (x, head.weight))
    wx, ww = torch.autograd.grad(want, (x, head.weight))
    _close(gx, wx, "dx")
    _close(gw, ww, "dweight")


def test_patch_hf_rope_swaps_the_family_function_while_patched(monkeypatch):
    """rope: the family's module-level apply_rotary_pos_emb runs kernellab.rope while a
    patched model exists (each attention layer's call reaches it), other call forms run
    the original, and the last unpatch restores the original object."""
    import gc

    import transformers.models.llama.modeling_llama as modeling

    gc.collect()  # models other tests patched and dropped give the swap back when collected
    original = modeling.apply_rotary_pos_emb
    assert not hasattr(original, "_kernellab_original")
    ref = _tiny("llama")
    a, b = copy.deepcopy(ref), copy.deepcopy(ref)
    calls = []
    from kernellab.ops import public  # (what patch calls the ops through)

    real = public.rope
    monkeypatch.setattr(public, "rope", lambda *args, **kw: calls.append(1) or real(*args, **kw))
    report = kernellab.patch(a, verbose=False)
    assert report.counts()["rope"] == 1 and modeling.apply_rotary_pos_emb is not original
    kernellab.patch(b, verbose=False)
    ids = torch.randint(0, 256, (2, 11))
    _assert_same_step(ref, a, _hf_run(ids))
    assert calls and len(calls) % 2 == 0  # each of the 2 layers, per forward run
    q, k = torch.randn(2, 4, 5, 16), torch.randn(2, 2, 5, 16)
    cos, sin = torch.randn(2, 5, 16), torch.randn(2, 5, 16)
    n = len(calls)
    for got, want in zip(modeling.apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin,
                                                       unsqueeze_dim=2),
                         original(q.transpose(1, 2), k.transpose(1, 2), cos, sin, unsqueeze_dim=2)):  # fmt: skip
        assert torch.equal(got, want)
    assert len(calls) == n  # another layout: the original ran
    ref(input_ids=ids)  # an unpatched model of the family: HF's own function
    assert len(calls) == n
    kernellab.unpatch(a)
    assert modeling.apply_rotary_pos_emb is not original  # b still patched
    kernellab.unpatch(b)
    assert modeling.apply_rotary_pos_emb is original
    r = kernellab.patch(copy.deepcopy(ref), ops=["rope"], verbose=False)
    assert r.counts() == {"rope": 1}
    del r
    gc.collect()
    assert modeling.apply_rotary_pos_emb is original  # patched, then dropped: given back
    assert kernellab.patch(_tiny("gpt2"), ops=["rope"], verbose=False).left[0][2].startswith("GPT2LMHeadModel")


def test_deepcopy_of_a_patched_hf_model_unpatches_on_its_own():
    import gc

    import transformers.models.llama.modeling_llama as modeling

    gc.collect()
    original = modeling.apply_rotary_pos_emb
    ref = _tiny("llama")
    pat = copy.deepcopy(ref)
    kernellab.patch(pat, verbose=False)
    cp = copy.deepcopy(pat)
    ids = torch.randint(0, 256, (2, 7))
    _assert_same_step(ref, cp, _hf_run(ids))
    kernellab.unpatch(cp)
    assert [type(m) for m in cp.modules()] == [type(m) for m in ref.modules()]
    assert cp.config._attn_implementation == ref.config._attn_implementation
    assert pat.config._attn_implementation == "kernellab" and isinstance(pat.model.norm, HFRMSNorm)
    assert modeling.apply_rotary_pos_emb is not original  # the original model holds its share
    _assert_same_step(ref, pat, _hf_run(ids))
    kernellab.unpatch(pat)
    assert [type(m) for m in pat.modules()] == [type(m) for m in ref.modules()]
    assert modeling.apply_rotary_pos_emb is original
    kernellab.patch(pat, verbose=False)
    cp = copy.deepcopy(pat)
    kernellab.unpatch(pat)
    assert modeling.apply_rotary_pos_emb is not original  # the copy's share
    del cp
    gc.collect()
    assert modeling.apply_rotary_pos_emb is original  # a patched copy, dropped: given back


@pytest.mark.parametrize("fused", [False, True])
def test_torch_save_of_a_patched_hf_model_loads_patched(fused, tmp_path):
    """torch.save(model) of a patched model and torch.load: every patched piece (gated MLP
    forwards, norms, attention, the rope swap, the loss or the fused head) comes back,
    here and in a fresh process (the rope swap and the attention function registered
    again), and unpatch restores the loaded model."""
    import gc
    import io
    import subprocess

    import transformers.models.llama.modeling_llama as modeling

    gc.collect()
    original = modeling.apply_rotary_pos_emb
    ref = _tiny("llama")
    pat = copy.deepcopy(ref)
    want = kernellab.patch(pat, verbose=False, fused_linear_cross_entropy=fused).counts()
    buf = io.BytesIO()
    torch.save(pat, buf)
    loaded = torch.load(io.BytesIO(buf.getvalue()), weights_only=False)
    assert loaded._kernellab_patch.report.counts() == want
    assert "forward" in loaded.model.layers[0].mlp.__dict__
    ids = torch.randint(0, 256, (2, 7))
    if fused:  # (no logits: the loss alone)
        loss = loaded(input_ids=ids, labels=ids)
        assert loss.logits is None
        _close(loss.loss, ref(input_ids=ids, labels=ids).loss, "loss")
    else:
        _assert_same_step(ref, loaded, _hf_run(ids))
    del pat
    gc.collect()
    assert modeling.apply_rotary_pos_emb is not original  # the loaded model's share
    kernellab.unpatch(loaded)
    assert [type(m) for m in loaded.modules()] == [type(m) for m in ref.modules()]
    assert modeling.apply_rotary_pos_emb is original
    path, ref_path = tmp_path / "patched.pt", tmp_path / "ref.pt"
    path.write_bytes(buf.getvalue())
    torch.save(ref, ref_path)
    code = f"""
import torch, kernellab
import transformers.models.llama.modeling_llama as modeling
original = modeling.apply_rotary_pos_emb
m, ref = torch.load({str(path)!r}, weights_only=False), torch.load({str(ref_path)!r}, weights_only=False)
assert modeling.apply_rotary_pos_emb is not original
ids = torch.randint(0, 256, (2, 7))
calls = m._kernellab_patch.report.attention_calls
before = calls["kernellab"]
got, want = m(input_ids=ids, labels=ids).loss, ref(input_ids=ids, labels=ids).loss
torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
assert calls["kernellab"] == before + 2, calls
kernellab.unpatch(m)
assert modeling.apply_rotary_pos_emb is original and m.config._attn_implementation == "sdpa"
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


def test_rope_swap_takes_the_familys_layout_or_nothing():
    """Families share the name apply_rotary_pos_emb, not its formula: patch reads which of
    kernellab.rope's rotations the family's function computes for HF's call form (Llama: the
    head dim's halves; Cohere: adjacent pairs; Helium: pairs, angles from cos's first half)
    and leaves any other rotation or signature, with its reason."""
    import transformers.models.llama.modeling_llama as modeling

    from kernellab.patch import _rope_form

    original = getattr(modeling.apply_rotary_pos_emb, "_kernellab_original", modeling.apply_rotary_pos_emb)
    assert _rope_form(original) == ("neox", False, "")  # (q * cos: cos of q's width only)

    def pairs(q, k, cos, sin, unsqueeze_dim=1):
        def rot(x):
            return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)

        c, s = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
        return q * c + rot(q) * s, k * c + rot(k) * s

    def pairs_from_half(q, k, cos, sin, unsqueeze_dim=1):  # Helium's
        return pairs(q, k, *(t[..., : t.shape[-1] // 2].repeat_interleave(2, -1) for t in (cos, sin)))

    def swapped_halves(q, k, cos, sin, unsqueeze_dim=1):  # sin on the other side
        h = q.shape[-1] // 2
        c, s = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
        return tuple(x * c + torch.cat((x[..., h:], -x[..., :h]), -1) * s for x in (q, k))

    def gptj_form(x, sin, cos):
        return x * cos + x * sin

    def pairs_partial(q, k, cos, sin, unsqueeze_dim=1):  # GLM's: the first cos.shape[-1] columns
        r = cos.shape[-1]
        rot = pairs(q[..., :r], k[..., :r], cos, sin)
        return tuple(torch.cat((a, x[..., r:]), -1) for a, x in zip(rot, (q, k)))

    assert _rope_form(pairs) == ("interleaved", False, "")
    assert _rope_form(pairs_from_half) == ("interleaved-half", False, "")
    assert _rope_form(pairs_partial) == ("interleaved", True, "")
    assert "none of kernellab.rope's" in _rope_form(swapped_halves)[2]
    assert "call" in _rope_form(gptj_form)[2]


def _tiny_of(model_type, **extra):
    """A 2-layer model of ``model_type`` from transformers' registry, fp32, or a skip where
    this transformers lacks it."""
    try:
        cfg = transformers.AutoConfig.for_model(
            model_type, vocab_size=256, num_hidden_layers=2, hidden_size=64, intermediate_size=128,
            num_attention_heads=4, num_key_value_heads=2, initializer_range=0.2, pad_token_id=0,
            max_position_embeddings=64, attn_implementation="sdpa", **extra)  # fmt: skip
    except (KeyError, ValueError) as e:
        pytest.skip(f"transformers {transformers.__version__} has no {model_type}: {e}")
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg).float().eval()


@pytest.mark.parametrize("model_type, extra, rope", [
    ("cohere", {}, "interleaved"), ("helium", {"head_dim": 16}, "interleaved"),
    ("ernie4_5", {}, "interleaved"),
    ("llama", {}, "neox"),
    ("gptj", {"n_embd": 64, "n_layer": 2, "n_head": 4, "rotary_dim": 8}, None),  # (x, sin, cos)
    ("glm", {"head_dim": 16}, "interleaved"),  # pairs over part of the head dim, from half of cos
])  # fmt: skip
def test_patch_hf_other_rotations_keep_the_models_answer(model_type, extra, rope, monkeypatch):
    # Cohere's, Helium's and ERNIE's apply_rotary_pos_emb rotate adjacent pairs: run as
    # Llama's their logits were off by 0.3-7; GPT-J's takes (x, sin, cos), and its forward
    # raised. Each runs kernellab.rope in its own layout, or its own function.
    from kernellab.ops import public

    ref = _tiny_of(model_type, **extra)
    pat = copy.deepcopy(ref)
    report = kernellab.patch(pat, verbose=False)
    layouts = []
    real = public.rope
    monkeypatch.setattr(public, "rope", lambda *a, **kw: layouts.append(kw["layout"]) or real(*a, **kw))
    ids = torch.randint(1, 256, (2, 11))
    _assert_same_step(ref, pat, _hf_run(ids))
    if rope is None:
        assert "rope" not in report.counts(), report
        assert any(op == "rope" and "apply_rotary_pos_emb" in why for op, _, why in report.left), report
        assert not layouts
    else:
        assert report.counts()["rope"] == 1, report
        assert layouts and set(layouts) == {rope}
    kernellab.unpatch(pat)


@pytest.mark.parametrize("model_type, extra, fused", [
    ("cohere", {}, False),  # logits * logit_scale
    ("granite", {"logits_scaling": 8.0}, False),  # logits / logits_scaling
    ("granite", {"logits_scaling": 1.0}, True),
    ("phi3", {}, True),
])  # fmt: skip
def test_patch_hf_fused_linear_cross_entropy_only_where_logits_are_the_head(model_type, extra, fused):
    # Fused, Cohere's loss was 7.06 against its own 5.57: the fused path computed the loss of
    # head(hidden) and dropped the logit scale. The model's forward is now run once at patch
    # time beside head(base(x)); where they differ the head and loss are left, and the model's
    # train / eval flags are as they were.
    if not hasattr(kernellab, "linear_cross_entropy"):
        pytest.skip("kernellab.linear_cross_entropy not in this build")
    ref = _tiny_of(model_type, **extra).train()
    ref.model.layers[0].eval()  # a mixed state, kept
    pat = copy.deepcopy(ref)
    report = kernellab.patch(pat, fused_linear_cross_entropy=True, verbose=False)
    assert [m.training for m in pat.modules()] == [m.training for m in ref.modules()]
    if fused:
        assert report.counts()["linear_cross_entropy"] == 1, report
    else:
        assert "linear_cross_entropy" not in report.counts(), report
        assert any(op == "linear_cross_entropy" and "not head(hidden states)" in why
                   for op, _, why in report.left), report  # fmt: skip
    ref.eval(), pat.eval()
    ids = torch.randint(1, 256, (2, 11))
    labels = ids.clone()
    labels[0, :2] = -100
    losses = [m(input_ids=ids, labels=labels).loss for m in (ref, pat)]
    _close(losses[1], losses[0], "loss")


def test_patch_hf_attention_keywords_it_does_not_read_run_the_familys_eager_attention():
    # gpt-oss passes its attention sinks as s_aux: kernellab.attention ignored them and the
    # patched logits were off by 6 (the sinks took no gradient); SDPA's path ignores them too.
    from kernellab.patch import _unread_kwargs

    assert _unread_kwargs({"position_ids": 1, "use_cache": True, "s_aux": 2, "head_mask": None}) == ["s_aux"]
    assert _unread_kwargs({"output_attentions": False, "cu_seq_lens_q": 3}) == ["cu_seq_lens_q"]
    # a causal LM's loss token count reaches the attention calls: read by nothing there
    llama = _tiny("llama")
    report = kernellab.patch(llama, verbose=False)
    ids = torch.randint(0, 256, (2, 11))
    llama(input_ids=ids, labels=ids, num_items_in_batch=torch.tensor(20))
    assert report.attention_calls == {"kernellab": 2} and not report.attention_fallbacks, report
    try:
        cfg = transformers.AutoConfig.for_model(
            "gpt_oss", vocab_size=256, num_hidden_layers=2, hidden_size=64, intermediate_size=128,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
            num_experts_per_tok=2, sliding_window=4, layer_types=["sliding_attention", "full_attention"],
            initializer_range=0.2,
            pad_token_id=0, max_position_embeddings=64, attn_implementation="eager")  # fmt: skip
    except (KeyError, ValueError) as e:
        pytest.skip(f"transformers {transformers.__version__} has no gpt_oss: {e}")
    torch.manual_seed(0)
    ref = transformers.AutoModelForCausalLM.from_config(cfg).float().eval()
    with torch.no_grad():
        for layer in ref.model.layers:
            layer.self_attn.sinks.normal_()
    pat = copy.deepcopy(ref)
    report = kernellab.patch(pat, verbose=False)
    _assert_same_step(ref, pat, _hf_run(torch.randint(1, 256, (2, 11))))
    assert report.attention_fallbacks == {"keywords kernellab attention does not take (s_aux)": 2}, report


def test_patch_hf_t5_relative_position_bias_runs_t5s_attention():
    # T5 adds its relative position bias inside attention (position_bias): dropped, the
    # patched T5's logits were off by 0.19. Its calls now run T5's own attention.
    torch.manual_seed(0)
    cfg = transformers.T5Config(vocab_size=256, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
                                dropout_rate=0.0, attn_implementation="sdpa")  # fmt: skip
    ref = transformers.T5ForConditionalGeneration(cfg).float().eval()
    pat = copy.deepcopy(ref)
    report = kernellab.patch(pat, verbose=False)
    ids = torch.randint(3, 256, (2, 11))

    def run(m):
        out = m(input_ids=ids, decoder_input_ids=ids[:, :5].contiguous(), labels=ids[:, 1:6].contiguous())
        return out.logits, out.loss

    _assert_same_step(ref, pat, run)
    assert set(report.attention_fallbacks) == {"keywords kernellab attention does not take (position_bias)"}
    assert report.counts()["rms_norm"] == 12  # T5LayerNorm: an RMSNorm, found by running it


def test_attention_keywords_it_does_not_read_go_to_the_models_flash_attention(monkeypatch):
    # a model that ran a FlashAttention before the patch gets it back for such calls (it
    # reads packed sequences' cu_seq_lens and sinks); any other, the family's eager attention
    import importlib

    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    kpatch = importlib.import_module("kernellab.patch")  # (kernellab.patch is the function)
    calls = []

    def fake_flash(module, q, k, v, mask, **kw):
        calls.append(sorted(kw))
        return q.transpose(1, 2), None

    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS._global_mapping, "flash_attention_fake", fake_flash)
    kpatch._register_hf_attention()
    q = torch.randn(1, 2, 3, 8)
    opts = dict(scaling=0.5, dropout=0.0, sliding_window=None, softcap=None, is_causal=True)
    cu = torch.tensor([0, 3])
    kpatch._hf_fallback(nn.Module(), q, q, q, None, original="flash_attention_fake", cu_seq_lens_q=cu, **opts)
    assert calls == [["cu_seq_lens_q", "dropout", "is_causal", "scaling", "sliding_window", "softcap"]]


def test_rms_norm_classes_outside_the_list_are_checked_by_running_them():
    """An HF norm class patch does not know by name is replaced only where a CPU copy with a
    random weight computes x * rsqrt(mean(x^2) + eps) * (offset + weight), offset 0 or 1, and
    its forward takes x alone."""
    from kernellab.patch import _rms_offset

    class PlainRMSNorm(nn.Module):
        def __init__(self, d, eps=1e-6):
            super().__init__()
            self.weight, self.variance_epsilon = nn.Parameter(torch.ones(d)), eps

        def forward(self, x):
            v = x.float().pow(2).mean(-1, keepdim=True)
            return self.weight * (x.float() * torch.rsqrt(v + self.variance_epsilon)).to(x.dtype)

    class OffsetRMSNorm(PlainRMSNorm):  # Gemma's: zero-initialized, scaled by 1 + weight
        def __init__(self, d):
            super().__init__(d)
            self.eps = 1e-6
            del self.variance_epsilon
            nn.init.zeros_(self.weight)

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (1 + self.weight)

    class CenteredRMSNorm(PlainRMSNorm):  # a LayerNorm by another name
        def forward(self, x):
            return super().forward(x - x.mean(-1, keepdim=True))

    class GatedRMSNorm(PlainRMSNorm):
        def forward(self, x, gate=None):
            return super().forward(x if gate is None else x * gate)

    assert _rms_offset(PlainRMSNorm(16), 1e-6) == (0.0, "")
    assert _rms_offset(OffsetRMSNorm(16), 1e-6) == (1.0, "")
    assert "formula" in _rms_offset(CenteredRMSNorm(16), 1e-6)[1]
    assert "more than x" in _rms_offset(GatedRMSNorm(16), 1e-6)[1]
    assert "1-D weight" in _rms_offset(PlainRMSNorm(16), None)[1]
    model = nn.Sequential(nn.Linear(16, 16), PlainRMSNorm(16), CenteredRMSNorm(16), OffsetRMSNorm(16))
    with torch.no_grad():
        model[3].weight.normal_()
    ref = copy.deepcopy(model)
    report = kernellab.patch(model, verbose=False)
    assert report.counts().get("rms_norm") == 2, report
    assert any(op == "rms_norm" and "CenteredRMSNorm" in why for op, _, why in report.left), report
    x = torch.randn(4, 16)
    _assert_same_step(ref, model, lambda m: (lambda y: (y, y.square().sum()))(m(x)))


def test_layer_norm_classes_by_name_are_checked_by_running_them():
    """A class named *LayerNorm that is not nn.LayerNorm: replaced by kernellab.layer_norm
    where it computes a LayerNorm (Cohere's, without a bias), by kernellab.rms_norm where it
    computes an RMSNorm (T5's), and left, with its reason, where neither."""

    class BiasFreeLayerNorm(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.weight, self.variance_epsilon = nn.Parameter(torch.ones(d)), 1e-5

        def forward(self, x):
            c = x - x.mean(-1, keepdim=True)
            return self.weight * c * torch.rsqrt(c.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)

    class RootLayerNorm(BiasFreeLayerNorm):  # T5's: an RMSNorm by another name
        def forward(self, x):
            return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)

    class ClampedLayerNorm(BiasFreeLayerNorm):
        def forward(self, x):
            return super().forward(x).clamp(-1, 1)

    model = nn.Sequential(nn.Linear(16, 16), BiasFreeLayerNorm(16), RootLayerNorm(16), ClampedLayerNorm(16))
    with torch.no_grad():
        for m in model[1:]:
            m.weight.normal_()
    ref = copy.deepcopy(model)
    report = kernellab.patch(model, verbose=False)
    assert report.counts() == {"layer_norm": 1, "rms_norm": 1, "attention": 1}, report
    left = [(op, why) for op, _, why in report.left if "ClampedLayerNorm" in why]
    assert len(left) == 1 and left[0][0] == "layer_norm" and "formula" in left[0][1], report.left
    x = torch.randn(4, 16)
    _assert_same_step(ref, model, lambda m: (lambda y: (y, y.square().sum()))(m(x)))


@pytest.mark.parametrize("model_type, norms", [("gemma", 5), ("phi3", 5), ("olmo2", 9), ("mixtral", 5)])
def test_patch_hf_norms_found_by_running_them(model_type, norms):
    # RMSNorm classes of families outside _HF_RMSNORM (Gemma's 1 + weight among them)
    extra = {"head_dim": 16} if model_type == "gemma" else {}
    ref = _tiny_of(model_type, **extra)
    with torch.no_grad():  # Gemma's zero-initialized (1 + w) norms would hide the offset
        for n, p in ref.named_parameters():
            if "norm" in n:
                p.add_(0.1 * torch.randn_like(p))
    pat = copy.deepcopy(ref)
    report = kernellab.patch(pat, verbose=False)
    assert report.counts()["rms_norm"] == norms, report
    _assert_same_step(ref, pat, _hf_run(torch.randint(1, 256, (2, 11))))


@pytest.mark.parametrize("fused", [False, True])
def test_patch_under_compile_runs_the_models_own_code(fused, monkeypatch):
    """Under torch.compile with no backend named, every patched piece runs the model's own
    code (the compiled graph is the unpatched model's); naming a backend puts kernellab's
    op in the graph."""
    import torch._dynamo

    ref = _tiny("llama")
    pat = copy.deepcopy(ref)
    kernellab.patch(pat, fused_linear_cross_entropy=fused, verbose=False)
    calls = []
    from kernellab.ops import public  # (what patch and the gated MLPs call the ops through)

    for op in ("rms_norm", "swiglu", "attention", "rope", "linear_cross_entropy", "cross_entropy"):
        real = getattr(public, op)
        spy = (lambda f, o: lambda *a, **k: calls.append(o) or f(*a, **k))(real, op)
        monkeypatch.setattr(public, op, spy)
        monkeypatch.setitem(public.FUNCTIONS, op, spy)
    from kernellab.core import registry

    real_call = registry.call
    monkeypatch.setattr(registry, "call", lambda op, *a, **k: calls.append(op) or real_call(op, *a, **k))
    torch._dynamo.reset()
    ids = torch.randint(0, 256, (2, 7))
    pat.compile(backend="eager")  # (in place: parameter names unchanged)
    _assert_same_step(ref, pat, _hf_run(ids))
    assert calls == []
    # a backend named: kernellab's ops are traced
    named = copy.deepcopy(ref)
    kernellab.patch(named, backend="torch", verbose=False)
    torch._dynamo.reset()
    named.compile(backend="eager")
    _assert_same_step(ref, named, _hf_run(ids))
    assert {"rms_norm", "attention"} <= set(calls)
    torch._dynamo.reset()


def test_patch_attention_fallback_keeps_is_causal(monkeypatch):
    """A fallback call (here attention dropout in training) with no mask goes to SDPA with
    is_causal and no made mask, as transformers' own path does."""
    seen = []
    real = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        seen.append((kwargs.get("attn_mask", args[3] if len(args) > 3 else None), kwargs.get("is_causal")))
        return real(*args, **kwargs)

    pat = _tiny("llama", attention_dropout=0.1)
    kernellab.patch(pat, verbose=False)
    pat.train()
    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    pat(input_ids=torch.randint(0, 256, (2, 7)))
    assert seen and all(mask is None and causal for mask, causal in seen), seen


def _tiny_vit():
    cfg = transformers.ViTConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, image_size=32,
        patch_size=8, num_labels=10, attn_implementation="sdpa",
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.ViTForImageClassification(cfg).float()


@pytest.mark.parametrize("family", ["gpt2", "llama", "mistral", "vit"])
def test_patch_hf_makes_no_mask_shapes_show_unneeded_while_tracing(family, monkeypatch):
    """transformers skips its SDPA masks only when not tracing, and with torch before 2.14
    Dynamo reads every torch.compile as an export, so a compiled model carries a mask
    (ViT's sends SDPA to its math path). Emulated here by is_torchdynamo_exporting -> True:
    the unpatched model then gets masks; the patched one none where shapes alone show none
    is needed (no padding; Mistral's plain window prefill), with the same step. A padding
    mask is still made and applied."""
    from transformers import masking_utils

    monkeypatch.setattr(masking_utils, "is_torchdynamo_exporting", lambda: True)
    seen = []
    real = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        seen.append(kwargs.get("attn_mask", args[3] if len(args) > 3 else None))
        return real(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    if family == "vit":
        ref = _tiny_vit()
        x, y = torch.randn(2, 3, 32, 32), torch.tensor([1, 7])
        run = lambda m: (lambda o: (o.logits, o.loss))(m(pixel_values=x, labels=y))  # noqa: E731
    else:
        ref = _tiny(family)
        run = _hf_run(torch.randint(0, 256, (2, 11)))
    pat = copy.deepcopy(ref)
    report = kernellab.patch(pat, verbose=False)
    run(ref)
    assert len(seen) == 2 and all(m is not None for m in seen), "the emulation makes masks"
    _assert_same_step(ref, pat, run)
    assert report.attention_calls == {"kernellab": 2} and not report.attention_fallbacks, report
    if family == "llama":
        ids, mask = torch.randint(0, 256, (2, 9)), torch.ones(2, 9, dtype=torch.long)
        mask[1, :3] = 0
        _assert_same_step(ref, pat, _hf_run(ids, mask))
        assert report.attention_fallbacks == {"attention mask (padding or custom) given": 2}, report
        # called with more than the five leading arguments positional: left to transformers
        hf_mask = sys.modules["kernellab.patch"]._hf_mask
        made = hf_mask(2, 9, 9, 0, 0, masking_utils.causal_mask_function, mask.bool())
        assert not made[1, 0, :, :3].any() and torch.equal(made[0, 0], torch.ones(9, 9, dtype=torch.bool).tril())
        assert hf_mask(2, 9, 9, 0, 0) is None


def test_patch_functions_traced_under_compile_import_nothing():
    """The attention, mask, rope and loss functions the patch puts in a model run inside
    torch.compile's trace; an import there breaks the graph where the imported package is
    a lazy module (transformers' _LazyModule under torch 2.11): no import instruction in
    their code."""
    import dis

    mod = sys.modules["kernellab.patch"]
    fns = [mod._hf_attention, mod._hf_fallback, mod._hf_mask, mod._causal_mask, mod._fallback_reason,
           mod._HFCausalLMLoss.__call__, mod._hf_rope(None, None), mod._model_code,
           mod._BoundForward.__call__, mod._GatedForward.__call__, mod._SDPAForward.__call__,
           mod._FusedLCEForward.__call__]  # fmt: skip
    for fn in fns:
        ops = {i.opname for i in dis.get_instructions(fn)}
        assert not ops & {"IMPORT_NAME", "IMPORT_FROM"}, f"{fn.__qualname__} imports at call time"
