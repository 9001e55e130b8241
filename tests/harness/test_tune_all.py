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


def test_a_cut_off_tune_resumes_where_it_stopped(tmp_path, monkeypatch, capsys):
    """``--limit-s`` stops starting cases (not ops) at the limit and lists the rest in
    tune_left.json; ``--resume`` with the first run's rows times only those."""
    import itertools
    import time

    from kernellab.harness import bench

    monkeypatch.setenv("KERNELLAB_TABLES", str(tmp_path / "tables"))
    ticks = itertools.count()

    start = time.perf_counter()

    class Clock:  # bench's clock: 10 s more at each case it starts, however long a case really takes
        @staticmethod
        def perf_counter():
            return start + 10 * next(ticks)

    monkeypatch.setattr(bench, "time", Clock)
    common = ["--ops", "add", "--dtypes", "fp32", "--modes", "fwd", "--phases", "tune", "--budget", "0.02",
              "--shapes", "3x5", "7x9", "11x13"]  # fmt: skip
    first, second = tmp_path / "a", tmp_path / "b"
    assert mod.main(["--out", str(first), "--limit-s", "15", *common]) == 0
    rows = [json.loads(line) for line in (first / "tune.jsonl").read_text().splitlines()]
    assert {r["shape"] for r in rows} == {"3x5", "7x9"}
    left = json.loads((first / "tune_left.json").read_text())
    assert left == {"planned": 3, "left": [["add", "fp32", "fwd", "11x13", ""]]}
    assert "2 of 3 cases done, 1 left" in capsys.readouterr().out

    monkeypatch.setattr(bench, "time", time)
    assert mod.main(["--out", str(second), "--resume", str(first / "tune.jsonl"), *common]) == 0
    rows = [json.loads(line) for line in (second / "tune.jsonl").read_text().splitlines()]
    assert {r["shape"] for r in rows} == {"11x13"}
    assert json.loads((second / "tune_left.json").read_text())["left"] == []
    assert "3 of 3 cases done, 0 left" in capsys.readouterr().out


def test_all_ops_and_the_plan(tmp_path):
    import pytest
    import torch

    ops = mod.all_ops()
    assert ops[: len(mod.ORDER)] == mod.ORDER and {"conv2d", "rope", "linear_cross_entropy"} <= set(ops)
    plan = mod.planned_cases(["attention"], [None], [torch.bfloat16], ["fwd", "fwdbwd"])
    assert len(plan) == len(set(plan)) and {c[4] for c in plan} == {"causal=False", "causal=True"}
    assert ("attention", "bf16", "fwdbwd", "4x32x2048x80", "causal=True") in plan
    for bad in (["--resume", str(tmp_path / "missing.jsonl")], ["--dtypes", "fp8"]):
        with pytest.raises(SystemExit):  # (refused before any timing: one tiny case if not)
            mod.main(["--out", str(tmp_path), "--ops", "add", "--phases", "tune", "--shapes", "3", *bad])
