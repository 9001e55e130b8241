"""Histogram in CUDA C++ (histogram.cu, compiled by NVRTC): launchers, custom ops,
registrations.

``cuda_v1`` .. ``cuda_v7`` are the lecture's steps (the list at the top of histogram.cu);
``cuda`` is the best of them (``best_variant``): v3 (coarsened; the fastest rung measured,
on uniform and skewed keys alike) while a uint32 private histogram fits in 48 KB of shared
memory (bins <= SHARED_BINS); past that v6 (16-bit counters, 65536 bins in 128 KB) where it
fits, then v7 (the bins split over a thread-block cluster, up to 2^17 bins) on sm_90 and
later, v1's global atomics where neither fits. The privatized rungs refuse bins past what
they hold (``Impl.limits``), so the ladder compares like with like.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from kernellab.core.kit import OpDecl, build
from kernellab.core.registry import register
from kernellab.cuda.runtime import (
    CHECK_ARCHS,
    Module,
    _get_device,
    capability_unavailable,
    nvrtc_unavailable,
    sm_count,
)

# histogram.cu compiles as two modules: v1-v5, and v6-v7 (KL_HIST_LARGE), whose compile a
# call of v1-v5 does not wait for (the two large rungs take as long to compile as the five).
MODULE = Module(Path(__file__).with_name("histogram.cu"))
MODULE_LARGE = Module(MODULE.path, options=("-DKL_HIST_LARGE",))
LARGE = ("v6", "v7")
# `kernellab asm histogram --backend cuda`: the small-histogram kernels `cuda` picks among
MODULE.asm_aliases = {"cuda": ("cuda_v1", "cuda_v3")}

THREADS = 256  # v1-v5's block size (v2 counts one key per thread)
# v6 and v7: one 1024-thread block per SM where the private histogram is large (v6's 128 KB
# leaves room for one block anyway). 32 warps x U x 16 B = 64 KB of loads in flight per SM,
# over twice what an H100 needs to stream at full bandwidth; fewer, larger blocks mean fewer
# private copies to merge into the output.
WIDE_THREADS = 1024
U = 4  # 16-byte packs per thread and loop step (histogram.cu's U)
BLOCKS_PER_SM = 8  # at most 8 x 256 threads = 2048, a full H100 SM
# The private histogram is bins x 4 bytes of dynamic shared memory. 48 KB is what every
# kernel may take without opting in: 12288 bins. (Hopper's 227 KB would take 58k bins,
# at one block per SM; 65536 bins do not fit anywhere.)
SHARED_BINS = 12288
# v6: two 16-bit counters per word, 65536 bins in 128 KB (an A100 allows 163 KB per block).
PACKED_BINS = 65536
# v7: a cluster of C blocks holds ceil(bins / C) uint32 bins each; 2^17 bins are 64 KB per
# block at C = 8 (the portable cluster size), 32 KB at C = 16.
CLUSTER_BINS = 1 << 17
CLUSTER_SIZES = (2, 4, 8, 16)  # powers of two (the kernel maps bin b to block b % C with a mask)
# The default C is the smallest whose slices fit this many bytes: smaller clusters send
# fewer keys to another SM (docs/histogram.md has the measured sizes).
CLUSTER_SLICE = 128 * 1024
SUFFIX = {torch.uint8: "u8", torch.int32: "i32", torch.int64: "i64"}
# The most bins each privatized rung holds (its limits refuse more)
MAX_BINS = {"v2": SHARED_BINS, "v3": SHARED_BINS, "v4": SHARED_BINS, "v5": SHARED_BINS,
            "v6": PACKED_BINS, "v7": CLUSTER_BINS}  # fmt: skip
PRIVATE = tuple(MAX_BINS)  # the rungs with a shared-memory histogram
_KERNELS: dict = {}


def _kernel(name: str, dtype, dev: int):
    key = (name, dtype, dev)
    k = _KERNELS.get(key)
    if k is None:
        scalar = name in ("hist_v1", "hist_v2")  # (x, out, n, bins); v3-v7 take head before bins
        sig = ("ptr", "ptr", "i64", "i32") if scalar else ("ptr", "ptr", "i64", "i64", "i32")
        module = MODULE_LARGE if name.split("_")[1] in LARGE else MODULE
        k = _KERNELS[key] = module.kernel(f"{name}_{SUFFIX[dtype]}", sig, dev)
    return k


_RESIDENT: dict = {}


def _resident_blocks(kernel, smem: int, threads: int = THREADS) -> int:
    """Blocks of ``threads`` with ``smem`` bytes of dynamic shared memory that fit on one SM
    (the driver's occupancy answer): the coarsened grid is one wave of them. Falls back to
    2 (always resident at <= 48 KB of shared memory and <= 128 registers) for 256 threads,
    1 for larger blocks."""
    key = (kernel, smem, threads)
    n = _RESIDENT.get(key)
    if n is None:
        n = 2 if threads <= THREADS else 1
        try:
            from cuda.bindings import driver

            err, got = driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(
                driver.CUfunction(kernel._handle), threads, smem
            )
            if int(err) == 0 and int(got) > 0:
                n = min(int(got), BLOCKS_PER_SM)
        except Exception:  # noqa: BLE001 - an older binding, a CUkernel handle: the fallback
            pass
        _RESIDENT[key] = n
    return n


_CLUSTERS: dict = {}


def _active_clusters(kernel, cluster: int, smem: int, dev: int) -> int:
    """Clusters of ``cluster`` blocks that run at once (the driver's answer; whole clusters
    must fit on one GPC). Falls back to one block per SM."""
    key = (kernel, cluster, smem)
    n = _CLUSTERS.get(key)
    if n is None:
        try:
            n = kernel.max_active_clusters(WIDE_THREADS, cluster, smem)
        except Exception:  # noqa: BLE001 - an old driver: the estimate
            n = sm_count(dev) // cluster
        if n < 1:
            raise ValueError(
                f"histogram cuda_v7: a cluster of {cluster} blocks with {smem} B of shared memory each "
                "cannot run on this GPU; use a smaller cluster"
            )
        _CLUSTERS[key] = n
    return n


@functools.cache
def _device_facts(dev: int) -> tuple[tuple[int, int], int]:
    """(compute capability, most dynamic shared memory one block may opt in to) of ``dev``."""
    props = torch.cuda.get_device_properties(dev)
    optin = int(getattr(props, "shared_memory_per_block_optin", 0) or 48 * 1024)
    return (props.major, props.minor), optin


def packed_bytes(bins: int) -> int:
    """v6's shared memory: two 16-bit counters per 4-byte word."""
    return (bins + 1) // 2 * 4


def default_cluster(bins: int) -> int:
    """v7's cluster size when none is asked for: the smallest power of two (at least 2, at
    most 8, the portable size) whose slices of ceil(bins / C) uint32 bins fit CLUSTER_SLICE
    bytes. 65536 bins: 2 blocks of 128 KB. Larger clusters merge fewer copies of the
    histogram into the output but send a larger share of the keys to another SM."""
    c = 2
    while c < 8 and -(-bins // c) * 4 > CLUSTER_SLICE:
        c *= 2
    return c


def best_variant(bins: int, capability: tuple[int, int], optin_bytes: int) -> str:
    """The rung ``cuda`` runs: v3 while a uint32 private histogram fits the default 48 KB;
    past it v6 where its packed histogram fits what a block may opt in to (``optin_bytes``;
    faster than v7 where both fit, docs/histogram.md), else v7 on sm_90+ (clusters), else
    v1's global atomics."""
    if bins <= SHARED_BINS:
        return "v3"
    if bins <= PACKED_BINS and packed_bytes(bins) <= optin_bytes:
        return "v6"
    if tuple(capability) >= (9, 0) and bins <= CLUSTER_BINS:
        return "v7"
    return "v1"


def _head(x: torch.Tensor) -> int:
    """Keys before the first 16-byte aligned address of x (0 when aligned)."""
    es = x.element_size()
    return min(((16 - (x.data_ptr() & 15)) & 15) // es, x.numel())


def _check_options(variant: str, cluster, grid, aggregate) -> None:
    if cluster is not None and (variant != "v7" or cluster not in CLUSTER_SIZES):
        raise ValueError(
            f"histogram cuda_{variant}: cluster must be one of {CLUSTER_SIZES} (v7 only), got {cluster!r}"
        )
    if grid is not None and (
        variant not in ("v3", "v4", "v5", "v6", "v7") or not isinstance(grid, int) or grid < 1
    ):
        raise ValueError(
            f"histogram cuda_{variant}: grid must be a positive int of blocks (v3-v7), got {grid!r}"
        )
    if aggregate is not None and variant != "v7":
        raise ValueError(f"histogram cuda_{variant}: aggregate is an option of v7 only")


def histogram_cuda(
    x: torch.Tensor,
    bins: int,
    variant: str,
    *,
    cluster: int | None = None,
    grid: int | None = None,
    aggregate: bool | None = None,
) -> torch.Tensor:
    """Counts of ``x``'s keys in [0, bins) by rung ``variant`` ("v1".."v7", "best").

    Tuning options (lab sweeps; the registered backends use the defaults): ``cluster``, v7's
    blocks per cluster (CLUSTER_SIZES; default ``default_cluster``); ``grid``, blocks
    launched (v3-v7; v7 rounds it down to whole clusters; default one resident wave, fewer
    for small inputs); ``aggregate``, v7's warp aggregation before the remote atomic (v5's
    ballot rounds; default on)."""
    _check_options(variant, cluster, grid, aggregate)
    if variant in PRIVATE and bins > MAX_BINS[variant]:
        raise ValueError(_too_many(bins, variant))
    x = x.contiguous()  # strided / expanded: pack first
    n = x.numel()
    out = torch.zeros(bins, dtype=torch.int64, device=x.device)
    if n == 0:
        return out
    dev = x.device.index
    if dev != _get_device():
        with torch.cuda.device(dev):
            return histogram_cuda(x, bins, variant, cluster=cluster, grid=grid, aggregate=aggregate)
    if variant == "best":
        variant = best_variant(bins, *_device_facts(dev))
    if variant == "v1":
        _kernel("hist_v1", x.dtype, dev)(-(-n // THREADS), THREADS, x, out, n, bins)
        return out
    smem = bins * 4
    if variant == "v2":
        _kernel("hist_v2", x.dtype, dev)(-(-n // THREADS), THREADS, x, out, n, bins, shared=smem)
        return out
    packs = n * x.element_size() // 16
    if variant == "v6":
        return _launch_v6(x, out, n, bins, dev, packs, grid)
    if variant == "v7":
        return _launch_v7(x, out, n, bins, dev, packs, cluster, grid, aggregate)
    k = _kernel(f"hist_{variant}", x.dtype, dev)
    wave = _resident_blocks(k, smem) * sm_count(dev)
    g = grid or max(1, min(-(-packs // (THREADS * U)), wave))
    k(g, THREADS, x, out, n, _head(x), bins, shared=smem)
    return out


def _launch_v6(x, out, n, bins, dev, packs, grid):
    smem = packed_bytes(bins)
    optin = _device_facts(dev)[1]
    if smem > optin:
        raise ValueError(
            f"histogram cuda_v6: bins={bins} needs {smem} B of shared memory; this GPU allows {optin} B"
        )
    k = _kernel("hist_v6", x.dtype, dev)
    k.set_max_dynamic_shared(smem)
    wave = _resident_blocks(k, smem, WIDE_THREADS) * sm_count(dev)
    g = grid or max(1, min(-(-packs // (WIDE_THREADS * U)), wave))
    k(g, WIDE_THREADS, x, out, n, _head(x), bins, shared=smem)
    return out


def _launch_v7(x, out, n, bins, dev, packs, cluster, grid, aggregate):
    c = cluster or default_cluster(bins)
    smem = -(-bins // c) * 4
    optin = _device_facts(dev)[1]
    if smem > optin:
        raise ValueError(
            f"histogram cuda_v7: bins={bins} over a cluster of {c} blocks needs {smem} B of shared memory "
            f"per block; this GPU allows {optin} B (use a larger cluster)"
        )
    k = _kernel("hist_v7_plain" if aggregate is False else "hist_v7", x.dtype, dev)
    k.set_max_dynamic_shared(smem)
    if c > 8:
        k.allow_non_portable_cluster_size()
    if grid is None:
        clusters = max(1, min(-(-packs // (WIDE_THREADS * U * c)), _active_clusters(k, c, smem, dev)))
    else:
        clusters = max(1, grid // c)
    k.launch_cluster(clusters * c, WIDE_THREADS, c, x, out, n, _head(x), bins, shared=smem)
    return out


def _too_many(bins: int, variant: str) -> str:
    what = {
        "v6": f"a 16-bit private histogram (at most {PACKED_BINS} bins, 128 KB)",
        "v7": f"a cluster's split histogram (at most {CLUSTER_BINS} bins)",
    }.get(variant, f"a private shared-memory histogram (at most {SHARED_BINS} bins, 48 KB)")
    return f"histogram cuda_{variant}: bins={bins} does not fit {what}; use cuda_v1 (global atomics) or cuda"


def _limits_of(variant: str):
    def limits(x, bins, **options):
        if isinstance(bins, int) and bins > MAX_BINS[variant]:
            return _too_many(bins, variant)
        return None

    return limits


def _available_clusters():
    """v7 launches thread-block clusters, which sm_90 and later have. Without a GPU this is
    None, so the check reports it "compiled, not run"."""
    return capability_unavailable((9, 0), "sm_90+ (thread-block clusters)")


def _sample(make):
    """opcheck's sample: the spec's (keys, bins) at its layout shape, on the check's device."""
    return make.args(False)


def _make(backend: str, variant: str):
    def fwd(x: torch.Tensor, bins: int) -> torch.Tensor:
        return histogram_cuda(x, bins, variant)

    return build(
        OpDecl(
            name=f"histogram_{backend}",
            fwd=fwd,
            fwd_fake=lambda x, bins: x.new_empty(bins, dtype=torch.int64),
            save=lambda inputs, out: ((), None),
            needs_grad=lambda x, bins: False,  # integer keys never require grad
            samples=(_sample,),
            backward=lambda fwd, saved, extra, dy, need: (None, None),
        )
    )


VARIANTS = [
    ("cuda_v1", "v1", "CUDA v1: one thread per key, one global atomicAdd per key (the baseline)"),
    ("cuda_v2", "v2", "CUDA v2: per-block shared-memory histogram, merged with global atomics"),
    ("cuda_v3", "v3", "CUDA v3: coarsened grid-stride 16-byte loads; fill + merge once per block"),
    ("cuda_v4", "v4", "CUDA v4: warp-aggregated shared atomics (__match_any_sync) on top of v3"),
    ("cuda_v5", "v5", "CUDA v5: cheaper aggregation, two ballot rounds on a broadcast key, on top of v3"),
    ("cuda_v6", "v6", "CUDA v6: 16-bit shared counters, 65536 bins in 128 KB; wraps credited exactly"),
    ("cuda_v7", "v7", "CUDA v7: bins split over a thread-block cluster's distributed shared memory (sm_90)"),
    ("cuda", "best", "CUDA best: v3 up to 12288 bins, v6 up to 65536, v7 (sm_90+) up to 131072, v1 beyond"),
]


def _precompile_both(archs=CHECK_ARCHS) -> list[str]:
    """`cuda` runs kernels of both modules."""
    return MODULE.precompile(archs) + [f"{line} (v6-v7)" for line in MODULE_LARGE.precompile(archs)]


for _backend, _variant, _what in VARIANTS:
    _fn = _make(_backend, _variant)
    _module = MODULE_LARGE if _variant in LARGE else MODULE
    register(
        "histogram",
        _backend,
        devices=("cuda",),
        available=_available_clusters if _variant == "v7" else nvrtc_unavailable,
        precompile=_precompile_both if _variant == "best" else _module.precompile,
        custom_ops=_fn.custom_ops,
        builtin=True,
        module=_module,
        description=_what,
        limits=_limits_of(_variant) if _variant in PRIVATE else None,
    )(_fn)
