"""compare.judge: the rule every output is judged by (DESIGN.md, "Correctness").

error = max |out - ref| where ref is finite; NaN/inf positions and inf signs must match;
pass when error <= 2 x (PyTorch's error) + one eps at the output's scale; the documented
per-dtype tolerance where there is no PyTorch output (or it broke parity itself).
"""

from __future__ import annotations

import pytest
import torch

from kernellab.harness.compare import DOC_RTOL, Verdict, eps, judge, max_error, parity
from kltest import DTYPES, dtype_id

INF, NAN = float("inf"), float("nan")


def _ref(values):
    return torch.tensor(values, dtype=torch.float64)


# --------------------------------------------------------------------------- parity


def test_exact_output_passes():
    ref = _ref([0.5, -1.0, 2.0, 0.0])
    v = judge(ref.float(), ref, torch.float32)
    assert v.ok and v.err == 0.0 and v.detail == ""


def test_nan_where_reference_is_finite_fails():
    ref = _ref([1.0, 2.0, 3.0, 4.0])
    out = ref.float().clone()
    out[2] = NAN
    v = judge(out, ref, torch.float32, baseline=ref.float())
    assert not v.ok
    assert "1 NaN where the reference is not (first at flat index 2; unwritten?)" in v.detail
    assert v.err == INF  # an unwritten element is an infinite error


def test_missing_nan_fails():
    ref = _ref([1.0, NAN, 3.0])
    out = torch.tensor([1.0, 0.0, 3.0])
    v = judge(out, ref, torch.float32)
    assert not v.ok and "1 NaN of the reference missing" in v.detail


def test_matching_nan_and_inf_pass_and_are_excluded_from_the_error():
    ref = _ref([NAN, INF, -INF, 1.0])
    out = torch.tensor([NAN, INF, -INF, 1.0])
    v = judge(out, ref, torch.float32)
    assert v.ok and v.err == 0.0
    assert max_error(out, ref) == 0.0 and parity(out, ref) == ""


def test_inf_sign_must_match():
    ref = _ref([INF, 1.0])
    v = judge(torch.tensor([-INF, 1.0]), ref, torch.float32)
    assert not v.ok and "1 inf positions or signs differ" in v.detail


def test_inf_where_reference_is_finite_fails():
    ref = _ref([1.0, 2.0])
    v = judge(torch.tensor([1.0, INF]), ref, torch.float32)
    assert not v.ok and "inf positions or signs differ" in v.detail and v.err == INF


def test_finite_where_reference_is_inf_fails():
    ref = _ref([1.0, -INF])
    v = judge(torch.tensor([1.0, -3.0e38]), ref, torch.float32)
    assert not v.ok and "inf positions or signs differ" in v.detail


def test_all_nonfinite_reference():
    ref = _ref([NAN, INF])
    assert judge(torch.tensor([NAN, INF]), ref, torch.float32).ok
    assert not judge(torch.tensor([NAN, NAN]), ref, torch.float32).ok


# --------------------------------------------------------------------------- type, shape, dtype


def test_shape_mismatch_fails():
    ref = _ref([[1.0, 2.0]])
    v = judge(torch.tensor([1.0, 2.0]), ref, torch.float32)
    assert not v.ok and v.detail == "shape (2,), expected (1, 2)" and v.err == INF


def test_dtype_mismatch_fails():
    ref = _ref([1.0, 2.0])
    v = judge(torch.tensor([1.0, 2.0], dtype=torch.float16), ref, torch.float32)
    assert not v.ok and v.detail == "dtype torch.float16, expected torch.float32"


def test_not_a_tensor_fails():
    v = judge([1.0, 2.0], _ref([1.0, 2.0]), torch.float32)
    assert not v.ok and v.detail == "returned list, expected a tensor"


def test_empty_passes_but_shape_and_dtype_still_count():
    ref = torch.empty(3, 0, dtype=torch.float64)
    assert judge(torch.empty(3, 0), ref, torch.float32).ok
    assert not judge(torch.empty(0, 3), ref, torch.float32).ok
    assert not judge(torch.empty(3, 0, dtype=torch.bfloat16), ref, torch.float32).ok


# --------------------------------------------------------------------------- the 2x rule


def test_two_times_pytorch_error_plus_noise_floor():
    # Values exactly representable in fp32: errors are exact powers of two.
    ref = _ref([1.0, 0.5, -0.25])
    baseline = torch.tensor([1.0 + 2**-10, 0.5, -0.25])  # PyTorch's error: 2^-10
    floor = eps(torch.float32) * 1.0  # scale = max(1, max |ref|) = 1
    ok = judge(torch.tensor([1.0 + 2**-9, 0.5, -0.25]), ref, torch.float32, baseline)
    assert ok.ok and ok.err == 2**-9
    assert ok.bound == pytest.approx(2 * 2**-10 + floor, rel=0, abs=0)
    # Just over the bound (one ulp at 1.0 is 2^-23; the floor is one of them).
    over = judge(torch.tensor([1.0 + 2**-9 + 2**-22, 0.5, -0.25]), ref, torch.float32, baseline)
    assert not over.ok and "> bound" in over.detail
    # Exactly at the bound passes (<=).
    at = judge(torch.tensor([1.0 + 2**-9 + 2**-23, 0.5, -0.25]), ref, torch.float32, baseline)
    assert at.ok and at.ratio == 1.0


def test_noise_floor_scales_with_the_output():
    ref = _ref([1000.0, 3.0])
    baseline = ref.float()  # PyTorch exact: the bound is the floor alone
    v = judge(ref.float(), ref, torch.float32, baseline)
    assert v.bound == eps(torch.float32) * 1000.0
    # One ulp off at 1000 (ulp = 2^-14) is within one eps x 1000 (~1.2e-4).
    assert judge(torch.tensor([1000.0 + 2**-14, 3.0]), ref, torch.float32, baseline).ok
    # The floor never drops below one eps (scale >= 1), so tiny outputs keep a floor.
    small = _ref([2**-10])
    assert judge(torch.tensor([2**-10]), small, torch.float32, torch.tensor([2**-10])).bound == eps(
        torch.float32
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_documented_tolerance_when_no_baseline(dtype):
    ref = _ref([4.0, -2.0, 0.125])
    v = judge(ref.to(dtype), ref, dtype, baseline=None)
    assert v.ok and v.bound == DOC_RTOL[dtype] * 4.0  # relative to max |ref|
    # Whole ulps at 4.0 (exact in every dtype): the most that fit in the bound pass, one
    # more fails.
    ulp = eps(dtype) * 4.0
    k = int(DOC_RTOL[dtype] / eps(dtype))
    for n_ulps, ok in ((k, True), (k + 1, False)):
        out = ref.clone()
        out[0] += n_ulps * ulp
        out = out.to(dtype)
        assert float(out[0]) - 4.0 == n_ulps * ulp
        verdict = judge(out, ref, dtype, None)
        assert verdict.ok is ok, (dtype, n_ulps, verdict)


def test_documented_tolerances():
    assert DOC_RTOL == {torch.float32: 2e-6, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
    # Each is a few units of rounding of its dtype.
    for dtype, rtol in DOC_RTOL.items():
        assert eps(dtype) <= rtol <= 20 * eps(dtype)


def test_baseline_that_breaks_parity_falls_back_to_documented_tolerance():
    ref = _ref([2.0, 1.0, 0.5])
    broken = torch.tensor([2.0, NAN, 0.5])  # PyTorch's own output has an unwritten element
    v = judge(torch.tensor([2.0, 1.0, 0.5]), ref, torch.float32, broken)
    assert v.ok and v.bound == DOC_RTOL[torch.float32] * 2.0
    # The fallback is not "anything goes".
    bad = judge(torch.tensor([2.0, 1.0 + 1e-3, 0.5]), ref, torch.float32, broken)
    assert not bad.ok


def test_exact_baseline_makes_the_bound_tight():
    # When PyTorch is exact the implementation gets one eps at the output scale, no more.
    ref = _ref([1.0, 1.5])
    v = judge(torch.tensor([1.0, 1.5 + 2**-22]), ref, torch.float32, ref.float())
    assert not v.ok and v.bound == eps(torch.float32) * 1.5  # scale = max |ref|


def test_verdict_ratio():
    assert Verdict(True, 1.0, 2.0).ratio == 0.5
    assert Verdict(True, 0.0, 0.0).ratio == 0.0
    assert Verdict(False, 1.0, 0.0).ratio == INF


def test_a_reference_beyond_the_dtype_range_expects_inf():
    """77000 does not fit fp16 (max 65504): inf is the correctly rounded fp16 result, and a
    finite saturated value is not."""
    ref = torch.tensor([77000.0, 1.5], dtype=torch.float64)
    out = torch.tensor([float("inf"), 1.5], dtype=torch.float16)
    assert judge(out, ref, torch.float16).ok
    sat = torch.tensor([65504.0, 1.5], dtype=torch.float16)
    assert not judge(sat, ref, torch.float16).ok
    # in range: an inf is still wrong
    ref2 = torch.tensor([60000.0, 1.5], dtype=torch.float64)
    assert not judge(torch.tensor([float("inf"), 1.5], dtype=torch.float16), ref2, torch.float16).ok


def test_sensitivity_raises_the_floor_never_lowers_it():
    # A dot with cancellation: PyTorch nearly exact (lucky), terms ~8 summing to ~1.
    ref = torch.tensor([1.0634354048159889], dtype=torch.float64)
    base = torch.tensor([1.063435435295105])  # error 3.05e-8
    out = torch.tensor([1.0634360313415527])  # error 6.27e-7 (< 1 ulp at the partial sums ~8)
    assert not judge(out, ref, torch.float32, base).ok
    v = judge(out, ref, torch.float32, base, sensitivity=1.1e-6)
    assert v.ok and v.bound == pytest.approx(2 * 3.05e-8 + 1.1e-6, rel=1e-2)
    # Below one ulp of the output, or not finite: the one-ulp floor stands.
    assert judge(out, ref, torch.float32, base, sensitivity=1e-9).bound == judge(out, ref, torch.float32, base).bound
    assert judge(out, ref, torch.float32, base, sensitivity=float("inf")).bound < 1e-6
