"""Per-output error (y, dx, dw, db) against fp64 of conv2d backends at the ladder's fp32
shapes (padding 1), and its ratio to torch's (cuDNN, TF32 off) error on the same inputs:
which gradient a failing fwdbwd re-check comes from. Needs a GPU.

    PYTHONPATH=src python lab/conv_errors.py
"""
import torch
import torch.nn.functional as F

from kernellab.core import registry

torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = False
shapes = [(64, 1, 28, 28, 32), (1024, 1, 28, 28, 32), (256, 32, 14, 14, 64), (1024, 32, 14, 14, 64), (32, 64, 56, 56, 64)]
impls = {i.backend: i for i in registry.impls("conv2d")}
for (n, c, h, w_, k) in shapes:
    g = torch.Generator(device="cuda").manual_seed(n + c)
    x = torch.randn(n, c, h, w_, device="cuda", generator=g)
    w = torch.randn(k, c, 3, 3, device="cuda", generator=g) / (c * 9) ** 0.5
    b = torch.randn(k, device="cuda", generator=g)
    dy = torch.randn(n, k, h, w_, device="cuda", generator=g)
    def run(fn, dt):
        xx, ww, bb = (t.to(dt).requires_grad_() for t in (x, w, b))
        y = fn(xx, ww, bb)
        gx, gw, gb = torch.autograd.grad(y, (xx, ww, bb), dy.to(dt))
        return [y, gx, gw, gb]
    ref = run(lambda a, b_, c_: F.conv2d(a, b_, c_, padding=1), torch.float64)
    errs = {}
    for be in ["torch", "triton", "cuda", "manual", "fft"]:
        fn = impls[be].fn if be != "torch" else (lambda a, b_, c_: F.conv2d(a, b_, c_, padding=1))
        out = run((lambda a, b_, c_, fn=fn: fn(a, b_, c_, padding=1)) if be != "torch" else fn, torch.float32)
        errs[be] = [float((o.detach().double() - r.detach()).abs().max()) for o, r in zip(out, ref)]
    scale = [float(r.abs().max()) for r in ref]
    print(f"{(n,c,h,w_,k)} scale y {scale[0]:.3g} dx {scale[1]:.3g} dw {scale[2]:.3g} db {scale[3]:.3g}")
    for be, e in errs.items():
        rat = [ei / max(et, 1e-30) for ei, et in zip(e, errs["torch"])]
        print(f"  {be:8s} " + "  ".join(f"{nm} {ei:.2e} ({r:.2f}x)" for nm, ei, r in zip("y dx dw db".split(), e, rat)))
