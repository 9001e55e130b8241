"""Matmul in Triton with TMA tensor descriptors (Hopper+; Triton >= 3.4): backend ``triton_tma``.

Same tile loop as triton.py, but A, B and C move through ``tl.make_tensor_descriptor``: on
Hopper each tile load is one TMA instruction issued by one thread (the copy engine computes
the addresses and zero-fills past the edges) instead of 128 threads computing pointers and
masks, which frees registers and issue slots for wgmma; the C tile is written by a TMA store.

Contract: fp16/bf16, rows whose pitch is a multiple of 16 bytes (K and N multiples of 8) and
16-byte aligned bases; other inputs are packed (``.contiguous()``) or, when the pitch rule
cannot hold (K or N not a multiple of 8), handed to the pointer kernel of triton.py. Device-side
descriptors need a global scratch allocator (128 bytes per descriptor), set once with
``triton.set_allocator``.
"""

from __future__ import annotations

import functools
import math
from contextlib import nullcontext as _nullcontext
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from kernellab import triton_support
from kernellab.ops._register import register_builtin
from kernellab.ops.matmul._autograd import matmul_op
from kernellab.ops.matmul.triton import (
    _ACT,
    ONE_WAVE_FILL,
    TUNE_MIN_WORK,
    _Launch,
    _max_shared,
    _on_device,
    _plan,
    _planned,
    _split_sum_kernel,
    _tune_keys,
    as_configs,
    check_batch_grid,
    epilogue,
    grouped_tile,
    pipeline_bytes,
    plan_key,
    split_sum_block,
    triton_matmul_fwd,
)
from kernellab.triton_support import install_tma_allocator as _install_allocator
from kernellab.triton_support import torch_scratch_alloc as _torch_alloc  # noqa: F401 (tests)


@triton_support.jit
def _ab_descs(a_ptr, b_ptr, M, N, K, A_T: tl.constexpr, B_T: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    # TMA descriptors of one product's A [M, K] (A_T: stored [K, M]) and B [K, N] (B_T:
    # stored [N, K]), contiguous, in the block shapes _tile_ab loads.
    if A_T:
        a_desc = tl.make_tensor_descriptor(a_ptr, [K, M], [M, 1], [BLOCK_K, BLOCK_M])
    else:
        a_desc = tl.make_tensor_descriptor(a_ptr, [M, K], [K, 1], [BLOCK_M, BLOCK_K])
    if B_T:
        b_desc = tl.make_tensor_descriptor(b_ptr, [N, K], [K, 1], [BLOCK_N, BLOCK_K])
    else:
        b_desc = tl.make_tensor_descriptor(b_ptr, [K, N], [N, 1], [BLOCK_K, BLOCK_N])
    return a_desc, b_desc


@triton_support.jit
def _tile_ab(a_desc, b_desc, off_m, off_n, kk, A_T: tl.constexpr, B_T: tl.constexpr):
    # The A [BLOCK_M, BLOCK_K] and B [BLOCK_K, BLOCK_N] tiles at (off_m, kk) and (kk, off_n),
    # zero-filled past the edges; a transposed operand is loaded as stored and transposed
    # as a shared-memory view (wgmma reads either major order).
    if A_T:
        a = a_desc.load([kk, off_m]).T
    else:
        a = a_desc.load([off_m, kk])
    if B_T:
        b = b_desc.load([off_n, kk]).T
    else:
        b = b_desc.load([kk, off_n])
    return a, b


@triton_support.jit
def _matmul_tma_kernel(
    a_ptr,  # [Bt, M, K] contiguous; with A_T, [Bt, K, M] (a is that tensor's transposed view)
    b_ptr,  # [Bt, K, N] contiguous; with B_T, [Bt, N, K] (b = weight.t() of an nn.Linear)
    c_ptr,  # [Bt, M, N] contiguous
    w_ptr,  # PARTIAL: fp32 partials [split, Bt, M, N]; else unused
    bias_ptr,  # [N] or unused
    M,
    N,
    K,
    split,  # K slices (grid axis 2); 1 unless PARTIAL
    M_KEY,  # autotuner key only (size buckets); unused by the kernel
    N_KEY,
    K_KEY,
    HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr,
    A_T: tl.constexpr,
    B_T: tl.constexpr,
    PARTIAL: tl.constexpr,  # store fp32 partials of this K slice (split-K); the sum adds them
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    bz = tl.program_id(1).to(tl.int64)
    pid_k = tl.program_id(2)

    a_desc, b_desc = _ab_descs(
        a_ptr + bz * M * K, b_ptr + bz * K * N, M, N, K, A_T, B_T, BLOCK_M, BLOCK_N, BLOCK_K
    )
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N
    # This program's K blocks: slice pid_k of `split` near-equal runs (a slice past the end
    # has none and stores zeros, so the sum never reads an unwritten partial).
    k_blocks = tl.cdiv(K, BLOCK_K)
    per = tl.cdiv(k_blocks, split)
    k_first = pid_k * per
    k_last = tl.minimum(k_first + per, k_blocks)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(k_first, k_last):
        a, b = _tile_ab(a_desc, b_desc, off_m, off_n, kb * BLOCK_K, A_T, B_T)
        acc = tl.dot(a, b, acc)
    if PARTIAL:
        rm = off_m + tl.arange(0, BLOCK_M)
        rn = off_n + tl.arange(0, BLOCK_N)
        base = (pid_k.to(tl.int64) * tl.num_programs(1) + bz) * M * N
        mask = (rm[:, None] < M) & (rn[None, :] < N)
        tl.store(w_ptr + base + rm[:, None] * N + rn[None, :], acc, mask=mask)
    else:
        c_desc = tl.make_tensor_descriptor(c_ptr + bz * M * N, [M, N], [N, 1], [BLOCK_M, BLOCK_N])
        acc = epilogue(acc, bias_ptr, off_n + tl.arange(0, BLOCK_N), N, HAS_BIAS, ACT)
        c_desc.store([off_m, off_n], acc.to(c_ptr.dtype.element_ty))  # clipped at the edges


@triton_support.jit
def _matmul_tma_persistent_kernel(
    a_ptr,  # as _matmul_tma_kernel's, one product (no batch)
    b_ptr,
    c_ptr,
    w_ptr,  # fp32 partial tiles [tail tiles * tail_split, BLOCK_M, BLOCK_N]; unused with no tail
    bias_ptr,
    M,
    N,
    K,
    dp_tiles,  # tiles 0 .. dp_tiles-1 are made whole; the rest are the tail
    tail_split,  # K slices per tail tile (the tail is empty when dp_tiles is every tile)
    HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr,
    A_T: tl.constexpr,
    B_T: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    # One program per SM walks the whole tiles pid, pid + programs, ...; the tile loop and
    # its K loop are flattened into one software pipeline, so the next tile's loads are in
    # flight while this tile's epilogue stores (a short K leaves nothing else to hide the
    # store behind: [4096, 128] @ [128, 14336] is a 117 MB write).
    # The tiles past the last full wave would leave most SMs idle for a whole tile's time;
    # they are cut into tail_split K slices instead (units u = tail tile * tail_split +
    # slice, dealt out the same way), each slice's fp32 sum stored as a dense tile, and
    # _tail_sum_kernel adds a tile's slices in order (deterministic).
    a_desc, b_desc = _ab_descs(a_ptr, b_ptr, M, N, K, A_T, B_T, BLOCK_M, BLOCK_N, BLOCK_K)
    c_desc = tl.make_tensor_descriptor(c_ptr, [M, N], [N, 1], [BLOCK_M, BLOCK_N])
    tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    k_blocks = tl.cdiv(K, BLOCK_K)
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    for tile in tl.range(pid, dp_tiles, programs, flatten=True):
        pid_m, pid_n = grouped_tile(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kb in range(k_blocks):
            a, b = _tile_ab(a_desc, b_desc, off_m, off_n, kb * BLOCK_K, A_T, B_T)
            acc = tl.dot(a, b, acc)
        acc = epilogue(acc, bias_ptr, off_n + tl.arange(0, BLOCK_N), N, HAS_BIAS, ACT)
        c_desc.store([off_m, off_n], acc.to(c_ptr.dtype.element_ty))
    per = tl.cdiv(k_blocks, tail_split)
    tile_elems = BLOCK_M * BLOCK_N
    offs = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    for u in range(pid, (tiles - dp_tiles) * tail_split, programs):
        pid_m, pid_n = grouped_tile(dp_tiles + u // tail_split, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        k_first = (u % tail_split) * per
        k_last = tl.minimum(k_first + per, k_blocks)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kb in range(k_first, k_last):
            a, b = _tile_ab(a_desc, b_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, kb * BLOCK_K, A_T, B_T)
            acc = tl.dot(a, b, acc)
        tl.store(w_ptr + u * tile_elems + offs, acc)  # the launcher keeps w under 2^31 elements


@triton_support.jit
def _tail_sum_kernel(
    w_ptr,  # the persistent kernel's partial tiles
    c_ptr,  # [M, N] contiguous
    bias_ptr,
    M,
    N,
    dp_tiles,
    tail_split,
    HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    GROUP_M: tl.constexpr,
    SUB_M: tl.constexpr,  # rows of the tile per program (grid axis 1: BLOCK_M // SUB_M)
):
    # Tail tile t's SUB_M-row band: its slices added in slice order, the epilogue, one store.
    t = tl.program_id(0)
    pid_m, pid_n = grouped_tile(dp_tiles + t, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    r = tl.program_id(1) * SUB_M + tl.arange(0, SUB_M)
    cols = tl.arange(0, BLOCK_N)
    offs = r[:, None] * BLOCK_N + cols[None, :]
    base = w_ptr + t.to(tl.int64) * tail_split * (BLOCK_M * BLOCK_N)
    acc = tl.load(base + offs)
    for s in range(1, tail_split):
        acc += tl.load(base + s * (BLOCK_M * BLOCK_N) + offs)
    rm = pid_m * BLOCK_M + r
    rn = pid_n * BLOCK_N + cols
    acc = epilogue(acc, bias_ptr, rn, N, HAS_BIAS, ACT)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    tl.store(c_ptr + rm[:, None].to(tl.int64) * N + rn[None, :], acc.to(c_ptr.dtype.element_ty), mask=mask)


def tma_configs() -> list:
    """Large Hopper tiles first (128x256x64 with 8 warps: two consumer warpgroups)."""
    rows = [
        (128, 256, 64, 8, 3, 8),
        (256, 128, 64, 8, 3, 8),
        (128, 256, 64, 8, 4, 8),
        (128, 128, 64, 8, 4, 8),
        (128, 128, 64, 8, 4, 4),
        (128, 128, 64, 8, 3, 4),
        (128, 128, 64, 8, 5, 4),
        (64, 128, 64, 8, 4, 4),
        (64, 128, 128, 8, 4, 4),
        (64, 64, 128, 8, 5, 4),
        (64, 256, 64, 8, 3, 4),
        (128, 64, 64, 8, 4, 4),
        (64, 64, 64, 8, 4, 4),
    ]
    return as_configs(rows)


def tma_shared_bytes(bm: int, bn: int, bk: int, elem: int, stages: int) -> int:
    """Shared memory of the TMA kernels: the pipeline, and the C tile staged for the TMA store."""
    return pipeline_bytes(bm, bn, bk, elem, stages) + bm * bn * elem


def _fits_tma(cfg, m, n, k, elem, max_shared) -> bool:
    kw = cfg.kwargs
    bm, bn, bk = kw["BLOCK_M"], kw["BLOCK_N"], kw["BLOCK_K"]
    if tma_shared_bytes(bm, bn, bk, elem, cfg.num_stages) > max_shared:
        return False

    def cap(d):
        return max(64, triton_support.next_pow2(max(d, 1)))

    return bm <= cap(m) and bn <= cap(n) and bk <= cap(k)


def prune_tma_configs(configs, named_args, **kwargs):
    """Drop configs that do not fit shared memory or are much larger than the problem."""
    a = named_args["a_ptr"]
    m, n, k = named_args["M"], named_args["N"], named_args["K"]
    limit = _max_shared(a.device.index or 0) if a.is_cuda else 232448
    kept = [c for c in configs if _fits_tma(c, m, n, k, a.element_size(), limit)]
    return kept or [configs[-1]]


# Tuned only at bt*M*N*K >= TUNE_MIN_WORK, once per (size bucket, dtype): see triton.py.
_tma_tuned = triton.autotune(
    configs=tma_configs(),
    key=["M_KEY", "N_KEY", "K_KEY", "A_T", "B_T", "split"],
    prune_configs_by={"early_config_prune": prune_tma_configs},
)(_matmul_tma_kernel)


# Untuned config for products below TUNE_MIN_WORK: 64x64 tiles stepping 128 along K,
# 4 stages, 4 warps (128 KB of pipeline + 8 KB C staging), as the pointer kernel's
# ``small_config`` (benchmarks/NOTES.md, "Small matmuls"); 64x64x64 with 2 stages where
# shared memory is smaller.
SMALL_TMA = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 128, "GROUP_M": 8, "num_stages": 4, "num_warps": 4}


def _fixed_tma_config(device_index: int) -> dict:
    """``SMALL_TMA``, or its fallback where shared memory is smaller."""
    cfg = dict(SMALL_TMA)
    smem = tma_shared_bytes(cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"], 2, cfg["num_stages"])
    if smem > _max_shared(device_index):
        cfg = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8, "num_stages": 2, "num_warps": 4}
    return cfg


# The persistent kernel's two tiles, each with the config the tile sweep found best for it
# (lab/gpu_mm_tma_sweep.py; numbers in benchmarks/NOTES.md) and its throughput relative to
# 128x256's where both fill whole waves (50432x3072x768: 0.95).
PERSISTENT_TILES = (
    ({"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_stages": 3, "num_warps": 8}, 1.0),
    ({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_stages": 5, "num_warps": 4}, 0.95),
)
# The plan's cost model: one SM's bf16 rate in a 128x256 tile (~660 TFLOP/s over 132 SMs),
# the rate at which the tail's fp32 partials are written and read back, and the sum
# kernel's launch. Only the ranking of plans uses it.
SM_FLOPS = 5.0e12
PARTIAL_BYTES_PER_S = 3.0e12
TAIL_SUM_S = 2e-6
TAIL_MIN_BLOCKS = 2  # a tail slice keeps at least two K blocks


class PersistentPlan(NamedTuple):
    """A persistent launch of one product: tiles below dp_tiles are made whole by one
    program per SM, the rest each in tail_split K slices; est_s is the model's time."""

    config: dict
    dp_tiles: int
    tail_split: int
    programs: int
    est_s: float


def _tile_count(m: int, n: int, cfg: dict) -> int:
    """Output tiles of an [m, n] product in cfg's BLOCK_M x BLOCK_N tiles."""
    return triton_support.cdiv(m, cfg["BLOCK_M"]) * triton_support.cdiv(n, cfg["BLOCK_N"])


def plan_persistent(m: int, n: int, k: int, n_sm: int, max_shared: int, elem: int = 2, tiles=None):
    """The cheapest persistent launch of one [m, k] @ [k, n] product on n_sm SMs by the cost
    model above, over both tiles and every tail split (1: the last wave runs whole tiles);
    None when no tile fits shared memory. The time of a program is its whole tiles plus its
    share of tail slices; a split adds the partials' traffic and the sum's launch."""
    best = None
    for cfg, eff in tiles or PERSISTENT_TILES:
        bm, bn, bk = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
        if tma_shared_bytes(bm, bn, bk, elem, cfg["num_stages"]) > max_shared:
            continue
        count = _tile_count(m, n, cfg)
        kb = max(1, triton_support.cdiv(k, bk))
        block_s = 2 * bm * bn * bk / (SM_FLOPS * eff)  # one K block of one tile
        waves, tail = divmod(count, n_sm)
        most = min(n_sm // tail, kb // TAIL_MIN_BLOCKS) if tail else 1
        for split in range(1, max(1, most) + 1):
            if split == 1:
                est = triton_support.cdiv(count, n_sm) * kb * block_s
                plan = PersistentPlan(cfg, count, 1, min(count, n_sm), est)
            else:
                units = tail * split
                rounds = triton_support.cdiv(units, n_sm)
                est = (waves * kb + rounds * triton_support.cdiv(kb, split)) * block_s
                est += 2 * units * bm * bn * 4 / PARTIAL_BYTES_PER_S + TAIL_SUM_S
                plan = PersistentPlan(cfg, waves * n_sm, split, n_sm, est)
            if best is None or plan.est_s < best.est_s:
                best = plan
    return best


@functools.lru_cache(maxsize=4096)  # the plan costs 5-10 us of host time; a model repeats its shapes
def _persistent_plan(m: int, n: int, k: int, bt: int, dev: int, pitches128: bool = True):
    """The launcher's persistent plan: one product of >= 2^30 multiply-adds, at least 256 rows
    and 128 columns, K > 0 (skinny and batched products keep the split-K tile kernel).
    ``pitches128``: every operand's row pitch is a multiple of 128 bytes. Where one is not
    and the 128x256 tiles are under a wave, the autotuned tile kernel is kept: fp16
    1000x3000x5000 (rows of 10000 and 6000 bytes) ran 0.56x cuBLAS planned, 0.74x tuned."""
    if bt != 1 or m < 256 or n < 128 or k == 0 or m * n * k < TUNE_MIN_WORK:
        return None
    n_sm = triton_support.sm_count(dev)
    if not pitches128 and triton_support.cdiv(m, 128) * triton_support.cdiv(n, 256) < n_sm:
        return None
    return plan_persistent(m, n, k, n_sm, _max_shared(dev))


def _aligned16(t: torch.Tensor) -> bool:
    """Whether t's base address is 16-byte aligned (TMA's rule). Traced under torch.compile
    (fake tensors have no address) it is judged by the storage offset: Inductor's buffers
    are aligned, and it copies a graph input that arrives misaligned where it compiled the
    graph for an aligned one."""
    if type(t) in triton_support._REAL_TENSORS:
        return t.data_ptr() % 16 == 0
    return t.storage_offset() * t.element_size() % 16 == 0


# Split-K: products the persistent plan does not take (skinny M, batches, small work) with
# fewer output tiles than SMs give each tile's K blocks to `split` programs that write fp32
# partials; a second kernel adds them in slice order (deterministic). Each slice keeps at
# least TMA_MIN_SLICE_BLOCKS blocks of 64, and the partials at most TMA_SPLIT_MAX_BYTES.
# Tiles x slices stay within one wave: a second wave of slices costs more in partials than
# it gains in parallel reads (the sweep's finding at M = 1-128, benchmarks/NOTES.md).
TMA_SPLIT_MAX = 16
TMA_MIN_SLICE_BLOCKS = 4
TMA_SPLIT_MAX_BYTES = 64 << 20


def tma_split(m: int, n: int, k: int, bt: int, n_sm: int, block_m: int = 128, block_n: int = 128) -> int:
    """K slices for a [bt, m, k] @ [bt, k, n] product: the largest power of two that keeps
    the block_m x block_n tiles times the slices within one wave on n_sm SMs, within the
    caps above; 1 when the tiles alone fill half the SMs or more."""
    tiles = triton_support.cdiv(m, block_m) * triton_support.cdiv(n, block_n) * bt
    split = 1
    cap = min(TMA_SPLIT_MAX, max(1, triton_support.cdiv(k, 64) // TMA_MIN_SLICE_BLOCKS))
    partial_bytes = bt * m * n * 4
    while tiles * split * 2 <= n_sm and split * 2 <= cap and 2 * split * partial_bytes <= TMA_SPLIT_MAX_BYTES:
        split *= 2
    return split


def _operand(t: torch.Tensor, bt: int, rows: int, cols: int, per16: int):
    """(t as a [bt, rows, cols] or transposed [bt, cols, rows] contiguous tensor, transposed?),
    without a copy where t already is one of those with a 16-byte row pitch; None when
    neither pitch is a multiple of 16 bytes."""
    if cols % per16 == 0:
        t3 = t.reshape(bt, rows, cols)
        if t3.is_contiguous():
            return t3, False
    if rows % per16 == 0 and rows > 1:
        tt = t.transpose(-1, -2)
        if tt.is_contiguous():
            return tt.reshape(bt, cols, rows), True
    if cols % per16 == 0:
        return t.reshape(bt, rows, cols).contiguous(), False
    if rows % per16 == 0:
        return t.transpose(-1, -2).reshape(bt, cols, rows).contiguous(), True
    return None


# A product the plan would cut wholly into K slices whose 64 x 128 tiles alone fill most of
# one wave (256 x 4096 x 4096: 128 tiles on 132 SMs) runs them unsplit with a deep pipeline
# instead: no fp32 partials, no second launch (lab/gpu_mm_tma_sweep.py, benchmarks/NOTES.md).
ONE_WAVE_TMA = {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_M": 8, "num_stages": 4, "num_warps": 4}


def _one_wave_fits(m: int, n: int, n_sm: int, max_shared: int) -> bool:
    """Whether ONE_WAVE_TMA's tiles of an [m, n] output number ONE_WAVE_FILL (the skinny
    kernel's) to one wave of n_sm SMs, and its shared memory fits max_shared."""
    cfg = ONE_WAVE_TMA
    smem = tma_shared_bytes(cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"], 2, cfg["num_stages"])
    return ONE_WAVE_FILL * n_sm <= _tile_count(m, n, cfg) <= n_sm and smem <= max_shared


def _choose(m, n, k, bt, dev, on_gpu, n_sm, pitches128, config):
    """The launch of one call: (persistent plan or None, tile config or None, K slices,
    tuned?). ``config``: a caller's config (see ``tma_matmul_fwd``), or None."""
    if config is not None:
        config = dict(config)
        split = int(config.pop("split", 1))
        tail_split = int(config.pop("tail_split", 1))
        if config.pop("persistent", False) and bt == 1 and split == 1:
            return _given_plan(config, m, n, tail_split, n_sm), None, 1, False
        return None, config, split, False
    plan = _persistent_plan(m, n, k, bt, dev, pitches128) if on_gpu else None
    if plan is not None and plan.dp_tiles == 0 and _one_wave_fits(m, n, n_sm, _max_shared(dev)):
        return None, dict(ONE_WAVE_TMA), 1, False
    if plan is not None and plan.dp_tiles == 0:
        # every tile in K slices: the tile kernel's split launch is the faster form there
        # (768x768x8192 in 3 slices: 0.97x cuBLAS, the persistent tail 0.82x)
        return None, dict(plan.config), plan.tail_split, False
    if plan is not None:
        return plan, None, 1, False
    if on_gpu and bt * m * n * k >= TUNE_MIN_WORK and triton_support.autotune_allowed():
        return None, None, tma_split(m, n, k, bt, n_sm) if k else 1, True
    split = tma_split(m, n, k, bt, n_sm, SMALL_TMA["BLOCK_M"], SMALL_TMA["BLOCK_N"]) if k else 1
    return None, _fixed_tma_config(dev) if on_gpu else dict(_CPU_TMA_CONFIG), split, False


def _layout(a, b):
    """(m, n, k, batch, bt, (a3, a_t), (b3, b_t)) of a call, or None where an operand or the
    output can have no 16-byte row pitch (the pointer kernel's case)."""
    m, k = a.shape[-2], a.shape[-1]
    n = b.shape[-1]
    per16 = 16 // a.element_size()
    batch = tuple(a.shape[:-2])
    bt = math.prod(batch)
    if n % per16:
        return None
    oa, ob = _operand(a, bt, m, k, per16), _operand(b, bt, k, n, per16)
    if oa is None or ob is None:
        return None
    return m, n, k, batch, bt, oa, ob


def tma_matmul_fwd(
    a: torch.Tensor, b: torch.Tensor, bias=None, activation=None, config=None, *, plan=None
) -> torch.Tensor:
    """act(a @ b + bias) through TMA descriptors. An operand that is the transpose of a
    contiguous tensor (a weight's ``.t()``, the backward's ``a^T`` and ``b^T``) is read in
    place; falls back to the pointer kernel when neither layout of an operand, or the
    output, can have a 16-byte row pitch. CPU tensors (tests; the backend is registered for
    CUDA only) run the same kernels under Triton's interpreter. ``config``: a dict of
    BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_stages, num_warps, split, persistent (one
    program per SM walking the tiles; one product, no split) and tail_split (with
    persistent: the tiles past the last full wave in that many K slices) to launch as given
    (benchmarks, tests); without one, a large product takes ``plan_persistent``'s launch.
    ``plan``: as ``triton_matmul_fwd``'s (a call shape's launches derived once and kept:
    the derivation costs tens of microseconds of host time a call)."""
    if config is None and _planned(a, plan):
        if _on_device(a):  # launch in the tensors' device context
            with torch.cuda.device(a.device.index):
                return tma_matmul_fwd(a, b, bias, activation, plan=plan)
        key = plan_key("tma", a, b, bias, activation, (triton_support.autotune_allowed(),))
        p = _plan(key, lambda: _kept_plan(a, b, bias is not None, activation))
        if p and not (a.data_ptr() | b.data_ptr()) & 15:  # else the copy below realigns them
            return p(a, b, bias)
    lay = _layout(a, b)
    if lay is None:
        return triton_matmul_fwd(a, b, bias, activation)
    m, n, k, batch, bt, (a3, _), (b3, _) = lay
    if not (_aligned16(a3) and _aligned16(b3)):  # a storage offset: realign with a copy
        a3, b3 = a3.clone(), b3.clone()
    if not (bt and m and n):
        return torch.empty(batch + (m, n), dtype=a.dtype, device=a.device)
    p = _launches(lay, a.dtype, a.device, bias is not None, activation, config, bind=False)
    with torch.cuda.device(a.device) if a.device.type == "cuda" else _nullcontext():
        return p(a3, b3, bias)


def _kept_plan(a, b, has_bias: bool, activation):
    """The kept launches of a call shape, or False where each call takes the general path
    (an operand copied to reach a 16-byte pitch, the pointer kernel's shapes, no output)."""
    lay = _layout(a, b)
    if lay is None:
        return False
    m, n, k, batch, bt, (a3, _), (b3, _) = lay
    if a3.data_ptr() != a.data_ptr() or b3.data_ptr() != b.data_ptr() or not (bt and m and n):
        return False
    return _launches(lay, a.dtype, a.device, has_bias, activation, None, bind=True)


class _TmaPlan:
    """``tma_matmul_fwd``'s launches derived for one call shape (``_launches``): a and b
    go to the kernels as given (the operands read in place, or their aligned copies), c
    and the fp32 partials are allocated per call."""

    __slots__ = ("shape", "out_shape", "dtype", "device", "w_shape", "ints", "main", "second", "ints2")

    def __init__(self, shape, out_shape, dtype, device, w_shape, ints, main, second, ints2):
        self.shape, self.out_shape, self.dtype, self.device = shape, out_shape, dtype, device
        self.w_shape, self.ints, self.main, self.second, self.ints2 = w_shape, ints, main, second, ints2

    def __call__(self, a, b, bias):
        c = torch.empty(self.shape, dtype=self.dtype, device=self.device)
        w = c if self.w_shape is None else torch.empty(self.w_shape, dtype=torch.float32, device=self.device)
        bias_arg = bias if bias is not None else c
        _install_allocator()
        self.main(a, b, c, w, bias_arg, *self.ints)
        if self.second is not None:
            self.second(w, c, bias_arg, *self.ints2)
        return c if self.out_shape is None else c.view(self.out_shape)


def _launches(lay, dtype, device, has_bias: bool, activation, config, bind: bool) -> _TmaPlan:
    """The launches of a call shape (``_layout``'s ``lay``, a caller's ``config`` or None),
    bound (``bind``: Bound launchers, kept in a plan) or plain (``kernel[grid]``: each call of
    the general path, traced calls included)."""
    m, n, k, batch, bt, (a3, a_t), (b3, b_t) = lay
    check_batch_grid(bt)  # the batch is the grid's y dimension
    on_gpu = device.type == "cuda"
    dev = (device.index or 0) if on_gpu else 0
    n_sm = triton_support.sm_count(dev) if on_gpu else 4
    pitches128 = all(p * a3.element_size() % 128 == 0 for p in (a3.shape[-1], b3.shape[-1], n))
    plan, config, split, tuned = _choose(m, n, k, bt, dev, on_gpu, n_sm, pitches128, config)
    act = _ACT[activation]

    def launch(kernel, grid, kw, tuned, check):
        made = _Launch(kernel, grid, kw, tuned, check)
        return made.bind() if bind else made

    out_shape = None if batch == (bt,) else batch + (m, n)
    check = (0, 1, 4)  # a, b, bias: the caller's (c and the partials are fresh)
    second, ints2, w_shape = None, (), None
    if plan is not None:
        cfg = plan.config
        bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
        kw = dict(HAS_BIAS=has_bias, ACT=act, A_T=a_t, B_T=b_t, **cfg)
        main = launch(_matmul_tma_persistent_kernel, (plan.programs,), kw, False, check)
        ints = (m, n, k, plan.dp_tiles, plan.tail_split)
        tail = _tile_count(m, n, cfg) - plan.dp_tiles
        if tail:
            if tail * plan.tail_split * bm * bn >= 2**31:
                raise ValueError(f"matmul: tail_split={plan.tail_split} makes more fp32 partials than 2^31")
            sub = min(bm, 32 if on_gpu else bm)
            kw2 = dict(HAS_BIAS=has_bias, ACT=act, BLOCK_M=bm, BLOCK_N=bn, GROUP_M=cfg["GROUP_M"], SUB_M=sub)
            second = launch(_tail_sum_kernel, (tail, bm // sub), dict(kw2, num_warps=4), False, (2,))
            ints2 = (m, n, plan.dp_tiles, plan.tail_split)
            w_shape = (tail * plan.tail_split, bm, bn)
    else:
        consts = dict(HAS_BIAS=has_bias, ACT=act, A_T=a_t, B_T=b_t, PARTIAL=split > 1)
        ints = (m, n, k, split, *_tune_keys(m, n, k))
        if tuned:
            main = launch(_tma_tuned, lambda meta: (_tile_count(m, n, meta), bt, split), consts, True, check)
        else:
            kw = dict(consts, **config)
            main = launch(_matmul_tma_kernel, (_tile_count(m, n, kw), bt, split), kw, False, check)
        if split > 1:
            mn = bt * m * n
            block = split_sum_block(mn, n_sm, on_gpu)
            kw2 = dict(HAS_BIAS=has_bias, ACT=act, SPLIT_K=split, BLOCK=block, num_warps=4)
            second = launch(_split_sum_kernel, (triton_support.cdiv(mn, block),), kw2, False, (2,))
            ints2 = (mn, n)
            w_shape = (split, bt, m, n)
    return _TmaPlan((bt, m, n), out_shape, dtype, device, w_shape, ints, main, second, ints2)


def _given_plan(config: dict, m: int, n: int, tail_split: int, n_sm: int) -> PersistentPlan:
    tiles = _tile_count(m, n, config)
    if tail_split > 1 and tiles % n_sm:
        return PersistentPlan(config, tiles // n_sm * n_sm, tail_split, n_sm, float("nan"))
    return PersistentPlan(config, tiles, 1, min(tiles, n_sm), float("nan"))


# The CPU interpreter (tests): small tiles, one stage.
_CPU_TMA_CONFIG = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2, "num_stages": 1, "num_warps": 4}


matmul_triton_tma = matmul_op("matmul_triton_tma", tma_matmul_fwd, triton=True)


def _kernel_specs(dtype: str):
    """For `kernellab asm`: 128x256x64, 8 warps (what the tuner usually picks at 4096^3)."""
    cx = {"HAS_BIAS": False, "ACT": 0, "A_T": False, "B_T": False, "PARTIAL": False,
          "BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8}  # fmt: skip
    sig = {"a_ptr": f"*{dtype}", "b_ptr": f"*{dtype}", "c_ptr": f"*{dtype}", "w_ptr": "*fp32"}
    sig["bias_ptr"] = f"*{dtype}"
    sig.update({p: "i32" for p in ("M", "N", "K", "split", "M_KEY", "N_KEY", "K_KEY")})
    sig.update({p: "constexpr" for p in cx})
    return [(_matmul_tma_kernel, sig, cx, 8)]


def _unavailable():
    why = triton_support.unavailable()
    if why:
        return why
    if not hasattr(tl, "make_tensor_descriptor") or not hasattr(triton, "set_allocator"):
        return f"Triton {triton.__version__} has no tl.make_tensor_descriptor (needs >= 3.4)"
    return None


register_builtin(
    "matmul",
    "triton_tma",
    matmul_triton_tma,
    "Triton with TMA tensor descriptors (Hopper), autotuned, fused epilogue",
    triton_kernels=_kernel_specs,
    devices=("cuda",),
    available=_unavailable,
    dtypes=(torch.float16, torch.bfloat16),
    double_backward=True,  # _autograd.matmul_op: the backward's matmuls are the custom op
)
