"""Every Triton backend's custom ops as a GPU registers them (``torch.library.triton_op``,
each launch traced through ``wrap_triton``), opcheck'd here by the interpreter.

On a machine without a GPU the kit registers Triton backends as plain ``custom_op`` with
fake kernels, so the traced launch path (what torch.compile and opcheck run on a GPU) is
not what the other CPU tests exercise. There, a launch that passed one tensor's strides
with another's data gave garbage matmul gradients under torch.compile. Here each backend's
declarations are built again with ``triton_op`` (Triton's driver stood in for by an sm_90
target: torch reads the kernel's TTIR to see which tensors it writes) and go through the
check engine's opcheck stage: fake tensors, schema, autograd registration, and
aot_dispatch (static and dynamic) against the eager result.
"""

from __future__ import annotations

import collections
import dataclasses

import pytest
import torch

from kernellab.core import kit, registry
from kernellab.core.spec import dtype_name
from kernellab.harness import check
from kltest import register_as_on_a_gpu

pytest.importorskip("triton")


def _triton_decls(impl) -> list:
    names = [str(getattr(op, "_qualname", "")).split("::")[-1] for op, _, _ in impl.custom_ops]
    return [kit.DECLS.get(n) for n in names]


CASES = [
    impl
    for impl in registry.impls()
    if any(d is not None and d.triton for d in _triton_decls(impl)) and "cpu" in impl.devices
]


def _dtype(impl) -> torch.dtype:
    """One dtype per backend (the plans differ more between 16-bit and fp32 than between
    fp16 and bf16; the H100 failure was fp16): fp16 where taken, else the first."""
    mine = list(impl.dtypes or registry.get(impl.op, "torch").dtypes)
    return torch.float16 if torch.float16 in mine else mine[0]


@pytest.fixture
def as_on_a_gpu(monkeypatch):
    register_as_on_a_gpu(monkeypatch)
    traced = collections.Counter()
    wrap = torch.library.wrap_triton

    def counting(kernel):
        traced[getattr(getattr(kernel, "fn", kernel), "__name__", "?")] += 1
        return wrap(kernel)

    monkeypatch.setattr(torch.library, "wrap_triton", counting)
    return traced


def test_every_triton_backend_is_covered():
    got = {f"{i.op}/{i.backend}" for i in CASES}
    assert {"matmul/triton", "attention/triton", "rms_norm/triton", "conv2d/triton", "rope/triton"} <= got
    assert len(got) >= 25, sorted(got)


_built: dict[str, kit.OpDecl] = {}


def _rebuilt(name: str, decl: kit.OpDecl):
    """``decl`` built again under another name (the original's custom ops stay registered)."""
    if name not in _built:
        _built[name] = kit.build(dataclasses.replace(decl, name=f"{name}_traced_probe"))
    return _built[name]


@pytest.mark.parametrize("impl", CASES, ids=lambda i: f"{i.op}-{i.backend}")
def test_opcheck_of_the_gpu_registration(as_on_a_gpu, impl):
    ops, taken = [], collections.Counter()
    for (op, sample, fwd), decl in zip(impl.custom_ops, _triton_decls(impl)):
        if decl is None or not decl.triton:
            ops.append((op, sample, fwd))
            continue
        built = _rebuilt(decl.name, decl)
        ops.append((built.custom_ops[taken[decl.name]][0], sample, fwd))
        taken[decl.name] += 1
    dtype = _dtype(impl)
    rep = check.check_impl(dataclasses.replace(impl, custom_ops=ops), dtype, device="cpu", stages=("opchecks",))
    bad = [f"{c.name}: {c.detail}" for c in rep.cases if c.status == check.FAIL]
    assert rep.status == check.PASS and rep.cases, (dtype_name(dtype), rep.status, rep.reason, bad)
    assert sum(as_on_a_gpu.values()) > 0, "no launch went through wrap_triton: the traced path did not run"
