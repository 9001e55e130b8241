"""The GPT model on kernellab's ops: same losses as on PyTorch's ops, real text, the CLI,
and (on a GPU) torch.compile(fullgraph=True) with Inductor launching our Triton kernels."""

from __future__ import annotations

import pytest
import torch

import kernellab
from kernellab.models import gpt, text
from kernellab.ops import aten

MICRO = gpt.Config(vocab=256, ctx=16, dim=32, layers=1, heads=2)


def _losses(backends, steps=20, seed=0, optimizer="pytorch"):
    torch.manual_seed(seed)
    model = gpt.GPT(MICRO, backends)
    data = text.ByteData(text.load_corpus())
    trainer = gpt.Trainer(model, lr=3e-3, optimizer=optimizer)
    gen = torch.Generator().manual_seed(seed)
    return [float(trainer.step(*data.batch(2, 16, gen))) for _ in range(steps)]


def test_loss_curves_agree_over_20_steps_pytorch_vs_triton():
    """Same init, same batches, 20 AdamW steps: kernellab's Triton ops (interpreter) follow
    PyTorch's ops step for step. fp32; the two differ by rounding only (different
    reduction orders), and AdamW's normalized updates keep that from growing much over 20
    steps: 1e-4 relative is ~100x what was seen (1e-6) and far below a wrong gradient's
    effect (a dropped term moves the loss in the first decimal within a few steps)."""
    ref = _losses("pytorch")
    ours = _losses("triton")
    assert len(ours) == 20
    for i, (a, b) in enumerate(zip(ref, ours)):
        assert abs(a - b) <= 1e-4 * abs(a), (i, a, b)
    assert ours[-1] < ours[0] - 0.2  # it learns


@pytest.mark.parametrize("optimizer", ["torch", "triton"])
def test_kernellab_adamw_trains_as_pytorchs(optimizer):
    """The Trainer's optimizer through kernellab.optim.AdamW (same defaults, same math):
    the loss curve follows torch.optim.AdamW's over 8 steps (fp32; Triton's bias
    corrections differ by fp32 ulps)."""
    ref = _losses("pytorch", steps=8)
    ours = _losses("pytorch", steps=8, optimizer=optimizer)
    for i, (a, b) in enumerate(zip(ref, ours)):
        assert abs(a - b) <= 1e-5 * abs(a), (i, a, b)
    with pytest.raises(ValueError, match="optimizer: unknown 'sgd'"):
        gpt.Trainer(gpt.GPT(MICRO), optimizer="sgd")


def test_op_sets_fill_every_slot_and_refuse_unknown_names():
    ops = gpt.op_set("triton")
    assert set(gpt.SLOTS) <= set(ops) and not ops["qkv_contiguous"]  # Triton reads the projection
    assert gpt.op_set({"attn": "tiled"})["qkv_contiguous"]  # a [B*H]-folding backend: one copy
    assert gpt.op_set("pytorch")["qkv_contiguous"] is False
    with pytest.raises(KeyError, match="no backend 'nope'"):
        gpt.op_set("nope")
    with pytest.raises(ValueError, match="unknown op slots"):
        gpt.op_set({"lnorm": "triton"})
    with pytest.raises(ValueError, match="config"):
        gpt.GPT("gpt5")
    with pytest.raises(ValueError, match="mode"):
        gpt.Trainer(gpt.GPT(MICRO), mode="fast")
    with pytest.raises(ValueError, match="mode: 'compile-step-graph'.*needs a GPU"):
        gpt.Trainer(gpt.GPT(MICRO), mode="compile-step-graph")
    with pytest.raises(ValueError, match="seq_len"):
        gpt.train(gpt.CONFIGS["tiny"], seq_len=65, steps=1)


def test_text_corpus_batches_and_errors(tmp_path):
    corpus = text.load_corpus()
    assert len(corpus) > 400_000 and "assert" in corpus  # Python's pydoc topics
    data = text.ByteData(corpus)
    idx, tgt = data.batch(3, 32, torch.Generator().manual_seed(1))
    assert idx.shape == tgt.shape == (3, 32) and idx.dtype == torch.int64
    assert int(idx.max()) < text.VOCAB
    assert torch.equal(idx[:, 1:], tgt[:, :-1])  # targets are the next tokens
    with pytest.raises(FileNotFoundError, match="no such file"):
        text.load_corpus(tmp_path / "missing.txt")
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(ValueError, match="need at least"):
        text.load_corpus(empty)
    binary = tmp_path / "bin.txt"
    binary.write_bytes(b"\xff\xfe\xfa")
    with pytest.raises(ValueError, match="not UTF-8"):
        text.load_corpus(binary)
    small = text.ByteData("hello world")
    with pytest.raises(ValueError, match="seq_len"):
        small.batch(1, 100, torch.Generator())
    with pytest.raises(ValueError, match="batch_size"):
        small.batch(0, 2, torch.Generator())
    mine = tmp_path / "mine.txt"
    mine.write_text("some text of my own " * 50)
    losses = gpt.train("tiny", "pytorch", steps=2, batch_size=2, seq_len=8, data=mine)
    assert len(losses) == 2


def test_cli_train_and_compare(capsys, tmp_path):
    from kernellab.cli import main

    assert main(["train", "gpt", "--config", "tiny", "--steps", "2", "--backend", "pytorch",
                 "--batch-size", "2", "--seq-len", "16"]) == 0  # fmt: skip
    assert "loss" in capsys.readouterr().out
    # the default says what it resolved to (on the CPU, with no table: PyTorch's ops)
    assert main(["train", "gpt", "--config", "tiny", "--steps", "1", "--backend", "default",
                 "--batch-size", "2", "--seq-len", "16"]) == 0  # fmt: skip
    printed = " ".join(capsys.readouterr().out.split())
    assert "default ops at 2 x 16 on cpu" in printed and "ln=pytorch" in printed, printed
    # a mode this machine cannot run, or one of mnist's: a one-line error, exit code 2
    for mode in ("compile-step-graph", "graph"):
        assert main(["train", "gpt", "--config", "tiny", "--steps", "1", "--mode", mode]) == 2
        assert f"--mode {mode}: gpt trains in eager" in " ".join(capsys.readouterr().out.split())
    out = tmp_path / "rows.jsonl"
    # --compare on the CPU: eager only (compile's codegen takes minutes here, and no speed
    # claim is made on a CPU); every op set, one table, JSONL rows with provenance.
    rc = main(["train", "gpt", "--config", "tiny", "--compare", "--batch-size", "1", "--seq-len", "8",
               "--out", str(out)])  # fmt: skip
    printed = capsys.readouterr().out
    assert rc == 0, printed
    assert "training step" in printed and "eager" in printed  # (rich may wrap the set names)
    import json

    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["ops"] for r in rows} == set(gpt.COMPARE_SETS)
    assert all(r["ms_per_step"] > 0 and "git_sha" in r and "error" not in r for r in rows)
    # timed in alternating rounds, each set's round paired with PyTorch's
    assert all(r["rounds"] == 3 and r["ms_min"] <= r["ms_per_step"] <= r["ms_max"] for r in rows)
    assert next(r for r in rows if r["ops"] == "pytorch")["ratio_paired"] == 1.0


@pytest.mark.gpu
def test_gpu_compile_fullgraph_launches_our_triton_kernels():
    """torch.compile(fullgraph=True) of the GPT with Triton ops: no graph break, and
    Inductor's output code launches our Triton kernels itself (triton_op)."""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    model = gpt.make(gpt.Config(vocab=256, ctx=64, dim=64, layers=1, heads=2), "triton", "pytorch", "cuda")
    idx = torch.randint(0, 256, (2, 64), device="cuda")
    ref = model(idx, idx)
    cm = torch.compile(model, fullgraph=True)
    loss, codes = run_and_get_code(lambda: cm(idx, idx))
    code = "\n".join(codes)
    # (the residual adds run inside the norm kernels: add_layer_norm_triton)
    for name in ("_norm_fwd", "_gelu_fwd_kernel", "_attn_fwd", "_ce_fwd_kernel"):
        assert name in code, name
    for op in ("kernellab.attention_triton", "kernellab.cross_entropy_triton", "kernellab.layer_norm_triton",
               "kernellab.add_layer_norm_triton"):  # fmt: skip
        assert op not in code, op  # no op left opaque to Inductor
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-5)
    assert kernellab.get("gelu", "triton").fn.ops[0] is not None
    # The backward graph (compiled at the first backward) launches our backward kernels,
    # and copies nothing around them: a view of one buffer handed to a kernel that writes
    # it is functionalized into select/clone kernels (three per norm backward, 75 launches
    # a GPT-2 step, before the norm's partials became separate buffers).
    _, bcodes = run_and_get_code(lambda: cm(idx, idx).backward())
    bcode = "\n".join(bcodes)
    for name in ("_norm_bwd_kernel", "_gelu_bwd_kernel", "_attn_bwd_dq", "_ce_bwd_kernel"):
        assert name in bcode, name
    assert "fused_select" not in bcode


@pytest.mark.gpu
@pytest.mark.parametrize("backends,optimizer", [("pytorch", "pytorch"), ("triton", "pytorch"), ("triton", "triton")])
def test_gpu_step_graph_trains_as_the_compiled_step(backends, optimizer):
    """compile-step-graph (the whole step, AdamW included, one CUDA graph) takes the same
    steps as the compiled step it captures: same init, a new batch each step (copied into
    the graph's inputs), fp32. Losses and the final weights agree to rounding; the first
    call is a real step (not a replay) and a batch of another shape is refused. With
    kernellab's AdamW the capture uploads the gradients' new addresses (in the graph's pool)
    from pinned memory that replays read again."""
    cfg = gpt.Config(vocab=256, ctx=32, dim=64, layers=2, heads=2)
    data = text.ByteData(text.load_corpus(), "cuda")
    runs = {}
    for mode in ("compile", "compile-step-graph"):
        torch._dynamo.reset()
        model = gpt.make(cfg, backends, "pytorch", "cuda", torch.float32, seed=0)
        trainer = gpt.Trainer(model, mode, lr=3e-3, optimizer=optimizer)
        gen = torch.Generator(device="cuda").manual_seed(0)
        losses = [float(trainer.step(*data.batch(2, 32, gen))) for _ in range(6)]
        runs[mode] = (losses, [p.detach().clone() for p in model.parameters()], trainer)
    (ref, ref_w, _), (got, got_w, trainer) = runs["compile"], runs["compile-step-graph"]
    assert trainer.graph is not None
    for i, (a, b) in enumerate(zip(ref, got)):
        assert abs(a - b) <= 1e-4 * abs(a), (i, a, b)
    assert got[-1] < got[0]  # it learns, step after step (no replay of a stale batch)
    # The weights moved alike: Adam's normalized update turns rounding-level gradient
    # differences into O(lr) steps where a gradient is near 0, so compare the whole update
    # (a stale or skipped step would be off by ~100%).
    init = [p.detach() for p in gpt.make(cfg, backends, "pytorch", "cuda", torch.float32, seed=0).parameters()]
    num = sum(float(((b - a) ** 2).sum()) for a, b in zip(ref_w, got_w))
    den = sum(float(((a - w0) ** 2).sum()) for a, w0 in zip(ref_w, init))
    assert den > 0 and (num / den) ** 0.5 < 0.02, (num / den) ** 0.5
    with pytest.raises(ValueError, match="idx: the step graph was captured at"):
        trainer.step(*data.batch(1, 32, torch.Generator(device="cuda").manual_seed(1)))


def _grads(model, idx, tgt):
    model.zero_grad(set_to_none=True)
    loss = model(idx, tgt)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


class _NoFusedAdd:
    """A layer_norm backend seen without its add_forward_saving / add_backward_from (as a
    backend that has none): the fused blocks then add and normalize in two launches."""

    def __init__(self, fn):
        self.forward_saving, self.backward_from = fn.forward_saving, fn.backward_from


@pytest.mark.parametrize(
    "backends,plain_add",
    [("triton", False), ({"ln": "triton", "gelu": "triton", "attn": "triton", "add": "triton"}, False), ("triton", True),
     # PyTorch's attention and add in the fused blocks (kernellab.ops.aten's entry points)
     ({"ln": "triton", "gelu": "triton"}, False)],
)
def test_fused_blocks_match_op_by_op_and_pytorch(backends, plain_add):
    """Eager kernellab models run each block under one autograd node (hand-written
    backward through the ops' node-free launchers). Its loss and every parameter's
    gradient equal the op-by-op graph of the same kernels (fp32, rounding only) and
    PyTorch's ops; a wrong term in the hand-written backward (a dropped residual, a
    transposed weight gradient) moves a gradient by O(1) relative."""
    cfg = gpt.Config(vocab=256, ctx=16, dim=32, layers=2, heads=2)
    torch.manual_seed(0)
    fused = gpt.GPT(cfg, backends)
    kern = fused._fused(torch.empty(0))
    assert kern is not None  # this op set does take the fused path
    assert hasattr(kern["ln"], "add_forward_saving")  # Triton's norm adds the residual itself
    if plain_add:
        (key,) = fused._fused_cache
        fused._fused_cache[key] = {**kern, "ln": _NoFusedAdd(kern["ln"])}
    unfused = gpt.GPT(cfg, backends, fuse=False)
    ref = gpt.GPT(cfg, "pytorch")
    unfused.load_state_dict(fused.state_dict())
    ref.load_state_dict(fused.state_dict())
    gen = torch.Generator().manual_seed(3)
    idx = torch.randint(0, 256, (2, 16), generator=gen)
    tgt = torch.randint(0, 256, (2, 16), generator=gen)
    lf, gf = _grads(fused, idx, tgt)
    lu, gu = _grads(unfused, idx, tgt)
    lr, gr = _grads(ref, idx, tgt)
    assert torch.allclose(lf, lu, rtol=1e-5) and torch.allclose(lf, lr, rtol=1e-5)
    for name in gf:
        scale = gr[name].abs().max().item() + 1e-12
        assert (gf[name] - gu[name]).abs().max().item() <= 1e-5 * scale + 1e-9, name
        assert (gf[name] - gr[name]).abs().max().item() <= 1e-4 * scale + 1e-9, name


def test_fused_blocks_only_where_every_slot_has_node_free_kernels():
    cfg = gpt.Config(vocab=256, ctx=16, dim=32, layers=1, heads=2)
    x = torch.empty(0)
    assert gpt.GPT(cfg, "pytorch")._fused(x) is None
    assert gpt.GPT(cfg, "triton", matmul="triton")._fused(x) is None  # linear not on cuBLAS
    # PyTorch's ops in some slots run through their aten entry points
    kern = gpt.GPT(cfg, {"ln": "triton", "gelu": "triton"})._fused(x)
    assert kern["attn"] is aten.attention and kern["add"] is aten.add and kern["ln"] is kernellab.get("layer_norm", "triton").fn
    assert gpt.GPT(cfg, "manual")._fused(x) is None  # manual ops have no node-free entry
    # op by op (torch.compile's path): residual add + norm as one op where both are ours
    assert gpt.GPT(cfg, "triton").ops["ln_add"] is not None
    assert gpt.GPT(cfg, "pytorch").ops["ln_add"] is None
    assert gpt.GPT(cfg, {"ln": "triton"}).ops["ln_add"] is None  # PyTorch's add asked for
    # Under no_grad the op-by-op path runs (no backward to own): same loss.
    m = gpt.GPT(cfg, "triton")
    idx = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a = m(idx, idx)
    assert torch.allclose(a, m(idx, idx).detach(), rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("backends", ["triton", {"ln": "triton", "add": "triton"}, {"ln": "pytorch"}],
                         ids=["triton", "aten_attn_gelu", "all_aten"])  # fmt: skip
def test_gpu_graphed_blocks_match_plain_and_guard_their_buffers(backends):
    """On a GPU the eager fused blocks replay CUDA graphs of themselves (from the second
    call at a shape). Against the same model with graphs=False, over AdamW steps (the
    graphs read parameters updated in place): the same losses and gradients; gradient
    accumulation over two micro-batches; two forwards before their backwards (the second
    runs without the graphs); a retained graph whose activations a later forward
    overwrote is refused, not differentiated wrongly."""
    cfg = gpt.Config(vocab=512, ctx=64, dim=128, layers=2, heads=2)
    torch.manual_seed(0)
    a = gpt.GPT(cfg, backends).cuda()
    b = gpt.GPT(cfg, backends, graphs=False).cuda()
    b.load_state_dict(a.state_dict())
    gen = torch.Generator(device="cuda").manual_seed(1)
    batches = [torch.randint(0, 512, (2, 2, 64), device="cuda", generator=gen) for _ in range(4)]

    def same_grads():
        for (n, pa), pb in zip(a.named_parameters(), b.parameters()):
            torch.testing.assert_close(pa.grad, pb.grad, rtol=1e-5, atol=1e-7, msg=n)

    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (a, b)]
    for idx, tgt in batches:  # plain first call, capture at the second, replays after
        losses = []
        for m in (a, b):
            loss = m(idx, tgt)
            loss.backward()
            losses.append(loss.item())
        same_grads()
        assert losses[0] == pytest.approx(losses[1], rel=1e-6)
        for opt in opts:
            opt.step()
            opt.zero_grad(set_to_none=True)
    assert len(a._plans.plans) == 1 and not a._plans.off  # the graphs did run
    assert not b._plans.plans

    (i1, t1), (i2, t2) = batches[0], batches[1]
    for m in (a, b):  # gradient accumulation: two backwards into the same .grad
        m(i1, t1).backward()
        m(i2, t2).backward()
    same_grads()
    for m in (a, b):
        m.zero_grad(set_to_none=True)
        l1, l2 = m(i1, t1), m(i2, t2)  # the second forward while the first awaits its backward
        (l1 + 2 * l2).backward()
    same_grads()

    loss = a(i1, t1)
    loss.backward(retain_graph=True)
    a(i2, t2)  # replays the forward graph: the retained activations are gone
    with pytest.raises(RuntimeError, match="overwritten by a later forward"):
        loss.backward()


def test_default_slots_resolve_by_device_time_at_the_model_shapes(tmp_path, monkeypatch):
    """backends=None: each slot is resolved at the model's shapes from the tuning table's
    DEVICE time (the model pays host cost once per step), among backends with node-free
    entry points for the block's slots; PyTorch's op chosen -> PyTorch's op in that slot
    (the fused blocks call it through kernellab.ops.aten). The loss equals PyTorch's
    model's, eager and under torch.compile(fullgraph=True) (the resolution is a constant of
    the traced graph)."""
    import json

    from kernellab.core import registry

    monkeypatch.setenv("KERNELLAB_TABLES", str(tmp_path))
    cfg = gpt.Config(vocab=256, ctx=16, dim=32, layers=2, heads=2)
    rows = []

    def row(op, key, device, times=None, opts="", shape=None):
        times = times or device
        rows.append({"op": op, "dtype": "fp32", "mode": "fwdbwd", "shape": list(shape or key), "key": list(key),
                     "options": opts, "best": min(times, key=times.get), "times": times, "device": device})  # fmt: skip

    # loop times favour torch everywhere (a standalone call), device times do not
    row("layer_norm", (32, 32), {"torch": 2.0, "triton": 1.0, "manual": 0.5}, {"torch": 1, "triton": 5, "manual": 9})
    row("gelu", (32 * 128,), {"torch": 1.0, "triton": 2.0})
    row("add", (32 * 32,), {"torch": 2.0, "triton": 1.0}, {"torch": 1, "triton": 5})
    row("attention", (4, 16, 16, 16), {"torch": 1.0, "triton": 2.0}, opts="causal=True", shape=(2, 2, 16, 16))
    row("cross_entropy", (32, 256), {"torch": 2.0, "triton": 1.0})
    for k in [(32, 96, 32), (32, 32, 32), (32, 128, 32), (32, 32, 128), (32, 256, 32)]:
        row("matmul", k, {"torch": 1.0, "triton": 2.0})
    (tmp_path / "cpu.json").write_text(json.dumps({"gpu": "cpu", "rows": rows}))
    registry.clear_cache()
    try:
        torch.manual_seed(0)
        m = gpt.GPT(cfg, None, None)
        ref = gpt.GPT(cfg, "pytorch")
        ref.load_state_dict(m.state_dict())
        # manual is fastest on the device but has no node-free entry point: triton
        want = {"ln": "triton", "gelu": "pytorch", "attn": "pytorch", "add": "triton", "ce": "triton",
                "linear": "pytorch"}  # fmt: skip
        assert gpt.resolve_defaults(m.ops["chosen"], cfg, 2, 16, torch.float32, "cpu") == want
        idx = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
        lm, gm = _grads(m, idx, idx)
        lr, gr = _grads(ref, idx, idx)
        ((key, kern),) = m._fused_cache.items()
        assert dict(key[1]) == want and kern["attn"] is aten.attention and kern["gelu"] is aten.gelu
        torch.testing.assert_close(lm, lr, rtol=1e-5, atol=1e-6)
        for name in gr:
            torch.testing.assert_close(gm[name], gr[name], rtol=1e-4, atol=1e-5 * gr[name].abs().max().item())
        lc = torch.compile(m, fullgraph=True)(idx, idx)
        torch.testing.assert_close(lc, lr, rtol=1e-5, atol=1e-6)
    finally:
        registry.clear_cache()


def test_default_slots_under_compile_choose_backends_inductor_launches(tmp_path, monkeypatch):
    """Traced by torch.compile, a None slot chooses among the backends Inductor launches
    itself (PyTorch's ops and our Triton kernels): a backend fastest on the device but
    launched through its own Python launcher every step (here ``manual``, standing in for
    a CUDA C++ kernel on the GPU) is passed over; eager keeps the device-time choice."""
    import json

    from kernellab.core import registry

    monkeypatch.setenv("KERNELLAB_TABLES", str(tmp_path))
    cfg = gpt.Config(vocab=256, ctx=16, dim=32, layers=1, heads=2)
    rows = []
    for op, key, dev, opts in [
        ("cross_entropy", (32, 256), {"torch": 2.0, "triton": 1.0, "manual": 0.5}, ""),
        ("layer_norm", (32, 32), {"torch": 2.0, "triton": 3.0, "manual": 0.5}, ""),
        ("gelu", (32 * 128,), {"torch": 1.0, "triton": 2.0}, ""),
        ("add", (32 * 32,), {"torch": 2.0, "triton": 1.0}, ""),
        ("attention", (4, 16, 16, 16), {"torch": 1.0, "triton": 2.0}, "causal=True"),
    ] + [("matmul", k, {"torch": 1.0, "triton": 2.0}, "") for k in
         [(32, 96, 32), (32, 32, 32), (32, 128, 32), (32, 32, 128), (32, 256, 32)]]:  # fmt: skip
        rows.append({"op": op, "dtype": "fp32", "mode": "fwdbwd", "shape": list(key), "key": list(key),
                     "options": opts, "best": min(dev, key=dev.get), "times": dev, "device": dev})  # fmt: skip
    (tmp_path / "cpu.json").write_text(json.dumps({"gpu": "cpu", "rows": rows}))
    registry.clear_cache()
    try:
        chosen = gpt.GPT(cfg, None, None).ops["chosen"]
        eager = gpt.resolve_defaults(chosen, cfg, 2, 16, torch.float32, "cpu")
        traced = gpt.resolve_defaults(chosen, cfg, 2, 16, torch.float32, "cpu", compiling=True)
        assert eager["ce"] == "manual" and traced["ce"] == "triton"
        # the block's slot: manual has no node-free entry point either way; torch beats triton
        assert eager["ln"] == "pytorch" and traced["ln"] == "pytorch"
        assert {k: v for k, v in traced.items() if k != "ce"} == {k: v for k, v in eager.items() if k != "ce"}
    finally:
        registry.clear_cache()
