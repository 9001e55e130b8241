"""bn_relu_pool2d in Triton: kernels, launchers, custom op, registration.

Work is split as batch_norm2d's Triton backend splits it: a grid of (C, SPLIT) programs,
each walking one chunk of its channel's flat index in blocks (C alone, 32 or 64 in the
MNIST model, would leave most of the SMs idle). Four launches per forward + backward:

Forward
  1. stats: batch_norm2d's own statistics kernel (fp64 Chan merge of (count, mean, M2)
     per chunk over all N * H * W values; see batch_norm2d/triton.py).
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

import torch
import triton.language as tl

from kernellab import triton_support
from kernellab.ops._register import register_triton
from kernellab.ops.batch_norm_kernels.triton_kernels import (
    CONFIG,
    Config,
    _bn_stats_kernel,
    add_grad_terms,
    channel_block,
    chunk_bounds,
    grad_params,
    grid_of,
    normalize_params,
    store_grad_partials,
)
from kernellab.ops.batch_norm_kernels.fused_op import bn_relu_pool_op, fwd_outputs, sizes

__all__ = ["CONFIG", "Config", "brp_bwd", "brp_fwd"]


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


def _warps(dev, cfg: Config) -> int:
    return cfg.warps if dev.type == "cuda" else 1


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


# --------------------------------------------------------------------------- registration

bn_relu_pool2d_triton = bn_relu_pool_op("bn_relu_pool2d_triton", brp_fwd, brp_bwd, triton=True)


def kernel_specs(dtype: str):
    """For `kernellab asm`: the three kernels of this file as launched on a GPU (the
    statistics kernel is batch_norm2d's)."""
    t, f, i = f"*{dtype}", "*fp32", "i32"
    geo = {"C": i, "H": i, "W": i, "P": i, "Q": i}
    return [
        (_fwd_kernel, {"x_ptr": t, "w_ptr": t, "b_ptr": t, "z_ptr": t, "code_ptr": "*i8", "part_ptr": "*fp64",
                       "mean_ptr": f, "rstd_ptr": f, **geo, "split_s": i, "MO": i, "chunk": i, "eps": "fp32",
                       "SPLIT_P2": "constexpr", "BLOCK": "constexpr"},
         {"SPLIT_P2": 32, "BLOCK": CONFIG.block}, CONFIG.warps),
        (_bwd_sums_kernel, {"dz_ptr": t, "code_ptr": "*i8", "x_ptr": t, "mean_ptr": f, "part_ptr": "*fp64", **geo,
                            "MO": i, "chunk": i, "BLOCK": "constexpr"}, {"BLOCK": CONFIG.block}, CONFIG.warps),
        (_bwd_dx_kernel, {"dz_ptr": t, "code_ptr": "*i8", "x_ptr": t, "w_ptr": t, "mean_ptr": f, "rstd_ptr": f,
                          "part_ptr": "*fp64", "dx_ptr": t, "dw_ptr": t, "db_ptr": t, **geo, "split_g": i, "M": i,
                          "chunk": i, "SPLIT_P2": "constexpr", "BLOCK": "constexpr"},
         {"SPLIT_P2": 32, "BLOCK": CONFIG.block}, CONFIG.warps),
    ]  # fmt: skip


register_triton(
    "bn_relu_pool2d",
    bn_relu_pool2d_triton,
    kernel_specs,
    "Triton: batch-norm statistics + one normalize/relu/pool kernel (int8 argmax codes); "
    "backward: sums over the argmaxes + one dx kernel",
)
