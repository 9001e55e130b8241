"""cross_entropy: every backend that runs here x vocabularies (odd ones included) x dtypes x
reductions, forward and dlogits against the float64 reference; ignore_index (default and
not), all-ignored batches, +-1e4 fp16 logits, out-of-range targets, the in-place backward,
the check engine (and planted wrong implementations it must reject), torch.compile over the
Triton backend, the CUDA source compiling; GPU tests at scaled-down bench shapes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kernellab
import kernellab.ops.cross_entropy as ce  # registers the op and its backends
from kernellab.core import registry
from kernellab.harness.check import FAIL, PASS, check_impl
from kernellab.harness.compare import judge
from kltest import DTYPES, cpu_backends, cuda_backends, dtype_id, seed_for, shape_id

SPEC = ce.SPEC
CPU = cpu_backends("cross_entropy")  # manual, torch, triton (compile is tested on its own)
GPU = cuda_backends("cross_entropy")
REDUCTIONS = ["mean", "sum", "none"]


def _case(
    backend, dtype, shape, reduction, device="cpu", ignore_index=-100, target=None, seed=0, inplace=False,
    check=None,
):  # fmt: skip
    """Forward and dlogits of ``backend`` judged against float64 (2 x PyTorch's error);
    ``check``: the call's check_targets."""
    logits, t = SPEC.make_inputs(shape, dtype, device, seed)
    if target is not None:
        t = target
    kw = {"ignore_index": ignore_index, "reduction": reduction}
    ref = F.cross_entropy(logits.double(), t, **kw)
    with torch.no_grad():
        base = F.cross_entropy(logits, t, **kw)
        y = ce.cross_entropy(logits, t, **kw, backend=backend, check_targets=check)
    v = judge(y, ref, dtype, base)
    assert v.ok, ("forward", v.detail)

    gen = torch.Generator(device=device).manual_seed(seed + 1)
    dy = torch.randn(ref.shape, generator=gen, device=device).to(dtype)
    x = logits.detach().clone().requires_grad_()
    out = ce.cross_entropy(x, t, **kw, backend=backend, inplace_backward=inplace, check_targets=check)
    (g,) = torch.autograd.grad(out, x, dy)
    x64 = logits.detach().double().requires_grad_()
    (g_ref,) = torch.autograd.grad(F.cross_entropy(x64, t, **kw), x64, dy.double())
    xt = logits.detach().clone().requires_grad_()
    (g_torch,) = torch.autograd.grad(F.cross_entropy(xt, t, **kw), xt, dy)
    v = judge(g, g_ref, dtype, g_torch)
    assert v.ok, ("dlogits", v.detail)


# --------------------------------------------------------------------------- CPU matrix

SHAPES = [(1, 1), (3, 1000), (7, 1023), (2, 4097)]
VOCABS = [(2, 32000), (2, 32001), (1, 50304), (1, 128256)]  # the vocabularies, few rows


def test_matrix_is_not_empty():
    assert {"manual", "torch", "triton"} <= set(CPU)
    assert {"cuda", "cuda_v1", "triton", "liger"} <= {i.backend for i in kernellab.impls("cross_entropy")}


@pytest.mark.parametrize("backend", CPU)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_forward_and_gradient(backend, dtype, shape):
    _case(backend, dtype, shape, "mean", seed=seed_for(backend, dtype, shape))


@pytest.mark.parametrize("backend", CPU)
@pytest.mark.parametrize("shape", VOCABS, ids=shape_id)
def test_vocabularies_bf16(backend, shape):
    _case(backend, torch.bfloat16, shape, "mean", seed=seed_for(backend, shape))


@pytest.mark.parametrize("backend", CPU)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("reduction", ["sum", "none"])
def test_reductions(backend, dtype, reduction):
    _case(backend, dtype, (9, 1000), reduction, seed=seed_for(backend, dtype, reduction))


@pytest.mark.parametrize("backend", CPU)
@pytest.mark.parametrize("ignore_index", [0, 7, -1])
def test_non_default_ignore_index(backend, ignore_index):
    n, v = 11, 300
    t = torch.randint(0, v, (n,), generator=torch.Generator().manual_seed(ignore_index + 5))
    t[::3] = ignore_index
    t[1] = ignore_index + 1 if ignore_index >= 0 else 5  # a valid class next to the ignored one
    for reduction in REDUCTIONS:
        _case(backend, torch.float32, (n, v), reduction, ignore_index=ignore_index, target=t, seed=3)
    # -100 is an ordinary (out-of-range) target when another value is ignored.
    t[0] = -100
    logits = torch.randn(n, v)
    with pytest.raises(ValueError, match=r"\btarget\b"):
        ce.cross_entropy(logits, t, ignore_index=ignore_index, backend=backend)


@pytest.mark.parametrize("backend", CPU)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_all_ignored_batch_behaves_like_pytorch(backend, dtype):
    logits = torch.randn(4, 50).to(dtype)
    t = torch.full((4,), -100, dtype=torch.int64)
    for reduction in REDUCTIONS:
        x = logits.clone().requires_grad_()
        y = ce.cross_entropy(x, t, reduction=reduction, backend=backend)
        ref = F.cross_entropy(logits, t, reduction=reduction)
        assert y.dtype == ref.dtype == dtype
        assert torch.equal(torch.isnan(y), torch.isnan(ref)), (reduction, y, ref)
        if reduction == "mean":
            assert torch.isnan(y)  # 0 / 0, as PyTorch
        else:
            assert (y == 0).all()
        (g,) = torch.autograd.grad(y.sum(), x)
        assert (g == 0).all()
    # an empty batch
    e = torch.randn(0, 9).to(dtype)
    et = torch.zeros(0, dtype=torch.int64)
    assert torch.isnan(ce.cross_entropy(e, et, backend=backend))
    assert ce.cross_entropy(e, et, reduction="sum", backend=backend) == 0
    assert ce.cross_entropy(e, et, reduction="none", backend=backend).shape == (0,)


@pytest.mark.parametrize("backend", CPU)
def test_fp16_logits_of_1e4_stay_finite(backend):
    n, width = 6, 2000
    g = torch.Generator().manual_seed(1)
    logits = (torch.randn(n, width, generator=g) * 3).half()
    logits[0, ::2], logits[0, 1::2] = 1e4, -1e4
    logits[1, :] = -1e4
    logits[1, 17] = 1e4
    logits[2, :] = 1e4
    t = torch.tensor([0, 1, 5, 17, -100, 3])
    for reduction in REDUCTIONS:
        ref = F.cross_entropy(logits, t, reduction=reduction)
        y = ce.cross_entropy(logits, t, reduction=reduction, backend=backend)
        assert torch.isfinite(ref).all()
        assert torch.isfinite(y).all(), (reduction, y)
        verdict = judge(y, F.cross_entropy(logits.double(), t, reduction=reduction), torch.float16, ref)
        assert verdict.ok, (reduction, verdict.detail)


def test_nan_and_inf_rows_match_pytorch():
    logits = torch.randn(5, 40)
    logits[0, 3] = float("nan")
    logits[1, 4] = float("inf")
    logits[2, :] = float("-inf")
    logits[3, 7] = float("-inf")  # the target's logit is -inf: loss +inf
    t = torch.tensor([1, 2, 3, 7, 9])
    ref = F.cross_entropy(logits, t, reduction="none")
    for backend in CPU:
        y = ce.cross_entropy(logits, t, reduction="none", backend=backend)
        assert torch.equal(torch.isnan(y), torch.isnan(ref)), backend
        assert torch.equal(torch.isinf(y), torch.isinf(ref)), backend
        torch.testing.assert_close(y[4], ref[4])


@pytest.mark.parametrize(
    "backend",
    ["triton", pytest.param("cuda", marks=pytest.mark.gpu), pytest.param("cuda_v1", marks=pytest.mark.gpu)],
)
def test_range_check_kernel_and_a_forward_that_survives_bad_targets(backend):
    # The validator does not check the range (it cost a sync per call on a GPU): the fused
    # backends queue a check kernel that writes a fresh flag (0 or 1, never left stale),
    # and their forward gives a NaN row for a bad target without reading out of bounds.
    from kernellab import registry as reg
    from kernellab.ops.cross_entropy import cuda as ce_cuda
    from kernellab.ops.cross_entropy import triton as ce_triton

    dev = "cuda" if backend.startswith("cuda") else "cpu"
    stats = ce_triton._stats if backend == "triton" else ce_cuda.stats
    fn = reg.get("cross_entropy", backend)
    logits = torch.randn(5, 33, device=dev)
    SPEC.validate(
        (logits, torch.tensor([0, 32, -100, 33, 1], device=dev)), {}, (dev,)
    )  # not the validator's job
    n = 9000  # more targets than one pass of the kernel's block, bad ones at either end
    for pos, val, want in ((None, 0, 0), (0, 33, 1), (n - 1, -1, 1), (1700, -101, 1), (3, -100, 0)):
        t = torch.randint(0, 33, (n,), device=dev)
        t[5:4000:7] = -100
        if pos is not None:
            t[pos] = val
        out = torch.full((2,), 7, dtype=torch.int32, device=dev)  # stale content is overwritten
        stats(t, 33, -100, out)
        assert out.tolist() == [want, int((t != -100).sum())], (pos, val, out)
    t = torch.tensor([0, 32, -100, 33, 1], device=dev)
    rows = fn(logits, t, reduction="none", check_targets=False)
    assert torch.isnan(rows[3]) and not torch.isnan(rows[[0, 1, 2, 4]]).any()
    with pytest.raises(ValueError, match=r"target\[3\] = 33"):
        ce.cross_entropy(logits, t, backend=backend, check_targets=True)
    if dev == "cpu":  # checked by default on the CPU; on a GPU the default never waits
        with pytest.raises(ValueError, match=r"target\[3\] = 33"):
            ce.cross_entropy(logits, t, backend=backend)
    else:
        assert torch.isnan(ce.cross_entropy(logits, t, backend=backend, reduction="none")[3])


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["triton", "cuda", "cuda_v1"])
def test_range_flag_reaches_the_host_through_the_mailbox(backend):
    """On a GPU the stats kernel stores the flag into a mapped host slot: the slot goes
    from -1 to the flag without any copy; more calls than the ring has slots, good and bad
    targets interleaved, never read a stale flag."""
    from kernellab.ops.cross_entropy import _fused
    from kernellab.ops.cross_entropy import cuda as ce_cuda
    from kernellab.ops.cross_entropy import triton as ce_triton

    stats_fn = ce_triton._stats if backend == "triton" else ce_cuda.stats
    t = torch.randint(0, 33, (3000,), device="cuda")
    for bad in (False, True):
        t[1234] = 40 if bad else 5
        pending = _fused.start_check(t)
        assert pending.flag_ptr and pending.box.host[pending.slot] == -1
        stats = _fused.target_stats(stats_fn, t, 33, -100, pending)
        assert pending.flag() == int(bad) == int(stats[0])
    logits = torch.randn(4, 33, device="cuda")
    good, worse = (
        torch.tensor([0, 5, -100, 32], device="cuda"),
        torch.tensor([0, 33, -100, 32], device="cuda"),
    )
    want = F.cross_entropy(logits, good)
    for i in range(_fused._Mailbox.SLOTS + 7):
        if i % 3 == 1:  # checked when asked (the GPU default does not wait)
            with pytest.raises(ValueError, match=r"target\[1\] = 33"):
                ce.cross_entropy(logits, worse, backend=backend, check_targets=True)
        else:
            torch.testing.assert_close(
                ce.cross_entropy(logits, good, backend=backend, check_targets=True), want
            )


def test_a_flag_that_never_arrived_runs_the_full_check():
    """flag() == -1 (the slot was not written): the full PyTorch check decides, it does
    not pass the targets on trust."""
    from kernellab.ops.cross_entropy import _fused

    class Lost:
        def flag(self):
            return -1

    logits = torch.randn(3, 10)
    _fused.finish_check(Lost(), logits, torch.tensor([0, 9, -100]), -100)  # good targets: passes
    with pytest.raises(ValueError, match=r"target\[1\] = 10"):
        _fused.finish_check(Lost(), logits, torch.tensor([0, 10, -100]), -100)


@pytest.mark.parametrize("backend", CPU)
def test_out_of_range_targets_raise(backend):
    logits = torch.randn(3, 10)
    for bad in (10, 11, -1, -101):
        with pytest.raises(ValueError, match=r"target\[1\] = "):
            ce.cross_entropy(logits, torch.tensor([0, bad, 2]), backend=backend)
        # with autograd too (the fused backends' Eager path)
        with pytest.raises(ValueError, match=r"target\[1\] = "):
            ce.cross_entropy(logits.clone().requires_grad_(), torch.tensor([0, bad, 2]), backend=backend)
    # nothing stale after a raise: a valid call afterwards passes
    good = torch.tensor([0, 9, -100])
    torch.testing.assert_close(
        ce.cross_entropy(logits, good, backend=backend), F.cross_entropy(logits, good), atol=1e-6, rtol=1e-6
    )
    with pytest.raises(TypeError, match=r"\btarget\b"):
        ce.cross_entropy(logits, torch.tensor([0, 1, 2], dtype=torch.int32), backend=backend)
    with pytest.raises(ValueError, match=r"\breduction\b"):
        ce.cross_entropy(logits, torch.tensor([0, 1, 2]), reduction="avg", backend=backend)
    with pytest.raises(TypeError, match=r"\binplace_backward\b"):
        ce.cross_entropy(logits, torch.tensor([0, 1, 2]), backend=backend, inplace_backward=1)
    with pytest.raises(TypeError, match="unexpected keyword"):
        registry.call("cross_entropy", backend, logits, torch.tensor([0, 1, 2]), label_smoothing=0.1)


@pytest.mark.parametrize(
    "backend",
    ["triton", pytest.param("cuda", marks=pytest.mark.gpu), pytest.param("cuda_v1", marks=pytest.mark.gpu)],
)
def test_check_targets_false_skips_the_check(backend):
    """check_targets=False: no wait for a range check (no host sync on a GPU); the fused
    kernels give a NaN loss for a bad row and the right loss for every other row."""
    from kernellab.ops.cross_entropy import _fused

    started = []
    real = _fused.start_check
    _fused.start_check = lambda *a: started.append(a) or real(*a)
    dev = "cuda" if backend.startswith("cuda") else "cpu"
    logits = torch.randn(4, 10, device=dev)
    t = torch.tensor([0, 10, -100, 3], device=dev)
    rows = ce.cross_entropy(logits, t, reduction="none", backend=backend, check_targets=False)
    assert torch.isnan(rows[1]) and not torch.isnan(rows[[0, 2, 3]]).any()
    torch.testing.assert_close(rows[[0, 3]], F.cross_entropy(logits[[0, 3]], t[[0, 3]], reduction="none"))
    try:
        assert not started
        # check_targets=True raises on the same inputs (so does the default on the CPU;
        # on a GPU the default skips the wait: a NaN row)
        with pytest.raises(ValueError, match=r"target\[1\] = 10"):
            ce.cross_entropy(logits, t, backend=backend, check_targets=True)
        assert len(started) == 1
        if dev == "cuda":
            assert torch.isnan(ce.cross_entropy(logits, t, reduction="none", backend=backend)[1])
            assert len(started) == 1
    finally:
        _fused.start_check = real
    with pytest.raises(TypeError, match=r"\bcheck_targets\b"):
        ce.cross_entropy(logits, t, backend=backend, check_targets=0)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_unchecked_sum_and_mean_take_one_node(dtype, reduction, monkeypatch):
    """Without a range check to wait for (check_targets=False; the GPU default) the Triton
    backend's "sum" and "mean" come from one reduction kernel after the forward, under one
    autograd node: right values and gradients against float64, ignored rows, more rows
    than the kernel's block, all rows ignored, an empty batch, a strided input, no
    double backward."""
    from kernellab.ops.cross_entropy import triton as ce_triton

    monkeypatch.setattr(ce_triton, "REDUCE_BLOCK", 16)  # (several steps over few rows)
    for shape in [(3, 1000), (37, 3)]:
        _case("triton", dtype, shape, reduction, check=False, seed=seed_for(dtype, reduction, shape))
    t = torch.randint(0, 40, (50,), generator=torch.Generator().manual_seed(2))
    t[::7] = -100
    _case("triton", dtype, (50, 40), reduction, target=t, check=False, seed=5)

    x = torch.randn(6, 30).to(dtype).requires_grad_()
    none = torch.full((6,), -100)
    y = ce.cross_entropy(x, none, reduction=reduction, backend="triton", check_targets=False)
    assert "_Reduced" in type(y.grad_fn).__name__ and y.dtype == dtype and y.shape == ()
    assert torch.isnan(y) if reduction == "mean" else y == 0  # 0 / 0, as PyTorch
    y.backward()
    assert (x.grad == 0).all()
    e = ce.cross_entropy(torch.randn(0, 9).to(dtype), torch.zeros(0, dtype=torch.int64), reduction=reduction,
                         backend="triton", check_targets=False)  # fmt: skip
    assert torch.isnan(e) if reduction == "mean" else e == 0

    logits = torch.randn(40, 7).t()  # [7, 40], strides (1, 7)
    t = torch.randint(0, 40, (7,))
    a = logits.clone().requires_grad_()
    b = logits.contiguous().requires_grad_()
    ya = ce.cross_entropy(a, t, reduction=reduction, backend="triton", check_targets=False)
    yb = ce.cross_entropy(b, t, reduction=reduction, backend="triton", check_targets=False)
    (ga,) = torch.autograd.grad(ya, a, create_graph=False)
    (gb,) = torch.autograd.grad(yb, b)
    assert torch.equal(ya, yb) and torch.equal(ga, gb)
    y = ce.cross_entropy(a, t, reduction=reduction, backend="triton", check_targets=False)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(y, a, create_graph=True)


@pytest.mark.parametrize("check_targets", [True, False], ids=["checked", "unchecked"])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_fp32_sum_and_mean_are_rounded_once(reduction, check_targets):
    """The "sum" and "mean" of the fp32 row losses carry their rows' error and one rounding,
    not the rounding of fp32 partial sums (N x the mean: a few ulps of the mean at 13 rows
    of a 1025-wide row, over the check's bound at ~2% of its seeds). Both paths: PyTorch's
    sum of the rows (checked targets) and the Triton reduction kernel (unchecked)."""
    worst = 0.0
    for seed in range(24):
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(13, 1025, generator=gen) * 2
        t = torch.randint(0, 1025, (13,), generator=gen)
        t[2::5] = -100
        ref = torch.nn.functional.cross_entropy(x.double(), t, reduction=reduction)
        out = ce.cross_entropy(x, t, reduction=reduction, backend="triton", check_targets=check_targets)
        ulp = torch.finfo(torch.float32).eps * 2.0 ** torch.frexp(ref.float())[1].item() / 2
        worst = max(worst, abs(out.double().item() - ref.item()) / ulp)
    assert worst <= 0.8, f"{reduction}: {worst:.2f} ulps of the result"  # fp32 sums: 1.0-1.3


def test_inplace_backward_reuses_the_logits_buffer():
    logits, t = SPEC.make_inputs((5, 1000), torch.float32, "cpu", 4)
    a = logits.clone().requires_grad_()
    ce.cross_entropy(a, t, backend="triton").backward()
    b = logits.clone().requires_grad_()
    ce.cross_entropy(b, t, backend="triton", inplace_backward=True).backward()
    torch.testing.assert_close(b.grad, a.grad, rtol=0, atol=0)
    # the logits now hold the gradient (documented: the flag trades them for memory)
    torch.testing.assert_close(b.detach(), b.grad, rtol=0, atol=0)
    assert b.grad.data_ptr() == b.data_ptr()  # adopted as .grad, not cloned: no logits-sized copy
    assert not torch.equal(b.detach(), logits)
    # a strided input is packed first: the copy is overwritten, the caller's logits survive
    c = logits.t().contiguous().t().requires_grad_()  # [5, 1000] with strides (1, 5)
    assert not c.is_contiguous()
    before = c.detach().clone()
    ce.cross_entropy(c, t, backend="triton", inplace_backward=True).backward()
    assert torch.equal(c.detach(), before)


# --------------------------------------------------------------------------- check engine


@pytest.mark.parametrize("backend", CPU)
def test_check_engine_passes(backend):
    rep = check_impl(registry.get("cross_entropy", backend), torch.float32, device="cpu", quick=True, seed=11)
    assert rep.status == PASS, [(c.kind, c.name, c.detail) for c in rep.failures]
    kinds = {c.kind for c in rep.cases if c.status == PASS}
    assert {"shape", "rerun", "special", "layout", "option", "grad", "bad"} <= kinds


def test_check_engine_passes_triton_bf16():
    rep = check_impl(
        registry.get("cross_entropy", "triton"), torch.bfloat16, device="cpu", quick=True, seed=12
    )
    assert rep.status == PASS, [(c.kind, c.name, c.detail) for c in rep.failures]
    # quick mode runs opcheck once, in the first 16-bit dtype (check.skips_one_dtype_stages)
    assert not any(c.kind == "opcheck" for c in rep.cases)
    rep16 = check_impl(registry.get("cross_entropy", "triton"), torch.float16, device="cpu", quick=True, seed=12,
                       stages=("opchecks",))  # fmt: skip
    assert rep16.cases and all(c.kind == "opcheck" and c.status == PASS for c in rep16.cases), rep16.failures


def _rows(logits, target, ignore_index):
    return torch.nn.functional.cross_entropy(logits.float(), target.clamp(min=0), reduction="none")


def _no_ignore(logits, target, ignore_index=-100, reduction="mean", inplace_backward=False):
    loss = _rows(logits, target, ignore_index)  # ignored rows scored against class 0
    return {"none": loss, "sum": loss.sum(), "mean": loss.mean()}[reduction].to(logits.dtype)


def _mean_over_all_rows(logits, target, ignore_index=-100, reduction="mean", inplace_backward=False):
    loss = torch.where(target != ignore_index, _rows(logits, target, ignore_index), 0.0)
    return {"none": loss, "sum": loss.sum(), "mean": loss.mean()}[reduction].to(logits.dtype)


class _NoOnehot(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target):
        ctx.save_for_backward(logits, target)
        return F.cross_entropy(logits, target)

    @staticmethod
    def backward(ctx, dy):
        logits, target = ctx.saved_tensors
        keep = (target != -100).unsqueeze(1)
        return torch.where(keep, torch.softmax(logits.float(), -1) * dy / keep.sum(), 0.0).to(
            logits.dtype
        ), None


def _wrong_grad(logits, target, ignore_index=-100, reduction="mean", inplace_backward=False):
    if reduction != "mean":
        return F.cross_entropy(logits, target, ignore_index=ignore_index, reduction=reduction)
    return _NoOnehot.apply(logits, target)


@pytest.mark.parametrize(
    "fn",
    [_no_ignore, _mean_over_all_rows, _wrong_grad],
    ids=["ignores ignore_index", "mean over N", "grad no onehot"],
)
def test_planted_wrong_implementations_fail_the_check(fn):
    registry.register("cross_entropy", "planted_wrong")(fn)
    try:
        rep = check_impl(
            registry.get("cross_entropy", "planted_wrong"), torch.float32, device="cpu", quick=True, seed=13
        )
    finally:
        registry.unregister("cross_entropy", "planted_wrong")
    assert rep.status == FAIL


# --------------------------------------------------------------------------- compile, CUDA source


def test_compile_backend_quick():
    logits, t = SPEC.make_inputs((6, 300), torch.float32, "cpu", 5)
    y = ce.cross_entropy(logits, t, backend="compile")
    torch.testing.assert_close(y, F.cross_entropy(logits, t))


def test_under_torch_compile_fullgraph():
    f = torch.compile(
        lambda x, t: ce.cross_entropy(x, t, backend="triton", reduction="sum") * 2, fullgraph=True
    )
    logits, t = SPEC.make_inputs((5, 77), torch.float32, "cpu", 6)
    x = logits.clone().requires_grad_()
    y = f(x, t)
    y.backward()
    x2 = logits.clone().requires_grad_()
    y2 = F.cross_entropy(x2, t, reduction="sum") * 2
    y2.backward()
    torch.testing.assert_close(y, y2)
    torch.testing.assert_close(x.grad, x2.grad, rtol=1e-5, atol=1e-6)


def test_cuda_source_compiles():
    from kernellab.ops.cross_entropy.cuda import MODULE

    lines = MODULE.precompile(("sm_80", "sm_90"))
    assert len(lines) == 2 and all("cubin" in ln for ln in lines)


# --------------------------------------------------------------------------- GPU

GPU_SHAPES = [(64, 50304), (32, 128256), (48, 32000), (8, 32001), (5, 1000), (3, 7), (70000, 3)]


@pytest.mark.gpu
@pytest.mark.parametrize("backend", GPU)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_gpu_forward_and_gradient(backend, dtype):
    for shape in GPU_SHAPES:
        for reduction in REDUCTIONS:
            _case(backend, dtype, shape, reduction, device="cuda", seed=seed_for(backend, shape, reduction))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", [b for b in GPU if b != "liger"])
def test_gpu_edges(backend):
    # all ignored, out-of-range targets, +-1e4 fp16, offset (misaligned) logits, in-place
    logits = torch.randn(4, 4096, device="cuda").half()
    t = torch.full((4,), -100, dtype=torch.int64, device="cuda")
    assert torch.isnan(ce.cross_entropy(logits, t, backend=backend))
    bad = torch.tensor([0, 4096, 1, 2], device="cuda")
    with pytest.raises(ValueError, match=r"\btarget\b"):
        ce.cross_entropy(logits, bad, backend=backend, check_targets=True)
    if backend in ("triton", "cuda", "cuda_v1"):  # default on a GPU: no wait, a NaN row
        rows = ce.cross_entropy(logits, bad, reduction="none", backend=backend)
        assert torch.isnan(rows[1]) and torch.isfinite(rows[[0, 2, 3]]).all()
    else:
        with pytest.raises(ValueError, match=r"\btarget\b"):
            ce.cross_entropy(logits, bad, backend=backend)
    x = logits.clone()
    x[0, ::2], x[0, 1::2] = 1e4, -1e4
    t = torch.tensor([0, 1, -100, 3], device="cuda")
    y = ce.cross_entropy(x, t, reduction="none", backend=backend)
    assert torch.isfinite(y).all() and torch.isfinite(F.cross_entropy(x, t, reduction="none")).all()
    flat = torch.randn(8 * 1000 + 1, device="cuda").bfloat16()
    _case_tensors(backend, flat[1:].view(8, 1000), torch.arange(8, device="cuda") * 3)
    if backend in ("triton", "cuda", "cuda_v1"):
        _case(backend, torch.bfloat16, (16, 50304), "mean", device="cuda", inplace=True)


def _case_tensors(backend, logits, t):
    y = ce.cross_entropy(logits, t, backend=backend)
    v = judge(y, F.cross_entropy(logits.double(), t), logits.dtype, F.cross_entropy(logits, t))
    assert v.ok, v.detail


@pytest.mark.gpu
@pytest.mark.parametrize(
    "backend", [b for b in GPU if b != "liger"]
)  # the peer's check: lab/gpu_cross_entropy.py
def test_gpu_check_engine(backend):
    for dtype in DTYPES:
        rep = check_impl(registry.get("cross_entropy", backend), dtype, device="cuda", quick=True, seed=21)
        assert rep.status == PASS, [(c.kind, c.name, c.detail) for c in rep.failures]


@pytest.mark.gpu
def test_gpu_inplace_backward_extra_memory_is_small():
    logits, t = SPEC.make_inputs((256, 50304), torch.bfloat16, "cuda", 0)
    for backend in ("triton", "cuda"):
        x = logits.clone().requires_grad_()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        ce.cross_entropy(x, t, backend=backend, inplace_backward=True).backward()
        torch.cuda.synchronize()
        extra = torch.cuda.max_memory_allocated() - before
        assert extra < 0.05 * logits.numel() * 2, (backend, extra)  # N floats, not a logits-sized buffer
        del x


def test_cuda_vector_path_choice():
    # v2 peels rows to a 16-byte boundary: any start works for the forward; the backward
    # needs dx rows aligned like the logits rows (else v1).
    from kernellab.ops.cross_entropy.cuda import _vec_ok

    flat = torch.empty(8 * 1000 + 64, dtype=torch.bfloat16)
    off = flat[1 : 1 + 8 * 1000].view(8, 1000)
    fresh = torch.empty(8, 1000, dtype=torch.bfloat16)
    assert flat.data_ptr() % 16 == 0 and fresh.data_ptr() % 16 == 0  # the allocator aligns (64 B)
    assert _vec_ok(off) and _vec_ok(off, off)  # forward, and the in-place backward
    assert not _vec_ok(off, fresh)  # 2 bytes off against a fresh dx: v1
    assert _vec_ok(flat[8 : 8 + 8 * 1000].view(8, 1000), fresh)  # 16 bytes off: same alignment


# --------------------------------------------------------------------------- in-place backward, bad targets


@pytest.mark.parametrize("backend", CPU)
def test_inplace_backward_twice_is_refused_or_right(backend):
    """inplace_backward=True, then a second backward through the same graph
    (retain_graph=True): the fused backends' first backward overwrote the logits, so the
    second is refused naming the option (not computed from the gradient: error 0.08); the
    backends that ignore the flag give the same gradient twice."""
    logits, t = SPEC.make_inputs((5, 33), torch.float32, "cpu", 7)
    x = logits.clone().requires_grad_()
    loss = ce.cross_entropy(x, t, backend=backend, inplace_backward=True)
    (g1,) = torch.autograd.grad(loss, x, retain_graph=True)
    x64 = logits.double().requires_grad_()
    (g_ref,) = torch.autograd.grad(F.cross_entropy(x64, t), x64)
    torch.testing.assert_close(g1.double(), g_ref, rtol=1e-5, atol=1e-6)
    if backend in ("triton", "cuda", "cuda_v1"):
        with pytest.raises(RuntimeError, match=r"inplace_backward=True overwrote the logits"):
            torch.autograd.grad(loss, x)
    else:
        (g2,) = torch.autograd.grad(loss, x)
        torch.testing.assert_close(g2, g1, rtol=0, atol=0)


def test_inplace_backward_makes_other_users_of_the_logits_raise():
    """A node created before the cross-entropy that saved the logits (a z-loss term) runs
    after its in-place backward: it raises PyTorch's in-place modification error instead
    of reading the gradient as logits. Without the option both terms are right."""
    logits, t = SPEC.make_inputs((4, 19), torch.float32, "cpu", 8)
    x = logits.clone().requires_grad_()
    z = (x * x).mean()  # saves x
    loss = ce.cross_entropy(x, t, backend="triton", inplace_backward=True) + z
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()
    x = logits.clone().requires_grad_()
    z = (x * x).mean()
    (ce.cross_entropy(x, t, backend="triton") + z).backward()
    y = logits.clone().requires_grad_()
    (F.cross_entropy(y, t) + (y * y).mean()).backward()
    torch.testing.assert_close(x.grad, y.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "backend,dev",
    [(b, "cpu") for b in CPU + ["compile"]]
    + [pytest.param(b, "cuda", marks=pytest.mark.gpu) for b in ("triton", "cuda", "cuda_v1")],
)
def test_check_targets_false_bad_target_is_an_error_or_a_nan_row(backend, dev):
    """check_targets=False with an out-of-range target: on the CPU the backends built on
    PyTorch ops raise the ValueError naming target (PyTorch's IndexError / RuntimeError /
    Inductor assert replaced); the fused kernels give a NaN loss row and a NaN gradient
    row (not a softmax row), every other row right."""
    logits = torch.randn(4, 10, device=dev)
    for bad in (10, -3):
        t = torch.tensor([0, bad, -100, 3], device=dev)
        x = logits.clone().requires_grad_()
        if backend in ("manual", "torch", "compile"):
            with pytest.raises(ValueError, match=rf"target\[1\] = {bad} is out of range"):
                ce.cross_entropy(x, t, reduction="none", backend=backend, check_targets=False)
            continue
        rows = ce.cross_entropy(x, t, reduction="none", backend=backend, check_targets=False)
        rows.sum().backward()
        assert torch.isnan(rows[1]) and torch.isnan(x.grad[1]).all()
        keep = [0, 2, 3]
        y = logits[keep].clone().requires_grad_()
        F.cross_entropy(y, t[keep], reduction="none").sum().backward()
        torch.testing.assert_close(rows[keep], F.cross_entropy(logits[keep], t[keep], reduction="none"))
        torch.testing.assert_close(x.grad[keep], y.grad)
