"""SwiGLU and GeGLU in Triton: kernels, launcher, the in-place backward, what `kernellab
asm` compiles; swiglu/triton.py and geglu/triton.py declare their custom ops over these and
register them.

One streaming kernel each way, shared by both ops (``ACT``: silu, erf-GeLU, tanh-GeLU).
Forward reads a and b and writes y = act(a) * b: 3 accesses per element against 5 for
``F.silu(a) * b`` (which writes silu(a) and reads it back). Backward reads dy, a and b and
writes da = dy * b * act'(a) and db = dy * act(a): the activation is recomputed from a (a
few dozen flops per element, free under a memory-bound kernel) instead of being saved, so
the autograd node holds a and b only, the two tensors the MLP keeps alive anyway. Math in
fp32, one rounding per output to the input dtype.

BLOCK as gelu's: four 16-byte accesses per thread with 8 warps (fp32 4096, 16-bit 8192);
tensors below SMALL_N elements take programs of SMALL_BLOCK elements (``launch_shape``).
"""

from __future__ import annotations

import torch
import triton.language as tl
from torch import Tensor

from kernellab import triton_support
from kernellab.core.kit import empty_like_contig
from kernellab.triton_support import load_block, store_block, stream_blocks

ACT = {"silu": 0, "none": 1, "tanh": 2}  # the ACT constexpr: silu, erf-GeLU, tanh-GeLU
_K = tl.constexpr(0.7978845608028654)  # sqrt(2/pi)
_C = tl.constexpr(0.044715)
_RSQRT2 = tl.constexpr(0.7071067811865476)
_RSQRT2PI = tl.constexpr(0.3989422804014327)


@triton_support.jit
def _sigmoid_pair(z):
    # (sigmoid(z), 1 - sigmoid(z)) without overflow or cancellation: t = exp(-|z|) <= 1,
    # q = 1 / (1 + t); sigmoid(z) = q for z >= 0, t q below, and 1 - sigmoid the other one.
    # (1 - s computed directly loses ~10 bits where s is near 1.)
    t = tl.exp(-tl.abs(z))
    q = 1.0 / (1.0 + t)
    return tl.where(z >= 0, q, t * q), tl.where(z >= 0, t * q, q)


@triton_support.jit
def _act(a, ACT: tl.constexpr):
    # act(a) in fp32. The formulas' own NaN at -inf (-inf * 0) is kept, as PyTorch's.
    if ACT == 0:
        s, _ = _sigmoid_pair(a)
        y = a * s
    elif ACT == 1:
        y = a * (0.5 + 0.5 * tl.math.erf(a * _RSQRT2))
    else:
        # tanh form as x * sigmoid(2u): the same function, no cancellation in 1 + tanh(u)
        u = _K * (a + _C * a * a * a)
        s, _ = _sigmoid_pair(2.0 * u)
        y = a * s
    return y


@triton_support.jit
def _act_and_grad(a, ACT: tl.constexpr):
    # (act(a), act'(a)) in fp32. At a = +-inf the derivative is NaN (inf * 0 in each
    # formula's derivative, as PyTorch's), not the limits 1 and 0.
    if ACT == 0:
        # silu' = s + a s (1 - s) = s (1 + a (1 - s))
        s, s1 = _sigmoid_pair(a)
        y = a * s
        d = s * (1.0 + a * s1)
    elif ACT == 1:
        # gelu' = Phi(a) + a phi(a)
        cdf = 0.5 + 0.5 * tl.math.erf(a * _RSQRT2)
        y = a * cdf
        d = cdf + a * (tl.exp(-0.5 * a * a) * _RSQRT2PI)
    else:
        # gelu' = s + 2 a s (1 - s) du/da with s = sigmoid(2u), as ops/gelu/triton.py
        u = _K * (a + _C * a * a * a)
        s, s1 = _sigmoid_pair(2.0 * u)
        y = a * s
        s1s = s * s1
        du = _K * (1.0 + 3.0 * _C * a * a)
        # s1s == 0 for |a| >~ 10, where du may overflow: the term is exactly 0 there
        d = s + tl.where(s1s > 0, 2.0 * a * s1s * du, 0.0)
        d = tl.where(tl.abs(a) == float("inf"), float("nan"), d)
    return y, d


@triton_support.jit
def _glu_fwd(args, offs, n, FULL: tl.constexpr):
    # One block (stream_blocks) of y = act(a) * b: every pointer contiguous, one
    # fp32/fp16/bf16 dtype.
    a_ptr, b_ptr, y_ptr, ACT = args
    a = load_block(a_ptr, offs, n, FULL).to(tl.float32)
    b = load_block(b_ptr, offs, n, FULL).to(tl.float32)
    store_block(y_ptr, offs, _act(a, ACT) * b, n, FULL)


@triton_support.jit
def _glu_fwd_kernel(a_ptr, b_ptr, y_ptr, n, ACT: tl.constexpr, BLOCK: tl.constexpr):
    stream_blocks(_glu_fwd, (a_ptr, b_ptr, y_ptr, ACT), n, BLOCK)


@triton_support.jit
def _glu_bwd(args, offs, n, FULL: tl.constexpr):
    # One block of da = dy * b * act'(a), db = dy * act(a); every pointer contiguous.
    dy_ptr, a_ptr, b_ptr, da_ptr, db_ptr, ACT = args
    dy = load_block(dy_ptr, offs, n, FULL).to(tl.float32)
    a = load_block(a_ptr, offs, n, FULL).to(tl.float32)
    b = load_block(b_ptr, offs, n, FULL).to(tl.float32)
    y, d = _act_and_grad(a, ACT)
    store_block(da_ptr, offs, dy * b * d, n, FULL)
    store_block(db_ptr, offs, dy * y, n, FULL)


@triton_support.jit
def _glu_bwd_kernel(dy_ptr, a_ptr, b_ptr, da_ptr, db_ptr, n, ACT: tl.constexpr, BLOCK: tl.constexpr):
    stream_blocks(_glu_bwd, (dy_ptr, a_ptr, b_ptr, da_ptr, db_ptr, ACT), n, BLOCK)


# --------------------------------------------------------------------------- launcher


def _launch(kernel, inputs, n_out: int, act: int, outs=None) -> list[Tensor]:
    """``kernel(*inputs, *outputs, n, ACT, BLOCK)`` over contiguous copies of ``inputs``
    (one shape and dtype: the validator's contract) into ``n_out`` fresh contiguous outputs,
    or into ``outs(contiguous inputs)`` (contiguous tensors of that shape and dtype)."""
    inputs = [t if t.is_contiguous() else t.contiguous() for t in inputs]
    outs = [torch.empty_like(inputs[0]) for _ in range(n_out)] if outs is None else outs(inputs)
    n = inputs[0].numel()
    if n:
        block, warps = launch_shape(n, inputs[0].element_size())
        triton_support.launch_flat(kernel, [*inputs, *outs], n, block, ACT=act, num_warps=warps)
    return outs


SMALL_N = 1 << 19  # below, programs of SMALL_BLOCK elements and SMALL_WARPS warps
SMALL_BLOCK = 1024
SMALL_WARPS = 16


def launch_shape(n: int, element_size: int) -> tuple[int, int]:
    """(BLOCK, num_warps) for n elements: ``block_for``'s with 8 warps, or below SMALL_N
    elements small programs of many warps, which spread a short tensor over more SMs and
    keep more loads in flight each (bf16 16384: 2 programs -> 16)."""
    if n < SMALL_N:
        return SMALL_BLOCK, SMALL_WARPS
    return triton_support.block_for(element_size), 8


def _overlap(x: Tensor, y: Tensor) -> bool:
    # Whether two contiguous tensors' bytes overlap.
    nx, ny = x.numel() * x.element_size(), y.numel() * y.element_size()
    return x.data_ptr() < y.data_ptr() + ny and y.data_ptr() < x.data_ptr() + nx


def bwd_inplace(dy: Tensor, a: Tensor, b: Tensor, act: int) -> tuple[Tensor, Tensor]:
    """The eager backward of ``inplace_backward=True``: da into a's buffer, db into b's.

    Safe because each program reads dy, a and b at its offsets before it stores da and db
    at the same offsets, and no other program touches them. Not safe when a and b share
    bytes (``swiglu(x, x)``: db would overwrite da) or dy shares a's or b's storage (at
    another offset, one program's store would change what another reads): then fresh
    outputs, as without the flag. A strided a or b is packed by
    the launcher into a private copy, which takes the gradient: the caller's strided
    tensor is never written (halves of a fused gate_up projection stay intact).

    a and b are the tensors the forward saved (the caller's, sharing its version
    counter); each one written gets a new version, so that another autograd node that
    saved it raises PyTorch's "modified by an inplace operation" error instead of reading
    a gradient as data, and so does a second backward through this node (re-raised with
    the op's inplace_hint)."""
    a_c = a if a.is_contiguous() else a.contiguous()
    b_c = b if b.is_contiguous() else b.contiguous()
    dy_c = dy if dy.is_contiguous() else dy.contiguous()
    shared = a.numel() > 0 and (
        _overlap(a_c, b_c) or (dy_c.untyped_storage().data_ptr() in
                               (a_c.untyped_storage().data_ptr(), b_c.untyped_storage().data_ptr()))
    )  # fmt: skip
    if shared:
        return tuple(_launch(_glu_bwd_kernel, (dy_c, a_c, b_c), 2, act))
    # detached: the gradient handed to autograd has no grad_fn and shares the buffer, so
    # that a leaf adopts it as .grad instead of cloning it
    da, db = a_c.detach(), b_c.detach()
    _launch(_glu_bwd_kernel, (dy_c, a_c, b_c), 2, act, outs=lambda _: (da, db))
    for t, c in ((a, a_c), (b, b_c)):
        if c is t:
            torch.autograd.graph.increment_version(t)
    return da, db


# --------------------------------------------------------------------------- custom ops


# The launchers of the ops' custom ops (``act``: an ACT value). ``inplace_backward`` is in
# both ops' schemas but only the eager backward acts on it (the kit's ``eager_bwd``): the
# ops never write into their inputs, they declare no mutation, and the registry callables
# pass False under torch.compile.


def glu_fwd(a: Tensor, b: Tensor, act: int) -> Tensor:
    """y = act(a) * b."""
    return _launch(_glu_fwd_kernel, (a, b), 1, act)[0]


def glu_bwd(dy: Tensor, a: Tensor, b: Tensor, act: int) -> tuple[Tensor, Tensor]:
    """(da, db) into fresh tensors."""
    da, db = _launch(_glu_bwd_kernel, (dy, a, b), 2, act)
    return da, db


def glu_bwd_eager(dy: Tensor, a: Tensor, b: Tensor, act: int, inplace_backward: bool):
    """The eager backward: into a's and b's buffers with ``inplace_backward``, else fresh."""
    if inplace_backward:
        return bwd_inplace(dy, a, b, act)
    return glu_bwd(dy, a, b, act)


def pair_fake(t: Tensor) -> tuple[Tensor, Tensor]:
    return empty_like_contig(t), empty_like_contig(t)


def inplace_hint(op: str) -> str:
    return (
        "a or b was modified in place after the forward: by the caller, or by this node's first "
        "backward, which with inplace_backward=True wrote the gradients into them; a second backward "
        f"through the same graph (retain_graph=True) needs {op}(..., inplace_backward=False)"
    )


def kernel_specs(acts):
    """For `kernellab asm`: both kernels as the launcher launches them, per activation."""

    def specs(dtype: str):
        block = triton_support.block_for({"fp32": 4, "fp16": 2, "bf16": 2}[dtype])
        out = []
        for act in acts:
            for k, ptrs in ((_glu_fwd_kernel, ("a_ptr", "b_ptr", "y_ptr")),
                            (_glu_bwd_kernel, ("dy_ptr", "a_ptr", "b_ptr", "da_ptr", "db_ptr"))):  # fmt: skip
                sig = {p: f"*{dtype}" for p in ptrs} | {"n": "i32", "ACT": "constexpr", "BLOCK": "constexpr"}
                out.append((k, sig, {"ACT": ACT[act], "BLOCK": block}, 8))
        return out

    return specs
