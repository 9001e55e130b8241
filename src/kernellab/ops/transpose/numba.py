"""transpose in Numba CUDA (ops/_numba_transpose.py, imported at the first launch):
registrations of numba_v1 (one thread per element) and numba_v2 = numba (32 x 33 padded
shared-memory tile). The kernels take one matrix: a batch ([..., R, C]) is transposed one
matrix at a time into its slice of the output."""

from __future__ import annotations

import math

import torch

from kernellab import numba_support as nb
from kernellab.ops.transpose.decl import out_shape, transpose_op

KERNELS = nb.Kernels("kernellab.ops._numba_transpose", ndim=2, best=2)


def _launcher(v: int):
    def launch(x: torch.Tensor) -> torch.Tensor:
        from kernellab.ops import _numba_transpose as nt  # numba.cuda at the first call

        one = nt.transpose_naive if v == 1 else nt.transpose_tiled
        if x.dim() == 2:
            return one(x)
        out = torch.empty(out_shape(x), dtype=x.dtype, device=x.device)
        mats = x.reshape(math.prod(x.shape[:-2]), *x.shape[-2:])
        flat = out.view(mats.shape[0], x.shape[-1], x.shape[-2])
        for b in range(mats.shape[0]):
            flat[b].copy_(one(mats[b]))
        return out

    return launch


for _backend, _v, _what in (
    ("numba_v1", 1, "Numba v1: one thread per element (coalesced reads, strided writes)"),
    ("numba_v2", 2, "Numba v2: 32x33 padded shared-memory tile (coalesced both ways)"),
    ("numba", 2, "Numba best (v2: padded shared-memory tile)"),
):
    nb.register("transpose", _backend, transpose_op(_backend, _launcher(_v)), KERNELS, _what)
