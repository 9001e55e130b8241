"""The lab probes' shared pieces: the CUDA kernels of one call under torch.profiler, a case
warmed up, profiled and timed into its row, and a row printed and appended to a JSON-lines
file."""

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


def measure(row: dict, fn, top: int = 6) -> None:
    """Three warm-up calls of ``fn``; on a GPU its ``top`` kernels (``top_kernels_us``) and its
    median time (harness.timer, L2 flushed) into ``row``; an exception becomes the row's note."""
    from kernellab.harness import timer

    try:
        for _ in range(3):
            fn()
        if torch.cuda.is_available():
            row["top_kernels_us"] = top_kernels_us(fn, top)
            row["ms"] = round(timer.time_cuda(fn, min_time_s=0.1, budget_s=0.6).median_ms, 4)
    except Exception as e:  # noqa: BLE001 (a case that fails is a row's note)
        row["error"] = f"{type(e).__name__}: {e}"[:300]
