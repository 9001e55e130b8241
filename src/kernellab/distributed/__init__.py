"""Sequence parallelism: ring attention over torch.distributed (issue 20).

Each rank holds a shard of the sequence (q, k, v [B, H, S_local, D]); K/V blocks travel
around the ring of ranks while each rank attends its queries to the block it holds, and
the partial results are merged with their log-sum-exp in fp32. Three layouts cut the
sequence: ``contiguous``, and for causal load balance ``zigzag`` and ``striped``
(layouts.py says which blocks each step computes).

    from kernellab.distributed import ring_attention, shard, unshard
    q_local = shard(q_full, rank, world, "zigzag")          # [B, H, S / W, D]
    o_local = ring_attention(q_local, k_local, v_local, causal=True, layout="zigzag")

``simulate_ring`` runs the same schedule and merge in one process (W shards in turn);
``blocks`` holds the local block functions (PyTorch; kernellab's Triton kernels).
"""

from kernellab.distributed.blocks import TORCH, TRITON, BlockFns, default_blocks
from kernellab.distributed.layouts import LAYOUTS, block_calls, positions, shard, unshard
from kernellab.distributed.merge import merge_
from kernellab.distributed.ring import gather_sequence, high_priority_group, ring_attention, simulate_ring

__all__ = [
    "LAYOUTS",
    "TORCH",
    "TRITON",
    "BlockFns",
    "block_calls",
    "default_blocks",
    "gather_sequence",
    "high_priority_group",
    "merge_",
    "positions",
    "ring_attention",
    "shard",
    "simulate_ring",
    "unshard",
]
