"""The index arithmetic of lab/fp32_gemv.cu, replayed in Python on small odd shapes (CPU).

    python lab/cpu_fp32_gemv_model.py

Each kernel (gv_cols, gv_rows, gv_sum) is written out thread by thread as the .cu does it,
with the launch gpu_fp32_gemv.py makes (grid, shared pitch, K slices from slices_for), and
every product is compared with x @ w. Every weight element a thread reads is recorded:
each must be read once, inside its row, never past N or K. Run before spending device time
on the sweep; it checks the indexing, not the CUDA code itself.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_fp32_gemv import COLS, ROWS, SLICES, _cdiv, rows_of, rows_pitch, slices_for  # noqa: E402


def stage_x(x, m, k0, klen, mr, pitch, k_major):
    """stage_x of the .cu: x's rows k0 .. k0 + klen as [pitch][MR] (k_major, cols) or
    [MR][pitch] (rows), zeros past klen and past M."""
    xs = np.zeros(mr * pitch)
    for i in range(mr * pitch):
        if k_major:
            kk, mm = divmod(i, mr)
        else:
            mm, kk = divmod(i, pitch)
        xs[i] = x[mm, k0 + kk] if mm < m and kk < klen else 0.0
    return xs


def cols(x, w, ldw, m, n, k, threads, u, s_kc, mr, reads):
    s_count, kc = s_kc
    out = np.zeros((s_count, m, n))
    wflat = w.reshape(-1)
    for s in range(s_count):
        k0 = s * kc
        klen = min(k - k0, kc)
        xs = stage_x(x, m, k0, klen, mr, kc, True)
        for bx in range(_cdiv(n, threads)):
            for t in range(threads):
                col = bx * threads + t
                if col >= n:
                    continue
                acc = np.zeros(mr)
                base = k0 * ldw + col
                kk = 0
                while kk + u <= klen:
                    v = [wflat[base + (kk + j) * ldw] for j in range(u)]
                    for j in range(u):
                        reads[base + (kk + j) * ldw] += 1
                        acc += xs[(kk + j) * mr:(kk + j) * mr + mr] * v[j]
                    kk += u
                while kk < klen:
                    reads[base + kk * ldw] += 1
                    acc += xs[kk * mr:kk * mr + mr] * wflat[base + kk * ldw]
                    kk += 1
                for mm in range(min(m, mr)):
                    out[s, mm, col] = acc[mm]
    return out


def rows(x, w_nk, ldw, m, n, k, threads, u, r, s_kc, mr, reads):
    s_count, kc = s_kc
    step = 32 * u
    pitch = rows_pitch(kc, u)
    out = np.zeros((s_count, m, n))
    wflat = w_nk.reshape(-1)
    warps = threads // 32
    for s in range(s_count):
        k0 = s * kc
        klen = min(k - k0, kc)
        xs = stage_x(x, m, k0, klen, mr, pitch, False)
        for bx in range(_cdiv(n, warps * r)):
            for warp in range(warps):
                n0 = (bx * warps + warp) * r
                acc = np.zeros((r, mr, 32))
                p = [min(n0 + rr, n - 1) * ldw + k0 for rr in range(r)]
                for kb in range(0, klen, step):
                    for uu, lane in itertools.product(range(u), range(32)):
                        kk = kb + uu * 32 + lane
                        assert kb + uu * 32 + lane < pitch
                        for rr in range(r):
                            v = 0.0
                            if kk < klen:
                                v = wflat[p[rr] + kk]
                                if n0 + rr < n:
                                    reads[p[rr] + kk] += 1
                            for mm in range(mr):
                                acc[rr, mm, lane] += xs[mm * pitch + kk] * v
                for rr, mm in itertools.product(range(r), range(mr)):
                    if mm < m and n0 + rr < n:
                        out[s, mm, n0 + rr] = acc[rr, mm].sum()
    return out


def main() -> int:
    rng = np.random.default_rng(0)
    bad = 0
    cases = 0
    for m, n, k, pad in [(1, 37, 53, 3), (3, 70, 301, 0), (4, 33, 700, 5), (2, 129, 64, 1)]:
        mr = rows_of(m)
        x = rng.standard_normal((m, k))
        # [K, N] with row stride n + pad (cols) and [N, K] with row stride k + pad (rows)
        w_kn = rng.standard_normal((k, n + pad))
        w_nk = rng.standard_normal((n, k + pad))
        for cand in COLS + ROWS:
            kind, threads, u, r = cand
            if threads > 128 and n < 64:  # (the Python loops: keep it short)
                continue
            for s_req in SLICES[kind]:
                s_kc = slices_for(kind, k, s_req, u, mr)
                if s_kc is None:
                    continue
                cases += 1
                if kind == "cols":
                    reads = np.zeros(w_kn.size, dtype=int)
                    out = cols(x, w_kn, n + pad, m, n, k, threads, u, s_kc, mr, reads)
                    want = x @ w_kn[:, :n]
                    mask = np.zeros((k, n + pad), dtype=int)
                    mask[:, :n] = 1
                else:
                    reads = np.zeros(w_nk.size, dtype=int)
                    out = rows(x, w_nk, k + pad, m, n, k, threads, u, r, s_kc, mr, reads)
                    want = x @ w_nk[:, :k].T
                    mask = np.zeros((n, k + pad), dtype=int)
                    mask[:, :k] = 1
                y = out.sum(axis=0)  # gv_sum: slice order; here the value is what matters
                ok = np.allclose(y, want, rtol=1e-10, atol=1e-10) and (reads == mask.reshape(-1)).all()
                if not ok:
                    bad += 1
                    print(f"FAIL {m}x{n}x{k} pad {pad} {cand} S={s_kc}: max err {np.abs(y - want).max():.2e}, "
                          f"reads {np.unique(reads[mask.reshape(-1) == 1])} inside, "
                          f"{int(reads[mask.reshape(-1) == 0].sum())} outside")  # fmt: skip
    print(f"{cases} launches modelled, {bad} wrong")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
