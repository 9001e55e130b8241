"""The op-kit declaration every transpose backend shares (core/kit.py): a launcher
``x -> y`` becomes the custom op ``kernellab::transpose_<backend>`` with its fake kernel and
autograd. The gradient of a transpose is the transpose of ``dy``: the backward is the same
forward applied to ``dy`` (composed backward, no kernel of its own), so second derivatives
are exact too."""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from kernellab.core.kit import OpDecl, build


def out_shape(x) -> tuple:
    """[..., R, C] -> [..., C, R]."""
    return (*x.shape[:-2], x.shape[-1], x.shape[-2])


def transpose_op(backend: str, launch: Callable, triton: bool = False):
    """The registry callable of a transpose backend whose launcher is ``launch(x) -> y``
    (``y`` new and contiguous, ``x`` any strided layout of 2 or more dims)."""

    def _fwd(x: Tensor) -> Tensor:
        return launch(x)

    return build(
        OpDecl(
            name=f"transpose_{backend}",
            fwd=_fwd,
            fwd_fake=lambda x: x.new_empty(out_shape(x)),
            save=lambda inputs, out: ((), None),
            needs_grad=lambda x: x.requires_grad,
            samples=(lambda make: (make(1),),),
            backward=lambda fwd, saved, extra, dy, need: (fwd(dy),),
            triton=triton,
            label=f"transpose ({backend})",
        )
    )
