"""Plain SGD (no momentum, no weight decay): ``p <- p - lr * g`` for every parameter, in
place, in one call: ``kernellab.sgd_step(params, grads, lr, backend=...)``.

Backends (a small table of its own, not the op registry: the registry's ops are
functions of tensors checked against a float64 reference output, and this one mutates its
arguments and returns nothing):

- ``manual``: a Python loop, one ``add_`` per parameter (one launch each).
- ``torch``: ``torch._foreach_add_(params, grads, alpha=-lr)``, PyTorch's multi-tensor
  kernel (a few launches for all parameters together; what ``torch.optim.SGD(foreach=True)``
  runs).
- ``triton``: ONE launch for all parameters. It needs them packed: every parameter a
  contiguous view into one flat buffer, back to back in order, and the gradients likewise
  into another (``pack_(params)`` arranges both). Then the update is one elementwise
  kernel over the span, ``len(params)`` launches fewer than ``manual`` (10 for the MNIST
  CNN, whose launches cost more than the memory time of its 422K parameters). Unpacked
  parameters are refused with a ValueError saying so (no silent per-tensor fallback).

Gradients of packed parameters stay packed: ``pack_`` sets each ``p.grad`` to a view of the
flat gradient buffer, and autograd accumulates into an existing ``.grad`` in place, so
zero-grad is one ``fill_`` of that buffer (``flat_grad.zero_()``).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import torch
import triton.language as tl

from kernellab import triton_support
from kernellab.core.spec import FLOAT_DTYPES

BACKENDS = ("manual", "torch", "triton")


# --------------------------------------------------------------------------- kernel


@triton_support.jit
def _sgd_flat_kernel(
    p_ptr,  # [n] the packed parameters (one dtype), updated in place
    g_ptr,  # [n] the packed gradients, p's dtype
    n,
    lr,  # fp32
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    p = tl.load(p_ptr + offs, mask=mask)
    g = tl.load(g_ptr + offs, mask=mask)
    p = p.to(tl.float32) - lr * g.to(tl.float32)
    tl.store(p_ptr + offs, p.to(p_ptr.dtype.element_ty), mask=mask)


SGD_BLOCK = 1024


# --------------------------------------------------------------------------- packing


def pack_(params: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Move ``params`` (tensors or nn.Parameters of one dtype and device) into one flat
    buffer, each ``p.data`` becoming a view of it, and give each a ``p.grad`` viewing one
    flat zeroed gradient buffer. Returns ``(flat_params, flat_grads)``."""
    params = list(params)
    if not params:
        raise ValueError("params: expected at least one tensor")
    dt, dev = params[0].dtype, params[0].device
    for i, p in enumerate(params):
        if p.dtype != dt or p.device != dev:
            raise ValueError(f"params: [{i}] is {p.dtype} on {p.device}; all must be {dt} on {dev} to pack")
    n = sum(p.numel() for p in params)
    flat = torch.empty(n, dtype=dt, device=dev)
    gflat = torch.zeros(n, dtype=dt, device=dev)
    o = 0
    for p in params:
        k = p.numel()
        flat[o : o + k].copy_(p.detach().reshape(-1))
        p.data = flat[o : o + k].view(p.shape)
        p.grad = gflat[o : o + k].view(p.shape)
        o += k
    return flat, gflat


def packed_span(ts: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """The flat 1-D view covering ``ts`` when they are contiguous, of one dtype, and lie
    back to back in one storage in order; else None. Empty tensors are passed over (an
    empty view may carry any address)."""
    ts = [t for t in ts if t.numel()]
    if not ts:
        return None
    first = ts[0]
    es = first.element_size()
    ptr = first.data_ptr()
    storage = first.untyped_storage().data_ptr()
    total = 0
    for t in ts:
        if (
            t.dtype != first.dtype
            or not t.is_contiguous()
            or t.untyped_storage().data_ptr() != storage
            or t.data_ptr() != ptr + total * es
        ):
            return None
        total += t.numel()
    off = (ptr - storage) // es
    return torch.empty(0, dtype=first.dtype, device=first.device).set_(
        first.untyped_storage(), off, (total,), (1,)
    )


# --------------------------------------------------------------------------- validation


def _validate(params, grads, lr) -> float:
    if isinstance(params, torch.Tensor) or not isinstance(params, Sequence):
        raise TypeError(f"sgd_step: params must be a list or tuple of tensors, got {type(params).__name__}")
    if isinstance(grads, torch.Tensor) or not isinstance(grads, Sequence):
        raise TypeError(f"sgd_step: grads must be a list or tuple of tensors, got {type(grads).__name__}")
    if len(params) != len(grads):
        raise ValueError(f"sgd_step: params has {len(params)} tensors but grads has {len(grads)}; they must pair up")
    if isinstance(lr, bool) or not isinstance(lr, numbers.Real) or not math.isfinite(float(lr)):
        raise (ValueError if isinstance(lr, numbers.Real) and not isinstance(lr, bool) else TypeError)(
            f"sgd_step: lr must be a finite float, got {lr!r}"
        )
    for i, (p, g) in enumerate(zip(params, grads)):
        for name, t in (("params", p), ("grads", g)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"sgd_step: {name}[{i}] must be a torch.Tensor, got {type(t).__name__}")
            if t.dtype not in FLOAT_DTYPES:
                raise TypeError(f"sgd_step: {name}[{i}] has dtype {t.dtype}; expected fp32, fp16 or bf16")
        if g.shape != p.shape:
            raise ValueError(f"sgd_step: grads[{i}] has shape {list(g.shape)} but params[{i}] {list(p.shape)}")
        if g.dtype != p.dtype:
            raise TypeError(f"sgd_step: grads[{i}] has dtype {g.dtype} but params[{i}] {p.dtype}")
        if g.device != p.device:
            raise ValueError(f"sgd_step: grads[{i}] is on {g.device} but params[{i}] on {p.device}")
        if torch._debug_has_internal_overlap(p) == 1:  # (1: certain; 2, "too hard", is what add_ allows)
            raise ValueError(
                f"sgd_step: params[{i}] has elements that share memory (an expanded view, stride 0); "
                "an in-place update would write each location several times: pass the tensor it expands"
            )
    return float(lr)


# --------------------------------------------------------------------------- backends


def _manual(params, grads, lr):
    for p, g in zip(params, grads):
        p.add_(g, alpha=-lr)


def _torch(params, grads, lr):
    torch._foreach_add_(list(params), list(grads), alpha=-lr)


def _triton(params, grads, lr):
    if not any(p.numel() for p in params):
        return
    pf = packed_span(params)
    if pf is None:
        raise ValueError(
            "sgd_step: params are not packed (contiguous views of one buffer, back to back, one dtype); "
            "the triton backend updates them in one launch only then: pack them with kernellab.optim.pack_"
        )
    gf = packed_span(grads)
    if gf is None:
        raise ValueError(
            "sgd_step: grads are not packed (contiguous views of one buffer, back to back, one dtype); "
            "see kernellab.optim.pack_"
        )
    n = pf.numel()
    if n:
        _sgd_flat_kernel[(triton_support.cdiv(n, SGD_BLOCK),)](pf, gf, n, lr, BLOCK=SGD_BLOCK)


_TABLE = {"manual": _manual, "torch": _torch, "triton": _triton}


def sgd_step(params, grads, lr: float, *, backend: str | None = None) -> None:
    """``p -= lr * g`` for each pair, in place, under no_grad. ``backend`` None: ``triton``
    where the parameters are packed and Triton runs compiled (a GPU), else ``torch``."""
    lr = _validate(params, grads, lr)
    if not params:
        return
    if backend is None:
        from kernellab import device as _device

        packed = not _device.triton_interpreted(params[0]) and packed_span(params) is not None
        backend = "triton" if packed and packed_span(grads) is not None else "torch"
    fn = _TABLE.get(backend)
    if fn is None:
        raise ValueError(f"sgd_step: backend {backend!r} unknown; backends: {', '.join(BACKENDS)}")
    with torch.no_grad():
        fn(params, grads, lr)


# --------------------------------------------------------------------------- AdamW

ADAMW_BACKENDS = ("torch", "triton")


@triton_support.jit
def _adamw_kernel(
    base_ptr,  # the DTYPE pointer the table's element offsets count from
    off_ptr,  # int64 [4, n_tensors]: p, grad, exp_avg, exp_avg_sq as element offsets from base_ptr
    steps_ptr,  # fp32 [n_params]: each parameter's step count, this step included
    param_ptr,  # int32 [n_tensors]: each tensor's index into steps
    numel_ptr,  # int64 [n_tensors]
    chunk_t_ptr,  # int32 [chunks]: the tensor of program c
    chunk_s_ptr,  # int64 [chunks]: its first element
    n_tensors,
    lr,
    beta1,
    beta2,
    ln_beta1,
    ln_beta2,
    eps,
    weight_decay,
    BLOCK: tl.constexpr,
    VEC: tl.constexpr,  # elements in 16 bytes
    ALIGNED: tl.constexpr,  # every offset a multiple of VEC (the host checked): 16-byte accesses
):
    c = tl.program_id(0)
    t = tl.load(chunk_t_ptr + c)
    start = tl.load(chunk_s_ptr + c)
    po = tl.load(off_ptr + t)
    go = tl.load(off_ptr + n_tensors + t)
    mo = tl.load(off_ptr + 2 * n_tensors + t)
    vo = tl.load(off_ptr + 3 * n_tensors + t)
    if ALIGNED:
        start = tl.multiple_of(start, BLOCK)
        po = tl.multiple_of(po, VEC)
        go = tl.multiple_of(go, VEC)
        mo = tl.multiple_of(mo, VEC)
        vo = tl.multiple_of(vo, VEC)
    offs = start + tl.arange(0, BLOCK)
    step = tl.load(steps_ptr + tl.load(param_ptr + t))
    bc1 = _one_minus_exp(step * ln_beta1)  # 1 - beta1^step
    bc2_sqrt = tl.sqrt(_one_minus_exp(step * ln_beta2))
    n = tl.load(numel_ptr + t)
    if start + BLOCK <= n:  # a whole block: no mask, so 16-byte accesses where ALIGNED
        _adamw_block(base_ptr + (po + offs), base_ptr + (go + offs), base_ptr + (mo + offs), base_ptr + (vo + offs),
                     None, lr, beta1, beta2, eps, weight_decay, bc1, bc2_sqrt)  # fmt: skip
    else:
        _adamw_block(base_ptr + (po + offs), base_ptr + (go + offs), base_ptr + (mo + offs), base_ptr + (vo + offs),
                     offs < n, lr, beta1, beta2, eps, weight_decay, bc1, bc2_sqrt)  # fmt: skip


@triton_support.jit
def _one_minus_exp(x):
    """1 - exp(x) for x <= 0 to fp32's precision: 1 - beta2^step (beta2 = 0.999) is ~1e-3,
    and 1 - exp(x) rounded from exp(x) ~ 0.999 would lose 10 of its 24 bits, the error
    PyTorch's double-precision bias corrections do not have. Near 0 a Taylor series of
    -expm1(x) (terms to x^8: below 1e-8 relative for |x| <= 0.5), else 1 - exp(x)."""
    t = x * (1.0 + x / 2 * (1.0 + x / 3 * (1.0 + x / 4 * (1.0 + x / 5 * (1.0 + x / 6 * (1.0 + x / 7 * (1.0 + x / 8)))))))
    return tl.where(x > -0.5, -t, 1.0 - tl.exp(x))


@triton_support.jit
def _adamw_block(p_ptrs, g_ptrs, m_ptrs, v_ptrs, mask, lr, beta1, beta2, eps, weight_decay, bc1, bc2_sqrt):
    p = tl.load(p_ptrs, mask=mask).to(tl.float32)
    g = tl.load(g_ptrs, mask=mask).to(tl.float32)
    m = tl.load(m_ptrs, mask=mask).to(tl.float32)
    v = tl.load(v_ptrs, mask=mask).to(tl.float32)
    # PyTorch's fused AdamW, in fp32: decay, moments, bias-corrected update
    p = p - lr * weight_decay * p
    m = beta1 * m + (1.0 - beta1) * g
    v = beta2 * v + (1.0 - beta2) * g * g
    p = p - (lr / bc1) * m / (tl.sqrt(v) / bc2_sqrt + eps)
    tl.store(p_ptrs, p.to(p_ptrs.dtype.element_ty), mask=mask)
    tl.store(m_ptrs, m.to(m_ptrs.dtype.element_ty), mask=mask)
    tl.store(v_ptrs, v.to(v_ptrs.dtype.element_ty), mask=mask)


ADAMW_BLOCK = 2048
# unbound, for map(): the step reads these of every tensor without a Python loop body
_data_ptr, _is_contiguous, _numel = torch.Tensor.data_ptr, torch.Tensor.is_contiguous, torch.Tensor.numel


def _finite(name: str, v, lo: float, hi: float | None = None, hi_open: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(float(v)):
        raise ValueError(f"AdamW: {name} must be a finite number, got {v!r}")
    v = float(v)
    if v < lo or (hi is not None and (v >= hi if hi_open else v > hi)):
        rng = f"[{lo}, {hi})" if hi_open else f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise ValueError(f"AdamW: {name} must be in {rng}, got {v}")
    return v


def _hyper(lr, betas, eps, weight_decay, who: str = "AdamW") -> tuple:
    """(lr, (beta1, beta2), eps, weight_decay) checked: what the constructor and
    load_state_dict (``who`` "state") accept."""
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise ValueError(f"{who}: betas must be a pair, got {betas!r}")
    return (_finite("lr", lr, 0.0),
            (_finite("betas[0]", betas[0], 0.0, 1.0, True), _finite("betas[1]", betas[1], 0.0, 1.0, True)),
            _finite("eps", eps, 0.0), _finite("weight_decay", weight_decay, 0.0))  # fmt: skip


def _dtensor_type():
    """torch's DTensor class, or None where torch.distributed is not built in."""
    if not torch.distributed.is_available():
        return None
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch < 2.5
        from torch.distributed._tensor import DTensor
    return DTensor


class AdamW:
    """AdamW over a fixed list of parameters with a host path far lighter than
    ``torch.optim.AdamW``'s (whose Python wrapper costs most of a millisecond a step for
    GPT-2's 148 tensors). The math is PyTorch's (decoupled weight decay, bias-corrected
    moments in fp32, moments stored in the parameters' dtype), so the two take the same
    steps to rounding.

    Backends:
    - ``torch``: PyTorch's fused multi-tensor kernel (``torch._fused_adamw_``, capturable:
      the step count on the device) called with lists built once; on a CPU, the
      single-tensor reference loop PyTorch's own optimizer runs there.
    - ``triton``: one launch for all tensors. Program c updates ``BLOCK`` elements of one
      tensor, read from a table of addresses (parameters, moments and gradients) on the
      device; each step reads every parameter's and gradient's address, contiguity and
      size, and the table is uploaded again (from pinned memory, without a sync) only when
      an address changed; a non-contiguous tensor or a changed size is refused with an
      error naming it (``params[i].grad``).

    Sharded parameters (``DTensor``, as FSDP2's ``fully_shard`` leaves them): each rank
    updates its local shard with its local shard of the gradient (AdamW is elementwise, so
    the shards' updates are the whole tensor's); the moments are local shards too. A
    ``Partial`` placement (a gradient not yet reduced) is refused.

    ``step()`` skips parameters whose ``.grad`` is None (as PyTorch does); the step count
    lives on the device, so a step can be captured in a CUDA graph (the gradients'
    addresses at capture are the ones replays use, as for every captured kernel). ``lr`` is
    read at each step on the host: under a captured graph it is the value at capture.
    """

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, *, backend: str = "triton"):  # fmt: skip
        if backend not in ADAMW_BACKENDS:
            raise ValueError(f"AdamW: backend {backend!r} unknown; backends: {', '.join(ADAMW_BACKENDS)}")
        if isinstance(params, torch.Tensor):
            raise TypeError("AdamW: params must be an iterable of tensors, got a single tensor")
        self.params = [p for p in params]
        if not self.params:
            raise ValueError("AdamW: params is empty")
        for i, p in enumerate(self.params):
            if not isinstance(p, torch.Tensor):
                raise TypeError(f"AdamW: params[{i}] must be a torch.Tensor, got {type(p).__name__}")
        dtensor = _dtensor_type()
        # DTensor parameters: the step reads their local shards (see the class docstring)
        self._sharded = dtensor is not None and any(isinstance(p, dtensor) for p in self.params)
        if self._sharded:
            for i, p in enumerate(self.params):
                if isinstance(p, dtensor) and any(pl.is_partial() for pl in p.placements):
                    raise ValueError(f"AdamW: params[{i}] is a DTensor with a Partial placement; "
                                     "an elementwise step needs Shard or Replicate")  # fmt: skip
        local = self._locals()
        p0 = local[0]
        for i, p in enumerate(local):
            if p.dtype not in FLOAT_DTYPES:
                raise TypeError(f"AdamW: params[{i}] has dtype {p.dtype}; expected fp32, fp16 or bf16")
            if p.dtype != p0.dtype or p.device != p0.device:
                raise ValueError(f"AdamW: params[{i}] is {p.dtype} on {p.device}; all must be {p0.dtype} on {p0.device}")
            if not p.is_contiguous():
                raise ValueError(f"AdamW: params[{i}] is not contiguous")
        if len({id(p) for p in self.params}) != len(self.params):
            raise ValueError("AdamW: params lists a tensor twice")
        self.lr, self.betas, self.eps, self.weight_decay = _hyper(lr, betas, eps, weight_decay)
        self.backend = backend
        self.device = p0.device
        self.exp_avg = [torch.zeros_like(p) for p in local]
        self.exp_avg_sq = [torch.zeros_like(p) for p in local]
        # each tensor's step count (PyTorch's: a step without a gradient does not count)
        self.steps = torch.zeros(len(self.params), dtype=torch.float32, device=self.device)
        self._steps = list(self.steps.unbind(0))
        self._plans: dict = {}  # triton: active tensors -> (tables, the addresses they were made from)
        self._base = torch.empty(1, dtype=p0.dtype, device=self.device)  # the table's offsets count from here

    def state_dict(self) -> dict:
        """The hyperparameters and the state (moments and step counts, as tensors) for a
        checkpoint; ``load_state_dict`` takes it back."""
        return {"lr": self.lr, "betas": self.betas, "eps": self.eps, "weight_decay": self.weight_decay,
                "exp_avg": list(self.exp_avg), "exp_avg_sq": list(self.exp_avg_sq), "steps": self.steps}  # fmt: skip

    @torch.no_grad()
    def load_state_dict(self, state: dict) -> None:
        """Restore ``state_dict()``'s output: values copied into this optimizer's own tensors
        (their addresses stay, as a captured graph and the Triton backend's table need)."""
        missing = {"lr", "betas", "eps", "weight_decay", "exp_avg", "exp_avg_sq", "steps"} - set(state)
        if missing:
            raise ValueError(f"state: missing {', '.join(sorted(missing))}")
        for key in ("exp_avg", "exp_avg_sq"):
            src = state[key]
            if len(src) != len(self.params):
                raise ValueError(f"state: {key} has {len(src)} tensors; this optimizer has {len(self.params)}")
            for i, (dst, t) in enumerate(zip(getattr(self, key), src)):
                if tuple(t.shape) != tuple(dst.shape):
                    raise ValueError(f"state: {key}[{i}] has shape {list(t.shape)}; params[{i}] {list(dst.shape)}")
        if tuple(state["steps"].shape) != tuple(self.steps.shape):
            raise ValueError(f"state: steps has shape {list(state['steps'].shape)}; expected [{len(self.params)}]")
        hyper = _hyper(state["lr"], state["betas"], state["eps"], state["weight_decay"], "state")
        self.lr, self.betas, self.eps, self.weight_decay = hyper  # (all checked before anything changes)
        for key in ("exp_avg", "exp_avg_sq"):
            for dst, t in zip(getattr(self, key), state[key]):
                dst.copy_(t)
        self.steps.copy_(state["steps"])

    @torch.no_grad()
    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if p.grad is not None:
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.zero_()

    @torch.no_grad()
    def _locals(self) -> list:
        """The tensors the step updates: the parameters, or their local shards (DTensor)."""
        if not self._sharded:
            return self.params
        dtensor = _dtensor_type()
        return [p.to_local() if isinstance(p, dtensor) else p for p in self.params]

    def _local_grads(self) -> list:
        """The parameters' gradients (None where absent), or their local shards."""
        if not self._sharded:
            return [p.grad for p in self.params]
        dtensor, out = _dtensor_type(), []
        for i, p in enumerate(self.params):
            g = p.grad
            if isinstance(g, dtensor):
                if not isinstance(p, dtensor) or g.placements != p.placements:
                    raise ValueError(f"AdamW: params[{i}].grad is placed {g.placements}; params[{i}] "
                                     f"{getattr(p, 'placements', 'as a plain tensor')}")  # fmt: skip
                g = g.to_local()
            out.append(g)
        return out

    @torch.no_grad()
    def step(self) -> None:
        grads = self._local_grads()
        active = None  # every tensor has a gradient
        if any(g is None for g in grads):  # (not `None in grads`: that compares tensors, ~30 us each)
            active = tuple(i for i, g in enumerate(grads) if g is not None)
            if not active:
                return
        # the Triton table is checked first: a refused step leaves the step counts alone
        params = self._locals()
        launch = self._triton_step(params, grads, active) if self.backend == "triton" else None
        if active is not None:
            self.steps.index_add_(0, torch.tensor(active, device=self.device), self.steps.new_ones(len(active)))
        else:
            self.steps += 1
        if launch is not None:
            launch()
        elif self.backend == "torch":
            self._torch_step(params, grads, active)

    def _pick(self, xs, active):
        return xs if active is None else [xs[i] for i in active]

    def _torch_step(self, params, grads, active) -> None:
        ps, gs = self._pick(params, active), self._pick(grads, active)
        ms, vs = self._pick(self.exp_avg, active), self._pick(self.exp_avg_sq, active)
        b1, b2 = self.betas
        if self.device.type == "cuda":
            torch._fused_adamw_(ps, gs, ms, vs, [], self._pick(self._steps, active), lr=self.lr, beta1=b1,
                                beta2=b2, weight_decay=self.weight_decay, eps=self.eps, amsgrad=False,
                                maximize=False)  # fmt: skip
            return
        for p, g, m, v, st in zip(ps, gs, ms, vs, self._pick(self._steps, active)):  # PyTorch's, in fp32
            step = float(st)
            g32, p32 = g.float(), p.float()
            p32.mul_(1 - self.lr * self.weight_decay)
            m32 = m.float().lerp_(g32, 1 - b1)
            v32 = v.float().mul_(b2).addcmul_(g32, g32, value=1 - b2)
            denom = (v32.sqrt() / math.sqrt(1 - b2**step)).add_(self.eps)
            p32.addcdiv_(m32, denom, value=-self.lr / (1 - b1**step))
            p.copy_(p32)
            m.copy_(m32)
            v.copy_(v32)

    def _triton_step(self, params, grads, active):
        """The table checked (and uploaded where it changed); returns the launch, or None
        when there is nothing to update."""
        gs = self._pick(grads, active)
        plan = self._plans.get(active)
        if plan is None:
            plan = self._plans[active] = self._plan(params, active)
        offs, pidx, numel, chunk_t, chunk_s, host = plan
        if not chunk_t.numel():
            return lambda: None
        ps = self._pick(params, active)
        # The table is right while every tensor has the address, the contiguous layout and
        # the size it was made from. Addresses and layouts are read every step (a strided
        # view at last step's address would otherwise be read as contiguous); a size is
        # read with them (a parameter's .data replaced in place by a shorter or longer view
        # of the same memory). Five C calls per tensor, no Python loop body.
        rows = {0: list(map(_data_ptr, ps)), 1: list(map(_data_ptr, gs))}
        if (rows[0] != host[0] or rows[1] != host[1] or not all(map(_is_contiguous, gs))
                or not all(map(_is_contiguous, ps)) or list(map(_numel, ps)) != host["numel"]):  # fmt: skip
            self._upload(offs, host, ps, gs, rows, active)
        b1, b2 = self.betas
        es = self._base.element_size()
        return lambda: _adamw_kernel[(chunk_t.numel(),)](
            self._base, offs, self.steps, pidx, numel, chunk_t, chunk_s, len(ps), self.lr, b1, b2,
            math.log(b1) if b1 > 0 else -math.inf, math.log(b2) if b2 > 0 else -math.inf,
            self.eps, self.weight_decay, BLOCK=ADAMW_BLOCK, VEC=16 // es, ALIGNED=host["aligned"],
        )  # fmt: skip

    def _upload(self, offs, host, ps, gs, rows, active) -> None:
        """A parameter's .data replaced or a gradient moved or re-laid: check every tensor
        (ValueError / TypeError naming it) and upload the changed rows of the table."""
        base, es = self._base.data_ptr(), self._base.element_size()
        for i, p, g, n in zip(active or range(len(ps)), ps, gs, host["numel"]):
            for what, t in ((f"params[{i}]", p), (f"params[{i}].grad", g)):
                if t.dtype != self._base.dtype or t.device != self.device:
                    raise TypeError(f"AdamW: {what} is {t.dtype} on {t.device}; expected {self._base.dtype} on {self.device}")
                if not t.is_contiguous():
                    raise ValueError(f"AdamW: {what} is not contiguous")
                if t.numel() != n:
                    raise ValueError(
                        f"AdamW: {what} has {t.numel()} elements; the optimizer was made for {n} "
                        "(a parameter's size must not change)"
                    )
                if (t.data_ptr() - base) % es:
                    raise ValueError(f"AdamW: {what}'s address is not a multiple of its element size")
        for r, ptrs in rows.items():
            if ptrs == host[r]:
                continue
            src = torch.tensor([(a - base) // es for a in ptrs], dtype=torch.int64)
            if self.device.type == "cuda":
                # pinned: the copy needs no sync (the caching host allocator keeps the
                # buffer until it ran); under capture, replays copy from it again: kept
                src = src.pin_memory()
                if torch.cuda.is_current_stream_capturing():
                    host["captured"].append(src)
            offs[r].copy_(src, non_blocking=True)
            host[r] = ptrs
        host["aligned"] = all((a - base) % 16 == 0 for a in host[0] + host[1] + host[2])

    def _plan(self, params, active):
        """Device tables of the tensors ``active`` (None: all): element offsets from
        ``self._base`` [4, n] (the gradients' row filled per step), each tensor's parameter
        index and numel, and each program's (tensor, first element)."""
        idx = list(range(len(params)) if active is None else active)
        base, es = self._base.data_ptr(), self._base.element_size()
        p_ptrs = [params[i].data_ptr() for i in idx]
        m_ptrs = [self.exp_avg[i].data_ptr() for i in idx]
        v_ptrs = [self.exp_avg_sq[i].data_ptr() for i in idx]
        if any((a - base) % es for a in p_ptrs + m_ptrs + v_ptrs):
            raise ValueError("AdamW: a parameter's address is not a multiple of its element size")
        rows = [[(a - base) // es for a in ptrs] for ptrs in (p_ptrs, [base] * len(idx), m_ptrs, v_ptrs)]
        numels = [params[i].numel() for i in idx]
        chunk_t, chunk_s = [], []
        for t, k in enumerate(numels):
            starts = range(0, k, ADAMW_BLOCK)
            chunk_t += [t] * len(starts)
            chunk_s += list(starts)
        dev = self.device
        return (torch.tensor(rows, dtype=torch.int64).to(dev), torch.tensor(idx, dtype=torch.int32).to(dev),
                torch.tensor(numels, dtype=torch.int64).to(dev), torch.tensor(chunk_t, dtype=torch.int32).to(dev),
                torch.tensor(chunk_s, dtype=torch.int64).to(dev),
                {0: p_ptrs, 1: None, 2: m_ptrs + v_ptrs, "numel": numels, "aligned": False,
                 "captured": []})  # fmt: skip
