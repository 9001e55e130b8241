"""Run a module as a script with a lab override module in effect in `kernellab check`'s
worker processes too (used by conv_runs.py and conv_nhwc.py).

check runs built-in backends in spawned workers, which import kernellab afresh: a table
set in the calling process never reaches them. ``run(name)`` wraps the workers'
initializer so that each worker imports the override module ``name`` first (lab/ must be
on PYTHONPATH; spawned workers inherit it), then runs ``sys.argv[1]`` as ``__main__``
with the remaining arguments."""

import functools
import importlib
import runpy
import sys

from kernellab.harness import parallel

_ORIGINAL = parallel._init_worker  # (imported in a worker too: there it is the unpatched one)


def _init(modules, *args) -> None:
    for name in modules:
        importlib.import_module(name)
    _ORIGINAL(*args)


def run(name: str) -> None:
    importlib.import_module(name)  # by the name a worker can import
    parallel._init_worker = functools.partial(_init, (name,))
    module, sys.argv = sys.argv[1], sys.argv[1:]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
