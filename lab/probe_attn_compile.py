"""Why Inductor fails to compile Triton attention registered as a triton_op.

Run on a GPU with KERNELLAB_ATTN_TRITON_OP=1 (the op is a custom_op otherwise). Compiles
attention forward (+ backward) with fullgraph=True at a few shapes and dtypes, one case
per subprocess-free try, prints each failure's traceback tail and, with --out, writes
Inductor's generated code of the failing case there (TORCH_LOGS=output_code is set by the
caller when wanted).

  KERNELLAB_ATTN_TRITON_OP=1 python lab/probe_attn_compile.py --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import time
import traceback

import torch


def one(b, h, t, d, dtype, causal, backward, dynamic):
    import kernellab

    torch._dynamo.reset()
    q, k, v = (
        torch.randn(b, h, t, d, device="cuda", dtype=dtype, requires_grad=backward) for _ in range(3)
    )

    def f(q, k, v):
        return kernellab.attention(q, k, v, causal=causal, backend="triton")

    cf = torch.compile(f, fullgraph=True, dynamic=dynamic)
    out = cf(q, k, v)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.detach().float(), k.detach().float(), v.detach().float(), is_causal=causal
    )
    err = (out.float() - ref).abs().max().item()
    gerr = None
    if backward:
        out.float().square().sum().backward()
        qd, kd, vd = (x.detach().float().requires_grad_() for x in (q, k, v))
        torch.nn.functional.scaled_dot_product_attention(qd, kd, vd, is_causal=causal).square().sum().backward()
        gerr = max((a.grad.float() - r.grad).abs().max().item() for a, r in ((q, qd), (k, kd), (v, vd)))
    return err, gerr


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import kernellab.ops.attention.triton as at

    print("attention op:", type(at._attention.ops[0]).__name__, at._attention.ops[0])
    cases = [
        (4, 12, 256, 64, torch.bfloat16, True, False, False),
        (4, 12, 256, 64, torch.bfloat16, True, True, False),
        (2, 4, 128, 64, torch.float32, True, True, False),
        (4, 12, 256, 64, torch.bfloat16, True, True, None),
        (8, 12, 1024, 64, torch.bfloat16, True, True, False),
    ]
    rows = []
    for c in cases:
        t0 = time.perf_counter()
        try:
            err, gerr = one(*c)
            row = dict(case=str(c), ok=True, err=err, grad_err=gerr)
        except Exception as e:  # noqa: BLE001 - the point is to see it
            tb = traceback.format_exc()
            row = dict(case=str(c), ok=False, error=f"{type(e).__name__}: {str(e)[:3000]}", tb=tb[-6000:])
        row["s"] = round(time.perf_counter() - t0, 1)
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "tb"})[:4000], flush=True)
        if not row["ok"]:
            print(row["tb"], flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "probe_attn_compile.json"), "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
