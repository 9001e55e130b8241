"""The three baselines every op has: manual (PyTorch primitives), torch (PyTorch's own
op) and compile (torch.compile of manual)."""

from __future__ import annotations

import functools
import inspect

import torch

from kernellab.core.registry import register
from kernellab.core.spec import REFERENCE_DTYPES


def _raise_recompile_limit(n: int = 256) -> None:
    # Tests and sweeps call compiled functions at many shapes, dtypes and layouts; past
    # Dynamo's default limit (8) it would silently fall back to eager.
    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(cfg, name) and getattr(cfg, name) < n:
            setattr(cfg, name, n)


def compiled(fn, op: str | None = None):
    """torch.compile(fn, dynamic=False), compiled lazily at first call, with the in-place
    check eager autograd makes (see ``_watch_saved``). ``op`` names the op in that error
    (default: ``fn``'s name without ``manual_``).

    Static shapes: each shape gets the kernel a fixed-shape model would. With automatic
    dynamic shapes the check's many odd shapes would turn the function dynamic before the
    benchmark runs, and the dynamic kernel is several times slower than the static one."""
    label = f"{op or fn.__name__.removeprefix('manual_')}/compile"
    names = tuple(inspect.signature(fn).parameters)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if wrapper._compiled is None:
            _raise_recompile_limit()
            wrapper._compiled = torch.compile(fn, dynamic=False)
        out = wrapper._compiled(*args, **kwargs)
        if torch.is_grad_enabled() and not torch.compiler.is_compiling():
            _watch_saved(label, names, args, kwargs, out)
        return out

    wrapper._compiled = None
    return wrapper


def _storage(t: torch.Tensor) -> int | None:
    return t.untyped_storage().data_ptr() if t.numel() else None


def _watch_saved(label: str, names, args, kwargs, out) -> None:
    """Raise at backward when a tensor the compiled backward reads was modified in place
    after the forward, as eager autograd does through the version counter.

    AOTAutograd saves its inputs (and outputs) as views made inside the graph (a
    transposed ``b`` for matmul's ``dA = dY b^T``): those views carry version counters of
    their own, so an in-place ``b.mul_(3)`` before backward goes unnoticed and the gradient
    is silently computed from the new values (matmul: error 10.9). Here: the arguments and
    outputs whose storage a saved tensor of the compiled graph shares are remembered with
    their versions (a detached alias shares the version counter, without holding the
    graph), and a hook on each output compares them when its gradient arrives, before the
    compiled backward runs. Arguments the graph does not save may change freely, as in
    eager. Host cost: one walk over this call's few autograd nodes (~10 us per call with
    grad, against ~130 us for the compiled call itself on the CPU)."""
    outs = out if isinstance(out, (tuple, list)) else (out,)
    outs = [o for o in outs if isinstance(o, torch.Tensor) and o.requires_grad]
    if not outs:
        return
    tensors = [(f"argument {n!r}", a) for n, a in zip(names, args) if isinstance(a, torch.Tensor)]
    tensors += [(f"argument {n!r}", a) for n, a in kwargs.items() if isinstance(a, torch.Tensor)]
    # Walk this call's nodes only: stop at the arguments' own grad_fns (the user's graph).
    stop = {a.grad_fn for _, a in tensors if a.grad_fn is not None}
    saved, seen, todo = set(), set(), [o.grad_fn for o in outs]
    while todo:
        node = todo.pop()
        if node is None or node in stop or node in seen:
            continue
        seen.add(node)
        if type(node).__name__ == "CompiledFunctionBackward":
            saved.update(_storage(t) for t in node.saved_tensors)
        todo.extend(f for f, _ in node.next_functions)
    saved.discard(None)
    if not saved:
        return
    many = len(outs) > 1
    tensors += [(f"output {i}" if many else "the output", o) for i, o in enumerate(outs)]
    watched = [(n, a.detach(), a._version) for n, a in tensors if _storage(a) in saved]
    if not watched:
        return

    def check(grad):
        for name, alias, version in watched:
            if alias._version != version:
                raise RuntimeError(
                    f"{label}: {name} was modified in place after the forward (version "
                    f"{alias._version}, saved at version {version}), and the compiled backward "
                    "reads its values: its gradient would be silently wrong (eager PyTorch: 'one "
                    "of the variables needed for gradient computation has been modified by an "
                    "inplace operation'). Modify a clone, or modify it after backward."
                )

    for o in outs:
        o.register_hook(check)


def _compile_unavailable() -> str | None:
    try:
        import torch._inductor  # noqa: F401
    except Exception as e:  # pragma: no cover
        return f"torch.compile unavailable: {e}"
    return None


def register_baseline(op: str, manual, torch_fn, compile_fn, torch_double_backward: bool = True) -> None:
    # manual and torch are PyTorch ops under PyTorch's autograd: differentiable twice
    # (torch unless the op's PyTorch kernels refuse it: ``torch_double_backward``).
    # compile is not declared: torch.compile refuses double backward with a RuntimeError.
    # All three take float64 as well (REFERENCE_DTYPES): torch.autograd.gradcheck runs
    # through them; the check judges the spec's dtypes only.
    describe = (manual.__doc__ or "").split("\n")[0]
    register(op, "manual", builtin=True, description=describe, double_backward=True,
             dtypes=REFERENCE_DTYPES)(manual)  # fmt: skip
    describe = (torch_fn.__doc__ or "").split("\n")[0]
    register(op, "torch", builtin=True, description=describe, double_backward=torch_double_backward,
             dtypes=REFERENCE_DTYPES)(torch_fn)  # fmt: skip
    register(
        op,
        "compile",
        builtin=True,
        available=_compile_unavailable,
        description="torch.compile of manual",
        dtypes=REFERENCE_DTYPES,
        builds_per_shape=True,
    )(compile_fn)
