"""Comparing an output with the float64 reference, by the rules of DESIGN.md.

- error = max |out - ref| over positions where the reference is finite;
- NaN and +-inf positions (and the sign of inf) must match the reference exactly, so an
  unwritten element of a NaN-poisoned output always fails;
- pass when error <= 2 x (the error of PyTorch's own op on the same inputs) + a noise
  floor of one unit in the last place of the output dtype at the output's scale; where
  there is no PyTorch op to compare with, a documented per-dtype relative tolerance.
- ops that declare ``OpSpec.perturbation_floor`` (continuous ones, e.g. matmul) raise
  that floor to the exact result's own change when the inputs move by one ulp
  (``sensitivity``, measured by the check): an error of that size is what rounding the
  inputs once more does to an exact computation (the backward-error criterion), and under
  cancellation (a dot of terms ~8 summing to ~1) it exceeds one ulp of the output.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Documented tolerances (relative to max |ref|) for implementations that have no PyTorch
# op to compare with, and for the torch backend itself: a few units of rounding.
DOC_RTOL = {torch.float32: 2e-6, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def eps(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps


@dataclass
class Verdict:
    ok: bool
    err: float
    bound: float
    detail: str = ""

    @property
    def ratio(self) -> float:
        return self.err / self.bound if self.bound > 0 else (0.0 if self.err == 0 else float("inf"))


def _finite_max_abs(t: torch.Tensor) -> float:
    f = t[torch.isfinite(t)]
    return float(f.abs().max()) if f.numel() else 0.0


def max_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max |out - ref| where ref is finite (inf/NaN positions are judged by parity)."""
    if ref.numel() == 0:
        return 0.0
    out64, ref = out.detach().to(torch.float64), ref.detach()
    fin = torch.isfinite(ref)
    if not bool(fin.any()):
        return 0.0
    d = (out64[fin] - ref[fin]).abs()
    # A NaN or inf where the reference is finite is an infinite error (unwritten output).
    d = torch.where(torch.isfinite(d), d, torch.full_like(d, float("inf")))
    return float(d.max())


def parity(out: torch.Tensor, ref: torch.Tensor) -> str:
    """'' when NaN and inf positions match the reference, else what differs."""
    out64 = out.detach().to(torch.float64)
    problems = []
    nan_o, nan_r = torch.isnan(out64), torch.isnan(ref)
    extra = int((nan_o & ~nan_r).sum())
    missing = int((nan_r & ~nan_o).sum())
    if extra:
        first = int((nan_o & ~nan_r).flatten().nonzero()[0])
        problems.append(f"{extra} NaN where the reference is not (first at flat index {first}; unwritten?)")
    if missing:
        problems.append(f"{missing} NaN of the reference missing")
    inf_mismatch = int(((torch.isinf(out64) | torch.isinf(ref)) & (out64 != ref) & ~nan_r & ~nan_o).sum())
    if inf_mismatch:
        problems.append(f"{inf_mismatch} inf positions or signs differ")
    return "; ".join(problems)


def judge(
    out,
    ref: torch.Tensor,
    dtype: torch.dtype,
    baseline=None,
    sensitivity: float = 0.0,
    baseline_err: float | None = None,
) -> Verdict:
    """Judge ``out`` against float64 ``ref``; ``baseline`` is PyTorch's own output on the
    same inputs (None: use the documented tolerance); ``sensitivity``: max |ref(x') - ref(x)|
    over inputs x' one ulp from x (0: not measured), the floor where it exceeds one ulp;
    ``baseline_err``: PyTorch's error given directly (e.g. its largest over nearby inputs)
    instead of measured from ``baseline``."""
    if not isinstance(out, torch.Tensor):
        return Verdict(False, float("inf"), 0.0, f"returned {type(out).__name__}, expected a tensor")
    if tuple(out.shape) != tuple(ref.shape):
        return Verdict(False, float("inf"), 0.0, f"shape {tuple(out.shape)}, expected {tuple(ref.shape)}")
    if not ref.is_floating_point():  # indices, counts: exact
        if out.dtype != ref.dtype:
            return Verdict(False, float("inf"), 0.0, f"dtype {out.dtype}, expected {ref.dtype}")
        wrong = int((out.cpu() != ref.cpu()).sum()) if ref.numel() else 0
        return Verdict(
            wrong == 0, float(wrong), 0.0, f"{wrong} of {ref.numel()} values differ" if wrong else ""
        )
    if out.dtype != dtype:
        return Verdict(False, float("inf"), 0.0, f"dtype {out.dtype}, expected {dtype}")
    # A true value beyond the dtype's range rounds to +-inf (fp16 holds up to 65504): an
    # output of inf there is the correctly rounded answer, not a parity error.
    if ref.is_floating_point() and ref.numel():
        rounded = ref.to(dtype)
        over = torch.isfinite(ref) & torch.isinf(rounded)
        if bool(over.any()):
            ref = torch.where(over, rounded.to(ref.dtype), ref)
    scale = max(1.0, _finite_max_abs(ref))
    floor = eps(dtype) * scale
    if sensitivity > floor and sensitivity != float("inf"):
        floor = sensitivity
    if baseline_err is not None:
        base_err = baseline_err
    else:
        base_err = max_error(baseline, ref) if baseline is not None else float("inf")
    if base_err != float("inf"):
        bound = 2.0 * base_err + floor
    else:  # no PyTorch op, or it broke parity itself: the documented tolerance
        bound = DOC_RTOL[dtype] * scale
    if ref.numel() == 0:
        return Verdict(True, 0.0, bound)
    par = parity(out, ref)
    err = max_error(out, ref)
    if par:
        return Verdict(False, err, bound, par)
    if not err <= bound:
        return Verdict(False, err, bound, f"error {err:.3g} > bound {bound:.3g}")
    return Verdict(True, err, bound)
