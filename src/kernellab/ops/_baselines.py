"""The three baselines every op has: manual (PyTorch primitives), torch (PyTorch's own
op) and compile (torch.compile of manual)."""

from __future__ import annotations

import functools

import torch

from kernellab.registry import register


def _raise_recompile_limit(n: int = 256) -> None:
    # Tests and sweeps call compiled functions at many shapes, dtypes and layouts; past
    # Dynamo's default limit (8) it would silently fall back to eager.
    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(cfg, name) and getattr(cfg, name) < n:
            setattr(cfg, name, n)


def compiled(fn):
    """torch.compile(fn, dynamic=False), compiled lazily at first call.

    Static shapes: each shape gets the kernel a fixed-shape model would. With automatic
    dynamic shapes the check's many odd shapes turned the function dynamic before the
    benchmark ran, and the dynamic kernel took 5.0 ms at 2^28 elements on an H100 for
    every op and dtype (0.71 ms static)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if wrapper._compiled is None:
            _raise_recompile_limit()
            wrapper._compiled = torch.compile(fn, dynamic=False)
        return wrapper._compiled(*args, **kwargs)

    wrapper._compiled = None
    return wrapper


def _compile_unavailable() -> str | None:
    try:
        import torch._inductor  # noqa: F401
    except Exception as e:  # pragma: no cover
        return f"torch.compile unavailable: {e}"
    return None


def register_baseline(op: str, manual, torch_fn, compile_fn) -> None:
    # manual and torch are PyTorch ops under PyTorch's autograd: differentiable twice.
    # compile is not declared: torch.compile refuses double backward with a RuntimeError.
    describe = (manual.__doc__ or "").split("\n")[0]
    register(op, "manual", builtin=True, description=describe, double_backward=True)(manual)
    describe = (torch_fn.__doc__ or "").split("\n")[0]
    register(op, "torch", builtin=True, description=describe, double_backward=True)(torch_fn)
    register(
        op,
        "compile",
        builtin=True,
        available=_compile_unavailable,
        description="torch.compile of manual",
        builds_per_shape=True,
    )(compile_fn)
