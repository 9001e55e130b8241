"""GeLU (tanh approximation) in Numba's CUDA dialect (imported at the first launch; see
kernellab.numba_support).

Variants (backend ``numba_vN`` runs the kernels ending in ``_vN``; ``numba`` runs v2):
  v1  one thread per element. The baseline.
  v2  grid-stride loop over a grid that fills the GPU once (see relu's numba_kernels).

fp32 math for fp32 and fp16 storage (``math.tanh`` of a float32 is libdevice's tanhf).
~8 flops per 8 B (fp32 forward): memory-bound on any GPU, so the kernels are as fast as
their loads. The formula is written out in each kernel rather than in a
``cuda.jit(device=True)`` helper: a kernel that calls a device function asks the driver for
the current GPU's compute capability while compiling, so it could not be compiled to PTX
on a machine without a GPU (what CI and ``kernellab asm`` do).
"""

import math

from kernellab.numba_support import numpy_compat

numpy_compat()  # before numba compiles anything (see numpy_compat)

from numba import cuda, float32  # noqa: E402

K = float32(math.sqrt(2.0 / math.pi))
C = float32(0.044715)
HALF = float32(0.5)
ONE = float32(1.0)
THREE_C = float32(3.0 * 0.044715)


@cuda.jit
def gelu_fwd_v1(x, y):
    i = cuda.grid(1)
    if i < x.shape[0]:
        v = float32(x[i])
        # 0.5 x (1 + tanh(K (x + C x^3))); gelu(-inf) = -inf * 0 = NaN, as the formula (and torch)
        y[i] = HALF * v * (ONE + math.tanh(K * (v + C * v * v * v)))


@cuda.jit
def gelu_bwd_v1(dy, x, dx):
    i = cuda.grid(1)
    if i < x.shape[0]:
        v = float32(x[i])
        # d/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) K (1 + 3 C x^2), t = tanh(u): NaN at +-inf (inf * 0)
        t = math.tanh(K * (v + C * v * v * v))
        dx[i] = float32(dy[i]) * (HALF * (ONE + t) + HALF * v * (ONE - t * t) * K * (ONE + THREE_C * v * v))


@cuda.jit
def gelu_fwd_v2(x, y):
    for i in range(cuda.grid(1), x.shape[0], cuda.gridsize(1)):
        v = float32(x[i])
        y[i] = HALF * v * (ONE + math.tanh(K * (v + C * v * v * v)))


@cuda.jit
def gelu_bwd_v2(dy, x, dx):
    for i in range(cuda.grid(1), x.shape[0], cuda.gridsize(1)):
        v = float32(x[i])
        t = math.tanh(K * (v + C * v * v * v))
        dx[i] = float32(dy[i]) * (HALF * (ONE + t) + HALF * v * (ONE - t * t) * K * (ONE + THREE_C * v * v))
