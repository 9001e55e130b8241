"""``kernellab report --html``: the page's numbers from rows, its pictures, and the page as a
browser loads it (headless Chromium: no console message, every picture loaded).

CI installs Debian's chromium and sets KERNELLAB_REQUIRE_BROWSER=1, so there the browser
tests fail rather than skip when no browser is found."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from kernellab import cli
from kernellab.harness import report


def _bench(op, backend, ms, shape="1024x1024", dtype="bf16", mode="fwd", **kw):
    row = dict(op=op, backend=backend, mode=mode, shape=shape, dtype=dtype, median_ms=ms, gpu="GPU X",
               bytes=4 << 20, flops=8 << 20, tflops=8 / ms / 1e3, peak_copy_gbps=3000.0, pct_flops=1.0)  # fmt: skip
    row.update(kw)
    return row


def _files(tmp_path):
    bench = [
        _bench("softmax", "torch", 2.0), _bench("softmax", "triton", 1.0), _bench("softmax", "default", 1.6),
        _bench("softmax", "cuda_v1", 8.0), _bench("softmax", "cuda_v2", 4.0), _bench("softmax", "cuda_v3", 5.0),
        _bench("matmul", "torch", 1.0, shape="64x64x64"), _bench("matmul", "triton", 2.0, shape="64x64x64"),
        _bench("matmul", "manual", 0.5, shape="64x64x64"),  # manual is neither ours nor a vendor's
    ]  # fmt: skip
    models = [dict(model="hf-llama", variant=v, mode="eager", batch=2, seq=2048, ms=ms, peak_gib=g, tokens_per_s=1)
              for v, ms, g in (("hf", 90.0, 21.0), ("kernellab", 75.0, 12.7), ("liger", 105.0, 13.7))]  # fmt: skip
    host = [dict(bench="host_cost", op="rms_norm", backend="default", mode="fwd", vs_torch=1.2)]
    check = [dict(op="softmax", backend="triton", status="pass"), dict(op="softmax", backend="torch", status="fail")]
    paths = []
    for name, rows in (("bench.jsonl", bench), ("models.jsonl", models), ("host.jsonl", host)):
        p = tmp_path / name
        p.write_text("".join(json.dumps(r) + "\n" for r in rows))
        paths.append(p)
    p = tmp_path / "check.json"
    p.write_text(json.dumps(check))
    return paths + [p]


def test_model_groups_keep_each_variants_last_row():
    row = lambda v, ms, mode="compile": dict(model="hf-vit", variant=v, mode=mode, batch=64, seq=197, ms=ms)  # noqa: E731
    rows = [row("hf", 32.4), row("kernellab", 32.5), row("hf", 32.7), row("kernellab", 19.6), row("hf", 21.4, "eager")]
    groups = report.model_groups(rows)
    assert list(groups) == [("hf-vit", "compile", 64, 197)]  # the eager key has one variant
    assert [(r["variant"], r["ms"]) for r in groups[("hf-vit", "compile", 64, 197)]] == [("hf", 32.7), ("kernellab", 19.6)]


def test_speedups_and_ladders_from_rows(tmp_path):
    kinds = report.load(_files(tmp_path))
    assert [len(kinds[k]) for k in ("bench", "models", "host", "check")] == [9, 3, 1, 2]
    sp = report.speedups(kinds["bench"])
    # softmax: best own kernel 1.0 ms (triton) vs torch 2.0 -> 2x; the default 1.6 ms -> 1.25x
    assert sp["softmax"] == [("1024x1024 bf16 fwd", 2.0, 1.25)]
    # matmul: triton 2.0 vs torch 1.0 -> 0.5x; manual (0.5 ms) counts as neither
    assert sp["matmul"] == [("64x64x64 bf16 fwd", 0.5, None)]
    rows = report.case_rows(kinds["bench"])
    assert rows["softmax"] == [("1024x1024 bf16 fwd", "torch", "2.0000", "triton", "1.0000", "1.6000", "2.00x", "1.25x")]
    assert rows["matmul"] == [("64x64x64 bf16 fwd", "torch", "1.0000", "triton", "2.0000", "-", "0.50x", "-")]
    lad = report.ladders(kinds["bench"])["softmax"]
    assert [(rung, gain) for _, rung, _, gain in lad] == [("cuda_v1", None), ("cuda_v2", 2.0), ("cuda_v3", 0.8)]


def test_report_html_writes_page_and_pictures(tmp_path):
    page = report.build(_files(tmp_path), tmp_path / "out", title="T <1>")
    text = page.read_text()
    imgs = ["models.png", "roofline.png", "speedup-softmax.png", "speedup-matmul.png", "host_cost.png"]
    for img in imgs:
        assert f'src="{img}"' in text
        assert (tmp_path / "out" / img).stat().st_size > 1000
    assert "T &lt;1&gt;" in text  # escaped
    assert "<h2>Ladders</h2>" in text and "2.00x" in text
    assert "<h2>Check</h2>" in text
    assert "<summary>softmax: the numbers</summary>" in text and "<td>2.00x</td>" in text


def test_report_refuses_bad_rows(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"op": "softmax"}\nnot json\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not a JSON row"):
        report.load([bad])
    # a training step's row (a multi-GPU run's: op and backend, a list shape) is not a
    # kernel's: left out of the bench rows, and the page still builds
    step = tmp_path / "step.jsonl"
    step.write_text(json.dumps(dict(op="llama_train_cp", backend="kl-ring", mode="eager", shape=[1, 8192],
                                    dtype="bf16", median_ms=175.6)) + "\n"
                    + json.dumps(_bench("softmax", "torch", 2.0)) + "\n")  # fmt: skip
    assert [r["op"] for r in report.load([step])["bench"]] == ["softmax"]
    assert report.build([step], tmp_path / "s").exists()
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert cli.main(["report", "--html", str(tmp_path / "o"), str(empty)]) == 2
    assert "no result rows" in capsys.readouterr().err


def _chromium():
    found = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if found is None:
        if os.environ.get("KERNELLAB_REQUIRE_BROWSER") == "1":
            pytest.fail("KERNELLAB_REQUIRE_BROWSER=1 but no chromium on PATH")
        pytest.skip("no chromium on PATH (CI installs it)")
    return found


def _load_in_browser(page):
    """(body's data-status, console lines) of ``page`` loaded in headless Chromium."""
    cmd = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
           "--virtual-time-budget=5000", "--dump-dom", page.resolve().as_uri()]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    status = r.stdout.split('data-status="', 1)[1].split('"', 1)[0] if 'data-status="' in r.stdout else None
    return status, [line for line in r.stderr.splitlines() if ":CONSOLE" in line]


def test_report_page_loads_in_chromium(tmp_path):
    page = report.build(_files(tmp_path), tmp_path / "out")
    status, console = _load_in_browser(page)
    assert console == []
    assert status == "ok"


def test_browser_check_sees_a_missing_picture_and_a_script_error(tmp_path):
    page = report.build(_files(tmp_path), tmp_path / "out")
    (tmp_path / "out" / "roofline.png").unlink()
    page.write_text(page.read_text().replace("</body>", "<script>notDefined();</script></body>"))
    status, console = _load_in_browser(page)
    assert status == "missing: 1"
    assert any("roofline.png" in line for line in console)
    assert any("notDefined" in line for line in console)


def test_report_tables_section(tmp_path, capsys):
    """--tables: per GPU model's tuning table and op, ours against the vendors and the
    default with each row left out, as vendor_gap --table and choice_cv count them."""
    from kernellab.core import tables
    from kernellab.harness import choice_cv, vendor_gap

    gpu = "NVIDIA H200"
    assert gpu in tables.table_gpus()
    out = tmp_path / "out"
    assert cli.main(["report", "--html", str(out), "--tables", gpu, *map(str, _files(tmp_path))]) == 0
    text = (out / "index.html").read_text()
    assert "<h2>At the model-family shapes (tuning tables)</h2>" in text and f"<h3>{gpu}</h3>" in text
    rows = tables.read_table(tables.table_path(gpu))["rows"]
    own = vendor_gap.op_totals(vendor_gap.summarize(vendor_gap.table_rows({"rows": rows}))[0])["rope"]
    cv = choice_cv.summarize(choice_cv.cross_validate([r for r in rows if r["op"] == "rope"],
                                                      choice_cv.registry_candidates))["all"]  # fmt: skip
    cells = f"<td>rope</td><td>{own['own_at_least_vendor']} of {own['cases']}</td>"
    assert cells in text and f"<td>{cv['hits']} of {cv['scored']}</td>" in text
    capsys.readouterr()
    assert cli.main(["report", "--html", str(out), "--tables", "NVIDIA Z9", *map(str, _files(tmp_path))]) == 2
    assert "--tables: no tuning table for 'NVIDIA Z9'" in capsys.readouterr().err


def test_the_readme_report_command_reads_every_committed_row(tmp_path):
    """README: ``kernellab report --html out/ --tables all benchmarks/results/*.jsonl``
    builds the page from every committed row file (whole-step rows of the multi-GPU runs
    and lab probes' rows among them)."""
    from pathlib import Path

    files = sorted(str(p) for p in (Path(__file__).resolve().parents[1] / "benchmarks" / "results").glob("*.jsonl"))
    if not files:
        pytest.skip("no committed rows in this checkout")
    assert cli.main(["report", "--html", str(tmp_path / "out"), "--tables", "all", *files]) == 0
    assert (tmp_path / "out" / "index.html").stat().st_size > 10_000
