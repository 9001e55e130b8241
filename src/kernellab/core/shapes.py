"""Shape data the default, the tune, benchmarks and tests share: the shape families of
real models, and the shape key of a call (what a tuning row is matched on).

- ``FAMILIES``: per model family and op, the shapes a real model calls the op with (in
  the op's OpSpec shape convention), shared by ``kernellab tune``, benchmarks and tests.
  ``FAMILIES["heldout"]`` is never tuned (``kernellab.harness.tune_all`` verifies the
  default there).
- Shape keys (from a call's arguments, the same for tune rows and calls): elementwise ops
  (numel,); row-wise ops and reductions (rows, cols) of the first tensor; matmul (M, N, K);
  attention (batch x heads, S_q, S_k, head dim); rope (B x S, H_q, H_k, D, rotary dim).
  ``key_of_shape`` maps a spec's problem shape to the same key (an op whose problem shape
  needs its own reading declares ``OpSpec.key_of_shape``).
- ``option_key``: the options of a call that tables tell apart.
"""

from __future__ import annotations

import math

import torch

from kernellab.core.spec import get_spec, options_str

# --------------------------------------------------------------------------- families

_ODD = [(4099, 1025), (4096, 4097), (8191, 50257), (257, 65537)]


def _rows(hidden, tokens=(4096, 16384, 32768)):
    return [(t, hidden) for t in tokens]


FAMILIES: dict[str, dict[str, list[tuple]]] = {
    "gpt2": {  # hidden 768, MLP 3072, vocab 50257 / 50304, 12 heads of 64, T 1024
        "add": [(8 * 1024 * 768,), (4 * 256 * 768,)],
        "gelu": [(8 * 1024 * 3072,), (4 * 256 * 3072,)],
        "layer_norm": _rows(768, (1024, 8192, 16384)),
        # logits; attention probabilities (B x 12 heads x T, T) at batch 8 and 1
        "softmax": [(8192, 50257), (8192, 50304), (96 * 1024, 1024), (12 * 1024, 1024)],
        "cross_entropy": [(8192, 50257), (8192, 50304), (1024, 50304)],
        "matmul": [
            (8192, 2304, 768),
            (8192, 768, 768),
            (8192, 3072, 768),
            (8192, 768, 3072),
            (8192, 50304, 768),
            (8192, 50257, 768),  # the LM head at the real vocab: cuBLAS takes a slow path at odd N
        ],
        "attention": [(8, 12, 1024, 64), (4, 12, 256, 64)],
        "sum": _rows(768, (8192,)),
        "max": [(8192, 50304)],
        "argmax": [(8192, 50304)],
    },
    "llama3-8b": {  # hidden 4096, MLP 14336, vocab 128256, 32 q / 8 kv heads of 128
        "add": [(8192 * 4096,)],
        "rms_norm": _rows(4096),
        "softmax": [(4096, 128256)],
        # (4096 tokens: at 8192 x 128256 the float64 reference and its gradient alone
        # would take ~34 GB)
        "cross_entropy": [(4096, 128256)],
        "matmul": [(8192, 6144, 4096), (8192, 4096, 4096), (8192, 28672, 4096), (8192, 4096, 14336)],
        "attention": [(1, 32, 8192, 128), (4, 32, 2048, 128)],
        "rope": [(1, 32, 8, 8192, 128, 128), (4, 32, 8, 2048, 128, 128)],
        "argmax": [(16, 128256)],
        "swiglu": [(8192 * 14336,)],
        "add_rms_norm": _rows(4096),
        "linear_cross_entropy": [(4096, 4096, 128256)],
    },
    "llama3.2-1b": {  # hidden 2048, MLP 8192, vocab 128256, 32 q / 8 kv heads of 64
        "rms_norm": _rows(2048, (4096, 16384)),
        "add_rms_norm": _rows(2048, (4096, 16384)),
        "swiglu": [(4096 * 8192,), (16384 * 8192,)],
        "rope": [(2, 32, 8, 2048, 64, 64)],
        "linear_cross_entropy": [(4096, 2048, 128256), (16384, 2048, 128256)],
    },
    "qwen2.5-7b": {  # hidden 3584, MLP 18944, vocab 152064, 28 q / 4 kv heads of 128
        "rms_norm": _rows(3584),
        "cross_entropy": [(4096, 152064)],
        "matmul": [(8192, 4608, 3584), (8192, 3584, 18944)],
        "attention": [(2, 28, 4096, 128)],
        "rope": [(2, 28, 4, 4096, 128, 128)],
    },
    "qwen2.5-0.5b": {  # hidden 896, MLP 4864, vocab 151936, 14 q / 2 kv heads of 64
        "rms_norm": [(4096, 896)],
        "attention": [(2, 14, 2, 2048, 2048, 64)],
    },
    "mistral-7b": {  # hidden 4096, MLP 14336, vocab 32000, 32 q / 8 kv heads of 128, window 4096
        "rms_norm": [(8192, 4096)],
        "add_rms_norm": [(8192, 4096)],
        "softmax": [(8192, 32000)],
        "cross_entropy": [(8192, 32000)],
        "matmul": [(8192, 6144, 4096), (8192, 28672, 4096), (8192, 32000, 4096)]
        + [(m, n, 4096) for m in (1, 8) for n in (6144, 28672)],
        "attention": [(1, 32, 8, 8192, 8192, 128)],
        "swiglu": [(8192 * 14336,)],
        "linear_cross_entropy": [(8192, 4096, 32000)],
    },
    "gemma2-2b": {  # hidden 2304, MLP 9216 (GeGLU, tanh GeLU), vocab 256000, 8 q / 4 kv heads of 256
        "geglu": [(4096 * 9216,), (16384 * 9216,)],
        "attention": [(1, 8, 4, 4096, 4096, 256)],
    },
    "phi-2": {  # hidden 2560, MLP 10240 (GeLU), vocab 51200, 32 heads of 80, T 2048
        "attention": [(4, 32, 2048, 80)],
    },
    "phi-3-mini": {  # hidden 3072, MLP 8192 (SwiGLU), vocab 32064, 32 heads of 96, T 4096
        "attention": [(1, 32, 4096, 96)],
    },
    "vit-b16": {  # hidden 768, 197 tokens, 12 heads of 64
        "layer_norm": [(256 * 197, 768)],
        "gelu": [(256 * 197 * 3072,)],
        "softmax": [(256 * 12 * 197, 197)],
        "matmul": [(256 * 197, 2304, 768), (256 * 197, 768, 3072)],
        "attention": [(256, 12, 197, 64)],
    },
    "decode": {  # M = 1-16 tokens against 8B-class weights (and 32-256: batched decode)
        "matmul": [(m, n, 4096) for m in (1, 2, 4, 8, 16) for n in (4096, 14336)]
        + [(m, 4096, 14336) for m in (1, 16)]
        # above M = 16 the tile kernels' band (OpSpec.key_bands): rows of its own
        + [(32, 4096, 4096), (32, 14336, 4096), (256, 4096, 4096), (256, 14336, 4096), (32, 4096, 14336)],
        "rms_norm": [(m, 4096) for m in (1, 4, 16)],
        "argmax": [(m, 128256) for m in (1, 4, 16)],
        # sampling over the vocabulary; eager attention probabilities (HF's upcast to fp32),
        # one query row per head: batch 128 at 8K context, batch 8 at 128K
        "softmax": [(m, 128256) for m in (1, 16)] + [(128 * 32, 8192), (8 * 32, 131072)],
    },
    "odd": {  # primes and 2^k +- 1
        "softmax": _ODD,
        "layer_norm": _ODD,
        "rms_norm": _ODD,
        "cross_entropy": [(4099, 50257), (8191, 32003)],
        "sum": _ODD,
        "max": _ODD,
        "matmul": [(3000, 3000, 3000), (4097, 4095, 1023), (1, 4097, 4095)],
        "attention": [(2, 8, 1023, 64), (1, 8, 4097, 128)],
        "add": [(2**24 + 1,), (10**7 + 19,)],
        "gelu": [(2**24 - 1,)],
    },
    # Launch-bound calls: a small batch, a unit test, MNIST-sized layers. Here the host
    # cost of a call decides, and PyTorch's C++ path often wins.
    "small": {
        "add": [(64 * 256,), (128 * 768,)],
        "gelu": [(64 * 256,), (128 * 3072,)],
        "layer_norm": [(64, 256), (128, 768)],
        "rms_norm": [(64, 256), (128, 4096)],
        "softmax": [(64, 256), (128, 1024)],
        "cross_entropy": [(64, 10), (256, 10), (64, 256)],
        "matmul": [(64, 64, 64), (64, 128, 3136), (256, 10, 128)],
        "attention": [(1, 2, 64, 64), (4, 12, 128, 64)],
        "rope": [(1, 4, 2, 64, 64, 64), (4, 12, 12, 128, 64, 64)],
        "swiglu": [(64 * 256,), (128 * 3072,)],
        "geglu": [(64 * 256,), (128 * 3072,)],
        "add_rms_norm": [(64, 256), (128, 4096)],
        "linear_cross_entropy": [(64, 64, 256), (256, 768, 50304)],
        "sum": [(64, 256)],
        "max": [(64, 256)],
        "argmax": [(64, 256)],
    },
    # The course's MNIST CNN (issue 18): conv 1 -> 32 on 28x28 and 32 -> 64 on 14x14
    # (3x3, padding 1: conv2d's bench option), each followed by relu and a 2x2 max pool,
    # hidden 128; batch 64, 256 and 1024. Plus the large layer (N 32, C 64, 56x56,
    # K 64, 3x3) for the conv ladder.
    "mnist": {
        "conv2d": [(b, 1, 28, 28, 32, 3, 3) for b in (64, 256, 1024)]
        + [(b, 32, 14, 14, 64, 3, 3) for b in (64, 256, 1024)]
        + [(32, 64, 56, 56, 64, 3, 3)],
        "max_pool2d": [(b, c, hw, hw) for b in (64, 256, 1024) for c, hw in ((32, 28), (64, 14))],
        "batch_norm2d": [(b, c, hw, hw) for b in (64, 256, 1024) for c, hw in ((32, 28), (64, 14))],
        "bn_relu_pool2d": [(b, c, hw, hw) for b in (64, 256, 1024) for c, hw in ((32, 28), (64, 14))],
        "relu": [(b * n,) for b in (64, 256, 1024) for n in (32 * 28 * 28, 64 * 14 * 14, 128)],
    },
    # Shapes of no family above (other model sizes), never tuned: where the verify run
    # measures how the default does on shapes it was not tuned at.
    "heldout": {
        "add": [(3 * 2**20 + 7,)],
        "gelu": [(4096 * 4096,)],
        "layer_norm": [(12288, 1024), (2048, 1600)],
        "rms_norm": [(8192, 5120), (2, 8192)],
        "softmax": [(2048, 32000), (12 * 512, 512)],
        "cross_entropy": [(4096, 32000), (2048, 151936)],
        "matmul": [(4096, 5120, 5120), (2, 11008, 4096), (2048, 1024, 4096)],
        "attention": [(2, 16, 2048, 128), (32, 16, 256, 64)],
        "sum": [(3000, 5000)],
        "max": [(3000, 5000)],
        "argmax": [(3000, 5000)],
    },
    # Tiny shapes of the same kinds, for the CPU (tests, `tune --family cpu-tiny`).
    "cpu-tiny": {
        "add": [(4096,), (65537,)],
        "gelu": [(4096,), (65537,)],
        "layer_norm": [(64, 256), (33, 1025)],
        "softmax": [(64, 256), (33, 1025)],
        "attention": [(1, 2, 64, 32)],
    },
}


def family_shapes(op: str, family: str | None = None) -> list[tuple]:
    """The shapes of ``op`` in ``family`` (None: every family tuned on a GPU, i.e. all
    but cpu-tiny and heldout), no repeats."""
    if family is not None and family not in FAMILIES:
        raise ValueError(f"family: unknown {family!r}; known: {', '.join(FAMILIES)}")
    names = [family] if family else [f for f in FAMILIES if f not in ("cpu-tiny", "heldout")]
    out = []
    for f in names:
        for s in FAMILIES[f].get(op, []):
            if tuple(s) not in out:
                out.append(tuple(s))
    return out


# --------------------------------------------------------------------------- shape keys

_ELEMENTWISE = {"add", "gelu", "relu", "swiglu", "geglu"}
# ops whose shape key reads two arguments (a, b / q, k / x, w)
KEY_ARGS = {"matmul": 2, "attention": 2, "conv2d": 2, "rope": 2}


def shape_key(op: str, args) -> tuple | None:
    """The shape key of a call's arguments (module docstring), None when the arguments
    are not tensors of the expected ranks (the call then takes the heuristic)."""
    try:
        x = args[0]
        if op in _ELEMENTWISE:
            return (x.numel(),)
        if op == "matmul":
            a, b = args[0], args[1]
            return (a.shape[-2], b.shape[-1], a.shape[-1])
        if op == "linear_cross_entropy":  # (N, H, V): the spec's problem shape
            return (x.numel() // x.shape[-1] if x.shape[-1] else 0, x.shape[-1], args[1].shape[0])
        if op == "attention":
            q, k = args[0], args[1]
            return (math.prod(q.shape[:-2]), q.shape[-2], k.shape[-2], q.shape[-1])
        if op == "conv2d":  # (N, C, H, W, K, R, S): the spec's problem shape
            w = args[1]
            return (*x.shape, w.shape[0], w.shape[2], w.shape[3]) if x.dim() == 4 and w.dim() == 4 else None
        if op in ("max_pool2d", "batch_norm2d", "bn_relu_pool2d"):  # (N, C, H, W)
            return tuple(x.shape) if x.dim() == 4 else None
        if op == "rope":  # (B x S tokens, q heads, k heads, head dim, rotary dim)
            k, cos = args[1], args[2]
            return (x.shape[0] * x.shape[2], x.shape[1], k.shape[1], x.shape[3], cos.shape[-1])
        d = x.shape[-1] if x.dim() else 1
        return (x.numel() // d if d else 0, d)
    except (AttributeError, IndexError, TypeError):
        return None


_OPTION_KEYS: dict[str, tuple] = {}


def _option_keys(op: str) -> tuple:
    keys = _OPTION_KEYS.get(op)
    if keys is None:
        spec = get_spec(op)
        cases = spec.bench_options
        first = cases[0] if cases else {}
        names = sorted(set().union(*cases) - set(spec.input_options))
        keys = _OPTION_KEYS[op] = tuple((k, first.get(k)) for k in names)
    return keys


def option_key(op: str, kwargs, args=None) -> str:
    """The options of a call that tables tell apart (those the op's ``bench_options``
    vary, e.g. attention's ``causal``; an omitted one takes its value in the first bench
    case), spelled as bench rows spell them (``spec.options_str``); "" for ops with none.
    The op's input options (``OpSpec.input_options``) come from ``kwargs`` (a bench row's
    options) or else from ``args`` (a call's, through ``OpSpec.input_facts``), and are
    spelled only away from their default."""
    keys = _option_keys(op)
    vals = {k: kwargs.get(k, d) for k, d in keys}
    spec = get_spec(op)
    if spec.input_options:
        facts = spec.input_facts(args) if args is not None and spec.input_facts is not None else ()
        facts = dict(zip(spec.input_options, facts))
        for k, d in spec.input_options.items():
            v = kwargs.get(k, facts.get(k, d))
            if v != d:
                vals[k] = v
    return options_str(vals) if vals else ""


def without_input_options(op: str, options: str) -> str:
    """An option key (``option_key``) less the op's input options."""
    names = get_spec(op).input_options
    if not names or not options:
        return options
    return ",".join(t for t in options.split(",") if t.split("=", 1)[0] not in names)


def option_values(op: str, kwargs) -> tuple:
    """``option_key``'s options as a tuple of their values (what the default's per-call
    choice cache keys on: no string is built on the hot path; ``()`` for ops with none)."""
    keys = _option_keys(op)
    if not keys:
        return ()
    if len(keys) == 1:
        k, d = keys[0]
        return (kwargs.get(k, d),)
    return tuple([kwargs.get(k, d) for k, d in keys])


def wants_grad(args) -> bool:
    """Whether a call with ``args`` runs a backward: grad mode on and any tensor argument
    requiring grad. Not the first alone: a network's first convolution takes images that
    need no gradient and weights that do (a choice by forward time alone can pick a conv2d
    backend whose backward is many times slower than cuDNN's)."""
    if not torch.is_grad_enabled():
        return False
    for a in args:  # (a loop, not any() over a generator: this runs on every default call)
        if isinstance(a, torch.Tensor) and a.requires_grad:
            return True
    return False


def key_of_shape(op: str, shape) -> tuple:
    """The shape key (``shape_key``) of the inputs the op's spec makes for ``shape``."""
    shape = tuple(shape)
    if op == "attention":
        if len(shape) == 3:  # (B, S, D): keyed as calls with 3-D q and k are
            b, s, d = shape
            return (b, s, s, d)
        if len(shape) == 4:
            b, h, sq, d = shape
            return (b * h, sq, sq, d)
        if len(shape) == 6:  # GQA (B, H_q, H_kv, S_q, S_k, D): keyed by q's heads, as calls are
            b, h, _, sq, sk, d = shape
            return (b * h, sq, sk, d)
        b, h, sq, sk, d = shape
        return (b * h, sq, sk, d)
    if op in _ELEMENTWISE:
        return (math.prod(shape),)
    if op == "matmul":
        return shape[-3:]
    if op in ("conv2d", "max_pool2d", "batch_norm2d", "bn_relu_pool2d"):
        return shape
    if op == "linear_cross_entropy":  # (N, H, V) or (B, T, H, V): rows, H, V as shape_key
        return (math.prod(shape[:-2]), shape[-2], shape[-1])
    own = get_spec(op).key_of_shape
    if own is not None:
        return tuple(own(shape))
    d = shape[-1]
    return (math.prod(shape) // d if d else 0, d)
