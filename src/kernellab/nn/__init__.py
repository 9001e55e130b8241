"""Drop-in ``nn.Module``s on kernellab ops, with PyTorch's constructor signatures.

``kernellab.nn.LayerNorm(64)`` is a ``torch.nn.LayerNorm`` (a subclass: the same
parameters, state_dict keys, ``isinstance`` and ``extra_repr``) whose forward runs
kernellab's op; each constructor takes PyTorch's arguments plus a keyword-only
``backend=None`` (kernellab's choice). Options no kernellab op implements run PyTorch's
function (see ``kernellab.nn.functional``), so a result never differs from the module
it replaces beyond rounding.
"""

from __future__ import annotations

import torch
from torch import nn

from kernellab.nn import functional
from kernellab.nn._gated import gated_mlp

__all__ = ["CrossEntropyLoss", "GELU", "GeGLUMLP", "LayerNorm", "LinearCrossEntropyLoss", "RMSNorm", "SwiGLUMLP",
           "functional"]


class LayerNorm(nn.LayerNorm):
    """``torch.nn.LayerNorm`` on kernellab.layer_norm."""

    def __init__(self, *args, backend: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.backend = backend

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return functional.layer_norm(
            input, self.normalized_shape, self.weight, self.bias, self.eps, backend=self.backend
        )


if hasattr(nn, "RMSNorm"):
    _RMSNormBase = nn.RMSNorm
else:  # torch < 2.4: the same constructor and attributes, written out

    class _RMSNormBase(nn.Module):
        def __init__(self, normalized_shape, eps=None, elementwise_affine=True, device=None, dtype=None):
            super().__init__()
            shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
            self.normalized_shape, self.eps, self.elementwise_affine = shape, eps, elementwise_affine
            w = nn.Parameter(torch.ones(shape, device=device, dtype=dtype)) if elementwise_affine else None
            self.register_parameter("weight", w)


class RMSNorm(_RMSNormBase):
    """``torch.nn.RMSNorm`` on kernellab.rms_norm (``eps=None``: PyTorch's default,
    ``kernellab.nn.functional.rms_norm``)."""

    def __init__(self, *args, backend: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.backend = backend

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return functional.rms_norm(input, self.normalized_shape, self.weight, self.eps, backend=self.backend)


class GELU(nn.GELU):
    """``torch.nn.GELU``: ``approximate="tanh"`` on kernellab.gelu; ``"none"`` (erf) is
    PyTorch's, since kernellab.gelu computes the tanh form only."""

    def __init__(self, approximate: str = "none", *, backend: str | None = None):
        super().__init__(approximate)
        self.backend = backend

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return functional.gelu(input, self.approximate, backend=self.backend)


class CrossEntropyLoss(nn.CrossEntropyLoss):
    """``torch.nn.CrossEntropyLoss`` on kernellab.cross_entropy (class-index targets;
    ``weight`` and ``label_smoothing`` run PyTorch's function)."""

    def __init__(self, *args, backend: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.backend = backend

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return functional.cross_entropy(
            input,
            target,
            self.weight,
            ignore_index=self.ignore_index,
            reduction=self.reduction,
            label_smoothing=self.label_smoothing,
            backend=self.backend,
        )


class LinearCrossEntropyLoss(nn.Module):
    """The LM head and the loss in one: ``loss(x, weight, target, bias=None)`` is
    ``F.cross_entropy(x @ weight.T + bias, target, ...)`` computed by
    kernellab.linear_cross_entropy, which never stores the (N, V) logits. ``weight`` is
    the head's (V, H) ``nn.Linear`` weight, passed per call so the head keeps it."""

    def __init__(self, ignore_index: int = -100, reduction: str = "mean", label_smoothing: float = 0.0,
                 z_loss: float = 0.0, *, backend: str | None = None):  # fmt: skip
        super().__init__()
        self.ignore_index, self.reduction = ignore_index, reduction
        self.label_smoothing, self.z_loss, self.backend = label_smoothing, z_loss, backend

    def forward(self, x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
        from kernellab.ops.linear_cross_entropy import linear_cross_entropy

        return linear_cross_entropy(
            x, weight, target, bias, ignore_index=self.ignore_index, reduction=self.reduction,
            label_smoothing=self.label_smoothing, z_loss=self.z_loss, backend=self.backend,
        )  # fmt: skip

    def extra_repr(self) -> str:
        return (f"ignore_index={self.ignore_index}, reduction={self.reduction!r}, "
                f"label_smoothing={self.label_smoothing}, z_loss={self.z_loss}")


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


class _GatedMLP(nn.Module):
    """``down_proj(act(gate_proj(x)) * up_proj(x))`` with Hugging Face's attribute names
    (``gate_proj``, ``up_proj``, ``down_proj``: a Llama / Qwen2 / Mistral / Gemma MLP's
    state_dict loads as is). The gate and up projections are intermediates of this forward
    only, so the op's backward writes their gradients into their buffers
    (``inplace_backward=True``: two fewer [tokens, intermediate] tensors at the step's peak),
    and the activation ``act(gate) * up`` is not kept for the down projection's backward but
    made again there from the two (one more [tokens, intermediate] tensor fewer; eager
    only, ``kernellab.nn._gated``)."""

    _op = ""

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False, device=None, dtype=None,
                 *, backend: str | None = None):  # fmt: skip
        super().__init__()
        h = _positive_int("hidden_size", hidden_size)
        i = _positive_int("intermediate_size", intermediate_size)
        if not isinstance(bias, bool):
            raise TypeError(f"bias must be a bool, got {bias!r}")
        kw = {"bias": bias, "device": device, "dtype": dtype}
        self.gate_proj, self.up_proj, self.down_proj = nn.Linear(h, i, **kw), nn.Linear(h, i, **kw), nn.Linear(i, h, **kw)
        self.backend = backend

    def _opts(self) -> dict:
        return {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gated_mlp(x, self.gate_proj, self.up_proj, self.down_proj, self._op, self._opts(), self.backend)

    def extra_repr(self) -> str:
        return f"hidden_size={self.gate_proj.in_features}, intermediate_size={self.gate_proj.out_features}"


class SwiGLUMLP(_GatedMLP):
    """The SwiGLU MLP (Llama, Qwen2, Mistral) on kernellab.swiglu."""

    _op = "swiglu"


class GeGLUMLP(_GatedMLP):
    """The GeGLU MLP (Gemma: ``approximate="tanh"``) on kernellab.geglu."""

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False, device=None, dtype=None,
                 *, approximate: str = "tanh", backend: str | None = None):  # fmt: skip
        if approximate not in ("none", "tanh"):
            raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
        super().__init__(hidden_size, intermediate_size, bias, device, dtype, backend=backend)
        self.approximate = approximate

    _op = "geglu"

    def _opts(self) -> dict:
        return {} if self.approximate == "none" else {"approximate": self.approximate}

    def extra_repr(self) -> str:
        return super().extra_repr() + f", approximate={self.approximate!r}"
