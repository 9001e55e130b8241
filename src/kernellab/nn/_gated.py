"""The forward of a gated MLP, ``down(act(gate(x)) * up(x))``, that does not keep the
activation ``c = act(gate(x)) * up(x)`` for the backward.

In a plain composition ``down`` (an ``nn.Linear``) saves its input ``c``, a
[tokens, intermediate] tensor per layer, alive from the forward to that layer's backward
(the step's peak). The gated op already saves ``a = gate(x)`` and ``b = up(x)``, from which
``c`` is one elementwise kernel. So ``down`` runs under saved-tensor hooks: the tensor it
saves that is ``c`` (same bytes, dtype and shape) is stored as a recipe holding ``a`` and
``b`` (no new memory: the gated op's node holds them too), and the backward remakes ``c``
with the same backend (an elementwise kernel run again on the same inputs: the same bits).
Anything else ``down`` saves (its weight, a LoRA branch's tensors) is kept as is.

Order: ``down``'s backward comes before the gated op's (it makes the op's output gradient),
so ``c`` is remade before an ``inplace_backward`` writes the gradients into ``a`` and ``b``;
were ``a`` or ``b`` changed in place in between, the remade ``c`` would be wrong, so their
versions are checked and a RuntimeError says which.

Eager only: under torch.compile, Inductor's partitioner already chooses what to recompute,
and the plain composition is traced. Without gradients (inference, or a and b not
requiring them) nothing is saved and the composition runs.
"""

from __future__ import annotations

import torch

from kernellab.core import registry
from kernellab.ops import public as ops


def _backend_for(op: str, a: torch.Tensor, b: torch.Tensor, opts: dict) -> str:
    """The backend kernellab's default picks for a gradient-taking call ``op(a, b, **opts)``
    (tuning's cached choice), named so that the forward and the remake in the backward run
    the same kernel."""
    return registry.choose(op, (a, b), a.device.type, "fwdbwd", opts)[0]


class _Remade:
    """What the hook stores for ``c``: how to make it again, and the view ``down`` saved."""

    __slots__ = ("op", "backend", "a", "b", "opts", "versions", "size", "stride", "offset")

    def __init__(self, op, backend, a, b, opts, t, c_offset):
        self.op, self.backend, self.a, self.b, self.opts = op, backend, a, b, opts
        self.versions = (a._version, b._version)
        self.size, self.stride, self.offset = t.shape, t.stride(), t.storage_offset() - c_offset

    def make(self) -> torch.Tensor:
        if (self.a._version, self.b._version) != self.versions:
            raise RuntimeError(
                f"kernellab gated MLP ({self.op}): the gate or up projection was modified in place "
                "after the forward (by the caller, or by a first backward that wrote the gradients "
                "into them: a second backward through the same graph needs inplace_backward=False), "
                "so the activation the backward remakes from them would be wrong"
            )
        with torch.no_grad():
            c = registry.call(self.op, self.backend, self.a, self.b, **self.opts)
        return c.as_strided(self.size, self.stride, c.storage_offset() + self.offset)


def gated_mlp(x: torch.Tensor, gate, up, down, op: str, opts: dict, backend: str | None = None,
              inplace_backward: bool = True) -> torch.Tensor:  # fmt: skip
    """``down(op(gate(x), up(x), **opts))`` with ``op`` "swiglu" or "geglu" (kernellab's),
    keeping ``a = gate(x)`` and ``b = up(x)`` but not their product for the backward (the
    module docstring). ``inplace_backward``: the op's flag (a and b are this forward's own
    intermediates, so by default their buffers take the gradients)."""
    return gated_down(gate(x), up(x), down, op, opts, backend, inplace_backward)


def gated_down(a: torch.Tensor, b: torch.Tensor, down, op: str, opts: dict, backend: str | None = None,
               inplace_backward: bool = True) -> torch.Tensor:  # fmt: skip
    """``down(op(a, b, **opts))``, keeping a and b but not their product for the backward:
    ``gated_mlp`` after its projections (a and b may be the two halves of one fused
    gate-up projection's output, as Phi-3's MLP makes them)."""
    kw = dict(opts, inplace_backward=True) if inplace_backward else dict(opts)

    def composed():  # c kept by down, as in a plain module
        return down(ops.FUNCTIONS[op](a, b, **kw, backend=backend))

    if torch.compiler.is_compiling() or not torch.is_grad_enabled() or not (a.requires_grad or b.requires_grad):
        return composed()
    name = backend if backend is not None else _backend_for(op, a, b, opts)
    try:
        c = registry.call(op, name, a, b, **kw)
    except ValueError:  # this backend refuses these tensors: the default's own fallback
        return composed()
    storage, dtype, c_offset = c.untyped_storage().data_ptr(), c.dtype, c.storage_offset()

    def pack(t):  # (holds no reference to c: that is the point)
        if t.dtype is dtype and t.untyped_storage().data_ptr() == storage:
            return _Remade(op, name, a, b, opts, t, c_offset)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, _unpack):
        return down(c)


def _unpack(p):
    return p.make() if p.__class__ is _Remade else p
