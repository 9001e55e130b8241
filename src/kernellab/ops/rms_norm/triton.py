"""rms_norm's Triton backend: layer_norm's kernels (ops/norm_kernels/triton_kernels.py)
with RMS=True (no mean, no bias), through rms_norm's custom ops."""

from __future__ import annotations

from kernellab.ops._register import register_triton
from kernellab.ops.norm_kernels import plumbing
from kernellab.ops.norm_kernels.triton_kernels import kernel_specs, norm_bwd, norm_fwd
from kernellab.ops.norm_kernels.triton_node import rms_node

rms_norm_triton = plumbing.rms_norm_op("rms_norm_triton", norm_fwd, norm_bwd, triton=True, node=rms_node)

register_triton(
    "rms_norm",
    rms_norm_triton,
    kernel_specs(True),
    "Triton: row in registers (wider rows streamed), saved rstd, per-program dweight partials",
)
