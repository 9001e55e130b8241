"""Softmax in Numba CUDA (numba_kernels.py, imported at the first launch): launcher, custom
ops through the op kit, registrations of numba_v1 (a thread per row), numba_v2 (a block per
row, shared-memory tree) and numba (v2); the variant list is at the top of numba_kernels.py.
"""

from __future__ import annotations

import torch

from kernellab import numba_support as nb
from kernellab.ops._elementwise import unary_op
from kernellab.ops.softmax.cuda import _rows_cols

KERNELS = nb.Kernels("kernellab.ops.softmax.numba_kernels", ndim=2, best=2)
V2_THREADS = 256  # numba_kernels.MAX_THREADS: 8 tree steps, 8 warps per row


def _launch(variant: int, direction: str, named: dict) -> torch.Tensor:
    """Forward ``named = {x}`` -> y, backward ``{y, dy}`` -> dx, over rows of the last dim."""
    nb.refuse("softmax", **named)
    inputs = [t if t.is_contiguous() else t.contiguous() for t in named.values()]
    out = torch.empty(inputs[0].shape, dtype=inputs[0].dtype, device=inputs[0].device)
    rows, cols = _rows_cols(out)
    if rows == 0 or cols == 0:
        return out
    mats = [t.view(rows, cols) for t in (*inputs, out)]
    kernel = KERNELS.get(f"softmax_{direction}_v{variant}")
    if variant == 1:  # a thread per row
        block = nb.threads(out)
        nb.launch(kernel, nb.cdiv(rows, block), block, out, *mats)
    else:  # a block per row (simulated: 32 threads, the same tree in 5 steps)
        nb.launch(kernel, rows, V2_THREADS if out.is_cuda else nb.SIM_THREADS, out, *mats)
    return out


def _make(backend: str, variant: int):
    return unary_op(
        f"softmax_{backend}",
        lambda x: _launch(variant, "fwd", {"x": x}),
        lambda dy, y: _launch(variant, "bwd", {"y": y, "dy": dy}),
        save_output=True,
    )


VARIANTS = [
    ("numba_v1", 1, "Numba v1: one thread per row, three passes"),
    ("numba_v2", 2, "Numba v2: one block per row, shared-memory tree reductions"),
    ("numba", 2, "Numba best (v2: a block per row, shared-memory tree)"),
]

for _backend, _variant, _what in VARIANTS:
    nb.register("softmax", _backend, _make(_backend, _variant), KERNELS, _what)
