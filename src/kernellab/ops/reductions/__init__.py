"""The reductions family: sum, max and argmax.

    sum.py                       sum's SPEC and public function (kernellab.sum)
    max.py                       max's and argmax's SPECs and public functions
                                 (kernellab.max, kernellab.argmax: one kernel for both)
    _kit.py                      what all three share: validation of x, and the custom-op /
                                 eager-autograd plumbing around a backend's launchers
    reference.py                 manual, torch and compile baselines of all three
    sum_triton.py, max_triton.py Triton kernels, launchers, registrations
    sum_cuda.py, sum.cu          CUDA C++ (NVRTC): sum's v1..v4 ladder
    max_cuda.py, max.cu          CUDA C++ (NVRTC): max and argmax

Importing this package registers the three ops and all their backends.
"""

from kernellab.ops.reductions.max import ARGMAX_SPEC
from kernellab.ops.reductions.max import SPEC as MAX_SPEC
from kernellab.ops.reductions.sum import SPEC as SUM_SPEC

__all__ = ["ARGMAX_SPEC", "MAX_SPEC", "SUM_SPEC"]

# The backends register themselves, after the specs exist.
from kernellab.ops.reductions import max_cuda as _max_cuda  # noqa: E402,F401
from kernellab.ops.reductions import max_triton as _max_triton  # noqa: E402,F401
from kernellab.ops.reductions import reference as _reference  # noqa: E402,F401
from kernellab.ops.reductions import sum_cuda as _sum_cuda  # noqa: E402,F401
from kernellab.ops.reductions import sum_triton as _sum_triton  # noqa: E402,F401
