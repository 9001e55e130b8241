"""The check engine must be hard to fool (DESIGN.md, "Correctness").

Deliberately wrong implementations are registered under throw-away backend names
(``planted`` fixture: always unregistered) and ``check_impl`` must fail them, in the case
kind that the planted mistake belongs to. The correct built-ins must pass, and the CUDA
backends are reported "compiled, not run" on a machine without a GPU.
"""

from __future__ import annotations

import json

import pytest
import torch

import kernellab
from kernellab.core import registry
from kernellab.core.spec import BadInput
from kernellab.harness import check as chk
from kernellab.harness.check import FAIL, PASS, REFUSED, SKIP, CaseResult, check_bad_input, check_impl
from kltest import DTYPES, dtype_id

OPS = ["gelu", "add"]
SEED = 1234


def _correct(op):
    """PyTorch's own op: the correct part that every planted mistake is built around."""
    return kernellab.get(op, "torch").fn


def _run(impl, dtype=torch.float32, seed=SEED, **kw):
    return check_impl(impl, dtype, device="cpu", quick=True, seed=seed, **kw)


def _failed(rep):
    return {(c.kind, c.name) for c in rep.failures}


def _failed_kinds(rep):
    return {c.kind for c in rep.failures}


def _passed(rep, kind):
    return [c for c in rep.cases if c.kind == kind and c.status == PASS]


def _contiguous_strides(shape):
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(strides))


# --------------------------------------------------------------------------- planted mistakes


def make_zeros(op):
    def zeros(*args):
        return torch.zeros_like(args[0])

    return zeros


def make_wrong_tail(op):
    c = _correct(op)

    def wrong_tail(*args):
        # A kernel that forgets the n % BLOCK remainder: the last 3 elements stay unwritten.
        y = c(*args)
        out = torch.empty_like(args[0], memory_format=torch.contiguous_format)
        if out.numel() > 3:
            out.view(-1)[:-3] = y.reshape(-1)[:-3]
        return out

    return wrong_tail


def make_ignores_strides(op):
    c = _correct(op)

    def ignores_strides(*args):
        # Reads the storage as if every input were contiguous (x.view(-1) semantics).
        return c(*[torch.as_strided(t, t.shape, _contiguous_strides(t.shape)) for t in args])

    return ignores_strides


def make_ignores_offset(op):
    c = _correct(op)

    def ignores_offset(*args):
        # Uses the storage's base pointer, not data_ptr(): wrong for a storage offset.
        return c(*[torch.as_strided(t, t.shape, t.stride(), 0) for t in args])

    return ignores_offset


def make_low_precision(low):
    def factory(op):
        c = _correct(op)

        def low_precision(*args):
            return c(*[t.to(low) for t in args]).to(args[0].dtype)

        return low_precision

    return factory


def make_cached(op):
    c = _correct(op)
    cache = {}

    def cached(*args):
        key = (tuple(args[0].shape), args[0].dtype)
        if key not in cache:
            cache[key] = c(*args).detach().clone()
        return cache[key].clone()

    return cached


def make_nan_unaware(op):
    c = _correct(op)

    def nan_unaware(*args):
        y = c(*args)
        return torch.where(torch.isnan(y), torch.zeros_like(y), y)

    return nan_unaware


def make_inf_unaware(op):
    c = _correct(op)

    def inf_unaware(*args):
        return torch.nan_to_num(c(*args), nan=float("nan"))  # +-inf -> +-max finite

    return inf_unaware


# --------------------------------------------------------------------------- forward mistakes


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("op", OPS)
def test_all_zeros_fails(planted, op, dtype):
    rep = _run(planted(op, "planted_zeros", make_zeros(op)), dtype)
    assert rep.status == FAIL
    assert {"shape", "rerun", "layout"} <= _failed_kinds(rep)
    assert ("shape", "1025") in _failed(rep) and ("shape", "129x1000") in _failed(rep)
    # The empty shape is trivially right, even for this one.
    assert any(c.kind == "shape" and c.name == "0" and c.status == PASS for c in rep.cases)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("op", OPS)
def test_wrong_tail_fails(planted, op, dtype):
    rep = _run(planted(op, "planted_tail", make_wrong_tail(op)), dtype)
    assert rep.status == FAIL
    failed = _failed(rep)
    # Every shape with more than 3 elements has an unwritten tail.
    assert {("shape", "1025"), ("shape", "129x1000"), ("rerun", "37x1025 #1")} <= failed, failed
    tail = [c for c in rep.failures if c.kind == "shape" and c.name == "129x1000"][0]
    assert "NaN where the reference is not" in tail.detail or "error" in tail.detail


@pytest.mark.parametrize("op", OPS)
def test_ignoring_strides_fails_the_layout_cases(planted, op):
    rep = _run(planted(op, "planted_strides", make_ignores_strides(op)))
    assert rep.status == FAIL
    assert _failed_kinds(rep) == {"layout"}, rep.failures
    assert {("layout", "transposed"), ("layout", "sliced"), ("layout", "expanded")} <= _failed(rep)
    # Contiguous inputs are fine: the mistake is caught by the layouts alone (quick
    # shapes, and in fp32 the shape past 65,535 rows).
    spec = kernellab.get_spec(op)
    assert len(_passed(rep, "shape")) == len(spec.quick_shapes) + (spec.rows_shape is not None)


@pytest.mark.parametrize("op", OPS)
def test_ignoring_the_storage_offset_fails_the_offset_case(planted, op):
    rep = _run(planted(op, "planted_offset", make_ignores_offset(op)))
    assert rep.status == FAIL
    args = kernellab.get_spec(op).arg_names
    assert {("layout", "offset")} | {("layout", f"{a}:offset") for a in args} <= _failed(rep), rep.failures
    # Besides the offsets, only the gradient of an expanded input fails: as_strided's
    # backward on a stride-0 input is wrong too (the planted function's own mistake).
    others = _failed(rep) - {("layout", "offset")} - {("layout", f"{a}:offset") for a in args}
    assert others <= {("layout", f"{a}:expanded d{a}") for a in args}, others


@pytest.mark.parametrize("low", [torch.bfloat16, torch.float16], ids=dtype_id)
@pytest.mark.parametrize("op", OPS)
def test_low_precision_fails(planted, op, low):
    """fp32 inputs computed in bf16 (or fp16) and cast back: far outside 2 x PyTorch's
    fp32 error."""
    rep = _run(planted(op, "planted_lowp", make_low_precision(low)(op)), torch.float32)
    assert rep.status == FAIL
    assert {"shape", "rerun", "layout", "grad"} <= _failed_kinds(rep)
    big = [c for c in rep.failures if c.kind == "shape" and c.name == "129x1000"][0]
    assert big.err > 10 * big.bound and "> bound" in big.detail


def test_low_precision_still_passes_in_its_own_dtype(planted):
    # Sanity of the previous test: the same function is right for bf16 inputs.
    rep = _run(planted("gelu", "planted_lowp", make_low_precision(torch.bfloat16)("gelu")), torch.bfloat16)
    assert rep.status == PASS, rep.failures


def test_fp32_is_checked_with_tf32_off_and_the_users_flags_come_back(planted):
    """check_impl runs every stage with TF32 off for cuDNN and cuBLAS (fp32 judged as fp32
    on both sides), and leaves the flags as the caller set them."""
    seen = []

    def gelu(x):
        seen.append((torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32))
        return torch.nn.functional.gelu(x.double(), approximate="tanh").to(x.dtype)

    impl = planted("gelu", "planted_flags", gelu, devices=("cpu",))
    old = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = True
    try:
        rep = _run(impl, torch.float32)
        assert rep.status == PASS, rep.failures
        assert seen and set(seen) == {(False, False)}
        assert (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32) == (True, True)
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = old


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("op", OPS)
def test_cached_output_fails_the_rerun(planted, op, dtype):
    rep = _run(planted(op, "planted_cached", make_cached(op)), dtype)
    assert rep.status == FAIL
    failed = _failed(rep)
    assert ("rerun", "37x1025 #2") in failed, failed
    # The first call at that shape was computed, so #1 passes: it is the cache that fails.
    assert ("rerun", "37x1025 #1") not in failed


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("op", OPS)
def test_nan_unaware_fails_the_special_case(planted, op, dtype):
    rep = _run(planted(op, "planted_nan", make_nan_unaware(op)), dtype)
    assert rep.status == FAIL
    assert _failed(rep) == {("special", "nan/inf/extremes")}, rep.failures
    assert "NaN of the reference missing" in rep.failures[0].detail


@pytest.mark.parametrize("op", OPS)
def test_inf_unaware_fails_the_special_case(planted, op):
    rep = _run(planted(op, "planted_inf", make_inf_unaware(op)))
    assert rep.status == FAIL
    assert _failed(rep) == {("special", "nan/inf/extremes")}, rep.failures
    assert "inf positions or signs differ" in rep.failures[0].detail


@pytest.mark.parametrize(
    "mistake,detail",
    [
        ("flattened", "shape ("),
        ("wrong dtype", "dtype torch.float32, expected torch.float16"),
        ("a list", "outputs, expected 1"),  # a list is read as several outputs
        ("raises", "raised RuntimeError"),
    ],
)
def test_wrong_output_type_shape_dtype_or_a_crash_fails(planted, mistake, detail):
    c = _correct("gelu")

    def wrong(x):
        if mistake == "flattened":
            return c(x).reshape(-1)
        if mistake == "wrong dtype":
            return c(x.float())
        if mistake == "a list":
            return c(x).tolist()
        raise RuntimeError("kernel launch failed")

    rep = _run(planted("gelu", "planted_out", wrong), torch.float16)
    assert rep.status == FAIL
    shape_fails = [c for c in rep.failures if c.kind == "shape" and c.name != "1"]
    assert shape_fails and all(detail in c.detail for c in shape_fails), shape_fails


def test_clear_refusal_of_a_layout_is_not_a_failure(planted):
    c = _correct("gelu")

    def contiguous_only(x):
        if not x.is_contiguous():
            raise ValueError("x must be contiguous")
        return c(x)

    rep = _run(planted("gelu", "planted_refuse", contiguous_only))
    assert rep.status == PASS, rep.failures
    refused = {c.name for c in rep.cases if c.status == REFUSED}
    # all inputs at once, then x alone (forward and gradient)
    assert refused == {"transposed", "sliced", "expanded", "x:transposed", "x:sliced", "x:expanded"}
    assert all("x must be contiguous" in c.detail for c in rep.cases if c.status == REFUSED)


# --------------------------------------------------------------------------- bad inputs


class _NoValidation(registry.Impl):
    """An Impl that skips the OpSpec validation every registered impl goes through."""

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)


def test_registered_impls_cannot_skip_validation(planted):
    # Why the next test needs _NoValidation: Impl.__call__ validates for every impl.
    impl = planted("gelu", "planted_plain", lambda x: x * 0 + 1)
    with pytest.raises(TypeError, match=r"\bx\b"):
        impl(torch.arange(3))


@pytest.mark.parametrize("op", OPS)
def test_accepting_bad_input_silently_fails(planted, op):
    impl = planted.impl(_NoValidation(op, "planted_noval", _correct(op), builtin=False))
    rep = _run(impl)
    assert rep.status == FAIL
    assert _failed_kinds(rep) == {"bad"}, rep.failures
    bad = {c.name: c.detail for c in rep.failures}
    assert bad["float64 (unsupported dtype)"] == "accepted bad input without an error"
    first = kernellab.get_spec(op).arg_names[0]
    assert bad["a list instead of a tensor"].startswith(f"error does not name {first!r}")
    if op == "add":
        assert bad["mismatched dtypes"] == "accepted bad input without an error"  # type promotion
        assert "mismatched shapes" in bad


def test_gpu_only_impl_accepting_cpu_tensors_fails_without_a_gpu(planted, monkeypatch):
    from kernellab import device as kl_device

    monkeypatch.setattr(kl_device, "has_cuda", lambda: False)
    impl = planted.impl(
        _NoValidation(
            "gelu",
            "planted_gpu_noval",
            _correct("gelu"),
            devices=("cuda",),
            precompile=lambda archs: [f"fake {a}" for a in archs],
            builtin=False,
        )
    )
    rep = _run(impl)
    assert rep.status == FAIL
    assert [(c.kind, c.status) for c in rep.cases] == [("compile", PASS), ("bad", FAIL)]
    assert rep.failures[0].name == "CPU tensor to a GPU-only backend"
    assert rep.failures[0].detail == "accepted bad input without an error"


@pytest.mark.gpu
def test_cpu_only_impl_passes_check_on_a_gpu_machine(planted):
    impl = planted("add", "planted_cpu_only", _correct("add"), devices=("cpu",))
    rep = check_impl(impl, torch.float32, device="cpu", quick=True, seed=SEED)
    assert rep.status == PASS, rep.failures


def test_precompile_error_fails(planted, monkeypatch):
    from kernellab import device as kl_device
    from kernellab.cuda.runtime import CudaError

    monkeypatch.setattr(kl_device, "has_cuda", lambda: False)

    def broken(archs):
        raise CudaError("NVRTC failed to compile broken.cu for sm_80:\nerror: expected a ';'")

    impl = planted("gelu", "planted_broken", _correct("gelu"), devices=("cuda",), precompile=broken)
    rep = _run(impl)
    assert rep.status == FAIL and rep.reason == "does not compile"
    assert [c.kind for c in rep.failures] == ["compile"]
    assert "NVRTC failed to compile broken.cu" in rep.failures[0].detail


def test_precompile_error_report_keeps_the_nvrtc_log(planted, monkeypatch):
    # Regression: the report once kept only the first line ("NVRTC failed to compile X
    # for sm_80:") and dropped the compiler's error that follows it.
    from kernellab import device as kl_device
    from kernellab.cuda.runtime import Module

    monkeypatch.setattr(kl_device, "has_cuda", lambda: False)
    broken = Module(source='extern "C" __global__ void k(float* y) { y[0] = not_declared; }')
    impl = planted(
        "gelu", "planted_broken_cu", _correct("gelu"), devices=("cuda",), precompile=broken.precompile
    )
    rep = _run(impl)
    assert rep.status == FAIL and rep.reason == "does not compile"
    assert "not_declared" in rep.failures[0].detail


def _case(arg="x", exc=(TypeError, ValueError)):
    return BadInput("fake case", lambda dev, dtype: ((torch.arange(3),), {}), arg, exc)


@pytest.mark.parametrize(
    "behaviour,status,detail",
    [
        (TypeError("gelu: x has dtype torch.int64; expected fp32"), PASS, "TypeError"),
        (ValueError("x is on cpu"), PASS, "ValueError"),
        (TypeError("unsupported dtype"), FAIL, "error does not name 'x'"),
        (TypeError("max(): bad input"), FAIL, "error does not name 'x'"),  # 'x' inside a word
        (TypeError("xs must be tensors"), FAIL, "error does not name 'x'"),
        (RuntimeError("x: CUDA error: illegal memory access"), FAIL, "expected TypeError/ValueError"),
        (AssertionError("x"), FAIL, "expected TypeError/ValueError"),  # assert is not validation
        (None, FAIL, "accepted bad input without an error"),
    ],
)
def test_check_bad_input_with_fake_impls(behaviour, status, detail):
    def fake(*args, **kwargs):
        if behaviour is not None:
            raise behaviour
        return args[0]

    res = check_bad_input(fake, _case(), "cpu", torch.float32)
    assert res.kind == "bad" and res.status == status, res.detail
    assert detail in res.detail


def test_check_bad_input_skips_a_case_it_cannot_build():
    def build(dev, dtype):
        raise RuntimeError("no CUDA device")

    res = check_bad_input(lambda *a: None, BadInput("mixed", build, "b"), "cpu", torch.float32)
    assert res.status == SKIP and "could not build" in res.detail


# --------------------------------------------------------------------------- gradients


class _WrongGeluGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return torch.nn.functional.gelu(x, approximate="tanh")

    @staticmethod
    def backward(ctx, dy):
        return dy  # the gradient of the identity, not of gelu


class _WrongAddGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b):
        return a + b

    @staticmethod
    def backward(ctx, dy):
        return dy, 2 * dy  # db is wrong


def test_wrong_gelu_gradient_fails_the_grad_case(planted):
    rep = _run(planted("gelu", "planted_grad", _WrongGeluGrad.apply))
    assert rep.status == FAIL
    # every case that takes a gradient: grad, the layouts (forward and gradient), the
    # re-call, the second derivative (d/dx of dy is zero, gelu's is not), and the run's
    # random draws
    assert _failed_kinds(rep) == {"grad", "layout", "recall", "double", "fuzz"}, rep.failures
    assert all(c.name.endswith(" dx") for c in rep.failures)
    assert {("grad", "37x1025 dx"), ("grad", "37x1025 strided dy dx")} <= _failed(rep)


def test_wrong_add_gradient_names_the_argument(planted):
    rep = _run(planted("add", "planted_grad", _WrongAddGrad.apply))
    assert rep.status == FAIL
    # (and the per-run random draws, "fuzz", which run the gradients too)
    assert {"grad"} <= _failed_kinds(rep) <= {"grad", "layout", "recall", "double", "fuzz"}, rep.failures
    # db names b; the second derivative's d/d(dy) of dy.va + 2 dy.vb is off through db too
    assert all(c.name.endswith(" db") or c.name == "backward ddy" for c in rep.failures)


def test_missing_autograd_fails_the_grad_case(planted):
    c = _correct("gelu")

    def detached(x):
        return c(x.detach())

    rep = _run(planted("gelu", "planted_nograd", detached))
    assert rep.status == FAIL
    assert {"grad"} <= _failed_kinds(rep) <= {"grad", "layout", "recall", "fuzz"}, rep.failures
    assert all("output does not require grad" in c.detail for c in rep.failures)


def test_declared_forward_only_skips_the_grad_case(planted):
    c = _correct("gelu")

    def forward_only(x):
        return c(x.detach())

    forward_only.differentiable = False
    rep = _run(planted("gelu", "planted_fwd_only", forward_only))
    assert rep.status == PASS, rep.failures
    grads = [c for c in rep.cases if c.kind == "grad"]
    assert len(grads) == 1 and grads[0].status == SKIP


# --------------------------------------------------------------------------- correct built-ins


# A baseline's deviation the check reports (docs/guide.md, "What checked means"): manual gelu's
# second derivative, autograd through its fp32 primitives (x*x*x, tanh), is 6-9x the
# error of PyTorch's fused formula on every seed tried (bound 2x), in fp32.
_MANUAL_GELU_DOUBLE = [("double", "backward dx")]


@pytest.mark.parametrize("backend", ["manual", "torch", "triton"])
@pytest.mark.parametrize("op", OPS)
def test_builtins_pass_fp32_quick(op, backend):
    impl = kernellab.get(op, backend)
    if impl.why_unavailable("cpu"):
        pytest.skip(impl.why_unavailable("cpu"))
    rep = _run(impl, seed=None)  # fresh random inputs, as `kernellab check` uses
    failures = rep.failures
    if (op, backend) == ("gelu", "manual"):
        failures = [c for c in failures if (c.kind, c.name) not in _MANUAL_GELU_DOUBLE]
    assert not failures, (rep.seed, rep.failures)
    kinds = {c.kind for c in rep.cases}
    assert {"shape", "rerun", "special", "layout", "grad", "integrity", "recall", "double", "bad"} <= kinds
    if impl.custom_ops and backend != "triton":
        assert [c.status for c in rep.cases if c.kind == "opcheck"] == [PASS] * len(impl.custom_ops)
    elif impl.custom_ops:  # quick mode: Triton's opcheck runs in 16-bit (skips_one_dtype_stages)
        assert not [c for c in rep.cases if c.kind == "opcheck"]
        half = [d for d in (impl.dtypes or kernellab.get_spec(op).dtypes) if d.itemsize == 2][0]
        rep16 = check_impl(impl, half, device="cpu", quick=True, seed=1, stages=("opchecks",))
        assert [c.status for c in rep16.cases] == [PASS] * len(impl.custom_ops), rep16.failures
    # nothing refused but double backward by the fused backward kernels (RuntimeError)
    refused = [c for c in rep.cases if c.status == REFUSED]
    assert [(c.kind, c.name) for c in refused] == ([("double", "backward")] if backend == "triton" else [])
    assert all("double backward (create_graph=True) is not supported" in c.detail for c in refused)
    worst = rep.worst_ratio
    assert worst is not None and 0 <= worst <= 1


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=dtype_id)
def test_triton_passes_half_dtypes_quick(dtype):
    impl = kernellab.get("gelu", "triton")
    if impl.why_unavailable("cpu"):
        pytest.skip(impl.why_unavailable("cpu"))
    rep = _run(impl, dtype)
    assert rep.status == PASS, rep.failures


def test_compile_backend_passes_fp32_quick():
    rep = _run(kernellab.get("gelu", "compile"))
    assert rep.status == PASS, rep.failures


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU report; on a GPU they run")
@pytest.mark.parametrize("backend", ["cuda", "cuda_v1"])
@pytest.mark.parametrize("op", OPS)
def test_cuda_backends_are_compiled_not_run_without_gpu(op, backend):
    rep = _run(kernellab.get(op, backend))
    assert rep.status == "compiled"
    assert rep.reason == "compiled, not run: no GPU"
    compile_cases = [c for c in rep.cases if c.kind == "compile"]
    assert len(compile_cases) == 1 and compile_cases[0].status == PASS
    assert compile_cases[0].name == "sm_80, sm_90"
    assert "sm_80 cubin" in compile_cases[0].detail and "sm_90 cubin" in compile_cases[0].detail
    bad = [c for c in rep.cases if c.kind == "bad"]
    assert [c.name for c in bad] == ["CPU tensor to a GPU-only backend"]
    assert bad[0].status == PASS
    # Nothing ran: no numerical case is reported as passed.
    assert not [c for c in rep.cases if c.kind in ("shape", "grad", "layout", "special")]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("backend", ["cuda", "cuda_v1", "triton"])
@pytest.mark.parametrize("op", OPS)
def test_gpu_backends_pass(op, backend, dtype):
    rep = check_impl(kernellab.get(op, backend), dtype, device="cuda", quick=False)
    assert rep.status == PASS, (rep.seed, rep.failures)
    assert {"shape", "rerun", "special", "layout", "grad", "bad", "opcheck"} <= {c.kind for c in rep.cases}


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
def test_gpu_planted_wrong_tail_fails_with_nan(planted, op):
    """On the GPU the caching allocator hands out the NaN-poisoned block: the unwritten
    tail reads NaN and the parity rule names it."""
    rep = check_impl(
        planted(op, "planted_tail", make_wrong_tail(op)), torch.float32, device="cuda", quick=True
    )
    assert rep.status == FAIL
    fails = [c for c in rep.failures if c.kind == "shape" and c.name == "129x1000"]
    assert fails and "NaN where the reference is not" in fails[0].detail


# --------------------------------------------------------------------------- driver


def test_check_driver_hooks_and_plan_size():
    started, results = [], []
    reps = chk.check(
        ops=["gelu", "add"],
        backends=["torch", "manual"],
        dtypes=[torch.float32, torch.float16],
        device="cpu",
        quick=True,
        seed=3,
        on_start=lambda impl, dtype: started.append((impl.name, dtype)),
        on_result=results.append,
    )
    assert (
        len(reps) == 8 == chk.plan_size(["gelu", "add"], ["torch", "manual"], [torch.float32, torch.float16])
    )
    assert len(started) == 8 and results == reps
    for r in reps:
        known = _MANUAL_GELU_DOUBLE if (r.op, r.backend, r.dtype) == ("gelu", "manual", "fp32") else []
        assert [(c.kind, c.name) for c in r.failures] == known, r.failures
    assert {(r.op, r.backend, r.dtype) for r in reps} == {
        (op, b, d) for op in ("gelu", "add") for b in ("torch", "manual") for d in ("fp32", "fp16")
    }
    row = json.loads(json.dumps(next(r for r in reps if r.backend == "torch").to_dict()))
    assert row["status"] == PASS and row["seed"] == 3 and row["device"] == "cpu" and row["cases"]
    assert {"layout", "integrity", "recall", "double"} <= {c["kind"] for c in row["cases"]}


def test_seed_is_reported_and_reproducible(planted):
    impl = planted("gelu", "planted_zeros", make_zeros("gelu"))
    r1, r2 = _run(impl, seed=77), _run(impl, seed=77)
    assert r1.seed == r2.seed == 77
    assert [(c.name, c.err) for c in r1.failures] == [(c.name, c.err) for c in r2.failures]
    r3 = check_impl(impl, torch.float32, device="cpu", quick=True)
    assert isinstance(r3.seed, int) and r3.status == FAIL


def test_unsupported_dtype_is_reported_unavailable():
    rep = check_impl(kernellab.get("gelu", "torch"), torch.float64, device="cpu", quick=True)
    assert rep.status == "unavailable" and "float64 not supported" in rep.reason and not rep.cases


def test_case_result_ratio():
    assert CaseResult("shape", "1", PASS, err=1.0, bound=4.0).ratio == 0.25
    assert CaseResult("shape", "1", PASS).ratio is None
    assert CaseResult("shape", "1", PASS, err=0.0, bound=0.0).ratio is None


def test_poison_allocator_is_a_no_op_for_empty_shapes():
    chk.poison_allocator((3, 0, 5), torch.float32, "cpu")  # must not raise
    chk.poison_allocator((4,), torch.float16, "cpu")


def test_plan_leaves_per_shape_builders_out_of_quick_cpu_and_keeps_one_dtype_on_a_gpu():
    """torch.compile builds per shape: the quick default runs it in its first dtype on a GPU,
    not at all without one; named (-b) or --full, in every dtype."""
    dts = [torch.float32, torch.float16, torch.bfloat16]

    def runs(**kw):
        return [(i.impl.backend, dtype_id(i.dtype), i.runs) for i in chk.plan(["add"], dtypes=dts, **kw)
                if i.impl.backend in ("compile", "torch")]  # fmt: skip

    cpu = runs(device="cpu")
    assert [r for r in cpu if r[0] == "compile"] == [("compile", d, "skipped") for d in ("fp32", "fp16", "bf16")]
    assert [r for r in cpu if r[0] == "torch"] == [("torch", d, "run") for d in ("fp32", "fp16", "bf16")]
    assert all(r[2] == "run" for r in runs(device="cpu", quick=False))
    if torch.cuda.is_available():
        gpu = [r for r in runs(device="cuda") if r[0] == "compile"]
        assert [r[2] for r in gpu] == ["run", "skipped", "skipped"]
    named = chk.plan(["add"], ["compile"], dts, device="cpu")
    assert [i.runs for i in named] == ["run"] * 3
    assert chk.plan_size(["add"], None, dts) == sum(i.runs != "skipped" for i in chk.plan(["add"], dtypes=dts))


def test_progress_scales_the_estimate_by_the_time_finished_items_took():
    now = [0.0]
    items = [chk.PlanItem(None, torch.float32, "run", e) for e in (2.0, 2.0, 4.0)]
    p = chk.Progress(items, clock=lambda: now[0])
    assert p.total == 8.0 and p.remaining == 8.0  # nothing done: the plan's estimate
    now[0] = 6.0
    p.finished(items[0])  # took 6 s where 2 were estimated: 3x slower than the plan
    assert p.done == 1 and p.remaining == pytest.approx(6.0 * 3)
    now[0] = 8.0
    p.finished(items[1])
    assert p.remaining == pytest.approx(4.0 * 8.0 / 4.0)
    p.finished(items[2])
    assert p.remaining == 0.0
    assert [chk.fmt_seconds(s) for s in (4.4, 59.6, 185, 3723)] == ["4 s", "1:00", "3:05", "1:02:03"]


def test_quick_mode_runs_per_argument_layouts_and_opcheck_in_one_dtype():
    """Quick mode: arg layouts and opcheck once per implementation, in 16-bit for Triton
    kernels (the cheapest to compile), in the first dtype otherwise, never for
    torch.compile (nor its random draws); --full: every dtype."""
    spec = kernellab.get_spec("relu")
    for backend, want in (("triton", torch.float16), ("torch", torch.float32)):
        impl = kernellab.get("relu", backend)
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            quick = chk._Runner(impl, spec, dtype, "cpu", 1, quick=True)
            full = chk._Runner(impl, spec, dtype, "cpu", 1, quick=False)
            assert quick.skips_one_dtype_stages() == (dtype != want), (backend, dtype)
            assert not full.skips_one_dtype_stages()
    comp = chk._Runner(kernellab.get("relu", "compile"), spec, torch.float32, "cpu", 1, quick=True)
    assert comp.skips_one_dtype_stages() and list(comp.fuzz()) == []
    assert not chk._Runner(kernellab.get("relu", "compile"), spec, torch.float32, "cpu", 1,
                           quick=False).skips_one_dtype_stages()  # fmt: skip
    rep = check_impl(kernellab.get("relu", "triton"), torch.float32, device="cpu", quick=True, seed=1,
                     stages=("arg_layouts", "opchecks"))  # fmt: skip
    assert rep.cases == []
    rep = check_impl(kernellab.get("relu", "triton"), torch.float16, device="cpu", quick=True, seed=1,
                     stages=("arg_layouts", "opchecks"))  # fmt: skip
    assert {c.kind for c in rep.cases} == {"layout", "opcheck"} and rep.status == PASS
