"""matmul's Triton backend under torch.compile against eager, by dtype: forward output and
gradients of a small product (check's opcheck shape, 37x29 @ 29x45), and the backward's
own product alone (dz @ b^T, a transposed view) compiled, each as the max difference
from eager and from float64. Also opcheck's tests one at a time. Needs a GPU.

    PYTHONPATH=src python lab/gpu_compile_grad.py [--backends aot_eager,inductor]
"""

import argparse

import torch

import kernellab


def diff(x, y) -> float:
    return float((x.double() - y.double()).abs().max())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backends", default="aot_eager,inductor")
    args = ap.parse_args()
    torch.manual_seed(0)
    op = kernellab.registry.get("matmul", "triton").fn.op
    for dtype in (torch.float16, torch.bfloat16):
        a0 = torch.randn(37, 29, device="cuda").to(dtype)
        b0 = torch.randn(29, 45, device="cuda").to(dtype)
        g = torch.randn(37, 45, device="cuda").to(dtype)

        def step(fn):
            a, b = a0.clone().requires_grad_(), b0.clone().requires_grad_()
            y = fn(a, b)
            y.backward(g)
            return y.detach(), a.grad, b.grad

        def mm(a, b):
            return kernellab.matmul(a, b, backend="triton")

        ref = (a0.double() @ b0.double(), g.double() @ b0.double().t(), a0.double().t() @ g.double())
        eager = step(mm)
        print(dtype, "eager vs f64:", [round(diff(x, r), 4) for x, r in zip(eager, ref)], flush=True)
        for be in args.backends.split(","):
            for dyn in (False, True):
                torch._dynamo.reset()
                try:
                    got = step(torch.compile(mm, backend=be, dynamic=dyn))
                    print(dtype, be, "dynamic" if dyn else "static", "vs eager (y, da, db):",
                          [round(diff(x, e), 4) for x, e in zip(got, eager)], flush=True)  # fmt: skip
                except Exception as e:  # noqa: BLE001
                    print(dtype, be, dyn, "raised", repr(e)[:300], flush=True)
        # the backward's da product alone: dz [37, 45] @ b^T (b [29, 45] viewed as [45, 29])
        for dyn in (False, True):
            torch._dynamo.reset()
            f = torch.compile(lambda dz, b: kernellab.matmul(dz, b.t(), backend="triton"),
                              backend="aot_eager", dynamic=dyn)  # fmt: skip
            print(dtype, "dz @ b.t() aot_eager", "dynamic" if dyn else "static", "vs f64:",
                  round(diff(f(g, b0), g.double() @ b0.double().t()), 4), flush=True)  # fmt: skip
        for test in ("test_schema", "test_autograd_registration", "test_faketensor",
                     "test_aot_dispatch_static", "test_aot_dispatch_dynamic"):  # fmt: skip
            a, b = a0.clone().requires_grad_(), b0.clone().requires_grad_()
            try:
                torch.library.opcheck(op, (a, b, None, None), test_utils=test)
                print(dtype, test, "pass", flush=True)
            except Exception as e:  # noqa: BLE001
                print(dtype, test, "FAIL", str(e)[:200].replace("\n", " "), flush=True)


if __name__ == "__main__":
    main()
