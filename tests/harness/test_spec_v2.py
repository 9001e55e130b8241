"""OpSpec v2: ops whose arguments are not same-shape float tensors (a weight vector, an
integer output, keyword options). Two toy ops are defined here, checked and benchmarked
on the CPU, and planted mistakes in the new dimensions must be caught.

- ``kltoy_scale(x, w, *, shift=0.0) = x * w + shift`` with ``w`` of shape ``[x.shape[-1]]``;
- ``kltoy_argmax(x)``: index of the largest element of each row (int64 output).
"""

from __future__ import annotations

import pytest
import torch

from kernellab.core import registry
from kernellab.core import spec as sp
from kernellab.core.spec import BadInput, OpSpec, make_tensor
from kernellab.harness import bench as bn
from kernellab.harness.check import FAIL, PASS, check_impl

# --------------------------------------------------------------------------- toy ops


def _scale_inputs(shape, dtype, device, gen, layout, scale):
    x = make_tensor(shape, dtype, device, gen, layout, scale)
    if x is None:
        return None
    w = make_tensor((shape[-1],), dtype, device, gen, "contiguous", scale)
    return x, w


def _scale_validate(args, kwargs, devices):
    if len(args) != 2:
        raise TypeError(f"kltoy_scale() takes 2 tensor arguments (x, w), got {len(args)}")
    x, w = args
    for name, t in (("x", x), ("w", w)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"kltoy_scale: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in sp.FLOAT_DTYPES:
            raise TypeError(f"kltoy_scale: {name} has unsupported dtype {t.dtype}")
        if t.device.type not in devices:
            raise ValueError(f"kltoy_scale: {name} is on {t.device}; this backend runs on {devices}")
    if x.dim() == 0 or w.shape != (x.shape[-1],):
        raise ValueError(f"kltoy_scale: w must have shape [{x.shape[-1] if x.dim() else '?'}]")
    if w.dtype != x.dtype:
        raise TypeError("kltoy_scale: w must have the dtype of x")
    unknown = set(kwargs) - {"shift"}
    if unknown:
        raise TypeError(f"kltoy_scale() got unexpected keyword arguments {sorted(unknown)}")


def _scale_ref(x, w, shift=0.0):
    return x * w + shift


def _counts(shape, dtype_or_mode, mode=None, **options):
    n = 1
    for d in shape:
        n *= d
    return 3 * n


SCALE = OpSpec(
    name="kltoy_scale",
    arg_names=("x", "w"),
    reference=_scale_ref,
    flops=lambda shape, mode, **o: 2 * shape[0] * shape[-1],
    bytes_moved=lambda shape, dtype, mode, **o: 12 * shape[0] * shape[-1],
    test_shapes=[(3, 5), (1, 7)],
    quick_shapes=[(3, 5)],
    bench_shapes=[(64, 32)],
    cpu_bench_shapes=[(64, 32)],
    layout_shape=(6, 9),
    grad_args=(0, 1),
    inputs=_scale_inputs,
    validator=_scale_validate,
    option_sets=[{"shift": 1.5}],
    bench_options=[{}, {"shift": 2.0}],
    grad_shapes=[(6, 9)],
    bad_shape=(4, 3),
    extra_bad_inputs=[
        BadInput(
            "w of the wrong length",
            lambda device, dtype: ((torch.ones(2, 3, device=device), torch.ones(4, device=device)), {}),
            "w",
        )
    ],
)


def _argmax_ref(x):
    return torch.argmax(x, dim=-1)


ARGMAX = OpSpec(
    name="kltoy_argmax",
    arg_names=("x",),
    reference=_argmax_ref,
    flops=lambda shape, mode: shape[0] * shape[-1],
    bytes_moved=lambda shape, dtype, mode: 4 * shape[0] * shape[-1],
    test_shapes=[(3, 5), (4, 1)],
    quick_shapes=[(3, 5)],
    bench_shapes=[(64, 32)],
    cpu_bench_shapes=[(64, 32)],
    layout_shape=(6, 9),
    modes=("fwd",),
    specials=(),
)


@pytest.fixture
def toy_ops():
    sp.define(SCALE)
    sp.define(ARGMAX)
    names = []

    def reg(op, backend, fn):
        registry.register(op, backend)(fn)
        names.append((op, backend))
        return registry.get(op, backend)

    reg("kltoy_scale", "torch", lambda x, w, shift=0.0: x * w + shift)
    reg("kltoy_argmax", "torch", lambda x: torch.argmax(x, dim=-1))
    yield reg
    for op, backend in names:
        registry.unregister(op, backend)
    sp.SPECS.pop("kltoy_scale", None)
    sp.SPECS.pop("kltoy_argmax", None)


def _run(impl, **kw):
    return check_impl(impl, torch.float32, device="cpu", quick=False, seed=7, **kw)


# --------------------------------------------------------------------------- tests


def test_correct_toys_pass_every_stage(toy_ops):
    good = toy_ops("kltoy_scale", "good", lambda x, w, shift=0.0: (x.float() * w.float() + shift).to(x.dtype))
    rep = _run(good)
    assert rep.status == PASS, [(c.kind, c.name, c.detail) for c in rep.failures]
    kinds = {c.kind for c in rep.cases if c.status == PASS}
    assert {"shape", "rerun", "special", "layout", "option", "grad", "bad"} <= kinds
    assert any(c.kind == "option" and c.name == "shift=1.5" for c in rep.cases)
    assert any(c.name == "w of the wrong length" and c.status == PASS for c in rep.cases)

    good_arg = toy_ops("kltoy_argmax", "good", lambda x: torch.argmax(x.float(), dim=-1))
    rep = _run(good_arg)
    assert rep.status == PASS, [(c.kind, c.name, c.detail) for c in rep.failures]


def test_ignoring_an_option_fails_the_option_case(toy_ops):
    bad = toy_ops("kltoy_scale", "noshift", lambda x, w, shift=0.0: x * w)
    rep = _run(bad)
    assert rep.status == FAIL
    assert {c.kind for c in rep.failures} == {"option"}


def test_wrong_weight_gradient_fails(toy_ops):
    class WrongDw(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            ctx.save_for_backward(x, w)
            return x * w

        @staticmethod
        def backward(ctx, dy):
            x, w = ctx.saved_tensors
            return dy * w, (dy * x).sum(0) * 1.01  # dw 1% off

    bad = toy_ops("kltoy_scale", "wrongdw", lambda x, w, shift=0.0: WrongDw.apply(x, w) + shift)
    rep = _run(bad)
    assert any(c.kind == "grad" and "dw" in c.name for c in rep.failures), rep.failures


def test_integer_outputs_are_compared_exactly(toy_ops):
    off = toy_ops("kltoy_argmax", "offbyone", lambda x: (torch.argmax(x, dim=-1) + 1) % x.shape[-1])
    assert _run(off).status == FAIL
    wrong_dtype = toy_ops("kltoy_argmax", "int32", lambda x: torch.argmax(x, dim=-1).to(torch.int32))
    rep = _run(wrong_dtype)
    assert rep.status == FAIL and "dtype" in rep.failures[0].detail

    def unwritten(x):  # fresh output, last row never written: must not look right
        out = torch.empty(x.shape[:-1], dtype=torch.int64)
        if out.numel() > 1:
            out.view(-1)[:-1] = torch.argmax(x, dim=-1).view(-1)[:-1]
        return out

    assert _run(toy_ops("kltoy_argmax", "unwritten", unwritten)).status == FAIL


def test_validator_replaces_the_default_and_names_arguments(toy_ops):
    impl = registry.get("kltoy_scale", "torch")
    with pytest.raises(ValueError, match=r"\bw\b"):
        impl(torch.ones(2, 3), torch.ones(4))
    with pytest.raises(TypeError, match="unexpected keyword"):
        impl(torch.ones(2, 3), torch.ones(3), scale=2)
    assert torch.equal(impl(torch.ones(2, 3), torch.ones(3), shift=1.0), torch.full((2, 3), 2.0))


def test_bench_times_every_option_case_and_records_it(toy_ops):
    rows = bn.bench("kltoy_scale", ["torch"], dtypes=[torch.float32], modes=["fwd", "fwdbwd"], budget_s=0.05)
    assert [(r["mode"], r.get("options")) for r in rows] == [
        ("fwd", None),
        ("fwdbwd", None),
        ("fwd", "shift=2.0"),
        ("fwdbwd", "shift=2.0"),
    ]
    assert all(r["status"] == "ok" for r in rows), rows
    one = bn.bench("kltoy_scale", ["torch"], dtypes=[torch.float32], budget_s=0.05, options={"shift": 3})
    assert [r.get("options") for r in one] == ["shift=3"]


def test_bench_rejects_an_impl_that_ignores_the_benchmarked_option(toy_ops):
    toy_ops("kltoy_scale", "noshift", lambda x, w, shift=0.0: x * w)
    rows = bn.bench("kltoy_scale", ["noshift"], dtypes=[torch.float32], budget_s=0.05, options={"shift": 2.0})
    assert rows[0]["status"] == "rejected"


def test_bench_refresh_keeps_integer_inputs_integer(toy_ops):
    prob = bn.Problem(ARGMAX, (8, 5), torch.float32, "fwd", "cpu", 3)
    before = prob.expected[0].clone()
    prob.refresh()
    assert prob.expected[0].dtype == torch.int64
    assert not torch.equal(before, prob.expected[0]) or before.numel() < 2
