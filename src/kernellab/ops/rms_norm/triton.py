"""RMSNorm's Triton backend: the layer_norm package's kernels with RMS=True (no mean, no
bias; see kernellab/ops/layer_norm/triton.py for the design), as custom ops."""

from __future__ import annotations

from kernellab import triton_support
from kernellab.ops import _norms
from kernellab.ops.layer_norm.triton import kernel_specs, norm_bwd, norm_fwd

rms_norm_triton = _norms.rms_norm_op("rms_norm_triton", norm_fwd, norm_bwd, triton=True)

triton_support.register_triton(
    "rms_norm",
    rms_norm_triton,
    kernel_specs(True),
    "Triton: row in registers, saved rstd, per-program dweight partials",
)
