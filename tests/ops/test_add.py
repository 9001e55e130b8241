"""add: every registered implementation x odd shapes x dtypes, forward and both
gradients against the float64 reference, hostile layouts (also mixed between a and b),
NaN/inf, bad inputs (mismatched shapes and dtypes included), torch.compile, and the
CUDA-only paths on a GPU.
"""

from __future__ import annotations

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
    rounds_like_torch,
    seed_for,
    shape_id,
)

OP = "add"
SPEC = kernellab.get_spec(OP)
MATRIX = backend_matrix(OP)
ALL_BACKENDS = [i.backend for i in kernellab.impls(OP)]


def _torch_fn():
    return kernellab.get(OP, "torch").fn


def _baseline(backend, a, b):
    if backend == "torch":
        return None
    with torch.no_grad():
        return _torch_fn()(a, b)


def test_matrix_is_not_empty():
    backends = {p.values[1] for p in MATRIX if p.values[0] == "cpu"}
    assert {"manual", "torch"} <= backends
    assert "cuda" in {p.values[1] for p in MATRIX if p.values[0] == "cuda"}


# --------------------------------------------------------------------------- forward


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", ODD_SHAPES, ids=shape_id)
@pytest.mark.parametrize("dev,backend", MATRIX)
def test_forward(dev, backend, shape, dtype):
    a, b = SPEC.make_inputs(shape, dtype, dev, seed_for(OP, backend, shape, dtype))
    a0, b0 = a.clone(), b.clone()
    y = kernellab.add(a, b, backend=backend)
    assert y.shape == a.shape and y.dtype == dtype and y.device == a.device
    v = judge(y, SPEC.ref(a, b), dtype, _baseline(backend, a, b))
    assert v.ok, f"{backend} {shape} {dtype}: {v.detail} (err {v.err:.3g}, bound {v.bound:.3g})"
    # One rounding of the exact sum, as PyTorch: for add that is bit-identical.
    if rounds_like_torch(backend, dtype, dev):
        assert torch.equal(y, torch.add(a, b)), "add is not correctly rounded"
    assert torch.equal(a, a0) and torch.equal(b, b0), "an input was modified"
    if y.numel():
        assert y.data_ptr() not in (a.data_ptr(), b.data_ptr()), "the output aliases an input"


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("dev,backend", MATRIX)
def test_forward_nan_inf(dev, backend, dtype):
    a, b = SPEC.make_inputs(SPEC.layout_shape, dtype, dev, seed_for(OP, backend, dtype, "special"))
    a, b = SPEC.plant_specials((a, b), seed_for("positions", dtype))
    # inf + (-inf) = NaN as well: plant opposite infinities at one position.
    a.view(-1)[7], b.view(-1)[7] = float("inf"), float("-inf")
    y = kernellab.add(a, b, backend=backend)
    ref = SPEC.ref(a, b)
    assert torch.isnan(ref.view(-1)[7])
    v = judge(y, ref, dtype, _baseline(backend, a, b))
    assert v.ok, f"{backend} {dtype}: {v.detail}"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=dtype_id)
@pytest.mark.parametrize("dev,backend", MATRIX)
def test_forward_overflow_to_inf(dev, backend, dtype):
    big = torch.finfo(dtype).max
    a = torch.full((1025,), big, dtype=dtype, device=dev)
    b = a.clone()
    b[1::2] = -big
    y = kernellab.add(a, b, backend=backend)
    assert torch.isposinf(y[0::2]).all() and (y[1::2] == 0).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("edge", list(BLOCK_EDGES))
def test_triton_counts_around_a_block(device, edge, dtype):
    """The Triton backend at counts around its program size (fp32 4096, 16-bit 8192): a
    partial program alone, whole ones (unmasked), whole ones then a partial one; judged as
    test_forward judges it (bit-identical to torch.add where it rounds as torch does).
    The gradient runs no kernel (test_grad)."""
    if kernellab.get(OP, "triton").why_unavailable(device):
        pytest.skip("triton does not run here")
    test_forward(device, "triton", (block_edge(edge, triton_support.block_for(dtype.itemsize)),), dtype)


# --------------------------------------------------------------------------- gradients


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", ODD_SHAPES, ids=shape_id)
@pytest.mark.parametrize("dev,backend", MATRIX)
def test_grad(dev, backend, shape, dtype):
    a, b = SPEC.make_inputs(shape, dtype, dev, seed_for(OP, backend, shape, dtype, "grad"))
    gen = torch.Generator(device=dev).manual_seed(seed_for(shape, dtype, "dy"))
    dy = torch.randn(shape, generator=gen, device=dev).to(dtype)
    da, db = impl_grads(lambda x, z: kernellab.add(x, z, backend=backend), SPEC, (a, b), dy)
    ref_da, ref_db = reference_grads(SPEC, (a, b), dy)
    base = None if backend == "torch" else impl_grads(_torch_fn(), SPEC, (a, b), dy)
    for name, g, r, k in (("da", da, ref_da, 0), ("db", db, ref_db, 1)):
        assert g.shape == a.shape and g.dtype == dtype, name
        v = judge(g, r, dtype, base[k] if base is not None else None)
        assert v.ok, f"{backend} {name} {shape} {dtype}: {v.detail}"
        # d(a + b)/da = d(a + b)/db = 1: every correct backend hands back dy exactly.
        assert torch.equal(g, dy), f"{backend} {name} is not dy"


@pytest.mark.parametrize("dev,backend", MATRIX)
def test_grad_one_input_only(dev, backend):
    a, b = SPEC.make_inputs((5, 33), torch.float32, dev, 3)
    a.requires_grad_()  # b takes no gradient
    y = kernellab.add(a, b, backend=backend)
    dy = torch.randn_like(y)
    y.backward(dy)
    assert torch.equal(a.grad, dy) and b.grad is None


# --------------------------------------------------------------------------- layouts


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dev,backend", MATRIX)
def test_non_contiguous_forward_and_grad(dev, backend, layout, dtype):
    a, b = SPEC.make_inputs(SPEC.layout_shape, dtype, dev, seed_for(OP, backend, layout, dtype), layout)
    if layout == "offset":
        assert a.storage_offset() == 1 and b.storage_offset() == 1
    elif layout == "expanded":
        assert 0 in a.stride()
    else:
        assert not a.is_contiguous() and not b.is_contiguous()
    y = kernellab.add(a, b, backend=backend)
    v = judge(y, SPEC.ref(a, b), dtype, _baseline(backend, a, b))
    assert v.ok, f"{backend} {layout} {dtype}: {v.detail}"
    if rounds_like_torch(backend, dtype, dev):
        assert torch.equal(y, torch.add(a, b))

    dy = torch.randn(a.shape, device=dev).to(dtype)
    da, db = impl_grads(lambda x, z: kernellab.add(x, z, backend=backend), SPEC, (a, b), dy)
    assert torch.equal(da, dy) and torch.equal(db, dy)


@pytest.mark.parametrize("dev,backend", MATRIX)
def test_mixed_layouts_and_aliasing(dev, backend):
    """a and b in different layouts, and the same tensor passed twice."""
    gen = torch.Generator(device=dev).manual_seed(2)
    rows, cols = 37, 1025
    contiguous = torch.randn(rows, cols, generator=gen, device=dev)
    transposed = torch.randn(cols, rows, generator=gen, device=dev).t()
    sliced = torch.randn(rows, 2 * cols, generator=gen, device=dev)[:, ::2]
    offset = torch.randn(rows * cols + 1, generator=gen, device=dev)[1:].view(rows, cols)
    expanded = torch.randn(1, cols, generator=gen, device=dev).expand(rows, cols)
    tensors = [contiguous, transposed, sliced, offset, expanded]
    for a in tensors:
        for b in tensors:
            y = kernellab.add(a, b, backend=backend)
            assert torch.equal(y, a + b), f"{backend}: {a.stride()} + {b.stride()}"
    y = kernellab.add(sliced, sliced, backend=backend)
    assert torch.equal(y, 2 * sliced)


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
    a, b = SPEC.make_inputs(shape, dtype, device, seed)
    y = kernellab.add(a, b, backend=backend)
    v = judge(y, SPEC.ref(a, b), dtype, _baseline(backend, a, b))
    assert v.ok, f"{shape} {dtype}: {v.detail}"
    if rounds_like_torch(backend, dtype, device):
        assert torch.equal(y, torch.add(a, b)), f"{shape} {dtype}"


# --------------------------------------------------------------------------- bad inputs


def _t(dtype=torch.float32, shape=(33,), device="cpu"):
    return torch.randn(shape, device=device).to(dtype)


# case -> (build(device) -> (a, b), exception, pattern naming the argument)
BAD = {
    "a int32": (lambda d: (_t(device=d).int(), _t(device=d)), TypeError, r"\ba\b.*dtype"),
    "b int32": (lambda d: (_t(device=d), _t(device=d).int()), TypeError, r"\bb\b.*dtype"),
    "both float64": (
        lambda d: (_t(torch.float64, device=d), _t(torch.float64, device=d)),
        TypeError,
        r"\ba\b.*float64",
    ),
    "a list": (lambda d: ([1.0] * 33, _t(device=d)), TypeError, r"\ba\b must be a torch\.Tensor, got list"),
    "b list": (lambda d: (_t(device=d), [1.0] * 33), TypeError, r"\bb\b must be a torch\.Tensor, got list"),
    "b scalar": (lambda d: (_t(device=d), 2.0), TypeError, r"\bb\b must be a torch\.Tensor, got float"),
    "mismatched shapes": (
        lambda d: (_t(shape=(4, 8), device=d), _t(shape=(8, 4), device=d)),
        ValueError,
        r"\bb\b has shape \(8, 4\) but \ba\b has \(4, 8\)",
    ),
    "broadcasting refused": (
        lambda d: (_t(shape=(4, 8), device=d), _t(shape=(8,), device=d)),
        ValueError,
        r"\bb\b.*no broadcasting",
    ),
    "mismatched dtypes": (
        lambda d: (_t(device=d), _t(torch.float16, device=d)),
        TypeError,
        r"\bb\b has dtype torch\.float16",
    ),
    "mismatched dtypes bf16/fp16": (
        lambda d: (_t(torch.bfloat16, device=d), _t(torch.float16, device=d)),
        TypeError,
        r"\bb\b has dtype torch\.float16 but \ba\b has torch\.bfloat16",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_bad_input_names_the_argument(backend, case):
    build, exc, pattern = BAD[case]
    impl = kernellab.get(OP, backend)
    dev = "cpu" if "cpu" in impl.devices else ("cuda" if torch.cuda.is_available() else "cpu")
    a, b = build(dev)
    if case == "both float64" and torch.float64 in (impl.dtypes or ()):
        # the reference backends take float64 (tests/ops/test_float64.py): computed, not refused
        torch.testing.assert_close(kernellab.add(a, b, backend=backend), a + b, rtol=0, atol=0)
        return
    a_is_fine = isinstance(a, torch.Tensor) and a.dtype in SPEC.dtypes
    if a_is_fine and a.device.type not in impl.devices:
        # A GPU-only backend given CPU tensors (no GPU here): the first problem met is
        # a's device, and that is what the error must name.
        exc, pattern = ValueError, r"\ba\b is on cpu, but this backend runs on cuda tensors only"
    with pytest.raises(exc, match=pattern):
        kernellab.add(a, b, backend=backend)


@pytest.mark.parametrize("backend", gpu_only_backends(OP))
def test_cpu_tensors_to_gpu_only_backend_are_refused(backend):
    for dtype in DTYPES:
        with pytest.raises(ValueError, match=r"\ba\b is on cpu.*cuda"):
            kernellab.add(_t(dtype), _t(dtype), backend=backend)


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_wrong_arity(backend):
    impl = kernellab.get(OP, backend)
    with pytest.raises(TypeError, match=r"add\(\) takes 2 tensor arguments \(a, b\), got 1"):
        impl(_t())
    with pytest.raises(TypeError, match=r"got 3"):
        impl(_t(), _t(), _t())


def test_spec_bad_inputs_are_refused_by_every_runnable_backend(device):
    from kernellab.harness.check import PASS, check_bad_input

    names = {c.name for c in SPEC.bad_inputs()}
    assert {"mismatched shapes", "mismatched dtypes", "CPU tensor to a GPU-only backend"} <= names
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
    if kernellab.get(OP, "triton").why_unavailable(device):
        pytest.skip("triton does not run here")
    torch._dynamo.reset()

    @torch.compile(fullgraph=True)
    def f(a, b):
        return kernellab.add(a, b * 3.0, backend="triton")

    a = torch.randn(4, 129, device=device, requires_grad=True)
    b = torch.randn(4, 129, device=device, requires_grad=True)
    y = f(a, b)
    torch.testing.assert_close(y, a + 3.0 * b)
    dy = torch.randn_like(y)
    da, db = torch.autograd.grad(y, (a, b), dy)
    assert torch.equal(da, dy)
    torch.testing.assert_close(db, 3.0 * dy)


def test_compile_backend_fp32_quick(device):
    impl = kernellab.get(OP, "compile")
    if impl.why_unavailable(device):
        pytest.skip(impl.why_unavailable(device))
    a, b = SPEC.make_inputs((129, 1000), torch.float32, device, 4)
    y = kernellab.add(a, b, backend="compile")
    assert torch.equal(y, a + b)
    dy = torch.randn_like(a)
    da, db = impl_grads(impl.fn, SPEC, (a, b), dy)
    assert torch.equal(da, dy) and torch.equal(db, dy)


# --------------------------------------------------------------------------- GPU only


SFX = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_gpu_misaligned_offset_takes_the_scalar_kernel(dtype):
    from kltest import launched_cuda_kernels

    sfx = SFX[dtype]
    for n in (1, 9, 1025, 4097):
        a = torch.randn(n, device="cuda").to(dtype)
        b_mis = torch.randn(n + 1, device="cuda").to(dtype)[1:]  # only b is misaligned
        out = []
        ran = launched_cuda_kernels(lambda: out.append(kernellab.add(a, b_mis, backend="cuda")), "add")
        assert ran == [f"add_v1_{sfx}"], ran
        assert torch.equal(out[0], a + b_mis)
        b = b_mis.clone()
        ran = launched_cuda_kernels(lambda: out.append(kernellab.add(a, b, backend="cuda")), "add")
        assert ran == [f"add_x1_{sfx}"], ran  # two inputs: always one pack per thread
        assert torch.equal(out[1], a + b)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "cuda_v1"])
def test_gpu_large_and_tail_sizes(backend):
    from kernellab.harness.check import poison_allocator

    for n in (2**24 + 3, 4097, 5):
        a = torch.randn(n, device="cuda")
        b = torch.randn(n, device="cuda")
        poison_allocator((n,), torch.float32, "cuda")
        y = kernellab.add(a, b, backend=backend)
        assert torch.equal(y, a + b), f"{backend} n={n}"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_gpu_vectorized_kernel_is_correct_for_any_grid(dtype):
    """The two-input vectorized loop is grid-stride too: any grid writes everything."""
    from kernellab.ops.add import cuda as add_cuda

    n = 3 * 256 * 2 * 8 + 5
    a = torch.randn(n, device="cuda").to(dtype)
    b = torch.randn(n, device="cuda").to(dtype)
    k = add_cuda.MODULE.kernel(f"add_{SFX[dtype]}", ("ptr", "ptr", "ptr", "i64"))
    for grid in (1, 2, 7):
        y = torch.full_like(a, float("nan"))
        k(grid, 256, a, b, y, n)
        torch.cuda.synchronize()
        assert torch.equal(y, a + b), f"grid={grid}"


@pytest.mark.gpu
def test_gpu_cuda_graph_capture():
    a = torch.randn(10007, device="cuda")
    b = torch.randn(10007, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        kernellab.add(a, b, backend="cuda")
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = kernellab.add(a, b, backend="cuda")
    for _ in range(2):
        a.normal_()
        b.normal_()
        y.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, a + b)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "cuda_v1"])
def test_gpu_cuda_core_launch_path_gives_identical_results(backend, monkeypatch):
    """KERNELLAB_LAUNCH=core: cuda.core.launch gives the same answer (fresh Module, since
    the variable is read when a Kernel is made)."""
    from kernellab.cuda.runtime import Module
    from kernellab.ops import _elementwise_cuda as elementwise
    from kernellab.ops.add import cuda as add_cuda
    from kltest import KEEP_ALIVE

    a = torch.randn(3, 1001, device="cuda", dtype=torch.float16)
    b = torch.randn(3, 1001, device="cuda", dtype=torch.float16)
    default = kernellab.add(a, b, backend=backend)
    monkeypatch.setattr(kernellab.config, "cuda_launch", "core")
    core_mod = Module(add_cuda.MODULE.path)
    KEEP_ALIVE.append(core_mod)
    core = elementwise.launch(core_mod, "add", [a, b], backend == "cuda")
    torch.cuda.synchronize()
    assert core_mod._kernels and all(k._use_core for k in core_mod._kernels.values())
    assert torch.equal(default, core) and torch.equal(core, a + b)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=dtype_id)
def test_gpu_large_16bit_tensors_take_the_8_byte_kernel(dtype):
    """From W8_MIN_ELEMS up, 16-bit add runs add_w8 (8-byte packs): every element written
    (output poisoned) and exact, n % 4 tail included; fp32 keeps the 16-byte x1 kernel."""
    from kernellab.harness.check import poison_allocator
    from kernellab.ops import _elementwise_cuda as ew
    from kltest import launched_cuda_kernels

    n = ew.W8_MIN_ELEMS + 4 * 1000 + 3
    a = torch.randn(n, device="cuda").to(dtype)
    b = torch.randn(n, device="cuda").to(dtype)
    out = []

    def run():
        poison_allocator((n,), dtype, "cuda")
        out.append(kernellab.add(a, b, backend="cuda"))

    ran = launched_cuda_kernels(run, "add_")
    assert ran == [f"add_w8_{SFX[dtype]}"], ran
    assert torch.equal(out[0], a + b)
    a32, b32 = a.float(), b.float()
    ran = launched_cuda_kernels(lambda: kernellab.add(a32, b32, backend="cuda"), "add_")
    assert ran == ["add_x1_f32"], ran
