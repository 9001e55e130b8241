"""Autograd nodes written in C++ (nodes.cpp): the eager path of the norms' CUDA backend
``cuda_node`` and of their Triton backends (ops/norm_kernels/triton_node.py), where host
time is the call; and the attention ``torch`` backend's hooks on SDPA's node
(ops/attention/reference.py ``_align_grad``), so that its backward runs no Python.

A Python ``autograd.Function`` costs a Python frame in the forward and, in the backward,
the GIL taken on autograd's device thread; at tiny shapes that is most of a call. The C++
node keeps the saved tensors and the backward in C++ and launches the kernels (norms.cu's,
compiled by NVRTC, or the Triton ones, compiled by Triton; Python passes their CUfunction
handles and launch shapes in a per-shape plan).

Building: a torch C++ extension (``torch.utils.cpp_extension.load``: a C++ compiler and
ninja, about a minute, once per source, torch and Python version), kept under the cache
directory (``kernellab.device.cache_dir()/nodes``). ``kernellab.config.cpp_nodes`` says
when:

- ``"auto"`` (default): use the extension when it has been built. On a machine with a
  CUDA GPU, the first call that wants it and finds none starts the build in a process of
  its own and goes on through the Python node: no call waits for the compiler. A call at
  most every ``POLL_S`` seconds looks whether that process has finished; the first one
  after it did loads the extension, and the calls from then on use it. The process
  outlives this one (an interrupted run still leaves a finished build for the next) and
  writes its output to ``build_log()``. ``kernellab build-nodes`` or
  ``kernellab.cuda.nodes.build()`` builds it ahead.
- ``"build"``: build at the first call that wants it (that call waits).
- ``"off"``: never use it (the Python node: what every other backend runs).

Without the extension everything works as before, through the Python node.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from kernellab.options import config

SOURCE = Path(__file__).with_name("nodes.cpp")
_MODES = ("auto", "build", "off")
POLL_S = 2.0  # "auto": how often a call looks whether the background build has finished


def _key() -> str:
    """Source, torch and Python version: a build is valid for exactly these."""
    h = hashlib.sha256(SOURCE.read_bytes())
    h.update(torch.__version__.encode())
    h.update(sys.version.encode())
    return h.hexdigest()[:16]


def _name() -> str:
    return f"kernellab_nodes_{_key()}"


def build_dir() -> Path:
    from kernellab.device import cache_dir

    return cache_dir() / "nodes" / _name()


def _built_file() -> Path:
    return build_dir() / (_name() + ".so")  # (cpp_extension's file name)


def _load_file(path: Path):
    loader = importlib.machinery.ExtensionFileLoader(_name(), str(path))
    spec = importlib.util.spec_from_file_location(_name(), str(path), loader=loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def build_log() -> Path:
    """Where the background build (``"auto"``) writes its output."""
    return build_dir().parent / f"{_name()}.log"


# "module": the loaded extension; "why": why there is none; "builder" (with "next_poll"):
# the background build's process while it runs
_STATE: dict = {}


def _start_build() -> None:
    """Run ``kernellab build-nodes`` in a process of its own, in a session of its own (a
    Ctrl-C here does not stop it half-way), with this kernellab first on its path."""
    log = build_log()
    log.parent.mkdir(parents=True, exist_ok=True)
    src = str(Path(__file__).resolve().parents[2])  # the directory holding the kernellab package
    path = os.environ.get("PYTHONPATH")
    env = {**os.environ, "PYTHONPATH": src + (os.pathsep + path if path else "")}
    with open(log, "w") as out:
        _STATE["builder"] = subprocess.Popen(
            [sys.executable, "-m", "kernellab", "build-nodes"],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )  # fmt: skip
    _STATE["next_poll"] = time.monotonic() + POLL_S


def _poll_build():
    """The extension once the background build has finished (None before; on a failed
    build None, with why)."""
    now = time.monotonic()
    if now < _STATE["next_poll"]:
        return None
    _STATE["next_poll"] = now + POLL_S
    rc = _STATE["builder"].poll()
    if rc is None:
        return None
    del _STATE["builder"]
    if rc != 0 or not _built_file().exists():
        _STATE["why"] = f"the background build failed (exit status {rc}; its output: {build_log()})"
        return None
    try:
        return build()
    except Exception as e:  # noqa: BLE001 - a load error: the Python node
        _STATE["why"] = f"{type(e).__name__}: {e}"
    return None


def build(verbose: bool = False):
    """Compile nodes.cpp (if not built already) and return the extension module."""
    if "module" in _STATE:
        return _STATE["module"]
    path = _built_file()
    if not path.exists():
        from torch.utils import cpp_extension

        d = build_dir()
        d.mkdir(parents=True, exist_ok=True)
        mod = cpp_extension.load(
            name=_name(),
            sources=[str(SOURCE)],
            build_directory=str(d),
            extra_cflags=["-O2"],
            extra_ldflags=["-ldl"],
            verbose=verbose,
        )
    else:
        mod = _load_file(path)
    _STATE.pop("why", None)
    _STATE["module"] = mod
    return mod


def module():
    """The extension for this call, or None (``config.cpp_nodes``: see the module doc)."""
    mode = config.cpp_nodes
    if mode == "off":
        return None
    mod = _STATE.get("module")
    if mod is not None:
        return mod
    if mode not in _MODES:
        raise ValueError(f"kernellab.config.cpp_nodes must be one of {_MODES}, got {mode!r}")
    if "builder" in _STATE:
        return _poll_build()
    if "why" in _STATE:
        return None
    try:
        if mode == "build" or _built_file().exists():
            return build()
        if torch.cuda.is_available():
            _start_build()
            return None
        _STATE["why"] = "not built (kernellab build-nodes)"
    except Exception as e:  # noqa: BLE001 - no compiler, no ninja, a load error: the Python node
        _STATE["why"] = f"{type(e).__name__}: {e}"
    return None


def settle(timeout_s: float = 600.0):
    """``module()``, after waiting for a background build this process started (or starts
    now) to finish: what a benchmark calls first, so that all its rows are timed with the
    extension or all without."""
    mod = module()
    proc = _STATE.get("builder")
    if mod is None and proc is not None:
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None
        _STATE["next_poll"] = 0.0
        mod = module()
    return mod


def why_unavailable() -> str | None:
    """None when the extension is loaded or loadable now, else why not."""
    if module() is not None:
        return None
    if "builder" in _STATE:
        return f"building in a background process (its output: {build_log()})"
    return _STATE.get("why", "cpp_nodes is off")
