"""The ``torch`` attention backend (PyTorch's SDPA, the default on the CPU) where PyTorch's
own kernels go wrong or say something unclear:

- NaN/inf in q, k or v: the CPU's SDPA puts NaN and inf elsewhere than the float64
  reference (a NaN query row comes back as zeros); the backend must match the reference's
  NaN/+inf/-inf positions in the output and in every gradient, and keep ordinary inputs on
  SDPA;
- an output gradient with zero strides (expanded over batch and heads) reaches SDPA's
  backward as a contiguous copy;
- double backward through a fused SDPA kernel raises a clear RuntimeError naming the
  backend that supports it.
The last two are hooks on SDPA's node: in Python, or in C++ where the nodes extension is
built (``grad_hooks``: both ways).
"""

from __future__ import annotations

import itertools

import pytest
import torch

import kernellab
from kernellab.core.spec import relayout
from kernellab.ops.attention import attention_reference

NONFINITE = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf")}


def _devices():
    return ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _inputs(shape_q, s_k, dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(shape_q, generator=g)
    kv = shape_q[:-2] + (s_k, shape_q[-1])
    k, v = torch.randn(kv, generator=g), torch.randn(kv, generator=g)
    return [t.to(device=device, dtype=dtype) for t in (q, k, v)], g


def _same_nonfinite(got, ref, what):
    got, ref = got.double().cpu(), ref.double().cpu()
    for name, pick in (("NaN", torch.isnan), ("+inf", torch.isposinf), ("-inf", torch.isneginf)):
        g, r = pick(got), pick(ref)
        assert torch.equal(g, r), (
            f"{what}: {name} at {int((g & ~r).sum())} positions where the reference has none, "
            f"missing at {int((r & ~g).sum())}"
        )
    finite = torch.isfinite(ref)
    torch.testing.assert_close(got[finite], ref[finite], atol=5e-2, rtol=5e-2, msg=what)


# (S_q, S_k): square; causal with keys ahead (S_q < S_k); causal with query rows that see
# no key (S_q > S_k, where v's NaN/inf must still reach them as 0 * NaN); and one past
# the CPU kernel's 64-row blocks, where SDPA skipped masked blocks differently.
LENGTHS = [(5, 5), (4, 9), (9, 4), (70, 133)]


def _case_id(which, val, causal, lengths):
    return f"{which}{val}-{'causal' if causal else 'full'}-{lengths[0]}x{lengths[1]}"


CASES = [
    pytest.param(which, val, causal, s, id=_case_id(which, val, causal, s))
    for which, val, causal, s in itertools.product("qkv", NONFINITE, (False, True), LENGTHS)
]


# The default on the CPU is torch; manual, its fallback for non-finite inputs, apart (on an
# AMX CPU PyTorch's bf16 GEMM spread a NaN of P's row into the next row: manual's PV in
# fp32). On a GPU the default and, apart, the torch backend.
# On a GPU neither PyTorch's CUDA SDPA nor our fused kernels follow the reference for every
# non-finite input (H100/H200, torch 2.11): SDPA differs with NaN/inf in q, k or v, causal
# or not; our Triton and CUDA kernels with a causal mask: the reference's dense products
# carry a non-finite q, k or v through masked entries (0 x NaN) that a fused kernel zeroes
# or skips whole (the Triton kernel under the CPU interpreter fails the same cases).
# The CPU's fix (_finite_on_cpu: a host-side test, then the manual path) would synchronize
# the device on every call. Until a sync-free fix exists these are expected to fail; one
# that starts to pass fails the test, so the list stays true. It names each case with the
# backend that runs it; a default case is looked up under the backend the default picks
# there (it follows the device's tuning table, so it is read at run time).
CUDA_NONFINITE_KNOWN = frozenset(
    """
    k-inf-causal-4x9-bf16-cuda-cuda k-inf-causal-4x9-bf16-cuda-torch k-inf-causal-4x9-fp32-cuda-torch
    k-inf-causal-4x9-fp32-cuda-triton k-inf-causal-5x5-fp32-cuda-torch k-inf-causal-70x133-fp32-cuda-torch
    k-inf-causal-9x4-bf16-cuda-cuda k-inf-causal-9x4-bf16-cuda-torch k-inf-causal-9x4-fp32-cuda-torch
    k-inf-full-4x9-fp32-cuda-torch k-inf-full-5x5-fp32-cuda-torch k-inf-full-70x133-fp32-cuda-torch
    k-inf-full-9x4-fp32-cuda-torch kinf-causal-4x9-fp32-cuda-torch kinf-causal-5x5-bf16-cuda-cuda
    kinf-causal-5x5-bf16-cuda-torch kinf-causal-5x5-fp32-cuda-torch kinf-causal-5x5-fp32-cuda-triton
    kinf-causal-70x133-bf16-cuda-cuda kinf-causal-70x133-bf16-cuda-torch kinf-causal-70x133-fp32-cuda-torch
    kinf-causal-70x133-fp32-cuda-triton kinf-causal-9x4-bf16-cuda-cuda kinf-causal-9x4-bf16-cuda-torch
    kinf-causal-9x4-fp32-cuda-torch kinf-causal-9x4-fp32-cuda-triton kinf-full-4x9-fp32-cuda-torch
    kinf-full-5x5-fp32-cuda-torch kinf-full-70x133-fp32-cuda-torch kinf-full-9x4-fp32-cuda-torch
    knan-causal-9x4-bf16-cuda-cuda knan-causal-9x4-bf16-cuda-torch knan-causal-9x4-fp32-cuda-torch
    q-inf-causal-4x9-bf16-cuda-cuda q-inf-causal-4x9-bf16-cuda-torch q-inf-causal-4x9-fp32-cuda-torch
    q-inf-causal-4x9-fp32-cuda-triton q-inf-causal-5x5-bf16-cuda-cuda q-inf-causal-5x5-bf16-cuda-torch
    q-inf-causal-5x5-fp32-cuda-torch q-inf-causal-5x5-fp32-cuda-triton q-inf-causal-70x133-bf16-cuda-cuda
    q-inf-causal-70x133-bf16-cuda-torch q-inf-causal-70x133-fp32-cuda-torch
    q-inf-causal-70x133-fp32-cuda-triton q-inf-causal-9x4-bf16-cuda-cuda q-inf-causal-9x4-bf16-cuda-torch
    q-inf-causal-9x4-fp32-cuda-torch qinf-causal-4x9-bf16-cuda-cuda qinf-causal-4x9-bf16-cuda-torch
    qinf-causal-4x9-fp32-cuda-torch qinf-causal-4x9-fp32-cuda-triton qinf-causal-5x5-bf16-cuda-cuda
    qinf-causal-5x5-bf16-cuda-torch qinf-causal-5x5-fp32-cuda-torch qinf-causal-5x5-fp32-cuda-triton
    qinf-causal-70x133-bf16-cuda-cuda qinf-causal-70x133-bf16-cuda-torch qinf-causal-70x133-fp32-cuda-torch
    qinf-causal-70x133-fp32-cuda-triton qinf-causal-9x4-bf16-cuda-cuda qinf-causal-9x4-bf16-cuda-torch
    qinf-causal-9x4-fp32-cuda-torch qnan-causal-4x9-bf16-cuda-cuda qnan-causal-4x9-bf16-cuda-torch
    qnan-causal-4x9-fp32-cuda-torch qnan-causal-4x9-fp32-cuda-triton qnan-causal-5x5-bf16-cuda-cuda
    qnan-causal-5x5-bf16-cuda-torch qnan-causal-5x5-fp32-cuda-torch qnan-causal-5x5-fp32-cuda-triton
    qnan-causal-70x133-bf16-cuda-cuda qnan-causal-70x133-bf16-cuda-torch qnan-causal-70x133-fp32-cuda-torch
    qnan-causal-70x133-fp32-cuda-triton qnan-causal-9x4-bf16-cuda-cuda qnan-causal-9x4-bf16-cuda-torch
    qnan-causal-9x4-fp32-cuda-torch v-inf-causal-4x9-bf16-cuda-cuda v-inf-causal-4x9-bf16-cuda-torch
    v-inf-causal-4x9-fp32-cuda-torch v-inf-causal-4x9-fp32-cuda-triton v-inf-causal-5x5-bf16-cuda-cuda
    v-inf-causal-5x5-bf16-cuda-torch v-inf-causal-5x5-fp32-cuda-torch v-inf-causal-5x5-fp32-cuda-triton
    v-inf-causal-70x133-bf16-cuda-cuda v-inf-causal-70x133-bf16-cuda-torch
    v-inf-causal-70x133-fp32-cuda-torch v-inf-causal-70x133-fp32-cuda-triton v-inf-causal-9x4-bf16-cuda-cuda
    v-inf-causal-9x4-bf16-cuda-torch v-inf-causal-9x4-fp32-cuda-torch v-inf-causal-9x4-fp32-cuda-triton
    v-inf-full-4x9-bf16-cuda-torch v-inf-full-4x9-fp32-cuda-torch v-inf-full-5x5-bf16-cuda-torch
    v-inf-full-5x5-fp32-cuda-torch v-inf-full-70x133-bf16-cuda-torch v-inf-full-70x133-fp32-cuda-torch
    v-inf-full-9x4-bf16-cuda-torch v-inf-full-9x4-fp32-cuda-torch vinf-causal-4x9-bf16-cuda-cuda
    vinf-causal-4x9-bf16-cuda-torch vinf-causal-4x9-fp32-cuda-torch vinf-causal-4x9-fp32-cuda-triton
    vinf-causal-5x5-bf16-cuda-cuda vinf-causal-5x5-bf16-cuda-torch vinf-causal-5x5-fp32-cuda-torch
    vinf-causal-5x5-fp32-cuda-triton vinf-causal-70x133-bf16-cuda-cuda vinf-causal-70x133-bf16-cuda-torch
    vinf-causal-70x133-fp32-cuda-torch vinf-causal-70x133-fp32-cuda-triton vinf-causal-9x4-bf16-cuda-cuda
    vinf-causal-9x4-bf16-cuda-torch vinf-causal-9x4-fp32-cuda-torch vinf-causal-9x4-fp32-cuda-triton
    vinf-full-4x9-bf16-cuda-torch vinf-full-4x9-fp32-cuda-torch vinf-full-5x5-bf16-cuda-torch
    vinf-full-5x5-fp32-cuda-torch vinf-full-70x133-bf16-cuda-torch vinf-full-70x133-fp32-cuda-torch
    vinf-full-9x4-bf16-cuda-torch vinf-full-9x4-fp32-cuda-torch vnan-causal-9x4-bf16-cuda-cuda
    vnan-causal-9x4-bf16-cuda-torch vnan-causal-9x4-fp32-cuda-torch vnan-causal-9x4-fp32-cuda-triton
    """.split()
)
DEVICE_BACKENDS = [
    pytest.param("cpu", None, id="cpu-default"),
    pytest.param("cpu", "manual", id="cpu-manual"),
    pytest.param("cuda", None, id="cuda-default", marks=pytest.mark.gpu),
    pytest.param("cuda", "torch", id="cuda-torch", marks=pytest.mark.gpu),
]


@pytest.mark.parametrize("device,backend", DEVICE_BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("which,val,causal,lengths", CASES)
def test_default_attention_nonfinite_matches_reference(
    request, device, backend, dtype, which, val, causal, lengths
):
    case = request.node.callspec.id
    if device == "cuda" and backend is None:
        runs = _default_pick(dtype, which, causal, lengths)
        case = case.removesuffix("-default") + f"-{runs}"
    known = case in CUDA_NONFINITE_KNOWN
    try:
        _nonfinite_case(device, backend, dtype, which, val, causal, lengths)
    except AssertionError as e:
        if known:
            pytest.xfail(f"PyTorch's CUDA SDPA places NaN/inf unlike the reference (known): {str(e)[:200]}")
        raise
    assert not known, "this case now matches the reference: remove it from CUDA_NONFINITE_KNOWN"


@pytest.mark.parametrize("which,val,causal,lengths", [c for c in CASES if c.values[2]])
def test_triton_nonfinite_cases_under_the_interpreter_are_the_known_ones(which, val, causal, lengths):
    """The Triton kernel (fp32) under the CPU interpreter misses the reference at exactly the
    causal cases CUDA_NONFINITE_KNOWN lists for it on a GPU, so its triton entries are
    checked here without one."""
    case = _case_id(which, val, causal, lengths) + "-fp32-cuda-triton"
    try:
        _nonfinite_case("cpu", "triton", torch.float32, which, val, causal, lengths)
    except AssertionError:
        assert case in CUDA_NONFINITE_KNOWN, f"{case} misses the reference and is not listed"
        return
    assert case not in CUDA_NONFINITE_KNOWN, f"{case} now matches the reference: remove it from the list"


def _default_pick(dtype, which, causal, lengths):
    """The backend the default runs for ``_nonfinite_case``'s call with gradients on."""
    s_q, s_k = lengths
    (q, k, v), _ = _inputs((1, 2, s_q, 16), s_k, dtype, "cuda", seed=0)
    leaves = [a.requires_grad_() for a in (q, k, v)]
    kw = {"causal": causal, "scale": None}
    name = kernellab.registry.choose("attention", leaves, "cuda", kwargs=kw)[0]
    # a chosen backend that refuses the call falls back to torch (registry.call)
    impl = kernellab.registry.get("attention", name)
    return name if kernellab.registry._validates(impl, leaves, kw) else "torch"


def _nonfinite_case(device, backend, dtype, which, val, causal, lengths):
    if device == "cpu":
        assert kernellab.registry.default_backend("attention", "cpu") == "torch"
    s_q, s_k = lengths
    (q, k, v), g = _inputs((1, 2, s_q, 16), s_k, dtype, device, seed=s_q * 1000 + s_k)
    t = {"q": q, "k": k, "v": v}[which]
    t[0, 1, min(2, t.shape[-2] - 1), 3] = NONFINITE[val]
    leaves = [a.clone().requires_grad_() for a in (q, k, v)]
    ref_leaves = [a.double().cpu().requires_grad_() for a in (q, k, v)]
    out = kernellab.attention(*leaves, causal, backend=backend)
    ref = attention_reference(*ref_leaves, causal)
    _same_nonfinite(out, ref, "output")
    dy = torch.randn(ref.shape, generator=g).double()
    got = torch.autograd.grad(out, leaves, dy.to(device=device, dtype=dtype))
    want = torch.autograd.grad(ref, ref_leaves, dy)
    for name, a, b in zip("qkv", got, want):
        _same_nonfinite(a, b, f"d{name}")


@pytest.mark.parametrize("opts", [{}, {"causal": True}, {"causal": True, "window": (3, 0)}], ids=str)
def test_torch_attention_nonfinite_window_and_3d(opts):
    (q, k, v), _ = _inputs((3, 11, 8), 11, torch.float32, "cpu", seed=7)
    q[1, 4, 0] = float("nan")
    k[2, 6, 5] = float("inf")
    out = kernellab.attention(q, k, v, backend="torch", **opts)
    _same_nonfinite(out, attention_reference(q.double(), k.double(), v.double(), **opts), "output")


def test_torch_attention_finite_inputs_stay_on_sdpa():
    """The NaN/inf guard must not send ordinary inputs (huge but finite ones included)
    away from PyTorch's kernel: the output's autograd node is SDPA's."""
    (q, k, v), _ = _inputs((2, 3, 17, 16), 17, torch.float32, "cpu", seed=3)
    q[0, 0, 0] = 1e4
    out = kernellab.attention(*(t.requires_grad_() for t in (q, k, v)), backend="torch")
    assert type(out.grad_fn).__name__.startswith("ScaledDotProduct"), type(out.grad_fn).__name__
    q2 = q.detach().clone()
    q2[0, 0, 0, 0] = float("nan")
    out = kernellab.attention(q2.requires_grad_(), k, v, backend="torch")
    assert not type(out.grad_fn).__name__.startswith("ScaledDotProduct")


class _Counting:
    """The nodes extension, counting its sdpa_grad_hooks calls (the C++ hooks put)."""

    def __init__(self, mod):
        self.mod, self.calls = mod, 0

    def sdpa_grad_hooks(self, o):
        self.calls += 1
        return self.mod.sdpa_grad_hooks(o)

    def __getattr__(self, name):
        return getattr(self.mod, name)


@pytest.fixture(params=["python", "cpp"])
def grad_hooks(request):
    """SDPA's gradient hooks in Python (cpp_nodes off) or C++ (the nodes built); yields a
    check that the wanted ones were put."""
    if request.param == "python":
        with kernellab.config.override(cpp_nodes="off"):
            yield lambda: None
        return
    from kernellab.cuda import nodes

    request.getfixturevalue("cpp_nodes_on")
    counting = _Counting(nodes._STATE["module"])
    nodes._STATE["module"] = counting

    def check():
        assert counting.calls > 0, "the C++ hooks were not put"

    yield check


def _sdpa_node(out):
    todo, seen = [out.grad_fn], set()
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if type(node).__name__.startswith("ScaledDotProduct"):
            return node
        todo.extend(f for f, _ in node.next_functions)
    raise AssertionError("no SDPA node under the output")


@pytest.mark.parametrize(
    "shape_q,s_k,causal",
    [
        ((2, 3, 37, 64), 37, False),
        ((2, 3, 37, 64), 37, True),
        ((2, 3, 29, 32), 13, True),
        ((6, 37, 64), 37, False),
    ],
    ids=["layout-shape", "causal", "causal-rows-without-keys", "3d"],
)
def test_torch_attention_expanded_grad_reaches_sdpa_contiguous(shape_q, s_k, causal, grad_hooks):
    """An output gradient expanded over batch and heads (stride 0, the check's "expanded"
    layout) is handed to SDPA's backward as a contiguous copy, and the gradients are those
    of the same values laid out contiguously."""
    (q, k, v), g = _inputs(shape_q, s_k, torch.float32, "cpu", seed=11)
    dy_full = torch.randn(shape_q[:-1] + (v.shape[-1],), generator=g)
    dy = relayout(dy_full, "expanded")
    assert 0 in dy.stride()
    grads = []
    for d in (dy, dy.contiguous()):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = kernellab.attention(*leaves, causal, backend="torch")
        seen = []
        _sdpa_node(out).register_prehook(lambda go: seen.append(go[0].stride()))
        grads.append(torch.autograd.grad(out, leaves, d))
        assert seen and all(0 not in st for st in seen), f"SDPA's backward got dy with strides {seen}"
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)
    grad_hooks()


@pytest.mark.parametrize("device", _devices())
@pytest.mark.parametrize(
    "shape_q,s_k,causal", [((2, 3, 9, 16), 9, False), ((3, 9, 16), 5, True)], ids=["4d", "3d"]
)
def test_torch_attention_double_backward_clear_error(device, shape_q, s_k, causal, grad_hooks):
    dtype = torch.float16 if device == "cuda" else torch.float32  # a fused kernel on both
    (q, k, v), _ = _inputs(shape_q, s_k, dtype, device, seed=5)
    leaves = [t.requires_grad_() for t in (q, k, v)]
    out = kernellab.attention(*leaves, causal, backend="torch")
    grads = torch.autograd.grad(out.float().sum(), leaves, create_graph=True)
    first = torch.autograd.grad(out.float().sum(), leaves, retain_graph=True)
    for a, b in zip(grads, first):  # the first-order values are untouched
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    with pytest.raises(RuntimeError, match=r"attention/torch: double backward .* backend='manual'"):
        torch.autograd.grad(sum(x.float().sum() for x in grads), leaves)
    assert kernellab.get("attention", "manual").double_backward  # the backend the message names
    grad_hooks()
