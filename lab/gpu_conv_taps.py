"""conv2d fp32 forward, Triton, a filter tap at a time (issue 43: H100 fp32 forward 0.42-0.51x
cuDNN at the MNIST layers with C = 32 and the 56x56x64 layer; ours 13 TFLOP/s, cuDNN's
without TF32 27-30).

The tap kernel is now src's (``ops/conv2d/triton.py`` ``_conv_fwd_taps_kernel``, planned
by ``fwd_plan``: 128x64x16, 4 warps, fp32 two-level sums at C >= 16, fp32 only); this
times it at other tiles and in bf16 (``--dtype bf16``) beside the GEMM kernel and cuDNN.

The GEMM kernel (ops/conv2d/triton.py ``_conv_fwd_kernel``) reduces over (c, r, s)
in that order: every A element's address needs the index split j -> (c, r, s) and its own
bounds test. Here the reduction runs a tap (r, s) at a time with channels innermost: each
output row's input position and bounds are computed once a tap, a tile's addresses are
that row offset plus the channel's. Compiled for sm_90 on a CPU (`kernellab asm`'s path,
Triton 3.9): the inner loop's FFMA share 0.57 -> 0.65-0.72, spills 29 LDL/STL -> 8-9 at
64x64x32 with 8 warps or 128x64x16 with 8 warps. Whether that is time is for the GPU.

Variants: the registered kernel; the tap kernel at several tiles; with fp32 per-block dots
summed in fp64 (ACC64, as the registered one) or in fp32 (``two_level``: fewer registers,
more error). Each is judged first: its max error against float64 over cuDNN's own (fp32,
TF32 off), the check's rule (<= 2x); a wrong or too-inaccurate variant is reported, not
timed.

    python lab/gpu_conv_taps.py OUT.jsonl [--dtype bf16]   # GPU: every shape, variant, cuDNN
    python lab/gpu_conv_taps.py --cpu-check        # the interpreter: arithmetic only
"""

from __future__ import annotations

import argparse
import json
import os
import sys

if "--cpu-check" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"

import torch

from kernellab import triton_support
from kernellab.ops.conv2d import triton as kt
from kernellab.ops.conv2d.geometry import out_size

SHAPES = [(b, 32, 14, 14, 64, 3, 3) for b in (64, 256, 1024)] + [(32, 64, 56, 56, 64, 3, 3)]
SHAPES += [(b, 1, 28, 28, 32, 3, 3) for b in (64, 1024)]  # C = 1: the tap kernel's dots are 16 deep
# (BLOCK_M, BLOCK_N, BLOCK_K, warps, ACC64)
TILES = [(64, 64, 32, 4, True), (64, 64, 32, 8, True), (128, 64, 32, 8, True), (128, 64, 16, 8, True),
         (64, 64, 16, 4, True), (128, 64, 16, 4, False), (128, 128, 16, 8, False), (64, 64, 32, 4, False)]


def taps_fwd(x, w, bias, stride, padding, tiles):
    bm, bn, bk, warps, acc64 = tiles
    n, c, h, wd = x.shape
    k, _, r, s = w.shape
    (sh, sw), (ph, pw) = stride, padding
    p, q = out_size(h, wd, r, s, stride, padding)
    y = torch.empty((n, k, p, q), dtype=x.dtype, device=x.device)
    m = n * p * q
    if x.device.type != "cuda":  # (the interpreter pays per element: smaller tiles)
        bm, bn, bk = min(bm, 32), min(bn, 32), min(bk, 16)
    grid = (triton_support.cdiv(m, bm) * triton_support.cdiv(k, bn),)
    consts = kt._consts(x)
    kt._conv_fwd_taps_kernel[grid](
        x, w, bias if bias is not None else y, y, c, h, wd, k, p, q, r, s, m, *x.stride(), sh, sw, ph, pw,
        HAS_BIAS=bias is not None, ACC64=acc64 and x.dtype == torch.float32, BLOCK_M=bm, BLOCK_N=bn,
        BLOCK_K=bk, num_warps=warps, **consts,
    )  # fmt: skip
    return y


def _inputs(shape, device, dtype=torch.float32, seed=0):
    n, c, h, wd, k, r, s = shape
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(n, c, h, wd, generator=g, device=device).to(dtype)
    w = (torch.randn(k, c, r, s, generator=g, device=device) / (c * r * s) ** 0.5).to(dtype)
    b = torch.randn(k, generator=g, device=device).to(dtype)
    return x, w, b


def cpu_check() -> int:
    """The tap kernel against float64 under the interpreter: odd sizes, strides, padding,
    channels_last x, no bias, C not a multiple of the dot depth."""
    cases = [((2, 3, 5, 7, 4, 3, 3), (1, 1), (1, 1)), ((1, 17, 9, 8, 6, 3, 3), (2, 1), (1, 2)),
             ((2, 20, 6, 6, 5, 5, 5), (1, 1), (2, 2)), ((1, 16, 7, 7, 33, 1, 1), (1, 1), (0, 0)),
             ((1, 5, 4, 9, 3, 3, 5), (3, 2), (0, 1))]  # fmt: skip
    bad = 0
    for shape, stride, padding in cases:
        x, w, b = _inputs(shape, "cpu")
        for xx, bias in ((x, b), (x.to(memory_format=torch.channels_last), None)):
            ref = torch.nn.functional.conv2d(xx.double(), w.double(), None if bias is None else bias.double(),
                                             stride, padding)  # fmt: skip
            for tiles in ((64, 64, 32, 4, True), (64, 64, 32, 4, False)):
                y = taps_fwd(xx, w, bias, stride, padding, tiles)
                err = float((y.double() - ref).abs().max())
                ok = err <= 1e-5 * max(1.0, float(ref.abs().max()))
                bad += not ok
                print(f"{'ok ' if ok else 'BAD'} {shape} stride {stride} pad {padding} "
                      f"{'NHWC' if xx.stride(1) == 1 else 'NCHW'} acc64 {tiles[4]}: max error {err:.2e}")
    return 1 if bad else 0


def gpu(out: str, dtype: torch.dtype = torch.float32) -> int:
    from kernellab.harness import timer
    from kernellab.harness.bench import git_sha, versions

    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    meta = {"git_sha": git_sha(), **versions(), "gpu": torch.cuda.get_device_name()}
    fh = open(out, "a")
    for shape in SHAPES:
        x, w, b = _inputs(shape, "cuda", dtype)
        n, c, h, wd, k, r, s = shape
        flops = 2 * n * k * h * wd * c * r * s
        ref = torch.nn.functional.conv2d(x.double(), w.double(), b.double(), 1, 1)
        tag = "" if dtype == torch.float32 else f" {dtype}"
        cudnn = lambda: torch.nn.functional.conv2d(x, w, b, 1, 1)  # noqa: E731
        e_cudnn = float((cudnn().double() - ref).abs().max())
        runs = {"cudnn": (cudnn, e_cudnn),
                "registered": (lambda: kt.triton_conv2d_fwd(x, w, b, 1, 1, 1, 1), None)}  # fmt: skip
        for t in TILES:
            name = f"taps {t[0]}x{t[1]}x{t[2]} w{t[3]} {'acc64' if t[4] else 'fp32'}"
            runs[name] = (lambda t=t: taps_fwd(x, w, b, (1, 1), (1, 1), t), None)
        base = None
        for name, (fn, err) in runs.items():
            try:
                err = float((fn().double() - ref).abs().max()) if err is None else err
            except Exception as e:  # noqa: BLE001 - a variant that does not compile is reported
                print(f"{shape} {name}: FAILED {type(e).__name__}: {str(e)[-200:]}")
                continue
            ratio = err / e_cudnn if e_cudnn > 0 else float("inf")
            ms = None
            if ratio <= 2.0 or name == "cudnn":
                ms = timer.time_cuda(fn, budget_s=0.4).median_ms
                base = ms if name == "cudnn" else base
            row = {"shape": list(shape), "dtype": str(dtype).split(".")[-1], "variant": name, "error": err,
                   "error_over_cudnn": ratio,
                   "median_ms": ms, "tflops": flops / ms / 1e9 if ms else None,
                   "vs_cudnn": base / ms if ms and base else None}  # fmt: skip
            fh.write(json.dumps({**row, **meta}) + "\n")
            fh.flush()
            timed = "not timed"
            if ms:
                timed = f"{ms:8.4f} ms {row['tflops']:6.1f} TFLOP/s {row['vs_cudnn']:.2f}x cuDNN"
            print(f"{'x'.join(map(str, shape)):22s}{tag} {name:28s} err/cuDNN {ratio:5.2f} {timed}")
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?")
    ap.add_argument("--cpu-check", action="store_true")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    a = ap.parse_args()
    if a.cpu_check:
        raise SystemExit(cpu_check())
    if not a.out:
        ap.error("OUT.jsonl is needed on the GPU")
    raise SystemExit(gpu(a.out, torch.float32 if a.dtype == "fp32" else torch.bfloat16))
