"""Helpers shared by kernellab's tests (imported as ``kltest``; conftest puts tests/ on
sys.path).

Tests never import a backend by name: they ask the registry which implementations can
run where (DESIGN.md, "Style" point 6).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zlib

import pytest
import torch

import kernellab
from kernellab.core.spec import dtype_name, shape_str

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# Odd shapes: one element, primes, block size +- 1 (1023/1025 around 1024), an empty
# tensor with a zero in the middle of its shape, and rows wider than a power of two.
ODD_SHAPES = [(1,), (17,), (1023,), (1025,), (3, 0, 5), (129, 1000)]
# Layouts every input is tried in besides contiguous (see OpSpec.make_inputs).
LAYOUTS = ("transposed", "sliced", "offset", "expanded")
# Element counts around a streaming kernel's program size B, as (whole blocks, extra):
# one partial program only, one short of a block, one whole block, one over, and three
# whole blocks before a partial one (``block_edge``).
BLOCK_EDGES = {"1": (0, 1), "B-1": (1, -1), "B": (1, 0), "B+1": (1, 1), "3B+7": (3, 7)}

# torch.compile takes seconds per dtype and shape on the CPU: it is tested on its own,
# sparingly, not in the big matrix.
SLOW_BACKENDS = ("compile",)


def _own_file(backend: str) -> bool:
    """Numba backends (fp32/fp16 only; on the CPU only under Numba's simulator, which must be
    on before numba is imported) are tested in tests/ops/test_numba.py, not in the matrices."""
    return backend.startswith("numba")


def block_edge(edge: str, block: int) -> int:
    """The element count ``BLOCK_EDGES[edge]`` for programs of ``block`` elements."""
    whole, extra = BLOCK_EDGES[edge]
    return whole * block + extra


def dtype_id(dtype) -> str:
    return dtype_name(dtype)


def shape_id(shape) -> str:
    return shape_str(shape)


def seed_for(*parts) -> int:
    """A reproducible seed per test case (a failure re-runs with the same inputs)."""
    return zlib.crc32(repr(parts).encode()) & 0x7FFFFFFF


def cpu_backends(op: str, exclude=SLOW_BACKENDS) -> list[str]:
    """Backends of ``op`` the registry says run on CPU tensors here."""
    return [
        i.backend
        for i in kernellab.impls(op)
        if i.backend not in exclude and not _own_file(i.backend) and i.why_unavailable("cpu") is None
    ]


def cuda_backends(op: str, exclude=SLOW_BACKENDS) -> list[str]:
    """Backends of ``op`` that run on CUDA tensors on a GPU machine (here: all whose only
    obstacle is the missing GPU)."""
    out = []
    for i in kernellab.impls(op):
        if i.backend in exclude or _own_file(i.backend) or "cuda" not in i.devices:
            continue
        if i.why_unavailable("cuda") in (None, "no GPU"):
            out.append(i.backend)
    return out


def backend_matrix(op: str, exclude=SLOW_BACKENDS) -> list:
    """pytest params (device, backend): CPU-capable backends on "cpu", and every
    CUDA-capable backend on "cuda" (marked ``gpu``, skipped without a GPU)."""
    params = [pytest.param("cpu", b, id=f"cpu-{b}") for b in cpu_backends(op, exclude)]
    params += [
        pytest.param("cuda", b, id=f"cuda-{b}", marks=pytest.mark.gpu) for b in cuda_backends(op, exclude)
    ]
    return params


def gpu_only_backends(op: str) -> list[str]:
    return [i.backend for i in kernellab.impls(op) if tuple(i.devices) == ("cuda",)]


def reference_grads(spec, args, dy):
    """Autograd of the float64 reference: gradients w.r.t. spec.grad_args, in float64."""
    from kernellab.core.spec import to64

    args64 = [to64(a) for a in args]
    for i in spec.grad_args:
        args64[i].requires_grad_(True)
    out = spec.reference(*args64)
    return torch.autograd.grad(out, [args64[i] for i in spec.grad_args], dy.to(torch.float64))


def impl_grads(fn, spec, args, dy):
    """Gradients of ``fn(*args)`` w.r.t. spec.grad_args (fresh leaves, strides kept)."""
    leaves = [
        a.detach().requires_grad_(i in spec.grad_args) if isinstance(a, torch.Tensor) else a
        for i, a in enumerate(args)
    ]
    out = fn(*leaves)
    assert out.requires_grad, "output does not require grad: the implementation has no autograd"
    return torch.autograd.grad(out, [leaves[i] for i in spec.grad_args], dy)


def rounds_like_torch(backend: str, dtype, device: str) -> bool:
    """Whether ``backend`` rounds its fp32 result to ``dtype`` as PyTorch does (round to
    nearest even), so that e.g. add is bit-identical to torch.add.

    Not under the Triton CPU interpreter for bf16: Triton 3.9's interpreter converts
    fp32 -> bf16 by truncation (round toward zero), while compiled Triton on a GPU rounds
    to nearest even. The result is still within the check's bound, just not bit-equal.
    """
    from kernellab import device as kl_device

    if backend == "triton" and dtype == torch.bfloat16 and device == "cpu" and kl_device.triton_interpreted():
        return False
    return True


def launched_cuda_kernels(fn, prefix: str = "") -> list[str]:
    """Names of the CUDA kernels ``fn()`` launches (seen by the profiler, so it does not
    depend on how kernellab looks its kernels up or caches them)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = [
        e.name
        for e in prof.events()
        if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False)
    ]
    return [n for n in names if n.startswith(prefix)]


# Modules made by tests stay alive for the whole session: kernellab caches launchers by
# module, and a module freed mid-session could hand its id to the next one.
KEEP_ALIVE: list = []


def register_as_on_a_gpu(monkeypatch) -> None:
    """Make ``kit.build`` register Triton backends as it does on a GPU (``triton_op``, each
    launch traced through ``wrap_triton``), run here by the interpreter. Triton's driver is
    stood in for by an sm_90 target: torch reads a kernel's TTIR to see which tensors it
    writes. Only ops built after this call are registered so."""
    import triton
    from triton.backends.compiler import GPUTarget

    from kernellab.core import kit

    class _Target:
        def get_current_target(self):
            return GPUTarget("cuda", 90, 32)

    monkeypatch.setattr(triton.runtime.driver, "_active", _Target())
    monkeypatch.setattr(kit, "_use_triton_op", lambda decl: decl.triton)


def opcheck_custom_ops(custom_ops, spec, shape, seed: int = 9) -> None:
    """``torch.library.opcheck`` of every custom op a kit-built callable carries
    (``fn.custom_ops``: (op, sample builder, _)), on CPU fp32 samples: the builders take
    ``make(requires_grad)`` (a random tensor of the problem shape) and ``make.args(rg)``
    (the spec's inputs at ``shape``)."""
    gen = torch.Generator().manual_seed(0)

    def make(rg):
        return torch.randn(*shape, generator=gen).requires_grad_(bool(rg))

    def args(rg):
        return tuple(a.requires_grad_(bool(rg)) for a in spec.make_inputs(shape, torch.float32, "cpu", seed))

    make.args = args
    assert custom_ops
    for op, build, _ in custom_ops:
        torch.library.opcheck(op, build(make))


def compile_grads_match(fn, reference, inputs, rtol: float = 1e-4, atol: float = 1e-5) -> None:
    """``torch.compile(fullgraph=True, backend="aot_eager")`` of ``fn(*inputs) * 2`` (Dynamo
    must trace the custom op whole, AOTAutograd its backward; Inductor's code generation
    adds nothing to that on the CPU and costs tens of seconds): every input's gradient
    equals eager ``reference``'s."""
    f = torch.compile(lambda *a: fn(*a) * 2, fullgraph=True, backend="aot_eager")
    leaves = [t.clone().requires_grad_() for t in inputs]
    f(*leaves).sum().backward()
    ref = [t.clone().requires_grad_() for t in inputs]
    (reference(*ref) * 2).sum().backward()
    for a, r in zip(leaves, ref):
        torch.testing.assert_close(a.grad, r.grad, rtol=rtol, atol=atol)


def backend_dtype_shape_params(backends, dtypes, shapes, big=None, big_skips=("triton",)) -> list:
    """pytest params (backend, dtype, shape) over every combination; ``big`` (a larger
    shape) joins the shapes of every backend but ``big_skips`` (the Triton interpreter is
    slow there)."""
    return [
        pytest.param(backend, dtype, shape, id=f"{shape_id(shape)}-{dtype_id(dtype)}-{backend}")
        for backend in backends
        for dtype in dtypes
        for shape in list(shapes) + ([big] if big is not None and backend not in big_skips else [])
    ]


def check_planted(op: str, name: str, fn, seed: int = 2, **kwargs):
    """The quick fp32 CPU check of ``fn`` registered for the duration as ``op``'s backend
    ``planted_<name>`` (a deliberate mistake the check must catch); returns the Report."""
    from kernellab.core import registry
    from kernellab.harness.check import check_impl

    registry.register(op, f"planted_{name}", devices=("cpu",))(fn)
    try:
        return check_impl(registry.get(op, f"planted_{name}"), torch.float32, device="cpu", quick=True, seed=seed,
                          **kwargs)  # fmt: skip
    finally:
        registry.unregister(op, f"planted_{name}")


def assert_per_channel_refusals(f, backend: str) -> None:
    """What every op of x [N, C, H, W] with a per-channel weight and bias and an ``eps``
    refuses, each error naming the argument (batch_norm2d, bn_relu_pool2d)."""
    x, w, b = torch.randn(2, 3, 4, 4), torch.ones(3), torch.zeros(3)
    with pytest.raises(ValueError, match=r"\bx\b.*4-D"):
        f(x[0], w, b, backend=backend)
    with pytest.raises(ValueError, match=r"\bx\b.*4-D"):
        f(x.unsqueeze(0), w, b, backend=backend)
    with pytest.raises(ValueError, match="weight"):
        f(x, torch.ones(4), b, backend=backend)
    with pytest.raises(ValueError, match="bias"):
        f(x, w, torch.zeros(1, 3), backend=backend)
    with pytest.raises(TypeError, match="bias"):
        f(x, w, b.half(), backend=backend)
    with pytest.raises(TypeError, match="bias"):
        f(x, w, None, backend=backend)
    for eps in (0.0, -1e-5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="eps"):
            f(x, w, b, eps, backend=backend)
    with pytest.raises(TypeError, match="eps"):
        f(x, w, b, None, backend=backend)
    if backend in ("manual", "torch", "compile"):  # the reference backends take float64
        assert f(x.double(), w.double(), b.double(), backend=backend).dtype == torch.float64
    else:
        with pytest.raises(TypeError, match=r"\bx\b"):
            f(x.double(), w.double(), b.double(), backend=backend)
    with pytest.raises(TypeError, match=r"\bx\b"):
        f(x.int(), w, b, backend=backend)



def nvrtc_log(cu_path, options, arch: str = "sm_90a") -> tuple[int, str]:
    """(0, NVRTC's log with ptxas's verbose output) for the .cu file at ``cu_path`` compiled
    for ``arch`` with ``options``, or (1, the error with the log) when it fails: what a test
    reads registers, spills and ptxas warnings from. The runtime's compile, so the log, PTX
    and cubin of one build come from one NVRTC run (cached on disk)."""
    from pathlib import Path

    from kernellab.cuda import runtime

    cu_path = Path(cu_path)
    try:
        log = runtime.compile_source(cu_path.read_text(), arch, options=tuple(options), base_dir=cu_path.parent,
                                     target="log", name=cu_path.name)  # fmt: skip
    except runtime.CudaError as e:
        return 1, str(e)
    return 0, log.decode(errors="replace")


_SM90_COMPILE = """
import importlib, json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction
a = json.loads(sys.argv[1])
mod, name = a["kernel"].rsplit(".", 1)
fn = getattr(importlib.import_module(mod), name)
fn = fn if isinstance(fn, JITFunction) else JITFunction(getattr(fn, "fn", fn))  # kernellab's lean jit
sig = {n: a["signature"][n] for n in fn.arg_names}
attrs = {(i,): [["tt.divisibility", 16]] for i in a["aligned_args"]}
k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=a["constexprs"], attrs=attrs),
                   target=GPUTarget("cuda", 90, 32), options=a["options"])
print(json.dumps(k.asm[a["asm"]]))
"""


_SM90_BATCH = """
import base64, importlib, json, sys
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction
out = []
for a in json.loads(sys.argv[1]):
    mod, name = a["kernel"].rsplit(".", 1)
    fn = getattr(importlib.import_module(mod), name)
    while not isinstance(fn, JITFunction):  # an autotuner's kernel, or kernellab's lean jit
        fn = fn.fn
    sig = {n: a["signature"][n] for n in fn.arg_names}
    cx = {k: getattr(tl, v["tl"]) if isinstance(v, dict) else v for k, v in a["constexprs"].items()}
    aligned = [fn.arg_names.index(i) if isinstance(i, str) else i for i in a["aligned_args"]]
    attrs = {(i,): [["tt.divisibility", 16]] for i in aligned}
    k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=cx, attrs=attrs),
                       target=GPUTarget("cuda", 90, 32), options=a["options"])
    out.append({"shared": k.metadata.shared, "ptx": k.asm["ptx"],
                "cubin": base64.b64encode(k.asm.get("cubin") or b"").decode()})
print(json.dumps(out))
"""


def _sm90_batch(specs: list[dict]) -> list[dict]:
    """Compile each spec for sm_90 in one subprocess (the interpreter off): per spec its
    shared memory, PTX and cubin (base64). A spec is ``compile_for_sm90``'s arguments as
    a dict (kernel, signature, constexprs, options, aligned_args); aligned_args may name
    the arguments, and a constexpr ``{"tl": "float32"}`` is that Triton dtype."""
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_DEFAULT_FP_FUSION="1")
    arg = json.dumps([dict(sp, aligned_args=list(sp["aligned_args"])) for sp in specs])
    cmd = [sys.executable, "-c", _SM90_BATCH, arg]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def sm90_global_accesses(specs: list[dict]) -> list[tuple[list[str], list[str]]]:
    """No GPU needed: per spec (``_sm90_batch``'s) the PTX's global loads and stores, each
    instruction as written (``ld.global.v4.b32``, ``st.global.b16``, ...)."""
    import re

    ptxs = [r["ptx"] for r in _sm90_batch(specs)]
    return [(re.findall(r"ld\.global\S*", p), re.findall(r"st\.global\S*", p)) for p in ptxs]


def sm90_resources(specs: list[dict]) -> list[dict]:
    """No GPU needed: compile each spec (``compile_for_sm90``'s arguments as a dict: kernel,
    signature, constexprs, options, aligned_args) for sm_90 in one subprocess; per spec its
    shared memory in bytes, the PTX's wgmma count and, where cuobjdump is found (Triton's
    wheel ships one), registers and local-memory bytes per thread (None otherwise)."""
    import base64

    from kernellab.inspect.asm import analyze

    out = []
    for r in _sm90_batch(specs):
        cubin = base64.b64decode(r["cubin"]) or None
        kernels, _ = analyze(r["ptx"], cubin)
        k = kernels[0]
        wgmma = r["ptx"].count("wgmma.mma_async")
        out.append(dict(shared=r["shared"], wgmma=wgmma, registers=k.registers, local_bytes=k.local_bytes))
    return out


def compile_for_sm90(kernel: str, signature: dict, constexprs: dict, options: dict, aligned_args, asm: str) -> str:
    """No GPU needed: compile the Triton kernel at dotted path ``kernel`` ahead of time for
    sm_90 (in a subprocess with the interpreter off) and return its ``asm`` ("ptx", "ttgir",
    ...). ``aligned_args``: indices of the pointer arguments declared 16-byte aligned, as
    fresh allocations are at run time."""
    spec = {"kernel": kernel, "signature": signature, "constexprs": constexprs, "options": options,
            "aligned_args": list(aligned_args), "asm": asm}  # fmt: skip
    env = dict(os.environ, TRITON_INTERPRET="0")
    proc = subprocess.run([sys.executable, "-c", _SM90_COMPILE, json.dumps(spec)], capture_output=True, text=True,
                          env=env, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-800:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def interleave_agents(
    producer_step, consumer_step, consumers: int, running, seed: int, limit: int, state=None
) -> None:
    """Run a model of a producer and ``consumers`` consumer agents one step at a time, each
    step by an agent drawn at random (``seed``) among those that can move: ``producer_step(go)``
    and ``consumer_step(w, go)`` say whether the agent can move and, with ``go``, make the move;
    ``running()`` whether any agent still has work. Fails on a deadlock (no agent can move;
    ``state()`` describes it) and after ``limit`` steps."""
    import random

    rng = random.Random(seed)
    steps = 0
    while running():
        ready = ["p"] * producer_step(False) + [w for w in range(consumers) if consumer_step(w, False)]
        assert ready, f"deadlock: {state() if state else ''}"
        who = rng.choice(ready)
        producer_step(True) if who == "p" else consumer_step(who, True)
        steps += 1
        assert steps < limit, f"no end after {limit} steps"


def interleave_items(producer_step, consumer_step, seq, prod, cons, seed: int, uses: int) -> None:
    """``interleave_agents`` for a model of items handed out in turn: the producer's state
    ``prod`` and each consumer's in ``cons`` start with the index of its item in ``seq``;
    the run ends once all are past the last, and may take a step budget that grows with the
    items and the ring's ``uses``."""
    interleave_agents(
        producer_step,
        consumer_step,
        len(cons),
        lambda: prod[0] < len(seq) or any(c[0] < len(seq) for c in cons),
        seed,
        40 * (uses + len(seq) + 10) * 9,
        lambda: f"producer {prod}, consumers {cons}",
    )


class PhaseBarrier:
    """A model of an mbarrier of ``count`` arrivals: ``phases`` completed so far."""

    def __init__(self, count: int):
        self.count, self.arrivals, self.phases = count, 0, 0

    def arrive(self) -> None:
        self.arrivals += 1
        if self.arrivals == self.count:
            self.arrivals, self.phases = 0, self.phases + 1


class RingModel:
    """A model of a ring of ``stages`` stages used in turn (use u in stage u % stages), each
    filled once its use u - stages has been read by every one of ``readers`` consumer warps
    (the stage's empty barrier) and read once filled (its full barrier); refilling a stage a
    warp still reads fails."""

    def __init__(self, stages: int, readers: int = 8):
        self.stages = stages
        self.full = [0] * stages
        self.empty = [PhaseBarrier(readers) for _ in range(stages)]
        self.reading = [set() for _ in range(stages)]

    def can_fill(self, u: int) -> bool:
        return u < self.stages or self.empty[u % self.stages].phases >= u // self.stages

    def fill(self, u: int) -> None:
        assert not self.reading[u % self.stages], "stage refilled while read"
        self.full[u % self.stages] += 1

    def is_reading(self, w: int, u: int) -> bool:
        return w in self.reading[u % self.stages]

    def can_read(self, u: int) -> bool:
        return self.full[u % self.stages] > u // self.stages

    def start_read(self, w: int, u: int) -> None:
        self.reading[u % self.stages].add(w)

    def end_read(self, w: int, u: int) -> None:
        self.reading[u % self.stages].discard(w)
        self.empty[u % self.stages].arrive()
