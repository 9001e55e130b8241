"""FlashAttention-2 written with PyTorch ops: the readable specification of the algorithm
the Triton kernels implement, runnable on the CPU.

Shapes: q (BH, S_q, D), k and v (BH, S_k, D) after folding the leading dims; every tile
below is a slice of those, all heads at once. Math in fp32 for fp16 / bf16 inputs (tiles
upcast one by one, P rounded to the input dtype before PV as the kernels do), and in
float64 for fp32 inputs: in fp32 the extra rounding of S * scale here (the kernels fuse it
into one FMA with the max subtraction) cost the spec the 2x-PyTorch rule on rows whose two
largest scores are ~70 and close together (1 seed in 10 of the check's large-score case).

Forward, for each query block Q_i (BLOCK_M rows):
    m = -inf, l = 0, acc = 0                       running max, running sum, unnormalized O
    for each key block K_j, V_j the block may see (causal: stop at the diagonal):
        S = Q_i K_j^T * scale                      (BLOCK_M x BLOCK_N), masked -inf
        m_new = max(m, rowmax(S))
        P = exp(S - m_new);  alpha = exp(m - m_new)
        l = alpha l + rowsum(P);  acc = alpha acc + P V_j
        m = m_new
    O_i = acc / l;  LSE_i = m + log(l)             (the one tensor saved for the backward)

Backward, with D_i = rowsum(dO_i * O_i) (so that dS = P (dP - D)):
    m, l = the forward's row statistics, recomputed (one pass of S, no PV)
    for each key block j, for each query block i it meets:
        P = exp(S - m_i) / l_i                     recomputed: no S x S tensor is kept
        dV_j += P^T dO_i
        dP = dO_i V_j^T;  dS = P (dP - D_i)
        dK_j += dS^T Q_i scale;  dQ_i += dS K_j scale

GQA: k and v are expanded to q's heads first (a copy: this is the readable spec; the
Triton kernels index the shared k/v head instead), so autograd sums dk, dv over each
group through repeat_interleave's backward.

Sliding window (left, right) and softcap c (package docstring): the mask below gains the
window's two bounds, and only the key blocks inside some row's window are visited (in
the backward: only the query blocks that see some key of the block); the scores become
c tanh(S / c) before the mask, and the backward multiplies dS by 1 - tanh^2.

Rows with no allowed key (causal, S_q > S_k, or outside every window) keep l = 0: O = 0,
LSE = -inf, and their P is 0 in the backward.

Why the backward recomputes (m, l) rather than read the saved LSE (the kernels' P =
exp(S - LSE)): the LSE is saved in fp32, rounded by up to half an ulp of |LSE|, and that
error lands in the exponent. At |S| ~ 1e4 it already costs fp32 inputs the 2x-PyTorch rule
on dv; at |q| ~ 1e12 it is ~2^15, so P overflows to inf and dq, dk, dv come out NaN while O
is finite. exp(S - m) has an exponent <= 0 and m is one of the row's scores, exactly as the
forward used it. The saved LSE stays the autograd node's contract (one fp32 tensor of
q.shape[:-1]); the products scale dS before the matmuls with q and k (dS Q scale may
overflow fp32 where (dS scale) Q does not).
"""

from __future__ import annotations

import math

import torch

from kernellab.core.registry import register
from kernellab.ops.attention.args import expand_kv, has_softcap, resolve_scale, window_bounds

BLOCK_M = 32  # query rows per tile
BLOCK_N = 16  # keys per tile (unequal on purpose: the causal bookkeeping must not assume M == N)


def _fold(t: torch.Tensor) -> torch.Tensor:
    return t.reshape((math.prod(t.shape[:-2]),) + tuple(t.shape[-2:]))  # (-1 fails on 0 elements)


def _key_range(i0: int, s_q: int, s_k: int, causal: bool, win) -> tuple[int, int]:
    """[first key block start, one past the last key) that any of the query rows
    [i0, i0 + BLOCK_M) may see (win: window_bounds, causal already folded in)."""
    off = s_k - s_q
    start, end = 0, s_k
    if causal:
        end = max(0, min(s_k, i0 + BLOCK_M + off))
    if win is not None:
        left, right = win
        if left >= 0:
            start = max(0, i0 + off - left) // BLOCK_N * BLOCK_N
        if right >= 0:
            end = max(0, min(end, i0 + BLOCK_M + off + right))
    return start, end


def _query_range(j0: int, s_q: int, s_k: int, causal: bool, win) -> tuple[int, int]:
    """[first query block start, one past the last query) that sees some key of
    [j0, j0 + BLOCK_N): query i sees key j when i + off - left <= j <= i + off + right."""
    off = s_k - s_q
    start, end = 0, s_q
    right = 0 if causal else -1
    if win is not None:
        right = win[1]
        if win[0] >= 0:
            end = max(0, min(s_q, j0 + BLOCK_N - off + win[0]))
    if right >= 0:
        start = max(0, j0 - off - right) // BLOCK_M * BLOCK_M
    return start, end


def _mask(i0, j0, m, n, s_q, s_k, device, causal=True, win=None):
    """True where query i0 + a may attend key j0 + b (bottom-right causal, the window)."""
    i = torch.arange(i0, i0 + m, device=device)[:, None] + (s_k - s_q)
    j = torch.arange(j0, j0 + n, device=device)[None, :]
    ok = j <= i if causal else torch.ones(m, n, dtype=torch.bool, device=device)
    if win is not None:
        if win[0] >= 0:
            ok = ok & (j >= i - win[0])
        if win[1] >= 0:
            ok = ok & (j <= i + win[1])
    return ok


def _math_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float32 else torch.float32


def forward(q, k, v, causal: bool = False, scale=None, window=None, softcap=None):
    """(o, lse): o like q (D_v = D), lse (..., S_q) fp32."""
    sc = resolve_scale(q, scale)
    win, cap = window_bounds(window, causal), softcap if has_softcap(softcap) else None
    f = _math_dtype(q.dtype)
    lead, s_q, s_k = q.shape[:-2], q.shape[-2], k.shape[-2]
    qf, kf, vf = _fold(q), _fold(k), _fold(v)
    bh, d = qf.shape[0], qf.shape[-1]
    # o is returned as allocated, not as a reshaped view: autograd allows in-place ops on
    # a custom Function's output only when it is no view made inside it (_Tiled).
    o_out = torch.empty(lead + (s_q, d), dtype=q.dtype, device=q.device)
    o = o_out.view(bh, s_q, d)
    lse = torch.empty(bh, s_q, dtype=torch.float32, device=q.device)
    for i0 in range(0, s_q, BLOCK_M):
        qi = qf[:, i0 : i0 + BLOCK_M].to(f)
        m_rows = qi.shape[1]
        m = torch.full((bh, m_rows), float("-inf"), dtype=f, device=q.device)
        l = torch.zeros(bh, m_rows, dtype=f, device=q.device)
        acc = torch.zeros(bh, m_rows, d, dtype=f, device=q.device)
        for j0 in range(*_key_range(i0, s_q, s_k, causal, win), BLOCK_N):
            kj = kf[:, j0 : j0 + BLOCK_N].to(f)
            vj = vf[:, j0 : j0 + BLOCK_N].to(f)
            s = qi @ kj.transpose(-1, -2) * sc
            if cap is not None:
                s = cap * torch.tanh(s / cap)
            if causal or win is not None:
                allowed = _mask(i0, j0, m_rows, kj.shape[1], s_q, s_k, q.device, causal, win)
                s = s.masked_fill(~allowed, float("-inf"))
            m_new = torch.maximum(m, s.amax(-1))
            m_safe = torch.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key yet
            p = torch.exp(s - m_safe[..., None])
            alpha = torch.exp(m - m_safe)
            l = alpha * l + p.sum(-1)
            # P is rounded to the storage dtype before PV, as the kernels feed the MMA.
            acc = alpha[..., None] * acc + p.to(q.dtype).to(f) @ vj
            m = m_new
        empty = l == 0
        o[:, i0 : i0 + BLOCK_M] = (acc / torch.where(empty, 1.0, l)[..., None]).to(q.dtype)
        lse[:, i0 : i0 + BLOCK_M] = torch.where(empty, float("-inf"), m + torch.log(l)).float()
    return o_out, lse.reshape(lead + (s_q,))


def _row_stats(qf, kf, sc, cap, causal, win, s_q, s_k, f):
    """(m, l), (BH, S_q) in dtype f: each row's max score and sum of exp(S - m), from the
    same tiles and arithmetic as the forward (l = 0 on rows with no allowed key)."""
    bh = qf.shape[0]
    m = torch.full((bh, s_q), float("-inf"), dtype=f, device=qf.device)
    l = torch.zeros(bh, s_q, dtype=f, device=qf.device)
    for i0 in range(0, s_q, BLOCK_M):
        qi = qf[:, i0 : i0 + BLOCK_M]
        mi, li = m[:, i0 : i0 + BLOCK_M], l[:, i0 : i0 + BLOCK_M]
        for j0 in range(*_key_range(i0, s_q, s_k, causal, win), BLOCK_N):
            kj = kf[:, j0 : j0 + BLOCK_N]
            s = qi @ kj.transpose(-1, -2) * sc
            if cap is not None:
                s = cap * torch.tanh(s / cap)
            if causal or win is not None:
                allowed = _mask(i0, j0, qi.shape[1], kj.shape[1], s_q, s_k, qf.device, causal, win)
                s = s.masked_fill(~allowed, float("-inf"))
            m_new = torch.maximum(mi, s.amax(-1))
            m_safe = torch.where(m_new == float("-inf"), 0.0, m_new)
            li.copy_(torch.exp(mi - m_safe) * li + torch.exp(s - m_safe[..., None]).sum(-1))
            mi.copy_(m_new)
    return m, l


def backward(do, q, k, v, o, lse, causal: bool = False, scale=None, window=None, softcap=None):
    """(dq, dk, dv) by recomputation. ``lse`` (what the autograd node saves) is not read:
    the row statistics are recomputed in the math dtype (module docstring)."""
    sc = resolve_scale(q, scale)
    win, cap = window_bounds(window, causal), softcap if has_softcap(softcap) else None
    f = _math_dtype(q.dtype)
    s_q, s_k = q.shape[-2], k.shape[-2]
    qf, kf, vf = _fold(q).to(f), _fold(k).to(f), _fold(v).to(f)
    dof, of = _fold(do).to(f), _fold(o).to(f)
    m, l = _row_stats(qf, kf, sc, cap, causal, win, s_q, s_k, f)
    m = torch.where(m == float("-inf"), 0.0, m)  # empty rows: every S is -inf, P = 0
    l = torch.where(l == 0, 1.0, l)
    delta = (dof * of).sum(-1)  # (BH, S_q)
    dq, dk, dv = torch.zeros_like(qf), torch.zeros_like(kf), torch.zeros_like(vf)
    for j0 in range(0, s_k, BLOCK_N):
        kj, vj = kf[:, j0 : j0 + BLOCK_N], vf[:, j0 : j0 + BLOCK_N]
        # Causal: the first query row that sees key j0 is j0 - (S_k - S_q); a window's left
        # bound also ends the rows that see the block.
        for i0 in range(*_query_range(j0, s_q, s_k, causal, win), BLOCK_M):
            qi, doi = qf[:, i0 : i0 + BLOCK_M], dof[:, i0 : i0 + BLOCK_M]
            s = qi @ kj.transpose(-1, -2) * sc
            if cap is not None:
                t = torch.tanh(s / cap)
                s = cap * t
            if causal or win is not None:
                allowed = _mask(i0, j0, qi.shape[1], kj.shape[1], s_q, s_k, q.device, causal, win)
                s = s.masked_fill(~allowed, float("-inf"))
            p = torch.exp(s - m[:, i0 : i0 + BLOCK_M, None]) / l[:, i0 : i0 + BLOCK_M, None]
            dv[:, j0 : j0 + BLOCK_N] += p.to(q.dtype).to(f).transpose(-1, -2) @ doi
            dp = doi @ vj.transpose(-1, -2)
            ds = p * (dp - delta[:, i0 : i0 + BLOCK_M, None])
            if cap is not None:
                ds = ds * (1 - t * t)  # d(c tanh(s / c)) / ds
            ds = ds * sc
            dk[:, j0 : j0 + BLOCK_N] += ds.transpose(-1, -2) @ qi
            dq[:, i0 : i0 + BLOCK_M] += ds @ kj
    return (
        dq.to(q.dtype).reshape(q.shape),
        dk.to(k.dtype).reshape(k.shape),
        dv.to(v.dtype).reshape(v.shape),
    )


class _Tiled(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, scale, window, softcap):
        o, lse = forward(q, k, v, causal, scale, window, softcap)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.options = (causal, scale, window, softcap)
        return o

    @staticmethod
    def backward(ctx, do):
        if torch.is_grad_enabled():  # create_graph=True: the saved LSE is a constant here
            raise RuntimeError(
                "attention (tiled): double backward (create_graph=True) is not supported by this "
                "backend; use backend='torch' or 'manual'"
            )
        try:
            q, k, v, o, lse = ctx.saved_tensors
        except RuntimeError as e:  # modified in place since the forward
            if "modified by an inplace operation" not in str(e):
                raise
            raise RuntimeError(
                "attention (tiled): q, k, v or the output o was modified in place after the forward, "
                "and the backward needs their values from the forward; modify a copy instead "
                f"(o = o.clone() before an in-place op on the output) (PyTorch: {e})"
            ) from None
        dq, dk, dv = backward(do, q, k, v, o, lse, *ctx.options)
        return dq, dk, dv, None, None, None, None


def tiled_attention(q, k, v, causal: bool = False, scale=None, window=None, softcap=None):
    """FlashAttention-2 in PyTorch ops: tiles, online softmax, LSE; backward by recomputation."""
    k, v = expand_kv(q, k, v)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _Tiled.apply(q, k, v, causal, scale, window, softcap)
    return forward(q, k, v, causal, scale, window, softcap)[0]


register(
    "attention",
    "tiled",
    builtin=True,
    description="FlashAttention-2 in PyTorch ops (tiles, online softmax, LSE): the readable spec",
)(tiled_attention)
