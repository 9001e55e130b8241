"""Graph-mode re-check: does a replay see inputs refreshed in place?"""

import torch

import kernellab
from kernellab.harness import timer

a = torch.randn(1024, device="cuda")
b = torch.randn(1024, device="cuda")
for backend in ["manual", "torch", "cuda"]:
    impl = kernellab.get("add", backend)
    box = [None]

    def fn():
        with torch.no_grad():
            box[0] = impl(a, b)

    t = timer.time_cuda_graph(fn, budget_s=0.05)
    err0 = (box[0] - (a + b)).abs().max().item()
    with torch.no_grad():
        a.copy_(torch.randn_like(a))
        b.copy_(torch.randn_like(b))
    t._graph.replay()
    torch.cuda.synchronize()
    err1 = (box[0] - (a + b)).abs().max().item()
    print(f"{backend:8s} before refresh {err0:.3g}  after refresh+replay {err1:.3g}")
