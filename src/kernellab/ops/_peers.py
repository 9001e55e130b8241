"""Peer libraries as optional backends (installed separately; compared in the same run).

``liger``: liger-kernel's Triton kernels (``pip install liger-kernel``), GPU only. Its row
kernels (norms, softmax, GLUs) take rows of at most 65536 elements: wider ones are outside
the backend's declared limits (``Impl.limits``) and refused with a ValueError naming the
argument, before liger's launch would raise.
"""

from __future__ import annotations

import functools

import torch


@functools.cache
def liger_unavailable() -> str | None:
    """None when liger-kernel imports, else why not (the registry shows the reason)."""
    try:
        import liger_kernel  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any import failure means "cannot run here"
        if isinstance(e, ModuleNotFoundError) and e.name and e.name.startswith("liger_kernel"):
            return "liger-kernel not installed (pip install liger-kernel)"
        return f"liger-kernel does not import: {type(e).__name__}: {str(e).splitlines()[0][:120]}"
    return None


# liger's row kernels (norms, softmax, GLUs) run a row as one Triton block of
# next_power_of_2(width) elements and refuse blocks above this (liger_kernel.ops.utils)
LIGER_MAX_ROW = 65536


def liger_row_limits(x, *args, **options) -> str | None:
    """``Impl.limits`` of a liger backend that runs each row of its first argument as one
    Triton block: rows wider than ``LIGER_MAX_ROW`` elements are outside them."""
    width = x.shape[-1] if getattr(x, "ndim", 0) else 0
    if width > LIGER_MAX_ROW and x.numel():
        return f"rows of {width} elements; liger runs a row as one Triton block of at most {LIGER_MAX_ROW}"
    return None


def refuse_wide_rows(label: str, name: str, x) -> None:
    """Raise a ValueError naming ``name`` where ``liger_row_limits`` puts ``x`` outside
    (before liger's own RuntimeError from inside its launch)."""
    why = liger_row_limits(x)
    if why:
        raise ValueError(f"{label}: {name} has {why} (backend='triton' or 'torch' takes such rows)")


def register_liger(op: str, fn, description: str, limits=liger_row_limits) -> None:
    """Register ``fn`` (a wrapper around a liger-kernel function) as backend ``liger`` of
    ``op``: GPU only, available when liger-kernel imports; ``limits``: ``Impl.limits``
    (default: rows of at most ``LIGER_MAX_ROW`` elements; None: none)."""
    from kernellab.core.registry import register

    register(op, "liger", devices=("cuda",), available=liger_unavailable, builtin=True, limits=limits,
             description=description)(fn)  # fmt: skip


class _FirstOrderOnly(torch.autograd.Function):
    """Identity whose backward refuses to be differentiated (create_graph=True)."""

    @staticmethod
    def forward(ctx, y, label):
        ctx.label = label
        return y.view_as(y)

    @staticmethod
    def backward(ctx, g):
        if torch.is_grad_enabled():
            raise RuntimeError(
                f"{ctx.label}: double backward (create_graph=True) is not supported by this backend: its "
                "backward is a kernel without a derivative; backend='torch' or 'manual' computes it"
            )
        return g, None


def first_order_only(y: torch.Tensor, label: str) -> torch.Tensor:
    """``y`` as it is, but a double backward through it raises a clear error. For a peer
    whose autograd.Function backward runs kernels that record no graph: differentiated
    again, such a backward returns a silently wrong second derivative (liger's SwiGLU does)."""
    if not (torch.is_grad_enabled() and y.requires_grad):
        return y
    return _FirstOrderOnly.apply(y, label)


def owned_inputs(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``tensors`` for a peer whose backward writes into the inputs it saved (liger's GLUs):
    private contiguous copies when a backward will run (the caller's tensors must not
    change), else the tensors themselves, made contiguous."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return tuple(t.clone(memory_format=torch.contiguous_format) for t in tensors)
    return tuple(t.contiguous() for t in tensors)
