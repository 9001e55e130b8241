"""Spawned ranks for the distributed tests (imported as ``kldist``, like ``kltest``).

``run_ranks`` spawns ``world`` processes, each running
``worker(rank, world, init_file, out_dir, *args)``. A worker opens its process group with
``init_group`` and saves its findings to ``rank{r}.pt`` in ``out_dir``; the test judges
them. Around the worker each rank sends its stderr to ``rank{r}.stderr`` (a C++ abort
leaves nothing else behind; ``faulthandler`` adds the Python stack of a fatal signal) and
ends with ``os._exit`` once its findings are saved, so nothing after the measured work
(interpreter and library teardown) decides the outcome.

A rank that dies or hangs fails the test with every rank's stderr tail. One case is tried
again, once: a rank killed by a signal before its process group was connected (gloo's TCP
setup on a loaded machine, before any of our code ran) -- and the retry says so in a
warning.
"""

from __future__ import annotations

import datetime
import faulthandler
import os
import sys
import time
import warnings

import pytest
import torch


def _rank_main(rank, worker, world, out_dir, args):
    fd = os.open(os.path.join(out_dir, f"rank{rank}.stderr"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 2)
    faulthandler.enable()  # a fatal signal (SIGABRT, SIGSEGV) prints every thread's Python stack there
    worker(rank, world, os.path.join(out_dir, "init"), out_dir, *args)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def init_group(backend, rank, world, init_file, seconds):
    """``dist.init_process_group`` through ``init_file``; marks this rank connected."""
    import torch.distributed as dist

    if backend == "gloo" and os.path.exists("/sys/class/net/lo"):
        # every rank on this machine: gloo's TCP pairs over loopback, not over the address
        # the host name resolves to (a container's may be slow to connect or not reachable)
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=seconds))  # fmt: skip
    open(os.path.join(os.path.dirname(init_file), f"rank{rank}.ready"), "w").close()


def _tails(out_dir, world, lines=40) -> str:
    parts = []
    for r in range(world):
        path = os.path.join(out_dir, f"rank{r}.stderr")
        text = open(path, errors="replace").read() if os.path.exists(path) else "(no stderr file)"
        tail = "\n".join(text.strip().splitlines()[-lines:]) or "(empty)"
        parts.append(f"--- rank {r} stderr:\n{tail}")
    return "\n".join(parts)


def _spawn(worker, world, out_dir, args, timeout_s):
    """None when every rank exited cleanly, else (what happened, the first dead rank)."""
    import torch.multiprocessing as mp
    from torch.multiprocessing.spawn import ProcessException

    ctx = mp.start_processes(_rank_main, args=(worker, world, str(out_dir), args), nprocs=world, join=False,
                             start_method="spawn")  # fmt: skip
    deadline = time.monotonic() + timeout_s
    try:
        while not ctx.join(timeout=1):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    if p.is_alive():
                        p.kill()
                return f"still running after {timeout_s} s: a hang", None
    except ProcessException as e:
        return str(e), e.error_index
    return None


def run_ranks(worker, world, tmp_path_factory, name, args=(), timeout_s=180):
    """Every rank's saved findings (a list indexed by rank)."""
    for attempt in (1, 2):
        out_dir = tmp_path_factory.mktemp(f"{name}{world}")
        failed = _spawn(worker, world, out_dir, tuple(args), timeout_s)
        if failed is None:
            break
        what, dead = failed
        unconnected = dead is not None and not (out_dir / f"rank{dead}.ready").exists()
        report = f"{name} ranks (world {world}): {what}\n{_tails(out_dir, world)}"
        if attempt == 1 and unconnected and "signal" in what:
            warnings.warn(f"retried once: {report}", stacklevel=2)
            continue
        pytest.fail(report)
    out = [torch.load(out_dir / f"rank{r}.pt") for r in range(world)]
    for r, res in enumerate(out):
        assert res["error"] is None, f"rank {r} failed:\n{res['error']}"
    return out
