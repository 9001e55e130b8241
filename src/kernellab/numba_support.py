"""Numba's CUDA dialect (``numba.cuda.jit``) as a kernellab backend: where it runs, how a
torch tensor reaches a kernel, and how a backend joins the registry.

Numba is optional and imported at the first use, never at kernellab's import: importing
``numba.cuda`` costs about half a second, and it is the import that fixes, for the whole
process, whether Numba compiles for the GPU or simulates CUDA on the host. The simulator
is Numba's own switch, the environment variable ``NUMBA_ENABLE_CUDASIM=1`` read by Numba
when ``numba.cuda`` is first imported; kernellab reads the result through Numba's config
at call time.

Where a Numba backend runs:

- a GPU machine: CUDA tensors, compiled by Numba (NVVM), launched on torch's current
  stream. Zero copy: ``numba.cuda.as_cuda_array`` wraps the tensor's memory through
  ``__cuda_array_interface__``.
- a machine without a GPU, with the simulator on: CPU tensors, as NumPy views of the same
  memory. The simulator runs every CUDA thread as a Python thread, a block at a time, so
  it proves indexing, masking and barriers on tiny shapes, not speed (1000 elements take
  ~50 ms). Launchers use 32-thread blocks there: the same code paths, 8x fewer threads.
- without a GPU and without the simulator: nowhere ("no GPU"); ``kernellab check`` then
  compiles the kernels to PTX for sm_80 and sm_90 ("compiled, not run": NVVM runs on the
  CPU).

dtypes: fp32 and fp16 (math in fp32). Numba has no bfloat16 array type, so bf16 tensors
are refused with a TypeError naming the argument (the Impl declares its dtypes, so check
and bench skip bf16 cleanly).

Kernel naming contract (what ``Kernels`` and ``kernellab asm`` read): every array argument
is C-contiguous, of one ndim per op (1: elementwise, 2: rows); backend ``numba_vN`` owns the
kernels whose name ends in ``_vN``; ``numba`` runs the ``best`` variant.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import time
import warnings

import torch

from kernellab import device as _device
from kernellab.core.spec import check_dtype

DTYPES = (torch.float32, torch.float16)
CHECK_ARCHS = ("sm_80", "sm_90")
# Threads per block on a GPU; the simulator's 32 (module docstring).
THREADS = 256
SIM_THREADS = 32


@functools.cache
def numpy_compat() -> None:
    """numba-cuda 0.30 registers its overload of ``np.row_stack`` when it first compiles a
    kernel, and fails there (AttributeError) under a NumPy that no longer has that name
    (an alias of ``np.vstack`` since NumPy 2.0, seen removed on the GPU machine). Restore the
    alias before the first compile; a NumPy that has it is left alone. Every kernel module
    calls this before it imports numba."""
    import numpy as np

    if not hasattr(np, "row_stack"):
        np.row_stack = np.vstack


@functools.cache
def _numba_cuda():
    """``numba.cuda`` (real or simulated, as Numba decided at this first import)."""
    numpy_compat()
    from numba import cuda

    # Small grids are deliberate at tiny shapes: no occupancy warning on every such launch.
    warnings.filterwarnings("ignore", message=r"Grid size \d+ will likely result in GPU under-utilization")
    return cuda


def cuda():
    """The ``numba.cuda`` module (imported on first call)."""
    return _numba_cuda()


@functools.cache
def _import_error() -> str | None:
    try:
        _numba_cuda()
    except Exception as e:  # noqa: BLE001 - any import failure means "cannot run here"
        if isinstance(e, ModuleNotFoundError) and e.name and e.name.split(".")[0] == "numba":
            return "numba not installed (pip install numba numba-cuda)"
        return f"numba.cuda does not import: {type(e).__name__}: {str(e).splitlines()[0][:120]}"
    return None


def simulating() -> bool:
    """Whether ``numba.cuda`` is Numba's CUDA simulator in this process (its config, read at
    call time; the import of ``numba.cuda`` is what settles it)."""
    if _import_error() is not None:
        return False
    nc = _numba_cuda()
    cfg = getattr(nc, "config", None)  # numba-cuda's own config; Numba's before the split
    if cfg is None or not hasattr(cfg, "ENABLE_CUDASIM"):
        from numba import config as cfg
    return bool(cfg.ENABLE_CUDASIM)


def devices() -> tuple[str, ...]:
    """Where Numba backends take tensors: CUDA tensors on a GPU machine; without a GPU, CPU
    tensors too, under the simulator (``unavailable`` says "no GPU" while it is off)."""
    return ("cuda",) if _device.has_cuda() else ("cuda", "cpu")


@functools.cache
def unavailable() -> str | None:
    """None where the Numba backends run, else why not (module docstring)."""
    why = _import_error()
    if why is not None:
        return why
    if _device.has_cuda():
        if simulating():
            return "Numba's CUDA simulator is on (NUMBA_ENABLE_CUDASIM): it takes CPU tensors, not CUDA ones"
        if not _numba_cuda().is_available():
            return "numba.cuda sees no usable GPU (driver or NVVM missing)"
        return None
    # Without a GPU: "no GPU" exactly, so check and list report the compile-only state.
    return None if simulating() else "no GPU"


def refuse(op: str, **tensors) -> None:
    """Before any launch: a TypeError naming the argument for a dtype Numba kernels do not
    take (bf16), a ValueError for a CPU tensor while the simulator is off (the registry lets
    CPU tensors through on a machine without a GPU, where the simulator may be on)."""
    for name, t in tensors.items():
        check_dtype(f"{op} (numba)", name, t, DTYPES)
        if not t.is_cuda and not simulating():
            raise ValueError(
                f"{op} (numba): {name} is on {t.device}; CPU tensors run only under Numba's CUDA "
                "simulator (NUMBA_ENABLE_CUDASIM=1 before numba is first imported)"
            )


# --------------------------------------------------------------------------- arrays and launches

_streams: dict = {}  # (device index, CUstream handle) -> numba external stream


def as_array(t: torch.Tensor):
    """``t`` (contiguous) as a kernel argument without a copy: a Numba device array over
    the CUDA tensor's memory, or under the simulator a NumPy view of the CPU tensor."""
    if t.is_cuda:
        return _numba_cuda().as_cuda_array(t.detach(), sync=False)
    return t.detach().numpy()


def _stream(t: torch.Tensor):
    """torch's current stream on ``t``'s device, as a Numba stream (cached: creating one costs
    host time on every launch otherwise)."""
    handle = torch.cuda.current_stream(t.device).cuda_stream
    key = (t.device.index, handle)
    s = _streams.get(key)
    if s is None:
        s = _streams[key] = _numba_cuda().external_stream(handle)
    return s


def launch(kernel, grid: int, block: int, out: torch.Tensor, *tensors: torch.Tensor) -> None:
    """``kernel[grid, block, stream](*arrays)`` with every tensor wrapped without a copy; on a
    GPU on torch's current stream of ``out``'s device (so it orders with torch's own work and
    never synchronizes), in that device's context."""
    if not out.is_cuda:
        kernel[grid, block](*(as_array(t) for t in tensors))
        return
    dev = out.device.index or 0
    nc = _numba_cuda()
    if dev == 0:
        kernel[grid, block, _stream(out)](*(as_array(t) for t in tensors))
        return
    with nc.gpus[dev]:
        kernel[grid, block, _stream(out)](*(as_array(t) for t in tensors))


def threads(t: torch.Tensor) -> int:
    """Threads per block for a launch on ``t``: THREADS on a GPU, SIM_THREADS simulated."""
    return THREADS if t.is_cuda else SIM_THREADS


def resident_blocks(t: torch.Tensor, block: int) -> int:
    """Blocks that fill the device once at full occupancy (2048 threads per SM on
    Ampere/Hopper): the grid of a grid-stride loop. Simulated: 2 (the loop still turns)."""
    if not t.is_cuda:
        return 2
    from kernellab.cuda.runtime import sm_count

    return sm_count(t.device.index or 0) * (2048 // block)


# --------------------------------------------------------------------------- kernels of an op


_NUMBA_TYPES = {"fp32": "float32", "fp16": "float16"}


class Kernels:
    """The Numba kernels of one op: ``module`` (a dotted name) defines them with
    ``numba.cuda.jit`` and is imported at the first launch, ``ndim`` is the rank of every
    array argument (naming contract: module docstring), ``best`` the variant ``numba`` runs.
    Also what ``kernellab asm`` and the compile-only check read (PTX through NVVM, no GPU)."""

    def __init__(self, module: str, ndim: int, best: int):
        self.module, self.ndim, self.best = module, ndim, best
        self.label = f"{module} (Numba)"

    def get(self, name: str):
        """The ``numba.cuda.jit`` kernel ``name`` (imports the module the first time)."""
        return getattr(importlib.import_module(self.module), name)

    def names(self, backend: str) -> list[str]:
        """Kernels ``backend`` runs, in definition order."""
        variant = self.best if backend == "numba" else int(backend.removeprefix("numba_v"))
        mod = importlib.import_module(self.module)
        return [n for n, obj in vars(mod).items() if n.endswith(f"_v{variant}") and hasattr(obj, "py_func")]

    def ptx(self, arch: str, backend: str, dtype: str = "fp32") -> dict[str, str]:
        """PTX of each of ``backend``'s kernels for ``arch`` (e.g. sm_90) and ``dtype``: every
        array argument C-contiguous of that dtype. Needs Numba's real CUDA target (not the
        simulator) and NVVM, not a GPU."""
        if _import_error() is not None:
            raise RuntimeError(_import_error())
        if simulating():
            raise RuntimeError("Numba's CUDA simulator is on: it compiles nothing to PTX")
        import numba

        nc = _numba_cuda()
        elem = getattr(numba.types, _NUMBA_TYPES[dtype])
        arr = elem[(slice(None),) * (self.ndim - 1) + (slice(None, None, 1),)]  # C-contiguous
        digits = arch.removeprefix("sm_").rstrip("af")  # sm_90a: Numba targets sm_90
        cc = (int(digits[:-1]), int(digits[-1]))
        out = {}
        for name in self.names(backend):
            py = self.get(name).py_func
            sig = tuple(arr for _ in inspect.signature(py).parameters)
            out[name] = nc.compile_ptx(py, sig, cc=cc)[0]
        return out

    def precompile(self, archs=CHECK_ARCHS) -> list[str]:
        """Compile every kernel to PTX for ``archs`` (fp32); one line per arch."""
        lines = []
        for arch in archs:
            t0 = time.perf_counter()
            n = sum(len(self.ptx(arch, f"numba_v{v}")) for v in range(1, self.best + 1))
            ms = (time.perf_counter() - t0) * 1e3
            lines.append(f"{self.label}: {arch} PTX of {n} kernels ({ms:.0f} ms)")
        return lines

    def asm_report(self, arch: str, backend: str, dtype: str, kernel_regex: str | None = None):
        """``(list of inspect.asm.KernelAsm, note)`` for ``kernellab asm``: PTX only (Numba
        builds the cubin at the first launch on a GPU; ``kernel.inspect_sass`` reads it there)."""
        import re

        from kernellab.inspect.asm import KernelAsm, count_instructions

        if dtype not in _NUMBA_TYPES:
            return [], f"Numba has no {dtype} arrays (its backends take {', '.join(_NUMBA_TYPES)})"
        rx = re.compile(kernel_regex) if kernel_regex else None
        out = []
        for name, ptx in self.ptx(arch, backend, dtype).items():
            if rx is None or rx.search(name):
                out.append(KernelAsm(f"{name}[{dtype}]", counts=count_instructions(ptx, ""), ptx=ptx))
        return out, "PTX only: Numba compiles through NVVM; the cubin is built at the first launch on a GPU"


def register(op: str, backend: str, fn, kernels: Kernels, description: str) -> None:
    """Register ``fn`` (a kit-built callable with ``.custom_ops``) as built-in ``backend`` of
    ``op``: devices and availability as above, fp32/fp16, ``kernels`` for asm and the
    compile-only check."""
    from kernellab.core.registry import register as _register

    _register(
        op,
        backend,
        devices=devices(),
        available=unavailable,
        precompile=kernels.precompile,
        custom_ops=getattr(fn, "custom_ops", ()),
        builtin=True,
        description=description,
        dtypes=DTYPES,
        module=kernels,
    )(fn)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


__all__ = [
    "DTYPES",
    "Kernels",
    "as_array",
    "cdiv",
    "cuda",
    "devices",
    "launch",
    "refuse",
    "register",
    "resident_blocks",
    "simulating",
    "threads",
    "unavailable",
]
