"""Result rows as JSONL (one row per measurement) and tables built from them.

Committed results live in ``benchmarks/results/<gpu>.jsonl``; the README's tables are
printed from those files by ``kernellab report``.
"""

from __future__ import annotations

import json
from pathlib import Path

# The fields DESIGN.md promises in every row, in order; extra fields follow.
FIELDS = (
    "op",
    "backend",
    "mode",
    "shape",
    "dtype",
    "median_ms",
    "p20_ms",
    "p80_ms",
    "gbps",
    "tflops",
    "pct_peak",
    "gpu",
    "torch",
    "triton",
    "cuda",
    "git_sha",
    "time",
)


def write_jsonl(rows, path: str | Path, append: bool = True) -> int:
    """Append measured rows (status ok or rejected) to ``path``; returns how many."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    kept = [r for r in rows if r.get("status") in ("ok", "rejected")]
    with path.open("a" if append else "w") as f:
        for r in kept:
            ordered = {k: r.get(k) for k in FIELDS}
            ordered.update({k: v for k, v in r.items() if k not in ordered})
            f.write(json.dumps(ordered) + "\n")
    return len(kept)


def read_jsonl(path: str | Path) -> list[dict]:
    rows = []
    for i, line in enumerate(Path(path).read_text().splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        try:
            rows.append(json.loads(line))
        except ValueError as e:
            raise ValueError(f"{path}:{i}: not a JSON row ({e})") from None
    return rows


def _fmt(v, nd=3):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{nd}g}" if abs(v) < 1e4 else f"{v:.0f}"
    return str(v)


def mode_label(r: dict) -> str:
    """The row's mode with its keyword options, e.g. 'fwd [causal=True]'."""
    return r["mode"] + (f" [{r['options']}]" if r.get("options") else "")


def markdown_table(rows, ops=None) -> str:
    """One line per (op, shape, dtype, mode, backend) - the latest row of each -, with
    time, GB/s, % of measured copy bandwidth and speed-up against torch."""
    latest = {}
    for r in rows:
        if ops and r["op"] not in ops:
            continue
        latest[(r["op"], r["shape"], r["dtype"], mode_label(r), r["backend"], bool(r.get("graph")))] = r
    lines = [
        "| op | shape | dtype | mode | backend | median ms (p20-p80) | GB/s | % copy BW | host us "
        "| loop ms | vs torch |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key in sorted(latest, key=lambda k: (k[0], k[2], _numel(k[1]), k[3], k[5])):
        r = latest[key]
        if r.get("status") == "rejected":
            timing = "rejected: " + r.get("reason", "")
        else:
            timing = f"{_fmt(r['median_ms'], 4)} ({_fmt(r['p20_ms'], 4)}-{_fmt(r['p80_ms'], 4)})"
        mode = mode_label(r) + (" graph" if r.get("graph") else "")
        lines.append(
            f"| {r['op']} | {r['shape']} | {r['dtype']} | {mode} | {r['backend']} | {timing} | "
            f"{_fmt(r.get('gbps'), 4)} | {_fmt(r.get('pct_bw'))} | {_fmt(r.get('host_us'))} | "
            f"{_fmt(r.get('loop_ms'), 4)}{' (host-bound)' if r.get('bound') == 'host' else ''} | "
            f"{_fmt(r.get('speedup_vs_torch'))} |"
        )
    return "\n".join(lines)


def _numel(shape: str) -> int:
    n = 1
    for d in shape.split("x"):
        n *= int(d) if d.isdigit() else 1
    return n


# The vendors' backends our kernels are measured against: PyTorch's op and torch.compile,
# the SDPA kernels (FlashAttention-2, cuDNN, efficient), Liger, cuFFT.
VENDOR = ("torch", "compile", "sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "liger", "fft")


def is_ours(backend: str) -> bool:
    """kernellab's own kernels, as opposed to the baselines (manual, torch, compile) and peers."""
    return backend.startswith(("triton", "cuda")) or backend == "tiled"


def pivot_table(rows, ops=None, shapes=None) -> str:
    """One line per (op, shape, dtype, mode), one column per backend: median time and
    % of the measured copy bandwidth (TFLOP/s for compute-bound ops); the fastest of our
    own backends (triton*, cuda*, tiled) in bold when it is at least as fast as every
    reference in the row (torch, compile and the peers: liger, sdpa_*, ...)."""
    latest, backends = {}, []
    for r in rows:
        if (ops and r["op"] not in ops) or (shapes and r["shape"] not in shapes) or r.get("graph"):
            continue
        latest[(r["op"], r["shape"], r["dtype"], mode_label(r), r["backend"])] = r
        if r["backend"] not in backends:
            backends.append(r["backend"])
    groups = sorted({k[:4] for k in latest}, key=lambda g: (g[0], _numel(g[1]), g[2], g[3]))
    head = "| op | shape | dtype | mode | " + " | ".join(backends) + " |"
    lines = [head, "|" + "---|" * (4 + len(backends))]
    for g in groups:
        cells = []
        ref_ms = [
            latest[g + (b,)]["median_ms"]
            for b in backends
            if g + (b,) in latest and not is_ours(b) and b != "manual" and latest[g + (b,)].get("median_ms")
        ]
        torch_ms = min(ref_ms) if ref_ms else None
        ours = [
            latest[g + (b,)]
            for b in backends
            if g + (b,) in latest and is_ours(b) and latest[g + (b,)].get("median_ms")
        ]
        best = min(ours, key=lambda r: r["median_ms"]) if ours else None
        for b in backends:
            r = latest.get(g + (b,))
            if r is None:
                cells.append("-")
            elif r.get("status") != "ok":
                cells.append(r.get("status", "?"))
            else:
                c = f"{r['median_ms']:.4g} ms"
                if r.get("metric") == "tflops" and r.get("tflops"):
                    c += f" ({r['tflops']:.0f} TF/s)"
                elif r.get("pct_bw") is not None:
                    c += f" ({r['pct_bw']:.0f}%)"
                if r is best and torch_ms and r["median_ms"] <= torch_ms:
                    c = f"**{c}**"
                cells.append(c)
        lines.append(f"| {g[0]} | {g[1]} | {g[2]} | {g[3]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
