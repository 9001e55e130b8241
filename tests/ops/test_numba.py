"""The Numba CUDA backends (numba_v1, numba_v2, numba) of relu, gelu, add and softmax, and
the Numba transpose kernels.

Here, in the main test process (numba.cuda is the real target, no GPU): registration and
declared dtypes, bf16 and CPU tensors refused naming the argument, every kernel compiled to
PTX for sm_80 and sm_90 through NVVM (what ``kernellab asm`` and the compile-only check
show). Then the simulator suite, tests/ops/numba_sim_cases.py, in a child process started
with NUMBA_ENABLE_CUDASIM=1 (Numba reads it when numba.cuda is first imported). On a GPU
(marked ``gpu``): every backend against the reference, the check engine, transpose."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import kernellab
from kernellab import numba_support
from kernellab.core import registry
from kltest import dtype_id, seed_for, shape_id

pytest.importorskip("numba")
pytest.importorskip("numba.cuda")

OPS = ["relu", "gelu", "add", "softmax"]
BACKENDS = ["numba_v1", "numba_v2", "numba"]
HERE = Path(__file__).resolve().parent
GELU = lambda x: torch.nn.functional.gelu(x, approximate="tanh")  # noqa: E731


def test_every_op_has_the_numba_rungs():
    for op in OPS:
        for b in BACKENDS:
            impl = registry.get(op, b)
            assert impl.builtin and impl.dtypes == (torch.float32, torch.float16), impl.name
            assert impl.description.startswith("Numba"), impl.name
            assert isinstance(impl.module, numba_support.Kernels)
        # numbered rungs say what they change; v1 stays the baseline
        assert "one thread per" in registry.get(op, "numba_v1").description
    assert "grid-stride" in registry.get("relu", "numba_v2").description
    assert "block per row" in registry.get("softmax", "numba_v2").description


def test_availability_here():
    for op in OPS:
        impl = registry.get(op, "numba")
        if torch.cuda.is_available():
            assert impl.devices == ("cuda",) and impl.why_unavailable("cuda") is None
        else:  # the simulator is off in this process: compile only, like the CUDA backends
            assert impl.devices == ("cuda", "cpu")
            assert impl.why_unavailable("cpu") == impl.why_unavailable("cuda") == "no GPU"


@pytest.mark.parametrize("op", OPS)
def test_bf16_is_refused_naming_the_argument(op):
    """Numba has no bfloat16 arrays: a TypeError before any launch (no GPU needed)."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    args = kernellab.get_spec(op).make_inputs((3, 5), torch.bfloat16, dev, 0)
    first = kernellab.get_spec(op).arg_names[0]
    for b in BACKENDS:
        msg = rf"{op} \(numba\): {first} has dtype torch.bfloat16; expected one of fp32, fp16"
        with pytest.raises(TypeError, match=msg):
            getattr(kernellab, op)(*args, backend=b)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-tensor path without a GPU")
def test_cpu_tensor_without_the_simulator_is_refused():
    for op in OPS:
        args = kernellab.get_spec(op).make_inputs((3, 5), torch.float32, "cpu", 0)
        msg = r"\(numba\): \w+ is on cpu; CPU tensors run only under Numba's CUDA simulator"
        with pytest.raises(ValueError, match=msg):
            getattr(kernellab, op)(*args, backend="numba")


def _nvvm_or_skip():
    try:
        from numba.cuda.cudadrv import nvvm

        nvvm.NVVM()
    except Exception as e:  # noqa: BLE001 - no libnvvm: the PTX tests cannot run here
        pytest.skip(f"NVVM (libnvvm) not found, Numba cannot compile to PTX: {e}")


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
@pytest.mark.parametrize("op", OPS)
def test_kernels_compile_to_ptx_without_a_gpu(op, dtype):
    _nvvm_or_skip()
    kernels = registry.get(op, "numba").module
    for backend, variant in (("numba_v1", 1), ("numba_v2", 2)):
        ptx = kernels.ptx("sm_80", backend, dtype)
        assert ptx and all(name.endswith(f"_v{variant}") for name in ptx), list(ptx)
        for name, text in ptx.items():
            assert ".entry" in text and ".target sm_80" in text, name
            assert ".local" not in text, f"{name} spills to local memory"
    if op == "softmax":  # v2: a block per row, shared-memory tree with barriers
        v2 = kernels.ptx("sm_90", "numba_v2", dtype)
        assert all("bar.sync" in t and "st.shared" in t for t in v2.values())
        assert not any("bar.sync" in t for t in kernels.ptx("sm_90", "numba_v1", dtype).values())


def test_transpose_kernels_compile_to_ptx():
    _nvvm_or_skip()
    kernels = numba_support.Kernels("kernellab.ops._numba_transpose", ndim=2, best=2)
    (naive,) = kernels.ptx("sm_90", "numba_v1").values()
    (tiled,) = kernels.ptx("sm_90", "numba").values()
    assert "bar.sync" not in naive and "ld.shared" not in naive
    assert "bar.sync" in tiled and "ld.shared" in tiled and "st.shared" in tiled
    assert "[4224]" in tiled  # the shared tile: 32 x 33 floats (padded), not 32 x 32 (4096 B)
    assert "[4224]" in kernels.ptx("sm_80", "numba_v2", "fp16")["transpose_v2"]


def test_asm_shows_the_ptx(cli_run):
    _nvvm_or_skip()
    code, out = cli_run("asm", "softmax", "-b", "numba_v2", "--arch", "sm_90")
    assert code == 0 and "softmax_fwd_v2" in out and "softmax_bwd_v2" in out and "Numba CUDA" in out
    code, out = cli_run("asm", "relu", "-b", "numba", "--dtype", "bf16")
    assert code == 1 and "no bf16 arrays" in out


def test_compile_only_check_here():
    """Without a GPU `kernellab check` reports the Numba backends compiled, not run."""
    if torch.cuda.is_available():
        pytest.skip("on a GPU the backends run")
    _nvvm_or_skip()
    from kernellab.harness.check import check_impl

    rep = check_impl(registry.get("add", "numba_v1"), torch.float32, device="cpu", quick=True)
    assert rep.status == "compiled", (rep.status, rep.reason)
    assert "sm_80" in rep.cases[0].detail and "sm_90" in rep.cases[0].detail


def test_simulator_suite():
    """tests/ops/numba_sim_cases.py in a child process with the simulator on."""
    if torch.cuda.is_available():
        pytest.skip("the simulator suite runs on machines without a GPU")
    src = str(Path(kernellab.__file__).resolve().parent.parent)
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    env["PYTHONPATH"] = os.pathsep.join([src] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(HERE / "numba_sim_cases.py")],
        cwd=HERE.parent.parent, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    tail = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, tail
    assert " passed" in tail and "skipped" not in tail.splitlines()[-1], tail


# --------------------------------------------------------------------------- GPU

GPU_SHAPES = [(1,), (17,), (1025,), (129, 1000), (70000, 3), (3, 8192)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=dtype_id)
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=shape_id)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", OPS)
def test_gpu_forward_and_gradient(op, backend, shape, dtype):
    from kernellab.harness.compare import judge

    spec = kernellab.get_spec(op)
    args = spec.make_inputs(shape, dtype, "cuda", seed_for(op, backend, shape, dtype))
    fn = getattr(kernellab, op)
    out = fn(*args, backend=backend)
    ref = spec.reference(*(a.double() for a in args))
    base = fn(*args, backend="torch")
    v = judge(out, ref, dtype, base)
    assert v.ok, v.detail
    if op == "add":
        return
    (x,) = args
    dy = torch.randn(shape, device="cuda").to(dtype)
    leaf = x.detach().clone().requires_grad_()
    (g,) = torch.autograd.grad(fn(leaf, backend=backend), leaf, dy)
    x64 = x.detach().double().requires_grad_()
    (g64,) = torch.autograd.grad(spec.reference(x64), x64, dy.double())
    t = x.detach().clone().requires_grad_()
    (gt,) = torch.autograd.grad(fn(t, backend="torch"), t, dy)
    v = judge(g, g64, dtype, gt)
    assert v.ok, ("grad", v.detail)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", OPS)
def test_gpu_check_engine(op, backend):
    from kernellab.harness.check import PASS, check_impl

    for dtype in (torch.float32, torch.float16):
        rep = check_impl(registry.get(op, backend), dtype, device="cuda", quick=True)
        assert rep.status == PASS, [(c.kind, c.name, c.detail) for c in rep.failures]


@pytest.mark.gpu
def test_gpu_runs_on_torchs_current_stream():
    s = torch.cuda.Stream()
    x = torch.randn(1 << 20, device="cuda")
    with torch.cuda.stream(s):
        y = kernellab.gelu(x, backend="numba")
    s.synchronize()
    torch.testing.assert_close(y, GELU(x))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 1), (33, 17), (4096, 4096), (1000, 8193)], ids=shape_id)
def test_gpu_transpose(shape):
    from kernellab.ops import _numba_transpose as nt

    for dtype in (torch.float32, torch.float16):
        x = torch.randn(shape, device="cuda").to(dtype)
        for fn in (nt.transpose_naive, nt.transpose_tiled):
            assert torch.equal(fn(x), x.t().contiguous()), (fn.__name__, dtype)
