"""Peer libraries as optional backends (installed separately; compared in the same run).

``liger``: liger-kernel's Triton kernels (``pip install liger-kernel``), GPU only.
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


def register_liger(op: str, fn, description: str) -> None:
    """Register ``fn`` (a wrapper around a liger-kernel function) as backend ``liger`` of
    ``op``: GPU only, available when liger-kernel imports."""
    from kernellab.core.registry import register

    register(
        op, "liger", devices=("cuda",), available=liger_unavailable, builtin=True, description=description
    )(fn)


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
