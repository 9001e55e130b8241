"""CPU model of the fp32 CUDA variants' accumulation order over K vs torch fp32 matmul."""
import numpy as np, torch, sys
def fma_chain(a, b, order_sets):
    # a [M,K], b [K,N] float32; order_sets: list of lists of k indices; each list is one
    # sequential fma chain acc = fl(a*b + acc); chains combined pairwise at the end.
    a64 = a.astype(np.float64); b64 = b.astype(np.float64)
    parts = []
    for ks in order_sets:
        acc = np.zeros((a.shape[0], b.shape[1]), np.float32)
        for k in ks:
            acc = (np.outer(a64[:, k], b64[k]) + acc.astype(np.float64)).astype(np.float32)
        parts.append(acc)
    while len(parts) > 1:
        parts = [(parts[i] + parts[i + 1]).astype(np.float32) if i + 1 < len(parts) else parts[i]
                 for i in range(0, len(parts), 2)]
    return parts[0]
def variants(K):
    ks = list(range(K))
    return {"seq (v1-v7 before)": [ks], "split2 (k%2)": [ks[0::2], ks[1::2]],
            "split4 (k%4)": [ks[i::4] for i in range(4)]}
M = N = int(sys.argv[1]) if len(sys.argv) > 1 else 48
worst = {}
for K in (65, 997, 4096):
    for seed in range(20):
        g = torch.Generator().manual_seed(seed)
        a = torch.randn(M, K, generator=g); b = torch.randn(K, N, generator=g)
        ref = (a.double() @ b.double()).numpy()
        base = float(np.abs((a @ b).double().numpy() - ref).max())
        floor = np.finfo(np.float32).eps * max(1.0, np.abs(ref).max())
        bound = 2 * base + floor
        for name, sets in variants(K).items():
            err = float(np.abs(fma_chain(a.numpy(), b.numpy(), sets).astype(np.float64) - ref).max())
            w = worst.setdefault((K, name), [0, 0])
            w[0] = max(w[0], err / base); w[1] = max(w[1], err / bound)
for (K, name), (rb, rbound) in sorted(worst.items()):
    print(f"K={K:5d} {name:20s} worst err/torch_err {rb:5.2f}  worst err/bound {rbound:5.2f}")
