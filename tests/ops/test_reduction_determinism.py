"""Determinism of the reductions: sum's default backends (cuda = v4, triton, torch) add in
a fixed order, so repeated calls give the same bits; cuda_v3 (blocks meet in a float64
atomicAdd) is the one that does not, and it says so under
``torch.use_deterministic_algorithms(True)`` as PyTorch's own nondeterministic kernels do.
The histogram's integer atomics are exact and commute (tests/ops/test_histogram.py)."""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch

import kernellab
from kernellab.ops._reductions import alert_not_deterministic
from kltest import cpu_backends, cuda_backends


@contextlib.contextmanager
def deterministic(on: bool = True, warn_only: bool = False):
    prev = torch.are_deterministic_algorithms_enabled()
    prev_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(on, warn_only=warn_only)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(prev, warn_only=prev_warn)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().reshape(-1).view(torch.int32 if t.dtype == torch.float32 else torch.int16).cpu()


@pytest.mark.parametrize("backend", [b for b in cpu_backends("sum") if b != "compile"])
def test_sum_bitwise_repeatable_here(backend):
    # On the CPU the interpreter runs Triton programs one after another: this proves the
    # launcher has no order that depends on anything but the input (partials, then one
    # final program), not that GPU programs race; the GPU test below does that.
    fn = kernellab.get("sum", backend)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3 * 32768 + 11, generator=gen) * 100 + 3
    rows = x[: 7 * 4001].view(7, 4001)
    a, r = _bits(fn(x)), _bits(fn(rows, dim=-1))
    for _ in range(3):
        assert torch.equal(_bits(fn(x)), a) and torch.equal(_bits(fn(rows, dim=-1)), r)


def test_alert_follows_torch_deterministic_setting():
    alert_not_deterministic("thing")  # off: silent
    with deterministic(True), pytest.raises(RuntimeError, match="thing is not deterministic"):
        alert_not_deterministic("thing")
    with deterministic(True, warn_only=True), warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        alert_not_deterministic("thing")
    assert any("thing is not deterministic" in str(m.message) for m in w)


def test_sum_cuda_v3_refuses_under_deterministic_algorithms():
    # The alert comes before any launch, so the launcher shows it without a GPU; the
    # deterministic rungs (v1, v2, v4) never alert.
    from kernellab.ops.sum import cuda as scuda

    with deterministic(True), pytest.raises(RuntimeError, match="cuda_v3"):
        scuda.sum_all(torch.ones(5), "v3")
    with deterministic(True):
        assert scuda.sum_all(torch.ones(0), "v4").item() == 0  # (empty: no launch)


# --------------------------------------------------------------------------- GPU

SUM_GPU = [b for b in cuda_backends("sum") if b not in ("manual", "cuda_v3")]


@pytest.mark.gpu
@pytest.mark.parametrize("backend", SUM_GPU)
def test_gpu_sum_bitwise_repeatable(backend):
    fn = kernellab.get("sum", backend)
    gen = torch.Generator("cuda").manual_seed(1)
    for dtype in (torch.float32, torch.bfloat16):
        x = (torch.randn((1 << 24) + 3, device="cuda", generator=gen) * 100 + 3).to(dtype)
        rows = x[: 4096 * 4001].view(4096, 4001)
        a, r = _bits(fn(x)), _bits(fn(rows, dim=-1))
        for _ in range(10):
            assert torch.equal(_bits(fn(x)), a) and torch.equal(_bits(fn(rows, dim=-1)), r), dtype


@pytest.mark.gpu
def test_gpu_sum_deterministic_mode():
    x = torch.randn(1 << 20, device="cuda")
    with deterministic(True):
        with pytest.raises(RuntimeError, match="cuda_v3"):
            kernellab.sum(x, backend="cuda_v3")
        kernellab.sum(x)  # the default (cuda = v4) is deterministic: no alert
        kernellab.sum(x, -1, backend="cuda_v3")  # v3's rows are a fixed-order tree
        kernellab.histogram(x.to(torch.int32).abs_(), 16)  # integer atomics: exact
