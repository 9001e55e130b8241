"""rms_norm's CUDA C++ backends, ``cuda_v1`` and ``cuda`` (= v2): layer_norm's launchers
(ops/norm_kernels/cuda_kernels.py, norms.cu) with ``rms=True``, through rms_norm's custom
ops."""

from __future__ import annotations

from kernellab.ops.norm_kernels import plumbing
from kernellab.ops.norm_kernels.cuda_kernels import register_variants

register_variants("rms_norm", plumbing.rms_norm_op)
