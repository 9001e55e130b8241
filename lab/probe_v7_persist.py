"""v7's forward at its default tiling (V7_TILES) beside the tilings of V7_TILINGS with the
same key tile in one K/V ring (a block a (query block, head), "ed"; persistent, "p": one block
an SM walking (query block, head, batch) items; "o": o staged apart from Q) and cuDNN, at the
short head-dim-64 sequences where a block's start and end are much of its time (ViT-B/16,
GPT-2) and two longer ones for contrast:

    python lab/probe_v7_persist.py [--out FILE.jsonl] [--shapes B,H,S,D[,c];...] [--tilings T,...] [--dry-run]

Per case: the forward of cuDNN (SDPA's backend), of v7 at those tilings (harness.timer.time_cuda,
L2 flushed), and each one's largest difference from cuDNN's o. A row per case, printed and
appended to --out."""

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from kernellab.ops.attention import cuda_sm90 as cs  # noqa: E402

# (B, H, S, D, causal)
SHAPES = [
    (256, 12, 197, 64, False),  # ViT-B/16
    (256, 12, 197, 64, True),
    (8, 12, 1024, 64, False),  # GPT-2
    (8, 12, 1024, 64, True),
    (4, 16, 1024, 64, False),
    (2, 16, 2048, 128, True),
    (4, 32, 2048, 128, False),
]


def tilings(d: int) -> list:
    """V7_TILES[d], then the tilings of V7_TILINGS[d] with its key tile, exponentials and
    descriptors in one K/V ring: a block a (query block, head) and the persistent ones."""
    own = cs.V7_TILES[d]
    return [own] + [
        t for t in cs.V7_TILINGS[d] if t.bn == own.bn and t.fast_exp and t.desc_add and not t.split_kv
    ]


def parse_tiling(text: str):
    """'208x3edpo' as a Tiles (cuda_sm90.Tiles.parse), a usage error if it is not one."""
    try:
        return cs.Tiles.parse(text)
    except ValueError as e:
        raise SystemExit(f"--tilings: {e}") from None


def _builds(d: int, t) -> bool:
    try:
        cs.check_tiles(d, t)
    except ValueError:
        return False
    return True


def parse_shapes(text: str) -> list[tuple]:
    """'B,H,S,D[,c];...' (c: causal) as SHAPES' tuples."""
    out = []
    for part in filter(None, text.split(";")):
        f = part.split(",")
        if len(f) not in (4, 5) or (len(f) == 5 and f[4] != "c"):
            raise SystemExit(f"--shapes: B,H,S,D[,c] separated by ';', got {part!r}")
        out.append((*(int(x) for x in f[:4]), len(f) == 5))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--shapes", default=None, help="B,H,S,D[,c] separated by ';' (default: SHAPES)")
    ap.add_argument("--tilings", default=None, help="v7 tilings to time instead, e.g. 128x3edpo,208x3edpo")
    ap.add_argument("--dry-run", action="store_true", help="print the cases and tilings, run nothing")
    a = ap.parse_args(argv)
    shapes = parse_shapes(a.shapes) if a.shapes else SHAPES
    pick = tilings
    if a.tilings:
        chosen = [parse_tiling(x) for x in a.tilings.split(",") if x.strip()]

        def pick(d: int) -> list:  # the --tilings that build at head dim d
            return [t for t in chosen if _builds(d, t)]
    if a.dry_run:
        for b, h, s, d, causal in shapes:
            print(f"{b}x{h}x{s}x{d} causal={causal}: cudnn, " + ", ".join(f"v7@{t}" for t in pick(d)))
        return 0

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from kernellab.harness import timer
    from kernellab.harness.bench import git_sha

    tkw = dict(min_time_s=0.1, budget_s=0.8)
    for b, h, s, d, causal in shapes:
        gen = torch.Generator("cuda").manual_seed(0)
        q, k, v = (
            torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3)
        )
        scale = 1 / math.sqrt(d)

        def cudnn():
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        ref = cudnn().float()
        row = dict(gpu=torch.cuda.get_device_name(), git_sha=git_sha(), B=b, H=h, S=s, D=d, causal=causal,
                   default=str(cs.v7_tiles(d, s, causal)), ms={}, max_diff_vs_cudnn={})  # fmt: skip
        row["ms"]["cudnn"] = round(timer.time_cuda(cudnn, **tkw).median_ms, 4)
        for t in pick(d):

            def fwd(t=t):
                return cs.forward(q, k, v, causal, scale, "v7", t)[0]

            name = f"v7@{t}"
            try:
                o = fwd()
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001 (a lab tiling that fails is a row's note)
                row.setdefault("errors", {})[name] = f"{type(e).__name__}: {e}"[:200]
                continue
            row["max_diff_vs_cudnn"][name] = round((o.float() - ref).abs().max().item(), 5)
            row["ms"][name] = round(timer.time_cuda(fwd, **tkw).median_ms, 4)
        row["x_cudnn"] = {n: round(row["ms"]["cudnn"] / t, 3) for n, t in row["ms"].items()}
        print(json.dumps(row), flush=True)
        if a.out:
            with open(a.out, "a") as f:
                f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
