"""Histogram in CUDA C++ (histogram.cu, compiled by NVRTC): launchers, custom ops,
registrations.

``cuda_v1`` .. ``cuda_v5`` are the lecture's steps (the list at the top of histogram.cu);
``cuda`` is the best of them: v3 (coarsened; the fastest rung measured, on uniform and
skewed keys alike) while the private histogram fits in shared memory (bins <=
SHARED_BINS), v1's global atomics beyond. The privatized rungs v2-v5 refuse
larger bins (``Impl.limits``), so the ladder compares like with like.
"""

from __future__ import annotations

from pathlib import Path

import torch

from kernellab.core.kit import OpDecl, build
from kernellab.core.registry import register
from kernellab.cuda.runtime import Module, _get_device, nvrtc_unavailable, sm_count

MODULE = Module(Path(__file__).with_name("histogram.cu"))

THREADS = 256  # every kernel's block size (v2 counts one key per thread)
U = 4  # 16-byte packs per thread and loop step (histogram.cu's U)
BLOCKS_PER_SM = 8  # at most 8 x 256 threads = 2048, a full H100 SM
# The private histogram is bins x 4 bytes of dynamic shared memory. 48 KB is what every
# kernel may take without opting in: 12288 bins. (Hopper's 227 KB would take 58k bins,
# at one block per SM; 65536 bins do not fit anywhere.)
SHARED_BINS = 12288
SUFFIX = {torch.uint8: "u8", torch.int32: "i32", torch.int64: "i64"}
PRIVATE = ("v2", "v3", "v4", "v5")  # the rungs with a shared-memory histogram

_KERNELS: dict = {}


def _kernel(name: str, dtype, dev: int):
    key = (name, dtype, dev)
    k = _KERNELS.get(key)
    if k is None:
        scalar = name in ("hist_v1", "hist_v2")  # (x, out, n, bins); v3-v5 take head before bins
        sig = ("ptr", "ptr", "i64", "i32") if scalar else ("ptr", "ptr", "i64", "i64", "i32")
        k = _KERNELS[key] = MODULE.kernel(f"{name}_{SUFFIX[dtype]}", sig, dev)
    return k


_RESIDENT: dict = {}


def _resident_blocks(kernel, smem: int) -> int:
    """Blocks of THREADS with ``smem`` bytes of dynamic shared memory that fit on one SM
    (the driver's occupancy answer): the coarsened grid is one wave of them. Falls back to
    2 (always resident at <= 48 KB of shared memory and <= 128 registers)."""
    key = (kernel, smem)
    n = _RESIDENT.get(key)
    if n is None:
        n = 2
        try:
            from cuda.bindings import driver

            err, got = driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(
                driver.CUfunction(kernel._handle), THREADS, smem
            )
            if int(err) == 0 and int(got) > 0:
                n = min(int(got), BLOCKS_PER_SM)
        except Exception:  # noqa: BLE001 - an older binding, a CUkernel handle: the fallback
            pass
        _RESIDENT[key] = n
    return n


def _head(x: torch.Tensor) -> int:
    """Keys before the first 16-byte aligned address of x (0 when aligned)."""
    es = x.element_size()
    return min(((16 - (x.data_ptr() & 15)) & 15) // es, x.numel())


def histogram_cuda(x: torch.Tensor, bins: int, variant: str) -> torch.Tensor:
    if variant in PRIVATE and bins > SHARED_BINS:
        raise ValueError(_too_many(bins, variant))
    x = x.contiguous()  # strided / expanded: pack first
    n = x.numel()
    out = torch.zeros(bins, dtype=torch.int64, device=x.device)
    if n == 0:
        return out
    dev = x.device.index
    if dev != _get_device():
        with torch.cuda.device(dev):
            return histogram_cuda(x, bins, variant)
    if variant == "best":
        variant = "v3" if bins <= SHARED_BINS else "v1"
    if variant == "v1":
        _kernel("hist_v1", x.dtype, dev)(-(-n // THREADS), THREADS, x, out, n, bins)
        return out
    smem = bins * 4
    if variant == "v2":
        _kernel("hist_v2", x.dtype, dev)(-(-n // THREADS), THREADS, x, out, n, bins, shared=smem)
        return out
    k = _kernel(f"hist_{variant}", x.dtype, dev)
    packs = n * x.element_size() // 16
    grid = max(1, min(-(-packs // (THREADS * U)), _resident_blocks(k, smem) * sm_count(dev)))
    k(grid, THREADS, x, out, n, _head(x), bins, shared=smem)
    return out


def _too_many(bins: int, variant: str) -> str:
    return (
        f"histogram cuda_{variant}: bins={bins} does not fit a private shared-memory histogram "
        f"(at most {SHARED_BINS} bins, 48 KB); use cuda_v1 (global atomics) or cuda"
    )


def _limits_of(variant: str):
    def limits(x, bins, **options):
        if isinstance(bins, int) and bins > SHARED_BINS:
            return _too_many(bins, variant)
        return None

    return limits


def _sample(make):
    """opcheck's sample: the spec's (keys, bins) at its layout shape, on the check's device."""
    return make.args(False)


def _make(backend: str, variant: str):
    def fwd(x: torch.Tensor, bins: int) -> torch.Tensor:
        return histogram_cuda(x, bins, variant)

    return build(
        OpDecl(
            name=f"histogram_{backend}",
            fwd=fwd,
            fwd_fake=lambda x, bins: x.new_empty(bins, dtype=torch.int64),
            save=lambda inputs, out: ((), None),
            needs_grad=lambda x, bins: False,  # integer keys never require grad
            samples=(_sample,),
            backward=lambda fwd, saved, extra, dy, need: (None, None),
        )
    )


VARIANTS = [
    ("cuda_v1", "v1", "CUDA v1: one thread per key, one global atomicAdd per key (the baseline)"),
    ("cuda_v2", "v2", "CUDA v2: per-block shared-memory histogram, merged with global atomics"),
    ("cuda_v3", "v3", "CUDA v3: coarsened grid-stride 16-byte loads; fill + merge once per block"),
    ("cuda_v4", "v4", "CUDA v4: warp-aggregated shared atomics (__match_any_sync) on top of v3"),
    ("cuda_v5", "v5", "CUDA v5: cheaper aggregation, two ballot rounds on a broadcast key, on top of v3"),
    ("cuda", "best", "CUDA best: v3 up to 12288 bins, v1's global atomics beyond"),
]

for _backend, _variant, _what in VARIANTS:
    _fn = _make(_backend, _variant)
    register(
        "histogram",
        _backend,
        devices=("cuda",),
        available=nvrtc_unavailable,
        precompile=MODULE.precompile,
        custom_ops=_fn.custom_ops,
        builtin=True,
        module=MODULE,
        description=_what,
        limits=_limits_of(_variant) if _variant in PRIVATE else None,
    )(_fn)
