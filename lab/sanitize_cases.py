"""Small calls of every CUDA kernel, for compute-sanitizer (memcheck, racecheck).

Run with PYTORCH_NO_CUDA_MEMORY_CACHING=1 so that every allocation is its own and an
out-of-bounds access lands outside it. Each op's quick shapes and its layout shape, in
contiguous and misaligned (storage offset 1) layouts, forward and backward, and each of its
keyword-option cases: vector tails, the misaligned fallbacks and multi-block grids.

    python lab/sanitize_cases.py [OP ...]
"""

import sys

import torch

import kernellab


def _leaf(a, rg):
    return a.detach().clone().requires_grad_(rg) if isinstance(a, torch.Tensor) else a


ops = sys.argv[1:] or kernellab.op_names()
for op in ops:
    spec = kernellab.get_spec(op)
    for impl in kernellab.impls(op):
        if not impl.backend.startswith("cuda") or impl.why_unavailable("cuda"):
            continue
        differentiable = getattr(impl.fn, "differentiable", True) is not False
        for dtype in impl.dtypes or spec.dtypes:
            shapes = list(dict.fromkeys([*map(tuple, spec.quick_shapes), tuple(spec.layout_shape)]))
            for shape in shapes:
                for layout in ("contiguous", "offset"):
                    for opts in [{}, *spec.option_sets]:
                        args = spec.make_inputs(shape, dtype, "cuda", 0, layout)
                        if args is None:
                            continue
                        # an option naming a positional argument replaces it ({"bias": None})
                        gen = torch.Generator(device="cuda").manual_seed(1)
                        args, kwargs = spec.option_case(args, opts, dtype, "cuda", gen)
                        try:  # e.g. a 3x3 pooling window on a 2x2 quick shape: not a case
                            spec.validate(args, kwargs, ("cuda",))
                        except (TypeError, ValueError):
                            continue
                        leaves = [
                            _leaf(a, differentiable and i in spec.grad_args) for i, a in enumerate(args)
                        ]
                        out = impl(*leaves, **kwargs)
                        if isinstance(out, (tuple, list)):
                            out = out[0]
                        if differentiable and spec.grad_args and out.requires_grad:
                            out.backward(torch.randn_like(out))
        torch.cuda.synchronize()
        print(f"{impl.name}: ran")
