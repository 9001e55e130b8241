"""RMSNorm's Triton backend: the layer_norm package's kernels with RMS=True (no mean, no
bias; see kernellab/ops/layer_norm/triton.py for the design), as custom ops."""

from __future__ import annotations

from kernellab import triton_support
from kernellab.ops import _norms
from kernellab.ops.layer_norm.triton import kernel_specs, norm_bwd, norm_fwd
from kernellab.registry import register

rms_norm_triton = _norms.rms_norm_op("rms_norm_triton", norm_fwd, norm_bwd)

register(
    "rms_norm",
    "triton",
    devices=triton_support.devices(),
    available=triton_support.unavailable,
    custom_ops=rms_norm_triton.custom_ops,
    builtin=True,
    triton_kernels=kernel_specs(True),
    description="Triton: row in registers, saved rstd, per-program dweight partials",
)(rms_norm_triton)
