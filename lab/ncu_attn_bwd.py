"""One attention backward of cuda_v9 and one of cuDNN (PyTorch's SDPA) at a shape, inside the
NVTX range ``kl_bwd``, for Nsight Compute to compare kernel by kernel:

    ncu --nvtx --nvtx-include "kl_bwd/" --set full --page details --csv --clock-control none \\
        python lab/ncu_attn_bwd.py --shape 2,28,28,4096,128 [--causal]

The forwards (ours: cuda_sm90.forward; cuDNN's: the SDPA call whose graph the backward
uses) and a warm-up backward of each run before the range, so the range holds the
backwards alone: ours (attn_bwd_pre, attn_bwd_v9_d<D>, attn_bwd_post[_blk]) and cuDNN's."""

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from kernellab.ops.attention import cuda_sm90 as cs  # noqa: E402
from kernellab.ops.attention import cuda_sm90_bwd as cb  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="2,28,28,4096,128", help="B,H_q,H_kv,S,D")
    ap.add_argument("--causal", action="store_true")
    a = ap.parse_args()
    b, hq, hkv, s, d = (int(x) for x in a.shape.split(","))
    gen = torch.Generator("cuda").manual_seed(0)
    q, k, v = (
        torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, generator=gen) for h in (hq, hkv, hkv)
    )
    do = torch.randn(b, hq, s, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    scale = 1 / math.sqrt(d)
    o, lse = cs.forward(q, k, v, a.causal, scale, cb.FWD_VARIANT)
    qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        ref = F.scaled_dot_product_attention(qg, kg, vg, is_causal=a.causal, scale=scale, enable_gqa=True)
    for _ in range(2):  # compiles, plans, cuDNN's graph
        cb.backward(do, q, k, v, o, lse, a.causal, scale, "v9")
        torch.autograd.grad(ref, (qg, kg, vg), do, retain_graph=True)
    torch.cuda.synchronize()
    # the backward on this thread (autograd's device threads are outside a push/pop range)
    with torch.autograd.set_multithreading_enabled(False):
        torch.cuda.nvtx.range_push("kl_bwd")
        cb.backward(do, q, k, v, o, lse, a.causal, scale, "v9")
        torch.autograd.grad(ref, (qg, kg, vg), do, retain_graph=True)
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
    print(f"profiled: cuda_v9 and cuDNN backward at {a.shape} causal={a.causal}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
