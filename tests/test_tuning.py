"""Shape-aware defaults on the CPU: families, shape keys, `tune` writing a table, the
default reading it, `explain`, the fallback for a refused input, the notice for a GPU
with no table."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

import kernellab
from kernellab.cli import main
from kernellab.core import choice, registry, shapes
from kernellab.core import tables as table_files
from kernellab.core.spec import get_spec
from kernellab.harness import tune as tuner


def _write(tables, rows, gpu="cpu"):
    (tables / f"{table_files.gpu_slug(gpu)}.json").write_text(json.dumps({"gpu": gpu, "rows": rows}))
    registry.clear_cache()


def test_families_name_registered_ops_with_positive_shapes():
    ops = set(registry.op_names())
    for fam, per_op in shapes.FAMILIES.items():
        for op, listed in per_op.items():
            assert op in ops, (fam, op)
            for s in listed:
                assert all(isinstance(d, int) and d > 0 for d in s), (fam, op, s)
    assert (8192, 50257) in shapes.family_shapes("softmax", "gpt2")
    assert len(shapes.family_shapes("matmul")) == len(set(shapes.family_shapes("matmul")))
    with pytest.raises(ValueError, match="family: unknown 'gpt5'"):
        shapes.family_shapes("softmax", "gpt5")


@pytest.mark.parametrize(
    "op,shape",
    [("attention", (1, 2, 64, 32)), ("attention", (1, 2, 5, 7, 32)), ("attention", (1, 4, 2, 5, 7, 32)),
     ("matmul", (8, 16, 32)), ("gelu", (4096,)),
     ("layer_norm", (64, 256)), ("cross_entropy", (64, 100)), ("sum", (64, 256)), ("relu", (4096,)),
     ("conv2d", (2, 3, 8, 8, 4, 3, 3)), ("max_pool2d", (2, 3, 8, 8)), ("rope", (2, 4, 2, 5, 16, 8)),
     ("rope", (2, 3, 5, 16)), ("linear_cross_entropy", (6, 8, 40)), ("linear_cross_entropy", (2, 3, 8, 40))],
)  # fmt: skip
def test_table_rows_and_calls_share_one_shape_key(op, shape):
    args = get_spec(op).make_inputs(shape, torch.float32, "cpu", 0)
    assert shapes.shape_key(op, args) == shapes.key_of_shape(op, shape)


def test_tune_writes_a_table_the_default_then_reads(tables, capsys):
    assert main(["tune", "gelu", "-f", "cpu-tiny", "-b", "torch,manual", "--device", "cpu", "--dtype", "fp32", "--budget", "0.05"]) == 0
    table = json.loads((tables / "cpu.json").read_text())
    rows = [r for r in table["rows"] if r["op"] == "gelu"]
    assert {tuple(r["shape"]) for r in rows} == {(4096,), (65537,)}
    for r in rows:
        assert set(r["times"]) == set(r["device"]) == {"torch", "manual"}
        assert r["best"] == choice.pick_best(r["times"], r["device"])
    assert table["provenance"]["git_sha"] and table["provenance"]["date"]
    backend, why = registry.choose_key("gelu", (5000,), torch.float32, "cpu")
    assert backend == rows[0]["best"] and "cpu.json" in why and "[4096]" in why
    # far from every row: the heuristic, and it says so
    backend, why = registry.choose_key("gelu", (2**30,), torch.float32, "cpu")
    assert backend == registry.default_backend("gelu", "cpu") and "no table row near" in why
    capsys.readouterr()
    assert main(["explain", "gelu", "-s", "5000", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "cpu.json" in out and "inside torch.compile: torch" in out


def test_tune_names_the_candidates_it_cannot_time_here(tables, capsys):
    # a tune leaves an unavailable backend out of every row, so the default can never pick
    # it from them: the tune says which and why before it starts
    missing = tuner.not_timed("rms_norm", "cpu")
    assert "torch" not in missing and "triton" not in missing
    assert "cuda" in missing and missing["cuda"]
    assert "kernellab build-nodes" in missing["cuda_node"]
    assert tuner.not_timed_notice("rms_norm", "cpu", ["torch", "triton"]) is None
    with pytest.raises(KeyError, match="no backend 'nope'"):
        tuner.not_timed("rms_norm", "cpu", ["nope"])
    argv = ["tune", "gelu", "-f", "cpu-tiny", "-b", "torch,cuda", "--device", "cpu", "--dtype", "fp32",
            "--budget", "0.05"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "tune gelu: not timed here: cuda (" in out
    assert main(["tune", "gelu", "-f", "cpu-tiny", "-b", "torch,nope", "--device", "cpu"]) == 2
    assert "no backend 'nope'" in capsys.readouterr().err


def test_tune_times_fp32_as_fp32_and_restores_the_users_tf32_flags(tables, monkeypatch):
    """cuDNN takes TF32 by PyTorch's default where its heuristics like, so a TF32 kernel
    judged against it is refused at one shape and admitted at the next: tune, like `check`
    and `bench`, runs with TF32 off for matmuls and cuDNN, then puts the flags back."""
    import kernellab.harness.bench as hb

    seen = []

    def fake_bench(*a, **k):
        seen.append((torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32))
        return []

    monkeypatch.setattr(hb, "bench", fake_bench)
    old = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        table = tuner.tune("gelu", "cpu-tiny", [torch.float32], ["fwd"], device="cpu", backends=["torch"])
        assert seen == [(False, False)]
        assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (True, True)
        assert table["provenance"]["tf32"] is False
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def test_matmul_heuristic_is_cublas_first():
    assert kernellab.get_spec("matmul").default_backends[0] == "torch"
    assert registry.default_backend("matmul", "cpu") == "torch"


def test_the_best_is_the_least_effective_time_and_ties_go_by_device_time():
    # effective times within TIE (5%) of the least are loop-time noise: device time decides
    assert choice.pick_best({"a": 0.100, "b": 0.104, "c": 0.2}, {"a": 0.09, "b": 0.05, "c": 0.01}) == "b"
    # past TIE the effective time decides, whatever the device time
    assert choice.pick_best({"a": 0.100, "b": 0.106, "c": 0.2}, {"a": 0.09, "b": 0.05, "c": 0.01}) == "a"
    # rows without device times: the effective time alone
    assert choice.pick_best({"a": 0.100, "b": 0.101}, {}) == "a"
    # device times within DEVICE_TIE (1%) are one speed: the effective time decides again
    assert choice.pick_best({"a": 0.0281, "b": 0.0290}, {"a": 0.0281, "b": 0.02794}) == "a"
    assert choice.pick_best({"a": 0.0281, "b": 0.0290}, {"a": 0.0281, "b": 0.0270}) == "b"


def test_device_time_decides_where_the_fastest_kernel_is_not_launch_bound():
    # the fastest device time >= DEVICE_BOUND_MS: device time decides, however the plain
    # loop came out (a layer_norm fwd+bwd at 4096x2048: ours 41 us on the device, PyTorch's
    # 66, both host-bound in a loop of that call alone)
    assert choice.DEVICE_BOUND_MS == 0.02
    assert choice.pick_best({"torch": 0.177, "triton": 0.189}, {"torch": 0.066, "triton": 0.041}) == "triton"
    # device times within DEVICE_TIE: the effective time among them
    assert choice.pick_best({"a": 0.30, "b": 0.20}, {"a": 0.0500, "b": 0.0503}) == "b"
    # below the bound the call is launch-bound: the effective time decides
    assert choice.pick_best({"torch": 0.140, "triton": 0.190}, {"torch": 0.019, "triton": 0.012}) == "torch"
    # a backend without a device time: the old rule
    assert choice.pick_best({"torch": 0.1, "triton": 0.2}, {"triton": 0.05}) == "torch"


def test_rows_written_before_the_device_rule_are_read_by_it():
    # (the device rule is by="queued"'s, the default; by="loop" keeps the row's best)
    row = {"best": "torch", "times": {"torch": 0.177, "triton": 0.189},
           "device": {"torch": 0.066, "triton": 0.041}}  # fmt: skip
    assert choice.row_choice(row) == "triton" and choice.row_choice(row, "loop") == "torch"
    tiny = {"best": "torch", "times": {"torch": 0.14, "triton": 0.19},
            "device": {"torch": 0.009, "triton": 0.012}}  # fmt: skip
    assert choice.row_choice(tiny) == "torch"
    # a launch-bound row keeps the choice it was written with (a paired verify's verdict)
    verified = dict(tiny, best="triton")
    assert choice.row_choice(verified) == "triton"
    where = dict(op="gelu", dtype="bf16", mode="fwdbwd", shape=[4096 * 2048], key=[4096 * 2048])
    table = {"rows": [dict(row, **where)]}
    pick, why = choice.choose(table, "X.json", "gelu", (4096 * 2048,), "bf16", "fwdbwd", "",
                              usable=frozenset({"torch", "triton"}), preferred="torch")  # fmt: skip
    assert pick == "triton" and "by device time" in why
    pick, why = choice.choose(table, "X.json", "gelu", (4096 * 2048,), "bf16", "fwdbwd", "",
                              usable=frozenset({"torch", "triton"}), preferred="torch", by="loop")  # fmt: skip
    assert pick == "torch" and "the larger of device and loop time" in why


def test_table_rows_keep_device_times_and_a_later_row_replaces_an_earlier():
    base = {"op": "gelu", "dtype": "bf16", "mode": "fwd", "shape": "4096", "status": "ok"}
    rows = [
        {**base, "backend": "torch", "median_ms": 0.010, "effective_ms": 0.030},
        {**base, "backend": "triton", "median_ms": 0.008, "effective_ms": 0.031},
        {**base, "backend": "cuda", "median_ms": 0.001, "effective_ms": 0.5},
        {**base, "backend": "cuda", "median_ms": 0.009, "effective_ms": 0.0305},  # re-measured
        {**base, "backend": "manual", "status": "error", "median_ms": 0.0001},  # failed: no row
        {**base, "op": "add", "backend": "torch", "median_ms": 1.0},  # another op
    ]
    (row,) = tuner.table_rows("gelu", rows)
    assert row["shape"] == [4096] and row["key"] == [4096]
    assert row["times"] == {"cuda": 0.0305, "torch": 0.03, "triton": 0.031}
    assert row["device"] == {"cuda": 0.009, "torch": 0.01, "triton": 0.008}
    assert row["best"] == "triton"  # within 5% of torch's loop time, and the least device time


def test_choose_by_device_time_among_given_backends(tables):
    _write(tables, [{"op": "gelu", "dtype": "fp32", "mode": "fwdbwd", "shape": [4096], "key": [4096], "best": "torch",
                     "times": {"torch": 0.10, "manual": 0.30, "compile": 0.40},
                     "device": {"torch": 0.05, "manual": 0.02, "compile": 0.01}}])  # fmt: skip
    assert registry.choose_key("gelu", (4096,), torch.float32, "cpu", "fwdbwd")[0] == "torch"
    backend, why = registry.choose_key("gelu", (4096,), torch.float32, "cpu", "fwdbwd", by="device")
    assert backend == "compile" and "by device time" in why
    # explain says both: the standalone call's choice and the device-time one
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["explain", "gelu", "-s", "4096", "--device", "cpu", "--dtype", "fp32", "--mode", "fwdbwd"]) == 0
    out = buf.getvalue()
    assert "fwdbwd on cpu (cpu): torch" in out and "by device time (a graphed or fused step): compile" in out
    assert registry.choose_key("gelu", (4096,), torch.float32, "cpu", "fwdbwd", by="device",
                             among=("torch", "manual"))[0] == "manual"  # fmt: skip
    # none of ``among`` in the row: the heuristic, which says so
    backend, why = registry.choose_key("gelu", (4096,), torch.float32, "cpu", "fwdbwd", by="device", among=("nope",))
    assert "heuristic" in why
    with pytest.raises(ValueError, match="by"):
        registry.choose_key("gelu", (4096,), torch.float32, "cpu", by="plain")


def test_rebuild_table_script_writes_device_times(tmp_path):
    import subprocess
    import sys

    rows = [{"op": "gelu", "dtype": "bf16", "mode": "fwd", "shape": "4096", "status": "ok", "gpu": "Fake GPU",
             "git_sha": "abc", "backend": b, "median_ms": d, "effective_ms": e}
            for b, d, e in (("torch", 0.01, 0.03), ("triton", 0.008, 0.0301))]  # fmt: skip
    src = tmp_path / "tune.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "table.json"
    root = __import__("pathlib").Path(__file__).resolve().parents[1]
    res = subprocess.run([sys.executable, "-m", "kernellab.harness.rebuild_table", str(src), "--out", str(out)],
                         capture_output=True, text=True, env={**__import__("os").environ, "PYTHONPATH": str(root / "src")})  # fmt: skip
    assert res.returncode == 0, res.stderr
    table = json.loads(out.read_text())
    (row,) = table["rows"]
    assert row["best"] == "triton" and row["device"] == {"torch": 0.01, "triton": 0.008}
    assert table["gpu"] == "Fake GPU" and table["provenance"]["git_sha"] == "abc"


def test_rebuild_table_says_when_a_case_mixes_cpp_node_states(tmp_path, capsys):
    from kernellab.harness import rebuild_table

    def row(shape, b, nodes, status="ok"):
        r = {"op": "layer_norm", "dtype": "fp32", "mode": "fwdbwd", "shape": shape, "status": status,
             "gpu": "Fake GPU", "git_sha": "abc", "backend": b, "median_ms": 0.01,
             "effective_ms": 0.02 if status == "ok" else None}  # fmt: skip
        if nodes is not None:
            r["cpp_nodes"] = nodes
        return r

    rows = [
        row("64x256", "cuda_node", True), row("64x256", "triton", False),
        row("64x256", "cuda_node", None, "n/a"),
        row("128x768", "torch", True), row("128x768", "triton", True),  # one state
        row("1024x768", "torch", None), row("1024x768", "triton", False),  # a row that says nothing
        row("8192x768", "triton", True), row("8192x768", "triton", False), row("8192x768", "torch", False),
    ]  # fmt: skip
    # 8192x768: triton's later row (False) replaces its earlier one, as the table takes it
    assert rebuild_table.mixed_nodes(rows) == ["layer_norm fp32 fwdbwd 64x256"]
    src, out = tmp_path / "tune.jsonl", tmp_path / "table.json"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert rebuild_table.main([str(src), "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert "layer_norm fp32 fwdbwd 64x256: its backends' rows were taken with and without" in said
    assert "128x768" not in said and "8192x768" not in said and "1024x768" not in said


def test_rebuild_table_can_leave_out_shapes_no_family_holds(tmp_path, capsys):
    # a family edited after its tune run (a shape taken out): --family-shapes-only drops
    # that shape's rows, from the files and from the table being rebuilt, and says so
    from kernellab.harness import rebuild_table

    held = shapes.family_shapes("gelu")[0]
    held_s = "x".join(map(str, held))

    def row(shape, b, d):
        return {"op": "gelu", "dtype": "bf16", "mode": "fwd", "shape": shape, "status": "ok", "gpu": "Fake GPU",
                "git_sha": "abc", "backend": b, "median_ms": d, "effective_ms": d}  # fmt: skip

    src, out = tmp_path / "tune.jsonl", tmp_path / "table.json"
    rows = [row(s, b, d) for s in (held_s, "12345") for b, d in (("torch", 0.05), ("triton", 0.04))]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert rebuild_table.main([str(src), "--out", str(out)]) == 0
    assert sorted(r["shape"] for r in json.loads(out.read_text())["rows"]) == [[12345], list(held)]
    capsys.readouterr()
    assert rebuild_table.main([str(src), "--out", str(out), "--family-shapes-only"]) == 0
    assert "left out (no tuned family holds it): gelu 12345" in capsys.readouterr().out
    table = json.loads(out.read_text())
    assert [r["shape"] for r in table["rows"]] == [list(held)]
    assert table["provenance"]["family_shapes_only"] is True


def _rebuild_with_verify(tmp_path, rows, vrows, vname: str, flag: str = "--verify") -> dict:
    """kernellab.harness.rebuild_table run on tune ``rows`` with ``flag`` (``--verify`` or
    ``--rows-from-verify``) rows ``vrows`` (a file named ``vname``); returns the table it wrote."""
    import subprocess
    import sys

    src, ver, out = tmp_path / "tune.jsonl", tmp_path / vname, tmp_path / "table.json"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ver.write_text("".join(json.dumps(r) + "\n" for r in vrows))
    root = __import__("pathlib").Path(__file__).resolve().parents[1]
    res = subprocess.run([sys.executable, "-m", "kernellab.harness.rebuild_table", str(src), "--out", str(out),
                          flag, str(ver)], capture_output=True, text=True,
                         env={**__import__("os").environ, "PYTHONPATH": str(root / "src")})  # fmt: skip
    assert res.returncode == 0, res.stderr
    return json.loads(out.read_text())


def test_rebuild_table_applies_paired_verify_verdicts(tmp_path):
    """--verify: a tuned shape whose paired rounds put torch >5% ahead of the table's choice
    switches to torch (recorded under 'verified'); within 5%, or a heldout shape, does not."""

    def tune_row(shape, b, d, e):
        return {"op": "gelu", "dtype": "bf16", "mode": "fwd", "shape": shape, "status": "ok", "gpu": "Fake GPU",
                "git_sha": "abc", "backend": b, "median_ms": d, "effective_ms": e}  # fmt: skip

    rows = [tune_row(s, b, d, e) for s in ("4096", "8192", "16384")
            for b, d, e in (("torch", 0.01, 0.03), ("triton", 0.008, 0.0301))]  # fmt: skip

    def verify_row(shape, fam, b, rounds):
        return {**tune_row(shape, b, 0.008, 0.03), "family": fam, "paired_rounds_ms": rounds}

    vrows = [
        verify_row("4096", "small", "triton", [0.030, 0.040, 0.031]),  # torch 1.25x faster: switch
        verify_row("4096", "small", "torch", [0.024, 0.032, 0.025]),
        verify_row("4096", "small", "default", [0.030, 0.040, 0.031]),
        verify_row("8192", "small", "triton", [0.030, 0.030, 0.030]),  # 1.03x: stays
        verify_row("8192", "small", "torch", [0.029, 0.029, 0.029]),
        verify_row("16384", "heldout", "triton", [0.05, 0.05, 0.05]),  # heldout: never fed back
        verify_row("16384", "heldout", "torch", [0.01, 0.01, 0.01]),
    ]
    table = _rebuild_with_verify(tmp_path, rows, vrows, "verify.jsonl")
    best = {r["shape"][0]: r for r in table["rows"]}
    assert best[4096]["best"] == "torch" and best[4096]["verified"]["was"] == "triton"
    assert best[4096]["verified"]["paired_ratio_vs_torch"] == 1.25
    assert best[8192]["best"] == "triton" and "verified" not in best[8192]
    assert best[16384]["best"] == "triton"
    assert table["provenance"]["verified_by"] == ["verify.jsonl"]


def test_rebuild_table_makes_rows_of_an_untuned_dtype_from_paired_verify_cases(tmp_path):
    """--rows-from-verify: a verify case of an op, dtype and mode no tune row measured (bf16
    of an op tuned in fp32) becomes a row holding the backends the verify timed: the choice
    unless another is >5% ahead in the paired rounds; a case the tune rows cover, a heldout
    case and the default's own rounds make none."""

    def tune_row(dt, shape, b, d, e):
        return {"op": "gelu", "dtype": dt, "mode": "fwd", "shape": shape, "status": "ok", "gpu": "Fake GPU",
                "git_sha": "abc", "backend": b, "median_ms": d, "effective_ms": e}  # fmt: skip

    rows = [tune_row("fp32", "4096", b, 0.01, 0.03) for b in ("torch", "triton")]

    def verify_row(dt, shape, fam, b, rounds, chosen):
        return {**tune_row(dt, shape, b, 0.008, 0.03), "family": fam, "paired_rounds_ms": rounds, "chosen": chosen}

    vrows = [
        verify_row("bf16", "4096", "small", "triton", [0.040, 0.050, 0.041], "triton"),  # torch 1.25x ahead
        verify_row("bf16", "4096", "small", "torch", [0.032, 0.040, 0.033], "triton"),
        verify_row("bf16", "4096", "small", "default", [0.040, 0.050, 0.041], "triton"),
        verify_row("bf16", "8192", "small", "triton", [0.030, 0.030, 0.030], "triton"),  # 1.03x: stays
        verify_row("bf16", "8192", "small", "torch", [0.031, 0.031, 0.031], "triton"),
        verify_row("bf16", "512", "small", "torch", [0.02, 0.021, 0.02], "torch"),  # torch alone
        verify_row("bf16", "16384", "heldout", "triton", [0.05, 0.05, 0.05], "triton"),
        verify_row("bf16", "16384", "heldout", "torch", [0.01, 0.01, 0.01], "triton"),
        verify_row("fp32", "4096", "small", "triton", [0.05, 0.05, 0.05], "triton"),  # fp32 is tuned
        verify_row("fp32", "4096", "small", "torch", [0.01, 0.01, 0.01], "triton"),
    ]
    table = _rebuild_with_verify(tmp_path, rows, vrows, "v.jsonl", "--rows-from-verify")
    made = {r["shape"][0]: r for r in table["rows"] if r.get("from_verify")}
    assert sorted(made) == [512, 4096, 8192] and all(r["dtype"] == "bf16" for r in made.values())
    assert made[4096]["best"] == "torch" and made[4096]["times"] == {"triton": 0.041, "torch": 0.033}
    assert made[4096]["device"] == {"triton": 0.008, "torch": 0.008} and made[4096]["key"] == [4096]
    assert made[8192]["best"] == "triton" and made[512]["best"] == "torch" and list(made[512]["times"]) == ["torch"]
    assert [r["dtype"] for r in table["rows"] if not r.get("from_verify")] == ["fp32"]
    assert table["provenance"]["rows_from_verify"] == ["v.jsonl"]


def test_rebuild_table_applies_paired_host_cost_rounds(tmp_path):
    """--verify with kernellab.harness.host_cost rows: at a tuned shape where the paired rounds put
    another measured backend >5% ahead (triton's launch costs less host time than cuda's),
    it becomes the choice; a backend the row never measured (torch, refused by the tune's
    admission check) never does, however fast."""

    def tune_row(shape, b, d, e):
        return {"op": "rms_norm", "dtype": "bf16", "mode": "fwd", "shape": shape, "status": "ok",
                "gpu": "Fake GPU", "git_sha": "abc", "backend": b, "median_ms": d, "effective_ms": e}  # fmt: skip

    rows = [tune_row(s, b, d, e) for s in ("64x256", "16384x4096")
            for b, d, e in (("cuda", 0.005, 0.0276), ("triton", 0.0052, 0.0287))]  # fmt: skip

    def host_row(shape, b, rounds):
        return {"bench": "host_cost", "op": "rms_norm", "backend": b, "mode": "fwd", "shape": shape,
                "dtype": "bfloat16", "options": {}, "gpu": "Fake GPU", "rounds_us": rounds}  # fmt: skip

    hrows = [
        host_row("64x256", "torch", [14.0, 15.0, 14.5]),  # fastest, but not a candidate
        host_row("64x256", "cuda", [25.7, 26.0, 27.0]),
        host_row("64x256", "triton", [19.3, 19.0, 20.0]),  # 1.35x ahead of cuda: switch
        host_row("64x256", "default", [27.4, 27.0, 28.0]),
        host_row("16384x4096", "cuda", [92.0, 92.4, 91.8]),
        host_row("16384x4096", "triton", [91.5, 91.4, 91.6]),  # within 5%: stays cuda
    ]
    best = {tuple(r["shape"]): r for r in _rebuild_with_verify(tmp_path, rows, hrows, "host_cost.jsonl")["rows"]}
    small, big = best[(64, 256)], best[(16384, 4096)]
    assert small["best"] == "triton" and small["verified"]["was"] == "cuda" and small["verified"]["vs"] == "triton"
    assert small["verified"]["paired_ratio"] == 1.35  # the median of the rounds' cuda / triton
    assert big["best"] == "cuda" and "verified" not in big


def test_default_calls_the_backend_the_table_names(tables):
    calls = []

    @registry.register("gelu", "spy", devices=("cpu",), description="records its calls")
    def spy(x):
        calls.append(tuple(x.shape))
        return torch.nn.functional.gelu(x, approximate="tanh")

    try:
        _write(tables, [{"op": "gelu", "dtype": "fp32", "mode": "fwd", "shape": [4096], "key": [4096],
                         "best": "spy", "times": {"spy": 0.01, "torch": 0.02}}])  # fmt: skip
        x = torch.randn(64, 64)
        kernellab.gelu(x)
        assert calls == [(64, 64)]
        kernellab.gelu(torch.randn(8, dtype=torch.float64).float())  # 8 elements: far, heuristic
        assert calls == [(64, 64)]
    finally:
        registry.unregister("gelu", "spy")
    kernellab.gelu(torch.randn(64, 64))  # the spy is gone: its cached choice went with it
    assert calls == [(64, 64)]


def test_an_op_timed_forward_only_serves_calls_with_gradients_by_its_forward_row(tables):
    """argmax has no forward+backward rows (no gradient): a call on a tensor that requires
    grad takes the forward row's backend, not the heuristic's, and the default caches one
    backend for the key (validated once, then run directly: ``key_validates``)."""
    calls = []

    @registry.register("argmax", "spy", devices=("cpu",), description="records its calls")
    def spy(x):
        calls.append(x.requires_grad)
        return torch.argmax(x, -1)

    try:
        _write(tables, [{"op": "argmax", "dtype": "fp32", "mode": "fwd", "shape": [64, 256], "key": [64, 256],
                         "best": "spy", "times": {"spy": 0.01, "torch": 0.02}}])  # fmt: skip
        x = torch.randn(64, 256)
        kernellab.argmax(x)
        kernellab.argmax(x.clone().requires_grad_())
        assert calls == [False, True]
        picks = [v for k, v in registry._CHOSEN.items() if k[0] == "argmax"]
        assert len(picks) == 1 and isinstance(picks[0], registry._Trusted) and picks[0].impl.backend == "spy"
    finally:
        registry.unregister("argmax", "spy")


def _spy_forward_torch_backward(tables, op, shape):
    """A table whose forward row names the ``spy`` backend and whose forward+backward row
    names PyTorch's op, at ``shape``."""
    _write(tables, [{"op": op, "dtype": "fp32", "mode": mode, "shape": list(shape), "key": list(shape),
                     "best": best, "times": {"spy": t, "torch": 0.02}}
                    for mode, best, t in (("fwd", "spy", 0.01), ("fwdbwd", "torch", 0.05))])  # fmt: skip


def _count_validations(monkeypatch, op, backends) -> list:
    """From here on, each validation of these backends of ``op`` appends the call's first
    argument's shape to the returned list (without forgetting the cached choices)."""
    seen = []
    for backend in backends:
        impl = registry.get(op, backend)
        inner = impl._validate or impl._validator()

        def counting(args, kwargs, devices, inner=inner):
            seen.append(args[0].shape)
            return inner(args, kwargs, devices)

        monkeypatch.setattr(impl, "_validate", counting)
    return seen


def test_a_key_whose_modes_chose_differently_is_trusted_with_both_backends(tables, monkeypatch):
    """Forward rows name one backend and forward+backward rows another: after the first
    call at the key (both backends validated for its facts) each call runs the one its
    mode wants without validation: gradients on and a tensor requiring grad -> the
    forward+backward backend; no_grad or no such tensor -> the forward one. A call with
    other facts is still validated and refused."""
    calls = []

    @registry.register("gelu", "spy", devices=("cpu",), description="records its calls")
    def spy(x):
        calls.append("spy")
        return registry.get("gelu", "torch").fn(x)

    try:
        _spy_forward_torch_backward(tables, "gelu", (4096,))
        x = torch.randn(64, 64)
        xg = x.clone().requires_grad_()
        want = kernellab.gelu(x, backend="torch")
        torch.testing.assert_close(kernellab.gelu(x), want)
        pick = [v for k, v in registry._CHOSEN.items() if k[0] == "gelu"]
        assert len(pick) == 1 and isinstance(pick[0], registry._Trusted)
        assert (pick[0].impl.backend, pick[0].grad_impl.backend) == ("spy", "torch")
        validated = _count_validations(monkeypatch, "gelu", ("torch", "spy"))
        for _ in range(2):
            torch.testing.assert_close(kernellab.gelu(x), want)
            out = kernellab.gelu(xg)
            assert out.requires_grad
            out.sum().backward()
            with torch.no_grad():
                torch.testing.assert_close(kernellab.gelu(xg), want)
        assert calls == ["spy", "spy", "spy", "spy", "spy"], "torch served the calls with gradients"
        assert validated == [], "trusted: no validation at the key"
        with pytest.raises(TypeError, match="x has layout torch.sparse_coo"):
            kernellab.gelu(x.to_sparse())
        with pytest.raises(TypeError, match="x has layout torch.sparse_coo"):
            kernellab.gelu(xg.detach().to_sparse().requires_grad_())
    finally:
        registry.unregister("gelu", "spy")


def test_a_multi_tensor_key_whose_modes_chose_differently_runs_each_mode_s_backend(tables, monkeypatch):
    """The same through the one-pass lookup of calls of several tensors (layer_norm's x,
    weight, bias): after the first call, calls with the validated facts run the backend of
    their mode without validation; other facts (a float64 weight) are validated."""
    calls = []

    @registry.register("layer_norm", "spy", devices=("cpu",), description="records its calls")
    def spy(x, w, b, eps=1e-5):
        calls.append("spy")
        return registry.get("layer_norm", "torch").fn(x, w, b, eps=eps)

    try:
        _spy_forward_torch_backward(tables, "layer_norm", (64, 32))
        x, w, b = torch.randn(64, 32), torch.randn(32), torch.randn(32)
        wg = w.clone().requires_grad_()
        want = torch.nn.functional.layer_norm(x, (32,), w, b)
        torch.testing.assert_close(kernellab.layer_norm(x, w, b), want)
        assert calls == ["spy"]
        validated = _count_validations(monkeypatch, "layer_norm", ("torch", "spy"))
        for _ in range(2):
            torch.testing.assert_close(kernellab.layer_norm(x, w, b), want)
            out = kernellab.layer_norm(x, wg, b)
            assert out.requires_grad
            out.sum().backward()
        assert calls == ["spy", "spy", "spy"], "torch served the calls with gradients"
        assert validated == [], "trusted: no validation for the validated facts"
        with pytest.raises(TypeError, match="weight has dtype torch.float64"):
            kernellab.layer_norm(x, w.double(), b)
        assert len(validated) == 1
    finally:
        registry.unregister("layer_norm", "spy")


def test_a_call_needing_any_gradient_takes_the_forward_backward_row(tables):
    """The first argument alone does not say whether a backward follows: a network's first
    layer takes inputs without gradients and weights with them."""
    _write(tables, [
        {"op": "matmul", "dtype": "fp32", "mode": "fwd", "shape": [64, 128, 3136], "key": [64, 128, 3136],
         "best": "manual", "times": {"manual": 0.01, "torch": 0.02}},
        {"op": "matmul", "dtype": "fp32", "mode": "fwdbwd", "shape": [64, 128, 3136], "key": [64, 128, 3136],
         "best": "torch", "times": {"manual": 0.5, "torch": 0.03}},
    ])  # fmt: skip
    x, w = torch.randn(64, 3136), torch.randn(3136, 128)
    assert registry.choose("matmul", (x, w), "cpu")[0] == "manual"
    assert registry.choose("matmul", (x, w.requires_grad_()), "cpu")[0] == "torch"
    with torch.no_grad():
        assert registry.choose("matmul", (x, w), "cpu")[0] == "manual"
    assert shapes.wants_grad((x, w, None, "relu")) and not shapes.wants_grad((x, 3))


def test_one_call_site_takes_each_modes_row_from_its_cached_choice(tables):
    """The default caches both modes' choices per shape: the same call site runs the forward
    row's backend without gradients and the forward+backward row's backend with any."""
    calls = []
    for name in ("spy_fwd", "spy_both"):
        registry.register("matmul", name, devices=("cpu",), description="records its calls")(
            lambda a, b, name=name: calls.append(name) or a @ b
        )
    try:
        _write(tables, [
            {"op": "matmul", "dtype": "fp32", "mode": "fwd", "shape": [64, 128, 3136], "key": [64, 128, 3136],
             "best": "spy_fwd", "times": {"spy_fwd": 0.01, "torch": 0.02}},
            {"op": "matmul", "dtype": "fp32", "mode": "fwdbwd", "shape": [64, 128, 3136], "key": [64, 128, 3136],
             "best": "spy_both", "times": {"spy_both": 0.01, "torch": 0.03}},
        ])  # fmt: skip
        x, w = torch.randn(64, 3136), torch.randn(3136, 128)
        wg = w.clone().requires_grad_()
        for _ in range(2):  # the second round is served from the cache
            kernellab.matmul(x, w)
            kernellab.matmul(x, wg)
            with torch.no_grad():
                kernellab.matmul(x, wg)
        assert calls == ["spy_fwd", "spy_both", "spy_fwd"] * 2
    finally:
        registry.unregister("matmul", "spy_fwd")
        registry.unregister("matmul", "spy_both")


def test_a_refused_input_falls_back_to_torch(tables):
    # The table sends attention to Triton (here under its interpreter); head dim 100 (not
    # a multiple of 8) is refused by the Triton kernels and served by PyTorch's SDPA.
    _write(tables, [{"op": "attention", "dtype": "fp32", "mode": "fwd", "shape": [1, 2, 16, 100],
                     "key": [2, 16, 16, 100], "best": "triton",
                     "times": {"triton": 0.01, "torch": 0.02}}])  # fmt: skip
    q, k, v = (torch.randn(1, 2, 16, 100) for _ in range(3))
    assert registry.choose("attention", (q, k, v), "cpu")[0] == "triton"
    with pytest.raises(ValueError, match="head"):
        kernellab.attention(q, k, v, backend="triton")
    out = kernellab.attention(q, k, v)
    torch.testing.assert_close(out, torch.nn.functional.scaled_dot_product_attention(q, k, v))
    # a bad input is still refused with kernellab's own message (torch's backend refuses
    # it too, so nothing is served)
    with pytest.raises(ValueError, match="k has head dim 64 but q has 100"):
        kernellab.attention(q, k[..., :64], v)


def test_a_shape_no_row_is_near_takes_the_tables_majority_not_the_fixed_preference(tables):
    """Far from every row (16x or more in a dim), the backend that won most of the op's rows
    in this dtype and mode serves the call; with no majority, the backend nearest the best
    over them (geometric mean of time over each row's best, timed at every row); with too
    few rows, or no backend nearer than another, the op's preference list does (the GPU
    said nothing usable)."""

    def row(n, best):
        return {"op": "gelu", "dtype": "fp32", "mode": "fwd", "shape": [n], "key": [n], "best": best,
                "times": {"manual": 0.02 if best == "torch" else 0.01, "torch": 0.01 if best == "torch" else 0.02}}

    far = (8,)  # every row below is >= 2^10 elements: 7+ doublings away
    _write(tables, [row(1 << 20, "torch"), row(1 << 22, "torch"), row(1 << 24, "manual"), row(1 << 26, "torch")])
    backend, why = registry.choose_key("gelu", far, torch.float32, "cpu", "fwd")
    assert backend == "torch" and "no row near this shape" in why and "3 of its 4 gelu fp32 fwd rows" in why
    _write(tables, [row(1 << 20, "manual"), row(1 << 22, "manual"), row(1 << 24, "manual")])
    assert registry.choose_key("gelu", far, torch.float32, "cpu", "fwd")[0] == "manual"
    _write(tables, [row(1 << 20, "manual"), row(1 << 22, "manual")])  # two rows: too few to speak
    backend, why = registry.choose_key("gelu", far, torch.float32, "cpu", "fwd")
    assert backend == registry.default_backend("gelu", "cpu") and why.startswith("heuristic")
    _write(tables, [row(1 << 20, "manual"), row(1 << 22, "torch"), row(1 << 24, "manual"), row(1 << 26, "torch")])
    assert registry.choose_key("gelu", far, torch.float32, "cpu", "fwd")[1].startswith("heuristic")  # a tie
    assert registry.choose_key("gelu", far, torch.float32, "cpu", "fwdbwd")[1].startswith("heuristic")  # no rows

    def timed(n, manual, torch_t):
        return {"op": "gelu", "dtype": "fp32", "mode": "fwd", "shape": [n], "key": [n],
                "best": "manual" if manual < torch_t else "torch", "times": {"manual": manual, "torch": torch_t}}

    # two wins each, but torch loses by 1% where it loses and manual by 3x: torch is nearer
    _write(tables, [timed(1 << 20, 0.01, 0.0101), timed(1 << 22, 0.01, 0.0101),
                    timed(1 << 24, 0.03, 0.01), timed(1 << 26, 0.03, 0.01)])  # fmt: skip
    backend, why = registry.choose_key("gelu", far, torch.float32, "cpu", "fwd")
    assert backend == "torch" and "no backend won most of its 4 gelu fp32 fwd rows" in why
    assert "torch was nearest the best over them" in why and "manual 1.73" in why
    # a row that timed one backend alone (a verify run's) does not vote where others compare
    rows = [timed(1 << 20, 0.01, 0.0101), timed(1 << 22, 0.01, 0.0101), timed(1 << 24, 0.03, 0.01),
            {**timed(1 << 26, 0.03, 0.01), "times": {"torch": 0.01}}]  # fmt: skip
    _write(tables, rows)
    backend, why = registry.choose_key("gelu", far, torch.float32, "cpu", "fwd")
    assert backend == "manual" and "manual was fastest at 2 of its 3 gelu fp32 fwd rows" in why
    # where no row compares, those rows speak
    _write(tables, [{**timed(1 << k, 0.03, 0.01), "times": {"torch": 0.01}} for k in (20, 22, 24)])
    backend, why = registry.choose_key("gelu", far, torch.float32, "cpu", "fwd")
    assert backend == "torch" and "torch was fastest at 3 of its 3 gelu fp32 fwd rows" in why


def test_a_row_of_one_backend_speaks_only_at_its_own_shape(tables):
    """A verify run's row holds only the backends it timed (torch alone where the default
    was torch): it names torch at its own shape, but at a shape near it the nearest row
    that compared backends speaks (H100 bn_relu_pool2d bf16: torch's lone row at
    256x64x14x14 named torch for 1024x64x14x14, where triton was 6.7x faster)."""

    def row(n, times):
        return {"op": "gelu", "dtype": "fp32", "mode": "fwd", "shape": [n], "key": [n],
                "best": min(times, key=times.get), "times": times}  # fmt: skip

    _write(tables, [row(1 << 20, {"torch": 0.01}), row(1 << 23, {"manual": 0.01, "torch": 0.05})])
    backend, why = registry.choose_key("gelu", (1 << 20,), torch.float32, "cpu", "fwd")
    assert backend == "torch" and "nearest row [1048576] (distance 0.00)" in why
    backend, why = registry.choose_key("gelu", (1 << 21,), torch.float32, "cpu", "fwd")
    assert backend == "manual" and "nearest row [8388608] (distance 2.00)" in why
    # with no row that compares, the lone rows speak as before
    _write(tables, [row(1 << 20, {"torch": 0.01})])
    backend, why = registry.choose_key("gelu", (1 << 21,), torch.float32, "cpu", "fwd")
    assert backend == "torch" and "nearest row [1048576] (distance 1.00)" in why


def test_a_16_bit_dtype_without_rows_takes_its_siblings_rows(tables):
    """An op the table holds in fp32 only (the MNIST ops) serves bf16 calls from the fp32
    rows, fp16 calls read the bf16 rows before the fp32 ones, and an fp32 call borrows no
    16-bit row; the reason names the rows used. Rows of the call's own dtype win."""

    def row(dt, n, best):
        return {"op": "gelu", "dtype": dt, "mode": "fwd", "shape": [n], "key": [n], "best": best,
                "times": {"manual": 0.02 if best == "torch" else 0.01, "torch": 0.01 if best == "torch" else 0.02}}

    fixed = registry.default_backend("gelu", "cpu")
    other = "torch" if fixed == "manual" else "manual"
    _write(tables, [row("fp32", 1 << 20, other)])
    backend, why = registry.choose_key("gelu", (1 << 20,), torch.bfloat16, "cpu", "fwd")
    assert backend == other and "no gelu bf16 fwd rows: its fp32 rows" in why
    assert registry.choose_key("gelu", (1 << 20,), torch.float16, "cpu", "fwd")[0] == other
    assert registry.choose_key("gelu", (1 << 20,), torch.bfloat16, "cpu", "fwdbwd")[1].startswith("heuristic")
    _write(tables, [row("fp32", 1 << 20, other), row("bf16", 1 << 20, fixed)])
    backend, why = registry.choose_key("gelu", (1 << 20,), torch.float16, "cpu", "fwd")
    assert backend == fixed and "its bf16 rows" in why
    backend, why = registry.choose_key("gelu", (1 << 20,), torch.bfloat16, "cpu", "fwd")
    assert backend == fixed and "rows)" not in why
    _write(tables, [row("bf16", 1 << 20, other)])
    assert registry.choose_key("gelu", (1 << 20,), torch.float32, "cpu", "fwd")[1].startswith("heuristic")
    # far from the borrowed rows: their majority, still said to be borrowed
    _write(tables, [row("fp32", 1 << k, other) for k in (20, 22, 24)])
    backend, why = registry.choose_key("gelu", (8,), torch.bfloat16, "cpu", "fwd")
    assert backend == other and "3 of its 3 gelu fp32 fwd rows" in why and "its fp32 rows" in why


def test_no_table_for_a_gpu_is_a_one_line_notice_then_heuristics(tables):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert table_files.load_table("NVIDIA Imaginary X1") is None
        assert table_files.load_table("NVIDIA Imaginary X1") is None
    notes = [str(w.message) for w in seen]
    assert len(notes) == 1 and "no tuning table for NVIDIA Imaginary X1" in notes[0] and "heuristics" in notes[0]


def test_a_malformed_table_is_refused_naming_its_path(tables):
    (tables / "cpu.json").write_text(json.dumps({"gpu": "cpu"}))
    registry.clear_cache()
    with pytest.raises(ValueError, match="cpu.json: not a kernellab tuning table"):
        table_files.load_table("cpu")


def test_rows_are_told_apart_by_the_options_the_bench_varies(tables):
    # attention's bench varies causal: a causal call reads the causal row, a plain call
    # (causal omitted: its default, False) the other one.
    row = {"op": "attention", "dtype": "fp32", "mode": "fwd", "shape": [1, 2, 64, 32], "key": [2, 64, 64, 32],
           "times": {"triton": 0.01, "torch": 0.02}}  # fmt: skip
    _write(tables, [{**row, "options": "causal=False", "best": "torch"},
                    {**row, "options": "causal=True", "best": "triton"}])  # fmt: skip
    q = torch.randn(1, 2, 64, 32)
    assert registry.choose("attention", (q, q, q), "cpu")[0] == "torch"
    assert registry.choose("attention", (q, q, q), "cpu", kwargs={"causal": True})[0] == "triton"
    assert registry.choose("attention", (q, q, q), "cpu", kwargs={"causal": False})[0] == "torch"
    assert shapes.option_key("gelu", {}) == ""


def test_a_gpu_without_a_table_uses_one_of_its_architecture(tables, monkeypatch):
    monkeypatch.setattr(table_files._device, "capability", lambda: (9, 0))
    h100 = {"gpu": "NVIDIA H100", "provenance": {"capability": "9.0"},
            "rows": [{"op": "gelu", "dtype": "bf16", "mode": "fwd", "shape": [4096], "key": [4096],
                      "best": "torch", "times": {"torch": 0.01}}]}  # fmt: skip
    (tables / "NVIDIA_H100.json").write_text(json.dumps(h100))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert table_files.load_table("NVIDIA H800")["gpu"] == "NVIDIA H100"
    assert len(seen) == 1 and "using NVIDIA H100's (same architecture sm_90)" in str(seen[0].message)
    monkeypatch.setattr(table_files._device, "capability", lambda: (10, 0))
    registry.clear_cache()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert table_files.load_table("NVIDIA B200") is None
    assert "heuristics" in str(seen[0].message)


def test_ops_missing_from_a_gpus_table_come_from_its_architecture(tables, monkeypatch):
    # An H200 table tuned for a few ops: its own rows decide those, the H100's rows the rest
    # (marked with the GPU they were measured on), never the H100's rows of an op it has.
    monkeypatch.setattr(table_files._device, "capability", lambda: (9, 0))
    row = {"dtype": "bf16", "mode": "fwd", "shape": [4096], "key": [4096]}
    h100 = {"gpu": "NVIDIA H100", "provenance": {"capability": "9.0"},
            "rows": [{**row, "op": "gelu", "best": "triton", "times": {"triton": 0.01, "torch": 0.02}},
                     {**row, "op": "add", "best": "triton", "times": {"triton": 0.01, "torch": 0.02}}]}  # fmt: skip
    h200 = {"gpu": "NVIDIA H200", "provenance": {"capability": "9.0"},
            "rows": [{**row, "op": "add", "best": "torch",
                   "times": {"triton": 0.02, "torch": 0.01}}]}  # fmt: skip
    (tables / "NVIDIA_H100.json").write_text(json.dumps(h100))
    (tables / "NVIDIA_H200.json").write_text(json.dumps(h200))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        table = table_files.load_table("NVIDIA H200")
    assert not seen
    by_op = {r["op"]: r for r in table["rows"]}
    assert sorted(r["op"] for r in table["rows"]) == ["add", "gelu"]
    assert by_op["add"]["best"] == "torch" and "measured_on" not in by_op["add"]
    assert by_op["gelu"]["best"] == "triton" and by_op["gelu"]["measured_on"] == "NVIDIA H100"


def test_a_dtype_or_mode_missing_from_a_gpus_table_comes_from_its_architecture(tables, monkeypatch):
    # The H200's own bf16 rows of an op decide bf16 calls; its fp32 calls read the H100's
    # fp32 rows of that op, never the H100's bf16 ones.
    monkeypatch.setattr(table_files._device, "capability", lambda: (9, 0))
    row = {"op": "rms_norm", "mode": "fwd", "shape": [4096], "key": [4096]}
    h100 = {"gpu": "NVIDIA H100", "provenance": {"capability": "9.0"},
            "rows": [{**row, "dtype": "fp32", "best": "cuda", "times": {"cuda": 0.01, "triton": 0.02}},
                     {**row, "dtype": "bf16", "best": "cuda", "times": {"cuda": 0.01, "triton": 0.02}},
                     {**row, "dtype": "bf16", "mode": "fwdbwd", "best": "cuda", "times": {"cuda": 0.01}}]}  # fmt: skip
    h200 = {"gpu": "NVIDIA H200", "provenance": {"capability": "9.0"},
            "rows": [{**row, "dtype": "bf16", "best": "triton", "times": {"cuda": 0.02, "triton": 0.01}}]}  # fmt: skip
    (tables / "NVIDIA_H100.json").write_text(json.dumps(h100))
    (tables / "NVIDIA_H200.json").write_text(json.dumps(h200))
    table = table_files.load_table("NVIDIA H200")
    got = sorted((r["dtype"], r["mode"], r["best"], r.get("measured_on")) for r in table["rows"])
    assert got == [("bf16", "fwd", "triton", None), ("bf16", "fwdbwd", "cuda", "NVIDIA H100"),
                   ("fp32", "fwd", "cuda", "NVIDIA H100")]  # fmt: skip


def test_defaults_are_chosen_among_ours_and_the_peers_only():
    for op in registry.op_names():
        names = tuner.candidates(op)
        assert "torch" in names
        assert not {"manual", "compile", "tiled"} & set(names), op
        assert not [n for n in names if n.startswith(("cuda_v", "numba_v"))], op
    assert {"triton", "cuda"} <= set(tuner.candidates("matmul"))
    assert {"sdpa_flash", "sdpa_cudnn"} <= set(tuner.candidates("attention"))


def test_bench_times_the_default_as_a_row_of_its_own(tables):
    from kernellab.harness.bench import bench

    rows = bench("gelu", ["default", "torch"], [(64, 256)], [torch.float32], ("fwd", "fwdbwd"), device="cpu",
                 budget_s=0.02)  # fmt: skip
    got = {(r["backend"], r["mode"]): r for r in rows}
    assert set(got) == {("default", "fwd"), ("torch", "fwd"), ("default", "fwdbwd"), ("torch", "fwdbwd")}
    assert all(r["status"] == "ok" for r in rows), [r.get("reason") for r in rows]


def test_tune_writes_the_users_tables_not_the_package(tmp_path, monkeypatch):
    """Without $KERNELLAB_TABLES, tune writes ``tables/`` in the cache directory, starting
    from the package's table of this GPU model (its other ops' rows kept); the package
    directory is never written, and the user's table is read before it."""
    monkeypatch.delenv("KERNELLAB_TABLES", raising=False)
    monkeypatch.setenv("KERNELLAB_CACHE", str(tmp_path / "cache"))
    package = tmp_path / "package"
    package.mkdir()
    monkeypatch.setattr(table_files, "PACKAGE_TABLES", str(package))
    other = {"op": "add", "dtype": "fp32", "mode": "fwd", "shape": [4], "key": [4], "best": "torch",
             "times": {"torch": 1.0}}  # fmt: skip
    (package / "cpu.json").write_text(json.dumps({"gpu": "cpu", "rows": [other]}))
    before = (package / "cpu.json").read_text()
    registry.clear_cache()
    try:
        argv = ["tune", "gelu", "-f", "cpu-tiny", "-b", "torch,manual", "--device", "cpu", "--dtype", "fp32"]
        assert main([*argv, "--budget", "0.05"]) == 0
        user = tmp_path / "cache" / "tables" / "cpu.json"
        assert user.exists() and (package / "cpu.json").read_text() == before
        rows = json.loads(user.read_text())["rows"]
        assert {r["op"] for r in rows} == {"add", "gelu"}
        assert table_files.table_path("cpu") == str(user)
    finally:
        registry.clear_cache()


def test_default_rule_keeps_a_choice_cache_per_rule(tables):
    """``registry.default_rule("loop")`` (user_models' "kernellab-loop" variant) makes
    ``backend=None`` rank every row by the larger of device and loop time inside the block,
    with a cache of its own: calls alternating between the rules each run their rule's
    choice, and the block leaves ``config.default_by`` as it found it."""
    row = {"op": "gelu", "dtype": "fp32", "mode": "fwdbwd", "shape": [8192], "key": [8192], "best": "manual",
           "times": {"torch": 0.141, "manual": 0.602, "compile": 0.25},
           "device": {"torch": 0.075, "manual": 0.068, "compile": 0.09}}  # fmt: skip
    _write(tables, [row])
    registry.clear_cache()
    x = torch.randn(8192, requires_grad=True)

    def ran(rule):
        with registry.recording_choices() as rec:  # (recording chooses afresh, bypassing the caches)
            if rule is None:
                kernellab.gelu(x)
            else:
                with registry.default_rule(rule):
                    kernellab.gelu(x)
        return [r["backend"] for r in rec]

    def cached(cache):  # the forward+backward choices a cache holds
        picks = [p.pick() if hasattr(p, "pick") else p for p in cache.values()]
        return {(p[1] if isinstance(p, tuple) else p).backend for p in picks}

    try:
        assert ran("loop") == ["torch"] and ran(None) == ["manual"] and ran("queued") == ["manual"]
        for _ in range(3):  # alternating: each rule's cache keeps its own choice
            with registry.default_rule("loop"):
                kernellab.gelu(x).sum().backward()
            kernellab.gelu(x).sum().backward()
        assert cached(registry._RULE_CHOSEN["loop"]) == {"torch"}
        assert cached(registry._CHOSEN) == {"manual"}
        assert kernellab.config.default_by == "queued"
        with pytest.raises(ValueError, match="'queued' or 'loop'"):
            with registry.default_rule("device"):
                pass
    finally:
        registry.clear_cache()


def test_explain_for_another_gpu_reads_its_table_and_its_architecture(tables):
    """`kernellab explain --gpu NAME` on a machine without that GPU: the choice from NAME's
    table, rows its table lacks from another table of the same architecture (its own
    table's capability, not this machine's), and a clear refusal for an unknown model."""
    import contextlib
    import io

    row = {"dtype": "fp32", "mode": "fwd", "shape": [4096], "key": [4096]}
    x = {"gpu": "Fake GPU X", "provenance": {"capability": "9.0"},
         "rows": [{**row, "op": "gelu", "best": "triton", "times": {"triton": 0.01, "torch": 0.02}}]}
    y = {"gpu": "Fake GPU Y", "provenance": {"capability": "9.0"},
         "rows": [{**row, "op": "add", "best": "torch",
                   "times": {"triton": 0.02, "torch": 0.01}}]}  # fmt: skip
    (tables / "Fake_GPU_X.json").write_text(json.dumps(x))
    (tables / "Fake_GPU_Y.json").write_text(json.dumps(y))
    table_files.clear()

    def explain(*argv):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            code = main(["explain", *argv])
        return code, buf.getvalue()

    code, out = explain("gelu", "-s", "4096", "--gpu", "Fake GPU X")
    assert code == 0 and "fwd on Fake GPU X" in out and "Fake_GPU_X.json" in out
    assert out.splitlines()[0].endswith(": triton") and "nearest row [4096]" in out
    code, out = explain("add", "-s", "4096", "--gpu", "Fake GPU X")
    assert code == 0 and out.splitlines()[0].endswith(": torch")
    assert "Fake GPU Y's table, same architecture" in out
    code, out = explain("gelu", "-s", "4096", "--gpu", "Fake GPU Z")
    assert code == 2 and "--gpu: no tuning table for 'Fake GPU Z'" in out and "'Fake GPU X'" in out
    table_files.clear()


def test_queued_ranking_is_the_default_and_loop_drops_the_device_rule(tables):
    """A row whose fastest kernel takes 20 us or more is ranked by device time (``by="queued"``,
    the default: in a step with work in flight its host cost hides); ``by="loop"`` and
    ``config.default_by = "loop"`` rank it by the larger of device and loop time, as a plain
    eager loop pays: a backend whose host cost is 9x its kernel loses there. "call", the
    default's name for one session, still means "queued"."""
    row = {"op": "gelu", "dtype": "fp32", "mode": "fwdbwd", "shape": [8192], "key": [8192], "best": "manual",
           "times": {"torch": 0.141, "manual": 0.602, "compile": 0.25},
           "device": {"torch": 0.075, "manual": 0.068, "compile": 0.09}}  # fmt: skip
    _write(tables, [row])
    assert choice.row_choice(row) == "manual" and choice.row_choice(row, "loop") == "torch"
    assert choice.deciding_times(row) is row["device"] and choice.deciding_times(row, "loop") is row["times"]
    assert kernellab.config.default_by == "queued"
    assert registry.choose_key("gelu", (8192,), torch.float32, "cpu", "fwdbwd")[0] == "manual"
    assert registry.choose_key("gelu", (8192,), torch.float32, "cpu", "fwdbwd", by="call")[0] == "manual"
    backend, why = registry.choose_key("gelu", (8192,), torch.float32, "cpu", "fwdbwd", by="loop")
    assert backend == "torch" and "the larger of device and loop time" in why
    for name, want in (("loop", "torch"), ("call", "manual")):
        with kernellab.config.override(default_by=name):
            registry.clear_cache()
            assert registry.choose_key("gelu", (8192,), torch.float32, "cpu", "fwdbwd")[0] == want
            by_device = registry.choose_key("gelu", (8192,), torch.float32, "cpu", "fwdbwd", by="device")
            assert by_device[0] == "manual"
    with kernellab.config.override(default_by="sometimes"):
        registry.clear_cache()
        with pytest.raises(ValueError, match="default_by"):
            registry.choose_key("gelu", (8192,), torch.float32, "cpu", "fwdbwd")
    registry.clear_cache()
    with pytest.raises(ValueError, match="'queued'"):
        registry.choose_key("gelu", (8192,), torch.float32, "cpu", by="plain")


def test_tune_at_your_own_shapes(tables, capsys):
    """`kernellab tune OP -s SHAPE ...`: a model's own shapes instead of a family; the rows
    land in the table like a family's, and the default then reads them. A shape with a zero
    or a family given too is refused, naming the argument."""
    argv = ["tune", "gelu", "-s", "5000", "-s", "12345", "-b", "torch,manual", "--device", "cpu",
            "--dtype", "fp32", "--budget", "0.05"]  # fmt: skip
    assert main(argv) == 0
    rows = [r for r in json.loads((tables / "cpu.json").read_text())["rows"] if r["op"] == "gelu"]
    assert sorted(tuple(r["shape"]) for r in rows) == [(5000,), (12345,)]
    assert all(set(r["times"]) == {"torch", "manual"} for r in rows)
    backend, why = registry.choose_key("gelu", (12345,), torch.float32, "cpu")
    assert "[12345]" in why and "distance 0.00" in why
    capsys.readouterr()
    assert main(["tune", "gelu", "-s", "0", "-b", "torch", "--device", "cpu"]) == 2
    assert "-s/--shape 0: dim 1 is 0: an empty problem has nothing to time" in capsys.readouterr().err
    assert main(["tune", "gelu", "-s", "4096", "-f", "small", "--device", "cpu"]) == 2
    assert "--shape and --family: give one" in capsys.readouterr().err
    with pytest.raises(ValueError, match="a family or shapes, not both"):
        tuner.tune("gelu", "small", [torch.float32], ["fwd"], device="cpu", shapes=[(4096,)])


def test_rebuild_table_keeps_the_provenance_of_the_rows_it_keeps(tmp_path):
    # a rebuild from one new file keeps the table's other rows, so their sources stay named
    from kernellab.harness import rebuild_table

    def write(name, shape, sha):
        rows = [{"op": "gelu", "dtype": "bf16", "mode": "fwd", "shape": shape, "status": "ok",
                 "gpu": "Fake GPU", "git_sha": sha, "backend": b, "median_ms": d, "effective_ms": d}
                for b, d in (("torch", 0.05), ("triton", 0.04))]  # fmt: skip
        path = tmp_path / name
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return str(path)

    out = str(tmp_path / "table.json")
    first, second = write("a.jsonl", "4096", "aaa"), write("b.jsonl", "65536", "bbb")
    assert rebuild_table.main([first, "--out", out]) == 0
    assert rebuild_table.main([second, "--out", out]) == 0
    prov = json.loads(open(out).read())["provenance"]
    assert prov["rebuilt_from"] == ["a.jsonl", "b.jsonl"] and prov["git_sha"] == "aaa,bbb"
    assert rebuild_table.main([first, "--out", out]) == 0  # given again: named once, last
    prov = json.loads(open(out).read())["provenance"]
    assert prov["rebuilt_from"] == ["b.jsonl", "a.jsonl"]


def test_rebuild_table_passes_over_verify_runs_older_than_the_tune(tmp_path):
    """--verify: paired rounds timed before the tune rows of the same case (or with no
    date, beside a dated tune) timed other code: their verdict is not applied; a newer run's
    is."""

    def tune_row(shape, b, d, e):
        return {"op": "gelu", "dtype": "bf16", "mode": "fwd", "shape": shape, "status": "ok", "gpu": "Fake GPU",
                "git_sha": "abc", "backend": b, "median_ms": d, "effective_ms": e,
                "time": "2026-12-05T10:00:00+00:00"}  # fmt: skip

    rows = [tune_row(s, b, d, e) for s in ("4096", "8192", "16384")
            for b, d, e in (("torch", 0.01, 0.03), ("triton", 0.008, 0.0301))]  # fmt: skip

    def verify_row(shape, b, rounds, time):
        row = {**tune_row(shape, b, 0.008, 0.03), "family": "small", "paired_rounds_ms": rounds}
        return {**row, "time": time} if time else {k: v for k, v in row.items() if k != "time"}

    slow, fast = [0.030, 0.040, 0.031], [0.024, 0.032, 0.025]  # torch 1.25x ahead each time
    vrows = [verify_row(shape, b, rounds, time)
             for shape, time in (("4096", "2026-12-06T09:00:00+00:00"), ("8192", "2026-11-27T03:28:00+00:00"),
                                 ("16384", None))
             for b, rounds in (("triton", slow), ("torch", fast))]  # fmt: skip
    table = _rebuild_with_verify(tmp_path, rows, vrows, "verify.jsonl")
    best = {r["shape"][0]: r for r in table["rows"]}
    assert best[4096]["best"] == "torch" and best[4096]["verified"]["was"] == "triton"
    assert best[8192]["best"] == "triton" and "verified" not in best[8192]
    assert best[16384]["best"] == "triton" and "verified" not in best[16384]


@pytest.mark.parametrize("gpu", ["NVIDIA H100 80GB HBM3", "NVIDIA H200"])
def test_committed_table_is_what_rebuild_table_makes_of_its_provenance(tmp_path, gpu):
    """A committed tuning table is `rebuild_table` of the files its provenance names
    (rebuilt_from, verified_by, rows_from_verify): no row edited by hand, none left behind
    by a rule that has since changed."""
    import pathlib

    from kernellab.core import tables
    from kernellab.harness import rebuild_table

    committed = json.loads(pathlib.Path(tables.table_path(gpu)).read_text())
    prov = committed["provenance"]
    res = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "results"
    out = tmp_path / "table.json"
    argv = [str(res / f) for f in prov["rebuilt_from"]] + ["--out", str(out)]
    if prov.get("verified_by"):
        argv += ["--verify", *(str(res / f) for f in prov["verified_by"])]
    if prov.get("rows_from_verify"):
        argv += ["--rows-from-verify", *(str(res / f) for f in prov["rows_from_verify"])]
    if prov.get("family_shapes_only"):
        argv.append("--family-shapes-only")
    assert rebuild_table.main(argv) == 0
    rebuilt = json.loads(out.read_text())
    assert len(rebuilt["rows"]) == len(committed["rows"])
    for got, want in zip(rebuilt["rows"], committed["rows"]):
        assert got == want, f"{want['op']} {want['dtype']} {want['mode']} {want['shape']}"
