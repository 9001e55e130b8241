"""The lab probes' shared pieces: the CUDA kernels of one call under torch.profiler, and a
row printed and appended to a JSON-lines file."""

import json

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile


def top_kernels_us(fn, n: int = 6, width: int = 90) -> dict[str, float]:
    """The ``n`` kernels that took the most device time in one call of ``fn`` (after a
    synchronize), names cut to ``width``: {name: us summed over its launches}."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    kern: dict[str, float] = {}
    for e in prof.events():
        if e.device_type == DeviceType.CUDA:
            kern[e.name] = kern.get(e.name, 0.0) + e.time_range.elapsed_us()
    return {k[:width]: round(v, 1) for k, v in sorted(kern.items(), key=lambda kv: -kv[1])[:n]}


def emit_row(row: dict, out: str | None) -> None:
    """A probe's row: printed, and appended to ``out`` as one JSON line (as measured, so a
    run cut by a time limit keeps what it did)."""
    print(json.dumps(row), flush=True)
    if out:
        with open(out, "a") as f:
            f.write(json.dumps(row) + "\n")
