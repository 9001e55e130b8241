"""Matmul in CUDA C++ (matmul.cu, compiled by NVRTC): launchers, custom ops, registrations.

Backends ``cuda_v1`` ... ``cuda_v7`` (fp32 ladder, see the list at the top of matmul.cu),
``cuda_v8`` and ``cuda_v9`` (tensor cores, fp16/bf16) and ``cuda`` (the best per dtype: v7 for
fp32, v8 for fp16/bf16 until a GPU run shows v9 ahead). The kernels take contiguous row-major
operands: strided inputs (transposed, sliced, expanded) are packed with ``.contiguous()``
first, which costs a copy but computes correctly; the backward calls the same kernels on
transposed (hence packed) views.

The epilogue (bias, activation) runs as PyTorch ops after the kernel: the ladder is about the
product; Triton's kernel is the one with a fused epilogue.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from kernellab.cuda.runtime import Module, nvrtc_unavailable
from kernellab.ops.matmul import apply_epilogue
from kernellab.ops.matmul._autograd import matmul_op
from kernellab.registry import register

MODULE = Module(Path(__file__).with_name("matmul.cu"))
MODULE.asm_aliases = {"cuda": ("cuda_v7", "cuda_v8")}  # `kernellab asm matmul --backend cuda`
_FP32 = (torch.float32,)
_HALF = (torch.float16, torch.bfloat16)
_SUFFIX = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# variant -> (grid(M, N, batch), block, has the `vec` argument, dtypes)
def _grid32_rows(m, n, bt):
    return (_cdiv(m, 32), _cdiv(n, 32), bt)


def _grid32_cols(m, n, bt):
    return (_cdiv(n, 32), _cdiv(m, 32), bt)


def _tiles(bm, bn):
    return lambda m, n, bt: (_cdiv(n, bn), _cdiv(m, bm), bt)


VARIANTS = {
    "v1": (_grid32_rows, (32, 32, 1), False, _FP32, "CUDA v1: naive, one thread per output (uncoalesced)"),
    "v2": (_grid32_cols, (32, 32, 1), False, _FP32, "CUDA v2: coalesced global access"),
    "v3": (_tiles(32, 32), (32, 32, 1), False, _FP32, "CUDA v3: 32x32 shared-memory tiles"),
    "v4": (_tiles(64, 64), 512, False, _FP32, "CUDA v4: 1-D block tiling, 8 outputs per thread"),
    "v5": (_tiles(128, 128), 256, False, _FP32, "CUDA v5: 2-D block tiling, 8x8 outputs per thread"),
    "v6": (_tiles(128, 128), 256, True, _FP32, "CUDA v6: float4 loads, transposed A tile"),
    "v7": (_tiles(128, 128), 256, True, _FP32, "CUDA v7: warp tiling, double-buffered BK=16"),
    "v8": (
        _tiles(128, 128),
        256,
        True,
        _HALF,
        "CUDA v8: tensor cores (mma.sync m16n8k16, ldmatrix, cp.async)",
    ),
    "v9": (_tiles(128, 256), 256, True, _HALF, "CUDA v9: v8 with 128x256 tiles and a 3-stage pipeline"),
}
# Dynamic shared memory per block (bytes) of the variants that use it: v9 keeps 3 stages of
# a 128x40 A tile and a 32x264 B tile (padded halfs).
DYN_SHARED = {"v9": 3 * (128 * 40 + 32 * 264) * 2}
BEST = {torch.float32: "v7", torch.float16: "v8", torch.bfloat16: "v8"}


def _aligned16(*ts) -> bool:
    return all(t.data_ptr() % 16 == 0 for t in ts)


def _product(variant: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a [..., M, K] @ b [..., K, N] with one kernel of the ladder; fresh contiguous output."""
    grid_fn, block, has_vec, dtypes, _ = VARIANTS[variant]
    if a.dtype not in dtypes:
        names = "/".join(_SUFFIX[d] for d in dtypes)
        raise TypeError(f"matmul: cuda_{variant} takes {names} tensors; a has dtype {a.dtype}")
    batch = tuple(a.shape[:-2])
    m, k = a.shape[-2], a.shape[-1]
    n = b.shape[-1]
    a3 = a.reshape(math.prod(batch), m, k).contiguous()
    b3 = b.reshape(math.prod(batch), k, n).contiguous()
    bt = a3.shape[0]
    c = torch.empty((bt, m, n), dtype=a.dtype, device=a.device)
    if bt and m and n:
        if bt > 65535:
            raise ValueError(f"matmul: a batch of {bt} products exceeds the CUDA grid's z limit (65535)")
        dev = a.device.index if a.device.index is not None else torch.cuda.current_device()
        kern = MODULE.kernel(
            f"matmul_{variant}_{_SUFFIX[a.dtype]}",
            ("ptr", "ptr", "ptr", "i32", "i32", "i32") + (("i32",) if has_vec else ()),
            dev,
        )
        args = [a3, b3, c, m, n, k]
        if has_vec:
            # 16-byte vectors need rows that start on 16-byte boundaries: K and N multiples
            # of 4 floats (8 halfs) and aligned base pointers.
            per16 = 16 // a.element_size()
            args.append(int(k % per16 == 0 and n % per16 == 0 and _aligned16(a3, b3, c)))
        shared = DYN_SHARED.get(variant, 0)
        if shared > kern.max_dynamic_shared:
            kern.set_max_dynamic_shared(shared)
        kern(grid_fn(m, n, bt), block, *args, shared=shared, device_index=dev)
    return c.reshape(batch + (m, n))


def _make_fwd(variant: str):
    def fwd(a, b, bias=None, activation=None):
        c = _product(variant, a, b)
        if bias is None and activation is None:
            return c
        return apply_epilogue(c, bias, activation)

    return fwd


def _best_fwd(a, b, bias=None, activation=None):
    return _make_fwd(BEST[a.dtype])(a, b, bias, activation)


def _available():
    return nvrtc_unavailable()


def _register(backend: str, fwd, dtypes, description: str) -> None:
    call = matmul_op(f"matmul_{backend}", fwd)
    register(
        "matmul",
        backend,
        devices=("cuda",),
        available=_available,
        precompile=MODULE.precompile,
        custom_ops=call.custom_ops,
        builtin=True,
        dtypes=dtypes,
        module=MODULE,
        description=description,
    )(call)


for _v, (_g, _b, _hv, _dt, _desc) in VARIANTS.items():
    _register(f"cuda_{_v}", _make_fwd(_v), _dt, _desc)
_register(
    "cuda", _best_fwd, _FP32 + _HALF, "CUDA: best per dtype (v7 for fp32, v8 tensor cores for fp16/bf16)"
)
