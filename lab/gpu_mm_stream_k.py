"""A stream-K tail for triton_tma's persistent kernel, beside the launcher's plan and cuBLAS.

    python lab/gpu_mm_stream_k.py --out DIR [--cases a,b] [--rounds 3]
    python lab/gpu_mm_stream_k.py --cpu-dry-run

The shipped plan (``triton_tma.plan_persistent``) makes whole waves of tiles and cuts each
tile of a short last wave into an integer number of K slices. Stream-K deals the last
wave's (tile, K block) iterations out evenly instead: program p takes iterations
[p I / P, (p+1) I / P) of the I = tail tiles x K blocks, so every SM gets the same work
whatever the tile count. A program stores a tile it covers whole straight to C; a tile
split between programs gets one fp32 partial from each (slot 0: the program's first
tile, slot 1: its last), and ``_sk_fixup_kernel`` adds them in program order
(deterministic) with the epilogue. The question for the GPU: do 128x256 tiles with an
even stream-K tail beat the plan at the weight gradients where the plan is weakest
(3072x768x8192: 0.80x cuBLAS; 72 tiles of 128x256 are under a wave)?

Per case: cuBLAS, the launcher (its plan), and stream-K with each tile, over whole waves
plus a stream-K tail and all stream-K; outputs checked against cuBLAS first; rounds
take turns (same-round ratios). --cpu-dry-run checks the kernels against float64 under
Triton's interpreter at tiny shapes on 4 programs (tile boundaries inside programs,
several boundaries inside one tile, programs spanning tiles).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402
import triton.language as tl  # noqa: E402

from kernellab import triton_support  # noqa: E402
from kernellab.ops.matmul.triton import epilogue, grouped_tile  # noqa: E402
from kernellab.ops.matmul.triton_tma import _ACT, _ab_descs, _install_allocator, _layout, _tile_ab  # noqa: E402


@triton_support.jit
def _sk_kernel(
    a_ptr, b_ptr, c_ptr, w_ptr, bias_ptr, M, N, K,
    dp_tiles,  # tiles 0 .. dp_tiles-1: whole, one program each in turn; the rest: stream-K
    HAS_BIAS: tl.constexpr, ACT: tl.constexpr, A_T: tl.constexpr, B_T: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    a_desc, b_desc = _ab_descs(a_ptr, b_ptr, M, N, K, A_T, B_T, BLOCK_M, BLOCK_N, BLOCK_K)
    c_desc = tl.make_tensor_descriptor(c_ptr, [M, N], [N, 1], [BLOCK_M, BLOCK_N])
    tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    k_blocks = tl.cdiv(K, BLOCK_K)
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    for tile in tl.range(pid, dp_tiles, programs, flatten=True):
        pid_m, pid_n = grouped_tile(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kb in range(k_blocks):
            a, b = _tile_ab(a_desc, b_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, kb * BLOCK_K, A_T, B_T)
            acc = tl.dot(a, b, acc)
        acc = epilogue(acc, bias_ptr, pid_n * BLOCK_N + tl.arange(0, BLOCK_N), N, HAS_BIAS, ACT)
        c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(c_ptr.dtype.element_ty))
    total = (tiles - dp_tiles) * k_blocks
    it = pid * total // programs
    end = (pid + 1) * total // programs
    slot = 0
    offs = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    while it < end:
        t = it // k_blocks
        k_lo = it - t * k_blocks
        k_hi = tl.minimum(k_blocks, end - t * k_blocks)
        pid_m, pid_n = grouped_tile(dp_tiles + t, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kb in range(k_lo, k_hi):
            a, b = _tile_ab(a_desc, b_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, kb * BLOCK_K, A_T, B_T)
            acc = tl.dot(a, b, acc)
        if (k_lo == 0) & (k_hi == k_blocks):
            acc = epilogue(acc, bias_ptr, pid_n * BLOCK_N + tl.arange(0, BLOCK_N), N, HAS_BIAS, ACT)
            c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(c_ptr.dtype.element_ty))
        else:
            tl.store(w_ptr + (pid * 2 + slot) * (BLOCK_M * BLOCK_N) + offs, acc)
        slot = 1
        it = t * k_blocks + k_hi


@triton_support.jit
def _sk_fixup_kernel(
    w_ptr, c_ptr, bias_ptr, M, N, K, dp_tiles,
    HAS_BIAS: tl.constexpr, ACT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    SUB_M: tl.constexpr,
):  # fmt: skip
    # Boundary b (between programs b-1 and b) of the stream-K range; the first boundary
    # inside a tile owns that tile: it adds the partials of every program touching the
    # tile, in program order, and stores the SUB_M-row band of grid axis 1.
    programs = tl.num_programs(0) + 1
    tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    k_blocks = tl.cdiv(K, BLOCK_K)
    total = (tiles - dp_tiles) * k_blocks
    b = tl.program_id(0) + 1
    s_b = b * total // programs
    t = s_b // k_blocks
    lo = t * k_blocks
    s_prev = (b - 1) * total // programs
    if (s_b > lo) & (s_prev <= lo):
        hi = lo + k_blocks
        r = tl.program_id(1) * SUB_M + tl.arange(0, SUB_M)
        cols = tl.arange(0, BLOCK_N)
        offs = r[:, None] * BLOCK_N + cols[None, :]
        acc = tl.zeros((SUB_M, BLOCK_N), dtype=tl.float32)
        p = b - 1
        s_p = s_prev
        while (p < programs) & (s_p < hi):
            slot = tl.where(s_p // k_blocks == t, 0, 1)
            acc += tl.load(w_ptr + (p * 2 + slot) * (BLOCK_M * BLOCK_N) + offs)
            p += 1
            s_p = p * total // programs
        pid_m, pid_n = grouped_tile(dp_tiles + t, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        rm = pid_m * BLOCK_M + r
        rn = pid_n * BLOCK_N + cols
        acc = epilogue(acc, bias_ptr, rn, N, HAS_BIAS, ACT)
        mask = (rm[:, None] < M) & (rn[None, :] < N)
        tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc.to(c_ptr.dtype.element_ty), mask=mask)


TILE_256 = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_stages": 3, "num_warps": 8}
TILE_128 = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_stages": 5, "num_warps": 4}
TILE_CPU = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2, "num_stages": 1, "num_warps": 4}


def sk_matmul(a, b, bias=None, activation=None, cfg=TILE_256, programs=None, whole_waves=True):
    """act(a @ b + bias) of one product with the stream-K kernel: ``whole_waves`` makes the
    tiles of whole waves of ``programs`` first (else every tile is in the stream-K range)."""
    lay = _layout(a, b)
    assert lay is not None and lay[4] == 1, "one product with 16-byte pitches"
    m, n, k, _, _, (a3, a_t), (b3, b_t) = lay
    on_gpu = a.is_cuda
    programs = programs or (torch.cuda.get_device_properties(a.device).multi_processor_count if on_gpu else 4)
    bm, bn, bk = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
    tiles = triton_support.cdiv(m, bm) * triton_support.cdiv(n, bn)
    dp = tiles // programs * programs if whole_waves else 0
    total = (tiles - dp) * triton_support.cdiv(k, bk)
    programs = max(1, min(programs, total)) if total else programs  # every range non-empty
    c = torch.empty((m, n), dtype=a.dtype, device=a.device)
    w = torch.empty((programs * 2, bm, bn), dtype=torch.float32, device=a.device)
    bias_arg = bias if bias is not None else c
    _install_allocator()
    flags = dict(HAS_BIAS=bias is not None, ACT=_ACT[activation])
    _sk_kernel[(programs,)](a3, b3, c, w, bias_arg, m, n, k, dp, A_T=a_t, B_T=b_t, **flags, **cfg)
    if total and programs > 1:
        sub = min(bm, 32 if on_gpu else bm)
        _sk_fixup_kernel[(programs - 1, bm // sub)](
            w, c, bias_arg, m, n, k, dp, **flags, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=cfg["GROUP_M"],
            SUB_M=sub, num_warps=4,
        )  # fmt: skip
    return c


def dry_run():
    """Interpreter checks against float64 (4 programs, 16x16x16 tiles)."""
    from kernellab.ops.matmul.epilogue import apply_epilogue

    g = torch.Generator().manual_seed(0)
    cases = [  # (m, n, k, a_t, b_t, whole_waves)
        (40, 40, 80, False, False, True),  # 9 tiles: 8 whole, 1 tile of 5 blocks over 4 programs
        (40, 40, 80, True, True, False),  # 9 tiles x 5 blocks = 45 over 4: programs span tiles
        (16, 32, 48, False, True, False),  # 2 tiles x 3 blocks = 6 over 4: 2 boundaries in a tile
        (48, 48, 16, False, False, False),  # one block per tile: every boundary at a tile edge
        (16, 16, 128, False, False, False),  # 1 tile x 8 blocks over 4: three boundaries in it
    ]
    for m, n, k, a_t, b_t, whole in cases:
        a = torch.randn((k, m) if a_t else (m, k), generator=g)
        b = torch.randn((n, k) if b_t else (k, n), generator=g)
        a, b = (a.t() if a_t else a), (b.t() if b_t else b)
        bias = torch.randn(n, generator=g)
        y = sk_matmul(a, b, bias, "gelu", cfg=TILE_CPU, programs=4, whole_waves=whole)
        ref = apply_epilogue(a.double() @ b.double(), bias.double(), "gelu")
        err = (y.double() - ref).abs().max().item()
        print(f"dry {m}x{n}x{k} a_t={a_t} b_t={b_t} whole={whole}: max |err| {err:.2e}", flush=True)
        assert err < 1e-4, err
    print("dry run: ok")


DEFAULT_CASES = [
    "gpt_8192x768x3072_dB", "gpt_8192x3072x768_dB", "gpt_8192x768x768_dB", "gpt_8192x768x768",
    "odd_3000x3000x3000", "gpt_50432x768x3072_dB", "llama_8192x28672x4096_dB",
]  # fmt: skip


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--cases", default=",".join(DEFAULT_CASES))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cpu-dry-run", action="store_true")
    args = ap.parse_args()
    if args.cpu_dry_run:
        return dry_run()
    from gpu_mm_tma_sweep import CASES, make_case

    from kernellab.harness import timer
    from kernellab.ops.matmul import triton_tma as tt

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sha = os.environ.get("KERNELLAB_GIT_SHA", "")
    gpu = torch.cuda.get_device_name(0)
    lines = []
    with open(out / "mm_stream_k.jsonl", "w") as f:
        for name in args.cases.split(","):
            spec = CASES[name]
            a, b = make_case(spec, "cuda")
            ref = torch.matmul(a, b).float()
            scale = ref.abs().max().item() or 1.0
            fns = {"torch": lambda: torch.matmul(a, b), "plan": lambda: tt.tma_matmul_fwd(a, b)}
            for tname, cfg in (("256", TILE_256), ("128", TILE_128)):
                for whole in (True, False):
                    fns[f"sk{tname}{'_dp' if whole else ''}"] = lambda cfg=cfg, whole=whole: sk_matmul(
                        a, b, cfg=cfg, whole_waves=whole
                    )
            bad = set()
            for key, fn in fns.items():
                err = (fn().float() - ref).abs().max().item() / scale
                if not err <= 2e-2:
                    bad.add(key)
                    f.write(json.dumps(dict(case=name, launch=key, error=f"mismatch {err:.3g}")) + "\n")
            per = {key: [] for key in fns if key not in bad}
            for r in range(args.rounds):
                for key in per:
                    ms = timer.time_cuda(
                        fns[key], warmup_s=0.02, min_reps=10, min_time_s=0.1, budget_s=0.4
                    ).median_ms
                    per[key].append(ms)
                    row = dict(
                        case=name, shape=spec[:3], a_t=spec[4], b_t=spec[5], launch=key, round=r, ms=ms
                    )
                    f.write(json.dumps(dict(row, gpu=gpu, git_sha=sha)) + "\n")
            ratios = {
                key: statistics.median(c / t for c, t in zip(per["torch"], v))
                for key, v in per.items()
                if key != "torch"
            }
            line = f"{name:28s} x cuBLAS: " + "  ".join(f"{key} {v:.3f}" for key, v in ratios.items())
            if bad:
                line += f"  (mismatch: {sorted(bad)})"
            print(line, flush=True)
            lines.append(line)
    (out / "mm_stream_k.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
