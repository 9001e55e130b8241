"""Which SDPA kernels a torch.compile'd training step runs at ViT-B/16's attention
(64 x 12 heads x 197 tokens x 64, bf16, q/k/v as HF's ViT makes them: a linear's output
viewed as heads and transposed), called several ways: F.scaled_dot_product_attention
plain, with scale=, with dropout_p=0.0, through transformers' sdpa_attention_forward, and
kernellab.attention with backend="cuda" (an opaque custom op). Per case: the top kernels of
one forward+backward under the profiler and its time (CUDA events, median of 20).

    python lab/probe_compile_sdpa.py [--out FILE.jsonl]"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--batch", type=int, default=64)
    a = ap.parse_args(argv)
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    import kernellab

    b, h, s, d = a.batch, 12, 197, 64
    lin = torch.nn.Linear(h * d, 3 * h * d, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(b, s, h * d, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    class Mod(torch.nn.Module):
        is_causal = False

    mod = Mod()

    def qkv():
        t = lin(x)
        return [t[..., i * h * d : (i + 1) * h * d].view(b, s, h, d).transpose(1, 2) for i in range(3)]

    cases = {
        "sdpa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
        "sdpa_scale": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, scale=0.125),
        "sdpa_dropout0": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=0.0, scale=0.125),
        "hf_sdpa": lambda q, k, v: sdpa_attention_forward(mod, q, k, v, None, dropout=0.0, scaling=0.125)[0],
        "kernellab_cuda": lambda q, k, v: kernellab.attention(q, k, v, scale=0.125, backend="cuda"),
    }
    from profiled import emit_row, measure  # (lab/, this script's folder)

    for name, fn in cases.items():
        for mode in ("eager", "compile"):
            torch._dynamo.reset()

            def step(fn=fn):
                q, k, v = qkv()
                out = fn(q, k, v)
                out.float().sum().backward()

            run = torch.compile(step) if mode == "compile" else step
            row = dict(case=name, mode=mode, gpu=torch.cuda.get_device_name(), torch=torch.__version__)
            measure(row, run)
            emit_row(row, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
