"""Sweep of the forward knobs that the issue-3 targets hinge on, each beside its peers in
one process (issue 2 and 3; H100 / H200).

    python scripts/tune_rowwise_fwd.py OUT.jsonl

1. Row-wise forwards at the bench shapes: the Triton softmax (fp32 and bf16 32768 x 4096)
   and layer_norm / rms_norm (bf16 16384 x 4096): rows in registers (read once) for
   FWD_EVEN (unmasked accesses when the rows fill the block) x FWD_NARROW (32-bit
   offsets) x FWD_WARPS, beside the registered triton, cuda, compile, torch and liger
   backends. (A second H100 run also swept rows streamed in 1024-4096-column chunks,
   later passes from L2 as Inductor's looped reductions: slower or equal; removed. Rows:
   tune_rowwise_fwd2-H100.jsonl.) (The first H100 run swept a
   row-walking variant with the next row prefetched, 1-8 programs per SM: 2-80% slower
   than a program per row everywhere; removed. Its rows: tune_rowwise_fwd-H100.jsonl.)
2. Two-input elementwise kernels at 2^28 bf16 (add, GeLU backward): access width (8 or
   16 bytes), accesses per thread and input (1, 2) and threads per block (128, 256, 512),
   beside torch. The kernels are common.cuh's map2_packs over gelu.cu's GeluBwd and an add.

3. ``hints`` (third H100 run): the knobs left after 1. Norm forwards (Triton): approximate
   rsqrt (FWD_RSQRT), a streaming y store (FWD_STORE_CM=".cs"), 1 or 2 rows per program at
   8 or 16 warps; norm forwards (CUDA v2): 64 / 128 / 256 threads per row. Softmax fp32:
   the streaming store, and a copy of Inductor's looped online softmax (a running max
   and sum *per lane*, reduced once after the loop: the earlier streamed variant reduced
   every chunk) at 1-4 rows x 512-2048 columns x 4-16 warps, beside the configs that
   Inductor's autotuner picked (printed).

    python scripts/tune_rowwise_fwd.py OUT.jsonl hints

Every configuration is timed with kernellab's timer (CUDA events, L2 flushed between
calls, median) and its output compared with the shipped backend's (max abs difference).
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

import kernellab
from kernellab.cuda.runtime import Module, ceil_div
from kernellab.harness.timer import time_cuda

ROOT = Path(kernellab.__file__).parent / "ops"
rows: list[dict] = []


def record(**r):
    rows.append(r)
    print(json.dumps(r), flush=True)


def _diff(a, b) -> float:
    return float((a.float() - b.float()).abs().max())


def _t(fn) -> float:
    return time_cuda(fn, budget_s=0.8).median_ms


def rowwise():
    import kernellab.ops.layer_norm.triton as lt
    import kernellab.ops.softmax.triton as st

    g = torch.Generator(device="cuda").manual_seed(0)
    cases = [
        ("softmax", torch.float32, (32768, 4096)),
        ("softmax", torch.bfloat16, (32768, 4096)),
        ("layer_norm", torch.bfloat16, (16384, 4096)),
        ("rms_norm", torch.bfloat16, (16384, 4096)),
    ]
    for op, dtype, (n, d) in cases:
        x = (torch.randn(n, d, device="cuda", generator=g) * 2).to(dtype)
        w = (1 + 0.1 * torch.randn(d, device="cuda", generator=g)).to(dtype)
        b = (0.1 * torch.randn(d, device="cuda", generator=g)).to(dtype)
        args = {"softmax": (x,), "layer_norm": (x, w, b), "rms_norm": (x, w)}[op]
        base = dict(op=op, dtype=str(dtype)[6:], shape=f"{n}x{d}")
        with torch.no_grad():
            for impl in kernellab.impls(op):
                if (
                    impl.why_unavailable("cuda") is not None
                    or impl.backend in ("manual",)
                    or "_v" in impl.backend
                ):
                    continue
                fn = kernellab.get(op, impl.backend)
                try:
                    ms = _t(lambda: fn(*args))
                    record(**base, config=impl.backend, ms=ms)
                except Exception as e:  # noqa: BLE001 - a peer's failure is reported
                    record(**base, config=impl.backend, error=f"{type(e).__name__}: {e}"[:160])
            if op == "softmax":
                ref = st._fwd(x)
                mod, call = st, lambda: st._fwd(x)
            else:
                rms = op == "rms_norm"
                bias = None if rms else b
                ref = lt.norm_fwd(x, w, bias, 1e-5, rms)[0]
                mod, call = lt, lambda: lt.norm_fwd(x, w, bias, 1e-5, rms)[0]
            saved = (mod.FWD_EVEN, mod.FWD_NARROW, mod.FWD_WARPS)
            try:
                for even, narrow, warps in itertools.product((True, False), (True, False), (8, 16)):
                    mod.FWD_EVEN, mod.FWD_NARROW, mod.FWD_WARPS = even, narrow, warps
                    out = call()
                    cfg = f"triton even={int(even)} narrow={int(narrow)} warps={warps}"
                    record(**base, config=cfg, ms=_t(call), max_diff=_diff(out, ref))
            finally:
                mod.FWD_EVEN, mod.FWD_NARROW, mod.FWD_WARPS = saved
        del x, args
        torch.cuda.empty_cache()


SRC = r"""
#include "gelu.cu"
struct AddF { __device__ __forceinline__ float operator()(float a, float b) const { return a + b; } };
// kl::map2_packs (common.cuh) with B-byte packs, U per thread and input; one tile per block.
#define X(B, U)                                                                                  \
    extern "C" __global__ void __launch_bounds__(512) xadd_##B##_##U(                            \
        const __nv_bfloat16* a, const __nv_bfloat16* b, __nv_bfloat16* y, long long n) {         \
        kl::map2_packs<U, kl::Vec##B<__nv_bfloat16>>(a, b, y, n, AddF{});                        \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(512) xgbwd_##B##_##U(                           \
        const __nv_bfloat16* a, const __nv_bfloat16* b, __nv_bfloat16* y, long long n) {         \
        kl::map2_packs<U, kl::Vec##B<__nv_bfloat16>>(a, b, y, n, GeluBwd{});                     \
    }
X(16, 1) X(16, 2) X(8, 1) X(8, 2) X(8, 4)
"""


def elementwise():
    n = 2**28
    g = torch.Generator(device="cuda").manual_seed(1)
    a = torch.randn(n, device="cuda", generator=g).to(torch.bfloat16)
    b = torch.randn(n, device="cuda", generator=g).to(torch.bfloat16)
    path = ROOT / "gelu" / "_tune_rowwise_tmp.cu"
    path.write_text(SRC)
    try:
        mod = Module(path)
        jobs = {
            "add": ("xadd", lambda: torch.add(a, b), kernellab.get("add", "cuda")),
            "gelu_bwd": ("xgbwd", lambda: torch.ops.aten.gelu_backward(a, b, approximate="tanh"), None),
        }
        for kname, (prefix, torch_fn, ours) in jobs.items():
            ref = torch_fn()
            base = dict(op=kname, dtype="bfloat16", shape=str(n))
            record(**base, config="torch", ms=_t(torch_fn))
            if ours is not None:
                record(
                    **base,
                    config="cuda (shipped)",
                    ms=_t(lambda: ours(a, b)),
                    max_diff=_diff(ours(a, b), ref),
                )
            for (width, per), threads in itertools.product(
                ((16, 1), (16, 2), (8, 1), (8, 2), (8, 4)), (128, 256, 512)
            ):
                k = mod.kernel(f"{prefix}_{width}_{per}", ("ptr", "ptr", "ptr", "i64"), 0)
                y = torch.empty_like(a)
                grid = ceil_div(n // (width // 2), threads * per)

                def run():
                    k(grid, threads, a, b, y, n, device_index=0)
                    return y

                out = run()
                record(**base, config=f"{width}B x{per} t{threads}", ms=_t(run), max_diff=_diff(out, ref))
    finally:
        path.unlink(missing_ok=True)


@triton.jit
def _softmax_looped(
    x_ptr, y_ptr, N: tl.constexpr, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr, PRECISE: tl.constexpr
):
    # Inductor's looped online softmax, rows of exactly N columns (N % RBLOCK == 0, the
    # row count a multiple of XBLOCK): pass 1 keeps a running max and sum per lane and
    # reads with evict_last; one reduction after the loop; pass 2 reads from L2.
    # PRECISE: libdevice's expf in pass 2, as Inductor.
    rows = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    r = tl.arange(0, RBLOCK)[None, :]
    m = tl.full([XBLOCK, RBLOCK], float("-inf"), tl.float32)
    s = tl.zeros([XBLOCK, RBLOCK], tl.float32)
    for off in tl.range(0, N, RBLOCK):
        x = tl.load(x_ptr + rows * N + off + r, eviction_policy="evict_last").to(tl.float32)
        m_new = tl.maximum(m, x)
        s = s * tl.exp(m - m_new) + tl.exp(x - m_new)
        m = m_new
    mx = tl.max(m, 1)[:, None]
    tot = tl.sum(s * tl.exp(m - mx), 1)[:, None]
    for off in tl.range(0, N, RBLOCK):
        x = tl.load(x_ptr + rows * N + off + r, eviction_policy="evict_first").to(tl.float32)
        if PRECISE:
            e = libdevice.exp(x - mx)
        else:
            e = tl.exp(x - mx)
        tl.store(y_ptr + rows * N + off + r, (e / tot).to(y_ptr.dtype.element_ty))


@triton.jit
def _softmax_reread(x_ptr, y_ptr, N: tl.constexpr):
    # One row per program, whole row: max and sum from registers (two reductions, as the
    # shipped kernel), then x read again (from L2) for the output instead of keeping
    # exp(x - max) live.
    row = tl.program_id(0)
    c = tl.arange(0, N)
    x = tl.load(x_ptr + row * N + c, eviction_policy="evict_last").to(tl.float32)
    m = tl.max(x, 0)
    tot = tl.sum(tl.exp(x - m), 0)
    x = tl.load(x_ptr + row * N + c, eviction_policy="evict_first").to(tl.float32)
    tl.store(y_ptr + row * N + c, (tl.exp(x - m) / tot).to(y_ptr.dtype.element_ty))


@triton.jit
def _norm_reread(x_ptr, w_ptr, b_ptr, y_ptr, N: tl.constexpr, RMS: tl.constexpr):
    # One row per program, whole row: the statistics from registers, then x read again
    # (from L2) for the output.
    row = tl.program_id(0)
    c = tl.arange(0, N)
    x = tl.load(x_ptr + row * N + c, eviction_policy="evict_last").to(tl.float32)
    if RMS:
        mean = 0.0
        var = tl.sum(x * x, 0) / N
    else:
        mean = tl.sum(x, 0) / N
        xc = x - mean
        var = tl.sum(xc * xc, 0) / N
    rstd = 1.0 / tl.sqrt_rn(var + 1e-5)
    x = tl.load(x_ptr + row * N + c, eviction_policy="evict_first").to(tl.float32)
    y = (x - mean) * rstd * tl.load(w_ptr + c).to(tl.float32)
    if not RMS:
        y += tl.load(b_ptr + c).to(tl.float32)
    tl.store(y_ptr + row * N + c, y.to(y_ptr.dtype.element_ty))


def _inductor_configs() -> list[str]:
    """The configs Inductor's autotuner settled on for the kernels compiled so far."""
    import gc

    try:
        from torch._inductor.runtime.triton_heuristics import CachingAutotuner
    except ImportError:
        return []
    found = []
    for obj in gc.get_objects():
        try:
            if not isinstance(obj, CachingAutotuner):
                continue
            for launcher in getattr(obj, "launchers", []) or []:
                found.append(f"{getattr(obj.fn, '__name__', '?')}: {getattr(launcher, 'config', '?')}")
        except ReferenceError:  # a dead weak proxy in the heap
            continue
    return found


def hints():
    import kernellab.ops.layer_norm.cuda as lc
    import kernellab.ops.layer_norm.triton as lt
    import kernellab.ops.softmax.triton as st

    g = torch.Generator(device="cuda").manual_seed(0)
    cases = [
        ("softmax", torch.float32, (32768, 4096)),
        ("layer_norm", torch.bfloat16, (16384, 4096)),
        ("rms_norm", torch.bfloat16, (16384, 4096)),
    ]
    for op, dtype, (n, d) in cases:
        x = (torch.randn(n, d, device="cuda", generator=g) * 2).to(dtype)
        w = (1 + 0.1 * torch.randn(d, device="cuda", generator=g)).to(dtype)
        b = (0.1 * torch.randn(d, device="cuda", generator=g)).to(dtype)
        args = {"softmax": (x,), "layer_norm": (x, w, b), "rms_norm": (x, w)}[op]
        base = dict(op=op, dtype=str(dtype)[6:], shape=f"{n}x{d}")
        with torch.no_grad():
            for backend in ("torch", "compile", "liger", "triton", "cuda"):
                fn = kernellab.get(op, backend)
                try:
                    record(**base, config=backend, ms=_t(lambda: fn(*args)))
                except Exception as e:  # noqa: BLE001 - a peer's failure is reported
                    record(**base, config=backend, error=f"{type(e).__name__}: {e}"[:160])
            for line in _inductor_configs():
                record(**base, config="inductor picked", note=line[:300])
            torch._dynamo.reset()
            if op == "softmax":
                ref = st._fwd(x)
                saved = (st.FWD_STORE_CM, st.FWD_WARPS)
                try:
                    for cm, warps in itertools.product(("", ".cs"), (8, 16)):
                        st.FWD_STORE_CM, st.FWD_WARPS = cm, warps
                        out = st._fwd(x)
                        cfg = f"triton store={cm or '-'} warps={warps}"
                        record(**base, config=cfg, ms=_t(lambda: st._fwd(x)), max_diff=_diff(out, ref))
                finally:
                    st.FWD_STORE_CM, st.FWD_WARPS = saved
                y = torch.empty_like(x)
                looped = [(1, 4096, 16, 1, 1), (1, 4096, 16, 1, 0), (1, 4096, 16, 3, 1), (1, 2048, 16, 1, 1)]
                looped += [(1, 2048, 16, 3, 0), (1, 1024, 16, 1, 1), (1, 4096, 32, 1, 1), (2, 2048, 16, 1, 1)]
                for xb, rb, warps, stages, precise in looped:

                    def run(xb=xb, rb=rb, warps=warps, stages=stages, precise=precise):
                        kw = dict(
                            XBLOCK=xb, RBLOCK=rb, PRECISE=bool(precise), num_warps=warps, num_stages=stages
                        )
                        _softmax_looped[(n // xb,)](x, y, N=d, **kw)
                        return y

                    out = run()
                    cfg = f"looped x{xb} r{rb} w{warps} s{stages} precise={precise}"
                    record(**base, config=cfg, ms=_t(run), max_diff=_diff(out, ref))
                for warps in (8, 16):

                    def run(warps=warps):
                        _softmax_reread[(n,)](x, y, N=d, num_warps=warps)
                        return y

                    out = run()
                    record(**base, config=f"reread w{warps}", ms=_t(run), max_diff=_diff(out, ref))
                # the Inductor-like shapes at other widths (same bytes), beside compile
                comp = kernellab.get("softmax", "compile")
                for n2, d2 in ((65536, 2048), (16384, 8192)):
                    x2 = torch.randn(n2, d2, device="cuda", generator=g) * 2
                    y2 = torch.empty_like(x2)
                    ref2 = st._fwd(x2)
                    b2 = dict(base, shape=f"{n2}x{d2}")
                    record(**b2, config="compile", ms=_t(lambda: comp(x2)))
                    record(**b2, config="triton", ms=_t(lambda: st._fwd(x2)))
                    for rb, warps in ((d2, 16), (d2 // 2, 16), (d2, 32)):

                        def run(rb=rb, warps=warps):
                            kw = dict(XBLOCK=1, RBLOCK=rb, PRECISE=False, num_warps=warps, num_stages=1)
                            _softmax_looped[(n2,)](x2, y2, N=d2, **kw)
                            return y2

                        out = run()
                        cfg = f"looped x1 r{rb} w{warps} s1"
                        record(**b2, config=cfg, ms=_t(run), max_diff=_diff(out, ref2))
                    del x2, y2
            else:
                rms = op == "rms_norm"
                bias = None if rms else b
                ref = lt.norm_fwd(x, w, bias, 1e-5, rms)[0]
                saved = (lt.FWD_RSQRT, lt.FWD_STORE_CM, lt.FWD_WARPS, lt.ROW_ELEMS)
                try:
                    for rsqrt, cm, (elems, warps) in itertools.product(
                        (False, True), ("", ".cs"), ((4096, 8), (8192, 8), (8192, 16))
                    ):
                        lt.FWD_RSQRT, lt.FWD_STORE_CM, lt.ROW_ELEMS, lt.FWD_WARPS = rsqrt, cm, elems, warps
                        call = lambda: lt.norm_fwd(x, w, bias, 1e-5, rms)[0]  # noqa: E731
                        out = call()
                        cfg = f"triton rsqrt={int(rsqrt)} store={cm or '-'} rows={elems // d} warps={warps}"
                        record(**base, config=cfg, ms=_t(call), max_diff=_diff(out, ref))
                finally:
                    lt.FWD_RSQRT, lt.FWD_STORE_CM, lt.FWD_WARPS, lt.ROW_ELEMS = saved
                y = torch.empty_like(x)
                for warps in (8, 16):

                    def run(warps=warps):
                        _norm_reread[(n,)](x, w, b, y, N=d, RMS=rms, num_warps=warps)
                        return y

                    out = run()
                    record(**base, config=f"reread w{warps}", ms=_t(run), max_diff=_diff(out, ref))
                kind, packs = ("rms" if rms else "ln"), d // 8
                y = torch.empty_like(x)
                mean = torch.empty(n, device="cuda")
                rstd = torch.empty(n, device="cuda")
                for tpr in (64, 128, 256):
                    p = packs // tpr
                    k = lc._kernel(f"{kind}_fwd_p{p}_bf16", lc._FWD_SIG + ("i64", "i32", "i32", "f32"), 0)
                    rpb = lc.V2_THREADS // tpr

                    def run(k=k, tpr=tpr, rpb=rpb):
                        bb, mm = (0, 0) if rms else (b, mean)
                        k(n // rpb, lc.V2_THREADS, x, w, bb, y, mm, rstd, n, d, tpr, 1e-5, device_index=0)
                        return y

                    out = run()
                    record(**base, config=f"cuda tpr={tpr} P={p}", ms=_t(run), max_diff=_diff(out, ref))
        del x, args
        torch.cuda.empty_cache()


def main():
    dest = sys.argv[1] if len(sys.argv) > 1 else "tune_rowwise_fwd.jsonl"
    parts = [p for p in (elementwise, rowwise, hints) if p.__name__ in sys.argv[2:]] or [elementwise, rowwise]
    for part in parts:
        try:
            part()
        except Exception as e:  # noqa: BLE001 - the other part still runs
            record(part=part.__name__, error=f"{type(e).__name__}: {e}"[:300])
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__)
    with open(dest, "w") as fh:
        for r in rows:
            fh.write(json.dumps({**r, **meta}) + "\n")
    print("\nbest per case:")
    for key in sorted({(r["op"], r["dtype"]) for r in rows if "op" in r}):
        rs = sorted(
            (r for r in rows if (r.get("op"), r.get("dtype")) == key and "ms" in r), key=lambda r: r["ms"]
        )
        print(key, " | ".join(f"{r['config']} {r['ms']:.4f}" for r in rs[:8]))


if __name__ == "__main__":
    main()
