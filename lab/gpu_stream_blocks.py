"""Block and warps of the GLU streaming kernels at small sizes, beside Liger and PyTorch.

    python lab/gpu_stream_blocks.py --out DIR [--sizes 16384,65536,393216]

H200 table: swiglu 16384 bf16 forward 7.3 us against Liger's 6.5. Our kernels launch
programs of 8192 16-bit elements with 8 warps (``triton_support.block_for``): two programs
at 16384. Here, per size (bf16, 1-D, as the table's swiglu cases), device time
(harness.timer.time_cuda, L2 flushed) of the forward and backward kernels over BLOCK x
num_warps, each checked against float64, and of the peers' forward (torch: F.silu(a) * b;
Liger's LigerSiLUMulFunction). Rows go to DIR/stream_blocks.jsonl; the best config per
size and direction is printed beside the default's time.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from kernellab.harness.timer import time_cuda  # noqa: E402
from kernellab.ops.glu_kernels import triton_kernels as gk  # noqa: E402

BLOCKS = (1024, 2048, 4096, 8192, 16384)
WARPS = (2, 4, 8, 16)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/stream_blocks")
    ap.add_argument("--sizes", default="16384,65536,393216")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = open(out / "stream_blocks.jsonl", "w")

    def t(fn):
        return time_cuda(fn, budget_s=0.15, min_time_s=0.03, warmup_s=0.03).median_ms * 1e3

    from liger_kernel.ops.swiglu import LigerSiLUMulFunction

    act = gk.ACT["silu"]
    for n in (int(s) for s in a.sizes.split(",")):
        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(n, device="cuda", generator=g).bfloat16()
        z = torch.randn(n, device="cuda", generator=g).bfloat16()
        dy = torch.randn(n, device="cuda", generator=g).bfloat16()
        ref = (F.silu(x.double()) * z.double()).float()
        peers = {"torch": t(lambda: F.silu(x) * z), "liger": float("nan")}
        try:  # Liger launches one program per row: a 1-D tensor past its largest block is refused
            peers["liger"] = t(lambda: LigerSiLUMulFunction.apply(x, z))
        except RuntimeError as e:
            print(f"liger at {n}: {e}", flush=True)
        dflt_f = t(lambda: gk.glu_fwd(x, z, act))
        dflt_b = t(lambda: gk.glu_bwd(dy, x, z, act))
        best = {"fwd": (1e9, None), "bwd": (1e9, None)}
        for block, warps in itertools.product(BLOCKS, WARPS):
            if block < warps * 32 * 8 // 4:  # fewer than two 16-bit elements a thread... keep >= 2
                continue
            grid = (triton_support_cdiv(n, block),)
            y = torch.empty_like(x)

            def fwd(block=block, warps=warps, grid=grid, y=y):
                gk._glu_fwd_kernel[grid](x, z, y, n, ACT=act, BLOCK=block, num_warps=warps)

            fwd()
            ok = (y.float() - ref).abs().max().item() <= 2e-2 * max(1.0, ref.abs().max().item())
            da, db = torch.empty_like(x), torch.empty_like(x)

            def bwd(block=block, warps=warps, grid=grid, da=da, db=db):
                gk._glu_bwd_kernel[grid](dy, x, z, da, db, n, ACT=act, BLOCK=block, num_warps=warps)

            tf, tb = t(fwd), t(bwd)
            rows.write(json.dumps(dict(n=n, block=block, warps=warps, fwd_us=tf, bwd_us=tb, ok=ok)) + "\n")
            rows.flush()
            if ok:
                best["fwd"] = min(best["fwd"], (tf, (block, warps)))
                best["bwd"] = min(best["bwd"], (tb, (block, warps)))
        peer_row = dict(n=n, kind="peers", **peers, default_fwd=dflt_f, default_bwd=dflt_b)
        rows.write(json.dumps(peer_row) + "\n")
        rows.flush()
        print(f"swiglu bf16 {n}: torch {peers['torch']:.2f} liger {peers['liger']:.2f} us | fwd default "
              f"{dflt_f:.2f} best {best['fwd'][0]:.2f} {best['fwd'][1]} | bwd default {dflt_b:.2f} best "
              f"{best['bwd'][0]:.2f} {best['bwd'][1]}", flush=True)  # fmt: skip
    return 0


def triton_support_cdiv(a: int, b: int) -> int:
    return -(-a // b)


if __name__ == "__main__":
    sys.exit(main())
