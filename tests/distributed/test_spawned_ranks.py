"""kldist.run_ranks, the spawner the distributed tests share: a rank killed by a signal
before its group connected is tried again once (with a warning); killed after it, the test
fails and shows the rank's stderr; a worker's own exception fails it with its traceback."""

from __future__ import annotations

import os
import sys
import traceback

import pytest
import torch
import torch.distributed as dist

import kldist


def _worker(rank, world, init_file, out_dir, mode, flag_dir):
    res = {"error": None, "sum": None}
    first = not os.path.exists(os.path.join(flag_dir, f"seen{rank}"))
    open(os.path.join(flag_dir, f"seen{rank}"), "w").close()
    if mode == "abort-before-init" and rank == 1 and first:
        os.abort()
    try:
        kldist.init_group("gloo", rank, world, init_file, 30)
        if mode == "abort-after-init" and rank == 1:
            print("rank 1 about to abort", file=sys.stderr, flush=True)
            os.abort()
        if mode == "raise" and rank == 0:
            raise RuntimeError("planted failure")
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t)
        res["sum"] = float(t)
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - judged by the test
        res["error"] = traceback.format_exc()
    torch.save(res, os.path.join(out_dir, f"rank{rank}.pt"))


def test_clean_run_returns_every_rank(tmp_path_factory, tmp_path):
    out = kldist.run_ranks(_worker, 2, tmp_path_factory, "ok", ("clean", str(tmp_path)), 120)
    assert [r["sum"] for r in out] == [3.0, 3.0]


def test_death_before_the_group_connected_is_retried_once(tmp_path_factory, tmp_path):
    with pytest.warns(UserWarning, match="retried once"):
        out = kldist.run_ranks(_worker, 2, tmp_path_factory, "early", ("abort-before-init", str(tmp_path)))
    assert [r["sum"] for r in out] == [3.0, 3.0]


def test_death_after_the_group_connected_fails_with_stderr(tmp_path_factory, tmp_path):
    with pytest.raises(pytest.fail.Exception, match="(?s)SIGABRT.*rank 1 about to abort") as e:
        kldist.run_ranks(_worker, 2, tmp_path_factory, "late", ("abort-after-init", str(tmp_path)), 120)
    # faulthandler's stack of the abort names the worker's line
    assert "Fatal Python error: Aborted" in str(e.value) and "in _worker" in str(e.value)


def test_worker_exception_fails_with_its_traceback(tmp_path_factory, tmp_path):
    with pytest.raises(AssertionError, match="planted failure"):
        kldist.run_ranks(_worker, 2, tmp_path_factory, "raise", ("raise", str(tmp_path)), 120)
