"""Timing that tells the truth (DESIGN.md "Timing").

On a GPU: CUDA events around each call (a spin kernel holds the device while the host
queues each batch, so the events time device work, not Python); warm-up first (by device
time, so clocks have ramped up); the L2 flushed before every call
by zeroing a buffer of twice the device's L2 (outside the events); repetitions grow
until the median is known to +-``rel_tol`` (a distribution-free confidence interval of
the median from order statistics) or the time budget is spent; median with p20/p80.
A CUDA-graph mode replays many captured calls per graph launch, for small launch-bound
work. The host cost per call is measured on its own: the host clock around single calls
issued to an idle device.

On the CPU: the host clock around each call (no cache flush; rows say so).
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass

import torch


@dataclass
class Timing:
    median_ms: float
    p20_ms: float
    p80_ms: float
    reps: int
    method: str  # "cuda-events", "cuda-graph", "host-clock"
    flushed: bool

    def as_dict(self) -> dict:
        return {
            "median_ms": self.median_ms,
            "p20_ms": self.p20_ms,
            "p80_ms": self.p80_ms,
            "reps": self.reps,
            "timer": self.method,
            "l2_flush": self.flushed,
        }


def _quantile(sorted_times, q: float) -> float:
    if not sorted_times:
        return float("nan")
    pos = q * (len(sorted_times) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_times[lo] + (sorted_times[hi] - sorted_times[lo]) * (pos - lo)


def median_is_stable(sorted_times, rel_tol: float) -> bool:
    """True when the ~95% confidence interval of the median (order statistics
    n/2 +- 0.98 sqrt(n)) is narrower than +-rel_tol of the median."""
    n = len(sorted_times)
    if n < 5:
        return False
    half = 0.98 * math.sqrt(n)
    lo = sorted_times[max(0, math.floor(n / 2 - half))]
    hi = sorted_times[min(n - 1, math.ceil(n / 2 + half))]
    med = _quantile(sorted_times, 0.5)
    return med > 0 and (hi - lo) / med <= 2 * rel_tol


def _summarize(times, method, flushed) -> Timing:
    s = sorted(times)
    return Timing(_quantile(s, 0.5), _quantile(s, 0.2), _quantile(s, 0.8), len(s), method, flushed)


_FLUSH: dict = {}


def _flush_buffer() -> torch.Tensor:
    """A buffer of at least twice the L2 (DESIGN.md); zeroing it evicts our data."""
    from kernellab.device import l2_bytes

    dev = torch.cuda.current_device()
    buf = _FLUSH.get(dev)
    if buf is None:
        buf = torch.empty(max(2 * l2_bytes(), 64 * 2**20), dtype=torch.int8, device="cuda")
        _FLUSH[dev] = buf
    return buf


def warm_up(fn, min_calls: int = 3, min_s: float = 0.1) -> None:
    """Call ``fn`` for at least ``min_calls`` calls and ``min_s`` seconds of device time.

    By count alone (3 calls) is not enough: a bandwidth-bound kernel timed right after the
    GPU sat idle for a second (a Triton JIT compile, a float64 reference on the host) runs
    ~15% slow for its first ~20 calls while the clocks come back up, and a stable-looking
    median of 20 calls would record that."""
    t0 = time.perf_counter()
    calls = 0
    while calls < min_calls or time.perf_counter() - t0 < min_s:
        fn()
        calls += 1
        if calls % 8 == 0 and torch.cuda.is_available():
            torch.cuda.synchronize()  # count device time, not queued work
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _event_loop(
    call,
    *,
    before=None,
    per_event: int = 1,
    min_reps: int,
    min_time_s: float,
    max_reps: int,
    budget_s: float,
    rel_tol: float,
) -> list[float]:
    """Times of ``call()`` (ms, divided by ``per_event``) between CUDA events, in batches
    that grow until the median is stable to +-rel_tol and min_time_s has passed, or the
    budget or max_reps is reached. ``before()`` runs ahead of each start event (the flush)."""
    times: list[float] = []
    t_start = time.perf_counter()
    batch = min_reps
    host_per_iter = 500e-6  # first guess; measured on every batch
    while True:
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(batch)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(batch)]
        # Keep the device busy while the host enqueues the batch. Otherwise, when one
        # call's host cost exceeds its device time (a 2^20-element GeLU: ~4 us on the GPU,
        # ~30 us of Python), the GPU idles between the start event and the kernel and the
        # events time the host (tens of us of "device time" for a 4 us kernel).
        _hold_device(host_per_iter * batch * 1.5)
        t_enq = time.perf_counter()
        for i in range(batch):
            if before is not None:
                before()
            starts[i].record()
            call()
            ends[i].record()
        host_per_iter = (time.perf_counter() - t_enq) / batch
        torch.cuda.synchronize()
        times.extend(s.elapsed_time(e) / per_event for s, e in zip(starts, ends))
        spent = time.perf_counter() - t_start
        stable = len(times) >= min_reps and spent >= min_time_s and median_is_stable(sorted(times), rel_tol)
        if len(times) >= max_reps or spent > budget_s or stable:
            return times
        # Next batch: double what we have, within the remaining budget.
        per_call_s = max(spent / len(times), 1e-6)
        batch = max(1, int(min(len(times), max_reps - len(times), max(1, (budget_s - spent) / per_call_s))))


def _hold_device(seconds: float) -> None:
    """Queue a spin kernel of about ``seconds`` (capped at 0.25 s) on the current stream."""
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is not None and seconds > 0:
        sleep(int(min(seconds, 0.25) * 2.0e9))  # clock cycles at ~2 GHz; longer is harmless


def time_cuda(
    fn,
    *,
    flush: bool = True,
    warmup_s: float = 0.1,
    min_reps: int = 10,
    min_time_s: float = 0.2,
    max_reps: int = 2000,
    budget_s: float = 1.5,
    rel_tol: float = 0.01,
) -> Timing:
    """Time ``fn()`` on the current CUDA stream with events. Stops when the median is
    stable to +-rel_tol *and* at least min_time_s has been spent, or at the budget."""
    warm_up(fn, min_s=warmup_s)
    buf = _flush_buffer() if flush else None
    times = _event_loop(
        fn,
        before=buf.zero_ if buf is not None else None,
        min_reps=min_reps,
        min_time_s=min_time_s,
        max_reps=max_reps,
        budget_s=budget_s,
        rel_tol=rel_tol,
    )
    return _summarize(times, "cuda-events", buf is not None)


def time_cuda_graph(
    fn,
    *,
    calls_per_graph: int = 20,
    warmup: int = 3,
    min_reps: int = 10,
    max_reps: int = 500,
    budget_s: float = 1.5,
    rel_tol: float = 0.01,
) -> Timing:
    """Capture ``calls_per_graph`` calls of ``fn`` into one CUDA graph and time replays;
    per-call time = replay time / calls_per_graph. No flush between the calls of a graph:
    this mode is for small, launch-bound work."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture stream, as CUDA graphs require
        for _ in range(warmup):
            fn()
        warm_up(fn, min_s=0.05)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls_per_graph):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = _event_loop(
        graph.replay,
        per_event=calls_per_graph,
        min_reps=min_reps,
        min_time_s=0.1,
        max_reps=max_reps,
        budget_s=budget_s,
        rel_tol=rel_tol,
    )
    t = _summarize(times, "cuda-graph", False)
    t._graph = graph  # keep the graph (and its memory) alive while the caller re-checks
    return t


def time_host(
    fn,
    *,
    warmup: int = 2,
    min_reps: int = 5,
    max_reps: int = 1000,
    budget_s: float = 1.0,
    rel_tol: float = 0.02,
) -> Timing:
    """Time ``fn()`` with the host clock (the CPU path)."""
    warm_up(fn, min_calls=warmup, min_s=0.0)
    times: list[float] = []
    t_start = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
        spent = time.perf_counter() - t_start
        if len(times) >= max_reps or spent > budget_s and len(times) >= min_reps:
            break
        if len(times) >= min_reps and median_is_stable(sorted(times), rel_tol):
            break
    return _summarize(times, "host-clock", False)


def host_cost_us(fn, calls: int = 100, budget_s: float = 0.5) -> float:
    """Median host time of one call, each call starting with the device idle and its
    queue empty (synchronized outside the timed region): what the CPU spends issuing the
    work, unaffected by a full launch queue. Back-to-back calls of a long GPU job would
    otherwise block in the driver once ~1000 launches are queued and report GPU time."""
    cuda = torch.cuda.is_available()
    for _ in range(3):
        fn()
    times = []
    t_start = time.perf_counter()
    while len(times) < calls and (len(times) < 10 or time.perf_counter() - t_start < budget_s):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    if cuda:
        torch.cuda.synchronize()
    return _quantile(sorted(times), 0.5) * 1e6


def _sync():
    return torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)


def calls_for(fn, seconds: float) -> int:
    """Back-to-back calls of ``fn`` that take ~``seconds`` (one warm-up call, then one timed
    probe), capped to [3, 200]: the launch queue holds ~1000 kernels, and a longer loop of
    tiny calls would block in the driver."""
    sync = _sync()
    fn()
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    return int(min(200, max(3, seconds / max(time.perf_counter() - t0, 1e-7))))


def loop_ms(fn, calls: int | None = None, rounds: int = 5, budget_s: float = 0.5) -> float:
    """Time per call of ``fn`` in a plain loop: back-to-back calls, no device hold, no cache
    flush, one synchronize at the end of each round (median of ``rounds``): what an eager
    model sees. A call whose host cost exceeds its device time is host-bound here, which
    the device timer (events behind a spin kernel) does not show.

    ``calls`` per round defaults to what fits ~budget_s / rounds (``calls_for``)."""
    sync = _sync()
    if calls is None:
        calls = calls_for(fn, budget_s / rounds)
    else:
        fn()
        sync()
    per = []
    for _ in range(rounds):
        sync()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        per.append((time.perf_counter() - t0) / calls)
    return _quantile(sorted(per), 0.5) * 1e3


def paired_loop_ms(fns: dict, calls: dict, rounds: int, warmup_rounds: int = 1) -> tuple[dict, dict]:
    """Plain-loop time per call (ms) of several functions taking turns: each round runs
    every ``fns[name]`` once (``calls[name]`` back-to-back calls, one synchronize; every other
    round in reverse order), so a host whose speed drifts between minutes (by up to 2x)
    drifts under all of them alike, and ratios of the same round compare like with like.
    ``warmup_rounds`` whole rounds run first and are not kept: a forward+backward loop's
    first round can run 3x its later ones (the allocator growing). Returns (name -> [ms per
    round], name -> the exception of a function that raised; it is left out of later
    rounds)."""
    times: dict = {name: [] for name in fns}
    errors: dict = {}
    order = list(fns.items())
    for r in range(-warmup_rounds, rounds):  # (rounds below 0: the warm-up, not kept)
        # every other round in reverse: a function's place in the round (first after the
        # previous round's sync, or right after another's calls) is no systematic edge
        for name, fn in order if r < 0 or r % 2 == 0 else order[::-1]:
            if name in errors:
                continue
            try:
                ms = loop_ms(fn, calls=calls[name], rounds=1)
            except Exception as e:  # noqa: BLE001 - the caller reports it
                errors[name] = e
                continue
            if r >= 0:
                times[name].append(ms)
    return times, errors


def paired_ratio(a: list, b: list) -> float:
    """The median over rounds of a's time over b's in the same round (``paired_loop_ms``'s
    rounds): the ratio a drifting host leaves alone."""
    return statistics.median(x / y for x, y in zip(a, b))


def paired_us(cases: dict, base_of, rounds: int, seconds: float = 0.03) -> dict:
    """The probes' measure: each case's plain-loop time per call (us, the median over
    ``paired_loop_ms`` rounds of ~``seconds`` each) and its ``paired_ratio`` to the case
    ``base_of(name)`` names. Returns name -> (us, ratio), or the exception it raised (sizing
    its round, or in one); a ratio to a base that raised is None."""
    calls, errors = {}, {}
    for k, f in cases.items():
        try:
            calls[k] = calls_for(f, seconds)
        except Exception as e:  # noqa: BLE001 - the caller reports it
            errors[k] = e
    times, failed = paired_loop_ms({k: f for k, f in cases.items() if k in calls}, calls, rounds)
    errors.update(failed)
    out = {}
    for k in cases:
        if k in errors:
            out[k] = errors[k]
        else:
            base = base_of(k)
            ratio = None if base in errors else paired_ratio(times[k], times[base])
            out[k] = (statistics.median(times[k]) * 1e3, ratio)
    return out
