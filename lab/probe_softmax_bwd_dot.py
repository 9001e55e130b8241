"""The fp32 softmax backward of whole rows at odd widths (4096x4097, 4099x1025: 0.93x Liger's
forward+backward in the H200 table): what the compensated row dot (Dot2, ``COMP``) and the warp
count cost against Liger's plain fp32 dot, backward alone:

    python lab/probe_softmax_bwd_dot.py [--out FILE.jsonl] [--shapes 4096x4097,4099x1025,...]

Per shape: kernellab's Triton backward as the default launches it (``softmax.triton._bwd``),
and a lab copy of its one-block-a-row kernel with the row dot as Dot2 (the default's), as an
fp64 sum, or as a plain fp32 sum (Liger's arithmetic: a bound, not a candidate: it misses the
check's bound where one y is near 1), each at 8, 16 and 32 warps; then Liger's backward
kernel where liger-kernel is installed. Each variant's largest |dx| error against an fp64
backward is in its row ("err")."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from profiled import emit_row, measure  # noqa: E402

from kernellab import triton_support  # noqa: E402
from kernellab.harness.bench import git_sha  # noqa: E402
from kernellab.ops.softmax import triton as st  # noqa: E402


@triton_support.jit
def _row_bwd(y_ptr, dy_ptr, dx_ptr, n_cols, BLOCK: tl.constexpr, DOT: tl.constexpr):
    # one row a program; DOT 0: Dot2 pairs (the default's arithmetic), 1: fp64 sum, 2: fp32 sum
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    offs = row * n_cols + cols
    y = tl.load(y_ptr + offs, mask=mask, other=0.0)
    dy = tl.load(dy_ptr + offs, mask=mask, other=0.0)
    if DOT == 0:
        p, ep = st._dot2_terms(y, dy)
        hi, lo = st._dot2_reduce(p, ep, 0)
        dx = st._dot2_dx(y, dy, hi, lo)
    elif DOT == 1:
        s = tl.sum(y.to(tl.float64) * dy.to(tl.float64), axis=0)
        dx = (y.to(tl.float64) * (dy.to(tl.float64) - s)).to(tl.float32)
    else:
        dx = y * (dy - tl.sum(y * dy, axis=0))
    tl.store(dx_ptr + offs, dx, mask=mask)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--shapes", default="4096x4097,4099x1025,4096x4096,8192x1024")
    a = ap.parse_args()
    try:
        from liger_kernel.ops import softmax as liger
    except ImportError:
        liger = None
    for shape in a.shapes.split(","):
        n_rows, n_cols = (int(s) for s in shape.split("x"))
        gen = torch.Generator("cuda").manual_seed(0)
        x = torch.randn(n_rows, n_cols, device="cuda", generator=gen) * 4
        y = torch.softmax(x, -1)
        dy = torch.randn(n_rows, n_cols, device="cuda", generator=gen)
        y64, dy64 = y.double(), dy.double()
        ref = y64 * (dy64 - (y64 * dy64).sum(-1, keepdim=True))
        block = triton.next_power_of_2(n_cols)
        base = dict(gpu=torch.cuda.get_device_name(), git_sha=git_sha(), shape=shape, dtype="fp32",
                    block=block)  # fmt: skip

        def err(dx):
            return float((dx.double() - ref).abs().max())

        cases = [("default", None, lambda: st._bwd(dy, y))]
        for dot, name in ((0, "dot2"), (1, "fp64"), (2, "fp32")):
            for warps in (8, 16, 32):
                out = torch.empty_like(y)

                def run(dot=dot, warps=warps, out=out):
                    _row_bwd[(n_rows,)](y, dy, out, n_cols, BLOCK=block, DOT=dot, num_warps=warps)
                    return out

                cases.append((f"lab-{name}", warps, run))
        if liger is not None:
            bs, warps = liger.calculate_settings(n_cols)
            cases.append(("liger", warps, lambda b=bs, w=warps: liger._softmax_backward(dy, y, b, w, False)))
        for name, warps, fn in cases:
            row = dict(base, variant=name, warps=warps)
            try:
                row["err"] = err(fn())
            except Exception as e:  # noqa: BLE001 (a variant that fails is a row's note)
                row["error"] = f"{type(e).__name__}: {e}"[:300]
                emit_row(row, a.out)
                continue
            measure(row, fn, top=2)
            emit_row(row, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
