"""Probe (issue 19): the warp-specialized attention backward passes (ops.attention.triton's
``_attn_bwd_dkdv_ws`` and ``_attn_bwd_dq_ws``: each pass's streamed loop as ``tl.range(...,
warp_specialize=True)`` over device-side tensor descriptors) at several tiles, against the
plain two passes and SDPA's cuDNN backward. 16-bit, contiguous (B, H, S, D), S a multiple
of the tiles; causal as one loop per pass masked on every block (the only causal loop form
Triton 3.6 specializes).

    python lab/probe_attn_bwd_ws.py [--out FILE.jsonl] [--shapes nc4k,llama8k,...]
    python lab/probe_attn_bwd_ws.py --compile-only    # sm_90 offline (no GPU): WS applied?

The kernels began here (1bc4252, 639b9a6: the rows in benchmarks/results/probe_attn_bwd_ws-*)
and moved into the library; the probe now launches the library's. Each config is checked
against the plain backward (dq, dk, dv: max abs error over max abs value < 2e-2) before it
is timed with CUDA events.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402
import triton  # noqa: E402

from kernellab.ops.attention import triton as AT  # noqa: E402

CONFIGS = [  # (BLOCK_M, BLOCK_N, warps, stages) of the dK/dV pass; the dQ pass: (BLOCK_N, BLOCK_M, ...)
    (64, 128, 4, 2), (64, 128, 4, 3), (64, 128, 8, 2), (128, 128, 4, 2),
]  # fmt: skip
# (At 1bc4252 on the H100, 64x64 and 128x64 tiles at 4 warps ran 1.9-3.9x the 64x128 time.)
SHAPES = {"nc4k": (4, 16, 4096, 128, False), "full16k": (1, 16, 16384, 128, False), "nc2k64": (8, 16, 2048, 64, False),
          "llama8k": (1, 32, 8192, 128, True), "b2s8k": (2, 32, 8192, 128, True), "llama2k": (1, 32, 2048, 128, True)}  # fmt: skip


def ws_backward(q, k, v, o, do, lse, cfg, causal=False):
    """dq, dk, dv by the library's warp-specialized passes at the tile ``cfg``."""
    from kernellab import triton_support

    b, h, s, d = q.shape
    bm, bn, warps, stages = cfg
    scale = d**-0.5
    rows = b * h * s
    delta = (o.float() * do.float()).sum(-1).reshape(rows).contiguous()
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    triton_support.install_tma_allocator()
    views = AT._ws_bwd_args(q, k, v, do, d)
    qk = scale * AT.LOG2E
    opts = dict(HEAD_D=d, CAUSAL=causal, num_warps=warps, num_stages=stages)
    AT._attn_bwd_dkdv_ws[(b * h * (s // bn),)](q, k, v, do, lse, delta, dk, dv, qk, scale, *views,
                                               *dk.stride()[:3], *dv.stride()[:3], h, s, rows,
                                               BLOCK_M=bm, BLOCK_N=bn, **opts)  # fmt: skip
    AT._attn_bwd_dq_ws[(b * h * (s // bn),)](q, k, v, do, lse, delta, dq, qk, scale, *views, *dq.stride()[:3],
                                             h, s, rows, BLOCK_M=bn, BLOCK_N=bm, **opts)  # fmt: skip
    return dq, dk, dv


def compile_only() -> int:
    """Compile both passes for sm_90 at each config (D=128), causal or not, and say whether
    the loop was warp-specialized (a ttg.warp_specialize op in the TTGIR)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    rc = 0
    for causal in (False, True):
        for fn, outs in ((AT._attn_bwd_dkdv_ws, ("DK", "DV")), (AT._attn_bwd_dq_ws, ("DQ",))):
            for bm, bn, warps, stages in CONFIGS:
                tiles = dict(BLOCK_M=bm, BLOCK_N=bn) if "DK" in outs else dict(BLOCK_M=bn, BLOCK_N=bm)
                sig = {n: "*bf16" for n in ("Q", "K", "V", "DO", *outs)}
                sig.update(LSE="*fp32", DELTA="*fp32", qk_scale="fp32", sm_scale="fp32")
                sig.update({c: "constexpr" for c in ("HEAD_D", "BLOCK_M", "BLOCK_N", "CAUSAL")})
                sig = {n: sig.get(n, "i32") for n in fn.arg_names}
                attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names) if sig[n].startswith("*")}
                what = f"{fn.__name__} causal={causal} {bm}x{bn} w{warps} s{stages}"
                try:
                    src = ASTSource(fn=fn, signature=sig, constexprs=dict(HEAD_D=128, CAUSAL=causal, **tiles), attrs=attrs)
                    kern = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                                          options=dict(num_warps=warps, num_stages=stages))  # fmt: skip
                    print(f"{what}: compiled, ws={'ttg.warp_specialize' in kern.asm['ttgir']}, "
                          f"shared={kern.metadata.shared}", flush=True)  # fmt: skip
                except Exception as e:  # noqa: BLE001 - one config's failure is a line
                    rc = 1
                    print(f"{what}: {type(e).__name__}: {str(e)[-200:]}", flush=True)
    return rc


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=None)
    p.add_argument("--shapes", default="nc4k,full16k,llama8k")
    p.add_argument("--compile-only", action="store_true")
    a = p.parse_args(argv)
    if a.compile_only:
        return compile_only()
    from probe_attn_bwd_tma import kernellab_backward, make, sdpa_bwd_ms, sweep, time_ms

    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "git_sha": os.environ.get("KERNELLAB_GIT_SHA")}  # fmt: skip
    out = open(a.out, "a") if a.out else None
    for name in a.shapes.split(","):
        shape = SHAPES[name]
        q, k, v, o, do, lse, causal = make(shape, "cuda")
        ref = kernellab_backward(q, k, v, o, do, lse, causal)
        row = {**meta, "probe": "attn_bwd_ws", "shape": name, "bhsd_causal": shape}
        row["configs"], row["ws_best"] = sweep(CONFIGS, lambda cfg: ws_backward(q, k, v, o, do, lse, cfg, causal), ref)
        row["kernellab_ms"] = round(time_ms(lambda: kernellab_backward(q, k, v, o, do, lse, causal)), 4)
        row["cudnn_ms"] = sdpa_bwd_ms(q, k, v, causal, "cudnn")
        print(name, row["configs"], "best", row["ws_best"], "kernellab", row["kernellab_ms"], "cudnn", row["cudnn_ms"],
              flush=True)  # fmt: skip
        if out:
            out.write(json.dumps(row) + "\n")
            out.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
