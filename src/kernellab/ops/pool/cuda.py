"""max_pool2d in CUDA C++ (pool.cu, compiled by NVRTC): launchers, custom ops,
registration (backend ``cuda``: one thread per output forward, a gather backward; x is
read contiguous, a strided x is packed first)."""

from __future__ import annotations

from pathlib import Path

import torch

from kernellab.cuda.runtime import DTYPE_SUFFIX as SUFFIX
from kernellab.cuda.runtime import Module
from kernellab.ops._register import register_cuda
from kernellab.ops.pool.pool_op import pool_op
from kernellab.ops.pool.windows import geometry

MODULE = Module(Path(__file__).with_name("pool.cu"))
THREADS = 256
_SIG = ("ptr",) * 3 + ("i64",) + ("i32",) * 6
_KERNELS: dict = {}


def _kernel(name: str, dev: int):
    k = _KERNELS.get((name, dev))
    if k is None:
        k = _KERNELS[(name, dev)] = MODULE.kernel(name, _SIG, dev)
    return k


def cuda_pool_fwd(x, k, s):
    x = x if x.is_contiguous() else x.contiguous()
    n, c, h, w = x.shape
    _, _, p, q = geometry(h, w, k, s)
    y = torch.empty((n, c, p, q), dtype=x.dtype, device=x.device)
    idx = torch.empty((n, c, p, q), dtype=torch.int8, device=x.device)
    total = y.numel()
    if total:
        dev = x.device.index
        kern = _kernel(f"maxpool2d_fwd_{SUFFIX[x.dtype]}", dev)
        kern(-(-total // THREADS), THREADS, x, y, idx, total, h, w, p, q, k, s, device_index=dev)
    return y, idx


def cuda_pool_bwd(dy, idx, h, w, k, s):
    n, c, p, q = dy.shape
    dx = torch.empty((n, c, h, w), dtype=dy.dtype, device=dy.device)
    total = dx.numel()
    if total:
        dev = dy.device.index
        kern = _kernel(f"maxpool2d_bwd_{SUFFIX[dy.dtype]}", dev)
        kern(-(-total // THREADS), THREADS, dy, idx, dx, total, h, w, p, q, k, s, device_index=dev)
    return dx


register_cuda(
    "max_pool2d",
    "cuda",
    pool_op("max_pool2d_cuda", cuda_pool_fwd, cuda_pool_bwd),
    MODULE,
    "CUDA: one thread per output (int8 argmax offsets); backward a gather, no atomics",
)
