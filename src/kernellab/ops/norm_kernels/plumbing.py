"""The custom-op / eager-autograd plumbing of the norms' backends (layer_norm, rms_norm,
add_rms_norm, and layer_norm's residual-add form), around each backend's launchers.

Contract of a backend's launchers (Triton and CUDA alike), over the last dimension D:

    fwd(x, w, b, eps, rms) -> (y, mean, rstd)
        x: [..., D] contiguous, w (and b, or None): [D], same dtype as x.
        y: like x (contiguous). mean, rstd: fp32 [rows] (rows = x.numel() // D), saved for
        the backward; rms=True: mean is None and rstd = 1 / sqrt(mean(x^2) + eps).
    bwd(dy, x, w, mean, rstd, rms, has_bias, eps) -> (dx, dw, db)
        dx like x; dw (and db, None when rms or no bias) [D] in w's dtype. dw/db are
        reduced from per-program partial sums (no atomics, no second pass over x).

Math, with xhat = (x - mean) * rstd (rms: x * rstd) and g = w * dy:
    y  = xhat * w + b
    dx = rstd * (g - xhat * mean(g * xhat) - mean(g))      (rms: no mean(g) term)
    dw = sum_rows(dy * xhat),  db = sum_rows(dy)
"""

from __future__ import annotations

import torch
from torch import Tensor

from kernellab.core.kit import OpDecl, build, contig, empty_like_contig, expose

# --------------------------------------------------------------------------- helpers


def rows_of(x: Tensor) -> tuple[int, int]:
    d = x.shape[-1]
    return (x.numel() // d if d else 0), d


def empty_stats(x: Tensor, rms: bool):
    rows, _ = rows_of(x)
    rstd = torch.empty(rows, dtype=torch.float32, device=x.device)
    mean = None if rms else torch.empty(rows, dtype=torch.float32, device=x.device)
    return mean, rstd


def reduce_partials(partial: Tensor, dtype) -> Tensor:
    """[programs, D] fp32 partial sums -> [D] in ``dtype`` (one small reduction)."""
    return partial.sum(0).to(dtype)


# --------------------------------------------------------------------------- custom ops


def _stats_fake(x: Tensor) -> Tensor:
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    return x.new_empty(rows, dtype=torch.float32)


_compiling = torch.compiler.is_compiling
_functorch_active = torch._C._are_functorch_transforms_active


def _eager_node(x: Tensor) -> bool:
    """Whether a call may take a C++ node (``node`` of the ops below): a plain CUDA tensor
    in eager mode, outside torch.compile and functorch transforms (their tensors carry no
    storage the node could launch on)."""
    return type(x) is Tensor and x.is_cuda and not _compiling() and not _functorch_active()


def layer_norm_op(name: str, fwd, bwd, triton: bool = False, node=None):
    """Custom ops ``kernellab::<name>`` (x, w, b?, eps) -> (y, mean, rstd) and
    ``kernellab::<name>_backward``; returns the registry callable ``(x, w, b, eps=1e-5)``
    (see kit.build for the eager path). ``node(x, w, b, eps) -> y or None``: the eager
    path of plain CUDA calls (a C++ autograd node, which also serves calls that record no
    gradient at less host cost); None from it, or a traced call, takes the custom op."""

    def _fwd(x: Tensor, w: Tensor, b: Tensor | None, eps: float) -> tuple[Tensor, Tensor, Tensor]:
        return fwd(contig(x), w, b, eps, False)

    def _bwd(
        dy: Tensor, x: Tensor, w: Tensor, mean: Tensor, rstd: Tensor, has_bias: bool, eps: float
    ) -> tuple[Tensor, Tensor, Tensor]:
        dx, dw, db = bwd(contig(dy), contig(x), w, mean, rstd, False, True, eps=eps)
        return dx, dw, db

    call = build(
        OpDecl(
            name=name,
            fwd=_fwd,
            bwd=_bwd,
            fwd_fake=lambda x, w, b, eps: (empty_like_contig(x), _stats_fake(x), _stats_fake(x)),
            bwd_fake=lambda dy, x, w, mean, rstd, has_bias, eps: (
                empty_like_contig(x),
                torch.empty_like(w),
                torch.empty_like(w),
            ),
            # extra: (has_bias, eps)
            save=lambda inputs, out: ((inputs[0], inputs[1], out[1], out[2]),
                                      (inputs[2] is not None, inputs[3])),  # fmt: skip
            bwd_args=lambda saved, extra, dy: (dy, *saved, *extra),
            grads=lambda g, extra: (g[0], g[1], g[2] if extra[0] else None, None),
            needs_grad=lambda x, w, b, eps: (
                x.requires_grad or w.requires_grad or (b is not None and b.requires_grad)
            ),
            samples=(
                lambda make: (*make.args(True), 1e-5),
                lambda make: _bwd_sample(make, rms=False) + (True, 1e-5),
            ),
            triton=triton,
        )
    )

    if node is None:

        @expose(call, name)
        def layer_norm(x: Tensor, weight: Tensor, bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
            # The launchers read weight and bias with unit stride: a strided or expanded one
            # is packed first (autograd carries its gradient back through the copy).
            return call(x, contig(weight), contig(bias), float(eps))

        return layer_norm

    @expose(call, name)
    def layer_norm_node(x: Tensor, weight: Tensor, bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
        if _eager_node(x):
            y = node(x, weight, bias, float(eps))
            if y is not None:
                return y
        return call(x, contig(weight), contig(bias), float(eps))

    return layer_norm_node


def add_layer_norm_op(name: str, fwd, bwd, triton: bool = False):
    """Custom ops ``kernellab::<name>`` (x, r, w, b?, eps) -> (y, h, mean, rstd), h = x + r
    and y = layer_norm(h), and ``kernellab::<name>_backward``; returns the callable
    ``(x, r, w, b, eps) -> (y, h)``, both differentiable (a pre-LN transformer's residual
    stream h and its normalized rows y). ``fwd(x, r, w, b, eps) -> (y, h, mean, rstd)`` and
    ``bwd(dy, dres, h, w, mean, rstd, has_bias, eps) -> (dx + dres, dw, db)`` are the launchers;
    the gradient of x and of r is the same tensor (h = x + r)."""

    def _fwd(x: Tensor, r: Tensor, w: Tensor, b: Tensor | None, eps: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        return fwd(x, r, w, b, eps)

    def _bwd(
        dy: Tensor, dres: Tensor | None, h: Tensor, w: Tensor, mean: Tensor, rstd: Tensor, has_bias: bool,
        eps: float,
    ) -> tuple[Tensor, Tensor, Tensor]:
        dx, dw, db = bwd(dy, dres, h, w, mean, rstd, has_bias, eps)
        return dx, dw, db

    def _bwd_args(saved, extra, dys):
        dy, dres = dys
        h = saved[0]
        # autograd passes None for an output nobody differentiated
        dy = torch.zeros_like(h) if dy is None else contig(dy)
        return (dy, contig(dres), *saved, *extra)

    return build(
        OpDecl(
            name=name,
            fwd=_fwd,
            bwd=_bwd,
            fwd_fake=lambda x, r, w, b, eps: (empty_like_contig(x), empty_like_contig(x), _stats_fake(x),
                                             _stats_fake(x)),  # fmt: skip
            bwd_fake=lambda dy, dres, h, w, mean, rstd, has_bias, eps: (
                empty_like_contig(h), torch.empty_like(w), torch.empty_like(w)),  # fmt: skip
            save=lambda inputs, out: ((out[1], inputs[2], out[2], out[3]),
                                      (inputs[3] is not None, inputs[4])),  # fmt: skip
            bwd_args=_bwd_args,
            grads=lambda g, extra: (g[0], g[0], g[1], g[2] if extra[0] else None, None),
            needs_grad=lambda x, r, w, b, eps: (
                x.requires_grad or r.requires_grad or w.requires_grad or (b is not None and b.requires_grad)
            ),
            samples=(
                lambda make: (make.args(True)[0], make.args(True)[0].detach().clone().requires_grad_(),
                              *make.args(True)[1:], 1e-5),  # fmt: skip
                lambda make: _add_bwd_sample(make),
            ),
            triton=triton,
            outputs=2,
        )
    )


def _add_bwd_sample(make):
    dy, x, w, mean, rstd = _bwd_sample(make, rms=False)
    return (dy, dy.detach().clone(), x, w, mean, rstd, True, 1e-5)


def rms_norm_op(name: str, fwd, bwd, triton: bool = False, node=None):
    """Custom ops ``kernellab::<name>`` (x, w, eps) -> (y, rstd) and
    ``kernellab::<name>_backward``; returns the registry callable ``(x, w, eps=1e-6)``.
    ``node(x, w, eps) -> y or None``: the eager path of plain CUDA calls, as in
    ``layer_norm_op``."""

    def _fwd(x: Tensor, w: Tensor, eps: float) -> tuple[Tensor, Tensor]:
        y, _, rstd = fwd(contig(x), w, None, eps, True)
        return y, rstd

    def _bwd(dy: Tensor, x: Tensor, w: Tensor, rstd: Tensor, eps: float) -> tuple[Tensor, Tensor]:
        dx, dw, _ = bwd(contig(dy), contig(x), w, None, rstd, True, False, eps=eps)
        return dx, dw

    call = build(
        OpDecl(
            name=name,
            fwd=_fwd,
            bwd=_bwd,
            fwd_fake=lambda x, w, eps: (empty_like_contig(x), _stats_fake(x)),
            bwd_fake=lambda dy, x, w, rstd, eps: (empty_like_contig(x), torch.empty_like(w)),
            save=lambda inputs, out: ((inputs[0], inputs[1], out[1]), inputs[2]),
            bwd_args=lambda saved, eps, dy: (dy, *saved, eps),
            grads=lambda g, extra: (g[0], g[1], None),
            needs_grad=lambda x, w, eps: x.requires_grad or w.requires_grad,
            samples=(
                lambda make: (*make.args(True), 1e-6),
                lambda make: _bwd_sample(make, rms=True) + (1e-6,),
            ),
            triton=triton,
        )
    )

    if node is None:

        @expose(call, name)
        def rms_norm(x: Tensor, weight: Tensor, eps: float = 1e-6) -> Tensor:
            return call(x, contig(weight), float(eps))  # unit-stride weight, as layer_norm

        return rms_norm

    @expose(call, name)
    def rms_norm_node(x: Tensor, weight: Tensor, eps: float = 1e-6) -> Tensor:
        if _eager_node(x):
            y = node(x, weight, float(eps))
            if y is not None:
                return y
        return call(x, contig(weight), float(eps))

    return rms_norm_node


def _bwd_sample(make, rms: bool):
    """opcheck args of a backward op: (dy, x, w, [mean,] rstd) with statistics computed
    by PyTorch in fp32 from a fresh sample."""
    args = make.args(False)
    x, w = args[0], args[1]
    dy = make(False).to(x.dtype).reshape(x.shape)
    x32 = x.float().reshape(-1, x.shape[-1])
    if rms:
        rstd = torch.rsqrt(x32.square().mean(-1) + 1e-6)
        return (dy, x, w, rstd)
    mean = x32.mean(-1)
    rstd = torch.rsqrt(x32.var(-1, unbiased=False) + 1e-5)
    return (dy, x, w, mean, rstd)


def add_rms_norm_op(name: str, fwd, bwd, triton: bool = False):
    """Custom ops ``kernellab::<name>`` (x, r, w, eps) -> (y, h, rstd), h = x + r and
    y = rms_norm(h) * w, and ``kernellab::<name>_backward``; returns the registry callable
    ``(x, residual, weight, eps=1e-6) -> (y, h)``, both differentiable. ``fwd(x, r, w, eps)
    -> (y, h, rstd)`` (x, r contiguous) and ``bwd(dy, dres, h, w, rstd, eps) -> (dh, dw)`` are
    the launchers; dh = the norm's gradient + dres is the gradient of x and of r alike."""

    def _fwd(x: Tensor, r: Tensor, w: Tensor, eps: float) -> tuple[Tensor, Tensor, Tensor]:
        return fwd(contig(x), contig(r), w, eps)

    def _bwd(
        dy: Tensor, dres: Tensor | None, h: Tensor, w: Tensor, rstd: Tensor, eps: float
    ) -> tuple[Tensor, Tensor]:
        dh, dw = bwd(dy, dres, h, w, rstd, eps)
        return dh, dw

    def _bwd_args(saved, extra, dys):
        dy, dres = dys
        h = saved[0]
        # autograd passes None for an output nobody differentiated
        dy = torch.zeros_like(h) if dy is None else contig(dy)
        return (dy, contig(dres), *saved, extra)

    def _bwd_sample(make):
        x, r, w = make.args(False)
        h = x + r
        dy = make(False).to(x.dtype).reshape(x.shape)
        rstd = torch.rsqrt(h.float().reshape(-1, h.shape[-1]).square().mean(-1) + 1e-6)
        return (dy, dy.detach().clone(), h, w, rstd, 1e-6)

    call = build(
        OpDecl(
            name=name,
            fwd=_fwd,
            bwd=_bwd,
            fwd_fake=lambda x, r, w, eps: (empty_like_contig(x), empty_like_contig(x), _stats_fake(x)),
            bwd_fake=lambda dy, dres, h, w, rstd, eps: (empty_like_contig(h), torch.empty_like(w)),
            save=lambda inputs, out: ((out[1], inputs[2], out[2]), inputs[3]),  # h, w, rstd; eps
            bwd_args=_bwd_args,
            grads=lambda g, extra: (g[0], g[0], g[1], None),
            needs_grad=lambda x, r, w, eps: x.requires_grad or r.requires_grad or w.requires_grad,
            samples=(lambda make: (*make.args(True), 1e-6), _bwd_sample),
            triton=triton,
            outputs=2,
        )
    )

    @expose(call, name)
    def add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float = 1e-6) -> tuple[Tensor, Tensor]:
        return call(x, residual, contig(weight), float(eps))  # unit-stride weight, as rms_norm

    return add_rms_norm
