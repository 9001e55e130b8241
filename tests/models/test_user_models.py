"""`kernellab train hf / nanogpt --compare` (kernellab.models.user_models) on the CPU: the
argument errors, and a smoke run of tiny configs with each variant in its own process."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")


def test_train_hf_needs_compare_and_a_known_config(cli_run):
    code, out = cli_run("train", "hf", "--config", "llama")
    assert code == 2 and "--compare" in out
    code, out = cli_run("train", "hf", "--config", "bert", "--compare")
    assert code == 2 and "--config bert" in out and "llama" in out
    code, out = cli_run("train", "nanogpt", "--compare", "--mode", "graph")
    assert code == 2 and "--mode graph" in out


@pytest.mark.parametrize(("model", "variants", "config"), [("hf", "hf,kernellab", "gpt2"),
                                                           ("nanogpt", "torch,kernellab", None)])  # fmt: skip
def test_train_user_model_compare_runs_each_variant_in_its_own_process(cli_run, tmp_path, model, variants, config):
    out_path = tmp_path / "rows.jsonl"
    args = ["train", model, "--compare", "--variants", variants, "--out", str(out_path)]
    code, out = cli_run(*args, *(["--config", config] if config else []))
    assert code == 0, out
    rows = [json.loads(line) for line in out_path.read_text().splitlines()]
    assert [r["variant"] for r in rows] == variants.split(",")
    assert all(r["isolated"] and r["mode"] == "eager" and r["ms"] > 0 for r in rows)
    assert rows[0]["speedup"] == 1.0
    # the same weights and batch: the kernellab variant's loss is the reference's to rounding
    assert abs(rows[0]["loss"] - rows[1]["loss"]) < 1e-3 * abs(rows[0]["loss"])
    assert "each variant in its own process" in out
