"""Triton availability: compiled kernels on a CUDA GPU, the interpreter on the CPU.

kernellab sets ``TRITON_INTERPRET=1`` itself (in ``kernellab/__init__``, before any
kernel is defined) when no GPU is present, so Triton kernels run on CPU tensors. The
interpreter runs programs one after another: it proves indexing and masking, not the
absence of races, and it is slow - keep CPU shapes small.
"""

from __future__ import annotations

import functools
import inspect

import torch

from kernellab import device


@functools.cache
def unavailable() -> str | None:
    try:
        import triton  # noqa: F401
    except Exception as e:
        return f"triton not importable: {e}"
    if not device.has_cuda() and not device.triton_interpreted():
        return "no GPU and TRITON_INTERPRET is off"
    return None


def devices() -> tuple[str, ...]:
    return ("cuda", "cpu") if device.triton_interpreted() else ("cuda",)


def block_for(element_size: int, warps: int = 8, accesses: int = 4) -> int:
    """Elements per program for streaming kernels: each thread makes ``accesses``
    16-byte accesses (fp32: 4096 elements with 8 warps, fp16/bf16: 8192)."""
    return warps * 32 * accesses * (16 // element_size)


def launch_streaming(kernel, inputs) -> torch.Tensor:
    """Run an elementwise ``kernel(*inputs, out, n, BLOCK=...)`` over contiguous copies
    of ``inputs`` (same shape and dtype) into a fresh contiguous output."""
    inputs = [t.contiguous() for t in inputs]
    y = torch.empty_like(inputs[0])
    n = y.numel()
    if n:
        import triton

        block = block_for(y.element_size())
        kernel[(triton.cdiv(n, block),)](*inputs, y, n, BLOCK=block, num_warps=8)
    return y


def streaming_kernels(*kernels):
    """``Impl.triton_kernels`` for kernels of the form ``k(ptrs..., n, BLOCK)`` as launched
    by ``launch_streaming``: every pointer of the dtype, n an i32, BLOCK and the warps as
    the launcher picks them."""

    def specs(dtype: str):
        size = {"fp32": 4, "fp16": 2, "bf16": 2}[dtype]
        out = []
        for k in kernels:
            params = list(inspect.signature(k.fn).parameters)
            sig = {p: f"*{dtype}" for p in params[:-2]}
            sig[params[-2]] = "i32"
            sig[params[-1]] = "constexpr"
            out.append((k, sig, {params[-1]: block_for(size)}, 8))
        return out

    return specs


def register_triton(op: str, fn, kernels, description: str, backend: str = "triton") -> None:
    """Register ``fn`` (with ``.custom_ops``) as a Triton backend of ``op``: it runs where
    Triton does (the CPU through the interpreter); ``kernels`` tells `kernellab asm` which
    kernels and signatures to compile ahead of time."""
    from kernellab.registry import register

    register(
        op,
        backend,
        devices=devices(),
        available=unavailable,
        custom_ops=getattr(fn, "custom_ops", ()),
        builtin=True,
        triton_kernels=kernels,
        description=description,
    )(fn)
