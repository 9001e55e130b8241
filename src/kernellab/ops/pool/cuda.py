"""max_pool2d in CUDA C++ (pool.cu, compiled by NVRTC): launchers, custom ops,
registration (backend ``cuda``: one thread per output forward, a gather backward; x is
read contiguous, a strided x is packed first)."""

from __future__ import annotations

from pathlib import Path

from kernellab.cuda.runtime import DTYPE_SUFFIX as SUFFIX
from kernellab.cuda.runtime import Module
from kernellab.ops._register import register_cuda
from kernellab.ops.pool.pool_op import fwd_outputs, grad_input, pool_op

MODULE = Module(Path(__file__).with_name("pool.cu"))
THREADS = 256
_SIG = ("ptr",) * 3 + ("i64",) + ("i32",) * 6


def _launch(kind: str, a, b, c, total, *geom):
    """maxpool2d_<kind> over ``total`` threads (one per element of its output) on a's
    device and dtype (``Module.kernel`` keeps the kernel per name and device)."""
    if total:
        dev = a.device.index
        kern = MODULE.kernel(f"maxpool2d_{kind}_{SUFFIX[a.dtype]}", _SIG, dev)
        kern(-(-total // THREADS), THREADS, a, b, c, total, *geom, device_index=dev)


def cuda_pool_fwd(x, k, s):
    x = x if x.is_contiguous() else x.contiguous()
    y, idx = fwd_outputs(x, k, s)
    (_, _, h, w), (_, _, p, q) = x.shape, y.shape
    _launch("fwd", x, y, idx, y.numel(), h, w, p, q, k, s)
    return y, idx


def cuda_pool_bwd(dy, idx, h, w, k, s):
    _, _, p, q = dy.shape
    dx = grad_input(dy, h, w)
    _launch("bwd", dy, idx, dx, dx.numel(), h, w, p, q, k, s)
    return dx


register_cuda(
    "max_pool2d",
    "cuda",
    pool_op("max_pool2d_cuda", cuda_pool_fwd, cuda_pool_bwd),
    MODULE,
    "CUDA: one thread per output (int8 argmax offsets); backward a gather, no atomics",
)
