"""Matmul in Triton: autotuned kernel, launcher, custom op, registration.

One program computes a BLOCK_M x BLOCK_N tile of C, walking K in BLOCK_K steps with
``tl.dot`` (tensor cores: wgmma on Hopper, mma.sync on Ampere) and an fp32 accumulator;
bias and activation are applied to the accumulator before the single store (the fused
epilogue saves a read and a write of C: 2 x 4096^2 x 2 bytes = 64 MB at 4096^2 bf16).

Program order (GROUP_M): programs are numbered down columns of GROUP_M tile-rows, so the
programs resident at one time share GROUP_M rows of A and a few columns of B in L2 instead
of sweeping a whole row of C (which touches all of B). Triton tutorial 03 measures ~10%.

Any M, N, K: rows and columns past the edge are wrapped (``% M``) for the loads, so the inner
loop masks only K; the store is masked. Any strides (transposed, sliced, expanded operands
go straight in; no copy); batch over program_id(1).

fp32: the dots follow ``torch.backends.cuda.matmul.allow_tf32``: on, TF32 tensor cores with
the operands rounded to nearest first ("tf32rn", as cuBLAS rounds them); off, exact fp32 FMA
products ("ieee", as cuBLAS with TF32 off), each K block summed apart and then added
(``_triton_dots.two_level``). fp16/bf16 always use tensor cores with fp32 accumulation.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from kernellab import device as _device
from kernellab import triton_support
from kernellab.core.spec import GRID_YZ_LIMIT
from kernellab.ops._register import register_builtin
from kernellab.ops._triton_dots import dot_precision, mma
from kernellab.ops.matmul._autograd import matmul_op

_ACT = {None: 0, "relu": 1, "gelu": 2}


@triton_support.jit
def grouped_tile(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    # Program pid's tile (pid_m, pid_n), numbered down columns of GROUP_M tile-rows (see
    # the module docstring).
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = min(num_m - first_m, GROUP_M)
    pid_m = first_m + ((pid % per_group) % group_rows)
    pid_n = (pid % per_group) // group_rows
    return pid_m, pid_n


@triton_support.jit
def epilogue(acc, bias_ptr, rn, N, HAS_BIAS: tl.constexpr, ACT: tl.constexpr):
    # bias [N] at columns rn, then the activation (0 none, 1 relu, 2 gelu tanh), on the
    # fp32 accumulator before its one store.
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    if ACT == 1:
        acc = tl.maximum(acc, 0.0)
    elif ACT == 2:
        # tanh(u) = 1 - 2 / (1 + exp(2u)): exact limits +-1 when exp over/underflows.
        u = 0.7978845608028654 * (acc + 0.044715 * acc * acc * acc)
        acc = 0.5 * acc * (2.0 - 2.0 / (1.0 + tl.exp(2.0 * u)))
    return acc


@triton_support.jit
def _matmul_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    bias_ptr,  # a [Bt, M, K], b [Bt, K, N], c [Bt, M, N] (any strides), bias [N]
    M,
    N,
    K,
    s_ab,
    s_am,
    s_ak,  # strides of a, in elements
    s_bb,
    s_bk,
    s_bn,
    s_cb,
    s_cm,
    s_cn,
    M_KEY,  # autotuner key only (size buckets, see _tune_keys); unused by the kernel
    N_KEY,
    K_KEY,
    HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr,  # 0 none, 1 relu, 2 gelu (tanh)
    PRECISION: tl.constexpr,  # "ieee", "tf32" or "tf32rn" (ops/_triton_dots.py)
    UPCAST: tl.constexpr,  # dot in fp32 (the CPU interpreter has no bf16 dot)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    bz = tl.program_id(1).to(tl.int64)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    am = rm % M  # wrapped rows / columns: always in bounds, never stored
    bn = rn % N
    a_ptrs = a_ptr + bz * s_ab + am[:, None] * s_am + rk[None, :] * s_ak
    b_ptrs = b_ptr + bz * s_bb + rk[:, None] * s_bk + bn[None, :] * s_bn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=rk[None, :] < k_left, other=0.0)
        b = tl.load(b_ptrs, mask=rk[:, None] < k_left, other=0.0)
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = mma(a, b, acc, PRECISION)
        a_ptrs += BLOCK_K * s_ak
        b_ptrs += BLOCK_K * s_bk

    acc = epilogue(acc, bias_ptr, rn, N, HAS_BIAS, ACT)
    c_ptrs = c_ptr + bz * s_cb + rm[:, None] * s_cm + rn[None, :] * s_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


# --------------------------------------------------------------------------- configs


def matmul_configs() -> list:
    """Candidate tiles, largest first. Hopper wants big tiles (128x256 with 8 warps keeps
    two warpgroups of wgmma busy; 3-4 stages of cp.async/TMA hide the HBM latency);
    the smaller ones serve small or skinny problems and fp32 (4-byte elements double
    the shared memory per stage)."""
    rows = [
        # BM, BN, BK, GROUP_M, stages, warps
        (128, 256, 64, 8, 3, 8),
        (256, 128, 64, 8, 3, 8),
        (128, 256, 64, 8, 4, 8),
        (128, 128, 64, 8, 4, 8),
        (128, 128, 64, 8, 3, 4),
        (128, 128, 32, 8, 4, 4),
        (128, 64, 32, 8, 4, 4),
        (64, 128, 32, 8, 4, 4),
        (64, 64, 32, 8, 4, 4),
        (128, 128, 32, 8, 3, 8),
        (64, 64, 64, 8, 3, 4),
        (32, 64, 32, 8, 5, 2),
        (64, 32, 32, 8, 5, 2),
        (32, 32, 32, 8, 4, 2),
    ]
    return as_configs(rows)


def as_configs(rows) -> list:
    """triton.Config of each (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, stages, warps) row."""
    return [
        triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": g}, num_stages=s, num_warps=w)
        for bm, bn, bk, g, s, w in rows
    ]


@functools.cache
def _max_shared(device_index: int) -> int:
    props = torch.cuda.get_device_properties(device_index)
    return int(getattr(props, "shared_memory_per_block_optin", 0) or 166912)  # A100's, if unknown


def _fits(cfg, m: int, n: int, k: int, elem: int, max_shared: int) -> bool:
    kw = cfg.kwargs
    bm, bn, bk = kw["BLOCK_M"], kw["BLOCK_N"], kw["BLOCK_K"]
    # Shared memory of the software pipeline: one A and one B tile per stage.
    if (bm * bk + bk * bn) * elem * cfg.num_stages > max_shared:
        return False

    # A tile much larger than the problem wastes the whole tile's MMAs on padding.
    def cap(d):
        return max(32, triton_support.next_pow2(max(d, 1)))

    return bm <= cap(m) and bn <= cap(n) and bk <= cap(k)


def prune_configs(configs, named_args, **kwargs):
    """Drop configs whose pipeline does not fit the device's shared memory, whose tiles
    are larger than the problem, and (fp32 without TF32) the tensor-core-sized tiles; keep
    at least the smallest."""
    a = named_args["a_ptr"]
    m, n, k = named_args["M"], named_args["N"], named_args["K"]
    limit = _max_shared(a.device.index or 0) if a.is_cuda else 232448  # H100's opt-in limit
    kept = [c for c in configs if _fits(c, m, n, k, a.element_size(), limit)]
    if kwargs.get("PRECISION") == "ieee" and a.element_size() == 4:
        # fp32 without TF32 runs on FMA units, not tensor cores: a thread holds its share of
        # the accumulator in registers, and past 128x128 (64 fp32 per thread at 8 warps,
        # 128 at 4) it spills; the big tensor-core tiles only cost tuning time here.
        kept = [
            c
            for c in kept
            if c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"] <= 128 * 128 and c.kwargs["BLOCK_K"] <= 32
        ]
    if not kept:
        kept = [min(configs, key=lambda c: c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"] * c.num_stages)]
    return kept


# Autotune key: size buckets of M, N, K (see _tune_keys) and the precision; Triton adds the
# argument dtypes to the key itself. So one tuning run (a dozen configs, each compiled and
# timed: ~5-10 s) serves every big problem of one bucket and dtype, not every exact shape.
_matmul_tuned = triton.autotune(
    configs=matmul_configs(),
    key=["M_KEY", "N_KEY", "K_KEY", "PRECISION"],
    prune_configs_by={"early_config_prune": prune_configs},
)(_matmul_kernel)

# Problems with fewer multiply-adds than this (bt*M*N*K: 1024^3, ~2 GFLOP, ~0.1 ms on an H100
# in bf16) take one fixed config and are never tuned: tuning such a problem costs seconds to
# save microseconds, and correctness checks run dozens of small odd shapes (tuning each would
# make `check` take over a minute per dtype). At and above it a kernel runs for
# ~0.1 ms or more, is called many times (training, benchmarks), and the tile choice is worth
# 10-30%.
TUNE_MIN_WORK = 1 << 30


def _tune_keys(m: int, n: int, k: int) -> tuple[int, int, int]:
    """Bucket a dimension to its power of two at or above it: 3000 and 4000 share a tuning."""
    return triton_support.next_pow2(m), triton_support.next_pow2(n), triton_support.next_pow2(k)


def fixed_config(elem: int, precision: str, max_shared: int) -> dict:
    """The untuned config for small problems: tensor-core-sized 128x128 tiles for fp16/bf16
    and TF32, 64x64x32 for fp32 on FMA units (a 128x128 fp32 accumulator would mean 128
    registers per thread at 4 warps); a 64x64x32 2-stage fallback if shared memory is short."""
    if elem == 4 and precision == "ieee":
        cfg = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, "num_stages": 3, "num_warps": 4}
    elif elem == 4:
        cfg = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32, "GROUP_M": 8, "num_stages": 3, "num_warps": 4}
    else:
        cfg = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_stages": 3, "num_warps": 8}
    smem = (cfg["BLOCK_M"] + cfg["BLOCK_N"]) * cfg["BLOCK_K"] * elem * cfg["num_stages"]
    if smem > max_shared:
        cfg = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, "num_stages": 2, "num_warps": 4}
    return cfg


# The CPU interpreter runs programs one by one: one small config, no tuning.
_CPU_CONFIG = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 4}


# --------------------------------------------------------------------------- launcher


def _precision(dtype: torch.dtype, where=None) -> str:
    """PRECISION for operands of ``dtype`` launched on ``where`` (device.triton_interpreted)."""
    return dot_precision(dtype, torch.backends.cuda.matmul.allow_tf32, _device.triton_interpreted(where))


def check_batch_grid(bt: int) -> None:
    """The batch is the grid's y dimension: past 65,535 products the launch fails with
    "Triton Error [CUDA]: invalid argument". Refused clearly, as
    the CUDA backends refuse it (the interpreter on a CPU has no grid limit)."""
    if bt > GRID_YZ_LIMIT:
        raise ValueError(
            f"matmul: a batch of {bt} products exceeds the CUDA grid's y limit ({GRID_YZ_LIMIT}) "
            "of the triton backend; fold the batch into M or use backend='torch'"
        )


def triton_matmul_fwd(a: torch.Tensor, b: torch.Tensor, bias=None, activation=None) -> torch.Tensor:
    """act(a @ b + bias) for [..., M, K] @ [..., K, N] (any strides); a fresh contiguous output."""
    batch = tuple(a.shape[:-2])
    m, k = a.shape[-2], a.shape[-1]
    n = b.shape[-1]
    a3 = a.reshape(math.prod(batch), m, k)  # a view whenever the strides allow it
    b3 = b.reshape(math.prod(batch), k, n)
    bt = a3.shape[0]
    c = torch.empty((bt, m, n), dtype=a.dtype, device=a.device)
    if bt and m and n:
        args = (
            a3,
            b3,
            c,
            bias if bias is not None else c,
            m,
            n,
            k,
            a3.stride(0),
            a3.stride(1),
            a3.stride(2),
            b3.stride(0),
            b3.stride(1),
            b3.stride(2),
            c.stride(0),
            c.stride(1),
            c.stride(2),
            *_tune_keys(m, n, k),
        )
        consts = dict(HAS_BIAS=bias is not None, ACT=_ACT[activation])
        if a.device.type == "cuda":
            check_batch_grid(bt)
            consts.update(PRECISION=_precision(a.dtype, "cuda"), UPCAST=False)

            def grid(meta):
                return (triton_support.cdiv(m, meta["BLOCK_M"]) * triton_support.cdiv(n, meta["BLOCK_N"]), bt)

            dev = a.device.index
            if dev != torch.cuda.current_device():  # launch in the tensors' device context
                with torch.cuda.device(dev):
                    return triton_matmul_fwd(a, b, bias, activation)
            if bt * m * n * k >= TUNE_MIN_WORK:
                triton_support.launch_tuned(_matmul_tuned, grid, *args, **consts)
            else:
                cfg = fixed_config(a.element_size(), consts["PRECISION"], _max_shared(dev))
                _matmul_kernel[grid](*args, **consts, **cfg)
        else:
            consts.update(PRECISION="ieee", UPCAST=a.dtype == torch.bfloat16)
            cfg = _CPU_CONFIG
            grid = (triton_support.cdiv(m, cfg["BLOCK_M"]) * triton_support.cdiv(n, cfg["BLOCK_N"]), bt)
            _matmul_kernel[grid](*args, **consts, **cfg, num_warps=4)
    return c.reshape(batch + (m, n))


matmul_triton = matmul_op("matmul_triton", triton_matmul_fwd, triton=True)


def _kernel_specs(dtype: str):
    """For `kernellab asm`: the kernel as the tuner usually picks it at 4096^3 on an H100
    (fp16/bf16: 128x256x64, 8 warps; fp32 with TF32 off: 128x128x32, 4 warps), contiguous
    operands (unit inner strides, which Triton specializes as the constant 1 at run time)."""
    half = dtype in ("fp16", "bf16")
    cx = {"HAS_BIAS": False, "ACT": 0, "PRECISION": "tf32" if half else "ieee", "UPCAST": False, "GROUP_M": 8}
    cx.update(
        {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64}
        if half
        else {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32}
    )
    cx.update({"s_ak": 1, "s_bn": 1, "s_cn": 1})
    sig = {"a_ptr": f"*{dtype}", "b_ptr": f"*{dtype}", "c_ptr": f"*{dtype}", "bias_ptr": f"*{dtype}"}
    for p in (
        "M",
        "N",
        "K",
        "M_KEY",
        "N_KEY",
        "K_KEY",
        "s_ab",
        "s_am",
        "s_ak",
        "s_bb",
        "s_bk",
        "s_bn",
        "s_cb",
        "s_cm",
        "s_cn",
    ):
        sig[p] = "constexpr" if p in cx else "i32"
    for p in ("HAS_BIAS", "ACT", "PRECISION", "UPCAST", "BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M"):
        sig[p] = "constexpr"
    return [(_matmul_kernel, sig, cx, 8 if half else 4)]


register_builtin(
    "matmul",
    "triton",
    matmul_triton,
    "Triton: autotuned tiles, grouped program order, fused bias/activation",
    triton_kernels=_kernel_specs,
    double_backward=True,  # _autograd.matmul_op: the backward's matmuls are the custom op
)
