"""torch.profiler front-end: what an op launches, how long each kernel runs, where the time
goes between host and device, and a Chrome/Perfetto trace of it.

``profile_call`` profiles any zero-argument callable; ``profile_op`` builds the call from the
registry and the op's spec (fresh random inputs, as the benchmark does). The trace parser
(``trace_summary``) reads the exported Chrome trace JSON: kernels are matched to the host
ranges that launched them through CUPTI's correlation ids, which is what the MLP demo needs
to say how far the CPU runs ahead of the GPU.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

# Launch calls as CUPTI names them: runtime API (PyTorch, Triton) and driver API (our
# NVRTC kernels, launched with cuLaunchKernel).
LAUNCH_NAMES = (
    "cudaLaunchKernel",
    "cuLaunchKernel",
    "cudaLaunchKernelExC",
    "cuLaunchKernelEx",
    "cudaGraphLaunch",
    "cuGraphLaunch",
)


@dataclass
class KernelRow:
    name: str
    calls: int
    self_us: float  # total self device time over all profiled calls
    share: float  # fraction of the total device time


@dataclass
class ProfileResult:
    device: str  # "cuda" or "cpu"
    iters: int
    rows: list[KernelRow] = field(default_factory=list)  # device kernels (CPU ops on the CPU)
    kernels_per_call: float = 0.0
    cpu_us_per_call: float = 0.0  # host wall time per call (nothing synchronized inside)
    gpu_us_per_call: float = 0.0  # sum of kernel time per call
    trace_path: str | None = None
    note: str = ""

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["rows"] = [r.__dict__ for r in self.rows]
        return d


def _self_device_us(evt) -> float:
    for attr in ("self_device_time_total", "self_cuda_time_total"):
        v = getattr(evt, attr, None)
        if v is not None:
            return float(v)
    return 0.0


def profile_call(
    fn, *, iters: int = 10, warmup: int = 3, trace_path=None, label="kernellab.call"
) -> ProfileResult:
    """Profile ``iters`` calls of ``fn`` after ``warmup`` unprofiled ones."""
    cuda = torch.cuda.is_available()
    for _ in range(warmup):
        fn()
    if cuda:
        torch.cuda.synchronize()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        for i in range(iters):
            with record_function(f"{label}#{i}"):
                fn()
        t_host = time.perf_counter() - t0
        if cuda:
            torch.cuda.synchronize()
    res = ProfileResult(device="cuda" if cuda else "cpu", iters=iters)
    res.cpu_us_per_call = t_host / iters * 1e6
    events = prof.key_averages()
    if cuda:
        # GPU-side copies of record_function / NVTX ranges ("user annotations") carry the
        # range's duration on the CUDA timeline: they are not kernels.
        kernels = [
            e
            for e in events
            if str(e.device_type).endswith("CUDA")
            and not getattr(e, "is_user_annotation", False)
            and _self_device_us(e) > 0
        ]
        total = sum(_self_device_us(e) for e in kernels) or 1.0
        res.rows = sorted(
            (KernelRow(e.key, e.count, _self_device_us(e), _self_device_us(e) / total) for e in kernels),
            key=lambda r: -r.self_us,
        )
        res.kernels_per_call = sum(r.calls for r in res.rows) / iters
        res.gpu_us_per_call = sum(r.self_us for r in res.rows) / iters
    else:
        ops = [e for e in events if not e.key.startswith(label) and e.self_cpu_time_total > 0]
        total = sum(e.self_cpu_time_total for e in ops) or 1.0
        res.rows = sorted(
            (KernelRow(e.key, e.count, e.self_cpu_time_total, e.self_cpu_time_total / total) for e in ops),
            key=lambda r: -r.self_us,
        )
        res.note = "no CUDA device: CPU activity only, GPU columns absent"
    if trace_path:
        Path(trace_path).parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(trace_path))
        res.trace_path = str(trace_path)
    return res


def op_call(op: str, backend: str, shape, dtype, mode: str = "fwd", device: str | None = None, seed: int = 0):
    """A zero-argument callable running one unit of ``op``'s work, as the benchmark does."""
    from kernellab import device as _device
    from kernellab.core import registry
    from kernellab.core.spec import get_spec
    from kernellab.harness.bench import make_problem

    spec = get_spec(op)
    dev = device or _device.default_device()
    impl = registry.get(op, backend)
    why = impl.why_unavailable(dev)
    if why:
        raise ValueError(f"{op}/{backend} cannot run here: {why}")
    if mode not in spec.modes:
        raise ValueError(f"mode {mode!r} not available for {op}; choose from {', '.join(spec.modes)}")
    prob = make_problem(spec, tuple(shape), dtype, mode, dev, seed)
    fn, _ = prob.call(impl)
    return fn


def profile_op(op, backend, shape, dtype, mode="fwd", *, iters=10, trace_path=None) -> ProfileResult:
    return profile_call(op_call(op, backend, shape, dtype, mode), iters=iters, trace_path=trace_path)


# --------------------------------------------------------------------------- traces


@dataclass
class StepTiming:
    name: str
    cpu_start: float  # us, trace clock
    cpu_end: float
    gpu_start: float | None
    gpu_end: float | None
    kernels: int

    @property
    def run_ahead_us(self) -> float | None:
        """How long after the host finished issuing this step the GPU finished running it."""
        return None if self.gpu_end is None else self.gpu_end - self.cpu_end


def trace_summary(trace, step_prefix: str = "step") -> dict:
    """Steps (host ``record_function`` ranges named ``<step_prefix>...``), the kernels each
    launched (by correlation id), GPU busy and idle time over the run.

    ``trace``: the exported Chrome trace (path or parsed dict)."""
    if not isinstance(trace, dict):
        trace = json.loads(Path(trace).read_text())
    evs = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    steps = sorted(
        (
            e
            for e in evs
            if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith(step_prefix)
        ),
        key=lambda e: e["ts"],
    )
    launches = [e for e in evs if e.get("name") in LAUNCH_NAMES and "correlation" in e.get("args", {})]
    kernels = {
        e["args"]["correlation"]: e
        for e in evs
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "correlation" in e.get("args", {})
    }
    out_steps = []
    in_steps = []  # kernels launched inside a step (the window excludes set-up work)
    for s in steps:
        s0, s1 = s["ts"], s["ts"] + s["dur"]
        ks = [
            kernels[la["args"]["correlation"]]
            for la in launches
            if s0 <= la["ts"] <= s1 and la["args"]["correlation"] in kernels
        ]
        in_steps.extend(ks)
        out_steps.append(
            StepTiming(
                s["name"],
                s0,
                s1,
                min((k["ts"] for k in ks), default=None),
                max((k["ts"] + k["dur"] for k in ks), default=None),
                len(ks),
            )
        )
    # GPU busy = union of kernel intervals; idle = the gaps inside [first start, last end].
    spans = sorted((k["ts"], k["ts"] + k["dur"]) for k in (in_steps if steps else kernels.values()))
    busy, cur_s, cur_e = 0.0, None, None
    for a, b in spans:
        if cur_e is None or a > cur_e:
            if cur_e is not None:
                busy += cur_e - cur_s
            cur_s, cur_e = a, b
        else:
            cur_e = max(cur_e, b)
    if cur_e is not None:
        busy += cur_e - cur_s
    window = (spans[-1][1] - spans[0][0]) if spans else 0.0
    ahead = [s.run_ahead_us for s in out_steps if s.run_ahead_us is not None]
    return {
        "steps": out_steps,
        "kernels": len(kernels),
        "gpu_busy_us": busy,
        "gpu_window_us": window,
        "gpu_idle_us": max(0.0, window - busy),
        "gpu_idle_frac": (max(0.0, window - busy) / window) if window else None,
        "mean_run_ahead_us": (sum(ahead) / len(ahead)) if ahead else None,
    }
