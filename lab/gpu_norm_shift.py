"""The shifted norm kernels (rows off 16-byte boundaries, issue 43: layer_norm 4096x4097
forward+backward 0.72-0.77x the best peer) on a lent GPU: Triton ``Config`` variants of
the forward and the backward beside the unshifted kernels and the peers.

    python lab/gpu_norm_shift.py OUT.jsonl [--shapes 4096x4097,4099x1025] [--ops layer_norm,rms_norm]

Per (op, dtype, shape): the Triton forward and backward launchers timed apart at each
variant (``harness.timer.time_cuda``, L2 flushed; outputs judged against float64 first,
a wrong variant is printed and not timed), and every registered backend's forward and
forward+backward (autograd) through the registry. One JSON row per measurement.
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

SHAPES = [(4096, 4097), (4099, 1025), (8191, 2049)]
R = dataclasses.replace
C0 = tk.CONFIG
VARIANTS = {
    "default": C0,
    "noshift": R(C0, shift_fwd_min_cols=0, shift_bwd_min_cols=0),
    "shift_all": R(C0, shift_fwd_min_cols=8, shift_bwd_min_cols=8),
    "fwd_w2": R(C0, shift_fwd_min_cols=8, shift_fwd_warps=2),
    "fwd_w8": R(C0, shift_fwd_min_cols=8, shift_fwd_warps=8),
    "fwd_ps8": R(C0, shift_fwd_min_cols=8, shift_fwd_per_sm=8),
    "bwd_w8": R(C0, shift_bwd_min_cols=8, bwd_warps=8),
    "bwd_w16": R(C0, shift_bwd_min_cols=8, bwd_warps=16),
    "bwd_ps2": R(C0, shift_bwd_min_cols=8, bwd_programs_per_sm=2),
}
FWD_ONLY = ("fwd_",)
BWD_ONLY = ("bwd_",)


def ref64(x, w, b, dy, rms, eps=1e-5):
    xs = [t.double().requires_grad_(True) if t is not None else None for t in (x, w, b)]
    if rms:
        y = xs[0] * torch.rsqrt(xs[0].pow(2).mean(-1, keepdim=True) + eps) * xs[1]
    else:
        y = torch.nn.functional.layer_norm(xs[0], xs[0].shape[-1:], xs[1], xs[2], eps)
    (dx,) = torch.autograd.grad(y, xs[0], dy.double())
    return y.detach(), dx


def rel(a, b):
    return float((a.double() - b).abs().max() / b.abs().max())


def main(out, shapes, ops):
    meta = {"git_sha": git_sha(), **versions(), "gpu": torch.cuda.get_device_name()}
    fh = open(out, "a")

    def emit(row):
        fh.write(json.dumps({**row, **meta}) + "\n")
        fh.flush()

    for op in ops:
        rms = op == "rms_norm"
        for dt in (torch.bfloat16, torch.float32):
            dn = "bf16" if dt == torch.bfloat16 else "fp32"
            for n, d in shapes:
                g = torch.Generator(device="cuda").manual_seed(0)
                x = (torch.randn(n, d, device="cuda", generator=g) * 2 + 1).to(dt)
                w = (1 + 0.2 * torch.randn(d, device="cuda", generator=g)).to(dt)
                b = None if rms else (0.1 * torch.randn(d, device="cuda", generator=g)).to(dt)
                dy = torch.randn(n, d, device="cuda", generator=g).to(dt)
                y64, dx64 = ref64(x, w, b, dy, rms)
                tol = 16 * torch.finfo(dt).eps
                base = {"op": op, "dtype": dn, "shape": f"{n}x{d}"}
                res = {}
                for name, cfg in VARIANTS.items():
                    y, mean, rstd = tk.norm_fwd(x, w, b, 1e-5, rms, cfg=cfg)
                    dx = tk.norm_bwd(dy, x, w, mean, rstd, rms, not rms, cfg=cfg)[0]
                    ey, ex = rel(y, y64), rel(dx, dx64)
                    if not (ey <= tol and ex <= tol):
                        print(f"  WRONG {op} {dn} {n}x{d} {name}: y {ey:.2e} dx {ex:.2e} (tol {tol:.1e})")
                        continue
                    t = {}
                    fwd = lambda c=cfg: tk.norm_fwd(x, w, b, 1e-5, rms, cfg=c)  # noqa: E731
                    bwd = lambda c=cfg: tk.norm_bwd(dy, x, w, mean, rstd, rms, not rms, cfg=c)  # noqa: E731
                    if not name.startswith(BWD_ONLY):
                        t["fwd"] = timer.time_cuda(fwd, budget_s=0.25)
                    if not name.startswith(FWD_ONLY):
                        t["bwd"] = timer.time_cuda(bwd, budget_s=0.25)
                    for mode, tm in t.items():
                        res[(name, mode)] = tm.median_ms
                        emit({**base, "variant": f"triton:{name}", "mode": mode, "median_ms": tm.median_ms})
                for be in ("torch", "liger", "cuda", "triton"):
                    try:
                        fn = kernellab.registry.get(op, be).fn
                    except Exception:  # noqa: BLE001 - not registered here
                        continue
                    args = (x, w) if rms else (x, w, b)
                    try:
                        with torch.no_grad():
                            tf = timer.time_cuda(lambda fn=fn, a=args: fn(*a, 1e-5), budget_s=0.25).median_ms
                        leaves = [a.detach().requires_grad_(True) for a in args]

                        def fb(fn=fn, leaves=leaves):
                            yy = fn(*leaves, 1e-5)
                            return torch.autograd.grad(yy, leaves, dy)

                        tfb = timer.time_cuda(fb, budget_s=0.25).median_ms
                    except Exception as e:  # noqa: BLE001 - a peer that cannot run here
                        print(f"  {be}: {type(e).__name__}: {str(e)[:100]}")
                        continue
                    res[(be, "fwd")], res[(be, "fwdbwd")] = tf, tfb
                    emit({**base, "variant": be, "mode": "fwd", "median_ms": tf})
                    emit({**base, "variant": be, "mode": "fwdbwd", "median_ms": tfb})
                for mode in ("fwd", "bwd", "fwdbwd"):
                    got = sorted((v, k[0]) for k, v in res.items() if k[1] == mode)
                    print(f"{op} {dn} {n}x{d} {mode}: " + "  ".join(f"{k} {v * 1e3:.1f}" for v, k in got[:9]))
                sys.stdout.flush()


def _arg(name):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else None


if __name__ == "__main__":
    s, o = _arg("--shapes"), _arg("--ops")
    main(sys.argv[1], [tuple(map(int, v.split("x"))) for v in s.split(",")] if s else SHAPES,
         tuple(o.split(",")) if o else ("layer_norm", "rms_norm"))  # fmt: skip
