"""swiglu's Triton backend: the GLU kernels of ops/glu_kernels/triton_kernels.py (ACT silu)
through swiglu's custom op, ``inplace_backward`` as ops/glu_kernels/__init__.py says."""

from __future__ import annotations

import torch
from torch import Tensor

from kernellab.core.kit import OpDecl, build, empty_like_contig, expose
from kernellab.ops._register import register_triton
from kernellab.ops.glu_kernels import triton_kernels as glu

_SILU = glu.ACT["silu"]


def _swiglu_fwd(a: Tensor, b: Tensor, inplace_backward: bool) -> Tensor:
    return glu.glu_fwd(a, b, _SILU)


def _swiglu_bwd(dy: Tensor, a: Tensor, b: Tensor, inplace_backward: bool) -> tuple[Tensor, Tensor]:
    return glu.glu_bwd(dy, a, b, _SILU)


_swiglu_call = build(
    OpDecl(
        name="swiglu_triton",
        label="swiglu (triton)",
        fwd=_swiglu_fwd,
        bwd=_swiglu_bwd,
        eager_bwd=lambda dy, a, b, inplace_backward: glu.glu_bwd_eager(dy, a, b, _SILU, inplace_backward),
        fwd_fake=lambda a, b, inplace_backward: empty_like_contig(a),
        bwd_fake=lambda dy, a, b, inplace_backward: glu.pair_fake(a),
        save=lambda inputs, out: ((inputs[0], inputs[1]), inputs[2]),  # a and b: act(a) is recomputed
        bwd_args=lambda saved, inplace, dy: (dy, *saved, inplace),
        grads=lambda g, extra: (g[0], g[1], None),
        needs_grad=lambda a, b, inplace_backward: a.requires_grad or b.requires_grad,
        samples=(lambda make: (make(1), make(1), False), lambda make: (make(0), make(0), make(0), False)),
        triton=True,
        inplace_hint=glu.inplace_hint("swiglu"),
    )
)
_is_compiling = torch.compiler.is_compiling


@expose(_swiglu_call)
def swiglu_call(a: Tensor, b: Tensor, inplace_backward: bool = False) -> Tensor:
    """The registry callable of swiglu's Triton backend; ``inplace_backward`` (eager only)
    as ops/glu_kernels/__init__.py says: traced, the custom op gets False."""
    return _swiglu_call(a, b, inplace_backward and not _is_compiling())


register_triton(
    "swiglu", swiglu_call, glu.kernel_specs(("silu",)),
    "Triton, one fused pass each way, silu recomputed in the backward",
)  # fmt: skip
