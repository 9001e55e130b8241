"""manual, torch and compile backends of the weight-only matmuls, and the torchao peer.

manual:  dequantize the whole weight to fp32, fp32 matmul, cast: the textbook two steps
         (a [N, K] fp32 weight written and read back: 9 bytes of traffic per int8 weight).
torch:   F.linear(x, w_q.to(x.dtype)) * scales: the int -> 16-bit conversion is exact
         (|q| <= 127), so this is cuBLAS's 16-bit product of exact operands, then one
         multiply per output (what torchao runs in eager mode). Traffic: the int8 weight
         read, a 16-bit copy written and read (5 bytes per weight against bf16's 2).
compile: torch.compile of ``torch``'s formula: Inductor may fuse the conversion into its
         own matmul (a skinny reduction for decode's M) and the scale into the epilogue.
torchao: torchao's int8 weight-only tensor (AffineQuantizedTensor, plain layout) built
         around the same w_q and scales, through F.linear; GPU only, when torchao imports.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from kernellab.core.registry import register
from kernellab.core.spec import REFERENCE_DTYPES, wide_dtype
from kernellab.ops._baselines import _compile_unavailable, compiled
from kernellab.ops.weight_only_matmul.quantize import dequantize_weight, int_values

_OPS = {8: "int8_weight_only_matmul", 4: "int4_weight_only_matmul"}


def _manual_for(bits):
    def manual(x, w_q, scales, bias=None):
        """Dequantize the weight to fp32 (fp64 for fp32/fp64 x), matmul (+ bias), cast to x's dtype."""
        acc = wide_dtype(x.dtype)
        w = dequantize_weight(w_q, scales, bits, acc)
        y = x.to(acc) @ w.T
        if bias is not None:
            y = y + bias.to(acc)
        return y.to(x.dtype)

    manual.__name__ = f"manual_{_OPS[bits]}"
    return manual


def _torch_for(bits):
    def torch_wo(x, w_q, scales, bias=None):
        """F.linear(x, w_q.to(x.dtype)) (cuBLAS, exact operands) * scales (+ bias)."""
        acc = torch.float64 if x.dtype == torch.float64 else torch.float32
        y = F.linear(x, int_values(w_q, bits).to(x.dtype)).to(acc) * scales.to(acc)
        if bias is not None:
            y = y + bias.to(acc)
        return y.to(x.dtype)

    torch_wo.__name__ = f"torch_{_OPS[bits]}"
    return torch_wo


for _bits, _op in _OPS.items():
    _manual, _torch = _manual_for(_bits), _torch_for(_bits)
    # float64 too (REFERENCE_DTYPES): torch.autograd.gradcheck runs through them
    describe = _manual.__doc__.split("\n")[0]
    register(_op, "manual", builtin=True, description=describe, dtypes=REFERENCE_DTYPES)(_manual)
    describe = _torch.__doc__.split("\n")[0]
    register(_op, "torch", builtin=True, description=describe, dtypes=REFERENCE_DTYPES)(_torch)
    register(
        _op,
        "compile",
        builtin=True,
        available=_compile_unavailable,
        description="torch.compile of torch's formula (Inductor fuses the conversion and the scale)",
        dtypes=REFERENCE_DTYPES,
        builds_per_shape=True,
    )(compiled(_torch_for(_bits), op=_op))


# --------------------------------------------------------------------------- torchao peer


@functools.cache
def torchao_unavailable() -> str | None:
    """None when torchao's int8 weight-only tensor imports, else why not."""
    try:
        from torchao.dtypes import AffineQuantizedTensor  # noqa: F401
        from torchao.dtypes.uintx.plain_layout import PlainAQTTensorImpl  # noqa: F401
        from torchao.dtypes.utils import PlainLayout  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any import failure means "cannot run here"
        if isinstance(e, ModuleNotFoundError) and e.name and e.name.startswith("torchao"):
            return "torchao not installed (pip install torchao)"
        return f"torchao does not import: {type(e).__name__}: {str(e).splitlines()[0][:120]}"
    return None


def torchao_int8_weight(w_q: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype):
    """torchao's int8 weight-only weight (what ``quantize_(model, Int8WeightOnlyConfig())``
    puts into a Linear) holding exactly ``w_q`` and ``scales``, for activations of ``dtype``."""
    from torchao.dtypes import AffineQuantizedTensor
    from torchao.dtypes.uintx.plain_layout import PlainAQTTensorImpl
    from torchao.dtypes.utils import PlainLayout

    n, k = w_q.shape
    zero = torch.zeros(n, dtype=torch.int64, device=w_q.device)
    impl = PlainAQTTensorImpl.from_plain(w_q.contiguous(), scales.to(dtype), zero, PlainLayout())
    return AffineQuantizedTensor(impl, (1, k), w_q.shape, quant_min=-128, quant_max=127, dtype=dtype)


def torchao_int8(x, w_q, scales, bias=None):
    """torchao int8 weight-only (AffineQuantizedTensor) through F.linear."""
    return F.linear(x, torchao_int8_weight(w_q, scales, x.dtype), bias)


register(
    "int8_weight_only_matmul",
    "torchao",
    devices=("cuda",),
    available=torchao_unavailable,
    builtin=True,
    description="torchao int8 weight-only (AffineQuantizedTensor through F.linear; scales in x's dtype)",
)(torchao_int8)
