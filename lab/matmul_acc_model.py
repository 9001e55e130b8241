"""CPU model of the fp32 CUDA matmul variants' accumulation order over K (issue 4).

    python lab/matmul_acc_model.py [--seeds 20] [--mn 17,33]

Each variant's thread computes C[i, j] as fp32 FMA chains over k (acc = fl(a*b + acc): the
product is exact in float64, one rounding per step, as the GPU's FFMA). Orders modelled:
  seq    one chain k = 0..K-1            (v5, v6, v7; v1-v4 before the four-chain change)
  split2 two chains k % 2, then added
  split4 four chains k % 4, then (c0 + c1) + (c2 + c3)   (v1-v4 now)
  chunk4 four chains over contiguous K slices, added pairwise (v5-v7 on small grids: the
         launcher's split-K, cuda.py SPLIT_K)
Against: float64 reference; torch's fp32 matmul on this CPU as the stand-in for the baseline of
the 2x-PyTorch error rule (bound = 2 * torch_err + eps32 * max(1, max|ref|), harness/compare.py).
On the GPU the baseline is cuBLAS, whose order differs: the ratios, not the bounds, carry over.
Printed per K: worst over seeds of err/torch_err, err/bound, and err/err_seq on the same draw.
"""

import argparse

import numpy as np
import torch


def fma_chains(a, b, chains):
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    parts = []
    for ks in chains:
        acc = np.zeros((a.shape[0], b.shape[1]), np.float32)
        for k in ks:
            acc = (np.outer(a64[:, k], b64[k]) + acc.astype(np.float64)).astype(np.float32)
        parts.append(acc)
    while len(parts) > 1:  # pairwise
        parts = [parts[i] + parts[i + 1] if i + 1 < len(parts) else parts[i] for i in range(0, len(parts), 2)]
    return parts[0]


def orders(k):
    ks = list(range(k))
    q = -(-k // 4)
    return {
        "seq": [ks],
        "split2": [ks[0::2], ks[1::2]],
        "split4": [ks[i::4] for i in range(4)],
        "chunk4": [ks[i * q : (i + 1) * q] for i in range(4)],
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--mn", default="17,33")
    p.add_argument("--ks", default="65,997,4096")
    args = p.parse_args()
    m, n = map(int, args.mn.split(","))
    print(f"M={m} N={n}, {args.seeds} seeds, randn inputs")
    print(f"{'K':>5} {'order':7} {'err/torch':>9} {'err/bound':>9} {'err/seq':>8}")
    for k in map(int, args.ks.split(",")):
        worst = {}
        for seed in range(args.seeds):
            g = torch.Generator().manual_seed(seed)
            a, b = torch.randn(m, k, generator=g), torch.randn(k, n, generator=g)
            ref = (a.double() @ b.double()).numpy()
            base = float(np.abs((a @ b).double().numpy() - ref).max())
            bound = 2 * base + np.finfo(np.float32).eps * max(1.0, float(np.abs(ref).max()))
            errs = {
                name: float(np.abs(fma_chains(a.numpy(), b.numpy(), ch).astype(np.float64) - ref).max())
                for name, ch in orders(k).items()
            }
            for name, e in errs.items():
                w = worst.setdefault(name, [0.0, 0.0, 0.0])
                w[0] = max(w[0], e / base)
                w[1] = max(w[1], e / bound)
                w[2] = max(w[2], e / errs["seq"])
        for name, (r0, r1, r2) in worst.items():
            print(f"{k:5d} {name:7} {r0:9.2f} {r1:9.2f} {r2:8.2f}")


if __name__ == "__main__":
    main()
