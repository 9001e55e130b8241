"""The Triton norm kernels behind the C++ node (ops/norm_kernels/triton_node.py): on the CPU,
each kernel of every plan kind compiled for sm_90 and its parameters coded against its PTX
entry; on a GPU, the node against the Python path (bitwise) and float64."""

from __future__ import annotations

import pytest
import torch

import kernellab
from kernellab.cuda import nodes
from kernellab.ops.norm_kernels import triton_kernels as tk
from kernellab.ops.norm_kernels import triton_node as tn

DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64"}
OPTIONS = ("num_warps", "num_stages", "enable_fp_fusion")

# (shape, dtype, bias, rms): the plan kinds (row kernel, row tiles, shifted odd widths,
# small one-kernel backward, fp64 partials of fp32 weights, rms without bias partials)
CASES = [
    ((8192, 768), torch.bfloat16, True, False),
    ((8192, 768), torch.bfloat16, False, False),
    ((64, 256), torch.bfloat16, True, False),
    ((4096, 4097), torch.bfloat16, True, False),
    ((2048, 2048), torch.float32, True, False),
    ((2000, 3000), torch.float32, False, True),
    ((8192, 4096), torch.bfloat16, False, True),
    ((3, 17, 1024), torch.float16, True, False),
]


def _compile_sm90(bound, args):
    """``bound``'s kernel compiled for sm_90 with these arguments' types (no GPU needed):
    (compiled kernel, its signature)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel = bound.kernel
    consts = {k: v for k, v in bound.kw.items() if k not in OPTIONS}
    sig, it = {}, iter(args)
    for name, p in zip(kernel.arg_names, kernel.params):
        if p.is_constexpr:
            sig[name] = "constexpr"
            continue
        a = next(it)
        if isinstance(a, torch.Tensor):
            sig[name] = "*" + DTYPE_NAMES[a.dtype]
        elif isinstance(a, float):
            sig[name] = "fp32"
        elif a == 1:  # (Triton specializes an int of 1 into a constant)
            sig[name] = "constexpr"
            consts[name] = 1
        else:
            sig[name] = "i32" if -(2**31) <= a < 2**31 else "i64"
    opts = {k: v for k, v in bound.kw.items() if k in OPTIONS}
    src = ASTSource(fn=kernel, signature=sig, constexprs=consts)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts), sig


@pytest.mark.parametrize("shape,dtype,bias,rms", CASES)
def test_parameters_coded_against_the_ptx(shape, dtype, bias, rms):
    x = torch.randn(shape, dtype=dtype)
    w = torch.ones(shape[-1], dtype=dtype)
    meta, launches = tn.kernels_of(x, w, bias, rms)
    assert meta[:2] == [int(rms), int(bias)] and len(launches) == (2 if meta[2] else 3)
    for bound, args, slots, scalars in launches:
        ck, sig = _compile_sm90(bound, args)
        n_ptx = tn.ptx_params(ck.asm["ptx"], ck.metadata.name)
        codes = tn.param_codes(bound.kernel.arg_names, sig, slots, scalars, n_ptx)
        assert len(codes) == 2 * n_ptx
        passed = [a for n, a in zip(_runtime_names(bound.kernel), args) if sig[n] != "constexpr"]
        pairs = list(zip(codes[0::2], codes[1::2]))
        for (code, value), a in zip(pairs, passed):
            if isinstance(a, torch.Tensor):
                assert 0 <= code < 16
            elif isinstance(a, float):
                assert code == tn.EPS
            else:
                assert (code, value) in ((tn.I32, a), (tn.I64, a))
        scratch = pairs[len(passed) :]
        assert len(scratch) <= tn.MAX_SCRATCH and all(c == tn.NULL for c, _ in scratch)


def _runtime_names(kernel):
    """The names of the arguments a launch passes (the kernel's non-constexpr parameters)."""
    return [n for n, p in zip(kernel.arg_names, kernel.params) if not p.is_constexpr]


def test_kernels_of_refuses_what_the_node_does_not_take():
    w = torch.ones(8)
    assert tn.kernels_of(torch.randn(0, 8), w, False, False) is None  # empty
    assert tn.kernels_of(torch.tensor(1.0), torch.ones(()), False, False) is None  # 0-dim
    wide = tk.MAX_D + 1
    assert tn.kernels_of(torch.randn(2, wide), torch.ones(wide), False, False) is None  # the wide kernels


def test_param_codes_refuse_what_they_cannot_code():
    sig = {"x_ptr": "*bf16", "n_cols": "i32", "eps": "fp32", "BLOCK": "constexpr"}
    names = ["x_ptr", "n_cols", "eps", "BLOCK"]
    want = [0, 0, tn.I32, 7, tn.EPS, 0, tn.NULL, 0, tn.NULL, 0]
    assert tn.param_codes(names, sig, {"x_ptr": 0}, {"n_cols": 7}, 5) == want
    with pytest.raises(tn.NotCoded, match="PTX parameters"):
        tn.param_codes(names, sig, {"x_ptr": 0}, {"n_cols": 7}, 6)
    with pytest.raises(tn.NotCoded, match="no slot"):
        tn.param_codes(names, sig, {}, {"n_cols": 7}, 3)
    with pytest.raises(tn.NotCoded, match="n_cols"):
        tn.param_codes(names, sig, {"x_ptr": 0}, {}, 3)
    with pytest.raises(tn.NotCoded, match="no .entry"):
        tn.ptx_params(".entry other(\n.param .u64 a\n)", "mine")


def test_no_node_on_the_cpu_or_unbuilt(monkeypatch):
    x, w = torch.randn(4, 16), torch.ones(16)
    monkeypatch.setattr(nodes, "module", lambda: None)
    assert tn.ln_node(x, w, None, 1e-5) is None and tn.rms_node(x, w, 1e-6) is None
    # the backend still runs (its Python path)
    y = kernellab.layer_norm(x, w, None, backend="triton")
    torch.testing.assert_close(y, torch.nn.functional.layer_norm(x, (16,), w), rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- on a GPU


def _run(fn, x, w, b, dy):
    leaves = [t.detach().clone().requires_grad_(True) for t in (x, w) + ((b,) if b is not None else ())]
    y = fn(*leaves)
    grads = torch.autograd.grad(y, leaves, dy)
    return y, [y.detach(), *grads]


@pytest.mark.gpu
@pytest.mark.parametrize("shape,dtype,bias,rms", CASES + [((1, 4096), torch.bfloat16, True, False)])
def test_node_is_bitwise_the_python_path(shape, dtype, bias, rms, cpp_nodes_on):
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(shape, device="cuda", dtype=dtype, generator=g)
    w = (1 + 0.1 * torch.randn(shape[-1], device="cuda", generator=g)).to(dtype)
    b = (0.1 * torch.randn(shape[-1], device="cuda", generator=g)).to(dtype) if bias else None
    dy = torch.randn(shape, device="cuda", dtype=dtype, generator=g)
    if rms:
        fn = lambda x_, w_, *_: kernellab.rms_norm(x_, w_, 1e-6, backend="triton")  # noqa: E731
    else:
        fn = lambda x_, w_, *b_: kernellab.layer_norm(x_, w_, b_[0] if b_ else None, 1e-5, backend="triton")  # noqa: E731
    y, got = _run(fn, x, w, b, dy)
    assert type(y.grad_fn).__name__ == "CppFunction"  # the C++ node
    with kernellab.config.override(cpp_nodes="off"):
        y2, want = _run(fn, x, w, b, dy)
    assert type(y2.grad_fn).__name__ != "CppFunction"
    for a, c in zip(got, want):
        assert a.dtype == c.dtype and a.shape == c.shape and torch.equal(a, c)
    # and against float64
    x64 = x.double()
    if rms:
        y64 = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
    else:
        y64 = torch.nn.functional.layer_norm(x64, shape[-1:], w.double(), None if b is None else b.double())
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert (got[0].double() - y64).abs().max().item() <= tol * (1 + y64.abs().max().item())


@pytest.mark.gpu
def test_node_falls_back_and_refuses_double_backward(cpp_nodes_on):
    base = torch.randn(8 * 256 + 1, device="cuda")
    x = base[1:].view(8, 256).requires_grad_()  # misaligned: the Python path
    w = torch.ones(256, device="cuda", requires_grad=True)
    y = kernellab.layer_norm(x, w, None, backend="triton")
    assert type(y.grad_fn).__name__ != "CppFunction"
    torch.testing.assert_close(y, torch.nn.functional.layer_norm(x, (256,), w), rtol=1e-5, atol=1e-5)
    x2 = torch.randn(8, 256, device="cuda", requires_grad=True)
    y2 = kernellab.rms_norm(x2, w, backend="triton")
    assert type(y2.grad_fn).__name__ == "CppFunction"
    with pytest.raises(RuntimeError, match="create_graph"):
        torch.autograd.grad(y2.sum(), (x2,), create_graph=True)
    # no gradient recorded: the node's forward alone
    with torch.no_grad():
        y3 = kernellab.rms_norm(x2, w, backend="triton")
    torch.testing.assert_close(y3, y2.detach(), rtol=0, atol=0)
