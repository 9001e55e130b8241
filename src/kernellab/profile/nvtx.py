"""NVTX ranges that cost nothing where there is no CUDA.

kernellab's harness (check, bench) and models mark their phases with these, so an Nsight
Systems timeline shows which implementation, shape and step every kernel belongs to.
"""

from __future__ import annotations

import contextlib

import torch


def _available() -> bool:
    return torch.cuda.is_available()


@contextlib.contextmanager
def nvtx_range(name: str):
    if not _available():
        yield
        return
    torch.cuda.nvtx.range_push(name)
    try:
        yield
    finally:
        torch.cuda.nvtx.range_pop()
