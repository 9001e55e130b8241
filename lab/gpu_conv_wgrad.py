"""conv2d's Triton weight gradient at the table's shapes, timed apart from dgrad. Needs a GPU.

    PYTHONPATH=src python lab/gpu_conv_wgrad.py [--json F] [--dtypes fp32,bf16]
        [--fp32-modes dot64,fp32,x3] [--fp32-shapes 0,1,2,3]

fp32 (TF32 off): the wgrad kernel with fp64 dots (WGRAD_DOT64, the library's: mode
"dot64"), with an fp32 dot a BLOCK_K step summed in fp64 ("fp32") and with a 3xTF32 dot
("x3", ``dot_x3``) a step summed in fp64, each at the plan's tiles and a few others
(wgrad_plan patched; --fp32-modes, --fp32-shapes pick); error of dw against float64 as
a ratio to cuDNN's, the worst of three seeds. bf16: the plan's wgrad, dgrad + wgrad and
cuDNN's backward; the wgrad with x channels_last (its B tile channel-contiguous) and at a
few other tiles.
do_bench medians (ms), L2 flushed by do_bench.
"""

import argparse
import json

import torch
import torch.nn.functional as F
from triton.testing import do_bench

DEV = "cuda"
SHAPES = [(32, 64, 56, 56, 64), (64, 32, 14, 14, 64), (256, 32, 14, 14, 64), (1024, 32, 14, 14, 64)]
BF16_TILES = [(64, 64, 32, 4), (128, 64, 32, 8), (64, 64, 64, 8), (128, 32, 64, 4)]
TILES = [(32, 32, 32, 4), (64, 64, 16, 4), (64, 64, 32, 8), (32, 64, 32, 4), (64, 32, 32, 4), (32, 32, 16, 2),
         (64, 32, 16, 4), (64, 64, 32, 4)]  # fmt: skip


def _inputs(n, c, h, w_, k, dtype, seed):
    g = torch.Generator(device=DEV).manual_seed(seed)
    x = torch.randn(n, c, h, w_, device=DEV, generator=g).to(dtype)
    w = (torch.randn(k, c, 3, 3, device=DEV, generator=g) / (3 * c**0.5)).to(dtype)
    dy = torch.randn(n, k, h, w_, device=DEV, generator=g).to(dtype)
    return x, w, dy


def _refs(shape, dtype, seeds=(1, 2, 3)):
    """[(x, w, dy, dw in float64, cuDNN's dw error)] for each seed."""
    out = []
    for seed in seeds:
        x, w, dy = _inputs(*shape, dtype, seed)
        xr, wr = x.double(), w.double().requires_grad_()
        (ref,) = torch.autograd.grad(F.conv2d(xr, wr, padding=1), wr, dy.double())
        wt = w.clone().requires_grad_()
        (dw_t,) = torch.autograd.grad(F.conv2d(x, wt, padding=1), wt, dy)
        out.append((x, w, dy, ref, float((dw_t.double() - ref).abs().max())))
    return out


def _dw_error(kt, x, w, dy, ref, e_t):
    dw = kt.triton_conv2d_bwd(dy, x, w, False, 1, 1, 1, 1)[1]
    return float((dw.double() - ref).abs().max()) / max(e_t, 1e-30)


def fp32(out, modes, shapes):
    from kernellab.ops.conv2d import triton as kt

    plan0, dot0, consts0 = kt.wgrad_plan, kt.WGRAD_DOT64, kt._consts
    for shape in shapes:
        x, w, dy = _inputs(*shape, torch.float32, 1)
        base = dict(part="fp32", shape="x".join(map(str, shape)) + "x3x3")
        xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
        base["cudnn_bwd_ms"] = round(
            do_bench(lambda: torch.autograd.grad(F.conv2d(xg, wg, padding=1), (xg, wg), dy)), 5
        )
        base["dgrad_ms"] = round(
            do_bench(lambda: kt.triton_conv2d_bwd(dy, x, w, True, 1, 1, 1, 1))
            - do_bench(lambda: kt.triton_conv2d_bwd(dy, x, w, False, 1, 1, 1, 1)),
            5,
        )
        refs = _refs(shape, torch.float32)
        plan_cfg = kt.wgrad_plan(shape[1], 3, 3, shape[4], torch.float32, x.device)[1]
        tiles = [None] + TILES
        for mode in modes:
            for t in tiles:
                row = dict(base, mode=mode, tiles=t or "plan", plan=plan_cfg)
                try:
                    kt.WGRAD_DOT64 = mode == "dot64"
                    if mode == "x3":  # (need_dx False below: only wgrad reads the precision)
                        kt._consts = lambda t: dict(consts0(t), PRECISION="x3")
                    if t is not None:
                        cfg = dict(BLOCK_M=t[0], BLOCK_N=t[1], BLOCK_K=t[2], num_warps=t[3])
                        kt.wgrad_plan = lambda *a, cfg=cfg: ("taps", cfg)
                    row["wgrad_ms"] = round(
                        do_bench(lambda: kt.triton_conv2d_bwd(dy, x, w, False, 1, 1, 1, 1)), 5
                    )
                    errs = [_dw_error(kt, *r) for r in refs]
                    row["err_ratio_worst"] = round(max(errs), 3)
                except Exception as e:  # noqa: BLE001
                    row["error"] = str(e)[:160]
                finally:
                    kt.wgrad_plan, kt.WGRAD_DOT64, kt._consts = plan0, dot0, consts0
                out(row)


def bf16(out):
    from kernellab.ops.conv2d import triton as kt

    for shape in SHAPES:
        x, w, dy = _inputs(*shape, torch.bfloat16, 1)
        row = dict(part="bf16", shape="x".join(map(str, shape)) + "x3x3")
        xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
        row["cudnn_bwd_ms"] = do_bench(lambda: torch.autograd.grad(F.conv2d(xg, wg, padding=1), (xg, wg), dy))
        row["cudnn_fwd_ms"] = do_bench(lambda: F.conv2d(x, w, padding=1))
        row["triton_fwd_ms"] = do_bench(lambda: kt.triton_conv2d_fwd(x, w, None, 1, 1, 1, 1))
        row["dgrad_and_wgrad_ms"] = do_bench(lambda: kt.triton_conv2d_bwd(dy, x, w, True, 1, 1, 1, 1))
        row["wgrad_ms"] = do_bench(lambda: kt.triton_conv2d_bwd(dy, x, w, False, 1, 1, 1, 1))
        xc = x.contiguous(memory_format=torch.channels_last)
        row["wgrad_x_channels_last_ms"] = do_bench(lambda: kt.triton_conv2d_bwd(dy, xc, w, False, 1, 1, 1, 1))
        row["copy_channels_last_ms"] = do_bench(lambda: x.contiguous(memory_format=torch.channels_last))
        plan0 = kt.wgrad_plan
        for t in BF16_TILES:
            cfg = dict(BLOCK_M=t[0], BLOCK_N=t[1], BLOCK_K=t[2], num_warps=t[3])
            kt.wgrad_plan = lambda *a, cfg=cfg: ("taps", cfg)
            try:
                name = "x".join(map(str, t))
                row["wgrad_" + name] = do_bench(lambda: kt.triton_conv2d_bwd(dy, x, w, False, 1, 1, 1, 1))
                row["wgrad_cl_" + name] = do_bench(lambda: kt.triton_conv2d_bwd(dy, xc, w, False, 1, 1, 1, 1))
            except Exception as e:  # noqa: BLE001
                row["error_" + "x".join(map(str, t))] = str(e)[:120]
            finally:
                kt.wgrad_plan = plan0
        row["plans"] = [kt.fwd_plan(shape[1], 3, 3, shape[4], torch.bfloat16, x.device),
                        kt.dgrad_plan(shape[1], 3, 3, shape[4], torch.bfloat16, x.device),
                        kt.wgrad_plan(shape[1], 3, 3, shape[4], torch.bfloat16, x.device)]  # fmt: skip
        out({k: round(v, 5) if isinstance(v, float) else v for k, v in row.items()})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--fp32-modes", default="dot64,fp32")
    ap.add_argument("--fp32-shapes", default=",".join(str(i) for i in range(len(SHAPES))))
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    def out(row):
        print(json.dumps(row, default=str), flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(row, default=str) + "\n")

    if "fp32" in args.dtypes:
        modes = args.fp32_modes.split(",")
        if not set(modes) <= {"dot64", "fp32", "x3"}:
            ap.error(f"--fp32-modes: dot64, fp32, x3; got {modes}")
        fp32(out, modes, [SHAPES[int(i)] for i in args.fp32_shapes.split(",")])
    if "bf16" in args.dtypes:
        bf16(out)


if __name__ == "__main__":
    main()
