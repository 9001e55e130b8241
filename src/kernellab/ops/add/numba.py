"""add in Numba CUDA (numba_kernels.py, imported at the first launch): registrations of
numba_v1, numba_v2 and numba (see the variant list at the top of numba_kernels.py)."""

from __future__ import annotations

from kernellab.numba_support import Kernels
from kernellab.ops._elementwise_numba import register_binary

KERNELS = Kernels("kernellab.ops.add.numba_kernels", ndim=1, best=2)

register_binary("add", KERNELS)
