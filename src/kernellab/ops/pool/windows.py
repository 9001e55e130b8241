"""max_pool2d's window geometry: output sizes, padding and the largest window the kernels
take."""

from __future__ import annotations

# Offsets are kept in int8: windows of up to 11 x 11 (121 offsets). Larger windows are
# refused by the Triton and CUDA backends (manual and torch take any).
MAX_KERNEL = 11


def geometry(h: int, w: int, kernel_size, stride) -> tuple[int, int, int, int]:
    """(k, s, P, Q) with the defaults applied."""
    k = int(kernel_size)
    s = k if stride is None else int(stride)
    return k, s, (h - k) // s + 1, (w - k) // s + 1
