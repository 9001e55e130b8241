"""Launch knobs of the Triton norms at the shapes issue 43 names (odd fp32 widths, mid-size
bf16 layers): each forward and backward Config variant against the default Config and
PyTorch's own kernels, device time (triton.testing.do_bench, median), outputs compared
with the default Config's. Prints, per (op, shape, dtype, pass), the best variant.

    PYTHONPATH=src python lab/sweep_norm_shapes.py [--out DIR] [--shapes RxC:dtype ...] [--small]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json

import torch
import torch.nn.functional as F
import triton.testing

from kernellab.ops.norm_kernels import triton_kernels as tk

SHAPES = [((2000, 3000), torch.float32), ((4096, 2048), torch.bfloat16), ((12288, 1024), torch.bfloat16),
          ((8192, 5120), torch.bfloat16), ((4096, 4096), torch.float32), ((16384, 768), torch.float32)]  # fmt: skip
FWD = [dict(fwd_warps=w, row_elems=r) for w, r in itertools.product((4, 8, 16), (2048, 4096, 16384))]
BWD = [dict(bwd_programs_per_sm=p, bwd_warps=w) for p, w in itertools.product((1, 2, 4, 8), (4, 8, 16))]
BWD += [dict(b, bwd_prefetch=False) for b in BWD[::3]]
# --fwd: fewer rows a program (one row at row_elems <= the padded width).
FWD_ROWS = [dict(row_elems=r, fwd_warps=w) for r, w in itertools.product((256, 512, 1024), (None, 1, 2, 4))]
# --small: small inputs (GPT-2's hidden, tiny batches): the partials path at each
# programs-per-SM against the one-launch backward's step and strip.
SMALL = [dict(bwd_small_elems=0, bwd_programs_per_sm=p) for p in (1, 2, 4, 8)]
SMALL += [dict(bwd_small_elems=1 << 20, small_step_elems=e, small_strip=c, exact_max_block=x)
          for e, c, x in itertools.product((2048, 4096, 16384), (64, 256), (0, 1 << 20))]  # fmt: skip


def _ms(fn):
    return triton.testing.do_bench(fn, warmup=10, rep=30, return_mode="median")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    p.add_argument("--shapes", nargs="+", default=None, help="RxC:dtype, e.g. 16384x4096:bf16")
    p.add_argument("--small", action="store_true", help="backward variants of small inputs only")
    p.add_argument("--fwd", action="store_true", help="forward variants only (row_elems down to one row)")
    a = p.parse_args()
    passes = (("fwd", FWD), ("bwd", BWD))
    if a.small or a.fwd:
        passes = (("bwd", SMALL),) if a.small else (("fwd", FWD + FWD_ROWS),)
    shapes = SHAPES
    if a.shapes:
        dts = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}
        shapes = [(tuple(int(v) for v in s.split(":")[0].split("x")), dts[s.split(":")[1]]) for s in a.shapes]
    rows = []
    for (shape, dt), rms in itertools.product(shapes, (False, True)):
        r, c = shape
        x = torch.randn(r, c, device="cuda", dtype=dt)
        w = (1 + 0.1 * torch.randn(c, device="cuda")).to(dt)
        b = None if rms else (0.1 * torch.randn(c, device="cuda")).to(dt)
        dy = torch.randn_like(x)
        op = "rms_norm" if rms else "layer_norm"
        y0, mean, rstd = tk.norm_fwd(x, w, b, 1e-5, rms)
        g0 = tk.norm_bwd(dy, x, w, mean, rstd, rms, not rms)
        base = {"fwd": _ms(lambda: tk.norm_fwd(x, w, b, 1e-5, rms)),
                "bwd": _ms(lambda: tk.norm_bwd(dy, x, w, mean, rstd, rms, not rms))}  # fmt: skip
        if rms:
            tf = _ms(lambda: F.rms_norm(x, (c,), w, 1e-5))
            try:
                _, trstd = torch.ops.aten._fused_rms_norm(x, [c], w, 1e-5)
                tb = _ms(lambda: torch.ops.aten._fused_rms_norm_backward(dy, x, [c], trstd, w, [True, True]))
            except Exception as e:  # noqa: BLE001
                print("torch rms backward:", e)
                tb = float("nan")
        else:
            tf = _ms(lambda: F.layer_norm(x, (c,), w, b, 1e-5))
            _, tm, tr = torch.ops.aten.native_layer_norm(x, [c], w, b, 1e-5)
            tb = _ms(
                lambda: torch.ops.aten.native_layer_norm_backward(
                    dy, x, [c], tm, tr, w, b, [True, True, True]
                )
            )
        for kind, variants in passes:
            best = (base[kind], "default")
            for v in variants:
                cfg = dataclasses.replace(tk.CONFIG, **v)
                try:
                    if kind == "fwd":
                        out = tk.norm_fwd(x, w, b, 1e-5, rms, cfg=cfg)[0]
                        ok = torch.equal(out, y0)
                        ms = _ms(lambda cfg=cfg: tk.norm_fwd(x, w, b, 1e-5, rms, cfg=cfg))
                    else:
                        out = tk.norm_bwd(dy, x, w, mean, rstd, rms, not rms, cfg=cfg)
                        ok = torch.allclose(out[0].float(), g0[0].float(), rtol=1e-2, atol=1e-2)
                        ms = _ms(lambda cfg=cfg: tk.norm_bwd(dy, x, w, mean, rstd, rms, not rms, cfg=cfg))
                except Exception as e:  # noqa: BLE001
                    print(op, shape, kind, v, "error", str(e)[:100])
                    continue
                rows.append({"op": op, "shape": list(shape), "dtype": str(dt), "pass": kind, "variant": v,
                             "ms": ms, "ok": ok, "default_ms": base[kind], "torch_ms": tf if kind == "fwd" else tb})  # fmt: skip
                if ok and ms < best[0]:
                    best = (ms, v)
            t = tf if kind == "fwd" else tb
            print(f"{op:10s} {str(shape):14s} {str(dt)[6:]:9s} {kind}: default {base[kind] * 1e3:7.1f} us, "
                  f"best {best[0] * 1e3:7.1f} us {best[1]}, torch {t * 1e3:7.1f} us", flush=True)  # fmt: skip
    if a.out:
        with open(f"{a.out}/sweep_norm_shapes.jsonl", "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
