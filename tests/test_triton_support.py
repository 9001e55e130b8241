"""triton_support.Bound: a launch site's kernel launched through its cached compiled
launcher after the first call, and through ``kernel[grid]`` whenever a checked tensor is
misaligned, the current device differs, or the call is traced. On a CPU there is no lean
path (the interpreter), so the logic is exercised with a stand-in kernel class."""

from __future__ import annotations

import pytest
import torch
import triton.language as tl

from kernellab import triton_support
from kltest import BLOCK_EDGES, block_edge


class _FakeLean:
    """Stands in for triton_support's LeanJIT: ``[grid]`` is the slow path (recorded);
    ``lean_hit`` returns the compiled launcher once a call was made."""

    current = None  # the "current device" index (CPU tensors: None)

    def __init__(self):
        self.slow, self.fast = [], []

    def __getitem__(self, grid):
        def launch(*args, **kw):
            self.slow.append((grid, args, kw))

        return launch

    def lean_hit(self, args, kw):
        def run(g0, g1, g2, stream, function, packed, h1, h2, h3, *rest):
            self.fast.append(((g0, g1, g2), stream, function, packed, rest))

        if not self.slow:
            return None
        launch, pre = triton_support.fast_launcher(run, "fn", "packed")
        return launch, pre, ("EXTRA",)

    @staticmethod
    def raw_stream(dev):
        return "stream"

    @staticmethod
    def current_device():
        return _FakeLean.current


@pytest.fixture
def fake_lean(monkeypatch):
    monkeypatch.setattr(triton_support, "_LEAN_JIT", _FakeLean)
    _FakeLean.current = None
    return _FakeLean()


def test_bound_goes_direct_after_its_first_call(fake_lean):
    x, y = torch.zeros(64), torch.zeros(64)
    b = triton_support.Bound(fake_lean, (3, 2), {"BLOCK": 64, "num_warps": 4}, (0,))
    b(x, y, 7)  # first call: Triton's path, then the launcher is kept
    assert len(fake_lean.slow) == 1 and fake_lean.slow[0][0] == (3, 2) and fake_lean.slow[0][2]["BLOCK"] == 64
    b(x, y, 7)
    b(x, y, 9)
    assert len(fake_lean.slow) == 1 and len(fake_lean.fast) == 2
    grid, stream, fn, packed, rest = fake_lean.fast[-1]
    assert grid == (3, 2, 1) and stream == "stream" and (fn, packed) == ("fn", "packed")
    # the call's args (tensors as their addresses), then the constexprs
    assert rest == (x.data_ptr(), y.data_ptr(), 9, "EXTRA")


def test_bound_takes_the_slow_path_for_a_misaligned_checked_tensor(fake_lean):
    x = torch.zeros(65)
    b = triton_support.Bound(fake_lean, (1,), {}, (0,))
    b(x[:64])
    b(x[1:])  # 4 bytes off: not 16-byte aligned
    assert len(fake_lean.slow) == 2 and not fake_lean.fast
    b(x[:64])
    assert len(fake_lean.fast) == 1
    # an unchecked position may hold anything (the launcher's own fresh allocations)
    b2 = triton_support.Bound(fake_lean, (1,), {}, (0,))
    b2(x[:64], x[1:])
    b2(x[:64], x[1:])
    assert len(fake_lean.fast) == 2


def test_bound_takes_the_slow_path_on_another_device_or_when_traced(fake_lean):
    x = torch.zeros(64)
    b = triton_support.Bound(fake_lean, (1,), {}, (0,))
    b(x)
    _FakeLean.current = 1  # another current device than the one the launcher was found on
    b(x)
    assert len(fake_lean.slow) == 2 and not fake_lean.fast

    class Wrapped(torch.Tensor):  # what a traced call passes is not a plain Tensor
        pass

    _FakeLean.current = None
    b(x.as_subclass(Wrapped))
    assert len(fake_lean.slow) == 3 and not fake_lean.fast


def test_bound_without_a_lean_kernel_always_launches_through_triton(monkeypatch):
    calls = []

    class Plain:
        def __getitem__(self, grid):
            return lambda *a, **kw: calls.append(grid)

    b = triton_support.Bound(Plain(), (2,), {}, (0,))
    for _ in range(3):
        b(torch.zeros(4))
    assert calls == [(2,)] * 3 and b.hit is None


def test_bound_launches_the_tensors_it_is_given_now(fake_lean):
    """The launch passes each call's own tensors' addresses (a plan is per shape, its
    tensors are fresh every call), and a call whose tensor position holds something else
    takes Triton's path."""
    b = triton_support.Bound(fake_lean, (1,), {}, (0,))
    x = torch.zeros(64)
    b(x, torch.zeros(8))
    for _ in range(3):
        x2, y2 = torch.zeros(64), torch.zeros(8)
        b(x2, y2)
        assert fake_lean.fast[-1][4] == (x2.data_ptr(), y2.data_ptr(), "EXTRA")
    b(x, None)  # a tensor position holding None: Triton's binder decides
    assert len(fake_lean.slow) == 2 and len(fake_lean.fast) == 3


def test_fast_launcher_calls_triton_36s_c_launch_directly():
    """Where the compiled launcher is Triton 3.6's CudaLauncher (its call signature) and
    the kernel needs no scratch, the C launch is called with what the wrapper would pass;
    any other launcher is called as it is."""
    seen = []

    class CudaLauncher:
        global_scratch_size = profile_scratch_size = 0
        launch_cooperative_grid, launch_pdl = False, True

        def __call__(self, gridX, gridY, gridZ, stream, function, *args):
            raise AssertionError("the wrapper must not run")

        def launch(self, *args):
            seen.append(args)

    run = CudaLauncher()
    launch, pre = triton_support.fast_launcher(run, "fn", "packed")
    launch(4, 1, 1, "stream", *pre, 11, 12)
    assert seen == [(4, 1, 1, "stream", "fn", False, True, None, None, "packed", None, None, None, 11, 12)]

    run.global_scratch_size = 128  # needs scratch: the wrapper allocates it
    assert triton_support.fast_launcher(run, "fn", "packed") == (run, ("fn", "packed", None, None, None))

    def other(*args):
        seen.append(args)

    launch, pre = triton_support.fast_launcher(other, "fn", "packed")
    launch(4, 1, 1, "stream", *pre, 11)
    assert seen[-1] == (4, 1, 1, "stream", "fn", "packed", None, None, None, 11)


def test_bound_treats_parameters_as_tensors(fake_lean):
    """A model's weights are nn.Parameter: a checked position holding one (at the first
    call or later) is launched by address like a plain tensor (the GPU run of c4579bc
    or-ed a Parameter itself into the alignment test: 'bitwise_or_cuda' not implemented)."""
    w = torch.nn.Parameter(torch.zeros(64))
    b = triton_support.Bound(fake_lean, (1,), {}, (0, 1))
    x = torch.zeros(64)
    b(x, w)
    b(x, w)
    b(x, torch.zeros(64))
    assert len(fake_lean.slow) == 1 and len(fake_lean.fast) == 2
    assert fake_lean.fast[0][4] == (x.data_ptr(), w.data_ptr(), "EXTRA")


def test_dot_precision_follows_the_dtype_the_flag_and_the_interpreter():
    """fp32 dots are IEEE with TF32 off, TF32 rounded to nearest with it on (on a GPU; the
    interpreter has no PTX, "tf32"), and 16-bit operands take "tf32" whatever the flag."""
    from kernellab.ops._triton_dots import dot_precision

    for interpreted, tf32_fp32 in ((False, "tf32rn"), (True, "tf32")):
        assert dot_precision(torch.float32, False, interpreted) == "ieee"
        assert dot_precision(torch.float32, True, interpreted) == tf32_fp32
        for dt in (torch.bfloat16, torch.float16):
            assert dot_precision(dt, False, interpreted) == dot_precision(dt, True, interpreted) == "tf32"
        # fp32_dots picks fp32's dots with TF32 off; TF32 on and 16-bit operands ignore it
        assert dot_precision(torch.float32, False, interpreted, "x3") == "x3"
        assert dot_precision(torch.float32, True, interpreted, "x3") == tf32_fp32
        assert dot_precision(torch.bfloat16, False, interpreted, "x3") == "tf32"
    with pytest.raises(ValueError, match="fp32_dots"):
        dot_precision(torch.float32, False, False, "tf32x3")


# --------------------------------------------------------------------------- no_autotune


def _block_filler():
    """An autotuned kernel that writes its BLOCK into every element: the output says which
    config ran. Three configs; the pruning drops the first, so the first config that fits
    is BLOCK=32 (configs[1])."""
    import triton
    import triton.language as tl

    @triton.autotune(
        configs=[triton.Config({"BLOCK": b}) for b in (16, 32, 64)],
        key=["n"],
        prune_configs_by={"early_config_prune": lambda configs, nargs, **kw: configs[1:]},
    )
    @triton_support.jit
    def fill(out, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out + offs, tl.full((BLOCK,), BLOCK, tl.float32), mask=offs < n)

    return fill


@pytest.fixture
def tuner_runs(monkeypatch):
    """Every call of a Triton autotuner (Autotuner.run: where tuning happens), counted."""
    from triton.runtime.autotuner import Autotuner

    calls = []
    run = Autotuner.run

    def counted(self, *args, **kwargs):
        calls.append(getattr(getattr(self, "base_fn", None), "__name__", repr(self)))
        return run(self, *args, **kwargs)

    monkeypatch.setattr(Autotuner, "run", counted)
    return calls


def test_no_autotune_launches_the_first_config_that_fits_without_the_tuner(tuner_runs):
    fill = _block_filler()
    out = torch.zeros(100)

    def grid(meta):
        return (triton_support.cdiv(100, meta["BLOCK"]),)

    with triton_support.no_autotune():
        assert not triton_support.autotune_allowed()
        triton_support.launch_tuned(fill, grid, out, 100)
    assert tuner_runs == [] and fill.cache == {}  # not invoked, nothing left in its cache
    assert torch.equal(out, torch.full((100,), 32.0))  # configs[0] pruned: the first kept ran
    assert triton_support.autotune_allowed()
    # Outside the block the same call goes to the tuner (two configs kept: it would time them).
    fill.prune_configs_by = None
    fill.early_config_prune = lambda configs, nargs, **kw: configs[2:]  # one left: nothing to time
    triton_support.launch_tuned(fill, grid, out, 100)
    assert tuner_runs == ["fill"] and torch.equal(out, torch.full((100,), 64.0))


def test_no_autotune_nests_and_reaches_other_threads():
    """Autograd runs a CUDA backward on its own thread: the setting must be seen there."""
    import threading

    seen = []
    with triton_support.no_autotune():
        with triton_support.no_autotune():
            pass
        t = threading.Thread(target=lambda: seen.append(triton_support.autotune_allowed()))
        t.start()
        t.join()
        assert not triton_support.autotune_allowed()  # the inner block's exit kept it off
    assert seen == [False] and triton_support.autotune_allowed()


def test_attention_forward_and_backward_do_not_autotune_inside_no_autotune(tuner_runs):
    """Every autotuned attention kernel (forward, dK/dV, dQ and its delta pass) honours it;
    outside, the same calls reach the tuners (so the count above can see them)."""
    import kernellab

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 19, 16, generator=g, requires_grad=True) for _ in range(3))

    def run():
        o = kernellab.attention(q, k, v, causal=True, backend="triton")
        dq, dk, dv = torch.autograd.grad(o, (q, k, v), torch.ones_like(o))
        return o, dq, dk, dv

    with triton_support.no_autotune():
        got = run()
    assert tuner_runs == []
    want = run()
    assert {"_attn_fwd", "_attn_bwd_dkdv", "_attn_bwd_dq"} <= set(tuner_runs)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


# --------------------------------------------------------------------------- interpreter per call


@pytest.mark.parametrize("interpret", [None, "1"], ids=["unset", "user_set"])
def test_importing_kernellab_leaves_triton_interpret_as_it_was_and_cpu_tensors_interpret(interpret):
    """In a fresh process: ``import kernellab`` leaves TRITON_INTERPRET as it found it
    (unset, or the user's 1: Triton's own behaviour), and a Triton backend given CPU
    tensors runs under the interpreter (chosen per launch)."""
    import os
    import subprocess
    import sys

    code = (
        "import os, torch, kernellab\n"
        "assert os.environ.get('TRITON_INTERPRET') == WANT, os.environ.get('TRITON_INTERPRET')\n"
        "x = torch.randn(3, 37, generator=torch.Generator().manual_seed(0))\n"
        "y = kernellab.gelu(x, backend='triton')\n"
        "torch.testing.assert_close(y, torch.nn.functional.gelu(x, approximate='tanh'))\n"
        "s = kernellab.softmax(x, -1, backend='triton')\n"
        "torch.testing.assert_close(s, torch.softmax(x, -1))\n"
        "assert os.environ.get('TRITON_INTERPRET') == WANT\n"
        "print('ok')\n"
    ).replace("WANT", repr(interpret))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret is not None:
        env["TRITON_INTERPRET"] = interpret
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().endswith("ok")


# A kernel calling a @jit helper that calls another, and Triton's own library functions
# (tl.sum, tl.cdiv: JITFunctions too). At module level: kernels find their helpers among
# their module's globals.


@triton_support.jit
def _twice(x):
    return x * 2.0


@triton_support.jit
def _twice_plus_sum(x):
    return _twice(x) + tl.sum(x, axis=0)


@triton_support.jit
def _nested_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    ok = offs < n
    x = tl.load(x_ptr + offs, mask=ok, other=0.0)
    tl.store(y_ptr + offs, _twice_plus_sum(x) + tl.cdiv(n, 4), mask=ok)


def test_a_kernel_with_nested_jit_helpers_runs_interpreted_on_cpu_tensors():
    """The decorator gives Triton's own JITFunction (compiled for CUDA tensors); with CPU
    tensors it runs under the interpreter, its helpers too, and once the launch is over
    Triton is as it was: a helper called outside a kernel raises as Triton's do."""
    from triton.runtime.jit import JITFunction

    assert isinstance(_nested_kernel, JITFunction) and isinstance(_twice, JITFunction)
    x = torch.randn(19, generator=torch.Generator().manual_seed(1))
    y = torch.empty_like(x)
    _nested_kernel[(1,)](x, y, 19, BLOCK=32)
    torch.testing.assert_close(y, x * 2 + x.sum() + 5)
    call = JITFunction.__dict__["__call__"]
    assert call is not triton_support._call_interpreted
    with pytest.raises(RuntimeError, match="outside of the scope of a kernel"):
        _twice(x)


@pytest.mark.gpu
def test_one_process_runs_triton_compiled_on_cuda_and_interpreted_on_cpu():
    """A kernel launched with CUDA tensors compiles and with CPU tensors is interpreted, in
    one process, and the compiled backends still agree after the interpreter ran. The
    backends themselves take CUDA tensors only on a GPU machine: a CPU tensor given to one
    by name is refused with an error naming the device, and the default serves it."""
    import kernellab

    gen = torch.Generator().manual_seed(3)
    x = torch.randn(8, 133, generator=gen)
    q = torch.randn(1, 2, 40, 32, generator=gen)

    def run():
        xd = x.cuda()
        qd = q.cuda().requires_grad_()
        o = kernellab.attention(qd, qd, qd, causal=True, backend="triton")
        (dq,) = torch.autograd.grad(o, qd, torch.ones_like(o))
        out = (
            kernellab.gelu(xd, backend="triton"),
            kernellab.softmax(xd, -1, backend="triton"),
            kernellab.cross_entropy(xd, torch.arange(8, device="cuda"), backend="triton"),
            o,
            dq,
        )
        return [t.detach().cpu() for t in out]

    before = run()
    for dev in ("cuda", "cpu", "cuda"):
        xd = x[0].to(dev)
        y = torch.empty_like(xd)
        _nested_kernel[(1,)](xd, y, 133, BLOCK=256)
        torch.testing.assert_close(y.cpu(), x[0] * 2 + x[0].sum() + 34)
    for a, b in zip(before, run()):
        torch.testing.assert_close(a, b)
    with pytest.raises(ValueError, match="cuda"):
        kernellab.gelu(x, backend="triton")
    torch.testing.assert_close(kernellab.gelu(x), torch.nn.functional.gelu(x, approximate="tanh"))


def test_triton_ops_registered_as_on_a_gpu_machine_take_cpu_tensors():
    """A GPU machine registers the Triton backends as ``triton_op``s (kit.build); given CPU
    tensors, eagerly and under torch.compile (forward and backward), they run under the
    interpreter. Here in a fresh process whose kit registers as a GPU machine would."""
    import os
    import subprocess
    import sys

    code = """
import torch
from kernellab.core import kit
kit._use_triton_op = lambda decl: decl.triton and hasattr(torch.library, "triton_op")
import kernellab
gen = torch.Generator().manual_seed(0)
q = torch.randn(1, 2, 19, 16, generator=gen, requires_grad=True)
x = torch.randn(4, 33, generator=gen, requires_grad=True)

def ours(q, x):
    o = kernellab.attention(q, q, q, causal=True, backend="triton")
    return o.sum() + kernellab.gelu(x, backend="triton").square().sum()

def torchs(q, x):
    o = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    return o.sum() + torch.nn.functional.gelu(x, approximate="tanh").square().sum()

want = torch.autograd.grad(torchs(q, x), (q, x))
for f in (ours, torch.compile(ours)):
    for a, b in zip(torch.autograd.grad(f(q, x), (q, x)), want):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
print("ok")
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().endswith("ok")


@triton_support.jit
def _min_first(v1, i1, v2, i2):  # associative, not commutative: the first of the smallest
    left = (v1 < v2) | ((v1 == v2) & (i1 < i2))
    return tl.where(left, v1, v2), tl.where(left, i1, i2)


@triton_support.jit
def _first_nonzero(a, b):  # associative, not commutative: the leftmost nonzero
    return tl.where(a != 0, a, b)


@triton_support.jit
def _reduce_kernel(x_ptr, v_ptr, i_ptr, f_ptr, s_ptr, R: tl.constexpr, C: tl.constexpr):
    r = tl.arange(0, R)[:, None]
    c = tl.arange(0, C)[None, :]
    x = tl.load(x_ptr + r * C + c)
    v, i = tl.reduce((x, tl.broadcast_to(c, (R, C))), 1, _min_first)
    tl.store(v_ptr + tl.arange(0, R), v)
    tl.store(i_ptr + tl.arange(0, R), i)
    tl.store(f_ptr + r, tl.reduce(x, 1, _first_nonzero, keep_dims=True))
    tl.store(s_ptr, tl.reduce(x, None, _first_nonzero))


def test_interpreter_custom_reduce_runs_over_whole_arrays():
    """A custom tl.reduce combine under the interpreter (triton_support's tree over whole
    arrays): tuples, keep_dims, axis=None, and combines whose operands' order matters."""
    g = torch.Generator().manual_seed(3)
    x = torch.randint(0, 3, (4, 64), generator=g).float()
    x[:, :5] = 0
    x[1] = 0
    v, i, f, s = torch.empty(4), torch.empty(4, dtype=torch.int32), torch.empty(4), torch.empty(1)
    _reduce_kernel[(1,)](x, v, i, f, s, R=4, C=64)
    want_v = x.min(1).values
    want_i = (x == want_v[:, None]).int().argmax(1)  # argmax: the first of equal values
    assert torch.equal(v, want_v) and torch.equal(i, want_i.int())
    first = [r[r != 0][0].item() if (r != 0).any() else 0.0 for r in x]
    assert f.tolist() == first and s.item() == first[0]


class _Recorder:
    """A streaming kernel stand-in: records each launch's grid and n, and writes
    ``out = in0 + in1 ...`` for the first n elements (as the kernels do)."""

    def __init__(self):
        self.launches = []

    def __getitem__(self, grid):
        def launch(*args, BLOCK, num_warps):
            *ins, out, n = args
            self.launches.append((grid, n, BLOCK, out.data_ptr()))
            assert grid[0] * BLOCK >= n
            out[:n] = sum(t[:n] for t in ins)

        return launch


@pytest.mark.parametrize("param", [False, True], ids=["tensor", "parameter"])
@pytest.mark.parametrize("n", [5, (1 << 16) + 3, 3 * 8192, 5 * 8192 + 7])
def test_launch_streaming_is_one_launch_for_any_count(n, param):
    """One launch of ceil(n / BLOCK) programs over the whole count, whole blocks or not (the
    kernels' last program takes the partial block: stream_blocks), parameters as tensors."""
    k = _Recorder()
    a, b = torch.randn(n).to(torch.bfloat16), torch.randn(n).to(torch.bfloat16)
    if param:
        a = torch.nn.Parameter(a, requires_grad=False)
    y = triton_support.launch_streaming(k, [a, b])
    assert torch.equal(y, a.detach() + b)
    block = triton_support.block_for(2)
    assert k.launches == [((-(-n // block),), n, block, y.data_ptr())]


def _streaming_kernels() -> dict:
    """Every kernel launched through launch_flat: name -> (kernel, inputs, outputs,
    constexprs); its pointers are the inputs, then the outputs."""
    from kernellab.ops.add import triton as add
    from kernellab.ops.gelu import triton as gelu
    from kernellab.ops.glu_kernels import triton_kernels as glu
    from kernellab.ops.relu import triton as relu

    return {
        "gelu_fwd": (gelu._gelu_fwd_kernel, 1, 1, {}),
        "gelu_bwd": (gelu._gelu_bwd_kernel, 2, 1, {}),
        "relu_fwd": (relu._relu_fwd_kernel, 1, 1, {}),
        "relu_bwd": (relu._relu_bwd_kernel, 2, 1, {}),
        "add": (add._add_kernel, 2, 1, {}),
        **{f"glu_fwd_{a}": (glu._glu_fwd_kernel, 2, 1, {"ACT": v}) for a, v in glu.ACT.items()},
        **{f"glu_bwd_{a}": (glu._glu_bwd_kernel, 3, 2, {"ACT": v}) for a, v in glu.ACT.items()},
    }


STREAMING = _streaming_kernels()


def test_the_streaming_table_holds_every_kernel_the_ops_declare():
    """STREAMING (the tests below) covers every kernel the streaming ops declare."""
    import kernellab

    declared = {spec[0] for op in ("gelu", "relu", "add", "swiglu", "geglu")
                for spec in kernellab.get(op, "triton").triton_kernels("bf16")}  # fmt: skip
    assert declared == {k for k, *_ in STREAMING.values()}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32 if t.element_size() == 4 else torch.int16)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("edge", list(BLOCK_EDGES))
@pytest.mark.parametrize("name", list(STREAMING))
def test_streaming_kernels_at_counts_around_a_block(name, edge, dtype):
    """Each streaming kernel through launch_flat (interpreted) at n around its program size:
    the first n outputs are bit for bit those of the same inputs run as whole blocks only
    (the masked path computes what the unmasked one does), and nothing past n is written."""
    kernel, ins, outs, cx = STREAMING[name]
    block = triton_support.block_for(dtype.itemsize)
    n = block_edge(edge, block)
    whole = triton_support.cdiv(n, block) * block
    g = torch.Generator().manual_seed(n)
    xs = [(torch.randn(whole, generator=g) * 4).to(dtype) for _ in range(ins)]
    fill = torch.full((whole + 16,), -7.0, dtype=dtype)

    def run(count):
        ys = [fill.clone() for _ in range(outs)]
        triton_support.launch_flat(kernel, [*xs, *ys], count, block, **cx, num_warps=8)
        return ys

    for got, want in zip(run(n), run(whole)):
        assert torch.equal(_bits(got[:n]), _bits(want[:n])), f"{name}: the partial block differs"
        assert torch.equal(_bits(got[n:]), _bits(fill[n:])), f"{name}: written past n"


def test_streaming_kernels_take_16_byte_accesses_at_an_odd_n():
    """No GPU needed: sm_90 PTX of each streaming kernel with n an i32 not known to be a
    multiple of 16 (as at an odd count). The whole-block path loads and stores 16 bytes at
    a time, 4 per thread and pointer (BLOCK = 256 threads x 4 x 16 bytes); only the
    partial block's path takes narrower ones. (A mask offs < n there would make every
    access one element wide.)"""
    from kltest import sm90_global_accesses

    specs, shapes = [], []
    for name, (kernel, ins, outs, cx) in STREAMING.items():
        for dtype, size in (("bf16", 2), ("fp32", 4)):
            ptrs = kernel.arg_names[: ins + outs]
            sig = {p: f"*{dtype}" for p in ptrs} | {"n": "i32"} | {c: "constexpr" for c in [*cx, "BLOCK"]}
            specs.append(dict(kernel=f"{kernel.fn.__module__}.{kernel.fn.__name__}", signature=sig,
                              constexprs={**cx, "BLOCK": triton_support.block_for(size)},
                              options={"num_warps": 8}, aligned_args=ptrs))  # fmt: skip
            shapes.append((f"{name} {dtype}", ins, outs))
    for (what, ins, outs), (loads, stores) in zip(shapes, sm90_global_accesses(specs)):
        wide = [
            sum(i.startswith(f"{kind}.global.v4.") for i in acc)
            for kind, acc in (("ld", loads), ("st", stores))
        ]
        assert wide == [4 * ins, 4 * outs], (what, loads, stores)
        assert len(loads) > wide[0] and len(stores) > wide[1], (what, "no masked path")


def test_streaming_kernels_compile_from_the_source_inductor_copies():
    """Under torch.compile on a GPU, Inductor launches a triton_op's kernel from source it
    writes: the kernel's, then each @jit function and constexpr that the kernel's module
    globals name, transitively (a helper reached as a module attribute would be missing:
    the kernels import stream_blocks, load_block and store_block by name). No GPU needed:
    that source compiled for sm_90, with its 16-byte accesses."""
    import os
    import subprocess
    import sys

    wrapper = pytest.importorskip("torch._inductor.codegen.wrapper")
    if not hasattr(wrapper, "user_defined_triton_kernel_transitive_closure_source_code"):
        pytest.skip("this torch's Inductor copies user kernels another way")
    code = """
import importlib, sys, tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from torch._inductor.codegen import wrapper
from kernellab.ops.add import triton as add
from kernellab.ops.gelu import triton as gelu
from kernellab.ops.glu_kernels import triton_kernels as glu
d = tempfile.mkdtemp()
sys.path.insert(0, d)
head = "import triton\\nimport triton.language as tl\\n\\n@triton.jit\\n"  # as Inductor writes it
for i, (k, ins, ptrs, cx) in enumerate(((gelu._gelu_fwd_kernel, 1, 2, {}), (add._add_kernel, 2, 3, {}),
                                        (glu._glu_bwd_kernel, 3, 5, {"ACT": 2}))):
    src = wrapper.user_defined_triton_kernel_transitive_closure_source_code(k)
    open(f"{d}/copied{i}.py", "w").write(head + src)
    fn = getattr(importlib.import_module(f"copied{i}"), k.fn.__name__)
    sig = {p: "*bf16" for p in fn.arg_names[:ptrs]} | {"n": "i32"} | {c: "constexpr" for c in [*cx, "BLOCK"]}
    attrs = {(j,): [["tt.divisibility", 16]] for j in range(ptrs)}
    src = ASTSource(fn=fn, signature=sig, constexprs={**cx, "BLOCK": 8192}, attrs=attrs)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8}).asm["ptx"]
    assert ptx.count("ld.global.v4.") == 4 * ins, k.fn.__name__
print("ok")
"""
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().endswith("ok")


@pytest.mark.parametrize("op", ["gelu", "relu", "add", "swiglu"])
def test_streaming_triton_ops_right_at_a_count_with_a_tail(op):
    """The Triton elementwise ops at a count whose last program is partial (interpreted),
    forward and backward, against torch in float64."""
    import kernellab

    n = 16 * 4096 + 4099
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, generator=g, requires_grad=True)
    if op == "add":
        z = torch.randn(n, generator=g)
        y, ref = kernellab.add(x, z, backend="triton"), x.double() + z.double()
    elif op == "swiglu":
        z = torch.randn(n, generator=g)
        y, ref = kernellab.swiglu(x, z, backend="triton"), torch.nn.functional.silu(x.double()) * z.double()
    else:
        y = getattr(kernellab, op)(x, backend="triton")
        kw = {"approximate": "tanh"} if op == "gelu" else {}
        ref = getattr(torch.nn.functional, op)(x.double(), **kw)
    assert torch.allclose(y.double(), ref, atol=1e-5, rtol=1e-5)
    dy = torch.randn(n, generator=g)
    (dx,) = torch.autograd.grad(y, x, dy)
    (dref,) = torch.autograd.grad(ref, x, dy.double())
    assert torch.allclose(dx.double(), dref.double(), atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("op", ["gelu", "relu", "add", "swiglu"])
def test_gpu_streaming_triton_ops_at_odd_counts(op, dtype):
    """On the GPU, at odd counts: one kernel launch per pass (whole blocks unmasked with
    16-byte accesses, the last, partial one masked), and the Triton ops equal the CUDA
    backend's (same formula, one rounding), gradients too."""
    import kernellab
    from kltest import launched_cuda_kernels

    fwd_kernel = {"gelu": "_gelu_fwd_kernel", "relu": "_relu_fwd_kernel", "add": "_add_kernel",
                  "swiglu": "_glu_fwd_kernel"}[op]  # fmt: skip
    for n in ((1 << 16) + 1, 1_000_003):
        g = torch.Generator(device="cuda").manual_seed(n)
        x = torch.randn(n, generator=g, device="cuda").to(dtype).requires_grad_(True)
        z = torch.randn(n, generator=g, device="cuda").to(dtype)
        args = (x, z) if op in ("add", "swiglu") else (x,)
        ran = launched_cuda_kernels(lambda: getattr(kernellab, op)(*args, backend="triton"), fwd_kernel)
        assert len(ran) == 1, ran
        outs = []
        for backend in ("triton", "cuda" if op != "swiglu" else "torch"):
            y = getattr(kernellab, op)(*args, backend=backend)
            (dx,) = torch.autograd.grad(y, x, torch.ones_like(y))
            outs.append((y.float(), dx.float()))
        (y0, dx0), (y1, dx1) = outs
        tol = dict(rtol=1e-2, atol=1e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(y0, y1, **tol)
        torch.testing.assert_close(dx0, dx1, **tol)


def test_with_defaults_fills_what_a_traced_launch_leaves_out():
    """A traced launch (wrap_triton) fills no parameter defaults: ``with_defaults`` adds
    each one the launch leaves out, and none it passes positionally, by keyword or through
    an autotuner's configs (``given``)."""
    from kernellab.ops.matmul import triton as tm

    kernel = tm._matmul_kernel
    n_args = 19  # a, b, c, bias, M, N, K, nine strides, three tuning keys
    args = tuple(range(n_args))
    kw = {"HAS_BIAS": False, "ACT": 0, "PRECISION": "tf32", "UPCAST": False, "ALIGN": 8}
    tuned = {"BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M"}
    full = triton_support.with_defaults(kernel, args, kw, tuned)
    assert full == {**kw, "A_K_INNER": True, "B_N_INNER": True, "SPLIT_K": 1, "A_LO": 0, "B_LO": 0}
    assert set(kernel.arg_names) == set(kernel.arg_names[:n_args]) | set(full) | tuned
    assert triton_support.with_defaults(kernel, args, full, tuned) is full
