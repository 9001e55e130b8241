"""Why a row's device time exceeds its loop time (GPU): the event timer hides host gaps
behind a spin kernel, unless the call itself waits for the device. This runs one
backend's timed call (harness.bench's problem) and reports what in it synchronizes: the
warnings of ``torch.cuda.set_sync_debug_mode`` and, from the profiler, the CUDA runtime and
driver calls that block or allocate, per call; then event time with and without the L2
flush beside the plain loop time.

    PYTHONPATH=src python lab/probe_sync.py matmul cuda 4097x4095x1023 --mode fwdbwd --b-t
"""

from __future__ import annotations

import argparse
import collections
import json
import warnings

import torch

import kernellab
from kernellab.core import registry
from kernellab.core.spec import parse_shape
from kernellab.harness import timer
from kernellab.harness.bench import make_problem

BLOCKING = ("Synchronize", "Memcpy", "Malloc", "Free", "MemAlloc", "MemFree", "Occupancy", "ModuleLoad",
            "LibraryLoad", "FuncSetAttribute")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("op")
    p.add_argument("backend")
    p.add_argument("shape")
    p.add_argument("--mode", default="fwdbwd", choices=("fwd", "fwdbwd"))
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--b-t", action="store_true", help="matmul: b as nn.Linear's W.t()")
    p.add_argument("--calls", type=int, default=5)
    p.add_argument("--out", help="append the summary as a JSON line to this file")
    a = p.parse_args()
    spec = kernellab.get_spec(a.op)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[a.dtype]
    opts = {"b_t": True} if a.b_t else None
    prob = make_problem(spec, parse_shape(a.shape), dtype, a.mode, "cuda", 0, opts)
    fn, _ = prob.call(registry.get(a.op, a.backend))
    timer.warm_up(fn)
    torch.cuda.synchronize()

    torch.cuda.set_sync_debug_mode("warn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
        torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("default")
    syncs = [str(w.message).splitlines()[0][:160] for w in caught if "synchroniz" in str(w.message).lower()]

    acts = torch.profiler.ProfilerActivity
    with torch.profiler.profile(activities=[acts.CPU, acts.CUDA]) as prof:
        for _ in range(a.calls):
            fn()
        torch.cuda.synchronize()
    blocking = collections.Counter()
    for e in prof.events():
        if any(k in e.name for k in BLOCKING):
            blocking[e.name] += 1
    per_call = {k: v / a.calls for k, v in sorted(blocking.items())}

    flushed = timer.time_cuda(fn, flush=True).median_ms
    unflushed = timer.time_cuda(fn, flush=False).median_ms
    loop = timer.loop_ms(fn)
    row = dict(op=a.op, backend=a.backend, shape=a.shape, mode=a.mode, dtype=a.dtype, b_t=a.b_t,
               gpu=torch.cuda.get_device_name(), sync_warnings=syncs, blocking_per_call=per_call,
               events_flushed_ms=round(flushed, 4), events_ms=round(unflushed, 4),
               loop_ms=round(loop, 4))  # fmt: skip
    print(json.dumps(row, indent=1))
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25))
    if a.out:
        with open(a.out, "a") as f:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
