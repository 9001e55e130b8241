"""gelu: every registered implementation x odd shapes x dtypes, forward and gradient
against the float64 reference (judged by the 2 x PyTorch rule), hostile layouts, NaN/inf,
bad inputs, torch.compile, and the CUDA-only paths on a GPU.

Backends come from the registry (``kltest.backend_matrix``): on a CPU machine that is
manual, torch and triton (interpreter); cuda/cuda_v1 appear as ``gpu`` tests.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kernellab
from kernellab import triton_support
from kernellab.harness.compare import judge
from kltest import (
    BLOCK_EDGES,
    DTYPES,
    LAYOUTS,
    ODD_SHAPES,
    backend_matrix,
    block_edge,
    dtype_id,
    gpu_only_backends,
    impl_grads,
    reference_grads,
    seed_for,
    shape_id,
)

OP = "gelu"
SPEC = kernellab.get_spec(OP)
MATRIX = backend_matrix(OP)
ALL_BACKENDS = [i.backend for i in kernellab.impls(OP)]


def _torch_fn():
    return kernellab.get(OP, "torch").fn


def _baseline(backend, x):
    """PyTorch's own output on the same input (None for the torch backend itself, which
    is then held to the documented tolerance, as the check engine does)."""
    if backend == "torch":
        return None
    with torch.no_grad():
        return _torch_fn()(x)


def test_matrix_is_not_empty():
    # The registry must offer at least the baselines and one kernel of ours here.
    backends = {p.values[1] for p in MATRIX if p.values[0] == "cpu"}
    assert {"manual", "torch"} <= backends
    assert "cuda" in {p.values[1] for p in MATRIX if p.values[0] == "cuda"}


# --------------------------------------------------------------------------- forward


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", ODD_SHAPES, ids=shape_id)
@pytest.mark.parametrize("dev,backend", MATRIX)
def test_forward(dev, backend, shape, dtype):
    (x,) = SPEC.make_inputs(shape, dtype, dev, seed_for(OP, backend, shape, dtype))
    x_before = x.clone()
    y = kernellab.gelu(x, backend=backend)
    assert isinstance(y, torch.Tensor)
    assert y.shape == x.shape and y.dtype == dtype and y.device == x.device
    v = judge(y, SPEC.ref(x), dtype, _baseline(backend, x))
    assert v.ok, f"{backend} {shape} {dtype}: {v.detail} (err {v.err:.3g}, bound {v.bound:.3g})"
    assert torch.equal(x, x_before), "the input was modified"
    if y.numel():
        assert y.data_ptr() != x.data_ptr(), "the output aliases the input"


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("dev,backend", MATRIX)
def test_forward_nan_inf_extremes(dev, backend, dtype):
    (x,) = SPEC.make_inputs(SPEC.layout_shape, dtype, dev, seed_for(OP, backend, dtype, "special"))
    (x,) = SPEC.plant_specials((x,), seed_for("positions", dtype))
    assert torch.isnan(x).any() and torch.isinf(x).any()
    y = kernellab.gelu(x, backend=backend)
    ref = SPEC.ref(x)
    # As the formula (and PyTorch): gelu(nan) = nan, gelu(-inf) = nan, gelu(+inf) = +inf.
    assert torch.isnan(ref[torch.isneginf(x)]).all() and (ref[torch.isposinf(x)] == math.inf).all()
    v = judge(y, ref, dtype, _baseline(backend, x))
    assert v.ok, f"{backend} {dtype}: {v.detail}"


@pytest.mark.parametrize("dev,backend", MATRIX)
def test_gradient_at_nan_and_inf_follows_the_formula(dev, backend):
    """The documented choice: at x = +inf and -inf the gradient is NaN, as the float64
    reference (autograd of the formula: inf * 0) and PyTorch's gelu_backward give, not the
    limits 1 and 0; NaN stays NaN; large finite x keeps the limits. The check's NaN/inf
    parity rule, applied to the gradient: positions equal, finite values judged."""
    x = torch.tensor([float("inf"), -float("inf"), float("nan"), 1e4, -1e4, 60.0, -60.0, 0.5], device=dev)
    xg = x.clone().requires_grad_()
    (g,) = torch.autograd.grad(kernellab.gelu(xg, backend=backend), xg, torch.ones_like(x))
    x64 = x.double().requires_grad_()
    (ref,) = torch.autograd.grad(SPEC.reference(x64), x64, torch.ones_like(x64))
    assert torch.isnan(ref[:3]).all() and torch.isfinite(ref[3:]).all()
    assert torch.equal(torch.isnan(g), torch.isnan(ref)), (g, ref)
    torch.testing.assert_close(g[3:].double(), ref[3:], rtol=1e-5, atol=1e-6)


def test_forward_known_values():
    # Values of the tanh approximation computed independently (math.tanh in float64).
    x = torch.tensor([0.0, 1.0, -1.0, 3.0, -10.0], dtype=torch.float64)
    expected = torch.tensor(
        [0.0, 0.8411919906082768, -0.15880800939172324, 2.996362607918227, -0.0], dtype=torch.float64
    )
    torch.testing.assert_close(SPEC.ref(x), expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(
        SPEC.ref(x), torch.nn.functional.gelu(x, approximate="tanh"), rtol=1e-12, atol=1e-12
    )


# --------------------------------------------------------------------------- gradients


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", ODD_SHAPES, ids=shape_id)
@pytest.mark.parametrize("dev,backend", MATRIX)
def test_grad(dev, backend, shape, dtype):
    (x,) = SPEC.make_inputs(shape, dtype, dev, seed_for(OP, backend, shape, dtype, "grad"))
    gen = torch.Generator(device=dev).manual_seed(seed_for(shape, dtype, "dy"))
    dy = torch.randn(shape, generator=gen, device=dev).to(dtype)
    impl = kernellab.get(OP, backend)
    (dx,) = impl_grads(lambda t: kernellab.gelu(t, backend=backend), SPEC, (x,), dy)
    (ref_dx,) = reference_grads(SPEC, (x,), dy)
    base = None if backend == "torch" else impl_grads(_torch_fn(), SPEC, (x,), dy)[0]
    assert dx.shape == x.shape and dx.dtype == dtype
    v = judge(dx, ref_dx, dtype, base)
    assert v.ok, f"{impl.name} dx {shape} {dtype}: {v.detail} (err {v.err:.3g}, bound {v.bound:.3g})"


@pytest.mark.parametrize("dev,backend", MATRIX)
def test_grad_strided_dy_and_second_backward(dev, backend):
    dtype = torch.float32
    (x,) = SPEC.make_inputs((37, 1025), dtype, dev, seed_for(OP, backend, "dy strided"))
    gen = torch.Generator(device=dev).manual_seed(5)
    dy = torch.randn(37, 2050, generator=gen, device=dev)[:, ::2]  # non-contiguous grad_output
    assert not dy.is_contiguous()
    (ref_dx,) = reference_grads(SPEC, (x,), dy)
    base = impl_grads(_torch_fn(), SPEC, (x,), dy)[0]
    # .backward() twice accumulates: 2 x the gradient (the graph is rebuilt each time).
    leaf = x.detach().requires_grad_()
    for _ in range(2):
        kernellab.gelu(leaf, backend=backend).backward(dy)
    v = judge(leaf.grad / 2, ref_dx, dtype, base)
    assert v.ok, f"{backend}: {v.detail}"


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("edge", list(BLOCK_EDGES))
def test_triton_counts_around_a_block(device, edge, dtype):
    """The Triton backend at counts around its program size (fp32 4096, 16-bit 8192): a
    partial program alone, whole ones (unmasked), whole ones then a partial one; forward
    and gradient judged as test_forward and test_grad judge them."""
    if kernellab.get(OP, "triton").why_unavailable(device):
        pytest.skip("triton does not run here")
    n = block_edge(edge, triton_support.block_for(dtype.itemsize))
    test_forward(device, "triton", (n,), dtype)
    test_grad(device, "triton", (n,), dtype)


# --------------------------------------------------------------------------- layouts


def _check_layout(x, layout):
    if layout == "transposed":
        assert not x.is_contiguous() and x.stride()[-1] != 1
    elif layout == "sliced":
        assert not x.is_contiguous() and x.stride()[-1] == 2
    elif layout == "offset":
        assert x.is_contiguous() and x.storage_offset() == 1
    elif layout == "expanded":
        assert 0 in x.stride()


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dev,backend", MATRIX)
def test_non_contiguous_forward_and_grad(dev, backend, layout, dtype):
    """Transposed, sliced, storage offset 1 (misaligned) and expanded inputs are computed
    correctly (DESIGN.md allows a clear refusal; no built-in refuses)."""
    (x,) = SPEC.make_inputs(SPEC.layout_shape, dtype, dev, seed_for(OP, backend, layout, dtype), layout)
    _check_layout(x, layout)
    y = kernellab.gelu(x, backend=backend)
    v = judge(y, SPEC.ref(x), dtype, _baseline(backend, x))
    assert v.ok, f"{backend} {layout} {dtype} forward: {v.detail}"

    gen = torch.Generator(device=dev).manual_seed(seed_for(layout, dtype))
    dy = torch.randn(x.shape, generator=gen, device=dev).to(dtype)
    (dx,) = impl_grads(lambda t: kernellab.gelu(t, backend=backend), SPEC, (x,), dy)
    (ref_dx,) = reference_grads(SPEC, (x,), dy)
    base = None if backend == "torch" else impl_grads(_torch_fn(), SPEC, (x,), dy)[0]
    v = judge(dx, ref_dx, dtype, base)
    assert v.ok, f"{backend} {layout} {dtype} dx: {v.detail}"


@pytest.mark.parametrize("dev,backend", MATRIX)
def test_hand_made_views(dev, backend):
    """Views made by hand (not by OpSpec): a transposed 3-d slice with a storage offset,
    a negative-step-free column slice, and a 0-d tensor."""
    gen = torch.Generator(device=dev).manual_seed(11)
    base = torch.randn(4, 33, 20, generator=gen, device=dev) * 3
    views = {
        "permuted+offset": base[1:, 3:, :].permute(2, 0, 1),
        "column": base[:, 5, :],
        "every-third": base.view(-1)[1::3],
        "scalar": base[0, 0, 0],
    }
    for name, x in views.items():
        y = kernellab.gelu(x, backend=backend)
        v = judge(y, SPEC.ref(x), x.dtype, _baseline(backend, x))
        assert v.ok, f"{backend} {name}: {v.detail}"


# --------------------------------------------------------------------------- random shapes


@pytest.mark.parametrize("backend", [b for b in ("triton",) if b in ALL_BACKENDS])
@settings(
    max_examples=12,
    deadline=None,
    database=None,  # no .hypothesis/ folder in the repo
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    shape=st.lists(st.integers(min_value=0, max_value=70), min_size=1, max_size=3).map(tuple),
    dtype=st.sampled_from(DTYPES),
    seed=st.integers(min_value=0, max_value=2**20),
)
def test_random_shapes(device, backend, shape, dtype, seed):
    if kernellab.get(OP, backend).why_unavailable(device) is not None:
        pytest.skip(f"{backend} does not run on {device} here")
    (x,) = SPEC.make_inputs(shape, dtype, device, seed)
    v = judge(kernellab.gelu(x, backend=backend), SPEC.ref(x), dtype, _baseline(backend, x))
    assert v.ok, f"{shape} {dtype}: {v.detail}"


# --------------------------------------------------------------------------- bad inputs


def _x(dtype=torch.float32, device="cpu", shape=(33,)):
    return torch.randn(shape, device=device).to(dtype)


BAD = {
    "int32": (lambda: _x().to(torch.int32), TypeError, r"\bx\b.*dtype"),
    "int64": (lambda: torch.arange(10), TypeError, r"\bx\b.*dtype"),
    "float64": (lambda: _x(torch.float64), TypeError, r"\bx\b.*float64"),
    "bool": (lambda: _x() > 0, TypeError, r"\bx\b.*dtype"),
    "list": (lambda: [1.0, 2.0, 3.0], TypeError, r"\bx\b must be a torch\.Tensor, got list"),
    "numpy": (lambda: _x().numpy(), TypeError, r"\bx\b must be a torch\.Tensor"),
    "scalar": (lambda: 1.5, TypeError, r"\bx\b must be a torch\.Tensor, got float"),
}


@pytest.mark.parametrize("case", list(BAD))
@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_bad_input_names_the_argument(backend, case):
    """Validation happens before any launch, so it is tested for every backend here
    (the CUDA ones included, without a GPU)."""
    build, exc, pattern = BAD[case]
    if case == "float64" and torch.float64 in (kernellab.get(OP, backend).dtypes or ()):
        # the reference backends take float64 (tests/ops/test_float64.py): computed, not refused
        x = build()
        torch.testing.assert_close(kernellab.gelu(x, backend=backend), SPEC.reference(x))
        return
    with pytest.raises(exc, match=pattern):
        kernellab.gelu(build(), backend=backend)


@pytest.mark.parametrize("backend", gpu_only_backends(OP))
def test_cpu_tensor_to_gpu_only_backend_is_refused(backend):
    for dtype in DTYPES:
        with pytest.raises(ValueError, match=r"\bx\b is on cpu.*cuda"):
            kernellab.gelu(_x(dtype), backend=backend)


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_wrong_arity_and_keywords(backend):
    impl = kernellab.get(OP, backend)
    with pytest.raises(TypeError, match=r"gelu\(\) takes 1 tensor arguments \(x\), got 2"):
        impl(_x(), _x())
    with pytest.raises(TypeError, match=r"gelu\(\) takes 1 tensor arguments \(x\), got 0"):
        impl()
    # Keywords are checked after the tensors: give a tensor this backend accepts.
    dev = "cpu" if "cpu" in impl.devices else ("cuda" if torch.cuda.is_available() else None)
    if dev is not None:
        with pytest.raises(TypeError, match="unexpected keyword"):
            impl(_x(device=dev), approximate="none")


def test_bad_input_through_default_backend():
    with pytest.raises(TypeError, match=r"\bx\b"):
        kernellab.gelu(torch.arange(5))
    with pytest.raises(TypeError, match=r"\bx\b must be a torch\.Tensor"):
        kernellab.gelu([0.5, 1.0])


def test_spec_bad_inputs_are_refused_by_every_runnable_backend(device):
    """The OpSpec's own list of bad inputs (what `kernellab check` uses), through the
    public function."""
    from kernellab.harness.check import PASS, check_bad_input

    for impl in kernellab.impls(OP):
        runnable = impl.why_unavailable(device) is None
        for case in SPEC.bad_inputs():
            if case.needs_gpu and device != "cuda":
                continue
            if case.gpu_only and "cpu" in impl.devices:
                continue
            if case.dtype is not None and case.dtype in (impl.dtypes or ()):
                continue  # the reference backends take float64 (as check skips it)
            if not runnable and not case.gpu_only:
                continue
            res = check_bad_input(impl, case, device if runnable else "cpu", torch.float32)
            assert res.status == PASS, f"{impl.name} {case.name}: {res.detail}"


# --------------------------------------------------------------------------- torch.compile


def test_torch_compile_fullgraph_triton(device):
    """kernellab.gelu(backend="triton") is a torch.library custom op: it traces into one
    graph (fullgraph=True), forward and backward."""
    if kernellab.get(OP, "triton").why_unavailable(device):
        pytest.skip("triton does not run here")
    torch._dynamo.reset()

    @torch.compile(fullgraph=True)
    def f(x):
        return kernellab.gelu(x * 2.0, backend="triton") + 1.0

    x = torch.randn(3, 257, device=device, requires_grad=True)
    y = f(x)
    x64 = x.detach().double().requires_grad_()
    ref = SPEC.reference(x64 * 2.0) + 1.0
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5)
    dy = torch.randn_like(y)
    (dx,) = torch.autograd.grad(y, x, dy)
    (ref_dx,) = torch.autograd.grad(ref, x64, dy.double())
    torch.testing.assert_close(dx.double(), ref_dx, rtol=1e-5, atol=1e-5)


def test_compile_backend_fp32_quick(device):
    """The compile backend (torch.compile of manual) once, fp32, one shape: compiling is
    seconds on the CPU, so it stays out of the matrix above."""
    impl = kernellab.get(OP, "compile")
    if impl.why_unavailable(device):
        pytest.skip(impl.why_unavailable(device))
    (x,) = SPEC.make_inputs((129, 1000), torch.float32, device, 3)
    v = judge(kernellab.gelu(x, backend="compile"), SPEC.ref(x), torch.float32, _baseline("compile", x))
    assert v.ok, v.detail
    dy = torch.randn_like(x)
    (dx,) = impl_grads(impl.fn, SPEC, (x,), dy)
    v = judge(
        dx, reference_grads(SPEC, (x,), dy)[0], torch.float32, impl_grads(_torch_fn(), SPEC, (x,), dy)[0]
    )
    assert v.ok, v.detail


# --------------------------------------------------------------------------- GPU only


def _cuda_module():
    from kernellab.ops.gelu import cuda as gelu_cuda

    return gelu_cuda.MODULE


SFX = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("backend", ["cuda", "cuda_v1"])
def test_gpu_misaligned_offset_takes_the_scalar_kernel(backend, dtype):
    """A storage offset of one element is not 16-byte aligned: the vectorized backend must
    fall back to the one-element-per-thread kernel and still be right."""
    from kltest import launched_cuda_kernels

    sfx = SFX[dtype]
    for n in (1, 7, 1025, 4097):
        flat = torch.randn(n + 1, device="cuda").mul(3).to(dtype)
        x = flat[1:]
        assert x.data_ptr() % 16 != 0
        out = []
        ran = launched_cuda_kernels(lambda: out.append(kernellab.gelu(x, backend=backend)), "gelu_")
        assert ran == [f"gelu_fwd_v1_{sfx}"], ran
        v = judge(out[0], SPEC.ref(x), dtype, _baseline(backend, x))
        assert v.ok, f"{backend} n={n}: {v.detail}"
        xa = flat[:n].clone()  # aligned: the vectorized kernel for "cuda"
        ran = launched_cuda_kernels(lambda: kernellab.gelu(xa, backend=backend), "gelu_")
        # small tensors take the one-pack-per-thread vectorized kernel (see the width test)
        assert ran == [f"gelu_fwd_x1_{sfx}" if backend == "cuda" else f"gelu_fwd_v1_{sfx}"], ran
        # Backward with a misaligned x: the scalar backward kernel, right answer.
        leaf = x.detach().requires_grad_()
        dy = torch.randn(n, device="cuda").to(dtype)
        grads = []
        y = kernellab.gelu(leaf, backend=backend)
        ran = launched_cuda_kernels(lambda: grads.append(torch.autograd.grad(y, leaf, dy)[0]), "gelu_")
        assert ran == [f"gelu_bwd_v1_{sfx}"], ran
        (ref_dx,) = reference_grads(SPEC, (x,), dy)
        v = judge(grads[0], ref_dx, dtype, impl_grads(_torch_fn(), SPEC, (x,), dy)[0])
        assert v.ok, f"{backend} n={n} dx: {v.detail}"


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "cuda_v1"])
def test_gpu_large_and_tail_sizes(backend):
    """Every element written (output poisoned first), past 2^24 elements and with an
    n % 4 tail."""
    from kernellab.harness.check import poison_allocator

    for n in (2**24 + 3, 4097, 5):
        x = torch.randn(n, device="cuda") * 3
        poison_allocator((n,), torch.float32, "cuda")
        y = kernellab.gelu(x, backend=backend)
        torch.cuda.synchronize()
        v = judge(y, SPEC.ref(x), torch.float32, _baseline(backend, x))
        assert v.ok, f"{backend} n={n}: {v.detail}"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_gpu_vectorized_kernel_is_correct_for_any_grid(dtype):
    """The vectorized loop is grid-stride: a grid smaller than one tile per block (the
    host's choice) must still write every element."""
    mod = _cuda_module()
    sfx = SFX[dtype]
    n = 3 * 256 * 4 * 8 + 5  # several tiles plus a tail
    x = (torch.randn(n, device="cuda") * 3).to(dtype)
    ref = SPEC.ref(x)
    base = _torch_fn()(x)
    fwd = mod.kernel(f"gelu_fwd_{sfx}", ("ptr", "ptr", "i64"))
    for grid in (1, 2, 7):
        y = torch.full_like(x, float("nan"))
        fwd(grid, 256, x, y, n)
        torch.cuda.synchronize()
        v = judge(y, ref, dtype, base)
        assert v.ok, f"grid={grid}: {v.detail}"


@pytest.mark.gpu
def test_gpu_cuda_graph_capture():
    """The cuda backend launches on torch's current stream, so it captures into a CUDA
    graph; replay with new data in the captured input gives the new answer."""
    x = torch.randn(4096 + 5, device="cuda") * 3
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up (compile, load) outside capture
        for _ in range(2):
            kernellab.gelu(x, backend="cuda")
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = kernellab.gelu(x, backend="cuda")
    for seed in (1, 2):
        x.copy_(torch.randn(x.shape, device="cuda", generator=torch.Generator("cuda").manual_seed(seed)) * 3)
        y.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        v = judge(y, SPEC.ref(x), torch.float32, _torch_fn()(x))
        assert v.ok, v.detail


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "cuda_v1"])
def test_gpu_cuda_core_launch_path_gives_identical_results(backend, monkeypatch):
    """KERNELLAB_LAUNCH=core (cuda.core.launch instead of cuLaunchKernel) must give
    bit-identical forward and backward results. The variable is read when a Kernel is
    made, so the core path runs on a fresh Module of the same .cu file."""
    import cuda.core

    from kernellab.cuda.runtime import Module
    from kernellab.ops import _elementwise_cuda as elementwise
    from kltest import KEEP_ALIVE

    vec = backend == "cuda"
    x = torch.randn(3, 1001, device="cuda") * 3
    x_mis = (torch.randn(3 * 1001 + 1, device="cuda") * 3)[1:].view(3, 1001)
    dy = torch.randn_like(x)
    default = []
    for inp in (x, x_mis):
        leaf = inp.detach().requires_grad_()
        y = kernellab.gelu(leaf, backend=backend)
        (dx,) = torch.autograd.grad(y, leaf, dy)
        default += [y.detach(), dx]

    calls = []
    real_launch = cuda.core.launch
    monkeypatch.setattr(cuda.core, "launch", lambda *a, **k: (calls.append(1), real_launch(*a, **k))[1])
    monkeypatch.setattr(kernellab.config, "cuda_launch", "core")
    core_mod = Module(_cuda_module().path)
    KEEP_ALIVE.append(core_mod)
    core = []
    for inp in (x, x_mis):
        core += [
            elementwise.launch(core_mod, "gelu_fwd", [inp], vec),
            elementwise.launch(core_mod, "gelu_bwd", [dy, inp], vec),
        ]
    torch.cuda.synchronize()
    assert len(calls) == 4, "cuda.core.launch was not used"
    assert core_mod._kernels and all(k._use_core for k in core_mod._kernels.values())
    for a, b in zip(default, core, strict=True):
        assert torch.equal(a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_gpu_large_tensors_take_the_fat_vectorized_kernel(dtype):
    """From 8 fat blocks (256 threads x 4 packs) per SM up, the fp32 forward runs the
    kernel with 4 packs per thread, 16-bit ones the x1 kernel in 512-thread blocks; an
    odd tail still comes out right."""
    from kernellab.cuda.runtime import sm_count
    from kernellab.ops import _elementwise_cuda as ew
    from kltest import launched_cuda_kernels

    per_pack = 16 // torch.empty((), dtype=dtype).element_size()
    n = ew.FAT_MIN_BLOCKS_PER_SM * sm_count(0) * ew.THREADS * ew.UNROLL[1] * per_pack + 13
    x = torch.randn(n, device="cuda").mul(3).to(dtype)
    out = []
    ran = launched_cuda_kernels(lambda: out.append(kernellab.gelu(x, backend="cuda")), "gelu_")
    want = "gelu_fwd_f32" if dtype == torch.float32 else f"gelu_fwd_x1_{SFX[dtype]}"
    assert ran == [want], ran
    v = judge(out[0], SPEC.ref(x), dtype, _baseline("cuda", x))
    assert v.ok, v.detail


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=dtype_id)
def test_gpu_large_16bit_backward_takes_the_8_byte_kernel(dtype):
    """From W8_MIN_ELEMS up, the 16-bit backward runs gelu_bwd_w8 (8-byte packs); every
    element is written (output poisoned) and right, n % 4 tail included; fp32 keeps x1."""
    from kernellab.harness.check import poison_allocator
    from kernellab.ops import _elementwise_cuda as ew
    from kltest import launched_cuda_kernels

    n = ew.W8_MIN_ELEMS + 4 * 1000 + 3
    x = torch.randn(n, device="cuda").mul(3).to(dtype).requires_grad_()
    dy = torch.randn(n, device="cuda").to(dtype)
    grads = []

    def run():
        y = kernellab.gelu(x, backend="cuda")
        poison_allocator((n,), dtype, "cuda")
        grads.append(torch.autograd.grad(y, x, dy)[0])

    ran = launched_cuda_kernels(run, "gelu_bwd")
    assert ran == [f"gelu_bwd_w8_{SFX[dtype]}"], ran
    from kernellab.ops.gelu import gelu_reference

    x64 = x.detach().double().requires_grad_()
    ref = torch.autograd.grad(gelu_reference(x64), x64, dy.double())[0]
    xb = x.detach().requires_grad_()
    base = torch.autograd.grad(torch.nn.functional.gelu(xb, approximate="tanh"), xb, dy)[0]
    v = judge(grads[0], ref, dtype, base)
    assert v.ok, v.detail
    x32 = torch.randn(n, device="cuda", requires_grad=True)
    ran = launched_cuda_kernels(
        lambda: torch.autograd.grad(kernellab.gelu(x32, backend="cuda"), x32, torch.ones_like(x32)),
        "gelu_bwd",
    )
    assert ran == ["gelu_bwd_x1_f32"], ran
