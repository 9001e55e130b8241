"""Data-parallel GPT-2 training on a lent machine: DDP and FSDP2 at W=1 and W=N (issue 44).

    python lab/gpu_dataparallel.py --out $OUT [--quick] [--nproc N] [--batch 16]
    torchrun --nproc_per_node=N lab/gpu_dataparallel.py --out $OUT    # the W=N stage alone

Run plainly, the script launches itself twice through torchrun's launcher
(``kernellab.distributed.data_parallel.launch``: NCCL, NCCL_NVLS_ENABLE=0): one rank, then
N ranks (default: every GPU), and prints the table last. Each stage runs its cases in one
process per rank (the Triton autotuner runs once per process), every case caught on its
own (a case that fails on every rank alike gives an error row; a rank that hangs in a
collective is ended by the NCCL timeout, 300 s, and the stage's remaining cases are lost).

Cases (GPT-2 small, bf16 parameters and AdamW state as `kernellab train gpt` trains on a
GPU, kernellab's Triton ops and one-launch AdamW, eager; --batch rows x --seq tokens PER
GPU: weak scaling, the global batch grows with W):

- ``single``: the plain engine (gpt.Trainer: fused blocks under one autograd node, CUDA
  graphs of the blocks): one GPU's tokens/s, the baseline (W=1 stage only);
- ``single-ops``: the same model op by op (fuse off; the path FSDP2 runs) (W=1, not --quick);
- ``ddp``: DistributedDataParallel around the plain engine (its fused blocks hand every
  block's gradient to the all-reduce at once, at the end of their backward);
- ``ddp-ops``: DDP over the op-by-op model (gradients, and buckets, ready block by block
  as the backward proceeds: the all-reduce overlaps the backward) (not --quick);
- ``ddp-g4``: DDP around the fused model with its blocks as 4 autograd nodes
  (``GPT.block_groups``: 3 blocks each, their gradients handed over per group, so 3/4 of
  the blocks' all-reduce can overlap the backward) (not --quick);
- ``fsdp2``: fully_shard per block and the root (ZeRO-3), op by op, kernellab's AdamW on
  the local shards;
- ``fsdp2-model``: fully_shard on the whole model as one unit (gathered once per step,
  gradients reduce-scattered once), the fused blocks and their CUDA graphs kept.

Per case: ms per step (median of --rounds rounds of --steps steps, the slowest rank's
round), tokens/s of all ranks, each rank's peak allocated memory. The W=N stage also checks
the numerics: the tiny GPT in fp32 (Triton ops) for 3 steps at a global batch of 2N, DDP
and FSDP2 against one process at the same global batch on the same GPU (rows ``check``,
max relative loss difference; target <= 1e-4).

Scaling efficiency = tokens/s at W=N / (N x ``single``'s tokens/s at W=1); the issue's
target is >= 0.95. ``vs same path``: against the same wrapper at W=1.

Rows -> $OUT/dataparallel.jsonl. Runtime on H200s: ~2-3 minutes (the autotuner's first
calls in each stage dominate); --quick: the three main cases only.
--dry: the CPU, gloo, the tiny GPT with PyTorch's ops, 2 ranks (the script's plumbing).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from kernellab.distributed import data_parallel as D  # noqa: E402
from kernellab.harness.bench import git_sha, versions  # noqa: E402
from kernellab.harness.results import FIELDS  # noqa: E402

ROWS = "dataparallel.jsonl"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="directory for dataparallel.jsonl")
    p.add_argument("--nproc", type=int, default=None, help="ranks of the W=N stage (default: every GPU)")
    p.add_argument("--batch", type=int, default=16, help="rows per GPU (default 16)")
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--steps", type=int, default=10, help="timed steps per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="cases single, ddp, fsdp2 only")
    p.add_argument("--cases", default=None, help="comma-separated cases of both stages (default: as above)")
    p.add_argument("--profile", default="", help="comma-separated cases to profile on rank 0 (3 steps)")
    p.add_argument("--dry", action="store_true", help="CPU, gloo, tiny GPT, PyTorch's ops, 2 ranks")
    p.add_argument("--stage", action="store_true", help=argparse.SUPPRESS)  # a rank of a launched stage
    a = p.parse_args(argv)
    if a.dry:
        a.batch, a.seq, a.steps, a.rounds, a.warmup = min(a.batch, 2), min(a.seq, 32), 2, 2, 1
        a.nproc = a.nproc or 2
    return a


# --------------------------------------------------------------------------- one stage (every rank)


def _model_kw(a):
    if a.dry:
        return dict(config="tiny", backends="pytorch", dtype=torch.float32, optimizer="pytorch")
    return dict(config="gpt2", backends="triton", dtype=torch.bfloat16, optimizer="triton")


def _case(name, a, rank):
    """One timed case on this rank: its row (the same on every rank)."""
    from kernellab.models import gpt, text

    kw = _model_kw(a)
    model = gpt.make(kw["config"], kw["backends"], device=rank.device, dtype=kw["dtype"])
    if name.endswith("-ops"):
        model.fuse = False
    groups = 4 if name == "ddp-g4" else None
    options = dict(WRAP_OPTIONS.get(name, {}))
    dp = "fsdp2-model" if name.startswith("fsdp2-model") else name.split("-")[0]
    module = model if name.startswith("single") else D.wrap(model, dp, rank, groups, **options)
    opt = "pytorch" if name.endswith("-torchopt") else kw["optimizer"]
    trainer = gpt.Trainer(module, "eager", optimizer=opt)
    corpus = text.ByteData(text.load_corpus(), rank.device)
    idx, tgt = corpus.batch(a.batch * rank.world, a.seq, torch.Generator(device=rank.device).manual_seed(0))
    lo = rank.rank * a.batch
    batch = (idx[lo : lo + a.batch], tgt[lo : lo + a.batch])
    t = D.time_steps(trainer, batch, rank, a.warmup, a.steps, a.rounds)
    if name in a.profile.split(",") and rank.rank == 0:
        profile(trainer, batch, rank, name)
    tokens = a.batch * rank.world * a.seq
    return {"ms_per_step": round(t["ms_per_step"], 3), "tokens_per_s": round(tokens / t["ms_per_step"] * 1e3),
            "rounds_ms": t["rounds_ms"], "warmup_s": t["warmup_s"], "loss": round(t["loss"], 4),
            "peak_gib": t["peak_gib"], "config": kw["config"]}  # fmt: skip


# extra cases: the wrapper's options (D.wrap) by case name
WRAP_OPTIONS = {
    "fsdp2-keep": {"reshard_after_forward": False},  # no all-gather again before the backward
    "ddp-static": {"static_graph": True, "bucket_cap_mb": 100},
}


def profile(trainer, batch, rank, name) -> None:
    """Three steps under torch.profiler on this rank: wall time, the device's busy time and
    the top operators by self CPU time and by self device time."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof

    torch.cuda.synchronize(rank.device)
    with prof(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        t0 = time.perf_counter()
        for _ in range(3):
            trainer.step(*batch)
        torch.cuda.synchronize(rank.device)
        wall = (time.perf_counter() - t0) * 1e3 / 3
    ev = p.key_averages()
    dev = sum(getattr(e, "self_device_time_total", 0) or getattr(e, "self_cuda_time_total", 0) for e in ev)
    print(f"[profile {name}] wall {wall:.2f} ms per step, device busy {dev / 3e3:.2f} ms per step",
          flush=True)  # fmt: skip
    for key in ("self_cpu_time_total", "self_cuda_time_total"):
        try:
            print(ev.table(sort_by=key, row_limit=18, max_name_column_width=60), flush=True)
        except Exception as e:  # noqa: BLE001 - informational
            print(f"[profile {name}] table by {key}: {e}", flush=True)


def _check(dp, a, rank):
    """Losses of the tiny fp32 GPT under ``dp`` at a global batch of 2W against one process
    at the same batch (every rank computes that alone, on its own device)."""
    from kernellab.models import gpt

    ops = "pytorch" if a.dry else "triton"
    opt = "pytorch" if a.dry else "triton"
    res = D.train("tiny", ops, dp=dp, global_batch=2 * rank.world, seq_len=32, steps=3, optimizer=opt,
                  device=rank.device.type)  # fmt: skip
    ref = gpt.train("tiny", ops, batch_size=2 * rank.world, seq_len=32, steps=3, device=str(rank.device),
                    optimizer=opt)  # fmt: skip
    rel = max(abs(x - y) / abs(y) for x, y in zip(res.losses, ref))
    return {"max_rel_loss_diff": rel, "ok": rel <= 1e-4, "losses": res.losses, "losses_single": ref}


def _agree(ok: bool, rank) -> bool:
    """Whether every rank's case ended without an exception."""
    if rank.world == 1:
        return ok
    t = torch.tensor([1.0 if ok else 0.0], device=rank.device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def run_stage(a) -> int:
    import os

    rank = D.init("cpu" if a.dry else None, timeout_s=300)
    w = rank.world
    if w == 1:
        full = ["single", "single-ops", "ddp", "ddp-ops", "ddp-g4", "fsdp2", "fsdp2-model"]
        cases = ["single", "ddp", "fsdp2"] if a.quick else full
    else:
        cases = ["ddp", "fsdp2"] if a.quick else ["ddp", "ddp-ops", "ddp-g4", "fsdp2", "fsdp2-model"]
        cases += ["check-ddp", "check-fsdp2", "check-fsdp2-model"]
    if a.cases:
        cases = [c for c in a.cases.split(",") if c and (w > 1 or not c.startswith("check-"))]
    meta = {"gpu": torch.cuda.get_device_name(rank.device) if rank.device.type == "cuda" else "cpu",
            "git_sha": git_sha(), **versions(), "nccl_nvls_enable": os.environ.get("NCCL_NVLS_ENABLE"),
            "backend_dist": rank.backend, "time": time.strftime("%Y-%m-%dT%H:%M:%S")}  # fmt: skip
    for name in cases:
        row = {"op": "gpt_train_dp", "backend": name, "mode": "eager", "world": w,
               "shape": [a.batch, a.seq], "dtype": "fp32" if a.dry else "bf16", **meta}  # fmt: skip
        err = None
        try:
            if name.startswith("check-"):
                row.update(kind="check", **_check(name.removeprefix("check-"), a, rank))
            else:
                row.update(kind="timed", **_case(name, a, rank))
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
                f.write(json.dumps({**{k: row.get(k) for k in FIELDS}, **row}) + "\n")
            print(f"[W={w}] {name}: " + (err or f"{row.get('tokens_per_s', '')} tok/s "
                                         f"{row.get('ms_per_step', '')} ms peak {row.get('peak_gib')} "
                                         f"{row.get('max_rel_loss_diff', '')}"), flush=True)  # fmt: skip
    dist.destroy_process_group()
    return 0


# --------------------------------------------------------------------------- the table (parent)


def table(rows) -> str:
    timed = [r for r in rows if r.get("kind") == "timed" and r["status"] == "ok"]
    base = {r["backend"]: r["tokens_per_s"] for r in timed if r["world"] == 1}
    single = base.get("single")
    lines = ["| case | W | ms/step | tokens/s (all ranks) | peak GiB per rank | efficiency | vs same path |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in sorted(timed, key=lambda r: (r["world"], r["backend"])):
        w = r["world"]
        eff = f"{r['tokens_per_s'] / (w * single):.3f}" if single else "-"
        same = base.get(r["backend"])
        vs = f"{r['tokens_per_s'] / (w * same):.3f}" if same and w > 1 else "-"
        lines.append(f"| {r['backend']} | {w} | {r['ms_per_step']:.2f} | {r['tokens_per_s']:,} | "
                     f"{r['peak_gib']} | {eff} | {vs} |")  # fmt: skip
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"| {r['backend']} | {r['world']} | error: {r.get('error', '')[:90]} | | | | |")
    for r in rows:
        if r.get("kind") == "check" and r["status"] == "ok":
            verdict = "ok" if r["ok"] else "FAILED"
            lines.append(f"\ncheck {r['backend']} W={r['world']}: max relative loss difference vs one "
                         f"process {r['max_rel_loss_diff']:.2e} ({verdict})")  # fmt: skip
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
    mark = sum(1 for _ in open(out / ROWS)) if (out / ROWS).exists() else 0  # rows of earlier runs stay
    rc = 0
    for w in sorted({1, n}):
        print(f"== stage W={w} ({time.perf_counter() - t0:.0f} s)", flush=True)
        rc = D.launch(w, argv, module=None) or rc
    lines = (out / ROWS).read_text().splitlines()[mark:] if (out / ROWS).exists() else []
    rows = [json.loads(x) for x in lines]
    print(f"\nGPT-2 data parallel ({a.batch} x {a.seq} per GPU; {time.perf_counter() - t0:.0f} s), "
          f"{rows[0]['gpu'] if rows else '?'}:\n")  # fmt: skip
    print(table(rows))
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
