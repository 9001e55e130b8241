"""The liger peers' declared limits: rows wider than liger's one-block-per-row kernels take
are outside ``Impl.limits`` (check and bench report them as refused by design) and a call
is refused with a ValueError naming the argument, before liger is imported or launched
(liger itself raises a RuntimeError from inside its launch)."""

from __future__ import annotations

import pytest
import torch

from kernellab.core import registry
from kernellab.ops._peers import LIGER_MAX_ROW

W = LIGER_MAX_ROW


def _args(op, width, rows=2):
    x = torch.zeros(rows, width)
    w = torch.ones(width)
    return {
        "rms_norm": (x, w),
        "layer_norm": (x, w),
        "add_rms_norm": (x, x, w),
        "softmax": (x,),
        "swiglu": (x, x),
        "geglu": (x, x),
    }[op]


ROW_OPS = ("rms_norm", "layer_norm", "add_rms_norm", "softmax", "swiglu", "geglu")


@pytest.mark.parametrize("op", ROW_OPS)
def test_rows_wider_than_a_liger_block_are_outside_the_limits(op):
    impl = registry.get(op, "liger")
    opts = {"approximate": "tanh"} if op == "geglu" else {}
    assert impl.outside_limits(_args(op, W), opts) is None
    why = impl.outside_limits(_args(op, W + 1), opts)
    assert why and f"{W + 1}" in why and f"{W}" in why
    assert impl.outside_limits(_args(op, W + 1, rows=0), opts) is None  # empty: answered without liger


@pytest.mark.parametrize("op", ROW_OPS)
def test_a_wide_row_is_refused_naming_the_argument(op):
    fn = registry.get(op, "liger").fn  # (the registered call refuses CPU tensors first)
    kw = {"approximate": "tanh"} if op == "geglu" else {}
    name = "a" if op in ("swiglu", "geglu") else "x"
    with pytest.raises(ValueError, match=rf"{op} \(liger\): {name} has rows of {W + 1} elements"):
        fn(*_args(op, W + 1), **kw)


def test_a_one_dimensional_glu_input_is_one_row():
    impl = registry.get("swiglu", "liger")
    flat = torch.zeros(8 * (W + 1))
    assert "rows of" in impl.outside_limits((flat, flat), {})


def test_chunked_liger_peers_declare_no_row_limit():
    logits = torch.zeros(2, 128256)
    target = torch.zeros(2, dtype=torch.long)
    assert registry.get("cross_entropy", "liger").outside_limits((logits, target), {}) is None
    assert registry.get("linear_cross_entropy", "liger").limits is None
