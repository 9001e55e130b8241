"""Where a model step's memory goes: the tensors the forward leaves for the backward, by the
autograd node that holds them, for each variant of a user model (user_models).

    PYTHONPATH=src python lab/probe_memory.py --model hf-llama --variants liger,kernellab

Per variant, after two warm-up steps: the memory allocated by the forward (what is alive
when the backward starts, parameters and optimizer state excluded), the peak of the
forward and of the backward above the resident state, and the saved tensors' bytes per
node type (each storage counted once, at the first node that holds it; parameters left
out). Custom autograd Functions' tensors kept as ctx attributes are counted too.
"""

from __future__ import annotations

import argparse
import collections
import copy
import sys

import torch

from kernellab.models import user_models as um


def _tensors_of(node):
    for name in dir(node):
        if name.startswith("_saved_"):
            try:
                v = getattr(node, name)
            except Exception:  # noqa: BLE001 - a freed or unpackable slot
                continue
            yield from (v if isinstance(v, (tuple, list)) else [v])
    try:
        yield from node.saved_tensors
    except Exception:  # noqa: BLE001 - not a custom Function node
        pass
    for v in getattr(node, "__dict__", {}).values():
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, (tuple, list)):
            yield from (t for t in v if isinstance(t, torch.Tensor))


def saved_by_node(loss, skip: set[int], dev: str):
    seen, by_node, count = set(skip), collections.Counter(), collections.Counter()
    # (the Python objects of C++ nodes are made on access: kept alive here, or their ids
    # are reused and nodes never seen count as visited)
    stack, visited = [loss.grad_fn], {}
    while stack:
        node = stack.pop()
        if node is None or id(node) in visited:
            continue
        visited[id(node)] = node
        name = type(node).__name__
        for t in _tensors_of(node):
            if not isinstance(t, torch.Tensor) or t.device.type != dev:
                continue
            st = t.untyped_storage()
            if st.data_ptr() in seen:
                continue
            seen.add(st.data_ptr())
            by_node[name] += st.nbytes()
            count[name] += 1
        stack.extend(n for n, _ in node.next_functions)
    return by_node, count


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="hf-llama")
    p.add_argument("--variants", default="hf,liger,kernellab")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--top", type=int, default=14)
    p.add_argument("--small", action="store_true", help="tiny configs (a CPU smoke run)")
    a = p.parse_args(argv)
    gib = 2**30
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    cuda = torch.cuda if dev == "cuda" else None
    mem = (lambda: cuda.memory_allocated()) if cuda else (lambda: 0)
    peak = (lambda: cuda.max_memory_allocated()) if cuda else (lambda: 0)
    reset = cuda.reset_peak_memory_stats if cuda else (lambda: None)
    sync = cuda.synchronize if cuda else (lambda: None)
    torch.manual_seed(0)
    with torch.device(dev):
        base = um.hf_model(a.model, a.small)
    base = base.to(dev, torch.bfloat16 if cuda else torch.float32)
    vocab = base.config.vocab_size
    idx = torch.randint(0, vocab, (a.batch, a.seq), device=dev)
    tgt = torch.randint(0, vocab, (a.batch, a.seq), device=dev)
    for v in a.variants.split(","):
        m = copy.deepcopy(base)
        why = um.liger_patch(a.model, m) if v == "liger" else um.kernellab_patch(m) if v == "kernellab" else None
        if why:
            print(f"{v}: skipped ({why})")
            continue
        m.train()
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4, fused=cuda is not None)
        for _ in range(2):
            m(input_ids=idx, labels=tgt).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        sync()
        params = {q.untyped_storage().data_ptr() for q in m.parameters()}
        a0 = mem()
        reset()
        loss = m(input_ids=idx, labels=tgt).loss
        sync()
        a1, p_fwd = mem(), peak()
        by_node, count = saved_by_node(loss, params, dev)
        reset()
        loss.backward()
        sync()
        p_bwd = peak()
        opt.step()
        opt.zero_grad(set_to_none=True)
        total = sum(by_node.values())
        print(f"\n== {a.model} {v} B={a.batch} T={a.seq}: alive after forward {(a1 - a0) / gib:.3f} GiB, "
              f"forward peak +{(p_fwd - a0) / gib:.3f}, backward peak +{(p_bwd - a0) / gib:.3f} GiB above the "
              f"resident {a0 / gib:.3f} GiB; saved tensors {total / gib:.3f} GiB")  # fmt: skip
        for name, b in by_node.most_common(a.top):
            print(f"  {b / 2**20:9.1f} MiB {count[name]:5d}  {name}")
        del loss, m, opt
        if cuda:
            cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
