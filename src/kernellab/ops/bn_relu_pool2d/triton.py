"""bn_relu_pool2d's Triton backend: batch_norm2d's statistics kernel and the fused
normalize/relu/pool kernels of ops/batch_norm_kernels/triton_kernels.py through
bn_relu_pool2d's custom ops."""

from __future__ import annotations

from kernellab.ops._register import register_triton
from kernellab.ops.batch_norm_kernels.fused_op import bn_relu_pool_op
from kernellab.ops.batch_norm_kernels.triton_kernels import bn_relu_pool_kernel_specs, brp_bwd, brp_fwd

bn_relu_pool2d_triton = bn_relu_pool_op("bn_relu_pool2d_triton", brp_fwd, brp_bwd, triton=True)

register_triton(
    "bn_relu_pool2d",
    bn_relu_pool2d_triton,
    bn_relu_pool_kernel_specs,
    "Triton: batch-norm statistics + one normalize/relu/pool kernel (int8 argmax codes); "
    "backward: sums over the argmaxes + one dx kernel",
)
