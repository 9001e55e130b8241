"""Training steps of models kernellab did not write, with and without kernellab, beside
the library users would pick instead: ms per step, tokens/s and peak memory, in eager,
torch.compile and (nanoGPT) reduce-overhead, interleaved rounds.

Models:
  nanogpt   a nanoGPT-style GPT-2 written as a user writes it (F.layer_norm, tanh GeLU,
            F.scaled_dot_product_attention, F.cross_entropy); variant "kernellab" swaps those
            four calls for kernellab's by hand (backend=None).
  hf-gpt2, hf-llama, hf-qwen2, hf-mistral, hf-gemma2, hf-phi (Phi-2's widths: head dim 80),
  hf-vit    (ViT-B/16: 224 x 224 images, 197 tokens, a classification loss; --seq unused)
            Hugging Face transformers models built from configs (no weights downloaded);
            variants "hf" (as is, SDPA), "liger" (Liger-Kernel's patch, when installed) and
            "kernellab" (kernellab.patch, when present).
  Every model also takes variants "kernellab-loop" and "kernellab-queued": "kernellab"
  with the default ranking table rows by that rule (``registry.default_rule``; "queued",
  the default: kernels of 20 us or more by device time; "loop": every row by the larger of
  device and loop time), eager mode: whether a device-time choice's host cost hides in a
  real step. Beside them "kernellab" runs under ``config.default_by`` in a cache of its own.

    kernellab train hf --config llama --compare          (this module, through the CLI)
    python -m kernellab.models.user_models --model nanogpt --batch 8 --seq 1024 --json out.jsonl
    python -m kernellab.models.user_models --model hf-llama --seq 2048 --batch 2 --isolate
    python -m kernellab.models.user_models --model hf-llama --task decode --batch 8 --seq 512

``--task decode`` (hf-* models) times greedy generation with a KV cache instead of
training steps (``decode_main``); with ``--isolate`` each variant in its own process, which
compiled decoding needs for the reason below (``_isolated_decode``).

Each (variant, mode) keeps its own copy of the model from the same initial weights; a round
runs --steps timed steps of each in turn after warm-up (compiles) and the median round is
reported with the ratio to the first variant in the same mode. ``--isolate`` runs each
variant in a process of its own instead (no interleaving): torch.compile's cache is per
code object, so compiled variants of one model class in one process recompile each
other's graphs (an HF Llama step takes seconds under compile that way), and a patch's
module-level swaps stay out of the other variants. Liger's patch is such a swap (it
assigns the rope function and the causal LM's forward of the transformers module), so a
run of Liger beside any other variant is always isolated.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

# --------------------------------------------------------------------------- nanoGPT


class NanoBlock(nn.Module):
    def __init__(self, d: int, heads: int, ops: dict):
        super().__init__()
        self.heads, self.ops = heads, ops
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        o = self.ops
        q, k, v = self.qkv(o["ln"](x, self.ln1)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = o["attn"](q, k, v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(a)
        return x + self.fc2(o["gelu"](self.fc(o["ln"](x, self.ln2))))


class NanoGPT(nn.Module):
    def __init__(self, vocab: int, ctx: int, d: int, layers: int, heads: int, ops: dict):
        super().__init__()
        self.ops = ops
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(NanoBlock(d, heads, ops) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.wte.weight
        for mod in self.modules():  # GPT-2's initialisation
            if isinstance(mod, (nn.Linear, nn.Embedding)):
                nn.init.normal_(mod.weight, std=0.02)
            if isinstance(mod, nn.Linear) and mod.bias is not None:
                nn.init.zeros_(mod.bias)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ops["ln"](x, self.ln_f))
        return self.ops["ce"](logits.view(-1, logits.shape[-1]), targets.view(-1))


def nano_ops(variant: str, backends: dict | None = None) -> dict:
    if variant == "torch":
        return {
            "ln": lambda x, m: F.layer_norm(x, m.normalized_shape, m.weight, m.bias, m.eps),
            "gelu": lambda x: F.gelu(x, approximate="tanh"),
            "attn": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
            "ce": F.cross_entropy,
        }
    import kernellab

    if not backends:  # the calls a user writes
        return {
            "ln": lambda x, m: kernellab.layer_norm(x, m.weight, m.bias, m.eps),
            "gelu": kernellab.gelu,
            "attn": lambda q, k, v: kernellab.attention(q, k, v, causal=True),
            "ce": kernellab.cross_entropy,
        }
    ln, gelu, attn, ce = (backends.get(op) for op in ("layer_norm", "gelu", "attention", "cross_entropy"))
    return {
        "ln": lambda x, m: kernellab.layer_norm(x, m.weight, m.bias, m.eps, backend=ln),
        "gelu": lambda x: kernellab.gelu(x, backend=gelu),
        "attn": lambda q, k, v: kernellab.attention(q, k, v, causal=True, backend=attn),
        "ce": lambda logits, t: kernellab.cross_entropy(logits, t, backend=ce),
    }


# --------------------------------------------------------------------------- Hugging Face

HF_SIZES = {
    # model: (full size: the shapes, small: a CPU smoke size)
    "hf-gpt2": (dict(n_embd=768, n_layer=12, n_head=12, vocab_size=50257, n_positions=4096),
                dict(n_embd=64, n_layer=2, n_head=4, vocab_size=256, n_positions=256)),
    "hf-llama": (dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                      num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192, tie_word_embeddings=False),
                 dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=256)),
    "hf-qwen2": (dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                      num_key_value_heads=2, vocab_size=151936, max_position_embeddings=8192, tie_word_embeddings=True),
                 dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=256)),
    "hf-mistral": (dict(hidden_size=1024, intermediate_size=3584, num_hidden_layers=8, num_attention_heads=16,
                        num_key_value_heads=4, vocab_size=32768, sliding_window=1024),
                   dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, vocab_size=256, sliding_window=16)),
    "hf-gemma2": (dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=8, num_attention_heads=8,
                       num_key_value_heads=4, head_dim=128, vocab_size=65536, sliding_window=1024),
                  dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=16, vocab_size=256, sliding_window=16)),
    # Phi-2's widths (head dim 80, partial rotary) at 8 of its 32 layers
    "hf-phi": (dict(hidden_size=2560, intermediate_size=10240, num_hidden_layers=8, num_attention_heads=32,
                    vocab_size=51200, partial_rotary_factor=0.4, max_position_embeddings=4096),
               dict(hidden_size=80, intermediate_size=160, num_hidden_layers=2, num_attention_heads=1,
                    vocab_size=256, partial_rotary_factor=0.4)),
    # ViT-B/16 (ImageNet's 1000 classes)
    "hf-vit": (dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                    image_size=224, patch_size=16, num_labels=1000),
               dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                    image_size=32, patch_size=8, num_labels=10)),
}  # fmt: skip
# The image models among them: inputs pixel_values (B, 3, S, S) and one label an image.
HF_IMAGE = ("hf-vit",)


def hf_model(name: str, small: bool):
    import transformers as tf

    cls = {"hf-gpt2": (tf.GPT2Config, tf.GPT2LMHeadModel), "hf-llama": (tf.LlamaConfig, tf.LlamaForCausalLM),
           "hf-qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM), "hf-mistral": (tf.MistralConfig, tf.MistralForCausalLM),
           "hf-gemma2": (tf.Gemma2Config, tf.Gemma2ForCausalLM), "hf-phi": (tf.PhiConfig, tf.PhiForCausalLM),
           "hf-vit": (tf.ViTConfig, tf.ViTForImageClassification)}[name]  # fmt: skip
    cfg = cls[0](**HF_SIZES[name][1 if small else 0])
    cfg._attn_implementation = "sdpa"
    return cls[1](cfg)


def liger_patch(name: str, model) -> str | None:
    """Liger-Kernel's patch of ``model`` (instance patching); None where unavailable."""
    try:
        import liger_kernel.transformers as lk
    except ImportError:
        return "liger-kernel is not installed"
    fn = {"hf-gpt2": None, "hf-llama": "apply_liger_kernel_to_llama", "hf-qwen2": "apply_liger_kernel_to_qwen2",
          "hf-mistral": "apply_liger_kernel_to_mistral", "hf-gemma2": "apply_liger_kernel_to_gemma2",
          "hf-phi": None, "hf-vit": None}[name]  # fmt: skip
    if fn is None or not hasattr(lk, fn):
        return f"Liger has no patch for {name}"
    getattr(lk, fn)(model=model)
    return None


def kernellab_patch(model, backends: dict | None = None) -> str | None:
    import kernellab

    if not hasattr(kernellab, "patch"):
        return "kernellab.patch is not in this version"
    fused = hasattr(kernellab, "linear_cross_entropy")  # as Liger's patch fuses head and loss
    print(kernellab.patch(model, backend=backends or None, fused_linear_cross_entropy=fused, verbose=False),
          file=sys.stderr)
    return None


def hf_patch(name: str, variant: str, model, backends: dict | None) -> str | None:
    """Patch a Hugging Face ``model`` in place for ``variant`` (liger, or a kernellab
    variant; any other runs as is); why it cannot be, or None."""
    if variant == "liger":
        return liger_patch(name, model)
    if variant in KL_VARIANTS:
        return kernellab_patch(model, backends)
    return None


def _device_dtype(a) -> tuple[str, torch.dtype]:
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    return dev, {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[a.dtype]


def _settle_nodes(dev: str) -> bool:
    """Whether kernellab's C++ nodes are in use for this run: on a GPU a background build of
    them (``cuda.nodes``) finishes before the first step, so that no variant's rounds mix
    the two."""
    if dev != "cuda":
        return False
    from kernellab.cuda import nodes

    return nodes.settle() is not None


def _append_rows(path: str | None, rows: list[dict]) -> None:
    """One JSON line per row, appended to ``path`` (none: nothing)."""
    if path and rows:
        with open(path, "a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")


# --------------------------------------------------------------------------- decode


def decode_refusal(a) -> str | None:
    """Why ``--task decode`` cannot time these arguments, or None."""
    if not a.model.startswith("hf-") or a.model in HF_IMAGE:
        return f"--task decode needs a Hugging Face model (hf-..., a language model), not {a.model!r}"
    if a.new_tokens < 2:
        return f"--new-tokens must be at least 2, got {a.new_tokens}"
    for mode in a.modes.split(","):
        if mode not in ("eager", "compile"):
            return f"--task decode: mode {mode!r} is not one of eager, compile"
    return None


def decode_main(a, backends: dict) -> int:
    """``--task decode``: greedy generation with a KV cache (``model.generate``), as a user
    serves a model, per variant: time to the first token (the prompt's prefill) and each
    further token's time, ``(t(new_tokens) - t(1)) / (new_tokens - 1)``, the median of
    --rounds; and how many generated tokens equal the first variant's. Modes: eager, and
    compile (a static cache and ``torch.compile`` of the forward, as transformers'
    generation docs advise)."""
    modes = a.modes.split(",")  # (the arguments: refused in main, ``decode_refusal``)
    dev, dtype = _device_dtype(a)
    _settle_nodes(dev)
    torch.manual_seed(0)
    with torch.device(dev):
        base = hf_model(a.model, a.small)
    base = base.to(dev, dtype).eval()
    vocab = base.config.vocab_size
    gen = torch.Generator(device="cpu").manual_seed(1)
    prompt = torch.randint(0, vocab, (a.batch, a.seq), generator=gen).to(dev)
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    runs, skipped = {}, {}
    for v in _variants(a):
        for mode in modes:
            m = copy.deepcopy(base)
            why = hf_patch(a.model, v, m, backends)
            if why:
                skipped[v] = why
                break
            kw = dict(do_sample=False, pad_token_id=0)
            if mode == "compile":
                kw["cache_implementation"] = "static"
                m.forward = torch.compile(m.forward)
            runs[(v, mode)] = (m, kw)
    del base

    def generate(m, kw, n):
        with torch.no_grad():
            return m.generate(prompt, max_new_tokens=n, min_new_tokens=n, **kw)

    tokens = {}
    for key, (m, kw) in runs.items():  # warm-up: compiles, autotuning, the allocator
        for n in (1, a.new_tokens):
            out = generate(m, kw, n)
        tokens[key] = out[:, a.seq :].cpu()
        if a.tokens_dir:  # --isolate: the parent compares the variants' tokens
            torch.save(tokens[key], _tokens_path(a.tokens_dir, *key))
    first_ms, total_ms = {key: [] for key in runs}, {key: [] for key in runs}
    for _ in range(a.rounds):
        for key, (m, kw) in runs.items():
            for n, into in ((1, first_ms), (a.new_tokens, total_ms)):
                sync()
                t0 = time.perf_counter()
                generate(m, kw, n)
                sync()
                into[key].append((time.perf_counter() - t0) * 1e3)
    gpu = torch.cuda.get_device_name() if dev == "cuda" else "cpu"
    from kernellab.harness.bench import git_sha

    sha = git_sha()
    print(f"{a.model} decode: batch {a.batch}, prompt {a.seq}, {a.new_tokens} new tokens, {a.dtype} "
          f"on {gpu}; "
          f"median of {a.rounds} rounds; ratio = the first variant's ms per token / this one's; "
          "same = generated tokens equal to the first variant's"
          + (" (of this process; --isolate's table follows)" if a.tokens_dir else ""))  # fmt: skip
    for v, why in skipped.items():
        print(f"  {v}: skipped ({why})")
    rows = []
    for mode in modes:
        ref = None
        for v in _variants(a):
            key = (v, mode)
            if key not in runs:
                continue
            ttft = statistics.median(first_ms[key])
            steps = zip(total_ms[key], first_ms[key])
            per = statistics.median((t - f) / (a.new_tokens - 1) for t, f in steps)
            ref = ref or (per, tokens[key])
            same = float((tokens[key] == ref[1]).float().mean())
            row = dict(model=a.model, task="decode", variant=v, mode=mode, batch=a.batch, prompt=a.seq,
                       new_tokens=a.new_tokens, dtype=a.dtype, gpu=gpu, first_token_ms=round(ttft, 3),
                       ms_per_token=round(per, 4),
                       tokens_per_s=round(a.batch * 1e3 / per) if per > 0 else None,
                       speedup=round(ref[0] / per, 3) if per > 0 else None, same_tokens=round(same, 4),
                       git_sha=sha)  # fmt: skip
            if backends and v in KL_VARIANTS:
                row["backends"] = backends
            rows.append(row)
            _print_decode_row(row)
    _append_rows(a.json, rows)
    if a.profile:  # a step here: one generate call of --new-tokens tokens after the prompt
        print(f"\n(decode profiles: a step is one generate call, prompt {a.seq} + {a.new_tokens} new tokens)")
        for key, (m, kw) in runs.items():
            profile_steps(key, lambda *_, m=m, kw=kw: generate(m, kw, a.new_tokens), None, None, a.profile, sync)
    return 0


def _print_decode_row(row: dict) -> None:
    print(f"  {row['mode']:8s} {row['variant']:10s} first token {row['first_token_ms']:9.2f} ms  "
          f"{row['ms_per_token']:8.3f} ms/token  {row['tokens_per_s']} tok/s  {row['speedup']}x  "
          f"same {row['same_tokens']:.3f}")  # fmt: skip


def _tokens_path(folder: str, variant: str, mode: str) -> str:
    import os

    return os.path.join(folder, f"{variant}-{mode}.pt")


def _isolated_decode(a, argv: list[str]) -> int:
    """``--task decode --isolate``: each variant in its own process (its compiled forward
    alone in torch.compile's cache); the ratio and the share of equal tokens against the
    first variant of each mode, from the processes' rows and saved tokens."""
    refs = {}

    def complete(row, tmp):  # against the first variant of its mode
        tokens = torch.load(_tokens_path(tmp, row["variant"], row["mode"]))
        ref_per, ref_tokens = refs.setdefault(row["mode"], (row["ms_per_token"], tokens))
        row["speedup"] = round(ref_per / row["ms_per_token"], 3) if row["ms_per_token"] > 0 else None
        same = (tokens == ref_tokens).float().mean() if tokens.shape == ref_tokens.shape else 0.0
        row["same_tokens"] = round(float(same), 4)

    rows, rc = _isolated_rows(a, argv, lambda tmp: ["--tokens-dir", tmp], complete)
    print(f"{a.model} decode: each variant in its own process; ratio = the first variant's ms per token / "
          "this one's; same = generated tokens equal to the first variant's")  # fmt: skip
    for mode in a.modes.split(","):
        for row in (r for r in rows if r["mode"] == mode):
            _print_decode_row(row)
    return rc


# --------------------------------------------------------------------------- timing


def loss_fn(model, hf: bool, image: bool = False):
    """``model``'s training loss of a batch (idx, tgt): an HF image model's of pixel values
    and labels, an HF language model's of token ids, nanoGPT's of (idx, targets)."""

    def loss_of(idx, tgt):
        if image:  # idx: pixel_values
            return model(pixel_values=idx, labels=tgt).loss
        if hf:
            return model(input_ids=idx, labels=tgt).loss
        return model(idx, tgt)

    return loss_of


def image_batch(cfg, batch: int, dev, dtype, gen=None):
    """Random images (batch, 3, S, S) and one label an image for an image model's ``cfg``, and
    the tokens an image makes (its patches and the class token)."""
    side, patch = cfg.image_size, cfg.patch_size
    idx = torch.randn(batch, 3, side, side, generator=gen).to(dev, dtype)
    tgt = torch.randint(0, cfg.num_labels, (batch,), generator=gen).to(dev)
    return idx, tgt, (side // patch) ** 2 + 1


def make_step(model, opt, mode: str, hf: bool, image: bool = False):
    loss_of = loss_fn(model, hf, image)
    fwd = loss_of
    if mode == "compile":
        fwd = torch.compile(loss_of)
    elif mode == "reduce-overhead":
        fwd = torch.compile(loss_of, mode="reduce-overhead")

    def step(idx, tgt):
        loss = fwd(idx, tgt)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return step


RULE_VARIANTS = {"kernellab-loop": "loop", "kernellab-queued": "queued"}
KL_VARIANTS = ("kernellab", *RULE_VARIANTS)


def _under_rule(step, by: str | None):
    """``step`` with kernellab's default ranking table rows by ``by`` (None:
    ``config.default_by``), each rule with its own choice cache so the variants can
    alternate in one process."""
    from kernellab.core import registry

    def run(idx, tgt):
        with registry.default_rule(by):
            return step(idx, tgt)

    return run


def training_state_gib(model, opt) -> float:
    """GiB of what a training step keeps between steps, whatever its kernels: the
    parameters, one gradient per trainable parameter (allocated by every backward) and
    the optimizer's state. No step's peak can be below it."""
    params = {id(p): p for p in model.parameters()}.values()  # tied weights once
    n = sum(p.numel() * p.element_size() for p in params)
    n += sum(p.numel() * p.element_size() for p in params if p.requires_grad)
    n += sum(t.numel() * t.element_size() for st in opt.state.values() for t in st.values()
             if isinstance(t, torch.Tensor))  # fmt: skip
    return n / 2**30


SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "aten::_local_scalar_dense")


def kernel_timeline(events, n: int) -> dict:
    """Per step, from a profiler's raw events: the kernels' summed time, the time the GPU
    sat idle between the first kernel and the last (waiting for the host), and the calls
    that made the host wait for the GPU. Kernels only: an aten op's device time repeats
    its kernels'."""
    from torch.autograd import DeviceType

    ks = sorted((e.time_range.start, e.time_range.end) for e in events if e.device_type == DeviceType.CUDA)
    busy = sum(b - a for a, b in ks)
    idle, end = 0.0, ks[0][1] if ks else 0.0
    for a, b in ks[1:]:
        idle += max(0.0, a - end)
        end = max(end, b)
    syncs = sum(1 for e in events if e.device_type == DeviceType.CPU and e.name in SYNC_CALLS)
    return {"kernels_ms": busy / n / 1e3, "idle_ms": idle / n / 1e3, "syncs": syncs / n}


def idle_by_launcher(events, n: int, top: int = 8, links: dict | None = None) -> list[tuple[str, float, float]]:
    """Where the GPU waited: each idle gap between kernels (as ``kernel_timeline``) charged
    to the kernel that ended it, by the outermost host op around that kernel's launch (the
    model's call, or ``autograd::engine::evaluate_function: <node>`` in a backward; "(no
    op)" for a launch outside any recorded op). [(op, idle ms a step, gaps a step)], the
    ``top`` largest first. A kernel's op is its ``linked_correlation_id``; where the event
    lacks one (PyTorch before 2.12 does not keep it), ``links`` maps the kernel's start (us,
    3 decimals) to it (``kineto_links``)."""
    from torch.autograd import DeviceType

    # host ops (a runtime call such as cudaLaunchKernel is linked to its op, and its own id
    # is the driver's correlation, a different numbering)
    host = DeviceType.CPU
    cpu = {e.id: e for e in events
           if e.device_type == host and e.id > 0 and not getattr(e, "linked_correlation_id", 0)}  # fmt: skip
    links = links or {}
    ks = sorted((e for e in events if e.device_type == DeviceType.CUDA), key=lambda e: e.time_range.start)
    by: dict[str, list[float]] = {}
    end = ks[0].time_range.end if ks else 0.0
    for k in ks[1:]:
        gap = k.time_range.start - end
        end = max(end, k.time_range.end)
        if gap <= 0:
            continue
        corr = getattr(k, "linked_correlation_id", 0) or links.get(round(k.time_range.start, 3), 0)
        op = cpu.get(corr)
        while op is not None and op.cpu_parent is not None:
            op = op.cpu_parent
        t = by.setdefault(op.name if op is not None else "(no op)", [0.0, 0])
        t[0] += gap
        t[1] += 1
    rows = sorted(((name, us / n / 1e3, c / n) for name, (us, c) in by.items()), key=lambda r: -r[1])
    return rows[:top]


def kineto_links(prof) -> dict[float, int]:
    """{a kernel's start in a profile's FunctionEvent times (us from the trace's start, 3
    decimals): the correlation id of the op that launched it}, from the raw Kineto events."""
    from torch.autograd import DeviceType

    res = prof.profiler.kineto_results
    t0 = res.trace_start_ns()
    return {round((e.start_ns() - t0) / 1000, 3): e.linked_correlation_id()
            for e in res.events() if e.device_type() == DeviceType.CUDA and e.linked_correlation_id() > 0}  # fmt: skip


def profile_steps(key, step, idx, tgt, n: int, sync, top: int = 18) -> None:
    """Prints, for ``n`` steps under torch.profiler: the kernels' time, the GPU's idle time
    between kernels and the host's syncs per step (``kernel_timeline``), the host time per
    step, the idle time by the host op that launched the kernel after it
    (``idle_by_launcher``), and the ``top`` kernels by device time."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    sync()
    with profile(activities=acts) as prof:
        for _ in range(n):
            step(idx, tgt)
        sync()
    tl = kernel_timeline(prof.events(), n)
    ev = prof.key_averages()
    host_us = sum(e.self_cpu_time_total for e in ev) / n
    print(f"\n-- profile {key[0]} {key[1]}: kernels {tl['kernels_ms']:.2f} ms/step, GPU idle between kernels"
          f" {tl['idle_ms']:.2f} ms/step, host syncs {tl['syncs']:.1f}/step, host {host_us / 1e3:.2f} ms/step")
    for name, ms, gaps in idle_by_launcher(prof.events(), n, links=kineto_links(prof)):
        print(f"  idle {ms:7.3f} ms {gaps:6.1f} gaps  before the kernels of: {name[:90]}")
    kern = {}
    for e in prof.events():
        if e.device_type == DeviceType.CUDA:
            t, c = kern.get(e.name, (0.0, 0))
            kern[e.name] = (t + e.time_range.elapsed_us(), c + 1)
    for name, (t, c) in sorted(kern.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"  {t / n / 1e3:8.3f} ms {c // n:5d}x  {name[:110]}")


# Liger's patch functions assign to the model's transformers module (its rope function, the
# causal-LM class's forward with the fused loss), not only to the instance: in one process
# the other variants would run them too.
LIGER_ISOLATES = ("user_models: Liger's patch replaces functions of the model's transformers module "
                  "(rope, the causal LM's forward), which would reach the other variants in this "
                  "process: each variant runs in a process of its own (as --isolate)")


def _variants(a) -> list[str]:
    if a.variants:
        return a.variants.split(",")
    return ["hf", "liger", "kernellab"] if a.model.startswith("hf-") else ["torch", "kernellab"]


def _argv_without(argv: list[str], flags: tuple, options: tuple) -> list[str]:
    """argv less the flags and the options with their values (``--opt v`` or ``--opt=v``)."""
    rest, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in options:
            skip = True
        elif arg not in flags and not arg.startswith(tuple(o + "=" for o in options)):
            rest.append(arg)
    return rest


def _isolated_rows(a, argv: list[str], child_args, complete) -> tuple[list[dict], int]:
    """Each variant of ``a`` in its own process (``argv`` less --isolate, --variants, --json
    and --tokens-dir, plus ``child_args(tmp)``): its rows completed by ``complete(row, tmp)``
    and appended to --json as its process ends (a run stopped later keeps them). Returns
    (rows, the first non-zero exit code or 0)."""
    import os
    import subprocess
    import tempfile

    rest = _argv_without(argv, ("--isolate",), ("--variants", "--json", "--tokens-dir"))
    rows, rc = [], 0
    with tempfile.TemporaryDirectory() as tmp:
        for v in _variants(a):
            path = os.path.join(tmp, f"{v}.jsonl")
            r = subprocess.run([sys.executable, "-m", "kernellab.models.user_models", *rest, "--variants", v,
                                "--json", path, *child_args(tmp)], check=False)  # fmt: skip
            rc = rc or r.returncode
            if r.returncode:
                print(f"  {v}: failed (exit {r.returncode})")
            new = [json.loads(line) for line in open(path)] if os.path.exists(path) else []
            for row in new:
                complete(row, tmp)
                row["isolated"] = True
            _append_rows(a.json, new)
            rows += new
    return rows, rc


def _isolated(a, argv: list[str]) -> int:
    """Each variant in its own process (``--isolate``); one table from their JSON rows."""
    firsts = {}

    def complete(row, tmp):  # against the first variant of its mode
        row["speedup"] = round(firsts.setdefault(row["mode"], row["ms"]) / row["ms"], 3)

    rows, rc = _isolated_rows(a, argv, lambda tmp: [], complete)
    print(f"{a.model}: each variant in its own process; ratio = the first variant's time / this one's")
    for mode in a.modes.split(","):
        for row in (r for r in rows if r["mode"] == mode):
            print(f"  {mode:16s} {row['variant']:10s} {row['ms']:9.2f} ms  {row['tokens_per_s']:>9d} tok/s"
                  f"  {row['peak_gib']:6.2f} GiB (state {row.get('state_gib', float('nan')):.2f})"
                  f"  {row['speedup']:.2f}x  loss {row['loss']:.4f}")  # fmt: skip
    return rc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="nanogpt")
    p.add_argument("--task", default="train", choices=("train", "decode"),
                   help="train: training steps; decode: greedy generation with a KV cache (hf-* models)")
    p.add_argument("--new-tokens", type=int, default=32, help="--task decode: tokens after the prompt")
    p.add_argument("--variants", default=None, help="comma-separated (default: every one the model has)")
    p.add_argument("--modes", default="eager,compile", help="eager, compile, reduce-overhead")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--steps", type=int, default=10, help="timed steps per round")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--small", action="store_true", help="tiny configs (a CPU smoke run)")
    p.add_argument("--json", default=None, help="append one JSON row per (variant, mode)")
    p.add_argument("--cprofile", type=int, default=0, metavar="N",
                   help="after timing, N steps of each (variant, mode) under cProfile: the host's top functions")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="after timing, profile N steps of each (variant, mode): the top kernels by device time")
    p.add_argument("--isolate", action="store_true", help="each variant in a process of its own (module docstring)")
    p.add_argument("--tokens-dir", default=None, help=argparse.SUPPRESS)  # decode --isolate's children
    p.add_argument("--backend", action="append", default=[], metavar="OP=NAME",
                   help="the kernellab variant runs OP on backend NAME (repeatable; default: kernellab's choice)")
    argv = sys.argv[1:] if argv is None else list(argv)
    a = p.parse_args(argv)
    if a.model != "nanogpt" and a.model not in HF_SIZES:
        p.error(f"--model {a.model}: one of nanogpt, {', '.join(HF_SIZES)}")
    if a.dtype not in ("bf16", "fp16", "fp32"):
        p.error(f"--dtype {a.dtype}: one of bf16, fp16, fp32")
    for name in ("batch", "seq", "steps", "rounds"):
        if getattr(a, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(a, name)}")
    bad = [m for m in a.modes.split(",") if m not in ("eager", "compile", "reduce-overhead")]
    if bad:
        p.error(f"--modes {bad[0]!r}: one of eager, compile, reduce-overhead")
    known = ("hf", "liger", *KL_VARIANTS) if a.model in HF_SIZES else ("torch", *KL_VARIANTS)
    bad = [v for v in (a.variants.split(",") if a.variants else []) if v not in known]
    if bad:
        p.error(f"--variants {bad[0]!r}: {a.model} has {', '.join(known)}")
    backends = {}
    for item in a.backend:
        op, sep, name = item.partition("=")
        if not sep or not op or not name:
            p.error(f"--backend {item!r}: expected OP=NAME, e.g. linear_cross_entropy=triton")
        backends[op] = name
    why = decode_refusal(a) if a.task == "decode" else None
    if why:  # (here, not in each isolated process)
        print(why, file=sys.stderr)
        return 2
    variants = _variants(a)
    if not a.isolate and "liger" in variants and len(variants) > 1:
        print(LIGER_ISOLATES, file=sys.stderr)
        a.isolate = True
    if a.task == "decode":
        return _isolated_decode(a, argv) if a.isolate else decode_main(a, backends)
    if a.isolate:
        return _isolated(a, argv)

    dev, dtype = _device_dtype(a)
    nodes_in_use = _settle_nodes(dev)
    hf, image = a.model.startswith("hf-"), a.model in HF_IMAGE
    modes = a.modes.split(",")
    torch.manual_seed(0)
    if hf:
        with torch.device(dev):  # initialised where it runs (a 1B model's init takes ~20 s on a CPU)
            base = hf_model(a.model, a.small)
        base_cfg = base.config
        vocab = getattr(base_cfg, "vocab_size", None)
    else:
        d, layers, heads, vocab = (64, 2, 4, 256) if a.small else (768, 12, 12, 50304)
        base = NanoGPT(vocab, a.seq, d, layers, heads, nano_ops("torch"))
    base = base.to(dev, dtype)
    runs, skipped = {}, {}
    for v in variants:
        for mode in modes:
            m = copy.deepcopy(base)
            why = None
            kl = v in KL_VARIANTS
            if hf:
                why = hf_patch(a.model, v, m, backends)
            else:
                ops = nano_ops("kernellab" if kl else v, backends if kl else None)
                m.ops = ops
                for blk in m.blocks:
                    blk.ops = ops
            if why:
                skipped[v] = why
                break
            m.train()
            opt = torch.optim.AdamW(m.parameters(), lr=1e-4, fused=dev == "cuda")
            step = make_step(m, opt, mode, hf, image)
            if v in RULE_VARIANTS:
                step = _under_rule(step, RULE_VARIANTS[v])
            elif v == "kernellab" and any(r in variants for r in RULE_VARIANTS):
                step = _under_rule(step, None)
            runs[(v, mode)] = (m, step, opt)
    # the parameters: resident before a variant's warm-up; its gradients and AdamW's moments
    # are allocated by its first step and so counted in the step's peak
    param_bytes = sum(p.numel() * p.element_size() for p in base.parameters())
    del base
    gen = torch.Generator(device="cpu").manual_seed(1)
    if image:  # seq: the tokens an image makes
        idx, tgt, a.seq = image_batch(base_cfg, a.batch, dev, dtype, gen)
    else:
        idx = torch.randint(0, vocab, (a.batch, a.seq), generator=gen).to(dev)
        tgt = torch.randint(0, vocab, (a.batch, a.seq), generator=gen).to(dev)
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    peak, losses = {}, {}
    for key, (_, step, _) in runs.items():  # warm-up: compiles, autotuning, allocator
        # Every variant's model stays resident: a variant's peak is its own parameters plus
        # the most its steps allocated above what was resident before its warm-up (its
        # gradients, AdamW's moments and the step's activations and temporaries).
        if dev == "cuda":
            sync()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
        for _ in range(a.warmup):
            losses[key] = float(step(idx, tgt).detach())
        sync()
        peak[key] = (torch.cuda.max_memory_allocated() - before + param_bytes) / 2**30 if dev == "cuda" else float("nan")
    state = {key: training_state_gib(m, opt) for key, (m, _, opt) in runs.items()}
    times = {key: [] for key in runs}
    for _ in range(a.rounds):
        for key, (_, step, _) in runs.items():
            sync()
            t0 = time.perf_counter()
            for _ in range(a.steps):
                step(idx, tgt)
            sync()
            times[key].append((time.perf_counter() - t0) * 1e3 / a.steps)
    gpu = torch.cuda.get_device_name() if dev == "cuda" else "cpu"
    from kernellab.harness.bench import git_sha

    sha = git_sha()
    print(f"{a.model} B={a.batch} T={a.seq} {a.dtype} on {gpu}: ms/step (median of {a.rounds} rounds of "
          f"{a.steps}), tokens/s, peak GiB (own parameters + its steps' peak) and the state kept between "
          "steps (parameters, gradients, optimizer); ratio = first variant's time / this one's")  # fmt: skip
    for v, why in skipped.items():
        print(f"  {v}: skipped ({why})")
    rows = []
    for mode in modes:
        first = None
        for v in variants:
            if (v, mode) not in runs:
                continue
            ms = statistics.median(times[(v, mode)])
            first = first or ms
            row = dict(model=a.model, variant=v, mode=mode, batch=a.batch, seq=a.seq, dtype=a.dtype, gpu=gpu,
                       ms=round(ms, 3), tokens_per_s=round(a.batch * a.seq / ms * 1e3),
                       peak_gib=round(peak[(v, mode)], 2), state_gib=round(state[(v, mode)], 2),
                       speedup=round(first / ms, 3),
                       rounds=[round(t, 3) for t in times[(v, mode)]], loss=round(losses[(v, mode)], 4),
                       git_sha=sha, cpp_nodes=nodes_in_use)  # fmt: skip
            if backends and v in KL_VARIANTS:
                row["backends"] = backends
            rows.append(row)
            print(f"  {mode:16s} {v:10s} {ms:9.2f} ms  {row['tokens_per_s']:>9d} tok/s  {row['peak_gib']:6.2f} GiB"
                  f" (state {row['state_gib']:.2f})  {row['speedup']:.2f}x  loss {row['loss']:.4f}")  # fmt: skip
            if not math.isfinite(losses[(v, mode)]):
                print(f"  WARNING: {v} {mode} loss is not finite")
    if a.cprofile:
        import cProfile
        import pstats

        for key, (_, step, _) in runs.items():
            sync()
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(a.cprofile):
                step(idx, tgt)
            sync()
            prof.disable()
            print(f"\n-- cProfile {key[0]} {key[1]}, {a.cprofile} steps")
            pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(22)
            pstats.Stats(prof, stream=sys.stdout).sort_stats("cumulative").print_stats(30)
    if a.profile:
        for key, (_, step, _) in runs.items():
            profile_steps(key, step, idx, tgt, a.profile, sync)
    _append_rows(a.json, rows)
    return 0 if all(math.isfinite(r["loss"]) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
