"""RoPE in Triton: one kernel rotates q and k in one launch; the backward is the same
kernel with the transposed rotation.

A program rotates BLOCK_R rows (one row: one token of one head, D values) of q or of k:
the first programs take q's rows, the rest k's (GQA: k has its own head count). Each row
reads its two column sets (neox: i and i + R/2; interleaved: 2i and 2i + 1) and the
matching columns of cos and sin at its position (the token's index, or its id in
``position_ids``), computes in fp32 and rounds once to the output dtype; columns R..D-1
are copied (out of place) or left alone (in place). Napkin math for bf16 Llama-3-8B at
4 x 2048 tokens (32 q + 8 kv heads of 128): 2 x 40 MiB read and written, cos / sin
2 x 0.5 MiB read once from memory and then from L2 by the other heads: the op runs at the
copy ceiling when its accesses are wide, so q and k are read through their strides (a
transposed (B, S, H, D) projection or a fused qkv view is never packed first: a packing
copy would double the traffic).

The transposed rotation: forward y1 = x1 c1 - x2 s1, y2 = x2 c2 + x1 s2 (c1, s1: cos and
sin at x1's columns; c2, s2 at x2's); backward dx1 = dy1 c1 + dy2 s2, dx2 = dy2 c2 - dy1
s1, i.e. the forward formula with (s1, s2) replaced by (-s2, -s1). With HF's cos / sin
(both halves equal) that is the rotation by -sin.
"""

from __future__ import annotations

import inspect
from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernellab import triton_support
from kernellab.ops.kit import OpDecl, build


@triton.jit
def _rotate_rows(
    x_ptr, y_ptr, cos_ptr, sin_ptr, pos_ptr,
    row0, n_rows, H, S, D, R, P,
    sxb, sxh, sxs, sxd,  # x (B, H, S, D) strides, elements
    syb, syh, sys, syd,  # y strides (y may be x: in place)
    scb, scs, scd,  # cos strides: batch (0: one batch shared), row, column
    ssb, sss, ssd,  # sin strides
    spb, sps,  # position_ids (B or 1, S) strides (spb 0: one row shared)
    BLOCK_R: tl.constexpr, HALF: tl.constexpr, PASS_BLOCK: tl.constexpr,
    INTERLEAVED: tl.constexpr, BACKWARD: tl.constexpr, HAS_POS: tl.constexpr, PASS: tl.constexpr,
):  # fmt: skip
    rows = row0 + tl.arange(0, BLOCK_R).to(tl.int64)  # int64: rows * strides may pass 2^31
    rmask = rows < n_rows
    hs = H * S
    b = rows // hs
    h = (rows // S) % H
    s = rows % S
    if HAS_POS:
        p = tl.load(pos_ptr + b * spb + s * sps, mask=rmask, other=0).to(tl.int64)
        pok = (p >= 0) & (p < P)
        p = tl.where(pok, p, 0)  # a bad id never becomes an address (its row gives NaN below)
    else:
        p = s
    i = tl.arange(0, HALF)
    half = R // 2
    if INTERLEAVED:
        c1 = 2 * i
        c2 = 2 * i + 1
    else:
        c1 = i
        c2 = i + half
    m = rmask[:, None] & (i < half)[None, :]
    xrow = (b * sxb + h * sxh + s * sxs)[:, None]
    yrow = (b * syb + h * syh + s * sys)[:, None]
    crow = (b * scb + p * scs)[:, None]
    srow = (b * ssb + p * sss)[:, None]
    x1 = tl.load(x_ptr + xrow + c1[None, :] * sxd, mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + xrow + c2[None, :] * sxd, mask=m, other=0.0).to(tl.float32)
    cos1 = tl.load(cos_ptr + crow + c1[None, :] * scd, mask=m, other=0.0).to(tl.float32)
    cos2 = tl.load(cos_ptr + crow + c2[None, :] * scd, mask=m, other=0.0).to(tl.float32)
    sin1 = tl.load(sin_ptr + srow + c1[None, :] * ssd, mask=m, other=0.0).to(tl.float32)
    sin2 = tl.load(sin_ptr + srow + c2[None, :] * ssd, mask=m, other=0.0).to(tl.float32)
    if HAS_POS:
        bad = (pok == 0)[:, None]
        cos1 = tl.where(bad, float("nan"), cos1)
        cos2 = tl.where(bad, float("nan"), cos2)
    if BACKWARD:
        sa = -sin2
        sb = -sin1
    else:
        sa = sin1
        sb = sin2
    y1 = x1 * cos1 - x2 * sa
    y2 = x2 * cos2 + x1 * sb
    ty = y_ptr.dtype.element_ty
    tl.store(y_ptr + yrow + c1[None, :] * syd, y1.to(ty), mask=m)
    tl.store(y_ptr + yrow + c2[None, :] * syd, y2.to(ty), mask=m)
    if PASS:  # columns R .. D-1 unchanged (the gradient there is dy itself)
        j = R + tl.arange(0, PASS_BLOCK)
        pm = rmask[:, None] & (j < D)[None, :]
        v = tl.load(x_ptr + xrow + j[None, :] * sxd, mask=pm, other=0.0)
        tl.store(y_ptr + yrow + j[None, :] * syd, v.to(ty), mask=pm)


@triton_support.jit
def _rope_kernel(
    q_ptr, qo_ptr, k_ptr, ko_ptr, cos_ptr, sin_ptr, pos_ptr,
    n_q, n_k, tiles_q, HQ, HK, S, D, R, P,
    sqb, sqh, sqs, sqd,  # q strides (elements)
    sqob, sqoh, sqos, sqod,  # q output strides
    skb, skh, sks, skd,  # k strides
    skob, skoh, skos, skod,  # k output strides
    scb, scs, scd, ssb, sss, ssd, spb, sps,  # cos, sin, position_ids strides
    BLOCK_R: tl.constexpr, HALF: tl.constexpr, PASS_BLOCK: tl.constexpr,
    INTERLEAVED: tl.constexpr, BACKWARD: tl.constexpr, HAS_POS: tl.constexpr, PASS: tl.constexpr,
):  # fmt: skip
    # Programs [0, tiles_q) rotate BLOCK_R rows of q each, the others rows of k.
    pid = tl.program_id(0)
    if pid < tiles_q:
        _rotate_rows(
            q_ptr, qo_ptr, cos_ptr, sin_ptr, pos_ptr, pid.to(tl.int64) * BLOCK_R, n_q, HQ, S, D, R, P,
            sqb, sqh, sqs, sqd, sqob, sqoh, sqos, sqod, scb, scs, scd, ssb, sss, ssd, spb, sps,
            BLOCK_R, HALF, PASS_BLOCK, INTERLEAVED, BACKWARD, HAS_POS, PASS,
        )  # fmt: skip
    else:
        _rotate_rows(
            k_ptr, ko_ptr, cos_ptr, sin_ptr, pos_ptr, (pid - tiles_q).to(tl.int64) * BLOCK_R,
            n_k, HK, S, D, R, P,
            skb, skh, sks, skd, skob, skoh, skos, skod, scb, scs, scd, ssb, sss, ssd, spb, sps,
            BLOCK_R, HALF, PASS_BLOCK, INTERLEAVED, BACKWARD, HAS_POS, PASS,
        )  # fmt: skip


# --------------------------------------------------------------------------- launcher


def _config(d: int, r: int) -> tuple[int, int, int]:
    """(BLOCK_R, HALF, PASS_BLOCK): the row tile holds ~2048 values of the widest column
    set (16 per thread with 4 warps), at most 64 rows."""
    half = triton_support.next_pow2(max(1, r // 2))
    pass_block = triton_support.next_pow2(d - r) if d > r else 1
    width = max(2 * half, pass_block)
    return max(1, min(64, 2048 // width)), half, pass_block


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
    n_q, n_k = b * hq * s, b * hk * s
    if not (n_q or n_k) or not d:
        return
    block_r, half, pass_block = _config(d, r)
    tiles_q, tiles_k = triton_support.cdiv(n_q, block_r), triton_support.cdiv(n_k, block_r)
    has_pos = pos is not None
    spb, sps = (0, 0)
    if has_pos:
        spb, sps = (pos.stride(0) if pos.shape[0] > 1 else 0), pos.stride(1)
    _rope_kernel[(tiles_q + tiles_k,)](
        q, qo, k, ko, cos, sin, pos if has_pos else cos,
        n_q, n_k, tiles_q, hq, hk, s, d, r, cos.shape[-2],
        *q.stride(), *qo.stride(), *k.stride(), *ko.stride(),
        *_cos_strides(cos, has_pos), *_cos_strides(sin, has_pos), spb, sps,
        BLOCK_R=block_r, HALF=half, PASS_BLOCK=pass_block, INTERLEAVED=interleaved, BACKWARD=backward,
        HAS_POS=has_pos, PASS=copy_rest and d > r, num_warps=4,
    )  # fmt: skip


def _empty(t: Tensor) -> Tensor:
    return torch.empty(t.shape, dtype=t.dtype, device=t.device)


# --------------------------------------------------------------------------- custom op


def _fwd(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, position_ids: Optional[Tensor], interleaved: bool
) -> tuple[Tensor, Tensor]:
    qo, ko = _empty(q), _empty(k)
    launch(q, k, cos, sin, position_ids, interleaved, False, qo, ko, True)
    return qo, ko


def _bwd(
    dq: Tensor, dk: Tensor, cos: Tensor, sin: Tensor, position_ids: Optional[Tensor], interleaved: bool
) -> tuple[Tensor, Tensor]:
    gq, gk = _empty(dq), _empty(dk)
    launch(dq, dk, cos, sin, position_ids, interleaved, True, gq, gk, True)
    return gq, gk


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
    """For `kernellab asm`: the forward as launched for Llama's head dim 128, neox, no ids."""
    block_r, half, pass_block = _config(128, 128)
    cx = {"BLOCK_R": block_r, "HALF": half, "PASS_BLOCK": pass_block, "INTERLEAVED": False,
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


triton_support.register_triton(
    "rope",
    rope_triton,
    _kernel_specs,
    "Triton: q and k in one launch through their strides, fp32 math; backward the transposed rotation",
)
