"""Ring attention benchmark (issue 44): several GPUs under torchrun, or one GPU simulating.

Several GPUs (NCCL; NVLink multicast off: NCCL_NVLS_ENABLE=0 is set before init):

    torchrun --standalone --nproc_per_node=2 -m kernellab.distributed.ring_bench --out $OUT

  For each tokens-per-GPU size (--seq-per-gpu, default 8192,16384), layout (--layouts,
  default zigzag) and variant (--variants), forward and forward+backward (bf16, B=1, H=32,
  D=128, causal; Triton blocks), timed with CUDA events (warm-up first, a barrier before
  each rep, the slowest rank's time per rep, median of --reps), against the ideal: one
  GPU's Triton attention over the whole W x S_local sequence, divided by W (an equal share
  of the same work). Scaling efficiency = ideal / measured. Variants, side by side:

    v1        ring_attention(variant=1, check="always"): the first ring, as it was
              (its argument all_gather and host sync on every call)
    v2        ring_attention(variant=2): exchanges hidden, argument check once per shape
    v2-hi     v2 on a group made by high_priority_group (NCCL streams of high priority)
    torch-cp  PyTorch's context parallel (torch.distributed.tensor.experimental.
              context_parallel) around F.scaled_dot_product_attention, its load-balanced
              (head-tail, i.e. zigzag) shards; a missing API is printed, not fatal

  Beside each ring's time, a model's prediction: per step, the compute (each rank times its
  own steps alone, with the ring's step code; the slowest rank per step) and the exchange
  (bytes / the link's speed, measured by a warm-up ring exchange of one K/V block):

    forward   sum over steps but the last of max(compute, K/V) + the last step's compute
    backward  v2: sum over steps but the last of max(compute, K/V + fp32 dK/dV) + max(last
              step, dK/dV home in the inputs' dtype); v1: the same, its last hop (fp32)
              after the last step

  "compute ms" is the steps' compute alone (the best any overlap can do). Then the
  numerics: the ring (--check-heads heads, --check-seq tokens per GPU) gathered on rank 0
  against single-GPU Triton attention on the full sequence, both against float64; error
  ratio (ring / single GPU; target <= 2) for o, dq, dk, dv, and whether v2 gave v1's bits.

One GPU (no torchrun, or --simulate):

    python -m kernellab.distributed.ring_bench --seq-per-gpu 8192,16384 --sim-world 2,4 --out $OUT

  For each simulated world size W, size and layout: every (rank, step)'s compute timed on
  this GPU (the ring's v2 step code), the ring's compute time (the slowest rank per step),
  the model's prediction with the exchanges at --link-gbps, and predicted efficiencies
  against the same ideal. Then the numerics of simulate_ring, as above.

Rows (JSONL, op "ring_attention") -> --out/ring_attention.jsonl; a table is printed last.
Runtime: 2 or 4 GPUs, sizes 8192,16384, zigzag, the four variants: ~1-3 minutes (mostly
the Triton autotuner on the first calls; --no-autotune takes the first tile that fits).

--smoke: CPU, gloo, fp32, PyTorch blocks, tiny sizes, variants v1,v2 (checks the script's
logic on a machine without a GPU: `torchrun --nproc_per_node=2 ... --smoke` or plain python).
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
from kernellab.distributed.blocks import math_dtype, resolve_blocks
from kernellab.harness.bench import git_sha, versions
from kernellab.harness.results import write_jsonl
from kernellab.ops.attention.reference import reference_attention

# variant -> ring_attention's keywords and the group it runs on ("hi": high_priority_group)
RING_VARIANTS = {
    "v1": dict(variant=1, check="always", group="default"),
    "v2": dict(variant=2, check=True, group="default"),
    "v2-hi": dict(variant=2, check=True, group="hi"),
}
VARIANTS = (*RING_VARIANTS, "torch-cp")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seq-per-gpu", default="8192,16384", help="tokens per GPU, comma-separated")
    p.add_argument("--layouts", default="zigzag", help="comma-separated: contiguous, zigzag, striped")
    p.add_argument(
        "--variants", default=None, help=f"comma-separated, of {', '.join(VARIANTS)} (default: all)"
    )
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
        "--no-autotune",
        action="store_true",
        help="attention tiles untuned: the first that fits (kernellab.config.attn_autotune)",
    )
    p.add_argument(
        "--no-check-ranks",
        action="store_true",
        help="ring_attention(check=False) for every variant: no cross-rank argument check",
    )
    p.add_argument(
        "--skip-ideal", action="store_true", help="do not time the single-GPU full-sequence problem"
    )
    p.add_argument("--skip-model", action="store_true", help="no per-step compute times, link, prediction")
    p.add_argument("--skip-check", action="store_true", help="no numerics check")
    p.add_argument("--check-heads", type=int, default=2)
    p.add_argument("--check-seq", type=int, default=4096, help="tokens per GPU of the numerics check")
    p.add_argument("--simulate", action="store_true", help="one-GPU simulation even under torchrun")
    p.add_argument("--sim-world", default="2,4", help="simulated world sizes (one-GPU mode)")
    p.add_argument(
        "--link-gbps",
        type=float,
        default=370.0,
        help="per-direction P2P bandwidth for the one-GPU model (H100 NVLink4 measured ~370)",
    )
    p.add_argument(
        "--blocks",
        default=None,
        help="comma-separated block kernels for the rings, of triton, cudnn, torch (default: triton,cudnn; "
        "--smoke: torch); each has its own ideal (its single-GPU kernel on the whole sequence)",
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
    if a.variants is None:
        a.variants = "v1,v2" if a.smoke else ",".join(VARIANTS)
    a.variant_list = [x for x in a.variants.split(",") if x]
    a.blocks_list = [x for x in (a.blocks or ("torch" if a.smoke else "triton,cudnn")).split(",") if x]
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
    backend = extra.get("blocks") or ("torch" if a.smoke else "triton")  # the ring's block kernels
    row = {
        "op": "ring_attention", "backend": backend, "mode": mode,
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


def single(a, q, k, v, causal, blocks=None):
    """One device's attention with the kernel of ``blocks``: kernellab's Triton kernels,
    PyTorch's SDPA held to cuDNN ("cudnn"), or kernellab's PyTorch backend ("torch", --smoke)."""
    g = q.shape[1] // k.shape[1]
    if g > 1:
        k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    blocks = blocks or ("torch" if a.smoke else "triton")
    if blocks == "cudnn":
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return kernellab.attention(q, k, v, causal=causal, backend="torch" if blocks == "torch" else "triton")


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


def ideal_ms(a, clock, s_total, device, mode, blocks=None) -> float:
    """One GPU's attention over the whole sequence with ``blocks``' kernel (its time / W is
    the ideal ring time)."""
    q, k, v, do = make(a, s_total, device, 1, requires_grad=mode == "fwdbwd")
    call = lambda *t: single(a, *t, a.causal, blocks)  # noqa: E731
    ms = summary(clock.times(fwd_fn(call, q, k, v, mode, do), a.reps, a.warmup))
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


# --------------------------------------------------------------------------- the model


def step_ms(a, clock, blocks, layout, world, ranks, q, k, v, do) -> dict:
    """Per ring step, the slowest of ``ranks``' compute (ms) with the ring's v2 step code
    (ring.forward_block: block + merge, the first step's block taken as the accumulator;
    ring.backward_block: block backward, dq added, dK/dV added into an accumulator):
    {"fwd": [W], "bwd": [W]}. Each distinct block call is timed once. Also tunes the
    block kernels, with no exchange in flight."""
    s_local, sc = q.shape[-2], 0.1
    f = math_dtype(q.dtype)
    with torch.no_grad():  # a real output and LSE for the backward: the diagonal block's
        diag = R.forward_block(blocks, block_calls(layout, a.causal, 0, 0, world, s_local), q, k, v, None, sc)
    o, lse = diag[0].to(q.dtype), diag[1]
    acc_o, acc_lse = diag[0].clone(), diag[1].clone()
    dq_acc = torch.zeros(q.shape, dtype=f, device=q.device)
    dkv = [torch.zeros(k.shape, dtype=f, device=k.device), torch.zeros(v.shape, dtype=f, device=v.device)]

    def into_dkv(keys, dk, dv):  # (the first step's share is taken as the accumulator, not added)
        if keys is not None:
            dkv[0][..., keys, :] += dk
            dkv[1][..., keys, :] += dv

    cache: dict = {}

    def timed(calls, sub, first):
        key = (tuple((c[0].start, c[0].stop, c[1].start, c[1].stop, c[2]) for c in calls), sub, first)
        if key not in cache:

            def fn():
                with torch.no_grad():
                    if sub == "fwd":  # (merging into the same accumulators again: timing only)
                        R.forward_block(blocks, calls, q, k, v, None if first else [acc_o, acc_lse], sc)
                    else:
                        hook = (lambda *_: None) if first else into_dkv
                        R.backward_block(
                            blocks, calls, do, q, k, v, o, lse, None if first else dq_acc, sc, hook
                        )

            cache[key] = summary(clock.times(fn, a.reps, a.warmup))["median_ms"] if calls else 0.0
        return cache[key]

    return {
        sub: [
            max(
                timed(block_calls(layout, a.causal, r, (r - s) % world, world, s_local), sub, s == 0)
                for r in ranks
            )
            for s in range(world)
        ]
        for sub in ("fwd", "bwd")
    }


def predict(steps: dict, x_kv: float, x_dkv: float, x_home: float, mode: str, variant: int) -> dict:
    """The model (module docstring): ms for ``mode`` with every exchange hidden where the
    schedule lets it be ("predicted_ms"), the steps' compute alone ("compute_ms") and
    nothing hidden ("serial_ms"). x_kv: one K/V block's exchange (ms); x_dkv: the fp32
    dK/dV accumulators'; x_home: the last hop's (v2: inputs' dtype; v1: fp32)."""
    cf, cb = steps["fwd"], steps["bwd"]
    w = len(cf)
    pred = sum(max(c, x_kv) for c in cf[:-1]) + cf[-1]
    comp = sum(cf)
    serial = comp + (w - 1) * x_kv
    if mode == "fwdbwd":
        comp += sum(cb)
        if w == 1:
            pred, serial = pred + cb[0], serial + cb[0]
        else:
            pred += sum(max(c, x_kv + x_dkv) for c in cb[:-1])
            pred += max(cb[-1], x_home) if variant == 2 else cb[-1] + x_home
            serial += sum(cb) + (w - 1) * (x_kv + x_dkv) + x_home
    return {"predicted_ms": pred, "compute_ms": comp, "serial_ms": serial}


def covers(steps: dict, link: dict, s_local: int) -> dict:
    """The smallest tokens per GPU whose step compute still covers the exchange posted
    beside it: compute grows as S_local^2 and bytes as S_local, so the margin
    compute / exchange shrinks in proportion to S_local (forward: K/V; backward: K/V +
    fp32 dK/dV, the last step the dK/dV home)."""
    x_kv, x_dkv = link["link_ms_kv"], link["x_dkv"]
    cf, cb = steps["fwd"], steps["bwd"]
    fwd = min(cf[:-1]) / x_kv if len(cf) > 1 and x_kv > 0 else float("inf")
    bwd = min([c / (x_kv + x_dkv) for c in cb[:-1]] + [cb[-1] / x_kv]) if x_kv > 0 else float("inf")
    return {
        "covers_down_to_fwd": s_local / fwd if fwd else None,
        "covers_down_to_bwd": s_local / bwd if bwd else None,
    }


def _n(x) -> str:
    return "-" if x is None else f"{x:.0f}"


def link_ms(a, clock, group, k, v, slowest) -> float:
    """One ring exchange of a K/V block (send to the next rank, receive from the previous,
    as the ring posts it), ms: the slowest rank's median."""
    ring = R.DistRing(group)
    send = [k.detach().contiguous(), v.detach().contiguous()]
    recv = [torch.empty_like(t) for t in send]
    ms = clock.times(lambda: ring.post([send], [recv], 0).wait(), a.reps, a.warmup)
    return summary(slowest(ms))["median_ms"]


# --------------------------------------------------------------------------- PyTorch's context parallel


class TorchCP:
    """PyTorch's context parallel around SDPA, on a 1-D device mesh of every rank; or
    ``why`` it is not available here."""

    def __init__(self, world: int, cuda: bool):
        self.mesh, self.why = None, None
        if not cuda:
            self.why = "needs CUDA SDPA (skipped on the CPU)"
            return
        try:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.tensor.experimental import context_parallel  # noqa: F401  (torch >= 2.7)

            self.mesh = init_device_mesh("cuda", (world,), mesh_dim_names=("cp",))
        except Exception as e:  # noqa: BLE001 - reported in the output, not fatal
            self.why = f"{type(e).__name__}: {e}"

    def times(self, a, clock, s_total, device, mode) -> list[float]:
        """Every rank makes the whole sequence (seed 1); context_parallel shards it in
        place (head-tail), and SDPA inside the context runs PyTorch's ring."""
        import torch.nn.functional as F
        from torch.distributed.tensor.experimental import context_parallel

        q, k, v, do = make(a, s_total, device, 1)
        g = a.heads // a.kv_heads
        if g > 1:  # (SDPA's ring: equal head counts)
            k, v = k.repeat_interleave(g, 1).contiguous(), v.repeat_interleave(g, 1).contiguous()
        bufs = [q, k, v, do]
        try:
            from torch.distributed.tensor.experimental import _attention as cp_attention

            self.rotate = str(cp_attention._cp_options.rotate_method)
        except Exception:  # noqa: BLE001 - informational only
            self.rotate = None
        with context_parallel(self.mesh, buffers=bufs, buffer_seq_dims=[2] * 4, no_restore_buffers=set(bufs)):
            if mode == "fwdbwd":
                for t in (q, k, v):
                    t.requires_grad_()

            def call(q_, k_, v_):
                return F.scaled_dot_product_attention(q_, k_, v_, is_causal=a.causal)

            return clock.times(fwd_fn(call, q, k, v, mode, do), a.reps, a.warmup)


# --------------------------------------------------------------------------- several GPUs


def run_distributed(a, out_rows):
    rank, world = dist.get_rank(), dist.get_world_size()
    cuda = not a.smoke
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    dev_name = torch.cuda.get_device_name() if cuda else "cpu"
    clock = Clock(cuda, barrier=dist.barrier)
    say = print if rank == 0 else (lambda *x, **k: None)
    say(
        f"ring attention: {world} x {dev_name}, {a.dtype}, B={a.batch} H={a.heads} H_kv={a.kv_heads} "
        f"D={a.head_dim}, causal={a.causal}, NCCL_NVLS_ENABLE={os.environ.get('NCCL_NVLS_ENABLE')}, "
        f"variants {','.join(a.variant_list)}, blocks {','.join(a.blocks_list)}"
    )
    groups = {"default": None}
    if any(RING_VARIANTS.get(v, {}).get("group") == "hi" for v in a.variant_list):
        groups["hi"] = R.high_priority_group()  # (every rank: a collective)
    torch_cp = TorchCP(world, cuda) if "torch-cp" in a.variant_list else None
    if torch_cp is not None and torch_cp.why:
        say(f"  torch-cp: not run: {torch_cp.why}")
    rings = [v for v in a.variant_list if v in RING_VARIANTS]

    def slowest(ms):  # per rep, the slowest rank
        t = torch.tensor(ms, dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.tolist()

    def ring_call(name, layout, blocks):
        kw = dict(RING_VARIANTS[name])
        group = groups[kw.pop("group")]
        if a.no_check_ranks:
            kw["check"] = False
        return lambda q_, k_, v_: R.ring_attention(  # noqa: E731
            q_, k_, v_, causal=a.causal, group=group, layout=layout, blocks=blocks, **kw
        )

    elt = torch.empty((), dtype=DT[a.dtype]).element_size()
    for s_local in a.sizes:
        s_total = s_local * world
        shape = (a.batch, a.heads, s_total, a.head_dim)
        fl = {m: attn_flops(a.batch, a.heads, s_total, a.head_dim, a.causal, m) / world for m in a.mode_list}
        ideal = {}  # (blocks, mode) -> ms per GPU
        for bname in a.blocks_list if not a.skip_ideal else ():
            for mode in a.mode_list:
                t0 = time.time()
                try:
                    ms = ideal_ms(a, Clock(cuda), s_total, device, mode, bname)
                except Exception as e:  # noqa: BLE001 - every rank fails alike; reported, not fatal
                    say(f"  single GPU {bname} {mode}: failed: {type(e).__name__}: {str(e)[:300]}")
                    continue
                # every rank timed the same problem on its own GPU: rank 0's time for all
                t = torch.tensor([ms], dtype=torch.float64, device=device)
                dist.broadcast(t, 0)
                ideal[bname, mode] = t.item() / world
                say(
                    f"  single GPU ({bname}), whole sequence {s_total}, {mode}: {t.item():.3f} ms -> "
                    f"ideal {ideal[bname, mode]:.3f} ms per GPU ({time.time() - t0:.0f} s)"
                )

        def emit(variant, layout, mode, ms, t0, model=None, bname=None, **extra):
            """A row: efficiency against the ideal of the same kernel (torch-cp: cuDNN's, the
            kernel its SDPA runs on Hopper) and against the fastest single-GPU kernel timed."""
            st = summary(ms)
            own = ideal.get((bname or "cudnn", mode), ideal.get(("triton", mode)))
            best = min((x for (b, m), x in ideal.items() if m == mode), default=None)
            eff = own / st["median_ms"] if own is not None else None
            row = base_row(
                a, dev_name, mode, shape, **st, world=world, seq_per_gpu=s_local, layout=layout,
                variant=variant, blocks=bname or "sdpa", ideal_ms=own, efficiency=eff, ideal_best_ms=best,
                efficiency_best=best / st["median_ms"] if best is not None else None,
                tflops=fl[mode] / st["median_ms"] / 1e9, kind="ring", **(model or {}), **extra,
            )  # fmt: skip
            out_rows.append(row)
            effs = "-" if eff is None else f"{eff:.1%}"
            pred = ""
            if model:
                pred = (
                    f"  model {model['predicted_ms']:.3f} ms (compute {model['compute_ms']:.3f}, "
                    f"nothing hidden {model['serial_ms']:.3f})"
                )
            say(
                f"  {variant:8s} {row['blocks']:6s} {layout:10s} S/GPU={s_local:6d} {mode:6s} "
                f"{st['median_ms']:9.3f} ms "
                f"(p20 {st['p20_ms']:.3f}, p80 {st['p80_ms']:.3f})  {row['tflops']:.0f} TF/s/GPU  "
                f"efficiency {effs}{pred}  ({time.time() - t0:.0f} s)"
            )

        link = None
        for layout in a.layout_list:
            q, k, v, do = make(a, s_local, device, 100 + rank, requires_grad=True)
            for bname in a.blocks_list:
                blocks = resolve_blocks(bname, q)
                t0 = time.time()
                # Each rank's steps alone (this also tunes the block kernels with no P2P in flight);
                # a block kernel that fails here fails before any exchange: skipped, not fatal.
                try:
                    steps = step_ms(
                        a, Clock(cuda), blocks, layout, world, [rank], q.detach(), k.detach(), v.detach(), do
                    )
                    ok = torch.ones(1, device=device)
                except Exception as e:  # noqa: BLE001 - reported, the other block kernels still run
                    say(f"  blocks {bname}: failed: {type(e).__name__}: {str(e)[:300]}")
                    ok = torch.zeros(1, device=device)
                dist.all_reduce(ok, op=dist.ReduceOp.MIN)
                if not ok.item():
                    continue
                steps = {sub: slowest(x) for sub, x in steps.items()}
                if link is None and world > 1 and not a.skip_model:
                    x_kv = link_ms(a, clock, None, k, v, slowest)
                    kv_bytes = 2 * k.numel() * elt
                    f_elt = torch.empty((), dtype=math_dtype(q.dtype)).element_size()
                    link = {"link_ms_kv": x_kv, "link_gbps": kv_bytes / x_kv / 1e6}
                    link["x_dkv"] = x_kv * f_elt / elt
                    say(
                        f"  link: one K/V block ({kv_bytes / 2**20:.0f} MiB) around the ring in "
                        f"{x_kv:.3f} ms "
                        f"({link['link_gbps']:.0f} GB/s per direction)"
                    )
                cover = covers(steps, link, s_local) if link else {}
                say(
                    f"  {layout} ({bname}): per-step compute fwd "
                    + " ".join(f"{x:.2f}" for x in steps["fwd"])
                    + ", bwd "
                    + " ".join(f"{x:.2f}" for x in steps["bwd"])
                    + " ms"
                    + (
                        "; compute covers the exchanges down to "
                        f"~{_n(cover['covers_down_to_fwd'])} tokens/GPU "
                        f"forward, ~{_n(cover['covers_down_to_bwd'])} backward"
                        if cover
                        else ""
                    )
                    + f" ({time.time() - t0:.0f} s)"
                )
                dist.barrier()
                for name in rings:
                    variant = RING_VARIANTS[name]["variant"]
                    call = ring_call(name, layout, blocks)
                    for mode in a.mode_list:
                        t0 = time.time()
                        model = None
                        if link is not None or world == 1:
                            x_kv = link["link_ms_kv"] if link else 0.0
                            x_dkv = link["x_dkv"] if link else 0.0
                            x_home = x_kv if variant == 2 else x_dkv
                            model = predict(steps, x_kv, x_dkv, x_home, mode, variant)
                            model.update(link or {}, **cover)
                            model.pop("x_dkv", None)
                            model["step_ms_fwd"], model["step_ms_bwd"] = steps["fwd"], steps["bwd"]
                        ms = slowest(clock.times(fwd_fn(call, q, k, v, mode, do), a.reps, a.warmup))
                        check = False if a.no_check_ranks else RING_VARIANTS[name]["check"]
                        emit(name, layout, mode, ms, t0, model, bname, check_ranks=check)
                if cuda:
                    torch.cuda.empty_cache()
            del q, k, v, do
            if cuda:
                torch.cuda.empty_cache()
        if torch_cp is not None and not torch_cp.why:
            for mode in a.mode_list:
                t0 = time.time()
                try:
                    ms = slowest(torch_cp.times(a, clock, s_total, device, mode))
                except Exception as e:  # noqa: BLE001 - every rank fails alike; reported, not fatal
                    say(f"  torch-cp {mode}: failed: {type(e).__name__}: {str(e)[:300]}")
                    continue
                emit("torch-cp", "zigzag", mode, ms, t0, torch_cp_rotate=torch_cp.rotate)
            if cuda:
                torch.cuda.empty_cache()

    if a.skip_check:
        return
    # Numerics: --check-heads heads, --check-seq tokens per GPU, the full problem made on
    # every rank with the same seed; rank 0 judges. v2 against v1: the same bits.
    for layout in a.layout_list:
        s_local = a.check_seq
        q, k, v, do = make_check(a, world, device)
        loc = [shard(t, rank, world, layout) for t in (q, k, v, do)]
        got = {}
        for bname in a.blocks_list:
            for name in [n for n in rings if RING_VARIANTS[n]["group"] == "default"]:  # (v2-hi: v2's code)
                kw = {"variant": RING_VARIANTS[name]["variant"], "blocks": bname}
                fn = lambda *t, kw=kw: R.ring_attention(*t, causal=a.causal, layout=layout, **kw)  # noqa: E731
                try:
                    got[name, bname] = [gather_sequence(x, layout) for x in grads_of(fn, *loc)]
                except Exception as e:  # noqa: BLE001 - every rank fails alike; reported, not fatal
                    say(f"  check {name} ({bname}): failed: {type(e).__name__}: {str(e)[:300]}")
        if rank == 0:
            for (name, bname), full in got.items():
                extra = {"blocks": bname}
                if name != "v1" and ("v1", bname) in got:
                    extra["equals_v1"] = all(torch.equal(x, y) for x, y in zip(full, got["v1", bname]))
                row = judge(
                    a, full, q, k, v, do, dev_name, layout, world, s_local, "ring-check", name, **extra
                )
                out_rows.append(row)
        dist.barrier()


def judge(a, got, q, k, v, do, dev_name, layout, world, s_local, kind, variant="v2", **extra):
    ref = reference(q, k, v, do, a.causal)
    one = grads_of(lambda *t: single(a, *t, a.causal, extra.get("blocks")), q, k, v, do)
    e_ring, e_one = errors(got, ref), errors(one, ref)
    ratio = [r / max(o, 1e-30) for r, o in zip(e_ring, e_one)]
    names = ("o", "dq", "dk", "dv")
    errs = {f"err_{n}": e for n, e in zip(names, e_ring)}
    errs.update({f"err_single_{n}": e for n, e in zip(names, e_one)})
    errs.update({f"ratio_{n}": x for n, x in zip(names, ratio)})
    row = base_row(
        a, dev_name, "check", (a.batch, q.shape[1], q.shape[2], a.head_dim), world=world,
        seq_per_gpu=s_local, layout=layout, kind=kind, variant=variant, **errs,
        within_2x=all(r <= 2 or e <= 1e-6 for r, e in zip(ratio, e_ring)), **extra,
    )  # fmt: skip
    same = "" if "equals_v1" not in extra else f"  same bits as v1: {extra['equals_v1']}"
    print(f"  check {variant:6s} {extra.get('blocks', '-'):6s} {layout:10s} W={world} S/GPU={s_local}: "
          "error ratio ring/single "
          + " ".join(f"{n} {x:.2f}" for n, x in zip(names, ratio))
          + f"  (ring o err {e_ring[0]:.2e}, single {e_one[0]:.2e}){same}")  # fmt: skip
    return row


# --------------------------------------------------------------------------- one GPU


def run_simulated(a, out_rows):
    cuda = not a.smoke
    device = torch.device("cuda") if cuda else torch.device("cpu")
    dev_name = torch.cuda.get_device_name() if cuda else "cpu"
    clock = Clock(cuda)
    worlds = [int(x) for x in a.sim_world.split(",") if x]
    elt = torch.empty((), dtype=DT[a.dtype]).element_size()
    print(f"simulated ring on one {dev_name}: {a.dtype}, B={a.batch} H={a.heads} H_kv={a.kv_heads} "
          f"D={a.head_dim}, causal={a.causal}, link {a.link_gbps:g} GB/s per direction, "
          f"blocks {','.join(a.blocks_list)}")  # fmt: skip
    for world in worlds:
        for s_local in a.sizes:
            for bname in a.blocks_list:
                try:
                    simulate_one(a, out_rows, clock, device, dev_name, world, s_local, bname, elt)
                except Exception as e:  # noqa: BLE001 - reported; the other block kernels still run
                    print(
                        f"  W={world} S/GPU={s_local} blocks {bname}: failed: "
                        f"{type(e).__name__}: {str(e)[:300]}"
                    )
                if cuda:
                    torch.cuda.empty_cache()
        if not a.skip_check:
            for layout in a.layout_list:
                for bname in a.blocks_list:
                    s_local = a.check_seq
                    q, k, v, do = make_check(a, world, device)
                    ring = lambda *t, b=bname: simulate_ring(
                        *t, world, causal=a.causal, layout=layout, blocks=b
                    )  # noqa: E731
                    try:
                        got = grads_of(ring, q, k, v, do)
                    except Exception as e:  # noqa: BLE001 - reported
                        print(f"  check W={world} blocks {bname}: failed: {type(e).__name__}: {str(e)[:300]}")
                        continue
                    out_rows.append(
                        judge(
                            a,
                            got,
                            q,
                            k,
                            v,
                            do,
                            dev_name,
                            layout,
                            world,
                            s_local,
                            kind="simulated-check",
                            blocks=bname,
                        )  # fmt: skip
                    )


def simulate_one(a, out_rows, clock, device, dev_name, world, s_local, bname, elt):
    """One simulated world size, size and block kernel: every layout's rows."""
    cuda = device.type == "cuda"
    s_total = s_local * world
    shape = (a.batch, a.heads, s_total, a.head_dim)
    ideal = (
        {m: ideal_ms(a, clock, s_total, device, m, bname) / world for m in a.mode_list}
        if not a.skip_ideal
        else {}
    )
    q, k, v, do = make(a, s_local, device, 3)
    blocks = resolve_blocks(bname, q)
    f_elt = torch.empty((), dtype=math_dtype(q.dtype)).element_size()
    kv_bytes = 2 * a.batch * a.kv_heads * s_local * a.head_dim * elt
    dkv_bytes = kv_bytes // elt * f_elt
    x_kv = kv_bytes / (a.link_gbps * 1e9) * 1e3
    x_dkv = dkv_bytes / (a.link_gbps * 1e9) * 1e3
    for layout in a.layout_list:
        steps = step_ms(a, clock, blocks, layout, world, range(world), q, k, v, do)
        for mode in a.mode_list:
            model = predict(steps, x_kv, x_dkv, x_kv, mode, 2)
            per_step = steps["fwd"] + (steps["bwd"] if mode == "fwdbwd" else [])
            total = model["compute_ms"]
            eff = ideal[mode] / total if mode in ideal else None
            eff_link = ideal[mode] / model["predicted_ms"] if mode in ideal else None
            # the steps whose compute must hide an exchange: all but the last forward
            # step (K/V), every backward step (dK/dV; K/V too but the last)
            tight_fwd = min(steps["fwd"][:-1]) if world > 1 else None
            tight_bwd = min(steps["bwd"]) if mode == "fwdbwd" else None
            fl = attn_flops(a.batch, a.heads, s_total, a.head_dim, a.causal, mode) / world
            row = base_row(
                a, dev_name, mode, shape, median_ms=total, world=world, seq_per_gpu=s_local,
                layout=layout, kind="simulated", variant="v2", blocks=bname, step_ms=per_step,
                ideal_ms=ideal.get(mode), predicted_efficiency=eff, exchange_bytes_fwd=kv_bytes,
                exchange_bytes_bwd=kv_bytes + dkv_bytes, link_gbps=a.link_gbps,
                exchange_ms_fwd=x_kv, exchange_ms_bwd=x_kv + x_dkv if mode == "fwdbwd" else None,
                tightest_step_ms_fwd=tight_fwd, tightest_step_ms_bwd=tight_bwd,
                tflops=fl / total / 1e9 if total else None, **model,
                predicted_efficiency_with_link=eff_link,
            )  # fmt: skip
            out_rows.append(row)
            hide = ""
            if tight_fwd is not None:
                hide = f"fwd step >= {tight_fwd:.3f} ms vs exchange {x_kv:.3f} ms"
            if tight_bwd is not None:
                hide += f"; bwd step >= {tight_bwd:.3f} ms vs {x_kv + x_dkv:.3f} ms"
            steps_s = " ".join(f"{x:.2f}" for x in per_step)
            effs = "-" if eff is None else f"{eff:.1%}"
            effl = "-" if eff_link is None else f"{eff_link:.1%}"
            print(
                f"  W={world} {bname:6s} {layout:10s} S/GPU={s_local:6d} {mode:6s} "
                f"ring compute {total:9.3f} ms "
                f"(steps {steps_s}); with the link {model['predicted_ms']:.3f} ms; predicted "
                f"efficiency {effs} (compute), {effl} (with the link); {hide}"
            )
    del q, k, v, do
    if cuda:
        torch.cuda.empty_cache()


# --------------------------------------------------------------------------- main


def table(rows) -> str:
    def ms(x):
        return "-" if x is None else f"{x:.3f}"

    lines = [
        "| kind | W | layout | S/GPU | mode | variant | blocks | ms | ideal ms | efficiency | vs best kernel "
        "| model ms | compute ms | TF/s/GPU |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["mode"] == "check":
            continue
        eff = r.get("efficiency", r.get("predicted_efficiency"))
        effs = "-" if eff is None else f"{eff:.1%}"
        tf = "-" if r.get("tflops") is None else f"{r['tflops']:.0f}"
        lines.append(
            f"| {r['kind']} | {r['world']} | {r['layout']} | {r['seq_per_gpu']} | {r['mode']} | "
            f"{r.get('variant', '-')} | {r.get('blocks', '-')} | {r['median_ms']:.3f} | "
            f"{ms(r.get('ideal_ms'))} | "
            f"{effs} | {'-' if r.get('efficiency_best') is None else format(r['efficiency_best'], '.1%')} | "
            f"{ms(r.get('predicted_ms'))} | {ms(r.get('compute_ms'))} | {tf} |"
        )
    checks = [r for r in rows if r["mode"] == "check"]
    if checks:
        lines += [
            "",
            "| kind | W | layout | variant | blocks | ratio o | dq | dk | dv | within 2x | same bits as v1 |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in checks:
            lines.append(
                f"| {r['kind']} | {r['world']} | {r['layout']} | {r.get('variant', '-')} | "
                f"{r.get('blocks', '-')} | "
                + " | ".join(f"{r[f'ratio_{n}']:.2f}" for n in ("o", "dq", "dk", "dv"))
                + f" | {r['within_2x']} | {r.get('equals_v1', '-')} |"
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
    for var in a.variant_list:
        if var not in VARIANTS:
            raise SystemExit(f"--variants: unknown variant {var!r}; choose from {', '.join(VARIANTS)}")
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
