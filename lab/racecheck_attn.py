"""Small attention forwards of one CUDA backend, for compute-sanitizer:

    compute-sanitizer --tool racecheck python lab/racecheck_attn.py cuda_v7 [TILING]

Head dims 64 and 128 (and 80), causal and full, tails (S not a multiple of the tile), bf16;
each result compared with PyTorch's SDPA, so a race that changes numbers fails here too.
TILING (cuda_v7 only, e.g. 80x2s): v7 at that tiling of cuda_sm90.V7_TILINGS, at the head
dims that list it, instead of the default kernels."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import kernellab  # noqa: E402

backend = sys.argv[1] if len(sys.argv) > 1 else "cuda_v7"
tiling = sys.argv[2] if len(sys.argv) > 2 else None
dims = {d: None for d in (64, 80, 128)}
if tiling:
    from kernellab.ops.attention import cuda_sm90 as cs

    dims = {d: t for d in cs.HEAD_DIMS for t in cs.V7_TILINGS[d] if str(t) == tiling}
    if backend != "cuda_v7" or not dims:
        sys.exit(f"no v7 tiling {tiling} in cuda_sm90.V7_TILINGS (backend {backend})")
bad = 0
for d, tiles in dims.items():
    for s in (192, 200):
        for causal in (False, True):
            g = torch.Generator(device="cuda").manual_seed(d + s)
            q, k, v = (torch.randn(1, 2, s, d, generator=g, device="cuda").bfloat16() for _ in range(3))
            if tiles is None:
                o = kernellab.attention(q, k, v, causal=causal, backend=backend)
            else:
                o = cs.forward(q, k, v, causal, d**-0.5, "v7", tiles)[0]
            ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
            err = (o.float() - ref).abs().max().item()
            ok = err < 3e-2
            bad += not ok
            verdict = "ok" if ok else "FAILED"
            at = f"@{tiles}" if tiles else ""
            print(f"{backend}{at} D={d} S={s} causal={causal}: max err {err:.3g} {verdict}", flush=True)
torch.cuda.synchronize()
print(f"{backend}: {bad} failed")
sys.exit(1 if bad else 0)
