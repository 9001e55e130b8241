"""Host side of the elementwise kernels built on ``common.cuh``'s map loops.

Kernel naming contract (see add.cu, gelu.cu): ``<base>_<dtype>`` is the vectorized
kernel (16-byte accesses, several per thread; needs 16-byte aligned contiguous storage),
``<base>_x1_<dtype>`` the same with one 16-byte pack per thread (more, thinner blocks for
mid-size tensors), ``<base>_w8_<dtype>`` (two-input kernels that have one) 8-byte packs
for large 16-bit tensors, ``<base>_v1_<dtype>`` the one-element-per-thread kernel; all
take (inputs..., output, n).
"""

from __future__ import annotations

import torch

from kernellab.cuda.runtime import DTYPE_SUFFIX as SUFFIX
from kernellab.cuda.runtime import Module, _get_device, sm_count
from kernellab.ops._elementwise import unary_op
from kernellab.ops._register import register_cuda

THREADS = 256
UNROLL = {1: 4, 2: 2}  # packs per thread for 1 and 2 inputs: kl::UNROLL, kl::UNROLL2


# Which width runs (timed on Hopper at 2^18..2^26 elements): one-input kernels take the
# fat one (4 packs per thread) from 8 fat blocks per SM up, x1 below (faster on small
# tensors); two-input kernels (2 streams in already) are as fast or faster with x1 at
# every size, so they always take it.
FAT_MIN_BLOCKS_PER_SM = 8
# Large 16-bit one-input tensors: x1 kernels in 512-thread blocks instead of the fat ones
# (marginally faster, all at the copy ceiling); fp32 keeps the fat kernel (x1 is slower
# there).
WIDE_X1_THREADS = 512
# Two-input kernels on 16-bit tensors of W8_MIN_ELEMS or more: the w8 kernel (8-byte packs,
# ``w8=(packs per thread and input, threads)`` from the caller, tuned per op: add (1, 256)
# and GeLU backward (2, 128) are ~1% faster than the x1 kernel at 2^28 on Hopper).
W8_MIN_ELEMS = 1 << 22

_KERNELS: dict = {}  # (module, base, dtype, device, kind, n_inputs) -> (Kernel, packs or elements per block)


def _kernel(module: Module, base: str, dtype, dev: int, kind: str, n_in: int):
    key = (module, base, dtype, dev, kind, n_in)  # holds the module: no id() reuse
    hit = _KERNELS.get(key)
    if hit is None:
        sig = ("ptr",) * (n_in + 1) + ("i64",)
        sfx = SUFFIX[dtype]
        name = {
            "vec": f"{base}_{sfx}",
            "x1": f"{base}_x1_{sfx}",
            "w8": f"{base}_w8_{sfx}",
            "v1": f"{base}_v1_{sfx}",
        }[kind]
        per_block = THREADS * UNROLL[n_in] if kind == "vec" else THREADS
        hit = _KERNELS[key] = (module.kernel(name, sig, dev), per_block)
    return hit


def launch(module: Module, base: str, inputs, vectorized: bool = True, w8=None) -> torch.Tensor:
    """y = f(*inputs) elementwise; inputs share shape, dtype and CUDA device. ``w8``:
    (packs per thread, threads) of the kernel's 8-byte variant, for a two-input kernel
    that has one (see W8_MIN_ELEMS).

    Host cost matters here (small tensors are launch-bound): one pass over the inputs, a
    cached kernel lookup, and a launch with plain-int arguments."""
    inputs = [t if t.is_contiguous() else t.contiguous() for t in inputs]  # strided: pack first
    x0 = inputs[0]
    y = torch.empty_like(x0)
    n = x0.numel()
    if n == 0:
        return y
    dev = x0.device.index
    if dev != _get_device():  # launch in the tensors' device context
        with torch.cuda.device(dev):
            return launch(module, base, inputs, vectorized, w8)
    ptrs = [t.data_ptr() for t in inputs]
    vectorized = vectorized and not any(p & 15 for p in ptrs)  # 16-byte aligned storage
    if vectorized and w8 and x0.element_size() == 2 and n >= W8_MIN_ELEMS:
        per_thread, threads = w8
        kernel, _ = _kernel(module, base, x0.dtype, dev, "w8", len(inputs))
        grid = (n // 4 + per_thread * threads - 1) // (per_thread * threads)  # 4 elements per 8-byte pack
    elif vectorized:
        packs = n // (16 // x0.element_size())
        fat = (packs + THREADS * UNROLL[len(inputs)] - 1) // (THREADS * UNROLL[len(inputs)])
        kind = "vec" if len(inputs) == 1 and fat >= FAT_MIN_BLOCKS_PER_SM * sm_count(dev) else "x1"
        threads = THREADS
        if kind == "vec" and x0.element_size() == 2:
            kind, threads = "x1", WIDE_X1_THREADS
        kernel, per_block = _kernel(module, base, x0.dtype, dev, kind, len(inputs))
        per_block = per_block * threads // THREADS
        # One tile per block (the kernel's loop is grid-stride, so this is only a choice):
        # measured faster than a grid capped at 8-32 blocks per SM.
        grid = (packs + per_block - 1) // per_block or 1
    else:
        # A storage offset can leave a tensor misaligned for 16-byte accesses (offset of
        # one element): then the scalar kernel runs. The allocator aligns y.
        kernel, per_block = _kernel(module, base, x0.dtype, dev, "v1", len(inputs))
        threads = THREADS
        grid = (n + per_block - 1) // per_block
    ptrs.append(y.data_ptr())
    ptrs.append(n)
    kernel.launch_1d(grid, threads, ptrs, dev)
    return y


_V1 = "CUDA v1: one element per thread"


def register_variants(op: str, module: Module, make_fn, v1: str = _V1) -> None:
    """Register backends ``cuda_v1`` (the scalar kernels, described by ``v1``) and ``cuda``
    (the vectorized ones); ``make_fn(backend, vectorized)`` returns the registry callable
    (with ``.custom_ops``)."""

    for backend, vec, what in (("cuda_v1", False, v1), ("cuda", True, "CUDA v2: 16-byte vector accesses")):
        fn = make_fn(backend, vec)
        register_cuda(op, backend, fn, module, what)


def register_unary(op: str, module: Module, v1: str = _V1) -> None:
    """``register_variants`` for a one-input op whose module follows the naming contract
    with bases ``<op>_fwd`` and ``<op>_bwd`` (see _elementwise.cuh): custom ops
    ``kernellab::<op>_<backend>``; large 16-bit backwards take the w8 kernel with two packs
    per thread in 128-thread blocks."""
    fwd, bwd = f"{op}_fwd", f"{op}_bwd"
    register_variants(
        op,
        module,
        lambda backend, vec: unary_op(
            f"{op}_{backend}",
            lambda x: launch(module, fwd, [x], vec),
            lambda dy, x: launch(module, bwd, [dy, x], vec, w8=(2, 128)),
        ),
        v1,
    )
