"""Context-parallel Llama training step on a lent machine: kernellab's ring attention in the
step against PyTorch's own context parallel (issue 44).

    python lab/gpu_cp_step.py --out $OUT [--nproc N] [--seq S]
    torchrun --nproc_per_node=N lab/gpu_cp_step.py --out $OUT    # the W=N stage alone
    python lab/gpu_cp_step.py --out /tmp/cp --dry                  # CPU, gloo, 2 ranks: plumbing

Run plainly, the script launches itself through torchrun's launcher
(``kernellab.distributed.data_parallel.launch``: NCCL, NCCL_NVLS_ENABLE=0): one rank at a
short sequence (8k), then N ranks (default: every GPU) at the long one, and prints the
table last. Every case is caught on its own (a case failing on every rank alike gives an
error row).

The model: Llama-shaped (transformers' LlamaForCausalLM from a config, no weights): hidden
2048, 16 layers, 32 query / 8 KV heads of 64, MLP 8192, vocab 32000 (Llama-2's: a 128k
vocabulary's fp32 logits alone would be 16 GiB at 32k tokens per GPU), bf16 parameters,
PyTorch's AdamW. One row of --seq tokens per step (default: 32k at W=2, 64k at W>=4,
8k at W=1), the same row on every rank, each rank training on its S / W tokens.

Cases:
- ``kl-ring``: kernellab.distributed.context_parallel (zigzag shards, global RoPE
  positions, ring attention with its default blocks (cuDNN's kernels on a GPU, the ones
  PyTorch's own context parallel runs), loss = sum / global token count, gradients
  all-reduced);
- ``kl-ring-triton``: the same with the ring's blocks on kernellab's Triton kernels;
- ``torch-cp``: the same model and step under
  ``torch.distributed.tensor.experimental.context_parallel`` (its load-balanced shards of
  input ids, labels and position ids; its ring under F.scaled_dot_product_attention,
  which needs CUDA's SDPA kernels); a missing API is reported in the row, not a crash;
- ``check`` (W > 1): the small Llama in fp32, 3 steps at 64 tokens, kl-ring against one
  process on the full sequence (max relative loss difference; target <= 1e-4).

Per case: ms per step (median of --rounds rounds of --steps steps, the slowest rank),
tokens/s (the sequence's tokens once, all ranks together), each rank's peak memory, the
losses of the timed steps (fresh batches: the loss falls). Rows -> $OUT/cp_step.jsonl.
Expected runtime on H200s: ~2-3 minutes.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from kernellab.distributed import context_parallel as CP  # noqa: E402
from kernellab.distributed import data_parallel as D  # noqa: E402
from kernellab.harness.bench import git_sha, versions  # noqa: E402
from kernellab.harness.results import FIELDS  # noqa: E402

ROWS = "cp_step.jsonl"
LLAMA = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
             num_key_value_heads=8, vocab_size=32000, max_position_embeddings=131072,
             tie_word_embeddings=False)  # fmt: skip
SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=256)  # fmt: skip


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="directory for cp_step.jsonl")
    p.add_argument("--nproc", type=int, default=None, help="ranks of the W=N stage (default: every GPU)")
    p.add_argument("--seq", type=int, default=None, help="tokens per sequence at W=N (default 32k / 64k)")
    p.add_argument("--seq1", type=int, default=8192, help="tokens per sequence at W=1 (default 8192)")
    p.add_argument("--steps", type=int, default=4, help="timed steps per round")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--dry", action="store_true", help="CPU, gloo, the small Llama, 2 ranks")
    p.add_argument("--stage", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.dry:
        a.seq1, a.steps, a.rounds, a.warmup = 32, 2, 1, 1
        a.seq = a.seq or 64
        a.nproc = a.nproc or 2
    return a


# --------------------------------------------------------------------------- one stage (every rank)


def _model(a, rank, small=False):
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.LlamaConfig(**(SMALL if small or a.dry else LLAMA))
    with torch.device(rank.device):
        hf = tf.LlamaForCausalLM(cfg)
    dtype = torch.float32 if small or a.dry else torch.bfloat16
    return D.CausalLM(hf.to(dtype))


def _batches(a, rank, seq, n):
    from kernellab.models import text

    corpus = text.ByteData(text.load_corpus(), rank.device)
    gen = torch.Generator(device=rank.device).manual_seed(0)
    return [corpus.batch(1, seq, gen) for _ in range(n)]


def _sdpa_causal(module, q, k, v, mask, dropout=0.0, scaling=None, **kw):
    """transformers' attention interface on plain causal SDPA (no mask tensor: PyTorch's
    context parallel rings is_causal SDPA only); K/V heads repeated for GQA."""
    g = q.shape[1] // k.shape[1]
    if g > 1:
        k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling)
    return o.transpose(1, 2).contiguous(), None


def _torch_cp_step(a, rank, model, opt):
    """One step function under PyTorch's context parallel, or an exception saying what is
    missing."""
    if rank.device.type != "cuda":
        raise RuntimeError("torch-cp: needs CUDA SDPA (skipped on the CPU)")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel  # torch >= 2.7
    from transformers import AttentionInterface

    AttentionInterface.register("kl_causal_sdpa", _sdpa_causal)
    model.hf.config._attn_implementation = "kl_causal_sdpa"  # no mask built: not in the mask mapping
    mesh = init_device_mesh("cuda", (rank.world,), mesh_dim_names=("cp",))

    def step(idx, tgt):
        pos = torch.arange(idx.shape[1], device=idx.device).unsqueeze(0)
        idx, tgt = idx.clone(), tgt.clone()
        bufs = [idx, tgt, pos]
        with context_parallel(mesh, buffers=bufs, buffer_seq_dims=[1, 1, 1], no_restore_buffers=set(bufs)):
            logits = model.hf(input_ids=idx, position_ids=pos).logits
            # equal shards, no ignored tokens: the global mean is the mean of the ranks' means
            loss = F.cross_entropy(logits.flatten(0, 1).float(), tgt.flatten()) / rank.world
            loss.backward()
        CP.all_reduce_grads(model)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss = loss.detach()
        if rank.world > 1:
            dist.all_reduce(loss)
        return loss

    return step


def _timed(name, a, rank, seq):
    model = _model(a, rank)
    if rank.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(rank.device)
    if name.startswith("kl-ring"):
        blocks = "triton" if name == "kl-ring-triton" else None
        module = CP.ContextParallel(model, None, "zigzag", blocks=blocks)
        trainer = CP.CPTrainer(module)

        def step(idx, tgt):
            i, t, _ = CP.cp_batch(idx, tgt, rank.rank, rank.world, "zigzag")
            return trainer.step(i, t)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=rank.device.type == "cuda")
        step = _torch_cp_step(a, rank, model, opt)
    cuda = rank.device.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(rank.device)) if cuda else (lambda: None)
    batches = _batches(a, rank, seq, a.warmup + a.rounds * a.steps)
    losses, times = [], []
    t0 = time.perf_counter()
    for b in batches[: a.warmup]:
        losses.append(float(step(*b)))
    warm = time.perf_counter() - t0
    for r in range(a.rounds):
        sync()
        if rank.world > 1:
            dist.barrier()
        t0 = time.perf_counter()
        chunk = batches[a.warmup + r * a.steps : a.warmup + (r + 1) * a.steps]
        outs = [step(*b) for b in chunk]
        sync()
        t = torch.tensor([(time.perf_counter() - t0) / len(chunk) * 1e3], device=rank.device)
        if rank.world > 1:
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
        times.append(float(t))
        losses += [float(x) for x in outs]
    ms = statistics.median(times)
    return {"ms_per_step": round(ms, 2), "tokens_per_s": round(seq / ms * 1e3), "rounds_ms": times,
            "warmup_s": round(warm, 2), "losses": [round(x, 4) for x in losses],
            "loss_fell": losses[-1] < losses[0], "peak_gib": D.peak_gib_per_rank(rank),
            "tokens_per_rank": seq // rank.world}  # fmt: skip


def _check(a, rank):
    """The small fp32 Llama: kl-ring at W ranks against one process on the full sequence."""
    from kernellab.models import gpt

    seq = 64
    batches = _batches(a, rank, seq, 3)
    ref_model = _model(a, rank, small=True)
    ref = gpt.Trainer(ref_model, "eager", 3e-4, "pytorch")
    want = [float(ref.step(*b)) for b in batches]
    trainer = CP.CPTrainer(CP.ContextParallel(_model(a, rank, small=True), None, "zigzag"))
    got = [float(trainer.step(*CP.cp_batch(*b, rank.rank, rank.world)[:2])) for b in batches]
    rel = max(abs(x - y) / abs(y) for x, y in zip(got, want))
    return {"max_rel_loss_diff": rel, "ok": rel <= 1e-4, "losses": got, "losses_single": want}


def _agree(ok: bool, rank) -> bool:
    if rank.world == 1:
        return ok
    t = torch.tensor([1.0 if ok else 0.0], device=rank.device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def run_stage(a) -> int:
    import os

    rank = D.init("cpu" if a.dry else None, timeout_s=300)
    w = rank.world
    seq = a.seq1 if w == 1 else (a.seq or (65536 if w >= 4 else 32768))
    cases = ["kl-ring", "kl-ring-triton", "torch-cp"] + (["check"] if w > 1 else [])
    meta = {"gpu": torch.cuda.get_device_name(rank.device) if rank.device.type == "cuda" else "cpu",
            "git_sha": git_sha(), **versions(), "backend_dist": rank.backend,
            "nccl_nvls_enable": os.environ.get("NCCL_NVLS_ENABLE"),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S")}  # fmt: skip
    for name in cases:
        row = {"op": "llama_train_cp", "backend": name, "mode": "eager", "world": w, "shape": [1, seq],
               "dtype": "fp32" if a.dry else "bf16", **meta}  # fmt: skip
        err = None
        try:
            if name == "check":
                row.update(kind="check", **_check(a, rank))
            else:
                row.update(kind="timed", **_timed(name, a, rank, seq))
        except Exception as e:  # noqa: BLE001 - reported in its row
            err = f"{type(e).__name__}: {e}"[:400]
        if not _agree(err is None, rank):
            err = err or "another rank failed"
        row["status"] = "ok" if err is None else "error"
        if err:
            row["error"] = err
        elif row.get("kind") == "timed":
            row["median_ms"] = row["ms_per_step"]
        gc.collect()
        if rank.device.type == "cuda":
            torch.cuda.empty_cache()
        if rank.rank == 0:
            with open(Path(a.out) / ROWS, "a") as f:
                f.write(json.dumps({**{k: row.get(k) for k in FIELDS}, **row}, default=str) + "\n")
            got = (f"{row.get('tokens_per_s', '')} tok/s {row.get('ms_per_step', '')} ms "
                   f"peak {row.get('peak_gib')} {row.get('max_rel_loss_diff', '')}")  # fmt: skip
            print(f"[W={w}] {name}: " + (err or got), flush=True)
    dist.destroy_process_group()
    return 0


# --------------------------------------------------------------------------- the table (parent)


def table(rows) -> str:
    lines = ["| case | W | tokens/seq | per GPU | ms/step | tokens/s | peak GiB per rank | loss |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in sorted(rows, key=lambda r: (r["world"], r["backend"])):
        if r.get("kind") == "check" and r["status"] == "ok":
            continue
        if r["status"] != "ok":
            err = r.get("error", "")[:90]
            lines.append(f"| {r['backend']} | {r['world']} | {r['shape'][1]} | | error: {err} | | | |")
            continue
        ls = r["losses"]
        lines.append(f"| {r['backend']} | {r['world']} | {r['shape'][1]} | {r['tokens_per_rank']} | "
                     f"{r['ms_per_step']:.1f} | {r['tokens_per_s']:,} | {r['peak_gib']} | "
                     f"{ls[0]:.3f} -> {ls[-1]:.3f} |")  # fmt: skip
    for r in rows:
        if r.get("kind") == "check" and r["status"] == "ok":
            verdict = "ok" if r["ok"] else "FAILED"
            lines.append(f"\ncheck W={r['world']}: small fp32 Llama, kl-ring vs one process, max relative "
                         f"loss difference {r['max_rel_loss_diff']:.2e} ({verdict})")  # fmt: skip
    return "\n".join(lines)


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.stage or D.launched():
        return run_stage(a)
    if not a.dry and not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU (or --dry for the CPU plumbing)")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    n = a.nproc or (2 if a.dry else torch.cuda.device_count())
    t0 = time.perf_counter()
    argv = [str(Path(__file__).resolve()), *(sys.argv[1:] if argv is None else argv), "--stage"]
    mark = sum(1 for _ in open(out / ROWS)) if (out / ROWS).exists() else 0
    rc = 0
    for w in sorted({1, n}):
        print(f"== stage W={w} ({time.perf_counter() - t0:.0f} s)", flush=True)
        rc = D.launch(w, argv, module=None) or rc
    lines = (out / ROWS).read_text().splitlines()[mark:] if (out / ROWS).exists() else []
    rows = [json.loads(x) for x in lines]
    print(f"\nLlama-shaped context-parallel step ({time.perf_counter() - t0:.0f} s), "
          f"{rows[0]['gpu'] if rows else '?'}:\n")  # fmt: skip
    print(table(rows))
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
