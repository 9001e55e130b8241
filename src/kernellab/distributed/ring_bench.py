"""Ring attention benchmark (issue 20): several GPUs under torchrun, or one GPU simulating.

Several GPUs (NCCL; NVLink multicast off: NCCL_NVLS_ENABLE=0 is set before init):

    torchrun --nproc_per_node=2 -m kernellab.distributed.ring_bench --seq-per-gpu 8192,16384 --out $OUT

  For each tokens-per-GPU size and layout: forward and forward+backward of ``ring_attention``
  (bf16, B=1, H=32, D=128, causal; Triton blocks), timed with CUDA events (warm-up first, a
  barrier before each rep, the slowest rank's time per rep, median of --reps), against the
  ideal: one GPU's Triton attention over the whole W x S_local sequence, divided by W (an
  equal share of the same work). Scaling efficiency = ideal / measured. Then the numerics:
  the ring (--check-heads heads, --check-seq tokens per GPU) gathered on rank 0 against
  single-GPU Triton attention on the full sequence, both against float64; error ratio
  (ring / single GPU; target <= 2) for o, dq, dk, dv.
  Each call includes ring_attention's argument check (one small all_gather and a host
  sync per forward).

One GPU (no torchrun, or --simulate):

    python -m kernellab.distributed.ring_bench --seq-per-gpu 8192,16384 --sim-world 2,4 --out $OUT

  For each simulated world size W, size and layout: every (rank, step)'s compute (the same
  step code as the ring: block calls + fp32 merge; backward: block gradients + accumulation)
  timed on this GPU; the ring's compute time = sum over steps of the slowest rank; predicted
  efficiency against the same ideal, assuming every exchange hides; and per step the bytes
  a real exchange must move (K/V block forward; K/V + fp32 dK/dV backward), the time they
  take at --link-gbps, and the tightest step's compute time that must hide them. Then the
  numerics of simulate_ring against single-GPU Triton attention, as above.

Rows (JSONL, op "ring_attention") -> --out/ring_attention.jsonl; a table is printed last.
Runtime: 2 GPUs, sizes 8192,16384, three layouts: ~1-3 minutes (mostly the Triton autotuner
on the first calls; --no-autotune takes the first tile that fits).

--smoke: CPU, gloo, fp32, PyTorch blocks, tiny default sizes (checks the script's logic on
a machine without a GPU: `torchrun --nproc_per_node=2 ... --smoke` or plain python).
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

import kernellab
from kernellab.distributed import LAYOUTS, block_calls, gather_sequence, shard, simulate_ring
from kernellab.distributed import ring as R
from kernellab.distributed.blocks import TORCH, TRITON, math_dtype
from kernellab.harness.bench import git_sha, versions
from kernellab.harness.results import write_jsonl
from kernellab.ops.attention.reference import reference_attention


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seq-per-gpu", default="8192,16384", help="tokens per GPU, comma-separated")
    p.add_argument("--layouts", default="contiguous,zigzag,striped")
    p.add_argument("--modes", default="fwd,fwdbwd")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=None, help="GQA: K/V heads (default: --heads)")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    p.add_argument("--no-causal", action="store_true", help="non-causal attention (default: causal)")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument(
        "--no-autotune", action="store_true", help="attention tiles untuned: the first that fits (kernellab.config.attn_autotune)"
    )
    p.add_argument(
        "--no-check-ranks",
        action="store_true",
        help="ring_attention(check=False): no cross-rank shape check (and its host sync) per call",
    )
    p.add_argument(
        "--skip-ideal", action="store_true", help="do not time the single-GPU full-sequence problem"
    )
    p.add_argument("--skip-check", action="store_true", help="no numerics check")
    p.add_argument("--check-heads", type=int, default=2)
    p.add_argument("--check-seq", type=int, default=4096, help="tokens per GPU of the numerics check")
    p.add_argument("--simulate", action="store_true", help="one-GPU simulation even under torchrun")
    p.add_argument("--sim-world", default="2,4", help="simulated world sizes (one-GPU mode)")
    p.add_argument(
        "--link-gbps",
        type=float,
        default=370.0,
        help="per-direction P2P bandwidth for the one-GPU estimate (H100 NVLink4 measured ~370)",
    )
    p.add_argument("--smoke", action="store_true", help="CPU, gloo, fp32, PyTorch blocks, tiny sizes")
    p.add_argument("--out", default=None, help="directory for ring_attention.jsonl")
    a = p.parse_args(argv)
    if a.smoke:
        a.dtype = "fp32"
        if a.seq_per_gpu == "8192,16384":
            a.seq_per_gpu = "32"
        a.heads, a.head_dim, a.reps, a.warmup = min(a.heads, 2), min(a.head_dim, 16), min(a.reps, 3), 1
        a.check_seq = min(a.check_seq, 16)
    a.sizes = [int(x) for x in a.seq_per_gpu.split(",") if x]
    a.layout_list = [x for x in a.layouts.split(",") if x]
    a.mode_list = [x for x in a.modes.split(",") if x]
    a.kv_heads = a.kv_heads or a.heads
    a.causal = not a.no_causal
    return a



DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


# --------------------------------------------------------------------------- timing


class Clock:
    """CUDA events on a GPU (host clock with --smoke); ``barrier`` before each rep."""

    def __init__(self, cuda: bool, barrier=None):
        self.cuda, self.barrier = cuda, barrier

    def times(self, fn, reps: int, warmup: int) -> list[float]:
        for _ in range(warmup):
            fn()
        self.sync()
        out = []
        for _ in range(reps):
            if self.barrier:
                self.barrier()
            self.sync()
            if self.cuda:
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                b.synchronize()
                out.append(a.elapsed_time(b))
            else:
                t = time.perf_counter()
                fn()
                out.append((time.perf_counter() - t) * 1e3)
        return out

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()


def summary(ms: list[float]) -> dict:
    s = sorted(ms)
    q = lambda f: s[min(len(s) - 1, int(f * (len(s) - 1) + 0.5))]  # noqa: E731
    return {"median_ms": statistics.median(s), "p20_ms": q(0.2), "p80_ms": q(0.8)}


def attn_flops(b, h, s, d, causal, mode) -> float:
    fwd = 4 * b * h * s * s * d / (2 if causal else 1)
    return fwd * (3.5 if mode == "fwdbwd" else 1.0)


def base_row(a, dev_name, mode, shape, **extra) -> dict:
    v = versions()
    row = {
        "op": "ring_attention", "backend": "triton" if not a.smoke else "torch", "mode": mode,
        "shape": "x".join(map(str, shape)), "dtype": a.dtype, "gpu": dev_name, "torch": v["torch"],
        "triton": v["triton"], "cuda": v["cuda"], "git_sha": git_sha(),
        "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "causal": a.causal, "kv_heads": a.kv_heads, "status": "ok",
    }  # fmt: skip
    row.update(extra)
    return row


# --------------------------------------------------------------------------- problems


def make(a, s, device, seed, heads=None, kv_heads=None, requires_grad=False):
    g = torch.Generator(device=device).manual_seed(seed)
    h, hk = heads or a.heads, kv_heads or a.kv_heads
    dt = DT[a.dtype]
    q = torch.randn(a.batch, h, s, a.head_dim, generator=g, device=device).to(dt)
    k = torch.randn(a.batch, hk, s, a.head_dim, generator=g, device=device).to(dt)
    v = torch.randn(a.batch, hk, s, a.head_dim, generator=g, device=device).to(dt)
    do = torch.randn(a.batch, h, s, a.head_dim, generator=g, device=device).to(dt)
    if requires_grad:
        q, k, v = (t.requires_grad_() for t in (q, k, v))
    return q, k, v, do


def make_check(a, world, device):
    """The numerics check's full problem: --check-heads heads (K/V heads in the run's
    ratio), --check-seq tokens per GPU, seed 7."""
    kv_heads = max(1, a.check_heads * a.kv_heads // a.heads)
    return make(a, a.check_seq * world, device, 7, heads=a.check_heads, kv_heads=kv_heads)


def single(a, q, k, v, causal):
    """One device's attention (kernellab's Triton kernels; --smoke: PyTorch's)."""
    g = q.shape[1] // k.shape[1]
    if g > 1:
        k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    return kernellab.attention(q, k, v, causal=causal, backend="torch" if a.smoke else "triton")


def fwd_fn(call, q, k, v, mode, do):
    if mode == "fwd":

        def f():
            with torch.no_grad():
                call(q, k, v)

    else:

        def f():
            o = call(q, k, v)
            torch.autograd.grad(o, (q, k, v), do)

    return f


def ideal_ms(a, clock, s_total, device, mode) -> float:
    """One GPU's attention over the whole sequence (its time / W is the ideal ring time)."""
    q, k, v, do = make(a, s_total, device, 1, requires_grad=mode == "fwdbwd")
    ms = summary(clock.times(fwd_fn(lambda *t: single(a, *t, a.causal), q, k, v, mode, do), a.reps, a.warmup))
    del q, k, v, do
    return ms["median_ms"]


def errors(got, ref) -> list[float]:
    return [(x.double() - r).abs().max().item() for x, r in zip(got, ref)]


def reference(q, k, v, do, causal):
    g = q.shape[1] // k.shape[1]
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    o = reference_attention(q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1), causal=causal)
    return [o.detach(), *torch.autograd.grad(o, (q, k, v), do.double())]


def grads_of(fn, q, k, v, do):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    o = fn(q, k, v)
    return [o.detach(), *torch.autograd.grad(o, (q, k, v), do)]


# --------------------------------------------------------------------------- several GPUs


def run_distributed(a, out_rows):
    rank, world = dist.get_rank(), dist.get_world_size()
    cuda = not a.smoke
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    dev_name = torch.cuda.get_device_name() if cuda else "cpu"
    clock = Clock(cuda, barrier=dist.barrier)
    blocks = TORCH if a.smoke else TRITON
    say = print if rank == 0 else (lambda *x, **k: None)
    say(
        f"ring attention: {world} x {dev_name}, {a.dtype}, B={a.batch} H={a.heads} H_kv={a.kv_heads} "
        f"D={a.head_dim}, causal={a.causal}, NCCL_NVLS_ENABLE={os.environ.get('NCCL_NVLS_ENABLE')}"
    )

    def slowest(ms):  # per rep, the slowest rank
        t = torch.tensor(ms, dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.tolist()

    for s_local in a.sizes:
        s_total = s_local * world
        shape = (a.batch, a.heads, s_total, a.head_dim)
        ideal = {}
        for mode in a.mode_list:
            if not a.skip_ideal:
                t0 = time.time()
                ms = ideal_ms(a, Clock(cuda), s_total, device, mode)
                # every rank timed the same problem on its own GPU: rank 0's time for all
                t = torch.tensor([ms], dtype=torch.float64, device=device)
                dist.broadcast(t, 0)
                ideal[mode] = t.item() / world
                say(
                    f"  single GPU, whole sequence {s_total}, {mode}: {t.item():.3f} ms -> "
                    f"ideal {ideal[mode]:.3f} ms per GPU ({time.time() - t0:.0f} s)"
                )
        for layout in a.layout_list:
            q, k, v, do = make(a, s_local, device, 100 + rank, requires_grad=True)
            # Tune / compile the block kernels locally first (no P2P in flight meanwhile).
            for src in range(world):
                calls = block_calls(layout, a.causal, rank, src, world, s_local)
                f = math_dtype(q.dtype)
                acc_o = torch.zeros(q.shape, dtype=f, device=device)
                acc_l = torch.full(q.shape[:-1], float("-inf"), dtype=f, device=device)
                with torch.no_grad():
                    R.step_forward(blocks, calls, q, k, v, acc_o, acc_l, 0.1)
                    R.step_backward(blocks, calls, do, q, k, v, acc_o.to(q.dtype), acc_l, acc_o, 0.1)
            dist.barrier()
            call = lambda q_, k_, v_: R.ring_attention(  # noqa: E731
                q_, k_, v_, causal=a.causal, layout=layout, blocks=blocks, check=not a.no_check_ranks
            )
            for mode in a.mode_list:
                t0 = time.time()
                ms = slowest(clock.times(fwd_fn(call, q, k, v, mode, do), a.reps, a.warmup))
                st = summary(ms)
                eff = ideal[mode] / st["median_ms"] if mode in ideal else None
                fl = attn_flops(a.batch, a.heads, s_total, a.head_dim, a.causal, mode) / world
                row = base_row(
                    a, dev_name, mode, shape, **st, world=world, seq_per_gpu=s_local, layout=layout,
                    ideal_ms=ideal.get(mode), efficiency=eff, tflops=fl / st["median_ms"] / 1e9, kind="ring",
                    check_ranks=not a.no_check_ranks,
                )  # fmt: skip
                out_rows.append(row)
                effs = "-" if eff is None else f"{eff:.1%}"
                say(
                    f"  {layout:10s} S/GPU={s_local:6d} {mode:6s} {st['median_ms']:9.3f} ms "
                    f"(p20 {st['p20_ms']:.3f}, p80 {st['p80_ms']:.3f})  {row['tflops']:.0f} TF/s/GPU  "
                    f"efficiency {effs}  ({time.time() - t0:.0f} s)"
                )
            del q, k, v, do
            if cuda:
                torch.cuda.empty_cache()

    if a.skip_check:
        return
    # Numerics: --check-heads heads, --check-seq tokens per GPU, the full problem made on
    # every rank with the same seed; rank 0 judges.
    for layout in a.layout_list:
        s_local = a.check_seq
        q, k, v, do = make_check(a, world, device)
        loc = [shard(t, rank, world, layout) for t in (q, k, v, do)]
        got = grads_of(lambda *t: R.ring_attention(*t, causal=a.causal, layout=layout, blocks=blocks), *loc)
        full = [gather_sequence(x, layout) for x in got]
        if rank == 0:
            row = judge(a, full, q, k, v, do, dev_name, layout, world, s_local, kind="ring-check")
            out_rows.append(row)
        dist.barrier()


def judge(a, got, q, k, v, do, dev_name, layout, world, s_local, kind):
    ref = reference(q, k, v, do, a.causal)
    one = grads_of(lambda *t: single(a, *t, a.causal), q, k, v, do)
    e_ring, e_one = errors(got, ref), errors(one, ref)
    ratio = [r / max(o, 1e-30) for r, o in zip(e_ring, e_one)]
    names = ("o", "dq", "dk", "dv")
    errs = {f"err_{n}": e for n, e in zip(names, e_ring)}
    errs.update({f"err_single_{n}": e for n, e in zip(names, e_one)})
    errs.update({f"ratio_{n}": x for n, x in zip(names, ratio)})
    row = base_row(
        a, dev_name, "check", (a.batch, q.shape[1], q.shape[2], a.head_dim), world=world,
        seq_per_gpu=s_local, layout=layout, kind=kind, **errs,
        within_2x=all(r <= 2 or e <= 1e-6 for r, e in zip(ratio, e_ring)),
    )  # fmt: skip
    print(f"  check {layout:10s} W={world} S/GPU={s_local}: error ratio ring/single "
          + " ".join(f"{n} {x:.2f}" for n, x in zip(names, ratio))
          + f"  (ring o err {e_ring[0]:.2e}, single {e_one[0]:.2e})")  # fmt: skip
    return row


# --------------------------------------------------------------------------- one GPU


def run_simulated(a, out_rows):
    cuda = not a.smoke
    device = torch.device("cuda") if cuda else torch.device("cpu")
    dev_name = torch.cuda.get_device_name() if cuda else "cpu"
    clock = Clock(cuda)
    blocks = TORCH if a.smoke else TRITON
    worlds = [int(x) for x in a.sim_world.split(",") if x]
    elt = torch.empty((), dtype=DT[a.dtype]).element_size()
    print(f"simulated ring on one {dev_name}: {a.dtype}, B={a.batch} H={a.heads} H_kv={a.kv_heads} "
          f"D={a.head_dim}, causal={a.causal}, link {a.link_gbps:g} GB/s per direction")  # fmt: skip
    for world in worlds:
        for s_local in a.sizes:
            s_total = s_local * world
            shape = (a.batch, a.heads, s_total, a.head_dim)
            ideal = (
                {m: ideal_ms(a, clock, s_total, device, m) / world for m in a.mode_list}
                if not a.skip_ideal
                else {}
            )
            q, k, v, do = make(a, s_local, device, 3)
            f = math_dtype(q.dtype)
            kv_bytes = 2 * a.batch * a.kv_heads * s_local * a.head_dim * elt
            dkv_bytes = (
                2 * a.batch * a.kv_heads * s_local * a.head_dim * torch.empty((), dtype=f).element_size()
            )
            for layout in a.layout_list:
                cache = {}

                def step_ms(calls, mode):
                    key = (tuple((c[0].start, c[0].stop, c[1].start, c[1].stop, c[2]) for c in calls), mode)
                    if key not in cache:
                        acc_o = torch.zeros(q.shape, dtype=f, device=device)
                        acc_l = torch.full(q.shape[:-1], float("-inf"), dtype=f, device=device)
                        with torch.no_grad():
                            R.step_forward(
                                blocks, calls, q, k, v, acc_o, acc_l, 0.1
                            )  # a real LSE for the backward
                        o, lse = acc_o.to(q.dtype), acc_l.clone()
                        dq_acc = torch.zeros_like(acc_o)

                        def fn():
                            with torch.no_grad():
                                if mode == "fwd":  # merging into the same accumulators again: timing only
                                    R.step_forward(blocks, calls, q, k, v, acc_o, acc_l, 0.1)
                                else:
                                    R.step_backward(blocks, calls, do, q, k, v, o, lse, dq_acc, 0.1)

                        cache[key] = summary(clock.times(fn, a.reps, a.warmup))["median_ms"] if calls else 0.0
                    return cache[key]

                for mode in a.mode_list:
                    # per step, the slowest rank; (fwdbwd: the forward's steps + the backward's)
                    per_step = []
                    for sub in ["fwd"] if mode == "fwd" else ["fwd", "bwd"]:
                        for step in range(world):
                            per_step.append(
                                max(
                                    step_ms(
                                        block_calls(layout, a.causal, r, (r - step) % world, world, s_local),
                                        sub,
                                    )
                                    for r in range(world)
                                )
                            )
                    total = sum(per_step)
                    fwd_steps = per_step[:world]
                    bwd_steps = per_step[world:]
                    xfer_fwd = kv_bytes / (a.link_gbps * 1e9) * 1e3
                    xfer_bwd = (kv_bytes + dkv_bytes) / (a.link_gbps * 1e9) * 1e3
                    # the steps whose compute must hide an exchange: all but the last forward
                    # step (K/V), every backward step (dK/dV; K/V too but the last)
                    tight_fwd = min(fwd_steps[:-1]) if world > 1 else None
                    tight_bwd = min(bwd_steps) if bwd_steps else None
                    eff = ideal[mode] / total if mode in ideal else None
                    fl = attn_flops(a.batch, a.heads, s_total, a.head_dim, a.causal, mode) / world
                    row = base_row(
                        a, dev_name, mode, shape, median_ms=total, world=world, seq_per_gpu=s_local,
                        layout=layout, kind="simulated", step_ms=per_step, ideal_ms=ideal.get(mode),
                        predicted_efficiency=eff, exchange_bytes_fwd=kv_bytes,
                        exchange_bytes_bwd=kv_bytes + dkv_bytes, link_gbps=a.link_gbps,
                        exchange_ms_fwd=xfer_fwd, exchange_ms_bwd=xfer_bwd if bwd_steps else None,
                        tightest_step_ms_fwd=tight_fwd, tightest_step_ms_bwd=tight_bwd,
                        tflops=fl / total / 1e9 if total else None,
                    )  # fmt: skip
                    out_rows.append(row)
                    hide = (
                        f"fwd step >= {tight_fwd:.3f} ms vs exchange {xfer_fwd:.3f} ms"
                        if tight_fwd is not None
                        else ""
                    )
                    if tight_bwd is not None:
                        hide += f"; bwd step >= {tight_bwd:.3f} ms vs {xfer_bwd:.3f} ms"
                    steps = " ".join(f"{x:.2f}" for x in per_step)
                    effs = "-" if eff is None else f"{eff:.1%}"
                    print(
                        f"  W={world} {layout:10s} S/GPU={s_local:6d} {mode:6s} ring compute {total:9.3f} ms "
                        f"(steps {steps}); predicted efficiency {effs}; {hide}"
                    )
            del q, k, v, do
            if cuda:
                torch.cuda.empty_cache()
        if not a.skip_check:
            for layout in a.layout_list:
                s_local = a.check_seq
                q, k, v, do = make_check(a, world, device)
                got = grads_of(
                    lambda *t: simulate_ring(*t, world, causal=a.causal, layout=layout, blocks=blocks),
                    q,
                    k,
                    v,
                    do,
                )
                out_rows.append(
                    judge(a, got, q, k, v, do, dev_name, layout, world, s_local, kind="simulated-check")
                )


# --------------------------------------------------------------------------- main


def table(rows) -> str:
    lines = [
        "| kind | W | layout | S/GPU | mode | ms | ideal ms | efficiency | TF/s/GPU |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["mode"] == "check":
            continue
        eff = r.get("efficiency", r.get("predicted_efficiency"))
        ideal = "-" if r.get("ideal_ms") is None else f"{r['ideal_ms']:.3f}"
        effs = "-" if eff is None else f"{eff:.1%}"
        tf = "-" if r.get("tflops") is None else f"{r['tflops']:.0f}"
        lines.append(
            f"| {r['kind']} | {r['world']} | {r['layout']} | {r['seq_per_gpu']} | {r['mode']} | "
            f"{r['median_ms']:.3f} | {ideal} | {effs} | {tf} |"
        )
    checks = [r for r in rows if r["mode"] == "check"]
    if checks:
        lines += [
            "",
            "| kind | W | layout | ratio o | dq | dk | dv | within 2x |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in checks:
            lines.append(
                f"| {r['kind']} | {r['world']} | {r['layout']} | "
                + " | ".join(f"{r[f'ratio_{n}']:.2f}" for n in ("o", "dq", "dk", "dv"))
                + f" | {r['within_2x']} |"
            )
    return "\n".join(lines)


def main(argv=None) -> int:
    a = parse_args(argv)
    os.environ["NCCL_NVLS_ENABLE"] = "0"  # NVLink multicast off (KINDS.md), before any NCCL init
    if a.no_autotune:
        kernellab.config.attn_autotune = False
    for lay in a.layout_list:
        if lay not in LAYOUTS:
            raise SystemExit(f"--layouts: unknown layout {lay!r}; choose from {', '.join(LAYOUTS)}")
    if not a.smoke and not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU (or --smoke for the CPU logic check)")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rows: list[dict] = []
    distributed = world > 1 and not a.simulate
    if distributed:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        if a.smoke:
            dist.init_process_group("gloo")
        else:
            torch.cuda.set_device(local)
            try:
                dist.init_process_group("nccl", device_id=torch.device("cuda", local))
            except TypeError:  # torch without device_id
                dist.init_process_group("nccl")
        run_distributed(a, rows)
    else:
        run_simulated(a, rows)
    lead = not distributed or dist.get_rank() == 0
    if lead:
        print()
        print(table(rows))
        if a.out:
            path = Path(a.out) / "ring_attention.jsonl"
            n = write_jsonl(rows, path)
            print(f"\n{n} rows -> {path}")
    if distributed:
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
