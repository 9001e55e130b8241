"""ReLU, elementwise, with backward (the MNIST CNN's activation, issue 18).

    relu(x) = x if x > 0 else 0          relu'(x) = 1 if x > 0 else 0

Same as ``torch.relu``: fp32 / fp16 / bf16, exact (no rounding: the output is the input
or zero). NaN propagates forward (relu(NaN) = NaN: a plain ``fmaxf(x, 0)`` would return 0
and hide it). relu'(0) = 0, as PyTorch defines it. The backward follows PyTorch's
``threshold_backward`` (dx = 0 where x <= 0, else dy): at a NaN input the comparison is
false, so dy passes through, which is what autograd of the float64 reference gives.
"""

from __future__ import annotations

import math

import torch

from kernellab.core import registry
from kernellab.core.spec import OpSpec, define, elementwise_shapes


def relu_reference(x: torch.Tensor) -> torch.Tensor:
    """torch.relu in whatever dtype ``x`` has (float64 in checks); NaN stays NaN."""
    return torch.relu(x)


def _bytes(shape, dtype, mode):
    n = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    # fwd: read x, write y. bwd: read dy and x, write dx.
    return {"fwd": 2 * n, "bwd": 3 * n, "fwdbwd": 5 * n}[mode]


def _flops(shape, mode):
    n = math.prod(shape)  # one compare (and select) per element each way
    return {"fwd": n, "bwd": n, "fwdbwd": 2 * n}[mode]


SPEC = define(
    OpSpec(
        name="relu",
        arg_names=("x",),
        key_validates=True,
        reference=relu_reference,
        flops=_flops,
        bytes_moved=_bytes,
        test_shapes=elementwise_shapes(),
        quick_shapes=[(0,), (1,), (1025,), (129, 1000)],
        bench_shapes=[(2**p,) for p in (16, 20, 24, 26, 28)] + [(64 * 32 * 28 * 28,), (1024 * 64 * 14 * 14,)],
        cpu_bench_shapes=[(2**p,) for p in (10, 14, 18)],
        layout_shape=(37, 1025),
        reach_shape=(5, 1025),
        grad_args=(0,),
        specials=(float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 1e-45, -1e-45),
        rows_shape=(65537, 3),
        doc=__doc__.strip().split("\n")[0],
    )
)


def relu(x: torch.Tensor, *, backend: str | None = None) -> torch.Tensor:
    """ReLU of ``x`` with the chosen backend (default: the fastest available here)."""
    return registry.call("relu", backend, x)


from kernellab.ops.relu import cuda as _cuda  # noqa: E402,F401  (registrations)
from kernellab.ops.relu import reference as _reference  # noqa: E402,F401
from kernellab.ops.relu import triton as _triton  # noqa: E402,F401
