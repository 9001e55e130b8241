"""The Hopper CUDA attention backwards (backends cuda_v8 and cuda_v9: attention_sm90_bwd.cu
behind cuda_v7's forward; ``VARIANTS``) on a lent H100 / H200: correctness first, then
forward+backward and backward-only time, side by side in one run, against SDPA's cuDNN and
FlashAttention-2 kernels and kernellab's Triton backend.

    python lab/gpu_attn_bwd_sm90.py --out DIR [--quick] [--max-seconds 300] [--head-dims 256]

Each stage runs in a subprocess under a timeout (rows are written as each case finishes),
so a kernel that hangs (a barrier protocol that deadlocks) costs its stage's timeout and is
reported, not the whole device call.
1. ``check``: dq, dk, dv of each variant (through the public op and autograd) against the float64
   reference at small and odd shapes (one row, primes, tails of the 64-row and 128-key
   tiles, S_q < S_k and S_q > S_k, 3-D, GQA 4, MQA), every head dim (64, 80, 96, 128, 256;
   ``bwd`` in a row says whether the CUDA backward or Triton's ran), causal and not, bf16
   (fp16 on a subset), judged by the check's rule (error within 2x PyTorch's own in the same
   dtype + a floor); also against ``emulate_backward`` (the kernels' arithmetic in PyTorch;
   the max difference is reported; shapes up to 300 x 300). A failing case is reported and
   its (variant, head dim) is left out of the timing.
2. ``time``: device time by ``kernellab.harness.timer.time_cuda``, the timer ``bench`` and
   ``vendor_gap`` use (CUDA events, L2 flushed before each call, the device held busy by a
   spin kernel while the host enqueues, median), of forward+backward (``torch.autograd.grad``
   of the output) and of the backward alone (the graph kept, ``retain_graph``); and the
   time per call of forward+backward in a plain loop (``loop_ms``: host cost included,
   what an eager step sees). bf16, at (B, H, S, D): (1, 32, 2048, 80 causal), (1, 32q/8kv,
   4096, 128 causal GQA), (4, 16, 1024, 64 causal), (8, 16, 256, 96), (2, 16, 2048, 128),
   (1, 8, 4096, 256 causal): cuDNN, FlashAttention-2 (flash SDPA), Triton, cuda_v8,
   cuda_v9; x_cudnn = cuDNN's time over ours (> 1: ours faster). At a head dim with lab
   builds (``cuda_sm90_bwd.BWD_LAB``: -D options of the main kernel, ``BwdOpts``), the
   backward alone launched directly, the default's and each build's, side by side.
   (``triton.testing.do_bench``, used here before, records its events around each call
   without holding the device: where a call's host cost (Python, autograd, custom-op
   dispatch, tensor-map encoding, the launches) exceeds its device time, the GPU idles
   inside the timed region and the events time the host. That is why it reported cuda_v8's
   4 x 16 x 1024 D64 causal fwd+bwd at ~3x vendor_gap's device time; the loop column shows
   that host-bound time on its own.)
Rows: DIR/attn_bwd_sm90.jsonl; the table is printed last and written to
DIR/attn_bwd_sm90.txt. ``--quick``: fewer check shapes and timing repetitions.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

VARIANTS = ("cuda_v8", "cuda_v9")  # the CUDA backwards compared side by side
TIME_CASES = [  # (B, H_q, H_kv, S, D, causal)
    (1, 32, 32, 2048, 80, True),
    (1, 32, 8, 4096, 128, True),
    (4, 16, 16, 1024, 64, True),
    (8, 16, 16, 256, 96, False),
    (2, 16, 16, 2048, 128, False),
    (1, 8, 8, 4096, 256, True),
    (1, 8, 4, 4096, 256, False),  # Gemma-2's GQA at head dim 256
    (1, 8, 4, 4096, 256, True),
]


def _meta() -> dict:
    import torch

    from kernellab.harness.bench import git_sha, versions

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return dict(gpu=gpu, **versions(), git_sha=git_sha(), time=time.strftime("%Y-%m-%dT%H:%M:%S"))


def _check_shapes(d: int, quick: bool):
    bf, both = ("bf16",), ("bf16", "fp16")
    shapes = [
        ((1, 1, 1, 1, d), both),
        ((2, 3, 17, 17, d), bf),
        ((1, 2, 63, 129, d), both),  # tails of the 64-row and 128-key tiles
        ((1, 2, 129, 127, d), bf),  # S_q > S_k: causal rows without a key
        ((1, 8, 2, 257, 255, d), both),  # GQA 4
    ]
    if not quick:
        shapes += [
            ((2, 4, 1, 130, 300, d), bf),  # MQA, S_q < S_k
            ((2, 191, d), bf),  # 3-D
            ((1, 4, 1000, 1000, d), bf),
        ]
    return shapes


# --------------------------------------------------------------------------- workers (subprocesses)


def _check_case(spec, A, cs, cb, judge, backend, shape, dtype, causal, seed) -> dict:
    """dq, dk, dv of one backend at one case against the float64 reference (judged by the
    check's rule) and, at small shapes, the variant's kernels against ``emulate_backward``."""
    import torch

    d = shape[-1]
    row = {}
    q, k, v = spec.make_inputs(shape, dtype, "cuda", seed)
    scale = 1 / math.sqrt(d)
    do = torch.randn(q.shape[:-1] + (d,), device="cuda").to(dtype)
    a64 = [t.double().requires_grad_() for t in (q, k, v)]
    ref = spec.reference(*a64, causal=causal, scale=scale)
    ref_g = torch.autograd.grad(ref, a64, do.double())

    def grads(name):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        o = A.attention(*leaves, causal=causal, scale=scale, backend=name)
        return torch.autograd.grad(o, leaves, do)

    base, got = grads("torch"), grads(backend)
    torch.cuda.synchronize()
    ok = True
    for name, g, r, b in zip(("dq", "dk", "dv"), got, ref_g, base):
        vd = judge(g, r, dtype, b)
        row[name] = dict(ok=bool(vd.ok), err=float(vd.err), bound=float(vd.bound))
        ok &= bool(vd.ok)
    # (emulate_backward loops in Python: the small shapes only)
    if cb.backward_kernel(d) == "cuda" and q.shape[-2] * k.shape[-2] <= 300 * 300:
        o, lse = cs.forward(q, k, v, causal, scale, cb.FWD_VARIANT)
        emu = cb.emulate_backward(do, q, k, v, o, lse, causal, scale)
        got2 = cb.backward(do, q, k, v, o, lse, causal, scale, backend.removeprefix("cuda_"))
        row["vs_emulate"] = {
            nm: float((g.float() - e.float()).abs().max()) for nm, g, e in zip(("dq", "dk", "dv"), got2, emu)
        }
    row["ok"] = ok
    return row


def worker_check(quick: bool, out: Path) -> int:
    import torch

    import kernellab
    import kernellab.ops.attention as A
    from kernellab.harness.compare import judge
    from kernellab.ops.attention import cuda_sm90 as cs
    from kernellab.ops.attention import cuda_sm90_bwd as cb

    spec = kernellab.get_spec("attention")
    meta = _meta()
    dts = {"bf16": torch.bfloat16, "fp16": torch.float16}
    bad = 0
    n = 0
    with out.open("a") as f:
        for d in cs.HEAD_DIMS:
            for shape, dtypes in _check_shapes(d, quick):
                for dn in dtypes:
                    for causal in (False, True):
                        for backend in VARIANTS:
                            n += 1
                            row = dict(meta, stage="check", backend=backend, D=d, shape=list(shape), dtype=dn,
                                       causal=causal, bwd=cb.backward_kernel(d))  # fmt: skip
                            try:
                                row.update(
                                    _check_case(spec, A, cs, cb, judge, backend, shape, dts[dn], causal, n)
                                )
                            except Exception as e:  # noqa: BLE001
                                row["ok"] = False
                                row["error"] = f"{type(e).__name__}: {e}"[:300]
                            bad += not row["ok"]
                            f.write(json.dumps(row) + "\n")
                            f.flush()
                            if not row["ok"]:
                                print(f"FAIL {backend} D{d} {shape} {dn} causal={causal}: {row}", flush=True)
    print(f"check: {n - bad}/{n} passed", flush=True)
    return 0


def worker_time(quick: bool, budget: float, skip: set[tuple[str, int]], out: Path, dims=None) -> int:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import kernellab
    from kernellab.harness import timer
    from kernellab.ops.attention import cuda_sm90_bwd as cb

    meta = _meta()
    t0 = time.perf_counter()

    def sdpa(backend):
        def run(q, k, v, causal):
            with sdpa_kernel([backend]):
                if q.shape[1] != k.shape[1]:
                    try:
                        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
                    except RuntimeError:
                        g = q.shape[1] // k.shape[1]
                        k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        return run

    impls = {"cudnn": sdpa(SDPBackend.CUDNN_ATTENTION), "flash": sdpa(SDPBackend.FLASH_ATTENTION)}
    for name in ("triton",) + VARIANTS:
        impls[name] = lambda q, k, v, causal, name=name: kernellab.attention(
            q, k, v, causal=causal, backend=name
        )
    # the timer's budget per measurement: stable medians in the full run, fewer reps in --quick
    tkw = dict(min_time_s=0.05, budget_s=0.4) if quick else dict(min_time_s=0.2, budget_s=1.5)
    with out.open("a") as f:
        for b, hq, hkv, s, d, causal in TIME_CASES:
            if dims and d not in dims:
                continue
            row = dict(meta, stage="time", timer="harness.timer.time_cuda (L2 flushed, device held)",
                       B=b, Hq=hq, Hkv=hkv, S=s, D=d, causal=causal, dtype="bf16",
                       cuda_bwd=cb.backward_kernel(d), fwdbwd_ms={}, bwd_ms={}, loop_fwdbwd_ms={},
                       tflops_fwdbwd={})  # fmt: skip
            if time.perf_counter() - t0 > budget:
                row["status"] = "skipped (budget)"
                f.write(json.dumps(row) + "\n")
                continue
            gen = torch.Generator("cuda").manual_seed(0)
            q, k, v = (
                torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
                for h in (hq, hkv, hkv)
            )
            do = torch.randn(b, hq, s, d, device="cuda", dtype=torch.bfloat16, generator=gen)
            # fwd 2 matmuls, bwd 5 (4 S_q x S_k x D each): 3.5 x the forward's 4 b h s^2 d
            flops = 3.5 * 4 * b * hq * s * s * d / (2 if causal else 1)
            ref = None
            for name, fn in impls.items():
                if (name, d) in skip:
                    row.setdefault("skipped", {})[name] = "check failed at this head dim"
                    continue
                try:

                    def fwdbwd(fn=fn):
                        o = fn(q, k, v, causal)
                        return torch.autograd.grad(o, (q, k, v), do)

                    g = fwdbwd()  # (compiles and autotunes outside the timed region)
                    torch.cuda.synchronize()
                    if ref is None:
                        ref = [t.float() for t in g]
                    row.setdefault("max_diff_vs_cudnn", {})[name] = round(
                        max((a.float() - r).abs().max().item() for a, r in zip(g, ref)), 5
                    )
                    del g
                    ms = timer.time_cuda(fwdbwd, **tkw).median_ms
                    row["fwdbwd_ms"][name] = round(ms, 4)
                    row["tflops_fwdbwd"][name] = round(flops / ms / 1e9, 1)
                    row["loop_fwdbwd_ms"][name] = round(timer.loop_ms(fwdbwd, rounds=3, budget_s=0.3), 4)
                    o = fn(q, k, v, causal)

                    def bwd(o=o):
                        return torch.autograd.grad(o, (q, k, v), do, retain_graph=True)

                    row["bwd_ms"][name] = round(timer.time_cuda(bwd, **tkw).median_ms, 4)
                    del o
                except Exception as e:  # noqa: BLE001
                    row["fwdbwd_ms"].setdefault(name, None)
                    row.setdefault("errors", {})[name] = f"{type(e).__name__}: {e}"[:300]
            if cb.BWD_LAB.get(d) and (VARIANTS[-1], d) not in skip:
                _time_lab_builds(row, q, k, v, do, causal, d, tkw)
            for key in ("fwdbwd", "bwd"):
                base = row[f"{key}_ms"].get("cudnn")
                row[f"x_cudnn_{key}"] = {
                    n: round(base / t, 3) for n, t in row[f"{key}_ms"].items() if base and t
                }
            f.write(json.dumps(row) + "\n")
            f.flush()
            print(f"B{b} H{hq}/{hkv} S{s} D{d} {'causal' if causal else 'full'}: fwd+bwd "
                  + " ".join(f"{n} {t}" for n, t in row["fwdbwd_ms"].items()), flush=True)  # fmt: skip
            del q, k, v, do
            torch.cuda.empty_cache()
    return 0


def _time_lab_builds(row, q, k, v, do, causal, d, tkw) -> None:
    """The backward alone, launched directly (no autograd), of cuda_v9 by default and of each
    lab build of this head dim (``cuda_sm90_bwd.BWD_LAB``): row["bwd_direct_ms"] by
    "v9@<opts>", and for a build that computes every gradient its max difference from the
    default's (a build like no-dq-red is a timing bound: its dq is not summed)."""
    import torch

    from kernellab.harness import timer
    from kernellab.ops.attention import cuda_sm90 as cs
    from kernellab.ops.attention import cuda_sm90_bwd as cb

    scale = 1 / math.sqrt(d)
    with torch.no_grad():
        o, lse = cs.forward(q, k, v, causal, scale, "v7")
    ref = None
    for opts in (cb.BWD_DEFAULTS[d], *cb.BWD_LAB[d]):
        name = "v9@default" if opts == cb.BWD_DEFAULTS[d] else f"v9@{opts}"
        try:
            def bwd(opts=opts):  # noqa: E306
                return cb.backward(do, q.detach(), k.detach(), v.detach(), o, lse, causal, scale, "v9", opts)

            g = bwd()
            torch.cuda.synchronize()
            if ref is None:
                ref = g
            elif opts.exact:
                row.setdefault("lab_max_diff", {})[name] = round(
                    max((a.float() - r.float()).abs().max().item() for a, r in zip(g, ref)), 5
                )
            row.setdefault("bwd_direct_ms", {})[name] = round(timer.time_cuda(bwd, **tkw).median_ms, 4)
        except Exception as e:  # noqa: BLE001
            row.setdefault("errors", {})[name] = f"{type(e).__name__}: {e}"[:300]
    print(f"  lab builds, backward alone (direct): {row.get('bwd_direct_ms')}", flush=True)


# --------------------------------------------------------------------------- driver


def _run(args: list[str], timeout: float) -> tuple[int, float]:
    t0 = time.perf_counter()
    try:
        rc = subprocess.run([sys.executable, __file__] + args, timeout=max(timeout, 5)).returncode
    except subprocess.TimeoutExpired:
        rc = 124
    return rc, time.perf_counter() - t0


def _read(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _table(rows: list[dict]) -> str:
    names = ["cudnn", "flash", "triton", *VARIANTS]
    short = [n.removeprefix("cuda_") for n in VARIANTS]
    head = ["B", "H", "S", "D", "causal", "bwd"] + [f"{n} f+b ms" for n in names]
    head += [f"{n} x cudnn f+b" for n in short] + [f"{n} bwd ms" for n in names]
    head += [f"{n} x cudnn bwd" for n in short] + [f"{n} loop f+b ms" for n in names]
    head += ["lab builds: bwd alone, direct ms"]
    lines = [" | ".join(head)]
    for r in rows:
        if r.get("stage") != "time":
            continue
        if "status" in r:
            lines.append(
                f"{r['B']} | {r['Hq']}/{r['Hkv']} | {r['S']} | {r['D']} | {r['causal']} | {r['status']}"
            )
            continue
        cells = [
            str(r["B"]),
            f"{r['Hq']}/{r['Hkv']}",
            str(r["S"]),
            str(r["D"]),
            str(r["causal"]),
            r["cuda_bwd"],
        ]
        cells += [str(r["fwdbwd_ms"].get(n)) for n in names] + [
            str(r["x_cudnn_fwdbwd"].get(n)) for n in VARIANTS
        ]
        cells += [str(r["bwd_ms"].get(n)) for n in names] + [str(r["x_cudnn_bwd"].get(n)) for n in VARIANTS]
        cells += [str(r.get("loop_fwdbwd_ms", {}).get(n)) for n in names]
        cells += [" ".join(f"{n} {t}" for n, t in r.get("bwd_direct_ms", {}).items()) or "-"]
        lines.append(" | ".join(cells))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="directory for attn_bwd_sm90.jsonl and attn_bwd_sm90.txt (required)")
    ap.add_argument("--quick", action="store_true", help="fewer check shapes, fewer timing repetitions")
    ap.add_argument("--max-seconds", type=float, default=300.0, help="the whole run's time budget")
    ap.add_argument("--worker", choices=("check", "time"), help=argparse.SUPPRESS)
    ap.add_argument("--rows", help=argparse.SUPPRESS)
    ap.add_argument("--budget", type=float, default=60.0, help=argparse.SUPPRESS)
    ap.add_argument("--skip", default="", help=argparse.SUPPRESS)
    ap.add_argument("--head-dims", default="", help="time only these head dims, e.g. 256 (default: all)")
    a = ap.parse_args(argv)
    if a.worker == "check":
        return worker_check(a.quick, Path(a.rows))
    if a.worker == "time":
        skip = {(x.split(":")[0], int(x.split(":")[1])) for x in a.skip.split(",") if x}
        dims = {int(x) for x in a.head_dims.split(",") if x}
        return worker_time(a.quick, a.budget, skip, Path(a.rows), dims)

    if not a.out:
        ap.error("the following arguments are required: --out")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows_path = out / "attn_bwd_sm90.jsonl"
    t_start = time.perf_counter()
    quick = ["--quick"] if a.quick else []
    check_s = 0.45 * a.max_seconds
    rc, took = _run(["--worker", "check", "--rows", str(rows_path)] + quick, check_s)
    checks = [r for r in _read(rows_path) if r.get("stage") == "check"]
    log = [f"check: rc {rc} in {took:.0f} s, {sum(r['ok'] for r in checks)}/{len(checks)} cases passed"]
    if rc == 124:
        log.append(f"check TIMED OUT after {check_s:.0f} s (a hang?): the last case written was "
                   f"{checks[-1] if checks else None}")  # fmt: skip
    failed = sorted({(r.get("backend", "cuda_v8"), r["D"]) for r in checks if not r["ok"]})
    if failed:
        log.append(f"check failed at (backend, head dim) {failed}: left out of the timing")
    print(log[-1], flush=True)
    left = a.max_seconds - (time.perf_counter() - t_start)
    if rc != 124 and left > 20:
        rc2, took2 = _run(["--worker", "time", "--rows", str(rows_path), "--budget", str(left - 30),
                           "--skip", ",".join(f"{b}:{d}" for b, d in failed), "--head-dims", a.head_dims]
                          + quick, left - 5)  # fmt: skip
        log.append(f"time: rc {rc2} in {took2:.0f} s" + (" (TIMED OUT)" if rc2 == 124 else ""))
    table = _table(_read(rows_path))
    text = "\n".join(log) + "\n\n" + table + "\n"
    (out / "attn_bwd_sm90.txt").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
