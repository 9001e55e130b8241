"""Small attention forwards of one CUDA backend, for compute-sanitizer:

    compute-sanitizer --tool racecheck python lab/racecheck_attn.py cuda_v7

Head dims 64 and 128 (and 80), causal and full, tails (S not a multiple of the tile), bf16;
each result compared with PyTorch's SDPA, so a race that changes numbers fails here too."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import kernellab  # noqa: E402

backend = sys.argv[1] if len(sys.argv) > 1 else "cuda_v7"
bad = 0
for d in (64, 80, 128):
    for s in (192, 200):
        for causal in (False, True):
            g = torch.Generator(device="cuda").manual_seed(d + s)
            q, k, v = (torch.randn(1, 2, s, d, generator=g, device="cuda").bfloat16() for _ in range(3))
            o = kernellab.attention(q, k, v, causal=causal, backend=backend)
            ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
            err = (o.float() - ref).abs().max().item()
            ok = err < 3e-2
            bad += not ok
            verdict = "ok" if ok else "FAILED"
            print(f"{backend} D={d} S={s} causal={causal}: max err {err:.3g} {verdict}", flush=True)
torch.cuda.synchronize()
print(f"{backend}: {bad} failed")
sys.exit(1 if bad else 0)
