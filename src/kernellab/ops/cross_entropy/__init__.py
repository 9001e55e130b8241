"""Cross-entropy over the vocabulary of [N, V] logits with int64 targets (issue 3).

    lse_i  = log sum_j exp(x_ij)                      (fp32, online max/sum over V)
    loss_i = lse_i - x_i,t_i     (0 where t_i == ignore_index)
    "none": loss [N];  "sum": sum_i loss_i;  "mean": sum_i loss_i / #non-ignored rows
    dx_ij  = g_i * (exp(x_ij - lse_i) - [j == t_i])   (0 on ignored rows)
    with g_i = dy_i ("none"), dy ("sum"), dy / #non-ignored ("mean").

fp32 / fp16 / bf16 logits, fp32 math; the loss has the logits' dtype, as
``torch.nn.functional.cross_entropy`` returns. Like PyTorch, a batch whose rows are all
ignored gives NaN for "mean" (0 / 0), 0 for "sum", zeros for "none", and a zero gradient.

Out-of-range targets (not ignore_index and < 0 or >= V) raise ValueError naming
``target``. PyTorch itself only asserts on the device. The backends built on PyTorch ops
(manual, torch, compile) and liger must run the check to completion before the op (a bad
index asserts on the device, or reads out of bounds in liger): three tiny kernels and a
device->host copy that waits for everything queued before it. The fused backends (triton,
cuda, cuda_v1) never use a target as an address (a bad one gives a NaN loss row), so their
check overlaps the forward: a one-block
check kernel is queued first, its flag copied to pinned memory behind an event, then the
forward; the host waits for the event alone, i.e. for the check, while the GPU runs the
forward (see ``_fused``). Under torch.compile, and while a CUDA graph is captured, the
check is skipped (it would break the graph); ``check_targets=False`` (opt-in) skips it in
eager mode too, for every backend: no host wait at all. A bad target then does what the
backend does without a check: a NaN loss row and a NaN gradient row for the fused kernels
(never a read out of bounds); for torch, manual and compile on the CPU the ValueError
naming ``target`` (PyTorch's ops raise there, and their error is replaced by the check's),
on a GPU PyTorch's device-side assert; undefined for liger.

``check_targets=None`` (the default): checked, except by the fused backends on a GPU, where
the default path never waits for the device (the wait cost 0.1-0.2 ms of host time per
call, most of the op's host cost); there a bad target gives a NaN loss row (and a NaN mean),
never a read out of bounds. ``kernellab.config.check_targets = True`` (or
KERNELLAB_CHECK_TARGETS=1; a debug mode) turns the fused backends' GPU check back on for
every default call.

The fused backends (triton, cuda_v1, cuda) read the logits once in the forward, save
only the per-row log-sum-exp (N fp32) and recompute the softmax in the backward; the
softmax is never stored. ``inplace_backward=True`` (opt-in, eager only) writes dlogits
into the logits buffer instead of a new tensor, as Liger does: extra memory N floats
instead of a logits-sized gradient, but the logits are destroyed by the backward (use it
only when nothing else needs them, e.g. the LM head's output). A second backward through
the same graph (``retain_graph=True``) is refused with a RuntimeError (the logits it needs
are gone), and the backward advances the logits' version counter, so that any other
autograd node that saved them raises PyTorch's in-place modification error rather than
read the gradient as logits. The other backends accept the flag and ignore it (it never
changes a result).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernellab.core import registry
from kernellab.core.spec import (
    FLOAT_DTYPES,
    BadInput,
    Boundary,
    check_dtype,
    check_loss_options,
    declare,
    fuzz_rows,
    loss_option_sets,
    make_tensor,
)

REDUCTIONS = ("mean", "sum", "none")
OPTIONS = ("ignore_index", "reduction", "inplace_backward", "check_targets")
DEFAULT_IGNORE = -100


def cross_entropy_reference(
    logits, target, ignore_index=DEFAULT_IGNORE, reduction="mean", inplace_backward=False, check_targets=True
):
    return F.cross_entropy(logits, target, ignore_index=ignore_index, reduction=reduction)


# --------------------------------------------------------------------------- inputs


def ignored_rows(n: int, device) -> torch.Tensor:
    """Rows whose target is set to the ignore index by the inputs builder: 2, 7, 12, ..."""
    return torch.arange(2, max(n, 2), 5, device=device)


def _option_inputs(args, options):
    """The targets set to the default ignore index (rows 2, 7, 12, ...) take a non-default
    ``ignore_index`` instead, so that the option case really ignores rows (an in-range
    index such as 3 also ignores the rows that drew class 3)."""
    logits, target = args
    ii = options.get("ignore_index", DEFAULT_IGNORE)
    if ii != DEFAULT_IGNORE:
        target = torch.where(target == DEFAULT_IGNORE, torch.full_like(target, ii), target)
    return logits, target


def _inputs(shape, dtype, device, gen, layout, scale):
    n, v = shape
    logits = make_tensor((n, v), dtype, device, gen, layout, scale)
    if logits is None:
        return None
    target = torch.randint(0, v, (n,), generator=gen, device=device, dtype=torch.int64)
    target[ignored_rows(n, device)] = DEFAULT_IGNORE  # ignoring is always exercised
    return logits, target


# --------------------------------------------------------------------------- validation


def _validate(args, kwargs, devices, dtypes=FLOAT_DTYPES):
    if len(args) != 2:
        raise TypeError(f"cross_entropy() takes 2 tensor arguments (logits, target), got {len(args)}")
    logits, target = args
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"cross_entropy: logits must be a torch.Tensor, got {type(logits).__name__}")
    check_dtype("cross_entropy", "logits", logits, dtypes)
    if logits.device.type not in devices:
        raise ValueError(
            f"cross_entropy: logits is on {logits.device}, but this backend runs on "
            f"{' or '.join(devices)} tensors only"
        )
    if logits.dim() != 2:
        raise ValueError(f"cross_entropy: logits must be 2-D [N, V], got shape {tuple(logits.shape)}")
    n, v = logits.shape
    if v == 0:
        raise ValueError("cross_entropy: logits must have at least one class (V >= 1), got V = 0")
    if not isinstance(target, torch.Tensor):
        raise TypeError(f"cross_entropy: target must be a torch.Tensor, got {type(target).__name__}")
    if target.dtype != torch.int64:
        raise TypeError(f"cross_entropy: target has dtype {target.dtype}; expected torch.int64")
    if target.dim() != 1 or target.shape[0] != n:
        raise ValueError(
            f"cross_entropy: target must have shape [{n}] (one per logits row), got {tuple(target.shape)}"
        )
    if target.device != logits.device:
        raise ValueError(f"cross_entropy: target is on {target.device} but logits is on {logits.device}")
    unknown = set(kwargs) - set(OPTIONS)
    if unknown:
        raise TypeError(f"cross_entropy() got unexpected keyword arguments {sorted(unknown)}")
    check_loss_options("cross_entropy", kwargs, DEFAULT_IGNORE, REDUCTIONS)
    ib = kwargs.get("inplace_backward", False)
    if not isinstance(ib, bool):
        raise TypeError(f"cross_entropy: inplace_backward must be a bool, got {ib!r}")
    ct = kwargs.get("check_targets", None)
    if ct is not None and not isinstance(ct, bool):
        raise TypeError(f"cross_entropy: check_targets must be a bool or None, got {ct!r}")
    # The target range check is not here (the validator runs before every call of every
    # backend): each backend makes it itself, see the module docstring.


# --------------------------------------------------------------------------- counts


def _bytes(shape, dtype, mode, **options):
    n, v = shape
    es = torch.empty((), dtype=dtype).element_size()
    logits = n * v * es
    small = n * 8 + n * es  # targets in, per-row loss out (an upper bound for the reductions)
    fwd = logits + small
    # fwd+bwd: read the logits again, write dlogits (the per-row lse and dy are ~N floats).
    return {"fwd": fwd, "bwd": 2 * logits + n * 8, "fwdbwd": fwd + 2 * logits}[mode]


def _flops(shape, mode, **options):
    nv = shape[0] * shape[1]  # max, sub, exp, add ~ 4 per element; bwd sub, exp, sub, mul ~ 4
    return {"fwd": 4 * nv, "bwd": 4 * nv, "fwdbwd": 8 * nv}[mode]


def _extremes(x: torch.Tensor) -> None:
    """Row 0 gets logits of +-1e4 (finite in fp16): the max subtraction keeps the loss finite."""
    if x.shape[0] >= 1 and x.shape[1] >= 2:
        x[0, 0::2] = 1e4
        x[0, 1::2] = -1e4


def _bad(build):
    return lambda device, dtype: build(device, dtype)


def _lt(device, dtype, n=4, v=3):
    return torch.randn(n, v, device=device).to(dtype), torch.zeros(n, dtype=torch.int64, device=device)


def _with_target(values):
    # check_targets=True: the fused backends skip the range check on a GPU by default.
    def build(device, dtype):
        logits, _ = _lt(device, dtype)
        return (logits, torch.tensor(values, dtype=torch.int64, device=device)), {"check_targets": True}

    return build


def _opt(**kw):
    def build(device, dtype):
        return _lt(device, dtype), kw

    return build


EXTRA_BAD = [
    BadInput("target >= V", _with_target([0, 3, 1, 2]), "target"),
    BadInput("negative target that is not ignore_index", _with_target([0, -5, 1, 2]), "target"),
    BadInput(
        "int32 target",
        lambda device, dtype: ((_lt(device, dtype)[0], torch.zeros(4, dtype=torch.int32, device=device)), {}),
        "target",
    ),
    BadInput(
        "target of the wrong length",
        lambda device, dtype: ((_lt(device, dtype)[0], torch.zeros(5, dtype=torch.int64, device=device)), {}),
        "target",
    ),
    BadInput(
        "1-D logits",
        lambda device, dtype: (
            (torch.randn(4, device=device).to(dtype), torch.zeros(4, dtype=torch.int64, device=device)),
            {},
        ),
        "logits",
    ),
    BadInput("unknown reduction", _opt(reduction="avg"), "reduction"),
    BadInput("float ignore_index", _opt(ignore_index=-100.0), "ignore_index"),
]

SPEC = declare(
    "cross_entropy", ("logits", "target"), cross_entropy_reference, _flops, _bytes,
    problem_ranks=(2,), problem_dims="(N, V): N rows of V logits",
    test_shapes=[(0, 7), (1, 1), (3, 1000), (7, 1023), (5, 4097), (2, 32001), (65537, 3), (2, 50304)],
    quick_shapes=[(0, 7), (1, 1), (3, 1000), (2, 4099)],
    bench_shapes=[(8192, 50304), (8192, 128256)],
    cpu_bench_shapes=[(64, 1000)],
    layout_shape=(13, 1025),
    reach_shape=(5, 1025),
    grad_args=(0,),
    scale=2.0,
    plant_extra=_extremes,
    inputs=_inputs,
    validator=_validate,
    # _option_inputs puts a non-default ignore_index where the builder planted -100.
    option_sets=[
        *loss_option_sets(),
        {"inplace_backward": True},
        {"check_targets": False},
        {"check_targets": True},
    ],
    option_inputs=_option_inputs,
    # timed as F.cross_entropy's and Liger's users call them: without the synchronizing
    # target check kernellab's torch, compile and liger forms run by default (the fused
    # backends' default never waits for the device)
    peer_options={"check_targets": False},
    fuzz=fuzz_rows(6000, 160000, max_rows=32, lead_rank=1),  # GPU: every model's vocabulary
    # documented in-place mode: the backward writes dlogits into the logits' buffer
    inplace_options={"inplace_backward": ("logits",)},
    rows_shape=(65537, 3),
    rows_shape_interpreted=False,  # one program per row: 210 s per call interpreted
    grad_shapes=[(13, 1025), (3, 4099)],
    # A vocabulary past two 4096-column chunks and past 8192 (a kernel that handles
    # one or two chunks and drops the rest), in two rows: cheap under the interpreter.
    boundary_cases=[Boundary((2, 8197))],
    bad_shape=(4, 3),
    extra_bad_inputs=EXTRA_BAD,
    default_backends=("cuda", "triton", "torch"),
    doc=__doc__.strip().split("\n")[0],
)


def cross_entropy(
    logits: torch.Tensor,
    target: torch.Tensor,
    ignore_index: int = DEFAULT_IGNORE,
    reduction: str = "mean",
    *,
    backend: str | None = None,
    inplace_backward: bool = False,
    check_targets: bool | None = None,
) -> torch.Tensor:
    """Cross-entropy of [N, V] ``logits`` against int64 ``target`` [N] with the chosen backend
    (see the module docstring for ``ignore_index``, ``reduction``, ``inplace_backward`` and
    ``check_targets``)."""
    opts = {"ignore_index": ignore_index, "reduction": reduction}
    if inplace_backward is not False:
        opts["inplace_backward"] = inplace_backward
    if check_targets is not None:
        opts["check_targets"] = check_targets
    return registry.call("cross_entropy", backend, logits, target, **opts)


from kernellab.ops.cross_entropy import cuda as _cuda  # noqa: E402,F401
from kernellab.ops.cross_entropy import liger as _liger  # noqa: E402,F401
from kernellab.ops.cross_entropy import reference as _reference  # noqa: E402,F401  (registrations)
from kernellab.ops.cross_entropy import triton as _triton  # noqa: E402,F401
