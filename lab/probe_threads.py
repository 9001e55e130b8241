"""Where the host time of a tiny forward+backward goes between threads (GPU host): rms_norm
and layer_norm 64x256 bf16, PyTorch's op against kernellab's Triton backend and the public
default, each (a) as is (the backward runs on autograd's CUDA device thread), (b) with
``torch.autograd.set_multithreading_enabled(False)`` (on the calling thread), (c) with
``sys.setswitchinterval(1e-6)`` (a thread waiting for the GIL gets it within ~1 us) and
(d) with the cyclic GC off. Paired rounds (the cases take turns; ``timer.paired_loop_ms``),
us per call, ratio to PyTorch's op in the same setting.

    PYTHONPATH=src python lab/probe_threads.py [--out DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import sys
import threading

import torch
import torch.nn.functional as F

import kernellab
from kernellab.harness import timer
from kernellab.harness.bench import git_sha, versions


@contextlib.contextmanager
def setting(name):
    if name == "no autograd threads":
        with torch.autograd.set_multithreading_enabled(False):
            yield
    elif name == "switchinterval 1us":
        old = sys.getswitchinterval()
        sys.setswitchinterval(1e-6)
        try:
            yield
        finally:
            sys.setswitchinterval(old)
    elif name == "gc off":
        gc.disable()
        try:
            yield
        finally:
            gc.enable()
    else:
        yield


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    p.add_argument("--rounds", type=int, default=7)
    a = p.parse_args()
    dev, bf = "cuda", torch.bfloat16
    x = torch.randn(64, 256, device=dev, dtype=bf, requires_grad=True)
    w = (1 + 0.1 * torch.randn(256, device=dev)).to(bf).requires_grad_()
    b = (0.1 * torch.randn(256, device=dev)).to(bf).requires_grad_()
    dy = torch.randn(64, 256, device=dev, dtype=bf)

    def fb(f, args):
        return lambda: torch.autograd.grad(f(*args), args, dy)

    cases = {
        "rms_norm torch": fb(lambda x, w: F.rms_norm(x, (256,), w, 1e-6), (x, w)),
        "rms_norm triton": fb(lambda x, w: kernellab.rms_norm(x, w, backend="triton"), (x, w)),
        "rms_norm default": fb(lambda x, w: kernellab.rms_norm(x, w), (x, w)),
        "layer_norm torch": fb(lambda x, w, b: F.layer_norm(x, (256,), w, b), (x, w, b)),
        "layer_norm triton": fb(lambda x, w, b: kernellab.layer_norm(x, w, b, backend="triton"), (x, w, b)),
    }
    meta = {"gpu": torch.cuda.get_device_name(), "git_sha": git_sha(), **versions()}
    print("threads:", [t.name for t in threading.enumerate()])
    rows = []
    for s in ("as is", "no autograd threads", "switchinterval 1us", "gc off"):
        with setting(s):
            got = timer.paired_us(cases, lambda k: k.split()[0] + " torch", a.rounds)
        for k, r in got.items():
            if isinstance(r, Exception):
                print(f"{s:22s} {k:20s} error {r!r}")
                continue
            us, ratio = r
            rows.append({**meta, "probe": "threads", "setting": s, "case": k, "us": round(us, 2),
                         "vs_torch": round(ratio, 3)})  # fmt: skip
            print(f"{s:22s} {k:20s} {us:8.1f} us  {ratio:5.2f}x torch", flush=True)
    if a.out:
        with open(f"{a.out}/probe_threads.jsonl", "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
