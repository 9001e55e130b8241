"""add in Triton: kernel, launcher, custom op, registration.

BLOCK elements per program (fp32 4096, fp16/bf16 8192 with 8 warps): four 16-byte
accesses per thread and input in flight.
"""

from __future__ import annotations

import torch
import triton.language as tl

from kernellab import triton_support
from kernellab.ops._elementwise import binary_op
from kernellab.ops._register import register_triton
from kernellab.triton_support import load_block, store_block, stream_blocks


@triton_support.jit
def _add(args, offs, n, FULL: tl.constexpr):
    # One block (stream_blocks): a, b, y contiguous, one storage dtype; math in fp32.
    a_ptr, b_ptr, y_ptr = args
    a = load_block(a_ptr, offs, n, FULL).to(tl.float32)
    b = load_block(b_ptr, offs, n, FULL).to(tl.float32)
    store_block(y_ptr, offs, a + b, n, FULL)


@triton_support.jit
def _add_kernel(a_ptr, b_ptr, y_ptr, n, BLOCK: tl.constexpr):
    stream_blocks(_add, (a_ptr, b_ptr, y_ptr), n, BLOCK)


def _fwd(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return triton_support.launch_streaming(_add_kernel, [a, b])


add_triton = binary_op("add_triton", _fwd, triton=True)
register_triton(
    "add", add_triton, triton_support.streaming_kernels(_add_kernel), "Triton, one pass, 16-byte accesses"
)
