"""The default (``backend=None``) at model shapes no table row holds, timed beside every
backend of the op: how often does the choice land within 3% of the fastest where nobody
tuned? ``python -m kernellab.harness.choice_cv`` estimates it from the table's own rows;
this measures it on the GPU, at shapes of model families outside the table (Qwen2-0.5B and
1.5B, Phi-2, Gemma-2B, TinyLlama, Llama-3.2-3B).

    python lab/gpu_heldout_default.py --out heldout.jsonl [--budget 0.3] [--ops matmul,rms_norm] [--start N]

The backends timed are those a tune times for the default (``harness.tune.candidates``:
no naive PyTorch, torch.compile or teaching rungs), paired at launch-bound cases as a tune
pairs them. Rows go to ``--out`` (bench rows, the "default" backend among them); the summary prints,
per case, the default's pick and why, and its time over the fastest by the times the
choice ranks by (device time where the fastest kernel takes DEVICE_BOUND_MS or more, else
the larger of device and loop time). A case that has a row in this GPU's table is skipped
and said so: it is not held out.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

T = 4096  # tokens: 2 sequences of 2048

# (op, shape, dtype, modes, options)
CASES = [
    # Qwen2-0.5B: hidden 896, MLP 4864, 14 heads x 64 (2 kv heads), vocab 151936
    ("matmul", (T, 1152, 896), "bf16", ("fwd", "fwdbwd"), {"b_t": True}),
    ("matmul", (T, 4864, 896), "bf16", ("fwd", "fwdbwd"), {"b_t": True}),
    ("matmul", (T, 896, 4864), "bf16", ("fwd", "fwdbwd"), {"b_t": True}),
    ("rms_norm", (8192, 1536), "bf16", ("fwd", "fwdbwd"), {}),  # Qwen2-1.5B's width
    ("cross_entropy", (T, 151936), "bf16", ("fwd", "fwdbwd"), {}),
    ("attention", (2, 12, 2048, 128), "bf16", ("fwd", "fwdbwd"), {"causal": True}),  # Qwen2-1.5B's
    # Phi-2: hidden 2560, MLP 10240 (gelu), 32 heads x 80, layer norm, vocab 51200
    ("matmul", (T, 7680, 2560), "bf16", ("fwd", "fwdbwd"), {"b_t": True}),
    ("matmul", (T, 10240, 2560), "bf16", ("fwd", "fwdbwd"), {"b_t": True}),
    ("matmul", (T, 2560, 10240), "bf16", ("fwd", "fwdbwd"), {"b_t": True}),
    ("layer_norm", (T, 2560), "bf16", ("fwd", "fwdbwd"), {}),
    ("gelu", (T * 10240,), "bf16", ("fwd", "fwdbwd"), {}),
    ("cross_entropy", (T, 51200), "bf16", ("fwd", "fwdbwd"), {}),
    ("attention", (2, 32, 2048, 80), "bf16", ("fwd", "fwdbwd"), {"causal": True}),
    # Gemma-2B: hidden 2048, MLP 16384, 8 heads x 256, vocab 256000
    ("matmul", (T, 16384, 2048), "bf16", ("fwd", "fwdbwd"), {"b_t": True}),
    ("matmul", (T, 2048, 16384), "bf16", ("fwd", "fwdbwd"), {"b_t": True}),
    ("rms_norm", (T, 3072), "bf16", ("fwd", "fwdbwd"), {}),  # Llama-3.2-3B's width
    ("attention", (2, 8, 2048, 256), "bf16", ("fwd", "fwdbwd"), {"causal": True}),
    # TinyLlama: hidden 2048, MLP 5632, 32 heads x 64 (4 kv heads), vocab 32000; decode
    ("matmul", (T, 5632, 2048), "bf16", ("fwd", "fwdbwd"), {"b_t": True}),
    ("matmul", (T, 2048, 5632), "bf16", ("fwd", "fwdbwd"), {"b_t": True}),
    ("matmul", (1, 5632, 2048), "bf16", ("fwd",), {"b_t": True}),
    ("matmul", (8, 2048, 5632), "bf16", ("fwd",), {"b_t": True}),
    ("cross_entropy", (T, 32000), "bf16", ("fwd", "fwdbwd"), {}),
    ("softmax", (T, 32000), "fp32", ("fwd", "fwdbwd"), {}),
]


def main() -> int:
    import kernellab  # noqa: F401  (registers every op)
    from kernellab.core import choice, registry, tables
    from kernellab.core.shapes import key_of_shape
    from kernellab.core.spec import options_str
    from kernellab.harness import tune
    from kernellab.harness.bench import bench

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget", type=float, default=0.3)
    ap.add_argument("--ops", default=None, help="comma list (default: every case's op)")
    ap.add_argument("--device", default="cuda", help="cuda (default); cpu: a smoke run of the flow")
    ap.add_argument("--gpu", default=None, help="the table to hold out from (default: this GPU's)")
    ap.add_argument("--start", type=int, default=0, help="skip CASES before this index (resume a cut run)")
    a = ap.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    gpu = a.gpu or torch.cuda.get_device_name()
    table = tables.load_table(gpu) or {"rows": []}
    held = {(r["op"], r["dtype"], r["mode"], tuple(r["key"]), r.get("options", "")) for r in table["rows"]}
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    only = set(a.ops.split(",")) if a.ops else None
    hits = scored = 0
    lines = []
    for op, shape, dn, modes, opts in CASES[a.start :]:
        if only and op not in only:
            continue
        key = tuple(key_of_shape(op, shape))
        for mode in modes:
            if (op, dn, mode, key, options_str(opts)) in held:
                lines.append(f"{op} {dn} {mode} {shape} {opts}: in the table, not held out (skipped)")
                continue
            # the backends a tune times for the default (no naive, torch.compile or teaching rungs)
            backends = [b for b in tune.candidates(op) if a.device in registry.get(op, b).devices]
            rows = bench(op, backends=backends + ["default"], shapes=[shape], dtypes=[dtypes[dn]],
                         modes=(mode,), device=a.device, budget_s=a.budget, options=dict(opts),
                         paired_rounds=tune.PAIRED_ROUNDS)  # fmt: skip
            with open(a.out, "a") as f:
                for r in rows:
                    f.write(json.dumps({**r, "heldout": True}) + "\n")
            ok = {r["backend"]: r for r in rows if r.get("status") == "ok"}
            if "default" not in ok or len(ok) < 2:
                lines.append(f"{op} {dn} {mode} {shape} {opts}: default or peers did not run")
                continue
            peers = {b: r for b, r in ok.items() if b != "default"}
            device = {b: r["median_ms"] for b, r in peers.items()}
            eff = {b: r.get("effective_ms") or r["median_ms"] for b, r in peers.items()}
            by_device = choice.decided_by_device(eff, device)
            times = device if by_device else eff
            fastest = min(times, key=times.get)
            d = ok["default"]
            mine = d["median_ms"] if by_device else (d.get("effective_ms") or d["median_ms"])
            ratio = mine / times[fastest]
            pick, why = registry.choose_key(op, key, dtypes[dn], a.device, mode, options_str(opts))
            scored += 1
            hits += ratio <= 1.03
            lines.append(f"{op} {dn} {mode} {'x'.join(map(str, shape))} {options_str(opts)}: default {pick} "
                         f"{ratio:.3f}x the fastest ({fastest}, by {'device' if by_device else 'loop'} time)"
                         f"; {why[:300]}")  # fmt: skip
            print(lines[-1], flush=True)
    print(f"\n== held out at {gpu}: the default within 3% of the fastest at {hits} of {scored} cases")
    for line in lines:
        print(" ", line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
