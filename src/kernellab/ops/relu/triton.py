"""ReLU in Triton: kernels, launcher, custom op, registration.

One program handles BLOCK consecutive elements of a contiguous tensor (the GeLU
kernels' streaming shape: four 16-byte accesses per thread with 8 warps). ReLU is pure
traffic: 1 compare per 8 B moved (fp32 forward), so it runs at the copy ceiling or not at
all.
"""

from __future__ import annotations

import triton.language as tl

from kernellab import triton_support
from kernellab.ops._elementwise import register_streaming_unary


@triton_support.jit
def _relu_fwd_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    # x_ptr, y_ptr: contiguous, n elements, fp32/fp16/bf16 storage (no conversion needed).
    pid = tl.program_id(0).to(tl.int64)  # int64: n may exceed 2^31
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    # compared in fp32: exact for fp16/bf16 (the interpreter compares bf16 as raw bits)
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    # x != x: NaN passes through (tl.maximum(x, 0) may return 0 for NaN)
    y = tl.where((x > 0) | (x != x), x, 0.0)
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton_support.jit
def _relu_bwd_kernel(dy_ptr, x_ptr, dx_ptr, n, BLOCK: tl.constexpr):
    # dx = 0 where x <= 0 else dy (PyTorch's threshold_backward: dy passes at NaN x)
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    dy = tl.load(dy_ptr + offs, mask=mask).to(tl.float32)
    tl.store(dx_ptr + offs, tl.where(x <= 0, 0.0, dy).to(dx_ptr.dtype.element_ty), mask=mask)


register_streaming_unary("relu", _relu_fwd_kernel, _relu_bwd_kernel, "Triton, one pass, 16-byte accesses")
