"""GPU check of the layer_norm / rms_norm ``triton`` backends' C++ node
(ops/norm_kernels/triton_node.py, nodes.cpp ``triton_norm``) against their Python path.

    python lab/gpu_triton_node.py [--out DIR]

1. Host: time per forward+backward in a plain loop (timer.loop_ms) at 64x256 (host-bound) and
   8192x768 bf16: F.layer_norm, backend triton through the Python node (cpp_nodes off) and
   through the C++ node; rounds alternate.
2. nanoGPT 8 x 1024 eager, interleaved rounds: PyTorch's ops, kernellab's default with the
   C++ nodes off, and with them on.
(Correctness: tests/ops/test_norm_triton_node.py, bitwise against the Python path.)
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import kernellab  # noqa: E402
from kernellab.cuda import nodes  # noqa: E402
from kernellab.harness import timer  # noqa: E402


def host(rows_out):
    for shape in ((64, 256), (8192, 768)):
        x = torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        w = torch.ones(shape[-1], device="cuda", dtype=torch.bfloat16, requires_grad=True)
        b = torch.zeros(shape[-1], device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(shape, device="cuda", dtype=torch.bfloat16)

        def ours():
            kernellab.layer_norm(x, w, b, 1e-5, backend="triton").backward(dy)

        def python_node():
            with kernellab.config.override(cpp_nodes="off"):
                ours()

        fns = {
            "torch": lambda: F.layer_norm(x, shape[-1:], w, b, 1e-5).backward(dy),
            "triton, Python node": python_node,
            "triton, C++ node": ours,
        }
        times = {k: [] for k in fns}
        for _ in range(7):  # rounds alternate: the host's speed drifts
            for k, fn in fns.items():
                times[k].append(timer.loop_ms(fn, 200, rounds=1) * 1e3)
        med = {k: statistics.median(v) for k, v in times.items()}
        line = ", ".join(f"{k} {v:.1f} us ({v / med['torch']:.2f}x)" for k, v in med.items())
        print(f"layer_norm fwd+bwd {shape[0]}x{shape[1]} bf16, per call in a plain loop: {line}")
        rows_out.append({"host_us": med, "rounds_us": times, "shape": list(shape)})


def nano(rows_out, rounds=7, steps=10):
    from kernellab.models.user_models import NanoGPT, make_step, nano_ops

    torch.manual_seed(0)
    base = NanoGPT(50304, 1024, 768, 12, 12, nano_ops("torch")).to("cuda", torch.bfloat16)
    runs = {}
    for name in ("torch", "kernellab"):
        ops = nano_ops(name)
        m = copy.deepcopy(base)
        m.ops = ops
        for blk in m.blocks:
            blk.ops = ops
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True)
        runs[name] = make_step(m, opt, "eager", False)
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, 50304, (8, 1024), generator=g).cuda()
    tgt = torch.randint(0, 50304, (8, 1024), generator=g).cuda()
    cases = {"torch": ("torch", "auto"), "kernellab, nodes off": ("kernellab", "off"),
             "kernellab, nodes on": ("kernellab", "auto")}  # fmt: skip
    for name, mode in cases.values():
        with kernellab.config.override(cpp_nodes=mode):
            for _ in range(3):
                runs[name](idx, tgt)
    torch.cuda.synchronize()
    ms = {k: [] for k in cases}
    for _ in range(rounds):
        for k, (name, mode) in cases.items():
            with kernellab.config.override(cpp_nodes=mode):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(steps):
                    runs[name](idx, tgt)
                torch.cuda.synchronize()
            ms[k].append((time.perf_counter() - t0) / steps * 1e3)
    med = {k: statistics.median(v) for k, v in ms.items()}
    print(
        "nanoGPT 8x1024 bf16 eager, ms a step (median of rounds): "
        + ", ".join(f"{k} {v:.2f} ({med['torch'] / v:.2f}x)" for k, v in med.items())
    )
    rows_out.append({"nanogpt_ms": med, "rounds": ms})


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    nodes.build()
    rows: list = []
    host(rows)
    nano(rows)
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        with open(Path(a.out) / "triton_node.jsonl", "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
