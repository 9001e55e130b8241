"""kernellab command line: list | check | bench | peaks | build-nodes | report | ladder | profile | demo |
train | asm | tune | explain | info. `kernellab` alone prints the help; a user's mistake is one line and exit 2."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

# Not a terminal (piped, redirected): rich would wrap tables to 80 columns; lines as long
# as the table needs instead (COLUMNS, when set, still decides).
console = Console(width=None if sys.stdout.isatty() or "COLUMNS" in os.environ else 1000)
# --format: how tables are printed. auto: drawn on a terminal, markdown otherwise.
_FORMAT = {"value": "auto"}


def _plain(cell) -> str:
    from rich.text import Text

    text = Text.from_markup(cell).plain if isinstance(cell, str) else getattr(cell, "plain", str(cell))
    return text.replace("\n", " ")


def show(table: Table) -> None:
    """Print ``table``: drawn by rich (a terminal, or --format rich), a markdown table
    (piped or redirected, or --format md: one line per row, never cut) or JSON, a list of
    {column: value} (--format json)."""
    fmt = _FORMAT["value"]
    if fmt == "auto":
        fmt = "rich" if console.is_terminal else "md"
    if fmt == "rich":
        console.print(table)
        return
    heads = [_plain(c.header) for c in table.columns]
    rows = list(zip(*([_plain(x) for x in c.cells] for c in table.columns)))
    if fmt == "json":
        print(json.dumps([dict(zip(heads, r)) for r in rows]))
        return
    if table.title:
        print(f"\n{_plain(table.title)}\n")
    print("| " + " | ".join(heads) + " |")
    print("|" + "---|" * len(heads))
    for r in rows:
        print("| " + " | ".join(c.replace("|", "\\|") for c in r) + " |")


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )


def _dtypes(arg):
    from kernellab.core.spec import parse_dtype

    return [parse_dtype(d) for d in arg] if arg else None


def _split(values, name: str = "an option"):
    """--backend a,b --backend c -> [a, b, c]; None when the option was not given. An
    option given only empty values (``--dtype ''``, ``-b ,``) is refused, naming ``name``."""
    out = []
    for v in values or []:
        out += [p for p in v.split(",") if p.strip()]
    if values and not out:
        raise ValueError(f"{name}: no value in {', '.join(map(repr, values))}")
    return out or None


def _at_least(low: int):
    """An argparse type: an integer >= ``low`` (argparse names the option in its refusal)."""

    def parse(text: str) -> int:
        value = int(text)  # (a ValueError: argparse says "invalid int value")
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    parse.__name__ = "int"
    return parse


def _seconds(text: str) -> float:
    """An argparse type: a finite number of seconds > 0."""
    value = float(text)
    if not (0 < value < float("inf")):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, got {text}")
    return value


_seconds.__name__ = "float"


def _sizes(text: str) -> list[int]:
    """An argparse type: a comma list of integers >= 1, e.g. 64,256,1024."""
    try:
        sizes = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma list of integers, e.g. 64,256") from None
    if min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"each size must be >= 1, got {text}")
    return sizes


def _seed(text: str) -> int:
    """An argparse type: a seed, an integer from 0 to 2^64 - 1 (what torch.manual_seed
    takes without wrapping; Python's random reads -1 as 1, so a negative seed would replay
    another's problems)."""
    value = int(text)  # (a ValueError: argparse says "invalid int value")
    if not 0 <= value < 2**64:
        raise argparse.ArgumentTypeError(f"a seed is an integer from 0 to 2^64 - 1, got {value}")
    return value


_seed.__name__ = "int"


def _refuse(args, message: str) -> int:
    """A usage error: one line on stderr, ``kernellab CMD: error: ...``, exit status 2."""
    print(f"kernellab {args.cmd}: error: {message}", file=sys.stderr)
    return 2


def _problem_shapes(op: str, texts, timed: bool = True) -> list[tuple[int, ...]]:
    """-s/--shape values read as problem shapes of ``op`` (``OpSpec.check_problem_shape``:
    the number of dims its convention has), or a ValueError naming -s/--shape and what the
    op wants. ``timed`` (bench, profile, tune, demo): a dim of 0 is refused too, an empty
    problem has nothing to time (``kernellab check`` runs the ops on empty inputs)."""
    from kernellab.core.spec import get_spec, parse_shape

    spec = get_spec(op)
    shapes = []
    for text in texts:
        try:
            shape = parse_shape(text)
            spec.check_problem_shape(shape)
        except ValueError as e:
            raise ValueError(f"-s/--shape {text}: {e}") from None
        if timed and 0 in shape:
            raise ValueError(f"-s/--shape {text}: dim {shape.index(0) + 1} is 0: an empty problem has "
                             "nothing to time; give dims >= 1 (`kernellab check` runs the op on empty "
                             "inputs)")  # fmt: skip
        shapes.append(shape)
    return shapes


def _shapes_fit(op: str, shapes, texts, dtypes, dev: str) -> None:
    """A ValueError naming -s/--shape where a shape cannot fit this device's memory in one
    of ``dtypes`` (``harness.bench.problem_too_large``), before anything is allocated."""
    from kernellab.core.spec import get_spec
    from kernellab.harness.bench import problem_too_large

    spec = get_spec(op)
    for shape, text in zip(shapes, texts):
        for dtype in dtypes or spec.dtypes:
            why = problem_too_large(spec, shape, dtype, dev)
            if why:
                raise ValueError(f"-s/--shape {text}: too large: {why}")


def _option_names(op: str) -> list[str] | None:
    """The keyword options --opt may name for ``op``: its public function's keywords (not
    its tensor arguments, not ``backend``), its input options (``OpSpec.input_options``)
    and the keys its option cases vary; None for an op with no public function (a user's
    op: its implementations are handed the options as they are)."""
    import inspect

    from kernellab.core.spec import get_spec
    from kernellab.ops.public import FUNCTIONS

    spec = get_spec(op)
    fn = FUNCTIONS.get(op)
    if fn is None:
        return None
    names = {p for p in inspect.signature(fn).parameters if p != "backend"} | set(spec.input_options)
    for case in [*spec.option_sets, *spec.bench_options]:
        names |= set(case)
    return sorted(names - set(spec.arg_names))


def _check_options(op: str, options) -> None:
    """A ValueError naming the first --opt key ``op`` does not take, with the ones it does."""
    known = _option_names(op)
    if known is None:
        return
    for key in options or {}:
        if key not in known:
            raise ValueError(f"--opt {key}: not an option of {op}; its options: {', '.join(known) or 'none'}")


# Options naming a file or a folder a command writes: checked before the command runs.
_OUTPUTS = {"json": ("--json", False), "plot": ("--plot", False), "trace": ("--trace", False),
            "out": ("--out", False), "html": ("--html", True),
            "trace_dir": ("--trace-dir", True)}  # fmt: skip


def _check_outputs(args, made: list) -> str | None:
    """Why an output path the command was given cannot be written (a folder where a file
    goes, a file where a folder goes, an unwritable folder), or None. The missing folders
    on its way are made now (appended to ``made``: ``main`` removes those left empty), so
    that a long run does not end on a path it cannot write."""
    from pathlib import Path

    for dest, (option, is_dir) in _OUTPUTS.items():
        path = getattr(args, dest, None)
        if not isinstance(path, str):  # (unset, or a flag: ladder's --json)
            continue
        p = Path(path)
        if p.exists() and p.is_dir() != is_dir:
            have, want = ("a file", "a folder") if is_dir else ("a folder", "a file")
            return f"{option} {path}: is {have}; give {want}"
        folder = p if is_dir else p.parent
        missing = []
        up = folder
        while not up.exists() and up != up.parent:
            missing.append(up)
            up = up.parent
        if not up.is_dir():
            return f"{option} {path}: {up} is a file, not a folder"
        if not os.access(up, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
            return f"{option} {path}: not writable ({p if p.exists() else up} is not)"
        for d in reversed(missing):
            try:
                d.mkdir()
            except OSError as e:
                return f"{option} {path}: cannot make {d}: {e.strerror}"
            made.append(d)
    return None


def _remove_empty(folders) -> None:
    """The folders ``_check_outputs`` made that nothing was written to, innermost first."""
    for d in reversed(folders):
        try:
            d.rmdir()  # (only an empty one)
        except OSError:
            pass


# --------------------------------------------------------------------------- list


def cmd_list(args) -> int:
    import kernellab
    from kernellab import device

    info = device.summary()
    console.print(f"device: [bold]{info['device']}[/]  torch {info['torch']}  triton {info['triton']}")
    table = Table(title="ops x backends (green: runs here)")
    table.add_column("op")
    table.add_column("backend")
    table.add_column("here")
    table.add_column("what")
    for impl in kernellab.impls():
        why = impl.why_unavailable()
        status = "[green]yes[/]" if why is None else f"[yellow]no: {why}[/]"
        if why == "no GPU" and impl.precompile is not None:
            status = "[yellow]compile only: no GPU[/]"
        who = "" if impl.builtin else " (user)"
        table.add_row(impl.op, impl.backend + who, status, impl.description)
    show(table)
    return 0


# --------------------------------------------------------------------------- check


def _check_plan_text(items, quick: bool, fuzz: int, fuzz_only: bool, seed: int, dev: str,
                     jobs: int = 1) -> list[str]:  # fmt: skip
    """What a check run will do, printed before it starts."""
    from kernellab.core.spec import dtype_name
    from kernellab.harness import check as chk

    def uniq(xs):
        return list(dict.fromkeys(xs))

    runs = [i for i in items if i.runs == "run"]
    compiles = [i for i in items if i.runs == "compile"]
    skipped = [i for i in items if i.runs == "skipped"]
    unavailable = len(items) - len(runs) - len(compiles) - len(skipped)
    mode = "quick (--full: every test shape)" if quick else "full (every test shape)"
    stages = ["fuzz"] if fuzz_only else [s if s != "fuzz" or fuzz else f"fuzz ({chk.QUICK_DRAWS} random draws)"
                                         for s in chk.STAGES]  # fmt: skip
    what = f"{len(runs)} implementation x dtype runs"
    if compiles:
        what += f", {len(compiles)} CUDA builds (compiled, not run: no GPU)"
    if unavailable:
        what += f", {unavailable} unavailable here"
    est = sum(i.estimate for i in items)
    notes = []
    for why in uniq(i.why for i in skipped):
        names = uniq(f"{i.impl.backend}" for i in skipped if i.why == why)
        n = sum(i.why == why for i in skipped)
        notes.append(f"  skipped: {n} x {', '.join(names)}: {why}")
    return [
        f"kernellab check: {mode} on {dev}; seed {seed} (--seed {seed} replays this run)",
        f"  ops ({len(uniq(i.impl.op for i in items))}): {', '.join(uniq(i.impl.op for i in items))}",
        f"  backends: {', '.join(uniq(i.impl.backend for i in items))}",
        f"  dtypes: {', '.join(uniq(dtype_name(i.dtype) for i in items))}",
        f"  runs: {what}",
        f"  stages: {', '.join(stages)}" + (f" ({fuzz} random problems each)" if fuzz else ""),
        *notes,
        f"  workers: {jobs}" + (" (-j N to change)" if jobs > 1 else ""),
        f"  estimated: ~{chk.fmt_seconds(est / max(1, jobs))}",
    ]


def cmd_check(args) -> int:
    """Exit status (a contract, tested): 0 every kernellab (and user-registered)
    implementation passed; 1 one failed (or, with --strict, a baseline or peer did);
    2 a usage error: an unknown op, backend or dtype, or nothing to check."""
    import random

    from kernellab import device as _dev
    from kernellab.core import registry
    from kernellab.core.spec import dtype_name
    from kernellab.harness import check as chk

    ops = args.ops or None
    for op in ops or []:
        if op not in registry.op_names():
            console.print(f"[red]unknown op {op!r}[/]; known: {', '.join(registry.op_names())}")
            return 2
    backends = _split(args.backend, "--backend")
    known = {i.backend for i in registry.impls()}
    for b in backends or []:
        if b not in known:
            console.print(f"[red]unknown backend {b!r}[/]; known: {', '.join(sorted(known))}")
            return 2
    try:
        dtypes = _dtypes(_split(args.dtype, "--dtype"))
    except ValueError as e:
        console.print(f"[red]{e}[/]")
        return 2
    if args.fuzz < 0:
        console.print(f"[red]--fuzz must be >= 0[/] (got {args.fuzz})")
        return 2
    if args.fuzz_only and not args.fuzz:
        args.fuzz = 10
    from kernellab.harness import parallel

    jobs = parallel.default_workers() if args.jobs is None else args.jobs
    if jobs < 1:
        console.print(f"[red]--jobs must be >= 1[/] (got {args.jobs})")
        return 2
    dev = _dev.default_device()
    planned = chk.plan(ops, backends, dtypes, device=dev, quick=args.quick, fuzz=args.fuzz)
    items = [i for i in planned if i.runs != "skipped"]  # what check() runs, in its order
    if not items:
        console.print("[red]nothing to check[/] (no implementation matches)")
        return 2
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**30)
    jobs = min(jobs, len(items))
    for line in _check_plan_text(planned, args.quick, args.fuzz, args.fuzz_only, seed, dev, jobs):
        console.print(line, markup=False, highlight=False)
    # (fp32 is checked as fp32: check_impl turns TF32 off while it runs)
    progress = chk.Progress(items)
    reports = []
    terminal = console.is_terminal
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[count]}"),
        TimeElapsedColumn(),
        TextColumn("{task.fields[left]}"),
        console=console,
        transient=True,
        disable=not terminal,
    )
    with bar:
        task = bar.add_task("checking", total=max(progress.total, 1e-9), count=f"0/{len(items)}", left="")

        def on_start(impl, dtype):
            bar.update(task, description=f"checking {impl.name} {dtype_name(dtype)}")

        by_key = {(i.impl.op, i.impl.backend, dtype_name(i.dtype)): i for i in items}

        def on_result(rep):
            item = by_key[(rep.op, rep.backend, rep.dtype)]  # (workers finish out of order)
            reports.append(rep)
            progress.finished(item)
            left = f"~{chk.fmt_seconds(progress.remaining)} left"
            bar.update(task, completed=progress.done_estimate, count=f"{progress.done}/{len(items)}", left=left)
            if not terminal:  # a log file or a pipe: a line per report as it lands
                # (the table comes at the end; a run cut by a time limit printed nothing)
                worst = f"{rep.worst_ratio:.2f}" if rep.worst_ratio is not None else "-"
                first = f"; {rep.failures[0].kind} {rep.failures[0].name}: {rep.failures[0].detail}" if rep.failures else ""
                console.print(
                    f"[{progress.done}/{len(items)}] {rep.op}/{rep.backend} {rep.dtype}: {rep.status}, "
                    f"worst err/bound {worst} ({rep.seconds:.1f} s){first}; "
                    f"elapsed {chk.fmt_seconds(progress.elapsed)}, {left}",
                    markup=False, highlight=False,
                )  # fmt: skip

        reports = chk.check(
            ops, backends, dtypes, quick=args.quick, seed=seed, on_start=on_start, on_result=on_result,
            fuzz=args.fuzz, only_fuzz=args.fuzz_only, workers=jobs,
        )  # (in plan order for the table)

    table = Table(title=f"kernellab check ({'quick' if args.quick else 'full'}) on {reports[0].device}")
    for col in ("op", "backend", "dtype", "status", "cases", "worst err/bound", "notes"):
        table.add_column(col)
    for r in reports:
        style = {"pass": "green", "fail": "red", "compiled": "cyan", "unavailable": "yellow"}[r.status]
        n_pass = sum(c.status == "pass" for c in r.cases)
        # Refusals by case kind: "refused: layout transposed, x:sliced; double backward".
        refused: dict[str, list[str]] = {}
        for c in r.cases:
            if c.status == "refused":
                refused.setdefault(c.kind, []).append(c.name)
        notes = r.reason
        if refused:
            what = "; ".join(f"{kind} {', '.join(names)}" for kind, names in refused.items())
            notes += ("; " if notes else "") + "refused: " + what
        for c in r.failures[:3]:
            notes += ("; " if notes else "") + f"{c.kind} {c.name}: {c.detail}"
        worst = f"{r.worst_ratio:.2f}" if r.worst_ratio is not None else "-"
        status = r.status if r.status != "compiled" else "compiled, not run"
        table.add_row(
            r.op, r.backend, r.dtype, f"[{style}]{status}[/]", f"{n_pass}/{len(r.cases)}", worst, notes
        )
    show(table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump([r.to_dict() for r in reports], f, indent=1, default=str)
    counts = {s: sum(r.status == s for r in reports) for s in ("pass", "fail", "compiled", "unavailable")}
    console.print(
        f"{counts['pass']} passed, {counts['fail']} failed, {counts['compiled']} compiled (not run), "
        f"{counts['unavailable']} unavailable; seed {reports[0].seed} (--seed to reproduce)"
    )
    # The exit status answers "is a kernellab implementation (or one you registered) wrong?".
    # Baselines and peers (PyTorch's op, torch.compile, the naive composition, liger, SDPA)
    # beyond the 2x rule are reported on their own; --strict fails on them too.
    ours, others = [], []
    for r in reports:
        if r.status == "fail":
            (ours if _is_kernellab_or_user(r.op, r.backend) else others).append(r)
    if others:
        console.print("[yellow]Baselines and peers beyond the rule (not kernellab's kernels):[/]")
        for r in others:
            c = r.failures[0] if r.failures else None
            why = f"{c.kind} {c.name}: {c.detail}" if c else r.reason
            console.print(f"  {r.op}/{r.backend} {r.dtype}: {why}")
    if ours:
        console.print(f"[red]{len(ours)} kernellab (or user-registered) implementation(s) failed[/]")
    elif others and not args.strict:
        console.print("every kernellab implementation passed (--strict also fails on the baselines above)")
    return 1 if ours or (args.strict and others) else 0


def _is_kernellab_or_user(op: str, backend: str) -> bool:
    from kernellab.core import registry
    from kernellab.harness.results import is_ours

    try:
        impl = registry.get(op, backend)
    except KeyError:
        return True
    return not impl.builtin or is_ours(backend)


# --------------------------------------------------------------------------- bench


def _parse_options(items) -> dict | None:
    """['causal=true', 'reduction=sum'] -> {'causal': True, 'reduction': 'sum'}; None if none given."""
    if not items:
        return None
    from kernellab.core.spec import option_value

    out = {}
    for item in _split(items, "--opt"):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--opt {item!r} not understood; write KEY=VALUE, e.g. causal=true")
        out[key.strip()] = option_value(value.strip())
    return out


def cmd_bench(args) -> int:
    from kernellab.core import registry
    from kernellab.core.spec import get_spec
    from kernellab.harness import bench as bn
    from kernellab.harness import results

    if args.op not in registry.op_names():
        console.print(f"[red]unknown op {args.op!r}[/]; known: {', '.join(registry.op_names())}")
        return 2
    spec = get_spec(args.op)
    from kernellab import device as _device

    try:
        backends = _split(args.backend, "--backend")
        dtypes = _dtypes(_split(args.dtype, "--dtype"))
        shape_texts = _split(args.shape, "--shape") if args.shape else None
        shapes = _problem_shapes(args.op, shape_texts) if shape_texts else None
        modes = _split(args.mode, "--mode") or ["fwd"]
    except ValueError as e:
        console.print(f"[red]{e}[/]")
        return 2
    try:
        options = _parse_options(args.opt)
        _check_options(args.op, options)
        if shapes:  # (before anything is allocated)
            _shapes_fit(args.op, shapes, shape_texts, dtypes, _device.default_device())
    except ValueError as e:
        console.print(f"[red]{e}[/]")
        return 2
    import torch

    # TF32 the same way for every backend: PyTorch's default lets cuDNN's fp32 convolutions
    # take TF32 (matmuls not); conv2d's cuda kernels never do, its Triton kernels follow
    # cudnn.allow_tf32. Off for both unless --tf32.
    torch.backends.cuda.matmul.allow_tf32 = bool(args.tf32)
    torch.backends.cudnn.allow_tf32 = bool(args.tf32)
    rows = []
    try:
        with _progress() as prog:
            n_impl = len([i for i in registry.impls(args.op) if not backends or i.backend in backends])
            from kernellab import device

            n_shapes = len(shapes or (spec.bench_shapes if device.has_cuda() else spec.cpu_bench_shapes))
            n_opts = 1 if options is not None else len(spec.bench_options)
            total = n_impl * n_shapes * len(dtypes or spec.dtypes) * len(modes) * n_opts
            task = prog.add_task("bench", total=total)

            def on_start(impl, shape, dtype, mode):
                prog.update(task, description=f"{impl.backend} {mode} {'x'.join(map(str, shape))} {dtype}")

            def on_row(row):
                rows.append(row)
                prog.advance(task)

            bn.bench(
                args.op,
                backends,
                shapes,
                dtypes,
                modes,
                graph=args.graph,
                flush=not args.no_flush,
                budget_s=args.budget,
                on_row=on_row,
                on_start=on_start,
                options=options,
            )
    except (KeyError, ValueError) as e:
        given = [o for o, v in (("-s/--shape", shapes), ("--opt", options)) if v]
        hint = f" (check {' and '.join(given)})" if given and isinstance(e, bn.ProblemError) else ""
        console.print(f"[red]{_msg(e)}{hint}[/]")
        return 2
    print_bench_table(rows)
    if args.json:
        n = results.write_jsonl(rows, args.json)
        console.print(f"{n} rows appended to {args.json}")
    if args.plot:
        from kernellab.harness.plot import plot_sweep

        try:
            console.print(f"plot written to {plot_sweep(rows, args.plot)}")
        except ValueError as e:
            console.print(f"[yellow]no plot: {e}[/]")
    return 1 if any(r.get("status") in ("rejected", "error") for r in rows) else 0


def print_bench_table(rows) -> None:
    if not rows:
        return
    r0 = rows[0]
    title = f"{r0['op']} on {r0['gpu']} (torch {r0['torch']}, triton {r0['triton']})"
    table = Table(title=title)
    for col in (
        "shape",
        "dtype",
        "mode",
        "backend",
        "median ms",
        "p20-p80",
        "GB/s",
        "TFLOP/s",
        "% peak",
        "host us",
        "loop ms",
        "vs torch",
        "check",
    ):
        table.add_column(col, justify="right" if col not in ("backend", "check", "mode") else "left")
    prev = None
    for r in rows:
        from kernellab.harness.results import mode_label

        key = (r["shape"], r["dtype"], mode_label(r))
        if prev is not None and key != prev:
            table.add_section()
        prev = key
        if r["status"] == "unavailable":
            table.add_row(*key, r["backend"], *["-"] * 8, f"[yellow]{r['reason']}[/]")
            continue
        if r["status"] in ("rejected", "error"):
            table.add_row(
                *key,
                r["backend"],
                *["-"] * 8,
                f"[red]{r['status'].upper()}: {r['reason']}[/]",
            )
            continue
        sp = r.get("speedup_vs_torch")
        table.add_row(
            *key[:2],
            key[2] + (" graph" if r.get("graph") else ""),
            r["backend"],
            f"{r['median_ms']:.4f}",
            f"{r['p20_ms']:.4f}-{r['p80_ms']:.4f}",
            f"{r['gbps']:.1f}",
            f"{r['tflops']:.3f}",
            f"{r['pct_peak']:.1f}%" if r.get("pct_peak") is not None else "-",
            f"{r['host_us']:.1f}" if r.get("host_us") is not None else "-",
            (f"{r['loop_ms']:.4f}" + (" [yellow]host-bound[/]" if r.get("bound") == "host" else ""))
            if r.get("loop_ms") is not None
            else "-",
            f"{sp:.2f}x" if sp else "-",
            f"[green]ok[/] ({r['check_ratio']:.2f})",
        )
    show(table)
    if r0.get("device") == "cpu":
        console.print("[dim]CPU: host-clock timing, no cache flush; Triton runs under its interpreter.[/]")
    console.print(
        "[dim]loop ms: time per call in a plain loop (host cost included); vs torch compares the "
        "larger of median and loop time on both sides.[/]"
    )


# --------------------------------------------------------------------------- peaks / report / info


def cmd_peaks(args) -> int:
    from kernellab import device

    if not device.has_cuda():
        console.print("[yellow]kernellab peaks needs a CUDA GPU; this machine has none.[/]")
        return 1
    with console.status("measuring copy bandwidth and matmul rates ..."):
        p = device.peaks(refresh=args.refresh)
    console.print_json(json.dumps(p))
    return 0


def cmd_build_nodes(args) -> int:
    """Build the C++ autograd nodes (kernellab/cuda/nodes.py) once; the norms' eager
    ``triton`` and ``cuda_node`` backends use them from then on."""
    import time

    from kernellab.cuda import nodes

    t0 = time.perf_counter()
    try:
        with console.status("compiling kernellab/cuda/nodes.cpp (about a minute, once) ..."):
            mod = nodes.build(verbose=args.verbose)
    except Exception as e:  # noqa: BLE001 - no compiler, no ninja, torch headers missing: say so
        console.print(f"[red]build-nodes failed: {type(e).__name__}: {e}[/]")
        return 1
    console.print(f"built {mod.__file__} in {time.perf_counter() - t0:.1f} s")
    return 0


def cmd_report(args) -> int:
    from kernellab.harness import results

    if args.html:
        ignored = [o for o, v in (("--op", args.op), ("--pivot", args.pivot), ("--shape", args.shape)) if v]
        if ignored:  # (the page shows every row)
            return _refuse(args, f"{', '.join(ignored)}: the markdown table's options; --html makes the "
                                 "page of every row")  # fmt: skip
        from kernellab.core import tables
        from kernellab.harness import report

        known = tables.table_gpus()
        gpus = known if args.tables and "all" in args.tables else (args.tables or [])
        bad = [g for g in gpus if g not in known]
        if bad:
            print(f"error: --tables: no tuning table for {bad[0]!r}; tables: {', '.join(known)}", file=sys.stderr)
            return 2
        page = report.build(args.files, args.html, title=args.title, tables_of=gpus)
        console.print(f"wrote {page} (open it in a browser)")
        return 0
    rows = []
    for path in args.files:
        rows += results.read_jsonl(path)
    if args.op:
        from kernellab.core import registry

        present = sorted({r["op"] for r in rows if r.get("op")})
        for op in args.op:
            if op not in present:
                known = op in registry.op_names()
                what = f"no rows of that op in {', '.join(args.files)}" if known else "unknown op"
                return _refuse(args, f"--op {op}: {what}; the files' ops: {', '.join(present) or 'none'}")
    shapes = _split(args.shape, "--shape")
    if shapes:  # (the markdown table too, not only --pivot's)
        mine = [r for r in rows if not args.op or r.get("op") in args.op]
        present = list(dict.fromkeys(str(r.get("shape")) for r in mine))
        for shape in shapes:
            if shape not in present:
                more = ", ..." if len(present) > 12 else ""
                return _refuse(args, f"--shape {shape}: no rows of that shape (as the rows write it); "
                                     f"theirs: {', '.join(present[:12]) or 'none'}{more}")  # fmt: skip
        rows = [r for r in rows if str(r.get("shape")) in shapes]
    if args.pivot:
        print(results.pivot_table(rows, ops=args.op or None, shapes=shapes))
    else:
        print(results.markdown_table(rows, ops=args.op or None))
    return 0


def cmd_ladder(args) -> int:
    from kernellab.harness import ladder

    fmt = "json" if args.json else "markdown" if args.markdown else "text"
    text, rc = ladder.command(
        args.op, all_ops=args.all, results=args.results, shape=args.shape, dtype=args.dtype, mode=args.mode,
        gpu=args.gpu, fmt=fmt, plot_path=args.plot, plot_by=args.plot_by,
    )  # fmt: skip
    print(text, end="")
    if args.plot:
        print(f"wrote {args.plot}", file=sys.stderr)
    return rc


def cmd_info(args) -> int:
    from kernellab import device
    from kernellab.cuda.runtime import include_dirs, nvrtc_unavailable, nvrtc_version

    d = device.summary()
    why = nvrtc_unavailable()
    d["nvrtc"] = nvrtc_version() if why is None else f"unavailable: {why}"
    d["cuda_headers"] = list(include_dirs())
    from kernellab.options import config

    d["config"] = config.as_dict()  # the process-wide switches (kernellab.config), as set now
    from kernellab.cuda import nodes

    # the C++ autograd nodes (eager host cost of the norms and attention): in use, or why not
    why_nodes = nodes.why_unavailable()
    d["cpp_nodes"] = "in use" if why_nodes is None else f"not in use: {why_nodes}"
    console.print_json(json.dumps(d))
    return 0


# --------------------------------------------------------------------------- profile / demo


def _one(values, what, default=None):
    vals = _split(values, f"--{what}")
    if not vals:
        return default
    if len(vals) > 1:
        raise ValueError(f"profile takes one {what}, got {', '.join(vals)}")
    return vals[0]


def cmd_profile(args) -> int:
    from kernellab import device
    from kernellab.core import registry
    from kernellab.core.spec import dtype_name, get_spec, parse_dtype, shape_str
    from kernellab.profile import ncu
    from kernellab.profile.torchprof import op_call, profile_call

    if args.op not in registry.op_names():
        console.print(f"[red]unknown op {args.op!r}[/]; known: {', '.join(registry.op_names())}")
        return 2
    spec = get_spec(args.op)
    dev = device.default_device()
    try:
        backend = _one(args.backend, "backend") or registry.default_backend(args.op, dev)
        shape_s = _one(args.shape, "shape")
        shape = (
            _problem_shapes(args.op, [shape_s])[0]
            if shape_s
            else (spec.bench_shapes if dev == "cuda" else spec.cpu_bench_shapes)[-1]
        )
        dtype = parse_dtype(_one(args.dtype, "dtype", "fp32"))
        if shape_s:  # (before anything is allocated)
            _shapes_fit(args.op, [shape], [shape_s], [dtype], dev)
        mode = _one(args.mode, "mode", "fwd")
        fn = op_call(args.op, backend, shape, dtype, mode)
    except (KeyError, ValueError) as e:
        console.print(f"[red]{_msg(e)}[/]")
        return 2
    if args.ncu_target:  # the process ncu runs: warm up, then one call inside the NVTX range
        import torch

        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_push(ncu.NVTX_RANGE)
        fn()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
        return 0
    what = f"{args.op}/{backend} {mode} {shape_str(shape)} {dtype_name(dtype)}"
    res = profile_call(fn, iters=args.iters, trace_path=args.trace)
    table = Table(title=f"profile {what} on {device.gpu_name()} ({args.iters} calls)")
    kind = "kernel" if res.device == "cuda" else "CPU op"
    for col in (
        kind,
        "calls",
        "calls/iter",
        "self time us" if res.device == "cpu" else "self CUDA us",
        "share",
    ):
        table.add_column(col, justify="left" if col == kind else "right")
    for r in res.rows[:25]:
        table.add_row(
            r.name[:90],
            str(r.calls),
            f"{r.calls / res.iters:.1f}",
            f"{r.self_us:.1f}",
            f"{100 * r.share:.1f}%",
        )
    show(table)
    if res.device == "cuda":
        console.print(
            f"kernels launched per call: {res.kernels_per_call:.1f}; "
            f"host time per call {res.cpu_us_per_call:.1f} us, "
            f"GPU kernel time per call {res.gpu_us_per_call:.1f} us"
            + (" (host-bound)" if res.cpu_us_per_call > res.gpu_us_per_call else " (GPU-bound)")
        )
    else:
        console.print(f"[yellow]{res.note}[/]; host time per call {res.cpu_us_per_call:.1f} us")
    if res.trace_path:
        console.print(
            f"Chrome/Perfetto trace written to {res.trace_path} (open in ui.perfetto.dev or chrome://tracing)"
        )
    out = {"what": what, "profile": res.to_dict()}
    if args.ncu:
        if dev != "cuda":
            console.print("[yellow]--ncu needs a CUDA GPU; this machine has none.[/]")
            out["ncu"] = {"error": "no CUDA device"}
        else:
            with console.status("running Nsight Compute ..."):
                out["ncu"] = n = ncu.run(
                    args.op, backend, shape_s or "x".join(map(str, shape)), dtype_name(dtype), mode
                )
            if "error" in n:
                console.print(f"[yellow]ncu: {n['error']}[/]")
            else:
                print_ncu(n["kernels"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=str)
    return 0


def print_ncu(kernels) -> None:
    t = Table(title="Nsight Compute (clock control: none)")
    cols = (
        "kernel",
        "time us",
        "mem SOL %",
        "DRAM %",
        "compute SOL %",
        "occupancy % (theory)",
        "limiter",
        "regs/thread",
        "smem/block B",
        "block",
        "grid",
    )
    for c in cols:
        t.add_column(c, justify="left" if c in ("kernel", "limiter") else "right")

    def f(v, nd=1):
        return "-" if v is None else f"{v:.{nd}f}"

    for k in kernels:
        smem = (k.get("static_smem_per_block") or 0) + (k.get("dynamic_smem_per_block") or 0)
        t.add_row(
            k["kernel"][:60],
            f(k.get("duration_us"), 2),
            f(k.get("mem_sol_pct")),
            f(k.get("dram_pct")),
            f(k.get("compute_sol_pct")),
            f"{f(k.get('achieved_occupancy_pct'))} ({f(k.get('theoretical_occupancy_pct'))})",
            k.get("occupancy_limiter", "-"),
            f(k.get("registers_per_thread"), 0),
            f(smem, 0),
            f(k.get("block_size"), 0),
            f(k.get("grid_size"), 0),
        )
    show(t)


def cmd_demo(args) -> int:
    from kernellab import demos
    from kernellab.core.spec import parse_dtype

    if args.which == "gelu":
        try:
            shape = _problem_shapes("gelu", [args.shape])[0] if args.shape else None
            dtype = parse_dtype(args.dtype)
            if shape:
                from kernellab import device

                _shapes_fit("gelu", [shape], [args.shape], [dtype], device.default_device())
        except ValueError as e:
            console.print(f"[red]{e}[/]")
            return 2
        rows = demos.demo_gelu(shape, dtype)
        t = Table(title=f"GeLU {rows[0]['shape']} {rows[0]['dtype']} on {rows[0]['gpu']}")
        for c in ("backend", "time ms", "loop ms", "GB/s", "% copy BW", "kernels/call", "vs torch"):
            t.add_column(c, justify="left" if c == "backend" else "right")
        for r in rows:
            if r["status"] != "ok":
                t.add_row(r["backend"], r["status"], "-", "-", "-", "-", "-")
                continue
            kpc = r.get("kernels_per_call")
            loop = r.get("loop_ms")
            t.add_row(
                r["backend"],
                f"{r['median_ms']:.4f}",
                f"{loop:.4f}" if loop is not None else "-",
                f"{r['gbps']:.1f}",
                f"{r['pct_bw']:.1f}%" if r.get("pct_bw") is not None else "-",
                f"{kpc:g}" if kpc is not None else "n/a (CPU)",
                f"{r.get('speedup_vs_torch') or 0:.2f}x",
            )
        show(t)
        console.print("[dim]time ms: device time per call; loop ms: per call in a plain loop (host "
                      "cost included); vs torch: torch's time / this one's, each the larger of the two[/]")
        result = rows
    else:
        try:
            result = demos.demo_mlp(
                args.dim, args.layers, args.batch, args.steps, args.backend, args.trace_dir
            )
        except ValueError as e:
            console.print(f"[red]{e}[/]")
            return 2
        t = Table(
            title=f"MLP dim={args.dim} layers={args.layers} batch={args.batch}, {args.steps} steps on "
            f"{result['device']} (GeLU: {result['gelu_backend']})"
        )
        for c in (
            "run",
            "step ms",
            "CPU ahead of GPU us (mean)",
            "GPU idle us",
            "GPU idle %",
            "kernels/step",
        ):
            t.add_column(c, justify="left" if c == "run" else "right")
        for r in result["runs"]:

            def f(v, scale=1.0):
                return "-" if v is None else f"{v * scale:.1f}"

            t.add_row(
                r["mode"],
                f"{r['step_ms']:.3f}",
                f(r["mean_run_ahead_us"]),
                f(r["gpu_idle_us"]),
                f(r["gpu_idle_frac"], 100),
                f(r["kernels_per_step"]),
            )
        show(t)
        if result.get("note"):
            console.print(f"[yellow]{result['note']}[/]")
        console.print(f"traces: {', '.join(r['trace'] for r in result['runs'])}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1, default=str)
    return 0


# --------------------------------------------------------------------------- asm


def _mnist_backend(name):
    """--backend of ``train mnist``: 'pytorch' (PyTorch's ops), 'default' (kernellab's default
    per op) or a kernellab backend for every op."""
    return None if name in (None, "default") else name


def _print_mnist_defaults(batch: int, device: str, data) -> None:
    from kernellab.models import mnist

    console.print(f"default ops at batch {batch} on {device} (the tuning table by the larger of device and "
                  "loop time; `kernellab explain`):")  # fmt: skip
    for c in mnist.default_choices(batch, device, data):
        shape = "x".join(map(str, c["shape"]))
        mode = "fwd+bwd" if c["fwdbwd"] else "fwd"
        console.print(f"  {c['op']:15s} {shape:>14s} {mode:8s} -> {c['backend']:8s} {c['why'][:110]}",
                      markup=False, highlight=False)  # fmt: skip


def cmd_train_mnist(args) -> int:
    import json

    import torch

    from kernellab.data import mnist as mnist_data
    from kernellab.harness.bench import git_sha, versions
    from kernellab.models import mnist

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    lr = args.lr if args.lr is not None else 0.05
    try:
        data = mnist_data.load(args.data, device)
    except (OSError, ValueError) as e:
        console.print(f"[red]{e}[/]")
        return 2
    console.print(f"data: {data.source}: {len(data.train_y)} train, {len(data.test_y)} test images on {device}")
    if args.compare:
        sizes = args.batch_sizes or [args.batch_size or 64]
        variants = args.variants.split(",") if args.variants else list(mnist.COMPARE)
        unknown = set(variants) - set(mnist.COMPARE)
        if unknown:
            console.print(f"[red]--variants: unknown {sorted(unknown)}[/]; variants: {', '.join(mnist.COMPARE)}")
            return 2
        backend = _mnist_backend(args.backend)
        if backend is None:
            for b in sizes:
                _print_mnist_defaults(b, device, data)
        meta = {"gpu": torch.cuda.get_device_name() if device == "cuda" else "cpu", "git_sha": git_sha(),
                **versions(), "data": data.source, "lr": lr}  # fmt: skip
        out = open(args.out, "a") if args.out else None
        rows = []
        with _progress() as prog:
            task = prog.add_task("mnist steps", total=len(sizes) * len(variants))

            def on_row(row):
                rows.append(row)
                if out:
                    out.write(json.dumps({**meta, **{k: v for k, v in row.items() if k != "profile"}}) + "\n")
                    out.flush()
                prog.advance(task)

            def on_note(note):
                console.print(f"[yellow]note:[/] {note}")
                prog.advance(task)

            mnist.compare(sizes, variants, backend, device=device, steps=args.steps_timed,
                          warmup=args.warmup, lr=lr, profile=args.profile, on_row=on_row, on_note=on_note,
                          data=data, seed=args.seed)  # fmt: skip
        if out:
            out.close()
        if args.profile:
            for r in rows:
                if "profile" in r:
                    console.print(f"[bold]{r['variant']} batch {r['batch']}[/]")
                    console.print(r["profile"], markup=False, highlight=False)
        table = Table(title=f"MNIST CNN training step (ms/step, mean of {args.steps_timed} after warm-up), "
                            f"{meta['gpu']}, kernellab ops: {args.backend or 'default'}")  # fmt: skip
        table.add_column("batch", justify="right")
        for v in variants:
            table.add_column(v, justify="right")
        for b in sizes:
            sel = {r["variant"]: r for r in rows if r["batch"] == b}
            cells = []
            for v in variants:
                r = sel.get(v)
                if r is None:
                    cells.append("skipped")
                elif "error" in r:
                    cells.append("error: " + r["error"][:50])
                else:
                    cells.append(f"{r['ms_per_step']:.3f}")
            table.add_row(str(b), *cells)
        show(table)
        return 0 if all("error" not in r for r in rows) else 1
    backends = "pytorch" if args.backend == "pytorch" else _mnist_backend(args.backend)
    bsz = args.batch_size or 64
    if backends is None:  # say what the default runs at this batch, and why
        _print_mnist_defaults(bsz, device, data)
    with _progress() as prog:
        steps = (len(data.train_y) // bsz) * args.epochs
        task = prog.add_task("train mnist", total=steps)
        right = {"acc": float("nan")}

        def on_step(i, loss, ms):  # (no test accuracy before the first epoch ends)
            acc = "" if right["acc"] != right["acc"] else f"  test acc {right['acc']:.3f}"
            prog.update(task, advance=1, description=f"loss {loss:.4f}{acc}  {ms:.2f} ms/step")

        def on_epoch(epoch, acc):
            right["acc"] = acc
            console.print(f"epoch {epoch}: test accuracy {acc:.4f}")

        variant = args.mode or "eager"
        if variant not in mnist.VARIANTS or (variant == "graph" and device != "cuda"):
            console.print(f"[red]--mode {variant}: mnist trains in eager, compile or graph (graph: on a GPU)[/]")
            return 2
        fuse_pool = {"auto": None, "on": True, "off": False}[args.fuse_pool]
        try:
            result = mnist.train(backends, bsz, args.epochs, lr, device=device, on_step=on_step, on_epoch=on_epoch,
                                 data=data, variant=variant, fuse_pool=fuse_pool, seed=args.seed)  # fmt: skip
        except ValueError as e:
            console.print(f"[red]{e}[/]")
            return 2
    losses = result["losses"]
    console.print(f"mnist ({args.backend or 'default'} ops, batch {bsz}, lr {lr}, seed {args.seed}): loss {losses[0]:.3f} -> "
                  f"{losses[-1]:.3f} over {len(losses)} steps, test accuracy {result['test_acc'][-1]:.4f}, "
                  f"{result['ms_per_step']:.2f} ms/step (host timed, one sync per step)")  # fmt: skip
    return 0


HF_CONFIGS = ("gpt2", "llama", "qwen2", "mistral", "gemma2", "phi")
COMPARE_CONFIGS = (*HF_CONFIGS, "vit")  # --compare also times ViT-B/16 (an image classifier)


def _several_gpus(args, kw: dict) -> int:
    """``train ... --nproc / --dp / --global-batch``: context parallel (``--dp cp``) or data
    parallel (DDP, FSDP2), with ``train``'s keyword arguments resolved in ``kw``."""
    if args.dp == "cp":  # the sequence sharded over the ranks
        from kernellab.distributed import context_parallel

        return context_parallel.cli_train(args, console, _progress, kw)
    from kernellab.distributed import data_parallel

    return data_parallel.cli_train(args, console, _progress, kw)


def cmd_train_user_model(args) -> int:
    """``train hf --config llama --compare`` / ``train nanogpt --compare``: training steps of a
    model kernellab did not write (kernellab.models.user_models), each variant in its own
    process, in every mode."""
    import torch

    from kernellab.distributed import data_parallel
    from kernellab.models import user_models

    gpu = torch.cuda.is_available()
    if args.model == "hf" and data_parallel.asked(args):
        return _several_gpus(args, data_parallel.hf_train_kw(args, HF_CONFIGS))
    if not args.compare:
        console.print(f"[red]train {args.model}: runs with --compare (training steps of the unpatched model, "
                      "Liger's patch and kernellab's, timed) or data parallel (hf --nproc N)[/]")  # fmt: skip
        return 2
    if args.model == "hf":
        config = args.config or "llama"
        if config not in COMPARE_CONFIGS:
            console.print(f"[red]--config {config}: train hf takes {', '.join(COMPARE_CONFIGS)}[/]")
            return 2
        bsz = args.batch_size or (64 if config == "vit" else 2)
        name, seq = f"hf-{config}", args.seq_len or 2048
        modes = "eager,compile"
    else:
        name, seq, bsz = "nanogpt", args.seq_len or 1024, args.batch_size or 8
        modes = "eager,compile,reduce-overhead"
    if args.mode is not None:
        mode = {"compile-cudagraphs": "reduce-overhead"}.get(args.mode, args.mode)
        if mode not in ("eager", "compile", "reduce-overhead"):
            console.print(f"[red]--mode {args.mode}: train {args.model} times eager, compile, compile-cudagraphs[/]")
            return 2
        modes = mode
    if not gpu:  # tiny configs, a few steps: a smoke run (no speed claim on the CPU)
        seq, bsz, modes = min(seq, 32), min(bsz, 2), "eager"
    argv = ["--model", name, "--seq", str(seq), "--batch", str(bsz), "--modes", modes, "--isolate",
            "--dtype", args.dtype or ("bf16" if gpu else "fp32")]  # fmt: skip
    if args.variants:
        argv += ["--variants", args.variants]
    if not gpu:
        argv += ["--small", "--steps", "1", "--warmup", "1", "--rounds", "1"]
    if args.out:
        argv += ["--json", args.out]
    return user_models.main(argv)


def cmd_train_gpt(args) -> int:
    import json

    import torch

    from kernellab.harness.bench import git_sha, versions
    from kernellab.models import gpt

    if args.lr is None:
        args.lr = 3e-4
    if args.backend is None:
        args.backend = "triton"
    if args.mode is None:
        args.mode = "eager"
    gpu = torch.cuda.is_available()
    if args.mode not in gpt.MODES or (args.mode == "compile-step-graph" and not gpu):
        console.print(f"[red]--mode {args.mode}: gpt trains in {', '.join(gpt.MODES)} "
                      "(compile-step-graph: on a GPU)[/]")  # fmt: skip
        return 2
    config = args.config or ("gpt2" if gpu else "tiny")
    dtype = args.dtype or ("bf16" if gpu else "fp32")
    bsz = args.batch_size or (8 if config == "gpt2" else 4)
    backend = None if args.backend == "default" else args.backend
    matmul = None if args.matmul == "default" else args.matmul
    # AdamW: PyTorch's with PyTorch's ops, kernellab's one-launch step with kernellab's
    optimizer = args.optimizer or ("pytorch" if args.backend == "pytorch" else "triton")
    from kernellab.distributed import data_parallel

    if data_parallel.asked(args):
        seq = args.seq_len or gpt.CONFIGS.get(config, gpt.CONFIGS["tiny"]).ctx
        kw = dict(config=config, backends=backend, matmul=matmul, mode=args.mode, batch_size=bsz, seq_len=seq,
                  steps=args.steps, dtype=dtype, data=args.data, lr=args.lr, optimizer=optimizer)  # fmt: skip
        return _several_gpus(args, kw)
    if args.compare:
        t = args.seq_len or gpt.CONFIGS.get(config, gpt.CONFIGS["tiny"]).ctx
        modes = gpt.MODES if gpu else ("eager",)  # compile on the CPU: minutes of codegen, no speed claim
        meta = {"gpu": torch.cuda.get_device_name() if gpu else "cpu", "git_sha": git_sha(), **versions()}
        out = open(args.out, "a") if args.out else None
        rows = []
        with _progress() as prog:
            task = prog.add_task("training steps", total=len(modes) * len(gpt.COMPARE_SETS))

            def on_row(row):
                rows.append(row)
                if out:
                    out.write(json.dumps({**meta, "bench": "gpt_step", **row}) + "\n")
                    out.flush()
                prog.advance(task)

            gpt.compare(config, [(bsz, t)], modes, dtype=dtype, warmup=3 if gpu else 1,
                        steps=8 if gpu else 1, on_row=on_row)  # fmt: skip
        table = Table(title=f"{config} training step, {dtype}, {meta['gpu']}: ms/step (ratio to PyTorch ops)")
        for col in ("B x T", "mode", *gpt.COMPARE_SETS):
            table.add_column(col, justify="right")
        for mode in modes:
            sel = {r["ops"]: r for r in rows if r["mode"] == mode}
            base = sel.get("pytorch", {}).get("ms_per_step")
            cells = []
            for name in gpt.COMPARE_SETS:
                r = sel.get(name, {})
                if "error" in r:
                    cells.append("error: " + r["error"][:60])
                elif "ms_per_step" in r:
                    v = r["ms_per_step"]
                    cells.append(f"{v:.2f}" + (f" ({v / base:.2f}x)" if base else ""))
                else:
                    cells.append("-")
            table.add_row(f"{bsz} x {t}", mode, *cells)
        show(table)
        return 0 if all("error" not in r for r in rows) else 1
    if backend is None or matmul is None:  # say what the default picked, and why it may differ per shape
        cfg = gpt.CONFIGS.get(config, gpt.CONFIGS["tiny"])
        chosen = gpt.op_set(backend, matmul)["chosen"]
        dev = "cuda" if torch.cuda.is_available() else "cpu"
        got = gpt.resolve_defaults(chosen, cfg, bsz, args.seq_len or cfg.ctx, gpt._dtype(dtype), dev)
        console.print(f"default ops at {bsz} x {args.seq_len or cfg.ctx} on {dev} (device time of the tuning "
                      "table, `kernellab explain`): " + ", ".join(f"{k}={v or 'per call'}" for k, v in got.items()))  # fmt: skip
    with _progress() as prog:
        task = prog.add_task("train gpt", total=args.steps)
        toks = bsz * (args.seq_len or gpt.CONFIGS.get(config, gpt.CONFIGS["tiny"]).ctx)

        def on_step(i, loss, ms):
            prog.update(
                task,
                advance=1,
                description=f"loss {loss:.3f}  {toks / ms * 1e3:,.0f} tok/s  {ms:.1f} ms/step",
            )

        losses = gpt.train(config, backend, matmul, args.mode, bsz, args.seq_len, args.steps, dtype,
                           args.data, lr=args.lr, on_step=on_step, optimizer=optimizer)  # fmt: skip
    console.print(f"{config} ({args.mode}, {dtype}, ops {args.backend}, linear {args.matmul}, AdamW {optimizer}): "
                  f"loss {losses[0]:.3f} -> {losses[-1]:.3f} over {len(losses)} steps")  # fmt: skip
    return 0


def cmd_asm(args) -> int:
    from kernellab import device
    from kernellab.core import registry
    from kernellab.core.spec import parse_dtype
    from kernellab.inspect import asm
    from kernellab.numba_support import Kernels
    from kernellab.ops._elementwise_cuda import SUFFIX

    if args.op not in registry.op_names():
        console.print(f"[red]unknown op {args.op!r}[/]; known: {', '.join(registry.op_names())}")
        return 2
    try:
        impl = registry.get(args.op, args.backend)
        dtype = parse_dtype(args.dtype)
        shape = _problem_shapes(args.op, [args.shape], timed=False)[0] if args.shape else (4096,)
    except (KeyError, ValueError) as e:
        console.print(f"[red]{_msg(e)}[/]")
        return 2
    try:
        re.compile(args.kernel or "")
    except re.error as e:
        console.print(f"[red]--kernel {args.kernel!r}: not a regular expression ({e})[/]")
        return 2
    arch = args.arch or device.arch() or "sm_90"
    if isinstance(impl.module, Kernels):  # a Numba backend: PTX through NVVM, no GPU needed
        from kernellab.core.spec import dtype_name

        try:
            kernels, note = impl.module.asm_report(arch, impl.backend, dtype_name(dtype), args.kernel)
        except Exception as e:  # noqa: BLE001 - no NVVM, numba missing, the simulator on
            console.print(f"[red]{e}[/]")
            return 1
        where = f"Numba CUDA, compiled for {arch} (NVVM)"
    elif impl.module is not None:
        try:
            kernels, note = asm.cuda_report(impl.module, arch, impl.backend, SUFFIX.get(dtype), args.kernel)
        except Exception as e:  # noqa: BLE001 - an NVRTC failure is reported
            console.print(f"[red]{e}[/]")
            return 1
        labels = dict.fromkeys(m.label for m, _ in asm.cuda_parts(impl.module, arch, impl.backend))
        where = f"{' + '.join(labels)} for {arch} (NVRTC)"
    elif impl.triton_kernels is not None:
        from kernellab.core.spec import dtype_name

        kernels, note = asm.triton_report(impl, dtype_name(dtype), arch)
        if not kernels and device.has_cuda():  # ahead-of-time compile failed: read a real run's
            kernels, note = asm.triton_artifacts(args.op, shape, args.dtype)
        where = f"Triton, compiled for {arch}"
    else:
        console.print(
            f"[yellow]{args.op}/{args.backend} has no kernel source of ours to show "
            f"(asm reads CUDA, Triton and Numba backends).[/]"
        )
        return 1
    if note:
        console.print(f"[yellow]{note}[/]")
    if not kernels:
        console.print("[red]no kernel matched[/]")
        return 1
    t = Table(title=f"{args.op}/{args.backend}: {where}")
    cols = (
        "kernel",
        "regs",
        "stack B",
        "smem B",
        "local B",
        "ld.global.v4",
        "LDG.128",
        "STG.128",
        "LDL/STL",
        "TMA",
        "HMMA",
        "HGMMA",
        "MUFU",
        "SASS instr",
    )
    for c in cols:
        t.add_column(c, justify="left" if c == "kernel" else "right")

    def f(v):
        return "-" if v is None else str(v)

    for k in kernels:
        c = k.counts
        t.add_row(
            k.name,
            f(k.registers),
            f(k.stack_bytes),
            f(k.shared_bytes),
            f(k.local_bytes),
            f(c["ptx_ld_global_v4"]),
            f(c["LDG_128"]) if k.sass else "-",
            f(c["STG_128"]) if k.sass else "-",
            f(c["LDL_STL"]) if k.sass else "-",
            f(c["TMA"]) if k.sass else "-",
            f(c["HMMA"]) if k.sass else "-",
            f(c["HGMMA"]) if k.sass else "-",
            f(c["MUFU"]) if k.sass else "-",
            f(c["sass_instructions"]),
        )
    show(t)
    for k in kernels:
        verdict = []
        if k.counts["ptx_tma"] or k.counts["TMA"]:
            verdict.append(f"TMA copies ({k.counts['TMA'] if k.sass else k.counts['ptx_tma']})")
        if k.counts["ptx_ld_global_v4"] or k.counts["LDG_128"]:
            verdict.append("16-byte global loads")
        elif k.counts["ptx_cp_async_16"] or k.counts["LDGSTS_128"]:
            verdict.append("16-byte global loads (cp.async into shared memory)")
        elif k.counts["ptx_ld_global_v2"] or k.counts["LDG_64"]:
            verdict.append("8-byte global loads")
        elif not (k.counts["ptx_tma"] or k.counts["TMA"]):
            verdict.append("no 16-byte global loads")
        if k.counts["LDL_STL"] or k.counts["ptx_local"] or (k.local_bytes or 0) > 0:
            verdict.append(
                f"local memory traffic ({k.counts['LDL_STL']} LDL/STL): spills or a runtime-indexed array"
            )
        if k.counts["LDS"] or k.counts["STS"]:
            verdict.append(f"shared memory ({k.counts['LDS']} LDS, {k.counts['STS']} STS)")
        if k.counts["HMMA"] or k.counts["HGMMA"]:
            verdict.append(f"tensor cores ({k.counts['HMMA']} HMMA, {k.counts['HGMMA']} HGMMA)")
        console.print(f"{k.name}: " + "; ".join(verdict))
    for k in kernels if (args.ptx or args.sass) else []:
        if args.ptx:
            console.rule(f"PTX {k.name}")
            print(k.ptx)
        if args.sass:
            console.rule(f"SASS {k.name}")
            print(k.sass or "(no SASS: see the note above)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump([k.to_dict(with_text=True) for k in kernels], fh, indent=1)
    return 0


# --------------------------------------------------------------------------- main



def cmd_explain(args) -> int:
    """Which backend ``backend=None`` picks for OP at a shape and dtype, and why."""
    from kernellab import device as _device
    from kernellab.core import registry, shapes, tables
    from kernellab.core.spec import get_spec, parse_dtype

    try:
        spec = get_spec(args.op)
        shape, dtype = _problem_shapes(args.op, [args.shape], timed=False)[0], parse_dtype(args.dtype)
    except (KeyError, ValueError) as e:
        print(f"error: {_msg(e)}", file=sys.stderr)
        return 2
    dev = args.device or _device.default_device()
    key = shapes.key_of_shape(args.op, shape)
    try:
        options = _parse_options(args.opt) or {}
        _check_options(args.op, options)
        opts = shapes.option_key(args.op, options)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    what = f"{args.op} {args.shape} {args.dtype} {args.mode}{' ' + opts if opts else ''}"
    if args.gpu:  # another GPU model's table, from this machine
        src = tables.table_path(args.gpu)
        if not os.path.exists(src):
            have = ", ".join(repr(g) for g in tables.table_gpus()) or "none"
            print(f"error: --gpu: no tuning table for {args.gpu!r} ({os.path.basename(src)}); the GPU models "
                  f"with one: {have}", file=sys.stderr)  # fmt: skip
            return 2

        def choose(by):
            return registry.choose_for_gpu(args.op, key, dtype, args.gpu, args.mode, opts, by=by)

        where = f"{args.gpu} (its table, {src}; every CUDA backend counted as usable there)"
    else:

        def choose(by):
            return registry.choose_key(args.op, key, dtype, dev, args.mode, opts, by=by)

        where = f"{dev} ({tables.gpu_of(dev)})"
    backend, why = choose(None)
    print(f"{what} on {where}: {backend}")
    print(f"  why: {why}")
    if not args.gpu:
        gpu = tables.gpu_of(dev)
        src = tables.table_path(gpu)
        print(f"  table: {src if os.path.exists(src) else 'none for ' + gpu}; `kernellab tune` writes "
              f"{tables.table_path(gpu, write=True)}")  # fmt: skip
    if os.path.exists(src) and dtype is not None:
        from kernellab.core.spec import dtype_name
        from kernellab.harness import choice_cv

        line = choice_cv.group_line(tables.read_table(src)["rows"], args.op, dtype_name(dtype), args.mode, opts,
                                    registry.resolve_rule(), None if args.gpu else dev)  # fmt: skip
        if line:
            print(f"  {line}")
    # Inside a CUDA graph, a compiled graph or a model's fused node the host cost is paid
    # once per step: what the device time alone would pick (kernellab.models.gpt does).
    rules = {"queued": "device time where kernels take 20 us or more",
             "loop": "the larger of device and loop time"}  # fmt: skip
    other_rule = next(r for r in rules if r != registry.resolve_rule())
    for by, label in (("device", "by device time (a graphed or fused step)"),
                      (other_rule, f"with config.default_by={other_rule!r} ({rules[other_rule]})")):
        other, other_why = choose(by)
        print(f"  {label}: {other}" + ("" if other_why == why else f" ({other_why})"))
    if args.gpu:
        return 0
    comp = registry.compiled_backend(args.op, dev)
    print(f"  inside torch.compile: {comp}"
          + (" (PyTorch's op: Inductor fuses it with its neighbours)" if comp == "torch" else
             " (OpSpec.compiled_backends)"))  # fmt: skip
    order = ", ".join(b for b in spec.default_backends if registry._TABLE.get((args.op, b)) is not None)
    print(f"  heuristic order: {order} (torch last); a ValueError refusal by the choice falls back to torch")
    return 0


def cmd_tune(args) -> int:
    """Sweep every backend of OP over a shape family; write this GPU's tuning table."""
    from kernellab import device as _device
    from kernellab.core import tables
    from kernellab.core.spec import get_spec
    from kernellab.harness import tune as tuner

    dtypes = _dtypes(args.dtype)
    dev = args.device or _device.default_device()
    backends = _split(args.backend, "--backend") if args.backend else None
    try:
        if args.shape and args.family:
            raise ValueError("--shape and --family: give one (a family's shapes, or your own)")
        shapes = _problem_shapes(args.op, args.shape) if args.shape else None
        if shapes:  # (before anything is allocated)
            _shapes_fit(args.op, shapes, args.shape, dtypes, dev)
        modes = get_spec(args.op).modes
        for mode in args.mode:
            if mode not in modes:
                raise ValueError(f"--mode {mode}: not a mode of {args.op}; its modes: {', '.join(modes)}")
        notice = tuner.not_timed_notice(args.op, dev, backends)
        if notice:
            print(notice, flush=True)
        table = tuner.tune(
            args.op, args.family, dtypes, args.mode, device=dev,
            backends=backends, budget_s=args.budget, shapes=shapes,
            on_row=lambda r: print(
                f"  {r['backend']:>10} {r['shape']:>18} {r['dtype']} {r['mode']}: "
                + (f"{r.get('effective_ms') or r['median_ms']:.4g} ms" if r.get("status") == "ok" else r.get("status", "?")),
                flush=True,
            ),
        )  # fmt: skip
    except (KeyError, ValueError) as e:
        print(f"error: {_msg(e)}", file=sys.stderr)
        return 2
    rows = [r for r in table["rows"] if r["op"] == args.op]
    print(f"{tables.table_path(tables.gpu_of(dev))}: {len(rows)} rows for {args.op}")
    for r in rows:
        opts = f" {r['options']}" if r.get("options") else ""
        print(f"  {r['dtype']} {r['mode']} {r['shape']}{opts}: {r['best']}")
    return 0

def _family_names() -> list[str]:
    from kernellab.core.shapes import FAMILIES  # the shape families tune, bench and tests share

    return list(FAMILIES)



# --------------------------------------------------------------------------- train's parsers


class _OpNames:
    """The op names, read when a help text is printed (building the parser imports no op)."""

    def __str__(self) -> str:
        from kernellab.core import registry

        return ", ".join(registry.op_names())


def _op_argument(s, dest: str = "op", help: str = "the op: %(ops)s", **kw) -> None:
    s.add_argument(dest, help=help, **kw).ops = _OpNames()  # argparse fills %(ops)s from the action


# kernellab.models.mnist.COMPARE, named here so that building the parser imports no model
MNIST_VARIANTS = ("pytorch_eager", "pytorch_compile", "pytorch_graph", "kernellab_eager", "kernellab_graph")


def _train_common(t, batch_default: str, func) -> None:
    t.add_argument("--batch-size", type=_at_least(1), default=None, help=batch_default)
    t.add_argument("--compare", action="store_true", help="PyTorch's ops against kernellab's, every mode, timed")
    t.add_argument("--out", help="--compare: append JSONL rows to this file")
    t.set_defaults(func=func)


def _train_gpt_parser(models) -> None:
    t = models.add_parser("gpt", help="GPT-2 on kernellab's ops, trained on text (Python's pydoc topics)",
                          description="GPT-2 small (or tiny) on kernellab's ops; --compare times PyTorch's ops "
                          "against kernellab's in every mode.")  # fmt: skip
    t.add_argument("--config", default=None, help="gpt2 (124M) or tiny (default: gpt2 on a GPU, tiny here)")
    _train_common(t, "default 8 (gpt2) / 4 (tiny)", cmd_train_gpt)
    t.add_argument("--seq-len", type=_at_least(1), default=None, help="default: the config's context")
    t.add_argument("--steps", type=int, default=50, help="training steps (default 50)")
    t.add_argument("--backend", "-b", default=None,
                   help="kernellab backend for every op, 'default', or 'pytorch' (default: triton)")  # fmt: skip
    t.add_argument("--matmul", default="pytorch", help="linear layers: 'pytorch' (cuBLAS) or a matmul backend")
    t.add_argument("--mode", default=None, help="eager | compile | compile-cudagraphs | compile-step-graph "
                   "(the whole step one CUDA graph; default eager)")  # fmt: skip
    t.add_argument("--dtype", default=None, help="fp32 | bf16 (default: bf16 on a GPU, fp32 here)")
    t.add_argument("--data", default=None, help="a UTF-8 text file (default: Python's pydoc topics)")
    t.add_argument("--lr", type=float, default=None, help="AdamW's learning rate (default 3e-4)")
    t.add_argument("--optimizer", default=None, choices=["pytorch", "torch", "triton"],
                   help="AdamW from PyTorch (pytorch) or kernellab.optim.AdamW's backend torch / triton "
                   "(default: pytorch with --backend pytorch, else triton)")  # fmt: skip
    _dp_arguments(t)


def _dp_arguments(t) -> None:
    t.add_argument("--nproc", type=int, default=None, help="data parallel over N ranks, one per GPU "
                   "(re-runs the command under torchrun; docs/distributed.md)")  # fmt: skip
    t.add_argument("--dp", default=None, help="data parallel: ddp | fsdp2 | fsdp2-model (default ddp); cp: context "
                   "parallel, each sequence sharded over the ranks (ring attention)")
    t.add_argument("--global-batch", type=int, default=None,
                   help="data parallel: rows per step, all ranks (default: --batch-size per rank)")  # fmt: skip


def _train_mnist_parser(models) -> None:
    t = models.add_parser("mnist", help="the course's MNIST CNN on kernellab's ops (SGD)",
                          description="The course's CNN on kernellab's ops, with test accuracy per epoch; "
                          "--compare times a step of every variant.")  # fmt: skip
    _train_common(t, "default 64", cmd_train_mnist)
    t.add_argument("--backend", "-b", default=None,
                   help="kernellab backend for every op, 'default', or 'pytorch' (default: default)")  # fmt: skip
    t.add_argument("--mode", default=None, help="eager | compile | graph (graph: on a GPU; default eager)")
    t.add_argument("--data", default=None, help="a directory of MNIST's IDX files (default: the shipped digits)")
    t.add_argument("--lr", type=float, default=None, help="SGD's learning rate (default 0.05)")
    t.add_argument("--epochs", type=int, default=2, help="training epochs")
    t.add_argument("--seed", type=_seed, default=0, help="the seed of the weights and the batch order "
                   "(the same seed gives every op set the same start)")  # fmt: skip
    t.add_argument("--device", default=None, help="cuda or cpu (default: cuda where there is one)")
    t.add_argument("--steps-timed", type=_at_least(1), default=100, help="--compare: steps timed per variant")
    t.add_argument("--warmup", type=_at_least(0), default=10, help="--compare: warm-up steps per variant")
    t.add_argument("--batch-sizes", type=_sizes, default=None,
                   help="--compare: e.g. 64,256,1024 (default: --batch-size)")
    t.add_argument("--variants", default=None, help="--compare: a comma list of " + ", ".join(MNIST_VARIANTS))
    t.add_argument("--profile", action="store_true", help="--compare: a torch.profiler table per variant")
    t.add_argument("--fuse-pool", default="auto", choices=("auto", "on", "off"),
                   help="each block's batch norm, relu and pool as one op (bn_relu_pool2d); auto: where "
                   "the block's ops are kernellab's")  # fmt: skip


def _train_user_parsers(models) -> None:
    for name, what, variants in (
        ("hf", "a Hugging Face model built from its config: as is, with Liger's patch, with kernellab.patch",
         "hf,liger,kernellab"),
        ("nanogpt", "a user's nanoGPT with four calls swapped by hand for kernellab's", "torch,kernellab"),
    ):  # fmt: skip
        t = models.add_parser(name, help=what + " (--compare)",
                              description=f"Training steps of {what}, each variant in its own process, "
                              "timed with --compare (tokens/s, peak memory).")  # fmt: skip
        if name == "hf":
            configs = " | ".join(COMPARE_CONFIGS) + " (default llama; vit with --compare only)"
            t.add_argument("--config", default=None, help=configs)
        _train_common(t, "default 2 (hf; 64 images for vit) / 8 (nanogpt)", cmd_train_user_model)
        t.add_argument("--seq-len", type=_at_least(1), default=None,
                       help="default 2048 (hf) / 1024 (nanogpt)")
        t.add_argument("--mode", default=None, help="eager | compile | compile-cudagraphs (default: every one)")
        t.add_argument("--dtype", default=None, help="fp32 | bf16 (default: bf16 on a GPU, fp32 here)")
        t.add_argument("--variants", default=None, help=f"comma list (default {variants})")
        if name == "hf":  # a training run, data parallel (kernellab.distributed.data_parallel)
            _dp_arguments(t)
            t.add_argument("--steps", type=int, default=20, help="data parallel: training steps (default 20)")
            t.add_argument("--lr", type=float, default=3e-4, help="data parallel: AdamW's learning rate")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kernellab", description=__doc__)
    p.add_argument("--version", action="version", version=f"kernellab {_version()}")
    p.add_argument("--debug", action="store_true", help="show a Python traceback on errors")
    p.add_argument("--format", choices=("auto", "rich", "md", "json"), default="auto",
                   help="tables: drawn on a terminal and markdown when piped (auto), or always rich, md or json "
                   "(json: the tables alone on stdout, the rest on stderr)")  # fmt: skip
    sub = p.add_subparsers(dest="cmd")

    s = sub.add_parser("list", help="ops x backends and whether each runs here")
    s.set_defaults(func=cmd_list)

    s = sub.add_parser(
        "check",
        help="check implementations against the float64 reference",
        description="Check implementations against the float64 reference (quick by default; --full for "
        "the long sweep). Prints the plan and an estimate first, then progress. Exit status: 0 every "
        "kernellab (and user-registered) implementation passed, 1 one failed (--strict: or a baseline or "
        "peer), 2 usage error (unknown op, backend or dtype; nothing to check).",
    )
    _op_argument(s, "ops", nargs="*", help="ops to check (default: all): %(ops)s")
    s.add_argument("--backend", "-b", action="append", help="backend(s), comma-separated or repeated")
    s.add_argument("--dtype", action="append", help="fp32, fp16, bf16 (default: all)")
    s.add_argument(
        "--quick",
        action="store_true",
        default=True,
        help="the default, on a GPU too: every stage (edge shapes, specials, layouts, options, "
        "gradients, integrity, double backward, opcheck, bad input) on fewer shapes; minutes",
    )
    s.add_argument("--full", dest="quick", action="store_false",
                   help="the long sweep: every test shape and gradient shape (several times longer)")  # fmt: skip
    s.add_argument("--seed", type=_seed, default=None,
                   help="base seed, 0 to 2^64 - 1 (default: fresh each run)")  # fmt: skip
    s.add_argument("--fuzz", type=int, default=0, metavar="N",
                   help="N problems drawn at random per implementation and dtype (odd sizes, option sets, "
                   "GQA, strides; model-sized on a GPU) instead of the 2 small draws every run makes; the "
                   "seed replays them")  # fmt: skip
    s.add_argument("--fuzz-only", action="store_true", help="the random problems alone (N: --fuzz, else 10)")
    s.add_argument("--json", help="write the full report to this file")
    s.add_argument(
        "--strict",
        action="store_true",
        help="exit 1 also when a baseline or peer (torch, compile, ...) fails",
    )
    s.add_argument("--jobs", "-j", type=int, default=None, metavar="N",
                   help="worker processes (default: one per CPU core, at most 16; 1: this process only). "
                   "A check is bound by compiles and CPU work, each worker runs on its own core")  # fmt: skip
    s.set_defaults(func=cmd_check)

    s = sub.add_parser("bench", help="time an op's backends, re-checking the timed outputs")
    _op_argument(s)
    s.add_argument("--backend", "-b", action="append", help="backend(s), comma-separated or repeated")
    s.add_argument("--shape", "-s", action="append", help="e.g. 2^28, 4096x4096 (repeatable)")
    s.add_argument("--dtype", action="append", help="fp32, fp16, bf16 (default: all)")
    s.add_argument("--mode", action="append", help="fwd, bwd, fwdbwd (default fwd)")
    s.add_argument("--graph", action="store_true", help="time CUDA-graph replays (launch-bound work)")
    s.add_argument("--no-flush", action="store_true", help="do not flush the L2 between calls")
    s.add_argument(
        "--tf32", action="store_true", help="allow TF32 matmuls and cuDNN convolutions (every backend alike)"
    )
    s.add_argument("--budget", type=_seconds, default=1.5, help="seconds of timing per measurement (max)")
    s.add_argument("--opt", action="append", help="keyword option KEY=VALUE, e.g. causal=true (repeatable)")
    s.add_argument("--json", help="append result rows to this JSONL file")
    s.add_argument("--plot", help="draw the sweep to this PNG file")
    s.set_defaults(func=cmd_bench)

    s = sub.add_parser("peaks", help="measure and cache the device's copy bandwidth and matmul rates")
    s.add_argument("--refresh", action="store_true", help="measure again even if cached")
    s.set_defaults(func=cmd_peaks)

    s = sub.add_parser("build-nodes", help="compile the C++ autograd nodes once (lower host cost per call)")
    s.add_argument("--verbose", action="store_true", help="show the compiler's output")
    s.set_defaults(func=cmd_build_nodes)

    s = sub.add_parser(
        "report",
        help="markdown table, or with --html a page with pictures, from result files",
        description="e.g. kernellab report --html out/ benchmarks/results/*.jsonl",
    )
    s.add_argument("files", nargs="+", help="JSONL files written by bench --json, tune or train --out; check --json")
    s.add_argument("--html", metavar="DIR", help="write DIR/index.html and its pictures (roofline, speed-ups, models)")
    s.add_argument("--title", default="kernellab results", help="the page's title (with --html)")
    s.add_argument("--tables", action="append", metavar="GPU",
                   help="with --html: a section from this GPU model's tuning table (repeatable; 'all': every one "
                        "here): ours against the vendors at the model-family shapes, the default left one out")  # fmt: skip
    s.add_argument("--op", action="append", help="only this op's rows (repeatable)")
    s.add_argument("--pivot", action="store_true", help="one column per backend")
    s.add_argument("--shape", "-s", action="append", help="only these shapes (as written in the rows)")
    s.set_defaults(func=cmd_report)

    s = sub.add_parser(
        "ladder",
        help="an op's numbered variants: each rung's change and measured gain, from committed rows",
        description="Rungs: the backends <family>_v<N> (and the family's backend where its description "
        "names a step, e.g. softmax's cuda = v4), each with its registry description. Numbers: the newest "
        "row per backend at one key (GPU, shape, dtype, mode), chosen where the most rungs were measured "
        "(then keys adding rungs still missing). Unmeasured rungs say so; rows of several commits or days "
        "are flagged. Exit 1 when no rung has a row.",
    )
    s.add_argument("op", nargs="?", help="an op with numbered variants (--all: every one)")
    s.add_argument("--all", action="store_true", help="every op with a ladder")
    s.add_argument(
        "--results", action="append", metavar="PATH",
        help="JSONL file or folder of rows (repeatable; default benchmarks/results/)",
    )  # fmt: skip
    s.add_argument("--shape", "-s", help="only rows of this shape, as written in the rows (2^28 works)")
    s.add_argument("--dtype", help="only rows of this dtype: fp32, fp16, bf16")
    s.add_argument("--mode", choices=("fwd", "bwd", "fwdbwd"), help="only rows of this mode")
    s.add_argument("--gpu", help="only rows whose GPU name contains this, e.g. H100")
    out = s.add_mutually_exclusive_group()
    out.add_argument("--markdown", action="store_true", help="markdown (--all: docs/ladders.md)")
    out.add_argument("--json", action="store_true", help="the tables as JSON")
    s.add_argument("--plot", metavar="FILE.png", help="also draw a bar chart per table to this PNG")
    s.add_argument("--plot-by", choices=("peak", "time"), default="peak", help="bars: %% of peak, or ms")
    s.set_defaults(func=cmd_ladder)

    s = sub.add_parser(
        "profile", help="torch.profiler kernel table and trace of one op (--ncu: Nsight Compute)"
    )
    _op_argument(s)
    s.add_argument("--backend", "-b", action="append", help="backend(s), comma-separated or repeated")
    s.add_argument("--shape", "-s", action="append", help="e.g. 2^28, 4096x4096 (repeatable)")
    s.add_argument("--dtype", action="append", help="fp32, fp16, bf16")
    s.add_argument("--mode", action="append", help="fwd, bwd, fwdbwd (default fwd)")
    s.add_argument("--iters", type=_at_least(1), default=10, help="calls profiled per backend (default 10)")
    s.add_argument("--trace", help="write a Chrome/Perfetto trace here")
    s.add_argument("--ncu", action="store_true", help="also profile the kernels with Nsight Compute")
    s.add_argument("--ncu-target", action="store_true", help=argparse.SUPPRESS)
    s.add_argument("--json", help="write the profile (and ncu summary) as JSON")
    s.set_defaults(func=cmd_profile)

    s = sub.add_parser("demo", help="the lecture's demonstrations: gelu | mlp")
    s.add_argument("which", choices=["gelu", "mlp"],
                   help="gelu: the GeLU backends timed; mlp: a GeLU MLP profiled")  # fmt: skip
    s.add_argument("--shape", "-s", help="gelu: tensor shape (default 2^24 on a GPU)")
    s.add_argument("--dtype", default="fp32", help="gelu: fp32, fp16, bf16")
    s.add_argument("--dim", type=int, default=128, help="mlp: width of each layer")
    s.add_argument("--layers", type=int, default=16, help="mlp: number of layers")
    s.add_argument("--batch", type=_at_least(1), default=128, help="mlp: rows of the input")
    s.add_argument("--steps", type=_at_least(1), default=5, help="mlp: profiled steps")
    s.add_argument("--backend", "-b", help="mlp: GeLU backend (default: the fastest here)")
    s.add_argument("--trace-dir", help="mlp: where the two profiler traces go")
    s.add_argument("--json", help="write the result as JSON")
    s.set_defaults(func=cmd_demo)

    s = sub.add_parser("train", help="train or time models: gpt, mnist (ours), hf, nanogpt (a user's)",
                       description="kernellab train MODEL --help shows that model's options.")  # fmt: skip
    models = s.add_subparsers(dest="model", metavar="MODEL", required=True, help="gpt | mnist | hf | nanogpt")
    _train_gpt_parser(models)
    _train_mnist_parser(models)
    _train_user_parsers(models)
    for name, t in models.choices.items():
        t.formatter_class = argparse.RawDescriptionHelpFormatter
        t.epilog = "examples:\n" + "\n".join("  " + e for e in EXAMPLES["train"] if e.split()[2] == name)

    s = sub.add_parser("asm", help="PTX/SASS, registers, spills, shared memory of a backend's kernels")
    _op_argument(s)
    s.add_argument("--backend", "-b", required=True, help="a triton, cuda or numba backend of the op")
    s.add_argument("--dtype", default="fp32", help="fp32, fp16, bf16 (default fp32)")
    s.add_argument("--shape", "-s", help="Triton: the shape to compile for (default 4096)")
    s.add_argument("--arch", help="CUDA: target arch, e.g. sm_90 (default: this GPU's, or sm_90)")
    s.add_argument("--kernel", help="only kernels whose name matches this regex")
    s.add_argument("--ptx", action="store_true", help="print the PTX")
    s.add_argument("--sass", action="store_true", help="print the SASS (needs cuobjdump)")
    s.add_argument("--json", help="write everything (text included) as JSON")
    s.set_defaults(func=cmd_asm)

    s = sub.add_parser("tune", help="time every backend over a model shape family; write this GPU's default table")
    _op_argument(s)
    s.add_argument("--family", "-f", default=None, help=f"{', '.join(_family_names())} (default: all but heldout and cpu-tiny)")
    s.add_argument("--shape", "-s", action="append",
                   help="time these shapes instead of a family (your model's, e.g. 6144x1536; repeatable)")  # fmt: skip
    s.add_argument("--dtype", action="append", help="fp32, fp16, bf16 (default: the op's)")
    s.add_argument("--mode", nargs="+", default=["fwd"], help="fwd, fwdbwd (default fwd)")
    s.add_argument("--backend", "-b", action="append",
                   help="only these backends (default: ours and the peers)")  # fmt: skip
    s.add_argument("--device", default=None, help="cuda or cpu (default: cuda when present)")
    s.add_argument("--budget", type=_seconds, default=1.0, help="seconds of timing per backend and case")
    s.set_defaults(func=cmd_tune)

    s = sub.add_parser("explain", help="which backend the default picks for a shape, and why")
    _op_argument(s)
    s.add_argument("--shape", "-s", required=True, help="in the op's shape convention, e.g. 8192x768")
    s.add_argument("--dtype", default="fp32", help="fp32, fp16, bf16 (default fp32)")
    s.add_argument("--mode", default="fwd", choices=("fwd", "fwdbwd"), help="the mode the choice is for")
    s.add_argument("--opt", action="append", help="keyword option KEY=VALUE, e.g. causal=true (repeatable)")
    s.add_argument("--device", default=None, help="cuda or cpu: whose choice (default: this machine's)")
    s.add_argument("--gpu", default=None,
                   help="the choice on this GPU model's table, from any machine (e.g. 'NVIDIA H200')")  # fmt: skip
    s.set_defaults(func=cmd_explain)

    s = sub.add_parser("info", help="what this machine has (GPU, NVRTC, Triton mode)")
    s.set_defaults(func=cmd_info)
    for name, sp in sub.choices.items():
        sp.formatter_class = argparse.RawDescriptionHelpFormatter
        sp.epilog = "examples:\n" + "\n".join("  " + e for e in EXAMPLES[name])
    return p


# Each subcommand's help ends with these (tests/test_cli.py checks every one has some).
EXAMPLES = {
    "list": ["kernellab list"],
    "check": ["kernellab check                      # every op, quick", "kernellab check softmax -b triton --dtype bf16",
              "kernellab check --full --json check.json"],
    "bench": ["kernellab bench gelu -s 2^28 --dtype bf16 --mode fwd --mode fwdbwd --json out.jsonl",
              "kernellab bench add -s 2^10 --graph"],
    "peaks": ["kernellab peaks --refresh"],
    "build-nodes": ["kernellab build-nodes   # then the norms' triton and cuda_node backends launch from C++"],
    "report": ["kernellab report rows.jsonl --pivot", "kernellab report --html out/ benchmarks/results/*.jsonl"],
    "ladder": ["kernellab ladder matmul", "kernellab ladder softmax --dtype fp32 --plot softmax.png",
               "kernellab ladder --all --markdown"],
    "profile": ["kernellab profile softmax -s 4096x4096 --dtype bf16", "kernellab profile matmul -b cuda --ncu"],
    "demo": ["kernellab demo gelu", "kernellab demo mlp"],
    "train": ["kernellab train gpt --steps 200", "kernellab train mnist --backend default",
              "kernellab train hf --config llama --compare", "kernellab train nanogpt --compare",
              "kernellab train gpt --nproc 4 --dp fsdp2 --global-batch 32"],
    "asm": ["kernellab asm matmul -b cuda", "kernellab asm softmax -b triton --dtype bf16"],
    "tune": ["kernellab tune layer_norm --dtype bf16"],
    "explain": ["kernellab explain layer_norm -s 8192x768 --dtype bf16 --mode fwdbwd"],
    "info": ["kernellab info"],
}  # fmt: skip


def _msg(e: Exception) -> str:
    """An exception's message for one line: a KeyError's without the repr quotes."""
    return str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kernellab")
    except PackageNotFoundError:  # (run from a source tree that is not installed)
        return "unknown (not installed)"


def main(argv=None) -> int:
    """The command line. A user's mistake (a missing file, an unknown op, backend or
    option value) is one line on stderr and exit status 2; Ctrl-C is one line and 130;
    ``--debug`` shows the traceback instead."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):  # no command: what there is to run
        parser.print_help()
        return 0
    dev = getattr(args, "device", None)
    if isinstance(dev, str) and dev != "cpu" and not re.fullmatch(r"cuda(:\d+)?", dev):
        return _refuse(args, f"--device {dev}: give cpu or cuda")
    if isinstance(dev, str) and dev.startswith("cuda") and args.cmd != "explain":
        import torch

        if not torch.cuda.is_available():
            return _refuse(args, f"--device {dev}: no CUDA GPU here (torch.cuda.is_available() is False)")
    made: list = []
    why = _check_outputs(args, made)  # (before a long run, not after it)
    if why is not None:
        _remove_empty(made)
        return _refuse(args, why)
    _FORMAT["value"], out = args.format, console._file  # (None: whatever sys.stdout is then)
    if args.format == "json":  # the tables alone on stdout
        console.file = sys.stderr
    args._argv = list(sys.argv[1:] if argv is None else argv)  # (a data-parallel run re-runs it)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        if args.debug:
            raise
        print("kernellab: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader stopped (| head): quietly, as SIGPIPE would
        try:  # (no "Exception ignored" when Python flushes stdout at exit)
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError, AttributeError):
            pass
        return 141
    except (OSError, ValueError, KeyError, TypeError) as e:
        if args.debug:
            raise
        msg = _msg(e)
        if isinstance(e, OSError) and e.filename is not None:
            msg = f"{e.strerror}: {e.filename}"
        print(f"kernellab {args.cmd}: error: {msg} (--debug shows the traceback)", file=sys.stderr)
        return 2
    finally:
        _FORMAT["value"], console._file = "auto", out
        _remove_empty(made)


if __name__ == "__main__":
    sys.exit(main())
