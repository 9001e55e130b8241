"""GPU check of lab/triton_node.py: kernellab's Triton norm kernels behind a C++ autograd node.

    python lab/gpu_triton_node.py [--out DIR]

1. Correctness: y, dx, dw, db of the node against the Triton backend's Python path (the same
   kernels: bitwise) and against float64 (F.layer_norm / rms in fp64), at the plans' kinds:
   8192x768 bf16 with and without bias (partials + sum), 64x256 bf16 (the one-kernel small
   backward), 4096x4097 bf16 (the shifted kernels), 2048x2048 fp32, rms 8192x4096 bf16.
2. Host: time per forward+backward in a plain loop (timer.loop_ms) at 64x256 (host-bound) and
   8192x768: F.layer_norm, kernellab backend triton (Python node), the C++ node; rounds alternate.
3. nanoGPT 8 x 1024 eager, interleaved rounds: PyTorch's ops, kernellab's default, and kernellab
   with layer_norm through the node.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from triton_node import TritonNode  # noqa: E402

import kernellab  # noqa: E402
from kernellab.harness import timer  # noqa: E402


def ref(x, w, b, eps, rms):
    x64, w64 = x.double(), w.double()
    if rms:
        return x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps) * w64
    return F.layer_norm(x64, (x.shape[-1],), w64, None if b is None else b.double(), eps)


def grads(fn, x, w, b, dy):
    xs = [t.detach().clone().requires_grad_(True) if t is not None else None for t in (x, w, b)]
    y = fn(*xs)
    if y is None:
        return None
    y.backward(dy)
    return [y.detach()] + [t.grad for t in xs if t is not None]


def check(node, rows_out):
    cases = [
        ((8192, 768), torch.bfloat16, True, False),
        ((8192, 768), torch.bfloat16, False, False),
        ((64, 256), torch.bfloat16, True, False),
        ((4096, 4097), torch.bfloat16, True, False),
        ((2048, 2048), torch.float32, True, False),
        ((8192, 4096), torch.bfloat16, False, True),
    ]
    bad = 0
    for shape, dtype, bias, rms in cases:
        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(shape, device="cuda", dtype=dtype, generator=g)
        w = (1 + 0.1 * torch.randn(shape[-1], device="cuda", generator=g)).to(dtype)
        b = (0.1 * torch.randn(shape[-1], device="cuda", generator=g)).to(dtype) if bias else None
        dy = torch.randn(shape, device="cuda", dtype=dtype, generator=g)
        eps = 1e-6 if rms else 1e-5
        if rms:
            n_fn = lambda x_, w_, b_: node.rms_norm(x_, w_, eps)  # noqa: E731
            t_fn = lambda x_, w_, b_: kernellab.rms_norm(x_, w_, eps, backend="triton")  # noqa: E731
        else:
            n_fn = lambda x_, w_, b_: node.layer_norm(x_, w_, b_, eps)  # noqa: E731
            t_fn = lambda x_, w_, b_: kernellab.layer_norm(x_, w_, b_, eps, backend="triton")  # noqa: E731
        got, want = grads(n_fn, x, w, b, dy), grads(t_fn, x, w, b, dy)
        name = f"{'rms' if rms else 'ln'} {'x'.join(map(str, shape))} {str(dtype)[6:]} bias={bias}"
        if got is None:
            print(f"{name}: the node did not take the call")
            bad += 1
            continue
        same = all(torch.equal(a, c) for a, c in zip(got, want))
        y64 = ref(x, w, b, eps, rms)
        err = (got[0].double() - y64).abs().max().item()
        print(f"{name}: bitwise as the Triton backend: {same}; y max |err| vs fp64 {err:.3g}")
        rows_out.append({"case": name, "bitwise": same, "y_err": err})
        bad += not same
    return bad


def host(node, rows_out):
    for shape in ((64, 256), (8192, 768)):
        x = torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        w = torch.ones(shape[-1], device="cuda", dtype=torch.bfloat16, requires_grad=True)
        b = torch.zeros(shape[-1], device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        fns = {
            "torch": lambda: F.layer_norm(x, shape[-1:], w, b, 1e-5).backward(dy),
            "kernellab triton": lambda: kernellab.layer_norm(x, w, b, 1e-5, backend="triton").backward(dy),
            "C++ node (triton kernels)": lambda: node.layer_norm(x, w, b, 1e-5).backward(dy),
        }
        times = {k: [] for k in fns}
        for _ in range(7):  # rounds alternate: the host's speed drifts
            for k, fn in fns.items():
                times[k].append(timer.loop_ms(fn, 200, rounds=1) * 1e3)
        med = {k: statistics.median(v) for k, v in times.items()}
        line = ", ".join(f"{k} {v:.1f} us ({v / med['torch']:.2f}x)" for k, v in med.items())
        print(f"layer_norm fwd+bwd {shape[0]}x{shape[1]} bf16, per call in a plain loop: {line}")
        rows_out.append({"host_us": med, "shape": list(shape)})


def nano(node, rows_out, rounds=5, steps=10):
    from kernellab.models.user_models import NanoGPT, make_step, nano_ops

    torch.manual_seed(0)
    base = NanoGPT(50304, 1024, 768, 12, 12, nano_ops("torch")).to("cuda", torch.bfloat16)
    kl = nano_ops("kernellab")
    with_node = dict(kl, ln=lambda x, m: node.layer_norm(x, m.weight, m.bias, m.eps))
    runs = {}
    for name, ops in (("torch", nano_ops("torch")), ("kernellab", kl), ("kernellab + node", with_node)):
        m = copy.deepcopy(base)
        m.ops = ops
        for blk in m.blocks:
            blk.ops = ops
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True)
        runs[name] = make_step(m, opt, "eager", False)
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, 50304, (8, 1024), generator=g).cuda()
    tgt = torch.randint(0, 50304, (8, 1024), generator=g).cuda()
    for step in runs.values():
        for _ in range(3):
            step(idx, tgt)
    torch.cuda.synchronize()
    ms = {k: [] for k in runs}
    for _ in range(rounds):
        for k, step in runs.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(steps):
                step(idx, tgt)
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
    node = TritonNode()
    rows: list = []
    bad = check(node, rows)
    host(node, rows)
    nano(node, rows)
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        with open(Path(a.out) / "triton_node.jsonl", "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
