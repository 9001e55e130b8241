"""`kernellab check conv2d -b triton` with TAPS_NHWC on for every tap kernel and dtype
(the candidate default, before it is one): PYTHONPATH=src python lab/conv_nhwc_check.py [check args]"""

import sys

import torch

from kernellab.cli import main
from kernellab.ops.conv2d import triton as kt

for kern in ("fwd", "dgrad", "wgrad"):
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        kt.TAPS_NHWC[(kern, dtype)] = True
sys.exit(main(["check", "conv2d", "-b", "triton", *sys.argv[1:]]))
