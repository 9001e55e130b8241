"""argmax in CUDA C++: max's kernels (ops/max/max.cu, ops/max/cuda.py) launched without
the values store, one backend per max variant."""

from __future__ import annotations

from kernellab.ops._reductions import argmax_backend
from kernellab.ops._register import register_cuda
from kernellab.ops.max.cuda import MODULE, VARIANTS, launcher

for _backend, _variant, _what in VARIANTS:
    register_cuda("argmax", _backend, argmax_backend(_backend, launcher(_variant)), MODULE, _what)
