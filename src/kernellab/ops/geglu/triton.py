"""geglu's Triton backend: the GLU kernels of ops/glu_kernels/triton_kernels.py (ACT erf or
tanh GeLU) through geglu's custom op, ``inplace_backward`` as ops/glu_kernels/__init__.py
says."""

from __future__ import annotations

import torch
from torch import Tensor

from kernellab.core.kit import OpDecl, build, empty_like_contig, expose
from kernellab.ops._register import register_triton
from kernellab.ops.glu_kernels import triton_kernels as glu


def _geglu_fwd(a: Tensor, b: Tensor, approximate: str, inplace_backward: bool) -> Tensor:
    return glu.glu_fwd(a, b, glu.ACT[approximate])


def _geglu_bwd(
    dy: Tensor, a: Tensor, b: Tensor, approximate: str, inplace_backward: bool
) -> tuple[Tensor, Tensor]:
    return glu.glu_bwd(dy, a, b, glu.ACT[approximate])


_geglu_call = build(
    OpDecl(
        name="geglu_triton",
        label="geglu (triton)",
        fwd=_geglu_fwd,
        bwd=_geglu_bwd,
        eager_bwd=lambda dy, a, b, approximate, inplace_backward: glu.glu_bwd_eager(
            dy, a, b, glu.ACT[approximate], inplace_backward
        ),
        fwd_fake=lambda a, b, approximate, inplace_backward: empty_like_contig(a),
        bwd_fake=lambda dy, a, b, approximate, inplace_backward: glu.pair_fake(a),
        save=lambda inputs, out: ((inputs[0], inputs[1]), inputs[2:]),
        bwd_args=lambda saved, extra, dy: (dy, *saved, *extra),
        grads=lambda g, extra: (g[0], g[1], None, None),
        needs_grad=lambda a, b, approximate, inplace_backward: a.requires_grad or b.requires_grad,
        samples=(lambda make: (make(1), make(1), "none", False),
                 lambda make: (make(0), make(0), make(0), "tanh", False)),  # fmt: skip
        triton=True,
        inplace_hint=glu.inplace_hint("geglu"),
    )
)
_is_compiling = torch.compiler.is_compiling


@expose(_geglu_call)
def geglu_call(a: Tensor, b: Tensor, approximate: str = "none", inplace_backward: bool = False) -> Tensor:
    """The registry callable of geglu's Triton backend (the custom op takes ``approximate``
    and ``inplace_backward`` positionally; traced, the latter is False)."""
    return _geglu_call(a, b, approximate, inplace_backward and not _is_compiling())


register_triton(
    "geglu", geglu_call, glu.kernel_specs(("none", "tanh")),
    "Triton, one fused pass each way, gelu recomputed in the backward",
)  # fmt: skip
