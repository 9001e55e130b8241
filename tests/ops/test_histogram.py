"""histogram: every backend that runs here x odd problems x key dtypes x distributions,
exact against torch.bincount on the CPU; keys out of range ignored; bad inputs refused
naming the argument; the check engine passes the real backends and rejects planted
wrong ones; the CUDA ladder compiles and documents itself; GPU-marked tests run every
rung, its limits and its repeatability."""

from __future__ import annotations

import re

import pytest
import torch

import kernellab
from kernellab.harness.check import FAIL, PASS, check_impl
from kernellab.ops.histogram import DISTRIBUTIONS, SPEC, histogram, histogram_reference, make_keys
from kltest import cpu_backends, cuda_backends, seed_for

CPU = cpu_backends("histogram")
KEY_DTYPES = [torch.uint8, torch.int32, torch.int64]
# (n, bins): empty, one key, one bin, primes, a block +-1, uint8's 255 / 256 edge,
# bins past a shared-memory histogram (triton takes its global-atomics kernel there)
PROBLEMS = [
    (0, 5),
    (1, 1),
    (17, 1),
    (113, 3),
    (1023, 255),
    (1025, 256),
    (4097, 4096),
    (3001, 4097),
    (2003, 65536),
]


def _dt(d) -> str:
    return str(d).removeprefix("torch.")


def _keys(n, bins, dtype, dist, seed, device="cpu"):
    gen = torch.Generator(device=device).manual_seed(seed)
    x = make_keys(n, bins, dtype, device, dist, gen)
    if n and dtype != torch.uint8:  # a few keys below and above the range: ignored
        x[::11] = -1
        x[5::13] = bins + 3
    return x


@pytest.mark.parametrize("backend", CPU)
@pytest.mark.parametrize("dtype", KEY_DTYPES, ids=_dt)
@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: f"{p[0]}x{p[1]}")
def test_exact_against_bincount(backend, dtype, problem):
    n, bins = problem
    for dist in DISTRIBUTIONS:
        x = _keys(n, bins, dtype, dist, seed_for(backend, problem, dist))
        y = histogram(x, bins, backend=backend)
        assert y.dtype == torch.int64 and y.shape == (bins,)
        assert torch.equal(y, histogram_reference(x, bins)), dist
        assert int(y.sum()) == int(((x.long() >= 0) & (x.long() < bins)).sum())


@pytest.mark.parametrize("backend", CPU)
def test_out_of_range_keys_are_ignored(backend):
    x = torch.tensor([0, 1, 1, 2, 5, -1, -7, 3, 2**31 - 1, -(2**31)], dtype=torch.int32)
    assert histogram(x, 3, backend=backend).tolist() == [1, 2, 1]
    assert histogram(x.long(), 4, backend=backend).tolist() == [1, 2, 1, 1]
    u = torch.tensor([0, 255, 254, 3, 3], dtype=torch.uint8)
    assert histogram(u, 4, backend=backend).tolist() == [1, 0, 0, 2]
    assert histogram(u, 256, backend=backend)[[0, 3, 254, 255]].tolist() == [1, 2, 1, 1]
    assert histogram(u, 1, backend=backend).tolist() == [1]
    # it equals bincount wherever bincount's own output is bins long
    k = torch.randint(0, 9, (500,))
    assert torch.equal(histogram(k, 9, backend=backend), torch.bincount(k, minlength=9))


@pytest.mark.parametrize("backend", CPU)
def test_strided_inputs(backend):
    base = _keys(2 * 1001 + 1, 50, torch.int32, "uniform", 7)
    for x in (base[::2], base[1:], base[:1].expand(300)):
        assert torch.equal(histogram(x, 50, backend=backend), histogram_reference(x, 50))


@pytest.mark.parametrize("backend", CPU)
def test_bad_inputs_name_the_argument(backend):
    fn = kernellab.get("histogram", backend)
    x = torch.zeros(33, dtype=torch.int32)
    cases = [
        ((torch.rand(33), 8), {}, TypeError, r"\bx\b.*float32"),
        ((torch.zeros(33, dtype=torch.int16), 8), {}, TypeError, r"\bx\b"),
        ((torch.zeros(3, 11, dtype=torch.int32), 8), {}, ValueError, r"\bx\b must be 1-D"),
        ((torch.zeros((), dtype=torch.int32), 8), {}, ValueError, r"\bx\b must be 1-D"),
        (([0, 1], 8), {}, TypeError, r"\bx\b must be a torch.Tensor"),
        ((x, -4), {}, ValueError, r"\bbins\b"),
        ((x, 0), {}, ValueError, r"\bbins\b"),
        ((x, 2**31), {}, ValueError, r"\bbins\b"),
        ((x, 8.0), {}, TypeError, r"\bbins\b must be an int"),
        ((x, True), {}, TypeError, r"\bbins\b must be an int"),
        ((x, torch.tensor(8)), {}, TypeError, r"\bbins\b must be an int"),
        ((x, 8), {"minlength": 8}, TypeError, "minlength"),
        ((x,), {}, TypeError, r"\(x, bins\)"),
    ]
    for args, kw, exc, pattern in cases:
        with pytest.raises(exc, match=pattern):
            fn(*args, **kw)
    # a float tensor that requires grad: refused as a float x, not differentiated
    with pytest.raises(TypeError, match=r"\bx\b"):
        histogram(torch.rand(5, requires_grad=True), 3, backend=backend)


def test_default_backend_and_public_function():
    x = _keys(1000, 37, torch.int64, "zipf", 3)
    assert torch.equal(kernellab.histogram(x, 37), histogram_reference(x, 37))
    assert kernellab.histogram is histogram


def test_distributions():
    gen = torch.Generator().manual_seed(0)
    s = make_keys(20000, 256, torch.int32, distribution="skewed", gen=gen)
    c = torch.bincount(s.long(), minlength=256)
    assert c.argmax().item() == 128 and 0.88 < c.max().item() / 20000 < 0.92
    z = torch.bincount(make_keys(20000, 100, torch.int64, distribution="zipf", gen=gen), minlength=100)
    assert z[0] > 3 * z[5] > 0 and z[:10].sum() > z[50:].sum()
    u = make_keys(20000, 4096, torch.uint8, distribution="uniform", gen=gen)  # uint8 holds 0..255 only
    assert u.dtype == torch.uint8 and int(u.max()) > 250
    with pytest.raises(ValueError, match="distribution"):
        make_keys(10, 4, distribution="normal")


@pytest.mark.parametrize("backend", ["manual", "triton"])
def test_check_engine_passes(backend):
    rep = check_impl(kernellab.get("histogram", backend), torch.int32, device="cpu", quick=True, seed=11)
    assert rep.status == PASS, [(c.kind, c.name, c.detail) for c in rep.failures]
    kinds = {c.kind for c in rep.cases}
    assert {"shape", "layout", "bad", "special"} <= kinds


def _wrong_impls():
    def clamps_out_of_range(x, bins):  # counts out-of-range keys in the edge bins
        return torch.bincount(x.long().clamp(0, bins - 1), minlength=bins)

    def drops_last(x, bins):
        return histogram_reference(x[:-1] if x.numel() else x, bins).to(x.device)

    def int32_counts(x, bins):
        return histogram_reference(x, bins).int()

    def ignores_stride(x, bins):  # reads the storage as if x were contiguous
        flat = torch.empty(0, dtype=x.dtype).set_(x.untyped_storage())[x.storage_offset() :][: x.numel()]
        return histogram_reference(flat, bins)

    def narrows_keys(x, bins):  # int64 keys cut to int32 (a huge key wraps into range)
        return histogram_reference(x.int() if x.dtype == torch.int64 else x, bins)

    return {
        "clamps_out_of_range": clamps_out_of_range,
        "drops_last": drops_last,
        "int32_counts": int32_counts,
        "ignores_stride": ignores_stride,
        "narrows_keys": narrows_keys,
    }


@pytest.mark.parametrize("name", list(_wrong_impls()))
def test_check_engine_rejects_planted_wrong_histograms(planted, name):
    impl = planted("histogram", f"planted_{name}", _wrong_impls()[name], devices=("cpu",))
    dtype = torch.int64 if name == "narrows_keys" else torch.int32
    rep = check_impl(impl, dtype, device="cpu", quick=True, seed=5, opcheck=False)
    assert rep.status == FAIL, name


def test_under_torch_compile_fullgraph():
    f = torch.compile(lambda t: histogram(t, 40, backend="triton") * 2, fullgraph=True, backend="aot_eager")
    x = _keys(3000, 40, torch.int32, "uniform", 1)
    assert torch.equal(f(x), 2 * histogram_reference(x, 40))


# --------------------------------------------------------------------------- CUDA ladder

RUNGS = ("v1", "v2", "v3", "v4", "v5")
_CUDA_KERNELS = [f"hist_{v}_{s}" for v in RUNGS for s in ("u8", "i32", "i64")]


def test_cuda_ladder_compiles_and_documents_itself():
    from kernellab.cuda.runtime import nvrtc_unavailable
    from kernellab.ops.histogram import cuda as hcuda

    impls = {i.backend: i for i in kernellab.impls("histogram")}
    assert {"cuda", *(f"cuda_{v}" for v in RUNGS)} <= set(impls)
    for v in RUNGS:  # one line each, what the rung changes
        assert impls[f"cuda_{v}"].description.startswith(f"CUDA {v}: ")
        assert re.search(rf"^//\s+{v}\s+hist_{v}", hcuda.MODULE.source, re.M), v
    # documented limits: the privatized rungs refuse bins past shared memory, v1 and cuda don't
    x = torch.zeros(4, dtype=torch.int32)
    for v in RUNGS[1:]:
        limits = impls[f"cuda_{v}"].outside_limits
        assert "bins=65536" in limits((x, 65536), {}) and limits((x, 4096), {}) is None
    for b in ("cuda_v1", "cuda"):
        assert impls[b].outside_limits((x, 65536), {}) is None
    if nvrtc_unavailable():
        pytest.skip(nvrtc_unavailable())
    for arch in ("sm_80", "sm_90"):
        ptx = hcuda.MODULE.compile(arch, target="ptx").decode()
        entries = set(re.findall(r"\.entry\s+(\w+)", ptx))
        assert set(_CUDA_KERNELS) <= entries, sorted(set(_CUDA_KERNELS) - entries)
        assert "match.any" in ptx and "atom.shared.add.u32" in ptx and "atom.global.add.u64" in ptx
        assert "vote.sync.ballot" in ptx and "shfl.sync.idx" in ptx  # v5


# --------------------------------------------------------------------------- GPU

GPU_BACKENDS = [b for b in cuda_backends("histogram") if b != "manual"]
GPU_PROBLEMS = PROBLEMS + [(1 << 20, 256), ((1 << 21) + 5, 4096), (1 << 18, 12288), (1 << 18, 12289)]


@pytest.mark.gpu
@pytest.mark.parametrize("backend", GPU_BACKENDS)
@pytest.mark.parametrize("dtype", KEY_DTYPES, ids=_dt)
def test_gpu_exact(backend, dtype):
    impl = kernellab.get("histogram", backend)
    for n, bins in GPU_PROBLEMS:
        for dist in DISTRIBUTIONS:
            x = _keys(n, bins, dtype, dist, seed_for(backend, n, bins, dist), "cuda")
            if impl.outside_limits((x, bins), {}):
                with pytest.raises(ValueError, match="bins"):
                    impl(x, bins)
                continue
            y = impl(x, bins)
            assert torch.equal(y.cpu(), histogram_reference(x, bins)), (n, bins, dist)
            # storage offset of one key: v3/v4 peel a scalar head before the 16-byte loads
            if n > 1:
                assert torch.equal(impl(x[1:], bins).cpu(), histogram_reference(x[1:], bins))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_gpu_repeatable(backend):
    # integer atomics commute exactly: the same counts on every run, skewed keys included
    x = make_keys((1 << 24) + 3, 256, torch.uint8, "cuda", distribution="skewed")
    first = histogram(x, 256, backend=backend)
    assert all(torch.equal(first, histogram(x, 256, backend=backend)) for _ in range(5))


@pytest.mark.gpu
def test_gpu_check_engine_quick():
    for backend in GPU_BACKENDS:
        for dtype in KEY_DTYPES:
            rep = check_impl(kernellab.get("histogram", backend), dtype, device="cuda", quick=True, seed=3)
            assert rep.status == PASS, (backend, dtype, [(c.kind, c.name, c.detail) for c in rep.failures])


def test_spec_bytes():
    assert SPEC.count_bytes((1 << 20, 256), torch.uint8, "fwd") == (1 << 20) + 256 * 8


def test_custom_op_opcheck():
    # (kltest.opcheck_custom_ops marks every sample argument for grad; bins is an int)
    def make(rg):
        raise AssertionError("histogram's samples come from make.args")

    make.args = lambda rg: SPEC.make_inputs((1025, 100), torch.int32, "cpu", 3)
    for op, build, _ in kernellab.get("histogram", "triton").custom_ops:
        torch.library.opcheck(op, build(make))
