"""linear_cross_entropy: every backend that runs here x dtypes x options (reductions,
ignore_index, label smoothing, z-loss, bias, chunk), the loss and the gradients of x,
weight and bias against float64 autograd of F.linear + F.cross_entropy; all-ignored
batches, vocabularies past 8192, chunks that do not divide N; that the chunked backends
never make an [N, V] tensor; bad inputs; the check engine (and planted wrong
implementations it must reject)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import kernellab
import kernellab.ops.linear_cross_entropy as lce  # registers the op and its backends
from kernellab.core import registry
from kernellab.harness.check import FAIL, PASS, check_impl
from kernellab.harness.compare import judge
from kltest import DTYPES, cpu_backends, dtype_id, seed_for, shape_id

SPEC = lce.SPEC
OP = "linear_cross_entropy"
CPU = cpu_backends(OP)  # manual, torch, chunked, triton, triton_rows (compile is tested on its own)
CHUNKED = ["chunked", "triton", "triton_rows"]


def _fresh(t):
    return None if t is None else t.detach().clone().requires_grad_()


def _run(backend, x, w, t, dy, opts, bias=None):
    """(loss, dx, dweight, dbias) of ``backend`` (``None``: the float64 reference)."""
    if backend is None:
        xx, ww, bb = (_fresh(a.double()) if a is not None else None for a in (x, w, bias))
        loss = lce.linear_cross_entropy_reference(xx, ww, t, bb, **opts)
        dy = dy.double()
    else:
        xx, ww, bb = _fresh(x), _fresh(w), _fresh(bias)
        loss = lce.linear_cross_entropy(xx, ww, t, bb, backend=backend, **opts)
    wrt = [xx, ww] + ([bb] if bb is not None else [])
    grads = torch.autograd.grad(loss, wrt, dy)
    return (loss.detach(), *grads)


def _case(backend, dtype, shape, opts, seed, bias=False, device="cpu", target=None):
    """Loss and every gradient of ``backend`` judged against float64 (2 x the error of the
    torch backend, PyTorch's own ops in ``dtype``)."""
    x, w, t = SPEC.make_inputs(shape, dtype, device, seed)
    x, w, t = lce._option_inputs((x, w, t), opts)
    if target is not None:
        t = target
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    b = torch.randn(w.shape[0], generator=gen, device=device).to(dtype) if bias else None
    ref_shape = t.shape if opts.get("reduction") == "none" else ()
    dy = torch.randn(ref_shape, generator=gen, device=device).to(dtype)
    ref = _run(None, x, w, t, dy, opts, b)
    base = _run("torch", x, w, t, dy, opts, b)
    got = _run(backend, x, w, t, dy, opts, b)
    assert got[0].dtype == dtype and got[0].shape == ref[0].shape
    sens, base_errs = _neighbours(x, w, t, dy, opts, b, ref, base)
    for name, g, r, fl, be in zip(("loss", "dx", "dweight", "dbias"), got, ref, sens, base_errs):
        v = judge(g, r, dtype, None, fl, baseline_err=be)
        assert v.ok, (name, v.detail)
    return got


def _neighbours(x, w, t, dy, opts, b, ref, base):
    """Per output: the check's floor for this op (OpSpec.perturbation_floor: the median over
    PERTURB_REPLICATES of the float64 reference's change when x, weight and bias move one
    ulp), and PyTorch's largest error over these inputs and those one-ulp neighbours. dx is
    a dot whose terms cancel (a row of dlogits sums to ~0): PyTorch's own fp32 error there
    swings 2-3x between inputs one ulp apart (with how this CPU's BLAS sums), so one draw of
    it is a noisy bound; over the neighbourhood it is PyTorch's accuracy at this size."""
    from kernellab.harness.check import PERTURB_REPLICATES, _change, _perturb
    from kernellab.harness.compare import max_error

    assert SPEC.perturbation_floor
    gen = torch.Generator().manual_seed(12345)
    changes, errs = [], [[max_error(bs, r) for bs, r in zip(base, ref)]]
    for _ in range(PERTURB_REPLICATES):
        mx, mw, mb = (_perturb(a, gen) if a is not None else None for a in (x, w, b))
        ref_m = _run(None, mx, mw, t, dy, opts, mb)
        changes.append([_change(p, r) for p, r in zip(ref_m, ref)])
        errs.append([max_error(bs, r) for bs, r in zip(_run("torch", mx, mw, t, dy, opts, mb), ref_m)])
    return [sorted(col)[len(col) // 2] for col in zip(*changes)], [max(col) for col in zip(*errs)]


OPTION_CASES = [
    {},
    {"reduction": "sum"},
    {"reduction": "none"},
    {"ignore_index": 3},
    {"label_smoothing": 0.1},
    {"z_loss": 1e-2},
    {"label_smoothing": 0.2, "z_loss": 1e-3, "reduction": "none"},
    {"chunk": 5},
    {"reduction": "none", "chunk": 8},
    {"label_smoothing": 0.1, "z_loss": 1e-2, "reduction": "sum", "chunk": 16},
]


def _opt_id(o):
    return ",".join(f"{k}={v}" for k, v in sorted(o.items())) or "default"


def test_matrix_is_not_empty():
    assert {"manual", "torch", "chunked", "triton", "triton_rows"} <= set(CPU)
    assert "compile" in {i.backend for i in kernellab.impls(OP)}


@pytest.mark.parametrize("backend", CPU)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("opts", OPTION_CASES, ids=_opt_id)
def test_loss_and_gradients(backend, dtype, opts):
    _case(backend, dtype, (37, 24, 300), opts, seed_for(backend, dtype, _opt_id(opts)))


@pytest.mark.parametrize("backend", CPU)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_bias_gradient(backend, dtype, reduction):
    opts = {"reduction": reduction, "z_loss": 1e-3, "label_smoothing": 0.1, "chunk": 8}
    _case(backend, dtype, (37, 24, 300), opts, seed_for(backend, dtype, reduction), bias=True)


@pytest.mark.parametrize("backend", CPU)
@pytest.mark.parametrize(
    "shape, opts",
    [
        ((2, 5, 16, 129), {}),  # x [B, T, H], target [B, T]
        ((2, 5, 16, 129), {"reduction": "none"}),  # loss [B, T]
        ((3, 8, 8197), {"chunk": 2}),  # V past two 4096-column blocks and past 8192
        ((7, 8, 33), {"chunk": 3}),  # a chunk that does not divide N
        ((1, 1, 1), {}),
        ((5, 0, 7), {}),  # H = 0: every logit 0
    ],
    ids=lambda p: shape_id(p) if isinstance(p, tuple) else _opt_id(p),
)
def test_boundary_shapes_fp32(backend, shape, opts):
    _case(backend, torch.float32, shape, opts, seed_for(backend, shape, _opt_id(opts)))


@pytest.mark.parametrize("backend", CPU)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_all_ignored_behaves_like_pytorch(backend, reduction):
    x, w, _ = SPEC.make_inputs((6, 8, 11), torch.float32, "cpu", 3)
    t = torch.full((6,), -100, dtype=torch.int64)
    xx, ww = _fresh(x), _fresh(w)
    loss = lce.linear_cross_entropy(xx, ww, t, reduction=reduction, label_smoothing=0.1, z_loss=1e-2,
                                    backend=backend)  # fmt: skip
    ref = F.cross_entropy(F.linear(x, w), t, reduction=reduction, label_smoothing=0.1)
    if reduction == "mean":
        assert torch.isnan(loss) and torch.isnan(ref)
    else:
        assert torch.equal(loss, torch.zeros_like(ref)) and torch.equal(ref, torch.zeros_like(ref))
    loss.sum().backward()
    assert torch.equal(xx.grad, torch.zeros_like(x)) and torch.equal(ww.grad, torch.zeros_like(w))


@pytest.mark.parametrize("backend", CPU)
def test_empty_batch(backend):
    x, w, t = SPEC.make_inputs((0, 8, 7), torch.float32, "cpu", 0)
    assert torch.isnan(lce.linear_cross_entropy(x, w, t, backend=backend))
    assert lce.linear_cross_entropy(x, w, t, reduction="sum", backend=backend).item() == 0.0
    assert lce.linear_cross_entropy(x, w, t, reduction="none", backend=backend).shape == (0,)


def test_no_gradient_needed_computes_none():
    """Without requires_grad the chunked forward makes no gradient buffers (dweight would be [V, H])."""
    x, w, t = SPEC.make_inputs((16, 4, 50), torch.float32, "cpu", 0)
    with _Shapes() as seen:
        lce.linear_cross_entropy(x, w, t, backend="chunked", chunk=4)
    assert (50, 4) not in seen.shapes  # no dweight accumulator


# --------------------------------------------------------------------------- memory


class _Shapes(TorchDispatchMode):
    """Every floating-point tensor an aten op returns while active: its shape and the
    largest numel (the Triton interpreter's byte copies of its arguments are uint8)."""

    def __enter__(self):
        self.shapes, self.largest = set(), 0
        return super().__enter__()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for o in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(o, torch.Tensor) and o.is_floating_point():
                self.shapes.add(tuple(o.shape))
                self.largest = max(self.largest, o.numel())
        return out


@pytest.mark.parametrize("backend", CPU)
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_chunked_backends_never_make_an_n_by_v_tensor(backend, reduction):
    """Every aten op's output during forward and backward is watched (the Triton kernel
    writes into buffers those ops made). The chunked backends' largest tensor is one
    chunk of logits; the full-logits backends must be seen making [N, V] (the test
    can tell them apart)."""
    n, h, v, chunk = 64, 8, 300, 16  # N*V = 19200; a chunk's logits 4800, dweight V*H = 2400, x 512
    x, w, t = SPEC.make_inputs((n, h, v), torch.float32, "cpu", 1)
    xx, ww = _fresh(x), _fresh(w)
    with _Shapes() as seen:
        loss = lce.linear_cross_entropy(xx, ww, t, reduction=reduction, chunk=chunk, backend=backend)
        loss.sum().backward()
    full = (n, v) in seen.shapes or seen.largest >= n * v
    if backend in CHUNKED:
        assert not full, sorted(seen.shapes)
        assert seen.largest <= max(chunk * v, n * h, v * h)
    else:
        assert full, sorted(seen.shapes)
    assert xx.grad is not None and ww.grad is not None


def test_rows_chunk_bounds_a_chunk_of_logits():
    # triton_rows: the largest power of two of rows within 2^28 fp32 logits and
    # max(N / 16, 2 H / 3) rows, at least default_chunk's, at most N
    from kernellab.ops.linear_cross_entropy._chunked import ROWS_CHUNK_ELEMS, default_chunk, rows_chunk

    assert rows_chunk(16384, 2048, 128256) == 1024  # N / 16 (2 H / 3 = 1365)
    assert rows_chunk(4096, 4096, 128256) == 2048  # 2 H / 3 = 2730: 6 C V bytes within 4 V H
    assert rows_chunk(1 << 15, 2048, 1 << 18) == 1024 and 2048 * (1 << 18) > ROWS_CHUNK_ELEMS  # the logits cap
    assert rows_chunk(8192, 1024, 128256) == 512 > default_chunk(8192, 1024, 128256) == 128
    assert rows_chunk(1024, 768, 50304) == 512  # 2 H / 3
    assert rows_chunk(1024, 64, 50304) == 64  # the floor, MIN_CHUNK
    assert rows_chunk(1 << 20, 4096, 1 << 22) == 1024 == default_chunk(1 << 20, 4096, 1 << 22)
    assert rows_chunk(37, 24, 300) == 37 and rows_chunk(0, 8, 10) == 1


def test_default_chunk_keeps_a_chunk_of_logits_near_x():
    from kernellab.ops.linear_cross_entropy._chunked import default_chunk

    assert default_chunk(16384, 2048, 128256) == 512  # 512 * 128256 ~ 2x 16384 * 2048
    assert default_chunk(4096, 768, 50304) == 64  # 64 rows at least (Liger's rule: 64)
    assert default_chunk(4096, 64, 50304) == 64  # (Liger's rule: 8)
    assert default_chunk(37, 24, 300) == 37  # one chunk
    assert default_chunk(1, 8, 10) == 1 and default_chunk(0, 8, 10) == 1


# --------------------------------------------------------------------------- bad inputs


def _good(dtype=torch.float32):
    return SPEC.make_inputs((4, 6, 5), dtype, "cpu", 0)


BAD = [
    ("weight H != x H", lambda x, w, t: ((x, torch.randn(5, 7), t), {}), ValueError, "weight"),
    ("weight 1-D", lambda x, w, t: ((x, w[0], t), {}), ValueError, "weight"),
    ("weight fp16, x fp32", lambda x, w, t: ((x, w.half(), t), {}), TypeError, "weight"),
    ("x 1-D", lambda x, w, t: ((x[0], w, t), {}), ValueError, "x"),
    ("int32 target", lambda x, w, t: ((x, w, t.int()), {}), TypeError, "target"),
    ("float target", lambda x, w, t: ((x, w, t.float()), {}), TypeError, "target"),
    ("target wrong length", lambda x, w, t: ((x, w, t[:3]), {}), ValueError, "target"),
    ("target >= V", lambda x, w, t: ((x, w, torch.tensor([0, 5, 1, 2])), {}), ValueError, "target"),
    ("target < 0", lambda x, w, t: ((x, w, torch.tensor([0, -2, 1, 2])), {}), ValueError, "target"),
    ("bias wrong length", lambda x, w, t: ((x, w, t), {"bias": torch.zeros(4)}), ValueError, "bias"),
    ("bias wrong dtype", lambda x, w, t: ((x, w, t), {"bias": torch.zeros(5).half()}), TypeError, "bias"),
    ("reduction name", lambda x, w, t: ((x, w, t), {"reduction": "avg"}), ValueError, "reduction"),
    ("negative label_smoothing", lambda x, w, t: ((x, w, t), {"label_smoothing": -0.1}), ValueError,
     "label_smoothing"),
    ("label_smoothing > 1", lambda x, w, t: ((x, w, t), {"label_smoothing": 1.1}), ValueError,
     "label_smoothing"),
    ("NaN label_smoothing", lambda x, w, t: ((x, w, t), {"label_smoothing": float("nan")}), ValueError,
     "label_smoothing"),
    ("negative z_loss", lambda x, w, t: ((x, w, t), {"z_loss": -1.0}), ValueError, "z_loss"),
    ("infinite z_loss", lambda x, w, t: ((x, w, t), {"z_loss": float("inf")}), ValueError, "z_loss"),
    ("string z_loss", lambda x, w, t: ((x, w, t), {"z_loss": "1e-4"}), TypeError, "z_loss"),
    ("float ignore_index", lambda x, w, t: ((x, w, t), {"ignore_index": -100.0}), TypeError, "ignore_index"),
    ("chunk 0", lambda x, w, t: ((x, w, t), {"chunk": 0}), ValueError, "chunk"),
    ("str check_targets", lambda x, w, t: ((x, w, t), {"check_targets": "n"}), TypeError, "check_targets"),
]  # fmt: skip


@pytest.mark.parametrize("backend", CPU)
def test_check_targets_false_skips_the_check(backend, monkeypatch):
    """check_targets=False (opt-in; the harness times the vendors with it): no target
    check, hence no wait for the device; the default checks, and the loss is the same."""
    import kernellab.ops.linear_cross_entropy._chunked as chunked
    import kernellab.ops.linear_cross_entropy.reference as ref
    from kernellab.ops.linear_cross_entropy import targets

    calls = []

    def counted(*a, **k):
        calls.append(1)
        return targets.check_targets(*a, **k)

    monkeypatch.setattr(ref, "_check", counted)
    monkeypatch.setattr(chunked, "_check_targets", counted)
    x, w, t = _good()
    checked = registry.call(OP, backend, x, w, t)
    assert len(calls) == 1
    unchecked = registry.call(OP, backend, x, w, t, check_targets=False)
    assert len(calls) == 1
    torch.testing.assert_close(unchecked, checked, rtol=0, atol=0)
    registry.call(OP, backend, x, w, t, check_targets=True)
    assert len(calls) == 2
    assert kernellab.get_spec(OP).peer_options == {"check_targets": False}


@pytest.mark.parametrize("backend", CPU)
@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_inputs_raise_naming_the_argument(backend, case):
    _, build, exc, arg = case
    args, kw = build(*_good())
    with pytest.raises(exc, match=arg):
        registry.call(OP, backend, *args, **kw)


def test_the_checks_bad_target_values_ask_for_the_range_check():
    """The check engine's bad target values pass check_targets=True: on a GPU the Triton
    backends skip the range check by default (a NaN row), so without it `kernellab check`
    fails them there for accepting bad input."""
    names = ("target >= V", "negative target that is not ignore_index")
    cases = [c for c in lce.EXTRA_BAD if c.name in names]
    assert len(cases) == 2
    for c in cases:
        args, kw = c.build("cpu", torch.float32)
        assert kw == {"check_targets": True}
        assert args[2].dtype == torch.int64
        with pytest.raises(ValueError, match="target"):
            registry.call(OP, "chunked", *args, **kw)


def test_public_signature():
    x, w, t = _good()
    b = torch.zeros(5)
    y = kernellab.linear_cross_entropy(x, w, t, b, ignore_index=-100, reduction="mean", label_smoothing=0.0,
                                       z_loss=0.0, chunk=None, backend="chunked")  # fmt: skip
    torch.testing.assert_close(y, F.cross_entropy(F.linear(x, w, b), t))
    with pytest.raises(TypeError):
        kernellab.linear_cross_entropy(x, w, t, None, -100)  # the options are keyword-only


@pytest.mark.parametrize("backend", CHUNKED)
def test_double_backward_is_refused(backend):
    x, w, t = _good()
    xx = _fresh(x)
    with pytest.raises(RuntimeError, match="double backward"):
        (g,) = torch.autograd.grad(lce.linear_cross_entropy(xx, w, t, backend=backend), xx, create_graph=True)
        g.sum().backward()


# --------------------------------------------------------------------------- check engine


@pytest.mark.parametrize("backend", ["chunked", "triton"])
def test_check_engine_passes(backend):
    # triton: quick mode runs opcheck in its first 16-bit dtype (fp16)
    dtype = torch.float16 if backend == "triton" else torch.float32
    rep = check_impl(registry.get(OP, backend), dtype, device="cpu", quick=True, seed=21)
    assert rep.status == PASS, [(c.kind, c.name, c.detail) for c in rep.failures]
    kinds = {c.kind for c in rep.cases if c.status == PASS}
    assert {"shape", "rerun", "layout", "option", "boundary", "grad", "bad", "opcheck"} <= kinds


def _chunked(x, weight, target, bias=None, **kw):
    return registry.get(OP, "chunked").fn(x, weight, target, bias, **kw)


def _no_smoothing(x, weight, target, bias=None, **kw):
    return _chunked(x, weight, target, bias, **{**kw, "label_smoothing": 0.0})


def _last_chunk_dropped(x, weight, target, bias=None, ignore_index=-100, **kw):
    n = target.numel()  # the rows past the last full chunk of 4 are left out
    keep = torch.arange(n).reshape(target.shape) < (n // 4) * 4
    t = torch.where(keep, target, ignore_index)
    return _chunked(x, weight, t, bias, ignore_index=ignore_index, **{**kw, "chunk": 4})


def _no_bias_grad(x, weight, target, bias=None, **kw):
    return _chunked(x, weight, target, bias.detach() if bias is not None else None, **kw)


@pytest.mark.parametrize(
    "fn", [_no_smoothing, _last_chunk_dropped, _no_bias_grad], ids=["no smoothing", "tail lost", "no dbias"]
)
def test_planted_wrong_implementations_fail_the_check(fn):
    registry.register(OP, "planted_wrong")(fn)
    try:
        rep = check_impl(registry.get(OP, "planted_wrong"), torch.float32, device="cpu", quick=True, seed=23)
    finally:
        registry.unregister(OP, "planted_wrong")
    assert rep.status == FAIL


def test_compile_backend_quick():
    x, w, t = SPEC.make_inputs((6, 8, 30), torch.float32, "cpu", 5)
    y = lce.linear_cross_entropy(x, w, t, backend="compile")
    torch.testing.assert_close(y, F.cross_entropy(F.linear(x, w), t))


@pytest.mark.parametrize("backend", CHUNKED)
def test_under_torch_compile_fullgraph(backend):
    x, w, t = SPEC.make_inputs((9, 8, 40), torch.float32, "cpu", 6)
    f = torch.compile(
        lambda x, w: lce.linear_cross_entropy(x, w, t, reduction="sum", chunk=4, backend=backend) * 2,
        fullgraph=True,
    )
    xx, ww = _fresh(x), _fresh(w)
    y = f(xx, ww)
    y.backward()
    x2, w2 = _fresh(x), _fresh(w)
    y2 = F.cross_entropy(F.linear(x2, w2), t, reduction="sum") * 2
    y2.backward()
    torch.testing.assert_close(y, y2)
    torch.testing.assert_close(xx.grad, x2.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ww.grad, w2.grad, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("backend", CHUNKED)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_gpu_loss_and_gradients(backend, dtype):
    cases = [
        ((512, 256, 32000), {}),
        ((300, 128, 50257), {"reduction": "none", "z_loss": 1e-4}),
        ((2, 100, 64, 8197), {"label_smoothing": 0.1}),
        ((64, 64, 128256), {"chunk": 7}),
    ]
    for shape, opts in cases:
        _case(backend, dtype, shape, opts, seed_for(backend, dtype, shape), bias=True, device="cuda")


def _peak_extra(backend, x, w, t):
    """Peak bytes allocated beyond the inputs during forward + backward."""
    xx, ww = _fresh(x), _fresh(w)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    lce.linear_cross_entropy(xx, ww, t, backend=backend).backward()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def test_which_calls_check_their_targets():
    """The default checks (a wait for the device) except in the triton backends on a GPU,
    whose kernels clamp targets (a bad one: a NaN row); config.check_targets asks for it
    there too; an explicit True or False decides."""
    from kernellab.ops.linear_cross_entropy._chunked import wants_check

    assert wants_check(None, False, True) and wants_check(None, True, False)
    assert wants_check(None, False, False)
    assert not wants_check(None, True, True)
    with kernellab.config.override(check_targets=True):
        assert wants_check(None, True, True)
    for on_gpu, clamped in ((True, True), (False, False)):
        assert wants_check(True, on_gpu, clamped) and not wants_check(False, on_gpu, clamped)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["triton", "triton_rows"])
def test_gpu_default_never_waits_and_a_bad_target_is_a_nan_row(backend):
    """On a GPU the triton backends' default does not check: no device-to-host read (the
    sync debug mode raises on one), and an out-of-range target gives a NaN loss row; with
    check_targets=True the ValueError naming target."""
    g = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(64, 32, device="cuda", generator=g, dtype=torch.bfloat16)
    w = torch.randn(1000, 32, device="cuda", generator=g, dtype=torch.bfloat16)
    t = torch.randint(0, 1000, (64,), device="cuda", generator=g)
    t[5] = 1000
    lce.linear_cross_entropy(x, w, t, backend=backend, reduction="none")  # (compiles, loads)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        rows = lce.linear_cross_entropy(x, w, t, backend=backend, reduction="none")
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.isnan(rows[5]) and torch.isfinite(rows[torch.arange(64, device="cuda") != 5]).all()
    with pytest.raises(ValueError, match=r"target \(flattened\) \[5\] = 1000"):
        lce.linear_cross_entropy(x, w, t, backend=backend, check_targets=True)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", CHUNKED)
def test_gpu_peak_memory_is_far_below_the_logits(backend):
    """bf16 8192 x 1024 -> 128256: the logits alone are 2.1 GB in bf16. The chunked
    backends' extra memory is dweight in fp32 + bf16 (0.8 GB), dx and a chunk of logits."""
    n, h, v = 8192, 1024, 128256
    x = torch.randn(n, h, device="cuda", dtype=torch.bfloat16)
    w = (torch.randn(v, h, device="cuda") / 32).bfloat16()
    t = torch.randint(0, v, (n,), device="cuda")
    ours, theirs = _peak_extra(backend, x, w, t), _peak_extra("torch", x, w, t)
    logits_bf16 = n * v * 2
    assert ours < 0.6 * logits_bf16 and ours < 0.25 * theirs, (ours, theirs, logits_bf16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("chunk", [None, 5])
def test_triton_column_blocks_match_manual(monkeypatch, dtype, chunk):
    """The triton backend's vocabulary in several column blocks (the block size shrunk to
    its 128-column floor: 300 columns in 3 blocks, the last partial), a target in each
    block, bias, smoothing and z-loss, one pass or row chunks of 5: loss and every gradient
    as the manual backend's."""
    import kernellab.ops.linear_cross_entropy._chunked as chunked

    monkeypatch.setattr(chunked, "BLOCK_ELEMS", 1)
    assert chunked.block_cols(37, 300) == 128
    g = torch.Generator().manual_seed(3)
    n, h, v = 37, 24, 300
    x = torch.randn(n, h, generator=g).to(dtype)
    w = (torch.randn(v, h, generator=g) * 0.3).to(dtype)
    b = torch.randn(v, generator=g).to(dtype)
    t = torch.randint(0, v, (n,), generator=g)
    t[:3] = torch.tensor([5, 200, 299])
    t[::7] = -100
    opts = dict(label_smoothing=0.1, z_loss=1e-3, chunk=chunk)

    def run(backend):
        xx, ww, bb = (a.clone().requires_grad_() for a in (x, w, b))
        loss = lce.linear_cross_entropy(xx, ww, t, bias=bb, backend=backend, **opts)
        loss.float().backward()
        return [loss.float().detach(), xx.grad.float(), ww.grad.float(), bb.grad.float()]

    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-3, rtol=2e-2)
    for got, want in zip(run("triton"), run("manual")):
        torch.testing.assert_close(got, want, **tol)


@pytest.mark.parametrize("backend", ["triton", "triton_rows", "chunked"])
def test_chunked_backward_scales_in_place_and_refuses_a_second_backward(backend):
    """Eager, reduction mean: the backward hands over the saved gradients scaled in place
    (no second [V, H] dweight), equal to manual's for a grad_output of 2; a second backward
    through the graph raises a RuntimeError naming the op and retain_graph instead of
    scaling them twice."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(37, 24, generator=g).requires_grad_()
    w = (torch.randn(300, 24, generator=g) * 0.3).requires_grad_()
    t = torch.randint(0, 300, (37,), generator=g)
    loss = lce.linear_cross_entropy(x, w, t, backend=backend)
    gx, gw = torch.autograd.grad(loss * 2.0, [x, w], retain_graph=True)
    rx, rw = torch.autograd.grad(lce.linear_cross_entropy(x, w, t, backend="manual") * 2.0, [x, w])
    torch.testing.assert_close(gx, rx, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(gw, rw, atol=1e-6, rtol=1e-5)
    with pytest.raises(RuntimeError, match=r"linear_cross_entropy .*retain_graph=True"):
        torch.autograd.grad(loss, [x, w])


def test_block_columns_keep_each_block_device_bound():
    # 16M logits a block unless its products are under BLOCK_FLOPS, then up to 64M: at
    # Llama-1B's and Qwen2-0.5B's LM heads (4096 rows) a block's product stays ~120 GFLOP.
    from kernellab.ops.linear_cross_entropy._chunked import block_cols

    assert block_cols(4096, 128256, 2048) == 8192  # 32M logits, 137 GFLOP
    assert block_cols(4096, 151936, 896) == 16384  # 64M logits (the cap), 120 GFLOP
    assert block_cols(16384, 128256, 2048) == 2048  # 32M logits
    assert block_cols(1 << 20, 128256, 4096) == 128  # the floor
    assert block_cols(64, 256, 64) == 256  # at most V


def test_small_problems_default_to_pytorchs_path(monkeypatch):
    # No table row near the shape: up to 2^20 logits PyTorch's few kernels (launch-bound
    # calls), above it the op's preferred backends; a table row near the shape decides.
    from kernellab.core import registry, tables

    monkeypatch.setattr(tables, "load_table", lambda gpu: None)
    registry._CHOICES.clear()
    small, why = registry.choose_key(OP, (64, 64, 256), torch.float32, "cpu", "fwdbwd")
    assert small == "torch" and "small_backend" in why
    assert registry.choose_key(OP, (1024, 64, 1024), torch.float32, "cpu", "fwd")[0] == "torch"
    big = registry.choose_key(OP, (1025, 64, 1024), torch.float32, "cpu", "fwd")[0]
    assert big == registry.default_backend(OP, "cpu") != "torch"
    registry._CHOICES.clear()
    # and the public call follows it
    x, w = torch.randn(8, 16), torch.randn(32, 16)
    t = torch.randint(0, 32, (8,))
    with registry.recording_choices() as rec:
        kernellab.linear_cross_entropy(x, w, t)
    assert rec and rec[0]["backend"] == "torch"


class _CountMatmuls(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.addmm_):
            self.n += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("backend", ["triton", "triton_rows"])
def test_one_block_makes_the_logits_once(monkeypatch, backend):
    """A problem that one pass of one column block holds: the triton backends run one matmul
    for the logits, one for dx and one for dweight (the blocked runner's 4 only past one
    block), and raise on a bad target from their one-launch target check."""
    import kernellab.ops.linear_cross_entropy._chunked as chunked

    g = torch.Generator().manual_seed(7)
    x = torch.randn(37, 24, generator=g).requires_grad_()
    w = (torch.randn(300, 24, generator=g) * 0.3).requires_grad_()
    t = torch.randint(0, 300, (37,), generator=g)
    with _CountMatmuls() as c:
        loss = lce.linear_cross_entropy(x, w, t, backend=backend)
    assert c.n == 3, c.n
    gx, gw = torch.autograd.grad(loss, [x, w])
    rx, rw = torch.autograd.grad(lce.linear_cross_entropy(x, w, t, backend="manual"), [x, w])
    torch.testing.assert_close(gx, rx, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(gw, rw, atol=1e-6, rtol=1e-5)
    if backend == "triton":  # three blocks: logits twice
        monkeypatch.setattr(chunked, "BLOCK_ELEMS", 1)
        with _CountMatmuls() as c:
            lce.linear_cross_entropy(x, w, t, backend=backend)
        assert c.n == 3 * 4, c.n
    bad = t.clone()
    bad[11] = 300
    with pytest.raises(ValueError, match=r"target \(flattened\) \[11\] = 300"):
        lce.linear_cross_entropy(x, w, bad, backend=backend, reduction="none")
