"""What a Python autograd node costs on the GPU host, against PyTorch's C++ node doing the
same kernels; and how much of kernellab's rms_norm forward+backward is its launches.

64x256 bf16 on the GPU, forward+backward through ``torch.autograd.grad``, paired rounds
(``timer.paired_loop_ms``), us per call, each (a) as is (the backward runs on autograd's
device thread) and (b) with ``torch.autograd.set_multithreading_enabled(False)``:

- ``mul C++``: ``x * 2`` (MulBackward0: one kernel each way, a C++ node);
- ``mul py``: the same two kernels in an ``autograd.Function`` (a Python node);
- ``mul py, no bwd kernel``: its backward returns dy itself (the node alone);
- ``rms_norm torch`` / ``rms_norm triton`` / ``rms_norm triton, no launches`` (the Triton
  launches replaced by nothing: the Python, allocations and autograd around them).

    PYTHONPATH=src python lab/probe_node.py [--out DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import json

import torch
import torch.nn.functional as F

import kernellab
from kernellab import triton_support
from kernellab.harness import timer
from kernellab.harness.bench import git_sha, versions


class _Mul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.mul(2.0)

    @staticmethod
    def backward(ctx, dy):
        return dy.mul(2.0)


class _Pass(_Mul):  # _Mul's forward; the backward launches nothing
    @staticmethod
    def backward(ctx, dy):
        return dy


@contextlib.contextmanager
def no_launches():
    call = triton_support.Bound.__call__
    triton_support.Bound.__call__ = lambda self, *args: None
    try:
        yield
    finally:
        triton_support.Bound.__call__ = call


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    p.add_argument("--rounds", type=int, default=9)
    a = p.parse_args()
    dev, bf = "cuda", torch.bfloat16
    x = torch.randn(64, 256, device=dev, dtype=bf, requires_grad=True)
    w = (1 + 0.1 * torch.randn(256, device=dev)).to(bf).requires_grad_()
    dy = torch.randn(64, 256, device=dev, dtype=bf)

    def fb(f, args):
        return lambda: torch.autograd.grad(f(*args), args, dy)

    rms = lambda x, w: kernellab.rms_norm(x, w, backend="triton")  # noqa: E731
    cases = {
        "mul C++": fb(lambda x: x * 2.0, (x,)),
        "mul py": fb(_Mul.apply, (x,)),
        "mul py, no bwd kernel": fb(_Pass.apply, (x,)),
        "rms_norm torch": fb(lambda x, w: F.rms_norm(x, (256,), w, 1e-6), (x, w)),
        "rms_norm triton": fb(rms, (x, w)),
        "rms_norm default": fb(lambda x, w: kernellab.rms_norm(x, w), (x, w)),
    }
    stubbed = fb(rms, (x, w))

    def stub():
        with no_launches():
            stubbed()

    cases["rms_norm triton, no launches"] = stub
    meta = {"gpu": torch.cuda.get_device_name(), "git_sha": git_sha(), **versions()}
    rows = []

    def base_of(k):
        return "mul C++" if k.startswith("mul") else "rms_norm torch"

    for setting in ("as is", "no autograd threads"):
        threads = setting == "as is"
        with torch.autograd.set_multithreading_enabled(False) if not threads else contextlib.nullcontext():
            got = timer.paired_us(cases, base_of, a.rounds)
        for k, r in got.items():
            if isinstance(r, Exception):
                print(f"{setting:20s} {k:30s} error {r!r}")
                continue
            us, ratio = r
            rows.append({**meta, "probe": "node", "setting": setting, "case": k, "us": round(us, 2),
                         "vs_base": round(ratio, 3)})  # fmt: skip
            print(f"{setting:20s} {k:30s} {us:8.1f} us  {ratio:5.2f}x", flush=True)
    if a.out:
        with open(f"{a.out}/probe_node.jsonl", "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
