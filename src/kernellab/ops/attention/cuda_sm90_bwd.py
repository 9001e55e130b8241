"""Attention backward on Hopper in CUDA C++ (attention_sm90_bwd.cu, compiled by NVRTC for
sm_90a), FlashAttention-3's design: backends ``cuda_v8`` and ``cuda_v9``, whose forward is
``cuda_v7``'s (cuda_sm90.py) and whose backward is three kernels: a preprocess (delta = rowsum(dO * O)
in fp32, the lse copied into a padded buffer, the fp32 dQ accumulator zeroed), the main
kernel (per 128 keys x k/v head x batch, a block or, at D <= 128, an item of a persistent
block, about one an SM (``BwdOpts.persist``): a TMA producer warpgroup and two
consumer warpgroups of 64 keys each (D = 256: 64 keys a block, the warpgroups splitting
the head dim, ``splits_d``), K and V held in shared memory, Q / dO / lse / delta
streamed per query block of 64 rows through an mbarrier ring; dK and dV accumulated in
registers over the query blocks and the group's q heads, dQ added to the fp32 accumulator
with vector atomics) and a postprocess (dq = scale x accumulator, in q's dtype). What each
step computes is in the .cu file's header.

Variants (``VARIANTS``; each its own registered backend, so both time side by side):
  v8  dQ summed by per-thread ``red.global.add.v2.f32``: 64 x NQ / 2 vector atomics per
      warpgroup and query block. At D = 256 ``red.global.add.v4.f32`` instead, half as many,
      into the blocked accumulator order below (64-column chunks, ``dq_chunk``).
  v9  v8 with dQ staged in shared memory: each consumer warp stores its 16 x NQ fp32 dQ rows
      (conflict-free float4s), fences them to the async proxy and one lane issues a single
      ``cp.reduce.async.bulk ... add.f32`` of them into the accumulator (one instruction
      instead of 16 NQ / 2 atomics a warp; the TMA unit does the adds at L2). The
      accumulator then holds each query block's 64 x D floats in the staging order
      (``dq_frag_offset``), which v9's postprocess undoes. Head dims <= 128 (D = 256 keeps
      v8's float4 atomics: its two ring stages leave no room for the staging tiles). At D <= 80 a
      query block's dQ is staged after the next block's S^T and dP^T wgmmas are issued
      (the tensor cores run them meanwhile); at D = 96 and 128 the dQ registers kept
      across the iteration would make ptxas serialize the wgmmas.
``CUDA_VARIANT`` names the variant the ``cuda`` backend runs.

Contract: the forward's (cuda_sm90.py): fp16 / bf16, GQA, causal aligned bottom-right, any
lengths, no window or softcap (ValueError naming the option); head dims 64, 80, 96, 128 and
256, all with the CUDA backward (``BWD_HEAD_DIMS``; ``backward_kernel`` names the Triton
FlashAttention-2 backward for any head dim left out of it). The autograd node saves q, k, v,
o and the one lse (..., S_q) fp32 in log2 units, as every attention backend does. Gradients
come back in ``empty_bshd``'s layout. dQ is summed with atomics, so it is not bitwise
reproducible run to run; dK and dV are where the item is unsplit (no atomics: a block owns its
keys and loops over its group's q heads itself). Where the (key block, k/v head, batch) items
are too few for the SMs, the default splits the group's q heads over several items
(``split_count``), whose fp32 dK / dV partials are summed by atomics; under
``torch.use_deterministic_algorithms(True)`` it never splits.

Availability: sm_90 GPUs only; without a GPU the module compiles ("compiled, not run").
The default backend never picks it until a committed tuning table names it.

``emulate_backward`` is the kernel's arithmetic in PyTorch (same key blocks and query-block
order, masks applied only where the kernel applies them, fp32 accumulation, P and dS
rounded to 16 bits before their MMAs, dQ summed per 64 keys or per 128-key block as the
kernel sums it, ``splits_dq``): the CPU tests hold it against the float64 reference.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import Tensor

from kernellab.core.registry import register
from kernellab.cuda.runtime import (
    DTYPE_SUFFIX,
    Module,
    ceil_div,
    nvrtc_unavailable,  # noqa: F401 (the tests ask this module)
    sm90_unavailable,
    sm_count,
)
from kernellab.device import l2_bytes
from kernellab.ops.attention import cuda_sm90 as cs
from kernellab.ops.attention import triton as at
from kernellab.triton_support import kept_plan

CU = Path(__file__).with_name("attention_sm90_bwd.cu")
HEAD_DIMS = cs.HEAD_DIMS  # what the backend takes (the forward's)
BWD_HEAD_DIMS = (64, 80, 96, 128, 256)  # what the CUDA backward computes (every one)
DTYPES = cs.DTYPES
FWD_VARIANT = "v7"
VARIANTS = ("v8", "v9")  # the backward's rungs, each registered as cuda_<variant>
CUDA_VARIANT = "v9"  # the one the ``cuda`` backend (the fastest Hopper attention) runs
BM = 64  # query rows per step of a block's loop
THREADS = 384  # producer warpgroup + two consumer warpgroups
SMEM_LIMIT = cs.SMEM_LIMIT
LOG2E = cs.LOG2E


@dataclass(frozen=True)
class BwdOpts:
    """A build of the main kernel (attention_sm90_bwd.cu's BwdBuild and -D options, the
    backward's counterpart of the forward's ``cuda_sm90.Tiles``): ``no_dq_red`` skips the
    dQ reduce-adds (-DKL_ATTN_BWD_NO_DQ_RED=1: dq comes back wrong; a timing bound only,
    never checked, never a default); ``fast_exp`` (-DKL_ATTN_BWD_FAST_EXP=1) computes P with
    ex2.approx.ftz instead of exp2f's denormal-safe sequence; ``mask_branch``
    (-DKL_ATTN_BWD_MASK_BRANCH=1) keeps the masks' compares and selects out of the key
    blocks that need none; ``desc_add`` (-DKL_ATTN_BWD_DESC_ADD=1) adds a wgmma operand's k
    step to its tile's descriptor instead of building a descriptor per step (the same
    descriptors); ``persist`` (-DKL_ATTN_BWD_PERSIST=1) launches about one block an SM, each
    walking (key block, k/v head, batch) items, instead of one block an item; ``q128``
    (-DKL_ATTN_BWD_Q128=1, head dim 64 only) steps through the queries 128 rows at a time
    instead of 64 (``query_rows``), the warpgroups splitting dQ by rows; ``pairs`` (no -D
    option: a launch argument) the (k/v head, batch) pairs a section of the persistent item
    order holds (0: ``section_pairs``'s); ``split`` (persistent builds; -DKL_ATTN_BWD_PARTS=1
    above 1, the count itself a launch argument) the items a (key block, k/v head, batch)
    becomes, each for a run of the group's q heads (``split_items``), their dK and dV partials
    summed into fp32 buffers and rounded after: where H_kv x key blocks x Z leaves SMs idle
    (Qwen2.5-0.5B's 2 k/v heads). 0 on the head dim's default build: ``split_count``'s
    count at the call's shapes; 1: never split. ``stsm`` (-DKL_ATTN_BWD_STSM=1) writes the
    dS^T tiles to shared memory by stmatrix (four 8 x 8 matrices an instruction) instead of
    a 4-byte st.shared a register. Written as the options set, joined by "+" (pairs as
    "pairs-N", split as "split-N")."""

    no_dq_red: bool = False
    fast_exp: bool = False
    mask_branch: bool = False
    desc_add: bool = False
    persist: bool = False
    q128: bool = False
    stsm: bool = False
    pairs: int = 0
    split: int = 0

    def __str__(self) -> str:
        counts = ("pairs", "split")
        on = [f.replace("_", "-") for f in self.__dataclass_fields__ if f not in counts and getattr(self, f)]
        on += [f"{f}-{getattr(self, f)}" for f in counts if getattr(self, f)]
        return "+".join(on) or "base"

    @property
    def flags(self) -> tuple[str, ...]:
        """The -D options of the build: each loop option set to 0 or 1 (for every head dim in
        the module, in place of BwdBuild<D>'s), no_dq_red where it is on."""
        return (
            ("-DKL_ATTN_BWD_NO_DQ_RED=1",) * self.no_dq_red
            + tuple(
                f"-DKL_ATTN_BWD_{f.upper()}={int(getattr(self, f))}"
                for f in ("fast_exp", "mask_branch", "desc_add", "persist", "q128", "stsm")
            )
            + ("-DKL_ATTN_BWD_PARTS=1",) * (self.split > 1)
        )

    @property
    def exact(self) -> bool:
        """Whether the build computes every gradient (the lab checks only those)."""
        return not self.no_dq_red


_LEAN = BwdOpts(fast_exp=True, mask_branch=True, desc_add=True, persist=True, stsm=True)
Q128_HEAD_DIM = 64  # the head dim whose loop can take 128 query rows a step (BwdOpts.q128)
# The build each head dim runs, attention_sm90_bwd.cu's BwdBuild<D> (a test reads it back from
# the PTX), the fastest in lab/probe_bwd_builds.py on an H200 (benchmarks/NOTES.md): every
# option at D = 64 / 96 / 128; at D = 80 without desc_add; none at D = 256, where each one
# made the loop slower. Persistent at D <= 128: faster than one block an item at 12 of 14
# cases, the same at the other two (attn_bwd_builds-H200-edaa3c8-persist.jsonl). At D = 64
# query blocks of 128 rows: 7-29% faster than 64 at every shape timed
# (attn_bwd_builds-H200-362869f-q128.jsonl).
BWD_DEFAULTS = {
    64: replace(_LEAN, q128=True),
    80: BwdOpts(fast_exp=True, mask_branch=True, persist=True, stsm=True),
    96: _LEAN,
    128: _LEAN,
    256: BwdOpts(stsm=True),
}
MODULES = {d: Module(CU, options=(f"-DKL_ATTN_D={d}",), archs=("sm_90a",)) for d in BWD_HEAD_DIMS}
MODULE = Module(CU, archs=("sm_90a",))  # every head dim: "compiled, not run", `kernellab asm`
MODULE.asm_parts = {}  # backend -> the modules and variants it launches (filled at registration)
# The builds lab/gpu_attn_bwd_sm90.py and lab/probe_bwd_builds.py time beside each head dim's
# default: the default without dQ sums (a bound), the base and the other loop options. (mask_branch
# alone is left out: with exp2f's longer sequence in both copies of the loop ptxas serializes
# the wgmmas at D <= 128, C7511.)
_LOOP_BUILDS = (
    BwdOpts(),
    BwdOpts(fast_exp=True),
    BwdOpts(fast_exp=True, mask_branch=True),
    BwdOpts(desc_add=True),
    BwdOpts(fast_exp=True, desc_add=True),
    _LEAN,
)
# The loop builds take the head dim's grid (persistent or not), but for the base build, which
# is the kernel with no option at all; where the default is persistent, the default with one
# block an item comes last. (A persistent base build spills at D = 64, a persistent D = 256
# build too: neither is timed.)
# At D = 64 the default with the other query-block height (``q128``) too; where the default is
# persistent, the default with its items split over the group's q heads (``split``).


LAB_SPLIT = 4  # the split count of the lab's split builds (at most a group's q heads run)


def _lab_builds(d: int) -> tuple[BwdOpts, ...]:
    default = BWD_DEFAULTS[d]
    keep = dict(persist=default.persist, stsm=default.stsm)
    loop = (b if b == BwdOpts() else replace(b, **keep) for b in _LOOP_BUILDS)
    builds = (
        replace(default, no_dq_red=True),
        *(o for o in loop if o != default),
        *((replace(default, persist=False),) if default.persist else ()),
        *((replace(default, q128=not default.q128),) if d == Q128_HEAD_DIM else ()),
        *((replace(default, split=LAB_SPLIT),) if default.persist else ()),
    )
    return tuple(dict.fromkeys(builds))  # (each once: at D = 64 the flip is a loop build)


BWD_LAB = {d: _lab_builds(d) for d in BWD_HEAD_DIMS}
_LAB_MODULES: dict[tuple[int, BwdOpts], Module] = {}


def bwd_module(d: int, opts: BwdOpts | None = None) -> Module:
    """The module of head dim d built with ``opts``: MODULES[d] for its default (None or
    BWD_DEFAULTS[d]), else one with the options' -D flags (``BwdOpts.flags``; kept per
    (d, opts)). ``pairs`` is a launch argument: it takes no module of its own; ``split``
    one for every count above 1."""
    if opts is not None:
        opts = replace(opts, pairs=0, split=2 if opts.split > 1 else 0)
    if opts is None or opts == BWD_DEFAULTS[d]:
        return MODULES[d]
    if opts.q128 and d != Q128_HEAD_DIM:
        raise ValueError(f"attention/cuda: q128 builds are head dim {Q128_HEAD_DIM} only, not {d}")
    if opts.split and not opts.persist:
        raise ValueError("attention/cuda: split builds are persistent (the order table holds their items)")
    key = (d, opts)
    if key not in _LAB_MODULES:
        _LAB_MODULES[key] = Module(CU, options=(f"-DKL_ATTN_D={d}", *opts.flags), archs=("sm_90a",))
    return _LAB_MODULES[key]


SIG_MAIN = (  # ... Z, the item table, the item counter
    ("tmap",) * 4 + ("ptr",) * 5 + ("i32",) * 5 + ("f32", "f32", "i32") + ("i64",) * 6 + ("i32", "ptr", "ptr")
)
SIG_PRE = ("ptr",) * 7 + ("i32",) * 4 + ("i64",) * 6
SIG_POST = ("ptr",) * 2 + ("i32",) * 4 + ("f32",) + ("i64",) * 3
SIG_POST_BLK = ("ptr",) * 2 + ("i32",) * 5 + ("f32",) + ("i64",) * 3  # + NQ
PRE_ROWS = 8  # rows per preprocess block (a warp each)
POST_THREADS = 256
GRID_LIMIT = cs.GRID_LIMIT


def splits_d(d: int) -> bool:
    """Whether the two consumer warpgroups split the head dim (Cfg::DSPLIT, D = 256): a
    block of 64 keys, both warpgroups computing S^T and dP^T of them, warpgroup w owning
    columns [128 w, 128 w + 128) of dK, dV and dQ (2 x 128 dK / dV accumulators a thread
    over all 256 columns would not fit). Else each owns 64 of the block's 128 keys."""
    return d > 128


def block_n(d: int) -> int:
    """Keys per block of the main kernel (Cfg::BN): 128, 64 where ``splits_d``."""
    return 64 if splits_d(d) else 128


def bulk_dq(d: int, variant: str) -> bool:
    """Whether the variant sums dQ through shared memory and bulk reduce-adds (Bulk<D>::ON
    in v9): every head dim but 256."""
    return variant == "v9" and not splits_d(d)


def dq_cols(d: int) -> int:
    """dQ columns a consumer warpgroup sums per query block (Bulk<D>::NQ): D / 2 where the
    warpgroups split dQ's columns (``splits_dq``), else D."""
    return d // 2 if splits_dq(d) else d


def dq_chunk(d: int, variant: str) -> int:
    """Columns per chunk (NQ) of the blocked dQ accumulator (``dq_frag_offset``'s layout,
    which attn_bwd_post_blk converts), or 0 where the accumulator is row-major (attn_bwd_post):
    ``dq_cols`` where v9 stages dQ (``bulk_dq``); 64 (one dQ pass of float4 reductions) where
    ``splits_d``, in v8 and v9 alike; row-major in v8 below that."""
    if bulk_dq(d, variant):
        return dq_cols(d)
    return 64 if splits_d(d) else 0


def query_rows(d: int, opts: BwdOpts | None = None) -> int:
    """Query rows per step of the main loop (BwdBuild::BM) in head dim d's build ``opts``
    (None: BWD_DEFAULTS[d]): 128 where ``q128``, else 64."""
    return 2 * BM if (opts or BWD_DEFAULTS[d]).q128 and d == Q128_HEAD_DIM else BM


def dq_stage_bytes(d: int, variant: str) -> int:
    """Shared memory of v9's two fp32 dQ staging tiles (64 x ``dq_cols`` each); 0 else."""
    return 2 * 64 * dq_cols(d) * 4 if bulk_dq(d, variant) else 0


def stages(d: int, variant: str = "v8", bm: int | None = None) -> int:
    """Q / dO stages of the ring: 3 where they fit in 227 KB, else 2 (Smem::STAGES); ``bm``
    query rows a stage (None: the default build's, ``query_rows``)."""
    bm = bm or query_rows(d)
    fixed = 2 * block_n(d) * d * 2 + 4 * bm * 64 * 2 + 1024 + dq_stage_bytes(d, variant)
    return 3 if fixed + 3 * (2 * bm * d * 2 + 8 * bm) <= SMEM_LIMIT else 2


def smem_bytes(d: int, variant: str = "v8", bm: int | None = None) -> int:
    """Dynamic shared memory of a block (Smem::BYTES + 1 KB to align the base to 1024
    bytes): K and V (block_n x D x 2 B each), per stage Q and dO (bm x D x 2 B each) and
    lse + delta (8 bm B), four dS^T tiles (64 keys x bm queries x 2 B: two per consumer
    warpgroup); v9: the two dQ staging tiles. ``bm``: as ``stages``."""
    bm = bm or query_rows(d)
    return (
        1024
        + 2 * block_n(d) * d * 2
        + stages(d, variant, bm) * (2 * bm * d * 2 + 8 * bm)
        + 4 * bm * 64 * 2
        + dq_stage_bytes(d, variant)
    )


def dq_frag_offset(d: int, row: int, col: int, nq: int = 0) -> int:
    """Where v9 keeps dQ(row, col) of a query block (row < 64) within the block's 64 x D
    floats of the accumulator (dq_frag_index in the .cu, bwd_post_blocked's inverse): chunk
    col // NQ of 64 x NQ floats; in it, warp-major (16 rows of one warp contiguous), then
    float4 j = (col % NQ) // 8 of lane 4 g + q, element 2 hh + e, for row 16 warp + g + 8 hh
    and column 8 j + 2 q + e. NQ: ``nq`` (``dq_chunk``), else ``dq_cols`` (v9's)."""
    nq = nq or dq_cols(d)
    cc, warp, g, hh = col % nq, row // 16, row % 8, (row // 8) % 2
    j, q, e = cc // 8, (cc % 8) // 2, cc % 2
    return (col - cc) * 64 + warp * 16 * nq + j * 128 + (4 * g + q) * 4 + 2 * hh + e


def padded(s_q: int, bm: int = BM) -> int:
    """S_q rounded up to a whole query block of ``bm`` rows (``query_rows``): the rows of the
    lse, delta and dQ buffers."""
    return ceil_div(s_q, bm) * bm


def splits_dq(d: int) -> bool:
    """Whether the two consumer warpgroups split dQ = dS K by columns (each over the block's
    128 keys: D / 2 accumulators a row) rather than each summing its own 64 keys over all
    D columns: where D / 2 is whole slabs of the tile (D = 128), so a warpgroup's half of K
    is a plain MN-major operand. At D = 128 the unsplit dQ (64 more registers) made ptxas
    serialize the wgmmas. (Not where ``splits_d``: there each warpgroup's dQ columns are
    its own half of D.)"""
    return not splits_d(d) and (d // 2) % (cs.swizzle_bytes(d) // 2) == 0


L2_SHARE = 0.5  # the share of L2 a section's Q, dO and dQ accumulator may fill (``section_pairs``)


def section_pairs(h_kv: int, z: int, group: int, s_q: int, d: int, elem_bytes: int, n_kb: int, causal: bool,
                  l2: int, sms: int) -> int:  # fmt: skip
    """(k/v head, batch) pairs a section of the persistent item order holds at most
    (``item_order``'s sw), at least one, at most H_kv x Z:
    - no more than keep their query side (``group`` heads of Q and dO at ``elem_bytes`` an
      element and of the fp32 dQ accumulator, S_q x D each) within L2_SHARE of ``l2`` bytes
      of L2: the blocks at work at once walk the section's pairs, so these are the bytes they
      read and reduce-add into meanwhile;
    - no more than half the ``sms`` blocks take at once (``n_kb`` key blocks a pair): a
      pair's key blocks then run side by side, reading its Q and dO once from DRAM;
    - under causal masking with 4 or more key blocks a pair (items whose work differs
      4x and more), at least two waves of items (2 ``sms``): a section's first key blocks
      see every query, and the last section's must start early enough to end with the rest.
    (lab/probe_bwd_builds.py --pairs on an H200, benchmarks/NOTES.md.)"""
    fit = int(l2 * L2_SHARE) // (group * s_q * d * (2 * elem_bytes + 4))
    sw = min(fit, sms // (2 * n_kb))
    if causal and n_kb >= 4:
        sw = max(sw, ceil_div(2 * sms, n_kb))
    return max(1, min(h_kv * z, sw))


def item_order(h_kv: int, n_kb: int, z: int, sw: int) -> Tensor:
    """The persistent kernel's items, rows (k/v head, key block, batch), in the order it hands
    them out: the pairs hb = z H_kv + hk in ceil(H_kv Z / sw) sections of consecutive pairs,
    as even as they divide (section k: pairs [k H_kv Z // n, (k + 1) H_kv Z // n), so that
    no short last section leaves heavy causal items to the end), section by section; in a
    section the pair fastest, then the key block. sw = H_kv is the block-per-item grid's
    launch order (the k/v head fastest, then the key block, then the batch). The kernel
    reads it as a table (``order_table``)."""
    pairs = h_kv * z
    n = ceil_div(pairs, sw)  # sections
    hb = torch.arange(pairs, dtype=torch.int64).repeat_interleave(n_kb)
    nb = torch.arange(n_kb, dtype=torch.int64).repeat(pairs)
    k = ((hb + 1) * n - 1) // pairs  # hb's section
    first, end = k * pairs // n, (k + 1) * pairs // n
    pos = first * n_kb + nb * (end - first) + hb - first
    out = torch.empty(pairs * n_kb, 3, dtype=torch.int64)
    out[pos] = torch.stack((hb % h_kv, nb, hb // h_kv), 1)
    return out


SPLIT_GROUP_LIMIT = 127  # q heads a k/v head's group may have in a split build (nh's 7 bits)


def group_runs(group: int, parts: int) -> list[tuple[int, int]]:
    """The group's q heads cut into ``parts`` runs (first head h0, heads nh) as even as they
    divide: run p is [p group // parts, (p + 1) group // parts)."""
    return [(p * group // parts, (p + 1) * group // parts - p * group // parts) for p in range(parts)]


def split_items(items: Tensor, group: int, parts: int) -> Tensor:
    """Each of ``item_order``'s rows (k/v head, key block, batch) as ``parts`` consecutive
    items (k/v head, key block, batch, h0, nh), one a run of ``group_runs``; ``parts`` at
    most ``group``. A split build's kernel reads the rows as its table (``order_table``)."""
    if not 1 <= parts <= group <= SPLIT_GROUP_LIMIT:
        raise ValueError(
            f"attention/cuda: split {parts} of a group of {group} q heads "
            f"(1 <= split <= group <= {SPLIT_GROUP_LIMIT})"
        )
    runs = torch.tensor(group_runs(group, parts), dtype=torch.int64).repeat(len(items), 1)
    return torch.cat((items.repeat_interleave(parts, 0), runs), 1)


# split_count's cost model, in 64-row query steps of one q head (an item of nh heads and nq
# query blocks of bm rows is nh x nq x bm / 64 steps): an item's fixed work (its K and V
# loaded, dK and dV written), a split item's more (its partials added into fp32), and the
# gain a split must promise. Fitted to lab/probe_bwd_builds.py --split on an H200 at 64-256
# items (attn_bwd_builds-H200-e2c24f0-split.jsonl): it picks the fastest count measured at each.
SPLIT_ITEM_STEPS = 2.0
SPLIT_ADD_STEPS = 2.0
SPLIT_GAIN = 0.85
SPLIT_MAX = 8  # counts tried: 1 .. min(group, SPLIT_MAX)


def item_steps(items: Tensor, s_q: int, s_k: int, bn: int, bm: int, causal: bool) -> list[float]:
    """Each of ``item_order``'s or ``split_items``' rows' work in 64-row steps of one q head
    (``schedule``'s query blocks a key block visits, times the run's heads: all the group's,
    which the caller passes as the run where unsplit)."""
    off, nq_all = s_k - s_q, ceil_div(s_q, bm)
    out = []
    for nb, nh in zip(items[:, 1].tolist(), items[:, 4].tolist()):
        first = max(0, nb * bn - off) if causal else 0
        out.append(nh * (nq_all - first // bm if first < s_q else 0) * bm / 64)
    return out


def makespan(work: list[float], sms: int) -> float:
    """The persistent grid's end, items taken in order by whichever of min(items, sms) blocks
    is free first (the kernel's counter)."""
    free = [0.0] * max(1, min(len(work), sms))
    for w in work:
        heapq.heapreplace(free, free[0] + w)
    return max(free)


def split_count(items: Tensor, group: int, s_q: int, s_k: int, d: int, bm: int, causal: bool,
                sms: int) -> int:  # fmt: skip
    """The split count (``BwdOpts.split``) the default build runs at: where the (key block,
    k/v head, batch) ``items`` (``item_order``'s) number fewer than two waves of ``sms``, the
    count of 1 .. min(group, SPLIT_MAX) whose items' ``makespan`` (SPLIT_ITEM_STEPS an item,
    SPLIT_ADD_STEPS more a split one) is least, if it is below SPLIT_GAIN of the unsplit
    grid's; else 1. Few k/v heads (Qwen2.5-0.5B's 2) or short causal sequences, whose items
    leave SMs idle or end on the long causal ones."""
    if len(items) >= 2 * sms or group < 2:
        return 1
    bn = block_n(d)

    def span(parts: int) -> float:
        rows = split_items(items, group, parts)
        extra = SPLIT_ITEM_STEPS + SPLIT_ADD_STEPS * (parts > 1)
        return makespan([w + extra for w in item_steps(rows, s_q, s_k, bn, bm, causal)], sms)

    spans = {parts: span(parts) for parts in range(1, min(group, SPLIT_MAX) + 1)}
    best = min(spans, key=spans.get)
    return best if spans[best] < SPLIT_GAIN * spans[1] else 1


def order_table(items: Tensor, blocks: int) -> Tensor:
    """``item_order``'s rows as the kernel's int32 pairs {hk | nb << 16, z} (bwd_item in the
    .cu; hk and nb are below GRID_LIMIT, 2^16), or ``split_items``' as {hk | nb << 16, z |
    h0 << 16 | nh << 24}, then ``blocks`` end entries {0, -1} (each block of the grid claims
    one item past the last), shape (items + blocks, 2)."""
    second = items[:, 2] if items.shape[1] == 3 else items[:, 2] | items[:, 3] << 16 | items[:, 4] << 24
    table = torch.stack((items[:, 0] | items[:, 1] << 16, second), 1)
    end = torch.tensor([[0, -1]], dtype=table.dtype).expand(blocks, 2)
    return torch.cat((table, end)).to(torch.int32)


def backward_kernel(d: int) -> str:
    """Which backward runs at head dim d: "cuda" (attention_sm90_bwd.cu) at every head dim
    the backend takes; "triton" (the FlashAttention-2 backward) where none is built."""
    return "cuda" if d in BWD_HEAD_DIMS else "triton"


def backward(
    do: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    o: Tensor,
    lse: Tensor,
    causal: bool,
    scale: float,
    variant: str = "v8",
    opts: BwdOpts | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) in ``empty_bshd``'s layout from the saved o and lse ((..., S_q) fp32,
    log2 units: the forward's), by the variant's kernels (``VARIANTS``; ``opts``: a lab
    build, ``BwdOpts``; None: the head dim's, BWD_DEFAULTS). As the forward, everything but
    the addresses is worked out once per (shapes, strides, dtype, device, options) into a
    ``BwdPlan`` (``_plan_backward``, cached in ``PLANS``)."""
    key = (do.shape, do.stride(), q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(),
           o.shape, o.stride(), lse.shape, lse.stride(), q.dtype, q.device, causal, scale, variant,
           opts, torch.are_deterministic_algorithms_enabled())  # fmt: skip
    p = kept_plan(PLANS, key, lambda: _plan_backward(do, q, k, v, o, lse, causal, scale, variant, opts))
    if p.triton:
        return at.backward(do, q, k, v, o, lse, causal, scale)
    if p.copy or (
        p.launch is not None
        and (do.data_ptr() | q.data_ptr() | k.data_ptr() | v.data_ptr() | o.data_ptr()) & 15
    ):  # contiguous, aligned copies: a plan of their own
        do, q, k, v = (cs._whole(t, True) for t in (do, q, k, v))
        return backward(do, q, k, v, cs._whole(o, False), lse.contiguous(), causal, scale, variant, opts)
    dev = q.device
    (sq, tq), (sk, tk), (sv, tv) = p.grads
    dq = torch.empty_strided(sq, tq, dtype=q.dtype, device=dev)
    dk = torch.empty_strided(sk, tk, dtype=k.dtype, device=dev)
    dv = torch.empty_strided(sv, tv, dtype=v.dtype, device=dev)
    if p.launch is None:  # nothing to sum: every gradient is zero
        return dq.zero_(), dk.zero_(), dv.zero_()
    lse_p = torch.empty(p.pad, dtype=torch.float32, device=dev)
    delta_p = torch.empty(p.pad[0] * p.pad[1] + 1, dtype=torch.float32, device=dev)  # + the item counter
    dq_acc = torch.empty(p.acc, dtype=torch.float32, device=dev)
    # a split group: the items add fp32 partials into buffers (one zeroing), rounded into dk, dv after
    kv = torch.zeros((2, *p.kv_acc), dtype=torch.float32, device=dev).unbind() if p.kv_acc else [dk, dv]
    p.launch(do, q, k, v, o, lse, dq, *kv, lse_p, delta_p, dq_acc)
    if p.kv_acc:
        dk.copy_(kv[0].view(dk.shape))
        dv.copy_(kv[1].view(dv.shape))
    return dq, dk, dv


@dataclass(frozen=True)
class BwdPlan:
    """``backward``'s launches worked out for one (shapes, strides, dtype, device, options):
    ``grads`` the (size, stride) of dq, dk, dv (empty_bshd's), ``pad`` the size of the padded
    lse buffer (the delta buffer is as many floats, then the main kernel's int32 item counter,
    which the preprocess zeroes), ``acc`` of the fp32 dQ accumulator; ``launch(do, q, k, v, o, lse,
    dq, dk, dv, lse_p, delta_p, dq_acc)`` the three kernels with everything but the addresses
    bound (None: nothing to sum); ``copy``: an input must be copied first; ``triton``: the
    head dim has no CUDA backward (``backward_kernel``); ``kv_acc`` (a split build) the size
    (Z, H_kv, S_k, D) of the fp32 dK and dV buffers its items add into, which the launch
    takes in dk's and dv's place."""

    grads: tuple = ()
    pad: tuple = ()
    acc: tuple = ()
    launch: object = None
    copy: bool = False
    triton: bool = False
    kv_acc: tuple = ()


PLANS: dict = {}  # backward plans by (shapes, strides, dtype, device, options): kept_plan's


def _l2(dev: int) -> int:
    return l2_bytes(dev) or 50 * 2**20  # (no GPU: the CPU tests' plans, an H100 / H200's)


def _plan_backward(do, q, k, v, o, lse, causal, scale, variant, opts=None) -> BwdPlan:
    """The ``BwdPlan`` of ``backward`` at these tensors' shapes and strides (and its
    refusals, ValueError naming the argument)."""
    if variant not in VARIANTS:
        raise ValueError(f"attention/cuda: backward variant must be one of {VARIANTS}, got {variant!r}")
    s_q, s_k, d = q.shape[-2], k.shape[-2], q.shape[-1]
    if backward_kernel(d) != "cuda":
        return BwdPlan(triton=True)
    metas = [at.empty_bshd(t.shape[:-2], t.shape[-2], d, t.dtype, "meta") for t in (q, k, v)]
    grads = tuple((tuple(m.shape), m.stride()) for m in metas)
    q4, k4, v4, do4, o4 = (at._split(t) for t in (q, k, v, do, o))
    dq4, dk4, dv4 = (at._split(m) for m in metas)
    z, h, h_kv = q4.shape[0], q4.shape[1], k4.shape[1]
    if not (z and h and s_q and s_k):
        return BwdPlan(grads)
    bn = block_n(d)
    if h > GRID_LIMIT or z > GRID_LIMIT or ceil_div(s_k, bn) > GRID_LIMIT:
        raise ValueError(
            f"attention/cuda_{variant}: q folds to {z} batches x {h} heads and k to {ceil_div(s_k, bn)} "
            f"blocks of {bn} keys; each must be at most {GRID_LIMIT} (CUDA grid y and z)"
        )
    if not (
        all(cs.in_place(t, True) for t in (q, k, v, do)) and cs.in_place(o, False) and lse.is_contiguous()
    ):
        return BwdPlan(grads, copy=True)
    bm = query_rows(d, opts)
    s_pad = padded(s_q, bm)
    dev = cs._device_index(q)
    sfx = DTYPE_SUFFIX[q.dtype]
    build, group = opts or BWD_DEFAULTS[d], h // h_kv
    n_kb = ceil_div(s_k, bn)
    items = None  # the persistent grid's (key block, k/v head, batch) items, in order
    if build.persist:
        sw = build.pairs or section_pairs(h_kv, z, group, s_q, d, q.element_size(), n_kb, causal, _l2(dev),
                                          sm_count(dev))  # fmt: skip
        items = item_order(h_kv, n_kb, z, sw)
        if build == BWD_DEFAULTS[d] and not torch.are_deterministic_algorithms_enabled():
            # the default's split count (split_count; 1: the default module)
            build = replace(build, split=split_count(items, group, s_q, s_k, d, bm, causal, sm_count(dev)))
    parts = min(build.split, group) if build.split > 1 else 1
    mod = bwd_module(d, replace(build, split=parts))  # (a group of one: the unsplit module)
    pre = mod.kernel(f"attn_bwd_pre_{sfx}", SIG_PRE, dev)
    main = mod.kernel(f"attn_bwd_{variant}_d{d}_{sfx}", SIG_MAIN, dev)
    shared = smem_bytes(d, variant, bm)
    if shared > main.max_dynamic_shared:
        main.set_max_dynamic_shared(shared)
    g_pre, pre_args = (s_pad // PRE_ROWS, h, z), (s_q, s_pad, h, d, *o4.stride()[:3], *do4.stride()[:3])
    if build.persist:  # items (key block, k/v head, batch[, run of q heads]), one block an SM at most
        g_main = (min(h_kv * n_kb * z * parts, sm_count(dev)), 1, 1)
    else:
        g_main = (h_kv, ceil_div(s_k, bn), z)  # heads fastest: heavy causal blocks first
    mq, mk, mv, mdo = cs._map_args(q4, bm), cs._map_args(k4, bn), cs._map_args(v4, bn), cs._map_args(do4, bm)
    kv_acc = (z, h_kv, s_k, d) if parts > 1 else ()
    kv_strides = (h_kv * s_k * d, s_k * d, d) * 2 if kv_acc else (*dk4.stride()[:3], *dv4.stride()[:3])
    main_args = (s_q, s_k, s_pad, h, h // h_kv, float(scale), float(scale) * LOG2E, int(causal),
                 *kv_strides, z)  # fmt: skip
    order = 0  # the persistent grid's item table (kept by the plan), else none
    if build.persist:
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"attention/cuda_{variant}: the first backward at these shapes ran inside CUDA-graph "
                "capture; run it once before capturing (its plan copies an item table to the GPU)"
            )
        if kv_acc:
            items = split_items(items, group, parts)
        order = order_table(items, g_main[0]).to(q.device)
    nq = dq_chunk(d, variant)
    if nq:  # the accumulator in the blocked order (dq_frag_offset): a float4 a thread
        post = mod.kernel(f"attn_bwd_post_blk_{sfx}", SIG_POST_BLK, dev)
        g_post = (ceil_div(s_pad * d // 4, POST_THREADS), h, z)
        post_args = (s_q, s_pad, h, d, nq, float(scale), *dq4.stride()[:3])
    else:
        post = mod.kernel(f"attn_bwd_post_{sfx}", SIG_POST, dev)
        g_post = (ceil_div(s_q * d // 2, POST_THREADS), h, z)
        post_args = (s_q, s_pad, h, d, float(scale), *dq4.stride()[:3])

    counter = 4 * z * h * s_pad  # the item counter's byte offset in the delta buffer

    def launch(do, q, k, v, o, lse, dq, dk, dv, lse_p, delta_p, dq_acc):
        sched = delta_p.data_ptr() + counter
        pre(g_pre, 32 * PRE_ROWS, o, do, lse, lse_p, delta_p, dq_acc, sched, *pre_args, device_index=dev)
        tmap = cs.tensor_map
        main(
            g_main, THREADS,
            tmap(q.data_ptr(), *mq), tmap(k.data_ptr(), *mk), tmap(v.data_ptr(), *mv), tmap(do.data_ptr(), *mdo),
            lse_p, delta_p, dq_acc, dk, dv, *main_args, order, sched,
            shared=shared, device_index=dev,
        )  # fmt: skip
        post(g_post, POST_THREADS, dq_acc, dq, *post_args, device_index=dev)

    return BwdPlan(grads, (z * h, s_pad), (z * h, s_pad, d), launch, kv_acc=kv_acc)


# --------------------------------------------------------------------------- the kernel's math in PyTorch


def schedule(
    s_q: int, s_k: int, causal: bool, group: int = 1, d: int = 128, bm: int | None = None
) -> list[tuple[int, list[tuple[int, int, tuple[bool, ...]]]]]:
    """The main kernel's blocks of one k/v head (blockIdx.y = 0, 1, ...) as key_block
    derives them: (first key n0, [(q head in the group, first query row m0, masked per
    64-key group)] in loop order). A block (``block_n`` keys) visits, per q head of its
    group, the query blocks (``bm`` rows; None: the default build's, ``query_rows``) from the
    one holding the first row that sees key n0 (causal:
    n0 - (S_k - S_q)) to the last; the keys [n0 + 64 w, n0 + 64 w + 64) (w = 0, 1: one per
    consumer warpgroup; w = 0 alone where ``splits_d``) are masked where they pass S_k or
    their last key passes the query block's first row's causal limit."""
    off, bn, bm = s_k - s_q, block_n(d), bm or query_rows(d)
    out = []
    for n0 in range(0, s_k, bn):
        first = max(0, n0 - off) if causal else 0
        m_begin = first // bm
        per = ceil_div(s_q, bm) - m_begin if first < s_q else 0
        steps = []
        for it in range(group * per):
            g, m0 = it // per, (m_begin + it % per) * bm
            masked = tuple(
                n0 + k0 + 64 > s_k or (causal and n0 + k0 + 63 > m0 + off) for k0 in range(0, bn, 64)
            )
            steps.append((g, m0, masked))
        out.append((n0, steps))
    return out


def emulate_backward(
    do: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    o: Tensor,
    lse: Tensor,
    causal: bool,
    scale: float,
    bm: int | None = None,
    split: int = 1,
) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) computed as the kernels compute them, in PyTorch: delta = rowsum(dO *
    O) in fp32 from the 16-bit o and dO; lse = +inf for rows that see no key; per block of
    ``schedule`` and per warpgroup of 64 keys: fp32 S^T and dP^T from the 16-bit inputs,
    P^T = 2^(S^T c - lse) zeroed at masked places only in the steps ``schedule`` marks, P^T
    rounded to the input dtype before dV += P^T dO, dS^T = P^T (dP^T - delta) (P in fp32)
    rounded before dK += dS^T Q and dQ += dS K (fp32 accumulators; dQ per warpgroup or, where
    ``splits_dq`` or the query blocks are 128 rows, per block); dK scaled once, dQ scaled and
    rounded once. ``bm``: query rows a step (None: the default build's, ``query_rows``);
    ``split`` (a split build's count, ``BwdOpts.split``): dK and dV summed per run of the
    group's q heads (``split_items``), each run's dK scaled, the runs added in fp32 in run
    order (the kernel's fp32 reductions add them in any order), then rounded."""
    lead, s_q, s_k, d = q.shape[:-2], q.shape[-2], k.shape[-2], q.shape[-1]
    q4, k4, v4, do4, o4 = (at._split(t) for t in (q, k, v, do, o))
    z, h, h_kv = q4.shape[0], q4.shape[1], k4.shape[1]
    group = h // h_kv if h_kv else 1
    dt, dev = q.dtype, q.device
    c = scale * LOG2E
    off = s_k - s_q
    bm = bm or query_rows(d)
    s_pad = padded(s_q, bm)
    lse4 = lse.reshape(z, h, s_q).float()
    lse_p = torch.full((z, h, s_pad), float("inf"), device=dev)
    lse_p[:, :, :s_q] = torch.where(torch.isneginf(lse4), torch.full_like(lse4, float("inf")), lse4)
    delta_p = torch.zeros((z, h, s_pad), device=dev)
    delta_p[:, :, :s_q] = (do4.float() * o4.float()).sum(-1)
    qp = torch.zeros((z, h, s_pad, d), device=dev)
    dop = torch.zeros_like(qp)
    qp[:, :, :s_q], dop[:, :, :s_q] = q4.float(), do4.float()
    bn = block_n(d)
    n_pad = ceil_div(s_k, bn) * bn
    kp = torch.zeros((z, h_kv, n_pad, d), device=dev)
    vp = torch.zeros_like(kp)
    kp[:, :, :s_k], vp[:, :, :s_k] = k4.float(), v4.float()
    dq_acc = torch.zeros((z, h, s_pad, d), device=dev)
    parts = min(split, group) if split > 1 else 1
    run_of = [p for p, (_, nh) in enumerate(group_runs(group, parts)) for _ in range(nh)]
    dk_runs = torch.zeros((parts, z, h_kv, n_pad, d), device=dev)
    dv_runs = torch.zeros_like(dk_runs)
    heads = torch.arange(h_kv, device=dev) * group
    dq_by_block = splits_dq(d) or bm != BM
    for n0, steps in schedule(s_q, s_k, causal, group, d, bm):
        for g, m0, masked in steps:
            hq = heads + g  # the q head of each k/v head at this step
            qb, dob = qp[:, hq, m0 : m0 + bm], dop[:, hq, m0 : m0 + bm]
            lb, db = lse_p[:, hq, m0 : m0 + bm], delta_p[:, hq, m0 : m0 + bm]
            ds_block = []
            for w in range(bn // 64):  # 64-key groups (splits_d: one, both warpgroups on it)
                k0 = n0 + 64 * w
                kw, vw = kp[:, :, k0 : k0 + 64], vp[:, :, k0 : k0 + 64]
                st = kw @ qb.transpose(-1, -2)  # (Z, H_kv, 64 keys, 64 queries)
                dpt = vw @ dob.transpose(-1, -2)
                pt = torch.exp2(st * c - lb[:, :, None, :])
                if masked[w]:
                    key = torch.arange(k0, k0 + 64, device=dev)[:, None]
                    col = torch.arange(m0, m0 + bm, device=dev)[None, :]
                    bad = key >= s_k
                    if causal:
                        bad = bad | (key > col + off)
                    pt = pt.masked_fill(bad, 0.0)
                dk, dv = dk_runs[run_of[g]], dv_runs[run_of[g]]
                dv[:, :, k0 : k0 + 64] += pt.to(dt).float() @ dob
                dst = (pt * (dpt - db[:, :, None, :])).to(dt).float()
                dk[:, :, k0 : k0 + 64] += dst @ qb
                if dq_by_block:
                    ds_block.append(dst)
                else:
                    dq_acc[:, hq, m0 : m0 + bm] += dst.transpose(-1, -2) @ kw
            if dq_by_block:  # one sum over the block's 128 keys (each warpgroup's half of the columns)
                dst = torch.cat(ds_block, dim=-2)
                dq_acc[:, hq, m0 : m0 + bm] += dst.transpose(-1, -2) @ kp[:, :, n0 : n0 + bn]
    dq = (dq_acc[:, :, :s_q] * scale).to(dt).reshape(tuple(lead) + (s_q, d))
    dk, dv = dk_runs[0] * scale, dv_runs[0]
    for r in range(1, parts):
        dk, dv = dk + dk_runs[r] * scale, dv + dv_runs[r]
    dk = dk[:, :, :s_k].to(k.dtype).reshape(tuple(k.shape[:-2]) + (s_k, d))
    dv = dv[:, :, :s_k].to(v.dtype).reshape(tuple(v.shape[:-2]) + (s_k, d))
    return dq, dk, dv


# --------------------------------------------------------------------------- custom ops (the kit)


def _fwd(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float) -> tuple[Tensor, Tensor]:
    return cs.forward(q, k, v, causal, scale, FWD_VARIANT)


def _opcheck_bwd(make):
    q, k, v = make(0), make(0), make(0)
    o, lse = _fwd(q, k, v, True, 0.125)
    return (make(0), q, k, v, o, lse, True, 0.125)


def _build(variant: str):
    """The custom ops (forward: v7's; backward: the variant's kernels) of cuda_<variant>."""

    def _bwd(
        do: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, causal: bool, scale: float
    ) -> tuple[Tensor, Tensor, Tensor]:
        return backward(do, q, k, v, o, lse, causal, scale, variant)

    return cs.declare(variant, _fwd, _bwd, _opcheck_bwd)


_BUILT = {variant: _build(variant) for variant in VARIANTS}


def _entry(backend: str, variant: str):
    return cs.entry(_BUILT[variant], backend)


_DESCRIPTIONS = {
    "v8": (
        "CUDA v8 (sm_90): cuda_v7's forward; FlashAttention-3's backward: TMA producer, two consumer "
        "warpgroups of 64 keys (D 256: of half the head dim), K/V resident, dK/dV in registers over the "
        "group's q heads, dQ by fp32 vector atomics"
    ),
    "v9": (
        "CUDA v9 (sm_90): cuda_v8 with dQ staged in shared memory and added by one bulk reduce-add "
        "(cp.reduce.async.bulk) per warp and query block instead of per-thread atomics (D <= 128)"
    ),
}
BACKEND = "cuda_v8"
attention = _entry(BACKEND, "v8")
attention_v9 = _entry("cuda_v9", "v9")

# ``cuda`` is the fastest Hopper variant (as matmul's ``cuda`` is its ladder's best): the tune
# and vendor_gap time no numbered rung, so this is the name under which they time ours.
for _backend, _fn, _desc in (
    (BACKEND, attention, _DESCRIPTIONS["v8"]),
    ("cuda_v9", attention_v9, _DESCRIPTIONS["v9"]),
    (
        "cuda",
        _entry("cuda", CUDA_VARIANT),
        f"CUDA (sm_90): the fastest Hopper variant, {CUDA_VARIANT} ("
        + _DESCRIPTIONS[CUDA_VARIANT].split(": ", 1)[1]
        + ")",
    ),
):
    # `kernellab asm`: the forward (cuda_v7's, in attention_sm90.cu) beside the backward's
    # variant and its pre / post kernels
    variant = CUDA_VARIANT if _backend == "cuda" else _backend.removeprefix("cuda_")
    MODULE.asm_parts[_backend] = [(cs.MODULE, ("cuda_v7",)), (MODULE, (f"cuda_{variant}", "cuda"))]
    register(
        "attention",
        _backend,
        devices=("cuda",),
        available=sm90_unavailable,
        precompile=MODULE.precompile,  # (the forward's module is cuda_v7's, compiled there)
        custom_ops=_fn.custom_ops,
        builtin=True,
        module=MODULE,
        limits=cs._limits_of(_backend),
        dtypes=DTYPES,
        description=_desc,
    )(_fn)
