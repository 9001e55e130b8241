"""RMSNorm's CUDA backends (``cuda_v1``, ``cuda``): the layer_norm package's norms.cu
kernels with RMS=true (see kernellab/ops/layer_norm/cuda.py and the variant list in
norms.cu), as custom ops."""

from __future__ import annotations

from kernellab.ops import _norms
from kernellab.ops.layer_norm.cuda import register_variants

register_variants("rms_norm", _norms.rms_norm_op)
