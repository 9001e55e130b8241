"""Probe: can a Hopper-specific Triton forward attention (TMA tensor descriptors, automatic
warp specialization, persistent / work-balanced grids) beat kernellab's Triton forward and
cuDNN's SDPA at long sequences? (GPU; ``--cpu-smoke`` runs the whole pipeline on the CPU
under TRITON_INTERPRET=1 at a tiny shape.)

    python lab/probe_attn_fwd_ws.py [--out probe_attn_fwd_ws.jsonl] [--quick]
        [--shapes b2h32s8k_causal,...] [--variants tma_ws,tma,...] [--workers N]

The kernel here is one FlashAttention-2 forward (bf16 in, fp32 accumulation, online softmax
in exp2 units with the scale folded into log2(e); writes O and the row log-sum-exp in log2
units) with compile-time switches, so each variant isolates one feature:

    ptr           pointer loads (descriptors off), no warp specialization
    tma           device-side descriptors (tl.make_tensor_descriptor over the [B*H*S, D]
                  view; needs triton.set_allocator), no warp specialization
    tma_lpt       tma's binary, grid remapped: heavy query blocks of a group of heads first
                  (the group's K/V ~24 MB, so they stay in L2)
    tma_persist   tma, persistent grid (SMs x occupancy programs) walking tma_lpt's order
    hosttma       host-side triton.tools.tensor_descriptor.TensorDescriptor, no WS
    tma_ws        tma + tl.range(..., warp_specialize=True) on every key loop (causal: the
                  unmasked loop and the diagonal loop)
    tma_ws_main   causal only: WS on the unmasked key loop, the diagonal loop plain
    tma_ws_diag   causal only: WS loop over [0, m0), the diagonal's BLOCK_M / BLOCK_N
                  masked blocks as straight-line code after it
    tma_ws_1loop  causal only: one WS loop over all visible key blocks, mask on every block
    hosttma_ws    host descriptors + WS (upstream: Hopper WS wants device descriptors)
    ptr_ws, tma_ws_diag1st   not in the default set (pointer loads + WS asserted on Hopper,
                  triton-lang/triton#9728; diag1st: the diagonal before the WS loop)

Compiled offline by Triton 3.9 for sm_90 (no GPU; 3.6 on the H100 may differ): WS took
effect only with num_warps=4 (12 warps in all; at 8 the loop compiled plain, so WS variants
sweep their own configs, mostly 4-warp ones, and every row says "ws_applied"); at 4 warps
causal WS compiled only as tma_ws_1loop (tma_ws, tma_ws_main, tma_ws_diag: PassManager
failures), non-causal tma_ws compiled, hosttma_ws and ptr_ws failed.

Causal (S_q == S_k): key blocks wholly below the query block's first row run unmasked; only
the blocks that straddle the diagonal run masked. Query blocks are issued heaviest first.

Robustness: every config of every variant is compiled first in worker subprocesses (in
parallel, into Triton's on-disk cache, so the timing process then loads the binaries):
a compile error, an out-of-resource or a compiler abort is recorded for that config and the
run goes on. A variant whose every config failed is "unsupported: <error>". Budgets:
--compile-budget summed compile seconds per variant and kernel signature, --variant-budget
wall seconds per variant's timing sweep at one shape, --deadline the whole run (the compile
phase gets half of it; what is left over is recorded as skipped).

Per shape: each variant's compiled configs are timed briefly (do_bench 5/25 ms) and each
is checked once against SDPA in fp32 math (every head, or 4 heads at 32k; O's max abs error
> 2e-2 or the LSE's > 2e-2 is FAIL); the fastest correct one is timed with
do_bench(warmup=25, rep=100, median) beside kernellab.attention(backend="triton"), SDPA
cuDNN and SDPA flash (a variant with no correct config is FAIL, never a win). TFLOP/s =
4 B H S^2 D (halved when causal) / time. One JSON line per shape x provider goes to --out;
"sweep" in each line holds every config's status, time, errors and compile facts.
"""

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import zlib
from pathlib import Path

if "--cpu-smoke" in sys.argv:  # must precede the triton import
    os.environ["TRITON_INTERPRET"] = "1"

SRC = Path(__file__).resolve().parents[1] / "src"
sys.path.insert(0, str(SRC))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

try:
    from torch.nn.attention import SDPBackend, sdpa_kernel
except Exception:  # pragma: no cover
    SDPBackend = sdpa_kernel = None

try:
    from triton.tools.tensor_descriptor import TensorDescriptor

    _HOST_DESC_ERR = None
except Exception as e:  # noqa: BLE001
    TensorDescriptor = None
    _HOST_DESC_ERR = f"{type(e).__name__}: {e}"

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
DEVICE = "cpu" if INTERPRET else "cuda"
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
TOL = 2e-2

# --------------------------------------------------------------------------- kernels


@triton.jit
def _tile_order(t, BH, GH, num_m, CAUSAL: tl.constexpr):
    """Tile t -> (flat head bh, query block). Heads go in groups of GH; inside a group the
    tiles run query-block-major (every head's block i, then block i+1...), heaviest block
    first when causal. GH = 1: one head after another, its blocks heaviest first."""
    per_group = GH * num_m
    g = t // per_group
    r = t - g * per_group
    h0 = g * GH
    gh = tl.minimum(GH, BH - h0)
    m_idx = r // gh
    bh = h0 + (r - m_idx * gh)
    if CAUSAL:
        m_idx = num_m - 1 - m_idx
    return bh, m_idx


@triton.jit
def _ld(src, row0, r0, offs_r, offs_d, HEAD_D: tl.constexpr, LOAD: tl.constexpr):
    # A (rows x HEAD_D) tile at row r0 of this head. Pointers: src points at the head's
    # first row already; descriptors: rows are absolute in the [BH*S, D] view.
    if LOAD == 0:
        x = tl.load(src + (r0 + offs_r)[:, None] * HEAD_D + offs_d[None, :])
    else:
        x = src.load([row0 + r0, 0])
    return x


@triton.jit
def _step(acc, l_i, m_i, q, Kb, Vb, row0, n0, offs_m, offs_n, offs_d, qk_scale,
          MASKED: tl.constexpr, HEAD_D: tl.constexpr, LOAD: tl.constexpr,
          F32_DOTS: tl.constexpr):  # fmt: skip
    k = _ld(Kb, row0, n0, offs_n, offs_d, HEAD_D, LOAD)
    if F32_DOTS:
        k = k.to(tl.float32)
    qk = tl.dot(q, tl.trans(k))
    if MASKED:
        keep = (n0 + offs_n)[None, :] <= offs_m[:, None]
        s = tl.where(keep, qk * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
    else:
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        p = tl.math.exp2(qk * qk_scale - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    v = _ld(Vb, row0, n0, offs_n, offs_d, HEAD_D, LOAD)
    if F32_DOTS:
        v = v.to(tl.float32)
    acc = tl.dot(p.to(v.dtype), v, acc)
    return acc, l_i, m_new


@triton.jit
def _keys(acc, l_i, m_i, q, Kb, Vb, row0, lo, hi, offs_m, qk_scale,
          MASKED: tl.constexpr, WS_LOOP: tl.constexpr, BLOCK_N: tl.constexpr,
          HEAD_D: tl.constexpr, LOAD: tl.constexpr, F32_DOTS: tl.constexpr):  # fmt: skip
    # Key blocks [lo, hi). WS_LOOP: the loop carries warp_specialize=True (only this
    # branch ever names the attribute, so the plain variants compile without it).
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_D)
    if WS_LOOP:
        for n0 in tl.range(lo, hi, BLOCK_N, warp_specialize=True):
            n0 = tl.multiple_of(n0, BLOCK_N)
            acc, l_i, m_i = _step(acc, l_i, m_i, q, Kb, Vb, row0, n0, offs_m, offs_n, offs_d,
                                  qk_scale, MASKED, HEAD_D, LOAD, F32_DOTS)  # fmt: skip
    else:
        for n0 in range(lo, hi, BLOCK_N):
            n0 = tl.multiple_of(n0, BLOCK_N)
            acc, l_i, m_i = _step(acc, l_i, m_i, q, Kb, Vb, row0, n0, offs_m, offs_n, offs_d,
                                  qk_scale, MASKED, HEAD_D, LOAD, F32_DOTS)  # fmt: skip
    return acc, l_i, m_i


@triton.jit
def _tile(Qd, Kd, Vd, Od, LSE, qk_scale, S, bh, pid_m,
          HEAD_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
          CAUSAL: tl.constexpr, LOAD: tl.constexpr, WS: tl.constexpr,
          F32_DOTS: tl.constexpr):  # fmt: skip
    m0 = pid_m * BLOCK_M
    row0 = bh * S  # the head's first row in the [BH*S, D] view (int32: BH*S < 2^31)
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_mb = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_D)
    if LOAD == 0:
        head = row0.to(tl.int64) * HEAD_D
        Qb = Qd + head
        Kb = Kd + head
        Vb = Vd + head
        Ob = Od + head
    else:
        Qb = Qd
        Kb = Kd
        Vb = Vd
        Ob = Od
    q = _ld(Qb, row0, m0, offs_mb, offs_d, HEAD_D, LOAD)
    out_ty = q.dtype
    if F32_DOTS:
        q = q.to(tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_D], tl.float32)
    if CAUSAL:
        # [0, lo_diag): every row of the block sees the whole key block (no mask);
        # [lo_diag, hi): the blocks that straddle the diagonal (masked).
        lo_diag = (m0 // BLOCK_N) * BLOCK_N
        hi = tl.minimum(m0 + BLOCK_M, S)
        if WS == 3:  # one warp-specialized loop, the mask on every block
            acc, l_i, m_i = _keys(acc, l_i, m_i, q, Kb, Vb, row0, 0, hi, offs_m, qk_scale,
                                  True, True, BLOCK_N, HEAD_D, LOAD, F32_DOTS)  # fmt: skip
        elif WS == 4 or WS == 5:
            # one warp-specialized loop over [0, m0) (unmasked), the diagonal's
            # BLOCK_M / BLOCK_N masked blocks as straight-line code after (4) or before (5)
            # it (BLOCK_N divides BLOCK_M: the launcher checks)
            offs_n = tl.arange(0, BLOCK_N)
            if WS == 5:
                for i in tl.static_range(BLOCK_M // BLOCK_N):
                    acc, l_i, m_i = _step(acc, l_i, m_i, q, Kb, Vb, row0, m0 + i * BLOCK_N, offs_m,
                                          offs_n, offs_d, qk_scale, True, HEAD_D, LOAD,
                                          F32_DOTS)  # fmt: skip
            acc, l_i, m_i = _keys(acc, l_i, m_i, q, Kb, Vb, row0, 0, m0, offs_m, qk_scale,
                                  False, True, BLOCK_N, HEAD_D, LOAD, F32_DOTS)  # fmt: skip
            if WS == 4:
                for i in tl.static_range(BLOCK_M // BLOCK_N):
                    acc, l_i, m_i = _step(acc, l_i, m_i, q, Kb, Vb, row0, m0 + i * BLOCK_N, offs_m,
                                          offs_n, offs_d, qk_scale, True, HEAD_D, LOAD,
                                          F32_DOTS)  # fmt: skip
        else:
            acc, l_i, m_i = _keys(acc, l_i, m_i, q, Kb, Vb, row0, 0, lo_diag, offs_m, qk_scale,
                                  False, WS == 1 or WS == 2, BLOCK_N, HEAD_D, LOAD,
                                  F32_DOTS)  # fmt: skip
            acc, l_i, m_i = _keys(acc, l_i, m_i, q, Kb, Vb, row0, lo_diag, hi, offs_m, qk_scale,
                                  True, WS == 1, BLOCK_N, HEAD_D, LOAD, F32_DOTS)  # fmt: skip
    else:
        acc, l_i, m_i = _keys(acc, l_i, m_i, q, Kb, Vb, row0, 0, S, offs_m, qk_scale,
                              False, WS != 0, BLOCK_N, HEAD_D, LOAD, F32_DOTS)  # fmt: skip
    o = (acc / l_i[:, None]).to(out_ty)
    if LOAD == 0:
        tl.store(Ob + offs_m[:, None] * HEAD_D + offs_d[None, :], o)
    else:
        Ob.store([row0 + m0, 0], o)
    tl.store(LSE + row0 + offs_m, m_i + tl.math.log2(l_i))  # log2 units


@triton.jit(do_not_specialize=["BH", "GH"])
def _attn_fwd_probe(
    Q, K, V, O, LSE,  # noqa: E741  (q, k, v, o: (BH*S, D) contiguous, pointers or host descriptors; lse (BH*S,) fp32)
    qk_scale,  # 1/sqrt(D) * log2(e)
    S, BH, GH,  # sequence length (a multiple of BLOCK_M and BLOCK_N), heads, heads per order group
    HEAD_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    LOAD: tl.constexpr,  # 0 pointers, 1 device descriptors, 2 host descriptors
    WS: tl.constexpr,  # 0 none, 1 every loop, 2 causal: unmasked loop only, 3 causal: one masked loop
    PERSIST: tl.constexpr,  # programs loop over tiles (grid = SMs x occupancy)
    F32_DOTS: tl.constexpr,  # CPU interpreter only: tiles upcast before the dots
):  # fmt: skip
    if LOAD == 1:
        rows = BH * S
        Qd = tl.make_tensor_descriptor(Q, shape=[rows, HEAD_D], strides=[HEAD_D, 1],
                                       block_shape=[BLOCK_M, HEAD_D])  # fmt: skip
        Kd = tl.make_tensor_descriptor(K, shape=[rows, HEAD_D], strides=[HEAD_D, 1],
                                       block_shape=[BLOCK_N, HEAD_D])  # fmt: skip
        Vd = tl.make_tensor_descriptor(V, shape=[rows, HEAD_D], strides=[HEAD_D, 1],
                                       block_shape=[BLOCK_N, HEAD_D])  # fmt: skip
        Od = tl.make_tensor_descriptor(O, shape=[rows, HEAD_D], strides=[HEAD_D, 1],
                                       block_shape=[BLOCK_M, HEAD_D])  # fmt: skip
    else:
        Qd = Q
        Kd = K
        Vd = V
        Od = O
    num_m = S // BLOCK_M
    if PERSIST:
        total = BH * num_m
        for t in range(tl.program_id(0), total, tl.num_programs(0)):
            bh, pid_m = _tile_order(t, BH, GH, num_m, CAUSAL)
            _tile(Qd, Kd, Vd, Od, LSE, qk_scale, S, bh, pid_m,
                  HEAD_D, BLOCK_M, BLOCK_N, CAUSAL, LOAD, WS, F32_DOTS)  # fmt: skip
    else:
        bh, pid_m = _tile_order(tl.program_id(0), BH, GH, num_m, CAUSAL)
        _tile(Qd, Kd, Vd, Od, LSE, qk_scale, S, bh, pid_m,
              HEAD_D, BLOCK_M, BLOCK_N, CAUSAL, LOAD, WS, F32_DOTS)  # fmt: skip


# --------------------------------------------------------------------------- variants

# name: (LOAD, WS, PERSIST, LPT order, compile as, causal only)
VARIANTS = {
    "tma_ws": (1, 1, False, False, None, False),
    "tma_ws_main": (1, 2, False, False, None, True),
    "tma_ws_1loop": (1, 3, False, False, None, True),
    "tma_ws_diag": (1, 4, False, False, None, True),
    "tma_ws_diag1st": (1, 5, False, False, None, True),
    "tma": (1, 0, False, False, None, False),
    "tma_lpt": (1, 0, False, True, "tma", False),  # tma's binary (GH is not specialized)
    "tma_persist": (1, 0, True, True, None, False),
    "hosttma": (2, 0, False, False, None, False),
    "hosttma_ws": (2, 1, False, False, None, False),
    "ptr": (0, 0, False, False, None, False),
    "ptr_ws": (0, 1, False, False, None, False),
}
DEFAULT_VARIANTS = [v for v in VARIANTS if v not in ("ptr_ws", "tma_ws_diag1st")]

SHAPES = {  # name: (B, H, S, D, causal, dtype)
    "b2h32s8k_causal": (2, 32, 8192, 128, True, "bf16"),
    "b1h8s32k_causal": (1, 8, 32768, 128, True, "bf16"),
    "b2h32s8k_full": (2, 32, 8192, 128, False, "bf16"),
    "b4h32s2k_causal": (4, 32, 2048, 128, True, "bf16"),
    "b8h12s1k_d64_causal": (8, 12, 1024, 64, True, "bf16"),
    # non-causal shapes the warp-specialized loop would serve (not in the default set)
    "b1h16s16k_full": (1, 16, 16384, 128, False, "bf16"),
    "b4h16s4k_full": (4, 16, 4096, 128, False, "bf16"),
    "b8h16s2k_full": (8, 16, 2048, 128, False, "bf16"),
    "b16h16s1k_full": (16, 16, 1024, 128, False, "bf16"),
    "b4h16s4k_d64_full": (4, 16, 4096, 64, False, "bf16"),
    "b2h16s8k_d64_full": (2, 16, 8192, 64, False, "bf16"),
}
DEFAULT_SHAPES = list(SHAPES)[:5]
SMOKE_SHAPES = {
    "smoke_causal_bf16": (1, 2, 128, 64, True, "bf16"),
    "smoke_full_bf16": (1, 2, 128, 64, False, "bf16"),
    "smoke_causal_fp32": (1, 2, 128, 64, True, "fp32"),
    "smoke_full_fp32": (1, 2, 128, 64, False, "fp32"),
}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

# (BLOCK_M, BLOCK_N, num_warps, num_stages), most promising first (--quick: the first 4)
CONFIGS = [
    (128, 64, 8, 3), (128, 128, 8, 2), (128, 64, 4, 3), (128, 128, 4, 2),
    (128, 64, 8, 4), (128, 128, 8, 3), (128, 64, 8, 2), (128, 128, 4, 3),
]  # fmt: skip
# Warp-specialized variants: compiled by Triton 3.9 for sm_90, tl.range(warp_specialize=True)
# took effect only at num_warps=4 (4 + 8 more warps); at 8 the loop compiled plain. The two
# 8-warp configs stay so that the run shows whether Triton 3.6 differs ("ws_applied").
WS_CONFIGS = [
    (128, 64, 4, 3), (128, 128, 4, 2), (128, 64, 4, 2), (128, 64, 4, 4),
    (128, 128, 4, 3), (128, 64, 8, 3), (128, 128, 8, 2),
]  # fmt: skip
SMOKE_CONFIGS = [(32, 16, 4, 1), (32, 32, 4, 1), (64, 32, 4, 1)]


def configs_for(variant, smoke, quick):
    if smoke:
        cf = SMOKE_CONFIGS
    else:
        cf = WS_CONFIGS if VARIANTS[variant][1] else CONFIGS
    return cf[: (2 if smoke else 4)] if quick else cf


def feature_gap(variant):
    """None when this Triton / device can try the variant, else why not."""
    load, ws, _, _, _, _ = VARIANTS[variant]
    if ws:
        if INTERPRET:
            return "warp specialization: not under the interpreter"
        try:
            import inspect

            if "warp_specialize" not in inspect.signature(tl.range.__init__).parameters:
                return "tl.range has no warp_specialize in this Triton"
        except Exception as e:  # noqa: BLE001
            return f"tl.range signature: {e}"
    if load == 1 and not hasattr(tl, "make_tensor_descriptor"):
        return "tl.make_tensor_descriptor missing in this Triton"
    if load == 2 and TensorDescriptor is None:
        return f"triton.tools.tensor_descriptor.TensorDescriptor: {_HOST_DESC_ERR}"
    if not INTERPRET and (load or ws):
        cap = torch.cuda.get_device_capability()
        if cap[0] < 9:
            return f"needs sm_90+ (device is sm_{cap[0]}{cap[1]})"
    return None


def compile_name(variant):
    return VARIANTS[variant][4] or variant


def group_heads(S, D, BH, elem):
    """Heads per order group: the group's K and V within ~24 MB (H100 L2: 50 MB)."""
    per_head = 2 * S * D * elem
    return max(1, min(BH, (24 << 20) // per_head))


_NUM_SMS = None
_OCC = {}  # (variant, cfg, signature) -> resident programs per SM (persistent grid)


def _num_sms():
    global _NUM_SMS
    if _NUM_SMS is None:
        _NUM_SMS = 4 if INTERPRET else torch.cuda.get_device_properties(0).multi_processor_count
    return _NUM_SMS


def _occupancy(ck, num_warps):
    """Programs per SM from a compiled kernel's registers and shared memory (H100: 64K
    registers, 228 KB shared memory, 1 KB reserved per block, 64 warps); 1 if unknown."""
    try:
        regs = int(ck.n_regs)
        smem = int(ck.metadata.shared)
        warps = int(getattr(ck.metadata, "num_warps", num_warps) or num_warps)
        by_regs = 65536 // max(1, ((regs + 7) // 8) * 8 * 32 * warps)
        by_smem = (228 * 1024) // (smem + 1024)
        return max(1, min(by_regs, by_smem, 64 // warps, 4))
    except Exception:  # noqa: BLE001
        return 1


def sig_of(shape):
    B, H, S, D, causal, dt = shape
    return (bool(causal), D, dt)


def launch(variant, q, k, v, o, lse, causal, cfg):
    """One forward of a probe variant: q, k, v, o (B, H, S, D) contiguous, lse (B*H*S,)."""
    load, ws, persist, lpt, _, _ = VARIANTS[variant]
    bm, bn, warps, stages = cfg
    B, H, S, D = q.shape
    BH = B * H
    if S % bm or S % bn:
        raise ValueError(f"S={S} is not a multiple of BLOCK_M={bm} and BLOCK_N={bn}")
    if ws in (4, 5) and causal and bm % bn:
        raise ValueError(f"BLOCK_N={bn} does not divide BLOCK_M={bm} (diagonal steps)")
    rows = BH * S
    q2, k2, v2, o2 = (t.view(rows, D) for t in (q, k, v, o))
    if load == 2:
        args = (
            TensorDescriptor(q2, [rows, D], [D, 1], [bm, D]),
            TensorDescriptor(k2, [rows, D], [D, 1], [bn, D]),
            TensorDescriptor(v2, [rows, D], [D, 1], [bn, D]),
            TensorDescriptor(o2, [rows, D], [D, 1], [bm, D]),
        )
    else:
        args = (q2, k2, v2, o2)
    GH = group_heads(S, D, BH, q.element_size()) if lpt else 1
    total = BH * (S // bm)
    key = (variant, tuple(cfg), (bool(causal), D, str(q.dtype)))
    if persist:
        grid = (min(total, _num_sms() * _OCC.get(key, 1)),)
    else:
        grid = (total,)
    ck = _attn_fwd_probe[grid](
        *args, lse, (1.0 / math.sqrt(D)) * LOG2E, S, BH, GH,
        HEAD_D=D, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=bool(causal), LOAD=load, WS=ws,
        PERSIST=bool(persist), F32_DOTS=INTERPRET and q.dtype != torch.float32,
        num_warps=warps, num_stages=stages,
    )  # fmt: skip
    if persist and key not in _OCC:
        _OCC[key] = _occupancy(ck, warps) if not INTERPRET else 1
    return ck


def kernel_info(ck, warps):
    """What the compiler made of a config: registers, spills, shared memory, total warps
    (warp specialization adds some), and whether the loop was warp-specialized: Triton 3.9
    leaves a ttg.warp_specialize op in the TTGIR and more warps than asked when it was, and
    only the loop's tt.warp_specialize attribute when it was not."""
    info = {}
    if ck is None:
        return info
    for name, get in (
        ("n_regs", lambda: int(ck.n_regs)),
        ("n_spills", lambda: int(ck.n_spills)),
        ("shared", lambda: int(ck.metadata.shared)),
        ("total_warps", lambda: int(ck.metadata.num_warps)),
        ("ws_op", lambda: "ttg.warp_specialize" in ck.asm["ttgir"]),
    ):
        try:
            info[name] = get()
        except Exception:  # noqa: BLE001
            pass
    if "ws_op" in info or "total_warps" in info:
        info["ws_applied"] = bool(info.get("ws_op")) or info.get("total_warps", 0) > warps
    return info


def _alloc(size, alignment, stream):  # device-side descriptors' global scratch
    return torch.empty(size, dtype=torch.int8, device=DEVICE)


def setup_allocator():
    try:
        triton.set_allocator(_alloc)
        return None
    except Exception as e:  # noqa: BLE001
        return f"triton.set_allocator: {type(e).__name__}: {e}"


def make_inputs(shape, seed=0):
    B, H, S, D, causal, dt = shape
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    mk = lambda: torch.randn((B, H, S, D), generator=g, device=DEVICE, dtype=torch.float32).to(DTYPES[dt])  # noqa: E731
    return mk(), mk(), mk()


def _sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def short_err(e, n=400):
    msg = f"{type(e).__name__}: {e}".strip()
    lines = [ln for ln in msg.splitlines() if ln.strip()]
    if len(lines) > 3:
        msg = " | ".join(lines[:2] + ["..."] + lines[-2:])
    else:
        msg = " | ".join(lines)
    return msg if len(msg) <= n else msg[: n // 2] + " ... " + msg[-n // 2 :]


def classify(msg):
    low = msg.lower()
    if "outofresources" in low or "out of resource" in low:
        return "out of resource"
    if "compilationerror" in low or "compil" in low:
        return "compile error"
    return "error"


# --------------------------------------------------------------------------- worker side


def _kernellab():
    import kernellab

    return kernellab


def run_job(job, cache):
    """Compile (and launch once) one job in this process; a dict for the parent."""
    t0 = time.time()
    try:
        if job["kind"] == "crash":  # --selftest-crash: the parent must survive this
            os.abort()
        shape = tuple(job["shape"])
        if shape not in cache:
            cache.clear()
            cache[shape] = make_inputs(shape)
        q, k, v = cache[shape]
        causal = shape[4]
        if job["kind"] == "kernellab":
            with torch.no_grad():
                _kernellab().attention(q, k, v, causal=causal, backend="triton")
        else:
            o = torch.empty_like(q)
            lse = torch.empty(q.numel() // q.shape[-1], device=DEVICE, dtype=torch.float32)
            ck = launch(job["variant"], q, k, v, o, lse, causal, tuple(job["cfg"]))
            _sync()
            return {"id": job["id"], "ok": True, "secs": time.time() - t0, **kernel_info(ck, job["cfg"][2])}
        _sync()
        return {"id": job["id"], "ok": True, "secs": time.time() - t0}
    except Exception as e:  # noqa: BLE001
        msg = short_err(e)
        fatal = False
        try:
            _sync()
        except Exception:  # noqa: BLE001
            fatal = True  # the CUDA context is gone: this worker must not take more jobs
        return {"id": job["id"], "ok": False, "err": msg, "secs": time.time() - t0, "fatal": fatal}


def worker_main():
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # stray prints (compiler dumps) go to the log, not the protocol
    err = setup_allocator()
    if DEVICE == "cuda":
        torch.cuda.init()
        torch.empty(1, device="cuda")
    proto.write(json.dumps({"ready": True, "alloc_err": err}) + "\n")
    cache = {}
    while True:
        line = sys.stdin.readline()
        if not line:
            return
        job = json.loads(line)
        res = run_job(job, cache)
        proto.write(json.dumps(res) + "\n")
        proto.flush()
        if res.get("fatal"):
            sys.exit(3)


# --------------------------------------------------------------------------- parent: compile phase


class CompilePhase:
    """Runs compile jobs in worker subprocesses (or in-process with workers=0). A worker that
    dies takes only its current job with it: that job is 'crashed', a new worker starts."""

    def __init__(self, jobs, workers, deadline, budget, smoke, logdir, job_timeout=240.0):
        self.jobs = list(jobs)
        self.workers = workers
        self.deadline = deadline
        self.budget = budget
        self.smoke = smoke
        self.logdir = logdir
        self.job_timeout = job_timeout
        self.results = {}
        self.used = {}  # (compile variant, signature) -> seconds
        self.lock = threading.Lock()
        self.next = 0
        self.spawn_failures = 0

    def _key(self, job):
        return (job.get("variant", job["kind"]), tuple(sig_of(tuple(job["shape"]))))

    def _take(self):
        with self.lock:
            while self.next < len(self.jobs):
                job = self.jobs[self.next]
                self.next += 1
                if time.time() > self.deadline:
                    self.results[job["id"]] = {
                        "ok": False,
                        "skipped": True,
                        "err": "skipped: compile-phase deadline",
                    }
                    continue
                if job["kind"] == "variant" and self.used.get(self._key(job), 0.0) >= self.budget:
                    self.results[job["id"]] = {
                        "ok": False, "skipped": True,
                        "err": f"skipped: variant time box ({self.budget:.0f} s of compiles)",
                    }  # fmt: skip
                    continue
                return job
            return None

    def _record(self, job, res):
        with self.lock:
            self.results[job["id"]] = res
            k = self._key(job)
            self.used[k] = self.used.get(k, 0.0) + float(res.get("secs", 0.0))

    def _spawn(self, idx):
        log_path = os.path.join(self.logdir, f"worker{idx}-{time.time_ns()}.log")
        log = open(log_path, "w")
        cmd = [sys.executable, os.path.abspath(__file__), "--worker"] + (
            ["--cpu-smoke"] if self.smoke else []
        )
        p = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, bufsize=1
        )
        line = self._readline(p, 180.0)
        if not line:
            try:
                p.kill()
            except Exception:  # noqa: BLE001
                pass
            p.wait()
            log.close()
            return None, log_path
        return p, log_path

    @staticmethod
    def _readline(p, timeout):
        fired = []

        def kill():
            fired.append(1)
            try:
                p.kill()  # our own worker, by its handle
            except Exception:  # noqa: BLE001
                pass

        t = threading.Timer(timeout, kill)
        t.start()
        try:
            line = p.stdout.readline()
        finally:
            t.cancel()
        return None if fired else line

    @staticmethod
    def _tail(path, n=600):
        try:
            txt = Path(path).read_text(errors="replace")
        except Exception:  # noqa: BLE001
            return ""
        lines = [ln for ln in txt.splitlines() if ln.strip()]
        keep = [ln for ln in lines if "Assertion" in ln or "Error" in ln or "error" in ln or "failed" in ln]
        s = " | ".join((keep or lines)[-4:])
        return s[-n:]

    def _thread(self, idx):
        p, log_path = None, None
        while True:
            job = self._take()
            if job is None:
                break
            if p is None or p.poll() is not None:
                p, log_path = self._spawn(idx)
                if p is None:
                    with self.lock:
                        self.spawn_failures += 1
                    self._record(
                        job,
                        {"ok": False, "err": f"worker failed to start: {self._tail(log_path)}", "secs": 0},
                    )
                    if self.spawn_failures >= 3:
                        break
                    continue
            t0 = time.time()
            try:
                p.stdin.write(json.dumps(job) + "\n")
                p.stdin.flush()
                # a job still compiling 30 s past the compile phase's deadline is cut short
                limit = min(self.job_timeout, max(5.0, self.deadline + 30.0 - time.time()))
                line = self._readline(p, limit)
            except Exception:  # noqa: BLE001  (broken pipe: the worker died)
                line = ""
            if line:
                self._record(job, json.loads(line))
                if json.loads(line).get("fatal"):
                    p.wait()
                    p = None
                continue
            timed_out = line is None
            rc = p.wait()
            tail = self._tail(log_path)
            what = f"timeout after {time.time() - t0:.0f} s" if timed_out else f"crashed: worker exit {rc}"
            self._record(
                job, {"ok": False, "crashed": True, "err": f"{what}: {tail}", "secs": time.time() - t0}
            )
            p = None
        if p is not None:
            try:
                p.stdin.close()
                p.wait(timeout=30)
            except Exception:  # noqa: BLE001
                p.kill()
                p.wait()

    def start(self):
        if self.workers <= 0:
            self._threads = []
            return
        self._threads = [
            threading.Thread(target=self._thread, args=(i,), daemon=True) for i in range(self.workers)
        ]
        for t in self._threads:
            t.start()

    def finish(self):
        if self.workers <= 0:  # in-process: no isolation from compiler aborts
            cache = {}
            while True:
                job = self._take()
                if job is None:
                    break
                self._record(job, run_job(job, cache))
            cache.clear()
            return self.results
        for t in self._threads:
            t.join()
        with self.lock:
            for job in self.jobs:
                self.results.setdefault(
                    job["id"], {"ok": False, "skipped": True, "err": "skipped: no worker left"}
                )
        return self.results


# --------------------------------------------------------------------------- parent: reference, timing


def check_heads(shape):
    B, H, S, D, causal, dt = shape
    BH = B * H
    work = BH * S * S * D * 6
    if work <= 5e12 or BH <= 4:
        return list(range(BH))
    return sorted({0, 1, BH // 2 + 1, BH - 1})


def reference(q, k, v, causal, heads):
    """O and LSE (natural log) for the given flat heads, SDPA's math path in fp32 (no TF32),
    query rows in chunks (an explicit bottom-right = top-left mask, S_q = S_k)."""
    B, H, S, D = q.shape
    scale = 1.0 / math.sqrt(D)
    qf, kf, vf = (t.reshape(B * H, S, D) for t in (q, k, v))
    chunk = max(64, min(S, (1 << 25) // S))
    o_ref = torch.empty((len(heads), S, D), device=q.device, dtype=torch.float32)
    lse_ref = torch.empty((len(heads), S), device=q.device, dtype=torch.float32)
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        for i, bh in enumerate(heads):
            qh, kh, vh = qf[bh].float(), kf[bh].float(), vf[bh].float()
            for r0 in range(0, S, chunk):
                r1 = min(S, r0 + chunk)
                kend = r1 if causal else S
                qc, kc, vc = qh[r0:r1], kh[:kend], vh[:kend]
                mask = None
                if causal:
                    mask = (
                        torch.arange(kend, device=q.device)[None, :]
                        <= torch.arange(r0, r1, device=q.device)[:, None]
                    )
                ctx = sdpa_kernel(SDPBackend.MATH) if sdpa_kernel is not None else _null()
                with ctx:
                    o_ref[i, r0:r1] = F.scaled_dot_product_attention(
                        qc[None, None], kc[None, None], vc[None, None],
                        attn_mask=None if mask is None else mask[None, None],
                    )[0, 0]  # fmt: skip
                s = (qc @ kc.T) * scale
                if causal:
                    s.masked_fill_(~mask, float("-inf"))
                lse_ref[i, r0:r1] = torch.logsumexp(s, dim=-1)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    return o_ref, lse_ref


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def errors(o, lse, ref, heads, shape):
    """Max abs error of O (and of the LSE, natural log, when given) on the checked heads;
    NaN / unwritten (NaN-filled) outputs count as inf."""
    B, H, S, D, causal, dt = shape
    o_ref, lse_ref = ref
    idx = torch.tensor(heads, device=o.device)
    eo = (o.reshape(B * H, S, D).index_select(0, idx).float() - o_ref).abs().max().item()
    el = None
    if lse is not None:
        el = (lse.reshape(B * H, S).index_select(0, idx) * LN2 - lse_ref).abs().max().item()
        el = el if math.isfinite(el) else float("inf")
    return (eo if math.isfinite(eo) else float("inf")), el


def bench(fn, warmup, rep):
    if DEVICE == "cpu":  # the smoke run: wall clock, a few calls
        fn()
        t0 = time.perf_counter()
        fn()
        fn()
        return (time.perf_counter() - t0) / 2 * 1000.0
    from triton.testing import do_bench

    try:
        return float(do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))
    except TypeError:
        return float(do_bench(fn, warmup=warmup, rep=rep))


def tflops(shape, ms):
    B, H, S, D, causal, dt = shape
    f = 4.0 * B * H * S * S * D * (0.5 if causal else 1.0)
    return f / (ms * 1e-3) / 1e12 if ms and ms > 0 else None


# --------------------------------------------------------------------------- main


def env_info():
    info = {"torch": torch.__version__, "triton": triton.__version__, "interpret": INTERPRET}
    if DEVICE == "cuda":
        info["gpu"] = torch.cuda.get_device_name(0)
        cap = torch.cuda.get_device_capability(0)
        info["capability"] = f"sm_{cap[0]}{cap[1]}"
        info["cuda"] = torch.version.cuda
        try:
            info["cudnn"] = torch.backends.cudnn.version()
        except Exception:  # noqa: BLE001
            pass
    else:
        info["gpu"] = "cpu (TRITON_INTERPRET=1)"
    return info


def parse(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", default="probe_attn_fwd_ws.jsonl", help="JSON lines, one per shape x provider")
    ap.add_argument(
        "--shapes", default=None, help="comma list of shape names (default: the first five): " + ", ".join(SHAPES)
    )
    ap.add_argument(
        "--variants", default=None, help="comma list (default: all but ptr_ws): " + ", ".join(VARIANTS)
    )
    ap.add_argument("--quick", action="store_true", help="4 configs per variant instead of 8")
    ap.add_argument(
        "--workers",
        type=int,
        default=None,
        help="compile subprocesses (0: compile in this process, no crash isolation)",
    )
    ap.add_argument("--deadline", type=float, default=330.0, help="whole-run budget, seconds")
    ap.add_argument(
        "--variant-budget",
        type=float,
        default=60.0,
        help="wall seconds of one variant's timing sweep at one shape",
    )
    ap.add_argument(
        "--compile-budget",
        type=float,
        default=150.0,
        help="summed compile seconds of one variant for one kernel signature (workers compile in parallel)",
    )
    ap.add_argument(
        "--cpu-smoke",
        action="store_true",
        help="tiny shapes on the CPU under TRITON_INTERPRET=1 (whole pipeline, no WS)",
    )
    ap.add_argument("--no-baselines", action="store_true", help="skip kernellab / SDPA rows")
    ap.add_argument("--selftest-crash", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv=None):
    args = parse(argv)
    if args.worker:
        return worker_main()
    t_start = time.time()
    deadline = t_start + args.deadline
    if not INTERPRET and not torch.cuda.is_available():
        print("no CUDA device: run on the GPU, or use --cpu-smoke")
        return 2
    smoke = args.cpu_smoke
    shapes_all = SMOKE_SHAPES if smoke else SHAPES
    names = (list(shapes_all) if smoke else DEFAULT_SHAPES) if not args.shapes else [s.strip() for s in args.shapes.split(",") if s.strip()]
    bad = [n for n in names if n not in shapes_all]
    if bad:
        print(f"unknown shapes {bad}; known: {list(shapes_all)}")
        return 2
    shapes = {n: shapes_all[n] for n in names}
    variants = (
        DEFAULT_VARIANTS if not args.variants else [v.strip() for v in args.variants.split(",") if v.strip()]
    )
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        print(f"unknown variants {bad}; known: {list(VARIANTS)}")
        return 2
    workers = args.workers
    if workers is None:
        workers = 2 if smoke else max(1, min(12, (os.cpu_count() or 4) - 2))

    info = env_info()
    alloc_err = setup_allocator()
    print(f"# {info}  workers={workers}  quick={args.quick}  deadline={args.deadline:.0f}s", flush=True)
    out = open(args.out, "w")

    def emit(row):
        row = {**info, **row}
        out.write(json.dumps(row) + "\n")
        out.flush()

    gaps = {v: feature_gap(v) for v in variants}
    if alloc_err:
        for v in variants:
            if VARIANTS[v][0] == 1 and not gaps[v]:
                gaps[v] = alloc_err
    for v, g in gaps.items():
        if g:
            print(f"# {v}: unsupported: {g}", flush=True)

    # ---- phase 1: compile every (variant, config, signature) in workers, in parallel
    rep_shape = {}  # signature -> the smallest selected shape with it
    for sh in shapes.values():
        s = sig_of(sh)
        if s not in rep_shape or math.prod(sh[:4]) < math.prod(rep_shape[s][:4]):
            rep_shape[s] = sh
    jobs, job_of = [], {}
    if not args.no_baselines:
        for s, sh in rep_shape.items():
            jid = len(jobs)
            jobs.append({"id": jid, "kind": "kernellab", "shape": list(sh)})
            job_of[("kernellab", s, None)] = jid
    if (args.selftest_crash or smoke) and workers > 0:  # in-process, abort() would end the run
        jobs.append({"id": len(jobs), "kind": "crash", "shape": list(next(iter(rep_shape.values())))})
        crash_job = jobs[-1]["id"]
    else:
        crash_job = None
    cvariants = []
    for v in variants:
        cv = compile_name(v)
        if gaps[v] or cv in cvariants:
            continue
        cvariants.append(cv)
    cfgs_of = {cv: configs_for(cv, smoke, args.quick) for cv in cvariants}
    for i in range(max([len(c) for c in cfgs_of.values()] + [0])):
        for s, sh in rep_shape.items():
            for cv in cvariants:
                if i >= len(cfgs_of[cv]):
                    continue
                cfg = cfgs_of[cv][i]
                if VARIANTS[cv][5] and not s[0]:
                    continue  # causal-only variant, non-causal signature
                if feature_gap(cv):
                    continue
                jid = len(jobs)
                jobs.append(
                    {"id": jid, "kind": "variant", "variant": cv, "cfg": list(cfg), "shape": list(sh)}
                )
                job_of[(cv, s, tuple(cfg))] = jid
    logdir = tempfile.mkdtemp(prefix="probe_attn_fwd_ws-")
    p1_deadline = t_start + 0.5 * args.deadline
    phase = CompilePhase(jobs, workers, p1_deadline, args.compile_budget, smoke, logdir, job_timeout=150.0)
    print(f"# phase 1: {len(jobs)} compile jobs on {workers} worker(s) (logs: {logdir})", flush=True)
    phase.start()

    # meanwhile: inputs and references (GPU-bound; the workers are compiling on the CPUs)
    data = {}
    for n, sh in shapes.items():
        q, k, v = make_inputs(sh, seed=zlib.crc32(n.encode()) % 1000)
        heads = check_heads(sh)
        t0 = time.time()
        ref = reference(q, k, v, sh[4], heads)
        _sync()
        data[n] = (q, k, v, heads, ref)
        print(f"# reference {n}: {len(heads)} head(s) checked, {time.time() - t0:.1f} s", flush=True)
    results = phase.finish()
    n_ok = sum(1 for r in results.values() if r.get("ok"))
    print(f"# phase 1 done at {time.time() - t_start:.0f} s: {n_ok}/{len(jobs)} compiled", flush=True)
    if crash_job is not None:
        r = results.get(crash_job, {})
        print(
            f"# selftest crash job -> {'recorded as crashed, run goes on' if r.get('crashed') else r}",
            flush=True,
        )
    compiled = {}  # (compile variant, signature) -> {cfg: job result}
    for (cv, s, cfg), jid in job_of.items():
        if cv == "kernellab":
            continue
        compiled.setdefault((cv, s), {})[cfg] = results.get(jid, {"ok": False, "err": "not run"})

    # ---- phase 2: per shape, baselines and variants
    summary = []
    for n, sh in shapes.items():
        B, H, S, D, causal, dt = sh
        q, k, v, heads, ref = data[n]
        s = sig_of(sh)
        base = {
            "shape": n,
            "B": B,
            "H": H,
            "S": S,
            "D": D,
            "causal": causal,
            "dtype": dt,
            "checked_heads": len(heads),
        }
        rows = []

        def baseline(name, fn, ctx_fn=None):
            if args.no_baselines:
                return
            row = {**base, "provider": name, "kind": "baseline", "config": None}
            try:
                ctx = ctx_fn() if ctx_fn else _null()
                with ctx, torch.no_grad():
                    o = fn()
                    _sync()
                    row["max_err_o"], _ = errors(o, None, ref, heads, sh)
                    ms = bench(fn, 25, 100)
                row.update(ms=ms, tflops=tflops(sh, ms))
                row["status"] = "ok" if row["max_err_o"] <= TOL else "FAIL"
            except Exception as e:  # noqa: BLE001
                row.update(status=f"unsupported: {short_err(e, 240)}", ms=None, tflops=None)
            rows.append(row)
            emit(row)

        if DEVICE == "cuda" and sdpa_kernel is not None:
            baseline("sdpa_cudnn", lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                     lambda: sdpa_kernel(SDPBackend.CUDNN_ATTENTION))  # fmt: skip
            baseline("sdpa_flash", lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                     lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION))  # fmt: skip
        try:
            kl = _kernellab()
            baseline("kernellab_triton", lambda: kl.attention(q, k, v, causal=causal, backend="triton"))
        except Exception as e:  # noqa: BLE001
            if not args.no_baselines:
                row = {
                    **base,
                    "provider": "kernellab_triton",
                    "kind": "baseline",
                    "status": f"unsupported: {short_err(e, 240)}",
                }
                rows.append(row)
                emit(row)
        cudnn_tf = next(
            (r.get("tflops") for r in rows if r["provider"] == "sdpa_cudnn" and r.get("status") == "ok"), None
        )

        o_buf = torch.empty_like(q)
        lse_buf = torch.empty(B * H * S, device=DEVICE, dtype=torch.float32)
        for var in variants:
            row = {**base, "provider": var, "kind": "probe", "config": None, "ms": None, "tflops": None}
            load, ws, persist, lpt, _, causal_only = VARIANTS[var]
            cv = compile_name(var)
            if gaps[var]:
                row["status"] = f"unsupported: {gaps[var]}"
            elif causal_only and not causal:
                row["status"] = "n/a: same kernel as tma_ws when not causal"
            elif time.time() > deadline:
                row["status"] = "skipped: run deadline"
            else:
                comp = compiled.get((cv, s), {})
                sweep = []
                ok_cfgs = []
                for cfg in configs_for(cv, smoke, args.quick):
                    r = comp.get(tuple(cfg))
                    if r is None:
                        sweep.append({"config": list(cfg), "status": "not compiled"})
                    elif not r.get("ok"):
                        m = r.get("err", "?")
                        if not (r.get("skipped") or r.get("crashed")):
                            m = f"{classify(m)}: {m}"
                        sweep.append(
                            {"config": list(cfg), "status": m, "compile_s": round(r.get("secs", 0), 1)}
                        )
                    else:
                        ok_cfgs.append((cfg, r.get("secs", 0.0), r))
                t_var = time.time()
                timed = []
                for cfg, csecs, wres in ok_cfgs:
                    ent = {"config": list(cfg), "compile_s": round(csecs, 1)}
                    ent.update(
                        {
                            kk: wres[kk]
                            for kk in ("n_regs", "n_spills", "shared", "total_warps", "ws_op", "ws_applied")
                            if kk in wres
                        }
                    )
                    if time.time() - t_var > args.variant_budget or time.time() > deadline:
                        ent["status"] = (
                            "skipped: variant time box"
                            if time.time() <= deadline
                            else "skipped: run deadline"
                        )
                        sweep.append(ent)
                        continue

                    def fn(cfg=cfg):
                        return launch(var, q, k, v, o_buf, lse_buf, causal, cfg)

                    try:
                        t0 = time.time()
                        ent.update(kernel_info(fn(), cfg[2]))
                        _sync()
                        ent["first_call_s"] = round(time.time() - t0, 2)  # > ~1 s: compiled here (cache miss)
                        ms = bench(fn, 5, 25)
                        ent.update(status="ok", ms=round(ms, 4), tflops=round(tflops(sh, ms), 1))
                        if ws and ent.get("ws_applied") is False:
                            # compiled, but the loop was not warp-specialized: it is the plain
                            # descriptor kernel, so it cannot stand for this variant
                            ent["status"] = "ok, but ws not applied (not a candidate)"
                        else:
                            timed.append((ms, cfg))
                    except Exception as e:  # noqa: BLE001
                        m = short_err(e, 300)
                        ent["status"] = f"{classify(m)}: {m}"
                    sweep.append(ent)
                row["sweep"] = sweep
                timed.sort()
                if not timed:
                    errs = [e["status"] for e in sweep if e.get("status") not in (None, "ok")]
                    plain = [
                        e for e in sweep if str(e.get("status", "")).startswith("ok, but ws not applied")
                    ]
                    real_errs = [x for x in errs if not x.startswith("ok, but")]
                    first = real_errs[0] if real_errs else (errs[0] if errs else "no config")
                    if not ok_cfgs:  # no config compiled: the feature does not work here
                        row["status"] = f"unsupported: {first}"
                    elif plain and not any(e.get("status") == "ok" for e in sweep):
                        row["status"] = (
                            f"unsupported: warp specialization not applied in {len(plain)} compiled "
                            f"config(s); the others: {first}"
                        )
                    else:
                        row["status"] = f"skipped: {first}"
                else:
                    # every timed config is checked (one launch each into NaN-filled
                    # buffers); the row reports the fastest correct one
                    ent_of = {tuple(e["config"]): e for e in sweep}
                    best = None
                    fails = []
                    for _ms, cfg in timed:
                        ent = ent_of[tuple(cfg)]
                        o_chk = torch.full_like(q, float("nan"))
                        lse_chk = torch.full((B * H * S,), float("nan"), device=DEVICE, dtype=torch.float32)
                        try:
                            launch(var, q, k, v, o_chk, lse_chk, causal, cfg)
                            _sync()
                            eo, el = errors(o_chk, lse_chk, ref, heads, sh)
                        except Exception as e:  # noqa: BLE001
                            eo, el = float("inf"), float("inf")
                            ent["check_err"] = short_err(e, 200)
                        del o_chk, lse_chk
                        ent.update(max_err_o=eo, max_err_lse=el)
                        if eo <= TOL and el <= TOL:
                            if best is None:
                                best = (cfg, eo, el)
                        else:
                            ent["status"] = "FAIL"
                            fails.append(list(cfg))
                    if fails:
                        row["failed_configs"] = fails
                    if best is None:
                        ms, cfg = timed[0]
                        e0 = ent_of[tuple(cfg)]
                        row.update(status="FAIL", config=list(cfg), ms=ms, tflops=tflops(sh, ms),
                                   max_err_o=e0["max_err_o"], max_err_lse=e0["max_err_lse"])  # fmt: skip
                    else:
                        cfg, eo, el = best
                        ms = bench(lambda: launch(var, q, k, v, o_buf, lse_buf, causal, cfg), 25, 100)
                        row.update(
                            status="ok",
                            config=list(cfg),
                            ms=ms,
                            tflops=tflops(sh, ms),
                            max_err_o=eo,
                            max_err_lse=el,
                        )
                    if ws:
                        row["ws_applied"] = ent_of[tuple(row["config"])].get("ws_applied")
                row["sweep_s"] = round(time.time() - t_var, 1)
            if row.get("config"):
                c = row["config"]
                row["config"] = {"BLOCK_M": c[0], "BLOCK_N": c[1], "num_warps": c[2], "num_stages": c[3]}
            if cudnn_tf and row.get("tflops") and row["status"] == "ok":
                row["vs_cudnn"] = row["tflops"] / cudnn_tf
                row["win_vs_cudnn"] = row["tflops"] >= cudnn_tf
            rows.append(row)
            emit(row)
        summary.append((n, sh, rows, cudnn_tf))
        print_table(n, sh, rows, cudnn_tf)
        del o_buf, lse_buf

    out.close()
    print(f"\n# done in {time.time() - t_start:.0f} s; rows -> {args.out}", flush=True)
    wins = [
        (n, r["provider"], r["tflops"], r.get("vs_cudnn"))
        for n, sh, rows, c in summary
        for r in rows
        if r.get("win_vs_cudnn")
    ]
    if wins:
        print(
            "# at or above cuDNN: " + "; ".join(f"{n} {p} {t:.0f} TFLOP/s ({x:.2f}x)" for n, p, t, x in wins)
        )
    elif DEVICE == "cuda":
        print("# no correct probe variant reached cuDNN")
    if smoke:
        bad = [
            (n, r["provider"], r["status"])
            for n, sh, rows, c in summary
            for r in rows
            if r["status"] == "FAIL"
            or (
                r["kind"] == "probe"
                and r["status"] != "ok"
                and not r["status"].startswith(("unsupported", "n/a"))
            )
        ]
        crash_ok = crash_job is None or results.get(crash_job, {}).get("crashed")
        print(f"# smoke: {'PASS' if not bad and crash_ok else 'FAIL'} {bad if bad else ''}")
        return 0 if not bad and crash_ok else 1
    return 0


def _fmt(x, spec):
    return format(x, spec) if isinstance(x, (int, float)) and x is not None and math.isfinite(x) else "-"


def print_table(name, sh, rows, cudnn_tf):
    B, H, S, D, causal, dt = sh
    print(f"\n== {name}: B={B} H={H} S={S} D={D} {'causal' if causal else 'full'} {dt}")
    print(
        f"{'provider':<18} {'status':<10} {'config (M,N,w,s)':<18} {'ws':<3} {'ms':>9} {'TFLOP/s':>8} "
        f"{'vs cuDNN':>8} {'err O':>9} {'err LSE':>9}"
    )
    order = sorted(
        rows, key=lambda r: -(r.get("tflops") or 0.0) if r.get("status") in ("ok", "FAIL") else 1e9
    )
    for r in order:
        st = r.get("status", "?")
        c = r.get("config")
        cs = (
            f"{c['BLOCK_M']},{c['BLOCK_N']},{c['num_warps']},{c['num_stages']}" if isinstance(c, dict) else ""
        )
        vs = r.get("tflops") / cudnn_tf if cudnn_tf and r.get("tflops") else None
        short = st if len(st) <= 10 else st.split(":")[0]
        wsa = {True: "y", False: "n"}.get(r.get("ws_applied"), "")
        print(
            f"{r['provider']:<18} {short:<10} {cs:<18} {wsa:<3} {_fmt(r.get('ms'), '9.4f')} "
            f"{_fmt(r.get('tflops'), '8.1f')} "
            f"{_fmt(vs, '8.2f')} {_fmt(r.get('max_err_o'), '9.2e')} {_fmt(r.get('max_err_lse'), '9.2e')}"
        )
        if len(st) > 10:
            print(f"{'':<18}   {st[:160]}")
    sys.stdout.flush()


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
    except SystemExit:
        raise
    except Exception:
        traceback.print_exc()
        sys.exit(1)
