"""The LM head and its cross-entropy in one op, the [N, V] logits never stored.

    logits = x @ weight^T + bias                     x [N, H] or [B, T, H], weight [V, H]
    loss_i = lse_i - (1 - eps) * logits_i,t_i - eps / V * sum_j logits_ij + z * lse_i^2
             (0 where t_i == ignore_index; lse_i = log sum_j exp(logits_ij))
    "none": loss [N] (or [B, T]); "sum": sum_i loss_i; "mean": sum_i loss_i / #non-ignored

With ``z_loss=0`` this is exactly ``F.cross_entropy(x @ weight.T + bias, target,
ignore_index=, reduction=, label_smoothing=)`` (mean over the non-ignored rows; every row
ignored: NaN for "mean", 0 for "sum", a zero gradient, as PyTorch). ``z_loss > 0`` adds
PaLM's z-loss, ``z * lse^2`` per non-ignored row, reduced like the cross-entropy term:
the op returns one loss, the sum of both terms (the z term is not returned apart: a
trainer that logs it computes ``lse`` on a few rows itself; one output keeps the
gradient-in-forward scheme below to one scalar scale). The loss has x's dtype.

Backends: ``manual`` (full logits, log_softmax + gather in fp32), ``torch`` (F.linear in
x's dtype, F.cross_entropy on the logits in fp32, as Hugging Face heads do: the
baseline), ``compile`` (torch.compile of manual) store the [N, V] logits; ``chunked``,
``triton`` and ``triton_rows`` do not.

The ``chunked`` backend (PyTorch ops) takes the rows ``chunk`` at a time (default: as many
rows as make a chunk's logits about the size of x, Liger's rule, but at least 64 rows: a
thinner matmul wastes the tensor cores' tiles, and on the CPU MKL's thin products sum in
another order, ~30% more rounding than PyTorch's one product at 4 rows). For each chunk:
fp32 logits [chunk, V] from one matmul, the per-row loss and d(loss)/d(logits) written
over the logits in place, then dx[chunk] = dlogits @ weight and dweight += dlogits^T @
x[chunk] (fp32 accumulators for dweight and dbias). Peak extra memory: one chunk of fp32
logits + dweight in fp32 (V*H*4 bytes) + dx, never N*V.

The ``triton`` backend takes ``chunk`` rows per pass (default: every row, up to 131072)
and the vocabulary in column blocks of 16M-64M logits (``block_cols``): a first
sweep over the blocks computes each row's softmax statistics and loss, a second computes
the logits again, d(loss)/d(logits) in x's dtype, dx += dlogits @ weight[block] in fp32
and dweight[block] = dlogits^T @ x in one product, rounded once. One more logits matmul
than ``chunked``, no [V, H] fp32 accumulator when one pass holds every row (dweight is
made in the weight's dtype), and dweight's products large enough for the tensor cores
(row chunks of 128 leave the accumulator's read and write memory-bound). Peak extra
memory: one block of fp32 logits and one of dlogits, dx in fp32 (N*H*4), dweight. A problem
that fits one pass of one block (up to 64M logits) runs as ``triton_rows`` does with one
chunk: the logits made once.

The ``triton_rows`` backend runs ``chunked``'s order with Triton's row kernels: row chunks
of up to 2^28 logits and the larger of N / 16 and 2 H / 3 rows (``rows_chunk``; fewer reads
and writes of the fp32 dweight accumulator than ``chunked``'s chunks near x's size), each
chunk's logits made once, the statistics and dlogits kernels of ``triton`` over its full
rows, dlogits written in x's dtype. Peak extra memory: dweight in fp32, dx, and one chunk
of fp32 logits and of dlogits (up to 1 GiB and 0.5 GiB in 16 bits; under a fifth of the
[N, V] logits in 16 bits, or under dweight's fp32 accumulator where that is larger). One
kernel per chunk takes each row's statistics, loss and dlogits; one checks the targets,
one reduces the row losses, and the eager backward scales the saved gradients in one.

All three: with reduction "mean" or "sum" the gradients are computed in the forward and saved
(the logits are gone; Liger does the same), and the backward only scales them by
grad_output (and 1 / #non-ignored for "mean"), in place in eager mode (a new dweight there
would be one more [V, H] tensor at the step's peak): a second backward through the same
graph (``retain_graph=True``) is refused with a RuntimeError (use backend="torch"). With "none" the per-row grad_output is
unknown in the forward, and dweight = sum_i g_i dlogits_i^T x_i cannot be rescaled
afterwards: the backward recomputes the logits with g folded into dlogits; the forward
computes and saves no gradient.

16-bit x and weight: the logits are computed by a 16-bit matmul (cuBLAS accumulates in
fp32; the result is kept in fp32 for the softmax); dlogits are rounded to the input dtype
for the dx and dweight matmuls (as PyTorch's autograd does); sums over chunks are fp32,
rounded once at the end.

Targets: int64, each in [0, V) or equal to ``ignore_index``; anything else raises
ValueError naming ``target`` where the call checks: one small reduction and a device-to-host
read per call, before the compute, a wait for the device. ``check_targets=None`` (the
default) checks in eager mode, except in the triton backends on a GPU, whose kernels clamp a
target before using it as an address: there a bad target gives a NaN loss row (and NaN
gradients) and the call never waits, as cross_entropy's fused backends
(``kernellab.config.check_targets = True`` checks there too). ``check_targets=True`` always
checks; ``False`` (opt-in) never does, and a bad target does what it does under
torch.compile, where the check is skipped: a NaN row for the triton backends, PyTorch's
index error for the others, undefined for liger. The harness times the vendors' backends
(torch, compile, liger) with it, as their users call PyTorch's and Liger's ops
(``OpSpec.peer_options``).

Double backward (create_graph=True): manual and torch (PyTorch ops) support it; the
chunked backends raise a RuntimeError (their backward is a scale of saved gradients).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from kernellab.core import registry
from kernellab.core.spec import (
    FLOAT_DTYPES,
    BadInput,
    Boundary,
    TensorOption,
    check_float_tensor,
    check_loss_options,
    declare,
    fuzz_dim,
    loss_option_sets,
    make_tensor,
)
from kernellab.ops.linear_cross_entropy.targets import DEFAULT_IGNORE, OP, logits_loss

REDUCTIONS = ("mean", "sum", "none")
OPTIONS = ("bias", "ignore_index", "reduction", "label_smoothing", "z_loss", "chunk", "check_targets")


def linear_cross_entropy_reference(
    x, weight, target, bias=None, ignore_index=DEFAULT_IGNORE, reduction="mean", label_smoothing=0.0,
    z_loss=0.0, chunk=None, check_targets=None,
):  # fmt: skip
    """PyTorch ops in the inputs' dtype (float64 for the check): full logits, F.cross_entropy."""
    logits = F.linear(x, weight, bias).reshape(-1, weight.shape[0])
    loss = logits_loss(logits, target.reshape(-1), ignore_index, reduction, label_smoothing, z_loss)
    if reduction == "none":
        loss = loss.reshape(target.shape)
    return loss


# --------------------------------------------------------------------------- inputs


def split_shape(shape) -> tuple[tuple, int, int]:
    """Problem shape (N, H, V) or (B, T, H, V) -> (lead dims, H, V)."""
    shape = tuple(shape)
    if len(shape) not in (3, 4):
        raise ValueError(f"linear_cross_entropy problem shape is (N, H, V) or (B, T, H, V), got {shape}")
    return shape[:-2], shape[-2], shape[-1]


def ignored_rows(n: int, device) -> torch.Tensor:
    """Rows whose target is set to the ignore index by the inputs builder: 2, 7, 12, ..."""
    return torch.arange(2, max(n, 2), 5, device=device)


def _inputs(shape, dtype, device, gen, layout, scale):
    lead, h, v = split_shape(shape)
    n = math.prod(lead)
    x = make_tensor(lead + (h,), dtype, device, gen, layout, scale)
    # weight ~ N(0, 1/H): logits ~ N(0, scale^2), the regime of a trained head
    w = make_tensor((v, h), dtype, device, gen, layout, 1.0 / math.sqrt(max(h, 1)))
    if x is None or w is None:
        return None
    target = torch.randint(0, max(v, 1), (n,), generator=gen, device=device, dtype=torch.int64)
    target[ignored_rows(n, device)] = DEFAULT_IGNORE  # ignoring is always exercised
    return x, w, target.reshape(lead)


def _option_inputs(args, options):
    """Targets planted at -100 take a non-default ``ignore_index`` instead."""
    x, w, target = args
    ii = options.get("ignore_index", DEFAULT_IGNORE)
    if ii != DEFAULT_IGNORE:
        target = torch.where(target == DEFAULT_IGNORE, torch.full_like(target, ii), target)
    return x, w, target


def _bias(args, dtype, device, gen):
    """A bias [V] for the option cases: N(0, 1), so an ignored bias moves the loss by ~1."""
    return make_tensor((args[1].shape[0],), dtype, device, gen)


BIAS = TensorOption(_bias)


# --------------------------------------------------------------------------- validation


def _number(name, value, lo, hi=None):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{OP}: {name} must be a float, got {value!r}")
    if not (value >= lo and (value <= hi if hi is not None else math.isfinite(value))):  # NaN fails
        where = f"in [{lo}, {hi}]" if hi is not None else f"finite and >= {lo}"
        raise ValueError(f"{OP}: {name} must be {where}, got {value!r}")


def validate(args, kwargs, devices=("cuda", "cpu"), dtypes=FLOAT_DTYPES) -> None:
    """TypeError / ValueError naming the argument. The target values' range is checked by
    each backend (``check_targets``), not here."""
    if len(args) != 3:
        raise TypeError(f"{OP}() takes 3 tensor arguments (x, weight, target), got {len(args)}")
    x, w, target = args
    check_float_tensor(OP, "x", x, devices, dtypes)
    check_float_tensor(OP, "weight", w, devices, dtypes)
    if x.dim() not in (2, 3):
        raise ValueError(f"{OP}: x must be [N, H] or [B, T, H], got shape {tuple(x.shape)}")
    if w.dim() != 2:
        raise ValueError(f"{OP}: weight must be 2-D [V, H] (nn.Linear layout), got shape {tuple(w.shape)}")
    if w.device != x.device:
        raise ValueError(f"{OP}: weight is on {w.device} but x is on {x.device}")
    if w.dtype != x.dtype:
        raise TypeError(f"{OP}: weight has dtype {w.dtype} but x has {x.dtype}")
    if w.shape[1] != x.shape[-1]:
        raise ValueError(
            f"{OP}: weight has shape {tuple(w.shape)} ([V, H]) but x has H = {x.shape[-1]} "
            f"(shape {tuple(x.shape)}); weight.shape[1] must equal x.shape[-1]"
        )
    if w.shape[0] == 0:
        raise ValueError(f"{OP}: weight must have at least one row (V >= 1 classes), got {tuple(w.shape)}")
    if not isinstance(target, torch.Tensor):
        raise TypeError(f"{OP}: target must be a torch.Tensor, got {type(target).__name__}")
    if target.dtype != torch.int64:
        raise TypeError(f"{OP}: target has dtype {target.dtype}; expected torch.int64")
    if tuple(target.shape) != tuple(x.shape[:-1]):
        raise ValueError(
            f"{OP}: target must have shape {tuple(x.shape[:-1])} (x's shape without H), "
            f"got {tuple(target.shape)}"
        )
    if target.device != x.device:
        raise ValueError(f"{OP}: target is on {target.device} but x is on {x.device}")
    if target.layout is not torch.strided:
        raise TypeError(f"{OP}: target has layout {target.layout}; only strided tensors are supported")
    unknown = set(kwargs) - set(OPTIONS)
    if unknown:
        raise TypeError(f"{OP}() got unexpected keyword arguments {sorted(unknown)}")
    bias = kwargs.get("bias")
    if bias is not None:
        if not isinstance(bias, torch.Tensor):
            raise TypeError(f"{OP}: bias must be a torch.Tensor or None, got {type(bias).__name__}")
        check_float_tensor(OP, "bias", bias, devices, dtypes)
        if bias.dtype != x.dtype:
            raise TypeError(f"{OP}: bias has dtype {bias.dtype} but x has {x.dtype}")
        if bias.device != x.device:
            raise ValueError(f"{OP}: bias is on {bias.device} but x is on {x.device}")
        if tuple(bias.shape) != (w.shape[0],):
            raise ValueError(f"{OP}: bias must have shape ({w.shape[0]},) (V), got {tuple(bias.shape)}")
    check_loss_options(OP, kwargs, DEFAULT_IGNORE, REDUCTIONS)
    _number("label_smoothing", kwargs.get("label_smoothing", 0.0), 0.0, 1.0)
    _number("z_loss", kwargs.get("z_loss", 0.0), 0.0)
    chunk = kwargs.get("chunk")
    if chunk is not None and (not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 1):
        raise ValueError(f"{OP}: chunk must be None or a positive int (rows per chunk), got {chunk!r}")
    ct = kwargs.get("check_targets")
    if ct is not None and not isinstance(ct, bool):
        raise TypeError(f"{OP}: check_targets must be a bool or None, got {ct!r}")




# --------------------------------------------------------------------------- counts


def _flops(shape, mode, **options):
    lead, h, v = split_shape(shape)
    n = math.prod(lead)
    mm = 2 * n * h * v  # one [N, H] x [H, V] product
    # the chunked backends run all three products in the forward; the counts are the
    # problem's: logits (fwd), dx and dweight (bwd)
    return {"fwd": mm, "bwd": 2 * mm, "fwdbwd": 3 * mm}[mode]


def _bytes(shape, dtype, mode, **options):
    lead, h, v = split_shape(shape)
    n = math.prod(lead)
    es = torch.empty((), dtype=dtype).element_size()
    xw = (n * h + v * h) * es
    fwd = xw + n * 8 + n * es
    return {"fwd": fwd, "bwd": 2 * xw + n * es, "fwdbwd": fwd + 2 * xw}[mode]


SMALL_LOGITS = 1 << 20


def _small_backend(key) -> str | None:
    """PyTorch's linear + cross_entropy for N x V <= 2^20 logits (at most 4 MiB stored in
    fp32): there a call is launch-bound, and PyTorch's 3 kernels cost less host time than
    the blocked runner's ~30 (the host-cost benchmark's rows, benchmarks/NOTES.md). Where a
    tuning table has a row near the shape, the row decides."""
    n, _, v = key
    return "torch" if n * v <= SMALL_LOGITS else None


STORING = ("torch", "manual", "compile")  # the backends that store the [N, V] logits


def _default_excludes(key) -> tuple:
    """Past the small size, the default never picks a backend that stores the logits (the
    op's promise), even where a table row found one faster."""
    n, _, v = key
    return () if n * v <= SMALL_LOGITS else STORING


def _fuzz(rng, big: bool):
    """(N, H, V) or (B, T, H, V): vocabularies past one 4096-column block and past 8192."""
    v = fuzz_dim(rng, 1, 160000 if big else 9000)
    h = fuzz_dim(rng, 1, 4096 if big else 64)
    n = fuzz_dim(rng, 1, 8192 if big else 24)
    if rng.random() < 0.3 and n >= 4:
        b = fuzz_dim(rng, 1, 4)
        return (b, max(1, n // b), h, v), None
    return (n, h, v), None


def _pack(device, dtype, n=4, h=6, v=5, t_dtype=torch.int64):
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(n, h, generator=g, device=device).to(dtype)
    w = torch.randn(v, h, generator=g, device=device).to(dtype)
    t = torch.zeros(n, dtype=t_dtype, device=device)
    return x, w, t


def _with(**kw):
    return lambda d, t: (_pack(d, t), kw)


def _swap(i, make, **kwargs):
    """The good pack with argument ``i`` replaced by ``make(pack, device, dtype)``, called
    with ``kwargs``."""

    def build(device, dtype):
        args = list(_pack(device, dtype))
        args[i] = make(args, device, dtype)
        return tuple(args), dict(kwargs)

    return build


def _targets(values):
    """Bad target values, with ``check_targets=True``: on a GPU the Triton backends skip the
    range check by default (a bad target gives a NaN row there), as cross_entropy's do."""
    return _swap(2, lambda a, d, t: torch.tensor(values, dtype=torch.int64, device=d), check_targets=True)


def _other_dtype(w, dtype):
    return w.to(torch.float16 if dtype != torch.float16 else torch.float32)


EXTRA_BAD = [
    BadInput("weight's H differs from x's", _swap(1, lambda a, d, t: _pack(d, t, h=7)[1]), "weight"),
    BadInput("weight not 2-D", _swap(1, lambda a, d, t: a[1][None]), "weight"),
    BadInput("weight in another dtype", _swap(1, lambda a, d, t: _other_dtype(a[1], t)), "weight"),
    BadInput("int32 target", _swap(2, lambda a, d, t: a[2].int()), "target"),
    BadInput("target of the wrong length", _swap(2, lambda a, d, t: a[2].new_zeros(5)), "target"),
    BadInput("target >= V", _targets([0, 5, 1, 2]), "target"),
    BadInput("negative target that is not ignore_index", _targets([0, -5, 1, 2]), "target"),
    BadInput("bias of the wrong length", lambda d, t: (_pack(d, t), {"bias": _pack(d, t)[1][:4, 0]}), "bias"),
    BadInput("unknown reduction", _with(reduction="avg"), "reduction"),
    BadInput("negative label_smoothing", _with(label_smoothing=-0.1), "label_smoothing"),
    BadInput("label_smoothing > 1", _with(label_smoothing=1.5), "label_smoothing"),
    BadInput("negative z_loss", _with(z_loss=-1e-4), "z_loss"),
    BadInput("infinite z_loss", _with(z_loss=float("inf")), "z_loss"),
    BadInput("float ignore_index", _with(ignore_index=-100.0), "ignore_index"),
    BadInput("chunk of 0 rows", _with(chunk=0), "chunk"),
]  # fmt: skip

SPEC = declare(
    OP, ("x", "weight", "target"), linear_cross_entropy_reference, _flops, _bytes,
    problem_ranks=(3, 4), problem_dims="(N, H, V) or (B, T, H, V)",
    test_shapes=[(0, 8, 7), (1, 1, 1), (37, 24, 300), (2, 5, 16, 129), (3, 16, 4099)],
    quick_shapes=[(0, 8, 7), (1, 1, 1), (37, 24, 300), (2, 5, 16, 129)],
    bench_shapes=[(8192, 768, 50304), (8192, 2048, 128256), (16384, 896, 151936)],
    cpu_bench_shapes=[(256, 64, 1000)],
    layout_shape=(13, 24, 300),
    reach_shape=(9, 16, 131),
    grad_args=(0, 1),
    dtypes=FLOAT_DTYPES,
    scale=2.0,
    metric="tflops",
    inputs=_inputs,
    validator=validate,
    option_sets=[
        *loss_option_sets(),
        {"label_smoothing": 0.1},
        {"label_smoothing": 0.2, "reduction": "none"},
        {"z_loss": 1e-2},
        {"z_loss": 1e-3, "label_smoothing": 0.1, "reduction": "sum"},
        {"bias": BIAS},
        {"bias": BIAS, "reduction": "none", "z_loss": 1e-2},
        {"chunk": 5},
        {"chunk": 1000},
        {"check_targets": False},
    ],
    option_inputs=_option_inputs,
    # timed as PyTorch's and Liger's users call them: without the target check kernellab's
    # forms of them run (it reads a result on the host, a wait for the device)
    peer_options={"check_targets": False},
    fuzz=_fuzz,
    # dx_i = sum_j dlogits_ij W_j is a dot with cancellation (sum_j dlogits_ij = 0 up to
    # smoothing): its rounding is at the scale of the terms, not of the result, as for
    # matmul; the loss and gradients are continuous in x, weight and bias.
    perturbation_floor=True,
    grad_shapes=[(37, 24, 300), (2, 3, 8, 133)],
    # V past two 4096-column blocks (a kernel that handles one or two blocks and drops
    # the rest), V not a multiple of the chunk's rows, every row ignored (mean: NaN,
    # zero gradients), a chunk that does not divide N.
    boundary_cases=[
        Boundary((3, 8, 8197)),
        Boundary((7, 8, 33), {"chunk": 3}),
        Boundary((3, 8, 17), {"ignore_index": 1, "chunk": 2}),
    ],
    bad_shape=(4, 6, 5),
    extra_bad_inputs=EXTRA_BAD,
    default_backends=("triton", "chunked", "torch"),
    small_backend=_small_backend,
    default_excludes=_default_excludes,
    # no "bwd": timing a backward alone repeats it on one graph, which the chunked
    # backends refuse (their backward scales the saved gradients in place)
    modes=("fwd", "fwdbwd"),
    doc=__doc__.strip().split("\n")[0],
)


def linear_cross_entropy(
    x: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    ignore_index: int = DEFAULT_IGNORE,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    chunk: int | None = None,
    check_targets: bool | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """Cross-entropy of ``x @ weight.T + bias`` against ``target`` without storing the logits
    (see the module docstring for the options and what each backend saves)."""
    opts = {"ignore_index": ignore_index, "reduction": reduction}
    if bias is not None:
        opts["bias"] = bias
    if label_smoothing != 0.0:
        opts["label_smoothing"] = label_smoothing
    if z_loss != 0.0:
        opts["z_loss"] = z_loss
    if chunk is not None:
        opts["chunk"] = chunk
    if check_targets is not None:
        opts["check_targets"] = check_targets
    return registry.call(OP, backend, x, weight, target, **opts)


from kernellab.ops.linear_cross_entropy import liger as _liger  # noqa: E402,F401
from kernellab.ops.linear_cross_entropy import reference as _reference  # noqa: E402,F401  (registrations)
from kernellab.ops.linear_cross_entropy import triton as _triton  # noqa: E402,F401
