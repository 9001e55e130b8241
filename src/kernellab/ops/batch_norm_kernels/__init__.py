"""What the batch norms share: batch_norm2d and bn_relu_pool2d (ops/batch_norm2d/,
ops/bn_relu_pool2d/) run one family of kernels (bn_relu_pool2d's forward starts with
batch_norm2d's statistics kernel, and both walk a channel in chunks with the same helpers).

    batch_norm_op.py    batch_norm2d's validation (shared with bn_relu_pool2d), inputs,
                        counts, and the custom op around a backend's launchers
    fused_op.py         bn_relu_pool2d's validation, counts and custom op
    triton_kernels.py   Triton kernels, config, launchers and what `kernellab asm` compiles

Importing this package registers nothing: each op's folder registers its own backends.
"""
