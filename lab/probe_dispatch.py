"""Where the default's per-call host time goes, against PyTorch's own op (GPU host; runs on
the CPU too). For each op at a tiny shape (device time negligible): us per call of the
PyTorch op called directly, kernellab's public call naming the ``torch`` backend, and the
default (``backend=None``), plus the pieces the registry runs on each call: the spec's
validation, the default's choice-cache key and the trusted path's call signature. Paired rounds (``timer.paired_us``), so a
drifting host moves every case alike.

    PYTHONPATH=src python lab/probe_dispatch.py [--out FILE.jsonl] [--rounds 9]
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

import kernellab
from kernellab.core import registry, shapes
from kernellab.harness import timer
from kernellab.harness.bench import git_sha, versions


def cases(dev: str, dt) -> dict:
    """op -> (args, kwargs, the PyTorch call, the public kernellab call taking backend=)."""
    r = lambda *s: torch.randn(*s, device=dev, dtype=dt)  # noqa: E731
    x, w, b = r(64, 256), r(256), r(256)
    v = r(16384)
    q, k, vv = r(1, 2, 64, 64), r(1, 2, 64, 64), r(1, 2, 64, 64)
    a, m = r(64, 64), r(64, 64)
    y = r(2, 8192)
    wy = r(8192)
    xi, wc, bc = r(8, 16, 14, 14), r(32, 16, 3, 3), r(32)
    return {
        "softmax": ((x,), {}, lambda: torch.softmax(x, -1), lambda be: kernellab.softmax(x, backend=be)),
        "gelu": ((v,), {}, lambda: F.gelu(v), lambda be: kernellab.gelu(v, backend=be)),
        "sum": ((x,), {}, lambda: x.sum(-1), lambda be: kernellab.sum(x, backend=be)),
        "argmax": ((x,), {}, lambda: x.argmax(-1), lambda be: kernellab.argmax(x, backend=be)),
        "layer_norm": ((x, w, b), {}, lambda: F.layer_norm(x, (256,), w, b),
                       lambda be: kernellab.layer_norm(x, w, b, backend=be)),  # fmt: skip
        "rms_norm": ((y, wy), {}, lambda: F.rms_norm(y, (8192,), wy, 1e-6),
                     lambda be: kernellab.rms_norm(y, wy, backend=be)),  # fmt: skip
        "attention": ((q, k, vv), {"causal": True},
                      lambda: F.scaled_dot_product_attention(q, k, vv, is_causal=True),
                      lambda be: kernellab.attention(q, k, vv, causal=True, backend=be)),  # fmt: skip
        "matmul": ((a, m), {}, lambda: a @ m, lambda be: kernellab.matmul(a, m, backend=be)),
        "conv2d": ((xi, wc, bc), {"padding": 1}, lambda: F.conv2d(xi, wc, bc, padding=1),
                   lambda be: kernellab.conv2d(xi, wc, bc, padding=1, backend=be)),  # fmt: skip
        "max_pool2d": ((xi,), {"kernel_size": 2}, lambda: F.max_pool2d(xi, 2),
                       lambda be: kernellab.max_pool2d(xi, 2, backend=be)),  # fmt: skip
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=None)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    p.add_argument("--norm-host", action="store_true",
                   help="also: layer_norm's host cost, loop time and device time per backend at "
                        "row counts from 64 to 16384 (where Triton's host cost grows)")  # fmt: skip
    a = p.parse_args(argv)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dt = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    meta = {"git_sha": git_sha(), **versions(), "device": dev,
            "gpu": torch.cuda.get_device_name() if dev == "cuda" else None}  # fmt: skip
    print("#", meta)
    out = open(a.out, "a") if a.out else None
    if a.norm_host:
        _norm_host(dev, dt, meta, out)
    for op, (args, kw, raw, public) in cases(dev, dt).items():
        impl = registry.get(op, "torch")
        public(None)  # the default's first call at this key: choose and remember
        validate = impl._validate or impl._validator()
        opts = registry._option_values

        def key(op=op, args=args, kw=kw):
            x = args[0]
            dv = "cuda" if x.is_cuda else x.device.type
            torch.compiler.is_compiling()
            ck = (op, dv, x.dtype, x.shape if op not in shapes.KEY_ARGS else (x.shape, args[1].shape),
                  opts(op, kw) if kw else None)  # fmt: skip
            return registry._CHOSEN.get(ck)

        fns = {
            "pytorch": raw,
            "named_torch": lambda public=public: public("torch"),
            "default": lambda public=public: public(None),
            "registry_named": lambda op=op, args=args, kw=kw: registry.call(op, "torch", *args, **kw),
            "registry_default": lambda op=op, args=args, kw=kw: registry.call(op, None, *args, **kw),
            "validate_only": lambda v=validate, args=args, kw=kw, d=impl.devices: v(args, kw, d),
            "key_only": key,
            "signature_only": lambda args=args, kw=kw: registry._signature(args, kw),
        }
        res = timer.paired_us(fns, lambda n: "pytorch", a.rounds)
        line = {"op": op, "dtype": a.dtype, **meta, "chosen": registry.choose(op, args, dev, None, kw)[0]}
        for name, r in res.items():
            if isinstance(r, Exception):
                line[name] = f"{type(r).__name__}: {r}"
            else:
                line[name + "_us"] = round(r[0], 3)
        print(f"{op:11s} chosen {line['chosen']:8s} " + "  ".join(
            f"{n} {line[n + '_us']:.2f}" if n + "_us" in line else f"{n} {line[n]}" for n in fns), flush=True)  # fmt: skip
        if out:
            out.write(json.dumps(line) + "\n")
            out.flush()
    return 0


def _norm_host(dev, dt, meta, out) -> None:
    for rows, cols in [(64, 256), (4096, 1024), (8192, 1024), (12288, 1024), (16384, 768), (12288, 4096)]:
        x = torch.randn(rows, cols, device=dev, dtype=dt)
        w, b = torch.randn(cols, device=dev, dtype=dt), torch.randn(cols, device=dev, dtype=dt)
        for be in ["torch", "triton", None]:
            f = lambda be=be: kernellab.layer_norm(x, w, b, backend=be)  # noqa: E731
            line = {"op": "layer_norm", "shape": [rows, cols], "backend": be or "default", **meta,
                    "host_us": round(timer.host_cost_us(f), 2), "loop_us": round(timer.loop_ms(f) * 1e3, 2)}  # fmt: skip
            if dev == "cuda":
                line["device_us"] = round(timer.time_cuda(f).median_ms * 1e3, 2)
            print(line, flush=True)
            if out:
                out.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
