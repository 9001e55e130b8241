"""Sum in CUDA C++ (sum.cu, compiled by NVRTC): launchers, custom ops, registrations.

Backends ``cuda_v1`` .. ``cuda_v4`` are the lecture's steps (see the list at the top of
sum.cu); ``cuda`` is the best of them (v4: coarsened 16-byte loads, shuffles, private
per-block partials with a last-block-done combine; one launch, deterministic).
Determinism: every launcher adds in a fixed order except cuda_v3's whole-tensor sum,
whose blocks meet in a float64 atomicAdd; under ``torch.use_deterministic_algorithms(True)``
it raises as PyTorch's nondeterministic kernels do. v4 against v3 is the price of the
fixed order (lab/gpu_histogram.py measures it). Each
backend also sums rows (``dim=-1``): v1 one thread per row, v2 one block per row with a
shared-memory tree, v3 and up a warp or a block per row with 16-byte loads.
"""

from __future__ import annotations

from pathlib import Path

import torch

from kernellab.cuda.runtime import DTYPE_SUFFIX as SUFFIX
from kernellab.cuda.runtime import (
    Module,
    _get_device,
    _raw_stream,
    sm_count,
)
from kernellab.ops._reductions import alert_not_deterministic, sum_backend
from kernellab.ops._register import register_cuda

MODULE = Module(Path(__file__).with_name("sum.cu"))

THREADS = 256  # every kernel's block size (v1/v2 and sum_rows_v2 size their shared tree by it)
U = 4  # 16-byte packs per thread and loop step (sum.cu's U)
BLOCKS_PER_SM = 8  # at most 8 x 256 threads = 2048, a full H100 SM (see _resident_blocks)
WARP_ROW_MAX = 1024  # rows up to this many columns get one warp each, longer ones a block
FINAL_THREADS = 1024

_KERNELS: dict = {}


def _kernel(name: str, dtype, signature, dev: int):
    key = (name, dtype, dev)
    k = _KERNELS.get(key)
    if k is None:
        full = f"{name}_{SUFFIX[dtype]}" if dtype is not None else name
        k = _KERNELS[key] = MODULE.kernel(full, signature, dev)
    return k


def _head(x: torch.Tensor) -> int:
    """Elements before the first 16-byte aligned address of x (0 when aligned)."""
    es = x.element_size()
    return min(((16 - (x.data_ptr() & 15)) & 15) // es, x.numel())


_RESIDENT: dict = {}


def _resident_blocks(kernel) -> int:
    """Blocks of THREADS that fit on one SM at once (the driver's occupancy answer): the
    grid-stride grid is exactly one wave of them. sm_90 NVRTC builds of v3/v4 use 40-56
    registers, so 4-6 blocks fit, not the 8 a 32-register kernel would get; a grid of 8 per
    SM would run a second, partial wave. Falls back to 4 (always resident at <= 64 regs)."""
    n = _RESIDENT.get(kernel)
    if n is None:
        n = 4
        try:
            from cuda.bindings import driver

            err, got = driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(
                driver.CUfunction(kernel._handle), THREADS, 0
            )
            if int(err) == 0 and int(got) > 0:
                n = min(int(got), BLOCKS_PER_SM)
        except Exception:  # noqa: BLE001 - an older binding, a CUkernel handle: the fallback
            pass
        _RESIDENT[kernel] = n
    return n


def _coarse_grid(n: int, x: torch.Tensor, dev: int, kernel) -> int:
    packs = n * x.element_size() // 16
    return max(1, min(-(-packs // (THREADS * U)), _resident_blocks(kernel) * sm_count(dev)))


_TICKETS: dict = {}


def _ticket(dev: int) -> torch.Tensor:
    """v4's block counter: one per (device, stream), zeroed once; the last block of every
    launch resets it. Launches on one stream run in order, so they never share it at the
    same time. Under CUDA-graph capture a fresh one is made (its memset is captured)."""
    if torch.cuda.is_current_stream_capturing():
        return torch.zeros(1, dtype=torch.int32, device=f"cuda:{dev}")
    key = (dev, _raw_stream(dev))
    t = _TICKETS.get(key)
    if t is None:
        t = _TICKETS[key] = torch.zeros(1, dtype=torch.int32, device=f"cuda:{dev}")
    return t


def _finish(partials: torch.Tensor, n: int, out: torch.Tensor, dev: int) -> None:
    """float64 partials [n] -> out (0-d, output dtype): a second (tiny) kernel, after a
    float64 pre-pass while there are many partials (v1/v2 leave one per 256 elements)."""
    while n > 8 * FINAL_THREADS:
        blocks = min(-(-n // (8 * FINAL_THREADS)), 1024)
        nxt = torch.empty(blocks, dtype=torch.float64, device=out.device)
        _kernel("sum_partials_f64", None, ("ptr", "ptr", "i64"), dev)(blocks, FINAL_THREADS, partials, nxt, n)
        partials, n = nxt, blocks
    _kernel("sum_final", out.dtype, ("ptr", "ptr", "i64"), dev)(1, FINAL_THREADS, partials, out, n)


def sum_all(x: torch.Tensor, variant: str) -> torch.Tensor:
    if variant == "v3":  # the one launcher whose bits depend on the order of its atomics
        alert_not_deterministic("kernellab sum cuda_v3 (whole tensor)")
    x = x.contiguous()  # strided / expanded: pack first
    n = x.numel()
    if n == 0:
        return torch.zeros((), dtype=x.dtype, device=x.device)
    dev = x.device.index
    if dev != _get_device():
        with torch.cuda.device(dev):
            return sum_all(x, variant)
    out = torch.empty((), dtype=x.dtype, device=x.device)
    if variant in ("v1", "v2"):
        blocks = -(-n // THREADS)
        part = torch.empty(blocks, dtype=torch.float64, device=x.device)
        _kernel(f"sum_all_{variant}", x.dtype, ("ptr", "ptr", "i64"), dev)(blocks, THREADS, x, part, n)
        _finish(part, blocks, out, dev)
        return out
    head = _head(x)
    if variant == "v3":
        k = _kernel("sum_all_v3", x.dtype, ("ptr", "i64", "i64", "ptr"), dev)
        acc = torch.zeros((), dtype=torch.float64, device=x.device)
        k(_coarse_grid(n, x, dev, k), THREADS, x, n, head, acc)
        return acc.to(x.dtype)
    k = _kernel("sum_all_v4", x.dtype, ("ptr", "i64", "i64", "ptr", "ptr", "ptr"), dev)
    grid = _coarse_grid(n, x, dev, k)
    part = torch.empty(grid, dtype=torch.float64, device=x.device)
    k(grid, THREADS, x, n, head, part, _ticket(dev), out)
    return out


def sum_rows(x: torch.Tensor, variant: str) -> torch.Tensor:
    x = x.contiguous()
    n_cols = x.shape[-1] if x.dim() else 1
    out = torch.empty(x.shape[:-1], dtype=x.dtype, device=x.device)
    n_rows = out.numel()
    if n_rows == 0:
        return out
    if n_cols == 0:
        return out.zero_()
    dev = x.device.index
    if dev != _get_device():
        with torch.cuda.device(dev):
            return sum_rows(x, variant)
    sig = ("ptr", "ptr", "i64", "i64")
    if variant == "v1":
        _kernel("sum_rows_v1", x.dtype, sig, dev)(-(-n_rows // THREADS), THREADS, x, out, n_rows, n_cols)
    elif variant == "v2":
        _kernel("sum_rows_v2", x.dtype, sig, dev)(n_rows, THREADS, x, out, n_rows, n_cols)
    else:
        # 16-byte loads need every row to start 16-byte aligned: the base and the pitch.
        vec = (x.data_ptr() & 15) == 0 and (n_cols * x.element_size()) % 16 == 0
        sfx = "_vec" if vec else ""
        if n_cols <= WARP_ROW_MAX:
            grid = -(-n_rows // (THREADS // 32))
            _kernel("sum_rows_warp" + sfx, x.dtype, sig, dev)(grid, THREADS, x, out, n_rows, n_cols)
        else:
            _kernel("sum_rows_block" + sfx, x.dtype, sig, dev)(n_rows, THREADS, x, out, n_rows, n_cols)
    return out


VARIANTS = [
    (
        "cuda_v1",
        "v1",
        "v1",
        "CUDA v1: shared-memory tree, interleaved addressing (divergent); rows: thread per row",
    ),
    ("cuda_v2", "v2", "v2", "CUDA v2: shared-memory tree, sequential addressing; rows: block per row"),
    ("cuda_v3", "v3", "v3", "CUDA v3: coarsened 16-byte loads + shuffles, global atomicAdd combine"),
    ("cuda_v4", "v4", "v3", "CUDA v4: private block partials, last-block-done combine (deterministic)"),
    ("cuda", "v4", "v3", "CUDA best (v4): 16-byte loads, shuffles, last-block-done, deterministic"),
]


def _make(backend: str, whole: str, rows: str):
    return sum_backend(backend, lambda x: sum_all(x, whole), lambda x: sum_rows(x, rows))


for _backend, _whole, _rows, _what in VARIANTS:
    _fn = _make(_backend, _whole, _rows)
    register_cuda("sum", _backend, _fn, MODULE, _what)
