"""kernellab: kernels for the ops deep-learning models use, checked and timed honestly.

import kernellab
y = kernellab.gelu(x)                       # fastest backend available here
y = kernellab.gelu(x, backend="triton")     # a chosen one
kernellab.impls("gelu")                     # every registered implementation
"""

from kernellab import nn  # (drop-in modules; after the ops they call)
from kernellab.core import registry  # (kernellab.registry: the table of implementations)
from kernellab.core.registry import Impl, get, impls, op_names, register, unregister
from kernellab.core.spec import get_spec
from kernellab.ops.public import (  # noqa: A004
    add,
    add_rms_norm,
    argmax,
    attention,
    batch_norm2d,
    bn_relu_pool2d,
    conv2d,
    cross_entropy,
    geglu,
    gelu,
    histogram,
    int4_weight_only_matmul,
    int8_weight_only_matmul,
    layer_norm,
    linear_cross_entropy,
    matmul,
    max,
    max_pool2d,
    relu,
    rms_norm,
    rope,
    softmax,
    sum,
    swiglu,
    transpose,
)
from kernellab.ops.weight_only_matmul.quantize import dequantize_weight, quantize_weight
from kernellab.optim import sgd_step
from kernellab.options import config
from kernellab.patch import PatchReport, patch, unpatch

registry.warm_defaults()

__version__ = "0.1.0"
__all__ = [
    "Impl",
    "config",
    "add",
    "add_rms_norm",
    "argmax",
    "attention",
    "batch_norm2d",
    "bn_relu_pool2d",
    "conv2d",
    "cross_entropy",
    "geglu",
    "gelu",
    "get",
    "get_spec",
    "histogram",
    "impls",
    "int4_weight_only_matmul",
    "int8_weight_only_matmul",
    "dequantize_weight",
    "quantize_weight",
    "layer_norm",
    "linear_cross_entropy",
    "matmul",
    "max",
    "max_pool2d",
    "nn",
    "op_names",
    "patch",
    "PatchReport",
    "register",
    "relu",
    "rope",
    "rms_norm",
    "sgd_step",
    "softmax",
    "sum",
    "swiglu",
    "transpose",
    "unpatch",
    "unregister",
]
