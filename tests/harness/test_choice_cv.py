"""harness.choice_cv: each table row left out in turn, the default's choice made from the
others and scored by the row's own times."""

from __future__ import annotations

import json
import math

import pytest

from kernellab.core import tables
from kernellab.harness import choice_cv


def _row(n, times, best=None):
    return {"op": "toy", "dtype": "fp32", "mode": "fwd", "options": "", "key": [n], "shape": [n],
            "times": times, "best": best or min(times, key=times.get)}  # fmt: skip


def _cands(usable=("a", "b")):
    return lambda op, key: (frozenset(usable), "a", None, (), ())


def test_each_row_is_judged_by_the_rows_left():
    rows = [
        _row(1024, {"a": 1.0, "b": 2.0}),
        _row(2048, {"a": 2.0, "b": 3.0}),
        _row(4096, {"a": 5.0, "b": 4.0}),  # b wins here, but its nearest row says a
    ]
    res = choice_cv.cross_validate(rows, _cands())
    assert [r["pick"] for r in res] == ["a", "a", "a"]
    assert [r["fastest"] for r in res] == ["a", "a", "b"]
    assert [r["ratio"] for r in res] == [1.0, 1.0, 1.25]
    assert "nearest row [2048]" in res[2]["why"]
    s = choice_cv.summarize(res)
    assert s["all"] == {"rows": 3, "scored": 3, "hits": 2, "geomean": pytest.approx(1.25 ** (1 / 3)),
                        "worst": 1.25}  # fmt: skip
    assert s["groups"][("toy", "fp32", "fwd")]["hits"] == 2
    # a looser hit threshold counts the 1.25x pick too
    assert choice_cv.summarize(res, within=0.3)["all"]["hits"] == 3


def test_a_pick_the_row_did_not_time_is_unscored():
    rows = [_row(1024, {"a": 1.0, "c": 0.5}), _row(2048, {"b": 1.0, "c": 2.0})]
    res = choice_cv.cross_validate(rows, _cands(("a", "b", "c")))
    # row 0 out: the row of 2048 says b, which row 0 never timed
    assert res[0]["pick"] == "b" and res[0]["ratio"] is None
    s = choice_cv.summarize(res)["all"]
    assert s["rows"] == 2 and s["scored"] == 1 and s["worst"] == 2.0


def test_a_row_of_one_backend_is_neither_scored_nor_a_neighbour():
    """A verify run's row (one backend timed) compares nothing: it is not scored, and the
    row that compares backends speaks for its neighbours instead of it."""
    rows = [_row(1024, {"a": 1.0}), _row(2048, {"a": 2.0, "b": 1.0}), _row(8192, {"a": 8.0, "b": 4.0})]
    res = choice_cv.cross_validate(rows, _cands())
    assert [r["shape"] for r in res] == [[2048], [8192]]
    assert res[0]["pick"] == "b" and "nearest row [8192]" in res[0]["why"]


def test_device_time_decides_where_the_rows_kernels_are_long():
    long = {"a": 1.0, "b": 0.9}  # effective times: b ahead; device times: a ahead
    rows = [
        {**_row(1024, long, "a"), "device": {"a": 0.5, "b": 0.8}},
        {**_row(2048, long, "a"), "device": {"a": 0.5, "b": 0.8}},
    ]
    res = choice_cv.cross_validate(rows, _cands())
    assert all(r["pick"] == "a" and r["fastest"] == "a" and r["ratio"] == 1.0 for r in res)
    loop = choice_cv.cross_validate(rows, _cands(), by="loop")
    assert all(r["pick"] == "b" and r["ratio"] == 1.0 for r in loop)


@pytest.mark.parametrize("gpu", [g for g in tables.table_gpus() if g.startswith("NVIDIA H")])
def test_committed_tables(gpu, capsys):
    rows = tables.read_table(tables.table_path(gpu))["rows"]
    assert choice_cv.main(["--gpu", gpu, "--json"]) == 0
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    # every row that compares backends is scored; a row of one backend alone is not
    assert len(out) == sum(len(r["times"]) > 1 for r in rows) and {r["gpu"] for r in out} == {gpu}
    scored = [r["ratio"] for r in out if r["ratio"] is not None]
    # most picks are timed by their row, and no pick beats the row's fastest
    assert len(scored) > 0.9 * len(rows) and min(scored) >= 1.0
    assert choice_cv.main(["--gpu", gpu, "--worst", "2"]) == 0
    text = capsys.readouterr().out
    s = choice_cv.summarize(out)["all"]
    assert f"at {s['hits']} of {s['scored']} scored rows" in text
    assert text.count("x ") >= 2 and f"worst {s['worst']:.2f}" in text
    assert math.isfinite(s["geomean"])


def test_bad_arguments_name_the_argument(capsys):
    with pytest.raises(SystemExit) as e:
        choice_cv.main(["--gpu", "NVIDIA Z9"])
    assert e.value.code == 2 and "--gpu: no table for 'NVIDIA Z9'" in capsys.readouterr().err
    for bad in ("-1", "nan", "inf", "-inf"):  # (nan: no pick is ever a hit; inf: every pick is)
        with pytest.raises(SystemExit) as e:
            choice_cv.main([f"--within={bad}"])
        assert e.value.code == 2 and "--within must be a finite number >= 0" in capsys.readouterr().err, bad
    with pytest.raises(SystemExit) as e:
        choice_cv.main(["--worst", "-1"])
    assert e.value.code == 2 and "--worst must be >= 0" in capsys.readouterr().err


def test_explain_says_how_the_choice_did_where_no_row_is(tmp_path, monkeypatch, capsys):
    """`kernellab explain` prints choice_cv's line for the call's op, dtype and mode: the
    rows of that group left out in turn; rows of other modes still speak as neighbours but
    are not scored."""
    from kernellab.cli import main
    from kernellab.core import registry

    monkeypatch.setenv("KERNELLAB_TABLES", str(tmp_path))
    rows = [
        _row(4096, {"torch": 1.0, "manual": 2.0}),
        _row(8192, {"torch": 2.0, "manual": 3.0}),
        _row(16384, {"torch": 5.0, "manual": 4.0}),  # manual wins; its nearest row says torch
        {**_row(16384, {"torch": 1.0, "manual": 2.0}), "mode": "fwdbwd"},
    ]
    rows = [{**r, "op": "gelu"} for r in rows]
    (tmp_path / f"{tables.gpu_slug('cpu')}.json").write_text(json.dumps({"gpu": "cpu", "rows": rows}))
    tables.clear()
    registry.clear_cache()
    try:
        line = choice_cv.group_line(rows, "gelu", "fp32", "fwd", "", device="cpu")
        assert "each of this table's 3 gelu fp32 fwd rows" in line and "at 2 of 3" in line
        assert "worst 1.25" in line
        assert choice_cv.group_line(rows, "gelu", "bf16", "fwd", "", device="cpu") is None
        assert main(["explain", "gelu", "-s", "5000", "--device", "cpu", "--dtype", "fp32"]) == 0
        assert line in capsys.readouterr().out
    finally:
        tables.clear()
        registry.clear_cache()


def test_readme_states_the_committed_tables_scores():
    """The README's leave-one-out figures are those of the committed tables (a table
    re-tuned without the README following fails here)."""
    import pathlib
    import re

    readme = (pathlib.Path(__file__).resolve().parents[2] / "README.md").read_text()
    pattern = (r"fastest at (\d+) of (\d+) H100 rows that compare backends \(\d+%\) "
               r"and (\d+) of (\d+) H200 rows")
    said = re.search(pattern, re.sub(r"\s+", " ", readme))
    assert said, "README: the choice_cv sentence moved or changed its wording"
    got = []
    for gpu in ("NVIDIA H100 80GB HBM3", "NVIDIA H200"):
        rows = tables.read_table(tables.table_path(gpu))["rows"]
        s = choice_cv.summarize(choice_cv.cross_validate(rows, choice_cv.registry_candidates))["all"]
        got += [s["hits"], s["scored"]]
    assert [int(x) for x in said.groups()] == got
