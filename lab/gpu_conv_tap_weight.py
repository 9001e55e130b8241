"""conv2d's tap kernels with the weight as given against a tap-major copy (``tap_weight``),
beside cuDNN (TF32 off). Needs a GPU.

    PYTHONPATH=src python lab/gpu_conv_tap_weight.py [--json F]

For each shape and dtype: the forward and dgrad launches alone (``triton_conv2d_fwd``,
``triton_conv2d_bwd``'s dx, whose dw is the same either way), the registered backend's
forward+backward, and torch's; each Triton time with TAP_MAJOR_DTYPES as the library
has it ("lib") and with every dtype tap-major or none ("alt": the other choice for that
dtype). do_bench medians in ms; the error of y and dx against float64 as a ratio to
cuDNN's.
"""

import argparse
import json

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from kernellab.core import registry
from kernellab.ops.conv2d import triton as kt

DEV = "cuda"
SHAPES = [(32, 64, 56, 56, 64), (64, 32, 14, 14, 64), (256, 32, 14, 14, 64), (1024, 32, 14, 14, 64)]


def _err(o, r):
    return float((o.double() - r).abs().max())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    conv = {i.backend: i for i in registry.impls("conv2d")}["triton"].fn
    lib = kt.TAP_MAJOR_DTYPES
    for shape in SHAPES:
        n, c, h, w_, k = shape
        for dtype in (torch.float32, torch.bfloat16):
            g = torch.Generator(device=DEV).manual_seed(n + c)
            x = torch.randn(n, c, h, w_, device=DEV, generator=g).to(dtype)
            w = (torch.randn(k, c, 3, 3, device=DEV, generator=g) / (3 * c**0.5)).to(dtype)
            b = torch.randn(k, device=DEV, generator=g).to(dtype)
            dy = torch.randn(n, k, h, w_, device=DEV, generator=g).to(dtype)
            xr, wr = x.double().requires_grad_(), w.double()
            yr = F.conv2d(xr, wr, b.double(), padding=1)
            (dxr,) = torch.autograd.grad(yr, xr, dy.double())
            xt = x.clone().requires_grad_()
            yt = F.conv2d(xt, w, b, padding=1)
            (dxt,) = torch.autograd.grad(yt, xt, dy)
            e_y, e_dx = _err(yt, yr), _err(dxt, dxr)
            row = dict(shape="x".join(map(str, shape)) + "x3x3", dtype=str(dtype).split(".")[-1])
            row["torch_fwd"] = do_bench(lambda: F.conv2d(x, w, b, padding=1), warmup=10, rep=50)
            xg, wg, bg = (t.clone().requires_grad_() for t in (x, w, b))
            row["torch_fwdbwd"] = do_bench(
                lambda: F.conv2d(xg, wg, bg, padding=1).backward(dy), warmup=10, rep=50
            )
            alt = tuple(set(lib) ^ {dtype})  # the other choice for this dtype
            for name, dts in (("lib", lib), ("alt", alt)):
                kt.TAP_MAJOR_DTYPES = dts
                try:
                    row[name + "_tap_major"] = dtype in dts
                    y = kt.triton_conv2d_fwd(x, w, b, 1, 1, 1, 1)
                    dx = kt.triton_conv2d_bwd(dy, x, w, True, 1, 1, 1, 1)[0]
                    row[name + "_err"] = [round(_err(y, yr) / max(e_y, 1e-30), 3),
                                          round(_err(dx, dxr) / max(e_dx, 1e-30), 3)]  # fmt: skip
                    row[name + "_fwd"] = do_bench(
                        lambda: kt.triton_conv2d_fwd(x, w, b, 1, 1, 1, 1), warmup=10, rep=50
                    )
                    row[name + "_bwd"] = do_bench(
                        lambda: kt.triton_conv2d_bwd(dy, x, w, True, 1, 1, 1, 1), warmup=10, rep=50
                    )
                    row[name + "_fwdbwd"] = do_bench(
                        lambda: conv(xg, wg, bg, stride=1, padding=1).backward(dy), warmup=10, rep=50
                    )
                finally:
                    kt.TAP_MAJOR_DTYPES = lib
            row = {k_: round(v, 5) if isinstance(v, float) else v for k_, v in row.items()}
            print(json.dumps(row), flush=True)
            if args.json:
                with open(args.json, "a") as f:
                    f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
