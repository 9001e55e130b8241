"""The MNIST CNN's block after its convolution, batch norm (batch statistics) -> relu ->
2x2 max pool, forward + backward, as one fused op against the unfused chains, on a GPU.

    PYTHONPATH=src python lab/bn_relu_pool_bench.py --out DIR [--batch-sizes 64 256 1024]
        [--dtypes fp32 bf16] [--device cpu (a dry run of the script: host clock, Triton interpreted)]

Implementations (each timed forward + backward: z = f(x, w, b), then the gradients of x, w
and b for a fixed dz through torch.autograd.grad):
  fused_triton   kernellab.bn_relu_pool2d, triton (4 launches)
  chain_triton   kernellab.batch_norm2d(relu=True) then kernellab.max_pool2d, triton (6)
  chain_cuda     the same with the cuda backends, where they run
  pytorch        torch.batch_norm(training) + F.relu + F.max_pool2d (the nn.Module model's)
Shapes: the model's two blocks, (N, 32, 28, 28) and (N, 64, 14, 14).

Each row: graph_ms (device time per forward + backward, 20 calls captured in one CUDA
graph and replayed: no host cost, no L2 flush: the model's own graph mode), loop_ms (a plain
eager loop, host cost included: the eager model's view) and the max |z - z_pytorch| as a
sanity check (fp32: rounding; bf16: PyTorch rounds before it pools). Rows go to
DIR/bn_relu_pool_bench.jsonl; a table is printed last. Expected run: ~2 minutes on an H100
(Triton compiles and NVRTC builds included).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.nn.functional as F

import kernellab
from kernellab.harness import timer
from kernellab.harness.bench import git_sha, versions

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _impls(dev):
    out = {
        "fused_triton": lambda x, w, b: kernellab.bn_relu_pool2d(x, w, b, 1e-5, backend="triton"),
        "chain_triton": lambda x, w, b: kernellab.max_pool2d(
            kernellab.batch_norm2d(x, w, b, 1e-5, True, backend="triton"), 2, backend="triton"
        ),
        "pytorch": lambda x, w, b: F.max_pool2d(
            F.relu(torch.batch_norm(x, w, b, None, None, True, 0.0, 1e-5, torch.backends.cudnn.enabled)), 2
        ),
    }
    if dev == "cuda" and all(kernellab.get(op, "cuda").why_unavailable("cuda") is None for op in ("batch_norm2d", "max_pool2d")):
        out["chain_cuda"] = lambda x, w, b: kernellab.max_pool2d(
            kernellab.batch_norm2d(x, w, b, 1e-5, True, backend="cuda"), 2, backend="cuda"
        )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=sorted(DTYPES))
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = ap.parse_args()
    dev = args.device
    if dev == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bn_relu_pool_bench.py: no GPU here (--device cpu for a dry run)")
    if dev == "cuda":
        # 0.5 s per measurement: 48 rows x 3 measurements stay near 1.5 minutes
        graph_ms = lambda fn: timer.time_cuda_graph(fn, budget_s=0.5).median_ms  # noqa: E731
        loop_ms = lambda fn: timer.loop_ms(fn, budget_s=0.5)  # noqa: E731
    else:  # dry run: every path of the script, host-clock numbers that mean nothing
        graph_ms = loop_ms = lambda fn: timer.time_host(fn, min_reps=1, max_reps=2).median_ms
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "bn_relu_pool_bench.jsonl")
    gpu = torch.cuda.get_device_name() if dev == "cuda" else "cpu"
    meta = {"bench": "bn_relu_pool", "gpu": gpu, "git_sha": git_sha(), **versions()}
    impls = _impls(dev)
    rows = []
    t_start = time.perf_counter()
    with open(path, "a") as out:
        for dname in args.dtypes:
            dt = DTYPES[dname]
            for n in args.batch_sizes:
                for c, hw in ((32, 28), (64, 14)):
                    g = torch.Generator(device=dev).manual_seed(n + c)
                    x = torch.randn((n, c, hw, hw), generator=g, device=dev).to(dt).requires_grad_()
                    w = (1 + 0.1 * torch.randn(c, generator=g, device=dev)).to(dt).requires_grad_()
                    b = (0.5 * torch.randn(c, generator=g, device=dev)).to(dt).requires_grad_()
                    dz = torch.randn((n, c, hw // 2, hw // 2), generator=g, device=dev).to(dt)
                    with torch.no_grad():
                        ref = impls["pytorch"](x, w, b).float()
                    for name, f in impls.items():

                        def step(f=f):
                            z = f(x, w, b)
                            return torch.autograd.grad(z, (x, w, b), dz)

                        row = {**meta, "impl": name, "shape": [n, c, hw, hw], "dtype": dname}
                        try:
                            with torch.no_grad():
                                row["max_abs_vs_pytorch"] = float((f(x, w, b).float() - ref).abs().max())
                            row["graph_ms"] = graph_ms(step)
                            row["loop_ms"] = loop_ms(step)
                            row["graph_fwd_ms"] = graph_ms(lambda f=f: f(x.detach(), w.detach(), b.detach()))
                        except Exception as e:  # noqa: BLE001 - reported in its row
                            row["error"] = f"{type(e).__name__}: {e}"[:300]
                        rows.append(row)
                        out.write(json.dumps(row) + "\n")
                        out.flush()
                        what = (f"graph {row['graph_ms']:.4f} ms (fwd {row['graph_fwd_ms']:.4f}), loop "
                                f"{row['loop_ms']:.4f} ms, |z-z_pt| {row['max_abs_vs_pytorch']:.2e}"
                                if "error" not in row else row["error"])  # fmt: skip
                        print(f"  {dname} {n:5d}x{c}x{hw}x{hw} {name:13s} {what}", flush=True)
    print(f"\nbn -> relu -> maxpool2 forward + backward, ms ({meta['gpu']}, git {meta['git_sha']}); "
          "graph = device time in a CUDA graph / loop = eager loop")  # fmt: skip
    names = list(impls)
    print("dtype shape              " + "  ".join(f"{nm:>22s}" for nm in names))
    keys = []
    for r in rows:
        k = (r["dtype"], tuple(r["shape"]))
        if k not in keys:
            keys.append(k)
    for dname, shape in keys:
        cells = []
        for nm in names:
            r = next((r for r in rows if r["dtype"] == dname and tuple(r["shape"]) == shape and r["impl"] == nm), None)
            cells.append(f"{'ERR':>22s}" if r is None or "error" in r else f"{r['graph_ms']:9.4f} / {r['loop_ms']:9.4f}")
        print(f"{dname:5s} {'x'.join(map(str, shape)):18s} " + "  ".join(cells))
    print(f"total {time.perf_counter() - t_start:.0f} s; rows in {path}")
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
