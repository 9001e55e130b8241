"""Cross-entropy in CUDA C++ (cross_entropy.cu, compiled by NVRTC): launchers, custom ops
(declared to the op kit in _fused), registrations. Backends ``cuda_v1`` (one element per
thread, three-pass forward) and ``cuda`` (online log-sum-exp over 16-byte packs, rows
peeled to a 16-byte boundary; the backward takes v1 when dx rows are not aligned like the
logits rows).
See the variant list at the top of cross_entropy.cu."""

from __future__ import annotations

from pathlib import Path

import torch

from kernellab.cuda.runtime import DTYPE_SUFFIX as SUFFIX
from kernellab.cuda.runtime import Module, _get_device
from kernellab.ops._register import register_cuda
from kernellab.ops.cross_entropy._fused import fused_backend, lse_rows

MODULE = Module(Path(__file__).with_name("cross_entropy.cu"))
THREADS_V1 = 256
THREADS = 256  # v2: 8 blocks (rows) per SM, 4 x 16 B in flight per thread
FWD_SIG = ("ptr", "ptr", "ptr", "ptr", "i64", "i64")  # x, t, loss, lse, V, ii
STATS_SIG = ("ptr", "ptr", "ptr", "i64", "i64", "i64")  # t, out, flag (0: none), N, V, ii
BWD_SIG = ("ptr", "ptr", "ptr", "ptr", "i64", "ptr", "i64", "i64")  # x, t, lse, g, g stride, dx, V, ii

_kernel = MODULE.kernel  # (name, signature, device index); the Module caches per name and device


def _vec_ok(x: torch.Tensor, out: torch.Tensor | None = None) -> bool:
    """The v2 kernels peel each row to its first 16-byte boundary, so any V and any
    element-aligned start work; the backward needs dx rows aligned like x rows."""
    es = x.element_size()
    if x.data_ptr() % es:
        return False
    return out is None or (x.data_ptr() - out.data_ptr()) % 16 == 0


def _pick(stage: str, sig, vec: bool, logits: torch.Tensor, dev: int):
    """The ``stage`` ("fwd" or "bwd") kernel for the logits' dtype, vectorized (v2) or
    v1, and its threads per block (one block per row)."""
    k = _kernel(f"ce_{stage}_{'' if vec else 'v1_'}{SUFFIX[logits.dtype]}", sig, dev)
    return k, THREADS if vec else THREADS_V1


def _make(vectorized: bool):
    def fwd(logits: torch.Tensor, target: torch.Tensor, ignore_index: int):
        n, v = logits.shape
        loss = torch.empty(n, dtype=torch.float32, device=logits.device)
        lse = torch.empty((lse_rows(logits.dtype), n), dtype=torch.float32, device=logits.device)  # hi(, lo)
        if n:
            dev = logits.device.index
            if dev != _get_device():
                with torch.cuda.device(dev):
                    return fwd(logits, target, ignore_index)
            k, threads = _pick("fwd", FWD_SIG, vectorized and _vec_ok(logits), logits, dev)
            k(n, threads, logits, target, loss, lse, v, ignore_index, device_index=dev)
        return loss, lse

    def bwd(logits, target, lse, scale, ignore_index, out) -> None:
        n, v = logits.shape
        if not n:
            return
        dev = logits.device.index
        if dev != _get_device():
            with torch.cuda.device(dev):
                return bwd(logits, target, lse, scale, ignore_index, out)
        k, threads = _pick("bwd", BWD_SIG, vectorized and _vec_ok(logits, out), logits, dev)
        k(n, threads, logits, target, lse, scale, scale.stride(0), out, v, ignore_index, device_index=dev)

    return fwd, bwd


def stats(target: torch.Tensor, n_cols: int, ignore_index: int, out: torch.Tensor, flag_ptr: int = 0) -> None:
    """out (int32 [2]) = [1 if a target is neither ignore_index nor in [0, n_cols) else 0,
    count of targets != ignore_index] (one block); the flag also to ``flag_ptr`` (a mapped
    host slot's device address) unless it is 0."""
    dev = target.device.index
    if dev != _get_device():
        with torch.cuda.device(dev):
            return stats(target, n_cols, ignore_index, out, flag_ptr)
    _kernel("ce_target_stats", STATS_SIG, dev)(
        1, 1024, target, out, flag_ptr, target.shape[0], n_cols, ignore_index, device_index=dev
    )


for _backend, _vec, _what in (
    ("cuda_v1", False, "CUDA v1: one block per row, one element per thread, three-pass forward"),
    ("cuda", True, "CUDA v2: one-pass online log-sum-exp over 16-byte packs, warp-shuffle combine"),
):
    _fn = fused_backend(f"cross_entropy_{_backend}", *_make(_vec), stats)
    register_cuda("cross_entropy", _backend, _fn, MODULE, _what)
