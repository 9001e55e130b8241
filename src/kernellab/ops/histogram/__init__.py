"""Histogram of integer keys (issue 45, the privatization lecture).

    histogram(x, bins) -> int64 tensor [bins]; out[b] = number of elements of x equal to b

x: a 1-D tensor of uint8, int32 or int64 keys (any strides; a strided one is packed
first). bins: a Python int, 1 <= bins < 2^31. Keys outside [0, bins) are ignored (as
``torch.histc`` drops values outside [min, max]), so the result equals
``torch.bincount(x[(x >= 0) & (x < bins)], minlength=bins)``. Ignoring them rather than
refusing keeps the call free of a device-to-host sync (refusing would need max(x) on the
host before the launch); a caller that wants them counted sizes ``bins`` to cover them.

Exact: counts are integers, every backend must match the reference bit for bit (the
check judges integer outputs exactly). Deterministic: integer additions commute and never
round, so the atomics the GPU kernels use give the same counts on every run.

Not differentiable: the input is integer (PyTorch refuses requires_grad on it) and the
output is a count.

Inputs for benchmarks (``make_keys``): ``uniform`` (every bin equally likely), ``skewed``
(90% of keys in one bin, the rest uniform: the contention case privatization is for) and
``zipf`` (key k with probability ~ 1 / (k + 1), a vocabulary's token counts).
"""

from __future__ import annotations

import warnings

import torch

from kernellab.core import registry
from kernellab.core.spec import BadInput, OpSpec, check_dtype, define, fuzz_dim, refuse_nested, relayout

KEY_DTYPES = (torch.uint8, torch.int32, torch.int64)
MAX_BINS = 2**31 - 1
DISTRIBUTIONS = ("uniform", "skewed", "zipf")
HOT_FRACTION = 0.9  # skewed: the share of keys in the hot bin
OUT_OF_RANGE_FRACTION = 1 / 64  # of the check's inputs: keys that must be ignored


def histogram_reference(x: torch.Tensor, bins: int) -> torch.Tensor:
    """torch.bincount on the CPU in int64, keys outside [0, bins) dropped first."""
    x = x.detach().cpu().reshape(-1).to(torch.int64)
    return torch.bincount(x[(x >= 0) & (x < bins)], minlength=bins)


def check_bins(bins, op: str = "histogram") -> None:
    if isinstance(bins, bool) or not isinstance(bins, int):
        raise TypeError(f"{op}: bins must be an int, got {type(bins).__name__} {bins!r}")
    if not 1 <= bins <= MAX_BINS:
        raise ValueError(f"{op}: bins must be in [1, {MAX_BINS}], got {bins}")


def _validate(args, kwargs, devices, dtypes=KEY_DTYPES) -> None:
    if len(args) != 2:
        raise TypeError(f"histogram() takes 2 arguments (x, bins), got {len(args)}")
    if kwargs:
        raise TypeError(f"histogram() got unexpected keyword arguments {sorted(kwargs)}")
    x, bins = args
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"histogram: x must be a torch.Tensor, got {type(x).__name__}")
    if x.layout is not torch.strided:
        raise TypeError(f"histogram: x has layout {x.layout}; only strided (dense) tensors are supported")
    if x.is_nested:
        refuse_nested("histogram", [("x", x)])
    check_dtype("histogram", "x", x, dtypes)
    if x.dim() != 1:
        raise ValueError(f"histogram: x must be 1-D (flatten it first), got shape {tuple(x.shape)}")
    if x.device.type not in devices:
        raise ValueError(
            f"histogram: x is on {x.device}, but this backend runs on {' or '.join(devices)} tensors only"
        )
    check_bins(bins)


_validate.checks_layouts = True  # (OpSpec.validate: this validator checks x's layout itself)


# --------------------------------------------------------------------------- inputs


def make_keys(n: int, bins: int, dtype=torch.int32, device="cpu", distribution: str = "uniform",
              gen: torch.Generator | None = None, hot: int | None = None) -> torch.Tensor:  # fmt: skip
    """n keys in [0, bins) of ``dtype`` drawn from ``distribution`` (module docstring).
    skewed: ``hot`` (default bins // 2) takes HOT_FRACTION of the keys."""
    if distribution not in DISTRIBUTIONS:
        raise ValueError(f"distribution must be one of {DISTRIBUTIONS}, got {distribution!r}")
    top = min(bins, torch.iinfo(dtype).max + 1)  # uint8 holds keys up to 255
    if distribution == "uniform":
        k = torch.randint(0, top, (n,), generator=gen, device=device, dtype=torch.int64)
    elif distribution == "skewed":
        k = torch.randint(0, top, (n,), generator=gen, device=device, dtype=torch.int64)
        u = torch.rand(n, generator=gen, device=device)
        k = torch.where(u < HOT_FRACTION, top // 2 if hot is None else hot, k)
    else:  # zipf over [0, top): inverse CDF of p(k) ~ 1 / (k + 1)
        w = 1.0 / torch.arange(1, top + 1, device=device, dtype=torch.float64)
        cdf = torch.cumsum(w, 0) / w.sum()
        u = torch.rand(n, generator=gen, device=device, dtype=torch.float64)
        k = torch.searchsorted(cdf, u).clamp_(max=top - 1)
    return k.to(dtype)


def _inputs(shape, dtype, device, gen, layout, scale):
    """Problem shape (n, bins): n uniform keys, OUT_OF_RANGE_FRACTION of them outside
    [0, bins) (negative where the dtype allows, >= bins where it holds such keys), in
    ``layout`` (1-D: sliced, offset and expanded apply). A floating ``dtype`` (generic
    callers that build every op's inputs in fp32) gives int32 keys."""
    n, bins = shape
    if dtype.is_floating_point:  # a caller that builds every op's inputs in one float dtype
        dtype = torch.int32
    x = make_keys(n, bins, dtype, device, "uniform", gen)
    if n:
        u = torch.rand(n, generator=gen, device=device)
        hi = torch.iinfo(dtype).max
        bad = torch.full_like(x, min(hi, bins + 7)) if bins < hi else x
        if dtype != torch.uint8:
            neg = torch.rand(n, generator=gen, device=device) < 0.5
            bad = torch.where(neg, torch.full_like(x, -3), bad)
        x = torch.where(u < OUT_OF_RANGE_FRACTION, bad, x)
    x = relayout(x, layout)
    return None if x is None else (x, bins)


def _plant(x: torch.Tensor) -> None:
    """The dtype's extreme keys (out of range for every bins the check uses but uint8's
    256): a kernel that compares signed against unsigned or narrows a key miscounts them."""
    if x.numel() >= 4 and x.is_contiguous():
        info = torch.iinfo(x.dtype)
        flat = x.view(-1)
        flat[0], flat[-1] = info.max, info.min
        flat[x.numel() // 2] = info.max - 1


def _bytes(shape, dtype, mode):
    # Read each key once; write the int64 counts once (the merge's atomics hit the L2).
    n, bins = shape
    return n * torch.empty((), dtype=dtype).element_size() + bins * 8


def _flops(shape, mode):
    return shape[0]  # one increment per key


def _float_x(device, dtype):
    return (torch.rand(33, device=device), 8), {}


def _bins_float(device, dtype):
    return (torch.zeros(33, dtype=torch.int32, device=device), 8.0), {}


def _bins_negative(device, dtype):
    return (torch.zeros(33, dtype=torch.int32, device=device), -4), {}


def _bins_zero(device, dtype):
    return (torch.zeros(33, dtype=torch.int32, device=device), 0), {}


def _bins_tensor(device, dtype):
    return (torch.zeros(33, dtype=torch.int32, device=device), torch.tensor(8)), {}


def _x_2d(device, dtype):
    return (torch.zeros(3, 11, dtype=torch.int32, device=device), 8), {}


def _x_list(device, dtype):
    return ([0, 1, 2], 8), {}


def _x_nested(device, dtype):
    with warnings.catch_warnings():  # (the strided nested layout is a prototype)
        warnings.simplefilter("ignore")
        x = torch.nested.nested_tensor([torch.arange(3, device=device), torch.arange(5, device=device)])
    return (x, 8), {}


def _x_int16(device, dtype):
    return (torch.zeros(33, dtype=torch.int16, device=device), 8), {}


def _x_cpu(device, dtype):
    return (torch.zeros(33, dtype=torch.int32), 8), {}


def _unknown_kw(device, dtype):
    return (torch.zeros(33, dtype=torch.int32, device=device), 8), {"minlength": 8}


class HistogramSpec(OpSpec):
    """histogram's spec: its bad inputs are its own (the generic ones call an integer x
    bad, and integer keys are histogram's input)."""

    def bad_inputs(self) -> list[BadInput]:
        return list(self.extra_bad_inputs)


def _fuzz(rng, big):
    """n keys and bins: past shared memory (12288) now and then; n x bins < 2^31."""
    n = fuzz_dim(rng, 1, (1 << 24) if big else (1 << 13))
    return (n, fuzz_dim(rng, 1, min(1 << 16 if big else 20000, (2**31 - 1) // n))), {}


SPEC = define(
    HistogramSpec(
        name="histogram",
        problem_ranks=(2,), problem_dims="(N, bins): N keys in [0, bins)",
        arg_names=("x",),
        reference=histogram_reference,
        flops=_flops,
        bytes_moved=_bytes,
        dtypes=KEY_DTYPES,
        # (n, bins): empty, one key, one bin, primes, block +-1, bins past what shared
        # memory holds (the privatized rungs refuse, `cuda` takes global atomics)
        test_shapes=[
            (0, 5),
            (1, 1),
            (1, 7),
            (17, 1),
            (113, 3),
            (1023, 256),
            (1025, 255),
            (4097, 4096),
            (65537, 17),
            (20011, 65536),
            (3001, 12289),
        ],
        quick_shapes=[(0, 5), (1, 1), (1025, 255), (4097, 4096), (3001, 65536)],
        bench_shapes=[(1 << 24, 256), (1 << 26, 256), (1 << 26, 4096)],
        cpu_bench_shapes=[(1 << 14, 256)],
        layout_shape=(1025, 100),
        reach_shape=(1025, 100),
        rows_shape=None,
        modes=("fwd",),
        inputs=_inputs,
        validator=_validate,
        specials=(),  # integer keys hold no NaN or inf; _plant puts the extremes in instead
        plant_extra=_plant,
        key_of_shape=lambda shape: (1, shape[0]),
        fuzz=_fuzz,
        default_backends=("cuda", "triton", "torch"),
        key_validates=True,
        bad_shape=(33, 8),
        extra_bad_inputs=[
            BadInput("float x", _float_x, "x", exc=(TypeError,)),
            BadInput("int16 x", _x_int16, "x", exc=(TypeError,)),
            BadInput("a list instead of a tensor", _x_list, "x", exc=(TypeError,)),
            BadInput("2-D x", _x_2d, "x", exc=(ValueError,)),
            BadInput("a nested tensor", _x_nested, "x", exc=(TypeError,)),
            BadInput("bins a float", _bins_float, "bins", exc=(TypeError,)),
            BadInput("bins a tensor", _bins_tensor, "bins", exc=(TypeError,)),
            BadInput("bins negative", _bins_negative, "bins", exc=(ValueError,)),
            BadInput("bins zero", _bins_zero, "bins", exc=(ValueError,)),
            BadInput("unknown keyword", _unknown_kw, "minlength", exc=(TypeError,)),
            BadInput("CPU tensor to a GPU-only backend", _x_cpu, "x", gpu_only=True),
        ],
        doc="histogram of integer keys in [0, bins) (torch.bincount(x, minlength=bins)), int64",
    )
)


def histogram(x: torch.Tensor, bins: int, *, backend: str | None = None) -> torch.Tensor:
    """Counts (int64, length ``bins``) of the keys of 1-D integer ``x`` (uint8, int32,
    int64) in [0, bins); keys outside that range are ignored. Equal to
    ``torch.bincount(x[(x >= 0) & (x < bins)], minlength=bins)``, on the chosen backend."""
    return registry.call("histogram", backend, x, bins)


def expected_bytes(n: int, bins: int, dtype) -> int:
    """Bytes of _bytes for a problem (the bench scripts' GB/s of input read + counts)."""
    return _bytes((n, bins), dtype, "fwd")


# The backends register themselves, after the spec exists.
from kernellab.ops.histogram import cuda as _cuda  # noqa: E402,F401
from kernellab.ops.histogram import reference as _reference  # noqa: E402,F401
from kernellab.ops.histogram import triton as _triton  # noqa: E402,F401
