"""add in Numba's CUDA dialect (imported at the first launch; see kernellab.numba_support).

Variants (backend ``numba_vN`` runs the kernel ending in ``_vN``; ``numba`` runs v2):
  v1  one thread per element. The baseline.
  v2  grid-stride loop over a grid that fills the GPU once (see relu's numba_kernels).

fp32 sum for fp32 and fp16 storage, rounded once on the store (as torch's fp16 add).
12 B per element (fp32): its best time is 3/2 of a copy's.
"""

from kernellab.numba_support import numpy_compat

numpy_compat()  # before numba compiles anything (see numpy_compat)

from numba import cuda, float32  # noqa: E402


@cuda.jit
def add_v1(a, b, y):
    i = cuda.grid(1)
    if i < y.shape[0]:
        y[i] = float32(a[i]) + float32(b[i])


@cuda.jit
def add_v2(a, b, y):
    for i in range(cuda.grid(1), y.shape[0], cuda.gridsize(1)):
        y[i] = float32(a[i]) + float32(b[i])
