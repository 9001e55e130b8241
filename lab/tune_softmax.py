"""Tuning sweep for softmax.cu's register-resident rows at the issue's bench shape.

Knobs: KL_SOFTMAX_PACKS (16-byte packs a thread keeps in registers) and the threads per
row block (packs x threads x elements per pack must cover the row). Each config's forward
and backward kernels are timed (CUDA events, L2 flushed) beside torch, torch.compile and
the shipped `cuda` backend in the same process, and judged against the float64 reference.
Prints a table; JSON rows to argv[1].

    python lab/tune_softmax.py OUT.jsonl
"""

import json
import sys
from pathlib import Path

import torch

import kernellab
from kernellab.cuda.runtime import Module
from kernellab.harness.compare import judge
from kernellab.harness.timer import time_cuda
from kernellab.ops._elementwise_cuda import SUFFIX

CU = Path(kernellab.__file__).parent / "ops" / "softmax" / "softmax.cu"
ROWS, COLS = 32768, 4096


def main():
    rows_out = []
    for dtype in (torch.float32, torch.bfloat16):
        g = torch.Generator(device="cuda").manual_seed(0)
        x = (torch.randn(ROWS, COLS, device="cuda", generator=g) * 3).to(dtype)
        dy = torch.randn(ROWS, COLS, device="cuda", generator=g).to(dtype)
        y_t = torch.softmax(x, -1)
        ref = torch.softmax(x.double(), -1)
        dx_t = torch.ops.aten._softmax_backward_data(dy, y_t, -1, dtype)
        y64 = ref
        dref = y64 * (dy.double() - (dy.double() * y64).sum(-1, keepdim=True))
        comp = torch.compile(lambda t: torch.softmax(t.float(), -1).to(t.dtype), dynamic=False)
        base = {
            "torch fwd": lambda: torch.softmax(x, -1),
            "compile fwd": lambda: comp(x),
            "cuda fwd": lambda: kernellab.softmax(x, backend="cuda"),
            "torch bwd": lambda: torch.ops.aten._softmax_backward_data(dy, y_t, -1, dtype),
        }
        for name, f in base.items():
            t = time_cuda(f, budget_s=0.5)
            rows_out.append(dict(dtype=str(dtype)[6:], config=name, ms=t.median_ms))
        n = 16 // x.element_size()
        npacks = COLS // n
        for packs in (2, 4, 8):
            mod = Module(CU, options=[f"-DKL_SOFTMAX_PACKS={packs}"])
            for threads in (128, 256, 512):
                if packs * threads < npacks:
                    continue
                fwd = mod.kernel(f"softmax_fwd_rv_{SUFFIX[dtype]}", ("ptr", "ptr", "i64", "i32"), 0)
                bwd = mod.kernel(f"softmax_bwd_rv_{SUFFIX[dtype]}", ("ptr", "ptr", "ptr", "i64", "i32"), 0)
                y = torch.empty_like(x)
                dx = torch.empty_like(x)

                def f_fwd(fwd=fwd, y=y, threads=threads):
                    fwd(ROWS, threads, x, y, ROWS, COLS, device_index=0)
                    return y

                def f_bwd(bwd=bwd, dx=dx, threads=threads):
                    bwd(ROWS, threads, y_t, dy, dx, ROWS, COLS, device_index=0)
                    return dx

                for kind, f, r, b in (("fwd", f_fwd, ref, y_t), ("bwd", f_bwd, dref, dx_t)):
                    v = judge(f(), r, dtype, b)
                    t = time_cuda(f, budget_s=0.4)
                    rows_out.append(
                        dict(
                            dtype=str(dtype)[6:],
                            config=f"{kind} packs{packs} t{threads}",
                            ms=t.median_ms,
                            ok=v.ok,
                        )
                    )
        del x, dy, y_t, ref, dx_t, dref
        torch.cuda.empty_cache()
    for r in rows_out:
        r["gpu"] = torch.cuda.get_device_name()
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text("".join(json.dumps(r) + "\n" for r in rows_out))
    for r in rows_out:
        print(f"{r['dtype']:9s} {r['config']:22s} {r['ms']:.4f} ms{'' if r.get('ok', True) else '  WRONG'}")


if __name__ == "__main__":
    main()
