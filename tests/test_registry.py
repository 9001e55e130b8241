"""The registry: the one table of implementations, the public register decorator, and
default backend selection."""

from __future__ import annotations

import pytest
import torch

import kernellab
from kernellab.core import registry
from kernellab.harness.check import check_impl

BUILTIN = ["manual", "torch", "compile", "triton", "cuda", "cuda_v1"]


# --------------------------------------------------------------------------- lookups


def test_op_names_lists_the_ops():
    ops = [
        "add",
        "add_rms_norm",
        "argmax",
        "attention",
        "batch_norm2d",
        "bn_relu_pool2d",
        "conv2d",
        "cross_entropy",
        "geglu",
        "gelu",
        "histogram",
        "int4_weight_only_matmul",
        "int8_weight_only_matmul",
        "layer_norm",
        "linear_cross_entropy",
        "matmul",
        "max",
        "max_pool2d",
        "relu",
        "rms_norm",
        "rope",
        "softmax",
        "sum",
        "swiglu",
        "transpose",
    ]
    assert registry.op_names() == ops
    assert kernellab.op_names is registry.op_names and kernellab.op_names() == ops
    for op in registry.op_names():
        assert kernellab.get_spec(op).name == op


def test_public_api_names():
    for name in (
        "Impl",
        "add",
        "batch_norm2d",
        "gelu",
        "get",
        "get_spec",
        "impls",
        "op_names",
        "register",
        "sgd_step",
        "softmax",
        "unregister",
    ):
        assert name in kernellab.__all__ and callable(getattr(kernellab, name)), name
    assert kernellab.get is registry.get and kernellab.impls is registry.impls
    assert kernellab.register is registry.register and kernellab.unregister is registry.unregister


@pytest.mark.parametrize("op", ["gelu", "add"])
def test_impls_lists_builtins_in_display_order(op):
    rows = kernellab.impls(op)
    backends = [i.backend for i in rows]
    assert backends[: len(BUILTIN)] == BUILTIN
    assert all(i.op == op for i in rows)
    assert all(i.builtin for i in rows if i.backend in BUILTIN)
    assert all(i.description for i in rows), "every built-in describes itself"


def test_impls_without_op_lists_every_op():
    rows = kernellab.impls()
    assert {i.op for i in rows} == set(registry.op_names())
    assert [i.op for i in rows] == sorted(i.op for i in rows)


def test_get_returns_the_impl():
    impl = kernellab.get("gelu", "torch")
    assert isinstance(impl, registry.Impl)
    assert (impl.op, impl.backend, impl.name) == ("gelu", "torch", "gelu/torch")
    assert impl in kernellab.impls("gelu")
    x = torch.randn(10)
    torch.testing.assert_close(impl(x), torch.nn.functional.gelu(x, approximate="tanh"), rtol=0, atol=0)


def test_unknown_backend_error_lists_the_registered_ones():
    with pytest.raises(KeyError) as e:
        kernellab.get("gelu", "nope")
    msg = str(e.value)
    assert "'nope'" in msg and "'gelu'" in msg
    for b in BUILTIN:
        assert b in msg
    with pytest.raises(KeyError, match="no backend 'nope' for op 'gelu'"):
        kernellab.gelu(torch.randn(3), backend="nope")
    with pytest.raises(KeyError, match="no backend 'nope' for op 'add'"):
        kernellab.add(torch.randn(3), torch.randn(3), backend="nope")


def test_unknown_op_errors_name_the_op():
    with pytest.raises(KeyError, match=r"unknown op 'softmaxx'; known ops: add, (.*, )?argmax, attention"):
        kernellab.get_spec("softmaxx")
    with pytest.raises(KeyError, match=r"'softmaxx'.*registered: none"):
        kernellab.get("softmaxx", "torch")
    assert kernellab.impls("softmaxx") == []
    with pytest.raises(ValueError, match=r"unknown op 'softmaxx'; known ops: add, (.*, )?argmax, attention"):
        kernellab.register("softmaxx", "mine")
    with pytest.raises(ValueError, match=r"unknown op 'softmaxx'"):
        registry.add_impl(registry.Impl("softmaxx", "mine", lambda x: x))
    assert ("softmaxx", "mine") not in {(i.op, i.backend) for i in kernellab.impls()}


# --------------------------------------------------------------------------- availability


def test_why_unavailable_on_this_machine():
    has_cuda = torch.cuda.is_available()
    for impl in kernellab.impls():
        if impl.backend in ("manual", "torch", "compile"):
            assert impl.why_unavailable("cpu") is None, impl.name
        if tuple(impl.devices) == ("cuda",):  # cuda, cuda_v1, peers
            missing = impl.available() if impl.available is not None else None
            # a peer library absent here, or a C++ extension not built, says so first
            if missing and ("not installed" in missing or "not built" in missing):
                assert impl.why_unavailable("cpu") == missing
                continue
            if has_cuda:
                assert impl.why_unavailable("cpu") == "GPU-only backend"
                assert impl.why_unavailable("cuda") is None
            else:
                assert impl.why_unavailable("cpu") == "no GPU", impl.name
                assert impl.why_unavailable("cuda") == "no GPU", impl.name
                assert impl.why_unavailable() == "no GPU", impl.name


def test_triton_runs_under_the_interpreter_on_cpu_tensors():
    """On a machine without a GPU the Triton backends take CPU tensors (the interpreter);
    on a GPU machine they refuse them by design (triton_support.devices)."""
    from kernellab import device

    gpu = device.has_cuda()
    for op in registry.op_names():
        impl = kernellab.get(op, "triton")
        assert (impl.why_unavailable("cpu") is None) is not gpu, (op, impl.why_unavailable("cpu"))
        assert ("cpu" in impl.devices) is not gpu


def test_why_unavailable_reasons_of_hand_made_impls():
    fn = lambda x: x  # noqa: E731
    cpu_only = registry.Impl("gelu", "t_cpu_only", fn, devices=("cpu",))
    assert cpu_only.why_unavailable("cpu") is None
    assert cpu_only.why_unavailable("cuda") == "runs on cpu only"
    missing = registry.Impl("gelu", "t_missing", fn, available=lambda: "peer not installed")
    assert missing.why_unavailable("cpu") == "peer not installed"
    assert missing.why_unavailable("cuda") == "peer not installed"


def test_hand_made_impl_can_be_called_and_validates():
    # Regression: an Impl built by hand (not through register) once crashed on its
    # missing spec instead of validating.
    impl = registry.Impl("gelu", "t_unregistered", torch.nn.functional.relu)
    x = torch.randn(5)
    assert torch.equal(impl(x), torch.nn.functional.relu(x))
    with pytest.raises(TypeError, match=r"\bx\b"):
        impl(x.double())


# --------------------------------------------------------------------------- register


def user_gelu(x: torch.Tensor) -> torch.Tensor:
    """My GeLU: PyTorch's, through a user function."""
    return torch.nn.functional.gelu(x, approximate="tanh")


def test_register_user_impl_is_checked_like_a_builtin(device):
    name = "t_user_gelu"
    try:
        returned = kernellab.register("gelu", name)(user_gelu)
        assert returned is user_gelu, "the decorator returns the function unchanged"
        impl = kernellab.get("gelu", name)
        assert impl.fn is user_gelu and impl.builtin is False
        assert impl.description == "My GeLU: PyTorch's, through a user function."
        backends = [i.backend for i in kernellab.impls("gelu")]
        assert name in backends and backends.index(name) > backends.index("cuda_v1"), backends
        # The public function reaches it, with the same validation as every backend.
        x = torch.randn(100, device=device)
        assert torch.equal(kernellab.gelu(x, backend=name), user_gelu(x))
        with pytest.raises(TypeError, match=r"\bx\b"):
            kernellab.gelu(x.double(), backend=name)
        # And `check` treats it exactly like a built-in.
        for dtype in (torch.float32, torch.bfloat16):
            rep = check_impl(impl, dtype, device=device, quick=True, seed=1)
            assert rep.status == "pass", [c for c in rep.cases if c.status == "fail"]
            kinds = {c.kind for c in rep.cases}
            assert {"shape", "rerun", "special", "layout", "grad", "bad"} <= kinds
        # A user registration never becomes the default.
        assert registry.default_backend("gelu", device) != name
    finally:
        kernellab.unregister("gelu", name)
    with pytest.raises(KeyError):
        kernellab.get("gelu", name)
    assert name not in [i.backend for i in kernellab.impls("gelu")]


def test_register_user_add_with_keywords():
    name = "t_user_add"
    try:

        @kernellab.register("add", name, devices=("cpu",), dtypes=(torch.float32,), description="mine")
        def my_add(a, b):
            return a + b

        impl = kernellab.get("add", name)
        assert impl.devices == ("cpu",) and impl.dtypes == (torch.float32,) and impl.description == "mine"
        rep = check_impl(impl, torch.float32, device="cpu", quick=True, seed=2)
        # On a GPU machine the "tensors on different devices" case fails for every CPU-only
        # impl: a known src bug, pinned by test_check.py::test_cpu_only_impl_passes_check_on_a_gpu_machine.
        failures = [c for c in rep.failures if c.name != "tensors on different devices"]
        assert not failures and rep.cases
        assert all(c.status == "pass" for c in rep.cases if c.kind in ("shape", "grad", "layout"))
        rep = check_impl(impl, torch.float16, device="cpu", quick=True)
        assert rep.status == "unavailable" and rep.reason == "fp16 not supported by this backend"
    finally:
        kernellab.unregister("add", name)


def test_duplicate_registration_is_refused():
    with pytest.raises(ValueError, match=r"gelu/torch is already registered; pass replace=True"):
        kernellab.register("gelu", "torch")(user_gelu)
    # The built-in is untouched.
    assert kernellab.get("gelu", "torch").fn is not user_gelu
    assert kernellab.get("gelu", "torch").builtin is True


def test_replace_true_overrides_a_user_registration():
    name = "t_replace"
    try:
        kernellab.register("gelu", name)(user_gelu)
        with pytest.raises(ValueError, match="already registered"):
            kernellab.register("gelu", name)(torch.nn.functional.relu)
        kernellab.register("gelu", name, replace=True)(torch.nn.functional.relu)
        assert kernellab.get("gelu", name).fn is torch.nn.functional.relu
        assert [i.backend for i in kernellab.impls("gelu")].count(name) == 1
    finally:
        kernellab.unregister("gelu", name)


@pytest.mark.parametrize("bad", ["my-backend", "1st", "", "a b", "gelu/x", "naïve?", "tab\tname"])
def test_invalid_backend_names_are_refused(bad):
    with pytest.raises(ValueError, match="must be an identifier"):
        kernellab.register("gelu", bad)(user_gelu)
    assert bad not in [i.backend for i in kernellab.impls("gelu")]


def test_backend_name_with_trailing_newline_is_refused():
    # Regression: a `$`-anchored pattern also matches before a trailing newline.
    try:
        with pytest.raises(ValueError, match="must be an identifier"):
            kernellab.register("gelu", "t_newline\n")(user_gelu)
    finally:
        kernellab.unregister("gelu", "t_newline\n")


def test_invalid_devices_are_refused():
    with pytest.raises(ValueError, match=r"devices must hold 'cuda' and/or 'cpu', got 'tpu'"):
        kernellab.register("gelu", "t_tpu", devices=("tpu",))
    assert "t_tpu" not in [i.backend for i in kernellab.impls("gelu")]


def test_unregister_unknown_is_a_no_op():
    kernellab.unregister("gelu", "never_registered")
    kernellab.unregister("no_such_op", "x")
    assert [i.backend for i in kernellab.impls("gelu")][: len(BUILTIN)] == BUILTIN


def test_numbered_variants_sort_numerically():
    names = ["cuda_v10", "cuda_v2", "zz_peer", "aa_peer"]
    try:
        for n in names:
            kernellab.register("gelu", n, devices=("cuda",))(user_gelu)
        backends = [i.backend for i in kernellab.impls("gelu")]
        named = ["aa_peer", "numba", "numba_v1", "numba_v2", "zz_peer"]  # peers and Numba: by name
        assert backends == BUILTIN + ["cuda_v2", "cuda_v10"] + named
    finally:
        for n in names:
            kernellab.unregister("gelu", n)


# --------------------------------------------------------------------------- defaults


def _expected_default(op, device):
    for b in kernellab.get_spec(op).default_backends:
        if b == "triton" and device == "cpu":
            continue  # the interpreter is for correctness, never the default
        try:
            impl = kernellab.get(op, b)
        except KeyError:
            continue
        if impl.why_unavailable(device) is None:
            return b
    return "torch"


def test_default_backend_selection(device):
    assert kernellab.get_spec("gelu").default_backends == ("cuda", "triton", "torch")
    for op in ("gelu", "add"):
        for dev in ("cpu", device):
            assert registry.default_backend(op, dev) == _expected_default(op, dev)
    if torch.cuda.is_available():
        assert registry.default_backend("gelu", "cuda") == "cuda"
    else:
        # Triton runs here only under its interpreter: correct, slow, not the default.
        assert registry.default_backend("gelu", "cpu") == "torch"
        assert registry.default_backend("add", "cpu") == "torch"


def test_default_backend_falls_back_when_preferred_unavailable(monkeypatch):
    for op in ("gelu", "add"):
        for b in kernellab.get_spec(op).default_backends[:-1]:
            monkeypatch.setattr(kernellab.get(op, b), "available", lambda: "disabled by the test")
        assert registry.default_backend(op, "cpu") == "torch"
        assert registry.default_backend(op, "cuda") == "torch"
        assert kernellab.get(op, "triton").why_unavailable("cpu") == "disabled by the test"


def test_default_dispatch_follows_the_registry_table():
    """kernellab.gelu(x) without a backend runs whatever the table holds for the default
    backend of x's device, also after that entry is replaced or removed."""
    x = torch.randn(16)
    default = registry.default_backend("gelu", "cpu")
    original = kernellab.get("gelu", default)

    def marker(x):
        return torch.full_like(x, 42.0)

    try:
        kernellab.register("gelu", default, devices=("cpu",), replace=True)(marker)
        assert bool((kernellab.gelu(x) == 42.0).all()), "the default call did not use the new entry"
        registry.add_impl(original, replace=True)
        assert not bool((kernellab.gelu(x) == 42.0).any())
        if default != "torch":
            kernellab.unregister("gelu", default)
            y = kernellab.gelu(x)  # falls back to the next usable backend
            torch.testing.assert_close(y, torch.nn.functional.gelu(x, approximate="tanh"))
    finally:
        registry.add_impl(original, replace=True)
    assert kernellab.get("gelu", default) is original
    assert registry.default_backend("gelu", "cpu") == default


def _counting_validation(monkeypatch, op, backend):
    impl = registry.get(op, backend)
    inner = impl._validate or impl._validator()
    seen = []

    def counting(args, kwargs, devices):
        seen.append(tuple(getattr(a, "shape", None) for a in args))
        return inner(args, kwargs, devices)

    monkeypatch.setattr(impl, "_validate", counting)
    registry._forget_choices()
    return seen


def test_a_key_that_decides_validation_is_validated_once_then_trusted(monkeypatch):
    """softmax's validation reads only the tensor's type, dtype, device, shape and layout
    (``key_validates``): the default validates the first call at a key and runs the later
    ones directly; every other kind of call is still validated and refused as before."""
    assert kernellab.get_spec("softmax").key_validates
    backend = registry.default_backend("softmax", "cpu")
    seen = _counting_validation(monkeypatch, "softmax", backend)
    x = torch.randn(4, 33)
    want = torch.softmax(x, -1)
    for _ in range(3):
        torch.testing.assert_close(kernellab.softmax(x), want)
    assert seen == [(x.shape,)], "validated once, then trusted"
    x2 = torch.randn(4, 33) * 5  # the same key, other values
    torch.testing.assert_close(kernellab.softmax(x2), torch.softmax(x2, -1))
    assert len(seen) == 1
    # the same shape in another dtype is another key: validated, and refused every time
    for _ in range(2):
        with pytest.raises(TypeError, match="x has dtype torch.int32"):
            kernellab.softmax(x.int())
    # a sparse tensor of the trusted key's dtype and shape: the layout is checked apart
    with pytest.raises(TypeError, match="x has layout torch.sparse_coo"):
        kernellab.softmax(x.to_sparse())
    # more arguments than the op takes, through the registry at the trusted key
    with pytest.raises(TypeError, match="softmax\\(\\) takes 1 tensor argument"):
        registry.call("softmax", None, x, x)
    validated = len(seen)
    torch.testing.assert_close(kernellab.softmax(x), want)  # the key is still trusted
    assert len(seen) == validated


def test_keyword_and_multi_tensor_calls_are_trusted_only_with_the_validated_facts(monkeypatch):
    """Calls with keywords or several tensors are trusted only while every tensor's class,
    dtype, shape, device and layout and every keyword value (with its class) equal the
    validated call's; anything else is validated (and refused as before). cross_entropy,
    whose validation reads target's values, validates every call."""
    x = torch.randn(5, 7)
    seen = _counting_validation(monkeypatch, "sum", registry.default_backend("sum", "cpu"))
    for _ in range(3):
        torch.testing.assert_close(kernellab.sum(x, dim=0), x.sum(0))
    assert len(seen) == 1
    for _ in range(2):
        torch.testing.assert_close(kernellab.sum(x, dim=1), x.sum(1))
    assert len(seen) == 3, "another keyword value: validated"
    with pytest.raises(ValueError, match="dim"):
        kernellab.sum(x, dim=5)

    w, b = torch.randn(7), torch.randn(7)
    seen = _counting_validation(monkeypatch, "layer_norm", registry.default_backend("layer_norm", "cpu"))
    for _ in range(3):
        torch.testing.assert_close(kernellab.layer_norm(x, w, b), torch.nn.functional.layer_norm(x, (7,), w, b))
    assert len(seen) == 1
    w2 = torch.randn(7)  # another weight with the same facts: trusted
    torch.testing.assert_close(kernellab.layer_norm(x, w2, b), torch.nn.functional.layer_norm(x, (7,), w2, b))
    assert len(seen) == 1
    with pytest.raises(TypeError, match="weight has dtype torch.float64"):
        kernellab.layer_norm(x, w.double(), b)
    with pytest.raises(TypeError, match="weight has layout torch.sparse_coo"):
        kernellab.layer_norm(x, w.to_sparse(), b)
    with pytest.raises(ValueError, match="eps"):
        registry.call("layer_norm", None, x, w, b, eps=-1.0)

    q, k, v = (torch.randn(1, 2, 8, 16) for _ in range(3))
    kernellab.attention(q, k, v, causal=True)
    kernellab.attention(q, k, v, causal=True)
    with pytest.raises(TypeError, match="causal must be a bool"):
        registry.call("attention", None, q, k, v, causal=1)  # equal to True, not a bool

    assert not kernellab.get_spec("cross_entropy").key_validates
    logits, target = torch.randn(4, 10), torch.randint(0, 10, (4,))
    seen = _counting_validation(monkeypatch, "cross_entropy", registry.default_backend("cross_entropy", "cpu"))
    for _ in range(3):
        kernellab.cross_entropy(logits, target)
    assert len(seen) == 3
    with pytest.raises(ValueError, match="target"):
        kernellab.cross_entropy(logits, torch.full((4,), 10))


def test_a_trusted_call_whose_list_option_was_changed_in_place_is_validated_again():
    """The trusted path compares the validated call's option values: a list is compared by
    its items then, not as the same object (a caller may change it between calls)."""
    x, w = torch.randn(1, 2, 6, 6), torch.randn(3, 2, 3, 3)
    stride = [1, 1]
    for _ in range(2):
        kernellab.conv2d(x, w, stride=stride)
    stride[:] = [0, 0]
    with pytest.raises(ValueError, match="stride must be >= 1"):
        kernellab.conv2d(x, w, stride=stride)


KEY_VALIDATED = ["gelu", "relu", "softmax", "sum", "max", "argmax", "layer_norm", "rms_norm", "attention",
                 "matmul", "add", "conv2d", "max_pool2d", "batch_norm2d", "bn_relu_pool2d",
                 "swiglu", "geglu", "add_rms_norm", "transpose", "histogram",
                 "int8_weight_only_matmul", "int4_weight_only_matmul"]


def test_the_ops_declaring_key_validation_are_the_audited_ones():
    from kernellab.core.spec import SPECS, load_all

    load_all()
    assert sorted(n for n, sp in SPECS.items() if sp.key_validates) == sorted(KEY_VALIDATED)


@pytest.mark.parametrize("op", KEY_VALIDATED)
def test_ops_declaring_key_validation_refuse_their_bad_inputs_on_every_default_call(op):
    """The bad-input cases of each ``key_validates`` op, after good calls that made trusted
    cache entries (at the op's bad-input shape, and at each bad input's first tensor where
    it is a good one): twice each, through the default, each refused with its own error."""
    spec = kernellab.get_spec(op)
    assert spec.key_validates
    def fn(*args, **kwargs):  # the registry's level, where the bad cases are defined
        return registry.call(op, None, *args, **kwargs)

    good = spec.make_inputs(spec.bad_shape, spec.dtypes[0], "cpu", 0)  # (histogram: int keys)
    fn(*good)
    fn(*good)
    for bad in spec.bad_inputs():
        if bad.gpu_only or bad.needs_gpu:
            continue
        if bad.dtype is not None:  # float64: the CPU default is a reference backend, which takes it
            continue
        args, kwargs = bad.build("cpu", torch.float32)
        x = args[0]
        if len(spec.arg_names) == 1 and isinstance(x, torch.Tensor) and x.dtype in spec.dtypes and x.numel():
            try:
                fn(x)  # a trusted key where the bad input's key is the good one's
            except (TypeError, ValueError):
                pass  # the tensor itself is what is bad (max_pool2d's 3-d x)
        for _ in range(2):
            with pytest.raises(bad.exc):
                fn(*args, **kwargs)


def test_public_functions_default_backend_on_cpu():
    from kernellab.harness.compare import judge

    spec = kernellab.get_spec("gelu")
    (x,) = spec.make_inputs((3, 1000), torch.float32, "cpu", 0)
    y = kernellab.gelu(x)
    assert y.shape == x.shape and y.dtype == x.dtype and y.device.type == "cpu"
    default = registry.default_backend("gelu", "cpu")
    assert torch.equal(y, kernellab.gelu(x, backend=default))
    v = judge(y, spec.ref(x), torch.float32, torch.nn.functional.gelu(x, approximate="tanh"))
    assert v.ok, v.detail

    a, b = kernellab.get_spec("add").make_inputs((3, 1000), torch.float16, "cpu", 0)
    y = kernellab.add(a, b)
    assert y.dtype == torch.float16 and torch.equal(y, a + b)
    # Gradients flow through the default backend too.
    a.requires_grad_()
    kernellab.add(a, b).sum().backward()
    assert torch.equal(a.grad, torch.ones_like(a))


def test_compiled_default_is_pytorchs_op_for_every_op():
    """Inside a torch.compile graph backend=None runs PyTorch's op (Inductor fuses it with
    its neighbours) unless the op declares a backend measured faster there."""
    for op in registry.op_names():
        assert kernellab.get_spec(op).compiled_backends == ("torch",), op
        assert registry.compiled_backend(op, "cpu") == "torch", op


def test_compiled_default_traces_pytorchs_op_not_the_eager_choice(monkeypatch):
    """Eager default manual (a stand-in for a Python-launched CUDA kernel), compiled
    default torch: the traced graph holds F.gelu, not manual's formula."""
    spec = kernellab.get_spec("gelu")
    monkeypatch.setattr(spec, "default_backends", ("manual", "torch"))
    monkeypatch.setattr(registry, "_DEFAULTS", {})
    registry._forget_choices()
    assert registry.default_backend("gelu", "cpu") == "manual"
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    x = torch.randn(64)
    torch._dynamo.reset()
    out = torch.compile(lambda t: kernellab.gelu(t), backend=record, fullgraph=True)(x)
    torch.testing.assert_close(out, torch.nn.functional.gelu(x, approximate="tanh"))
    targets = [n.target for g in graphs for n in g.graph.nodes if n.op == "call_function"]
    assert torch.nn.functional.gelu in targets or torch._C._nn.gelu in targets, targets
    assert torch.erf not in targets and torch.tanh not in targets, targets
    registry._forget_choices()


@pytest.mark.parametrize("op", ["gelu", "relu", "softmax", "sum"])
def test_the_default_refuses_a_numpy_array_naming_x(op):
    # a numpy array's .device is a str: the default's device lookup must not trip on it,
    # so the validator's TypeError naming x is what the caller sees (as with a backend named)
    import numpy as np

    from kernellab.core import registry

    with pytest.raises(TypeError, match=r"\bx must be a torch.Tensor"):
        registry.call(op, None, np.ones((2, 3), np.float32))


def test_softmax_refuses_a_bool_dim():
    for dim in (False, True):
        with pytest.raises(ValueError, match="dim must be an int"):
            kernellab.softmax(torch.randn(3, 4), dim)


@pytest.mark.parametrize("op", kernellab.op_names())
def test_a_nested_tensor_is_refused_naming_the_argument(op):
    """A nested tensor of strided layout reports ``torch.strided`` but has no sizes: every
    CPU backend, named or chosen by default, refuses it with a TypeError naming the
    argument (PyTorch's own "NestedTensorImpl doesn't support sizes" was what users got)."""
    from kernellab.harness.check import check_bad_input

    spec = kernellab.get_spec(op)
    (case,) = [c for c in spec.bad_inputs() if c.name == "a nested tensor"]
    dtype = torch.float32 if torch.float32 in spec.dtypes else spec.dtypes[0]
    for impl in kernellab.impls(op):
        if "cpu" in impl.devices:
            res = check_bad_input(impl, case, "cpu", dtype)
            assert res.status == "pass", (impl.backend, res.detail)
    args, kwargs = case.build("cpu", dtype)
    for _ in range(2):  # the default: its first call at a key, then the cached path
        with pytest.raises(TypeError, match=rf"\b{spec.arg_names[0]}\b.*nested"):
            registry.call(op, None, *args, **kwargs)
