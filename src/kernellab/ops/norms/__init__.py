"""The norms family: layer_norm and rms_norm over the last dimension, one set of kernels
for both (rms_norm is layer_norm's kernels with ``RMS`` / ``rms=True``: no mean, no bias).

    layer_norm.py, rms_norm.py   each op's SPEC and public function (kernellab.layer_norm,
                                 kernellab.rms_norm)
    add_rms_norm.py              residual add + rms_norm, two outputs (kernellab.add_rms_norm)
    _kit.py                      what both share: validation, inputs, byte and flop counts,
                                 the custom-op / eager-autograd plumbing of a backend
    reference.py                 manual, torch and compile baselines of both
    triton.py                    Triton kernels, launchers, registrations of both
    cuda.py, norms.cu            CUDA C++ (NVRTC) kernels, launchers, registrations of both
    liger.py                     liger-kernel peers of the three

Importing this package registers both ops and all their backends.
"""

from kernellab.ops.norms.add_rms_norm import SPEC as ADD_RMS_NORM_SPEC
from kernellab.ops.norms.layer_norm import SPEC as LAYER_NORM_SPEC
from kernellab.ops.norms.rms_norm import SPEC as RMS_NORM_SPEC

__all__ = ["ADD_RMS_NORM_SPEC", "LAYER_NORM_SPEC", "RMS_NORM_SPEC"]

# The backends register themselves, after both specs exist.
from kernellab.ops.norms import cuda as _cuda  # noqa: E402,F401
from kernellab.ops.norms import liger as _liger  # noqa: E402,F401
from kernellab.ops.norms import reference as _reference  # noqa: E402,F401
from kernellab.ops.norms import triton as _triton  # noqa: E402,F401
