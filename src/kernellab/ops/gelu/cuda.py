"""GeLU in CUDA C++ (gelu.cu, compiled by NVRTC): launchers, custom ops, registrations.

Backends: ``cuda_v1`` (one element per thread, the lecture's kernel) and ``cuda``
(16-byte vector accesses, grid-stride); see the variant list at the top of gelu.cu.
"""

from __future__ import annotations

from pathlib import Path

from kernellab.cuda.runtime import Module
from kernellab.ops import _elementwise_cuda as elementwise
from kernellab.ops._elementwise import unary_op

MODULE = Module(Path(__file__).with_name("gelu.cu"))

elementwise.register_variants(
    "gelu",
    MODULE,
    lambda backend, vec: unary_op(
        f"gelu_{backend}",
        lambda x: elementwise.launch(MODULE, "gelu_fwd", [x], vec),
        lambda dy, x: elementwise.launch(MODULE, "gelu_bwd", [dy, x], vec, w8=(2, 128)),
    ),
    [
        ("cuda_v1", False, "CUDA v1: one element per thread (lecture)"),
        ("cuda", True, "CUDA v2: 16-byte vector accesses"),
    ],
)
