"""Host side of the elementwise kernels built on ``common.cuh``'s map loops.

Kernel naming contract (see add.cu, gelu.cu): ``<base>_<dtype>`` is the vectorized
kernel (16-byte accesses; needs 16-byte aligned contiguous storage), ``<base>_v1_<dtype>``
the one-element-per-thread kernel; both take (inputs..., output, n).
"""

from __future__ import annotations

import torch

from kernellab.cuda.runtime import Module, ceil_div

SUFFIX = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}
THREADS = 256
UNROLL = {1: 4, 2: 2}  # packs per thread for 1 and 2 inputs: kl::UNROLL, kl::UNROLL2


def launch(module: Module, base: str, inputs, vectorized: bool = True) -> torch.Tensor:
    """y = f(*inputs) elementwise; inputs share shape, dtype and CUDA device."""
    inputs = [t.contiguous() for t in inputs]  # strided inputs are packed first
    x0 = inputs[0]
    y = torch.empty_like(x0)
    n = x0.numel()
    if n == 0:
        return y
    dev = x0.device.index
    sig = ("ptr",) * (len(inputs) + 1) + ("i64",)
    sfx = SUFFIX[x0.dtype]
    # A storage offset can leave a tensor misaligned for 16-byte accesses (offset of one
    # element): then the scalar kernel runs. The allocator aligns y.
    if vectorized and all(t.data_ptr() % 16 == 0 for t in inputs):
        k = module.kernel(f"{base}_{sfx}", sig, dev)
        packs = n // (16 // x0.element_size())
        # One tile per block (the kernel's loop is grid-stride, so this is only a choice):
        # measured faster than a grid capped at 8-32 blocks per SM.
        grid = max(1, ceil_div(packs, THREADS * UNROLL[len(inputs)]))
    else:
        k = module.kernel(f"{base}_v1_{sfx}", sig, dev)
        grid = ceil_div(n, THREADS)
    k(grid, THREADS, *inputs, y, n, device_index=dev)
    return y
