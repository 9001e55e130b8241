"""Reference and baseline backends of attention: the float64 reference, manual, torch
(SDPA's own choice), the SDPA peers sdpa_flash / sdpa_cudnn / sdpa_efficient (one SDPA
kernel forced through ``torch.nn.attention.sdpa_kernel``) and compile (torch.compile of
manual).

Causal is bottom-right everywhere (see the package docstring). SDPA's ``is_causal`` is
top-left, which is the same thing when S_q == S_k; for S_q != S_k the torch backend passes
the bottom-right boolean mask instead, and the flash / cuDNN peers refuse (torch reaches
neither with a bottom-right mask of unequal lengths).

GQA (k/v with fewer heads than q): the float64 reference and manual expand k and v to q's
heads (repeat_interleave: a copy, fine for a reference and a naive baseline; autograd sums
dk, dv back over each group); torch, sdpa_flash and sdpa_cudnn pass ``enable_gqa=True``
(torch's sdp_utils admits GQA for flash and cuDNN; on the CPU SDPA's math path expands);
sdpa_efficient refuses it (its sdp_utils constraints are compiled without GQA, so forcing
it would end in "No available kernel").
"""

from __future__ import annotations

import functools
import math
import sys

import torch
import torch.nn.functional as F

from kernellab.core.registry import register
from kernellab.core.spec import upcast
from kernellab.cuda import nodes
from kernellab.ops._baselines import compiled, register_baseline
from kernellab.ops.attention.args import (
    allowed_mask,
    causal_allowed,
    check_dtype,
    check_head_dim,
    expand_kv,
    has_softcap,
    is_gqa,
    refuse_gqa,
    refuse_options,
    resolve_scale,
    window_bounds,
)


def _reference_rows(q, k, v, i0: int, causal: bool, sc: float, s_q: int, window=None, softcap=None):
    """Reference output of query rows [i0, i0 + q.shape[-2]) of a problem with s_q rows."""
    s = torch.matmul(q, k.transpose(-1, -2)) * sc
    if has_softcap(softcap):
        s = softcap * torch.tanh(s / softcap)
    allowed = allowed_mask(s_q, k.shape[-2], causal, window, q.device)
    if allowed is not None:
        allowed = allowed[i0 : i0 + q.shape[-2]]
        has_key = allowed.any(-1, keepdim=True)
        fill = torch.where(has_key, float("-inf"), 0.0).to(s.dtype)
        s = torch.where(allowed, s, fill)
        p = torch.softmax(s, dim=-1) * has_key
    else:
        p = torch.softmax(s, dim=-1)
    return torch.matmul(p, v)


# Scores kept at once by the reference: 2^27 float64 (1 GiB). Bigger problems (the bench's
# B=1 H=16 S=16384: 34 GB of float64 scores) are computed in query-row chunks, each under
# activation checkpointing, so autograd of the reference holds one chunk's scores too.
_REF_CHUNK_ELEMS = 2**27


def reference_attention(q, k, v, causal: bool = False, scale=None, window=None, softcap=None):
    """softmax(q k^T scale) v in the inputs' dtype (float64 in the check), bottom-right
    causal mask built explicitly; query rows with no allowed key give 0.

    Differentiable: the empty rows' scores are set to 0 (not -inf) before the softmax and
    the probabilities multiplied by 0 after, so no NaN reaches autograd."""
    sc = resolve_scale(q, scale)
    k, v = expand_kv(q, k, v)
    s_q, s_k = q.shape[-2], k.shape[-2]
    heads = max(1, q.numel() // max(1, s_q * q.shape[-1]))
    rows = max(1, _REF_CHUNK_ELEMS // max(1, heads * s_k))
    if rows >= s_q:
        return _reference_rows(q, k, v, 0, causal, sc, s_q, window, softcap)
    from torch.utils.checkpoint import checkpoint

    outs = []
    for i0 in range(0, s_q, rows):
        qi = q[..., i0 : i0 + rows, :]
        if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
            outs.append(
                checkpoint(
                    _reference_rows, qi, k, v, i0, causal, sc, s_q, window, softcap, use_reentrant=False
                )
            )
        else:
            outs.append(_reference_rows(qi, k, v, i0, causal, sc, s_q, window, softcap))
    return torch.cat(outs, dim=-2)


def manual_attention(q, k, v, causal: bool = False, scale=None, window=None, softcap=None):
    """softmax(QK^T * scale) V with PyTorch ops: the S x S scores materialized in fp32."""
    # Scores in fp32 (q, k upcast): scores rounded to bf16 before the softmax would cost
    # ~|s| 2^-9 in every exponent, far more than any fused kernel's error. P is rounded to
    # the input dtype before PV, as the fused kernels do.
    sc = resolve_scale(q, scale)
    k, v = expand_kv(q, k, v)
    s = torch.matmul(upcast(q), upcast(k).transpose(-1, -2)) * sc
    if has_softcap(softcap):
        s = softcap * torch.tanh(s / softcap)
    allowed = allowed_mask(q.shape[-2], k.shape[-2], causal, window, q.device)
    if allowed is not None:
        has_key = allowed.any(-1, keepdim=True)
        s = s.masked_fill(~allowed, float("-inf")).masked_fill(~has_key, 0.0)
        p = torch.softmax(s, dim=-1) * has_key
    else:
        p = torch.softmax(s, dim=-1)
    p = p.to(q.dtype)
    if q.device.type == "cpu" and p.dtype in (torch.float16, torch.bfloat16):
        # PyTorch's 16-bit CPU GEMM on AMX machines (torch 2.13, oneDNN) carries a NaN of
        # one row of P into the row packed beside it. The rounded P and v multiplied in
        # fp32 are the same products summed in fp32, with each row's NaN its own (and the
        # gradients' products likewise, through the casts).
        return torch.matmul(p.float(), v.float()).to(q.dtype)
    return torch.matmul(p, v)


# --------------------------------------------------------------------------- SDPA


def _as4d(t: torch.Tensor) -> torch.Tensor:
    # SDPA's fused kernels take 4-D (B, H, S, D) only: fold every leading dim into H.
    return t.reshape((1, math.prod(t.shape[:-2])) + tuple(t.shape[-2:]))  # (-1 fails on 0 elements)


def _tf32_fp32(q) -> bool:
    return q.dtype == torch.float32 and q.is_cuda and torch.backends.cuda.matmul.allow_tf32


def _aligned(t: torch.Tensor) -> torch.Tensor:
    # SDPA's fused CUDA kernels read 16-byte vectors without checking the base pointer
    # (torch 2.11, Hopper): an fp32 input with a storage offset of one element faults with
    # "misaligned address", which poisons the CUDA context for the rest of the process. A
    # misaligned input gets an aligned copy (what .contiguous() would not do: the tensor
    # already is contiguous).
    # Not while torch.compile traces: data_ptr() breaks the graph (at every attention
    # call of a compiled model), and Inductor's SDPA lowering lays out its own inputs.
    if torch.compiler.is_compiling():
        return t
    return t.clone() if t.is_cuda and t.data_ptr() % 16 else t


def _fit_grad(g: torch.Tensor) -> torch.Tensor:
    # The output gradient as SDPA's backward kernels want it (torch 2.11, Hopper).
    # Misaligned (CUDA): a bf16/fp16 dy with a storage offset of one element makes the
    # cuDNN backward fail ("mha_graph.execute ... is_good()") or fault with "misaligned
    # address": an aligned copy. Zero strides (a dy expanded over batch and heads: the
    # grad of a broadcast, or the check's "expanded" layout): over NaN-poisoned memory the
    # fp16/bf16 backward returns dq with NaN rows in every head but the first, where the
    # same values laid out contiguously give the right dq. A contiguous copy (one B*H*S*D
    # write, small beside the backward's S^2 work) keeps SDPA on the layout it is tested
    # with.
    if g is None:  # (an undefined gradient: gradcheck sends one)
        return g
    if any(st == 0 and n > 1 for st, n in zip(g.stride(), g.shape)):
        return g.contiguous()
    return _aligned(g)


class _NoSecondDerivative(torch.autograd.Function):
    """Identity on one gradient of a fused SDPA kernel, whose own backward has no
    derivative: differentiating it again raises a clear error instead of PyTorch's
    "derivative for aten::_scaled_dot_product_..._backward is not implemented"."""

    @staticmethod
    def forward(ctx, g, kernel):
        ctx.kernel = kernel
        return g.view_as(g)

    @staticmethod
    def backward(ctx, gg):
        raise RuntimeError(
            "attention/torch: double backward (a gradient of dq, dk or dv taken with "
            f"create_graph=True) is not supported: PyTorch's fused SDPA kernel ({ctx.kernel}) "
            "has no derivative of its backward. backend='manual' computes second derivatives."
        )


def _refuse_second_derivative(kernel, grad_inputs, grad_outputs):
    # A post-hook of the SDPA node: runs after its backward, with grad mode on only under
    # create_graph=True, the one case where dq, dk, dv get a graph that must not be used.
    if not torch.is_grad_enabled():
        return None
    return tuple(None if g is None else _NoSecondDerivative.apply(g, kernel) for g in grad_inputs)


def _align_grad(o: torch.Tensor) -> torch.Tensor:
    """``o``, an SDPA output, with the hooks its backward needs: the output gradient fitted
    to the fused kernels (_fit_grad) and, for a fused kernel, a clear refusal of double
    backward (SDPA's math path is differentiable twice and keeps its graph). Not while
    torch.compile traces: a tensor hook breaks the graph, AOTAutograd lays out the
    gradient its compiled backward hands SDPA, and a compiled graph has no double backward."""
    if o.requires_grad and not torch.compiler.is_compiling():
        # The C++ nodes' hooks where the extension is built (the backward then runs no
        # Python); not under compiled autograd, which traces Python hooks only.
        mod = nodes.module()
        if mod is not None and not _compiled_autograd() and mod.sdpa_grad_hooks(o):
            return o
        node = o.grad_fn
        # hooks of o's node, not Tensor.register_hook (the same effect on o's gradient,
        # registered in C++), made once per node class and output index: a call only
        # registers them (the hook holds a name, not the node: no cycle)
        pre, post = _node_hooks(type(node), o.output_nr)
        node.register_prehook(pre)
        if post is not None:
            node.register_hook(post)
    return o


def _compiled_autograd() -> bool:
    ca = sys.modules.get("torch._dynamo.compiled_autograd")  # (never imported: never enabled)
    return ca is not None and bool(getattr(ca, "compiled_autograd_enabled", False))


@functools.cache
def _node_hooks(node_cls: type, i: int):
    kernel = node_cls.__name__
    post = None
    if kernel.startswith("ScaledDotProduct"):
        post = functools.partial(_refuse_second_derivative, kernel.removesuffix("Backward0"))
    return functools.partial(_fit_grad_at, i), post


def _fit_grad_at(i: int, grad_outputs):
    # the node's pre-hook: _fit_grad on the gradient of its output i (o), others as they are
    g = grad_outputs[i]
    if g is None or (g.is_contiguous() and not (g.is_cuda and g.data_ptr() % 16)):
        return None  # (the usual gradient: nothing to fit)
    fitted = _fit_grad(g)
    if fitted is g:
        return None
    return grad_outputs[:i] + (fitted,) + grad_outputs[i + 1 :]


def _sdpa(q, k, v, causal, scale, force_contiguous=False):
    four = q.dim() == 4  # (B, H, S, D) goes to SDPA as it is: no reshapes on the hot path
    out_shape = None if four else q.shape[:-1] + (v.shape[-1],)
    if four:
        q4, k4, v4 = _aligned(q), _aligned(k), _aligned(v)
    else:
        q4, k4, v4 = (_aligned(_as4d(t)) for t in (q, k, v))
    if force_contiguous:  # the fused kernels want a unit last-dim stride
        q4, k4, v4 = (t if t.stride(-1) == 1 else t.contiguous() for t in (q4, k4, v4))
    s_q, s_k = q.shape[-2], k.shape[-2]
    # GQA: the folded head axis keeps each q head's group in order (q head b*H_q + h reads
    # k/v head b*H_kv + h // g), so enable_gqa's grouping of the folded axis is the same.
    gqa = is_gqa(q, k)
    if causal and s_q > s_k:
        # Bottom-right: the first S_q - S_k rows see no key (0, as SDPA's safe softmax
        # gives for a fully masked row); the last S_k rows are the square top-left causal
        # problem. Split rather than mask: a fused kernel given fully masked rows may
        # return NaN there, and NaN * 0 is still NaN in the forward and in the gradients.
        tail = _align_grad(F.scaled_dot_product_attention(q4[..., s_q - s_k :, :], k4, v4, is_causal=True,
                                                          scale=scale, enable_gqa=gqa))  # fmt: skip
        o = torch.cat([tail.new_zeros(tail.shape[:-2] + (s_q - s_k, tail.shape[-1])), tail], dim=-2)
    elif causal and s_q < s_k:
        allowed = causal_allowed(s_q, s_k, q.device)  # no empty row: every row sees key 0
        o = _align_grad(F.scaled_dot_product_attention(q4, k4, v4, attn_mask=allowed, scale=scale, enable_gqa=gqa))
    else:
        o = F.scaled_dot_product_attention(q4, k4, v4, is_causal=causal, scale=scale, enable_gqa=gqa)
        o = _align_grad(o)
    return o if four else o.reshape(out_shape)


def _sdpa_window(q, k, v, causal, scale, window):
    """SDPA with the boolean mask of the window (and causal). Rows the mask leaves without
    a key attend every key in SDPA (a fully masked row is NaN in some SDPA kernels, and
    NaN * 0 stays NaN in the gradients) and are set to 0 after: their zero output
    gradient gives them no share of dk, dv."""
    allowed = allowed_mask(q.shape[-2], k.shape[-2], causal, window, q.device)
    has_key = allowed.any(-1, keepdim=True)
    q4, k4, v4 = (_aligned(_as4d(t)) for t in (q, k, v))
    mask = allowed | ~has_key
    o = _align_grad(F.scaled_dot_product_attention(q4, k4, v4, attn_mask=mask, scale=scale, enable_gqa=is_gqa(q, k)))
    o = torch.where(has_key, o, 0.0).to(o.dtype)
    return o.reshape(q.shape[:-1] + (v.shape[-1],))


def _finite_on_cpu(q, k, v) -> bool:
    """False when q, k or v on the CPU may hold NaN or inf (their fp32 sums are not
    finite; a sum that overflows on finite values only sends the call to manual too).

    The CPU's SDPA kernels do not follow the reference there: a query row holding NaN
    (or, in 16-bit, inf) comes back as a row of zeros (its safe softmax zeroes a row whose
    scores are all NaN); with causal and S_q > S_k, NaN/inf in v leaves the rows without a
    key at 0 where 0 * NaN is NaN in the reference; a NaN in k reaches rows the causal mask
    hides from it (additive mask: NaN + -inf), and a bf16 inf in k gives finite rows. No
    sync on the CPU; three sums are O(S D) beside SDPA's O(S^2 D), ~15 us of host time.
    Skipped while torch.compile traces (no data-dependent branch in a graph) and on other
    devices (the GPU path never synchronizes)."""
    if q.device.type != "cpu" or torch.compiler.is_compiling():
        return True
    with torch.no_grad():  # inf + -inf is NaN in Python floats too
        f32 = torch.float32
        return math.isfinite(q.sum(dtype=f32).item() + k.sum(dtype=f32).item() + v.sum(dtype=f32).item())


def torch_attention(q, k, v, causal: bool = False, scale=None, window=None, softcap=None):
    """F.scaled_dot_product_attention, PyTorch's own choice of kernel."""
    if has_softcap(softcap) or not _finite_on_cpu(q, k, v):
        # softcap: SDPA has no hook on the scores. Non-finite inputs on the CPU: SDPA's
        # NaN and inf land elsewhere than the reference's (_finite_on_cpu). Both: PyTorch
        # ops, scores in fp32 (as manual), which follow the reference.
        return manual_attention(q, k, v, causal, scale, window, softcap)
    if window_bounds(window, causal) is not None:
        if _tf32_fp32(q):
            from torch.nn.attention import SDPBackend, sdpa_kernel

            with sdpa_kernel([SDPBackend.MATH]):
                return _sdpa_window(q, k, v, causal, scale, window)
        return _sdpa_window(q, k, v, causal, scale, window)
    if _tf32_fp32(q):
        # fp32 with TF32 on: the math path (its matmuls honour the TF32 flag), so that the
        # baseline computes its dots the way the TF32 kernels do (package docstring).
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([SDPBackend.MATH]):
            return _sdpa(q, k, v, causal, scale)
    return _sdpa(q, k, v, causal, scale)


# torch: double backward not declared. SDPA's math path is differentiable twice, its flash
# and efficient kernels (the GPU's choice for 16-bit inputs) refuse with a RuntimeError.
register_baseline(
    "attention", manual_attention, torch_attention, compiled(manual_attention), torch_double_backward=False
)


# Peers: one SDPA kernel each, forced. ------------------------------------------------

_PEERS = {
    # backend: (SDPBackend name, dtypes, head dims, refuses causal S_q != S_k)
    # (and sdpa_efficient: no GQA, see _peer_refusal)
    # (and sdpa_cudnn: no S_k = 1, see _peer_refusal)
    "sdpa_flash": ("FLASH_ATTENTION", (torch.float16, torch.bfloat16), tuple(range(8, 257, 8)), True),
    "sdpa_cudnn": ("CUDNN_ATTENTION", (torch.float16, torch.bfloat16), tuple(range(8, 129, 8)), True),
    "sdpa_efficient": (
        "EFFICIENT_ATTENTION",
        (torch.float32, torch.float16, torch.bfloat16),
        tuple(range(8, 257, 8)),
        False,
    ),
}


def _peer_unavailable(name: str):
    @functools.cache
    def why() -> str | None:
        try:
            from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: F401
        except ImportError as e:  # pragma: no cover - torch < 2.3
            return f"torch.nn.attention.sdpa_kernel not available: {e}"
        sdp = _PEERS[name][0]
        if not hasattr(SDPBackend, sdp):
            return f"this torch has no SDPBackend.{sdp}"
        if not torch.cuda.is_available():
            return "no GPU"
        if name == "sdpa_flash" and not torch.backends.cuda.is_flash_attention_available():
            return "torch built without flash attention"
        if name == "sdpa_cudnn":
            v = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
            if not v or v < 90000:
                return f"cuDNN attention needs cuDNN >= 9 (have {v})"
            if torch.cuda.get_device_capability() < (8, 0):
                return "cuDNN attention needs sm_80 or newer"
        return None

    return why


def _peer_refusal(name: str, q, k, causal: bool, window=None, softcap=None) -> Exception | None:
    """The error the forced SDPA kernel ``name`` is refused with for these arguments
    (before SDPA itself would fail with "No available kernel"), or None when it runs."""
    _, dtypes, dims, refuses_offset_causal = _PEERS[name]
    try:
        check_dtype(q, dtypes, name)
        check_head_dim(q, dims, name)
        refuse_options(name, window, softcap, causal)
    except (TypeError, ValueError) as e:
        return e
    if causal and refuses_offset_causal and q.shape[-2] != k.shape[-2]:
        return ValueError(
            f"attention/{name}: causal with S_q != S_k (q has {q.shape[-2]} rows, k {k.shape[-2]}): "
            "torch's is_causal is top-left, and a bottom-right mask never reaches this kernel"
        )
    if name == "sdpa_efficient" and is_gqa(q, k):
        try:
            refuse_gqa(q, k, name)
        except ValueError as e:
            return e
    if name == "sdpa_cudnn" and k.shape[-2] == 1:
        # PyTorch (2.11): "cudnn SDPA does not support key/value sequence length 1"
        return ValueError(
            "attention/sdpa_cudnn: k has 1 key (dim -2); cuDNN SDPA takes no key/value sequence of "
            "length 1 (use sdpa_flash, sdpa_efficient or another backend)"
        )
    return None


def _peer_limits(name: str):
    """The peer's declared limits (``Impl.limits``): why it refuses (q, k, v, causal), or
    None; the same conditions the peer raises on, so ``check`` and the tests agree with it."""

    def limits(q, k, v, causal: bool = False, scale=None, window=None, softcap=None) -> str | None:
        e = _peer_refusal(name, q, k, causal, window, softcap)
        return str(e) if e is not None else None

    return limits


def _make_peer(name: str):
    sdp = _PEERS[name][0]

    def peer(q, k, v, causal: bool = False, scale=None, window=None, softcap=None):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        refusal = _peer_refusal(name, q, k, causal, window, softcap)
        if refusal is not None:
            raise refusal
        with sdpa_kernel([getattr(SDPBackend, sdp)]):
            return _sdpa(q, k, v, causal, scale, force_contiguous=True)

    peer.__name__ = name
    peer.__doc__ = f"SDPA forced to {sdp} (torch.nn.attention.sdpa_kernel)"
    return peer


for _name, (_sdp, _dtypes, _dims, _) in _PEERS.items():
    register(
        "attention",
        _name,
        devices=("cuda",),
        available=_peer_unavailable(_name),
        dtypes=_dtypes,
        builtin=True,
        description=f"SDPA forced to {_sdp}; head dims {_dims[0]}..{_dims[-1]} (multiples of 8)",
        limits=_peer_limits(_name),
    )(_make_peer(_name))
