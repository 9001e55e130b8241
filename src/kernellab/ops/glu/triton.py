"""SwiGLU and GeGLU in Triton: kernels, launcher, custom ops, registration.

One streaming kernel each way, shared by both ops (``ACT``: silu, erf-GeLU, tanh-GeLU).
Forward reads a and b and writes y = act(a) * b: 3 accesses per element against 5 for
``F.silu(a) * b`` (which writes silu(a) and reads it back). Backward reads dy, a and b and
writes da = dy * b * act'(a) and db = dy * act(a): the activation is recomputed from a (a
few dozen flops per element, free under a memory-bound kernel) instead of being saved, so
the autograd node holds a and b only, the two tensors the MLP keeps alive anyway. Math in
fp32, one rounding per output to the input dtype.

BLOCK as gelu's: four 16-byte accesses per thread with 8 warps (fp32 4096, 16-bit 8192).
"""

from __future__ import annotations

import torch
import triton.language as tl
from torch import Tensor

from kernellab import triton_support
from kernellab.core.kit import OpDecl, build, empty_like_contig
from kernellab.ops._register import register_triton

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
def _glu_fwd_kernel(a_ptr, b_ptr, y_ptr, n, ACT: tl.constexpr, BLOCK: tl.constexpr):
    # a_ptr, b_ptr, y_ptr: contiguous, n elements, one fp32/fp16/bf16 dtype.
    pid = tl.program_id(0).to(tl.int64)  # int64: n may exceed 2^31
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(a_ptr + offs, mask=mask).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=mask).to(tl.float32)
    tl.store(y_ptr + offs, (_act(a, ACT) * b).to(y_ptr.dtype.element_ty), mask=mask)


@triton_support.jit
def _glu_bwd_kernel(dy_ptr, a_ptr, b_ptr, da_ptr, db_ptr, n, ACT: tl.constexpr, BLOCK: tl.constexpr):
    # da = dy * b * act'(a), db = dy * act(a); every pointer contiguous, n elements.
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    dy = tl.load(dy_ptr + offs, mask=mask).to(tl.float32)
    a = tl.load(a_ptr + offs, mask=mask).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=mask).to(tl.float32)
    y, d = _act_and_grad(a, ACT)
    tl.store(da_ptr + offs, (dy * b * d).to(da_ptr.dtype.element_ty), mask=mask)
    tl.store(db_ptr + offs, (dy * y).to(db_ptr.dtype.element_ty), mask=mask)


# --------------------------------------------------------------------------- launcher


def _launch(kernel, inputs, n_out: int, act: int, outs=None) -> list[Tensor]:
    """``kernel(*inputs, *outputs, n, ACT, BLOCK)`` over contiguous copies of ``inputs``
    (one shape and dtype: the validator's contract) into ``n_out`` fresh contiguous outputs,
    or into ``outs(contiguous inputs)`` (contiguous tensors of that shape and dtype)."""
    inputs = [t if t.is_contiguous() else t.contiguous() for t in inputs]
    outs = [torch.empty_like(inputs[0]) for _ in range(n_out)] if outs is None else outs(inputs)
    n = inputs[0].numel()
    if n:
        block = triton_support.block_for(inputs[0].element_size())
        kernel[(triton_support.cdiv(n, block),)](*inputs, *outs, n, ACT=act, BLOCK=block, num_warps=8)
    return outs


def _overlap(x: Tensor, y: Tensor) -> bool:
    # Whether two contiguous tensors' bytes overlap.
    nx, ny = x.numel() * x.element_size(), y.numel() * y.element_size()
    return x.data_ptr() < y.data_ptr() + ny and y.data_ptr() < x.data_ptr() + nx


def _bwd_inplace(dy: Tensor, a: Tensor, b: Tensor, act: int) -> tuple[Tensor, Tensor]:
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


# ``inplace_backward`` is in both schemas but only the eager backward acts on it (the
# kit's ``eager_bwd``): the ops never write into their inputs, they declare no mutation,
# and the registry callables pass False under torch.compile.


def _swiglu_fwd(a: Tensor, b: Tensor, inplace_backward: bool) -> Tensor:
    return _launch(_glu_fwd_kernel, (a, b), 1, ACT["silu"])[0]


def _swiglu_bwd(dy: Tensor, a: Tensor, b: Tensor, inplace_backward: bool) -> tuple[Tensor, Tensor]:
    da, db = _launch(_glu_bwd_kernel, (dy, a, b), 2, ACT["silu"])
    return da, db


def _swiglu_bwd_eager(dy, a, b, inplace_backward):
    if inplace_backward:
        return _bwd_inplace(dy, a, b, ACT["silu"])
    return _swiglu_bwd(dy, a, b, False)


def _geglu_fwd(a: Tensor, b: Tensor, approximate: str, inplace_backward: bool) -> Tensor:
    return _launch(_glu_fwd_kernel, (a, b), 1, ACT[approximate])[0]


def _geglu_bwd(
    dy: Tensor, a: Tensor, b: Tensor, approximate: str, inplace_backward: bool
) -> tuple[Tensor, Tensor]:
    da, db = _launch(_glu_bwd_kernel, (dy, a, b), 2, ACT[approximate])
    return da, db


def _geglu_bwd_eager(dy, a, b, approximate, inplace_backward):
    if inplace_backward:
        return _bwd_inplace(dy, a, b, ACT[approximate])
    return _geglu_bwd(dy, a, b, approximate, False)


def _pair_fake(t: Tensor) -> tuple[Tensor, Tensor]:
    return empty_like_contig(t), empty_like_contig(t)


def _inplace_hint(op: str) -> str:
    return (
        "a or b was modified in place after the forward: by the caller, or by this node's first "
        "backward, which with inplace_backward=True wrote the gradients into them; a second backward "
        f"through the same graph (retain_graph=True) needs {op}(..., inplace_backward=False)"
    )


_swiglu_call = build(
    OpDecl(
        name="swiglu_triton",
        label="swiglu (triton)",
        fwd=_swiglu_fwd,
        bwd=_swiglu_bwd,
        eager_bwd=_swiglu_bwd_eager,
        fwd_fake=lambda a, b, inplace_backward: empty_like_contig(a),
        bwd_fake=lambda dy, a, b, inplace_backward: _pair_fake(a),
        save=lambda inputs, out: ((inputs[0], inputs[1]), inputs[2]),  # a and b: act(a) is recomputed
        bwd_args=lambda saved, inplace, dy: (dy, *saved, inplace),
        grads=lambda g, extra: (g[0], g[1], None),
        needs_grad=lambda a, b, inplace_backward: a.requires_grad or b.requires_grad,
        samples=(lambda make: (make(1), make(1), False), lambda make: (make(0), make(0), make(0), False)),
        triton=True,
        inplace_hint=_inplace_hint("swiglu"),
    )
)

_geglu_call = build(
    OpDecl(
        name="geglu_triton",
        label="geglu (triton)",
        fwd=_geglu_fwd,
        bwd=_geglu_bwd,
        eager_bwd=_geglu_bwd_eager,
        fwd_fake=lambda a, b, approximate, inplace_backward: empty_like_contig(a),
        bwd_fake=lambda dy, a, b, approximate, inplace_backward: _pair_fake(a),
        save=lambda inputs, out: ((inputs[0], inputs[1]), inputs[2:]),
        bwd_args=lambda saved, extra, dy: (dy, *saved, *extra),
        grads=lambda g, extra: (g[0], g[1], None, None),
        needs_grad=lambda a, b, approximate, inplace_backward: a.requires_grad or b.requires_grad,
        samples=(lambda make: (make(1), make(1), "none", False),
                 lambda make: (make(0), make(0), make(0), "tanh", False)),  # fmt: skip
        triton=True,
        inplace_hint=_inplace_hint("geglu"),
    )
)
_is_compiling = torch.compiler.is_compiling


def swiglu_call(a: Tensor, b: Tensor, inplace_backward: bool = False) -> Tensor:
    """The registry callable of swiglu's Triton backend; ``inplace_backward`` (eager only)
    as the package docstring says: traced, the custom op gets False."""
    return _swiglu_call(a, b, inplace_backward and not _is_compiling())


def geglu_call(a: Tensor, b: Tensor, approximate: str = "none", inplace_backward: bool = False) -> Tensor:
    """The registry callable of geglu's Triton backend (the custom op takes ``approximate``
    and ``inplace_backward`` positionally; traced, the latter is False)."""
    return _geglu_call(a, b, approximate, inplace_backward and not _is_compiling())


for _call, _built in ((swiglu_call, _swiglu_call), (geglu_call, _geglu_call)):
    _call.custom_ops, _call.ops = _built.custom_ops, _built.ops
    _call.forward_saving, _call.backward_from = _built.forward_saving, _built.backward_from


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


register_triton(
    "swiglu", swiglu_call, kernel_specs(("silu",)),
    "Triton, one fused pass each way, silu recomputed in the backward",
)  # fmt: skip
register_triton(
    "geglu", geglu_call, kernel_specs(("none", "tanh")),
    "Triton, one fused pass each way, gelu recomputed in the backward",
)  # fmt: skip
