"""bf16 subnormal inputs (issue 16, item 6): the Triton backends against PyTorch's ops.

Triton's CPU interpreter converts bf16 <-> fp32 wrongly: fp32 -> bf16 truncates instead of
rounding to nearest even, and subnormals change in a round trip (a plain kernel with no
kernellab code shows it). kernellab installs the exact conversion when it runs Triton
under the interpreter (``triton_support._patch_interpreter_bf16``); these cases then run
on the CPU as on a GPU. Should the patch not apply (a Triton whose interpreter looks
different), ``_interpreter_mangles`` sees it and the cases are skipped with that reason.
"""

from __future__ import annotations

import functools

import pytest
import torch

import kernellab
from kernellab import device as _device

TINY = torch.finfo(torch.bfloat16).tiny
ULP_SUB = 2.0**-133  # bf16's spacing below TINY


@functools.cache
def _interpreter_mangles() -> bool:
    """Whether this Triton interpreter changes bf16 subnormals in a bf16 -> fp32 -> bf16
    round trip (a kernel with no kernellab code in it)."""
    if not _device.triton_interpreted():
        return False
    import triton.language as tl

    from kernellab import triton_support

    @triton_support.jit
    def roundtrip(x, y, n, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        m = i < n
        tl.store(y + i, tl.load(x + i, mask=m).to(tl.float32).to(tl.bfloat16), mask=m)

    x = torch.tensor([3.0, -5.0, 7.0, 1.0], dtype=torch.float32).mul(TINY / 16).to(torch.bfloat16)
    y = torch.empty_like(x)
    roundtrip[(1,)](x, y, 4, BLOCK=4)
    return not torch.equal(x, y)


def _inputs(device):
    gen = torch.Generator().manual_seed(7)
    x = (torch.randn(6, 37, generator=gen) * TINY * 0.3).to(torch.bfloat16)
    x[:, 0] = TINY  # the smallest normal beside them
    assert ((x != 0) & (x.abs() < TINY)).sum() > 100  # mostly subnormal
    return x.to(device)


def _close(out, ref):
    out, ref = out.double(), ref.double()
    bound = torch.clamp(ref.abs() * 2.0**-7, min=ULP_SUB)  # one bf16 unit, subnormal or not
    bad = (out - ref).abs() > bound
    assert not bad.any(), f"{bad.sum().item()} values off, e.g. {out[bad][:3].tolist()} vs {ref[bad][:3].tolist()}"


CASES = {
    "add": (lambda x: kernellab.add(x, x.flip(-1), backend="triton"), lambda x: x + x.flip(-1)),
    "gelu": (lambda x: kernellab.gelu(x, backend="triton"), lambda x: torch.nn.functional.gelu(x.float(), approximate="tanh")),
    "sum": (lambda x: kernellab.sum(x, -1, backend="triton"), lambda x: x.double().sum(-1)),
    "max": (lambda x: kernellab.max(x, -1, backend="triton").values, lambda x: x.max(-1).values),
}


@pytest.mark.parametrize("op", sorted(CASES) + ["argmax"])
def test_triton_bf16_subnormals(op):
    if _interpreter_mangles():
        pytest.skip(
            "Triton's CPU interpreter converts bf16 subnormals wrongly (a plain load/convert/store "
            "kernel changes them): not kernellab's kernels; runs on a GPU"
        )
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    x = _inputs(dev)
    if op == "argmax":
        i = kernellab.argmax(x, -1, backend="triton")
        assert torch.equal(x.gather(-1, i[:, None])[:, 0], x.max(-1).values)  # a maximum, ties aside
        return
    fn, ref = CASES[op]
    _close(fn(x), ref(x))


def test_interpreter_converts_bf16_exactly():
    """Under the interpreter, after kernellab's patch: fp32 -> bf16 rounds to nearest even
    (1 - 1e-7 -> 1.0, where the unpatched interpreter stores 0.99609375) and subnormals
    survive a round trip, as on a GPU."""
    from kernellab import triton_support

    if not _device.triton_interpreted():
        pytest.skip("Triton compiles here: no interpreter to patch")
    assert triton_support._patch_interpreter_bf16()
    assert not _interpreter_mangles()
    import triton.language as tl

    @triton_support.jit
    def down(x, y, n, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        m = i < n
        tl.store(y + i, tl.load(x + i, mask=m).to(tl.bfloat16), mask=m)

    x = torch.tensor([1.0 - 1e-7, -(1.0 - 1e-7), 1.00390625, 1.01171875, 3.0, float("inf"), float("nan"), TINY * 0.3])
    y = torch.empty(8, dtype=torch.bfloat16)
    down[(1,)](x, y, 8, BLOCK=8)
    torch.testing.assert_close(y, x.to(torch.bfloat16), rtol=0, atol=0, equal_nan=True)
