"""The check over worker processes (harness.parallel): the same reports as one process,
a heavy implementation split over stage groups merged back whole, user registrations run
in the calling process, a worker that dies reported as a failure."""

from __future__ import annotations

import pytest
import torch

from kernellab.core import registry
from kernellab.harness import check as chk
from kernellab.harness import parallel

SEED = 11


def _cases(rep):
    return [(c.kind, c.name, c.status, c.err) for c in rep.cases]


def test_stage_groups_merge_into_the_whole_report():
    """Every stage draws from the run's seed and its own name: the stage groups run one by
    one and merged give the very cases (and errors) of one whole run."""
    impl = registry.get("relu", "manual")
    whole = chk.check_impl(impl, torch.float32, device="cpu", quick=True, seed=SEED)
    parts = [
        (parallel.Job("relu", "manual", torch.float32, g),
         chk.check_impl(impl, torch.float32, device="cpu", quick=True, seed=SEED, stages=g))
        for g in reversed(chk.STAGE_GROUPS)  # (out of order, as workers finish)
    ]  # fmt: skip
    merged = parallel._merge(parts)
    assert _cases(merged) == _cases(whole)
    assert merged.status == whole.status == "pass"
    assert set(merged.stage_seconds) == set(whole.stage_seconds)
    # one stage a job (attention's split), shuffled
    names = [n for g in chk.STAGE_GROUPS for n in g]
    singles = [
        (parallel.Job("relu", "manual", torch.float32, (n,)),
         chk.check_impl(impl, torch.float32, device="cpu", quick=True, seed=SEED, stages=(n,)))
        for n in names[1::2] + names[::2]
    ]  # fmt: skip
    assert _cases(parallel._merge(singles)) == _cases(whole)


def test_every_stage_is_in_one_group():
    runner = chk._Runner(registry.get("relu", "manual"), chk.get_spec("relu"), torch.float32, "cpu", 0, True)
    names = [st.__name__ for st in chk._all_stages(runner)]
    grouped = [n for g in chk.STAGE_GROUPS for n in g]
    assert sorted(grouped) == sorted(names) and len(grouped) == len(set(grouped))


def test_unknown_stage_is_refused():
    with pytest.raises(ValueError, match="unknown stages"):
        chk.check_impl(registry.get("relu", "manual"), torch.float32, device="cpu", stages=("shapez",))


def test_heavy_items_are_split_and_light_ones_are_not():
    items = chk.plan(["attention", "relu"], ["triton", "manual"], [torch.float32], device="cpu")
    jobs = parallel.jobs_for([i for i in items if i.runs == "run"])
    by = {}
    for j in jobs:
        by.setdefault((j.op, j.backend), []).append(j.stages)
    assert by[("attention", "triton")] == [(name,) for g in chk.STAGE_GROUPS for name in g]  # one stage each
    items = chk.plan(["matmul"], ["triton"], [torch.float32], device="cpu")
    assert [j.stages for j in parallel.jobs_for(items)] == list(chk.STAGE_GROUPS)
    assert by[("relu", "manual")] == [None] and by[("relu", "triton")] == [None]
    assert by[("attention", "manual")] == [None]  # (PyTorch's ops: nothing to compile)


def test_two_workers_give_the_reports_of_one_process(planted):
    """Built-ins run in spawned workers, a planted (user) registration in this process;
    the reports come back whole, in plan order, equal to a one-process run."""

    def wrong_relu(x):  # a user's kernel with a wrong tail
        y = torch.relu(x)
        if y.numel() > 3:
            y = y.clone()
            y.view(-1)[-1] = 1.0
        return y

    planted("relu", "planted_tail", wrong_relu, devices=("cpu",))
    kw = dict(ops=["relu"], backends=["manual", "torch", "planted_tail"], dtypes=[torch.float32], device="cpu",
              quick=True, seed=SEED)  # fmt: skip
    seen = []
    one = chk.check(**kw)
    two = chk.check(**kw, workers=2, on_result=lambda r: seen.append(r.backend))
    assert [(r.backend, r.status) for r in two] == [(r.backend, r.status) for r in one]
    assert [r.backend for r in two] == ["manual", "torch", "planted_tail"]
    assert sorted(seen) == ["manual", "planted_tail", "torch"]
    assert dict((r.backend, r.status) for r in two)["planted_tail"] == "fail"
    for a, b in zip(one, two):
        assert _cases(a) == _cases(b)


def test_a_worker_that_dies_is_a_failure_not_a_hang(monkeypatch):
    """A job whose worker process dies is run again once in a fresh pool, then reported
    as failed; the other jobs' reports are unaffected."""
    jobs = [parallel.Job("relu", "manual", torch.float32), parallel.Job("relu", "torch", torch.float32)]
    opts = dict(device="cpu", quick=True, seed=SEED)
    monkeypatch.setattr(parallel, "_run_job", _die_on_torch)
    reps = parallel.run_jobs(jobs, chk.check_impl, opts, workers=2)
    status = {r.backend: r.status for r in reps}
    assert status == {"manual": "pass", "torch": "fail"}
    assert "worker process died" in reps[1].failures[0].detail


def _die_on_torch(runner, job, options):
    import os

    if job.backend == "torch":
        os._exit(3)
    impl = registry.get(job.op, job.backend)
    return runner(impl, job.dtype, **options)
