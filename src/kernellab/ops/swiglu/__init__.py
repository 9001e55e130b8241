"""SwiGLU, the gate of a Llama-style MLP, forward and backward.

    swiglu(a, b) = silu(a) * b = a * sigmoid(a) * b

``a`` is the gate projection, ``b`` the up projection: same shape (any rank, any strides),
same dtype (fp32 / fp16 / bf16), same device. Math in fp32, one rounding to the input dtype
(PyTorch's ``F.silu(a) * b`` rounds twice). Gradients for both inputs. NaN and inf, and
``inplace_backward=True`` (the backward writes the gradients into a's and b's buffers):
as geglu's, described in ops/glu_kernels/__init__.py, which holds the kernels both share.
"""

from __future__ import annotations

import torch

from kernellab.core import registry
from kernellab.core.spec import per_element_flops
from kernellab.ops.glu_kernels import spec_parts


def swiglu_reference(a: torch.Tensor, b: torch.Tensor, inplace_backward: bool = False) -> torch.Tensor:
    """The formula in the inputs' dtype (float64 in checks)."""
    return a * torch.sigmoid(a) * b


SPEC = spec_parts.define_glu(
    "swiglu",
    swiglu_reference,
    # fwd: exp, add, div, 2 mul (~5); bwd: the same plus ~6 for s (1 + a (1 - s)) and dy products
    per_element_flops(5, 11),
    (),
    "SwiGLU: silu(a) * b, the gate of a Llama-style MLP",
    option_sets=[{"inplace_backward": True}],
)


def swiglu(
    a: torch.Tensor, b: torch.Tensor, *, backend: str | None = None, inplace_backward: bool = False
) -> torch.Tensor:
    """``silu(a) * b`` (a: the gate projection, b: the up projection, same shape) with the
    chosen backend (default: the fastest available here); ``inplace_backward``: see
    ops/glu_kernels/__init__.py (a and b destroyed by the backward)."""
    if inplace_backward is False:  # the default: no keyword, the registry's cheapest path
        return registry.call("swiglu", backend, a, b)
    return registry.call("swiglu", backend, a, b, inplace_backward=inplace_backward)


# The backends register themselves, after the spec exists.
from kernellab.ops.swiglu import liger as _liger  # noqa: E402,F401
from kernellab.ops.swiglu import reference as _reference  # noqa: E402,F401
from kernellab.ops.swiglu import triton as _triton  # noqa: E402,F401
