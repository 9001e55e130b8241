"""Shape-aware defaults: the shape families of real models, per-GPU tuning tables, and the
choice ``backend=None`` makes.

- ``FAMILIES``: per model family and op, the shapes a real model calls the op with (in
  the op's OpSpec shape convention), shared by ``kernellab tune``, benchmarks and tests.
- A tuning table (``tables/<gpu>.json`` in the package, or ``$KERNELLAB_TABLES/<gpu>.json``)
  holds, per (op, dtype, mode, shape), the fastest correct backend measured on that GPU
  model by the larger of device time and loop time, with every backend's time and the
  provenance (git sha, versions, date). ``kernellab tune`` writes it.
- ``choose_key(op, key, dtype, dev, mode)``: with a table for this GPU, the row of the
  nearest shape (same op, dtype and mode; distance = summed |log2| ratios of the dims); no
  table, or no row near enough: the op's heuristic order (``OpSpec.default_backends``), as before tables
  existed. A choice is cached per (op, device, dtype, mode, shape key): one dict lookup
  per call after the first.
- Not yet wired into ``registry.call`` on main: ``backend=None`` still takes the
  heuristic. The wiring (the table's choice, and a fallback to ``torch`` where the chosen
  backend refuses an input that torch's op accepts, e.g. attention with head dim 96) is
  on the branch ``issue17-wiring``, tested on the CPU, waiting for its GPU run.

Shape keys (from a call's arguments, the same for tune rows and calls): elementwise ops
(numel,); row-wise ops and reductions (rows, cols) of the first tensor; matmul (M, N, K);
attention (batch x heads, S_q, S_k, head dim).
"""

from __future__ import annotations

import datetime
import json
import math
import os
import warnings

import torch

from kernellab import device as _device

# --------------------------------------------------------------------------- families

_ODD = [(4099, 1025), (4096, 4097), (8191, 50257), (257, 65537)]


def _rows(hidden, tokens=(4096, 16384, 32768)):
    return [(t, hidden) for t in tokens]


FAMILIES: dict[str, dict[str, list[tuple]]] = {
    "gpt2": {  # hidden 768, MLP 3072, vocab 50257 / 50304, 12 heads of 64, T 1024
        "add": [(8 * 1024 * 768,), (4 * 256 * 768,)],
        "gelu": [(8 * 1024 * 3072,), (4 * 256 * 3072,)],
        "layer_norm": _rows(768, (1024, 8192, 16384)),
        "softmax": [(8192, 50257), (8192, 50304), (96 * 1024, 1024)],
        "cross_entropy": [(8192, 50257), (8192, 50304), (1024, 50304)],
        "matmul": [(8192, 2304, 768), (8192, 768, 768), (8192, 3072, 768), (8192, 768, 3072), (8192, 50304, 768)],
        "attention": [(8, 12, 1024, 64), (4, 12, 256, 64)],
        "sum": _rows(768, (8192,)),
        "max": [(8192, 50304)],
        "argmax": [(8192, 50304)],
    },
    "llama3-8b": {  # hidden 4096, MLP 14336, vocab 128256, 32 q / 8 kv heads of 128
        "add": [(8192 * 4096,)],
        "rms_norm": _rows(4096),
        "softmax": [(4096, 128256)],
        "cross_entropy": [(8192, 128256), (4096, 128256)],
        "matmul": [(8192, 6144, 4096), (8192, 4096, 4096), (8192, 28672, 4096), (8192, 4096, 14336)],
        "attention": [(1, 32, 8192, 128), (4, 32, 2048, 128)],
        "argmax": [(16, 128256)],
    },
    "qwen2.5-7b": {  # hidden 3584, MLP 18944, vocab 152064, 28 q / 4 kv heads of 128
        "rms_norm": _rows(3584),
        "cross_entropy": [(8192, 152064)],
        "matmul": [(8192, 4608, 3584), (8192, 3584, 18944)],
        "attention": [(2, 28, 4096, 128)],
    },
    "vit-b16": {  # hidden 768, 197 tokens, 12 heads of 64
        "layer_norm": [(256 * 197, 768)],
        "gelu": [(256 * 197 * 3072,)],
        "softmax": [(256 * 12 * 197, 197)],
        "matmul": [(256 * 197, 2304, 768), (256 * 197, 768, 3072)],
        "attention": [(256, 12, 197, 64)],
    },
    "decode": {  # M = 1, 4, 16 tokens against 8B-class weights
        "matmul": [(m, n, 4096) for m in (1, 4, 16) for n in (4096, 14336)],
        "rms_norm": [(m, 4096) for m in (1, 4, 16)],
        "argmax": [(m, 128256) for m in (1, 4, 16)],
        "softmax": [(m, 128256) for m in (1, 16)],
    },
    "odd": {  # primes and 2^k +- 1
        "softmax": _ODD,
        "layer_norm": _ODD[:3],
        "rms_norm": _ODD[:3],
        "cross_entropy": [(4099, 50257), (8191, 32003)],
        "sum": _ODD,
        "max": _ODD,
        "matmul": [(3000, 3000, 3000), (4097, 4095, 1023), (1, 4097, 4095)],
        "attention": [(2, 8, 1023, 64), (1, 8, 4097, 128)],
        "add": [(2**24 + 1,), (10**7 + 19,)],
        "gelu": [(2**24 - 1,)],
    },
    # Tiny shapes of the same kinds, for the CPU (tests, `tune --family cpu-tiny`).
    "cpu-tiny": {
        "add": [(4096,), (65537,)],
        "gelu": [(4096,), (65537,)],
        "layer_norm": [(64, 256), (33, 1025)],
        "softmax": [(64, 256), (33, 1025)],
        "attention": [(1, 2, 64, 32)],
    },
}


def family_shapes(op: str, family: str | None = None) -> list[tuple]:
    """The shapes of ``op`` in ``family`` (None: every family but cpu-tiny), no repeats."""
    if family is not None and family not in FAMILIES:
        raise ValueError(f"family: unknown {family!r}; known: {', '.join(FAMILIES)}")
    names = [family] if family else [f for f in FAMILIES if f != "cpu-tiny"]
    out = []
    for f in names:
        for s in FAMILIES[f].get(op, []):
            if tuple(s) not in out:
                out.append(tuple(s))
    return out


# --------------------------------------------------------------------------- shape keys

_ELEMENTWISE = {"add", "gelu"}


def shape_key(op: str, args) -> tuple | None:
    """The shape key of a call's arguments (module docstring), None when the arguments
    are not tensors of the expected ranks (the call then takes the heuristic)."""
    try:
        x = args[0]
        if op in _ELEMENTWISE:
            return (x.numel(),)
        if op == "matmul":
            a, b = args[0], args[1]
            return (a.shape[-2], b.shape[-1], a.shape[-1])
        if op == "attention":
            q, k = args[0], args[1]
            return (math.prod(q.shape[:-2]), q.shape[-2], k.shape[-2], q.shape[-1])
        d = x.shape[-1] if x.dim() else 1
        return (x.numel() // d if d else 0, d)
    except (AttributeError, IndexError, TypeError):
        return None


def _distance(a, b) -> float:
    if len(a) != len(b):
        return math.inf
    return sum(abs(math.log2(max(x, 1)) - math.log2(max(y, 1))) for x, y in zip(a, b))


NEAR = 4.0  # a row this far (summed log2 ratios: 16x in one dim) or nearer is used


# --------------------------------------------------------------------------- tables


def gpu_slug(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name).strip("_")


def _table_dirs() -> list[str]:
    dirs = []
    env = os.environ.get("KERNELLAB_TABLES")
    if env:
        dirs.append(env)
    dirs.append(os.path.join(os.path.dirname(__file__), "tables"))
    return dirs


def table_path(gpu: str, write: bool = False) -> str:
    """Where the table of ``gpu`` is read from (the first directory holding it) or, with
    ``write``, written to ($KERNELLAB_TABLES if set, else the package's tables/)."""
    name = gpu_slug(gpu) + ".json"
    dirs = _table_dirs()
    if not write:
        for d in dirs:
            p = os.path.join(d, name)
            if os.path.exists(p):
                return p
    return os.path.join(dirs[0], name)


_TABLES: dict[str, dict | None] = {}
_CHOICES: dict[tuple, tuple[str, str]] = {}
_NOTICED: set[str] = set()


def load_table(gpu: str) -> dict | None:
    """The table of ``gpu`` (cached), or None when none exists: then a one-line notice,
    once per GPU model, says defaults come from heuristics."""
    if gpu in _TABLES:
        return _TABLES[gpu]
    path = table_path(gpu)
    table = None
    if os.path.exists(path):
        with open(path) as fh:
            table = json.load(fh)
        if not isinstance(table, dict) or not isinstance(table.get("rows"), list):
            raise ValueError(f"{path}: not a kernellab tuning table (expected an object with 'rows')")
    elif gpu != "cpu" and gpu not in _NOTICED:
        _NOTICED.add(gpu)
        warnings.warn(
            f"kernellab: no tuning table for {gpu} ({os.path.basename(path)}); default backends come from "
            "heuristics (run `kernellab tune` to make one)",
            stacklevel=3,
        )
    _TABLES[gpu] = table
    return table


def clear_cache() -> None:
    """Forget loaded tables and cached choices (after ``tune`` writes, in tests)."""
    _TABLES.clear()
    _CHOICES.clear()
    _NOTICED.clear()


def _gpu_of(dev: str) -> str:
    return _device.gpu_name() if dev == "cuda" else "cpu"


def _heuristic(op: str, dev: str) -> str:
    from kernellab import registry

    return registry.default_backend(op, dev)


def choose_key(op: str, key, dtype, dev: str, mode: str = "fwd") -> tuple[str, str]:
    """(backend, why) for ``op`` at shape key ``key`` (``shape_key`` of a call's arguments,
    ``key_of_shape`` of a spec shape), ``dtype`` on ``dev`` in ``mode`` ("fwd", "fwdbwd")."""
    from kernellab.ops.spec import dtype_name

    ck = (op, dev, dtype, mode, key)
    hit = _CHOICES.get(ck)
    if hit is not None:
        return hit
    gpu = _gpu_of(dev)
    table = load_table(gpu)
    out = None
    if table is not None and key is not None and dtype is not None:
        from kernellab import registry

        dn = dtype_name(dtype)
        best = None
        for row in table["rows"]:
            if row.get("op") != op or row.get("dtype") != dn or row.get("mode") != mode:
                continue
            dist = _distance(tuple(row["key"]), key)
            if best is None or dist < best[0]:
                best = (dist, row)
        if best is not None and best[0] <= NEAR:
            row = best[1]
            impl = registry._TABLE.get((op, row["best"]))
            if impl is not None and impl.why_unavailable(dev) is None:
                out = (
                    row["best"],
                    f"table {os.path.basename(table_path(gpu))}: nearest row {row['shape']} "
                    f"(distance {best[0]:.2f}): {row['best']} was fastest there "
                    f"({row['times'][row['best']]:.4g} ms by the larger of device and loop time; "
                    + ", ".join(f"{b} {t:.4g}" for b, t in row["times"].items() if b != row["best"])
                    + ")",
                )
    if out is None:
        b = _heuristic(op, dev)
        why = "no tuning table for this device" if table is None else "no table row near this shape"
        out = (b, f"heuristic ({why}): first available of the op's preferred backends")
    _CHOICES[ck] = out
    return out


# --------------------------------------------------------------------------- tune


def tune(op: str, family: str | None, dtypes, modes, device: str | None = None, backends=None,
         budget_s: float = 1.0, on_row=None) -> dict:  # fmt: skip
    """Time every backend of ``op`` over the family's shapes (harness.bench: re-checked
    outputs, device and loop time) and merge the winners into this GPU's table; returns
    the table written."""
    from kernellab.harness.bench import _eff, bench, git_sha, versions
    from kernellab.ops.spec import get_spec

    spec = get_spec(op)
    dev = device or _device.default_device()
    shapes = family_shapes(op, family)
    if not shapes:
        raise ValueError(f"family {family!r} has no shapes for {op}")
    rows = bench(op, backends, shapes, dtypes, tuple(modes), device=dev, budget_s=budget_s, on_row=on_row)
    gpu = _gpu_of(dev)
    path = table_path(gpu, write=True)
    table = load_table(gpu) if os.path.exists(path) else None
    table = table or {"gpu": gpu, "rows": []}
    from kernellab.ops.spec import shape_str

    by_shape = {shape_str(s): s for s in shapes}
    by_case: dict[tuple, dict] = {}
    for r in rows:
        if r.get("status") != "ok" or r.get("options"):
            continue
        by_case.setdefault((r["dtype"], r["mode"], r["shape"]), {})[r["backend"]] = _eff(r)
    new = []
    for (dn, mode, shape_s), times in sorted(by_case.items()):
        shape = by_shape[shape_s]
        best = min(times, key=times.get)
        new.append({"op": op, "dtype": dn, "mode": mode, "shape": list(shape),
                    "key": list(key_of_shape(op, shape)), "best": best,
                    "times": {b: round(t, 6) for b, t in sorted(times.items())}})  # fmt: skip
    done = {(r["op"], r["dtype"], r["mode"], tuple(r["shape"])) for r in new}
    table["rows"] = [r for r in table["rows"] if (r["op"], r["dtype"], r["mode"], tuple(r["shape"])) not in done]
    table["rows"] = sorted(table["rows"] + new, key=lambda r: (r["op"], r["dtype"], r["mode"], r["shape"]))
    table["provenance"] = {"git_sha": git_sha(), **versions(), "date": datetime.date.today().isoformat(),
                           "device": gpu, "how": "harness.bench: median device time and loop time per call, "
                           "the larger of the two; outputs re-checked against float64"}  # fmt: skip
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        json.dump(table, fh, indent=1, sort_keys=True)
        fh.write("\n")
    clear_cache()
    return table


def key_of_shape(op: str, shape) -> tuple:
    """The shape key (``shape_key``) of the inputs the op's spec makes for ``shape``."""
    shape = tuple(shape)
    if op == "attention":
        if len(shape) == 4:
            b, h, sq, d = shape
            return (b * h, sq, sq, d)
        b, h, sq, sk, d = shape
        return (b * h, sq, sk, d)
    if op in _ELEMENTWISE:
        return (math.prod(shape),)
    if op == "matmul":
        return shape[-3:]
    d = shape[-1]
    return (math.prod(shape) // d if d else 0, d)
