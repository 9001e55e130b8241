"""Triton attention fp32: the backward's row statistics, recomputed against the saved
log-sum-exp (GPU or CPU).

    python lab/attention_fp32_lse.py [--out DIR] [--seeds 20] [--no-time | --time-only]

Every dtype saves the one-plane log-sum-exp (..., S_q). The fp32 backward recomputes (row
max in score units, log2 l) with the forward kernel's STATS mode and forms every
probability as exp2((s - m) * |c| - log2 l) ("stats", as shipped); 16-bit backwards use
exp2(s * c - lse) from the saved lse ("one-plane", what ``backward_into(...,
exact_stats=False)`` runs in fp32). This runs the fp32 backward both ways on the same
problems and prints, per form, the worst error / bound of dq, dk, dv (the check's bound:
twice PyTorch's error against float64 plus one fp32 eps of scale,
``harness.compare.judge``) and how many problems exceed it. On a GPU it also times the
fp32 forward and both backwards at model shapes (CUDA events, L2 flushed): the cost of
the recompute. Rows -> DIR/attention_fp32_lse.jsonl.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

import kernellab.ops.attention as A
from kernellab.ops.attention import args as AA
from kernellab.harness.compare import judge
from kernellab.ops.attention import triton as tri

# (shape, causal, window, scale): few-key rows (small S_k, windows), the check's option
# problems (scale 0.5 on D = 64: peaked rows), odd lengths, GQA.
PROBLEMS = [
    ((1, 2, 17, 33, 16), False, (4, 6), None),
    ((1, 2, 9, 5, 8), False, None, None),
    ((2, 3, 37, 64), True, None, None),
    ((1, 2, 29, 45, 64), False, None, 0.5),
    ((1, 2, 29, 45, 64), True, None, 0.05),
    ((1, 2, 45, 70, 32), True, (9, -1), None),
    ((1, 4, 2, 61, 77, 40), True, None, None),
    ((1, 2, 130, 129, 96), False, None, None),
    ((1, 2, 2, 40), True, (0, -1), 0.103),  # every row sees one key: PyTorch's dq is exactly 0
]
TIMED = [((1, 12, 1024, 64), True), ((4, 16, 2048, 128), True), ((2, 8, 64, 64), False)]


FORMS = ("stats", "one-plane")  # exact_stats True (as shipped) / False


def _backward(form, dy, q, k, v, o, lse, causal, scale, wl=-1, wr=-1):
    return tri.backward_into(
        dy, q, k, v, o, lse, causal, scale, None, None, None, wl, wr, exact_stats=form == "stats"
    )


def _grads(form, q, k, v, dy, causal, scale, window):
    """(dq, dk, dv) of the Triton kernels (the launchers, as the op runs them)."""
    wl, wr = window if window is not None else (-1, -1)
    o, lse = tri.forward(q, k, v, causal, scale, wl, wr)
    return _backward(form, dy, q, k, v, o, lse, causal, scale, wl, wr)


def _errors(shape, causal, window, scale, seed, dev):
    q, k, v = A.SPEC.make_inputs(shape, torch.float32, dev, seed)
    scale = AA.resolve_scale(q, scale)
    opts = {"causal": causal, "scale": scale, **({"window": window} if window else {})}
    a64 = [t.double().requires_grad_() for t in (q, k, v)]
    ref = A.SPEC.reference(*a64, **opts)
    dy = torch.randn(ref.shape, generator=torch.Generator(device=dev).manual_seed(seed + 1), device=dev)
    rg = torch.autograd.grad(ref, a64, dy.double())
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    tg = torch.autograd.grad(A.attention(*leaves, backend="torch", **opts), leaves, dy)
    out = {}
    for form in FORMS:
        ours = _grads(form, q, k, v, dy, causal, scale, window)
        ratios = []
        for g, r, t in zip(ours, rg, tg):
            verdict = judge(g.reshape(r.shape), r, torch.float32, t)
            ratios.append(verdict.err / verdict.bound)
        out[form] = ratios
    return out


def _time(shape, causal, dev):
    from kernellab.harness.timer import time_cuda

    q, k, v = A.SPEC.make_inputs(shape, torch.float32, dev, 0)
    dy = torch.randn(q.shape, device=dev)
    scale = 1 / math.sqrt(shape[-1])
    rows = {}
    fwd = time_cuda(lambda: tri.forward(q, k, v, causal, scale)).median_ms
    o, lse = tri.forward(q, k, v, causal, scale)
    for form in FORMS:
        bwd = time_cuda(lambda: _backward(form, dy, q, k, v, o, lse, causal, scale)).median_ms
        rows[form] = (fwd, bwd)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--no-time", action="store_true")
    ap.add_argument("--time-only", action="store_true", help="skip the error sweep")
    args = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    name = torch.cuda.get_device_name() if dev == "cuda" else "cpu"
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    path = None
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        path = Path(args.out) / "attention_fp32_lse.jsonl"

    def emit(row):  # appended as measured: a run cut by a time limit keeps what it did
        if path is not None:
            with open(path, "a") as f:
                f.write(json.dumps({**row, "time": stamp}) + "\n")

    if not args.time_only:
        print(f"fp32 Triton attention on {name}: worst err/bound of dq, dk, dv over {args.seeds} seeds")
    for shape, causal, window, scale in [] if args.time_only else PROBLEMS:
        worst = {form: [0.0] * 3 for form in FORMS}
        over = dict.fromkeys(FORMS, 0)
        for seed in range(args.seeds):
            for form, ratios in _errors(shape, causal, window, scale, seed, dev).items():
                worst[form] = [max(a, b) for a, b in zip(worst[form], ratios)]
                over[form] += max(ratios) > 1.0
        label = f"{'x'.join(map(str, shape))} causal={causal} window={window} scale={scale}"
        for form in FORMS:
            w = worst[form]
            print(f"  {label:58s} {form:9s} dq {w[0]:.2f} dk {w[1]:.2f} dv {w[2]:.2f}  over: {over[form]}")
            emit({"kind": "error", "device": name, "shape": list(shape), "causal": causal,
                  "window": window, "scale": scale, "form": form, "seeds": args.seeds,
                  "worst_dq": w[0], "worst_dk": w[1], "worst_dv": w[2], "over": over[form]})  # fmt: skip
    if dev == "cuda" and not args.no_time:
        print("fp32 forward / backward ms (CUDA events, L2 flushed, TF32 off)")
        for shape, causal in TIMED:
            t = _time(shape, causal, dev)
            for form, (f, b) in t.items():
                label = "x".join(map(str, shape))
                print(f"  {label:16s} causal={causal!s:5s} {form:9s} fwd {f:.3f} bwd {b:.3f}")
                emit({"kind": "time", "device": name, "shape": list(shape), "causal": causal,
                      "form": form, "fwd_ms": f, "bwd_ms": b})  # fmt: skip


if __name__ == "__main__":
    main()
