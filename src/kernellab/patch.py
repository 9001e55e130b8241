"""``kernellab.patch(model)``: kernellab ops in a Hugging Face or plain PyTorch model, in
place; ``kernellab.unpatch(model)`` restores it exactly.

What is replaced is one table, ``RULES``: each entry names a kernellab op, the modules it
matches and how it replaces them (and how that is undone). An entry whose op this build
lacks (``kernellab.swiglu`` ...) is skipped and reported, so ops added later plug in by
existing. Modules keep their Parameter objects (optimizers keep working, state_dict keys
do not change):

- ``nn.LayerNorm``, ``nn.RMSNorm``, ``nn.GELU(approximate="tanh")``, ``nn.CrossEntropyLoss``:
  their class becomes the kernellab.nn drop-in subclass (hooks and attributes stay).
- Hugging Face norms (``LlamaRMSNorm``, Mistral/Qwen2/Qwen3's, ``Gemma2RMSNorm`` whose
  scale is ``1 + weight``, and any other ``*RMSNorm`` whose forward takes x alone and
  whose CPU copy, run with a random weight, computes the same formula with an offset of 0
  or 1; a ``*LayerNorm`` class that is not nn.LayerNorm, checked the same way, becomes
  kernellab.layer_norm (Cohere's) or kernellab.rms_norm (T5's)) and tanh GeLU activations
  (``gelu_new``, ``gelu_pytorch_tanh``): replaced by kernellab modules holding the same
  weight.
- Gated MLPs (``gate_proj``/``up_proj``/``down_proj`` with SiLU or tanh GeLU, or one
  ``gate_up_proj`` whose halves are gate and up, as Phi-3's and GLM's, where the MLP's
  forward, run once on random rows, is that formula): the MLP's
  forward calls kernellab.swiglu / geglu, when the build has them, with
  ``inplace_backward=True`` (the projections are the forward's own intermediates), and
  the down projection's saved input is made again in its backward rather than kept
  (``kernellab.nn._gated``).
- Attention in Hugging Face models: transformers' attention-function registry (name
  ``"kernellab"``); per call, kernellab.attention runs the plain causal mask (with GQA,
  sliding window, softcap); a padding or custom mask, dropout in training, a
  top-left-aligned causal prefill into a longer cache, or a keyword it does not read
  (gpt-oss's sinks) runs transformers' SDPA (eager for a softcap, which SDPA ignores, and
  for such a keyword, or the model's FlashAttention where it ran one) and is counted in
  ``report.attention_fallbacks``, or raises with ``on_unsupported="raise"``. Never a
  silently different answer.
- RoPE in Hugging Face models: the family's module-level ``apply_rotary_pos_emb`` (what
  its attention forward calls) is swapped for one that runs kernellab.rope for HF's own
  call form inside a patched model's forward (forward hooks count them) and HF's
  function anywhere else; unpatch, or collecting the last patched model, restores it.
  Families rotate differently under one function name (Llama the head dim's halves,
  Cohere adjacent pairs, GPT-J another signature), so the function is first run on
  random inputs: the rope layout it matches is used, and one that matches none is left.
- Attention in a plain module: its ``F.scaled_dot_product_attention`` calls, intercepted
  while the model's forward runs (a torch function mode entered by the model's forward,
  not a global swap); calls kernellab.attention cannot compute exactly run PyTorch's.
- The causal-LM loss of Hugging Face models: ``model.loss_function`` on kernellab.cross_entropy;
  with ``fused_linear_cross_entropy=True``, a forward that, given labels, feeds the hidden
  states and the head's weight to kernellab.linear_cross_entropy (the logits are never
  stored; the output's ``logits`` is None) where the model fits (``_fused_lce_reason``)
  and its own forward, run once at patch time on 4 tokens, gives logits = head(hidden
  states) (``_head_mismatch``: Cohere's logit scale, Granite's divisor are left).

Under torch.compile, a patched piece whose op has no backend named runs the model's own
code (its RMSNorm, MLP, rotary function, SDPA attention, head and loss): PyTorch's ops,
which Inductor fuses with their neighbours, so the compiled patched model is the compiled
unpatched one (``registry.compiled_backend``: no kernellab backend is declared faster in a
compiled graph) but for the attention mask: a Hugging Face model's mask is made only where
one is needed (``_hf_mask``), where transformers with torch before 2.14 makes it in every
compiled step. ``backend=`` puts kernellab's op in the graph; ``kernellab.nn`` modules
and the class-swapped norms and activations take their op's compiled default.

A patched model deep-copies and pickles (``torch.save(model)``, ``torch.load(...,
weights_only=False)``) as a patched model, in another process too: every patched forward and
loss is an object holding its choices, not a closure; a loaded model takes its share of the
rope swap and registers the attention function again.

Hugging Face's RMSNorm rounds ``x * rstd`` to the storage dtype before the weight multiply
(Gemma-2 does not); kernellab.rms_norm rounds once at the end: identical in fp32, within
one rounding in fp16/bf16.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import re
import sys
import types
import weakref
from collections import Counter
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from kernellab import nn as klnn
from kernellab.nn import functional as klF
from kernellab.nn._gated import gated_down, gated_mlp
from kernellab.ops import public as kl_ops

_compiling = torch.compiler.is_compiling


def _model_code(backend: str | None) -> bool:
    """Whether a patched piece runs the model's own code: under torch.compile with no
    backend named (module docstring, "Under torch.compile")."""
    return backend is None and _compiling()

# ----------------------------------------------------------------------------- report


@dataclasses.dataclass
class PatchReport:
    """What ``patch`` replaced (op, module path, class before -> after) and what it left
    (path, why). ``attention_calls`` / ``attention_fallbacks`` count attention calls in
    eager mode as they happen (kernellab, and transformers' SDPA or eager per reason)."""

    model: str
    backend: str | dict | None
    replaced: list[tuple[str, str, str, str]] = dataclasses.field(default_factory=list)
    left: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)
    attention_calls: Counter = dataclasses.field(default_factory=Counter)
    attention_fallbacks: Counter = dataclasses.field(default_factory=Counter)

    def counts(self) -> dict[str, int]:
        """Replacements per op."""
        return dict(Counter(op for op, *_ in self.replaced))

    def paths(self, op: str) -> list[str]:
        return [path for o, path, *_ in self.replaced if o == op]

    def __str__(self) -> str:
        lines = [f"kernellab.patch({self.model}, backend={self.backend!r})"]
        counts = self.counts()
        lines.append("replaced: " + (", ".join(f"{op} x{n}" for op, n in counts.items()) or "nothing"))
        # One line per kind of replacement: layer indices fold into "*" (a 32-layer
        # model prints as many lines as a 2-layer one).
        groups = Counter((op, _fold(path), before, after) for op, path, before, after in self.replaced)
        for (op, path, before, after), n in groups.items():
            times = f" (x{n})" if n > 1 else ""
            lines.append(f"  {op:<14} {path}{times}: {before} -> {after}")
        if self.left:
            lines.append("left as is:")
            for (op, path, why), n in Counter((op, _fold(p), why) for op, p, why in self.left).items():
                lines.append(f"  {op:<14} {path}{f' (x{n})' if n > 1 else ''}: {why}")
        if self.attention_calls or self.attention_fallbacks:
            lines.append(f"attention calls: {dict(self.attention_calls)}")
            for why, n in self.attention_fallbacks.items():
                lines.append(f"  fallback x{n}: {why}")
        return "\n".join(lines)

    __repr__ = __str__


def _fold(path: str) -> str:
    return re.sub(r"(?<=\.)\d+(?=\.|$)", "*", path) if path else "<model>"


# ----------------------------------------------------------------------------- context


@dataclasses.dataclass
class _Ctx:
    report: PatchReport
    backend: str | dict | None
    undo: list[_Undo]
    on_unsupported: str
    hf: bool
    sdpa: _AttnPolicy | None = None  # a plain module's attention policy (its patched forward reads it)

    def backend_for(self, op: str) -> str | None:
        return self.backend.get(op) if isinstance(self.backend, dict) else self.backend


class _Undo:
    """One step of unpatch, ``fn(*args)``, kept as data rather than a closure: a deep copy
    of a patched model copies its args with the model, so the copy's unpatch restores the
    copy's modules (and the original's its own)."""

    def __init__(self, fn: Callable, *args):
        self.fn, self.args = fn, args

    def __call__(self) -> None:
        self.fn(*self.args)


def _unswap_class(module: nn.Module, before: type) -> None:
    module.__class__ = before
    del module.backend


def _swap_class(module: nn.Module, cls: type, ctx: _Ctx, op: str) -> None:
    """Give module the drop-in subclass (same object: parameters, hooks, attributes)."""
    before = type(module)
    module.__class__ = cls
    module.backend = ctx.backend_for(op)
    ctx.undo.append(_Undo(_unswap_class, module, before))


def _replace_child(parent: nn.Module, name: str, new: nn.Module, ctx: _Ctx) -> None:
    old = getattr(parent, name)
    new.train(old.training)
    setattr(parent, name, new)
    ctx.undo.append(_Undo(setattr, parent, name, old))


def _unset_forward(module: nn.Module, had: bool, old) -> None:
    if had:
        module.forward = old
    else:
        del module.forward


class _BoundForward:
    """A patched module's instance forward: ``fn(module, *args, **kwargs)``, kept as data
    (``fn`` a picklable callable object holding the patch's choices) rather than a method
    bound to a closure. A deep copy rebinds it to the copy, and ``pickle`` / ``torch.save``
    store it: a bound method pickles as ``getattr(module, "forward")``, which loads as the
    class's forward, the patch silently gone (and a closure does not pickle at all)."""

    def __init__(self, fn: Callable, module: nn.Module):
        self.fn, self.module = fn, module

    def __call__(self, *args, **kwargs):
        return self.fn(self.module, *args, **kwargs)

    @property
    def __signature__(self) -> inspect.Signature:  # fn's, less the module (as a bound method's)
        sig = inspect.signature(self.fn)
        return sig.replace(parameters=list(sig.parameters.values())[1:])


def _set_forward(module: nn.Module, forward: Callable, ctx: _Ctx) -> None:
    """An instance forward (nn.Module.__call__ finds it first); undone by deleting it.
    ``forward(module, ...)`` reaches the module's own state through its first argument
    only (a deep copy or a pickled copy of the module passes the copy)."""
    had = "forward" in module.__dict__
    old = module.__dict__.get("forward")
    module.forward = _BoundForward(forward, module)
    ctx.undo.append(_Undo(_unset_forward, module, had, old))


# ----------------------------------------------------------------------------- module rules

_HF_RMSNORM = {  # class name -> offset added to the weight (Gemma scales by 1 + weight)
    "LlamaRMSNorm": 0.0,
    "MistralRMSNorm": 0.0,
    "Qwen2RMSNorm": 0.0,
    "Qwen3RMSNorm": 0.0,
    "Gemma2RMSNorm": 1.0,
}
_HF_TANH_GELU = ("NewGELUActivation", "GELUTanh", "PytorchGELUTanh")
_SILU = ("SiLU", "SiLUActivation")


class HFRMSNorm(nn.Module):
    """A Hugging Face RMSNorm on kernellab.rms_norm, holding the model's weight Parameter
    (scale ``offset + weight``: Gemma-2's ``1 + weight`` with offset 1). A weight whose
    dtype differs from the input's (a norm kept in fp32 in a bf16 model) runs the
    original module, whose result dtype follows type promotion, which kernellab.rms_norm
    (one dtype for x and weight) does not do."""

    def __init__(self, original: nn.Module, eps: float, offset: float = 0.0, backend: str | None = None):
        super().__init__()
        self.weight, self.eps, self.offset, self.backend = original.weight, eps, offset, backend
        self._original = (original,)  # a tuple: not a submodule, so state_dict keys stay

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight.dtype != x.dtype or _model_code(self.backend):
            return self._original[0](x)
        w = self.weight + self.offset if self.offset else self.weight
        return kl_ops.rms_norm(x, w, eps=self.eps, backend=self.backend)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}, offset={self.offset}"


class HFLayerNorm(nn.Module):
    """A model's own LayerNorm class (Cohere's, without a bias) on kernellab.layer_norm,
    holding its weight and bias Parameters; a weight of another dtype than the input runs
    the original module (as HFRMSNorm)."""

    def __init__(self, original: nn.Module, eps: float, backend: str | None = None):
        super().__init__()
        self.weight, self.bias, self.eps, self.backend = original.weight, _bias(original), eps, backend
        self._original = (original,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight.dtype != x.dtype or _model_code(self.backend):
            return self._original[0](x)
        return kl_ops.layer_norm(x, self.weight, self.bias, eps=self.eps, backend=self.backend)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}, bias={self.bias is not None}"


def _bias(m: nn.Module):
    b = getattr(m, "bias", None)
    return b if isinstance(b, nn.Parameter) else None


def _eps(m: nn.Module):
    return getattr(m, "variance_epsilon", getattr(m, "eps", None))


def _rule_layer_norm(path, parent, name, m, ctx):
    if type(m) is nn.LayerNorm:
        _swap_class(m, klnn.LayerNorm, ctx, "layer_norm")
        return "kernellab.nn.LayerNorm"
    cls = type(m).__name__
    if cls.endswith("LayerNorm") and not isinstance(m, nn.LayerNorm):
        op, _, why = _norm_formula_of(m)
        if op == "layer_norm":
            _replace_child(parent, name, HFLayerNorm(m, _eps(m), ctx.backend_for("layer_norm")), ctx)
            return "kernellab.patch.HFLayerNorm"
        if op is None:  # (an RMS formula by this name is the rms_norm rule's: T5's)
            ctx.report.left.append(("layer_norm", path, f"{cls}: {why}"))
    return None


def _rule_rms_norm(path, parent, name, m, ctx):
    if hasattr(nn, "RMSNorm") and type(m) is nn.RMSNorm:
        _swap_class(m, klnn.RMSNorm, ctx, "rms_norm")
        return "kernellab.nn.RMSNorm"
    cls = type(m).__name__
    if cls in _HF_RMSNORM and isinstance(getattr(m, "weight", None), nn.Parameter):
        eps = getattr(m, "variance_epsilon", getattr(m, "eps", None))
        if eps is None or m.weight.dim() != 1:
            ctx.report.left.append(("rms_norm", path, f"{cls} without a 1-D weight and eps"))
            return None
        new = HFRMSNorm(m, eps, _HF_RMSNORM[cls], ctx.backend_for("rms_norm"))
        _replace_child(parent, name, new, ctx)
        return "kernellab.patch.HFRMSNorm"
    named_ln = cls.endswith("LayerNorm") and not isinstance(m, nn.LayerNorm)  # T5's is an RMSNorm
    if cls.endswith("RMSNorm") or named_ln:
        op, offset, why = _norm_formula_of(m)
        if op != "rms_norm":
            if not named_ln:  # (a LayerNorm formula by that name is the layer_norm rule's)
                ctx.report.left.append(("rms_norm", path, f"{cls}: {why or 'its formula is a LayerNorm'}"))
            return None
        _replace_child(parent, name, HFRMSNorm(m, _eps(m), offset, ctx.backend_for("rms_norm")), ctx)
        return "kernellab.patch.HFRMSNorm"
    return None


_RMS_FORMULA = "x * rsqrt(mean(x^2) + eps) * weight (or * (1 + weight))"
_LN_FORMULA = "(x - mean) * rsqrt(var + eps) * weight (+ bias)"


def _rms_offset(m: nn.Module, eps) -> tuple[float | None, str]:
    """(the offset of the scale, 0 or 1, "") where a norm class not in _HF_RMSNORM computes
    kernellab.rms_norm's x * rsqrt(mean(x^2) + eps) * (offset + weight), or (None, why not)
    (``_norm_formula``)."""
    op, offset, why = _norm_formula(m, eps)
    if op == "rms_norm":
        return offset, ""
    return None, why or f"its formula is not {_RMS_FORMULA}"


# module -> _norm_formula's answer, so the layer_norm and rms_norm rules run a module once
_NORM_FORMULAS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _norm_formula_of(m: nn.Module) -> tuple[str | None, float, str]:
    if m not in _NORM_FORMULAS:
        _NORM_FORMULAS[m] = _norm_formula(m, _eps(m))
    return _NORM_FORMULAS[m]


def _norm_formula(m: nn.Module, eps) -> tuple[str | None, float, str]:
    """Which of kernellab's norms a norm module computes: ("rms_norm", offset, "") for
    x * rsqrt(mean(x^2) + eps) * (offset + weight), offset 0 or 1; ("layer_norm", 0, "") for
    (x - mean) * rsqrt(var + eps) * weight (+ bias); else (None, 0, why not). Its forward must
    take x alone, its weight be 1-D and its eps a float; then a float32 CPU copy with a random
    weight (and bias) is run once on random rows and compared with each formula."""
    w = getattr(m, "weight", None)
    if not isinstance(w, nn.Parameter) or w.dim() != 1 or not isinstance(eps, float):
        return None, 0.0, "no 1-D weight Parameter and float eps (variance_epsilon or eps)"
    try:
        params = list(inspect.signature(m.forward).parameters.values())
    except (TypeError, ValueError):
        params = []
    if len(params) != 1 or params[0].kind not in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD):
        return None, 0.0, "its forward takes more than x"
    g = torch.Generator().manual_seed(0)
    try:
        probe = copy.deepcopy(m).to("cpu", torch.float32)
        with torch.no_grad():
            probe.weight.copy_(torch.randn(w.shape, generator=g))
            if _bias(probe) is not None:
                probe.bias.copy_(torch.randn(w.shape, generator=g))
            x = torch.randn(3, w.shape[0], generator=g) + 0.5  # (a mean to subtract)
            y = probe(x)
    except Exception as e:  # noqa: BLE001 - weights on the meta device, a forward that needs more
        return None, 0.0, f"its forward could not be checked on a CPU copy ({type(e).__name__})"
    if not (isinstance(y, torch.Tensor) and y.shape == x.shape):
        return None, 0.0, "its forward does not return a tensor of x's shape"
    xd, wd, yd = x.double(), probe.weight.detach().double(), y.double()
    rms = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps)
    c = xd - xd.mean(-1, keepdim=True)
    ln = c * torch.rsqrt(c.pow(2).mean(-1, keepdim=True) + eps) * wd
    if _bias(probe) is not None:
        ln = ln + probe.bias.detach().double()
    formulas = (("rms_norm", 0.0, rms * wd), ("rms_norm", 1.0, rms * (1 + wd)), ("layer_norm", 0.0, ln))
    for op, offset, want in formulas:
        if torch.allclose(yd, want, rtol=1e-5, atol=1e-5):
            return op, offset, ""
    return None, 0.0, f"its formula is neither {_RMS_FORMULA} nor {_LN_FORMULA}"


def _rule_gelu(path, parent, name, m, ctx):
    cls = type(m).__name__
    if type(m) is nn.GELU:
        if m.approximate != "tanh":
            ctx.report.left.append(("gelu", path, "nn.GELU(approximate='none'): kernellab.gelu is tanh only"))
            return None
        _swap_class(m, klnn.GELU, ctx, "gelu")
        return "kernellab.nn.GELU"
    if cls in _HF_TANH_GELU:
        _replace_child(parent, name, klnn.GELU("tanh", backend=ctx.backend_for("gelu")), ctx)
        return "kernellab.nn.GELU('tanh')"
    if cls == "GELUActivation":  # transformers' exact GELU (BERT's, ViT's)
        ctx.report.left.append(("gelu", path, "GELUActivation (erf): kernellab.gelu is tanh only"))
    return None


def _rule_cross_entropy(path, parent, name, m, ctx):
    if type(m) is nn.CrossEntropyLoss:
        if m.weight is not None or m.label_smoothing != 0.0:
            ctx.report.left.append(("cross_entropy", path, "class weights or label smoothing"))
            return None
        _swap_class(m, klnn.CrossEntropyLoss, ctx, "cross_entropy")
        return "kernellab.nn.CrossEntropyLoss"
    return None


def _act_kind(act) -> tuple[str, dict] | None:
    """(op, options) of a gated MLP's activation module: SiLU -> swiglu, tanh GeLU -> geglu."""
    name = type(act).__name__
    if name in _SILU:
        return "swiglu", {}
    if name in _HF_TANH_GELU or (name == "GELU" and getattr(act, "approximate", "") == "tanh"):
        return "geglu", {"approximate": "tanh"}
    return None


def _gated_mlp_kind(m) -> tuple[str, dict, bool] | None:
    """(op, options, fused) of a gated MLP: ``gate_proj``, ``up_proj``, ``down_proj`` and
    ``act_fn`` (fused False), or one ``gate_up_proj`` whose output's halves are the gate and
    the up projections (Phi-3's, GLM's; fused True), where ``_gated_verified``."""
    linear = lambda *names: all(isinstance(getattr(m, a, None), nn.Linear) for a in names)  # noqa: E731
    if linear("gate_proj", "up_proj", "down_proj"):
        act, fused = getattr(m, "act_fn", None), False
    elif linear("gate_up_proj", "down_proj") and m.gate_up_proj.out_features == 2 * m.down_proj.in_features:
        act, fused = getattr(m, "activation_fn", getattr(m, "act_fn", None)), True
    else:
        return None
    kind = _act_kind(act)
    return (*kind, fused) if kind is not None and _gated_verified(m, act, fused) else None


def _gated_verified(m, act, fused: bool) -> bool:
    """Whether the MLP's forward is down(act(g) * u), (g, u) its gate and up projections (the
    halves of gate_up_proj's output where ``fused``): its forward takes x alone and, run
    without gradients on 2 random rows, gives that formula. A layer's own variations hide
    behind the same module names (Gemma-3n's first layers keep the top 5% of the gate's
    activations). Weights on the meta device cannot run: the names alone decide there."""
    if any(p.is_meta for p in m.parameters()):
        return True
    try:
        if len(inspect.signature(m.forward).parameters) != 1:
            return False
        w = m.down_proj.weight
        with torch.no_grad():
            x = torch.randn(2, m.down_proj.out_features, device=w.device, dtype=w.dtype)
            g, u = m.gate_up_proj(x).chunk(2, dim=-1) if fused else (m.gate_proj(x), m.up_proj(x))
            want, got = m.down_proj(act(g) * u).float(), m(x).float()
        tol = 1e-3 * want.abs().max().item()
        return got.shape == want.shape and torch.allclose(got, want, rtol=1e-2, atol=tol)
    except Exception:  # noqa: BLE001 - a forward that needs more than x
        return False


class _GatedForward:
    """A gated MLP's forward on kernellab.swiglu / geglu (``_gated_rule``). The gate and up
    projections are made here and read by nothing else: their buffers take the gradients,
    and their product is made again in the backward instead of kept (three [N, I] tensors
    fewer at the step's peak; nn._gated)."""

    def __init__(self, op: str, opts: dict, fused: bool, backend: str | None, own: Callable):
        self.op, self.opts, self.fused, self.backend, self.own = op, opts, fused, backend, own

    def __call__(self, module, x):
        op, opts, backend = self.op, self.opts, self.backend
        if _model_code(backend):
            return self.own(module, x)
        if self.fused:
            a, b = module.gate_up_proj(x).chunk(2, dim=-1)
            return gated_down(a, b, module.down_proj, op, opts, backend)
        return gated_mlp(x, module.gate_proj, module.up_proj, module.down_proj, op, opts, backend)


def _gated_rule(op):
    def rule(path, parent, name, m, ctx):
        kind = _gated_mlp_kind(m)
        if kind is None or kind[0] != op:
            return None
        opts, fused, backend, own = kind[1], kind[2], ctx.backend_for(op), type(m).forward
        _set_forward(m, _GatedForward(op, opts, fused, backend, own), ctx)
        return f"forward on kernellab.{op}" + (" (fused gate_up_proj)" if fused else "")

    return rule


@dataclasses.dataclass(frozen=True)
class Rule:
    """One row of the replacement table: the kernellab op it needs, and
    ``apply(path, parent, name, module, ctx) -> description or None``."""

    op: str
    apply: Callable


RULES: tuple[Rule, ...] = (
    Rule("swiglu", _gated_rule("swiglu")),
    Rule("geglu", _gated_rule("geglu")),
    Rule("layer_norm", _rule_layer_norm),
    Rule("rms_norm", _rule_rms_norm),
    Rule("gelu", _rule_gelu),
    Rule("cross_entropy", _rule_cross_entropy),
)
# Ops the patch names but does not wire yet: they need a model-level rewrite (the LM
# head's forward, the rotary call inside attention, the residual add before the norm).
_NOT_WIRED = {
    "add_rms_norm": "the residual add sits in each decoder layer's forward",
}
OPS = ("attention", *dict.fromkeys(r.op for r in RULES), "rope", "linear_cross_entropy", *_NOT_WIRED)


# ----------------------------------------------------------------------------- rope

# module name -> [the family's own apply_rotary_pos_emb, patched models using the swap]
_ROPE_SWAPS: dict[str, list] = {}
# [forwards of rope-patched models running now]: the swapped function runs kernellab.rope
# only inside one, so an unpatched model of the same family keeps HF's own function.
_ROPE_ACTIVE = [0]


def _rope_enter(module, args, kwargs):
    _ROPE_ACTIVE[0] += 1


def _rope_exit(module, args, kwargs, output):
    _ROPE_ACTIVE[0] -= 1


def _hf_rope(original: Callable, backend: str | None, form: str = "neox", partial: bool = False) -> Callable:
    """``apply_rotary_pos_emb`` on kernellab.rope, rotating as ``form`` (ROPE_FORMS) says,
    for the call HF's attention makes (q and k (B, H, S, D), cos and sin (B or 1, S, D), or
    (B or 1, S, R < D) where ``partial``: the family's function rotates the first R columns and
    passes the rest, unsqueeze_dim=1); any other call, or one kernellab.rope refuses, runs
    the family's own function."""
    try:
        names = list(inspect.signature(original).parameters)[4:]
    except (TypeError, ValueError):
        names = []
    layout, from_half = form.split("-")[0], form == "interleaved-half"

    def apply_rotary_pos_emb(*args, **kwargs):
        if _model_code(backend) or len(args) < 4:
            return original(*args, **kwargs)
        q, k, cos, sin, *args = args
        extra = dict(zip(names, args), **kwargs) if args else kwargs
        plain = len(args) <= len(names) and all(
            (n == "unsqueeze_dim" and v == 1) or (n == "position_ids" and v is None) for n, v in extra.items()
        )
        if (plain and _ROPE_ACTIVE[0] > 0 and q.dim() == 4 and k.dim() == 4 and cos.dim() == 3
                and cos.shape == sin.shape and q.shape[-1] == k.shape[-1]
                and (cos.shape[-1] == q.shape[-1] or (partial and cos.shape[-1] < q.shape[-1]))
                and cos.shape[1] == q.shape[2]):  # fmt: skip
            try:
                if from_half:
                    cos, sin = _pairs_from_half(cos), _pairs_from_half(sin)
                return kl_ops.rope(q, k, cos, sin, layout=layout, backend=backend)
            except ValueError:
                pass
        return original(q, k, cos, sin, *args, **kwargs)

    apply_rotary_pos_emb._kernellab_original = original
    return apply_rotary_pos_emb


# The rotations of HF's call form that kernellab.rope computes (``_rope_form``): its neox
# layout (the head dim's halves: Llama's ``rotate_half``), its interleaved one (adjacent
# pairs: Cohere's ``rotate_half``), and the interleaved one with each pair's angle taken from
# the first half of cos and sin (Helium's, ERNIE's: ``cos[..., :D/2].repeat_interleave(2)``).
ROPE_FORMS = ("neox", "interleaved", "interleaved-half")


def _pairs_from_half(t: torch.Tensor) -> torch.Tensor:
    return t[..., : t.shape[-1] // 2].repeat_interleave(2, dim=-1)


def _rotation(q, k, cos, sin, form: str):
    """HF's call form (q, k (B, H, S, D), cos, sin (B, S, R <= D)) rotated as ``form`` says:
    the first R columns, the rest passed through (kernellab.rope's partial rotary)."""

    def rot(x):
        if form != "neox":
            return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)
        h = x.shape[-1] // 2
        return torch.cat((-x[..., h:], x[..., :h]), dim=-1)

    r = cos.shape[-1]
    if form == "interleaved-half":
        cos, sin = _pairs_from_half(cos), _pairs_from_half(sin)
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    return tuple(torch.cat((x[..., :r] * c + rot(x[..., :r]) * s, x[..., r:]), dim=-1) for x in (q, k))


def _same(out, want) -> bool:
    pairs = list(out) if isinstance(out, (tuple, list)) and len(out) == 2 else []
    close = [  # (values of order 1: another rotation is off by order 1)
        isinstance(o, torch.Tensor) and o.shape == w.shape and torch.allclose(o.double(), w, atol=1e-5)
        for o, w in zip(pairs, want)
    ]
    return bool(close) and all(close)


def _rope_form(fn: Callable) -> tuple[str | None, bool, str]:
    """(the one of ROPE_FORMS the family's ``apply_rotary_pos_emb`` computes, whether it
    rotates a partial width as kernellab.rope does, "") or (None, False, why it computes
    none). Families share the function's name, not its formula, and GPT-J's takes (x, sin,
    cos): so it is called on HF's call form with random fp32 q, k (1, 2, 3, 8) and cos, sin
    (1, 3, 8), then (1, 3, 4), and must return one form's rotation of both."""
    g = torch.Generator().manual_seed(0)
    shapes = ((1, 2, 3, 8), (1, 2, 3, 8), (1, 3, 8), (1, 3, 8))
    q, k, cos, sin = (torch.randn(*shape, generator=g) for shape in shapes)
    try:
        out = fn(q, k, cos, sin)
    except Exception as e:  # noqa: BLE001 - any failure: another call form
        return None, False, f"it does not take HF's (q, k, cos, sin) call ({type(e).__name__})"
    wide = [t.double() for t in (q, k, cos, sin)]
    form = next((f for f in ROPE_FORMS if _same(out, _rotation(*wide, f))), None)
    if form is None:
        return None, False, "its rotation is none of kernellab.rope's (halves of the head dim, pairs)"
    try:
        part = fn(q, k, cos[..., :4], sin[..., :4])
    except Exception:  # noqa: BLE001 - full-width calls only
        return form, False, ""
    return form, _same(part, _rotation(*wide[:2], wide[2][..., :4], wide[3][..., :4], form)), ""


class _RopeUndo:
    """A patched model's share of the family's swapped ``apply_rotary_pos_emb``: undone by
    unpatch, or when the model is garbage-collected still patched (the last share restores
    HF's function). A deep copy of the patched model holds a share of its own."""

    def __init__(self, name: str, model: nn.Module, hooks: tuple, backend: str | None = None):
        self.name, self.model, self.hooks, self.done = name, weakref.ref(model), hooks, False
        self.backend = backend
        _ROPE_SWAPS[name][1] += 1
        weakref.finalize(model, self)

    def __call__(self) -> None:
        if self.done:
            return
        self.done = True
        for h in self.hooks:
            h.remove()
        entry = _ROPE_SWAPS[self.name]
        entry[1] -= 1
        if entry[1] == 0:
            sys.modules[self.name].apply_rotary_pos_emb = entry[0]
            del _ROPE_SWAPS[self.name]

    def __deepcopy__(self, memo):
        model = memo.get(id(self.model()))  # the model's copy (a deep copy of the patched model)
        if self.done or model is None:
            return _spent_rope_undo(self.name)
        hooks = copy.deepcopy(self.hooks, memo)  # (handles on the copy's hooks)
        return _RopeUndo(self.name, model, hooks, self.backend)

    def __reduce__(self):
        """Pickled with its model (``torch.save(model)``): loaded, it takes a share of the
        family's swap again, swapping the function in where the loading process has not."""
        model = None if self.done else self.model()
        if model is None:
            return _spent_rope_undo, (self.name,)
        return _rope_share, (self.name, model, self.hooks, self.backend)


def _no_model() -> None:
    return None


def _spent_rope_undo(name: str) -> _RopeUndo:
    """A share already given back (or whose model is gone), as a copy or a load of one."""
    new = object.__new__(_RopeUndo)
    new.name, new.model, new.hooks, new.done, new.backend = name, _no_model, (), True, None
    return new


def _rope_share(name: str, model: nn.Module, hooks: tuple, backend: str | None) -> _RopeUndo:
    """A loaded patched model's share of the swap of module ``name``'s function."""
    import importlib

    why = _swap_rope(importlib.import_module(name), name, backend)
    if why is not None:  # (the family's function changed since the model was saved)
        raise ValueError(f"a patched model's rope: {name}.apply_rotary_pos_emb: {why}; save the "
                         "state_dict, and patch the model built again")  # fmt: skip
    return _RopeUndo(name, model, hooks, backend)


def _swap_rope(mod, name: str, backend: str | None) -> str | None:
    """Swap ``mod.apply_rotary_pos_emb`` for kernellab's (``_ROPE_SWAPS``), once per
    module; None, or why its rotation is none kernellab.rope computes."""
    if name in _ROPE_SWAPS:
        return None
    fn = mod.apply_rotary_pos_emb
    form, partial, why = _rope_form(fn)
    if form is None:
        return why
    _ROPE_SWAPS[name] = [fn, 0]
    swap = _hf_rope(fn, backend, form, partial)
    if not isinstance(fn, types.FunctionType):  # (transformers with `kernels`: an nn.Module)
        swap = type("apply_rotary_pos_emb", (_RopeSwap,), {"_rebuild": type(fn)})(swap)
    mod.apply_rotary_pos_emb = swap
    return None


class _RopeSwap:
    """The swap of a family's function that the ``kernels`` package wraps (transformers'
    ``use_kernel_forward_from_hub``: an nn.Module per function, each attention module holding
    a private instance of its class). ``kernels`` pickles a private instance as the module
    name and rebuilds it as ``type(module.apply_rotary_pos_emb)()``; while the function is
    swapped that is this class, whose call without arguments makes the wrapped class's
    instance (``_rebuild``), so that a patched model loads while the swap is in place."""

    _rebuild: type

    def __new__(cls, fn: Callable | None = None):
        if fn is None:  # (kernels' _rebuild_kernel_func)
            return cls._rebuild()
        return super().__new__(cls)

    def __init__(self, fn: Callable):
        self.fn = fn
        self._kernellab_original = fn._kernellab_original

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)


def _patch_hf_rope(model, ctx: _Ctx) -> None:
    """The family's module-level ``apply_rotary_pos_emb`` (what its attention forward
    calls) swapped while at least one patched model of the family exists; the swap runs
    kernellab.rope only while a patched model's forward runs (hooks count them), so an
    unpatched model of the family keeps HF's function."""
    name = type(model).__module__
    mod = sys.modules.get(name)
    fn = getattr(mod, "apply_rotary_pos_emb", None) if mod is not None else None
    if not callable(fn):
        ctx.report.left.append(("rope", "", f"{type(model).__name__}: no apply_rotary_pos_emb (no rotary embedding)"))
        return
    why = _swap_rope(mod, name, ctx.backend_for("rope"))
    if why is not None:
        short = name.rsplit(".", 1)[-1]
        ctx.report.left.append(("rope", "", f"{short}.apply_rotary_pos_emb: {why}"))
        return
    hooks = (model.register_forward_pre_hook(_rope_enter, with_kwargs=True),
             model.register_forward_hook(_rope_exit, with_kwargs=True, always_call=True))  # fmt: skip
    ctx.undo.append(_RopeUndo(name, model, hooks, ctx.backend_for("rope")))
    short = name.rsplit(".", 1)[-1]
    ctx.report.replaced.append(("rope", "", f"{short}.apply_rotary_pos_emb in this model's forward",
                                "kernellab.rope"))  # fmt: skip


# ----------------------------------------------------------------------------- attention


@dataclasses.dataclass
class _AttnPolicy:
    backend: str | None
    on_unsupported: str
    report: PatchReport
    original: str | None = None  # the model's attention implementation before the patch
    hf: bool = False  # a Hugging Face model's (its config names the "kernellab" attention function)

    def __setstate__(self, state) -> None:
        """A patched Hugging Face model loaded in another process (``torch.load``) finds
        the "kernellab" attention function registered with transformers."""
        self.__dict__.update(state)
        if self.hf:
            _register_hf_attention()


# Keywords transformers' attention modules pass along that do not change the result (the
# cache's bookkeeping, what the layer returns, the loss's token count). Any other keyword
# with a value (gpt-oss's sinks ``s_aux``, a ``head_mask``, packed sequences'
# ``cu_seq_lens_q``) sends the call to the attention the model ran before the patch where
# that was a kernel library's (FlashAttention), else to the family's eager attention.
_ATTN_INERT_KWARGS = frozenset((
    "position_ids", "cache_position", "use_cache", "past_key_value", "past_key_values", "position_embeddings",
    "output_attentions", "output_hidden_states", "output_router_logits", "return_dict", "layer_idx",
    "num_items_in_batch",
))  # fmt: skip


def _unread_kwargs(kwargs) -> list[str]:
    """The keywords of an attention call that kernellab.attention would ignore."""
    given = (k for k, v in kwargs.items() if v is not None and v is not False)
    return sorted(k for k in given if k not in _ATTN_INERT_KWARGS)


def _fallback_reason(module, query, key, value, attention_mask, dropout, sliding_window, is_causal, kw=()):
    unread = _unread_kwargs(dict(kw))
    if unread:
        return f"keywords kernellab attention does not take ({', '.join(unread)})"
    if attention_mask is not None:
        return "attention mask (padding or custom) given"
    if dropout:
        return "attention dropout > 0 in training"
    if query.dim() != 4 or key.shape != value.shape or query.shape[-1] != key.shape[-1]:
        return "shapes other than (B, H, S, D) with k, v alike"
    if query.shape[1] % key.shape[1]:
        return "query heads not a multiple of key/value heads"
    if is_causal and query.shape[2] > 1 and query.shape[2] != key.shape[2]:
        return "causal prefill into a longer cache (top-left aligned)"
    if sliding_window and not is_causal:
        return "sliding window without causal"
    return None


def _hf_attention(
    module,
    query,
    key,
    value,
    attention_mask,
    scaling=None,
    dropout=0.0,
    sliding_window=None,
    softcap=None,
    **kwargs,
):
    """transformers' attention-function contract: q (B, H, S_q, D), k/v (B, H_kv, S_k, D)
    -> ((B, S_q, H, D), None)."""
    policy = getattr(module, "_kernellab_attention", None)
    is_causal = kwargs.pop("is_causal", None)
    is_causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    why = _fallback_reason(module, query, key, value, attention_mask, dropout, sliding_window, is_causal,
                           kwargs)  # fmt: skip
    counting = policy is not None and not torch.compiler.is_compiling()
    if why is not None or _model_code(policy.backend if policy is not None else None):
        if why is not None and policy is not None and policy.on_unsupported == "raise":
            raise ValueError(f"kernellab attention cannot compute this call exactly: {why}")
        if counting:
            policy.report.attention_fallbacks[why] += 1
            policy.report.attention_calls["fallback"] += 1
        opts = dict(scaling=scaling, dropout=dropout, sliding_window=sliding_window, softcap=softcap)
        original = policy.original if policy is not None else None
        return _hf_fallback(module, query, key, value, attention_mask, is_causal=is_causal, original=original,
                            **opts, **kwargs)  # fmt: skip
    if counting:
        policy.report.attention_calls["kernellab"] += 1
    window = (sliding_window - 1, 0) if sliding_window else None
    out = kl_ops.attention(
        query,
        key,
        value,
        causal=bool(is_causal),
        scale=scaling,
        window=window,
        softcap=softcap or None,
        backend=policy.backend if policy is not None else None,
    )
    return out.transpose(1, 2).contiguous(), None


def _causal_mask(query, key, sliding_window):
    """The (1, 1, S_q, S_k) boolean mask a None mask stands for under is_causal: top-left
    aligned as SDPA's is_causal (the only None-mask case with 1 < S_q != S_k is a prefill
    from position 0), with the sliding window ``_hf_mask`` left out of the mask."""
    i = torch.arange(query.shape[2], device=query.device)[:, None]
    j = torch.arange(key.shape[2], device=query.device)[None, :]
    keep = j <= i
    if sliding_window:
        keep = keep & (j > i - sliding_window)
    return keep[None, None]


def _hf_fallback(module, query, key, value, mask, *, scaling, dropout, sliding_window, softcap, is_causal,
                 original=None, **kw):  # fmt: skip
    """transformers' own path: SDPA; the family's eager attention where a softcap is set
    (SDPA has no softcap) or a keyword SDPA's path ignores is given (``_unread_kwargs``;
    the model's own FlashAttention there where ``original``, its implementation before the
    patch, was one), with a boolean mask made additive as eager expects. A None mask
    is made only where a window or the eager path needs one: a plain causal call goes to
    SDPA with is_causal, as transformers' own mask function leaves it (a materialized mask
    keeps SDPA off its causal kernels)."""
    eager_only = softcap or _unread_kwargs(kw)  # what SDPA's path would drop
    own = _HF["functions"].get(original) if original and "flash" in original else None
    if _unread_kwargs(kw) and own is not None:  # the model's FlashAttention: it reads them
        opts = dict(dropout=dropout, scaling=scaling, sliding_window=sliding_window, softcap=softcap)
        return own(module, query, key, value, mask, is_causal=is_causal, **opts, **kw)
    if mask is None and is_causal and query.shape[2] > 1 and (sliding_window or eager_only):
        mask = _causal_mask(query, key, sliding_window)
    if eager_only:
        eager = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
        if eager is None:
            what = f"softcap={softcap}" if softcap else ", ".join(_unread_kwargs(kw))
            raise ValueError(f"no eager attention for {type(module).__name__} to apply {what}")
        if mask is not None and mask.dtype == torch.bool:
            neg = torch.finfo(query.dtype).min
            mask = torch.zeros(mask.shape, dtype=query.dtype, device=query.device).masked_fill(~mask, neg)
        opts = dict(dropout=dropout, scaling=scaling, sliding_window=sliding_window, softcap=softcap)
        return eager(module, query, key, value, mask, **opts, **kw)
    opts = dict(dropout=dropout, scaling=scaling, is_causal=is_causal)
    return _HF["sdpa_attention_forward"](module, query, key, value, mask, **opts, **kw)


def _hf_mask(*args, local_size=None, allow_is_causal_skip=True, **kwargs):
    """transformers' SDPA mask, except where shapes and Python values alone show that no
    mask is needed; then None, as transformers itself returns in eager mode:

    - no padding mask and the cache offsets plain integers: a causal mask SDPA's is_causal
      stands for (S_q == 1, S_q == S_k or no query offset; no window that bites), or a
      bidirectional one with nothing to mask;
    - a sliding-window causal mask with no padding, in a plain prefill (no cache offset,
      S_q == S_k) or a one-token decode step: the attention function passes the window to
      the kernel (aligned bottom-right: the query is the last key of the cache).

    transformers skips only when not tracing, and with torch before 2.14 Dynamo answers
    every torch.compile as an export: the compiled model carries a materialized mask,
    which keeps SDPA off flash and cuDNN (ViT's falls to the math path) and kernellab's
    attention on its fallback. These conditions read no tensor, so they hold under
    torch.compile, whose guards cover the shapes they read."""
    mu = _HF["masking_utils"]
    if len(args) > 5:  # (transformers passes keywords; a call that does not is left to it)
        return mu.sdpa_mask(*args, local_size=local_size, allow_is_causal_skip=allow_is_causal_skip, **kwargs)
    bound = dict(zip(("batch_size", "q_length", "kv_length", "q_offset", "kv_offset"), args))
    bound.update(kwargs)
    config = kwargs.get("config")
    q_len, kv_len = bound["q_length"], bound["kv_length"]
    q_off, kv_off = bound.get("q_offset", 0), bound.get("kv_offset", 0)
    ints = isinstance(q_off, int) and isinstance(kv_off, int)
    unpadded = bound.get("attention_mask") is None
    window_free = local_size is None or kv_len < local_size
    if unpadded and ints and window_free:
        if allow_is_causal_skip and (q_len == 1 or kv_len == q_len or q_off == 0):
            return None
        if kwargs.get("allow_is_bidirectional_skip", False):
            return None
    plain = ints and (q_len == 1 or (q_off == 0 and kv_off == 0 and q_len == kv_len))
    if (
        plain
        and allow_is_causal_skip
        and local_size is not None
        and config is not None
        and getattr(config, "sliding_window", None) == local_size
        and getattr(config, "attention_chunk_size", None) is None
    ):
        if unpadded:
            return None
        pad = mu.prepare_padding_mask(bound.get("attention_mask"), kv_len, kv_off)
        if mu._ignore_causal_mask_sdpa(pad, q_len, kv_len, q_off, kv_off, None):
            return None
    return mu.sdpa_mask(*args, local_size=local_size, allow_is_causal_skip=allow_is_causal_skip, **kwargs)


# What the attention and mask functions call from transformers, imported when a model is
# patched: an import inside a function that torch.compile traces breaks the graph where
# the package is a lazy module (torch 2.11 with transformers' _LazyModule).
_HF: dict = {}


def _register_hf_attention():
    from transformers import AttentionInterface, masking_utils
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    _HF.update(masking_utils=masking_utils, sdpa_attention_forward=sdpa_attention_forward,
               functions=ALL_ATTENTION_FUNCTIONS)  # fmt: skip

    AttentionInterface.register("kernellab", _hf_attention)
    AttentionMaskInterface.register("kernellab", _hf_mask)


def _unpatch_hf_attention(model, tagged: list, before) -> None:
    for m in tagged:
        del m._kernellab_attention
    if hasattr(model, "set_attn_implementation") and before is not None:
        model.set_attn_implementation(before)
    else:
        model.config._attn_implementation = before


def _patch_hf_attention(model, ctx: _Ctx) -> None:
    config = model.config
    before = getattr(config, "_attn_implementation", None)
    upcast = getattr(config, "reorder_and_upcast_attn", False) and config.model_type == "gpt2"
    if upcast and before == "eager":
        why = "GPT-2 eager with reorder_and_upcast_attn (its own fp32 path)"
        ctx.report.left.append(("attention", "", why))
        return
    _register_hf_attention()
    policy = _AttnPolicy(ctx.backend_for("attention"), ctx.on_unsupported, ctx.report, before, hf=True)
    tagged = [m for m in model.modules() if type(m).__name__.endswith("Attention")]
    for m in tagged:
        m._kernellab_attention = policy
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation("kernellab")
    else:
        config._attn_implementation = "kernellab"

    ctx.undo.append(_Undo(_unpatch_hf_attention, model, tagged, before))
    for path, m in model.named_modules():
        if m in tagged:
            ctx.report.replaced.append(("attention", path, f"{before} attention", "kernellab.attention"))


class _SDPAMode(torch.overrides.TorchFunctionMode):
    """Sends F.scaled_dot_product_attention to kernellab.attention when it computes the
    call exactly, PyTorch's otherwise (counted)."""

    def __init__(self, policy: _AttnPolicy):
        super().__init__()
        self.policy = policy

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale")
            bound = dict(zip(names, args), **kwargs)
            counting = not torch.compiler.is_compiling()
            ok = klF.sdpa_supported(
                bound["query"], bound["key"], bound["value"], bound.get("attn_mask"),
                bound.get("dropout_p", 0.0), bound.get("is_causal", False), bound.get("enable_gqa", False),
                bound.get("scale"),
            )
            if ok:
                if counting:
                    self.policy.report.attention_calls["kernellab"] += 1
                return klF.scaled_dot_product_attention(**bound, backend=self.policy.backend)
            if self.policy.on_unsupported == "raise":
                raise ValueError("kernellab attention cannot compute this SDPA call exactly "
                                 "(mask, dropout, causal with S_q != S_k, or head layout)")
            if counting:
                self.policy.report.attention_calls["fallback"] += 1
                self.policy.report.attention_fallbacks["SDPA call with mask, dropout or layout"] += 1
        return func(*args, **kwargs)


class _SDPAForward:
    """A plain module's forward, its SDPA calls under ``_SDPAMode``: ``inner``, an instance
    forward set before the patch, or else the class's forward ``own``."""

    def __init__(self, inner: Callable | None, own: Callable):
        self.inner, self.own = inner, own

    def __call__(self, module, *args, **kwargs):
        with _SDPAMode(module.__dict__["_kernellab_patch"].sdpa):
            return self.own(module, *args, **kwargs) if self.inner is None else self.inner(*args, **kwargs)


def _patch_sdpa_calls(model, ctx: _Ctx) -> None:
    ctx.sdpa = _AttnPolicy(ctx.backend_for("attention"), ctx.on_unsupported, ctx.report)
    inner, own = model.__dict__.get("forward"), type(model).forward  # (an instance forward set before)
    _set_forward(model, _SDPAForward(inner, own), ctx)
    what = ("attention", "", "F.scaled_dot_product_attention calls", "kernellab.attention")
    ctx.report.replaced.append(what)


# ----------------------------------------------------------------------------- loss


class _HFCausalLMLoss:
    """transformers' ForCausalLMLoss (``own``) on kernellab.cross_entropy; an object, not a
    closure, so that a patched model pickles (``_BoundForward``)."""

    def __init__(self, backend: str | None, own: Callable):
        self.backend, self.own = backend, own

    def __call__(self, logits, labels, vocab_size, num_items_in_batch=None, ignore_index=-100,
                 shift_labels=None, **kwargs):  # fmt: skip
        backend = self.backend
        if _model_code(backend):
            return self.own(logits, labels, vocab_size, num_items_in_batch=num_items_in_batch,
                            ignore_index=ignore_index, shift_labels=shift_labels, **kwargs)  # fmt: skip
        # transformers' ForCausalLMLoss with kernellab.cross_entropy: fp32 logits, labels
        # shifted left with ignore_index padding, sum / num_items_in_batch or mean.
        logits = logits.float()
        if shift_labels is None:
            labels = F.pad(labels, (0, 1), value=ignore_index)
            shift_labels = labels[..., 1:].contiguous()
        logits = logits.view(-1, vocab_size)
        shift_labels = shift_labels.view(-1).to(logits.device)
        reduction = "sum" if num_items_in_batch is not None else "mean"
        out = kl_ops.cross_entropy(logits, shift_labels, ignore_index=ignore_index, reduction=reduction,
                                      backend=backend)
        if reduction == "sum":
            if torch.is_tensor(num_items_in_batch):
                num_items_in_batch = num_items_in_batch.to(out.device)
            out = out / num_items_in_batch
        return out


def _unpatch_hf_loss(model, had: bool) -> None:
    if not had:
        del model._loss_function


def _patch_hf_loss(model, ctx: _Ctx) -> None:
    from transformers.loss.loss_utils import LOSS_MAPPING

    causal_lm = LOSS_MAPPING.get("ForCausalLM")
    if not hasattr(type(model), "loss_function") or model.loss_function is not causal_lm:
        return
    had = "_loss_function" in model.__dict__
    model.loss_function = _HFCausalLMLoss(ctx.backend_for("cross_entropy"), causal_lm)
    ctx.undo.append(_Undo(_unpatch_hf_loss, model, had))
    ctx.report.replaced.append(("cross_entropy", "", "ForCausalLMLoss", "kernellab.cross_entropy"))


def _fused_lce_reason(model) -> str | None:
    """Why ``model``'s LM head + loss cannot be fused (None: it can)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if not isinstance(head, nn.Linear):
        return "no nn.Linear output embedding"
    if getattr(model, model.base_model_prefix, None) is None:
        return f"no base model at .{model.base_model_prefix}"
    if getattr(model.config, "final_logit_softcapping", None):
        return "final logit softcap (tanh between the head and the loss) is not fused"
    if not type(model).__name__.endswith("ForCausalLM") and not type(model).__name__.endswith("LMHeadModel"):
        return f"{type(model).__name__} is not a causal LM"
    return None


def _head_mismatch(model) -> str | None:
    """Why the fused loss would not be the model's, or None: the model's own forward must
    give logits = head(last hidden state). Families put steps between them under other
    names (Cohere multiplies by ``logit_scale``, Granite divides by ``logits_scaling``,
    HyperCLOVA X multiplies by it), so the forward is run once, in eval mode, on 4 tokens,
    beside the base model and the head; a model that cannot run here is not fused either."""
    head = model.get_output_embeddings()
    flags = [(m, m.training) for m in model.modules()]
    ids = torch.arange(1, 5, device=head.weight.device).clamp(max=head.weight.shape[0] - 1)[None]
    try:
        model.eval()
        with torch.no_grad():
            logits = type(model).forward(model, input_ids=ids).logits
            h = getattr(model, model.base_model_prefix)(input_ids=ids).last_hidden_state
            mine = head(h)
    except Exception as e:  # noqa: BLE001 - weights on the meta device, a forward that needs more
        return f"the model's logits could not be checked against head(hidden states) ({type(e).__name__})"
    finally:
        for m, training in flags:
            m.training = training
    if logits is None or logits.shape != mine.shape:
        return "the model's forward returns no logits of head(hidden states)'s shape"
    scale = mine.float().abs().max().item()
    if not (logits.float() - mine.float()).abs().max().item() <= 1e-3 * scale + 1e-6:
        return "the model's logits are not head(hidden states) (a scale or cap between them): not fused"
    return None


# keywords of a causal LM's forward that its base model does not take
_LM_OWN_KWARGS = ("labels", "logits_to_keep", "num_items_in_batch", "shift_labels", "return_dict")


class _FusedLCEForward:
    """A causal LM's forward that, given labels, feeds the hidden states and the head's
    weight to kernellab.linear_cross_entropy (``_patch_hf_fused_lce``); ``original``: the
    model class's forward; ``output``: transformers' CausalLMOutputWithPast."""

    def __init__(self, backend: str | None, original: Callable, output: type):
        self.backend, self.original, self.output = backend, original, output

    def __call__(self, module, input_ids=None, labels=None, **kwargs):
        backend, original = self.backend, self.original
        shift = kwargs.get("shift_labels")
        if labels is None and shift is None:
            return original(module, input_ids=input_ids, **kwargs)
        if _model_code(backend):
            return original(module, input_ids=input_ids, labels=labels, **kwargs)
        n_items = kwargs.get("num_items_in_batch")
        base_kw = {k: v for k, v in kwargs.items() if k not in _LM_OWN_KWARGS}
        out = getattr(module, module.base_model_prefix)(input_ids=input_ids, **base_kw)
        h = out.last_hidden_state
        if shift is None:  # transformers' ForCausalLMLoss: labels shifted left, -100 padded
            shift = F.pad(labels, (0, 1), value=-100)[..., 1:]
        head = module.get_output_embeddings()
        reduction = "sum" if n_items is not None else "mean"
        loss = kl_ops.linear_cross_entropy(h.reshape(-1, h.shape[-1]), head.weight,
                                           shift.reshape(-1).to(h.device), head.bias, ignore_index=-100,
                                           reduction=reduction, backend=backend)  # fmt: skip
        if n_items is not None:
            loss = loss / (n_items.to(loss.device) if torch.is_tensor(n_items) else n_items)
        return self.output(loss=loss, logits=None, past_key_values=getattr(out, "past_key_values", None),
                           hidden_states=getattr(out, "hidden_states", None),
                           attentions=getattr(out, "attentions", None))  # fmt: skip


def _patch_hf_fused_lce(model, ctx: _Ctx) -> bool:
    """A causal LM's forward that, given labels, runs the base model and then
    kernellab.linear_cross_entropy on the hidden states and the head's weight: the (B, T, V)
    logits are never stored, and the output carries the loss with ``logits=None``. Without
    labels it is the model's own forward. Returns False (reported as left) where the
    model does not fit (``_fused_lce_reason``)."""
    why = _fused_lce_reason(model) or _head_mismatch(model)
    if why is not None:
        ctx.report.left.append(("linear_cross_entropy", "", why))
        return False
    from transformers.modeling_outputs import CausalLMOutputWithPast

    backend = ctx.backend_for("linear_cross_entropy")
    _set_forward(model, _FusedLCEForward(backend, type(model).forward, CausalLMOutputWithPast), ctx)
    ctx.report.replaced.append(("linear_cross_entropy", "", "lm_head + ForCausalLMLoss",
                                "kernellab.linear_cross_entropy (logits not stored)"))  # fmt: skip
    return True


# ----------------------------------------------------------------------------- patch / unpatch


def _is_hf(model) -> bool:
    mod = sys.modules.get("transformers")
    return mod is not None and isinstance(model, mod.PreTrainedModel)


def _check_backends(backend, wanted) -> None:
    """A ValueError naming ``backend`` where it names a backend no op it applies to has (a
    dict: per op; a str: across the ops patched), at patch time rather than at the first
    forward."""
    from kernellab.core import registry

    def names(op):
        return {i.backend for i in registry.impls(op)} if op in registry.op_names() else set()

    if isinstance(backend, dict):
        for op, b in backend.items():
            if op not in OPS:
                raise ValueError(f"backend: unknown op {op!r}; known: {list(OPS)}")
            if b is not None and (not isinstance(b, str) or b not in names(op)):  # None: the default
                raise ValueError(f"backend: {op} has no backend {b!r}; it has {sorted(names(op))}")
    elif isinstance(backend, str) and not any(backend in names(op) for op in wanted):
        raise ValueError(f"backend: no op patched has a backend {backend!r}")


def patch(
    model: nn.Module,
    ops: list[str] | tuple[str, ...] | None = None,
    backend: str | dict[str, str] | None = None,
    fused_linear_cross_entropy: bool = False,
    verbose: bool = True,
    *,
    on_unsupported: str = "fallback",
) -> PatchReport:
    """Put kernellab ops into ``model`` in place (module docstring) and return what was
    replaced and what was left. ``ops``: op names from ``kernellab.patch.OPS`` (default:
    every op this build has). ``backend``: one backend for every op, or ``{op: backend}``
    (default: kernellab's choice). ``on_unsupported``: an attention call kernellab cannot
    compute exactly runs PyTorch's / transformers' (``"fallback"``, counted in the report)
    or raises ValueError (``"raise"``). ``verbose`` prints the report."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if "_kernellab_patch" in model.__dict__:
        raise ValueError("model is already patched by kernellab.patch; call kernellab.unpatch(model) first")
    if on_unsupported not in ("fallback", "raise"):
        raise ValueError(f"on_unsupported must be 'fallback' or 'raise', got {on_unsupported!r}")
    if backend is not None and not isinstance(backend, (str, dict)):
        raise TypeError(f"backend must be a str, a dict op -> str or None, got {type(backend).__name__}")
    if isinstance(ops, str):
        raise TypeError(f"ops must be a list or tuple of op names, got the str {ops!r} (write [{ops!r}])")
    wanted = list(OPS) if ops is None else list(ops)
    unknown = [op for op in wanted if op not in OPS]
    if unknown:
        raise ValueError(f"ops: unknown {unknown}; known: {list(OPS)}")
    _check_backends(backend, wanted)
    if ops is not None:
        missing = [op for op in wanted if op != "attention" and op not in kl_ops.FUNCTIONS]
        if missing:
            raise ValueError(f"ops: {missing} not in this kernellab build")
    hf = _is_hf(model)
    name = type(model).__name__ + (f" ({model.config.model_type})" if hf else "")
    report = PatchReport(name, backend)
    ctx = _Ctx(report, backend, [], on_unsupported, hf)

    for op in _NOT_WIRED:
        if op in wanted:
            why = _NOT_WIRED[op] if op in kl_ops.FUNCTIONS else f"kernellab.{op} not in this build"
            report.left.append((op, "", why))
    if fused_linear_cross_entropy:
        if "linear_cross_entropy" not in kl_ops.FUNCTIONS:
            raise ValueError(
                "fused_linear_cross_entropy=True needs kernellab.linear_cross_entropy (not in this build)"
            )
        if not hf:
            report.left.append(("linear_cross_entropy", "", "a plain module's head and loss: use "
                                "kernellab.nn.LinearCrossEntropyLoss in the model"))  # fmt: skip

    rules = []
    for rule in RULES:
        if rule.op not in wanted:
            continue
        if rule.op not in kl_ops.FUNCTIONS:
            report.left.append((rule.op, "", f"kernellab.{rule.op} not in this build"))
            continue
        rules.append(rule)
    try:
        _walk(model, "", rules, ctx, done=set())
        if "attention" in wanted:
            if hf:
                _patch_hf_attention(model, ctx)
            else:
                _patch_sdpa_calls(model, ctx)
        if "rope" in wanted and "rope" not in kl_ops.FUNCTIONS:
            report.left.append(("rope", "", "kernellab.rope not in this build"))
        elif "rope" in wanted:
            if hf:
                _patch_hf_rope(model, ctx)
            else:
                report.left.append(("rope", "", "a plain module's rotary code: call kernellab.rope in the model"))
        fused = hf and fused_linear_cross_entropy and _patch_hf_fused_lce(model, ctx)
        if hf and "cross_entropy" in wanted and not fused:
            _patch_hf_loss(model, ctx)
    except BaseException:
        for undo in reversed(ctx.undo):
            undo()
        raise
    model._kernellab_patch = ctx
    if verbose:
        print(report)
    return report


def _walk(module: nn.Module, prefix: str, rules, ctx: _Ctx, done: set) -> None:
    for name, child in list(module.named_children()):
        path = f"{prefix}.{name}" if prefix else name
        if id(child) in done:  # a module shared by two parents is patched once
            continue
        done.add(id(child))
        for rule in rules:
            after = rule.apply(path, module, name, child, ctx)
            if after is not None:
                ctx.report.replaced.append((rule.op, path, type(child).__name__, after))
                break
        else:
            _walk(child, path, rules, ctx, done)


def unpatch(model: nn.Module) -> None:
    """Undo ``patch(model)`` exactly: the original modules, classes, forwards, attention
    implementation and loss function (the Parameter objects were never replaced)."""
    ctx = model.__dict__.get("_kernellab_patch")
    if ctx is None:
        raise ValueError("model is not patched by kernellab.patch")
    for undo in reversed(ctx.undo):
        undo()
    del model._kernellab_patch
