"""What sum, max and argmax share: validation of x, the reduced dim moved last, the
cases max and argmax are checked on, the Triton row-block config, and the op-kit
declarations (core/kit.py, composed backward) of their Triton and CUDA backends.

sum: a backend supplies two launchers over contiguous-or-not tensors:
``fwd_all(x) -> 0-d tensor`` and ``fwd_rows(x) -> x.shape[:-1]`` (sum of each row of the
last dim), both in x's dtype; ``sum_backend`` makes them the custom ops
``kernellab::sum_<name>_all`` / ``_rows`` and the registry callable ``fn(x, dim=None)``.
Backward: a sum's gradient is dy broadcast to x's shape; ``expand`` makes it a view (no
kernel, no memory), as torch's own SumBackward does.

max / argmax: a backend supplies one launcher ``rows(x, want_values) -> (values or None,
indices)`` over the last dim; ``max_backend`` makes the custom op ``kernellab::max_<name>``
(values and int64 indices) and ``argmax_backend`` ``kernellab::argmax_<name>`` (indices
only, no gradient). Backward of max: dy scattered to the argmax positions of a zero
tensor (torch's value_selecting_reduction_backward): a fill and a scatter, plain PyTorch
ops.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import torch
from torch import Tensor

from kernellab import triton_support
from kernellab.core.kit import OpDecl, build
from kernellab.core.spec import FLOAT_DTYPES, BadInput, Boundary, check_dtype, fuzz_rows, refuse_nested

# --------------------------------------------------------------------------- validation


def check_x(x, devices, op: str, dtypes=FLOAT_DTYPES) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{op}: x must be a torch.Tensor, got {type(x).__name__}")
    check_dtype(op, "x", x, dtypes)
    if x.is_nested:
        refuse_nested(op, [("x", x)])
    if x.device.type not in devices:
        raise ValueError(
            f"{op}: x is on {x.device}, but this backend runs on {' or '.join(devices)} tensors only"
        )


def dim_last(x: Tensor, dim: int) -> Tensor:
    """x with ``dim`` (valid for x) moved last; the other dims keep their order."""
    nd = x.dim()
    if nd and dim % nd != nd - 1:
        return x.movedim(dim, -1)
    return x


def last_dim(x, dim, op: str):
    """max's and argmax's ``x`` with ``dim`` moved last, after checking ``dim``."""
    if not isinstance(x, torch.Tensor):
        return x  # the registry's validation names x
    nd = x.dim() or 1
    if isinstance(dim, bool) or not isinstance(dim, int) or not -nd <= dim < nd:
        raise ValueError(f"{op}: dim must be an int in [{-nd}, {nd - 1}], got {dim!r}")
    return dim_last(x, dim)


def alert_not_deterministic(what: str) -> None:
    """What PyTorch's own nondeterministic kernels do under
    ``torch.use_deterministic_algorithms(True)``: raise a RuntimeError naming ``what``
    (a warning under ``warn_only=True``); nothing otherwise. For a backend whose result
    depends on the order its floating-point atomics land in (sum's cuda_v3)."""
    if torch.are_deterministic_algorithms_enabled():
        msg = (
            f"{what} is not deterministic (floating-point atomics), but "
            "torch.use_deterministic_algorithms(True) is set; use backend 'cuda', 'triton' or 'torch'"
        )
        if torch.is_deterministic_algorithms_warn_only_enabled():
            warnings.warn(msg, stacklevel=3)
        else:
            raise RuntimeError(msg)


# --------------------------------------------------------------------------- max and argmax cases


def validate_rows(op: str):
    """The validator of max or argmax: one tensor x whose last dim is not empty."""

    def validate(args, kwargs, devices, dtypes=FLOAT_DTYPES) -> None:
        if len(args) != 1:
            raise TypeError(f"{op}() takes 1 tensor argument (x), got {len(args)}")
        x = args[0]
        check_x(x, devices, op, dtypes)
        if kwargs:
            raise TypeError(f"{op}() got unexpected keyword arguments {sorted(kwargs)}")
        if x.dim() and x.shape[-1] == 0:
            raise ValueError(
                f"{op}: x has shape {tuple(x.shape)}: its last dim is empty, and there is no "
                "maximum of zero elements"
            )

    return validate


def _plant_rows(x: torch.Tensor) -> None:
    """A fully -inf row (answer: index 0), a tie at both ends of a row (the first wins),
    and a row with two NaNs (the first NaN's index)."""
    if not x.is_contiguous() or x.dim() < 2 or x.shape[-1] < 8:
        return
    rows = x.reshape(-1, x.shape[-1])
    if rows.shape[0] < 4:
        return
    rows[1].fill_(float("-inf"))
    top = rows[2].float().nan_to_num(0.0, 0.0, 0.0).abs().max() + 1
    rows[2, 3] = top
    rows[2, -1] = top
    rows[3, 5] = float("nan")
    rows[3, 7] = float("nan")


def _empty_rows(device, dtype):
    return (torch.empty(3, 0, device=device, dtype=dtype),), {}


def _unknown_kw(device, dtype):
    return (torch.randn(3, 4, device=device).to(dtype),), {"dim": 0}


def _flops(shape, mode):
    return math.prod(shape)  # one comparison per element


# The OpSpec fields max and argmax share: their inputs, shapes and hostile cases are one.
ROW_CASES = dict(
    arg_names=("x",),
    flops=_flops,
    test_shapes=[
        (0, 7),
        (1,),
        (17,),
        (1023,),
        (3, 123),
        (5, 1025),
        (2, 3, 257),
        (65537, 3),
        (4, 4097),
        (2, 20000),
        (129, 1000),
    ],
    quick_shapes=[(0, 7), (1,), (3, 123), (2, 9000)],
    bench_shapes=[(32768, 4096)],
    cpu_bench_shapes=[(64, 1024)],
    layout_shape=(37, 1025),
    reach_shape=(5, 1025),
    scale=3.0,
    plant_extra=_plant_rows,
    rows_shape=(65537, 3),
    fuzz=fuzz_rows(6000, 160000),  # argmax over a vocabulary: greedy decoding
    # every row holds its maximum several times: the first index wins, and max's gradient
    # goes there alone (the specials plant one tie, forward only)
    boundary_cases=[Boundary((6, 33), ties=True)],
    default_backends=("cuda", "triton", "torch"),
    key_validates=True,
    extra_bad_inputs=[
        BadInput("empty last dim", _empty_rows, "x"),
        BadInput("unknown keyword", _unknown_kw, "dim", exc=(TypeError,)),
    ],
)


# --------------------------------------------------------------------------- Triton config

MAX_ROW_BLOCK = 4096  # columns per step of a row kernel


def rows_config(n_cols: int):
    """(BLOCK, ROWS, num_warps) of the Triton row kernels: ~4096 elements per step; short
    rows share a program."""
    block = min(triton_support.next_pow2(max(n_cols, 1)), MAX_ROW_BLOCK)
    rows = max(1, min(64, MAX_ROW_BLOCK // block))
    return block, rows, 4 if block * rows <= 2048 else 8


# --------------------------------------------------------------------------- backends


def _one_tensor(make):
    return (make(1),)


def _sum_op(name: str, fwd: Callable, fake: Callable, grad: Callable, triton: bool):
    def _fwd(x: Tensor) -> Tensor:
        return fwd(x)

    return build(
        OpDecl(
            name=name,
            fwd=_fwd,
            fwd_fake=fake,
            save=lambda inputs, out: ((), inputs[0].shape),
            needs_grad=lambda x: x.requires_grad,
            samples=(_one_tensor,),
            backward=lambda fwd, saved, shape, dy, need: (grad(dy, shape),),
            triton=triton,
        )
    )


def sum_backend(name: str, fwd_all: Callable, fwd_rows: Callable, triton: bool = False):
    """The registry callable ``fn(x, dim=None)`` of a sum backend (module docstring)."""
    whole = _sum_op(
        f"sum_{name}_all", fwd_all, lambda x: x.new_empty(()), lambda dy, shape: dy.expand(shape), triton
    )
    rows = _sum_op(
        f"sum_{name}_rows",
        fwd_rows,
        lambda x: x.new_empty(x.shape[:-1]),
        lambda dy, shape: dy.unsqueeze(-1).expand(shape) if len(shape) else dy.expand(shape),
        triton,
    )

    def call(x: Tensor, dim=None) -> Tensor:
        return whole(x) if dim is None else rows(dim_last(x, dim))

    call.custom_ops = whole.custom_ops + rows.custom_ops
    call.__name__ = f"sum_{name}"
    return call


def max_grad_torch(idx: Tensor, dv: Tensor, shape) -> Tensor:
    """dx of max as torch's backward builds it: zeros, then dv scattered to the argmax."""
    dx = torch.zeros(shape, dtype=dv.dtype, device=dv.device)
    return dx.scatter_(-1, idx.unsqueeze(-1), dv.unsqueeze(-1))


def max_backend(name: str, rows: Callable, triton: bool = False, grad: Callable = max_grad_torch):
    """The registry callable ``fn(x) -> (values, indices)`` of a max backend. ``grad(idx,
    dv, shape) -> dx`` writes the backward (dv at the argmax positions, zeros elsewhere)."""

    def _max(x: Tensor) -> tuple[Tensor, Tensor]:
        v, i = rows(x, True)
        return v, i

    def _max_grad(fwd, saved, shape, dy, need):
        (idx,) = saved
        dv = dy[0]  # (the indices have no gradient)
        if len(shape) == 0:
            return (dv.clone(),)
        if fwd is not _max:
            # the custom op (traced, or the backward differentiated again): torch's ops,
            # which tracing sees through and autograd differentiates
            return (max_grad_torch(idx, dv, shape),)
        return (grad(idx, dv, shape),)

    call = build(
        OpDecl(
            name=f"max_{name}",
            fwd=_max,
            fwd_fake=lambda x: (x.new_empty(x.shape[:-1]), x.new_empty(x.shape[:-1], dtype=torch.int64)),
            save=lambda inputs, out: ((out[1],), inputs[0].shape),
            needs_grad=lambda x: x.requires_grad,
            samples=(_one_tensor,),
            backward=_max_grad,
            outputs=2,
            triton=triton,
        )
    )
    return call


def argmax_backend(name: str, rows: Callable, triton: bool = False):
    """The registry callable ``fn(x) -> indices`` of an argmax backend: max's launcher
    without the values store. Not differentiable (int64 indices)."""

    def _argmax(x: Tensor) -> Tensor:
        return rows(x, False)[1]

    call = build(
        OpDecl(
            name=f"argmax_{name}",
            fwd=_argmax,
            fwd_fake=lambda x: x.new_empty(x.shape[:-1], dtype=torch.int64),
            save=lambda inputs, out: ((), None),
            needs_grad=lambda x: False,
            samples=(lambda make: (make(0),),),
            backward=lambda fwd, saved, extra, dy, need: (None,),
            triton=triton,
        )
    )
    return call
