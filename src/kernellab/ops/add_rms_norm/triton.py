"""add_rms_norm's Triton backend: rms_norm's kernels (ops/norm_kernels/triton_kernels.py)
with the residual add fused (RES=True): (rms_norm(x + r) * w, x + r) in one kernel, the
residual stream's gradient added into dx by the backward kernel. Bitwise the results of
add then rms_norm_triton (same roundings)."""

from __future__ import annotations

from kernellab.ops._register import register_triton
from kernellab.ops.norm_kernels import plumbing
from kernellab.ops.norm_kernels.triton_kernels import add_rms_bwd, add_rms_fwd, kernel_specs, row_limits

add_rms_norm_triton = plumbing.add_rms_norm_op("add_rms_norm_triton", add_rms_fwd, add_rms_bwd, triton=True)

register_triton(
    "add_rms_norm",
    add_rms_norm_triton,
    kernel_specs(True),
    "Triton: residual add fused into rms_norm's kernels, saved rstd, dres added in the backward",
    limits=row_limits,
)
