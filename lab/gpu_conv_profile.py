"""conv2d forward+backward at the table's layers, ours (triton) beside cuDNN (torch), with the
kernels each one's step launches (torch.profiler) and its median (L2 flushed), TF32 off.

    PYTHONPATH=src:lab python lab/gpu_conv_profile.py [--json F] [--dtypes bf16,fp32]

Shows which of forward / dgrad / wgrad / copies carries the gap at each layer.
"""

import argparse

import torch
from profiled import emit_row, measure

from kernellab.ops.conv2d import conv2d
from kernellab.ops.conv2d import triton as kt

SHAPES = [(32, 64, 56, 56, 64), (64, 1, 28, 28, 32), (64, 32, 14, 14, 64), (256, 1, 28, 28, 32),
          (256, 32, 14, 14, 64), (1024, 1, 28, 28, 32), (1024, 32, 14, 14, 64)]  # fmt: skip
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--dtypes", default="bf16,fp32")
    ap.add_argument(
        "--runs",
        choices=("default", "on", "off"),
        default="default",
        help="the kernels told their pixel runs (PIXEL_RUNS): as the library says, all, none",
    )
    args = ap.parse_args()
    if args.runs != "default":
        kt.PIXEL_RUNS.clear()
    if args.runs == "on":
        kt.PIXEL_RUNS.update(kt.runs_everywhere())
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    g = torch.Generator(device="cuda").manual_seed(0)
    for dname in args.dtypes.split(","):
        dtype = DTYPES[dname]
        for n, c, h, wd, k in SHAPES:
            x = torch.randn(n, c, h, wd, device="cuda", generator=g).to(dtype).requires_grad_()
            w = torch.randn(k, c, 3, 3, device="cuda", generator=g) / (3 * c**0.5)
            w = w.to(dtype).requires_grad_()
            b = torch.randn(k, device="cuda", generator=g).to(dtype).requires_grad_()
            dy = torch.randn(n, k, h, wd, device="cuda", generator=g).to(dtype)
            for backend in ("torch", "triton"):

                def step(backend=backend):
                    y = conv2d(x, w, b, padding=1, backend=backend)
                    return torch.autograd.grad(y, (x, w, b), dy)

                row = dict(shape=f"{n}x{c}x{h}x{wd}x{k}x3x3", dtype=dname, backend=backend, mode="fwdbwd")
                runs = kt.PIXEL_RUNS.items()
                row["pixel_runs"] = sorted(f"{kern}/{str(d).split('.')[-1]}>={at}" for (kern, d), at in runs)
                measure(row, step, top=8)
                emit_row(row, args.json)


if __name__ == "__main__":
    main()
