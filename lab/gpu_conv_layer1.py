"""The MNIST first layer (C 1, K 32, 3x3, padding 1, 28x28) timed in parts beside cuDNN, and
the backward's launch knobs swept: wgrad's programs per SM, BLOCK_K and dbias mode, the dgrad's
spread / stencil tiles.

    PYTHONPATH=src python lab/gpu_conv_layer1.py [--json F] [--dtypes fp32,bf16] [--batches 64,256,1024]

Rows (one per dtype and batch; ms, do_bench medians, L2 flushed):
  cudnn_fwd, cudnn_bwd (dx, dw, db), cudnn_dwdb; ours_fwd, ours_bwd, ours_bwd_nodx (dw, db),
  ours_dbias (torch's fp64 channel sums); pps{P}: ours_bwd_nodx with WGRAD_PROGRAMS_PER_SM = P;
  wk{B}pps{P}: also wgrad's BLOCK_K = B; db{M}: the GEMM wgrad with dbias mode M;
  sp{BLOCK}x{GATHER}: ours_bwd with the spread dgrad at those blocks; st{BLOCK}x{BLOCK_K}x{warps}:
  ours_bwd with the stencil dgrad. err_*: the max error of dw / dx against float64 as a ratio
  to cuDNN's (the check's bound is about 2).
"""

import argparse
import json

import torch
from triton.testing import do_bench

from kernellab.ops.conv2d import triton as kt

DEV = "cuda"
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
# the stencil's (BLOCK, BLOCK_K, warps) and the spread's (BLOCK, GATHER)
STENCILS = [(128, 16, 4), (256, 16, 4), (128, 32, 4)]
SPREADS = [(128, 256), (64, 256), (256, 256), (128, 128), (128, 512)]


def _inputs(n, dtype):
    g = torch.Generator(device=DEV).manual_seed(n)
    x = torch.randn(n, 1, 28, 28, device=DEV, generator=g).to(dtype)
    w = (torch.randn(32, 1, 3, 3, device=DEV, generator=g) / 3).to(dtype)
    dy = torch.randn(n, 32, 28, 28, device=DEV, generator=g).to(dtype)
    return x, w, dy


def _cudnn_bwd(dy, x, w, mask):
    return torch.ops.aten.convolution_backward(dy, x, w, [w.shape[0]], [1, 1], [1, 1], [1, 1], False, [0, 0], 1, mask)


def _err(got, ref64, base):
    e = float((got.double() - ref64).abs().max())
    return round(e / max(base, 1e-30), 3)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--batches", default="64,256,1024")
    a = ap.parse_args()
    torch.backends.cudnn.allow_tf32 = False
    rows = []
    for dn in a.dtypes.split(","):
        dtype = DTYPES[dn]
        for n in map(int, a.batches.split(",")):
            x, w, dy = _inputs(n, dtype)
            b = torch.zeros(32, device=DEV, dtype=dtype)
            row = dict(part="layer1", dtype=dn, shape=f"{n}x1x28x28x32x3x3", gpu=torch.cuda.get_device_name())
            ms = lambda f: round(do_bench(f), 5)  # noqa: E731
            row["cudnn_fwd"] = ms(lambda: torch.nn.functional.conv2d(x, w, b, padding=1))
            row["cudnn_bwd"] = ms(lambda: _cudnn_bwd(dy, x, w, [True, True, True]))
            row["cudnn_dwdb"] = ms(lambda: _cudnn_bwd(dy, x, w, [False, True, True]))
            row["ours_fwd"] = ms(lambda: kt.triton_conv2d_fwd(x, w, b, 1, 1, 1, 1))
            row["ours_bwd"] = ms(lambda: kt.triton_conv2d_bwd(dy, x, w, True, 1, 1, 1, 1))
            row["ours_bwd_nodx"] = ms(lambda: kt.triton_conv2d_bwd(dy, x, w, False, 1, 1, 1, 1))
            row["ours_dbias"] = ms(lambda: kt._channel_sums(dy))
            # errors against float64, as ratios to cuDNN's
            dx64, dw64, _ = _cudnn_bwd(dy.double(), x.double(), w.double(), [True, True, True])
            cdx, cdw, _ = _cudnn_bwd(dy, x, w, [True, True, True])
            base_dx = float((cdx.double() - dx64).abs().max())
            base_dw = float((cdw.double() - dw64).abs().max())

            def errs(tag):
                dx, dw, _ = kt.triton_conv2d_bwd(dy, x, w, True, 1, 1, 1, 1)
                row[f"err_dx_{tag}"] = _err(dx, dx64, base_dx)
                row[f"err_dw_{tag}"] = _err(dw, dw64, base_dw)

            errs("default")
            pps0 = kt.WGRAD_PROGRAMS_PER_SM
            for pps in (1, 4, 8, 16):
                kt.WGRAD_PROGRAMS_PER_SM = pps
                try:
                    row[f"pps{pps}"] = ms(lambda: kt.triton_conv2d_bwd(dy, x, w, False, 1, 1, 1, 1))
                    errs(f"pps{pps}")
                finally:
                    kt.WGRAD_PROGRAMS_PER_SM = pps0
            cfg0 = kt.wgrad_config
            for bk in (64, 128):
                for pps in (2, 8):
                    kt.wgrad_config = lambda *args, bk=bk: dict(cfg0(*args), BLOCK_K=bk)
                    kt.WGRAD_PROGRAMS_PER_SM = pps
                    try:
                        row[f"wk{bk}pps{pps}"] = ms(lambda: kt.triton_conv2d_bwd(dy, x, w, False, 1, 1, 1, 1))
                        errs(f"wk{bk}pps{pps}")
                    except Exception as e:  # noqa: BLE001
                        row[f"error_wk{bk}pps{pps}"] = str(e)[:200]
                    finally:
                        kt.wgrad_config, kt.WGRAD_PROGRAMS_PER_SM = cfg0, pps0
            db0 = dict(kt.WGRAD_DB_GEMM)
            for mode in (0, 1, 2):
                kt.WGRAD_DB_GEMM[dtype] = mode
                try:
                    row[f"db{mode}"] = ms(lambda: kt.triton_conv2d_bwd(dy, x, w, False, 1, 1, 1, 1))
                finally:
                    kt.WGRAD_DB_GEMM.clear()
                    kt.WGRAD_DB_GEMM.update(db0)
            plan0 = kt.dgrad_plan
            variants = [(f"st{b}x{k}x{nw}", ("stencil", dict(BLOCK=b, BLOCK_K=k, num_warps=nw))) for b, k, nw in STENCILS]
            spread = plan0(1, 3, 3, 32, dtype, x.device)[1]
            variants += [(f"sp{b}x{g}", ("spread", dict(spread, BLOCK=b, GATHER=g))) for b, g in SPREADS]
            for tag, plan in variants:
                kt.dgrad_plan = lambda *_, plan=plan: plan
                try:
                    row[tag] = ms(lambda: kt.triton_conv2d_bwd(dy, x, w, True, 1, 1, 1, 1))
                    errs(tag)
                except Exception as e:  # noqa: BLE001
                    row["error_" + tag] = str(e)[:200]
                finally:
                    kt.dgrad_plan = plan0
            print(json.dumps(row), flush=True)
            rows.append(row)
    if a.json:
        with open(a.json, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
