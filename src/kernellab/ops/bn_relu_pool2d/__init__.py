"""bn_relu_pool2d: training-mode batch norm -> relu -> 2x2 max pool of NCHW images, fused.

    z = max_pool2d(relu(batch_norm2d(x, weight, bias, eps)), kernel 2, stride 2)

The MNIST CNN's block after its convolution (issue 18's fused block), as one op: the
forward writes only the quarter-size z and one int8 code per pooled output (where its
maximum sits, or that the relu closed the window), never the full-size normalized
activation; the backward routes dz through those codes. Batch statistics over N, H, W per
channel, biased variance, no running statistics (as batch_norm2d). fp32 / fp16 / bf16
storage (x, weight, bias share one dtype); fp32 statistics and math, one rounding at the
end. Which value of a window is the maximum is decided exactly, as float64 decides it:
the Triton kernel compares x * sign(weight) (the normalization is monotone in x), so two
values that the rounded activation would make equal stay apart; backends that pool
rounded values (torch in x's dtype, manual in fp32) may route a gradient to the other
of two such values. float64 is the referee.

Odd sizes: P = H // 2, Q = W // 2 (max_pool2d floors): the last row / column is left out
of the pool (its gradient through the pool is 0) but is still counted in the batch
statistics (mean, variance and the M of the backward are over all N * H * W values).
Images smaller than 2x2 are refused (no window fits; PyTorch's max_pool2d refuses them
too). Ties: the first maximum of the window in row-major order (r, s) = (0,0), (0,1),
(1,0), (1,1) takes the gradient, and a NaN wins, PyTorch's max_pool2d rule (take v when
v > max or v is NaN); where the window's maximum is <= 0 the relu closes it and no
gradient flows (relu's derivative at 0 is 0, as PyTorch's). The reference, F.max_pool2d
over float64, follows the same rule.

    reference.py     manual, torch and compile baselines
    triton.py        the Triton backend: batch_norm2d's statistics kernel + a
                     normalize/relu/pool kernel; backward: sums over the argmaxes + one
                     dense dx kernel
    cuda.py, bn_relu_pool2d.cu   the same in CUDA C++ (NVRTC)

Validation, counts and the custom op (fused_op.py), and the Triton kernels:
ops/batch_norm_kernels/, beside batch_norm2d's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernellab.core import registry
from kernellab.core.spec import BadInput, Boundary, declare, fuzz_nchw
from kernellab.ops.batch_norm2d import CHANNEL_BAD_INPUTS, batch_norm2d_reference
from kernellab.ops.batch_norm2d import bad_case as _bad
from kernellab.ops.batch_norm_kernels import batch_norm_op as _bn_op
from kernellab.ops.batch_norm_kernels import fused_op as _op


def bn_relu_pool2d_reference(x, weight, bias, eps=1e-5):
    """The formula in x's dtype (float64 in checks): batch norm, relu, 2x2 max pool."""
    return F.max_pool2d(torch.relu(batch_norm2d_reference(x, weight, bias, eps)), 2, 2)


SPEC = declare(
    "bn_relu_pool2d", ("x", "weight", "bias"), bn_relu_pool2d_reference, _op.count_flops, _op.count_bytes,
    problem_ranks=(4,), problem_dims="(N, C, H, W)",
    grad_args=(0, 1, 2),
    # the smallest image (2x2), batch 1, odd sizes (the dropped row / column), channels
    # not a multiple of 8, an empty batch, the model's layers (32 at 28x28, 64 at 14x14)
    test_shapes=[(0, 3, 4, 4), (1, 1, 2, 2), (2, 3, 2, 2), (1, 5, 3, 3), (3, 7, 5, 5),
                 (4, 13, 9, 11), (1, 3, 17, 19), (2, 32, 28, 28), (5, 64, 14, 14)],  # fmt: skip
    quick_shapes=[(1, 1, 2, 2), (2, 3, 3, 2), (3, 7, 5, 5), (2, 13, 9, 11)],
    bench_shapes=[(b, c, hw, hw) for b in (64, 256, 1024) for c, hw in ((32, 28), (64, 14))],
    cpu_bench_shapes=[(8, 16, 14, 14)],
    layout_shape=(3, 5, 7, 9),
    reach_shape=(2, 3, 5, 7),
    grad_shapes=[(3, 5, 7, 9), (1, 3, 2, 2)],
    bad_shape=(2, 3, 4, 4),
    scale=2.0,
    plant_extra=_bn_op.plant_constant_channel,
    default_backends=("triton", "cuda", "torch"),  # Triton first: the backend the CPU tests run
    doc=__doc__.strip().split("\n")[0],
    inputs=_bn_op.inputs,
    validator=_op.validate,
    key_validates=True,  # reads each tensor's class, dtype, shape, device, layout; the keyword values
    option_sets=[{"eps": 1e-2}],
    fuzz=lambda rng, big: (fuzz_nchw(rng, big, min_hw=2), None),
    # equal inputs stay equal through the batch norm: tied maxima in the pool's windows
    boundary_cases=[Boundary((2, 3, 6, 7), ties=True)],
    extra_bad_inputs=CHANNEL_BAD_INPUTS + [
        BadInput("1x1 images", _bad(lambda x, w, b: ((x, w, b), {}), (2, 3, 1, 1)), "x"),
        BadInput("images one row high", _bad(lambda x, w, b: ((x, w, b), {}), (2, 3, 1, 6)), "x"),
        BadInput("unknown keyword", _bad(lambda x, w, b: ((x, w, b), {"relu": True})), "relu"),
    ],
)


def bn_relu_pool2d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    eps: float = 1e-5,
    *,
    backend: str | None = None,
) -> torch.Tensor:
    """max_pool2d(relu(batch_norm2d(x, weight, bias, eps)), 2) of NCHW ``x`` (batch
    statistics) with the chosen backend: [N, C, H // 2, W // 2]."""
    return registry.call("bn_relu_pool2d", backend, x, weight, bias, eps=eps)


__all__ = ["SPEC", "bn_relu_pool2d", "bn_relu_pool2d_reference"]

# The backends register themselves, after the spec exists.
from kernellab.ops.bn_relu_pool2d import cuda as _cuda  # noqa: E402,F401
from kernellab.ops.bn_relu_pool2d import reference as _reference  # noqa: E402,F401
from kernellab.ops.bn_relu_pool2d import triton as _triton  # noqa: E402,F401
