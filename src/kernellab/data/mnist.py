"""MNIST from its original IDX files, or real handwritten digits that ship with kernellab.

``load(data_dir)`` reads ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
``t10k-images-idx3-ubyte`` and ``t10k-labels-idx1-ubyte`` (each plain or ``.gz``, and
also spelled ``train-images.idx3-ubyte`` as many copies are) from ``data_dir``; with
``data_dir=None`` it returns the shipped UCI digits (``DIGITS.md``),
8x8 images upsampled to MNIST's 28x28, split 1,497 train / 300 test. Either way:
``Digits(train_x, train_y, test_x, test_y, source)`` with images float32 in [0, 1] shaped
[N, 1, 28, 28] and labels int64 [N], on ``device`` (the course keeps the whole set on the
device; batches are slices).

IDX format (LeCun's MNIST page): a big-endian header, magic 0x00000801 (labels, 1 dim) or
0x00000803 (images, 3 dims), then each dimension as a 32-bit count, then unsigned bytes.
A missing file, a wrong magic number, a truncated body or image and label counts that
disagree are refused with an error naming the file.
"""

from __future__ import annotations

import gzip
import os
from typing import NamedTuple

import numpy as np
import torch

FILES = {
    "train_x": "train-images-idx3-ubyte",
    "train_y": "train-labels-idx1-ubyte",
    "test_x": "t10k-images-idx3-ubyte",
    "test_y": "t10k-labels-idx1-ubyte",
}
_MAGIC = {0x00000801: 1, 0x00000803: 3}  # unsigned-byte IDX files: labels, images
DIGITS_TEST = 300  # shipped digits held out for test accuracy (the last 300 rows)


class Digits(NamedTuple):
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    source: str


def read_idx(path: str) -> np.ndarray:
    """The array in an unsigned-byte IDX file (``.gz`` read through gzip)."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file")
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as fh:
            raw = fh.read()
    except (OSError, EOFError) as e:  # a damaged .gz
        raise ValueError(f"{path}: cannot be read ({e})") from None
    if len(raw) < 4:
        raise ValueError(f"{path}: truncated: {len(raw)} bytes, not even an IDX header")
    magic = int.from_bytes(raw[:4], "big")
    if magic not in _MAGIC:
        raise ValueError(
            f"{path}: not an unsigned-byte IDX file (magic 0x{magic:08x}; expected 0x00000801 or 0x00000803)"
        )
    ndim = _MAGIC[magic]
    head = 4 + 4 * ndim
    if len(raw) < head:
        raise ValueError(f"{path}: truncated: the header needs {head} bytes, the file has {len(raw)}")
    dims = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    need = head + int(np.prod(dims, dtype=np.int64))
    if len(raw) != need:
        what = "truncated" if len(raw) < need else "longer than its header says"
        raise ValueError(f"{path}: {what}: dims {dims} need {need} bytes, the file has {len(raw)}")
    return np.frombuffer(raw, dtype=np.uint8, offset=head).reshape(dims)


def _spellings(stem: str) -> tuple[str, ...]:
    """The names a file goes by: LeCun's ``train-images-idx3-ubyte``, the
    ``train-images.idx3-ubyte`` of many redistributed copies, each plain or ``.gz``."""
    dotted = stem.replace("-idx", ".idx")
    return (stem, stem + ".gz", dotted, dotted + ".gz")


def _find(data_dir: str, stem: str) -> str:
    for name in _spellings(stem):
        p = os.path.join(data_dir, name)
        if os.path.exists(p):
            return p
    raise FileNotFoundError(
        f"{os.path.join(data_dir, stem)}[.gz]: no such file (MNIST's IDX files expected in {data_dir}, "
        f"named {stem} or {stem.replace('-idx', '.idx')}, plain or .gz)"
    )


def _images(a: np.ndarray, device) -> torch.Tensor:
    return torch.from_numpy(a.astype(np.float32) / 255.0).unsqueeze(1).to(device)


def load_idx_dir(data_dir: str, device="cpu") -> Digits:
    """MNIST's four IDX files from ``data_dir``."""
    if not os.path.isdir(data_dir):
        raise FileNotFoundError(f"data_dir: {data_dir}: no such directory")
    arrays, paths = {}, {}
    for key, stem in FILES.items():
        paths[key] = _find(data_dir, stem)
        arrays[key] = read_idx(paths[key])
    for split in ("train", "test"):
        x, y = arrays[f"{split}_x"], arrays[f"{split}_y"]
        if x.ndim != 3 or y.ndim != 1:
            raise ValueError(f"{paths[split + '_x']}: expected images (3 dims) and labels (1 dim)")
        if x.shape[0] != y.shape[0]:
            raise ValueError(
                f"{paths[split + '_x']} holds {x.shape[0]} images but {paths[split + '_y']} {y.shape[0]} labels"
            )
        if y.size and y.max() > 9:
            raise ValueError(f"{paths[split + '_y']}: label {int(y.max())} is not a digit")
    return Digits(
        _images(arrays["train_x"], device),
        torch.from_numpy(arrays["train_y"].astype(np.int64)).to(device),
        _images(arrays["test_x"], device),
        torch.from_numpy(arrays["test_y"].astype(np.int64)).to(device),
        f"MNIST IDX files in {data_dir}",
    )


def load_shipped_digits(device="cpu", size: int = 28) -> Digits:
    """The shipped UCI digits: 8x8 pixels 0..16, upsampled (bilinear) to size x size,
    scaled to [0, 1]; the last DIGITS_TEST rows are the test split."""
    path = os.path.join(os.path.dirname(__file__), "digits.csv.gz")
    table = np.loadtxt(path, delimiter=",", dtype=np.float32)
    x = torch.from_numpy(table[:, :64] / 16.0).reshape(-1, 1, 8, 8)
    y = torch.from_numpy(table[:, 64].astype(np.int64))
    x = torch.nn.functional.interpolate(x, size=(size, size), mode="bilinear", align_corners=False).clamp(0, 1)
    n = x.shape[0] - DIGITS_TEST
    x, y = x.to(device), y.to(device)
    return Digits(x[:n], y[:n], x[n:], y[n:], f"UCI handwritten digits (shipped, 8x8 upsampled to {size}x{size})")


def load(data_dir: str | None = None, device="cpu") -> Digits:
    """MNIST from ``data_dir`` (its IDX files), or the shipped digits when None."""
    return load_shipped_digits(device) if data_dir is None else load_idx_dir(data_dir, device)
