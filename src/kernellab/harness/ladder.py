"""``kernellab ladder OP``: an op's numbered variants (its teaching ladder) with their measured
gains, from committed result rows.

A rung is a registered backend named ``<family>_v<N>`` (``cuda_v1`` ... ``cuda_v10``,
``triton_v1``, ...), ordered by N within its family, and the family's own backend (``cuda``)
where its registry description names a step that no numbered backend holds ("CUDA v4: ...":
softmax's best CUDA kernel is the ladder's top rung, registered as ``cuda``). The one-line
change is the backend's registry description.

The numbers are read, never made: per rung the newest timing row (status ok or rejected,
not a CUDA-graph or host-cost row) at one key (GPU, shape, dtype, mode, options, TF32).
Per ladder the keys are chosen greedily: first the key where the most rungs were measured,
then, while rungs measured elsewhere are still missing (matmul's fp32 rungs v1-v7 and its
16-bit rungs v8-v10 never share a dtype), the key that adds the most of them. ``--shape``,
``--dtype``, ``--mode`` and ``--gpu`` narrow the keys first. Beside the rungs stand the
references measured at the same key (torch, the peers, our best ``triton`` / ``cuda``), so
the reader sees where the top rung lands. A rung without a row reads "not measured"; rows
of different commits or days in one table are said so under it.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

RESULTS = Path("benchmarks/results")  # committed rows, relative to the repository root
_SOURCE_RESULTS = Path(__file__).resolve().parents[3] / RESULTS  # (a source checkout's, from elsewhere)
_NUMBERED = re.compile(r"([a-z][a-z0-9]*)_v(\d+)")
# Not references: "default" is a choice among the others; "manual" is the naive baseline.
_NOT_REFERENCES = ("default", "manual")
_DTYPE_ALIASES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "half": "fp16", "float": "fp32"}


def numbered(backend: str) -> tuple[str, int] | None:
    """('cuda', 3) for 'cuda_v3'; None for a backend that is not a numbered variant."""
    m = _NUMBERED.fullmatch(backend)
    return (m.group(1), int(m.group(2))) if m else None


@dataclass(frozen=True)
class Rung:
    backend: str
    family: str
    n: int
    change: str  # one line: the registry description without its "CUDA vN: " label
    dtypes: tuple[str, ...] | None  # what it accepts (None: the op's dtypes)

    @property
    def label(self) -> str:
        """'cuda_v3', or 'cuda (v4)' for a family backend standing as a rung."""
        return self.backend if numbered(self.backend) else f"{self.backend} (v{self.n})"


def _one_line(description: str, family: str) -> str:
    text = (description or "").strip().splitlines()[0] if (description or "").strip() else ""
    return re.sub(rf"^{re.escape(family)}\s+v\d+\s*:\s*", "", text, flags=re.I) or "(no description)"


def rungs(op: str) -> dict[str, list[Rung]]:
    """The op's ladders, family -> rungs ordered by N; only families of two rungs or more."""
    from kernellab.core import registry
    from kernellab.core.spec import dtype_name

    impls = registry.impls(op)
    by_family: dict[str, dict[int, Rung]] = {}
    for i in impls:
        fn = numbered(i.backend)
        if fn:
            dts = tuple(dtype_name(d) for d in i.dtypes) if i.dtypes else None
            by_family.setdefault(fn[0], {})[fn[1]] = Rung(
                i.backend, fn[0], fn[1], _one_line(i.description, fn[0]), dts
            )
    for i in impls:  # the family's own backend, where its description names a step of its own
        steps = by_family.get(i.backend)
        m = re.match(rf"{re.escape(i.backend)}\s+v(\d+)\s*:", i.description or "", flags=re.I)
        if steps is not None and m and int(m.group(1)) not in steps:
            dts = tuple(dtype_name(d) for d in i.dtypes) if i.dtypes else None
            steps[int(m.group(1))] = Rung(
                i.backend, i.backend, int(m.group(1)), _one_line(i.description, i.backend), dts
            )
    return {f: [s[n] for n in sorted(s)] for f, s in sorted(by_family.items()) if len(s) >= 2}


def ladder_ops() -> list[str]:
    """The ops with a ladder (two rungs or more in one family)."""
    from kernellab.core import registry

    return [op for op in registry.op_names() if rungs(op)]


def check_op(op: str) -> dict[str, list[Rung]]:
    """The op's ladders, or a ValueError naming ``op`` and the ops that have ladders."""
    from kernellab.core import registry

    names = registry.op_names()
    if op not in names:
        raise ValueError(f"op: unknown op {op!r}; ops with a ladder: {', '.join(ladder_ops())}")
    got = rungs(op)
    if not got:
        have = [i.backend for i in registry.impls(op)]
        raise ValueError(
            f"op: {op!r} has no ladder (no family with two numbered variants <family>_v<N>; its backends: "
            f"{', '.join(have)}); ops with a ladder: {', '.join(ladder_ops())}"
        )
    return got


# --------------------------------------------------------------------------- rows


def _dtype(name) -> str:
    name = str(name or "")
    return _DTYPE_ALIASES.get(name.replace("torch.", ""), name)


def _options(opts) -> str:
    if isinstance(opts, dict):
        return ",".join(f"{k}={v}" for k, v in sorted(opts.items()))
    return str(opts or "")


def _key(r: dict) -> tuple:
    return (
        r.get("gpu") or "?",
        r["shape"],
        _dtype(r["dtype"]),
        r["mode"],
        _options(r.get("options")),
        bool(r.get("tf32")),
    )


def key_text(key, metric: str = "gbps") -> str:
    gpu, shape, dtype, mode, opts, tf32 = key
    # TF32 matters where products are summed (matmul, conv): said for fp32 work timed in TFLOP/s
    tf = ", TF32 on" if tf32 else (", TF32 off" if dtype == "fp32" and metric == "tflops" else "")
    return f"{shape} {dtype} {mode}{' [' + opts + ']' if opts else ''}{tf}, {gpu}"


def is_timing_row(r) -> bool:
    """A benchmark row that times one backend: ok (with a time) or rejected (a wrong output
    in the timed run); not a host-cost, check, CUDA-graph or model row."""
    if not isinstance(r, dict) or r.get("bench") == "host_cost" or r.get("graph"):
        return False
    if not all(r.get(k) for k in ("op", "backend", "shape", "dtype", "mode")):
        return False
    status = r.get("status", "ok")
    if status == "rejected":
        return True
    return status == "ok" and isinstance(r.get("median_ms"), (int, float)) and r["median_ms"] > 0


def load(paths=None) -> tuple[list[dict], list[str]]:
    """Timing rows of the JSONL files in ``paths`` (files or folders, searched recursively;
    default: benchmarks/results/) and the files read."""
    from kernellab.harness.results import read_jsonl

    if not paths:
        paths = [RESULTS if RESULTS.is_dir() or not _SOURCE_RESULTS.is_dir() else _SOURCE_RESULTS]
    paths = [Path(p) for p in paths]
    files = []
    for p in paths:
        if p.is_dir():
            files += sorted(p.rglob("*.jsonl"))
        elif p.exists():
            files.append(p)
        else:
            raise ValueError(f"--results: no such file or folder: {p}")
    rows = []
    for f in files:
        rows += [r for r in read_jsonl(f) if is_timing_row(r)]
    return rows, [str(f) for f in files]


# --------------------------------------------------------------------------- tables


@dataclass
class Line:
    """One line of a ladder table: a rung or a reference."""

    backend: str
    label: str
    change: str
    kind: str  # "rung" or "reference"
    status: str = "not measured"  # "ok", "not measured", "rejected: <reason>"
    median_ms: float | None = None
    value: float | None = None  # GB/s or TFLOP/s (the table's metric)
    pct_peak: float | None = None
    vs_prev: float | None = None
    prev: str | None = None  # the rung vs_prev compares with (the nearest measured one below)
    vs_base: float | None = None
    git_sha: str | None = None
    date: str | None = None


@dataclass
class Ladder:
    op: str
    family: str
    key: tuple | None  # (gpu, shape, dtype, mode, options, tf32); None: no row at all
    metric: str  # "tflops" or "gbps"
    base: str | None  # the rung vs_base compares with: the first measured
    lines: list[Line] = field(default_factory=list)
    not_for_dtype: list[str] = field(default_factory=list)  # rungs that do not take the key's dtype
    notes: list[str] = field(default_factory=list)

    @property
    def title(self) -> str:
        where = key_text(self.key, self.metric) if self.key else "no timing rows"
        return f"{self.op}, {self.family} ladder: {where}"

    def as_dict(self) -> dict:
        d = asdict(self)
        d["key"] = (
            dict(zip(("gpu", "shape", "dtype", "mode", "options", "tf32"), self.key)) if self.key else None
        )
        d["title"] = self.title
        return d


def _newest(rows) -> dict[tuple, dict[str, dict]]:
    """key -> backend -> the newest row (by its time, then file order)."""
    out: dict[tuple, dict[str, dict]] = {}
    for i, r in enumerate(rows):
        cur = out.setdefault(_key(r), {}).get(r["backend"])
        if cur is None or (str(r.get("time") or ""), i) >= (str(cur.get("time") or ""), cur["_i"]):
            out[_key(r)][r["backend"]] = dict(r, _i=i)
    return out


def _applies(rung: Rung, dtype: str) -> bool:
    return rung.dtypes is None or dtype in rung.dtypes


def _matches(key, shape, dtype, mode, gpu) -> bool:
    gpu_ok = gpu is None or gpu.lower() in key[0].lower()
    return gpu_ok and all(want is None or key[i] == want for i, want in ((1, shape), (2, dtype), (3, mode)))


def _norm_shape(shape: str | None) -> str | None:
    if shape is None:
        return None
    from kernellab.core.spec import parse_shape

    try:
        return "x".join(str(d) for d in parse_shape(shape))
    except ValueError:
        return shape


def _work(shape: str) -> int:
    """The product of a shape key's dims ("8192x8192x8192"); 0 where it is not a shape."""
    from kernellab.core.spec import parse_shape

    try:
        return math.prod(parse_shape(str(shape)))
    except ValueError:
        return 0


def build(op: str, rows, *, shape=None, dtype=None, mode=None, gpu=None) -> list[Ladder]:
    """The op's ladder tables from timing rows (``load``), one per chosen key and family."""
    ladders = check_op(op)
    if dtype:
        from kernellab.core.spec import dtype_name, parse_dtype

        try:
            dtype = dtype_name(parse_dtype(dtype))
        except ValueError as e:
            raise ValueError(f"--dtype: {e}") from None
    shape = _norm_shape(shape)
    newest = {
        k: v
        for k, v in _newest([r for r in rows if r["op"] == op]).items()
        if _matches(k, shape, dtype, mode, gpu)
    }
    out = []
    for family, steps in ladders.items():
        ok = {
            k: {
                s.backend
                for s in steps
                if by.get(s.backend, {}).get("status", "ok") == "ok" and s.backend in by and _applies(s, k[2])
            }
            for k, by in newest.items()
        }
        ok = {k: v for k, v in ok.items() if v}  # the keys where a rung was measured
        left = set().union(*ok.values()) if ok else set()
        chosen = []
        while left:

            def rank(k):
                # most rungs (new ones first), forward, the rungs' rows from one commit, the
                # newest, the largest problem (where a ladder reaches the hardware's limit),
                # then the most references
                mine = [newest[k][b] for b in ok[k]]
                one_sha = len({r.get("git_sha") for r in mine}) == 1
                when = max(str(r.get("time") or "") for r in mine)
                return (len(ok[k] & left), len(ok[k]), k[3] == "fwd", one_sha, when, _work(k[1]), len(newest[k]), k)

            k = max(ok, key=rank)
            chosen.append(k)
            left -= ok[k]
        if not chosen:  # nothing measured: the rungs alone, every one "not measured"
            out.append(_table(op, family, steps, None, {}))
        out += [_table(op, family, steps, k, newest[k]) for k in chosen]
    return out


def _fill(line: Line, r: dict, metric: str) -> None:
    line.git_sha, line.date = (r.get("git_sha") or None), str(r.get("time") or "")[:10] or None
    if line.git_sha:
        line.git_sha = str(line.git_sha)[:7]  # (some runs wrote 12 digits: one commit, one name)
    if r.get("status", "ok") != "ok":
        reason = str(r.get("reason") or "")
        reason = reason if len(reason) <= 80 else reason[:77] + "..."
        line.status = f"{r.get('status')}: {reason}".rstrip(": ")
        return
    line.status, line.median_ms = "ok", float(r["median_ms"])
    line.value, line.pct_peak = r.get(metric), r.get("pct_peak")


def _table(op, family, steps, key, by: dict) -> Ladder:
    dtype = key[2] if key else None
    metrics = [r.get("metric") for r in by.values() if r.get("metric")]
    metric = max(set(metrics), key=metrics.count) if metrics else "gbps"
    if not metrics and any(r.get("tflops") and r.get("pct_peak") == r.get("pct_flops") for r in by.values()):
        metric = "tflops"
    lad = Ladder(op, family, key, metric, None)
    prev = None
    for s in steps:
        if dtype is not None and not _applies(s, dtype):
            lad.not_for_dtype.append(f"{s.label} ({'/'.join(s.dtypes)} only)")
            continue
        line = Line(s.backend, s.label, s.change, "rung")
        if s.backend in by:
            _fill(line, by[s.backend], metric)
        if line.median_ms:
            if prev is not None:
                line.vs_prev, line.prev = prev.median_ms / line.median_ms, prev.label
            if lad.base is None:
                lad.base, base_ms = s.label, line.median_ms
            line.vs_base = base_ms / line.median_ms
            prev = line
        lad.lines.append(line)
    if key is None:
        lad.notes.append("no timing rows of these rungs in the results read")
        return lad
    from kernellab.core import registry

    ladder_backends = {s.backend for s in steps}
    descriptions = {i.backend: i.description for i in registry.impls(op)}
    refs = [
        b
        for b in sorted(by, key=_ref_order)
        if b not in ladder_backends and b not in _NOT_REFERENCES and not numbered(b)
    ]
    for b in refs:
        line = Line(b, b, _one_line(descriptions.get(b, "(not registered here)"), b), "reference")
        _fill(line, by[b], metric)
        if line.median_ms and lad.base:
            line.vs_base = base_ms / line.median_ms
        lad.lines.append(line)
    top = prev
    if top is not None:
        lands = [
            f"{ln.backend} {ln.median_ms / top.median_ms:.2f}x"
            for ln in lad.lines
            if ln.kind == "reference" and ln.median_ms
        ]
        if lands:
            lad.notes.append(
                f"where the top measured rung lands: {top.label}'s speed over "
                + ", ".join(lands)
                + " (above 1x the rung is faster)"
            )
    used = [ln for ln in lad.lines if ln.git_sha or ln.date]
    shas = sorted({ln.git_sha or "?" for ln in used})
    days = sorted({ln.date or "?" for ln in used})
    if len(shas) > 1 or len(days) > 1:
        parts = []
        for sha in shas:
            who = [ln.label for ln in used if (ln.git_sha or "?") == sha]
            when = sorted({ln.date or "?" for ln in used if (ln.git_sha or "?") == sha})
            parts.append(f"{sha} ({', '.join(when)}): {', '.join(who)}")
        lad.notes.append(
            f"mixed rows: {len(shas)} commit(s), {len(days)} day(s) - "
            + "; ".join(parts)
            + ". A gain across them mixes code changes with run-to-run differences."
        )
    return lad


def _ref_order(backend: str):
    order = ("torch", "compile", "triton", "cuda")
    return (order.index(backend) if backend in order else len(order), backend)


# --------------------------------------------------------------------------- output


def _cells(lad: Ladder, ln: Line) -> list[str]:
    def num(v, fmt):
        return format(v, fmt) if v is not None else "-"

    if ln.status != "ok":
        return [ln.label, ln.change, ln.status, "", "", "", "", _commit(ln)]
    prev = f"{ln.vs_prev:.2f}x" if ln.vs_prev is not None else "-"
    if ln.vs_prev is not None and ln.kind == "rung" and not _adjacent(lad, ln):
        prev += f" (vs {ln.prev})"
    return [
        ln.label,
        ln.change,
        f"{ln.median_ms:.4g}",
        num(ln.value, ",.4g" if lad.metric == "gbps" else ".3g"),
        num(ln.pct_peak, ".1f"),
        prev,
        num(ln.vs_base, ".2f") + ("x" if ln.vs_base is not None else ""),
        _commit(ln),
    ]


def _adjacent(lad: Ladder, ln: Line) -> bool:
    rung_lines = [x for x in lad.lines if x.kind == "rung"]
    i = rung_lines.index(ln)
    return i > 0 and rung_lines[i - 1].label == ln.prev


def _commit(ln: Line) -> str:
    return " ".join(x for x in (ln.git_sha, ln.date) if x)


def _head(lad: Ladder) -> list[str]:
    return [
        "rung",
        "change",
        "ms",
        "TFLOP/s" if lad.metric == "tflops" else "GB/s",
        "% peak",
        "vs prev",
        f"vs {lad.base or 'v1'}",
        "row (commit, day)",
    ]


def _footer(lad: Ladder) -> list[str]:
    out = []
    if lad.not_for_dtype:
        out.append(f"not for {lad.key[2]}: " + ", ".join(lad.not_for_dtype))
    return out + lad.notes


def to_markdown(ladders: list[Ladder], level: int = 3) -> str:
    parts = []
    for lad in ladders:
        head = _head(lad)
        lines = [
            f"{'#' * level} {lad.title}",
            "",
            "| " + " | ".join(head) + " |",
            "|---|---|" + "---:|" * 5 + "---|",
        ]
        for i, ln in enumerate(lad.lines):
            if ln.kind == "reference" and (i == 0 or lad.lines[i - 1].kind == "rung"):
                lines.append("| *references* |" + " |" * (len(head) - 1))
            cells = [c.replace("|", "\\|") for c in _cells(lad, ln)]
            lines.append("| " + " | ".join(cells) + " |")
        foot = _footer(lad)
        if foot:
            lines += [""] + [f"- {f}" for f in foot]
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def to_text(ladders: list[Ladder]) -> str:
    parts = []
    for lad in ladders:
        head = _head(lad)
        rows = [_cells(lad, ln) for ln in lad.lines]
        kinds = [ln.kind for ln in lad.lines]
        widths = [max(len(r[c]) for r in [head] + rows) for c in range(len(head))]
        right = {2, 3, 4, 5, 6}

        def fmt(r):
            return "  ".join(
                c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))
            )

        out = [lad.title, fmt(head).rstrip(), fmt(["-" * w for w in widths])]
        for i, r in enumerate(rows):
            if kinds[i] == "reference" and (i == 0 or kinds[i - 1] == "rung"):
                out.append("references:")
            out.append(fmt(r).rstrip())
        out += [f"  {f}" for f in _footer(lad)]
        parts.append("\n".join(out))
    return "\n\n".join(parts) + "\n"


def to_json(ladders: list[Ladder]) -> str:
    return json.dumps([lad.as_dict() for lad in ladders], indent=1)


def plot(ladders: list[Ladder], path, by: str = "peak") -> Path:
    """A bar chart per table: % of peak (``by="peak"``) or median time (``by="time"``, log
    scale) per rung, the references in gray; unmeasured rungs are named and left empty."""
    if by not in ("peak", "time"):
        raise ValueError(f"--plot-by: 'peak' or 'time', got {by!r}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(ladders)
    tall = max(len(lad.lines) for lad in ladders) if ladders else 1
    fig, axes = plt.subplots(n, 1, figsize=(9, (0.32 * tall + 1.3) * n), squeeze=False)
    for ax, lad in zip(axes[:, 0], ladders):
        labels, vals, colors = [], [], []
        for ln in lad.lines:
            v = ln.pct_peak if by == "peak" else ln.median_ms
            labels.append(ln.label if ln.status == "ok" else f"{ln.label} ({ln.status.split(':')[0]})")
            vals.append(v or 0.0)
            colors.append("tab:blue" if ln.kind == "rung" else "tab:gray")
        ys = range(len(labels))
        ax.barh(list(ys), vals, color=colors)
        for y, ln, v in zip(ys, lad.lines, vals):
            if ln.status == "ok":
                ax.text(
                    v,
                    y,
                    f" {ln.median_ms:.3g} ms" + (f", {ln.vs_base:.1f}x" if ln.vs_base else ""),
                    va="center",
                    fontsize=7,
                )
        ax.set_yticks(list(ys), labels, fontsize=8)
        ax.invert_yaxis()
        if by == "time":
            ax.set_xscale("log")
            ax.set_xlabel("median ms (log scale; shorter is faster)")
        else:
            ax.set_xlabel("% of the measured peak (copy bandwidth or matmul rate)")
        ax.set_title(lad.title, fontsize=9)
        ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def document(ops_ladders: dict[str, list[Ladder]], sources: list[str]) -> str:
    """The markdown page of every ladder (docs/ladders.md)."""
    head = [
        "# Ladders",
        "",
        "Generated by `kernellab ladder --all --markdown > docs/ladders.md` from the rows committed under",
        f"`benchmarks/results/` ({len(sources)} JSONL files); do not edit by hand. Each table: a rung per",
        "numbered variant with its change in one line, the newest row at one (GPU, shape, dtype, mode)",
        "key, its speed-up over the previous measured rung and over the first; then the references",
        "measured at the same key. `kernellab ladder OP --help` says how the key is chosen.",
        "",
    ]
    body = [f"## {op}\n\n" + to_markdown(lads, level=3) for op, lads in ops_ladders.items()]
    return "\n".join(head) + "\n" + "\n".join(body)


def command(
    op=None,
    *,
    all_ops=False,
    results=None,
    shape=None,
    dtype=None,
    mode=None,
    gpu=None,
    fmt="text",
    plot_path=None,
    plot_by="peak",
) -> tuple[str, int]:
    """What ``kernellab ladder`` prints and its exit status: 0 when a rung was measured,
    1 when no rung of the op(s) has a row."""
    if all_ops == (op is not None):
        raise ValueError("op: name one op, or --all for every op with a ladder")
    if fmt not in ("text", "markdown", "json"):
        raise ValueError(f"format: text, markdown or json, got {fmt!r}")
    if op is not None:
        check_op(op)  # before reading rows: an unknown op is the user's first mistake
    rows, files = load(results)
    ops = ladder_ops() if all_ops else [op]
    by_op = {o: build(o, rows, shape=shape, dtype=dtype, mode=mode, gpu=gpu) for o in ops}
    flat = [lad for lads in by_op.values() for lad in lads]
    if plot_path:
        plot(flat, plot_path, by=plot_by)
    if fmt == "json":
        text = to_json(flat)
    elif fmt == "markdown":
        text = document(by_op, files) if all_ops else to_markdown(flat)
    else:
        text = to_text(flat)
    measured = any(ln.status == "ok" for lad in flat for ln in lad.lines if ln.kind == "rung")
    return text, 0 if measured else 1
