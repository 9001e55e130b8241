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
from kernellab.triton_support import load_block, store_block, stream_blocks


@triton_support.jit
def _relu_fwd(args, offs, n, FULL: tl.constexpr):
    # One block of the forward (stream_blocks): x, y contiguous, fp32/fp16/bf16 storage.
    x_ptr, y_ptr = args
    # compared in fp32: exact for fp16/bf16 (the interpreter compares bf16 as raw bits)
    x = load_block(x_ptr, offs, n, FULL).to(tl.float32)
    # x != x: NaN passes through (tl.maximum(x, 0) may return 0 for NaN)
    store_block(y_ptr, offs, tl.where((x > 0) | (x != x), x, 0.0), n, FULL)


@triton_support.jit
def _relu_fwd_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    stream_blocks(_relu_fwd, (x_ptr, y_ptr), n, BLOCK)


@triton_support.jit
def _relu_bwd(args, offs, n, FULL: tl.constexpr):
    # dx = 0 where x <= 0 else dy (PyTorch's threshold_backward: dy passes at NaN x)
    dy_ptr, x_ptr, dx_ptr = args
    x = load_block(x_ptr, offs, n, FULL).to(tl.float32)
    dy = load_block(dy_ptr, offs, n, FULL).to(tl.float32)
    store_block(dx_ptr, offs, tl.where(x <= 0, 0.0, dy), n, FULL)


@triton_support.jit
def _relu_bwd_kernel(dy_ptr, x_ptr, dx_ptr, n, BLOCK: tl.constexpr):
    stream_blocks(_relu_bwd, (dy_ptr, x_ptr, dx_ptr), n, BLOCK)


register_streaming_unary("relu", _relu_fwd_kernel, _relu_bwd_kernel, "Triton, one pass, 16-byte accesses")
