"""The package's shape: no import cycle among its modules (imports inside functions
included), each module importable alone in a fresh interpreter, the dispatch core below
the ops and the tooling, and no ``KERNELLAB_*`` variable read when a module is imported."""

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
    planted = {**GRAPH, "kernellab.core.registry": GRAPH["kernellab.core.registry"] | {"kernellab.harness.bench"}}
    found = _cycles(planted)
    assert found and any("kernellab.core.registry" in c and "kernellab.harness.bench" in c for c in found)


def test_the_core_imports_nothing_above_it():
    # core/ stands on the device module, the runtimes and PyTorch: never on an op, the
    # harness, the models or the CLI (which all stand on it).
    allowed = ("kernellab.core", "kernellab.device", "kernellab.triton_support", "kernellab.cuda")
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
env_before = {k: v for k, v in os.environ.items()}
read = []
real_get = os.environ.__class__.get
real_getitem = os.environ.__class__.__getitem__
real_contains = os.environ.__class__.__contains__
def spy(name):
    if isinstance(name, str) and name.startswith("KERNELLAB_") and name != "KERNELLAB_TEST_MODULES":
        read.append(name)
os.environ.__class__.get = lambda self, k, d=None: (spy(k), real_get(self, k, d))[1]
os.environ.__class__.__getitem__ = lambda self, k: (spy(k), real_getitem(self, k))[1]
os.environ.__class__.__contains__ = lambda self, k: (spy(k), real_contains(self, k))[1]
bad = []
for n in names:
    for m in [m for m in sys.modules if m == "kernellab" or m.startswith("kernellab.")]:
        del sys.modules[m]
    read.clear()
    try:
        importlib.import_module(n)
    except Exception as e:
        bad.append(f"{n}: {type(e).__name__}: {e}")
        continue
    if read:
        bad.append(f"{n}: reads {sorted(set(read))} at import")
print("\\n".join(bad))
"""


@pytest.mark.parametrize("part", range(2))
def test_each_module_imports_alone_and_reads_no_kernellab_variable(part):
    # Each module in an interpreter whose kernellab modules were all dropped first (PyTorch
    # stays loaded: it is the slow part), so a module that works only after another was
    # imported, or that reads a KERNELLAB_* variable at import, is caught.
    names = [m for m in MODULES if not m.endswith("__main__")][part::2]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELLAB_")}
    env.update(PYTHONPATH=str(SRC), KERNELLAB_TEST_MODULES=" ".join(names))
    out = subprocess.run([sys.executable, "-c", _ALONE], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "", out.stdout
