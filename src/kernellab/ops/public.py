"""Every op's public function (``kernellab.<op>``) by op name. The package, ``kernellab.nn``
and ``kernellab.patch`` take them from here, so none of them imports the package itself."""

from __future__ import annotations

from kernellab.ops.add import add
from kernellab.ops.add_rms_norm import add_rms_norm
from kernellab.ops.argmax import argmax
from kernellab.ops.attention import attention
from kernellab.ops.batch_norm2d import batch_norm2d
from kernellab.ops.bn_relu_pool2d import bn_relu_pool2d
from kernellab.ops.conv2d import conv2d
from kernellab.ops.cross_entropy import cross_entropy
from kernellab.ops.geglu import geglu
from kernellab.ops.gelu import gelu
from kernellab.ops.histogram import histogram
from kernellab.ops.layer_norm import layer_norm
from kernellab.ops.linear_cross_entropy import linear_cross_entropy
from kernellab.ops.matmul import matmul
from kernellab.ops.max import max  # noqa: A004
from kernellab.ops.pool import max_pool2d
from kernellab.ops.relu import relu
from kernellab.ops.rms_norm import rms_norm
from kernellab.ops.rope import rope
from kernellab.ops.softmax import softmax
from kernellab.ops.sum import sum  # noqa: A004
from kernellab.ops.swiglu import swiglu
from kernellab.ops.transpose import transpose
from kernellab.ops.weight_only_matmul import int4_weight_only_matmul, int8_weight_only_matmul

FUNCTIONS = {
    f.__name__: f
    for f in (
        add,
        attention,
        batch_norm2d,
        bn_relu_pool2d,
        conv2d,
        cross_entropy,
        gelu,
        geglu,
        histogram,
        swiglu,
        linear_cross_entropy,
        matmul,
        add_rms_norm,
        layer_norm,
        rms_norm,
        max_pool2d,
        argmax,
        max,
        sum,
        relu,
        rope,
        softmax,
        transpose,
        int8_weight_only_matmul,
        int4_weight_only_matmul,
    )
}
