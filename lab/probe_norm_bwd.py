"""The Triton layer_norm / rms_norm backward at model shapes (GPT-2, Llama), against
PyTorch's own backward kernel, on a GPU: device time per call of

- ``torch``: aten's native_layer_norm_backward (layer_norm) / the fused rms_norm backward
  (rms_norm, where this torch has one; else autograd of F.rms_norm);
- ``norm_bwd``: kernellab's launcher (the row kernel + the dweight/dbias partial sum),
  for Config.bwd_programs_per_sm x bwd_warps (the shipped choice marked);
- ``kernel``: the row kernel alone and ``psum``: the partial sum alone, at the shipped knobs.

    PYTHONPATH=src python lab/probe_norm_bwd.py --out DIR [--shapes 1024x768 ...] [--dtype bf16]
        [--prefetch 1,0] [--acc64 4096,2048] [--ops layer_norm,rms_norm]

``--prefetch`` and ``--acc64`` sweep Config.bwd_prefetch and acc64_max_block too (fp32 rows of
4096 at 16 warps hold fp64 partials and a prefetched row: `kernellab asm rms_norm -b triton
--dtype fp32` counts 67 LDL/STL there; 2048 makes their partials fp32, at most bwd_max_rows
rows a program).

Device time is CUDA-graph replay (``harness.timer.time_cuda_graph``: 20 calls a graph,
no L2 flush, as inside a model step). The first run (d3b8e12) used ``do_bench``, whose
per-call numbers at GPT-2 sizes were the Python launch, not the kernels. Rows ->
DIR/probe_norm_bwd.jsonl (appended as measured).
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

import torch
import triton

import kernellab.ops.norm_kernels.triton_kernels as lt
from kernellab.harness import timer
from kernellab.harness.bench import git_sha

SHAPES = ["1024x768", "8192x768", "16384x768", "4096x4096", "16384x4096"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--shapes", nargs="+", default=SHAPES)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--prefetch", default="1", help="Config.bwd_prefetch values (1 / 0), comma-separated")
    ap.add_argument("--acc64", default=str(lt.CONFIG.acc64_max_block),
                    help="Config.acc64_max_block values, comma-separated")  # fmt: skip
    ap.add_argument("--ops", default="layer_norm,rms_norm")
    args = ap.parse_args()
    prefetches = [bool(int(v)) for v in args.prefetch.split(",")]
    acc64s = [int(v) for v in args.acc64.split(",")]
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    fh = open(out / "probe_norm_bwd.jsonl", "a")
    meta = dict(gpu=torch.cuda.get_device_name(), git_sha=git_sha(), dtype=args.dtype)
    meta.update(torch=torch.__version__, triton=triton.__version__, time=time.strftime("%Y-%m-%d %H:%M:%S"))
    shipped = (lt.CONFIG.bwd_programs_per_sm, lt.CONFIG.bwd_warps)

    def record(**row):
        row = {**meta, **row}
        fh.write(json.dumps(row) + "\n")
        fh.flush()
        print(json.dumps({k: v for k, v in row.items() if k not in meta}), flush=True)

    def bench(fn):
        return timer.time_cuda_graph(fn).median_ms

    for shape in args.shapes:
        n, d = (int(s) for s in shape.split("x"))
        gen = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(n, d, device="cuda", generator=gen).to(dtype)
        dy = torch.randn(n, d, device="cuda", generator=gen).to(dtype)
        w = (1 + 0.1 * torch.randn(d, device="cuda", generator=gen)).to(dtype)
        b = (0.1 * torch.randn(d, device="cuda", generator=gen)).to(dtype)
        for rms in (False, True):
            op = "rms_norm" if rms else "layer_norm"
            if op not in args.ops.split(","):
                continue
            bias = None if rms else b
            _, mean, rstd = lt.norm_fwd(x, w, bias, 1e-5, rms)
            try:
                if rms:
                    xg = x.detach().requires_grad_()
                    wg = w.detach().requires_grad_()
                    y = torch.nn.functional.rms_norm(xg, (d,), wg, 1e-5)

                    def tb():
                        return torch.autograd.grad(y, (xg, wg), dy, retain_graph=True)
                else:
                    _, tmean, trstd = torch.ops.aten.native_layer_norm(x, [d], w, b, 1e-5)

                    def tb():
                        return torch.ops.aten.native_layer_norm_backward(
                            dy, x, [d], tmean, trstd, w, b, [True, True, True]
                        )

                record(op=op, shape=shape, impl="torch", ms=bench(tb))
            except Exception as e:  # noqa: BLE001 - reported in its row
                record(op=op, shape=shape, impl="torch", error=f"{type(e).__name__}: {e}"[:200])
            knobs = itertools.product((1, 2, 4, 8), (None, 4, 8), prefetches, acc64s)
            for per_sm, warps, prefetch, acc64 in knobs:
                cfg = lt.Config(bwd_programs_per_sm=per_sm, bwd_warps=warps, bwd_prefetch=prefetch,
                                acc64_max_block=acc64)  # fmt: skip
                ms = bench(lambda cfg=cfg: lt.norm_bwd(dy, x, w, mean, rstd, rms, not rms, cfg=cfg))
                dwx = lt.norm_bwd(dy, x, w, mean, rstd, rms, not rms, cfg=cfg)[1]
                dw0 = lt.norm_bwd(dy, x, w, mean, rstd, rms, not rms)[1]
                record(op=op, shape=shape, impl="norm_bwd", per_sm=per_sm, warps=warps, prefetch=prefetch,
                       acc64_max_block=acc64, ms=ms, dw_diff_from_default=float((dwx.float() - dw0.float()).abs().max()),
                       shipped=(per_sm, warps) == shipped and prefetch == lt.CONFIG.bwd_prefetch
                       and acc64 == lt.CONFIG.acc64_max_block)  # fmt: skip
            # the partial sum alone, at the shipped knobs
            programs = lt._bwd_programs(n, lt._row_block(x.shape[-1]), x.device)
            programs = triton.cdiv(n, triton.cdiv(n, programs))
            part = torch.randn((2, programs, d), device="cuda")
            dw, db = torch.empty_like(w), torch.empty_like(w)
            bp, bc = lt._psum_config(programs, d)

            def psum():
                lt._partials_sum_kernel[(triton.cdiv(d, bc),)](
                    part[0], part[1], dw, db, programs, d, HAS_DB=not rms, BLOCK_P=bp, BLOCK_C=bc, num_warps=4
                )

            record(op=op, shape=shape, impl="psum", programs=programs, block_p=bp, block_c=bc, ms=bench(psum))
            ref = part[0].sum(0)
            psum()
            record(op=op, shape=shape, impl="psum_check", max_diff=float((dw.float() - ref).abs().max()))
    fh.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
