"""OpSpec: everything the harness needs to know about one op, and nothing about backends.

An OpSpec builds inputs (shape, dtype, seed, layout), computes the float64 reference,
counts flops and the minimal bytes moved (each input read once, each output written
once), lists test shapes (edge shapes included), bench shapes and bad-input cases,
and validates arguments for every implementation of the op.
"""

from __future__ import annotations

import functools
import importlib
import math
import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

SPECS: dict[str, OpSpec] = {}
# v2: ops whose arguments are not N same-shape float tensors (matmul, attention, norms with
# weights, cross-entropy with integer targets): the ``inputs`` / ``validator`` hooks,
# keyword options (``option_sets``, ``bench_options``), ``grad_shapes``, ``bad_shape``.
SPEC_API_VERSION = 2
OP_MODULES = [
    "kernellab.ops.add",
    "kernellab.ops.gelu",
    "kernellab.ops.swiglu",
    "kernellab.ops.geglu",
    "kernellab.ops.softmax",
    "kernellab.ops.layer_norm",
    "kernellab.ops.rms_norm",
    "kernellab.ops.add_rms_norm",
    "kernellab.ops.cross_entropy",
    "kernellab.ops.linear_cross_entropy",
    "kernellab.ops.sum",
    "kernellab.ops.max",
    "kernellab.ops.argmax",
    "kernellab.ops.matmul",
    "kernellab.ops.attention",
    "kernellab.ops.batch_norm2d",
    "kernellab.ops.bn_relu_pool2d",
    "kernellab.ops.relu",
    "kernellab.ops.pool",
    "kernellab.ops.conv2d",
    "kernellab.ops.rope",
    "kernellab.ops.transpose",
    "kernellab.ops.histogram",
    "kernellab.ops.weight_only_matmul",
]

DTYPES = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "fp16": torch.float16,
    "float16": torch.float16,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
}
DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# What the reference backends (manual, torch, compile) accept: float64 too, so that
# torch.autograd.gradcheck runs through them. The kernels keep FLOAT_DTYPES, and the check
# judges the spec's dtypes only (float64 is the reference's own dtype).
REFERENCE_DTYPES = FLOAT_DTYPES + (torch.float64,)

# Layouts every tensor input is tried in. Each either computes correctly or is refused
# with a clear error.
LAYOUTS = ("contiguous", "transposed", "sliced", "offset", "expanded")
# More rows than a CUDA grid's y or z dimension can hold (65,535): a launcher that puts
# rows there, or a kernel that indexes them with 16 bits, loses the rest.
GRID_YZ_LIMIT = 65535


_LOADED = False


def load_all() -> None:
    global _LOADED
    if _LOADED:
        return
    _LOADED = True
    for mod in OP_MODULES:
        importlib.import_module(mod)


def dtype_name(dtype: torch.dtype) -> str:
    return DTYPE_NAMES.get(dtype, str(dtype).replace("torch.", ""))


def upcast(t: torch.Tensor) -> torch.Tensor:
    """``t`` in the reference backends' arithmetic dtype: 16-bit to fp32, fp32 and float64
    unchanged (a float64 input stays float64: gradcheck needs its precision)."""
    return t if t.dtype == torch.float64 else t.float()


def wide_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 for fp32 and float64 inputs, fp32 for 16-bit ones: where a reference backend
    accumulates in more than fp32 (matmul, conv2d)."""
    return torch.float64 if dtype in (torch.float32, torch.float64) else torch.float32


def check_dtype(op: str, name: str, t, dtypes=FLOAT_DTYPES) -> None:
    """TypeError naming ``op`` and argument ``name`` unless ``t.dtype`` is in ``dtypes``."""
    if t.dtype not in dtypes:
        allowed = ", ".join(dtype_name(d) for d in dtypes)
        raise TypeError(f"{op}: {name} has dtype {t.dtype}; expected one of {allowed}")


def check_float_tensor(op: str, name: str, t, devices, dtypes=FLOAT_DTYPES) -> None:
    """Raise TypeError / ValueError naming ``op`` and argument ``name`` unless ``t`` is a
    dense (strided) floating-point tensor of ``dtypes`` (fp32, fp16, bf16; the reference
    backends: float64 too) on one of ``devices``."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    check_dtype(op, name, t, dtypes)
    if t.layout is not torch.strided:
        raise TypeError(f"{op}: {name} has layout {t.layout}; only strided (dense) tensors are supported")
    if t.is_nested:
        refuse_nested(op, [(name, t)])
    if t.device.type not in devices:
        raise ValueError(
            f"{op}: {name} is on {t.device}, but this backend runs on {' or '.join(devices)} tensors only"
        )


def check_like(op: str, name: str, t, like_name: str, like, devices, dtypes=FLOAT_DTYPES) -> None:
    """``check_float_tensor`` of ``t``, then: on ``like``'s device, of its dtype and of its
    shape (no broadcasting), or an error naming both arguments. For an op whose second
    tensor is the first one's twin (a GLU's up projection, a residual)."""
    check_float_tensor(op, name, t, devices, dtypes)
    check_twin(op, name, t, like_name, like, "; they must match")


def refuse_nested(op: str, named) -> None:
    """TypeError naming the first nested tensor of ``named`` ((name, value) pairs, as
    ``OpSpec.tensor_args`` gives them): a nested tensor of strided layout reports
    ``torch.strided`` but has no sizes, and every backend reads one dense shape."""
    for name, a in named:
        if isinstance(a, torch.Tensor) and a.is_nested:
            raise TypeError(
                f"{op}: {name} is a nested tensor; only dense tensors are supported "
                "(pad it, e.g. with torch.nested.to_padded_tensor, or call per sequence)"
            )


def check_twin(op: str, name: str, t, like_name: str, like, dtype_hint: str = "") -> None:
    """``t`` on ``like``'s device, of its dtype (the error ends with ``dtype_hint``) and of
    its shape, or an error naming both arguments."""
    if t.device != like.device:
        raise ValueError(f"{op}: {name} is on {t.device} but {like_name} is on {like.device}")
    if t.dtype != like.dtype:
        raise TypeError(f"{op}: {name} has dtype {t.dtype} but {like_name} has {like.dtype}{dtype_hint}")
    if t.shape != like.shape:
        raise ValueError(
            f"{op}: {name} has shape {tuple(t.shape)} but {like_name} has {tuple(like.shape)}; "
            "shapes must match (no broadcasting)"
        )


def parse_dtype(s: str) -> torch.dtype:
    try:
        return DTYPES[s.lower()]
    except KeyError:
        raise ValueError(f"dtype {s!r} not understood; use one of fp32, fp16, bf16") from None


# The largest dimension a shape may name: a tensor's sizes are int64.
MAX_DIM = 2**63 - 1


def parse_shape(s: str) -> tuple[int, ...]:
    """'4096x1024', '2^28', '1<<20', '268435456' -> tuple of ints, each in [0, MAX_DIM]
    (ValueError otherwise, before a power is computed: '10^10^9' is refused, not evaluated)."""
    dims = []
    for part in re.split(r"[x,]", s.strip()):
        part = part.strip()
        if re.fullmatch(r"-\s*\d.*", part):
            raise ValueError(f"shape {s!r}: dimension {part} is negative; each must be >= 0")
        m = re.fullmatch(r"(\d+)\s*(?:\^|\*\*)\s*(\d+)", part)
        if m:
            base, exp = int(m.group(1)), int(m.group(2))
            if base > 1 and exp * math.log2(base) > 64:  # (a bound, not the value: no huge power)
                raise ValueError(f"shape {s!r}: dimension {part} is larger than 2^63 - 1")
            dims.append(base**exp)
        elif m := re.fullmatch(r"(\d+)\s*<<\s*(\d+)", part):
            base, shift = int(m.group(1)), int(m.group(2))
            if base and shift > 64:  # (no huge shift computed)
                raise ValueError(f"shape {s!r}: dimension {part} is larger than 2^63 - 1")
            dims.append(base << shift)
        elif part.isdigit():
            dims.append(int(part))
        else:
            raise ValueError(f"shape {s!r} not understood; write e.g. 4096x1024 or 2^28")
        if dims[-1] > MAX_DIM:
            raise ValueError(f"shape {s!r}: dimension {part} is larger than 2^63 - 1")
    return tuple(dims)


def ranks_text(ranks) -> str:
    """(3, 4) -> '3 or 4'; (2, 3, 4, 5) -> '2 to 5'; (4,) -> '4'."""
    ranks = sorted(ranks)
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]} to {ranks[-1]}"
    return ", ".join(map(str, ranks[:-1])) + (" or " if len(ranks) > 1 else "") + str(ranks[-1])


def shape_str(shape: Sequence[int]) -> str:
    return "x".join(str(d) for d in shape) if len(shape) else "scalar"


# --------------------------------------------------------------------------- inputs


def _sample(shape, dtype, device, gen, scale: float) -> torch.Tensor:
    # Sample in fp32 on the target device, then round: fresh, non-zero, reproducible.
    t = torch.randn(shape, dtype=torch.float32, device=device, generator=gen)
    return (t * scale).to(dtype)


def make_tensor(shape, dtype, device, gen, layout="contiguous", scale=1.0) -> torch.Tensor | None:
    """A random tensor of ``shape`` in ``layout``; None where the layout does not apply."""
    shape = tuple(shape)
    n = math.prod(shape)
    if layout == "contiguous":
        return _sample(shape, dtype, device, gen, scale)
    if layout == "transposed":
        if len(shape) < 2 or shape[-1] == shape[-2] == 1:
            return None
        base = _sample(shape[:-2] + (shape[-1], shape[-2]), dtype, device, gen, scale)
        return base.transpose(-1, -2)
    if layout == "sliced":
        if not shape:
            return None
        base = _sample(shape[:-1] + (2 * shape[-1],), dtype, device, gen, scale)
        return base[..., ::2]
    if layout == "offset":
        # Storage offset of one element: contiguous but misaligned for 16-byte loads.
        flat = _sample((n + 1,), dtype, device, gen, scale)
        return flat[1:].view(shape)
    if layout == "expanded":
        if not shape or n <= 1:
            return None
        base = _sample((1,) * (len(shape) - 1) + (shape[-1],), dtype, device, gen, scale)
        if len(shape) == 1:
            base = _sample((1,), dtype, device, gen, scale)
        return base.expand(shape)
    raise ValueError(f"layout {layout!r} unknown; expected one of {', '.join(LAYOUTS)}")


def relayout(t: torch.Tensor, layout: str) -> torch.Tensor | None:
    """``t`` (any dtype) in ``layout``, holding the same values (``expanded``: the first
    matrix repeated over the leading dims of a tensor of 3 or more dims, else the first row,
    or the first element of a 1-D tensor, repeated); None where the layout does not apply.

    The check applies it to one argument at a time (a weight, a bias, integer targets, a
    grad_output). The skipped elements of ``sliced`` hold the same values rolled by one,
    so a kernel that reads with unit stride gets valid but wrong values (an integer target
    stays a valid index: a wrong answer, not a range error that could pass for a refusal).
    """
    t = t.detach()
    shape = tuple(t.shape)
    n = t.numel()
    if layout == "contiguous":
        return t.contiguous()
    if layout == "transposed":
        if t.dim() < 2 or shape[-1] == shape[-2] == 1:
            return None
        return t.transpose(-1, -2).contiguous().transpose(-1, -2)
    if layout == "sliced":
        if t.dim() == 0 or n == 0:
            return None
        base = torch.stack([t, t.roll(1, -1)], dim=-1).reshape(shape[:-1] + (2 * shape[-1],))
        return base[..., ::2]
    if layout == "offset":
        flat = torch.empty(n + 1, dtype=t.dtype, device=t.device)
        flat[:1] = t.reshape(-1)[:1] if n else 0
        flat[1:] = t.reshape(-1)
        return flat[1:].view(shape)
    if layout == "expanded":
        if t.dim() == 0 or n <= 1:
            return None
        if t.dim() == 1:
            return t[:1].clone().expand(shape)
        if t.dim() >= 3 and math.prod(shape[:-2]) > 1:
            # one [..., rows, cols] matrix repeated over the leading (batch, head) dims, as
            # a model expands shared keys and values over heads (stride 0 there). Repeating
            # one row over the rows too makes attention's rows identical: its gradients then
            # cancel to rounding noise against rounding noise, which no error bound judges.
            lead = t.reshape(-1, shape[-2], shape[-1])[:1].clone()
            return lead.reshape((1,) * (t.dim() - 2) + shape[-2:]).expand(shape)
        lead = t.reshape(-1, shape[-2], shape[-1])[:1, :1].clone()  # one row, stride 0 elsewhere
        return lead.reshape((1,) * (t.dim() - 1) + (shape[-1],)).expand(shape)
    raise ValueError(f"layout {layout!r} unknown; expected one of {', '.join(LAYOUTS)}")


@dataclass(frozen=True, repr=False)
class TensorOption:
    """A keyword option whose value is a tensor (matmul's ``bias``), built afresh for each
    case by ``build(args, dtype, device, gen)`` from the case's positional args. A floating
    one takes a gradient like the positional inputs do."""

    build: Callable

    def __repr__(self) -> str:
        return "tensor"


@dataclass
class Boundary:
    """One problem at a regime boundary of an op's kernels, checked in quick mode too
    (``OpSpec.boundary_cases``; forward and every gradient in one call): a block, chunk or
    rows-per-program edge past which a kernel takes another path (a vocabulary past two
    chunks, a row wider than one block, more rows than one program reduces), a head dim
    with its own tiles, option combinations the option cases take one at a time (causal x
    window x GQA), or inputs with ties. The fixed shapes do not reach these, and a kernel
    wrong only past one of them passed quick mode. Keep each small: the Triton interpreter
    runs programs one after another.

    shape: the problem shape; options: keyword options (as in ``OpSpec.option_sets``);
    ties: the first input rounded to three values (``with_ties``), so that most maxima
    and pooling windows hold equal candidates."""

    shape: tuple
    options: dict = field(default_factory=dict)
    ties: bool = False

    @property
    def label(self) -> str:
        opts = options_str(self.options)
        return shape_str(self.shape) + (f" {opts}" if opts else "") + (" ties" if self.ties else "")


def with_ties(args, scale: float = 1.0):
    """``args`` with the first floating tensor rounded to the three values -1, 0, 1 (times
    ``scale``): exact in every dtype; a row of 33 holds its maximum more than once almost
    surely, a 2x2 window about half the time, so a kernel must break ties as the reference
    does (the first index, row-major)."""
    out = list(args)
    for i, a in enumerate(out):
        if isinstance(a, torch.Tensor) and a.is_floating_point():
            out[i] = ((a.float() / scale).round().clamp(-1, 1) * scale).to(a.dtype)
            break
    return tuple(out)


@dataclass
class BadInput:
    """One bad call: ``build(device, dtype) -> (args, kwargs)`` must raise an exception
    of a type in ``exc`` whose message names ``arg``.

    gpu_only: the case is for backends that run only on CUDA (a CPU tensor given to them).
    needs_gpu: the case needs a CUDA device to be built (e.g. mixed devices).
    """

    name: str
    build: Callable
    arg: str
    exc: tuple = (TypeError, ValueError)
    gpu_only: bool = False
    needs_gpu: bool = False
    # the dtype the case is bad for: it does not apply to a backend whose Impl.dtypes
    # lists it (float64, which the reference backends accept)
    dtype: torch.dtype | None = None


def device_of(t):
    """A tensor's device in the cheapest form to compare: a CUDA tensor's index
    (``get_device``), any other tensor's ``torch.device`` (``get_device`` is -1 for cpu and
    meta alike, and other indexed device types share CUDA's indices). Reading
    ``device.type`` costs ~0.7 us on a CPU host; validators run on every call."""
    return t.get_device() if t.is_cuda else t.device


def runs_on(t, devices) -> bool:
    """Whether tensor ``t`` is on one of ``devices`` (device types), read as cheaply as
    ``device_of`` reads a device."""
    return "cuda" in devices if t.is_cuda else t.device.type in devices


def layout_checking(fn):
    """Mark ``fn`` (an ``OpSpec.validator``) as one that rejects non-strided tensors in
    every argument it takes, naming the argument; ``OpSpec.validate`` then skips its generic
    layout loop (it runs on every call: host cost)."""
    fn.checks_layouts = True
    return fn


@dataclass
class OpSpec:
    name: str
    arg_names: tuple[str, ...]  # tensor inputs, in call order
    reference: Callable  # float64 tensors -> float64 output(s)
    flops: Callable[[tuple, str], int]  # (shape, mode) -> floating-point operations
    bytes_moved: Callable[[tuple, torch.dtype, str], int]  # (shape, dtype, mode) -> bytes
    test_shapes: list
    quick_shapes: list
    bench_shapes: list  # GPU sweep
    cpu_bench_shapes: list  # small sweep for the CPU (Triton interpreter is slow)
    layout_shape: tuple  # the shape every layout is tried at
    grad_args: tuple[int, ...] = ()  # indices of args that take gradients
    dtypes: tuple = FLOAT_DTYPES
    scale: float = 1.0  # inputs ~ N(0, scale^2)
    specials: tuple = (float("nan"), float("inf"), float("-inf"))
    default_backends: tuple = ("cuda", "triton", "torch")
    # what backend=None runs inside a torch.compile graph (registry.compiled_backend)
    compiled_backends: tuple = ("torch",)
    # (shape key) -> backend or None: the heuristic's choice for a problem no table row is
    # near, before default_backends (e.g. a launch-bound size where PyTorch's few kernels
    # cost less host time than a fused runner's many); None: default_backends decide
    small_backend: Callable | None = None
    # (shape key) -> backends the default must not pick for this problem, whatever a table
    # row says: those that would break a promise of the op there (linear_cross_entropy's
    # logits never stored: the backends that store them, past a small size); None: none
    default_excludes: Callable | None = None
    # problem shape -> shape key (core.shapes.key_of_shape) where the op's problem shape is
    # not read like its kind's (rope's (B, H, H_k, S, D, R)); None: the generic rule
    key_of_shape: Callable | None = None
    # indices of shape-key dims a table row must equal to speak first for a call (attention's
    # head dim: its kernels are built per head dim); others only where no such row is near
    # (core.choice.choose)
    key_exact: tuple[int, ...] = ()
    # (shape-key dim index, ascending upper bounds) pairs: a table row speaks only for calls
    # whose dim lies in the row's band (matmul's M <= 16 and M > 16: GEMV kernels and tile
    # kernels); where no row of the call's band is near, the rows of its band vote
    # (core.choice.choose). Negative indices count from the key's end (batched keys).
    key_bands: tuple[tuple[int, tuple[int, ...]], ...] = ()
    doc: str = ""
    extra_bad_inputs: list = field(default_factory=list)
    metric: str = "gbps"  # which ceiling the op lives under: gbps (memory) or tflops
    modes: tuple = ("fwd", "bwd", "fwdbwd")  # what the benchmark can time
    plant_extra: Callable | None = None  # in place on the specials' copy, e.g. a fully masked row
    # -- v2 hooks (absent: every arg is a float tensor of the problem shape) -----------
    # (shape, dtype, device, gen, layout, scale) -> tuple of args or None (layout n/a).
    # Args may be non-float tensors (int64 targets) or None (an absent optional tensor).
    inputs: Callable | None = None
    # (args, kwargs, devices) -> None; raises TypeError/ValueError naming the argument.
    validator: Callable | None = None
    # Whether validation reads nothing but each tensor argument's class, dtype, shape,
    # device and layout, and the keyword values (audited per op; not cross_entropy, which
    # reads target's values). The default then validates a call once and runs later calls
    # with the same facts directly (``registry._Trusted``).
    key_validates: bool = False
    option_sets: list = field(default_factory=list)  # extra keyword cases the check runs
    bench_options: list = field(default_factory=lambda: [{}])  # keyword cases the bench times
    # Options that describe the inputs, not the call: name -> default (matmul's ``b_t``: b is
    # the transpose of a contiguous [N, K] weight, nn.Linear's ``W.t()``). ``inputs`` takes
    # them as keyword arguments and builds that layout; the harness never passes them to
    # the op; ``bench_options`` may name them, and tables tell them apart as they do keyword
    # options, spelled only away from their default (rows written before an input option
    # existed read as its default); ``input_facts`` reads them from a call's arguments.
    input_options: dict = field(default_factory=dict)
    input_facts: Callable | None = None  # args -> input_options' values (a tuple, in their order)
    # Keyword options the harness times the vendors' backends (``harness.results.VENDOR``)
    # with, where kernellab's form of a vendor op adds work its users do not pay (the
    # synchronizing target check kernellab puts in front of F.cross_entropy); a case's own
    # option of the same name wins.
    peer_options: dict = field(default_factory=dict)
    grad_shapes: list | None = None  # problem shapes of the gradient stage
    # how many of the first outputs the gradient stages differentiate, each with a grad_output
    # of its own (rope: q_rot and k_rot)
    grad_outputs: int = 1
    bad_shape: tuple = (33,)  # a small valid problem shape for the generic bad-input cases
    # -- the check's reach (issue 16) -----------------------------------------------
    # An option set's key that names a positional argument replaces it ({"bias": None} for
    # layer_norm); a value may be a TensorOption. option_shape: the problem shape of the
    # option cases (None: layout_shape), e.g. attention with S_q != S_k for causal.
    option_shape: tuple | None = None
    # (args, options) -> args: inputs built for the default options adapted to an option
    # case (cross_entropy: targets that hit a non-default ignore_index).
    option_inputs: Callable | None = None
    # option -> names of the tensor args the backward may overwrite when that option is
    # true: a documented in-place mode, exempt from the input-integrity rule there alone.
    inplace_options: dict = field(default_factory=dict)
    # A problem shape with more than GRID_YZ_LIMIT rows, checked in quick mode too (in one
    # dtype: the index arithmetic does not depend on it); kept narrow, since the Triton
    # interpreter runs programs one after another. rows_shape_interpreted=False: the op's
    # Triton kernels take a program per row, minutes under the interpreter; skipped there,
    # with the reason, and run on a GPU.
    rows_shape: tuple | None = None
    rows_shape_interpreted: bool = True
    # Problem shape of the per-argument layout, integrity, re-call and double-backward
    # cases (None: layout_shape). They multiply the calls by arguments x layouts, and the
    # Triton interpreter pays per program: the row-wise ops take a few rows of the same
    # width (at 37 rows, layer_norm triton fp32's check takes ~4x the CPU time).
    reach_shape: tuple | None = None
    # -- shapes nobody chose (``kernellab check --fuzz N``) ----------------------------
    # (rng: random.Random, big: bool) -> (problem shape, options): one draw of a problem
    # the fixed lists above do not name (``fuzz_*`` helpers below); options None: one of
    # ``option_sets`` half the time (the generator returns a dict where the options
    # depend on the shape: strides, windows, dims). big: on a GPU, sizes up to real
    # models' (vocabularies, sequence lengths); else sizes the Triton interpreter runs in
    # seconds. None: same-shape ops draw with fuzz_same_shape.
    fuzz: Callable | None = None
    # The check's noise floor counts the op's conditioning (harness/compare.py): where the
    # exact result moves by more than one ulp of the output when every input moves by one
    # ulp (cancellation: a dot of terms ~8 that sums to ~1), that change is the floor. Only
    # for ops whose outputs and gradients are continuous in the inputs (ties or a
    # threshold would move a max or a mask, not round it).
    perturbation_floor: bool = False
    # Problems at the kernels' regime boundaries (``Boundary``), checked in quick mode too.
    boundary_cases: list = field(default_factory=list)
    # -- what a problem shape is (``check_problem_shape``) -----------------------------
    # The numbers of dims a problem shape of the op may have, and how they read (matmul:
    # (3, 4), "(M, N, K) or (Bt, M, N, K)"); (): any number from 1 (elementwise and
    # row-wise ops: the last dim is the row, the others are rows).
    problem_ranks: tuple[int, ...] = ()
    problem_dims: str = ""

    # -- inputs ---------------------------------------------------------------------
    @property
    def same_shape(self) -> bool:
        """Whether every argument is a float tensor of the problem shape (the v1 contract)."""
        return self.inputs is None

    def make_inputs(self, shape, dtype, device, seed, layout="contiguous", **input_options):
        """Fresh inputs: a tuple of args (None where ``layout`` does not apply);
        ``input_options`` (names of ``OpSpec.input_options``) shape them."""
        unknown = sorted(set(input_options) - set(self.input_options))
        if unknown:
            raise TypeError(f"{self.name}: unknown input options {unknown}")
        gen = torch.Generator(device=device).manual_seed(seed)
        if self.inputs is not None:
            out = self.inputs(tuple(shape), dtype, device, gen, layout, self.scale, **input_options)
            return None if out is None else tuple(out)
        args = []
        for _ in self.arg_names:
            t = make_tensor(shape, dtype, device, gen, layout, self.scale)
            if t is None:
                return None
            args.append(t)
        return tuple(args)

    def draw_fuzz(self, rng, big: bool) -> tuple | None:
        """One problem ``(shape, options)`` from ``fuzz`` (same-shape ops: fuzz_same_shape),
        with one of ``option_sets`` half the time where the generator leaves the options
        to the spec; None for an op with no generator."""
        draw = self.fuzz or (fuzz_same_shape if self.same_shape else None)
        if draw is None:
            return None
        shape, opts = draw(rng, big)
        return shape, (fuzz_options(rng, self.option_sets) if opts is None else opts)

    def plant_specials(self, args, seed):
        """Copy of ``args`` with NaN/+inf/-inf (and op-specific extremes) at random places
        of the first input."""
        x = args[0].clone()
        n = x.numel()
        if n == 0:
            return args
        gen = torch.Generator().manual_seed(seed)
        k = min(n, len(self.specials))
        pos = torch.randperm(n, generator=gen)[:k]
        flat = x.view(-1)
        for p, v in zip(pos.tolist(), self.specials):
            flat[p] = v
        if self.plant_extra is not None:
            self.plant_extra(x)
        return (x,) + tuple(args[1:])

    def option_case(self, args, options, dtype, device, gen):
        """(args, kwargs) of an option case: ``options`` applied to default-option ``args``
        (positional overrides, TensorOptions built, ``option_inputs`` adapting the inputs)."""
        args = list(args)
        kwargs = {}
        for key, value in options.items():
            if isinstance(value, TensorOption):
                value = value.build(tuple(args), dtype, device, gen)
            if key in self.arg_names:
                args[self.arg_names.index(key)] = value
            else:
                kwargs[key] = value
        if self.option_inputs is not None:
            args = list(self.option_inputs(tuple(args), kwargs))
        return tuple(args), kwargs

    def tensor_args(self, args, kwargs=None) -> list[tuple[str, torch.Tensor]]:
        """(name, tensor) of every tensor argument, positional and keyword, in call order."""
        named = [
            (self.arg_names[i] if i < len(self.arg_names) else f"arg {i}", a) for i, a in enumerate(args)
        ]
        named += list((kwargs or {}).items())
        return [(n, a) for n, a in named if isinstance(a, torch.Tensor)]

    def ref(self, *args, **options):
        return self.reference(*[to64(a) for a in args], **{k: to64(v) for k, v in options.items()})

    def check_problem_shape(self, shape) -> None:
        """ValueError unless ``shape`` is a problem shape of this op: as many dims as its
        convention has (``problem_ranks``), and dims its counts accept (attention's H_q a
        multiple of H_kv, rope's R even and <= D); the message says what the op wants."""
        shape = tuple(shape)
        n = len(shape)
        want = f"{self.name} takes {ranks_text(self.problem_ranks)} dims" if self.problem_ranks else ""
        if self.problem_dims:
            want += f", {self.problem_dims}"
        example = f"e.g. {shape_str(self.bench_shapes[0])}" if self.bench_shapes else ""
        if n == 0 or (self.problem_ranks and n not in self.problem_ranks):
            has = f"{n} dim{'' if n == 1 else 's'}"
            raise ValueError(f"{shape_str(shape)} has {has}; {want or self.name + ' takes 1 or more dims'}"
                             + (f" ({example})" if example else ""))  # fmt: skip
        try:
            self.count_bytes(shape, torch.float32, "fwd")
        except (ValueError, TypeError, IndexError, ZeroDivisionError) as e:
            raise ValueError(f"{shape_str(shape)} is not a problem shape of {self.name}: {e}"
                             + (f" ({want}; {example})" if want else "")) from None  # fmt: skip

    @property
    def reach(self) -> tuple:
        return tuple(self.reach_shape or self.layout_shape)

    @property
    def gradient_shapes(self) -> list:
        return list(self.grad_shapes) if self.grad_shapes is not None else [self.layout_shape, (1025,)]

    # -- validation -----------------------------------------------------------------
    def validate(self, args, kwargs, devices=("cuda", "cpu"), dtypes=None) -> None:
        """Raise TypeError/ValueError naming the offending argument. ``dtypes``: the floating
        dtypes the backend takes (None: the spec's)."""
        v = self.validator
        if v is not None and getattr(v, "checks_layouts", False):
            # it checks every tensor's layout itself
            v(args, kwargs, devices) if dtypes is None else v(args, kwargs, devices, dtypes)
            return
        for i, a in enumerate(args):  # every backend reads dense strided storage
            if isinstance(a, torch.Tensor) and a.layout is not torch.strided:
                self._bad_layout(self.arg_names[i] if i < len(self.arg_names) else f"arg {i}", a)
        if kwargs:
            for k, a in kwargs.items():
                if isinstance(a, torch.Tensor) and a.layout is not torch.strided:
                    self._bad_layout(k, a)
        if v is not None:
            v(args, kwargs, devices) if dtypes is None else v(args, kwargs, devices, dtypes)
            return
        dtypes = dtypes or self.dtypes
        # Fast accept for the common case (this runs on every call: host cost matters);
        # anything unusual goes through the full checks below for a precise message.
        if not kwargs and len(args) == len(self.arg_names):
            a0 = args[0]
            if isinstance(a0, torch.Tensor) and a0.dtype in dtypes and runs_on(a0, devices):
                dt, shape, dev = a0.dtype, a0.shape, device_of(a0)
                for a in args[1:]:
                    if not (isinstance(a, torch.Tensor) and a.dtype is dt and a.shape == shape
                            and device_of(a) == dev):  # fmt: skip
                        break
                else:
                    return
        self._validate_slow(args, kwargs, devices, dtypes)

    def _bad_layout(self, name, a) -> None:
        raise TypeError(
            f"{self.name}: {name} has layout {a.layout}; only strided (dense) tensors are "
            "supported (convert with .to_dense())"
        )

    def call_validator(self, dtypes=None):
        """What each call runs to validate (``validate``'s signature): the op's validator
        itself where it checks every layout (``layout_checking``), else ``validate``;
        ``dtypes`` (a backend's own, wider than the spec's) bound in."""
        v = self.validator
        v = v if v is not None and getattr(v, "checks_layouts", False) else self.validate
        return v if dtypes is None else functools.partial(v, dtypes=tuple(dtypes))

    def _validate_slow(self, args, kwargs, devices, dtypes) -> None:
        if len(args) != len(self.arg_names):
            raise TypeError(
                f"{self.name}() takes {len(self.arg_names)} tensor arguments "
                f"({', '.join(self.arg_names)}), got {len(args)}"
            )
        first = None
        for name, a in zip(self.arg_names, args):
            if not isinstance(a, torch.Tensor):
                raise TypeError(f"{self.name}: {name} must be a torch.Tensor, got {type(a).__name__}")
            check_dtype(self.name, name, a, dtypes)
            if a.device.type not in devices:
                raise ValueError(
                    f"{self.name}: {name} is on {a.device}, but this backend runs on "
                    f"{' or '.join(devices)} tensors only"
                )
            if first is None:
                first = (name, a)
                continue
            check_twin(self.name, name, a, *first)
        if kwargs:
            raise TypeError(f"{self.name}() got unexpected keyword arguments {sorted(kwargs)}")

    # -- bad inputs -----------------------------------------------------------------
    def bad_inputs(self) -> list[BadInput]:
        first = self.arg_names[0]

        bad = self.bad_shape

        def wrong_dtype(device, dtype):
            args = self.make_inputs(bad, torch.float32, device, 0)
            return (args[0].to(torch.int32),) + args[1:], {}

        def float64(device, dtype):
            args = self.make_inputs(bad, torch.float32, device, 0)
            return tuple(_float64(a) for a in args), {}

        def not_a_tensor(device, dtype):
            args = self.make_inputs(bad, dtype, device, 0)
            return (args[0].tolist(),) + args[1:], {}

        def cpu_tensor(device, dtype):
            return self.make_inputs(bad, dtype, "cpu", 0), {}

        def nested(device, dtype):
            args = self.make_inputs(bad, dtype, device, 0)
            with warnings.catch_warnings():  # (the strided nested layout is a prototype)
                warnings.simplefilter("ignore")
                x = torch.nested.nested_tensor([args[0], args[0]])
            return (x,) + args[1:], {}

        cases = [
            BadInput("integer dtype", wrong_dtype, first),
            BadInput("float64 (unsupported dtype)", float64, first, dtype=torch.float64),
            BadInput("a list instead of a tensor", not_a_tensor, first),
            BadInput("CPU tensor to a GPU-only backend", cpu_tensor, first, gpu_only=True),
            BadInput("a nested tensor", nested, first),
        ]
        if len(self.arg_names) > 1 and self.same_shape:
            second = self.arg_names[1]

            def mismatched_shape(device, dtype):
                a = self.make_inputs((4, 8), dtype, device, 0)
                b = self.make_inputs((8, 4), dtype, device, 1)
                return (a[0], b[1]) + a[2:], {}

            def mismatched_dtype(device, dtype):
                a = self.make_inputs((33,), torch.float32, device, 0)
                return (a[0], a[1].half()) + a[2:], {}

            def mixed_devices(device, dtype):
                a = self.make_inputs((33,), dtype, "cuda", 0)
                return (a[0], a[1].cpu()) + a[2:], {}

            cases += [
                BadInput("mismatched shapes", mismatched_shape, second),
                BadInput("mismatched dtypes", mismatched_dtype, second),
                BadInput("tensors on different devices", mixed_devices, second, needs_gpu=True),
            ]
        return cases + list(self.extra_bad_inputs)

    # -- counts ---------------------------------------------------------------------
    def count_bytes(self, shape, dtype, mode, options=None) -> int:
        if options:
            return self.bytes_moved(tuple(shape), dtype, mode, **options)
        return self.bytes_moved(tuple(shape), dtype, mode)

    def count_flops(self, shape, mode, options=None) -> int:
        if options:
            return self.flops(tuple(shape), mode, **options)
        return self.flops(tuple(shape), mode)

    def gbps(self, shape, dtype, mode, ms, options=None) -> float:
        return self.count_bytes(shape, dtype, mode, options) / (ms * 1e-3) / 1e9 if ms > 0 else 0.0

    def tflops(self, shape, mode, ms, options=None) -> float:
        return self.count_flops(shape, mode, options) / (ms * 1e-3) / 1e12 if ms > 0 else 0.0


def to64(a):
    """float64 copy of a floating tensor (detached); anything else unchanged."""
    if isinstance(a, torch.Tensor) and a.is_floating_point():
        return a.detach().to(torch.float64)
    return a


def _float64(a):
    return a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a


# --------------------------------------------------------------------------- fuzzing
#
# The fixed shape lists are the cases somebody thought of; a model calls an op with others
# (the last round's lesson: tuned at the named shapes, slow or wrong at the next one). The
# check's fuzz stage draws problems from each op's generator with the check's seed (one
# seed gives every backend the same problems, and the report's seed replays them).
# Dimensions lean towards the tile edges kernels get wrong: powers of two and one off them.


def fuzz_dim(rng, lo: int, hi: int) -> int:
    """A size in [lo, hi] (lo >= 1): 30% a power of two or one off it, else log-uniform."""
    if rng.random() < 0.3:
        k = rng.randint(lo.bit_length() - 1, hi.bit_length() - 1)
        v = (1 << k) + rng.choice((-1, 0, 1))
    else:
        v = int(math.exp(rng.uniform(math.log(lo), math.log(hi + 1))))
    return min(hi, max(lo, v))


def fuzz_lead(rng, rows: int, max_rank: int = 2) -> tuple:
    """``rows`` (>= 1) as 1 to ``max_rank`` leading dims whose product is at most ``rows``."""
    if max_rank == 1 or rows < 4 or rng.random() < 0.5:
        return (rows,)
    a = fuzz_dim(rng, 1, max(1, int(math.sqrt(rows))))
    return (a, max(1, rows // a))


def fuzz_same_shape(rng, big: bool) -> tuple:
    """Elementwise problems: rank 1 to 3, up to 2^13 elements (2^24 on a GPU)."""
    n = fuzz_dim(rng, 1, (1 << 24) if big else (1 << 13))
    rank = rng.choice((1, 2, 3))
    if rank == 1:
        return (n,), None
    w = fuzz_dim(rng, 1, n)
    return (*fuzz_lead(rng, max(1, n // w), rank - 1), w), None


def fuzz_rows(max_width: int, max_width_big: int, max_rows: int = 48, lead_rank: int = 2):
    """A generator of row-wise problems (1 to ``lead_rank`` leading dims x a width):
    width up to ``max_width`` (``max_width_big`` on a GPU), at most ``max_rows`` rows
    under the interpreter (a program per row), up to 2^24 elements on a GPU."""

    def draw(rng, big: bool):
        w = fuzz_dim(rng, 1, max_width_big if big else max_width)
        rows = fuzz_dim(rng, 1, max(1, (1 << 24) // w) if big else max_rows)
        return (*fuzz_lead(rng, rows, lead_rank), w), None

    return draw


def fuzz_nchw(rng, big: bool, min_hw: int = 1) -> tuple:
    """(N, C, H, W) of a spatial op: channels not a multiple of 8 often, images from
    ``min_hw`` to 14 (64 on a GPU), up to ~2^13 elements (2^24 on a GPU)."""
    hw_max, budget = (64, 1 << 24) if big else (14, 1 << 13)
    h, w = fuzz_dim(rng, min_hw, hw_max), fuzz_dim(rng, min_hw, hw_max)
    c = fuzz_dim(rng, 1, max(1, min(256 if big else 16, budget // (h * w))))
    n = fuzz_dim(rng, 1, max(1, min(1024, budget // (c * h * w))))
    return (n, c, h, w)


def fuzz_options(rng, option_sets) -> dict:
    """{} half the time, else one of ``option_sets`` (a list of dicts)."""
    if not option_sets or rng.random() < 0.5:
        return {}
    return dict(rng.choice(option_sets))


def split_options(spec, options: dict | None) -> tuple[dict, dict]:
    """(keyword options, input options) of an options dict (``OpSpec.input_options``)."""
    options = dict(options or {})
    inputs = {k: options.pop(k) for k in list(options) if k in spec.input_options}
    return options, inputs


def options_str(options: dict | None) -> str:
    """'causal=True,reduction=sum' (sorted keys); '' for no options."""
    return ",".join(f"{k}={options[k]}" for k in sorted(options)) if options else ""


def options_from_str(text: str) -> dict:
    """``options_str``'s inverse: 'b_t=True,eps=1e-05' -> {'b_t': True, 'eps': 1e-05}; values
    that read as a bool, None, int or float become one, the rest stay strings."""
    out = {}
    for item in filter(None, (text or "").split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"options: {item!r} is not KEY=VALUE (in {text!r})")
        out[key.strip()] = option_value(value.strip())
    return out


def option_value(v: str):
    """An option's value as written ('True', 'none', '3', '1e-05', 'sum'): a bool, None, an
    int or a float where it reads as one, else the string."""
    low = v.lower()
    if low in ("true", "false", "none"):
        return None if low == "none" else low == "true"
    for conv in (int, float):
        try:
            return conv(v)
        except ValueError:
            pass
    return v


def define(spec: OpSpec) -> OpSpec:
    SPECS[spec.name] = spec
    return spec


def declare(name: str, arg_names: tuple, reference, flops, bytes_moved, **fields) -> OpSpec:
    """``define(OpSpec(...))`` with the fields every op has given in order: its name, its
    tensor arguments, the float64 reference and the flop and byte counts."""
    return define(OpSpec(name=name, arg_names=arg_names, reference=reference, flops=flops,
                         bytes_moved=bytes_moved, **fields))  # fmt: skip


def get_spec(op: str) -> OpSpec:
    spec = SPECS.get(op)
    if spec is not None:
        return spec
    load_all()
    try:
        return SPECS[op]
    except KeyError:
        raise KeyError(f"unknown op {op!r}; known ops: {', '.join(sorted(SPECS))}") from None


def elementwise_shapes():
    """Edge shapes for elementwise ops: empty, 1, primes, block size +-1, > 65535 rows,
    non-power-of-two widths."""
    return [
        (0,),
        (1,),
        (17,),
        (113,),
        (1023,),
        (1024,),
        (1025,),
        (4097,),
        (3, 0, 5),
        (65537, 3),
        (129, 1000),
        (2, 3, 1025),
    ]


# Bench sizes of an elementwise op: 2^16 (launch-bound) to 2^28 elements (at the copy ceiling).
ELEMENTWISE_BENCH_SHAPES = tuple((2**p,) for p in (16, 20, 24, 26, 28))


def per_element_flops(per_fwd: int, per_bwd: int):
    """The flop count of an op of ``per_fwd`` flops per element forward and ``per_bwd``
    backward: ``(shape, mode, **options) -> flops``."""

    def count(shape, mode, **options):
        n = math.prod(shape)
        return {"fwd": per_fwd * n, "bwd": per_bwd * n, "fwdbwd": (per_fwd + per_bwd) * n}[mode]

    return count


def unary_bytes(shape, dtype, mode) -> int:
    """Bytes a one-input op with a backward moves: forward, x read and y written; backward,
    dy and x (or y) read and dx written."""
    n = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    return {"fwd": 2 * n, "bwd": 3 * n, "fwdbwd": 5 * n}[mode]


def elementwise_spec(name: str, reference, flops, **fields) -> OpSpec:
    """Define the OpSpec of an elementwise op (inputs and output of one shape, any shape):
    by default one input ``x`` with a gradient (``unary_bytes``), the elementwise edge
    shapes, the usual quick, bench, layout, reach and rows shapes, and a validation that
    reads only each tensor's facts (``key_validates``). ``fields`` add to or replace these."""
    common = dict(
        arg_names=("x",),
        grad_args=(0,),
        bytes_moved=unary_bytes,
        key_validates=True,
        test_shapes=elementwise_shapes(),
        quick_shapes=[(0,), (1,), (1025,), (129, 1000)],
        bench_shapes=list(ELEMENTWISE_BENCH_SHAPES),
        cpu_bench_shapes=[(2**p,) for p in (10, 14, 18)],
        layout_shape=(37, 1025),
        reach_shape=(5, 1025),
        rows_shape=(65537, 3),
    )
    return define(OpSpec(name=name, reference=reference, flops=flops, **{**common, **fields}))


def loss_option_sets() -> list[dict]:
    """Option sets of a loss over class targets (cross-entropy's, fused or not): the other
    reductions and a non-default ignore_index, in range (3, which some targets also draw)
    and negative."""
    return [
        {"reduction": "sum"},
        {"reduction": "none"},
        {"ignore_index": 3},
        {"ignore_index": -1, "reduction": "sum"},
    ]


def check_loss_options(op: str, kwargs: dict, default_ignore: int, reductions) -> None:
    """TypeError / ValueError naming ``ignore_index`` (an int) or ``reduction`` (one of
    ``reductions``) where a loss's call gets it wrong."""
    ii = kwargs.get("ignore_index", default_ignore)
    if not isinstance(ii, int) or isinstance(ii, bool):
        raise TypeError(f"{op}: ignore_index must be an int, got {ii!r}")
    red = kwargs.get("reduction", "mean")
    if red not in reductions:
        raise ValueError(f"{op}: reduction must be one of {reductions}, got {red!r}")
