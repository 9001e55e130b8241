"""kernellab: kernels for the ops deep-learning models use, checked and timed honestly.

import kernellab
y = kernellab.gelu(x)                       # fastest backend available here
y = kernellab.gelu(x, backend="triton")     # a chosen one
kernellab.impls("gelu")                     # every registered implementation
"""

import os as _os

import torch as _torch

# Triton kernels must see TRITON_INTERPRET before they are defined: with no GPU, run them
# under the interpreter on CPU tensors (set it to 0 yourself to opt out).
if not _torch.cuda.is_available():
    _os.environ.setdefault("TRITON_INTERPRET", "1")

from kernellab import registry as _registry  # noqa: E402
from kernellab.ops.add import add  # noqa: E402
from kernellab.ops.attention import attention  # noqa: E402
from kernellab.ops.batch_norm2d import batch_norm2d  # noqa: E402
from kernellab.ops.bn_relu_pool2d import bn_relu_pool2d  # noqa: E402
from kernellab.ops.cross_entropy import cross_entropy  # noqa: E402
from kernellab.ops.gelu import gelu  # noqa: E402
from kernellab.ops.glu import geglu, swiglu  # noqa: E402
from kernellab.ops.linear_cross_entropy import linear_cross_entropy  # noqa: E402
from kernellab.ops.matmul import matmul  # noqa: E402
from kernellab.ops.conv2d import conv2d  # noqa: E402
from kernellab.ops.norms.add_rms_norm import add_rms_norm  # noqa: E402
from kernellab.ops.norms.layer_norm import layer_norm  # noqa: E402
from kernellab.ops.norms.rms_norm import rms_norm  # noqa: E402
from kernellab.ops.pool import max_pool2d  # noqa: E402
from kernellab.ops.reductions.max import argmax, max  # noqa: E402,A004
from kernellab.ops.reductions.sum import sum  # noqa: E402,A004
from kernellab.ops.relu import relu  # noqa: E402
from kernellab.ops.rope import rope  # noqa: E402
from kernellab.ops.softmax import softmax  # noqa: E402
from kernellab.ops.spec import get_spec  # noqa: E402
from kernellab.optim import sgd_step  # noqa: E402
from kernellab.patch import PatchReport, patch, unpatch  # noqa: E402
from kernellab import nn  # noqa: E402  (drop-in modules; after the ops they call)
from kernellab.registry import Impl, get, impls, op_names, register, unregister  # noqa: E402

_registry.warm_defaults()

__version__ = "0.1.0"
__all__ = [
    "Impl",
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
    "impls",
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
    "unpatch",
    "unregister",
]
