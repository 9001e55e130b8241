"""softmax.cu's entries at the rows where v4's plan moved: resident in 1024 threads (l)
against streamed (o), forward and backward, beside the fp32 rows' compensated backward at
the plan's own choice. Each kernel is timed (CUDA events, L2 flushed) and judged against
the float64 reference; torch's times alongside. Prints a table; JSON rows to argv[1].

    python lab/softmax_long_rows.py [OUT.jsonl]
"""

import json
import sys
from pathlib import Path

import torch

from kernellab.harness.compare import judge
from kernellab.harness.timer import time_cuda
from kernellab.ops._elementwise_cuda import SUFFIX
from kernellab.ops.softmax import cuda as sc

SHAPES = [
    (torch.bfloat16, 2048, 32000),
    (torch.bfloat16, 4096, 20000),
    (torch.float32, 4096, 12000),
    (torch.float32, 3000, 7000),
    (torch.float32, 8192, 1000),
]


def main():
    out = []
    for dtype, rows, cols in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(0)
        x = (torch.randn(rows, cols, device="cuda", generator=g) * 3).to(dtype)
        dy = torch.randn(rows, cols, device="cuda", generator=g).to(dtype)
        y_t = torch.softmax(x, -1)
        y64 = torch.softmax(x.double(), -1)
        dx_t = torch.ops.aten._softmax_backward_data(dy, y_t, -1, dtype)
        y_t64 = y_t.double()
        dref = y_t64 * (dy.double() - (dy.double() * y_t64).sum(-1, keepdim=True))
        kind, threads, _ = sc.plan(4, cols, x.element_size(), True)
        npacks = cols // (16 // x.element_size())  # (every width here is a whole number of packs)
        cands = {(kind, threads)}
        if kind[0] in "lo":  # the l entry (where the row fits 4 x 1024 packs) and the streamed one
            if npacks <= sc.MAX_PACKS * sc.LONG_MAX_THREADS:
                cands.add(("lv", max(64, -(-npacks // (sc.MAX_PACKS * 32)) * 32)))
            cands.add(("ov", sc.STREAM_THREADS))
        shape = f"{rows}x{cols} {str(dtype)[6:]}"
        for name, f in (
            ("torch fwd", lambda: torch.softmax(x, -1)),
            ("torch bwd", lambda: torch.ops.aten._softmax_backward_data(dy, y_t, -1, dtype)),
        ):
            out.append(dict(shape=shape, config=name, ms=time_cuda(f, budget_s=0.4).median_ms))
        for k, t in sorted(cands):
            fwd = sc.MODULE.kernel(f"softmax_fwd_{k}_{SUFFIX[dtype]}", sc._FWD_SIG, 0)
            bwd = sc.MODULE.kernel(f"softmax_bwd_{k}_{SUFFIX[dtype]}", sc._BWD_SIG, 0)
            y, dx = torch.empty_like(x), torch.empty_like(x)

            def f_fwd(fwd=fwd, y=y, t=t):
                fwd(rows, t, x, y, rows, cols, device_index=0)
                return y

            def f_bwd(bwd=bwd, dx=dx, t=t):
                bwd(rows, t, y_t, dy, dx, rows, cols, device_index=0)
                return dx

            for d, f, ref, base in (("fwd", f_fwd, y64, y_t), ("bwd", f_bwd, dref, dx_t)):
                v = judge(f(), ref, dtype, base)
                ms = time_cuda(f, budget_s=0.4).median_ms
                plan = " (plan)" if k == kind else ""
                out.append(
                    dict(shape=shape, config=f"{d} {k} t{t}{plan}", ms=ms, ok=v.ok, err=v.err, bound=v.bound)
                )
        del x, dy, y_t, y64, dx_t, dref, y_t64
        torch.cuda.empty_cache()
    for r in out:
        r["gpu"] = torch.cuda.get_device_name()
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text("".join(json.dumps(r) + "\n" for r in out))
    for r in out:
        bad = "" if r.get("ok", True) else f"  WRONG {r['err']:.3g} > {r['bound']:.3g}"
        print(f"{r['shape']:18s} {r['config']:26s} {r['ms']:.4f} ms{bad}")


if __name__ == "__main__":
    main()
