"""torch.library.opcheck on one backend's custom ops, as ``kernellab check`` runs it
(the spec's layout shape, inputs from its make_inputs), over several seeds, with the
whole error text (check's table cuts it short). Needs a GPU for the traced launches
that the interpreter does not take.

    PYTHONPATH=src python lab/gpu_opcheck.py OP BACKEND DTYPE [--seeds 0,1,2]
"""

import argparse
import traceback

import torch

import kernellab
from kernellab.core.spec import get_spec

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("op")
    ap.add_argument("backend")
    ap.add_argument("dtype", choices=list(DTYPES))
    ap.add_argument("--seeds", default="0,1,2,3")
    args = ap.parse_args()
    spec = get_spec(args.op)
    impl = kernellab.registry.get(args.op, args.backend)
    dtype = DTYPES[args.dtype]
    for seed in (int(s) for s in args.seeds.split(",")):

        def make_args(requires_grad, seed=seed):
            xs = spec.make_inputs(spec.layout_shape, dtype, "cuda", seed)
            return tuple(
                x.detach().clone().requires_grad_(bool(requires_grad) and i in spec.grad_args)
                if isinstance(x, torch.Tensor) else x
                for i, x in enumerate(xs)
            )  # fmt: skip

        def make(requires_grad):
            return torch.randn(spec.layout_shape, device="cuda").to(dtype).requires_grad_(bool(requires_grad))

        make.args = make_args
        for op, build, _ in impl.fn.custom_ops:
            try:
                torch.library.opcheck(op, build(make))
                print(f"seed {seed} {op}: pass", flush=True)
            except Exception:  # noqa: BLE001
                print(f"seed {seed} {op}: FAIL\n{traceback.format_exc()[-3000:]}", flush=True)


if __name__ == "__main__":
    main()
