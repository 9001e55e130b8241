"""Shape-aware defaults: the shape families of real models, per-GPU tuning tables, and the
choice ``backend=None`` makes.

- ``FAMILIES``: per model family and op, the shapes a real model calls the op with (in
  the op's OpSpec shape convention), shared by ``kernellab tune``, benchmarks and tests.
- A tuning table (``<gpu>.json`` in $KERNELLAB_TABLES, else in the user's tables in the
  cache directory, else in the package's ``tables/``: the first found) holds, per (op,
  dtype, mode, shape), the fastest correct backend measured on that GPU model by the larger
  of device time and loop time, with every backend's time and the provenance (git sha,
  versions, date). ``kernellab tune`` writes it ($KERNELLAB_TABLES, else the user's
  tables: never the installed package).
- ``choose(op, args)``: with a table for this GPU model (or, with a notice, one of
  another model of the same compute capability), the row of the nearest shape (same op,
  dtype, mode and ``option_key``; distance = summed |log2| ratios of the dims); no table,
  or no row near enough: the op's heuristic order (``OpSpec.default_backends``).
  ``registry.call`` caches the chosen Impl per call shape: one tuple and one dict lookup
  per call after the first.
- ``candidates(op)``: what ``tune`` times (ours and the peers); ``FAMILIES["heldout"]``
  is never tuned (``kernellab.harness.tune_all`` verifies the default there).
- ``registry.call`` with ``backend=None`` falls back to ``torch`` when the chosen backend
  refuses the input with a ValueError that torch's op accepts (attention with head dim
  100: the Triton kernel takes multiples of 8 up to 256, SDPA serves it).

Shape keys (from a call's arguments, the same for tune rows and calls): elementwise ops
(numel,); row-wise ops and reductions (rows, cols) of the first tensor; matmul (M, N, K);
attention (batch x heads, S_q, S_k, head dim); rope (B x S, H_q, H_k, D, rotary dim).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import os
import re
import warnings

import torch

from kernellab import device as _device
from kernellab.ops.spec import dtype_name, get_spec, options_str, shape_str

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
        # (4096 tokens: at 8192 x 128256 the float64 reference and its gradient alone
        # would take ~34 GB)
        "cross_entropy": [(4096, 128256)],
        "matmul": [(8192, 6144, 4096), (8192, 4096, 4096), (8192, 28672, 4096), (8192, 4096, 14336)],
        "attention": [(1, 32, 8192, 128), (4, 32, 2048, 128)],
        "rope": [(1, 32, 8, 8192, 128, 128), (4, 32, 8, 2048, 128, 128)],
        "argmax": [(16, 128256)],
        "swiglu": [(8192 * 14336,)],
        "add_rms_norm": _rows(4096),
        "linear_cross_entropy": [(4096, 4096, 128256)],
    },
    "llama3.2-1b": {  # hidden 2048, MLP 8192, vocab 128256, 32 q / 8 kv heads of 64
        "rms_norm": _rows(2048, (4096, 16384)),
        "add_rms_norm": _rows(2048, (4096, 16384)),
        "swiglu": [(4096 * 8192,), (16384 * 8192,)],
        "rope": [(2, 32, 8, 2048, 64, 64)],
        "linear_cross_entropy": [(4096, 2048, 128256), (16384, 2048, 128256)],
    },
    "qwen2.5-7b": {  # hidden 3584, MLP 18944, vocab 152064, 28 q / 4 kv heads of 128
        "rms_norm": _rows(3584),
        "cross_entropy": [(4096, 152064)],
        "matmul": [(8192, 4608, 3584), (8192, 3584, 18944)],
        "attention": [(2, 28, 4096, 128)],
        "rope": [(2, 28, 4, 4096, 128, 128)],
    },
    "gemma2-2b": {  # hidden 2304, MLP 9216 (GeGLU, tanh GeLU), vocab 256000
        "geglu": [(4096 * 9216,), (16384 * 9216,)],
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
    # Launch-bound calls: a small batch, a unit test, MNIST-sized layers. Here the host
    # cost of a call decides, and PyTorch's C++ path often wins.
    "small": {
        "add": [(64 * 256,), (128 * 768,)],
        "gelu": [(64 * 256,), (128 * 3072,)],
        "layer_norm": [(64, 256), (128, 768)],
        "rms_norm": [(64, 256), (128, 4096)],
        "softmax": [(64, 256), (128, 1024)],
        "cross_entropy": [(64, 10), (256, 10), (64, 256)],
        "matmul": [(64, 64, 64), (64, 128, 3136), (256, 10, 128)],
        "attention": [(1, 2, 64, 64), (4, 12, 128, 64)],
        "rope": [(1, 4, 2, 64, 64, 64), (4, 12, 12, 128, 64, 64)],
        "swiglu": [(64 * 256,), (128 * 3072,)],
        "geglu": [(64 * 256,), (128 * 3072,)],
        "add_rms_norm": [(64, 256), (128, 4096)],
        "linear_cross_entropy": [(64, 64, 256), (256, 768, 50304)],
        "sum": [(64, 256)],
        "max": [(64, 256)],
        "argmax": [(64, 256)],
    },
    # The course's MNIST CNN (issue 18): conv 1 -> 32 on 28x28 and 32 -> 64 on 14x14
    # (3x3, padding 1: conv2d's bench option), each followed by relu and a 2x2 max pool,
    # hidden 128; batch 64, 256 and 1024. Plus the large layer (N 32, C 64, 56x56,
    # K 64, 3x3) for the conv ladder.
    "mnist": {
        "conv2d": [(b, 1, 28, 28, 32, 3, 3) for b in (64, 256, 1024)]
        + [(b, 32, 14, 14, 64, 3, 3) for b in (64, 256, 1024)]
        + [(32, 64, 56, 56, 64, 3, 3)],
        "max_pool2d": [(b, c, hw, hw) for b in (64, 256, 1024) for c, hw in ((32, 28), (64, 14))],
        "batch_norm2d": [(b, c, hw, hw) for b in (64, 256, 1024) for c, hw in ((32, 28), (64, 14))],
        "bn_relu_pool2d": [(b, c, hw, hw) for b in (64, 256, 1024) for c, hw in ((32, 28), (64, 14))],
        "relu": [(b * n,) for b in (64, 256, 1024) for n in (32 * 28 * 28, 64 * 14 * 14, 128)],
    },
    # Shapes of no family above (other model sizes), never tuned: where the verify run
    # measures how the default does on shapes it was not tuned at.
    "heldout": {
        "add": [(3 * 2**20 + 7,)],
        "gelu": [(4096 * 4096,)],
        "layer_norm": [(12288, 1024), (2048, 1600)],
        "rms_norm": [(8192, 5120), (2, 8192)],
        "softmax": [(2048, 32000), (12 * 512, 512)],
        "cross_entropy": [(4096, 32000), (2048, 151936)],
        "matmul": [(4096, 5120, 5120), (2, 11008, 4096), (2048, 1024, 4096)],
        "attention": [(2, 16, 2048, 128), (32, 16, 256, 64)],
        "sum": [(3000, 5000)],
        "max": [(3000, 5000)],
        "argmax": [(3000, 5000)],
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
    """The shapes of ``op`` in ``family`` (None: every family tuned on a GPU, i.e. all
    but cpu-tiny and heldout), no repeats."""
    if family is not None and family not in FAMILIES:
        raise ValueError(f"family: unknown {family!r}; known: {', '.join(FAMILIES)}")
    names = [family] if family else [f for f in FAMILIES if f not in ("cpu-tiny", "heldout")]
    out = []
    for f in names:
        for s in FAMILIES[f].get(op, []):
            if tuple(s) not in out:
                out.append(tuple(s))
    return out


# Backends a default may pick: ours and the peers; never the naive baseline, a
# torch.compile of it (a recompile per shape: the user's own choice to make), the numbered
# teaching variants (``cuda`` is the best of them) or the pure-PyTorch tiling demo.
_NOT_DEFAULT = re.compile(r"manual|compile|tiled|fft|cuda_v\d+")  # (fft: conv2d's teaching backend)


def candidates(op: str) -> list[str]:
    """The registered built-in backends of ``op`` that ``tune`` times for the default."""
    from kernellab import registry

    return [i.backend for i in registry.impls(op) if i.builtin and not _NOT_DEFAULT.fullmatch(i.backend)]


# --------------------------------------------------------------------------- shape keys

_ELEMENTWISE = {"add", "gelu", "relu", "swiglu", "geglu"}
# ops whose shape key reads two arguments (a, b / q, k / x, w)
KEY_ARGS = {"matmul": 2, "attention": 2, "conv2d": 2, "rope": 2}


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
        if op == "linear_cross_entropy":  # (N, H, V): the spec's problem shape
            return (x.numel() // x.shape[-1] if x.shape[-1] else 0, x.shape[-1], args[1].shape[0])
        if op == "attention":
            q, k = args[0], args[1]
            return (math.prod(q.shape[:-2]), q.shape[-2], k.shape[-2], q.shape[-1])
        if op == "conv2d":  # (N, C, H, W, K, R, S): the spec's problem shape
            w = args[1]
            return (*x.shape, w.shape[0], w.shape[2], w.shape[3]) if x.dim() == 4 and w.dim() == 4 else None
        if op in ("max_pool2d", "batch_norm2d", "bn_relu_pool2d"):  # (N, C, H, W)
            return tuple(x.shape) if x.dim() == 4 else None
        if op == "rope":  # (B x S tokens, q heads, k heads, head dim, rotary dim)
            k, cos = args[1], args[2]
            return (x.shape[0] * x.shape[2], x.shape[1], k.shape[1], x.shape[3], cos.shape[-1])
        d = x.shape[-1] if x.dim() else 1
        return (x.numel() // d if d else 0, d)
    except (AttributeError, IndexError, TypeError):
        return None


def _distance(a, b) -> float:
    """Summed |log2| ratios of the dims; infinite across alignment classes (a dim that is a
    multiple of 8 in one key and not in the other): libraries choose other kernels for
    odd sizes (cuBLAS at 4097x4095x1023 is slower than our CUDA matmul, at 1024x3072x768
    it is the fastest), so an odd row does not speak for an aligned call, nor the reverse."""
    if len(a) != len(b) or any((x % 8 == 0) != (y % 8 == 0) for x, y in zip(a, b)):
        return math.inf
    return sum(abs(math.log2(max(x, 1)) - math.log2(max(y, 1))) for x, y in zip(a, b))


NEAR = 4.0  # a row this far (summed log2 ratios: 16x in one dim) or nearer is used


# --------------------------------------------------------------------------- tables


def gpu_slug(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name).strip("_")


PACKAGE_TABLES = os.path.join(os.path.dirname(__file__), "tables")


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
_CHOICES: dict[tuple, tuple[str, str]] = {}
_NOTICED: set[str] = set()


def load_table(gpu: str) -> dict | None:
    """The table of ``gpu`` (cached). Where this GPU model has no table, or its table has
    no rows of an op, another model of the same architecture speaks for it (an H200 may
    use an H100's rows, with a one-line notice; each such row names the GPU it was measured
    on in ``measured_on``). None when neither exists: then a one-line notice, once per GPU
    model, says defaults come from heuristics."""
    if gpu in _TABLES:
        return _TABLES[gpu]
    path = table_path(gpu)
    table = _read(path) if os.path.exists(path) else None
    if gpu != "cpu":
        other_table, other = _same_arch_table(exclude=gpu)
        if table is None and other_table is not None:
            table = {**other_table, "rows": [{**r, "measured_on": other} for r in other_table["rows"]]}
            if gpu not in _NOTICED:
                _NOTICED.add(gpu)
                warnings.warn(f"kernellab: no tuning table for {gpu}; using {other}'s (same architecture "
                              f"sm_{other_table['provenance']['capability'].replace('.', '')}): run "
                              "`kernellab tune` to make this GPU's own", stacklevel=3)  # fmt: skip
        elif table is not None and other_table is not None:
            have = {r.get("op") for r in table["rows"]}
            borrowed = [{**r, "measured_on": other} for r in other_table["rows"] if r.get("op") not in have]
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


def _read(path: str) -> dict:
    with open(path) as fh:
        table = json.load(fh)
    if not isinstance(table, dict) or not isinstance(table.get("rows"), list):
        raise ValueError(f"{path}: not a kernellab tuning table (expected an object with 'rows')")
    return table


def _capability() -> str | None:
    cap = _device.capability()
    return f"{cap[0]}.{cap[1]}" if cap else None


def _same_arch_table(exclude: str | None = None) -> tuple[dict | None, str | None]:
    """A table measured on another GPU model (not ``exclude``) of this device's compute
    capability."""
    cap = _capability()
    if cap is None:
        return None, None
    skip = gpu_slug(exclude) + ".json" if exclude else None
    for d in _table_dirs():
        if not os.path.isdir(d):
            continue
        for name in sorted(os.listdir(d)):
            if name.endswith(".json") and name != skip:
                table = _read(os.path.join(d, name))
                if (table.get("provenance") or {}).get("capability") == cap:
                    return table, table.get("gpu", name)
    return None, None


def clear_cache() -> None:
    """Forget loaded tables and cached choices (after ``tune`` writes, in tests)."""
    from kernellab import registry

    _TABLES.clear()
    _CHOICES.clear()
    _NOTICED.clear()
    registry._CHOSEN.clear()


def _gpu_of(dev: str) -> str:
    return _device.gpu_name() if dev == "cuda" else "cpu"


def _heuristic(op: str, dev: str) -> str:
    from kernellab import registry

    return registry.default_backend(op, dev)


_OPTION_KEYS: dict[str, tuple] = {}


def _option_keys(op: str) -> tuple:
    keys = _OPTION_KEYS.get(op)
    if keys is None:
        cases = get_spec(op).bench_options
        first = cases[0] if cases else {}
        keys = _OPTION_KEYS[op] = tuple((k, first.get(k)) for k in sorted(set().union(*cases)))
    return keys


def option_key(op: str, kwargs) -> str:
    """The options of a call that tables tell apart (those the op's ``bench_options``
    vary, e.g. attention's ``causal``; an omitted one takes its value in the first bench
    case), spelled as bench rows spell them (``spec.options_str``); "" for ops with none."""
    keys = _option_keys(op)
    if not keys:
        return ""
    return options_str({k: kwargs.get(k, d) for k, d in keys})


def option_values(op: str, kwargs) -> tuple:
    """``option_key``'s options as a tuple of their values (what the default's per-call
    choice cache keys on: no string is built on the hot path; ``()`` for ops with none)."""
    keys = _option_keys(op)
    if not keys:
        return ()
    if len(keys) == 1:
        k, d = keys[0]
        return (kwargs.get(k, d),)
    return tuple([kwargs.get(k, d) for k, d in keys])


def wants_grad(args) -> bool:
    """Whether a call with ``args`` runs a backward: grad mode on and any tensor argument
    requiring grad. Not the first alone: a network's first convolution takes images that
    need no gradient and weights that do (a choice by forward time alone can pick a conv2d
    backend whose backward is many times slower than cuDNN's)."""
    if not torch.is_grad_enabled():
        return False
    for a in args:  # (a loop, not any() over a generator: this runs on every default call)
        if isinstance(a, torch.Tensor) and a.requires_grad:
            return True
    return False


def choose(op: str, args, dev: str, mode: str | None = None, kwargs=None) -> tuple[str, str]:
    """(backend, why) for a call of ``op`` with ``args`` (and ``kwargs``) on ``dev``;
    ``mode`` "fwd" or "fwdbwd" (None: fwdbwd when the first tensor requires grad)."""
    x = args[0] if args else None
    if mode is None:
        mode = "fwdbwd" if wants_grad(args) else "fwd"
    opts = option_key(op, kwargs or {})
    return choose_key(op, shape_key(op, args), getattr(x, "dtype", None), dev, mode, opts)


def choose_key(op: str, key, dtype, dev: str, mode: str = "fwd", options: str = "", by: str = "call",
               among=None) -> tuple[str, str]:  # fmt: skip
    """``choose`` from a shape key (``shape_key`` / ``key_of_shape``), a dtype and the
    ``option_key`` of the call.

    ``by="call"``: the row's choice for a standalone call (the larger of device and loop
    time). ``by="device"``: the fastest by device time alone, for a call whose host cost
    is paid elsewhere (inside a CUDA graph, a compiled graph, or a model that runs several
    ops under one autograd node); ``among`` limits the backends considered (e.g. those
    with node-free entry points). Rows written before device times were kept fall back to
    their effective times."""
    if by not in ("call", "device"):
        raise ValueError(f"by: 'call' or 'device', got {by!r}")
    among = tuple(among) if among is not None else None
    ck = (op, dev, dtype, mode, key, options, by, among)
    hit = _CHOICES.get(ck)
    if hit is not None:
        return hit
    gpu = _gpu_of(dev)
    table = load_table(gpu)
    out = None
    if table is not None and key is not None and dtype is not None:
        dn, src = _row_dtype(table, op, dtype_name(dtype), mode, options)
        best = None
        for row in _rows(table, op, dn, mode, options):
            dist = _distance(tuple(row["key"]), key)
            if best is None or dist < best[0]:
                best = (dist, row)
        if best is not None and best[0] <= NEAR:
            row = best[1]
            times = row.get("device") if by == "device" and row.get("device") else row["times"]
            metric = "device time" if times is not row["times"] else "the larger of device and loop time"
            if by == "device" or among is not None:
                usable = {b: t for b, t in times.items() if (among is None or b in among) and _usable(op, b, dev)}
                pick = min(usable, key=usable.get) if usable else None
            else:
                pick = row["best"]
            if pick is not None and _usable(op, pick, dev):
                out = (
                    pick,
                    f"table {os.path.basename(table_path(gpu))}: nearest row {row['shape']}"
                    + (f" {options}" if options else "")
                    + src
                    + (f" (a row of {row['measured_on']}'s table, same architecture)" if row.get("measured_on") else "")
                    + " "
                    f"(distance {best[0]:.2f}): {pick} was fastest there "
                    f"({times[pick]:.4g} ms by {metric}; "
                    + ", ".join(f"{b} {t:.4g}" for b, t in times.items() if b != pick)
                    + ")",
                )
        if out is None and by == "call" and among is None:
            out = _table_vote(table, gpu, op, dn, mode, options, dev)
            if out is not None and src:
                out = (out[0], out[1] + src)
    if out is None:
        why = "no tuning table for this device" if table is None else "no table row near this shape"
        small = get_spec(op).small_backend  # (a host-cost rule: for standalone calls only)
        b = small(key) if (small is not None and key is not None and by == "call" and among is None) else None
        if b is not None and _usable(op, b, dev):
            out = (b, f"heuristic ({why}): the op's backend for a problem of this size "
                      "(OpSpec.small_backend)")  # fmt: skip
        else:
            b = _heuristic(op, dev)
            out = (b, f"heuristic ({why}): first available of the op's preferred backends")
    _CHOICES[ck] = out
    return out


# Where the table has no row of a 16-bit call's dtype for the op and mode, the rows of these
# dtypes speak for it, in this order: the same kernels run with the same bytes moved (fp16 and
# bf16), or the same shapes with twice the bytes (fp32: the MNIST ops were tuned in fp32 only).
# Without them the op's fixed preference list chooses, blind to fp32 rows near the shape that
# name a faster backend. fp32 calls borrow no 16-bit rows: their kernels differ (TF32, fp32
# dots).
SIBLING_DTYPES = {"fp16": ("bf16", "fp32"), "bf16": ("fp16", "fp32")}


def _row_dtype(table, op, dn, mode, options) -> tuple[str, str]:
    """(dtype whose rows serve a call of dtype ``dn``, a note for the reason when it is not
    ``dn`` itself); ``dn`` when no dtype has rows."""
    for alt in (dn, *SIBLING_DTYPES.get(dn, ())):
        if next(_rows(table, op, alt, mode, options), None) is not None:
            return alt, "" if alt == dn else f" (the table has no {op} {dn} {mode} rows: its {alt} rows)"
    return dn, ""


def _rows(table, op, dn, mode, options):
    """The table's rows of ``op`` in dtype ``dn`` and ``mode`` for a call's option key (a
    row without "options" serves every option set)."""
    for row in table["rows"]:
        if (row.get("op") == op and row.get("dtype") == dn and row.get("mode") == mode
                and row.get("options", options) == options):  # fmt: skip
            yield row


def _usable(op, backend, dev) -> bool:
    """Whether ``backend`` of ``op`` is registered and runs on ``dev`` here."""
    from kernellab import registry

    impl = registry._TABLE.get((op, backend))
    return impl is not None and impl.why_unavailable(dev) is None


VOTE_MIN_ROWS = 3  # rows of an op / dtype / mode before they speak for far shapes
# Without a majority, the backend nearest the best on average speaks only when its geometric
# mean of time over each row's best leads the next backend's by more than this
NEAREST_LEAD = 0.01


def _table_vote(table, gpu, op, dn, mode, options, dev):
    """(backend, why) for a shape no row is near: the backend this GPU's table found fastest
    at the most shapes of the op, dtype and mode, or None where the table has no such row.
    The op's fixed preference list knows nothing of the GPU, so at far shapes it can name a
    backend the table found slower at most rows. A strict majority of at least VOTE_MIN_ROWS
    rows speaks; without one, the backend timed at every row whose time over each row's best
    has the least geometric mean (NEAREST_LEAD ahead of the next)."""
    wins, ratios, n_rows = {}, {}, 0
    for row in _rows(table, op, dn, mode, options):
        n_rows += 1
        wins[row["best"]] = wins.get(row["best"], 0) + 1
        best_t = min(row["times"].values())
        for b, t in row["times"].items():
            if best_t > 0 and t > 0:
                ratios.setdefault(b, []).append(math.log(t / best_t))
    if n_rows < VOTE_MIN_ROWS:
        return None  # too few rows: no evidence for this GPU
    where = f"table {os.path.basename(table_path(gpu))}: no row near this shape; "
    usable = [b for b in wins if _usable(op, b, dev)]
    if usable:
        pick = max(usable, key=wins.get)
        if 2 * wins[pick] > n_rows:
            return pick, where + f"{pick} was fastest at {wins[pick]} of its {n_rows} {op} {dn} {mode} rows"
    # no majority: the geometric mean over the rows, among backends timed at every one (a
    # row made from a verify run times only torch and its choice: rows_from_verify)
    gm = {b: math.exp(sum(r) / len(r)) for b, r in ratios.items() if len(r) == n_rows and _usable(op, b, dev)}
    if not gm:
        return None
    ranked = sorted(gm, key=gm.get)
    pick = ranked[0]
    if len(ranked) > 1 and gm[ranked[1]] <= gm[pick] * (1 + NEAREST_LEAD):
        return None  # no backend is nearer the best than the others: no evidence either way
    head = where + f"no backend won most of its {n_rows} {op} {dn} {mode} rows; "
    mean = f"geometric mean of its time over each row's best {gm[pick]:.2f}"
    if len(ranked) == 1:  # rows from a verify run: torch is the one backend every row timed
        return pick, head + f"{pick} is the only backend timed at every one of them ({mean})"
    others = ", ".join(f"{b} {gm[b]:.2f}" for b in ranked[1:])
    return pick, head + f"{pick} was nearest the best over them ({mean}; {others})"


# --------------------------------------------------------------------------- tune

HOW = ("harness.bench: median device time and loop time per call; best = the least of the larger "
       "of the two, except that backends within TIE of it are told apart by device time (device "
       "times within DEVICE_TIE of the least: the larger of the two again); outputs re-checked "
       "against float64")  # fmt: skip
# Loop times of launch-bound calls move by 10-30% between runs on one host, so a
# loop-time lead this small is noise; device time is stable to a few percent, and it is
# what a call inside a CUDA graph or a compiled graph costs.
TIE = 0.05
# Device times this close are the same kernel speed (the median of one run moves ~1%); among
# them the larger of device and loop time decides: a launcher with more host cost loses
# its plain-loop calls even with the faster kernel.
DEVICE_TIE = 0.01


def pick_best(times: dict, device: dict) -> str:
    """The table's choice from per-backend effective and device times (see TIE, DEVICE_TIE)."""
    first = min(times, key=times.get)
    close = [b for b, t in times.items() if t <= times[first] * (1 + TIE) and b in device]
    if not close:
        return first
    fastest = min(device[b] for b in close)
    return min((b for b in close if device[b] <= fastest * (1 + DEVICE_TIE)), key=times.get)


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
         budget_s: float = 1.0, on_row=None, admitted: dict | None = None) -> dict:  # fmt: skip
    """Time the backends of ``op`` (default: ``candidates(op)``) over the family's shapes
    (harness.bench: admission check, re-checked outputs, device and loop time) and merge
    the winners into this GPU's table; returns the table written. ``on_row`` sees every
    measured row (the raw timings behind the table)."""
    from kernellab.harness.bench import bench, git_sha, versions

    spec = get_spec(op)
    dev = device or _device.default_device()
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
        rows = bench(op, backends, shapes, dtypes, tuple(modes), device=dev, budget_s=budget_s, on_row=on_row,
                     admitted=admitted)  # fmt: skip
    gpu = _gpu_of(dev)
    path = table_path(gpu, write=True)
    # A first tune into the user's tables starts from the package's table of this GPU model:
    # the other ops keep their rows. ($KERNELLAB_TABLES starts from what it holds.)
    start = path
    if not os.path.exists(path) and not os.environ.get("KERNELLAB_TABLES"):
        start = os.path.join(PACKAGE_TABLES, os.path.basename(path))
    table = _read(start) if os.path.exists(start) else {"gpu": gpu, "rows": []}
    new = table_rows(op, rows, {shape_str(s): s for s in shapes})

    def ident(r):
        return (r["op"], r["dtype"], r["mode"], tuple(r["shape"]), r.get("options", ""))

    done = {ident(r) for r in new}
    table["rows"] = sorted([r for r in table["rows"] if ident(r) not in done] + new,
                           key=lambda r: (r["op"], r["dtype"], r["mode"], r["shape"], r.get("options", "")))  # fmt: skip
    table["provenance"] = {"git_sha": git_sha(), **versions(), "date": datetime.date.today().isoformat(),
                           "device": gpu, "capability": _capability(), "how": HOW, "tf32": False}  # fmt: skip
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        json.dump(table, fh, indent=1, sort_keys=True)
        fh.write("\n")
    clear_cache()
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


def key_of_shape(op: str, shape) -> tuple:
    """The shape key (``shape_key``) of the inputs the op's spec makes for ``shape``."""
    shape = tuple(shape)
    if op == "attention":
        if len(shape) == 4:
            b, h, sq, d = shape
            return (b * h, sq, sq, d)
        if len(shape) == 6:  # GQA (B, H_q, H_kv, S_q, S_k, D): keyed by q's heads, as calls are
            b, h, _, sq, sk, d = shape
            return (b * h, sq, sk, d)
        b, h, sq, sk, d = shape
        return (b * h, sq, sk, d)
    if op in _ELEMENTWISE:
        return (math.prod(shape),)
    if op == "matmul":
        return shape[-3:]
    if op in ("conv2d", "max_pool2d", "batch_norm2d", "bn_relu_pool2d"):
        return shape
    if op == "linear_cross_entropy":  # (N, H, V) or (B, T, H, V): rows, H, V as shape_key
        return (math.prod(shape[:-2]), shape[-2], shape[-1])
    if op == "rope":
        from kernellab.ops.rope import parse_problem

        b, h, hk, s, d, r = parse_problem(shape)
        return (b * s, h, hk, d, r)
    d = shape[-1]
    return (math.prod(shape) // d if d else 0, d)
