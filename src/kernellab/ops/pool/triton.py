"""max_pool2d in Triton: kernels, launchers, custom op, registration.

Forward: one lane per output, the window walked in row-major order (KS x KS loads, KS a
constexpr), the first maximum kept (a NaN wins), its offset stored as int8. x may have
any strides (no copy). Backward: one lane per input element, a gather (no atomics): it
visits the ceil(KS / S)^2 windows that can cover it and adds dy where the window's saved
offset points at it (exact; sums only where windows overlap).
Traffic at the MNIST model's first pool (batch 256, 32 x 28 x 28 fp32): x 25.7 MB read,
y 6.4 MB + offsets 1.6 MB written; backward dy + offsets 8 MB read, dx 25.7 MB written.
"""

from __future__ import annotations

import triton.language as tl

from kernellab import triton_support
from kernellab.ops._register import register_triton
from kernellab.ops.pool.pool_op import fwd_outputs, grad_input, pool_op

BLOCK = 1024


@triton_support.jit
def _pool_fwd_kernel(
    x_ptr, y_ptr, idx_ptr,  # x [N, C, H, W] strided; y, idx [N, C, P, Q] contiguous
    C, P, Q, total,  # total = N C P Q
    sxn, sxc, sxh, sxw, S,
    KS: tl.constexpr, BLOCK: tl.constexpr,
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < total
    q = offs % Q
    p = (offs // Q) % P
    nc = offs // (P * Q)
    base = (nc // C) * sxn + (nc % C) * sxc + (p * S) * sxh + (q * S) * sxw
    # compared in fp32 (exact for fp16/bf16; the interpreter compares bf16 as raw bits)
    best = tl.load(x_ptr + base, mask=ok, other=0.0).to(tl.float32)
    arg = tl.zeros((BLOCK,), dtype=tl.int32)
    for i in tl.static_range(1, KS * KS):
        v = tl.load(x_ptr + base + (i // KS) * sxh + (i % KS) * sxw, mask=ok, other=0.0).to(tl.float32)
        take = (v > best) | (v != v)  # PyTorch's rule: a larger value or a NaN
        best = tl.where(take, v, best)
        arg = tl.where(take, i, arg)
    tl.store(y_ptr + offs, best.to(y_ptr.dtype.element_ty), mask=ok)
    tl.store(idx_ptr + offs, arg.to(tl.int8), mask=ok)


@triton_support.jit
def _pool_bwd_kernel(
    dy_ptr, idx_ptr, dx_ptr,  # dy, idx [N, C, P, Q]; dx [N, C, H, W]: contiguous
    H, W, P, Q, total, S,  # total = N C H W
    KS: tl.constexpr, KP: tl.constexpr, BLOCK: tl.constexpr,  # KP = ceil(KS / S)
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < total
    w = offs % W
    h = (offs // W) % H
    nc = offs // (H * W)
    p_hi = tl.minimum(h // S, P - 1)  # the last window that starts at or above row h
    q_hi = tl.minimum(w // S, Q - 1)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for dp in tl.static_range(KP):
        p = p_hi - dp
        p_ok = (p >= 0) & (h - p * S < KS)
        for dq in tl.static_range(KP):
            q = q_hi - dq
            hit = ok & p_ok & (q >= 0) & (w - q * S < KS)
            o = nc * (P * Q) + p * Q + q
            j = tl.load(idx_ptr + o, mask=hit, other=-1).to(tl.int32)
            hit = hit & (j == (h - p * S) * KS + (w - q * S))
            acc += tl.load(dy_ptr + o, mask=hit, other=0.0).to(tl.float32)
    tl.store(dx_ptr + offs, acc.to(dx_ptr.dtype.element_ty), mask=ok)


def triton_pool_fwd(x, k, s):
    y, idx = fwd_outputs(x, k, s)
    _, c, p, q = y.shape
    total = y.numel()
    if total:
        _pool_fwd_kernel[(triton_support.cdiv(total, BLOCK),)](
            x, y, idx, c, p, q, total, *x.stride(), s, KS=k, BLOCK=BLOCK, num_warps=4
        )
    return y, idx


def triton_pool_bwd(dy, idx, h, w, k, s):
    _, _, p, q = dy.shape
    dx = grad_input(dy, h, w)
    total = dx.numel()
    if total:
        _pool_bwd_kernel[(triton_support.cdiv(total, BLOCK),)](
            dy, idx, dx, h, w, p, q, total, s, KS=k, KP=-(-k // s), BLOCK=BLOCK, num_warps=4
        )
    return dx


max_pool2d_triton = pool_op("max_pool2d_triton", triton_pool_fwd, triton_pool_bwd, triton=True)


def _kernel_specs(dtype: str):
    """For `kernellab asm`: the 2x2 / stride 2 kernels (the MNIST model's pool)."""
    fwd = {"x_ptr": f"*{dtype}", "y_ptr": f"*{dtype}", "idx_ptr": "*i8"}
    fwd.update({n: "i32" for n in ("C", "P", "Q", "total", "sxn", "sxc", "sxh", "sxw", "S")})
    fwd.update(KS="constexpr", BLOCK="constexpr")
    bwd = {"dy_ptr": f"*{dtype}", "idx_ptr": "*i8", "dx_ptr": f"*{dtype}"}
    bwd.update({n: "i32" for n in ("H", "W", "P", "Q", "total", "S")})
    bwd.update(KS="constexpr", KP="constexpr", BLOCK="constexpr")
    return [
        (_pool_fwd_kernel, fwd, {"KS": 2, "BLOCK": BLOCK}, 4),
        (_pool_bwd_kernel, bwd, {"KS": 2, "KP": 1, "BLOCK": BLOCK}, 4),
    ]


register_triton(
    "max_pool2d",
    max_pool2d_triton,
    _kernel_specs,
    "Triton: one lane per output (int8 argmax offsets); backward a gather, no atomics",
)
