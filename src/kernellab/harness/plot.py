"""Plot a benchmark sweep (matplotlib, no display needed)."""

from __future__ import annotations

import math
from collections import defaultdict


def plot_sweep(rows, path, title: str | None = None) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r.get("status") == "ok" and r.get("gbps")]
    if not ok:
        raise ValueError("no measured rows to plot")
    groups = defaultdict(list)
    for r in ok:
        groups[(r["dtype"], r["mode"])].append(r)
    fig, axes = plt.subplots(1, len(groups), figsize=(6 * len(groups), 4.5), squeeze=False)
    for ax, ((dtype, mode), rs) in zip(axes[0], sorted(groups.items())):
        by_backend = defaultdict(list)
        for r in rs:
            n = math.prod(int(d) for d in r["shape"].split("x")) if r["shape"] != "scalar" else 1
            by_backend[r["backend"]].append((n, r["gbps"]))
        for backend, pts in sorted(by_backend.items()):
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=backend)
        peak = next((r.get("peak_copy_gbps") for r in rs if r.get("peak_copy_gbps")), None)
        if peak:
            ax.axhline(peak, color="gray", linestyle="--", label=f"copy ceiling {peak:.0f} GB/s")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("elements")
        ax.set_ylabel("GB/s (minimal bytes moved)")
        ax.set_title(f"{rs[0]['op']} {dtype} {mode} on {rs[0]['gpu']}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)
