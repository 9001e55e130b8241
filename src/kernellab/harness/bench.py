"""The benchmark engine: sweeps of (shape, dtype, mode) x backends, one result row each.

For every (shape, dtype, mode) one set of fresh random inputs is made, and every backend
is timed on it (harness.timer), then *re-checked*: the output of the last timed call is
judged against the float64 reference (2 x PyTorch's error), and the inputs are then
refreshed in place with new random values and the call repeated and judged again - an
implementation that returns a cached or stale result is rejected, and a rejected row
carries no speed claim. Each row holds GB/s and TFLOP/s from the OpSpec's counts and the
fraction of the device's measured ceilings (``kernellab peaks``).

Beside the device time each row holds ``loop_ms``, the time per call in a plain loop of
back-to-back calls (host cost included, no device hold), ``effective_ms`` (the larger of
the two) and ``bound`` ("host" when the loop is over 10% slower than the device time). The
"vs torch" verdict (``speedup_vs_torch``) compares effective times;
``device_speedup_vs_torch`` keeps the device-only ratio.

With ``paired_rounds`` (``kernellab tune``'s), a launch-bound case (its fastest device time
under ``core.choice.DEVICE_BOUND_MS``, where loop times rank the backends) has its loop
times taken again with the backends taking turns (``timer.paired_loop_ms``): one after
another, a host whose speed drifts between minutes names the backend timed in its fast
minute. The rows keep the lone loop time as ``loop_ms_alone``.
"""

from __future__ import annotations

import datetime
import functools
import itertools
import os
import subprocess
import time

import torch

from kernellab import device as _device
from kernellab.core import registry
from kernellab.core.choice import decided_by_device
from kernellab.core.spec import dtype_name, get_spec, options_str, shape_str, split_options, to64
from kernellab.harness import timer
from kernellab.harness.compare import judge
from kernellab.harness.results import VENDOR
from kernellab.profile.nvtx import nvtx_range

MODES = ("fwd", "bwd", "fwdbwd")


@functools.cache
def git_sha() -> str:
    env = os.environ.get("KERNELLAB_GIT_SHA")
    if env:
        return env
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            cwd=os.path.dirname(__file__),
            capture_output=True,
            text=True,
            timeout=5,
        )
        if out.returncode == 0:
            return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


@functools.cache
def versions() -> dict:
    v = {"torch": torch.__version__, "triton": None, "cuda": torch.version.cuda}
    try:
        import triton

        v["triton"] = triton.__version__
    except ImportError:
        pass
    return v


def _outputs(out):
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


class Problem:
    """Inputs, reference and PyTorch's baseline for one (op, shape, dtype, mode)."""

    def __init__(self, spec, shape, dtype, mode, dev, seed, options=None):
        self.spec, self.shape, self.dtype, self.mode, self.dev = spec, shape, dtype, mode, dev
        # keyword options go to every call; input options (OpSpec.input_options) shape the inputs
        self.options, self.input_options = split_options(spec, options)
        self.args = spec.make_inputs(shape, dtype, dev, seed, **self.input_options)
        gen = torch.Generator(device=dev).manual_seed(seed + 1)
        self.wrt = list(spec.grad_args) if mode != "fwd" else []
        if self.wrt:
            for i in self.wrt:
                self.args[i].requires_grad_(True)
            # a grad_output for each differentiated output (OpSpec.grad_outputs)
            outs = _outputs(spec.ref(*self.args, **self.options))[: spec.grad_outputs]
            self.dy = tuple(torch.randn(o.shape, generator=gen, device=dev).to(dtype) for o in outs)
        self.seed = seed
        self._refreshes = 0
        self.expected = self._expected()

    def _expected(self):
        """float64 reference of what the timed call returns (outputs, or gradients)."""
        spec = self.spec
        if self.mode == "fwd":
            return _outputs(spec.ref(*self.args, **self.options))
        args64 = [to64(a) for a in self.args]
        for i in self.wrt:
            args64[i].requires_grad_(True)
        out = _outputs(spec.reference(*args64, **self.options))[: len(self.dy)]
        dy64 = [d.to(torch.float64) for d in self.dy]
        return tuple(torch.autograd.grad(out, [args64[i] for i in self.wrt], dy64))

    def call(self, impl):
        """A zero-argument function doing one timed unit of work, and a box holding its
        last result. A vendor's backend is called with the spec's ``peer_options`` (as its
        users call the op) under the case's own options."""
        box = [None]
        args, wrt = self.args, self.wrt
        kw = self.call_options(getattr(impl, "backend", None))
        if self.mode == "fwd":

            def fn():
                with torch.no_grad():
                    box[0] = _outputs(impl(*args, **kw))

        elif self.mode == "bwd":
            out = _outputs(impl(*args, **kw))[: len(self.dy)]
            leaves = [args[i] for i in wrt]

            def fn():
                box[0] = torch.autograd.grad(out, leaves, self.dy, retain_graph=True)

        else:
            leaves = [args[i] for i in wrt]

            def fn():
                box[0] = torch.autograd.grad(_outputs(impl(*args, **kw))[: len(self.dy)], leaves, self.dy)

        return fn, box

    def peer_extra(self, backend: str | None) -> dict:
        """The options ``backend`` is called with beyond the case's own: the spec's
        ``peer_options`` the case does not set, for a vendor's backend; else none (also for
        None, a bare callable)."""
        if backend not in VENDOR:
            return {}
        return {k: v for k, v in self.spec.peer_options.items() if k not in self.options}

    def call_options(self, backend: str | None) -> dict:
        """The keyword options ``backend`` is called with in this problem."""
        return {**self.options, **self.peer_extra(backend)}

    def refresh(self):
        """New random values written in place into the same input tensors."""
        # A new seed each time: the inputs must really change for every implementation
        # re-checked on this problem, not only for the first.
        self._refreshes += 1
        seed = self.seed + 7919 * self._refreshes
        fresh = self.spec.make_inputs(self.shape, self.dtype, self.dev, seed, **self.input_options)
        with torch.no_grad():
            for a, f in zip(self.args, fresh):
                if isinstance(a, torch.Tensor):
                    a.copy_(f)
        self.expected = self._expected()


class ProblemError(ValueError):
    """A problem (shape, dtype, mode, options) the op's inputs, its reference or PyTorch's
    op cannot take: a usage error naming the problem."""


def make_problem(spec, shape, dtype, mode, dev, seed, options=None) -> Problem:
    """``Problem(...)``, or a ProblemError naming the problem where its inputs or the float64
    reference cannot be made (a shape the op's inputs refuse, e.g. a conv2d filter larger
    than the image; memory run out): a usage error, not a traceback."""
    try:
        return Problem(spec, shape, dtype, mode, dev, seed, options)
    except (RuntimeError, ValueError, TypeError, IndexError) as e:
        what = problem_label(spec.name, shape, dtype, mode, options)
        raise ProblemError(f"{what}: its inputs or reference cannot be made: {type(e).__name__}: {e}") from e


def problem_label(op, shape, dtype, mode, options=None) -> str:
    opts = options_str(options) if options else ""
    return f"{op} {shape_str(shape)} {dtype_name(dtype)} {mode}" + (f" {opts}" if opts else "")


def problem_too_large(spec, shape, dtype, dev) -> str | None:
    """Why ``shape`` cannot be benchmarked in ``dtype`` on ``dev`` at all, or None: its
    inputs and outputs (``OpSpec.count_bytes``) and their float64 copies for the reference
    take more than the device's memory (a lower bound: workspace, gradients come on top)."""
    cap = _device.memory_bytes(dev)
    if cap is None:
        return None
    need = spec.count_bytes(shape, dtype, "fwd") * (1 + 8 / dtype.itemsize)
    if need <= cap:
        return None
    return (f"its inputs and outputs in {dtype_name(dtype)} and their float64 copies for the reference take "
            f"at least {_gib(need)}, more than the {_gib(cap)} of memory of this {dev}")  # fmt: skip


def _gib(n: float) -> str:
    return f"{n / 2**30:.3g} GiB" if n < 2**40 else f"{n / 2**40:.4g} TiB"


def _judge_all(outs, expected, dtype, baseline) -> tuple[bool, float, str]:
    if outs is None:
        return False, float("inf"), "no output"
    if len(outs) != len(expected):
        return False, float("inf"), f"{len(outs)} outputs, expected {len(expected)}"
    worst = 0.0
    for i, (o, e) in enumerate(zip(outs, expected)):
        v = judge(o, e, dtype, baseline[i] if baseline else None)
        if not v.ok:
            return False, v.err, v.detail
        worst = max(worst, v.ratio)
    return True, worst, ""


def bench(
    op: str,
    backends=None,
    shapes=None,
    dtypes=None,
    modes=("fwd",),
    *,
    device: str | None = None,
    graph: bool = False,
    flush: bool = True,
    budget_s: float = 1.5,
    seed: int = 0,
    on_row=None,
    on_start=None,
    options: dict | None = None,
    admitted: dict | None = None,
    paired_rounds: int = 0,
    skip=None,
    deadline: float | None = None,
) -> list[dict]:
    """Time ``op`` for every backend x shape x dtype x mode (x keyword-option case: the
    spec's ``bench_options``, or ``options`` when given); returns result rows (measured
    or rejected; backends that cannot run here, or whose declared limits (``Impl.limits``)
    leave the case out, appear with status "unavailable", the reason and no timing).
    ``paired_rounds``: see the module docstring (0: off). ``skip(case)``: True for a case
    not to time (``case_ident``'s tuple: what an earlier, cut-off run already timed);
    ``deadline``: a ``time.perf_counter()`` value past which no new case starts (the one
    under way finishes)."""
    spec = get_spec(op)
    dev = device or _device.default_device()
    impls = [i for i in registry.impls(op) if not backends or i.backend in backends]
    if backends and "default" in backends and ("default" not in {i.backend for i in impls}):
        impls.append(DefaultImpl(op))
    if backends:
        missing = set(backends) - {i.backend for i in impls}
        if missing:
            known = ", ".join(sorted({i.backend for i in registry.impls(op)} | {"default"}))
            raise KeyError(f"no backend(s) {', '.join(sorted(missing))} for op {op!r}; its backends: {known}")
    shapes = [tuple(s) for s in (shapes or (spec.bench_shapes if dev == "cuda" else spec.cpu_bench_shapes))]
    dtypes = list(dtypes or spec.dtypes)
    for m in modes:
        if m not in spec.modes:
            raise ValueError(f"mode {m!r} not available for {op}; choose from {', '.join(spec.modes)}")
    if graph and dev != "cuda":
        raise ValueError("graph=True (CUDA-graph timing) needs a GPU")
    peaks = _device.peaks() if dev == "cuda" else None
    if dev == "cuda":  # every row with the C++ nodes or every row without (a build finishes first)
        from kernellab.cuda import nodes

        nodes.settle()
    gpu = _device.gpu_name()
    rows = []
    admitted = {} if admitted is None else admitted  # (op, backend, dtype) -> admission verdict
    torch_impl = next((i for i in registry.impls(op) if i.backend == "torch"), None)

    cases = [dict(options)] if options is not None else [dict(o) for o in spec.bench_options]
    for dtype, shape, opts, mode in itertools.product(dtypes, shapes, cases, modes):
        if skip is not None and skip(case_ident(op, dtype, mode, shape, opts)):
            continue
        if deadline is not None and time.perf_counter() > deadline:
            break
        prob = make_problem(spec, shape, dtype, mode, dev, seed, opts)
        base_fn, base_box = prob.call(torch_impl) if torch_impl else (None, None)
        if base_fn:
            try:
                base_fn()
            except (RuntimeError, ValueError, TypeError, IndexError) as e:  # (not a problem PyTorch takes)
                raise ProblemError(f"{problem_label(op, shape, dtype, mode, opts)}: PyTorch's op refuses it: "
                                   f"{type(e).__name__}: {e}") from e  # fmt: skip
        baseline = base_box[0] if base_box else None
        group, timed = [], []
        for impl in impls:
            row = _base_row(op, impl.backend, mode, shape, dtype, gpu, dev)
            if opts:
                row["options"] = options_str(opts)
            why = impl.why_unavailable(dev)
            if why is None and dtype not in (impl.dtypes or spec.dtypes):
                why = f"{dtype_name(dtype)} not supported"
            if why is None:  # a documented limit (Impl.limits): refused by design, not an error
                limit = impl.outside_limits(prob.args, prob.options)
                why = f"outside its limits: {limit}" if limit else None
            if why:
                row.update(status="unavailable", reason=why)
                group.append(row)
                continue
            if on_start:
                on_start(impl, shape, dtype, mode)
            gate = _admit(impl, dtype, dev, admitted)
            if gate:
                row.update(status="rejected", reason=gate)
                group.append(row)
                continue
            extra = prob.peer_extra(impl.backend)
            if extra:  # a vendor timed as its users call it (OpSpec.peer_options)
                row["peer_options"] = options_str(extra)
            with nvtx_range(f"bench {op}/{impl.backend} {mode} {shape_str(shape)} {dtype_name(dtype)}"):
                row.update(_measure(impl, prob, baseline, dev, graph, flush, budget_s))
            _rates(row, spec, shape, dtype, mode, peaks, opts)
            group.append(row)
            timed.append((row, impl))
            if dev == "cuda":
                torch.cuda.empty_cache()
        if paired_rounds and not graph:
            pair_loop_times(timed, prob, paired_rounds)
        # Speed-up against torch within this group, by the larger of device time and loop
        # time on both sides (a backend faster on the device but host-bound loses in a
        # model); the device-only ratio is kept beside it.
        t_row = next((r for r in group if r["backend"] == "torch" and r["status"] == "ok"), None)
        for r in group:
            if t_row and r.get("status") == "ok":
                r["speedup_vs_torch"] = round(_eff(t_row) / _eff(r), 3)
                r["device_speedup_vs_torch"] = round(t_row["median_ms"] / r["median_ms"], 3)
            if on_row:
                on_row(r)
        rows.extend(group)
        del prob, baseline, base_box
    return rows


def case_ident(op: str, dtype, mode: str, shape, options=None) -> tuple:
    """One timed case as the rows of it spell it: (op, dtype name, mode, shape string,
    options string). ``dtype``: a torch dtype or its name; ``shape``: a tuple or its
    string; ``options``: a dict or its string."""
    if not isinstance(dtype, str):
        dtype = dtype_name(dtype)
    if not isinstance(shape, str):
        shape = shape_str(shape)
    if options is not None and not isinstance(options, str):
        options = options_str(options)
    return (op, dtype, mode, shape, options or "")


def row_ident(row: dict) -> tuple:
    """``case_ident`` of a bench row."""
    return (row["op"], row["dtype"], row["mode"], row["shape"], row.get("options") or "")


PAIRED_SECONDS = 0.02  # plain-loop time per backend per paired round


def pair_loop_times(timed, prob, rounds: int, seconds: float = PAIRED_SECONDS) -> bool:
    """Where the measured rows of one case (``timed``: (row, impl) pairs on ``prob``) are
    launch-bound (not ``choice.decided_by_device``: loop times rank them), their loop times again
    from ``rounds`` paired rounds (the median of each backend's), effective times and
    bounds with them; the first loop time stays as ``loop_ms_alone``. Returns whether it
    paired them. A backend that raises in a round keeps its lone loop time."""
    ok = [(r, impl) for r, impl in timed if r.get("status") == "ok" and r.get("loop_ms") is not None]
    effective = {r["backend"]: r["effective_ms"] for r, _ in ok}
    device = {r["backend"]: r["median_ms"] for r, _ in ok}
    if len(ok) < 2 or decided_by_device(effective, device):
        return False  # the table ranks these by device time: their loop times decide nothing
    got = timer.paired_us({r["backend"]: prob.call(impl)[0] for r, impl in ok}, lambda b: b, rounds, seconds)
    for r, _ in ok:
        res = got[r["backend"]]
        if isinstance(res, Exception):
            continue
        loop = res[0] / 1e3
        r["loop_ms_alone"] = r["loop_ms"]
        r["loop_ms"] = round(loop, 5)
        r["effective_ms"] = round(max(loop, r["median_ms"]), 5)
        r["bound"] = "host" if loop > 1.1 * r["median_ms"] else "device"
        r["loop_paired_rounds"] = rounds
    return True


class DefaultImpl(registry.Impl):
    """The backend ``backend=None`` picks, as a row of its own (``-b default``): the call
    goes through ``registry.call`` exactly as ``kernellab.<op>(x)`` does (the choice, its
    cached lookup and the torch fallback included), so its time is what a user gets."""

    def __init__(self, op: str):
        super().__init__(op=op, backend="default", fn=None, description="what backend=None picks")

    def __call__(self, *args, **kwargs):
        return registry.call(self.op, None, *args, **kwargs)


def _eff(row) -> float:
    """The time a verdict uses: the larger of device time and loop time (rows without a
    loop time, e.g. CUDA-graph rows, use the device time)."""
    return row.get("effective_ms") or row["median_ms"]


def _admit(impl, dtype, dev, cache: dict) -> str:
    """'' when ``impl`` passes the admission check (forward on odd shapes, NaN/inf and
    every layout) for ``dtype``, else why not. The timed inputs are plain contiguous
    tensors, so a kernel that is only wrong on strided or edge-case inputs would pass the
    re-check of its timed output; it must not make a speed claim either."""
    key = (impl.op, impl.backend, dtype)
    if key not in cache:
        from kernellab.harness.check import check_impl

        rep = check_impl(impl, dtype, device=dev, gate=True, opcheck=False)
        bad = rep.failures
        cache[key] = (
            "" if not bad else f"failed the admission check: {bad[0].kind} {bad[0].name}: {bad[0].detail}"
        )
    return cache[key]


def _base_row(op, backend, mode, shape, dtype, gpu, dev) -> dict:
    v = versions()
    return {
        "op": op,
        "backend": backend,
        "mode": mode,
        "shape": shape_str(shape),
        "dtype": dtype_name(dtype),
        "median_ms": None,
        "p20_ms": None,
        "p80_ms": None,
        "gbps": None,
        "tflops": None,
        "pct_peak": None,
        "gpu": gpu,
        "device": dev,
        "torch": v["torch"],
        "triton": v["triton"],
        "cuda": v["cuda"],
        "git_sha": git_sha(),
        "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        # the C++ autograd nodes (eager host cost, so loop times) in use in this process
        "cpp_nodes": _cpp_nodes_in_use(),
        "status": "ok",
    }


def _cpp_nodes_in_use() -> bool:
    from kernellab.cuda import nodes

    return nodes.module() is not None


def _measure(impl, prob, baseline, dev, graph, flush, budget_s) -> dict:
    fn, box = prob.call(impl)
    try:
        # Host cost per call, on its own (on the CPU the host clock already is the time).
        # Measured first: in graph mode the timed outputs are the graph's, and eager calls
        # after the capture would rebind the result box to an eager output.
        host = round(timer.host_cost_us(fn, calls=100), 2) if dev == "cuda" else None
        if dev == "cuda" and graph:
            if prob.mode != "fwd":
                raise ValueError("CUDA-graph timing is for forward calls")
            t = timer.time_cuda_graph(fn, budget_s=budget_s)
        elif dev == "cuda":
            t = timer.time_cuda(fn, flush=flush, budget_s=budget_s)
        else:
            t = timer.time_host(fn, budget_s=budget_s)
        # Time per call in a plain loop (host cost included): what an eager model sees.
        loop = timer.loop_ms(fn) if not graph else None
    except Exception as e:  # noqa: BLE001 - a crash is reported, not raised
        return {"status": "error", "reason": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
    out = {**t.as_dict(), "host_us": host, "graph": bool(graph)}
    if loop is not None:
        out["loop_ms"] = round(loop, 5)
        out["effective_ms"] = round(max(loop, out["median_ms"]), 5)
        # Host-bound: the loop is over 10% slower than the device time.
        out["bound"] = "host" if loop > 1.1 * out["median_ms"] else "device"

    # Re-check 1: the output of the last timed call.
    ok, ratio, detail = _judge_all(box[0], prob.expected, prob.dtype, baseline)
    if ok:
        # Re-check 2: new values in the same input buffers, one more call (graph mode
        # replays the captured graph): a cached or stale result fails here.
        prob.refresh()
        base2 = None
        if baseline is not None:
            torch_fn, torch_box = prob.call(registry.get(prob.spec.name, "torch"))
            torch_fn()
            base2 = torch_box[0]
        if graph and hasattr(t, "_graph"):
            t._graph.replay()
            torch.cuda.synchronize()
        else:
            fn2, box2 = prob.call(impl)
            fn2()
            box = box2
        ok, ratio2, detail = _judge_all(box[0], prob.expected, prob.dtype, base2)
        ratio = max(ratio, ratio2)
        if not ok:
            detail = "after refreshing the inputs: " + detail
    if not ok:
        out.update(status="rejected", reason=f"wrong output in timed run: {detail}")
        for k in ("median_ms", "p20_ms", "p80_ms"):
            out[k] = None
    out["check_ratio"] = round(ratio, 4) if ok else None
    return out


def _rates(row, spec, shape, dtype, mode, peaks, options=None) -> None:
    ms = row.get("median_ms")
    if not ms:
        return
    row["gbps"] = spec.gbps(shape, dtype, mode, ms, options)
    row["tflops"] = spec.tflops(shape, mode, ms, options)
    row["bytes"] = spec.count_bytes(shape, dtype, mode, options)
    row["flops"] = spec.count_flops(shape, mode, options)
    row["metric"] = spec.metric
    if peaks:
        row["peak_copy_gbps"] = peaks["copy_gbps"]
        row["pct_bw"] = round(100 * row["gbps"] / peaks["copy_gbps"], 1)
        key = {"fp32": "tf32" if row["tf32"] else "fp32", "fp16": "fp16", "bf16": "bf16"}[dtype_name(dtype)]
        mm = peaks["matmul_tflops"].get(key)
        if mm:
            row["pct_flops"] = round(100 * row["tflops"] / mm, 2)
        row["pct_peak"] = row["pct_bw"] if spec.metric == "gbps" else row.get("pct_flops")
