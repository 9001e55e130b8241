"""argmax in Triton: max's kernel (ops/max/triton.py) launched without the values store,
declared through the op kit and registered."""

from __future__ import annotations

from kernellab.ops._reductions import argmax_backend
from kernellab.ops._register import register_triton
from kernellab.ops.max.triton import DESCRIPTION, kernel_specs, max_rows

argmax_triton = argmax_backend("triton", max_rows, triton=True)


def _kernel_specs(dtype: str):
    """For `kernellab asm`: max's kernel as argmax launches it (WRITE_VALS off)."""
    return kernel_specs(dtype, write_vals=False)


register_triton("argmax", argmax_triton, _kernel_specs, DESCRIPTION)
