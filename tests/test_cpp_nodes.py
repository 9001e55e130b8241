"""The C++ autograd nodes (kernellab/cuda/nodes.py, nodes.cpp) and the ``cuda_node`` backends
of rms_norm and layer_norm: the option, the build, the refusals on the CPU, and on a GPU the
node's numbers against float64 and PyTorch's own op."""

from __future__ import annotations

import pytest
import torch

import kernellab
from kernellab.core import registry
from kernellab.cuda import nodes


@pytest.fixture
def fresh_nodes(monkeypatch, tmp_path):
    """nodes' state forgotten, the cache in tmp_path (nothing built there), the option unset."""
    monkeypatch.setenv("KERNELLAB_CACHE", str(tmp_path))
    saved = dict(nodes._STATE)
    nodes._STATE.clear()
    kernellab.config.reset("cpp_nodes")
    yield tmp_path
    nodes._STATE.clear()
    nodes._STATE.update(saved)
    kernellab.config.reset("cpp_nodes")


def test_auto_without_a_gpu_never_builds(fresh_nodes, monkeypatch):
    monkeypatch.setattr(nodes.torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(nodes.subprocess, "Popen", None)  # (a build would fail loudly)
    assert nodes.module() is None
    assert "not built" in nodes.why_unavailable()
    assert not any(fresh_nodes.rglob("*.so"))


class _FakeBuild:
    """subprocess.Popen's stand-in: records the command; poll() gives ``rc`` (None: running)."""

    made: list = []

    def __init__(self, argv, **kw):
        self.argv, self.kw, self.rc, self.waited = argv, kw, None, False
        _FakeBuild.made.append(self)

    def poll(self):
        return self.rc

    def wait(self, timeout=None):
        self.waited = True
        self.rc = 0 if self.rc is None else self.rc
        return self.rc


@pytest.fixture
def fake_build(fresh_nodes, monkeypatch):
    """A GPU machine as far as nodes.py can tell, with the build process replaced."""
    _FakeBuild.made = []
    monkeypatch.setattr(nodes.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(nodes.subprocess, "Popen", _FakeBuild)
    return _FakeBuild


def test_auto_on_a_gpu_builds_in_a_background_process_and_never_waits(fake_build, monkeypatch):
    """The first call starts `kernellab build-nodes` in a process of its own (its own session,
    output to build_log(), this kernellab first on its path) and goes on without the
    extension; later calls start no second build and look at most every POLL_S seconds; the
    first look after the process finished loads the build."""
    import os
    import sys
    from pathlib import Path

    assert nodes.module() is None
    (proc,) = fake_build.made
    assert proc.argv == [sys.executable, "-m", "kernellab", "build-nodes"]
    assert proc.kw["start_new_session"] is True and proc.kw["stdout"].name == str(nodes.build_log())
    src = Path(nodes.__file__).resolve().parents[2]
    assert proc.kw["env"]["PYTHONPATH"].split(os.pathsep)[0] == str(src) and (src / "kernellab").is_dir()
    assert "background" in nodes.why_unavailable() and str(nodes.build_log()) in nodes.why_unavailable()
    looks = []
    monkeypatch.setattr(proc, "poll", lambda: looks.append(1))  # (running: None)
    for _ in range(100):
        assert nodes.module() is None
    assert len(fake_build.made) == 1 and len(looks) == 0  # within POLL_S of the start: no look
    nodes._STATE["next_poll"] = 0.0
    assert nodes.module() is None and len(looks) == 1
    sentinel = object()
    monkeypatch.setattr(proc, "poll", lambda: 0)
    monkeypatch.setattr(nodes, "_built_file", lambda: nodes.build_log())  # (a file that exists)
    monkeypatch.setattr(nodes, "_load_file", lambda path: sentinel)
    nodes._STATE["next_poll"] = 0.0
    assert nodes.module() is sentinel and nodes.module() is sentinel and nodes.why_unavailable() is None
    assert len(fake_build.made) == 1


def test_a_failed_background_build_says_where_its_output_is(fake_build):
    assert nodes.module() is None
    fake_build.made[0].rc = 1
    nodes._STATE["next_poll"] = 0.0
    assert nodes.module() is None
    why = nodes.why_unavailable()
    assert "failed (exit status 1" in why and str(nodes.build_log()) in why
    assert nodes.module() is None and len(fake_build.made) == 1  # no second attempt in this process


def test_settle_waits_for_the_background_build(fake_build, monkeypatch):
    sentinel = object()
    monkeypatch.setattr(nodes, "_built_file", lambda: nodes.build_log())
    monkeypatch.setattr(nodes, "_load_file", lambda path: sentinel)
    assert nodes.settle() is sentinel
    assert fake_build.made[0].waited
    with kernellab.config.override(cpp_nodes="off"):
        assert nodes.settle() is None


_BACKGROUND = """
import torch
torch.cuda.is_available = lambda: True  # (what nodes.py asks before building in the background)
from kernellab.cuda import nodes

assert nodes.module() is None and "builder" in nodes._STATE
mod = nodes.settle(timeout_s=600)
assert mod is not None, (nodes._STATE, nodes.build_log().read_text())
assert mod.rms_norm(torch.randn(4, 16), torch.ones(16), 1e-6, [0] * 11) is None
print("built in the background")
"""


def test_background_build_for_real(built_nodes_dir, tmp_path):
    """A fresh cache with the session's build less its library: the first call's background
    process links it (kernellab build-nodes, for real), settle() waits and loads it."""
    import os
    import shutil
    import subprocess
    import sys

    cache = tmp_path / "cache"
    shutil.copytree(built_nodes_dir, cache)
    for so in cache.rglob("*.so"):
        so.unlink()
    for lock in cache.rglob("lock"):
        lock.unlink()
    env = {**os.environ, "KERNELLAB_CACHE": str(cache), "KERNELLAB_CPP_NODES": "auto"}
    run = subprocess.run([sys.executable, "-c", _BACKGROUND], env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0 and "built in the background" in run.stdout, run.stdout + run.stderr
    assert any(cache.rglob("*.so"))


def test_off_says_so(fresh_nodes):
    with kernellab.config.override(cpp_nodes="off"):
        assert nodes.module() is None
        assert nodes.why_unavailable() == "cpp_nodes is off"


def test_bad_mode_names_the_option(fresh_nodes):
    with kernellab.config.override(cpp_nodes="sometimes"), pytest.raises(ValueError, match="cpp_nodes"):
        nodes.module()


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_backend_registered_and_unavailable_until_built(fresh_nodes, op):
    impl = registry.get(op, "cuda_node")
    assert impl.devices == ("cuda",)
    reason = impl.why_unavailable("cuda")
    assert reason  # no GPU here, or not built in this fresh cache
    assert "C++ autograd node" in impl.description


_BUILD_AND_REFUSE = """
import pytest, torch
from kernellab.cuda import nodes

mod = nodes.build()
x, w = torch.randn(4, 16), torch.ones(16)
assert mod.rms_norm(x, w, 1e-6, [0] * 11) is None  # not CUDA: the caller takes its other path
with pytest.raises(RuntimeError, match="expected 11"):
    mod.rms_norm(x, w, 1e-6, [0] * 3)
assert mod.layer_norm(x, w, None, 1e-5, [0] * 11) is None
assert mod.layer_norm(x, w, torch.zeros(16), 1e-5, [0] * 11) is None
with pytest.raises(RuntimeError, match="layer_norm plan has 2 values"):
    mod.layer_norm(x, w, None, 1e-5, [0] * 2)
# the Triton kernels' node (ops/norm_kernels/triton_node.py)
blk = [0, 1, 1, 1, 32, 0, 0]
assert mod.triton_norm(x, w, None, 1e-5, [0, 0, 0, 1, 0], blk, blk, blk) is None
with pytest.raises(RuntimeError, match="meta has 2 values"):
    mod.triton_norm(x, w, None, 1e-5, [0, 0], blk, blk, blk)
with pytest.raises(RuntimeError, match="made with a bias"):
    mod.triton_norm(x, w, None, 1e-5, [0, 1, 0, 1, 0], blk, blk, blk)
print("built and refused")
"""


def test_builds_and_refuses_cpu_tensors(built_nodes_dir):
    """The extension compiles against this torch (the session's ``built_nodes``, a CPU build
    too: no CUDA headers needed; a build that breaks fails the run), a fresh process finds
    the build on disk and loads it, hands back None for tensors its node does not take (the
    caller's other path) and refuses a malformed plan with a clear error; so does a second.
    Each in a process of its own: one that has loaded the extension already would build
    another copy as name_v1.so."""
    import os
    import subprocess
    import sys

    assert any(built_nodes_dir.rglob("*.so"))
    env = {**os.environ, "KERNELLAB_CACHE": str(built_nodes_dir), "KERNELLAB_CPP_NODES": "auto"}
    run = subprocess.run([sys.executable, "-c", _BUILD_AND_REFUSE], env=env, capture_output=True, text=True)
    assert run.returncode == 0 and "built and refused" in run.stdout, run.stdout + run.stderr
    load = "from kernellab.cuda import nodes; print(nodes.module() is not None, nodes._STATE.get('why'))"
    run = subprocess.run([sys.executable, "-c", load], env=env, capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.startswith("True"), run.stdout + run.stderr


# --------------------------------------------------------------------------- on a GPU


def _built_or_skip():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    try:
        return nodes.build()
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"the extension does not build here: {e}")


def _ref(x, w, dy, eps=1e-6):
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    y = x64 * torch.rsqrt(x64.square().mean(-1, keepdim=True) + eps) * w64
    dx, dw = torch.autograd.grad(y, (x64, w64), dy.double())
    return y, dx, dw


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(64, 256), (3, 17, 1024), (1, 4096), (1000, 768)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_node_matches_float64(shape, dtype):
    _built_or_skip()
    x = torch.randn(*shape, device="cuda", dtype=dtype, requires_grad=True)
    w = (1 + 0.1 * torch.randn(shape[-1], device="cuda")).to(dtype).requires_grad_()
    dy = torch.randn(*shape, device="cuda", dtype=dtype)
    y = kernellab.rms_norm(x, w, backend="cuda_node")
    assert type(y.grad_fn).__name__ == "CppFunction"  # the C++ node, not the Python one
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    yt = torch.nn.functional.rms_norm(x, (shape[-1],), w, 1e-6)
    dxt, dwt = torch.autograd.grad(yt, (x, w), dy)
    y64, dx64, dw64 = _ref(x, w, dy)
    for ours, theirs, ref in ((y, yt, y64), (dx, dxt, dx64), (dw, dwt, dw64)):
        assert ours.dtype == dtype and ours.shape == ref.shape
        err = (ours.double() - ref).abs().max().item()
        err_torch = (theirs.double() - ref).abs().max().item()
        assert err <= 2 * err_torch + 1e-5 * ref.abs().max().item() + 1e-6, (err, err_torch)


@pytest.mark.gpu
def test_node_strided_dy_and_one_gradient():
    _built_or_skip()
    x = torch.randn(32, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(512, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(512, 32, device="cuda", dtype=torch.bfloat16).t()  # not contiguous
    y = kernellab.rms_norm(x, w, backend="cuda_node")
    (dx,) = torch.autograd.grad(y, (x,), dy)
    _, dx64, _ = _ref(x, w, dy)
    assert (dx.double() - dx64).abs().max().item() < 0.05


@pytest.mark.gpu
def test_node_refuses_double_backward():
    _built_or_skip()
    x = torch.randn(8, 256, device="cuda", requires_grad=True)
    w = torch.ones(256, device="cuda", requires_grad=True)
    y = kernellab.rms_norm(x, w, backend="cuda_node")
    with pytest.raises(RuntimeError, match="create_graph"):
        torch.autograd.grad(y.sum(), (x,), create_graph=True)


@pytest.mark.gpu
def test_node_falls_back_where_it_does_not_apply():
    """A misaligned x (storage offset of one element) takes the Python node: same numbers."""
    _built_or_skip()
    base = torch.randn(8 * 256 + 1, device="cuda", requires_grad=True)
    x = base[1:].view(8, 256)
    w = torch.ones(256, device="cuda", requires_grad=True)
    y = kernellab.rms_norm(x, w, backend="cuda_node")
    assert type(y.grad_fn).__name__ != "CppFunction"
    yt = torch.nn.functional.rms_norm(x, (256,), w, 1e-6)
    torch.testing.assert_close(y, yt, rtol=1e-5, atol=1e-5)


def _ln_ref(x, w, b, dy, eps=1e-5):
    """float64 (y, dx, dw[, db]) of torch's layer_norm."""
    leaves = [t.detach().double().requires_grad_() for t in (x, w) + ((b,) if b is not None else ())]
    bias = leaves[2] if b is not None else None
    y = torch.nn.functional.layer_norm(leaves[0], (x.shape[-1],), leaves[1], bias, eps)
    return (y, *torch.autograd.grad(y, leaves, dy.double()))


@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm_reference_of_these_tests(bias):
    x, w, dy = torch.randn(5, 12), torch.randn(12), torch.randn(5, 12)
    b = torch.randn(12) if bias else None
    got = _ln_ref(x, w, b, dy)
    assert len(got) == 4 if bias else len(got) == 3
    x64 = x.double()
    xhat = (x64 - x64.mean(-1, keepdim=True)) / torch.sqrt(x64.var(-1, unbiased=False, keepdim=True) + 1e-5)
    want = xhat * w.double() + (b.double() if bias else 0)
    torch.testing.assert_close(got[0].detach(), want)
    torch.testing.assert_close(got[2], (dy.double() * xhat).sum(0))


@pytest.mark.gpu
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(64, 256), (3, 17, 1024), (1, 4096), (2000, 3000)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_layer_norm_node_matches_float64(shape, dtype, bias):
    _built_or_skip()
    d = shape[-1]
    x = torch.randn(*shape, device="cuda", dtype=dtype, requires_grad=True)
    w = (1 + 0.1 * torch.randn(d, device="cuda")).to(dtype).requires_grad_()
    b = (0.1 * torch.randn(d, device="cuda")).to(dtype).requires_grad_() if bias else None
    dy = torch.randn(*shape, device="cuda", dtype=dtype)
    leaves = (x, w) + ((b,) if bias else ())
    y = kernellab.layer_norm(x, w, b, backend="cuda_node")
    assert type(y.grad_fn).__name__ == "CppFunction"
    ours = (y, *torch.autograd.grad(y, leaves, dy))
    yt = torch.nn.functional.layer_norm(x, (d,), w, b, 1e-5)
    theirs = (yt, *torch.autograd.grad(yt, leaves, dy))
    for o, t, ref in zip(ours, theirs, _ln_ref(x, w, b, dy)):
        assert o.dtype == dtype and o.shape == ref.shape
        err = (o.double() - ref).abs().max().item()
        err_torch = (t.double() - ref).abs().max().item()
        assert err <= 2 * err_torch + 1e-5 * ref.abs().max().item() + 1e-6, (err, err_torch)


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_node_serves_calls_without_a_gradient(op):
    """No gradient recorded (no_grad, or inputs that need none): the node still runs the
    forward, and its output carries no graph."""
    _built_or_skip()
    x = torch.randn(48, 768, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(768, device="cuda", dtype=torch.bfloat16)
    fn = getattr(kernellab, op)
    want = getattr(torch.nn.functional, op)(x.float(), (768,), w.float()).to(x.dtype)
    for ctx in (torch.no_grad(), torch.enable_grad(), torch.inference_mode()):
        with ctx:
            y = fn(x, w, backend="cuda_node")
        assert y.grad_fn is None and not y.requires_grad
        torch.testing.assert_close(y, want, rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
def test_layer_norm_node_one_gradient_strided_dy_and_fallback():
    _built_or_skip()
    x = torch.randn(32, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(512, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(512, 32, device="cuda", dtype=torch.bfloat16).t()  # not contiguous
    y = kernellab.layer_norm(x, w, b, backend="cuda_node")
    dx, db = torch.autograd.grad(y, (x, b), dy)
    _, dx64, _, db64 = _ln_ref(x, w, b, dy)
    assert (dx.double() - dx64).abs().max().item() < 0.05
    assert (db.double() - db64).abs().max().item() < 0.05 * db64.abs().max().item()
    with pytest.raises(RuntimeError, match="create_graph"):
        torch.autograd.grad(kernellab.layer_norm(x, w, b, backend="cuda_node").sum(), (x,), create_graph=True)
    base = torch.randn(8 * 256 + 1, device="cuda", requires_grad=True)
    xm = base[1:].view(8, 256)  # misaligned: the Python node, same numbers
    wf = torch.ones(256, device="cuda", requires_grad=True)
    ym = kernellab.layer_norm(xm, wf, None, backend="cuda_node")
    assert type(ym.grad_fn).__name__ != "CppFunction"
    torch.testing.assert_close(ym, torch.nn.functional.layer_norm(xm, (256,), wf), rtol=1e-5, atol=1e-5)
