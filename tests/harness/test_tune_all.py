"""kernellab.harness.tune_all's verify phase on the CPU: paired rounds behind every verdict."""

from __future__ import annotations

import json
import statistics

from kernellab.harness import tune_all as mod


def test_verify_verdicts_come_from_paired_rounds(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELLAB_TABLES", str(tmp_path / "tables"))
    argv = ["--out", str(tmp_path), "--ops", "add", "--dtypes", "fp32", "--families", "cpu-tiny",
            "--phases", "tune", "verify", "--budget", "0.02", "--paired-rounds", "3"]  # fmt: skip
    assert mod.main(argv) == 0
    rows = [json.loads(line) for line in (tmp_path / "verify.jsonl").read_text().splitlines()]
    summary = json.loads((tmp_path / "verify_summary.json").read_text())
    assert rows and summary["cases"] > 0 and not summary["left_out"]
    ok = [r for r in rows if r.get("status") == "ok"]
    assert ok and all(len(r["paired_rounds_ms"]) == 3 for r in ok)
    # every round's effective time is its loop time floored at the backend's device time;
    # the default and the backend it chose run the same kernels: one floor, the lesser median
    for r in ok:
        assert r["paired_rounds_ms"] == [round(max(r["paired_floor_ms"], ms), 5) for ms in r["paired_loop_ms"]]
        assert r["paired_floor_ms"] <= round(r["median_ms"], 5) + 1e-5
    med: dict = {}
    for r in ok:
        med.setdefault((str(r["shape"]), r["mode"]), {})[r["backend"]] = r
    shared = 0
    for case in med.values():
        d, c = case.get("default"), case.get(case["default"]["chosen"]) if "default" in case else None
        if d and c and c is not d:
            assert d["paired_floor_ms"] == c["paired_floor_ms"] == round(min(d["median_ms"], c["median_ms"]), 5)
            shared += 1
    assert shared
    # a case's verdict is the median of its same-round ratios; a group's is the worst case
    worst: dict = {}
    by_case: dict = {}
    for r in ok:
        by_case.setdefault((str(r["shape"]), r["mode"]), {})[r["backend"]] = r["paired_rounds_ms"]
    for (_, mode), times in by_case.items():
        if "default" in times and "torch" in times:
            ratio = round(statistics.median(d / t for d, t in zip(times["default"], times["torch"])), 3)
            worst[mode] = max(worst.get(mode, 0.0), ratio)
    groups = {g["mode"]: g for g in summary["groups"] if g.get("measured")}
    assert worst and set(worst) <= set(groups)
    for mode, w in worst.items():
        assert groups[mode]["worst_default_vs_torch"] == w, (mode, groups[mode], w)
        assert groups[mode]["worst_default_vs_best"] >= 1.0  # the default against itself counts


def test_shapes_tune_only_those_shapes(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELLAB_TABLES", str(tmp_path / "tables"))
    argv = ["--out", str(tmp_path), "--ops", "add", "--dtypes", "fp32", "--phases", "tune",
            "--shapes", "3x5", "7x9", "--budget", "0.02"]  # fmt: skip
    assert mod.main(argv) == 0
    rows = [json.loads(line) for line in (tmp_path / "tune.jsonl").read_text().splitlines()]
    assert rows and {r["shape"] for r in rows} == {"3x5", "7x9"}


def test_shapes_are_checked(tmp_path):
    import pytest

    for bad in (["--shapes", "3xq", "--phases", "tune"], ["--shapes", "3x5"],
                ["--shapes", "3x5", "--families", "gpt2", "--phases", "tune"]):  # fmt: skip
        with pytest.raises(SystemExit):
            mod.main(["--out", str(tmp_path), "--ops", "add", *bad])
