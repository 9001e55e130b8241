"""batch_norm2d: training-mode batch normalization of NCHW images, forward and backward.

    y[n, c, h, w] = (x - mean_c) / sqrt(var_c + eps) * weight[c] + bias[c]

mean_c and var_c are the batch statistics of channel c over N, H and W (biased variance, as
PyTorch normalizes with); no running statistics are kept (the course's MNIST model uses
batch statistics only). As ``torch.batch_norm(x, weight, bias, None, None, True, 0.0, eps)``:
fp32 / fp16 / bf16 storage (x, weight and bias share one dtype), fp32 statistics and math,
one rounding at the end; gradients for x, weight and bias. ``relu=True`` applies a ReLU in
the same kernels (forward and backward; see ops/batch_norm_kernels/batch_norm_op.py). A
channel of variance 0 (a constant one, or batch 1 with 1x1 images) gives y = bias and
dx = 0, as PyTorch's kernel does (F.batch_norm refuses one value per channel in Python
before reaching it).

    reference.py     manual, torch and compile baselines
    triton.py        the Triton backend: split per-channel reductions (forward and backward)
    cuda.py, batch_norm2d.cu   the same in CUDA C++ (NVRTC)

Validation, inputs, counts and the custom op (shared with bn_relu_pool2d), and the Triton
kernels: ops/batch_norm_kernels/.
"""

from __future__ import annotations

import torch

from kernellab.core import registry
from kernellab.core.spec import BadInput, declare, fuzz_nchw
from kernellab.ops.batch_norm_kernels import batch_norm_op as _op


def batch_norm2d_reference(x, weight, bias, eps=1e-5, relu=False):
    """The formula in x's dtype (float64 in checks)."""
    mean = x.mean((0, 2, 3), keepdim=True)
    var = (x - mean).square().mean((0, 2, 3), keepdim=True)
    c = (1, -1, 1, 1)
    y = (x - mean) / torch.sqrt(var + eps) * weight.view(c) + bias.view(c)
    return torch.relu(y) if relu else y


def bad_case(build, shape=(2, 3, 4, 4)):
    """A BadInput case: ``build(x, w, b) -> (args, kwargs)`` from good [N, C, H, W] inputs
    (bn_relu_pool2d's spec uses it too)."""

    def case(device, dtype):
        x = torch.randn(shape, device=device).to(dtype)
        w = torch.ones(shape[1], device=device, dtype=dtype)
        return build(x, w, torch.zeros(shape[1], device=device, dtype=dtype))

    return case


_bad = bad_case

# What every op of x [N, C, H, W] with a per-channel weight and bias refuses (bn_relu_pool2d's
# spec lists these too).
CHANNEL_BAD_INPUTS = [
    BadInput("x of rank 3", _bad(lambda x, w, b: ((x[0], w, b), {})), "x"),
    BadInput("weight of the wrong length", _bad(lambda x, w, b: ((x, w[:2], b), {})), "weight"),
    BadInput("bias of the wrong shape", _bad(lambda x, w, b: ((x, w, b.view(3, 1)), {})), "bias"),
    BadInput("weight dtype differs from x", _bad(lambda x, w, b: ((x, w.double(), b), {})), "weight"),
    BadInput("eps = 0", _bad(lambda x, w, b: ((x, w, b), {"eps": 0.0})), "eps"),
    BadInput("negative eps", _bad(lambda x, w, b: ((x, w, b), {"eps": -1e-5})), "eps"),
    BadInput("bias missing", _bad(lambda x, w, b: ((x, w, None), {})), "bias"),
]


SPEC = declare(
    "batch_norm2d", ("x", "weight", "bias"), batch_norm2d_reference, _op.count_flops, _op.count_bytes,
    problem_ranks=(4,), problem_dims="(N, C, H, W)",
    grad_args=(0, 1, 2),
    # 1x1 images, batch 1 with 1x1 (variance 0), odd sizes, channels not a multiple of 8,
    # an empty batch, the model's layers (32 channels at 28x28, 64 at 14x14).
    test_shapes=[(0, 3, 4, 4), (1, 1, 1, 1), (1, 5, 1, 1), (2, 3, 1, 1), (3, 7, 5, 5),
                 (4, 13, 9, 11), (1, 3, 17, 19), (2, 32, 28, 28), (5, 64, 14, 14)],  # fmt: skip
    quick_shapes=[(1, 1, 1, 1), (2, 3, 1, 1), (3, 7, 5, 5), (2, 13, 9, 11)],
    bench_shapes=[(256, 32, 28, 28), (256, 64, 14, 14), (1024, 32, 28, 28)],
    cpu_bench_shapes=[(8, 16, 14, 14)],
    layout_shape=(3, 5, 7, 9),
    reach_shape=(2, 3, 5, 7),
    grad_shapes=[(3, 5, 7, 9), (1, 3, 1, 1)],
    bad_shape=(2, 3, 4, 4),
    scale=2.0,
    plant_extra=_op.plant_constant_channel,
    default_backends=("cuda", "triton", "torch"),
    doc=__doc__.strip().split("\n")[0],
    inputs=_op.inputs,
    validator=_op.validate,
    key_validates=True,  # reads each tensor's class, dtype, shape, device, layout; the keyword values
    option_sets=[{"eps": 1e-2}, {"relu": True}],
    fuzz=lambda rng, big: (fuzz_nchw(rng, big), None),
    extra_bad_inputs=CHANNEL_BAD_INPUTS + [
        BadInput("unknown keyword", _bad(lambda x, w, b: ((x, w, b), {"epsilon": 1e-5})), "epsilon"),
        BadInput("relu not a bool", _bad(lambda x, w, b: ((x, w, b), {"relu": "yes"})), "relu"),
    ],
)


def batch_norm2d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    eps: float = 1e-5,
    relu: bool = False,
    *,
    backend: str | None = None,
) -> torch.Tensor:
    """Training-mode batch norm of NCHW ``x`` (batch statistics) with the chosen backend;
    ``relu=True``: relu(batch_norm(x)) in the same kernels."""
    if relu is False:
        return registry.call("batch_norm2d", backend, x, weight, bias, eps=eps)
    return registry.call("batch_norm2d", backend, x, weight, bias, eps=eps, relu=relu)


__all__ = ["SPEC", "batch_norm2d", "batch_norm2d_reference"]

# The backends register themselves, after the spec exists.
from kernellab.ops.batch_norm2d import cuda as _cuda  # noqa: E402,F401
from kernellab.ops.batch_norm2d import reference as _reference  # noqa: E402,F401
from kernellab.ops.batch_norm2d import triton as _triton  # noqa: E402,F401
