"""The NVRTC runtime (kernellab.cuda.runtime).

Without a GPU: every .cu module compiles for sm_80 and sm_90 (cubin), the vectorized
kernels really use 16-byte accesses and no local memory (PTX), the disk cache is hit,
compile errors carry the NVRTC log. With a GPU (``gpu`` tests): a module from a source
string runs and gives the right answer, also on a non-default stream.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import kernellab
from kernellab.cuda import runtime
from kernellab.cuda.runtime import CHECK_ARCHS, CudaError, Module, compile_source

PKG = Path(kernellab.__file__).resolve().parent
CU_FILES = sorted(PKG.rglob("*.cu"))
# Elementwise kernels built on common.cuh's map loops follow cuda/elementwise.py's naming
# contract and must vectorize every access; row-wise, matmul and attention kernels have
# their own tests.
ELEMENTWISE_CU = [p for p in CU_FILES if "map1_vec16" in p.read_text() or "map2_vec16" in p.read_text()]
ELF_MAGIC = b"\x7fELF"

SCALE_SRC = r"""
extern "C" __global__ void scale_add(const float* x, float* y, float a, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + 1.0f;
}
"""


def _entries(ptx: str) -> dict[str, str]:
    """Kernel name -> its PTX body."""
    out = {}
    for chunk in re.split(r"\.entry\s+", ptx)[1:]:
        out[chunk.split("(", 1)[0].strip()] = chunk
    return out


def _registry_module_objects() -> dict[Path, Module]:
    """The .cu files behind registered backends with a precompile hook -> their Module."""
    mods = {}
    for impl in kernellab.impls():
        pre = impl.precompile
        owner = getattr(pre, "__self__", None)
        if isinstance(owner, Module) and owner.path is not None:
            mods[owner.path.resolve()] = owner
    return mods


def _registry_modules() -> set[Path]:
    return set(_registry_module_objects())


# --------------------------------------------------------------------------- compile (CPU)


def test_nvrtc_is_usable_here():
    # CI proves the CUDA kernels compile: NVRTC and the CUDA headers must be installed.
    assert runtime.nvrtc_unavailable() is None
    assert re.fullmatch(r"\d+\.\d+", runtime.nvrtc_version())
    assert CHECK_ARCHS == ("sm_80", "sm_90")


def test_every_cu_file_belongs_to_a_registered_backend():
    assert CU_FILES, "no .cu files found in the package"
    assert {p.resolve() for p in CU_FILES} == _registry_modules()


@pytest.mark.parametrize("path", CU_FILES, ids=lambda p: p.name)
def test_every_module_compiles_to_cubin_for_check_archs(path, kl_cache):
    # A module registered with arch-specific targets (matmul_sm90.cu: sm_90a) compiles for
    # those instead of the check archs.
    mod = Module(path, archs=_registry_module_objects()[path.resolve()].archs)
    archs = mod.archs or CHECK_ARCHS
    lines = mod.precompile(CHECK_ARCHS)
    assert len(lines) == len(archs)
    for arch, line in zip(archs, lines, strict=True):
        assert line.startswith(f"{path.name}: {arch} cubin ")
        cubin = mod.compile(arch)  # now from the cache
        assert cubin[:4] == ELF_MAGIC
    # Every cubin was written to the (fresh) cache.
    assert len(list((kl_cache / "cuda").glob("*.cubin"))) == len(archs)


@pytest.mark.parametrize("path", ELEMENTWISE_CU, ids=lambda p: p.name)
def test_cubin_holds_every_kernel_the_host_asks_for(path):
    """The naming contract of cuda/elementwise.py: <base>_<dtype> (vectorized),
    <base>_x1_<dtype> (vectorized, one pack per thread) and <base>_v1_<dtype> (scalar)
    for f32, f16 and bf16; <base>_w8_<dtype> (8-byte packs) beside a vectorized kernel."""
    cubin = Module(path).compile("sm_90")
    names = set(_entries(Module(path).compile("sm_90", target="ptx").decode()))
    assert names, "no kernels"
    for name in names:
        assert name.encode() in cubin, name
    for n in (n for n in names if "_w8_" in n):
        assert n.replace("_w8_", "_") in names, f"{n} has no 16-byte twin"
    vectorized = {n for n in names if "_v1_" not in n and "_x1_" not in n and "_w8_" not in n}
    for n in vectorized:
        base, sfx = n.rsplit("_", 1)
        assert sfx in ("f32", "f16", "bf16"), n
        assert f"{base}_v1_{sfx}" in names, f"{n} has no scalar fallback {base}_v1_{sfx}"
        assert f"{base}_x1_{sfx}" in names, f"{n} has no one-pack-per-thread twin {base}_x1_{sfx}"
    for sfx in ("f32", "f16", "bf16"):
        assert any(n.endswith("_" + sfx) for n in vectorized), sfx


@pytest.mark.parametrize("arch", CHECK_ARCHS)
@pytest.mark.parametrize("path", ELEMENTWISE_CU, ids=lambda p: p.name)
def test_ptx_vector_accesses_and_no_local_memory(path, arch):
    ptx = Module(path).compile(arch, target="ptx").decode()
    assert f".target {arch}" in ptx
    entries = _entries(ptx)
    vectorized = {n: body for n, body in entries.items() if "_v1_" not in n}
    assert vectorized
    for name, body in vectorized.items():
        # 16 bytes: v4 of 32-bit; w8 kernels, 8 bytes: v2 of 32-bit or v4 of 16-bit
        v = r"(v2\.(?:[fbu]32)|v4\.(?:[fbu]16))" if "_w8_" in name else r"v4\."
        assert re.search(rf"\bld\.global(\.nc)?\.{v}", body), f"{name}: no vector load"
        assert re.search(rf"\bst\.global\.{v}", body), f"{name}: no vector store"
    for name, body in entries.items():
        # .local: stack frames or register spills - arrays indexed at run time, too many
        # registers; none of these kernels needs any.
        assert ".local" not in body, f"{name} uses local memory"
    assert ".local" not in ptx


def test_ptx_scalar_kernels_do_plain_accesses():
    ptx = Module(ELEMENTWISE_CU[0]).compile("sm_90", target="ptx").decode()
    scalar = {n: b for n, b in _entries(ptx).items() if "_v1_" in n}
    assert scalar
    for name, body in scalar.items():
        assert not re.search(r"\.v4\.", body), f"{name} (v1) should not use vector accesses"


# --------------------------------------------------------------------------- disk cache


def _no_nvrtc(*a, **k):
    raise AssertionError("NVRTC was called although the build is cached")


def test_disk_cache_is_written_and_hit(kl_cache, monkeypatch):
    first = compile_source(SCALE_SRC, "sm_80", name="scale")
    files = list((kl_cache / "cuda").glob("*.cubin"))
    assert len(files) == 1 and files[0].read_bytes() == first
    assert first[:4] == ELF_MAGIC

    # The second compile must not reach NVRTC at all.
    monkeypatch.setattr(runtime, "_nvrtc_compile", _no_nvrtc)
    assert compile_source(SCALE_SRC, "sm_80", name="scale") == first
    # use_cache=False compiles again (here: reaches the patched compile).
    with pytest.raises(AssertionError, match="NVRTC was called"):
        compile_source(SCALE_SRC, "sm_80", name="scale", use_cache=False)


def test_one_compile_gives_cubin_ptx_and_ptxas_log(kl_cache, monkeypatch):
    """The cubin, the PTX and ptxas's verbose log of one build come from one NVRTC run:
    after any one of them, the other two are read from the cache."""
    cubin = compile_source(SCALE_SRC, "sm_90", name="scale")
    cache = kl_cache / "cuda"
    assert [len(list(cache.glob(f"*.{t}"))) for t in ("cubin", "ptx", "log")] == [1, 1, 1]
    monkeypatch.setattr(runtime, "_nvrtc_compile", _no_nvrtc)
    ptx = compile_source(SCALE_SRC, "sm_90", target="ptx").decode()
    log = compile_source(SCALE_SRC, "sm_90", target="log").decode()
    assert cubin[:4] == ELF_MAGIC and ".entry scale_add" in ptx and ".target sm_90" in ptx
    assert "Compiling entry function 'scale_add' for 'sm_90'" in log and "Used " in log and "spill" in log
    assert not ptx.endswith("\0") and not log.endswith("\0")


def test_virtual_arch_gives_ptx_and_no_cubin(kl_cache):
    assert ".target sm_90" in compile_source(SCALE_SRC, "compute_90", target="ptx").decode()
    with pytest.raises(CudaError, match="no cubin for compute_90"):
        compile_source(SCALE_SRC, "compute_90")
    with pytest.raises(ValueError, match="target"):
        compile_source(SCALE_SRC, "sm_90", target="sass")


def test_an_empty_nvrtc_log_leaves_python_bytes_alone(tmp_path):
    """A virtual-arch build has an empty log (1 byte: its NUL). Read into ``b" " * 1``,
    CPython's shared one-byte object, it turned every b" " in the process into b"\\0" (torch.save
    and pickle then failed at random). Run in a fresh process: a failure would poison this one."""
    import os
    import subprocess
    import sys

    code = f"""
from kernellab.cuda.runtime import compile_source
log = compile_source({SCALE_SRC!r}, "compute_90", target="log")
assert log == b"", log
assert bytes([32])[0] == 32 and b" ".join([b"a", b"b"]) == bytes([97, 32, 98]), bytes([32])
print("ok")
"""
    env = dict(os.environ, KERNELLAB_CACHE=str(tmp_path / "klcache"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_cache_key_covers_source_arch_and_options(kl_cache):
    compile_source(SCALE_SRC, "sm_80")
    compile_source(SCALE_SRC, "sm_90")
    compile_source(SCALE_SRC + "\n// changed\n", "sm_80")
    compile_source(SCALE_SRC, "sm_80", options=("--use_fast_math",))
    compile_source(SCALE_SRC, "sm_80", target="ptx")  # a hit: the first compile wrote it
    compile_source(SCALE_SRC, "sm_80")  # a hit: no new file
    cache = kl_cache / "cuda"
    assert len(list(cache.glob("*.cubin"))) == len(list(cache.glob("*.ptx"))) == 4
    assert not list(cache.glob("*.tmp*")), "temporary files left behind"


def test_cache_key_covers_included_headers(kl_cache, tmp_path):
    """Editing a local header included by a .cu file must invalidate its cubin."""
    src_dir = tmp_path / "src"
    src_dir.mkdir()
    header = src_dir / "mine.cuh"
    header.write_text("#define KL_VALUE 1.0f\n")
    cu = src_dir / "k.cu"
    cu.write_text('#include "mine.cuh"\nextern "C" __global__ void k(float* y) { y[0] = KL_VALUE; }\n')
    mod = Module(cu)
    mod.compile("sm_80")
    header.write_text("#define KL_VALUE 2.0f\n")
    mod.compile("sm_80")
    assert len(list((kl_cache / "cuda").glob("*.cubin"))) == 2


def test_cache_dir_follows_the_environment(tmp_path, monkeypatch):
    from kernellab.device import cache_dir

    for name in ("a", "b"):
        monkeypatch.setenv("KERNELLAB_CACHE", str(tmp_path / name))
        assert cache_dir() == tmp_path / name and (tmp_path / name).is_dir()


# --------------------------------------------------------------------------- errors and options


BROKEN_SRC = 'extern "C" __global__ void k(float* y) { y[0] = undefined_symbol_xyz; }\n'


@pytest.mark.parametrize("target", ["cubin", "ptx"])
def test_compile_error_raises_cuda_error_with_the_nvrtc_log(kl_cache, target):
    with pytest.raises(CudaError) as e:
        compile_source(BROKEN_SRC, "sm_90", target=target, name="broken.cu")
    msg = str(e.value)
    assert "NVRTC failed to compile broken.cu" in msg
    assert 'identifier "undefined_symbol_xyz" is undefined' in msg
    assert not list((kl_cache / "cuda").glob("*")), "a failed compile must not be cached"


def test_module_from_broken_source_fails_precompile():
    with pytest.raises(CudaError, match="undefined_symbol_xyz"):
        Module(source=BROKEN_SRC).precompile(["sm_80"])


def test_macros_reach_nvrtc(kl_cache):
    src = (
        "#ifndef KL_N\n#error KL_N must be defined\n#endif\n"
        'extern "C" __global__ void k(int* y) { y[0] = KL_N; }\n'
    )
    with pytest.raises(CudaError, match="KL_N must be defined"):
        compile_source(src, "sm_80")
    assert compile_source(src, "sm_80", options=("-DKL_N=7",))[:4] == ELF_MAGIC
    ptx = compile_source(src, "sm_80", options=("-DKL_N=7",), target="ptx").decode()
    assert re.search(r"mov\.u32\s+%r\d+,\s*7;|st\.global\.u32\s+\[%rd\d+\],\s*7;", ptx), ptx[-400:]


def test_unsupported_option_is_refused():
    with pytest.raises(ValueError, match=r"compile option '--keep' is not supported"):
        compile_source(SCALE_SRC, "sm_80", options=("--keep",), use_cache=False)


def test_module_needs_exactly_one_of_path_or_source(tmp_path):
    with pytest.raises(ValueError, match="exactly one of path or source"):
        Module()
    with pytest.raises(ValueError, match="exactly one of path or source"):
        Module(CU_FILES[0], source=SCALE_SRC)
    assert Module(source=SCALE_SRC).label == "<source>"
    assert Module(CU_FILES[0]).label == CU_FILES[0].name
    assert Module(CU_FILES[0]).source == CU_FILES[0].read_text()


# wgmma exists only on sm_90a: ptxas refuses it for plain sm_90.
WGMMA_SRC = (
    'extern "C" __global__ void k(float* y) { asm volatile("wgmma.fence.sync.aligned;"); y[0] = 1.f; }\n'
)


def test_module_archs_map_to_arch_specific_targets(kl_cache):
    plain = Module(source=SCALE_SRC)
    assert plain.archs is None and plain.target_arch("sm_80") == "sm_80"  # unchanged default
    with pytest.raises(CudaError, match="not supported on .target 'sm_90'"):
        Module(source=WGMMA_SRC).compile("sm_90")
    mod = Module(source=WGMMA_SRC, archs=("sm_90a",))
    assert mod.target_arch("sm_90") == "sm_90a"  # what Module.kernel asks for on an H100
    assert mod.target_arch("sm_90a") == "sm_90a"
    assert mod.compile("sm_90")[:4] == ELF_MAGIC
    assert ".target sm_90a" in mod.compile("sm_90", target="ptx").decode()
    with pytest.raises(CudaError, match=r"built only for sm_90a, not for sm_80"):
        mod.compile("sm_80")
    # precompile (the CPU check's "compiled, not run") compiles for the module's archs
    lines = mod.precompile(CHECK_ARCHS)
    assert len(lines) == 1 and lines[0].startswith("<source>: sm_90a cubin ")
    assert len(list((kl_cache / "cuda").glob("*.cubin"))) == 1


def test_ceil_div():
    assert [runtime.ceil_div(a, 4) for a in (0, 1, 4, 5, 8)] == [0, 1, 1, 2, 2]


# --------------------------------------------------------------------------- cluster launch (CPU)


def test_cluster_launch_structs_match_the_driver_headers():
    """The ctypes CUlaunchConfig / CUlaunchAttribute hold the same bytes as cuda.bindings'
    own structs (generated from cuda.h) filled with the same values."""
    import ctypes

    from cuda.bindings import driver

    attr = driver.CUlaunchAttribute()
    attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = 4, 2, 1
    cfg = driver.CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = 264, 6, 1
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = 1024, 1, 1
    cfg.sharedMemBytes = 32768
    cfg.hStream = driver.CUstream(0xABC0)
    cfg.attrs = [attr]
    cfg.numAttrs = 1

    ours, ours_attr = runtime._cluster_config((264, 6, 1), (1024, 1, 1), (4, 2, 1), 32768, 0xABC0)
    assert ctypes.sizeof(runtime._LaunchAttribute) == 72 and ctypes.sizeof(runtime._LaunchConfig) == 56
    assert ctypes.string_at(attr.getPtr(), 72) == ctypes.string_at(ctypes.addressof(ours_attr), 72)
    theirs = ctypes.string_at(cfg.getPtr(), 56)
    mine = ctypes.string_at(ctypes.addressof(ours), 56)
    attrs_at = runtime._LaunchConfig.attrs.offset  # pointers differ: compare around them
    assert attrs_at == 40 and runtime._LaunchConfig.numAttrs.offset == 48
    assert mine[:attrs_at] == theirs[:attrs_at] and mine[attrs_at + 8 :] == theirs[attrs_at + 8 :]
    assert ctypes.cast(ours.attrs, ctypes.c_void_p).value == ctypes.addressof(ours_attr)
    assert runtime._LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION == int(
        driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    )
    assert runtime._FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED == int(
        driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED
    )
    assert runtime._FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES == int(
        driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    )


def test_cluster_dims_are_checked():
    assert runtime.cluster_dims(264, 8) == ((264, 1, 1), (8, 1, 1))
    assert runtime.cluster_dims((8, 6), (2, 3)) == ((8, 6, 1), (2, 3, 1))
    with pytest.raises(ValueError, match=r"cluster \(8, 1, 1\) must divide grid \(132, 1, 1\)"):
        runtime.cluster_dims(132, 8)
    with pytest.raises(ValueError, match="at most 16"):
        runtime.cluster_dims(64, 32)
    for bad in (0, -2, 2.0, (2, 0), (1, 1, 1, 1), None):
        with pytest.raises(ValueError, match="cluster must be a positive int"):
            runtime.cluster_dims(64, bad)


class _FakeDriver:
    """The entry points launch_cluster and its helpers call, recording what they get."""

    def __init__(self, results=(0,)):
        self.results = list(results)
        self.launches, self.attributes = [], []

    def cuLaunchKernelEx(self, cfg_ref, handle, params, extra):
        import ctypes

        cfg = cfg_ref._obj
        a = cfg.attrs[0]
        slots = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))
        self.launches.append(
            {
                "grid": (cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ),
                "block": (cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ),
                "shared": cfg.sharedMemBytes,
                "stream": cfg.hStream,
                "attr": (a.id, a.value.clusterDim.x, a.value.clusterDim.y, a.value.clusterDim.z),
                "nattrs": cfg.numAttrs,
                "handle": handle,
                "args": (
                    ctypes.c_void_p.from_address(slots[0]).value,
                    ctypes.c_int64.from_address(slots[1]).value,
                    ctypes.c_int32.from_address(slots[2]).value,
                ),
                "extra": extra,
            }
        )
        return self.results.pop(0) if self.results else 0

    def cuOccupancyMaxActiveClusters(self, n_ref, handle, cfg_ref):
        cfg = cfg_ref._obj
        dim = cfg.attrs[0].value.clusterDim
        n_ref._obj.value = 132 // (dim.x * dim.y * dim.z)
        return 0

    def cuFuncSetAttribute(self, handle, attribute, value):
        self.attributes.append((handle, attribute, value))
        return 0

    def cuLaunchKernel(self, *a):  # (Kernel keeps it; the cluster path must not use it)
        raise AssertionError("a cluster launch went through cuLaunchKernel")


def _fake_kernel(monkeypatch, fake):
    class CoreKernel:
        handle = 0x1234

    monkeypatch.setattr(runtime, "_libcuda", lambda: fake)
    monkeypatch.setattr(runtime, "_libcuda_ex", lambda: fake)
    monkeypatch.setattr(runtime, "_function_handle", lambda k: 0x5678)
    monkeypatch.setattr(runtime, "_get_device", lambda: 0)
    monkeypatch.setattr(runtime, "_raw_stream", lambda dev: 0xABC0)
    monkeypatch.setattr(runtime.config, "cuda_launch", "driver")
    return runtime.Kernel(CoreKernel(), "k", ("ptr", "i64", "i32"))


def test_dynamic_shared_limit_leaves_room_for_static_shared_memory(monkeypatch):
    """48 KB is the limit for static and dynamic shared memory together: a kernel with 128 B
    of static shared memory must opt in before a launch with 48 KB of dynamic."""
    fake = _FakeDriver()
    fake.cuFuncGetAttribute = lambda out, attribute, handle: (
        setattr(out._obj, "value", 128 if attribute == runtime._FUNC_ATTRIBUTE_SHARED_SIZE_BYTES else 0) or 0
    )
    k = _fake_kernel(monkeypatch, fake)
    assert k.max_dynamic_shared == 48 * 1024 - 128
    k.set_max_dynamic_shared(48 * 1024)
    assert fake.attributes == [(0x5678, runtime._FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 48 * 1024)]
    # a driver that cannot say (no entry point, or an error): the documented default
    assert _fake_kernel(monkeypatch, _FakeDriver()).max_dynamic_shared == 48 * 1024
    fake.cuFuncGetAttribute = lambda out, attribute, handle: 201
    assert _fake_kernel(monkeypatch, fake).max_dynamic_shared == 48 * 1024


def test_launch_cluster_plumbing(monkeypatch):
    fake = _FakeDriver()
    k = _fake_kernel(monkeypatch, fake)
    k.launch_cluster(64, 1024, 8, 0xDEAD0, 1 << 40, -7, shared=32768)
    k.launch_cluster((6, 4), (32, 8), (2, 2), 0xBEEF0, 5, 3)  # the second call refills the same structs
    first, second = fake.launches
    assert first == {
        "grid": (64, 1, 1), "block": (1024, 1, 1), "shared": 32768, "stream": 0xABC0,
        "attr": (runtime._LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, 8, 1, 1), "nattrs": 1, "handle": 0x5678,
        "args": (0xDEAD0, 1 << 40, -7), "extra": None,
    }  # fmt: skip
    assert second["grid"] == (6, 4, 1) and second["block"] == (32, 8, 1) and second["shared"] == 0
    assert second["attr"][1:] == (2, 2, 1) and second["args"] == (0xBEEF0, 5, 3)
    # refused before the driver sees them
    with pytest.raises(ValueError, match="must divide grid"):
        k.launch_cluster(66, 1024, 4, 0, 0, 0)
    with pytest.raises(TypeError, match="k takes 3 arguments, got 2"):
        k.launch_cluster(64, 1024, 8, 0, 0)
    assert len(fake.launches) == 2
    # occupancy and the non-portable size attribute
    assert k.max_active_clusters(1024, 16, 16384) == 132 // 16
    k.allow_non_portable_cluster_size()
    k.allow_non_portable_cluster_size()  # once per kernel
    assert fake.attributes == [(0x5678, runtime._FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)]


def test_launch_cluster_passes_tensor_maps_by_value(monkeypatch):
    """A cluster launch copies a TensorMap argument's 128 bytes into its parameter slot, as a
    plain launch does (cuda_v15's maps arrived as zeros once: the kernel faulted)."""
    import ctypes

    seen = {}

    def launch(cfg_ref, handle, params, extra):
        slots = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))
        seen["map"] = bytes((ctypes.c_ubyte * 128).from_address(slots[0]))
        seen["n"] = ctypes.c_int32.from_address(slots[1]).value
        return 0

    fake = _FakeDriver()
    fake.cuLaunchKernelEx = launch
    k = _fake_kernel(monkeypatch, fake)
    k = runtime.Kernel(type("CoreKernel", (), {"handle": 0x1234})(), "k", ("tmap", "i32"))
    m = runtime.TensorMap()
    ctypes.memmove(ctypes.addressof(m), bytes(range(128)), 128)
    k.launch_cluster(4, 128, 2, m, 77)
    assert seen == {"map": bytes(range(128)), "n": 77}
    with pytest.raises(TypeError, match="tensor-map argument takes a TensorMap"):
        k.launch_cluster(4, 128, 2, 0, 77)
    monkeypatch.setattr(runtime.config, "cuda_launch", "core")  # cuda.core takes no TensorMap
    k = runtime.Kernel(type("CoreKernel", (), {"handle": 0x1234})(), "k", ("tmap", "i32"))
    with pytest.raises(runtime.CudaError, match="tensor-map arguments need the direct launch"):
        k.launch_cluster(4, 128, 2, m, 77)


def test_driver_calls_bind_the_context_once_where_the_thread_has_none(monkeypatch):
    """_in_context (the occupancy query, tensor-map encoding): a call answered "invalid
    context" is made again after the device's context is bound; any other answer returns."""
    bound, answers = [], [runtime._INVALID_CONTEXT, 0, 719]
    monkeypatch.setattr(runtime, "_bind_context", bound.append)
    assert runtime._in_context(lambda: answers.pop(0), 3) == 0 and bound == [3]
    assert runtime._in_context(lambda: answers.pop(0), 3) == 719 and bound == [3]


def test_launch_cluster_errors_and_context_retry(monkeypatch):
    fake = _FakeDriver(results=[runtime._INVALID_CONTEXT, 0, 719])
    k = _fake_kernel(monkeypatch, fake)
    bound = []
    monkeypatch.setattr(runtime, "_bind_context", bound.append)
    monkeypatch.setattr(runtime, "_error_string", lambda rc: f"error {rc}")
    k.launch_cluster(16, 256, 4, 0, 0, 0)  # no context on this thread: bind it, launch again
    assert bound == [0] and len(fake.launches) == 2
    with pytest.raises(CudaError, match=r"cluster launch of k \(cluster \(4, 1, 1\)\) failed: error 719"):
        k.launch_cluster(16, 256, 4, 0, 0, 0)


# --------------------------------------------------------------------------- GPU


@pytest.mark.gpu
def test_gpu_module_from_source_runs():
    mod = Module(source=SCALE_SRC)
    k = mod.kernel("scale_add", ("ptr", "ptr", "f32", "i64"))
    assert mod.kernel("scale_add", ("ptr", "ptr", "f32", "i64")) is k  # cached
    for n in (1, 255, 256, 257, 100_003):
        x = torch.randn(n, device="cuda")
        y = torch.full_like(x, float("nan"))
        k(runtime.ceil_div(n, 256), 256, x, y, 2.5, n)
        torch.cuda.synchronize()
        torch.testing.assert_close(y, 2.5 * x + 1.0, rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
def test_gpu_launch_on_a_non_default_stream():
    """The launch goes to torch's current stream: on a side stream it is ordered after the
    work queued there before it (a slow spin, then the fill it reads)."""
    mod = Module(source=SCALE_SRC)
    k = mod.kernel("scale_add", ("ptr", "ptr", "f32", "i64"))
    n = 1 << 20
    x = torch.zeros(n, device="cuda")
    y = torch.empty_like(x)
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    assert s != torch.cuda.current_stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(50_000_000)  # ~tens of ms of spinning on s
        x.fill_(3.0)
        k(runtime.ceil_div(n, 256), 256, x, y, 2.0, n)
    s.synchronize()
    assert bool((y == 7.0).all()), "the kernel did not run after the work queued on its stream"


@pytest.mark.gpu
def test_gpu_kernel_argument_count_is_checked():
    k = Module(source=SCALE_SRC).kernel("scale_add", ("ptr", "ptr", "f32", "i64"))
    x = torch.zeros(4, device="cuda")
    with pytest.raises(TypeError, match="scale_add takes 4 arguments, got 3"):
        k(1, 256, x, x, 1.0)


@pytest.mark.gpu
def test_gpu_cuda_core_launch_path(monkeypatch):
    monkeypatch.setattr(kernellab.config, "cuda_launch", "core")
    k = Module(source=SCALE_SRC).kernel("scale_add", ("ptr", "ptr", "f32", "i64"))
    assert k._use_core is True
    x = torch.randn(1000, device="cuda")
    y = torch.empty_like(x)
    k(4, 256, x, y, -1.5, 1000)
    torch.cuda.synchronize()
    torch.testing.assert_close(y, -1.5 * x + 1.0, rtol=1e-6, atol=1e-6)


CLUSTER_SRC = r"""
#define CLUSTER_SYNC "barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;"
extern "C" __global__ void ranks(unsigned* out) {
    __shared__ unsigned mine;
    unsigned rank, size, addr, peer;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(size));
    if (threadIdx.x == 0) mine = 0;
    asm volatile(CLUSTER_SYNC ::: "memory");
    // every thread adds 1 to the next block's word, through distributed shared memory
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
                 : "=r"(peer) : "r"((unsigned)__cvta_generic_to_shared(&mine)), "r"((rank + 1) % size));
    asm volatile("red.relaxed.cluster.shared::cluster.add.u32 [%0], 1;" :: "r"(peer) : "memory");
    asm volatile(CLUSTER_SYNC ::: "memory");
    if (threadIdx.x == 0) out[blockIdx.x] = (rank << 24) | (size << 16) | mine;
}
"""


def test_cluster_kernel_source_compiles_for_sm90(kl_cache):
    ptx = compile_source(CLUSTER_SRC, "sm_90", target="ptx").decode()
    assert "mapa.shared::cluster" in ptx and "barrier.cluster.wait" in ptx
    assert compile_source(CLUSTER_SRC, "sm_90")[:4] == ELF_MAGIC


@pytest.mark.gpu
@pytest.mark.parametrize("launch", ["driver", "core"])
def test_gpu_cluster_launch(monkeypatch, launch):
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("thread-block clusters need sm_90+")
    monkeypatch.setattr(kernellab.config, "cuda_launch", launch)
    k = Module(source=CLUSTER_SRC).kernel("ranks", ("ptr",))
    k._use_core = launch == "core"
    for cluster in (2, 4, 8):
        out = torch.zeros(64, dtype=torch.int32, device="cuda")
        k.launch_cluster(64, 96, cluster, out)
        torch.cuda.synchronize()
        got = out.cpu().tolist()
        want = [((b % cluster) << 24) | (cluster << 16) | 96 for b in range(64)]
        assert got == want, (launch, cluster)
    assert k.max_active_clusters(96, 8) >= 1


def _in_a_new_thread(fn) -> None:
    """fn() on a thread of its own (which has made no CUDA call); its exception re-raised here."""
    import threading

    errors = []

    def run():
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - reported in the calling thread
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert not errors, errors


def _drop_context() -> None:
    assert runtime._libcuda().cuCtxSetCurrent(None) == 0  # this thread: no context, for certain


@pytest.mark.gpu
def test_gpu_launch_from_a_thread_without_a_current_context():
    """A thread that made no runtime call has no current context (autograd's device thread
    when our kernel is the first of a backward: the conv2d CUDA dgrad failed with "invalid
    device context"). The launch binds the device's primary context and runs, by either
    entry point."""
    k = Module(source=SCALE_SRC).kernel("scale_add", ("ptr", "ptr", "f32", "i64"))
    x = torch.randn(1000, device="cuda")
    ys = [torch.empty_like(x), torch.empty_like(x)]
    dev = x.device.index

    def run():
        _drop_context()
        k(4, 256, x, ys[0], 2.0, 1000, device_index=dev)
        _drop_context()
        k.launch_1d(4, 256, [x.data_ptr(), ys[1].data_ptr(), 3.0, 1000], dev)

    _in_a_new_thread(run)
    torch.cuda.synchronize()
    torch.testing.assert_close(ys[0], 2.0 * x + 1.0, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ys[1], 3.0 * x + 1.0, rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
def test_gpu_kernel_loaded_before_any_cuda_work_takes_attributes():
    """A kernel loaded on a thread with no current context (a fresh process that compiles
    before touching the GPU) still resolves a CUfunction: raising its dynamic shared memory
    limit works, and a launch that uses the raised limit runs."""
    x = torch.randn(1000, device="cuda")
    y = torch.empty_like(x)
    dev = x.device.index

    def run():
        _drop_context()
        k = Module(source=SCALE_SRC).kernel("scale_add", ("ptr", "ptr", "f32", "i64"), dev)
        k.set_max_dynamic_shared(96 * 1024)
        k(4, 256, x, y, 2.0, 1000, shared=96 * 1024, device_index=dev)

    _in_a_new_thread(run)
    torch.cuda.synchronize()
    torch.testing.assert_close(y, 2.0 * x + 1.0, rtol=1e-6, atol=1e-6)


def test_module_refuses_a_launch_signature_the_kernel_does_not_take():
    from types import SimpleNamespace

    from kernellab.cuda.runtime import CudaError, _param_sizes, check_signature

    core = SimpleNamespace(
        arguments_info=[SimpleNamespace(offset=0, size=8), SimpleNamespace(offset=8, size=4)]
    )
    assert _param_sizes(core) == [8, 4]
    check_signature("k", ("ptr", "i32"), _param_sizes(core))
    with pytest.raises(CudaError, match=r"kernel k: .*\[8, 8\].*\[8, 4\]"):
        check_signature("k", ("ptr", "ptr"), _param_sizes(core))
    assert _param_sizes(object()) is None  # bindings that cannot tell: no check
    check_signature("k", ("ptr", "ptr"), None)
