"""Two fp32 layout questions, timed with no change to src. Needs a GPU.

    PYTHONPATH=src python lab/gpu_fp32_layout_probe.py [--json F] [--parts pad,wgrad]

pad    matmul at sizes off 16-byte multiples (4097x4095x1023: the tiled kernel's loads are
       one element wide there, ALIGN 1): the library's product against the same product
       of zero-padded copies (M, N and K rounded up to 4, so ALIGN is 4), the copies' time
       counted and not, and torch's.
wgrad  conv2d's tap wgrad (``_conv_wgrad_taps_kernel`` through ``triton_conv2d_bwd``, the
       dx skipped) with x as given (NCHW: its B tile [pixels, channels] pixel-contiguous)
       against a channels_last copy of x (channel-contiguous; the kernel takes x's
       strides), the copy counted, beside the dgrad and cuDNN's whole backward.
do_bench medians (ms), TF32 off; errors as a ratio to torch's against float64.
"""

import argparse
import json

import torch
import torch.nn.functional as F
from triton.testing import do_bench

DEV = "cuda"
PAD = [(4097, 4095, 1023), (4097, 4095, 4096), (1000, 3000, 5000), (3000, 3000, 3000)]
WGRAD = [(32, 64, 56, 56, 64), (64, 32, 14, 14, 64), (256, 32, 14, 14, 64), (1024, 32, 14, 14, 64)]


def _err(o, r):
    return float((o.double() - r).abs().max())


def _up(n, v=4):
    return -(-n // v) * v


def pad(out):
    from kernellab.ops.matmul import triton as tm

    for m, n, k in PAD:
        g = torch.Generator(device=DEV).manual_seed(m + n + k)
        a = torch.randn(m, k, device=DEV, generator=g)
        b = torch.randn(k, n, device=DEV, generator=g)
        mp, np_, kp = _up(m), _up(n), _up(k)  # every dim a multiple of 4: ALIGN 4

        def padded(a=a, b=b, mp=mp, kp=kp, np_=np_):
            ap = a.new_zeros(mp, kp)
            ap[: a.shape[0], : a.shape[1]] = a
            bp = b.new_zeros(kp, np_)
            bp[: b.shape[0], : b.shape[1]] = b
            return tm.triton_general_fwd(ap, bp)[: a.shape[0], : b.shape[1]].contiguous()

        ref = a.double() @ b.double()
        e_t = _err(a @ b, ref)
        ap = torch.zeros(mp, kp, device=DEV)
        ap[:m, :k] = a
        bp = torch.zeros(kp, np_, device=DEV)
        bp[:k, :n] = b
        row = dict(part="pad", shape=f"{m}x{n}x{k}", padded=f"{mp}x{np_}x{kp}")
        row["align"] = [
            tm.align_of(4, (m, n, k), (k, 1, n, 1)),
            tm.align_of(4, (mp, np_, kp), (kp, 1, np_, 1)),
        ]
        row["torch_ms"] = do_bench(lambda: a @ b, warmup=10, rep=50)
        row["lib_err"] = round(_err(tm.triton_general_fwd(a, b), ref) / max(e_t, 1e-30), 3)
        row["lib_ms"] = do_bench(lambda: tm.triton_general_fwd(a, b), warmup=10, rep=50)
        row["pad_err"] = round(_err(padded(), ref) / max(e_t, 1e-30), 3)
        row["pad_with_copies_ms"] = do_bench(padded, warmup=10, rep=50)
        row["pad_kernel_ms"] = do_bench(lambda: tm.triton_general_fwd(ap, bp), warmup=10, rep=50)
        out({k_: round(v, 5) if isinstance(v, float) else v for k_, v in row.items()})


def wgrad(out):
    from kernellab.ops.conv2d import triton as kt

    for n, c, h, w_, k in WGRAD:
        g = torch.Generator(device=DEV).manual_seed(n + c)
        x = torch.randn(n, c, h, w_, device=DEV, generator=g)
        w = torch.randn(k, c, 3, 3, device=DEV, generator=g) / (3 * c**0.5)
        dy = torch.randn(n, k, h, w_, device=DEV, generator=g)
        xr = x.double()
        wr = w.double().requires_grad_()
        (dw_ref,) = torch.autograd.grad(F.conv2d(xr, wr, padding=1), wr, dy.double())
        wt = w.clone().requires_grad_()
        (dw_t,) = torch.autograd.grad(F.conv2d(x, wt, padding=1), wt, dy)
        e_t = _err(dw_t, dw_ref)
        row = dict(part="wgrad", shape=f"{n}x{c}x{h}x{w_}x{k}x3x3")
        xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
        row["torch_bwd_ms"] = do_bench(
            lambda: torch.autograd.grad(F.conv2d(xg, wg, padding=1), (xg, wg), dy), warmup=10, rep=50
        )
        row["dgrad_and_wgrad_ms"] = do_bench(
            lambda: kt.triton_conv2d_bwd(dy, x, w, True, 1, 1, 1, 1), warmup=10, rep=50
        )
        row["wgrad_ms"] = do_bench(
            lambda: kt.triton_conv2d_bwd(dy, x, w, False, 1, 1, 1, 1), warmup=10, rep=50
        )
        row["wgrad_err"] = round(_err(kt.triton_conv2d_bwd(dy, x, w, False, 1, 1, 1, 1)[1], dw_ref) / e_t, 3)
        xc = x.contiguous(memory_format=torch.channels_last)
        row["wgrad_cl_err"] = round(
            _err(kt.triton_conv2d_bwd(dy, xc, w, False, 1, 1, 1, 1)[1], dw_ref) / e_t, 3
        )
        row["wgrad_cl_ms"] = do_bench(
            lambda: kt.triton_conv2d_bwd(dy, xc, w, False, 1, 1, 1, 1), warmup=10, rep=50
        )
        row["copy_cl_ms"] = do_bench(
            lambda: x.contiguous(memory_format=torch.channels_last), warmup=10, rep=50
        )
        out({k_: round(v, 5) if isinstance(v, float) else v for k_, v in row.items()})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--parts", default="pad,wgrad")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    def out(row):
        print(json.dumps(row), flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(row) + "\n")

    parts = args.parts.split(",")
    if "pad" in parts:
        pad(out)
    if "wgrad" in parts:
        wgrad(out)


if __name__ == "__main__":
    main()
