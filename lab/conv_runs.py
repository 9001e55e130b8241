"""PIXEL_RUNS on for every conv2d kernel, dtype and size (the default has them where they
pay), then a
module run as a script with the remaining arguments:

    PYTHONPATH=src:lab python lab/conv_runs.py kernellab check conv2d -b triton
    PYTHONPATH=src:lab python lab/conv_runs.py pytest -p conv_runs -m gpu tests/ops/test_conv2d.py

(``-p conv_runs`` loads this module in pytest's xdist workers too; `kernellab check`'s
worker processes import it through their initializer, ``init_worker``. Needs lab/ on
PYTHONPATH, which spawned workers inherit.)"""

import runpy
import sys

from kernellab.harness import parallel
from kernellab.ops.conv2d import triton as kt

kt.PIXEL_RUNS.update(kt.runs_everywhere())
_init = parallel._init_worker


def init_worker(*args) -> None:
    """check's worker initializer: a spawned worker unpickles it by module name, so the
    import of this module turns the runs on there too."""
    _init(*args)


if __name__ == "__main__":
    import conv_runs  # this file by its module name: what a worker can import

    parallel._init_worker = conv_runs.init_worker
    module, sys.argv = sys.argv[1], sys.argv[1:]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
