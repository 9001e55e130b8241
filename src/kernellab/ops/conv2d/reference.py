"""manual, torch, compile and fft backends of conv2d (PyTorch primitives)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernellab.core.registry import register
from kernellab.core.spec import wide_dtype
from kernellab.ops._baselines import compiled, register_baseline
from kernellab.ops.conv2d.geometry import as_pair, out_size


def manual_conv2d(x, w, bias=None, stride=1, padding=0):
    """unfold (im2col) + one matmul: the unfolded copy is C R S times x (9x for 3x3),
    written and read back through memory. Math in fp32 for 16-bit storage, in fp64 for
    fp32 (an fp32 GEMM's dw, a reduction over N P Q, can exceed twice cuDNN's error; an
    H100 runs fp64 GEMMs about as fast as fp32 ones without TF32)."""
    st, pd = as_pair(stride, "stride", 1), as_pair(padding, "padding", 0)
    n, _, h, wd = x.shape
    k, _, r, s = w.shape
    p, q = out_size(h, wd, r, s, st, pd)
    mdt = wide_dtype(x.dtype)
    cols = F.unfold(x.to(mdt), (r, s), padding=pd, stride=st)  # [N, C R S, P Q]
    y = w.to(mdt).reshape(k, -1) @ cols  # [N, K, P Q]
    if bias is not None:
        y = y + bias.to(mdt)[:, None]
    return y.reshape(n, k, p, q).to(x.dtype)


def torch_conv2d(x, w, bias=None, stride=1, padding=0):
    """torch.nn.functional.conv2d (cuDNN on a GPU)."""
    return F.conv2d(x, w, bias, stride=stride, padding=padding)


register_baseline("conv2d", manual_conv2d, torch_conv2d, compiled(manual_conv2d))


# --------------------------------------------------------------------------- fft
#
# The convolution theorem: a circular cross-correlation is a pointwise product in the
# frequency domain, y = irfft2(rfft2(x) * conj(rfft2(w))). On the zero-padded input
# (Hp = H + 2 ph, Wp = W + 2 pw) with the filter zero-padded to Hp x Wp, the outputs at
# p <= Hp - R never wrap (p + r <= Hp - 1), so no extra padding is needed; stride keeps
# every sh-th row of the stride-1 result (it computes sh * sw times the outputs it keeps).
# Cost: O(N C Hp Wp log(Hp Wp)) for the transforms plus N K C Hp (Wp/2 + 1) complex
# multiply-adds for the channel sum, against N K P Q C R S for the direct method: the FFT
# does not depend on the kernel size, so it wins for large kernels and loses for 3x3.
#
# Precision: the transforms spread every input over every frequency, so an output's error
# scales with its whole image, not with its own window. In fp32 (complex64) that is at
# or past the edge of the check's bound, so fp32
# storage transforms in fp64 (complex128) and 16-bit storage in fp32. One non-finite input makes every output of its image NaN (it enters
# every frequency): non-finite inputs are refused (a device sync per call: a teaching
# backend).


def _fft_limits(x, w, bias=None, stride=1, padding=0):
    if not (bool(torch.isfinite(x).all()) and bool(torch.isfinite(w).all())):
        return "fft: non-finite inputs (an inf or NaN enters every frequency of its image)"
    return None


def fft_conv2d(x, w, bias=None, stride=1, padding=0):
    """Convolution theorem through torch.fft (rfft2, a channel contraction, irfft2);
    backward by autograd through the transforms."""
    why = _fft_limits(x, w)
    if why:
        raise ValueError(f"conv2d ({why}); use another backend")
    (sh, sw), (ph, pw) = as_pair(stride, "stride", 1), as_pair(padding, "padding", 0)
    k, _, r, s = w.shape
    if x.numel() == 0:  # (MKL's FFT refuses empty batches) an empty output, still in the graph
        p, q = out_size(x.shape[2], x.shape[3], r, s, (sh, sw), (ph, pw))
        link = x.sum() + w.sum() + (bias.sum() if bias is not None else 0)
        return x.new_zeros((x.shape[0], k, p, q)) + 0 * link
    cdt = torch.float64 if x.dtype == torch.float32 else torch.float32
    xp = F.pad(x.to(cdt), (pw, pw, ph, ph))
    hp, wp = xp.shape[-2:]
    xf = torch.fft.rfft2(xp)  # [N, C, Hp, Wp/2 + 1]
    wf = torch.fft.rfft2(w.to(cdt), s=(hp, wp))  # [K, C, Hp, Wp/2 + 1]
    yf = torch.einsum("nchw,kchw->nkhw", xf, wf.conj())
    y = torch.fft.irfft2(yf, s=(hp, wp))[..., : hp - r + 1 : sh, : wp - s + 1 : sw]
    if bias is not None:
        y = y + bias.to(cdt)[:, None, None]
    return y.to(x.dtype).contiguous()


register(
    "conv2d",
    "fft",
    builtin=True,
    description="FFT convolution (torch.fft), for teaching: wins for large kernels",
    limits=_fft_limits,
)(fft_conv2d)
