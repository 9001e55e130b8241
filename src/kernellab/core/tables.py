"""Tuning tables on disk: one per GPU model (``<gpu>.json`` in $KERNELLAB_TABLES, else in
the user's tables in the cache directory, else in the package's ``tables/``: the first
found), each holding, per (op, dtype, mode, shape), the fastest correct backend measured
on that GPU model by the larger of device time and loop time, with every backend's time
and the provenance (git sha, versions, date). ``kernellab tune`` writes one
($KERNELLAB_TABLES, else the user's tables: never the installed package).

Where this GPU model has no table, or its table has no rows of an op, a table of another
model of the same compute capability speaks for it (with a one-line notice).
"""

from __future__ import annotations

import json
import os
import warnings

from kernellab import device as _device


def gpu_slug(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name).strip("_")


PACKAGE_TABLES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "tables")


def user_tables() -> str:
    """The user's table directory: ``tables/`` in kernellab's cache directory
    ($KERNELLAB_CACHE, else ~/.cache/kernellab). ``kernellab tune`` writes there, never into
    the installed package."""
    from kernellab.device import cache_root  # (reading a table creates no directory)

    return os.path.join(str(cache_root()), "tables")


def _table_dirs() -> list[str]:
    dirs = []
    env = os.environ.get("KERNELLAB_TABLES")
    if env:
        dirs.append(env)
    dirs += [user_tables(), PACKAGE_TABLES]
    return dirs


def table_path(gpu: str, write: bool = False) -> str:
    """Where the table of ``gpu`` is read from (the first directory holding it:
    $KERNELLAB_TABLES, the user's tables, the package's) or, with ``write``, written to
    ($KERNELLAB_TABLES if set, else the user's tables: ``user_tables``)."""
    name = gpu_slug(gpu) + ".json"
    dirs = _table_dirs()
    if not write:
        for d in dirs:
            p = os.path.join(d, name)
            if os.path.exists(p):
                return p
    return os.path.join(dirs[0], name)


_TABLES: dict[str, dict | None] = {}
_NOTICED: set[str] = set()


def load_table(gpu: str) -> dict | None:
    """The table of ``gpu`` (cached). Where this GPU model has no table, or its table has
    no rows of an op in a dtype and mode, another model of the same architecture speaks for it (an H200 may
    use an H100's rows, with a one-line notice; each such row names the GPU it was measured
    on in ``measured_on``). None when neither exists: then a one-line notice, once per GPU
    model, says defaults come from heuristics."""
    if gpu in _TABLES:
        return _TABLES[gpu]
    path = table_path(gpu)
    table = read_table(path) if os.path.exists(path) else None
    if gpu != "cpu":
        # (the architecture of the table's own GPU: this device's when it has none; the
        # same on the GPU itself, and right for `kernellab explain --gpu` on another machine)
        own_cap = ((table or {}).get("provenance") or {}).get("capability")
        other_table, other = _same_arch_table(exclude=gpu, cap=own_cap)
        if table is None and other_table is not None:
            table = {**other_table, "rows": [{**r, "measured_on": other} for r in other_table["rows"]]}
            if gpu not in _NOTICED:
                _NOTICED.add(gpu)
                warnings.warn(f"kernellab: no tuning table for {gpu}; using {other}'s (same architecture "
                              f"sm_{other_table['provenance']['capability'].replace('.', '')}): run "
                              "`kernellab tune` to make this GPU's own", stacklevel=3)  # fmt: skip
        elif table is not None and other_table is not None:
            # per (op, dtype, mode): an H200 table of bf16 rms_norm rows still reads the
            # H100's fp32 rms_norm rows rather than no rows at all
            have = {(r.get("op"), r.get("dtype"), r.get("mode")) for r in table["rows"]}
            borrowed = [{**r, "measured_on": other} for r in other_table["rows"]
                        if (r.get("op"), r.get("dtype"), r.get("mode")) not in have]  # fmt: skip
            table = {**table, "rows": table["rows"] + borrowed}
        elif table is None and gpu not in _NOTICED:
            _NOTICED.add(gpu)
            warnings.warn(
                f"kernellab: no tuning table for {gpu} ({os.path.basename(path)}); default backends come from "
                "heuristics (run `kernellab tune` to make one)",
                stacklevel=3,
            )
    _TABLES[gpu] = table
    return table


def table_gpus() -> list[str]:
    """The GPU models that have a table here (every table directory, the CPU's left out)."""
    names = set()
    for d in filter(os.path.isdir, _table_dirs()):
        names |= {read_table(os.path.join(d, f)).get("gpu", f[:-5]) for f in os.listdir(d)
                  if f.endswith(".json") and f != "cpu.json"}  # fmt: skip
    return sorted(names)


def read_table(path: str) -> dict:
    with open(path) as fh:
        table = json.load(fh)
    if not isinstance(table, dict) or not isinstance(table.get("rows"), list):
        raise ValueError(f"{path}: not a kernellab tuning table (expected an object with 'rows')")
    return table


def capability() -> str | None:
    cap = _device.capability()
    return f"{cap[0]}.{cap[1]}" if cap else None


def _same_arch_table(exclude: str | None = None, cap: str | None = None) -> tuple[dict | None, str | None]:
    """A table measured on another GPU model (not ``exclude``) of compute capability ``cap``
    ("9.0"; None: this device's)."""
    cap = cap or capability()
    if cap is None:
        return None, None
    skip = gpu_slug(exclude) + ".json" if exclude else None
    for d in _table_dirs():
        if not os.path.isdir(d):
            continue
        for name in sorted(os.listdir(d)):
            if name.endswith(".json") and name != skip:
                table = read_table(os.path.join(d, name))
                if (table.get("provenance") or {}).get("capability") == cap:
                    return table, table.get("gpu", name)
    return None, None


def clear() -> None:
    """Forget loaded tables and notices (after ``tune`` writes, in tests)."""
    _TABLES.clear()
    _NOTICED.clear()


def gpu_of(dev: str) -> str:
    """The GPU model whose table serves device type ``dev`` ("cpu" for the CPU)."""
    return _device.gpu_name() if dev == "cuda" else "cpu"
