"""add in CUDA C++ (add.cu, compiled by NVRTC): launchers, custom ops, registrations."""

from __future__ import annotations

from pathlib import Path

from kernellab.cuda import elementwise
from kernellab.cuda.runtime import Module, nvrtc_unavailable
from kernellab.ops._elementwise import binary_op
from kernellab.registry import register

MODULE = Module(Path(__file__).with_name("add.cu"))

for backend, vec, what in [
    ("cuda_v1", False, "CUDA v1: one element per thread"),
    ("cuda", True, "CUDA v2: 16-byte vector accesses, grid-stride"),
]:
    fn = binary_op(f"add_{backend}", lambda a, b, vec=vec: elementwise.launch(MODULE, "add", [a, b], vec))
    register(
        "add",
        backend,
        devices=("cuda",),
        available=nvrtc_unavailable,
        precompile=MODULE.precompile,
        custom_ops=fn.custom_ops,
        builtin=True,
        description=what,
    )(fn)
