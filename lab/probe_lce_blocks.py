"""linear_cross_entropy fwd+bwd on a lent GPU: the blocked runner (``triton``) at several
column-block sizes beside ``triton_rows``, Liger and PyTorch, with each call's peak memory.

    python lab/probe_lce_blocks.py --out FILE.jsonl [--shapes 16384x2048x128256 ...]

Block sizes are set through ``_chunked.BLOCK_ELEMS`` (the blocked runner's logits per block;
BLOCK_FLOPS scaled alike). Time: ``triton.testing.do_bench`` of loss.backward() on fresh
graphs (median ms); peak: max allocated during one call minus what was allocated before.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402
import triton.testing  # noqa: E402

import kernellab  # noqa: E402
from kernellab.ops.linear_cross_entropy import _chunked  # noqa: E402


def one(backend, x, w, t):
    x.grad = w.grad = None
    loss = kernellab.linear_cross_entropy(x, w, t, backend=backend)
    loss.backward()


def measure(backend, x, w, t):
    try:
        one(backend, x, w, t)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        one(backend, x, w, t)
        torch.cuda.synchronize()
        peak = (torch.cuda.max_memory_allocated() - base) / 2**20
        ms = triton.testing.do_bench(lambda: one(backend, x, w, t), warmup=50, rep=300)
        return {"ms": round(ms, 4), "peak_mib": round(peak, 1)}
    except Exception as e:  # a backend that refuses the shape: say so and go on
        return {"error": f"{type(e).__name__}: {e}"[:200]}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--shapes", nargs="+", default=["16384x2048x128256", "4096x4096x128256", "8192x4096x32000",
                                                   "8192x2304x256000", "4096x896x151936", "256x768x50304"])  # fmt: skip
    p.add_argument("--elems", nargs="+", type=int, default=[22, 23, 24, 25])
    a = p.parse_args()
    e0, f0 = _chunked.BLOCK_ELEMS, _chunked.BLOCK_FLOPS
    with open(a.out, "w") as f:
        for s in a.shapes:
            n, h, v = map(int, s.split("x"))
            g = torch.Generator(device="cuda").manual_seed(0)
            x = (torch.randn(n, h, device="cuda", generator=g) * 0.5).bfloat16().requires_grad_()
            w = (torch.randn(v, h, device="cuda", generator=g) * h**-0.5).bfloat16().requires_grad_()
            t = torch.randint(0, v, (n,), device="cuda", generator=g)
            runs = [("torch", None), ("liger", None), ("triton_rows", None)] + [("triton", e) for e in a.elems]
            for backend, e in runs:
                if e is not None:
                    _chunked.BLOCK_ELEMS, _chunked.BLOCK_FLOPS = 1 << e, f0 << (e - 22)
                row = {"shape": s, "backend": backend, "block_elems_log2": e, **measure(backend, x, w, t)}
                if e is not None:
                    row["block_cols"] = _chunked.block_cols(min(n, _chunked.MAX_ROWS), v, h)
                _chunked.BLOCK_ELEMS, _chunked.BLOCK_FLOPS = e0, f0
                print(json.dumps(row), flush=True)
                f.write(json.dumps(row) + "\n")
            del x, w, t
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
