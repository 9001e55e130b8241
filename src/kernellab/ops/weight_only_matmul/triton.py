"""Weight-only matmuls in Triton: kernels, configs, launcher, registration.

Two kernels chosen by M (rows of x), and a third for int8 that GPU plans may name, all
reading the quantized weight exactly once per M tile and dequantizing it in registers (the
scale is applied once per output, after the K sum):

- ``_wo_gemv_kernel`` (M = 1, decode): a program owns BLOCK_N output channels and walks K
  in BLOCK_K steps; the weight tile [BLOCK_N, BLOCK_K] is contiguous along K, so each
  thread loads 16 bytes (16 int8 or 32 int4 weights) at a time. Products go into an fp32
  [BLOCK_N, BLOCK_K] accumulator and are reduced over K once at the end (no shuffles in
  the loop). Napkin math, 4096 x 14336 int8 on an H200: 58.7 MB at ~4.5 TB/s = 13 us
  against 26 us for the bf16 weight.
- ``_wo_dot_kernel`` (M >= 2): tiles [BLOCK_M, BLOCK_N] with ``tl.dot``; the int8 tile is
  converted to x's 16-bit dtype (exact: |q| <= 127) and fed to the tensor cores. At
  M = 16 the FMAs on CUDA cores would be 16 per weight byte (~77 T/s at 4.8 TB/s, above
  the H200's ~34 T/s fp32 FMA rate): the tensor cores keep it memory-bound. BLOCK_M is 16
  up to M = 16 (decode), 32-128 above.
- ``_wo_tma_kernel`` (int8, 16-bit x, any M in tiles of 16; a candidate, run when a
  ``TRITON_PLANS`` entry has kind "tma"): the dot kernel's tiles, but the weight tile
  [BLOCK_N, BLOCK_K] arrives by TMA (``tl.make_tensor_descriptor``; mbarriers, and
  ``num_stages`` - 1 tiles in flight), as bf16 cuBLAS's decode GEMV streams its weight
  (measured 72-76% of DRAM peak on an H200, against 46-55% for register loads). The
  product is computed transposed, acc^T [BLOCK_N, 16] = W x^T: the converted weight is
  wgmma's register operand (m64 per warpgroup) and x^T its shared-memory one, so the int8
  tile goes shared -> registers -> tensor cores once. Deep pipelines: 64 x 256 int8 tiles
  with 6 stages keep 5 x 16 KB of weight in flight per program (131 KB of shared memory
  with x's tiles). TMA needs K % 16 == 0 (the row
  pitch) and a 16-byte aligned weight; elsewhere the launcher runs ``_wo_dot_kernel``
  with the same tiles. ``TMA=False`` is the same body with pointer loads ("tma_ptr").

int4: byte j of a row holds k = 2j (low nibble) and 2j + 1 (high nibble). Rather than
interleave the nibbles back into K order, x is read as its even and odd columns (x is
tiny and cached) and each half of the weight meets its own half of x: two products.

Split-K: where the N tiles alone leave SMs idle (N = 4096 with K = 14336: 256 tiles of
16 for 132 SMs), K is cut into slices; slices write fp32 partials [slices, M, N] and
``_wo_reduce_kernel`` adds them in slice order (deterministic) with scale and bias. At
M = 16 wide N tiles matter as much: each program reads its [16, K] rows of x, 32 bytes
per K value, against BLOCK_N bytes of weight, so BLOCK_N = 16 moves twice as many x bytes
(from L2) as weight bytes; 64-128 wide tiles with K slices keep x at 1/4-1/2.

fp32 x (not the use, but supported): products and sums in fp64 (int -> fp64 and
fp32 -> fp64 are exact), partials in fp64, one rounding at the end. An fp32 dot on the GPU
sums each output along K in one FMA chain (256 terms a step), whose error grows ~sqrt(K)
ulps and can pass twice that of cuBLAS's blocked sums (the check's bound).

GPU launches for M <= 16 come from ``TRITON_PLANS`` (by kernel and weight shape class; a
plan of kind "tma" runs ``_wo_tma_kernel`` for its class), written from
lab/gpu_quant_sweep.py's winners; M > 16 from a rule in ``wo_config``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import triton.language as tl

from kernellab import triton_support
from kernellab.ops._register import register_builtin
from kernellab.ops.weight_only_matmul._autograd import wo_op


@triton_support.jit
def _wo_gemv_kernel(
    x_ptr,  # [M, K] contiguous; one row per program (M = 1 for 16-bit x, any M for fp32)
    w_ptr,  # [N, K * BITS / 8] row-major: int8 (BITS 8) or packed uint8 (BITS 4)
    s_ptr,  # [N] fp32 scales
    b_ptr,  # [N] bias in y's dtype (HAS_BIAS)
    y_ptr,  # [M, N] output
    p_ptr,  # [SPLIT_K, M, N] fp32 (fp64 for ACC64) partials (SPLIT_K > 1)
    M,
    N,
    K,
    K_SPLIT,  # K per slice, a multiple of BLOCK_K
    BITS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    PARTIAL: tl.constexpr,  # K is sliced: write partial sums to p_ptr, not y
    ACC64: tl.constexpr,  # fp32 x: fp64 products and sums
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,  # weights (not bytes) per step
    EVEN_K: tl.constexpr,  # K % BLOCK_K == 0 (K_SPLIT always is): no mask in the loop
):
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // num_n
    pid_n = pid % num_n
    x_ptr += pid_m.to(tl.int64) * K
    y_ptr += pid_m.to(tl.int64) * N
    p_ptr += (pid_k.to(tl.int64) * M + pid_m) * N
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    # rows past N are wrapped for the loads (stores are masked): the loop's loads then
    # need no mask at all when EVEN_K, and stay 16-byte vectors
    row_n = (offs_n % N).to(tl.int64)
    k_lo = pid_k * K_SPLIT
    k_hi = tl.minimum(K, k_lo + K_SPLIT)
    acc_ty = tl.float64 if ACC64 else tl.float32
    if BITS == 8:
        row = row_n * K
        acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=acc_ty)
        for k0 in range(k_lo, k_hi, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            if EVEN_K:
                x = tl.load(x_ptr + offs_k).to(acc_ty)
                w = tl.load(w_ptr + row[:, None] + offs_k[None, :])
            else:
                k_mask = offs_k < k_hi
                x = tl.load(x_ptr + offs_k, mask=k_mask, other=0.0).to(acc_ty)
                w = tl.load(w_ptr + row[:, None] + offs_k[None, :], mask=k_mask[None, :], other=0)
            acc += w.to(acc_ty) * x[None, :]
    else:
        row = row_n * (K // 2)
        acc = tl.zeros((BLOCK_N, BLOCK_K // 2), dtype=acc_ty)
        for k0 in range(k_lo, k_hi, BLOCK_K):
            offs_j = k0 // 2 + tl.arange(0, BLOCK_K // 2)  # byte j holds k = 2j, 2j + 1
            if EVEN_K:
                xe = tl.load(x_ptr + 2 * offs_j).to(acc_ty)
                xo = tl.load(x_ptr + 2 * offs_j + 1).to(acc_ty)
                b = tl.load(w_ptr + row[:, None] + offs_j[None, :])
            else:
                j_mask = offs_j < k_hi // 2
                xe = tl.load(x_ptr + 2 * offs_j, mask=j_mask, other=0.0).to(acc_ty)
                xo = tl.load(x_ptr + 2 * offs_j + 1, mask=j_mask, other=0.0).to(acc_ty)
                b = tl.load(w_ptr + row[:, None] + offs_j[None, :], mask=j_mask[None, :], other=0)
            b = b.to(tl.int32)
            lo = ((b & 15) ^ 8) - 8  # sign-extend the 4-bit two's complement nibbles
            hi = ((b >> 4) ^ 8) - 8
            acc += lo.to(acc_ty) * xe[None, :] + hi.to(acc_ty) * xo[None, :]
    part = tl.sum(acc, axis=1)
    if not PARTIAL:
        y = part * tl.load(s_ptr + offs_n, mask=n_mask, other=0.0).to(acc_ty)
        if HAS_BIAS:
            y += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(acc_ty)
        tl.store(y_ptr + offs_n, y.to(y_ptr.dtype.element_ty), mask=n_mask)
    else:
        tl.store(p_ptr + offs_n, part.to(p_ptr.dtype.element_ty), mask=n_mask)


@triton_support.jit
def _wo_dot_kernel(
    x_ptr,  # [M, K] contiguous, fp16/bf16
    w_ptr,  # [N, K * BITS / 8] row-major
    s_ptr,  # [N] fp32
    b_ptr,  # [N] (HAS_BIAS)
    y_ptr,  # [M, N]
    p_ptr,  # [slices, M, N] fp32 partials (PARTIAL)
    M,
    N,
    K,
    K_SPLIT,
    BITS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    PARTIAL: tl.constexpr,
    UPCAST: tl.constexpr,  # interpreter, bf16 x: fp32 dots (its bf16 dot is wrong)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,  # K % BLOCK_K == 0: no mask in the loop (rows wrapped, as in gemv)
):
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // num_n  # consecutive programs: neighbouring N tiles of the same rows
    pid_n = pid % num_n
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < M
    n_mask = offs_n < N
    k_lo = pid_k * K_SPLIT
    k_hi = tl.minimum(K, k_lo + K_SPLIT)
    xrow = (offs_m % M).to(tl.int64) * K
    acc_ty = tl.float32
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=acc_ty)
    if BITS == 8:
        wrow = (offs_n % N).to(tl.int64) * K
        for k0 in range(k_lo, k_hi, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            if EVEN_K:
                xt = tl.load(x_ptr + xrow[:, None] + offs_k[None, :])
                wt = tl.load(w_ptr + wrow[:, None] + offs_k[None, :])
            else:
                k_mask = offs_k < k_hi
                xt = tl.load(x_ptr + xrow[:, None] + offs_k[None, :], mask=k_mask[None, :], other=0.0)
                wt = tl.load(w_ptr + wrow[:, None] + offs_k[None, :], mask=k_mask[None, :], other=0)
            if UPCAST:
                acc = tl.dot(xt.to(tl.float32), tl.trans(wt.to(tl.float32)), acc, input_precision="ieee")
            else:
                acc = tl.dot(xt, tl.trans(wt.to(x_ptr.dtype.element_ty)), acc)
    else:
        wrow = (offs_n % N).to(tl.int64) * (K // 2)
        for k0 in range(k_lo, k_hi, BLOCK_K):
            offs_j = k0 // 2 + tl.arange(0, BLOCK_K // 2)
            if EVEN_K:
                xe = tl.load(x_ptr + xrow[:, None] + 2 * offs_j[None, :])
                xo = tl.load(x_ptr + xrow[:, None] + 2 * offs_j[None, :] + 1)
                b = tl.load(w_ptr + wrow[:, None] + offs_j[None, :])
            else:
                j_mask = offs_j < k_hi // 2
                xe = tl.load(x_ptr + xrow[:, None] + 2 * offs_j[None, :], mask=j_mask[None, :], other=0.0)
                xo = tl.load(x_ptr + xrow[:, None] + 2 * offs_j[None, :] + 1, mask=j_mask[None, :], other=0.0)
                b = tl.load(w_ptr + wrow[:, None] + offs_j[None, :], mask=j_mask[None, :], other=0)
            b = b.to(tl.int32)
            lo = ((b & 15) ^ 8) - 8
            hi = ((b >> 4) ^ 8) - 8
            if UPCAST:
                acc = tl.dot(xe.to(tl.float32), tl.trans(lo.to(tl.float32)), acc, input_precision="ieee")
                acc = tl.dot(xo.to(tl.float32), tl.trans(hi.to(tl.float32)), acc, input_precision="ieee")
            else:
                acc = tl.dot(xe, tl.trans(lo.to(x_ptr.dtype.element_ty)), acc)
                acc = tl.dot(xo, tl.trans(hi.to(x_ptr.dtype.element_ty)), acc)
    out = offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]
    mask = m_mask[:, None] & n_mask[None, :]
    if not PARTIAL:
        y = acc * tl.load(s_ptr + offs_n, mask=n_mask, other=0.0).to(acc_ty)[None, :]
        if HAS_BIAS:
            y += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(acc_ty)[None, :]
        tl.store(y_ptr + out, y.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(p_ptr + pid_k.to(tl.int64) * M * N + out, acc.to(p_ptr.dtype.element_ty), mask=mask)


@triton_support.jit
def _wo_tma_kernel(
    x_ptr,  # [M, K] contiguous, fp16/bf16
    w_ptr,  # [N, K] int8 row-major; TMA: 16-byte aligned base and K % 16 == 0 (row pitch)
    s_ptr,  # [N] fp32
    b_ptr,  # [N] (HAS_BIAS)
    y_ptr,  # [M, N]
    p_ptr,  # [slices, M, N] fp32 partials (PARTIAL)
    M,
    N,
    K,
    K_SPLIT,  # K per slice, a multiple of BLOCK_K
    HAS_BIAS: tl.constexpr,
    PARTIAL: tl.constexpr,
    UPCAST: tl.constexpr,  # interpreter, bf16 x: fp32 dots (its bf16 dot is wrong)
    TMA: tl.constexpr,  # weight tiles through a tensor descriptor (else pointer loads)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,  # K % BLOCK_K == 0: x unmasked
):
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // num_n
    pid_n = pid % num_n
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < M
    n_mask = offs_n < N
    k_lo = pid_k * K_SPLIT
    k_hi = tl.minimum(K, k_lo + K_SPLIT)
    xrow = (offs_m % M).to(tl.int64) * K
    wrow = (offs_n % N).to(tl.int64) * K
    if TMA:
        # zero-filled past N and K; slices are whole BLOCK_K steps, so only the last
        # slice's last step reaches past K (where x is masked to 0 too)
        w_desc = tl.make_tensor_descriptor(
            w_ptr, shape=[N, K], strides=[K, 1], block_shape=[BLOCK_N, BLOCK_K]
        )
    # acc^T = W x^T: the converted weight is the dot's left operand (wgmma takes it from
    # registers, m64 per warpgroup), x^T the right one (from shared memory)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        if EVEN_K:
            xt = tl.load(x_ptr + xrow[:, None] + offs_k[None, :])
        else:
            xt = tl.load(x_ptr + xrow[:, None] + offs_k[None, :], mask=(offs_k < k_hi)[None, :], other=0.0)
        if TMA:
            wt = w_desc.load([pid_n * BLOCK_N, k0])
        elif EVEN_K:
            wt = tl.load(w_ptr + wrow[:, None] + offs_k[None, :])
        else:
            wt = tl.load(w_ptr + wrow[:, None] + offs_k[None, :], mask=(offs_k < k_hi)[None, :], other=0)
        if UPCAST:
            acc = tl.dot(wt.to(tl.float32), tl.trans(xt.to(tl.float32)), acc, input_precision="ieee")
        else:
            acc = tl.dot(wt.to(x_ptr.dtype.element_ty), tl.trans(xt), acc)
    out = offs_m.to(tl.int64)[None, :] * N + offs_n[:, None]  # [BLOCK_N, BLOCK_M]
    mask = n_mask[:, None] & m_mask[None, :]
    if not PARTIAL:
        y = acc * tl.load(s_ptr + offs_n, mask=n_mask, other=0.0)[:, None]
        if HAS_BIAS:
            y += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[:, None]
        tl.store(y_ptr + out, y.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(p_ptr + pid_k.to(tl.int64) * M * N + out, acc, mask=mask)


@triton_support.jit
def _wo_reduce_kernel(
    p_ptr,  # [SPLIT_K, MN] fp32 (fp64) partials
    s_ptr,  # [N] fp32
    b_ptr,  # [N] (HAS_BIAS)
    y_ptr,  # [MN] = [M, N] output
    MN,
    N,
    SPLIT_K,  # slices (runtime: one compile serves every split)
    HAS_BIAS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    acc_ty = p_ptr.dtype.element_ty
    acc = tl.zeros((BLOCK,), dtype=acc_ty)
    for s in range(0, SPLIT_K):  # slice order: the same sum every run
        acc += tl.load(p_ptr + s * MN + offs, mask=mask, other=0.0)
    n = offs % N
    y = acc * tl.load(s_ptr + n, mask=mask, other=0.0).to(acc_ty)
    if HAS_BIAS:
        y += tl.load(b_ptr + n, mask=mask, other=0.0).to(acc_ty)
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


# --------------------------------------------------------------------------- configs


@dataclass(frozen=True)
class WoConfig:
    """One launch: ``kernel`` "gemv" (M = 1), "dot", "tma" (int8, 16-bit x: weight tiles
    through a tensor descriptor; the launcher runs "dot" with the same tiles where TMA's
    rules fail) or "tma_ptr" (the tma kernel with pointer loads); tiles; K slices; warps;
    stages."""

    kernel: str
    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    warps: int = 4
    stages: int = 3


def _splits(tiles: int, k: int, block_k: int, want: int) -> int:
    """K slices that bring ``tiles`` programs up to ``want`` (1 when they already are),
    at most one per BLOCK_K step and 16 in all (each slice adds an [M, N] fp32 partial)."""
    if tiles >= want:
        return 1
    return max(1, min(16, triton_support.cdiv(want, tiles), triton_support.cdiv(k, block_k)))


# shared memory on an H100 / H200 (227 KB) a "tma" plan's pipeline must fit in
MAX_SHARED = 232448


@dataclass(frozen=True)
class TritonPlan:
    """A GPU launch for a class of shapes (M = 1 "gemv" or M = 2..16 "dot16"): tiles,
    warps, stages, and K slices chosen to bring the programs to ``programs_per_sm`` per SM
    (0: never split). ``block_k`` counts weights (int4: bytes x 2). ``kind`` "" runs the
    class's kernel (gemv or dot), "tma" the TMA kernel (BLOCK_M 16) for either class."""

    block_n: int
    block_k: int
    warps: int = 4
    stages: int = 3
    programs_per_sm: int = 2
    kind: str = ""

    def __post_init__(self):
        def bad(field, want):
            raise ValueError(f"TritonPlan.{field} must be {want}, got {getattr(self, field)!r}")

        def pow2(v, lo, hi):
            return type(v) is int and lo <= v <= hi and v & (v - 1) == 0

        if self.kind not in ("", "tma"):
            bad("kind", '"" or "tma"')
        tma = self.kind == "tma"
        # tl.dot needs 16 along each dim; a TMA box is at most 256 elements a dim
        if not pow2(self.block_n, 16 if tma else 1, 256 if tma else 1024):
            bad("block_n", "a power of two in " + ("[16, 256] for tma" if tma else "[1, 1024]"))
        if not pow2(self.block_k, 16 if tma else 8, 256 if tma else 4096):
            bad("block_k", "a power of two in " + ("[16, 256] for tma" if tma else "[8, 4096]"))
        if self.warps not in (1, 2, 4, 8, 16):
            bad("warps", "1, 2, 4, 8 or 16")
        if type(self.stages) is not int or not 1 <= self.stages <= 16:
            bad("stages", "in [1, 16]")
        if tma and self.shared_bytes() > MAX_SHARED:
            bad("stages", f"such that the pipeline fits {MAX_SHARED} bytes (needs {self.shared_bytes()})")
        if type(self.programs_per_sm) is not int or self.programs_per_sm < 0:
            bad("programs_per_sm", ">= 0")

    def shared_bytes(self) -> int:
        """A tma plan's pipeline: per stage the int8 weight tile and a 16-row 16-bit x tile."""
        return self.stages * (self.block_n * self.block_k + 16 * self.block_k * 2)

    def config(self, kernel: str, n: int, k: int, bits: int, n_sm: int) -> WoConfig:
        """``kernel`` "gemv" or "dot" (BLOCK_M 16); the gemv's int4 steps take twice the
        weights (the same bytes). A "tma" plan gives a "tma" launch whatever ``kernel``."""
        if self.kind == "tma":
            kernel = "tma"
        bk = self.block_k * (2 if bits == 4 and kernel == "gemv" else 1)
        tiles = triton_support.cdiv(n, self.block_n)
        split = _splits(tiles, k, bk, self.programs_per_sm * n_sm) if self.programs_per_sm else 1
        bm = 1 if kernel == "gemv" else 16
        return WoConfig(kernel, bm, self.block_n, bk, split, self.warps, self.stages)


def shape_class(n: int, n_sm: int) -> str:
    """The class of a weight with N rows: "tall" when N gives >= 4 tiles of 16 per SM
    (N = 14336 on 132 SMs), else "short" (as the CUDA launcher's ``shape_class``)."""
    return "tall" if n >= 64 * n_sm else "short"


# (kernel, shape class) -> plan, for GPUs: the fastest plan per class in
# lab/gpu_quant_sweep.py, which prints its winners in this form.
TRITON_PLANS = {
    ("gemv", "tall"): TritonPlan(block_n=16, block_k=256, warps=4, stages=3, programs_per_sm=0),
    ("gemv", "short"): TritonPlan(block_n=8, block_k=1024, warps=4, stages=3, programs_per_sm=0),
    ("dot16", "tall"): TritonPlan(block_n=64, block_k=256, warps=4, stages=4, programs_per_sm=0),
    ("dot16", "short"): TritonPlan(block_n=32, block_k=256, warps=4, stages=4, programs_per_sm=2),
}


@functools.cache  # a pure function of ints, on every call's host path
def wo_config(m: int, n: int, k: int, bits: int, n_sm: int, interpreted: bool = False) -> WoConfig:
    """The launch for an [M, K] x [N, K] product on ``n_sm`` SMs (module docstring).

    GPU, M <= 16: ``TRITON_PLANS`` by kernel (M = 1: gemv, else dot16) and shape class.
    M > 16: tiles of 32-128 x 64-128 x 128, split K below one program per SM.
    Interpreter: few, large programs (it pays per program), and K sliced past 1024 so the
    split path runs on the CPU too."""
    if interpreted:
        if m == 1:
            bk = 128
            return WoConfig("gemv", 1, 32, bk, _splits(1, k, bk, 4) if k > 1024 else 1)
        bk = 64
        return WoConfig("dot", 16, 32, bk, _splits(1, k, bk, 4) if k > 1024 else 1)
    if m <= 16:
        kernel = "gemv" if m == 1 else "dot"
        plan = TRITON_PLANS[("gemv" if m == 1 else "dot16", shape_class(n, n_sm))]
        return plan.config(kernel, n, k, bits, n_sm)
    bm = 32 if m <= 32 else 64 if m <= 64 else 128
    bn = 128 if triton_support.cdiv(m, bm) * triton_support.cdiv(n, 128) >= n_sm else 64
    tiles = triton_support.cdiv(m, bm) * triton_support.cdiv(n, bn)
    bk = 128
    return WoConfig("dot", bm, bn, bk, _splits(tiles, k, bk, n_sm), 8 if bm * bn >= 128 * 128 else 4, 4)


# --------------------------------------------------------------------------- launcher


def tma_ok(kernel: str, x2: torch.Tensor, w: torch.Tensor, bits: int) -> bool:
    """Whether a "tma" / "tma_ptr" launch can run: int8 weights and 16-bit x; for "tma"
    also TMA's rules, a row pitch (K bytes) that is a multiple of 16 and a 16-byte aligned
    base. Traced (fake tensors have no address) the base is judged by its storage offset."""
    if bits != 8 or x2.dtype not in (torch.float16, torch.bfloat16):
        return False
    if kernel == "tma_ptr":
        return True
    if type(w) in triton_support._REAL_TENSORS:
        base = w.data_ptr()
    else:
        base = w.storage_offset() * w.element_size()
    return w.shape[1] % 16 == 0 and base % 16 == 0


def triton_wo_fwd(x, w_q, scales, bias=None, bits: int = 8, config: WoConfig | None = None):
    """y [..., N] = x [..., K] @ dequant(w_q).T (+ bias), in x's dtype. Packs x, w_q (and
    non-fp32 scales) contiguous first: a strided weight costs a copy per call (quantize
    once, contiguous, for speed). ``config``: a ``WoConfig`` instead of ``wo_config``'s."""
    k = x.shape[-1]
    n = w_q.shape[0]
    lead = tuple(x.shape[:-1])
    x2 = x.reshape(math.prod(lead), k)
    if not x2.is_contiguous():
        x2 = x2.contiguous()
    m = x2.shape[0]
    w = w_q if w_q.is_contiguous() else w_q.contiguous()
    s = scales if scales.dtype == torch.float32 and scales.is_contiguous() else scales.float().contiguous()
    b = None if bias is None else bias.contiguous()
    if m == 0 or n == 0 or k == 0:  # nothing to sum: the bias (or zeros)
        y = torch.zeros((m, n), dtype=x.dtype, device=x.device)
        if b is not None:
            y += b
        return y.reshape(lead + (n,))
    interpreted = not x.is_cuda
    if not interpreted and x.device.index != torch.cuda.current_device():
        with torch.cuda.device(x.device.index):
            return triton_wo_fwd(x, w_q, scales, bias, bits, config)
    n_sm = 4 if interpreted else triton_support.sm_count(x.device.index)
    m_cfg = 1 if x.dtype == torch.float32 else m  # fp32 x runs the GEMV kernel per row
    if config is not None:
        cfg = config
    elif type(m) is int and type(n) is int and type(k) is int:
        cfg = wo_config(m_cfg, n, k, bits, n_sm, interpreted)
    else:  # traced with symbolic sizes (torch.compile, opcheck): unhashable, so not cached
        cfg = wo_config.__wrapped__(m_cfg, n, k, bits, n_sm, interpreted)
    if cfg.kernel in ("tma", "tma_ptr") and not tma_ok(cfg.kernel, x2, w, bits):
        cfg = WoConfig("dot", 16, cfg.block_n, cfg.block_k, cfg.split_k, cfg.warps, cfg.stages)
    k_split = triton_support.cdiv(triton_support.cdiv(k, cfg.split_k), cfg.block_k) * cfg.block_k
    split = triton_support.cdiv(k, k_split)
    acc64 = x.dtype == torch.float32
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    p_dtype = torch.float64 if acc64 else torch.float32
    p = torch.empty((split, m, n), dtype=p_dtype, device=x.device) if split > 1 else y
    bias_arg = b if b is not None else y
    even = k % cfg.block_k == 0
    common = dict(
        BITS=bits,
        HAS_BIAS=b is not None,
        PARTIAL=split > 1,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        EVEN_K=even,
    )
    gpu = {} if interpreted else dict(num_warps=cfg.warps, num_stages=cfg.stages)
    upcast = interpreted and x.dtype == torch.bfloat16  # the interpreter's bf16 dot is wrong
    if acc64 or (cfg.kernel == "gemv" and m == 1):
        # fp32 x: the GEMV kernel row by row, fp64 products and sums (exact products, one
        # rounding at the end; an fp32 dot's long FMA chains miss the check's bound)
        grid = (triton_support.cdiv(n, cfg.block_n) * m, split)
        _wo_gemv_kernel[grid](x2, w, s, bias_arg, y, p, m, n, k, k_split, **common, ACC64=acc64, **gpu)
    elif cfg.kernel in ("tma", "tma_ptr"):
        tma = cfg.kernel == "tma"
        if tma and not interpreted:
            triton_support.install_tma_allocator()  # descriptor scratch; per call: per thread
        grid = (triton_support.cdiv(m, cfg.block_m) * triton_support.cdiv(n, cfg.block_n), split)
        _wo_tma_kernel[grid](
            x2,
            w,
            s,
            bias_arg,
            y,
            p,
            m,
            n,
            k,
            k_split,
            HAS_BIAS=b is not None,
            PARTIAL=split > 1,
            UPCAST=upcast,
            TMA=tma,
            BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n,
            BLOCK_K=cfg.block_k,
            EVEN_K=even,
            **gpu,
        )
    else:
        grid = (triton_support.cdiv(m, cfg.block_m) * triton_support.cdiv(n, cfg.block_n), split)
        _wo_dot_kernel[grid](
            x2,
            w,
            s,
            bias_arg,
            y,
            p,
            m,
            n,
            k,
            k_split,
            **common,
            UPCAST=upcast,
            BLOCK_M=cfg.block_m,
            **gpu,
        )
    if split > 1:
        block = 1024
        _wo_reduce_kernel[(triton_support.cdiv(m * n, block),)](
            p, s, bias_arg, y, m * n, n, split, HAS_BIAS=b is not None, BLOCK=block
        )
    return y.reshape(lead + (n,))


def _fwd_for(bits):
    return lambda x, w_q, scales, bias: triton_wo_fwd(x, w_q, scales, bias, bits)


def _kernel_specs_for(bits):
    def specs(dtype: str):
        """For `kernellab asm`: decode's GEMV (M = 1) and the M = 16 tile kernel at
        N = 14336, K = 4096 on 132 SMs."""
        wt = "*i8" if bits == 8 else "*u8"
        ptrs = {
            "x_ptr": f"*{dtype}",
            "w_ptr": wt,
            "s_ptr": "*fp32",
            "b_ptr": f"*{dtype}",
            "y_ptr": f"*{dtype}",
            "p_ptr": "*fp32",
        }
        g = wo_config(1, 14336, 4096, bits, 132)
        gc = {
            "BITS": bits,
            "HAS_BIAS": False,
            "PARTIAL": False,
            "ACC64": dtype == "fp32",
            "BLOCK_N": g.block_n,
            "BLOCK_K": g.block_k,
            "EVEN_K": True,
        }
        gsig = {**ptrs, "M": "i32", "N": "i32", "K": "i32", "K_SPLIT": "i32", **{c: "constexpr" for c in gc}}
        d = wo_config(16, 14336, 4096, bits, 132)
        dc = {
            "BITS": bits,
            "HAS_BIAS": False,
            "PARTIAL": False,
            "UPCAST": False,
            "BLOCK_M": d.block_m,
            "BLOCK_N": d.block_n,
            "BLOCK_K": d.block_k,
            "EVEN_K": True,
        }
        dsig = {**ptrs, "M": "i32", "N": "i32", "K": "i32", "K_SPLIT": "i32", **{c: "constexpr" for c in dc}}
        # warps and stages as the launcher passes them (WoConfig)
        return [
            (_wo_gemv_kernel, gsig, gc, {"num_warps": g.warps, "num_stages": g.stages}),
            (_wo_dot_kernel, dsig, dc, {"num_warps": d.warps, "num_stages": d.stages}),
        ]

    return specs


for _bits, _op in ((8, "int8_weight_only_matmul"), (4, "int4_weight_only_matmul")):
    register_builtin(
        _op,
        "triton",
        wo_op(f"{_op}_triton", _fwd_for(_bits), _bits, triton=True),
        "Triton: GEMV with 16-byte weight loads for M = 1, tl.dot tiles above; split-K when N is small",
        triton_kernels=_kernel_specs_for(_bits),
        double_backward=True,  # the backward is PyTorch ops (linear in dy)
    )
