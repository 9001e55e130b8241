"""How the attention backward's recomputed P loses fp32 precision, in plain PyTorch (fp32
emulation of the kernel's arithmetic against float64; no GPU, no Triton).

    python scripts/attention_p_precision.py [--shape 1x2x17x33x16] [--window 4,6] [--draws 200]

For random q, k, dO it forms dv = P^T dO with P computed four ways and prints each one's
max error against float64, and how often it exceeds twice PyTorch's own (softmax in fp32):
  lse:    exp2(s * scale * log2 e - lse), lse = m + log2(l) rounded once to fp32 (what the
          Triton backward does: P from the saved log-sum-exp)
  m,log2l: exp2((s - m) - log2(l)), the row max and log2(l) kept apart
  m,l:    exp2(s - m) / l (the forward's own form)
  torch:  torch.softmax in fp32
The rounding of lse costs |lse| * 2^-24 in every exponent; at rows where PyTorch's error is
a few ulps that alone breaks the check's 2x rule now and then.
"""

from __future__ import annotations

import argparse
import math
import statistics

import torch

L2E = 1.4426950408889634


def _mask(sq: int, sk: int, left: int, right: int) -> torch.Tensor:
    i, j = torch.arange(sq)[:, None], torch.arange(sk)[None, :]
    ok = torch.ones(sq, sk, dtype=torch.bool)
    if left >= 0:
        ok &= j >= i + sk - sq - left
    if right >= 0:
        ok &= j <= i + sk - sq + right
    return ok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="1x2x17x33x16", help="B x H x S_q x S_k x D")
    ap.add_argument("--window", default="4,6", help="left,right (-1: unbounded)")
    ap.add_argument("--draws", type=int, default=200)
    args = ap.parse_args()
    b, h, sq, sk, d = (int(v) for v in args.shape.split("x"))
    left, right = (int(v) for v in args.window.split(","))
    ok = _mask(sq, sk, left, right)
    scale = 1 / math.sqrt(d)
    errs: dict[str, list[float]] = {k: [] for k in ("lse", "m,log2l", "m,l", "torch")}
    for seed in range(args.draws):
        gen = torch.Generator().manual_seed(seed)
        q, k, do = (torch.randn(b, h, n, d, generator=gen) for n in (sq, sk, sq))
        s64 = ((q.double() @ k.double().mT) * scale).masked_fill(~ok, float("-inf"))
        dv64 = torch.softmax(s64, -1).mT @ do.double()
        qk = q @ k.mT
        s2 = (qk * torch.tensor(scale * L2E, dtype=torch.float32)).masked_fill(~ok, float("-inf"))
        m = s2.amax(-1, keepdim=True)
        l = torch.exp2(s2 - m).sum(-1, keepdim=True)
        forms = {
            "lse": torch.exp2(s2 - (m + torch.log2(l))),
            "m,log2l": torch.exp2((s2 - m) - torch.log2(l)),
            "m,l": torch.exp2(s2 - m) / l,
            "torch": torch.softmax((qk * scale).masked_fill(~ok, float("-inf")), -1),
        }
        for name, p in forms.items():
            errs[name].append(float(((p.mT @ do).double() - dv64).abs().max()))
    print(f"dv = P^T dO at {args.shape}, window ({left}, {right}), {args.draws} draws, fp32 vs float64:")
    for name, e in errs.items():
        over = sum(x > 2 * t for x, t in zip(e, errs["torch"]))
        print(f"  {name:8s} median {statistics.median(e):.3g}  max {max(e):.3g}  over 2x torch's: {over}")


if __name__ == "__main__":
    main()
