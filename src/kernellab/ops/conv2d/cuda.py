"""conv2d in CUDA C++ (conv2d.cu, compiled by NVRTC): launchers, custom ops, registrations.

Backends (see the variant list at the top of conv2d.cu):
  ``cuda_v1``  forward: one output per thread (the course's naive direct convolution)
  ``cuda_v2``  forward: input tile + 8 filters in shared memory, 16 x 16 outputs per block
  ``cuda``     forward: implicit GEMM, 64 x 64 tiles, 4 x 4 register blocking, SIMT fp32
All three share one backward: ``cuda``'s implicit-GEMM dgrad and split wgrad, and a row
sum for dbias (v1 and v2 differ in their forward only, the part the course ladders).

  ``cuda_v4``  fp16 / bf16 forward on tensor cores (mma.sync.m16n8k16, ldmatrix): v3's
               implicit GEMM with MMAs. Written and compiled here, not yet run on a GPU: a
               backend of its own (16-bit only) until the gpu tests pass and the ladder
               shows it faster; then ``cuda`` should dispatch 16-bit inputs to it.
``cuda``'s 16-bit forward runs the same fp32-FMA loop as fp32 (operands converted on
load). The backward has no tensor-core variant yet. x is read contiguous NCHW (a
channels_last or strided x is packed first: one extra copy of x).
"""

from __future__ import annotations

from pathlib import Path

import torch

from kernellab.core.registry import register
from kernellab.cuda.runtime import DTYPE_SUFFIX as SUFFIX
from kernellab.cuda.runtime import Module, nvrtc_unavailable, sm_count
from kernellab.ops._register import register_cuda
from kernellab.ops.conv2d.conv_op import check_int32, conv_op
from kernellab.ops.conv2d.geometry import out_size

MODULE = Module(Path(__file__).with_name("conv2d.cu"))
_GEOM = ("i32",) * 13
BM = BN = 64  # conv2d.cu's kBM, kBN
BK = 16  # kBK
THREADS = 256
V2_TILE, V2_K = 16, 8  # kV2Tile, kV2K
TC_BM = TC_BN = 64  # kTcBM, kTcBN
TC_THREADS = 128  # kTcThreads
SHARED_DEFAULT = 48 * 1024  # dynamic shared memory without an opt-in
GRID_YZ = 65535

_kernel = MODULE.kernel  # (name, signature, device index); the Module caches per name and device


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _geom(x, w, sh, sw, ph, pw):
    n, c, h, wd = x.shape
    k, _, r, s = w.shape
    p, q = out_size(h, wd, r, s, (sh, sw), (ph, pw))
    return (n, c, h, wd, k, r, s, p, q, sh, sw, ph, pw)


def _grid_y(count: int, what: str) -> int:
    if count > GRID_YZ:
        raise ValueError(f"conv2d (cuda): {what} needs {count} blocks along the grid's y (limit {GRID_YZ})")
    return count


def _fwd(variant: str):
    def fwd(x, w, bias, sh, sw, ph, pw):
        if variant == "cuda_v4" and x.dtype == torch.float32:
            raise TypeError("conv2d (cuda_v4): x is fp32; this tensor-core backend takes fp16 / bf16")
        x = x if x.is_contiguous() else x.contiguous()
        g = _geom(x, w, sh, sw, ph, pw)
        n, c, h, wd, k, r, s, p, q = g[:9]
        check_int32(x, w, p, q, variant)
        y = torch.empty((n, k, p, q), dtype=x.dtype, device=x.device)
        if y.numel() == 0:
            return y
        dev = x.device.index
        sfx = SUFFIX[x.dtype]
        b = bias if bias is not None else 0
        if variant == "cuda_v1":
            kern = _kernel(f"conv2d_fwd_v1_{sfx}", ("ptr",) * 4 + _GEOM, dev)
            kern(_cdiv(y.numel(), THREADS), THREADS, x, w, b, y, *g, device_index=dev)
        elif variant == "cuda_v2":
            tin = ((V2_TILE - 1) * sh + r) * ((V2_TILE - 1) * sw + s)
            shared = 4 * (tin + V2_K * r * s)
            if shared > SHARED_DEFAULT:
                raise ValueError(
                    f"conv2d (cuda_v2): the input tile of w {r}x{s} at stride {(sh, sw)} needs {shared} B "
                    f"of shared memory (limit {SHARED_DEFAULT}); use backend='cuda'"
                )
            kern = _kernel(f"conv2d_fwd_v2_{sfx}", ("ptr",) * 4 + _GEOM, dev)
            grid = (n * _cdiv(p, V2_TILE) * _cdiv(q, V2_TILE), _grid_y(_cdiv(k, V2_K), "w's K"))
            kern(grid, (V2_TILE, V2_TILE), x, w, b, y, *g, shared=shared, device_index=dev)
        elif variant == "cuda_v4":
            kern = _kernel(f"conv2d_fwd_tc_{sfx}", ("ptr",) * 4 + _GEOM, dev)
            grid = (_cdiv(n * p * q, TC_BM), _grid_y(_cdiv(k, TC_BN), "w's K"))
            kern(grid, TC_THREADS, x, w, b, y, *g, device_index=dev)
        else:
            kern = _kernel(f"conv2d_fwd_{sfx}", ("ptr",) * 4 + _GEOM, dev)
            grid = (_cdiv(n * p * q, BM), _grid_y(_cdiv(k, BN), "w's K"))
            kern(grid, THREADS, x, w, b, y, *g, device_index=dev)
        return y

    return fwd


def wgrad_split(tiles: int, npq: int, sms: int) -> tuple[int, int]:
    """(splits, chunk) of wgrad's N P Q reduction: about two blocks per SM in all, each
    reducing at least 8 slices of 16 (fewer, longer chunks when the tiles fill the GPU)."""
    steps = _cdiv(npq, BK)
    splits = max(1, min(_cdiv(2 * sms, tiles), steps // 8 or 1, GRID_YZ))
    chunk = _cdiv(steps, splits) * BK
    return _cdiv(npq, chunk), chunk


def cuda_conv2d_bwd(dy, x, w, need_dx, sh, sw, ph, pw):
    x = x if x.is_contiguous() else x.contiguous()
    g = _geom(x, w, sh, sw, ph, pw)
    n, c, h, wd, k, r, s, p, q = g[:9]
    dx = torch.empty((n, c, h, wd) if need_dx else (0,), dtype=x.dtype, device=x.device)
    npq, crs = n * p * q, c * r * s
    if npq == 0:
        return dx.zero_(), torch.zeros_like(w), w.new_zeros(k)
    dev = x.device.index
    sfx = SUFFIX[x.dtype]
    if need_dx:
        kern = _kernel(f"conv2d_dgrad_{sfx}", ("ptr",) * 3 + _GEOM, dev)
        kern((_cdiv(n * h * wd, BM), _grid_y(_cdiv(c, BN), "x's C")), THREADS, dy, w, dx, *g, device_index=dev)
    tiles_m, tiles_n = _cdiv(k, BM), _grid_y(_cdiv(crs, BN), "C R S")
    splits, chunk = wgrad_split(tiles_m * tiles_n, npq, sm_count(dev))
    part = torch.empty((splits, k, crs), dtype=torch.float64, device=x.device)
    kern = _kernel(f"conv2d_wgrad_{sfx}", ("ptr",) * 3 + ("i32",) + _GEOM, dev)
    kern((tiles_m, tiles_n, splits), THREADS, dy, x, part, chunk, *g, device_index=dev)
    dw = part.sum(0).to(w.dtype).view(w.shape)
    # dbias: fp64 partial row sums, one per (channel, slice of the batch), summed after: one
    # block per channel alone leaves the GPU mostly idle (K = 32 blocks at MNIST's first
    # layer).
    slices = max(1, min(n, _cdiv(2 * sm_count(dev), k)))
    db_part = torch.empty((slices, k), dtype=torch.float64, device=x.device)
    kern = _kernel(f"conv2d_dbias_{sfx}", ("ptr",) * 2 + ("i32",) + _GEOM, dev)
    kern((k, slices), THREADS, dy, db_part, _cdiv(n, slices), *g, device_index=dev)
    return dx, dw, db_part.sum(0).to(w.dtype)


VARIANTS = [
    ("cuda_v1", "CUDA v1: one output per thread (naive direct convolution); backward: cuda's"),
    ("cuda_v2", "CUDA v2: input tile + filters in shared memory; backward: cuda's"),
    ("cuda", "CUDA v3: implicit GEMM, 64x64 smem tiles, 4x4 register blocking (SIMT fp32)"),
]

for _backend, _what in VARIANTS:  # (cuda_v4 below: 16-bit only)
    register_cuda(
        "conv2d",
        _backend,
        conv_op(f"conv2d_{_backend}", _fwd(_backend), cuda_conv2d_bwd, label=f"conv2d ({_backend})"),
        MODULE,
        _what,
    )

_v4 = conv_op("conv2d_cuda_v4", _fwd("cuda_v4"), cuda_conv2d_bwd, label="conv2d (cuda_v4)")
register(
    "conv2d",
    "cuda_v4",
    devices=("cuda",),
    available=nvrtc_unavailable,
    precompile=MODULE.precompile,
    custom_ops=_v4.custom_ops,
    builtin=True,
    description="CUDA v4: v3 on tensor cores (mma.sync m16n8k16, ldmatrix), fp16/bf16; backward: cuda's",
    module=MODULE,
    dtypes=(torch.float16, torch.bfloat16),
)(_v4)
