"""Tuning sweep for the vectorized elementwise kernels (gelu fwd/bwd, add) at 2^28.

Knobs: KL_UNROLL (16-byte packs in flight per thread; half that per input for two-input
kernels), KL_CACHE_HINT (0 plain/nc,
2 evict-first), KL_GELU_FAST (exp2 + rcp instead of expf + div), and the grid cap
(blocks per SM of the grid-stride loop; 0 = one tile per block, no loop).
Each config is timed (CUDA events, L2 flushed) beside torch in the same process and its
output judged against the float64 reference. Prints a table; JSON rows to argv[1].
"""

import itertools
import json
import sys
from pathlib import Path

import torch

from kernellab.cuda.runtime import Module, ceil_div, sm_count
from kernellab.harness.compare import judge
from kernellab.harness.timer import time_cuda
from kernellab.ops.gelu import gelu_reference

ROOT = Path(__file__).resolve().parents[1] / "src" / "kernellab" / "ops"
N = 2**28
SFX = {torch.float32: "f32", torch.bfloat16: "bf16"}
out_rows = []


THREADS = 256


def launch(mod, name, inputs, cap, unroll):
    y = torch.empty_like(inputs[0])
    k = mod.kernel(f"{name}_{SFX[y.dtype]}", ("ptr",) * (len(inputs) + 1) + ("i64",), 0)
    packs = N // (16 // y.element_size())
    per_thread = unroll if len(inputs) == 1 else (unroll + 1) // 2  # kl::UNROLL / kl::UNROLL2
    grid = ceil_div(packs, THREADS * per_thread)
    if cap:
        grid = min(grid, sm_count(0) * cap)
    k(grid, THREADS, *inputs, y, N, device_index=0)
    return y


def main():
    global THREADS
    quick = "--threads" in sys.argv  # block-size sweep on the shipped configuration only
    for dtype in (torch.float32, torch.bfloat16):
        g = torch.Generator(device="cuda").manual_seed(0)
        x = (torch.randn(N, device="cuda", generator=g) * 3).to(dtype)
        dy = torch.randn(N, device="cuda", generator=g).to(dtype)
        b = torch.randn(N, device="cuda", generator=g).to(dtype)
        x64 = x.double()
        ref = {"gelu_fwd": gelu_reference(x64)}
        x64.requires_grad_()
        ref["gelu_bwd"] = torch.autograd.grad(gelu_reference(x64), x64, dy.double())[0]
        ref["add"] = x.double() + b.double()
        x64 = None
        base = {
            "gelu_fwd": lambda: torch.nn.functional.gelu(x, approximate="tanh"),
            "gelu_bwd": lambda: torch.ops.aten.gelu_backward(dy, x, approximate="tanh"),
            "add": lambda: torch.add(x, b),
        }
        bout = {k: f() for k, f in base.items()}
        for kname, f in base.items():
            t = time_cuda(f, budget_s=0.6)
            out_rows.append(dict(kernel=kname, dtype=str(dtype)[6:], config="torch", ms=t.median_ms))
        if quick:
            grid_cfgs = [(u, 0, 1, 0, t) for u in (1, 2, 4, 8) for t in (128, 256, 512)]
        else:
            grid_cfgs = [
                (u, h, f, c, 256)
                for u, h, f, c in itertools.product((1, 2, 4, 8), (0, 2), (0, 1), (0, 8, 16, 32))
            ]
        for unroll, hint, fast, cap, threads in grid_cfgs:
            THREADS = threads
            opts = [
                f"-DKL_UNROLL={unroll}",
                f"-DKL_CACHE_HINT={hint}",
                f"-DKL_GELU_FAST={fast}",
                f"-DKL_THREADS={threads}",
            ]
            gmod = Module(ROOT / "gelu" / "gelu.cu", options=opts)
            amod = Module(ROOT / "add" / "add.cu", options=opts)
            jobs = {
                "gelu_fwd": (gmod, [x]),
                "gelu_bwd": (gmod, [dy, x]),
            }
            if not fast or quick:  # add has no GELU_FAST knob: time it once per config
                jobs["add"] = (amod, [x, b])
            for kname, (mod, inputs) in jobs.items():
                f = lambda: launch(mod, kname, inputs, cap, unroll)  # noqa: E731
                out = f()
                v = judge(out, ref[kname], dtype, bout[kname])
                t = time_cuda(f, budget_s=0.4)
                out_rows.append(
                    dict(
                        kernel=kname,
                        dtype=str(dtype)[6:],
                        config=f"u{unroll} h{hint} f{fast} cap{cap}",
                        ms=t.median_ms,
                        ok=v.ok,
                        ratio=round(v.ratio, 3),
                    )
                )
                del out
        del x, dy, b, ref, bout
        torch.cuda.empty_cache()
    dest = [a for a in sys.argv[1:] if not a.startswith("--")]
    if dest:
        with open(dest[0], "w") as fh:
            for r in out_rows:
                fh.write(json.dumps({**r, "gpu": torch.cuda.get_device_name()}) + "\n")
    # Report: per kernel/dtype, torch and the 6 best configs.
    for key in sorted({(r["kernel"], r["dtype"]) for r in out_rows}):
        rs = [r for r in out_rows if (r["kernel"], r["dtype"]) == key]
        t = next(r["ms"] for r in rs if r["config"] == "torch")
        mine = [r for r in rs if r["config"] != "torch"]
        if not mine:
            continue
        best = sorted(mine, key=lambda r: r["ms"])[:6]
        worst = max(mine, key=lambda r: r["ms"])
        print(
            f"{key[0]:9s} {key[1]:9s} torch {t:.4f} ms | "
            + "  ".join(f"{r['config']}: {r['ms']:.4f}{'' if r['ok'] else ' WRONG'}" for r in best)
            + f" | worst {worst['config']} {worst['ms']:.4f}"
        )


if __name__ == "__main__":
    main()
