"""Context parallel training (issue 44): one sequence sharded over the ranks, kernellab's ring
attention inside the model step, every rank holding the whole model.

Each rank of the context-parallel group (W ranks: the default group) takes the same global
batch, keeps its shard of every row's tokens in ``layout`` (zigzag by default: the sequence
cut in 2W chunks, rank r keeping chunks r and 2W-1-r, so causal attention costs every rank
the same) and runs the model on those S / W tokens:

- positions: each token keeps its GLOBAL position (``cp_batch`` returns them): the GPT adds
  ``wpe[pos]``, a Llama-style model gets ``position_ids=pos`` and rotates q and k by the
  right angles (RoPE is a function of the position alone, so a shard needs nothing else);
- attention: ``ring_attention(q, k, v, causal=True, layout=...)``: K/V blocks travel
  around the ring, so each query sees exactly the keys it would see on one device; every
  other op of the block is per token and runs on the shard as it is;
- loss: each rank returns sum(its tokens' losses) / (valid tokens of ALL ranks) (one
  all-reduce of the count, ``ignore_index`` tokens left out), so the ranks' losses add up
  to the global mean, and so do their gradients;
- gradients: after backward every parameter's gradient is summed over the ranks (one
  all-reduce of all gradients flattened: ~2 bytes x 8B parameters = 16 GB at Llama-8B bf16
  would be ~40 ms on NVLink against seconds of a 64k-token step, so it is not overlapped).

The memory it buys: activations scale with S / W (attention's O(S) with the ring's
flash-style blocks), the model and optimizer state do not (they are replicated; FSDP2 over
the same ranks would shard them too, not done here).

    from kernellab.distributed import context_parallel as CP
    idx_l, tgt_l, pos_l = CP.cp_batch(idx, tgt, rank, world, "zigzag")
    res = CP.train("hf-llama:small", seq_len=64, steps=3)            # on every rank

Command line: ``kernellab train gpt|hf ... --nproc N --dp cp`` (docs/distributed.md).
"""

from __future__ import annotations

import contextlib
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from kernellab.distributed import layouts as L
from kernellab.distributed.blocks import check_blocks

IGNORE_INDEX = -100
MODES = ("eager",)  # the ring's exchanges are host-driven P2P: no compile, no CUDA graph


# --------------------------------------------------------------------------- the batch


def cp_batch(idx: torch.Tensor, targets: torch.Tensor, rank: int, world: int, layout: str = "zigzag"):
    """(idx, targets, positions) of ``rank``'s shard: idx and targets [B, S] -> [B, S / W]
    (the same tokens and their own next-token targets), positions [S / W] int64 (global
    token indices, for learned positions or RoPE), on idx's device. S must be a multiple of
    2W for zigzag (W for the others)."""
    for name, t in (("idx", idx), ("targets", targets)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise TypeError(f"cp_batch: {name} must be a [B, S] tensor, got {got}")
    if idx.shape != targets.shape:
        raise ValueError(
            f"cp_batch: idx {tuple(idx.shape)} and targets {tuple(targets.shape)} differ in shape"
        )
    check_seq(idx.shape[1], world, layout)
    s_local = idx.shape[1] // world
    pos = L.positions(rank, world, s_local, layout).to(idx.device)
    return L.shard(idx, rank, world, layout, dim=1), L.shard(targets, rank, world, layout, dim=1), pos


def check_seq(seq_len: int, world: int, layout: str) -> None:
    g = L.granule(layout, world)
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1 or seq_len % g:
        raise ValueError(
            f"seq_len {seq_len} must be a positive multiple of {g} for context parallel over {world} ranks "
            f"with layout {layout!r}"
            + (" (zigzag cuts each sequence in 2W chunks)" if layout == "zigzag" else "")
        )


def check(
    config: str, world: int, cp: int | None, seq_len: int, layout: str = "zigzag", mode: str = "eager"
) -> None:
    """ValueError naming the argument, or None. Every rank calls it with the same arguments
    before any collective, so a bad argument is refused on every rank alike."""
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise ValueError(f"world size (nproc) must be an integer >= 1, got {world!r}")
    if cp is not None and cp != world:
        raise ValueError(
            f"cp {cp} differs from the world size {world}: the context-parallel group is all ranks"
        )
    L.check_layout(layout)
    if mode not in MODES:
        raise ValueError(f"mode: {mode!r} does not run context parallel; modes: {', '.join(MODES)}")
    name = str(config).partition(":")[0]
    if name not in CP_MODELS and not name.startswith("hf-") and name not in _gpt_configs():
        raise ValueError(f"config: unknown {config!r}")
    if name not in CP_MODELS and name not in _gpt_configs():
        raise ValueError(f"config: {config!r} does not run context parallel; models: kernellab's GPT "
                         f"({', '.join(_gpt_configs())}) or {', '.join(CP_MODELS)}")  # fmt: skip
    check_seq(seq_len, world, layout)


def _gpt_configs():
    from kernellab.models import gpt

    return tuple(gpt.CONFIGS)


# Hugging Face models whose attention goes through transformers' attention interface with
# RoPE from position_ids and full causal attention (the ring replaces the attention
# function). Not Mistral or Gemma-2: their sliding windows are not the ring's mask.
CP_MODELS = ("hf-llama", "hf-qwen2")


# --------------------------------------------------------------------------- the model


_STATE: dict = {}  # the ring's group and layout while a CP forward runs (the HF attention hook)


@contextlib.contextmanager
def _ring(group, layout, blocks=None):
    old = dict(_STATE)
    _STATE.update(group=group, layout=layout, blocks=blocks)
    try:
        yield
    finally:
        _STATE.clear()
        _STATE.update(old)


def _ring_attn(q, k, v):
    from kernellab.distributed.ring import ring_attention

    # check=False: the shapes were agreed before the step (every rank runs the same model
    # on the same number of tokens); the check would sync the host once per layer
    return ring_attention(q, k, v, causal=True, group=_STATE["group"], layout=_STATE["layout"], check=False,
                          blocks=_STATE.get("blocks"))  # fmt: skip


def _hf_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """transformers' attention interface: q [B, H, S, D], k/v [B, H_kv, S, D] ->
    ([B, S, H, D], None). The causal mask is the ring's (no mask is built for this
    implementation: it is not in transformers' mask mapping)."""
    if not _STATE:
        raise RuntimeError("kernellab_ring attention runs inside ContextParallel's forward only")
    if dropout:
        raise ValueError("context parallel: attention dropout is not supported")
    from kernellab.distributed.ring import ring_attention

    o = ring_attention(query, key, value, causal=True, group=_STATE["group"], layout=_STATE["layout"],
                       scale=scaling, check=False, blocks=_STATE.get("blocks"))  # fmt: skip
    return o.transpose(1, 2).contiguous(), None


HF_ATTN = "kernellab_ring"


def _register_hf() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(HF_ATTN, _hf_attention)


class ContextParallel(nn.Module):
    """``model`` (kernellab's GPT, or ``CausalLM`` around a Llama-style Hugging Face model)
    run on this rank's shard: ``forward(idx, targets)`` takes the shard (``cp_batch``) and
    returns this rank's share of the global mean loss (module docstring). ``blocks``: the
    ring's block kernels (``ring_attention``'s: None, "triton", "cudnn", "torch")."""

    def __init__(
        self, model: nn.Module, group=None, layout: str = "zigzag", ignore_index: int = IGNORE_INDEX,
        blocks=None,
    ):  # fmt: skip
        super().__init__()
        from kernellab.distributed.data_parallel import CausalLM
        from kernellab.models.gpt import GPT

        self.model, self.group, self.layout = model, group, L.check_layout(layout)
        self.ignore_index = ignore_index
        self.blocks = check_blocks(blocks)
        if isinstance(model, GPT):
            self.kind = "gpt"
        elif isinstance(model, CausalLM) and _full_causal(model.hf.config):
            self.kind = "hf"
            _register_hf()
            model.hf.config._attn_implementation = HF_ATTN
        else:
            raise ValueError(f"model: {type(model).__name__} does not run context parallel; kernellab's GPT "
                             f"or a Llama-style Hugging Face model ({', '.join(CP_MODELS)})")  # fmt: skip
        self.world = dist.get_world_size(group) if dist.is_initialized() else 1
        self.rank = dist.get_rank(group) if dist.is_initialized() else 0

    def positions(self, s_local: int, device) -> torch.Tensor:
        return L.positions(self.rank, self.world, s_local, self.layout).to(device)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        b, t = idx.shape
        pos = self.positions(t, idx.device)
        with _ring(self.group, self.layout, self.blocks):
            logits = self._gpt_logits(idx, pos) if self.kind == "gpt" else self._hf_logits(idx, pos)
        count = (targets != self.ignore_index).sum().to(torch.float64)
        if self.world > 1:
            dist.all_reduce(count, group=self.group)
        loss = F.cross_entropy(logits.reshape(b * t, -1).float(), targets.reshape(b * t),
                               ignore_index=self.ignore_index, reduction="sum")  # fmt: skip
        return loss / count.clamp(min=1).to(loss.dtype)

    def _gpt_logits(self, idx, pos):
        m = self.model
        b, t = idx.shape
        if int(pos.max()) >= m.cfg.ctx:
            raise ValueError(f"seq_len {t * self.world} is longer than the model's context ({m.cfg.ctx})")
        x = m.wte[idx] + m.wpe[pos]
        o = dict(m._ops(x, b, t))  # the model's op set; attention over the ring instead
        o["attn"] = _ring_attn
        r = None
        for blk in m.blocks:  # op by op (the fused blocks call their own attention)
            x, r = blk(x, r, o, b, t)
        from kernellab.models.gpt import _ln_add_ops

        x = o["ln"](x, m.lnf_w, m.lnf_b) if r is None else _ln_add_ops(o, x, r, m.lnf_w, m.lnf_b)[0]
        return o["linear"](x, m.wte)

    def _hf_logits(self, idx, pos):
        return self.model.hf(input_ids=idx, position_ids=pos.unsqueeze(0).expand(idx.shape[0], -1)).logits


def _full_causal(cfg) -> bool:
    if getattr(cfg, "model_type", "") == "llama":
        return True
    return getattr(cfg, "model_type", "") == "qwen2" and not getattr(cfg, "use_sliding_window", False)


def all_reduce_grads(module: nn.Module, group=None) -> None:
    """Sum every parameter's gradient over ``group``, in one flat buffer per dtype."""
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return
    by_dtype: dict = {}
    for p in module.parameters():
        if p.grad is not None:
            by_dtype.setdefault(p.grad.dtype, []).append(p.grad)
    for grads in by_dtype.values():
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=group)
        off = 0
        for g in grads:
            g.copy_(flat[off : off + g.numel()].view_as(g))
            off += g.numel()


class CPTrainer:
    """kernellab.models.gpt.Trainer's step with the gradients summed over the CP group
    between backward and the optimizer step; ``step`` returns the global mean loss."""

    def __init__(self, module: ContextParallel, lr: float = 3e-4, optimizer: str = "pytorch"):
        from kernellab.models import gpt

        self.module = module
        self.inner = gpt.Trainer(module, "eager", lr, optimizer)
        self.opt = self.inner.opt

    def step(self, idx, targets) -> torch.Tensor:
        loss = self.module(idx, targets)
        loss.backward()
        all_reduce_grads(self.module, self.module.group)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        loss = loss.detach().clone()
        if self.module.world > 1:
            dist.all_reduce(loss, group=self.module.group)
        return loss


def train(config="tiny", backends="pytorch", matmul="pytorch", mode="eager", batch_size=1, seq_len=None,
          steps=10, dtype="fp32", data=None, device=None, seed=0, lr=3e-4, optimizer="pytorch",
          layout="zigzag", cp=None, on_step=None):  # fmt: skip
    """Context-parallel training on every rank of the default process group (made by
    ``data_parallel.init`` where there is none): the same ``batch_size`` x ``seq_len``
    batch on every rank (one generator, one seed), each rank training on its shard.
    ``cp``: the context-parallel size, which must equal the world size (None: the world
    size). Returns data_parallel.Result (global_batch = batch_size: the rows are not
    split; tokens/s counts every token once)."""
    from kernellab.distributed import data_parallel as D
    from kernellab.models import gpt, text

    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    world = dist.get_world_size() if dist.is_initialized() else int(os.environ.get("WORLD_SIZE", "1"))
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    model_ctx = _ctx_of(config)
    seq_len = seq_len or model_ctx
    check(config, world, cp, seq_len, layout, mode)  # before any process group or model exists
    if model_ctx is not None and seq_len > model_ctx:
        raise ValueError(f"seq_len must be in [1, {model_ctx}] for config {config!r}, got {seq_len}")
    rank = D.init(device)
    model, _ = D.build_model(config, backends, matmul, rank.device, gpt._dtype(dtype), seed)
    module = ContextParallel(model, None, layout)
    trainer = CPTrainer(module, lr, optimizer)
    corpus = text.ByteData(text.load_corpus(data), rank.device)
    gen = torch.Generator(device=rank.device).manual_seed(seed)
    if rank.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(rank.device)
    losses, times = [], []
    for i in range(steps):
        idx, tgt = corpus.batch(batch_size, seq_len, gen)  # the same batch on every rank
        idx_l, tgt_l, _ = cp_batch(idx, tgt, rank.rank, rank.world, layout)
        t0 = time.perf_counter()
        loss = float(trainer.step(idx_l, tgt_l))
        ms = (time.perf_counter() - t0) * 1e3
        losses.append(loss)
        times.append(ms)
        if on_step is not None:
            on_step(i, loss, ms)
    res = D.Result(losses, times, rank, batch_size, batch_size, seq_len, module, D.peak_gib_per_rank(rank))
    res.extra.update(layout=layout, cp=rank.world)
    return res


def _ctx_of(config) -> int | None:
    """The context of kernellab's GPT config (None for Hugging Face models: their configs
    allow far more than a CPU test uses)."""
    from kernellab.models import gpt

    return gpt.CONFIGS[config].ctx if config in gpt.CONFIGS else None


# --------------------------------------------------------------------------- command line


def cli_train(args, console, progress, kw: dict) -> int:
    """``kernellab train gpt | hf ... --nproc N --dp cp``: checks the arguments on the
    launcher (and again on each rank), then runs under torchrun as data parallel does."""
    from kernellab.distributed import data_parallel as D

    if args.compare:
        raise ValueError("--compare times one GPU's op sets; it takes no --nproc or --dp")
    if args.global_batch is not None:
        raise ValueError("global_batch: context parallel does not split rows; use --batch-size")
    if args.nproc is not None and (isinstance(args.nproc, bool) or args.nproc < 1):
        raise ValueError(f"nproc must be >= 1, got {args.nproc}")
    world = int(os.environ["WORLD_SIZE"]) if D.launched() else (args.nproc or 1)
    if D.launched() and args.nproc is not None and args.nproc != world:
        raise ValueError(f"nproc {args.nproc} differs from torchrun's WORLD_SIZE {world}")
    check(kw["config"], world, None, kw["seq_len"], "zigzag", kw["mode"])
    if not D.launched() and world > 1:
        if torch.cuda.is_available() and torch.cuda.device_count() < world:
            raise ValueError(
                f"nproc {world}: this machine has {torch.cuda.device_count()} GPUs (a rank per GPU)"
            )
        console.print(f"context parallel: {world} ranks under torchrun", highlight=False)
        return D.launch(world, args._argv)
    lead = not D.launched() or int(os.environ.get("RANK", "0")) == 0
    keep = ("config", "backends", "matmul", "mode", "batch_size", "seq_len", "steps", "dtype", "data", "lr",
            "optimizer")  # fmt: skip
    kw = {k: v for k, v in kw.items() if k in keep}
    try:
        res = train(**kw)
        if lead:
            r = res.rank
            peak = "" if res.peak_gib is None else f"; peak memory per rank {res.peak_gib} GiB"
            console.print(
                f"{kw['config']} context parallel (zigzag) x {r.world} ({kw['dtype']}, {r.backend}): "
                f"loss {res.losses[0]:.3f} -> {res.losses[-1]:.3f} over {len(res.losses)} steps; "
                f"{res.global_batch} x {res.seq_len} tokens ({res.seq_len // r.world} per rank); "
                f"{res.tokens_per_s:,.0f} tok/s, all ranks (median step){peak}",
                highlight=False,
            )
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0
