"""Does SDPA's backward go wrong when the output gradient has zero strides?

On an H100, `kernellab check` flagged the `torch` attention backend in fp16/bf16 with an
"expanded" output gradient (one [S, D] matrix repeated over batch and heads with stride
0, as ops/spec.py `relayout` builds it): dq NaN where the float64 reference is finite. A
plain repro at four other shapes gave no NaN. This probe runs every SDPA kernel (the
default choice, flash, efficient, cuDNN, math) x fp16/bf16 x causal x shapes (the check's
layout shape (2, 3, 37, 64) and others with S in {37, 64, 128, 1000}, D in {64, 128}), with
the same dO values laid out expanded and contiguous, each in two modes, and prints one line
per case:

  plain:    fresh tensors, as a user's script sees them (a plain repro of this kind gave
            no NaN at four shapes, and none on an H200 at (2, 3, 37, 64));
  poisoned: as `kernellab check` runs it: the first query row x30 in 16-bit (the spec's
            plant: scores ~100), NaN-filled blocks left in the caching allocator before the
            forward and the backward, and torch.empty filling new tensors with NaN
            (deterministic algorithms, warn_only), so memory a kernel reads or leaves
            unwritten shows up as NaN. `kernellab check attention -b torch --quick --seed
            230207637 --dtype fp16` failed this way on an H200 at 5a361f7 (dq: 640 NaN).

  kernel dtype causal shape mode dO | out err | dq/dk/dv: max error against float64 autograd,
  "NaN"/"inf" where the gradient holds them (the reference never does here), and
  "dexp" = max |grad(expanded dO) - grad(contiguous dO)| (0 or rounding when the kernel
  reads the zero strides right).

With kernellab importable (PYTHONPATH=src), rows for kernellab's `torch` backend follow,
whose backward hook hands SDPA a contiguous copy of such a dO: they must be clean.

  python lab/probe_sdpa_expanded_grad.py            # ~200 lines, well under a minute on an H100
  python lab/probe_sdpa_expanded_grad.py --quick    # the check's layout shape only
"""

from __future__ import annotations

import argparse
import math
import time

import torch
import torch.nn.functional as F

SHAPES = [(2, 3, 37, 64), (2, 3, 37, 128), (2, 4, 64, 64), (1, 8, 128, 128), (1, 2, 1000, 64),
          (2, 3, 1000, 128)]
KERNELS = ["default", "flash", "efficient", "cudnn", "math"]
_SDP = {
    "flash": "FLASH_ATTENTION",
    "efficient": "EFFICIENT_ATTENTION",
    "cudnn": "CUDNN_ATTENTION",
    "math": "MATH",
}


def expanded(t: torch.Tensor) -> torch.Tensor:
    """t's first [S, D] matrix repeated over the leading dims with stride 0 (relayout's
    "expanded": the values of the returned tensor are what the contiguous run gets too)."""
    s, d = t.shape[-2:]
    lead = t.reshape(-1, s, d)[:1].clone()
    return lead.reshape((1,) * (t.dim() - 2) + (s, d)).expand(t.shape)


def reference(q, k, v, dy, causal):
    """Output and (dq, dk, dv) in float64 by autograd of the plain formula."""
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:  # S_q == S_k here: top-left and bottom-right agree
        n = s.shape[-1]
        s = s.masked_fill(~torch.ones(n, n, dtype=torch.bool, device=s.device).tril(), float("-inf"))
    o = torch.softmax(s, -1) @ v
    return o.detach(), torch.autograd.grad(o, (q, k, v), dy.double())


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def poison(*tensors, copies=3):
    """NaN-filled blocks of each tensor's size left in the caching allocator's free lists
    (what the check's poison_allocator does before the forward and the backward)."""
    bufs = [torch.full_like(t, float("nan")) for t in tensors for _ in range(copies)]
    sync()
    del bufs


def nan_filled_empty():
    """torch.empty fills new tensors with NaN: the check's own context manager."""
    from kernellab.harness.check import nan_filled_empty as check_nan_filled_empty

    return check_nan_filled_empty()


def forward(kernel, leaves, causal):
    if kernel == "kernellab_torch":
        import kernellab

        return kernellab.attention(*leaves, causal, backend="torch")
    if kernel == "default":
        return F.scaled_dot_product_attention(*leaves, is_causal=causal)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([getattr(SDPBackend, _SDP[kernel])]):
        return F.scaled_dot_product_attention(*leaves, is_causal=causal)


def run(kernel, q, k, v, dy, causal, poisoned):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    if not poisoned:
        o = forward(kernel, leaves, causal)
        return o.detach(), torch.autograd.grad(o, leaves, dy)
    poison(q, k, v)
    with nan_filled_empty():
        o = forward(kernel, leaves, causal)
        sync()
        poison(q, k, v)
        grads = torch.autograd.grad(o, leaves, dy)
        sync()
    return o.detach(), grads


def flags(t: torch.Tensor) -> str:
    bad = [n for n, f in (("NaN", torch.isnan), ("inf", torch.isinf)) if bool(f(t).any())]
    return "+".join(bad) if bad else "ok"


def err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b).abs().nan_to_num(float("inf")).max()) if a.numel() else 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="the check's layout shape (2, 3, 37, 64) only")
    ap.add_argument("--device", default="cuda", help="cuda (default); cpu only tries the probe itself")
    args = ap.parse_args()
    dev = args.device
    if dev == "cuda" and not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    name = torch.cuda.get_device_name() if dev == "cuda" else "cpu"
    print(f"# {name}  torch {torch.__version__}  cuDNN {torch.backends.cudnn.version()}")
    try:
        import kernellab  # noqa: F401

        runners = KERNELS + ["kernellab_torch"]
    except ImportError:
        runners = KERNELS
    shapes = SHAPES[:1] if args.quick else SHAPES
    t0 = time.perf_counter()
    suspicious = []
    for shape in shapes:
        for dtype in (torch.float16, torch.bfloat16):
            for causal in (False, True):
                g = torch.Generator(device=dev).manual_seed(hash((shape, causal)) & 0xFFFF)
                q0, k, v = (torch.randn(shape, generator=g, device=dev).to(dtype) for _ in range(3))
                dy_exp = expanded(torch.randn(shape, generator=g, device=dev).to(dtype))
                dy_con = dy_exp.contiguous()
                big = q0.clone()
                big[..., 0, :] *= 30  # the check's plant (attention spec: _big_first_query)
                refs = {p: reference(big if p else q0, k, v, dy_con, causal) for p in (False, True)}
                for kern in runners:
                    where = "x".join(map(str, shape))
                    head = f"{kern:15s} {str(dtype)[6:]:8s} causal={int(causal)} {where:12s}"
                    for poisoned in (False, True):
                        q = big if poisoned else q0
                        ref_o, ref_g = refs[poisoned]
                        mode = "poisoned" if poisoned else "plain"
                        runs = {}
                        for lay, dy in (("contig", dy_con), ("expanded", dy_exp)):
                            try:
                                runs[lay] = run(kern, q, k, v, dy, causal, poisoned)
                                sync()
                            except Exception as e:  # noqa: BLE001 - a refusal is a result
                                why = str(e).splitlines()[0][:90] if str(e) else ""
                                print(f"{head} {mode:8s} dO={lay:8s} | refused: {type(e).__name__}: {why}")
                        for lay, (o, grads) in runs.items():
                            cols = [f"out {err(o, ref_o):.2e}"]
                            for name, gr, rg, i in zip(("dq", "dk", "dv"), grads, ref_g, range(3)):
                                col = f"{name} {flags(gr):7s} {err(gr, rg):.2e}"
                                if lay == "expanded" and "contig" in runs:
                                    col += f" dexp {err(gr, runs['contig'][1][i].double()):.1e}"
                                cols.append(col)
                                if flags(gr) != "ok":
                                    n_bad = int((~gr.isfinite()).sum())
                                    suspicious.append(f"{head} {mode} dO={lay} {name} {flags(gr)} ({n_bad})")
                            print(f"{head} {mode:8s} dO={lay:8s} | " + " | ".join(cols), flush=True)
    print(f"# {time.perf_counter() - t0:.1f} s")
    print(f"# gradients with NaN/inf (the float64 reference has none): {len(suspicious)}")
    for line in suspicious:
        print("#   " + line)


if __name__ == "__main__":
    main()
