"""manual, torch and compile backends of cross_entropy."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from kernellab.core.spec import upcast
from kernellab.ops._baselines import compiled, register_baseline
from kernellab.ops.cross_entropy._fused import check_targets as _check_targets


def _checked(fn):
    """``fn`` after the PyTorch target range check (skipped while torch.compile traces).
    With ``check_targets=False`` the check is skipped, and on the CPU, where PyTorch's ops
    raise at once for a bad index (IndexError from nll_loss, RuntimeError from gather or
    an Inductor bounds assert), that error is replaced by the check's ValueError naming
    ``target`` (the check runs only then: nothing is added to a good call)."""

    @functools.wraps(fn)
    def wrapper(
        logits, target, ignore_index=-100, reduction="mean", inplace_backward=False, check_targets=None
    ):
        if torch.compiler.is_compiling():
            return fn(logits, target, ignore_index, reduction, inplace_backward)
        if check_targets is not False:
            _check_targets(logits, target, ignore_index)
            return fn(logits, target, ignore_index, reduction, inplace_backward)
        try:
            return fn(logits, target, ignore_index, reduction, inplace_backward)
        except (IndexError, RuntimeError):
            if logits.is_cuda:  # (a device-side assert: the CUDA context is unusable)
                raise
            _check_targets(logits, target, ignore_index)  # raises ValueError naming target[i]
            raise

    return wrapper


def manual_cross_entropy(logits, target, ignore_index=-100, reduction="mean", inplace_backward=False):
    """log_softmax in fp32 + gather + masked reduction: stores the fp32 log-softmax [N, V]."""
    keep = target != ignore_index
    logp = torch.log_softmax(upcast(logits), dim=-1)
    picked = logp.gather(1, torch.where(keep, target, 0).unsqueeze(1)).squeeze(1)
    loss = torch.where(keep, -picked, 0.0)  # select, not multiply: a NaN row that is ignored stays 0
    if reduction == "none":
        out = loss
    elif reduction == "sum":
        out = loss.sum()
    else:
        out = loss.sum() / keep.sum()  # all ignored: 0 / 0 = NaN, as PyTorch
    return out.to(logits.dtype)


def torch_cross_entropy(logits, target, ignore_index=-100, reduction="mean", inplace_backward=False):
    """torch.nn.functional.cross_entropy (log_softmax + nll_loss kernels)."""
    return F.cross_entropy(logits, target, ignore_index=ignore_index, reduction=reduction)


register_baseline(
    "cross_entropy",
    _checked(manual_cross_entropy),
    _checked(torch_cross_entropy),
    _checked(compiled(manual_cross_entropy)),
)
