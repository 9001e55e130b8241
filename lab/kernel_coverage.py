"""Which lines of kernellab's Triton kernels the CPU test suite runs under the interpreter.

The CPU suite runs every Triton kernel through Triton's interpreter, which executes the
kernel's Python source line by line, so line coverage of a @jit function is coverage of
its arithmetic. This reads a coverage data file and prints, per @jit function, the
statements the run never executed.

    COVERAGE_FILE=/tmp/cov.data python -m pytest -q -n 2 --cov=src/kernellab --cov-report=
    python lab/kernel_coverage.py /tmp/cov.data [--all] [--json OUT]

A function counts as a kernel or kernel helper when a decorator is a name or attribute
ending in ``jit`` (``@jit``, ``@triton.jit``, ``@triton_support.jit``), alone or under
``triton.autotune`` / ``triton.heuristics``. Numba's ``cuda.jit`` kernels are left out: the
suite runs them in a child process under Numba's CUDA simulator (tests/ops/test_numba.py),
which this run does not trace.
"""

from __future__ import annotations

import argparse
import ast
import json
import pathlib

import coverage

ROOT = pathlib.Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "kernellab"


def _is_jit(dec: ast.expr) -> bool:
    node = dec.func if isinstance(dec, ast.Call) else dec
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")
    return name.endswith("jit") and "cuda" not in ast.unparse(node)  # not numba.cuda.jit


def jit_functions(path: pathlib.Path):
    """(name, first body line, last line) of each @jit function in one file."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and any(_is_jit(d) for d in node.decorator_list):
            yield node.name, node.body[0].lineno, node.end_lineno


def audit(data_file: str):
    cov = coverage.Coverage(data_file=data_file)
    cov.load()
    measured = {pathlib.Path(f).resolve() for f in cov.get_data().measured_files()}
    rows = []
    for path in sorted(SRC.rglob("*.py")):
        kernels = list(jit_functions(path))
        if not kernels:
            continue
        if path.resolve() not in measured:
            for name, _, _ in kernels:
                rows.append({"file": str(path.relative_to(ROOT)), "kernel": name, "statements": None,
                             "missed": None, "lines": []})  # fmt: skip
            continue
        _, statements, _, missing, _ = cov.analysis2(str(path))
        statements, missing = set(statements), set(missing)
        for name, lo, hi in kernels:
            body = {n for n in statements if lo <= n <= hi}
            miss = sorted(n for n in missing if lo <= n <= hi)
            rows.append({"file": str(path.relative_to(ROOT)), "kernel": name, "statements": len(body),
                         "missed": len(miss), "lines": miss})  # fmt: skip
    return rows


def _ranges(lines: list[int]) -> str:
    out, start, prev = [], None, None
    for n in lines:
        if start is None:
            start = prev = n
        elif n == prev + 1:
            prev = n
        else:
            out.append(f"{start}-{prev}" if prev != start else str(start))
            start = prev = n
    if start is not None:
        out.append(f"{start}-{prev}" if prev != start else str(start))
    return ",".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("data_file")
    ap.add_argument("--all", action="store_true", help="also list fully covered kernels")
    ap.add_argument("--json", help="write the rows as JSON lines to this file")
    args = ap.parse_args(argv)
    rows = audit(args.data_file)
    never = [
        r for r in rows if r["statements"] is None or (r["statements"] and r["missed"] == r["statements"])
    ]
    partial = [r for r in rows if r["statements"] and 0 < r["missed"] < r["statements"]]
    full = [r for r in rows if r["statements"] is not None and r["missed"] == 0]
    print(f"{len(rows)} @jit functions: {len(full)} fully run, {len(partial)} in part, {len(never)} never")
    for title, group in (("never run", never), ("in part", partial)) + (
        (("fully run", full),) if args.all else ()
    ):
        print(f"\n{title}:")
        for r in group:
            lines = _ranges(r["lines"])
            print(f"  {r['file']}:{r['kernel']}  {r['missed']}/{r['statements']}  {lines}")
    if args.json:
        with open(args.json, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
