"""Where fp32 matmul forward+backward spends its device time, kernel by kernel. Needs a GPU.

    PYTHONPATH=src python lab/gpu_mm_fwdbwd_profile.py [--json F] [--shapes MxNxK[t] ...]

For each shape (a trailing "t": b = W.t()), TF32 off: kernellab.matmul(backend="triton")
and torch.matmul, forward + backward 20 times under torch.profiler; each CUDA kernel's
launches and device time per iteration (us), and do_bench of the whole step (ms).
"""

import argparse
import json

import torch
from torch.profiler import ProfilerActivity, profile
from triton.testing import do_bench

import kernellab

SHAPES = ["64x128x3136", "256x10x128", "1x4097x4095", "4097x4095x1023t"]


def _step(fn, a, w, b_t, dz):
    def run():
        b = w.t() if b_t else w
        fn(a, b).backward(dz)

    return run


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--shapes", nargs="*", default=SHAPES)
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    fns = {"triton": lambda a, b: kernellab.matmul(a, b, backend="triton"), "torch": torch.matmul}
    for spec in args.shapes:
        b_t = spec.endswith("t")
        m, n, k = map(int, spec.rstrip("t").split("x"))
        g = torch.Generator(device="cuda").manual_seed(0)
        a = torch.randn(m, k, device="cuda", generator=g).requires_grad_()
        w = torch.randn((n, k) if b_t else (k, n), device="cuda", generator=g).requires_grad_()
        dz = torch.randn(m, n, device="cuda", generator=g)
        for name, fn in fns.items():
            step = _step(fn, a, w, b_t, dz)
            for _ in range(3):
                step()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(20):
                    step()
                torch.cuda.synchronize()
            kernels = {}
            for e in prof.events():
                if e.device_type == torch.autograd.DeviceType.CUDA:
                    c, t = kernels.get(e.name, (0, 0.0))
                    kernels[e.name] = (c + 1, t + e.device_time_total)
            row = dict(shape=spec, impl=name, step_ms=round(do_bench(step, warmup=10, rep=50), 5))
            row["kernels"] = sorted(
                ([nm[:90], c / 20, round(t / 20, 2)] for nm, (c, t) in kernels.items()), key=lambda r: -r[2]
            )
            print(json.dumps(row), flush=True)
            if args.json:
                with open(args.json, "a") as f:
                    f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
