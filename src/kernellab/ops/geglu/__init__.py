"""GeGLU, the gate of a Gemma-style MLP, forward and backward.

    geglu(a, b) = gelu(a) * b        approximate="none": 0.5 a (1 + erf(a / sqrt 2))
                                     approximate="tanh": 0.5 a (1 + tanh(sqrt(2/pi) (a + 0.044715 a^3)))

``a`` is the gate projection, ``b`` the up projection: same shape (any rank, any strides),
same dtype (fp32 / fp16 / bf16), same device. Math in fp32, one rounding to the input dtype
(PyTorch's ``F.gelu(a) * b`` rounds twice). Gradients for both inputs. NaN and inf, and
``inplace_backward=True`` (the backward writes the gradients into a's and b's buffers):
as swiglu's, described in ops/glu_kernels/__init__.py, which holds the kernels both share.
"""

from __future__ import annotations

import math

import torch

from kernellab.core import registry
from kernellab.core.spec import BadInput, per_element_flops
from kernellab.ops.glu_kernels import spec_parts

APPROXIMATIONS = ("none", "tanh")
_K = math.sqrt(2.0 / math.pi)


def gelu_formula(a: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    if approximate == "tanh":
        return 0.5 * a * (1.0 + torch.tanh(_K * (a + 0.044715 * a * a * a)))
    return 0.5 * a * (1.0 + torch.erf(a * (1.0 / math.sqrt(2.0))))


def geglu_reference(
    a: torch.Tensor, b: torch.Tensor, approximate: str = "none", inplace_backward: bool = False
) -> torch.Tensor:
    """The formula in the inputs' dtype (float64 in checks)."""
    return gelu_formula(a, approximate) * b


SPEC = spec_parts.define_glu(
    "geglu",
    geglu_reference,
    per_element_flops(9, 16),
    APPROXIMATIONS,
    "GeGLU: gelu(a) * b (exact or tanh GeLU), the gate of a Gemma-style MLP",
    option_sets=[{"approximate": "tanh"}, {"inplace_backward": True},
                 {"approximate": "tanh", "inplace_backward": True}],  # fmt: skip
    bad_options=[BadInput("approximate not 'none' or 'tanh'", spec_parts.bad_approximate, "approximate")],
)


def geglu(
    a: torch.Tensor,
    b: torch.Tensor,
    approximate: str = "none",
    *,
    backend: str | None = None,
    inplace_backward: bool = False,
) -> torch.Tensor:
    """``gelu(a, approximate) * b`` with the chosen backend; ``approximate`` as in
    ``torch.nn.functional.gelu`` ("none": erf, "tanh": the tanh approximation);
    ``inplace_backward``: see ops/glu_kernels/__init__.py (a and b destroyed by the backward)."""
    opts = {}
    if approximate != "none":  # the defaults: no keyword, the registry's cheapest path
        opts["approximate"] = approximate
    if inplace_backward is not False:
        opts["inplace_backward"] = inplace_backward
    return registry.call("geglu", backend, a, b, **opts)


# The backends register themselves, after the spec exists.
from kernellab.ops.geglu import liger as _liger  # noqa: E402,F401
from kernellab.ops.geglu import reference as _reference  # noqa: E402,F401
from kernellab.ops.geglu import triton as _triton  # noqa: E402,F401
