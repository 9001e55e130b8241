"""A candidate for conv2d's wgrad at few input channels (C <= 4, the MNIST first layer):
dw and db in one pass over dy, a program per chunk of output pixels holding every output
channel. For each pixel block it loads dy [K, BLOCK] once, widens it to fp64, and for each
filter tap (c, r, s) gathers x's shifted pixels and adds the K dot products into a
[K, C R S] fp64 accumulator (exact products of fp32 operands, fp64 sums); db is the same
tile's row sums. src's GEMM form (``_conv_wgrad_kernel``) pads C R S = 9 columns to a
16-wide dot tile and sums db in a second pass over dy for fp32.

    import conv_wgrad_pixels; dw, db = conv_wgrad_pixels.wgrad(dy, x, w.shape, sh, sw, ph, pw)

``lab/gpu_conv_layer1.py`` times it beside src's wgrad (``px{BLOCK}x{programs per SM}``).
"""

import torch
import triton.language as tl

from kernellab import triton_support


@triton_support.jit
def conv_wgrad_pixels_kernel(
    dy_ptr, x_ptr, dw_part_ptr, db_part_ptr,  # dy [N, K, P, Q], x [N, C, H, W] contiguous;
    # dw_part [SPLIT, K, CRS_PAD] and db_part [SPLIT, K] fp64
    C, H, W, K, P, Q, NPQ, CHUNK,
    SH, SW, PH, PW,
    R: tl.constexpr, S: tl.constexpr, CRS_PAD: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK: tl.constexpr, WIDE: tl.constexpr,
):
    split = tl.program_id(0)
    ks = tl.arange(0, BLOCK_K)
    k_ok = ks < K
    cols = tl.arange(0, CRS_PAD)
    pq = P * Q
    hw = H * W
    acc = tl.zeros((BLOCK_K, CRS_PAD), dtype=tl.float64)
    db = tl.zeros((BLOCK_K,), dtype=tl.float64)
    start = split * CHUNK
    end = tl.minimum(start + CHUNK, NPQ)
    for j0 in range(start, end, BLOCK):
        j = j0 + tl.arange(0, BLOCK)
        j_ok = j < end
        nb, rem = j // pq, j % pq
        op, oq = rem // Q, rem % Q
        d = tl.load(dy_ptr + ks[:, None] * pq + (nb * (K * pq) + rem)[None, :],
                    mask=k_ok[:, None] & j_ok[None, :], other=0.0)  # fmt: skip
        if WIDE:
            d = d.to(tl.float64)
        else:
            d = d.to(tl.float32)
        db += tl.sum(d.to(tl.float64), axis=1)
        ih0, iw0 = op * SH - PH, oq * SW - PW
        for c in range(0, C):
            for r in tl.static_range(R):
                for s in tl.static_range(S):
                    ih, iw = ih0 + r, iw0 + s
                    ok = j_ok & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
                    xv = tl.load(x_ptr + nb * (C * hw) + c * hw + ih * W + iw, mask=ok, other=0.0)
                    if WIDE:
                        part = tl.sum(d * xv.to(tl.float64)[None, :], axis=1)
                    else:
                        part = tl.sum(d * xv.to(tl.float32)[None, :], axis=1).to(tl.float64)
                    col = c * (R * S) + r * S + s
                    acc += tl.where(cols[None, :] == col, part[:, None], 0.0)
    tl.store(dw_part_ptr + split * (K * CRS_PAD) + ks[:, None] * CRS_PAD + cols[None, :], acc,
             mask=k_ok[:, None])  # fmt: skip
    tl.store(db_part_ptr + split * K + ks, db, mask=k_ok)


PROGRAMS_PER_SM = 4
BLOCK = 128


def wgrad(dy, x, w_shape, sh, sw, ph, pw, block=None, programs_per_sm=None, warps=4):
    """(dw, db) of a conv2d with dy [N, K, P, Q], x [N, C, H, W] (both made contiguous)."""
    block = block or BLOCK
    pps = programs_per_sm or PROGRAMS_PER_SM
    dy, x = dy.contiguous(), x.contiguous()
    n, c, h, wd = x.shape
    k, _, r, s = w_shape
    p, q = dy.shape[2], dy.shape[3]
    npq, crs = n * p * q, c * r * s
    crs_pad = triton_support.next_pow2(crs)
    steps = triton_support.cdiv(npq, block)
    want = pps * (triton_support.sm_count(x.device.index) if x.is_cuda else 1)
    splits = max(1, min(want, steps))
    chunk = triton_support.cdiv(steps, splits) * block
    splits = triton_support.cdiv(npq, chunk)
    dw_part = torch.empty((splits, k, crs_pad), dtype=torch.float64, device=x.device)
    db_part = torch.empty((splits, k), dtype=torch.float64, device=x.device)
    conv_wgrad_pixels_kernel[(splits,)](
        dy, x, dw_part, db_part, c, h, wd, k, p, q, npq, chunk, sh, sw, ph, pw,
        R=r, S=s, CRS_PAD=crs_pad, BLOCK_K=triton_support.next_pow2(k), BLOCK=block,
        WIDE=x.dtype == torch.float32, num_warps=warps,
    )  # fmt: skip
    dw = dw_part.sum(0)[:, :crs].to(x.dtype).reshape(w_shape)
    return dw, db_part.sum(0).to(x.dtype)
