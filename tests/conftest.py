"""Shared pytest setup for kernellab's tests.

- Tests marked ``gpu`` are skipped (cleanly, with a reason) when torch sees no CUDA
  device; on the lent H100/H200 they run. Tests marked ``slow`` run only with ``--slow``.
- Fixtures: ``device`` (the best device here), ``cuda`` (skips without a GPU),
  ``planted`` (register throw-away implementations that are always unregistered),
  ``kl_cache`` (a fresh KERNELLAB_CACHE under tmp_path). The whole session compiles
  into a private cache, never the user's ~/.cache/kernellab.

Helpers shared by several test files live in ``tests/kltest.py``.
"""

from __future__ import annotations

import os
import sys
import warnings

import pytest
import torch

# tests/ on sys.path so every test module can `import kltest` (pytest's default
# "prepend" import mode adds this folder too; be explicit so other modes work as well).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# A private Inductor cache per test session: the on-disk AOTAutograd cache keys on the
# forward graph, so after a custom op's backward changed, a cache left by an earlier run
# replayed the old backward (seen: softmax's backward arguments reordered -> wrong grads).
if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    import atexit as _atexit
    import shutil as _shutil
    import tempfile as _tempfile

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = _tempfile.mkdtemp(prefix="kernellab-inductor-")
    _atexit.register(_shutil.rmtree, os.environ["TORCHINDUCTOR_CACHE_DIR"], ignore_errors=True)

import kernellab  # noqa: E402
from kernellab import registry  # noqa: E402

HAS_CUDA = torch.cuda.is_available()


def _hypothesis_out_of_the_repo() -> None:
    # Hypothesis keeps a .hypothesis/ folder in the working directory (example database,
    # constants cache); keep it in a temporary folder instead.
    import atexit
    import shutil
    import tempfile

    try:
        from hypothesis.configuration import set_hypothesis_home_dir
    except ImportError:  # pragma: no cover - older hypothesis
        return
    home = tempfile.mkdtemp(prefix="kernellab-hypothesis-")
    set_hypothesis_home_dir(home)
    atexit.register(shutil.rmtree, home, ignore_errors=True)


_hypothesis_out_of_the_repo()


def pytest_addoption(parser):
    parser.addoption(
        "--slow", action="store_true", default=False, help="also run tests marked slow (minutes to hours)"
    )


def pytest_collection_modifyitems(config, items):
    if not config.getoption("--slow"):
        skip_slow = pytest.mark.skip(reason="slow: run with --slow")
        for item in items:
            if "slow" in item.keywords:
                item.add_marker(skip_slow)
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU: torch.cuda.is_available() is False")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_report_header(config):
    mode = "cuda: " + torch.cuda.get_device_name() if HAS_CUDA else "cpu only (gpu tests skipped)"
    return [
        f"kernellab {kernellab.__version__}, torch {torch.__version__}, {mode}, "
        f"TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET', '')}"
    ]


@pytest.fixture(scope="session", autouse=True)
def _private_kernellab_cache(tmp_path_factory):
    """The suite compiles into its own cache, not the user's ~/.cache/kernellab: every
    CUDA module is really compiled once per run (tests that need an empty cache use
    ``kl_cache``)."""
    old = os.environ.get("KERNELLAB_CACHE")
    os.environ["KERNELLAB_CACHE"] = str(tmp_path_factory.mktemp("kernellab-cache"))
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("KERNELLAB_CACHE", None)
        else:
            os.environ["KERNELLAB_CACHE"] = old


def _nodes_unbuildable() -> str | None:
    import shutil

    if shutil.which("c++") is None and shutil.which("g++") is None:
        return "no C++ compiler"
    try:
        from torch.utils.cpp_extension import verify_ninja_availability

        verify_ninja_availability()
    except RuntimeError:
        return "no ninja"
    return None


@pytest.fixture
def nodes_buildable():
    """Skip unless the C++ nodes extension can be built here (a compiler and ninja)."""
    why = _nodes_unbuildable()
    if why:
        pytest.skip(why)


@pytest.fixture(scope="session")
def built_nodes(tmp_path_factory):
    """kernellab's C++ nodes extension (kernellab/cuda/nodes.py), built once for the run
    and shared by the xdist workers (cpp_extension's lock file makes a second builder wait
    for the first); skip where no compiler or ninja is found, fail where the build breaks.
    The process's nodes state is left as it was: tests that want the nodes in use take
    ``cpp_nodes_on``."""
    why = _nodes_unbuildable()
    if why:
        pytest.skip(why)
    from kernellab.cuda import nodes

    shared = _shared_nodes_dir(tmp_path_factory)
    old = os.environ.get("KERNELLAB_CACHE")
    saved = dict(nodes._STATE)
    os.environ["KERNELLAB_CACHE"] = str(shared)
    nodes._STATE.clear()
    try:
        return nodes.build()
    except Exception as e:  # noqa: BLE001 - a compiler error, missing headers: say so
        pytest.fail(f"the C++ nodes do not build here: {type(e).__name__}: {e}")
    finally:
        if old is None:
            os.environ.pop("KERNELLAB_CACHE", None)
        else:
            os.environ["KERNELLAB_CACHE"] = old
        nodes._STATE.clear()
        nodes._STATE.update(saved)


def _shared_nodes_dir(tmp_path_factory):
    """The cache directory of ``built_nodes``'s build, one for every xdist worker."""
    base = tmp_path_factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "kernellab-nodes"


@pytest.fixture(scope="session")
def built_nodes_dir(built_nodes, tmp_path_factory):
    """The KERNELLAB_CACHE directory holding ``built_nodes``'s build."""
    return _shared_nodes_dir(tmp_path_factory)


@pytest.fixture
def cpp_nodes_on(built_nodes):
    """The C++ nodes in use for this test (``kernellab.config.cpp_nodes`` "auto" with the
    extension loaded); the process's nodes state as it was after."""
    from kernellab.cuda import nodes

    saved = dict(nodes._STATE)
    nodes._STATE.clear()
    nodes._STATE["module"] = built_nodes
    try:
        with kernellab.config.override(cpp_nodes="auto"):
            yield built_nodes
    finally:
        nodes._STATE.clear()
        nodes._STATE.update(saved)


@pytest.fixture(autouse=True)
def _quiet_numpy_in_triton_interpreter():
    # NaN/inf inputs are deliberate in several tests; the Triton interpreter evaluates
    # kernels with numpy, which would warn about them.
    import numpy as np

    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


_BYTE_VALUES = list(range(256))


def _process_state() -> dict:
    """What a test may change for the rest of its worker process and must put back."""
    return {
        "default dtype": torch.get_default_dtype(),
        "grad mode": torch.is_grad_enabled(),
        "inference mode": torch.is_inference_mode_enabled(),
        "autocast (cpu)": torch.is_autocast_enabled("cpu"),
        "deterministic algorithms": torch.are_deterministic_algorithms_enabled(),
        "torch function modes": torch._C._len_torch_function_stack(),
        "torch dispatch modes": torch._C._len_torch_dispatch_stack(),
        "threads": torch.get_num_threads(),
    }


@pytest.fixture(autouse=True)
def _process_left_as_found():
    """A test that leaves process-wide state changed makes later tests of its worker fail
    at random (which tests follow it depends on the xdist schedule): it fails here, at its
    own teardown. Checked: torch's global modes and settings (``_process_state``), and
    CPython's shared one-byte bytes objects, which native code handed one as an output
    buffer (``b" " * 1``) rewrites for the whole process (pickle and torch.save then broke)."""
    before = _process_state()
    yield
    after = _process_state()
    changed = [f"{k}: {before[k]} -> {after[k]}" for k in before if after[k] != before[k]]
    if changed:
        pytest.fail("this test left process-wide state changed: " + "; ".join(changed), pytrace=False)
    bad = [i for i in _BYTE_VALUES if bytes([i])[0] != i]  # (a list: the shared objects)
    if bad:
        pytest.fail(f"this test overwrote CPython's shared one-byte bytes objects {bad[:8]} "
                    "(native code wrote into an immutable bytes buffer)", pytrace=False)  # fmt: skip


@pytest.fixture
def device() -> str:
    """The best device here: "cuda" on the GPU machines, "cpu" elsewhere."""
    return "cuda" if HAS_CUDA else "cpu"


@pytest.fixture
def cuda() -> str:
    """A CUDA device, or skip the test."""
    if not HAS_CUDA:
        pytest.skip("needs a CUDA GPU")
    return "cuda"


@pytest.fixture
def planted():
    """Register throw-away implementations; every one is unregistered at teardown.

    impl = planted("gelu", "planted_zeros", fn, devices=("cpu",))
    """
    added: list[tuple[str, str]] = []

    def plant(op: str, backend: str, fn, **kw):
        kw.setdefault("replace", True)
        added.append((op, backend))
        kernellab.register(op, backend, **kw)(fn)
        return kernellab.get(op, backend)

    def plant_impl(impl: registry.Impl):
        """Add a hand-built Impl (e.g. one whose validation is bypassed)."""
        added.append((impl.op, impl.backend))
        registry.add_impl(impl, replace=True)
        return impl

    plant.impl = plant_impl
    try:
        yield plant
    finally:
        for op, backend in added:
            kernellab.unregister(op, backend)


@pytest.fixture
def tables(tmp_path, monkeypatch):
    """An empty tables directory (KERNELLAB_TABLES) for the test, choices cleared before
    and after."""
    monkeypatch.setenv("KERNELLAB_TABLES", str(tmp_path))
    registry.clear_cache()
    yield tmp_path
    registry.clear_cache()


@pytest.fixture
def kl_cache(tmp_path, monkeypatch):
    """A fresh, empty kernellab cache (KERNELLAB_CACHE is read at every use)."""
    root = tmp_path / "klcache"
    monkeypatch.setenv("KERNELLAB_CACHE", str(root))
    return root


@pytest.fixture
def cli_run(monkeypatch, capsys):
    """Run the kernellab CLI in-process; returns (exit code, printed text). The console
    is made wide so rich never wraps a table cell across lines."""
    from rich.console import Console

    from kernellab import cli

    monkeypatch.setattr(cli, "console", Console(width=300))

    def run(*argv):
        code = cli.main(list(argv))
        return code, capsys.readouterr().out

    return run
