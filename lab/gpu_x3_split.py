"""triton_x3's fp32 products with the operands split into TF32 heads and rests ahead of the
kernel ("x3s", forced at every shape here; the library's choice: X3_SPLIT_MIN_WORK and
X3_SPLIT_MIN_MN) against the split in registers ("x3"), beside torch (cuBLAS, TF32 off).
Needs a GPU.

    PYTHONPATH=src python lab/gpu_x3_split.py [--json F] [--fwdbwd]

Per shape (M, N, K) and layout (nn: b [K, N] row-major; nt: b = W.t(), a linear's forward):
do_bench medians (ms, L2 flushed), TFLOP/s, the max error against float64 as a ratio to
torch's, and whether x3 and x3s give the same bits. --fwdbwd: also forward + backward
through the autograd op (the backward's products take the same path).
"""

import argparse
import json

import torch
from triton.testing import do_bench

import kernellab
from kernellab.ops.matmul import triton as tm

SHAPES = [(4097, 4095, 1023), (8192, 768, 768), (8192, 768, 3072), (8192, 2304, 768), (8192, 3072, 768),
          (3000, 3000, 3000), (4096, 4096, 4096)]  # fmt: skip
FWDBWD = [(4097, 4095, 1023), (8192, 768, 3072)]


class _variant:
    """x3 (no split ahead) or x3s (split ahead at every shape of TUNE_MIN_WORK and up)."""

    def __init__(self, name: str):
        self.name = name

    def __enter__(self):
        self.saved = tm.X3_SPLIT_MIN_WORK, tm.X3_SPLIT_MIN_MN
        tm.X3_SPLIT_MIN_WORK = 1 << 62 if self.name == "x3" else tm.TUNE_MIN_WORK
        tm.X3_SPLIT_MIN_MN = 0

    def __exit__(self, *exc):
        tm.X3_SPLIT_MIN_WORK, tm.X3_SPLIT_MIN_MN = self.saved


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--fwdbwd", action="store_true")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False

    def out(row):
        print(json.dumps(row), flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(row) + "\n")

    for m, n, k in SHAPES:
        for layout in ("nn", "nt"):
            g = torch.Generator(device="cuda").manual_seed(0)
            a = torch.randn(m, k, device="cuda", generator=g)
            b = torch.randn(k, n, device="cuda", generator=g) if layout == "nn" else torch.randn(
                n, k, device="cuda", generator=g).t()  # fmt: skip
            ref = a.double() @ b.double()
            e_t = float(((a @ b).double() - ref).abs().max())
            row = dict(shape=[m, n, k], layout=layout, ms={}, tflops={}, err_ratio={})
            row["ms"]["torch"] = round(do_bench(lambda: a @ b), 5)
            ys = {}
            for name in ("x3", "x3s"):
                with _variant(name):
                    run = lambda: kernellab.matmul(a, b, backend="triton_x3")  # noqa: E731
                    ys[name] = run()
                    row["ms"][name] = round(do_bench(run), 5)
                    row["err_ratio"][name] = round(float((ys[name].double() - ref).abs().max()) / e_t, 3)
            row["same_bits"] = bool(torch.equal(ys["x3"], ys["x3s"]))
            row["tflops"] = {v: round(2 * m * n * k / t / 1e9, 1) for v, t in row["ms"].items()}
            out(row)
    if not args.fwdbwd:
        return
    for m, n, k in FWDBWD:
        g = torch.Generator(device="cuda").manual_seed(1)
        a = torch.randn(m, k, device="cuda", generator=g, requires_grad=True)
        w = torch.randn(n, k, device="cuda", generator=g, requires_grad=True)
        dy = torch.randn(m, n, device="cuda", generator=g)
        row = dict(shape=[m, n, k], layout="nt", mode="fwdbwd", ms={})

        def step(backend):
            y = kernellab.matmul(a, w.t(), backend=backend) if backend else a @ w.t()
            y.backward(dy)

        row["ms"]["torch"] = round(do_bench(lambda: step(None), grad_to_none=[a, w]), 5)
        for name in ("x3", "x3s"):
            with _variant(name):
                row["ms"][name] = round(do_bench(lambda: step("triton_x3"), grad_to_none=[a, w]), 5)
        out(row)


if __name__ == "__main__":
    main()
