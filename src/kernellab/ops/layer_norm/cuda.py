"""layer_norm's CUDA C++ backends, ``cuda_v1`` and ``cuda`` (= v2): the launchers of
ops/norm_kernels/cuda_kernels.py (norms.cu) through layer_norm's custom ops."""

from __future__ import annotations

from kernellab.ops.norm_kernels import plumbing
from kernellab.ops.norm_kernels.cuda_kernels import register_variants

register_variants("layer_norm", plumbing.layer_norm_op)
