"""Small calls of every CUDA kernel, for compute-sanitizer (memcheck, racecheck).

Run with PYTORCH_NO_CUDA_MEMORY_CACHING=1 so that every allocation is its own and an
out-of-bounds access lands outside it. Shapes cover the vector tail, the misaligned
fallback and a multi-block grid.
"""

import torch

import kernellab

for op in kernellab.op_names():
    spec = kernellab.get_spec(op)
    for impl in kernellab.impls(op):
        if not impl.backend.startswith("cuda") or impl.why_unavailable("cuda"):
            continue
        for dtype in spec.dtypes:
            for shape in [(1,), (7,), (1025,), (3, 4097)]:
                for layout in ("contiguous", "offset"):
                    args = spec.make_inputs(shape, dtype, "cuda", 0, layout)
                    leaves = [
                        a.detach().clone().requires_grad_(i in spec.grad_args) for i, a in enumerate(args)
                    ]
                    out = impl(*leaves)
                    if spec.grad_args:
                        out.backward(torch.randn_like(out))
        torch.cuda.synchronize()
        print(f"{impl.name}: ran")
