"""Shape-aware defaults on the CPU: families, shape keys, `tune` writing a table, the
default reading it, `explain`, the fallback for a refused input, the notice for a GPU
with no table."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from kernellab import registry, tuning
from kernellab.cli import main
from kernellab.ops.spec import get_spec


@pytest.fixture
def tables(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELLAB_TABLES", str(tmp_path))
    tuning.clear_cache()
    yield tmp_path
    tuning.clear_cache()


def test_families_name_registered_ops_with_positive_shapes():
    ops = set(registry.op_names())
    for fam, per_op in tuning.FAMILIES.items():
        for op, shapes in per_op.items():
            assert op in ops, (fam, op)
            for s in shapes:
                assert all(isinstance(d, int) and d > 0 for d in s), (fam, op, s)
    assert (8192, 50257) in tuning.family_shapes("softmax", "gpt2")
    assert len(tuning.family_shapes("matmul")) == len(set(tuning.family_shapes("matmul")))
    with pytest.raises(ValueError, match="family: unknown 'gpt5'"):
        tuning.family_shapes("softmax", "gpt5")


@pytest.mark.parametrize(
    "op,shape",
    [("attention", (1, 2, 64, 32)), ("attention", (1, 2, 5, 7, 32)), ("matmul", (8, 16, 32)), ("gelu", (4096,)),
     ("layer_norm", (64, 256)), ("cross_entropy", (64, 100)), ("sum", (64, 256))],
)  # fmt: skip
def test_table_rows_and_calls_share_one_shape_key(op, shape):
    args = get_spec(op).make_inputs(shape, torch.float32, "cpu", 0)
    assert tuning.shape_key(op, args) == tuning.key_of_shape(op, shape)


def test_tune_writes_a_table_the_default_then_reads(tables, capsys):
    assert main(["tune", "gelu", "-f", "cpu-tiny", "-b", "torch,manual", "--device", "cpu", "--dtype", "fp32", "--budget", "0.05"]) == 0
    table = json.loads((tables / "cpu.json").read_text())
    rows = [r for r in table["rows"] if r["op"] == "gelu"]
    assert {tuple(r["shape"]) for r in rows} == {(4096,), (65537,)}
    for r in rows:
        assert set(r["times"]) == {"torch", "manual"} and r["best"] == min(r["times"], key=r["times"].get)
    assert table["provenance"]["git_sha"] and table["provenance"]["date"]
    backend, why = tuning.choose_key("gelu", (5000,), torch.float32, "cpu")
    assert backend == rows[0]["best"] and "cpu.json" in why and "[4096]" in why
    # far from every row: the heuristic, and it says so
    backend, why = tuning.choose_key("gelu", (2**30,), torch.float32, "cpu")
    assert backend == registry.default_backend("gelu", "cpu") and "no table row near" in why
    capsys.readouterr()
    assert main(["explain", "gelu", "-s", "5000", "--device", "cpu"]) == 0
    assert "cpu.json" in capsys.readouterr().out


def test_no_table_for_a_gpu_is_a_one_line_notice_then_heuristics(tables):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert tuning.load_table("NVIDIA Imaginary X1") is None
        assert tuning.load_table("NVIDIA Imaginary X1") is None
    notes = [str(w.message) for w in seen]
    assert len(notes) == 1 and "no tuning table for NVIDIA Imaginary X1" in notes[0] and "heuristics" in notes[0]


def test_a_malformed_table_is_refused_naming_its_path(tables):
    (tables / "cpu.json").write_text(json.dumps({"gpu": "cpu"}))
    tuning.clear_cache()
    with pytest.raises(ValueError, match="cpu.json: not a kernellab tuning table"):
        tuning.load_table("cpu")
