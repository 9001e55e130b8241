"""NVRTC runtime: compile .cu sources at first use, cache cubins on disk, launch on
torch's current stream.

Compile: ``cuda.core.Program`` (NVRTC) -> cubin for the device's exact arch, cached in
``~/.cache/kernellab/cuda/<sha256>.cubin`` keyed by source (with the headers it
includes), arch, options and NVRTC version. A compile takes ~0.05-0.1 s per module.

Launch: a naive ``cuda.core.launch`` costs about twice the host time per call of a
torch elementwise op. The cost is argument boxing and stream/config objects built per
call. Here each kernel keeps its parameter buffer (ctypes slots and the ``void**``
array pointing at them) and calls ``cuLaunchKernel`` from the driver directly; per call
we only store the new values into the slots. ``kernellab.config.cuda_launch`` "core" switches to
``cuda.core.launch`` (kept for comparison and as a fallback). Thread-block clusters
(sm_90+) launch through ``Kernel.launch_cluster`` (cuLaunchKernelEx with the cluster
dimension attribute, its structs kept per kernel the same way).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import re
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from kernellab.options import config

HERE = Path(__file__).resolve().parent
DEFAULT_OPTIONS = ("-std=c++17",)
# CI proves every kernel compiles for these (A100 and H100/H200).
CHECK_ARCHS = ("sm_80", "sm_90")


class CudaError(RuntimeError):
    pass


# --------------------------------------------------------------------------- NVRTC


@functools.cache
def nvrtc_unavailable() -> str | None:
    """None when NVRTC and the CUDA headers can be used, else why not."""
    try:
        from cuda.core import Program, ProgramOptions  # noqa: F401
    except Exception as e:  # ImportError, or a broken install
        return f"cuda-python (cuda.core) not importable: {e}"
    try:
        from cuda.bindings import nvrtc

        err, major, minor = nvrtc.nvrtcVersion()
        if int(err) != 0:
            return f"NVRTC not loadable (error {err})"
    except Exception as e:
        return f"NVRTC not loadable: {e}"
    if not include_dirs():
        return "CUDA headers not found (pip install nvidia-cuda-runtime)"
    return None


def capability_unavailable(need: tuple[int, int], what: str, exact: bool = False) -> str | None:
    """Why NVRTC-built kernels that need compute capability ``need`` (``exact``: that one
    only, else it or newer) cannot run here, or None: None also without a GPU (the check
    then reports "compiled, not run"). ``what`` names the need in the message."""
    why = nvrtc_unavailable()
    if why or not torch.cuda.is_available():
        return why
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) != need if exact else (major, minor) < need:
        return f"needs {what}; this GPU is sm_{major}{minor}"
    return None


def sm90_unavailable() -> str | None:
    """For kernels built for sm_90a (wgmma, setmaxnreg, TMA): an sm_90a cubin runs on sm_90
    only."""
    return capability_unavailable((9, 0), "sm_90 (Hopper wgmma)", exact=True)


@functools.cache
def nvrtc_version() -> str:
    from cuda.bindings import nvrtc

    _, major, minor = nvrtc.nvrtcVersion()
    return f"{major}.{minor}"


@functools.cache
def include_dirs() -> tuple[str, ...]:
    """Where cuda_fp16.h & co live: the pip package first, then a CUDA toolkit."""
    found = []
    try:
        import cuda.pathfinder as pf

        d = pf.find_nvidia_header_directory("cudart")
        if d:
            found.append(str(d))
    except Exception:
        pass
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and os.path.exists(os.path.join(root, "include", "cuda_fp16.h")):
            found.append(os.path.join(root, "include"))
    return tuple(dict.fromkeys(found))


def _expand_local_includes(source: str, base: Path, seen=None) -> str:
    """Text of source with our own ``#include "x.cuh"`` files inlined, for the cache key."""
    seen = seen if seen is not None else set()
    out = [source]
    for name in re.findall(r'#include\s+"([^"]+)"', source):
        for d in (base, HERE):
            p = d / name
            if p.exists() and p not in seen:
                seen.add(p)
                out.append(_expand_local_includes(p.read_text(), p.parent, seen))
                break
    return "\n".join(out)


def _cache_base(key: str) -> Path:
    """The disk cache's path of build ``key`` without a suffix (its files: .cubin, .ptx, .log)."""
    from kernellab.device import cache_dir

    d = cache_dir() / "cuda"
    d.mkdir(parents=True, exist_ok=True)
    return d / key


TARGETS = ("cubin", "ptx", "log")


def compile_source(
    source: str,
    arch: str,
    *,
    options: Sequence[str] = (),
    base_dir: Path | None = None,
    target: str = "cubin",
    name: str = "kernellab",
    use_cache: bool = True,
) -> bytes:
    """Compile CUDA C++ ``source`` with NVRTC for ``arch`` ("sm_90"); returns ``target``:
    the cubin, the PTX text, or NVRTC's log with ptxas's verbose report (registers, spills,
    warnings) as bytes. One NVRTC compile gives all three, and all three are cached on disk
    together: asking for the PTX of a build whose cubin was made compiles nothing. Raises
    CudaError with the NVRTC log."""
    if target not in TARGETS:
        raise ValueError(f"target must be one of {TARGETS}, got {target!r}")
    reason = nvrtc_unavailable()
    if reason:
        raise CudaError(f"cannot compile {name}: {reason}")
    base_dir = base_dir or HERE
    opts = tuple(DEFAULT_OPTIONS) + tuple(options)
    full = _expand_local_includes(source, base_dir)
    key = hashlib.sha256("\0".join([full, arch, " ".join(opts), nvrtc_version()]).encode()).hexdigest()[:32]
    base = _cache_base(key)
    path = base.with_suffix("." + target)
    if use_cache and path.exists():
        return path.read_bytes()
    include = [str(base_dir), str(HERE), *include_dirs()]
    outputs = _nvrtc_compile(source, name, arch, _option_bytes(opts, arch, include))
    if target not in outputs:
        raise CudaError(f"{name}: NVRTC gives no {target} for {arch} (a cubin needs a real arch, sm_XX)")
    for t, code in outputs.items():
        dest = base.with_suffix("." + t)
        tmp = dest.with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes(code)
        os.replace(tmp, dest)  # atomic: concurrent processes never read half a file
    return outputs[target]


def _option_bytes(opts: Sequence[str], arch: str, include_path: list[str]) -> list[bytes]:
    """NVRTC's command line for ``opts`` (the few flags the modules use), ``arch`` and the
    include directories, with ptxas's verbose report in the log."""
    out = [f"--gpu-architecture={arch}".encode(), b"--ptxas-options=-v"]
    for o in opts:
        if o in ("-std=c++17", "--use_fast_math", "-lineinfo") or o.startswith(("-maxrregcount=", "-D")):
            out.append(o.encode())
        else:
            raise ValueError(f"compile option {o!r} is not supported")
    return out + [f"-I{d}".encode() for d in include_path]


def _nvrtc_compile(source: str, name: str, arch: str, option_bytes: list[bytes]) -> dict[str, bytes]:
    """One NVRTC compile: {"ptx", "log"} and, for a real arch (sm_XX), "cubin". Raises
    CudaError with the log when it fails."""
    from cuda.bindings import nvrtc

    def read(get_size, get, strip=True):
        _, size = get_size(prog)
        buf = bytearray(size)  # (never an immutable bytes: b" " * 1 is CPython's shared b" ")
        get(prog, buf)
        out = bytes(buf)
        return out.rstrip(b"\0") if strip else out  # text ends in a NUL; a cubin is binary

    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], [])
    try:
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(option_bytes), list(option_bytes))
        log = read(nvrtc.nvrtcGetProgramLogSize, nvrtc.nvrtcGetProgramLog)
        if int(err) != 0:
            raise CudaError(f"NVRTC failed to compile {name} for {arch}:\n{log.decode(errors='replace')}")
        out = {"ptx": read(nvrtc.nvrtcGetPTXSize, nvrtc.nvrtcGetPTX), "log": log}
        if arch.startswith("sm_"):
            out["cubin"] = read(nvrtc.nvrtcGetCUBINSize, nvrtc.nvrtcGetCUBIN, strip=False)
        return out
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


# --------------------------------------------------------------------------- launch


class TensorMap(ctypes.Structure):
    """A CUtensorMap (128 opaque bytes): a TMA copy's description of a global tensor, built
    by ``tensor_map`` and passed by value (a ``"tmap"`` kernel argument, received as a
    ``const __grid_constant__`` 64-byte aligned 128-byte struct)."""

    _fields_ = [("opaque", ctypes.c_uint64 * 16)]


_TMAP_BYTES = ctypes.sizeof(TensorMap)


def _value(a):
    """A kernel argument's value for its ctypes slot: a tensor's data pointer, else itself."""
    return a.data_ptr() if isinstance(a, torch.Tensor) else a


_CTYPE = {
    "ptr": ctypes.c_void_p,
    "i64": ctypes.c_int64,
    "i32": ctypes.c_int32,
    "u32": ctypes.c_uint32,
    "f32": ctypes.c_float,
    "tmap": TensorMap,
}


@functools.cache
def _libcuda():
    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuLaunchKernel.argtypes = (
        [ctypes.c_void_p]
        + [ctypes.c_uint] * 7
        + [
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_void_p,
        ]
    )
    lib.cuLaunchKernel.restype = ctypes.c_int
    lib.cuFuncGetAttribute.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_void_p]
    lib.cuFuncGetAttribute.restype = ctypes.c_int
    lib.cuFuncSetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    lib.cuFuncSetAttribute.restype = ctypes.c_int
    lib.cuGetErrorString.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    lib.cuDeviceGet.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int]
    lib.cuDevicePrimaryCtxRetain.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]
    lib.cuCtxSetCurrent.argtypes = [ctypes.c_void_p]
    return lib


_INVALID_CONTEXT = 201  # CUDA_ERROR_INVALID_CONTEXT


# Thread-block cluster launches (sm_90+) go through cuLaunchKernelEx, which takes its grid,
# block, stream and attributes in a struct. The three structs below mirror cuda.h
# (CUlaunchConfig, CUlaunchAttribute and its 64-byte value union); tests compare their
# bytes with cuda.bindings' own.
_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4  # CUlaunchAttributeID
_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES = 1  # CUfunction_attribute: static shared memory
_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14  # (clusters of more than 8 blocks)


class _ClusterDim(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


class _LaunchAttributeValue(ctypes.Union):
    _fields_ = [("pad", ctypes.c_char * 64), ("align", ctypes.c_uint64), ("clusterDim", _ClusterDim)]


class _LaunchAttribute(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", _LaunchAttributeValue)]


class _LaunchConfig(ctypes.Structure):
    _fields_ = [
        ("gridDimX", ctypes.c_uint),
        ("gridDimY", ctypes.c_uint),
        ("gridDimZ", ctypes.c_uint),
        ("blockDimX", ctypes.c_uint),
        ("blockDimY", ctypes.c_uint),
        ("blockDimZ", ctypes.c_uint),
        ("sharedMemBytes", ctypes.c_uint),
        ("hStream", ctypes.c_void_p),
        ("attrs", ctypes.POINTER(_LaunchAttribute)),
        ("numAttrs", ctypes.c_uint),
    ]


def _cluster_config(grid, block, cluster, shared: int, stream) -> tuple[_LaunchConfig, _LaunchAttribute]:
    """cuLaunchKernelEx's config for ``grid`` blocks (3-tuple) in clusters of ``cluster``
    blocks (3-tuple); the attribute is returned too, as the config points at it (keep both
    alive while the driver reads them)."""
    attr = _LaunchAttribute(id=_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION)
    attr.value.clusterDim = _ClusterDim(*cluster)
    cfg = _LaunchConfig(*grid, *block, shared, stream, ctypes.pointer(attr), 1)
    return cfg, attr


def _dims(v, what: str) -> tuple[int, int, int]:
    d = tuple(v) if isinstance(v, (tuple, list)) else (v,)
    if not 1 <= len(d) <= 3 or not all(isinstance(e, int) and e >= 1 for e in d):
        raise ValueError(f"{what} must be a positive int or up to 3 positive ints, got {v!r}")
    return (d + (1, 1))[:3]


def cluster_dims(grid, cluster) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(grid, cluster) as 3-tuples of blocks, refused with a ValueError unless every grid
    dimension is a multiple of the cluster's (the driver's rule) and the cluster holds at
    most 16 blocks (Hopper's most, with non-portable sizes allowed)."""
    g, c = _dims(grid, "grid"), _dims(cluster, "cluster")
    if any(gi % ci for gi, ci in zip(g, c)):
        raise ValueError(f"cluster {c} must divide grid {g} in every dimension")
    if c[0] * c[1] * c[2] > 16:
        raise ValueError(f"cluster {c} holds {c[0] * c[1] * c[2]} blocks; at most 16")
    return g, c


@functools.cache
def _libcuda_ex():
    """libcuda with the cluster entry points (CUDA 11.8+ drivers) typed."""
    lib = _libcuda()
    try:
        launch, occupancy = lib.cuLaunchKernelEx, lib.cuOccupancyMaxActiveClusters
    except AttributeError as e:
        raise CudaError(f"this driver has no cluster launch (cuLaunchKernelEx): {e}") from None
    launch.argtypes = [ctypes.POINTER(_LaunchConfig), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    launch.restype = ctypes.c_int
    occupancy.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_void_p, ctypes.POINTER(_LaunchConfig)]
    occupancy.restype = ctypes.c_int
    return lib


@functools.cache
def _primary_context(device_index: int) -> int:
    """The device's primary context (the one torch's runtime calls use), retained once."""
    lib = _libcuda()
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    rc = lib.cuDeviceGet(ctypes.byref(dev), ctypes.c_int(device_index))
    if rc == 0:
        rc = lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
    if rc != 0:
        raise CudaError(f"no primary context for device {device_index}: {_error_string(rc)}")
    return ctx.value


def _bind_context(device_index: int) -> None:
    """Make the device's primary context current on this thread. The runtime does that at a
    thread's first runtime call; a thread that has made none has no current context and the
    driver refuses our launches (autograd's device thread, when our kernel is the first of a
    backward, e.g. the conv2d CUDA dgrad). No synchronization: safe inside
    a graph capture."""
    rc = _libcuda().cuCtxSetCurrent(ctypes.c_void_p(_primary_context(device_index)))
    if rc != 0:
        raise CudaError(f"cannot make device {device_index}'s context current: {_error_string(rc)}")


def _in_context(call, device_index: int) -> int:
    """``call()``'s CUresult; where the thread has no current context yet (autograd's thread
    before its first CUDA call), the device's primary context is bound and ``call()`` made
    again. (The launch paths inline the same retry: they are the host's hot path.)"""
    rc = call()
    if rc == _INVALID_CONTEXT:
        _bind_context(device_index)
        rc = call()
    return rc


def _error_string(code: int) -> str:
    s = ctypes.c_char_p()
    _libcuda().cuGetErrorString(code, ctypes.byref(s))
    return (s.value or b"unknown").decode()


def mapped_host_int32(count: int, device_index: int):
    """``count`` int32 slots of page-locked host memory that kernels write directly
    (cuMemHostAlloc with PORTABLE | DEVICEMAP, never freed: for small, long-lived
    mailboxes). Returns (host view: a ctypes int32 array, device address for kernels).

    A kernel's plain stores to it are visible to the host once an event recorded after
    the kernel has completed; no copy and no copy engine is involved."""
    lib = _libcuda()
    lib.cuMemHostAlloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_uint]
    lib.cuMemHostAlloc.restype = ctypes.c_int
    get_ptr = lib.cuMemHostGetDevicePointer_v2
    get_ptr.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_void_p, ctypes.c_uint]
    get_ptr.restype = ctypes.c_int
    # The driver API allocates in the calling thread's current context: make the device's
    # primary context current through the runtime first (torch may not have touched the
    # runtime on this thread yet).
    torch.cuda.synchronize(device_index)
    portable, devicemap = 0x01, 0x02
    host = ctypes.c_void_p()
    rc = lib.cuMemHostAlloc(ctypes.byref(host), 4 * count, portable | devicemap)
    if rc != 0:
        raise CudaError(f"cuMemHostAlloc({4 * count} bytes) failed: {_error_string(rc)}")
    dev = ctypes.c_uint64()
    rc = get_ptr(ctypes.byref(dev), host, 0)
    if rc != 0:
        raise CudaError(f"cuMemHostGetDevicePointer failed: {_error_string(rc)}")
    return (ctypes.c_int32 * count).from_address(host.value), int(dev.value)


try:  # the raw cudaStream_t of torch's current stream, without building a Stream object
    _raw_stream = torch._C._cuda_getCurrentRawStream
except AttributeError:  # pragma: no cover - older or CPU-only torch builds

    def _raw_stream(device_index):
        return torch.cuda.current_stream(device_index).cuda_stream


try:  # torch.cuda.current_device() without its lazy-init bookkeeping
    _get_device = torch._C._cuda_getDevice
except AttributeError:  # pragma: no cover
    _get_device = torch.cuda.current_device


def _function_handle(kernel) -> int:
    """A CUfunction for the current context. cuda.core loads code as a library and hands
    out context-independent CUkernel handles; cuLaunchKernel accepts those too, but then
    resolves the function for the context on every launch. Resolve it once here."""
    try:
        from cuda.bindings import driver

        err, fn = driver.cuKernelGetFunction(kernel.handle)
        if int(err) == 0:
            return int(fn)
    except Exception:  # older bindings: launch with the CUkernel handle
        pass
    return int(kernel.handle)


def _static_shared(handle: int) -> int:
    """The function's static shared memory in bytes (0 where the driver does not say)."""
    try:
        get = _libcuda().cuFuncGetAttribute
    except AttributeError:
        return 0
    out = ctypes.c_int(0)
    rc = get(ctypes.byref(out), _FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, handle)
    return int(out.value) if rc == 0 else 0


class Kernel:
    """A loaded kernel with a fixed signature, e.g. ``("ptr", "ptr", "i64")``."""

    def __init__(self, kernel, name: str, signature: Sequence[str]):
        self.name = name
        self.signature = tuple(signature)
        self._core_kernel = kernel
        self._handle = _function_handle(kernel)
        self._slots = [_CTYPE[t]() for t in self.signature]
        self._params = (ctypes.c_void_p * len(self._slots))(*[ctypes.addressof(s) for s in self._slots])
        self._nargs = len(self._slots)
        self._has_maps = "tmap" in self.signature
        self._lock = threading.Lock()
        self._launch = _libcuda().cuLaunchKernel
        self._use_core = config.cuda_launch == "core"
        # The default limit: 48 KB for static and dynamic together; see set_max_dynamic_shared
        self.max_dynamic_shared = 48 * 1024 - _static_shared(self._handle)
        self._cluster_launch = None  # (config, attribute) of launch_cluster, made at its first call
        self._non_portable_clusters = False  # see allow_non_portable_cluster_size

    @property
    def handle(self) -> int:
        """The CUfunction (a C++ caller's launch target; cuda/nodes.cpp)."""
        return self._handle

    def __call__(self, grid, block, *args, shared: int = 0, device_index: int | None = None):
        """Launch on torch's current stream. ``grid``/``block`` are int or 3-tuples;
        ``args`` match the signature (tensors are passed as their data pointers).

        This is the hot path (host cost per launch is a benchmark): no object is built per
        call; the argument values go into the kernel's preallocated ctypes slots."""
        if len(args) != self._nargs:
            raise TypeError(f"{self.name} takes {self._nargs} arguments, got {len(args)}")
        current = _get_device()
        if device_index is None:
            device_index = current
        elif device_index != current:  # launch in the tensors' device context
            with torch.cuda.device(device_index):
                return self(grid, block, *args, shared=shared, device_index=device_index)
        gx, gy, gz = (grid, 1, 1) if type(grid) is int else (tuple(grid) + (1, 1))[:3]
        bx, by, bz = (block, 1, 1) if type(block) is int else (tuple(block) + (1, 1))[:3]
        stream = _raw_stream(device_index)
        if self._use_core:
            if self._has_maps:
                raise CudaError(f"{self.name}: tensor-map arguments need the direct launch (cuda_launch)")
            values = [_value(a) for a in args]
            return self._launch_core(stream, (gx, gy, gz), (bx, by, bz), shared, values)
        with self._lock:
            self._fill(args)
            rc = self._launch(self._handle, gx, gy, gz, bx, by, bz, shared, stream, self._params, None)
            if rc == _INVALID_CONTEXT:  # this thread's first launch: bind the context, retry
                _bind_context(device_index)
                rc = self._launch(self._handle, gx, gy, gz, bx, by, bz, shared, stream, self._params, None)
        if rc != 0:
            raise CudaError(f"launch of {self.name} failed: {_error_string(rc)} ({rc})")

    def _fill(self, args) -> None:
        """The launch's argument slots from ``args`` (under the lock): tensor maps copied by
        value into their 128-byte slots, tensors as their addresses, numbers as they are."""
        if self._has_maps:  # (type() tests first: cheaper than isinstance on this path)
            for slot, a in zip(self._slots, args):
                if type(slot) is TensorMap:
                    if type(a) is not TensorMap:
                        raise TypeError(
                            f"{self.name}: a tensor-map argument takes a TensorMap, got {type(a)}"
                        )
                    ctypes.memmove(ctypes.addressof(slot), ctypes.addressof(a), _TMAP_BYTES)
                else:
                    t = type(a)
                    slot.value = a if t is int or t is float else _value(a)
        else:
            for slot, a in zip(self._slots, args):
                t = type(a)
                slot.value = a if t is int or t is float else _value(a)

    def launch_1d(self, grid: int, block: int, values, device_index: int) -> None:
        """Hot path for 1-D launches whose arguments are already plain ints (pointers from
        ``data_ptr()`` and scalars), on ``device_index``, which must be current."""
        stream = _raw_stream(device_index)
        if self._use_core:
            return self._launch_core(stream, (grid, 1, 1), (block, 1, 1), 0, values)
        with self._lock:
            for slot, v in zip(self._slots, values):
                slot.value = v
            rc = self._launch(self._handle, grid, 1, 1, block, 1, 1, 0, stream, self._params, None)
            if rc == _INVALID_CONTEXT:
                _bind_context(device_index)
                rc = self._launch(self._handle, grid, 1, 1, block, 1, 1, 0, stream, self._params, None)
        if rc != 0:
            raise CudaError(f"launch of {self.name} failed: {_error_string(rc)} ({rc})")

    def launch_cluster(self, grid, block, cluster, *args, shared: int = 0, device_index: int | None = None):
        """Launch ``grid`` blocks (int or 3-tuple, counted in blocks as for ``__call__``) in
        thread-block clusters of ``cluster`` blocks (sm_90+: the blocks of a cluster run at
        once on one GPC and reach each other's shared memory), on torch's current stream.
        Every grid dimension must be a multiple of the cluster's. Clusters of more than 8
        blocks need ``allow_non_portable_cluster_size`` first. Goes through
        cuLaunchKernelEx with the CLUSTER_DIMENSION attribute (``cuda.core.launch`` with
        ``LaunchConfig(cluster=...)`` when ``config.cuda_launch`` is "core")."""
        if len(args) != self._nargs:
            raise TypeError(f"{self.name} takes {self._nargs} arguments, got {len(args)}")
        g, c = cluster_dims(grid, cluster)
        b = _dims(block, "block")
        current = _get_device()
        if device_index is None:
            device_index = current
        elif device_index != current:
            with torch.cuda.device(device_index):
                return self.launch_cluster(
                    grid, block, cluster, *args, shared=shared, device_index=device_index
                )
        stream = _raw_stream(device_index)
        if self._use_core:
            if self._has_maps:
                raise CudaError(f"{self.name}: tensor-map arguments need the direct launch (cuda_launch)")
            from cuda.core import LaunchConfig, Stream, launch

            values = [a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args]
            typed = [v if t == "ptr" else _CTYPE[t](v) for t, v in zip(self.signature, values)]
            clusters = tuple(gi // ci for gi, ci in zip(g, c))  # cuda.core counts the grid in clusters
            cfg = LaunchConfig(grid=clusters, cluster=c, block=b, shmem_size=shared)
            return launch(Stream.from_handle(stream), cfg, self._core_kernel, *typed)
        lib = _libcuda_ex()
        with self._lock:
            if self._cluster_launch is None:  # built once, refilled per call (host cost)
                self._cluster_launch = _cluster_config(g, b, c, shared, stream)
            cfg, attr = self._cluster_launch
            cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = g
            cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = b
            cfg.sharedMemBytes, cfg.hStream = shared, stream
            dim = attr.value.clusterDim
            dim.x, dim.y, dim.z = c
            self._fill(args)  # (tensor maps by value, as for __call__)
            rc = lib.cuLaunchKernelEx(ctypes.byref(cfg), self._handle, self._params, None)
            if rc == _INVALID_CONTEXT:
                _bind_context(device_index)
                rc = lib.cuLaunchKernelEx(ctypes.byref(cfg), self._handle, self._params, None)
        if rc != 0:
            raise CudaError(f"cluster launch of {self.name} (cluster {c}) failed: {_error_string(rc)} ({rc})")

    def max_active_clusters(self, block, cluster, shared: int = 0) -> int:
        """How many clusters of ``cluster`` blocks of ``block`` threads with ``shared``
        bytes of dynamic shared memory can run at once on the device
        (cuOccupancyMaxActiveClusters: whole clusters fit on one GPC, so this can be less
        than blocks per SM x SMs / cluster). 0: such a cluster cannot be launched. Dynamic
        shared memory past 48 KB counts only once ``set_max_dynamic_shared`` allowed it."""
        _, c = cluster_dims(cluster, cluster)
        b = _dims(block, "block")
        lib = _libcuda_ex()
        cfg, _attr = _cluster_config(c, b, c, shared, None)
        n = ctypes.c_int()
        rc = _in_context(
            lambda: lib.cuOccupancyMaxActiveClusters(ctypes.byref(n), self._handle, ctypes.byref(cfg)),
            _get_device(),
        )
        if rc != 0:
            raise CudaError(f"{self.name}: no occupancy for cluster {c}: {_error_string(rc)} ({rc})")
        return int(n.value)

    def allow_non_portable_cluster_size(self) -> None:
        """Allow clusters of up to 16 blocks (Hopper; 8 is the portable most). Once per
        kernel; later calls return at once."""
        if self._non_portable_clusters:
            return
        self._set_attribute(
            _FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1, "allow clusters of > 8 blocks"
        )
        self._non_portable_clusters = True

    def _set_attribute(self, attribute: int, value: int, what: str) -> None:
        lib = _libcuda()
        with self._lock:
            rc = lib.cuFuncSetAttribute(self._handle, attribute, int(value))
        if rc != 0:
            raise CudaError(f"{self.name}: cannot {what}: {_error_string(rc)}")

    def set_max_dynamic_shared(self, nbytes: int) -> None:
        """Allow launches with up to ``nbytes`` of dynamic shared memory per block. Above
        48 KB a kernel must opt in (cuFuncSetAttribute MAX_DYNAMIC_SHARED_SIZE_BYTES; an
        H100 allows 227 KB). Call once after loading; launches are unaffected."""
        if nbytes <= self.max_dynamic_shared:
            return
        self._set_attribute(
            _FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            nbytes,
            f"allow {nbytes} B of dynamic shared memory",
        )
        self.max_dynamic_shared = int(nbytes)

    def _launch_core(self, stream, grid, block, shared, values):
        from cuda.core import LaunchConfig, Stream, launch

        cfg = LaunchConfig(grid=grid, block=block, shmem_size=shared)
        # cuda.core passes a Python int as a pointer-sized integer; scalars as ctypes.
        typed = [v if t == "ptr" else _CTYPE[t](v) for t, v in zip(self.signature, values)]
        launch(Stream.from_handle(stream), cfg, self._core_kernel, *typed)


class Module:
    """A .cu file (or source string): compiled for the current device at first use.

    ``archs`` (default None: any arch asked for) restricts a module to arch-specific
    targets, e.g. ``("sm_90a",)`` for Hopper-only instructions (wgmma, setmaxnreg) that
    ptxas refuses for plain sm_90. An arch asked for (the device's ``sm_XY``, an arch
    given to ``compile``) then maps to ``sm_XY`` or ``sm_XYa`` from that list
    (``target_arch``), other archs are refused with a clear error, and ``precompile``
    compiles for the listed archs instead of the check archs. An sm_90a cubin runs only
    on sm_90 devices: whoever registers such a module says so in its availability check."""

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        source: str | None = None,
        options=(),
        archs: Sequence[str] | None = None,
    ):
        if (path is None) == (source is None):
            raise ValueError("give exactly one of path or source")
        self.path = Path(path) if path else None
        self._source = source
        self.options = tuple(options)
        self.archs = tuple(archs) if archs else None
        self._objects = {}  # device index -> cuda.core ObjectCode
        self._kernels = {}
        self._lock = threading.Lock()

    @property
    def source(self) -> str:
        return self._source if self._source is not None else self.path.read_text()

    @property
    def label(self) -> str:
        return self.path.name if self.path else "<source>"

    def target_arch(self, arch: str) -> str:
        """The arch this module is compiled for when ``arch`` is asked for (see archs)."""
        if self.archs is None:
            return arch
        for candidate in (arch, arch + "a"):
            if candidate in self.archs:
                return candidate
        raise CudaError(f"{self.label} is built only for {', '.join(self.archs)}, not for {arch}")

    def compile(self, arch: str, target: str = "cubin") -> bytes:
        return compile_source(
            self.source,
            self.target_arch(arch),
            options=self.options,
            base_dir=self.path.parent if self.path else HERE,
            target=target,
            name=self.label,
        )

    def precompile(self, archs: Sequence[str] = CHECK_ARCHS) -> list[str]:
        """Compile without a GPU; one line per arch, for 'compiled, not run' reports.
        A module restricted to ``archs`` (see the class) compiles for those instead."""
        lines = []
        for arch in self.archs or archs:
            t0 = time.perf_counter()
            code = self.compile(arch)
            lines.append(
                f"{self.label}: {arch} cubin {len(code)} B ({(time.perf_counter() - t0) * 1e3:.0f} ms)"
            )
        return lines

    def kernel(self, name: str, signature: Sequence[str], device_index: int | None = None) -> Kernel:
        if device_index is None:
            device_index = torch.cuda.current_device()
        key = (name, device_index)
        k = self._kernels.get(key)
        if k is not None:
            return k
        with self._lock:
            if key not in self._kernels:
                obj = self._objects.get(device_index)
                if obj is None:
                    from cuda.core import ObjectCode

                    major, minor = torch.cuda.get_device_capability(device_index)
                    obj = ObjectCode.from_cubin(self.compile(f"sm_{major}{minor}"))
                    self._objects[device_index] = obj
                core = obj.get_kernel(name)
                check_signature(name, signature, _param_sizes(core))
                # The CUfunction is resolved in the current context: a caller that loads
                # a kernel before any CUDA work on this thread has none yet.
                _bind_context(device_index)
                self._kernels[key] = Kernel(core, name, signature)
        return self._kernels[key]


def _param_sizes(core_kernel) -> list[int] | None:
    """The byte size of each parameter of a loaded kernel (the driver's cuFuncGetParamInfo,
    through cuda.core), or None where the bindings cannot tell."""
    try:
        return [int(p.size) for p in core_kernel.arguments_info]
    except Exception:
        return None


def signature_sizes(signature: Sequence[str]) -> list[int]:
    return [ctypes.sizeof(_CTYPE[t]) for t in signature]


def check_signature(name: str, signature: Sequence[str], sizes: Sequence[int] | None) -> None:
    """Refuse a launch signature whose parameter sizes differ from the kernel's own (a
    pointer where the kernel takes an int would launch with garbage arguments)."""
    if sizes is None:
        return
    want = signature_sizes(signature)
    if list(sizes) != want:
        raise CudaError(
            f"kernel {name}: the launch signature {tuple(signature)} has parameter sizes {want}, "
            f"the compiled kernel takes {list(sizes)}"
        )


def ptx_param_sizes(ptx: str, name: str) -> list[int]:
    """The parameter sizes of ``.entry name`` in PTX text (CPU tests of launch signatures)."""
    import re

    m = re.search(r"\.entry\s+" + re.escape(name) + r"\s*\((.*?)\)", ptx, re.S)
    if m is None:
        raise KeyError(f"no .entry {name} in the PTX")
    sizes = {"8": 1, "16": 2, "32": 4, "64": 8}
    out = []
    for param in m.group(1).split(","):
        arr = re.search(r"\.b8\s+\w+\[(\d+)\]", param)  # a struct by value: .align A .b8 name[N]
        if arr:
            out.append(int(arr.group(1)))
        else:
            out += [sizes[b] for b in re.findall(r"\.param\s+\.[a-z]+?(\d+)\s", param + " ")]
    return out


# cuTensorMapEncodeTiled's enums (cuda.h)
_TMAP_SWIZZLE = {0: 0, 32: 1, 64: 2, 128: 3}  # CU_TENSOR_MAP_SWIZZLE_{NONE, 32B, 64B, 128B}
_TMAP_UINT = {1: 0, 2: 1, 4: 2, 8: 4}  # CU_TENSOR_MAP_DATA_TYPE_UINT{8, 16, 32, 64}: bits copied as they are
_TMAP_L2_128B = 2  # CU_TENSOR_MAP_L2_PROMOTION_L2_128B


@functools.lru_cache(maxsize=1024)
def tensor_map(address: int, elem_bytes: int, dims: tuple, strides: tuple, box: tuple, swizzle: int):
    """A TMA tensor map (cuTensorMapEncodeTiled) of the tensor at ``address``: ``dims``
    innermost first (elements; the innermost unit-stride), ``strides`` in bytes of dims
    1.. (multiples of 16), ``box`` the tile one copy moves (elements per dim; box[0] x
    elem_bytes at most ``swizzle`` bytes when swizzled), ``swizzle`` 0 / 32 / 64 / 128 (the
    shared-memory pattern the copy writes, Swizzle<log2(swizzle/16), 4, 3>). Elements are
    copied as raw bits; out-of-bounds elements arrive as zeros. Cached: the same arguments
    give the same map (a map holds only these values). Returns a ``TensorMap``."""
    rank = len(dims)
    if not (len(strides) == rank - 1 and len(box) == rank):
        raise ValueError(f"tensor_map: {rank} dims need {rank - 1} strides and {rank} box sizes")
    lib = _libcuda()
    fn = lib.cuTensorMapEncodeTiled
    u32p, u64p = ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint64)
    enum = ctypes.c_int
    fn.argtypes = [ctypes.POINTER(TensorMap), enum, ctypes.c_uint32, ctypes.c_void_p, u64p, u64p, u32p, u32p,
                   enum, enum, enum, enum]  # fmt: skip
    fn.restype = ctypes.c_int
    out = TensorMap()

    def encode():
        return fn(
            ctypes.byref(out), _TMAP_UINT[elem_bytes], rank, ctypes.c_void_p(address),
            (ctypes.c_uint64 * rank)(*dims), (ctypes.c_uint64 * max(rank - 1, 1))(*strides),
            (ctypes.c_uint32 * rank)(*box), (ctypes.c_uint32 * rank)(*([1] * rank)),
            0, _TMAP_SWIZZLE[swizzle], _TMAP_L2_128B, 0,
        )  # fmt: skip

    rc = _in_context(encode, _get_device())
    if rc != 0:
        raise CudaError(
            f"cuTensorMapEncodeTiled(dims={dims}, strides={strides}, box={box}, swizzle={swizzle}) failed: "
            f"{_error_string(rc)} ({rc})"
        )
    return out


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# The suffix of a templated kernel's instance for each dtype (``gelu_f32``, ``softmax_bf16``):
# how the .cu files name their explicit instantiations.
DTYPE_SUFFIX = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}


@functools.cache
def sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count
