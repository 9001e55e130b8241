"""Weight-only int8 matmul, issue 45 part 4: check cuda_v4 and the Triton plans, time every
candidate launch at decode's M = 1 and 16, and print the winners as table entries to paste.

    PYTHONPATH=src python3 lab/gpu_quant_sweep.py --out $OUT [--max-seconds 200]
    PYTHONPATH=src python3 lab/gpu_quant_sweep.py --out /tmp/qs --dry   # CPU, plumbing only

One device call (~60-150 s on an H200, and ~30-40 s more for the TMA kernel's ~35
compiles; most of it compiles (four v4 builds of 26 kernels, Triton) and do_bench):

1. check (fails loudly: "CHECK FAILED" lines, exit status 1): cuda_v4 at every kernel of
   the sweep's build (``SWEEP_OPTIONS``: the default kernels, (mt, rt, u, pipe) in
   cuda.V4_KERNELS, and KL_WO_V4_EXTRA's, cuda.V4_EXTRA_KERNELS: 16 loads per lane and
   step, pipelined steps) with 1 and several warps along K and K slices, bf16 and fp16,
   bias or not, at decode and odd shapes (N = 1, odd N, K not a multiple of a step, odd
   and even whole steps per warp, M = 17 in two groups, K sliced); NaN / inf in x; the
   default ``cuda`` and ``triton`` backends; Triton at fp32 x (fp64 sums) at 4 x 40 x 258;
   the other builds of wo_matmul.cu (``BUILDS``: the weight loads' cache hints, ptxas's
   register target); the Triton TMA kernel (``TMA_CHECK``: whole steps and K slices, bf16
   and fp16, bias, NaN / inf) and its fallback to the dot kernel (K % 16 != 0, a weight
   off 16-byte alignment). The float64 reference of the dequantized weight, kernellab's rule
   (error <= 2 x the torch backend's + a floor).
2. ceiling: device-to-device copy bandwidth (bytes read + written).
2b. v5 (sm_90 GPUs; ``v5_stage``, in a child process with a time limit: a deadlocked
   mbarrier ring or an illegal address costs only this stage): the ``V5_OPTION`` build
   (~20 s of compile), every ``V5_CHECK`` launch at the check shapes (N = 1, odd N, K not
   a multiple of kc, K sliced, M = 17, bias, bf16 and fp16) and NaN / inf in x, then
   ``v5_candidates`` (~24 launches per shape) at the sweep's shapes, checked and timed;
   per shape the best v5 against bf16 cuBLAS and the copy bandwidth, as a V5Config to
   paste. ``--v5-only`` runs this stage alone (with ``--copy-gbps`` from the parent).
3. sweep (bf16 x, weights (N, K) = (14336, 4096), (4096, 14336), (4096, 4096), M = 1, 16):
   every cuda_v4 plan of the grid below (resolved per shape, duplicates timed once) and
   every Triton plan (``TRITON_GRID``: gemv or dot16 by M, and the 24 "tma" plans at both
   Ms); each output checked, then timed with triton.testing.do_bench (L2
   flushed before every call, median). The 3 fastest of each per shape are timed again
   longer (and the 2 fastest "tma" ones), v4's also in the other builds.
4. summary: per shape the bf16 cuBLAS time, the fastest v4 and Triton launch (x = speedup
   over bf16 cuBLAS, %copy = weight bytes / time against the copy bandwidth), the
   defaults (cuda.V4_PLANS, triton.TRITON_PLANS) and the issue's targets (int8 at M = 1 and
   16 on both 4096 x 14336 weights >= 1.6x bf16 cuBLAS; 1.8x for margin). Then, per shape
   class, the plan with the least total slowdown over its shapes, printed as the lines of
   V4_PLANS / TRITON_PLANS to paste (a plan whose kernel is KL_WO_V4_EXTRA's says so: its
   kernel moves to the default build with it); the TRITON_PLANS winners may be "tma"
   plans, and the best "tma" plan per class is printed too, each with its speedup over
   bf16 cuBLAS per shape.

Rows go to $OUT/quant_sweep.jsonl. No stage starts after --max-seconds; a stage cut short
says what it left out.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import subprocess
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import kernellab  # noqa: E402
from kernellab.cuda.runtime import Module  # noqa: E402
from kernellab.harness.bench import git_sha, versions  # noqa: E402
from kernellab.harness.compare import judge  # noqa: E402
from kernellab.harness.results import write_jsonl  # noqa: E402
from kernellab.ops.weight_only_matmul import SPEC, SPEC_INT4, quantize_weight, wo_reference  # noqa: E402
from kernellab.ops.weight_only_matmul import cuda as wo_cuda  # noqa: E402
from kernellab.ops.weight_only_matmul import triton as wo_triton  # noqa: E402
from kernellab.ops.weight_only_matmul.cuda import (  # noqa: E402
    V4_EXTRA_KERNELS,
    V4_EXTRA_OPTION,
    V4_KERNELS,
    V5_OPTION,
    V4Config,
    V4Plan,
    V5Config,
)
from kernellab.ops.weight_only_matmul.triton import TritonPlan, WoConfig  # noqa: E402

WEIGHTS = ((14336, 4096), (4096, 14336), (4096, 4096))
MS = (1, 16)
TARGET, MARGIN = 1.6, 1.8

# the sweep's builds of wo_matmul.cu: v4 alone, with KL_WO_V4_EXTRA's candidate kernels
SWEEP_OPTIONS = ("-DKL_WO_V4_ONLY=1", V4_EXTRA_OPTION)
SWEEP_KERNELS = V4_KERNELS + V4_EXTRA_KERNELS  # (mt, rt, u, pipe)

# cuda_v4 plans: every (rt, u, pipe) of the sweep's build, warps along N x along K, K
# slices to reach blocks_per_sm (0: none). Resolved per shape; those beyond 512 threads
# or 48 KB, or with no kernel at the shape's mt, skipped. (No launch of warps (4, 2) or
# blocks_per_sm 1 or 4 was among the 3 fastest in the previous sweep.)
V4_WARPS = ((1, 4), (1, 8), (1, 16), (2, 4), (2, 8), (4, 4))
V4_BPS = (0, 2)
V4_GRID = [
    V4Plan(rt, u, wn, wk, bps, pipe)
    for (rt, u, pipe), (wn, wk), bps in itertools.product(
        dict.fromkeys(k[1:] for k in SWEEP_KERNELS), V4_WARPS, V4_BPS
    )
]

# Triton plans (each distinct one compiles: ~1 s each on the GPU machine, so a short list)
TRITON_GRID = {
    "gemv": [
        TritonPlan(bn, bk, w, 3, pps)
        for (bn, bk), w, pps in itertools.product(
            ((4, 1024), (4, 2048), (8, 512), (8, 1024), (16, 256), (16, 512), (32, 256)), (4, 8), (0, 2)
        )
    ],
    "dot16": [
        TritonPlan(bn, bk, w, st, pps)
        for (bn, bk, w, st), pps in itertools.product(
            (
                (16, 256, 4, 4),
                (32, 256, 4, 4),
                (64, 256, 4, 4),
                (64, 128, 4, 4),
                (64, 256, 8, 3),
                (128, 128, 4, 4),
                (128, 128, 8, 4),
            ),
            (0, 2, 4),
        )
    ],
    # the TMA kernel (int8 weight tiles by tensor descriptor, num_stages deep), for both
    # classes: 8-32 KB tiles, 4-8 stages (<= 197 KB of shared memory), K slices to 2 or 4
    # programs per SM or none (N = 4096 in tiles of 64 is 64 programs for 132 SMs)
    "tma": [
        TritonPlan(bn, bk, w, st, pps, kind="tma")
        for (bn, bk, w, st), pps in itertools.product(
            (
                (64, 256, 4, 4),
                (64, 256, 4, 6),
                (64, 256, 4, 8),
                (64, 128, 4, 8),
                (128, 128, 4, 6),
                (128, 128, 4, 8),
                (128, 128, 8, 8),
                (128, 256, 8, 5),
            ),
            (0, 2, 4),
        )
    ],
}
# the TMA kernel's checks: whole steps, and K slices with a 128-wide tile (bf16 and fp16 for
# the first, bf16 for the second: each (dtype, bias, slices, K % BLOCK_K) compiles once)
TMA_CHECK = [WoConfig("tma", 16, 64, 256, 1, 4, 6), WoConfig("tma", 16, 128, 128, 3, 4, 8)]

# other builds of wo_matmul.cu (SWEEP_OPTIONS and one more), against the default
# (KL_WO_HINT=2: weights skip L1 and ask L2 for 256 B; KL_WO_V4_MINB=1)
BUILDS = (
    ("hint1", "-DKL_WO_HINT=1"),  # no L2 prefetch size
    ("hint0", "-DKL_WO_HINT=0"),  # plain ld.global.nc: weights through L1 like x
    ("minb0", "-DKL_WO_V4_MINB=0"),  # ptxas free to aim at 64 registers (loads sunk between mmas)
)

CHECK_SHAPES = [  # (M, N, K)
    (1, 4096, 4096),
    (16, 4096, 14336),
    (1, 1000, 1040),  # K = 16 x 65: no whole step of 256
    (3, 77, 144),
    (16, 33, 4112),
    (9, 130, 272),
    (17, 64, 512),  # two groups of x rows
    (5, 1, 16),  # one output channel, one chunk
    (2, 3, 2064),
    (4, 48, 832),  # one warp along K: 3 whole steps of 256 + 64, 6 of 128 + 64, 13 of 64
]
CHECK_LAUNCHES = [  # every kernel of the sweep's build at 1 and more warps along K, K sliced
    V4Config(mt, rt, u, wn, wk, split, pipe)
    for (mt, rt, u, pipe) in SWEEP_KERNELS
    for (wn, wk, split) in ((1, 1, 1), (1, 8, 1), (2, 4, 3), (1, 4, 16))
]


# v5's checks: small and large kc, 2-4 stages (the ring wraps within a tile), 2-8
# consumer warps, one persistent block over every row tile (grid 1), K sliced (split 3);
# each at mt 8 and 16
V5_CHECK = [
    V5Config(mt, rt, kc, st, wc, split, grid)
    for mt in (8, 16)
    for (rt, kc, st, wc, split, grid) in (
        (2, 128, 2, 2, 1, 0),
        (4, 512, 3, 8, 1, 0),
        (8, 256, 4, 4, 3, 1),
        (2, 1024, 2, 8, 2, 2),
    )
]
V5_CHECK_SHAPES = CHECK_SHAPES + [(1, 1, 4096), (16, 8, 131072)]  # one row; 16 x rows of a long K
V5_TIME_LIMIT = 240  # s, the child's (compile ~20 s, checks, ~120 timed launches)
V5_RINGS = (96 * 1024, 192 * 1024)  # bytes of ring per block the candidates aim at


def v5_candidates(m, n, k, n_sm):
    """v5 launches for one shape: 32-128 rows per block, kc 512 or 1024, a ring of ~96 or
    ~192 KB, 4 or 8 consumer warps; K sliced where the row tiles are fewer than half the
    SMs; persistent blocks (one wave of as many as fit per SM) where tiles exceed them."""
    mt = 8 if m <= 8 else 16
    out = []
    for rt, kc, ring, warps in itertools.product((2, 4, 8), (512, 1024), V5_RINGS, (4, 8)):
        probe = V5Config(mt, rt, kc, 2, warps)
        stages = max(2, ring // probe.stage_bytes)
        while stages > 2 and V5Config(mt, rt, kc, stages, warps).shared > wo_cuda.V5_MAX_SHARED:
            stages -= 1
        if V5Config(mt, rt, kc, stages, warps).shared > wo_cuda.V5_MAX_SHARED:
            continue  # not even two stages fit
        tiles = -(-n // probe.rows)
        split = max(1, min(16, n_sm // tiles, k // (4 * kc))) if 2 * tiles <= n_sm else 1
        cfg = V5Config(mt, rt, kc, stages, warps, split)
        fit = max(1, wo_cuda.V5_MAX_SHARED // cfg.shared)
        if tiles * split > fit * n_sm:
            cfg = V5Config(mt, rt, kc, stages, warps, split, fit * n_sm // split)
        out.append(cfg)
    return list(dict.fromkeys(out))


def timer(dev, warmup, rep):
    if dev == "cuda":
        import triton.testing

        def run(fn):
            # two quantiles: do_bench returns a bare float for one
            return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, quantiles=[0.5, 0.2])[0])

        return run

    def run(fn):
        ts = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e3)
        return sorted(ts)[1]

    return run


class Run:
    def __init__(self, args, dev, meta, jsonl):
        self.args, self.dev, self.meta, self.jsonl = args, dev, meta, jsonl
        self.t0 = time.perf_counter()
        self.failures = []
        self.modules = {"default": Module(wo_cuda.MODULE.path, options=SWEEP_OPTIONS)}  # build name -> Module
        self.v4_ok = True  # False when the check stage's process died

    def late(self, what):
        if time.perf_counter() - self.t0 > self.args.max_seconds:
            print(f"  ({what}: skipped, past --max-seconds {self.args.max_seconds:.0f})", flush=True)
            return True
        return False

    def row(self, **kw):
        write_jsonl([{**kw, **self.meta}], self.jsonl)

    def fail(self, what, detail):
        self.failures.append(f"{what}: {detail}")
        print(f"  CHECK FAILED {what}: {detail}", flush=True)


def v4_fn(run, x, w, s, b, cfg, build="default"):
    """cuda_v4 with launch ``cfg`` (dry run: the torch backend stands in)."""
    if run.dev != "cuda":
        return lambda: kernellab.int8_weight_only_matmul(x, w, s, b, backend="torch")
    mod = run.modules[build]
    return lambda: wo_cuda.cuda_wo_fwd(x, w, s, b, 8, "v4", config=cfg, module=mod)


def triton_fn(x, w, s, b, cfg, bits=8):
    return lambda: wo_triton.triton_wo_fwd(x, w, s, b, bits, cfg)


def v5_fn(run, x, w, s, b, cfg):
    """v5 with launch ``cfg`` (dry run: the torch backend stands in, after the launch is
    validated)."""
    wo_cuda.check_v5_config(cfg, run.modules["v5"])
    if run.dev != "cuda":
        return lambda: kernellab.int8_weight_only_matmul(x, w, s, b, backend="torch")
    mod = run.modules["v5"]
    return lambda: wo_cuda.cuda_wo_fwd(x, w, s, b, 8, "v5", config=cfg, module=mod)


def case(shape, dtype, dev, seed, bits=8, bias=True):
    spec = SPEC if bits == 8 else SPEC_INT4
    x, w, s = spec.make_inputs(shape, dtype, dev, seed=seed)
    b = torch.randn(shape[1], device=dev).to(dtype) if bias else None
    ref = wo_reference(x.double(), w, s.double(), None if b is None else b.double(), bits=bits)
    fn = kernellab.int8_weight_only_matmul if bits == 8 else kernellab.int4_weight_only_matmul
    base = fn(x, w, s, b, backend="torch")
    return x, w, s, b, ref, base


# --------------------------------------------------------------------------- 1. check


def check_stage(run):
    print("\n## check: cuda_v4 launches, builds, defaults, Triton fp32 (err / bound)", flush=True)
    dev = run.dev
    shapes = [(1, 40, 144), (16, 33, 272), (17, 20, 64), (3, 5, 16)] if run.args.dry else CHECK_SHAPES
    dtypes = (torch.bfloat16,) if run.args.dry else (torch.bfloat16, torch.float16)
    n_checked = 0
    for dtype, shape in itertools.product(dtypes, shapes):
        if run.late("check"):
            return
        m, n, k = shape
        x, w, s, b, ref, base = case(shape, dtype, dev, seed=sum(shape), bias=m % 2 == 1)
        line = []
        tries = []
        for cfg in CHECK_LAUNCHES:
            tries.append((f"v4 {cfg!r}", v4_fn(run, x, w, s, b, cfg)))
        tries.append(
            (
                "cuda",
                lambda: kernellab.int8_weight_only_matmul(
                    x, w, s, b, backend="cuda" if dev == "cuda" else "torch"
                ),
            )
        )
        if dtype == dtypes[0] and (n >= 4096 or run.args.dry):  # (each Triton launch compiles once)
            tries.append(("triton", lambda: kernellab.int8_weight_only_matmul(x, w, s, b, backend="triton")))
        for cfg in TMA_CHECK[: 2 if dtype == torch.bfloat16 else 1]:
            tries.append((f"triton {cfg!r}", triton_fn(x, w, s, b, cfg)))
        worst = 0.0
        for name, fn in tries:
            try:
                v = judge(fn(), ref, dtype, base)
                ok, ratio, detail = v.ok, v.ratio, v.detail
            except Exception as e:  # noqa: BLE001 - reported, the run goes on
                ok, ratio, detail = False, math.inf, f"{type(e).__name__}: {str(e)[:200]}"
            n_checked += 1
            worst = max(worst, ratio)
            if not ok:
                run.fail(f"{name} {shape} {str(dtype)[6:]}", detail)
            run.row(
                bench="quant_sweep_check",
                backend=name,
                shape="x".join(map(str, shape)),
                dtype=str(dtype)[6:],
                status="ok" if ok else "rejected",
                err_ratio=ratio,
                detail=detail,
            )
        line.append(f"worst err/bound {worst:.2f} over {len(tries)} launches")
        print(f"  {str(dtype)[6:]:8s} {'x'.join(map(str, shape)):12s} " + "; ".join(line), flush=True)
    # NaN / inf in x: positions must match the reference (every kernel, one and four
    # warps along K: K = 512 is two whole steps of 256 for one warp)
    for mt_m in (1, 16):
        x, w, s, b, ref, base = case((mt_m, 96, 512), torch.bfloat16, dev, seed=7, bias=False)
        x[0, 3] = float("nan")
        x[-1, 100] = float("inf")
        ref = wo_reference(x.double(), w, s.double(), bits=8)
        for cfg in CHECK_LAUNCHES:
            if cfg.mt != (8 if mt_m == 1 else 16) or (cfg.wk, cfg.split) not in ((1, 1), (4, 3)):
                continue
            y = v4_fn(run, x, w, s, None, cfg)()
            if not (torch.equal(y.isnan(), ref.isnan()) and torch.equal(y.isinf(), ref.isinf())):
                run.fail(f"v4 specials M={mt_m} {cfg}", "NaN / inf positions differ from the reference")
        for cfg in TMA_CHECK:
            y = triton_fn(x, w, s, None, cfg)()
            if not (torch.equal(y.isnan(), ref.isnan()) and torch.equal(y.isinf(), ref.isinf())):
                run.fail(f"triton specials M={mt_m} {cfg}", "NaN / inf positions differ from the reference")
    # the TMA kernel where TMA cannot run (K % 16 != 0; a weight 1 byte off 16-byte
    # alignment): the launcher runs the dot kernel with the same tiles
    for shape, shifted in (((3, 40, 1000), False), ((2, 24, 160), True)):
        x, w, s, b, ref, base = case(shape, torch.bfloat16, dev, seed=5)
        if shifted:
            w = torch.empty(w.numel() + 1, dtype=w.dtype, device=dev)[1:].view(w.shape).copy_(w)
        v = judge(triton_fn(x, w, s, b, TMA_CHECK[0])(), ref, torch.bfloat16, base)
        if not v.ok:
            run.fail(f"triton tma fallback {shape}", v.detail)
    # the other builds of wo_matmul.cu
    if dev == "cuda":
        for name, opt in BUILDS:
            if run.late(f"build {name}"):
                continue
            t = time.perf_counter()
            try:
                run.modules[name] = Module(wo_cuda.MODULE.path, options=(opt, *SWEEP_OPTIONS))
                x, w, s, b, ref, base = case((16, 1000, 1040), torch.bfloat16, dev, seed=3)
                for cfg in CHECK_LAUNCHES:
                    v = judge(v4_fn(run, x, w, s, b, cfg, name)(), ref, torch.bfloat16, base)
                    if not v.ok:
                        run.fail(f"build {name} {cfg}", v.detail)
                print(
                    f"  build {name} ({opt}): compiled and checked in {time.perf_counter() - t:.1f} s",
                    flush=True,
                )
            except Exception as e:  # noqa: BLE001
                run.fail(f"build {name}", f"{type(e).__name__}: {str(e)[:300]}")
                run.modules.pop(name, None)
    # Triton at fp32 x: fp64 sums (4 x 40 x 258: a masked step and two K slices)
    for bits in (8, 4):
        for shape in ((4, 40, 258), (1, 96, 520)):
            x, w, s, b, ref, base = case(shape, torch.float32, dev, seed=11, bits=bits)
            fn = kernellab.int8_weight_only_matmul if bits == 8 else kernellab.int4_weight_only_matmul
            v = judge(fn(x, w, s, b, backend="triton"), ref, torch.float32, base)
            if not v.ok:
                run.fail(f"triton int{bits} fp32 {shape}", v.detail)
            print(
                f"  triton int{bits} fp32 {'x'.join(map(str, shape)):10s} err/bound {v.ratio:.2f}", flush=True
            )
    print(f"check: {n_checked} launches, {len(run.failures)} failures", flush=True)


# --------------------------------------------------------------------------- 2b. v5


def v5_stage(run, copy_gbps):
    """v5: check every V5_CHECK launch, then time v5_candidates at the sweep's shapes."""
    print("\n## v5 (bulk-copy ring, sm_90): check, then time (median ms, L2 flushed)", flush=True)
    dev = run.dev
    if dev == "cuda" and wo_cuda.v5_unavailable(torch.cuda.get_device_capability()):
        print(f"  left out: {wo_cuda.v5_unavailable(torch.cuda.get_device_capability())}", flush=True)
        return
    t = time.perf_counter()
    run.modules["v5"] = Module(wo_cuda.MODULE.path, options=("-DKL_WO_V4_ONLY=1", V5_OPTION))
    if dev == "cuda":
        run.modules["v5"].kernel("wo_v5_m8_r2_bf16", wo_cuda._SIG_V5)  # compile once, here
    print(f"  build: {time.perf_counter() - t:.1f} s", flush=True)
    n_fail = len(run.failures)
    shapes = [(1, 40, 144), (17, 20, 1040)] if run.args.dry else V5_CHECK_SHAPES
    dtypes = (torch.bfloat16,) if run.args.dry else (torch.bfloat16, torch.float16)
    n_checked = 0
    for dtype, shape in itertools.product(dtypes, shapes):
        x, w, s, b, ref, base = case(shape, dtype, dev, seed=sum(shape) + 1, bias=shape[0] % 2 == 1)
        for cfg in V5_CHECK:
            try:
                v = judge(v5_fn(run, x, w, s, b, cfg)(), ref, dtype, base)
                ok, detail = v.ok, v.detail
            except Exception as e:  # noqa: BLE001 - reported, the run goes on
                ok, detail = False, f"{type(e).__name__}: {str(e)[:200]}"
            n_checked += 1
            if not ok:
                run.fail(f"v5 {cfg!r} {shape} {str(dtype)[6:]}", detail)
    for mt_m in (1, 16):  # NaN / inf in x: positions as the reference's
        x, w, s, b, ref, base = case((mt_m, 96, 1040), torch.bfloat16, dev, seed=7, bias=False)
        x[0, 3] = float("nan")
        x[-1, 1030] = float("inf")  # in the last, partial stage of kc 128 .. 1024
        ref = wo_reference(x.double(), w, s.double(), bits=8)
        for cfg in V5_CHECK:
            y = v5_fn(run, x, w, s, None, cfg)()
            n_checked += 1
            if not (torch.equal(y.isnan(), ref.isnan()) and torch.equal(y.isinf(), ref.isinf())):
                run.fail(f"v5 specials M={mt_m} {cfg!r}", "NaN / inf positions differ from the reference")
    if dev == "cuda":
        torch.cuda.synchronize()
    print(f"  check: {n_checked} launches, {len(run.failures) - n_fail} failures", flush=True)
    if len(run.failures) > n_fail:
        print("  v5 is not timed: its checks failed", flush=True)
        return

    n_sm = torch.cuda.get_device_properties(0).multi_processor_count if dev == "cuda" else 4
    screen, final = timer(dev, 5, 15), timer(dev, 10, 60)
    weights = ((256, 512),) if run.args.dry else WEIGHTS + ((4096, 4096),)
    print(
        f"{'M':>3s} {'N':>6s} {'K':>6s} | {'bf16 ms':>8s} | {'v5 best':>8s} {'x':>5s} {'%copy':>5s} | config"
    )
    for n, k in dict.fromkeys(weights):
        gen, wbf, q, s = weights_for(n, k, dev)
        for m in MS:
            if run.late(f"v5 timing at {m}x{n}x{k} and after"):
                return
            x = torch.randn(m, k, generator=gen, device=dev).to(torch.bfloat16)
            ref = wo_reference(x.double(), q, s.double(), bits=8)
            base = kernellab.int8_weight_only_matmul(x, q, s, backend="torch")
            bf16 = final(lambda: F.linear(x, wbf))
            got = {}
            for cfg in v5_candidates(m, n, k, n_sm):
                got[cfg] = timed(run, screen, v5_fn(run, x, q, s, None, cfg), ref, base, f"v5 {cfg!r}")
            ranked = (
                sorted(((t, c) for c, t in got.items() if t), key=lambda e: e[0]) if dev == "cuda" else []
            )
            for _, cfg in ranked[:3]:  # the 3 fastest again, longer
                got[cfg] = final(v5_fn(run, x, q, s, None, cfg))
            for cfg, ms in got.items():
                run.row(bench="quant_sweep_v5", shape=f"{m}x{n}x{k}", config=repr(cfg), ms=ms, bf16_ms=bf16)
            timed_ = [(t, c) for c, t in got.items() if t]
            if not timed_:
                continue
            t, cfg = min(timed_, key=lambda e: e[0])
            pct = 100 * n * k / t / 1e6 / copy_gbps if copy_gbps else math.nan
            print(
                f"{m:3d} {n:6d} {k:6d} | {bf16:8.4f} | {t:8.4f} {bf16 / t:5.2f} {pct:5.1f} | {cfg!r}",
                flush=True,
            )


def v5_in_a_child(run, out: Path, copy_gbps) -> None:
    """v5_stage in a child process with a time limit (a hung ring is killed, and a dead
    CUDA context stays the child's)."""
    status = out / "quant_sweep_v5.json"
    status.unlink(missing_ok=True)
    cmd = [sys.executable, __file__, "--out", str(out), "--v5-only", "--copy-gbps", str(copy_gbps or 0)]
    try:
        rc = subprocess.run(cmd, timeout=V5_TIME_LIMIT).returncode
    except subprocess.TimeoutExpired:
        run.fail("v5 stage", f"killed after {V5_TIME_LIMIT} s (a hung mbarrier ring?)")
        return
    got = json.loads(status.read_text()) if status.exists() else None
    if got is None or rc not in (0, 1):
        run.fail("v5 stage", f"the child died (exit status {rc})")
    if got:
        run.failures += got["failures"]


# --------------------------------------------------------------------------- 3. sweep


def weights_for(n, k, dev):
    gen = torch.Generator(device=dev).manual_seed(n + k)
    w = (torch.randn(n, k, generator=gen, device=dev) * k**-0.5).to(torch.bfloat16)
    q, s = quantize_weight(w, 8)
    return gen, w, q, s


def sweep_stage(run, copy_gbps):
    """Three passes over the shapes, most important first (a pass cut short by
    --max-seconds leaves the earlier ones whole): cuda_v4's grid and the bf16 baseline;
    Triton's plans (compiles); the 3 fastest of each timed longer, v4's in every build."""
    print("\n## sweep (bf16 x): every candidate checked, then timed (median ms, L2 flushed)", flush=True)
    dev = run.dev
    n_sm = torch.cuda.get_device_properties(0).multi_processor_count if dev == "cuda" else 4
    screen, final = timer(dev, 5, 15), timer(dev, 10, 60)
    weights = ((256, 512), (64, 1024)) if run.args.dry else WEIGHTS
    cases, results = {}, {}  # (n, k, m) -> (x, q, s, w_bf16, ref, base); -> timings
    for n, k in weights:
        gen, wbf, q, s = weights_for(n, k, dev)
        for m in MS:
            x = torch.randn(m, k, generator=gen, device=dev).to(torch.bfloat16)
            ref = wo_reference(x.double(), q, s.double(), bits=8)
            base = kernellab.int8_weight_only_matmul(x, q, s, backend="torch")
            cases[(n, k, m)] = (x, q, s, wbf, ref, base)
            results[(n, k, m)] = {"v4": {}, "triton": {}, "plans_v4": {}, "plans_triton": {}, "builds": {}}

    def fn_for(key, shape, cfg, build="default"):
        x, q, s = cases[shape][:3]
        return v4_fn(run, x, q, s, None, cfg, build) if key == "v4" else triton_fn(x, q, s, None, cfg)

    print("pass 1: cuda_v4 plans" + ("" if run.v4_ok else " (left out: the check stage died)"), flush=True)
    for shape, r in results.items():
        if run.late(f"v4 pass at {shape} and after"):
            break
        n, k, m = shape
        x, q, s, wbf, ref, base = cases[shape]
        t = time.perf_counter()
        r["bf16"] = screen(lambda: F.linear(x, wbf))
        if not run.v4_ok:
            continue
        mt = 8 if m <= 8 else 16
        for plan in V4_GRID:
            cfg = plan.config(mt, n, k, n_sm)
            try:
                wo_cuda.check_v4_config(cfg, run.modules["default"])
            except ValueError:
                continue
            r["plans_v4"].setdefault(cfg, []).append(plan)
            if cfg not in r["v4"]:
                r["v4"][cfg] = timed(run, screen, fn_for("v4", shape, cfg), ref, base, f"v4 {cfg}")
        r["default_v4"] = cfg = wo_cuda.v4_config(m, n, k, n_sm)
        if cfg not in r["v4"]:
            r["v4"][cfg] = timed(run, screen, fn_for("v4", shape, cfg), ref, base, f"v4 default {cfg}")
        print(f"  {m}x{n}x{k}: {len(r['v4'])} launches in {time.perf_counter() - t:.1f} s", flush=True)

    print("pass 2: Triton plans (first calls compile)", flush=True)
    for shape, r in results.items():
        n, k, m = shape
        x, q, s, wbf, ref, base = cases[shape]
        t = time.perf_counter()
        kernel, cls = ("gemv", "gemv") if m == 1 else ("dot", "dot16")
        plans = TRITON_GRID[cls] + TRITON_GRID["tma"]
        for i, plan in enumerate(plans):
            if run.late(f"Triton plans {i + 1}-{len(plans)} at {shape}"):
                break
            cfg = plan.config(kernel, n, k, 8, n_sm)
            if run.args.dry:  # the interpreter: one small config stands in for each
                cfg = WoConfig(cfg.kernel, cfg.block_m, 16, 64, min(cfg.split_k, 2))
            r["plans_triton"].setdefault(cfg, []).append(plan)
            if cfg not in r["triton"]:
                r["triton"][cfg] = timed(
                    run, screen, fn_for("triton", shape, cfg), ref, base, f"triton {cfg}"
                )
        r["default_triton"] = cfg = wo_triton.wo_config(m, n, k, 8, n_sm)
        if cfg not in r["triton"] and not run.late(f"Triton default at {shape}"):
            r["triton"][cfg] = timed(
                run, screen, fn_for("triton", shape, cfg), ref, base, f"triton default {cfg}"
            )
        print(f"  {m}x{n}x{k}: {len(r['triton'])} launches in {time.perf_counter() - t:.1f} s", flush=True)

    print("pass 3: the 3 fastest of each, timed longer; v4's in every build", flush=True)
    for shape, r in results.items():
        if run.late(f"final pass at {shape} and after"):
            break
        n, k, m = shape
        x, q, s, wbf, ref, base = cases[shape]
        r["bf16"] = final(lambda: F.linear(x, wbf))
        for key in ("v4", "triton"):
            ranked = sorted(((t, c) for c, t in r[key].items() if t is not None), key=lambda e: e[0])
            top = ranked[:3]
            if key == "triton":  # and the 2 fastest TMA launches
                top += [e for e in ranked if e[1].kernel == "tma" and e not in top][:2]
            for _, cfg in top:
                r[key][cfg] = final(fn_for(key, shape, cfg))
                if key == "v4":
                    for build in run.modules:
                        if build != "default":
                            r["builds"][(build, cfg)] = timed(
                                run, final, fn_for(key, shape, cfg, build), ref, base, f"v4 {build} {cfg}"
                            )

    for shape, r in results.items():
        n, k, m = shape
        if "bf16" not in r:
            continue
        wb = n * k
        for key in ("v4", "triton"):
            for cfg, ms in r[key].items():
                run.row(
                    bench="quant_sweep",
                    op="int8_weight_only_matmul",
                    backend=key,
                    config=repr(cfg),
                    shape=f"{m}x{n}x{k}",
                    dtype="bf16",
                    median_ms=ms,
                    gbps=wb / ms / 1e6 if ms else None,
                    x_bf16=r["bf16"] / ms if ms else None,
                )
        for (build, cfg), ms in r["builds"].items():
            run.row(
                bench="quant_sweep",
                op="int8_weight_only_matmul",
                backend=f"v4 {build}",
                config=repr(cfg),
                shape=f"{m}x{n}x{k}",
                dtype="bf16",
                median_ms=ms,
            )
        run.row(
            bench="quant_sweep",
            op="matmul",
            backend="bf16_cublas",
            shape=f"{m}x{n}x{k}",
            dtype="bf16",
            median_ms=r["bf16"],
        )
        print(f"\n  M={m:3d} N={n:5d} K={k:5d}: bf16 cuBLAS {r['bf16']:.4f} ms", flush=True)
        for key in ("v4", "triton"):
            top = sorted(((t, repr(c)) for c, t in r[key].items() if t is not None), key=lambda e: e[0])[:3]
            for t, c in top:
                gbps = wb / t / 1e6
                pct = f"{100 * gbps / copy_gbps:5.1f}%" if copy_gbps else "   - "
                print(
                    f"    {key:6s} {t:8.4f} ms {gbps:6.0f} GB/s {pct} {r['bf16'] / t:5.2f}x  {c}", flush=True
                )
        tma = best_tma(r)
        if tma:
            t, c = tma
            gbps = wb / t / 1e6
            pct = f"{100 * gbps / copy_gbps:5.1f}%" if copy_gbps else "   - "
            print(
                f"    {'tma':6s} {t:8.4f} ms {gbps:6.0f} GB/s {pct} {r['bf16'] / t:5.2f}x  {c!r}", flush=True
            )
        for (build, cfg), t in r["builds"].items():
            if t:
                print(f"    v4 build {build}: {t:.4f} ms {r['bf16'] / t:5.2f}x  {cfg!r}", flush=True)
    return {sh: r for sh, r in results.items() if "bf16" in r}, n_sm


def timed(run, t, fn, ref, base, what):
    """Check ``fn``'s output once, then time it; None (and a failure) when it is wrong."""
    try:
        v = judge(fn(), ref, torch.bfloat16, base)
        if not v.ok:
            run.fail(what, v.detail)
            return None
        return t(fn)
    except Exception as e:  # noqa: BLE001 - reported, the run goes on
        run.fail(what, f"{type(e).__name__}: {str(e)[:200]}")
        if run.args.verbose:
            traceback.print_exc()
        return None


def best_tma(r):
    """(ms, WoConfig) of the fastest "tma" launch of a shape's results, or None."""
    got = [(t, c) for c, t in r["triton"].items() if t and c.kernel == "tma"]
    return min(got, key=lambda e: e[0]) if got else None


# --------------------------------------------------------------------------- 4. summary


def best_plans(results, key, plan_key, classes, keep=lambda plan: True):
    """Per class: the plan whose total of (time / the shape's best time) over the class's
    shapes is least (a plan that never ran on a shape of its class is left out); only
    plans ``keep`` accepts."""
    out = {}
    for cls, shapes in classes.items():
        totals = {}
        for shape in shapes:
            r = results.get(shape)
            if not r:
                continue
            best = min((t for t in r[key].values() if t), default=None)
            if best is None:
                continue
            seen = {}
            for cfg, plans in r[plan_key].items():
                t = r[key].get(cfg)
                for p in plans:
                    if keep(p):
                        seen[p] = t / best if t else math.inf
            for p, v in seen.items():
                totals.setdefault(p, []).append(v)
        n = max((len(v) for v in totals.values()), default=0)
        ranked = sorted(((sum(v), p) for p, v in totals.items() if len(v) == n), key=lambda e: e[0])
        if ranked:
            out[cls] = (ranked[0][1], ranked[0][0] / n)
    return out


def plan_speedups(results, tclasses, kernel, cls, plan):
    """'MxNxK 1.72x, ...': bf16 cuBLAS ms / the plan's ms on each shape of its class."""
    out = []
    for n, k, m in tclasses[(kernel, cls)]:
        r = results[(n, k, m)]
        t = next((r["triton"].get(c) for c, ps in r["plans_triton"].items() if plan in ps), None)
        out.append(f"{m}x{n}x{k} " + (f"{r['bf16'] / t:.2f}x" if t else "failed"))
    return ", ".join(out)


def summary(run, results, n_sm, copy_gbps):
    print(
        "\n## summary (bf16 x): best launch per kind; x = bf16 cuBLAS ms / ms; %copy of "
        f"{copy_gbps or float('nan'):.0f} GB/s",
        flush=True,
    )
    print(
        f"{'M':>3s} {'N':>6s} {'K':>6s} | {'bf16 ms':>8s} | {'v4 best':>8s} {'x':>5s} {'%copy':>5s} | "
        f"{'v4 dflt':>8s} {'x':>5s} | {'triton best':>11s} {'x':>5s} | {'tr dflt':>8s} {'x':>5s} | "
        f"{'tma best':>8s} {'x':>5s} {'%copy':>5s}",
        flush=True,
    )
    verdicts = []
    for (n, k, m), r in results.items():
        base = r["bf16"]

        def best(key):
            got = [t for t in r[key].values() if t]
            return min(got) if got else math.nan

        v4b, trb = best("v4"), best("triton")
        v4d, trd = (
            r["v4"].get(r.get("default_v4")) or math.nan,
            r["triton"].get(r.get("default_triton")) or math.nan,
        )
        pct = 100 * n * k / v4b / 1e6 / copy_gbps if copy_gbps and v4b == v4b else math.nan
        tmab = (best_tma(r) or (math.nan,))[0]
        tpct = 100 * n * k / tmab / 1e6 / copy_gbps if copy_gbps and tmab == tmab else math.nan
        print(
            f"{m:3d} {n:6d} {k:6d} | {base:8.4f} | {v4b:8.4f} {base / v4b:5.2f} {pct:5.1f} | "
            f"{v4d:8.4f} {base / v4d:5.2f} | {trb:11.4f} {base / trb:5.2f} | {trd:8.4f} {base / trd:5.2f} | "
            f"{tmab:8.4f} {base / tmab:5.2f} {tpct:5.1f}",
            flush=True,
        )
        if m in MS and {n, k} == {4096, 14336}:
            x = base / min((t for t in (v4b, trb) if t == t), default=math.inf)
            verdicts.append(
                f"M={m} {n}x{k}: best int8 {x:.2f}x bf16 cuBLAS "
                + (
                    "-> target met" + (" with margin" if x >= MARGIN else " (under 1.8x margin)")
                    if x >= TARGET
                    else "-> TARGET MISSED"
                )
            )
    classes = {}
    for n, k, m in results:
        mt = 8 if m <= 8 else 16
        classes.setdefault((mt, wo_cuda.shape_class(n, n_sm)), []).append((n, k, m))
    print(
        "\nV4_PLANS from this run (paste into src/kernellab/ops/weight_only_matmul/cuda.py; "
        "after #: mean over the class's shapes of time / that shape's best):",
        flush=True,
    )
    for (mt, cls), (plan, score) in sorted(best_plans(results, "v4", "plans_v4", classes).items(), key=str):
        key = (mt, plan.rt, plan.u, plan.pipe)
        extra = "" if key in V4_KERNELS else f"; {key}: only in {V4_EXTRA_OPTION}, move it to KL_WO_V4_ALL"
        print(f'    ({mt}, "{cls}"): {plan!r},  # {score:.3f}{extra}', flush=True)
    tclasses = {}
    for (mt, cls), shapes in classes.items():
        tclasses[("gemv" if mt == 8 else "dot16", cls)] = shapes
    print("TRITON_PLANS from this run (src/kernellab/ops/weight_only_matmul/triton.py):", flush=True)
    for (kernel, cls), (plan, score) in sorted(
        best_plans(results, "triton", "plans_triton", tclasses).items(), key=str
    ):
        xs = plan_speedups(results, tclasses, kernel, cls, plan)
        print(f'    ("{kernel}", "{cls}"): {plan!r},  # {score:.3f}; {xs}', flush=True)
    print(
        'the best "tma" plan per class (pasteable the same way; after #: as above, then '
        "x bf16 cuBLAS per shape):",
        flush=True,
    )
    for (kernel, cls), (plan, score) in sorted(
        best_plans(results, "triton", "plans_triton", tclasses, keep=lambda p: p.kind == "tma").items(),
        key=str,
    ):
        xs = plan_speedups(results, tclasses, kernel, cls, plan)
        print(f'    ("{kernel}", "{cls}"): {plan!r},  # {score:.3f}; {xs}', flush=True)
    for v in verdicts:
        print(v, flush=True)


def checked_in_a_child(run, out: Path) -> None:
    """Stage 1 in a child process: an illegal address in a new kernel kills the CUDA
    context, and with it every later measurement; in a child it costs only the v4 part.
    The child's compiles stay in the disk caches for this process."""
    status = out / "quant_sweep_check.json"
    status.unlink(missing_ok=True)
    cmd = [
        sys.executable,
        __file__,
        "--out",
        str(out),
        "--check-only",
        "--max-seconds",
        str(run.args.max_seconds),
    ]
    rc = subprocess.run(cmd + (["--verbose"] if run.args.verbose else [])).returncode
    got = json.loads(status.read_text()) if status.exists() else None
    if got is None or rc not in (0, 1) or got["dead"]:
        run.v4_ok = False
        run.fail("check stage", f"the CUDA context died (exit status {rc}): cuda_v4 is left out of the sweep")
        if got:
            run.failures += got["failures"]
        return
    run.failures += got["failures"]
    for name, opt in BUILDS:
        if name in got["builds"]:
            run.modules[name] = Module(wo_cuda.MODULE.path, options=(opt, *SWEEP_OPTIONS))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--dry", action="store_true", help="tiny shapes on the CPU: exercises the script")
    p.add_argument("--max-seconds", type=float, default=200.0, help="no stage or shape starts after")
    p.add_argument("--verbose", action="store_true")
    p.add_argument("--check-only", action="store_true", help="stage 1 only (the sweep runs it in a child)")
    p.add_argument("--v5-only", action="store_true", help="stage 2b only (the sweep runs it in a child)")
    p.add_argument("--copy-gbps", type=float, default=0.0, help="with --v5-only: the parent's copy bandwidth")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.dry and not torch.cuda.is_available():
        print("no GPU (use --dry to exercise the script on the CPU)")
        return 2
    dev = "cpu" if args.dry else "cuda"
    gpu = "cpu dry run" if args.dry else torch.cuda.get_device_name()
    meta = {"gpu": gpu, **versions(), "git_sha": git_sha(), "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
    print(f"{gpu}  torch {meta['torch']}  triton {meta['triton']}  sha {meta['git_sha']}", flush=True)
    run = Run(args, dev, meta, out / "quant_sweep.jsonl")
    if args.v5_only:
        try:
            v5_stage(run, args.copy_gbps or None)
        except Exception as e:  # noqa: BLE001 - reported to the parent
            run.fail("v5 stage", f"{type(e).__name__}: {str(e)[:300]}")
        (out / "quant_sweep_v5.json").write_text(json.dumps({"failures": run.failures}))
        return 1 if run.failures else 0
    if args.check_only or args.dry:
        check_stage(run)
        if args.check_only:
            try:  # a kernel's illegal address makes every later call fail: say so
                torch.cuda.synchronize()
                dead = False
            except Exception:  # noqa: BLE001
                dead = True
            builds = [b for b in run.modules if b != "default"]
            status = {"failures": run.failures, "builds": builds, "dead": dead}
            (out / "quant_sweep_check.json").write_text(json.dumps(status))
            return 1 if run.failures else 0
    else:
        checked_in_a_child(run, out)
    copy_gbps = None
    if dev == "cuda":
        from kernellab import device

        copy_gbps = device._copy_gbps((1 << 30) // 4)
        print(f"\ncopy bandwidth: {copy_gbps:.0f} GB/s (read + write)", flush=True)
        v5_in_a_child(run, out, copy_gbps)
    else:
        v5_stage(run, None)
    results, n_sm = sweep_stage(run, copy_gbps)
    summary(run, results, n_sm, copy_gbps)
    total = time.perf_counter() - run.t0
    if run.failures:
        print(f"\nCHECK FAILED: {len(run.failures)} failures (first: {run.failures[0]})", flush=True)
    print(f"total {total:.0f} s; {len(run.failures)} failures; rows in {run.jsonl}", flush=True)
    return 1 if run.failures else 0


if __name__ == "__main__":
    sys.exit(main())
