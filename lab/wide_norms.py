"""Timing and interpreter checks of the Triton norms for rows wider than MAX_D (16384
columns), ``ops/norm_kernels/wide.py``: its launch knobs (strip, warps, waves) side by
side with torch, Liger and our CUDA kernel.

    PYTHONPATH=src python lab/wide_norms.py --check           # CPU: the interpreter vs float64
    PYTHONPATH=src python lab/wide_norms.py OUT.jsonl [--shapes 8191x50257] [--dtypes bf16,fp32] [--dry-run]

On a GPU: each variant timed (``harness.timer.time_cuda``, L2 flushed), outputs judged
against float64 first.
"""

from __future__ import annotations

import itertools
import json
import sys

import torch

from kernellab.ops.norm_kernels import wide
from kernellab.ops.norm_kernels.triton_kernels import CONFIG


def wide_fwd(x, w, b, eps, rms, **kw):
    # the library's launch knobs unless kw names others
    knobs = dict(strip=CONFIG.wide_fwd_strip, warps=CONFIG.wide_warps, waves=CONFIG.wide_waves)
    return wide.wide_fwd(x, w, b, eps, rms, **(knobs | kw))


def wide_bwd(dy, x, w, mean, rstd, rms, has_bias, **kw):
    knobs = dict(strip=CONFIG.wide_bwd_strip, warps=CONFIG.wide_warps, waves=CONFIG.wide_waves)
    return wide.wide_bwd(dy, x, w, mean, rstd, rms, has_bias, **(knobs | kw))

# --------------------------------------------------------------------------- checks and timing


def _ref(x, w, b, dy, rms, eps):
    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    b64 = b.double().requires_grad_() if b is not None else None
    if rms:
        y = x64 * torch.rsqrt((x64 * x64).mean(-1, keepdim=True) + eps) * w64
    else:
        y = torch.nn.functional.layer_norm(x64, (x.shape[-1],), w64, b64, eps)
    y.backward(dy.double())
    return y.detach(), x64.grad, w64.grad, (b64.grad if b64 is not None else None)


def _errors(x, w, b, dy, rms, eps, **kw):
    y, mean, rstd = wide_fwd(x, w, b, eps, rms, **kw)
    dx, dw, db = wide_bwd(dy, x, w, mean, rstd, rms, b is not None, **kw)
    ry, rdx, rdw, rdb = _ref(x, w, b, dy, rms, eps)
    out = {"y": y, "dx": dx, "dw": dw}
    ref = {"y": ry, "dx": rdx, "dw": rdw}
    if db is not None:
        out["db"], ref["db"] = db, rdb
    return {
        k: ((out[k].double() - ref[k]).abs().max() / ref[k].abs().max().clamp_min(1e-30)).item() for k in out
    }


def check() -> int:
    """Under the interpreter (CPU): odd widths at every shift, small chunks and strips so
    that rows span several of them, a last row ending mid-chunk; errors relative to the
    largest reference value, against bounds by dtype."""
    bad = 0
    bounds = {torch.float32: 2e-5, torch.bfloat16: 2e-2}
    shapes = [(7, 37), (5, 64), (9, 131), (3, 8), (40, 37), (1, 37)]
    for (rows, n), dt, rms, bias in itertools.product(shapes, bounds, (False, True), (True, False)):
        if rms and bias:
            continue
        g = torch.Generator().manual_seed(rows * n)
        x = (torch.randn(rows, n, generator=g) * 2 + 0.5).to(dt)
        w = (1 + 0.2 * torch.randn(n, generator=g)).to(dt)
        b = (0.3 * torch.randn(n, generator=g)).to(dt) if bias else None
        dy = torch.randn(rows, n, generator=g).to(dt)
        err = _errors(x, w, b, dy, rms, 1e-5, chunk=16, strip=16, waves=1)
        ok = all(v <= bounds[dt] for v in err.values())
        bad += not ok
        print(f"{'ok ' if ok else 'BAD'} {rows}x{n} {str(dt)[6:]} {'rms' if rms else 'layer'} bias={bias} "
              + " ".join(f"{k} {v:.1e}" for k, v in err.items()))  # fmt: skip
    print("all passed" if not bad else f"{bad} failed")
    return 1 if bad else 0


VARIANTS = [
    dict(strip=s, warps=wp, waves=wv) for s, wp, wv in itertools.product((1024, 2048, 4096), (4, 8), (1, 2))
]


def bench(out: str, shapes, dtypes, device: str = "cuda") -> int:
    import kernellab
    from kernellab.harness import timer
    from kernellab.harness.bench import git_sha

    dts = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}
    sha, gpu = git_sha(), (torch.cuda.get_device_name() if device == "cuda" else "cpu (a dry run: no times)")

    def ms(fn):
        if device != "cuda":
            fn()
            return float("nan")
        return timer.time_cuda(fn).median_ms

    with open(out, "a") as f:
        for (rows, n), dn, rms in itertools.product(shapes, dtypes, (False, True)):
            dt = dts[dn]
            op = "rms_norm" if rms else "layer_norm"
            x = torch.randn(rows, n, device=device, dtype=dt)
            w = (1 + 0.1 * torch.randn(n, device=device)).to(dt)
            b = None if rms else (0.1 * torch.randn(n, device=device)).to(dt)
            dy = torch.randn_like(x)
            err = _errors(x[:64].contiguous(), w, b, dy[:64].contiguous(), rms, 1e-5)
            print(op, rows, n, dn, "errors (64 rows) vs float64:", {k: f"{v:.1e}" for k, v in err.items()})

            def row(name, t, **extra):
                r = {"op": op, "shape": [rows, n], "dtype": dn, "name": name, "ms": t, "gpu": gpu}
                r["git_sha"] = sha
                f.write(json.dumps(r | extra) + "\n")
                f.flush()
                print(f"{op:10s} {rows}x{n} {dn} {name:40s} {t * 1e3:9.1f} us", flush=True)

            y, mean, rstd = wide_fwd(x, w, b, 1e-5, rms)
            for kw in VARIANTS:
                try:
                    row(f"wide fwd {kw}", ms(lambda kw=kw: wide_fwd(x, w, b, 1e-5, rms, **kw)), **kw)
                    bwd = lambda kw=kw: wide_bwd(dy, x, w, mean, rstd, rms, b is not None, **kw)  # noqa: E731
                    row(f"wide bwd {kw}", ms(bwd), **kw)
                except Exception as e:  # noqa: BLE001
                    print(op, kw, "error", str(e)[:200])
            xg = x.detach().requires_grad_()
            for be in ("torch", "cuda", "liger"):
                if rms:
                    fn = lambda xx, be=be: kernellab.rms_norm(xx, w, backend=be)  # noqa: E731
                else:
                    fn = lambda xx, be=be: kernellab.layer_norm(xx, w, b, backend=be)  # noqa: E731
                try:
                    row(f"{be} fwd", ms(lambda fn=fn: fn(x)))
                    yy = fn(xg)
                    grad = lambda yy=yy: torch.autograd.grad(yy, xg, dy, retain_graph=True)  # noqa: E731
                    row(f"{be} bwd (autograd)", ms(grad))
                except Exception as e:  # noqa: BLE001
                    print(op, be, "error", str(e)[:200])
    return 0


def main(argv) -> int:
    if "--check" in argv:
        return check()
    out = argv[0]
    shapes = [(8191, 50257)]
    dtypes = ["bf16", "fp32"]
    device = "cpu" if "--dry-run" in argv else "cuda"
    for i, a in enumerate(argv):
        if a == "--shapes":
            shapes = [tuple(int(v) for v in s.split("x")) for s in argv[i + 1].split(",")]
        if a == "--dtypes":
            dtypes = argv[i + 1].split(",")
    return bench(out, shapes, dtypes, device)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
