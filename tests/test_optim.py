"""kernellab.sgd_step: every backend x dtype against the reference update p - lr * g;
packing (one flat buffer, gradients accumulated in place by autograd); bad input names the
argument; the triton backend refuses unpacked parameters; GPU (marked ``gpu``): one launch."""

from __future__ import annotations

import pytest
import torch

import kernellab
from kernellab import optim
from kltest import DTYPES, dtype_id

SHAPES = [(3, 4), (17,), (1,), (2, 3, 5), (0,), (32, 1, 3, 3)]


def _params(dtype, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    ps = [torch.randn(s, generator=g).to(dtype).to(device) for s in SHAPES]
    gs = [torch.randn(s, generator=g).to(dtype).to(device) for s in SHAPES]
    return ps, gs


def _expect(ps, gs, lr):
    # the update in fp32, one rounding to the storage dtype (what every backend computes)
    return [(p.float() - lr * g.float()).to(p.dtype) for p, g in zip(ps, gs)]


@pytest.mark.parametrize("backend", optim.BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_update_matches_the_reference(backend, dtype):
    ps, gs = _params(dtype)
    want = _expect(ps, gs, 0.1)
    if backend == "triton":
        optim.pack_(ps)
        for p, g in zip(ps, gs):
            p.grad.copy_(g)
        gs = [p.grad for p in ps]
    kernellab.sgd_step(ps, gs, 0.1, backend=backend)
    for p, w in zip(ps, want):
        # fp32: one rounding either way; 16-bit: p + (-lr) * g may round twice in PyTorch's kernels
        tol = 0 if dtype == torch.float32 and backend == "triton" else torch.finfo(dtype).eps
        torch.testing.assert_close(p.float(), w.float(), rtol=tol, atol=tol * 4)
        assert p.dtype == dtype


def test_pack_keeps_values_and_autograd_accumulates_into_the_flat_buffer():
    lin = torch.nn.Linear(5, 3)
    before = [p.detach().clone() for p in lin.parameters()]
    flat, gflat = optim.pack_(list(lin.parameters()))
    assert flat.numel() == 18 and gflat.abs().sum() == 0
    for p, b in zip(lin.parameters(), before):
        assert torch.equal(p, b)
    assert optim.packed_span(list(lin.parameters())).data_ptr() == flat.data_ptr()
    x = torch.randn(4, 5)
    lin(x).sum().backward()
    assert torch.equal(gflat[:15].view(3, 5), x.sum(0).expand(3, 5))  # dW landed in the buffer
    assert torch.equal(gflat[15:], torch.full((3,), 4.0))
    kernellab.sgd_step(list(lin.parameters()), [p.grad for p in lin.parameters()], 0.5, backend="triton")
    torch.testing.assert_close(lin.bias.detach(), before[1] - 2.0)
    gflat.zero_()
    assert all(p.grad.abs().sum() == 0 for p in lin.parameters())


def test_triton_refuses_unpacked_tensors():
    ps, gs = _params(torch.float32)
    with pytest.raises(ValueError, match="params are not packed"):
        kernellab.sgd_step(ps, gs, 0.1, backend="triton")
    optim.pack_(ps)
    with pytest.raises(ValueError, match="grads are not packed"):
        kernellab.sgd_step(ps, gs, 0.1, backend="triton")
    reordered = [ps[1], ps[0]] + ps[2:]
    with pytest.raises(ValueError, match="params are not packed"):
        kernellab.sgd_step(reordered, [p.grad for p in reordered], 0.1, backend="triton")


def test_bad_input_names_the_argument():
    ps, gs = _params(torch.float32)
    sgd = kernellab.sgd_step
    with pytest.raises(ValueError, match="params has 6 tensors but grads has 5"):
        sgd(ps, gs[:5], 0.1)
    with pytest.raises(ValueError, match=r"grads\[0\] has shape"):
        sgd(ps, [gs[0].t()] + gs[1:], 0.1)
    with pytest.raises(TypeError, match=r"params\[1\] has dtype"):
        sgd([ps[0], ps[1].long()], [gs[0], gs[1].long()], 0.1)
    with pytest.raises(TypeError, match=r"grads\[0\] has dtype"):
        sgd(ps, [gs[0].half()] + gs[1:], 0.1)
    with pytest.raises(TypeError, match=r"grads\[2\] must be a torch.Tensor"):
        sgd(ps, gs[:2] + [None] + gs[3:], 0.1)
    with pytest.raises(TypeError, match="params must be a list"):
        sgd(ps[0], gs[0], 0.1)
    with pytest.raises(ValueError, match="lr"):
        sgd(ps, gs, float("nan"))
    with pytest.raises(TypeError, match="lr"):
        sgd(ps, gs, "0.1")
    with pytest.raises(ValueError, match="backend"):
        sgd(ps, gs, 0.1, backend="cuda_v9")
    sgd([], [], 0.1)  # nothing to do


def test_default_backend_here_is_torch_foreach():
    ps, gs = _params(torch.float32)
    want = _expect(ps, gs, 0.25)
    kernellab.sgd_step(ps, gs, 0.25)  # the interpreter is not fast: torch's foreach here
    for p, w in zip(ps, want):
        torch.testing.assert_close(p, w, rtol=1e-7, atol=1e-7)


@pytest.mark.gpu
def test_gpu_triton_is_one_launch_for_every_parameter():
    from kltest import launched_cuda_kernels

    ps, gs = _params(torch.float32, "cuda")
    want = _expect(ps, gs, 0.1)
    optim.pack_(ps)
    for p, g in zip(ps, gs):
        p.grad.copy_(g)
    grads = [p.grad for p in ps]
    kernellab.sgd_step(ps, grads, 0.1, backend="triton")  # compile outside the profile
    names = launched_cuda_kernels(lambda: kernellab.sgd_step(ps, grads, 0.0, backend="triton"))  # lr 0: no change
    assert names == ["_sgd_flat_kernel"], names
    # The kernel computes p - lr g in one FMA (one rounding), the reference in two (lr g
    # rounded first): they differ by up to half an ulp of lr g plus one of the result, which
    # is several ulps of the result where p and lr g nearly cancel (H100: 3 ulps, 3.1e-7
    # relative, at one element of 288 against a 1-ulp bound).
    eps = torch.finfo(torch.float32).eps
    for p, w, g in zip(ps, want, gs):
        bound = eps * (0.1 * g.abs() + w.abs())
        assert ((p - w).abs() <= bound).all(), ((p - w).abs() / bound).max()


# --------------------------------------------------------------------------- AdamW

ADAMW_SHAPES = [(7, 5), (3000,), (1,), (0,), (2049,), (4096,)]
# (lr, betas, eps, weight_decay): the defaults, and each argument moved so it matters
ADAMW_ARGS = [(1e-3, (0.9, 0.999), 1e-8, 1e-2), (0.1, (0.5, 0.9), 0.5, 0.0), (0.05, (0.0, 0.99), 1e-3, 0.3)]


def _adamw_run(make_opt, dtype, device="cpu", steps=4, drop=(2, 1)):
    """``steps`` steps of fresh gradients over ADAMW_SHAPES; at step drop[0] tensor drop[1]
    has no gradient (skipped: its step count does not advance)."""
    g = torch.Generator().manual_seed(0)
    ps = [torch.randn(s, generator=g).to(dtype).to(device).requires_grad_() for s in ADAMW_SHAPES]
    opt = make_opt(ps)
    for k in range(steps):
        for p in ps:
            p.grad = torch.randn(p.shape, generator=g).to(dtype).to(device)
        if k == drop[0]:
            ps[drop[1]].grad = None
        opt.step()
    return [p.detach() for p in ps], opt


@pytest.mark.parametrize("backend", optim.ADAMW_BACKENDS)
@pytest.mark.parametrize("args", ADAMW_ARGS, ids=["defaults", "args-a", "args-b"])
def test_adamw_matches_pytorch_fp32(backend, args):
    """fp32, every argument (lr, betas, eps, weight_decay), a step with a missing gradient:
    the parameters and both moments follow torch.optim.AdamW. The torch backend runs
    PyTorch's own arithmetic (exact here). Triton's kernel rounds as PyTorch's fused CUDA
    kernel does (p - lr*wd*p, beta1*m + (1 - beta1)*g), not as its CPU loop (mul_, lerp_),
    and its bias corrections are fp32: within 8 fp32 ulps of |p| + lr after 4 steps (seen:
    4.0)."""
    lr, betas, eps, wd = args
    ref, ropt = _adamw_run(lambda ps: torch.optim.AdamW(ps, lr=lr, betas=betas, eps=eps, weight_decay=wd,
                                                         foreach=False), torch.float32)  # fmt: skip
    got, opt = _adamw_run(lambda ps: optim.AdamW(ps, lr=lr, betas=betas, eps=eps, weight_decay=wd,
                                                  backend=backend), torch.float32)  # fmt: skip
    eps32 = torch.finfo(torch.float32).eps
    k = 0 if backend == "torch" else 8
    for i, (a, b) in enumerate(zip(ref, got)):
        assert ((a - b).abs() <= k * eps32 * (a.abs() + lr)).all(), (i, float((a - b).abs().max()))
        if a.numel():
            st = ropt.state[ropt.param_groups[0]["params"][i]]
            for x, y in ((opt.exp_avg[i], st["exp_avg"]), (opt.exp_avg_sq[i], st["exp_avg_sq"])):
                # (m = beta1 m + (1 - beta1) g may cancel: judged on the tensor's scale)
                assert (x - y).abs().max() <= k * eps32 * y.abs().max(), (i, float((x - y).abs().max()))
            assert float(opt.steps[i]) == float(st["step"])
    assert opt.steps.tolist() == [4, 3, 4, 4, 4, 4]  # the dropped gradient's step did not count


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=dtype_id)
def test_adamw_half_precision_backends_agree_to_one_ulp(dtype):
    """bf16 / fp16 storage, fp32 arithmetic in both backends: the parameters within 2
    storage ulps of |p| + lr of each other and the moments within 2 ulps of their tensor's
    scale (they round fp32 values a few fp32 ulps apart: the CPU loop's mul_ / lerp_
    against the kernel's fused-CUDA order; a tie apart per step at most). (PyTorch's CPU
    AdamW computes in the storage dtype, so it is no reference here; on a GPU the fused
    kernel is: test_gpu_adamw_matches_pytorch_fused.)"""
    lr = 1e-2
    runs = {b: _adamw_run(lambda ps, b=b: optim.AdamW(ps, lr=lr, weight_decay=0.1, backend=b), dtype)
            for b in optim.ADAMW_BACKENDS}  # fmt: skip
    (a, oa), (b, ob) = runs["torch"], runs["triton"]
    ulp = torch.finfo(dtype).eps
    for i, (x, y) in enumerate(zip(a, b)):
        d = (x.float() - y.float()).abs()
        assert (d <= 2 * ulp * (x.float().abs() + lr)).all(), (i, d.max())
    for x, y in zip(oa.exp_avg + oa.exp_avg_sq, ob.exp_avg + ob.exp_avg_sq):
        if x.numel():
            assert (x.float() - y.float()).abs().max() <= 2 * ulp * x.float().abs().max()


def test_adamw_bad_input_names_the_argument():
    p = torch.zeros(3, requires_grad=True)
    with pytest.raises(ValueError, match="backend 'nope'"):
        optim.AdamW([p], backend="nope")
    with pytest.raises(ValueError, match="params is empty"):
        optim.AdamW([])
    with pytest.raises(TypeError, match="single tensor"):
        optim.AdamW(p)
    with pytest.raises(TypeError, match=r"params\[1\] must be a torch.Tensor"):
        optim.AdamW([p, 3.0])
    with pytest.raises(TypeError, match=r"params\[0\] has dtype torch.int64"):
        optim.AdamW([torch.zeros(3, dtype=torch.int64)])
    with pytest.raises(ValueError, match=r"params\[1\] is torch.float16"):
        optim.AdamW([p, torch.zeros(3, dtype=torch.float16)])
    with pytest.raises(ValueError, match=r"params\[0\] is not contiguous"):
        optim.AdamW([torch.zeros(4, 4).t()])
    with pytest.raises(ValueError, match="twice"):
        optim.AdamW([p, p])
    for kw, msg in [({"lr": -1.0}, "lr must be in"), ({"lr": float("nan")}, "lr must be a finite"),
                    ({"betas": (1.0, 0.9)}, r"betas\[0\] must be in"), ({"betas": (0.9,)}, "betas must be a pair"),
                    ({"eps": -1e-8}, "eps must be in"), ({"weight_decay": True}, "weight_decay must be a finite")]:
        with pytest.raises(ValueError, match=msg):
            optim.AdamW([p], **kw)
    opt = optim.AdamW([p], backend="triton")
    p.grad = torch.zeros(6)[::2]
    with pytest.raises(ValueError, match=r"params\[0\].grad is not contiguous"):
        opt.step()


def test_adamw_no_gradients_is_a_no_op_and_zero_grad():
    p = torch.ones(5, requires_grad=True)
    for backend in optim.ADAMW_BACKENDS:
        opt = optim.AdamW([p], backend=backend)
        opt.step()  # no gradient: nothing moves, no step counted
        assert float(opt.steps[0]) == 0 and (p == 1).all()
        p.grad = torch.ones(5)
        opt.zero_grad(set_to_none=False)
        assert (p.grad == 0).all()
        opt.zero_grad()
        assert p.grad is None


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_gpu_adamw_matches_pytorch_fused(dtype):
    """Against torch.optim.AdamW(fused=True) on the GPU (fp32 arithmetic, storage in the
    parameters' dtype): the torch backend runs the same kernel (exact); Triton's one launch
    within 2 storage ulps of |p| + lr (bf16: the same fp32 value rounded, a tie apart at
    most per step) or 8 fp32 ulps. Also with gradients at addresses that are not 16-byte
    aligned (views at an odd offset: the kernel's unvectorized path)."""
    for misaligned in (False, True):
        ref, _ = _adamw_run(lambda ps: torch.optim.AdamW(ps, lr=1e-2, betas=(0.8, 0.95), eps=1e-6,
                                                         weight_decay=0.1, fused=True), dtype, "cuda")  # fmt: skip
        for backend in optim.ADAMW_BACKENDS:
            def make(ps, backend=backend):
                opt = optim.AdamW(ps, lr=1e-2, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1, backend=backend)
                if misaligned:  # every gradient a view one element into a larger buffer
                    step = opt.step

                    def shifted():
                        for p in ps:
                            if p.grad is not None:
                                buf = torch.empty(p.numel() + 1, dtype=p.dtype, device=p.device)
                                buf[1:].copy_(p.grad.reshape(-1))
                                p.grad = buf[1:].view(p.shape)
                        step()

                    opt.step = shifted
                return opt

            got, opt = _adamw_run(make, dtype, "cuda")
            ulp = torch.finfo(dtype).eps
            for i, (a, b) in enumerate(zip(ref, got)):
                if backend == "torch":
                    assert torch.equal(a, b), (misaligned, i)
                else:
                    bound = (2 if dtype != torch.float32 else 8) * ulp * (a.float().abs() + 1e-2)
                    d = (a.float() - b.float()).abs()
                    assert (d <= bound).all(), (misaligned, i, float((d / bound).max()))


@pytest.mark.gpu
def test_gpu_adamw_triton_one_launch_and_capturable():
    """The Triton backend's step is the step-count add and one kernel for every tensor; a
    step captured in a CUDA graph and replayed takes the same steps as eager calls."""
    from kltest import launched_cuda_kernels

    def setup():
        g = torch.Generator(device="cuda").manual_seed(0)
        ps = [torch.randn(s, device="cuda", generator=g, dtype=torch.bfloat16).requires_grad_() for s in ADAMW_SHAPES]
        grads = [torch.randn(p.shape, device="cuda", generator=g, dtype=torch.bfloat16) for p in ps]
        return ps, grads

    ps, grads = setup()
    opt = optim.AdamW(ps, lr=1e-2, backend="triton")
    for p, gr in zip(ps, grads):
        p.grad = gr
    opt.step()
    names = launched_cuda_kernels(opt.step)
    assert names.count("_adamw_kernel") == 1 and len(names) == 2, names
    for _ in range(2):
        opt.step()
    eager = [p.detach().clone() for p in ps]

    ps, grads = setup()
    opt = optim.AdamW(ps, lr=1e-2, backend="triton")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for p, gr in zip(ps, grads):
            p.grad = gr
        opt.step()  # step 1, eager (tables built, kernel compiled)
    torch.cuda.current_stream().wait_stream(s)
    for p, gr in zip(ps, grads):  # new gradient tensors: the capture uploads their addresses
        p.grad = gr.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        opt.step()
    for _ in range(3):
        graph.replay()  # steps 2-4
    torch.cuda.synchronize()
    assert float(opt.steps[0]) == 4
    # eager ran steps 1-4 on the same gradients (steps 2-4: 1 profiled + 2)
    for a, b in zip(eager, ps):
        assert torch.equal(a, b.detach())


@pytest.mark.parametrize("dt", ["bf16", "fp32"])
def test_adamw_kernel_compiles_for_sm90_with_16_byte_accesses_where_aligned(dt):
    """No GPU needed: the one-launch AdamW kernel compiled ahead of time for sm_90. The
    table's offsets count from one base pointer so that the compiler can prove 16-byte
    alignment (offsets read as integer addresses lose it); with ALIGNED its whole-block
    path loads and stores 16 bytes at a time, without it nothing claims alignment."""
    import re

    from kltest import compile_for_sm90

    sig = {"base_ptr": "*" + dt, "off_ptr": "*i64", "steps_ptr": "*fp32", "param_ptr": "*i32", "numel_ptr": "*i64",
           "chunk_t_ptr": "*i32", "chunk_s_ptr": "*i64", "n_tensors": "i32", "lr": "fp32", "beta1": "fp32",
           "beta2": "fp32", "ln_beta1": "fp32", "ln_beta2": "fp32", "eps": "fp32", "weight_decay": "fp32",
           "BLOCK": "constexpr", "VEC": "constexpr", "ALIGNED": "constexpr"}  # fmt: skip
    counts = {}
    for aligned in ("1", "0"):
        cx = {"BLOCK": optim.ADAMW_BLOCK, "VEC": 16 // (4 if dt == "fp32" else 2), "ALIGNED": aligned == "1"}
        ptx = compile_for_sm90("kernellab.optim._adamw_kernel", sig, cx, {"num_warps": 4}, range(7), "ptx")
        counts[aligned] = (len(re.findall(r"ld\.global[.\w]*\.v4", ptx)), len(re.findall(r"st\.global[.\w]*\.v4", ptx)))
    assert counts["1"][0] >= 4 and counts["1"][1] >= 3, counts  # p, g, m, v in; p, m, v out
    assert counts["0"] == (0, 0), counts


@pytest.mark.parametrize("backend", optim.ADAMW_BACKENDS)
def test_adamw_state_dict_round_trip_resumes_the_same_steps(backend):
    """A checkpoint after 2 steps, loaded into a fresh optimizer over copies of the
    parameters, takes the same next steps as the original (moments, step counts and
    hyperparameters all restored, into the optimizer's own tensors); a state of another
    model is refused naming the entry."""
    g = torch.Generator().manual_seed(3)
    ps = [torch.randn(s, generator=g).requires_grad_() for s in ADAMW_SHAPES]
    grads = [[torch.randn(s, generator=g) for s in ADAMW_SHAPES] for _ in range(4)]
    opt = optim.AdamW(ps, lr=0.05, betas=(0.8, 0.9), eps=1e-3, weight_decay=0.2, backend=backend)
    for k in range(2):
        for p, gr in zip(ps, grads[k]):
            p.grad = gr.clone()
        opt.step()
    state = {k: ([t.clone() for t in v] if isinstance(v, list) else v.clone() if torch.is_tensor(v) else v)
             for k, v in opt.state_dict().items()}  # fmt: skip
    qs = [p.detach().clone().requires_grad_() for p in ps]
    fresh = optim.AdamW(qs, backend=backend)  # other hyperparameters: the state brings them
    m0 = fresh.exp_avg[1]
    fresh.load_state_dict(state)
    assert fresh.exp_avg[1] is m0 and fresh.lr == 0.05 and fresh.betas == (0.8, 0.9)
    for k in range(2, 4):
        for p, q, gr in zip(ps, qs, grads[k]):
            p.grad, q.grad = gr.clone(), gr.clone()
        opt.step()
        fresh.step()
    for p, q in zip(ps, qs):
        assert torch.equal(p, q)
    assert fresh.steps.tolist() == [4.0] * len(ADAMW_SHAPES)
    bad = dict(state, exp_avg=state["exp_avg"][:-1])
    with pytest.raises(ValueError, match="state: exp_avg has 5 tensors; this optimizer has 6"):
        fresh.load_state_dict(bad)
    with pytest.raises(ValueError, match="state: missing steps"):
        fresh.load_state_dict({k: v for k, v in state.items() if k != "steps"})
    wrong = dict(state, exp_avg_sq=[t.reshape(-1) if t.dim() > 1 else t for t in state["exp_avg_sq"]])
    with pytest.raises(ValueError, match=r"state: exp_avg_sq\[0\] has shape \[35\]"):
        fresh.load_state_dict(wrong)


def test_sgd_step_refuses_an_expanded_parameter_naming_it():
    """An expanded parameter (stride 0: several elements at one address) cannot be updated
    in place; every backend refuses it before touching anything, naming params[i]."""
    ps, gs = _params(torch.float32)
    ps[2] = torch.zeros(1, 1).expand(4, 3)
    gs[2] = torch.ones(4, 3)
    before = [p.clone() for p in ps]
    for backend in optim.BACKENDS:
        with pytest.raises(ValueError, match=r"params\[2\] has elements that share memory"):
            kernellab.sgd_step(ps, gs, 0.1, backend=backend)
        assert all(torch.equal(p, b) for p, b in zip(ps, before)), backend  # nothing updated
    # an expanded gradient is only read: accepted
    ps, gs = _params(torch.float32)
    gs[0] = torch.ones(1, 4).expand(3, 4)
    want = _expect(ps, [g.contiguous() for g in gs], 0.1)
    kernellab.sgd_step(ps, gs, 0.1, backend="torch")
    torch.testing.assert_close(ps[0], want[0])


def test_adamw_triton_rereads_the_layout_of_a_gradient_at_the_same_address():
    """A step with a contiguous gradient, then one whose gradient is a strided view that
    starts at the same address (the table's key, the address, is unchanged): refused,
    naming it, instead of being read as contiguous. Its contiguous copy then takes the
    torch backend's step."""
    torch.manual_seed(0)
    p = torch.randn(6, requires_grad=True)
    q = p.detach().clone().requires_grad_()
    opt, ref = optim.AdamW([p], lr=0.1, backend="triton"), optim.AdamW([q], lr=0.1, backend="torch")
    buf = torch.randn(12)
    p.grad, q.grad = buf[:6], buf[:6].clone()
    opt.step()
    ref.step()
    strided = buf[::2]  # same data_ptr as last step's gradient, stride 2
    assert strided.data_ptr() == p.grad.data_ptr()
    p.grad, q.grad = strided, strided.clone()
    with pytest.raises(ValueError, match=r"params\[0\]\.grad is not contiguous"):
        opt.step()
    assert float(opt.steps[0]) == 1  # the refused step did not count
    p.grad = strided.contiguous()
    opt.step()
    ref.step()
    torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-6, atol=1e-6)
    assert torch.isfinite(p).all()


def test_adamw_triton_refuses_a_parameter_whose_size_changed_at_the_same_address():
    """A parameter's .data replaced by a longer view of the same memory (same address, so
    the address table alone would not notice): the step refuses it by name rather than
    update the first 4 of its 8 elements."""
    flat = torch.zeros(8)
    p = torch.nn.Parameter(flat[:4])
    opt = optim.AdamW([p], backend="triton")
    p.grad = torch.ones(4)
    opt.step()
    p.data = flat  # 8 elements at the same address
    p.grad = torch.ones(8)
    with pytest.raises(ValueError, match=r"params\[0\] has 8 elements; the optimizer was made for 4"):
        opt.step()
    # and a transposed view at the same address
    w = torch.nn.Parameter(torch.randn(3, 3))
    opt = optim.AdamW([w], backend="triton")
    w.grad = torch.ones(3, 3)
    opt.step()
    w.data = w.data.t()
    with pytest.raises(ValueError, match=r"params\[0\] is not contiguous"):
        opt.step()
