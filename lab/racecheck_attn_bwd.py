"""Small attention backwards of cuda_v8 (or the backend named first: cuda_v9) of
attention_sm90_bwd.cu, for compute-sanitizer:

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool racecheck \
        python lab/racecheck_attn_bwd.py [cuda_v9]
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck \
        python lab/racecheck_attn_bwd.py [cuda_v9]

Every head dim, causal and full, tails (S not a multiple of the 64-row or 128-key tile),
GQA 2, bf16; dq, dk, dv compared with the gradients of PyTorch's own op in fp32, so a race
that changes numbers fails here too. A second argument names an exact lab build of cuda_v9
(``cuda_sm90_bwd.BWD_LAB``, ``BwdOpts.exact``): its head dims only, launched directly.

Expected in cuda_v9's report (H200, 39ddc3d): hazards between two write sites of the
producer (the cp.async.bulk copies of a stage's lse and delta) and the consumers' ld.shared
of them. The consumers read only after the stage's full mbarrier completes the copies'
bytes, and the producer rewrites a stage only after its empty mbarrier; racecheck does not
take an mbarrier's transaction count as synchronization. Any other site is a real finding."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402

import kernellab  # noqa: E402

backend = sys.argv[1] if len(sys.argv) > 1 else "cuda_v8"
build = sys.argv[2] if len(sys.argv) > 2 else None
dims, opts = (64, 80, 96, 128, 256), {}
if build:
    from kernellab.ops.attention import cuda_sm90 as cs
    from kernellab.ops.attention import cuda_sm90_bwd as cb

    opts = {d: o for d in cb.BWD_HEAD_DIMS for o in cb.BWD_LAB[d] if str(o) == build and o.exact}
    if backend != "cuda_v9" or not opts:
        sys.exit(f"no exact lab build {build} of cuda_v9 in cuda_sm90_bwd.BWD_LAB (backend {backend})")
    dims = tuple(opts)


def grads(q, k, v, do, causal, d):
    if not build:
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        o = kernellab.attention(*leaves, causal=causal, backend=backend)
        return torch.autograd.grad(o, leaves, do)
    scale = d**-0.5
    o, lse = cs.forward(q, k, v, causal, scale, cb.FWD_VARIANT)
    return cb.backward(do, q, k, v, o, lse, causal, scale, "v9", opts[d])


bad = 0
for d in dims:
    for s_q, s_k in ((130, 200), (200, 130)):
        for causal in (False, True):
            g = torch.Generator(device="cuda").manual_seed(d + s_q)
            q = torch.randn(1, 4, s_q, d, generator=g, device="cuda").bfloat16()
            k, v = (torch.randn(1, 2, s_k, d, generator=g, device="cuda").bfloat16() for _ in range(2))
            do = torch.randn(1, 4, s_q, d, generator=g, device="cuda").bfloat16()
            got = grads(q, k, v, do, causal, d)
            ref_leaves = [t.float().requires_grad_() for t in (q, k, v)]
            # PyTorch's own op in fp32 (bottom-right causal, rows without a key: o = 0)
            ref = kernellab.attention(*ref_leaves, causal=causal, backend="torch")
            want = torch.autograd.grad(ref, ref_leaves, do.float())
            errs = [
                (a.float() - b).abs().max().item() / (b.abs().max().item() + 1e-6) for a, b in zip(got, want)
            ]
            ok = all(e < 3e-2 for e in errs)
            bad += not ok
            verdict = "ok" if ok else "FAILED"
            name = f"{backend}@{build}" if build else backend
            print(f"{name} D={d} S_q={s_q} S_k={s_k} causal={causal}: rel err dq {errs[0]:.3g} "
                  f"dk {errs[1]:.3g} dv {errs[2]:.3g} {verdict}", flush=True)  # fmt: skip
torch.cuda.synchronize()
print(f"{backend}: {bad} failed")
sys.exit(1 if bad else 0)
