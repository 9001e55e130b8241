"""The course's MNIST CNN on a GPU: ms per training step of every variant at batch 64, 256
and 1024, and test accuracy after 2 epochs, PyTorch against kernellab, in one run.

    PYTHONPATH=src python lab/mnist_compare.py --out DIR [--data MNIST_DIR]
        [--batch-sizes 64 256 1024] [--backends triton cuda default] [--steps 100] [--profile]
        [--pool-fusion auto|on|off|both] [--unfused]

Variants (kernellab.models.mnist.COMPARE): pytorch_eager (nn.Conv2d / BatchNorm2d
(track_running_stats=False) / F.relu / F.max_pool2d / nn.Linear / F.cross_entropy, foreach
SGD), pytorch_compile (torch.compile of forward + loss), pytorch_graph (the whole eager step
captured in one CUDA graph), and for each kernellab op set (--backends: one backend for every
op, or ``default``: kernellab's default per op) kernellab_eager and kernellab_graph (packed
parameters, one-launch SGD). Same weights (seed 0), same batches.

Blocks (kernellab's op sets): conv2d -> bn_relu_pool2d (the fused op; ``+brp`` in the table),
conv2d -> batch_norm2d(relu) -> max_pool2d, or with --unfused conv2d -> batch_norm2d -> relu
-> max_pool2d (``:unfused``); --pool-fusion both times the first two side by side. Every row
records fused_bn_relu and fused_pool.

Timing: the course's protocol. A step = batch load (a device-side gather) + forward +
backward + SGD update + zero-grad; 10 warm-up steps, then 100 steps between two
synchronizations: ms/step = wall / 100. Accuracy: 2 epochs at batch 64, lr 0.05, eager.

Rows go to DIR/mnist_compare.jsonl (and DIR/mnist_profile.txt with --profile); a table is
printed last. Data: MNIST's IDX files from --data, else the shipped digits (1,497 train
images: the timing is the same per step; accuracy is not MNIST's).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from kernellab.data import mnist as mnist_data
from kernellab.harness.bench import git_sha, versions
from kernellab.models import mnist


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="directory for the JSONL rows")
    ap.add_argument("--data", default=None, help="MNIST's IDX files (default: the shipped digits)")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--backends", nargs="+", default=["triton", "cuda", "default"])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--profile", action="store_true", help="torch.profiler table per variant and batch size")
    ap.add_argument("--skip-accuracy", action="store_true")
    ap.add_argument("--device", default="cuda", help="cuda (the run this script is for) or cpu (a dry run: "
                    "graph variants skipped)")
    ap.add_argument("--unfused", action="store_true",
                    help="also time kernellab's variants with batch_norm2d, relu and max_pool2d as separate kernels")
    ap.add_argument("--pool-fusion", choices=["auto", "on", "off", "both"], default="auto",
                    help="kernellab's blocks as conv2d -> bn_relu_pool2d (on), as conv2d -> batch_norm2d(relu) -> "
                    "max_pool2d (off), each kernellab variant timed both ways (both), or the model's default "
                    "(auto: fused where bn_relu_pool2d has the op set's backend)")
    ap.add_argument("--tf32", choices=["default", "on", "off"], default="default",
                    help="cuDNN and cuBLAS TF32 for fp32 (default: PyTorch's defaults, cuDNN on, matmul off; "
                    "the flags land in every row)")
    args = ap.parse_args()
    if args.tf32 != "default":
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = args.tf32 == "on"
    dev = args.device
    if dev == "cuda" and not torch.cuda.is_available():
        raise SystemExit("mnist_compare.py: no GPU here (--device cpu for a dry run)")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "mnist_compare.jsonl")
    t_start = time.perf_counter()
    data = mnist_data.load(args.data, dev)
    meta = {"gpu": torch.cuda.get_device_name() if dev == "cuda" else "cpu", "git_sha": git_sha(), **versions(), "data": data.source,
            "lr": args.lr, "tf32_cudnn": torch.backends.cudnn.allow_tf32,
            "tf32_matmul": torch.backends.cuda.matmul.allow_tf32}  # fmt: skip
    print(f"data: {data.source}; {meta['gpu']}; cudnn tf32 {meta['tf32_cudnn']}, matmul tf32 {meta['tf32_matmul']}")
    rows = []
    out = open(path, "a")
    prof = open(os.path.join(args.out, "mnist_profile.txt"), "a") if args.profile else None

    def on_row(row):
        rows.append(row)
        if prof is not None and "profile" in row:
            prof.write(f"==== {row['variant']} ({row['ops']}) batch {row['batch']}\n{row['profile']}\n")
            prof.flush()
        out.write(json.dumps({**meta, **{k: v for k, v in row.items() if k != "profile"}}) + "\n")
        out.flush()
        what = f"{row['ms_per_step']:.3f} ms/step" if "ms_per_step" in row else row.get("error", "")[:200]
        print(f"  {row['variant']:16s} {row['ops']:20s} batch {row['batch']:5d}: {what}", flush=True)

    common = dict(data=data, device=dev, warmup=args.warmup, steps=args.steps, lr=args.lr,
                  profile=args.profile, on_row=on_row)  # fmt: skip
    torch_variants = [v for v in mnist.COMPARE if v.startswith("pytorch")]
    kl_variants = [v for v in mnist.COMPARE if v.startswith("kernellab")]
    mnist.compare(args.batch_sizes, torch_variants, None, **common)
    pools = {"auto": [None], "on": [True], "off": [False], "both": [True, False]}[args.pool_fusion]
    for be in args.backends:
        for fuse_pool in pools:
            mnist.compare(args.batch_sizes, kl_variants, None if be == "default" else be, fuse_pool=fuse_pool,
                          **common)  # fmt: skip
        if args.unfused:
            mnist.compare(args.batch_sizes, kl_variants, None if be == "default" else be, fuse_bn_relu=False,
                          fuse_pool=False, **common)  # fmt: skip
    print(f"timing done in {time.perf_counter() - t_start:.0f} s", flush=True)

    accs = []
    if not args.skip_accuracy:
        for ops in ["pytorch"] + args.backends:
            be = "pytorch" if ops == "pytorch" else (None if ops == "default" else ops)
            row = {"bench": "mnist_accuracy", "ops": ops, "epochs": args.epochs, "batch": 64, "lr": args.lr}
            try:
                r = mnist.train(be, 64, args.epochs, args.lr, data=data, device=dev, seed=0)
                row.update(test_acc=r["test_acc"], final_loss=r["losses"][-1], steps=len(r["losses"]),
                           ms_per_step_synced=r["ms_per_step"])  # fmt: skip
            except Exception as e:  # noqa: BLE001 - reported in its row
                row["error"] = f"{type(e).__name__}: {e}"[:400]
            accs.append(row)
            out.write(json.dumps({**meta, **row}) + "\n")
            out.flush()
            print(f"  accuracy {ops:10s}: {row.get('test_acc', row.get('error'))}", flush=True)
    out.close()
    if prof is not None:
        prof.close()

    # the table: ms/step per variant (columns) and batch size (rows)
    for r in rows:  # the block's form: +brp = bn_relu_pool2d, :unfused = bn, relu, pool apart
        if r["ops"] != "pytorch" and r.get("fused_pool"):
            r["ops"] += "+brp"
        elif r.get("fused_bn_relu") is False and r["ops"] != "pytorch":
            r["ops"] += ":unfused"
    cols = []
    for r in rows:
        key = (r["variant"], r["ops"])
        if key not in cols:
            cols.append(key)
    print(f"\nMNIST CNN step, ms/step ({args.steps} steps after {args.warmup} warm-up), {meta['gpu']}, "
          f"git {meta['git_sha']}")  # fmt: skip
    print("batch  " + "  ".join(f"{v.replace('kernellab', 'kl')}[{o.split(':', 1)[-1]}]" for v, o in cols))
    for b in args.batch_sizes:
        cells = []
        for v, o in cols:
            r = next((r for r in rows if r["batch"] == b and r["variant"] == v and r["ops"] == o), None)
            cells.append("-" if r is None else ("ERR" if "error" in r else f"{r['ms_per_step']:.3f}"))
        best_t = min((r["ms_per_step"] for r in rows if r["batch"] == b and r["ops"] == "pytorch"
                      and "ms_per_step" in r), default=float("nan"))  # fmt: skip
        best_k = min((r["ms_per_step"] for r in rows if r["batch"] == b and r["ops"] != "pytorch"
                      and "ms_per_step" in r), default=float("nan"))  # fmt: skip
        print(f"{b:5d}  " + "  ".join(cells) + f"   best pytorch {best_t:.3f} / best kernellab {best_k:.3f}"
              f" = {best_k / best_t:.2f}x of PyTorch's time")  # fmt: skip
    for a in accs:
        print(f"{args.epochs}-epoch test accuracy {a['ops']}: {a.get('test_acc', a.get('error'))}")
    print(f"total {time.perf_counter() - t_start:.0f} s; rows in {path}")
    return 0 if all("error" not in r for r in rows + accs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
