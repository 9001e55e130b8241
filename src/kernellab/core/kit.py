"""The op kit: one declaration of a backend's launchers yields everything PyTorch and the
registry need from it.

A backend hands ``build`` an :class:`OpDecl`: its forward and backward launchers (type
annotated: their annotations are the custom ops' schemas), fake kernels, and four small
functions that say what the forward saves and how the backward's results map back onto
the inputs. ``build`` returns the registry callable and makes, once:

- the custom ops ``kernellab::<name>`` and ``kernellab::<name>_backward``. A Triton backend
  on a GPU is registered through ``torch.library.triton_op``: under ``torch.compile``
  Inductor traces the launcher, sees the Triton kernels (``triton_support.jit`` routes
  traced launches through ``wrap_triton``) and launches them from its own generated code
  (its launcher, its CUDA graphs). CUDA (NVRTC) backends, and Triton on a machine without
  a GPU, are ``custom_op`` with the declared fake kernels.
- autograd for the custom op (used under torch.compile);
- the eager path: an ``autograd.Function`` around the same launchers when a gradient is
  needed, the forward launcher alone when none is. The dispatcher and the custom op's
  Python autograd cost tens of microseconds per call on the host, several times a torch
  op's, so eager calls skip them;
  ``opcheck`` verifies the custom ops, the check engine the eager path.
- ``custom_ops`` samples for ``opcheck``.

Double backward: a fused backward kernel has no derivative of its own; the eager path
raises a RuntimeError naming the op when its backward runs with ``create_graph=True``
(``once_differentiable`` misses the case a gradient penalty hits: a constant ``dy``, and
the term through the saved input is dropped without a word); the backward custom op has
no autograd, so PyTorch refuses to differentiate through it.

Composed backward (``OpDecl.backward`` instead of ``bwd``): where the gradient is a few
calls rather than a kernel of its own - matmul's dA = dC @ B^T and dB = A^T @ dC through
the same backend's forward, sum's dy broadcast, max's dy written at the chosen index -
the backend declares ``backward(fwd, saved, extra, dy, need) -> one gradient (or None)
per input``. ``fwd`` is the forward to compose with: the custom op under torch.compile,
and in eager mode when the backward is itself differentiated (``create_graph=True``:
the op's registered autograd then makes second derivatives exact); the launcher
directly otherwise (no dispatcher). ``need`` is autograd's ``needs_input_grad`` (None
from ``backward_from``: every gradient). No backward custom op is made, and double
backward is not refused: every call in it is differentiable.

Every op built here has ``OpDecl.outputs`` differentiable outputs (the first ones; one
unless declared: the residual add + layer norm has two, the normalized rows and the sum);
the others (saved row statistics) are returned by the custom op for its autograd and not
shown to the user. With several, the user gets a tuple, and ``bwd_args`` and
``backward_from`` receive a tuple of their gradients (None where autograd has none).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from kernellab import device as _device


@dataclass(frozen=True)
class OpDecl:
    """What a backend declares.

    name:        custom-op name (``kernellab::<name>``, ``kernellab::<name>_backward``).
    fwd:         forward launcher; annotated (the schema); returns a Tensor or a tuple whose
                 first element is the user's output.
    fwd_fake:    fake kernel of ``fwd`` (shapes and dtypes only) for custom_op registration.
    save:        ``(inputs, outputs) -> (tensors, extra)``: what the forward keeps for the
                 backward (``outputs`` is always a tuple); ``extra`` is any non-tensor value.
    needs_grad:  ``(*inputs) -> bool``: whether any differentiable input requires grad.
    samples:     ``(fwd sample, bwd sample)`` for opcheck: ``make -> args`` each; with
                 ``backward``, forward samples only (one or more).

    The backward, one of two ways:
    bwd:         backward launcher; annotated; returns a Tensor or tuple of gradients; None
                 when the gradients are ``dy`` itself (add: no backward kernel, no op).
    bwd_fake:    its fake kernel.
    bwd_args:    ``(saved tensors, extra, dy) -> args`` of ``bwd``.
    grads:       ``(bwd result as a tuple, extra) -> one gradient (or None) per input``.
    or
    backward:    the composed backward (module docstring):
                 ``(fwd, saved tensors, extra, dy, need) -> one gradient (or None) per input``.

    triton:      whether the launchers are Triton (triton_op on a GPU).
    label:       the op as user-facing messages name it (default ``name``), e.g.
                 ``"attention (triton)"``.
    eager_bwd:   the backward launcher of the eager path and ``backward_from`` (default
                 ``bwd``; same arguments). It may do what a custom op's schema cannot
                 say: cross_entropy's writes the gradient into the saved logits when the
                 caller asked for ``inplace_backward`` (the op, which declares no
                 mutation, never does).
    outputs:     how many of the forward's first outputs the user gets and differentiates
                 (module docstring).
    inplace_hint: what the eager backward's error says when a tensor it saved was modified
                 in place after the forward (PyTorch's version-counter error, re-raised
                 naming the op): which tensors those are and what to do instead.
    """

    name: str
    fwd: Callable
    fwd_fake: Callable
    save: Callable
    needs_grad: Callable
    samples: tuple
    bwd: Callable | None = None
    bwd_fake: Callable | None = None
    bwd_args: Callable | None = None
    grads: Callable | None = None
    backward: Callable | None = None
    triton: bool = False
    label: str | None = None
    eager_bwd: Callable | None = None
    outputs: int = 1
    inplace_hint: str | None = None


# Every declaration ``build`` was given, by name: what a test needs to build a backend's
# custom ops again the way another machine would (``triton_op`` on a GPU).
DECLS: dict[str, OpDecl] = {}


def _use_triton_op(decl: OpDecl) -> bool:
    return (
        decl.triton
        and not _device.triton_interpreted()
        and hasattr(torch.library, "triton_op")
    )


def _as_tuple(out) -> tuple:
    return out if isinstance(out, tuple) else (out,)


def build(decl: OpDecl) -> Callable:
    """The registry callable of ``decl`` (see the module docstring); it carries
    ``custom_ops`` (for opcheck) and ``ops`` (the forward and backward custom ops)."""
    fwd, bwd, save, bwd_args, grads = decl.fwd, decl.bwd, decl.save, decl.bwd_args, decl.grads
    composed = decl.backward
    if (composed is None) == (grads is None) or (composed is not None and bwd is not None):
        raise ValueError(f"{decl.name}: declare a backward launcher (bwd, bwd_args, grads) or a backward")
    qual = f"kernellab::{decl.name}"
    DECLS[decl.name] = decl
    bop = None
    if _use_triton_op(decl):
        op = torch.library.triton_op(qual, fwd, mutates_args=())
        if bwd is not None:
            bop = torch.library.triton_op(f"{qual}_backward", bwd, mutates_args=())
    else:
        op = torch.library.custom_op(qual, fwd, mutates_args=())
        op.register_fake(decl.fwd_fake)
        if bwd is not None:
            bop = torch.library.custom_op(f"{qual}_backward", bwd, mutates_args=())
            bop.register_fake(decl.bwd_fake)
    if bwd is None and composed is None:  # the gradient is dy itself: no kernel
        bwd = bop = lambda *args: args
    ebwd = decl.eager_bwd or bwd

    def setup_context(ctx, inputs, output):
        tensors, ctx.extra = save(inputs, _as_tuple(output))
        ctx.save_for_backward(*tensors)

    n_out = decl.outputs

    def op_backward(ctx, dy, *more):
        if n_out > 1:
            dy = (dy, *more[: n_out - 1])
        if composed is not None:
            return composed(op, ctx.saved_tensors, ctx.extra, dy, ctx.needs_input_grad)
        return grads(_as_tuple(bop(*bwd_args(ctx.saved_tensors, ctx.extra, dy))), ctx.extra)

    op.register_autograd(op_backward, setup_context=setup_context)
    single = None  # whether fwd returns one Tensor (set at the first call)

    grad_enabled = torch.is_grad_enabled

    class Eager(torch.autograd.Function):
        # (type(out) is tuple inline, not _as_tuple: this runs on every eager call)
        @staticmethod
        def forward(ctx, *inputs):
            out = fwd(*inputs)
            if type(out) is not tuple:
                out = (out,)
            tensors, ctx.extra = save(inputs, out)
            ctx.save_for_backward(*tensors)
            return out[0] if n_out == 1 else out[:n_out]

        @staticmethod
        def backward(ctx, dy, *more):  # grad mode is on here exactly when create_graph=True
            differentiated = grad_enabled()
            if differentiated and composed is None:
                raise RuntimeError(refusal)
            if n_out > 1:
                dy = (dy, *more[: n_out - 1])
            try:
                saved = ctx.saved_tensors
            except RuntimeError as e:  # a saved tensor modified in place since the forward
                if decl.inplace_hint is None or "modified by an inplace operation" not in str(e):
                    raise
                raise RuntimeError(f"{decl.label or decl.name}: {decl.inplace_hint} (PyTorch: {e})") from None
            if composed is not None:
                return composed(op if differentiated else fwd, saved, ctx.extra, dy, ctx.needs_input_grad)
            g = ebwd(*bwd_args(saved, ctx.extra, dy))
            return grads(g if type(g) is tuple else (g,), ctx.extra)

    # (once_differentiable would let a second differentiation through silently when dy is
    # a constant, as in a gradient penalty: the term through the saved input is lost.)
    refusal = (
        f"{decl.label or decl.name}: double backward (create_graph=True) is not supported by this "
        "backend (its backward is a fused kernel with no derivative); use backend='torch' or 'manual'"
    )
    needs_grad = decl.needs_grad
    is_compiling = torch.compiler.is_compiling
    # autograd.Function.apply's Python layer binds default arguments (we define no
    # setup_context) and unwraps dead functorch wrappers (only under functorch transforms,
    # where it is kept); outside transforms the C apply it ends in is called directly.
    c_apply = super(torch.autograd.Function, Eager).apply
    functorch_active = torch._C._are_functorch_transforms_active

    def call(*inputs):
        nonlocal single
        if is_compiling():
            out = op(*inputs)
            if isinstance(out, torch.Tensor):
                return out
            return out[0] if n_out == 1 else tuple(out[:n_out])
        if grad_enabled() and needs_grad(*inputs):
            return Eager.apply(*inputs) if functorch_active() else c_apply(*inputs)
        out = fwd(*inputs)
        if single is None:
            single = isinstance(out, torch.Tensor)
        if single:
            return out
        return out[0] if n_out == 1 else out[:n_out]

    def forward_saving(*inputs):
        """The forward launcher alone, no autograd node: ``(output, saved)``; the caller
        owns the backward (``backward_from(saved, dy)``). A model that fuses several ops
        under one autograd node of its own pays one node instead of one per op (a Python
        autograd node costs far more host time per forward+backward than PyTorch's C++
        node for the same kernels)."""
        out = _as_tuple(fwd(*inputs))
        return (out[0] if n_out == 1 else out[:n_out]), save(inputs, out)

    def backward_from(saved, dy):
        """One gradient (or None) per input of ``forward_saving``, from what it saved."""
        tensors, extra = saved
        if composed is not None:
            return composed(fwd, tensors, extra, dy, None)
        return grads(_as_tuple(ebwd(*bwd_args(tensors, extra, dy))), extra)

    call.forward_saving, call.backward_from = forward_saving, backward_from
    if composed is not None:
        call.custom_ops = [(op, sample, True) for sample in decl.samples]
    else:
        fs, bs = decl.samples
        call.custom_ops = [(op, fs, True)] + ([(bop, bs, False)] if decl.bwd is not None else [])
    call.ops = (op, bop if decl.bwd is not None else None)
    call.__name__ = decl.name
    return call


# --------------------------------------------------------------------------- small helpers


def expose(built, name: str | None = None):
    """Decorator of a registry callable that wraps ``built`` (a ``build`` result): it gets
    ``built``'s custom ops (for opcheck), ops, forward_saving and backward_from (what the
    registry, ``kernellab asm`` and the models' fused paths read), and ``name`` if given."""

    def wrap(fn):
        fn.custom_ops, fn.ops = built.custom_ops, built.ops
        fn.forward_saving, fn.backward_from = built.forward_saving, built.backward_from
        if name is not None:
            fn.__name__ = name
        return fn

    return wrap


def empty_like_contig(x: torch.Tensor) -> torch.Tensor:
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def contig(t):
    return t if t is None or t.is_contiguous() else t.contiguous()
