"""Real text for the GPT model, with nothing to download.

The default corpus is the English documentation that ships inside every CPython:
``pydoc_data.topics`` (the text ``help()`` shows for statements, operators and types:
79 topics, about 465 KB). A user's own UTF-8 file can be given instead (``path``).

Tokens are bytes (vocab 256): no tokenizer files to fetch. The GPT-2 configuration keeps
its real 50304-wide embedding and head (the shape its cross-entropy and last matmul have
in practice); byte ids simply never reach the upper rows.

The whole corpus lives on the device as one int64 tensor; a batch is ``B`` random windows
of ``T + 1`` tokens gathered on the device (no loader in the timed loop).
"""

from __future__ import annotations

from pathlib import Path

import torch

VOCAB = 256


def load_corpus(path: str | Path | None = None) -> str:
    """The text: ``path`` (a UTF-8 file) or, by default, Python's pydoc topics."""
    if path is None:
        from pydoc_data import topics

        return "\n\n".join(topics.topics[k] for k in sorted(topics.topics))
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"data: no such file: {p}")
    if not p.is_file():
        raise ValueError(f"data: {p} is not a file")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"data: {p} is not UTF-8 text ({e})") from None
    if len(text.encode("utf-8")) < 2:
        raise ValueError(f"data: {p} holds {len(text)} characters; need at least 2 bytes of text")
    return text


class ByteData:
    """Train / validation token streams (bytes) on ``device``."""

    def __init__(self, text: str, device="cpu", val_fraction: float = 0.05):
        if not 0.0 <= val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
        ids = torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8).to(torch.int64)
        n_val = int(len(ids) * val_fraction)
        self.train = ids[: len(ids) - n_val].to(device)
        self.val = ids[len(ids) - n_val :].to(device)
        self.device = torch.device(device)

    def batch(self, batch_size: int, seq_len: int, gen: torch.Generator, split: str = "train"):
        """(idx, targets): [B, T] windows and the same windows shifted by one token."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if seq_len < 1:
            raise ValueError(f"seq_len must be >= 1, got {seq_len}")
        src = self.train if split == "train" else self.val
        if len(src) < seq_len + 1:
            raise ValueError(
                f"the {split} text holds {len(src)} tokens; seq_len {seq_len} needs {seq_len + 1}"
            )
        starts = torch.randint(0, len(src) - seq_len, (batch_size, 1), generator=gen, device=gen.device)
        pos = starts + torch.arange(seq_len + 1, device=gen.device)
        win = src[pos.to(src.device)]
        return win[:, :-1], win[:, 1:]
