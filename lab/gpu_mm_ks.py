"""v14's K slices in a cluster (each 128x128 tile in a cluster of s blocks, the partials summed
through distributed shared memory) against one pass without a split and cuBLAS, at the
products whose tiles fill at most half the GPU. (The split it replaced, fp32 slices in
global memory summed by torch, was measured beside it at 4cfe0a9: NOTES (aj).)

    PYTHONPATH=src python lab/gpu_mm_ks.py --out DIR [--max-seconds 240]

Per product: every forced slice count s (2-8 where tiles x s blocks run at once) judged
against float64 and timed (CUDA events, L2 flushed, median), the launcher's choice
(``cuda_v15``), ``v14_n128`` (one pass, no split) and torch.matmul. Rows to DIR/mm_ks.jsonl; a table last.
"""

from __future__ import annotations

import argparse
import sys
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from gpu_mm_v11 import T0, Fatal, Rows, fatal_if_sticky, log, sync_or_die  # noqa: E402
from gpu_mm_v14 import operands, v14, v15  # noqa: E402

# (name, m, n, k, a_t, b_t, dtype): y [m, n] = a [m, k] @ b [k, n], a_t / b_t: stored transposed
CASES = [
    ("gpt2 dB 768x768x8192", 768, 768, 8192, True, False, torch.bfloat16),
    ("gpt2 dB 768x768x8192 fp16", 768, 768, 8192, True, False, torch.float16),
    ("fwd 256x4096x4096", 256, 4096, 4096, False, True, torch.bfloat16),
    ("nn 256x4096x4096", 256, 4096, 4096, False, False, torch.bfloat16),
    ("fwd 256x4096x14336", 256, 4096, 14336, False, True, torch.bfloat16),
    ("fwd 128x4096x4096", 128, 4096, 4096, False, True, torch.bfloat16),
    ("dB 1024x1024x4096", 1024, 1024, 4096, True, False, torch.bfloat16),
    ("edge 700x500x8000 tn", 700, 500, 8000, True, False, torch.bfloat16),
    ("edge 768x768x1024", 768, 768, 1024, True, False, torch.bfloat16),
    ("edge 200x136x20000 nt", 200, 136, 20000, False, True, torch.bfloat16),
]


def ks_fn(s: int):
    from kernellab.ops.matmul import cuda as mc

    def run(a, b):
        a3, wa = mc._v14_operand(a.unsqueeze(0))
        b3, wb = mc._v14_operand(b.unsqueeze(0))
        np8 = -(-b.shape[-1] // 8) * 8
        return mc._launch_v14_ks(a3, wa, b3, wb, s, np8, torch.cuda.current_device())[0]

    return run


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--max-seconds", type=float, default=240.0)
    p.add_argument("--hang-seconds", type=float, default=30.0)
    args = p.parse_args()
    import kernellab.ops.matmul  # noqa: F401
    from kernellab.harness.bench import git_sha, versions
    from kernellab.harness.compare import judge
    from kernellab.harness.timer import time_cuda
    from kernellab.ops.matmul import cuda as mc

    out = Path(args.out) / "mm_ks.jsonl"
    gpu = torch.cuda.get_device_name()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    rows = Rows(out, {"gpu": gpu, **versions(), "git_sha": git_sha(), "time": stamp})
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    name = "matmul_v14_ks_mk_kn_bf16"
    cap = {s: mc._ks_blocks(name, s, 0) for s in range(2, mc.V14_KS_MAX + 1)}
    log(f"{gpu}: blocks at once in clusters of s: {cap}")
    rows.add(kind="capacity", blocks=cap)
    ok = True
    try:
        for case, m, n, k, a_t, b_t, dt in CASES:
            if time.perf_counter() - T0 > args.max_seconds:
                log("max-seconds reached")
                break
            a, b = operands(m, n, k, a_t, b_t, dt, zlib.crc32(case.encode()))
            tiles = -(-m // 128) * -(-(-(-n // 8) * 8) // 128)
            fns = {"torch": torch.matmul, "cuda_v15": v15(), "v14_n128": v14(128)}
            for s in range(2, mc.V14_KS_MAX + 1):
                if tiles * s <= cap[s] and -(-k // 64) >= s:
                    fns[f"ks{s}"] = ks_fn(s)
            chosen = mc.v14_slices(m, -(-n // 8) * 8, k, 1, sms, cap.get)
            ref = torch.matmul(a.double(), b.double())
            want = torch.matmul(a, b)
            times = {}
            for nm, fn in fns.items():
                try:
                    y = fn(a, b)
                    sync_or_die(rows, f"{nm} {case}", args.hang_seconds)
                    v = judge(y, ref, dt, want)
                    ok &= bool(v.ok)
                    if not v.ok:
                        log(f"{case} {nm}: FAIL {v.detail}")
                    again = fn(a, b)  # the same bits twice (the slice order is fixed)
                    same = bool(torch.equal(again, y))
                    ok &= same or nm == "torch"
                    t = time_cuda(lambda fn=fn: fn(a, b))
                    times[nm] = t.median_ms
                    rows.add(kind="time", case=case, m=m, n=n, k=k, a_t=a_t, b_t=b_t, dtype=str(dt),
                             backend=nm, ok=bool(v.ok), repeatable=same, detail=v.detail, chosen_s=chosen,
                             status="ok", **t.as_dict())  # fmt: skip
                except Fatal:
                    raise
                except Exception as e:  # noqa: BLE001
                    ok = False
                    log(f"{case} {nm}: ERROR {e}")
                    rows.add(kind="error", case=case, backend=nm, status=repr(e))
                    fatal_if_sticky(e)
            ref_ms = times.get("torch")
            cells = [f"{nm} {ms * 1e3:.1f}us ({ref_ms / ms:.3f})" for nm, ms in times.items() if ref_ms]
            log(f"{case} (tiles {tiles}, launcher s={chosen}): " + "  ".join(cells))
            torch.cuda.empty_cache()
    except Fatal as e:
        ok = False
        log(f"STOPPED: {e}")
        rows.add(kind="stop", status=str(e))
    log(f"rows in {out}; {'all correct and repeatable' if ok else 'FAILURES'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
