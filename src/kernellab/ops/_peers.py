"""Peer libraries as optional backends (installed separately; compared in the same run).

``liger``: liger-kernel's Triton kernels (``pip install liger-kernel``), GPU only.
"""

from __future__ import annotations

import functools


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
    from kernellab.registry import register

    register(
        op, "liger", devices=("cuda",), available=liger_unavailable, builtin=True, description=description
    )(fn)
