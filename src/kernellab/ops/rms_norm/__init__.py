"""RMSNorm over the last dimension, forward and backward (issue 3).

    y = x / sqrt(mean(x^2) + eps) * weight                  (per row of D = x.shape[-1])

As ``torch.nn.functional.rms_norm(x, (D,), weight, eps)``: fp32 / fp16 / bf16 storage (x
and weight share one dtype), everything in fp32 including the weight multiply, one
rounding at the end (what PyTorch does; in liger-kernel's terms casting mode "gemma"
with offset 0, not "llama", which rounds x * rstd to the storage dtype before the weight
multiply). Gradients for x and weight. An all-zero row normalizes through eps alone
(y = 0). The kernels are layer_norm's (``RMS`` flag; ops/norm_kernels/): they
save the fp32 rstd of each row and reduce dweight from per-program partial sums.
"""

from __future__ import annotations

import torch

from kernellab.core import registry
from kernellab.core.spec import BadInput
from kernellab.ops.norm_kernels import spec_parts


def rms_norm_reference(x, weight, eps=1e-6):
    """The formula in x's dtype (float64 in checks)."""
    return x / torch.sqrt(x.square().mean(-1, keepdim=True) + eps) * weight


def _bad_weight(device, dtype):
    x = torch.randn(4, 8, device=device).to(dtype)
    return (x, torch.ones(4, 8, device=device, dtype=dtype)), {}


def _bad_eps(device, dtype):
    x = torch.randn(4, 8, device=device).to(dtype)
    return (x, torch.ones(8, device=device, dtype=dtype)), {"eps": "small"}


def _bad_weight_dtype(device, dtype):
    x = torch.randn(4, 8, device=device)
    return (x, torch.ones(8, device=device, dtype=torch.bfloat16)), {}


def _unknown_option(device, dtype):
    x = torch.randn(4, 8, device=device).to(dtype)
    return (x, torch.ones(8, device=device, dtype=dtype)), {"offset": 1.0}


SPEC = spec_parts.define_norm(
    "rms_norm",
    ("x", "weight"),
    rms_norm_reference,
    spec_parts.counts(with_bias=False, rms=True),
    __doc__,
    inputs=spec_parts.make_inputs_fn(with_bias=False),
    validator=spec_parts.make_validator("rms_norm", ("x", "weight")),
    option_sets=[{"eps": 1e-2}],
    extra_bad_inputs=[
        BadInput("weight of the wrong shape", _bad_weight, "weight"),
        BadInput("weight dtype differs from x", _bad_weight_dtype, "weight"),
        BadInput("eps not a number", _bad_eps, "eps"),
        BadInput("unknown keyword", _unknown_option, "offset"),
    ],
)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *, backend: str | None = None
) -> torch.Tensor:
    """RMSNorm of ``x`` over its last dimension with the chosen backend."""
    return registry.call("rms_norm", backend, x, weight, eps=eps)


# The backends register themselves, after the spec exists.
from kernellab.ops.rms_norm import cuda as _cuda  # noqa: E402,F401
from kernellab.ops.rms_norm import liger as _liger  # noqa: E402,F401
from kernellab.ops.rms_norm import reference as _reference  # noqa: E402,F401
from kernellab.ops.rms_norm import triton as _triton  # noqa: E402,F401
