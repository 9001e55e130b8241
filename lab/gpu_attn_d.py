"""Head dims 64 / 80 / 96 / 128, short sequences and GQA on a lent GPU: kernellab's Triton
attention against SDPA's cuDNN and FlashAttention-2 kernels, forward and forward+backward.

    python lab/gpu_attn_d.py --out FILE.jsonl [--tune] [--budget-s 110] [--cases d80,short,...]

Cases (bf16, in this order; the budget skips what is left and says so):
- ``d80``: B=1 H=32 S=2048 D=80; Triton twice, with the head dim in two tiles (64 + 16,
  ``kernellab.config.attn_split_d``, the default) and in one padded 128-wide tile
  (``d80-pad``: the former kernels), so one run shows both;
- ``dims``: the same shape at D = 128, 64, 96 (96 also in one padded tile);
- ``short``: B=8 H=16 D=64 at S = 1024 and 256;
- ``gqa``: q 32 heads, k/v 8 heads, S=4096, D=128, causal only.
Every case causal, then every case not causal.

Per case and mode (fwd, fwdbwd): the median of ``triton.testing.do_bench`` for
``kernellab.attention(q, k, v, causal=..., backend="triton")`` and for
``F.scaled_dot_product_attention`` under ``sdpa_kernel([CUDNN_ATTENTION])`` and
``sdpa_kernel([FLASH_ATTENTION])`` (GQA: ``enable_gqa=True``, or k/v expanded before
timing where a backend refuses it); ``x_cudnn`` / ``x_flash`` = their time over ours (> 1:
ours faster, the lead's "0.18x cuDNN" convention); the largest |error| of o, dq, dk, dv of
each against an fp32 SDPA (math) reference; the configs the Triton kernels ran with
(``BLOCK_M x BLOCK_N w warps s stages``, "ws" where the warp-specialized Hopper kernels ran)
and the head-dim tiles. Without ``--tune`` the kernels take the first config that fits
(``kernellab.config.attn_autotune`` False: one compile per kernel, which keeps a run with a
cold Triton cache near two minutes); ``--tune`` autotunes every key (a compile and a timing
per candidate config: narrow ``--cases`` then). Rows go to ``--out`` as JSONL, the table to
stdout. ``--smoke`` runs the script's logic on the CPU (Triton's interpreter, tiny shapes,
host-clock timings, no SDPA peers) to check it before spending device time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

import kernellab  # noqa: E402
from kernellab.ops.attention import triton as at  # noqa: E402
from kernellab.options import config  # noqa: E402

# (group, name, B, H_q, H_kv, S, D, causal, split): every causal case first, then the
# non-causal ones (what the budget skips first)
CASES = []
for causal in (True, False):
    CASES += [
        ("d80", "d80", 1, 32, 32, 2048, 80, causal, True),
        ("d80", "d80-pad", 1, 32, 32, 2048, 80, causal, False),
        ("dims", "d128", 1, 32, 32, 2048, 128, causal, True),
        ("dims", "d64", 1, 32, 32, 2048, 64, causal, True),
        ("dims", "d96", 1, 32, 32, 2048, 96, causal, True),
        ("dims", "d96-pad", 1, 32, 32, 2048, 96, causal, False),
        ("short", "s1024", 8, 16, 16, 1024, 64, causal, True),
        ("short", "s256", 8, 16, 16, 256, 64, causal, True),
    ]
    if causal:
        CASES.append(("gqa", "gqa32/8", 1, 32, 8, 4096, 128, True, True))

PEERS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}


def _cfg_str(cfg) -> str:
    if cfg is None:
        return "-"
    kw = cfg.kwargs
    return f"{kw.get('BLOCK_M')}x{kw.get('BLOCK_N')} w{cfg.num_warps} s{cfg.num_stages}"


def _configs_ran(call, tuners) -> dict:
    """Run ``call`` once and return the config each autotuned Triton kernel took for it
    ("ws": not launched, the warp-specialized kernel ran instead)."""
    for t in tuners.values():
        t.best_config = None
    call()
    return {n: _cfg_str(t.best_config) if t.best_config is not None else "ws" for n, t in tuners.items()}


def _bench(fn, grads=None, smoke=False) -> float:
    if smoke:  # (CPU: the host clock, a median of three)
        ts = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e3)
            for g in grads or ():
                g.grad = None
        return sorted(ts)[1]
    return triton.testing.do_bench(fn, warmup=10, rep=40, grad_to_none=grads, return_mode="median")


def _sdpa(q, k, v, causal, backend):
    gqa = q.shape[1] != k.shape[1]
    with sdpa_kernel([backend]):
        if gqa:
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def _expand(t, group):
    return t.repeat_interleave(group, dim=1) if group > 1 else t


def _outputs(fn, q, k, v, do):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    o = fn(*leaves)
    o.backward(do)
    return [o.detach().float()] + [t.grad.float() for t in leaves]


def _errs(got, ref) -> dict:
    return {n: round((g - r).abs().max().item(), 5) for n, g, r in zip(("o", "dq", "dk", "dv"), got, ref)}


def run_case(case, tune: bool, smoke: bool = False) -> list[dict]:
    group_name, name, b, hq, hkv, s, d, causal, split = case
    dev = "cpu" if smoke else "cuda"
    if smoke:  # tiny: the interpreter runs one program after another
        b, hq, hkv, s = 1, 2 * (hq // hkv), 2, 40
    gen = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(b, hq, s, d, device=dev, dtype=torch.bfloat16, generator=gen)
    k = torch.randn(b, hkv, s, d, device=dev, dtype=torch.bfloat16, generator=gen)
    v = torch.randn(b, hkv, s, d, device=dev, dtype=torch.bfloat16, generator=gen)
    do = torch.randn(b, hq, s, d, device=dev, dtype=torch.bfloat16, generator=gen)
    group = hq // hkv
    base = dict(case=name, group=group_name, B=b, Hq=hq, Hkv=hkv, S=s, D=d, causal=causal, dtype="bf16",
                split=split, tiles=list(at._d_tiles(d, torch.bfloat16, split)), tune=tune,
                gpu=torch.cuda.get_device_name() if not smoke else "cpu", torch=torch.__version__,
                triton=triton.__version__)  # fmt: skip
    rows = []

    # fp32 reference (SDPA math, k/v expanded for GQA)
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, _expand(k, group), _expand(v, group)))
    with sdpa_kernel([SDPBackend.MATH]):
        of = F.scaled_dot_product_attention(qf, kf, vf, is_causal=causal)
    of.backward(do.float())
    dkf, dvf = kf.grad, vf.grad
    if group > 1:  # the gradient of a repeat_interleave: sum over the group
        dkf = dkf.view(b, hkv, group, s, d).sum(2)
        dvf = dvf.view(b, hkv, group, s, d).sum(2)
    ref = [of.detach(), qf.grad, dkf, dvf]
    del qf, kf, vf, of

    impls = {"triton": lambda q_, k_, v_: kernellab.attention(q_, k_, v_, causal=causal, backend="triton")}
    notes = {}
    for pname, backend in PEERS.items():

        def peer(q_, k_, v_, backend=backend):
            return _sdpa(q_, k_, v_, causal, backend)

        if smoke:
            notes[pname] = "not on the CPU"
            continue
        try:
            _outputs(peer, q[:, :, :128], k[:, :, :128], v[:, :, :128], do[:, :, :128])
            impls[pname] = peer
        except RuntimeError as e:
            if group > 1:  # no GQA in this backend: k/v expanded inside the timed call

                def peer_x(q_, k_, v_, backend=backend):
                    return _sdpa(q_, _expand(k_, group), _expand(v_, group), causal, backend)

                try:
                    _outputs(peer_x, q[:, :, :128], k[:, :, :128], v[:, :, :128], do[:, :, :128])
                    impls[pname] = peer_x
                    notes[pname] = "k/v expanded inside the call (no enable_gqa)"
                except RuntimeError as e2:
                    notes[pname] = f"unsupported: {str(e2).splitlines()[0][:120]}"
            else:
                notes[pname] = f"unsupported: {str(e).splitlines()[0][:120]}"

    tuners = {"fwd": at._attn_fwd, "dkdv": at._attn_bwd_dkdv, "dq": at._attn_bwd_dq}
    if smoke:
        tuners = {"fwd": at._attn_fwd_interp, "dkdv": at._attn_bwd_dkdv_interp, "dq": at._attn_bwd_dq_interp}
    with config.override(attn_split_d=bool(split), attn_autotune=tune):
        for iname, fn in impls.items():
            row = dict(base, impl=iname, note=notes.get(iname, ""))
            first = {}
            t0 = time.perf_counter()

            def call(fn=fn, first=first):
                first["got"] = _outputs(fn, q, k, v, do)

            if iname == "triton":
                row["configs"] = _configs_ran(call, tuners)
                row["peers"] = notes
            else:
                call()
            row["first_s"] = round(time.perf_counter() - t0, 2)  # (compiles, tuning)
            row["err"] = _errs(first["got"], ref)
            qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))

            def fwd(fn=fn):
                with torch.no_grad():
                    fn(q, k, v)

            def fwdbwd(fn=fn, qg=qg, kg=kg, vg=vg):
                fn(qg, kg, vg).backward(do)

            row["fwd_ms"] = round(_bench(fwd, smoke=smoke), 4)
            row["fwdbwd_ms"] = round(_bench(fwdbwd, [qg, kg, vg], smoke), 4)
            rows.append(row)
    by = {r["impl"]: r for r in rows}
    for r in rows:
        for mode in ("fwd", "fwdbwd"):
            for p in PEERS:
                if p in by:
                    r[f"x_{p}_{mode}"] = round(by[p][f"{mode}_ms"] / r[f"{mode}_ms"], 3)
    return rows


def _table(rows) -> str:
    head = ("case", "causal", "tiles", "impl", "fwd ms", "x cuDNN", "x flash", "fwd+bwd ms", "x cuDNN",
            "x flash", "max err o/dq/dk/dv", "configs fwd | dkdv | dq")  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cfg = r.get("configs")
        heads = f"{r['Hq']}" + (f"/{r['Hkv']}" if r["Hkv"] != r["Hq"] else "")
        lines.append("| " + " | ".join(str(x) for x in (
            f"{r['case']} {r['B']}x{heads}x{r['S']}x{r['D']}",
            "c" if r["causal"] else "-", "+".join(map(str, r["tiles"])) if r["tiles"][1] else r["tiles"][0],
            r["impl"] + (" *" if r.get("note") else ""),
            r["fwd_ms"], r.get("x_cudnn_fwd", "-"), r.get("x_flash_fwd", "-"),
            r["fwdbwd_ms"], r.get("x_cudnn_fwdbwd", "-"), r.get("x_flash_fwdbwd", "-"),
            "/".join(f"{e:.3g}" for e in r["err"].values()),
            " | ".join(cfg.values()) if cfg else "",
        )) + " |")  # fmt: skip
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSONL rows")
    ap.add_argument("--tune", action="store_true", help="autotune the Triton kernels (slow: narrow --cases)")
    ap.add_argument("--budget-s", type=float, default=110.0, help="skip the cases left after this long")
    ap.add_argument("--cases", default="", help="comma-separated groups or case names (default: all)")
    ap.add_argument("--smoke", action="store_true", help="the CPU check of this script (tiny shapes)")
    a = ap.parse_args(argv)
    if not (a.smoke or torch.cuda.is_available()):
        print("needs a CUDA GPU (or --smoke)")
        return 2
    want = {w for w in a.cases.split(",") if w}
    cases = [c for c in CASES if not want or c[0] in want or c[1] in want]
    t_start = time.perf_counter()
    rows, skipped = [], []
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as f:
        for c in cases:
            if time.perf_counter() - t_start > a.budget_s:
                skipped.append(f"{c[1]} {'causal' if c[7] else 'full'}")
                continue
            t0 = time.perf_counter()
            try:
                got = run_case(c, a.tune, a.smoke)
            except Exception as e:  # noqa: BLE001 - one failing case must not hide the rest
                got = [dict(case=c[1], causal=c[7], status="error", reason=f"{type(e).__name__}: {e}"[:300])]
                print(f"{c[1]} causal={c[7]}: {got[0]['reason']}", flush=True)
            for r in got:
                f.write(json.dumps(r) + "\n")
            f.flush()
            ok = [r for r in got if "fwd_ms" in r]
            rows += ok
            print(f"{c[1]} causal={c[7]}: {time.perf_counter() - t0:.1f} s", flush=True)
            if not a.smoke:
                torch.cuda.empty_cache()
    print()
    gpu = torch.cuda.get_device_name() if not a.smoke else "cpu"
    tiles = "autotuned" if a.tune else "first that fits"
    print(f"{gpu}, torch {torch.__version__}, triton {triton.__version__}, Triton configs {tiles}")
    print(_table(rows))
    for r in rows:
        if r.get("note"):
            print(f"* {r['case']} {r['impl']}: {r['note']}")
        for p, why in (r.get("peers") or {}).items():
            if why.startswith("unsupported"):
                print(f"{r['case']} causal={r['causal']} {p}: {why}")
    if skipped:
        print(f"skipped (budget {a.budget_s:.0f} s): {', '.join(skipped)}")
    print(f"total {time.perf_counter() - t_start:.1f} s; rows -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
