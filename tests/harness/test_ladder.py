"""``kernellab ladder``: rungs from the registry, numbers from rows (synthetic rows in a temporary
results folder; one test on the committed rows), the text / markdown / JSON / plot outputs and
the command's exit codes and errors."""

from __future__ import annotations

import json

import pytest

from kernellab import cli, register, unregister
from kernellab.harness import ladder

GPU = "NVIDIA Test GPU"


def _row(backend, ms, op="softmax", shape="4096x4096", dtype="fp32", mode="fwd", sha="aaaaaaa",
         time="2026-11-20T10:00:00+00:00", **kw):  # fmt: skip
    r = dict(op=op, backend=backend, mode=mode, shape=shape, dtype=dtype, median_ms=ms, gbps=1000.0 / ms,
             tflops=1.0 / ms, pct_peak=30.0 / ms, gpu=GPU, git_sha=sha, time=time, status="ok", graph=False,
             metric="gbps")  # fmt: skip
    r.update(kw)
    return r


def _write(tmp_path, rows, name="rows.jsonl"):
    d = tmp_path / "results"
    (d / "sub").mkdir(parents=True, exist_ok=True)
    (d / "sub" / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def _softmax_rows():
    return [
        _row("cuda_v1", 8.0),
        # cuda_v2: no row -> "not measured"
        _row("cuda_v3", 4.0, time="2026-11-19T00:00:00+00:00"),  # older: the newer row below wins
        _row("cuda_v3", 2.0),
        _row("cuda", 1.0),  # softmax's cuda is its v4
        _row("torch", 1.5),
        _row("liger", 1.25),
        _row("default", 1.0),  # a choice, not a reference
        _row("manual", 20.0),  # the naive baseline, not a reference
        _row("cuda_v1", 0.01, graph=True),  # CUDA-graph rows are another measurement: left out
        dict(bench="host_cost", op="softmax", backend="cuda_v2", mode="fwd", shape="4096x4096", dtype="fp32"),
    ]


def _lines(lad):
    return {ln.label: ln for ln in lad.lines}


def test_rungs_come_from_the_registry_in_order():
    mm = ladder.rungs("matmul")["cuda"]
    assert [r.backend for r in mm] == [f"cuda_v{n}" for n in range(1, 16)]  # v10 after v9, not after v1
    assert mm[0].change and not mm[0].change.lower().startswith("cuda v1")  # the label is stripped
    assert mm[0].dtypes == ("fp32",) and mm[9].dtypes == ("fp16", "bf16")
    sm = ladder.rungs("softmax")["cuda"]
    assert [r.label for r in sm] == ["cuda_v1", "cuda_v2", "cuda_v3", "cuda (v4)"]
    # sum's `cuda` is "CUDA best (v4)": the same step as cuda_v4, a reference, not a rung of its own
    assert [r.backend for r in ladder.rungs("sum")["cuda"]] == ["cuda_v1", "cuda_v2", "cuda_v3", "cuda_v4"]
    assert {"matmul", "softmax", "sum", "conv2d"} <= set(ladder.ladder_ops())
    assert "argmax" not in ladder.ladder_ops()  # one numbered variant is not a ladder
    assert "attention" in ladder.ladder_ops()  # cuda_v1 .. cuda_v5


def test_a_new_family_is_a_ladder_of_its_own():
    for n in (2, 1, 10):
        register("sum", f"numba_v{n}", description=f"Numba v{n}: step {n}")(lambda x, dim=None: x.sum(dim))
    try:
        fam = ladder.rungs("sum")["numba"]
        assert [r.backend for r in fam] == ["numba_v1", "numba_v2", "numba_v10"]
        assert [r.change for r in fam] == ["step 1", "step 2", "step 10"]
        rows = [_row("numba_v1", 4.0, op="sum", shape="1024"), _row("numba_v10", 1.0, op="sum", shape="1024")]
        (lad,) = [x for x in ladder.build("sum", rows) if x.family == "numba"]
        got = _lines(lad)
        assert got["numba_v2"].status == "not measured"
        assert got["numba_v10"].vs_prev == pytest.approx(4.0) and got["numba_v10"].prev == "numba_v1"
    finally:
        for n in (1, 2, 10):
            unregister("sum", f"numba_v{n}")


def test_table_order_gains_and_not_measured(tmp_path):
    rows, files = ladder.load([_write(tmp_path, _softmax_rows())])
    assert len(files) == 1 and len(rows) == 8  # the graph and host-cost rows are not timing rows
    (lad,) = [lad for lad in ladder.build("softmax", rows) if lad.family == "cuda"]
    assert lad.key == (GPU, "4096x4096", "fp32", "fwd", "", False)
    assert [(ln.label, ln.kind) for ln in lad.lines] == [
        ("cuda_v1", "rung"), ("cuda_v2", "rung"), ("cuda_v3", "rung"), ("cuda (v4)", "rung"),
        ("torch", "reference"), ("liger", "reference"),
    ]  # fmt: skip
    got = _lines(lad)
    assert got["cuda_v2"].status == "not measured" and got["cuda_v2"].median_ms is None
    assert got["cuda_v3"].median_ms == 2.0  # the newest row
    assert got["cuda_v3"].vs_prev == pytest.approx(4.0) and got["cuda_v3"].prev == "cuda_v1"
    assert got["cuda (v4)"].vs_prev == pytest.approx(2.0) and got["cuda (v4)"].vs_base == pytest.approx(8.0)
    assert got["torch"].vs_base == pytest.approx(8.0 / 1.5)
    assert lad.base == "cuda_v1" and lad.metric == "gbps"
    assert not any("mixed rows" in n for n in lad.notes)  # one commit, one day
    text = ladder.to_text([lad])
    assert "not measured" in text and "4.00x (vs cuda_v1)" in text and "GB/s" in text
    assert "cuda (v4)'s speed over torch 1.50x, liger 1.25x" in text
    assert text.index("cuda_v1") < text.index("cuda_v2") < text.index("cuda_v3") < text.index("references:")


def test_mixed_commits_and_days_are_flagged():
    rows = [_row("cuda_v1", 8.0), _row("cuda_v2", 4.0, sha="bbbbbbb", time="2026-11-21T10:00:00+00:00"),
            _row("cuda_v3", 2.0)]  # fmt: skip
    (lad,) = [lad for lad in ladder.build("softmax", rows) if lad.family == "cuda"]
    (note,) = [n for n in lad.notes if "mixed rows" in n]
    assert "2 commit(s), 2 day(s)" in note and "bbbbbbb (2026-11-21): cuda_v2" in note
    assert "aaaaaaa (2026-11-20): cuda_v1, cuda_v3" in note
    assert "mixed rows" in ladder.to_markdown([lad])


def test_key_choice_and_filters():
    rows = [_row("cuda_v1", 8.0, shape="64x64"), _row("cuda_v2", 4.0, shape="64x64")]
    rows += [
        _row("cuda_v1", 9.0, shape="8x8"),
        _row("cuda_v2", 3.0, shape="8x8"),
        _row("cuda_v3", 2.0, shape="8x8"),
    ]
    rows.append(_row("cuda_v1", 7.0, shape="8x8", dtype="bf16", gpu="Other GPU"))
    (lad,) = [lad for lad in ladder.build("softmax", rows) if lad.family == "cuda"]
    assert lad.key[1] == "8x8" and lad.key[2] == "fp32"  # the key where the most rungs were measured
    def cuda(**kw):
        return [lad for lad in ladder.build("softmax", rows, **kw) if lad.family == "cuda"]

    (lad,) = cuda(shape="64x64")
    assert lad.key[1] == "64x64" and _lines(lad)["cuda_v3"].status == "not measured"
    (lad,) = cuda(dtype="bfloat16", gpu="other")
    assert lad.key == ("Other GPU", "8x8", "bf16", "fwd", "", False)
    (lad,) = cuda(mode="fwdbwd")  # nothing there: every rung "not measured"
    assert lad.key is None and all(ln.status == "not measured" for ln in lad.lines)
    with pytest.raises(ValueError, match="--dtype"):
        ladder.build("softmax", rows, dtype="fp33")
    # as many rungs at two keys: the one whose rungs come from one commit, before the one with
    # more references or the later key
    rows = [_row("cuda_v1", 8.0, shape="8x8"), _row("cuda_v2", 4.0, shape="8x8", sha="bbbbbbb")]
    rows += [_row("torch", 1.0, shape="8x8"), _row("triton", 1.0, shape="8x8")]
    rows += [
        _row("cuda_v1", 9.0, shape="64x64", time="2026-11-20T09:00:00+00:00"),
        _row("cuda_v2", 3.0, shape="64x64"),
    ]
    (lad,) = [lad for lad in ladder.build("softmax", rows) if lad.family == "cuda"]
    assert lad.key[1] == "64x64" and not any("mixed rows" in n for n in lad.notes)


def test_rungs_of_other_dtypes_get_their_own_table():
    rows = [
        _row(f"cuda_v{n}", 10.0 / n, op="matmul", shape="512x512x512", metric="tflops") for n in range(1, 8)
    ]
    rows += [_row(f"cuda_v{n}", 1.0 / n, op="matmul", shape="512x512x512", dtype="bf16", metric="tflops")
             for n in (8, 10)]  # fmt: skip
    rows.append(_row("torch", 0.05, op="matmul", shape="512x512x512", dtype="bf16", metric="tflops"))
    fp32, bf16 = ladder.build("matmul", rows)
    assert fp32.key[2] == "fp32" and [ln.label for ln in fp32.lines] == [f"cuda_v{n}" for n in range(1, 8)]
    assert fp32.not_for_dtype == [
        "cuda_v8 (fp16/bf16 only)",
        "cuda_v9 (fp16/bf16 only)",
        "cuda_v10 (fp16/bf16 only)",
        "cuda_v11 (fp16/bf16 only)",
        "cuda_v12 (fp16/bf16 only)",
        "cuda_v13 (fp16/bf16 only)",
        "cuda_v14 (fp16/bf16 only)",
        "cuda_v15 (fp16/bf16 only)",
    ]
    assert "TF32 off" in fp32.title and fp32.metric == "tflops"
    assert [(ln.label, ln.status) for ln in bf16.lines] == [
        ("cuda_v8", "ok"), ("cuda_v9", "not measured"), ("cuda_v10", "ok"), ("cuda_v11", "not measured"),
        ("cuda_v12", "not measured"), ("cuda_v13", "not measured"), ("cuda_v14", "not measured"),
        ("cuda_v15", "not measured"), ("torch", "ok"),
    ]  # fmt: skip
    assert bf16.base == "cuda_v8" and _lines(bf16)["cuda_v10"].vs_base == pytest.approx(10 / 8)
    assert "TFLOP/s" in ladder.to_text([bf16]) and "vs cuda_v8" in ladder.to_text([bf16])


def test_a_rejected_row_prints_no_number():
    bad = _row("cuda_v2", 1.0, status="rejected", reason="wrong output in timed run")
    bad.update(median_ms=None, gbps=None, tflops=None, pct_peak=None)  # as the harness writes it
    rows = [_row("cuda_v1", 8.0), bad]
    (lad,) = [lad for lad in ladder.build("softmax", rows) if lad.family == "cuda"]
    v2 = _lines(lad)["cuda_v2"]
    assert v2.status == "rejected: wrong output in timed run" and v2.median_ms is None and v2.vs_prev is None


def test_markdown_json_and_plot(tmp_path):
    rows, _ = ladder.load([_write(tmp_path, _softmax_rows())])
    lads = ladder.build("softmax", rows)
    md = ladder.to_markdown(lads)
    assert md.startswith("### softmax, cuda ladder: 4096x4096 fp32 fwd, NVIDIA Test GPU")
    assert "| rung | change | ms | GB/s | % peak | vs prev | vs cuda_v1 | row (commit, day) |" in md
    assert "| cuda_v2 | " in md and "| not measured |" in md and "| *references* |" in md
    data = json.loads(ladder.to_json(lads))
    assert data[0]["key"]["shape"] == "4096x4096" and data[0]["lines"][1]["status"] == "not measured"
    for by in ("peak", "time"):
        out = ladder.plot(lads, tmp_path / f"plots/ladder-{by}.png", by=by)
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5000
    with pytest.raises(ValueError, match="--plot-by"):
        ladder.plot(lads, tmp_path / "x.png", by="speed")


def test_cli_exit_codes_and_errors(tmp_path, capsys):
    d = str(_write(tmp_path, _softmax_rows()))
    png = tmp_path / "s.png"
    assert cli.main(["ladder", "softmax", "--results", d, "--plot", str(png)]) == 0
    out = capsys.readouterr()
    assert "softmax, cuda ladder" in out.out and "not measured" in out.out and png.stat().st_size > 5000
    assert cli.main(["ladder", "softmax", "--results", d, "--markdown"]) == 0
    assert capsys.readouterr().out.startswith("### softmax")
    assert cli.main(["ladder", "softmax", "--results", d, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["op"] == "softmax"
    # no rung of this op has a row: the table still prints, every rung "not measured"; exit 1
    assert cli.main(["ladder", "sum", "--results", d]) == 1
    assert capsys.readouterr().out.count("not measured") == 4
    assert cli.main(["ladder", "--all", "--results", d, "--markdown"]) == 0  # softmax has rows
    page = capsys.readouterr().out
    assert page.startswith("# Ladders") and "## softmax" in page and "## matmul" in page

    assert cli.main(["ladder", "nosuchop", "--results", d]) == 2
    err = capsys.readouterr().err
    assert "op: unknown op 'nosuchop'" in err and "matmul" in err and "softmax" in err
    assert cli.main(["ladder", "argmax", "--results", d]) == 2
    err = capsys.readouterr().err
    assert "op: 'argmax' has no ladder" in err and "cuda_v1" in err and "matmul" in err
    assert cli.main(["ladder", "--results", d]) == 2
    assert "name one op, or --all" in capsys.readouterr().err
    assert cli.main(["ladder", "softmax", "--results", str(tmp_path / "missing")]) == 2
    assert "--results: no such file or folder" in capsys.readouterr().err
    assert cli.main(["ladder", "softmax", "--results", d, "--dtype", "fp33"]) == 2
    assert "--dtype" in capsys.readouterr().err


def test_committed_matmul_rows_print_every_rung():
    """The committed rows hold matmul's whole ladder: v1-v7 in fp32 at 4096^3 (TF32 off) and
    v8-v10 in bf16 on an H100, v10-v15 in bf16 on an H200 (lab/gpu_mm_v11.py, and
    lab/gpu_mm_v14.py's row-major products for v13-v15); each of them is printed with a
    measured time."""
    text, rc = ladder.command("matmul")
    assert rc == 0
    lads = ladder.build("matmul", ladder.load()[0])
    measured = {ln.backend for lad in lads for ln in lad.lines if ln.kind == "rung" and ln.status == "ok"}
    assert measured == {f"cuda_v{n}" for n in range(1, 16)}
    h200 = next(lad for lad in lads if lad.key[2] == "bf16" and "H200" in lad.key[0])
    ok = {ln.backend for ln in h200.lines if ln.kind == "rung" and ln.status == "ok"}
    assert {"cuda_v14", "cuda_v15"} <= ok
    fp32 = next(lad for lad in lads if lad.key[2] == "fp32")
    assert fp32.key[1] == "4096x4096x4096" and not fp32.key[5]  # TF32 off
    v7 = _lines(fp32)["cuda_v7"]
    assert v7.vs_base > 50 and "torch" in _lines(fp32)  # the top rung beside cuBLAS
    for n in range(1, 11):
        assert f"cuda_v{n} " in text
