"""Input options (OpSpec.input_options): facts of a call's inputs that tables tell apart.
matmul's ``b_t`` (b is nn.Linear's ``W.t()``, not a [K, N] tensor) is the first."""

from __future__ import annotations

import json

import pytest
import torch

import kernellab
from kernellab.core import registry, shapes
from kernellab.core import tables as table_files
from kernellab.core.spec import get_spec, split_options
from kernellab.harness.bench import bench

SPEC = get_spec("matmul")


def _row(shape, best, options=None):
    times = {"torch": 1.0, "manual": 1.0}
    times[best] = 0.5
    row = {"op": "matmul", "dtype": "fp32", "mode": "fwd", "key": list(shapes.key_of_shape("matmul", shape)),
           "shape": list(shape), "times": times, "device": dict(times), "best": best}  # fmt: skip
    if options is not None:
        row["options"] = options
    return row


def _write(tables, rows):
    (tables / f"{table_files.gpu_slug('cpu')}.json").write_text(json.dumps({"gpu": "cpu", "rows": rows}))
    registry.clear_cache()


def test_b_t_is_read_from_the_arguments_and_spelled_only_when_set():
    w = torch.randn(6, 5)
    x = torch.randn(3, 5)
    assert SPEC.input_facts((x, w.t())) == (True,)
    assert SPEC.input_facts((x, w.t().contiguous())) == (False,)
    assert SPEC.input_facts((x, torch.randn(5, 6)[:, :4])) == (False,)  # a sliced [K, N]
    assert SPEC.input_facts((x, "not a tensor")) == (False,)
    assert shapes.option_key("matmul", {}, (x, w.t())) == "b_t=True"
    assert shapes.option_key("matmul", {}, (x, w.t().contiguous())) == ""  # as rows before b_t
    assert shapes.option_key("matmul", {"b_t": True}) == "b_t=True"  # a bench row's options
    assert shapes.without_input_options("matmul", "b_t=True") == ""
    assert split_options(SPEC, {"b_t": True, "activation": "relu"}) == ({"activation": "relu"}, {"b_t": True})


@pytest.mark.parametrize("shape", [(3, 5, 7), (2, 3, 5, 7)])
def test_inputs_with_b_t_are_a_weights_transpose(shape):
    a, b = SPEC.make_inputs(shape, torch.float32, "cpu", 0, b_t=True)
    k, n = shape[-1], shape[-2]
    assert b.shape[-2:] == (k, n) and b.stride(-2) == 1 and b.stride(-1) == k
    assert SPEC.input_facts((a, b)) == (True,)
    with pytest.raises(TypeError, match="unknown input options"):
        SPEC.make_inputs(shape, torch.float32, "cpu", 0, w_t=True)


def test_bench_times_both_layouts_and_never_passes_b_t_to_the_op():
    rows = bench("matmul", shapes=[(4, 6, 5)], dtypes=[torch.float32], modes=["fwd", "fwdbwd"],
                 backends=["torch", "manual"], budget_s=0.01, device="cpu")  # fmt: skip
    got = {(r["backend"], r["mode"], r.get("options", "")) for r in rows if r["status"] == "ok"}
    assert got == {
        (b, m, o) for b in ("torch", "manual") for m in ("fwd", "fwdbwd") for o in ("", "b_t=True")
    }


def test_rows_of_each_layout_speak_for_their_calls(tables):
    _write(tables, [_row((1, 64, 32), "torch", ""), _row((1, 64, 32), "manual", "b_t=True")])
    w = torch.randn(64, 32)
    x = torch.randn(1, 32)
    nt, why_nt = registry.choose("matmul", (x, w.t()), "cpu", "fwd")
    nn, why_nn = registry.choose("matmul", (x, w.t().contiguous()), "cpu", "fwd")
    assert (nt, nn) == ("manual", "torch"), (why_nt, why_nn)
    assert "b_t=True" in why_nt and "b_t" not in why_nn


def test_a_table_without_rows_of_the_layout_lends_the_others_and_says_so(tables):
    _write(tables, [_row((1, 64, 32), "manual")])  # rows written before b_t: no options
    w = torch.randn(64, 32)
    backend, why = registry.choose("matmul", (torch.randn(1, 32), w.t()), "cpu", "fwd")
    assert backend == "manual" and "no matmul rows with b_t=True" in why


def test_the_default_keeps_one_choice_per_layout(tables, monkeypatch):
    # the per-call cache (choice key and validation signature) tells the layouts apart
    _write(tables, [_row((1, 64, 32), "torch", ""), _row((1, 64, 32), "manual", "b_t=True")])
    ran = []
    for name in ("torch", "manual"):
        impl = registry.get("matmul", name)
        monkeypatch.setattr(impl, "fn", lambda *a, _f=impl.fn, _n=name, **k: (ran.append(_n), _f(*a, **k))[1])
    w = torch.randn(64, 32)
    x = torch.randn(1, 32)
    for _ in range(3):
        kernellab.matmul(x, w.t())
        kernellab.matmul(x, w.t().contiguous())
    assert ran == ["manual", "torch"] * 3
