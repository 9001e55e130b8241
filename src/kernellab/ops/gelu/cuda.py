"""GeLU in CUDA C++ (gelu.cu, compiled by NVRTC): launchers, custom ops, registrations.

Backends: ``cuda_v1`` (one element per thread, the lecture's kernel) and ``cuda``
(16-byte vector accesses, grid-stride); see the variant list at the top of gelu.cu.
"""

from __future__ import annotations

from pathlib import Path

from kernellab.cuda.runtime import Module
from kernellab.ops import _elementwise_cuda as elementwise

MODULE = Module(Path(__file__).with_name("gelu.cu"))

elementwise.register_unary("gelu", MODULE, v1="CUDA v1: one element per thread (lecture)")
