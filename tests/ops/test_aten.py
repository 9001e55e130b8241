"""kernellab.ops.aten: PyTorch's kernels behind the op kit's node-free entry points (what
the GPT's fused blocks call in a slot where PyTorch's op is the default). Each entry's
output and every gradient equal PyTorch's own autograd of the same op."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernellab.ops import aten


def _leaves(*ts):
    return [t.detach().clone().requires_grad_() for t in ts]


def _autograd(fn, inputs, dy):
    out = fn(*inputs)
    grads = torch.autograd.grad(out, inputs, dy)
    return out.detach(), grads


@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm_entry_matches_f_layer_norm(bias):
    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(7, 33, generator=g), torch.randn(33, generator=g), torch.randn(33, generator=g)
    b = b if bias else None
    dy = torch.randn(7, 33, generator=g)
    y, saved = aten.layer_norm.forward_saving(x, w, b, 1e-5)
    dx, dw, db, deps = aten.layer_norm.backward_from(saved, dy)
    ins = _leaves(x, w) + (_leaves(b) if bias else [])
    ref, grads = _autograd(lambda x, w, *b: F.layer_norm(x, (33,), w, b[0] if b else None, 1e-5), ins, dy)
    torch.testing.assert_close(y, ref, rtol=0, atol=0)
    torch.testing.assert_close(dx, grads[0], rtol=0, atol=0)
    torch.testing.assert_close(dw, grads[1], rtol=0, atol=0)
    if bias:
        torch.testing.assert_close(db, grads[2], rtol=0, atol=0)
    else:
        assert db is None
    assert deps is None


def test_gelu_and_add_entries_match_pytorch():
    g = torch.Generator().manual_seed(1)
    x, r, dy = (torch.randn(5, 40, generator=g) * 3 for _ in range(3))
    y, s = aten.gelu.forward_saving(x)
    (dx,) = aten.gelu.backward_from(s, dy)
    ref, (gx,) = _autograd(lambda x: F.gelu(x, approximate="tanh"), _leaves(x), dy)
    torch.testing.assert_close(y, ref, rtol=0, atol=0)
    torch.testing.assert_close(dx, gx, rtol=0, atol=0)
    h, s = aten.add.forward_saving(x, r)
    torch.testing.assert_close(h, x + r, rtol=0, atol=0)
    da, db = aten.add.backward_from(s, dy)
    assert da is dy and db is dy


@pytest.mark.parametrize("causal", [False, True])
def test_attention_entry_matches_sdpa_on_strided_views(causal):
    # q, k, v as the GPT's blocks pass them: [B, H, T, hd] views of one qkv projection
    g = torch.Generator().manual_seed(2)
    b, t, h, d = 2, 13, 3, 8
    qkv = torch.randn(b, t, 3, h, d, generator=g)
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    do = torch.randn(b, h, t, d, generator=g)
    o, saved = aten.attention.forward_saving(q, k, v, causal, 0.3)
    assert not o.requires_grad
    dq, dk, dv, dc, ds = aten.attention.backward_from(saved, do)
    assert dc is None and ds is None
    ref, grads = _autograd(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=0.3),
                           _leaves(q, k, v), do)  # fmt: skip
    torch.testing.assert_close(o, ref, rtol=1e-6, atol=1e-6)
    for got, want in zip((dq, dk, dv), grads):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_attention_entry_refuses_causal_with_unequal_lengths():
    q, k = torch.randn(1, 1, 4, 8), torch.randn(1, 1, 6, 8)
    with pytest.raises(ValueError, match="S_q=4 != S_k=6"):
        aten.attention.forward_saving(q, k, k, True, None)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_attention_entry_matches_sdpa(dtype):
    g = torch.Generator(device="cuda").manual_seed(3)
    b, t, h, d = 4, 256, 12, 64
    qkv = torch.randn(b, t, 3, h, d, device="cuda", dtype=dtype, generator=g)
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    do = torch.randn(b, h, t, d, device="cuda", dtype=dtype, generator=g)
    o, saved = aten.attention.forward_saving(q, k, v, True, 0.125)
    dq, dk, dv = aten.attention.backward_from(saved, do)[:3]
    ref, grads = _autograd(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.125),
                           _leaves(q, k, v), do)  # fmt: skip
    torch.testing.assert_close(o, ref, rtol=0, atol=0)  # the same SDPA kernel
    for got, want in zip((dq, dk, dv), grads):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
