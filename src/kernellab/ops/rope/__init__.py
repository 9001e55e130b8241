"""Rotary position embedding (RoPE) of queries and keys, forward and backward (issue 41).

    neox (Hugging Face's ``apply_rotary_pos_emb``, ``rotate_half``):
        x_rot = x[..., :R] * cos + rotate_half(x[..., :R]) * sin
        rotate_half(x) = cat(-x[..., R/2:], x[..., :R/2])
    interleaved (GPT-J / Meta: pairs (x[2i], x[2i+1]), HF GPT-J's ``rotate_every_two``):
        x_rot = x[..., :R] * cos + rotate_every_two(x[..., :R]) * sin
        rotate_every_two(x)[2i] = -x[2i + 1], rotate_every_two(x)[2i + 1] = x[2i]
    out = cat(x_rot, x[..., R:])            (R = cos.shape[-1] <= D: partial rotary)

q is ``(B, H, S, D)``, k ``(B, H_k, S, D)`` with any number of heads (GQA / MQA: fewer
than q's); both rotated by the same cos / sin, in one call. cos and sin (one shape, one
dtype) are what a rotary embedding module returns: ``(S, R)``, ``(1, S, R)`` or
``(B, S, R)`` (HF's ``LlamaRotaryEmbedding``: already gathered at the position ids, cos
= cat(freqs, freqs).cos()). With ``position_ids`` ``(B, S)`` or ``(1, S)`` (int32 /
int64), cos and sin are tables ``(max_pos, R)`` and row ``position_ids[b, s]`` rotates
token s of batch b (HF's older signature, ``cos[position_ids]``). For the interleaved
layout cos / sin hold each pair's angle twice, in adjacent columns (GPT-J's
``repeat_interleave(cos, 2)``). The formula is applied as written to whatever cos and sin
hold: every column of cos / sin is read (the two halves need not be equal), so any values
give Hugging Face's answer. R must be even and at most D; columns R.. of q and k pass
through unchanged.

Dtypes: q and k fp32 / fp16 / bf16 (one dtype); cos and sin q's dtype or fp32 (HF casts
them to q's dtype; an fp32 table keeps the angles of long positions exact). Outputs in
q's dtype; the Triton kernel computes in fp32 and rounds once.

Gradients: dq and dk (the transposed rotation: the same formula with sin negated and its
halves exchanged). cos and sin take no gradient: a cos or sin that requires grad (with
grad mode on) is refused with a ValueError naming it, rather than silently given none;
pass ``cos.detach()`` (HF computes them under ``torch.no_grad``).

position_ids out of range (< 0 or >= max_pos) are refused with a ValueError naming
``position_ids``: the check reads the ids (one device-to-host copy, a synchronization on
a GPU), in eager mode. Under torch.compile it is skipped; the Triton kernel then gives NaN
for a token with a bad id (it never reads out of bounds), PyTorch's indexing asserts.

``inplace=True`` writes the rotated values into q and k and returns them (no new
memory): for inference only. Refused with a ValueError naming the argument when q or k
requires grad (with grad mode on: the in-place op has no autograd), when q and k share
storage (views of one fused qkv buffer: their rows could alias, rotate out of place), or
when q or k may overlap itself (an expanded view: one element written by several rows).
Under torch.compile, which cannot trace storages, "share storage" means views of one
tensor (``_base``).

Problem shapes (OpSpec): ``(B, H, S, D)`` -> k with H heads, R = D; ``(B, H, H_k, S, D,
R)`` -> GQA and partial rotary. cos / sin ``(1, S, R)`` unless an option set says
otherwise.
"""

from __future__ import annotations

import torch

from kernellab.core import registry
from kernellab.core.spec import (
    FLOAT_DTYPES,
    BadInput,
    Boundary,
    OpSpec,
    TensorOption,
    define,
    dtype_name,
    fuzz_dim,
    make_tensor,
)
from kernellab.ops.rope.rotation import gather_cos_sin, rotate_every_two, rotate_half

LAYOUTS = ("neox", "interleaved")
OPTIONS = ("layout", "inplace")
_INT_DTYPES = (torch.int32, torch.int64)
_OP = "rope"


# --------------------------------------------------------------------------- shapes


def parse_problem(shape) -> tuple[int, int, int, int, int, int]:
    """(B, H, H_k, S, D, R) of a problem shape (module docstring)."""
    shape = tuple(int(s) for s in shape)
    if len(shape) == 4:
        b, h, s, d = shape
        return b, h, h, s, d, d
    if len(shape) == 6:
        b, h, hk, s, d, r = shape
        if r % 2 or r > d:
            raise ValueError(f"rope problem shape {shape}: R = {r} must be even and at most D = {d}")
        return b, h, hk, s, d, r
    raise ValueError(f"rope problem shape {shape} not understood: use (B, H, S, D) or (B, H, H_k, S, D, R)")


def _flops(shape, mode, **options):
    # 3 flops per rotated element (two products, one add) forward, the same backward.
    b, h, hk, s, _, r = parse_problem(shape)
    n = b * (h + hk) * s * r * 3
    return {"fwd": n, "bwd": n, "fwdbwd": 2 * n}[mode]


def _bytes(shape, dtype, mode, **options):
    """q and k read and written once, cos and sin (1, S, R) read once; the backward the
    same with dq, dk."""
    b, h, hk, s, d, r = parse_problem(shape)
    e = torch.empty((), dtype=dtype).element_size()
    one = 2 * b * (h + hk) * s * d * e + 2 * s * r * e
    return {"fwd": one, "bwd": one, "fwdbwd": 2 * one}[mode]


def _inputs(shape, dtype, device, gen, layout="contiguous", scale=1.0):
    b, h, hk, s, d, r = parse_problem(shape)
    q = make_tensor((b, h, s, d), dtype, device, gen, layout, scale)
    k = make_tensor((b, hk, s, d), dtype, device, gen, layout, scale)
    cos = make_tensor((1, s, r), dtype, device, gen, layout, 1.0)
    sin = make_tensor((1, s, r), dtype, device, gen, layout, 1.0)
    if q is None or k is None or cos is None or sin is None:
        return None
    return q, k, cos, sin, None


def _table(rows: int, cols: int, dtype, device, gen) -> torch.Tensor:
    return torch.randn((rows, cols), generator=gen, device=device).to(dtype)


def _positions(args, dtype, device, gen):
    # ids in [0, S + 3): the tables below have S + 3 rows, and a row other than s is read
    q = args[0]
    b, s = q.shape[0], q.shape[2]
    return torch.randint(0, s + 3, (b, s), generator=gen, device=device)


def _pos_table(args, dtype, device, gen):
    return _table(args[0].shape[2] + 3, args[2].shape[-1], dtype, device, gen)


def _per_batch(args, dtype, device, gen):
    q = args[0]
    return torch.randn((q.shape[0], q.shape[2], args[2].shape[-1]), generator=gen, device=device).to(dtype)


def _two_dim(args, dtype, device, gen):
    return _table(args[0].shape[2], args[2].shape[-1], dtype, device, gen)


def _half_rotary(args, dtype, device, gen):
    # partial rotary: R = D / 2 rounded down to even (at least 2)
    q = args[0]
    r = max(2, (q.shape[-1] // 2) // 2 * 2)
    return torch.randn((1, q.shape[2], r), generator=gen, device=device).to(dtype)


def _gqa_k(args, dtype, device, gen):
    # k with one head (MQA) where q has several, else two heads where q has one
    q = args[0]
    hk = 1 if q.shape[1] > 1 else 2
    return torch.randn((q.shape[0], hk, q.shape[2], q.shape[3]), generator=gen, device=device).to(dtype)


POSITIONS = {
    "position_ids": TensorOption(_positions),
    "cos": TensorOption(_pos_table),
    "sin": TensorOption(_pos_table),
}
PER_BATCH = {"cos": TensorOption(_per_batch), "sin": TensorOption(_per_batch)}
TWO_DIM = {"cos": TensorOption(_two_dim), "sin": TensorOption(_two_dim)}
PARTIAL = {"cos": TensorOption(_half_rotary), "sin": TensorOption(_half_rotary)}
GQA = {"k": TensorOption(_gqa_k)}


# --------------------------------------------------------------------------- validation


def _bad(name: str, msg: str) -> ValueError:
    return ValueError(f"{_OP}: {name} {msg}")


def _check_tensor(name, t, devices, dtypes) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{_OP}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.layout is not torch.strided:
        raise TypeError(f"{_OP}: {name} has layout {t.layout}; only strided (dense) tensors are supported")
    if t.dtype not in dtypes:
        allowed = ", ".join(dtype_name(d) for d in dtypes)
        raise TypeError(f"{_OP}: {name} has dtype {t.dtype}; expected one of {allowed}")
    if t.device.type not in devices:
        runs = " or ".join(devices)
        raise ValueError(f"{_OP}: {name} is on {t.device}, but this backend runs on {runs} tensors only")


def may_self_overlap(t: torch.Tensor) -> bool:
    """Whether two elements of ``t`` may share a memory location: False only when, with
    the dims of more than one element sorted by stride, each stride exceeds the span of
    the smaller ones (a sufficient condition for distinct addresses)."""
    dims = sorted((st, sz) for st, sz in zip(t.stride(), t.shape) if sz > 1)
    span = 0
    for st, sz in dims:
        if st <= span:
            return True
        span += st * (sz - 1)
    return False


def validate(args, kwargs, devices=("cuda", "cpu"), dtypes=FLOAT_DTYPES) -> None:
    """Every backend's argument checks (module docstring), each error naming the argument."""
    if len(args) not in (4, 5):
        raise TypeError(
            f"rope() takes 4 or 5 tensor arguments (q, k, cos, sin, position_ids), got {len(args)}"
        )
    for key in kwargs:
        if key not in OPTIONS:
            raise TypeError(f"rope() got an unexpected keyword argument {key!r}")
    q, k, cos, sin = args[:4]
    pos = args[4] if len(args) == 5 else None
    layout = kwargs.get("layout", "neox")
    if layout not in LAYOUTS:
        raise ValueError(f"{_OP}: layout must be one of {', '.join(map(repr, LAYOUTS))}, got {layout!r}")
    inplace = kwargs.get("inplace", False)
    if not isinstance(inplace, bool):
        raise TypeError(f"{_OP}: inplace must be a bool, got {type(inplace).__name__}")
    _check_tensor("q", q, devices, dtypes)
    _check_tensor("k", k, devices, dtypes)
    # cos / sin: q's dtype or fp32 (float64 with the reference backends' float64 q)
    _check_tensor("cos", cos, devices, dtypes)
    _check_tensor("sin", sin, devices, dtypes)
    if q.dim() != 4:
        raise _bad("q", f"must be 4-D (B, H, S, D), got shape {tuple(q.shape)}")
    if k.dim() != 4:
        raise _bad("k", f"must be 4-D (B, H_k, S, D), got shape {tuple(k.shape)}")
    for name, t in (("k", k), ("cos", cos), ("sin", sin)):
        if t.device != q.device:
            raise _bad(name, f"is on {t.device} but q is on {q.device}")
    if k.dtype != q.dtype:
        raise TypeError(f"{_OP}: k has dtype {k.dtype} but q has {q.dtype}; they must match")
    if cos.dtype not in (q.dtype, torch.float32):
        raise TypeError(f"{_OP}: cos has dtype {cos.dtype}; expected q's dtype ({q.dtype}) or float32")
    if sin.dtype != cos.dtype:
        raise TypeError(f"{_OP}: sin has dtype {sin.dtype} but cos has {cos.dtype}; they must match")
    b, _, s, d = q.shape
    if k.shape[0] != b or k.shape[2] != s:
        raise _bad(
            "k", f"has shape {tuple(k.shape)}; its batch and sequence dims must match q's {tuple(q.shape)}"
        )
    if k.shape[3] != d:
        raise _bad("k", f"has head dim {k.shape[3]} but q has {d}; they must match")
    if sin.shape != cos.shape:
        raise _bad("sin", f"has shape {tuple(sin.shape)} but cos has {tuple(cos.shape)}; they must match")
    r = cos.shape[-1] if cos.dim() else 0
    if pos is None:
        ok = cos.dim() == 2 and cos.shape[0] == s
        ok = ok or (cos.dim() == 3 and cos.shape[0] in (1, b) and cos.shape[1] == s)
        if not ok:
            raise _bad(
                "cos",
                f"has shape {tuple(cos.shape)}; expected (S, R), (1, S, R) or (B, S, R) with B = {b}, "
                f"S = {s} "
                "(or pass position_ids with a (max_pos, R) table)",
            )
    else:
        if not isinstance(pos, torch.Tensor):
            raise TypeError(f"{_OP}: position_ids must be a torch.Tensor or None, got {type(pos).__name__}")
        if pos.dtype not in _INT_DTYPES:
            raise TypeError(f"{_OP}: position_ids has dtype {pos.dtype}; expected int32 or int64")
        if pos.layout is not torch.strided:
            raise TypeError(
                f"{_OP}: position_ids has layout {pos.layout}; only strided tensors are supported"
            )
        if pos.device != q.device:
            raise _bad("position_ids", f"is on {pos.device} but q is on {q.device}")
        if pos.dim() != 2 or pos.shape[0] not in (1, b) or pos.shape[1] != s:
            raise _bad(
                "position_ids",
                f"has shape {tuple(pos.shape)}; expected (B, S) or (1, S) with B = {b}, S = {s}",
            )
        if cos.dim() != 2:
            raise _bad(
                "cos", f"has shape {tuple(cos.shape)}; with position_ids it must be a (max_pos, R) table"
            )
        if pos.numel() and not torch.compiler.is_compiling():
            lo, hi = int(pos.min()), int(pos.max())
            if lo < 0 or hi >= cos.shape[0]:
                raise _bad(
                    "position_ids",
                    f"holds ids from {lo} to {hi}; the cos / sin tables have {cos.shape[0]} rows "
                    f"(ids 0 .. {cos.shape[0] - 1})",
                )
    if r % 2:
        raise _bad("cos", f"has rotary dim {r} (last dim); it must be even (pairs of columns are rotated)")
    if r > d:
        raise _bad("cos", f"has rotary dim {r} (last dim) but q's head dim is {d}; it must be at most D")
    if torch.is_grad_enabled():
        for name, t in (("cos", cos), ("sin", sin)):
            if t.requires_grad:
                raise _bad(
                    name,
                    "requires grad; rope gives no gradient for cos / sin: pass it detached (cos.detach()), "
                    "as Hugging Face computes it under torch.no_grad()",
                )
    if inplace:
        if torch.is_grad_enabled():
            for name, t in (("q", q), ("k", k)):
                if t.requires_grad:
                    raise _bad(
                        name,
                        "requires grad; inplace=True has no autograd (rotate out of place, or under no_grad)",
                    )
        if q.numel() and k.numel() and _share_storage(q, k):
            raise _bad(
                "k",
                "shares storage with q (views of one buffer, e.g. a fused qkv projection); inplace=True "
                "refuses them because their elements could alias: rotate out of place",
            )
        for name, t in (("q", q), ("k", k)):
            if may_self_overlap(t):
                raise _bad(
                    name,
                    f"may overlap itself (strides {t.stride()}, e.g. expanded); inplace=True would write one "
                    "element from several rows",
                )


def _share_storage(q: torch.Tensor, k: torch.Tensor) -> bool:
    """Whether q and k are views of one storage: its pointer in eager mode; under
    torch.compile, which cannot trace storages, the tensors the views were taken of."""
    if torch.compiler.is_compiling():
        qb = q if q._base is None else q._base
        kb = k if k._base is None else k._base
        return qb is kb
    return q.untyped_storage().data_ptr() == k.untyped_storage().data_ptr()


validate.checks_layouts = True  # (layout_checking: every tensor's layout is checked above)


# --------------------------------------------------------------------------- reference








def rope_reference(q, k, cos, sin, position_ids=None, layout="neox", inplace=False):
    """HF's formula (module docstring) in the inputs' dtype (float64 in checks)."""
    c, s = gather_cos_sin(q, cos, sin, position_ids)
    rot = rotate_half if layout == "neox" else rotate_every_two
    r = c.shape[-1]

    def one(x):
        xr = x[..., :r]
        return torch.cat((xr * c + rot(xr) * s, x[..., r:]), dim=-1)

    return one(q), one(k)


# --------------------------------------------------------------------------- spec


def _fuzz(rng, big: bool):
    d = 2 * fuzz_dim(rng, 1, 128 if big else 40)
    r = 2 * fuzz_dim(rng, 1, d // 2) if rng.random() < 0.3 else d
    h = fuzz_dim(rng, 1, 32 if big else 4)
    hk = h if rng.random() < 0.5 else fuzz_dim(rng, 1, h)
    s = fuzz_dim(rng, 1, 4096 if big else 40)
    b = fuzz_dim(rng, 1, 8 if big else 3)
    return (b, h, hk, s, d, r), None


def _args(device, dtype, b=1, h=2, hk=2, s=3, d=8, r=8):
    gen = torch.Generator(device=device).manual_seed(0)
    return list(_inputs((b, h, hk, s, d, r), dtype, device, gen))


def _replaced(a, changes: dict, options=None):
    """The sample arguments ``a`` with those at ``changes``' positions replaced."""
    for i, t in changes.items():
        a[i] = t
    return tuple(a), options or {}


def _bad_head_dim(device, dtype):
    return _replaced(_args(device, dtype), {1: torch.randn(1, 2, 3, 6, device=device).to(dtype)})


def _bad_odd_rotary(device, dtype):
    a = _args(device, dtype)
    return _replaced(a, {2: a[2][..., :7], 3: a[3][..., :7]})


def _bad_rotary_too_wide(device, dtype):
    a = _args(device, dtype)
    return _replaced(a, dict.fromkeys((2, 3), torch.randn(1, 3, 10, device=device).to(dtype)))


def _bad_cos_seq(device, dtype):
    a = _args(device, dtype)
    return _replaced(a, dict.fromkeys((2, 3), torch.randn(1, 4, 8, device=device).to(dtype)))


def _bad_sin_shape(device, dtype):
    return _replaced(_args(device, dtype), {3: torch.randn(3, 8, device=device).to(dtype)})


def _bad_cos_dtype(device, dtype):
    a = _args(device, dtype)
    return _replaced(a, {2: a[2].to(torch.int32)})


def _bad_sin_dtype(device, dtype):
    a = _args(device, torch.float32)
    return _replaced(a, {3: a[3].half()})


def _bad_k_dtype(device, dtype):
    a = _args(device, torch.float32)
    return _replaced(a, {1: a[1].half()})


def _bad_k_batch(device, dtype):
    return _replaced(_args(device, dtype), {1: torch.randn(2, 2, 3, 8, device=device).to(dtype)})


def _bad_q_rank(device, dtype):
    a = _args(device, dtype)
    return _replaced(a, {0: a[0][0]})


def _bad_positions(lo_hi, dt=torch.int64, shape=None):
    def build(device, dtype):
        a = _args(device, dtype)
        a[2] = a[3] = torch.randn(5, 8, device=device).to(dtype)
        pos = torch.tensor([[0, 1, lo_hi]], device=device, dtype=dt)
        a[4] = pos if shape is None else pos.reshape(shape)
        return tuple(a), {}

    return build


def _bad_positions_table(device, dtype):
    return _replaced(_args(device, dtype), {4: torch.tensor([[0, 1, 2]], device=device)})


def _bad_layout(device, dtype):
    return tuple(_args(device, dtype)), {"layout": "gptj"}


def _bad_cos_grad(device, dtype):
    a = _args(device, dtype)
    return _replaced(a, {2: a[2].detach().requires_grad_(True)})


def _bad_inplace_grad(device, dtype):
    a = _args(device, dtype)
    return _replaced(a, {0: a[0].detach().requires_grad_(True)}, {"inplace": True})


def _bad_inplace_shared(device, dtype):
    a = _args(device, dtype)
    qkv = torch.randn(1, 3, 3, 2, 8, device=device).to(dtype)  # (B, S, 3, H, D)
    return _replaced(a, {0: qkv[:, :, 0].transpose(1, 2), 1: qkv[:, :, 1].transpose(1, 2)}, {"inplace": True})


def _bad_inplace_expanded(device, dtype):
    a = _args(device, dtype)
    k = torch.randn(1, 1, 1, 8, device=device).to(dtype).expand(1, 2, 3, 8)
    return _replaced(a, {1: k}, {"inplace": True})


def _unknown_option(device, dtype):
    return tuple(_args(device, dtype)), {"interleaved": True}


def _key_of_shape(shape) -> tuple:
    """The shape key of a problem shape: (B x S tokens, H_q, H_k, D, R), as a call's."""
    b, h, hk, s, d, r = parse_problem(shape)
    return (b * s, h, hk, d, r)


SPEC = define(
    OpSpec(
        name="rope",
        problem_ranks=(4, 6), problem_dims="(B, H, S, D) or (B, H, H_k, S, D, R)",
        arg_names=("q", "k", "cos", "sin", "position_ids"),
        key_of_shape=_key_of_shape,
        reference=rope_reference,
        flops=_flops,
        bytes_moved=_bytes,
        test_shapes=[
            (1, 1, 1, 2),
            (1, 1, 0, 8),
            (0, 2, 3, 8),
            (2, 3, 17, 64),
            (1, 4, 1, 2, 128, 128),
            (2, 4, 2, 9, 80, 40),
            (1, 2, 2, 5, 256, 64),
            (3, 5, 1, 33, 24, 16),
            (1, 1, 1, 1025, 8, 8),
        ],
        quick_shapes=[(1, 1, 1, 2), (1, 1, 0, 8), (2, 3, 17, 64), (2, 4, 2, 9, 80, 40)],
        bench_shapes=[(4, 32, 8, 2048, 128, 128), (8, 12, 12, 1024, 64, 64), (1, 32, 8, 8192, 128, 128)],
        cpu_bench_shapes=[(1, 4, 2, 64, 64, 64), (2, 8, 2, 128, 128, 128)],
        layout_shape=(2, 3, 2, 5, 16, 16),
        reach_shape=(1, 2, 1, 3, 8, 8),
        grad_args=(0, 1),
        grad_outputs=2,  # dq through q_rot, dk through k_rot
        grad_shapes=[(2, 3, 2, 5, 16, 16), (1, 2, 1, 7, 12, 8)],
        bad_shape=(1, 2, 2, 3, 8, 8),
        rows_shape=(1, 1, 1, 65537, 2, 2),
        rows_shape_interpreted=False,  # (the Triton kernel takes a program per token)
        dtypes=FLOAT_DTYPES,
        doc=__doc__.strip().split("\n")[0],
        inputs=_inputs,
        validator=validate,
        option_sets=[
            POSITIONS,
            {"layout": "interleaved"},
            PER_BATCH,
            TWO_DIM,
            PARTIAL,
            GQA,
            {**POSITIONS, "layout": "interleaved"},
            {**PARTIAL, "layout": "interleaved"},
        ],
        boundary_cases=[
            # a head dim past one tile of the kernel's columns, partial rotary with a
            # pass-through wider than the rotated part, GQA, positions and interleaving at once
            Boundary((1, 4, 1, 5, 256, 256)),
            Boundary((2, 3, 1, 4, 96, 32), {"layout": "interleaved"}),
            Boundary((2, 4, 2, 6, 40, 24), POSITIONS),
            Boundary((2, 4, 2, 6, 40, 24), {**POSITIONS, "layout": "interleaved"}),
            Boundary((3, 2, 2, 7, 16, 16), PER_BATCH),
        ],
        fuzz=_fuzz,
        extra_bad_inputs=[
            BadInput("k head dim differs from q's", _bad_head_dim, "k"),
            BadInput("odd rotary dim", _bad_odd_rotary, "cos"),
            BadInput("rotary dim wider than the head dim", _bad_rotary_too_wide, "cos"),
            BadInput("cos with the wrong sequence length", _bad_cos_seq, "cos"),
            BadInput("sin shape differs from cos", _bad_sin_shape, "sin"),
            BadInput("integer cos", _bad_cos_dtype, "cos"),
            BadInput("sin dtype differs from cos", _bad_sin_dtype, "sin"),
            BadInput("k dtype differs from q", _bad_k_dtype, "k"),
            BadInput("k batch differs from q", _bad_k_batch, "k"),
            BadInput("3-D q", _bad_q_rank, "q"),
            BadInput("position id past the table", _bad_positions(5), "position_ids"),
            BadInput("negative position id", _bad_positions(-1), "position_ids"),
            BadInput("float position_ids", _bad_positions(2, torch.float32), "position_ids"),
            BadInput("position_ids of the wrong shape", _bad_positions(2, shape=(3,)), "position_ids"),
            BadInput("position_ids with a (1, S, R) cos", _bad_positions_table, "cos"),
            BadInput("unknown layout", _bad_layout, "layout"),
            BadInput("cos requires grad", _bad_cos_grad, "cos"),
            BadInput("inplace on q that requires grad", _bad_inplace_grad, "q"),
            BadInput("inplace on views of one qkv buffer", _bad_inplace_shared, "k"),
            BadInput("inplace on an expanded k", _bad_inplace_expanded, "k"),
            BadInput("unknown keyword", _unknown_option, "interleaved"),
        ],
    )
)


def rope(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    position_ids: torch.Tensor | None = None,
    *,
    layout: str = "neox",
    inplace: bool = False,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(q_rot, k_rot): q and k rotated by cos / sin (module docstring) with the chosen
    backend (default: the fastest available here)."""
    if inplace is not False:  # True, or a value the validator refuses (naming inplace)
        return registry.call(_OP, backend, q, k, cos, sin, position_ids, layout=layout, inplace=inplace)
    if layout != "neox":
        return registry.call(_OP, backend, q, k, cos, sin, position_ids, layout=layout)
    return registry.call(_OP, backend, q, k, cos, sin, position_ids)


from kernellab.ops.rope import reference as _reference  # noqa: E402,F401  (registrations)
from kernellab.ops.rope import triton as _triton  # noqa: E402,F401
