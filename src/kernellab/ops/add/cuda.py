"""add in CUDA C++ (add.cu, compiled by NVRTC): launchers, custom ops, registrations."""

from __future__ import annotations

from pathlib import Path

from kernellab.cuda.runtime import Module
from kernellab.ops import _elementwise_cuda as elementwise
from kernellab.ops._elementwise import binary_op

MODULE = Module(Path(__file__).with_name("add.cu"))

elementwise.register_variants(
    "add",
    MODULE,
    lambda backend, vec: binary_op(
        f"add_{backend}", lambda a, b: elementwise.launch(MODULE, "add", [a, b], vec, w8=(1, 256))
    ),
)
