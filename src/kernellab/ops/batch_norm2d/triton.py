"""batch_norm2d's Triton backend: the split per-channel reductions of
ops/batch_norm_kernels/triton_kernels.py through batch_norm2d's custom ops."""

from __future__ import annotations

from kernellab.ops._register import register_triton
from kernellab.ops.batch_norm_kernels.batch_norm_op import batch_norm_op
from kernellab.ops.batch_norm_kernels.triton_kernels import batch_norm_kernel_specs, bn_bwd, bn_fwd

batch_norm2d_triton = batch_norm_op("batch_norm2d_triton", bn_fwd, bn_bwd, triton=True)

register_triton(
    "batch_norm2d",
    batch_norm2d_triton,
    batch_norm_kernel_specs,
    "Triton: split per-channel reductions (Chan merge), fwd and bwd in two launches each",
)
