"""conv2d in Triton as three implicit GEMMs: kernels, launchers, custom op, registration.

No unfolded (im2col) copy exists in memory: each program computes the addresses of its
[BLOCK_M, BLOCK_K] operand tile from the GEMM indices and gathers it (masked loads give
the zero padding). With P Q the output pixels, R S the filter taps:

    forward  y [N P Q, K]   = A [N P Q, C R S] @ B [C R S, K]
             A(m, j) = x[n, c, p sh - ph + r, q sw - pw + s],  B(j, k) = w[k, c, r, s]
    dgrad    dx [N H W, C]  = A [N H W, K R S] @ B [K R S, C]
             A(m, j) = dy[n, k, (h + ph - r) / sh, (w + pw - s) / sw] where the division
             is exact and lands inside the output (else 0: the transposed convolution,
             no flipped copy of w), B(j, c) = w[k, c, r, s]
    wgrad    dw [K, C R S]  = A [K, N P Q] @ B [N P Q, C R S]    (split over N P Q)
             A(k, j) = dy[n, k, p, q], B(j, i) = x[n, c, p sh - ph + r, q sw - pw + s];
             dbias[k] = sum_j A(k, j), accumulated from the same A tiles (no extra pass).

wgrad's output is tiny (K x C R S: 64 x 288 at the MNIST model's second layer) and its
reduction long (N P Q = 50,176 at batch 256): the reduction is split over programs, each
writing an fp32 partial that one torch sum reduces (SPLIT x K x C R S x 4 B, a few MB).

Where the GEMM form wastes work, other kernels:
- with C >= 16 all three run a filter tap (r, s) at a time with channels innermost
  (``_conv_fwd_taps_kernel``, ``_conv_dgrad_taps_kernel``, ``_conv_wgrad_taps_kernel``):
  a pixel's source position and bounds are computed once a tap, not once an element of
  every operand tile; the forward's fp32 blocks are summed two-level (``mma``) up to
  C R S = 1152, in fp64 above, where one chain's error grows;
- dgrad with C <= 4 (a network's first layer), where the GEMM's C columns would pad to a
  16-wide tile (15 of 16 wasted at C = 1), runs in two passes: t = w^T dy for every filter
  tap (``_conv_dgrad_spread_kernel``, a dot over K that reads dy once), then each input
  pixel sums its taps' t (``_conv_dgrad_gather_kernel``); past SPREAD_MAX_RS taps, or
  where t would be too big, a stencil (``_conv_dgrad_stencil_kernel``).
Which kernel and tiles run is ``fwd_plan`` / ``dgrad_plan`` / ``wgrad_plan``, pure
functions of the shape, dtype and device type.

x and dy may have any strides (channels_last included: the tap kernels read them as
they are, the others through a contiguous copy of dy), or ``TAPS_NHWC`` has the tap
kernels read channels_last copies; w is read contiguous. ``PIXEL_RUNS`` tells the
kernels where their pixel-indexed accesses run contiguously.
fp32 accumulation; fp32 dots follow ``torch.backends.cudnn.allow_tf32`` as cuDNN does.
Under the CPU interpreter (no real 16-bit dots) the operands are upcast to fp32.
"""

from __future__ import annotations

import math

import torch
import triton.language as tl

from kernellab import device as _device
from kernellab import triton_support
from kernellab.ops._register import register_triton
from kernellab.ops._triton_dots import dot, dot_precision, mma
from kernellab.ops.conv2d.conv_op import check_int32, conv_op
from kernellab.ops.conv2d.geometry import out_size

# --------------------------------------------------------------------------- kernels


@triton_support.jit
def _tile(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The [BLOCK_M, BLOCK_N] tile of an [M, N] GEMM output that program_id(0) computes
    (tiles row-major): its row and column indices and their masks."""
    pid = tl.program_id(0)
    n_tiles = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = pid // n_tiles, pid % n_tiles
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    return offs_m, offs_n, offs_m < M, offs_n < N


@triton_support.jit
def _accumulate(a, b, acc, acc64, PRECISION: tl.constexpr, UPCAST: tl.constexpr, ACC64: tl.constexpr):
    """(acc, acc64) + a @ b for the GEMM kernels' K loops: with ACC64 the block's fp32 dot
    added to the fp64 sum, else the fp32 accumulator (``mma``); UPCAST: fp32 operands
    first (the interpreter has no 16-bit dots)."""
    if UPCAST:
        a, b = a.to(tl.float32), b.to(tl.float32)
    if ACC64:
        acc64 += dot(a, b, PRECISION).to(tl.float64)
    else:
        acc = mma(a, b, acc, PRECISION)
    return acc, acc64


@triton_support.jit
def _dy_source(hn, wn, SH, SW, P, Q):
    """dgrad's gather: the output pixel (p, q) = (hn / SH, wn / SW) that reads input pixel
    (h, w) through a filter tap, where hn = h + PH - r and wn = w + PW - s, and whether it
    exists (both divisions exact, inside the output)."""
    hn_c, wn_c = tl.maximum(hn, 0), tl.maximum(wn, 0)  # (no division of negatives)
    p, q = hn_c // SH, wn_c // SW
    ok = (hn >= 0) & (wn >= 0) & (hn_c == p * SH) & (wn_c == q * SW) & (p < P) & (q < Q)
    return p, q, ok


@triton_support.jit
def _wgrad_dy(dy_ptr, offs_m, m_ok, j, j_ok, pq, Q, sdn, sdk, sdp, sdq, DYRUN: tl.constexpr = 1):
    """wgrad's A tile dy[n, k, p, q] (strides sdn, sdk, sdp, sdq) for output channels
    offs_m and reduction indices j = (n, p, q), with j's image nb, row p and column q;
    DYRUN > 1: j's offsets in runs of DYRUN, each run's first a multiple of it (the
    launcher's promise: dy's planes contiguous, P Q and dy's strides multiples of it)."""
    nb, rem = j // pq, j % pq
    op, oq = rem // Q, rem % Q
    a_off = offs_m[:, None] * sdk + (nb * sdn + op * sdp + oq * sdq)[None, :]
    if DYRUN > 1:
        a_off = tl.multiple_of(tl.max_contiguous(a_off, [1, DYRUN]), [1, DYRUN])
    a = tl.load(dy_ptr + a_off, mask=m_ok[:, None] & j_ok[None, :], other=0.0)
    return a, nb, op, oq


@triton_support.jit
def _wgrad_step(
    a, b, acc, acc64, db, PRECISION: tl.constexpr, UPCAST: tl.constexpr, ACC64: tl.constexpr,
    DOT64: tl.constexpr = True, DB: tl.constexpr = 1,
):
    """(acc, acc64, db) after one reduction step of wgrad: db += the dy tile's row sums (DB 1:
    each element in fp64; 2: the step's BLOCK_K elements in fp32, the steps in fp64; 0:
    none), and the product a @ b:
    with ACC64, fp32-level operands ("ieee") through fp64 dots (exact products, fp64
    sums; without DOT64 an fp32 dot a step, summed in fp64), TF32 dots summed in fp64;
    else the fp32 accumulator (``mma``)."""
    if DB == 1:
        db += tl.sum(a.to(tl.float64), axis=1)
    elif DB == 2:
        db += tl.sum(a.to(tl.float32), axis=1).to(tl.float64)
    if UPCAST:
        a, b = a.to(tl.float32), b.to(tl.float32)
    if ACC64 and DOT64 and PRECISION == "ieee":
        acc64 = tl.dot(a.to(tl.float64), b.to(tl.float64), acc64, out_dtype=tl.float64)
    elif ACC64:
        acc64 += dot(a, b, PRECISION).to(tl.float64)
    else:
        acc = mma(a, b, acc, PRECISION)
    return acc, acc64, db


@triton_support.jit
def _runs(rows, cols, RUN: tl.constexpr, ALIGNED: tl.constexpr = False):
    """rows[:, None] + cols[None, :]: a tile's offsets with pixels along dim 0, told to
    Triton as runs of RUN consecutive elements along dim 0 (ALIGNED: each run's first a
    multiple of RUN) where the launcher has found them so. Triton cannot see the runs
    through the divisions that give the pixel index; without them the lanes of a warp go
    along dim 1, a channel plane apart. (The hint must sit on an op made here: on a
    helper's argument it is lost.)"""
    off = rows[:, None] + cols[None, :]
    if RUN > 1:
        off = tl.max_contiguous(off, [RUN, 1])
        if ALIGNED:
            off = tl.multiple_of(off, [RUN, 1])
    return off


@triton_support.jit
def _store_y(
    acc, b_ptr, y_ptr, offs_n, n_ok, nb, rem, m_ok, KPQ, PQ, HAS_BIAS: tl.constexpr, YRUN: tl.constexpr = 1
):
    """The forwards' epilogue: + bias[k], one rounding, y[n, k, p, q] (contiguous) for the
    tile's output pixels (image nb, pixel rem) and channels offs_n; YRUN (> 1 when P Q is a
    multiple of it) as ``_runs`` takes it."""
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    y_off = _runs(nb * KPQ + rem, offs_n * PQ, YRUN, True)
    tl.store(y_ptr + y_off, acc.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@triton_support.jit
def _conv_fwd_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr,  # x [N, C, H, W] strided; w [K, C R S] contiguous; y [N, K, P, Q] contiguous
    C, H, W, K, P, Q, R, S, M,  # M = N P Q
    sxn, sxc, sxh, sxw,  # x strides (elements)
    SH, SW, PH, PW,
    HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr, ACC64: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    XRUN: tl.constexpr = 1, YRUN: tl.constexpr = 1,  # pixel runs of x's window rows and of y (``_runs``)
):
    offs_m, offs_n, m_ok, n_ok = _tile(M, K, BLOCK_M, BLOCK_N)  # output pixels (n, p, q), channels k
    pq = P * Q
    nb, rem = offs_m // pq, offs_m % pq
    ih0 = (rem // Q) * SH - PH  # top-left input row / column of each output's window
    iw0 = (rem % Q) * SW - PW
    x_row = nb * sxn + ih0 * sxh + iw0 * sxw  # x[n, 0, ih0, iw0]
    RS = R * S
    CRS = C * RS
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc64 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float64)  # (unused without ACC64: compiled away)
    for j0 in range(0, CRS, BLOCK_K):
        j = j0 + tl.arange(0, BLOCK_K)  # reduction index (c, r, s)
        j_ok = j < CRS
        c, rs = j // RS, j % RS
        ih = ih0[:, None] + (rs // S)[None, :]
        iw = iw0[:, None] + (rs % S)[None, :]
        a_ok = m_ok[:, None] & j_ok[None, :] & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
        a_col = c * sxc + (rs // S) * sxh + (rs % S) * sxw
        a = tl.load(x_ptr + _runs(x_row, a_col, XRUN), mask=a_ok, other=0.0)
        b = tl.load(w_ptr + offs_n[None, :] * CRS + j[:, None], mask=j_ok[:, None] & n_ok[None, :], other=0.0)
        # (ACC64, fp32: each block's fp32 product added in fp64, as the backward kernels do)
        acc, acc64 = _accumulate(a, b, acc, acc64, PRECISION, UPCAST, ACC64)
    if ACC64:
        acc = acc64.to(tl.float32)
    _store_y(acc, b_ptr, y_ptr, offs_n, n_ok, nb, rem, m_ok, K * pq, pq, HAS_BIAS, YRUN)


@triton_support.jit
def _conv_fwd_taps_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr,  # as _conv_fwd_kernel's, but w [K, C, R S] at any strides
    C, H, W, K, P, Q, R, S, M,
    sxn, sxc, sxh, sxw,
    swk, swc, swt,  # w's strides along k, c and the tap r S + s (``tap_weight``)
    SH, SW, PH, PW,
    HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr, ACC64: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    XRUN: tl.constexpr = 1, YRUN: tl.constexpr = 1,  # pixel runs of x's tap rows and of y (``_runs``)
):
    # the reduction as taps (r, s) outside, channels c inside: A(m, c) of one tap is
    # x[n, c, ih0 + r, iw0 + s], one row offset and one bounds test per output pixel
    offs_m, offs_n, m_ok, n_ok = _tile(M, K, BLOCK_M, BLOCK_N)
    pq = P * Q
    nb, rem = offs_m // pq, offs_m % pq
    ih0 = (rem // Q) * SH - PH
    iw0 = (rem % Q) * SW - PW
    RS = R * S
    w_col = offs_n * swk  # w[k, 0, 0, 0]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc64 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float64)
    for rs in range(0, RS):
        ih = ih0 + rs // S
        iw = iw0 + rs % S
        row_ok = m_ok & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
        a_row = nb * sxn + ih * sxh + iw * sxw
        for c0 in range(0, C, BLOCK_K):
            c = c0 + tl.arange(0, BLOCK_K)
            c_ok = c < C
            a_ok = row_ok[:, None] & c_ok[None, :]
            a = tl.load(x_ptr + _runs(a_row, c * sxc, XRUN), mask=a_ok, other=0.0)
            b_off = w_col[None, :] + c[:, None] * swc + rs * swt
            b = tl.load(w_ptr + b_off, mask=c_ok[:, None] & n_ok[None, :], other=0.0)
            acc, acc64 = _accumulate(a, b, acc, acc64, PRECISION, UPCAST, ACC64)
    if ACC64:
        acc = acc64.to(tl.float32)
    _store_y(acc, b_ptr, y_ptr, offs_n, n_ok, nb, rem, m_ok, K * pq, pq, HAS_BIAS, YRUN)


@triton_support.jit
def _conv_dgrad_kernel(
    dy_ptr, w_ptr, dx_ptr,  # dy [N, K, P, Q], w [K, C, R, S], dx [N, C, H, W]: contiguous
    C, H, W, K, P, Q, R, S, M,  # M = N H W
    SH, SW, PH, PW,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr, ACC64: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    # ACC64 (fp32 storage): each BLOCK_K-deep tile's dot in fp32, their sum in fp64 (one
    # fp32 chain over K R S is several times cuDNN's dx error at the MNIST / large layers)
    offs_m, offs_n, m_ok, n_ok = _tile(M, C, BLOCK_M, BLOCK_N)  # input pixels (n, h, w), channels c
    hw = H * W
    nb, rem = offs_m // hw, offs_m % hw
    ih, iw = rem // W, rem % W
    RS = R * S
    KRS = K * RS
    pq = P * Q
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc64 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float64)
    for j0 in range(0, KRS, BLOCK_K):
        j = j0 + tl.arange(0, BLOCK_K)  # reduction index (k, r, s)
        j_ok = j < KRS
        k, rs = j // RS, j % RS
        r, s = rs // S, rs % S
        hn = ih[:, None] + PH - r[None, :]  # = p sh when output row p reads input row h
        wn = iw[:, None] + PW - s[None, :]
        p, q, src_ok = _dy_source(hn, wn, SH, SW, P, Q)
        a_ok = m_ok[:, None] & j_ok[None, :] & src_ok
        a = tl.load(dy_ptr + nb[:, None] * (K * pq) + k[None, :] * pq + p * Q + q, mask=a_ok, other=0.0)
        b_off = k[:, None] * (C * RS) + offs_n[None, :] * RS + rs[:, None]
        b = tl.load(w_ptr + b_off, mask=j_ok[:, None] & n_ok[None, :], other=0.0)
        acc, acc64 = _accumulate(a, b, acc, acc64, PRECISION, UPCAST, ACC64)
    dx_off = nb[:, None] * (C * hw) + offs_n[None, :] * hw + rem[:, None]
    out = acc64 if ACC64 else acc
    tl.store(dx_ptr + dx_off, out.to(dx_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@triton_support.jit
def _conv_dgrad_taps_kernel(
    dy_ptr, w_ptr, dx_ptr,  # dy [N, K, P, Q] and dx [N, C, H, W] strided, w [K, C, R S] at any strides
    C, H, W, K, P, Q, R, S, M,
    sdn, sdk, sdp, sdq,  # dy's strides
    sxn, sxc, sxh, sxw,  # dx's strides
    swk, swc, swt,  # w's strides along k, c and the tap (``tap_weight``)
    SH, SW, PH, PW,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr, ACC64: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DYRUN: tl.constexpr = 1, XRUN: tl.constexpr = 1,  # pixel runs of dy's tap rows and of dx (``_runs``)
):
    # the reduction as taps (r, s) outside, output channels k inside: A(m, k) of one tap is
    # dy[n, k, p, q] with (p, q) the output pixel that reads input pixel m through the tap,
    # found once per pixel and tap
    offs_m, offs_n, m_ok, n_ok = _tile(M, C, BLOCK_M, BLOCK_N)
    hw = H * W
    nb, rem = offs_m // hw, offs_m % hw
    ih, iw = rem // W, rem % W
    RS = R * S
    w_col = offs_n * swc  # w[0, c, 0, 0]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc64 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float64)
    for rs in range(0, RS):
        p, q, src_ok = _dy_source(ih + PH - rs // S, iw + PW - rs % S, SH, SW, P, Q)
        row_ok = m_ok & src_ok
        a_row = nb * sdn + p * sdp + q * sdq
        for k0 in range(0, K, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            k_ok = k < K
            a_ok = row_ok[:, None] & k_ok[None, :]
            a = tl.load(dy_ptr + _runs(a_row, k * sdk, DYRUN), mask=a_ok, other=0.0)
            b_off = k[:, None] * swk + w_col[None, :] + rs * swt
            b = tl.load(w_ptr + b_off, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
            acc, acc64 = _accumulate(a, b, acc, acc64, PRECISION, UPCAST, ACC64)
    dx_off = _runs(nb * sxn + ih * sxh + iw * sxw, offs_n * sxc, XRUN, True)
    out = (acc64 if ACC64 else acc).to(tl.float32)
    tl.store(dx_ptr + dx_off, out.to(dx_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@triton_support.jit
def _dx_pixels(NHW, H, W, BLOCK: tl.constexpr):
    """The dgrad stencil's and gather's program: (pixel offsets, channel c, in range,
    image, offset in the image, row, column) of this program's block of input pixels."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    hw = H * W
    nb, rem = offs // hw, offs % hw
    return offs, tl.program_id(1), offs < NHW, nb, rem, rem // W, rem % W


@triton_support.jit
def _conv_dgrad_stencil_kernel(
    dy_ptr, w_ptr, dx_ptr,  # dy [N, K, P, Q], w [K, C, R, S], dx [N, C, H, W]: contiguous
    C, H, W, K, P, Q, R, S, NHW,
    SH, SW, PH, PW,
    BLOCK: tl.constexpr, BLOCK_K: tl.constexpr,
):
    # dx[n, c, h, w] = sum_{k, r, s} dy[n, k, (h + PH - r) / SH, (w + PW - s) / SW] w[k, c, r, s]
    # (exact divisions inside the output only). Program (pixel block, channel c); each
    # BLOCK_K-deep slice of k summed in fp32, the slices in fp64. The k slices are the outer
    # loop: the R S shifted reads of one slice hit the same few rows of dy while they are
    # in L1.
    offs, c, ok, nb, rem, h, w = _dx_pixels(NHW, H, W, BLOCK)
    hw = H * W
    pq = P * Q
    RS = R * S
    acc = tl.zeros((BLOCK,), dtype=tl.float64)
    for i in range(0, tl.cdiv(K, BLOCK_K) * RS):
        k0, rs = (i // RS) * BLOCK_K, i % RS
        p, q, src_ok = _dy_source(h + PH - rs // S, w + PW - rs % S, SH, SW, P, Q)
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < K
        d_ok = k_ok[:, None] & (ok & src_ok)[None, :]
        d = tl.load(dy_ptr + k[:, None] * pq + (nb * (K * pq) + p * Q + q)[None, :], mask=d_ok, other=0.0)
        wv = tl.load(w_ptr + k * (C * RS) + c * RS + rs, mask=k_ok, other=0.0)
        acc += tl.sum(d.to(tl.float32) * wv.to(tl.float32)[:, None], axis=0).to(tl.float64)
    # (through fp32: the interpreter's fp64 -> bf16 conversion is wrong)
    tl.store(dx_ptr + nb * (C * hw) + c * hw + rem, acc.to(tl.float32).to(dx_ptr.dtype.element_ty), mask=ok)


@triton_support.jit
def _conv_dgrad_spread_kernel(
    dy_ptr, w_ptr, t_ptr,  # dy [N, K, P, Q], w [K, C, R S] contiguous; t [C, R S, N P Q]
    C, K, PQ, NPQ, RS,
    RS_PAD: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK: tl.constexpr, UPCAST: tl.constexpr,
    WIDE: tl.constexpr,
):
    # dgrad at few channels, first half: t[c, rs, j] = sum_k w[k, c, rs] dy[k, j] over the
    # output pixels j = (n, p, q), one [RS_PAD, K] @ [K, BLOCK] dot a pixel block (dy read
    # once). WIDE (fp32): fp64 operands and sums, t in fp64; else 16-bit dots, t in fp32.
    j = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    c = tl.program_id(1)
    j_ok = j < NPQ
    px = (j // PQ) * (K * PQ) + j % PQ
    taps = tl.arange(0, RS_PAD)
    t_ok = taps < RS
    if WIDE:
        acc = tl.zeros((RS_PAD, BLOCK), dtype=tl.float64)
    else:
        acc = tl.zeros((RS_PAD, BLOCK), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < K
        a_ok = t_ok[:, None] & k_ok[None, :]
        a = tl.load(w_ptr + k[None, :] * (C * RS) + c * RS + taps[:, None], mask=a_ok, other=0.0)
        b = tl.load(dy_ptr + k[:, None] * PQ + px[None, :], mask=k_ok[:, None] & j_ok[None, :], other=0.0)
        if WIDE:
            acc = tl.dot(a.to(tl.float64), b.to(tl.float64), acc, out_dtype=tl.float64)
        elif UPCAST:
            acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
    tl.store(t_ptr + (c * RS + taps[:, None]) * NPQ + j[None, :], acc, mask=t_ok[:, None] & j_ok[None, :])


@triton_support.jit
def _conv_dgrad_gather_kernel(
    t_ptr, dx_ptr,  # t [C, R S, N P Q] (``_conv_dgrad_spread_kernel``'s), dx [N, C, H, W] contiguous
    C, H, W, P, Q, S, RS, NHW, NPQ,
    SH, SW, PH, PW,
    BLOCK: tl.constexpr,
):
    # dgrad at few channels, second half: dx[n, c, h, w] = sum_{r, s} t[c, rs, (n, p, q)] with
    # (p, q) the output pixel that reads (h, w) through tap (r, s) (``_dy_source``), summed
    # in t's dtype (fp64 for fp32 x).
    offs, c, ok, nb, rem, h, w = _dx_pixels(NHW, H, W, BLOCK)
    hw = H * W
    acc = tl.zeros((BLOCK,), dtype=t_ptr.dtype.element_ty)
    for rs in range(0, RS):
        p, q, src_ok = _dy_source(h + PH - rs // S, w + PW - rs % S, SH, SW, P, Q)
        acc += tl.load(t_ptr + (c * RS + rs) * NPQ + nb * (P * Q) + p * Q + q, mask=ok & src_ok, other=0.0)
    tl.store(dx_ptr + nb * (C * hw) + c * hw + rem, acc.to(tl.float32).to(dx_ptr.dtype.element_ty), mask=ok)


@triton_support.jit
def _conv_wgrad_kernel(
    dy_ptr, x_ptr, dw_part_ptr, db_part_ptr,  # dy [N, K, P, Q], x [N, C, H, W] strided;
    # dw_part [SPLIT, K, C R S] and db_part [SPLIT, K] fp64
    C, H, W, K, P, Q, R, S, NPQ, CHUNK,  # CHUNK: reduction indices per split (multiple of BLOCK_K)
    sxn, sxc, sxh, sxw,
    sdn, sdk, sdp, sdq,  # dy's strides
    SH, SW, PH, PW,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr, ACC64: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT64: tl.constexpr = True,
    DB: tl.constexpr = 1, XRUN: tl.constexpr = 1,  # pixel runs of x's window rows (``_runs``)
    DYRUN: tl.constexpr = 1,  # runs of dy's planes (``_wgrad_dy``)
):
    # ACC64 (fp32 storage): IEEE fp32 operands through fp64 dots (the products are exact and
    # the sums fp64: each BLOCK_K-deep fp32 dot summed in fp64 misses the check's bound, 2x
    # cuDNN's error, on some seeds), TF32 dots summed in fp64; else one fp32
    # accumulator over the chunk (16-bit: a far looser bound)
    split = tl.program_id(1)
    RS = R * S
    CRS = C * RS
    # output channels k, filter taps (c, r, s)
    offs_m, offs_n, m_ok, n_ok = _tile(K, CRS, BLOCK_M, BLOCK_N)
    c, rs = offs_n // RS, offs_n % RS
    r, s = rs // S, rs % S
    pq = P * Q
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc64 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float64)
    # dbias as DB says (fp32 storage: an fp32 running sum, or fp32 tile sums, went over the
    # check's bound; the launcher sums it with torch in fp64 instead, WGRAD_DB)
    db = tl.zeros((BLOCK_M,), dtype=tl.float64)
    start = split * CHUNK
    end = tl.minimum(start + CHUNK, NPQ)
    for j0 in range(start, end, BLOCK_K):
        j = j0 + tl.arange(0, BLOCK_K)  # reduction index (n, p, q)
        j_ok = j < end
        if DYRUN > 1:  # (chunks end on whole runs: CHUNK, BLOCK_K and N P Q multiples of it)
            j_ok = tl.max_constancy(j_ok, DYRUN)
        a, nb, op, oq = _wgrad_dy(dy_ptr, offs_m, m_ok, j, j_ok, pq, Q, sdn, sdk, sdp, sdq, DYRUN)
        ih0, iw0 = op * SH - PH, oq * SW - PW
        ih = ih0[:, None] + r[None, :]
        iw = iw0[:, None] + s[None, :]
        b_ok = j_ok[:, None] & n_ok[None, :] & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
        b_off = _runs(nb * sxn + ih0 * sxh + iw0 * sxw, c * sxc + r * sxh + s * sxw, XRUN)
        b = tl.load(x_ptr + b_off, mask=b_ok, other=0.0)
        acc, acc64, db = _wgrad_step(a, b, acc, acc64, db, PRECISION, UPCAST, ACC64, DOT64, DB)
    if not ACC64:
        acc64 = acc.to(tl.float64)
    out = split * (K * CRS) + offs_m[:, None] * CRS + offs_n[None, :]
    tl.store(dw_part_ptr + out, acc64, mask=m_ok[:, None] & n_ok[None, :])
    pid_n = tl.program_id(0) % tl.cdiv(CRS, BLOCK_N)  # the tile's column, as _tile takes it
    first = (offs_m * 0 + pid_n) == 0  # (a tensor, not a scalar: the interpreter's masks)
    if DB != 0:
        tl.store(db_part_ptr + split * K + offs_m, db, mask=m_ok & first)


@triton_support.jit
def _conv_wgrad_taps_kernel(
    dy_ptr, x_ptr, dw_part_ptr, db_part_ptr,  # as _conv_wgrad_kernel's
    C, H, W, K, P, Q, R, S, NPQ, CHUNK,
    sxn, sxc, sxh, sxw,
    sdn, sdk, sdp, sdq,
    SH, SW, PH, PW,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr, ACC64: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT64: tl.constexpr = True,
    DB: tl.constexpr = 1, XRUN: tl.constexpr = 1,  # pixel runs of x's tap rows (``_runs``)
    DYRUN: tl.constexpr = 1,  # runs of dy's planes (``_wgrad_dy``)
):
    # one filter tap (r, s) a program: dw[k, c, r, s] for a [BLOCK_M (k), BLOCK_N (c)] tile,
    # B(j, c) = x[n, c, p sh - ph + r, q sw - pw + s]: the input position and its bounds
    # are computed once per reduction index j, not once per (j, c)
    split = tl.program_id(1)
    RS = R * S
    tile, rs = tl.program_id(0) // RS, tl.program_id(0) % RS
    r, s = rs // S, rs % S
    n_tiles = tl.cdiv(C, BLOCK_N)
    offs_m = (tile // n_tiles) * BLOCK_M + tl.arange(0, BLOCK_M)  # output channels k
    offs_n = (tile % n_tiles) * BLOCK_N + tl.arange(0, BLOCK_N)  # input channels c
    m_ok, n_ok = offs_m < K, offs_n < C
    pq = P * Q
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc64 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float64)
    db = tl.zeros((BLOCK_M,), dtype=tl.float64)
    start = split * CHUNK
    end = tl.minimum(start + CHUNK, NPQ)
    for j0 in range(start, end, BLOCK_K):
        j = j0 + tl.arange(0, BLOCK_K)  # reduction index (n, p, q)
        j_ok = j < end
        if DYRUN > 1:  # (chunks end on whole runs: CHUNK, BLOCK_K and N P Q multiples of it)
            j_ok = tl.max_constancy(j_ok, DYRUN)
        a, nb, op, oq = _wgrad_dy(dy_ptr, offs_m, m_ok, j, j_ok, pq, Q, sdn, sdk, sdp, sdq, DYRUN)
        ih = op * SH - PH + r
        iw = oq * SW - PW + s
        row_ok = j_ok & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
        b_row = nb * sxn + ih * sxh + iw * sxw
        b_ok = row_ok[:, None] & n_ok[None, :]
        b = tl.load(x_ptr + _runs(b_row, offs_n * sxc, XRUN), mask=b_ok, other=0.0)
        acc, acc64, db = _wgrad_step(a, b, acc, acc64, db, PRECISION, UPCAST, ACC64, DOT64, DB)
    if not ACC64:
        acc64 = acc.to(tl.float64)
    CRS = C * RS
    out = split * (K * CRS) + offs_m[:, None] * CRS + offs_n[None, :] * RS + rs
    tl.store(dw_part_ptr + out, acc64, mask=m_ok[:, None] & n_ok[None, :])
    first = (offs_m * 0 + (tile % n_tiles) + rs) == 0  # the first c tile of the first tap
    if DB != 0:
        tl.store(db_part_ptr + split * K + offs_m, db, mask=m_ok & first)


# --------------------------------------------------------------------------- launchers


def _consts(t: torch.Tensor) -> dict:
    if t.device.type != "cuda":  # the interpreter: no 16-bit dots, exact fp32
        return dict(PRECISION="ieee", UPCAST=True)
    # fp32: as cuDNN's setting says (TF32 rounded to nearest, as cuDNN rounds); fp16/bf16
    # dots ignore it
    tf32 = torch.backends.cudnn.allow_tf32
    return dict(PRECISION=dot_precision(t.dtype, tf32, _device.triton_interpret_forced()), UPCAST=False)


def _clamp_pow2(n: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, triton_support.next_pow2(n)))


def gemm_config(n: int, k: int, dev) -> dict:
    """Tiles of one implicit GEMM (N columns, reduction k): N and K tiles sized to the
    problem (tl.dot needs 16 or more each way), M tiles of 64 (the interpreter: 32, it
    pays per program and per element alike). Not autotuned: the MNIST layers have
    N = K of 32 / 64 and reductions of 9 to 576; a tuned table is future work."""
    if dev.type != "cuda":
        return dict(BLOCK_M=32, BLOCK_N=_clamp_pow2(n, 16, 32), BLOCK_K=_clamp_pow2(k, 16, 32), num_warps=4)
    return dict(BLOCK_M=64, BLOCK_N=_clamp_pow2(n, 16, 64), BLOCK_K=_clamp_pow2(k, 16, 32), num_warps=4)


# The tap forward against the GEMM one (H100, lab/gpu_conv_taps.py): fp32 1.19-1.61x at C
# 32 / 64; bf16 2.3-3.3x (1.24-2.13x cuDNN) at 128x64x32, 8 warps. C R S past which its
# fp32 block sums become fp64 ones:
TAPS_MIN_C = 16
TAPS_TWO_LEVEL_MAX_CRS = 1152
STENCIL_MAX_C = 4


def _taps_tiles(n: int, k: int, dtype: torch.dtype, dev, acc64: bool) -> dict:
    """Tiles of a tap kernel with n output columns and k reduction channels a tap."""
    if dev.type != "cuda":
        return dict(BLOCK_M=32, BLOCK_N=_clamp_pow2(n, 16, 32), BLOCK_K=16, num_warps=4)
    if dtype != torch.float32:
        return dict(BLOCK_M=128, BLOCK_N=_clamp_pow2(n, 16, 64), BLOCK_K=_clamp_pow2(k, 16, 32), num_warps=8)
    if acc64:  # (fp64 accumulators in registers)
        return dict(BLOCK_M=64, BLOCK_N=_clamp_pow2(n, 16, 64), BLOCK_K=_clamp_pow2(k, 16, 32), num_warps=4)
    return dict(BLOCK_M=128, BLOCK_N=_clamp_pow2(n, 16, 64), BLOCK_K=16, num_warps=4)


# The tap kernels' B tile is w[k, c, tap] over (c, k) in the forward and (k, c) in dgrad:
# with w as given (contiguous [K, C, R, S]) neither direction has unit stride. For these
# dtypes w is first copied tap-major, its B tile's columns contiguous ([R, S, C, K] for
# the forward, [R, S, K, C] for dgrad). fp32's FMA dots run such a tile about twice as
# fast (H100, TF32 off: the forward 1.5-2.1x, dgrad + wgrad 1.5-1.6x at C 32-64, the copy
# counted); bf16's tensor-core dots were mixed (the forward 0.72-1.0x, dgrad + wgrad
# 0.82-1.22x), so bf16 reads w as it is.
TAP_MAJOR_DTYPES = (torch.float32,)


def tap_weight(
    w: torch.Tensor, out_channels_inner: bool, tap_major: bool = False
) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """(w or its tap-major copy, its strides along k, c and the tap) for a tap kernel:
    ``out_channels_inner`` (the forward) puts k innermost, else c (dgrad); dtypes outside
    TAP_MAJOR_DTYPES keep w as it is unless ``tap_major``."""
    k, c, r, s = w.shape
    if w.dtype not in TAP_MAJOR_DTYPES and not tap_major:
        return w, (w.stride(0), w.stride(1), w.stride(3))
    if out_channels_inner:
        return w.permute(2, 3, 1, 0).contiguous(), (1, k, c * k)
    return w.permute(2, 3, 0, 1).contiguous(), (c, 1, k * c)


# The tap kernels' gathered operand read channels-innermost, by kernel ("fwd", "dgrad",
# "wgrad") and dtype: x and dy copied to channels_last (a copy only where they are not
# already), so a warp's loads run along contiguous channels (16-byte cp.async in the
# sm_90 PTX), and w tap-major; the outputs keep their layouts. From this many output
# pixels (N P Q) on; off where not listed (``_on``). Chosen from the H100
# rows of lab/gpu_conv_parts.py --parts layout, the copies timed with the kernels
# (benchmarks/NOTES.md): the forward and fp32 dgrad are slower so, and wgrad is faster
# reading NCHW told its runs (PIXEL_RUNS).
TAPS_NHWC: dict[tuple[str, torch.dtype], int] = {("dgrad", torch.bfloat16): 0, ("dgrad", torch.float16): 0}
_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


def _on(table: dict, kernel: str, dtype: torch.dtype, npq: int) -> bool:
    """Whether a (kernel, dtype) -> N P Q floor table (TAPS_NHWC, PIXEL_RUNS) has
    ``kernel`` on at this dtype and N P Q output pixels."""
    at = table.get((kernel, dtype))
    return at is not None and npq >= at


def _nhwc(kernel: str, dtype: torch.dtype, npq: int) -> bool:
    """Whether ``kernel`` reads channels-innermost at this dtype and N P Q (TAPS_NHWC)."""
    return _on(TAPS_NHWC, kernel, dtype, npq)


def _channels_last(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous(memory_format=torch.channels_last)


# The kernels told where their pixel-indexed loads and stores run contiguously
# (``_runs``): y and dx (contiguous NCHW) in runs that divide P Q / H W, and the gathered
# rows of x / dy (NCHW, unit column stride, column stride 1 of the convolution) in runs
# that divide a row. Without it a warp's lanes go along channels. By kernel ("fwd": the
# tap forward, "fwd_gemm": the forward at C < TAPS_MIN_C, "dgrad": the tap dgrad,
# "wgrad": both wgrad kernels) and dtype, as TAPS_NHWC; chosen where the H100 rows of
# lab/gpu_conv_parts.py --parts layout and the conv2d tune with the runs on and off found
# them faster (benchmarks/NOTES.md).
RUN_KERNELS = ("fwd", "fwd_gemm", "dgrad", "wgrad")
PIXEL_RUNS: dict[tuple[str, torch.dtype], int] = {
    **{("fwd_gemm", dt): 0 for dt in _FLOATS},
    **{("fwd", dt): 32768 for dt in (torch.bfloat16, torch.float16)},
    **{("wgrad", dt): 32768 for dt in _FLOATS},
}


def runs_everywhere() -> dict[tuple[str, torch.dtype], int]:
    """A PIXEL_RUNS that turns the runs on for every kernel, dtype and size."""
    return {(k, dt): 0 for k in RUN_KERNELS for dt in _FLOATS}


def _runs_on(kernel: str, dtype: torch.dtype, npq: int) -> bool:
    """Whether ``kernel`` is told its pixel runs at this dtype and N P Q (PIXEL_RUNS)."""
    return _on(PIXEL_RUNS, kernel, dtype, npq)


def _run(n: int, t: torch.Tensor, on: bool = True) -> int:
    """The longest run of t's elements, a power of two up to 16 bytes, that divides n (1
    where ``on`` is false)."""
    run, cap = 1, 16 // t.element_size()
    while on and run < cap and n % (2 * run) == 0:
        run *= 2
    return run


def fwd_runs(x: torch.Tensor, p: int, q: int, sw: int, kind: str) -> dict:
    """The forwards' runs (``kind``: fwd_plan's): x's window rows (unit column stride,
    column stride 1) and y's planes (contiguous y), as PIXEL_RUNS says."""
    on = _runs_on("fwd" if kind == "taps" else "fwd_gemm", x.dtype, x.shape[0] * p * q)
    return dict(XRUN=_run(q, x, on and sw == 1 and x.stride(3) == 1), YRUN=_run(p * q, x, on))


def dgrad_runs(dy: torch.Tensor, x: torch.Tensor, sw: int) -> dict:
    """The tap dgrad's runs: dy's tap rows (dy as the kernel reads it: unit column stride,
    column stride 1) and dx's planes (contiguous dx, x's shape)."""
    on = _runs_on("dgrad", x.dtype, dy.shape[0] * dy.shape[2] * dy.shape[3])
    h, w = x.shape[2], x.shape[3]
    return dict(DYRUN=_run(w, x, on and sw == 1 and dy.stride(3) == 1), XRUN=_run(h * w, x, on))


def wgrad_runs(dy: torch.Tensor, x: torch.Tensor, sw: int) -> dict:
    """wgrad's runs (x and dy as the kernel reads them): x's window rows, and dy's planes
    where they are contiguous (rows of Q at unit stride), the runs whole within each and
    aligned (dividing P Q and dy's strides)."""
    p, q = dy.shape[2], dy.shape[3]
    on = _runs_on("wgrad", x.dtype, dy.shape[0] * p * q)
    plane = dy.stride(3) == 1 and dy.stride(2) == q
    return dict(
        XRUN=_run(q, x, on and sw == 1 and x.stride(3) == 1),
        DYRUN=_run(math.gcd(p * q, dy.stride(1), dy.stride(0)), x, on and plane),
    )


def fwd_plan(c: int, r: int, s: int, k: int, dtype: torch.dtype, dev) -> tuple[str, dict]:
    """("taps" or "gemm", the launch's ACC64 and tiles) for a forward with C input and K
    output channels and an R x S filter."""
    if c >= TAPS_MIN_C:  # (16-bit: tensor-core dots, an fp32 accumulator at any C R S)
        acc64 = dtype == torch.float32 and c * r * s > TAPS_TWO_LEVEL_MAX_CRS
        if acc64 and dev.type == "cuda":  # (fp64 accumulators: the GEMM kernel's tiles, in registers)
            tiles = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, num_warps=4)
        else:
            tiles = _taps_tiles(k, c, dtype, dev, False)
        return "taps", dict(ACC64=acc64, **tiles)
    return "gemm", dict(ACC64=dtype == torch.float32, **gemm_config(k, c * r * s, dev))


# dgrad at C <= STENCIL_MAX_C with at most this many filter taps: the two-pass "spread"
# (``_conv_dgrad_spread_kernel``: t = w^T dy per tap, dy read once; then
# ``_conv_dgrad_gather_kernel``), where t holds at most SPREAD_MAX_ELEMS values (fp64 for
# fp32: 1 GiB); else the one-pass stencil. H100, MNIST's first layer (lab/gpu_conv_layer1.py):
# the stencil took 0.37 ms of dx at batch 1024 fp32 (cuDNN's whole backward 0.42), reading
# each dy element once per tap.
SPREAD_MAX_RS = 32
SPREAD_MAX_ELEMS = 2**27


def stencil_config(dev) -> dict:
    """The stencil dgrad's tiles (H100, k slices outer: 128-pixel blocks the fastest of
    128-1024 at MNIST's first layer, fp32 and bf16)."""
    return dict(BLOCK=128 if dev.type == "cuda" else 64, BLOCK_K=16, num_warps=4)


def dgrad_plan(c: int, r: int, s: int, k: int, dtype: torch.dtype, dev, npq: int = 0) -> tuple[str, dict]:
    """("spread", "stencil", "taps" or "gemm", the launch's constexprs and tiles) for dx
    with C channels and N P Q output pixels: at C <= 4 the two-pass spread (a stencil past
    SPREAD_MAX_RS taps or where its t would exceed SPREAD_MAX_ELEMS values), a tap at a
    time (the forward's order) at C >= 16."""
    if c <= STENCIL_MAX_C:
        if r * s <= SPREAD_MAX_RS and c * r * s * npq <= SPREAD_MAX_ELEMS:
            cuda = dev.type == "cuda"
            return "spread", dict(BLOCK=128 if cuda else 32, BLOCK_K=_clamp_pow2(k, 16, 32),
                                  RS_PAD=_clamp_pow2(r * s, 16, SPREAD_MAX_RS), num_warps=4,
                                  GATHER=256 if cuda else 64)  # fmt: skip
        return "stencil", stencil_config(dev)
    acc64 = dtype == torch.float32
    if c >= TAPS_MIN_C:
        tiles = _taps_tiles(c, k, dtype, dev, acc64)
        if dev.type == "cuda" and dtype != torch.float32:
            # H100, bf16 (lab/gpu_conv_parts.py): 256-pixel tiles at C 64 (0.123 ms against
            # 0.178 at 32x64x56x56), 4 warps for 32-channel tiles (0.040 / 0.138 against
            # 0.043 / 0.143 at C 32, batch 256 / 1024)
            if tiles["BLOCK_N"] >= 64:
                tiles.update(BLOCK_M=256)
            elif tiles["BLOCK_N"] <= 32:
                tiles.update(num_warps=4)
        return "taps", dict(ACC64=acc64, **tiles)
    return "gemm", dict(ACC64=acc64, **gemm_config(c, k * r * s, dev))


def wgrad_config(k: int, crs: int, dev) -> dict:
    """wgrad's tiles: K rows (a 64-row tile at K = 32 idled half its rows: 1.3-1.7x slower
    at the MNIST first layer), C R S columns, 32 reduction indices a step."""
    cfg = gemm_config(crs, 32, dev)
    if dev.type == "cuda":
        cfg["BLOCK_M"] = _clamp_pow2(k, 16, 64)
    return dict(cfg, BLOCK_K=32)


# fp32 tap wgrad (fp64 dots): 16 reduction indices a step and C tiles of 64 columns even at
# C = 32. H100 (lab/gpu_conv_wgrad.py, K 64): 32x64x56x56 0.70 ms against 1.00 at 64 x 64 x
# 32; C 32 at 14x14, batch 64 / 256 / 1024: 0.101 / 0.320 / 1.203 against 0.132 / 0.419 /
# 1.711 at 64 x 32 x 32.
WGRAD_FP32_N = 64


def wgrad_plan(c: int, r: int, s: int, k: int, dtype: torch.dtype, dev) -> tuple[str, dict]:
    """("taps" or "gemm", tiles) for dw [K, C, R, S]: one filter tap a program with C
    columns at C >= 16, else C R S columns (``wgrad_config``)."""
    if c < TAPS_MIN_C:
        return "gemm", wgrad_config(k, c * r * s, dev)
    if dev.type != "cuda":
        bm, bn, bk = _clamp_pow2(k, 16, 32), _clamp_pow2(c, 16, 32), 16
    elif dtype == torch.float32:
        bm, bn, bk = _clamp_pow2(k, 16, 64), WGRAD_FP32_N, 16
    else:
        bm, bn, bk = _clamp_pow2(k, 16, 64), _clamp_pow2(c, 16, 64), 64
    return "taps", dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=4)


def triton_conv2d_fwd(x, w, bias, sh, sw, ph, pw):
    n, c, h, wd = x.shape
    k, _, r, s = w.shape
    p, q = out_size(h, wd, r, s, (sh, sw), (ph, pw))
    check_int32(x, w, p, q, "triton")
    y = torch.empty((n, k, p, q), dtype=x.dtype, device=x.device)
    m = n * p * q
    if m == 0:
        return y
    kind, cfg = fwd_plan(c, r, s, k, x.dtype, x.device)
    grid = (triton_support.cdiv(m, cfg["BLOCK_M"]) * triton_support.cdiv(k, cfg["BLOCK_N"]),)
    bias_arg = bias if bias is not None else y
    consts = dict(HAS_BIAS=bias is not None, **_consts(x), **cfg)
    nhwc = kind == "taps" and _nhwc("fwd", x.dtype, m)
    if nhwc:
        x = _channels_last(x)
    consts.update(fwd_runs(x, p, q, sw, kind))
    dims, conv = (c, h, wd, k, p, q, r, s, m, *x.stride()), (sh, sw, ph, pw)
    if kind == "taps":
        wt, ws = tap_weight(w, True, nhwc)
        _conv_fwd_taps_kernel[grid](x, wt, bias_arg, y, *dims, *ws, *conv, **consts)
    else:
        _conv_fwd_kernel[grid](x, w, bias_arg, y, *dims, *conv, **consts)
    return y


# fp32 wgrad (TF32 off): fp64 dots (exact products, fp64 sums) where True; else each
# BLOCK_K-deep fp32 dot summed in fp64.
WGRAD_DOT64 = True
# How wgrad sums dbias, by dtype (``_wgrad_step``'s DB, 1 where not listed; 0: torch sums
# dy's rows in fp64 after the kernel). fp32 (H100, lab/gpu_conv_parts.py): the kernel's
# fp64 row sums took wgrad from 0.76 to 1.71 ms at 1024x32x14x14 (0.56 / 0.91 at
# 32x64x56x56), the same error (0.24-0.47 of cuDNN's dbias error). 16-bit: fp32 sums a
# step (the fastest mode with channels-innermost reads).
WGRAD_DB: dict[torch.dtype, int] = {torch.float32: 0, torch.bfloat16: 2, torch.float16: 2}
# The GEMM wgrad's (C < 16) dbias by dtype: fp32 in-kernel fp64 sums (DB 1). H100, MNIST's
# first layer, dw and db: 0.137 ms against 0.315 with torch's sums at batch 1024 (0.054 /
# 0.101 at 256), the same error.
WGRAD_DB_GEMM: dict[torch.dtype, int] = {torch.float32: 1, torch.bfloat16: 2, torch.float16: 2}


def _wgrad_db(kind: str, dtype: torch.dtype) -> int:
    """The dbias mode (``_wgrad_step``'s DB) of the ``kind`` wgrad at ``dtype``."""
    return (WGRAD_DB_GEMM if kind == "gemm" else WGRAD_DB).get(dtype, 1)


# wgrad's programs per SM (tiles x splits), the splits' target: WGRAD_PROGRAMS_PER_SM below
# WGRAD_LARGE_NPQ reduction indices N P Q, WGRAD_PROGRAMS_PER_SM_LARGE from there. H100
# (lab/gpu_conv_parts.py --parts sums), wgrad at batch 1024, 2 -> 4 programs an SM: fp32
# 0.572 -> 0.545 ms (C 32 at 14x14), 0.139 -> 0.115 (C 1 at 28x28); bf16 0.175 -> 0.142,
# 0.124 -> 0.103. At batch 64 (N P Q 12544 and 50176) 2 or 4 by shape and dtype.
WGRAD_PROGRAMS_PER_SM = 2
WGRAD_PROGRAMS_PER_SM_LARGE = 4
WGRAD_LARGE_NPQ = 2**17


def _wgrad_split(tiles: int, npq: int, block_k: int, dev) -> tuple[int, int]:
    """(splits, chunk): enough programs to fill the GPU (WGRAD_PROGRAMS_PER_SM a
    multiprocessor, or _LARGE from WGRAD_LARGE_NPQ), down to one reduction tile per chunk;
    on the CPU two splits when the reduction allows, so the partial-sum path is exercised
    by the tests. Short chunks also shorten each fp32 running sum (the partials are added
    in fp64): with chunks of at least 8 tiles a small problem would be one chain of up to
    255 products, and its fp32 dw over the check's bound."""
    steps = triton_support.cdiv(npq, block_k)
    if dev.type == "cuda":
        per_sm = WGRAD_PROGRAMS_PER_SM if npq < WGRAD_LARGE_NPQ else WGRAD_PROGRAMS_PER_SM_LARGE
        want = triton_support.cdiv(per_sm * triton_support.sm_count(dev.index), tiles)
        splits = max(1, min(want, steps))
    else:
        splits = 2 if steps >= 2 else 1
    chunk = triton_support.cdiv(steps, splits) * block_k
    return triton_support.cdiv(npq, chunk), chunk


def _channel_sums(dy: torch.Tensor) -> torch.Tensor:
    """dy [N, K, P, Q] summed over all but K in fp64, the inner sums along its unit stride
    (one sum over dims (0, 2, 3) of NCHW dy was a third slower on the H100)."""
    n, k, p, q = dy.shape
    if dy.is_contiguous():
        return dy.view(n, k, p * q).sum(2, dtype=torch.float64).sum(0)
    if dy.is_contiguous(memory_format=torch.channels_last):
        return dy.permute(0, 2, 3, 1).reshape(n * p * q, k).sum(0, dtype=torch.float64)
    return dy.sum((0, 2, 3), dtype=torch.float64)


def triton_conv2d_bwd(dy, x, w, need_dx, sh, sw, ph, pw):
    n, c, h, wd = x.shape
    k, _, r, s = w.shape
    p, q = dy.shape[2], dy.shape[3]
    dx = torch.empty((n, c, h, wd) if need_dx else (0,), dtype=x.dtype, device=x.device)
    crs, npq = c * r * s, n * p * q
    consts = _consts(x)
    nhw = n * h * wd
    # dy comes at any strides: the tap kernels read it through its strides (or a
    # channels_last copy, TAPS_NHWC), the others contiguous; each copy made once
    copies = {}

    def dy_as(fmt):
        if fmt not in copies:
            copies[fmt] = dy.contiguous(memory_format=fmt)
        return copies[fmt]

    if need_dx and nhw:
        kind, cfg = dgrad_plan(c, r, s, k, x.dtype, x.device, npq)
        dims, conv = (c, h, wd, k, p, q, r, s, nhw), (sh, sw, ph, pw)
        if kind == "spread":
            cfg = dict(cfg)
            gather = cfg.pop("GATHER")
            wide = x.dtype == torch.float32
            t = torch.empty((c, r * s, npq), dtype=torch.float64 if wide else torch.float32, device=x.device)
            grid = (triton_support.cdiv(npq, cfg["BLOCK"]), c)
            dy_c, w_c = dy_as(torch.contiguous_format), w.contiguous()
            _conv_dgrad_spread_kernel[grid](dy_c, w_c, t, c, k, p * q, npq, r * s, UPCAST=consts["UPCAST"],
                                            WIDE=wide, **cfg)  # fmt: skip
            grid = (triton_support.cdiv(nhw, gather), c)
            _conv_dgrad_gather_kernel[grid](t, dx, c, h, wd, p, q, s, r * s, nhw, npq, *conv, BLOCK=gather)
        elif kind == "stencil":
            grid = (triton_support.cdiv(nhw, cfg["BLOCK"]), c)
            _conv_dgrad_stencil_kernel[grid](dy_as(torch.contiguous_format), w, dx, *dims, *conv, **cfg)
        else:
            grid = (triton_support.cdiv(nhw, cfg["BLOCK_M"]) * triton_support.cdiv(c, cfg["BLOCK_N"]),)
            if kind == "taps":
                nhwc = _nhwc("dgrad", x.dtype, npq)
                dy_t = dy_as(torch.channels_last) if nhwc else dy
                wt, ws = tap_weight(w, False, nhwc)
                strides = (*dy_t.stride(), *dx.stride(), *ws)
                runs = dgrad_runs(dy_t, x, sw)
                _conv_dgrad_taps_kernel[grid](dy_t, wt, dx, *dims, *strides, *conv, **consts, **cfg, **runs)
            else:
                _conv_dgrad_kernel[grid](dy_as(torch.contiguous_format), w, dx, *dims, *conv, **consts, **cfg)
    if npq == 0:
        return dx, torch.zeros_like(w), w.new_zeros(k)
    kind, cfg = wgrad_plan(c, r, s, k, x.dtype, x.device)
    x_t, dy_t = x, dy
    if kind == "taps":
        kernel = _conv_wgrad_taps_kernel
        tiles = triton_support.cdiv(k, cfg["BLOCK_M"]) * triton_support.cdiv(c, cfg["BLOCK_N"]) * r * s
        if _nhwc("wgrad", x.dtype, npq):
            x_t, dy_t = _channels_last(x), dy_as(torch.channels_last)
    else:
        kernel = _conv_wgrad_kernel
        tiles = triton_support.cdiv(k, cfg["BLOCK_M"]) * triton_support.cdiv(crs, cfg["BLOCK_N"])
    splits, chunk = _wgrad_split(tiles, npq, cfg["BLOCK_K"], x.device)
    dw_part = torch.empty((splits, k, crs), dtype=torch.float64, device=x.device)
    db_mode = _wgrad_db(kind, x.dtype)
    # (DB 0: the kernel writes no dbias partials; dw_part only fills the argument)
    db_part = dw_part if db_mode == 0 else torch.empty((splits, k), dtype=torch.float64, device=x.device)
    kernel[(tiles, splits)](
        dy_t, x_t, dw_part, db_part,
        c, h, wd, k, p, q, r, s, npq, chunk,
        *x_t.stride(), *dy_t.stride(),
        sh, sw, ph, pw,
        ACC64=x.dtype == torch.float32, DOT64=WGRAD_DOT64, DB=db_mode, **wgrad_runs(dy_t, x_t, sw),
        **consts, **cfg,
    )  # fmt: skip
    dw = dw_part.sum(0).to(w.dtype).view(w.shape)
    if db_mode == 0:  # dy summed in fp64, inner sums along unit stride
        db = _channel_sums(dy).to(w.dtype)
    else:
        db = db_part.sum(0).to(w.dtype)
    return dx, dw, db


conv2d_triton = conv_op("conv2d_triton", triton_conv2d_fwd, triton_conv2d_bwd, triton=True, strided_dy=True)


def _kernel_specs(dtype: str):
    """For `kernellab asm`: the kernels as the launchers plan them at the MNIST model's
    layers (1: C 1 -> K 32 at 28x28; 2: C 32 -> K 64 at 14x14; 3x3, batch 256) and a
    narrow one (C 8 -> K 16 at 14x14): the GEMM forward and wgrad and the stencil dgrad
    (layer 1), the GEMM dgrad (C 8), the tap forward, dgrad and wgrad (layer 2); with the
    integer arguments' values there, so the compile specializes them as the launch does."""
    geom = ("C", "H", "W", "K", "P", "Q", "R", "S")
    xs = ("sxn", "sxc", "sxh", "sxw")
    conv = ("SH", "SW", "PH", "PW")
    gpu = torch.device("cuda")
    tdt = torch.float32 if dtype == "fp32" else torch.bfloat16
    cx = dict(PRECISION="ieee" if dtype == "fp32" else "tf32", UPCAST=False)

    def sig(ptrs, ints, consts):
        out = {p: t for p, t in ptrs}
        out.update({n: "i32" for n in ints})
        out.update({n: "constexpr" for n in consts})
        return out

    def launch(kernel, ptrs, ints, consts):  # (kernel, signature, constexprs, compile options)
        consts = dict(consts)
        options = {"num_warps": consts.pop("num_warps"), "values": {n: vals[n] for n in ints}}
        return kernel, sig(ptrs, ints, consts), consts, options

    def act(channels, cl):  # an [N, channels, side, side] activation as the launcher has it
        t = torch.empty(256, channels, side, side, dtype=tdt, device="meta")
        return _channels_last(t) if cl else t

    def strides(names, t):
        return dict(zip(names, t.stride()))

    def w_values(out_inner, tap_major):
        _, ws = tap_weight(torch.empty(k, c, 3, 3, dtype=tdt, device="meta"), out_inner, tap_major)
        return dict(zip(("swk", "swc", "swt"), ws))

    p = f"*{dtype}"
    fwd_ptrs = [("x_ptr", p), ("w_ptr", p), ("b_ptr", p), ("y_ptr", p)]
    d_ptrs = [("dy_ptr", p), ("w_ptr", p), ("dx_ptr", p)]
    w_ptrs = [("dy_ptr", p), ("x_ptr", p), ("dw_part_ptr", "*fp64"), ("db_part_ptr", "*fp64")]
    fwd = {"taps": _conv_fwd_taps_kernel, "gemm": _conv_fwd_kernel}
    dgrad = {"taps": _conv_dgrad_taps_kernel, "gemm": _conv_dgrad_kernel}
    wgrad = {"taps": _conv_wgrad_taps_kernel, "gemm": _conv_wgrad_kernel}
    out = {}

    def w_strides(kind, out_inner, tap_major):
        # the tap kernels' weight strides (tap_weight's): the unit one as Triton specializes it
        if kind != "taps":
            return (), {}
        unit = ("swk" if out_inner else "swc") if tdt in TAP_MAJOR_DTYPES or tap_major else "swt"
        return tuple(n for n in ("swk", "swc", "swt") if n != unit), {unit: 1}

    def unit(names, inner):
        # x or dy strides as the launcher passes them, the unit one (channels when read
        # channels-innermost, else columns) as Triton specializes it
        one = names[1] if inner else names[3]
        return tuple(n for n in names if n != one), {one: 1}

    ds = ("sdn", "sdk", "sdp", "sdq")
    for c, k in ((1, 32), (8, 16), (32, 64)):
        kind, cfg = fwd_plan(c, 3, 3, k, tdt, gpu)
        npq = 256 * 14 * 14  # (the tap kernels run at layer 2 only)
        side = 28 if c == 1 else 14  # (the image's height and width)
        m = 256 * side * side
        vals = dict(C=c, H=side, W=side, K=k, P=side, Q=side, R=3, S=3, M=m, NHW=m, NPQ=m)
        vals.update(SH=1, SW=1, PH=1, PW=1)
        nhwc = kind == "taps" and _nhwc("fwd", tdt, npq)
        ws, wu = w_strides(kind, True, nhwc)
        xi, xu = unit(xs, nhwc)
        x = act(c, nhwc)
        vals.update(strides(xs, x), **w_values(True, nhwc))
        consts = dict(cx, HAS_BIAS=True, **xu, **wu, **fwd_runs(x, side, side, 1, kind), **cfg)
        spec = launch(fwd[kind], fwd_ptrs, geom + ("M",) + xi + ws + conv, consts)
        out.setdefault(fwd[kind], spec)
        kind, cfg = dgrad_plan(c, 3, 3, k, tdt, gpu)
        if kind == "spread":  # (and the stencil it falls back to past SPREAD_MAX_ELEMS)
            cfg = dict(cfg)
            gather = cfg.pop("GATHER")
            t = "*fp64" if dtype == "fp32" else "*fp32"
            vals.update(PQ=side * side, RS=9)
            spread = dict(cfg, UPCAST=False, WIDE=dtype == "fp32")
            spec = launch(_conv_dgrad_spread_kernel, [("dy_ptr", p), ("w_ptr", p), ("t_ptr", t)],
                          ("C", "K", "PQ", "NPQ", "RS"), spread)  # fmt: skip
            out.setdefault(_conv_dgrad_spread_kernel, spec)
            g_ints = ("C", "H", "W", "P", "Q", "S", "RS", "NHW", "NPQ") + conv
            spec = launch(_conv_dgrad_gather_kernel, [("t_ptr", t), ("dx_ptr", p)], g_ints,
                          dict(BLOCK=gather, num_warps=4))  # fmt: skip
            out.setdefault(_conv_dgrad_gather_kernel, spec)
            kind, cfg = "stencil", stencil_config(gpu)
        if kind == "stencil":
            spec = launch(_conv_dgrad_stencil_kernel, d_ptrs, geom + ("NHW",) + conv, cfg)
            out.setdefault(_conv_dgrad_stencil_kernel, spec)
        elif kind == "taps":
            nhwc = _nhwc("dgrad", tdt, npq)
            ws, wu = w_strides(kind, False, nhwc)
            (di, du), (xi, xu) = unit(ds, nhwc), unit(xs, False)
            dy, x = act(k, nhwc), act(c, False)
            vals.update(strides(ds, dy), **strides(xs, x), **w_values(False, nhwc))
            consts = dict(cx, **du, **xu, **wu, **dgrad_runs(dy, x, 1), **cfg)
            spec = launch(dgrad[kind], d_ptrs, geom + ("M",) + di + xi + ws + conv, consts)
            out.setdefault(dgrad[kind], spec)
        else:
            spec = launch(dgrad[kind], d_ptrs, geom + ("M",) + conv, dict(cx, **cfg))
            out.setdefault(dgrad[kind], spec)
        kind, cfg = wgrad_plan(c, 3, 3, k, tdt, gpu)
        nhwc = kind == "taps" and _nhwc("wgrad", tdt, npq)
        (xi, xu), (di, du) = unit(xs, nhwc), unit(ds, nhwc)
        wcx = dict(cx, ACC64=dtype == "fp32", DOT64=WGRAD_DOT64, DB=_wgrad_db(kind, tdt), **xu, **du)
        x, dy = act(c, nhwc), act(k, nhwc)
        wcx.update(wgrad_runs(dy, x, 1))
        vals.update(strides(xs, x), **strides(ds, dy), CHUNK=4 * cfg["BLOCK_K"])
        w_ints = geom + ("NPQ", "CHUNK") + xi + di + conv
        spec = launch(wgrad[kind], w_ptrs, w_ints, dict(wcx, **cfg))
        out.setdefault(wgrad[kind], spec)
    return list(out.values())


register_triton(
    "conv2d",
    conv2d_triton,
    _kernel_specs,
    "Triton implicit GEMM (no im2col copy): forward (tap-major at C >= 16), dgrad "
    "(a stencil at C <= 4), split wgrad with fused dbias",
)
