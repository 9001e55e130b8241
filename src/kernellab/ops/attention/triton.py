"""FlashAttention-2 in Triton: forward, backward (preprocess + dK/dV pass + dQ pass),
launchers, the op kit's declaration (custom op / triton_op, autograd, eager path),
registration. tiled.py is the same algorithm in PyTorch ops, readable line by line; this
file is that algorithm with the tiles in SRAM.

Contract: q (..., S_q, D), k and v (..., S_k, D), same leading dims (folded into one BH
axis, a view when the strides allow) except GQA's heads (dim -3: H_q a multiple of H_kv;
q head h reads k/v head h // GROUP in place, GROUP = H_q / H_kv, a runtime argument), any
strides (passed to the kernels); D any multiple of 8 up to 256 (tiles
BLOCK_D wide, the next power of two >= 16, or for 16-bit D such as 80 and 96 two tiles of
BLOCK_D + BLOCK_D2 columns, 64 + 16 and 64 + 32 (``_d_tiles``); the columns past D are
masked in every load and store, so head dims the tiles cover exactly compile with no
head-dim mask at all); fp16 / bf16
(fp32 accumulation) or fp32 (TF32 dots when
``torch.backends.cuda.matmul.allow_tf32``, IEEE fp32 dots otherwise; see the package
docstring). Outputs are fresh: o (..., S_q, D) (``empty_bshd``'s layout) and lse
(..., S_q) = q.shape[:-1], fp32 contiguous, the only tensor saved for the backward
besides the inputs and o: the log-sum-exp of the scaled scores in log2 units (log2(sum
2^(s * log2 e))) for every dtype. fp32's backward recomputes its row statistics
(``lse_shape`` says why).

Forward (one program per (query block, head)): Q_i stays in registers; K_j, V_j stream
through shared memory (num_stages deep). Scores use exp2 with the scale folded into
log2(e): S * scale * log2(e) - m in one FMA per element, then one MUFU.EX2 (16-bit; fp32
subtracts the max first, ``lse_shape``). No division in the loop: O is normalized once at
the end. The loop has two stages: key blocks that every row of Q_i may see in full run
without any mask (no iota / compare / select), then
the few blocks on the causal diagonal or the S_k tail run masked. Causal blocks above the
diagonal are never visited (half the work), and with causal the query blocks are issued
longest-first, so the short ones fill the tail of the grid.

Napkin math (H100, bf16, B=4 H=16 S=4096 D=128, not causal): 4 B H S^2 D = 550 GFLOP;
q, k, v, o = 4 x 64 MB. Each program re-reads K and V (S_k x D x 2 x 2 B = 2 MB) from L2;
consecutive program ids share a head, so those reads hit L2. At ~600 TFLOP/s of dense
bf16 MMA the forward is ~1 ms, compute-bound: what matters is keeping the tensor cores
fed (wgmma from shared memory, K/V loads pipelined) and the softmax math (~6 non-MMA
instructions per score) under the MMA shadow.

Backward (FlashAttention-2's split): fp32 first recomputes (row max, log2 l) with the
forward kernel (STATS mode, ``lse_shape``); delta = rowsum(dO * O) (one small kernel; fp32
with at most 64 keys a row: rowsum(P * dP) by the dQ kernel, see _bwd_plan);
then one program per key block accumulates dK_j, dV_j over the query blocks that see it
(no atomics), and one program per query block accumulates dQ_i over the key blocks it
sees. P is recomputed from the LSE in both passes (2 extra QK^T matmuls: 7 matmuls
instead of 5). dQ by fp32 atomics inside the dK/dV pass (5 matmuls) is no faster on
Hopper and not deterministic, so the passes are separate.

GQA: the forward and the dQ pass run one program per (query block, q head) and read the
q head's k/v head; the dK/dV pass runs one program per (key block, k/v head) and, at each
query block, loops over the GROUP q heads of its group, so dK, dV sum the group in
registers (no atomics, no dK/dV per q head to reduce afterwards, no repeat_interleave copy
of k and v). GQA is a constexpr: plain attention compiles without any of the GQA code.
(Compiled by Triton 3.9 for sm_90 at the first dK/dV tile, 32 x 64, D=128, the GQA
variant holds 255 registers with 10 local-memory instructions; plain attention 248, none.)

Sliding window and softcap (package docstring) are constexprs too (WINDOW, SOFTCAP): with
a window every pass visits only the blocks inside some row's window, all of them masked
(no unmasked middle yet: a wide window pays the mask on every block); with a softcap the
scores go through tanh (libdevice on a GPU) and dS through 1 - tanh^2.

Rows with no allowed key (causal, S_q > S_k) give o = 0 and lse = -inf; the backward
reads that -inf as +inf so their P is exactly 0.

Tiles: autotuned (configs from fwd_configs / bwd_dkdv_configs / bwd_dq_configs, pruned by
what fits; key: lengths bucketed to powers of two, head dim, causal, dot precision, dtype)
for problems at least 1024 long; shorter ones, and every problem when
``kernellab.config.attn_autotune`` False, take the first config that fits. Launched with CPU
tensors (Triton's interpreter): one small config (tuners of their own), bf16 tiles upcast to
fp32 before the dots (F32_DOTS: the interpreter's bf16 dot is wrong) and the fp32 dots two
kernels share formed in fp64 (_shared_dot); never on a GPU.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.language.extra import libdevice

from kernellab import device as _device
from kernellab import triton_support
from kernellab.core.kit import OpDecl, build
from kernellab.core.spec import parse_dtype
from kernellab.ops._register import register_triton
from kernellab.ops._triton_dots import dot, dot_precision, two_level
from kernellab.ops.attention.args import resolve_scale
from kernellab.options import config

HEAD_DIMS = tuple(range(8, 257, 8))  # tiled in one or two power-of-two tiles (_d_tiles)
LOG2E = 1.4426950408889634

# --------------------------------------------------------------------------- configs


def _cfg(bm, bn, warps, stages):
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=warps, num_stages=stages)


def fwd_configs():
    """Forward tiles. Hopper: a 128-row query tile with 8 warps (two warpgroups, one
    64-row wgmma each) and 64- or 128-key tiles, 2-3 stages of K/V in shared memory
    (D=128, bf16: 16-32 KB per stage); at D=64 and S=1024 a 64 x 64 tile with 4 warps and
    4 stages is the fastest on Hopper (causal, well ahead of 128 x 64). The first config is
    what problems too short to tune take (64 x 64, 3 stages: the fastest at ViT's
    64x12x197x64). Smaller tiles for D=256 and fp32 (pruned below)."""
    return [
        _cfg(64, 64, 4, 3),
        _cfg(128, 64, 8, 3),
        _cfg(64, 64, 4, 4),
        _cfg(128, 128, 8, 3),
        _cfg(64, 32, 4, 2),  # the fallback for D=256 or fp32
        _cfg(32, 32, 4, 1),  # the fallback for D=256 and fp32 (shared memory)
    ]


def bwd_dkdv_configs():
    """dK/dV pass: BLOCK_N keys held in registers (k, v, dk, dv: 4 x BLOCK_N x D), BLOCK_M
    query rows streamed per step. The first config is the one problems too short to tune
    take (on Hopper, bf16, D=64: fastest or within 5% of it at 4x12x256, 64x12x197 and
    8x12x1024); 64 x 128 with 8 warps is the fastest at D=128 and S >= 2k."""
    return [
        _cfg(32, 64, 4, 3),
        _cfg(64, 128, 8, 3),
        _cfg(32, 64, 4, 2),  # the fallback for D=256 or fp32
        _cfg(64, 64, 4, 2),
        _cfg(32, 128, 8, 3),
        _cfg(16, 32, 4, 1),  # the fallback for D=256 and fp32 (shared memory)
    ]


def bwd_dq_configs():
    """dQ pass: BLOCK_M query rows held (q, dO, dq), BLOCK_N keys streamed per step. First:
    the short problems' config (as above); 128 x 64 with 8 warps and 3 stages is the
    fastest on Hopper at lengths >= 1024."""
    return [
        _cfg(64, 64, 4, 3),
        _cfg(128, 64, 8, 3),
        _cfg(64, 32, 4, 2),  # the fallback for D=256 or fp32
        _cfg(64, 32, 4, 4),
        _cfg(128, 128, 8, 2),
        _cfg(32, 16, 4, 1),  # the fallback for D=256 and fp32 (shared memory)
    ]


# kernellab.config.attn_autotune False: no tuning, the first config that fits (tests that
# sweep many shapes set it: every autotuned key compiles and times each candidate).
# Problems with both lengths under AUTOTUNE_MIN_S are never tuned either: they are
# launch-bound.
AUTOTUNE_MIN_S = 1024


def _tuned(kept, nargs):
    big = max(nargs.get("S_Q_KEY") or 0, nargs.get("S_K_KEY") or 0) >= AUTOTUNE_MIN_S
    return kept if big and config.attn_autotune else kept[:1]


def _prune(configs, nargs, **kwargs):
    return _tuned(_fit(configs, nargs, **kwargs), nargs)


def _fit(configs, nargs, **kwargs):
    """Drop tiles that cannot fit, judged at the tiled head dim, BLOCK_D + BLOCK_D2 (the
    tiles in shared memory are that wide whatever D is). Wider than 128 (D = 136..256) or
    fp32: tiles of at most 64 x 64 and 2 stages (a 128 x 256 bf16 Q tile alone is 64 KB,
    and fp32 doubles every tile); D=256 in fp32 keeps only the last, smallest config
    (compiled for sm_90, the 32 x 64 dK/dV and 64 x 32 dQ tiles ask for 262 KB of shared
    memory; the limit is 227 KB)."""
    d = _tiled_d(nargs, kwargs)
    q = nargs.get("Q")
    wide = d is not None and d > 128
    fp32 = q is not None and getattr(q, "dtype", None) == torch.float32
    if wide and fp32:
        return configs[-1:]
    if not (wide or fp32):
        return [
            c for c in configs if c.num_stages > 1 or len(configs) == 1
        ]  # the tiny one: only as a fallback
    kept = [
        c for c in configs if c.kwargs["BLOCK_M"] <= 64 and c.kwargs["BLOCK_N"] <= 64 and c.num_stages <= 2
    ]
    return kept or configs[-1:]


def _tiled_d(nargs, kwargs):
    """BLOCK_D + BLOCK_D2 of a launch (the autotuner passes constexprs in kwargs), or None."""
    d = kwargs.get("BLOCK_D", nargs.get("BLOCK_D"))
    return None if d is None else d + (kwargs.get("BLOCK_D2", nargs.get("BLOCK_D2")) or 0)


def _prune_dkdv(configs, nargs, **kwargs):
    """As _prune. (A 64 x 128 tile at D=128 needs ~255 registers per thread; compiled by
    some Triton versions it spills, by others it is the fastest tile: the autotuner
    measures, so it stays in the list.)"""
    return _tuned(_fit(configs, nargs, **kwargs), nargs)


# Autotune key: bucketed sequence lengths (next power of two, so odd lengths share a
# tuning), the head dim and its tiling, causal, the dot precision and the variant (window,
# softcap, GQA: each a different kernel, tuned apart); Triton adds the tensors' dtypes.
_KEY = ["S_Q_KEY", "S_K_KEY", "HEAD_D", "BLOCK_D2", "CAUSAL", "PREC", "WINDOW", "SOFTCAP", "GQA"]


# --------------------------------------------------------------------------- forward


@triton_support.jit
def _raw_scale(qk_scale):
    """(sign, |qk_scale|) of the RAW_M exponent (qk * sign - m) * |qk_scale|: the sign
    flips the scores (exactly) so that m is the max of the scaled ones (lse_shape)."""
    return tl.where(qk_scale < 0, -1.0, 1.0), tl.abs(qk_scale)


@triton_support.jit
def _shared_dot(a, b, PREC: tl.constexpr, F32_DOTS: tl.constexpr):
    """a @ b for a product two kernels both form (q k^T or k q^T, dO v^T or v dO^T): _dot,
    but under the interpreter (F32_DOTS) an IEEE fp32 one in fp64, rounded once.

    The backward recomputes the forward's scores, and P is only as good as the two agree.
    On a GPU an IEEE fp32 dot is one FMA chain over D in order: the forward's q k^T and
    the dK/dV kernel's k q^T round alike, whatever the tiles. The interpreter's numpy
    matmul rounds by the tile's shape and orientation (2-8 ulps of a score), and every
    recomputed P inherited that: fp32 dv at 1.1-1.6x the check's bound on the CPU alone.
    There the fp32 dots that two kernels both form (the scores, dP) run in fp64 and round
    once, alike in every kernel."""
    if F32_DOTS and PREC == "ieee":
        return tl.dot(a.to(tl.float64), b.to(tl.float64), input_precision="ieee").to(tl.float32)
    else:
        return dot(a, b, PREC)


@triton_support.jit
def _mma(a, b, acc, PREC: tl.constexpr):
    """acc + a @ b. For fp32 operands the block's product is summed apart and then added
    to acc (two-level summation): chained through acc=, an IEEE fp32 dot adds every row
    of every block into one accumulator in sequence, and over ~1000 rows that rounding
    walk puts dv over the check's bound (2 x SDPA's error); a CPU model of the two orders
    gives 5.1e-6 chained, 1.6e-6 two-level at 64-row blocks.
    16-bit operands accumulate in the MMA (acc=), as every fast kernel does."""
    if a.dtype == tl.float32:
        return two_level(a, b, acc, PREC)
    else:
        return tl.dot(a, b, acc=acc, input_precision=PREC)


@triton_support.jit
def _ld(ptrs, rows_ok, d_ok, ROWS: tl.constexpr, PAD_D: tl.constexpr):
    """A (rows x BLOCK_D) tile: rows masked when ROWS (a tail or a causal edge), the head
    dim masked when PAD_D (D padded up to the power of two BLOCK_D: columns D..BLOCK_D load
    as 0, so they add 0 to every dot and their outputs are never stored). Without either
    mask the load is the plain vectorized one: the power-of-two head dims pay nothing for
    the padding."""
    if ROWS:
        if PAD_D:
            x = tl.load(ptrs, mask=rows_ok[:, None] & d_ok[None, :], other=0.0)
        else:
            x = tl.load(ptrs, mask=rows_ok[:, None], other=0.0)
    else:
        if PAD_D:
            x = tl.load(ptrs, mask=d_ok[None, :], other=0.0)
        else:
            x = tl.load(ptrs)
    return x


@triton_support.jit
def _st(ptrs, x, rows_ok, d_ok, PAD_D: tl.constexpr):
    """Store a (rows x BLOCK_D) tile, rows masked, the padded head-dim columns dropped."""
    if PAD_D:
        tl.store(ptrs, x, mask=rows_ok[:, None] & d_ok[None, :])
    else:
        tl.store(ptrs, x, mask=rows_ok[:, None])


@triton_support.jit
def _tanh(x, SOFTCAP: tl.constexpr):
    """tanh in fp32. SOFTCAP 1 (a GPU): libdevice's tanhf (~2 ulp). SOFTCAP 2 (the CPU
    interpreter, which has no libdevice): sign(x) (1 - e) / (1 + e) with e = exp(-2|x|),
    and below |x| = 0.3, where 1 - e cancels (absolute error ~ulp(1), i.e. 1e-5 relative
    at |x| = 0.01), the odd Taylor series to x^9 (next term 0.0089 x^11 < 2e-8 there)."""
    if SOFTCAP == 1:
        t = libdevice.tanh(x)
    else:
        a = tl.abs(x)
        e = tl.exp(-2.0 * a)
        big = (1.0 - e) / (1.0 + e)
        x2 = a * a
        poly = -17.0 / 315.0 + x2 * (62.0 / 2835.0)
        small = a * (1.0 + x2 * (-1.0 / 3.0 + x2 * (2.0 / 15.0 + x2 * poly)))
        t = tl.where(a < 0.3, small, big)
        t = tl.where(x < 0, -t, t)
    return t


@triton_support.jit
def _in_window(offs_m, cols, OFFSET, WIN_L, WIN_R):
    """(rows x cols) True where query offs_m may see key cols: i + OFFSET - WIN_L <= j <=
    i + OFFSET + WIN_R (an unbounded side comes as 2^30)."""
    rel = cols[None, :] - (offs_m[:, None] + OFFSET)
    return (rel >= -WIN_L) & (rel <= WIN_R)


@triton_support.jit
def _fwd_inner(
    acc, acc1, l_i, m_i, q, q1,
    k_ptrs, v_ptrs, k1_ptrs, v1_ptrs, stride_kn, stride_vn,
    offs_m, offs_n, d_ok, d_ok1, start, end, qk_scale, S_k, OFFSET,
    WIN_L, WIN_R, cap_in, cap_out,
    MASKED: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr, PREC: tl.constexpr,
    F32_DOTS: tl.constexpr, PAD_D: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr,
    RAW_M: tl.constexpr, STATS: tl.constexpr, SPLIT: tl.constexpr, PAD_D1: tl.constexpr,
):  # fmt: skip
    # One pass over key blocks [start, end). m_i is in log2 units (scores * scale * log2 e);
    # RAW_M: in score units (qk, its sign flipped for a negative scale), each exponent
    # (qk - m) * |qk_scale| (see lse_shape). SOFTCAP: the scores become cap_out * tanh(qk *
    # cap_in) (softcap * log2 e * tanh(s / softcap)), already in log2 units: the launcher
    # passes qk_scale = 1. STATS: m_i and l_i only (no V, no P @ V: see _attn_fwd). SPLIT:
    # the head dim in two tiles (_d_tiles): q1, acc1 and the k1 / v1 tiles are its second
    # columns; otherwise they are placeholders, never read.
    sign, c_abs = _raw_scale(qk_scale)
    for start_n in range(start, end, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        key_ok = (start_n + offs_n) < S_k
        k = _ld(k_ptrs + start_n * stride_kn, key_ok, d_ok, MASKED, PAD_D)
        if F32_DOTS:
            k = k.to(tl.float32)
        qk = _shared_dot(q, tl.trans(k), PREC, F32_DOTS)
        if SPLIT:
            k1 = _ld(k1_ptrs + start_n * stride_kn, key_ok, d_ok1, MASKED, PAD_D1)
            if F32_DOTS:
                k1 = k1.to(tl.float32)
            qk = _mma(q1, tl.trans(k1), qk, PREC)
        if SOFTCAP:
            qk = cap_out * _tanh(qk * cap_in, SOFTCAP)
        if MASKED:
            allowed = key_ok[None, :]
            if CAUSAL:
                allowed = allowed & ((start_n + offs_n)[None, :] <= offs_m[:, None] + OFFSET)
            if WINDOW:
                allowed = allowed & _in_window(offs_m, start_n + offs_n, OFFSET, WIN_L, WIN_R)
            if RAW_M:
                qk = tl.where(allowed, qk * sign, float("-inf"))
            else:
                qk = tl.where(allowed, qk * qk_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key yet
            if RAW_M:
                p = tl.math.exp2((qk - m_sub[:, None]) * c_abs)
            else:
                p = tl.math.exp2(qk - m_sub[:, None])
        elif RAW_M:
            qk = qk * sign
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            m_sub = m_new
            p = tl.math.exp2((qk - m_sub[:, None]) * c_abs)
        else:
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            m_sub = m_new
            p = tl.math.exp2(qk * qk_scale - m_sub[:, None])
        if RAW_M:
            alpha = tl.math.exp2((m_i - m_sub) * c_abs)
        else:
            alpha = tl.math.exp2(m_i - m_sub)
        l_i = l_i * alpha + tl.sum(p, 1)
        if not STATS:
            v = _ld(v_ptrs + start_n * stride_vn, key_ok, d_ok, MASKED, PAD_D)
            if F32_DOTS:
                v = v.to(tl.float32)
            acc = acc * alpha[:, None]
            acc = _mma(p.to(v.dtype), v, acc, PREC)
            if SPLIT:
                v1 = _ld(v1_ptrs + start_n * stride_vn, key_ok, d_ok1, MASKED, PAD_D1)
                if F32_DOTS:
                    v1 = v1.to(tl.float32)
                acc1 = acc1 * alpha[:, None]
                acc1 = _mma(p.to(v1.dtype), v1, acc1, PREC)
        m_i = m_new
    return acc, acc1, l_i, m_i


@triton.autotune(configs=fwd_configs(), key=_KEY + ["STATS"], prune_configs_by={"early_config_prune": _prune})
@triton_support.jit
def _attn_fwd(
    Q, K, V, O, LSE,  # q (Z, NH, S_q, D), k/v (Z, NH / GROUP, S_k, D), o (Z, NH, S_q, D) strided;
    # lse (Z*NH, S_q) contiguous, log2 units; STATS: (Z*NH, 2, S_q), row max and log2(l)
    qk_scale,  # scale * log2(e) (1 with a softcap)
    cap_in, cap_out,  # softcap: scale / softcap, softcap * log2(e) (SOFTCAP only)
    stride_qz, stride_qh, stride_qs, stride_qd,
    stride_kz, stride_kh, stride_ks, stride_kd,
    stride_vz, stride_vh, stride_vs, stride_vd,
    stride_oz, stride_oh, stride_os,  # o's head dim is unit-stride
    NH, GROUP,  # q heads; q heads per k/v head (GQA; 1: plain attention)
    S_q, S_k,  # grid: cdiv(S_q, BLOCK_M) * Z * NH programs
    S_Q_KEY, S_K_KEY,  # autotune buckets only
    WIN_L, WIN_R,  # sliding window bounds (WINDOW only; unbounded: 2^30; causal: WIN_R = 0)
    HEAD_D: tl.constexpr,  # D (a multiple of 8, <= 256)
    # D's tiles (_d_tiles): BLOCK_D2 = 0: one tile of BLOCK_D columns, the next power of
    # two >= 16 (tl.dot's minimum K); else columns [0, BLOCK_D) and [BLOCK_D, BLOCK_D +
    # BLOCK_D2), each a power of two >= 16, the padding (if any) in the second
    BLOCK_D: tl.constexpr, BLOCK_D2: tl.constexpr,
    CAUSAL: tl.constexpr, PREC: tl.constexpr, F32_DOTS: tl.constexpr,
    WINDOW: tl.constexpr, SOFTCAP: tl.constexpr,  # SOFTCAP: 0 off, 1 libdevice tanh, 2 portable
    GQA: tl.constexpr,  # GROUP > 1 (False: no integer division by GROUP, ~24 instructions and a MUFU)
    RAW_M: tl.constexpr,  # fp32: exponents from score differences, (s - m) * |c| (lse_shape)
    # STATS: only the row statistics (row max in score units, log2 l) into LSE; V, P @ V
    # and O untouched (the fp32 backward's recompute, _bwd_plan)
    STATS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    # Inductor types a float argument fp64 (Triton: fp32); an fp64 scale would carry the
    # softmax state, and the accumulator, into fp64 (tl.dot then refuses the accumulator).
    qk_scale = tl.cast(qk_scale, tl.float32)
    cap_in, cap_out = tl.cast(cap_in, tl.float32), tl.cast(cap_out, tl.float32)
    num_m = tl.cdiv(S_q, BLOCK_M)
    bh = (pid // num_m).to(tl.int64)  # consecutive programs share a head: K/V stay in L2
    zo = bh // NH
    ho = bh % NH
    hk = ho
    if GQA:
        hk = ho // GROUP  # the group's k/v head, read in place (a group's q heads are consecutive: L2 too)
    pid_m = pid % num_m
    if CAUSAL:
        pid_m = num_m - 1 - pid_m  # longest rows first
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    SPLIT: tl.constexpr = BLOCK_D2 > 0
    PAD_D: tl.constexpr = BLOCK_D > HEAD_D
    PAD_D1: tl.constexpr = BLOCK_D + BLOCK_D2 > HEAD_D
    d_ok = offs_d < HEAD_D
    OFFSET = S_k - S_q  # bottom-right causal: query i sees keys j <= i + OFFSET
    row_ok = offs_m < S_q

    q_rows = Q + zo * stride_qz + ho * stride_qh + offs_m[:, None] * stride_qs
    k_rows = K + zo * stride_kz + hk * stride_kh + offs_n[:, None] * stride_ks
    v_rows = V + zo * stride_vz + hk * stride_vh + offs_n[:, None] * stride_vs
    q = _ld(q_rows + offs_d[None, :] * stride_qd, row_ok, d_ok, True, PAD_D)
    if F32_DOTS:
        q = q.to(tl.float32)
    k_ptrs = k_rows + offs_d[None, :] * stride_kd
    v_ptrs = v_rows + offs_d[None, :] * stride_vd

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    # The second head-dim tile (SPLIT); without it, placeholders that are never read.
    offs_d1, d_ok1, q1, acc1, k1_ptrs, v1_ptrs = offs_d, d_ok, q, acc, k_ptrs, v_ptrs
    if SPLIT:
        offs_d1 = BLOCK_D + tl.arange(0, BLOCK_D2)
        d_ok1 = offs_d1 < HEAD_D
        q1 = _ld(q_rows + offs_d1[None, :] * stride_qd, row_ok, d_ok1, True, PAD_D1)
        if F32_DOTS:
            q1 = q1.to(tl.float32)
        k1_ptrs = k_rows + offs_d1[None, :] * stride_kd
        v1_ptrs = v_rows + offs_d1[None, :] * stride_vd
        acc1 = tl.zeros([BLOCK_M, BLOCK_D2], tl.float32)

    # Key blocks [0, full) are whole (below S_k) and visible to every row of this block
    # (causal: all keys <= start_m + OFFSET); [full, end) are masked.
    full = (S_k // BLOCK_N) * BLOCK_N
    end = S_k
    if CAUSAL:
        diag = (tl.maximum(start_m + OFFSET + 1, 0) // BLOCK_N) * BLOCK_N
        full = tl.minimum(full, diag)
        end = tl.maximum(tl.minimum(S_k, start_m + BLOCK_M + OFFSET), 0)
    start = 0
    if WINDOW:
        # Only the key blocks some row of this block sees: [first row - WIN_L, last row +
        # WIN_R], all masked (the window's two edges; a first version: no unmasked middle).
        start = (tl.maximum(start_m + OFFSET - WIN_L, 0) // BLOCK_N) * BLOCK_N
        end = tl.maximum(tl.minimum(S_k, start_m + BLOCK_M + OFFSET + WIN_R), 0)
        full = start
    acc, acc1, l_i, m_i = _fwd_inner(
        acc, acc1, l_i, m_i, q, q1, k_ptrs, v_ptrs, k1_ptrs, v1_ptrs, stride_ks, stride_vs, offs_m, offs_n,
        d_ok, d_ok1, start, full, qk_scale, S_k, OFFSET, WIN_L, WIN_R, cap_in, cap_out,
        False, CAUSAL, BLOCK_N, PREC, F32_DOTS, PAD_D, WINDOW, SOFTCAP, RAW_M, STATS, SPLIT, PAD_D1,
    )  # fmt: skip
    acc, acc1, l_i, m_i = _fwd_inner(
        acc, acc1, l_i, m_i, q, q1, k_ptrs, v_ptrs, k1_ptrs, v1_ptrs, stride_ks, stride_vs, offs_m, offs_n,
        d_ok, d_ok1, full, end, qk_scale, S_k, OFFSET, WIN_L, WIN_R, cap_in, cap_out,
        True, CAUSAL, BLOCK_N, PREC, F32_DOTS, PAD_D, WINDOW, SOFTCAP, RAW_M, STATS, SPLIT, PAD_D1,
    )  # fmt: skip

    empty = l_i == 0.0  # no allowed key (only possible with causal and S_q > S_k)
    l_div = tl.where(empty, 1.0, l_i)
    if STATS:  # empty rows: m = -inf, log2(l) = 0
        lse_row = LSE + bh * (2 * S_q)
        tl.store(lse_row + offs_m, m_i, mask=row_ok)
        tl.store(lse_row + S_q + offs_m, tl.math.log2(l_div), mask=row_ok)
    else:
        o = acc / l_div[:, None]
        o_row = O + zo * stride_oz + ho * stride_oh + offs_m[:, None] * stride_os
        _st(o_row + offs_d[None, :], o.to(O.dtype.element_ty), row_ok, d_ok, PAD_D)
        if SPLIT:
            o1 = acc1 / l_div[:, None]
            _st(o_row + offs_d1[None, :], o1.to(O.dtype.element_ty), row_ok, d_ok1, PAD_D1)
        # The LSE is kept in log2 units (the backward's exponent is in log2 units):
        # converting to natural log here and back there rounded the exponent twice, ~|lse|
        # * 6e-8 each, which every recomputed probability inherited (fp32 dk/dv/dq up to
        # 1.2x the check's bound on 5 of 20 seeds, CPU). RAW_M: m is in score units, m *
        # |c| + log2(l) in one fused multiply-add.
        if RAW_M:
            lse = tl.fma(m_i, _raw_scale(qk_scale)[1], tl.math.log2(l_div))
        else:
            lse = m_i + tl.math.log2(l_div)
        lse = tl.where(empty, float("-inf"), lse)
        tl.store(LSE + bh * S_q + offs_m, lse, mask=row_ok)


@triton_support.jit
def _attn_fwd_ws(
    Q, K, V, O, LSE,  # q, k, v contiguous (Z*NH*S, D); o (Z, NH, S, D) strided (unit-stride rows)
    qk_scale,  # scale * log2(e) > 0
    stride_oz, stride_oh, stride_os,
    NH, S, ROWS,  # heads; sequence length (S_q = S_k, a multiple of BLOCK_M and BLOCK_N); Z*NH*S
    HEAD_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, F32_DOTS: tl.constexpr,
):  # fmt: skip
    # Hopper, non-causal, 16-bit, one head dim with no padding: the key loop is
    # warp-specialized (Triton splits it into a TMA producer and MMA/softmax consumers), K and
    # V stream through device-side tensor descriptors. Same math and outputs as _attn_fwd
    # (o, and lse in log2 units); the launcher (_ws_fits) says when it runs. Q comes through
    # a descriptor too: with a pointer load of Q (or 4-D descriptors over strided q, k, v)
    # the warp-specialization pass fails (Triton 3.6 and 3.9, sm_90).
    pid = tl.program_id(0)
    num_m = S // BLOCK_M
    bh = pid // num_m  # consecutive programs share a head: its K and V stay in L2
    m0 = (pid - bh * num_m) * BLOCK_M
    z = bh // NH
    h = bh - z * NH
    row0 = bh * S  # the head's first row in the (Z*NH*S, D) view of k and v
    qd = tl.make_tensor_descriptor(Q, shape=[ROWS, HEAD_D], strides=[HEAD_D, 1], block_shape=[BLOCK_M, HEAD_D])
    kd = tl.make_tensor_descriptor(K, shape=[ROWS, HEAD_D], strides=[HEAD_D, 1], block_shape=[BLOCK_N, HEAD_D])
    vd = tl.make_tensor_descriptor(V, shape=[ROWS, HEAD_D], strides=[HEAD_D, 1], block_shape=[BLOCK_N, HEAD_D])
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_D)
    q = qd.load([row0 + m0, 0])
    if F32_DOTS:
        q = q.to(tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_D], tl.float32)
    for n0 in tl.range(0, S, BLOCK_N, warp_specialize=True):
        k = kd.load([row0 + n0, 0])
        if F32_DOTS:
            k = k.to(tl.float32)
        qk = tl.dot(q, tl.trans(k))
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        p = tl.math.exp2(qk * qk_scale - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        v = vd.load([row0 + n0, 0])
        if F32_DOTS:
            v = v.to(tl.float32)
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    o = (acc / l_i[:, None]).to(O.dtype.element_ty)
    o_ptrs = O + z.to(tl.int64) * stride_oz + h.to(tl.int64) * stride_oh + offs_m[:, None] * stride_os
    tl.store(o_ptrs + offs_d[None, :], o)
    tl.store(LSE + row0 + offs_m, m_i + tl.math.log2(l_i))


# --------------------------------------------------------------------------- backward
#
# The warp-specialized backward (Hopper, 16-bit, D = 128, S_q = S_k, no GQA / window /
# softcap): the two passes below with their streamed loop as tl.range(...,
# warp_specialize=True) and the streamed tiles read through device-side tensor descriptors.
# Each (Z, H, S, D) input is read as a 2-D (rows, stride_s) view: head (z, h) starts at
# element z * stride_z + h * stride_h = row r0, column c0 of it, and its S rows follow one
# stride_s apart (head-major contiguous q: c0 = 0; the (B, S, H, D) memory of a model's
# fused projection or of dO: c0 = h * D). _ws_layout says when that holds. Causal runs as
# one loop per program masked on every block (the only causal form the pass manager
# specializes); dQ programs take the longest rows first. Outputs go through pointer stores,
# any strides. On Hopper (bf16, D = 128) the form beats the plain two passes at S >= 4k
# and at 2k causal; it is slower at D = 64.


@triton_support.jit
def _ws_view(X, ROWS_X, sxz, sxh, sxs, z, h, BLOCK: tl.constexpr, HEAD_D: tl.constexpr):
    # (descriptor, first row, first column) of head (z, h) of X read as (ROWS_X, sxs) rows
    base = z.to(tl.int64) * sxz + h.to(tl.int64) * sxh
    r0 = (base // sxs).to(tl.int32)
    c0 = (base % sxs).to(tl.int32)
    desc = tl.make_tensor_descriptor(X, shape=[ROWS_X, sxs], strides=[sxs, 1], block_shape=[BLOCK, HEAD_D])
    return desc, r0, c0


@triton_support.jit
def _attn_bwd_dkdv_ws(
    Q, K, V, DO, LSE, DELTA, DK, DV,  # lse, delta (Z*NH*S) fp32 contiguous, log2 units
    qk_scale, sm_scale,
    ROWS_Q, sqz, sqh, sqs, ROWS_K, skz, skh, sks, ROWS_V, svz, svh, svs, ROWS_DO, sdz, sdh, sds,
    stride_dkz, stride_dkh, stride_dks, stride_dvz, stride_dvh, stride_dvs,
    NH, S, ROWS_L,  # heads; S_q = S_k (a multiple of both tiles); Z*NH*S
    HEAD_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    num_n = S // BLOCK_N
    bh = pid // num_n
    n0 = (pid - bh * num_n) * BLOCK_N
    z = bh // NH
    h = bh - z * NH
    qd, rq, cq = _ws_view(Q, ROWS_Q, sqz, sqh, sqs, z, h, BLOCK_M, HEAD_D)
    dod, rdo, cdo = _ws_view(DO, ROWS_DO, sdz, sdh, sds, z, h, BLOCK_M, HEAD_D)
    kd, rk, ck = _ws_view(K, ROWS_K, skz, skh, sks, z, h, BLOCK_N, HEAD_D)
    vd, rv, cv = _ws_view(V, ROWS_V, svz, svh, svs, z, h, BLOCK_N, HEAD_D)
    ld = tl.make_tensor_descriptor(LSE, shape=[ROWS_L], strides=[1], block_shape=[BLOCK_M])
    dd = tl.make_tensor_descriptor(DELTA, shape=[ROWS_L], strides=[1], block_shape=[BLOCK_M])
    row0 = bh * S
    k = kd.load([rk + n0, ck])
    v = vd.load([rv + n0, cv])
    dk = tl.zeros([BLOCK_N, HEAD_D], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_D], tl.float32)
    lo = 0
    if CAUSAL:
        lo = (n0 // BLOCK_M) * BLOCK_M
    offs_n = n0 + tl.arange(0, BLOCK_N)
    for m0 in tl.range(lo, S, BLOCK_M, warp_specialize=True):
        q = qd.load([rq + m0, cq])
        do = dod.load([rdo + m0, cdo])
        lse = ld.load([row0 + m0])
        delta = dd.load([row0 + m0])
        pT = tl.math.exp2(tl.dot(k, tl.trans(q)) * qk_scale - lse[None, :])
        if CAUSAL:
            pT = tl.where(offs_n[:, None] <= (m0 + tl.arange(0, BLOCK_M))[None, :], pT, 0.0)
        dv = tl.dot(pT.to(do.dtype), do, dv)
        dpT = tl.dot(v, tl.trans(do))
        dsT = (pT * (dpT - delta[None, :])).to(q.dtype)
        dk = tl.dot(dsT, q, dk)
    offs_d = tl.arange(0, HEAD_D)
    zl, hl = z.to(tl.int64), h.to(tl.int64)
    dk_ptrs = DK + zl * stride_dkz + hl * stride_dkh + offs_n[:, None] * stride_dks + offs_d[None, :]
    dv_ptrs = DV + zl * stride_dvz + hl * stride_dvh + offs_n[:, None] * stride_dvs + offs_d[None, :]
    tl.store(dk_ptrs, (dk * sm_scale).to(DK.dtype.element_ty))
    tl.store(dv_ptrs, dv.to(DV.dtype.element_ty))


@triton_support.jit
def _attn_bwd_dq_ws(
    Q, K, V, DO, LSE, DELTA, DQ,
    qk_scale, sm_scale,
    ROWS_Q, sqz, sqh, sqs, ROWS_K, skz, skh, sks, ROWS_V, svz, svh, svs, ROWS_DO, sdz, sdh, sds,
    stride_dqz, stride_dqh, stride_dqs,
    NH, S, ROWS_L,  # heads; S_q = S_k (a multiple of both tiles); Z*NH*S
    HEAD_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    num_m = S // BLOCK_M
    bh = pid // num_m
    pid_m = pid - bh * num_m
    if CAUSAL:
        pid_m = num_m - 1 - pid_m  # longest rows first
    m0 = pid_m * BLOCK_M
    z = bh // NH
    h = bh - z * NH
    qd, rq, cq = _ws_view(Q, ROWS_Q, sqz, sqh, sqs, z, h, BLOCK_M, HEAD_D)
    dod, rdo, cdo = _ws_view(DO, ROWS_DO, sdz, sdh, sds, z, h, BLOCK_M, HEAD_D)
    kd, rk, ck = _ws_view(K, ROWS_K, skz, skh, sks, z, h, BLOCK_N, HEAD_D)
    vd, rv, cv = _ws_view(V, ROWS_V, svz, svh, svs, z, h, BLOCK_N, HEAD_D)
    ld = tl.make_tensor_descriptor(LSE, shape=[ROWS_L], strides=[1], block_shape=[BLOCK_M])
    dd = tl.make_tensor_descriptor(DELTA, shape=[ROWS_L], strides=[1], block_shape=[BLOCK_M])
    row0 = bh * S
    q = qd.load([rq + m0, cq])
    do = dod.load([rdo + m0, cdo])
    lse = ld.load([row0 + m0])
    delta = dd.load([row0 + m0])
    dq = tl.zeros([BLOCK_M, HEAD_D], tl.float32)
    hi = S
    if CAUSAL:
        hi = m0 + BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    for n0 in tl.range(0, hi, BLOCK_N, warp_specialize=True):
        k = kd.load([rk + n0, ck])
        v = vd.load([rv + n0, cv])
        p = tl.math.exp2(tl.dot(q, tl.trans(k)) * qk_scale - lse[:, None])
        if CAUSAL:
            p = tl.where((n0 + tl.arange(0, BLOCK_N))[None, :] <= offs_m[:, None], p, 0.0)
        dp = tl.dot(do, tl.trans(v))
        ds = (p * (dp - delta[:, None])).to(k.dtype)
        dq = tl.dot(ds, k, dq)
    offs_d = tl.arange(0, HEAD_D)
    dq_ptrs = DQ + z.to(tl.int64) * stride_dqz + h.to(tl.int64) * stride_dqh + offs_m[:, None] * stride_dqs
    tl.store(dq_ptrs + offs_d[None, :], (dq * sm_scale).to(DQ.dtype.element_ty))




@triton_support.jit
def _attn_bwd_pre(
    O, DO, DELTA,  # o (Z, NH, S_q, D) unit-stride rows, dO strided, delta (Z*NH, S_q) fp32
    stride_oz, stride_oh, stride_os, stride_doz, stride_doh, stride_dos, stride_dod,
    NH, S_q, num_m, HEAD_D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
):  # fmt: skip
    # delta_i = sum_d dO[i, d] * O[i, d]  (= rowsum(P * dP), so dS = P (dP - delta))
    pid = tl.program_id(0)
    bh = (pid // num_m).to(tl.int64)
    zo = bh // NH
    ho = bh % NH
    offs_m = (pid % num_m) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    PAD_D: tl.constexpr = BLOCK_D != HEAD_D
    d_ok = offs_d < HEAD_D
    row_ok = offs_m < S_q
    o_ptrs = O + zo * stride_oz + ho * stride_oh + offs_m[:, None] * stride_os + offs_d[None, :]
    o = _ld(o_ptrs, row_ok, d_ok, True, PAD_D)
    do = _ld(
        DO + zo * stride_doz + ho * stride_doh + offs_m[:, None] * stride_dos + offs_d[None, :] * stride_dod,
        row_ok, d_ok, True, PAD_D,
    )  # fmt: skip
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(DELTA + bh * S_q + offs_m, delta, mask=row_ok)


@triton_support.jit
def _dkdv_step(
    dk, dv, dk1, dv1, k, v, k1, v1, q_ptrs, do_ptrs, q1_ptrs, do1_ptrs, lse_ptr, delta_ptr,
    offs_m, row_ok, offs_n, d_ok, d_ok1,
    qk_scale, sign, c_abs, OFFSET, WIN_L, WIN_R, cap_in, cap_out, S_q,
    MASKED: tl.constexpr, CAUSAL: tl.constexpr, PREC: tl.constexpr,
    F32_DOTS: tl.constexpr, PAD_D: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr,
    RAW_M: tl.constexpr, SPLIT: tl.constexpr, PAD_D1: tl.constexpr,
):  # fmt: skip
    # One query block (q_ptrs, do_ptrs at its first row) against the key block in k, v
    # (transposed math: P^T (BLOCK_N x BLOCK_M) so dV += P^T dO and dK += dS^T Q need no
    # transposes of big tiles). SPLIT: the *1 tiles are the head dim's second columns.
    q = _ld(q_ptrs, row_ok, d_ok, MASKED, PAD_D)
    do = _ld(do_ptrs, row_ok, d_ok, MASKED, PAD_D)
    q1, do1 = q, do
    if SPLIT:
        q1 = _ld(q1_ptrs, row_ok, d_ok1, MASKED, PAD_D1)
        do1 = _ld(do1_ptrs, row_ok, d_ok1, MASKED, PAD_D1)
    if MASKED:
        lse = tl.load(lse_ptr + offs_m, mask=row_ok, other=float("inf"))
        delta = tl.load(delta_ptr + offs_m, mask=row_ok, other=0.0)
    else:
        lse = tl.load(lse_ptr + offs_m)
        delta = tl.load(delta_ptr + offs_m)
    if F32_DOTS:
        q = q.to(tl.float32)
        do = do.to(tl.float32)
        q1 = q1.to(tl.float32)
        do1 = do1.to(tl.float32)
    lse = tl.where(lse == float("-inf"), float("inf"), lse)  # log2 units; empty rows: P = 0
    qkT = _shared_dot(k, tl.trans(q), PREC, F32_DOTS)
    if SPLIT:
        qkT = _mma(k1, tl.trans(q1), qkT, PREC)
    if SOFTCAP:
        tT = _tanh(qkT * cap_in, SOFTCAP)
        qkT = cap_out * tT
    if RAW_M:  # lse: the row max in score units (+inf: P = 0), then log2(l)
        ll = tl.load(lse_ptr + S_q + offs_m, mask=row_ok, other=0.0)
        pT = tl.math.exp2((qkT * sign - lse[None, :]) * c_abs - ll[None, :])
    else:
        pT = tl.math.exp2(qkT * qk_scale - lse[None, :])
    if MASKED:
        if CAUSAL:
            pT = tl.where(offs_n[:, None] <= offs_m[None, :] + OFFSET, pT, 0.0)
        if WINDOW:
            pT = tl.where(tl.trans(_in_window(offs_m, offs_n, OFFSET, WIN_L, WIN_R)), pT, 0.0)
    dv = _mma(pT.to(do.dtype), do, dv, PREC)
    dpT = _shared_dot(v, tl.trans(do), PREC, F32_DOTS)
    if SPLIT:
        dv1 = _mma(pT.to(do1.dtype), do1, dv1, PREC)
        dpT = _mma(v1, tl.trans(do1), dpT, PREC)
    dsT = pT * (dpT - delta[None, :])
    if SOFTCAP:
        dsT = dsT * (1.0 - tT * tT)  # d(softcap tanh(s / softcap)) / ds
    dk = _mma(dsT.to(q.dtype), q, dk, PREC)
    if SPLIT:
        dk1 = _mma(dsT.to(q1.dtype), q1, dk1, PREC)
    return dk, dv, dk1, dv1


@triton_support.jit
def _dkdv_inner(
    dk, dv, dk1, dv1, k, v, k1, v1, q_ptrs, do_ptrs, q1_ptrs, do1_ptrs, lse_ptr, delta_ptr,
    stride_qs, stride_dos, offs_m0, offs_n, d_ok, d_ok1, start, end, qk_scale, S_q, OFFSET,
    WIN_L, WIN_R, cap_in, cap_out, stride_qh, stride_doh, GROUP,
    MASKED: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, PREC: tl.constexpr,
    F32_DOTS: tl.constexpr, PAD_D: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr,
    GQA: tl.constexpr, RAW_M: tl.constexpr, SPLIT: tl.constexpr, PAD_D1: tl.constexpr,
):  # fmt: skip
    # Query blocks [start, end) against the key block held in k, v. GQA: at each query
    # block, the GROUP q heads of the group one after another (heads h0..h0+GROUP-1: q, dO
    # one head stride apart, the delta rows S_q apart, the LSE rows S_q (RAW_M: 2 S_q)). The
    # head loop is the inner one: as the outer loop (one pass over the query blocks per
    # head) the dK/dV kernel spilled 360 bytes at 32 x 64 tiles, D=128 (Triton 3.9, sm_90);
    # inside, the loop-carried state is what plain attention carries.
    lse_stride = S_q
    if RAW_M:
        lse_stride = 2 * S_q
    sign, c_abs = _raw_scale(qk_scale)  # (RAW_M; once, not per query block)
    for start_m in range(start, end, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        offs_m = start_m + offs_m0
        row_ok = offs_m < S_q
        if GQA:
            for g in range(0, GROUP):
                q_at = g * stride_qh + start_m * stride_qs
                do_at = g * stride_doh + start_m * stride_dos
                dk, dv, dk1, dv1 = _dkdv_step(
                    dk, dv, dk1, dv1, k, v, k1, v1, q_ptrs + q_at, do_ptrs + do_at, q1_ptrs + q_at,
                    do1_ptrs + do_at, lse_ptr + g * lse_stride, delta_ptr + g * S_q,
                    offs_m, row_ok, offs_n, d_ok, d_ok1, qk_scale, sign, c_abs, OFFSET, WIN_L, WIN_R,
                    cap_in, cap_out, S_q,
                    MASKED, CAUSAL, PREC, F32_DOTS, PAD_D, WINDOW, SOFTCAP, RAW_M, SPLIT, PAD_D1,
                )  # fmt: skip
        else:
            q_at = start_m * stride_qs
            do_at = start_m * stride_dos
            dk, dv, dk1, dv1 = _dkdv_step(
                dk, dv, dk1, dv1, k, v, k1, v1, q_ptrs + q_at, do_ptrs + do_at, q1_ptrs + q_at,
                do1_ptrs + do_at, lse_ptr, delta_ptr,
                offs_m, row_ok, offs_n, d_ok, d_ok1, qk_scale, sign, c_abs, OFFSET, WIN_L, WIN_R,
                cap_in, cap_out, S_q,
                MASKED, CAUSAL, PREC, F32_DOTS, PAD_D, WINDOW, SOFTCAP, RAW_M, SPLIT, PAD_D1,
            )  # fmt: skip
    return dk, dv, dk1, dv1


@triton_support.jit
def _dkdv_head(
    dk, dv, dk1, dv1, k, v, k1, v1, Q, DO, LSE, DELTA, zo, ho, NH,
    stride_qz, stride_qh, stride_qs, stride_qd, stride_doz, stride_doh, stride_dos, stride_dod,
    offs_m0, offs_n, offs_d, offs_d1, d_ok, d_ok1, lo, mid, tail, q_end, qk_scale, S_q, OFFSET,
    WIN_L, WIN_R, cap_in, cap_out, GROUP,
    CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, PREC: tl.constexpr, F32_DOTS: tl.constexpr,
    PAD_D: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, GQA: tl.constexpr,
    RAW_M: tl.constexpr, SPLIT: tl.constexpr, PAD_D1: tl.constexpr,
):  # fmt: skip
    # dK, dV += the share of q heads ho .. ho + GROUP - 1 (GQA; else ho alone): query
    # blocks [lo, mid) masked, [mid, tail) whole, [tail, q_end) masked.
    bh = zo * NH + ho
    q_rows = Q + zo * stride_qz + ho * stride_qh + offs_m0[:, None] * stride_qs
    do_rows = DO + zo * stride_doz + ho * stride_doh + offs_m0[:, None] * stride_dos
    q_ptrs = q_rows + offs_d[None, :] * stride_qd
    do_ptrs = do_rows + offs_d[None, :] * stride_dod
    q1_ptrs, do1_ptrs = q_ptrs, do_ptrs
    if SPLIT:
        q1_ptrs = q_rows + offs_d1[None, :] * stride_qd
        do1_ptrs = do_rows + offs_d1[None, :] * stride_dod
    lse_ptr = LSE + bh * S_q
    if RAW_M:
        lse_ptr = LSE + bh * (2 * S_q)
    delta_ptr = DELTA + bh * S_q
    dk, dv, dk1, dv1 = _dkdv_inner(
        dk, dv, dk1, dv1, k, v, k1, v1, q_ptrs, do_ptrs, q1_ptrs, do1_ptrs, lse_ptr, delta_ptr,
        stride_qs, stride_dos, offs_m0, offs_n, d_ok, d_ok1, lo, mid, qk_scale, S_q, OFFSET, WIN_L, WIN_R,
        cap_in, cap_out, stride_qh, stride_doh, GROUP, True, CAUSAL, BLOCK_M, PREC, F32_DOTS, PAD_D, WINDOW,
        SOFTCAP, GQA, RAW_M, SPLIT, PAD_D1,
    )  # fmt: skip
    dk, dv, dk1, dv1 = _dkdv_inner(
        dk, dv, dk1, dv1, k, v, k1, v1, q_ptrs, do_ptrs, q1_ptrs, do1_ptrs, lse_ptr, delta_ptr,
        stride_qs, stride_dos, offs_m0, offs_n, d_ok, d_ok1, mid, tail, qk_scale, S_q, OFFSET, WIN_L, WIN_R,
        cap_in, cap_out, stride_qh, stride_doh, GROUP, False, CAUSAL, BLOCK_M, PREC, F32_DOTS, PAD_D, WINDOW,
        SOFTCAP, GQA, RAW_M, SPLIT, PAD_D1,
    )  # fmt: skip
    dk, dv, dk1, dv1 = _dkdv_inner(
        dk, dv, dk1, dv1, k, v, k1, v1, q_ptrs, do_ptrs, q1_ptrs, do1_ptrs, lse_ptr, delta_ptr,
        stride_qs, stride_dos, offs_m0, offs_n, d_ok, d_ok1, tail, q_end, qk_scale, S_q, OFFSET, WIN_L, WIN_R,
        cap_in, cap_out, stride_qh, stride_doh, GROUP, True, CAUSAL, BLOCK_M, PREC, F32_DOTS, PAD_D, WINDOW,
        SOFTCAP, GQA, RAW_M, SPLIT, PAD_D1,
    )  # fmt: skip
    return dk, dv, dk1, dv1


@triton.autotune(configs=bwd_dkdv_configs(), key=_KEY, prune_configs_by={"early_config_prune": _prune_dkdv})
@triton_support.jit
def _attn_bwd_dkdv(
    Q, K, V, DO, LSE, DELTA, DK, DV,  # dk, dv (Z, NH / GROUP, S_k, D) with unit-stride rows
    qk_scale, sm_scale, cap_in, cap_out,
    stride_qz, stride_qh, stride_qs, stride_qd,
    stride_kz, stride_kh, stride_ks, stride_kd,
    stride_vz, stride_vh, stride_vs, stride_vd,
    stride_doz, stride_doh, stride_dos, stride_dod,
    stride_dkz, stride_dkh, stride_dks,
    stride_dvz, stride_dvh, stride_dvs,
    NH, GROUP, S_q, S_k, S_Q_KEY, S_K_KEY,  # grid: cdiv(S_k, BLOCK_N) * Z * (NH / GROUP) programs
    WIN_L, WIN_R,
    HEAD_D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_D2: tl.constexpr,  # as _attn_fwd
    CAUSAL: tl.constexpr, PREC: tl.constexpr, F32_DOTS: tl.constexpr,
    WINDOW: tl.constexpr, SOFTCAP: tl.constexpr,
    GQA: tl.constexpr,  # GROUP > 1: loop over the group (GROUP == 1 compiles without the loop)
    RAW_M: tl.constexpr,  # lse (Z*NH, 2, S_q): row max in score units, log2(l) (as _attn_fwd)
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    qk_scale, sm_scale = tl.cast(qk_scale, tl.float32), tl.cast(sm_scale, tl.float32)  # see _attn_fwd
    cap_in, cap_out = tl.cast(cap_in, tl.float32), tl.cast(cap_out, tl.float32)
    num_n = tl.cdiv(S_k, BLOCK_N)
    # One program per (key block, k/v head). GQA: it sums dK, dV over the GROUP q heads that
    # read this k/v head, one after another in registers (deterministic, no atomics; the
    # same order on every run). Work per program grows GROUP-fold and the grid shrinks as
    # much: Llama-3-8B at 1x8kv x 2048 / 64-key tiles is 256 programs, ~2 waves on 132 SMs.
    nh_kv = NH
    if GQA:
        nh_kv = NH // GROUP
    bhk = (pid // num_n).to(tl.int64)
    zo = bhk // nh_kv
    hk = bhk % nh_kv
    start_n = (pid % num_n) * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    SPLIT: tl.constexpr = BLOCK_D2 > 0
    PAD_D: tl.constexpr = BLOCK_D > HEAD_D
    PAD_D1: tl.constexpr = BLOCK_D + BLOCK_D2 > HEAD_D
    d_ok = offs_d < HEAD_D
    OFFSET = S_k - S_q
    key_ok = offs_n < S_k
    # Keys past S_k load as 0; their dk/dv rows are computed and never stored.
    k_rows = K + zo * stride_kz + hk * stride_kh + offs_n[:, None] * stride_ks
    v_rows = V + zo * stride_vz + hk * stride_vh + offs_n[:, None] * stride_vs
    k = _ld(k_rows + offs_d[None, :] * stride_kd, key_ok, d_ok, True, PAD_D)
    v = _ld(v_rows + offs_d[None, :] * stride_vd, key_ok, d_ok, True, PAD_D)
    if F32_DOTS:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    # The second head-dim tile (SPLIT); without it, placeholders that are never read.
    offs_d1, d_ok1, k1, v1, dk1, dv1 = offs_d, d_ok, k, v, dk, dv
    if SPLIT:
        offs_d1 = BLOCK_D + tl.arange(0, BLOCK_D2)
        d_ok1 = offs_d1 < HEAD_D
        k1 = _ld(k_rows + offs_d1[None, :] * stride_kd, key_ok, d_ok1, True, PAD_D1)
        v1 = _ld(v_rows + offs_d1[None, :] * stride_vd, key_ok, d_ok1, True, PAD_D1)
        if F32_DOTS:
            k1 = k1.to(tl.float32)
            v1 = v1.to(tl.float32)
        dk1 = tl.zeros([BLOCK_N, BLOCK_D2], tl.float32)
        dv1 = tl.zeros([BLOCK_N, BLOCK_D2], tl.float32)

    # Query blocks: [lo, mid) on the causal diagonal (masked), [mid, full_end) whole and
    # fully visible (no mask), [tail, S_q) the S_q tail (masked).
    q_pad = tl.cdiv(S_q, BLOCK_M) * BLOCK_M
    lo = 0
    mid = 0
    if CAUSAL:
        # The first query that sees key start_n is start_n - OFFSET; every query from
        # start_n + BLOCK_N - 1 - OFFSET on sees the whole key block.
        lo = tl.minimum((tl.maximum(start_n - OFFSET, 0) // BLOCK_M) * BLOCK_M, q_pad)
        see_all = tl.cdiv(tl.maximum(start_n + BLOCK_N - 1 - OFFSET, 0), BLOCK_M) * BLOCK_M
        mid = tl.maximum(lo, tl.minimum(see_all, q_pad))
    tail = tl.maximum(mid, (S_q // BLOCK_M) * BLOCK_M)
    q_end = q_pad
    if WINDOW:
        # Only the query blocks that see some key of this block: rows [first key - OFFSET -
        # WIN_R, last key - OFFSET + WIN_L], all masked (no unmasked middle, as the forward).
        lo = tl.minimum((tl.maximum(start_n - OFFSET - WIN_R, 0) // BLOCK_M) * BLOCK_M, q_pad)
        q_end = tl.maximum(tl.minimum(q_pad, start_n + BLOCK_N - OFFSET + WIN_L), lo)
        mid = q_end
        tail = q_end
    dk, dv, dk1, dv1 = _dkdv_head(
        dk, dv, dk1, dv1, k, v, k1, v1, Q, DO, LSE, DELTA, zo, hk * GROUP, NH,
        stride_qz, stride_qh, stride_qs, stride_qd, stride_doz, stride_doh, stride_dos, stride_dod,
        offs_m0, offs_n, offs_d, offs_d1, d_ok, d_ok1, lo, mid, tail, q_end, qk_scale, S_q, OFFSET,
        WIN_L, WIN_R, cap_in, cap_out, GROUP,
        CAUSAL, BLOCK_M, PREC, F32_DOTS, PAD_D, WINDOW, SOFTCAP, GQA, RAW_M, SPLIT, PAD_D1,
    )  # fmt: skip
    dk = dk * sm_scale
    dk_row = DK + zo * stride_dkz + hk * stride_dkh + offs_n[:, None] * stride_dks
    dv_row = DV + zo * stride_dvz + hk * stride_dvh + offs_n[:, None] * stride_dvs
    _st(dk_row + offs_d[None, :], dk.to(DK.dtype.element_ty), key_ok, d_ok, PAD_D)
    _st(dv_row + offs_d[None, :], dv.to(DV.dtype.element_ty), key_ok, d_ok, PAD_D)
    if SPLIT:
        dk1 = dk1 * sm_scale
        _st(dk_row + offs_d1[None, :], dk1.to(DK.dtype.element_ty), key_ok, d_ok1, PAD_D1)
        _st(dv_row + offs_d1[None, :], dv1.to(DV.dtype.element_ty), key_ok, d_ok1, PAD_D1)


@triton_support.jit
def _dq_inner(
    dq, dq1, q, do, q1, do1, lse, ll, delta, k_ptrs, v_ptrs, k1_ptrs, v1_ptrs, stride_kn, stride_vn,
    offs_m, offs_n, d_ok, d_ok1, start, end, qk_scale, S_k, OFFSET,
    WIN_L, WIN_R, cap_in, cap_out,
    MASKED: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr, PREC: tl.constexpr,
    F32_DOTS: tl.constexpr, PAD_D: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr,
    RAW_M: tl.constexpr, DELTA_ONLY: tl.constexpr, SPLIT: tl.constexpr, PAD_D1: tl.constexpr,
):  # fmt: skip
    # DELTA_ONLY: no dq; delta += rowsum(P * dP) (see _attn_bwd_dq). SPLIT: the *1 tiles
    # are the head dim's second columns (as _fwd_inner).
    sign, c_abs = _raw_scale(qk_scale)
    for start_n in range(start, end, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        key_ok = (start_n + offs_n) < S_k
        k = _ld(k_ptrs + start_n * stride_kn, key_ok, d_ok, MASKED, PAD_D)
        v = _ld(v_ptrs + start_n * stride_vn, key_ok, d_ok, MASKED, PAD_D)
        if F32_DOTS:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        qk = _shared_dot(q, tl.trans(k), PREC, F32_DOTS)
        k1, v1 = k, v
        if SPLIT:
            k1 = _ld(k1_ptrs + start_n * stride_kn, key_ok, d_ok1, MASKED, PAD_D1)
            v1 = _ld(v1_ptrs + start_n * stride_vn, key_ok, d_ok1, MASKED, PAD_D1)
            if F32_DOTS:
                k1 = k1.to(tl.float32)
                v1 = v1.to(tl.float32)
            qk = _mma(q1, tl.trans(k1), qk, PREC)
        if SOFTCAP:
            t = _tanh(qk * cap_in, SOFTCAP)
            qk = cap_out * t
        if RAW_M:
            p = tl.math.exp2((qk * sign - lse[:, None]) * c_abs - ll[:, None])
        else:
            p = tl.math.exp2(qk * qk_scale - lse[:, None])
        if MASKED:
            allowed = key_ok[None, :]
            if CAUSAL:
                allowed = allowed & ((start_n + offs_n)[None, :] <= offs_m[:, None] + OFFSET)
            if WINDOW:
                allowed = allowed & _in_window(offs_m, start_n + offs_n, OFFSET, WIN_L, WIN_R)
            p = tl.where(allowed, p, 0.0)
        dp = _shared_dot(do, tl.trans(v), PREC, F32_DOTS)
        if SPLIT:
            dp = _mma(do1, tl.trans(v1), dp, PREC)
        if DELTA_ONLY:
            delta += tl.sum(p * dp, 1)
        else:
            ds = p * (dp - delta[:, None])
            if SOFTCAP:
                ds = ds * (1.0 - t * t)  # d(softcap tanh(s / softcap)) / ds
            dq = _mma(ds.to(k.dtype), k, dq, PREC)
            if SPLIT:
                dq1 = _mma(ds.to(k1.dtype), k1, dq1, PREC)
    return dq, dq1, delta


@triton.autotune(
    configs=bwd_dq_configs(), key=_KEY + ["DELTA_ONLY"], prune_configs_by={"early_config_prune": _prune}
)
@triton_support.jit
def _attn_bwd_dq(
    Q, K, V, DO, LSE, DELTA, DQ,  # dq (Z, NH, S_q, D) with unit-stride rows
    qk_scale, sm_scale, cap_in, cap_out,
    stride_qz, stride_qh, stride_qs, stride_qd,
    stride_kz, stride_kh, stride_ks, stride_kd,
    stride_vz, stride_vh, stride_vs, stride_vd,
    stride_doz, stride_doh, stride_dos, stride_dod,
    stride_dqz, stride_dqh, stride_dqs,
    NH, GROUP, S_q, S_k, S_Q_KEY, S_K_KEY,
    WIN_L, WIN_R,
    HEAD_D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_D2: tl.constexpr,  # as _attn_fwd
    CAUSAL: tl.constexpr, PREC: tl.constexpr, F32_DOTS: tl.constexpr,
    WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, GQA: tl.constexpr,
    RAW_M: tl.constexpr,  # as _attn_bwd_dkdv
    # DELTA_ONLY: write delta = rowsum(P * dP) (the P and dP every other kernel forms), not dq
    DELTA_ONLY: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    qk_scale, sm_scale = tl.cast(qk_scale, tl.float32), tl.cast(sm_scale, tl.float32)  # see _attn_fwd
    cap_in, cap_out = tl.cast(cap_in, tl.float32), tl.cast(cap_out, tl.float32)
    num_m = tl.cdiv(S_q, BLOCK_M)
    bh = (pid // num_m).to(tl.int64)
    zo = bh // NH
    ho = bh % NH
    pid_m = pid % num_m
    if CAUSAL:
        pid_m = num_m - 1 - pid_m
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    SPLIT: tl.constexpr = BLOCK_D2 > 0
    PAD_D: tl.constexpr = BLOCK_D > HEAD_D
    PAD_D1: tl.constexpr = BLOCK_D + BLOCK_D2 > HEAD_D
    d_ok = offs_d < HEAD_D
    OFFSET = S_k - S_q
    row_ok = offs_m < S_q
    q_rows = Q + zo * stride_qz + ho * stride_qh + offs_m[:, None] * stride_qs
    do_rows = DO + zo * stride_doz + ho * stride_doh + offs_m[:, None] * stride_dos
    q = _ld(q_rows + offs_d[None, :] * stride_qd, row_ok, d_ok, True, PAD_D)
    do = _ld(do_rows + offs_d[None, :] * stride_dod, row_ok, d_ok, True, PAD_D)
    if F32_DOTS:
        q = q.to(tl.float32)
        do = do.to(tl.float32)
    lse_row = LSE + bh * S_q
    if RAW_M:
        lse_row = LSE + bh * (2 * S_q)
    lse = tl.load(lse_row + offs_m, mask=row_ok, other=float("inf"))
    lse = tl.where(lse == float("-inf"), float("inf"), lse)  # log2 units
    ll = lse  # (unused without RAW_M)
    if RAW_M:
        ll = tl.load(lse_row + S_q + offs_m, mask=row_ok, other=0.0)
    if DELTA_ONLY:
        delta = tl.zeros([BLOCK_M], tl.float32)
    else:
        delta = tl.load(DELTA + bh * S_q + offs_m, mask=row_ok, other=0.0)
    hk = ho
    if GQA:
        hk = ho // GROUP  # the k/v head of this q head
    k_rows = K + zo * stride_kz + hk * stride_kh + offs_n[:, None] * stride_ks
    v_rows = V + zo * stride_vz + hk * stride_vh + offs_n[:, None] * stride_vs
    k_ptrs = k_rows + offs_d[None, :] * stride_kd
    v_ptrs = v_rows + offs_d[None, :] * stride_vd
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    # The second head-dim tile (SPLIT); without it, placeholders that are never read.
    offs_d1, d_ok1, q1, do1, k1_ptrs, v1_ptrs, dq1 = offs_d, d_ok, q, do, k_ptrs, v_ptrs, dq
    if SPLIT:
        offs_d1 = BLOCK_D + tl.arange(0, BLOCK_D2)
        d_ok1 = offs_d1 < HEAD_D
        q1 = _ld(q_rows + offs_d1[None, :] * stride_qd, row_ok, d_ok1, True, PAD_D1)
        do1 = _ld(do_rows + offs_d1[None, :] * stride_dod, row_ok, d_ok1, True, PAD_D1)
        if F32_DOTS:
            q1 = q1.to(tl.float32)
            do1 = do1.to(tl.float32)
        k1_ptrs = k_rows + offs_d1[None, :] * stride_kd
        v1_ptrs = v_rows + offs_d1[None, :] * stride_vd
        dq1 = tl.zeros([BLOCK_M, BLOCK_D2], tl.float32)

    full = (S_k // BLOCK_N) * BLOCK_N
    end = S_k
    if CAUSAL:
        diag = (tl.maximum(start_m + OFFSET + 1, 0) // BLOCK_N) * BLOCK_N
        full = tl.minimum(full, diag)
        end = tl.maximum(tl.minimum(S_k, start_m + BLOCK_M + OFFSET), 0)
    start = 0
    if WINDOW:  # as _attn_fwd
        start = (tl.maximum(start_m + OFFSET - WIN_L, 0) // BLOCK_N) * BLOCK_N
        end = tl.maximum(tl.minimum(S_k, start_m + BLOCK_M + OFFSET + WIN_R), 0)
        full = start
    dq, dq1, delta = _dq_inner(
        dq, dq1, q, do, q1, do1, lse, ll, delta, k_ptrs, v_ptrs, k1_ptrs, v1_ptrs, stride_ks, stride_vs,
        offs_m, offs_n, d_ok, d_ok1, start, full, qk_scale, S_k, OFFSET, WIN_L, WIN_R, cap_in, cap_out,
        False, CAUSAL, BLOCK_N, PREC, F32_DOTS, PAD_D, WINDOW, SOFTCAP, RAW_M, DELTA_ONLY, SPLIT, PAD_D1,
    )  # fmt: skip
    dq, dq1, delta = _dq_inner(
        dq, dq1, q, do, q1, do1, lse, ll, delta, k_ptrs, v_ptrs, k1_ptrs, v1_ptrs, stride_ks, stride_vs,
        offs_m, offs_n, d_ok, d_ok1, full, end, qk_scale, S_k, OFFSET, WIN_L, WIN_R, cap_in, cap_out,
        True, CAUSAL, BLOCK_N, PREC, F32_DOTS, PAD_D, WINDOW, SOFTCAP, RAW_M, DELTA_ONLY, SPLIT, PAD_D1,
    )  # fmt: skip
    if DELTA_ONLY:
        tl.store(DELTA + bh * S_q + offs_m, delta, mask=row_ok)
    else:
        dq = dq * sm_scale
        dq_row = DQ + zo * stride_dqz + ho * stride_dqh + offs_m[:, None] * stride_dqs
        _st(dq_row + offs_d[None, :], dq.to(DQ.dtype.element_ty), row_ok, d_ok, PAD_D)
        if SPLIT:
            dq1 = dq1 * sm_scale
            _st(dq_row + offs_d1[None, :], dq1.to(DQ.dtype.element_ty), row_ok, d_ok1, PAD_D1)


# The same kernels for launches with CPU tensors (Triton's interpreter, which runs programs
# one after another): one small config each, BLOCK_M != BLOCK_N so that tests exercise the
# causal bookkeeping with unequal tiles. Tuners of their own, so that a key tuned on a GPU
# never hands its tile to the interpreter, nor the reverse.
def _interp_tuner(tuner, cfg):
    return triton.autotune(configs=[cfg], key=tuner.keys)(tuner.fn)


_attn_fwd_interp = _interp_tuner(_attn_fwd, _cfg(32, 16, 4, 1))
_attn_bwd_dkdv_interp = _interp_tuner(_attn_bwd_dkdv, _cfg(16, 32, 4, 1))
_attn_bwd_dq_interp = _interp_tuner(_attn_bwd_dq, _cfg(32, 16, 4, 1))


# --------------------------------------------------------------------------- launchers


def _prec(dtype: torch.dtype, interp: bool) -> str:
    """Dot precision (see _dot): TF32 for fp32 exactly when PyTorch's matmuls use it,
    with the operands rounded to nearest on a GPU ("tf32rn"; the interpreter has no PTX)."""
    return dot_precision(dtype, torch.backends.cuda.matmul.allow_tf32, interp)


def _f32_dots(dtype: torch.dtype, interp: bool) -> bool:
    """F32_DOTS, for the interpreter only (on a GPU: never): it gets bf16 dots and fp32 ->
    bf16 casts wrong (numpy has no bf16), so bf16 tiles are upcast to fp32 before the dots;
    fp32 tiles stay as they are, and their shared IEEE dots run in fp64 (_shared_dot)."""
    return interp and dtype in (torch.bfloat16, torch.float32)


def _split(t: torch.Tensor) -> torch.Tensor:
    """t (..., S, D) as a 4-D (Z, NH, S, D) tensor with t's own strides: the kernels index
    batch and head apart, so q, k, v read straight out of a fused qkv projection
    ([B, S, 3, H, D] permuted: no copy) and o, dq, dk, dv are written in any layout. Only
    leading dims beyond two that cannot be viewed as one are copied."""
    lead = t.shape[:-2]
    if len(lead) == 2:
        return t
    if len(lead) < 2:
        return t.reshape((1,) * (2 - len(lead)) + tuple(t.shape))
    return t.reshape((math.prod(lead[:-1]),) + tuple(t.shape[-3:]))  # (-1 fails on 0 elements)


def empty_bshd(lead, s: int, d: int, dtype, device) -> torch.Tensor:
    """A fresh (lead..., S, D) tensor whose memory is ordered (lead[:-1]..., S, lead[-1], D):
    for q-shaped [B, H, S, D] outputs, o.transpose(1, 2).reshape(B, S, H * D) is a view
    (what a transformer's output projection reads), as SDPA's flash kernel lays out its
    output. With no leading dims: contiguous. Not a view of another tensor (empty_strided,
    not a transpose): autograd lets a user modify a custom Function's output in place
    only when it is not a view made inside the Function (INPLACE_HINT)."""
    lead = tuple(lead)
    if not lead:
        return torch.empty((s, d), dtype=dtype, device=device)
    order = lead[:-1] + (s, lead[-1], d)  # the memory's order, contiguous
    st, acc = [], 1
    for n in reversed(order):
        st.append(acc)
        acc *= max(n, 1)
    st.reverse()
    return torch.empty_strided(lead + (s, d), st[:-3] + [st[-2], st[-3], st[-1]], dtype=dtype, device=device)


def _block_d(d: int) -> int:
    """The head dim's one tile: the next power of two (tl.arange needs one), at least 16 (the
    smallest K of tl.dot); the columns past D are masked."""
    return triton_support.next_pow2(d) if d > 16 else 16


def _d_tiles(d: int, dtype: torch.dtype, split: bool = True) -> tuple[int, int]:
    """(BLOCK_D, BLOCK_D2): the head dim's tiles. One tile of ``_block_d(d)`` columns
    (BLOCK_D2 = 0) pads D up to a power of two, and every dot over D, every K/V/Q tile in
    shared memory and every dK/dV/dQ accumulator is that wide: D = 80 does the MMA work
    and holds the registers of D = 128. Where D is exactly two power-of-two tiles (the
    largest power of two below D, then a power of two >= 16), 16-bit dtypes take them:
    80 = 64 + 16, 96 = 64 + 32, 48 = 32 + 16, 160 = 128 + 32, 192 = 128 + 64; each dot
    over D is two MMAs chained into one accumulator. Head dims whose second tile would hold
    padded columns (72 -> 64 + 16, 40 -> 32 + 16) keep the one padded tile (the masked
    second tile faulted on the GPU: benchmarks/NOTES.md). fp32 keeps one tile: its IEEE
    dots are single FMA chains over D that the forward and backward must round alike (``_shared_dot``). ``split`` False
    (``kernellab.config.attn_split_d``): always one tile."""
    full = _block_d(d)
    if not split or dtype == torch.float32 or d <= 16:
        return full, 0
    lo = full // 2
    rest = max(16, triton_support.next_pow2(d - lo))
    if lo >= 16 and lo + rest == d < full:
        return lo, rest
    return full, 0


def _bucket(n: int) -> int:
    # A length that is symbolic (dynamic shapes, traced under torch.compile) is passed as
    # is: Inductor tunes once per compiled kernel and reads the key only through _prune.
    return triton_support.next_pow2(max(n, 1)) if type(n) is int else n


_UNBOUNDED = 1 << 30  # a window side of -1: farther than any length (int32 sums stay < 2^31)
EXACT_DELTA_KEYS = 64  # fp32: delta from P * dP where no row sees more keys (backward_into)


def _options(causal: bool, scale: float, window_left: int, window_right: int, softcap: float, interp: bool):
    """Kernel arguments of the options: (qk_scale, cap_in, cap_out, WIN_L, WIN_R, WINDOW,
    SOFTCAP) for a launch on a GPU or, ``interp``, under the interpreter. A window that
    restricts nothing beyond causal (both sides -1, or causal with no left bound) is no
    window: the causal kernels run unchanged."""
    if causal:
        window_right = 0
    window = window_left >= 0 or (window_right >= 0 and not causal)
    wl = (window_left if window_left >= 0 else _UNBOUNDED) if window else 0
    wr = (window_right if window_right >= 0 else _UNBOUNDED) if window else 0
    if softcap > 0:
        # scores in log2 units: softcap * log2(e) * tanh(qk * scale / softcap); qk_scale 1
        cap = 2 if interp else 1
        return 1.0, scale / softcap, softcap * LOG2E, wl, wr, window, cap
    return scale * LOG2E, 0.0, 0.0, wl, wr, window, 0


def forward(
    q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float,
    window_left: int = -1, window_right: int = -1, softcap: float = 0.0,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """(o, lse) for any strided q, k, v (same leading dims but GQA's heads); o in
    ``empty_bshd``'s layout, lse the log-sum-exp (..., S_q), fp32 contiguous, in log2
    units for every dtype (natural LSE = lse * ln 2; ``lse_shape``). window_left /
    window_right: -1 unbounded (the package docstring); softcap 0: off."""
    return forward_into(q, k, v, causal, scale, None, window_left, window_right, softcap)


def forward_into(q, k, v, causal: bool, scale: float, o, window_left=-1, window_right=-1, softcap=0.0):
    """``forward`` writing o into the given tensor (shaped as q, unit-stride head dim, any
    dtype the kernel stores: ring attention passes fp32 so that each block's partial
    output is rounded once, at the end); None: fresh, in q's dtype and ``empty_bshd``'s
    layout."""
    lead, s_q, d = q.shape[:-2], q.shape[-2], q.shape[-1]
    fresh = o is None
    o = empty_bshd(lead, s_q, d, q.dtype, q.device) if fresh else o
    lse = torch.empty(lse_shape(q), dtype=torch.float32, device=q.device)
    raw_m = q.dtype == torch.float32  # (lse_shape: the fp32 exponents)
    real = type(q) in triton_support._REAL_TENSORS
    key = None
    if real:
        key = ("f", q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype, k.dtype, v.dtype,
               q.get_device(),
               causal, scale, window_left, window_right, softcap, None if fresh else (o.dtype, o.stride()),
               _tf32(q.dtype), config.attn_ws, config.attn_split_d)  # fmt: skip
    q4, k4, v4, o4 = _split(q), _split(k), _split(v), _split(o)
    plan = _plan(key, lambda: _fwd_plan(q4, k4, v4, o4, raw_m, causal, scale, window_left, window_right, softcap))
    if plan is not None:
        plan(q4, k4, v4, o4, lse)
    return o, lse


# Launch plans: what a launcher derives from a call's shapes, strides, dtypes, device and
# options (the kernel, its constexprs and scalar arguments, the tuned tile and grid, the
# warp-specialized path or not) is computed once per key and kept; a call then allocates
# its outputs and launches (triton_support.Bound: the compiled launcher with the tensors'
# addresses). Done per call, this Python would be most of a small call's host cost.
_PLANS: dict = {}


def _plan(key, make):
    return triton_support.kept_plan(_PLANS, key, make)


def _tf32(dtype) -> bool:  # (the plan keys: _prec reads this global flag for fp32)
    return dtype is torch.float32 and torch.backends.cuda.matmul.allow_tf32


def _fwd_plan(q4, k4, v4, o4, raw_m, causal, scale, window_left, window_right, softcap):
    """The forward's launch ``plan(q4, k4, v4, o4, lse)``, or None (nothing to launch)."""
    nh = q4.shape[1]
    bh = q4.shape[0] * nh
    s_q, s_k, d = q4.shape[-2], k4.shape[-2], q4.shape[-1]
    if not (bh and s_q):
        return None
    group = nh // k4.shape[1] if k4.shape[1] else 1  # GQA: q heads per k/v head
    interp = _device.triton_interpreted(q4)
    options = _options(causal, scale, window_left, window_right, softcap, interp)
    qk_scale, cap_in, cap_out, wl, wr, win, cap = options
    rest = (
        qk_scale, cap_in, cap_out, *q4.stride(), *k4.stride(), *v4.stride(), *o4.stride()[:3],
        nh, group, s_q, s_k, _bucket(s_q), _bucket(s_k), wl, wr,
    )  # fmt: skip
    bd, bd2 = _d_tiles(d, q4.dtype, config.attn_split_d)
    kw = dict(
        HEAD_D=d, BLOCK_D=bd, BLOCK_D2=bd2, CAUSAL=causal, PREC=_prec(q4.dtype, interp),
        F32_DOTS=_f32_dots(q4.dtype, interp), WINDOW=win, SOFTCAP=cap, GQA=group > 1, RAW_M=raw_m,
        STATS=False,
    )  # fmt: skip
    # The grid depends on the tile the autotuner picks.
    grid = lambda meta: (triton_support.cdiv(s_q, meta["BLOCK_M"]) * bh,)  # noqa: E731
    tuned = triton_support.TunedBound(_attn_fwd_interp if interp else _attn_fwd, grid, kw, (0, 1, 2, 3))

    def plan(q4, k4, v4, o4, lse):
        tuned(q4, k4, v4, o4, lse, *rest)

    if not _ws_fits(q4, k4, v4, o4, causal, group, win, cap, d, qk_scale, s_q, s_k):
        return plan

    def plan_ws(q4, k4, v4, o4, lse):
        if (q4.data_ptr() | k4.data_ptr() | v4.data_ptr()) & 15:  # TMA: 16-byte aligned bases
            return plan(q4, k4, v4, o4, lse)
        _launch_ws(q4, k4, v4, o4, lse, qk_scale, nh, s_q)

    return plan_ws


# The warp-specialized forward (_attn_fwd_ws): where it runs, one tile. On Hopper (bf16,
# D=128, not causal) it is faster than _attn_fwd at S = 1k-16k; at D=64 it is not faster,
# and its causal forms do not compile under Triton 3.6.
WS_MIN_S = 1024
_WS_TILE = dict(BLOCK_M=128, BLOCK_N=128, num_warps=4, num_stages=2)
_WS_TRITON = hasattr(tl, "make_tensor_descriptor")


def _ws_fits(q4, k4, v4, o4, causal, group, win, cap, d, qk_scale, s_q, s_k) -> bool:
    """Whether this forward takes _attn_fwd_ws: a Hopper GPU, not causal, no window, no
    softcap, no GQA, 16-bit, D = 128, S_q = S_k >= WS_MIN_S a multiple of 128, a positive
    scale, q, k and v contiguous (B, H, S, D); o any strides with unit-stride rows. TMA's
    16-byte aligned bases are the plan's test, on every call (_fwd_plan). ``config.attn_ws`` "0"
    turns it off. Eager tensors only: traced by torch.compile (the triton_op's fake tensors)
    the autotuned kernel runs."""
    return (
        type(q4) in triton_support._REAL_TENSORS
        and q4.is_cuda
        and not causal
        and not win
        and not cap
        and group == 1
        and d == 128
        and s_q == s_k
        and s_q >= WS_MIN_S
        and s_q % 128 == 0
        and qk_scale > 0
        and q4.dtype in (torch.float16, torch.bfloat16)
        and o4.stride(-1) == 1
        and q4.is_contiguous()
        and k4.is_contiguous()
        and v4.is_contiguous()
        and _WS_TRITON
        and not _device.triton_interpret_forced()
        and _device.is_sm90(q4.get_device())
        and config.attn_ws != "0"
    )


def _launch_ws(q4, k4, v4, o4, lse, qk_scale, nh, s):
    triton_support.install_tma_allocator()  # per call: Triton's allocator is per thread
    bh = q4.shape[0] * nh
    grid = (bh * (s // _WS_TILE["BLOCK_M"]),)
    _attn_fwd_ws[grid](
        q4, k4, v4, o4, lse, qk_scale, o4.stride(0), o4.stride(1), o4.stride(2),
        nh, s, bh * s, HEAD_D=q4.shape[-1], F32_DOTS=_f32_dots(q4.dtype, _device.triton_interpreted(q4)),
        **_WS_TILE,
    )  # fmt: skip


WS_BWD_MIN_S = 2048  # (at 2k causal the probe's warp-specialized backward tied the plain one)
_WS_BWD_DKDV = dict(BLOCK_M=64, BLOCK_N=128, num_warps=4, num_stages=2)
_WS_BWD_DQ = dict(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=2)


def _ws_layout(t4: Tensor, d: int) -> tuple[int, int, int, int] | None:
    """(rows, stride_z, stride_h, stride_s) of the 2-D view the warp-specialized backward
    reads a (Z, H, S, D) tensor through (see _ws_view), or None where TMA cannot: every
    head's rows one stride_s apart with its D columns inside a row, 16-byte aligned strides
    and head offsets (the base address is tested per call)."""
    zs, hs, s = t4.shape[0], t4.shape[1], t4.shape[2]
    sz, sh, ss, sd = t4.stride()
    esz = t4.element_size()
    if sd != 1 or ss < d or (ss * esz) % 16 or (sz * esz) % 16 or (sh * esz) % 16 or (zs > 1 and sz % ss):
        return None
    if max((hh * sh) % ss for hh in range(hs)) + d > ss:
        return None
    return ((zs - 1) * sz + (hs - 1) * sh) // ss + s, sz, sh, ss


def _ws_bwd_fits(q4, k4, v4, do4, causal, group, win, cap, d, qk_scale, s_q, s_k, raw_m) -> bool:
    """Whether the backward takes the warp-specialized passes: a Hopper GPU, 16-bit, D = 128,
    S_q = S_k >= WS_BWD_MIN_S a multiple of 128, no GQA, window or softcap, a positive scale,
    q, k, v and dO in layouts _ws_layout reads. Which layouts: ``kernellab.config.attn_ws_bwd``,
    "1" (the default) head-major ones, each head's rows starting at column 0 of its view;
    "views" also a fused projection's (B, S, H, D) memory, whose heads start at column
    h * D; "0" none. Eager tensors only."""
    mode = config.attn_ws_bwd
    return (
        mode != "0"
        and type(q4) in triton_support._REAL_TENSORS
        and q4.is_cuda
        and not raw_m
        and not win
        and not cap
        and group == 1
        and d == 128
        and s_q == s_k
        and s_q >= WS_BWD_MIN_S
        and s_q % 128 == 0
        and qk_scale > 0
        and q4.dtype in (torch.float16, torch.bfloat16)
        and k4.dtype == v4.dtype == do4.dtype == q4.dtype
        and all(_ws_layout(t, d) is not None for t in (q4, k4, v4, do4))
        and (mode == "views" or all(t.stride(1) % t.stride(2) == 0 for t in (q4, k4, v4, do4)))
        and _WS_TRITON
        and not _device.triton_interpret_forced()
        and _device.is_sm90(q4.get_device())
    )


def _ws_bwd_args(q4, k4, v4, do4, d):
    """The descriptor-view arguments (rows, stride_z, stride_h, stride_s) of q, k, v, dO."""
    return tuple(x for t in (q4, k4, v4, do4) for x in _ws_layout(t, d))


def lse_shape(q: Tensor) -> tuple[int, ...]:
    """The saved lse's shape, (..., S_q) = q.shape[:-1] for every dtype: the log-sum-exp of
    the scaled scores in log2 units (log2 sum 2^(s * scale * log2 e); softcap: of the capped
    scores), fp32. It is the one tensor the forward saves beyond q, k, v and o (a contract:
    course test suites read ``o.grad_fn.saved_tensors``).

    fp32's backward does not recompute P from it. There every exponent is formed as (s -
    m) * |c| - log2(l), from the row max m in score units (q . k, negated for a negative
    scale; softcap: the capped score in log2 units) and log2(l), l = sum exp2((s - m) *
    |c|), c = scale * log2 e (1 with a softcap): the difference near the max is exact.
    Scaling first (s * c - lse, the 16-bit form) rounds s * c to |s * c| * 2^-24, which at
    rows with few keys puts fp32 dv over twice PyTorch's error, and (m, log2 l) cannot be
    split back out of one
    rounded lse. So the fp32 backward first recomputes (m, log2 l) with the forward kernel
    in its STATS mode (scores and row sums only, no V and no P @ V; ``backward_into``).
    16-bit outputs' own rounding is far above that error: their backward reads the lse."""
    return tuple(q.shape[:-1])


def backward(
    do: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, causal: bool, scale: float,
    window_left: int = -1, window_right: int = -1, softcap: float = 0.0,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """(dq, dk, dv) from the saved o and lse, in ``empty_bshd``'s layout."""
    return backward_into(
        do, q, k, v, o, lse, causal, scale, None, None, None, window_left, window_right, softcap
    )


def backward_into(
    do, q, k, v, o, lse, causal: bool, scale: float, dq, dk, dv, window_left=-1, window_right=-1, softcap=0.0,
    exact_stats: bool = True, after_dkdv=None,
):  # fmt: skip
    """``backward`` writing into the given ``dq``, ``dk``, ``dv`` (any strides with a
    unit-stride head dim, shaped as q, k, v: a fused model passes views of its qkv gradient
    buffer); None: fresh, in ``empty_bshd``'s layout. lse: the log-sum-exp (..., S_q) in
    log2 units, fp32, contiguous (``lse_shape``). fp32 with ``exact_stats`` (the default,
    for an lse over exactly these keys): the row statistics are recomputed from q and k
    (``lse_shape`` says why) and lse is not read. ``exact_stats=False``: P comes from lse
    as given, in every dtype (ring attention: its merged lse spans keys this call does
    not see). ``after_dkdv``: called with no argument once the dk / dv kernels are
    enqueued, before the dq kernel (ring attention sends dK/dV on while dq computes)."""
    lead, s_q, s_k, d = q.shape[:-2], q.shape[-2], k.shape[-2], q.shape[-1]
    raw_m = bool(exact_stats) and q.dtype == torch.float32
    want = tuple(lead) + (s_q,)
    if tuple(lse.shape) != want or lse.dtype != torch.float32 or not lse.is_contiguous():
        raise ValueError(
            f"attention/triton backward: lse must be a contiguous fp32 tensor of shape {want} "
            f"(q.shape[:-1]), got {lse.dtype} {tuple(lse.shape)}"
            + ("" if lse.is_contiguous() else " (not contiguous)")
        )
    fresh = (dq is None, dk is None, dv is None)
    dq = empty_bshd(lead, s_q, d, q.dtype, q.device) if dq is None else dq
    dk = empty_bshd(k.shape[:-2], s_k, d, k.dtype, k.device) if dk is None else dk
    dv = empty_bshd(v.shape[:-2], s_k, v.shape[-1], v.dtype, v.device) if dv is None else dv
    key = None
    if type(q) in triton_support._REAL_TENSORS:
        key = ("b", q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), do.shape, do.stride(),
               o.shape, o.stride(), lse.shape, q.dtype, do.dtype, o.dtype, q.get_device(), causal, scale,
               window_left, window_right, softcap, _tf32(q.dtype), config.attn_ws_bwd, raw_m,
               config.attn_split_d,
               k.dtype, v.dtype, *(None if f else (t.dtype, t.stride()) for f, t in zip(fresh, (dq, dk, dv))))  # fmt: skip
    t4 = tuple(_split(t) for t in (q, k, v, do, o, dq, dk, dv))
    plan = _plan(key, lambda: _bwd_plan(*t4, lse, raw_m, causal, scale, window_left, window_right, softcap))
    if plan is not None:
        plan(*t4, lse, after_dkdv)
    elif after_dkdv is not None:
        after_dkdv()
    return dq, dk, dv


def _bwd_plan(q4, k4, v4, do4, o4, dq4, dk4, dv4, lse, raw_m, causal, scale, window_left, window_right, softcap):
    """The backward's launch ``plan(q4, k4, v4, do4, o4, dq4, dk4, dv4, lse)``, or None."""
    nh = q4.shape[1]
    bh = q4.shape[0] * nh
    s_q, s_k, d = q4.shape[-2], k4.shape[-2], q4.shape[-1]
    if not bh:
        return None
    group = nh // k4.shape[1] if k4.shape[1] else 1  # GQA: q heads per k/v head
    interp = _device.triton_interpreted(q4)
    fwd, bwd_dkdv, bwd_dq = (_attn_fwd_interp, _attn_bwd_dkdv_interp, _attn_bwd_dq_interp) if interp else (
        _attn_fwd, _attn_bwd_dkdv, _attn_bwd_dq)  # fmt: skip
    prec = _prec(q4.dtype, interp)
    bd, bd2 = _d_tiles(d, q4.dtype, config.attn_split_d)
    options = _options(causal, scale, window_left, window_right, softcap, interp)
    qk_scale, cap_in, cap_out, wl, wr, win, cap = options
    common = (qk_scale, scale, cap_in, cap_out, *q4.stride(), *k4.stride(), *v4.stride(), *do4.stride())
    lengths = (nh, group, s_q, s_k, _bucket(s_q), _bucket(s_k), wl, wr)
    dq_rest = (*common, *dq4.stride()[:3], *lengths)
    dq_kw = dict(
        HEAD_D=d, BLOCK_D=bd, BLOCK_D2=bd2, CAUSAL=causal, PREC=prec, F32_DOTS=_f32_dots(q4.dtype, interp),
        WINDOW=win, SOFTCAP=cap, GQA=group > 1, RAW_M=raw_m,
    )  # fmt: skip
    dq_grid = lambda meta: (triton_support.cdiv(s_q, meta["BLOCK_M"]) * bh,)  # noqa: E731
    keys = min(s_k, wl + wr + 1) if win else s_k  # the most keys a row sees
    stats = delta_pass = pre = pre_rest = dkdv = dqp = None
    if s_q and raw_m:
        # fp32: the exact row statistics (lse_shape) from the forward kernel in STATS mode:
        # its QK^T and row sums without V, P @ V or the o store, one matmul more beside the
        # backward's seven (the fp32 backward is the slow teaching path; 16-bit never runs
        # it). The forward's own code: the same scores, max and sums as o was made with.
        stats = triton_support.TunedBound(fwd, dq_grid, dict(dq_kw, STATS=True), (0, 1, 2, 3))
        stats_rest = (
            qk_scale, cap_in, cap_out, *q4.stride(), *k4.stride(), *v4.stride(), *o4.stride()[:3],
            nh, group, s_q, s_k, _bucket(s_q), _bucket(s_k), wl, wr,
        )  # fmt: skip
    if s_q and raw_m and keys <= EXACT_DELTA_KEYS:
        # fp32 from our forward, every row seeing few keys: delta = rowsum(P * dP) from
        # the very P and dP that dS uses, not rowsum(dO * O). A row that sees one key
        # then gets dS = P (dP - delta) = 0 exactly, as PyTorch's softmax backward
        # gives; from dO * O it is a few ulps (dq over the check's bound at window
        # (0, -1), where PyTorch's error is 0). It costs a pass over the keys like dq's
        # without the dq dot (a large share of a short fp32 backward): where rows see
        # many keys, PyTorch's own error is far above those ulps.
        delta_pass = triton_support.TunedBound(bwd_dq, dq_grid, dict(dq_kw, DELTA_ONLY=True), (0, 1, 2, 3, 4, 6))
    elif s_q:
        pre_m = 32 if interp else 64
        num_m = triton_support.cdiv(s_q, pre_m)
        pre = triton_support.Bound(_attn_bwd_pre, (num_m * bh,), dict(HEAD_D=d, BLOCK_D=_block_d(d), BLOCK_M=pre_m), (0, 1))
        pre_rest = (*o4.stride()[:3], *do4.stride(), nh, s_q, num_m)
    if s_k:
        dkdv = triton_support.TunedBound(
            bwd_dkdv, lambda meta: (triton_support.cdiv(s_k, meta["BLOCK_N"]) * (bh // group),),
            dict(dq_kw), (0, 1, 2, 3, 4, 6, 7),
        )  # fmt: skip
        dkdv_rest = (*common, *dk4.stride()[:3], *dv4.stride()[:3], *lengths)
    if s_q:
        dqp = triton_support.TunedBound(bwd_dq, dq_grid, dict(dq_kw, DELTA_ONLY=False), (0, 1, 2, 3, 4, 6))
    dev = q4.device
    ws = _ws_bwd_fits(q4, k4, v4, do4, causal, group, win, cap, d, qk_scale, s_q, s_k, raw_m)
    if ws:
        views = _ws_bwd_args(q4, k4, v4, do4, d)
        ws_dkdv = (qk_scale, scale, *views, *dk4.stride()[:3], *dv4.stride()[:3], nh, s_q, bh * s_q)
        ws_dq = (qk_scale, scale, *views, *dq4.stride()[:3], nh, s_q, bh * s_q)
        grid_dkdv = (bh * (s_q // _WS_BWD_DKDV["BLOCK_N"]),)
        grid_dq = (bh * (s_q // _WS_BWD_DQ["BLOCK_M"]),)

    def plan(q4, k4, v4, do4, o4, dq4, dk4, dv4, lse, after_dkdv=None):
        delta = torch.empty((bh, s_q), dtype=torch.float32, device=dev)
        if ws and not (q4.data_ptr() | k4.data_ptr() | v4.data_ptr() | do4.data_ptr()) & 15:  # TMA bases
            pre(o4, do4, delta, *pre_rest)
            triton_support.install_tma_allocator()  # per call: Triton's allocator is per thread
            _attn_bwd_dkdv_ws[grid_dkdv](q4, k4, v4, do4, lse, delta, dk4, dv4, *ws_dkdv, HEAD_D=d,
                                         CAUSAL=causal, **_WS_BWD_DKDV)  # fmt: skip
            if after_dkdv is not None:
                after_dkdv()
            _attn_bwd_dq_ws[grid_dq](q4, k4, v4, do4, lse, delta, dq4, *ws_dq, HEAD_D=d, CAUSAL=causal,
                                     **_WS_BWD_DQ)  # fmt: skip
            return
        if stats is not None:  # (m, log2 l) planes in place of the saved lse
            lse = torch.empty((bh, 2, s_q), dtype=torch.float32, device=dev)
            stats(q4, k4, v4, o4, lse, *stats_rest)
        if delta_pass is not None:
            delta_pass(q4, k4, v4, do4, lse, delta, dq4, *dq_rest)
        elif pre is not None:
            pre(o4, do4, delta, *pre_rest)
        if dkdv is not None:
            dkdv(q4, k4, v4, do4, lse, delta, dk4, dv4, *dkdv_rest)
        if after_dkdv is not None:
            after_dkdv()
        if dqp is not None:
            dqp(q4, k4, v4, do4, lse, delta, dq4, *dq_rest)

    return plan


# --------------------------------------------------------------------------- custom op (the kit)
#
# kit.build makes, from the two launchers above (their annotations are the schemas), the
# ops kernellab::attention_triton (q, k, v, causal, scale) -> (o, lse) and
# kernellab::attention_triton_backward (do, q, k, v, o, lse, causal, scale) -> (dq, dk, dv)
# (on a GPU ``triton_op``s: under torch.compile Inductor traces the launchers, whose
# kernels reach it through launch_tuned / jit -> wrap_triton, and launches _attn_fwd,
# _attn_bwd_pre, _attn_bwd_dkdv and _attn_bwd_dq from its own code; under the CPU
# interpreter ``custom_op``s), their autograd, and the eager path (the launchers under a
# plain autograd.Function, or the forward alone when no gradient is needed). Saved for
# the backward: q, k, v, o and the LSE (one tensor beyond the inputs and the output);
# extra: (causal, scale).


# The backward reads q, k, v and o as the forward left them (delta = rowsum(dO * O)).
# Modifying o in place is allowed (o is not a view: empty_bshd), as with SDPA's fused
# kernels, which save o too; a backward after it is refused by this message, not run on
# the modified values.
INPLACE_HINT = (
    "q, k, v or the output o was modified in place after the forward, and the backward needs "
    "their values from the forward; modify a copy instead (o = o.clone() before an in-place "
    "op on the output)"
)


def _opcheck_fwd(make):
    return (make(1), make(1), make(1), True, 0.125)


def _opcheck_bwd(make):
    q, k, v = make(0), make(0), make(0)
    o, lse = forward(q, k, v, True, 0.125)
    return (make(0), q, k, v, o, lse, True, 0.125)


def _opcheck_fwd_options(make):  # (window and softcap: the op's optional arguments)
    return (make(1), make(1), make(1), False, 0.125, 5, 3, 2.0)


_attention = build(
    OpDecl(
        name="attention_triton",
        label="attention (triton)",
        fwd=forward,
        bwd=backward,
        fwd_fake=lambda q, k, v, causal, scale, *options: (
            empty_bshd(q.shape[:-2], q.shape[-2], v.shape[-1], q.dtype, q.device),
            q.new_empty(lse_shape(q), dtype=torch.float32),
        ),
        bwd_fake=lambda do, q, k, v, o, lse, causal, scale, *options: tuple(
            empty_bshd(t.shape[:-2], t.shape[-2], t.shape[-1], t.dtype, t.device) for t in (q, k, v)
        ),
        save=lambda inputs, out: ((*inputs[:3], out[0], out[1]), inputs[3:]),
        bwd_args=lambda saved, extra, do: (do, *saved, *extra),
        # extra: (causal, scale) or (causal, scale, window_left, window_right, softcap), as called
        grads=lambda g, extra: (g[0], g[1], g[2]) + (None,) * len(extra),
        needs_grad=lambda q, k, v, *options: q.requires_grad or k.requires_grad or v.requires_grad,
        samples=(_opcheck_fwd, _opcheck_bwd),  # (+ _opcheck_fwd_options in the tests)
        # A triton_op on a GPU (Inductor launches the four kernels itself); the kernels
        # cast their float scales to fp32 so that it compiles there (Inductor passes
        # floats as fp64).
        triton=True,
        inplace_hint=INPLACE_HINT,
    )
)


def triton_attention(q, k, v, causal: bool = False, scale=None, window=None, softcap=None):
    """FlashAttention-2 in Triton: online softmax in SRAM, causal blocks skipped, autotuned tiles."""
    d = q.shape[-1]
    if d % 8 or not 8 <= d <= 256:
        raise ValueError(
            f"attention/triton: q has head dim {d}; this backend supports multiples of 8 from 8 to 256"
        )
    if window is None and not softcap:  # the five-argument op: models' path, unchanged
        return _attention(q, k, v, causal, resolve_scale(q, scale))
    wl, wr = window if window is not None else (-1, -1)
    return _attention(q, k, v, causal, resolve_scale(q, scale), wl, wr, float(softcap or 0.0))


# For models that put several ops under one autograd node of their own (kit.build):
# ``forward_saving(q, k, v, causal, scale) -> (o, saved)`` with a float scale (not None),
# ``backward_from(saved, do) -> (dq, dk, dv, None, None)``: one entry per input of
# forward_saving, the last two (causal, scale) always None. (forward_saving may also take
# window_left, window_right, softcap after scale: then three more None.)
triton_attention.forward_saving = _attention.forward_saving
triton_attention.backward_from = _attention.backward_from
triton_attention.custom_ops, triton_attention.ops = _attention.custom_ops, _attention.ops


_ASM_GQA = False  # (the kernels as plain attention launches them; True: as GQA does)


def _kernel_specs(dtype: str, arch: str | None = None):
    """For `kernellab asm`: the kernels launched at the bench's B=4 H=16 S=4096 D=128 causal
    problem, contiguous (unit head-dim strides, which Triton specializes as constants at
    run time): the forward, the backward's delta pass, and its dK/dV and dQ passes - on
    Hopper (``arch`` sm_90) at 16 bits the warp-specialized ones with their one tile
    (_ws_bwd_fits), else the autotuned ones with the first config of each list that the
    tuner's pruning keeps for the dtype (the autotuner may pick another) and the launch's
    dot precision."""
    ptr = f"*{dtype}"
    t = parse_dtype(dtype)
    bd, bd2 = _d_tiles(128, t, config.attn_split_d)
    nargs = {"Q": torch.empty(0, dtype=t, device="meta"), "S_Q_KEY": 4096, "S_K_KEY": 4096}

    def strides(names, out_names):
        sig, cx = {}, {}
        for n in names:
            for suffix in ("z", "h", "s", "d"):
                key = f"stride_{n}{suffix}"
                if suffix == "d":
                    sig[key], cx[key] = "constexpr", 1
                else:
                    sig[key] = "i32"
        for n in out_names:  # outputs: unit-stride head dim, no stride argument for it
            sig.update({f"stride_{n}{suffix}": "i32" for suffix in ("z", "h", "s")})
        return sig, cx

    def spec(kernel, ptrs, scalars, stride_names, out_strides, cfg):
        sig = {p_: ("*fp32" if p_ in ("LSE", "DELTA") else ptr) for p_ in ptrs}
        sig.update({s_: "fp32" for s_ in scalars})
        st_sig, st_cx = strides(stride_names, out_strides)
        sig.update(st_sig)
        sig.update({k: "i32" for k in ("NH", "GROUP", "S_q", "S_k", "S_Q_KEY", "S_K_KEY", "WIN_L", "WIN_R")})
        cfg = kernel.early_config_prune(cfg, nargs, BLOCK_D=bd, BLOCK_D2=bd2)[0]  # the tuner's pruning
        cx = dict(st_cx, HEAD_D=128, BLOCK_D=bd, BLOCK_D2=bd2, CAUSAL=True, PREC=_prec(t, False),
                  F32_DOTS=_f32_dots(t, False), WINDOW=False, SOFTCAP=0, **cfg.kwargs)  # fmt: skip
        cx_names = ("HEAD_D", "BLOCK_D", "BLOCK_D2", "CAUSAL", "PREC", "F32_DOTS", "WINDOW", "SOFTCAP")
        cx_names += ("GQA", "RAW_M", "BLOCK_M", "BLOCK_N")
        cx["GQA"], cx["RAW_M"] = _ASM_GQA, dtype == "fp32"
        if kernel is _attn_bwd_dq:
            cx_names += ("DELTA_ONLY",)
            cx["DELTA_ONLY"] = False
        if kernel is _attn_fwd:
            cx_names += ("STATS",)
            cx["STATS"] = False
        sig.update({k: "constexpr" for k in cx_names})
        return (kernel.fn, sig, cx, {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})

    def pre():
        sig = {"O": ptr, "DO": ptr, "DELTA": "*fp32"}
        sig.update({k: "i32" for k in ("stride_oz", "stride_oh", "stride_os", "stride_doz", "stride_doh",
                                       "stride_dos", "NH", "S_q", "num_m")})  # fmt: skip
        sig.update(dict.fromkeys(("stride_dod", "HEAD_D", "BLOCK_D", "BLOCK_M"), "constexpr"))
        cx = {"stride_dod": 1, "HEAD_D": 128, "BLOCK_D": _block_d(128), "BLOCK_M": 64}
        return (_attn_bwd_pre, sig, cx, {"num_warps": 4})

    def ws(kernel, tile):
        names = kernel.arg_names
        ptrs = names[: names.index("qk_scale")]
        sig = {n: ("*fp32" if n in ("LSE", "DELTA") else ptr) for n in ptrs}
        cx = {"HEAD_D": 128, "BLOCK_M": tile["BLOCK_M"], "BLOCK_N": tile["BLOCK_N"], "CAUSAL": True}
        for n in names[len(ptrs) :]:
            sig[n] = "fp32" if n.endswith("scale") else "constexpr" if n in cx else "i32"
        return (kernel, sig, cx, {"num_warps": tile["num_warps"], "num_stages": tile["num_stages"]})

    fwd_ptrs = ("Q", "K", "V", "O", "LSE")
    fwd = spec(_attn_fwd, fwd_ptrs, ("qk_scale", "cap_in", "cap_out"), ("q", "k", "v"), ("o",), fwd_configs())
    if dtype != "fp32" and arch in ("sm_90", "sm_90a"):  # (S = 4096 >= WS_BWD_MIN_S)
        return [fwd, pre(), ws(_attn_bwd_dkdv_ws, _WS_BWD_DKDV), ws(_attn_bwd_dq_ws, _WS_BWD_DQ)]
    return [
        fwd,
        pre(),
        spec(
            _attn_bwd_dkdv,
            ("Q", "K", "V", "DO", "LSE", "DELTA", "DK", "DV"),
            ("qk_scale", "sm_scale", "cap_in", "cap_out"),
            ("q", "k", "v", "do"),
            ("dk", "dv"),
            bwd_dkdv_configs(),
        ),
        spec(
            _attn_bwd_dq,
            ("Q", "K", "V", "DO", "LSE", "DELTA", "DQ"),
            ("qk_scale", "sm_scale", "cap_in", "cap_out"),
            ("q", "k", "v", "do"),
            ("dq",),
            bwd_dq_configs(),
        ),
    ]


def _backward_into(saved, do, dq, dk, dv):
    """backward_from writing into the given dq, dk, dv (views of a fused qkv gradient)."""
    (q, k, v, o, lse), extra = saved  # extra: (causal, scale[, window_left, window_right, softcap])
    return backward_into(do, q, k, v, o, lse, extra[0], extra[1], dq, dk, dv, *extra[2:])


triton_attention.backward_into = _backward_into


register_triton(
    "attention",
    triton_attention,
    _kernel_specs,
    "Triton FlashAttention-2: fwd + (delta, dK/dV, dQ) bwd, exp2 online softmax, autotuned",
)
