"""Attention in CUDA C++ (attention.cu, compiled by NVRTC): the cuda_v1 teaching kernel.

fp32, forward only: registered with ``differentiable = False`` (the check skips its
gradients; calling it on tensors that require grad raises instead of silently returning
a result autograd cannot differentiate). Head dims 16, 32, 64, 128.
"""

from __future__ import annotations

from pathlib import Path

import torch

from kernellab.core.registry import register
from kernellab.cuda.runtime import Module, ceil_div, nvrtc_unavailable
from kernellab.ops.attention.args import (
    check_dtype,
    check_head_dim,
    refuse_gqa,
    refuse_options,
    resolve_scale,
)

MODULE = Module(Path(__file__).with_name("attention.cu"))
HEAD_DIMS = (16, 32, 64, 128)
BR = 64  # query rows per thread block (attention.cu)
_SIG = ("ptr", "ptr", "ptr", "ptr", "ptr", "i32", "i32", "f32", "i32")


def forward_v1(q, k, v, causal: bool, scale: float):
    """(o, lse) with the v1 kernel; inputs made contiguous (BH, S, D) fp32."""
    lead, s_q, s_k, d = q.shape[:-2], q.shape[-2], k.shape[-2], q.shape[-1]
    q3, k3, v3 = (t.reshape((-1,) + tuple(t.shape[-2:])).contiguous() for t in (q, k, v))
    bh = q3.shape[0]
    o = torch.empty((bh, s_q, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((bh, s_q), dtype=torch.float32, device=q.device)
    if bh and s_q:
        if bh > 65535:
            raise ValueError(f"attention/cuda_v1: q has {bh} (batch x head) rows; at most 65535 (grid y)")
        kern = MODULE.kernel(f"attn_fwd_v1_d{d}", _SIG, q.device.index)
        kern((ceil_div(s_q, BR), bh), BR, q3, k3, v3, o, lse, s_q, s_k, float(scale), int(causal),
             device_index=q.device.index)  # fmt: skip
    return o.reshape(lead + (s_q, d)), lse.reshape(lead + (s_q,))


def cuda_v1_attention(q, k, v, causal: bool = False, scale=None, window=None, softcap=None):
    """CUDA v1: one query row per thread, K/V tiles in shared memory, online softmax (fp32, forward only)."""
    check_dtype(q, (torch.float32,), "cuda_v1")
    check_head_dim(q, HEAD_DIMS, "cuda_v1")
    refuse_gqa(q, k, "cuda_v1")
    refuse_options("cuda_v1", window, softcap, causal)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        raise NotImplementedError("attention/cuda_v1 is forward only: no gradient for q, k, v")
    return forward_v1(q, k, v, causal, resolve_scale(q, scale))[0]


cuda_v1_attention.differentiable = False


def _limits(q, k, v, causal: bool = False, scale=None, window=None, softcap=None) -> str | None:
    """What cuda_v1 refuses by design (``Impl.limits``: check counts these as refused):
    GQA, a window, a softcap (head dims and dtypes are declared through HEAD_DIMS / dtypes)."""
    try:
        check_head_dim(q, HEAD_DIMS, "cuda_v1")
        refuse_gqa(q, k, "cuda_v1")
        refuse_options("cuda_v1", window, softcap, causal)
    except ValueError as e:
        return str(e)
    return None

register(
    "attention",
    "cuda_v1",
    devices=("cuda",),
    available=nvrtc_unavailable,
    precompile=MODULE.precompile,
    dtypes=(torch.float32,),
    builtin=True,
    module=MODULE,
    limits=_limits,
    description="CUDA v1: one query row per thread, K/V tiles in shared memory, online softmax (fp32, fwd only)",
)(cuda_v1_attention)
