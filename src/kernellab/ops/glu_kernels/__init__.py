"""What the gated linear units of a transformer MLP share: SwiGLU and GeGLU (ops/swiglu/,
ops/geglu/), forward and backward, one Triton kernel each way for both.

    swiglu(a, b) = silu(a) * b = a * sigmoid(a) * b
    geglu(a, b)  = gelu(a) * b       approximate="none": 0.5 a (1 + erf(a / sqrt 2))
                                     approximate="tanh": 0.5 a (1 + tanh(sqrt(2/pi) (a + 0.044715 a^3)))

``a`` is the gate projection, ``b`` the up projection: same shape (any rank, any strides),
same dtype (fp32 / fp16 / bf16), same device. Math in fp32, one rounding to the input dtype
(PyTorch's ``F.silu(a) * b`` rounds twice: the activation, then the product). Gradients for
both inputs.

NaN and inf follow the formulas, as PyTorch's ``F.silu`` / ``F.gelu`` do: act(-inf) is NaN
(-inf * 0), act(+inf) is +inf, so the output there is NaN, resp. +-inf times b; the
gradient of the activation at both +inf and -inf is NaN (inf * 0 in its derivative; the
limits 1 and 0 are not what any backend returns), so da is NaN there, and db = dy * act(a)
follows the forward. NaN in, NaN out. Large finite inputs keep the limits (act(-1e4) = -0,
act'(1e4) = 1). The ``torch`` backend is PyTorch's ops as they are: on a CPU with AVX-512,
PyTorch's vectorized fp32 erf GeLU gives NaN at +inf (its scalar path gives +inf).

``inplace_backward=True`` (opt-in, eager only) makes the Triton backend's backward write da
into a's buffer and db into b's instead of two new tensors, as Liger's SwiGLU does: each
element of dy, a and b is read before da and db are stored at the same index, by the same
thread. Inside an MLP this saves two [N, I] tensors at the step's peak (the start of the
backward, when every activation is alive), but a and b are destroyed by the backward: use
it only for intermediates nothing else reads, e.g. the gate and up projections made inside
a module's forward (``kernellab.patch`` does). Only a contiguous a or b is written; a
strided one (a half of a fused gate_up projection) is packed by the launcher into a
private copy, which takes the gradient, and the caller's tensor is left intact; a and b
that share bytes (``swiglu(x, x)``) get fresh gradients. Each tensor written gets a new
version (a Triton store does not count as one), so any other autograd node that saved it
raises PyTorch's in-place modification error rather than read a gradient as data, and a
second backward through the same graph (``retain_graph=True``) is refused with a
RuntimeError naming the op. Under torch.compile the flag is ignored (the custom op declares
no mutation). The other backends accept the flag and ignore it (it never changes a result).

    spec_parts.py       validation, byte and flop counts, bad inputs, the spec fields both share
    triton_kernels.py   Triton kernels, launcher, the in-place backward, what `kernellab asm` compiles

Importing this package registers nothing: each op's folder registers its own backends.
"""
