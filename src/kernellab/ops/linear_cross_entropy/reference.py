"""manual, torch and compile backends of linear_cross_entropy (the full [N, V] logits), and
``chunked``: the chunk loop in PyTorch ops (see _chunked)."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from kernellab.core.registry import register
from kernellab.core.spec import upcast
from kernellab.ops._baselines import compiled, register_baseline
from kernellab.ops.linear_cross_entropy._chunked import chunked_backend, torch_rows
from kernellab.ops.linear_cross_entropy.targets import DEFAULT_IGNORE, OP, logits_loss, wants_check
from kernellab.ops.linear_cross_entropy.targets import check_targets as _check


def _checked(fn):
    """``fn`` after the target range check (skipped while torch.compile traces)."""

    @functools.wraps(fn)
    def wrapper(x, weight, target, bias=None, ignore_index=DEFAULT_IGNORE, reduction="mean",
                label_smoothing=0.0, z_loss=0.0, chunk=None, check_targets=None):  # fmt: skip
        if wants_check(check_targets, x.is_cuda, False) and not torch.compiler.is_compiling():
            _check(target, weight.shape[0], ignore_index)
        return fn(x, weight, target, bias, ignore_index, reduction, label_smoothing, z_loss)

    return wrapper


def manual_linear_cross_entropy(x, weight, target, bias=None, ignore_index=DEFAULT_IGNORE, reduction="mean",
                                label_smoothing=0.0, z_loss=0.0):  # fmt: skip
    """Full logits (x @ weight^T) in x's dtype, then log_softmax in fp32 + gather: stores [N, V] twice."""
    v = weight.shape[0]
    logits = upcast(F.linear(x, weight, bias).reshape(-1, v))
    t = target.reshape(-1)
    keep = t != ignore_index
    logp = torch.log_softmax(logits, dim=-1)
    row = -(1.0 - label_smoothing) * logp.gather(1, torch.where(keep, t, 0).unsqueeze(1)).squeeze(1)
    if label_smoothing:
        row = row - label_smoothing * logp.mean(-1)
    if z_loss:
        row = row + z_loss * torch.logsumexp(logits, dim=-1) ** 2
    row = torch.where(keep, row, 0.0)
    if reduction == "none":
        out = row.reshape(target.shape)
    elif reduction == "sum":
        out = row.sum()
    else:
        out = row.sum() / keep.sum()  # all ignored: 0 / 0 = NaN, as PyTorch
    return out.to(x.dtype)


def torch_linear_cross_entropy(x, weight, target, bias=None, ignore_index=DEFAULT_IGNORE, reduction="mean",
                               label_smoothing=0.0, z_loss=0.0):  # fmt: skip
    """F.linear in x's dtype, F.cross_entropy on the fp32 logits (+ logsumexp for the z-loss)."""
    # fp32 logits for the loss, as Hugging Face's LM heads do (logits.float()): PyTorch's
    # label-smoothing term sums -log p over V and then over N in the logits' dtype, and in
    # fp16 that sum overflows to inf already at 37 x 300.
    logits = upcast(F.linear(x, weight, bias).reshape(-1, weight.shape[0]))
    loss = logits_loss(logits, target.reshape(-1), ignore_index, reduction, label_smoothing, z_loss)
    loss = loss.to(x.dtype)
    return loss.reshape(target.shape) if reduction == "none" else loss


register_baseline(
    OP,
    _checked(manual_linear_cross_entropy),
    _checked(torch_linear_cross_entropy),
    _checked(compiled(manual_linear_cross_entropy)),
)

linear_cross_entropy_chunked = chunked_backend("linear_cross_entropy_chunked", torch_rows)

register(
    OP,
    "chunked",
    builtin=True,
    custom_ops=linear_cross_entropy_chunked.custom_ops,
    description="rows in chunks: matmul -> fp32 logits -> loss and dlogits in place (PyTorch ops) -> dx, dW",
)(linear_cross_entropy_chunked)
