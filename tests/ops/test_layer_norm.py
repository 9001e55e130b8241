"""layer_norm: every backend that runs here x odd shapes x dtypes, forward and the three
gradients against the float64 reference; bias=None; constant rows (the eps path); the
check engine passes the CPU backends and rejects planted mistakes; custom ops (opcheck,
torch.compile fullgraph); the CUDA source compiles; GPU cases (marked ``gpu``)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kernellab
import kernellab.ops.layer_norm as ln
from kernellab.core import registry
from kernellab.harness.check import FAIL, PASS, check_impl
from kernellab.harness.compare import judge
from kltest import (
    DTYPES,
    check_planted,
    compile_grads_match,
    cpu_backends,
    cuda_backends,
    dtype_id,
    opcheck_custom_ops,
    seed_for,
    shape_id,
)

OP = "layer_norm"
SPEC = kernellab.get_spec(OP)
CPU = cpu_backends(OP)
SHAPES = [(1,), (17,), (3, 123), (5, 1025), (2, 3, 257), (70, 3), (2, 4097)]


def _torch(x, w, b, eps=1e-5):
    return F.layer_norm(x, (x.shape[-1],), w, b, eps)


def _grads(fn, args, dy, wrt):
    leaves = [
        a.detach().clone().requires_grad_(i in wrt) if a is not None else None for i, a in enumerate(args)
    ]
    out = fn(*leaves)
    return torch.autograd.grad(out, [leaves[i] for i in wrt], dy)


def _assert_fwd_bwd(backend, args, dtype, eps=1e-5, seed=0):
    x, w, b = args
    y = ln.layer_norm(x, w, b, eps, backend=backend)
    v = judge(y, SPEC.ref(x, w, b, eps=eps), dtype, _torch(x, w, b, eps))
    assert v.ok, f"forward: {v.detail}"
    wrt = [0, 1] + ([2] if b is not None else [])
    dy = torch.randn(x.shape, generator=torch.Generator().manual_seed(seed)).to(dtype).to(x.device)
    got = _grads(lambda *a: ln.layer_norm(*a, eps, backend=backend), args, dy, wrt)
    a64 = [a.double() if a is not None else None for a in args]
    ref = _grads(lambda *a: ln.layer_norm_reference(*a, eps), a64, dy.double(), wrt)
    base = _grads(lambda *a: _torch(*a, eps), args, dy, wrt)
    for name, g, r, t in zip(("dx", "dweight", "dbias"), got, ref, base):
        v = judge(g, r, dtype, t)
        assert v.ok, f"{name}: {v.detail}"


def _matrix():
    out = []
    for backend in CPU:
        for dtype in DTYPES:
            for shape in SHAPES:
                marks = ()
                if backend == "manual" and dtype == torch.float32 and shape == (2, 4097):
                    # Found by this test: autograd through the fp32 primitives loses ~3x more
                    # on dx than PyTorch's fused backward over 4097-wide rows (6.6e-7 against
                    # a bound of 5.2e-7 with this seed). A property of the naive baseline.
                    marks = pytest.mark.xfail(strict=True, reason="manual fp32 dx beyond 2x torch at D=4097")
                ids = f"{shape_id(shape)}-{dtype_id(dtype)}-{backend}"
                out.append(pytest.param(backend, dtype, shape, marks=marks, id=ids))
    return out


@pytest.mark.parametrize("backend,dtype,shape", _matrix())
def test_forward_and_gradients(backend, dtype, shape):
    seed = seed_for(backend, shape, dtype)
    _assert_fwd_bwd(backend, SPEC.make_inputs(shape, dtype, "cpu", seed), dtype, seed=seed)


@pytest.mark.parametrize("backend", CPU)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_without_bias_and_other_eps(backend, dtype):
    x, w, _ = SPEC.make_inputs((6, 300), dtype, "cpu", 3)
    _assert_fwd_bwd(backend, (x, w, None), dtype, eps=1e-2)
    x.requires_grad_()
    y = ln.layer_norm(x, w, backend=backend)  # defaults: bias None, eps 1e-5
    torch.testing.assert_close(
        y.float(), _torch(x, w, None).float(), rtol=0, atol=4 * torch.finfo(dtype).eps * 4
    )


@pytest.mark.parametrize("backend", CPU)
def test_constant_rows_give_the_bias(backend):
    # variance 0: y = (x - mean) * rsqrt(0 + eps) * w + b = b exactly; gradients finite
    x, w, b = SPEC.make_inputs((4, 257), torch.float32, "cpu", 5)
    x[1] = 0.5
    x[2] = 0.0
    y = ln.layer_norm(x, w, b, backend=backend)
    assert torch.equal(y[1], b) and torch.equal(y[2], b)
    _assert_fwd_bwd(backend, (x, w, b), torch.float32)


def _nearly_constant_rows(device):
    # fp32 rows of nearly equal values: rstd ~ 1/sqrt(eps) = 316 turns half an ulp of a
    # rounded fp32 mean (1.2e-7 at 3.0) into ~4e-5 of error in y. The full check on the H100
    # (seed 725423948, 65537 x 3) failed our fp32 kernels on it until they corrected the mean
    # by the mean of x - mean (corrected two-pass). PyTorch's own kernel misses by ~1e-4 here.
    g = torch.Generator().manual_seed(0)
    x = 3.0 + 1e-4 * torch.randn(4096, 3, generator=g)
    w, b = torch.randn(3, generator=g), torch.randn(3, generator=g)
    return x.to(device), w.to(device), b.to(device)


def _assert_mean_is_corrected(backend, device):
    x, w, b = _nearly_constant_rows(device)
    y = ln.layer_norm(x, w, b, 1e-5, backend=backend)
    ref = ln.layer_norm_reference(x.double(), w.double(), b.double(), 1e-5)
    err = (y.double() - ref).abs().max().item()
    bound = 4 * torch.finfo(torch.float32).eps * ref.abs().max().item()
    assert err <= bound, f"max error {err:.3g} > {bound:.3g}: is the rounded mean corrected?"
    _assert_fwd_bwd(backend, (x, w, b), torch.float32)


@pytest.mark.parametrize("backend", [b for b in CPU if b == "triton"])
def test_fp32_mean_rounding_is_corrected(backend):
    _assert_mean_is_corrected(backend, "cpu")


# triton only: the naive composition (manual) is a baseline, reported apart by the check;
# on some inputs of the 65537 x 3 rows case its fp32 mean/variance miss 2x PyTorch's error
# (3.8e-5 against a bound of 2.7e-5).
@pytest.mark.parametrize("backend", [b for b in CPU if b == "triton"])
def test_check_engine_passes(backend):
    rep = check_impl(
        registry.get(OP, backend), torch.float32, device="cpu", quick=True, opcheck=False, seed=1
    )
    assert rep.status == PASS, [(c.kind, c.name, c.detail) for c in rep.failures]


# Planted mistakes, each caught by some stage of the check.
def _ln(x, w, b, eps, *, unbiased=False, eps_out=False, center=True):
    x32 = x.float()
    mean = x32.mean(-1, keepdim=True) if center else 0.0
    var = x32.var(-1, keepdim=True, unbiased=unbiased) if center else x32.square().mean(-1, keepdim=True)
    r = 1.0 / (torch.sqrt(var) + eps) if eps_out else torch.rsqrt(var + eps)
    y = (x32 - mean) * r * w.float()
    return (y + b.float() if b is not None else y).to(x.dtype)


class _WrongDW(torch.autograd.Function):
    # right forward and dx; dweight = sum(dy) (forgets xhat)
    @staticmethod
    def forward(ctx, x, w, b, eps):
        ctx.save_for_backward(x, w, b)
        ctx.eps = eps
        return _ln(x, w, b, eps)

    @staticmethod
    def backward(ctx, dy):
        x, w, b = ctx.saved_tensors
        with torch.enable_grad():
            xs = x.detach().requires_grad_()
            (dx,) = torch.autograd.grad(_ln(xs, w, b, ctx.eps), xs, dy)
        flat = dy.reshape(-1, dy.shape[-1]).float().sum(0)
        return dx, flat.to(w.dtype), flat.to(w.dtype), None


PLANTED = {
    "ignores_eps": lambda x, w, b, eps=1e-5: _ln(x, w, b, 0.0),  # NaN on constant rows
    "eps_outside_sqrt": lambda x, w, b, eps=1e-5: _ln(x, w, b, eps, eps_out=True),
    "unbiased_variance": lambda x, w, b, eps=1e-5: _ln(x, w, b, eps, unbiased=True),
    "wrong_dweight": lambda x, w, b, eps=1e-5: _WrongDW.apply(x, w, b, eps),
    "ignores_bias": lambda x, w, b, eps=1e-5: _ln(x, w, None, eps),
}


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_planted_mistakes_are_rejected(name):
    rep = check_planted(OP, name, PLANTED[name])
    assert rep.status == FAIL, f"planted {name} passed the check"


def test_bad_inputs_name_the_argument():
    x = torch.randn(3, 8)
    w = torch.ones(8)
    with pytest.raises(ValueError, match="weight"):
        ln.layer_norm(x, torch.ones(7), backend="triton")
    with pytest.raises(ValueError, match="bias"):
        ln.layer_norm(x, w, torch.ones(3, 8), backend="torch")
    with pytest.raises(TypeError, match="bias"):
        ln.layer_norm(x, w, torch.ones(8, dtype=torch.float16), backend="triton")
    with pytest.raises(ValueError, match="eps"):
        ln.layer_norm(x, w, eps=float("nan"), backend="triton")
    with pytest.raises(TypeError, match="eps"):
        ln.layer_norm(x, w, eps=None, backend="manual")
    with pytest.raises(ValueError, match=r"\bx\b"):
        ln.layer_norm(torch.tensor(1.0), torch.ones(1), backend="triton")
    with pytest.raises(TypeError, match=r"\bx\b"):
        ln.layer_norm(x.double(), w.double(), backend="triton")
    # layouts and devices: the norms' validator checks every tensor itself (the spec's
    # generic layout loop is skipped for it)
    for name, args in (("x", (x.to_sparse(), w, w)), ("weight", (x, w.to_sparse(), w)), ("bias", (x, w, w.to_sparse())),
                       ("weight", (x, w.to(device="meta"), w)), ("weight", (x, torch.ones(1, 8), w))):  # fmt: skip
        for backend in ("triton", "torch", "manual"):
            with pytest.raises((TypeError, ValueError), match=rf"\b{name}\b"):
                ln.layer_norm(*args, backend=backend)
        with pytest.raises((TypeError, ValueError), match=rf"\b{name}\b"):
            ln.layer_norm(*args)  # the default


@pytest.mark.parametrize("shape", [(3, 16411), (2, 2, 16392), (1, 16385)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_triton_rows_wider_than_the_register_limit(shape, dtype):
    """Rows past MAX_D take the streamed kernels of wide.py (interpreter here): forward and
    every gradient within the float64 reference's bounds, with and without bias, at widths
    off 16-byte boundaries (every shift class) and on them."""
    from kernellab.ops.norm_kernels import triton_kernels as lt

    assert shape[-1] > lt.MAX_D
    args = SPEC.make_inputs(shape, dtype, "cpu", 5)
    _assert_fwd_bwd("triton", args, dtype, seed=2)
    _assert_fwd_bwd("triton", (args[0], args[1], None), dtype, seed=3)
    # x a view one element off its storage's start; weight and bias strided views
    x, w, b = args
    flat = torch.empty(x.numel() + 1, dtype=dtype)
    flat[1:] = x.reshape(-1)
    ws = torch.stack([w, w], 1)[:, 0]
    bs = torch.stack([b, b], 1)[:, 1]
    assert not ws.is_contiguous() and not bs.is_contiguous()
    _assert_fwd_bwd("triton", (flat[1:].view(x.shape), ws, bs), dtype, seed=4)


@pytest.mark.parametrize("eps", [1e-5, 1e-2])
def test_triton_fp32_narrow_rows_of_close_values_gradients(eps):
    """Rows of 2 nearly equal values (rstd ~14): the saved fp32 mean and rstd's roundings
    shift every xhat, and dweight's sum over 16 rows cancels down to that shift (past the
    bound at 3 of these seeds on the saved statistics). The one-launch backward recomputes
    them in fp64 from the row, with the forward's eps (here also a non-default one)."""
    for seed in (11, 32, 39, 0, 1, 2):
        g = torch.Generator().manual_seed(seed)
        x = 3.0 + 0.1 * torch.randn(16, 2, generator=g)
        w, b = torch.randn(2, generator=g), torch.randn(2, generator=g)
        _assert_fwd_bwd("triton", (x, w, b), torch.float32, eps=eps, seed=seed)


def test_triton_norms_declare_the_limit_they_refuse():
    """add_rms_norm's Triton backend declares the refusal its launcher raises (rows past
    MAX_D), so that the check counts it as a documented limit; layer_norm and rms_norm
    take any width."""
    from kernellab.ops.norm_kernels import triton_kernels as lt

    impl = registry.get("add_rms_norm", "triton")
    assert "wider than" in impl.outside_limits((torch.zeros(1, lt.MAX_D + 1),), {})
    assert impl.outside_limits((torch.zeros(1, lt.MAX_D),), {}) is None
    for op in ("layer_norm", "rms_norm"):
        assert registry.get(op, "triton").outside_limits((torch.zeros(1, 4 * lt.MAX_D + 3),), {}) is None, op


def test_triton_configs():
    from kernellab.ops.norm_kernels import triton_kernels as lt

    assert lt._fwd_config(3) == (4, 64, 4)  # short rows share a program
    assert lt._fwd_config(4096)[:2] == (4096, 1)
    assert lt._bwd_programs(70, 64, torch.device("cpu")) == 4  # 18 rows per program, short last group


def test_triton_short_inputs_run_a_row_per_program():
    from kernellab.ops.norm_kernels import triton_kernels as lt

    # 128 rows of 768 at 4 a program would be 32 programs on 132 SMs: one row each instead
    assert lt._fwd_config(768, n_rows=128, sms=132, elem=4) == (1024, 1, 4)
    assert lt._fwd_config(256, n_rows=64, sms=132, elem=4) == (256, 1, 2)
    assert lt._fwd_config(256, n_rows=64, sms=132, elem=2) == (256, 1, 4)
    # enough rows to fill the SMs (GPT-2's 8192), no SM count (the interpreter), or the knob off
    assert lt._fwd_config(768, n_rows=8192, sms=132, elem=4) == lt._fwd_config(768, elem=4) == (1024, 4, 8)
    assert lt._fwd_config(768, n_rows=128, sms=0, elem=4) == (1024, 4, 8)
    assert lt._fwd_config(768, lt.Config(fwd_min_per_sm=0), n_rows=128, sms=132, elem=4) == (1024, 4, 8)
    # 16-bit rows of 768 four a program take 4 warps; one a program (or fp32) as before
    assert lt._fwd_config(768, n_rows=8192, sms=132) == (1024, 4, 4)
    assert lt._fwd_config(768, n_rows=128, sms=132) == (1024, 1, 4)
    # 16-bit rows of 1025-2048 one a program at 4 warps (the 1-D row kernel); fp32 two a program
    assert lt._fwd_config(2048, n_rows=8192, sms=132) == (2048, 1, 4)
    assert lt._fwd_config(1536, n_rows=8192, sms=132) == (2048, 1, 4)
    assert lt._fwd_config(2048, n_rows=8192, sms=132, elem=4) == (2048, 2, 8)
    # 4096-wide rows: fp32 16 warps past small grids; 16-bit 8 warps, 4 with a residual
    assert lt._fwd_config(4096, n_rows=8192, sms=132, elem=4) == (4096, 1, 16)
    assert lt._fwd_config(4096, n_rows=128, sms=132, elem=4) == (4096, 1, 8)
    assert lt._fwd_config(4096, n_rows=8192, sms=132) == (4096, 1, 8)
    assert lt._fwd_config(4096, n_rows=8192, sms=132, res=True) == (4096, 1, 4)
    assert lt._fwd_config(4096, n_rows=128, sms=132, res=True) == (4096, 1, 4)
    assert lt._fwd_config(4096, n_rows=8192, sms=132, elem=4, res=True) == (4096, 1, 16)
    # the one-launch backward: 16 column strips of 8 warps at 256 columns; 4096-wide rows as before
    assert lt._cols_config(64, 256) == (16, 64, 8)
    assert lt._cols_config(16, 4096) == (256, 4, 16)
    assert lt._cols_config(64, 256, lt.Config(small_warps=2))[2] == 2


@pytest.mark.parametrize("rms,bias,res", [(False, True, False), (True, False, False), (True, False, True)])
@pytest.mark.parametrize("shape,dtype", [((6, 40), torch.float32), ((70, 33), torch.bfloat16),
                                         ((3, 64), torch.float32)])
def test_triton_weight_first_forward_is_the_same_arithmetic(rms, bias, res, shape, dtype):
    """The 2-D forward loading weight and bias before the row (small grids) gives the same
    bits as loading them after the reductions, and both match float64."""
    from kernellab.ops.norm_kernels import triton_kernels as lt

    g = torch.Generator().manual_seed(3)
    x = (torch.randn(shape, generator=g) * 3 + 1).to(dtype)
    w = (1 + 0.3 * torch.randn(shape[-1], generator=g)).to(dtype)
    b = (0.2 * torch.randn(shape[-1], generator=g)).to(dtype) if bias else None
    r = torch.randn(shape, generator=g).to(dtype) if res else None
    outs = []
    for per_sm in (0, 1e9):
        cfg = lt.Config(fwd_w_first_per_sm=per_sm, fwd_row_1d=False)
        plan = lt._fwd_plan(x, rms, bias, res, cfg)
        assert plan.launch.kw["W_FIRST"] is (per_sm > 0)
        h = torch.empty_like(x) if res else None
        outs.append((lt.norm_fwd(x, w, b, 1e-5, rms, res=r, h=h, cfg=cfg), h))
    (y0, m0, s0), h0 = outs[0]
    (y1, m1, s1), h1 = outs[1]
    assert torch.equal(y0, y1) and torch.equal(s0, s1)
    assert (m0 is None) == rms and (rms or torch.equal(m0, m1))
    xin = (x.double() + r.double()).to(dtype).double() if res else x.double()
    if res:
        assert torch.equal(h0, h1) and torch.equal(h1.double(), xin)
    if rms:
        ref = xin * torch.rsqrt(xin.pow(2).mean(-1, keepdim=True) + 1e-5) * w.double()
    else:
        ref = F.layer_norm(xin, shape[-1:], w.double(), b.double() if b is not None else None, 1e-5)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert (y1.double() - ref).abs().max().item() <= tol * max(1.0, ref.abs().max().item())


def test_triton_weight_first_only_on_small_grids():
    from kernellab.ops.norm_kernels import triton_kernels as lt

    cfg = lt.Config(fwd_row_1d=False)
    assert lt._fwd_plan(torch.zeros(1, 64), True, False, False, cfg).launch.kw["W_FIRST"]  # one program
    # off the GPU the rule counts one SM: 4096 rows of 64 are 64 programs of 64 rows
    assert not lt._fwd_plan(torch.zeros(4096, 64), True, False, False, cfg).launch.kw["W_FIRST"]
    off = lt.Config(fwd_w_first_per_sm=0)
    assert not lt._fwd_plan(torch.zeros(1, 64), True, False, False, off).launch.kw["W_FIRST"]


def test_triton_fp32_small_backward_choice():
    from kernellab.ops.norm_kernels import triton_kernels as lt

    def small(n, d, dtype=torch.float32):
        x = torch.zeros(n, d, dtype=dtype)
        return lt._bwd_plan(x, torch.ones(d, dtype=dtype), False, True, False, lt.CONFIG).small

    # fp32 64 x 256 takes the partials path (faster); rows of at most exact_max_block keep
    # the one-launch backward and its exact fp64 statistics at any row count it covers
    assert not small(64, 256) and small(64, 256, torch.bfloat16)
    assert small(300, 40) and small(16, 2048) and small(32, 128)


def test_triton_shifted_rows_config():
    """Rows off 16-byte boundaries from shift_fwd_min_cols / shift_bwd_min_cols columns up
    take the shifted kernels, in row classes that repeat every A / gcd(width, A) rows;
    rows on boundaries, narrow rows and rows whose span passes MAX_D do not. The partial
    sums of fp32 weights: fp64, or at most bwd_max_rows rows a program."""
    import triton.language as tl

    from kernellab.ops.norm_kernels import triton_kernels as lt

    assert lt._shift(4097, 2) == (8192, 8, 8) and lt._shift(4097, 4) == (8192, 4, 4)
    assert lt._shift(4098, 2) == (8192, 8, 4) and lt._shift(4098, 4) == (8192, 4, 2)
    assert lt._shift(4096, 2) is None and lt._shift(5000, 2) is None  # on boundaries
    assert lt._shift(1025, 2) is None  # narrower than shift_bwd_min_cols
    assert lt._shift(1025, 2, fwd=True) == (2048, 8, 8)  # the forward's is lower
    assert lt._shift(lt.MAX_D - 1, 2) is None  # its span needs a 2 * MAX_D block
    assert lt._shift(37, 2, lt.Config(shift_bwd_min_cols=8)) == (64, 8, 8)
    # the shifted forward's programs per SM and warps: fp32 layer norms by width, else 4 x 4
    assert lt._shift_fwd_shape(2048, False, True) == (8, 4) and lt._shift_fwd_shape(8192, False, True) == (4, 8)
    assert lt._shift_fwd_shape(2048, True, True) == lt._shift_fwd_shape(8192, False, False) == (4, 4)
    assert lt._shift_fwd_shape(2048, False, True, lt.Config(shift_fwd_per_sm=2, shift_fwd_warps=16)) == (2, 16)
    # whole classes of programs, every row walked once
    for n_rows, classes, programs in ((4096, 8, 264), (5, 8, 264), (70, 4, 3), (1, 2, 132)):
        progs, per = lt._class_split(n_rows, classes, programs)
        assert progs % classes == 0 and (progs // classes) * per >= -(-n_rows // classes)
        assert (progs // classes - 1) * per < -(-n_rows // classes)
    # fp32 weights: partials summed in fp64 up to 4096-wide blocks, past them few rows each
    cfg = lt.Config(bwd_small_elems=0)
    plan = lt._bwd_plan(torch.zeros(70000, 13), torch.ones(13), False, True, False, cfg)
    assert plan.part_dtype == torch.float64
    # and one Triton launch sums them, in fp64, whatever the weights' dtype
    assert plan.psum.kernel is lt._partials_sum_kernel and plan.psum.kw["ACC"] == tl.float64
    plan = lt._bwd_plan(torch.zeros(300, 5000), torch.ones(5000), False, True, False, cfg)
    assert plan.part_dtype == torch.float32 and plan.rows_per_program <= lt.CONFIG.bwd_max_rows
    assert plan.programs * plan.rows_per_program >= 300
    w16 = torch.ones(13, dtype=torch.bfloat16)
    plan = lt._bwd_plan(torch.zeros(70000, 13, dtype=torch.bfloat16), w16, False, True, False, cfg)
    assert plan.part_dtype == torch.float32 and plan.psum.kw["ACC"] == tl.float32


def _norm64(x, w, b, rms, eps=1e-5):
    if rms:
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w
    return F.layer_norm(x, (x.shape[-1],), w, b, eps)


@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_triton_shifted_rows_forward_and_gradients(rms, dtype):
    """The shifted kernels (their least widths lowered so that the interpreter reaches them)
    against float64 at widths whose rows start at every shift: fewer rows than classes,
    a tensor whose end is not on a 16-byte boundary (its last row read apart), and a view
    one element into a buffer (its base off a boundary). y, mean and rstd, dx, dweight
    and dbias judged with torch's own as the peer."""
    from kernellab.ops.norm_kernels import triton_kernels as lt

    cfg = lt.Config(shift_fwd_min_cols=8, shift_bwd_min_cols=8, bwd_small_elems=0)
    for rows, cols, off in ((13, 101, 0), (3, 37, 0), (9, 66, 0), (6, 45, 1)):
        g = torch.Generator().manual_seed(rows * cols + off)
        buf = (torch.randn(rows * cols + off, generator=g) * 2 + 1).to(dtype)
        x = buf[off:].view(rows, cols)
        w = (1 + 0.2 * torch.randn(cols, generator=g)).to(dtype)
        b = None if rms else (0.1 * torch.randn(cols, generator=g)).to(dtype)
        dy = torch.randn(rows, cols, generator=g).to(dtype)
        es = x.element_size()
        assert lt._shift(cols, es, cfg) is not None and lt._shift(cols, es, cfg, fwd=True) is not None
        y, mean, rstd = lt.norm_fwd(x, w, b, 1e-5, rms, cfg=cfg)
        dx, dw, db = lt.norm_bwd(dy, x, w, mean, rstd, rms, not rms, cfg=cfg)
        leaves = [t.double().requires_grad_(True) if t is not None else None for t in (x, w, b)]
        want = _norm64(*leaves, rms)
        want.backward(dy.double())
        peer_leaves = [t.clone().requires_grad_(True) if t is not None else None for t in (x, w, b)]
        if rms:
            peer = F.rms_norm(peer_leaves[0], (cols,), peer_leaves[1], 1e-5)
        else:
            peer = F.layer_norm(peer_leaves[0], (cols,), peer_leaves[1], peer_leaves[2], 1e-5)
        peer.backward(dy)
        xd = x.double()
        var = (xd * xd).mean(-1) if rms else xd.var(-1, unbiased=False)
        torch.testing.assert_close(rstd.double(), (var + 1e-5).rsqrt(), rtol=1e-5, atol=0)
        if not rms:
            torch.testing.assert_close(mean.double(), xd.mean(-1), rtol=0, atol=1e-6)
        checks = [("y", y, want, peer), ("dx", dx, leaves[0].grad, peer_leaves[0].grad),
                  ("dweight", dw, leaves[1].grad, peer_leaves[1].grad)]  # fmt: skip
        if not rms:
            checks.append(("dbias", db, leaves[2].grad, peer_leaves[2].grad))
        for name, got, ref, tor in checks:
            v = judge(got, ref.detach(), dtype, tor.detach())
            assert v.ok, (rows, cols, off, name, v.detail)


def test_triton_shifted_fp32_rows_far_from_zero():
    """fp32 rows of nearly equal values far from zero: rstd and y from the shifted forward
    (its mean of x - x[0]) stay at float64's to fp32 rounding, the ends of a row (its
    elements before and after its 16-byte interior) included."""
    from kernellab.ops.norm_kernels import triton_kernels as lt

    cfg = lt.Config(shift_fwd_min_cols=8)
    g = torch.Generator().manual_seed(5)
    for rows, cols in ((7, 37), (5, 45)):
        x = 3e4 + 0.01 * torch.randn(rows, cols, generator=g)
        w, b = torch.ones(cols), torch.zeros(cols)
        assert lt._shift(cols, 4, cfg, fwd=True) is not None
        y, mean, rstd = lt.norm_fwd(x, w, b, 1e-12, False, cfg=cfg)
        xd = x.double()
        want_rstd = (xd.var(-1, unbiased=False) + 1e-12).rsqrt()
        torch.testing.assert_close(rstd.double(), want_rstd, rtol=2e-4, atol=0)
        want = (xd - xd.mean(-1, keepdim=True)) * want_rstd[:, None]
        assert (y.double() - want).abs().max().item() < 2e-3


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_triton_shifted_rows_ptx_is_16_bytes_wide(dtype):
    """Compiled for sm_90 (no GPU needed): the shifted kernels read a row 16 bytes at a
    time and write its interior 16 bytes at a time; one element at a time are only the
    weight and bias (once per program), the tensor's last partial chunk, the ends, an fp32
    row's first element (the forward's mean of x - x[0]), and the backward's partial sums
    (once per program). Both also compile for one row (n_rows the constant 1, as Triton
    specializes it)."""
    from kltest import sm90_global_accesses

    a = 16 // (4 if dtype == "fp32" else 2)
    base = "kernellab.ops.norm_kernels.triton_kernels."
    fwd = dict.fromkeys(("x_ptr", "w_ptr", "b_ptr", "r_ptr", "h_ptr", "y_ptr"), f"*{dtype}")
    fwd.update(mean_ptr="*fp32", rstd_ptr="*fp32", n_rows="i32", n_cols="i32", eps="fp32", per="i32")
    fcx = dict(BLOCK=8192, A=a, C=a, RMS=False, HAS_BIAS=True, CORR=dtype == "fp32")
    bwd = dict.fromkeys(("dy_ptr", "x_ptr", "w_ptr", "dx_ptr", "dres_ptr"), f"*{dtype}")
    bwd.update(mean_ptr="*fp32", rstd_ptr="*fp32", dw_part_ptr="*fp32", db_part_ptr="*fp32",
               n_rows="i32", n_cols="i32", per="i32")  # fmt: skip
    bcx = dict(BLOCK=8192, A=a, C=a, RMS=False, ACC={"tl": "float32"})
    specs = []
    for kernel, sig, cx in (("_norm_fwd_shift_kernel", fwd, fcx), ("_norm_bwd_shift_kernel", bwd, bcx)):
        sig = dict(sig, **dict.fromkeys(cx, "constexpr"))
        ptrs = [n for n in sig if n.endswith("_ptr")]
        for one_row in (False, True):  # also a one-row launch (Triton's constant 1)
            spec = dict(kernel=base + kernel, signature=dict(sig), constexprs=dict(cx),
                        options={"num_warps": 8}, aligned_args=ptrs)  # fmt: skip
            if one_row:
                spec["signature"]["n_rows"] = "constexpr"
                spec["constexprs"]["n_rows"] = 1
            specs.append(spec)
    counts = []
    for ld, st in sm90_global_accesses(specs)[::2]:
        counts.append((len(ld), sum(".v4" in i for i in ld), len(st), sum(".v4" in i for i in st)))
    (fn, fw, fs, fws), (bn, bw, bs, bws) = counts
    per_thread = 8192 // 256  # a BLOCK-wide vector over 8 warps
    vec = per_thread * (4 if dtype == "fp32" else 2) // 16  # its 16-byte pieces per thread
    # forward: x 16 bytes at a time (the first row, then the next in the loop); y's interior
    assert fw == 2 * vec and fws == vec
    # one element at a time: w and b once, the last partial chunk, the ends (w and b once,
    # x for the first row and in the loop; fp32: each row's first x, likewise); stored so:
    # the ends, mean and rstd
    assert fn - fw == 3 * per_thread + 8 + (2 if dtype == "fp32" else 0) and fs - fws == 4
    # backward: x and dy 16 bytes at a time, twice each; dx's interior
    assert bw == 4 * vec and bws == vec
    # w once, x and dy's last partial chunk, the ends (w once, x and dy for the first row
    # and in the loop), the stats (likewise); the dweight and dbias partials once
    assert bn - bw == 3 * per_thread + 2 + 8 + 4 and bs - bws == 2 * per_thread + 2


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_triton_wide_rows_ptx_is_16_bytes_wide(dtype):
    """Compiled for sm_90 (no GPU needed): the kernels of rows wider than MAX_D (wide.py)
    that stream a strip over many rows, the forward's output and the backward's dx, load
    x (and dy) and the shifted weight (and bias) 16 bytes at a time and store the row's
    interior 16 bytes at a time (the copies' row L a multiple of 16 elements, as the
    launchers make it)."""
    from kltest import sm90_global_accesses

    a = 16 // (4 if dtype == "fp32" else 2)
    base = "kernellab.ops.norm_kernels.wide."
    stats = dict(mean_ptr="*fp32", rstd_ptr="*fp32", n_rows="i32", n="i32", L="i32", G="i32")
    out = dict(dict.fromkeys(("x_ptr", "ws_ptr", "bs_ptr", "y_ptr"), f"*{dtype}"), **stats)
    ocx = dict(STRIP=4096, A=a, C=a, RMS=False, HAS_BIAS=True)
    dx = dict(dict.fromkeys(("dy_ptr", "x_ptr", "ws_ptr", "dx_ptr"), f"*{dtype}"), **stats)
    dx.update(c1_ptr="*fp32", c2_ptr="*fp32", dwp_ptr="*fp32", dbp_ptr="*fp32")
    dcx = dict(STRIP=4096, A=a, C=a, RMS=False, HAS_DB=True, ACC={"tl": "float32"})
    specs = []
    for kernel, sig, cx in (("_out_kernel", out, ocx), ("_dx_kernel", dx, dcx)):
        sig = dict(sig, **dict.fromkeys(cx, "constexpr"))
        aligned = [n for n in sig if n.endswith("_ptr")] + ["L"]
        specs.append(dict(kernel=base + kernel, signature=sig, constexprs=dict(cx), options={"num_warps": 8},
                          aligned_args=aligned))  # fmt: skip
    (old, ost), (bld, bst) = sm90_global_accesses(specs)
    vec = 4096 // 256 * (4 if dtype == "fp32" else 2) // 16  # 16-byte pieces of a strip per thread
    # output: w, b once and x per row, 16 bytes wide; y's interior likewise
    assert sum(".v4" in i for i in old) >= 3 * vec and sum(".v4" in i for i in ost) >= vec
    # dx: w once, x and dy per row; dx's interior; the fp32 partials (once)
    assert sum(".v4" in i for i in bld) >= 3 * vec and sum(".v4" in i for i in bst) >= 2 * vec


@pytest.mark.parametrize("rms", [False, True])
@pytest.mark.parametrize("width", [4096, 5000])
def test_triton_one_row_forward(rms, width):
    """16-bit rows of 4096 columns and more take the 1-D row kernel (weight first,
    approximate rsqrt), masked when the width is not a power of two; fp32 keeps the 2-D
    kernel. Checked against float64, mean and rstd included."""
    from kernellab.ops.norm_kernels import triton_kernels as lt

    g = torch.Generator().manual_seed(width + rms)
    x = (torch.randn(3, width, generator=g) * 2 + 1).to(torch.bfloat16)
    # the launches compared below: the 1-D row kernel by default, the 2-D one with
    # fwd_row_1d off and for fp32 rows
    launches = ((x, lt.CONFIG), (x, lt.Config(fwd_row_1d=False)), (x.float(), lt.CONFIG))
    kernels = [lt._fwd_plan(t, rms, not rms, False, c).launch.kernel for t, c in launches]
    assert kernels == [lt._norm_fwd_row_kernel, lt._norm_fwd_kernel, lt._norm_fwd_kernel]
    w = (1 + 0.1 * torch.randn(width, generator=g)).to(torch.bfloat16)
    b = None if rms else (0.1 * torch.randn(width, generator=g)).to(torch.bfloat16)
    y, mean, rstd = lt.norm_fwd(x, w, b, 1e-5, rms)
    xd = x.double()
    mu = torch.zeros(3, 1, dtype=torch.float64) if rms else xd.mean(-1, keepdim=True)
    var = (xd * xd).mean(-1, keepdim=True) if rms else xd.var(-1, unbiased=False, keepdim=True)
    r = (var + 1e-5).rsqrt()
    want = (xd - mu) * r * w.double() + (0 if rms else b.double())
    torch.testing.assert_close(rstd.double(), r[:, 0], rtol=1e-6, atol=0)
    if not rms:
        torch.testing.assert_close(mean.double(), mu[:, 0], rtol=0, atol=1e-6)
    # no worse than twice the 2-D kernel's error (exact sqrt, weight after the row)
    y2 = lt.norm_fwd(x, w, b, 1e-5, rms, cfg=lt.Config(fwd_row_1d=False))[0]
    err, err2 = (y.double() - want).abs().max(), (y2.double() - want).abs().max()
    assert 0 < err <= 2 * err2, (err, err2)


def test_custom_ops_opcheck():
    opcheck_custom_ops(registry.get(OP, "triton").custom_ops, SPEC, (4, 33))


def test_under_torch_compile_fullgraph():
    x, w, b = SPEC.make_inputs((5, 40), torch.float32, "cpu", 4)
    compile_grads_match(lambda x, w, b: ln.layer_norm(x, w, b, backend="triton"), _torch, (x, w, b))


def test_compile_backend_quick():
    x, w, b = SPEC.make_inputs((4, 100), torch.float32, "cpu", 6)
    torch.testing.assert_close(ln.layer_norm(x, w, b, backend="compile"), _torch(x, w, b))


# norms.cu compiling for sm_80 and sm_90: tests/test_cuda_runtime.py compiles every .cu
# of the package (30 s for this one on the CPU machine; not repeated here).


def test_cuda_v2_shapes():
    from kernellab.ops.norm_kernels.cuda_kernels import _v2_shape

    assert _v2_shape(512, 4) == (128, 4)  # 4096 bf16 forward
    assert _v2_shape(512, 2) == (256, 2)  # ... backward
    assert _v2_shape(3, 4) == (32, 1)
    assert _v2_shape(2048, 2) == (256, 8) and _v2_shape(2049, 2) is None


# --------------------------------------------------------------------------- GPU

GPU_SHAPES = [(1,), (3, 123), (70000, 3), (17, 1025), (256, 4096), (64, 8192), (8, 16384), (3, 20000),
              (65, 50257), (9, 32768)]  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("backend", cuda_backends(OP))
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_gpu_forward_and_gradients(backend, dtype, request):
    impl = registry.get(OP, backend)
    if impl.why_unavailable("cuda"):
        pytest.skip(impl.why_unavailable("cuda"))
    if backend == "manual" and dtype == torch.float32:
        # Found by this test on an H100: the naive composition's fp32 forward at (70000, 3)
        # lands at 1.81e-5 against a bound of 1.45e-5 (2x PyTorch's fused kernel). A
        # property of the baseline, as on the CPU at D=4097 (see _matrix).
        request.applymarker(
            pytest.mark.xfail(strict=True, reason="manual fp32 forward beyond 2x torch on the GPU")
        )
    if backend == "liger" and dtype == torch.float32:
        # The peer's kernel, found by this test on an H100: dx of a one-element row is
        # 4.5e-6 instead of exactly 0 (w * dy contracted into an fma on one side of
        # g - mean(g)); ours round g once for that reason (norms.cu, triton.py).
        request.applymarker(
            pytest.mark.xfail(strict=True, reason="liger fp32: dx of a one-element row is not 0")
        )
    for shape in GPU_SHAPES:
        args = SPEC.make_inputs(shape, dtype, "cuda", seed_for(backend, shape))
        _assert_fwd_bwd(backend, args, dtype, seed=1)
    x, w, _ = SPEC.make_inputs((33, 4096), dtype, "cuda", 2)
    _assert_fwd_bwd(backend, (x, w, None), dtype, eps=1e-2)
    flat = torch.randn(33 * 4096 + 1, device="cuda").to(dtype)
    _assert_fwd_bwd(backend, (flat[1:].view(33, 4096), w, w.clone()), dtype)  # misaligned rows


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "cuda_v1", "triton"])
def test_gpu_fp32_mean_rounding_is_corrected(backend):
    _assert_mean_is_corrected(backend, "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "cuda_v1", "triton"])
def test_gpu_check_engine(backend):
    for dtype in DTYPES:
        rep = check_impl(registry.get(OP, backend), dtype, device="cuda", quick=True)
        assert rep.status == PASS, [(c.kind, c.name, c.detail) for c in rep.failures]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(5, 768), (3, 37), (2, 4096), (6, 5000)])
def test_triton_residual_add_fused_is_bitwise_add_then_norm(dtype, shape):
    """add_forward_saving / add_backward_from (the GPT blocks' residual + norm in one
    kernel each way, 2-D and 1-D row kernels) give bitwise what add, then layer_norm, and
    in the backward layer_norm's dx, then an add of the residual gradient give."""
    from kernellab.ops.layer_norm import triton as lt

    gen = torch.Generator().manual_seed(1)
    x, r, dy, dres = (torch.randn(*shape, generator=gen).to(dtype) for _ in range(4))
    w, b = (torch.randn(shape[-1], generator=gen).to(dtype) for _ in range(2))
    y, h, s = lt.add_forward_saving(x, r, w, b, 1e-5)
    h_ref = kernellab.add(x, r, backend="triton")
    y_ref, s_ref = lt.layer_norm_triton.forward_saving(h_ref, w, b, 1e-5)
    assert torch.equal(h, h_ref) and torch.equal(y, y_ref)
    dx, dw, db = lt.add_backward_from(s, dy, dres)
    dx_ref, dw_ref, db_ref, _ = lt.layer_norm_triton.backward_from(s_ref, dy)
    assert torch.equal(dx, kernellab.add(dres, dx_ref, backend="triton"))
    assert torch.equal(dw, dw_ref) and torch.equal(db, db_ref)
    # and against float64 PyTorch: the fused pair is the math it claims
    x64 = (x.double() + r.double()).requires_grad_()
    y64 = torch.nn.functional.layer_norm(x64, shape[-1:], w.double(), b.double(), 1e-5)
    y64.backward(dy.double())
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(y.double(), y64.detach(), rtol=tol, atol=tol)
    torch.testing.assert_close(dx.double(), x64.grad + dres.double(), rtol=tol, atol=tol)


def test_triton_residual_add_refuses_mismatched_residual():
    from kernellab.ops.layer_norm import triton as lt

    x, w, b = torch.randn(4, 8), torch.ones(8), torch.zeros(8)
    with pytest.raises(ValueError, match="r: expected a contiguous tensor of x's shape"):
        lt.add_forward_saving(x, torch.randn(4, 9), w, b)
    with pytest.raises(ValueError, match="r: .*non-contiguous"):
        lt.add_forward_saving(x, torch.randn(8, 4).t(), w, b)
    with pytest.raises(ValueError, match="r: expected .*dtype"):
        lt.add_forward_saving(x, torch.randn(4, 8, dtype=torch.float64), w, b)
    _, _, s = lt.add_forward_saving(x, torch.randn(4, 8), w, b)
    with pytest.raises(ValueError, match="dres"):
        lt.add_backward_from(s, torch.randn(4, 8), torch.randn(4, 7))


def _add_ln_ref(x, r, w, b):
    h = x + r
    return torch.nn.functional.layer_norm(h, h.shape[-1:], w, b, 1e-5), h


@pytest.mark.parametrize("use", ["both", "y", "h"])
def test_triton_add_layer_norm_op_gradients_of_both_outputs(use):
    """The residual add + layer norm as one op with two differentiable outputs (the kit's
    ``outputs=2``): (y, h); every input's gradient through either or both, against PyTorch
    in float64 (an output nobody differentiates reaches the backward as None or zeros)."""
    from kernellab.ops.layer_norm import triton as lt

    gen = torch.Generator().manual_seed(2)
    x, r, gy, gh = (torch.randn(6, 37, generator=gen) for _ in range(4))
    w, b = torch.randn(37, generator=gen), torch.randn(37, generator=gen)
    ours = [t.clone().requires_grad_() for t in (x, r, w, b)]
    ref = [t.double().requires_grad_() for t in (x, r, w, b)]
    y, h = lt.add_layer_norm_triton(*ours, 1e-5)
    y64, h64 = _add_ln_ref(*ref)
    torch.testing.assert_close(y.double(), y64.detach(), rtol=1e-5, atol=1e-5)
    assert torch.equal(h, x + r)

    def loss(y, h):
        return {"both": (y * gy.to(y.dtype)).sum() + (h * gh.to(h.dtype)).sum(),
                "y": (y * gy.to(y.dtype)).sum(), "h": (h * gh.to(h.dtype)).sum()}[use]  # fmt: skip

    loss(y, h).backward()
    loss(y64, h64).backward()
    for a, e in zip(ours, ref):  # (with h alone, w and b are not in PyTorch's graph: None)
        want = e.grad if e.grad is not None else torch.zeros_like(e)
        torch.testing.assert_close(a.grad.double(), want, rtol=1e-4, atol=1e-5)


def test_triton_add_layer_norm_opcheck_and_compile_fullgraph():
    from kernellab.ops.layer_norm import triton as lt

    fn = lt.add_layer_norm_triton
    assert len(fn.custom_ops) == 2
    opcheck_custom_ops(fn.custom_ops, SPEC, (4, 33))
    gen = torch.Generator().manual_seed(0)
    x, w, b = SPEC.make_inputs((5, 40), torch.float32, "cpu", 4)
    r = torch.randn(5, 40, generator=gen)
    f = torch.compile(lambda x, r, w, b: [t * 2 for t in fn(x, r, w, b, 1e-5)], fullgraph=True, backend="aot_eager")
    leaves = [t.clone().requires_grad_() for t in (x, r, w, b)]
    y, h = f(*leaves)
    (y.sum() + (h * h).sum()).backward()
    ref = [t.clone().requires_grad_() for t in (x, r, w, b)]
    y2, h2 = _add_ln_ref(*ref)
    (2 * y2.sum() + (2 * h2 * 2 * h2).sum()).backward()
    for a, e in zip(leaves, ref):
        torch.testing.assert_close(a.grad, e.grad, rtol=1e-4, atol=1e-5)


def test_triton_launch_knobs_are_a_config_not_module_state(monkeypatch):
    """The Triton norms' knobs travel as a frozen Config passed to the launchers (the
    process-wide default, CONFIG, is never mutated): the backward's program count per SM,
    the forward's warps, the partial sum's tile."""
    import dataclasses

    from kernellab.ops.norm_kernels import triton_kernels as lt

    with pytest.raises(dataclasses.FrozenInstanceError):
        lt.CONFIG.bwd_programs_per_sm = 4
    monkeypatch.setattr(lt.triton_support, "sm_count", lambda index=None: 132)
    gpu = torch.device("cuda", 0)  # the GPU branch's arithmetic; nothing is allocated there
    # by row width and element size: 8192 / BLOCK programs per SM below rows of 4096 (at
    # most 8; fp32 rows of 1024: 4); from 4096, fp32 one per SM with 16 warps, 16-bit 2
    # with 4 warps, then 1 with 8
    blocks = (256, 1024, 2048, 4096, 8192)
    assert [lt._bwd_programs(16384, blk, gpu) for blk in blocks] == [8 * 132, 8 * 132, 4 * 132, 2 * 132, 132]
    assert [lt._bwd_warps(blk) for blk in blocks] == [4, 8, 4, 4, 8]
    fp32 = [lt._bwd_programs(16384, blk, gpu, elem=4) for blk in blocks]
    assert fp32 == [8 * 132, 4 * 132, 4 * 132, 132, 132]
    assert [lt._bwd_warps(blk, elem=4) for blk in blocks] == [4, 8, 4, 16, 16]
    assert lt._bwd_programs(16384, 4096, gpu, lt.Config(bwd_programs_per_sm=4)) == 4 * 132
    assert lt._bwd_programs(100, 4096, gpu, lt.Config(bwd_programs_per_sm=4)) == 100
    assert lt._fwd_config(768, lt.Config(fwd_warps=16))[2] == 16
    assert lt._bwd_warps(1024, lt.Config(bwd_warps=8)) == 8
    assert lt._psum_config(264, 768) == (512, 8)
    assert lt._psum_config(264, 768, lt.Config(psum_elems=8192)) == (512, 16)
    assert lt._psum_config(264, 768, acc_bytes=8) == (512, 8)  # fp64 sums: up to 512 partials a step
    assert lt._psum_config(1056, 768, acc_bytes=8) == (512, 8)
    # a config reaches the kernels: the partials backward (_norm_bwd_kernel, not the one-launch
    # one these few elements would take) with and without the next row prefetched, both
    # norms, against the float64 reference
    for dtype, rms in ((torch.float32, False), (torch.bfloat16, True), (torch.float32, True)):
        x, w, b = SPEC.make_inputs((37, 40), dtype, "cpu", 4)
        dy = torch.randn(37, 40, generator=torch.Generator().manual_seed(1)).to(dtype)
        _, mean, rstd = lt.norm_fwd(x, w, b, 1e-5, rms)
        outs = []
        for prefetch in (True, False):
            cfg = lt.Config(bwd_small_elems=0, bwd_prefetch=prefetch)
            plan = lt._bwd_plan(x, w, rms, not rms, False, cfg)
            assert not plan.small and plan.launch.kernel is lt._norm_bwd_kernel
            assert plan.launch.kw["PREFETCH"] is prefetch and plan.rows_per_program > 1
            outs.append(lt.norm_bwd(dy, x, w, mean, rstd, rms, not rms, cfg=cfg))
        for g, r in zip(*outs):
            assert (g is None and r is None) or torch.equal(g, r)  # same order of sums: same bits
        x64, w64, dy64 = x.double().requires_grad_(), w.double().requires_grad_(), dy.double()
        y64 = (x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-5) * w64 if rms
               else torch.nn.functional.layer_norm(x64, (40,), w64, b.double(), 1e-5))  # fmt: skip
        dx64, dw64 = torch.autograd.grad(y64, (x64, w64), dy64)
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(outs[1][0].double(), dx64, rtol=tol, atol=tol)
        torch.testing.assert_close(outs[1][1].double(), dw64, rtol=tol, atol=tol)


def test_norm_forward_with_64_bit_offsets():
    # WIDE (2^31 elements or more) takes int64 offsets: forced on small inputs (fwd_narrow
    # off), both forward kernels (several rows a program; one 16-bit row a program) give
    # the 32-bit launch's bits, with and without a residual
    from kernellab.ops.norm_kernels import triton_kernels as lt

    wide_cfg = lt.Config(fwd_narrow=False)
    kernels = set()
    for dtype in (torch.float32, torch.bfloat16):
        for shape in ((5, 40), (3, 2048)):
            x, w, b = SPEC.make_inputs(shape, dtype, "cpu", 2)
            res = torch.randn(shape, generator=torch.Generator().manual_seed(3)).to(dtype)
            for rms, r in ((False, None), (True, None), (True, res)):
                plan = lt._fwd_plan(x, rms, not rms, r is not None, wide_cfg)
                assert plan.launch.kw["WIDE"] is True
                kernels.add(plan.launch.kernel)
                narrow = lt.norm_fwd(x, w, None if rms else b, 1e-5, rms, r)
                wide = lt.norm_fwd(x, w, None if rms else b, 1e-5, rms, r, cfg=wide_cfg)
                for a, c in zip(wide, narrow):
                    assert (a is None and c is None) or torch.equal(a, c)
    assert kernels == {lt._norm_fwd_kernel, lt._norm_fwd_row_kernel}


@pytest.fixture
def python_node():
    """The norms' Python autograd node, whether or not the C++ nodes are built."""
    with kernellab.config.override(cpp_nodes="off"):
        yield


@pytest.mark.gpu
@pytest.mark.parametrize("rms", [False, True])
# 2-D forward and the one-launch backward; the bf16 one-row forward; the partials backward
@pytest.mark.parametrize("shape", [(64, 256), (3, 4096), (1024, 768)])
def test_gpu_triton_launch_plans_go_direct_and_fall_back_when_misaligned(rms, shape, python_node):
    """After the first call at a shape, the Triton norms launch through the plan's bound
    compiled launchers (triton_support.Bound); a misaligned x at the same shape (a view 2
    bytes into its storage) must take Triton's own path, with the same results. (The
    Python node's path: with the C++ nodes built, eager calls take triton_node.py's.)"""
    from kernellab.ops.norm_kernels import triton_kernels as nt

    dt = torch.bfloat16
    op = "rms_norm" if rms else "layer_norm"
    n = shape[0] * shape[1]
    flat = torch.randn(n + 8, device="cuda").to(dt)
    w = (1 + 0.1 * torch.randn(shape[-1], device="cuda")).to(dt).requires_grad_()
    extra = () if rms else ((0.1 * torch.randn(shape[-1], device="cuda")).to(dt).requires_grad_(),)
    dy = torch.randn(shape, device="cuda").to(dt)

    def run(x):
        leaf = x.detach().requires_grad_()
        y = getattr(kernellab, op)(leaf, w, *extra, backend="triton")
        return (y, *torch.autograd.grad(y, (leaf, w, *extra), dy))

    aligned = flat[:n].view(shape)
    first = run(aligned)
    again = run(aligned)  # plans and bound launchers in place
    size, dev = torch.Size(shape), aligned.device
    fwd = nt._PLANS[("f", size, dt, dev, rms, rms, True, None)]  # (bias None for rms_norm)
    bwd = nt._PLANS[("b", size, dt, dt, dev, rms, not rms, True, None)]
    assert bwd.small == (n <= nt.CONFIG.bwd_small_elems) and (bwd.psum is None) == bwd.small
    for b in (fwd.launch, bwd.launch) + ((bwd.psum,) if bwd.psum is not None else ()):
        assert b.hit is not None, "the plan's launches did not go direct"
    for a, b in zip(first, again):
        assert torch.equal(a, b)
    mis = flat[1 : n + 1].view(shape)  # 2 bytes off
    assert mis.data_ptr() % 16
    got = run(mis)
    ref = run(mis.clone())  # the same values, aligned
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=0, atol=0) if a.dim() == 1 else torch.testing.assert_close(a, b)
