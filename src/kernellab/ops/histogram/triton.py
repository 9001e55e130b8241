"""Histogram in Triton: kernels, launcher, custom op, registration.

Privatized (bins <= PRIVATE_MAX): ``_hist_private_kernel``. A program counts
BLOCK x ITERS consecutive keys into a private histogram of NB = next_pow2(bins) int32
counters held in registers (``tl.histogram`` of each BLOCK of keys, masked to the
in-range ones, added up), then adds its non-zero counters to the int64 output with one
masked ``tl.atomic_add`` per bin. 2^26 keys at BLOCK x ITERS = 2^16: 1024 programs, so
at most 1024 x bins global atomics instead of 2^26.
Global atomics (bins > PRIVATE_MAX, where NB counters per program would spill):
``_hist_atomic_kernel``, one atomic per in-range key (cuda_v1's design).
Integer atomics commute exactly: the result is the same on every run.
"""

from __future__ import annotations

import torch
import triton.language as tl

from kernellab import triton_support
from kernellab.core.kit import OpDecl, build
from kernellab.ops._register import register_triton

BLOCK = 1024  # keys per tl.histogram call
ITERS = 64  # calls per program: 2^16 keys per program
NUM_WARPS = 8
PRIVATE_MAX = 4096  # NB int32 counters over 256 threads: 16 registers each at 4096 bins
ATOMIC_BLOCK = 1024


@triton_support.jit
def _hist_private_kernel(x_ptr, out_ptr, n, bins, BLOCK: tl.constexpr, ITERS: tl.constexpr, NB: tl.constexpr):
    # x: contiguous [n] integer keys; out: int64 [bins], zeroed; NB: next_pow2(bins).
    pid = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([NB], tl.int32)
    base = pid * (BLOCK * ITERS)
    for i in range(ITERS):
        idx = base + i * BLOCK + offs
        inside = idx < n
        k = tl.load(x_ptr + idx, mask=inside, other=0).to(tl.int64)
        ok = inside & (k >= 0) & (k < bins)
        acc += tl.histogram(tl.where(ok, k, 0).to(tl.int32), NB, mask=ok)
    b = tl.arange(0, NB)
    tl.atomic_add(out_ptr + b, acc.to(tl.int64), mask=(b < bins) & (acc > 0), sem="relaxed")


@triton_support.jit
def _hist_atomic_kernel(x_ptr, out_ptr, n, bins, BLOCK: tl.constexpr):
    # x: contiguous [n] integer keys; out: int64 [bins], zeroed.
    idx = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = idx < n
    k = tl.load(x_ptr + idx, mask=inside, other=0).to(tl.int64)
    ok = inside & (k >= 0) & (k < bins)
    one = tl.full([BLOCK], 1, tl.int64)
    tl.atomic_add(out_ptr + tl.where(ok, k, 0), one, mask=ok, sem="relaxed")


def launch(x: torch.Tensor, bins: int, private: bool | None = None) -> torch.Tensor:
    """Counts of x's keys; ``private``: the privatized kernel (None: where bins <=
    PRIVATE_MAX) or the global-atomics one (lab/gpu_histogram.py times both)."""
    x = x.contiguous()  # strided / expanded: pack first
    n = x.numel()
    out = torch.zeros(bins, dtype=torch.int64, device=x.device)
    if n == 0:
        return out
    if private if private is not None else bins <= PRIVATE_MAX:
        # at least 32 counters: Triton's warp-level histogram gives each lane NB / 32 bins
        nb = max(triton_support.next_pow2(bins), 32)
        grid = (triton_support.cdiv(n, BLOCK * ITERS),)
        _hist_private_kernel[grid](x, out, n, bins, BLOCK=BLOCK, ITERS=ITERS, NB=nb, num_warps=NUM_WARPS)
    else:
        grid = (triton_support.cdiv(n, ATOMIC_BLOCK),)
        _hist_atomic_kernel[grid](x, out, n, bins, BLOCK=ATOMIC_BLOCK, num_warps=4)
    return out


def histogram_triton_fwd(x: torch.Tensor, bins: int) -> torch.Tensor:
    return launch(x, bins)


def _fake(x: torch.Tensor, bins: int) -> torch.Tensor:
    return x.new_empty(bins, dtype=torch.int64)


def _sample(make):
    """opcheck's sample: the spec's (keys, bins) at its layout shape, on the check's device."""
    return make.args(False)


histogram_triton = build(
    OpDecl(
        name="histogram_triton",
        fwd=histogram_triton_fwd,
        fwd_fake=_fake,
        save=lambda inputs, out: ((), None),
        needs_grad=lambda x, bins: False,  # integer keys never require grad
        samples=(_sample,),
        backward=lambda fwd, saved, extra, dy, need: (None, None),
        triton=True,
    )
)

_TL = {"uint8": "u8", "int32": "i32", "int64": "i64"}


def _kernel_specs(dtype: str):
    """For `kernellab asm`: both kernels as launched at 256 bins and at 65536."""
    t = _TL.get(dtype, dtype)
    sig = {"x_ptr": f"*{t}", "out_ptr": "*i64", "n": "i64", "bins": "i32"}
    private = {**sig, "BLOCK": "constexpr", "ITERS": "constexpr", "NB": "constexpr"}
    atomic = {**sig, "BLOCK": "constexpr"}
    return [
        (_hist_private_kernel, private, {"BLOCK": BLOCK, "ITERS": ITERS, "NB": 256}, NUM_WARPS),
        (_hist_atomic_kernel, atomic, {"BLOCK": ATOMIC_BLOCK}, 4),
    ]


register_triton(
    "histogram",
    histogram_triton,
    _kernel_specs,
    "Triton: per-program tl.histogram in registers, one atomic per bin (global atomics > 4096 bins)",
)
