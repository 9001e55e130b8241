"""Triton kernels for kernellab: compiled on a CUDA GPU, Triton's interpreter on the CPU.

The choice is made per launch, from the launch's tensors (``jit``): a kernel launched
with CUDA tensors compiles, the same kernel launched with CPU tensors runs under the
interpreter, in one process. Nothing is set for the process; a user who sets Triton's
own ``TRITON_INTERPRET=1`` gets Triton's behaviour (every kernel interpreted). The
interpreter runs programs one after another: it proves indexing and masking, not the
absence of races, and it is slow - keep CPU shapes small.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import itertools
import threading

import torch
import triton.language as tl

from kernellab import device
from kernellab.options import config


@functools.cache
def unavailable() -> str | None:
    try:
        import triton  # noqa: F401
    except Exception as e:
        return f"triton not importable: {e}"
    return None


def devices() -> tuple[str, ...]:
    """Where kernellab's Triton backends take tensors: CUDA tensors, compiled; and on a
    machine without a GPU, CPU tensors under the interpreter. A GPU machine's Triton
    backends refuse CPU tensors (the default serves them with another backend): Triton
    3.6's interpreter fails on some of the kernels there (a loop bound that is a one-element
    array, which NumPy 2 will not turn into an int). A kernel launched directly with CPU
    tensors is interpreted on any machine (``jit``)."""
    return ("cuda",) if device.has_cuda() else ("cuda", "cpu")


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for the host. ``triton.cdiv`` is a ConstexprFunction: ~6 us per host call."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1); ``triton.next_power_of_2`` costs ~6 us
    per host call."""
    return 1 << (n - 1).bit_length() if n > 1 else 1


_SMS: dict[int, int] = {}


def sm_count(device_index: int) -> int:
    """Multiprocessors of a CUDA device, cached (get_device_properties costs microseconds)."""
    n = _SMS.get(device_index)
    if n is None:
        n = _SMS[device_index] = torch.cuda.get_device_properties(device_index).multi_processor_count
    return n


def block_for(element_size: int, warps: int = 8, accesses: int = 4) -> int:
    """Elements per program for streaming kernels: each thread makes ``accesses``
    16-byte accesses (fp32: 4096 elements with 8 warps, fp16/bf16: 8192)."""
    return warps * 32 * accesses * (16 // element_size)


def launch_streaming(kernel, inputs) -> torch.Tensor:
    """Run an elementwise ``kernel(*inputs, out, n, BLOCK=...)`` over contiguous copies
    of ``inputs`` (same shape and dtype) into a fresh contiguous output (``launch_flat``)."""
    inputs = [t if t.is_contiguous() else t.contiguous() for t in inputs]
    y = torch.empty_like(inputs[0])
    if y.numel():
        launch_flat(kernel, [*inputs, y], y.numel(), block_for(y.element_size()), num_warps=8)
    return y


def launch_flat(kernel, tensors, n: int, block: int, **meta) -> None:
    """``kernel[grid](*tensors, n, BLOCK=block, **meta)`` over n elements of contiguous
    ``tensors`` (inputs and outputs, one element size): one launch of ceil(n / block)
    programs of ``block`` elements, whatever n. The kernels run their programs through
    ``stream_blocks``: every whole block without a mask (16-byte accesses however odd n
    is), only the last, partial one masked."""
    kernel[(cdiv(n, block),)](*tensors, n, BLOCK=block, **meta)


def streaming_kernels(*kernels):
    """``Impl.triton_kernels`` for kernels of the form ``k(ptrs..., n, BLOCK)`` as launched
    by ``launch_streaming``: every pointer of the dtype, n an i32, BLOCK and the warps as
    the launcher picks them."""

    def specs(dtype: str):
        size = {"fp32": 4, "fp16": 2, "bf16": 2}[dtype]
        out = []
        for k in kernels:
            params = list(inspect.signature(k.fn).parameters)
            sig = {p: f"*{dtype}" for p in params[:-2]}
            sig[params[-2]] = "i32"
            sig[params[-1]] = "constexpr"
            out.append((k, sig, {params[-1]: block_for(size)}, 8))
        return out

    return specs


# --------------------------------------------------------------------------- lean launch
#
# Host cost of one launch of an already compiled kernel. Triton's ``kernel[grid](...)``
# binds the arguments, builds a specialization key as a string, looks the kernel up,
# builds launch metadata, reads the hooks and only then calls the compiled launcher:
# a plain Triton launch of the GeLU kernel costs about three times all of torch's gelu
# in host time. ``jit`` below returns a JITFunction
# whose ``[grid](...)`` keeps a small cache of compiled kernels keyed on exactly what
# Triton specializes on (per tensor: dtype and 16-byte alignment; per int: == 1,
# divisible by 16, 32- or 64-bit; the constexprs and launch options by value), and calls
# the compiled launcher directly. A miss goes through Triton's own path (which compiles
# and launches) and fills the cache.
#
# Under torch.compile (FakeTensor / FunctionalTensor arguments inside a triton_op) the
# call goes through ``torch.library.wrap_triton``, so Inductor sees the kernel and
# launches it from its generated code. A launch with CPU tensors goes to Triton's
# interpreter (``run``, below). ``kernellab.config.triton_launch`` "jit" turns the lean path
# off (comparisons).

_REAL_TENSORS = (torch.Tensor, torch.nn.Parameter)
_INT32 = (-(2**31), 2**31)
_OPTIONS = frozenset(
    ("num_warps", "num_stages", "num_ctas", "enable_fp_fusion", "maxnreg", "launch_pdl", "debug")
)


def _int_class(v: int) -> int:
    """What Triton specializes an int argument on: 1 (== 1), 16 (divisible by 16), 0 else;
    plus 100 when it does not fit in 32 bits."""
    cls = 1 if v == 1 else (16 if v % 16 == 0 else 0)
    if _INT32[0] <= v < _INT32[1]:
        return cls
    return cls + (200 if v >= 2**63 else 100)  # i64 or u64


def _make_lean_jit():
    from triton.runtime.jit import JITFunction

    try:
        from torch._C import _cuda_getCurrentRawStream as raw_stream
        from torch._C import _cuda_getDevice as current_device
    except ImportError:  # pragma: no cover - CPU-only torch builds
        raw_stream = current_device = None

    class LeanJIT(JITFunction):
        """A JITFunction whose ``[grid](*args, **constexprs)`` launches cached compiled
        kernels directly (see the comment above)."""

        def __getitem__(self, grid):
            if config.triton_launch == "jit":  # plain launches (comparisons)
                return JITFunction.__getitem__(self, grid)
            return lambda *args, **kw: self._lean_run(grid, args, kw)

        def _slow(self, grid, args, kw):
            return self.run(*args, grid=grid, warmup=False, **kw)

        def run(self, *args, grid, warmup, **kwargs):
            """Triton's launch (compile, cache, launch), or the interpreter when the launch's
            tensors are on the CPU (``_interprets``)."""
            if _interprets(args, kwargs):
                with interpreting():
                    return _interpreted(self).run(*args, grid=grid, warmup=warmup, **kwargs)
            return JITFunction.run(self, *args, grid=grid, warmup=warmup, **kwargs)

        def _lean_run(self, grid, args, kw):
            a0 = args[0]
            if type(a0) not in _REAL_TENSORS:
                from torch.library import wrap_triton

                # traced: Inductor launches it
                return wrap_triton(self)[grid](*args, **with_defaults(self, args, kw))
            if type(grid) is not tuple:
                try:  # our grids read only constexprs: meta["BLOCK_M"]
                    grid = tuple(grid(kw))
                except Exception:  # noqa: BLE001 - a grid that reads other arguments
                    return self._slow(grid, args, kw)
            if raw_stream is None:
                return self._slow(grid, args, kw)
            ints = []  # the launch's arguments, tensors as their addresses (see fast_launcher)
            key = self._lean_key(args, kw, ints)
            if key is None:  # a type the cache does not model (descriptors, dtypes, ...)
                return self._slow(grid, args, kw)
            dev = key[0]
            if dev is None:  # a CPU tensor: the interpreter
                return self._slow(grid, args, kw)
            hit = self._lean_cache.get(key)
            if hit is None or dev != current_device():
                compiled = self._slow(grid, args, kw)
                if dev == current_device():
                    self._lean_cache[key] = self._lean_entry(compiled, args, kw)
                return compiled
            if hit is False:  # this kernel / call shape cannot take the lean path
                return self._slow(grid, args, kw)
            launch, pre, extra = hit
            launch(*_grid3(grid), raw_stream(dev), *pre, *ints, *extra)
            return None

        def _lean_key(self, args, kw, ints=None):
            """The cache key of a call (see above), or None for an argument type it does
            not model; ``ints``, when given, receives the launch's arguments with each
            tensor as its address (read once, for the key's alignment bit too)."""
            key = [args[0].device.index]
            for a in args:
                t = type(a)
                if t is torch.Tensor or t is torch.nn.Parameter:
                    p = a.data_ptr()
                    key.append(a.dtype)
                    key.append(p & 15 == 0)
                    if ints is not None:
                        ints.append(p)
                    continue
                if ints is not None:
                    ints.append(a)
                if t is int:
                    key.append(_int_class(a))
                elif t is float:
                    key.append(1.5)
                elif a is None or t is bool:
                    key.append(a)
                else:
                    return None
            if kw:
                key.append(tuple(kw.items()))
            return tuple(key)

        def lean_hit(self, args, kw):
            """The cached compiled launch of a call made before, as ``Bound`` keeps it:
            (launch, leading arguments, trailing constexprs) as ``fast_launcher`` makes
            them, or None."""
            key = self._lean_key(args, kw)
            hit = self._lean_cache.get(key) if key is not None else None
            return hit or None

        def _lean_entry(self, compiled, args, kw):
            """(launch, leading arguments, trailing constexpr values) of a kernel just
            compiled and launched by Triton (``fast_launcher``), or False when the lean
            path must not be used for this call shape."""
            try:
                names = self.arg_names
                params = self.params
                extra = []
                for p in params[len(args) :]:
                    if not p.is_constexpr:
                        return False  # a runtime argument passed by keyword: keep Triton's binder
                    if p.name in kw:
                        extra.append(kw[p.name])
                    elif p.default is not inspect.Parameter.empty:
                        extra.append(p.default)
                    else:
                        return False
                unknown = set(kw) - set(names) - _OPTIONS
                if unknown:
                    return False
                launch, pre = fast_launcher(compiled.run, compiled.function, compiled.packed_metadata)
                return launch, pre, tuple(extra)
            except AttributeError:  # compiled kernels that look different, or none (interpreted)
                return False

        def __init__(self, fn, **kwargs):
            super().__init__(fn, **kwargs)
            self._lean_cache = {}
            self.jit_kwargs = kwargs  # (the interpreted form is built with the same)

    LeanJIT.raw_stream = staticmethod(raw_stream) if raw_stream else None
    LeanJIT.current_device = staticmethod(current_device) if current_device else None
    return LeanJIT


_LEAN_JIT = None


def _grid3(grid) -> tuple:
    """A launch grid of 1 to 3 dims as (x, y, z)."""
    return grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1


@functools.cache
def _call_params(cls) -> tuple:
    try:
        return tuple(inspect.signature(cls.__call__).parameters)
    except (TypeError, ValueError):
        return ()


# Triton 3.6's CudaLauncher.__call__: (self, gridX, gridY, gridZ, stream, function, *args),
# which allocates no scratch when the kernel needs none and calls its C ``launch``.
_LAUNCHER_CALL = ("self", "gridX", "gridY", "gridZ", "stream", "function", "args")


def fast_launcher(run, function, packed) -> tuple:
    """(launch, pre) such that ``launch(g0, g1, g2, stream, *pre, *kernel_args)`` launches a
    compiled kernel as ``run(g0, g1, g2, stream, function, packed, None, None, None,
    *kernel_args)`` does, where the kernel's tensors may be passed as their addresses
    (ints).

    Addresses are cheaper than tensors: Triton's C launcher calls each tensor's
    ``data_ptr`` and asks the driver about the pointer (cuPointerGetAttribute); an int
    goes straight in, which for a kernel with many tensor arguments (the norms' backward)
    brings a launch below torch's ``zero_`` in host time. Where ``run`` is Triton 3.6's
    CudaLauncher (known by its call signature) and the kernel needs no global or profile
    scratch, ``launch`` is the
    C launcher itself: its Python wrapper defines a closure and allocates nothing then."""
    c_launch = getattr(run, "launch", None)
    if (
        type(run).__name__ == "CudaLauncher"
        and c_launch is not None
        and _call_params(type(run)) == _LAUNCHER_CALL
        and getattr(run, "global_scratch_size", 1) == 0
        and getattr(run, "profile_scratch_size", 1) == 0
        and hasattr(run, "launch_cooperative_grid")
        and hasattr(run, "launch_pdl")
    ):
        pre = (function, run.launch_cooperative_grid, run.launch_pdl, None, None, packed, None, None, None)
        return c_launch, pre
    return run, (function, packed, None, None, None)


class Bound:
    """One launch site's kernel with its grid and constexpr / option keywords fixed: a
    per-shape launch plan's launch. ``bound(*args)`` is ``kernel[grid](*args, **kw)``; after
    its first call on a GPU it calls the compiled launcher directly, skipping the lean
    path's per-argument key (several microseconds of Python per launch).

    The caller's promise: every call passes arguments of the same types and dtypes, and
    int arguments of the same specialization class (a plan keyed on shape and dtype
    keeps it; float values may change). What may change between calls is the addresses:
    the tensors at positions ``check`` are tested for 16-byte alignment on every call
    (the fresh allocations of a launcher need no test), and a misaligned one, another
    current device, a traced call (torch.compile) or CPU tensors (the interpreter) take
    ``kernel[grid]``."""

    __slots__ = ("kernel", "grid", "kw", "check", "lean", "hit", "dev", "tensors")

    def __init__(self, kernel, grid: tuple, kw: dict, check: tuple[int, ...]):
        self.kernel, self.grid, self.kw, self.check = kernel, grid, kw, check
        # whether the kernel has a lean path at all (not with kernellab.config.triton_launch
        # "jit"): only then are alignments tested and launchers kept (compiled launches)
        self.lean = (
            _LEAN_JIT is not None
            and isinstance(kernel, _LEAN_JIT)
            and _LEAN_JIT.raw_stream is not None
            and config.triton_launch != "jit"
        )
        self.hit = None  # (launch, grid x3, leading arguments, extra) once known
        self.dev = None  # the device index the launcher was found on
        self.tensors = ()  # positions of the tensor arguments (passed to the launch as addresses)

    def __call__(self, *args):
        hit = self.hit
        if hit is not None and type(args[0]) in _REAL_TENSORS:  # (fake tensors have no address)
            a = list(args)
            for i in self.tensors:
                t = a[i]
                if type(t) not in _REAL_TENSORS:
                    break
                a[i] = t.data_ptr()
            else:
                al = 0
                for i in self.check:
                    al |= a[i]
                if not al & 15 and _LEAN_JIT.current_device() == self.dev:
                    launch, g0, g1, g2, pre, extra = hit
                    launch(g0, g1, g2, _LEAN_JIT.raw_stream(self.dev), *pre, *a, *extra)
                    return
        self.kernel[self.grid](*args, **self.kw)
        if hit is None and self.lean and type(args[0]) in _REAL_TENSORS:
            tensors = tuple(i for i, t in enumerate(args) if type(t) in _REAL_TENSORS)
            if not set(self.check) <= set(tensors):
                return  # a checked position holds no tensor: keep Triton's path
            al = 0
            for i in self.check:
                al |= args[i].data_ptr()
            if not al & 15:  # keep the launcher Triton's path just used
                found = self.kernel.lean_hit(args, self.kw)
                if found is not None:
                    launch, pre, extra = found
                    self.dev = args[0].device.index
                    self.tensors = tensors
                    self.hit = (launch, *_grid3(self.grid), pre, extra)


def jit(fn=None, **kwargs):
    """``triton.jit`` for kernellab's kernels and the @jit helpers they call: a JITFunction
    (Triton, ``triton.autotune``, ``torch.library.triton_op`` / ``wrap_triton`` and
    Inductor take it as Triton's own) whose launches with CUDA tensors compile and go
    through the lean path (with ``kernellab.config.triton_launch`` "jit": plain
    ``kernel[grid]`` launches), and whose launches with CPU tensors run the same function
    under Triton's interpreter; with the user's ``TRITON_INTERPRET=1`` every launch does,
    as with Triton's own."""
    if fn is None:
        return lambda f: jit(f, **kwargs)
    global _LEAN_JIT
    if _LEAN_JIT is None:
        _LEAN_JIT = _make_lean_jit()
    return _LEAN_JIT(fn, **kwargs)


# --------------------------------------------------------------------------- streaming blocks
#
# The programs of a streaming kernel ``k(ptrs..., n, BLOCK)`` (``launch_flat``): program p
# takes elements [p BLOCK, (p + 1) BLOCK) of every pointer. A mask ``offs < n`` keeps every
# access one element wide unless Triton knows n divisible by 16 (it cannot prove the mask
# constant over 16 bytes otherwise), so ``stream_blocks`` gives a program whose block is
# whole its offsets with no mask: BLOCK-aligned and contiguous (BLOCK a constexpr), which
# with the pointers' 16-byte alignment makes 16-byte loads and stores. Only the program
# where n ends inside its block masks.
#
# FULL is a constexpr, so the two cases are two separate code paths behind one uniform
# branch on the program id. A runtime flag tested at each load and store instead (one
# path, a branch per access) compiles to more registers for every program (sm_90, Triton
# 3.9, bf16 SwiGLU backward: 127 against 77 for the unmasked path alone). The masked path
# works in pieces of TAIL_PIECE elements (2 per thread at 8 warps): a kernel's register
# count is its costliest path's, paid by every program, and one-element accesses over a
# whole block cost far more than 16-byte ones (that kernel with a masked whole block: 149
# registers; in pieces: 64, no more than its unmasked path).
#
# Kernels import these three by name, not as ``triton_support.<name>``: under torch.compile
# Inductor launches a triton_op's kernel from source it writes out, the kernel's and that
# of each @jit function and constexpr its module's globals name; an attribute of a module
# is not followed.

TAIL_PIECE = tl.constexpr(512)


@jit
def load_block(ptr, offs, n, FULL: tl.constexpr):
    # ptr[offs]: every offset taken where FULL, else those below n (the others undefined:
    # store_block drops them).
    if FULL:
        x = tl.load(ptr + offs)
    else:
        x = tl.load(ptr + offs, mask=offs < n)
    return x


@jit
def store_block(ptr, offs, value, n, FULL: tl.constexpr):
    # ptr[offs] = value in ptr's element type: every offset where FULL, else those below n.
    value = value.to(ptr.dtype.element_ty)
    if FULL:
        tl.store(ptr + offs, value)
    else:
        tl.store(ptr + offs, value, mask=offs < n)


@jit
def stream_blocks(body, args, n, BLOCK: tl.constexpr):
    # This program's block of n elements, as ``body(args, offs, n, FULL)`` calls (body: a
    # @jit function; args: a tuple of its pointers and constexprs): one call with the whole
    # block's offsets and FULL true, or for the block n ends in, calls of TAIL_PIECE offsets
    # each with FULL false. Offsets int64: n may exceed 2^31.
    start = tl.program_id(0).to(tl.int64) * BLOCK
    if start + BLOCK <= n:
        body(args, start + tl.arange(0, BLOCK), n, True)
    else:
        PIECE: tl.constexpr = min(BLOCK, TAIL_PIECE)
        for i in range(0, BLOCK // PIECE):
            body(args, start + i * PIECE + tl.arange(0, PIECE), n, False)


_LEAN_MISSES: dict[str, str] = {}  # kernel name -> why launch_tuned could not go lean


PLANS_MAX = 1024  # ever-new shapes (varying lengths) rebuild plans, never grow without bound


def kept_plan(plans: dict, key, make):
    """A launch plan: ``plans[key]``, made by ``make()`` at the key's first call (the cache
    is emptied when it holds PLANS_MAX). None as the key (traced calls: fake tensors,
    symbolic shapes, which are not even hashable) makes one and keeps none."""
    if key is None:
        return make()
    plan = plans.get(key)
    if plan is None:
        if len(plans) >= PLANS_MAX:
            plans.clear()
        plan = plans[key] = make()
    return plan


def _tuned_key(tuner, args, kw) -> tuple[dict, tuple]:
    """launch_tuned's cache of ``tuner`` and the key of a call in it."""
    state = tuner.__dict__.get("_kl_lean")
    if state is None:
        names = list(tuner.arg_names)
        idx = tuple(names.index(k) for k in tuner.keys if k in names)
        state = tuner._kl_lean = (idx, {})
    idx, cache = state
    n = len(args)
    key = tuple(args[i] for i in idx if i < n)  # key arguments passed by keyword: in kw below
    key += tuple(a.dtype for a in args if isinstance(a, torch.Tensor))
    if kw:
        key += tuple(kw.items())
    return cache, key


class TunedBound:
    """``Bound`` for a ``triton.autotune`` kernel (``launch_tuned``'s): the first call goes
    through launch_tuned (which tunes where it must); once launch_tuned knows the config
    for the call shape, the launch is a ``Bound`` of the inner kernel with that config's
    grid and keywords. The promise is Bound's: every call passes arguments of the same
    types, dtypes, int classes and key values (a launch plan keyed on shape, strides,
    dtypes and options keeps it)."""

    __slots__ = ("tuner", "grid", "kw", "check", "bound")

    def __init__(self, tuner, grid, kw: dict, check: tuple[int, ...]):
        self.tuner, self.grid, self.kw, self.check = tuner, grid, kw, check
        self.bound = None

    def __call__(self, *args):
        b = self.bound
        if b is not None:
            return b(*args)
        launch_tuned(self.tuner, self.grid, *args, **self.kw)
        if type(args[0]) in _REAL_TENSORS and not device.triton_interpreted(args[0]):
            cache, key = _tuned_key(self.tuner, args, self.kw)
            cfg = cache.get(key)
            if cfg:  # (False: this call shape cannot go lean; None: not cached)
                grid = self.grid(cfg) if callable(self.grid) else self.grid
                self.bound = Bound(self.tuner.fn, tuple(grid), cfg, self.check)


# --------------------------------------------------------------------------- autotuning off
#
# A correctness check calls each kernel at dozens of small, odd shapes; an autotuner that
# compiles and times every candidate config at each new key turns a minute of checking into
# many (on a GPU every candidate is a compile of about a second, and the timing runs on top).
# Inside ``no_autotune()`` every autotuned launcher of kernellab (those that go through
# ``launch_tuned`` / ``TunedBound``) takes a config without timing any: the one already
# tuned for the key if there is one, else the first config the tuner's own pruning keeps
# (``first_config``); and it writes nothing into the tuner's cache, so a later tuned call
# at the same key still tunes. ``kernellab check`` runs under it.
#
# Process-wide (a depth counter under a lock), not a context variable: autograd runs a CUDA
# backward on its own worker thread, which does not see the caller's context variables,
# and the backward kernels are autotuned too.

_NO_TUNE_LOCK = threading.Lock()
_no_tune_depth = 0


@contextlib.contextmanager
def no_autotune():
    """Within this block no kernellab Triton launcher autotunes (see above). Nests."""
    global _no_tune_depth
    with _NO_TUNE_LOCK:
        _no_tune_depth += 1
    try:
        yield
    finally:
        with _NO_TUNE_LOCK:
            _no_tune_depth -= 1


def autotune_allowed() -> bool:
    """False inside ``no_autotune()``: launchers with their own tuning rule ask this."""
    return _no_tune_depth == 0


def first_config(tuner, args, kw) -> dict:
    """The keywords (constexprs and launch options, ``kw`` included) of the first config of
    ``tuner`` (a ``triton.autotune`` kernel) that its pruning keeps for this call: what it
    would launch if it had only that one. Nothing is compiled or timed."""
    configs = list(tuner.configs)
    prune = getattr(tuner, "early_config_prune", None)
    if prune is not None and len(configs) > 1:
        configs = prune(configs, dict(zip(tuner.arg_names, args)), **kw) or configs
    cfg = configs[0]
    if getattr(cfg, "pre_hook", None) is not None:
        cfg.pre_hook({**dict(zip(tuner.arg_names, args)), **kw, **cfg.all_kwargs()})
    return {**kw, **cfg.all_kwargs()}


def _launch_untuned(tuner, grid, args, kw):
    """launch_tuned inside ``no_autotune()``: the key's tuned config if the tuner already
    holds one, else ``first_config``; the tuner's cache is left as it was."""
    cache, key = _tuned_key(tuner, args, kw)
    cfg = cache.get(key) or first_config(tuner, args, kw)
    return tuner.fn[grid(cfg) if callable(grid) else grid](*args, **cfg)


def with_defaults(fn, args, kw: dict, given=()) -> dict:
    """``kw`` and the default of every parameter of ``fn`` (a JITFunction) that ``args``
    (positionally), ``kw`` and ``given`` leave out. A traced launch (``wrap_triton``) fills
    no defaults, and torch reads which tensors a kernel writes from its TTIR, built from
    every parameter: with one missing it takes every input as written."""
    named = set(kw).union(given)
    extra = {p.name: p.default for p in fn.params[len(args) :] if p.has_default and p.name not in named}
    return {**kw, **extra} if extra else kw


def launch_tuned(tuner, grid, *args, **kw):
    """``tuner[grid](*args, **kw)`` for a ``triton.autotune`` kernel whose inner function is
    a ``jit`` (lean) kernel: once the autotuner has picked a config for this call's key (the
    values of its key arguments, every tensor's dtype and the constexprs passed), the
    config's kernel is launched through the lean path directly. Triton's Autotuner.run
    builds argument dicts and its key on every call before Triton's own launcher runs
    (tens of microseconds a launch, three launches per attention backward)."""
    a0 = args[0]
    if _no_tune_depth and type(a0) in _REAL_TENSORS:
        return _launch_untuned(tuner, grid, args, kw)
    if type(a0) not in _REAL_TENSORS:  # traced (a triton_op under torch.compile)
        from torch.library import wrap_triton

        tuned = {k for c in tuner.configs for k in c.kwargs}  # (the configs give these)
        return wrap_triton(tuner)[grid](*args, **with_defaults(tuner.fn, args, kw, tuned))
    if device.triton_interpreted(a0):
        return tuner[grid](*args, **kw)
    fn = tuner.fn
    cache, key = _tuned_key(tuner, args, kw)
    cfg = cache.get(key)
    if cfg is None:
        out = tuner[grid](*args, **kw)
        best = getattr(tuner, "best_config", None)
        why = (
            "inner kernel is not triton_support.jit"
            if _LEAN_JIT is None or not isinstance(fn, _LEAN_JIT)
            else "no best_config"
            if best is None
            else "config has a pre_hook"
            if getattr(best, "pre_hook", None) is not None
            else None
        )
        cache[key] = {**kw, **best.all_kwargs()} if why is None else False
        if why is not None:
            _LEAN_MISSES[getattr(fn, "__name__", repr(fn))] = why
        return out
    if cfg is False:
        return tuner[grid](*args, **kw)
    return fn[grid(cfg) if callable(grid) else grid](*args, **cfg)


# --------------------------------------------------------------------------- interpreter bf16
#
# Triton's CPU interpreter converts fp32 -> bf16 by truncation (toward zero) and mishandles
# subnormals both ways (1.0 - 1e-7 stores as 0.99609375; a bf16 subnormal round trip
# through fp32 changes it), where the GPU's cvt.rn rounds to nearest even. Kernels run
# under it then disagree with themselves on a GPU by up to one bf16 unit, and with the
# check's references on degenerate inputs (attention's output of a constant V came out one
# unit below V, and dq, which should cancel to 0, came out 0.013: a failure on 4 of 20
# seeds). Under the interpreter, kernellab replaces the interpreter's bf16 <-> fp32
# conversion with the exact one (round to nearest even, NaN kept quiet, subnormals exact);
# other conversions and explicit rounding modes are left to Triton.


def _bf16_from_f32(data):
    import numpy as np

    bits = np.ascontiguousarray(data, dtype=np.float32).view(np.uint32)
    rounded = ((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(
        np.uint16
    )
    nan = np.isnan(data)
    if nan.any():
        rounded = np.where(nan, ((bits >> np.uint32(16)) | np.uint32(0x40)).astype(np.uint16), rounded)
    return rounded


def _f32_from_bf16(data):
    import numpy as np

    return (np.ascontiguousarray(data).view(np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def _patch_interpreter_bf16() -> bool:
    """Install the exact bf16 <-> fp32 conversion in Triton's interpreter (see above);
    False when this Triton's interpreter does not look as expected (left alone)."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter as interp
    except Exception:  # noqa: BLE001 - no Triton: nothing to patch
        return False
    builder = getattr(interp, "InterpreterBuilder", None)
    handle = getattr(interp, "TensorHandle", None)
    if builder is None or handle is None or not hasattr(builder, "cast_impl"):
        return False
    if getattr(builder, "_kl_bf16_exact", False):
        return True
    cast_impl, fp_to_fp = builder.cast_impl, builder.create_fp_to_fp

    def convert(src, dst_type):
        s, d = src.dtype.scalar, dst_type.scalar
        if s == tl.float32 and d == tl.bfloat16:
            return handle(_bf16_from_f32(src.data), d)
        if s == tl.bfloat16 and d == tl.float32:
            return handle(_f32_from_bf16(src.data), d)
        return None

    def exact_cast(self, src, dst_type):
        out = convert(src, dst_type)
        return out if out is not None else cast_impl(self, src, dst_type)

    def exact_fp_to_fp(self, src, dst_type, rounding_mode):
        mode = str(rounding_mode).lower() if rounding_mode is not None else ""
        out = None if mode and "rtne" not in mode else convert(src, dst_type)
        return out if out is not None else fp_to_fp(self, src, dst_type, rounding_mode)

    builder.cast_impl = exact_cast  # create_fp_ext / create_fp_trunc / ... call self.cast_impl
    builder.create_fp_to_fp = exact_fp_to_fp
    builder._kl_bf16_exact = True
    return True


# --------------------------------------------------------------------------- interpreter tl.reduce
#
# Triton's interpreter applies a custom tl.reduce combine function (not sum / max / min /
# argmax, which it hands to NumPy) one element at a time in Python, ~0.1-0.3 ms each:
# seconds for one 8192-wide row of the softmax backward's compensated (hi, lo) dot.
# Installed here: the combine applied to whole arrays, neighbours paired level by level (a
# tree, as a GPU reduces across threads). Left operands stay left, so an associative combine
# that is not commutative (an argmin's tie break) gives the interpreter's answer; a
# floating-point one is rounded in tree order instead of left to right.


def _tree_reduce(self, input):
    """ReduceOps.generic_reduce over whole arrays (see above)."""
    import numpy as np
    import triton.language as tl

    if input[0].handle.data.size == 0:
        return _generic_reduce(self, input)
    original_axis = self.axis
    input, axis = self.unravel(input, self.axis)
    datas = [np.moveaxis(arg.handle.data, axis, -1) for arg in input]
    dtypes = [arg.dtype for arg in input]
    while datas[0].shape[-1] > 1:
        n = datas[0].shape[-1]
        h = n // 2
        # elements 0, 2, 4, ... (left operands) and 1, 3, 5, ... (right), every input
        halves = [
            self.to_tensor(np.ascontiguousarray(d[..., i : 2 * h : 2]), t)
            for i in (0, 1)
            for d, t in zip(datas, dtypes)
        ]
        ret = self.combine_fn.fn(*halves)
        ret = ret if isinstance(ret, tuple) else (ret,)
        shape = datas[0].shape[:-1] + (h,)
        out = []
        for r, d in zip(ret, datas):
            v = r.handle.data if isinstance(r, tl.core.tensor) else r
            out.append(np.broadcast_to(np.asarray(v, dtype=d.dtype), shape))
        if n % 2:  # the odd one out is the rightmost: it joins at the next level
            out = [np.concatenate([o, d[..., -1:]], axis=-1) for o, d in zip(out, datas)]
        datas = out
    results = []
    for d, t in zip(datas, dtypes):
        data = np.ascontiguousarray(d[..., 0])
        if self.keep_dims:
            if original_axis is not None:
                data = np.expand_dims(data, axis)
            else:
                data = data.reshape((1,) * input[0].handle.data.ndim)
        elif original_axis is None:
            data = data.item()
        results.append(self.to_tensor(data, t))
    return results


_generic_reduce = None


def _patch_interpreter_reduce() -> bool:
    """Install ``_tree_reduce`` as the interpreter's generic reduce; False when this
    Triton's interpreter does not look as expected (left alone)."""
    global _generic_reduce
    try:
        from triton.runtime import interpreter as interp
    except Exception:  # noqa: BLE001 - no Triton: nothing to patch
        return False
    ops = getattr(interp, "ReduceOps", None)
    if ops is None or not all(hasattr(ops, a) for a in ("generic_reduce", "unravel", "to_tensor")):
        return False
    if getattr(ops, "_kl_tree", False):
        return True
    _generic_reduce = ops.generic_reduce
    ops.generic_reduce = _tree_reduce
    ops._kl_tree = True
    return True


# --------------------------------------------------------------------------- interpreter per call
#
# ``jit``'s kernels send a launch with CPU tensors to Triton's interpreter: an
# ``InterpretedFunction`` of the same Python function (``_interpreted``). Inside it every
# @jit function the kernel calls must run interpreted as well: kernellab's helpers and
# Triton's own library functions (tl.sum, tl.cdiv, ...), all JITFunctions, whose
# ``__call__`` raises outside a compiled kernel. So while an interpreted launch runs
# (``interpreting``), ``JITFunction.__call__`` calls the function's interpreted form, the
# way Triton's interpreter itself swaps triton.language's builtins for the length of a
# launch; both are put back when it ends. Interpreted launches take a lock: those swaps are
# process-wide.

_INTERP_LOCK = threading.RLock()


def _interprets(args, kwargs) -> bool:
    """Whether a launch runs under the interpreter: its first tensor argument (or a tensor
    descriptor's) is off a CUDA device, or the user set TRITON_INTERPRET; with no tensor,
    as this machine's default device."""
    if args and type(args[0]) in _REAL_TENSORS:  # (the common launch: a tensor first)
        return device.triton_interpreted(args[0])
    for a in itertools.chain(args, kwargs.values()):
        if not isinstance(a, torch.Tensor):
            a = getattr(a, "base", None)  # a host-side tensor descriptor
            if not isinstance(a, torch.Tensor):
                continue
        return device.triton_interpreted(a)
    return device.triton_interpreted()


def _interpreted(jit_fn):
    """The InterpretedFunction of a JITFunction (made once and kept on it), built as ``jit``
    built it."""
    made = jit_fn.__dict__.get("_kl_interpreted")
    if made is None:
        from triton.runtime.interpreter import InterpretedFunction

        _patch_interpreter_bf16()  # (before any interpreted launch; a no-op once installed)
        _patch_interpreter_reduce()
        made = InterpretedFunction(jit_fn.fn, **getattr(jit_fn, "jit_kwargs", {}))
        made.pre_run_hooks = getattr(jit_fn, "pre_run_hooks", made.pre_run_hooks)
        jit_fn.__dict__["_kl_interpreted"] = made
    return made


def _call_interpreted(self, *args, **kwargs):
    """``JITFunction.__call__`` during an interpreted launch: a @jit function called from
    the kernel. As ``InterpretedFunction.__call__``, except that the language patches made
    for the callee's module (Triton's library functions see ``triton.language.core``, not
    ``triton.language``) are undone when it returns: none outlives the launch."""
    from triton.runtime.interpreter import _patch_lang

    fn = _interpreted(self)
    scope = _patch_lang(fn.fn)
    try:
        return fn.rewrite()(*args, **kwargs)
    finally:
        if scope is not None:
            scope.restore()


@contextlib.contextmanager
def interpreting():
    """The scope of an interpreted launch (see above): @jit functions called inside run
    interpreted, other threads' interpreted launches wait. A nested launch puts back what
    it found, so the outermost one restores Triton's own ``__call__``."""
    from triton.runtime.jit import JITFunction

    with _INTERP_LOCK:
        outer = JITFunction.__dict__["__call__"]
        JITFunction.__call__ = _call_interpreted
        try:
            yield
        finally:
            JITFunction.__call__ = outer


def install_tma_allocator() -> None:
    """Give Triton a torch-backed scratch allocator for device-side descriptors, unless the
    caller already set one.

    Triton keeps the allocator in a ``contextvars.ContextVar`` (3.5+; a plain module global
    before): a value set in one thread is invisible in another, and autograd runs the
    backward pass of CUDA tensors in its own worker thread. So this runs before every TMA
    launch (one ContextVar lookup) instead of once per process: it installs ours only where
    the current context still holds Triton's ``NullAllocator`` and never replaces an
    allocator the user set. (With a once-per-process install the forward launches and
    the backward in autograd's thread raises "no allocator was set".)
    """
    import triton

    try:
        from triton.runtime import _allocation

        current = _allocation._allocator
        current = current.get() if hasattr(current, "get") else current
        unset = isinstance(current, _allocation.NullAllocator)
    except (ImportError, AttributeError):  # a Triton whose internals moved: cannot tell
        unset = True
    if unset:
        triton.set_allocator(torch_scratch_alloc)


def torch_scratch_alloc(size: int, alignment: int, stream):
    # torch's caching allocator returns 512-byte aligned blocks (TMA descriptors need 64 B);
    # the stream is the current torch stream, where the launch happens.
    return torch.empty(size, dtype=torch.int8, device="cuda")
