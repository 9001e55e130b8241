"""The package's shape: no import cycle among its modules (imports inside functions
included), each module importable alone (from a fresh `import kernellab`), the dispatch core below
the ops and the tooling, no ``KERNELLAB_*`` variable read when a module is imported, and
a short path from an op's public function to its Triton kernel."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PKG = SRC / "kernellab"


def _modules() -> dict[str, Path]:
    mods = {}
    for path in sorted(PKG.rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The kernellab modules ``name`` imports anywhere in its file (a ``from X import Y``
    of a submodule Y names the submodule, of anything else X itself)."""
    out = set()
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "kernellab"}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                pkg = pkg[: len(pkg) - node.level + 1]
                base = ".".join(pkg + ([base] if base else []))
            if base.split(".")[0] != "kernellab":
                continue
            for a in node.names:
                sub = f"{base}.{a.name}"
                out.add(sub if sub in MODULES else base)
    return {m for m in out if m in MODULES and m != name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10000))
    for v in graph:
        if v not in index:
            visit(v)
    return out


GRAPH = {m: _imports(m, p) for m, p in MODULES.items()}


def test_no_import_cycle_among_the_packages_modules():
    assert _cycles(GRAPH) == []


def test_the_cycle_finder_finds_a_planted_cycle():
    planted = {
        **GRAPH,
        "kernellab.core.registry": GRAPH["kernellab.core.registry"] | {"kernellab.harness.bench"},
    }
    found = _cycles(planted)
    assert found and any("kernellab.core.registry" in c and "kernellab.harness.bench" in c for c in found)


def test_the_core_imports_nothing_above_it():
    # core/ stands on the device module, the runtimes, the options (a leaf) and PyTorch: never
    # on an op, the harness, the models or the CLI (which all stand on it).
    allowed = ("kernellab.core", "kernellab.device", "kernellab.triton_support", "kernellab.cuda",
               "kernellab.options")  # fmt: skip
    assert not {d for d in GRAPH["kernellab.options"] if d.startswith("kernellab")}
    for m, deps in GRAPH.items():
        if m.startswith("kernellab.core"):
            above = sorted(d for d in deps if not d.startswith(allowed))
            assert above == [], (m, above)
    for m in ("kernellab.triton_support", "kernellab.cuda.runtime", "kernellab.device"):
        assert not {d for d in GRAPH[m] if d.startswith("kernellab.core")}, m


def test_nothing_in_the_package_imports_the_lab():
    for m, p in MODULES.items():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Import):
                assert not [a.name for a in node.names if a.name.split(".")[0] == "lab"], m
            elif isinstance(node, ast.ImportFrom):
                assert (node.module or "").split(".")[0] != "lab", m


_ALONE = """
import importlib, os, sys
names = os.environ["KERNELLAB_TEST_MODULES"].split()
read = {}
real_get = os.environ.__class__.get
real_getitem = os.environ.__class__.__getitem__
real_contains = os.environ.__class__.__contains__
def spy(name):
    if not (isinstance(name, str) and name.startswith("KERNELLAB_") and name != "KERNELLAB_TEST_MODULES"):
        return
    f, where = sys._getframe(1), "?"
    while f is not None:  # the kernellab module whose import-time code is running
        if f.f_code.co_name == "<module>" and str(f.f_globals.get("__name__", "")).startswith("kernellab"):
            where = f.f_globals["__name__"]
            break
        f = f.f_back
    read.setdefault(where, set()).add(name)
os.environ.__class__.get = lambda self, k, d=None: (spy(k), real_get(self, k, d))[1]
os.environ.__class__.__getitem__ = lambda self, k: (spy(k), real_getitem(self, k))[1]
os.environ.__class__.__contains__ = lambda self, k: (spy(k), real_contains(self, k))[1]
def ours():
    return {m for m in sys.modules if m == "kernellab" or m.startswith("kernellab.")}
bad = []
try:
    importlib.import_module("kernellab")
except Exception as e:
    bad.append(f"kernellab: {type(e).__name__}: {e}")
for where, names_read in sorted(read.items()):
    bad.append(f"{where}: reads {sorted(names_read)} at import")
print("\\n".join(bad), flush=True)
base = ours()
for n in names:
    if n in base:  # run by `import kernellab`, which every import of a kernellab module runs first
        continue
    read.clear()
    pid = os.fork()  # the child starts from the state `import kernellab` left, and only that
    if pid == 0:
        try:
            importlib.import_module(n)
            out = [f"{w}: reads {sorted(r)} at import (importing {n})" for w, r in sorted(read.items())]
        except BaseException as e:
            out = [f"{n}: {type(e).__name__}: {e}"]
        if out:
            print("\\n".join(out), flush=True)
        os._exit(0)
    os.waitpid(pid, 0)
"""


def test_each_module_imports_alone_and_reads_no_kernellab_variable():
    # One interpreter runs `import kernellab` (which any import of a kernellab module runs
    # first), then imports each module it did not import in a child forked from that state,
    # so a module that works only after another was imported is caught. A KERNELLAB_*
    # variable read while a module's import-time code runs is charged to that module.
    out = _imports_alone(SRC, [m for m in MODULES if not m.endswith("__main__")])
    assert out == "", out


def _imports_alone(path, names) -> str:
    """What _ALONE prints for ``names`` with ``path`` as the only source root."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELLAB_")}
    env.update(PYTHONPATH=str(path), KERNELLAB_TEST_MODULES=" ".join(names))
    out = subprocess.run([sys.executable, "-c", _ALONE], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip()


def test_the_import_check_catches_order_and_variables(tmp_path):
    # a stand-in package: its __init__ imports core, which reads a variable at import; tool_b
    # works only after tool_a ran; tool_c reads a variable at import; tool_a is fine
    pkg = tmp_path / "kernellab"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from kernellab import core\n")
    (pkg / "core.py").write_text("import os\nLEVEL = os.environ.get('KERNELLAB_LEVEL')\n")
    (pkg / "tool_a.py").write_text("import kernellab\nkernellab.READY = True\n")
    (pkg / "tool_b.py").write_text("import kernellab\nassert kernellab.READY\n")
    (pkg / "tool_c.py").write_text(
        "import os\n\ndef f():\n    return 'KERNELLAB_C' in os.environ\n\nX = f()\n"
    )
    names = ["kernellab", "kernellab.core", "kernellab.tool_a", "kernellab.tool_b", "kernellab.tool_c"]
    lines = _imports_alone(tmp_path, names).splitlines()
    assert lines[0] == "kernellab.core: reads ['KERNELLAB_LEVEL'] at import", lines
    assert lines[1].startswith("kernellab.tool_b: AttributeError"), lines
    assert lines[2] == "kernellab.tool_c: reads ['KERNELLAB_C'] at import (importing kernellab.tool_c)", lines
    assert len(lines) == 3, lines


# --------------------------------------------------------------------------- call depth

# The launch layer every Triton kernel goes through; not counted against an op.
LAUNCH_LAYER = ("triton_support.py", os.path.join("cuda", "runtime.py"))
MAX_FILES = 5  # public function, registry, custom-op plumbing, op kit, kernels


def _triton_ops() -> list[str]:
    from kernellab.core import registry
    from kernellab.ops.public import FUNCTIONS

    return sorted(op for op in FUNCTIONS if any(i.backend == "triton" for i in registry.impls(op)))


def _files_when_the_first_kernel_starts(call) -> list[str] | None:
    """The kernellab files (relative to the package, in call order, each once) on the
    Python stack when ``call()`` enters its first Triton kernel under the interpreter: the
    first frame of a kernellab function called from Triton's own code (the interpreter
    running a kernel's body) other than the launch layer. None when no kernel ran."""
    import triton

    pkg = str(PKG) + os.sep
    triton_dir = os.path.dirname(triton.__file__) + os.sep
    found: list[list[str]] = []

    def tracer(frame, event, arg):
        if event != "call" or found:
            return None
        here = frame.f_code.co_filename
        caller = frame.f_back.f_code.co_filename if frame.f_back is not None else ""
        if here.startswith(pkg) and caller.startswith(triton_dir) and not here.endswith(LAUNCH_LAYER):
            stack, f = [], frame
            while f is not None:
                stack.append(f.f_code.co_filename)
                f = f.f_back
            found.append(stack[::-1])
        return None

    before = sys.gettrace()
    sys.settrace(tracer)
    try:
        call()
    finally:
        sys.settrace(before)
    if not found:
        return None
    files: list[str] = []
    for name in found[0]:
        if name.startswith(pkg):
            rel = os.path.relpath(name, PKG)
            if rel not in files:
                files.append(rel)
    return files


@pytest.mark.parametrize("op", _triton_ops())
def test_a_triton_kernel_is_at_most_five_files_from_the_ops_function(op):
    # An op's public function reaches its Triton kernel through its own package, the
    # registry, the custom-op plumbing, the op kit and the module of kernels (a family's
    # shared one, or the op's triton.py): deeper chains mean indirection to read through.
    import torch

    from kernellab.core import registry
    from kernellab.core.spec import get_spec
    from kernellab.ops.public import FUNCTIONS

    why = registry.get(op, "triton").why_unavailable("cpu")
    if why is not None:
        pytest.skip(f"{op}: triton backend unavailable on the CPU: {why}")
    spec = get_spec(op)
    if torch.float32 not in spec.dtypes:
        pytest.skip(f"{op}: its spec has no float32 (dtypes {spec.dtypes}), the dtype this test runs")
    args = spec.make_inputs(spec.bad_shape, torch.float32, "cpu", 0)
    files = _files_when_the_first_kernel_starts(lambda: FUNCTIONS[op](*args, backend="triton"))
    assert files is not None, f"{op}: no Triton kernel ran for shape {spec.bad_shape}"
    counted = [f for f in files if not f.endswith(LAUNCH_LAYER)]
    assert len(counted) <= MAX_FILES, (
        f"{op}: {len(counted)} kernellab files between its function and its first Triton kernel "
        f"(at most {MAX_FILES}, the launch layer not counted): {' -> '.join(files)}"
    )
