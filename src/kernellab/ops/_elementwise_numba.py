"""Host side of the elementwise Numba kernels (relu, gelu, add): launcher, custom ops
through the op kit, registrations. The kernels live in each op's ``numba_kernels.py``
(imported at the first launch, see kernellab.numba_support); their names follow
``<base>_v1`` (one thread per element) and ``<base>_v2`` (grid-stride), every argument a
1-D contiguous array, the output last.
"""

from __future__ import annotations

import torch

from kernellab import numba_support as nb
from kernellab.ops._elementwise import binary_op, unary_op

VARIANTS = (
    ("numba_v1", 1, "Numba v1: one thread per element"),
    ("numba_v2", 2, "Numba v2: grid-stride loop over a grid that fills the GPU once"),
    ("numba", 2, "Numba best (v2: grid-stride loop)"),
)


def launch(op: str, kernels: nb.Kernels, base: str, variant: int, inputs) -> torch.Tensor:
    """y = f(*inputs) elementwise with kernel ``<base>_v<variant>``; inputs share shape,
    dtype and device (the registry validated that). Strided inputs are packed first: the
    kernels index flat contiguous arrays."""
    names = ("x",) if len(inputs) == 1 else ("a", "b") if base == "add" else ("dy", "x")
    nb.refuse(op, **dict(zip(names, inputs)))
    inputs = [t if t.is_contiguous() else t.contiguous() for t in inputs]
    y = torch.empty(inputs[0].shape, dtype=inputs[0].dtype, device=inputs[0].device)
    n = y.numel()
    if n == 0:
        return y
    block = nb.threads(y)
    grid = nb.cdiv(n, block)
    if variant == 2:  # the loop covers the rest: never more blocks than fill the GPU once
        grid = min(grid, nb.resident_blocks(y, block))
    flat = [t.view(-1) for t in (*inputs, y)]
    nb.launch(kernels.get(f"{base}_v{variant}"), grid, block, y, *flat)
    return y


def register_unary(op: str, kernels: nb.Kernels) -> None:
    """Backends numba_v1, numba_v2 and numba of a one-input op with kernels
    ``<op>_fwd_vN(x, y)`` and ``<op>_bwd_vN(dy, x, dx)``: custom ops
    ``kernellab::<op>_<backend>`` (backward ``..._backward``)."""
    for backend, v, what in VARIANTS:
        fn = unary_op(
            f"{op}_{backend}",
            lambda x, v=v: launch(op, kernels, f"{op}_fwd", v, [x]),
            lambda dy, x, v=v: launch(op, kernels, f"{op}_bwd", v, [dy, x]),
        )
        nb.register(op, backend, fn, kernels, what)


def register_binary(op: str, kernels: nb.Kernels) -> None:
    """Backends numba_v1, numba_v2 and numba of a two-input op whose gradient is dy for both
    inputs (add), with kernels ``<op>_vN(a, b, y)``."""
    for backend, v, what in VARIANTS:
        fn = binary_op(f"{op}_{backend}", lambda a, b, v=v: launch(op, kernels, op, v, [a, b]))
        nb.register(op, backend, fn, kernels, what)
