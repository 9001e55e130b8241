"""ReLU in CUDA C++ (relu.cu, compiled by NVRTC): launchers, custom ops, registrations.

Backends: ``cuda_v1`` (one element per thread) and ``cuda`` (16-byte vector accesses,
the shared elementwise loops of common.cuh); see the variant list at the top of relu.cu.
"""

from __future__ import annotations

from pathlib import Path

from kernellab.cuda.runtime import Module
from kernellab.ops import _elementwise_cuda as elementwise
from kernellab.ops._elementwise import unary_op

MODULE = Module(Path(__file__).with_name("relu.cu"))

elementwise.register_variants(
    "relu",
    MODULE,
    lambda backend, vec: unary_op(
        f"relu_{backend}",
        lambda x: elementwise.launch(MODULE, "relu_fwd", [x], vec),
        lambda dy, x: elementwise.launch(MODULE, "relu_bwd", [dy, x], vec, w8=(2, 128)),
    ),
    [
        ("cuda_v1", False, "CUDA v1: one element per thread"),
        ("cuda", True, "CUDA v2: 16-byte vector accesses"),
    ],
)
