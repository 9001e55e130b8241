"""relu in Numba CUDA (numba_kernels.py, imported at the first launch): registrations of
numba_v1, numba_v2 and numba (see the variant list at the top of numba_kernels.py)."""

from __future__ import annotations

from kernellab.numba_support import Kernels
from kernellab.ops._elementwise_numba import register_unary

KERNELS = Kernels("kernellab.ops.relu.numba_kernels", ndim=1, best=2)

register_unary("relu", KERNELS)
