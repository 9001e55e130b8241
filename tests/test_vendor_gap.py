"""The vendor-gap measure (harness/vendor_gap.py): its summary and its case list."""

import pytest

import kernellab  # noqa: F401  (registers the ops)
from kernellab.core.spec import get_spec
from kernellab.harness import vendor_gap


def _row(backend, ms, shape="1x4096x4096", status="ok"):
    return {"op": "matmul", "shape": shape, "dtype": "bf16", "mode": "fwd", "options": "", "backend": backend,
            "median_ms": ms, "status": status}  # fmt: skip


def test_summary_ratios_and_counts():
    a, b, c = "1x4096x4096", "2x2x2", "3x3x3"
    rows = [_row("torch", 1.0, a), _row("triton", 0.8, a), _row("cuda", 1.2, a), _row("default", 0.82, a)]
    rows += [_row("torch", 1.0, b), _row("triton", 2.0, b), _row("default", 1.0, b)]
    rows += [_row("torch", 1.0, c), _row("triton", 1.05, c), _row("default", 1.2, c)]
    rows += [_row("triton", 0.1, c, status="rejected")]  # a rejected backend does not count
    lines, totals = vendor_gap.summarize(rows)
    by = {ln["shape"]: ln for ln in lines}
    assert by[a]["own"] == "triton" and by[a]["own_vs_vendor"] == 1.25
    assert by[a]["best"] == "triton" and by[a]["default_vs_best"] == pytest.approx(0.976, abs=1e-3)
    assert by[b]["own_vs_vendor"] == 0.5 and by[b]["default_vs_best"] == 1.0
    assert by[c]["own_vs_vendor"] == pytest.approx(0.952, abs=1e-3)
    assert by[c]["default_vs_best"] == pytest.approx(0.833, abs=1e-3)
    assert totals["own_cases"] == 3 and totals["own_at_least_vendor"] == 1 and totals["own_below_0.9"] == 1
    assert totals["default_cases"] == 3 and totals["default_within_3pct"] == 2
    text = vendor_gap.format_lines(lines, totals)
    assert "own >= vendor: 1/3" in text and "within 3% of the best: 2/3" in text


def test_summary_without_vendor_or_default():
    lines, totals = vendor_gap.summarize([_row("triton", 1.0), _row("cuda", 0.5)])
    assert "own_vs_vendor" not in lines[0] and "default_vs_best" not in lines[0]
    assert totals["own_cases"] == 0 and totals["own_geomean"] is None


def _case_id(c):
    return f"{c[0]}-{'x'.join(map(str, c[1]))}-{c[2]}-{c[3]}"


@pytest.mark.parametrize("case", vendor_gap.CASES, ids=_case_id)
def test_cases_are_valid(case):
    """Each case names an op, a mode it times and a shape its spec reads; its options are
    ones the op's bench or check already runs (a typo would time the wrong problem)."""
    op, shape, dtype, mode, opts = case
    spec = get_spec(op)
    assert mode in spec.modes and dtype in ("fp32", "fp16", "bf16")
    assert spec.flops(shape, mode, **opts) > 0
    known = {k for o in spec.bench_options + spec.option_sets for k in o}
    assert set(opts) <= known


def test_main_refuses_without_gpu():
    with pytest.raises(SystemExit, match="no CUDA device"):
        vendor_gap.main(["--ops", "matmul"])


def test_latest_rows_take_each_case_from_its_last_run(tmp_path, capsys):
    import json

    old = [_row("torch", 1.0, "a"), _row("triton", 2.0, "a"), _row("default", 2.0, "a")]
    old.append(_row("torch", 1.0, "b"))
    new = [_row("torch", 1.0, "a"), _row("triton", 0.5, "a"), _row("default", 0.5, "a")]
    got = vendor_gap.latest_rows([old, new])
    assert [(r["shape"], r["backend"], r["median_ms"]) for r in got] == [
        ("b", "torch", 1.0), ("a", "torch", 1.0), ("a", "triton", 0.5), ("a", "default", 0.5)
    ]  # fmt: skip
    files = []
    for i, rows in enumerate((old, new)):
        files.append(tmp_path / f"run{i}.jsonl")
        files[-1].write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    assert vendor_gap.main(["--summarize", *map(str, files), "--out", str(out)]) == 0
    text = (out / "vendor_gap-summary.txt").read_text()
    assert text.startswith("from run0.jsonl, run1.jsonl") and "own >= vendor: 1/1" in text
    assert "own >= vendor: 1/1" in capsys.readouterr().out


def test_default_judged_by_call_time_too():
    """A peer whose host cost exceeds its kernel wins by device time and loses every eager
    call: by call time (the larger of device and loop time) the default that avoided it is
    the best; a default slower by call time is a miss there too."""
    rows = [
        {**_row("liger", 0.018, "a"), "effective_ms": 0.074},
        {**_row("triton", 0.022, "a"), "effective_ms": 0.027},
        {**_row("default", 0.022, "a"), "effective_ms": 0.026},
        {**_row("torch", 0.020, "b"), "effective_ms": 0.020},
        {**_row("triton", 0.019, "b"), "effective_ms": 0.030},
        {**_row("default", 0.019, "b"), "effective_ms": 0.030},
    ]
    lines, totals = vendor_gap.summarize(rows)
    by = {ln["shape"]: ln for ln in lines}
    assert by["a"]["default_vs_best"] == pytest.approx(0.818, abs=1e-3) and by["a"]["best"] == "liger"
    assert by["a"]["default_vs_best_call"] == pytest.approx(1.038, abs=1e-3)
    assert by["a"]["best_call"] == "triton"
    assert by["b"]["default_vs_best"] == 1.0
    assert by["b"]["default_vs_best_call"] == pytest.approx(0.667, abs=1e-3)
    assert totals["default_within_3pct"] == 1 and totals["default_within_3pct_call"] == 1
    assert "1/2 by device time, 1/2 by call time" in vendor_gap.format_lines(lines, totals)


def test_rows_say_what_the_default_ran():
    import torch

    got = vendor_gap._resolved("softmax", (64, 256), torch.float32, "fwd", {})
    assert set(got) == {
        "resolved",
        "resolved_why",
        "resolved_by_device",
        "resolved_by_loop",
        "resolved_by_queued",
    }
    assert got["resolved"]
    rows = [_row("torch", 1.0, "a"), _row("triton", 0.9, "a")]
    rows.append({**_row("default", 0.9, "a"), "resolved": "triton"})
    (line,), _ = vendor_gap.summarize(rows)
    assert line["default_is"] == "triton"
    assert "triton" in vendor_gap.format_lines(*vendor_gap.summarize(rows)).splitlines()[1].split()[-3:]


def test_select_by_op_and_shape():
    """``--only`` picks cases by their shape as the rows write it; ``--ops`` by op; both at once."""
    got = vendor_gap.select(vendor_gap.CASES, None, ["8192x50257x768", "2000x3000"])
    assert [c[:2] for c in got] == [("matmul", (8192, 50257, 768))] + [
        (op, (2000, 3000)) for op, shape, *_ in vendor_gap.CASES if shape == (2000, 3000)
    ]
    assert vendor_gap.select(vendor_gap.CASES, ["rms_norm"], ["2000x3000"]) == [
        c for c in vendor_gap.CASES if c[:2] == ("rms_norm", (2000, 3000))
    ]
    assert (
        vendor_gap.select(vendor_gap.CASES) == vendor_gap.CASES
        and [c[0] for c in vendor_gap.select(vendor_gap.CASES, ["linear_cross_entropy", "matmul"])][:3]
        == ["linear_cross_entropy", "linear_cross_entropy", "matmul"]
        and vendor_gap.select(vendor_gap.CASES, ["matmul"], ["1x1"]) == []
    )


def _trow(shape, device, times=None, **extra):
    return {"op": "matmul", "dtype": "bf16", "mode": "fwd", "options": "", "key": list(shape),
            "shape": list(shape), "device": device, "times": times or device,
            "best": min(device, key=device.get), **extra}  # fmt: skip


def test_table_rows_score_ours_against_the_vendors():
    table = {"rows": [
        _trow((64, 64, 64), {"torch": 1.0, "triton": 0.8, "cuda": 1.25}),  # ours 1.25x
        _trow((128, 64, 64), {"torch": 1.0, "triton": 1.25}, {"torch": 2.0, "triton": 1.3}),  # 0.8x by device
        _trow((256, 64, 64), {"torch": 1.0, "triton": 0.5}, from_verify=True),  # left out
        # no device times
        {k: v for k, v in _trow((512, 64, 64), {"torch": 1.0, "triton": 0.5}).items() if k != "device"},
    ]}  # fmt: skip
    rows = vendor_gap.table_rows(table)
    assert {r["shape"] for r in rows} == {"64x64x64", "128x64x64"}
    torch_row = next(r for r in rows if r["shape"] == "128x64x64" and r["backend"] == "torch")
    assert torch_row["effective_ms"] == 2.0
    lines, totals = vendor_gap.summarize(rows)
    assert totals["own_cases"] == 2 and totals["own_at_least_vendor"] == 1 and totals["own_below_0.9"] == 1
    per_op = vendor_gap.op_totals(lines)
    assert per_op == {"matmul": {"cases": 2, "own_at_least_vendor": 1, "own_below_0.9": 1,
                                 "own_geomean": 1.0, "worst": 0.8}}  # fmt: skip


def test_unscored_family_shapes_are_those_no_scored_line_covers(monkeypatch):
    from kernellab.core import shapes

    monkeypatch.setattr(shapes, "FAMILIES", {
        "a": {"matmul": [(64, 64, 64), (128, 64, 64)], "gelu": [(1024,)]},
        "b": {"matmul": [(64, 64, 64), (256, 64, 64)]},
        "heldout": {"matmul": [(512, 64, 64)]},  # not a model-family bar
    })  # fmt: skip
    assert vendor_gap.family_shapes() == {"matmul": ["64x64x64", "128x64x64", "256x64x64"], "gelu": ["1024"]}
    table = {"rows": [
        _trow((64, 64, 64), {"torch": 1.0, "triton": 0.8}),
        _trow((128, 64, 64), {"torch": 1.0}),  # no kernel of ours timed: not scored
    ]}  # fmt: skip
    lines, _ = vendor_gap.summarize(vendor_gap.table_rows(table))
    want = {"matmul": ["128x64x64", "256x64x64"], "gelu": ["1024"]}
    assert vendor_gap.unscored_family_shapes(lines) == want
    unscored = vendor_gap.unscored_family_shapes(lines, ops=["matmul"])
    assert unscored == {"matmul": ["128x64x64", "256x64x64"]}


def test_table_report_over_the_committed_tables(capsys):
    from kernellab.core import tables

    gpus = [g for g in tables.table_gpus() if g.startswith("NVIDIA H")]
    assert vendor_gap.main(["--table", *gpus, "--ops", "attention", "matmul"]) == 0
    out = capsys.readouterr().out
    for gpu in gpus:
        assert f"{gpu} (" in out and "model-family cases" in out
    assert "  attention " in out and "  matmul " in out and "  softmax " not in out
    with pytest.raises(SystemExit, match="--table: no table for 'NVIDIA Z9'"):
        vendor_gap.main(["--table", "NVIDIA Z9"])
