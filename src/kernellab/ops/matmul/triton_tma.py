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

import math
from contextlib import nullcontext as _nullcontext

import torch
import triton
import triton.language as tl

from kernellab import triton_support
from kernellab.ops._register import register_builtin
from kernellab.ops.matmul._autograd import matmul_op
from kernellab.ops.matmul.triton import (
    _ACT,
    TUNE_MIN_WORK,
    _max_shared,
    _split_sum_kernel,
    _tune_keys,
    as_configs,
    check_batch_grid,
    epilogue,
    grouped_tile,
    pipeline_bytes,
    split_sum_block,
    triton_matmul_fwd,
)
from kernellab.triton_support import install_tma_allocator as _install_allocator
from kernellab.triton_support import torch_scratch_alloc as _torch_alloc  # noqa: F401 (tests)


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

    if A_T:
        a_desc = tl.make_tensor_descriptor(a_ptr + bz * M * K, [K, M], [M, 1], [BLOCK_K, BLOCK_M])
    else:
        a_desc = tl.make_tensor_descriptor(a_ptr + bz * M * K, [M, K], [K, 1], [BLOCK_M, BLOCK_K])
    if B_T:
        b_desc = tl.make_tensor_descriptor(b_ptr + bz * K * N, [N, K], [K, 1], [BLOCK_N, BLOCK_K])
    else:
        b_desc = tl.make_tensor_descriptor(b_ptr + bz * K * N, [K, N], [N, 1], [BLOCK_K, BLOCK_N])
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
    a_ptr,  # as _matmul_tma_kernel's, one product (no batch, no K slices)
    b_ptr,
    c_ptr,
    bias_ptr,
    M,
    N,
    K,
    HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr,
    A_T: tl.constexpr,
    B_T: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    # One program per SM walks the tiles pid, pid + programs, ...; the tile loop and its K
    # loop are flattened into one software pipeline, so the next tile's loads are in flight
    # while this tile's epilogue stores (a short K leaves nothing else to hide the store
    # behind: [4096, 128] @ [128, 14336] is a 117 MB write).
    if A_T:
        a_desc = tl.make_tensor_descriptor(a_ptr, [K, M], [M, 1], [BLOCK_K, BLOCK_M])
    else:
        a_desc = tl.make_tensor_descriptor(a_ptr, [M, K], [K, 1], [BLOCK_M, BLOCK_K])
    if B_T:
        b_desc = tl.make_tensor_descriptor(b_ptr, [N, K], [K, 1], [BLOCK_N, BLOCK_K])
    else:
        b_desc = tl.make_tensor_descriptor(b_ptr, [K, N], [N, 1], [BLOCK_K, BLOCK_N])
    c_desc = tl.make_tensor_descriptor(c_ptr, [M, N], [N, 1], [BLOCK_M, BLOCK_N])
    tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    k_blocks = tl.cdiv(K, BLOCK_K)
    for tile in tl.range(tl.program_id(0), tiles, tl.num_programs(0), flatten=True):
        pid_m, pid_n = grouped_tile(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kb in range(k_blocks):
            a, b = _tile_ab(a_desc, b_desc, off_m, off_n, kb * BLOCK_K, A_T, B_T)
            acc = tl.dot(a, b, acc)
        acc = epilogue(acc, bias_ptr, off_n + tl.arange(0, BLOCK_N), N, HAS_BIAS, ACT)
        c_desc.store([off_m, off_n], acc.to(c_ptr.dtype.element_ty))


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


def _fits_tma(cfg, m, n, k, elem, max_shared) -> bool:
    kw = cfg.kwargs
    bm, bn, bk = kw["BLOCK_M"], kw["BLOCK_N"], kw["BLOCK_K"]
    pipeline = pipeline_bytes(bm, bn, bk, elem, cfg.num_stages)
    staging = bm * bn * elem  # the C tile staged in shared memory for the TMA store
    if pipeline + staging > max_shared:
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


def _fixed_tma_config(device_index: int) -> dict:
    """Untuned config for small problems: 128x128x64, 3 stages, 8 warps (96 KB of pipeline +
    32 KB C staging); 64x64x64 with 2 stages where shared memory is smaller."""
    cfg = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_stages": 3, "num_warps": 8}
    if (128 + 128) * 64 * 2 * 3 + 128 * 128 * 2 > _max_shared(device_index):
        cfg = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8, "num_stages": 2, "num_warps": 4}
    return cfg


# The persistent kernel's launch where the 128x256 tiles of one product fill the SMs (the
# tile sweep's best at every such shape, lab/gpu_mm_tma_sweep.py; numbers in
# benchmarks/NOTES.md). Below a wave of tiles one program per tile is faster.
PERSISTENT_CONFIG = {
    "BLOCK_M": 128,
    "BLOCK_N": 256,
    "BLOCK_K": 64,
    "GROUP_M": 8,
    "num_stages": 3,
    "num_warps": 8,
}


def _persistent_applies(m: int, n: int, k: int, bt: int, dev: int) -> bool:
    c = PERSISTENT_CONFIG
    if bt != 1 or m * n * k < TUNE_MIN_WORK:
        return False
    smem = (
        pipeline_bytes(c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_K"], 2, c["num_stages"])
        + c["BLOCK_M"] * c["BLOCK_N"] * 2
    )
    tiles = triton_support.cdiv(m, c["BLOCK_M"]) * triton_support.cdiv(n, c["BLOCK_N"])
    return tiles >= triton_support.sm_count(dev) and smem <= _max_shared(dev)


def _aligned16(t: torch.Tensor) -> bool:
    """Whether t's base address is 16-byte aligned (TMA's rule). Traced under torch.compile
    (fake tensors have no address) it is judged by the storage offset: Inductor's buffers
    are aligned, and it copies a graph input that arrives misaligned where it compiled the
    graph for an aligned one."""
    if type(t) in triton_support._REAL_TENSORS:
        return t.data_ptr() % 16 == 0
    return t.storage_offset() * t.element_size() % 16 == 0


# Split-K: products with fewer output tiles than SMs (skinny M, or a short wide output) give
# each tile's K blocks to `split` programs that write fp32 partials; a second kernel adds
# them in slice order (deterministic). Each slice keeps at least TMA_MIN_SLICE_BLOCKS blocks
# of 64, and the partials at most TMA_SPLIT_MAX_BYTES. Tiles x slices stay within one wave:
# a second wave of slices costs more in partials than it gains in parallel reads (the
# sweep's finding at M = 1-128, benchmarks/NOTES.md).
TMA_SPLIT_MAX = 16
TMA_MIN_SLICE_BLOCKS = 4
TMA_SPLIT_MAX_BYTES = 64 << 20


def tma_split(m: int, n: int, k: int, bt: int, n_sm: int) -> int:
    """K slices for a [bt, m, k] @ [bt, k, n] product: the largest power of two that keeps
    the 128x128 tiles times the slices within one wave on n_sm SMs, within the caps above;
    1 when the tiles alone fill half the SMs or more."""
    tiles = triton_support.cdiv(m, 128) * triton_support.cdiv(n, 128) * bt
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


def tma_matmul_fwd(a: torch.Tensor, b: torch.Tensor, bias=None, activation=None, config=None) -> torch.Tensor:
    """act(a @ b + bias) through TMA descriptors. An operand that is the transpose of a
    contiguous tensor (a weight's ``.t()``, the backward's ``a^T`` and ``b^T``) is read in
    place; falls back to the pointer kernel when neither layout of an operand, or the
    output, can have a 16-byte row pitch. CPU tensors (tests; the backend is registered for
    CUDA only) run the same kernels under Triton's interpreter. ``config``: a dict of
    BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_stages, num_warps, split and persistent (one
    program per SM walking the tiles; one product, no split) to launch as given
    (benchmarks, tests)."""
    m, k = a.shape[-2], a.shape[-1]
    n = b.shape[-1]
    per16 = 16 // a.element_size()
    batch = tuple(a.shape[:-2])
    bt = math.prod(batch)
    ops = (_operand(a, bt, m, k, per16), _operand(b, bt, k, n, per16)) if n % per16 == 0 else (None,)
    if any(o is None for o in ops):
        return triton_matmul_fwd(a, b, bias, activation)
    (a3, a_t), (b3, b_t) = ops
    if not (_aligned16(a3) and _aligned16(b3)):  # a storage offset: realign with a copy
        a3, b3 = a3.clone(), b3.clone()
    c = torch.empty((bt, m, n), dtype=a.dtype, device=a.device)
    if bt and m and n:
        check_batch_grid(bt)  # the batch is the grid's y dimension
        _install_allocator()
        on_gpu = a.device.type == "cuda"
        dev = (a.device.index or 0) if on_gpu else 0
        n_sm = triton_support.sm_count(dev) if on_gpu else 4
        bias_arg = bias if bias is not None else c
        persistent = False
        if config is not None:
            config = dict(config)
            split = int(config.pop("split", 1))
            persistent = bool(config.pop("persistent", False)) and bt == 1 and split == 1
        elif on_gpu and _persistent_applies(m, n, k, bt, dev):
            config, split, persistent = dict(PERSISTENT_CONFIG), 1, True
        else:
            split = tma_split(m, n, k, bt, n_sm) if k else 1
        w = torch.empty((split, bt, m, n), dtype=torch.float32, device=a.device) if split > 1 else c

        def grid(meta):
            tiles = triton_support.cdiv(m, meta["BLOCK_M"]) * triton_support.cdiv(n, meta["BLOCK_N"])
            return (tiles, bt, split)

        args = (a3, b3, c, w, bias_arg, m, n, k, split, *_tune_keys(m, n, k))
        consts = dict(HAS_BIAS=bias is not None, ACT=_ACT[activation], A_T=a_t, B_T=b_t, PARTIAL=split > 1)
        with torch.cuda.device(a.device) if on_gpu else _nullcontext():
            # (inside triton_support.no_autotune(), as under `kernellab check`: the fixed config)
            if persistent:
                tiles = triton_support.cdiv(m, config["BLOCK_M"]) * triton_support.cdiv(n, config["BLOCK_N"])
                _matmul_tma_persistent_kernel[(min(tiles, n_sm),)](
                    a3, b3, c, bias_arg, m, n, k,
                    HAS_BIAS=bias is not None, ACT=_ACT[activation], A_T=a_t, B_T=b_t, **config,
                )  # fmt: skip
            elif config is not None:
                _matmul_tma_kernel[grid](*args, **consts, **config)
            elif on_gpu and bt * m * n * k >= TUNE_MIN_WORK and triton_support.autotune_allowed():
                _tma_tuned[grid](*args, **consts)
            else:
                fixed = _fixed_tma_config(dev) if on_gpu else _CPU_TMA_CONFIG
                _matmul_tma_kernel[grid](*args, **consts, **fixed)
            if split > 1:
                mn = bt * m * n
                block = split_sum_block(mn, n_sm, on_gpu)
                _split_sum_kernel[(triton_support.cdiv(mn, block),)](
                    w, c, bias_arg, mn, n,
                    HAS_BIAS=bias is not None, ACT=_ACT[activation], SPLIT_K=split, BLOCK=block, num_warps=4,
                )  # fmt: skip
    return c.reshape(batch + (m, n))


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
