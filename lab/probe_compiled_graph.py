"""Where a compiled training step's attention goes: compiles a user model's step
(kernellab.models.user_models: loss, backward) and records the ATen graphs that reach
Inductor (AOT autograd's forward and backward, after decomposition) and, with --inductor,
the graphs after Inductor's post-grad passes. Per graph: the count of every attention-related
op (the fused SDPA variants, bmm / mm / baddbmm, the softmax forms) and of matmuls in fp32,
and for each fp32 matmul the model line it came from (the node's stack trace).

    python lab/probe_compiled_graph.py [--model hf-vit] [--batch 64] [--small] [--inductor]
                                       [--variant hf|kernellab] [--out FILE.json]

Why: HF ViT-B/16's compiled step ran fp32 FFMA GEMMs of attention's size and a fused
_safe_softmax a layer where SDPA alone compiles to cuDNN (benchmarks/NOTES.md (aq))."""

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402

WATCH = ("scaled_dot_product", "bmm", "aten.mm", "baddbmm", "addmm", "softmax", "arange", "ge.")
MATMULS = ("bmm", "aten.mm", "baddbmm", "addmm")


def summarize(gm, name: str, out: dict) -> None:
    """Counts of the watched ops in ``gm`` and the source lines of its fp32 matmuls."""
    ops, fp32 = Counter(), []
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        t = str(n.target)
        if any(w in t for w in WATCH):
            ops[t] += 1
        val = n.meta.get("val")
        if any(m in t for m in MATMULS) and getattr(val, "dtype", None) == torch.float32:
            trace = (n.meta.get("stack_trace") or "").strip().splitlines()
            fp32.append({"op": t, "shape": list(val.shape), "from": [ln.strip() for ln in trace[-4:]]})
    seen = {"ops": dict(ops.most_common()), "fp32_matmuls": fp32[:8], "n_fp32": len(fp32)}
    out.setdefault(name, []).append(seen)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="hf-vit")
    ap.add_argument("--variant", default="hf", help="hf (as is) or kernellab (kernellab.patch)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=1024, help="language models: tokens a row")
    ap.add_argument("--small", action="store_true", help="the model's tiny config (a CPU run)")
    ap.add_argument("--inductor", action="store_true", help="also the graphs after Inductor's post-grad pass")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    from functorch.compile import make_boxed_func
    from torch._functorch.aot_autograd import aot_module_simplified

    from kernellab.models import user_models as um

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[a.dtype]
    torch.manual_seed(0)
    with torch.device(dev):
        model = um.hf_model(a.model, a.small)
    model = model.to(dev, dtype).train()
    if a.variant == "kernellab":
        why = um.kernellab_patch(model)
        if why:
            raise SystemExit(why)
    image = a.model in um.HF_IMAGE
    cfg = model.config
    if image:
        x, y, _ = um.image_batch(cfg, a.batch, dev, dtype)
    else:
        x = torch.randint(0, cfg.vocab_size, (a.batch, a.seq), device=dev)
        y = torch.randint(0, cfg.vocab_size, (a.batch, a.seq), device=dev)
    found: dict = {}

    def aot_compiler(name):
        def compile_(gm, example_inputs):
            summarize(gm, name, found)
            return make_boxed_func(gm.forward)

        return compile_

    def aot_backend(gm, example_inputs):
        return aot_module_simplified(gm, example_inputs, fw_compiler=aot_compiler("aot_forward"),
                                     bw_compiler=aot_compiler("aot_backward"))  # fmt: skip

    loss_of = um.loss_fn(model, True, image)
    for _ in range(2):  # (HF's loss sets config.problem_type on its first call: one recompile)
        torch.compile(loss_of, backend=aot_backend)(x, y).backward()
    if a.inductor:
        import torch._inductor.config as ic

        torch._dynamo.reset()
        ic.post_grad_custom_post_pass = lambda g: summarize(type("G", (), {"graph": g})(), "post_grad", found)
        for _ in range(2):
            torch.compile(loss_of)(x, y).backward()
        ic.post_grad_custom_post_pass = None
    row = dict(model=a.model, variant=a.variant, batch=a.batch, small=a.small, dtype=a.dtype, device=dev,
               gpu=torch.cuda.get_device_name() if dev == "cuda" else "cpu", torch=torch.__version__,
               graphs=found)  # fmt: skip
    text = json.dumps(row, indent=1)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
