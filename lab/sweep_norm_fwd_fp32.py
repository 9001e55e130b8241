"""The Triton norm forward at fp32 odd widths (issue 43: rms_norm fp32 2000x3000 forward at
0.79x Liger): ``triton_kernels.Config`` knobs (warps, rows per program, eviction) beside the
registered liger and cuda backends, device time (L2 flushed), outputs checked against a
float64 reference first.

    python lab/sweep_norm_fwd_fp32.py OUT.jsonl [--shapes 1024x768,128x768] [--ops layer_norm]

(The H200 table's fp32 forwards below Liger: layer_norm at width 768, 1024x768 0.83x,
128x768 0.86x, 8192-50432x768 0.94x, 64x256 0.82x; rms_norm 64x256 0.86x, 4099x1025 0.87x.)
"""

from __future__ import annotations

import dataclasses
import json
import sys

import torch

import kernellab
from kernellab.harness import timer
from kernellab.harness.bench import git_sha, versions
from kernellab.ops.norm_kernels import triton_kernels as tk

SHAPES = [(2000, 3000), (4099, 1025), (4096, 4097), (8192, 1000), (4096, 2048)]
CONFIGS = {
    "default": tk.CONFIG,
    "warps4": dataclasses.replace(tk.CONFIG, fwd_warps=4),
    "warps16": dataclasses.replace(tk.CONFIG, fwd_warps=16),
    "rows2": dataclasses.replace(tk.CONFIG, row_elems=8192),
    "rows2w8": dataclasses.replace(tk.CONFIG, row_elems=8192, fwd_warps=8),
    "rows4w16": dataclasses.replace(tk.CONFIG, row_elems=16384, fwd_warps=16),
    "evict": dataclasses.replace(tk.CONFIG, fwd_evict="evict_first"),
    "rows_half": dataclasses.replace(tk.CONFIG, row_elems=2048),
    "rows_half_w2": dataclasses.replace(tk.CONFIG, row_elems=2048, fwd_warps=2),
    "w2": dataclasses.replace(tk.CONFIG, fwd_warps=2),
    "rows2w4": dataclasses.replace(tk.CONFIG, row_elems=8192, fwd_warps=4),
}


def reference(x, w, b, eps, rms):
    x64 = x.double()
    if rms:
        y = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps)
    else:
        y = torch.nn.functional.layer_norm(x64, x64.shape[-1:], eps=eps)
    y = y * w.double()
    return y + b.double() if b is not None else y


def main(out: str, shapes=SHAPES, ops=("rms_norm", "layer_norm")) -> int:
    meta = {"git_sha": git_sha(), **versions(), "gpu": torch.cuda.get_device_name()}
    rows = []
    for op in ops:
        rms = op == "rms_norm"
        for n, d in shapes:
            g = torch.Generator(device="cuda").manual_seed(0)
            x = torch.randn(n, d, device="cuda", generator=g)
            w = torch.randn(d, device="cuda", generator=g)
            b = None if rms else torch.randn(d, device="cuda", generator=g)
            ref = reference(x, w, b, 1e-6, rms)
            fns = {}
            for k, c in CONFIGS.items():
                fns[f"triton:{k}"] = lambda c=c: tk.norm_fwd(x, w, b, 1e-6, rms, cfg=c)[0]
            for be in ("liger", "cuda", "triton"):
                try:
                    fn = kernellab.registry.get(op, be).fn
                except Exception:  # noqa: BLE001 - a backend missing here is left out
                    continue
                args = (x, w, 1e-6) if rms else (x, w, b, 1e-6)
                fns[be] = lambda fn=fn, args=args: fn(*args)
            for name, fn in fns.items():
                row = {"op": op, "shape": f"{n}x{d}", "dtype": "fp32", "mode": "fwd", "variant": name, **meta}
                try:
                    with torch.no_grad():
                        y = fn()
                        err = float((y.double() - ref).abs().max() / ref.abs().max())
                        t = timer.time_cuda(fn, budget_s=0.3)
                    row.update(status="ok", median_ms=round(t.median_ms, 5), rel_err=err)
                except Exception as e:  # noqa: BLE001 - one variant's failure is its row
                    row.update(status="error", reason=f"{type(e).__name__}: {e}"[:200])
                rows.append(row)
                with open(out, "a") as f:
                    f.write(json.dumps(row) + "\n")
            ok = [r for r in rows if r["op"] == op and r["shape"] == f"{n}x{d}" and r["status"] == "ok"]
            best = min(r["median_ms"] for r in ok)
            line = "  ".join(f"{r['variant']} {best / r['median_ms']:.3f}" for r in ok)
            print(f"{op} {n}x{d}: {line}", flush=True)
    return 0


def _arg(name: str):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else None


if __name__ == "__main__":
    shapes = _arg("--shapes")
    ops = _arg("--ops")
    sys.exit(
        main(
            sys.argv[1],
            [tuple(map(int, w.split("x"))) for w in shapes.split(",")] if shapes else SHAPES,
            tuple(ops.split(",")) if ops else ("rms_norm", "layer_norm"),
        )
    )
