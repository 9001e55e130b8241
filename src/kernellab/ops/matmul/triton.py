"""Matmul in Triton: autotuned kernel, launcher, custom op, registration.

One program computes a BLOCK_M x BLOCK_N tile of C, walking K in BLOCK_K steps with
``tl.dot`` (tensor cores: wgmma on Hopper, mma.sync on Ampere) and an fp32 accumulator;
bias and activation are applied to the accumulator before the single store (the fused
epilogue saves a read and a write of C: 2 x 4096^2 x 2 bytes = 64 MB at 4096^2 bf16).

Program order (GROUP_M): programs are numbered down columns of GROUP_M tile-rows, so the
programs resident at one time share GROUP_M rows of A and a few columns of B in L2 instead
of sweeping a whole row of C (which touches all of B). Triton tutorial 03 measures ~10%.

Any M, N, K: rows and columns past the edge are wrapped (``% M``) for the loads, so the inner
loop masks only K; the store is masked. Any strides (transposed, sliced, expanded operands
go straight in; no copy, but for fp32 FMA dots with b K-inner: FMA_COPY_MIN_M); batch over
program_id(1). A product of few tiles over a long K
(``general_split``: a small layer's weight gradient, [768, 768] over 8192 rows) runs its
tiles x K slices over program_id(2), the fp32 partials added in slice order by
``_split_sum_kernel`` with the bias and activation.

fp32: the dots follow ``torch.backends.cuda.matmul.allow_tf32``: on, TF32 tensor cores with
the operands rounded to nearest first ("tf32rn", as cuBLAS rounds them); off, exact fp32 FMA
products ("ieee", as cuBLAS with TF32 off), each K block summed apart and then added
(``_triton_dots.two_level``). fp16/bf16 always use tensor cores with fp32 accumulation.

Skinny products (``triton_skinny_fwd``: one product, M <= 128, N K >= 2^20, on a GPU) are
bound by reading the weight b once, not by the MMAs: [1, 4096] @ [4096, 14336] bf16 reads
117 MB for 0.1 GFLOP. One BLOCK_M tile (M rounded up to a power of two in [16, 128], so
``tl.dot`` serves M = 1 too) holds every row, and the programs go over N tiles x K slices
(split-K) so that ~2 waves of programs stream b on every SM. Slices write fp32 partials
[SPLIT_K, M, N] and a second kernel adds them in slice order (deterministic, no atomics)
with the bias and activation; one slice applies the epilogue in place. b's tile is read
along whichever of K or N has unit stride (Triton specializes a stride of 1), so
b = weight.t() (the forward of a linear) and a contiguous b (its backward's dz @ W) both
load 16 bytes per access. ``skinny_config`` picks tiles and slices from the shape and the
SM count; weights of 32 MB and up are autotuned among a dozen configs around it (tiles,
warps, stages; the slices stay the heuristic's), keyed on M's bucket and the exact N, K.
"""

from __future__ import annotations

import contextvars
import functools
import math

import torch
import triton
import triton.language as tl

from kernellab import device as _device
from kernellab import triton_support
from kernellab.core.spec import GRID_YZ_LIMIT
from kernellab.ops._register import register_builtin
from kernellab.ops._triton_dots import dot_precision, mma, mma_x3_split, tf32_round
from kernellab.ops.matmul._autograd import matmul_op
from kernellab.options import config as _options

_ACT = {None: 0, "relu": 1, "gelu": 2}


@triton_support.jit
def grouped_tile(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    # Program pid's tile (pid_m, pid_n), numbered down columns of GROUP_M tile-rows (see
    # the module docstring).
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = min(num_m - first_m, GROUP_M)
    pid_m = first_m + ((pid % per_group) % group_rows)
    pid_n = (pid % per_group) // group_rows
    return pid_m, pid_n


@triton_support.jit
def epilogue(acc, bias_ptr, rn, N, HAS_BIAS: tl.constexpr, ACT: tl.constexpr):
    # bias [N] at columns rn, then the activation (0 none, 1 relu, 2 gelu tanh), on the
    # fp32 accumulator before its one store.
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    if ACT == 1:  # NaN passes, as torch.relu's (tl.maximum(NaN, 0) is 0)
        acc = tl.where(acc <= 0.0, 0.0, acc)
    elif ACT == 2:
        # tanh(u) = 1 - 2 / (1 + exp(2u)): exact limits +-1 when exp over/underflows.
        u = 0.7978845608028654 * (acc + 0.044715 * acc * acc * acc)
        acc = 0.5 * acc * (2.0 - 2.0 / (1.0 + tl.exp(2.0 * u)))
    return acc


@triton_support.jit
def k_block(a_ptrs, b_ptrs, acc, k_left, rk, A_LO, B_LO,
            PRECISION: tl.constexpr, UPCAST: tl.constexpr, MASKED: tl.constexpr):  # fmt: skip
    # acc + the product of one K block's tiles; MASKED: only its first k_left of rk are in K.
    # "x3s": a and b are split ahead (``_tf32_split_kernel``), their rests A_LO and B_LO
    # elements past the heads.
    if MASKED:
        a = tl.load(a_ptrs, mask=rk[None, :] < k_left, other=0.0)
        b = tl.load(b_ptrs, mask=rk[:, None] < k_left, other=0.0)
    else:
        a = tl.load(a_ptrs)
        b = tl.load(b_ptrs)
    if PRECISION == "x3s":
        if MASKED:
            a_lo = tl.load(a_ptrs + A_LO, mask=rk[None, :] < k_left, other=0.0)
            b_lo = tl.load(b_ptrs + B_LO, mask=rk[:, None] < k_left, other=0.0)
        else:
            a_lo = tl.load(a_ptrs + A_LO)
            b_lo = tl.load(b_ptrs + B_LO)
        acc = mma_x3_split(a, a_lo, b, b_lo, acc)
    else:
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = mma(a, b, acc, PRECISION)
    return acc


@triton_support.jit
def _tf32_split_kernel(
    x_ptr, out_ptr,  # x [Bt, R, C] (any strides); out: heads, then the rests LO elements on
    R, C, RP, CP,  # x's rows and columns; out's (RP >= R, CP >= C: zeros past x's)
    s_xb, s_xr, s_xc, s_ob, s_or, s_oc, LO,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):
    # x split into a TF32 head and a TF32 rest (``dot_x3``'s split), written at out's
    # strides: the "x3s" matmul's operands, padded and laid out as its tiles load them
    pid = tl.program_id(0)
    bz = tl.program_id(1).to(tl.int64)
    n_c = tl.cdiv(CP, BLOCK_C)
    r = (pid // n_c) * BLOCK_R + tl.arange(0, BLOCK_R)
    c = (pid % n_c) * BLOCK_C + tl.arange(0, BLOCK_C)
    x = tl.load(x_ptr + bz * s_xb + r[:, None] * s_xr + c[None, :] * s_xc,
                mask=(r[:, None] < R) & (c[None, :] < C), other=0.0)  # fmt: skip
    hi = tf32_round(x)
    lo = tf32_round(x - hi)
    o = out_ptr + bz * s_ob + r[:, None] * s_or + c[None, :] * s_oc
    ok = (r[:, None] < RP) & (c[None, :] < CP)
    tl.store(o, hi, mask=ok)
    tl.store(o + LO, lo, mask=ok)


@triton_support.jit
def _matmul_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    bias_ptr,  # a [Bt, M, K], b [Bt, K, N], c [Bt, M, N] (any strides), bias [N]
    M,
    N,
    K,
    s_ab,
    s_am,
    s_ak,  # strides of a, in elements
    s_bb,
    s_bk,
    s_bn,
    s_cb,
    s_cm,
    s_cn,
    M_KEY,  # autotuner key only (size buckets, see _tune_keys); unused by the kernel
    N_KEY,
    K_KEY,
    HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr,  # 0 none, 1 relu, 2 gelu (tanh)
    PRECISION: tl.constexpr,  # "ieee", "tf32" or "tf32rn" (ops/_triton_dots.py)
    UPCAST: tl.constexpr,  # dot in fp32 (the CPU interpreter has no bf16 dot)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    ALIGN: tl.constexpr = 1,  # M, N, K and the strides are multiples of it (``align_of``)
    A_K_INNER: tl.constexpr = True,  # with ALIGN: s_ak == 1 (else a's rows are its inner dim)
    B_N_INNER: tl.constexpr = True,  # with ALIGN: s_bn == 1 (else b's K is its inner dim)
    SPLIT_K: tl.constexpr = 1,  # > 1: K slices over program_id(2), fp32 partials into c (below)
    A_LO=0,  # "x3s": the rests of a and b, these many elements past their heads
    B_LO=0,
):
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    bz = tl.program_id(1).to(tl.int64)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    am = rm % M  # wrapped rows / columns: always in bounds, never stored
    bn = rn % N
    a_base = bz * s_ab
    b_base = bz * s_bb
    if ALIGN > 1:
        # Triton knows an int argument's divisibility by 16 only: with 3000 or 1000 in a
        # dim it loads one element at a time and does not pipeline. Dims and strides that
        # are multiples of ALIGN (16 bytes) keep every run of ALIGN elements contiguous
        # and 16-byte aligned, the wrap (% M, % N) included. The hint goes on each
        # operand's outer offsets only (multiple_of drops a contiguity Triton had).
        am = tl.max_contiguous(tl.multiple_of(am, ALIGN), ALIGN)
        bn = tl.max_contiguous(tl.multiple_of(bn, ALIGN), ALIGN)
    a_rows = am * s_am
    a_cols = rk * s_ak
    b_rows = rk * s_bk
    b_cols = bn * s_bn
    if ALIGN > 1:
        if A_K_INNER:
            a_rows = tl.multiple_of(a_rows, ALIGN)
        else:
            a_cols = tl.multiple_of(a_cols, ALIGN)
        if B_N_INNER:
            b_rows = tl.multiple_of(b_rows, ALIGN)
        else:
            b_cols = tl.multiple_of(b_cols, ALIGN)
        a_base = tl.multiple_of(a_base, ALIGN)
        b_base = tl.multiple_of(b_base, ALIGN)
    a_ptrs = a_ptr + a_base + a_rows[:, None] + a_cols[None, :]
    b_ptrs = b_ptr + b_base + b_rows[:, None] + b_cols[None, :]

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    c_base = bz * s_cb
    if SPLIT_K == 1:
        first = 0
        steps = tl.cdiv(K, BLOCK_K)
    else:
        # Slice program_id(2) of K: blocks [first, first + steps) of cdiv(K, BLOCK_K); c is
        # then the fp32 partials [SPLIT_K, Bt, M, N] (a slice past K stores zeros), which
        # _split_sum_kernel adds in slice order with the bias and activation.
        per = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K)
        first = tl.program_id(2) * per
        steps = tl.maximum(tl.minimum(per, tl.cdiv(K, BLOCK_K) - first), 0)
        a_ptrs += first * BLOCK_K * s_ak
        b_ptrs += first * BLOCK_K * s_bk
        c_base += tl.program_id(2).to(tl.int64) * tl.num_programs(1) * s_cb
    whole = tl.minimum(steps, tl.maximum(K // BLOCK_K - first, 0))
    for _ in range(0, whole):  # whole K blocks unmasked, then the tail
        acc = k_block(a_ptrs, b_ptrs, acc, BLOCK_K, rk, A_LO, B_LO, PRECISION, UPCAST, False)
        a_ptrs += BLOCK_K * s_ak
        b_ptrs += BLOCK_K * s_bk
    if steps > whole:
        acc = k_block(a_ptrs, b_ptrs, acc, K % BLOCK_K, rk, A_LO, B_LO, PRECISION, UPCAST, True)

    acc = epilogue(acc, bias_ptr, rn, N, HAS_BIAS, ACT)
    c_ptrs = c_ptr + c_base + rm[:, None] * s_cm + rn[None, :] * s_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton_support.jit
def _skinny_slice(a_ptr, b_ptr, M, N, K, s_am, s_ak, s_bk, s_bn, SPLIT_K: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    # Program (pid_n, pid_k) of the skinny kernels: columns [pid_n * BLOCK_N, +BLOCK_N) of
    # all M rows, over K blocks [pid_k * per, +per) of the cdiv(K, BLOCK_K) blocks (a slice
    # past the end has none). Returns the slice, its first k and block count, the row,
    # column and k offsets, and a's and b's tile pointers at the slice's first block.
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    k_blocks = tl.cdiv(K, BLOCK_K)
    per = tl.cdiv(k_blocks, SPLIT_K)
    k_lo = pid_k * per * BLOCK_K
    steps = tl.minimum(per, k_blocks - pid_k * per)
    rm = tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    am = rm % M  # wrapped rows / columns: always in bounds, never stored
    bn = rn % N
    # 64-bit offsets into b: a weight past 2^31 elements, or k_lo * s_bk past 2^31
    a_ptrs = a_ptr + am[:, None] * s_am + (k_lo + rk)[None, :] * s_ak
    b_ptrs = b_ptr + (k_lo + rk)[:, None].to(tl.int64) * s_bk + bn[None, :].to(tl.int64) * s_bn
    return pid_k, k_lo, steps, rm, rn, rk, a_ptrs, b_ptrs


@triton_support.jit
def _skinny_store(out, pid_k, rm, rn, M, N, c_ptr, w_ptr, bias_ptr, s_cm, s_cn,
                  HAS_BIAS: tl.constexpr, ACT: tl.constexpr, SPLIT_K: tl.constexpr):  # fmt: skip
    # One slice: the epilogue and the output; several: the fp32 partial of slice pid_k
    # (zeros for a slice past K), which _split_sum_kernel adds.
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    if SPLIT_K == 1:
        out = epilogue(out, bias_ptr, rn, N, HAS_BIAS, ACT)
        tl.store(c_ptr + rm[:, None] * s_cm + rn[None, :] * s_cn, out.to(c_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(w_ptr + pid_k * M * N + rm[:, None] * N + rn[None, :], out, mask=mask)


@triton_support.jit
def _skinny_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    w_ptr,
    bias_ptr,  # a [M, K], b [K, N], c [M, N] (any strides), w [SPLIT_K, M, N] fp32 contiguous, bias [N]
    M,
    N,
    K,
    s_am,
    s_ak,  # strides of a, in elements
    s_bk,
    s_bn,  # strides of b: s_bk == 1 for b = weight.t(), s_bn == 1 for a contiguous b
    s_cm,
    s_cn,
    HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr,  # 0 none, 1 relu, 2 gelu (tanh)
    PRECISION: tl.constexpr,  # "ieee", "tf32" or "tf32rn" (ops/_triton_dots.py)
    UPCAST: tl.constexpr,  # dot in fp32 (the CPU interpreter has no bf16 dot)
    SPLIT_K: tl.constexpr,  # K slices; 1: the epilogue here, else fp32 partials into w
    BLOCK_M: tl.constexpr,  # >= M: one tile covers every row
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    # _skinny_slice's program; a slice past the end has no block and stores zeros, so the
    # sum over slices never reads an unwritten partial.
    pid_k, k_lo, steps, rm, rn, rk, a_ptrs, b_ptrs = _skinny_slice(
        a_ptr, b_ptr, M, N, K, s_am, s_ak, s_bk, s_bn, SPLIT_K, BLOCK_M, BLOCK_N, BLOCK_K
    )
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for i in range(0, steps):
        k_left = K - k_lo - i * BLOCK_K  # only the last block of K is partial
        acc = k_block(a_ptrs, b_ptrs, acc, k_left, rk, 0, 0, PRECISION, UPCAST, True)
        a_ptrs += BLOCK_K * s_ak
        b_ptrs += BLOCK_K * s_bk
    _skinny_store(acc, pid_k, rm, rn, M, N, c_ptr, w_ptr, bias_ptr, s_cm, s_cn, HAS_BIAS, ACT, SPLIT_K)


@triton_support.jit
def _skinny_fma_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    w_ptr,
    bias_ptr,  # as _skinny_kernel's
    M,
    N,
    K,
    s_am,
    s_ak,
    s_bk,
    s_bn,
    s_cm,
    s_cn,
    HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr,
    SPLIT_K: tl.constexpr,
    BLOCK_M: tl.constexpr,  # >= M, a power of two (1 for M = 1: no padded rows)
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    FLUSH: tl.constexpr,  # K steps of running sums between additions into the output's; 0: none
):
    # fp32 without TF32: _skinny_kernel's programs and slices, the products on the FMA
    # units without tl.dot (whose tiles start at 16 rows). Each (m, k, n) of the block keeps
    # a running sum over FLUSH K steps, then the block's sums are added over k (a tree of
    # BLOCK_K) into the output's: rounding walks of FLUSH and steps / FLUSH, not of steps.
    # FLUSH 0 (slices of few steps): one walk over the slice, one loop to pipeline.
    pid_k, k_lo, steps, rm, rn, rk, a_ptrs, b_ptrs = _skinny_slice(
        a_ptr, b_ptr, M, N, K, s_am, s_ak, s_bk, s_bn, SPLIT_K, BLOCK_M, BLOCK_N, BLOCK_K
    )
    if FLUSH == 0:
        acc = tl.zeros((BLOCK_M, BLOCK_K, BLOCK_N), dtype=tl.float32)
        acc, a_ptrs, b_ptrs = _fma_walk(acc, a_ptrs, b_ptrs, 0, steps, K - k_lo, rk, s_ak, s_bk, BLOCK_K)
        out = tl.sum(acc, axis=1)
    else:
        out = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for j in range(0, steps, FLUSH):
            acc = tl.zeros((BLOCK_M, BLOCK_K, BLOCK_N), dtype=tl.float32)
            hi = tl.minimum(j + FLUSH, steps)
            acc, a_ptrs, b_ptrs = _fma_walk(acc, a_ptrs, b_ptrs, j, hi, K - k_lo, rk, s_ak, s_bk, BLOCK_K)
            out += tl.sum(acc, axis=1)
    _skinny_store(out, pid_k, rm, rn, M, N, c_ptr, w_ptr, bias_ptr, s_cm, s_cn, HAS_BIAS, ACT, SPLIT_K)


@triton_support.jit
def _fma_walk(acc, a_ptrs, b_ptrs, lo, hi, k_rest, rk, s_ak, s_bk, BLOCK_K: tl.constexpr):
    # K steps [lo, hi) of _skinny_fma_kernel's slice (k_rest: K past the slice's start)
    # into the running sums acc [BLOCK_M, BLOCK_K, BLOCK_N]; returns them and the pointers.
    for i in range(lo, hi):
        k_left = k_rest - i * BLOCK_K
        a = tl.load(a_ptrs, mask=rk[None, :] < k_left, other=0.0)
        b = tl.load(b_ptrs, mask=rk[:, None] < k_left, other=0.0)
        acc += a[:, :, None] * b[None, :, :]
        a_ptrs += BLOCK_K * s_ak
        b_ptrs += BLOCK_K * s_bk
    return acc, a_ptrs, b_ptrs


@triton_support.jit
def _outer_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    bias_ptr,  # a [Bt, M, 1], b [Bt, 1, N] (any strides), c [Bt, M, N] contiguous, bias [N]
    M,
    N,
    s_ab,
    s_am,
    s_bb,
    s_bn,
    HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # K = 1, an outer product (the backward's a^T @ dz of a one-row product): c[z, m, n] =
    # act(a[z, m] * b[z, n] + bias[n]). Nothing to accumulate: the store of c is the work,
    # so a program writes BLOCK_M rows x BLOCK_N columns with lanes along n (whole runs of
    # a row per warp at any N) instead of the tiled kernel's dot-shaped tile.
    num_n = tl.cdiv(N, BLOCK_N)
    pid = tl.program_id(0)
    rm = (pid // num_n) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = (pid % num_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    bz = tl.program_id(1).to(tl.int64)
    x = tl.load(a_ptr + bz * s_ab + rm * s_am, mask=rm < M, other=0.0).to(tl.float32)
    y = tl.load(b_ptr + bz * s_bb + rn * s_bn, mask=rn < N, other=0.0).to(tl.float32)
    acc = epilogue(x[:, None] * y[None, :], bias_ptr, rn, N, HAS_BIAS, ACT)
    c_ptrs = c_ptr + bz * M * N + rm.to(tl.int64)[:, None] * N + rn[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton_support.jit
def _split_sum_kernel(
    w_ptr,
    c_ptr,
    bias_ptr,  # w [SPLIT_K, M, N] fp32, c [M, N] contiguous, bias [N]
    MN,  # M * N
    N,
    HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr,
    SPLIT_K: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # c = act(w[0] + w[1] + ... + w[SPLIT_K - 1] + bias), slices added in that order:
    # the same bits on every run (no atomics). Reads 4 * SPLIT_K bytes per output element.
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    acc = tl.load(w_ptr + offs, mask=mask, other=0.0)
    for s in tl.static_range(1, SPLIT_K):
        acc += tl.load(w_ptr + s * MN + offs, mask=mask, other=0.0)
    acc = epilogue(acc[None, :], bias_ptr, offs % N, N, HAS_BIAS, ACT)  # [1, BLOCK]
    tl.store(c_ptr + offs[None, :], acc.to(c_ptr.dtype.element_ty), mask=mask[None, :])


# --------------------------------------------------------------------------- configs


def matmul_configs() -> list:
    """Candidate tiles, largest first. Hopper wants big tiles (128x256 with 8 warps keeps
    two warpgroups of wgmma busy; 3-4 stages of cp.async/TMA hide the HBM latency);
    the smaller ones serve small or skinny problems and fp32 (4-byte elements double
    the shared memory per stage)."""
    rows = [
        # BM, BN, BK, GROUP_M, stages, warps
        (128, 256, 64, 8, 3, 8),
        (256, 128, 64, 8, 3, 8),
        (128, 256, 64, 8, 4, 8),
        (128, 128, 64, 8, 4, 8),
        (128, 128, 64, 8, 3, 4),
        (128, 128, 32, 8, 4, 4),
        (128, 64, 32, 8, 4, 4),
        (64, 128, 32, 8, 4, 4),
        (64, 64, 32, 8, 4, 4),
        (128, 128, 32, 8, 3, 8),
        (64, 64, 64, 8, 3, 4),
        (32, 64, 32, 8, 5, 2),
        (64, 32, 32, 8, 5, 2),
        (32, 32, 32, 8, 4, 2),
    ]
    return as_configs(rows)


def as_configs(rows) -> list:
    """triton.Config of each (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, stages, warps) row."""
    return [
        triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": g}, num_stages=s, num_warps=w)
        for bm, bn, bk, g, s, w in rows
    ]


@functools.cache
def _max_shared(device_index: int) -> int:
    props = torch.cuda.get_device_properties(device_index)
    return int(getattr(props, "shared_memory_per_block_optin", 0) or 166912)  # A100's, if unknown


def pipeline_bytes(bm: int, bn: int, bk: int, elem: int, stages: int = 1) -> int:
    """Shared memory of a matmul's software pipeline: one A and one B tile per stage."""
    return (bm * bk + bk * bn) * elem * stages


def _fits(cfg, m: int, n: int, k: int, elem: int, max_shared: int) -> bool:
    kw = cfg.kwargs
    bm, bn, bk = kw["BLOCK_M"], kw["BLOCK_N"], kw["BLOCK_K"]
    if pipeline_bytes(bm, bn, bk, elem, cfg.num_stages) > max_shared:
        return False

    # A tile much larger than the problem wastes the whole tile's MMAs on padding.
    def cap(d):
        return max(32, triton_support.next_pow2(max(d, 1)))

    return bm <= cap(m) and bn <= cap(n) and bk <= cap(k)


def prune_configs(configs, named_args, **kwargs):
    """Drop configs whose pipeline does not fit the device's shared memory, whose tiles
    are larger than the problem, and (fp32 without TF32) the tensor-core-sized tiles; keep
    at least the smallest."""
    a = named_args["a_ptr"]
    m, n, k = named_args["M"], named_args["N"], named_args["K"]
    limit = _max_shared(a.device.index or 0) if a.is_cuda else 232448  # H100's opt-in limit
    # ("x3s": a head and a rest tile of each operand a stage)
    elem = a.element_size() * (2 if kwargs.get("PRECISION") == "x3s" else 1)
    kept = [c for c in configs if _fits(c, m, n, k, elem, limit)]
    if kwargs.get("PRECISION") == "ieee" and a.element_size() == 4:
        # fp32 without TF32 runs on FMA units, not tensor cores: a thread holds its share of
        # the accumulator in registers, and past 128x128 (64 fp32 per thread at 8 warps,
        # 128 at 4) it spills; the big tensor-core tiles only cost tuning time here.
        kept = [
            c
            for c in kept
            if c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"] <= 128 * 128 and c.kwargs["BLOCK_K"] <= 32
        ]
    elif kwargs.get("PRECISION") in ("x3", "x3s"):
        # each K block is four TF32 tiles (x3: split in registers first): 32 deep at most
        kept = [c for c in kept if c.kwargs["BLOCK_K"] <= 32]
    if not kept:
        kept = [min(configs, key=lambda c: c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"] * c.num_stages)]
    return kept


# Autotune key: size buckets of M, N, K (see _tune_keys), the precision and the operands'
# layout (ALIGN, which stride of a and b is the unit one); Triton adds the argument dtypes
# to the key itself. So one tuning run (a dozen configs, each compiled and timed: ~5-10 s)
# serves every big problem of one bucket, dtype and layout, not every exact shape. A
# config tuned for one layout is no guide to another: a b = W.t() forward, or the
# backward's transposed operands, ran 3-3.3x slower than the plain product (H100, bf16,
# 3000^3 and 1000x3000x5000) on the config tuned for the plain one.
_matmul_tuned = triton.autotune(
    configs=matmul_configs(),
    key=["M_KEY", "N_KEY", "K_KEY", "PRECISION", "ALIGN", "A_K_INNER", "B_N_INNER", "SPLIT_K"],
    prune_configs_by={"early_config_prune": prune_configs},
)(_matmul_kernel)

# Problems with fewer multiply-adds than this (bt*M*N*K: 1024^3, ~2 GFLOP, ~0.1 ms on an H100
# in bf16) take one fixed config and are never tuned: tuning such a problem costs seconds to
# save microseconds, and correctness checks run dozens of small odd shapes (tuning each would
# make `check` take over a minute per dtype). At and above it a kernel runs for
# ~0.1 ms or more, is called many times (training, benchmarks), and the tile choice is worth
# 10-30%.
TUNE_MIN_WORK = 1 << 30

# fp32 FMA dots (TF32 off) with b K-inner (b = W.t(), a linear's forward; W^T in the
# backward's dz @ W^T): Triton's FMA dot reads such a b tile at about half the speed of an
# N-inner one (H100, tuned: 8192x768x768 0.545 ms against 0.256). From this many rows the
# product is worth a contiguous copy of b first (the copy costs about 64/M of the product).
FMA_COPY_MIN_M = 128

# "x3" dots (fp32 as three TF32 wgmma dots, ``kernellab.config.fp32_dots``): the other way
# round. wgmma takes TF32 operands K-major only, so an N-inner b tile is split and stored
# back transposed through shared memory (sm_90 PTX: 84 st.shared against 36 for a K-inner
# b), and ran 1.5-1.8x slower (H100, 8192x768x768: 0.304 ms against 0.198 with b = W.t()).
# From this many rows an N-inner b is copied K-inner first.
X3_COPY_MIN_M = 128


# "x3" dots from this much work (bt*M*N*K): a and b split into TF32 heads and rests ahead of
# the product ("x3s": ``_tf32_split_kernel``, a pass over each operand writing twice its
# bytes, padded to multiples of 4 and with b K-inner), so that the kernel's tiles go from
# memory to the tensor cores as loaded instead of through registers to be split. Where the
# x3 path pads the operands anyway (a dim or stride off a multiple of 4), or where the output
# is wide enough that the pass costs little beside the product (M N / (M + N) of at least
# X3_SPLIT_MIN_MN: the pass is ~12 (M + N) K bytes against M N K multiply-adds). H100
# (lab/gpu_x3_split.py, forward, ms x3 -> x3s, cuBLAS): 4097x4095x1023 0.781 -> 0.667
# (0.688), forward+backward 2.56 -> 2.06 (2.10); 8192x2304x768 0.571 -> 0.528 (0.632);
# 8192x3072x768 0.760 -> 0.689; 4096^3 2.67 -> 2.15. Slower: 3000^3 1.115 -> 1.184 (M N / (M +
# N) 1500) and the GPT-2 backward's products with 768 wide outputs (8192x768x768 forward +
# backward 0.623 -> 0.687).
X3_SPLIT_MIN_WORK = TUNE_MIN_WORK
X3_SPLIT_MIN_MN = 1536


def _tune_keys(m: int, n: int, k: int) -> tuple[int, int, int]:
    """Bucket a dimension to its power of two at or above it: 3000 and 4000 share a tuning."""
    return triton_support.next_pow2(m), triton_support.next_pow2(n), triton_support.next_pow2(k)


def fixed_config(elem: int, precision: str, max_shared: int) -> dict:
    """The untuned config for small problems: tensor-core-sized 128x128 tiles for fp16/bf16
    and TF32, 64x64x32 for fp32 on FMA units (a 128x128 fp32 accumulator would mean 128
    registers per thread at 4 warps); a 64x64x32 2-stage fallback if shared memory is short."""
    if elem == 4 and precision == "ieee":
        cfg = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, "num_stages": 3, "num_warps": 4}
    elif elem == 4:
        cfg = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32, "GROUP_M": 8, "num_stages": 3, "num_warps": 4}
    else:
        cfg = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_stages": 3, "num_warps": 8}
    smem = (cfg["BLOCK_M"] + cfg["BLOCK_N"]) * cfg["BLOCK_K"] * elem * cfg["num_stages"]
    if smem > max_shared:
        cfg = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, "num_stages": 2, "num_warps": 4}
    return cfg


# A 16-bit product below TUNE_MIN_WORK takes a few microseconds: 64x64 tiles stepping
# 128 along K (4 warps, 3 stages), or, with K up to SMALL_SHRINK_MAX_K, narrower tiles
# where the output has too few of those to give SMALL_MIN_PROGRAMS programs (a longer K
# keeps the wide steps). 128x128 tiles there leave most SMs idle and run a mostly empty
# tile (benchmarks/NOTES.md, "Small matmuls").
SMALL_TILE = 64
SMALL_MIN_PROGRAMS = 8
SMALL_SHRINK_MAX_K = 1024


# fp32 FMA dots (TF32 off) below TUNE_MIN_WORK: the same narrowing as 16-bit operands, down
# to SMALL_FMA_MIN_PROGRAMS programs, K steps as fixed_config's (32). H100 (lab/gpu_mm_small.py
# --dtype fp32): 256x10x128 17.2 us at the fixed 64x64 tiles, 8.8 at 16x16 (cuBLAS 10.0);
# 256x128x10 (its backward's dz @ W) 6.4 at 32x32 against 9.9 at 64x64 (cuBLAS 11.9).
SMALL_FMA_MIN_PROGRAMS = 32


def small_config(m: int, n: int, k: int, bt: int, elem: int, precision: str, max_shared: int) -> dict:
    """The untuned config of a [bt] x [m, k] @ [k, n] product below TUNE_MIN_WORK."""
    fma = elem == 4 and precision == "ieee"
    if elem != 2 and not fma:
        return fixed_config(elem, precision, max_shared)
    bm, bn = SMALL_TILE, min(SMALL_TILE, max(16, triton_support.next_pow2(n)))
    cdiv = triton_support.cdiv
    want = SMALL_FMA_MIN_PROGRAMS if fma else SMALL_MIN_PROGRAMS
    while k <= SMALL_SHRINK_MAX_K and bm * bn > 256 and bt * cdiv(m, bm) * cdiv(n, bn) < want:
        if bm >= bn and bm > 16:
            bm //= 2
        else:
            bn //= 2
    if fma:  # fixed_config's K steps, stages and warps (64x64 where nothing narrowed)
        return dict(fixed_config(elem, precision, max_shared), BLOCK_M=bm, BLOCK_N=bn)
    bk = 128 if bm == bn == SMALL_TILE and k >= 128 else 64
    cfg = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8, "num_stages": 3, "num_warps": 4}
    if pipeline_bytes(bm, bn, bk, elem, 3) > max_shared:
        cfg.update(BLOCK_K=32, num_stages=2)
    return cfg


# fp32 FMA products this small (bt*M*N*K multiply-adds) with a K this short run "ieee64"
# dots: each K block's products exact and summed in fp64, rounded once. They are bound by
# the launch, not the arithmetic, and one fp32 FMA chain over K = 16-100 erred up to ~2x
# cuBLAS's error there (the check's bound: 2x cuBLAS's, plus an ulp). Longer K takes the
# two-level sums of fp32 blocks; K = 1 (an outer product) is one rounding either way.
FMA64_MAX_WORK = 1 << 24
FMA64_MAX_K = 128


def fma64_applies(bt: int, m: int, n: int, k: int) -> bool:
    """Whether an fp32 FMA product of these dims runs "ieee64" dots (FMA64_MAX_WORK)."""
    return 1 < k <= FMA64_MAX_K and bt * m * n * k <= FMA64_MAX_WORK


# K slices for the tiled kernel: a product whose 128x128 tiles fill at most half the SMs
# (a weight gradient of a small layer: [768, 768] over K = 8192 rows is 36 tiles on 132
# SMs) with a long K runs as that many tiles x slices of at least GENERAL_SLICE_K, fp32
# partials added in slice order (deterministic). Long: GENERAL_SPLIT_MIN_K for fp32 FMA
# dots, 4x that on tensor cores, where a tile's K loop is that much shorter than the
# partials' second launch.
GENERAL_SPLIT_MIN_K = 1024
GENERAL_SLICE_K = 512


def general_split(m: int, n: int, k: int, bt: int, n_sm: int, fma: bool = True) -> int:
    """SPLIT_K of ``_matmul_kernel`` for [bt] x [m, k] @ [k, n] on n_sm SMs: 1, or where
    2 x the 128x128 tiles fit in n_sm and K is long (GENERAL_SPLIT_MIN_K with ``fma``
    dots, 4x that without), slices for about one wave (n_sm // tiles), each
    GENERAL_SLICE_K or more, at most SKINNY_SPLIT_MAX. Pure: a function of its arguments."""
    tiles = bt * triton_support.cdiv(m, 128) * triton_support.cdiv(n, 128)
    if k < GENERAL_SPLIT_MIN_K * (1 if fma else 4) or tiles == 0 or 2 * tiles > n_sm:
        return 1
    return max(1, min(SKINNY_SPLIT_MAX, n_sm // tiles, k // GENERAL_SLICE_K))


# The CPU interpreter runs programs one by one: one small config, no tuning.
_CPU_CONFIG = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 4}


# --------------------------------------------------------------------------- skinny configs
#
# A skinny product (M <= 128 rows against a weight of N x K) reads the weight once and
# little else: [16, 4096] @ [4096, 14336] in bf16 is 117 MB of weight for 1.9 GFLOP
# (16 FLOP/byte, the H100's ridge is ~300), so its time is the weight's bytes over the
# copy bandwidth (~3-4 TB/s: ~35 us) when enough loads are in flight on every SM. One
# BLOCK_M tile holds every row; programs go over N tiles x K slices.

SKINNY_M_MAX = 128  # rows one tile holds; more rows: the general kernel
SKINNY_MIN_NK = 1 << 20  # a weight of 2 MB (bf16) and up; below, launch cost dominates either path
SKINNY_WAVES = 2  # programs wanted: this many per SM (one wave = n_sm programs)
SKINNY_MIN_K_BLOCKS = 2  # each K slice walks at least this many BLOCK_K steps
SKINNY_SPLIT_MAX = 32
SKINNY_SPLIT_MIN_BYTES = 1 << 23  # below (~2 us of reading), no split: the sum's launch costs more
# except a long K over an output of fewer than SMALL_MIN_PROGRAMS 64x64 tiles (MNIST's fc1,
# 64x128x3136): there the serial K loop is the time, and 32-wide tiles in K slices of two
# blocks or more take it (benchmarks/NOTES.md, "Small matmuls"), whatever the weight's size
SKINNY_LONG_K = 2048
SKINNY_SMEM = 128 * 1024  # shared memory budget of one program's pipeline (H100: 227 KB per SM)
# Autotuning is opt-in (``tune=True``): the heuristic's configs are the default
# (lab/gpu_skinny.py measures both; benchmarks/NOTES.md).
SKINNY_TUNE_MIN_BYTES = None
_SKINNY_BN = (32, 64, 128, 256)
_SKINNY_BK = (32, 64, 128, 256)
# One wave, no split (16-bit, M <= 32, where the weight's N tiles alone fill most of a
# wave): programs of BLOCK_N x BLOCK_K = ONE_WAVE_TILE weight elements a step, as many
# stages as ONE_WAVE_SMEM holds (up to 4), so each SM keeps ~128 KB of the weight in flight
# and no fp32 partials or second launch are needed (lab/gpu_skinny_sweep.py).
ONE_WAVE_FILL = 0.7  # programs >= this many waves
ONE_WAVE_TILE = 16384
ONE_WAVE_SMEM = 160 * 1024


def skinny_block_m(m: int) -> int:
    """BLOCK_M for M rows: the power of two at or above M, within [16, 128] (tl.dot's
    smallest tile is 16; M = 1 pays 16 rows of MMA, free in a memory-bound product)."""
    return min(SKINNY_M_MAX, max(16, triton_support.next_pow2(m)))


def _skinny_stages(bm: int, bn: int, bk: int, elem: int) -> int:
    """Pipeline depth that fits SKINNY_SMEM: one a and one b tile per stage, 2 to 4."""
    return max(2, min(4, SKINNY_SMEM // pipeline_bytes(bm, bn, bk, elem)))


def _skinny_warps(bm: int, bn: int) -> int:
    """4 warps, 8 for a 128 x 128 accumulator (64 fp32 registers a thread instead of 128)."""
    return 8 if bm * bn >= 128 * 128 else 4


def _skinny_splits(m: int, n: int, k: int, bn: int, bk: int, n_sm: int, elem: int) -> int:
    """K slices for N tiles of ``bn``: enough for SKINNY_WAVES * n_sm programs, at most
    ``_skinny_split_cap``, and no empty slice (K per slice: a whole number of BLOCK_K)."""
    kb = max(1, triton_support.cdiv(k, bk))
    wanted = triton_support.cdiv(SKINNY_WAVES * n_sm, triton_support.cdiv(n, bn))
    return _whole_slices(kb, min(_skinny_split_cap(m, k, kb, elem), wanted))


def _whole_slices(kb: int, s: int) -> int:
    """At most ``s`` (at least 1) K slices of ``kb`` blocks, each a whole number of blocks
    and none empty."""
    return triton_support.cdiv(kb, triton_support.cdiv(kb, max(1, s)))


def _skinny_split_cap(m: int, k: int, kb: int, elem: int) -> int:
    """The most K slices worth their cost: each slice writes and the sum reads back an fp32
    [M, N] partial (8 M N bytes), kept under a quarter of the weight's N K elem bytes
    (S <= K elem / (32 M): M = 128, K = 4096 bf16 allows 2; M = 16, 16); and each slice
    walks SKINNY_MIN_K_BLOCKS blocks."""
    return max(1, min(SKINNY_SPLIT_MAX, kb // SKINNY_MIN_K_BLOCKS, (k * elem) // (32 * max(m, 1))))


@functools.lru_cache(maxsize=1024)
def skinny_config(m: int, n: int, k: int, n_sm: int, elem_size: int) -> tuple[int, int, int, int, int]:
    """(BLOCK_N, BLOCK_K, SPLIT_K, num_warps, num_stages) for [M, K] @ [K, N], M <= 128.

    BLOCK_K: 256 bytes of a weight column per step for BLOCK_M <= 32 (128 for wider
    tiles, whose a tile fills shared memory too): whole 128-byte lines whichever of K or N
    is contiguous. BLOCK_N: 128 (64 if that alone makes SKINNY_WAVES waves) when N tiles
    fill SKINNY_WAVES waves without splitting; below SKINNY_SPLIT_MIN_BYTES of weight, 64
    or 32 and no split; otherwise split K (``_skinny_splits``), with 64-wide tiles where
    128-wide ones cannot reach the waves within the split cap. Before all of that, a
    16-bit product of M <= 32 (weights of SKINNY_SPLIT_MIN_BYTES and up) whose N tiles
    alone fill most of a wave takes the one-wave launch (``_one_wave``: no split, deep
    stages); a small weight under a long K (``long_k_small_output``) takes 32-wide tiles
    in K slices of SKINNY_MIN_K_BLOCKS blocks or more.
    Pure: a function of its arguments (cached)."""
    bm = skinny_block_m(m)
    if bm <= 32 and elem_size == 2 and n * k * elem_size >= SKINNY_SPLIT_MIN_BYTES:
        one = _one_wave(m, bm, n, k, n_sm, elem_size)
        if one is not None:
            return one
    if n * k * elem_size < SKINNY_SPLIT_MIN_BYTES and long_k_small_output(m, n, k):
        bn, bk = 32, 256 // elem_size
        kb = triton_support.cdiv(k, bk)
        waves = SKINNY_WAVES * n_sm // triton_support.cdiv(n, bn)
        s = _whole_slices(kb, min(SKINNY_SPLIT_MAX, kb // SKINNY_MIN_K_BLOCKS, waves))
        return bn, bk, s, _skinny_warps(bm, bn), _skinny_stages(bm, bn, bk, elem_size)
    bk = (256 if bm <= 32 else 128) // elem_size
    bk = max(16, min(bk, triton_support.next_pow2(k)))
    target = SKINNY_WAVES * n_sm
    kb = triton_support.cdiv(k, bk)
    bn = next((w for w in (128, 64) if triton_support.cdiv(n, w) >= target), None)
    if bn is not None:
        s = 1
    elif n * k * elem_size < SKINNY_SPLIT_MIN_BYTES:  # a few microseconds: no second launch
        bn = 64 if 2 * triton_support.cdiv(n, 64) >= n_sm else 32
        s = 1
    else:
        cap = _skinny_split_cap(m, k, kb, elem_size)
        bn = 128 if triton_support.cdiv(n, 128) * cap >= target else 64
        s = _skinny_splits(m, n, k, bn, bk, n_sm, elem_size)
    return bn, bk, s, _skinny_warps(bm, bn), _skinny_stages(bm, bn, bk, elem_size)


def _one_wave(m_rows: int, bm: int, n: int, k: int, n_sm: int, elem: int):
    """The one-wave launch (see ONE_WAVE_FILL) of the widest BLOCK_N whose N tiles fill
    ONE_WAVE_FILL of a wave (256 only where 128-wide tiles make fewer than SKINNY_WAVES
    waves; 32 only from 16 rows up), or None when no width does."""
    widths = (128, 64, 32) if triton_support.cdiv(n, 128) >= SKINNY_WAVES * n_sm else (256, 128, 64, 32)
    if m_rows < 16:  # few rows: 32-wide tiles read a row-major b in 64-byte runs, too short
        widths = tuple(w for w in widths if w >= 64)
    bn = next((w for w in widths if triton_support.cdiv(n, w) >= ONE_WAVE_FILL * n_sm), None)
    if bn is None:
        return None
    bk = max(16, min(256, ONE_WAVE_TILE // bn, triton_support.next_pow2(k)))
    stages = max(2, min(4, ONE_WAVE_SMEM // pipeline_bytes(bm, bn, bk, elem)))
    return bn, bk, 1, 4, stages


# fp32 with TF32 off, M <= FMA_M_MAX: ``_skinny_fma_kernel`` (FMA products, no tl.dot). A
# program holds BLOCK_M x BLOCK_K x BLOCK_N running sums, FMA_TERMS a thread at 4 warps;
# FMA_WAVES waves of these small programs keep the weight's loads in flight, each K slice
# at least FMA_MIN_STEPS blocks long. From 16 rows up the tl.dot kernel is 1.2-3x faster
# (H100, lab/gpu_fp32_matmul.py), at 4 rows about even.
FMA_M_MAX = 4
FMA_TERMS = 32
FMA_WAVES = 4
FMA_MIN_STEPS = 4
FMA_STAGES = 2
FMA_FLUSH = 8  # K steps of running sums before they are added into the output's
FMA_WALK_MAX = 16  # slices of at most this many K steps keep one running sum (FLUSH 0)


# One row against an N-inner b ([K, N] row-major): wide N tiles, short K steps (256 x 8 at
# 4 warps, 16 sums a thread). H100, 1x4097x4095: 0.044 ms against 0.058 at the 128 x 32
# of other layouts; 1x14336x4096: 0.098 against 0.103 (lab/gpu_fp32_matmul.py sweep).
FMA_ROW_KN = (256, 8)


def fma_config(m: int, n: int, k: int, n_sm: int, b_n_inner: bool = False) -> tuple[int, int, int, int, int]:
    """(BLOCK_N, BLOCK_K, SPLIT_K, num_warps, num_stages) of ``_skinny_fma_kernel`` for
    [M, K] @ [K, N] fp32, M <= FMA_M_MAX: BLOCK_N 128 to 32 as M grows, BLOCK_K filling
    FMA_TERMS sums a thread (one row with ``b_n_inner``: FMA_ROW_KN, BLOCK_N cut to N);
    K split (``_whole_slices``) for FMA_WAVES waves of programs where the weight is
    SKINNY_SPLIT_MIN_BYTES or more or K is long over a small output, the fp32 partials
    (8 S M N bytes) kept under a quarter of the weight or 2 MB.
    Pure: a function of its arguments."""
    bm = triton_support.next_pow2(m)
    warps = 4
    if bm == 1 and b_n_inner:
        bn = min(FMA_ROW_KN[0], max(32, triton_support.next_pow2(n)))
        bk = max(1, min(FMA_ROW_KN[0] * FMA_ROW_KN[1] // bn, triton_support.next_pow2(k)))
        return bn, bk, fma_split(m, n, k, bn, bk, n_sm), warps, FMA_STAGES
    bn = 128 if bm <= 4 else 64 if bm <= 16 else 32
    bk = max(1, min(64, FMA_TERMS * 32 * warps // (bm * bn), triton_support.next_pow2(k)))
    return bn, bk, fma_split(m, n, k, bn, bk, n_sm), warps, FMA_STAGES


def fma_split(m: int, n: int, k: int, bn: int, bk: int, n_sm: int) -> int:
    """``fma_config``'s K slices for tiles of ``bn`` x ``bk``: 1 unless the weight is
    SKINNY_SPLIT_MIN_BYTES or more or K is long over a small output; then slices for
    FMA_WAVES waves, each FMA_MIN_STEPS blocks or more, the partials bounded."""
    if n * k * 4 < SKINNY_SPLIT_MIN_BYTES and not long_k_small_output(m, n, k):
        return 1
    kb = triton_support.cdiv(k, bk)
    wanted = triton_support.cdiv(FMA_WAVES * n_sm, triton_support.cdiv(n, bn))
    partials = max(n * k, 1 << 21) // (8 * max(m, 1) * n)
    return _whole_slices(kb, min(SKINNY_SPLIT_MAX, kb // FMA_MIN_STEPS, wanted, partials))


def fma_flush(k: int, bk: int, split: int) -> int:
    """``_skinny_fma_kernel``'s FLUSH for K in ``split`` slices of ``bk`` steps: 0 (one
    running sum a slice) where a slice walks at most FMA_WALK_MAX steps, else FMA_FLUSH."""
    steps = triton_support.cdiv(triton_support.cdiv(k, bk), split)
    return 0 if steps <= FMA_WALK_MAX else FMA_FLUSH


def _fma_fit(config: tuple, bm: int) -> tuple:
    """A forced config for ``_skinny_fma_kernel``: BLOCK_K cut so the block's sums stay
    within FMA_TERMS a thread (at least 1)."""
    bn, bk, split, warps, stages = config
    return bn, max(1, min(bk, FMA_TERMS * 32 * warps // (bm * bn))), split, warps, stages


def skinny_candidates(m: int, n: int, k: int, n_sm: int, elem_size: int) -> list[tuple]:
    """Autotune candidates around ``skinny_config`` (first), at most 12: BLOCK_N and
    BLOCK_K halved and doubled, the other warp count, one stage more and fewer. SPLIT_K stays
    the heuristic's (the workspace and the sum kernel depend on it; a tuned BLOCK_K keeps
    the same slices, each a different number of blocks)."""
    bn, bk, s, w, st = skinny_config(m, n, k, n_sm, elem_size)
    bm = skinny_block_m(m)
    out = [(bn, bk, s, w, st)]

    def add(bn2, bk2, w2=None, st2=None):
        if bn2 not in _SKINNY_BN or bk2 not in _SKINNY_BK:
            return
        if bk2 > max(16, triton_support.next_pow2(k)) or bn2 > max(32, triton_support.next_pow2(n)):
            return
        st2 = st2 or _skinny_stages(bm, bn2, bk2, elem_size)
        if st2 < 2 or st2 > 5 or (bm * bk2 + bk2 * bn2) * elem_size * st2 > 2 * SKINNY_SMEM:
            return
        cand = (bn2, bk2, s, w2 or _skinny_warps(bm, bn2), st2)
        if cand not in out:
            out.append(cand)

    add(bn, bk, st2=st + 1)
    add(bn, bk, st2=st - 1)
    add(bn, bk, w2=12 - w)
    add(bn // 2, bk)
    add(bn * 2, bk)
    add(bn, bk // 2)
    add(bn, bk * 2)
    add(bn // 2, bk * 2)
    add(bn * 2, bk // 2)
    add(bn // 2, bk, w2=12 - _skinny_warps(bm, bn // 2))
    add(bn, bk // 2, st2=4 if st != 4 else 5)
    return out[:12]


def skinny_configs() -> list:
    """Every (BLOCK_N, BLOCK_K, warps, stages) a candidate may take; ``skinny_prune``
    keeps the dozen ``skinny_candidates`` names for the call."""
    return [
        triton.Config({"BLOCK_N": bn, "BLOCK_K": bk}, num_warps=w, num_stages=st)
        for bn in _SKINNY_BN
        for bk in _SKINNY_BK
        for w in (4, 8)
        for st in (2, 3, 4, 5)
    ]


def skinny_prune(configs, named_args, **kwargs):
    """The configs of ``skinny_candidates`` for this call (the heuristic's first), those
    whose pipeline fits the device's shared memory."""
    a = named_args["a_ptr"]
    m, n, k = int(named_args["M"]), int(named_args["N"]), int(named_args["K"])
    elem = a.element_size()
    dev = a.device.index or 0
    limit = _max_shared(dev) if a.is_cuda else 232448
    n_sm = triton_support.sm_count(dev) if a.is_cuda else 132
    bm = kwargs["BLOCK_M"]
    by_key = {(c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"], c.num_warps, c.num_stages): c for c in configs}
    kept = []
    for bn, bk, _, w, st in skinny_candidates(m, n, k, n_sm, elem):
        c = by_key.get((bn, bk, w, st))
        if c is not None and pipeline_bytes(bm, bn, bk, elem, st) <= limit:
            kept.append(c)
    return kept or [min(configs, key=lambda c: (c.kwargs["BLOCK_N"] * c.kwargs["BLOCK_K"], c.num_stages))]


# Autotune key: BLOCK_M (M's bucket), the exact N and K (a model's weights come in a few
# fixed shapes, each called every token), SPLIT_K (the heuristic's, fixed before tuning)
# and the precision; Triton adds the dtypes. A dozen configs, ~15 s per key.
_skinny_tuned = triton.autotune(
    configs=skinny_configs(),
    key=["N", "K", "BLOCK_M", "SPLIT_K", "PRECISION"],
    prune_configs_by={"early_config_prune": skinny_prune},
)(_skinny_kernel)

# The interpreter: 32 x 32 tiles, splits as the heuristic would make for 4 SMs.
_SKINNY_CPU_SMS = 4
_SKINNY_CPU_BLOCK = 32


# --------------------------------------------------------------------------- launcher


# "x3" dots only from this K up: each product errs ~2^-22 of itself, ~4x one fp32 rounding;
# over a short K no summation error hides that (the check's fuzz fails at K = 1-31, a
# weight gradient over one row among them), and a short K is not where tensor cores pay.
X3_MIN_K = 256


# The fp32 dots of the call in progress where a backend fixes its own (triton_x3: "x3");
# None: ``kernellab.config.fp32_dots``.
_FP32_DOTS: contextvars.ContextVar[str | None] = contextvars.ContextVar("kernellab_fp32_dots", default=None)


def fp32_dots() -> str:
    """The fp32 dots in effect: the calling backend's own, else ``kernellab.config.fp32_dots``."""
    return _FP32_DOTS.get() or _options.fp32_dots


def _precision(dtype: torch.dtype, where=None, k: int | None = None) -> str:
    """PRECISION for operands of ``dtype`` launched on ``where`` (device.triton_interpreted)
    over a K of ``k`` (None: any): "x3" below X3_MIN_K falls back to "ieee"."""
    tf32 = torch.backends.cuda.matmul.allow_tf32
    prec = dot_precision(dtype, tf32, _device.triton_interpreted(where), fp32_dots())
    return "ieee" if prec == "x3" and k is not None and k < X3_MIN_K else prec


def check_batch_grid(bt: int) -> None:
    """The batch is the grid's y dimension: past 65,535 products the launch fails with
    "Triton Error [CUDA]: invalid argument". Refused clearly, as
    the CUDA backends refuse it (the interpreter on a CPU has no grid limit)."""
    if bt > GRID_YZ_LIMIT:
        raise ValueError(
            f"matmul: a batch of {bt} products exceeds the CUDA grid's y limit ({GRID_YZ_LIMIT}) "
            "of the triton backend; fold the batch into M or use backend='torch'"
        )


# Launch plans. Everything a launch derives from the call (tiles, split, grid,
# constexprs, the int arguments, whether to autotune) is a function of the operands'
# shapes, strides, dtypes and device, the bias / activation flags and the options below;
# a plan computes it once per key and binds each launch (triton_support.Bound, or
# TunedBound where the autotuner picks the config: it binds the picked config once the
# tuner holds it). A repeated call then allocates its outputs and launches: derived per
# call, the same Python costs ~20 us a launch, 3x the device time of a 128-row product.
# The key holds the exact strides: Triton specializes int arguments on == 1 and on
# divisibility by 16 (the forward's b = W.t() and the backward's dz @ W, a^T @ dz differ
# there); data pointers' 16-byte alignment is tested by the bound launches on every call.
# Traced calls (torch.compile's fake tensors) and, by default, CPU tensors (the
# interpreter: seconds a launch, the Python is noise) derive everything per call.
_PLANS: dict = {}

try:
    from torch._C import _cuda_getDevice as _current_device
except ImportError:  # pragma: no cover - CPU-only torch builds
    _current_device = None


class _Launch:
    """One launch derived for a call shape: ``kernel[grid](*args, **kw)``, or through
    ``launch_tuned`` when ``kernel`` is the autotuner (``grid`` then reads the config).
    ``check``: the positions of the arguments that come from the caller (the launch's own
    allocations are aligned), as Bound takes them. ``bind()``: the plan's launch."""

    __slots__ = ("kernel", "grid", "kw", "tuned", "check")

    def __init__(self, kernel, grid, kw: dict, tuned: bool, check: tuple[int, ...]):
        self.kernel, self.grid, self.kw, self.tuned, self.check = kernel, grid, kw, tuned, check

    def __call__(self, *args):
        if self.tuned:
            return triton_support.launch_tuned(self.kernel, self.grid, *args, **self.kw)
        return self.kernel[self.grid](*args, **self.kw)

    def bind(self):
        if self.tuned:
            return triton_support.TunedBound(self.kernel, self.grid, self.kw, self.check)
        return triton_support.Bound(self.kernel, self.grid, self.kw, self.check)


def _planned(a, plan) -> bool:
    """Whether a call takes a launch plan: real tensors (not traced); ``plan`` None asks
    ``kernellab.config.matmul_plans`` and takes plans for CUDA tensors only."""
    if type(a) is not torch.Tensor and type(a) is not torch.nn.Parameter:
        return False
    if plan is None:
        return a.is_cuda and _options.matmul_plans
    return bool(plan)


def plan_key(kind: str, a, b, bias, activation, extra=()) -> tuple:
    """The launch plan key of a call: everything the derived launch depends on (see above).
    ``kind`` names the entry point, ``extra`` its own arguments (a forced config, tune)."""
    return (
        kind,
        a.shape,
        a.stride(),
        b.shape,
        b.stride(),
        a.dtype,
        b.dtype,
        a.device,
        None if bias is None else bias.dtype,
        activation,
        # PRECISION of fp32 operands (16-bit ones ignore it; the read costs ~2 us)
        (torch.backends.cuda.matmul.allow_tf32, fp32_dots()) if a.dtype == torch.float32 else None,
        _options.triton_launch,  # Bound reads it when made
        TUNE_MIN_WORK,
        SKINNY_TUNE_MIN_BYTES,
        SKINNY_M_MAX,
        SKINNY_MIN_NK,
        SKINNY_LONG_K,
        FMA_M_MAX,
        FMA_WALK_MAX,
        FMA_COPY_MIN_M,
        X3_COPY_MIN_M,
        X3_SPLIT_MIN_WORK,
        X3_SPLIT_MIN_MN,
        FMA_PAD_MIN_WORK,
        FMA_ROW_KN,
        extra,
    )


def _plan(key, make):
    return triton_support.kept_plan(_PLANS, key, make)


def _on_device(a) -> bool:
    """True when the call must move to a's device first (the launch runs on the current one)."""
    return a.is_cuda and _current_device is not None and a.device.index != _current_device()


def _sum_launch(split: int, mn: int, n_sm: int, on_gpu: bool, has_bias: bool, activation):
    """``_split_sum_kernel`` over mn outputs of ``split`` fp32 partials (None for one slice):
    the second launch of every split-K path (skinny, FMA skinny, tiled)."""
    if split == 1:
        return None
    block = split_sum_block(mn, n_sm, on_gpu)
    kw = dict(HAS_BIAS=has_bias, ACT=_ACT[activation], SPLIT_K=split, BLOCK=block, num_warps=4)
    return _Launch(_split_sum_kernel, (triton_support.cdiv(mn, block),), kw, False, (2,))


def split_sum_block(mn: int, n_sm: int, on_gpu: bool) -> int:
    """Outputs per program of ``_split_sum_kernel`` over mn outputs: ~n_sm programs or more,
    128 to 1024 outputs each (the interpreter: 1024)."""
    return max(128, min(1024, triton_support.next_pow2(mn // n_sm))) if on_gpu else 1024


class _SkinnyPlan:
    """``triton_skinny_fwd`` derived for one call shape (``_skinny_setup``)."""

    __slots__ = ("out_shape", "m", "n", "split", "dtype", "device", "ints", "main", "sum", "sum_ints")

    def __init__(self, out_shape, m, n, split, dtype, device, ints, main, sum_, sum_ints):
        self.out_shape, self.m, self.n, self.split, self.dtype, self.device = (
            out_shape,
            m,
            n,
            split,
            dtype,
            device,
        )
        self.ints, self.main, self.sum, self.sum_ints = ints, main, sum_, sum_ints

    def bound(self) -> _SkinnyPlan:
        """This plan with its launches bound (the kept plan)."""
        return _SkinnyPlan(self.out_shape, self.m, self.n, self.split, self.dtype, self.device, self.ints,
                           self.main.bind() if self.main is not None else None,
                           self.sum.bind() if self.sum is not None else None, self.sum_ints)  # fmt: skip

    def __call__(self, a, b, bias):
        c = torch.empty((self.m, self.n), dtype=self.dtype, device=self.device)
        if self.main is not None:
            w = (
                torch.empty((self.split, self.m, self.n), dtype=torch.float32, device=self.device)
                if self.sum is not None
                else c
            )
            bias_arg = bias if bias is not None else c
            # a and b themselves: [M, K] and [K, N] views of them have the same address, and
            # the strides passed are the views' (leading dims of size 1)
            self.main(a, b, c, w, bias_arg, *self.ints)
            if self.sum is not None:
                self.sum(w, c, bias_arg, *self.sum_ints)
        return c if self.out_shape is None else c.view(self.out_shape)


def _skinny_setup(a, b, has_bias: bool, activation, config, tune) -> _SkinnyPlan:
    """The launches of ``triton_skinny_fwd`` for a's and b's shapes, strides and dtype."""
    batch = tuple(a.shape[:-2])
    # plain ints (traced under torch.compile: the graph is specialized to this shape; the
    # tile and slice choice depends on it anyway)
    m, k, n = int(a.shape[-2]), int(a.shape[-1]), int(b.shape[-1])
    if math.prod(batch) != 1 or not 1 <= m <= SKINNY_M_MAX:
        raise ValueError(
            f"matmul: the skinny kernels take one product of 1 to {SKINNY_M_MAX} rows, "
            f"got a of shape {tuple(a.shape)}"
        )
    a2 = a.reshape(m, k)  # views: the leading dims are all 1
    b2 = b.reshape(k, n)
    out_shape = None if not batch else batch + (m, n)
    if n == 0:
        return _SkinnyPlan(out_shape, m, n, 1, a.dtype, a.device, (), None, None, ())
    elem = a.element_size()
    tuned = False
    if a.dtype == torch.float32 and m <= FMA_M_MAX and _precision(a.dtype, a.device.type) in ("ieee", "x3"):
        return _fma_setup(a2, b2, m, n, k, out_shape, a, has_bias, activation, config)
    consts = dict(HAS_BIAS=has_bias, ACT=_ACT[activation], BLOCK_M=skinny_block_m(m))
    if a.is_cuda:
        dev = a.device.index
        precision = _precision(a.dtype, "cuda", k)
        consts.update(PRECISION=precision, UPCAST=False)
        n_sm = triton_support.sm_count(dev)
        if config is None:
            fma = precision == "ieee" and elem == 4
            config = _skinny_fit(skinny_config(m, n, k, n_sm, elem), consts["BLOCK_M"], elem, dev, fma)
            auto = SKINNY_TUNE_MIN_BYTES is not None and n * k * elem >= SKINNY_TUNE_MIN_BYTES
            tuned = not fma and (auto if tune is None else tune)
    else:
        consts.update(PRECISION="ieee", UPCAST=a.dtype == torch.bfloat16)
        n_sm = _SKINNY_CPU_SMS
        if config is None:
            bs = _SKINNY_CPU_BLOCK
            config = (bs, bs, _skinny_splits(m, n, k, bs, bs, n_sm, elem), 4, 1)
    bn, bk, split, warps, stages = config
    consts["SPLIT_K"] = split
    ints = (m, n, k, a2.stride(0), a2.stride(1), b2.stride(0), b2.stride(1), n, 1)
    check = (0, 1, 4)  # a, b, bias: the caller's; c and the partials are fresh
    if tuned:

        def grid(meta):
            return (triton_support.cdiv(n, meta["BLOCK_N"]), split)

        main = _Launch(_skinny_tuned, grid, consts, True, check)
    else:
        kw = dict(consts, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, num_stages=stages)
        main = _Launch(_skinny_kernel, (triton_support.cdiv(n, bn), split), kw, False, check)
    sum_ = _sum_launch(split, m * n, n_sm, a.is_cuda, has_bias, activation)
    return _SkinnyPlan(out_shape, m, n, split, a.dtype, a.device, ints, main, sum_, (m * n, n))


def _fma_setup(a2, b2, m, n, k, out_shape, a, has_bias: bool, activation, config) -> _SkinnyPlan:
    """``_skinny_setup`` for fp32 without TF32 at M <= FMA_M_MAX: ``_skinny_fma_kernel``
    with ``fma_config``'s tiles and slices (a forced ``config`` through ``_fma_fit``), then
    the slices' sum."""
    n_sm = triton_support.sm_count(a.device.index) if a.is_cuda else _SKINNY_CPU_SMS
    bm = triton_support.next_pow2(m)
    if config is None:
        bn, bk, split, warps, stages = fma_config(m, n, k, n_sm, b2.stride(1) == 1 and n > 1)
    else:
        bn, bk, split, warps, stages = _fma_fit(config, bm)
    kw = dict(HAS_BIAS=has_bias, ACT=_ACT[activation], SPLIT_K=split, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
              FLUSH=fma_flush(k, bk, split), num_warps=warps, num_stages=stages)  # fmt: skip
    ints = (m, n, k, a2.stride(0), a2.stride(1), b2.stride(0), b2.stride(1), n, 1)
    main = _Launch(_skinny_fma_kernel, (triton_support.cdiv(n, bn), split), kw, False, (0, 1, 4))
    sum_ = _sum_launch(split, m * n, n_sm, a.is_cuda, has_bias, activation)
    return _SkinnyPlan(out_shape, m, n, split, a.dtype, a.device, ints, main, sum_, (m * n, n))


class _GeneralPlan:
    """``triton_general_fwd`` derived for one call shape (``_general_setup``). With ``split``
    > 1 the tiled kernel writes fp32 partials [split, Bt, M, N] and ``sum`` adds them. With
    ``pad`` (Mp, Np, Kp) it runs on zero-padded copies of a, b (and the bias) and returns
    the [M, N] corner of its [Mp, Np] output (see FMA_PAD_MIN_WORK)."""

    __slots__ = ("out_shape", "shape", "dtype", "device", "a3", "b3", "ints", "main", "split", "sum", "pad",
                 "b_k_inner", "presplit")  # fmt: skip

    def __init__(self, out_shape, shape, dtype, device, a3, b3, ints, main, split=1, sum_=None, pad=None,
                 b_k_inner=False, presplit=False):  # fmt: skip
        self.out_shape, self.shape, self.dtype, self.device = out_shape, shape, dtype, device
        self.a3, self.b3, self.ints, self.main = a3, b3, ints, main
        self.split, self.sum, self.pad, self.b_k_inner = split, sum_, pad, b_k_inner
        self.presplit = presplit

    def bound(self) -> _GeneralPlan:
        main = self.main.bind() if self.main is not None else None
        sum_ = self.sum.bind() if self.sum is not None else None
        return _GeneralPlan(self.out_shape, self.shape, self.dtype, self.device, self.a3, self.b3, self.ints,
                            main, self.split, sum_, self.pad, self.b_k_inner, self.presplit)  # fmt: skip

    def __call__(self, a, b, bias):
        if self.pad is not None:
            return self._padded(a, b, bias)
        c = torch.empty(self.shape, dtype=self.dtype, device=self.device)
        if self.main is not None:
            # a [..., M, K] as [bt, M, K]: a itself where that is a view (the same address;
            # the strides passed are the view's), else a contiguous copy (reshape's, or
            # b's made N-inner for FMA dots, K-inner for x3 dots)
            a3 = a if self.a3 is None else a.reshape(self.a3).contiguous()
            if self.b_k_inner:  # b [bt, K, N] copied K-inner (X3_COPY_MIN_M)
                b3 = b.reshape(self.b3).transpose(1, 2).contiguous().transpose(1, 2)
            else:
                b3 = b if self.b3 is None else b.reshape(self.b3).contiguous()
            self._run(a3, b3, c, bias)
        return c if self.out_shape is None else c.view(self.out_shape)

    def _run(self, a3, b3, c, bias):
        if self.sum is None:
            self.main(a3, b3, c, bias if bias is not None else c, *self.ints)
        else:
            w = torch.empty((self.split, *c.shape), dtype=torch.float32, device=self.device)
            self.main(a3, b3, w, w, *self.ints)
            self.sum(w, c, bias if bias is not None else c, c.numel(), c.shape[2])

    def _padded(self, a, b, bias):
        """The product on [bt, Mp, Kp] and [bt, Kp, Np] operands, its [M, N] corner
        returned: zero-padded copies of a and b, or with ``presplit`` ("x3s") their heads
        and rests (``_tf32_split_kernel``) in buffers [2, bt, Mp, Kp] and [2, bt, Np, Kp]."""
        bt, m, n = self.shape
        mp, np_, kp = self.pad
        k = a.shape[-1]
        if self.presplit:  # (b K-inner)
            abuf = torch.empty((2, bt, mp, kp), dtype=torch.float32, device=self.device)
            bbuf = torch.empty((2, bt, np_, kp), dtype=torch.float32, device=self.device)
            a3, b3 = abuf[0], bbuf[0].transpose(1, 2)
            _split_tf32(a.reshape(bt, m, k), a3, mp, kp)
            _split_tf32(b.reshape(bt, k, n), b3, kp, np_)
        else:
            a3 = torch.nn.functional.pad(a.reshape(bt, m, k), (0, kp - k, 0, mp - m))
            if self.b_k_inner:  # [bt, Kp, Np] with K the unit stride
                b3 = torch.nn.functional.pad(b.reshape(bt, k, n).transpose(1, 2), (0, kp - k, 0, np_ - n))
                b3 = b3.transpose(1, 2)
            else:
                b3 = torch.nn.functional.pad(b.reshape(bt, k, n), (0, np_ - n, 0, kp - k))
        if bias is not None and np_ != n:
            bias = torch.nn.functional.pad(bias, (0, np_ - n))
        cp = torch.empty((bt, mp, np_), dtype=self.dtype, device=self.device)
        self._run(a3, b3, cp, bias)
        c = cp[:, :m, :n].contiguous() if (mp, np_) != (m, n) else cp
        return c if self.out_shape is None else c.view(self.out_shape)


# fp32 FMA dots (TF32 off) where some dim or stride is off a multiple of 4 elements (ALIGN 1:
# every load one element wide, no cp.async pipeline): from this much work (bt*M*N*K) the
# product runs on zero-padded copies (every dim rounded up to 4, contiguous) and the output
# is cut back. H100: 4097x4095x1023 0.99 ms with the copies (the padded product alone
# 0.89) against 2.05 as given; 4097x4095x4096 3.69 against 7.85. x3 dots likewise (1.43 ms
# as given at 4097x4095x1023), b padded K-inner.
FMA_PAD_MIN_WORK = TUNE_MIN_WORK


# ``_tf32_split_kernel``'s tile
SPLIT_BLOCK = 64


def _split_tf32(x3: torch.Tensor, head: torch.Tensor, rp: int, cp: int) -> None:
    """Write x3 [bt, R, C] split into TF32 heads at ``head`` (a [bt, RP, CP] view, any
    strides; zeros past R, C) and rests one operand's buffer further (``_GeneralPlan``'s
    [2, ...] buffers: head is their [0])."""
    bt, r, c = x3.shape
    lo = bt * rp * cp
    blk = SPLIT_BLOCK if x3.is_cuda else 16
    grid = (triton_support.cdiv(rp, blk) * triton_support.cdiv(cp, blk), bt)
    _tf32_split_kernel[grid](x3, head, r, c, rp, cp, *x3.stride(), *head.stride(), lo,
                             BLOCK_R=blk, BLOCK_C=blk, num_warps=4)  # fmt: skip


def fma_pad(elem: int, bt: int, m: int, n: int, k: int, strides, fma: bool) -> tuple | None:
    """(Mp, Np, Kp) the tiled kernel's fp32 product (FMA or x3 dots: ``fma``) pads to (each
    a multiple of 16 // elem), or None: not ``fma``, below FMA_PAD_MIN_WORK, already aligned
    (``align_of`` > 1), or an operand expanded over the batch (``strides`` are a's and b's
    (batch, row, column) strides: a batch stride of 0 would be copied bt times).
    Pure: a function of its arguments."""
    v = max(1, 16 // elem)
    if not fma or bt * m * n * k < FMA_PAD_MIN_WORK or align_of(elem, (m, n, k), strides) > 1:
        return None
    if bt > 1 and 0 in (strides[0], strides[3]):
        return None
    return tuple(-(-d // v) * v for d in (m, n, k))


def _as_3d(t, shape):
    """(strides of t as ``shape``, None) where t views as ``shape``, else (the strides of
    a contiguous copy, ``shape``: the launch copies it so). ``view`` decides, from shape and
    strides alone, so eager and traced calls (torch.compile's functional tensors) agree."""
    try:
        return t.view(shape).stride(), None
    except RuntimeError:
        _, r, c = shape
        return (max(r, 1) * max(c, 1), max(c, 1), 1), shape


def align_of(element_size: int, dims, strides) -> int:
    """``_matmul_kernel``'s ALIGN: the elements in 16 bytes where every one of ``dims`` (M,
    N, K) and every stride other than a unit one is a multiple of that many, else 1.
    (Where they are multiples of 16 Triton sees it itself; at 3000 or 1000 it does not,
    and the hint turns one-element loads into 16-byte cp.async copies, sm_90 PTX.)"""
    v = max(1, 16 // element_size)
    ok = all(d % v == 0 for d in dims) and all(s == 1 or s % v == 0 for s in strides)
    return v if ok else 1


def _general_setup(a, b, has_bias: bool, activation) -> _GeneralPlan:
    """The launch of ``triton_general_fwd`` for a's and b's shapes, strides and dtype."""
    batch = tuple(a.shape[:-2])
    m, k = a.shape[-2], a.shape[-1]
    n = b.shape[-1]
    bt = math.prod(batch)
    out_shape = None if batch == (bt,) else batch + (m, n)
    if not (bt and m and n):
        return _GeneralPlan(out_shape, (bt, m, n), a.dtype, a.device, None, None, (), None)
    sa, a3 = _as_3d(a, (bt, m, k))
    sb, b3 = _as_3d(b, (bt, k, n))
    on_gpu = a.device.type == "cuda"
    if k == 1:
        return _outer_setup(a, out_shape, (bt, m, n), sa, sb, a3, b3, has_bias, activation, on_gpu)
    # c: fresh [bt, M, N], contiguous strides as torch makes them (sizes of 0 count as 1)
    sc = (max(m, 1) * max(n, 1), max(n, 1), 1)
    n_sm = triton_support.sm_count(a.device.index) if on_gpu else _SKINNY_CPU_SMS
    prec = _precision(a.dtype, a.device.type, k)
    # the interpreter's fp32 dots are exact (FMA-like in cost): "x3" runs its split arithmetic
    # and plans as on a GPU
    x3 = prec == "x3"
    fma = a.dtype == torch.float32 and not x3 and (not on_gpu or prec == "ieee")
    fma64 = fma and fma64_applies(bt, m, n, k)  # (below TUNE_MIN_WORK: the untuned launch)
    # b's layout copies (x3: K-inner, FMA: N-inner) skip a b expanded over the batch, whose
    # copy would hold the batch's worth of one weight
    b_copyable = bt == 1 or sb[0] != 0
    x3_copy = x3 and sb[2] == 1 and n > 1 and m >= X3_COPY_MIN_M and b_copyable
    pad = fma_pad(a.element_size(), bt, m, n, k, (*sa, *sb), fma or x3)
    wide = m * n >= X3_SPLIT_MIN_MN * (m + n)
    presplit = x3 and bt * m * n * k >= X3_SPLIT_MIN_WORK and (pad is not None or wide)
    presplit = presplit and b_copyable and (bt == 1 or sa[0] != 0)
    if presplit:
        # "x3s": the kernel runs on split copies, padded to multiples of 4, b K-inner
        m0, n0 = m, n
        m, n, k = pad = tuple(-(-d // 4) * 4 for d in (m, n, k))
        sa, sb, sc = (m * k, k, 1), (k * n, 1, k), (m * n, n, 1)
        prec = "x3s"
    elif pad is not None:
        # the kernel runs on zero-padded copies (a row-major, b N-inner for FMA dots and
        # K-inner for x3 ones, see X3_COPY_MIN_M): their dims and strides
        m0, n0 = m, n
        m, n, k = pad
        sa, sb = (m * k, k, 1), ((k * n, 1, k) if x3 else (k * n, n, 1))
        sc = (m * n, n, 1)
    elif x3_copy:
        # b copied K-inner (see X3_COPY_MIN_M)
        sb, b3 = (k * n, 1, k), (bt, k, n)
    elif fma and sb[2] != 1 and m >= FMA_COPY_MIN_M and b_copyable:
        # b copied N-inner (see FMA_COPY_MIN_M)
        sb, b3 = (k * n, n, 1), (bt, k, n)
    ints = (m, n, k, *sa, *sb, *sc, *_tune_keys(m, n, k))
    split = general_split(m, n, k, bt, n_sm, fma)
    # with K slices the epilogue runs in the sum of the partials
    consts = dict(HAS_BIAS=has_bias and split == 1, ACT=_ACT[activation] if split == 1 else 0, SPLIT_K=split)
    # "x3s": the rests, the second half of each [2, ...] buffer; 0 elsewhere
    consts.update(A_LO=bt * m * k if presplit else 0, B_LO=bt * n * k if presplit else 0)
    check = (0, 1, 3)  # a, b, bias: the caller's; c is fresh
    if on_gpu:
        check_batch_grid(bt)
        consts.update(PRECISION=prec, UPCAST=False,
                      ALIGN=align_of(a.element_size(), (m, n, k), (*sa, *sb)),
                      A_K_INNER=sa[2] == 1, B_N_INNER=sb[2] == 1)  # fmt: skip

        def grid(meta):
            tiles = triton_support.cdiv(m, meta["BLOCK_M"]) * triton_support.cdiv(n, meta["BLOCK_N"])
            return (tiles, bt, split)

        if bt * m * n * k >= TUNE_MIN_WORK:
            main = _Launch(_matmul_tuned, grid, consts, True, check)
        else:
            shared = _max_shared(a.device.index)
            cfg = small_config(m, n, k, bt, a.element_size(), consts["PRECISION"], shared)
            kw = dict(consts, **cfg)
            if fma64:  # (small_config picks FMA tiles by "ieee")
                kw["PRECISION"] = "ieee64"
            main = _Launch(_matmul_kernel, tuple(grid(kw)), kw, False, check)
    else:
        prec_cpu = prec if presplit else "x3" if x3 else "ieee64" if fma64 else "ieee"
        # (ALIGN 1: no alignment assumed, the layout flags then unread)
        consts.update(PRECISION=prec_cpu, UPCAST=a.dtype == torch.bfloat16, ALIGN=1, A_K_INNER=True,
                      B_N_INNER=True)  # fmt: skip
        kw = dict(consts, **_CPU_CONFIG, num_warps=4)
        grid = (triton_support.cdiv(m, kw["BLOCK_M"]) * triton_support.cdiv(n, kw["BLOCK_N"]), bt, split)
        main = _Launch(_matmul_kernel, grid, kw, False, check)
    sum_ = _sum_launch(split, bt * m * n, n_sm, on_gpu, has_bias, activation)
    if pad is not None:
        shape = (bt, m0, n0)
        return _GeneralPlan(out_shape, shape, a.dtype, a.device, None, None, ints, main, split, sum_, pad, x3,
                            presplit)  # fmt: skip
    shape = (bt, m, n)
    return _GeneralPlan(out_shape, shape, a.dtype, a.device, a3, b3, ints, main, split, sum_, None, x3_copy)


# ``_outer_kernel``'s tile: 4096 outputs a program (32 a thread at 4 warps), rows of 512
# so that a warp's stores cover 128 contiguous bytes of a row or more in any dtype.
OUTER_BLOCK_M, OUTER_BLOCK_N = 8, 512


def _outer_setup(a, out_shape, shape, sa, sb, a3, b3, has_bias: bool, activation, on_gpu: bool):
    """The launch of a K = 1 product (``_outer_kernel``): exact products, one rounding, as
    any dot of one term; the bias and activation as the tiled kernel's epilogue."""
    bt, m, n = shape
    if on_gpu:
        check_batch_grid(bt)
    bm, bn = (OUTER_BLOCK_M, OUTER_BLOCK_N) if on_gpu else (16, 64)
    kw = dict(HAS_BIAS=has_bias, ACT=_ACT[activation], BLOCK_M=bm, BLOCK_N=bn, num_warps=4)
    grid = (triton_support.cdiv(m, bm) * triton_support.cdiv(n, bn), bt)
    main = _Launch(_outer_kernel, grid, kw, False, (0, 1, 3))
    return _GeneralPlan(out_shape, shape, a.dtype, a.device, a3, b3, (m, n, sa[0], sa[1], sb[0], sb[2]), main)


def triton_matmul_fwd(
    a: torch.Tensor, b: torch.Tensor, bias=None, activation=None, *, plan=None
) -> torch.Tensor:
    """act(a @ b + bias) for [..., M, K] @ [..., K, N] (any strides); a fresh contiguous output.
    On a GPU, one product of at most SKINNY_M_MAX rows against a weight of SKINNY_MIN_NK
    elements or more takes the skinny kernels (``triton_skinny_fwd``); K = 1 the outer
    product kernel; everything else, and every other CPU launch, the tiled kernel
    (``triton_general_fwd``). ``plan``: take a
    launch plan (True), derive every launch per call (False), or None: plans for CUDA
    tensors when ``kernellab.config.matmul_plans`` (the default)."""
    if _planned(a, plan):
        if _on_device(a):  # launch in the tensors' device context
            with torch.cuda.device(a.device.index):
                return triton_matmul_fwd(a, b, bias, activation, plan=plan)

        def make():
            if a.is_cuda and skinny_applies(a, b):
                return _skinny_setup(a, b, bias is not None, activation, None, None).bound()
            return _general_setup(a, b, bias is not None, activation).bound()

        return _plan(plan_key("f", a, b, bias, activation), make)(a, b, bias)
    if a.is_cuda and skinny_applies(a, b):
        return triton_skinny_fwd(a, b, bias, activation, plan=False)
    return triton_general_fwd(a, b, bias, activation, plan=False)


def long_k_small_output(m: int, n: int, k: int) -> bool:
    """K of SKINNY_LONG_K or more over an output of fewer than SMALL_MIN_PROGRAMS tiles of
    SMALL_TILE x SMALL_TILE (small_config's)."""
    tiles = triton_support.cdiv(m, SMALL_TILE) * triton_support.cdiv(n, SMALL_TILE)
    return k >= SKINNY_LONG_K and tiles < SMALL_MIN_PROGRAMS


def skinny_applies(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``triton_matmul_fwd`` gives a @ b to the skinny kernels (device aside)."""
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    weight = n * k >= SKINNY_MIN_NK or long_k_small_output(m, n, k)
    return 0 < m <= SKINNY_M_MAX and k > 1 and weight and math.prod(a.shape[:-2]) == 1


def triton_skinny_fwd(
    a: torch.Tensor, b: torch.Tensor, bias=None, activation=None, config=None, tune=None, *, plan=None
) -> torch.Tensor:
    """act(a @ b + bias) for a [..., M, K] @ b [..., K, N] with 1 <= M <= SKINNY_M_MAX and
    one product (leading dims of size 1): ``_skinny_kernel`` over N tiles x K slices, and
    with more than one slice ``_split_sum_kernel`` adding the fp32 partials in order. Any
    strides; a fresh contiguous output.

    ``config``: (BLOCK_N, BLOCK_K, SPLIT_K, num_warps, num_stages) to launch (a benchmark
    or a test forcing one); None: ``skinny_config``'s, autotuned among
    ``skinny_candidates`` for weights of SKINNY_TUNE_MIN_BYTES and up unless ``tune`` is
    False (``tune`` True tunes any size); fp32 with TF32 off takes ``_skinny_fma_kernel``
    up to FMA_M_MAX rows (``fma_config``; a given config through ``_fma_fit``), past it
    BLOCK_K <= 32 and no tuning (FMA dots, as the tiled kernel). A given config launches as
    given. CPU tensors run under the interpreter with 32 x 32 tiles and the splits of a
    4-SM device.
    ``plan``: as ``triton_matmul_fwd``'s."""
    if _on_device(a):  # launch in the tensors' device context
        with torch.cuda.device(a.device.index):
            return triton_skinny_fwd(a, b, bias, activation, config, tune, plan=plan)
    has_bias = bias is not None
    if _planned(a, plan):
        config = tuple(config) if config is not None else None
        key = plan_key("s", a, b, bias, activation, (config, tune))
        p = _plan(key, lambda: _skinny_setup(a, b, has_bias, activation, config, tune).bound())
    else:
        p = _skinny_setup(a, b, has_bias, activation, config, tune)
    return p(a, b, bias)


def _skinny_fit(config: tuple, bm: int, elem: int, dev: int, fma: bool) -> tuple:
    """``config`` with fewer stages where its pipeline exceeds the device's shared memory
    (SKINNY_SMEM assumes an H100's); for fp32 FMA dots (TF32 off), BLOCK_K <= 32 as the
    tiled kernel's pruning keeps it (an FMA dot holds its operands' K slices in registers)."""
    bn, bk, split, warps, stages = config
    if fma:
        bk = min(bk, 32)
    max_shared = _max_shared(dev)
    while stages > 2 and pipeline_bytes(bm, bn, bk, elem, stages) > max_shared:
        stages -= 1
    return bn, bk, split, warps, stages


def triton_general_fwd(
    a: torch.Tensor, b: torch.Tensor, bias=None, activation=None, *, plan=None
) -> torch.Tensor:
    """act(a @ b + bias) through the tiled kernel (``_matmul_kernel``) at every shape.
    ``plan``: as ``triton_matmul_fwd``'s."""
    if _on_device(a):  # launch in the tensors' device context
        with torch.cuda.device(a.device.index):
            return triton_general_fwd(a, b, bias, activation, plan=plan)
    has_bias = bias is not None
    if _planned(a, plan):
        p = _plan(
            plan_key("g", a, b, bias, activation), lambda: _general_setup(a, b, has_bias, activation).bound()
        )
    else:
        p = _general_setup(a, b, has_bias, activation)
    return p(a, b, bias)


matmul_triton = matmul_op("matmul_triton", triton_matmul_fwd, triton=True)


def triton_x3_matmul_fwd(a: torch.Tensor, b: torch.Tensor, bias=None, activation=None) -> torch.Tensor:
    """``triton_matmul_fwd`` with fp32 products as three TF32 tensor-core dots ("x3", from
    K = X3_MIN_K) whatever ``kernellab.config.fp32_dots`` says: the triton_x3 backend.
    fp32 only (x3 dots are a way of computing fp32 products)."""
    if a.dtype != torch.float32:
        raise TypeError(f"matmul (triton_x3): a has dtype {a.dtype}; expected fp32 (x3 dots are fp32's)")
    token = _FP32_DOTS.set("x3")
    try:
        return triton_matmul_fwd(a, b, bias, activation)
    finally:
        _FP32_DOTS.reset(token)


# An opaque custom op (as the CUDA backends are), not a triton_op: under AOT tracing of the
# launcher's body the gradients differed from eager ones (opcheck, H100), so torch.compile
# calls the launcher as eager code does.
matmul_triton_x3 = matmul_op("matmul_triton_x3", triton_x3_matmul_fwd)


def _kernel_specs(dtype: str):
    """For `kernellab asm`: the tiled kernel as the tuner usually picks it at 4096^3 on an
    H100 (fp16/bf16: 128x256x64, 8 warps; fp32 with TF32 off: 128x128x32, 4 warps),
    contiguous operands (unit inner strides, which Triton specializes as the constant 1 at
    run time); then the skinny kernel (``_skinny_spec``)."""
    half = dtype in ("fp16", "bf16")
    cx = {"HAS_BIAS": False, "ACT": 0, "PRECISION": "tf32" if half else "ieee", "UPCAST": False, "GROUP_M": 8}
    cx.update(
        {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64}
        if half
        else {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32}
    )
    cx.update({"s_ak": 1, "s_bn": 1, "s_cn": 1})
    sig = {"a_ptr": f"*{dtype}", "b_ptr": f"*{dtype}", "c_ptr": f"*{dtype}", "bias_ptr": f"*{dtype}"}
    for p in (
        "M",
        "N",
        "K",
        "M_KEY",
        "N_KEY",
        "K_KEY",
        "s_ab",
        "s_am",
        "s_ak",
        "s_bb",
        "s_bk",
        "s_bn",
        "s_cb",
        "s_cm",
        "s_cn",
    ):
        sig[p] = "constexpr" if p in cx else "i32"
    for p in ("HAS_BIAS", "ACT", "PRECISION", "UPCAST", "BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "ALIGN",
              "A_K_INNER", "B_N_INNER", "SPLIT_K"):  # fmt: skip
        sig[p] = "constexpr"
    sig.update(A_LO="i32", B_LO="i32")  # ("x3s" only: 0 in every other launch)
    # (every dim and stride a multiple of 16 here: Triton's own specialization, no hints)
    cx.update(ALIGN=1, A_K_INNER=True, B_N_INNER=True, SPLIT_K=1)
    skinny = _skinny_spec(dtype)
    # warps and stages of the first candidate config with this tile
    tile = {k: cx[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")}
    warps = 8 if half else 4
    c = next(c for c in matmul_configs() if c.kwargs == tile and c.num_warps == warps)
    return [(_matmul_kernel, sig, cx, {"num_warps": c.num_warps, "num_stages": c.num_stages}), skinny]


def _x3_kernel_specs(dtype: str):
    """For `kernellab asm`: triton_x3's tiled kernel at 4096^3 (fp32, 128x128x32, 4 warps)
    with b K-inner, as it runs there: on operands split ahead ("x3s", from
    X3_SPLIT_MIN_WORK) by ``_tf32_split_kernel``, and below that work with "x3" dots
    splitting in registers; other dtypes as triton's."""
    specs = _kernel_specs(dtype)
    if dtype != "fp32":
        return specs
    kernel, sig, cx, launch = specs[0]
    sig = dict(sig, s_bn="i32", s_bk="constexpr")
    cx = {k: v for k, v in cx.items() if k != "s_bn"}
    cx.update(PRECISION="x3", s_bk=1, B_N_INNER=False)
    split_cx = dict(cx, PRECISION="x3s", ALIGN=4)
    tf32 = {"x_ptr": "*fp32", "out_ptr": "*fp32", "s_xc": "constexpr", "s_oc": "constexpr"}
    tf32.update({n: "i32" for n in ("R", "C", "RP", "CP", "s_xb", "s_xr", "s_ob", "s_or", "LO")})
    tf32.update(BLOCK_R="constexpr", BLOCK_C="constexpr")
    tf32_cx = dict(s_xc=1, s_oc=1, BLOCK_R=SPLIT_BLOCK, BLOCK_C=SPLIT_BLOCK)
    return [(kernel, sig, split_cx, launch), (_tf32_split_kernel, tf32, tf32_cx, {"num_warps": 4}),
            (kernel, sig, cx, launch)]  # fmt: skip


def _skinny_spec(dtype: str):
    """The skinny kernel as it runs for decode, [1, 4096] @ [4096, 4096] with b = weight.t()
    (unit stride along K) on 132 SMs: 16-bit, ``_skinny_kernel`` as ``skinny_config`` picks
    it (BLOCK_M 16); fp32 (TF32 off), ``_skinny_fma_kernel`` as ``fma_config`` does."""
    sig = {n: f"*{dtype}" for n in ("a_ptr", "b_ptr", "c_ptr", "bias_ptr")}
    sig["w_ptr"] = "*fp32"
    if dtype == "fp32":
        bn, bk, split, warps, stages = fma_config(1, 4096, 4096, 132)
        cx = {"HAS_BIAS": False, "ACT": 0, "SPLIT_K": split, "BLOCK_M": 1, "BLOCK_N": bn, "BLOCK_K": bk,
              "FLUSH": fma_flush(4096, bk, split)}  # fmt: skip
        kernel = _skinny_fma_kernel
    else:
        bn, bk, split, warps, stages = skinny_config(1, 4096, 4096, 132, 2)
        cx = {"HAS_BIAS": False, "ACT": 0, "PRECISION": "tf32", "UPCAST": False}
        cx.update({"SPLIT_K": split, "BLOCK_M": 16, "BLOCK_N": bn, "BLOCK_K": bk})
        kernel = _skinny_kernel
    cx.update({"s_ak": 1, "s_bk": 1, "s_cn": 1})
    for p in ("M", "N", "K", "s_am", "s_ak", "s_bk", "s_bn", "s_cm", "s_cn"):
        sig[p] = "constexpr" if p in cx else "i32"
    for p in ("HAS_BIAS", "ACT", "PRECISION", "UPCAST", "SPLIT_K", "BLOCK_M", "BLOCK_N", "BLOCK_K", "FLUSH"):
        if p in cx:
            sig[p] = "constexpr"
    return (kernel, sig, cx, {"num_warps": warps, "num_stages": stages})


register_builtin(
    "matmul",
    "triton",
    matmul_triton,
    "Triton: autotuned tiles, grouped program order, fused bias/activation",
    triton_kernels=_kernel_specs,
    double_backward=True,  # _autograd.matmul_op: the backward's matmuls are the custom op
)
register_builtin(
    "matmul",
    "triton_x3",
    matmul_triton_x3,
    "Triton, fp32 as three TF32 tensor-core dots (3xTF32): fp32 accuracy at tensor-core speed",
    triton_kernels=_x3_kernel_specs,
    dtypes=(torch.float32,),
    double_backward=True,
)
