"""MNIST data: the IDX reader (plain and gzip) and its refusals, and the shipped digits."""

from __future__ import annotations

import gzip

import numpy as np
import pytest
import torch

from kernellab.data import mnist


def _idx(arr: np.ndarray) -> bytes:
    magic = 0x00000803 if arr.ndim == 3 else 0x00000801
    head = magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in arr.shape)
    return head + arr.astype(np.uint8).tobytes()


def _write_set(d, n_train=7, n_test=3, gz=False, seed=0, dotted=False):
    rng = np.random.default_rng(seed)
    arrays = {
        "train_x": rng.integers(0, 256, (n_train, 28, 28)),
        "train_y": rng.integers(0, 10, n_train),
        "test_x": rng.integers(0, 256, (n_test, 28, 28)),
        "test_y": rng.integers(0, 10, n_test),
    }
    for key, stem in mnist.FILES.items():
        data = _idx(arrays[key])
        if dotted:  # train-images.idx3-ubyte, as many redistributed copies name them
            stem = stem.replace("-idx", ".idx")
        if gz:
            (d / (stem + ".gz")).write_bytes(gzip.compress(data))
        else:
            (d / stem).write_bytes(data)
    return arrays


@pytest.mark.parametrize("dotted", [False, True], ids=["lecun-names", "dotted-names"])
@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_idx_directory_round_trip(tmp_path, gz, dotted):
    arrays = _write_set(tmp_path, gz=gz, dotted=dotted)
    ds = mnist.load(str(tmp_path))
    assert ds.train_x.shape == (7, 1, 28, 28) and ds.test_x.shape == (3, 1, 28, 28)
    assert ds.train_x.dtype == torch.float32 and ds.train_y.dtype == torch.int64
    assert torch.equal((ds.train_x[:, 0] * 255).round().to(torch.int64), torch.from_numpy(arrays["train_x"]))
    assert torch.equal(ds.test_y, torch.from_numpy(arrays["test_y"]))
    assert "MNIST IDX" in ds.source


def test_idx_refusals_name_the_file(tmp_path):
    _write_set(tmp_path)
    labels = tmp_path / "train-labels-idx1-ubyte"
    good = labels.read_bytes()
    labels.write_bytes(b"\x00\x00\x08\x02" + good[4:])  # a signed-byte magic
    with pytest.raises(ValueError, match=r"train-labels-idx1-ubyte: not an unsigned-byte IDX file \(magic 0x00000802"):
        mnist.load(str(tmp_path))
    labels.write_bytes(good[:-2])
    with pytest.raises(ValueError, match="train-labels-idx1-ubyte: truncated: dims"):
        mnist.load(str(tmp_path))
    labels.write_bytes(good[:6])
    with pytest.raises(ValueError, match="truncated: the header needs 8 bytes"):
        mnist.load(str(tmp_path))
    labels.write_bytes(good + b"\x00")
    with pytest.raises(ValueError, match="longer than its header says"):
        mnist.load(str(tmp_path))
    labels.write_bytes(_idx(np.zeros(6, dtype=np.uint8)))  # 7 images, 6 labels
    with pytest.raises(ValueError, match="holds 7 images but .*train-labels-idx1-ubyte 6 labels"):
        mnist.load(str(tmp_path))
    labels.write_bytes(_idx(np.full(7, 12, dtype=np.uint8)))
    with pytest.raises(ValueError, match="label 12 is not a digit"):
        mnist.load(str(tmp_path))
    labels.unlink()
    with pytest.raises(FileNotFoundError, match=r"train-labels-idx1-ubyte\[\.gz\]: no such file"):
        mnist.load(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="data_dir: .*no such directory"):
        mnist.load(str(tmp_path / "nowhere"))
    (tmp_path / "bad.gz").write_bytes(b"not gzip at all")
    with pytest.raises(ValueError, match="bad.gz: cannot be read"):
        mnist.read_idx(str(tmp_path / "bad.gz"))


def test_shipped_digits_are_real_and_split():
    ds = mnist.load(None)
    assert ds.train_x.shape == (1497, 1, 28, 28) and ds.test_x.shape == (300, 1, 28, 28)
    assert ds.train_x.min() >= 0 and ds.train_x.max() <= 1
    assert set(ds.train_y.tolist()) == set(range(10)) and set(ds.test_y.tolist()) == set(range(10))
    # real handwriting, not noise: a nearest-class-mean classifier on the pixels gets most
    # of the held-out digits right (random labels would give ~10%)
    means = torch.stack([ds.train_x[ds.train_y == c].mean(0).flatten() for c in range(10)])
    pred = torch.cdist(ds.test_x.flatten(1), means).argmin(1)
    assert (pred == ds.test_y).float().mean() > 0.8
