"""manual, torch and compile backends of rope."""

from __future__ import annotations

import torch

from kernellab.core.spec import upcast
from kernellab.ops._baselines import compiled, register_baseline
from kernellab.ops.rope.rotation import gather_cos_sin, rotate_every_two, rotate_half


def _rope_manual(q, k, cos, sin, position_ids=None, layout="neox"):
    c, s = gather_cos_sin(q, upcast(cos), upcast(sin), position_ids)
    r = c.shape[-1]
    h = r // 2

    def one(x):
        x32 = upcast(x)
        xr = x32[..., :r]
        if layout == "neox":
            x1, x2 = xr[..., :h], xr[..., h:]
            y = torch.cat((x1 * c[..., :h] - x2 * s[..., :h], x2 * c[..., h:] + x1 * s[..., h:]), dim=-1)
        else:
            x1, x2 = xr[..., 0::2], xr[..., 1::2]
            y1 = x1 * c[..., 0::2] - x2 * s[..., 0::2]
            y2 = x2 * c[..., 1::2] + x1 * s[..., 1::2]
            y = torch.stack((y1, y2), dim=-1).flatten(-2)
        return torch.cat((y, x32[..., r:]), dim=-1).to(x.dtype)

    return one(q), one(k)


def _rope_torch(q, k, cos, sin, position_ids=None, layout="neox"):
    # Hugging Face's apply_rotary_pos_emb as written: cos / sin cast to q's dtype (as HF's
    # rotary embedding returns them), the products in q's dtype, rotate_half by cat.
    c, s = gather_cos_sin(q, cos.to(q.dtype), sin.to(q.dtype), position_ids)
    rot = rotate_half if layout == "neox" else rotate_every_two
    r = c.shape[-1]

    def one(x):
        if r == x.shape[-1]:
            return (x * c) + (rot(x) * s)
        xr, xp = x[..., :r], x[..., r:]
        return torch.cat(((xr * c) + (rot(xr) * s), xp), dim=-1)

    return one(q), one(k)


def _inplace_outer(fn, doc: str):
    """The backend's callable: ``fn`` out of place, then, with ``inplace=True``, the result
    copied into q and k (validated: neither requires grad, no aliasing)."""

    def run(q, k, cos, sin, position_ids=None, *, layout="neox", inplace=False):
        qr, kr = fn(q, k, cos, sin, position_ids, layout)
        if not inplace:
            return qr, kr
        with torch.no_grad():
            q.copy_(qr)
            k.copy_(kr)
        return q, k

    run.__doc__ = doc
    return run


def manual_rope(q, k, cos, sin, position_ids=None, layout="neox"):
    return _rope_manual(q, k, cos, sin, position_ids, layout)


manual = _inplace_outer(
    _rope_manual,
    "Both halves by slicing, products and cat in fp32: ~10 kernels per tensor, each a trip to memory.",
)
torch_rope = _inplace_outer(
    _rope_torch, "Hugging Face's apply_rotary_pos_emb in PyTorch ops (rotate_half by cat), in q's dtype."
)
compile_rope = _inplace_outer(compiled(manual_rope, "rope"), "torch.compile of manual")

register_baseline("rope", manual, torch_rope, compile_rope)
