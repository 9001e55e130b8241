"""RoPE in Triton: one kernel rotates q and k in one launch; the backward is the same
kernel with the transposed rotation.

A program rotates one token (b, s): it reads the token's cos / sin row once (at the
token's index, or at its id in ``position_ids``) and rotates every head of q and then of
k with it (GQA: k has its own head count), BLOCK_H heads per step. A head reads its two
column sets (neox: i and i + R/2; interleaved: 2i and 2i + 1), computes in fp32 and rounds
once to the output dtype; columns R..D-1 are copied (out of place) or left alone (in
place). Napkin math for bf16 Llama-3-8B at 4 x 2048 tokens (32 q + 8 kv heads of 128):
2 x 40 MiB read and written; cos / sin 2 x 0.5 MiB, read once per token rather than once
per head (40x less traffic through L2). The op runs at the copy ceiling when its accesses
are wide, so q and k are read through their strides: a transposed (B, S, H, D)
projection or a fused qkv view is never packed first (a packing copy would double the
traffic).

The transposed rotation: forward y1 = x1 c1 - x2 s1, y2 = x2 c2 + x1 s2 (c1, s1: cos and
sin at x1's columns; c2, s2 at x2's); backward dx1 = dy1 c1 + dy2 s2, dx2 = dy2 c2 - dy1
s1, i.e. the forward formula with (s1, s2) replaced by (-s2, -s1). With HF's cos / sin
(both halves equal) that is the rotation by -sin.
"""

from __future__ import annotations

import inspect
from typing import Optional

import torch
import triton.language as tl
from torch import Tensor

from kernellab import triton_support
from kernellab.core.kit import OpDecl, build
from kernellab.ops._register import register_triton


@triton_support.jit
def _rotate_heads(
    x_ptr, y_ptr, b, s, n_heads, D, R,
    c1, c2, cmask, cos1, cos2, sa, sb,  # columns of the two sets, their mask, cos / signed sin
    sxb, sxh, sxs, sxd,  # x (B, H, S, D) strides, elements
    syb, syh, sys, syd,  # y strides (y may be x: in place)
    BLOCK_H: tl.constexpr, PASS_BLOCK: tl.constexpr, PASS: tl.constexpr,
):  # fmt: skip
    # Every head of token (b, s): BLOCK_H heads x the column set per step.
    hh = tl.arange(0, BLOCK_H)
    xtok = b * sxb + s * sxs
    ytok = b * syb + s * sys
    ty = y_ptr.dtype.element_ty
    for h0 in range(0, n_heads, BLOCK_H):
        h = (h0 + hh).to(tl.int64)  # int64: head offsets may pass 2^31
        hm = (h < n_heads)[:, None]
        m = hm & cmask[None, :]
        xrow = xtok + h[:, None] * sxh
        yrow = ytok + h[:, None] * syh
        x1 = tl.load(x_ptr + xrow + c1[None, :] * sxd, mask=m, other=0.0).to(tl.float32)
        x2 = tl.load(x_ptr + xrow + c2[None, :] * sxd, mask=m, other=0.0).to(tl.float32)
        y1 = x1 * cos1[None, :] - x2 * sa[None, :]
        y2 = x2 * cos2[None, :] + x1 * sb[None, :]
        tl.store(y_ptr + yrow + c1[None, :] * syd, y1.to(ty), mask=m)
        tl.store(y_ptr + yrow + c2[None, :] * syd, y2.to(ty), mask=m)
        if PASS:  # columns R .. D-1 unchanged (the gradient there is dy itself)
            j = R + tl.arange(0, PASS_BLOCK)
            pm = hm & (j < D)[None, :]
            v = tl.load(x_ptr + xrow + j[None, :] * sxd, mask=pm, other=0.0)
            tl.store(y_ptr + yrow + j[None, :] * syd, v.to(ty), mask=pm)


@triton_support.jit
def _rope_kernel(
    q_ptr, qo_ptr, k_ptr, ko_ptr, cos_ptr, sin_ptr, pos_ptr,
    HQ, HK, S, D, R, P,
    sqb, sqh, sqs, sqd,  # q strides (elements)
    sqob, sqoh, sqos, sqod,  # q output strides
    skb, skh, sks, skd,  # k strides
    skob, skoh, skos, skod,  # k output strides
    scb, scs, scd,  # cos strides: batch (0: one batch shared), row, column
    ssb, sss, ssd,  # sin strides
    spb, sps,  # position_ids (B or 1, S) strides (spb 0: one row shared)
    HALF: tl.constexpr, BLOCK_H: tl.constexpr, PASS_BLOCK: tl.constexpr,
    INTERLEAVED: tl.constexpr, BACKWARD: tl.constexpr, HAS_POS: tl.constexpr, PASS: tl.constexpr,
):  # fmt: skip
    # One program per token (b, s): its cos / sin row is read once and rotates every head
    # of q and of k.
    t = tl.program_id(0).to(tl.int64)
    b = t // S
    s = t % S
    if HAS_POS:
        p = tl.load(pos_ptr + b * spb + s * sps).to(tl.int64)
        pok = (p >= 0) & (p < P)
        p = tl.where(pok, p, 0)  # a bad id never becomes an address (NaN below)
    else:
        p = s
    i = tl.arange(0, HALF)
    half = R // 2
    cmask = i < half
    if INTERLEAVED:
        c1 = 2 * i
        c2 = 2 * i + 1
    else:
        c1 = i
        c2 = i + half
    crow = b * scb + p * scs
    srow = b * ssb + p * sss
    cos1 = tl.load(cos_ptr + crow + c1 * scd, mask=cmask, other=0.0).to(tl.float32)
    cos2 = tl.load(cos_ptr + crow + c2 * scd, mask=cmask, other=0.0).to(tl.float32)
    sin1 = tl.load(sin_ptr + srow + c1 * ssd, mask=cmask, other=0.0).to(tl.float32)
    sin2 = tl.load(sin_ptr + srow + c2 * ssd, mask=cmask, other=0.0).to(tl.float32)
    if HAS_POS:
        cos1 = tl.where(pok, cos1, float("nan"))
        cos2 = tl.where(pok, cos2, float("nan"))
    if BACKWARD:  # the transposed rotation (module docstring)
        sa = -sin2
        sb = -sin1
    else:
        sa = sin1
        sb = sin2
    _rotate_heads(
        q_ptr, qo_ptr, b, s, HQ, D, R, c1, c2, cmask, cos1, cos2, sa, sb,
        sqb, sqh, sqs, sqd, sqob, sqoh, sqos, sqod, BLOCK_H, PASS_BLOCK, PASS,
    )  # fmt: skip
    _rotate_heads(
        k_ptr, ko_ptr, b, s, HK, D, R, c1, c2, cmask, cos1, cos2, sa, sb,
        skb, skh, sks, skd, skob, skoh, skos, skod, BLOCK_H, PASS_BLOCK, PASS,
    )  # fmt: skip


# --------------------------------------------------------------------------- launcher


def _config(d: int, r: int, heads: int) -> tuple[int, int, int]:
    """(HALF, BLOCK_H, PASS_BLOCK): a step's tile holds ~2048 values of the widest column
    set (16 per thread with 4 warps), at most every head."""
    half = triton_support.next_pow2(max(1, r // 2))
    pass_block = triton_support.next_pow2(d - r) if d > r else 1
    width = max(2 * half, pass_block)
    return half, max(1, min(triton_support.next_pow2(max(1, heads)), 2048 // width)), pass_block


def _cos_strides(t: Tensor, has_pos: bool) -> tuple[int, int, int]:
    # (batch, row, column); a 2-D table or a batch of one is shared by every batch
    if t.dim() == 2 or has_pos:
        return 0, t.stride(-2), t.stride(-1)
    return (t.stride(0) if t.shape[0] > 1 else 0), t.stride(1), t.stride(2)


def launch(q, k, cos, sin, pos, interleaved: bool, backward: bool, qo, ko, copy_rest: bool) -> None:
    """Rotate q into qo and k into ko (any strides; qo / ko may be q / k themselves), the
    transposed rotation when ``backward``; columns R.. copied when ``copy_rest``."""
    b, hq, s, d = q.shape
    hk = k.shape[1]
    r = cos.shape[-1]
    if not (b * s) or not (hq or hk) or not d:
        return
    half, block_h, pass_block = _config(d, r, max(hq, hk))
    has_pos = pos is not None
    spb, sps = (0, 0)
    if has_pos:
        spb, sps = (pos.stride(0) if pos.shape[0] > 1 else 0), pos.stride(1)
    _rope_kernel[(b * s,)](
        q, qo, k, ko, cos, sin, pos if has_pos else cos,
        hq, hk, s, d, r, cos.shape[-2],
        *q.stride(), *qo.stride(), *k.stride(), *ko.stride(),
        *_cos_strides(cos, has_pos), *_cos_strides(sin, has_pos), spb, sps,
        HALF=half, BLOCK_H=block_h, PASS_BLOCK=pass_block, INTERLEAVED=interleaved, BACKWARD=backward,
        HAS_POS=has_pos, PASS=copy_rest and d > r, num_warps=4,
    )  # fmt: skip


def _empty(t: Tensor) -> Tensor:
    # In t's memory order where t is dense (a model's q is a transposed view of its (B, S,
    # H, D) projection): SDPA's cuDNN kernel lays its output out as q is laid out, so a
    # rotated q in (B, S, H, D) order makes the attention output's transpose back to (B, S,
    # H * D) a view, not a copy kept alive for the output projection's backward.
    return torch.empty_like(t, memory_format=torch.preserve_format)


# --------------------------------------------------------------------------- custom op


def _rotate(a: Tensor, b: Tensor, cos, sin, position_ids, interleaved: bool, backward: bool):
    ao, bo = _empty(a), _empty(b)
    launch(a, b, cos, sin, position_ids, interleaved, backward, ao, bo, True)
    return ao, bo


def _fwd(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, position_ids: Optional[Tensor], interleaved: bool
) -> tuple[Tensor, Tensor]:
    return _rotate(q, k, cos, sin, position_ids, interleaved, False)


def _bwd(
    dq: Tensor, dk: Tensor, cos: Tensor, sin: Tensor, position_ids: Optional[Tensor], interleaved: bool
) -> tuple[Tensor, Tensor]:
    return _rotate(dq, dk, cos, sin, position_ids, interleaved, True)


def _fake(q, k, cos, sin, position_ids, interleaved):
    return _empty(q), _empty(k)


def _save(inputs, out):
    q, k, cos, sin, pos, interleaved = inputs
    # (q's and k's shapes: a gradient autograd leaves undefined becomes zeros of them)
    return (cos, sin, pos), (interleaved, tuple(q.shape), tuple(k.shape), q.dtype)


def _bwd_args(saved, extra, dy):
    cos, sin, pos = saved
    interleaved, q_shape, k_shape, dtype = extra
    dq, dk = dy
    if dq is None:
        dq = torch.zeros(q_shape, dtype=dtype, device=cos.device)
    if dk is None:
        dk = torch.zeros(k_shape, dtype=dtype, device=cos.device)
    return dq, dk, cos, sin, pos, interleaved


def _sample_fwd(make):
    q, k, cos, sin = make.args(True)[:4]
    return q, k, cos, sin, None, False


def _sample_bwd(make):
    q, k, cos, sin = make.args(False)[:4]
    return torch.randn_like(q), torch.randn_like(k), cos, sin, None, True


_op = build(
    OpDecl(
        name="rope_triton",
        fwd=_fwd,
        bwd=_bwd,
        fwd_fake=_fake,
        bwd_fake=_fake,
        save=_save,
        bwd_args=_bwd_args,
        grads=lambda g, extra: (g[0], g[1], None, None, None, None),
        needs_grad=lambda q, k, *rest: q.requires_grad or k.requires_grad,
        samples=(_sample_fwd, _sample_bwd),
        triton=True,
        label="rope (triton)",
        outputs=2,
    )
)


def rope_triton(q, k, cos, sin, position_ids=None, *, layout="neox", inplace=False):
    """Triton: q and k rotated in one launch, fp32 math; backward the transposed rotation."""
    interleaved = layout == "interleaved"
    if not inplace:
        return _op(q, k, cos, sin, position_ids, interleaved)
    if torch.compiler.is_compiling():  # (the op declares no mutation: Inductor copies back)
        qr, kr = _op(q, k, cos, sin, position_ids, interleaved)
        q.copy_(qr)
        k.copy_(kr)
        return q, k
    launch(q, k, cos, sin, position_ids, interleaved, False, q, k, False)
    return q, k


rope_triton.custom_ops = _op.custom_ops
rope_triton.ops = _op.ops
rope_triton.forward_saving, rope_triton.backward_from = _op.forward_saving, _op.backward_from


_PTRS = ("q_ptr", "qo_ptr", "k_ptr", "ko_ptr", "cos_ptr", "sin_ptr")


def _kernel_specs(dtype: str):
    """For `kernellab asm`: the forward as launched for Llama-3-8B (32 heads of 128), neox,
    no ids."""
    half, block_h, pass_block = _config(128, 128, 32)
    cx = {"HALF": half, "BLOCK_H": block_h, "PASS_BLOCK": pass_block, "INTERLEAVED": False,
          "BACKWARD": False, "HAS_POS": False, "PASS": False}  # fmt: skip
    sig = {}
    for p in inspect.signature(_rope_kernel.fn).parameters:
        if p in cx:
            sig[p] = "constexpr"
        elif p in _PTRS:
            sig[p] = f"*{dtype}"
        elif p == "pos_ptr":
            sig[p] = f"*{dtype}"  # (unused without position ids: cos is passed)
        else:
            sig[p] = "i32"
    return [(_rope_kernel, sig, cx, 4)]


register_triton(
    "rope",
    rope_triton,
    _kernel_specs,
    "Triton: q and k in one launch through their strides, fp32 math; backward the transposed rotation",
)
