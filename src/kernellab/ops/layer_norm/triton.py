"""layer_norm's Triton backend: the norm kernels of ops/norm_kernels/triton_kernels.py
through layer_norm's custom ops, and the residual-add form the GPT blocks use."""

from __future__ import annotations

import torch

from kernellab.ops._register import register_triton
from kernellab.ops.norm_kernels import plumbing
from kernellab.ops.norm_kernels.triton_kernels import kernel_specs, norm_bwd, norm_fwd
from kernellab.ops.norm_kernels.triton_node import ln_node

layer_norm_triton = plumbing.layer_norm_op("layer_norm_triton", norm_fwd, norm_bwd, triton=True, node=ln_node)

register_triton(
    "layer_norm",
    layer_norm_triton,
    kernel_specs(False),
    "Triton: row in registers (wider rows streamed), saved mean/rstd, per-program dweight/dbias partials",
)


# --------------------------------------------------------------------------- residual add
#
# A pre-LN transformer adds a residual and normalizes the sum: h = x + r; y = LN(h). For
# models that own their autograd (kernellab.models.gpt's fused blocks), one forward kernel
# does both (h is written once, as the add would write it) and one backward kernel adds
# the residual stream's gradient into dx: two launches fewer per residual, and the sum is
# read once less. Results are bitwise those of add then layer_norm (same roundings).


def _same_rows(x, r, name):
    if r.shape != x.shape or r.dtype != x.dtype or r.device != x.device or not r.is_contiguous():
        raise ValueError(
            f"{name}: expected a contiguous tensor of x's shape {tuple(x.shape)}, dtype {x.dtype} and "
            f"device, got shape {tuple(r.shape)}, {r.dtype}, {r.device}"
            + ("" if r.is_contiguous() else ", non-contiguous")
        )


def _add_norm_fwd(x, r, w, b, eps):
    if not x.is_contiguous():
        raise ValueError("x: expected a contiguous tensor")
    _same_rows(x, r, "r")
    h = torch.empty_like(x)
    y, mean, rstd = norm_fwd(x, w, b, float(eps), False, res=r, h=h)
    return y, h, mean, rstd


def _add_norm_bwd(dy, dres, h, w, mean, rstd, has_bias, eps):
    _same_rows(h, dy, "dy")
    if dres is not None:
        _same_rows(h, dres, "dres")
    return norm_bwd(dy, h, w, mean, rstd, False, True, dres=dres, eps=eps)


# (x, r, w, b, eps) -> (layer_norm(x + r), x + r): one kernel each way, a triton_op on a GPU
# (the GPT's op-by-op path under torch.compile: Inductor launches it where PyTorch's
# compiled step fuses its own add into its norm).
add_layer_norm_triton = plumbing.add_layer_norm_op(
    "add_layer_norm_triton", _add_norm_fwd, _add_norm_bwd, triton=True
)


def add_forward_saving(x, r, w, b, eps: float = 1e-5):
    """``(layer_norm(x + r), x + r, saved)`` with no autograd node; x and r contiguous, of
    one shape and dtype. ``saved`` is what ``add_backward_from`` takes."""
    (y, h), saved = add_layer_norm_triton.forward_saving(x, r, w, b, float(eps))
    return y, h, saved


def add_backward_from(saved, dy, dres):
    """(dx + dres, dweight, dbias or None) from ``add_forward_saving``'s saved tuple: the
    gradient of x and of r both (h = x + r), the residual stream's ``dres`` included."""
    dx, _, dw, db, _ = add_layer_norm_triton.backward_from(saved, (dy, dres))
    return dx, dw, db


layer_norm_triton.add_forward_saving = add_forward_saving
layer_norm_triton.add_backward_from = add_backward_from
layer_norm_triton.add_layer_norm = add_layer_norm_triton
