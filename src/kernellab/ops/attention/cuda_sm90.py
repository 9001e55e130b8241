"""Attention forward on Hopper in CUDA C++ (attention_sm90.cu, compiled by NVRTC for sm_90a):
backends ``cuda_v2`` (wgmma, double-buffered cp.async), ``cuda_v3`` (v2 warp-specialized: a
producer warpgroup, an mbarrier ring, two consumer warpgroups), ``cuda_v4`` (v3 with TMA
copies from tensor maps built here), ``cuda_v5`` (v4 with the softmax of one key tile
overlapping the P V of the previous one), ``cuda_v6`` (v4 with the two consumer
warpgroups taking turns at the tensor cores: one's softmax under the other's GEMMs) and
``cuda_v7`` (FlashAttention-3's full forward schedule: v6's turns with v5's overlap inside
each, so a softmax runs under its own P V and the other warpgroup's GEMMs; o written
through shared memory by a TMA store from a fourth tensor map, every head dim); ``cuda`` (the fastest: v7's forward with v9's CUDA backward, ``CUDA_VARIANT``) is
registered in cuda_sm90_bwd.py. The list of
what each variant changes is at the top of the .cu file.

Contract: fp16 / bf16 q (..., S_q, D), k and v (..., S_k, D), D in 64, 80, 96, 128, 256;
GQA (4-D and up, q heads a multiple of k/v heads: q head h reads k/v head h // group in
place); causal aligned bottom-right, any lengths (masked tails). No window, no softcap
(refused with a ValueError naming the option; the default dispatcher then serves the
call). Strided inputs are passed as they are when each row is whole 16-byte chunks (unit
stride over D, the other strides multiples of 8 elements, 16-byte aligned base), else
copied once (``_chunked``). o comes back in ``triton.empty_bshd``'s layout and the
log-sum-exp (..., S_q) fp32 in log2 units, exactly what the Triton forward returns, so
the backward is the Triton FlashAttention-2 backward from the saved o and lse (the op's
contract: the autograd node saves q, k, v, o and that one lse).

Availability: sm_90 GPUs only (an sm_90a cubin runs nowhere else); without a GPU the
module compiles ("compiled, not run"). The default backend never picks these until a
committed tuning table names them.

``emulate`` is the kernel's arithmetic in PyTorch (same blocks, tile order, masks, exp2
online softmax, P rounded to 16 bits): the CPU tests hold it against the float64
reference, which catches schedule and masking mistakes before a GPU sees the kernel.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from kernellab.core.kit import OpDecl, build
from kernellab.core.registry import register
from kernellab.cuda.runtime import (
    DTYPE_SUFFIX,
    Module,
    ceil_div,
    nvrtc_unavailable,  # noqa: F401 (the tests ask this module)
    sm90_unavailable,
    sm_count,
    tensor_map,
)
from kernellab.ops.attention import triton as at
from kernellab.ops.attention.args import check_dtype, check_head_dim, refuse_options, resolve_scale
from kernellab.triton_support import kept_plan

CU = Path(__file__).with_name("attention_sm90.cu")
HEAD_DIMS = (64, 80, 96, 128, 256)
DTYPES = (torch.float16, torch.bfloat16)
VARIANTS = ("v2", "v3", "v4", "v5", "v6", "v7")
TMA_VARIANTS = ("v4", "v5", "v6", "v7")  # K/V (and Q) copied by TMA: their kernels take tensor maps
TMA_STORE_VARIANTS = ("v7",)  # o stored by TMA too: a tensor map of o instead of its pointer and strides
BM = 128  # query rows per block (two consumer warpgroups of 64)
THREADS = {"v2": 256, "v3": 384, "v4": 384, "v5": 384, "v6": 384, "v7": 384}
SMEM_LIMIT = 227 * 1024  # dynamic shared memory a block may opt into on an H100 / H200
LOG2E = at.LOG2E  # log2(e): scores are scaled by scale * log2(e) and exponentiated with exp2
# One module per head dim for the launches (its twelve kernels: v2 .. v7 x fp16 / bf16, 1-2 s
# to compile at first use); MODULE holds every head dim (~15 s: the "compiled, not run"
# check without a GPU, `kernellab asm`).
MODULES = {d: Module(CU, options=(f"-DKL_ATTN_D={d}",), archs=("sm_90a",)) for d in HEAD_DIMS}
MODULE = Module(CU, archs=("sm_90a",))
SS_WIDTHS = (64, 80, 128, 176, 192, 208)  # S = Q K^T widths (keys per tile) in attention_sm90_wgmma.cuh
_SIG = ("ptr",) * 5 + ("i32",) * 4 + ("f32", "i32") + ("i64",) * 12
_SIG_TMA = ("tmap",) * 3 + ("ptr",) * 2 + ("i32",) * 4 + ("f32", "i32") + ("i64",) * 3
_SIG_TMA_STORE = ("tmap",) * 4 + ("ptr",) + ("i32",) * 4 + ("f32", "i32")
GRID_LIMIT = 65535  # grid y (q heads) and z (batch)


def signature(variant: str) -> tuple[str, ...]:
    """The launch signature of a variant's kernels: v2-v3 pointers and strides; v4-v6 tensor
    maps of q, k, v; v7 a map of o as well (no o pointer, no o strides), the batch count (a
    persistent tiling's grid is one-dimensional) and the item counter of a queue tiling (a
    null pointer for the others)."""
    if variant in TMA_STORE_VARIANTS:
        return _SIG_TMA_STORE + ("i32", "ptr")
    return _SIG_TMA if variant in TMA_VARIANTS else _SIG


def block_n(d: int) -> int:
    """Keys per tile of v2-v6 (attention_sm90.cu, Tiles): 128, 64 at D = 256 (v7's: V7_TILES)."""
    return 64 if d > 128 else 128


@dataclass(frozen=True)
class Tiles:
    """One tiling of v7 (attention_sm90.cu, V7Tiles): ``bn`` keys per K/V tile (a multiple of
    16 whose slabs keep 1024-byte alignment; an S = Q K^T width the wgmma header has) and
    ``stages`` K/V stages in the ring (Q + stages x 2 tiles within 227 KB). ``split_kv``:
    separate K and V rings over the same stages (V7Tiles' SPLIT_KV, FlashAttention-3's
    pipelines: a K tile is released once its S = Q K^T is done), written with a suffix "s".
    ``fast_exp``: the softmax's exponentials by ex2.approx.ftz (FAST_EXP), written with a
    suffix "e"; ``desc_add``: each wgmma k step added to its tile's descriptor (DESC_ADD, the
    same descriptors from fewer instructions), "d". ``persistent``: about one block an SM, each
    walking (query block, head, batch) items with the ring and barriers carried from one to the
    next, so that an item's first K / V tiles load during the item before (PERSIST; one ring
    only), "p". ``o_buffer`` (persistent only): o staged in a buffer of its own rather than in
    Q's, which is then free for the next item's Q once the item's last S = Q K^T is done
    (PERSIST 2), "o". ``queue`` (persistent only): a block's items after its first
    come from a launch-wide counter (zeroed before each launch), claimed once the current
    item's copies are issued, so free blocks take the next items as a one-block-an-item grid
    would be scheduled (QUEUE), "q". ``free``: the consumer warpgroups issue their wgmma
    groups whenever ready rather than in turns (TURNS 0), "f". ``three_wg``: three consumer
    warpgroups, 192 query rows a block, taking their turns round (WG 3; setmaxnreg 24 / 160:
    head dim 64 and at most 128 keys a tile), FlashAttention-3's block at head dim 64, "w".
    ``col_mask``: a masked tile that needs no causal compare for a warp's rows masks by column
    alone (COLMASK), "m".
    ``lean_epi``: the epilogue's 1 / l and log2(l) by rcp / lg2.approx (LEAN_EPI), "l".
    ``tree``: the softmax's row max and sum as four partial ones, a shorter chain before the
    exponentials (TREE), "r". ``narrow`` (persistent, more than block_n(d) keys a tile): an
    item whose keys all fit in block_n(d) computes only those, the first rows of its one tile
    (NARROW), "n"."""

    bn: int
    stages: int
    split_kv: bool = False
    fast_exp: bool = False
    desc_add: bool = False
    persistent: bool = False
    o_buffer: bool = False
    queue: bool = False
    free: bool = False
    three_wg: bool = False
    col_mask: bool = False
    lean_epi: bool = False
    tree: bool = False
    narrow: bool = False

    @property
    def rows(self) -> int:
        """Query rows a block: 64 a consumer warpgroup."""
        return 192 if self.three_wg else BM

    @property
    def threads(self) -> int:
        """Threads a block: the producer warpgroup and the consumers."""
        return 128 * (1 + self.rows // 64)

    def __str__(self) -> str:
        flags = "".join(c for name, c in _TILE_FLAGS if getattr(self, name))
        return f"{self.bn}x{self.stages}{flags}"

    @classmethod
    def parse(cls, text: str) -> Tiles:
        """The tiling ``str`` writes ('208x3edpof': keys x stages, then the flags in order)."""
        letters = "".join(c for _, c in _TILE_FLAGS)
        m = re.fullmatch(rf"(\d+)x(\d+)([{letters}]*)", text.strip())
        t = m and cls(int(m[1]), int(m[2]), **{name: c in m[3] for name, c in _TILE_FLAGS})
        if not t or str(t) != text.strip():
            raise ValueError(
                f"attention/cuda_v7: a tiling is KEYSxSTAGES then flags in the order {letters}, got {text!r}"
            )
        return t


_TILE_FLAGS = (  # Tiles' flags as str writes them, in order
    ("split_kv", "s"),
    ("fast_exp", "e"),
    ("desc_add", "d"),
    ("persistent", "p"),
    ("o_buffer", "o"),
    ("queue", "q"),
    ("free", "f"),
    ("three_wg", "w"),
    ("col_mask", "m"),
    ("lean_epi", "l"),
    ("tree", "r"),
    ("narrow", "n"),
)


# v7's tiling per head dim, what attention_sm90.cu's V7Tiles builds in MODULES[d] (a test reads
# it back from the PTX): 128 keys x 3 stages at D <= 128, FlashAttention-3's 80 x 2 at D = 256,
# where the K and V tiles have rings of their own ("s": with two stages in one ring, no K tile
# loads while the P V of the tile before it runs); the softmax's exponentials by ex2.approx.ftz
# (fast_exp, "e") and each wgmma k step added to its tile's descriptor (desc_add, "d"). At
# D <= 96 persistent ("p": one block an SM walks (query block, head, batch) items, so a
# block's start and end, a large part of its time at short sequences, are paid once an SM)
# with o staged in a tile of its own ("o": the next item's Q loads during this one's last
# P V and epilogue). Each was faster on an H200 (benchmarks/NOTES.md); at D = 128 the
# persistent tiling (o in Q's buffer: o's tile and three stages do not fit) was slower under
# causal at long sequences.
_ED = dict(fast_exp=True, desc_add=True)
_EDP = dict(_ED, persistent=True)
_EDPO = dict(_EDP, o_buffer=True)
_ML = dict(col_mask=True, lean_epi=True)
V7_TILES = {
    **{d: Tiles(128, 3, **_EDPO) for d in HEAD_DIMS if d <= 96},
    128: Tiles(128, 3, **_ED),
    256: Tiles(80, 2, split_kv=True, **_ED),
}
# v7's first tiling (v2-v6's: 64 keys at D = 256): the lab times it beside V7_TILES.
V7_TILES_FIRST = {d: Tiles(block_n(d), 3 if d <= 128 else 2) for d in HEAD_DIMS}
# The tilings lab/gpu_attn_sm90.py times beside V7_TILES, per head dim (the tests compile
# each: no spills, within 227 KB), with the default's exponentials and descriptors:
# FlashAttention-3's wider key tiles at D = 64 (176 / 192 keys: S is 88 / 96 registers beside
# O's 32) and at D = 128 without a mask (176 keys, two stages: 208 KB; 192 keys spills) and a
# fourth stage at D = 64; split K / V rings at D = 128 (176x2s, 128x3s); at D = 256 the
# one-ring 80x2 and the split 80x2s; each head dim's default without desc_add ("e";
# V7_TILES_FIRST is the one without either); at D <= 96 the default's tiling one block a
# (query block, head) ("ed") and persistent with o staged in Q's buffer ("edp"); at D = 128
# persistent ("edp") and with o's own tile and two stages ("edpo"); and a persistent tiling
# with its items handed out by a counter, as the hardware hands out a one-block-a-tile
# grid's blocks ("q"; measured against the defaults in benchmarks/NOTES.md (ag)); at D = 64
# the persistent tiling whose one tile holds all of a short sequence's keys (V7_SHORT), and
# both persistent ones without the warpgroups' turns ("f"); at D = 64 three consumer
# warpgroups ("w": 192 query rows a block, FlashAttention-3's block there), persistent with o's
# own tile at three and four stages and one block a (query block, head); at D = 64 the short
# tilings and the default with masks by column where no causal compare is needed ("m") and
# the epilogue's 1 / l and log2(l) by the MUFU alone ("l"): Nsight found v7's ViT and GPT-2
# forwards waiting on the MUFU pipe and on the mask's compares where cuDNN's do not (NOTES.md
# (ao), timed in (ap)); and the default and the free one with the softmax's max and sum in
# four parts ("r", V7_MANY).
V7_TILINGS = {
    64: (
        Tiles(128, 3, **_EDPO, three_wg=True),
        Tiles(128, 4, **_EDPO, three_wg=True),
        Tiles(128, 3, **_ED, three_wg=True),
        Tiles(128, 4, **_ED),
        Tiles(176, 3, **_ED),
        Tiles(192, 3, **_ED),
        Tiles(208, 3, **_EDPO),
        Tiles(208, 3, **_EDPO, free=True),
        Tiles(128, 3, **_EDPO, free=True),
        Tiles(128, 3, fast_exp=True),
        Tiles(128, 3, **_ED),
        Tiles(128, 3, **_EDP),
        Tiles(128, 3, **_EDPO, queue=True),
        Tiles(208, 3, **_EDPO, free=True, **_ML),
        Tiles(128, 3, **_EDPO, free=True, **_ML),
        Tiles(128, 3, **_EDPO, **_ML),
        Tiles(128, 3, **_EDPO, tree=True),
        Tiles(128, 3, **_EDPO, free=True, tree=True),
        Tiles(208, 3, **_EDPO, free=True, **_ML, tree=True),
        Tiles(208, 3, **_EDPO, free=True, **_ML, narrow=True),
    ),
    80: (
        Tiles(128, 3, fast_exp=True),
        Tiles(128, 3, **_ED),
        Tiles(128, 3, **_EDP),
        Tiles(128, 3, **_EDPO, queue=True),
    ),
    96: (
        Tiles(128, 3, fast_exp=True),
        Tiles(128, 3, **_ED),
        Tiles(128, 3, **_EDP),
        Tiles(128, 3, **_EDPO, queue=True),
    ),
    128: (
        Tiles(128, 3, **_EDP),
        Tiles(128, 3, **_EDP, queue=True),
        Tiles(128, 2, **_EDPO),
        Tiles(176, 2, **_ED),
        Tiles(176, 2, split_kv=True, **_ED),
        Tiles(128, 3, split_kv=True, **_ED),
        Tiles(128, 3, fast_exp=True),
    ),
    256: (Tiles(80, 2), Tiles(80, 2, split_kv=True), Tiles(80, 2, split_kv=True, fast_exp=True)),
}
# v7's tiling at short sequences, where every key fits one of its tiles and not one of
# V7_TILES' (V7_TILES[d].bn < S_k <= bn): at D = 64, ViT-B/16's 197 keys. One 208-key tile
# (S = 104 registers beside O's 32) rather than two of 128, the second 69 keys wide; under
# causal the first query block, whose keys fit in 128, computes only those ("n": else its 128
# rows would compute all 208). Without the warpgroups' turns ("f"): an item is one key tile,
# too little for the turns to overlap one warpgroup's softmax with the other's GEMMs. The
# tile's 11 masked keys by column alone where no row needs the causal compare ("m") and the
# epilogue by the MUFU alone ("l"). Measurements: benchmarks/NOTES.md (ak), (ap), (aq).
V7_SHORT = {64: Tiles(208, 3, **_EDPO, free=True, **_ML, narrow=True)}
# v7's tiling where S_k is past V7_SHORT's and there are at least V7_MANY_PER_SM items
# (query block, head, batch) an SM: at D = 64 without the warpgroups' turns ("f") and with the
# softmax's row max and sum in four parts ("r"). With several items an SM a block's items
# overlap one another without the turns, and the shorter max chain lets the exponentials
# start sooner; with about one item an SM the turns are what overlaps the softmax with the
# GEMMs. Measurements: benchmarks/NOTES.md (ap).
V7_MANY = {64: Tiles(128, 3, **_EDPO, free=True, tree=True)}
V7_MANY_PER_SM = 3
_V7_MODULES: dict[tuple[int, Tiles], Module] = {}


def v7_module(d: int, tiles: Tiles) -> Module:
    """The module whose v7 kernels at head dim d are tiled by ``tiles``: MODULES[d] for the
    default (V7_TILES), else one of v7's two kernels alone, built with -DKL_ATTN_V7_BN /
    _STAGES and -DKL_ATTN_V7_SPLIT_KV / -DKL_ATTN_FAST_EXP / -DKL_ATTN_DESC_ADD set to 0 or 1."""
    if tiles == V7_TILES[d]:
        return MODULES[d]
    check_tiles(d, tiles)
    key = (d, tiles)
    if key not in _V7_MODULES:
        opts = (
            f"-DKL_ATTN_D={d}",
            f"-DKL_ATTN_V7_BN={tiles.bn}",
            f"-DKL_ATTN_V7_STAGES={tiles.stages}",
            f"-DKL_ATTN_V7_SPLIT_KV={int(tiles.split_kv)}",
            f"-DKL_ATTN_FAST_EXP={int(tiles.fast_exp)}",
            f"-DKL_ATTN_DESC_ADD={int(tiles.desc_add)}",
            f"-DKL_ATTN_V7_PERSIST={2 if tiles.o_buffer else int(tiles.persistent)}",
            f"-DKL_ATTN_V7_QUEUE={int(tiles.queue)}",
            f"-DKL_ATTN_V7_TURNS={int(not tiles.free)}",
        ) + ((f"-DKL_ATTN_V7_WG={tiles.rows // 64}",) if tiles.three_wg else ())
        opts += ("-DKL_ATTN_V7_COLMASK=1",) if tiles.col_mask else ()
        opts += ("-DKL_ATTN_V7_LEAN_EPI=1",) if tiles.lean_epi else ()
        opts += ("-DKL_ATTN_V7_TREE=1",) if tiles.tree else ()
        opts += ("-DKL_ATTN_V7_NARROW=1",) if tiles.narrow else ()
        _V7_MODULES[key] = Module(CU, options=opts, archs=("sm_90a",))
    return _V7_MODULES[key]


def check_tiles(d: int, tiles: Tiles) -> None:
    """What V7Tiles' static_asserts and the wgmma header require of a tiling, as a ValueError."""
    w = swizzle_bytes(d)
    if tiles.bn not in SS_WIDTHS or tiles.bn % 16 or (tiles.bn * w) % 1024 or tiles.stages < 2:
        raise ValueError(
            f"attention/cuda_v7: no tiling {tiles} at D = {d} (keys per tile in {SS_WIDTHS}, "
            f"a multiple of 16 with {tiles.bn} x {w} bytes a multiple of 1024; stages >= 2)"
        )
    if tiles.persistent and tiles.split_kv:
        raise ValueError(f"attention/cuda_v7: tiling {tiles}: the persistent v7 has one K/V ring (no s)")
    if tiles.o_buffer and not tiles.persistent:
        raise ValueError(f"attention/cuda_v7: tiling {tiles}: o's own buffer (o) is the persistent v7's (p)")
    if tiles.narrow and not (tiles.persistent and tiles.bn > block_n(d)):
        raise ValueError(
            f"attention/cuda_v7: tiling {tiles}: a narrow item (n) is a persistent v7's (p) whose tiles "
            f"are wider than {block_n(d)} keys"
        )
    if tiles.queue and not tiles.persistent:
        raise ValueError(f"attention/cuda_v7: tiling {tiles}: the item queue (q) feeds the persistent v7 (p)")
    if tiles.three_wg and (d != 64 or tiles.bn > 128 or tiles.split_kv):
        raise ValueError(
            f"attention/cuda_v7: tiling {tiles}: three consumer warpgroups (w) have 160 registers a thread: "
            "head dim 64, at most 128 keys a tile, one K/V ring"
        )
    bars = 8 * ((4 if tiles.split_kv else 2) * tiles.stages + 1 + tiles.persistent)  # the static mbarriers
    if _smem(d, tiles) + bars > SMEM_LIMIT:
        raise ValueError(
            f"attention/cuda_v7: tiling {tiles} at D = {d} needs more than 227 KB of shared memory"
        )


def swizzle_bytes(d: int) -> int:
    """The tiles' swizzle width W (attention_sm90.cu, Layout): 128 where 64 divides D, 64
    where 32 does, else 32; a tile is D / (W / 2) column slabs of W-byte rows."""
    return 128 if d % 64 == 0 else 64 if d % 32 == 0 else 32


def v7_tiles(d: int, s_k: int | None = None, causal: bool = False, items: int = 0, sms: int = 0) -> Tiles:
    """v7's default tiling at head dim d and s_k keys: V7_SHORT[d] where s_k keys fill one
    of its tiles and not one of V7_TILES[d]'s; else V7_MANY[d] where there are at least
    V7_MANY_PER_SM ``items`` (query blocks x heads x batches) for each of ``sms`` SMs; else
    V7_TILES[d] (s_k None: V7_TILES[d]). ``causal`` chooses nothing: every default tiling
    takes both masks (the plan passes it, as the tests that hold it do)."""
    short = V7_SHORT.get(d)
    if short is not None and s_k is not None and V7_TILES[d].bn < s_k <= short.bn:
        return short
    many = V7_MANY.get(d)
    if many is not None and s_k is not None and sms > 0 and items >= V7_MANY_PER_SM * sms:
        return many
    return V7_TILES[d]


def tiles_of(
    variant: str,
    d: int,
    tiles: Tiles | None = None,
    s_k: int | None = None,
    causal: bool = False,
    items: int = 0,
    sms: int = 0,
) -> Tiles:
    """(keys per tile, K/V stages) of a variant's kernel: v2 block_n x 2; v3-v6 block_n x
    three where they fit (WsStages), else two; v7 ``tiles`` or v7_tiles(d, s_k, causal,
    items, sms)."""
    if variant == "v7":
        return tiles or v7_tiles(d, s_k, causal, items, sms)
    if tiles is not None:
        raise ValueError(f"attention/cuda_{variant}: only v7 takes another tiling, got {tiles}")
    if variant == "v2":
        return Tiles(block_n(d), 2)
    q_bytes, kv_bytes = BM * d * 2, block_n(d) * d * 2
    return Tiles(block_n(d), 3 if q_bytes + 3 * 2 * kv_bytes + 1024 <= SMEM_LIMIT else 2)


def stages(variant: str, d: int) -> int:
    """K/V stages of a variant's kernel at head dim d (tiles_of)."""
    return tiles_of(variant, d).stages


def smem_bytes(variant: str, d: int, tiles: Tiles | None = None) -> int:
    """Dynamic shared memory of a block: 1 KB to align the base to 1024 bytes (the swizzle
    atoms), the Q tile (128 x D x 2 B; v7 stages o there for its TMA store), and per stage
    a K and a V tile (BN x D x 2 B each); an o tile after them with ``o_buffer``. The kernel
    traps if given less (check_smem)."""
    return _smem(d, tiles_of(variant, d, tiles))


def _smem(d: int, t: Tiles) -> int:
    return 1024 + t.rows * d * 2 * (2 if t.o_buffer else 1) + t.stages * 2 * t.bn * d * 2


def _device_index(t: Tensor) -> int:
    return t.device.index if t.device.index is not None else torch.cuda.current_device()


def _chunked(t4: Tensor, tma: bool = False) -> Tensor:
    """t4 (Z, H, S, D) as the kernels read it: rows of whole 16-byte chunks (unit stride over
    D, the other strides multiples of 8 elements, a 16-byte aligned base; for TMA no zero
    stride over a dim longer than 1, as an expanded tensor has); else a copy."""
    if _rows_whole(t4, tma) and t4.data_ptr() % 16 == 0:
        return t4
    c = t4.contiguous()
    return c if c.data_ptr() % 16 == 0 else c.clone()


def forward(
    q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float, variant: str, tiles: Tiles | None = None
) -> tuple[Tensor, Tensor]:
    """(o, lse) of one variant's kernel (``triton.forward``'s outputs: o in empty_bshd's
    layout, lse (..., S_q) fp32 in log2 units, -inf for a row that sees no key). ``tiles``:
    v7 only, another tiling than V7_TILES (the lab times one beside the other).

    Everything but the tensors' addresses is worked out once per (shapes, strides, dtypes,
    device, options) into a ``Plan`` (``_plan_forward``, cached in ``PLANS``); a call then
    allocates o and lse, encodes (or finds cached) the tensor maps and launches."""
    key = (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype, k.dtype, v.dtype,
           q.device, causal, scale, variant, tiles)  # fmt: skip
    p = kept_plan(PLANS, key, lambda: _plan_forward(q, k, v, causal, scale, variant, tiles))
    if p.copy or (p.launch is not None and (q.data_ptr() | k.data_ptr() | v.data_ptr()) & 15):
        q, k, v = (_whole(t, p.tma) for t in (q, k, v))  # contiguous, aligned: a plan of its own
        return forward(q, k, v, causal, scale, variant, tiles)
    o = torch.empty_strided(p.out[0], p.out[1], dtype=q.dtype, device=q.device)
    lse = torch.empty(p.lse, dtype=torch.float32, device=q.device)
    if p.launch is None:  # no query row, or no key: every row empty (what the kernels would write)
        return (o, lse) if p.empty else (o.zero_(), lse.fill_(float("-inf")))
    p.launch(q, k, v, o, lse)
    return o, lse


@dataclass(frozen=True)
class Plan:
    """A launch worked out for one (shapes, strides, dtypes, device, options): ``out`` the
    (size, stride) of o (empty_bshd's), ``lse`` its size; ``launch(q, k, v, o, lse)`` the
    kernel launch with everything but the addresses bound (None: nothing to launch,
    ``empty``: no query row, else no key); ``copy``: an input must be copied first
    (``_whole``), ``tma``: whether the kernel reads tensor maps."""

    out: tuple
    lse: tuple
    launch: object = None
    empty: bool = False
    copy: bool = False
    tma: bool = False


PLANS: dict = {}  # forward plans by (shapes, strides, dtypes, device, options): kept_plan's


def in_place(t: Tensor, tma: bool) -> bool:
    """Whether the kernels read t (..., S, D) where it is (``_chunked`` would keep its 4-D
    view): its (Z, H, S, D) view is a view, rows of whole 16-byte chunks, and (for TMA)
    no zero stride over a dim longer than 1. The base's alignment is the call's to check."""
    t4 = at._split(t)
    if t4.data_ptr() != t.data_ptr():
        return False  # the leading dims could not be viewed as one: _split copied them
    return _rows_whole(t4, tma)


def _rows_whole(t4: Tensor, tma: bool) -> bool:
    """Unit stride over D and the other strides multiples of 8 elements (for TMA: none 0),
    over the dims longer than 1 (the kernels never step along the others)."""
    st = t4.stride()
    return st[-1] == 1 and all(
        n == 1 or (s % 8 == 0 and (s or not tma)) for s, n in zip(st[:3], t4.shape[:3])
    )


def _whole(t: Tensor, tma: bool) -> Tensor:
    """t as the kernels read it (``_chunked`` of its 4-D view), in t's shape."""
    return _chunked(at._split(t), tma).reshape(t.shape)


def _plan_forward(q, k, v, causal, scale, variant, tiles) -> Plan:
    """The ``Plan`` of ``forward`` at these tensors' shapes, strides and dtypes (and its
    refusals: ValueError / TypeError naming the argument)."""
    backend = f"cuda_{variant}"
    check_dtype(q, DTYPES, backend)
    check_head_dim(q, HEAD_DIMS, backend)
    if not scale > 0:  # (the kernels take the row max of the raw scores: a positive scale)
        raise ValueError(f"attention/{backend}: scale must be positive, got {scale!r}")
    lead, s_q, s_k, d = q.shape[:-2], q.shape[-2], k.shape[-2], q.shape[-1]
    o_meta = at.empty_bshd(lead, s_q, d, q.dtype, "meta")
    out, lse = (tuple(o_meta.shape), o_meta.stride()), tuple(lead) + (s_q,)
    q4, k4, v4, o4 = at._split(q), at._split(k), at._split(v), at._split(o_meta)
    z, h, h_kv = q4.shape[0], q4.shape[1], k4.shape[1]
    if h > GRID_LIMIT or z > GRID_LIMIT:
        raise ValueError(
            f"attention/{backend}: q folds to {z} batches x {h} heads; each must be at most {GRID_LIMIT} "
            "(CUDA grid y and z)"
        )
    t = tiles_of(variant, d, tiles, s_k, bool(causal))
    if not (s_q and z and h) or not s_k:
        return Plan(out, lse, empty=not (s_q and z and h))
    tma = variant in TMA_VARIANTS
    if not all(in_place(x, tma) for x in (q, k, v)):
        return Plan(out, lse, copy=True, tma=tma)
    dev = _device_index(q)
    if variant == "v7" and tiles is None:  # items at the default's 128 query rows a block
        t = v7_tiles(d, s_k, bool(causal), ceil_div(s_q, BM) * h * z, sm_count(dev))
    name = f"attn_fwd_{variant}_d{d}_{DTYPE_SUFFIX[q.dtype]}"
    mod = v7_module(d, t) if variant == "v7" else MODULES[d]
    kern = mod.kernel(name, signature(variant), dev)
    shared = _smem(d, t)
    if shared > kern.max_dynamic_shared:
        kern.set_max_dynamic_shared(shared)
    bm = t.rows  # query rows a block (v2-v6: BM)
    grid, threads = (ceil_div(s_q, bm), h, z), t.threads if variant == "v7" else THREADS[variant]
    scalars = (s_q, s_k, h, h // h_kv, float(scale) * LOG2E, int(causal))
    if variant == "v7":
        scalars += (z,)
        if t.persistent:  # items (query block, head, batch), one block an SM at most
            grid = (min(ceil_div(s_q, bm) * h * z, sm_count(dev)), 1, 1)
    if tma:
        mq, mk, mv = _map_args(q4, bm), _map_args(k4, t.bn), _map_args(v4, t.bn)
    if variant in TMA_STORE_VARIANTS:  # o is empty_bshd's: rows of D x 2 bytes, a fresh aligned base
        mo = _map_args(o4, 64)  # one consumer warpgroup's rows
        queue = t.queue

        def launch(q, k, v, o, lse):
            # the queue's item counter, zeroed on the launch's stream (else a null pointer)
            sched = torch.zeros(1, dtype=torch.int32, device=q.device) if queue else 0
            kern(
                grid, threads,
                tensor_map(q.data_ptr(), *mq), tensor_map(k.data_ptr(), *mk), tensor_map(v.data_ptr(), *mv),
                tensor_map(o.data_ptr(), *mo), lse, *scalars, sched,
                shared=shared, device_index=dev,
            )  # fmt: skip

    elif tma:
        o_strides = o4.stride()[:3]

        def launch(q, k, v, o, lse):
            kern(
                grid, threads,
                tensor_map(q.data_ptr(), *mq), tensor_map(k.data_ptr(), *mk), tensor_map(v.data_ptr(), *mv),
                o, lse, *scalars, *o_strides,
                shared=shared, device_index=dev,
            )  # fmt: skip

    else:
        strides = q4.stride()[:3] + k4.stride()[:3] + v4.stride()[:3] + o4.stride()[:3]

        def launch(q, k, v, o, lse):
            kern(grid, threads, q, k, v, o, lse, *scalars, *strides, shared=shared, device_index=dev)

    return Plan(out, lse, launch=launch, tma=tma)


def _map_args(t4: Tensor, rows: int) -> tuple:
    """``tensor_map``'s arguments after the address for t4 (Z, H, S, D) as v4-v7 copy it:
    dims (D, S, H, Z) innermost first, one box = one column slab of a tile (W / 2 columns x
    ``rows`` rows of one head; v7's map of o: 64 rows, one consumer warpgroup's), swizzled as
    the tile is (swizzle_bytes). A dim of length 1 is given the packed stride (its stride is
    never used; TMA wants a multiple of 16 bytes)."""
    z, h, s, d = t4.shape
    st = t4.stride()
    strides, packed = [], d
    for n, stride in ((s, st[2]), (h, st[1]), (z, st[0])):
        strides.append(2 * (stride if n > 1 else packed))
        packed *= n
    w = swizzle_bytes(d)
    return 2, (d, s, h, z), tuple(strides), (w // 2, rows, 1, 1), w


# --------------------------------------------------------------------------- the kernel's math in PyTorch


def schedule(
    s_q: int, s_k: int, d: int, causal: bool, bn: int | None = None, bm: int = BM
) -> list[tuple[int, int, list[tuple[int, bool]]]]:
    """The blocks in launch order (blockIdx.x = 0, 1, ...) as the kernel derives them
    (block_of): (block index, first query row, [(first key of each tile, masked)]); ``bn``
    keys per tile (default block_n(d), v2-v6's; v7's: tiles_of("v7", d).bn), ``bm`` query rows a
    block (v7's: Tiles.rows).
    Causal: the last query block first (it sees the most keys); its key tiles end at the
    last row's limit (m0 + bm - 1 + S_k - S_q); a tile is masked where it passes S_k or
    some row's causal limit (its last key > m0 + S_k - S_q)."""
    bn, off = bn or block_n(d), s_k - s_q
    nb = ceil_div(s_q, bm)
    out = []
    for x in range(nb):
        mb = nb - 1 - x if causal else x
        m0 = mb * bm
        n_end = max(0, min(s_k, m0 + bm + off)) if causal else s_k
        tiles = [
            (n0, n0 + bn > s_k or (causal and n0 + bn - 1 > m0 + off))
            for n0 in range(0, ceil_div(n_end, bn) * bn, bn)
        ]
        out.append((mb, m0, tiles))
    return out


def emulate(
    q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float, bn: int | None = None, bm: int = BM
) -> tuple[Tensor, Tensor]:
    """(o, lse) computed as the kernel computes them, in PyTorch (CPU or GPU), at ``bn``
    keys per tile (default block_n(d), v2-v6's; v7's: tiles_of("v7", d).bn) and ``bm`` query
    rows a block (v7's: Tiles.rows): q, k, v
    (..., S, D) 16-bit (GQA as the op takes it); fp32 scores from the 16-bit inputs, the
    mask applied only to the tiles ``schedule`` marks, exp2 of the log2e-scaled scores with
    the running max (0 subtracted while a row has seen no key), P rounded to the input
    dtype before P V, o normalized once, lse = m + log2(l). Rows past S_q of the last block
    are computed from zero q rows and dropped, as in the kernel."""
    lead, s_q, s_k, d = q.shape[:-2], q.shape[-2], k.shape[-2], q.shape[-1]
    q4, k4, v4 = at._split(q), at._split(k), at._split(v)
    group = q4.shape[1] // k4.shape[1] if k4.shape[1] else 1
    c = scale * LOG2E
    bn, off = bn or block_n(d), s_k - s_q
    heads = torch.arange(q4.shape[1], device=q.device) // group
    kf, vf = k4[:, heads].float(), v4[:, heads].float()  # (Z, H, S_k, D): k/v head h // group
    o = torch.zeros(q4.shape, dtype=torch.float32, device=q.device)
    lse = torch.empty(q4.shape[:-1], dtype=torch.float32, device=q.device)
    neg = float("-inf")
    for _, m0, tiles in schedule(s_q, s_k, d, causal, bn, bm):
        qb = torch.zeros(q4.shape[:2] + (bm, d), dtype=torch.float32, device=q.device)
        rows = min(bm, s_q - m0)
        qb[:, :, :rows] = q4[:, :, m0 : m0 + rows].float()
        row = torch.arange(m0, m0 + bm, device=q.device)[:, None]
        m = torch.full(q4.shape[:2] + (bm, 1), neg, device=q.device)
        lsum = torch.zeros_like(m)
        acc = torch.zeros(q4.shape[:2] + (bm, d), dtype=torch.float32, device=q.device)
        for n0, masked in tiles:
            kt = torch.zeros(q4.shape[:2] + (bn, d), dtype=torch.float32, device=q.device)
            vt = torch.zeros_like(kt)
            cols = min(bn, s_k - n0)
            kt[:, :, :cols], vt[:, :, :cols] = kf[:, :, n0 : n0 + cols], vf[:, :, n0 : n0 + cols]
            s = qb @ kt.transpose(-1, -2)
            if masked:
                col = torch.arange(n0, n0 + bn, device=q.device)[None, :]
                bad = col >= s_k
                if causal:
                    bad = bad | (col > row + off)
                s = s.masked_fill(bad, neg)
            m_new = torch.maximum(m, s.amax(-1, keepdim=True) * c)
            m_use = torch.where(m_new == neg, torch.zeros_like(m_new), m_new)
            alpha = torch.exp2(m - m_use)
            p = torch.exp2(s * c - m_use)
            lsum = lsum * alpha + p.sum(-1, keepdim=True)
            acc = acc * alpha + p.to(q.dtype).float() @ vt
            m = m_new
        l_safe = torch.where(lsum > 0, lsum, torch.ones_like(lsum))
        ob = torch.where(lsum > 0, acc / l_safe, torch.zeros_like(acc))
        lb = torch.where(lsum > 0, m + torch.log2(l_safe), torch.full_like(lsum, neg))
        o[:, :, m0 : m0 + rows] = ob[:, :, :rows]
        lse[:, :, m0 : m0 + rows] = lb[:, :, :rows, 0]
    return o.to(q.dtype).reshape(tuple(lead) + (s_q, d)), lse.reshape(tuple(lead) + (s_q,))


# --------------------------------------------------------------------------- custom ops (the kit)


def _backward(
    do: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, causal: bool, scale: float
) -> tuple[Tensor, Tensor, Tensor]:
    """The Triton FlashAttention-2 backward from the saved o and lse (log2 units)."""
    return at.backward(do, q, k, v, o, lse, causal, scale)


def declare(variant: str, fwd, bwd, opcheck_bwd):
    """The custom ops of ``cuda_<variant>``: ``fwd`` (q, k, v, causal, scale) -> (o, lse),
    ``bwd`` (do, q, k, v, o, lse, causal, scale) -> (dq, dk, dv), with the fakes, saved
    tensors and gradients every Hopper variant shares (cuda_sm90_bwd.py's too)."""
    return build(
        OpDecl(
            name=f"attention_cuda_{variant}",
            label=f"attention (cuda_{variant})",
            fwd=fwd,
            bwd=bwd,
            fwd_fake=lambda q, k, v, causal, scale: (
                at.empty_bshd(q.shape[:-2], q.shape[-2], v.shape[-1], q.dtype, q.device),
                q.new_empty(at.lse_shape(q), dtype=torch.float32),
            ),
            bwd_fake=lambda do, q, k, v, o, lse, causal, scale: tuple(
                at.empty_bshd(t.shape[:-2], t.shape[-2], t.shape[-1], t.dtype, t.device) for t in (q, k, v)
            ),
            save=lambda inputs, out: ((*inputs[:3], out[0], out[1]), inputs[3:]),
            bwd_args=lambda saved, extra, do: (do, *saved, *extra),
            grads=lambda g, extra: (g[0], g[1], g[2], None, None),
            needs_grad=lambda q, k, v, *options: q.requires_grad or k.requires_grad or v.requires_grad,
            samples=(lambda make: (make(1), make(1), make(1), True, 0.125), opcheck_bwd),
            inplace_hint=at.INPLACE_HINT,
        )
    )


def _make(variant: str):
    def fwd(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float) -> tuple[Tensor, Tensor]:
        return forward(q, k, v, causal, scale, variant)

    def _opcheck_bwd(make):
        q, k, v = make(0), make(0), make(0)
        o, lse = forward(q, k, v, True, 0.125, variant)
        return (make(0), q, k, v, o, lse, True, 0.125)

    return declare(variant, fwd, _backward, _opcheck_bwd)


_BUILT = {variant: _make(variant) for variant in VARIANTS}


def _limits_of(backend: str):
    def limits(q, k, v, causal: bool = False, scale=None, window=None, softcap=None) -> str | None:
        """What the backend refuses by design (``Impl.limits``): head dims other than
        64/80/96/128/256, a window, a softcap (dtypes are declared)."""
        try:
            check_head_dim(q, HEAD_DIMS, backend)
            refuse_options(backend, window, softcap, causal)
        except ValueError as e:
            return str(e)
        return None

    return limits


def entry(built, backend: str):
    """The registered function of ``backend``: checks with the backend's name in the errors,
    then ``built`` (a ``declare``'d op)."""

    def attention(q, k, v, causal: bool = False, scale=None, window=None, softcap=None):
        check_dtype(q, DTYPES, backend)
        check_head_dim(q, HEAD_DIMS, backend)
        refuse_options(backend, window, softcap, causal)
        return built(q, k, v, causal, resolve_scale(q, scale))

    attention.custom_ops, attention.ops = built.custom_ops, built.ops
    attention.forward_saving, attention.backward_from = built.forward_saving, built.backward_from
    attention.__name__ = f"{backend}_attention"
    return attention


def _entry(variant: str):
    return entry(_BUILT[variant], f"cuda_{variant}")


available = sm90_unavailable  # sm_90a cubins run on sm_90 only


_DESCRIPTIONS = {
    "v2": "CUDA v2 (sm_90): wgmma S = QK^T and O += PV with P from registers, cp.async double buffer, "
    "128 query rows, heavy-first causal",
    "v3": "CUDA v3 (sm_90): v2 warp-specialized: producer warpgroup, mbarrier ring of 2-3 K/V stages, "
    "setmaxnreg 56/224",
    "v4": "CUDA v4 (sm_90): v3 with TMA copies (one producer thread, tensor maps), setmaxnreg 40/232",
    "v5": "CUDA v5 (sm_90): v4 with FlashAttention-3's intra-warpgroup overlap (softmax of tile j under "
    "the P V of tile j-1)",
    "v6": "CUDA v6 (sm_90): v4 with FlashAttention-3's inter-warpgroup ping-pong (named barriers: one "
    "consumer's softmax under the other's GEMMs)",
    "v7": "CUDA v7 (sm_90): FlashAttention-3's full schedule: v6's ping-pong with v5's intra-warpgroup "
    "overlap in each turn, o stored from shared memory by TMA",
}

for _variant in VARIANTS:
    _fn = _entry(_variant)
    register(
        "attention",
        f"cuda_{_variant}",
        devices=("cuda",),
        available=available,
        precompile=MODULE.precompile,
        custom_ops=_fn.custom_ops,
        builtin=True,
        module=MODULE,
        limits=_limits_of(f"cuda_{_variant}"),
        dtypes=DTYPES,
        description=_DESCRIPTIONS[_variant],
    )(_fn)
