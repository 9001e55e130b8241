"""The command line, end to end on small sizes (CPU here; the same commands on a GPU)."""

from __future__ import annotations

import json
import re

import pytest
import torch


def test_list_shows_every_op_and_backend_with_availability(cli_run):
    code, out = cli_run("list")
    assert code == 0
    for op in ("add", "gelu"):
        assert op in out
    for backend in ("manual", "torch", "compile", "triton", "cuda_v1"):
        assert backend in out
    if not torch.cuda.is_available():
        assert "compile only: no GPU" in out


def test_check_quick_passes_and_writes_json(cli_run, tmp_path):
    path = tmp_path / "check.json"
    code, out = cli_run(
        "check", "gelu", "-b", "torch,triton", "--dtype", "fp32", "--quick", "--json", str(path)
    )
    assert code == 0, out
    assert "2 passed, 0 failed" in out
    # not a terminal: a line per report as it lands, before the table
    assert "gelu/torch fp32: pass, worst err/bound" in out and "gelu/triton fp32: pass" in out
    assert out.index("gelu/triton fp32: pass") < out.index("kernellab check (quick)")
    rep = json.loads(path.read_text())
    assert {r["backend"] for r in rep} == {"torch", "triton"}
    assert all(r["status"] == "pass" and r["cases"] for r in rep)
    # time per report, per stage and per case
    for r in rep:
        assert r["seconds"] > 0 and {"shapes", "layouts", "grads", "bad_inputs"} <= set(r["stage_seconds"])
        # each figure is rounded to 1 ms: the sum may pass the total by half a ms per term
        assert sum(r["stage_seconds"].values()) <= r["seconds"] + 5e-4 * (len(r["stage_seconds"]) + 1)
        assert all(c["seconds"] >= 0 for c in r["cases"]) and any(c["seconds"] > 0 for c in r["cases"])


def test_check_fuzz_only_runs_the_drawn_problems_on_every_backend(cli_run, tmp_path):
    path = tmp_path / "fuzz.json"
    code, out = cli_run("check", "matmul", "-b", "torch,triton", "--dtype", "fp32", "--fuzz", "2", "--fuzz-only",
                        "--seed", "4", "--json", str(path))  # fmt: skip
    assert code == 0, out
    assert "seed 4" in out
    rep = json.loads(path.read_text())
    names = [[c["name"] for c in r["cases"]] for r in rep]
    assert all(c["kind"] == "fuzz" for r in rep for c in r["cases"])
    assert names[0] == names[1] and len(names[0]) == 4  # 2 problems: forward and gradients each


def test_check_is_quick_by_default_on_any_machine_and_full_overrides(cli_run):
    code, out = cli_run("check", "add", "-b", "torch", "--dtype", "fp32")
    assert code == 0, out
    assert out.startswith("kernellab check: quick") and "kernellab check (quick)" in out
    code, out = cli_run("check", "add", "-b", "torch", "--dtype", "fp32", "--full")
    assert code == 0, out
    assert out.startswith("kernellab check: full") and "kernellab check (full)" in out


def test_check_prints_its_plan_then_a_line_per_report_with_elapsed_and_eta(cli_run):
    code, out = cli_run("check", "add", "-b", "torch,cuda", "--dtype", "fp32,fp16", "--seed", "7", "-j", "1")
    assert code == 0, out
    lines = out.splitlines()
    plan = lines[:8]
    assert plan[0] == "kernellab check: quick (--full: every test shape) on " + (
        "cuda" if torch.cuda.is_available() else "cpu"
    ) + "; seed 7 (--seed 7 replays this run)"
    assert plan[1] == "  ops (1): add" and plan[2] == "  backends: torch, cuda" and plan[3] == "  dtypes: fp32, fp16"
    if torch.cuda.is_available():
        assert plan[4] == "  runs: 4 implementation x dtype runs"
    else:
        assert plan[4] == "  runs: 2 implementation x dtype runs, 2 CUDA builds (compiled, not run: no GPU)"
    assert plan[5].startswith("  stages: shape, rerun, special, layout,") and "opcheck" in plan[5]
    assert plan[6] == "  workers: 1"
    assert re.fullmatch(r"  estimated: ~\d+ s|  estimated: ~\d+:\d\d", plan[7]), plan[7]
    # not a terminal: one line per finished report, in the plan's order, before the table
    progress = [ln for ln in lines if ln.startswith("[")]
    assert [ln.split(":")[0] for ln in progress] == [
        "[1/4] add/torch fp32", "[2/4] add/torch fp16", "[3/4] add/cuda fp32", "[4/4] add/cuda fp16"
    ]
    for ln in progress:
        assert re.search(r"\(\d+\.\d s\).*; elapsed (\d+ s|\d+:\d\d), ~(\d+ s|\d+:\d\d) left$", ln), ln
    assert progress[-1].endswith("~0 s left")
    assert out.index(progress[-1]) < out.index("kernellab check (quick)")


def test_check_with_two_workers_reports_every_run_and_tabulates_in_plan_order(cli_run):
    code, out = cli_run("check", "relu", "-b", "manual,torch", "--dtype", "fp32,bf16", "--seed", "7", "-j", "2")
    assert code == 0, out
    assert "  workers: 2 (-j N to change)" in out.splitlines()
    progress = sorted(ln.split(":")[0].split("] ")[1] for ln in out.splitlines() if ln.startswith("["))
    assert progress == ["relu/manual bf16", "relu/manual fp32", "relu/torch bf16", "relu/torch fp32"]
    table = out[out.index("kernellab check (quick)"):]
    rows = [ln for ln in table.splitlines() if "relu" in ln]
    assert [(r.split()[3], r.split()[5]) for r in rows] == [
        ("manual", "fp32"), ("manual", "bf16"), ("torch", "fp32"), ("torch", "bf16")
    ], rows


@pytest.mark.parametrize(
    "argv, message",
    [
        (("nope",), "unknown op 'nope'"),
        (("add", "-j", "0"), "--jobs must be >= 1"),
        (("add", "-b", "torch,nope"), "unknown backend 'nope'"),
        (("add", "--dtype", "fp64"), "dtype 'fp64' not understood"),
        (("add", "--fuzz", "-1"), "--fuzz must be >= 0"),
        (("add", "-b", "sdpa_flash"), "nothing to check"),  # a backend of another op
    ],
)
def test_check_usage_errors_exit_2_before_checking_anything(cli_run, argv, message):
    code, out = cli_run("check", *argv)
    assert code == 2 and message in out, out
    assert "kernellab check:" not in out  # no plan: nothing ran


def test_check_exit_status_contract(cli_run, planted):
    """0: every kernellab implementation passed; 1: one failed; 2: a usage error (the
    parser's own errors included)."""
    assert cli_run("check", "add", "-b", "torch", "--dtype", "fp32")[0] == 0
    planted("add", "cli_wrong_add", lambda a, b: a - b)
    assert cli_run("check", "add", "-b", "cli_wrong_add", "--dtype", "fp32")[0] == 1
    with pytest.raises(SystemExit) as e:
        cli_run("check", "add", "--no-such-flag")
    assert e.value.code == 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU report of CUDA backends")
def test_check_reports_cuda_as_compiled_not_run(cli_run):
    code, out = cli_run("check", "add", "-b", "cuda", "--dtype", "bf16", "--quick")
    assert code == 0, out
    assert "compiled, not run" in out and "1 compiled (not run)" in out


def test_check_fails_on_a_wrong_backend(cli_run, planted):
    planted("gelu", "cli_wrong", lambda x: torch.zeros_like(x))
    code, out = cli_run("check", "gelu", "-b", "cli_wrong", "--dtype", "fp32", "--quick")
    assert code == 1
    assert "0 passed, 1 failed" in out


def test_check_unknown_op_is_a_clear_error(cli_run):
    code, out = cli_run("check", "nope")
    assert code == 2 and "unknown op 'nope'" in out


def test_bench_table_json_plot_and_report(cli_run, tmp_path):
    js, png = tmp_path / "r.jsonl", tmp_path / "p.png"
    code, out = cli_run(
        "bench",
        "gelu",
        "-b",
        "torch,triton,manual",
        "-s",
        "2^10",
        "-s",
        "3000",
        "--dtype",
        "fp32",
        "--mode",
        "fwd,fwdbwd",
        "--budget",
        "0.05",
        "--json",
        str(js),
        "--plot",
        str(png),
    )
    assert code == 0, out
    assert "12 rows appended" in out
    assert png.exists() and png.stat().st_size > 10_000
    rows = [json.loads(line) for line in js.read_text().splitlines()]
    assert {r["mode"] for r in rows} == {"fwd", "fwdbwd"} and {r["shape"] for r in rows} == {"1024", "3000"}
    code, out = cli_run("report", str(js))
    assert code == 0 and out.count("| gelu |") == 12
    code, out = cli_run("report", str(js), "--op", "gelu")
    assert code == 0 and out.count("| gelu |") == 12
    code, out = cli_run("report", str(js), "-s", "3000")  # (the markdown table ignored --shape)
    assert code == 0 and out.count("| gelu | 3000 |") == 6 and "| 1024 |" not in out, out


@pytest.mark.parametrize(
    "extra, needle",
    [
        (("--op", "nope"), "--op nope: unknown op; the files' ops: gelu"),
        (("--op", "softmax"), "--op softmax: no rows of that op in {}; the files' ops: gelu"),
        (("--op", "gelu", "--html", "{dir}"), "--op: the markdown table's options; --html makes the page"),
        (("--shape", "4096"), "--shape 4096: no rows of that shape (as the rows write it); theirs: 1024"),
    ],
)
def test_report_refuses_an_op_its_files_do_not_hold(capsys, tmp_path, extra, needle):
    # an op the files do not hold (a typo) printed an empty table and exit 0
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"op": "gelu", "backend": "torch", "shape": "1024"}) + "\n")
    argv = ["report", str(rows), *(a.replace("{dir}", str(tmp_path / "page")) for a in extra)]
    code, text = _refused(capsys, argv)
    assert code == 2 and needle.format(rows) in text and "Traceback" not in text, text
    assert not (tmp_path / "page").exists()


def test_bench_rejected_backend_sets_exit_code(cli_run, planted):
    planted("gelu", "cli_zero", lambda x: torch.zeros_like(x))
    code, out = cli_run(
        "bench", "gelu", "-b", "torch,cli_zero", "-s", "1024", "--dtype", "fp32", "--budget", "0.05"
    )
    assert code == 1
    assert "REJECTED" in out


@pytest.mark.parametrize(
    "argv, msg",
    [
        (["bench", "gelu", "-s", "12q"], "shape '12q' not understood"),
        (["bench", "gelu", "--dtype", "fp8"], "dtype 'fp8' not understood"),
        (["bench", "nope"], "unknown op"),
        (["bench", "add", "--mode", "bwd", "-b", "torch"], "mode 'bwd' not available"),
    ],
)
def test_bench_bad_arguments(cli_run, argv, msg):
    code, out = cli_run(*argv)
    assert code == 2
    assert msg in out.replace("\n", " ")


@pytest.mark.parametrize(
    "argv, needle",
    [
        # more memory than the machine has: refused before anything is allocated
        (("bench", "gelu", "-s", "10^12", "-b", "torch"),
         "-s/--shape 10^12: too large: its inputs and outputs"),
        (("profile", "gelu", "-s", "10^12", "-b", "torch"), "-s/--shape 10^12: too large"),
        (("tune", "gelu", "-s", "10^12", "-b", "torch", "--device", "cpu"), "-s/--shape 10^12: too large"),
        (("demo", "gelu", "-s", "2^40"), "-s/--shape 2^40: too large"),
        # a power too large to compute is refused unevaluated
        (("bench", "gelu", "-s", "2^100000000"), "dimension 2^100000000 is larger than 2^63 - 1"),
        (("bench", "gelu", "-s", "1<<100000000"), "dimension 1<<100000000 is larger than 2^63 - 1"),
        (("bench", "gelu", "-s", "-4"), "-s/--shape -4: shape '-4': dimension -4 is negative"),
        # an empty problem: nothing to time (the check runs the ops on empty inputs)
        (("bench", "softmax", "-s", "8x0"),
         "-s/--shape 8x0: dim 2 is 0: an empty problem has nothing to time"),
        (("bench", "max", "-s", "0x8"), "-s/--shape 0x8: dim 1 is 0"),
        (("profile", "gelu", "-s", "0"), "-s/--shape 0: dim 1 is 0"),
        # a problem the op's inputs or PyTorch's op refuse: named, not a traceback
        (("bench", "max_pool2d", "-s", "1x1x1x1", "-b", "torch", "--dtype", "fp32"),
         "max_pool2d 1x1x1x1 fp32 fwd: its inputs or reference cannot be made: RuntimeError"),
        (("bench", "rope", "-s", "1x4x2x8x8x7"), "R = 7 must be even and at most D = 8"),
    ],
)  # fmt: skip
def test_bench_refuses_shapes_it_cannot_run_before_running(capsys, tables, argv, needle):
    code, text = _refused(capsys, argv)
    assert code == 2 and needle in text and "Traceback" not in text, text
    assert "median ms" not in text  # no table: nothing was timed


@pytest.mark.parametrize(
    "argv, needle",
    [
        (("explain", "matmul", "-s", "16"),
         "-s/--shape 16: 16 has 1 dim; matmul takes 3 or 4 dims, (M, N, K) or (Bt, M, N, K) "
         "(e.g. 4096x4096x4096)"),
        (("explain", "conv2d", "-s", "4x4"), "conv2d takes 7 dims, (N, C, H, W, K, R, S)"),
        (("explain", "attention", "-s", "2x16"), "attention takes 3 to 6 dims"),
        (("explain", "attention", "-s", "1x3x2x8x8x16"), "H_q = 3 must be a multiple of H_kv = 2"),
        (("explain", "max_pool2d", "-s", "64x28x28"), "max_pool2d takes 4 dims, (N, C, H, W)"),
        (("bench", "matmul", "-s", "16"), "-s/--shape 16: 16 has 1 dim; matmul takes 3 or 4 dims"),
        (("profile", "cross_entropy", "-s", "8"), "cross_entropy takes 2 dims, (N, V)"),
        (("tune", "matmul", "-s", "16", "--device", "cpu"), "matmul takes 3 or 4 dims"),
        (("asm", "matmul", "-b", "triton", "-s", "16"), "matmul takes 3 or 4 dims"),
    ],
)  # fmt: skip
def test_a_shape_of_the_wrong_rank_for_the_op_is_refused(capsys, tables, argv, needle):
    # explain answered for any number of dims (matmul -s 16 read as a 16 x ? x ? problem)
    code, text = _refused(capsys, argv)
    assert code == 2 and needle in text and "Traceback" not in text, text


def test_explain_takes_every_rank_the_op_does(capsys, tables):
    for argv in (("explain", "attention", "-s", "2x16x64"), ("explain", "softmax", "-s", "2x3x4x5"),
                 ("explain", "softmax", "-s", "0x16"), ("explain", "transpose", "-s", "2x3x4")):  # fmt: skip
        code, text = _refused(capsys, argv)
        assert code == 0 and "why:" in text, (argv, text)


@pytest.mark.parametrize(
    "argv, needle",
    [
        (("bench", "gelu", "-s", "1024", "--opt", "foo=1"),
         "--opt foo: not an option of gelu; its options: none"),
        (("bench", "attention", "-s", "1x2x64x32", "--opt", "casual=true"),
         "--opt casual: not an option of attention; its options: causal, scale, softcap, window"),
        (("explain", "attention", "-s", "1x2x64x32", "--opt", "causal=true,casual=true"),
         "--opt casual: not an option of attention"),
        (("explain", "matmul", "-s", "64x64x64", "--opt", "bt=true"),
         "--opt bt: not an option of matmul; its options: activation, b_t, bias"),
    ],
)  # fmt: skip
def test_unknown_opt_keys_are_refused_naming_the_known_ones(capsys, tables, argv, needle):
    # explain ignored an unknown key (casual=true answered for causal=False); bench failed
    # inside the reference with "unexpected keyword argument"
    code, text = _refused(capsys, argv)
    assert code == 2 and needle in text and "Traceback" not in text, text


def test_known_opt_keys_still_pass(capsys, tables):
    code, text = _refused(capsys, ("explain", "matmul", "-s", "64x64x64", "--opt", "b_t=true"))
    assert code == 0 and "b_t=True" in text, text


def test_output_paths_are_checked_before_the_run(cli_run, capsys, tmp_path):
    # a --json under a file, or a folder given for a file, failed only after the run
    afile = tmp_path / "a.txt"
    afile.write_text("")
    for argv, needle in (
        (("bench", "gelu", "-s", "1024", "-b", "torch", "--json", str(afile / "rows.jsonl")),
         f"--json {afile / 'rows.jsonl'}: {afile} is a file, not a folder"),
        (("bench", "gelu", "-s", "1024", "-b", "torch", "--plot", str(tmp_path)),
         f"--plot {tmp_path}: is a folder"),
        (("check", "add", "-b", "torch", "--json", str(tmp_path)),
         f"--json {tmp_path}: is a folder; give a file"),
        (("report", str(afile), "--html", str(afile)), f"--html {afile}: is a file; give a folder"),
        (("train", "gpt", "--compare", "--out", str(afile / "x.jsonl")), "--out"),
    ):  # fmt: skip
        code, text = _refused(capsys, argv)
        assert code == 2 and needle in text and "Traceback" not in text, text
        assert "median ms" not in text and "estimated: ~" not in text  # nothing ran (no table, no plan)
    # a folder that does not exist yet is made: the file lands there after the run
    path = tmp_path / "new" / "dir" / "check.json"
    code, out = cli_run("check", "add", "-b", "torch", "--dtype", "fp32", "--json", str(path))
    assert code == 0 and json.loads(path.read_text())[0]["op"] == "add", out


def test_peaks_and_info(cli_run):
    code, out = cli_run("info")
    assert code == 0 and "nvrtc" in out
    assert '"config"' in out and '"attn_autotune"' in out and '"check_targets"' in out
    assert '"cpp_nodes": "in use"' in out or '"cpp_nodes": "not in use: ' in out
    if not torch.cuda.is_available():
        code, out = cli_run("peaks")
        assert code == 1 and "needs a CUDA GPU" in out


def test_check_exit_status_is_about_kernellab_baselines_have_their_own_section(cli_run, planted):
    """A wrong *baseline* (a built-in that is not one of kernellab's kernels, like torch or
    compile) is reported in its own section and does not fail the check; --strict fails
    on it. A wrong user registration fails the check (test above)."""
    planted("gelu", "pl_baseline", lambda x: torch.zeros_like(x), builtin=True)
    code, out = cli_run("check", "gelu", "-b", "pl_baseline,torch", "--dtype", "fp32", "--quick")
    assert code == 0, out
    assert "Baselines and peers beyond the rule" in out and "gelu/pl_baseline" in out
    assert "every kernellab implementation passed" in out
    code, out = cli_run("check", "gelu", "-b", "pl_baseline", "--dtype", "fp32", "--quick", "--strict")
    assert code == 1, out


def test_no_command_prints_help(cli_run):
    code, out = cli_run()
    assert code == 0 and "usage: kernellab" in out and "check" in out


def test_version(cli_run):
    with pytest.raises(SystemExit) as e:
        cli_run("--version")
    assert e.value.code == 0


@pytest.mark.parametrize(
    "argv,needle",
    [
        (("report", "no/such/file.jsonl"), "No such file or directory: no/such/file.jsonl"),
        (("bench", "gelu", "-b", "trtion"), "its backends:"),
        (("train", "gpt", "--config", "small", "--steps", "1"), "config"),
    ],
)
def test_user_mistakes_are_one_line_and_exit_2(capsys, argv, needle):
    from kernellab import cli

    code = cli.main(list(argv))
    cap = capsys.readouterr()
    text = cap.out + cap.err
    assert code == 2 and needle in text and "Traceback" not in text


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_device_cuda_without_a_gpu_is_refused(capsys):
    from kernellab import cli

    assert cli.main(["tune", "gelu", "--device", "cuda"]) == 2
    assert "no CUDA GPU here" in capsys.readouterr().err


def test_debug_shows_the_traceback(cli_run):
    with pytest.raises(FileNotFoundError):
        cli_run("--debug", "report", "no/such/file.jsonl")


def test_keyboard_interrupt_is_one_line(capsys, monkeypatch):
    from kernellab import cli

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "cmd_list", interrupted)
    assert cli.main(["list"]) == 130
    assert "interrupted" in capsys.readouterr().err


def test_tables_are_not_cut_when_piped():
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    out = subprocess.run([sys.executable, "-m", "kernellab.cli", "list"], capture_output=True, text=True,
                         env=env, timeout=300).stdout  # fmt: skip
    assert "Upcast, add, round back: three kernels for fp16/bf16 (one for fp32)." in out


def test_every_option_has_help():
    import argparse

    from kernellab.cli import build_parser

    parser = build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    missing = [f"{name} {a.dest}" for name, sub in subs.choices.items() for a in sub._actions
               if not isinstance(a, argparse._HelpAction) and not a.help]  # fmt: skip
    assert not missing, missing


def test_every_subcommand_help_has_examples_that_parse():
    """Each subcommand's help ends with examples, and each example parses (its options exist)."""
    import argparse
    import shlex

    from kernellab.cli import EXAMPLES, build_parser

    parser = build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(EXAMPLES) == set(subs.choices)
    for name, sub in subs.choices.items():
        assert "examples:\n  kernellab " + name in sub.format_help(), name
        for example in EXAMPLES[name]:
            parser.parse_args(shlex.split(example.split("#")[0])[1:])  # SystemExit on a bad option


def test_tables_as_markdown_when_piped_and_as_json(capsys):
    """Not a terminal: tables print as markdown, one line per row (never cut); --format
    json prints the tables alone on stdout as {column: value} rows, the rest on stderr."""
    import json

    from kernellab import cli

    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    assert "| op | backend | here | what |" in out and "|---|---|---|---|" in out
    assert "| add | torch | yes |" in out
    assert cli.main(["--format", "json", "list"]) == 0
    captured = capsys.readouterr()
    rows = json.loads(captured.out)
    assert {"op": "add", "backend": "torch"}.items() <= rows[1].items() or any(
        r["op"] == "add" and r["backend"] == "torch" for r in rows
    )
    assert set(rows[0]) == {"op", "backend", "here", "what"}
    assert "device:" in captured.err  # the line before the table
    assert cli.main(["--format", "md", "list"]) == 0 and "| op | backend |" in capsys.readouterr().out


def test_train_help_lists_only_its_models_options():
    """`train MODEL --help` shows that model's options alone (gpt's --matmul is not mnist's)."""
    import argparse

    from kernellab.cli import MNIST_VARIANTS, build_parser
    from kernellab.models.mnist import COMPARE

    assert tuple(MNIST_VARIANTS) == tuple(COMPARE)
    parser = build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    train = subs.choices["train"]
    models = next(a for a in train._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert set(models) == {"gpt", "mnist", "hf", "nanogpt"}
    opts = {name: {o for a in p._actions for o in a.option_strings} for name, p in models.items()}
    assert "--matmul" in opts["gpt"] and "--matmul" not in opts["mnist"]
    assert "--epochs" in opts["mnist"] and "--epochs" not in opts["gpt"]
    assert "--config" in opts["hf"] and "--config" not in opts["nanogpt"]
    for name, p in models.items():
        assert "examples:\n  kernellab train " + name in p.format_help(), name
        missing = [a.dest for a in p._actions if not isinstance(a, argparse._HelpAction) and not a.help]
        assert not missing, (name, missing)


def test_op_arguments_list_the_valid_ops():
    import argparse

    from kernellab.cli import build_parser
    from kernellab.core import registry

    parser = build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name in ("check", "bench", "profile", "asm", "tune", "explain"):
        text = " ".join(subs.choices[name].format_help().split())  # (help lines wrap)
        assert ", ".join(registry.op_names()) in text, name


def _refused(capsys, argv) -> tuple[int, str]:
    """Run the CLI on ``argv``; (exit code, everything printed, its runs of whitespace as
    one space: the console wraps long lines at its width, 80 columns on a CI runner). A
    parser refusal's SystemExit becomes its code."""
    from kernellab import cli

    try:
        code = cli.main(list(argv))
    except SystemExit as e:
        code = e.code
    cap = capsys.readouterr()
    return code, " ".join((cap.out + cap.err).split())


@pytest.mark.parametrize(
    "argv, needle",
    [
        (("bench", "add", "--budget", "nan"), "argument --budget: must be a finite number of seconds > 0"),
        (("bench", "add", "--budget", "-1"), "argument --budget: must be a finite"),
        (("tune", "add", "--budget", "0"), "argument --budget: must be a finite"),
        (("profile", "add", "--iters", "0"), "argument --iters: must be >= 1, got 0"),
        (("demo", "mlp", "--steps", "0"), "argument --steps: must be >= 1, got 0"),
        (("demo", "mlp", "--batch", "0"), "argument --batch: must be >= 1, got 0"),
        (("train", "gpt", "--batch-size", "0"), "argument --batch-size: must be >= 1, got 0"),
        (("train", "gpt", "--seq-len", "0"), "argument --seq-len: must be >= 1, got 0"),
        (("train", "mnist", "--batch-size", "0"), "argument --batch-size: must be >= 1, got 0"),
        (("train", "mnist", "--compare", "--steps-timed", "0"), "argument --steps-timed: must be >= 1"),
        (("train", "mnist", "--compare", "--warmup", "-1"), "argument --warmup: must be >= 0"),
        (("train", "mnist", "--compare", "--batch-sizes", "a,b"), "argument --batch-sizes: 'a,b' is not"),
        (("train", "mnist", "--compare", "--batch-sizes", "64,0"), "argument --batch-sizes: each size must"),
        (("train", "hf", "--compare", "--batch-size", "0"), "argument --batch-size: must be >= 1"),
        (("train", "nanogpt", "--compare", "--seq-len", "0"), "argument --seq-len: must be >= 1"),
        # a negative seed: Python's random reads -1 as 1 (the fuzz problems of another seed)
        (("check", "add", "--seed", "-1"),
         "argument --seed: a seed is an integer from 0 to 2^64 - 1, got -1"),
        (("check", "add", "--seed", str(2**64)), "argument --seed: a seed is an integer from 0 to 2^64 - 1"),
        (("train", "mnist", "--seed", "-1"), "argument --seed: a seed is an integer from 0 to 2^64 - 1"),
    ],
)
def test_counts_and_budgets_out_of_range_are_refused_by_the_parser(capsys, argv, needle):
    # a zero batch or length is not "the default"; zero iterations or steps, a NaN or
    # negative budget are refused before anything runs
    code, text = _refused(capsys, argv)
    assert code == 2 and needle in text and "Traceback" not in text, text


@pytest.mark.parametrize(
    "argv, needle",
    [
        (("bench", "add", "-s", ""), "--shape: no value in ''"),
        (("bench", "add", "-b", ","), "--backend: no value in ','"),
        (("bench", "add", "--opt", ","), "--opt: no value in ','"),
        (("check", "add", "--dtype", ","), "--dtype: no value in ','"),
        (("check", "add", "-b", ""), "--backend: no value in ''"),
        (("profile", "add", "-s", ""), "--shape: no value in ''"),
    ],
)
def test_an_option_given_only_empty_values_is_refused(capsys, argv, needle):
    # an empty value (an unset shell variable, say) does not mean "every one"
    code, text = _refused(capsys, argv)
    assert code == 2 and needle in text and "Traceback" not in text, text


@pytest.mark.parametrize(
    "argv",
    [("tune", "add", "-s", "16", "--device", "nope"), ("train", "mnist", "--device", "nope"),
     ("explain", "add", "-s", "16", "--device", "nope")],
)  # fmt: skip
def test_an_unknown_device_is_refused(capsys, tables, argv):
    code, text = _refused(capsys, argv)
    assert code == 2 and "--device nope: give cpu or cuda" in text and "Traceback" not in text, text


def test_tune_refuses_a_mode_the_op_does_not_have(capsys, tables):
    code, text = _refused(capsys, ("tune", "add", "-s", "16", "--budget", "0.01", "--mode", "nope"))
    assert code == 2 and "--mode nope: not a mode of add; its modes: fwd" in text, text
    assert not list(tables.iterdir())  # no table written


def test_asm_refuses_a_kernel_pattern_that_is_not_a_regex(cli_run):
    code, out = cli_run("asm", "add", "-b", "cuda", "--kernel", "(")
    assert code == 2 and "--kernel '(': not a regular expression" in out, out
