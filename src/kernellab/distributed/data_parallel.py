"""Data-parallel training on torch.distributed: DDP or FSDP2 (issue 44), for kernellab's GPT
and Hugging Face causal LMs.

Every rank runs the same training engine (``kernellab.models.gpt.Trainer``: the model, its
op set, the mode, PyTorch's or kernellab's AdamW) on its own rows of each global batch:

- ``ddp``: PyTorch's DistributedDataParallel. Each rank holds the whole model; gradients
  are averaged by all-reduce in 25 MB buckets, each bucket launched as soon as the
  backward has produced all of its gradients, so communication overlaps the rest of the
  backward (``gradient_as_bucket_view``: the gradients ARE the buckets, no copy). The GPT's
  fused blocks return every block's gradients from one autograd node at once, so those
  buckets overlap only the embedding's backward: at GPT-2 size the all-reduce moves
  248 MB (bf16) per step, ~1 ms at NVLink's ~400 GB/s of bus bandwidth, against ~36 ms of
  compute for 16 x 1024 tokens per GPU (2 x an H100's 17.8 ms at 8 x 1024): ~3% exposed.
- ``fsdp2``: ``torch.distributed.fsdp.fully_shard`` (FSDP2, ZeRO-3). Parameters, gradients
  and AdamW's moments are sharded along dim 0 (DTensors); each block is a unit of its own,
  all-gathered before its forward and again before its backward (the next block's
  all-gather prefetched while this one computes), its gradients reduce-scattered as its
  backward ends. A unit must be a module call, so the GPT runs its op-by-op path under
  FSDP2 (``model.fuse = False``: the fused path reads every block's parameters in one node,
  which would need them all gathered at once).
- ``fsdp2-model``: ``fully_shard`` on the whole model as one unit. Parameters, gradients and
  AdamW's moments are sharded at rest as under ``fsdp2``, but the whole model is gathered
  once per step (before the forward; the root unit stays gathered through the backward) and
  its gradients reduce-scattered once at the end: the memory of one unsharded copy of the
  parameters during the step, one collective each way per step, and the GPT keeps its fused
  blocks and their CUDA graphs. For models whose parameters fit unsharded (GPT-2 small's
  are 248 MB in bf16) it costs the least host time per step.

Data: all ranks draw the same global batch (one generator, one seed) and each takes its
``global_batch / world`` rows: the union of the shards is exactly the batch one process
draws, so the losses and the parameters equal one GPU's at the same global batch (to fp32
reduction order: tests/distributed/test_data_parallel.py). The logged loss is the mean of
the ranks' losses (equal shards: the global batch's mean).

Launch (NCCL on GPUs, with ``NCCL_NVLS_ENABLE=0``: NVLink multicast off; gloo on the CPU):

    kernellab train gpt --nproc 4 --dp ddp --global-batch 32    # re-runs itself under torchrun
    torchrun --nproc_per_node=4 -m kernellab train gpt --dp fsdp2  # or under torchrun directly

``--nproc N`` checks the arguments once, then runs the same command line as N ranks
through torchrun's own launcher (``launch``: torch.distributed.run, standalone: a free
port, its own rendezvous, one process per GPU, a failed rank ends the others), called
in-process so the command's options never meet torchrun's parser; ``--nproc 1`` runs
in-process on a one-rank group (the same code path, no port).
"""

from __future__ import annotations

import datetime
import os
import statistics
import sys
import time
import warnings
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

DP = ("ddp", "fsdp2", "fsdp2-model")
# A CUDA graph of the step (compile-cudagraphs, compile-step-graph) would capture the
# gradient collectives the wrappers launch from hooks: not supported.
MODES = ("eager", "compile")


@dataclass(frozen=True)
class Rank:
    rank: int
    world: int
    local_rank: int
    device: torch.device
    backend: str  # "nccl" or "gloo"


def launched() -> bool:
    """Whether this process is a rank started by torchrun (it sets these variables)."""
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


def child_env(env: dict | None = None) -> dict:
    """An environment for rank processes: ``env`` (default: this one) with NCCL's NVLink
    multicast (NVLS) off: NCCL_NVLS_ENABLE=0."""
    out = dict(os.environ if env is None else env)
    out["NCCL_NVLS_ENABLE"] = "0"
    return out


def init(device: str | None = None, timeout_s: float = 600.0) -> Rank:
    """This process's rank, initialising the default process group where there is none:
    from torchrun's environment (env://), or a one-rank group on an in-memory store when
    not launched. NCCL on a GPU (``device`` None: a GPU where there is one), gloo on the
    CPU."""
    os.environ["NCCL_NVLS_ENABLE"] = "0"  # before any NCCL communicator exists
    if dist.is_initialized():
        backend = str(dist.get_backend())
        rank, world = dist.get_rank(), dist.get_world_size()
        local = int(os.environ.get("LOCAL_RANK", rank % max(torch.cuda.device_count(), 1)))
        dev = torch.device("cuda", local) if backend == "nccl" else torch.device("cpu")
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        return Rank(rank, world, local, dev, backend)
    cuda = str(device).startswith("cuda") if device is not None else torch.cuda.is_available()
    if cuda and not torch.cuda.is_available():
        raise ValueError("device: cuda asked for, but torch.cuda.is_available() is False")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    kw: dict = {"timeout": datetime.timedelta(seconds=timeout_s)}
    if world == 1 and "MASTER_ADDR" not in os.environ:  # alone: no port, no rendezvous
        kw.update(store=dist.HashStore(), rank=0, world_size=1)
    if cuda:
        if local >= torch.cuda.device_count():
            raise ValueError(f"LOCAL_RANK {local}: this machine has {torch.cuda.device_count()} GPUs")
        dev = torch.device("cuda", local)
        torch.cuda.set_device(dev)
        try:
            dist.init_process_group("nccl", device_id=dev, **kw)
        except TypeError:  # torch without device_id
            dist.init_process_group("nccl", **kw)
        return Rank(rank, world, local, dev, "nccl")
    dist.init_process_group("gloo", **kw)
    return Rank(rank, world, local, torch.device("cpu"), "gloo")


def check(dp: str, world: int, batch_size: int | None = None, global_batch: int | None = None,
          mode: str = "eager") -> tuple[int, int]:  # fmt: skip
    """(rows per rank, global batch) of a data-parallel run, or a ValueError naming the
    argument. Every rank calls it with the same arguments before any collective, so a bad
    argument is refused on every rank alike (no rank left waiting in a collective).
    ``global_batch`` given: split over the ranks (the same batch one GPU would train on);
    else each rank takes ``batch_size`` rows."""
    if dp not in DP:
        raise ValueError(f"dp: unknown {dp!r}; data parallel is one of {', '.join(DP)}")
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise ValueError(f"world size (nproc) must be an integer >= 1, got {world!r}")
    if mode not in MODES:
        raise ValueError(f"mode: {mode!r} does not run data parallel; modes: {', '.join(MODES)} "
                         "(a CUDA graph of the step would capture the gradient collectives)")  # fmt: skip
    if global_batch is not None:
        if isinstance(global_batch, bool) or not isinstance(global_batch, int) or global_batch < 1:
            raise ValueError(f"global_batch must be an integer >= 1, got {global_batch!r}")
        if global_batch % world:
            raise ValueError(f"global_batch {global_batch} is not divisible by the world size {world}: "
                             f"each rank trains on global_batch / {world} rows")  # fmt: skip
        return global_batch // world, global_batch
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    return batch_size, batch_size * world


def _fully_shard():
    try:
        from torch.distributed.fsdp import fully_shard  # torch >= 2.6
    except ImportError:  # torch 2.4-2.5
        from torch.distributed._composable.fsdp import fully_shard
    return fully_shard


def units(model: nn.Module) -> list[nn.Module]:
    """The modules FSDP2 shards as units of their own (then the root takes the rest): the
    first list of blocks in ``model`` (the GPT's ``blocks``, a Hugging Face decoder's
    ``layers`` or GPT-2's ``h``)."""
    for name, mod in model.named_modules():
        if isinstance(mod, nn.ModuleList) and name.rsplit(".", 1)[-1] in ("blocks", "layers", "h"):
            return list(mod)
    return []


class CausalLM(nn.Module):
    """A Hugging Face causal LM as the training engine's model: ``forward(idx, targets)``
    -> mean cross-entropy of next-token prediction (targets already shifted, as
    ``kernellab.models.text`` draws them), computed in fp32."""

    def __init__(self, hf: nn.Module):
        super().__init__()
        self.hf = hf

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.hf(input_ids=idx).logits
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


# Hugging Face models `train` builds from configs (kernellab.models.user_models.HF_SIZES;
# ":small" the CPU smoke size); no weights are downloaded
HF_MODELS = ("hf-llama", "hf-qwen2", "hf-mistral", "hf-gemma2", "hf-gpt2", "hf-phi")


def build_model(config="tiny", backends="pytorch", matmul="pytorch", device=None, dtype=torch.float32,
                seed=0):  # fmt: skip
    """(model, context length): kernellab's GPT (``gpt.make``), or a Hugging Face model
    ``"hf-llama"`` / ``"hf-llama:small"`` (HF_MODELS) from ``seed`` as ``CausalLM`` (its
    ops PyTorch's for ``backends`` "pytorch", else put in by ``kernellab.patch`` with
    that backend, None: kernellab's choice)."""
    from kernellab.models import gpt

    name, _, size = str(config).partition(":")
    if name not in HF_MODELS:
        model = gpt.make(config, backends, matmul, device, dtype, seed)
        return model, model.cfg.ctx
    if size not in ("", "small"):
        raise ValueError(f"config: {config!r}; a Hugging Face model is NAME or NAME:small")
    from kernellab.models import user_models

    torch.manual_seed(seed)
    with torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu")):
        hf = user_models.hf_model(name, size == "small")
    hf = hf.to(dtype)
    if backends != "pytorch":
        import kernellab

        kernellab.patch(hf, backend=backends, verbose=False)
    cfg = hf.config
    ctx = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None) or 2048
    return CausalLM(hf), ctx


def wrap(model: nn.Module, dp: str, rank: Rank, block_groups: int | None = None, **options) -> nn.Module:
    """The module each rank calls: ``model`` under DDP, or ``model`` itself sharded in
    place by FSDP2 (its parameters become DTensors; under ``fsdp2`` the GPT's fused path is
    turned off, see the module docstring). ``block_groups`` (DDP, the GPT's fused path): its blocks as
    that many autograd nodes (``GPT.block_groups``), so the all-reduce of the later
    groups' gradients overlaps the earlier groups' backward. ``options`` go to
    DistributedDataParallel (``bucket_cap_mb``, ``static_graph``, ...) or to every
    ``fully_shard`` call (``reshard_after_forward``, ``mp_policy``, ...)."""
    if dp not in DP:
        raise ValueError(f"dp: unknown {dp!r}; data parallel is one of {', '.join(DP)}")
    if block_groups is not None:
        if dp != "ddp" or not hasattr(model, "block_groups"):
            raise ValueError("block_groups: for DDP around kernellab's GPT only")
        if isinstance(block_groups, bool) or not isinstance(block_groups, int) or block_groups < 1:
            raise ValueError(f"block_groups must be an integer >= 1, got {block_groups!r}")
        model.block_groups = block_groups
    if dp == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        ids = [rank.device.index] if rank.device.type == "cuda" else None
        return DDP(model, device_ids=ids, **{"gradient_as_bucket_view": True, **options})
    fully_shard = _fully_shard()
    if rank.world > 1:  # DDP broadcasts rank 0's weights; FSDP2 shards what each rank holds
        with torch.no_grad():
            for t in model.state_dict().values():
                dist.broadcast(t, 0)
    if dp == "fsdp2-model":
        fully_shard(model, **options)
        return model
    if hasattr(model, "fuse"):  # kernellab's GPT
        model.fuse = False
        # FSDP2 warns that a block returns a view (its last linear's output, reshaped): an
        # in-place op on it would skip the pre-backward all-gather. The next block and the
        # final norm read it out of place only.
        warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    for unit in units(model):
        fully_shard(unit, **options)
    fully_shard(model, **options)
    return model


def inner(module: nn.Module) -> nn.Module:
    """The model inside a DDP wrapper (FSDP2 shards the model itself)."""
    return getattr(module, "module", module)


def full_state(module: nn.Module) -> dict:
    """name -> the whole parameter on every rank (DTensors all-gathered: a collective, so
    every rank calls it), detached, on the CPU."""
    from kernellab.optim import _dtensor_type

    dtensor = _dtensor_type()
    out = {}
    for name, p in inner(module).named_parameters():
        t = p.full_tensor() if dtensor is not None and isinstance(p, dtensor) else p
        out[name] = t.detach().cpu().clone()
    return out


def global_mean(x: torch.Tensor) -> float:
    """The mean over ranks of a scalar (a collective: every rank calls it)."""
    t = x.detach().float().reshape(1).clone()
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t)
        t /= dist.get_world_size()
    return float(t)


def peak_gib_per_rank(rank: Rank) -> list[float] | None:
    """Each rank's peak allocated GPU memory (GiB) since the last reset, on every rank;
    None on the CPU."""
    if rank.device.type != "cuda":
        return None
    mine = torch.cuda.max_memory_allocated(rank.device) / 2**30
    out: list = [None] * rank.world
    dist.all_gather_object(out, round(mine, 3))
    return out


@dataclass
class Result:
    losses: list[float]  # per step, the mean over ranks
    ms: list[float]  # per step, host-timed on this rank (the step and the loss's all-reduce)
    rank: Rank
    local_batch: int
    global_batch: int
    seq_len: int
    module: nn.Module
    peak_gib: list[float] | None = None  # per rank (GPU)
    extra: dict = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        """Tokens per second of all ranks together, at the median step."""
        later = self.ms[1:] or self.ms  # the first step compiles and allocates
        return self.global_batch * self.seq_len / statistics.median(later) * 1e3


def train(
    config="tiny",
    backends="pytorch",
    matmul="pytorch",
    mode="eager",
    dp="ddp",
    batch_size=8,
    global_batch=None,
    seq_len=None,
    steps=20,
    dtype="fp32",
    data=None,
    device=None,
    seed=0,
    lr=3e-4,
    optimizer="pytorch",
    on_step=None,
    block_groups=None,
) -> Result:
    """``kernellab.models.gpt.train`` on every rank of the default process group (made by
    ``init`` where there is none): the same model (``build_model``: the GPT or a Hugging
    Face model), op set, mode and optimizer, wrapped by ``dp``; ``batch_size`` rows per
    rank, or ``global_batch`` split over the ranks; ``block_groups``: see ``wrap``.
    ``on_step(i, loss, ms)`` is called on every rank after each step with the loss
    averaged over ranks."""
    from kernellab.models import gpt, text

    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    # refused before any process group or model exists
    check(dp, dist.get_world_size() if dist.is_initialized() else int(os.environ.get("WORLD_SIZE", "1")),
          batch_size, global_batch, mode)  # fmt: skip
    rank = init(device)
    local_b, global_b = check(dp, rank.world, batch_size, global_batch, mode)
    model, ctx = build_model(config, backends, matmul, rank.device, gpt._dtype(dtype), seed)
    seq_len = seq_len or ctx
    if not 1 <= seq_len <= ctx:
        raise ValueError(f"seq_len must be in [1, {ctx}] for config {config!r}, got {seq_len}")
    corpus = text.ByteData(text.load_corpus(data), rank.device)
    gen = torch.Generator(device=rank.device).manual_seed(seed)
    module = wrap(model, dp, rank, block_groups)
    trainer = gpt.Trainer(module, mode, lr, optimizer)
    if rank.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(rank.device)
    lo = rank.rank * local_b
    losses, times = [], []
    for i in range(steps):
        idx, tgt = corpus.batch(global_b, seq_len, gen)  # the same global batch on every rank
        t0 = time.perf_counter()
        loss = global_mean(trainer.step(idx[lo : lo + local_b], tgt[lo : lo + local_b]))
        ms = (time.perf_counter() - t0) * 1e3
        losses.append(loss)
        times.append(ms)
        if on_step is not None:
            on_step(i, loss, ms)
    return Result(losses, times, rank, local_b, global_b, seq_len, module, peak_gib_per_rank(rank))


def time_steps(trainer, batch, rank: Rank, warmup: int = 3, steps: int = 10, rounds: int = 3) -> dict:
    """ms per data-parallel step: ``rounds`` rounds of ``steps`` steps, each round between
    two device syncs and a collective (so the ranks start together), the slowest rank's
    time per round, median round; plus each rank's peak memory."""
    cuda = rank.device.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(rank.device)) if cuda else (lambda: None)

    def together():
        sync()
        if rank.world > 1:
            t = torch.zeros(1, device=rank.device)
            dist.all_reduce(t)
            sync()

    if cuda:
        torch.cuda.reset_peak_memory_stats(rank.device)
    t0 = time.perf_counter()
    for _ in range(warmup):
        loss = trainer.step(*batch)
    first = global_mean(loss)
    together()
    warm = time.perf_counter() - t0
    times = []
    for _ in range(rounds):
        together()
        t0 = time.perf_counter()
        for _ in range(steps):
            trainer.step(*batch)
        sync()
        t = torch.tensor([(time.perf_counter() - t0) / steps * 1e3], device=rank.device)
        if rank.world > 1:
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
        times.append(float(t))
    return {"ms_per_step": statistics.median(times), "ms_min": min(times), "ms_max": max(times),
            "rounds_ms": [round(v, 3) for v in times], "warmup_s": round(warm, 2), "loss": first,
            "peak_gib": peak_gib_per_rank(rank)}  # fmt: skip


# --------------------------------------------------------------------------- command line


def launch(nproc: int, argv: list[str], module: str | None = "kernellab") -> int:
    """Runs ``python -m <module> *argv`` (``module`` None: ``python *argv``, argv[0] a
    script) as ``nproc`` ranks through torchrun's own launcher
    (``torch.distributed.run``, standalone: its rendezvous on a free local port, one
    process per rank with RANK / WORLD_SIZE / LOCAL_RANK set, the others ended when one
    fails), called in-process so ``argv`` never meets torchrun's option parser. Returns 0,
    or the first failed rank's exit status."""
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"nproc must be an integer >= 1, got {nproc!r}")
    argv = list(argv)
    head = ["-m", module] if module is not None else [argv.pop(0)]
    ns = torchrun.get_args_parser().parse_args(["--standalone", f"--nproc_per_node={nproc}", *head])
    ns.training_script_args = argv
    os.environ.update(child_env())  # the ranks inherit the launcher's environment
    try:
        torchrun.run(ns)
    except ChildFailedError as e:
        codes = {r: f.exitcode for r, f in sorted(e.failures.items())}
        print(f"data parallel: ranks failed (rank: exit status) {codes}", file=sys.stderr)
        return next((c for c in codes.values() if c), 1)
    return 0


def asked(args) -> bool:
    """Whether a ``kernellab train`` command line asks for data parallel."""
    return args.nproc is not None or args.dp is not None or args.global_batch is not None or launched()


def hf_train_kw(args, configs) -> dict:
    """``train``'s arguments for ``kernellab train hf --config NAME --nproc N ...``: the
    config's full size on a GPU (bf16; 2 rows x 2048 tokens per rank), its small size on the
    CPU (fp32, 32 tokens); ``--variants`` hf (as is) or kernellab (kernellab.patch)."""
    gpu = torch.cuda.is_available()
    config, variant = args.config or "llama", args.variants or "hf"
    if config not in configs:
        raise ValueError(f"config: {config!r}; train hf takes {', '.join(configs)}")
    if variant not in ("hf", "kernellab"):
        raise ValueError(f"variants: data parallel trains one variant, hf or kernellab; got {variant!r}")
    return dict(config=f"hf-{config}" + ("" if gpu else ":small"), mode=args.mode or "eager",
                backends="pytorch" if variant == "hf" else None, batch_size=args.batch_size or 2,
                seq_len=args.seq_len or (2048 if gpu else 32), steps=args.steps, lr=args.lr,
                dtype=args.dtype or ("bf16" if gpu else "fp32"), optimizer="pytorch")  # fmt: skip


def cli_train(args, console, progress, kw: dict) -> int:
    """``kernellab train gpt | hf ... --nproc N / --dp / --global-batch``: the CLI calls it
    with ``train``'s keyword arguments resolved (``kw``: config, seq_len, ...); checks the
    arguments, then re-runs the command under torchrun (``--nproc`` > 1, not launched yet)
    or trains on this rank."""
    dp = args.dp or "ddp"
    if dp == "cp":  # (the CLI hands --dp cp to kernellab.distributed.context_parallel)
        raise ValueError("dp: 'cp' trains through kernellab.distributed.context_parallel.cli_train")
    if args.compare:
        raise ValueError("--compare times one GPU's op sets; it takes no --nproc, --dp or --global-batch")
    if args.nproc is not None and (isinstance(args.nproc, bool) or args.nproc < 1):
        raise ValueError(f"nproc must be >= 1, got {args.nproc}")
    world = int(os.environ["WORLD_SIZE"]) if launched() else (args.nproc or 1)
    if launched() and args.nproc is not None and args.nproc != world:
        raise ValueError(f"nproc {args.nproc} differs from torchrun's WORLD_SIZE {world}")
    check(dp, world, kw["batch_size"], args.global_batch, kw["mode"])
    if not launched() and world > 1:
        if torch.cuda.is_available() and torch.cuda.device_count() < world:
            n = torch.cuda.device_count()
            raise ValueError(f"nproc {world}: this machine has {n} GPUs (a rank per GPU)")
        console.print(f"data parallel: {world} ranks ({dp}) under torchrun", highlight=False)
        return launch(world, args._argv)
    lead = not launched() or int(os.environ.get("RANK", "0")) == 0
    try:
        res = _run_rank(dp, args.global_batch, kw, world, progress if lead else None)
        if lead:
            r = res.rank
            peak = "" if res.peak_gib is None else f"; peak memory per rank {res.peak_gib} GiB"
            console.print(
                f"{kw['config']} data parallel {dp} x {r.world} ({kw['mode']}, {kw['dtype']}, {r.backend}): "
                f"loss {res.losses[0]:.3f} -> {res.losses[-1]:.3f} over {len(res.losses)} steps; "
                f"global batch {res.global_batch} ({res.local_batch} per rank) x {res.seq_len}; "
                f"{res.tokens_per_s:,.0f} tok/s, all ranks (median step){peak}",
                highlight=False,
            )
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


def _run_rank(dp, global_batch, kw, world, progress):
    """This rank's training run; ``progress`` (the lead rank's): a progress bar."""
    if progress is None:
        return train(dp=dp, global_batch=global_batch, **kw)
    toks = (global_batch or kw["batch_size"] * world) * kw["seq_len"]
    with progress() as prog:
        task = prog.add_task(f"train {kw['config']} ({dp} x {world})", total=kw["steps"])

        def on_step(i, loss, ms):
            desc = f"loss {loss:.3f}  {toks / ms * 1e3:,.0f} tok/s  {ms:.1f} ms/step"
            prog.update(task, advance=1, description=desc)

        return train(dp=dp, global_batch=global_batch, on_step=on_step, **kw)
