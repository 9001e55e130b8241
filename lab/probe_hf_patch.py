"""kernellab.patch on many Hugging Face architectures built from tiny configs (no download), CPU:
logits, loss and every gradient of the patched model against the unpatched one, and unpatch.

    python lab/probe_hf_patch.py llama cohere helium gptj ...        (default backend)
    TRITON_INTERPRET=1 python lab/probe_hf_patch.py --backend triton llama ...

A line per model type: OK / BAD (max |logits diff|, |loss diff|, the largest relative gradient
difference and its parameter; a parameter whose gradient is zero in exact arithmetic, such as
a key bias, shows noise over noise) / ERR (the exception; a config this script cannot build).
"""

import copy
import sys
import traceback
import warnings

import torch
import transformers

import kernellab

warnings.filterwarnings("ignore")
torch.set_grad_enabled(True)


def cfg_of(mt):
    C = transformers.AutoConfig.for_model
    base = dict(
        vocab_size=256,
        num_hidden_layers=2,
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        initializer_range=0.2,
        max_position_embeddings=64,
        attn_implementation="sdpa",
    )
    extra = {
        "gemma": dict(head_dim=16),
        "gemma3_text": dict(
            head_dim=16,
            sliding_window=5,
            query_pre_attn_scalar=16,
            layer_types=["sliding_attention", "full_attention"],
        ),
        "phi3": dict(pad_token_id=0),
        "olmo2": dict(),
        "olmo": dict(),
        "granite": dict(),
        "cohere": dict(),
        "stablelm": dict(),
        "gpt_neox": dict(),
        "starcoder2": dict(sliding_window=None),
        "mixtral": dict(num_local_experts=4, num_experts_per_tok=2),
        "qwen2_moe": dict(
            num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=64
        ),
        "phi": dict(),
        "falcon": dict(new_decoder_architecture=True, num_kv_heads=2),
        "glm": dict(head_dim=16, pad_token_id=0),
        "helium": dict(head_dim=16),
        "smollm3": dict(pad_token_id=0),
        "ministral": dict(),
        "exaone4": dict(),
        "seed_oss": dict(),
        "apertus": dict(),
        "arcee": dict(),
        "hunyuan_v1_dense": dict(),
        "olmo3": dict(),
        "qwen3_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32),
        "bitnet": dict(),
        "nemotron": dict(),
        "persimmon": dict(),
        "gptj": dict(n_embd=64, n_layer=2, n_head=4, rotary_dim=8),
        "bloom": dict(n_layer=2, n_head=4),
        "opt": dict(ffn_dim=128, word_embed_proj_dim=64),
        "gpt_bigcode": dict(n_embd=64, n_layer=2, n_head=4),
        "codegen": dict(n_embd=64, n_layer=2, n_head=4, rotary_dim=8),
    }.get(mt, {})
    kw = {**base, **extra}
    return C(mt, **kw)


def run(m, ids):
    labels = ids.clone()
    labels[0, :2] = -100
    o = m(input_ids=ids, labels=labels)
    return o.logits, o.loss


def probe(mt, backend=None):
    torch.manual_seed(0)
    cfg = cfg_of(mt)
    ref = transformers.AutoModelForCausalLM.from_config(cfg).float()
    with torch.no_grad():
        for n, p in ref.named_parameters():
            if "norm" in n or "ln" in n:
                p.add_(0.1 * torch.randn_like(p))
    ref.eval()  # no dropout
    pat = copy.deepcopy(ref)
    ids = torch.randint(1, 256, (2, 11))
    rep = kernellab.patch(pat, verbose=False, **({"backend": backend} if backend else {}))
    (lr, ll), (pr, pl) = run(ref, ids), run(pat, ids)
    ll.backward()
    pl.backward()
    dl = (lr - pr).abs().max().item() if pr is not None else float("nan")
    dloss = abs(ll.item() - pl.item())
    gmax = 0.0
    gname = ""
    for (n, a), (_, b) in zip(ref.named_parameters(), pat.named_parameters()):
        if a.grad is None and b.grad is None:
            continue
        if (a.grad is None) != (b.grad is None):
            gmax = float("inf")
            gname = n + " (grad missing)"
            break
        d = ((a.grad - b.grad).abs().max() / (a.grad.abs().max() + 1e-12)).item()
        if d > gmax:
            gmax, gname = d, n
    kernellab.unpatch(pat)
    restored = [type(x) for x in pat.modules()] == [type(x) for x in ref.modules()]
    ok = dl < 1e-4 and dloss < 1e-5 and gmax < 1e-3 and restored
    fallbacks = dict(rep.attention_fallbacks) if rep.attention_fallbacks else {}
    head = f"logits {dl:.2e} loss {dloss:.2e} grad {gmax:.2e} ({gname}) restored={restored}"
    return ok, f"{head} counts={dict(rep.counts())} fallbacks={fallbacks}"


args = sys.argv[1:]
backend = None
if "--backend" in args:
    i = args.index("--backend")
    backend = args[i + 1]
    del args[i : i + 2]
for mt in [a for a in args if a != "-v"]:
    try:
        ok, msg = probe(mt, backend)
        print(("OK  " if ok else "BAD ") + mt + ": " + msg, flush=True)
    except Exception as e:
        print("ERR " + mt + ": " + type(e).__name__ + ": " + str(e)[:300], flush=True)
        if "-v" in sys.argv:
            traceback.print_exc()
