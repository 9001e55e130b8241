"""Softmax over the last dimension in Numba's CUDA dialect (imported at the first launch;
see kernellab.numba_support).

Variants (backend ``numba_vN`` runs the kernels ending in ``_vN``; ``numba`` runs v2):
  v1  one thread per row, three passes over it (max, sum of exp, write). Simple, and slow
      twice over: a 4096x4096 fp32 matrix keeps only 4096 threads busy (2 per SM-lane on
      an H100's 132 SMs x 2048), and neighbouring threads read addresses a whole row apart,
      so every warp load touches 32 separate 32-byte sectors instead of 4 (8x the memory
      transactions). Its sums run in one chain per row, so they accumulate in fp64: an fp32
      chain over a 9000-wide row drifts past twice torch's error (torch sums in a tree);
      fp64 adds cost nothing that matters in a kernel this memory-bound. The teaching
      baseline.
  v2  one block per row: the block's threads stride along the row together (coalesced:
      thread t reads column t, t + 256, ...), each keeps a partial max / sum in a register,
      and a shared-memory tree combines the 256 partials in log2(256) = 8 steps, with a
      barrier per step. Every row is read twice from memory (max, then sum) and once more
      to write; at 4096 columns the row (16 KB fp32) stays in L1/L2 between the passes.

Arrays: 2-D (rows, cols), C-contiguous, fp32 or fp16 storage, fp32 math. A row with a NaN
gives a NaN row (the NaN reaches the sum), a fully masked row (all -inf) too (-inf - -inf),
as torch.softmax. Backward: dx = y * (dy - sum(dy * y)) per row, the same two shapes.
"""

import math

from kernellab.numba_support import numpy_compat

numpy_compat()  # before numba compiles anything (see numpy_compat)

from numba import cuda, float32, float64  # noqa: E402

# v2's shared buffer: one partial per thread; blocks are a power of two up to this.
MAX_THREADS = 256
NEG_INF = float32(-math.inf)
ZERO = float32(0.0)


@cuda.jit
def softmax_fwd_v1(x, y):
    r = cuda.grid(1)
    if r < x.shape[0]:
        cols = x.shape[1]
        m = NEG_INF
        for j in range(cols):
            m = max(m, float32(x[r, j]))
        s = float64(0.0)
        for j in range(cols):
            s += math.exp(float32(x[r, j]) - m)
        total = float32(s)
        for j in range(cols):
            y[r, j] = math.exp(float32(x[r, j]) - m) / total


@cuda.jit
def softmax_bwd_v1(y, dy, dx):
    r = cuda.grid(1)
    if r < y.shape[0]:
        cols = y.shape[1]
        acc = float64(0.0)
        for j in range(cols):
            acc += float32(dy[r, j]) * float32(y[r, j])
        dot = float32(acc)
        for j in range(cols):
            dx[r, j] = float32(y[r, j]) * (float32(dy[r, j]) - dot)


@cuda.jit
def softmax_fwd_v2(x, y):
    r = cuda.blockIdx.x  # one block per row
    t = cuda.threadIdx.x
    nt = cuda.blockDim.x  # a power of two <= MAX_THREADS
    cols = x.shape[1]
    part = cuda.shared.array(MAX_THREADS, float32)

    m = NEG_INF  # this thread's max over columns t, t + nt, ...
    for j in range(t, cols, nt):
        m = max(m, float32(x[r, j]))
    part[t] = m
    cuda.syncthreads()
    s = nt // 2  # tree: half the threads fold the other half in, log2(nt) steps
    while s > 0:
        if t < s:
            part[t] = max(part[t], part[t + s])
        cuda.syncthreads()
        s //= 2
    m = part[0]
    cuda.syncthreads()  # every thread has read the max before part is reused

    acc = ZERO
    for j in range(t, cols, nt):
        acc += math.exp(float32(x[r, j]) - m)
    part[t] = acc
    cuda.syncthreads()
    s = nt // 2
    while s > 0:
        if t < s:
            part[t] += part[t + s]
        cuda.syncthreads()
        s //= 2
    total = part[0]

    for j in range(t, cols, nt):
        y[r, j] = math.exp(float32(x[r, j]) - m) / total


@cuda.jit
def softmax_bwd_v2(y, dy, dx):
    r = cuda.blockIdx.x
    t = cuda.threadIdx.x
    nt = cuda.blockDim.x
    cols = y.shape[1]
    part = cuda.shared.array(MAX_THREADS, float32)

    acc = ZERO
    for j in range(t, cols, nt):
        acc += float32(dy[r, j]) * float32(y[r, j])
    part[t] = acc
    cuda.syncthreads()
    s = nt // 2
    while s > 0:
        if t < s:
            part[t] += part[t + s]
        cuda.syncthreads()
        s //= 2
    dot = part[0]

    for j in range(t, cols, nt):
        dx[r, j] = float32(y[r, j]) * (float32(dy[r, j]) - dot)
