"""The one table of implementations: (op, backend) -> Impl.

The CLI, the check engine, the benchmark and the tests never import a backend by
name; they ask this registry. A user's own kernel joins the table through the
public :func:`register` decorator and is then checked and benchmarked exactly like
a built-in one::

    @kernellab.register("gelu", "my_ext", devices=("cuda",))
    def my_gelu(x):
        return my_extension.gelu(x)
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch

from kernellab import device as _dev
from kernellab.core import choice, shapes, tables
from kernellab.core import spec as _spec
from kernellab.options import config

# Backend names are ordered for display: the baselines, then ours, then numbered
# teaching variants, then peers and user registrations.
_ORDER = ["manual", "torch", "compile", "triton", "cuda"]
_BACKEND_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass
class Impl:
    """One implementation of one op.

    fn:          the callable, same signature as the op's public function minus
                 ``backend``; returns the op's output(s).
    devices:     device types it can run on ("cuda", "cpu").
    available:   optional ``() -> str | None``: None when usable, else *why not*
                 (peer not installed, no NVRTC, ...). Device support is separate.
    precompile:  optional ``(archs) -> list[str]``: compile without running (CUDA
                 backends compile with NVRTC for each arch); returns one line each.
    custom_ops:  ``torch.library`` ops behind this impl, for ``opcheck``; each is
                 ``(op, make_args)`` where ``make_args(device, dtype)`` builds a sample.
    builtin:     False for registrations made by users.
    limits:      optional ``(*args, **options) -> str | None``: why these arguments lie
                 outside what the backend computes by design (None: inside). The backend
                 must refuse such a call with TypeError / ValueError; ``check`` then counts
                 the case as refused, not failed (and judges it as usual if it computes).
    double_backward: whether gradients taken with ``create_graph=True`` are themselves
                 differentiable (second derivatives exact). ``check`` requires them right
                 where declared; where not, a RuntimeError (or right numbers, never a
                 gradient that silently lost its graph).
    builds_per_shape: builds code for every new shape, layout and dtype it meets
                 (torch.compile: a C++ or Triton build of a second or more each); the
                 default quick ``check`` runs it in one dtype on a GPU and leaves it out
                 without one, unless it is named (``-b``) or the check is ``--full``.
    """

    op: str
    backend: str
    fn: Callable
    devices: tuple[str, ...] = ("cuda", "cpu")
    available: Callable[[], str | None] | None = None
    precompile: Callable[[Iterable[str]], list[str]] | None = None
    custom_ops: list = field(default_factory=list)
    builtin: bool = True
    description: str = ""
    dtypes: tuple | None = None  # what it accepts; None: the op's spec's (which check judges)
    module: object = None  # the cuda.runtime.Module of a CUDA backend (for `kernellab asm`)
    # dtype[, arch=] -> [(kernel, signature, constexprs, warps or options)]
    triton_kernels: Callable | None = None
    limits: Callable[..., str | None] | None = None
    double_backward: bool = False
    builds_per_shape: bool = False
    _spec: object = field(default=None, repr=False, compare=False)
    _validate: object = field(default=None, repr=False, compare=False)  # set at the first call

    def why_unavailable(self, device: str | None = None) -> str | None:
        """None if this impl can run on ``device`` (default: the best device here)."""
        device = device or _dev.default_device()
        if self.available is not None:
            reason = self.available()
            if reason:
                return reason
        if device not in self.devices:
            if "cuda" in self.devices and device == "cpu":
                return "no GPU" if not _dev.has_cuda() else "GPU-only backend"
            return f"runs on {', '.join(self.devices)} only"
        if device == "cuda" and not _dev.has_cuda():
            return "no GPU"
        return None

    def __call__(self, *args, **kwargs):
        """Validate the arguments (clear errors naming the argument), then run."""
        if _is_compiling():
            # traced: a validator built here, not the lazily cached one: Dynamo would guard
            # on the cache (None until the first eager call sets it) and recompile after it
            self._validator()(args, kwargs, self.devices)
            return self.fn(*args, **kwargs)
        validate = self._validate
        if validate is None:
            validate = self._validate = self._validator()
        try:
            validate(args, kwargs, self.devices)
        except RuntimeError:  # (zero-cost until raised) a nested tensor has no sizes to read
            _refuse_nested(self.op, args, kwargs)
            raise
        return self.fn(*args, **kwargs)

    def _validator(self):
        spec = self._spec
        if spec is None:  # an Impl built by hand rather than through register()
            spec = self._spec = _spec.get_spec(self.op)
        # a backend that takes a dtype the spec does not (the reference backends' float64)
        # validates against its own list
        wider = self.dtypes is not None and any(d not in spec.dtypes for d in self.dtypes)
        return spec.call_validator(self.dtypes if wider else None)

    def outside_limits(self, args, options) -> str | None:
        """Why (args, options) are outside this backend's documented limits, or None."""
        return self.limits(*args, **(options or {})) if self.limits is not None else None

    @property
    def name(self) -> str:
        return f"{self.op}/{self.backend}"


_TABLE: dict[tuple[str, str], Impl] = {}


def _sort_key(backend: str):
    m = re.fullmatch(r"cuda_v(\d+)", backend)
    if backend in _ORDER:
        return (_ORDER.index(backend), 0, backend)
    if m:
        return (len(_ORDER), int(m.group(1)), backend)
    return (len(_ORDER) + 1, 0, backend)


def add_impl(impl: Impl, *, replace: bool = False) -> Impl:
    if not _BACKEND_RE.fullmatch(impl.backend):
        raise ValueError(f"backend name {impl.backend!r} must be an identifier (letters, digits, _)")
    if impl.op not in _spec.SPECS:
        raise ValueError(f"unknown op {impl.op!r}; define its OpSpec first")
    impl._spec = _spec.SPECS[impl.op]
    if getattr(impl._spec, "key_validates", False):
        _SIG_OPS.add(impl.op)
    if impl._spec.input_facts is not None:
        _FACTS[impl.op] = impl._spec.input_facts
    key = (impl.op, impl.backend)
    if key in _TABLE and not replace:
        raise ValueError(f"{impl.op}/{impl.backend} is already registered; pass replace=True to override it")
    _TABLE[key] = impl
    _forget_choices()
    if _DEFAULTS:  # keep the default-backend table current (eagerly, see _DEFAULTS)
        for op, d in list(_DEFAULTS):
            if op == impl.op:
                _DEFAULTS[(op, d)] = compiled_backend(op, d)
    return impl


def register(
    op: str,
    backend: str,
    *,
    devices: Iterable[str] = ("cuda", "cpu"),
    available: Callable[[], str | None] | None = None,
    precompile=None,
    custom_ops=None,
    description: str = "",
    dtypes=None,
    replace: bool = False,
    builtin: bool = False,
    module=None,
    triton_kernels=None,
    limits=None,
    double_backward: bool = False,
    builds_per_shape: bool = False,
):
    """Decorator: register ``fn`` as ``backend`` of ``op``.

    The op must exist (its OpSpec defines inputs, reference and checks). A user's
    registration is checked and benchmarked like a built-in one.
    """
    if op not in _spec.SPECS:
        _spec.load_all()
    if op not in _spec.SPECS:
        raise ValueError(f"unknown op {op!r}; known ops: {', '.join(sorted(_spec.SPECS))}")
    devices = tuple(devices)
    for d in devices:
        if d not in ("cuda", "cpu"):
            raise ValueError(f"devices must hold 'cuda' and/or 'cpu', got {d!r}")

    def deco(fn):
        add_impl(
            Impl(
                op=op,
                backend=backend,
                fn=fn,
                devices=devices,
                available=available,
                precompile=precompile,
                custom_ops=list(custom_ops or []),
                builtin=builtin,
                description=description or (fn.__doc__ or "").strip().split("\n")[0],
                dtypes=tuple(dtypes) if dtypes else None,
                module=module,
                triton_kernels=triton_kernels,
                limits=limits,
                double_backward=double_backward,
                builds_per_shape=builds_per_shape,
            ),
            replace=replace,
        )
        return fn

    return deco


def unregister(op: str, backend: str) -> None:
    _TABLE.pop((op, backend), None)
    _forget_choices()
    for key in [k for k in _DEFAULTS if k[0] == op]:
        _DEFAULTS[key] = compiled_backend(op, key[1])


def impls(op: str | None = None) -> list[Impl]:
    _spec.load_all()
    rows = [i for i in _TABLE.values() if op is None or i.op == op]
    return sorted(rows, key=lambda i: (i.op, _sort_key(i.backend)))


def get(op: str, backend: str) -> Impl:
    try:
        impl = _TABLE.get((op, backend))  # hot path: no import machinery (Dynamo traces this)
    except TypeError:  # an unhashable backend, e.g. backend=["triton"]
        impl = None
    if impl is not None:
        return impl
    if not isinstance(backend, str):
        what = f"{type(backend).__name__} {backend!r}"
        raise TypeError(f"backend must be a backend name (str) or None, got {what}")
    _spec.load_all()
    try:
        return _TABLE[(op, backend)]
    except KeyError:
        known = ", ".join(i.backend for i in impls(op)) or "none"
        raise KeyError(f"no backend {backend!r} for op {op!r}; registered: {known}") from None


def op_names() -> list[str]:
    _spec.load_all()
    return sorted(_spec.SPECS)


# (op, device type) -> backend used when none is named inside a torch.compile graph
# (compiled_backend). Filled eagerly (warm_defaults, at import) so that torch.compile
# traces a dict lookup, not the availability probes.
_DEFAULTS: dict[tuple[str, str], str] = {}


# The default's choice per call shape: (op, device type, dtype, the shapes the choice reads,
# the options tables tell apart) -> the Impl for both a forward-only call and a call with a
# backward, or (forward Impl, forward+backward Impl) where the two differ. After the first
# call at a shape the default costs one tuple and one dict lookup (and, only where the two
# modes chose differently, the grad test); a _Trusted entry (below) also skips validation.
_CHOSEN: dict[tuple, Impl | tuple[Impl, Impl] | _Trusted] = {}
# ops whose spec says key_validates: for their calls of several tensors or with keywords
# _CHOSEN also holds (op, *_signature(...)) -> _Trusted (never a 5-tuple like a choice key)
_SIG_OPS: set[str] = set()
# ops whose choice reads facts of the inputs (OpSpec.input_facts, e.g. matmul's b_t): the
# facts join their choice keys and validation signatures
_FACTS: dict = {}
_CHOSEN_MAX = 4096  # a model with ever-new shapes (varying lengths) re-chooses, never grows without bound


class _Trusted:
    """A choice-cache entry whose call was validated once: the op's spec says
    ``key_validates`` (its validation reads only each tensor argument's class, dtype, shape,
    device and layout, and the keyword values), and a call with these facts passed
    validation and ran. For a call of one tensor and no keyword arguments it replaces the
    choice key's entry (the key holds the facts but for the layout, checked per call); for
    any other call it is stored under ``(op, *_signature(...))``, so only a call with the
    same facts finds it. Either way the backend's function then runs directly; any other
    call is validated as usual. PyTorch's op chosen at a launch-bound shape then costs
    less than naming ``backend="torch"`` (validation is a tenth or more of a launch-bound
    call's host time). Where the key's forward and
    forward+backward choices differ, ``grad_impl`` is the latter (both validated for the
    facts; ``wants_grad`` picks per call), else None."""

    __slots__ = ("impl", "fn", "grad_impl", "grad_fn")

    def __init__(self, impl: Impl, grad_impl: Impl | None = None):
        self.impl = impl
        self.fn = impl.fn
        self.grad_impl = grad_impl
        self.grad_fn = grad_impl.fn if grad_impl is not None else None

    def pick(self):
        """The choice-cache entry it stands for: an Impl or (forward, forward+backward)."""
        return self.impl if self.grad_impl is None else (self.impl, self.grad_impl)


_STRIDED = torch.strided
_TENSOR = torch.Tensor


def _refuse_nested(op: str, args, kwargs) -> None:
    try:
        named = _spec.get_spec(op).tensor_args(args, kwargs)
    except KeyError:
        return
    _spec.refuse_nested(op, named)


def _signature(args, kwargs, op: str | None = None) -> list:
    """What a validation reads of a call, flat: per positional argument a tensor's class,
    dtype, shape, device and layout, or any other value's class and the value (``causal=1``
    is not ``causal=True``); per keyword its name, then the same; last, for an op whose
    choice reads facts of the inputs (``_FACTS``), those. (Unambiguous: a positional entry
    starts with a class, a keyword's with its name, and a class says whether a tensor's
    five facts follow. Flat: ~25% cheaper than a tuple per argument.)"""
    sig = []
    for a in args:
        if isinstance(a, _TENSOR):
            sig += (a.__class__, a.dtype, a.shape, a.device, a.layout)
        else:
            sig += (a.__class__, tuple(a) if a.__class__ is list else a)
    if kwargs:
        for k, v in kwargs.items():
            if isinstance(v, _TENSOR):
                sig += (k, v.__class__, v.dtype, v.shape, v.device, v.layout)
            else:  # a list's items, not the list: the caller may change it between calls
                sig += (k, v.__class__, tuple(v) if v.__class__ is list else v)
    if op in _FACTS:
        sig.append(_FACTS[op](args))
    return sig


_RECORD: list | None = None
_RECORDED: set = set()  # (choice key, whether a backward follows) already in _RECORD

# what ``call`` reads on every default call, bound once (module attribute lookups)
_KEY_ARGS = shapes.KEY_ARGS
_wants_grad = shapes.wants_grad
_option_values = shapes.option_values
_is_compiling = torch.compiler.is_compiling


@contextlib.contextmanager
def recording_choices():
    """Within the block, each choice ``backend=None`` makes is appended to the yielded list
    (op, first argument's shape, whether a backward follows, backend, why), once per call
    site and mode. What ``train mnist --backend default`` prints."""
    global _RECORD
    _RECORDED.clear()
    _RECORD = []
    try:
        yield _RECORD
    finally:
        _RECORD = None


def call(op: str, backend: str | None, *args, **kwargs):
    """Run ``op`` with ``backend``. None: the default for these arguments on the device of
    the first tensor (``core.choice``): the tuning table's choice for the nearest
    measured shape where this GPU model (or one of its architecture) has a table, else the
    op's preferred backend usable there; and where that backend refuses the input with a
    ValueError that PyTorch's op accepts, PyTorch's op (attention with head dim 100 is
    served, not refused)."""
    if backend is not None:
        impl = get(op, backend)
        validate = impl._validate if not _is_compiling() else None  # (traced: Impl.__call__)
        if validate is None:
            return impl(*args, **kwargs)
        try:
            validate(args, kwargs, impl.devices)  # Impl.__call__ inlined (one frame fewer)
        except RuntimeError:  # a nested tensor has no sizes to read
            _refuse_nested(op, args, kwargs)
            raise
        return impl.fn(*args, **kwargs)
    trusted = None
    try:
        x = args[0]
        if _is_compiling():  # traced: the cached per-device default, no table I/O
            dev = "cuda" if x.is_cuda else x.device.type
            return get(op, _DEFAULTS.get((op, dev)) or compiled_backend(op, dev))(*args, **kwargs)
        if _RECORD is None and (kwargs or len(args) > 1) and op in _SIG_OPS:
            # a call of several tensors or with keywords: its facts are its own key
            try:
                trusted = _CHOSEN.get((op, *_signature(args, kwargs, op)))
            except TypeError:  # an unhashable keyword value: the choice key's path
                pass
        if trusted is None:
            dev = "cuda" if x.is_cuda else x.device.type  # (device.type costs ~0.5 us a read on a CPU host)
            ck = (op, dev, x.dtype, x.shape if op not in _KEY_ARGS else (x.shape, args[1].shape),
                  _option_values(op, kwargs) if kwargs else None)  # fmt: skip
            if op in _FACTS:
                ck = (*ck, _FACTS[op](args))
            pick = _CHOSEN.get(ck)
            if pick.__class__ is _Trusted and x.layout is _STRIDED and len(args) == 1 and _RECORD is None:
                trusted = pick  # one tensor, no keywords: the key holds its facts but the layout
    except (AttributeError, IndexError, TypeError, RuntimeError):  # not tensors, an unhashable
        # option, or a nested tensor (no sizes):
        return _choose_and_call(op, args, kwargs, None, None)  # the op's own validation says why
    if trusted is not None:
        grad = trusted.grad_fn is not None and _wants_grad(args)
        try:
            return trusted.grad_fn(*args, **kwargs) if grad else trusted.fn(*args, **kwargs)
        except ValueError as refusal:
            return _fall_back(op, trusted.grad_impl if grad else trusted.impl, refusal, args, kwargs)
    if pick is None or _RECORD is not None:
        return _choose_and_call(op, args, kwargs, ck, dev)
    cls = pick.__class__
    if cls is _Trusted:  # not the validated call's facts (a sparse tensor, more arguments)
        impl = pick.impl if pick.grad_impl is None or not _wants_grad(args) else pick.grad_impl
    else:
        impl = pick if cls is Impl else pick[_wants_grad(args)]
    validate = impl._validate
    if validate is not None:  # Impl.__call__ inlined: one Python frame fewer on the hot path
        try:
            validate(args, kwargs, impl.devices)
            return impl.fn(*args, **kwargs)
        except ValueError as refusal:
            return _fall_back(op, impl, refusal, args, kwargs)
    return _run(op, impl, args, kwargs)


def _choose_and_call(op: str, args, kwargs, ck, dev):
    """The default's first call at a choice key (or every call where none can be built, and
    then ``dev`` is None): choose for both modes, remember, record, run."""
    if dev is None:
        _refuse_nested(op, args, kwargs)
    x = args[0] if args else None
    if dev is None:
        dev = getattr(x, "device", None)  # (numpy arrays have a str device: the validator refuses them)
        dev = dev.type if isinstance(dev, torch.device) else "cpu"
    wants = _wants_grad(args)
    pick = _CHOSEN.get(ck) if ck is not None else None
    if pick.__class__ is _Trusted:  # (recording: every call comes here)
        pick = pick.pick()
    elif pick is None:
        fwd = get(op, choose(op, args, dev, "fwd", kwargs)[0])
        # an op timed forward only (argmax: no gradient) has no forward+backward rows: its
        # forward choice serves a call with gradients on too (not the heuristic's)
        modes = getattr(fwd._spec, "modes", ("fwdbwd",))
        both = get(op, choose(op, args, dev, "fwdbwd", kwargs)[0]) if "fwdbwd" in modes else fwd
        pick = fwd if fwd is both else (fwd, both)
        if ck is not None:
            if len(_CHOSEN) >= _CHOSEN_MAX:
                _CHOSEN.clear()
            _CHOSEN[ck] = pick
    impl = pick if pick.__class__ is Impl else pick[wants]
    if _RECORD is not None and (ck is None or (ck, wants) not in _RECORDED):
        name, why = choose(op, args, dev, None, kwargs)
        _RECORD.append({"op": op, "shape": tuple(getattr(x, "shape", ())), "fwdbwd": wants,
                        "backend": name, "why": why})  # fmt: skip
        if ck is not None:
            _RECORDED.add((ck, wants))
    if ck is None or not getattr(impl._spec, "key_validates", False):
        return _run(op, impl, args, kwargs)
    sig = None if len(args) == 1 and not kwargs else _signature(args, kwargs, op)
    try:
        out = impl(*args, **kwargs)  # validated here: later calls with these facts skip it
    except ValueError as refusal:
        return _fall_back(op, impl, refusal, args, kwargs)
    if (sig is not None or args[0].layout is _STRIDED) and _CHOSEN.get(ck) is pick:
        if pick.__class__ is Impl:
            trusted = _Trusted(impl)
        elif _validates(pick[not wants], args, kwargs):  # the other mode's backend, same facts
            trusted = _Trusted(pick[0], pick[1])
        else:
            return out
        if sig is None:
            _CHOSEN[ck] = trusted
        else:
            try:
                _CHOSEN[(op, *sig)] = trusted
            except TypeError:  # an unhashable keyword value: validated on every call
                pass
    return out


def _validates(impl: Impl, args, kwargs) -> bool:
    """Whether ``impl``'s validation accepts the call (without running it)."""
    validate = impl._validate
    if validate is None:
        validate = impl._validate = impl._validator()
    try:
        validate(args, kwargs, impl.devices)
    except (TypeError, ValueError):
        return False
    return True


def _run(op: str, impl: Impl, args, kwargs):
    try:
        return impl(*args, **kwargs)
    except ValueError as refusal:
        return _fall_back(op, impl, refusal, args, kwargs)


def _fall_back(op: str, impl: Impl, refusal: ValueError, args, kwargs):
    """The default's chosen backend refused the input: PyTorch's op serves it if it can."""
    fallback = _TABLE.get((op, "torch")) if impl.backend != "torch" else None
    if fallback is None:
        raise refusal
    try:
        return fallback(*args, **kwargs)
    except Exception:  # noqa: BLE001 - torch refuses too: the input is bad, say why
        raise refusal from None


def _forget_choices() -> None:
    """A backend came or went, or a table changed: cached choices may name the wrong one."""
    _CHOSEN.clear()
    for cache in _RULE_CHOSEN.values():
        cache.clear()
    _CHOICES.clear()
    _USABLE.clear()


_RULE_CHOSEN: dict[str, dict] = {}  # default_rule's choice caches, one per rule
DEFAULT_RULES = ("queued", "loop")  # what config.default_by may say (core.choice.choose's ``by``)


@contextlib.contextmanager
def default_rule(by: str | None):
    """Within the block ``backend=None`` ranks table rows by ``by`` ("queued" or "loop", as
    ``config.default_by``; None: the rule it names now), with a choice cache of that rule's
    own, so steps under either rule can alternate in one process without re-choosing
    (``user_models``' variants "kernellab-loop" and "kernellab-queued"). Not thread-safe:
    one rule at a time per process."""
    global _CHOSEN
    if by is None:
        by = resolve_rule()
    if by not in DEFAULT_RULES:
        raise ValueError(f"by: 'queued' or 'loop', got {by!r}")
    saved = _CHOSEN, config.default_by
    _CHOSEN = _RULE_CHOSEN.setdefault(by, {})
    config.default_by = by
    try:
        yield
    finally:
        _CHOSEN, config.default_by = saved


def clear_cache() -> None:
    """Forget loaded tables and every cached choice (after ``tune`` writes, in tests)."""
    tables.clear()
    _forget_choices()


# --------------------------------------------------------------------------- the choice

# (op, device, dtype, mode, key, options, by, among) -> (backend, why)
_CHOICES: dict[tuple, tuple[str, str]] = {}
# (op, device) -> the backends of op registered and runnable on device
_USABLE: dict[tuple[str, str], frozenset] = {}


def usable(op: str, device: str) -> frozenset:
    """The backends of ``op`` registered here that run on ``device``."""
    got = _USABLE.get((op, device))
    if got is None:
        got = frozenset(
            b for (o, b), impl in _TABLE.items() if o == op and impl.why_unavailable(device) is None
        )
        _USABLE[(op, device)] = got
    return got


def choose(op: str, args, dev: str, mode: str | None = None, kwargs=None) -> tuple[str, str]:
    """(backend, why) ``backend=None`` picks for a call of ``op`` with ``args`` (and
    ``kwargs``) on device type ``dev``; ``mode`` "fwd" or "fwdbwd" (None: fwdbwd when a
    tensor argument requires grad)."""
    x = args[0] if args else None
    if mode is None:
        mode = "fwdbwd" if _wants_grad(args) else "fwd"
    opts = shapes.option_key(op, kwargs or {}, args if op in _FACTS else None)
    return choose_key(op, shapes.shape_key(op, args), getattr(x, "dtype", None), dev, mode, opts)


def choose_key(op: str, key, dtype, dev: str, mode: str = "fwd", options: str = "", by: str | None = None,
               among=None) -> tuple[str, str]:  # fmt: skip
    """``choose`` from a shape key (``core.shapes``), a dtype and the ``option_key`` of the
    call: ``core.choice.choose`` given this GPU model's table, the backends usable on
    ``dev`` and the op's preference (``by`` and ``among``: see there); cached. ``by=None``
    follows ``kernellab.config.default_by`` ("queued" unless set)."""
    by = resolve_rule(by)
    among = tuple(among) if among is not None else None
    ck = (op, dev, dtype, mode, key, options, by, among)
    hit = _CHOICES.get(ck)
    if hit is not None:
        return hit
    out = _choose(op, key, dtype, tables.gpu_of(dev), dev, mode, options, by, among)
    _CHOICES[ck] = out
    return out


def choose_for_gpu(op: str, key, dtype, gpu: str, mode: str = "fwd", options: str = "",
                   by: str | None = None) -> tuple[str, str]:  # fmt: skip
    """``choose_key`` on GPU model ``gpu``'s table from any machine (``kernellab explain
    --gpu``). Which backends run there cannot be known here: every backend of ``op`` that
    runs on CUDA counts as usable. Not cached."""
    return _choose(op, key, dtype, gpu, None, mode, options, resolve_rule(by), None)


def choice_inputs(op: str, key, device: str | None = None) -> tuple[frozenset, str, str | None, tuple, tuple]:
    """What ``choice.choose`` is given for a call of ``op`` at shape key ``key`` on
    ``device``: (usable backends, less what the op excludes for the shape; the preferred
    backend; the small-size backend or None; the exact key dims; the key bands). ``device``
    None: a CUDA device this machine may not have, every backend of the op that runs on
    CUDA usable."""
    spec = _spec.get_spec(op)
    if device is None:
        allowed = frozenset(b for (o, b), impl in _TABLE.items() if o == op and "cuda" in impl.devices)
        preferred = next((b for b in spec.default_backends if b in allowed), "torch")
    else:
        allowed, preferred = usable(op, device), default_backend(op, device)
    rule = spec.small_backend  # (a host-cost rule: for standalone calls only)
    small = rule(key) if rule is not None and key is not None else None
    if spec.default_excludes is not None and key is not None:
        allowed = allowed - frozenset(spec.default_excludes(key))
    return allowed, preferred, small, spec.key_exact, spec.key_bands


def _choose(op, key, dtype, gpu, device, mode, options, by, among) -> tuple[str, str]:
    """``choice.choose`` on ``gpu``'s table with ``choice_inputs`` for ``device``. Where the
    table has no row of the op with the call's input options (``OpSpec.input_options``,
    e.g. a matmul of nn.Linear's ``W.t()`` on a table timed with [K, N] weights only), the
    rows without them speak, and the why says so."""
    allowed, preferred, small, exact, bands = choice_inputs(op, key, device)
    dn = _spec.dtype_name(dtype) if dtype is not None else None
    table = tables.load_table(gpu)
    note = ""
    plain = shapes.without_input_options(op, options)
    if plain != options and table is not None:
        if choice.has_rows(table, op, options):
            # only rows timed with these inputs: a row without options (which serves any
            # option set) was timed without them
            table = dict(table, rows=[r for r in table["rows"] if r.get("op") != op or "options" in r])
        else:
            note = f" (no {op} rows with {options}: the rows without it)"
            options = plain
    out = choice.choose(table, os.path.basename(tables.table_path(gpu)), op, key, dn, mode,
                        options, usable=allowed, preferred=preferred, small=small, by=by,
                        among=among, exact=exact, bands=bands)  # fmt: skip
    return (out[0], out[1] + note) if note else out


def resolve_rule(by: str | None = None) -> str:
    """The ranking rule ``by`` names, checked (``core.choice.BY``); None: the default rule,
    ``config.default_by`` ("queued" or "loop"). "call" is an alias of "queued"."""
    from_config = by is None
    if from_config:
        by = config.default_by
    if by == "call":
        return "queued"
    if from_config and by not in DEFAULT_RULES:
        raise ValueError(
            f"kernellab.config.default_by (KERNELLAB_DEFAULT_BY): 'queued' or 'loop', got {by!r}"
        )
    if by not in choice.BY:
        raise ValueError(f"by: one of {', '.join(map(repr, choice.BY))}, got {by!r}")
    return by


def default_backend(op: str, device: str | None = None) -> str:
    """The first of the op's preferred backends that runs on ``device``."""
    return _first_usable(op, _spec.get_spec(op).default_backends, device) or "torch"


def _first_usable(op: str, backends, device: str | None) -> str | None:
    for b in backends:
        if b == "triton" and device == "cpu":
            continue  # the interpreter proves Triton kernels correct on the CPU; it is not fast
        impl = _TABLE.get((op, b))
        if impl is not None and impl.why_unavailable(device) is None:
            return b
    return None


def compiled_backend(op: str, device: str | None = None) -> str:
    """The backend ``backend=None`` runs inside a torch.compile graph: the first of the
    op's ``OpSpec.compiled_backends`` usable on ``device`` (PyTorch's own op unless the op
    declares otherwise), else ``default_backend``. In a compiled graph Inductor decomposes
    PyTorch's op and fuses it with its neighbours (residual add, bias, activation), while
    an opaque custom op keeps its own kernels and, for a kernel launched from Python (the
    CUDA backends), its host cost on every call of every step; so a compiled model that
    names no backend runs at least as fast as the same model without kernellab. A backend
    is declared here only where a compiled step with it measured faster."""
    return _first_usable(op, _spec.get_spec(op).compiled_backends, device) or default_backend(op, device)


def warm_defaults() -> None:
    devices = ["cpu"] + (["cuda"] if _dev.has_cuda() else [])
    for op in op_names():
        for d in devices:
            _DEFAULTS[(op, d)] = compiled_backend(op, d)
