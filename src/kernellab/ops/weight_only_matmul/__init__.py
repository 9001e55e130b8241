"""Weight-only quantized matmul (issue 45, lecture 7): int8 and int4 weights, 16-bit
activations.

    y = x @ dequant(w_q).T (+ bias)      x [..., K] fp16/bf16 (fp32), w_q per nn.Linear [N, K],
                                          scales [N] (one per output channel), y [..., N]

    int8_weight_only_matmul: w_q int8 [N, K]
    int4_weight_only_matmul: w_q uint8 [N, K // 2], two signed 4-bit values per byte
                             (``quantize.py`` has the layout; ``quantize_weight`` makes it)

Why: decoding (M = 1-16 rows of x) is bound by reading the weight. bf16 weights cost
2 bytes per parameter, int8 1, int4 0.5: at the same bandwidth the kernel should be ~2x
(int8) and ~4x (int4) faster than the bf16 cuBLAS product, and the dequantization (a
convert and a multiply per weight) is free in a memory-bound kernel. The scale is applied
once per output, after the K sum (it is per row of w_q).

Accuracy: the float64 reference is x.double() @ (w_q.double() * scales.double()[:, None]).T
(+ bias): the kernels are judged against the dequantized weight exactly, with the
tolerance of a 16-bit matmul with the same K (2 x the error of the ``torch`` backend: the
int8 -> bf16 conversion is exact, so it is a plain cuBLAS bf16 product then one rounding
per scale). How far the quantized product is from the original bf16 one is the
quantization's business, reported as SQNR (``quantize.sqnr``).

Gradients: with respect to x (and bias) only: dx = (dy * scales) @ w_q, composed from
PyTorch ops (it materializes the dequantized weight in fp32: training through a quantized
weight is not what these kernels are for). The weight and scales take no gradient;
``scales`` that require grad are refused.

Problem shape for the harness: (M, N, K), or (B, M, N, K) for x [B, M, K].
"""

from __future__ import annotations

import math

import torch

from kernellab.core import registry
from kernellab.core.spec import (
    FLOAT_DTYPES,
    BadInput,
    TensorOption,
    declare,
    device_of,
    dtype_name,
    fuzz_dim,
    make_tensor,
    runs_on,
)
from kernellab.ops.weight_only_matmul.quantize import (
    dequantize_weight,
    int_values,
    pack_int4,
    quantize_weight,
    sqnr,
    unpack_int4,
)

X_DTYPES = FLOAT_DTYPES  # fp16 / bf16 is the use; fp32 for completeness
SCALE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
WQ_DTYPE = {8: torch.int8, 4: torch.uint8}
OP_NAME = {8: "int8_weight_only_matmul", 4: "int4_weight_only_matmul"}


def wo_reference(x, w_q, scales, bias=None, bits=8):
    """float64 in (x, scales, bias; w_q stays integer), float64 out."""
    w = int_values(w_q, bits).double() * scales.double()[:, None]
    y = x.double() @ w.T
    return y if bias is None else y + bias.double()


# --------------------------------------------------------------------------- shapes


def _split(shape):
    shape = tuple(shape)
    if len(shape) not in (3, 4):
        raise ValueError(f"weight-only matmul problem shape is (M, N, K) or (B, M, N, K), got {shape}")
    return shape[:-3], shape[-3], shape[-2], shape[-1]


def _flops(shape, mode, **options):
    batch, m, n, k = _split(shape)
    return 2 * math.prod(batch) * m * n * k


def _bytes_for(bits):
    def count(shape, dtype, mode, **options):
        # x read, y written, the weight read once (bits / 8 bytes per parameter) + scales
        batch, m, n, k = _split(shape)
        e = torch.empty((), dtype=dtype).element_size()
        rows = math.prod(batch) * m
        return rows * k * e + rows * n * e + n * k * bits // 8 + 4 * n

    return count


def _inputs_for(bits):
    def make(shape, dtype, device, gen, layout="contiguous", scale=1.0):
        """(x [..., M, K] in ``layout``, w_q, scales): w_q uniform over the whole grid
        ([-127, 127] or [-7, 7]: every value, both signs), scales in [0.5, 1.5] / qmax /
        sqrt(K) so that y ~ N(0, ~0.3) whatever K (fp16 never overflows)."""
        batch, m, n, k = _split(shape)
        x = make_tensor(batch + (m, k), dtype, device, gen, layout, scale)
        if x is None:
            return None
        qmax = 127 if bits == 8 else 7
        q = torch.randint(-qmax, qmax + 1, (n, k), generator=gen, device=device, dtype=torch.int8)
        w_q = q if bits == 8 else pack_int4(q)
        s = (0.5 + torch.rand(n, generator=gen, device=device)) / (qmax * math.sqrt(max(k, 1)))
        return x, w_q, s.float()

    return make


def _bias(args, dtype, device, gen):
    """A bias [N] for the option cases: N(0, 1), so an ignored bias is off by ~1."""
    return make_tensor((args[1].shape[0],), dtype, device, gen)


BIAS = TensorOption(_bias)


# --------------------------------------------------------------------------- validation


def validate_wo(args, kwargs, devices=("cuda", "cpu"), dtypes=X_DTYPES, *, bits=8) -> None:
    """Raise TypeError/ValueError naming the argument (x, w_q, scales, bias)."""
    op = OP_NAME[bits]
    if len(args) == 3 and not kwargs:  # fast accept (every call runs this)
        x, w_q, s = args
        if (
            isinstance(x, torch.Tensor)
            and isinstance(w_q, torch.Tensor)
            and isinstance(s, torch.Tensor)
            and x.dtype in dtypes
            and w_q.dtype is WQ_DTYPE[bits]
            and s.dtype in SCALE_DTYPES
            and x.ndim >= 1
            and w_q.ndim == 2
            and s.ndim == 1
            and runs_on(x, devices)
            and device_of(w_q) == device_of(x)
            and device_of(s) == device_of(x)
            and w_q.shape[1] * (2 if bits == 4 else 1) == x.shape[-1]
            and s.shape[0] == w_q.shape[0]
            and x.layout is torch.strided
            and w_q.layout is torch.strided
            and s.layout is torch.strided
            and not s.requires_grad
        ):
            return
    if len(args) != 3:
        raise TypeError(f"{op}() takes 3 tensor arguments (x, w_q, scales), got {len(args)}")
    x, w_q, s = args
    want = {"x": dtypes, "w_q": (WQ_DTYPE[bits],), "scales": SCALE_DTYPES}
    for name, t in (("x", x), ("w_q", w_q), ("scales", s)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in want[name]:
            allowed = ", ".join(dtype_name(d) for d in want[name])
            hint = " (quantize_weight makes it)" if name == "w_q" else ""
            raise TypeError(f"{op}: {name} has dtype {t.dtype}; expected {allowed}{hint}")
        if t.layout is not torch.strided:
            raise TypeError(f"{op}: {name} has layout {t.layout}; only strided (dense) tensors are supported")
        if t.device.type not in devices:
            raise ValueError(
                f"{op}: {name} is on {t.device}, but this backend runs on {' or '.join(devices)} tensors only"
            )
    for name, t in (("w_q", w_q), ("scales", s)):
        if t.device != x.device:
            raise ValueError(f"{op}: {name} is on {t.device} but x is on {x.device}")
    if x.dim() < 1:
        raise ValueError(f"{op}: x must have at least 1 dimension ([..., K]), got a 0-d tensor")
    if w_q.dim() != 2:
        raise ValueError(
            f"{op}: w_q must be 2-d (N, K{' // 2' if bits == 4 else ''}), got shape {tuple(w_q.shape)}"
        )
    k = x.shape[-1]
    k_w = w_q.shape[1] * (2 if bits == 4 else 1)
    if k_w != k:
        what = f"{w_q.shape[1]} bytes = {k_w} int4 values" if bits == 4 else f"{k_w} columns"
        raise ValueError(
            f"{op}: w_q has {what} per row but x has K = {k} (x [..., K], w_q [N, K"
            f"{' // 2' if bits == 4 else ''}]); shapes {tuple(x.shape)} and {tuple(w_q.shape)}"
        )
    if s.dim() != 1 or s.shape[0] != w_q.shape[0]:
        raise ValueError(
            f"{op}: scales must have shape ({w_q.shape[0]},) (one per output channel, N), "
            f"got {tuple(s.shape)}"
        )
    if s.requires_grad and torch.is_grad_enabled():  # every backend, as the kernels' autograd
        raise RuntimeError(
            f"{op}: scales requires grad, but the weight-only matmuls differentiate x and bias only; "
            "pass scales.detach()"
        )
    if kwargs:
        unknown = sorted(set(kwargs) - {"bias"})
        if unknown:
            raise TypeError(f"{op}() got unexpected keyword arguments {unknown}")
        bias = kwargs.get("bias")
        if bias is not None:
            if not isinstance(bias, torch.Tensor):
                raise TypeError(f"{op}: bias must be a torch.Tensor or None, got {type(bias).__name__}")
            if bias.dtype != x.dtype:
                raise TypeError(f"{op}: bias has dtype {bias.dtype} but x has {x.dtype}")
            if bias.device != x.device:
                raise ValueError(f"{op}: bias is on {bias.device} but x is on {x.device}")
            if tuple(bias.shape) != (w_q.shape[0],):
                raise ValueError(f"{op}: bias must have shape ({w_q.shape[0]},) (N), got {tuple(bias.shape)}")


def _validator_for(bits):
    def validate(args, kwargs, devices=("cuda", "cpu"), dtypes=X_DTYPES):
        validate_wo(args, kwargs, devices, dtypes, bits=bits)

    validate.checks_layouts = True
    return validate


# --------------------------------------------------------------------------- bad inputs


def _other_float(dtype):
    return torch.float16 if dtype == torch.float32 else torch.float32


def _bad_for(bits):
    make = _inputs_for(bits)

    def case(shape=(3, 8, 16), **change):
        def build(device, dtype):
            gen = torch.Generator(device=device).manual_seed(0)
            x, w_q, s = make(shape, dtype, device, gen)
            kw = {}
            if "x" in change:
                x = change["x"](x)
            if "w_q" in change:
                w_q = change["w_q"](w_q)
            if "scales" in change:
                s = change["scales"](s)
            if "bias" in change:
                kw["bias"] = change["bias"](x, w_q)
            return (x, w_q, s), kw

        return build

    other = torch.uint8 if bits == 8 else torch.int8
    return [
        BadInput("w_q of a floating dtype", case(w_q=lambda w: w.float()), "w_q", exc=(TypeError,)),
        BadInput(f"w_q of dtype {other}", case(w_q=lambda w: w.to(other)), "w_q", exc=(TypeError,)),
        BadInput(
            "scales of an integer dtype", case(scales=lambda s: s.to(torch.int32)), "scales", exc=(TypeError,)
        ),
        BadInput(
            "K of x and w_q differ", case(x=lambda x: x[..., :-2].contiguous()), "w_q", exc=(ValueError,)
        ),
        BadInput(
            "scales of length != N", case(scales=lambda s: s[:-1].contiguous()), "scales", exc=(ValueError,)
        ),
        BadInput("2-d scales", case(scales=lambda s: s[:, None].contiguous()), "scales", exc=(ValueError,)),
        BadInput("1-d w_q", case(w_q=lambda w: w.reshape(-1)), "w_q", exc=(ValueError,)),
        BadInput(
            "bias of the wrong length",
            case(bias=lambda x, w: torch.zeros(w.shape[0] + 1, dtype=x.dtype, device=x.device)),
            "bias",
            exc=(ValueError,),
        ),
        BadInput(
            "bias of another dtype",
            case(bias=lambda x, w: torch.zeros(w.shape[0], dtype=_other_float(x.dtype), device=x.device)),
            "bias",
            exc=(TypeError,),
        ),
    ]


def _fuzz_for(bits):
    def draw(rng, big):
        """(M, N, K): half the draws with decode's M of 1-16, the rest up to 120 (the
        tiled path; M N K < 2^31 at the GPU's N, K <= 4096); K even for int4."""
        hi = 4096 if big else 160
        m = fuzz_dim(rng, 1, 16) if rng.random() < 0.5 else fuzz_dim(rng, 1, 120)
        n, k = fuzz_dim(rng, 1, hi), fuzz_dim(rng, 1, hi)
        if bits == 4:
            k += k % 2
        return (m, n, k), None

    return draw


def _declare(bits):
    even = bits == 4  # int4 packs K in pairs: every K here is even
    test_shapes = [
        (1, 1, 2),
        (0, 5, 8),
        (3, 17, 0),
        (1, 33, 66),
        (1, 129, 1000),
        (5, 40, 258),
        (16, 64, 256),
        (17, 33, 66),
        (40, 48, 80),
        (2, 3, 17, 34),
    ]
    if not even:
        test_shapes += [(1, 1, 1), (3, 9, 65), (1, 20, 1023)]
    return declare(
        OP_NAME[bits],
        ("x", "w_q", "scales"),
        lambda *a, **kw: wo_reference(*a, **kw, bits=bits),
        _flops,
        _bytes_for(bits),
        problem_ranks=(3, 4), problem_dims="(M, N, K) or (B, M, N, K)",
        dtypes=X_DTYPES,
        test_shapes=test_shapes,
        # decode's GEMV path (M = 1, 4), the tiled path (M = 33), a split-K weight (N small,
        # K long)
        quick_shapes=[(1, 1, 2), (1, 96, 520), (4, 40, 258), (33, 24, 130), (2, 8, 2048)],
        bench_shapes=[(1, 14336, 4096), (16, 14336, 4096), (1, 4096, 14336), (16, 4096, 14336)],
        cpu_bench_shapes=[(1, 256, 512), (16, 256, 512)],
        layout_shape=(5, 24, 66),
        reach_shape=(3, 24, 66),
        grad_args=(0,),
        modes=("fwd",),
        specials=(float("nan"), float("inf"), float("-inf")),
        # Triton first where no table row is near: its tl.dot path keeps M = 2-64 on the
        # tensor cores, where the CUDA rungs' FMAs become the limit (past M ~ 8)
        default_backends=("triton", "cuda", "torch"),
        compiled_backends=("torch",),
        inputs=_inputs_for(bits),
        validator=_validator_for(bits),
        key_validates=True,
        option_sets=[{"bias": BIAS}],
        bench_options=[{}],
        grad_shapes=[(5, 24, 66), (2, 3, 9, 34)],
        fuzz=_fuzz_for(bits),
        perturbation_floor=True,
        bad_shape=(3, 8, 16),
        extra_bad_inputs=_bad_for(bits),
        doc=f"y = x @ dequant(w_q).T (+ bias), {'int8' if bits == 8 else 'packed int4'} weight, "
        "per-channel scales",
    )


SPEC = _declare(8)
SPEC_INT4 = _declare(4)


def int8_weight_only_matmul(x, w_q, scales, bias=None, *, backend: str | None = None):
    """``x @ (w_q * scales[:, None]).T (+ bias)`` with an int8 weight ``w_q`` (N, K) (from
    ``quantize_weight(w, bits=8)``) and fp32 ``scales`` (N,); y in x's dtype."""
    if bias is None:
        return registry.call("int8_weight_only_matmul", backend, x, w_q, scales)
    return registry.call("int8_weight_only_matmul", backend, x, w_q, scales, bias=bias)


def int4_weight_only_matmul(x, w_q, scales, bias=None, *, backend: str | None = None):
    """As ``int8_weight_only_matmul`` with a packed int4 weight ``w_q`` uint8 (N, K // 2)
    (from ``quantize_weight(w, bits=4)``)."""
    if bias is None:
        return registry.call("int4_weight_only_matmul", backend, x, w_q, scales)
    return registry.call("int4_weight_only_matmul", backend, x, w_q, scales, bias=bias)


__all__ = [
    "int8_weight_only_matmul",
    "int4_weight_only_matmul",
    "quantize_weight",
    "dequantize_weight",
    "pack_int4",
    "unpack_int4",
    "sqnr",
    "SPEC",
    "SPEC_INT4",
    "wo_reference",
]

from kernellab.ops.weight_only_matmul import cuda as _cuda  # noqa: E402,F401
from kernellab.ops.weight_only_matmul import reference as _reference  # noqa: E402,F401
from kernellab.ops.weight_only_matmul import triton as _triton  # noqa: E402,F401
