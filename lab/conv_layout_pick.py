"""Reads `lab/gpu_conv_parts.py --parts layout` rows and prints, per dtype, kernel and
layer, the fastest way each tap kernel reads its gathered operand: as given without pixel
runs ("nchw"), as given told its runs ("runs", PIXEL_RUNS) or through channels_last copies
("cl", TAPS_NHWC; the copies timed with it), beside cuDNN; then the choice that wins at
every layer per (kernel, dtype), or "mixed".

    python lab/conv_layout_pick.py benchmarks/results/conv-layout-*.jsonl
"""

import json
import sys

# (kernel, the row's key for it without a suffix; wgrad at the dbias mode the library uses)
KEYS = {"fwd": "ours_fwd", "dgrad": "ours_dgrad", "wgrad": None, "bwd": "ours_bwd"}
SUFFIX = {"nchw": "", "runs": "_runs", "cl": "_cl"}
CUDNN = {"fwd": "cudnn_fwd", "dgrad": "cudnn_dx", "wgrad": "cudnn_dw", "bwd": "cudnn_bwd"}
WGRAD_DB = {"fp32": 0, "bf16": 2, "fp16": 2}


def times(row: dict, kernel: str) -> dict[str, float]:
    out = {}
    for way, suf in SUFFIX.items():
        key = f"ours_wgrad_db{WGRAD_DB[row['dtype']]}{suf}" if kernel == "wgrad" else KEYS[kernel] + suf
        if key in row:
            out[way] = row[key]
    return out


def main(paths: list[str]) -> dict:
    rows = [json.loads(line) for p in paths for line in open(p) if '"layout"' in line]
    picks: dict[tuple[str, str], set[str]] = {}
    for row in rows:
        for kernel in KEYS:
            t = times(row, kernel)
            if not t:
                continue
            best = min(t, key=t.get)
            picks.setdefault((kernel, row["dtype"]), set()).add(best)
            cells = "  ".join(f"{w} {v:.4f}" for w, v in t.items())
            cudnn = row.get(CUDNN[kernel])
            print(f"{row['dtype']:5} {row['shape']:22} {kernel:6} {cells}  cuDNN {cudnn}  -> {best}")
    summary = {f"{k}/{d}": (ways.pop() if len(ways) == 1 else "mixed") for (k, d), ways in picks.items()}
    print(json.dumps(summary, indent=1))
    return summary


if __name__ == "__main__":
    main(sys.argv[1:])
