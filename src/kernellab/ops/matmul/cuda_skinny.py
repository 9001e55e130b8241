"""Skinny matmul in CUDA C++ (skinny.cu): backend ``cuda_skinny``, y = a @ b for M <= 128.

Decode (M = 1-16) and small batches (M <= 128) against a linear layer's weight, fp16 / bf16
with fp32 accumulation. b is read in place in either of two layouts: ``W.t()`` of a
row-major [N, K] ``W`` ("nt", nn.Linear's weight: unit stride along K) or a row-major
[K, N] ("nn"), with any row stride. Other layouts of b (sliced columns, expanded) are packed
with ``.contiguous()`` first: correct, but a copy of the weight. a is read in place when it
has unit stride along K, else packed (M x K halfs, cheap).

Four kernels (skinny.cu): ``gemv`` (nt, M <= 16: the weight goes straight from global memory
to the MMA's registers), ``rows`` (nt, M <= 8: a warp streams whole 512-byte runs of one
weight row at a time into CUDA-core FMAs), ``cols`` (nn, M <= 16: the same runs along a
row of the [K, N] weight, each lane summing its own outputs) and ``tile`` (any M, both
layouts: a cp.async pipeline). Each has a config object (GemvConfig, RowsConfig, ColsConfig,
TileConfig: tile shape, and the waves of blocks its split-K aims for); TABLE picks one per
M bucket and layout. Edit TABLE from the sweep of lab/gpu_skinny_cuda.py. Every (config,
kernel) pair is its own NVRTC module (-D macros, 0.5-1.5 s to compile, cached on disk).

Limits (``skinny_limits``; ``check`` counts these as refused): one 2-D product (no batch
dims) with M <= 128. The backward runs torch's matmuls: da = dz @ b^T has M rows but
db = a^T @ dz has K, which is not skinny.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch

from kernellab.core.registry import register
from kernellab.cuda.runtime import DTYPE_SUFFIX, Module, _raw_stream, capability_unavailable, sm_count
from kernellab.ops.matmul._autograd import matmul_op
from kernellab.ops.matmul.epilogue import apply_epilogue
from kernellab.ops.matmul.reference import torch_matmul

SOURCE = Path(__file__).with_name("skinny.cu")
# Every entry point with the default macros: what `kernellab asm` shows and the check's
# "compiled, not run" compiles.
MODULE = Module(SOURCE)
M_MAX = 128
HALF = (torch.float16, torch.bfloat16)
SMEM_MAX = 227 * 1024  # dynamic shared memory a block can opt into on sm_90 (sm_80: 163 KB)
GRID_Z_MAX = 65535
# Split-K: a slice is at least MIN_SLICE_K of K (shorter ones are mostly prologue), and
# at most SPLIT_MAX slices. The blocks aim at `waves` x SMs, FILL of it being enough (32
# tiles x 4 slices = 128 blocks on 132 SMs is a full wave, not 0.97 of one and a second).
MIN_SLICE_K = 256
SPLIT_MAX = 64
FILL = 0.95


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# --------------------------------------------------------------------------- configs


@dataclass(frozen=True)
class GemvConfig:
    """skinny_gemv (nt layout, M <= 16): a block of ``warps`` warps streams
    warps x rows x 16 weight rows over one K slice of at most ``kc``."""

    warps: int = 4  # warps per block
    rows: int = 1  # 16-row groups per warp (each loads 2 x 16 B per 32-wide k step)
    unroll: int = 4  # k steps per load batch; two batches in flight: 64 x unroll x rows B per thread
    kc: int = 2048  # most K per block: x's shared copy is M x (kc + 32) halfs (66 KB at M = 16)
    waves: float = 2.0  # split K until the blocks make this many waves of the SMs
    prefetch: int = 0  # L2 prefetch-size hint on the weight loads: 0, 128 or 256 bytes

    kind: ClassVar[str] = "gemv"
    granule: ClassVar[int] = 64  # K slices are multiples of this (x's shared row pitch)

    def __post_init__(self):
        if not (1 <= self.warps <= 32 and self.rows >= 1 and self.unroll >= 1):
            raise ValueError(f"GemvConfig: warps 1-32, rows >= 1, unroll >= 1; got {self}")
        if self.unroll * self.rows > 8:
            raise ValueError(
                f"GemvConfig: unroll x rows <= 8 (16 x that many registers of loads); got {self}"
            )
        if self.kc < 64 or self.kc % 64 or 16 * (self.kc + 32) * 2 > SMEM_MAX:
            raise ValueError(f"GemvConfig: kc a multiple of 64 whose x copy fits ({SMEM_MAX} B); got {self}")
        if self.waves <= 0 or self.prefetch not in (0, 128, 256):
            raise ValueError(f"GemvConfig: waves > 0, prefetch 0, 128 or 256; got {self}")

    @property
    def block_n(self) -> int:
        return self.warps * self.rows * 16

    @property
    def threads(self) -> int:
        return 32 * self.warps

    def block_m(self, m: int) -> int:
        return 8 if m <= 8 else 16

    def macros(self) -> tuple[str, ...]:
        return (
            f"-DSK_GW={self.warps}",
            f"-DSK_GR={self.rows}",
            f"-DSK_GU={self.unroll}",
            f"-DSK_PF={self.prefetch}",
        )

    def kernel(self, m: int, layout: str, dtype: torch.dtype) -> str:
        if layout != "nt":
            raise ValueError(
                "cuda_skinny: the gemv kernel reads the nt weight layout (W.t()) only; use a TileConfig"
            )
        if m > 16:
            raise ValueError(f"cuda_skinny: the gemv kernel takes M <= 16 rows, got {m}; use a TileConfig")
        return f"skinny_gemv_m{self.block_m(m)}_{DTYPE_SUFFIX[dtype]}"

    def max_chunk(self) -> int:
        return self.kc

    def shared(self, m: int, layout: str, kchunk: int) -> int:
        return m * (kchunk + 32) * 2


def _build_m(builds: tuple[int, ...], m: int) -> int:
    """M rounded up to the first of ``builds`` that holds it (M itself past the last)."""
    return next((r for r in builds if m <= r), m)


def _lane_kernel(kind: str, reads: str, layout: str, builds: tuple[int, ...], m: int, chunks: int,
                 per_lane: int, what: str, dtype: torch.dtype) -> str:  # fmt: skip
    """The build of a kernel that keeps M x chunks x 8 values (``what``) per lane in
    registers (rows, cols): M rounded up to one of ``builds``, at most ``per_lane`` values."""
    want, _, desc = reads.partition(" ")
    if layout != want:
        raise ValueError(
            f"cuda_skinny: the {kind} kernel reads the {want} weight layout {desc} only, got {layout!r}"
        )
    if m > builds[-1]:
        raise ValueError(f"cuda_skinny: the {kind} kernel takes M <= {builds[-1]} rows, got {m}")
    mr = _build_m(builds, m)
    if mr * chunks * 8 > per_lane:
        raise ValueError(
            f"cuda_skinny: M = {m} with {chunks} chunks keeps {mr * chunks * 8} {what} per lane "
            f"(at most {per_lane}); use fewer chunks"
        )
    return f"skinny_{kind}_m{mr}_{DTYPE_SUFFIX[dtype]}"


ROWS_M = (1, 2, 4, 8)  # the rows kernel's builds: x rows held in registers


@dataclass(frozen=True)
class RowsConfig:
    """skinny_rows (nt layout, M <= 8): a warp reads 512 x ``chunks`` contiguous bytes of
    one weight row per step and walks ``rows`` rows; ``warps`` warps split the K slice
    (256 x chunks each), x's values for its range in registers (M x chunks x 8 fp32)."""

    warps: int = 4  # warps per block (the slice: warps x 256 x chunks of K)
    chunks: int = 4  # 16-byte loads per lane per weight row
    rows: int = 16  # weight rows (outputs n) per block
    unroll: int = 2  # rows per load group (two groups in flight)
    waves: float = 1.0
    prefetch: int = 0

    kind: ClassVar[str] = "rows"

    def __post_init__(self):
        if not (1 <= self.warps <= 32 and self.chunks >= 1 and self.unroll >= 1):
            raise ValueError(f"RowsConfig: warps 1-32, chunks >= 1, unroll >= 1; got {self}")
        if self.rows % (2 * self.unroll) or self.unroll * self.chunks > 8:
            raise ValueError(
                f"RowsConfig: rows a multiple of 2 x unroll, unroll x chunks <= 8 (two groups of "
                f"loads, 4 registers each); got {self}"
            )
        if self.waves <= 0 or self.prefetch not in (0, 128, 256):
            raise ValueError(f"RowsConfig: waves > 0, prefetch 0, 128 or 256; got {self}")

    @property
    def block_n(self) -> int:
        return self.rows

    @property
    def threads(self) -> int:
        return 32 * self.warps

    @property
    def granule(self) -> int:
        return 256 * self.chunks  # one warp's range: slices keep every warp's range whole

    def block_m(self, m: int) -> int:
        return _build_m(ROWS_M, m)

    def macros(self) -> tuple[str, ...]:
        return (
            f"-DSK_RW={self.warps}",
            f"-DSK_RJ={self.chunks}",
            f"-DSK_RN={self.rows}",
            f"-DSK_RU={self.unroll}",
            f"-DSK_PF={self.prefetch}",
        )

    def kernel(self, m: int, layout: str, dtype: torch.dtype) -> str:
        return _lane_kernel("rows", "nt (W.t())", layout, ROWS_M, m, self.chunks, 64, "x values", dtype)

    def max_chunk(self) -> int:
        return self.warps * self.granule

    def shared(self, m: int, layout: str, kchunk: int) -> int:
        return 0  # static only: the warps' row sums (warps x rows x M floats)


COLS_M = (1, 2, 4, 8, 16)  # the cols kernel's builds: accumulators of M rows in registers


@dataclass(frozen=True)
class ColsConfig:
    """skinny_cols (nn layout, M <= 16): a warp reads 512 x ``chunks`` contiguous bytes of
    one weight row (one k) per step, each lane summing its own 8 x ``chunks`` outputs for
    every row of x in registers; ``warps`` warps split the K slice's rows, ``unroll`` rows
    per load group (two groups in flight). x's slice is staged in shared memory as fp32
    (at most ``kc`` of K per block)."""

    warps: int = 8  # warps per block (they split the slice's rows)
    chunks: int = 1  # 16-byte loads per lane per weight row: a block owns 256 x chunks outputs
    unroll: int = 4  # rows per load group (two groups in flight)
    kc: int = 2048  # most K per block: x's stage is kc x M fp32
    waves: float = 2.0
    prefetch: int = 0
    blocks: int = 1  # blocks per SM the kernel's registers must allow (__launch_bounds__)

    kind: ClassVar[str] = "cols"
    granule: ClassVar[int] = 32
    odd_run: ClassVar[int] = 248  # outputs a warp's run at odd row strides (skinny.cu: 31 lanes x 8)

    def __post_init__(self):
        if not (1 <= self.warps <= 32 and self.chunks >= 1 and self.unroll >= 1):
            raise ValueError(f"ColsConfig: warps 1-32, chunks >= 1, unroll >= 1; got {self}")
        if self.unroll * self.chunks > 8:
            raise ValueError(
                f"ColsConfig: unroll x chunks <= 8 (two groups of loads, 4 registers each); got {self}"
            )
        if self.kc < 32 or self.kc % 32 or self.shared(1, "nn", self.kc) > SMEM_MAX:
            raise ValueError(f"ColsConfig: kc a multiple of 32 whose stage fits ({SMEM_MAX} B); got {self}")
        if self.waves <= 0 or self.prefetch not in (0, 128, 256):
            raise ValueError(f"ColsConfig: waves > 0, prefetch 0, 128 or 256; got {self}")
        if not 1 <= self.blocks * self.warps <= 64:
            raise ValueError(f"ColsConfig: blocks x warps 1-64 (an SM's warps); got {self}")

    @property
    def block_n(self) -> int:
        return 256 * self.chunks

    @property
    def block_n_odd(self) -> int:
        """A block's outputs when the weight's rows are off 16-byte boundaries (vec == 0)."""
        return self.odd_run * self.chunks

    @property
    def threads(self) -> int:
        return 32 * self.warps

    def block_m(self, m: int) -> int:
        return _build_m(COLS_M, m)

    def macros(self) -> tuple[str, ...]:
        return (
            f"-DSK_CW={self.warps}",
            f"-DSK_CJ={self.chunks}",
            f"-DSK_CU={self.unroll}",
            f"-DSK_CB={self.blocks}",
            f"-DSK_PF={self.prefetch}",
        )

    def kernel(self, m: int, layout: str, dtype: torch.dtype) -> str:
        return _lane_kernel(
            "cols", "nn (row-major [K, N])", layout, COLS_M, m, self.chunks, 128, "sums", dtype
        )

    def max_chunk(self) -> int:
        return self.kc

    def shared(self, m: int, layout: str, kchunk: int) -> int:
        """x's fp32 stage [kchunk][MR], later the warps' sums [warps][MR][block_n] (skinny.cu)."""
        return 4 * self.block_m(m) * max(kchunk, self.warps * self.block_n)


@dataclass(frozen=True)
class TileConfig:
    """skinny_tile (nt or nn, any M): bn x bm output tiles over bk-deep stages of a
    ``stages``-deep cp.async pipeline; wn x wm warps."""

    bn: int = 64  # weight rows (outputs n) per block
    bm: int = 16  # rows of a per block (grid y = ceil(M / bm))
    bk: int = 64  # K per pipeline stage
    stages: int = 4
    wn: int = 4  # warps along n (warp tile bn / wn, a multiple of 16)
    wm: int = 1  # warps along m (warp tile bm / wm, a multiple of 8)
    waves: float = 1.0
    prefetch: int = 0  # L2 prefetch-size hint on the weight copies: 0, 128 or 256 bytes

    kind: ClassVar[str] = "tile"

    def __post_init__(self):
        if self.bn % (16 * self.wn) or self.bm % (8 * self.wm) or self.bk % 16 or self.bk < 16:
            raise ValueError(f"TileConfig: bn a multiple of 16 wn, bm of 8 wm, bk of 16; got {self}")
        if self.stages < 2 or not 1 <= self.wn * self.wm <= 32:
            raise ValueError(f"TileConfig: stages >= 2, 1-32 warps; got {self}")
        if max(self.shared(1, "nt", 0), self.shared(1, "nn", 0)) > SMEM_MAX:
            raise ValueError(f"TileConfig: {self.stages} stages need more than {SMEM_MAX} B of shared memory")
        if self.waves <= 0 or self.prefetch not in (0, 128, 256):
            raise ValueError(f"TileConfig: waves > 0, prefetch 0, 128 or 256; got {self}")

    @property
    def block_n(self) -> int:
        return self.bn

    @property
    def threads(self) -> int:
        return 32 * self.wn * self.wm

    @property
    def granule(self) -> int:
        return self.bk

    def block_m(self, m: int) -> int:
        return self.bm

    def macros(self) -> tuple[str, ...]:
        return (
            f"-DSK_BN={self.bn}",
            f"-DSK_BM={self.bm}",
            f"-DSK_BK={self.bk}",
            f"-DSK_STAGES={self.stages}",
            f"-DSK_WN={self.wn}",
            f"-DSK_WM={self.wm}",
            f"-DSK_PF={self.prefetch}",
        )

    def kernel(self, m: int, layout: str, dtype: torch.dtype) -> str:
        return f"skinny_tile_{layout}_{DTYPE_SUFFIX[dtype]}"

    def max_chunk(self) -> int | None:
        return None

    def shared(self, m: int, layout: str, kchunk: int) -> int:
        """STAGES x (weight tile + x tile) halfs, rows padded by 8 (as skinny.cu lays them)."""
        w = self.bk * (self.bn + 8) if layout == "nn" else self.bn * (self.bk + 8)
        return self.stages * (w + self.bm * (self.bk + 8)) * 2


# The config per M bucket and weight layout: the first row with M <= its bound and the
# layout wins. "nn-odd" is the nn layout where the launch is not 16-byte aligned (an odd
# row stride, K or N not a multiple of 8, a misaligned base): rows tagged so are tried
# first there, the plain "nn" rows after them. lab/gpu_skinny_cuda.py prints a replacement
# from its sweep.
TABLE: tuple[tuple[int, tuple[str, ...], GemvConfig | RowsConfig | ColsConfig | TileConfig], ...] = (
    (1, ("nt",), RowsConfig(warps=16, chunks=1, rows=16, unroll=4, waves=1.0, prefetch=0)),
    # nn, not aligned, M = 1-8: the cols kernel reads odd row strides in place where the
    # tile kernel's shifted chunk loads do not keep up. H100, 4097 x 4095 bf16, M = 1 / 2 /
    # 4 / 8: 0.96 / 1.56 / 1.37 / 1.04x cuBLAS; the tile kernel 0.69x at M = 4 and 0.67x
    # at 8, the aligned M = 1 row 0.93x (skinny_cuda-H100-b9aaf6d-nn.jsonl)
    (8, ("nn-odd",), ColsConfig(warps=16, chunks=1, unroll=4, kc=1024, waves=1.0, prefetch=0, blocks=1)),
    # nn (a row-major [K, N] b) at M = 1-2: the cols kernel, the sweep's best geomean x cuBLAS
    # (skinny_cuda-H200-99869f8-nn.jsonl); from M = 3 on its fp32 FMAs cost more than the
    # tile kernel's MMAs
    (1, ("nn",), ColsConfig(warps=16, chunks=1, unroll=4, kc=1024, waves=1.0, prefetch=0, blocks=2)),
    (2, ("nn",), ColsConfig(warps=16, chunks=1, unroll=2, kc=1024, waves=1.0, prefetch=0, blocks=2)),
    (2, ("nt",), RowsConfig(warps=8, chunks=2, rows=16, unroll=2, waves=2.0, prefetch=0)),
    # M = 3-4: the rows kernel's one-butterfly lane sums, the sweep's best geomean x cuBLAS
    # at M = 4 (skinny_cuda-H200-d865f54-*); nn stays on the tile row below
    (4, ("nt",), RowsConfig(warps=8, chunks=2, rows=16, unroll=2, waves=2.0, prefetch=0)),
    (8, ("nt",), GemvConfig(warps=4, rows=1, unroll=4, kc=2048, waves=2.0, prefetch=256)),
    (8, ("nt", "nn"), TileConfig(bn=64, bm=8, bk=128, stages=4, wn=4, wm=1, waves=2.0, prefetch=0)),
    (16, ("nt", "nn"), TileConfig(bn=64, bm=16, bk=128, stages=4, wn=4, wm=1, waves=2.0, prefetch=0)),
    (32, ("nt", "nn"), TileConfig(bn=64, bm=32, bk=128, stages=3, wn=4, wm=1, waves=2.0, prefetch=0)),
    (64, ("nt", "nn"), TileConfig(bn=128, bm=64, bk=64, stages=3, wn=4, wm=2, waves=1.0, prefetch=0)),
    (128, ("nt", "nn"), TileConfig(bn=64, bm=128, bk=64, stages=4, wn=2, wm=2, waves=1.0, prefetch=0)),
)


def choose_config(m: int, layout: str, table=TABLE, aligned: bool = True):
    """The config ``table`` gives an [M, K] @ b product in ``layout`` ("nt" or "nn");
    ``aligned`` False (see ``plan``): an nn product takes "nn-odd" rows first."""
    tags = ("nn-odd", "nn") if layout == "nn" and not aligned else (layout,)
    for tag in tags:
        for bound, layouts, cfg in table:
            if m <= bound and tag in layouts:
                return cfg
    raise ValueError(f"cuda_skinny: no config for M = {m}, layout {layout!r} (M <= {M_MAX})")


# --------------------------------------------------------------------------- plan


def split_k(tiles: int, k: int, granule: int, sms: int, waves: float, max_chunk: int | None = None,
            splits: int | None = None) -> tuple[int, int]:  # fmt: skip
    """(S, kchunk): K cut into S slices of kchunk elements (a multiple of ``granule``; the
    last slice may be shorter, none is empty) for ``tiles`` output tiles on ``sms`` SMs.

    S is the smallest count whose tiles x S blocks reach FILL x waves x SMs, at most
    SPLIT_MAX and with slices of at least MIN_SLICE_K; ``splits`` asks for a count instead.
    Either way a slice holds at most ``max_chunk`` (the gemv kernel's shared copy of x),
    which wins over the rest."""
    units = _cdiv(k, granule)
    if splits is None:
        s = _slice_bound(math.ceil(FILL * waves * sms / max(1, tiles) - 1e-9), k)
    elif splits < 1:
        raise ValueError(f"cuda_skinny: splits must be >= 1, got {splits}")
    else:
        s = splits
    if max_chunk is not None:
        s = max(s, _cdiv(k, max_chunk))
    per = _cdiv(units, min(s, units))  # granules per slice
    return _cdiv(units, per), per * granule


def odd_splits(tiles: int, k: int, blocks: int, sms: int) -> int:
    """K slices of the cols kernel at odd row strides: as many as fill the ``blocks`` x
    ``sms`` block slots in one wave (no second, partial wave), within split_k's bounds. Its
    shifted loads issue about twice the aligned kernel's instructions, so more warps an SM
    pay there where the aligned kernel's one block an SM does not (1x4097x4095 on an H200:
    15 slices 21.7 us, 8 slices 24.4, 16 slices, 272 blocks on 264 slots, 25.7;
    benchmarks/NOTES.md (ak))."""
    return _slice_bound(blocks * sms // max(1, tiles), k)


def _slice_bound(s: int, k: int) -> int:
    """s K slices within split_k's bounds: 1 to SPLIT_MAX, slices of >= MIN_SLICE_K."""
    return max(1, min(s, SPLIT_MAX, k // MIN_SLICE_K))


@dataclass(frozen=True)
class Plan:
    """One launch: kernel name, config, grid, threads, K slices, dynamic shared memory."""

    kernel: str
    config: GemvConfig | RowsConfig | ColsConfig | TileConfig
    grid: tuple[int, int, int]
    block: int
    splits: int
    kchunk: int
    shared: int


def plan(m: int, n: int, k: int, layout: str, dtype: torch.dtype, sms: int, config=None,
         splits: int | None = None, aligned: bool = True) -> Plan:  # fmt: skip
    """The launch for y [m, n] = x [m, k] @ b [k, n] (pure: no GPU needed). ``config``
    None: TABLE's; ``splits`` None: split_k's heuristic. ``aligned`` False (the kernel's vec
    == 0): the cols kernel's runs are 248 outputs, not 256 (skinny.cu, odd row strides), and
    its K slices fill every block slot of one wave (odd_splits)."""
    if not (1 <= m <= M_MAX and n >= 1 and k >= 1):
        raise ValueError(f"cuda_skinny: plans 1 <= M <= {M_MAX}, N >= 1, K >= 1; got M={m}, N={n}, K={k}")
    if layout not in ("nt", "nn"):
        raise ValueError(f"cuda_skinny: layout is 'nt' or 'nn', got {layout!r}")
    if dtype not in HALF:
        raise TypeError(f"cuda_skinny: takes float16 / bfloat16, got {dtype}")
    cfg = config if config is not None else choose_config(m, layout, aligned=aligned)
    name = cfg.kernel(m, layout, dtype)
    odd = not aligned and cfg.kind == "cols"
    block_n = cfg.block_n_odd if odd else cfg.block_n
    tiles_n, tiles_m = _cdiv(n, block_n), _cdiv(m, cfg.block_m(m))
    if splits is None and odd:
        splits = odd_splits(tiles_n * tiles_m, k, cfg.blocks, sms)
    s, kchunk = split_k(tiles_n * tiles_m, k, cfg.granule, sms, cfg.waves, cfg.max_chunk(), splits)
    if s > GRID_Z_MAX:
        raise ValueError(f"cuda_skinny: K = {k} needs {s} slices, more than the grid's {GRID_Z_MAX}")
    shared = cfg.shared(m, layout, kchunk)
    if shared > SMEM_MAX:
        raise ValueError(
            f"cuda_skinny: {cfg} needs {shared} B of shared memory at M = {m} (at most {SMEM_MAX})"
        )
    return Plan(name, cfg, (tiles_n, tiles_m, s), cfg.threads, s, kchunk, shared)


# --------------------------------------------------------------------------- launcher


@functools.cache
def module_for(config, kernel: str) -> Module:
    """The NVRTC module of one kernel of skinny.cu under ``config``'s macros."""
    return Module(SOURCE, options=config.macros() + ("-DSK_ONE", f"-DSK_WANT_{kernel}"))


_SIG = ("ptr", "ptr", "ptr", "ptr", "ptr") + ("i32",) * 7
# Per (device, stream): the split-K tile counters. The kernel leaves them at zero, so one
# zeroed buffer serves every launch on its stream (one per stream: launches on two
# streams may run at once).
_COUNTERS: dict[tuple[int, int], torch.Tensor] = {}
_PLANS: dict[tuple, tuple[Plan, object]] = {}


def _counters(dev: int, need: int) -> torch.Tensor:
    key = (dev, _raw_stream(dev))
    t = _COUNTERS.get(key)
    if t is None or t.numel() < need:
        t = torch.zeros(max(4096, 1 << (need - 1).bit_length()), dtype=torch.int32, device=f"cuda:{dev}")
        _COUNTERS[key] = t
    return t


def skinny_limits(a, b, bias=None, activation=None) -> str | None:
    """Why cuda_skinny does not take (a, b), or None (``Impl.limits``)."""
    if a.dim() != 2 or b.dim() != 2:
        return (
            f"cuda_skinny computes one 2-D product a [M, K] @ b [K, N]; got a {tuple(a.shape)}, "
            f"b {tuple(b.shape)} (batched products: backend 'cuda' or 'torch')"
        )
    if a.shape[0] > M_MAX:
        return f"cuda_skinny takes M <= {M_MAX} rows of a (decode, small batches), got {a.shape[0]}"
    if a.dtype not in HALF:
        return f"cuda_skinny takes float16 / bfloat16, got {a.dtype}"
    return None


def weight_layout(b: torch.Tensor) -> tuple[str, int] | None:
    """("nt", ldw) where b[k, n] = w[n ldw + k], ("nn", ldw) where b[k, n] = w[k ldw + n],
    None where neither holds (b is packed then). Size-1 dims take any stride."""
    k, n = b.shape
    if b.stride(0) == 1 or k == 1:
        return "nt", (b.stride(1) if n > 1 else k)
    if b.stride(1) == 1 or n == 1:
        return "nn", (b.stride(0) if k > 1 else n)
    return None


def skinny_product(a: torch.Tensor, b: torch.Tensor, config=None, splits: int | None = None) -> torch.Tensor:
    """a [M, K] @ b [K, N] -> a fresh y [M, N] with one launch (fp16 / bf16, M <= 128).
    ``config`` / ``splits`` override TABLE and the split heuristic (the sweep's knobs)."""
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        raise TypeError("cuda_skinny: a and b must be tensors")
    why = skinny_limits(a, b)
    if why:
        raise (TypeError if a.dtype not in HALF else ValueError)(f"matmul/{why}")
    if b.dtype != a.dtype or b.shape[0] != a.shape[1]:
        raise ValueError(f"matmul/cuda_skinny: a {tuple(a.shape)} {a.dtype} @ b {tuple(b.shape)} {b.dtype}")
    if not (a.is_cuda and b.is_cuda and a.device == b.device):
        raise ValueError(
            f"matmul/cuda_skinny: a and b must be on one CUDA device, got {a.device} and {b.device}"
        )
    m, k = a.shape
    n = b.shape[1]
    if m == 0 or n == 0:
        return a.new_empty((m, n))
    if k == 0:
        return a.new_zeros((m, n))
    if a.stride(1) != 1 and k > 1:
        a = a.contiguous()
    ldx = a.stride(0) if m > 1 else k
    found = weight_layout(b)
    if found is None:
        b = b.contiguous()
        found = "nn", n
    layout, ldw = found
    dev = a.device.index
    vec = int(
        k % 8 == 0
        and ldx % 8 == 0
        and ldw % 8 == 0
        and (layout == "nt" or n % 8 == 0)
        and a.data_ptr() % 16 == 0
        and b.data_ptr() % 16 == 0
    )
    key = (m, n, k, layout, a.dtype, dev, config, splits, vec)
    got = _PLANS.get(key)
    if got is None:
        p = plan(m, n, k, layout, a.dtype, sm_count(dev), config, splits, aligned=bool(vec))
        kern = module_for(p.config, p.kernel).kernel(p.kernel, _SIG, dev)
        kern.set_max_dynamic_shared(p.shared)  # (a no-op once allowed)
        got = _PLANS[key] = (p, kern)
    p, kern = got
    y = torch.empty((m, n), dtype=a.dtype, device=a.device)
    ws = cnt = 0
    if p.splits > 1:
        ws = torch.empty((p.splits, m, n), dtype=torch.float32, device=a.device)
        cnt = _counters(dev, p.grid[0] * p.grid[1])
    kern(
        p.grid, p.block, a, b, y, ws, cnt, m, n, k, ldx, ldw, p.kchunk, vec, shared=p.shared, device_index=dev
    )
    return y


# --------------------------------------------------------------------------- registration


def _fwd(a, b, bias=None, activation=None):
    y = skinny_product(a, b)
    if bias is None and activation is None:
        return y
    return apply_epilogue(y, bias, activation)


def _available():
    """NVRTC, and on a GPU sm_80 or newer (mma.sync on bf16, cp.async)."""
    return capability_unavailable((8, 0), "sm_80 or newer (bf16 mma.sync, cp.async)")


def table_kernels(table=TABLE) -> list[tuple[GemvConfig | RowsConfig | ColsConfig | TileConfig, str]]:
    """(config, kernel name) for every kernel TABLE can launch."""
    out = []
    for bound, layouts, cfg in table:
        for layout in dict.fromkeys(tag.removesuffix("-odd") for tag in layouts):
            for dtype in HALF:
                ms = {"gemv": (8, 16), "rows": ROWS_M, "cols": COLS_M}.get(cfg.kind, (1,))
                for i, m in enumerate(ms):
                    if i and ms[i - 1] >= bound:  # a smaller build already covers the bound
                        continue
                    pair = (cfg, cfg.kernel(m, layout, dtype))
                    if pair not in out:
                        out.append(pair)
    return out


_CALL = matmul_op("matmul_cuda_skinny", _fwd, backward_mm=torch_matmul)
register(
    "matmul",
    "cuda_skinny",
    devices=("cuda",),
    available=_available,
    precompile=MODULE.precompile,  # every entry point; the tests compile TABLE's own modules
    custom_ops=_CALL.custom_ops,
    description="CUDA skinny (M <= 128, fp16/bf16): tensor-core weight stream, split-K in one launch",
    dtypes=HALF,
    builtin=True,
    module=MODULE,
    limits=skinny_limits,
    double_backward=True,
)(_CALL)
