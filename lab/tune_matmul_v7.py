"""Tile-shape sweep for the fp32 warp-tiling kernel (matmul.cu, v7_body) on a GPU.

Times every `matmul_v7s_*` instantiation (name: BM x BN x BK, warps M x N) beside the
shipped `matmul_v7_f32` and cuBLAS (TF32 off) at 4096^3 and 8192^3 (CUDA events, L2 flushed,
median), after judging each against the float64 reference at 4096^3 and at 1000x1023x997
(the guarded scalar path). Prints a table; JSON rows to argv[1].

    python lab/tune_matmul_v7.py OUT.jsonl
"""

import json
import re
import sys

import torch

torch.backends.cuda.matmul.allow_tf32 = False

from kernellab.cuda.runtime import Module  # noqa: E402
from kernellab.harness.compare import judge  # noqa: E402
from kernellab.harness.timer import time_cuda  # noqa: E402
from kernellab.ops.matmul.cuda import MODULE as LIB  # noqa: E402

# matmul.cu with the candidate instantiations switched on
MODULE = Module(LIB.path, options=["-DKL_V7_CANDIDATES"])

# KL_V7_KERNEL(name, BM, BN, BK, WARPS_M, WARPS_N, MIN_BLOCKS) lines of matmul.cu
MACRO = re.compile(r"^KL_V7_KERNEL\((\w+), (\d+), (\d+), \d+, (\d+), (\d+), \d+\)", re.M)


def candidates():
    """name -> (BM, BN, threads) of every instantiation, the shipped matmul_v7_f32 included."""
    return {
        name: (int(bm), int(bn), 32 * int(wm) * int(wn))
        for name, bm, bn, wm, wn in MACRO.findall(MODULE.source)
    }


def launch(name, bm, bn, threads, a, b, c, vec):
    m, k = a.shape
    n = b.shape[1]
    kern = MODULE.kernel(name, ("ptr", "ptr", "ptr", "i32", "i32", "i32", "i32"), 0)
    kern((-(-n // bn), -(-m // bm), 1), threads, a, b, c, m, n, k, vec, device_index=0)
    return c


def main():
    rows = []
    for name, (bm, bn, threads) in candidates().items():
        ok = True
        for m, n, k in ((1000, 1023, 997), (4096, 4096, 4096)):
            g = torch.Generator(device="cuda").manual_seed(m)
            a = torch.randn(m, k, device="cuda", generator=g)
            b = torch.randn(k, n, device="cuda", generator=g)
            c = torch.empty(m, n, device="cuda")
            vec = int(k % 4 == 0 and n % 4 == 0)
            v = judge(
                launch(name, bm, bn, threads, a, b, c, vec), a.double() @ b.double(), torch.float32, a @ b
            )
            ok = ok and v.ok
            if not v.ok:
                print(f"{name} {m}x{n}x{k}: WRONG {v.detail}", flush=True)
        for s in (4096, 8192):
            a = torch.randn(s, s, device="cuda")
            b = torch.randn(s, s, device="cuda")
            c = torch.empty(s, s, device="cuda")
            t = time_cuda(lambda: launch(name, bm, bn, threads, a, b, c, 1), budget_s=1.0)
            tc = time_cuda(lambda: a @ b, budget_s=1.0)
            tf = 2 * s**3 / t.median_ms / 1e9
            row = dict(
                config=name,
                size=s,
                ms=t.median_ms,
                tflops=tf,
                cublas_ms=tc.median_ms,
                pct_cublas=100 * tc.median_ms / t.median_ms,
                ok=ok,
            )
            rows.append(row)
            print(
                f"{name:34s} {s:5d}  {t.median_ms:8.3f} ms  {tf:5.1f} TF/s  "
                f"{row['pct_cublas']:5.1f}% of cuBLAS ({tc.median_ms:.3f} ms)  {'ok' if ok else 'WRONG'}",
                flush=True,
            )
            del a, b, c
    if len(sys.argv) > 1:
        with open(sys.argv[1], "a") as f:
            for r in rows:
                f.write(json.dumps(dict(r, gpu=torch.cuda.get_device_name())) + "\n")


if __name__ == "__main__":
    main()
