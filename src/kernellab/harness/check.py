"""The correctness engine: every implementation against the float64 reference, on
ordinary and hostile inputs (DESIGN.md "Correctness").

For one implementation and one dtype it runs:

- ``shape``   every test shape of the op (edge shapes included), fresh random inputs,
              outputs NaN-poisoned, judged against 2 x PyTorch's error;
- ``rerun``   the first non-empty shape again with new inputs (catches cached outputs);
- ``special`` NaN / +-inf / extremes planted in the input: parity with the reference;
- ``layout``  transposed, sliced, storage offset 1, expanded inputs: computed correctly
              or refused with a clear error;
- ``option``  each of the op's keyword-option cases (``OpSpec.option_sets``), forward and
              gradient;
- ``grad``    every gradient vs autograd of the float64 reference, with a contiguous and
              a strided grad_output;
- ``opcheck`` ``torch.library.opcheck`` on each custom op behind the implementation;
- ``bad``     bad inputs must raise TypeError/ValueError naming the argument.

CUDA backends on a machine without a GPU are compiled with NVRTC for sm_80 and sm_90
("compiled, not run: no GPU"); their bad-input cases that need no GPU still run.
"""

from __future__ import annotations

import contextlib
import random
import re
import traceback
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch

from kernellab import device as _device
from kernellab import registry
from kernellab.harness.compare import Verdict, judge
from kernellab.ops.spec import LAYOUTS, OpSpec, dtype_name, get_spec, options_str, shape_str, to64
from kernellab.profile.nvtx import nvtx_range

PASS, FAIL, REFUSED, SKIP = "pass", "fail", "refused", "skip"
# Exceptions that count as a clear refusal of an unsupported layout.
_REFUSAL = (TypeError, ValueError, NotImplementedError)


@dataclass
class CaseResult:
    kind: str  # shape | rerun | special | layout | grad | opcheck | bad | compile
    name: str
    status: str
    err: float | None = None
    bound: float | None = None
    detail: str = ""

    @property
    def ratio(self) -> float | None:
        if self.err is None or not self.bound:
            return None
        return self.err / self.bound


@dataclass
class Report:
    op: str
    backend: str
    dtype: str | None
    device: str
    status: str  # pass | fail | unavailable | compiled
    reason: str = ""
    seed: int = 0
    cases: list[CaseResult] = field(default_factory=list)

    @property
    def failures(self) -> list[CaseResult]:
        return [c for c in self.cases if c.status == FAIL]

    @property
    def worst_ratio(self) -> float | None:
        r = [c.ratio for c in self.cases if c.ratio is not None and c.status == PASS]
        return max(r) if r else None

    def to_dict(self) -> dict:
        return {
            "op": self.op,
            "backend": self.backend,
            "dtype": self.dtype,
            "device": self.device,
            "status": self.status,
            "reason": self.reason,
            "seed": self.seed,
            "cases": [c.__dict__ for c in self.cases],
        }


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


def _short(e: BaseException) -> str:
    msg = str(e).strip().split("\n")[0]
    return f"{type(e).__name__}: {msg[:200]}"


class _Runner:
    """Checks one (impl, dtype) on one device."""

    def __init__(self, impl: registry.Impl, spec: OpSpec, dtype, dev: str, seed: int, quick: bool):
        self.impl, self.spec, self.dtype, self.dev, self.quick = impl, spec, dtype, dev, quick
        self.seed = seed
        self._n = 0
        torch_impl = None
        if impl.backend != "torch":
            try:
                torch_impl = registry.get(spec.name, "torch")
            except KeyError:
                torch_impl = None
        self.baseline = torch_impl
        self.cases: list[CaseResult] = []

    def next_seed(self) -> int:
        self._n += 1
        return self.seed + 7919 * self._n

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
        if len(out) != len(ref):
            return CaseResult(kind, name, FAIL, detail=f"{len(out)} outputs, expected {len(ref)}")
        worst: Verdict | None = None
        for i, (o, r) in enumerate(zip(out, ref)):
            v = judge(o, r, self.dtype, base[i] if base is not None else None)
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
        # The same shape again with fresh inputs: a cached output fails here.
        shape = spec.layout_shape
        for i in range(2):
            args = spec.make_inputs(shape, self.dtype, self.dev, self.next_seed())
            yield self.run_forward("rerun", f"{shape_str(shape)} #{i + 1}", args)

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
    def options(self):
        spec = self.spec
        for opts in spec.option_sets:
            args = spec.make_inputs(spec.layout_shape, self.dtype, self.dev, self.next_seed())
            yield self.run_forward("option", options_str(opts), args, opts)
            if spec.grad_args and getattr(self.impl.fn, "differentiable", True) is not False:
                yield self._grad_case(spec.layout_shape, f"grad {options_str(opts)}", False, opts)

    # -- gradients -----------------------------------------------------------------
    def grads(self):
        spec = self.spec
        if not spec.grad_args:
            return
        if getattr(self.impl.fn, "differentiable", True) is False:
            yield CaseResult("grad", "all", SKIP, detail="registered without gradients")
            return
        shapes = spec.gradient_shapes[:1] if self.quick else spec.gradient_shapes
        for shape in shapes:
            for strided_dy in (False, True):
                name = f"{shape_str(shape)}{' strided dy' if strided_dy else ''}"
                yield self._grad_case(shape, name, strided_dy)

    def _grad_case(self, shape, name, strided_dy, options=None) -> CaseResult:
        spec = self.spec
        options = options or {}
        args = spec.make_inputs(shape, self.dtype, self.dev, self.next_seed())
        gen = torch.Generator(device=self.dev).manual_seed(self.next_seed())

        def leaves(src):
            return [_leaf(a, i in spec.grad_args) for i, a in enumerate(src)]

        # Reference: autograd through the float64 formula.
        args64 = [_leaf(to64(a), i in spec.grad_args) for i, a in enumerate(args)]
        ref_out = _outputs(spec.reference(*args64, **options))[0]
        if strided_dy and ref_out.dim() == 0:
            return CaseResult("grad", name, SKIP, detail="scalar output: no strided grad_output")
        dy = _dy_like(ref_out, self.dtype, self.dev, gen, strided_dy)
        wrt64 = [args64[i] for i in spec.grad_args]
        ref_grads = torch.autograd.grad(ref_out, wrt64, dy.to(torch.float64))

        base_grads = None
        if self.baseline is not None:
            b_args = leaves(args)
            b_out = _outputs(self.baseline.fn(*b_args, **options))[0]
            base_grads = torch.autograd.grad(b_out, [b_args[i] for i in spec.grad_args], dy)

        i_args = leaves(args)
        try:
            with nan_filled_empty():
                out = _outputs(self.impl(*i_args, **options))[0]
                if not out.requires_grad:
                    return CaseResult("grad", name, FAIL, detail="output does not require grad (no autograd)")
                for i in spec.grad_args:
                    poison_allocator(args[i].shape, args[i].dtype, self.dev)
                grads = torch.autograd.grad(out, [i_args[i] for i in spec.grad_args], dy)
                _sync(self.dev)
        except Exception as e:  # noqa: BLE001
            why = self.impl.outside_limits(args, options) if isinstance(e, _REFUSAL) else None
            if why:
                return CaseResult("grad", name, REFUSED, detail=f"{why}: {_short(e)}")
            return CaseResult("grad", name, FAIL, detail="raised " + _short(e))
        worst = None
        for k, (g, r) in enumerate(zip(grads, ref_grads)):
            argname = spec.arg_names[spec.grad_args[k]]
            if g is None:
                return CaseResult("grad", name, FAIL, detail=f"no gradient for {argname}")
            v = judge(g, r, self.dtype, base_grads[k] if base_grads is not None else None)
            if not v.ok:
                return CaseResult("grad", f"{name} d{argname}", FAIL, v.err, v.bound, v.detail)
            if worst is None or v.ratio > worst.ratio:
                worst = v
        return CaseResult("grad", name, PASS, worst.err, worst.bound)

    # -- custom ops ----------------------------------------------------------------
    def opchecks(self):
        spec = self.spec
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
            if case.needs_gpu and (self.dev != "cuda" or not _device.has_cuda()):
                continue  # mixed devices: only meaningful for a backend checked on the GPU
            if not runnable and not case.gpu_only:
                continue
            yield check_bad_input(self.impl, case, self.dev, self.dtype)


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


def check_impl(
    impl: registry.Impl,
    dtype: torch.dtype,
    *,
    device: str | None = None,
    quick: bool = False,
    seed: int | None = None,
    opcheck: bool = True,
    gate: bool = False,
) -> Report:
    """Check one implementation for one dtype; returns a Report (never raises for a
    wrong implementation). ``gate=True`` runs only the forward cases on the quick shapes,
    specials and layouts: the benchmark's admission test before it times anything."""
    spec = get_spec(impl.op)
    dev = device or _device.default_device()
    seed = random.SystemRandom().randrange(2**30) if seed is None else seed
    rep = Report(impl.op, impl.backend, dtype_name(dtype), dev, PASS, seed=seed)
    allowed = impl.dtypes or spec.dtypes
    if dtype not in allowed:
        rep.status, rep.reason = "unavailable", f"{dtype_name(dtype)} not supported by this backend"
        return rep
    why = impl.why_unavailable(dev)
    runner = _Runner(impl, spec, dtype, dev, seed, quick)
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
        return rep

    if gate:
        runner.quick = True
        stages = [runner.shapes, runner.specials, runner.layouts]
    else:
        stages = [
            runner.shapes,
            runner.specials,
            runner.layouts,
            runner.options,
            runner.grads,
            runner.bad_inputs,
        ]
    if opcheck and impl.custom_ops and not gate:
        stages.append(runner.opchecks)
    for stage in stages:
        try:
            # NaN/inf inputs are deliberate: keep the Triton interpreter's numpy quiet.
            with np.errstate(all="ignore"):
                for case in stage():
                    rep.cases.append(case)
        except Exception as e:  # noqa: BLE001 - a crash in the harness itself is a failure
            rep.cases.append(
                CaseResult(
                    stage.__name__, "harness", FAIL, detail=_short(e) + "\n" + traceback.format_exc(limit=3)
                )
            )
    if rep.failures:
        rep.status = FAIL
    return rep


def check(
    ops=None,
    backends=None,
    dtypes=None,
    *,
    device: str | None = None,
    quick: bool = False,
    seed: int | None = None,
    on_result=None,
    on_start=None,
) -> list[Report]:
    """Check every matching implementation x dtype. ``on_start(impl, dtype)`` and
    ``on_result(report)`` are progress hooks."""
    reports = []
    for op in ops or registry.op_names():
        spec = get_spec(op)
        for impl in registry.impls(op):
            if backends and impl.backend not in backends:
                continue
            for dtype in dtypes or spec.dtypes:
                if dtype not in spec.dtypes:
                    continue
                if on_start:
                    on_start(impl, dtype)
                with nvtx_range(f"check {impl.name} {dtype_name(dtype)}"):
                    rep = check_impl(impl, dtype, device=device, quick=quick, seed=seed)
                reports.append(rep)
                if on_result:
                    on_result(rep)
    return reports


def plan_size(ops=None, backends=None, dtypes=None) -> int:
    n = 0
    for op in ops or registry.op_names():
        spec = get_spec(op)
        for impl in registry.impls(op):
            if backends and impl.backend not in backends:
                continue
            n += len([d for d in (dtypes or spec.dtypes) if d in spec.dtypes])
    return n
