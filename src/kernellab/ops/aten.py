"""PyTorch's own kernels behind the op kit's node-free entry points.

A model that runs several ops under one autograd node (``kernellab.models.gpt``'s fused
blocks) calls each op as ``forward_saving(*inputs) -> (out, saved)`` and
``backward_from(saved, dy) -> grads``. Our Triton and CUDA backends have these (the op
kit builds them). These are the same entry points over PyTorch's kernels, so that the
default can put PyTorch's kernel in a slot where it is the fastest on the device (a
tuning table's device time) without falling back to one autograd node per op:

- ``layer_norm``: ``aten.native_layer_norm`` and its backward (the kernels
  ``F.layer_norm`` runs).
- ``gelu``: ``aten.gelu`` / ``aten.gelu_backward`` with the tanh approximation (kernellab's
  gelu is the tanh form).
- ``add``: ``torch.add``; the gradient is dy for both inputs.
- ``attention``: ``F.scaled_dot_product_attention`` (SDPA picks cuDNN, flash or
  efficient as it does for a plain call), differentiated by PyTorch's engine on detached
  leaves: SDPA's private forward/backward ops differ between backends and versions
  (cuDNN's backward takes a non-optional bias), so this stays on the public function.
  Causal attention is aligned top-left by SDPA and bottom-right by kernellab; the two
  agree when S_q == S_k, and other lengths are refused.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_aten = torch.ops.aten


class _Entry:
    """Node-free entry points of one op over PyTorch's kernels."""

    backend = "torch"

    def __init__(self, op: str, forward_saving, backward_from):
        self.op = op
        self.forward_saving = forward_saving
        self.backward_from = backward_from

    def __repr__(self) -> str:
        return f"aten.{self.op}"


def _ln_fwd(x, weight, bias, eps: float = 1e-5):
    y, mean, rstd = _aten.native_layer_norm(x, [x.shape[-1]], weight, bias, eps)
    return y, (x, weight, bias, mean, rstd)


def _ln_bwd(saved, dy):
    x, weight, bias, mean, rstd = saved
    mask = [True, weight is not None, bias is not None]
    dx, dw, db = _aten.native_layer_norm_backward(dy, x, [x.shape[-1]], mean, rstd, weight, bias, mask)
    return dx, dw, db, None


def _gelu_fwd(x):
    return _aten.gelu(x, approximate="tanh"), x


def _gelu_bwd(x, dy):
    return (_aten.gelu_backward(dy, x, approximate="tanh"),)


def _add_fwd(a, b):
    return torch.add(a, b), None


def _add_bwd(saved, dy):
    return dy, dy


def _attn_fwd(q, k, v, causal: bool, scale: float | None):
    if causal and q.shape[-2] != k.shape[-2]:
        raise ValueError(
            f"aten attention: causal with S_q={q.shape[-2]} != S_k={k.shape[-2]} (SDPA aligns the mask "
            "top-left, kernellab bottom-right); use a kernellab backend"
        )
    with torch.enable_grad():
        leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))
        o = F.scaled_dot_product_attention(*leaves, is_causal=causal, scale=scale)
    return o.detach(), (leaves, o)


def _attn_bwd(saved, do):
    leaves, o = saved
    if do.is_cuda and do.data_ptr() % 16:  # SDPA's backward reads 16-byte vectors unchecked
        do = do.clone()
    dq, dk, dv = torch.autograd.grad(o, leaves, do)
    return dq, dk, dv, None, None


layer_norm = _Entry("layer_norm", _ln_fwd, _ln_bwd)
gelu = _Entry("gelu", _gelu_fwd, _gelu_bwd)
add = _Entry("add", _add_fwd, _add_bwd)
attention = _Entry("attention", _attn_fwd, _attn_bwd)

ENTRIES = {"layer_norm": layer_norm, "gelu": gelu, "add": add, "attention": attention}
