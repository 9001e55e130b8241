"""ReLU in Numba's CUDA dialect (imported at the first launch; see kernellab.numba_support).

Variants (backend ``numba_vN`` runs the kernels ending in ``_vN``; ``numba`` runs v2):
  v1  one thread per element: grid = ceil(n / 256) blocks, no loop. The baseline.
  v2  grid-stride loop: a grid that fills the GPU once (SMs x 8 blocks of 256), each thread
      walks the tensor in steps of the whole grid. Fewer blocks to schedule, one launch
      shape for every size; reads and writes stay coalesced (neighbouring threads touch
      neighbouring elements at every step).

Arrays: 1-D, C-contiguous, fp32 or fp16 storage; compares in fp32 (exact for fp16). ReLU
moves 8 B per element (fp32 forward) for one compare: it runs at the copy ceiling or not at
all, so v1 and v2 differ only by launch and scheduling overhead.
"""

from kernellab.numba_support import numpy_compat

numpy_compat()  # before numba compiles anything (see numpy_compat)

from numba import cuda, float32  # noqa: E402


@cuda.jit
def relu_fwd_v1(x, y):
    i = cuda.grid(1)  # blockIdx.x * blockDim.x + threadIdx.x
    if i < x.shape[0]:  # the last block's tail
        v = float32(x[i])
        # v != v: NaN passes through (a plain max(v, 0) would hide it)
        y[i] = v if (v > 0 or v != v) else float32(0.0)


@cuda.jit
def relu_bwd_v1(dy, x, dx):
    # dx = 0 where x <= 0, else dy: PyTorch's threshold_backward (dy passes at a NaN x)
    i = cuda.grid(1)
    if i < x.shape[0]:
        dx[i] = float32(0.0) if float32(x[i]) <= 0 else float32(dy[i])


@cuda.jit
def relu_fwd_v2(x, y):
    for i in range(cuda.grid(1), x.shape[0], cuda.gridsize(1)):
        v = float32(x[i])
        y[i] = v if (v > 0 or v != v) else float32(0.0)


@cuda.jit
def relu_bwd_v2(dy, x, dx):
    for i in range(cuda.grid(1), x.shape[0], cuda.gridsize(1)):
        dx[i] = float32(0.0) if float32(x[i]) <= 0 else float32(dy[i])
