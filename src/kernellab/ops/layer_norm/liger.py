"""liger-kernel's LayerNorm as a peer backend (``liger``), when liger-kernel is installed.

Called as liger users call it: ``LigerLayerNormFunction.apply(x, weight, bias, eps)``
(Triton; saves mean and rstd, reduces dweight/dbias from per-program partials). liger
needs a bias tensor: ``bias=None`` is passed as zeros (one extra [D] tensor, negligible).
It makes x contiguous itself and does not write into its inputs. An empty x (no rows) is
answered by torch's op: liger would launch a grid of zero programs, and a failure there
would make the benchmark's admission check drop liger from the comparison altogether.
"""

from __future__ import annotations

import functools

import torch

from kernellab.registry import register


@functools.cache
def liger_unavailable() -> str | None:
    try:
        import liger_kernel.ops.layer_norm  # noqa: F401
        import liger_kernel.ops.rms_norm  # noqa: F401
    except Exception as e:  # ImportError, or liger's own Triton import failing
        return f"liger-kernel not installed (pip install liger-kernel): {type(e).__name__}: {e}"
    return None


def liger_layer_norm(x, weight, bias=None, eps=1e-5):
    """liger-kernel LigerLayerNormFunction (Triton)."""
    from liger_kernel.ops.layer_norm import LigerLayerNormFunction

    if x.numel() == 0:
        return torch.nn.functional.layer_norm(x, (x.shape[-1],), weight, bias, eps)
    if bias is None:
        bias = torch.zeros_like(weight)
    return LigerLayerNormFunction.apply(x, weight, bias, float(eps))


register(
    "layer_norm",
    "liger",
    devices=("cuda",),
    available=liger_unavailable,
    builtin=True,
    description="liger-kernel LigerLayerNormFunction (peer)",
)(liger_layer_norm)
