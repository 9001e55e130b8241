"""What the chunked backends (``chunked``: PyTorch ops, ``triton``: our row kernels) share:
the two runners (``run_chunks`` over row chunks, ``run_blocks`` over column blocks of the
vocabulary), the 16-bit matmuls with fp32 results, each row's loss from its softmax state
(``row_loss``), and the declaration to the op kit (custom op or triton_op, autograd, eager
path).

Each backend supplies ``run_chunks``' launcher over a chunk's fp32 logits:

``rows(z, target, g, loss, ignore_index, label_smoothing, z_loss, write_grad, grad_dtype)``:
    z fp32 contiguous [C, V] (the chunk's logits, bias included), target int64 [C] (each in
    [0, V) or ignore_index), g fp32 [C] or None (1 for every row); writes the per-row loss
    into ``loss`` (fp32 [C], 0 on ignored rows) and, with ``write_grad``, the dlogits
    g_i * d loss_i / d z_ij = g_i * (p_ij * (1 + 2 z lse_i) - eps / V - (1 - eps) [j == t_i])
    (0 on ignored rows): over z (fp32), returning None, or into a new tensor of
    ``grad_dtype`` (x's dtype), returned.

Memory per chunk: C * V * 4 bytes of logits, C * V * 2 more for the 16-bit dlogits the dx
and dweight matmuls read (a copy of z's, or written there by the launcher). Across chunks: dweight and dbias
in fp32 and dx in x's dtype. ``run_blocks``' backend (``triton``) supplies a (stats, grad)
pair of launchers (its docstring) beside ``rows``, which it runs where one pass of one block
holds the problem.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kernellab.core.kit import OpDecl, build
from kernellab.ops.linear_cross_entropy.targets import check_targets as _check_targets
from kernellab.ops.linear_cross_entropy.targets import wants_check
from kernellab.triton_support import cdiv, next_pow2

_F32 = torch.float32


MIN_CHUNK = 64  # rows (see the op's docstring)


def default_chunk(n: int, h: int, v: int) -> int:
    """Rows per chunk: a power of two near N / ceil(V / H), so that a chunk's logits hold
    about as many elements as x ([N, H]); at least MIN_CHUNK, at most N (and 1)."""
    c = max(MIN_CHUNK, next_pow2(cdiv(n, max(1, cdiv(v, max(h, 1))))))
    return max(1, min(c, n))


# Rows per chunk of ``triton_rows``: its [V, H] fp32 dweight accumulator is read and written
# once per chunk (2 GB a chunk at V=128256, H=4096), so its chunks are larger than
# ``default_chunk``'s: up to ROWS_CHUNK_ELEMS fp32 logits (1 GiB, and 0.5 GiB of 16-bit
# dlogits), and up to the larger of N / ROWS_CHUNK_SHARE rows (a chunk's fp32 logits and
# dlogits under a fifth of the [N, V] logits in 16 bits) and 2 H / 3 rows (the chunk's 6 C V
# bytes within the accumulator's 4 V H: where the accumulator outweighs the logits, as at
# 4096 rows of width 4096, the chunks grow with it rather than pass over it 16 times).
ROWS_CHUNK_ELEMS = 1 << 28
ROWS_CHUNK_SHARE = 16


def rows_chunk(n: int, h: int, v: int) -> int:
    """Rows per chunk of ``triton_rows``: the largest power of two within ROWS_CHUNK_ELEMS
    logits and max(N / ROWS_CHUNK_SHARE, 2 H / 3) rows, at least ``default_chunk``'s (so
    MIN_CHUNK), at most N (and 1)."""
    c = MIN_CHUNK
    cap = max(n // ROWS_CHUNK_SHARE, 2 * h // 3)
    while 2 * c * max(v, 1) <= ROWS_CHUNK_ELEMS and 2 * c <= cap:
        c *= 2
    return max(1, min(max(c, default_chunk(n, h, v)), n))


# torch.mm / torch.addmm with out_dtype=float32 (cuBLAS: 16-bit operands, fp32 result and
# accumulator) where the device and PyTorch have it (CUDA; not the CPU). Without it, the
# logits come from PyTorch's 16-bit product rounded to 16 bits (as F.linear gives them),
# and dweight is accumulated by an fp32 product of the 16-bit values (exact, but no tensor
# cores): rounding each chunk's dweight to 16 bits before the sum would grow its error
# with the number of chunks.
_OUT_DTYPE: dict = {}


def _tracing(t: Tensor) -> bool:
    """Fake or meta tensors (opcheck, torch.compile tracing into the triton_op)."""
    return torch.compiler.is_compiling() or torch._subclasses.fake_tensor.is_fake(t) or t.device.type == "meta"


def _out_dtype_ok(t: Tensor) -> bool:
    # Traced: no probe (it reads a value); CUDA has it, as the probe finds on a GPU. The
    # traced graph must compute what the eager call computes (opcheck compares them).
    if _tracing(t):
        return t.device.type == "cuda"
    key = (t.device.type, t.dtype)
    ok = _OUT_DTYPE.get(key)
    if ok is None:
        try:
            a = torch.ones(2, 2, dtype=t.dtype, device=t.device)
            c = torch.zeros(2, 2, dtype=_F32, device=t.device)
            for _ in range(2):  # accumulates in place: 0 -> 2 -> 4
                torch.addmm(c, a, a, out_dtype=_F32, out=c)
            ok = bool(torch.mm(a, a, out_dtype=_F32).dtype == _F32 and c[0, 0].item() == 4.0)
        except (RuntimeError, TypeError, NotImplementedError):
            ok = False
        _OUT_DTYPE[key] = ok
    return ok


def _logits(xc: Tensor, w: Tensor, b32: Tensor | None, b: Tensor | None, wide: bool) -> Tensor:
    """fp32 [C, V] contiguous logits of one chunk."""
    if xc.dtype == _F32:
        return torch.nn.functional.linear(xc, w, b).contiguous()
    if wide:
        z = torch.mm(xc, w.t(), out_dtype=_F32)
        return z if b32 is None else z.add_(b32)
    return torch.nn.functional.linear(xc, w, b).float()


def run_chunks(rows, x, w, b, t, g, ignore_index, eps, zc, chunk, want_grad):
    """(loss_rows fp32 [N], dx [N, H] in x's dtype, dweight [V, H], dbias fp32 [V] or
    None); the gradients are None without ``want_grad``. x [N, H] any strides, w [V, H],
    b [V] or None, t int64 [N] contiguous, g fp32 [N] or None (see the module docstring).
    dweight is summed over the chunks in fp32; when one chunk holds every row it is one
    product, in w's dtype where the product has fp32 results (rounded once, no accumulator)."""
    n, h = x.shape
    v = w.shape[0]
    dev = x.device
    loss = torch.empty(n, dtype=_F32, device=dev)
    dx = dw = db = None
    sixteen = x.dtype != _F32
    wide = sixteen and _out_dtype_ok(x)
    traced = _tracing(x)
    one = 0 < n <= chunk  # one chunk: dweight from one product
    b32 = b.float() if (b is not None and wide) else None
    if want_grad:
        dx = torch.empty(n, h, dtype=x.dtype, device=dev)
        dw = None if one else torch.zeros(v, h, dtype=_F32, device=dev)
        db = torch.zeros(v, dtype=_F32, device=dev) if b is not None else None
    for s in range(0, n, chunk):
        e = min(n, s + chunk)
        xc = x[s:e]
        z = _logits(xc, w, b32, b, wide)
        gc = None if g is None else g[s:e]
        d = rows(z, t[s:e], gc, loss[s:e], ignore_index, eps, zc, want_grad, x.dtype)
        if not want_grad:
            continue
        if db is not None:
            db += z.sum(0) if d is None else d.float().sum(0)
        if not sixteen:
            z = z if d is None else d
            torch.mm(z, w, out=dx[s:e])
            if one:
                dw = z.t() @ xc
            else:
                dw.addmm_(z.t(), xc)
            continue
        # dlogits rounded as PyTorch's autograd rounds them
        z16 = z.to(x.dtype) if d is None else d
        del z
        torch.mm(z16, w, out=dx[s:e])
        if one:
            dw = z16.t() @ xc if wide else z16.t().float() @ xc.float()
        elif wide and traced:  # addmm's out_dtype forms have no working fake kernel in PyTorch 2.11
            dw = dw + torch.mm(z16.t(), xc, out_dtype=_F32)
        elif wide:
            torch.addmm(dw, z16.t(), xc, out_dtype=_F32, out=dw)
        else:
            dw.addmm_(z16.t().float(), xc.float())
    return loss, dx, dw, db


def row_loss(m, log_s, zt_m, mean_m, eps, zc):
    """Each row's loss from its softmax state, as log_softmax forms it (z - m and log s kept
    apart): m the row max, log s of sum exp(z - m), zt_m = z_target - m, mean_m = mean_j z_j
    - m; a zero eps or zc adds nothing (0 * inf would be NaN)."""
    row = log_s - (1.0 - eps) * zt_m
    if eps:
        row = row - eps * mean_m
    if zc:
        lse = m + log_s
        row = row + zc * lse * lse
    return row


def state_loss(fold, t, v, ignore_index, eps, zc):
    """(each row's loss, m, log s) of rows with targets ``t`` [C] over a vocabulary of ``v``:
    ``fold(m, s, zt, tot)`` folds the rows' logits into their softmax state (fp32 [C] each,
    in place: running max m, sum s of exp(z - m), target logit zt, row sum tot; the row
    kernels' ``stats``). The loss is 0 on ignored rows and NaN where a target is out of
    range."""
    c, dev = t.shape[0], t.device
    m = torch.full((c,), float("-inf"), dtype=_F32, device=dev)
    ssum = torch.zeros(c, dtype=_F32, device=dev)
    zt = torch.zeros(c, dtype=_F32, device=dev)
    tot = torch.zeros(c, dtype=_F32, device=dev)
    fold(m, ssum, zt, tot)
    log_s = ssum.log()
    row = row_loss(m, log_s, zt - m, tot / v - m, eps, zc)
    row = torch.where((t >= 0) & (t < v), row, float("nan"))
    return torch.where(t != ignore_index, row, 0.0), m, log_s  # select: an ignored NaN row stays 0


# Logits per column block of the blocked runner. A block's fp32 logits, its dlogits and
# the fp32 dx sum are the op's transient memory at the end of a model's forward (the step's
# peak): BLOCK_ELEMS logits (64 MiB in fp32), grown up to 4x that while a block's products
# are under BLOCK_FLOPS. A block costs ~8 launches of host time, and each block reads and
# writes the fp32 dx sum (8 N H bytes), so wider blocks are faster; past this size the
# gain levels off while the memory keeps growing (benchmarks/NOTES.md, session (m)).
BLOCK_ELEMS = 1 << 24
BLOCK_FLOPS = 1 << 37
MAX_ROWS = 1 << 17  # the blocked runner's default rows per pass


def block_cols(c: int, v: int, h: int = 1) -> int:
    """Columns per block of the blocked runner for ``c`` rows of width ``h``: a power of two,
    at least 128 (a thinner product wastes the tensor cores' tiles), with about BLOCK_ELEMS
    logits, or up to 4x that while a block's product 2 c h cols is under BLOCK_FLOPS; at
    most V."""
    c = max(c, 1)
    b = 128
    while b * 2 * c <= BLOCK_ELEMS or (2 * c * h * b < BLOCK_FLOPS and b * 2 * c <= 4 * BLOCK_ELEMS):
        b *= 2
    return max(1, min(b, v))


def run_blocks(kernels, x, w, b, t, g, ignore_index, eps, zc, chunk, want_grad):
    """The blocked runner: as ``run_chunks`` (same returns, dweight in w's dtype when the
    rows fit one pass) but over column blocks of the vocabulary within a pass of ``chunk``
    rows. ``kernels = (stats, grad)``:

    ``stats(z, t, v0, m, s, zt, tot)``: folds the block z [C, B] fp32 (columns v0..v0+B) into
    each row's running max m, sum s of exp(z - m), target logit zt (where the row's target
    is in the block) and row sum tot (fp32 [C] each, updated in place).
    ``grad(z, d, t, g, m, log_s, v0, V, ignore_index, eps, zc)``: writes the block's
    g * dloss/dz into d [C, B] (x's dtype; d may be z).

    A pass computes the logits twice (statistics, then gradients), so each block's dweight
    rows are one product over the pass's rows, rounded once (as PyTorch's one matmul) with
    no [V, H] fp32 accumulator when one pass holds every row; dx sums the blocks in fp32."""
    stats, grad = kernels
    n, h = x.shape
    v = w.shape[0]
    dev = x.device
    loss = torch.empty(n, dtype=_F32, device=dev)
    sixteen = x.dtype != _F32
    wide = sixteen and _out_dtype_ok(x)
    traced = _tracing(x)
    multi = chunk < n
    b32 = b.float() if (b is not None and wide) else None
    dx = dw = db = None
    if want_grad:
        if multi:
            dx = torch.empty(n, h, dtype=x.dtype, device=dev)
            dw = torch.zeros(v, h, dtype=_F32, device=dev)
        elif not traced:  # (traced: the blocks are joined at the end)
            dw = torch.empty(v, h, dtype=w.dtype, device=dev)
        db = torch.zeros(v, dtype=_F32, device=dev) if b is not None else None
    for s0 in range(0, n, chunk):
        s1 = min(n, s0 + chunk)
        c = s1 - s0
        xc, tc = x[s0:s1], t[s0:s1]
        gc = None if g is None else g[s0:s1]
        nb = block_cols(c, v, h)
        blocks = [(v0, min(v, v0 + nb)) for v0 in range(0, v, nb)]

        def logits(v0, v1):
            return _logits(xc, w[v0:v1], None if b32 is None else b32[v0:v1],
                           None if b is None else b[v0:v1], wide)  # fmt: skip

        def fold(m, ssum, zt, tot):
            for v0, v1 in blocks:
                stats(logits(v0, v1), tc, v0, m, ssum, zt, tot)

        loss[s0:s1], m, log_s = state_loss(fold, tc, v, ignore_index, eps, zc)
        if not want_grad:
            continue
        dxc = torch.zeros(c, h, dtype=_F32, device=dev)
        parts = []  # traced, one pass: dweight's blocks, joined once (no slice writes to functionalize)
        for v0, v1 in blocks:
            z = logits(v0, v1)
            d = torch.empty(z.shape, dtype=x.dtype, device=dev) if sixteen else z
            grad(z, d, tc, gc, m, log_s, v0, v, ignore_index, eps, zc)
            wb = w[v0:v1]
            if db is not None:
                db[v0:v1] += d.float().sum(0)
            if wide:  # 16-bit products with fp32 results
                if traced:  # (no out= forms: their fake kernels fail in PyTorch 2.11)
                    dxc = dxc + torch.mm(d, wb, out_dtype=_F32)
                else:
                    torch.addmm(dxc, d, wb, out_dtype=_F32, out=dxc)
            else:  # fp32, or 16-bit where out_dtype is missing: exact fp32 products
                dxc.addmm_(d.float(), wb.float())
            # this block's rows of dweight: one product over the pass's rows
            if multi:  # summed over passes in fp32
                dw[v0:v1] += torch.mm(d.t(), xc, out_dtype=_F32) if wide else d.t().float() @ xc.float()
            elif (wide or not sixteen) and not traced:
                torch.mm(d.t(), xc, out=dw[v0:v1])  # rounded once, in place
            else:
                dwb = d.t() @ xc if (wide or not sixteen) else (d.t().float() @ xc.float()).to(w.dtype)
                if traced:
                    parts.append(dwb)
                else:
                    dw[v0:v1] = dwb
            del z, d  # (else the next block's logits are made while these are alive)
        if parts:
            dw = torch.cat(parts)
        if multi:
            dx[s0:s1] = dxc
        else:  # one pass: dx made from the fp32 sum after the blocks, not beside them
            dx = dxc.to(x.dtype)
        del dxc
    if want_grad and dw is None:  # traced, no rows
        dw = torch.zeros(v, h, dtype=w.dtype, device=dev)
    if want_grad and dx is None:  # no rows
        dx = torch.empty(n, h, dtype=x.dtype, device=dev)
    return loss, dx, dw, db


def torch_rows(z, t, g, loss, ignore_index, eps, zc, write_grad, grad_dtype=None) -> None:
    """The row launcher in PyTorch ops (the ``chunked`` backend): dlogits over z. As
    log_softmax, it keeps z - m and log s apart (see triton.py): a row with +inf gives NaN,
    as PyTorch's."""
    v = z.shape[1]
    keep = t != ignore_index
    tt = torch.where(keep, t, 0).unsqueeze(1)
    m = z.amax(1, keepdim=True)
    zm = z - m
    log_s = zm.exp().sum(1).log()
    row = row_loss(m.squeeze(1), log_s, zm.gather(1, tt).squeeze(1), zm.mean(1) if eps else None, eps, zc)
    loss.copy_(torch.where(keep, row, 0.0))  # select: a NaN row that is ignored stays 0
    if not write_grad:
        return
    torch.exp(zm.sub_(log_s.unsqueeze(1)), out=z)  # p
    if eps:
        z.sub_(eps / v)
    z.scatter_add_(1, tt, torch.full(tt.shape, -(1.0 - eps), dtype=_F32, device=z.device))
    if zc:
        # p (1 + c) - q as (p - q)(1 + c) + c q, c = 2 z lse: the factor 1 + c, rounded,
        # multiplies p - q (near 0 where p is near q: a one-word vocabulary), not p
        c = (2.0 * zc * (m.squeeze(1) + log_s)).unsqueeze(1)
        z.mul_(1.0 + c)
        if eps:
            z.add_(c * (eps / v))
        z.scatter_add_(1, tt, c * (1.0 - eps))
    if g is not None:
        z.mul_(g.unsqueeze(1))
    z.masked_fill_(~keep.unsqueeze(1), 0.0)


def torch_reduce(rows: Tensor, t: Tensor, ignore_index: int, reduction: str):
    """(loss, scale) of the row losses in PyTorch ops: the loss's reduction and the
    gradients' scale (1 / #non-ignored for "mean"). The rows' losses are summed in fp64 and
    rounded once (PyTorch's CPU nll_loss accumulates fp32 in double too): an fp32 sum of a
    few rows near 5.5 can be 2 ulps off."""
    if reduction == "sum":
        return rows.double().sum().to(_F32), torch.ones((), dtype=_F32, device=rows.device)
    if reduction == "mean":  # all ignored: 0 / 0 = NaN, zero gradients
        count = (t != ignore_index).sum().to(_F32)
        return (rows.double().sum() / count.double()).to(_F32), 1.0 / count.clamp(min=1.0)
    return rows, torch.ones((), dtype=_F32, device=rows.device)


def torch_scale(dx: Tensor, dw: Tensor, db: Tensor | None, dy: Tensor, scale: Tensor) -> None:
    """dx, dw and db (None: no bias) times dy * scale, in place, in PyTorch ops."""
    g = dy.to(_F32) * scale
    for t in (dx, dw) if db is None else (dx, dw, db):
        t.mul_(g)


def chunked_backend(name: str, rows, triton: bool = False, blocks=None, chunk_rule=None, check=None,
                    reduce=torch_reduce, scale_grads=torch_scale):  # fmt: skip
    """The registry callable of a chunked backend around ``rows`` (module docstring): the
    ops ``kernellab::<name>`` (x [N, H], weight, bias, target [N], options, grad) ->
    (loss, grad scale, dx, dweight, dbias) and ``kernellab::<name>_backward``, declared
    once to the op kit, and the callable that flattens x, checks the targets and picks
    the chunk. ``blocks``: run_blocks' (stats, grad) pair; a pass takes every row up to
    MAX_ROWS by default, and a problem of one pass and one column block runs
    ``run_chunks`` with ``rows`` instead (its logits made once). ``chunk_rule(n, h, v)``:
    the default rows per chunk of ``run_chunks`` (default: ``default_chunk``).
    ``check``: ``check_targets``' ``first_bad`` (a kernel's search of the targets, read
    before the eager call; None: PyTorch ops). ``reduce``: as ``torch_reduce``; ``scale_grads``: as
    ``torch_scale``, the eager backward's in-place scaling of the saved gradients (a
    kernel's writes must bump the tensors' version counters, as mul_ does)."""
    chunk_rule = chunk_rule or default_chunk
    blocked = blocks is not None

    def run(x, weight, bias, t, g, ignore_index, eps, zc, chunk, want_grad):
        n, h = x.shape
        v = weight.shape[0]
        if blocked and (chunk < n or block_cols(n, v, h) < v):
            return run_blocks(blocks, x, weight, bias, t, g, ignore_index, eps, zc, chunk, want_grad)
        return run_chunks(rows, x, weight, bias, t, g, ignore_index, eps, zc, chunk, want_grad)

    def _fwd(
        x: Tensor, weight: Tensor, bias: Tensor | None, target: Tensor, ignore_index: int, reduction: str,
        label_smoothing: float, z_loss: float, chunk: int, grad: bool,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
        # grad (reduction "mean"/"sum" only): the gradients of the summed loss, computed here
        # (the logits are gone by the backward); scaled there by dy (/ #non-ignored).
        t = target.contiguous()
        loss, dx, dw, db = run(x, weight, bias, t, None, ignore_index, label_smoothing, z_loss, chunk, grad)
        loss, scale = reduce(loss, t, ignore_index, reduction)
        empty = x.new_empty(0)
        if not grad:
            return loss, scale, empty, empty, empty
        return loss, scale, dx, dw.to(weight.dtype), (db.to(bias.dtype) if db is not None else empty)

    def _bwd(
        x: Tensor | None, weight: Tensor | None, bias: Tensor | None, target: Tensor | None,
        dx: Tensor, dw: Tensor, db: Tensor, scale: Tensor, dy: Tensor, ignore_index: int, reduction: str,
        label_smoothing: float, z_loss: float, chunk: int, has_bias: bool,
    ) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
        if reduction != "none":
            g = dy.to(_F32) * scale
            return dx * g, dw * g, (db * g if has_bias else db.new_empty(0))
        # "none": recompute each chunk's logits with the per-row dy folded into dlogits
        _, gx, gw, gb = run(x, weight, bias, target.contiguous(), dy.to(_F32).contiguous(), ignore_index,
                            label_smoothing, z_loss, chunk, True)  # fmt: skip
        return gx, gw.to(weight.dtype), (gb.to(bias.dtype) if gb is not None else x.new_empty(0))

    def _bwd_eager(
        x, weight, bias, target, dx, dw, db, scale, dy, ignore_index, reduction, label_smoothing, z_loss,
        chunk, has_bias,
    ):  # fmt: skip
        # The eager path scales the saved gradients in place and hands them over: dx * g
        # would allocate a second dweight ([V, H]) at the start of the backward, when every
        # activation of the model is still alive (the step's peak). A second backward
        # through the graph finds them modified (PyTorch's version counter) and is refused
        # with the op's inplace_hint.
        if reduction == "none":
            return _bwd(x, weight, bias, target, dx, dw, db, scale, dy, ignore_index, reduction, label_smoothing,
                        z_loss, chunk, has_bias)  # fmt: skip
        scale_grads(dx, dw, db if has_bias else None, dy, scale)
        return dx, dw, (db if has_bias else db.new_empty(0))

    def _fwd_fake(x, weight, bias, target, ignore_index, reduction, label_smoothing, z_loss, chunk, grad):
        n = x.shape[0]
        loss = x.new_empty((n,) if reduction == "none" else (), dtype=_F32)
        scale = x.new_empty((), dtype=_F32)
        if not grad:
            return loss, scale, x.new_empty(0), x.new_empty(0), x.new_empty(0)
        db = torch.empty_like(bias) if bias is not None else x.new_empty(0)
        return loss, scale, torch.empty_like(x), torch.empty_like(weight), db

    def _bwd_fake(x, weight, bias, target, dx, dw, db, scale, dy, ignore_index, reduction, label_smoothing,
                  z_loss, chunk, has_bias):  # fmt: skip
        if reduction != "none":
            gb = torch.empty_like(db) if has_bias else db.new_empty(0)
            return torch.empty_like(dx), torch.empty_like(dw), gb
        return (torch.empty_like(x), torch.empty_like(weight),
                torch.empty_like(bias) if bias is not None else x.new_empty(0))  # fmt: skip

    def _save(inputs, out):
        x, weight, bias, target, ii, red, eps, zc, chunk, grad = inputs
        _, scale, dx, dw, db = out
        extra = (ii, red, eps, zc, chunk, bias is not None)
        if red == "none":  # the backward recomputes: keep the inputs, no gradient was made
            return (x, weight, bias, target, dx, dw, db, scale), extra
        return (None, None, None, None, dx, dw, db, scale), extra

    def _bwd_args(saved, extra, dy):
        return (*saved, dy, *extra)

    def _grads(g, extra):
        return (g[0], g[1], g[2] if extra[-1] else None) + (None,) * 7

    def _needs_grad(x, weight, bias, target, *rest):
        return x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)

    def _fwd_sample(make):
        x, w, t = make.args(1)
        return (x.reshape(-1, x.shape[-1]), w, None, t.reshape(-1), -100, "mean", 0.1, 1e-3, 4, True)

    def _bwd_sample(make):
        x, w, t = make.args(0)
        x, t = x.reshape(-1, x.shape[-1]), t.reshape(-1)
        dy = torch.randn(x.shape[0], device=x.device)
        return (x, w, None, t, x.new_empty(0), x.new_empty(0), x.new_empty(0),
                torch.ones((), device=x.device), dy, -100, "none", 0.1, 1e-3, 4, False)  # fmt: skip

    op = build(
        OpDecl(
            name=name,
            label=f"linear_cross_entropy ({name.removeprefix('linear_cross_entropy_')})",
            fwd=_fwd,
            bwd=_bwd,
            fwd_fake=_fwd_fake,
            bwd_fake=_bwd_fake,
            save=_save,
            bwd_args=_bwd_args,
            grads=_grads,
            needs_grad=_needs_grad,
            samples=(_fwd_sample, _bwd_sample),
            triton=triton,
            eager_bwd=_bwd_eager,
            inplace_hint=(
                "a tensor its backward needs was modified in place after the forward: x, weight or bias "
                "(reduction='none' keeps them), or the gradients themselves, which the first backward "
                "scales in place (reduction 'mean' / 'sum'): a second backward through the same graph "
                "(retain_graph=True) is not supported by this backend; use backend='torch' for that"
            ),
        )
    )
    is_compiling = torch.compiler.is_compiling
    grad_enabled = torch.is_grad_enabled

    def call(x, weight, target, bias=None, ignore_index=-100, reduction="mean", label_smoothing=0.0,
             z_loss=0.0, chunk=None, check_targets=None):  # fmt: skip
        v, h = weight.shape
        t = target.reshape(-1)
        x2 = x.reshape(t.shape[0], h)
        if wants_check(check_targets, x.is_cuda, triton) and not is_compiling():
            _check_targets(t, v, ignore_index, check)
        if chunk is not None:
            c = chunk
        else:
            c = max(1, min(x2.shape[0], MAX_ROWS)) if blocked else chunk_rule(x2.shape[0], h, v)
        grad = reduction != "none" and grad_enabled() and _needs_grad(x, weight, bias, target)
        eps, zc = float(label_smoothing), float(z_loss)
        loss = op(x2, weight, bias, t, ignore_index, reduction, eps, zc, c, grad)
        if reduction == "none":
            loss = loss.reshape(target.shape)
        return loss.to(x.dtype)

    call.custom_ops, call.ops = op.custom_ops, op.ops
    call.__name__ = name
    return call
