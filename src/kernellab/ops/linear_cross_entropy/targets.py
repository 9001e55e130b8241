"""linear_cross_entropy's targets: the ignore index, the check of target values (and when
a call runs it), and the loss of full logits against them (the reference's and PyTorch's)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernellab.options import config

DEFAULT_IGNORE = -100


OP = "linear_cross_entropy"


def check_targets(target: torch.Tensor, v: int, ignore_index: int, first_bad=None) -> None:
    """ValueError naming ``target`` when a target is neither ignore_index nor in [0, V).
    ``first_bad(t, v, ignore_index)``: a backend's own search of the flattened targets (a
    0-d int64 tensor, the first bad row, N when none; read here), else PyTorch ops."""
    if not target.numel():
        return
    t = target.reshape(-1)
    if first_bad is not None:
        first = int(first_bad(t, v, ignore_index))
        if first < t.shape[0]:
            _raise_bad_target(t, first, v, ignore_index)
        return
    lo, hi = torch.stack(torch.aminmax(torch.where(t == ignore_index, 0, t))).tolist()
    if lo < 0 or hi >= v:
        first = int((((t < 0) | (t >= v)) & (t != ignore_index)).nonzero()[0, 0])
        _raise_bad_target(t, first, v, ignore_index)


def wants_check(check_targets: bool | None, on_gpu: bool, clamped: bool) -> bool:
    """Whether a call checks its targets (a read on the host: a wait for the device), for
    every backend. ``check_targets`` True or False decides; None (the default) checks,
    except on a GPU in the Triton backends (``clamped``: their kernels clamp a target before using it as an
    address, and a bad one gives a NaN loss row), unless ``kernellab.config.check_targets``
    asks for it, as cross_entropy's fused backends do."""
    if check_targets is not None:
        return check_targets
    return not (clamped and on_gpu) or config.check_targets


def _raise_bad_target(t: torch.Tensor, first: int, v: int, ignore_index: int):
    """The ValueError of ``check_targets`` for row ``first`` of the flattened targets."""
    raise ValueError(
        f"{OP}: target (flattened) [{first}] = {int(t.reshape(-1)[first])} is out of range: targets must be "
        f"in [0, {v}) (V = weight.shape[0]) or equal ignore_index ({ignore_index})"
    )


def logits_loss(logits, t, ignore_index, reduction, label_smoothing, z_loss):
    """F.cross_entropy of ``logits`` (N, V) against ``t`` (N,), plus the z-loss
    ``z_loss * logsumexp(logits)^2`` of the rows not ignored, reduced alike; with
    ``reduction="none"`` one value per row, in the logits' dtype."""
    loss = F.cross_entropy(logits, t, ignore_index=ignore_index, reduction=reduction,
                           label_smoothing=label_smoothing)  # fmt: skip
    if z_loss:
        keep = t != ignore_index
        zrow = torch.where(keep, torch.logsumexp(logits, dim=-1) ** 2, 0.0)
        if reduction == "none":
            zterm = zrow
        elif reduction == "sum":
            zterm = zrow.sum()
        else:
            zterm = zrow.sum() / keep.sum()
        loss = loss + z_loss * zterm
    return loss
