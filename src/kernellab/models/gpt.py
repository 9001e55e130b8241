"""A GPT-2-style model whose ops come from kernellab's registry, and its training loop.

Pre-LN blocks (layer_norm -> causal attention -> residual add, layer_norm -> linear ->
GeLU(tanh) -> linear -> residual add), learned positions, a final layer_norm and a head
tied to the token embedding, as GPT-2. Each op is a named slot filled from an op set:

- ``"pytorch"``: PyTorch's own ops (F.layer_norm, F.gelu, SDPA, +, F.cross_entropy,
  F.linear): the baseline, same weights, same math.
- a kernellab backend name (``"triton"``, ``"cuda"``, ...) or ``None`` (kernellab's default
  per op) for layer_norm, gelu, attention, add and cross_entropy; the linear layers stay
  on cuBLAS (F.linear) unless ``matmul=`` names a kernellab matmul backend.
- a dict op -> backend for anything finer (keys: ln, gelu, attn, add, ce, linear; the
  value ``"pytorch"`` keeps PyTorch's op for that slot).

Training: AdamW (fused on a GPU), modes ``eager``, ``compile`` (torch.compile of forward +
loss; the optimizer stays eager), ``compile-cudagraphs`` (mode="reduce-overhead": Inductor's
CUDA graphs of the forward and the backward, the optimizer eager) and ``compile-step-graph``
(GPU only: the compiled forward + loss, the backward and a capturable fused AdamW captured
as one CUDA graph of the whole step, PyTorch's "whole-network capture"; each step copies
its batch in and replays it, so the step costs its device time plus one graph launch).
"""

from __future__ import annotations

import math
import statistics
import time
import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

import kernellab
from kernellab import optim
from kernellab.harness import timer

MODES = ("eager", "compile", "compile-cudagraphs", "compile-step-graph")
# The optimizer of a Trainer: PyTorch's AdamW (fused on a GPU) or kernellab.optim.AdamW
# through one of its backends (the same math; a lighter host path).
OPTIMIZERS = ("pytorch", *optim.ADAMW_BACKENDS)
SLOTS = ("ln", "gelu", "attn", "add", "ce", "linear")


@dataclass(frozen=True)
class Config:
    vocab: int
    ctx: int
    dim: int
    layers: int
    heads: int


CONFIGS = {
    "gpt2": Config(vocab=50304, ctx=1024, dim=768, layers=12, heads=12),  # 124M
    "tiny": Config(vocab=256, ctx=64, dim=64, layers=2, heads=2),
}


def _torch_ops() -> dict:
    return dict(
        ln=lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b),
        gelu=lambda x: F.gelu(x, approximate="tanh"),
        attn=lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        add=lambda a, b: a + b,
        ce=F.cross_entropy,
        linear=F.linear,
    )


def _kl_op(slot: str, be):
    if slot == "ln":
        return lambda x, w, b: kernellab.layer_norm(x, w, b, backend=be)
    if slot == "gelu":
        return lambda x: kernellab.gelu(x, backend=be)
    if slot == "attn":
        return lambda q, k, v: kernellab.attention(q, k, v, causal=True, backend=be)
    if slot == "add":
        return lambda a, b: kernellab.add(a, b, backend=be)
    if slot == "ce":
        return lambda logits, t: kernellab.cross_entropy(logits, t, backend=be)

    def linear(x, w, b=None):  # kernellab.matmul takes [M, K] @ [K, N]
        y = kernellab.matmul(x.reshape(-1, x.shape[-1]), w.t(), b, backend=be)
        return y.view(*x.shape[:-1], w.shape[0])

    return linear


def op_set(backends="pytorch", matmul="pytorch") -> dict:
    """The op slots of the model (see the module docstring)."""
    if isinstance(backends, dict):
        unknown = set(backends) - set(SLOTS)
        if unknown:
            raise ValueError(f"backends: unknown op slots {sorted(unknown)}; slots are {SLOTS}")
        chosen = dict(backends)
    elif backends == "pytorch":
        return _slot_ops({})
    else:
        chosen = {s: backends for s in SLOTS if s != "linear"}
        chosen["linear"] = matmul
    for slot, be in chosen.items():
        if be == "pytorch":
            continue
        if be is not None and not isinstance(be, str):
            raise TypeError(f"backends: {slot} must be a backend name, 'pytorch' or None, got {be!r}")
        op = {"ln": "layer_norm", "attn": "attention", "ce": "cross_entropy", "linear": "matmul"}.get(
            slot, slot
        )
        if be is not None:
            kernellab.get(op, be)  # KeyError naming the registered backends
    # Attention backends that fold [B, H] into one dimension would copy q, k and v permuted
    # out of the fused qkv projection in their forward and again in their backward (2.7 ms
    # of copy kernels per step in the GPT-2 8x1024 eager profile): one copy instead. The
    # Triton backend takes batch and head strides and reads the projection in place
    # (_slot_ops sets "qkv_contiguous").
    return _slot_ops(chosen)


# --------------------------------------------------------------------------- fused blocks
#
# Eager mode: each kernellab op is a Python autograd node, and a Python node costs far
# more host time per forward+backward than PyTorch's C++ node running the same kernels.
# A GPT-2 step has 74 such nodes, a large share of a small step's time. So, as llm.c does,
# the transformer blocks run under ONE autograd node whose backward is written out by hand:
# the ops' launchers are called
# through ``forward_saving`` / ``backward_from`` (the op kit's node-free entry points),
# the linear layers through cuBLAS (addmm / mm) as nn.Linear does. Same kernels, same
# math and saved tensors as the per-op graph; ~40 launches per block and one node for all.
# torch.compile traces the per-op path instead (Inductor sees our Triton ops there).

_FUSABLE = {"ln": "layer_norm", "gelu": "gelu", "add": "add", "attn": "attention"}


def fused_kernels(chosen: dict, device: str):
    """The node-free entry points of the block's ops for ``chosen`` (slot -> backend), or
    None when the model must run op by op: a slot's backend has no node-free entry point,
    the linear layers are not PyTorch's (cuBLAS), or ``chosen`` is empty (the "pytorch"
    op set: PyTorch's own model is the baseline and runs as PyTorch runs it). PyTorch's
    op in a slot (``"pytorch"`` / ``"torch"``) runs through ``kernellab.ops.aten``'s entry
    points, the same kernels without their autograd nodes: the default may put PyTorch's
    kernel in every slot at a shape (GPT-2 at 4x256) and still run the blocks under one
    node with their CUDA graphs. ``None`` slots must have been resolved
    (``resolve_defaults``); an unresolved one takes the op's heuristic default."""
    from kernellab.core import registry
    from kernellab.ops import aten

    if not chosen or chosen.get("linear", "pytorch") not in ("pytorch", "torch"):
        return None
    out = {}
    for slot, op in _FUSABLE.items():
        be = chosen.get(slot, "pytorch")
        if be in ("pytorch", "torch"):
            out[slot] = aten.ENTRIES[op]
            continue
        fn = registry.get(op, be if be is not None else registry.default_backend(op, device)).fn
        if not hasattr(fn, "forward_saving"):
            return None
        out[slot] = fn
    return out


def _slot_keys(cfg: Config, b: int, t: int) -> dict:
    """Per slot: (op, the tuning table's shape keys of the model's calls, options)."""
    d, n = cfg.dim, b * t
    return {
        "ln": ("layer_norm", [(n, d)], ""),
        "gelu": ("gelu", [(n * 4 * d,)], ""),
        "add": ("add", [(n * d,)], ""),
        "attn": ("attention", [(b * cfg.heads, t, t, d // cfg.heads)], "causal=True"),
        "ce": ("cross_entropy", [(n, cfg.vocab)], ""),
        "linear": ("matmul", [(n, 3 * d, d), (n, d, d), (n, 4 * d, d), (n, d, 4 * d), (n, cfg.vocab, d)], ""),
    }


def _inductor_launches(backend: str) -> bool:
    """Whether Inductor launches this backend's kernels itself under torch.compile:
    PyTorch's ops (it fuses them) and ours in Triton (registered with triton_op). A CUDA
    C++ or peer backend stays an opaque custom op, launched through its Python launcher at
    every step."""
    return backend == "torch" or backend == "triton" or backend.startswith("triton_")


def resolve_defaults(
    chosen: dict, cfg: Config, b: int, t: int, dtype: torch.dtype, device: str, compiling: bool = False
) -> dict:
    """``chosen`` with its None slots (kernellab's default) resolved at this model's shapes.

    The model pays host cost once per step, not once per op (eager: its blocks run under
    one autograd node and replay CUDA graphs of themselves; compile: Inductor launches the
    kernels), so a slot's default is the fastest by the tuning table's DEVICE time at the
    model's shape (``registry.choose_key(by="device")``), where a standalone call's default
    weighs its loop time too. The block's slots choose among backends with node-free
    entry points (ours, and PyTorch's through ``kernellab.ops.aten``). PyTorch's op chosen
    -> the slot calls PyTorch's op itself (``"pytorch"``). The linear layers: cuBLAS
    (``"pytorch"``) when the table picks PyTorch's matmul at every linear shape of the
    model, else kernellab.matmul's per-call default (None).

    ``compiling`` (the model traced by torch.compile): every slot chooses among backends
    Inductor launches itself (``_inductor_launches``): a backend with a launcher of its
    own adds that launcher's host time to every step, which a host-bound compiled step
    (GPT-2 4 x 256) pays in full."""
    from kernellab.core import registry

    out = dict(chosen)
    for slot, (op, keys, opts) in _slot_keys(cfg, b, t).items():
        if slot not in chosen or chosen[slot] is not None:
            continue
        among = None
        if slot in _FUSABLE:
            among = ("torch",) + tuple(
                i.backend for i in registry.impls(op) if hasattr(i.fn, "forward_saving") and i.why_unavailable(device) is None
            )
        if compiling:
            among = tuple(
                be for be in (among or ("torch",) + tuple(i.backend for i in registry.impls(op)))
                if _inductor_launches(be)
            )  # fmt: skip
        picks = set()
        for k in keys:
            pick, why = registry.choose_key(op, k, dtype, device, "fwdbwd", opts, by="device", among=among)
            if why.startswith("heuristic"):  # no fwdbwd row (add's backward is dy itself): the forward's
                pick = registry.choose_key(op, k, dtype, device, "fwd", opts, by="device", among=among)[0]
            if compiling and not _inductor_launches(pick):  # a heuristic's pick (no table row)
                pick = "triton" if "triton" in among else "torch"
            picks.add(pick)
        if picks == {"torch"}:
            out[slot] = "pytorch"
        elif len(picks) == 1:
            out[slot] = picks.pop()
        else:
            out[slot] = None  # per call: registry.call's own default at each shape
    return out


@torch._dynamo.assume_constant_result
def _resolved_items(items: tuple, cfg: tuple, b: int, t: int, dtype: str, device: str) -> tuple:
    # Under torch.compile the resolution runs once at trace time; its result is a constant
    # of the graph (Dynamo does not trace the table lookup). Plain ints and strings in:
    # Dynamo (torch 2.11) cannot reconstruct a frozen dataclass or a dtype argument here.
    dt = getattr(torch, dtype.removeprefix("torch."))
    return tuple(sorted(resolve_defaults(dict(items), Config(*cfg), b, t, dt, device, compiling=True).items()))


def _slot_ops(chosen: dict) -> dict:
    """The op callables of a resolved ``chosen`` (slot -> backend / "pytorch" / None)."""
    ops = _torch_ops()
    for slot, be in chosen.items():
        if be != "pytorch":
            ops[slot] = _kl_op(slot, be)
    ops["qkv_contiguous"] = chosen.get("attn", "pytorch") not in ("pytorch", "triton", None)
    ops["chosen"] = chosen
    # A residual add and the layer norm that reads the sum in one op where the norm's
    # backend has one and the add is ours too (Triton: one kernel each way; under
    # torch.compile a triton_op, where PyTorch's compiled step fuses its own add into its
    # norm kernel).
    ops["ln_add"] = None
    ln_be, add_be = chosen.get("ln", "pytorch"), chosen.get("add", "pytorch")
    if ln_be not in ("pytorch", None) and add_be != "pytorch":
        fused = getattr(kernellab.get("layer_norm", ln_be).fn, "add_layer_norm", None)
        if fused is not None:
            ops["ln_add"] = lambda x, r, w, b: fused(x, r, w, b, 1e-5)
    return ops


_mm, _linear = torch.mm, F.linear


def _linear_bwd(dy, x, w, want_bias: bool):
    """Gradients of y = x @ w.T + b for 2-D x, dy: (dx, dw, db). (Each torch call costs
    ~10-20 us of host time: mm directly, not the matmul dispatcher.)"""
    return _mm(dy, w), _mm(dy.t(), x), (dy.sum(0) if want_bias else None)


def _ln_add(k, x, r, w, b):
    """(layer_norm(x + r), x + r, saved): one kernel where the layer_norm backend has one
    (Triton: add_forward_saving), else the add then the norm."""
    fused = getattr(k["ln"], "add_forward_saving", None)
    if fused is not None:
        return fused(x, r, w, b, 1e-5)
    h, _ = k["add"].forward_saving(x, r)
    y, s = k["ln"].forward_saving(h, w, b, 1e-5)
    return y, h, s


def _ln_add_bwd(k, saved, dy, dres):
    """(the norm's dx + dres, dweight, dbias): the gradient of a residual sum x + r that a
    layer norm reads, with the residual stream's own gradient ``dres`` added."""
    fused = getattr(k["ln"], "add_backward_from", None)
    if fused is not None:
        return fused(saved, dy, dres)
    dx, dw, db = k["ln"].backward_from(saved, dy)[:3]
    return k["add"].forward_saving(dres, dx)[0], dw, db


def _block_fwd(x2, r, p, k, b, t, heads):
    """One pre-LN transformer block (Block.forward is the same math op by op) with no
    autograd node: its input is x2 + r (r None: x2), [B*T, D] contiguous, p its 12
    parameters; returns ((x1, m), saved), the block's output being x1 + m unsummed: the
    next block's first norm adds them in its own kernel (_ln_add)."""
    ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, fc2_w, fc2_b = p
    d = x2.shape[1]
    hd = d // heads
    if r is None:
        y1, s_ln1 = k["ln"].forward_saving(x2, ln1_w, ln1_b, 1e-5)
    else:
        y1, x2, s_ln1 = _ln_add(k, x2, r, ln1_w, ln1_b)
    qkv = _linear(y1, qkv_w, qkv_b)
    # q, k, v as [B, H, T, hd] views of the projection: the kernels take batch and head
    # strides, so nothing is copied; o comes back in [B, T, H, hd] memory order.
    q, kk, v = qkv.view(b, t, 3, heads, hd).permute(2, 0, 3, 1, 4).unbind(0)
    o, s_att = k["attn"].forward_saving(q, kk, v, True, 1.0 / math.sqrt(hd))
    a = o.transpose(1, 2).reshape(b * t, d)  # a view when o is [B, T, H, hd] in memory
    y2, x1, s_ln2 = _ln_add(k, x2, _linear(a, proj_w, proj_b), ln2_w, ln2_b)
    h = _linear(y2, fc_w, fc_b)
    g, s_gelu = k["gelu"].forward_saving(h)
    m = _linear(g, fc2_w, fc2_b)
    return (x1, m), (y1, a, y2, g, qkv_w, proj_w, fc_w, fc2_w, s_ln1, s_att, s_ln2, s_gelu)


def _block_bwd(dout, saved, k, b, t, heads):
    """(dx, the 12 parameter gradients) of ``_block_fwd`` from its saved tuple; dout
    [B*T, D] contiguous, the gradient of the block's output x1 + m (so of x1 and m both);
    dx is the gradient of its input x2 + r (so of x2 and r both)."""
    y1, a, y2, g, qkv_w, proj_w, fc_w, fc2_w, s_ln1, s_att, s_ln2, s_gelu = saved
    d = dout.shape[1]
    hd = d // heads
    dg, dfc2_w, dfc2_b = _linear_bwd(dout, g, fc2_w, True)
    (dh,) = k["gelu"].backward_from(s_gelu, dg)
    dy2, dfc_w, dfc_b = _linear_bwd(dh, y2, fc_w, True)
    dx1, dln2_w, dln2_b = _ln_add_bwd(k, s_ln2, dy2, dout)
    da, dproj_w, dproj_b = _linear_bwd(dx1, a, proj_w, True)
    do = da.view(b, t, heads, hd).transpose(1, 2)
    into = getattr(k["attn"], "backward_into", None)
    if into is not None:  # dq, dk, dv written straight into the qkv projection's layout
        dqkv = torch.empty((b, t, 3, heads, hd), dtype=da.dtype, device=da.device)
        into(s_att, do, *dqkv.permute(2, 0, 3, 1, 4).unbind(0))
        dqkv = dqkv.view(b * t, 3 * d)
    else:
        dq, dk, dv = k["attn"].backward_from(s_att, do)[:3]
        # [3 x B, H, T, hd] -> [B*T, 3D] in the qkv projection's layout: one copy.
        dqkv = torch.stack((dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)), dim=2)
        dqkv = dqkv.view(b * t, 3 * d)
    dy1, dqkv_w, dqkv_b = _linear_bwd(dqkv, y1, qkv_w, True)
    dx, dln1_w, dln1_b = _ln_add_bwd(k, s_ln1, dy1, dx1)
    grads = (dln1_w, dln1_b, dqkv_w, dqkv_b, dproj_w, dproj_b, dln2_w, dln2_b, dfc_w, dfc_b, dfc2_w, dfc2_b)
    return dx, grads


_PER_BLOCK = 12  # parameters per block, in _block_fwd's order


def _blocks_fwd(x2, k, heads, params, b, t):
    """Every block's forward from x2 [B*T, D] contiguous: (out [B*T, D], saved list)."""
    h, r = x2, None
    saved = []
    for i in range(0, len(params), _PER_BLOCK):
        (h, r), s = _block_fwd(h, r, params[i : i + _PER_BLOCK], k, b, t, heads)
        saved.append(s)
    if r is not None:
        h, _ = k["add"].forward_saving(h, r)
    return h, saved


def _blocks_bwd(dout, saved, k, heads, b, t):
    """(dx [B*T, D], the parameters' gradients flat, in _block_params' order)."""
    dx, grads = dout, []
    for s in reversed(saved):
        dx, g = _block_bwd(dx, s, k, b, t, heads)
        grads.append(g)
    return dx, [gr for g in reversed(grads) for gr in g]


class _Plan:
    """The block stack's forward and backward captured as two CUDA graphs for one key
    (shape, dtype, the parameters' addresses): a step then costs two graph replays and a
    few copies of host time instead of ~60 torch calls and ~15 kernel launches per block
    (more host time per block fwd+bwd than PyTorch's whole block).

    Buffers the graphs read and write are fixed: the input and dout are copied in; the
    output, dx and the gradients are copied out (one flat copy for all gradients), so
    nothing the caller holds is overwritten by a later replay. The activations the
    backward needs live in the graphs' pool between a forward and its backward: a second
    forward while an earlier one still awaits its backward runs without the graphs (see
    ``_Blocks``), and a backward whose activations were overwritten since is refused."""

    def __init__(self, x2, k, heads, params, b, t):
        self.x = x2.clone()
        self.dout = torch.zeros_like(x2)
        self.params = params  # keeps the captured addresses alive
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the capture (PyTorch's recipe)
            out, saved = _blocks_fwd(self.x, k, heads, params, b, t)
            _blocks_bwd(self.dout, saved, k, heads, b, t)
            del out, saved
        torch.cuda.current_stream().wait_stream(side)
        pool = torch.cuda.graph_pool_handle()
        self.fwd_graph, self.bwd_graph = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.fwd_graph, pool=pool):
            self.out, self.saved = _blocks_fwd(self.x, k, heads, params, b, t)
        with torch.cuda.graph(self.bwd_graph, pool=pool):
            self.dx, grads = _blocks_bwd(self.dout, self.saved, k, heads, b, t)
            self.flat = torch.cat([g.reshape(-1) for g in grads])
        self.sizes = [g.numel() for g in grads]
        self.shapes = [g.shape for g in grads]
        self.gen = 0  # forward replays so far
        self.owner = None  # weakref to the autograd ctx whose activations the pool holds

    def free(self) -> bool:
        return self.owner is None or self.owner() is None

    def forward(self, ctx, x2):
        self.x.copy_(x2)
        self.fwd_graph.replay()
        self.gen += 1
        self.owner = weakref.ref(ctx)
        ctx.plan, ctx.gen = self, self.gen
        return self.out.clone()

    def backward(self, ctx, dout):
        if ctx.gen != self.gen:
            raise RuntimeError(
                "GPT fused blocks: this backward's activations were overwritten by a later forward "
                "(a second backward through a retained graph after another forward); run the model "
                "with graphs=False for that pattern"
            )
        self.dout.copy_(dout)
        self.bwd_graph.replay()
        if self.owner is not None and self.owner() is ctx:
            self.owner = None
        flat = self.flat.clone()
        grads = [g.view(s) for g, s in zip(flat.split(self.sizes), self.shapes)]
        return self.dx.clone(), grads


class _Blocks(torch.autograd.Function):
    """Every transformer block of the model under ONE autograd node: x [B, T, D]
    contiguous, ``params`` the blocks' parameters flat (12 per block, in _block_fwd's
    order); returns [B, T, D]. The saved tensors are the ones the op-by-op graph keeps.
    ``graphs``: the model's plan cache (``GPT._plans``) on a GPU, else None."""

    @staticmethod
    def forward(ctx, x, k, heads, graphs, *params):
        b, t, d = x.shape
        ctx.shape, ctx.k, ctx.heads, ctx.plan = (b, t, d), k, heads, None
        x2 = x.reshape(b * t, d)
        plan = graphs.plan(x2, k, heads, params, b, t) if graphs is not None else None
        if plan is not None:
            return plan.forward(ctx, x2).view(b, t, d)
        h, ctx.saved = _blocks_fwd(x2, k, heads, params, b, t)
        return h.view(b, t, d)

    @staticmethod
    def backward(ctx, dout):
        if torch.is_grad_enabled():
            raise RuntimeError("GPT fused blocks: double backward (create_graph=True) is not supported")
        (b, t, d), k, heads = ctx.shape, ctx.k, ctx.heads
        dx = dout.reshape(b * t, d)
        if not dx.is_contiguous():
            dx = dx.contiguous()
        if ctx.plan is not None:
            dx, flat = ctx.plan.backward(ctx, dx)
        else:
            dx, flat = _blocks_bwd(dx, ctx.saved, k, heads, b, t)
            ctx.saved = None  # free the activations now, as autograd frees saved tensors
        return (dx.view(b, t, d), None, None, None, *flat)


class _Plans:
    """A model's CUDA-graph plans of its fused blocks, one per key. A key is captured at
    its second sighting (the first runs the kernels plainly: Triton compiles and
    autotunes there, outside any capture); a forward whose plan still holds another
    forward's activations runs plainly. A capture that fails turns graphs off for the
    model with a warning (the plain path gives the same results)."""

    KEEP = 4  # plans kept per model and block group (each holds a step's activations in its pool)

    def __init__(self):
        self.plans, self.seen, self.off = {}, set(), False
        self.groups = 1  # the model's block_groups (one plan per group and key)

    def plan(self, x2, k, heads, params, b, t):
        if self.off:
            return None
        key = (b, t, x2.dtype, x2.device, id(k), tuple(p.data_ptr() for p in params))
        p = self.plans.get(key)
        if p is None:
            if key not in self.seen:
                self.seen.add(key)
                return None
            if len(self.plans) >= self.KEEP * self.groups:  # the oldest plan's graphs and pool go
                self.plans.pop(next(iter(self.plans)))
            try:
                p = self.plans[key] = _Plan(x2, k, heads, params, b, t)
            except Exception as e:  # noqa: BLE001 - the plain path is always there
                import warnings

                self.off = True
                warnings.warn(f"GPT: CUDA graphs of the fused blocks turned off ({type(e).__name__}: {e})", stacklevel=3)
                return None
        return p if p.free() else None


def _ln_add_ops(o, x, r, w, b):
    """(layer_norm(x + r), x + r) through the op set: its fused op where it has one, else
    the add then the norm (the same ops PyTorch's model runs)."""
    if o["ln_add"] is not None:
        return o["ln_add"](x, r, w, b)
    h = o["add"](x, r)
    return o["ln"](h, w, b), h


class Block(nn.Module):
    """One pre-LN transformer block's parameters, and its forward op by op (each op its own
    autograd node). The fused path (``_Blocks``) reads the same parameters directly; the
    op-by-op path calls the module, so a wrapper that hooks module calls (FSDP2's per-block
    all-gather) sees one call per block."""

    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1_w, self.ln1_b = nn.Parameter(torch.ones(d)), nn.Parameter(torch.zeros(d))
        self.ln2_w, self.ln2_b = nn.Parameter(torch.ones(d)), nn.Parameter(torch.zeros(d))
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x, r, o, b: int, t: int):
        """The block's input is x + r (r None: x); returns (x1, m), the block's output
        being x1 + m unsummed (the next norm adds them, as the fused blocks do)."""
        d, h = x.shape[-1], self.heads
        if r is None:
            y = o["ln"](x, self.ln1_w, self.ln1_b)
        else:
            y, x = _ln_add_ops(o, x, r, self.ln1_w, self.ln1_b)
        qkv = o["linear"](y, self.qkv.weight, self.qkv.bias).view(b, t, 3, h, d // h).permute(2, 0, 3, 1, 4)
        if o["qkv_contiguous"]:
            qkv = qkv.contiguous()
        q, k, v = qkv.unbind(0)
        a = o["attn"](q, k, v).transpose(1, 2).reshape(b, t, d)
        y, x = _ln_add_ops(o, x, o["linear"](a, self.proj.weight, self.proj.bias), self.ln2_w, self.ln2_b)
        h = o["gelu"](o["linear"](y, self.fc.weight, self.fc.bias))
        return x, o["linear"](h, self.fc2.weight, self.fc2.bias)


class GPT(nn.Module):
    def __init__(
        self, cfg: Config | str = "tiny", backends="pytorch", matmul="pytorch", fuse: bool = True, graphs: bool = True
    ):
        super().__init__()
        self.fuse = fuse  # eager: one autograd node for all blocks where the op set allows it
        # eager on a GPU: the fused blocks replay CUDA graphs of themselves (_Plans)
        self.graphs = graphs
        self._plans = _Plans()
        # The fused blocks as this many autograd nodes (consecutive blocks each): a node
        # hands its blocks' gradients over when its backward ends, so a gradient
        # all-reduce (DDP) of the later blocks can overlap the earlier blocks' backward.
        # 1: one node for all blocks.
        self.block_groups = 1
        if isinstance(cfg, str):
            if cfg not in CONFIGS:
                raise ValueError(f"config: unknown {cfg!r}; known: {', '.join(CONFIGS)}")
            cfg = CONFIGS[cfg]
        if cfg.dim % cfg.heads:
            raise ValueError(f"config: dim {cfg.dim} is not a multiple of heads {cfg.heads}")
        self.cfg = cfg
        self.ops = op_set(backends, matmul)
        d = cfg.dim
        self.wte = nn.Parameter(torch.randn(cfg.vocab, d) * 0.02)
        self.wpe = nn.Parameter(torch.randn(cfg.ctx, d) * 0.01)
        self.blocks = nn.ModuleList()
        for _ in range(cfg.layers):
            blk = Block(d, cfg.heads)
            for lin in (blk.qkv, blk.proj, blk.fc, blk.fc2):
                nn.init.normal_(lin.weight, std=0.02)
                nn.init.zeros_(lin.bias)
            blk.proj.weight.data /= math.sqrt(2 * cfg.layers)  # GPT-2's residual scaling
            blk.fc2.weight.data /= math.sqrt(2 * cfg.layers)
            self.blocks.append(blk)
        self.lnf_w, self.lnf_b = nn.Parameter(torch.ones(d)), nn.Parameter(torch.zeros(d))

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy of next-token prediction; idx, targets: int64 [B, T]."""
        cfg = self.cfg
        b, t = idx.shape
        if t > cfg.ctx:
            raise ValueError(f"seq_len {t} is longer than the model's context ({cfg.ctx})")
        h = cfg.heads
        x = self.wte[idx] + self.wpe[:t]
        o = self._ops(x, b, t)
        kern = self._fused(x, o) if self.fuse and not torch.compiler.is_compiling() else None
        if kern is not None and torch.is_grad_enabled():
            plans = self._plans if self.graphs and x.is_cuda else None
            params, n = self._block_params(), len(self.blocks)
            groups = max(1, min(int(self.block_groups), n))
            self._plans.groups = groups
            for g in range(groups):  # consecutive blocks, as even as n allows
                lo, hi = g * n // groups * _PER_BLOCK, (g + 1) * n // groups * _PER_BLOCK
                x = _Blocks.apply(x.contiguous(), kern, h, plans, *params[lo:hi])
            x = o["ln"](x, self.lnf_w, self.lnf_b)
        else:
            r = None  # a block's output is x + r, summed by the next norm (_ln_add_ops)
            for blk in self.blocks:
                x, r = blk(x, r, o, b, t)
            x = o["ln"](x, self.lnf_w, self.lnf_b) if r is None else _ln_add_ops(o, x, r, self.lnf_w, self.lnf_b)[0]
        logits = o["linear"](x, self.wte)
        return o["ce"](logits.view(b * t, -1), targets.reshape(b * t))

    def _block_params(self) -> list:
        """The blocks' parameters flat, in _block_fwd's order."""
        return [
            p
            for blk in self.blocks
            for p in (
                blk.ln1_w, blk.ln1_b, blk.qkv.weight, blk.qkv.bias, blk.proj.weight, blk.proj.bias,
                blk.ln2_w, blk.ln2_b, blk.fc.weight, blk.fc.bias, blk.fc2.weight, blk.fc2.bias,
            )  # fmt: skip
        ]

    def _ops(self, x, b: int, t: int) -> dict:
        """The op set of a call: ``self.ops``, its None slots (kernellab's default) resolved
        at this call's shapes by ``resolve_defaults`` (cached per shape, dtype and device)."""
        chosen = self.ops["chosen"]
        if None not in chosen.values():
            return self.ops
        if torch.compiler.is_compiling():
            c = self.cfg
            cfg = (c.vocab, c.ctx, c.dim, c.layers, c.heads)
            return _slot_ops(dict(_resolved_items(tuple(sorted(chosen.items())), cfg, b, t, str(x.dtype),
                                                  x.device.type)))  # fmt: skip
        key = (b, t, x.dtype, x.device.type)
        cache = self.__dict__.setdefault("_ops_cache", {})
        if key not in cache:
            cache[key] = _slot_ops(resolve_defaults(chosen, self.cfg, b, t, x.dtype, x.device.type))
        return cache[key]

    def _fused(self, x, o=None):
        """Node-free kernels of the op set ``o`` (default: the model's) on x's device
        (cached per device and resolved op set), or None."""
        o = self.ops if o is None else o
        key = (x.device.type, tuple(sorted(o["chosen"].items())))
        cache = self.__dict__.setdefault("_fused_cache", {})
        if key not in cache:
            cache[key] = fused_kernels(o["chosen"], x.device.type)
        return cache[key]


class Trainer:
    """One model, its optimizer and a step function in one of MODES."""

    def __init__(self, model: GPT, mode: str = "eager", lr: float = 3e-4, optimizer: str = "pytorch"):
        if mode not in MODES:
            raise ValueError(f"mode: unknown {mode!r}; modes: {', '.join(MODES)}")
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer: unknown {optimizer!r}; optimizers: {', '.join(OPTIMIZERS)}")
        self.model, self.mode = model, mode
        cuda = next(model.parameters()).is_cuda
        if mode == "compile-step-graph" and not cuda:
            raise ValueError("mode: 'compile-step-graph' (a CUDA graph of the whole step) needs a GPU")
        if optimizer == "pytorch":
            self.opt = torch.optim.AdamW(
                model.parameters(), lr=lr, fused=cuda, foreach=not cuda, capturable=mode == "compile-step-graph"
            )
        else:  # kernellab's AdamW (same math and defaults), through the named backend
            self.opt = optim.AdamW(model.parameters(), lr=lr, backend=optimizer)
        self.fwd = model
        if mode in ("compile", "compile-step-graph"):
            self.fwd = torch.compile(model)
        elif mode == "compile-cudagraphs":
            self.fwd = torch.compile(model, mode="reduce-overhead")
        self.graph = None  # compile-step-graph: (graph, static idx, static targets, static loss)

    def _step(self, idx, targets) -> torch.Tensor:
        loss = self.fwd(idx, targets)
        loss.backward()
        self.opt.step()
        return loss

    def _capture(self, idx, targets) -> torch.Tensor:
        """The first step of compile-step-graph: one real step on a side stream (compilation,
        autotuning, the optimizer's state and the grads' first allocation fall there), then
        the whole step captured (not run). Returns the real step's loss."""
        static = (idx.clone(), targets.clone())
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            first = self._step(*static).detach().clone()
        torch.cuda.current_stream().wait_stream(s)
        # Grads set to None: the captured backward allocates them in the graph's pool and
        # writes (not accumulates) them on every replay.
        self.opt.zero_grad(set_to_none=True)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            loss = self._step(*static)
        self.graph = (graph, *static, loss)
        return first

    def step(self, idx, targets) -> torch.Tensor:
        if self.mode == "compile-step-graph":
            if self.graph is None:
                return self._capture(idx, targets)
            graph, s_idx, s_tgt, loss = self.graph
            if s_idx.shape != idx.shape or s_tgt.shape != targets.shape:
                raise ValueError(f"idx: the step graph was captured at {tuple(s_idx.shape)}, got {tuple(idx.shape)}")
            s_idx.copy_(idx)
            s_tgt.copy_(targets)
            graph.replay()
            return loss.detach().clone()  # the static loss is overwritten by the next replay
        if self.mode == "compile-cudagraphs":
            torch.compiler.cudagraph_mark_step_begin()
        loss = self._step(idx, targets)
        self.opt.zero_grad(set_to_none=True)
        return loss.detach().clone()  # a cudagraph output is overwritten by the next replay


def make(
    config="tiny", backends="pytorch", matmul="pytorch", device=None, dtype=torch.float32, seed=0, fuse=True,
    graphs=True,
) -> GPT:
    """A GPT with weights drawn from ``seed`` (the same for every op set)."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(seed)
    return GPT(config, backends, matmul, fuse, graphs).to(device=device, dtype=dtype)


def time_steps(trainer: Trainer, batch, warmup: int = 4, steps: int = 8, rounds: int = 3) -> dict:
    """ms per training step: ``rounds`` rounds of ``steps`` steps between two syncs, after
    ``warmup`` steps (compilation and autotuning fall there); median round."""
    sync = torch.cuda.synchronize if next(trainer.model.parameters()).is_cuda else (lambda: None)
    t0 = time.perf_counter()
    for _ in range(warmup):
        loss = trainer.step(*batch)
    first = float(loss)
    sync()
    warm = time.perf_counter() - t0
    times = []
    for _ in range(rounds):
        sync()
        t0 = time.perf_counter()
        for _ in range(steps):
            trainer.step(*batch)
        sync()
        times.append((time.perf_counter() - t0) / steps * 1e3)
    return {"ms_per_step": statistics.median(times), "ms_min": min(times), "ms_max": max(times),
            "warmup_s": warm, "loss": first}  # fmt: skip


# --------------------------------------------------------------------------- training run

# Op sets of ``--compare``: name -> (backends, matmul) for make() and the Trainer's
# optimizer (kernellab's sets: kernellab.optim.AdamW's one-launch Triton step).
COMPARE_SETS = {
    "pytorch": ("pytorch", "pytorch", "pytorch"),
    "kernellab": ("triton", "pytorch", "triton"),  # our kernels; linear layers on cuBLAS
    "kernellab_all": ("triton", "triton", "triton"),  # every op on kernellab's own kernels
    "kernellab_default": (None, None, "triton"),  # kernellab's default backend per op
}


def time_interleaved(builders: dict, warmup: int = 4, steps: int = 8, rounds: int = 3, on_error=None) -> dict:
    """ms per training step of several op sets, timed in alternating rounds: each
    ``builders[name]() -> (Trainer, batch)`` is built and warmed (``warmup`` steps:
    compilation and autotuning fall there), then every set runs ``steps`` steps in turn,
    ``rounds`` times. A host whose speed drifts between runs then drifts under every set
    alike. Returns name -> row: loss, warmup_s,
    ms_per_step (median round), ms_min, ms_max, rounds, rounds_ms (each round's) and, where a set named "pytorch"
    ran, ratio_paired (the median over rounds of the set's time over PyTorch's in the same
    round); a set that fails gets ``error`` instead (``on_error(exc)`` is called with it)."""
    rows, live = {}, {}
    for name, build in builders.items():
        row = rows[name] = {}
        try:
            trainer, batch = build()
            sync = torch.cuda.synchronize if next(trainer.model.parameters()).is_cuda else (lambda: None)
            t0 = time.perf_counter()
            for _ in range(warmup):
                loss = trainer.step(*batch)
            row["loss"] = float(loss)
            sync()
            row["warmup_s"] = time.perf_counter() - t0
            live[name] = (trainer, batch, sync)
        except Exception as e:  # noqa: BLE001 - reported in its row
            row["error"] = f"{type(e).__name__}: {e}"[:400]
            if on_error is not None:
                on_error(e)
    times = {name: [] for name in live}
    for _ in range(rounds):
        for name, (trainer, batch, sync) in list(live.items()):
            try:
                sync()
                t0 = time.perf_counter()
                for _ in range(steps):
                    trainer.step(*batch)
                sync()
                times[name].append((time.perf_counter() - t0) / steps * 1e3)
            except Exception as e:  # noqa: BLE001 - reported in its row
                rows[name]["error"] = f"{type(e).__name__}: {e}"[:400]
                del live[name], times[name]
                if on_error is not None:
                    on_error(e)
    base = times.get("pytorch")
    for name, ts in times.items():
        rows[name].update(ms_per_step=statistics.median(ts), ms_min=min(ts), ms_max=max(ts), rounds=rounds)
        rows[name]["rounds_ms"] = [round(v, 3) for v in ts]
        if base:
            rows[name]["ratio_paired"] = timer.paired_ratio(ts, base)
    return rows


def _dtype(name: str) -> torch.dtype:
    try:
        return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[name]
    except KeyError:
        raise ValueError(f"dtype: unknown {name!r}; use fp32, bf16 or fp16") from None


def train(
    config="tiny",
    backends="pytorch",
    matmul="pytorch",
    mode="eager",
    batch_size=8,
    seq_len=None,
    steps=20,
    dtype="fp32",
    data=None,
    device=None,
    seed=0,
    lr=3e-4,
    on_step=None,
    optimizer="pytorch",
) -> list[float]:
    """Train on real text (``kernellab.models.text``) and return the loss of every step;
    ``on_step(i, loss, ms)`` is called after each step (it may sync: it reads the loss)."""
    from kernellab.models import text

    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    model = make(config, backends, matmul, device, _dtype(dtype), seed)
    seq_len = seq_len or model.cfg.ctx
    if not 1 <= seq_len <= model.cfg.ctx:
        raise ValueError(f"seq_len must be in [1, {model.cfg.ctx}] for config {config!r}, got {seq_len}")
    dev = next(model.parameters()).device
    corpus = text.ByteData(text.load_corpus(data), dev)
    gen = torch.Generator(device=dev).manual_seed(seed)
    trainer = Trainer(model, mode, lr, optimizer)
    losses = []
    for i in range(steps):
        batch = corpus.batch(batch_size, seq_len, gen)
        t0 = time.perf_counter()
        loss = float(trainer.step(*batch))
        ms = (time.perf_counter() - t0) * 1e3
        losses.append(loss)
        if on_step is not None:
            on_step(i, loss, ms)
    return losses


def compare(
    config="gpt2",
    shapes=((8, 1024), (4, 256)),
    modes=MODES,
    sets=tuple(COMPARE_SETS),
    dtype="bf16",
    warmup=4,
    steps=8,
    device=None,
    on_row=None,
    rounds=3,
) -> list[dict]:
    """ms per training step of every op set x mode x (B, T), same weights and data; a
    failing configuration gives a row with ``error`` instead of ending the run.

    The op sets of one (B, T, mode) are built and warmed first, then timed in ``rounds``
    alternating rounds of ``steps`` steps (median round): a host whose speed drifts
    between runs then drifts under every set alike.
    ``ratio_paired``: the median over rounds of the set's time over PyTorch's in the same
    round."""
    from kernellab.models import text

    def builder(name, b, t, mode):
        def build():
            be, mm, opt = COMPARE_SETS[name]
            model = make(config, be, mm, device, _dtype(dtype))
            dev = next(model.parameters()).device
            corpus = text.ByteData(text.load_corpus(), dev)
            return Trainer(model, mode, optimizer=opt), corpus.batch(b, t, torch.Generator(device=dev).manual_seed(0))

        return build

    rows = []
    for b, t in shapes:
        for mode in modes:
            timed = time_interleaved({name: builder(name, b, t, mode) for name in sets}, warmup, steps, rounds)
            torch._dynamo.reset()
            for name in sets:
                row = {"B": b, "T": t, "mode": mode, "ops": name, "config": config, "dtype": dtype, **timed[name]}
                rows.append(row)
                if on_row is not None:
                    on_row(row)
    return rows
