"""ReLU in CUDA C++ (relu.cu, compiled by NVRTC): launchers, custom ops, registrations.

Backends: ``cuda_v1`` (one element per thread) and ``cuda`` (16-byte vector accesses,
the shared elementwise loops of common.cuh); see the variant list at the top of relu.cu.
"""

from __future__ import annotations

from pathlib import Path

from kernellab.cuda.runtime import Module
from kernellab.ops import _elementwise_cuda as elementwise

MODULE = Module(Path(__file__).with_name("relu.cu"))

elementwise.register_unary("relu", MODULE)
