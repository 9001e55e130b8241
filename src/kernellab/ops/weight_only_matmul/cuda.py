"""Weight-only matmuls in CUDA C++ (wo_matmul.cu, compiled by NVRTC): launchers and
registrations.

int8: ``cuda_v1`` .. ``cuda_v3`` are the lecture's steps (the list at the top of
wo_matmul.cu), ``cuda`` is v3. int4: ``cuda_v1`` (v1 with nibbles) and ``cuda`` (v3).
The 16-byte paths need whole 16-byte weight groups per row (K % 16 == 0 for int8,
K % 32 == 0 for int4) and 16-byte aligned x and w; other calls run v1's kernel (correct,
slower), and so do fp32 x. x, w_q and non-fp32 scales are packed contiguous first.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from kernellab.cuda.runtime import DTYPE_SUFFIX, Module
from kernellab.ops._register import register_cuda
from kernellab.ops.weight_only_matmul._autograd import wo_op

MODULE = Module(Path(__file__).with_name("wo_matmul.cu"))

WARPS = 8  # wo_matmul.cu's WARPS: 256-thread blocks
ROWS_V3 = 2  # weight rows per warp in v3
# v3's x chunk (values of K per shared-memory stage): MT x KC x element size <= 32 KB
# (8 x 2048 x 2 B for 16-bit x), under the 48 KB default.
KC_BYTES = 4096
GRID_Y = 65535

_SIG_V1 = ("ptr", "ptr", "ptr", "ptr", "ptr", "i32", "i32", "i32", "i32")
_SIG_V3 = ("ptr", "ptr", "ptr", "ptr", "ptr", "i32", "i32", "i32", "i32", "i32")
_KERNELS: dict = {}


def _kernel(name: str, dtype, dev: int, sig):
    key = (name, dtype, dev)
    k = _KERNELS.get(key)
    if k is None:
        k = _KERNELS[key] = MODULE.kernel(f"{name}_{DTYPE_SUFFIX[dtype]}", sig, dev)
    return k


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _mt(m: int) -> int:
    """v3's rows of x per block: the smallest of 1, 4, 8 that holds M (8 above)."""
    return 1 if m <= 1 else 4 if m <= 4 else 8


def cuda_wo_fwd(x, w_q, scales, bias, bits: int, variant: str):
    k = x.shape[-1]
    n = w_q.shape[0]
    lead = tuple(x.shape[:-1])
    x2 = x.reshape(math.prod(lead), k).contiguous()
    m = x2.shape[0]
    w = w_q.contiguous()
    s = scales if scales.dtype == torch.float32 and scales.is_contiguous() else scales.float().contiguous()
    b = None if bias is None else bias.contiguous()
    if m == 0 or n == 0 or k == 0:
        y = torch.zeros((m, n), dtype=x.dtype, device=x.device)
        if b is not None:
            y += b
        return y.reshape(lead + (n,))
    dev = x.device.index
    if dev != torch.cuda.current_device():
        with torch.cuda.device(dev):
            return cuda_wo_fwd(x, w_q, scales, bias, bits, variant)
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    bias_arg = b if b is not None else y
    group = 16 if bits == 8 else 32  # weights per 16-byte group
    vec = k % group == 0 and (x2.data_ptr() & 15) == 0 and (w.data_ptr() & 15) == 0
    prefix = "wo" if bits == 8 else "wo4"
    has_bias = int(b is not None)
    if variant == "v1" or not vec or x.dtype == torch.float32:  # fp32 x: v1 only (wo_matmul.cu)
        grid = (_cdiv(n, WARPS), min(m, GRID_Y))
        _kernel(f"{prefix}_v1", x.dtype, dev, _SIG_V1)(grid, 256, x2, w, s, bias_arg, y, m, n, k, has_bias)
    elif variant == "v2":
        grid = (_cdiv(n, WARPS), min(m, GRID_Y))
        _kernel("wo_v2", x.dtype, dev, _SIG_V1)(grid, 256, x2, w, s, bias_arg, y, m, n, k, has_bias)
    else:
        mt = _mt(m)
        grid = (_cdiv(n, WARPS * ROWS_V3), min(_cdiv(m, mt), GRID_Y))
        kern = _kernel(f"{prefix}_v3_m{mt}", x.dtype, dev, _SIG_V3)
        kc = KC_BYTES // x.element_size()
        kern(grid, 256, x2, w, s, bias_arg, y, m, n, k, kc, has_bias, shared=mt * kc * x.element_size())
    return y.reshape(lead + (n,))


def _fwd_for(bits, variant):
    return lambda x, w_q, scales, bias: cuda_wo_fwd(x, w_q, scales, bias, bits, variant)


VARIANTS = {
    8: [
        ("cuda_v1", "v1", "CUDA v1: one warp per output row, one weight byte per lane per load"),
        ("cuda_v2", "v2", "CUDA v2: 16-byte weight and x loads, byte-permute int8->fp32, shuffle reduce"),
        (
            "cuda_v3",
            "v3",
            "CUDA v3: 16 rows per block, up to 8 x rows staged in shared memory (weight read once)",
        ),
        ("cuda", "v3", "CUDA best (v3): 16-byte loads, x in shared memory, weight read once per 8 rows"),
    ],
    4: [
        ("cuda_v1", "v1", "CUDA v1: one warp per output row, nibbles unpacked one weight at a time"),
        ("cuda", "v3", "CUDA best (v3): 16-byte loads of 32 int4 weights, x rows in shared memory"),
    ],
}

for _bits, _op in ((8, "int8_weight_only_matmul"), (4, "int4_weight_only_matmul")):
    for _backend, _variant, _what in VARIANTS[_bits]:
        _fn = wo_op(f"{_op}_{_backend}", _fwd_for(_bits, _variant), _bits)
        register_cuda(_op, _backend, _fn, MODULE, _what)
