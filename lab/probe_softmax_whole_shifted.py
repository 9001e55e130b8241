"""Whole softmax rows off 16-byte boundaries, one a program: read as the aligned chunks that
hold them (``Config.whole_shifted``, the default) against one element a load, forward and
backward alone, fp32 and bf16:

    python lab/probe_softmax_whole_shifted.py [--out FILE.jsonl]

One row per (shape, dtype, pass): ms of each (harness.timer, L2 flushed) and the largest
difference between the two outputs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from profiled import emit_row  # noqa: E402

from kernellab.harness import timer  # noqa: E402
from kernellab.harness.bench import git_sha  # noqa: E402
from kernellab.ops.softmax import triton as st  # noqa: E402

CASES = {
    torch.float32: ("4096x4097", "4099x1025", "16384x1025", "8x4097", "1024x3001"),
    torch.bfloat16: ("4099x1025", "16384x1025", "1024x1999"),
}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    off = st.Config(whole_shifted=False)
    for dtype, shapes in CASES.items():
        for shape in shapes:
            n_rows, n_cols = (int(s) for s in shape.split("x"))
            gen = torch.Generator("cuda").manual_seed(0)
            x = (torch.randn(n_rows, n_cols, device="cuda", generator=gen) * 4).to(dtype)
            dy = torch.randn(n_rows, n_cols, device="cuda", generator=gen).to(dtype)
            y = st._fwd(x)
            block, rows, single, _ = st._config(n_cols, st.CONFIG, x.element_size(), n_rows=n_rows, sms=132)
            align = st._align(n_cols, single, x.element_size(), rows, block)
            for which, on, by in (("fwd", lambda: st._fwd(x), lambda: st._fwd(x, off)),
                                  ("bwd", lambda: st._bwd(dy, y), lambda: st._bwd(dy, y, off))):  # fmt: skip
                row = dict(gpu=torch.cuda.get_device_name(), git_sha=git_sha(), shape=shape,
                           dtype=str(dtype).split(".")[1], which=which, block=block, align=align)  # fmt: skip
                row["max_diff"] = float((on().float() - by().float()).abs().max())
                for name, fn in (("shifted", on), ("scalar", by)):
                    row[f"{name}_ms"] = round(timer.time_cuda(fn, min_time_s=0.05, budget_s=0.3).median_ms, 5)
                emit_row(row, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
