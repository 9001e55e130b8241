"""kernellab.harness.host_cost on the CPU: rows for every backend that runs here, ratios to torch."""

from __future__ import annotations

import json

from kernellab.harness import host_cost as mod


def test_host_cost_script_writes_rows_with_ratios(tmp_path):
    assert mod.main(["--quick", "--ops", "add", "--out", str(tmp_path)]) == 0
    rows = [json.loads(line) for line in (tmp_path / "host_cost.jsonl").read_text().splitlines()]
    backends = {r["backend"] for r in rows}
    assert {"torch", "manual", "triton"} <= backends  # compile is skipped on the CPU
    for r in rows:
        assert r["op"] == "add" and r["size"] == "tiny" and r["mode"] == "fwd", r
        assert r["us_per_call"] > 0 and "git_sha" in r and "error" not in r, r
        assert r["vs_torch"] > 0 and r["within_bound"] in (True, False)
    torch_row = next(r for r in rows if r["backend"] == "torch")
    assert torch_row["vs_torch"] == 1.0 and torch_row["within_bound"] is True
