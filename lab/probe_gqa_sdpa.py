"""Which SDPA kernel a grouped-query causal call takes, and its forward+backward time, the
ways a Hugging Face model can make it (Qwen2.5-0.5B's attention by default: batch 2, 14
query heads on 2 key/value heads, 2048 tokens, head dim 64, bf16): enable_gqa with no mask
(transformers' path when it skips the mask), k/v repeated with the materialized causal mask
(its path when a compiled step builds the mask), k/v repeated with is_causal, and
kernellab.attention (backend cuda, GQA in the kernel). Eager calls; per case the top
kernels under the profiler and the median time.

    python lab/probe_gqa_sdpa.py [--batch 2 --heads 14 --kv-heads 2 --seq 2048] [--out FILE.jsonl]

Why: HF Qwen2's compiled step read 0.92x with kernellab.patch's mask-free path against the
masked one (two machines; benchmarks/NOTES.md (ar))."""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--heads", type=int, default=14)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    import kernellab

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dt = torch.bfloat16 if dev == "cuda" else torch.float32
    b, h, hk, s, d = a.batch, a.heads, a.kv_heads, a.seq, a.dim
    g = h // hk
    q = torch.randn(b, h, s, d, device=dev, dtype=dt, requires_grad=True)
    k = torch.randn(b, hk, s, d, device=dev, dtype=dt, requires_grad=True)
    v = torch.randn(b, hk, s, d, device=dev, dtype=dt, requires_grad=True)
    i = torch.arange(s, device=dev)
    mask = (i[None, :] <= i[:, None])[None, None].expand(b, 1, s, s)  # transformers' sdpa_mask shape

    def rep(t):
        return t[:, :, None].expand(b, hk, g, s, d).reshape(b, h, s, d)

    cases = {
        "enable_gqa_no_mask": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                     enable_gqa=True),
        "repeat_kv_mask": lambda: F.scaled_dot_product_attention(q, rep(k), rep(v), attn_mask=mask),
        "repeat_kv_is_causal": lambda: F.scaled_dot_product_attention(q, rep(k), rep(v), is_causal=True),
        "kernellab_cuda": lambda: kernellab.attention(q, k, v, causal=True, backend="cuda"),
    }
    from profiled import emit_row, measure  # (lab/, this script's folder)

    dout = torch.randn(b, h, s, d, device=dev, dtype=dt)
    for name, fn in cases.items():
        gpu = torch.cuda.get_device_name() if dev == "cuda" else "cpu"
        row = dict(case=name, shape=f"{b}x{h}/{hk}x{s}x{d}", gpu=gpu, torch=torch.__version__)

        def step(fn=fn):
            q.grad = k.grad = v.grad = None
            fn().backward(dout)

        measure(row, step, 5)
        emit_row(row, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
