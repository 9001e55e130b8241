"""The dispatch core's contracts on the CPU: the choice is a pure function of the rows and
the usable backends, the one registration helper, and ``kernellab.config``."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import kernellab
from kernellab.core import choice
from kernellab.ops import _register
from kernellab.options import Config

ROW = {"op": "gelu", "dtype": "bf16", "mode": "fwd", "shape": [4096], "key": [4096], "best": "triton",
       "times": {"triton": 0.010, "torch": 0.020, "cuda": 0.015},
       "device": {"triton": 0.008, "torch": 0.019, "cuda": 0.005}}  # fmt: skip
TABLE = {"gpu": "X", "rows": [ROW]}


def _choose(table=TABLE, key=(4096,), dn="bf16", usable=("torch", "triton", "cuda"), **kw):
    kw.setdefault("preferred", "torch")
    return choice.choose(table, "X.json", "gelu", key, dn, "fwd", "", usable=frozenset(usable), **kw)


def test_the_nearest_rows_best_when_it_is_usable():
    backend, why = _choose()
    assert backend == "triton" and "X.json" in why and "nearest row [4096]" in why
    assert _choose(key=(8192,))[0] == "triton"  # one doubling away: near enough


def _gelu_row(n, times, best=None):
    return {"op": "gelu", "dtype": "bf16", "mode": "fwd", "shape": [n], "key": [n],
            "best": best or min(times, key=times.get), "times": times}  # fmt: skip


def test_away_from_a_tuned_shape_the_nearest_rows_decide_together():
    """The nearest row says triton by a hair; the two rows past it say cuda by far: cuda,
    and the why names each row used and the ranking. At a tuned shape its row alone
    decides."""
    rows = [_gelu_row(4096, {"triton": 1.00, "cuda": 1.01}),
            _gelu_row(2048, {"triton": 2.0, "cuda": 1.0}),
            _gelu_row(16384, {"triton": 8.0, "cuda": 4.0})]  # fmt: skip
    backend, why = _choose({"rows": rows}, key=(5000,))
    assert backend == "cuda"
    assert "nearest row [4096]" in why and "triton was fastest there" in why
    assert "[2048] (distance" in why and "[16384] (distance" in why and "cuda ranks first" in why
    assert _choose({"rows": rows}, key=(4096,))[0] == "triton"  # its own row
    # one near row: it decides alone (a row beyond NEAR never speaks)
    far = [rows[0], _gelu_row(4096 << 7, {"triton": 2.0, "cuda": 1.0})]
    backend, why = _choose({"rows": far}, key=(5000,))
    assert backend == "triton" and "ranks first" not in why


def test_the_other_alignment_class_speaks_only_where_the_calls_is_not_near():
    """An odd width's call reads odd rows; with none near it, the aligned rows near it
    speak before the vote over far rows (said in the why)."""
    rows = [_gelu_row(4096, {"triton": 2.0, "cuda": 1.0}),  # aligned, near 4095
            _gelu_row(1 << 22, {"triton": 1.0, "cuda": 2.0}),  # aligned, beyond NEAR
            _gelu_row(1 << 23, {"triton": 1.0, "cuda": 2.0})]  # (the vote: triton)  # fmt: skip
    backend, why = _choose({"rows": rows}, key=(4095,))
    assert backend == "cuda" and "nearest row [4096]" in why and "the other class's" in why
    # an odd row near: it speaks, and the aligned rows do not
    rows.append(_gelu_row(4099, {"triton": 1.0, "cuda": 3.0}))
    backend, why = _choose({"rows": rows}, key=(4095,))
    assert backend == "triton" and "nearest row [4099]" in why and "other class" not in why


def test_the_neighbours_respect_each_rows_own_choice_and_their_coverage():
    # a paired verify made torch the 2048 row's choice though its times favour triton: that
    # row counts for torch, and with the nearest row's torch, torch wins
    rows = [_gelu_row(4096, {"triton": 1.02, "torch": 1.0}),
            _gelu_row(2048, {"triton": 0.95, "torch": 1.0}, best="torch")]  # fmt: skip
    assert _choose({"rows": rows}, key=(3000,))[0] == "torch"
    # cuda timed only at the farthest, lightest row: under half the weight, not ranked
    rows = [_gelu_row(4096, {"triton": 1.0, "torch": 1.5}),
            _gelu_row(2048, {"triton": 1.0, "torch": 1.5}),
            _gelu_row(65536, {"triton": 3.0, "torch": 4.0, "cuda": 1.0})]  # fmt: skip
    backend, why = _choose({"rows": rows}, key=(3000,))
    assert backend == "triton" and "cuda" not in why.split("weighted geomean")[1]
    # by device time among some backends, the neighbours rank those alone
    assert _choose({"rows": rows}, key=(3000,), by="device", among=("torch",))[0] == "torch"


def test_by_device_picks_the_least_device_time_among_the_allowed():
    assert _choose(by="device")[0] == "cuda"
    assert _choose(by="device", among=("torch", "triton"))[0] == "triton"
    assert _choose(by="device", usable=("torch", "triton"))[0] == "triton"


def test_a_row_whose_best_is_not_usable_names_its_fastest_usable_backend():
    backend, why = _choose(usable=("torch", "cuda"))  # the row's best, triton, is not usable here
    assert backend == "cuda" and "triton, the fastest, is not usable here" in why
    assert _choose(usable=("torch",))[0] == "torch"


def test_the_small_rule_then_the_preference_decide_where_no_row_serves():
    assert _choose(table=None, small="cuda")[0] == "cuda"
    backend, why = _choose(table=None, small="triton", usable=("torch",))
    assert backend == "torch" and why.startswith("heuristic (no tuning table")
    assert _choose(key=(2**30,))[1].startswith("heuristic (no table row near")


def test_a_16_bit_call_reads_a_sibling_dtypes_rows():
    backend, why = _choose(dn="fp16")
    assert backend == "triton" and "its bf16 rows" in why
    assert _choose(dn="fp32")[1].startswith("heuristic")  # fp32 borrows no 16-bit rows


def test_the_choice_is_pure():
    # the same inputs give the same answer, and nothing it is given is changed
    import copy

    before = copy.deepcopy(TABLE)
    assert _choose() == _choose()
    assert TABLE == before
    with pytest.raises(ValueError, match="by: one of 'queued', 'loop', 'device'"):
        _choose(by="fast")


def test_the_registration_helper_takes_exactly_one_kind():
    with pytest.raises(ValueError, match="gelu/mine: give triton_kernels .* or module"):
        _register.register_builtin("gelu", "mine", lambda x: x, "neither")
    with pytest.raises(ValueError, match="gelu/mine"):
        _register.register_builtin(
            "gelu", "mine", lambda x: x, "both", triton_kernels=lambda d: [], module=object()
        )
    assert ("gelu", "mine") not in kernellab.registry._TABLE


def test_config_reads_its_variable_at_first_use_and_keeps_it(monkeypatch):
    cfg = Config()
    monkeypatch.setenv("KERNELLAB_ATTN_AUTOTUNE", "0")
    assert cfg.attn_autotune is False
    monkeypatch.setenv("KERNELLAB_ATTN_AUTOTUNE", "1")
    assert cfg.attn_autotune is False  # kept
    cfg.reset("attn_autotune")
    assert cfg.attn_autotune is True  # read again
    monkeypatch.delenv("KERNELLAB_CHECK_TARGETS", raising=False)
    assert cfg.check_targets is False  # the default
    with cfg.override(check_targets=True, attn_ws="0"):
        assert cfg.check_targets is True and cfg.attn_ws == "0"
    assert cfg.check_targets is False and cfg.attn_ws == "1"


def test_config_refuses_unknown_options_and_wrong_types():
    cfg = Config()
    with pytest.raises(AttributeError, match="no option 'autotune'; options: attn_autotune"):
        cfg.autotune = False
    with pytest.raises(AttributeError, match="no option 'nope'"):
        cfg.nope  # noqa: B018
    with pytest.raises(TypeError, match="kernellab.config.attn_autotune: expected bool, got 'no'"):
        cfg.attn_autotune = "no"
    with pytest.raises(AttributeError, match="no option 'x'"):
        cfg.reset("x")


def test_importing_kernellab_reads_no_switch_and_setting_one_later_works():
    # The variable set after `import kernellab`, before the first use, still takes effect.
    code = (
        "import os, kernellab\n"
        "os.environ['KERNELLAB_CHECK_TARGETS'] = '1'\n"
        "print(kernellab.config.check_targets)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELLAB_")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "True"


def test_linear_cross_entropys_default_never_stores_the_logits_past_the_small_size(monkeypatch):
    """A table row that found PyTorch's head + loss (the [N, V] logits stored) fastest at an
    LLM's shape does not make it the default there: the op promises the logits are never
    stored (OpSpec.default_excludes); at a launch-bound size it may."""
    from kernellab.core import registry, tables

    big, small = [4096, 2048, 128256], [64, 64, 256]
    rows = [{"op": "linear_cross_entropy", "dtype": "bf16", "mode": "fwdbwd", "shape": k, "key": k,
             "best": "torch", "times": {"torch": 1.0, "chunked": 1.5, "triton": 1.2}} for k in (big, small)]  # fmt: skip
    monkeypatch.setattr(tables, "gpu_of", lambda dev: "X")
    monkeypatch.setattr(tables, "load_table", lambda gpu: {"gpu": "X", "rows": rows})
    monkeypatch.setattr(registry, "usable", lambda op, dev: frozenset({"torch", "chunked", "triton"}))
    registry.clear_cache()
    try:
        import torch

        backend, why = registry.choose_key(
            "linear_cross_entropy", tuple(big), torch.bfloat16, "cuda", "fwdbwd"
        )
        assert backend == "triton" and "torch, the fastest, is not usable here" in why
        assert (
            registry.choose_key("linear_cross_entropy", tuple(small), torch.bfloat16, "cuda", "fwdbwd")[0]
            == "torch"
        )
    finally:
        registry.clear_cache()


def _vote_row(shape, best):
    """A fp32 gelu fwd row of ``shape`` won by ``best`` (cuda or torch), twice as fast."""
    times = {"cuda": 1.0, "torch": 2.0} if best == "cuda" else {"cuda": 2.0, "torch": 1.0}
    return {"op": "gelu", "dtype": "fp32", "mode": "fwd", "shape": list(shape), "key": list(shape),
            "best": best, "times": times}  # fmt: skip


def _vote(rows, key):
    usable = frozenset({"cuda", "torch"})
    return choice.choose(
        {"rows": rows}, "X.json", "gelu", key, "fp32", "fwd", "", usable=usable, preferred="torch"
    )


def test_a_far_shape_hears_the_rows_of_its_alignment_class():
    # four odd-width rows named torch, three aligned rows named cuda: an aligned far shape
    # follows the aligned rows, an odd one the odd rows
    odd = [(4096, 4097), (8191, 50257), (257, 65537), (605185, 197)]
    aligned = [(8192, 50304), (98304, 1024), (16, 128256)]
    rows = [_vote_row(s, "torch") for s in odd] + [_vote_row(s, "cuda") for s in aligned]
    backend, why = _vote(rows, (3000 * 64, 7000 * 64))  # aligned, far from every row
    assert backend == "cuda" and "3 of its 3 gelu fp32 fwd rows of its alignment class" in why
    assert _vote(rows, (3001 * 64 + 1, 7001 * 64 + 1))[0] == "torch"  # odd in both dims: the 4 odd rows


def test_the_alignment_class_is_the_widths_not_the_row_count():
    # the first dim counts rows (products, heads): 4097 rows of 4096 columns are aligned like
    # 4096 rows; a product is odd when any width (N, K) is, whatever M is
    assert choice._distance((4097, 4096), (4096, 4096)) < 0.01
    assert choice._distance((8192, 50257, 768), (4097, 4095, 1023)) < choice.NEAR
    assert choice._distance((8192, 50304, 768), (8192, 50257, 768)) == float("inf")
    assert choice._distance((7,), (8,)) == float("inf")  # a 1-D key is its own width
    # a GPT-2 LM head (odd vocabulary) with no near row hears the odd-width products
    odd = ((4097, 4095, 1023), (4095, 1023, 4097), (1000, 3000, 4999))
    aligned = ((1024, 3072, 768), (8192, 4096, 4096), (4096, 14336, 4096), (64, 256, 512))
    rows = [_vote_row(s, "cuda") for s in odd] + [_vote_row(s, "torch") for s in aligned]
    backend, why = _vote(rows, (65536, 50257, 768))
    assert backend == "cuda" and "3 of its 3 gelu fp32 fwd rows of its alignment class" in why
    assert _vote(rows, (65536, 50304, 768))[0] == "torch"


def test_a_row_speaks_only_for_calls_of_its_exact_dims():
    # attention-like keys (batch x heads, S_q, S_k, head dim): a near row at head dim 80
    # names cuda, a farther one at head dim 128 names torch; with the head dim exact, a
    # head-dim-128 call follows the 128 row, and a head dim no row has takes the nearest
    # row of any head dim, saying so
    def row(key, best):
        times = {"cuda": 1.0, "torch": 2.0} if best == "cuda" else {"cuda": 2.0, "torch": 1.0}
        return {"op": "attention", "dtype": "bf16", "mode": "fwd", "shape": list(key), "key": list(key),
                "best": best, "times": times}  # fmt: skip

    table = {"rows": [row((32, 2048, 2048, 80), "cuda"), row((128, 2048, 2048, 128), "torch")]}

    def pick(key, exact):
        return choice.choose(table, "X.json", "attention", key, "bf16", "fwd", "", usable=frozenset({"cuda", "torch"}),
                             preferred="torch", exact=exact)  # fmt: skip

    call = (32, 2048, 2048, 128)
    assert pick(call, ())[0] == "cuda"  # by summed log ratios the head-dim-80 row is nearer
    backend, why = pick(call, (3,))
    assert backend == "torch" and "nearest row [128, 2048, 2048, 128]" in why
    backend, why = pick((32, 2048, 2048, 96), (3,))
    assert backend == "cuda" and "nearest row [32, 2048, 2048, 80]" in why and "the nearest of any" in why
    assert "nearest of any" not in pick(call, (3,))[1]
    assert pick((32, 2048, 2048, 128 * 64), (3,))[1].startswith("heuristic (no table row near")


def test_attention_rows_match_on_the_head_dim():
    from kernellab.core.spec import get_spec

    spec = get_spec("attention")
    assert spec.key_exact == (3,)
    assert choice._distance((32, 2048, 2048, 80), (32, 2048, 2048, 128), spec.key_exact) == float("inf")


def test_a_row_speaks_only_for_calls_of_its_band():
    # matmul-like keys (M, N, K): a decode row (M = 16) names cuda, three M = 8192 rows name
    # torch. With M banded at 16, a 64-row call is never served by the decode row (it is
    # 4x away, within NEAR): no row of its band is near, so its band's rows vote; an 8-row
    # call still follows the decode row; a batched key bands its M (third from the end)
    def row(key, best):
        times = {"cuda": 1.0, "torch": 2.0} if best == "cuda" else {"cuda": 2.0, "torch": 1.0}
        return {"op": "matmul", "dtype": "bf16", "mode": "fwd", "shape": list(key), "key": list(key),
                "best": best, "times": times}  # fmt: skip

    big = [(8192, 4096, 4096), (8192, 14336, 4096), (8192, 6144, 4096)]
    table = {"rows": [row((16, 4096, 4096), "cuda")] + [row(k, "torch") for k in big]}
    bands = ((-3, (16,)),)

    def pick(key, bands):
        return choice.choose(table, "X.json", "matmul", key, "bf16", "fwd", "", usable=frozenset({"cuda", "torch"}),
                             preferred="cuda", bands=bands)  # fmt: skip

    assert pick((64, 4096, 4096), ())[0] == "cuda"  # unbanded: the decode row is nearest
    backend, why = pick((64, 4096, 4096), bands)
    assert backend == "torch" and "3 of its 3 matmul bf16 fwd rows of its alignment class and band" in why
    assert pick((8, 4096, 4096), bands)[0] == "cuda"
    assert choice._distance((2, 16, 64, 64), (2, 17, 64, 64), bands=bands) == float("inf")
    assert choice._distance((2, 16, 64, 64), (4, 16, 64, 64), bands=bands) == 1.0


def test_matmul_bands_its_rows_at_sixteen_rows():
    from kernellab.core.spec import get_spec

    assert get_spec("matmul").key_bands == ((-3, (16,)),)
    assert choice._band(16, (16,)) == 0 and choice._band(17, (16,)) == 1


def test_a_split_alignment_class_lets_every_row_vote():
    # aligned rows: 2 cuda, 2 torch (no majority, the same geometric means); odd rows: cuda
    wins = [((8192, 50304), "cuda"), ((98304, 1024), "cuda"), ((64, 256), "torch"), ((128, 1024), "torch"),
            ((4096, 4097), "cuda"), ((8191, 50257), "cuda")]  # fmt: skip
    rows = [_vote_row(s, b) for s, b in wins]
    backend, why = _vote(rows, (3000 * 64, 7000 * 64))
    assert backend == "cuda" and "4 of its 6 gelu fp32 fwd rows" in why and "alignment class" not in why
