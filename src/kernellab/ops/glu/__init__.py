"""Gated linear units of a transformer MLP: SwiGLU and GeGLU, forward and backward.

    swiglu(a, b) = silu(a) * b = a * sigmoid(a) * b
    geglu(a, b)  = gelu(a) * b       approximate="none": 0.5 a (1 + erf(a / sqrt 2))
                                     approximate="tanh": 0.5 a (1 + tanh(sqrt(2/pi) (a + 0.044715 a^3)))

``a`` is the gate projection, ``b`` the up projection: same shape (any rank, any strides),
same dtype (fp32 / fp16 / bf16), same device. Math in fp32, one rounding to the input dtype
(PyTorch's ``F.silu(a) * b`` rounds twice: the activation, then the product). Gradients for
both inputs.

NaN and inf follow the formulas, as PyTorch's ``F.silu`` / ``F.gelu`` do: act(-inf) is NaN
(-inf * 0), act(+inf) is +inf, so the output there is NaN, resp. +-inf times b; the
gradient of the activation at both +inf and -inf is NaN (inf * 0 in its derivative; the
limits 1 and 0 are not what any backend returns), so da is NaN there, and db = dy * act(a)
follows the forward. NaN in, NaN out. Large finite inputs keep the limits (act(-1e4) = -0,
act'(1e4) = 1). The ``torch`` backend is PyTorch's ops as they are: on a CPU with AVX-512,
PyTorch's vectorized fp32 erf GeLU gives NaN at +inf (its scalar path gives +inf).

``inplace_backward=True`` (opt-in, eager only) makes the Triton backend's backward write da
into a's buffer and db into b's instead of two new tensors, as Liger's SwiGLU does: each
element of dy, a and b is read before da and db are stored at the same index, by the same
thread. Inside an MLP this saves two [N, I] tensors at the step's peak (the start of the
backward, when every activation is alive), but a and b are destroyed by the backward: use
it only for intermediates nothing else reads, e.g. the gate and up projections made inside
a module's forward (``kernellab.patch`` does). Only a contiguous a or b is written; a
strided one (a half of a fused gate_up projection) is packed by the launcher into a
private copy, which takes the gradient, and the caller's tensor is left intact; a and b
that share bytes (``swiglu(x, x)``) get fresh gradients. Each tensor written gets a new
version (a Triton store does not count as one), so any other autograd node that saved it
raises PyTorch's in-place modification error rather than read a gradient as data, and a
second backward through the same graph (``retain_graph=True``) is refused with a
RuntimeError naming the op. Under torch.compile the flag is ignored (the custom op declares
no mutation). The other backends accept the flag and ignore it (it never changes a result).
"""

from __future__ import annotations

import math

import torch

from kernellab.core import registry
from kernellab.core.spec import (
    FLOAT_DTYPES,
    BadInput,
    OpSpec,
    check_float_tensor,
    define,
    device_of,
    elementwise_shapes,
    layout_checking,
    runs_on,
)

APPROXIMATIONS = ("none", "tanh")
_K = math.sqrt(2.0 / math.pi)


def swiglu_reference(a: torch.Tensor, b: torch.Tensor, inplace_backward: bool = False) -> torch.Tensor:
    """The formula in the inputs' dtype (float64 in checks)."""
    return a * torch.sigmoid(a) * b


def gelu_formula(a: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    if approximate == "tanh":
        return 0.5 * a * (1.0 + torch.tanh(_K * (a + 0.044715 * a * a * a)))
    return 0.5 * a * (1.0 + torch.erf(a * (1.0 / math.sqrt(2.0))))


def geglu_reference(
    a: torch.Tensor, b: torch.Tensor, approximate: str = "none", inplace_backward: bool = False
) -> torch.Tensor:
    """The formula in the inputs' dtype (float64 in checks)."""
    return gelu_formula(a, approximate) * b


# --------------------------------------------------------------------------- validation


def make_validator(op: str, options: tuple[str, ...]):
    """validator(args, kwargs, devices, dtypes) for ``op(a, b, **options)``: two dense
    float tensors of one shape, dtype and device; ``approximate`` (geglu) one of
    APPROXIMATIONS; ``inplace_backward`` a bool. Errors name the argument."""

    def plain(kwargs) -> bool:
        # every keyword known and well formed (the checks below say which is not)
        for k, v in kwargs.items():
            if k == "inplace_backward":
                if v.__class__ is not bool:
                    return False
            elif k != "approximate" or v not in options:
                return False
        return True

    def validate(args, kwargs, devices, dtypes=FLOAT_DTYPES) -> None:
        # Fast accept (runs on every call: a few attribute reads); anything else takes the
        # checks below, which name the offending argument.
        if len(args) == 2 and (not kwargs or plain(kwargs)):
            a, b = args
            if (
                isinstance(a, torch.Tensor)
                and isinstance(b, torch.Tensor)
                and a.dtype in dtypes
                and b.dtype is a.dtype
                and a.layout is torch.strided
                and b.layout is torch.strided
                and a.shape == b.shape
                and runs_on(a, devices)
                and device_of(b) == device_of(a)
            ):
                return
        if len(args) != 2:
            raise TypeError(f"{op}() takes 2 tensor arguments (a, b), got {len(args)}")
        a, b = args
        check_float_tensor(op, "a", a, devices, dtypes)
        check_float_tensor(op, "b", b, devices, dtypes)
        if b.device != a.device:
            raise ValueError(f"{op}: b is on {b.device} but a is on {a.device}")
        if b.dtype != a.dtype:
            raise TypeError(f"{op}: b has dtype {b.dtype} but a has {a.dtype}; they must match")
        if b.shape != a.shape:
            raise ValueError(
                f"{op}: b has shape {tuple(b.shape)} but a has {tuple(a.shape)}; "
                "shapes must match (no broadcasting)"
            )
        for k, v in kwargs.items():
            if k == "inplace_backward":
                if not isinstance(v, bool):
                    raise TypeError(f"{op}: inplace_backward must be a bool, got {v!r}")
                continue
            if k != "approximate" or not options:
                raise TypeError(f"{op}() got an unexpected keyword argument {k!r}")
            if not isinstance(v, str) or v not in options:
                allowed = ", ".join(map(repr, options))
                raise ValueError(f"{op}: approximate must be one of {allowed}, got {v!r}")

    return layout_checking(validate)


# --------------------------------------------------------------------------- counts


def _bytes(shape, dtype, mode, **options):
    n = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    # fwd: read a, b, write y. bwd: read dy, a, b, write da, db (the activation recomputed
    # from a: nothing saved beyond the inputs). fwdbwd: both.
    return {"fwd": 3 * n, "bwd": 5 * n, "fwdbwd": 8 * n}[mode]


def _flops(per_fwd: int, per_bwd: int):
    def flops(shape, mode, **options):
        n = math.prod(shape)
        return {"fwd": per_fwd * n, "bwd": per_bwd * n, "fwdbwd": (per_fwd + per_bwd) * n}[mode]

    return flops


# --------------------------------------------------------------------------- bad inputs


def _pair(device, dtype):
    g = torch.Generator(device=device).manual_seed(0)
    return tuple(torch.randn(4, 33, generator=g, device=device).to(dtype) for _ in range(2))


def _int_b(device, dtype):
    a, b = _pair(device, dtype)
    return (a, b.to(torch.int32)), {}


def _bad_approximate(device, dtype):
    return _pair(device, dtype), {"approximate": "erf"}


def _unknown_option(device, dtype):
    return _pair(device, dtype), {"alpha": 1.0}


def _int_inplace(device, dtype):
    return _pair(device, dtype), {"inplace_backward": 1}


def _common(doc: str) -> dict:
    return dict(
        arg_names=("a", "b"),
        bytes_moved=_bytes,
        test_shapes=elementwise_shapes(),
        quick_shapes=[(0,), (1,), (1025,), (129, 1000)],
        bench_shapes=[(2**p,) for p in (16, 20, 24, 26)],
        cpu_bench_shapes=[(2**p,) for p in (10, 14, 18)],
        layout_shape=(37, 1025),
        reach_shape=(5, 1025),
        grad_args=(0, 1),
        scale=3.0,  # both tails of the activation
        # |a| up to 1e3: with |b| ~ 3 the product stays finite in fp16
        specials=(float("nan"), float("inf"), float("-inf"), 1e3, -1e3, 60.0, -60.0),
        rows_shape=(65537, 3),
        default_backends=("triton", "torch"),
        # documented in-place mode: the backward writes da and db into a's and b's buffers
        inplace_options={"inplace_backward": ("a", "b")},
        key_validates=True,
        doc=doc.strip().split("\n")[0],
    )


SWIGLU_SPEC = define(
    OpSpec(
        name="swiglu",
        reference=swiglu_reference,
        # fwd: exp, add, div, 2 mul (~5); bwd: the same plus ~6 for s (1 + a (1 - s)) and dy products
        flops=_flops(5, 11),
        validator=make_validator("swiglu", ()),
        option_sets=[{"inplace_backward": True}],
        extra_bad_inputs=[
            BadInput("integer b", _int_b, "b"),
            BadInput("unknown keyword", _unknown_option, "alpha"),
            BadInput("inplace_backward not a bool", _int_inplace, "inplace_backward"),
        ],
        **_common("SwiGLU: silu(a) * b, the gate of a Llama-style MLP"),
    )
)

GEGLU_SPEC = define(
    OpSpec(
        name="geglu",
        reference=geglu_reference,
        flops=_flops(9, 16),
        validator=make_validator("geglu", APPROXIMATIONS),
        option_sets=[{"approximate": "tanh"}, {"inplace_backward": True},
                     {"approximate": "tanh", "inplace_backward": True}],  # fmt: skip
        extra_bad_inputs=[
            BadInput("integer b", _int_b, "b"),
            BadInput("approximate not 'none' or 'tanh'", _bad_approximate, "approximate"),
            BadInput("unknown keyword", _unknown_option, "alpha"),
            BadInput("inplace_backward not a bool", _int_inplace, "inplace_backward"),
        ],
        **_common("GeGLU: gelu(a) * b (exact or tanh GeLU), the gate of a Gemma-style MLP"),
    )
)


def swiglu(
    a: torch.Tensor, b: torch.Tensor, *, backend: str | None = None, inplace_backward: bool = False
) -> torch.Tensor:
    """``silu(a) * b`` (a: the gate projection, b: the up projection, same shape) with the
    chosen backend (default: the fastest available here); ``inplace_backward``: see the
    module docstring (a and b destroyed by the backward)."""
    if inplace_backward is False:  # the default: no keyword, the registry's cheapest path
        return registry.call("swiglu", backend, a, b)
    return registry.call("swiglu", backend, a, b, inplace_backward=inplace_backward)


def geglu(
    a: torch.Tensor,
    b: torch.Tensor,
    approximate: str = "none",
    *,
    backend: str | None = None,
    inplace_backward: bool = False,
) -> torch.Tensor:
    """``gelu(a, approximate) * b`` with the chosen backend; ``approximate`` as in
    ``torch.nn.functional.gelu`` ("none": erf, "tanh": the tanh approximation);
    ``inplace_backward``: see the module docstring (a and b destroyed by the backward)."""
    opts = {}
    if approximate != "none":  # the defaults: no keyword, the registry's cheapest path
        opts["approximate"] = approximate
    if inplace_backward is not False:
        opts["inplace_backward"] = inplace_backward
    return registry.call("geglu", backend, a, b, **opts)


from kernellab.ops.glu import liger as _liger  # noqa: E402,F401  (registrations)
from kernellab.ops.glu import reference as _reference  # noqa: E402,F401
from kernellab.ops.glu import triton as _triton  # noqa: E402,F401
