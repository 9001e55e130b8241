"""``kernellab report --html OUT/ FILES...``: a static page from committed result rows.

What it reads (one JSONL row per line; a ``check --json`` file is one JSON list):

- benchmark rows (``bench --json``, ``tune``): op, backend, mode, shape, dtype, median_ms,
  tflops, bytes, flops, peak_copy_gbps, pct_flops. Drawn as a roofline (achieved TFLOP/s
  against arithmetic intensity under the measured copy and matmul ceilings), one speed-up
  chart per op (kernellab's best own kernel and the default against the best vendor
  kernel per shape) and, for ops with numbered CUDA variants, the ladder table.
- user-model rows (``train hf|nanogpt --compare --out``): model, variant, mode, ms,
  peak_gib. Drawn as speed relative to the model as is (variant hf or torch) and peak
  memory.
- host-cost rows (``bench: host_cost``): the default's host time per call over PyTorch's.
- check reports (``check --json``): counted by status per op.

The page is one ``index.html`` with its PNGs beside it, no script or style from elsewhere;
a script on the page marks ``<body data-status>`` "ok" once every picture has loaded (or
"missing: N" and a console error), which is what the browser test reads.
"""

from __future__ import annotations

import html
import json
import math
from collections import defaultdict
from pathlib import Path

from kernellab.harness.results import VENDOR

NOT_OURS = VENDOR + ("manual",)
BASELINES = ("hf", "torch")  # a user-model group's reference: the model as is


def _is_bench(r: dict) -> bool:
    """A timed kernel call's row: op, backend, dtype, mode, a time and an "AxB" shape (a
    whole step's row, e.g. a multi-GPU run's, has a list shape; a lab probe's may lack the
    mode)."""
    return all(k in r for k in ("op", "backend", "dtype", "mode")) and bool(r.get("median_ms")) and isinstance(
        r.get("shape"), str)


def load(paths) -> dict[str, list]:
    """Rows of ``paths`` sorted by kind: bench, models, host, check."""
    kinds: dict[str, list] = {"bench": [], "models": [], "host": [], "check": []}
    for path in paths:
        text = Path(path).read_text()
        if text.lstrip().startswith("["):
            kinds["check"] += [r for r in json.loads(text) if isinstance(r, dict)]
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not a JSON row ({e.msg})") from None
            if r.get("bench") == "host_cost":
                kinds["host"].append(r)
            elif "model" in r and "variant" in r and "ms" in r:
                kinds["models"].append(r)
            elif _is_bench(r):
                kinds["bench"].append(r)
    return kinds


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, out: Path, name: str) -> str:
    fig.tight_layout()
    fig.savefig(out / name, dpi=100)
    _plt().close(fig)
    return name


def model_groups(rows) -> dict[tuple, list[dict]]:
    """(model, mode, batch, seq) -> one row per variant, the last in file order (a re-run
    replaces the earlier row); only groups of two variants or more."""
    latest = defaultdict(dict)
    for r in rows:
        latest[(r["model"], r["mode"], r.get("batch"), r.get("seq"))][r["variant"]] = r
    return {k: list(v.values()) for k, v in latest.items() if len(v) > 1}


def plot_models(rows, out: Path) -> str | None:
    groups = model_groups(rows)
    if not groups:
        return None
    plt = _plt()
    keys = sorted(groups)
    seen = dict.fromkeys(r["variant"] for k in keys for r in groups[k])
    variants = sorted(seen, key=lambda v: v not in BASELINES)  # the baselines first, else in order
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 0.5 * len(keys) + 2))
    h = 0.8 / len(variants)
    for i, v in enumerate(variants):
        ys, speed, mem = [], [], []
        for j, k in enumerate(keys):
            base = next((x for x in groups[k] if x["variant"] in BASELINES), groups[k][0])
            r = next((x for x in groups[k] if x["variant"] == v), None)
            if r is not None:
                ys.append(j + i * h)
                speed.append(base["ms"] / r["ms"])
                mem.append(r.get("peak_gib") or 0.0)
        a1.barh(ys, speed, height=h, label=v)
        a2.barh(ys, mem, height=h, label=v)
    labels = [f"{m} {mode} {b}x{s}" for m, mode, b, s in keys]
    for ax in (a1, a2):
        ax.set_yticks([j + 0.4 - h / 2 for j in range(len(keys))], labels, fontsize=8)
        ax.invert_yaxis()
        ax.grid(True, axis="x", alpha=0.3)
    a1.axvline(1.0, color="gray", linestyle="--")
    a1.set_xlabel("speed relative to the model as is (its ms / this ms)")
    a2.set_xlabel("peak memory, GiB")
    a1.legend(fontsize=8)
    fig.suptitle("Training steps of models kernellab did not write")
    return _save(fig, out, "models.png")


def _intensity(r) -> float | None:
    b, f = r.get("bytes"), r.get("flops")
    return f / b if b and f else None


def plot_roofline(rows, out: Path) -> str | None:
    pts = [(r, _intensity(r)) for r in rows if r.get("tflops") and _intensity(r)]
    if not pts:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 5.5))
    for label, sel, marker in (("kernellab", lambda b: b not in NOT_OURS, "o"),
                               ("vendor", lambda b: b in VENDOR, "x")):  # fmt: skip
        xs = [ai for r, ai in pts if sel(r["backend"])]
        ys = [r["tflops"] for r, ai in pts if sel(r["backend"])]
        if xs:
            ax.scatter(xs, ys, s=12, marker=marker, alpha=0.6, label=label)
    bw = max((r.get("peak_copy_gbps") or 0) for r, _ in pts)
    peak = max((r["tflops"] * 100 / r["pct_flops"] for r, _ in pts if r.get("pct_flops")), default=0)
    lo, hi = min(ai for _, ai in pts), max(ai for _, ai in pts)
    if bw:
        xs = [lo * 10 ** (i / 20) for i in range(int(20 * math.log10(hi / lo)) + 2)]
        ys = [min(x * bw / 1e3, peak or math.inf) for x in xs]
        ax.plot(xs, ys, color="gray", linestyle="--", label=f"ceilings: copy {bw:.0f} GB/s, {peak:.0f} TFLOP/s")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity, FLOP per byte (minimal bytes)")
    ax.set_ylabel("achieved TFLOP/s")
    gpu = pts[0][0].get("gpu", "")
    ax.set_title(f"Roofline: every timed call ({gpu})")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, out, "roofline.png")


def _best(rows):
    """Per (op, shape, dtype, mode) with a vendor kernel and one of ours or the default:
    (op, case, best vendor backend, its ms, best own backend or None, its ms, default ms)."""
    cases = defaultdict(dict)  # (op, shape, dtype, mode) -> backend -> ms
    for r in rows:
        key = (r["op"], r["shape"], r["dtype"], r["mode"])
        ms = cases[key].get(r["backend"])
        cases[key][r["backend"]] = r["median_ms"] if ms is None else min(ms, r["median_ms"])
    for (op, shape, dtype, mode), by in sorted(cases.items()):
        vendor = {b: ms for b, ms in by.items() if b in VENDOR}
        own = {b: ms for b, ms in by.items() if b not in NOT_OURS and b != "default"}
        if not vendor or not (own or "default" in by):
            continue
        vb = min(vendor, key=vendor.get)
        ob = min(own, key=own.get) if own else None
        yield op, f"{shape} {dtype} {mode}", vb, vendor[vb], ob, own.get(ob), by.get("default")


def speedups(rows) -> dict[str, list[tuple[str, float | None, float | None]]]:
    """Per op: (case, best own kernel's speed-up, the default's) over the best vendor
    kernel at the same (shape, dtype, mode); a case with no vendor row is left out."""
    out = defaultdict(list)
    for op, case, _, vms, _, oms, dms in _best(rows):
        out[op].append((case, vms / oms if oms else None, vms / dms if dms else None))
    return out


def case_rows(rows) -> dict[str, list[tuple]]:
    """Per op, the numbers behind each chart: the case, the best vendor backend and its ms,
    our best own backend and its ms, the default's ms, and the two speed-ups."""
    out = defaultdict(list)
    for op, case, vb, vms, ob, oms, dms in _best(rows):
        out[op].append((case, vb, f"{vms:.4f}", ob or "-", f"{oms:.4f}" if ob else "-", f"{dms:.4f}" if dms else "-",
                        f"{vms / oms:.2f}x" if ob else "-", f"{vms / dms:.2f}x" if dms else "-"))  # fmt: skip
    return out


def plot_speedups(op: str, cases, out: Path) -> str:
    plt = _plt()
    cases = cases[:40]
    fig, ax = plt.subplots(figsize=(9, 0.28 * len(cases) + 1.5))
    ys = range(len(cases))
    own = [c[1] or 0.0 for c in cases]
    ax.barh([y - 0.2 for y in ys], own, height=0.4, label="best kernellab kernel")
    if any(c[2] for c in cases):
        ax.barh([y + 0.2 for y in ys], [c[2] or 0.0 for c in cases], height=0.4, label="default")
    ax.set_yticks(list(ys), [c[0] for c in cases], fontsize=7)
    ax.invert_yaxis()
    ax.axvline(1.0, color="gray", linestyle="--")
    ax.set_xlabel("speed-up over the best vendor kernel (vendor ms / ours)")
    ax.set_title(op)
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, out, f"speedup-{op}.png")


def plot_host(rows, out: Path) -> str | None:
    pts = sorted({(r["op"], r["mode"]): r.get("vs_torch") for r in rows if r.get("backend") == "default"}.items())
    pts = [(k, v) for k, v in pts if v]
    if not pts:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 0.3 * len(pts) + 1.5))
    ax.barh(range(len(pts)), [v for _, v in pts])
    ax.set_yticks(range(len(pts)), [f"{op} {mode}" for (op, mode), _ in pts], fontsize=8)
    ax.invert_yaxis()
    ax.axvline(1.0, color="gray", linestyle="--")
    ax.axvline(1.3, color="red", linestyle=":", label="1.3x")
    ax.set_xlabel("host time per call, the default over PyTorch's (tiny shapes)")
    ax.legend(fontsize=8)
    return _save(fig, out, "host_cost.png")


def ladders(rows) -> dict[str, list[tuple[str, str, float, float | None]]]:
    """Per (op, shape, dtype, mode) with numbered variants (``<family>_v<N>``, see
    ``harness.ladder``, which ``kernellab ladder`` prints with each rung's change): (case,
    rung, ms, gain over the previous rung of its family)."""
    from kernellab.harness.ladder import numbered

    by = defaultdict(dict)
    for r in rows:
        fn = numbered(r["backend"])
        if fn:
            by[(r["op"], r["shape"], r["dtype"], r["mode"], fn[0])][fn[1]] = r["median_ms"]
    out = defaultdict(list)
    for (op, shape, dtype, mode, family), rungs in sorted(by.items()):
        if len(rungs) < 2:
            continue
        prev = None
        for n in sorted(rungs):
            ms = rungs[n]
            out[op].append((f"{shape} {dtype} {mode}", f"{family}_v{n}", ms, prev / ms if prev else None))
            prev = ms
    return out


def _table(head, rows) -> str:
    th = "".join(f"<th>{html.escape(str(h))}</th>" for h in head)
    trs = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{trs}</tbody></table>"


_CHECK_IMAGES = """<script>
window.addEventListener("load", function () {
  var bad = Array.prototype.filter.call(document.images, function (i) {
    return !i.complete || i.naturalWidth === 0;
  });
  document.body.dataset.status = bad.length ? "missing: " + bad.length : "ok";
  bad.forEach(function (i) { console.error("image did not load: " + i.getAttribute("src")); });
});
</script>"""

_STYLE = """<style>
body { font-family: sans-serif; max-width: 1100px; margin: 2em auto; color: #222; }
table { border-collapse: collapse; font-size: 13px; margin: 1em 0; }
td, th { border: 1px solid #ccc; padding: 2px 8px; text-align: left; }
img { max-width: 100%; }
</style>"""


def tables_section(gpus) -> str:
    """HTML: per GPU model's tuning table (its own rows: the model-family shapes, every
    candidate timed side by side by ``tune``), per op: where ours are at least the best
    vendor kernel (``vendor_gap.table_rows``) and where the default's choice lands within 3%
    of the fastest with each row left out in turn (``choice_cv``)."""
    from kernellab.core import tables
    from kernellab.harness import choice_cv, vendor_gap

    parts = ["<h2>At the model-family shapes (tuning tables)</h2>",
             "<p>Device times from each GPU's committed table. <i>ours &gt;= vendor</i>: our best kernel "
             "against the best vendor kernel at each row. <i>default, row left out</i>: each row taken out "
             "in turn, the choice for its shape made from the other rows, within 3% of that row's fastest "
             "(how the default does at shapes no row holds).</p>"]  # fmt: skip
    for gpu in gpus:
        rows = tables.read_table(tables.table_path(gpu))["rows"]
        lines, _ = vendor_gap.summarize(vendor_gap.table_rows({"rows": rows}))
        own = vendor_gap.op_totals(lines)
        cv = choice_cv.summarize(choice_cv.cross_validate(rows, choice_cv.registry_candidates))["groups"]
        out = []
        for op in sorted({k[0] for k in cv} | set(own)):
            o = own.get(op)
            hits = sum(g["hits"] for k, g in cv.items() if k[0] == op)
            scored = sum(g["scored"] for k, g in cv.items() if k[0] == op)
            out.append((op, f"{o['own_at_least_vendor']} of {o['cases']}" if o else "-",
                        o["own_below_0.9"] if o else "-", f"{o['own_geomean']:.2f}" if o else "-",
                        f"{hits} of {scored}" if scored else "-"))  # fmt: skip
        parts.append(f"<h3>{html.escape(gpu)}</h3>")
        parts.append(_table(("op", "ours >= vendor", "below 0.9x", "geomean ours / vendor",
                             "default, row left out: within 3%"), out))  # fmt: skip
    return "\n".join(parts)


def build(paths, out_dir, title: str = "kernellab results", tables_of=()) -> Path:
    """Write ``out_dir/index.html`` and its pictures from the rows in ``paths`` (and, for
    the GPU models in ``tables_of``, ``tables_section``)."""
    kinds = load(paths)
    if not any(kinds.values()):
        raise ValueError(f"no result rows in {', '.join(str(p) for p in paths)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    parts = [f"<h1>{html.escape(title)}</h1>",
             f"<p>From {len(paths)} file(s): {html.escape(', '.join(Path(p).name for p in paths))}.</p>"]  # fmt: skip
    if kinds["models"]:
        parts.append("<h2>User models</h2>")
        img = plot_models(kinds["models"], out)
        if img:
            parts.append(f'<img src="{img}" alt="user-model steps">')
        rows = [(r["model"], r["mode"], f"{r.get('batch')}x{r.get('seq')}", r["variant"], f"{r['ms']:.2f}",
                 r.get("tokens_per_s", ""), r.get("peak_gib", ""), r.get("gpu", "")) for r in kinds["models"]]  # fmt: skip
        parts.append(_table(("model", "mode", "tokens", "variant", "ms/step", "tokens/s", "peak GiB", "GPU"), rows))
    if kinds["bench"]:
        parts.append("<h2>Roofline</h2>")
        img = plot_roofline(kinds["bench"], out)
        if img:
            parts.append(f'<img src="{img}" alt="roofline">')
        sp = speedups(kinds["bench"])
        if sp:
            parts.append("<h2>Speed-up over the best vendor kernel</h2>")
            summary = []
            for op, cases in sp.items():
                own = [c[1] for c in cases if c[1]]
                wins = sum(v >= 1.0 for v in own)
                geo = math.exp(sum(math.log(v) for v in own) / len(own)) if own else None
                summary.append((op, len(cases), f"{wins} of {len(own)}", f"{geo:.2f}" if geo else "-"))
            parts.append(_table(("op", "cases", "own kernel >= vendor", "geomean own / vendor"), summary))
            table_rows = case_rows(kinds["bench"])
            head = ("case", "best vendor", "ms", "best own", "ms", "default ms", "own / vendor", "default / vendor")
            for op, cases in sp.items():
                parts.append(f'<img src="{plot_speedups(op, cases, out)}" alt="{html.escape(op)} speed-ups">')
                parts.append(f"<details><summary>{html.escape(op)}: the numbers</summary>"
                             + _table(head, table_rows[op]) + "</details>")  # fmt: skip
        lad = ladders(kinds["bench"])
        if lad:
            parts.append("<h2>Ladders</h2>")
            for op, rungs in lad.items():
                rows = [(case, rung, f"{ms:.4f}", f"{g:.2f}x" if g else "") for case, rung, ms, g in rungs]
                parts.append(f"<h3>{html.escape(op)}</h3>" + _table(("case", "rung", "ms", "gain"), rows))
    if tables_of:
        parts.append(tables_section(tables_of))
    if kinds["host"]:
        parts.append("<h2>Host cost</h2>")
        img = plot_host(kinds["host"], out)
        if img:
            parts.append(f'<img src="{img}" alt="host cost">')
    if kinds["check"]:
        counts = defaultdict(lambda: defaultdict(int))
        for r in kinds["check"]:
            counts[r.get("op", "?")][r.get("status", "?")] += 1
        statuses = sorted({s for c in counts.values() for s in c})
        rows = [(op, *(c.get(s, 0) for s in statuses)) for op, c in sorted(counts.items())]
        parts.append("<h2>Check</h2>" + _table(("op", *statuses), rows))
    page = ("<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>" + html.escape(title) + "</title>"
            + _STYLE + "</head><body>\n" + "\n".join(parts) + "\n" + _CHECK_IMAGES + "\n</body></html>\n")  # fmt: skip
    (out / "index.html").write_text(page)
    return out / "index.html"
