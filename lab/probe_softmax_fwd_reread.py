"""The Triton softmax forward at 4096x8192 (bf16 0.95x Liger's in the H200 table): whole rows
with and without the re-read from L2 (``Config.fwd_reread``) at 8, 16 and 32 warps, beside
the default, device time (harness.timer, L2 flushed):

    python lab/probe_softmax_fwd_reread.py [--out FILE.jsonl]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402

from kernellab.harness.timer import time_cuda  # noqa: E402
from kernellab.ops.softmax import triton as sm  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    rows = []
    for dt in (torch.bfloat16, torch.float32):
        x = torch.randn(4096, 8192, device="cuda", dtype=dt)
        ref = torch.softmax(x.float(), -1)
        cases = [("default", None, None, sm.CONFIG)]
        cases += [
            ("cfg", rr, w, replace(sm.CONFIG, fwd_reread=rr, fwd_warps=w))
            for rr in (True, False)
            for w in (8, 16, 32)
        ]
        for name, rr, w, cfg in cases:
            err = float((sm._fwd(x, cfg).float() - ref).abs().max())
            t = time_cuda(lambda cfg=cfg: sm._fwd(x, cfg), budget_s=0.3).median_ms
            row = dict(gpu=torch.cuda.get_device_name(), shape="4096x8192", dtype=str(dt).split(".")[-1],
                       variant=name, reread=rr, warps=w, us=round(t * 1e3, 2), err=err)  # fmt: skip
            print(json.dumps(row), flush=True)
            rows.append(row)
    if a.out:
        with open(a.out, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
