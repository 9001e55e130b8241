"""Time per call in a plain loop, every op x backend, at a tiny (launch-bound) shape and a
model-sized one, forward and forward+backward, PyTorch's own op in the same run.

    python -m kernellab.harness.host_cost --out DIR [--ops gelu add ...] [--quick]

Method: the bench harness's own callables (bench.Problem.call: the same forward, or
forward + autograd.grad with a fixed grad_output, for every backend and for ``default``,
the public call with backend=None: the tuning table's choice), timed by
harness.timer.loop_ms: back-to-back calls, one synchronize per round; the backends of a
(shape, mode) take turns, one round each, 7 rounds, and "vs torch" is the median over rounds
of the time over torch's in the same round (this host's speed drifts by 2x between minutes).
At the tiny shape the device time is a few microseconds, so the number is the host cost
per call; at the model-sized shape it is what an eager model sees. The issue's bounds at
the tiny shape: <= 1.3x torch, forward and forward+backward.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from kernellab import device as _device
from kernellab.core import registry
from kernellab.core.spec import get_spec
from kernellab.harness import timer
from kernellab.harness.bench import DefaultImpl, Problem, git_sha, versions

# op -> (tiny shape, model-sized shape, options), shapes in the OpSpec's convention.
SHAPES = {
    "add": ((64, 256), (8192, 768), {}),
    "gelu": ((64, 256), (8192, 3072), {}),
    "softmax": ((64, 256), (8192, 1024), {}),
    "layer_norm": ((64, 256), (16384, 768), {}),
    "rms_norm": ((64, 256), (16384, 4096), {}),
    "cross_entropy": ((64, 256), (8192, 50304), {}),
    "matmul": ((64, 64, 64), (8192, 3072, 768), {}),  # (M, N, K)
    "attention": ((1, 2, 64, 64), (8, 12, 1024, 64), {"causal": True}),
    "sum": ((64, 256), (8192, 4096), {}),
    "max": ((64, 256), (8192, 4096), {}),
    "argmax": ((64, 256), (8192, 4096), {}),
    "swiglu": ((16384,), (8192 * 8192,), {}),
    "geglu": ((16384,), (8192 * 3072,), {}),
    "rope": ((1, 2, 2, 64, 64, 64), (4, 32, 8, 2048, 128, 128), {}),
    "add_rms_norm": ((64, 256), (16384, 2048), {}),
    "linear_cross_entropy": ((64, 64, 256), (8192, 2048, 128256), {}),  # (N, H, V)
}
BOUND = {"fwd": 1.3, "fwdbwd": 1.3}
# Short rounds, many of them: on a shared host the same call's 50 ms rounds can range by
# nearly 2x within one run; 15 ms rounds taken in turn keep the backends of a group closer
# in time, and the median of 21 paired ratios moves less with one bad round.
ROUNDS = 21
SLOW_MS = 20.0  # a model-sized call slower than this is timed once, not paired


def _paired_rounds(fns, rounds: int) -> None:
    """The group's backends in turn, once per round (``timer.paired_loop_ms``); each row
    gets its per-round times (us) and their median, or the error its call raised."""
    times, errors = timer.paired_loop_ms(
        {i: fn for i, (_, fn, _) in enumerate(fns)}, {i: n for i, (_, _, n) in enumerate(fns)}, rounds
    )
    for i, (row, _, _) in enumerate(fns):
        if i in errors:
            e = errors[i]
            row["error"] = f"{type(e).__name__}: {e}"[:200]
        elif times[i]:
            row["rounds_us"] = [round(ms * 1e3, 2) for ms in times[i]]
            row["us_per_call"] = round(statistics.median(row["rounds_us"]), 2)


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    p.add_argument("--ops", nargs="+", default=list(SHAPES))
    p.add_argument("--quick", action="store_true", help="tiny shapes only, fewer rounds (CPU smoke run)")
    p.add_argument("--dtype", default=None, help="fp32 | bf16 (default: bf16 on a GPU, fp32 on the CPU)")
    p.add_argument("--tiny-only", action="store_true", help="the tiny (launch-bound) shapes only, full rounds: "
                   "the issue's bounds")  # fmt: skip
    args = p.parse_args(argv)
    if args.out:
        import os

        os.makedirs(args.out, exist_ok=True)
    dev = _device.default_device()
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[
        args.dtype or ("bf16" if dev == "cuda" else "fp32")
    ]
    meta = {"gpu": _device.gpu_name(), "git_sha": git_sha(), **versions(), "device": dev}
    for op in args.ops:
        if op not in SHAPES:
            raise SystemExit(f"--ops: unknown {op!r}; known: {', '.join(SHAPES)}")
        spec = get_spec(op)
        tiny, big, opts = SHAPES[op]
        sizes = [("tiny", tiny)] + ([] if args.quick or args.tiny_only else [("model", big)])
        modes = [m for m in ("fwd", "fwdbwd") if m in spec.modes]
        for label, shape in sizes:
            for mode in modes:
                prob = Problem(spec, shape, dtype, mode, dev, seed=0, options=opts)
                group, fns = [], []
                # "default": what backend=None picks (the public call, kernellab.<op>(x)).
                for impl in [*registry.impls(op), DefaultImpl(op)]:
                    if impl.why_unavailable(dev) or dtype not in (impl.dtypes or spec.dtypes):
                        continue
                    if dev == "cpu" and impl.backend == "compile":
                        continue  # minutes of codegen on a CPU, no claim made there
                    row = {**meta, "bench": "host_cost", "op": op, "backend": impl.backend, "mode": mode,
                           "size": label, "shape": "x".join(map(str, shape)),
                           "dtype": str(dtype).split(".")[-1], "options": opts}  # fmt: skip
                    try:
                        fn, _ = prob.call(impl)
                        calls = 20 if args.quick else timer.calls_for(fn, 0.015)
                        ms = timer.loop_ms(fn, calls=1, rounds=1) if label != "tiny" else 0.0
                        if ms > SLOW_MS:
                            # (21 rounds of at least 3 calls: the teaching backends at model
                            # size, 0.5-1 s a call, would take most of a device call's limit)
                            row["skipped"] = f"{ms:.0f} ms a call: too slow to pair at this size"
                            row["us_per_call"] = round(ms * 1e3, 1)
                        else:
                            fns.append((row, fn, calls))
                    except Exception as e:  # noqa: BLE001 - reported in its row
                        row["error"] = f"{type(e).__name__}: {e}"[:200]
                    group.append(row)
                _paired_rounds(fns, rounds=3 if args.quick else ROUNDS)
                base = next((r for r in group if r["backend"] == "torch" and r.get("rounds_us")), None)
                for r in group:
                    if base and r.get("rounds_us"):
                        # paired: the median over rounds of this backend's time over torch's in
                        # the same round (this host's speed drifts between rounds)
                        r["vs_torch"] = round(timer.paired_ratio(r["rounds_us"], base["rounds_us"]), 3)
                        if label == "tiny":
                            r["within_bound"] = r["vs_torch"] <= BOUND[mode]
                    if args.out:  # row by row: a run cut short by a time limit keeps what it measured
                        with open(f"{args.out}/host_cost.jsonl", "a") as f:
                            f.write(json.dumps(r) + "\n")
                    flag = {True: "ok", False: "OVER", None: ""}[r.get("within_bound")]
                    print(f"{op:14s} {r['backend']:12s} {mode:7s} {label:6s} {r['shape']:>16s} "
                          f"{r.get('us_per_call', float('nan')):10.2f} us  "
                          f"{r.get('vs_torch', float('nan')):6.2f}x torch  {flag} {r.get('error', '')}{r.get('skipped', '')}",  # noqa: E501
                          flush=True)  # fmt: skip
                del prob
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
