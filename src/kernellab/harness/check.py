"""The correctness engine: every implementation against the float64 reference, on
ordinary and hostile inputs (DESIGN.md "Correctness").

For one implementation and one dtype it runs:

- ``shape``     every test shape of the op (edge shapes included), fresh random inputs,
                outputs NaN-poisoned, judged against 2 x PyTorch's error; in quick mode
                also ``OpSpec.rows_shape`` (more rows than a grid's y/z dimension holds);
- ``rerun``     the first non-empty shape again with new inputs (catches cached outputs);
- ``special``   NaN / +-inf / extremes planted in the input: parity with the reference;
- ``layout``    transposed, sliced, storage offset 1, expanded inputs (all at once), then
                each tensor argument alone in each layout (``weight:sliced``, targets,
                tensor options such as matmul's bias), forward and gradients, and the
                grad_output in each layout (``dy:expanded``): computed correctly or
                refused with a clear error (in quick mode the one-argument and grad_output
                cases run in the implementation's first dtype);
- ``option``    each of the op's option cases (``OpSpec.option_sets``: keywords at
                non-default values, tensor options, positional overrides such as
                ``bias=None``), forward and gradient, and the forward again with NaN /
                +-inf / extremes planted as in ``special`` (``<options> nan/inf/extremes``:
                a fused epilogue such as matmul's relu has code of its own);
- ``boundary``  each of the op's regime-boundary problems (``OpSpec.boundary_cases``:
                a vocabulary past two chunks, a row past one block, more rows than one
                program reduces, head dim 128, causal x window x GQA, ties in a max),
                quick mode included, forward and every gradient;
- ``grad``      every gradient vs autograd of the float64 reference, with a contiguous
                and a strided grad_output;
- ``integrity`` every call of every stage compares the bytes of each tensor input (the
                grad_output too, in the backward) before and after; this stage reports it
                for one plain forward and backward (``OpSpec.inplace_options`` exempts
                a documented in-place mode, in the backward only);
- ``recall``    the same tensors modified in place and the implementation called again:
                the answer for the new values (a cache keyed on data_ptr fails);
- ``double``    second derivatives (grad of grad . v, w.r.t. inputs and grad_output) vs
                float64 autograd where the implementation declares double backward
                (``Impl.double_backward``); elsewhere a RuntimeError, or correct numbers;
- ``opcheck``   ``torch.library.opcheck`` on each custom op behind the implementation;
- ``bad``       bad inputs must raise TypeError/ValueError naming the argument;
- ``fuzz``      (``fuzz=N``, ``kernellab check --fuzz N``) N problems drawn from the op's
                generator (``OpSpec.fuzz``: odd sizes, option sets, GQA, strides...), forward
                and every gradient: the shapes nobody listed. The check's seed draws them,
                so every backend sees the same problems and a failure replays with --seed.
                Without --fuzz, every run still draws QUICK_DRAWS small problems (a fresh
                seed each run unless --seed is given).

CUDA backends on a machine without a GPU are compiled with NVRTC for sm_80 and sm_90
("compiled, not run: no GPU"); their bad-input cases that need no GPU still run.
"""

from __future__ import annotations

import contextlib
import random
import re
import time
import traceback
import warnings
import zlib
from dataclasses import dataclass

import numpy as np
import torch

from kernellab import device as _device
from kernellab import triton_support
from kernellab.core import registry
from kernellab.core.spec import (
    LAYOUTS,
    OpSpec,
    TensorOption,
    dtype_name,
    get_spec,
    options_str,
    relayout,
    shape_str,
    to64,
    with_ties,
)
from kernellab.harness.cases import (  # noqa: F401  (FAIL, PASS, ...: what callers of check read)
    _OP_WEIGHT,
    FAIL,
    PASS,
    REFUSED,
    SKIP,
    SPLIT_WEIGHT,
    STAGE_GROUPS,
    CaseResult,
    Report,
)
from kernellab.harness.compare import Verdict, judge, max_error
from kernellab.profile.nvtx import nvtx_range

# Exceptions that count as a clear refusal of an unsupported layout.
_REFUSAL = (TypeError, ValueError, NotImplementedError)


# Problems each run draws from the op's fuzz generator when --fuzz is not given, at most
# QUICK_WORK work units each and a leading dim (batch, rows) of at most QUICK_LEAD
# (``_Runner._draw``).
QUICK_DRAWS = 2
QUICK_WORK = 1 << 19
QUICK_LEAD = 64


def _work(spec: OpSpec, shape, options) -> int:
    """Forward flops, or bytes moved / 4 where that is more: what one call costs."""
    try:
        flops = spec.count_flops(shape, "fwd", options)
        return max(flops, spec.count_bytes(shape, torch.float32, "fwd", options) // 4)
    except Exception:  # noqa: BLE001 - an option a count does not take: judge by size alone
        n = 1
        for d in shape:
            n *= d
        return n


# --------------------------------------------------------------------------- helpers


def _sync(dev: str) -> None:
    if dev == "cuda":
        torch.cuda.synchronize()


def poison_allocator(shape, dtype, dev: str, copies: int = 3) -> None:
    """Leave NaN-filled blocks of the output's size in the allocator's free lists, so an
    implementation that allocates its output and leaves elements unwritten returns NaN
    there (caught by the parity rule) - never a stale correct answer from an earlier run.
    Integer outputs (indices) get the most negative value, which no index equals."""
    n = 1
    for d in shape:
        n *= d
    if n == 0:
        return
    fill = float("nan") if dtype.is_floating_point else torch.iinfo(dtype).min
    bufs = [torch.full((n,), fill, dtype=dtype, device=dev) for _ in range(copies)]
    _sync(dev)
    del bufs


@contextlib.contextmanager
def nan_filled_empty():
    """While the implementation under test runs, ``torch.empty`` fills every new tensor
    (NaN for floats, the largest value for integers: never a valid index): PyTorch's
    ``fill_uninitialized_memory``, active under deterministic algorithms (``warn_only``:
    no op refuses to run, and their warnings are silenced). ``poison_allocator`` alone is
    a best effort: on the CPU, in a heap churned by earlier allocations, the unwritten tail
    of a planted kernel came out NaN in 61% of 200 trials (a CI run once let one pass)."""
    prev = torch.are_deterministic_algorithms_enabled()
    prev_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    prev_fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.utils.deterministic.fill_uninitialized_memory = True
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*deterministic.*")
            yield
    finally:
        torch.use_deterministic_algorithms(prev, warn_only=prev_warn)
        torch.utils.deterministic.fill_uninitialized_memory = prev_fill


def _outputs(out):
    return out if isinstance(out, (tuple, list)) else (out,)


# ``OpSpec.perturbation_floor``: the exact result's change when every input moves by one ulp,
# the median over this many random moves (a median: one move that crosses a relu threshold
# does not set the floor).
PERTURB_REPLICATES = 5
_INT_VIEW = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16,
             torch.bfloat16: torch.int16}  # fmt: skip


def _perturb(a, gen: torch.Generator):
    """``a`` with each finite nonzero element one ulp up or down at random (its bits +-1);
    anything else as it is."""
    if not isinstance(a, torch.Tensor) or a.dtype not in _INT_VIEW or not a.numel():
        return a
    src = a.detach().contiguous()
    step = torch.randint(0, 2, src.shape, generator=gen).to(src.device, _INT_VIEW[src.dtype]) * 2 - 1
    moved = (src.view(_INT_VIEW[src.dtype]) + step).view(src.dtype)
    return torch.where(torch.isfinite(src) & (src != 0) & torch.isfinite(moved), moved, src)


def _change(new, old) -> float:
    """max |new - old| where both are finite (0 where nothing compares)."""
    if new is None or old is None or not old.is_floating_point() or new.shape != old.shape:
        return 0.0
    d = (new.detach().double() - old.detach().double()).abs()
    d = d[torch.isfinite(d)]
    return float(d.max()) if d.numel() else 0.0


def _leaf(a, requires_grad: bool):
    """A fresh leaf copy of an argument (None and non-tensors pass through)."""
    if not isinstance(a, torch.Tensor):
        return a
    return a.detach().clone().requires_grad_(requires_grad)


def _dy_like(ref_out, dtype, dev, gen, strided: bool):
    """A random grad_output for ``ref_out`` (strided: every other column of a wider one)."""
    if strided:
        dy = torch.randn(ref_out.shape[:-1] + (2 * ref_out.shape[-1],), generator=gen, device=dev)
        return dy.to(dtype)[..., ::2]
    return torch.randn(ref_out.shape, generator=gen, device=dev).to(dtype)


def _worse(a, b, ref):
    """Per output, whichever of two baseline results is further from the reference (by
    the judge's own measure, compare.max_error)."""

    def err(t, r):
        if t is None or r is None or not t.is_floating_point() or t.shape != r.shape:
            return -1.0
        e = max_error(t, r)
        return e if e != float("inf") else -1.0  # (a NaN where the reference is finite: unusable)

    return [x if err(x, r) > err(y, r) else y for x, y, r in zip(a, b, ref)]


def _short(e: BaseException) -> str:
    msg = str(e).strip().split("\n")[0]
    return f"{type(e).__name__}: {msg[:200]}"


def _storage_bytes(t: torch.Tensor) -> torch.Tensor:
    """The whole storage under ``t`` as uint8 (a sliced view's gaps and an offset view's
    first element included: a kernel must not write there either)."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


class _Snapshot:
    """Bitwise copies of the storages of a call's tensor inputs, to tell afterwards whether
    the call wrote into any of them. Bytes, not values: NaN == NaN, and -0.0 != 0.0."""

    def __init__(self, named):
        self.items = [(name, t, _storage_bytes(t).clone()) for name, t in named]

    def changed(self, exempt=()) -> list[str]:
        return [
            n for n, t, before in self.items if n not in exempt and not torch.equal(_storage_bytes(t), before)
        ]


def _copy(a, layout: str, requires_grad: bool):
    """A fresh leaf copy of an argument in ``layout`` (None and non-tensors pass through);
    a plain clone would make a sliced, offset or expanded tensor contiguous."""
    if not isinstance(a, torch.Tensor):
        return a
    c = relayout(a, layout) if layout != "contiguous" else a.detach().clone()
    if c is None or c.data_ptr() == a.data_ptr():
        c = a.detach().clone()
    return c.requires_grad_(requires_grad)


class _Runner:
    """Checks one (impl, dtype) on one device."""

    def __init__(self, impl: registry.Impl, spec: OpSpec, dtype, dev: str, seed: int, quick: bool,
                 fuzz: int = 0):  # fmt: skip
        self.impl, self.spec, self.dtype, self.dev, self.quick = impl, spec, dtype, dev, quick
        self.seed = seed
        self.n_fuzz = fuzz
        self.gate = False
        self._n = 0
        self._stage_seed = seed
        torch_impl = None
        if impl.backend != "torch":
            try:
                torch_impl = registry.get(spec.name, "torch")
            except KeyError:
                torch_impl = None
        self.baseline = torch_impl
        self.cases: list[CaseResult] = []

    def begin_stage(self, name: str) -> None:
        """Each stage draws its inputs from the run's seed and its own name, so a stage
        sees the same inputs whether it runs alone, with the others, or in another
        process (``parallel``): ``--seed`` replays a run with any number of workers."""
        self._n = 0
        self._stage_seed = (self.seed + zlib.crc32(name.encode())) % 2**31

    def next_seed(self) -> int:
        self._n += 1
        return self._stage_seed + 7919 * self._n

    def skips_one_dtype_stages(self) -> bool:
        """True where quick mode leaves out the stages it runs in one dtype only: the
        per-argument layouts and opcheck (index arithmetic, schemas and fake kernels are
        the same in every dtype). That dtype is the cheapest to build: 16-bit for Triton
        kernels (an fp32 attention variant with IEEE dots compiles in 5-20 s on a GPU host,
        a bf16 one in 1-2 s, and the layout stage builds some 50), else the first. For
        torch.compile (a build per layout, and PyTorch's own layouts) none: --full."""
        if not self.quick:
            return False
        if self.impl.builds_per_shape:
            return True
        mine = list(self.impl.dtypes or self.spec.dtypes)
        if self.impl.triton_kernels is not None:
            mine = [d for d in mine if d.itemsize == 2] or mine
        return self.dtype != mine[0]

    @property
    def differentiable(self) -> bool:
        return bool(self.spec.grad_args) and getattr(self.impl.fn, "differentiable", True) is not False

    def _integrity(self, kind, name, snap, exempt=(), when="forward") -> CaseResult | None:
        changed = snap.changed(exempt)
        if not changed:
            return None
        return CaseResult(
            "integrity",
            f"{kind} {name}",
            FAIL,
            detail=f"{', '.join(changed)} modified by the {when} (inputs must be left bitwise as they were)",
        )

    # -- forward cases -------------------------------------------------------------
    def run_forward(self, kind: str, name: str, args, options=None) -> CaseResult:
        spec = self.spec
        options = options or {}
        ref = _outputs(spec.ref(*args, **options))
        base = None
        if self.baseline is not None:
            with torch.no_grad():
                base = _outputs(self.baseline.fn(*args, **options))
        for r in ref:
            poison_allocator(r.shape, self.dtype if r.is_floating_point() else r.dtype, self.dev)
        snap = _Snapshot(spec.tensor_args(args, options))
        try:
            with torch.no_grad(), nan_filled_empty():
                out = _outputs(self.impl(*args, **options))
            _sync(self.dev)
        except _REFUSAL as e:
            if kind == "layout":
                return CaseResult(kind, name, REFUSED, detail=_short(e))
            why = self.impl.outside_limits(args, options)
            if why:  # a documented limit of the backend, refused clearly
                return CaseResult(kind, name, REFUSED, detail=f"{why}: {_short(e)}")
            return CaseResult(kind, name, FAIL, detail="raised " + _short(e))
        except Exception as e:  # noqa: BLE001 - any other exception is a failure to report
            return CaseResult(kind, name, FAIL, detail="raised " + _short(e))
        bad = self._integrity(kind, name, snap)
        if bad:
            return bad
        return self._judge_outputs(kind, name, out, ref, base, self._sensitivity(args, options, ref)[0])

    def _sensitivity(self, args, kwargs, ref, wrt=(), dys=(), ref_grads=()):
        """(per output, per gradient in ``wrt``) the median over PERTURB_REPLICATES of the
        float64 reference's change when every floating input moves one ulp (``_perturb``);
        zeros unless the op declares ``OpSpec.perturbation_floor`` (compare.judge)."""
        spec = self.spec
        if not spec.perturbation_floor:
            return [0.0] * len(ref), [0.0] * len(ref_grads)
        # Its own generator: the stage's input seeds (next_seed) stay as they were.
        gen = torch.Generator().manual_seed((self._stage_seed * 1_000_003 + self._n) % 2**63)
        outs, grads = [], []
        for _ in range(PERTURB_REPLICATES):
            p_args = [_leaf(to64(_perturb(a, gen)), i in wrt) for i, a in enumerate(args)]
            p_kw = {k: _leaf(to64(_perturb(v, gen)), k in wrt) for k, v in kwargs.items()}
            with torch.set_grad_enabled(bool(wrt)):
                p_ref = _outputs(spec.reference(*p_args, **p_kw))
                outs.append([_change(p, r) for p, r in zip(p_ref, ref)])
                if wrt:
                    keys = [p_kw[k] if isinstance(k, str) else p_args[k] for k in wrt]
                    g = torch.autograd.grad(
                        p_ref[: len(dys)], keys, [d.to(torch.float64) for d in dys], allow_unused=True
                    )
                    grads.append([_change(x, r) for x, r in zip(g, ref_grads)])
        med = lambda rows, n: [float(np.median([row[i] for row in rows])) for i in range(n)]  # noqa: E731
        return med(outs, len(ref)), (med(grads, len(ref_grads)) if wrt else [])

    def _judge_outputs(self, kind, name, out, ref, base, sens=None) -> CaseResult:
        if len(out) != len(ref):
            return CaseResult(kind, name, FAIL, detail=f"{len(out)} outputs, expected {len(ref)}")
        worst: Verdict | None = None
        for i, (o, r) in enumerate(zip(out, ref)):
            v = judge(o, r, self.dtype, base[i] if base is not None else None, sens[i] if sens else 0.0)
            if not v.ok:
                return CaseResult(kind, name, FAIL, v.err, v.bound, v.detail)
            if worst is None or v.ratio > worst.ratio:
                worst = v
        return CaseResult(kind, name, PASS, worst.err, worst.bound)

    def shapes(self):
        spec = self.spec
        shapes = spec.quick_shapes if self.quick else spec.test_shapes
        for shape in shapes:
            args = spec.make_inputs(shape, self.dtype, self.dev, self.next_seed())
            yield self.run_forward("shape", shape_str(shape), args)
        rows = self.rows_case(shapes)
        if rows is not None:
            yield rows
        # The same shape again with fresh inputs: a cached output fails here.
        shape = spec.layout_shape
        for i in range(2):
            args = spec.make_inputs(shape, self.dtype, self.dev, self.next_seed())
            yield self.run_forward("rerun", f"{shape_str(shape)} #{i + 1}", args)

    def rows_case(self, shapes) -> CaseResult | None:
        """More rows than a grid's y/z dimension, in quick mode too (not in the bench's
        gate), in the first dtype the implementation takes."""
        spec = self.spec
        shape = spec.rows_shape
        if not self.quick or self.gate or shape is None or tuple(shape) in map(tuple, shapes):
            return None
        if self.dtype != (self.impl.dtypes or spec.dtypes)[0]:
            return None
        interpreted = self.impl.triton_kernels and _device.triton_interpreted(self.dev)
        if interpreted and not spec.rows_shape_interpreted:
            why = "Triton interpreter: a program per row takes minutes on a CPU (checked on a GPU)"
            return CaseResult("shape", shape_str(shape), SKIP, detail=why)
        args = spec.make_inputs(shape, self.dtype, self.dev, self.next_seed())
        return self.run_forward("shape", shape_str(shape), args)

    def specials(self):
        spec = self.spec
        shape = spec.layout_shape
        args = spec.make_inputs(shape, self.dtype, self.dev, self.next_seed())
        args = spec.plant_specials(args, self.next_seed())
        yield self.run_forward("special", "nan/inf/extremes", args)

    def layouts(self):
        spec = self.spec
        for layout in LAYOUTS[1:]:
            args = spec.make_inputs(spec.layout_shape, self.dtype, self.dev, self.next_seed(), layout)
            if args is None:
                continue
            yield self.run_forward("layout", layout, args)

    # -- keyword options -----------------------------------------------------------
    def option_inputs(self, opts, shape=None):
        """(args, kwargs) of the option case ``opts`` at ``shape`` (default: the spec's
        option shape)."""
        spec = self.spec
        shape = shape or spec.option_shape or spec.layout_shape
        seed = self.next_seed()
        args = spec.make_inputs(shape, self.dtype, self.dev, seed)
        gen = torch.Generator(device=self.dev).manual_seed(seed + 1)
        return spec.option_case(args, opts, self.dtype, self.dev, gen)

    def options(self):
        spec = self.spec
        for opts in spec.option_sets:
            label = options_str(opts)
            args, kwargs = self.option_inputs(opts)
            yield self.run_forward("option", label, args, kwargs)
            if spec.specials:  # NaN / inf through the option's own code (a fused epilogue)
                planted = spec.plant_specials(args, self.next_seed())
                yield self.run_forward("option", f"{label} nan/inf/extremes", planted, kwargs)
            if self.differentiable:
                args, kwargs = self.option_inputs(opts)
                yield self.fwd_bwd("grad", f"grad {label}", args, kwargs, judge_out=False)

    # -- regime boundaries ---------------------------------------------------------
    def boundaries(self):
        """Each of the op's ``OpSpec.boundary_cases`` (quick mode too): forward and every
        gradient in one call, at the shape, options and ties the case names."""
        for case in self.spec.boundary_cases:
            args, kwargs = self.option_inputs(case.options, case.shape)
            if case.ties:
                args = with_ties(args, self.spec.scale)
            yield self.fwd_bwd("boundary", case.label, args, kwargs)

    # -- problems drawn at random --------------------------------------------------
    def fuzz(self):
        """``n_fuzz`` problems from the op's generator, forward and gradients; without
        ``n_fuzz``, QUICK_DRAWS small ones (every run draws others: a kernel tuned to the
        listed shapes meets shapes nobody listed, and the run's seed replays them)."""
        n, big = self.n_fuzz, not _device.triton_interpreted(self.dev)
        if not n:
            if self.gate or (self.quick and self.impl.builds_per_shape):
                return  # (torch.compile: a build per drawn shape; --fuzz N or --full draws)
            n, big = QUICK_DRAWS, False
        # The problems depend on the seed alone (not on the backend or the dtype), and
        # not on how many seeds the other stages drew.
        rng = random.Random(self.seed)
        for _ in range(n):
            problem = self._draw(rng, big)
            if problem is None:
                if not self.n_fuzz:
                    return  # (asked for nothing: no line to report)
                yield CaseResult("fuzz", "all", SKIP, detail=f"{self.spec.name} has no fuzz generator (OpSpec.fuzz)")
                return
            shape, opts = problem
            label = shape_str(shape) + (f" {options_str(opts)}" if opts else "")
            args, kwargs = self.option_inputs(opts, shape)
            yield self.run_forward("fuzz", label, args, kwargs)
            if self.differentiable:
                args, kwargs = self.option_inputs(opts, shape)
                yield self.fwd_bwd("fuzz", f"grad {label}", args, kwargs, judge_out=False)

    def _draw(self, rng, big: bool):
        """One problem from the op's generator; unless ``big`` or --fuzz, at most QUICK_WORK
        work units (flops, or bytes / 4 for memory-bound ops) and a leading dim of at most
        QUICK_LEAD where there are two or more: the generator's CPU sizes reach seconds per
        call under the Triton interpreter, which runs a program per image or row tile
        (conv2d at a batch of 1024: 18 s of CPU for one draw), and the run's extra draws
        must stay cheap. Redraws come from the same ``rng``: the seed still replays them."""

        def small(shape, options) -> bool:
            lead_ok = len(shape) < 2 or shape[0] <= QUICK_LEAD
            return lead_ok and _work(self.spec, shape, options) <= QUICK_WORK

        problem = self.spec.draw_fuzz(rng, big)
        for _ in range(50):
            if problem is None or big or self.n_fuzz or small(*problem):
                break
            problem = self.spec.draw_fuzz(rng, big)
        return problem

    # -- gradients -----------------------------------------------------------------
    def grads(self):
        spec = self.spec
        if not spec.grad_args:
            return
        if not self.differentiable:
            yield CaseResult("grad", "all", SKIP, detail="registered without gradients")
            return
        shapes = spec.gradient_shapes[:1] if self.quick else spec.gradient_shapes
        for shape in shapes:
            for strided_dy in (False, True):
                name = f"{shape_str(shape)}{' strided dy' if strided_dy else ''}"
                yield self._grad_case(shape, name, strided_dy)

    def _grad_case(self, shape, name, strided_dy, options=None) -> CaseResult:
        args = self.spec.make_inputs(shape, self.dtype, self.dev, self.next_seed())
        return self.fwd_bwd("grad", name, args, options or {}, judge_out=False, strided_dy=strided_dy)

    def _wrt(self, args, kwargs) -> list:
        """Keys (positional index or keyword) of the floating tensor inputs that take a
        gradient: the spec's grad_args, and tensor options (matmul's bias)."""
        keys = [i for i in self.spec.grad_args if i < len(args) and isinstance(args[i], torch.Tensor)]
        keys += [k for k, v in kwargs.items() if isinstance(v, torch.Tensor) and v.is_floating_point()]
        return keys

    def _argname(self, key) -> str:
        return key if isinstance(key, str) else self.spec.arg_names[key]

    def fwd_bwd(
        self,
        kind: str,
        name: str,
        args,
        kwargs=None,
        *,
        layouts=None,
        dy_layout: str = "contiguous",
        strided_dy: bool = False,
        judge_out: bool = True,
        judge_grads: bool = True,
        reuse: bool = False,
    ) -> CaseResult:
        """One call of the implementation with autograd: the output(s) judged (unless
        ``judge_out`` is False), then every gradient, with the inputs' bytes compared
        before and after the forward and the backward.

        layouts: argument name -> layout of the implementation's copy of it (fresh leaf
        copies, in ``layouts`` or contiguous); ``reuse``: call on ``args``/``kwargs``
        themselves (leaves already; the re-call on mutated inputs needs the same tensors).
        dy_layout: layout of the grad_output; ``strided_dy``: every other column of a
        wider one (the grad stage's)."""
        spec = self.spec
        kwargs = kwargs or {}
        layouts = layouts or {}
        wrt = self._wrt(args, kwargs) if self.differentiable else []

        def get(a, kw, key):
            return kw[key] if isinstance(key, str) else a[key]

        def copies(make):
            a = [
                make(self.spec.arg_names[i] if i < len(spec.arg_names) else str(i), v, i in wrt)
                for i, v in enumerate(args)
            ]
            kw = {k: make(k, v, k in wrt) for k, v in kwargs.items()}
            return a, kw

        # Reference: autograd through the float64 formula.
        r_args, r_kw = copies(lambda n, v, g: _leaf(to64(v), g))
        ref = _outputs(spec.reference(*r_args, **r_kw))
        dys = []  # a grad_output for each of the first spec.grad_outputs outputs
        if wrt:
            gen = torch.Generator(device=self.dev).manual_seed(self.next_seed())
            if strided_dy and ref[0].dim() == 0:
                return CaseResult(kind, name, SKIP, detail="scalar output: no strided grad_output")
            for r in ref[: spec.grad_outputs]:
                dy = _dy_like(r, self.dtype, self.dev, gen, strided_dy)
                if dy_layout != "contiguous":
                    dy = relayout(dy, dy_layout)
                    if dy is None:
                        why = f"{dy_layout} does not apply to the output"
                        return CaseResult(kind, name, SKIP, detail=why)
                dys.append(dy)
            ref_grads = torch.autograd.grad(
                ref[: len(dys)], [get(r_args, r_kw, k) for k in wrt], [d.to(torch.float64) for d in dys]
            )
        sens, sens_grads = self._sensitivity(args, kwargs, ref, wrt, dys, ref_grads if wrt else ())

        base, base_grads = None, None
        if self.baseline is not None:
            # in the implementation's layouts: the bound compares like with like
            b_args, b_kw = copies(lambda n, v, g: _copy(v, layouts.get(n, "contiguous"), g))
            try:
                with torch.set_grad_enabled(bool(wrt)):
                    base = _outputs(self.baseline.fn(*b_args, **b_kw))
                if wrt:
                    base_grads = torch.autograd.grad(
                        base[: len(dys)], [get(b_args, b_kw, k) for k in wrt], dys
                    )
                base = [o.detach() for o in base]
            except Exception:  # noqa: BLE001 - PyTorch's op refuses this case: documented tolerance
                base, base_grads = None, None
            if base is not None and (any(v != "contiguous" for v in layouts.values()) or dy_layout != "contiguous"):
                # PyTorch's error on these values is the larger of its errors in this layout
                # and in the contiguous one: its CPU kernels take a vectorized path for
                # contiguous memory and a scalar one otherwise (tanh, exp rounded
                # differently), and an implementation that packs its inputs first (as many
                # kernels do) meets the vectorized path's rounding. The bound stays 2x
                # PyTorch's own error on the same values.
                c_args, c_kw = copies(lambda n, v, g: _copy(v, "contiguous", g))
                try:
                    with torch.set_grad_enabled(bool(wrt)):
                        c_base = _outputs(self.baseline.fn(*c_args, **c_kw))
                    c_grads = None
                    if wrt:
                        c_grads = torch.autograd.grad(
                            c_base[: len(dys)],
                            [get(c_args, c_kw, k) for k in wrt],
                            [d.contiguous() for d in dys],
                        )
                    base = _worse([o.detach() for o in c_base], base, ref)
                    if c_grads is not None and base_grads is not None:
                        base_grads = _worse(c_grads, base_grads, ref_grads)
                except Exception:  # noqa: BLE001 - keep the layout's own baseline
                    pass

        if reuse:
            i_args, i_kw = list(args), dict(kwargs)
        else:
            i_args, i_kw = copies(lambda n, v, g: _copy(v, layouts.get(n, "contiguous"), g))
        for r in ref:
            poison_allocator(r.shape, self.dtype if r.is_floating_point() else r.dtype, self.dev)
        named = spec.tensor_args(i_args, i_kw)
        exempt = tuple(a for opt, names in spec.inplace_options.items() if kwargs.get(opt) for a in names)
        snap = _Snapshot(named)
        try:
            with nan_filled_empty(), torch.set_grad_enabled(bool(wrt)):
                out = _outputs(self.impl(*i_args, **i_kw))
                _sync(self.dev)
                bad = self._integrity(kind, name, snap)
                if bad:
                    return bad
                res = None
                if judge_out:
                    res = self._judge_outputs(
                        kind, name, [o.detach() for o in out], [r.detach() for r in ref], base, sens
                    )
                    if res.status != PASS or not wrt:
                        return res
                if not wrt:
                    return CaseResult(kind, name, PASS)
                if not out[0].requires_grad:
                    if not judge_grads:  # (the grad stage reports the missing autograd)
                        return res or CaseResult(kind, name, PASS)
                    return CaseResult(kind, name, FAIL, detail="output does not require grad (no autograd)")
                for k in wrt:
                    t = get(i_args, i_kw, k)
                    poison_allocator(t.shape, t.dtype, self.dev)
                snap = _Snapshot(named + [("dy" if i == 0 else f"dy{i}", d) for i, d in enumerate(dys)])
                # (allow_unused: an input left out of the graph is reported by name below)
                grads = torch.autograd.grad(
                    out[: len(dys)], [get(i_args, i_kw, k) for k in wrt], dys, allow_unused=True
                )
                _sync(self.dev)
        except Exception as e:  # noqa: BLE001
            if isinstance(e, _REFUSAL):
                if kind == "layout":
                    return CaseResult(kind, name, REFUSED, detail=_short(e))
                why = self.impl.outside_limits(i_args, i_kw)
                if why:
                    return CaseResult(kind, name, REFUSED, detail=f"{why}: {_short(e)}")
            return CaseResult(kind, name, FAIL, detail="raised " + _short(e))
        bad = self._integrity(kind, name, snap, exempt, when="backward")
        if bad:
            return bad
        if not judge_grads:
            return res or CaseResult(kind, name, PASS)
        worst = None
        for k, g, r, b, fl in zip(wrt, grads, ref_grads, base_grads or [None] * len(wrt), sens_grads):
            argname = self._argname(k)
            if g is None:
                return CaseResult(kind, name, FAIL, detail=f"no gradient for {argname}")
            v = judge(g, r, self.dtype, b, fl)
            if not v.ok:
                return CaseResult(kind, f"{name} d{argname}", FAIL, v.err, v.bound, v.detail)
            if worst is None or v.ratio > worst.ratio:
                worst = v
        if res is not None and res.ratio is not None and res.ratio > worst.ratio:
            return res  # the forward was the closer call: report its error
        return CaseResult(kind, name, PASS, worst.err, worst.bound)

    # -- every tensor argument in every layout, one at a time ----------------------
    def arg_layouts(self):
        """Each tensor argument (weights, biases, integer targets, tensor options) in each
        layout while the others stay contiguous, forward and gradients; then the
        grad_output in each layout. Computed correctly or refused with a clear error."""
        spec = self.spec
        # Quick mode: in one dtype (skips_one_dtype_stages). The layout stage has put every
        # layout through every dtype already; what this stage adds (one argument at a
        # time, with gradients) is index arithmetic, the same in any dtype, at a new
        # compile per layout for torch.compile and per constexpr set for Triton.
        if self.skips_one_dtype_stages():
            return
        # With the first option set that has tensor options (matmul's bias), so that
        # they are laid out too; the positional arguments are the same either way.
        opts = next((o for o in spec.option_sets if any(isinstance(v, TensorOption) for v in o.values())), {})
        for argname, _ in spec.tensor_args(*self.option_inputs(opts, spec.reach)):
            for layout in LAYOUTS[1:]:
                args, kwargs = self.option_inputs(opts, spec.reach)
                args, kwargs = list(args), dict(kwargs)
                if argname in kwargs:
                    t = kwargs[argname] = relayout(kwargs[argname], layout)
                else:
                    i = spec.arg_names.index(argname)
                    t = args[i] = relayout(args[i], layout)
                if t is None:  # e.g. a 1-D weight has no transpose
                    continue
                # (expanded changes the values: the reference is computed from these)
                yield self.fwd_bwd("layout", f"{argname}:{layout}", args, kwargs, layouts={argname: layout})
        if not self.differentiable:
            return
        for layout in LAYOUTS[1:]:
            if layout == "sliced":
                continue  # the grad stage's strided dy
            args = spec.make_inputs(spec.reach, self.dtype, self.dev, self.next_seed())
            res = self.fwd_bwd("layout", f"dy:{layout}", args, judge_out=False, dy_layout=layout)
            if res.status != SKIP:
                yield res

    # -- input integrity, and a re-call on inputs mutated in place -----------------
    def integrity_and_recall(self):
        """Call (forward and backward: the inputs' bytes must not change), modify every
        input in place, call again on the same tensors: the second answer must be that of
        the new values. A result cached by data_ptr (or by shape) fails the second call.
        With the default options, and with each option set that has tensor options."""
        spec = self.spec
        sets = [{}] + [o for o in spec.option_sets if any(isinstance(v, TensorOption) for v in o.values())]
        for opts in sets:
            label = options_str(opts)
            args, kwargs = self.option_inputs(opts, spec.reach)
            wrt = self._wrt(args, kwargs) if self.differentiable else []
            args = [_leaf(a, i in wrt) for i, a in enumerate(args)]
            kwargs = {k: _leaf(v, k in wrt) for k, v in kwargs.items()}
            first = self.fwd_bwd(
                "integrity",
                label or "forward and backward",
                args,
                kwargs,
                judge_out=False,
                judge_grads=False,
                reuse=True,
            )
            yield first
            if first.status != PASS:
                continue
            with torch.no_grad():
                for _, t in spec.tensor_args(args, kwargs):
                    if t.is_floating_point():
                        t.mul_(-1.5).add_(0.25)
                    elif t.dim():
                        t.copy_(t.roll(1, 0))  # integer targets: the same values, permuted
            name = "inputs modified in place" + (f" {label}" if label else "")
            yield self.fwd_bwd("recall", name, args, kwargs, reuse=True)

    # -- second derivatives --------------------------------------------------------
    def double_backward(self):
        """grad of (grad . v) with respect to the inputs and the grad_output, through
        ``create_graph=True``, against float64 autograd. An implementation that declares
        double backward (``Impl.double_backward``) must compute it; one that does not must
        refuse with a RuntimeError, or compute it right: a gradient that silently lost its
        graph counts as a zero second derivative and is judged like any other."""
        spec = self.spec
        if not self.differentiable:
            return
        # One dtype, the first the implementation takes: a dropped or wrong term is an
        # O(1) error in any dtype, while second derivatives composed from 16-bit ops (PyTorch's
        # own included) sit at the edge of the documented 16-bit tolerances.
        if self.dtype != (self.impl.dtypes or spec.dtypes)[0]:
            return
        args = spec.make_inputs(spec.reach, self.dtype, self.dev, self.next_seed())
        wrt = self._wrt(args, {})
        gen = torch.Generator(device=self.dev).manual_seed(self.next_seed())

        def second(fn, dtype):
            leaves = [_leaf(a if dtype is None else to64(a), i in wrt) for i, a in enumerate(args)]
            out = _outputs(fn(*leaves))[0]
            d = dy if dtype is None else dy.to(dtype)
            d = d.detach().clone().requires_grad_(True)
            inputs = [leaves[i] for i in wrt] + [d]
            g = torch.autograd.grad(out, inputs[:-1], d, create_graph=True, allow_unused=True)
            s = sum(
                (
                    (gi * (v if dtype is None else v.to(dtype))).sum()
                    for gi, v in zip(g, vs)
                    if gi is not None
                ),
                torch.zeros((), device=self.dev, dtype=out.dtype),
            )
            if not s.requires_grad:  # nothing differentiable came back: every term is zero
                return [torch.zeros_like(t) for t in inputs]
            _raise_deferred_refusal(s)
            gg = torch.autograd.grad(s, inputs, allow_unused=True)
            return [torch.zeros_like(t) if x is None else x for x, t in zip(gg, inputs)]

        ref_out = _outputs(spec.reference(*[to64(a) for a in args]))[0]
        dy = _dy_like(ref_out, self.dtype, self.dev, gen, False)
        vs = [torch.randn(args[i].shape, generator=gen, device=self.dev).to(self.dtype) for i in wrt]
        ref = second(spec.reference, torch.float64)
        base = None
        if self.baseline is not None:
            try:
                base = second(self.baseline.fn, None)
            except RuntimeError:
                base = None  # PyTorch's op refuses it here (e.g. SDPA's flash kernels): documented tolerance
        declared = bool(getattr(self.impl, "double_backward", False))
        names = [self._argname(k) for k in wrt] + ["dy"]
        try:
            with nan_filled_empty():
                got = second(self.impl, None)
            _sync(self.dev)
        except RuntimeError as e:
            if declared:
                yield CaseResult("double", "backward", FAIL, detail="declared, but raised " + _short(e))
            else:
                yield CaseResult("double", "backward", REFUSED, detail=_short(e))
            return
        except Exception as e:  # noqa: BLE001
            yield CaseResult(
                "double", "backward", FAIL, detail="raised " + _short(e) + " (expected a RuntimeError)"
            )
            return
        worst = None
        for n, g, r, b in zip(names, got, ref, base or [None] * len(names)):
            v = judge(g, r, self.dtype, b)
            if not v.ok:
                why = (
                    v.detail if declared else v.detail + " (not declared: should have raised a RuntimeError)"
                )
                yield CaseResult("double", f"backward d{n}", FAIL, v.err, v.bound, why)
                return
            if worst is None or v.ratio > worst.ratio:
                worst = v
        yield CaseResult(
            "double", "backward", PASS, worst.err, worst.bound, "" if declared else "not declared; computed"
        )

    # -- custom ops ----------------------------------------------------------------
    def opchecks(self):
        spec = self.spec
        if self.skips_one_dtype_stages():
            return
        for op, build, _ in self.impl.custom_ops:
            seed = self.next_seed()
            gen = torch.Generator(device=self.dev).manual_seed(seed)

            def make(requires_grad, gen=gen):
                t = torch.randn(spec.layout_shape, generator=gen, device=self.dev).to(self.dtype)
                return t.requires_grad_(bool(requires_grad))

            def make_args(requires_grad, seed=seed):
                args = spec.make_inputs(spec.layout_shape, self.dtype, self.dev, seed)
                return tuple(
                    _leaf(a, bool(requires_grad) and i in spec.grad_args) for i, a in enumerate(args)
                )

            make.args = make_args

            name = str(getattr(op, "_qualname", None) or getattr(op, "__name__", op))
            try:
                torch.library.opcheck(op, build(make))
            except Exception as e:  # noqa: BLE001
                yield CaseResult("opcheck", name, FAIL, detail=_short(e))
                continue
            yield CaseResult("opcheck", name, PASS)

    # -- bad inputs ----------------------------------------------------------------
    def bad_inputs(self, runnable: bool = True):
        for case in self.spec.bad_inputs():
            if case.gpu_only and "cpu" in self.impl.devices:
                continue
            if case.dtype is not None and case.dtype in (self.impl.dtypes or ()):
                continue  # a dtype this backend takes (the reference backends' float64)
            if case.needs_gpu and (self.dev != "cuda" or not _device.has_cuda()):
                continue  # mixed devices: only meaningful for a backend checked on the GPU
            if not runnable and not case.gpu_only:
                continue
            yield check_bad_input(self.impl, case, self.dev, self.dtype)


def _raise_deferred_refusal(s: torch.Tensor) -> None:
    """Raise PyTorch's RuntimeError if the graph of ``s`` holds a deferred error node: a
    backward marked ``@once_differentiable`` returns gradients hung on such a node, whose
    inputs are detached copies. Differentiating through it raises, but ``autograd.grad``
    with respect to the real inputs never reaches it (it is not on their path) and returns
    None: a refusal of double backward that would otherwise read as a zero gradient."""
    seen, todo = set(), [s.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if node.name() == "torch::autograd::Error":
            node(*[None] * max(1, len(node.next_functions)))  # raises its own message
            raise RuntimeError("double backward refused: the graph holds a deferred autograd error")
        todo.extend(fn for fn, _ in node.next_functions)


def check_bad_input(impl, case, dev, dtype) -> CaseResult:
    try:
        args, kwargs = case.build(dev, dtype)
    except Exception as e:  # noqa: BLE001
        return CaseResult("bad", case.name, SKIP, detail=f"could not build: {_short(e)}")
    try:
        impl(*args, **kwargs)
    except case.exc as e:
        msg = str(e)
        if re.search(rf"(?<![A-Za-z0-9_]){re.escape(case.arg)}(?![A-Za-z0-9_])", msg):
            return CaseResult("bad", case.name, PASS, detail=_short(e))
        return CaseResult("bad", case.name, FAIL, detail=f"error does not name {case.arg!r}: {_short(e)}")
    except Exception as e:  # noqa: BLE001
        return CaseResult(
            "bad", case.name, FAIL, detail=f"raised {type(e).__name__}, expected TypeError/ValueError: {e}"
        )
    return CaseResult("bad", case.name, FAIL, detail="accepted bad input without an error")


# --------------------------------------------------------------------------- driver


@contextlib.contextmanager
def _fp32_as_fp32():
    """fp32 is checked as fp32: TF32 off for cuDNN and cuBLAS while a check runs (restored
    after). PyTorch's default lets cuDNN's convolutions take TF32 (10-bit mantissas) at
    some shapes and not at others, so a backend that follows the flag would be judged
    against an exact dgrad at one shape and every backend's bound loosened at the others. A
    backend's TF32 path is its own tests' business."""
    cu, mm = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = cu, mm


def _all_stages(runner: _Runner) -> list:
    """Every stage in run order (opcheck last: it runs only for custom ops)."""
    return [
        runner.shapes,
        runner.specials,
        runner.layouts,
        runner.arg_layouts,
        runner.options,
        runner.boundaries,
        runner.grads,
        runner.integrity_and_recall,
        runner.double_backward,
        runner.bad_inputs,
        runner.fuzz,
        runner.opchecks,
    ]


def check_impl(
    impl: registry.Impl,
    dtype: torch.dtype,
    *,
    device: str | None = None,
    quick: bool = False,
    seed: int | None = None,
    opcheck: bool = True,
    gate: bool = False,
    fuzz: int = 0,
    only_fuzz: bool = False,
    stages: tuple[str, ...] | None = None,
) -> Report:
    """Check one implementation for one dtype; returns a Report (never raises for a
    wrong implementation). ``gate=True`` runs only the forward cases on the quick shapes,
    specials and layouts: the benchmark's admission test before it times anything.
    ``fuzz=N`` adds N random problems (the fuzz stage); ``only_fuzz`` runs that stage alone.
    ``stages``: run only these stages (their method names, ``STAGE_GROUPS``), as the
    parallel check does with an implementation split over several workers."""
    t0 = time.perf_counter()
    spec = get_spec(impl.op)
    dev = device or _device.default_device()
    seed = random.SystemRandom().randrange(2**30) if seed is None else seed
    rep = Report(impl.op, impl.backend, dtype_name(dtype), dev, PASS, seed=seed)
    if dtype not in (impl.dtypes or spec.dtypes):
        rep.status, rep.reason = "unavailable", f"{dtype_name(dtype)} not supported by this backend"
        return rep
    if dtype not in spec.dtypes:  # float64: the reference's own dtype, nothing to judge against
        judged = ", ".join(dtype_name(d) for d in spec.dtypes)
        rep.status, rep.reason = "unavailable", f"{dtype_name(dtype)} not supported by the check (it judges {judged})"
        return rep
    why = impl.why_unavailable(dev)
    runner = _Runner(impl, spec, dtype, dev, seed, quick, fuzz)
    if why:
        rep.status, rep.reason = "unavailable", why
        if impl.precompile is not None and why == "no GPU":
            # Compiled, not run: prove the CUDA source compiles for the target archs.
            from kernellab.cuda.runtime import CHECK_ARCHS

            try:
                lines = impl.precompile(CHECK_ARCHS)
                rep.cases.append(CaseResult("compile", ", ".join(CHECK_ARCHS), PASS, detail="; ".join(lines)))
                rep.status, rep.reason = "compiled", "compiled, not run: no GPU"
            except Exception as e:  # noqa: BLE001
                # The whole NVRTC log: the first line alone only says that it failed.
                rep.cases.append(CaseResult("compile", ", ".join(CHECK_ARCHS), FAIL, detail=str(e)[:4000]))
                rep.status, rep.reason = FAIL, "does not compile"
            # Input validation runs without a GPU: a CPU tensor must be refused clearly.
            rep.cases.extend(runner.bad_inputs(runnable=False))
            if any(c.status == FAIL for c in rep.cases):
                rep.status = FAIL
            rep.stage_seconds["compile"] = rep.seconds = time.perf_counter() - t0
        return rep

    if gate:
        runner.quick = runner.gate = True
        run_stages = [runner.shapes, runner.specials, runner.layouts]
    elif only_fuzz:
        run_stages = [runner.fuzz]
    else:
        run_stages = _all_stages(runner)[:-1]
    if opcheck and impl.custom_ops and not gate and not only_fuzz:
        run_stages.append(runner.opchecks)
    if stages is not None:
        unknown = set(stages) - {st.__name__ for st in _all_stages(runner)}
        if unknown:
            raise ValueError(f"check_impl: unknown stages {sorted(unknown)}; known: {STAGE_GROUPS}")
        run_stages = [st for st in run_stages if st.__name__ in stages]
    # NaN/inf inputs are deliberate: keep the Triton interpreter's numpy quiet. No
    # autotuning: a check times nothing, and tuning each odd shape cost minutes on a GPU.
    with np.errstate(all="ignore"), _fp32_as_fp32(), triton_support.no_autotune():
        for stage in run_stages:
            runner.begin_stage(stage.__name__)
            t_stage = t_case = time.perf_counter()
            try:
                for case in stage():
                    now = time.perf_counter()
                    case.seconds, t_case = now - t_case, now
                    rep.cases.append(case)
            except Exception as e:  # noqa: BLE001 - a crash in the harness itself is a failure
                rep.cases.append(
                    CaseResult(
                        stage.__name__, "harness", FAIL, detail=_short(e) + "\n" + traceback.format_exc(limit=3)
                    )
                )
            rep.stage_seconds[stage.__name__] = time.perf_counter() - t_stage
    if rep.failures:
        rep.status = FAIL
    rep.seconds = time.perf_counter() - t0
    return rep


def check(
    ops=None,
    backends=None,
    dtypes=None,
    *,
    device: str | None = None,
    quick: bool = True,
    seed: int | None = None,
    on_result=None,
    on_start=None,
    fuzz: int = 0,
    only_fuzz: bool = False,
    workers: int = 1,
) -> list[Report]:
    """Check every matching implementation x dtype (``plan``'s items, in its order); quick
    by default, as the CLI. ``on_start(impl, dtype)`` and ``on_result(report)`` are
    progress hooks; ``fuzz`` / ``only_fuzz`` as in check_impl.
    Without a seed, one fresh seed serves the whole run (the report prints it), so every
    backend of an op is fuzzed on the same problems. ``workers > 1``: the items run in that
    many worker processes (``harness.parallel``), heavy ones split by ``STAGE_GROUPS``;
    ``on_result`` then comes in the order they finish, the returned list in plan order."""
    if seed is None:
        seed = random.SystemRandom().randrange(2**30)
    items = [i for i in plan(ops, backends, dtypes, device=device, quick=quick, fuzz=fuzz) if i.runs != "skipped"]
    if workers > 1 and len(items) > 1:
        from kernellab.harness import parallel

        options = dict(device=device, quick=quick, seed=seed, fuzz=fuzz, only_fuzz=only_fuzz)
        return parallel.run_jobs(parallel.jobs_for(items, only_fuzz), check_impl, options, workers, on_start,
                                 on_result)  # fmt: skip
    reports = []
    for item in items:
        impl, dtype = item.impl, item.dtype
        if on_start:
            on_start(impl, dtype)
        with nvtx_range(f"check {impl.name} {dtype_name(dtype)}"):
            rep = check_impl(impl, dtype, device=device, quick=quick, seed=seed, fuzz=fuzz,
                             only_fuzz=only_fuzz)  # fmt: skip
        reports.append(rep)
        if on_result:
            on_result(rep)
    return reports


def plan_size(ops=None, backends=None, dtypes=None, quick: bool = True) -> int:
    """How many reports ``check`` returns for these filters."""
    return sum(i.runs != "skipped" for i in plan(ops, backends, dtypes, quick=quick))


# The stages in run order, as a plan names them (``fuzz`` only with fuzz=N).
STAGES = ("shape", "rerun", "special", "layout", "option", "boundary", "grad", "integrity", "recall",
          "double", "bad", "fuzz", "opcheck")  # fmt: skip

# Seconds per implementation x dtype in quick mode, by what dominates its cost: Triton
# under the CPU interpreter, a torch.compile build per distinct graph (C++ on a CPU,
# Triton on a GPU), PyTorch's eager ops, an NVRTC build of a CUDA backend that cannot run
# here. Rough, for a 2-core CPU machine and a GPU host; the progress
# display scales them by the time the finished reports actually took.
_COST = {
    "cpu": {"triton": 8.0, "compile": 12.0, "eager": 1.5, "nvrtc": 0.3},
    "cuda": {"triton": 8.0, "compile": 30.0, "eager": 1.1, "nvrtc": 3.0},  # 16 workers
}
_FULL_FACTOR = 3.0  # --full: every test shape and gradient shape
@dataclass
class PlanItem:
    impl: registry.Impl
    dtype: torch.dtype
    runs: str  # "run" | "compile" (CUDA source built, not run: no GPU) | "unavailable" | "skipped"
    estimate: float  # seconds
    why: str = ""  # of "skipped"


def _cost_class(impl: registry.Impl) -> str:
    if impl.triton_kernels is not None:
        return "triton"
    if impl.builds_per_shape:
        return "compile"
    return "eager"


# Why quick mode leaves an implementation that builds code per shape (Impl.builds_per_shape:
# torch.compile) out, or runs it in one dtype: a check meets it at a few dozen distinct
# shapes, layouts and grad modes per dtype, each a build of a second or more (a C++
# compile on a CPU: two to three CPU-seconds each, about three quarters of a 2-core
# machine's whole check).
SKIP_BUILDS_CPU = "builds per shape (torch.compile); quick check without a GPU leaves it out: -b it or --full"
SKIP_BUILDS_DTYPE = "builds per shape (torch.compile); quick check runs its first dtype: -b it or --full"


def plan(ops=None, backends=None, dtypes=None, *, device: str | None = None, quick: bool = True,
         fuzz: int = 0) -> list[PlanItem]:  # fmt: skip
    """What ``check`` runs for these filters, in its order, with a rough cost per item."""
    dev = device or _device.default_device()
    cost = _COST["cuda" if dev == "cuda" else "cpu"]
    items = []
    for op in ops or registry.op_names():
        spec = get_spec(op)
        for impl in registry.impls(op):
            if backends and impl.backend not in backends:
                continue
            why = impl.why_unavailable(dev)
            # Named backends run in full; otherwise see SKIP_BUILDS_*.
            light = quick and impl.builds_per_shape and not backends
            ran_one = False
            for dtype in dtypes or spec.dtypes:
                if dtype not in spec.dtypes:
                    continue
                if dtype not in (impl.dtypes or spec.dtypes):
                    items.append(PlanItem(impl, dtype, "unavailable", 0.0))
                elif light and not why and (dev != "cuda" or ran_one):
                    items.append(PlanItem(impl, dtype, "skipped", 0.0, SKIP_BUILDS_CPU if dev != "cuda"
                                          else SKIP_BUILDS_DTYPE))  # fmt: skip
                elif why:
                    compiles = impl.precompile is not None and why == "no GPU"
                    items.append(PlanItem(impl, dtype, "compile" if compiles else "unavailable",
                                          cost["nvrtc"] if compiles else 0.0))  # fmt: skip
                else:
                    kind = _cost_class(impl)
                    est = cost[kind] * (1.0 if quick else _FULL_FACTOR)
                    if kind == "triton" or impl.precompile is not None:  # our kernels: their compiles
                        est *= _OP_WEIGHT.get(op, 1.0)
                    est *= 1.0 + 0.15 * fuzz
                    items.append(PlanItem(impl, dtype, "run", est))
                    ran_one = True
    return items


class Progress:
    """Elapsed time and an estimate of the time left while ``check`` runs: the plan's
    per-item estimates, scaled by how long the finished items took against theirs."""

    def __init__(self, items: list[PlanItem], clock=time.perf_counter):
        self.items, self.clock = items, clock
        self.total = sum(i.estimate for i in items)
        self.done = self.done_estimate = 0
        self.t0 = clock()

    def finished(self, item: PlanItem) -> None:
        self.done += 1
        self.done_estimate += item.estimate

    @property
    def elapsed(self) -> float:
        return self.clock() - self.t0

    @property
    def remaining(self) -> float:
        """Seconds left: the estimates of the items not yet run, times (time taken so far /
        the estimates of the items done) once a few seconds' worth has finished."""
        left = self.total - self.done_estimate
        if self.done_estimate >= 1.0:
            left *= self.elapsed / self.done_estimate
        return max(left, 0.0)


def fmt_seconds(s: float) -> str:
    """12 s, 3:05, 1:02:03"""
    s = int(round(s))
    if s < 60:
        return f"{s} s"
    m, s = divmod(s, 60)
    return f"{m}:{s:02d}" if m < 60 else f"{m // 60}:{m % 60:02d}:{s:02d}"
