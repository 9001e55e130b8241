"""The attention backward's lab builds (cuda_sm90_bwd.BWD_LAB) against the default and
cuDNN at Gemma-2's head-dim-256 GQA shape, small enough for the tail of a device call:

    python lab/probe_bwd_builds.py [--out FILE.jsonl] [--causal both|true|false] [--shape B,Hq,Hkv,S,D[;...]]
                                   [--grid-only] [--flip OPTION[,OPTION...]] [--pairs N[,N...]]
                                   [--split N[,N...]]
    python lab/probe_bwd_builds.py --precompile 64,80,96,128,256

--grid-only times the default beside the default with the other grid only (persistent or a
block an item: ``BwdOpts.persist``), at each of the ;-separated shapes; --flip q128 the
default beside the default with that option (a ``BwdOpts`` field) flipped, each on its own;
--pairs 1,4,28 the default (sections of pairs by the L2 budget) beside the default with
sections of each count of (k/v head, batch) pairs (``BwdOpts.pairs``; no build of its own);
--split 2,4,7 the default beside the default with each key block's items split over runs of
the group's q heads (``BwdOpts.split``; one build for every count).

The builds' modules are first compiled in parallel processes into the disk cache (a build
takes 5-20 s of NVRTC and ptxas; a head dim has six).

Per case: cuDNN's backward (SDPA, retain_graph), cuda_v9's backward launched directly by
the head dim's default build (BWD_DEFAULTS, named in the row's "default") and by each lab build (harness.timer.time_cuda, L2 flushed), and the default's largest
difference from cuDNN's gradients (a build that is not exact is a timing bound only)."""

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from kernellab.harness import timer  # noqa: E402
from kernellab.harness.bench import git_sha  # noqa: E402
from kernellab.ops.attention import cuda_sm90 as cs  # noqa: E402
from kernellab.ops.attention import cuda_sm90_bwd as cb  # noqa: E402


def _compile_one(job) -> None:
    d, opts = job
    cb.bwd_module(d, opts).compile("sm_90")


def builds(d: int, grid_only: bool = False, flip: tuple = (), pairs: tuple = (), split: tuple = ()) -> tuple:
    """The builds timed at head dim d: the default, then BWD_LAB[d] (grid_only: the default
    with the other grid alone; flip: the default with each named option flipped; pairs: the
    default with each section size; split: with each split count)."""
    default = cb.BWD_DEFAULTS[d]
    if pairs:
        return (default, *(dataclasses.replace(default, pairs=n) for n in pairs))
    if split:
        return (default, *(dataclasses.replace(default, split=n) for n in split))
    if grid_only:
        flip = ("persist",)
    if flip:
        return (default, *(dataclasses.replace(default, **{f: not getattr(default, f)}) for f in flip))
    return (default, *cb.BWD_LAB[d])


def precompile(*ds: int, grid_only: bool = False, flip: tuple = ()) -> None:
    """Every build of the head dims ds (``builds``) compiled into the disk cache, one process
    each."""
    import os
    import time
    from concurrent.futures import ProcessPoolExecutor

    jobs = [(d, o) for d in ds for o in builds(d, grid_only, flip)]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=min(len(jobs), os.cpu_count() or 4)) as ex:
        list(ex.map(_compile_one, jobs))
    print(f"compiled {len(jobs)} builds of D={ds} in {time.perf_counter() - t0:.1f} s", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--causal", default="both", choices=("both", "true", "false"))
    ap.add_argument("--shape", default="1,8,4,4096,256", help="B,H_q,H_kv,S,D")
    ap.add_argument("--precompile", default=None, help="only compile these head dims' builds (e.g. 64,128)")
    ap.add_argument("--grid-only", action="store_true", help="the default and its other grid only")
    ap.add_argument("--flip", default="", help="the default and the default with these options flipped")
    ap.add_argument("--pairs", default="", help="the default and the default with these section sizes")
    ap.add_argument("--split", default="", help="the default and the default with these split counts")
    a = ap.parse_args()
    a.flip = tuple(f for f in a.flip.split(",") if f)
    a.pairs = tuple(int(n) for n in a.pairs.split(",") if n)
    a.split = tuple(int(n) for n in a.split.split(",") if n)
    if a.precompile:
        precompile(*(int(x) for x in a.precompile.split(",")), grid_only=a.grid_only, flip=a.flip)
        return 0
    shapes = [tuple(int(x) for x in one.split(",")) for one in a.shape.split(";")]
    precompile(*sorted({sh[4] for sh in shapes}), grid_only=a.grid_only, flip=a.flip)
    for shape in shapes:
        probe(shape, a)
    return 0


def probe(shape: tuple, a) -> None:
    """One shape's rows (both causal flags unless --causal says otherwise)."""
    b, hq, hkv, s, d = shape
    flags = {"both": (False, True), "true": (True,), "false": (False,)}[a.causal]
    gen = torch.Generator("cuda").manual_seed(0)
    q, k, v = (
        torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, generator=gen) for h in (hq, hkv, hkv)
    )
    do = torch.randn(b, hq, s, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    scale = 1 / math.sqrt(d)
    tkw = dict(min_time_s=0.1, budget_s=0.8)
    for causal in flags:
        row = dict(gpu=torch.cuda.get_device_name(), git_sha=git_sha(), B=b, Hq=hq, Hkv=hkv, S=s, D=d,
                   causal=causal, default=str(cb.BWD_DEFAULTS[d]), bwd_ms={})  # fmt: skip
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            o_ref = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal, enable_gqa=True)
        ref = torch.autograd.grad(o_ref, (qg, kg, vg), do, retain_graph=True)

        def cudnn_bwd():
            return torch.autograd.grad(o_ref, (qg, kg, vg), do, retain_graph=True)

        row["bwd_ms"]["cudnn"] = round(timer.time_cuda(cudnn_bwd, **tkw).median_ms, 4)
        o, lse = cs.forward(q, k, v, causal, scale, "v7")
        for opts in builds(d, a.grid_only, a.flip, a.pairs, a.split):
            name = "default" if opts == cb.BWD_DEFAULTS[d] else str(opts)

            def bwd(opts=opts):
                return cb.backward(do, q, k, v, o, lse, causal, scale, "v9", opts)

            g = bwd()
            torch.cuda.synchronize()
            if opts.exact:
                row.setdefault("max_diff_vs_cudnn", {})[name] = round(
                    max((x.float() - r.float()).abs().max().item() for x, r in zip(g, ref)), 4)  # fmt: skip
            row["bwd_ms"][f"v9@{name}"] = round(timer.time_cuda(bwd, **tkw).median_ms, 4)
        print(json.dumps(row), flush=True)
        if a.out:
            with open(a.out, "a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    sys.exit(main())
