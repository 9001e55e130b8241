"""TAPS_NHWC on for every conv2d tap kernel, dtype and size (a candidate default, before
it is one), then a module run as a script with the remaining arguments:

    PYTHONPATH=src:lab python lab/conv_nhwc.py kernellab check conv2d -b triton
    PYTHONPATH=src:lab python lab/conv_nhwc.py pytest -p conv_nhwc -m gpu tests/ops/test_conv2d.py
    PYTHONPATH=src:lab python lab/conv_nhwc.py kernellab.harness.tune_all --ops conv2d ...

(``-p conv_nhwc`` loads this module in pytest's xdist workers too.)"""

import runpy
import sys

import torch

from kernellab.ops.conv2d import triton as kt

kt.NHWC_MIN_NPQ.clear()
for _kern in ("fwd", "dgrad", "wgrad"):
    for _dtype in (torch.float32, torch.bfloat16, torch.float16):
        kt.TAPS_NHWC[(_kern, _dtype)] = True

if __name__ == "__main__":
    module, sys.argv = sys.argv[1], sys.argv[1:]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
