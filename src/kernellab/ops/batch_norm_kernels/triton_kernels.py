"""batch_norm2d and bn_relu_pool2d in Triton: kernels, config, launchers (bn_fwd, bn_bwd,
brp_fwd, brp_bwd) and what `kernellab asm` compiles; the ops' backends
(batch_norm2d/triton.py, bn_relu_pool2d/triton.py) declare their custom ops over these
launchers and register them.

batch_norm2d
------------
A channel's M = N * H * W elements sit in N separate runs of H * W (NCHW), so each channel
is cut into SPLIT chunks of its flat index i in [0, M) (image i // HW, pixel i % HW) and a
grid of (C, SPLIT) programs walks them: C alone (32 or 64 in the MNIST model) would leave
most of an H100's 132 SMs idle, and one program per channel would stream 3.2 MB (fp32,
batch 1024, 28x28) by itself.

Forward, two launches:
  1. stats: each program reduces its chunk, block by block, to (count, mean, M2) in fp64 with
     Chan's merge (a block's exact two-pass mean and M2 from registers, merged into the
     running values): one read of x, no E[x^2] - E[x]^2 cancellation.
  2. apply: each program merges the SPLIT partials of its channel (a few dozen floats),
     program 0 of the channel stores mean and rstd, and every program writes its chunk of
     y = (x - mean) * (rstd * w) + b.
Backward, two launches of the same shape: partial sums of dy and dy * xhat per chunk,
then dx = w * rstd * (dy - db / M - xhat * dw / M) per chunk, program 0 storing dw, db.

Traffic: forward reads x twice and writes y once (the second read is often an L2 hit at
the model's sizes: batch 256 x 32 x 28 x 28 fp32 is 25.7 MB against the H100's 50 MB);
backward reads x, dy twice, writes dx once. Partials: 3 x C x SPLIT forward,
2 x C x SPLIT backward, fp64: a few KB.

bn_relu_pool2d
--------------
Work is split as batch_norm2d's Triton backend splits it: a grid of (C, SPLIT) programs,
each walking one chunk of its channel's flat index in blocks (C alone, 32 or 64 in the
MNIST model, would leave most of the SMs idle). Four launches per forward + backward:

Forward
  1. stats: batch_norm2d's own statistics kernel (fp64 Chan merge of (count, mean, M2)
     per chunk over all N * H * W values: _bn_stats_kernel above).
  2. _fwd_kernel: one lane per pooled output over the channel's N * P * Q outputs; each
     program merges the SPLIT statistics partials of its channel (program 0 stores mean
     and rstd), loads the 2x2 window, finds its first maximum (a NaN wins) by comparing
     x * sign(rstd * w) (exact: see the kernel), normalizes that value in fp32,
     (x - mean) * (rstd * w) + b, and writes z = relu of it and the int8 code (the argmax
     r * 2 + s, or -1 where the value is <= 0: the relu closed the window).
Backward
  3. _bwd_sums_kernel: one lane per pooled output: where code >= 0, g = dz and x is
     gathered at the argmax; per-lane fp64 sums of g and g * (x - mean), added per
     chunk (as batch_norm2d's backward).
  4. _bwd_dx_kernel: one lane per input element over the channel's N * H * W: it finds
     its window (h // 2, w // 2; none in an odd size's last row / column), takes dz where
     the window's code points at it, and writes dx = w * rstd * (g - db / M - xhat * dw / M);
     program 0 of each channel stores dw and db.

Traffic against the unfused chain (batch_norm2d with relu, then max_pool2d), at the MNIST
model's first block, batch 1024 fp32 (x = 1024 x 32 x 28 x 28 x 4 B = 103 MB):
  unfused fwd: x read twice, y written (103 MB) and read by the pool (103 MB), z + codes
  written; fused fwd: x read twice, z + codes (25.7 + 6.4 MB) written: 206 MB less.
  unfused bwd: the pool's dx written in full (103 MB), read twice by batch_norm2d's
  backward (206 MB); fused: dz + codes read (32 MB, twice) + x gathered at the argmaxes.
~0.5 GB less per step over both blocks at batch 1024 (~0.15 ms at 3.35 TB/s), and two
launches fewer per block each way (forward 3 -> 2, backward 3 -> 2): at batch 64 the
step is launch bound and the launches are what fusion buys.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton.language as tl

from kernellab import triton_support
from kernellab.ops.batch_norm_kernels.batch_norm_op import dims, empty_stats
from kernellab.ops.batch_norm_kernels.fused_op import fwd_outputs, sizes


@dataclass(frozen=True)
class Config:
    """block: elements per step of a program on a GPU; interp_block under the interpreter,
    which pays per step (at 128 the model's 4 x 32 x 28 x 28 layer takes seconds a training
    step); tests pass a smaller one to the launchers to walk the block loop. programs_per_sm:
    grid size target C * SPLIT ~ programs_per_sm x SMs (a first guess, not tuned: 8 programs
    x 4 KB of loads per step = 32 KB in flight per SM, twice the ~15 KB an H100 needs to
    stream at full bandwidth: 3.35 TB/s x ~0.6 us / 132 SMs). interp_split: chunks per channel under
    the interpreter (several, so the partials' merge is exercised)."""

    block: int = 1024
    warps: int = 4
    programs_per_sm: int = 8
    interp_block: int = 512
    interp_split: int = 3


CONFIG = Config()


@triton_support.jit
def _bn_stats_kernel(
    x_ptr,  # [N, C, HW] contiguous, storage dtype
    part_ptr,  # [3, C, SPLIT] fp64: count, mean, M2 of each chunk
    C,
    HW,
    M,  # N * HW, the elements of one channel
    chunk,  # elements per chunk (a multiple of BLOCK)
    BLOCK: tl.constexpr,
):
    # Statistics in fp64 (a block's values widened after the load): rstd then carries
    # about an ulp of fp32 error, not the few ulps of an fp32 two-level merge, and dweight
    # (= rstd * sum(dy * (x - mean))) inherits it. PyTorch's CPU kernel accumulates in fp64
    # and the check bounds us by twice its error; on a GPU the fp64 work (2 flops per
    # element, H100: 67 TFLOP/s fp64) hides under the loads.
    c = tl.program_id(0)
    s = tl.program_id(1)
    split = tl.num_programs(1)
    start, end = chunk_bounds(s, chunk, M)
    cnt = tl.zeros((), dtype=tl.float64)
    mean = tl.zeros((), dtype=tl.float64)
    m2 = tl.zeros((), dtype=tl.float64)
    for i0 in range(start, end, BLOCK):
        mask, n, r, off = channel_block(i0, end, c, C, HW, BLOCK)
        x = tl.load(x_ptr + off, mask=mask, other=0.0).to(tl.float64)
        nb = tl.minimum(end - i0, BLOCK).to(tl.float64)
        mb = tl.sum(x, axis=0) / nb
        d = tl.where(mask, x - mb, 0.0)
        m2b = tl.sum(d * d, axis=0)
        tot = cnt + nb
        delta = mb - mean
        mean = mean + delta * (nb / tot)
        m2 = m2 + m2b + delta * delta * (cnt * (nb / tot))
        cnt = tot
    p = c * split + s
    tl.store(part_ptr + p, cnt)
    tl.store(part_ptr + C * split + p, mean)
    tl.store(part_ptr + 2 * C * split + p, m2)


@triton_support.jit
def channel_stats(part_ptr, C, split, c, eps, SPLIT_P2: tl.constexpr):
    """(mean, rstd) in fp32 of channel ``c`` from ``_bn_stats_kernel``'s [3, C, split] fp64
    partials (count, mean, M2 per chunk): Chan's merge in fp64, rounded once."""
    j = tl.arange(0, SPLIT_P2)
    jm = j < split
    pc = tl.load(part_ptr + c * split + j, mask=jm, other=0.0)
    pm = tl.load(part_ptr + C * split + c * split + j, mask=jm, other=0.0)
    pm2 = tl.load(part_ptr + 2 * C * split + c * split + j, mask=jm, other=0.0)
    total = tl.sum(pc, axis=0)
    mean64 = tl.sum(pc * pm, axis=0) / total
    dev = tl.where(jm, pm - mean64, 0.0)
    var = (tl.sum(pm2, axis=0) + tl.sum(pc * dev * dev, axis=0)) / total
    rstd = (1.0 / tl.sqrt(var + eps)).to(tl.float32)  # fp64: var is
    return mean64.to(tl.float32), rstd


@triton_support.jit
def chunk_bounds(s, chunk, total):
    """[start, end) of chunk ``s`` of a channel's ``total`` flat indices."""
    start = s * chunk
    return start, tl.minimum(start + chunk, total)


@triton_support.jit
def channel_block(i0, end, c, C, D, BLOCK: tl.constexpr):
    """The block at flat index i0 of channel c, i = n * D + r over planes of D elements
    ([N, C, D] contiguous): (mask, n, r, element offset)."""
    i = i0 + tl.arange(0, BLOCK)
    n = i // D
    r = i - n * D
    return i < end, n, r, (n.to(tl.int64) * C + c) * D + r


@triton_support.jit
def normalize_params(part_ptr, w_ptr, b_ptr, mean_ptr, rstd_ptr, C, split, c, s, eps, SPLIT_P2: tl.constexpr):
    """(mean, scale = rstd * w, shift = b) of channel c for the forward's expression
    (x - mean) * scale + shift, from the statistics partials; program s == 0 stores mean and
    rstd."""
    mean, rstd = channel_stats(part_ptr, C, split, c, eps, SPLIT_P2)
    if s == 0:
        tl.store(mean_ptr + c, mean)
        tl.store(rstd_ptr + c, rstd)
    scale = rstd * tl.load(w_ptr + c).to(tl.float32)
    shift = tl.load(b_ptr + c).to(tl.float32)
    return mean, scale, shift


@triton_support.jit
def add_grad_terms(acc_w, acc_b, g, x, mean64, mask):
    """The running fp64 sums of g * (x - mean) and g (an fp32 product and difference are
    exact in fp64)."""
    g64 = g.to(tl.float64)
    return acc_w + g64 * tl.where(mask, x.to(tl.float64) - mean64, 0.0), acc_b + g64


@triton_support.jit
def store_grad_partials(part_ptr, C, split, c, s, acc_w, acc_b):
    """Chunk s's sums of g * (x - mean) and g into part [2, C, split]."""
    p = c * split + s
    tl.store(part_ptr + p, tl.sum(acc_w, axis=0))
    tl.store(part_ptr + C * split + p, tl.sum(acc_b, axis=0))


@triton_support.jit
def grad_params(
    part_ptr, mean_ptr, rstd_ptr, w_ptr, dw_ptr, db_ptr, C, split, c, s, M, SPLIT_P2: tl.constexpr
):
    """dw and db of channel c from the [2, C, split] partials (rstd applied once, fp64;
    program s == 0 stores them) and what dx = k * (g - db / M - xhat * dw / M) needs:
    (mean, rstd, k = w * rstd, db / M, dw / M)."""
    j = tl.arange(0, SPLIT_P2)
    jm = j < split
    mean = tl.load(mean_ptr + c)
    rstd = tl.load(rstd_ptr + c)
    dw64 = tl.sum(tl.load(part_ptr + c * split + j, mask=jm, other=0.0), axis=0) * rstd.to(tl.float64)
    db64 = tl.sum(tl.load(part_ptr + C * split + c * split + j, mask=jm, other=0.0), axis=0)
    dw = dw64.to(tl.float32)
    db = db64.to(tl.float32)
    if s == 0:
        tl.store(dw_ptr + c, dw.to(dw_ptr.dtype.element_ty))
        tl.store(db_ptr + c, db.to(db_ptr.dtype.element_ty))
    k = tl.load(w_ptr + c).to(tl.float32) * rstd  # = the forward's scale
    return mean, rstd, k, db / M, dw / M


@triton_support.jit
def _bn_fwd_apply_kernel(
    x_ptr,  # [N, C, HW] contiguous
    w_ptr,  # [C]
    b_ptr,  # [C]
    y_ptr,  # [N, C, HW] contiguous, x's dtype
    part_ptr,  # [3, C, SPLIT] fp64 from _bn_stats_kernel
    mean_ptr,  # [C] fp32 out
    rstd_ptr,  # [C] fp32 out
    C,
    HW,
    M,
    chunk,
    eps,
    SPLIT_P2: tl.constexpr,  # next power of two >= SPLIT
    BLOCK: tl.constexpr,
    RELU: tl.constexpr,  # y = max(y, 0)
):
    c = tl.program_id(0)
    s = tl.program_id(1)
    split = tl.num_programs(1)
    mean, scale, shift = normalize_params(
        part_ptr, w_ptr, b_ptr, mean_ptr, rstd_ptr, C, split, c, s, eps, SPLIT_P2
    )
    start, end = chunk_bounds(s, chunk, M)
    for i0 in range(start, end, BLOCK):
        mask, n, r, off = channel_block(i0, end, c, C, HW, BLOCK)
        x = tl.load(x_ptr + off, mask=mask, other=0.0).to(tl.float32)
        y = (x - mean) * scale + shift
        if RELU:  # NaN passes, as torch.relu's (tl.maximum(NaN, 0) is 0)
            y = tl.where(y <= 0.0, 0.0, y)
        tl.store(y_ptr + off, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton_support.jit
def _bn_bwd_sums_kernel(
    dy_ptr,  # [N, C, HW] contiguous
    x_ptr,  # [N, C, HW] contiguous
    w_ptr,  # [C] (read when RELU)
    b_ptr,  # [C] (read when RELU)
    mean_ptr,  # [C] fp32
    rstd_ptr,  # [C] fp32
    part_ptr,  # [2, C, SPLIT] fp64: sum(g * (x - mean)), sum(g) of each chunk (g: dy, relu-masked)
    C,
    HW,
    M,
    chunk,
    BLOCK: tl.constexpr,
    RELU: tl.constexpr,  # g = dy where the forward's pre-activation was > 0, else 0
):
    c = tl.program_id(0)
    s = tl.program_id(1)
    split = tl.num_programs(1)
    mean = tl.load(mean_ptr + c)
    if RELU:
        scale = tl.load(rstd_ptr + c) * tl.load(w_ptr + c).to(tl.float32)
        shift = tl.load(b_ptr + c).to(tl.float32)
    mean64 = mean.to(tl.float64)
    acc_w = tl.zeros([BLOCK], dtype=tl.float64)
    acc_b = tl.zeros([BLOCK], dtype=tl.float64)
    start, end = chunk_bounds(s, chunk, M)
    for i0 in range(start, end, BLOCK):
        mask, n, r, off = channel_block(i0, end, c, C, HW, BLOCK)
        x = tl.load(x_ptr + off, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + off, mask=mask, other=0.0).to(tl.float32)
        if RELU:  # the forward's expression: the same fp32 value, the same sign
            dy = tl.where((x - mean) * scale + shift <= 0.0, 0.0, dy)  # (NaN passes dy)
        # The terms and their sums in fp64 (an fp32 product and difference are exact
        # there), rstd applied once to the channel's sum: dweight and dbias are the exact
        # sums rounded once. fp32 lanes lost up to a few ulps to cancellation at small
        # channels (a 1,500-term sum near zero); the fp64 work (3 flops per element) hides
        # under the loads on an H100, as in _bn_stats_kernel.
        acc_w, acc_b = add_grad_terms(acc_w, acc_b, dy, x, mean64, mask)
    store_grad_partials(part_ptr, C, split, c, s, acc_w, acc_b)


@triton_support.jit
def _bn_bwd_apply_kernel(
    dy_ptr,  # [N, C, HW] contiguous
    x_ptr,  # [N, C, HW] contiguous
    w_ptr,  # [C]
    b_ptr,  # [C] (read when RELU)
    mean_ptr,  # [C] fp32
    rstd_ptr,  # [C] fp32
    part_ptr,  # [2, C, SPLIT] fp64 from _bn_bwd_sums_kernel
    dx_ptr,  # [N, C, HW] contiguous, x's dtype
    dw_ptr,  # [C], w's dtype
    db_ptr,  # [C], w's dtype
    C,
    HW,
    M,
    chunk,
    SPLIT_P2: tl.constexpr,
    BLOCK: tl.constexpr,
    RELU: tl.constexpr,
):
    c = tl.program_id(0)
    s = tl.program_id(1)
    split = tl.num_programs(1)
    mean, rstd, k, mdb, mdw = grad_params(
        part_ptr, mean_ptr, rstd_ptr, w_ptr, dw_ptr, db_ptr, C, split, c, s, M, SPLIT_P2
    )
    if RELU:
        shift = tl.load(b_ptr + c).to(tl.float32)
    start, end = chunk_bounds(s, chunk, M)
    for i0 in range(start, end, BLOCK):
        mask, n, r, off = channel_block(i0, end, c, C, HW, BLOCK)
        x = tl.load(x_ptr + off, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + off, mask=mask, other=0.0).to(tl.float32)
        if RELU:
            dy = tl.where((x - mean) * k + shift <= 0.0, 0.0, dy)
        xhat = (x - mean) * rstd
        dx = k * (dy - mdb - xhat * mdw)
        tl.store(dx_ptr + off, dx.to(dx_ptr.dtype.element_ty), mask=mask)


# --------------------------------------------------------------------------- bn_relu_pool2d


@triton_support.jit
def _window_step(best, bx, arg, v, sgn, j):
    """One more value v (window position j) against the running maximum: taken where its
    key v * sgn is larger or a NaN (PyTorch's rule); (best key, its x, its position)."""
    key = v * sgn
    take = (key > best) | (key != key)
    return tl.where(take, key, best), tl.where(take, v, bx), tl.where(take, j, arg)


@triton_support.jit
def _fwd_kernel(
    x_ptr,  # [N, C, H, W] contiguous, storage dtype
    w_ptr,  # [C]
    b_ptr,  # [C]
    z_ptr,  # [N, C, P, Q] contiguous, x's dtype (out)
    code_ptr,  # [N, C, P, Q] int8 (out): argmax r * 2 + s, or -1 where the relu closed
    part_ptr,  # [3, C, split_s] fp64: count, mean, M2 per chunk (the stats kernel's)
    mean_ptr,  # [C] fp32 (out)
    rstd_ptr,  # [C] fp32 (out)
    C,
    H,
    W,
    P,
    Q,
    split_s,  # chunks of the statistics kernel
    MO,  # N * P * Q, pooled outputs of one channel
    chunk,  # pooled outputs per program (a multiple of BLOCK)
    eps,
    SPLIT_P2: tl.constexpr,  # next power of two >= split_s
    BLOCK: tl.constexpr,
):
    c = tl.program_id(0)
    s = tl.program_id(1)
    # batch_norm2d's expression (x - mean) * (rstd * w) + b: the same fp32 values, so the
    # fused block and the unfused fp32 one make the same relu and max decisions
    mean, scale, shift = normalize_params(
        part_ptr, w_ptr, b_ptr, mean_ptr, rstd_ptr, C, split_s, c, s, eps, SPLIT_P2
    )
    start, end = chunk_bounds(s, chunk, MO)
    for i0 in range(start, end, BLOCK):
        mask, n, r, o = channel_block(i0, end, c, C, P * Q, BLOCK)  # o: the pooled output
        p = r // Q
        q = r - p * Q
        top = ((n.to(tl.int64) * C + c) * H + 2 * p) * W + 2 * q  # the window's (0, 0)
        # The window's maximum is found on x itself: the normalization is an increasing
        # map of x where rstd * w > 0, decreasing where < 0 and constant where 0, so the
        # argmax of the pre-activation is the argmax of x * sign(scale). Comparing x (exact)
        # rather than the rounded fp32 pre-activations keeps two values 1 ulp apart from
        # collapsing into a tie: the choice is the float64 reference's, not a rounding's
        # (at batch 1024 fp32 about one window per layer would otherwise route its
        # gradient to the wrong position). Row-major order, the first maximum kept, a NaN
        # wins (PyTorch's rule).
        sgn = tl.where(scale > 0.0, 1.0, tl.where(scale < 0.0, -1.0, 0.0))
        bx = tl.load(x_ptr + top, mask=mask, other=0.0).to(tl.float32)
        best = bx * sgn
        arg = tl.zeros([BLOCK], dtype=tl.int32)
        v = tl.load(x_ptr + top + 1, mask=mask, other=0.0).to(tl.float32)
        best, bx, arg = _window_step(best, bx, arg, v, sgn, 1)
        v = tl.load(x_ptr + top + W, mask=mask, other=0.0).to(tl.float32)
        best, bx, arg = _window_step(best, bx, arg, v, sgn, 2)
        v = tl.load(x_ptr + top + W + 1, mask=mask, other=0.0).to(tl.float32)
        best, bx, arg = _window_step(best, bx, arg, v, sgn, 3)
        # relu after the max (they commute); batch_norm2d's fp32 expression, so the relu
        # decision is the unfused chain's; a NaN passes, as torch.relu's does
        a = (bx - mean) * scale + shift
        open_ = (a > 0.0) | (a != a)
        tl.store(z_ptr + o, tl.where(open_, a, 0.0).to(z_ptr.dtype.element_ty), mask=mask)
        tl.store(code_ptr + o, tl.where(open_, arg, -1).to(tl.int8), mask=mask)


@triton_support.jit
def _bwd_sums_kernel(
    dz_ptr,  # [N, C, P, Q] contiguous
    code_ptr,  # [N, C, P, Q] int8
    x_ptr,  # [N, C, H, W] contiguous
    mean_ptr,  # [C] fp32
    part_ptr,  # [2, C, SPLIT] fp64 (out): sum(g * (x - mean)), sum(g) per chunk
    C,
    H,
    W,
    P,
    Q,
    MO,
    chunk,
    BLOCK: tl.constexpr,
):
    c = tl.program_id(0)
    s = tl.program_id(1)
    split = tl.num_programs(1)
    mean = tl.load(mean_ptr + c)
    mean64 = mean.to(tl.float64)
    acc_w = tl.zeros([BLOCK], dtype=tl.float64)
    acc_b = tl.zeros([BLOCK], dtype=tl.float64)
    start, end = chunk_bounds(s, chunk, MO)
    for i0 in range(start, end, BLOCK):
        mask, n, r, o = channel_block(i0, end, c, C, P * Q, BLOCK)
        p = r // Q
        q = r - p * Q
        code = tl.load(code_ptr + o, mask=mask, other=-1).to(tl.int32)
        live = mask & (code >= 0)
        # x at the argmax: a gather of a quarter of x's elements (the window's row 2p or
        # 2p + 1, column 2q or 2q + 1)
        at = ((n.to(tl.int64) * C + c) * H + 2 * p + code // 2) * W + 2 * q + code % 2
        x = tl.load(x_ptr + at, mask=live, other=0.0).to(tl.float32)
        g = tl.load(dz_ptr + o, mask=live, other=0.0).to(tl.float32)
        acc_w, acc_b = add_grad_terms(acc_w, acc_b, g, x, mean64, live)  # fp64, as batch_norm2d's
    store_grad_partials(part_ptr, C, split, c, s, acc_w, acc_b)


@triton_support.jit
def _bwd_dx_kernel(
    dz_ptr,  # [N, C, P, Q] contiguous
    code_ptr,  # [N, C, P, Q] int8
    x_ptr,  # [N, C, H, W] contiguous
    w_ptr,  # [C]
    mean_ptr,  # [C] fp32
    rstd_ptr,  # [C] fp32
    part_ptr,  # [2, C, split_g] fp64 from _bwd_sums_kernel
    dx_ptr,  # [N, C, H, W] contiguous, x's dtype (out)
    dw_ptr,  # [C], w's dtype (out)
    db_ptr,  # [C], w's dtype (out)
    C,
    H,
    W,
    P,
    Q,
    split_g,  # chunks of the sums kernel
    M,  # N * H * W
    chunk,
    SPLIT_P2: tl.constexpr,
    BLOCK: tl.constexpr,
):
    c = tl.program_id(0)
    s = tl.program_id(1)
    mean, rstd, k, mdb, mdw = grad_params(
        part_ptr, mean_ptr, rstd_ptr, w_ptr, dw_ptr, db_ptr, C, split_g, c, s, M, SPLIT_P2
    )
    HW = H * W
    PQ = P * Q
    start, end = chunk_bounds(s, chunk, M)
    for i0 in range(start, end, BLOCK):
        mask, n, hw, off = channel_block(i0, end, c, C, HW, BLOCK)
        h = hw // W
        w = hw - h * W
        p = h // 2
        q = w // 2
        inpool = mask & (p < P) & (q < Q)  # an odd size's last row / column: no window
        o = (n.to(tl.int64) * C + c) * PQ + p * Q + q
        code = tl.load(code_ptr + o, mask=inpool, other=-1).to(tl.int32)
        hit = inpool & (code == (h - 2 * p) * 2 + (w - 2 * q))
        g = tl.load(dz_ptr + o, mask=hit, other=0.0).to(tl.float32)
        x = tl.load(x_ptr + off, mask=mask, other=0.0).to(tl.float32)
        xhat = (x - mean) * rstd
        dx = k * (g - mdb - xhat * mdw)
        tl.store(dx_ptr + off, dx.to(dx_ptr.dtype.element_ty), mask=mask)


# --------------------------------------------------------------------------- launchers


def split_grid(m: int, block: int, split: int) -> tuple[int, int, int]:
    """(BLOCK, SPLIT, chunk) of m elements cut in about ``split`` chunks of whole blocks."""
    chunk = triton_support.cdiv(triton_support.cdiv(m, split), block) * block
    return block, triton_support.cdiv(m, chunk), chunk


def gpu_grid(c: int, m: int, sms: int, cfg: Config = CONFIG) -> tuple[int, int, int]:
    """grid_of on a GPU of ``sms`` SMs: ~programs_per_sm x SMs programs over c channels, at
    most one per block of a channel's m elements."""
    split = max(1, min(triton_support.cdiv(cfg.programs_per_sm * sms, c), triton_support.cdiv(m, cfg.block)))
    return split_grid(m, cfg.block, split)


def grid_of(c: int, m: int, dev: torch.device, cfg: Config = CONFIG) -> tuple[int, int, int]:
    """(BLOCK, SPLIT, chunk): chunks of whole blocks, ~programs_per_sm x SMs programs."""
    if dev.type == "cuda":
        return gpu_grid(c, m, triton_support.sm_count(dev.index), cfg)
    split = max(1, min(cfg.interp_split, triton_support.cdiv(m, cfg.interp_block)))
    return split_grid(m, cfg.interp_block, split)


def _warps(dev, cfg: Config = CONFIG) -> int:
    return cfg.warps if dev.type == "cuda" else 1


def bn_fwd(x, w, b, eps, relu=False, cfg: Config = CONFIG):
    """See batch_norm_op.py: (y, mean, rstd); x contiguous NCHW."""
    y = torch.empty_like(x)
    mean, rstd = empty_stats(x)
    n, c, hw, m = dims(x)
    if m == 0 or c == 0:
        return y, mean.zero_(), rstd.zero_()
    block, split, chunk = grid_of(c, m, x.device, cfg)
    part = torch.empty((3, c, split), dtype=torch.float64, device=x.device)
    warps = _warps(x.device)
    _bn_stats_kernel[(c, split)](x, part, c, hw, m, chunk, BLOCK=block, num_warps=warps)
    _bn_fwd_apply_kernel[(c, split)](
        x, w, b, y, part, mean, rstd, c, hw, m, chunk, eps,
        SPLIT_P2=triton_support.next_pow2(split), BLOCK=block, RELU=bool(relu), num_warps=warps,
    )  # fmt: skip
    return y, mean, rstd


def bn_bwd(dy, x, w, b, mean, rstd, relu=False, cfg: Config = CONFIG):
    """See batch_norm_op.py: (dx, dw, db); dy and x contiguous NCHW."""
    dx = torch.empty_like(x)
    n, c, hw, m = dims(x)
    if m == 0 or c == 0:
        return dx, torch.zeros_like(w), torch.zeros_like(w)
    dw, db = torch.empty_like(w), torch.empty_like(w)
    block, split, chunk = grid_of(c, m, x.device, cfg)
    part = torch.empty((2, c, split), dtype=torch.float64, device=x.device)
    relu = bool(relu)
    warps = _warps(x.device)
    _bn_bwd_sums_kernel[(c, split)](
        dy, x, w, b, mean, rstd, part, c, hw, m, chunk, BLOCK=block, RELU=relu, num_warps=warps
    )
    _bn_bwd_apply_kernel[(c, split)](
        dy, x, w, b, mean, rstd, part, dx, dw, db, c, hw, m, chunk,
        SPLIT_P2=triton_support.next_pow2(split), BLOCK=block, RELU=relu, num_warps=warps,
    )  # fmt: skip
    return dx, dw, db


def brp_fwd(x, w, b, eps, cfg: Config = CONFIG):
    """See fused_op.py: (z, code, mean, rstd); x contiguous NCHW, H, W >= 2."""
    c, h, wd, p, q, m, mo = sizes(x)
    z, code, mean, rstd = fwd_outputs(x)
    if m == 0 or c == 0:
        return z, code, mean.zero_(), rstd.zero_()
    warps = _warps(x.device, cfg)
    block, split_s, chunk_s = grid_of(c, m, x.device, cfg)
    part = torch.empty((3, c, split_s), dtype=torch.float64, device=x.device)
    _bn_stats_kernel[(c, split_s)](x, part, c, h * wd, m, chunk_s, BLOCK=block, num_warps=warps)
    block, split, chunk = grid_of(c, mo, x.device, cfg)
    _fwd_kernel[(c, split)](
        x, w, b, z, code, part, mean, rstd, c, h, wd, p, q, split_s, mo, chunk, eps,
        SPLIT_P2=triton_support.next_pow2(split_s), BLOCK=block, num_warps=warps,
    )  # fmt: skip
    return z, code, mean, rstd


def brp_bwd(dz, x, w, code, mean, rstd, cfg: Config = CONFIG):
    """See fused_op.py: (dx, dw, db); dz [N, C, P, Q] and x contiguous."""
    c, h, wd, p, q, m, mo = sizes(x)
    dx = torch.empty_like(x)
    if m == 0 or c == 0:
        return dx, torch.zeros_like(w), torch.zeros_like(w)
    dw, db = torch.empty_like(w), torch.empty_like(w)
    warps = _warps(x.device, cfg)
    block, split_g, chunk_g = grid_of(c, mo, x.device, cfg)
    part = torch.empty((2, c, split_g), dtype=torch.float64, device=x.device)
    _bwd_sums_kernel[(c, split_g)](
        dz, code, x, mean, part, c, h, wd, p, q, mo, chunk_g, BLOCK=block, num_warps=warps
    )
    block, split, chunk = grid_of(c, m, x.device, cfg)
    _bwd_dx_kernel[(c, split)](
        dz, code, x, w, mean, rstd, part, dx, dw, db, c, h, wd, p, q, split_g, m, chunk,
        SPLIT_P2=triton_support.next_pow2(split_g), BLOCK=block, num_warps=warps,
    )  # fmt: skip
    return dx, dw, db


# --------------------------------------------------------------------------- kernel specs


# The layer the specs compile for: the MNIST CNN's first BatchNorm (C = 32 over 256 x 28 x 28)
# on a GPU of 132 SMs (H100 SXM, H200); SPLIT_P2 follows the launch's split there.
SPEC_C, SPEC_M, SPEC_SMS = 32, 256 * 28 * 28, 132
SPEC_SPLIT_P2 = triton_support.next_pow2(gpu_grid(SPEC_C, SPEC_M, SPEC_SMS)[1])


def batch_norm_kernel_specs(dtype: str):
    """For `kernellab asm`: the four kernels as launched on a GPU (SPEC_C, SPEC_M, SPEC_SMS)."""
    t, f = f"*{dtype}", "*fp32"
    i = "i32"
    block = {"BLOCK": CONFIG.block}
    both = {"SPLIT_P2": SPEC_SPLIT_P2, **block, "RELU": True}
    sums = {**block, "RELU": True}
    return [
        (_bn_stats_kernel, {"x_ptr": t, "part_ptr": "*fp64", "C": i, "HW": i, "M": i, "chunk": i, "BLOCK": "constexpr"},
         block, CONFIG.warps),
        (_bn_fwd_apply_kernel, {"x_ptr": t, "w_ptr": t, "b_ptr": t, "y_ptr": t, "part_ptr": "*fp64", "mean_ptr": f,
                                "rstd_ptr": f, "C": i, "HW": i, "M": i, "chunk": i, "eps": "fp32",
                                "SPLIT_P2": "constexpr", "BLOCK": "constexpr", "RELU": "constexpr"}, both,
         CONFIG.warps),
        (_bn_bwd_sums_kernel, {"dy_ptr": t, "x_ptr": t, "w_ptr": t, "b_ptr": t, "mean_ptr": f, "rstd_ptr": f,
                               "part_ptr": "*fp64", "C": i, "HW": i, "M": i, "chunk": i, "BLOCK": "constexpr",
                               "RELU": "constexpr"}, sums, CONFIG.warps),
        (_bn_bwd_apply_kernel, {"dy_ptr": t, "x_ptr": t, "w_ptr": t, "b_ptr": t, "mean_ptr": f, "rstd_ptr": f,
                                "part_ptr": "*fp64", "dx_ptr": t, "dw_ptr": t, "db_ptr": t, "C": i, "HW": i, "M": i,
                                "chunk": i, "SPLIT_P2": "constexpr", "BLOCK": "constexpr", "RELU": "constexpr"},
         both, CONFIG.warps),
    ]  # fmt: skip


def bn_relu_pool_kernel_specs(dtype: str):
    """For `kernellab asm`: bn_relu_pool2d's own three kernels as launched on a GPU (its
    statistics kernel is batch_norm2d's), at batch_norm_kernel_specs's layer."""
    t, f, i = f"*{dtype}", "*fp32", "i32"
    geo = {"C": i, "H": i, "W": i, "P": i, "Q": i}
    pooled_p2 = triton_support.next_pow2(gpu_grid(SPEC_C, SPEC_M // 4, SPEC_SMS)[1])  # dx: the pooled sums'
    return [
        (_fwd_kernel, {"x_ptr": t, "w_ptr": t, "b_ptr": t, "z_ptr": t, "code_ptr": "*i8", "part_ptr": "*fp64",
                       "mean_ptr": f, "rstd_ptr": f, **geo, "split_s": i, "MO": i, "chunk": i, "eps": "fp32",
                       "SPLIT_P2": "constexpr", "BLOCK": "constexpr"},
         {"SPLIT_P2": SPEC_SPLIT_P2, "BLOCK": CONFIG.block}, CONFIG.warps),
        (_bwd_sums_kernel, {"dz_ptr": t, "code_ptr": "*i8", "x_ptr": t, "mean_ptr": f, "part_ptr": "*fp64", **geo,
                            "MO": i, "chunk": i, "BLOCK": "constexpr"}, {"BLOCK": CONFIG.block}, CONFIG.warps),
        (_bwd_dx_kernel, {"dz_ptr": t, "code_ptr": "*i8", "x_ptr": t, "w_ptr": t, "mean_ptr": f, "rstd_ptr": f,
                          "part_ptr": "*fp64", "dx_ptr": t, "dw_ptr": t, "db_ptr": t, **geo, "split_g": i, "M": i,
                          "chunk": i, "SPLIT_P2": "constexpr", "BLOCK": "constexpr"},
         {"SPLIT_P2": pooled_p2, "BLOCK": CONFIG.block}, CONFIG.warps),
    ]  # fmt: skip
