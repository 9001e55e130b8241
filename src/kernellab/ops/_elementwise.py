"""Shared plumbing for elementwise ops: their custom ops, autograd and the fast path.

Each Triton / CUDA backend supplies launchers (``fwd(x) -> y``, ``bwd(dy, x) -> dx``)
that take any strided tensor and return a fresh contiguous output. This module turns
them into ``torch.library`` custom ops (fake kernels for torch.compile, autograd
through the backward op) and into the callable the registry holds.

Eager fast path: a custom op with registered autograd goes through the dispatcher and
Python several times per call, nearly three times the fwd+bwd host cost of PyTorch's
gelu, so small and medium tensors would be host-bound. Under
torch.compile the custom op is used (it is what Dynamo can trace); in eager mode the
registry callable calls the launcher directly when no gradient is needed, and a plain
``torch.autograd.Function`` around the same launchers when one is. Same kernels, same
stream; ``opcheck`` verifies the custom op, the check engine the eager path.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from kernellab import triton_support
from kernellab.core.kit import OpDecl, build, empty_like_contig
from kernellab.ops._register import register_triton


def unary_op(name: str, fwd: Callable, bwd: Callable, save_output: bool = False, triton: bool = False):
    """Custom ops ``kernellab::<name>`` and ``kernellab::<name>_backward``; returns the
    registry callable (with ``.custom_ops`` for opcheck). The backward is ``bwd(dy, s)``
    with ``s`` the input (GeLU) or, with ``save_output``, the output (softmax)."""

    def _fwd(x: Tensor) -> Tensor:
        return fwd(x)

    def _bwd(dy: Tensor, saved: Tensor) -> Tensor:
        return bwd(dy, saved)

    return build(
        OpDecl(
            name=name,
            fwd=_fwd,
            bwd=_bwd,
            fwd_fake=empty_like_contig,
            bwd_fake=lambda dy, saved: empty_like_contig(saved),
            save=(lambda inputs, out: ((out[0],), None))
            if save_output
            else (lambda inputs, out: ((inputs[0],), None)),
            bwd_args=lambda saved, extra, dy: (dy, saved[0]),
            grads=lambda g, extra: g,
            needs_grad=lambda x: x.requires_grad,
            samples=(lambda make: (make(1),), lambda make: (make(0), make(0))),
            triton=triton,
        )
    )


def binary_op(name: str, fwd: Callable, triton: bool = False):
    """Custom op ``kernellab::<name>(a, b)`` whose gradient passes ``dy`` to both inputs
    (the gradient of a + b: no backward kernel); returns the registry callable."""

    def _fwd(a: Tensor, b: Tensor) -> Tensor:
        return fwd(a, b)

    return build(
        OpDecl(
            name=name,
            fwd=_fwd,
            bwd=None,
            fwd_fake=lambda a, b: empty_like_contig(a),
            bwd_fake=None,
            save=lambda inputs, out: ((), None),
            bwd_args=lambda saved, extra, dy: (dy,),
            grads=lambda g, extra: (g[0], g[0]),
            needs_grad=lambda a, b: a.requires_grad or b.requires_grad,
            samples=(lambda make: (make(1), make(1)), None),
            triton=triton,
        )
    )


def register_streaming_unary(op: str, fwd_kernel, bwd_kernel, description: str) -> None:
    """Backend ``triton`` of a one-input op from two streaming kernels as
    ``triton_support.launch_streaming`` runs them, ``fwd_kernel(x, y, n, BLOCK)`` and
    ``bwd_kernel(dy, x, dx, n, BLOCK)``: custom ops ``kernellab::<op>_triton``."""
    fn = unary_op(
        f"{op}_triton",
        lambda x: triton_support.launch_streaming(fwd_kernel, [x]),
        lambda dy, x: triton_support.launch_streaming(bwd_kernel, [dy, x]),
        triton=True,
    )
    register_triton(op, fn, triton_support.streaming_kernels(fwd_kernel, bwd_kernel), description)
