"""Where a GPT-2 training step spends its host time: each op set x mode timed, then the
Python profile (cProfile, top functions by own time) of a few steps, and for compiled
modes the graph breaks Dynamo reports.

    PYTHONPATH=src python lab/probe_step.py --out DIR [--bt 4x256] [--sets pytorch kl_triton]
        [--modes eager compile] [--top 30]

Not a benchmark (gpt_step.py is): the profile slows the steps it watches. It answers
"which of our Python functions cost what per step" so the host path can be cut where it
is heaviest.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import time

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import gpt_step  # noqa: E402  (op sets and the model builder)

from kernellab.models import gpt  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    p.add_argument("--bt", nargs="+", default=["4x256"])
    p.add_argument("--sets", nargs="+", default=["pytorch", "kl_triton"])
    p.add_argument("--modes", nargs="+", default=["eager", "compile"])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--top", type=int, default=30)
    args = p.parse_args()
    out = open(f"{args.out}/probe_step.txt", "a") if args.out else None

    def say(s=""):
        print(s, flush=True)
        if out:
            out.write(s + "\n")

    for bt in args.bt:
        b, t = map(int, bt.split("x"))
        for mode in args.modes:
            for s in args.sets:
                model = gpt_step._model(s)
                idx = torch.randint(0, 50257, (b, t), device="cuda")
                tr = gpt.Trainer(model, mode, lr=1e-4)
                if mode != "eager":
                    expl = torch._dynamo.explain(model)(idx, idx)
                    say(f"[{s} {mode} {bt}] graphs={expl.graph_count} breaks={expl.graph_break_count}")
                    for br in expl.break_reasons[:5]:
                        say(f"    break: {str(br.reason)[:200]}")
                    torch._dynamo.reset()
                    tr = gpt.Trainer(model, mode, lr=1e-4)
                r = gpt.time_steps(tr, (idx, idx), warmup=4, steps=args.steps, rounds=3)
                say(f"[{s} {mode} {bt}] {json.dumps({k: round(v, 3) for k, v in r.items()})}")
                torch.cuda.synchronize()
                prof = cProfile.Profile()
                t0 = time.perf_counter()
                prof.enable()
                for _ in range(args.steps):
                    tr.step(idx, idx)
                prof.disable()
                torch.cuda.synchronize()
                say(f"  profiled {args.steps} steps in {(time.perf_counter() - t0) * 1e3 / args.steps:.2f} ms/step")
                buf = io.StringIO()
                pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(args.top)
                say("\n".join(ln for ln in buf.getvalue().splitlines() if ln.strip())[:12000])
                torch._dynamo.reset()
                del tr, model
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
