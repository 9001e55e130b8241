"""How a built-in backend joins the registry: one helper for the Triton backends and the
CUDA (NVRTC) ones, so that the runtimes (``triton_support``, ``cuda.runtime``) know nothing
of the registry."""

from __future__ import annotations

from kernellab import triton_support
from kernellab.core.registry import register
from kernellab.cuda import runtime


def register_builtin(
    op: str,
    backend: str,
    fn,
    description: str,
    *,
    triton_kernels=None,
    module=None,
    devices=None,
    available=None,
    dtypes=None,
    double_backward: bool = False,
    limits=None,
) -> None:
    """Register ``fn`` (with ``.custom_ops``, checked with opcheck) as built-in ``backend``
    of ``op``. With ``triton_kernels`` (what `kernellab asm` compiles ahead of time) a
    Triton backend: it runs where Triton does, the CPU through the interpreter. With
    ``module`` (a ``cuda.runtime.Module``) a CUDA backend: GPU only, available where NVRTC
    is, precompiled for the "compiled, not run" report. ``devices`` and ``available``
    narrow those defaults (a Hopper-only kernel); ``dtypes``, ``double_backward`` and
    ``limits`` are the registry's (``core.registry.Impl``)."""
    if (triton_kernels is None) == (module is None):
        raise ValueError(f"{op}/{backend}: give triton_kernels (a Triton backend) or module (a CUDA one)")
    cuda = module is not None
    register(
        op,
        backend,
        devices=devices or (("cuda",) if cuda else triton_support.devices()),
        available=available or (runtime.nvrtc_unavailable if cuda else triton_support.unavailable),
        precompile=module.precompile if cuda else None,
        custom_ops=getattr(fn, "custom_ops", ()),
        builtin=True,
        triton_kernels=triton_kernels,
        description=description,
        module=module,
        dtypes=dtypes,
        double_backward=double_backward,
        limits=limits,
    )(fn)


def register_triton(op: str, fn, kernels, description: str, backend: str = "triton", limits=None) -> None:
    """``register_builtin`` for a Triton backend (``kernels``: its ``triton_kernels``)."""
    register_builtin(op, backend, fn, description, triton_kernels=kernels, limits=limits)


def register_cuda(op: str, backend: str, fn, module, description: str) -> None:
    """``register_builtin`` for a CUDA backend built from ``module``."""
    register_builtin(op, backend, fn, description, module=module)
