"""What README.md, docs/guide.md and docs/design.md promise, each test naming the doc line it
guards ("A documented behaviour is a contract: keep a test on it"). Only promises no other
test file pins down live here; CPU only, tiny shapes.

When a doc line moves, update the line number in the comment; when a promise changes, the
doc and its test change together."""

from __future__ import annotations

import argparse
import importlib
import inspect
import itertools
import json
import math
import os
import shlex

import pytest
import torch

import kernellab

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ("README.md", "docs/guide.md", "docs/design.md")
EMPTY = inspect.Parameter.empty


# ----------------------------------------------------------------------------- the CLI's examples


def _expand(tokens: list[str]) -> list[list[str]]:
    """A doc's command line with its meta syntax spelled out: ``[--opt]`` is the option,
    ``a|b|c`` each alternative in turn."""
    choices = [t.strip("[]").split("|") if "|" in t else [t.strip("[]")] for t in tokens]
    return [list(c) for c in itertools.product(*choices)]


def _code_block_commands():
    """Every ``kernellab ...`` line of a fenced code block in the docs: (where, argv)."""
    found = []
    for doc in DOCS:
        inside = False
        with open(os.path.join(ROOT, doc), encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if line.startswith("```"):
                    inside = not inside
                    continue
                text = line.split("#")[0].split(" > ")[0].strip()  # (a comment, a shell redirect)
                if inside and text.startswith("kernellab "):
                    for argv in _expand(shlex.split(text)[1:]):
                        found.append((f"{doc}:{n}", argv))
    return found


CODE_BLOCK_COMMANDS = _code_block_commands()

# Commands the docs give in running text (backticks) or in a code block's comment.
INLINE_COMMANDS = [
    ("README.md:27", "train hf --config llama --compare"),
    ("README.md:287", "train nanogpt --compare"),
    ("README.md:292", "--format md list"),
    ("README.md:292", "--format json list"),
    (
        "docs/guide.md:25",
        "train gpt --config tiny --data FILE --backend default --matmul pytorch "
        "--optimizer torch --mode compile-cudagraphs",
    ),  # fmt: skip
    ("docs/guide.md:30", "train gpt --nproc 2 --dp fsdp2 --global-batch 8"),
    ("docs/guide.md:39", "train mnist --compare --batch-sizes 64,256,1024 --out rows.jsonl --profile"),
    ("docs/guide.md:72", "train mnist --data DIR --device cpu --epochs 2 --seed 0"),
    ("docs/guide.md:120", "train hf --config phi --compare"),
    ("docs/guide.md:489", "check gelu --fuzz 3 --fuzz-only --seed 5"),
    ("docs/guide.md:348", "check gelu --strict"),
    ("docs/guide.md:517", "check attention -b triton"),
    ("docs/guide.md:852", "ladder conv2d --markdown --gpu H100 --results DIR"),
    ("docs/guide.md:862", "ladder softmax --plot p.png --plot-by time"),
    ("README.md:317", "train gpt --dp fsdp2-model --nproc 2"),
]


def test_the_docs_code_blocks_hold_kernellab_commands():
    # (the parse test below must not pass on an empty list)
    assert len(CODE_BLOCK_COMMANDS) >= 40, len(CODE_BLOCK_COMMANDS)
    assert {w.split(":")[0] for w, _ in CODE_BLOCK_COMMANDS} >= {"README.md", "docs/guide.md"}


@pytest.mark.parametrize(
    "where, argv",
    CODE_BLOCK_COMMANDS + [(w, shlex.split(c)) for w, c in INLINE_COMMANDS],
    ids=lambda v: v if isinstance(v, str) else " ".join(v)[:60],
)
def test_every_documented_cli_command_parses(where, argv):
    """Every `kernellab ...` example in README.md / docs/*.md: its subcommand and each of its
    options exist (argparse exits 2 on an unknown one)."""
    from kernellab.cli import build_parser

    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:
        pytest.fail(f"{where}: `kernellab {' '.join(argv)}` does not parse (exit {e.code})")
    assert getattr(args, "func", None) or argv[-1] == "--help", where


class _Parsed(Exception):
    pass


# `python -m kernellab....` lines in the docs: (doc line, module, argv)
MODULE_COMMANDS = [
    ("README.md:95", "kernellab.models.user_models",
     "--model hf-llama --task decode --batch 8 --seq 512 --new-tokens 64"),
    ("README.md:97-104", "kernellab.models.user_models",
     "--model hf-llama --task decode --modes compile --isolate --profile 1"),
    ("README.md:209", "kernellab.harness.vendor_gap", "--out DIR"),
    ("README.md:248", "kernellab.harness.vendor_gap", "--ops attention --only 1x32x2048x80 --out DIR"),
    ("README.md:249", "kernellab.harness.vendor_gap", "--summarize DIR"),
    ("README.md:251", "kernellab.harness.vendor_gap", "--table"),
    ("README.md:264", "kernellab.harness.vendor_gap", "--table --floor F.jsonl"),
    ("docs/guide.md:739", "kernellab.harness.vendor_gap", "--table 'NVIDIA H200' --floor F.jsonl"),
    ("README.md:258", "kernellab.harness.choice_cv", ""),
    ("docs/guide.md:743", "kernellab.harness.choice_cv", "--gpu 'NVIDIA H200' --by loop"),
    ("README.md:263", "kernellab.harness.floor", "--table 'NVIDIA H200'"),
    ("docs/guide.md:733", "kernellab.harness.floor",
     "--table 'NVIDIA H200' --ops layer_norm --all --out F.jsonl"),
    ("docs/guide.md:740", "kernellab.harness.floor", "--summarize F.jsonl"),
    ("docs/guide.md:571", "kernellab.harness.tune_all", "--out DIR"),
    ("docs/guide.md:584,678", "kernellab.harness.tune_all", "--out DIR --phases verify --paired-rounds 11"),
    ("docs/guide.md:592", "kernellab.harness.tune_all",
     "--out B --ops all --phases tune --limit-s 540 --resume A/tune.jsonl"),
    ("docs/guide.md:668", "kernellab.harness.rebuild_table", "rows.jsonl --verify V.jsonl"),
    ("docs/guide.md:701", "kernellab.harness.rebuild_table", "rows.jsonl --rows-from-verify V.jsonl"),
    ("docs/guide.md:536", "kernellab.harness.check_seeds", "--seeds 20"),
    ("docs/guide.md:161", "kernellab.harness.check_seeds", "--ops conv2d --backends triton --dtypes fp32"),
    ("docs/guide.md:767", "kernellab.harness.host_cost", ""),
    ("docs/guide.md:332", "kernellab.distributed.ring_bench", "--blocks triton,cudnn"),
]  # fmt: skip


@pytest.mark.parametrize("where, module, line", MODULE_COMMANDS, ids=lambda v: v if "." not in v else v[10:])
def test_documented_module_command_lines_parse(where, module, line, monkeypatch):
    """The documented `python -m kernellab.<module> ...` lines parse; the module stops
    right after parsing (nothing runs)."""
    parse = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        raise _Parsed(parse(self, args, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    mod = importlib.import_module(module)
    entry = mod.parse_args if module.endswith("ring_bench") else mod.main
    try:
        entry(shlex.split(line))
    except _Parsed:
        return
    except SystemExit as e:
        pytest.fail(f"{where}: `python -m {module} {line}` does not parse (exit {e.code})")
    pytest.fail(f"{module}: no argparse parse happened")


def test_train_option_values_are_the_documented_ones():
    # docs/guide.md:120: `kernellab train hf --config gpt2|llama|qwen2|mistral|gemma2|phi --compare`
    # docs/guide.md:28: `--optimizer` the AdamW (`pytorch`, or kernellab's `triton` / `torch`)
    from kernellab.cli import HF_CONFIGS, build_parser

    assert set(HF_CONFIGS) == {"gpt2", "llama", "qwen2", "mistral", "gemma2", "phi"}
    parser = build_parser()
    for opt in ("pytorch", "triton", "torch"):
        assert parser.parse_args(["train", "gpt", "--optimizer", opt]).optimizer == opt
    with pytest.raises(SystemExit):
        parser.parse_args(["train", "gpt", "--optimizer", "sgd"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_train_device_cuda_without_a_gpu_is_one_line_and_exit_2(capsys):
    # README.md:292-293: "A mistake (..., `--device cuda` without a GPU) is one line and exit
    # status 2." (tune's is tested in test_cli.py; here train mnist's --device)
    from kernellab import cli

    assert cli.main(["train", "mnist", "--device", "cuda", "--epochs", "1"]) == 2
    err = capsys.readouterr().err
    assert "no CUDA GPU here" in err and err.strip().count("\n") == 0 and "Traceback" not in err


def test_explain_reads_a_committed_table_of_a_gpu_not_here(cli_run):
    # README.md:280: `kernellab explain softmax -s 3000x7000 --gpu "NVIDIA H200"   # the same on
    # a GPU you don't have`; docs/guide.md:570 (the same command)
    code, out = cli_run("explain", "softmax", "-s", "3000x7000", "--gpu", "NVIDIA H200")
    assert code == 0, out
    assert "NVIDIA H200" in out and "NVIDIA_H200.json" in out
    # README.md:279: `kernellab explain layer_norm -s 8192x768 --dtype bf16`: what backend=None
    # runs here, and why
    code, out = cli_run("explain", "layer_norm", "-s", "8192x768", "--dtype", "bf16")
    assert code == 0 and "why:" in out and "bf16" in out, out


# ----------------------------------------------------------------------------- signatures


def _params(fn):
    ps = list(inspect.signature(fn).parameters.values())
    pos = [(p.name, p.default) for p in ps if p.kind is p.POSITIONAL_OR_KEYWORD]
    kw = {p.name: p.default for p in ps if p.kind is p.KEYWORD_ONLY}
    return pos, kw


# The ops tables (README.md:180-198, docs/guide.md:124-146): op -> (defaults of the positional
# arguments in order, EMPTY where required; keyword-only arguments and defaults the docs name).
DOCUMENTED_SIGNATURES = {
    "add": ([EMPTY, EMPTY], {}),  # add(a, b)
    "gelu": ([EMPTY], {}),  # gelu(x)
    "relu": ([EMPTY], {}),
    "softmax": ([EMPTY, -1], {}),  # softmax(x, dim=-1)
    "layer_norm": ([EMPTY, EMPTY, None, 1e-5], {}),  # layer_norm(x, w, b=None, eps=1e-5)
    "rms_norm": ([EMPTY, EMPTY, 1e-6], {}),  # rms_norm(x, w, eps=1e-6)
    "add_rms_norm": ([EMPTY, EMPTY, EMPTY, 1e-6], {}),  # add_rms_norm(x, residual, w, eps=1e-6)
    "cross_entropy": ([EMPTY, EMPTY, -100, "mean"], {"inplace_backward": False}),
    # linear_cross_entropy(x, weight, target, bias=None, *, ignore_index=-100, reduction="mean",
    #                      label_smoothing=0.0, z_loss=0.0, chunk=None)
    "linear_cross_entropy": ([EMPTY, EMPTY, EMPTY, None],
                             {"ignore_index": -100, "reduction": "mean", "label_smoothing": 0.0,
                              "z_loss": 0.0, "chunk": None}),
    "swiglu": ([EMPTY, EMPTY], {"inplace_backward": False}),  # swiglu(a, b); inplace_backward=True
    "geglu": ([EMPTY, EMPTY, "none"], {"inplace_backward": False}),  # geglu(a, b, approximate="none")
    # rope(q, k, cos, sin, position_ids=None, *, layout="neox"|"interleaved", inplace=False)
    "rope": ([EMPTY, EMPTY, EMPTY, EMPTY, None], {"layout": "neox", "inplace": False}),
    "sum": ([EMPTY, None], {}),  # sum(x, dim=None)
    "max": ([EMPTY, -1], {}),  # max(x, dim=-1)
    "argmax": ([EMPTY, -1], {}),
    "transpose": ([EMPTY], {}),
    "histogram": ([EMPTY, EMPTY], {}),  # histogram(x, bins)
    "int8_weight_only_matmul": ([EMPTY, EMPTY, EMPTY, None], {}),  # (x, w_q, scales, bias=None)
    "int4_weight_only_matmul": ([EMPTY, EMPTY, EMPTY, None], {}),
    "matmul": ([EMPTY, EMPTY, None, None], {}),  # matmul(a, b, bias=None, activation=None)
    # attention(q, k, v, causal=False, scale=None) (GQA, windows, softcap)
    "attention": ([EMPTY, EMPTY, EMPTY, False, None], {"window": None, "softcap": None}),
    "conv2d": ([EMPTY, EMPTY, None, 1, 0], {}),  # conv2d(x, w, bias=None, stride=1, padding=0)
    "max_pool2d": ([EMPTY, 2, None], {}),  # max_pool2d(x, kernel_size=2, stride=None)
    "batch_norm2d": ([EMPTY, EMPTY, EMPTY, 1e-5, False], {}),  # batch_norm2d(x, w, b, eps=1e-5, relu=False)
    "bn_relu_pool2d": ([EMPTY, EMPTY, EMPTY, 1e-5], {}),  # bn_relu_pool2d(x, w, b, eps=1e-5)
    "sgd_step": ([EMPTY, EMPTY, EMPTY], {}),  # kernellab.sgd_step(params, grads, lr)
}  # fmt: skip


@pytest.mark.parametrize("op", sorted(DOCUMENTED_SIGNATURES))
def test_public_functions_have_the_documented_signatures(op):
    """The positional arguments and defaults of the ops tables, the keyword-only options they
    name, and `backend=None` (README.md:159: "backend=None: kernellab's choice") on every op."""
    pos_defaults, kw_doc = DOCUMENTED_SIGNATURES[op]
    pos, kw = _params(getattr(kernellab, op))
    assert [d for _, d in pos] == pos_defaults, pos
    for name, default in kw_doc.items():
        assert name in kw and kw[name] == default, (name, kw)
    assert kw.get("backend", "missing") is None, kw


def test_quantize_weight_and_adamw_and_ring_attention_signatures():
    # README.md:193: `w_q, s = quantize_weight(w, bits=8)`; docs/guide.md:139 (int4: `bits=4`)
    assert _params(kernellab.quantize_weight)[0] == [("w", EMPTY), ("bits", 8)]
    w_q, s = kernellab.quantize_weight(torch.randn(16, 32), bits=8)
    assert w_q.dtype == torch.int8 and w_q.shape == (16, 32) and s.shape[0] == 16
    # docs/guide.md:175: `kernellab.optim.AdamW(params, lr, betas, eps, weight_decay, backend=...)`
    # with PyTorch's defaults
    pos, kw = _params(kernellab.optim.AdamW.__init__)
    torch_pos, _ = _params(torch.optim.AdamW.__init__)
    assert [n for n, _ in pos] == ["self", "params", "lr", "betas", "eps", "weight_decay"] and "backend" in kw
    assert dict(pos[2:]) == {n: d for n, d in torch_pos if n in ("lr", "betas", "eps", "weight_decay")}
    # docs/guide.md:310: ring_attention(q, k, v, causal=False, group=None, layout="contiguous"|...)
    from kernellab.distributed import LAYOUTS, ring_attention

    pos, _ = _params(ring_attention)
    assert pos[:6] == [("q", EMPTY), ("k", EMPTY), ("v", EMPTY), ("causal", False), ("group", None),
                       ("layout", "contiguous")]  # fmt: skip
    assert set(LAYOUTS) >= {"contiguous", "zigzag", "striped"}


# torch.nn.functional's own signatures (gelu and SDPA are builtins inspect cannot read: as documented
# at https://pytorch.org/docs/stable/nn.functional.html)
_TORCH_BUILTIN = {
    "gelu": [("input", EMPTY), ("approximate", "none")],
    "scaled_dot_product_attention": [("query", EMPTY), ("key", EMPTY), ("value", EMPTY), ("attn_mask", None),
                                     ("dropout_p", 0.0), ("is_causal", False), ("scale", None),
                                     ("enable_gqa", False)],
}  # fmt: skip


@pytest.mark.parametrize(
    "name", ["layer_norm", "rms_norm", "gelu", "cross_entropy", "scaled_dot_product_attention"]
)
def test_nn_functional_has_pytorchs_signatures(name):
    # docs/guide.md:101-103: `import kernellab.nn.functional as F` gives layer_norm, rms_norm, gelu,
    # cross_entropy and scaled_dot_product_attention "with PyTorch's signatures" (README.md:175)
    import torch.nn.functional as F

    import kernellab.nn.functional as KF

    ours, kw = _params(getattr(KF, name))
    want = _TORCH_BUILTIN.get(name) or _params(getattr(F, name))[0]
    assert ours == want and set(kw) <= {"backend"}, (ours, want)


def test_nn_modules_take_pytorchs_constructor_arguments():
    # README.md:173-175, docs/guide.md:99-100: kernellab.nn.LayerNorm / RMSNorm / GELU /
    # CrossEntropyLoss take PyTorch's constructor arguments (all of them, not only the common ones)
    import torch.nn as nn

    torch.manual_seed(0)
    x = torch.randn(3, 8, dtype=torch.float64)
    args = dict(eps=1e-3, elementwise_affine=True, bias=False, device="cpu", dtype=torch.float64)
    ours, theirs = kernellab.nn.LayerNorm(8, **args), nn.LayerNorm(8, **args)
    assert list(ours.state_dict()) == list(theirs.state_dict()) == ["weight"]
    torch.testing.assert_close(ours(x), theirs(x))
    ours, theirs = (
        m(8, eps=1e-3, elementwise_affine=False, dtype=torch.float64)
        for m in (kernellab.nn.RMSNorm, nn.RMSNorm)
    )
    assert list(ours.state_dict()) == []
    torch.testing.assert_close(ours(x), theirs(x))
    t = torch.tensor([0, 3, 7])
    w = torch.rand(8, dtype=torch.float64)
    for kw in (dict(weight=w), dict(ignore_index=3, reduction="sum"), dict(label_smoothing=0.1),
               dict(reduction="none")):  # fmt: skip
        torch.testing.assert_close(kernellab.nn.CrossEntropyLoss(**kw)(x, t), nn.CrossEntropyLoss(**kw)(x, t))


# ----------------------------------------------------------------------------- errors


_DOUBLE_BACKWARD = {
    "gelu": lambda: (torch.randn(3, 7, requires_grad=True),),
    "softmax": lambda: (torch.randn(3, 7, requires_grad=True),),
    "layer_norm": lambda: (torch.randn(3, 7, requires_grad=True), torch.randn(7), torch.randn(7)),
    "rms_norm": lambda: (torch.randn(3, 7, requires_grad=True), torch.randn(7)),
    "cross_entropy": lambda: (torch.randn(4, 9, requires_grad=True), torch.tensor([0, 3, 8, 1])),
    "attention": lambda: tuple(torch.randn(1, 1, 5, 16, requires_grad=True) for _ in range(3)),
}


@pytest.mark.parametrize("op", sorted(_DOUBLE_BACKWARD))
def test_double_backward_refusal_is_a_runtime_error_naming_the_op(op):
    # docs/guide.md:836-837: "the fused backwards (gelu, softmax, norms, cross_entropy,
    # attention) refuse it with a RuntimeError naming the op" (tests/ops/test_kit.py checks the
    # refusal; here the name of the op in it)
    args = _DOUBLE_BACKWARD[op]()
    out = getattr(kernellab, op)(*args, backend="triton")
    with pytest.raises(RuntimeError, match=rf"^{op}[_ ].*double backward \(create_graph=True\)"):
        torch.autograd.grad(out.square().sum(), args[0], create_graph=True)


def test_the_ops_the_guide_names_as_key_validated_are_and_cross_entropy_is_not():
    # docs/guide.md:904-909: "for ops whose spec says `key_validates` (gelu, relu, softmax, sum, max,
    # argmax, layer_norm, rms_norm, attention, matmul, add, conv2d, max_pool2d, batch_norm2d,
    # bn_relu_pool2d ...) ... (cross_entropy, whose validation reads `target`'s values, validates
    # every call)". (The guide's list is not the whole set: tests/test_registry.py pins that.)
    named = ["gelu", "relu", "softmax", "sum", "max", "argmax", "layer_norm", "rms_norm", "attention",
             "matmul", "add", "conv2d", "max_pool2d", "batch_norm2d", "bn_relu_pool2d"]  # fmt: skip
    assert all(kernellab.get_spec(op).key_validates for op in named)
    assert not kernellab.get_spec("cross_entropy").key_validates
    # ... so a bad target is refused at every call, after good calls at the same key
    logits = torch.randn(3, 5)
    for _ in range(2):
        kernellab.cross_entropy(logits, torch.tensor([0, 1, 4]))
    for _ in range(2):
        with pytest.raises(ValueError, match="target"):
            kernellab.cross_entropy(logits, torch.tensor([0, 5, 1]))


# ----------------------------------------------------------------------------- config, paths


# (option, a value the docs set, where)
DOCUMENTED_SETTINGS = [
    ("attn_split_d", False, "docs/guide.md:275: `kernellab.config.attn_split_d = False` keeps the one tile"),
    ("attn_ws", "0", 'docs/guide.md:298: `kernellab.config.attn_ws = "0"` turns it off'),
    ("attn_ws_bwd", "views", 'docs/guide.md:301: `kernellab.config.attn_ws_bwd = "views"`'),
    ("attn_ws_bwd", "0", 'docs/guide.md:302: `"0"` turns it off'),
    ("matmul_plans", False, "docs/guide.md:829: `kernellab.config.matmul_plans = False`"),
    ("triton_launch", "jit", 'docs/guide.md:831: `kernellab.config.triton_launch = "jit"`'),
    ("default_by", "loop", 'docs/guide.md:601: `"loop"` ranks every row by the larger of the two'),
    ("cpp_nodes", "off", "README.md:147: `KERNELLAB_CPP_NODES=off` never builds them"),
]


@pytest.mark.parametrize("option, value, where", DOCUMENTED_SETTINGS, ids=lambda v: str(v)[:24])
def test_documented_config_settings_are_accepted(option, value, where):
    """Each switch the docs set in code takes the documented value (a value of the wrong type
    is a TypeError)."""
    with kernellab.config.override(**{option: value}):
        assert getattr(kernellab.config, option) == value, where


@pytest.mark.parametrize(
    "env, raw, option, value",
    [
        ("KERNELLAB_DEFAULT_BY", "loop", "default_by", "loop"),  # docs/guide.md:601
        ("KERNELLAB_CPP_NODES", "off", "cpp_nodes", "off"),  # README.md:147
        ("KERNELLAB_ATTN_WS", "0", "attn_ws", "0"),  # src/kernellab/options.py, README.md:143-144
    ],
)
def test_documented_environment_variables_set_their_option(env, raw, option, value, monkeypatch):
    # README.md:141-144: "The few process-wide switches ... live in one object, kernellab.config,
    # each with its environment variable read at first use"
    from kernellab.options import Config

    monkeypatch.setenv(env, raw)
    assert getattr(Config(), option) == value


def test_info_prints_the_value_of_every_switch(cli_run, monkeypatch):
    # README.md:144: "`kernellab info` prints their values" (every option, as the process has it)
    code, out = cli_run("info")
    assert code == 0
    assert json.loads(out)["config"] == kernellab.config.as_dict()
    monkeypatch.setenv("KERNELLAB_DEFAULT_BY", "loop")
    kernellab.config.reset("default_by")
    try:
        code, out = cli_run("info")
        assert code == 0 and json.loads(out)["config"]["default_by"] == "loop"
    finally:
        monkeypatch.delenv("KERNELLAB_DEFAULT_BY")
        kernellab.config.reset("default_by")


def test_tables_are_read_from_kernellab_tables_then_the_users_then_the_packages(tmp_path, monkeypatch):
    # docs/guide.md:556-558: "a tuning table `<gpu>.json`: the first found in `$KERNELLAB_TABLES`,
    # your own tables (`~/.cache/kernellab/tables`, or `$KERNELLAB_CACHE/tables`) and the package's"
    from kernellab.core import tables

    env, cache, package = tmp_path / "env", tmp_path / "cache", tmp_path / "package"
    for d in (env, cache / "tables", package):
        d.mkdir(parents=True)
        (d / "Some_GPU.json").write_text("{}")
    monkeypatch.setenv("KERNELLAB_TABLES", str(env))
    monkeypatch.setenv("KERNELLAB_CACHE", str(cache))
    monkeypatch.setattr(tables, "PACKAGE_TABLES", str(package))
    assert tables.table_path("Some GPU") == str(env / "Some_GPU.json")
    (env / "Some_GPU.json").unlink()
    assert tables.table_path("Some GPU") == str(cache / "tables" / "Some_GPU.json")
    (cache / "tables" / "Some_GPU.json").unlink()
    assert tables.table_path("Some GPU") == str(package / "Some_GPU.json")
    # `kernellab tune` writes yours (or $KERNELLAB_TABLES), never the package's
    assert tables.table_path("Some GPU", write=True) == str(env / "Some_GPU.json")
    monkeypatch.delenv("KERNELLAB_TABLES")
    assert tables.table_path("Some GPU", write=True) == str(cache / "tables" / "Some_GPU.json")


# ----------------------------------------------------------------------------- what autograd saves


def test_ring_attention_saves_a_float64_natural_log_lse_for_float64_inputs():
    # docs/guide.md:285-287: "and so does `ring_attention` (natural-log units, its shard's
    # `q.shape[:-1]`; float64 for float64 inputs)" (fp32 / bf16: tests/distributed)
    from kernellab.distributed import simulate_ring

    gen = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(1, 2, 16, 8, generator=gen, dtype=torch.float64).requires_grad_() for _ in range(3)
    )
    o = simulate_ring(q, k, v, 2, causal=True, layout="zigzag")
    saved = o.grad_fn.saved_tensors
    assert len(saved) == 5, "q, k, v, o and exactly one extra tensor (the LSE)"
    lse = saved[4]
    assert lse.dtype == torch.float64 and lse.shape == q.shape[:-1], (lse.dtype, tuple(lse.shape))
    s = (q.detach() @ k.detach().transpose(-1, -2) / math.sqrt(8)).masked_fill(
        ~torch.ones(16, 16, dtype=torch.bool).tril(), float("-inf")
    )
    torch.testing.assert_close(lse.detach(), s.logsumexp(-1), rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------- the ops tables' backends


def _v(family: str, first: int, last: int) -> list[str]:
    return [f"{family}_v{i}" for i in range(first, last + 1)]


# (doc line, op, the backends its "backends besides manual / torch / compile" cell lists)
DOC_BACKENDS = [
    ("README.md:182", "add", ["triton", *_v("cuda", 1, 1), "cuda", *_v("numba", 1, 2), "numba"]),
    ("README.md:182", "gelu", ["triton", *_v("cuda", 1, 1), "cuda", *_v("numba", 1, 2), "numba"]),
    ("README.md:182", "relu", ["triton", *_v("cuda", 1, 1), "cuda", *_v("numba", 1, 2), "numba"]),
    ("README.md:183", "softmax", ["triton", *_v("cuda", 1, 3), "cuda", *_v("numba", 1, 2), "numba", "liger"]),
    ("README.md:184", "layer_norm", ["triton", "cuda_v1", "cuda", "cuda_node", "liger"]),
    ("README.md:184", "rms_norm", ["triton", "cuda_v1", "cuda", "cuda_node", "liger"]),
    ("README.md:185", "add_rms_norm", ["triton", "liger"]),
    ("README.md:186", "cross_entropy", ["triton", "cuda_v1", "cuda", "liger"]),
    ("README.md:187", "linear_cross_entropy", ["chunked", "triton", "triton_rows", "liger"]),
    ("README.md:188", "swiglu", ["triton", "liger"]),
    ("README.md:188", "geglu", ["triton", "liger"]),
    ("README.md:189", "rope", ["triton"]),
    ("README.md:190", "sum", ["triton", *_v("cuda", 1, 4), "cuda"]),
    ("README.md:190", "max", ["triton", "cuda_v1", "cuda"]),
    ("README.md:190", "argmax", ["triton", "cuda_v1", "cuda"]),
    ("README.md:191", "transpose", ["triton", *_v("cuda", 1, 5), "cuda", *_v("numba", 1, 2), "numba"]),
    ("README.md:192", "histogram", ["triton", *_v("cuda", 1, 7), "cuda"]),
    ("README.md:193", "int8_weight_only_matmul", ["triton", *_v("cuda", 1, 4), "cuda", "torchao"]),
    ("README.md:193", "int4_weight_only_matmul", ["triton", "cuda_v1", "cuda"]),
    ("README.md:194", "matmul", ["triton", "triton_tma", *_v("cuda", 1, 15), "cuda", "cuda_skinny"]),
    ("README.md:195", "attention", ["tiled", "triton", *_v("cuda", 1, 9), "cuda", "sdpa_flash", "sdpa_cudnn",
                                    "sdpa_efficient"]),
    ("README.md:196", "conv2d", ["triton", "cuda_v1", "cuda_v2", "cuda", "cuda_v4", "fft"]),
    ("README.md:197", "max_pool2d", ["triton", "cuda"]),
    ("README.md:197", "batch_norm2d", ["triton", "cuda"]),
    ("README.md:197", "bn_relu_pool2d", ["triton", "cuda"]),
    ("docs/guide.md:134", "sum", ["triton", *_v("cuda", 1, 4), "cuda"]),
    ("docs/guide.md:134", "max", ["triton", "cuda_v1", "cuda"]),
    ("docs/guide.md:134", "argmax", ["triton", "cuda_v1", "cuda"]),
    ("docs/guide.md:135", "histogram", ["triton", *_v("cuda", 1, 7), "cuda"]),
    ("docs/guide.md:139", "int8_weight_only_matmul", ["triton", *_v("cuda", 1, 4), "cuda", "torchao"]),
    # "(int4: cuda_v1, cuda)"
    ("docs/guide.md:139", "int4_weight_only_matmul", ["triton", "cuda_v1", "cuda"]),
    ("docs/guide.md:140", "relu", ["triton", "cuda", "cuda_v1"]),
]  # fmt: skip


@pytest.mark.parametrize("where, op, backends", DOC_BACKENDS, ids=lambda v: v if isinstance(v, str) else None)
def test_every_backend_an_ops_table_lists_is_registered_for_that_op(where, op, backends):
    """`kernellab.<op>(..., backend=NAME)` for each NAME the ops tables list: registered (whether
    it can run here is `kernellab list`'s business, not the table's)."""
    from kernellab.core import registry

    have = {impl.backend for impl in registry.impls(op)}
    assert {"manual", "torch", "compile"} <= have, (where, sorted(have))  # "besides manual / torch / compile"
    missing = sorted(set(backends) - have)
    assert not missing, f"{where}: {op} has no backend {missing} (registered: {sorted(have)})"
