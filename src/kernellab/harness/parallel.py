"""``kernellab check`` over several worker processes.

Why processes: a check is dominated by work that holds one CPU core - Triton's JIT
(each constexpr variant of a kernel is a compile of ~1-4 s on a GPU host), Inductor's
compiles for the ``compile`` backends, and on a machine without a GPU the Triton
interpreter and PyTorch's CPU kernels. The GPU itself is nearly idle (the check's problems
are small), so N workers on N cores finish close to N times sooner. Each worker is a fresh
``spawn``-ed interpreter (a forked CUDA context is unusable) that imports kernellab once
and then takes jobs.

A job is one implementation x dtype, or a part of its stages (``check.STAGE_GROUPS``, or
one stage each for attention): a heavy implementation (attention's Triton kernels compile
for minutes in fp32) would otherwise be the whole run's long pole. Every stage draws its inputs from the run's seed
and its own name (``check._Runner.begin_stage``), so a report is the same whichever way
the stages were grouped into jobs, and ``--seed`` replays it with any number of workers.

A worker that dies (a crash inside a kernel) breaks the pool: the jobs it held run again,
each in a process of its own, and the one that dies again is reported as failed.

Only implementations a fresh interpreter finds in the registry can run in a worker: the
built-in ones, and a user's registered in a module that importing kernellab imports. Any
other (registered in the calling script, say) runs in the calling process, after the rest.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, ThreadPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

import torch

from kernellab.core import registry
from kernellab.core.spec import dtype_name
from kernellab.harness.cases import _OP_WEIGHT, FAIL, SPLIT_WEIGHT, STAGE_GROUPS, CaseResult, Report


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def default_workers() -> int:
    """One worker per core, at most 16 (a GPU host's check is bound by its cores)."""
    return max(1, min(available_cores(), 16))


@dataclass(frozen=True)
class Job:
    op: str
    backend: str
    dtype: torch.dtype
    stages: tuple[str, ...] | None = None  # None: every stage
    cost: float = 1.0  # expected seconds, relative: the scheduler starts the heavy ones first

    @property
    def key(self) -> tuple[str, str, torch.dtype]:
        return (self.op, self.backend, self.dtype)


def jobs_for(items, only_fuzz: bool = False) -> list[Job]:
    """The jobs for ``check.plan`` items: one each, or one per ``STAGE_GROUPS`` entry for
    an item whose kernels compile in many variants (``check._OP_WEIGHT``)."""
    jobs = []
    for it in items:
        heavy = it.runs == "run" and not only_fuzz and _OP_WEIGHT.get(it.impl.op, 1.0) >= SPLIT_WEIGHT
        heavy = heavy and (it.impl.triton_kernels is not None or it.impl.precompile is not None)
        if heavy:
            # The heaviest (attention) one stage a job: its fp32 kernels alone compile for
            # longer than all other reports together.
            groups = STAGE_GROUPS
            if _OP_WEIGHT.get(it.impl.op, 1.0) >= 2 * SPLIT_WEIGHT:
                groups = tuple((name,) for g in STAGE_GROUPS for name in g)
            jobs += [Job(it.impl.op, it.impl.backend, it.dtype, g, it.estimate / len(groups)) for g in groups]
        else:
            jobs.append(Job(it.impl.op, it.impl.backend, it.dtype, None, it.estimate))
    return jobs


def _init_worker(threads: int) -> None:
    # N workers share the cores: PyTorch's own thread pool in each would oversubscribe them.
    torch.set_num_threads(threads)
    # and Inductor's pool of compile processes in each (one per core by default) likewise.
    try:
        import torch._inductor.config as inductor_config

        inductor_config.compile_threads = 1
    except Exception:  # noqa: BLE001 (no Inductor in this build: nothing to limit)
        pass


def _run_job(runner: Callable, job: Job, options: dict):
    impl = registry.get(job.op, job.backend)
    return runner(impl, job.dtype, stages=job.stages, **options)


def _merge(parts: Sequence[tuple[Job, object]]):
    """One Report from the reports of one implementation's stage groups, in stage order."""
    order = [name for g in STAGE_GROUPS for name in g]

    def rank(job: Job) -> int:
        return order.index(job.stages[0]) if job.stages else -1

    reps = [rep for _, rep in sorted(parts, key=lambda jr: rank(jr[0]))]
    rep = reps[0]
    for p in reps[1:]:
        rep.cases.extend(p.cases)
        rep.stage_seconds.update(p.stage_seconds)
        rep.seconds += p.seconds
    if rep.failures:
        rep.status = FAIL
    return rep


def run_jobs(
    jobs: Sequence[Job],
    runner: Callable,
    options: dict,
    workers: int,
    on_start: Callable | None = None,
    on_result: Callable | None = None,
) -> list:
    """Run ``jobs`` on ``workers`` processes: ``runner(impl, dtype, stages=..., **options)``
    each (``check.check_impl``; a module-level function, so that workers can import it);
    ``on_result(report)`` once per implementation x dtype as soon as all its parts are in.
    Returns the reports in the jobs' order."""
    keys: list[tuple] = []
    parts_left: dict[tuple, int] = {}
    for j in jobs:
        if j.key not in parts_left:
            keys.append(j.key)
            parts_left[j.key] = 0
        parts_left[j.key] += 1
    done: dict[tuple, list] = {k: [] for k in keys}
    reports: dict[tuple, object] = {}
    started: set[tuple] = set()

    def finish(job: Job, rep) -> None:
        done[job.key].append((job, rep))
        parts_left[job.key] -= 1
        if parts_left[job.key] == 0:
            reports[job.key] = _merge(done[job.key])
            if on_result:
                on_result(reports[job.key])

    def died(job: Job, why: str):
        rep = Report(job.op, job.backend, dtype_name(job.dtype), options.get("device") or "?", FAIL,
                     seed=options.get("seed") or 0)  # fmt: skip
        rep.cases.append(CaseResult(",".join(job.stages or ("all",)), "worker", FAIL, detail=why))
        return rep

    local = [j for j in jobs if not registry.get(j.op, j.backend).builtin]
    remote = sorted((j for j in jobs if j not in local), key=lambda j: -j.cost)
    threads = max(1, available_cores() // max(1, workers))
    ctx = multiprocessing.get_context("spawn")
    retry: list[Job] = []
    if remote:
        with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker, initargs=(threads,)) as ex:
            pending: dict[Future, Job] = {}
            try:
                for j in remote:
                    if on_start and j.key not in started:
                        started.add(j.key)
                        on_start(registry.get(j.op, j.backend), j.dtype)
                    pending[ex.submit(_run_job, runner, j, options)] = j
                while pending:
                    finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                    for f in finished:
                        j = pending.pop(f)
                        try:
                            finish(j, f.result())
                        except BrokenProcessPool:
                            # A worker died (a crash in a kernel, out of memory): every job
                            # still in the pool fails with it. Each runs again below, alone.
                            retry.append(j)
                        except Exception as e:  # noqa: BLE001 - an error in the harness is a failure
                            finish(j, died(j, f"{type(e).__name__}: {e}"[:400]))
            except KeyboardInterrupt:
                ex.shutdown(wait=False, cancel_futures=True)
                raise
    if retry:
        # Each job of the broken pool in a process of its own (at most ``workers`` at a
        # time), so the one that kills its worker is reported and the others finish.
        def alone(j: Job):
            with ProcessPoolExecutor(1, mp_context=ctx, initializer=_init_worker, initargs=(threads,)) as one:
                try:
                    return j, one.submit(_run_job, runner, j, options).result()
                except BrokenProcessPool:
                    return j, died(j, "the check's worker process died running this job")
                except Exception as e:  # noqa: BLE001
                    return j, died(j, f"{type(e).__name__}: {e}"[:400])

        with ThreadPoolExecutor(workers) as threads_ex:
            for j, rep in threads_ex.map(alone, retry):
                finish(j, rep)
    if local:
        for j in local:
            impl = registry.get(j.op, j.backend)
            if on_start and j.key not in started:
                started.add(j.key)
                on_start(impl, j.dtype)
            finish(j, runner(impl, j.dtype, stages=j.stages, **options))
    return [reports[k] for k in keys]
