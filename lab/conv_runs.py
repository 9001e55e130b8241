"""PIXEL_RUNS on for every conv2d kernel (a candidate default, before it is one), then a
module run as a script with the remaining arguments:

    PYTHONPATH=src:lab python lab/conv_runs.py kernellab check conv2d -b triton
    PYTHONPATH=src:lab python lab/conv_runs.py pytest -p conv_runs -m gpu tests/ops/test_conv2d.py

(``-p conv_runs`` loads this module in pytest's xdist workers too.)"""

import runpy
import sys

from kernellab.ops.conv2d import triton as kt

kt.PIXEL_RUNS.update(("fwd", "dgrad", "wgrad"))

if __name__ == "__main__":
    module, sys.argv = sys.argv[1], sys.argv[1:]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
