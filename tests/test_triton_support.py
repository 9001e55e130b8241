"""triton_support.Bound: a launch site's kernel launched through its cached compiled
launcher after the first call, and through ``kernel[grid]`` whenever a checked tensor is
misaligned, the current device differs, or the call is traced. On a CPU there is no lean
path (the interpreter), so the logic is exercised with a stand-in kernel class."""

from __future__ import annotations

import pytest
import torch

from kernellab import triton_support


class _FakeLean:
    """Stands in for triton_support's LeanJIT: ``[grid]`` is the slow path (recorded);
    ``lean_hit`` returns the compiled launcher once a call was made."""

    current = None  # the "current device" index (CPU tensors: None)

    def __init__(self):
        self.slow, self.fast = [], []

    def __getitem__(self, grid):
        def launch(*args, **kw):
            self.slow.append((grid, args, kw))

        return launch

    def lean_hit(self, args, kw):
        def run(g0, g1, g2, stream, function, packed, h1, h2, h3, *rest):
            self.fast.append(((g0, g1, g2), stream, function, packed, rest))

        return (run, "fn", "packed", ("EXTRA",)) if self.slow else None

    @staticmethod
    def raw_stream(dev):
        return "stream"

    @staticmethod
    def current_device():
        return _FakeLean.current


@pytest.fixture
def fake_lean(monkeypatch):
    monkeypatch.setattr(triton_support, "_LEAN_JIT", _FakeLean)
    _FakeLean.current = None
    return _FakeLean()


def test_bound_goes_direct_after_its_first_call(fake_lean):
    x, y = torch.zeros(64), torch.zeros(64)
    b = triton_support.Bound(fake_lean, (3, 2), {"BLOCK": 64, "num_warps": 4}, (0,))
    b(x, y, 7)  # first call: Triton's path, then the launcher is kept
    assert len(fake_lean.slow) == 1 and fake_lean.slow[0][0] == (3, 2) and fake_lean.slow[0][2]["BLOCK"] == 64
    b(x, y, 7)
    b(x, y, 9)
    assert len(fake_lean.slow) == 1 and len(fake_lean.fast) == 2
    grid, stream, fn, packed, rest = fake_lean.fast[-1]
    assert grid == (3, 2, 1) and stream == "stream" and (fn, packed) == ("fn", "packed")
    assert rest[:2] == (x, y) and rest[2:] == (9, "EXTRA")  # the call's args, then the constexprs


def test_bound_takes_the_slow_path_for_a_misaligned_checked_tensor(fake_lean):
    x = torch.zeros(65)
    b = triton_support.Bound(fake_lean, (1,), {}, (0,))
    b(x[:64])
    b(x[1:])  # 4 bytes off: not 16-byte aligned
    assert len(fake_lean.slow) == 2 and not fake_lean.fast
    b(x[:64])
    assert len(fake_lean.fast) == 1
    # an unchecked position may hold anything (the launcher's own fresh allocations)
    b2 = triton_support.Bound(fake_lean, (1,), {}, (0,))
    b2(x[:64], x[1:])
    b2(x[:64], x[1:])
    assert len(fake_lean.fast) == 2


def test_bound_takes_the_slow_path_on_another_device_or_when_traced(fake_lean):
    x = torch.zeros(64)
    b = triton_support.Bound(fake_lean, (1,), {}, (0,))
    b(x)
    _FakeLean.current = 1  # another current device than the one the launcher was found on
    b(x)
    assert len(fake_lean.slow) == 2 and not fake_lean.fast

    class Wrapped(torch.Tensor):  # what a traced call passes is not a plain Tensor
        pass

    _FakeLean.current = None
    b(x.as_subclass(Wrapped))
    assert len(fake_lean.slow) == 3 and not fake_lean.fast


def test_bound_without_a_lean_kernel_always_launches_through_triton(monkeypatch):
    calls = []

    class Plain:
        def __getitem__(self, grid):
            return lambda *a, **kw: calls.append(grid)

    b = triton_support.Bound(Plain(), (2,), {}, (0,))
    for _ in range(3):
        b(torch.zeros(4))
    assert calls == [(2,)] * 3 and b.hit is None
