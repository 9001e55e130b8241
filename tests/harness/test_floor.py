"""harness.floor: memory-bound cases timed beside a copy of their bytes."""

import json

import pytest

from kernellab.harness import floor, vendor_gap


def _row(own, vendor, copy, **case):
    base = {"op": "rms_norm", "shape": "8192x4096", "dtype": "bf16", "mode": "fwd", "options": "",
            "own": "triton", "vendor": "liger", "gpu": "G"}  # fmt: skip
    return floor.row_from_rounds({**base, **case}, own, vendor, copy)


def test_row_takes_the_median_of_paired_ratios():
    # round 2 is slow for both sides: the paired ratio ignores it, the medians do not mix rounds
    r = _row([10.0, 20.0, 10.0], [9.9, 19.8, 10.1], [9.8, 9.8, 9.8])
    assert r["own_vs_vendor"] == pytest.approx(0.99)
    assert r["vendor_over_copy"] == pytest.approx(10.1 / 9.8, abs=1e-4)
    assert r["own_median_ms"] == 10.0 and r["copy_median_ms"] == 9.8


@pytest.mark.parametrize(
    "own, vendor, copy, want",
    [
        ([10.0], [10.0], [9.9], "win"),  # ours as fast as the vendor
        ([10.05], [10.0], [9.9], "floor tie"),  # 0.5% behind a vendor 1% above the copy
        ([10.05], [10.0], [9.0], "loss"),  # the vendor 11% above the copy: room left
        ([10.5], [10.0], [10.0], "loss"),  # at the floor, but ours 5% behind
        ([4.7], [4.6], [2.5], "loss"),  # launch-bound small case: far above the copy
        ([10.05], [10.0], [10.5], "loss"),  # the vendor beats the copy: the copy is no floor there
    ],
)
def test_classify(own, vendor, copy, want):
    assert floor.classify(_row(own, vendor, copy)) == want


def test_summarize_keeps_the_last_ok_row_of_a_case():
    first = _row([10.5], [10.0], [10.0])
    second = _row([10.05], [10.0], [10.0])
    bad = {**second, "status": "error"}
    got = floor.summarize([first, second, bad])
    assert list(got.values())[0][0] == "floor tie"
    assert len(got) == 1


def test_table_cases_are_memory_bound_losses():
    cases = floor.table_cases("NVIDIA H200")
    assert cases, "the H200 table has memory-bound cases below 1.0x"
    ops = {c["op"] for c in cases}
    assert not ops & {"matmul", "attention", "linear_cross_entropy"}  # compute-bound (tflops)
    assert all(c["table_own_vs_vendor"] < 1.0 for c in cases)
    every = floor.table_cases("NVIDIA H200", ops=["rms_norm"], losing=False)
    assert len(every) > len([c for c in cases if c["op"] == "rms_norm"])
    assert {c["op"] for c in every} == {"rms_norm"}


def test_measure_times_both_backends_and_the_copy_on_the_cpu():
    case = {"op": "rms_norm", "shape": "8x64", "dtype": "fp32", "mode": "fwd", "options": "",
            "own": "triton", "vendor": "torch"}  # fmt: skip
    r = floor.measure(case, rounds=2, budget_s=0.01, device="cpu")
    assert r["status"] == "ok", r
    assert len(r["own_ms"]) == len(r["vendor_ms"]) == len(r["copy_ms"]) == 2
    # the round's copy is the faster of the two references
    assert r["copy_ms"] == [min(a, b) for a, b in zip(r["memcpy_ms"], r["elementwise_ms"])]
    assert r["bytes"] > 8 * 64 * 4  # x read and y written at least
    assert floor.classify(r) in ("win", "floor tie", "loss")


def test_measure_refuses_a_wrong_backend(monkeypatch):
    from kernellab.core import registry

    real = registry.get

    def planted(op, backend):
        impl = real(op, backend)
        if backend != "triton":
            return impl

        class Wrong:
            def __call__(self, *a, **k):
                return impl(*a, **k) * 1.5

        return Wrong()

    monkeypatch.setattr(registry, "get", planted)
    case = {"op": "rms_norm", "shape": "8x64", "dtype": "fp32", "mode": "fwd", "options": "",
            "own": "triton", "vendor": "torch"}  # fmt: skip
    r = floor.measure(case, rounds=1, budget_s=0.01, device="cpu")
    assert r["status"] == "error" and "own (triton)" in r["reason"]


def test_vendor_gap_counts_floor_ties(tmp_path):
    cases = floor.table_cases("NVIDIA H200", ops=["rms_norm"])
    tie = {**cases[0], "gpu": "NVIDIA H200"}
    loss = {**cases[1], "gpu": "NVIDIA H200"}
    f = tmp_path / "floor.jsonl"
    rows = [
        floor.row_from_rounds(tie, [10.05], [10.0], [9.95]),
        floor.row_from_rounds(loss, [10.5], [10.0], [8.0]),
    ]
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = vendor_gap._table_report(["NVIDIA H200"], ["rms_norm"], False, [str(f)])
    n = len(cases)
    assert f"of the {n} cases below 1.0x, 2 memory-bound ones timed beside a copy" in text
    assert "1 ties at the copy floor" in text and "1 losses" in text


def test_cli_summarize(tmp_path, capsys):
    f = tmp_path / "floor.jsonl"
    f.write_text(json.dumps(_row([10.05], [10.0], [9.95])) + "\n")
    assert floor.main(["--summarize", str(f)]) == 0
    out = capsys.readouterr().out
    assert "floor tie" in out and "win: 0, floor tie: 1, loss: 0 (of 1 cases)" in out


@pytest.mark.gpu
def test_gpu_copy_floor_is_below_a_norm_and_both_sides_are_checked():
    case = {"op": "rms_norm", "shape": "8192x4096", "dtype": "bf16", "mode": "fwd", "options": "",
            "own": "triton", "vendor": "torch"}  # fmt: skip
    r = floor.measure(case, rounds=3, budget_s=0.05)
    assert r["status"] == "ok", r
    assert r["gpu"] and r["bytes"] >= 2 * 8192 * 4096 * 2
    # the copy moves the same bytes with no arithmetic and one launch: not slower than a norm
    # (a 10% margin for the rounds' noise)
    assert r["copy_median_ms"] <= 1.1 * min(r["own_median_ms"], r["vendor_median_ms"])


def test_options_from_str_inverts_options_str():
    from kernellab.core.spec import options_from_str, options_str

    opts = {"b_t": True, "causal": False, "eps": 1e-05, "n": 3, "reduction": "sum", "x": None}
    assert options_from_str(options_str(opts)) == opts
    assert options_from_str("") == {}
    with pytest.raises(ValueError, match="KEY=VALUE"):
        options_from_str("causal")


@pytest.mark.parametrize("module", ["floor", "vendor_gap"])
def test_summarize_names_a_missing_file(module, tmp_path, capsys):
    import importlib

    main = importlib.import_module(f"kernellab.harness.{module}").main
    with pytest.raises(SystemExit) as e:
        main(["--summarize", str(tmp_path / "none.jsonl")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--summarize: no such file: " in err and "none.jsonl" in err, err
