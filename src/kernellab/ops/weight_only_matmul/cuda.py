"""Weight-only matmuls in CUDA C++ (wo_matmul.cu, compiled by NVRTC): launchers and
registrations.

int8: ``cuda_v1`` .. ``cuda_v4`` are the lecture's steps (the list at the top of
wo_matmul.cu), ``cuda`` is v4 (tensor cores, any M). int4: ``cuda_v1`` (v1 with nibbles)
and ``cuda`` (v3). The 16-byte paths need whole 16-byte weight groups per row (K % 16 == 0
for int8, K % 32 == 0 for int4) and 16-byte aligned x and w; other calls run v1's kernel
(correct, slower), and so do fp32 x. x, w_q and non-fp32 scales are packed contiguous first.

v4's launch (``V4Config``) comes from ``V4_PLANS``, a small table by x-row group (MT 8 or
16) and weight shape class, written from lab/gpu_quant_sweep.py's winners.

v5 (sm_90: the weight streamed into a shared-memory ring by bulk copies) is built only with
``V5_OPTION`` and launched only with an explicit ``V5Config`` and ``module=`` (the sweep's
candidates): no backend, no plan.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from kernellab.cuda.runtime import DTYPE_SUFFIX, Module
from kernellab.ops._register import register_cuda
from kernellab.ops.weight_only_matmul._autograd import wo_op

MODULE = Module(Path(__file__).with_name("wo_matmul.cu"))
# `kernellab asm ... --backend cuda`: int8's cuda is v4, int4's is v3 (wo4_v3_*)
MODULE.asm_aliases = {"cuda": ("cuda_v4", "cuda_v3")}

WARPS = 8  # wo_matmul.cu's WARPS: 256-thread blocks
ROWS_V3 = 2  # weight rows per warp in v3
# v3's x chunk (values of K per shared-memory stage): MT x KC x element size <= 32 KB
# (8 x 2048 x 2 B for 16-bit x), under the 48 KB default.
KC_BYTES = 4096
GRID_Y = 65535

_SIG_V1 = ("ptr", "ptr", "ptr", "ptr", "ptr", "i32", "i32", "i32", "i32")
_SIG_V3 = ("ptr", "ptr", "ptr", "ptr", "ptr", "i32", "i32", "i32", "i32", "i32")
_KERNELS: dict = {}


def _kernel(name: str, dtype, dev: int, sig):
    key = (name, dtype, dev)
    k = _KERNELS.get(key)
    if k is None:
        k = _KERNELS[key] = MODULE.kernel(f"{name}_{DTYPE_SUFFIX[dtype]}", sig, dev)
    return k


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


_SMS: dict = {}


def _sm_count(dev: int) -> int:
    n = _SMS.get(dev)
    if n is None:
        n = _SMS[dev] = torch.cuda.get_device_properties(dev).multi_processor_count
    return n


def _mt(m: int) -> int:
    """v3's rows of x per block: the smallest of 1, 4, 8 that holds M (8 above)."""
    return 1 if m <= 1 else 4 if m <= 4 else 8


# --------------------------------------------------------------------------- v4 plans


@dataclass(frozen=True)
class V4Config:
    """One cuda_v4 launch (wo_matmul.cu, v4): ``mt`` x rows per group (8 or 16), ``rt`` row
    tiles of 16 weight rows per warp and ``u`` 16-byte chunks per row and step, ``wn`` x
    ``wk`` warps per block (along N, along K), ``split`` K slices across blocks (> 1: fp32
    partials and wo_v4_reduce), ``pipe`` the pipelined kernel (the next step's weight loads
    in flight during a step's mmas). The compiled (mt, rt, u, pipe): ``v4_kernels``."""

    mt: int
    rt: int = 1
    u: int = 4
    wn: int = 1
    wk: int = 8
    split: int = 1
    pipe: bool = False

    @property
    def step(self) -> int:  # K values per warp step
        return 64 * self.u

    @property
    def rows(self) -> int:  # weight rows per block
        return 16 * self.rt * self.wn

    @property
    def threads(self) -> int:
        return 32 * self.wn * self.wk

    @property
    def shared(self) -> int:  # bytes: the block's [wk, mt, rows] fp32 partial sums
        return 4 * self.wk * self.mt * self.rows

    @property
    def kernel(self) -> str:  # wo_matmul.cu's name, less the dtype suffix
        return f"wo_v4{'p' if self.pipe else ''}_m{self.mt}_r{self.rt}_u{self.u}"


# (mt, rt, u, pipe) of the kernels in every build (wo_matmul.cu, KL_WO_V4_ALL)
V4_KERNELS = tuple((mt, rt, u, False) for mt in (8, 16) for rt, u in ((1, 4), (2, 2), (4, 1)))
# Built only with V4_EXTRA_OPTION (KL_WO_V4_EXTRA: lab/gpu_quant_sweep.py's candidates): 16
# loads per lane and step, and the pipelined kernels, where they fit 128 registers
# without spilling.
V4_EXTRA_KERNELS = (
    (8, 2, 4, False),
    (8, 4, 2, False),
    (16, 2, 4, False),
    (8, 1, 4, True),
    (8, 2, 2, True),
    (8, 4, 1, True),
    (16, 1, 4, True),
)
V4_EXTRA_OPTION = "-DKL_WO_V4_EXTRA=1"
V4_MAX_THREADS = 512
V4_MAX_SHARED = 48 * 1024


@dataclass(frozen=True)
class V4Plan:
    """A launch for a class of shapes: the kernel (rt, u, pipe), ``wn`` x ``wk`` warps, and
    K slices chosen to bring the blocks to ``blocks_per_sm`` per SM (0: never split)."""

    rt: int
    u: int
    wn: int
    wk: int
    blocks_per_sm: int = 0
    pipe: bool = False

    def config(self, mt: int, n: int, k: int, n_sm: int) -> V4Config:
        row_blocks = -(-n // (16 * self.rt * self.wn))
        split = 1
        if self.blocks_per_sm and 2 * row_blocks <= self.blocks_per_sm * n_sm:
            # rounded down: the blocks stay within blocks_per_sm x n_sm (one wave when
            # that many fit, no half-empty second wave); each slice keeps a step for
            # every warp along K; at most 16 partials
            most = max(1, min(16, k // (64 * self.u * self.wk)))
            split = max(1, min(most, self.blocks_per_sm * n_sm // row_blocks))
        return V4Config(mt, self.rt, self.u, self.wn, self.wk, split, self.pipe)


def shape_class(n: int, n_sm: int) -> str:
    """The class of a weight with N rows: "tall" when its 16-row tiles alone give >= 4 per
    SM (N = 14336 on 132 SMs), else "short" (N = 4096: 256 tiles, too few blocks to keep
    enough loads in flight without more warps along K or K slices)."""
    return "tall" if n >= 64 * n_sm else "short"


# (mt, shape class) -> plan. Napkin math for the starting point: a step keeps 8 weight
# loads of 16 B per lane in flight (4 KB a warp); HBM at ~4 TB/s and ~1 us under load
# wants ~30 KB per SM, i.e. 8+ warps per SM streaming, better 16. M <= 8: one 16-row tile
# per warp, 8 warps along K (x is one row: nothing to share). M = 16: x rows cost 32 B per
# K value per block, so blocks of 64 rows (x traffic half the weight's) and, where N is
# short, K slices to keep blocks per SM. The entries are lab/gpu_quant_sweep.py's fastest
# plan per class, which it prints in this form.
V4_PLANS = {
    (8, "tall"): V4Plan(rt=4, u=1, wn=1, wk=8, blocks_per_sm=0),
    (8, "short"): V4Plan(rt=1, u=4, wn=1, wk=8, blocks_per_sm=0),
    (16, "tall"): V4Plan(rt=4, u=1, wn=1, wk=8, blocks_per_sm=0),
    (16, "short"): V4Plan(rt=2, u=2, wn=1, wk=16, blocks_per_sm=0),
}


@functools.cache  # a pure function of ints, on every call's host path
def v4_config(m: int, n: int, k: int, n_sm: int) -> V4Config:
    """cuda_v4's launch for an [M, K] x [N, K] product on ``n_sm`` SMs (``V4_PLANS``)."""
    mt = 8 if m <= 8 else 16
    return V4_PLANS[(mt, shape_class(n, n_sm))].config(mt, n, k, n_sm)


def v4_kernels(module=None) -> tuple:
    """The (mt, rt, u, pipe) that ``module`` (default: MODULE) has kernels for."""
    extra = module is not None and any(o.startswith("-DKL_WO_V4_EXTRA") for o in module.options)
    return V4_KERNELS + V4_EXTRA_KERNELS if extra else V4_KERNELS


def check_v4_config(cfg: V4Config, module=None) -> None:
    """Raise ValueError naming the field of a launch that ``module`` (default: MODULE, the
    build without KL_WO_V4_EXTRA) has no kernel for."""
    if cfg.mt not in (8, 16):
        raise ValueError(f"V4Config.mt must be 8 or 16, got {cfg.mt}")
    have = v4_kernels(module)
    key = (cfg.mt, cfg.rt, cfg.u, cfg.pipe)
    if key not in have:
        if key in V4_EXTRA_KERNELS:
            raise ValueError(
                f"V4Config (mt, rt, u, pipe) = {key} is built only with {V4_EXTRA_OPTION}: pass module= a "
                "Module of wo_matmul.cu with that option"
            )
        raise ValueError(f"V4Config (mt, rt, u, pipe) must be one of {have}, got {key}")
    if cfg.wn < 1 or cfg.wk < 1 or cfg.threads > V4_MAX_THREADS:
        raise ValueError(f"V4Config wn x wk must be 1..{V4_MAX_THREADS // 32} warps, got {cfg.wn} x {cfg.wk}")
    if cfg.shared > V4_MAX_SHARED:
        raise ValueError(f"V4Config needs {cfg.shared} B of shared memory (wk x mt x rows x 4), over 48 KB")
    if cfg.split < 1:
        raise ValueError(f"V4Config.split must be >= 1, got {cfg.split}")


_SIG_V4 = ("ptr",) * 5 + ("i32",) * 3 + ("ptr",) + ("i32",) * 3  # x w scale bias y, M N K, part, KS WN bias?
_SIG_V4_REDUCE = ("ptr",) * 4 + ("i32",) * 4
GRID_Z = 65535


def _v4_launch(x2, w, s, bias_arg, y, has_bias, m, n, k, dev, cfg: V4Config, module=None):
    """Launch v4 (and its reduction when K is sliced) for y [M, N]."""
    mod = module or MODULE
    suffix = DTYPE_SUFFIX[x2.dtype]
    if module is None:
        kern = _kernel(cfg.kernel, x2.dtype, dev, _SIG_V4)
    else:
        kern = mod.kernel(f"{cfg.kernel}_{suffix}", _SIG_V4, dev)
    ks = _cdiv(_cdiv(k, cfg.split), cfg.step) * cfg.step
    split = _cdiv(k, ks)
    grid = (_cdiv(n, cfg.rows), split, _cdiv(m, cfg.mt))
    part = torch.empty((split, m, n), dtype=torch.float32, device=y.device) if split > 1 else y
    kern(grid, cfg.threads, x2, w, s, bias_arg, y, m, n, k, part, ks, cfg.wn, has_bias, shared=cfg.shared)
    if split > 1:
        if module is None:
            red = _kernel("wo_v4_reduce", x2.dtype, dev, _SIG_V4_REDUCE)
        else:
            red = mod.kernel(f"wo_v4_reduce_{suffix}", _SIG_V4_REDUCE, dev)
        red(min(_cdiv(m * n, 256), 4096), 256, part, s, bias_arg, y, m, n, split, has_bias)


# --------------------------------------------------------------------------- v5


@dataclass(frozen=True)
class V5Config:
    """One v5 launch (wo_matmul.cu, v5; sm_90): ``mt`` x rows per group (8 or 16), ``rt`` row
    tiles of 16 weight rows per block, ``kc`` bytes of K per ring stage (a multiple of 128),
    ``stages`` stages in the ring, ``warps`` consumer warps (plus one producer warp),
    ``split`` K slices across blocks (> 1: fp32 partials and wo_v4_reduce), ``grid`` blocks
    along N (persistent over the row tiles; 0: one block per row tile)."""

    mt: int
    rt: int = 2
    kc: int = 512
    stages: int = 4
    warps: int = 4
    split: int = 1
    grid: int = 0

    @property
    def rows(self) -> int:  # weight rows per block (row tile)
        return 16 * self.rt

    @property
    def threads(self) -> int:
        return 32 * (self.warps + 1)

    @property
    def stage_bytes(self) -> int:  # wo_matmul.cu's v5_stage_bytes
        w = _cdiv(self.rows * self.kc + 64, 128) * 128
        return w + _cdiv(self.mt * (2 * self.kc + 16), 128) * 128

    @property
    def shared(self) -> int:  # bytes: mbarriers, [warps, mt, rows] fp32 partials, the ring
        return 128 + 4 * self.warps * self.mt * self.rows + self.stages * self.stage_bytes

    @property
    def kernel(self) -> str:  # wo_matmul.cu's name, less the dtype suffix
        return f"wo_v5_m{self.mt}_r{self.rt}"


V5_OPTION = "-DKL_WO_V5=1"
# (mt, rt) of the kernels KL_WO_V5 builds
V5_KERNELS = tuple((mt, rt) for mt in (8, 16) for rt in (2, 4, 8))
V5_MAX_WARPS = 8  # consumers: launch bounds 288 threads
V5_MAX_SHARED = 227 * 1024  # sm_90's opt-in limit per block
V5_MAX_KC = 8192


def check_v5_config(cfg: V5Config, module=None) -> None:
    """Raise ValueError naming the field of a v5 launch that is invalid or that ``module``
    (a Module of wo_matmul.cu built with V5_OPTION) has no kernel for."""
    if module is None or V5_OPTION not in module.options:
        raise ValueError(
            f"V5Config: v5 is built only with {V5_OPTION}: pass module= a Module of wo_matmul.cu with it"
        )
    if cfg.mt not in (8, 16):
        raise ValueError(f"V5Config.mt must be 8 or 16, got {cfg.mt}")
    if (cfg.mt, cfg.rt) not in V5_KERNELS:
        raise ValueError(f"V5Config.rt must be one of {sorted({rt for _, rt in V5_KERNELS})}, got {cfg.rt}")
    if cfg.kc % 128 or not 128 <= cfg.kc <= V5_MAX_KC:
        raise ValueError(f"V5Config.kc must be a multiple of 128 in 128..{V5_MAX_KC}, got {cfg.kc}")
    if not 1 <= cfg.warps <= V5_MAX_WARPS or cfg.kc // 64 < cfg.warps:
        raise ValueError(
            f"V5Config.warps must be 1..{V5_MAX_WARPS} and at most kc / 64 (a 64-byte column each), "
            f"got {cfg.warps} with kc {cfg.kc}"
        )
    if cfg.stages < 2:
        raise ValueError(f"V5Config.stages must be >= 2, got {cfg.stages}")
    if cfg.shared > V5_MAX_SHARED:
        raise ValueError(
            f"V5Config needs {cfg.shared} B of shared memory (stages x stage + partials), "
            f"over {V5_MAX_SHARED}"
        )
    if cfg.split < 1:
        raise ValueError(f"V5Config.split must be >= 1, got {cfg.split}")
    if cfg.grid < 0:
        raise ValueError(f"V5Config.grid must be >= 0 (0: one block per row tile), got {cfg.grid}")


def v5_unavailable(capability: tuple[int, int]) -> str | None:
    """Why v5 cannot run on a GPU of compute ``capability``, or None (sm_90 and newer)."""
    if tuple(capability) >= (9, 0):
        return None
    major, minor = capability
    return (
        f"v5 needs sm_90 or newer (cp.async.bulk, mbarrier transaction counts); this GPU is sm_{major}{minor}"
    )


_SIG_V5 = (
    ("ptr",) * 5 + ("i32",) * 3 + ("ptr",) + ("i32",) * 4
)  # x w scale bias y, M N K, part, KS KC S bias?


def v5_grid(cfg: V5Config, m: int, n: int, k: int) -> tuple[tuple[int, int, int], int]:
    """v5's grid (blocks along N, K slices, x-row groups) and K slice length (a multiple of kc)."""
    ks = _cdiv(_cdiv(k, cfg.split), cfg.kc) * cfg.kc
    tiles = _cdiv(n, cfg.rows)
    gx = tiles if cfg.grid == 0 else min(cfg.grid, tiles)
    return (gx, _cdiv(k, ks), _cdiv(m, cfg.mt)), ks


def _v5_launch(x2, w, s, bias_arg, y, has_bias, m, n, k, dev, cfg: V5Config, module):
    """Launch v5 (and wo_v4_reduce when K is sliced) for y [M, N]."""
    if torch.cuda.is_available():
        why = v5_unavailable(torch.cuda.get_device_capability(dev))
        if why:
            raise RuntimeError(why)
    suffix = DTYPE_SUFFIX[x2.dtype]
    kern = module.kernel(f"{cfg.kernel}_{suffix}", _SIG_V5, dev)
    kern.set_max_dynamic_shared(cfg.shared)
    grid, ks = v5_grid(cfg, m, n, k)
    split = grid[1]
    part = torch.empty((split, m, n), dtype=torch.float32, device=y.device) if split > 1 else y
    args = (x2, w, s, bias_arg, y, m, n, k, part, ks, cfg.kc, cfg.stages, has_bias)
    kern(grid, cfg.threads, *args, shared=cfg.shared)
    if split > 1:
        red = module.kernel(f"wo_v4_reduce_{suffix}", _SIG_V4_REDUCE, dev)
        red(min(_cdiv(m * n, 256), 4096), 256, part, s, bias_arg, y, m, n, split, has_bias)


def cuda_wo_fwd(
    x, w_q, scales, bias, bits: int, variant: str, config: V4Config | V5Config | None = None, module=None
):
    """y [..., N] = x [..., K] @ dequant(w_q).T (+ bias) with rung ``variant`` ("v1" ..
    "v5"). v4: ``config`` instead of ``v4_config``'s, ``module`` a build of wo_matmul.cu
    with other -D options (lab/gpu_quant_sweep.py). v5 (int8, 16-bit x): ``config`` (a
    V5Config) and ``module`` (built with V5_OPTION) are required; sm_90 or newer."""
    if variant == "v5":
        if bits != 8:
            raise ValueError("v5 is int8 only")
        if not isinstance(config, V5Config):
            raise ValueError("v5 has no default plan: pass config=V5Config(...)")
        check_v5_config(config, module)
    k = x.shape[-1]
    n = w_q.shape[0]
    lead = tuple(x.shape[:-1])
    x2 = x.reshape(math.prod(lead), k).contiguous()
    m = x2.shape[0]
    w = w_q.contiguous()
    s = scales if scales.dtype == torch.float32 and scales.is_contiguous() else scales.float().contiguous()
    b = None if bias is None else bias.contiguous()
    if m == 0 or n == 0 or k == 0:
        y = torch.zeros((m, n), dtype=x.dtype, device=x.device)
        if b is not None:
            y += b
        return y.reshape(lead + (n,))
    dev = x.device.index
    if dev != torch.cuda.current_device():
        with torch.cuda.device(dev):
            return cuda_wo_fwd(x, w_q, scales, bias, bits, variant, config, module)
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    bias_arg = b if b is not None else y
    group = 16 if bits == 8 else 32  # weights per 16-byte group
    vec = k % group == 0 and (x2.data_ptr() & 15) == 0 and (w.data_ptr() & 15) == 0
    prefix = "wo" if bits == 8 else "wo4"
    has_bias = int(b is not None)
    if variant == "v1" or not vec or x.dtype == torch.float32:  # fp32 x: v1 only (wo_matmul.cu)
        grid = (_cdiv(n, WARPS), min(m, GRID_Y))
        _kernel(f"{prefix}_v1", x.dtype, dev, _SIG_V1)(grid, 256, x2, w, s, bias_arg, y, m, n, k, has_bias)
    elif variant == "v4" and bits == 8 and _cdiv(m, 16) <= GRID_Z:
        if config is None:
            cfg = v4_config(m, n, k, _sm_count(dev))
        else:
            check_v4_config(config, module)
            cfg = config
        _v4_launch(x2, w, s, bias_arg, y, has_bias, m, n, k, dev, cfg, module)
    elif variant == "v5" and _cdiv(m, config.mt) <= GRID_Z:
        _v5_launch(x2, w, s, bias_arg, y, has_bias, m, n, k, dev, config, module)
    elif variant == "v2":
        grid = (_cdiv(n, WARPS), min(m, GRID_Y))
        _kernel("wo_v2", x.dtype, dev, _SIG_V1)(grid, 256, x2, w, s, bias_arg, y, m, n, k, has_bias)
    else:
        mt = _mt(m)
        grid = (_cdiv(n, WARPS * ROWS_V3), min(_cdiv(m, mt), GRID_Y))
        kern = _kernel(f"{prefix}_v3_m{mt}", x.dtype, dev, _SIG_V3)
        kc = KC_BYTES // x.element_size()
        kern(grid, 256, x2, w, s, bias_arg, y, m, n, k, kc, has_bias, shared=mt * kc * x.element_size())
    return y.reshape(lead + (n,))


def _fwd_for(bits, variant):
    return lambda x, w_q, scales, bias: cuda_wo_fwd(x, w_q, scales, bias, bits, variant)


VARIANTS = {
    8: [
        ("cuda_v1", "v1", "CUDA v1: one warp per output row, one weight byte per lane per load"),
        ("cuda_v2", "v2", "CUDA v2: 16-byte weight and x loads, byte-permute int8->fp32, shuffle reduce"),
        (
            "cuda_v3",
            "v3",
            "CUDA v3: 16 rows per block, up to 8 x rows staged in shared memory (weight read once)",
        ),
        (
            "cuda_v4",
            "v4",
            "CUDA v4: mma.sync tensor cores, int8 -> 16-bit in registers, one weight load for 16 x rows",
        ),
        ("cuda", "v4", "CUDA best (v4): tensor cores, 16-byte loads, K split across warps and blocks"),
    ],
    4: [
        ("cuda_v1", "v1", "CUDA v1: one warp per output row, nibbles unpacked one weight at a time"),
        ("cuda", "v3", "CUDA best (v3): 16-byte loads of 32 int4 weights, x rows in shared memory"),
    ],
}

for _bits, _op in ((8, "int8_weight_only_matmul"), (4, "int4_weight_only_matmul")):
    for _backend, _variant, _what in VARIANTS[_bits]:
        _fn = wo_op(f"{_op}_{_backend}", _fwd_for(_bits, _variant), _bits)
        register_cuda(_op, _backend, _fn, MODULE, _what)
