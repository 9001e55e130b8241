"""Where a Triton launch's host time goes (GPU host): the norms' backward kernel as its
launch plan binds it (64x256 bf16 rms_norm), launched N times back to back by

- ``Bound``: the plan's launch as the backward calls it (tensors in);
- ``run, tensors``: Triton's compiled launcher called directly with the tensors (it calls
  each tensor's ``data_ptr`` and asks the driver about the pointer: cuPointerGetAttribute);
- ``run, ints``: the same launcher given the addresses as ints (no driver query);
- ``C launch, ints``: ``triton_support.fast_launcher``'s launch (Triton 3.6's C launch
  without its Python wrapper) with ints;
- torch's ``zero_`` on the same dx and ``torch.empty_like``, for scale.

us per launch, median of paired rounds. Also prints the launcher's class and Triton version.

    PYTHONPATH=src python lab/probe_launch_args.py [--out DIR]
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics

import torch
import triton

from kernellab.harness import timer
from kernellab.harness.bench import git_sha, versions
from kernellab.ops.norm_kernels import triton_kernels as nt


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    p.add_argument("--rounds", type=int, default=9)
    a = p.parse_args()
    dev, bf = "cuda", torch.bfloat16
    x = torch.randn(64, 256, device=dev, dtype=bf)
    w = torch.ones(256, device=dev, dtype=bf)
    dy = torch.randn_like(x)
    y, _, rstd = nt.norm_fwd(x, w, None, 1e-6, True)
    nt.norm_bwd(dy, x, w, None, rstd, True, False)
    nt.norm_bwd(dy, x, w, None, rstd, True, False)  # the second call keeps the launcher
    plan = next(v for k, v in nt._PLANS.items() if k[0] == "b")
    bound = plan.launch
    print("triton", triton.__version__, "lean:", bound.lean, "hit:", bound.hit is not None)
    if bound.hit is None:
        return 1
    launch, g0, g1, g2, pre, extra = bound.hit
    function, packed = pre[0], pre[5] if len(pre) == 9 else pre[1]
    run = getattr(launch, "__self__", launch)  # the CudaLauncher whose C launch fast_launcher took
    print("launch:", launch, "pre:", pre[1:])
    try:
        src = inspect.getsource(type(run).__call__ if not inspect.isfunction(run) else run)
        print("\n".join(src.splitlines()[:40]))
    except (TypeError, OSError) as e:
        print("no source:", e)
    dx = torch.empty_like(x)
    dw_part = torch.empty((plan.programs, 256), dtype=torch.float32, device=dev)
    args = (dy, x, w, rstd, rstd, dx, dx, dw_part, rstd, plan.n_rows, plan.n_cols, plan.rows_per_program)
    ints = tuple(t.data_ptr() if isinstance(t, torch.Tensor) else t for t in args)
    raw = torch._C._cuda_getCurrentRawStream
    d = x.device.index
    n = 200

    def loop(f):
        def g():
            for _ in range(n):
                f()

        return g

    cases = {
        "Bound": loop(lambda: bound(*args)),
        "run, tensors": loop(
            lambda: run(g0, g1, g2, raw(d), function, packed, None, None, None, *args, *extra)
        ),  # noqa: E501
        "run, ints": loop(lambda: run(g0, g1, g2, raw(d), function, packed, None, None, None, *ints, *extra)),
        "C launch, ints": loop(lambda: launch(g0, g1, g2, raw(d), *pre, *ints, *extra)),
        "torch zero_": loop(lambda: dx.zero_()),
        "torch empty_like": loop(lambda: torch.empty_like(x)),
    }
    for f in cases.values():
        f()
    torch.cuda.synchronize()
    calls = {k: 5 for k in cases}
    times, errors = timer.paired_loop_ms(cases, calls, a.rounds)
    meta = {"gpu": torch.cuda.get_device_name(), "git_sha": git_sha(), **versions()}
    rows = []
    for k, ts in times.items():
        if k in errors:
            print(f"{k:20s} error {errors[k]!r}")
            continue
        us = statistics.median(ts) * 1e3 / n
        rows.append({**meta, "probe": "launch_args", "case": k, "us_per_launch": round(us, 3)})
        print(f"{k:20s} {us:8.2f} us per launch", flush=True)
    if a.out:
        with open(f"{a.out}/probe_launch_args.jsonl", "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    # the int launch computes what the tensor launch does
    dx.zero_()
    run(g0, g1, g2, raw(d), function, packed, None, None, None, *args, *extra)
    ref = dx.clone()
    dx.zero_()
    run(g0, g1, g2, raw(d), function, packed, None, None, None, *ints, *extra)
    torch.cuda.synchronize()
    print("ints launch == tensors launch:", bool(torch.equal(dx, ref)), "nonzero:", bool(ref.abs().sum() > 0))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
