"""kernellab.nn modules and kernellab.nn.functional as drop-ins for PyTorch's: the same
answer for PyTorch's defaults in every dtype, and PyTorch's kind of error (TypeError /
ValueError naming the argument) for bad arguments."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import kernellab.nn as knn
import kernellab.nn.functional as KF


@pytest.mark.skipif(not hasattr(F, "rms_norm"), reason="torch < 2.4 has no rms_norm")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_rms_norm_default_eps_is_pytorchs_in_16_bit(dtype):
    # PyTorch's eps=None is the epsilon of the dtype it computes in (fp32 for fp16/bf16):
    # finfo(fp16).eps (~1e-3) would dominate the mean square of small activations
    torch.manual_seed(0)
    x = (0.01 * torch.randn(4, 16)).to(dtype)
    w = torch.rand(16).to(dtype)
    want = F.rms_norm(x, (16,), w)
    torch.testing.assert_close(KF.rms_norm(x, (16,), w), want)
    mod, ref = knn.RMSNorm(16, dtype=dtype), nn.RMSNorm(16, dtype=dtype)
    torch.testing.assert_close(mod(x), ref(x))


def test_norms_refuse_a_non_tensor_input_or_shape_naming_it():
    for fn in (KF.layer_norm, KF.rms_norm):
        with pytest.raises(TypeError, match="input must be a torch.Tensor"):
            fn([1.0, 2.0], (2,))
        with pytest.raises(TypeError, match="normalized_shape must be an int or a sequence"):
            fn(torch.randn(3, 5), 5.0)
    torch.testing.assert_close(KF.layer_norm(torch.ones(2, 5), torch.Size([5])), torch.zeros(2, 5))


def test_linear_cross_entropy_loss_repr_shows_every_option():
    r = repr(knn.LinearCrossEntropyLoss(ignore_index=0, reduction="sum", label_smoothing=0.1, z_loss=1e-4))
    assert r == "LinearCrossEntropyLoss(ignore_index=0, reduction='sum', label_smoothing=0.1, z_loss=0.0001)"
