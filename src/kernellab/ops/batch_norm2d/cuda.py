"""batch_norm2d in CUDA C++ (batch_norm2d.cu, compiled by NVRTC): launchers, custom op,
registration. One backend, ``cuda``: split per-channel reductions (see the .cu file)."""

from __future__ import annotations

from pathlib import Path

import torch

from kernellab.cuda.runtime import DTYPE_SUFFIX as SUFFIX
from kernellab.cuda.runtime import Module, sm_count
from kernellab.ops._register import register_cuda
from kernellab.ops.batch_norm_kernels.batch_norm_op import batch_norm_op, dims, empty_stats

MODULE = Module(Path(__file__).with_name("batch_norm2d.cu"))
THREADS = 256  # batch_norm2d.cu's THREADS
# Blocks per SM the grid aims at (C * split ~ this x SMs): 8 x 256 threads fill an SM's
# 2048 thread slots (see the .cu file for the bytes in flight); a first guess, not tuned.
BLOCKS_PER_SM = 8
CHUNK_MIN = 4 * THREADS  # at least 4 elements per thread per chunk

_kernel = MODULE.kernel  # (name, signature, device index); the Module caches per name and device


def _grid(c: int, m: int, dev: int) -> tuple[int, int]:
    """(split, chunk): chunks of at least CHUNK_MIN elements, ~BLOCKS_PER_SM blocks per SM."""
    split = max(1, min(-(-BLOCKS_PER_SM * sm_count(dev) // c), -(-m // CHUNK_MIN)))
    chunk = -(-m // split)
    return -(-m // chunk), chunk


def bn_fwd(x, w, b, eps, relu=False):
    y = torch.empty_like(x)
    mean, rstd = empty_stats(x)
    n, c, hw, m = dims(x)
    if m == 0 or c == 0:
        return y, mean.zero_(), rstd.zero_()
    dev = x.device.index
    split, chunk = _grid(c, m, dev)
    part = torch.empty((3, c, split), dtype=torch.float64, device=x.device)
    sfx = SUFFIX[x.dtype]
    _kernel(f"bn_stats_{sfx}", ("ptr", "ptr", "i32", "i32", "i32", "i32"), dev)(
        c * split, THREADS, x, part, c, hw, m, chunk, device_index=dev
    )
    _kernel(f"bn_fwd_apply_{sfx}", ("ptr",) * 7 + ("i32", "i32", "i32", "i32", "f32", "i32"), dev)(
        c * split, THREADS, x, w, b, y, part, mean, rstd, c, hw, m, chunk, eps, int(relu), device_index=dev
    )
    return y, mean, rstd


def bn_bwd(dy, x, w, b, mean, rstd, relu=False):
    dx = torch.empty_like(x)
    n, c, hw, m = dims(x)
    if m == 0 or c == 0:
        return dx, torch.zeros_like(w), torch.zeros_like(w)
    dev = x.device.index
    split, chunk = _grid(c, m, dev)
    part = torch.empty((2, c, split), dtype=torch.float64, device=x.device)
    dw, db = torch.empty_like(w), torch.empty_like(w)
    sfx = SUFFIX[x.dtype]
    _kernel(f"bn_bwd_sums_{sfx}", ("ptr",) * 7 + ("i32", "i32", "i32", "i32", "i32"), dev)(
        c * split, THREADS, dy, x, w, b, mean, rstd, part, c, hw, m, chunk, int(relu), device_index=dev
    )
    _kernel(f"bn_bwd_apply_{sfx}", ("ptr",) * 10 + ("i32", "i32", "i32", "i32", "i32"), dev)(
        c * split, THREADS, dy, x, w, b, mean, rstd, part, dx, dw, db, c, hw, m, chunk, int(relu), device_index=dev
    )
    return dx, dw, db


batch_norm2d_cuda = batch_norm_op("batch_norm2d_cuda", bn_fwd, bn_bwd)
register_cuda(
    "batch_norm2d",
    "cuda",
    batch_norm2d_cuda,
    MODULE,
    "CUDA: split per-channel reductions (fp64 shifted sums + Chan merge), fwd and bwd in two launches each",
)
