"""Matrix transpose in Numba's CUDA dialect: out = x.t().contiguous() for a 2-D tensor.
Standalone launchers (``transpose_naive``, ``transpose_tiled``), to be registered as the
``numba`` backends of a transpose op. Importing this module imports ``numba.cuda``: import
it at the first launch (see kernellab.numba_support for the GPU / simulator rules).

Variants (kernels ``transpose_v1`` and ``transpose_v2``: the naming contract of
``numba_support.Kernels``, so ``Kernels("kernellab.ops._numba_transpose", ndim=2, best=2)``
gives a transpose op's numba_v1 / numba_v2 / numba backends their PTX in ``kernellab asm``):
  v1  naive: one thread per element, thread (i, j) reads x[i, j] and writes out[j, i]. The
      reads are coalesced (a warp reads 32 neighbours of a row), the writes are not: a
      warp's 32 stores land a whole output row apart, 32 sectors per store instead of
      4, so the write side moves ~8x the bytes it needs (fp32) and sets the pace.
  v2  tiled: a 32x32 tile goes through shared memory: the block reads it row by row
      (coalesced), syncs, and writes it back transposed, again row by row (coalesced).
      The tile is 32 x 33 floats: with 32 columns, a column read tile[tx, ty] by a warp
      would hit one shared-memory bank 32 times (addresses 32 words apart, 32 banks)
      and serialize 32-fold; one word of padding puts consecutive rows in consecutive
      banks. Each block is 32x8 threads and walks its tile in 4 steps (TILE / ROWS):
      more work per thread, fewer blocks. Expect near copy bandwidth.

Arrays: 2-D C-contiguous, fp32 or fp16 (bf16 refused: Numba has no bfloat16 arrays).
"""

from __future__ import annotations

import torch

from kernellab import numba_support as nb

nb.numpy_compat()  # before numba compiles anything (see numpy_compat)

from numba import cuda, float32  # noqa: E402

TILE = 32  # a warp's width: a tile row is one coalesced 128-byte (fp32) access
ROWS = 8  # threads per block: TILE x ROWS = 256, each thread moves TILE / ROWS = 4 elements
PADDED = (TILE, TILE + 1)  # the shared tile: +1 column, no bank conflicts on column reads


@cuda.jit
def transpose_v1(x, out):
    # x: (m, n), out: (n, m). threadIdx.x runs along x's rows (j): coalesced reads.
    j, i = cuda.grid(2)
    if i < x.shape[0] and j < x.shape[1]:
        out[j, i] = x[i, j]


@cuda.jit
def transpose_v2(x, out):
    tile = cuda.shared.array(PADDED, float32)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    m = x.shape[0]
    n = x.shape[1]
    j = cuda.blockIdx.x * TILE + tx  # column of x this thread reads
    i0 = cuda.blockIdx.y * TILE  # first row of the tile
    for k in range(0, TILE, ROWS):
        i = i0 + ty + k
        if i < m and j < n:
            tile[ty + k, tx] = x[i, j]
    cuda.syncthreads()
    # write out's rows: out[c, r] with c in the tile's columns, r (= tx) along out's row
    r = i0 + tx
    c0 = cuda.blockIdx.x * TILE
    for k in range(0, TILE, ROWS):
        c = c0 + ty + k
        if c < n and r < m:
            out[c, r] = tile[tx, ty + k]


def _prepare(x: torch.Tensor, name: str = "x"):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"transpose (numba): {name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(f"transpose (numba): {name} must be 2-D, got shape {tuple(x.shape)}")
    nb.refuse("transpose", **{name: x})
    x = x if x.is_contiguous() else x.contiguous()
    return x, torch.empty((x.shape[1], x.shape[0]), dtype=x.dtype, device=x.device)


def transpose_naive(x: torch.Tensor) -> torch.Tensor:
    """x.t().contiguous() with one thread per element (32x8 blocks)."""
    x, out = _prepare(x)
    m, n = x.shape
    if out.numel():
        grid = (nb.cdiv(n, TILE), nb.cdiv(m, ROWS))
        nb.launch(transpose_v1, grid, (TILE, ROWS), out, x, out)
    return out


def transpose_tiled(x: torch.Tensor) -> torch.Tensor:
    """x.t().contiguous() through padded 32x33 shared-memory tiles (32x8 blocks).
    fp16 goes through the same fp32 tile (exact: every fp16 value is an fp32 value)."""
    x, out = _prepare(x)
    m, n = x.shape
    if out.numel():
        grid = (nb.cdiv(n, TILE), nb.cdiv(m, TILE))
        nb.launch(transpose_v2, grid, (TILE, ROWS), out, x, out)
    return out

