"""softmax: every backend that runs here x odd rows x dtypes, forward and gradient against
the float64 reference; dim handling; fully masked rows; the streamed (online) long rows."""

from __future__ import annotations

import dataclasses
import zlib

import pytest
import torch

import kernellab
from kernellab.harness.compare import judge
from kltest import DTYPES, dtype_id, shape_id, sm90_global_accesses

SPEC = kernellab.get_spec("softmax")
CPU_BACKENDS = [
    i.backend
    for i in kernellab.impls("softmax")
    if i.why_unavailable("cpu") is None and i.backend != "compile"
]
SHAPES = [(1,), (41,), (3, 123), (5, 1025), (2, 3, 257), (300, 3), (2, 9000)]


def _recorded_launches(monkeypatch, st, name):
    """The constexprs and options (a dict per launch) that _launch passes to st.<name>, as
    kernel[grid](..., **kw): what ran, not what a helper says would."""
    launched = []
    kernel = getattr(st, name)

    class Recorded:
        def __getitem__(self, grid):
            return lambda *args, **kw: (launched.append(dict(kw, grid=grid)), kernel[grid](*args, **kw))[1]

    monkeypatch.setattr(st, name, Recorded())
    return launched


def _inputs(shape, dtype, seed):
    return SPEC.make_inputs(shape, dtype, "cpu", seed)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_forward_and_gradient(backend, dtype, shape):
    # A stable seed per case (hash() of a str changes with each process): the same inputs
    # and upstream gradient in every run, so CI cannot draw a different case than here.
    seed = zlib.crc32(f"{backend}{shape}".encode()) & 0xFFFF
    (x,) = _inputs(shape, dtype, seed=seed)
    y = kernellab.softmax(x, backend=backend)
    v = judge(y, SPEC.ref(x), dtype, torch.softmax(x, -1))
    assert v.ok, v.detail
    # gradient
    leaf = x.detach().clone().requires_grad_()
    dy = torch.randn(shape, generator=torch.Generator().manual_seed(seed + 1)).to(dtype)
    (g,) = torch.autograd.grad(kernellab.softmax(leaf, backend=backend), leaf, dy)
    x64 = x.detach().double().requires_grad_()
    (g_ref,) = torch.autograd.grad(torch.softmax(x64, -1), x64, dy.double())
    t = x.detach().clone().requires_grad_()
    (g_torch,) = torch.autograd.grad(torch.softmax(t, -1), t, dy)
    v = judge(g, g_ref, dtype, g_torch)
    assert v.ok, v.detail


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_dim_argument(backend):
    x = torch.randn(6, 7, 5)
    for dim in (0, 1, 2, -1, -2, -3):
        y = kernellab.softmax(x, dim, backend=backend)
        torch.testing.assert_close(y, torch.softmax(x, dim), rtol=1e-5, atol=1e-6)
    for bad in (3, -4, 1.0, None):
        with pytest.raises(ValueError, match="dim"):
            kernellab.softmax(x, bad, backend=backend)
    with pytest.raises(ValueError, match="x must have at least one dimension"):
        kernellab.softmax(torch.tensor(1.0), backend=backend)
    with pytest.raises(TypeError, match=r"\bx\b"):
        kernellab.softmax([1.0, 2.0], backend=backend)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("width", [7, 20000])
def test_fully_masked_rows_match_torch(backend, width):
    x = torch.randn(3, width)
    x[1] = float("-inf")  # fully masked: torch gives NaN for the whole row
    x[2, :3] = float("-inf")  # partly masked: zeros there
    y = kernellab.softmax(x, backend=backend)
    ref = torch.softmax(x, -1)
    assert torch.equal(torch.isnan(y), torch.isnan(ref))
    assert torch.isnan(y[1]).all() and (y[2, :3] == 0).all()
    torch.testing.assert_close(y[[0, 2]], ref[[0, 2]], rtol=1e-5, atol=1e-6)


def test_long_rows_take_the_streaming_path():
    from kernellab.ops.softmax import triton as st

    assert st._config(8192)[2] is True and st._config(8193)[2] is True  # fp32: whole up to 32768
    assert st._config(32768)[2] is True and st._config(32769)[2] is False
    # a warp per 1024 columns
    assert st._config(20000)[1:] == (1, True, 32) and st._config(12000)[1:] == (1, True, 16)
    assert st._config(1025)[1:] == (1, True, 8) and st._config(1025, fwd=True)[1:] == (1, True, 4)
    # 16-bit: the backward holds them whole, the forward streams them
    assert st._config(20000, element_size=2)[2] is True
    assert st._config(20000, element_size=2, fwd=True)[2] is False
    assert st._config(3)[1] == 64  # short rows share a program
    assert st._config(197)[:2] == (256, 4) and st._config(197)[3] == 2  # ~1024 elements, 2 warps
    # too few rows to fill the SMs at several a program: one row each
    assert st._config(1024, n_rows=128, sms=132) == (1024, 1, True, 8)
    assert st._config(1024, fwd=True, n_rows=128, sms=132) == (1024, 1, True, 4)
    assert st._config(1024, element_size=2, n_rows=128, sms=132)[3] == 4
    assert st._config(256, n_rows=64, sms=132) == (256, 1, True, 1)
    # the fp32 backward's rows of 513-1024: one a program, 8 warps, however many rows
    assert st._config(1024, n_rows=4096, sms=132) == st._config(1024) == (1024, 1, True, 8)
    assert st._config(1024, element_size=2, n_rows=4096, sms=132) == (1024, 4, True, 8)
    # their forward: 4 warps, 32 bytes of a row a thread (fp32 one row a program, 16-bit two)
    assert st._config(1024, fwd=True, n_rows=4096, sms=132) == (1024, 1, True, 4)
    assert st._config(1000, element_size=2, fwd=True, n_rows=4096, sms=132) == (1024, 2, True, 4)
    # the fp32 backward's dot: summed in fp64, but Dot2 pairs in whole rows past max_single
    assert st._comp(torch.bfloat16, True, 1024) == 0
    assert st._comp(torch.float32, True, 8192) == 2 and st._comp(torch.float32, False, 8192) == 2
    assert st._comp(torch.float32, True, 16384) == 1 and st._comp(torch.float32, True, 32768) == 1
    # an fp32 backward of 8192-wide blocks: 32 warps (8 elements a thread); its forward 16
    assert st._config(4097) == (8192, 1, True, 32) and st._config(4097, element_size=2)[3] == 8
    block, _, single, warps = st._config(4097, fwd=True)
    assert st._fwd_choice(4097, block, single, 4, warps) == (False, 16)
    assert st._config(4096, n_rows=8, sms=132) == st._config(4096)
    assert st._config(1024, st.Config(min_per_sm=0), n_rows=128, sms=132) == st._config(1024)
    x = torch.randn(2, st.MAX_WHOLE + 3 * st.CONFIG.stream_block + 17) * 5
    y = kernellab.softmax(x, backend="triton")
    v = judge(y, SPEC.ref(x), torch.float32, torch.softmax(x, -1))
    assert v.ok, v.detail


@pytest.mark.parametrize("waves", [1, 2])
def test_streamed_rows_walked_by_fewer_programs(waves, monkeypatch):
    # Config.stream_waves: fewer programs than rows, each walking rows (under the
    # interpreter one "SM"): every row written once, forward and backward. (max_single and
    # max_whole lowered: rows of 785 columns would otherwise be held whole, one a program.)
    from kernellab.ops.softmax import triton as st

    cfg = st.Config(stream_block=256, stream_waves=waves, bwd_hints=True, max_single=512, max_whole=0)
    x = torch.randn(5, 3 * 256 + 17) * 5
    dy = torch.randn_like(x)
    assert st._grid(5, 1, False, x.device, cfg) == waves
    fwd = _recorded_launches(monkeypatch, st, "_softmax_fwd_kernel")
    bwd = _recorded_launches(monkeypatch, st, "_softmax_bwd_kernel")
    y = st._fwd(x, cfg)
    v = judge(y, SPEC.ref(x), torch.float32, torch.softmax(x, -1))
    assert v.ok, v.detail
    y64 = torch.softmax(x.double(), -1)
    dx = st._bwd(dy, y, cfg)
    ref = y.double() * (dy.double() - (dy.double() * y.double()).sum(-1, keepdim=True))
    torch.testing.assert_close(dx.double(), ref, rtol=1e-5, atol=1e-7)
    assert y64.shape == dx.shape
    # both streamed, in 256-column steps, on `waves` programs (the backward's hints on)
    for kw in fwd + bwd:
        assert not kw["SINGLE"] and kw["BLOCK"] == 256 and kw["grid"] == (waves,)
    assert len(fwd) == len(bwd) == 1 and bwd[0]["HINTS"]


@pytest.mark.parametrize("cols", [3 * 512, 3 * 512 + 3])
def test_streamed_row_opening_with_masked_steps(cols, monkeypatch):
    # a streamed row whose first steps are all -inf (a mask's prefix): the running sum
    # stays 0 until a finite value arrives, then the answer is torch's; a row of -inf
    # only is NaN, as torch. (max_single and max_whole lowered: these rows would otherwise
    # be held whole.)
    from kernellab.ops.softmax import triton as st

    cfg = st.Config(stream_block=512, max_single=1024, max_whole=0)
    g = torch.Generator().manual_seed(cols)
    x = torch.randn(3, cols, generator=g) * 4
    x[0, : 2 * 512 + 1] = float("-inf")
    x[1] = float("-inf")
    launched = _recorded_launches(monkeypatch, st, "_softmax_fwd_kernel")
    y = st._fwd(x, cfg)
    assert [(kw["SINGLE"], kw["BLOCK"]) for kw in launched] == [(False, 512)]  # streamed, 512 a step
    assert torch.isnan(y[1]).all()
    ref = torch.softmax(x.double(), -1).float()
    assert (y[0, : 2 * 512 + 1] == 0).all()
    v = judge(y[[0, 2]], SPEC.ref(x[[0, 2]]), torch.float32, ref[[0, 2]])
    assert v.ok, v.detail


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
@pytest.mark.parametrize("waves", [0, 1])
def test_streamed_rows_off_16_byte_boundaries(dtype, waves):
    # rows of 4097 / 9001 columns start at every offset within a 16-byte chunk: the shifted
    # path (ALIGN) reads whole chunks and masks the neighbours, writes the interior and the
    # ends apart, and reads the tensor's last partial chunk apart; forward and backward,
    # also from a base one element off (a view into a larger buffer)
    from kernellab.ops.softmax import triton as st

    cfg = st.Config(stream_block=512, stream_waves=waves, max_whole=0)
    narrow = 4097 if dtype != torch.float32 else 8197  # (fp32 rows of 4097 stay whole)
    for rows, cols, off in ((9, narrow, 0), (5, 9001, 0), (3, 9001, 1), (1, 9001, 0)):
        g = torch.Generator().manual_seed(cols + off)
        buf = (torch.randn(rows * cols + off, generator=g) * 4).to(dtype)
        x = buf[off:].view(rows, cols)
        dy = torch.randn(rows, cols, generator=g).to(dtype)
        block, _, single, _ = st._config(cols, cfg, x.element_size())
        assert not single and st._align(cols, single, x.element_size()) == 16 // x.element_size()
        y = st._fwd(x, cfg)
        v = judge(y, SPEC.ref(x), dtype, torch.softmax(x, -1))
        assert v.ok, (rows, cols, off, v.detail)
        dx = st._bwd(dy, y, cfg)
        y64, dy64 = y.double(), dy.double()
        ref = y64 * (dy64 - (dy64 * y64).sum(-1, keepdim=True))
        tor = torch._softmax_backward_data(dy.float(), y.float(), -1, torch.float32).to(dtype)
        v = judge(dx, ref, dtype, tor)
        assert v.ok, (rows, cols, off, "bwd", v.detail)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_streamed_aligned_rows_backward(dtype):
    # streamed rows whose starts are 16-byte aligned (ALIGN 1): the backward's two sweeps,
    # the dot in fp64 (fp32 rows, COMP 2) or a plain fp32 sum (16-bit rows, COMP 0); one
    # program per row and fewer programs walking rows
    from kernellab.ops.softmax import triton as st

    for waves in (0, 1):
        cfg = st.Config(stream_block=512, stream_waves=waves, max_whole=0)
        rows, cols = 4, 9000
        g = torch.Generator().manual_seed(waves)
        x = (torch.randn(rows, cols, generator=g) * 4).to(dtype)
        dy = torch.randn(rows, cols, generator=g).to(dtype)
        block, _, single, _ = st._config(cols, cfg, x.element_size())
        assert not single and st._align(cols, single, x.element_size()) == 1
        assert st._comp(dtype, single, block, cfg) == (2 if dtype == torch.float32 else 0)
        y = st._fwd(x, cfg)
        v = judge(y, SPEC.ref(x), dtype, torch.softmax(x, -1))
        assert v.ok, (waves, v.detail)
        dx = st._bwd(dy, y, cfg)
        y64, dy64 = y.double(), dy.double()
        ref = y64 * (dy64 - (dy64 * y64).sum(-1, keepdim=True))
        tor = torch._softmax_backward_data(dy.float(), y.float(), -1, torch.float32).to(dtype)
        v = judge(dx, ref, dtype, tor)
        assert v.ok, (waves, "bwd", v.detail)


@pytest.mark.parametrize("cols", [1000, 4097, 9000])
def test_forward_with_64_bit_offsets(cols, monkeypatch):
    # WIDE (rows past 2^31 elements in all) computes its offsets in int64: forced on a small
    # tensor (fwd_narrow off), whole rows give the 32-bit launch's very bits. Only whole rows
    # read one element a load (SINGLE, ALIGN 1) read WIDE: streamed and shifted rows take
    # int64 offsets either way, so their two launches are the same code and are not compared
    # (whole_shifted off: 4097 columns, unaligned, read one element a load too)
    from kernellab.ops.softmax import triton as st

    launched = _recorded_launches(monkeypatch, st, "_softmax_fwd_kernel")
    x = torch.randn(3, cols, generator=torch.Generator().manual_seed(cols)) * 4
    compared = 0
    for cfg in (st.Config(), st.Config(stream_block=512, max_whole=0, whole_shifted=False)):
        launched.clear()
        narrow = st._fwd(x, cfg)
        wide = st._fwd(x, dataclasses.replace(cfg, fwd_narrow=False))
        (kw, kw_wide) = launched
        assert kw["WIDE"] is False and kw_wide["WIDE"] is True
        if kw["SINGLE"] and kw["ALIGN"] == 1:
            compared += 1
            assert torch.equal(wide, narrow)
        v = judge(wide, SPEC.ref(x), torch.float32, torch.softmax(x, -1))
        assert v.ok, v.detail
    assert compared  # at least one launch whose offsets WIDE changes


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_whole_rows_off_16_byte_boundaries(dtype):
    # rows held whole one a program (1025 and 4097 fp32 columns, 1025 16-bit) at every offset
    # within a 16-byte chunk: read once as the aligned chunks that hold them, written as the
    # interior and the ends apart (ALIGN with SINGLE; the fp32 backward excepted); the
    # tensor's last partial chunk read apart; also from a base one element off. Without
    # Config.whole_shifted: one element a load (ALIGN 1), the same values. (On the CPU no SM
    # count: these few rows take the shifted path.)
    from kernellab.ops.softmax import triton as st

    per16 = 16 // torch.tensor([], dtype=dtype).element_size()
    cases = [(9, 1025, 0), (5, 1025, 1), (3, 1025, 3), (1, 1025, 2)]
    if dtype == torch.float32:
        cases += [(5, 4097, 0), (2, 4097, 1)]
    for rows, cols, off in cases:
        g = torch.Generator().manual_seed(cols + off)
        buf = (torch.randn(rows * cols + off, generator=g) * 4).to(dtype)
        x = buf[off:].view(rows, cols)
        dy = torch.randn(rows, cols, generator=g).to(dtype)
        block, r, single, _ = st._config(cols, st.CONFIG, x.element_size(), n_rows=rows, sms=132)
        assert single and r == 1 and st._align(cols, single, x.element_size(), r, block) == per16
        off_cfg = st.Config(whole_shifted=False)
        assert st._align(cols, single, x.element_size(), r, block, off_cfg) == 1
        y = st._fwd(x)
        v = judge(y, SPEC.ref(x), dtype, torch.softmax(x, -1))
        assert v.ok, (rows, cols, off, v.detail)
        torch.testing.assert_close(y, st._fwd(x, off_cfg))  # (sums in another order)
        dx = st._bwd(dy, y)
        y64, dy64 = y.double(), dy.double()
        ref = y64 * (dy64 - (dy64 * y64).sum(-1, keepdim=True))
        tor = torch._softmax_backward_data(dy.float(), y.float(), -1, torch.float32).to(dtype)
        v = judge(dx, ref, dtype, tor)
        assert v.ok, (rows, cols, off, "bwd", v.detail)
        torch.testing.assert_close(dx, st._bwd(dy, y, off_cfg))
    # rows several a program, or whose chunks pass the block (2047 fp32 at a shift of 3:
    # 2052 columns in a 2048 block), keep one element a load
    assert st._align(999, True, 4, 4, 1024) == 1 and st._align(2047, True, 4, 1, 2048) == 1
    assert st._align(1024, True, 4, 1, 1024) == 1  # aligned rows: nothing to shift
    assert st._align(4097, True, 4, 1, 8192, comp=True) == 1  # the fp32 backward
    assert st._align(4097, True, 4, 1, 8192, n_rows=131, sms=132) == 1  # fewer rows than SMs
    assert st._align(4097, True, 4, 1, 8192, n_rows=132, sms=132) == 4
    assert st._align(4097, False, 4, comp=True, n_rows=1, sms=132) == 4  # streamed rows: always


def _sm90_spec(which, dtype, cx, align, hints=True):
    """A softmax kernel's compile spec for kltest.sm90_global_accesses: 8192-column blocks,
    one row per program, 16 warps, the pointers 16-byte aligned; ``cx`` sets SINGLE and VEC
    (and n_rows, for a one-row launch)."""
    fwd = which == "fwd"
    ptrs = ["x_ptr", "y_ptr"] if fwd else ["y_ptr", "dy_ptr", "dx_ptr"]
    extra = (dict(EVEN=False, WIDE=False, REREAD=False, ALIGN=align) if fwd
             else dict(COMP=2 if dtype == "fp32" else 0, HINTS=hints, ALIGN=align))  # fmt: skip
    cx = dict(BLOCK=8192, ROWS=1, **extra) | cx
    sig = dict(dict.fromkeys(ptrs, f"*{dtype}"), n_rows="i32", n_cols="i32") | dict.fromkeys(cx, "constexpr")
    kernel = "kernellab.ops.softmax.triton." + ("_softmax_fwd_kernel" if fwd else "_softmax_bwd_kernel")
    return dict(kernel=kernel, signature=sig, constexprs=cx, options={"num_warps": 16}, aligned_args=ptrs)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("which", ["fwd", "bwd"])
@pytest.mark.parametrize("single", [False, True], ids=["streamed", "whole"])
def test_triton_shifted_rows_load_16_bytes_at_a_time(which, dtype, single):
    """Rows off 16-byte boundaries (ALIGN), streamed or whole one a program: the row's body
    is read and written 16 bytes at a time; only the ends and the tensor's last partial
    chunk go one element at a time. Compiled for sm_90 (no GPU) at 8192-column blocks,
    VEC = 1 (an odd width); also with n_rows a constant 1, as Triton specializes a one-row
    launch."""
    if single and which == "bwd" and dtype == "fp32":
        pytest.skip("fp32 whole rows' backward reads one element a load (_align)")
    a = 16 // (4 if dtype == "fp32" else 2)
    specs = [_sm90_spec(which, dtype, dict(SINGLE=single, VEC=1), align) for align in (1, a)]
    specs.append(_sm90_spec(which, dtype, dict(SINGLE=single, VEC=1, n_rows=1), a))  # a one-row launch
    lines = [(align, len(ld), sum(".v4" in i for i in ld), len(st), sum(".v4" in i for i in st))
             for align, (ld, st) in zip((1, a), sm90_global_accesses(specs))]  # fmt: skip
    (a1, n1, w1, s1, ws1), (a, n, w, s, ws) = lines
    tensors = 1 if which == "fwd" else 2
    assert a1 == 1 and w1 == 0 and ws1 == 0  # unshifted at an odd width: one element at a time
    assert a > 1 and w > 0 and ws > 0  # the shifted body: 16-byte loads and stores
    # the scalar rest: per tensor read, the last partial chunk (1 load) and the two ends (2)
    assert n - w == 3 * tensors and s - ws == 2, (n, w, s, ws)


def test_compile_backend_quick():
    x = torch.randn(4, 100)
    y = kernellab.softmax(x, backend="compile")
    torch.testing.assert_close(y, torch.softmax(x, -1))


def test_under_torch_compile_fullgraph():
    f = torch.compile(lambda t: kernellab.softmax(t, backend="triton") * 2, fullgraph=True)
    x = torch.randn(5, 33, requires_grad=True)
    f(x).sum().backward()
    x2 = x.detach().clone().requires_grad_()
    (torch.softmax(x2, -1) * 2).sum().backward()
    torch.testing.assert_close(x.grad, x2.grad, rtol=1e-4, atol=1e-6)


def test_cuda_plan_covers_every_path():
    """Which softmax.cu entry runs for a row width (v3 and v4 share the row routines)."""
    from kernellab.ops.softmax import cuda as sc

    assert sc.plan(1, 4096, 4, True)[0] == "v1" and sc.plan(2, 4096, 4, True)[0] == "v2"
    # v3: 256 threads, the row in registers up to 4 packs per thread, streamed beyond
    assert sc.plan(3, 4096, 4, True) == ("rv", 256, 1)
    assert sc.plan(3, 4100, 4, True) == ("ov", 256, 1)
    assert sc.plan(3, 4097, 4, True) == ("os", 256, 1)  # 4097 % 4: scalar twin
    # v4: a warp per short row, a block fitted to the row (r up to 512 threads, l up to
    # 1024), streamed for longer rows
    assert sc.plan(4, 512, 4, True) == ("wv", 256, 8)
    assert sc.plan(4, 123, 2, True) == ("ws", 256, 8)
    assert sc.plan(4, 4096, 4, True) == ("rv", 256, 1)
    assert sc.plan(4, 4096, 2, True) == ("rv", 128, 1)
    assert sc.plan(4, 8192, 4, True) == ("rv", 512, 1)
    assert sc.plan(4, 8196, 4, True) == ("lv", 544, 1)  # 2049 packs
    assert sc.plan(4, 7000, 4, True) == ("rv", 448, 1)
    assert sc.plan(4, 16384, 4, True) == ("lv", 1024, 1)
    assert sc.plan(4, 16388, 4, True) == ("ov", 1024, 1)
    assert sc.plan(4, 4096, 4, False) == ("ls", 1024, 1)  # misaligned: scalar, 4096 > 4 x 512
    assert sc.plan(4, 4097, 4, False) == ("os", 1024, 1)
    # 16-bit rows of 32000 (4000 packs): resident in 1024 threads, not streamed twice
    assert sc.plan(4, 32000, 2, True) == ("lv", 1024, 1)
    assert sc.plan(4, 32768, 2, True) == ("lv", 1024, 1)
    assert sc.plan(4, 32776, 2, True) == ("ov", 1024, 1)
    assert sc.plan(3, 32000, 2, True) == ("ov", 256, 1)  # v3 as before


def test_cuda_kernels_compile_and_stay_in_registers():
    import re

    from kernellab.ops.softmax import cuda as sc

    ptx = sc.MODULE.compile("sm_90", target="ptx").decode()
    names = re.findall(r"\.entry (\w+)", ptx)
    for d in ("f32", "f16", "bf16"):
        for kind in ("v1", "v2", "rv", "lv", "ov", "wv", "rs", "ls", "os", "ws"):
            for direction in ("fwd", "bwd"):
                assert f"softmax_{direction}_{kind}_{d}" in names
    assert ".local" not in ptx  # the register-resident rows must not spill
    # fp32 rows' backward dot is compensated fp32: no fp64 in v3 / v4's entries
    for kind in ("rv", "lv", "ov", "wv", "rs", "ls", "os", "ws"):
        body = ptx.split(f".entry softmax_bwd_{kind}_f32")[1].split(".entry")[0]
        assert ".f64" not in body, kind


def test_cuda_long_resident_entries_fit_64_registers():
    """The l entries run 1024 threads (__launch_bounds__(1024): 64 registers a thread): no
    spills, in the SASS where cuobjdump is found."""
    from kernellab.inspect import asm
    from kernellab.ops.softmax import cuda as sc

    if asm.find_tool("cuobjdump") is None:
        pytest.skip("cuobjdump not found")
    for d in ("f32", "bf16"):  # (f16 as bf16)
        kernels, note = asm.cuda_report(sc.MODULE, "sm_90", "cuda", d)
        assert kernels, note
        for k in kernels:
            assert k.local_bytes == 0, (k.name, k.local_bytes)
            if "_l" in k.name:
                assert k.registers <= 64, (k.name, k.registers)


def _hostile_rows(width: int, seed: int):
    """(y, dy) fp32, 6 rows: one y ~ 1 with a large dy there; dy - dot cancelling to noise;
    both; large |dy|; uniform y with cancelling dy; an ordinary row."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(6, width, generator=g) * 3
    dy = torch.randn(6, width, generator=g)
    k = width // 3
    x[0, k] = 40.0  # y ~ 1 at k, the rest tiny
    dy[0, k] = 300.0
    dy[1] = 1234.5 + 1e-3 * dy[1]
    x[2, k] = 40.0
    dy[2] = 2.5 + 1e-4 * dy[2]
    dy[3] *= 1e4
    x[4] = 0.0
    dy[4] = -7.25 + 1e-5 * dy[4]
    return torch.softmax(x, -1), dy


def _judge_hostile(dx, y, dy):
    """Each row within one ulp of its largest |dx| (at least 1) of float64, and within the
    check's bound (2x torch's fp32 error + that floor). The fp64 form measures up to 0.42
    ulp here, a plain fp32 dot up to hundreds (dy - dot cancels)."""
    y, dy, dx = y.cpu(), dy.cpu(), dx.cpu()
    ref = torch._softmax_backward_data(dy.double(), y.double(), -1, torch.float64)
    tor = torch._softmax_backward_data(dy, y, -1, torch.float32)
    for r in range(y.shape[0]):
        v = judge(dx[r], ref[r], torch.float32, tor[r])
        ulp = torch.finfo(torch.float32).eps * max(1.0, ref[r].abs().max().item())
        assert v.ok and v.err <= ulp, (r, v.err / ulp, v.detail)


# widths: one element, odd, a program of several rows, one block, whole rows past one block
# (Dot2 pairs), streamed (aligned and off 16-byte boundaries: the fp64 sum per lane)
@pytest.mark.parametrize("width", [1, 2, 3, 7, 64, 1025, 4096, 8192, 8193, 3 * 4096 + 17, 32800, 32801])
def test_triton_fp32_backward_on_hostile_rows(width):
    """The compensated fp32 dot (hi + lo: summed in fp64, or Dot2 pairs) under the
    interpreter, against float64."""
    from kernellab.ops.softmax import triton as st

    y, dy = _hostile_rows(width, width)
    _judge_hostile(st._bwd(dy, y), y, dy)


def _two_sum(a, b):
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def _cuda_bwd_model(y: torch.Tensor, dy: torch.Tensor, threads: int, n: int):
    """softmax.cu's fp32 backward (RowDot<true>) in NumPy float32, in its order:
    thread t adds packs t, t + threads, ... of n elements (zeros past the row), then the
    xor shuffles within each warp, the warps' pairs through scratch and the shuffles
    again; dx = fma(y, dy - hi, -y * lo). Products split exactly through float64."""
    import numpy as np

    f32 = np.float32
    yv, gv = y.numpy(), dy.numpy()
    rows, cols = yv.shape
    npacks = cols // n
    hi = np.zeros((rows, threads), f32)
    lo = np.zeros((rows, threads), f32)
    t = np.arange(threads)
    for k in range(-(-npacks // threads)):
        ok = t + k * threads < npacks
        for j in range(n):
            c = np.where(ok, (t + k * threads) * n + j, 0)
            a, g = np.where(ok, yv[:, c], f32(0)), np.where(ok, gv[:, c], f32(0))
            p = a * g
            ep = (a.astype(np.float64) * g - p).astype(f32)  # fma(y, dy, -p): exact
            hi, e = _two_sum(hi, p)
            lo = lo + (ep + e)

    def shuffles(hi, lo):
        for off in (16, 8, 4, 2, 1):
            idx = np.arange(hi.shape[-1]) ^ off
            hi, e = _two_sum(hi, hi[..., idx])
            lo = (lo + lo[..., idx]) + e
        return hi, lo

    hi, lo = shuffles(hi.reshape(rows, -1, 32), lo.reshape(rows, -1, 32))
    warps = threads // 32
    hi = np.concatenate([hi[:, :, 0], np.zeros((rows, 32 - warps), f32)], 1)
    lo = np.concatenate([lo[:, :, 0], np.zeros((rows, 32 - warps), f32)], 1)
    hi, lo = shuffles(hi, lo)
    hi, lo = hi[:, :1], lo[:, :1]
    s = gv - hi
    dx = (yv.astype(np.float64) * s - (yv * lo)).astype(f32)  # the fma, rounded via float64
    return torch.from_numpy(dx)


@pytest.mark.parametrize("width", [3, 64, 1025, 4096, 7000, 16384])
def test_cuda_fp32_backward_arithmetic_model(width):
    """A NumPy model of the CUDA fp32 backward's compensated dot, with the thread layout
    cuda.plan picks (warp, fitted block, 1024 threads), on the hostile rows."""
    from kernellab.ops.softmax import cuda as sc

    y, dy = _hostile_rows(width, width)
    kind, threads, _ = sc.plan(4, width, 4, True)
    n = 4 if kind.endswith("v") else 1
    _judge_hostile(_cuda_bwd_model(y, dy, 32 if kind[0] == "w" else threads, n), y, dy)


GPU_BACKENDS = ["manual", "torch", "triton", "cuda_v1", "cuda_v2", "cuda_v3", "cuda"]


@pytest.mark.gpu
@pytest.mark.parametrize("backend", GPU_BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_gpu_forward_and_gradient(backend, dtype):
    impl = kernellab.get("softmax", backend)
    why = impl.why_unavailable("cuda")
    if why:
        pytest.skip(why)
    shapes = [(41,), (3, 123), (17, 4097), (70000, 3), (3, 8192), (2, 8200), (2, 16384), (3, 32000)]
    if backend not in ("cuda_v1",):  # one thread per 262144-wide row: correct but minutes
        shapes.append((4, 262144))
    for shape in shapes:
        (x,) = SPEC.make_inputs(shape, dtype, "cuda", 1)
        y = kernellab.softmax(x, backend=backend)
        v = judge(y, SPEC.ref(x), dtype, torch.softmax(x, -1))
        assert v.ok, (shape, v.detail)
        leaf = x.detach().clone().requires_grad_()
        dy = torch.randn(shape, device="cuda").to(dtype)
        (g,) = torch.autograd.grad(kernellab.softmax(leaf, backend=backend), leaf, dy)
        x64 = x.detach().double().requires_grad_()
        (g_ref,) = torch.autograd.grad(torch.softmax(x64, -1), x64, dy.double())
        t = x.detach().clone().requires_grad_()
        (g_torch,) = torch.autograd.grad(torch.softmax(t, -1), t, dy)
        v = judge(g, g_ref, dtype, g_torch)
        assert v.ok, (shape, "grad", v.detail)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["triton", "cuda_v3", "cuda"])
@pytest.mark.parametrize(
    "width", [7, 64, 1025, 3001, 4096, 4097, 7000, 8193, 16384, 3 * 4096 + 17, 20000, 40001]
)
def test_gpu_fp32_backward_on_hostile_rows(backend, width):
    """The compensated fp32 dot on the GPU (every CUDA row kind: w, r, l, o, vector and
    scalar) on the hostile rows, as under the interpreter."""
    y, dy = _hostile_rows(width, width)
    x = y.log().cuda().requires_grad_()  # softmax(log y) = y: the backward sees its own y
    out = kernellab.softmax(x, backend=backend)
    (dx,) = torch.autograd.grad(out, x, dy.cuda())
    _judge_hostile(dx, out.detach(), dy)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda_v2", "cuda_v3", "cuda"])
def test_gpu_cuda_fully_masked_and_misaligned_rows(backend):
    x = torch.randn(4, 4096, device="cuda")
    x[1] = float("-inf")
    y = kernellab.softmax(x, backend=backend)
    ref = torch.softmax(x, -1)
    assert torch.equal(torch.isnan(y), torch.isnan(ref)) and torch.isnan(y[1]).all()
    flat = torch.randn(4 * 4096 + 1, device="cuda")
    xo = flat[1:].view(4, 4096)  # storage offset 1: the scalar twins run
    torch.testing.assert_close(kernellab.softmax(xo, backend=backend), torch.softmax(xo, -1))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda_v2", "cuda_v3", "cuda", "triton"])
@pytest.mark.parametrize("cols", [1025, 4097, 262144])
def test_gpu_nan_first_in_a_thread_poisons_the_row(backend, cols):
    """A NaN that a thread meets before any finite value (its running max still -inf)
    makes the whole row NaN, as torch's does; the streamed (online) path once skipped it
    (fp32 37 x 1025 on the H100)."""
    x = torch.randn(3, cols, device="cuda")
    x[0, 0] = float("nan")  # the first element of the first thread
    x[1, cols - 1] = float("nan")  # the last one (a scalar tail where there is one)
    x[2, :7] = float("-inf")
    x[2, 3] = float("nan")  # after -inf only
    y = kernellab.softmax(x, backend=backend)
    assert torch.isnan(y).all(), [int(torch.isnan(r).sum()) for r in y]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_gpu_liger_peer_forward(dtype):
    """The liger peer as users call it, within its limits: rows up to 65536 columns
    (liger raises beyond); its gradients are judged by `kernellab check`, not here."""
    impl = kernellab.get("softmax", "liger")
    if impl.why_unavailable("cuda"):
        pytest.skip(impl.why_unavailable("cuda"))
    for shape in [(3, 123), (17, 4097), (64, 8192)]:
        (x,) = SPEC.make_inputs(shape, dtype, "cuda", 2)
        v = judge(kernellab.softmax(x, backend="liger"), SPEC.ref(x), dtype, torch.softmax(x, -1))
        assert v.ok, (shape, v.detail)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
@pytest.mark.parametrize("width", [1024, 2048, 3000])
def test_triton_forward_rereads_wide_rows(dtype, width, monkeypatch):
    """Rows of Config.reread_min_cols columns and more: the statistics from registers, the output
    from a second read of x; fp32 at 16 warps. Same answer as float64 either way."""
    from kernellab.ops.softmax import triton as st

    launched = _recorded_launches(monkeypatch, st, "_softmax_fwd_kernel")
    g = torch.Generator().manual_seed(width)
    x = (torch.randn(5, width, generator=g) * 4).to(dtype)
    x[1, 7] = 60.0  # one dominant element
    x[2, : width // 2] = -float("inf")  # half of a row masked out
    y = st._fwd(x)
    want = torch.softmax(x.double(), -1)
    y2 = st._fwd(x, st.Config(fwd_reread=False))  # the output from registers
    # what ran: the default re-reads from reread_min_cols columns up (fp32 at 16 warps), the
    # knob turns it off; below reread_min_cols both calls are the same launch, the same bits
    reread = width >= st.CONFIG.reread_min_cols
    (kw, kw2) = launched
    assert kw["REREAD"] is reread and kw2["REREAD"] is False
    assert kw["num_warps"] == (16 if reread and dtype == torch.float32 else kw2["num_warps"])
    err, err2 = (y.double() - want).abs().max(), (y2.double() - want).abs().max()
    if reread:
        assert 0 < err <= 2 * err2, (err, err2)
    else:
        assert kw == kw2 and torch.equal(y, y2)
    assert torch.isfinite(y).all() and (y[2, : width // 2] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_triton_rows_off_16_byte_boundaries_do_not_reread(dtype):
    """A whole row whose width is not a multiple of 16 bytes is read once (its loads are one
    element wide); fp32 ones of 8192-wide blocks take 16 warps all the same. A row held
    whole past MAX_SINGLE gives float64's answer, forward and backward."""
    from kernellab.ops.softmax import triton as st

    es = torch.tensor([], dtype=dtype).element_size()
    block, rows, single, warps = st._config(4097, element_size=es, fwd=True)
    if dtype == torch.float32:
        assert single and st._fwd_choice(4097, block, single, es, warps) == (False, 16)
    assert st._fwd_choice(4096, 4096, True, es, 8)[0] is True
    assert st._fwd_choice(2049, 4096, True, es, 8)[0] is False
    # 8192-wide blocks: fp32 re-reads, 16-bit rows do not
    assert st._fwd_choice(8192, 8192, True, es, 8)[0] is (dtype == torch.float32)
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(3, 9001, generator=g) * 4).to(dtype)
    dy = torch.randn(3, 9001, generator=g).to(dtype)
    assert st._config(9001, element_size=es)[2] is True  # the backward holds it whole
    y = st._fwd(x)
    v = judge(y, SPEC.ref(x), dtype, torch.softmax(x, -1))
    assert v.ok, v.detail
    dx = st._bwd(dy, y)
    y64, dy64 = y.double(), dy.double()
    ref = y64 * (dy64 - (dy64 * y64).sum(-1, keepdim=True))
    tor = torch._softmax_backward_data(dy.float(), y.float(), -1, torch.float32).to(dtype)
    v = judge(dx, ref, dtype, tor)
    assert v.ok, ("bwd", v.detail)


def test_triton_vec_is_the_widths_power_of_two():
    from kernellab.ops.softmax.triton import _vec

    assert [_vec(n) for n in (7000, 1000, 3000, 4097, 50257, 8192, 48, 0)] == [8, 8, 8, 1, 1, 16, 16, 16]


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("which", ["fwd", "bwd"])
def test_triton_rows_of_7000_load_16_bytes_at_a_time(which, dtype):
    """At a width Triton does not specialize as divisible by 16 (7000 = 8 x 875) the
    kernels still use 16-byte accesses once told VEC; told nothing (VEC = 1) they are scalar.
    Compiled ahead of time for sm_90 (no GPU), n_cols without a divisibility hint, as
    Triton specializes a launch at 7000 columns."""
    from kernellab.ops.softmax.triton import _vec

    vecs = (1, _vec(7000))
    fwd = which == "fwd"
    reread = {"REREAD": True} if fwd else {}
    specs = [_sm90_spec(which, dtype, dict(SINGLE=True, VEC=v, **reread), 1, hints=False) for v in vecs]
    lines = []
    for v, (ld, st) in zip(vecs, sm90_global_accesses(specs)):
        wide = [sum(".v4" in i or ".v2" in i for i in acc) for acc in (ld, st)]
        lines.append((v, len(ld), wide[0], len(st), wide[1]))
    (v1, n1, vl1, s1, vs1), (v8, n8, vl8, s8, vs8) = lines
    assert (v1, v8) == (1, 8)
    assert vl1 == 0 and vs1 == 0 and n1 > 0  # told nothing: scalar
    assert vl8 == n8 > 0 and vs8 == s8 > 0  # every access vectorized
    assert n8 < n1  # (fewer, wider)
