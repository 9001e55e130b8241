"""LayerNorm over the last dimension, forward and backward (issue 3).

    y = (x - mean(x)) / sqrt(var(x) + eps) * weight + bias       (per row of D = x.shape[-1])

As ``torch.nn.functional.layer_norm(x, (D,), weight, bias, eps)``: biased variance,
fp32 / fp16 / bf16 storage (x, weight and bias share one dtype), fp32 math, one rounding
at the end. Gradients for x, weight and bias; ``bias=None`` is supported (then there is
no bias gradient). A constant row has variance 0 and gives y = bias (normalized through
eps alone), as PyTorch does. The Triton and CUDA kernels keep the fp32 mean and rstd of
each row for the backward, which reduces dweight / dbias from per-program partial sums.
"""

from __future__ import annotations

import torch

from kernellab.core import registry
from kernellab.core.spec import BadInput
from kernellab.ops.norm_kernels import spec_parts


def layer_norm_reference(x, weight, bias, eps=1e-5):
    """The formula in x's dtype (float64 in checks)."""
    mean = x.mean(-1, keepdim=True)
    var = (x - mean).square().mean(-1, keepdim=True)
    y = (x - mean) / torch.sqrt(var + eps) * weight
    return y + bias if bias is not None else y


def _bad_weight(device, dtype):
    x = torch.randn(4, 8, device=device).to(dtype)
    return (x, torch.ones(7, device=device, dtype=dtype), torch.zeros(8, device=device, dtype=dtype)), {}


def _bad_bias(device, dtype):
    x = torch.randn(4, 8, device=device).to(dtype)
    return (x, torch.ones(8, device=device, dtype=dtype), torch.zeros(4, 8, device=device, dtype=dtype)), {}


def _bad_eps(device, dtype):
    x = torch.randn(4, 8, device=device).to(dtype)
    w = torch.ones(8, device=device, dtype=dtype)
    return (x, w, w.clone()), {"eps": -1.0}


def _bad_weight_dtype(device, dtype):
    x = torch.randn(4, 8, device=device)
    return (x, torch.ones(8, device=device, dtype=torch.float16), torch.zeros(8, device=device)), {}


def _unknown_option(device, dtype):
    x = torch.randn(4, 8, device=device).to(dtype)
    w = torch.ones(8, device=device, dtype=dtype)
    return (x, w, w.clone()), {"epsilon": 1e-5}


SPEC = spec_parts.define_norm(
    "layer_norm",
    ("x", "weight", "bias"),
    layer_norm_reference,
    spec_parts.counts(with_bias=True, rms=False),
    __doc__,
    inputs=spec_parts.make_inputs_fn(with_bias=True),
    validator=spec_parts.make_validator("layer_norm", ("x", "weight", "bias")),
    option_sets=[{"eps": 1e-2}, {"bias": None}],
    extra_bad_inputs=[
        BadInput("weight of the wrong length", _bad_weight, "weight"),
        BadInput("bias of the wrong shape", _bad_bias, "bias"),
        BadInput("weight dtype differs from x", _bad_weight_dtype, "weight"),
        BadInput("negative eps", _bad_eps, "eps"),
        BadInput("unknown keyword", _unknown_option, "epsilon"),
    ],
)


def layer_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    *,
    backend: str | None = None,
) -> torch.Tensor:
    """LayerNorm of ``x`` over its last dimension with the chosen backend."""
    return registry.call("layer_norm", backend, x, weight, bias, eps=eps)


# The backends register themselves, after the spec exists.
from kernellab.ops.layer_norm import cuda as _cuda  # noqa: E402,F401
from kernellab.ops.layer_norm import liger as _liger  # noqa: E402,F401
from kernellab.ops.layer_norm import reference as _reference  # noqa: E402,F401
from kernellab.ops.layer_norm import triton as _triton  # noqa: E402,F401
