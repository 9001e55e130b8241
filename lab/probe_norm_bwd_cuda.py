"""The CUDA v2 layer_norm / rms_norm backward (norms.cu, the launcher the C++ node shares)
against the Triton one at model shapes: where its device time goes, and which launch knobs
would close the gap (issue 43, norm backwards).

    PYTHONPATH=src python lab/probe_norm_bwd_cuda.py --out DIR [--shapes 8192x768 ...] [--dtype bf16]

Per shape, device time (kernellab's timer: L2 flushed, the device held while the host
queues) of
- ``triton``: triton_kernels.norm_bwd at its shipped config (kernel + partial sums);
- ``cuda bps=B t=T``: cuda_kernels' backward launcher with BWD_BLOCKS_PER_SM = B and the
  packs-per-thread target T (threads per row from _v2_shape; the shipped: B=4, T=2);
- ``psum``: torch's sum of the shipped launch's partial rows and the cast, alone.
Every output is compared with the shipped launch's (the same sums in another order:
within a few ulp). Rows -> DIR/probe_norm_bwd_cuda.jsonl.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from kernellab.harness.bench import git_sha
from kernellab.harness.timer import time_cuda
from kernellab.ops.norm_kernels import cuda_kernels as ck
from kernellab.ops.norm_kernels import triton_kernels as tk


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--shapes", nargs="+",
                   default=["1024x768", "8192x768", "16384x768", "4096x2048", "4096x4096"])
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--ops", nargs="+", default=["layer_norm", "rms_norm"])
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[a.dtype]
    gpu, sha = torch.cuda.get_device_name(), git_sha()
    fwd, bwd = ck.LAUNCHERS["cuda"]
    shipped_use_v2, shipped_bps = ck._use_v2, ck.BWD_BLOCKS_PER_SM

    def with_knobs(bps, target):
        def use_v2(x, vectorized, t):
            return shipped_use_v2(x, vectorized, target if t == 2 else t)

        ck.BWD_BLOCKS_PER_SM, ck._use_v2 = bps, use_v2

    def timed(fn):
        return time_cuda(fn, flush=True, budget_s=0.25).median_ms

    rows = []
    print(f"{gpu} {a.dtype} sha {sha}: device ms of the backward (kernel + dw/db partial sums)")
    for op in a.ops:
        rms = op == "rms_norm"
        for shape in a.shapes:
            n, d = map(int, shape.split("x"))
            g = torch.Generator(device="cuda").manual_seed(n + d)
            x = torch.randn(n, d, device="cuda", generator=g).to(dtype)
            w = (1 + 0.1 * torch.randn(d, device="cuda", generator=g)).to(dtype)
            b = None if rms else torch.randn(d, device="cuda", generator=g).to(dtype)
            dy = torch.randn(n, d, device="cuda", generator=g).to(dtype)
            _, mean, rstd = fwd(x, w, b, 1e-5, rms)
            ref = bwd(dy, x, w, mean, rstd, rms, not rms)
            res = {"triton": timed(lambda: tk.norm_bwd(dy, x, w, mean, rstd, rms, not rms))}
            for bps in (2, 4, 8, 16):
                for target in (1, 2, 4):
                    with_knobs(bps, target)
                    try:
                        got = bwd(dy, x, w, mean, rstd, rms, not rms)
                        err = max(float((o.float() - r.float()).abs().max()) for o, r in zip(got, ref)
                                  if o is not None)  # fmt: skip
                        key = f"bps={bps} t={target}"
                        res[f"cuda {key}"] = timed(lambda: bwd(dy, x, w, mean, rstd, rms, not rms))
                        res[f"err {key}"] = err
                    finally:
                        ck.BWD_BLOCKS_PER_SM, ck._use_v2 = shipped_bps, shipped_use_v2
            sms = torch.cuda.get_device_properties(0).multi_processor_count
            tpr, _ = shipped_use_v2(x, True, 2)
            slots = min((n + 256 // tpr - 1) // (256 // tpr), shipped_bps * sms)  # one partial row a block
            part = torch.randn(slots, d, device="cuda")
            res["psum"] = timed(lambda: part.sum(0).to(dtype))
            cuda = {k: v for k, v in res.items() if k.startswith("cuda")}
            best = min(cuda, key=cuda.get)
            print(f"  {op:10s} {shape:10s} triton {res['triton']:.4f}  shipped {res['cuda bps=4 t=2']:.4f}  "
                  f"best {best} {cuda[best]:.4f}  psum ({slots} rows) {res['psum']:.4f}  "
                  f"max |diff| {max(v for k, v in res.items() if k.startswith('err')):.3g}", flush=True)
            rows.append({"op": op, "shape": shape, "dtype": a.dtype, "gpu": gpu, "git_sha": sha,
                         "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "ms": res})  # fmt: skip
    with open(out / "probe_norm_bwd_cuda.jsonl", "a") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
