"""`kernellab train hf / nanogpt --compare` (kernellab.models.user_models) on the CPU: the
argument errors, and a smoke run of tiny configs with each variant in its own process."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")


def test_train_hf_needs_compare_and_a_known_config(cli_run):
    code, out = cli_run("train", "hf", "--config", "llama")
    assert code == 2 and "--compare" in out
    code, out = cli_run("train", "hf", "--config", "bert", "--compare")
    assert code == 2 and "--config bert" in out and "llama" in out
    code, out = cli_run("train", "nanogpt", "--compare", "--mode", "graph")
    assert code == 2 and "--mode graph" in out


@pytest.mark.parametrize(("model", "variants", "config"), [("hf", "hf,kernellab", "gpt2"),
                                                           ("nanogpt", "torch,kernellab", None)])  # fmt: skip
def test_train_user_model_compare_runs_each_variant_in_its_own_process(cli_run, tmp_path, model, variants, config):
    out_path = tmp_path / "rows.jsonl"
    args = ["train", model, "--compare", "--variants", variants, "--out", str(out_path)]
    code, out = cli_run(*args, *(["--config", config] if config else []))
    assert code == 0, out
    rows = [json.loads(line) for line in out_path.read_text().splitlines()]
    assert [r["variant"] for r in rows] == variants.split(",")
    assert all(r["isolated"] and r["mode"] == "eager" and r["ms"] > 0 for r in rows)
    assert rows[0]["speedup"] == 1.0
    # the same weights and batch: the kernellab variant's loss is the reference's to rounding
    assert abs(rows[0]["loss"] - rows[1]["loss"]) < 1e-3 * abs(rows[0]["loss"])
    assert "each variant in its own process" in out


def test_training_state_counts_parameters_gradients_and_adamw_moments():
    import torch

    from kernellab.models.user_models import NanoGPT, nano_ops, training_state_gib

    model = NanoGPT(64, 16, 32, 1, 2, nano_ops("torch"))  # the head shares the embedding's weight
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    idx = torch.randint(0, 64, (2, 16))
    model(idx, idx).backward()
    opt.step()
    params = {id(p): p for p in model.parameters()}.values()
    n = sum(p.numel() for p in params)
    # fp32: parameters, gradients and two moments, 4 bytes each, plus AdamW's step counters
    steps = sum(st["step"].numel() * st["step"].element_size() for st in opt.state.values())
    assert training_state_gib(model, opt) * 2**30 == 4 * 4 * n + steps
    # the rows carry it
    assert training_state_gib(model, torch.optim.SGD(model.parameters(), lr=1e-3)) * 2**30 == 2 * 4 * n


def test_rule_variants_alternate_in_one_process(tmp_path):
    """Variants kernellab-loop and kernellab-queued run beside kernellab in one process
    (interleaved rounds), each under its ranking rule, with the same loss (the same ops
    at these tiny shapes), and the rows carry the measured commit."""
    from kernellab.models import user_models

    out_path = tmp_path / "rows.jsonl"
    variants = ["torch", "kernellab", "kernellab-loop", "kernellab-queued"]
    code = user_models.main(["--model", "nanogpt", "--small", "--batch", "2", "--seq", "32", "--modes", "eager",
                             "--variants", ",".join(variants), "--steps", "1", "--rounds", "2", "--warmup", "1",
                             "--json", str(out_path)])  # fmt: skip
    assert code == 0
    rows = [json.loads(line) for line in out_path.read_text().splitlines()]
    assert [r["variant"] for r in rows] == variants
    assert all(len(r["rounds"]) == 2 and r["git_sha"] for r in rows)
    assert len({r["loss"] for r in rows[1:]}) == 1
    import kernellab

    assert kernellab.config.default_by == "queued"  # the rule variants leave the default as it was


def test_hf_phi_builds_at_head_dim_80_and_patches(tmp_path):
    """hf-phi: Phi-2's head dim (80) and partial rotary at a tiny width; kernellab's patch
    gives the unpatched model's loss on the same weights and batch."""
    from kernellab.models import user_models

    model = user_models.hf_model("hf-phi", small=True)
    cfg = model.config
    rope = getattr(cfg, "rope_parameters", None) or {}
    assert cfg.hidden_size // cfg.num_attention_heads == 80
    assert rope.get("partial_rotary_factor", getattr(cfg, "partial_rotary_factor", None)) == 0.4
    full = user_models.HF_SIZES["hf-phi"][0]
    assert full["hidden_size"] // full["num_attention_heads"] == 80
    out_path = tmp_path / "rows.jsonl"
    code = user_models.main(["--model", "hf-phi", "--small", "--batch", "2", "--seq", "32", "--modes", "eager",
                             "--variants", "hf,kernellab", "--steps", "1", "--rounds", "1", "--warmup", "1",
                             "--json", str(out_path)])  # fmt: skip
    assert code == 0
    rows = [json.loads(line) for line in out_path.read_text().splitlines()]
    assert [r["variant"] for r in rows] == ["hf", "kernellab"]
    assert abs(rows[0]["loss"] - rows[1]["loss"]) < 1e-2 * abs(rows[0]["loss"])


def test_hf_vit_trains_on_images_and_patches(tmp_path, capsys):
    """hf-vit: ViT-B/16's shape at a tiny width, trained on images and class labels (one
    sequence of patches + the class token an image); kernellab's patch swaps its layer norms
    and attention, says why its exact GELU stays, and gives the unpatched model's loss; no
    decode task (it is not a language model)."""
    from kernellab.models import user_models

    full = user_models.HF_SIZES["hf-vit"][0]
    assert (full["image_size"] // full["patch_size"]) ** 2 + 1 == 197
    out_path = tmp_path / "rows.jsonl"
    code = user_models.main(["--model", "hf-vit", "--small", "--batch", "2", "--modes", "eager",
                             "--variants", "hf,kernellab", "--steps", "1", "--rounds", "1", "--warmup", "1",
                             "--dtype", "fp32", "--json", str(out_path)])  # fmt: skip
    assert code == 0
    err = capsys.readouterr().err
    assert "attention      vit.layers.*.attention (x2)" in err and "layer_norm x5" in err
    assert "GELUActivation (erf): kernellab.gelu is tanh only" in err
    rows = [json.loads(line) for line in out_path.read_text().splitlines()]
    assert [r["variant"] for r in rows] == ["hf", "kernellab"]
    assert all(r["seq"] == 17 and r["tokens_per_s"] > 0 for r in rows)  # (32 / 8)^2 patches + 1
    assert abs(rows[0]["loss"] - rows[1]["loss"]) < 1e-4 * abs(rows[0]["loss"])
    assert user_models.main(["--model", "hf-vit", "--task", "decode", "--small"]) == 2


def test_decode_task_times_generation_and_compares_tokens(tmp_path, capsys):
    """--task decode: greedy generation of a patched and an unpatched hf-llama from the
    same weights and prompt; fp32 gives the same tokens; one row per (variant, mode)."""
    from kernellab.models import user_models

    out_path = tmp_path / "rows.jsonl"
    code = user_models.main(["--model", "hf-llama", "--task", "decode", "--small", "--batch", "2",
                             "--seq", "16", "--new-tokens", "33", "--modes", "eager", "--variants",
                             "hf,kernellab", "--rounds", "3", "--dtype", "fp32",
                             "--json", str(out_path)])  # fmt: skip
    assert code == 0
    rows = [json.loads(line) for line in out_path.read_text().splitlines()]
    assert [(r["variant"], r["mode"], r["task"]) for r in rows] == [
        ("hf", "eager", "decode"), ("kernellab", "eager", "decode")]  # fmt: skip
    for r in rows:
        assert r["new_tokens"] == 33 and r["prompt"] == 16 and r["git_sha"]
        assert r["first_token_ms"] > 0 and r["tokens_per_s"] > 0
        assert r["same_tokens"] == 1.0
    assert rows[0]["speedup"] == 1.0
    assert "ms/token" in capsys.readouterr().out


def test_decode_task_profiles_each_variant(capsys):
    """--task decode --profile N: after the timing, N generate calls of each (variant, mode)
    under the profiler, each with its kernel time per call and its top kernels (CPU: the
    host's ops, no kernels)."""
    from kernellab.models import user_models

    code = user_models.main(["--model", "hf-llama", "--task", "decode", "--small", "--batch", "1",
                             "--seq", "8", "--new-tokens", "3", "--modes", "eager", "--variants",
                             "hf,kernellab", "--rounds", "1", "--dtype", "fp32", "--profile", "1"])  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    assert "a step is one generate call, prompt 8 + 3 new tokens" in out
    assert "-- profile hf eager: kernels" in out and "-- profile kernellab eager: kernels" in out


@pytest.mark.parametrize("argv,needle", [
    (["--model", "nanogpt", "--task", "decode"], "needs a Hugging Face model"),
    (["--model", "hf-llama", "--task", "decode", "--new-tokens", "1", "--small"],
     "--new-tokens must be at least 2"),
    (["--model", "hf-llama", "--task", "decode", "--new-tokens", "1", "--small", "--isolate"],
     "--new-tokens must be at least 2"),  # (by the parent, before any process starts)
    (["--model", "hf-llama", "--task", "decode", "--modes", "reduce-overhead", "--small", "--variants", "hf"],
     "is not one of eager, compile"),
])  # fmt: skip
def test_decode_task_refuses_what_it_cannot_time(argv, needle, capsys):
    from kernellab.models import user_models

    assert user_models.main(argv) == 2
    assert needle in capsys.readouterr().err


def test_decode_task_isolated_compares_tokens_across_processes(tmp_path, capsys):
    """--task decode --isolate: one process per variant; the parent's rows carry the ratio
    and the share of equal tokens against the first variant (fp32: every token equal)."""
    from kernellab.models import user_models

    out_path = tmp_path / "rows.jsonl"
    code = user_models.main(["--model", "hf-llama", "--task", "decode", "--small", "--batch", "2",
                             "--seq", "16", "--new-tokens", "33", "--modes", "eager", "--variants",
                             "hf,kernellab", "--rounds", "3", "--dtype", "fp32", "--isolate",
                             "--json", str(out_path)])  # fmt: skip
    assert code == 0
    rows = [json.loads(line) for line in out_path.read_text().splitlines()]
    assert [(r["variant"], r["mode"], r["isolated"]) for r in rows] == [
        ("hf", "eager", True), ("kernellab", "eager", True)]  # fmt: skip
    assert [r["same_tokens"] for r in rows] == [1.0, 1.0] and rows[0]["speedup"] == 1.0
    assert rows[1]["speedup"] == round(rows[0]["ms_per_token"] / rows[1]["ms_per_token"], 3)
    assert "each variant in its own process" in capsys.readouterr().out


def test_argv_without_drops_flags_and_options_with_values():
    from kernellab.models import user_models

    argv = ["--model", "m", "--isolate", "--variants", "a,b", "--json=x", "--seq", "8"]
    assert user_models._argv_without(argv, ("--isolate",), ("--variants", "--json")) == [
        "--model", "m", "--seq", "8"]  # fmt: skip


def test_kernel_timeline_sums_kernels_gaps_and_syncs():
    from types import SimpleNamespace as NS

    from torch.autograd import DeviceType

    def ev(kind, a, b, name="k"):
        return NS(device_type=kind, time_range=NS(start=a, end=b), name=name)

    cuda, cpu = DeviceType.CUDA, DeviceType.CPU
    events = [
        ev(cuda, 0, 100), ev(cuda, 50, 150),  # overlapping kernels: no gap
        ev(cuda, 400, 500),  # 250 us idle before it
        ev(cpu, 0, 900, "aten::mm"), ev(cpu, 160, 390, "cudaStreamSynchronize"),
        ev(cuda, 1500, 1600),  # 1000 us idle
    ]
    from kernellab.models import user_models

    tl = user_models.kernel_timeline(events, n=2)
    assert tl["kernels_ms"] == pytest.approx((100 + 100 + 100 + 100) / 2 / 1e3)
    assert tl["idle_ms"] == pytest.approx((250 + 1000) / 2 / 1e3)
    assert tl["syncs"] == 0.5
    assert user_models.kernel_timeline([], n=1) == {"kernels_ms": 0.0, "idle_ms": 0.0, "syncs": 0.0}


def test_idle_is_charged_to_the_outermost_op_of_the_next_launch():
    from types import SimpleNamespace as NS

    from torch.autograd import DeviceType

    cuda, cpu = DeviceType.CUDA, DeviceType.CPU
    step = NS(id=1, device_type=cpu, name="aten::linear", cpu_parent=None, time_range=NS(start=0, end=50))
    mm = NS(id=2, device_type=cpu, name="aten::mm", cpu_parent=step, time_range=NS(start=1, end=40))
    bwd = NS(id=3, device_type=cpu, name="autograd::engine::evaluate_function: CppFunction", cpu_parent=None,
             time_range=NS(start=60, end=70))  # fmt: skip

    def k(a, b, corr):
        return NS(device_type=cuda, time_range=NS(start=a, end=b), linked_correlation_id=corr, name="k")

    events = [step, mm, bwd, k(0, 100, 2), k(300, 400, 2), k(450, 500, 3), k(480, 490, 3), k(900, 950, 0)]
    from kernellab.models import user_models

    rows = user_models.idle_by_launcher(events, n=2)
    # gaps: 200 us before a kernel of aten::mm (charged to its outermost op, aten::linear),
    # 50 before the node's, none for the overlapping one, 400 before an unattributed launch
    node = "autograd::engine::evaluate_function: CppFunction"
    assert rows == [("(no op)", pytest.approx(0.2), 0.5), ("aten::linear", pytest.approx(0.1), 0.5),
                    (node, pytest.approx(0.025), 0.5)]  # fmt: skip
    assert user_models.idle_by_launcher([], n=1) == []

    # kernels without the attribute (PyTorch 2.11's FunctionEvent) take it from ``links``
    bare = [NS(device_type=cuda, time_range=NS(start=a, end=b), name="k") for a, b in ((0, 100), (300, 400))]
    rows = user_models.idle_by_launcher([step, mm, bwd, *bare], n=1, links={300.0: 3})
    assert rows == [(node, pytest.approx(0.2), 1)]
    assert user_models.idle_by_launcher([step, mm, bwd, *bare], n=1) == [("(no op)", pytest.approx(0.2), 1)]


def test_kineto_links_reads_a_real_profile():
    import torch
    from torch.profiler import ProfilerActivity, profile

    from kernellab.models import user_models

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.ones(8).sum()
    # a CPU-only profile has no kernels; the call exercises the Kineto accessors it relies on
    assert user_models.kineto_links(prof) == {}


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--model", "nope"], "--model nope: one of nanogpt, hf-gpt2"),
        (["--dtype", "fp7"], "--dtype fp7: one of bf16, fp16, fp32"),
        (["--steps", "0"], "--steps must be >= 1, got 0"),
        (["--rounds", "0"], "--rounds must be >= 1, got 0"),
        (["--batch", "0"], "--batch must be >= 1, got 0"),
        (["--modes", "eager,nope"], "--modes 'nope': one of eager, compile, reduce-overhead"),
        (["--variants", "torch,nope"], "--variants 'nope': nanogpt has torch, kernellab"),
        (["--model", "hf-llama", "--variants", "torch"], "--variants 'torch': hf-llama has hf, liger"),
    ],
)
def test_user_models_refuses_bad_arguments_before_building_a_model(capsys, argv, needle):
    from kernellab.models import user_models

    with pytest.raises(SystemExit) as e:
        user_models.main(["--small", *argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and needle in err and "Traceback" not in err, err


def test_train_nanogpt_refuses_an_unknown_variant(capsys):
    from kernellab import cli

    with pytest.raises(SystemExit) as e:
        cli.main(["train", "nanogpt", "--compare", "--variants", "nope"])
    assert e.value.code == 2 and "--variants 'nope'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("task", "variants", "isolated"),
    [("train", None, True), ("train", "hf,liger", True), ("decode", "liger,kernellab", True),
     ("train", "hf,kernellab", False), ("train", "liger", False)],
)  # fmt: skip
def test_liger_beside_another_variant_always_runs_isolated(monkeypatch, capsys, task, variants, isolated):
    """Liger's patch assigns functions of the model's transformers module (rope, the causal
    LM's forward): beside another variant in one process it would run in theirs too, so such
    a run takes a process per variant whether or not --isolate was given."""
    from kernellab.models import user_models

    class Ran(Exception):
        pass

    def record(how):
        def fn(*args, **kwargs):
            raise Ran(how)

        return fn

    monkeypatch.setattr(user_models, "_isolated", record("isolated"))
    monkeypatch.setattr(user_models, "_isolated_decode", record("isolated"))
    monkeypatch.setattr(user_models, "decode_main", record("one process"))
    monkeypatch.setattr(user_models, "_device_dtype", record("one process"))
    argv = ["--model", "hf-llama", "--small", "--task", task, *(["--variants", variants] if variants else [])]
    with pytest.raises(Ran) as ran:
        user_models.main(argv)
    assert str(ran.value) == ("isolated" if isolated else "one process")
    noted = "Liger's patch replaces functions" in capsys.readouterr().err
    assert noted == (isolated and "--isolate" not in argv)
