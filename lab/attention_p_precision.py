"""How the attention backward's recomputed P loses fp32 precision, in plain PyTorch (fp32
emulation of the kernel's arithmetic against float64; no GPU, no Triton).

    python lab/attention_p_precision.py [--shape 1x2x17x33x16] [--window 4,6] [--draws 200]

For random q, k, dO it forms dv = P^T dO with P computed five ways and prints each one's
max error against float64, and how often it exceeds the check's bound (twice PyTorch's
own error, softmax in fp32, plus one fp32 eps times max(1, max |dv|): ``judge``):
  lse:    exp2(s * scale * log2 e - lse), lse = m + log2(l) rounded once to fp32 (the
          Triton backward's P for 16-bit inputs, and for fp32 until the fifteenth session)
  m,log2l: exp2((s - m) - log2(l)), the row max and log2(l) kept apart
  raw:    exp2((qk - M) * c - log2(l)) with qk the unscaled scores, M their row max and
          c = scale * log2 e: the difference near the max is exact (what the fp32 Triton
          kernels do, from statistics the backward recomputes: ``ops.attention.triton.lse_shape``)
  m,l:    exp2(s - m) / l (the forward's own form)
  m,1/l:  exp2(s - m) * (1 / l), the reciprocal once per row
  torch:  torch.softmax in fp32
The rounding of lse costs |lse| * 2^-24 in every exponent, and scaling before the max is
subtracted rounds s * c to |s * c| * 2^-24; at rows where PyTorch's error is a few ulps
that alone breaks the check's rule now and then. (On the interpreter the kernels' dots
also rounded by tile shape, which no emulation here models: see _SHARED_F64.)
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
    errs: dict[str, list[float]] = {k: [] for k in ("lse", "m,log2l", "raw", "m,l", "m,1/l", "torch")}
    floors: list[float] = []
    for seed in range(args.draws):
        gen = torch.Generator().manual_seed(seed)
        q, k, do = (torch.randn(b, h, n, d, generator=gen) for n in (sq, sk, sq))
        s64 = ((q.double() @ k.double().mT) * scale).masked_fill(~ok, float("-inf"))
        dv64 = torch.softmax(s64, -1).mT @ do.double()
        qk = q @ k.mT
        s2 = (qk * torch.tensor(scale * L2E, dtype=torch.float32)).masked_fill(~ok, float("-inf"))
        m = s2.amax(-1, keepdim=True)
        lsum = torch.exp2(s2 - m).sum(-1, keepdim=True)
        ll = torch.log2(lsum)
        c = torch.tensor(scale * L2E, dtype=torch.float32)
        qk_m = qk.masked_fill(~ok, float("-inf"))
        big_m = qk_m.amax(-1, keepdim=True)
        ll_raw = torch.log2(torch.exp2((qk_m - big_m) * c).sum(-1, keepdim=True))
        forms = {
            "lse": torch.exp2(s2 - (m + ll)),
            "m,log2l": torch.exp2((s2 - m) - ll),
            "raw": torch.exp2((qk_m - big_m) * c - ll_raw),
            "m,l": torch.exp2(s2 - m) / lsum,
            "m,1/l": torch.exp2(s2 - m) * (1 / lsum),
            "torch": torch.softmax((qk * scale).masked_fill(~ok, float("-inf")), -1),
        }
        floors.append(torch.finfo(torch.float32).eps * max(1.0, float(dv64.abs().max())))
        for name, p in forms.items():
            errs[name].append(float(((p.mT @ do).double() - dv64).abs().max()))
    print(f"dv = P^T dO at {args.shape}, window ({left}, {right}), {args.draws} draws, fp32 vs float64:")
    for name, e in errs.items():
        over = sum(x > 2 * t + f for x, t, f in zip(e, errs["torch"], floors))
        print(f"  {name:8s} median {statistics.median(e):.3g}  max {max(e):.3g}  over the bound: {over}")


if __name__ == "__main__":
    main()
