"""PIXEL_RUNS on for every conv2d kernel, dtype and size (the default has them where they
pay), then a module run as a script with the remaining arguments:

    PYTHONPATH=src:lab python lab/conv_runs.py kernellab check conv2d -b triton
    PYTHONPATH=src:lab python lab/conv_runs.py pytest -p conv_runs -m gpu tests/ops/test_conv2d.py

(``-p conv_runs`` loads this module in pytest's xdist workers too; check's workers
import it through ``in_workers``.)"""

from kernellab.ops.conv2d import triton as kt

kt.PIXEL_RUNS.update(kt.runs_everywhere())

if __name__ == "__main__":
    import in_workers

    in_workers.run("conv_runs")
