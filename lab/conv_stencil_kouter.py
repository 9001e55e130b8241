"""A candidate for conv2d's stencil dgrad (C <= 4): src's ``_conv_dgrad_stencil_kernel``
with its loops turned round, the k slices outer and the filter taps inner, so that the R S
shifted reads of one slice of dy come from the same few rows while they are still in L1
(src takes the taps outer: each tap reads every plane of k before the next tap). The same
fp32 slice sums, added in fp64 in another order.

    import conv_stencil_kouter; conv_stencil_kouter.install()   # src's launcher runs it

``lab/gpu_conv_layer1.py`` times it beside src's order (variants st...k against st...t).
"""

import triton.language as tl

from kernellab import triton_support
from kernellab.ops.conv2d import triton as kt


@triton_support.jit
def conv_dgrad_stencil_kouter_kernel(
    dy_ptr, w_ptr, dx_ptr,  # dy [N, K, P, Q], w [K, C, R, S], dx [N, C, H, W]: contiguous
    C, H, W, K, P, Q, R, S, NHW,
    SH, SW, PH, PW,
    BLOCK: tl.constexpr, BLOCK_K: tl.constexpr,
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    c = tl.program_id(1)
    ok = offs < NHW
    hw = H * W
    nb, rem = offs // hw, offs % hw
    h, w = rem // W, rem % W
    pq = P * Q
    RS = R * S
    acc = tl.zeros((BLOCK,), dtype=tl.float64)
    for i in range(0, tl.cdiv(K, BLOCK_K) * RS):
        k0, rs = (i // RS) * BLOCK_K, i % RS
        p, q, src_ok = kt._dy_source(h + PH - rs // S, w + PW - rs % S, SH, SW, P, Q)
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < K
        d_ok = k_ok[:, None] & (ok & src_ok)[None, :]
        d = tl.load(dy_ptr + k[:, None] * pq + (nb * (K * pq) + p * Q + q)[None, :], mask=d_ok, other=0.0)
        wv = tl.load(w_ptr + k * (C * RS) + c * RS + rs, mask=k_ok, other=0.0)
        acc += tl.sum(d.to(tl.float32) * wv.to(tl.float32)[:, None], axis=0).to(tl.float64)
    tl.store(dx_ptr + nb * (C * hw) + c * hw + rem, acc.to(tl.float32).to(dx_ptr.dtype.element_ty), mask=ok)


_SRC = kt._conv_dgrad_stencil_kernel


def install(on: bool = True) -> None:
    """src's launcher (``triton_conv2d_bwd``) runs the k-outer kernel (on) or its own."""
    kt._conv_dgrad_stencil_kernel = conv_dgrad_stencil_kouter_kernel if on else _SRC
