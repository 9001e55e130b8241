"""float64 through the reference backends: every differentiable op the registry lists passes
torch.autograd.gradcheck through manual and torch (compile: one op, its compile is slow on
a CPU); every other backend refuses float64 with a TypeError naming the argument; the
check still judges fp32 / fp16 / bf16 only."""

from __future__ import annotations

import pytest
import torch

import kernellab
from kernellab.core import registry
from kernellab.core.spec import FLOAT_DTYPES, REFERENCE_DTYPES, get_spec, load_all
from kernellab.harness.check import check_impl

load_all()
# histogram counts integer keys (uint8/int32/int64): it has no float dtypes, so no float64
# twin; tests/ops/test_histogram.py refuses float keys there.
INTEGER_OPS = ("histogram",)
OPS = [op for op in registry.op_names() if op not in INTEGER_OPS]
DIFFERENTIABLE = [op for op in OPS if get_spec(op).grad_args]
REFERENCE = ("manual", "torch")


def _float_outputs(out):
    outs = out if isinstance(out, tuple) else (out,)
    return tuple(o for o in outs if o.is_floating_point())


def _gradcheck(op: str, backend: str, seed: int = 0) -> None:
    spec = get_spec(op)
    impl = registry.get(op, backend)
    args = list(spec.make_inputs(spec.bad_shape, torch.float64, "cpu", seed))
    wrt = [i for i in spec.grad_args if isinstance(args[i], torch.Tensor)]
    for i in wrt:
        args[i] = args[i].detach().requires_grad_()

    def f(*xs):
        full = list(args)
        for i, x in zip(wrt, xs):
            full[i] = x
        return _float_outputs(impl(*full))

    out = f(*[args[i] for i in wrt])
    assert all(o.dtype == torch.float64 for o in out), [o.dtype for o in out]  # computed in float64
    assert torch.autograd.gradcheck(f, [args[i] for i in wrt], eps=1e-6, atol=1e-5, rtol=1e-4)


def test_differentiable_ops_come_from_the_registry():
    assert len(DIFFERENTIABLE) >= 14 and "argmax" not in DIFFERENTIABLE
    assert {"gelu", "attention", "cross_entropy", "matmul", "conv2d", "layer_norm"} <= set(DIFFERENTIABLE)


@pytest.mark.parametrize("backend", REFERENCE)
@pytest.mark.parametrize("op", DIFFERENTIABLE)
def test_gradcheck_through_reference_backends(op, backend):
    _gradcheck(op, backend)


def test_gradcheck_through_compile():
    impl = registry.get("gelu", "compile")
    if impl.why_unavailable("cpu") is not None:
        pytest.skip(impl.why_unavailable("cpu"))
    _gradcheck("gelu", "compile")


@pytest.mark.parametrize("op", OPS)
def test_kernel_backends_refuse_float64_naming_the_argument(op):
    """Validation runs before any launch: the CUDA backends are tested here too."""
    spec = get_spec(op)
    args = spec.make_inputs(spec.bad_shape, torch.float64, "cpu", 1)
    first = spec.arg_names[0]
    for impl in registry.impls(op):
        if impl.dtypes is not None and torch.float64 in impl.dtypes:
            assert impl.backend in ("manual", "torch", "compile"), impl.name
            continue
        with pytest.raises(TypeError, match=rf"\b{first}\b has dtype torch.float64"):
            impl(*args)


def test_reference_backends_declare_float64_and_check_does_not_judge_it():
    for op in OPS:
        for backend in ("manual", "torch", "compile"):
            assert registry.get(op, backend).dtypes == REFERENCE_DTYPES, (op, backend)
        assert get_spec(op).dtypes == FLOAT_DTYPES  # what `kernellab check` runs
    rep = check_impl(registry.get("gelu", "torch"), torch.float64, device="cpu", quick=True)
    assert rep.status == "unavailable" and "not supported by the check" in rep.reason and not rep.cases


def test_mixed_float64_and_float32_arguments_are_refused():
    x = torch.randn(4, 33, dtype=torch.float64)
    w, b = torch.randn(33), torch.randn(33)
    with pytest.raises(TypeError, match="weight has dtype torch.float32 but x has torch.float64"):
        kernellab.layer_norm(x, w, b, backend="torch")
    with pytest.raises(TypeError, match=r"\bb\b has dtype torch.float32 but a has torch.float64"):
        kernellab.add(torch.randn(3, dtype=torch.float64), torch.randn(3), backend="manual")
