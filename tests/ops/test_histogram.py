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

RUNGS = ("v1", "v2", "v3", "v4", "v5", "v6", "v7")
_CUDA_KERNELS = [f"hist_{v}_{s}" for v in RUNGS[:5] for s in ("u8", "i32", "i64")]
_LARGE_KERNELS = [f"hist_{v}_{s}" for v in ("v6", "v7", "v7_plain") for s in ("u8", "i32", "i64")]


def test_cuda_ladder_compiles_and_documents_itself():
    from kernellab.cuda.runtime import nvrtc_unavailable
    from kernellab.ops.histogram import cuda as hcuda

    impls = {i.backend: i for i in kernellab.impls("histogram")}
    assert {"cuda", *(f"cuda_{v}" for v in RUNGS)} <= set(impls)
    for v in RUNGS:  # one line each, what the rung changes
        assert impls[f"cuda_{v}"].description.startswith(f"CUDA {v}: ")
        assert re.search(rf"^//\s+{v}\s+hist_{v}", hcuda.MODULE.source, re.M), v
        assert impls[f"cuda_{v}"].module is (hcuda.MODULE_LARGE if v in ("v6", "v7") else hcuda.MODULE)
    # documented limits: each privatized rung refuses bins past what its shared memory holds
    # (v2-v5 12288 uint32 bins, v6 65536 16-bit ones, v7 2^17 over a cluster), v1 and cuda don't
    x = torch.zeros(4, dtype=torch.int32)
    for v in RUNGS[1:]:
        limits = impls[f"cuda_{v}"].outside_limits
        most = hcuda.MAX_BINS[v]
        assert f"bins={most + 1}" in limits((x, most + 1), {}) and limits((x, most), {}) is None
        assert limits((x, 4096), {}) is None
    assert hcuda.MAX_BINS["v5"] == 12288 and hcuda.MAX_BINS["v6"] == 65536 == hcuda.PACKED_BINS
    assert hcuda.MAX_BINS["v7"] >= 65536
    for b in ("cuda_v1", "cuda"):
        assert impls[b].outside_limits((x, 1 << 20), {}) is None
    if nvrtc_unavailable():
        pytest.skip(nvrtc_unavailable())
    for arch in ("sm_80", "sm_90"):
        ptx = hcuda.MODULE.compile(arch, target="ptx").decode()
        assert set(_ptx_entries(ptx)) == set(_CUDA_KERNELS)  # v1-v5 only: v6-v7 are the other module's
        assert "match.any" in ptx and "atom.shared.add.u32" in ptx and "atom.global.add.u64" in ptx
        assert "vote.sync.ballot" in ptx and "shfl.sync.idx" in ptx  # v5
        entries = _ptx_entries(hcuda.MODULE_LARGE.compile(arch, target="ptx").decode())
        assert set(entries) == set(_LARGE_KERNELS)
        for s in ("u8", "i32", "i64"):
            v6 = entries[f"hist_v6_{s}"]  # the 16-bit add reads the old word back: atom, not red
            assert "atom.shared.add.u32" in v6 and "shr.u32" in v6 and ".local" not in v6
            for name in (f"hist_v7_{s}", f"hist_v7_plain_{s}"):
                body = entries[name]
                if arch == "sm_90":  # distributed shared memory: mapa + remote red, cluster barriers
                    assert "mapa.shared::cluster.u32" in body, name
                    assert "red.relaxed.cluster.shared::cluster.add.u32" in body, name
                    assert body.count("barrier.cluster.arrive") == 2 and "%cluster_ctarank" in body, name
                    assert ".local" not in body, name
                    ballot = "vote.sync.ballot" in body  # v7 aggregates in the warp, v7_plain not
                    assert ballot == (name == f"hist_v7_{s}"), name
                else:  # sm_80 has no clusters: a stub that traps (never launched there)
                    assert "trap" in body and "mapa" not in body, name


def _ptx_entries(ptx: str) -> dict[str, str]:
    return {c.split("(", 1)[0].strip(): c for c in re.split(r"\.entry\s+", ptx)[1:]}


def test_ladder_lists_the_large_histogram_rungs():
    from kernellab.harness import ladder

    steps = {r.backend: r for r in ladder.rungs("histogram")["cuda"]}
    assert [r.n for r in ladder.rungs("histogram")["cuda"]] == list(range(1, 8))
    assert steps["cuda_v6"].change.startswith("16-bit shared counters")
    assert "cluster" in steps["cuda_v7"].change and "\n" not in steps["cuda_v7"].change


def test_best_variant_and_default_cluster():
    from kernellab.ops.histogram.cuda import CLUSTER_BINS, best_variant, default_cluster, packed_bytes

    h100, a100, t4 = ((9, 0), 232448), ((8, 0), 166912), ((7, 5), 65536)
    for dev in (h100, a100, t4):  # a uint32 histogram in 48 KB: v3 everywhere
        assert best_variant(1, *dev) == best_variant(12288, *dev) == "v3"
    assert [best_variant(b, *h100) for b in (12289, 65536, 65537, CLUSTER_BINS, CLUSTER_BINS + 1)] == [
        "v6", "v6", "v7", "v7", "v1"]  # fmt: skip
    assert best_variant(65537, (10, 0), 232448) == "v7"  # clusters after Hopper too
    assert [best_variant(b, *a100) for b in (12289, 65536, 65537)] == ["v6", "v6", "v1"]
    # a T4 opts in to 64 KB: v6 holds 32768 bins there, not 65536
    assert packed_bytes(32768) == 65536 and packed_bytes(65535) == packed_bytes(65536) == 131072
    assert [best_variant(b, *t4) for b in (32768, 32769, 65536)] == ["v6", "v1", "v1"]
    # smallest power of two in [2, 8] whose slice of uint32 bins fits 128 KB
    sizes = [default_cluster(b) for b in (1, 4096, 65536, 65537, 131072)]
    assert sizes == [2, 2, 2, 4, 4]


def test_cuda_launcher_refuses_bad_options_naming_them():
    from kernellab.ops.histogram.cuda import histogram_cuda

    x = torch.zeros(4, dtype=torch.int32)  # refused before anything touches a GPU
    cases = [
        (("v7",), {"cluster": 3}, "cluster"),
        (("v7",), {"cluster": 32}, "cluster"),
        (("v3",), {"cluster": 4}, "cluster"),
        (("v6",), {"grid": 0}, "grid"),
        (("v1",), {"grid": 4}, "grid"),
        (("v3",), {"aggregate": True}, "aggregate"),
        (("v6",), {"aggregate": True}, "aggregate"),
    ]
    for (variant,), kw, word in cases:
        with pytest.raises(ValueError, match=rf"\b{word}\b"):
            histogram_cuda(x, 8, variant, **kw)
    for variant, bins in (("v5", 12289), ("v6", 65537), ("v7", (1 << 17) + 1)):
        with pytest.raises(ValueError, match=rf"bins={bins}\b"):
            histogram_cuda(x, bins, variant)


def _packed16(keys, bins: int, field_bits: int = 16) -> list[int]:
    """histogram.cu's add16 in Python, one atomic at a time in the given order: words of
    two ``field_bits`` fields, wraps credited to ``out`` the way the kernel does, then the
    flush. (``field_bits`` small makes the wraps frequent.)"""
    f = 1 << field_bits
    full = f * f - 1  # the word's largest value
    sh = [0] * ((bins + 1) // 2)
    out = [0] * bins
    for b, c in keys:
        high = b & 1
        d = c * f if high else c
        w = b >> 1
        old = sh[w]
        sh[w] = (old + d) & full
        hb = b | 1
        if old > full - d and hb < bins:
            out[hb] += f
        if not high and (old & (f - 1)) + c > f - 1:
            out[b] += f
            if hb < bins:
                out[hb] -= 1
    for w, v in enumerate(sh):
        out[2 * w] += v & (f - 1)
        if 2 * w + 1 < bins:
            out[2 * w + 1] += v >> field_bits
    return out


def test_packed_16bit_wrap_accounting_is_exact():
    # v6's arithmetic: whatever order the increments land in, whatever group sizes the warp
    # aggregation adds (1..32), credits + flushed fields are the exact counts; fields of 4
    # and 5 bits (wraps every 16 / 32 counts) and of 16 bits (the kernel's). One add may
    # wrap a field at most once: its count is below the field's range.
    gen = torch.Generator().manual_seed(0)
    # (bins, hot bin): a high field; a low field below a real high one; the low field of an
    # odd bin count's last word (its high half is no bin)
    cases = ((2, 1, 4, 3000), (8, 4, 5, 4000), (7, 6, 4, 5000), (4, 2, 16, 300_000), (5, 4, 16, 200_000))
    for bins, hot, bits, n in cases:
        b = torch.randint(0, bins, (n,), generator=gen)
        b[torch.rand(n, generator=gen) < 0.7] = hot
        c = torch.randint(1, min(33, 1 << bits), (n,), generator=gen)  # (kernel: c <= 32 < 2^16)
        keys = list(zip(b.tolist(), c.tolist()))
        want = torch.zeros(bins, dtype=torch.int64).index_add_(0, b, c).tolist()
        assert _packed16(keys, bins, bits) == want, (bins, bits)
        assert _packed16(keys[::-1], bins, bits) == want


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
def test_gpu_v6_wraps_exactly():
    # one block counts 2^22 keys, 90% in one bin: its 16-bit field wraps ~57 times, with the
    # hot bin in a low field, a high field, and the low field of an odd bin count's last word
    from kernellab.ops.histogram.cuda import histogram_cuda

    for bins, hot in ((65536, 40000), (65536, 40001), (65535, 65534), (4097, 4096), (2, 1)):
        x = make_keys((1 << 22) + 3, bins, torch.int32, "cuda", distribution="skewed", hot=hot)
        x[::97] = -1
        for grid in (1, 3):
            y = histogram_cuda(x, bins, "v6", grid=grid)
            assert torch.equal(y.cpu(), histogram_reference(x, bins)), (bins, hot, grid)


@pytest.mark.gpu
@pytest.mark.parametrize("cluster", [2, 4, 8, 16])
def test_gpu_v7_every_cluster_size(cluster):
    from kernellab.ops.histogram.cuda import _available_clusters, histogram_cuda

    if _available_clusters():
        pytest.skip(_available_clusters())
    optin = torch.cuda.get_device_properties(0).shared_memory_per_block_optin
    for bins in (1, 3, 4096, 12289, 65536, 65537, 1 << 17):
        if -(-bins // cluster) * 4 > optin:
            with pytest.raises(ValueError, match="bins"):
                histogram_cuda(torch.zeros(4, dtype=torch.int32, device="cuda"), bins, "v7", cluster=cluster)
            continue
        for dist in ("uniform", "skewed"):
            x = _keys((1 << 21) + 5, bins, torch.int64, dist, seed_for(cluster, bins, dist), "cuda")
            for aggregate in (True, False):
                y = histogram_cuda(x[1:], bins, "v7", cluster=cluster, aggregate=aggregate)
                assert torch.equal(y.cpu(), histogram_reference(x[1:], bins)), (bins, dist, aggregate)


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
