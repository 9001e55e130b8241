"""TAPS_NHWC on for every conv2d tap kernel, dtype and size, then a module run as a
script with the remaining arguments:

    PYTHONPATH=src:lab python lab/conv_nhwc.py kernellab check conv2d -b triton
    PYTHONPATH=src:lab python lab/conv_nhwc.py pytest -p conv_nhwc -m gpu tests/ops/test_conv2d.py
    PYTHONPATH=src:lab python lab/conv_nhwc.py kernellab.harness.tune_all --ops conv2d ...

(``-p conv_nhwc`` loads this module in pytest's xdist workers too; check's workers
import it through ``in_workers``.)"""

from kernellab.ops.conv2d import triton as kt

kt.TAPS_NHWC.update({(kern, dt): 0 for kern in ("fwd", "dgrad", "wgrad") for dt in kt._FLOATS})

if __name__ == "__main__":
    import in_workers

    in_workers.run("conv_nhwc")
