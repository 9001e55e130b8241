"""A short-sequence attention forward for Nsight Compute: v7 at its default tiling (or one
named), or cuDNN through SDPA, a few calls each (the first ones warm up and compile):

    ncu --kernel-name regex:attn_fwd_v7 --launch-skip 3 --launch-count 1 --section ... \\
        python lab/ncu_attn_short.py [--which v7|cudnn] [--shape B,H,S,D[,c]] [--tiling 128x3edpo]

Default shape: ViT-B/16's 256x12x197x64 without the mask."""

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--which", choices=("v7", "cudnn"), default="v7")
    ap.add_argument("--shape", default="256,12,197,64")
    ap.add_argument("--tiling", default=None, help="a v7 tiling as Tiles writes it, e.g. 208x3edpof")
    ap.add_argument("--calls", type=int, default=5)
    a = ap.parse_args(argv)
    f = a.shape.split(",")
    b, h, s, d = (int(x) for x in f[:4])
    causal = len(f) == 5 and f[4] == "c"

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from kernellab.ops.attention import cuda_sm90 as cs

    gen = torch.Generator("cuda").manual_seed(0)
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
    tiles = cs.Tiles.parse(a.tiling) if a.tiling else None
    for _ in range(a.calls):
        if a.which == "v7":
            cs.forward(q, k, v, causal, 1 / math.sqrt(d), "v7", tiles)
        else:
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
