"""bn_relu_pool2d in CUDA C++ (bn_relu_pool2d.cu, compiled by NVRTC; the statistics kernel
is batch_norm2d.cu's bn_stats): launchers, custom op, registration. One backend, ``cuda``."""

from __future__ import annotations

from pathlib import Path

import torch

from kernellab.cuda.runtime import DTYPE_SUFFIX as SUFFIX
from kernellab.cuda.runtime import Module
from kernellab.ops._register import register_cuda
from kernellab.ops.batch_norm2d import cuda as bn_cuda
from kernellab.ops.batch_norm_kernels.fused_op import bn_relu_pool_op, fwd_outputs, sizes

MODULE = Module(Path(__file__).with_name("bn_relu_pool2d.cu"))
THREADS = 256  # bn_relu_pool2d.cu's THREADS (and batch_norm2d.cu's)
_kernel = MODULE.kernel  # (name, signature, device index); the Module caches per name and device


def brp_fwd(x, w, b, eps):
    c, h, wd, p, q, m, mo = sizes(x)
    z, code, mean, rstd = fwd_outputs(x)
    if m == 0 or c == 0:
        return z, code, mean.zero_(), rstd.zero_()
    dev = x.device.index
    sfx = SUFFIX[x.dtype]
    split_s, chunk_s = bn_cuda._grid(c, m, dev)
    part = torch.empty((3, c, split_s), dtype=torch.float64, device=x.device)
    bn_cuda._kernel(f"bn_stats_{sfx}", ("ptr", "ptr", "i32", "i32", "i32", "i32"), dev)(
        c * split_s, THREADS, x, part, c, h * wd, m, chunk_s, device_index=dev
    )
    split, chunk = bn_cuda._grid(c, mo, dev)
    _kernel(f"brp_fwd_{sfx}", ("ptr",) * 8 + ("i32",) * 8 + ("f32",), dev)(
        c * split, THREADS, x, w, b, z, code, part, mean, rstd, c, h, wd, p, q, split_s, mo, chunk, eps,
        device_index=dev,
    )  # fmt: skip
    return z, code, mean, rstd


def brp_bwd(dz, x, w, code, mean, rstd):
    c, h, wd, p, q, m, mo = sizes(x)
    dx = torch.empty_like(x)
    if m == 0 or c == 0:
        return dx, torch.zeros_like(w), torch.zeros_like(w)
    dev = x.device.index
    sfx = SUFFIX[x.dtype]
    dw, db = torch.empty_like(w), torch.empty_like(w)
    split_g, chunk_g = bn_cuda._grid(c, mo, dev)
    part = torch.empty((2, c, split_g), dtype=torch.float64, device=x.device)
    _kernel(f"brp_bwd_sums_{sfx}", ("ptr",) * 5 + ("i32",) * 7, dev)(
        c * split_g, THREADS, dz, code, x, mean, part, c, h, wd, p, q, mo, chunk_g, device_index=dev
    )
    split, chunk = bn_cuda._grid(c, m, dev)
    _kernel(f"brp_bwd_dx_{sfx}", ("ptr",) * 10 + ("i32",) * 8, dev)(
        c * split, THREADS, dz, code, x, w, mean, rstd, part, dx, dw, db, c, h, wd, p, q, split_g, m, chunk,
        device_index=dev,
    )  # fmt: skip
    return dx, dw, db


bn_relu_pool2d_cuda = bn_relu_pool_op("bn_relu_pool2d_cuda", brp_fwd, brp_bwd)
register_cuda(
    "bn_relu_pool2d",
    "cuda",
    bn_relu_pool2d_cuda,
    MODULE,
    "CUDA: batch_norm2d's statistics kernel + one normalize/relu/pool kernel (int8 argmax codes); "
    "backward: sums over the argmaxes + one dx kernel",
)
