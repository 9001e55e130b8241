"""max / argmax: every backend that runs here x odd shapes x dtypes against torch.max's
semantics (indices exact: first index on ties, NaN first), the gradient (dy at the
argmax), dim handling, the check engine passes the real backends and rejects planted
wrong ones, torch.compile fullgraph, the CUDA kernels compile; GPU-marked tests."""

from __future__ import annotations

import re

import pytest
import torch

import kernellab
import kernellab.ops.argmax as kargmax
import kernellab.ops.max as kmax
from kernellab.harness.check import FAIL, PASS, check_impl
from kernellab.harness.compare import judge
from kltest import DTYPES, cpu_backends, cuda_backends, dtype_id, seed_for, shape_id

SPEC = kernellab.get_spec("max")
CPU = cpu_backends("max")
SHAPES = [(1,), (41,), (3, 123), (5, 1025), (2, 3, 257), (300, 3), (0, 7), (2, 5000)]


def _x(shape, dtype, seed, device="cpu"):
    (x,) = SPEC.make_inputs(shape, dtype, device, seed)
    return x


def _assert_like_torch(backend, x):
    v, i = kernellab.get("max", backend)(x)
    tv, ti = torch.max(x, dim=-1)
    assert i.dtype == torch.int64 and torch.equal(i, ti), (i, ti)
    assert v.dtype == x.dtype and torch.equal(v.isnan(), tv.isnan())
    assert torch.equal(v.nan_to_num(), tv.nan_to_num())
    a = kernellab.get("argmax", backend)(x)
    assert a.dtype == torch.int64 and torch.equal(a, ti)


@pytest.mark.parametrize("backend", CPU)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_forward_and_gradient(backend, dtype, shape):
    x = _x(shape, dtype, seed_for(backend, shape))
    _assert_like_torch(backend, x)
    v = judge(kernellab.get("max", backend)(x)[0], SPEC.ref(x)[0], dtype, torch.max(x, -1)[0])
    assert v.ok, v.detail
    leaf = x.detach().clone().requires_grad_()
    vals, idx = kernellab.get("max", backend)(leaf)
    assert not idx.requires_grad
    dy = torch.randn(vals.shape).to(dtype)
    (g,) = torch.autograd.grad(vals, leaf, dy)
    t = x.detach().clone().requires_grad_()
    (g_torch,) = torch.autograd.grad(torch.max(t, -1)[0], t, dy)
    assert torch.equal(g, g_torch)


@pytest.mark.parametrize("backend", CPU)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_ties_nan_and_inf_rows(backend, dtype):
    nan, inf = float("nan"), float("inf")
    rows = [
        [1, 3, 3, nan, 2, nan],  # NaN wins, the first NaN
        [3, 1, 3, -1, 3, 0],  # ties: the first
        [-inf] * 6,  # all -inf: index 0
        [-inf, -inf, -5, -inf, -5, -inf],
        [0, 2, inf, 2, inf, nan],
        [nan, 1, 2, 3, 4, 5],
    ]
    x = torch.tensor(rows).to(dtype)
    _assert_like_torch(backend, x)
    long = torch.randn(3, 9000).to(dtype)  # ties across the Triton column blocks
    long[:, 100] = long[:, 8500] = 50.0
    long[1, 4500] = nan
    long[1, 8999] = nan
    _assert_like_torch(backend, long)
    assert kernellab.get("argmax", backend)(long).tolist() == [100, 4500, 100]
    ints = torch.randint(-3, 4, (64, 77)).to(dtype)  # many ties
    _assert_like_torch(backend, ints)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("width", [4097, 4103, 8190, 12289])
def test_triton_streamed_rows_off_16_byte_boundaries(dtype, width):
    """Rows of one a program, streamed with per-lane bests; widths that are not a multiple
    of 16 bytes' elements start off 16-byte boundaries and are read as the aligned chunks
    holding them: the neighbours' elements (planted larger, and NaN) must not leak in, the
    tensor's last partial chunk (read apart) counts, and ties across lanes and steps break
    to the first column."""
    from kernellab.ops.max.triton import _launch_config

    _, rows, _, a, shifted = _launch_config(width, torch.empty((), dtype=dtype).element_size())
    assert rows == 1 and shifted == (width % a != 0)
    nan, inf = float("nan"), float("inf")
    x = torch.randn(6, width).to(dtype)
    x[0, 0] = 90.0
    x[1, 5] = x[1, width // 2] = x[1, width - 2] = 80.0  # ties across lanes and steps
    x[2, -1] = nan  # next to row 3, all -inf but its end
    x[3, :] = -inf
    x[3, -1] = 95.0  # next to row 4's start
    x[4, -1] = 70.0
    x[5, -1] = nan  # in the tensor's last partial chunk (only the last row has elements past lim)
    _assert_like_torch("triton", x)
    assert kernellab.get("argmax", "triton")(x).tolist() == [0, 5] + [width - 1] * 4
    y = torch.full((3, width), -inf).to(dtype)  # all -inf: index 0
    y[1, -3:] = 0.0
    _assert_like_torch("triton", y)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_triton_one_pass_gradient_across_blocks(dtype):
    from kernellab.ops._reductions import max_grad_torch
    from kernellab.ops.max import triton as mt

    cases = [(4096, [0, 4095]), (4097, [4096, 1]), (9000, [4096, 8999, 5000]), (7, [6, 0, 3])]
    cases += [(1025, [1024, 1024, 0, 1024]), (9, [8, 0, 8, 8, 1]), (8, [7, 0, 7])]
    for width, hits in cases:
        idx = torch.tensor(hits)
        dv = torch.randn(len(hits)).to(dtype)
        shape = (len(hits), width)
        assert torch.equal(mt.max_grad(idx, dv, shape), max_grad_torch(idx, dv, shape)), width


def test_eager_backward_takes_the_one_pass_kernel():
    # a backend's ``grad`` serves the eager backward; the custom op's (traced, or
    # differentiated again) is torch's zeros and scatter
    from kernellab.ops._reductions import max_backend, max_grad_torch
    from kernellab.ops.max import triton as mt

    calls = []

    def spy(idx, dv, shape):
        calls.append(tuple(shape))
        return max_grad_torch(idx, dv, shape)

    fn = max_backend("spy_test", mt.max_rows, grad=spy)
    x = torch.randn(3, 20, requires_grad=True)
    vals, _ = fn(x)
    vals.sum().backward()
    assert calls == [(3, 20)]
    dy = torch.ones(3, requires_grad=True)
    (g,) = torch.autograd.grad(fn(x)[0], x, dy, create_graph=True)
    assert calls == [(3, 20)] and g.requires_grad
    assert torch.equal(x.grad, g.detach())


@pytest.mark.parametrize("backend", CPU)
def test_double_backward_through_max(backend):
    # the one-pass backward is for plain gradients; differentiated again (create_graph with a
    # dy that needs its gradient) the backward is torch's, so the second derivative is exact
    x = torch.randn(4, 9, requires_grad=True)
    dy = torch.randn(4, requires_grad=True)
    vals, idx = kernellab.get("max", backend)(x)
    (g,) = torch.autograd.grad(vals, x, dy, create_graph=True)
    w = torch.randn(4, 9)
    (gg,) = torch.autograd.grad((g * w).sum(), dy)
    assert torch.equal(gg, w.gather(-1, idx.unsqueeze(-1)).squeeze(-1))


@pytest.mark.parametrize("backend", CPU)
def test_dim_argument(backend):
    x = torch.randn(6, 7, 5)
    for dim in (0, 1, 2, -1, -2, -3):
        v, i = kmax.max(x, dim, backend=backend)
        tv, ti = torch.max(x, dim)
        assert torch.equal(v, tv) and torch.equal(i, ti)
        assert torch.equal(kargmax.argmax(x, dim, backend=backend), torch.argmax(x, dim))
    r = kmax.max(x, backend=backend)
    assert r.values.shape == (6, 7) and r.indices.shape == (6, 7)
    s = kmax.max(torch.tensor(2.5), backend=backend)
    assert s.values.item() == 2.5 and s.indices.item() == 0 and s.indices.dim() == 0
    for bad in (3, -4, 1.0, None, True):
        with pytest.raises(ValueError, match="dim"):
            kmax.max(x, bad, backend=backend)
        with pytest.raises(ValueError, match="dim"):
            kargmax.argmax(x, bad, backend=backend)
    with pytest.raises(ValueError, match=r"\bx\b.*empty"):
        kmax.max(torch.empty(3, 0), backend=backend)
    with pytest.raises(TypeError, match=r"\bx\b"):
        kargmax.argmax([1.0, 2.0], backend=backend)


@pytest.mark.parametrize("op", ["max", "argmax"])
@pytest.mark.parametrize("backend", ["manual", "torch", "triton"])
def test_check_engine_passes(op, backend):
    # bf16 (ties are common) for the fast backends; fp32 under the slow interpreter (the
    # special case plants a tie, a -inf row and a two-NaN row in every dtype).
    dtype = torch.float32 if backend == "triton" else torch.bfloat16
    rep = check_impl(kernellab.get(op, backend), dtype, device="cpu", quick=True, seed=13)
    assert rep.status == PASS, [(c.kind, c.name, c.detail) for c in rep.failures]
    assert any(c.kind == "special" and c.status == PASS for c in rep.cases)


def _wrong_impls():
    def last_on_ties(x):  # flip the row: argmax then finds the last occurrence
        i = x.shape[-1] - 1 - torch.max(x.flip(-1), dim=-1)[1]
        return x.gather(-1, i.unsqueeze(-1)).squeeze(-1), i

    def drops_nan(x):  # NaN treated as -inf (what a plain fmaxf / tl.argmax does)
        xs = torch.where(x.isnan(), torch.full_like(x, float("-inf")), x)
        i = torch.max(xs, dim=-1)[1]
        return x.gather(-1, i.unsqueeze(-1)).squeeze(-1), i

    def int32_indices(x):
        v, i = torch.max(x, dim=-1)
        return v, i.to(torch.int32)

    def shared_grad(x):  # amax's backward shares dy among ties
        m = x.amax(-1)
        return m, torch.max(x.detach(), dim=-1)[1]

    return {
        "last_on_ties": last_on_ties,
        "drops_nan": drops_nan,
        "int32_indices": int32_indices,
        "shared_grad": shared_grad,
    }


@pytest.mark.parametrize("name", list(_wrong_impls()))
def test_check_engine_rejects_planted_wrong_max(planted, name):
    impl = planted("max", f"planted_{name}", _wrong_impls()[name], devices=("cpu",))
    rep = check_impl(impl, torch.bfloat16, device="cpu", quick=True, seed=5, opcheck=False)
    assert rep.status == FAIL, name


def test_compile_backend_quick():  # one Inductor compile (seconds on the CPU)
    x = torch.randn(4, 100)
    v, i = kernellab.get("max", "compile")(x)
    tv, ti = torch.max(x, -1)
    assert torch.equal(v, tv) and torch.equal(i, ti)


def test_under_torch_compile_fullgraph():
    def f(t):
        r = kmax.max(t, backend="triton")
        return r.values.sum() * 2, kargmax.argmax(t, backend="triton")

    g = torch.compile(f, fullgraph=True)
    x = torch.randn(5, 33, requires_grad=True)
    s, a = g(x)
    s.backward()
    ti = torch.argmax(x.detach(), -1)
    assert torch.equal(a, ti)
    expect = torch.zeros_like(x).scatter_(-1, ti.unsqueeze(-1), 2.0)
    assert torch.equal(x.grad, expect)


def test_cuda_kernels_compile_and_export():
    from kernellab.cuda.runtime import nvrtc_unavailable
    from kernellab.ops.max import cuda as mcuda

    if nvrtc_unavailable():
        pytest.skip(nvrtc_unavailable())
    names = ["max_rows_v1", "max_rows_warp", "max_rows_block", "max_grad_warp", "max_grad_block"]
    for arch in ("sm_80", "sm_90"):
        ptx = mcuda.MODULE.compile(arch, target="ptx").decode()
        entries = set(re.findall(r"\.entry\s+(\w+)", ptx))
        want = {f"{n}_{s}" for n in names for s in ("f32", "f16", "bf16")}
        assert want <= entries, sorted(want - entries)
    assert {"cuda", "cuda_v1"} <= {i.backend for i in kernellab.impls("argmax")}


# --------------------------------------------------------------------------- GPU

GPU_BACKENDS = [b for b in cuda_backends("max") if b not in ("manual", "compile")]


@pytest.mark.gpu
@pytest.mark.parametrize("backend", GPU_BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_gpu_like_torch(backend, dtype):
    shapes = [(1,), (41,), (3, 123), (17, 1024), (5, 1025), (65537, 3), (64, 4096), (4, 262144), (2, 3, 257)]
    for shape in shapes:
        _assert_like_torch(backend, _x(shape, dtype, seed_for(backend, shape), "cuda"))
    ints = torch.randint(-3, 4, (300, 4096), device="cuda").to(dtype)  # ties everywhere
    ints[7, 100] = ints[7, 3000] = float("nan")
    ints[8] = float("-inf")
    _assert_like_torch(backend, ints)
    flat = torch.randn(37 * 1025 + 1, device="cuda").to(dtype)  # misaligned base
    _assert_like_torch(backend, flat[1:].view(37, 1025))
    # odd widths: each row starts at a different offset from a 16-byte boundary; the max
    # among a row's first elements (read one a lane) and its last (the partial pack)
    for width in (1025, 4097, 50257):
        odd = _x((19, width), dtype, width, "cuda")
        odd[0::3, 1] = odd[1::3, -1] = odd[2::3, 5] = 1000
        _assert_like_torch(backend, odd)
    # gradients: short and long rows, odd widths, few long rows (split into chunks)
    for shape in [(33, 2048), (65, 1025), (7, 4097), (2, 100003), (1, 262144), (300, 3)]:
        x = _x(shape, dtype, 1, "cuda").requires_grad_()
        vals, _ = kernellab.get("max", backend)(x)
        dy = torch.randn_like(vals)
        (g,) = torch.autograd.grad(vals, x, dy)
        t = x.detach().clone().requires_grad_()
        (gt,) = torch.autograd.grad(torch.max(t, -1)[0], t, dy)
        assert torch.equal(g, gt), shape


@pytest.mark.gpu
def test_gpu_check_engine_quick():
    for op in ("max", "argmax"):
        for backend in GPU_BACKENDS:
            for dtype in DTYPES:
                rep = check_impl(kernellab.get(op, backend), dtype, device="cuda", quick=True, seed=3)
                assert rep.status == PASS, (
                    op,
                    backend,
                    dtype,
                    [(c.kind, c.name, c.detail) for c in rep.failures],
                )
