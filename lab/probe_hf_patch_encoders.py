"""kernellab.patch on Hugging Face encoders and encoder-decoders built from tiny configs (BERT,
ModernBERT, ViT, DINOv2, SigLIP, CLIP text, T5, BART, Whisper ...), CPU: outputs and gradients
of the patched model against the unpatched one.

    python lab/probe_hf_patch_encoders.py bert t5 whisper ...   [--triton: backend="triton"]
"""

import copy
import sys
import warnings

import torch
import transformers

import kernellab

warnings.filterwarnings("ignore")


def build(mt):
    C = transformers.AutoConfig.for_model
    common = dict(initializer_range=0.2, attn_implementation="sdpa")
    text = dict(
        vocab_size=256,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
        **common,
    )
    if mt in ("bert", "roberta", "electra", "xlm-roberta", "modernbert", "camembert", "ernie"):
        cfg = (
            C(mt, **text, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
            if mt != "modernbert"
            else C(mt, **text, pad_token_id=0)
        )
        return transformers.AutoModelForMaskedLM.from_config(cfg), "text"
    if mt in ("vit", "dinov2", "deit", "beit"):
        cfg = C(
            mt,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
            image_size=32,
            patch_size=8,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            **common,
        )
        return transformers.AutoModel.from_config(cfg), "image"
    if mt == "siglip_vision_model":
        cfg = transformers.SiglipVisionConfig(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
            image_size=32,
            patch_size=8,
            **common,
        )
        return transformers.SiglipVisionModel(cfg), "image"
    if mt == "clip_text_model":
        cfg = transformers.CLIPTextConfig(
            vocab_size=256,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
            max_position_embeddings=64,
            **common,
        )
        return transformers.CLIPTextModel(cfg), "text"
    if mt in ("t5", "bart", "whisper", "mbart", "pegasus", "marian"):
        if mt == "t5":
            cfg = C(
                mt,
                vocab_size=256,
                d_model=64,
                d_kv=16,
                d_ff=128,
                num_layers=2,
                num_heads=4,
                dropout_rate=0.0,
                **common,
            )
        elif mt == "whisper":
            cfg = C(
                mt,
                vocab_size=256,
                d_model=64,
                encoder_layers=2,
                decoder_layers=2,
                encoder_attention_heads=4,
                decoder_attention_heads=4,
                encoder_ffn_dim=128,
                decoder_ffn_dim=128,
                num_mel_bins=16,
                max_source_positions=32,
                max_target_positions=32,
                dropout=0.0,
                attention_dropout=0.0,
                pad_token_id=0,
                decoder_start_token_id=1,
                **common,
            )
            return transformers.WhisperForConditionalGeneration(cfg), "whisper"
        else:
            cfg = C(
                mt,
                vocab_size=256,
                d_model=64,
                encoder_layers=2,
                decoder_layers=2,
                encoder_attention_heads=4,
                decoder_attention_heads=4,
                encoder_ffn_dim=128,
                decoder_ffn_dim=128,
                max_position_embeddings=64,
                dropout=0.0,
                attention_dropout=0.0,
                pad_token_id=0,
                decoder_start_token_id=1,
                **common,
            )
        return transformers.AutoModelForSeq2SeqLM.from_config(cfg), "seq2seq"
    raise KeyError(mt)


def run(m, kind, inp):
    if kind == "text":
        o = m(input_ids=inp[0], attention_mask=inp[1]) if inp[1] is not None else m(input_ids=inp[0])
        return o.logits if hasattr(o, "logits") else o.last_hidden_state
    if kind == "image":
        return m(pixel_values=inp[0]).last_hidden_state
    if kind == "seq2seq":
        return m(input_ids=inp[0], decoder_input_ids=inp[0][:, :5], labels=None).logits
    if kind == "whisper":
        return m(input_features=inp[2], decoder_input_ids=inp[0][:, :5]).logits


for mt in [a for a in sys.argv[1:] if not a.startswith("--")]:
    try:
        torch.manual_seed(0)
        ref, kind = build(mt)
        ref = ref.float().eval()
        pat = copy.deepcopy(ref)
        rep = kernellab.patch(pat, verbose=False, **({"backend": "triton"} if "--triton" in sys.argv else {}))
        ids = torch.randint(3, 256, (2, 11))
        mask = torch.ones(2, 11, dtype=torch.long)
        inputs = (
            [(ids, None, torch.randn(2, 16, 64)), (ids, mask, torch.randn(2, 16, 64))]
            if kind == "text"
            else [(ids, None, torch.randn(2, 16, 64))]
        )
        pix = torch.randn(2, 3, 32, 32)
        worst = 0.0
        for inp in inputs:
            if kind == "image":
                inp = (pix,)
            ya, yb = run(ref, kind, inp), run(pat, kind, inp)
            worst = max(worst, (ya - yb).abs().max().item())
            ya.square().mean().backward()
            yb.square().mean().backward()
        g = max(
            ((a.grad - b.grad).abs().max() / (a.grad.abs().max() + 1e-6)).item()
            for a, b in zip(ref.parameters(), pat.parameters())
            if a.grad is not None and b.grad is not None
        )
        kernellab.unpatch(pat)
        print(
            ("OK " if worst < 1e-4 and g < 1e-3 else "BAD"),
            mt,
            f"out {worst:.2e} grad {g:.2e}",
            dict(rep.counts()),
            dict(rep.attention_fallbacks),
            dict(rep.attention_calls),
        )
    except Exception as e:
        print("ERR", mt, type(e).__name__, str(e)[:250])
