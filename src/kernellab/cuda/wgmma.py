"""The text of wgmma wrappers (Hopper warpgroup MMA, inline PTX) for any N a kernel needs.

One ``wgmma.mma_async`` names every accumulator register of the warpgroup's 64 x N tile as
an asm operand (N / 2 of them per thread), so each N is its own asm statement; writing them
by hand for N = 64, 80, 96, 128, 256 is hundreds of lines of ``%0, %1, ...``. This module
writes them; a kernel's header of wrappers is generated once and committed
(``python -m kernellab.cuda.wgmma`` regenerates every header listed in ``HEADERS``; a CPU
test asserts the committed text equals the generator's).

Two forms, fp32 accumulators, A and B fp16 or bf16 (the ``BF16`` template argument):

- ``kl_wgmma_ss<N, BF16>(d, desc_a, desc_b, scale_d)``: D[64 x N] = A[64 x 16] B[16 x N]
  (+ D when ``scale_d`` is nonzero), A and B in shared memory, both K-major (imm-trans-a =
  imm-trans-b = 0): A row-major [64, 16], B stored as [N, 16] rows (B^T row-major: the K
  tile of attention's S = Q K^T).
- ``kl_wgmma_rs<N, BF16>(d, a0, a1, a2, a3, desc_b, scale_d)``: D[64 x N] = A[64 x 16] B[16 x N]
  (+ D when ``scale_d`` is nonzero)
  with A in registers (four b32 of two 16-bit values each, the mma.sync m16n8k16 A
  fragment of the thread's warp's 16 rows) and B in shared memory MN-major (imm-trans-b =
  1: stored [16, N] row-major, attention's V tile).
- ``kl_wgmma_tt<N, BF16>(d, desc_a, desc_b, scale_d)``: D[64 x N] = A[64 x 16] B[16 x N]
  (+ D when ``scale_d`` is nonzero), A and B in shared memory, both MN-major (imm-trans-a =
  imm-trans-b = 1): A stored [16, 64] row-major (A^T: the attention backward's dS^T tile,
  keys x queries), B stored [16, N] row-major (its K tile, keys x D: dQ = dS K).
- ``kl_wgmma_st<N, BF16>(d, desc_a, desc_b, scale_d)``: D[64 x N] = A[64 x 16] B[16 x N]
  (+ D when ``scale_d`` is nonzero), A and B in shared memory, A K-major (imm-trans-a = 0:
  stored [64, 16] row-major, the backward's P^T / dS^T tile read as keys x queries), B
  MN-major (imm-trans-b = 1: stored [16, N] row-major, its dO / Q tile: dV += P^T dO).

Accumulator layout (PTX ISA, "WGMMA .m64nNk16 register fragment layout for matrix D"):
warp w of the warpgroup holds rows 16w..16w+15; lane l (g = l / 4, q = l % 4) holds for
each n8 block j: d[4j] = (g, 8j+2q), d[4j+1] = (g, 8j+2q+1), d[4j+2] = (g+8, 8j+2q),
d[4j+3] = (g+8, 8j+2q+1).
"""

from __future__ import annotations

from pathlib import Path

_TYPES = (("true", "bf16"), ("false", "f16"))


def _regs(n: int, first: int = 0) -> str:
    return "{" + ", ".join(f"%{first + i}" for i in range(n)) + "}"


def _outs(n: int) -> str:
    rows = [", ".join(f'"+f"(d[{i}])' for i in range(j, min(n, j + 8))) for j in range(0, n, 8)]
    return (",\n          ").join(rows)


def _ss(n: int, flag: str, ty: str, form: str = "ss", trans: int = 0, trans_b: int | None = None) -> str:
    """``kl_wgmma_<form>``: both operands from shared memory, A transposed (MN-major) as
    ``trans`` says and B as ``trans_b`` says (the same as A's when None; ss: 0, K-major;
    tt: 1; st: A 0, B 1)."""
    r = n // 2
    tb = trans if trans_b is None else trans_b
    return f"""template <>
__device__ __forceinline__ void kl_wgmma_{form}<{n}, {flag}>(float (&d)[{r}], unsigned long long da,
                                                    unsigned long long db, int scale_d) {{
    asm volatile(
        "{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{r + 2}, 0;\\n"
        "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ty}.{ty} "
        "{_regs(r)}, %{r}, %{r + 1}, p, 1, 1, {trans}, {tb};\\n}}\\n"
        : {_outs(r)}
        : "l"(da), "l"(db), "r"(scale_d));
}}
"""


def _rs(n: int, flag: str, ty: str) -> str:
    r = n // 2
    return f"""template <>
__device__ __forceinline__ void kl_wgmma_rs<{n}, {flag}>(float (&d)[{r}], unsigned a0, unsigned a1,
                                                    unsigned a2, unsigned a3, unsigned long long db,
                                                    int scale_d) {{
    asm volatile(
        "{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{r + 5}, 0;\\n"
        "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ty}.{ty} "
        "{_regs(r)}, {_regs(4, r)}, %{r + 4}, p, 1, 1, 1;\\n}}\\n"
        : {_outs(r)}
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db), "r"(scale_d));
}}
"""


def header(
    ss: tuple[int, ...], rs: tuple[int, ...], guard: str, tt: tuple[int, ...] = (), st: tuple[int, ...] = ()
) -> str:
    """A header defining ``kl_wgmma_ss`` for every N in ``ss``, ``kl_wgmma_rs`` for every
    N in ``rs``, ``kl_wgmma_tt`` for every N in ``tt`` and ``kl_wgmma_st`` for every N in
    ``st`` (multiples of 8 from 8 to 256), fp16 and bf16; a form with no N is not declared
    (two headers may then be included together; a form both declare is declared twice,
    which C++ allows for a function template)."""
    for n in ss + rs + tt + st:
        if n % 8 or not 8 <= n <= 256:
            raise ValueError(f"wgmma N must be a multiple of 8 from 8 to 256, got {n}")
    forms = [
        f"kl_wgmma_{f}: N = {', '.join(map(str, ns))}"
        for f, ns in (("ss", ss), ("rs", rs), ("tt", tt), ("st", st))
        if ns
    ]
    parts = [
        "// Generated by kernellab.cuda.wgmma (python -m kernellab.cuda.wgmma): do not edit.\n"
        f"// {'; '.join(forms)}.\n"
        "// The operand contract is in kernellab/cuda/wgmma.py.\n",
        f"#ifndef {guard}\n#define {guard}\n",
    ]
    smem_decl = (
        "template <int N, bool BF16>\n"
        "__device__ __forceinline__ void kl_wgmma_{}(float (&d)[N / 2], unsigned long long da, "
        "unsigned long long db, int scale_d);\n"
    )
    if ss:
        parts.append(smem_decl.format("ss"))
    if rs:
        parts.append(
            "template <int N, bool BF16>\n"
            "__device__ __forceinline__ void kl_wgmma_rs(float (&d)[N / 2], unsigned a0, unsigned a1, "
            "unsigned a2, unsigned a3,\n"
            "                                            unsigned long long db, int scale_d);\n"
        )
    if tt:
        parts.append(smem_decl.format("tt"))
    if st:
        parts.append(smem_decl.format("st"))
    for n in ss:
        for flag, ty in _TYPES:
            parts.append(_ss(n, flag, ty))
    for n in rs:
        for flag, ty in _TYPES:
            parts.append(_rs(n, flag, ty))
    for n in tt:
        for flag, ty in _TYPES:
            parts.append(_ss(n, flag, ty, "tt", 1))
    for n in st:
        for flag, ty in _TYPES:
            parts.append(_ss(n, flag, ty, "st", 0, 1))
    parts.append(f"#endif  // {guard}\n")
    return "\n".join(parts)


# The committed headers: path (under src/kernellab) -> (ss Ns, rs Ns, include guard[, tt Ns]).
HEADERS = {
    "ops/attention/attention_sm90_wgmma.cuh": (
        (64, 80, 128, 176, 192),  # S = Q K^T: v2-v6's 64 / 128 keys, v7's tilings (cuda_sm90.V7_TILES)
        (64, 80, 96, 128, 256),
        "KL_ATTENTION_SM90_WGMMA_CUH",
    ),
    # the backward's dQ = dS K (attention_sm90_bwd.cu); it includes the header above too.
    "ops/attention/attention_sm90_bwd_wgmma.cuh": (
        (),
        (),
        "KL_ATTENTION_SM90_BWD_WGMMA_CUH",
        (64, 80, 96, 128),
    ),
}


def write_headers(root: Path | None = None) -> list[Path]:
    root = root or Path(__file__).resolve().parents[1]
    out = []
    for rel, spec in HEADERS.items():
        p = root / rel
        p.write_text(header(*spec))
        out.append(p)
    return out


if __name__ == "__main__":
    for p in write_headers():
        print(p)
