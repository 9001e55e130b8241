"""Matmul with an optional fused epilogue (issue 4).

    y = act(a @ b + bias)      a [..., M, K], b [..., K, N], bias [N], y [..., M, N]

2-D or batched (a and b with the same leading dims; no broadcasting between them).
fp32 / fp16 / bf16 storage, fp32 accumulation. ``activation`` is None, "relu" or "gelu"
(the tanh approximation, as kernellab's gelu op). Gradients: with dz = dy * act'(z),
da = dz @ b^T, db = a^T @ dz, dbias = sum of dz over all rows.

Problem shape for the harness: (M, N, K), or (Bt, M, N, K) for a batch of Bt products.
fp32 comparisons run with TF32 off (``torch.backends.cuda.matmul.allow_tf32 = False``):
the reference, cuBLAS and our kernels then all do full fp32 products.
"""

from __future__ import annotations

import math

import torch

from kernellab.core import registry
from kernellab.core.spec import (
    FLOAT_DTYPES,
    BadInput,
    TensorOption,
    check_dtype,
    declare,
    device_of,
    dtype_name,
    fuzz_dim,
    make_tensor,
    runs_on,
)
from kernellab.ops.matmul.epilogue import apply_epilogue

ACTIVATIONS = (None, "relu", "gelu")


def matmul_reference(a, b, bias=None, activation=None):
    """float64 in (the harness upcasts), float64 out."""
    if bias is not None:
        bias = bias.to(a.dtype)
    return apply_epilogue(torch.matmul(a, b), bias, activation)


# --------------------------------------------------------------------------- shapes


def _split(shape):
    """Problem shape -> (batch dims, M, N, K)."""
    shape = tuple(shape)
    if len(shape) < 3:
        raise ValueError(f"matmul problem shape is (M, N, K) or (Bt, M, N, K), got {shape}")
    return shape[:-3], shape[-3], shape[-2], shape[-1]


def _flops(shape, mode, **options):
    batch, m, n, k = _split(shape)
    one = 2 * math.prod(batch) * m * n * k  # a multiply and an add per (m, n, k)
    return {"fwd": one, "bwd": 2 * one, "fwdbwd": 3 * one}[mode]


def _bytes(shape, dtype, mode, **options):
    batch, m, n, k = _split(shape)
    e = torch.empty((), dtype=dtype).element_size() * math.prod(batch)
    a, b, c = m * k * e, k * n * e, m * n * e
    # fwd: read a, b, write y. bwd: read dy, a, b, write da, db.
    return {"fwd": a + b + c, "bwd": 2 * (a + b) + c, "fwdbwd": 3 * (a + b) + 2 * c}[mode]


def make_matmul_inputs(shape, dtype, device, gen, layout="contiguous", scale=1.0, b_t=False):
    """(a [..., M, K], b [..., K, N]), both in ``layout``; None where it does not apply.
    ``b_t``: b is the transpose of a weight [..., N, K] made in ``layout`` (nn.Linear's
    ``W.t()``), not a [..., K, N] tensor."""
    batch, m, n, k = _split(shape)
    a = make_tensor(batch + (m, k), dtype, device, gen, layout, scale)
    if b_t:
        w = make_tensor(batch + (n, k), dtype, device, gen, layout, scale)
        b = None if w is None else w.transpose(-1, -2)
    else:
        b = make_tensor(batch + (k, n), dtype, device, gen, layout, scale)
    if a is None or b is None:
        return None
    return a, b


def matmul_input_facts(args) -> tuple:
    """(``b_t``,) of a call: b [..., K, N] is the transpose of a [..., N, K] tensor with unit
    stride along K (nn.Linear's ``W.t()``; a size-1 N reads as either). False for anything
    that is not such a tensor (the op's validation then says what is wrong). On every
    default call: two reads of b."""
    try:
        b = args[1]
        st, sh = b.stride(), b.shape
        return (len(sh) >= 2 and sh[-2] > 1 and st[-2] == 1 and (sh[-1] == 1 or st[-1] != 1),)
    except (AttributeError, IndexError, TypeError, RuntimeError):
        return (False,)


def _bias(args, dtype, device, gen):
    """A bias [N] for the option cases: N(0, 1), so an ignored bias is off by ~1."""
    return make_tensor((args[1].shape[-1],), dtype, device, gen)


BIAS = TensorOption(_bias)


# --------------------------------------------------------------------------- validation


def validate_matmul(args, kwargs, devices=("cuda", "cpu"), dtypes=FLOAT_DTYPES) -> None:
    """Raise TypeError/ValueError naming the argument (a, b, bias, activation)."""
    if len(args) == 2 and not kwargs:  # fast accept (every call runs this): the cheapest reads
        a, b = args
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
            nd = a.ndim
            if (
                nd >= 2
                and b.ndim == nd
                and a.dtype in dtypes
                and b.dtype is a.dtype
                and runs_on(a, devices)
                and device_of(b) == device_of(a)
                and b.shape[-2] == a.shape[-1]
                and (nd == 2 or b.shape[:-2] == a.shape[:-2])
            ):
                return
    if len(args) != 2:
        raise TypeError(f"matmul() takes 2 tensor arguments (a, b), got {len(args)}")
    a, b = args
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"matmul: {name} must be a torch.Tensor, got {type(t).__name__}")
        check_dtype("matmul", name, t, dtypes)
        if t.device.type not in devices:
            raise ValueError(
                f"matmul: {name} is on {t.device}, but this backend runs on "
                f"{' or '.join(devices)} tensors only"
            )
        if t.dim() < 2:
            raise ValueError(
                f"matmul: {name} must have at least 2 dimensions ([..., rows, cols]), "
                f"got a {t.dim()}-d tensor"
            )
    if b.device != a.device:
        raise ValueError(f"matmul: b is on {b.device} but a is on {a.device}")
    if b.dtype != a.dtype:
        raise TypeError(f"matmul: b has dtype {b.dtype} but a has {a.dtype}")
    if b.shape[:-2] != a.shape[:-2]:
        raise ValueError(
            f"matmul: b has shape {tuple(b.shape)} and a {tuple(a.shape)}; the leading (batch) dims "
            f"must be equal (no broadcasting)"
        )
    if b.shape[-2] != a.shape[-1]:
        raise ValueError(
            f"matmul: b has {b.shape[-2]} rows but a has {a.shape[-1]} columns "
            f"(a [..., M, K] @ b [..., K, N]); "
            f"shapes {tuple(a.shape)} and {tuple(b.shape)}"
        )
    if kwargs:
        unknown = sorted(set(kwargs) - {"bias", "activation"})
        if unknown:
            raise TypeError(f"matmul() got unexpected keyword arguments {unknown}")
        act = kwargs.get("activation")
        if act not in ACTIVATIONS:
            raise ValueError(f"matmul: activation must be None, 'relu' or 'gelu', got {act!r}")
        bias = kwargs.get("bias")
        if bias is not None:
            if not isinstance(bias, torch.Tensor):
                raise TypeError(f"matmul: bias must be a torch.Tensor or None, got {type(bias).__name__}")
            if bias.dtype != a.dtype:
                raise TypeError(f"matmul: bias has dtype {bias.dtype} but a has {a.dtype}")
            if bias.device != a.device:
                raise ValueError(f"matmul: bias is on {bias.device} but a is on {a.device}")
            if tuple(bias.shape) != (b.shape[-1],):
                raise ValueError(
                    f"matmul: bias must have shape ({b.shape[-1]},) (N), got {tuple(bias.shape)}"
                )


# --------------------------------------------------------------------------- bad inputs


def _pair(device, dtype, sa, sb, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    a = torch.randn(sa, generator=g, device=device).to(dtype)
    b = torch.randn(sb, generator=g, device=device).to(dtype)
    return a, b


_EXTRA_BAD = [
    BadInput("mismatched inner dims", lambda d, t: (_pair(d, t, (5, 7), (6, 4)), {}), "b"),
    BadInput("batch dims differ", lambda d, t: (_pair(d, t, (2, 5, 7), (3, 7, 4)), {}), "b"),
    BadInput("1-d a", lambda d, t: (_pair(d, t, (7,), (7, 4)), {}), "a"),
    BadInput("0-d b", lambda d, t: ((_pair(d, t, (5, 7), ())), {}), "b"),
    BadInput(
        "mismatched dtypes",
        lambda d, t: ((lambda p: (p[0].float(), p[1].half()))(_pair(d, t, (5, 7), (7, 4))), {}),
        "b",
    ),
    BadInput(
        "bias of the wrong length",
        lambda d, t: (_pair(d, t, (5, 7), (7, 4)), {"bias": torch.zeros(5, dtype=t, device=d)}),
        "bias",
    ),
    BadInput(
        "unknown activation", lambda d, t: (_pair(d, t, (5, 7), (7, 4)), {"activation": "tanh"}), "activation"
    ),
]

def _fuzz(rng, big):
    """(M, N, K) or batched (B, M, N, K): a quarter of the draws with decode's M of 1-16."""
    hi = 4096 if big else 150
    m = fuzz_dim(rng, 1, 16) if rng.random() < 0.25 else fuzz_dim(rng, 1, hi)
    n, k = fuzz_dim(rng, 1, hi), fuzz_dim(rng, 1, hi)
    if rng.random() < 0.3:
        return (fuzz_dim(rng, 1, 8 if big else 3), m, n, k), None
    return (m, n, k), None


SPEC = declare(
    "matmul", ("a", "b"), matmul_reference, _flops, _bytes,
    problem_ranks=(3, 4), problem_dims="(M, N, K) or (Bt, M, N, K)",
    test_shapes=[
        (1, 1, 1),
        (0, 5, 7),
        (17, 33, 65),
        (64, 48, 80),
        (127, 129, 63),
        (33, 17, 0),
        (2, 17, 33, 65),
    ],
    # (2, 136, 264, 72): the CUDA 16-byte paths (K, N multiples of 8) with partial tiles in
    # every dim and 3 k-tiles (the full cp.async ring); compute-sanitizer runs these shapes.
    quick_shapes=[(1, 1, 1), (17, 33, 65), (2, 9, 15, 31), (2, 136, 264, 72)],
    bench_shapes=[(4096, 4096, 4096), (8192, 8192, 8192)],
    cpu_bench_shapes=[(256, 256, 256)],
    layout_shape=(37, 45, 29),
    grad_args=(0, 1),
    specials=(float("nan"), float("inf")),
    metric="tflops",
    # cuBLAS first where no table row is near: it is the fastest at nearly every row of
    # the tuning table.
    default_backends=("torch", "cuda", "triton"),
    doc=__doc__.strip().split("\n")[0],
    extra_bad_inputs=_EXTRA_BAD,
    inputs=make_matmul_inputs,
    validator=validate_matmul,
    key_validates=True,
    option_sets=[
        {"activation": "relu"},
        {"activation": "gelu"},
        {"bias": BIAS},
        {"bias": BIAS, "activation": "gelu"},
    ],
    # b as a [K, N] tensor and as nn.Linear's W.t(): kernels read the two differently
    # (cuda_skinny's rows kernel reads only the second), so tables keep rows of each
    bench_options=[{}, {"b_t": True}],
    input_options={"b_t": False},
    input_facts=matmul_input_facts,
    grad_shapes=[(37, 45, 29), (2, 17, 19, 23)],
    fuzz=_fuzz,
    # A dot's rounding happens at the scale of its partial sums, not of its result: with
    # few outputs (M = N = 1) and cancellation, one ulp of the output under-rates it and
    # a lucky PyTorch rounding left a bound below any summation order's error (fuzz
    # 1x1x1x95: terms ~8 summing to 1.06; gelu's dz amplifies z's rounding the same way).
    perturbation_floor=True,
    bad_shape=(5, 6, 7),
    # M <= 16 runs GEMV kernels (cuBLAS's, cuda_skinny's), launch-bound at model widths,
    # where a row's winner is the cheapest launch; above it, tile kernels: a decode row does
    # not speak for a 64-row call (the key's M is third from its end)
    key_bands=((-3, (16,)),),
)


def matmul(a, b, bias=None, activation=None, *, backend: str | None = None):
    """``act(a @ b + bias)`` with the chosen backend (None: the preferred one for the device)."""
    if bias is None and activation is None:
        return registry.call("matmul", backend, a, b)
    kw = {"activation": activation}
    if bias is not None:
        kw["bias"] = bias
    return registry.call("matmul", backend, a, b, **kw)


__all__ = ["matmul", "SPEC", "matmul_reference", "validate_matmul", "make_matmul_inputs", "dtype_name"]

from kernellab.ops.matmul import cuda as _cuda  # noqa: E402,F401
from kernellab.ops.matmul import cuda_skinny as _cuda_skinny  # noqa: E402,F401
from kernellab.ops.matmul import reference as _reference  # noqa: E402,F401  (registrations)
from kernellab.ops.matmul import triton as _triton  # noqa: E402,F401
from kernellab.ops.matmul import triton_tma as _triton_tma  # noqa: E402,F401
