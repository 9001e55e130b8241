"""The tuner: time every candidate backend of an op over the shape families on this GPU
and write the winners into this GPU model's tuning table (``core.tables``), which the
default (``core.choice``) then reads.

    kernellab tune OP [--family F] [--dtype D] [--mode fwd fwdbwd]

``candidates(op)``: what ``tune`` times (ours and the peers). ``table_rows``: table rows
from bench rows (``kernellab.harness.rebuild_table`` rebuilds a committed table from them).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re

import torch

from kernellab import device as _device
from kernellab.core import registry, tables
from kernellab.core.choice import pick_best
from kernellab.core.shapes import family_shapes, key_of_shape
from kernellab.core.spec import get_spec, shape_str
from kernellab.harness import bench as _bench

# Backends a default may pick: ours and the peers; never the naive baseline, a
# torch.compile of it (a recompile per shape: the user's own choice to make), the numbered
# teaching variants (``cuda`` and ``numba`` are the best of theirs) or the pure-PyTorch tiling
# demo.
_NOT_DEFAULT = re.compile(r"manual|compile|tiled|fft|(cuda|numba)_v\d+")  # (fft: conv2d's teaching backend)


def candidates(op: str) -> list[str]:
    """The registered built-in backends of ``op`` that ``tune`` times for the default."""
    return [i.backend for i in registry.impls(op) if i.builtin and not _NOT_DEFAULT.fullmatch(i.backend)]


def not_timed(op: str, device: str, backends=None) -> dict[str, str]:
    """{backend: why} for the candidates (or ``backends``) of ``op`` that cannot run on
    ``device``: a tune leaves them out of every row it writes, so the default can never
    pick them from those rows (e.g. ``cuda_node`` before ``kernellab build-nodes``)."""
    out = {}
    for b in backends or candidates(op):
        why = registry.get(op, b).why_unavailable(device)
        if why is not None:
            out[b] = why
    return out


def not_timed_notice(op: str, device: str, backends=None) -> str | None:
    """One line naming what ``not_timed`` finds, or None when every candidate runs."""
    missing = not_timed(op, device, backends)
    if not missing:
        return None
    return f"tune {op}: not timed here: " + "; ".join(f"{b} ({why})" for b, why in missing.items())


HOW = ("harness.bench: median device time and loop time per call (launch-bound cases: loop times "
       "from PAIRED_ROUNDS rounds of the backends taking turns); best = the least of the larger "
       "of the two, except that backends within TIE of it are told apart by device time (device "
       "times within DEVICE_TIE of the least: the larger of the two again); outputs re-checked "
       "against float64")  # fmt: skip
# Paired rounds of loop time at a launch-bound case (harness.bench.pair_loop_times): ~20 ms
# of calls per backend a round, so ~0.15 s per backend and case.
PAIRED_ROUNDS = 7


def _parse_shape(s: str) -> tuple:
    return tuple(int(x) for x in s.split("x"))


def table_rows(op: str, rows, by_shape: dict | None = None) -> list[dict]:
    """Table rows of ``op`` from bench rows (``harness.bench``'s, or their JSONL): per
    (dtype, mode, shape, options) the backends' effective and device times and the best
    (``pick_best``). A later row of the same case and backend replaces an earlier one."""
    by_case: dict[tuple, dict] = {}
    for r in rows:
        if r.get("op") != op or r.get("status") != "ok":
            continue
        case = (r["dtype"], r["mode"], r["shape"], r.get("options") or "")
        eff = r.get("effective_ms") or r["median_ms"]
        by_case.setdefault(case, {})[r["backend"]] = (eff, r["median_ms"])
    out = []
    for (dn, mode, shape_s, opts), tb in sorted(by_case.items()):
        shape = (by_shape or {}).get(shape_s) or _parse_shape(shape_s)
        times = {b: round(t[0], 6) for b, t in sorted(tb.items())}
        device = {b: round(t[1], 6) for b, t in sorted(tb.items())}
        out.append({"op": op, "dtype": dn, "mode": mode, "shape": list(shape), "options": opts,
                    "key": list(key_of_shape(op, shape)), "best": pick_best(times, device),
                    "times": times, "device": device})  # fmt: skip
    return out


def tune(op: str, family: str | None, dtypes, modes, device: str | None = None, backends=None,
         budget_s: float = 1.0, on_row=None, admitted: dict | None = None, shapes=None, skip=None,
         deadline: float | None = None) -> dict:  # fmt: skip
    """Time the backends of ``op`` (default: ``candidates(op)``) over the family's shapes, or
    over ``shapes`` (problem shapes, e.g. a model's own; then no family is read)
    (harness.bench: admission check, re-checked outputs, device and loop time) and merge
    the winners into this GPU's table; returns the table written. ``on_row`` sees every
    measured row (the raw timings behind the table); ``skip`` and ``deadline`` as
    ``bench`` takes them (a cut-off tune resumed)."""
    spec = get_spec(op)
    dev = device or _device.default_device()
    if shapes is not None:
        if family is not None:
            raise ValueError("tune: give a family or shapes, not both")
        shapes = [tuple(s) for s in shapes]
        for s in shapes:
            if not s or any(not isinstance(d, int) or d < 1 for d in s):
                raise ValueError(f"shape: every dim a positive integer, got {s}")
    else:
        shapes = family_shapes(op, family)
    if not shapes:
        raise ValueError(f"family {family!r} has no shapes for {op}")
    backends = backends or candidates(op)
    modes = [m for m in modes if m in spec.modes]
    # fp32 as fp32, as `kernellab check` and `kernellab bench` run it: PyTorch's default lets
    # cuDNN's convolutions take TF32 where its heuristics like (not at tiny shapes), so a
    # TF32 kernel judged against that baseline fails admission at one shape and passes at
    # the next.
    with _tf32_off():
        rows = _bench.bench(op, backends, shapes, dtypes, tuple(modes), device=dev, budget_s=budget_s,
                            on_row=on_row, admitted=admitted, paired_rounds=PAIRED_ROUNDS, skip=skip,
                            deadline=deadline)  # fmt: skip
    gpu = tables.gpu_of(dev)
    path = tables.table_path(gpu, write=True)
    # A first tune into the user's tables starts from the package's table of this GPU model:
    # the other ops keep their rows. ($KERNELLAB_TABLES starts from what it holds.)
    start = path
    if not os.path.exists(path) and not os.environ.get("KERNELLAB_TABLES"):
        start = os.path.join(tables.PACKAGE_TABLES, os.path.basename(path))
    table = tables.read_table(start) if os.path.exists(start) else {"gpu": gpu, "rows": []}
    new = table_rows(op, rows, {shape_str(s): s for s in shapes})

    def ident(r):
        return (r["op"], r["dtype"], r["mode"], tuple(r["shape"]), r.get("options", ""))

    done = {ident(r) for r in new}
    table["rows"] = sorted([r for r in table["rows"] if ident(r) not in done] + new,
                           key=lambda r: (r["op"], r["dtype"], r["mode"], r["shape"], r.get("options", "")))  # fmt: skip
    table["provenance"] = {"git_sha": _bench.git_sha(), **_bench.versions(), "date": datetime.date.today().isoformat(),
                           "device": gpu, "capability": tables.capability(), "how": HOW, "tf32": False}  # fmt: skip
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        json.dump(table, fh, indent=1, sort_keys=True)
        fh.write("\n")
    registry.clear_cache()
    return table


@contextlib.contextmanager
def _tf32_off():
    """TF32 off for PyTorch's matmuls and cuDNN (and so for the kernels of ours that follow
    those flags) inside the block; the user's settings restored after."""
    old = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old
