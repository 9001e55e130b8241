"""Local block attention for the ring: the pluggable pair

    forward(q, k, v, causal, scale) -> (o, lse)
    backward(do, q, k, v, o, lse, causal, scale[, on_dkdv]) -> (dq, dk, dv)

q (..., S_q, D), k and v (..., S_k, D) with the same leading dims; ``lse`` is the
log-sum-exp of the scaled scores in NATURAL-log units, shape (..., S_q). Causal is only
ever asked for with S_q == S_k (layouts.block_calls), the square lower triangle. A row
with no allowed key gives o = 0, lse = -inf.

The backward is FlashAttention-2's: P = exp(S * scale - lse), delta = rowsum(dO * O),
dS = P (dP - delta). Given the GLOBAL (merged) o and lse of the rows rather than this
block's own, P is exactly the global softmax restricted to this block's keys and delta is
the global one, so each block's (dq, dk, dv) is its exact share of the true gradient and
the ring just sums the shares.

``on_dkdv`` (when ``BlockFns.early_dkdv``): the backward calls ``on_dkdv(dk, dv)`` once, as
soon as dk and dv are final and before it computes dq, so that the ring can send the dK/dV
accumulators on while dq computes (dq is 3 of the backward's 7 matmuls: at 16k tokens per
GPU, ~6 ms of compute behind a ~0.7 ms hop). Both implementations here do; a user's
``BlockFns`` without it gets ``on_dkdv`` called by the ring after its backward returns.

Three implementations: ``TORCH`` (PyTorch ops, math in at least fp32, float64 for float64
inputs: what the CPU tests use), ``CUDNN`` (PyTorch's cuDNN attention kernels, fp16 / bf16 on
CUDA) and ``TRITON`` (kernellab's FlashAttention-2 kernels,
whose LSE is in log2 units: natural = log2-LSE * ln 2, converted here both ways). The
round trip costs about one fp32 rounding of the exponent (|lse| * 6e-8 relative on each
recomputed probability): nothing next to bf16's 4e-3, visible only for fp32 inputs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

LN2 = math.log(2.0)
LOG2E = 1.0 / LN2


@dataclass(frozen=True)
class BlockFns:
    name: str
    forward: Callable
    backward: Callable
    early_dkdv: bool = False  # backward takes on_dkdv (module docstring)


def math_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulation dtype: fp32 for 16-bit and fp32 inputs, float64 for float64."""
    return torch.promote_types(dtype, torch.float32)


# --------------------------------------------------------------------------- PyTorch


def _scores(q, k, causal: bool, scale: float, f: torch.dtype) -> torch.Tensor:
    s = torch.matmul(q.to(f), k.to(f).transpose(-1, -2)) * scale
    if causal:
        s_q, s_k = q.shape[-2], k.shape[-2]
        allowed = torch.ones(s_q, s_k, dtype=torch.bool, device=q.device).tril(diagonal=s_k - s_q)
        s = s.masked_fill(~allowed, float("-inf"))
    return s


def _probs(s: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    # Rows without keys have lse = -inf and every score -inf: subtract 0 there, so
    # exp(-inf) = 0 instead of exp(nan).
    lse = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    return torch.exp(s - lse.unsqueeze(-1))


def torch_block_forward(q, k, v, causal: bool, scale: float):
    f = math_dtype(q.dtype)
    s = _scores(q, k, causal, scale, f)
    lse = torch.logsumexp(s, dim=-1)
    return torch.matmul(_probs(s, lse), v.to(f)), lse


def torch_block_backward(do, q, k, v, o, lse, causal: bool, scale: float, on_dkdv=None):
    f = math_dtype(q.dtype)
    p = _probs(_scores(q, k, causal, scale, f), lse.to(f))
    dof = do.to(f)
    delta = (dof * o.to(f)).sum(-1, keepdim=True)
    dv = torch.matmul(p.transpose(-1, -2), dof)
    ds = p * (torch.matmul(dof, v.to(f).transpose(-1, -2)) - delta)
    dk = torch.matmul(ds.transpose(-1, -2), q.to(f)) * scale
    if on_dkdv is not None:
        on_dkdv(dk, dv)
    dq = torch.matmul(ds, k.to(f)) * scale
    return dq, dk, dv


TORCH = BlockFns("torch", torch_block_forward, torch_block_backward, early_dkdv=True)


# --------------------------------------------------------------------------- Triton


def triton_block_forward(q, k, v, causal: bool, scale: float):
    """kernellab's Triton forward (``ops.attention.triton.forward_into``) writing o in
    fp32: the kernel accumulates in fp32 and rounds only at its store, so a bf16 o would
    round every block's partial result before the merge. Partial outputs are normalized
    over fewer keys than the final one (magnitude ~ sqrt(W) larger for random V), so those
    roundings would add up to ~1.4x the single device's error at W = 4;
    in fp32 the ring rounds once, at the end, like the single device. Cost: o_b written in
    4 bytes instead of 2 (B=1 H=32 S=16k D=128: 256 MB, ~0.1 ms against ~5 ms of compute)."""
    from kernellab.ops.attention import triton as tri

    o = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    o, lse2 = tri.forward_into(q, k, v, causal, scale, o)
    return o, lse2 * LN2  # log2 units -> natural


def triton_block_backward(do, q, k, v, o, lse, causal: bool, scale: float, on_dkdv=None):
    from kernellab.ops.attention import triton as tri

    # The kernels read lse as a contiguous fp32 (..., S_q) in log2 units, and o / dO in
    # q's dtype (delta = rowsum(dO * O) is computed from them in fp32). dq, dk, dv are
    # written in fp32 (the kernels accumulate in fp32 and round at the store): the ring
    # sums W shares of each, and bf16 shares would be rounded W times instead of once.
    # exact_stats=False: P comes from the merged (global) lse, over keys this block does
    # not hold; fp32's recompute from this block's keys alone would normalize P wrongly.
    lse2 = (lse.float() * LOG2E).contiguous()
    # on_dkdv: called between the dk/dv kernels and the dq kernel (backward_into's after_dkdv).
    dq, dk, dv = (torch.empty(t.shape, dtype=torch.float32, device=t.device) for t in (q, k, v))
    after = None if on_dkdv is None else (lambda: on_dkdv(dk, dv))
    return tri.backward_into(
        do.to(q.dtype), q, k, v, o.to(q.dtype), lse2, causal, scale, dq, dk, dv, exact_stats=False,
        after_dkdv=after,
    )  # fmt: skip


TRITON = BlockFns("triton", triton_block_forward, triton_block_backward, early_dkdv=True)


# --------------------------------------------------------------------------- cuDNN


def _bhsd(t: torch.Tensor) -> torch.Tensor:
    """(..., S, D) -> a contiguous (1, N, S, D): cuDNN's attention takes four dims (the
    grouped, expanded K/V of a GQA call become real copies here)."""
    return t.reshape(1, -1, *t.shape[-2:]).contiguous()


# device -> (philox seed, philox offset, whether the LSE came as (B, H, S, 1)) of a cuDNN
# forward: with dropout 0 the backward only binds the seed and offset, and takes the LSE in
# the forward's rank
_CUDNN_FWD: dict = {}


def _cudnn_fwd(q4, k4, v4, causal: bool, scale: float):
    out = torch.ops.aten._scaled_dot_product_cudnn_attention(
        q4, k4, v4, None, True, 0.0, causal, False, scale=scale
    )
    o, lse = out[0], out[1]
    _CUDNN_FWD[q4.device] = (out[6], out[7], lse.dim() == 4)
    return o, lse


def cudnn_block_forward(q, k, v, causal: bool, scale: float):
    """PyTorch's cuDNN attention (``aten._scaled_dot_product_cudnn_attention``, the kernel
    PyTorch's own context parallel runs on Hopper). o comes back in q's dtype, rounded once
    per block before the ring's fp32 merge (the Triton blocks keep it in fp32); lse in
    natural-log units, as the ring wants."""
    o, lse = _cudnn_fwd(_bhsd(q), _bhsd(k), _bhsd(v), causal, scale)
    return o.reshape(q.shape[:-1] + (v.shape[-1],)), lse.reshape(q.shape[:-1])


def cudnn_block_backward(do, q, k, v, o, lse, causal: bool, scale: float, on_dkdv=None):
    """cuDNN's attention backward given the global o and lse (the module docstring); dq,
    dk, dv come back in q's dtype. One kernel computes all three, so ``on_dkdv`` (if any)
    is called after it."""
    q4, k4, v4 = _bhsd(q), _bhsd(k), _bhsd(v)
    if q4.device not in _CUDNN_FWD:  # the seed / offset tensors and the LSE's rank come from a forward
        _cudnn_fwd(q4[..., :1, :], k4[..., :1, :], v4[..., :1, :], False, scale)
    seed, offset, lse_4d = _CUDNN_FWD[q4.device]
    lse4 = lse.float().reshape(q4.shape[:-1]).contiguous()
    if lse_4d:
        lse4 = lse4.unsqueeze(-1)
    o4 = _bhsd(o.to(q.dtype))
    dq, dk, dv = torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
        _bhsd(do.to(q.dtype)), q4, k4, v4, o4, lse4, seed, offset, None, None, None,
        q4.shape[-2], k4.shape[-2], 0.0, causal, scale=scale,
    )  # fmt: skip
    dq, dk, dv = dq.reshape(q.shape), dk.reshape(k.shape), dv.reshape(v.shape)
    if on_dkdv is not None:
        on_dkdv(dk, dv)
    return dq, dk, dv


CUDNN = BlockFns("cudnn", cudnn_block_forward, cudnn_block_backward, early_dkdv=False)
CUDNN_DTYPES = (torch.float16, torch.bfloat16)
CUDNN_HEAD_DIMS = tuple(range(8, 129, 8))


def cudnn_available(q: torch.Tensor) -> bool:
    """Whether the cuDNN blocks take q: a CUDA tensor in fp16 / bf16, head dim a multiple of 8
    up to 128, and this PyTorch built with cuDNN."""
    return (
        q.is_cuda
        and q.dtype in CUDNN_DTYPES
        and q.shape[-1] in CUDNN_HEAD_DIMS
        and torch.backends.cudnn.is_available()
    )


TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
TRITON_HEAD_DIMS = tuple(range(8, 257, 8))  # ops.attention.triton.HEAD_DIMS (imported lazily there)


def default_blocks(q: torch.Tensor) -> BlockFns:
    """cuDNN on CUDA tensors it takes (fp16 / bf16, D a multiple of 8 up to 128: on an H200
    its blocks made the simulated ring's compute 17-25% shorter than Triton's at 8k-16k
    tokens per GPU), else Triton on CUDA tensors it supports (fp32, D up to 256), PyTorch
    elsewhere (the CPU, float64). cuDNN rounds each block's o and dq / dk / dv to the
    inputs' dtype before the ring sums them in fp32 (Triton's are written in fp32): the
    ring's error grows with W a little faster (dk within 1.73x the single device's at W=4,
    bf16); ``blocks="triton"`` keeps one rounding."""
    if cudnn_available(q):
        return CUDNN
    if q.is_cuda and q.dtype in TRITON_DTYPES and q.shape[-1] in TRITON_HEAD_DIMS:
        return TRITON
    return TORCH


NAMED = {"torch": TORCH, "triton": TRITON, "cudnn": CUDNN}


def check_blocks(blocks):
    """``blocks`` itself if it names block kernels (None, a name of NAMED or a BlockFns),
    else a ValueError naming the argument."""
    if blocks is None or isinstance(blocks, BlockFns) or (isinstance(blocks, str) and blocks in NAMED):
        return blocks
    raise ValueError(f"blocks must be None, 'torch', 'triton', 'cudnn' or a BlockFns, got {blocks!r}")


def resolve_blocks(blocks, q: torch.Tensor) -> BlockFns:
    if check_blocks(blocks) is None:
        return default_blocks(q)
    return blocks if isinstance(blocks, BlockFns) else NAMED[blocks]
