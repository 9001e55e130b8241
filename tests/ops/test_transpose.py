"""transpose: every backend that runs here x odd shapes x dtypes, forward and gradient
exact (values are moved, never rounded); layouts; bad inputs naming the argument; the check
engine passes the Triton kernel and rejects planted wrong ones; the CUDA launcher's layout
decisions; the CUDA ladder's machine code (shared memory in v2-v5, the padded tile in v3,
16-byte accesses with every load issued before the first shared store in v5) without a
GPU; GPU cases (marked ``gpu``)."""

from __future__ import annotations

import pytest
import torch

import kernellab
from kernellab.core import registry
from kernellab.harness.check import FAIL, PASS, check_impl
from kernellab.inspect import asm
from kernellab.ops.transpose import cuda as tcuda
from kltest import (
    DTYPES,
    LAYOUTS,
    backend_matrix,
    check_planted,
    compile_grads_match,
    cpu_backends,
    dtype_id,
    gpu_only_backends,
    opcheck_custom_ops,
    seed_for,
    shape_id,
)

OP = "transpose"
SPEC = kernellab.get_spec(OP)
MATRIX = backend_matrix(OP)
CUDA = gpu_only_backends(OP)  # cuda, cuda_v1 .. cuda_v5
SHAPES = [(1, 1), (1, 17), (17, 113), (113, 17), (33, 65), (2, 0, 3), (3, 17, 31), (2, 3, 9, 10)]
HAS_CUOBJDUMP = asm.find_tool("cuobjdump") is not None


def _expected(x):
    return x.transpose(-2, -1).contiguous()


def _run(backend, x, dy):
    leaf = x.detach().clone().requires_grad_()  # (clone: contiguous; layouts test their own)
    y = kernellab.transpose(leaf, backend=backend)
    (dx,) = torch.autograd.grad(y, leaf, dy)
    return y.detach(), dx


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@pytest.mark.parametrize("dev,backend", MATRIX)
def test_forward_and_grad_exact(dev, backend, shape, dtype):
    (x,) = SPEC.make_inputs(shape, dtype, dev, seed_for(OP, backend, shape, dtype))
    out_shape = (*shape[:-2], shape[-1], shape[-2])
    dy = torch.randn(out_shape, device=dev).to(dtype)
    y, dx = _run(backend, x, dy)
    assert y.shape == out_shape and y.dtype == dtype and y.is_contiguous()
    assert torch.equal(y, _expected(x))
    assert torch.equal(y.double(), SPEC.reference(x.double()))  # error 0 against float64
    assert dx.shape == x.shape and torch.equal(dx, _expected(dy))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dev,backend", MATRIX)
def test_layouts(dev, backend, layout):
    (x,) = SPEC.make_inputs((37, 67), torch.float32, dev, seed_for(backend, layout), layout)
    y = kernellab.transpose(x, backend=backend)
    assert torch.equal(y, _expected(x))
    leaf = x.detach().requires_grad_()  # the layout kept: the backward sees it too
    dy = torch.randn(134, 37, device=dev)[::2]  # a strided grad_output
    (dx,) = torch.autograd.grad(kernellab.transpose(leaf, backend=backend), leaf, dy)
    assert torch.equal(dx, _expected(dy))


@pytest.mark.parametrize("dev,backend", MATRIX)
def test_row_strided_batched_and_collapsing_layouts(dev, backend):
    base = torch.randn(4, 50, 70, device=dev)
    cases = [
        base[1, 3:40, 5:69],  # rows of stride 70, unit columns, a storage offset
        base[:, ::3, :],  # batch and row strides
        base[:1].expand(3, 50, 70),  # batch stride 0
        base.reshape(2, 2, 50, 70).transpose(0, 1),  # leading dims that do not collapse
        base.reshape(4, 5, 10, 70)[:, :, 2:7],  # 4-d, rows sliced
    ]
    for x in cases:
        assert torch.equal(kernellab.transpose(x, backend=backend), _expected(x))


def test_bad_inputs_name_the_argument():
    for backend in cpu_backends(OP):
        for bad in (torch.randn(5), torch.tensor(1.0)):
            with pytest.raises(ValueError, match=r"\bx\b has [01] dim"):
                kernellab.transpose(bad, backend=backend)
        with pytest.raises(TypeError, match=r"\bx\b has dtype torch.int32"):
            kernellab.transpose(torch.ones(3, 4, dtype=torch.int32), backend=backend)
        with pytest.raises(TypeError, match=r"\bx\b must be a torch.Tensor, got list"):
            kernellab.transpose([[1.0, 2.0]], backend=backend)
        with pytest.raises(TypeError, match="dims"):
            kernellab.get(OP, backend)(torch.randn(3, 4), dims=(0, 1))
    with pytest.raises(TypeError, match=r"\bx\b has dtype torch.float64"):
        kernellab.transpose(torch.randn(3, 4, dtype=torch.float64), backend="triton")
    for backend in CUDA:
        with pytest.raises(ValueError, match=r"\bx\b is on cpu"):
            kernellab.transpose(torch.randn(3, 4), backend=backend)
        with pytest.raises(TypeError, match=r"\bx\b has dtype torch.float64"):
            kernellab.transpose(torch.randn(3, 4, dtype=torch.float64), backend=backend)


def test_reference_backends_take_float64_for_gradcheck():
    x = torch.randn(3, 5, 4, dtype=torch.float64, requires_grad=True)
    for backend in ("manual", "torch"):
        assert torch.autograd.gradcheck(lambda t: kernellab.transpose(t, backend=backend), (x,))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_check_engine_passes_triton(dtype):
    rep = check_impl(registry.get(OP, "triton"), dtype, device="cpu", quick=True, seed=5)
    assert rep.status == PASS, [(c.kind, c.name, c.detail) for c in rep.failures]
    kinds = {c.kind for c in rep.cases}
    assert {"shape", "layout", "boundary", "grad", "bad"} <= kinds


def _contiguous_view(x):
    """x's storage read as if x were contiguous: right for contiguous x only."""
    strides, s = [], 1
    for d in reversed(x.shape):
        strides.insert(0, s)
        s *= d
    return torch.as_strided(x, x.shape, strides, x.storage_offset())


class _DoubledGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.transpose(-2, -1).contiguous()

    @staticmethod
    def backward(ctx, dy):
        return 2 * dy.transpose(-2, -1)


def _drop_last_column(x):
    y = x.transpose(-2, -1).contiguous()
    if y.shape[-1] > 1:
        y[..., -1] = 0
    return y


def _first_matrix_only(x):
    """Right for one matrix, wrong for a batch: every matrix gets the first one's transpose."""
    y = _expected(x)
    if y.dim() > 2 and y.numel():
        mats = y.reshape(-1, *y.shape[-2:])
        y = mats[:1].expand(mats.shape).reshape(y.shape)
    return y


PLANTED = {
    "reshape_not_transpose": lambda x: x.reshape(*x.shape[:-2], x.shape[-1], x.shape[-2]),
    "first_matrix_only": lambda x: _first_matrix_only(x),
    "wrong_for_strided": lambda x: _expected(_contiguous_view(x)),
    "through_bf16": lambda x: _expected(x.to(torch.bfloat16).to(x.dtype)),
    "doubled_gradient": lambda x: _DoubledGrad.apply(x),
    "last_column_unwritten": _drop_last_column,
}


# the check's stages that must catch each one (the others cost time, not coverage)
CATCHES = {"doubled_gradient": ("grads",), "wrong_for_strided": ("layouts",)}


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_planted_mistakes_are_rejected(name):
    rep = check_planted(OP, name, PLANTED[name], stages=CATCHES.get(name, ("shapes",)))
    assert rep.status == FAIL, [(c.kind, c.name, c.status) for c in rep.cases]


def test_custom_ops_opcheck():
    opcheck_custom_ops(registry.get(OP, "triton").custom_ops, SPEC, (5, 33))


def test_traced_whole_by_torch_compile():
    # Dynamo traces the custom op, AOTAutograd its composed backward (the op on dy)
    x = torch.randn(3, 17, 33)
    compile_grads_match(lambda t: kernellab.transpose(t, backend="triton"), _expected, [x], rtol=0, atol=0)


# --------------------------------------------------------------------------- CUDA, without a GPU


def test_launcher_reads_rows_in_place_and_packs_other_layouts():
    base = torch.randn(4, 50, 72)
    x3, b, r, c, ldx, bsx = tcuda._rows(base[1:3, 2:34, 8:72])  # rows sliced: read in place
    assert (b, r, c, ldx, bsx) == (2, 32, 64, 72, 50 * 72)
    assert x3.data_ptr() == base[1, 2, 8].data_ptr()
    assert tcuda.vector_ok(x3, r, c, ldx, bsx)  # 8 * 4 B = 32 B offset: 16-byte aligned rows
    x3, *_, ldx, bsx = tcuda._rows(base[0, 1:33, 1:65])  # a one-element offset: no 16-byte rows
    assert not tcuda.vector_ok(x3, 32, 64, ldx, bsx)
    x3, b, r, c, ldx, bsx = tcuda._rows(base[:1, :1].expand(3, 40, 72))  # stride 0: in place
    assert (b, ldx, bsx) == (3, 0, 0) and tcuda.vector_ok(x3, r, c, ldx, bsx)
    x3, *_ = tcuda._rows(base.transpose(-2, -1))  # no unit column stride: packed
    assert x3.is_contiguous() and torch.equal(x3, base.transpose(-2, -1))
    x3, b, r, c, ldx, bsx = tcuda._rows(base[:, :, ::2])
    assert x3.is_contiguous() and (b, r, c, ldx, bsx) == (4, 50, 36, 36, 50 * 36)
    for shape, ok in (((64, 36), True), ((64, 34), False), ((62, 36), False)):
        t = torch.randn(shape)
        assert tcuda.vector_ok(t, *shape, t.stride(0), 0) is ok, shape
        assert tcuda.vector_ok(t.bfloat16(), *shape, t.stride(0), 0) is (
            ok and shape[1] % 8 == 0 and shape[0] % 8 == 0
        )


def _sass_lines(kernel, pattern):
    import re

    return [i for i, line in enumerate(kernel.sass.splitlines()) if re.search(pattern, line)]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_cuda_ladder_machine_code(arch, dtype):
    """What each rung changes, in the compiled code: v1 touches no shared memory; v2 and v3
    one shared store and one shared load per element, v3's tile one column wider; v4 four
    loads in flight before the first shared store; v5 16-byte global loads and stores and
    its four loads issued before the first shared store (the launch bounds' reason)."""
    es = 4 if dtype == "f32" else 2
    ptx = tcuda.MODULE.compile(arch, target="ptx").decode()
    ks, note = asm.analyze(ptx, tcuda.MODULE.compile(arch), lambda n: n.endswith("_" + dtype))
    names = {f"transpose_v{v}_{dtype}" for v in range(1, 6)} | {f"copy_tile_{dtype}"}
    assert {k.name for k in ks} == names, note
    kern = {int(k.name[11]): k for k in ks if k.name.startswith("transpose_v")}
    for v in range(1, 6):  # the backend filter of `kernellab asm` finds each rung's kernel alone
        keep = asm.cuda_backend_filter(f"cuda_v{v}", dtype)
        assert [n for n in names if keep(n)] == [f"transpose_v{v}_{dtype}"]
        assert kern[v].counts["ptx_local"] == 0
    assert kern[1].counts["ptx_shared"] == 0
    assert kern[2].counts["ptx_shared"] == kern[3].counts["ptx_shared"] == 2
    assert kern[5].counts["ptx_ld_global_v4"] == 4 and kern[5].counts["ptx_st_global_v4"] == 4
    if not HAS_CUOBJDUMP:
        return
    assert kern[1].counts["LDS"] == kern[1].counts["STS"] == 0
    for v in (2, 3):
        assert kern[v].counts["LDS"] == kern[v].counts["STS"] == 1, v
    assert kern[3].shared_bytes - kern[2].shared_bytes == 32 * es  # the padding column
    assert kern[5].counts["LDG_128"] == 4 and kern[5].counts["STG_128"] == 4
    assert kern[5].local_bytes == 0
    for v, load in ((4, r"\bLDG\b"), (5, r"\bLDG\.E\.128")):
        loads, stores = _sass_lines(kern[v], load), _sass_lines(kern[v], r"\bSTS\b")
        assert len(loads) == 4 and max(loads) < min(stores), (v, kern[v].sass)


def test_asm_cli_shows_the_rungs(cli_run):
    code, out = cli_run("asm", "transpose", "-b", "cuda_v2", "--arch", "sm_90", "--sass")
    assert code == 0, out
    assert "transpose_v2_f32" in out and "transpose_v3" not in out
    if HAS_CUOBJDUMP:
        assert "shared memory (1 LDS, 1 STS)" in out and "SASS transpose_v2_f32" in out
    code, out = cli_run("asm", "transpose", "-b", "cuda", "--dtype", "bf16", "--arch", "sm_90")
    assert code == 0, out
    assert "transpose_v5_bf16: 16-byte global loads" in out and "copy_tile" not in out


def test_every_rung_describes_what_it_changes():
    descriptions = {i.backend: i.description for i in kernellab.impls(OP)}
    for v in range(1, 6):
        assert descriptions[f"cuda_v{v}"].startswith(f"CUDA v{v}: ")
    assert "v5" in descriptions["cuda"]


# --------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "cuda_v1", "cuda_v2", "cuda_v3", "cuda_v4", "cuda_v5", "triton"])
def test_gpu_check_engine(backend):
    for dtype in DTYPES:
        rep = check_impl(registry.get(OP, backend), dtype, device="cuda", quick=True)
        assert rep.status == PASS, [(c.kind, c.name, c.detail) for c in rep.failures]


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "cuda_v4", "cuda_v5", "triton"])
@pytest.mark.parametrize(
    "shape", [(1024, 1024), (4104, 1032), (2, 1000, 3000), (3, 70000), (70000, 24)], ids=shape_id
)
def test_gpu_large_and_misaligned(backend, shape):
    for dtype in DTYPES:
        base = torch.randn(shape[:-1] + (shape[-1] + 8,), device="cuda").to(dtype)
        for x in (base[..., :-8], base[..., 1:-7], base[..., 8:]):  # aligned, one off, a row apart
            assert torch.equal(kernellab.transpose(x, backend=backend), _expected(x))


@pytest.mark.gpu
def test_gpu_many_bands_walk_the_grid():
    # 70000 matrices of 32 x 64 fp32: 70000 bands of v4 (> 65535 blocks along y)
    x = torch.randn(70000, 32, 64, device="cuda")
    for backend in ("cuda_v1", "cuda_v4", "cuda_v5"):
        assert torch.equal(kernellab.transpose(x, backend=backend), _expected(x))
