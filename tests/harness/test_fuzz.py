"""The check's fuzz stage: problems drawn from each op's generator (``OpSpec.fuzz``),
forward and every gradient, at shapes no list names.

- every op has a generator, and its draws are problems the float64 reference and
  PyTorch's own op accept (a generator that draws invalid problems would only test
  refusals), over many seeds, at the CPU sizes and at the GPU's model sizes;
- the draws depend on the seed alone: every backend sees the same problems;
- our Triton kernels (under the interpreter) pass the fuzz stage on the CPU, one fixed
  seed per op (a failure replays: ``kernellab check OP --fuzz 3 --fuzz-only --seed S``);
- the stage catches a kernel that is right at every listed shape and wrong elsewhere.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

import kltest
from kernellab.core import registry
from kernellab.core.spec import fuzz_dim, get_spec, shape_str
from kernellab.harness.check import check_impl

OPS = registry.op_names()


def _draw(spec, rng, big):
    problem = spec.draw_fuzz(rng, big)
    assert problem is not None, f"{spec.name}: no fuzz generator (OpSpec.fuzz)"
    return problem


def test_fuzz_dim_stays_in_range_and_hits_tile_edges():
    rng = random.Random(0)
    seen = [fuzz_dim(rng, 1, 5000) for _ in range(2000)]
    assert min(seen) >= 1 and max(seen) <= 5000
    edges = {(1 << k) + d for k in range(1, 13) for d in (-1, 0, 1)}
    assert len(set(seen) & edges) >= 20, "powers of two and their neighbours should come up often"
    assert len(set(seen) - edges) >= 500, "most draws are anywhere in the range"
    assert fuzz_dim(rng, 7, 7) == 7


@pytest.mark.parametrize("big", [False, True], ids=["cpu-sizes", "gpu-sizes"])
@pytest.mark.parametrize("op", OPS)
def test_generator_draws_valid_problems(op, big):
    """50 draws, each of a form the op's listed shapes have (rank). At the CPU sizes the
    inputs build, the op's validation accepts them, and the float64 reference and
    PyTorch's op compute them with the same output shapes (at the GPU's model sizes the
    reference would take minutes on this CPU: the forms are checked, and the sizes stay
    under 2^31 elements per tensor)."""
    spec = get_spec(op)
    rng = random.Random(kltest.seed_for(op, big))
    torch_impl = registry.get(op, "torch")
    ranks = {len(s) for s in spec.test_shapes + spec.quick_shapes + spec.gradient_shapes + [spec.layout_shape]}
    for i in range(50):
        shape, opts = _draw(spec, rng, big)
        assert all(isinstance(d, int) and d >= 1 for d in shape), (op, shape)
        assert len(shape) in ranks, (op, shape, ranks)
        if big:
            assert math.prod(shape) < 2**31 or op in ("matmul", "attention", "conv2d", "linear_cross_entropy"), (op, shape)
            continue
        gen = torch.Generator().manual_seed(i)
        args = spec.make_inputs(shape, torch.float32, "cpu", i)
        args, kwargs = spec.option_case(args, opts, torch.float32, "cpu", gen)
        spec.validate(args, kwargs)
        ref = spec.ref(*args, **kwargs)
        out = torch_impl.fn(*args, **kwargs)
        for r, o in zip(ref if isinstance(ref, tuple) else (ref,), out if isinstance(out, tuple) else (out,)):
            assert tuple(r.shape) == tuple(o.shape), (op, shape_str(shape), opts)


@pytest.mark.parametrize("op", ["attention", "conv2d", "matmul", "softmax"])
def test_every_backend_sees_the_same_problems(op):
    """The stage's problems come from the seed alone: two backends, and a second run, list
    the same case names."""
    names = []
    for backend in ("manual", "torch", "manual"):
        rep = check_impl(registry.get(op, backend), torch.float32, device="cpu", quick=True, seed=11, fuzz=3,
                         only_fuzz=True)  # fmt: skip
        # (a failed case names its gradient after the problem: "grad ... dv")
        names.append([c.name.rsplit(" ", 1)[0] if c.status == "fail" else c.name for c in rep.cases])
    assert names[0] == names[1] == names[2] and len(names[0]) >= 3


# Our Triton kernels under the interpreter, three problems each, fp32 (the interpreter's
# bf16 truncates); attention in fp16 as well. Seeds fixed so CI is repeatable.
# (each op's first dtype: fp32; histogram's uint8 keys)
TRITON_CASES = [
    pytest.param(op, get_spec(op).dtypes[0], id=f"{op}-{kltest.dtype_id(get_spec(op).dtypes[0])}")
    for op in registry.op_names()
    if "triton" in kltest.cpu_backends(op)
] + [pytest.param("attention", torch.float16, id="attention-fp16")]


@pytest.mark.parametrize(("op", "dtype"), TRITON_CASES)
def test_triton_passes_fuzzed_problems(op, dtype):
    rep = check_impl(registry.get(op, "triton"), dtype, device="cpu", quick=True,
                     seed=kltest.seed_for("fuzz", op) % 100_000, fuzz=3, only_fuzz=True)  # fmt: skip
    fuzz = [c for c in rep.cases if c.kind == "fuzz"]
    assert len(fuzz) >= 3
    assert rep.status == "pass", "; ".join(f"{c.name}: {c.detail}" for c in rep.failures) + f" (seed {rep.seed})"


def test_fuzz_catches_a_kernel_wrong_only_off_the_lists(planted):
    """A softmax that is exact at every width the check lists and wrong at any other
    width past 64 passes the fixed stages; the fuzz stage fails it."""
    spec = get_spec("softmax")
    listed = {s[-1] for s in spec.test_shapes + spec.quick_shapes + [spec.layout_shape, spec.reach]}
    listed |= {s[-1] for s in spec.gradient_shapes}

    def sloppy(x, dim=-1):
        y = torch.softmax(x.float(), dim).to(x.dtype)
        if x.shape[-1] > 64 and x.shape[-1] not in listed:
            y = y * 1.01
        return y

    impl = planted("softmax", "planted_off_list", sloppy, devices=("cpu",))
    fixed = check_impl(impl, torch.float32, device="cpu", quick=True, seed=5)
    assert not [c for c in fixed.failures if c.kind != "fuzz"]
    fuzzed = check_impl(impl, torch.float32, device="cpu", quick=True, seed=5, fuzz=12, only_fuzz=True)
    assert fuzzed.status == "fail" and all(c.kind == "fuzz" for c in fuzzed.failures)


# On a GPU: each of our backends (triton*, cuda*, tiled) on problems of model sizes, fp32
# and bf16, two problems each; the teaching ladder's first rungs (cuda_v1 .. v3 of matmul,
# softmax and sum) are left to `kernellab check --fuzz` (a naive matmul at 4096^3 takes
# seconds a call).
def _gpu_cases():
    from kernellab.harness.results import is_ours

    slow = {"matmul": ("cuda_v1", "cuda_v2", "cuda_v3"), "softmax": ("cuda_v1",), "sum": ("cuda_v1",),
            "attention": ("cuda_v1",)}  # fmt: skip
    out = []
    for op in registry.op_names():
        for backend in kltest.cuda_backends(op):
            if not is_ours(backend) or backend in slow.get(op, ()):
                continue
            for dtype in (torch.float32, torch.bfloat16):
                out.append(pytest.param(op, backend, dtype, id=f"{op}-{backend}-{kltest.dtype_id(dtype)}",
                                        marks=[pytest.mark.gpu]))  # fmt: skip
    return out


@pytest.mark.parametrize(("op", "backend", "dtype"), _gpu_cases())
def test_gpu_ours_pass_fuzzed_model_sized_problems(op, backend, dtype):
    impl = registry.get(op, backend)
    if dtype not in (impl.dtypes or get_spec(op).dtypes):
        pytest.skip(f"{backend} does not take {dtype}")
    rep = check_impl(impl, dtype, device="cuda", quick=True, seed=kltest.seed_for("gpu-fuzz", op) % 100_000,
                     fuzz=2, only_fuzz=True)  # fmt: skip
    assert [c for c in rep.cases if c.kind == "fuzz"]
    assert rep.status == "pass", "; ".join(f"{c.name}: {c.detail}" for c in rep.failures) + f" (seed {rep.seed})"
