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

- ``"auto"`` (default): use the extension when it has been built; never build it
  implicitly (a first call must not stall for a minute). ``kernellab build-nodes``
  or ``kernellab.cuda.nodes.build()`` builds it.
- ``"build"``: build at the first call that wants it.
- ``"off"``: never use it (the Python node: what every other backend runs).

Without the extension everything works as before, through the Python node.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import sys
from pathlib import Path

import torch

from kernellab.options import config

SOURCE = Path(__file__).with_name("nodes.cpp")
_MODES = ("auto", "build", "off")


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


_STATE: dict = {}  # "module": the loaded extension, or "why": why there is none


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
    if "why" in _STATE:
        return None
    try:
        if mode == "build" or _built_file().exists():
            return build()
        _STATE["why"] = "not built (kernellab build-nodes)"
    except Exception as e:  # noqa: BLE001 - no compiler, no ninja, a load error: the Python node
        _STATE["why"] = f"{type(e).__name__}: {e}"
    return None


def why_unavailable() -> str | None:
    """None when the extension is loaded or loadable now, else why not."""
    return None if module() is not None else _STATE.get("why", "cpp_nodes is off")
