"""Host cost of linear_cross_entropy at small shapes (GPU): per call in a plain loop
(forward under no_grad, forward+backward), the CUDA kernels a call launches (torch
profiler), and where the Python time of the triton backends goes (cProfile).

    PYTHONPATH=src python lab/probe_lce_host.py [--out FILE.jsonl] [--profile]
"""

from __future__ import annotations

import argparse
import json

import torch

import kernellab  # noqa: F401
from kernellab.harness import timer
from kernellab.harness.bench import git_sha, versions
from kernellab.ops.linear_cross_entropy import linear_cross_entropy as lce

SHAPES = [(64, 64, 256), (256, 768, 50304), (1024, 768, 50304)]
BACKENDS = ["torch", "triton", "triton_rows", "chunked", "liger"]


def make(shape, dev="cuda", dtype=torch.bfloat16):
    n, h, v = shape
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(n, h, device=dev, dtype=dtype, generator=g).requires_grad_(True)
    w = (torch.randn(v, h, device=dev, dtype=dtype, generator=g) * 0.05).requires_grad_(True)
    t = torch.randint(0, v, (n,), device=dev, generator=g)
    return x, w, t


def fns(backend, x, w, t):
    def fwd():
        with torch.no_grad():
            return lce(x, w, t, backend=backend)

    def fwdbwd():
        return torch.autograd.grad(lce(x, w, t, backend=backend), (x, w))

    return {"fwd": fwd, "fwdbwd": fwdbwd}


def kernels(fn) -> int:
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--backends", nargs="+", default=BACKENDS)
    a = ap.parse_args()
    meta = {"gpu": torch.cuda.get_device_name(), "git_sha": git_sha(), **versions()}
    for shape in SHAPES:
        x, w, t = make(shape)
        for b in a.backends:
            for mode, fn in fns(b, x, w, t).items():
                try:
                    us = timer.loop_ms(fn, 200) * 1e3
                    k = kernels(fn)
                except Exception as e:  # noqa: BLE001
                    print(f"{b} {mode} {shape}: {type(e).__name__}: {str(e)[:200]}")
                    continue
                row = {**meta, "bench": "lce_host", "backend": b, "mode": mode, "dtype": "bf16",
                       "shape": "x".join(map(str, shape)), "us_per_call": round(us, 2), "cuda_kernels": k}
                print(f"{row['shape']:>16} {mode:7} {b:12} {us:9.1f} us/call  {k:3d} kernels")
                if a.out:  # row by row: a step cut short by its timeout keeps what it timed
                    with open(a.out, "a") as f:
                        f.write(json.dumps(row) + "\n")
    if a.profile:
        from probe_host import print_cprofile  # (lab/, the script's own folder)

        x, w, t = make(SHAPES[0])
        for b in ("torch", "triton", "triton_rows"):
            print_cprofile(f"{b} fwdbwd 64x64x256, 100 calls", fns(b, x, w, t)["fwdbwd"], 100, 25)

if __name__ == "__main__":
    main()
