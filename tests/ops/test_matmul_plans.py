"""matmul's Triton forward launch plans (triton.py, ``_PLANS``): kept per key and reused,
keys that tell apart what the kernels specialize on (strides, dtypes, flags), outputs equal
to the per-call derivation (interpreter on the CPU, compiled on a GPU), a bounded cache,
traced calls left alone."""

from __future__ import annotations

import pytest
import torch

import kernellab
from kernellab import triton_support
from kernellab.ops.matmul import triton as tm

pytestmark = pytest.mark.skipif(triton_support.unavailable() is not None, reason="Triton unavailable")


@pytest.fixture(autouse=True)
def _fresh_plans():
    tm._PLANS.clear()
    yield
    tm._PLANS.clear()


def _ops(m, n, k, dtype=torch.float32, device="cpu", seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    a = torch.randn(m, k, generator=g, device=device).to(dtype)
    w = torch.randn(n, k, generator=g, device=device).to(dtype)
    return a, w


@pytest.mark.parametrize("fwd", ["general", "skinny", "matmul"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_plan_kept_reused_and_equal_to_per_call(fwd, dtype):
    f = {"general": tm.triton_general_fwd, "skinny": tm.triton_skinny_fwd, "matmul": tm.triton_matmul_fwd}[
        fwd
    ]
    a, w = _ops(5, 33, 70, dtype)
    bias = torch.randn(33).to(dtype)
    for args in ((a, w.t()), (a, w.t(), bias, "gelu")):
        want = f(*args, plan=False)
        assert not tm._PLANS or len(tm._PLANS) == 1
        before = len(tm._PLANS)
        got = f(*args, plan=True)
        assert len(tm._PLANS) == before + 1
        plans = dict(tm._PLANS)
        again = f(*args, plan=True)
        assert tm._PLANS == plans  # reused: no new plan, the same objects
        assert torch.equal(got, want) and torch.equal(again, want)


def test_skinny_split_k_plan_sums_slices():
    a, w = _ops(3, 40, 300)
    bias = torch.randn(40)
    cfg = (32, 32, 3, 4, 1)  # three K slices: the split-sum launch
    want = tm.triton_skinny_fwd(a, w.t(), bias, "relu", config=cfg, plan=False)
    p = tm._skinny_setup(a, w.t(), True, "relu", cfg, None)
    assert p.sum is not None and p.sum_ints == (3 * 40, 40) and p.main.check == (0, 1, 4)
    for _ in range(2):
        assert torch.equal(tm.triton_skinny_fwd(a, w.t(), bias, "relu", config=cfg, plan=True), want)
    assert len(tm._PLANS) == 1


def test_default_takes_no_plan_on_cpu_and_config_switch():
    a, w = _ops(4, 8, 16)
    tm.triton_matmul_fwd(a, w.t())
    assert not tm._PLANS  # CPU tensors derive per call unless asked
    assert not tm._planned(a, None) and tm._planned(a, True) and not tm._planned(a, False)
    with kernellab.config.override(matmul_plans=False):
        assert not tm._planned(a, None)


def test_traced_calls_take_no_plan():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        fake = torch.empty(4, 8)
    assert not tm._planned(fake, True) and not tm._planned(fake, None)


def test_keys_tell_apart_strides_dtypes_flags():
    a, w = _ops(8, 16, 32)
    dy = torch.randn(8, 16)
    fwd = tm.plan_key("f", a, w.t(), None, None)
    keys = {
        fwd,
        tm.plan_key("f", dy, w, None, None),  # the backward's dx = dz @ W
        tm.plan_key("f", a.t(), dy, None, None),  # dW = a^T @ dz
        tm.plan_key("f", a, w.t().contiguous(), None, None),  # same shapes, b's strides differ
        tm.plan_key("f", a.bfloat16(), w.t().bfloat16(), None, None),
        tm.plan_key("f", a, w.t(), torch.zeros(16), None),
        tm.plan_key("f", a, w.t(), torch.zeros(16, dtype=torch.float64), None),
        tm.plan_key("f", a, w.t(), None, "relu"),
        tm.plan_key("s", a, w.t(), None, None, (None, None)),
        tm.plan_key("s", a, w.t(), None, None, ((32, 32, 1, 4, 1), None)),
    }
    assert len(keys) == 10
    assert tm.plan_key("f", a.clone(), w.t().clone().t().t(), None, None) == fwd  # same layout: one plan
    with kernellab.config.override(triton_launch="jit"):
        assert tm.plan_key("f", a, w.t(), None, None) != fwd
    old = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = not old
        assert tm.plan_key("f", a, w.t(), None, None) != fwd
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


def test_general_plan_strides_views_and_copies():
    x = torch.randn(2, 3, 7, 12)[:, :, ::2]  # [2, 3, 4, 12], rows every other: a view to [6, 4, 12]
    wb = torch.randn(12, 5).expand(2, 3, 12, 5)  # a broadcast weight: a stride-0 view too
    p = tm._general_setup(x, wb, False, None)
    assert p.a3 is None and p.b3 is None  # views: passed as they are
    assert p.ints[:3] == (4, 5, 12) and p.ints[3:6] == (84, 24, 1)
    assert p.ints[6:9] == (0, 5, 1) and p.ints[9:12] == (20, 5, 1) and p.main.check == (0, 1, 3)
    # not viewable as [bt, M, K]: reshape's copy, contiguous
    t = torch.randn(3, 2, 4, 12).transpose(0, 1)
    q = tm._general_setup(t, wb, False, None)
    assert q.a3 == (6, 4, 12) and q.ints[3:6] == (48, 12, 1)
    for a in (x, t):
        want = tm.triton_general_fwd(a, wb, plan=False)
        assert torch.equal(tm.triton_general_fwd(a, wb, plan=True), want)
        assert torch.equal(tm.triton_general_fwd(a, wb, plan=True), want)
        torch.testing.assert_close(want, a @ wb, rtol=1e-4, atol=1e-4)


def test_plan_reused_at_other_addresses():
    big, w = _ops(6, 20, 40)
    bias_big = torch.randn(21)
    first = tm.triton_matmul_fwd(big[:5], w.t(), bias_big[:20], None, plan=True)
    second = tm.triton_matmul_fwd(big[1:], w.t(), bias_big[1:], None, plan=True)  # same key, offset
    assert len(tm._PLANS) == 1
    assert torch.equal(first, tm.triton_matmul_fwd(big[:5], w.t(), bias_big[:20], None, plan=False))
    assert torch.equal(second, tm.triton_matmul_fwd(big[1:], w.t(), bias_big[1:], None, plan=False))


def test_empty_outputs_planned():
    a = torch.randn(0, 8)
    w = torch.randn(5, 8)
    y = tm.triton_general_fwd(a, w.t(), plan=True)
    assert y.shape == (0, 5)
    y = tm.triton_skinny_fwd(torch.randn(3, 8), torch.empty(8, 0), plan=True)
    assert y.shape == (3, 0)
    with pytest.raises(ValueError, match="skinny"):
        tm.triton_skinny_fwd(torch.randn(2, 3, 8), torch.randn(2, 8, 8), plan=True)


def test_plans_never_grow_past_max(monkeypatch):
    monkeypatch.setattr(triton_support, "PLANS_MAX", 3)
    w = torch.randn(4, 8)
    for m in range(1, 8):
        a = torch.randn(m, 8)
        assert torch.equal(
            tm.triton_general_fwd(a, w.t(), plan=True), tm.triton_general_fwd(a, w.t(), plan=False)
        )
        assert len(tm._PLANS) <= 3


# --------------------------------------------------------------------------- GPU


def _cuda_case(m, n, k, dtype=torch.bfloat16):
    a, w = _ops(m, n, k, dtype, "cuda", seed=m + n + k)
    dy = torch.randn(m, n, device="cuda", dtype=dtype)
    return a, w, dy


@pytest.mark.gpu
@pytest.mark.parametrize(
    "mnk", [(16, 4096, 4096), (128, 1024, 1024), (300, 200, 130), (1024, 1024, 1024)], ids=str
)
def test_gpu_planned_equals_per_call_and_binds(mnk):
    """The three products of a linear's forward+backward (b = W.t(), dz @ W, a^T @ dz),
    planned and per call, bit for bit; after a few calls every plan launch is bound
    (Bound.hit, or TunedBound's bound once the tuner picked)."""
    m, n, k = mnk
    a, w, dy = _cuda_case(m, n, k)
    bias = torch.randn(n, device="cuda", dtype=a.dtype)
    products = [
        (a, w.t(), bias, "gelu"),
        (a, w.t(), None, None),
        (dy, w, None, None),
        (a.t(), dy, None, None),
    ]
    for args in products:
        want = tm.triton_matmul_fwd(*args, plan=False)
        for _ in range(3):
            assert torch.equal(tm.triton_matmul_fwd(*args, plan=True), want)
    assert len(tm._PLANS) == len(products)
    for p in tm._PLANS.values():
        for launch in (p.main, getattr(p, "sum", None)):
            if launch is None:
                continue
            bound = launch.bound if isinstance(launch, triton_support.TunedBound) else launch
            assert bound is not None and bound.hit is not None, (mnk, p)


@pytest.mark.gpu
def test_gpu_plan_misaligned_view_falls_back():
    a, w, _ = _cuda_case(17, 2048, 1024)
    buf = torch.randn(18 * 1024 + 1, device="cuda", dtype=a.dtype)
    for _ in range(3):
        tm.triton_matmul_fwd(a, w.t(), plan=True)
    odd = buf[1 : 1 + 17 * 1024].view(17, 1024)  # same shape and strides, 2-byte offset
    want = tm.triton_matmul_fwd(odd, w.t(), plan=False)
    assert torch.equal(tm.triton_matmul_fwd(odd, w.t(), plan=True), want)
    torch.testing.assert_close(want.float(), odd.float() @ w.t().float(), rtol=2e-2, atol=2e-1)


@pytest.mark.gpu
@pytest.mark.parametrize("mnk", [(16, 4096, 1024), (256, 512, 768)], ids=str)
def test_gpu_backend_fwd_bwd_same_with_plans_off(mnk):
    m, n, k = mnk
    a, w, dy = _cuda_case(m, n, k)
    out = {}
    for plans in (True, False):
        with kernellab.config.override(matmul_plans=plans):
            x, wt = a.clone().requires_grad_(), w.clone().requires_grad_()
            for _ in range(2):
                y = kernellab.matmul(x, wt.t(), backend="triton")
                gx, gw = torch.autograd.grad(y, (x, wt), dy)
            out[plans] = (y, gx, gw)
    assert tm._PLANS
    for u, v in zip(out[True], out[False]):
        assert torch.equal(u, v)
