"""rms_norm's forward+backward host cost through the C++ autograd node (kernellab/cuda/nodes.cpp).

Builds the extension (timed), checks the node against float64 at a few shapes (forward,
dx, dw; non-contiguous dy; both gradients and one), then paired plain-loop rounds
(``timer.paired_us``) of forward+backward against PyTorch's F.rms_norm: the cuda backend
with the node, the same backend with the node off (the Python node), the triton backend
and the default.

    PYTHONPATH=src python lab/probe_rms_cpp_node.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import kernellab
from kernellab.cuda import nodes
from kernellab.harness import timer


def _check(shape, dtype) -> str:
    x = torch.randn(*shape, device="cuda", dtype=dtype, requires_grad=True)
    w = (1 + 0.1 * torch.randn(shape[-1], device="cuda")).to(dtype).requires_grad_()
    dy = torch.randn(*shape, device="cuda", dtype=dtype)
    y = kernellab.rms_norm(x, w, backend="cuda_node")
    node = type(y.grad_fn).__name__
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    y64 = x64 * torch.rsqrt(x64.square().mean(-1, keepdim=True) + 1e-6) * w64
    dx64, dw64 = torch.autograd.grad(y64, (x64, w64), dy.double())
    yt = F.rms_norm(x, (shape[-1],), w, 1e-6)
    dxt, dwt = torch.autograd.grad(yt, (x, w), dy)
    errs = []
    for name, ours, ref, theirs in (("y", y, y64, yt), ("dx", dx, dx64, dxt), ("dw", dw, dw64, dwt)):
        e = (ours.double() - ref).abs().max().item()
        et = (theirs.double() - ref).abs().max().item()
        errs.append(f"{name} err {e:.2e} (torch {et:.2e})")
    # a transposed (non-contiguous) dy and a gradient of x only
    dyt = torch.randn(*shape[:-2], shape[-1], shape[-2], device="cuda", dtype=dtype).transpose(-1, -2)
    y2 = kernellab.rms_norm(x, w.detach(), backend="cuda_node")
    (dx2,) = torch.autograd.grad(y2, (x,), dyt)
    y64b = x64 * torch.rsqrt(x64.square().mean(-1, keepdim=True) + 1e-6) * w64.detach()
    (dx64b,) = torch.autograd.grad(y64b, (x64,), dyt.double())
    errs.append(f"dx(strided dy, x only) err {(dx2.double() - dx64b).abs().max().item():.2e}")
    return f"{'x'.join(map(str, shape))} {str(dtype)[6:]} node={node}: " + "; ".join(errs)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    args = p.parse_args()
    t0 = time.time()
    nodes.build()
    print(f"build/load of the extension: {time.time() - t0:.1f} s", flush=True)
    for shape, dtype in (((64, 256), torch.bfloat16), ((4, 33, 4096), torch.bfloat16),
                         ((1000, 768), torch.float32), ((7, 1024), torch.float16)):  # fmt: skip
        print(_check(shape, dtype), flush=True)
    rows = []
    for shape in ((64, 256), (8, 4096), (1024, 2048)):
        dev, bf = "cuda", torch.bfloat16
        x = torch.randn(*shape, device=dev, dtype=bf, requires_grad=True)
        w = (1 + 0.1 * torch.randn(shape[-1], device=dev)).to(bf).requires_grad_()
        dy = torch.randn(*shape, device=dev, dtype=bf)

        def fb(f):
            return lambda: torch.autograd.grad(f(x, w), (x, w), dy)

        cases = {
            "torch": fb(lambda x, w: F.rms_norm(x, (shape[-1],), w, 1e-6)),
            "cuda_node (C++ node)": fb(lambda x, w: kernellab.rms_norm(x, w, backend="cuda_node")),
            "cuda (Python node)": fb(lambda x, w: kernellab.rms_norm(x, w, backend="cuda")),
            "triton": fb(lambda x, w: kernellab.rms_norm(x, w, backend="triton")),
            "default": fb(lambda x, w: kernellab.rms_norm(x, w)),
        }
        for f in cases.values():
            f()
        torch.cuda.synchronize()
        got = timer.paired_us(cases, lambda k: "torch", 11)
        for k, r in got.items():
            if isinstance(r, Exception):
                print(f"{'x'.join(map(str, shape))} {k:20s} error {r!r}")
                continue
            print(
                f"{'x'.join(map(str, shape)):10s} {k:20s} {r[0]:8.1f} us  {r[1]:5.2f}x torch fwd+bwd",
                flush=True,
            )
            sh = "x".join(map(str, shape))
            rows.append({"op": "rms_norm", "mode": "fwdbwd", "shape": sh, "dtype": "bf16", "case": k, "loop_us": round(r[0], 2),
                         "vs_torch": round(r[1], 3), "gpu": torch.cuda.get_device_name()})  # fmt: skip
    if args.out:
        path = Path(args.out) / "probe_rms_cpp_node.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
