"""LayerNorm and RMSNorm in CUDA C++ (norms.cu, compiled by NVRTC): the launchers of both
ops and the registration of their variants (layer_norm/cuda.py, rms_norm/cuda.py call it).
rms_norm's CUDA backends are the same launchers with ``rms=True``.

Backends: ``cuda_v1`` (one block per row, shared-memory reductions, the row re-read per
pass) and ``cuda`` (= v2: the row in registers, 16-byte accesses, warp shuffles, several
short rows per block; falls back to v1 when D is not a multiple of 16 bytes, a row is
not 16-byte aligned, or D is wider than v2 holds). See the variant list in norms.cu.
"""

from __future__ import annotations

from pathlib import Path

import torch

from kernellab import triton_support
from kernellab.cuda import nodes, runtime
from kernellab.cuda.runtime import DTYPE_SUFFIX as SUFFIX
from kernellab.cuda.runtime import Module, sm_count
from kernellab.ops._register import register_builtin, register_cuda
from kernellab.ops.norm_kernels import plumbing

MODULE = Module(Path(__file__).with_name("norms.cu"))
V1_THREADS = 256
V2_THREADS = 256  # norms.cu's __launch_bounds__ for v2
V2_MAX_PACKS = 8 * 256  # P = 8 packs per thread, 256 threads per row
# Backward grid of v2: blocks per SM (each block walks rows and writes one partial row of
# dw/db per row slot). A tuning knob.
BWD_BLOCKS_PER_SM = 4

_FWD_SIG = ("ptr",) * 6
_kernel = MODULE.kernel  # (name, signature, device index); the Module caches per name and device


def _v2_shape(packs: int, target: int):
    """(threads per row, packs per thread P) for a row of ``packs`` 16-byte packs: about
    ``target`` packs per thread (4 forward; 2 backward, which holds x, g and two partials
    per pack), 32..256 threads per row, P a power of two <= 8; None when it does not fit."""
    if packs > V2_MAX_PACKS:
        return None
    tpr = 32
    while tpr < 256 and tpr * target < packs:
        tpr *= 2
    p = 1
    while p * tpr < packs:
        p *= 2
    return tpr, p


def _use_v2(x: torch.Tensor, vectorized: bool, target: int):
    if not vectorized:
        return None
    n_cols = x.shape[-1]
    es = x.element_size()
    n = 16 // es
    if n_cols % n or x.data_ptr() % 16:
        return None
    return _v2_shape(n_cols // n, target)


def _launchers(vectorized: bool):
    def fwd(x, w, b, eps, rms):
        y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        mean, rstd = plumbing.empty_stats(x, rms)
        n_rows, n_cols = plumbing.rows_of(x)
        if not (n_rows and n_cols):
            return y, mean, rstd
        dev = x.device.index
        sfx, kind = SUFFIX[x.dtype], "rms" if rms else "ln"
        b_ptr = b.data_ptr() if b is not None and not rms else 0
        mean_ptr = mean.data_ptr() if mean is not None else 0
        v2 = _use_v2(x, vectorized, 4)
        if v2 is not None and (b is None or b.data_ptr() % 16 == 0) and w.data_ptr() % 16 == 0:
            tpr, p = v2
            rpb = V2_THREADS // tpr
            k = _kernel(f"{kind}_fwd_p{p}_{sfx}", _FWD_SIG + ("i64", "i32", "i32", "f32"), dev)
            grid = (n_rows + rpb - 1) // rpb
            k(grid, V2_THREADS, x, w, b_ptr, y, mean_ptr, rstd, n_rows, n_cols, tpr, eps, device_index=dev)
        else:
            k = _kernel(f"{kind}_fwd_v1_{sfx}", _FWD_SIG + ("i32", "f32"), dev)
            for start in range(0, n_rows, 2**31 - 1):  # grid.x limit
                cnt = min(n_rows - start, 2**31 - 1)
                off = start * n_cols * x.element_size()
                k(
                    cnt,
                    V1_THREADS,
                    x.data_ptr() + off,
                    w,
                    b_ptr,
                    y.data_ptr() + off,
                    (mean_ptr + 4 * start) if mean_ptr else 0,
                    rstd.data_ptr() + 4 * start,
                    n_cols,
                    eps,
                    device_index=dev,
                )
        return y, mean, rstd

    def bwd(dy, x, w, mean, rstd, rms, has_bias, eps=None):  # (eps: the Triton backward's)
        n_rows, n_cols = plumbing.rows_of(x)
        dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        want_db = has_bias and not rms
        if not (n_rows and n_cols):
            return dx, torch.zeros_like(w), (torch.zeros_like(w) if want_db else None)
        dev = x.device.index
        sfx, kind = SUFFIX[x.dtype], "rms" if rms else "ln"
        sms = sm_count(dev)
        mean_ptr = mean.data_ptr() if mean is not None else 0
        v2 = _use_v2(x, vectorized, 2)
        if v2 is not None and dy.data_ptr() % 16 == 0 and w.data_ptr() % 16 == 0:
            tpr, p = v2
            rpb = V2_THREADS // tpr
            # 4 blocks of 256 threads per SM (register-limited to ~2 resident at P = 2;
            # the rest form a second wave): enough rows in flight, and the partial
            # buffer stays small (528 x D fp32 on a 132-SM GPU).
            grid = max(1, min((n_rows + rpb - 1) // rpb, BWD_BLOCKS_PER_SM * sms))
            # one partial row per block (the kernel sums its rpb row slots)
            dw_part = torch.empty((grid, n_cols), dtype=torch.float32, device=x.device)
            db_part = torch.empty_like(dw_part) if not rms else dw_part
            k = _kernel(f"{kind}_bwd_p{p}_{sfx}", ("ptr",) * 8 + ("i64", "i32", "i32"), dev)
            threads, extra = V2_THREADS, (tpr,)
        else:
            grid = max(1, min(n_rows, 8 * sms))
            dw_part = torch.zeros((grid, n_cols), dtype=torch.float32, device=x.device)
            db_part = torch.zeros_like(dw_part) if not rms else dw_part
            k = _kernel(f"{kind}_bwd_v1_{sfx}", ("ptr",) * 8 + ("i64", "i32"), dev)
            threads, extra = V1_THREADS, ()
        # v1 and v2 take the same arguments; v2 also takes its threads per row
        args = (dy, x, w, mean_ptr, rstd, dx, dw_part, db_part, n_rows, n_cols, *extra)
        k(grid, threads, *args, device_index=dev)
        dw = plumbing.reduce_partials(dw_part, w.dtype)
        db = plumbing.reduce_partials(db_part, w.dtype) if want_db else None
        return dx, dw, db

    return fwd, bwd


LAUNCHERS = {
    "cuda_v1": _launchers(vectorized=False),
    "cuda": _launchers(vectorized=True),
}
VARIANTS = [
    ("cuda_v1", "CUDA v1: one block per row, shared-memory reductions, row re-read per pass"),
    ("cuda", "CUDA v2: row in registers, 16-byte loads, warp shuffles, dw/db partials in registers"),
]


# The C++ autograd node's plans (kernellab/cuda/nodes.cpp): per (shape, dtype, device) the
# v2 kernels' handles and launch shapes, or False where v2 does not take the shape.
_NODE_PLANS: dict = {}
# Partial rows up to which a 16-bit weight's gradient is summed by norms.cu's one-launch
# partial-row sum (one thread per column walks every row); above, torch's sum and a cast.
PSUM_MAX_ROWS = 64


def _node_plan(x: torch.Tensor, kind: str) -> list[int] | bool:
    n_rows, n_cols = plumbing.rows_of(x)
    fwd_shape, bwd_shape = _use_v2(x, True, 4), _use_v2(x, True, 2)
    if not (n_rows and n_cols) or fwd_shape is None or bwd_shape is None or n_rows >= 2**31:
        return False
    dev, sfx = x.device.index, SUFFIX[x.dtype]
    (ftpr, fp), (btpr, bp) = fwd_shape, bwd_shape
    fk = _kernel(f"{kind}_fwd_p{fp}_{sfx}", _FWD_SIG + ("i64", "i32", "i32", "f32"), dev)
    bk = _kernel(f"{kind}_bwd_p{bp}_{sfx}", ("ptr",) * 8 + ("i64", "i32", "i32"), dev)
    frpb, brpb = V2_THREADS // ftpr, V2_THREADS // btpr
    bgrid = max(1, min((n_rows + brpb - 1) // brpb, BWD_BLOCKS_PER_SM * sm_count(dev)))
    fgrid = (n_rows + frpb - 1) // frpb
    psum = 0  # torch's tree sum (nodes.cpp), then the cast for 16-bit weights
    if x.dtype != torch.float32 and bgrid <= PSUM_MAX_ROWS:
        psum = _kernel(f"norm_psum_{sfx}", ("ptr", "ptr", "i32", "i32"), dev).handle
    return [fk.handle, fgrid, V2_THREADS, ftpr, bk.handle, bgrid, V2_THREADS, btpr, bgrid, psum,
            (n_cols + 255) // 256]  # fmt: skip


def _plan(x: torch.Tensor, kind: str):
    key = (x.shape, x.dtype, x.get_device(), kind)  # (the node refuses the layouts it does not take)
    return triton_support.kept_plan(_NODE_PLANS, key, lambda: _node_plan(x, kind))


def _node(x: torch.Tensor, kind: str):
    """(the extension, x's plan), or None where the C++ node does not apply: no built
    extension (``kernellab.config.cpp_nodes``) or a shape v2 does not take. The node itself
    refuses (None) tensors it does not take: not contiguous, not 16-byte aligned, a weight
    or bias of another dtype (nodes.cpp decides)."""
    mod = nodes.module()
    if mod is None:
        return None
    plan = _plan(x, kind)
    return None if plan is False else (mod, plan)


def rms_node(x: torch.Tensor, w: torch.Tensor, eps: float):
    """rms_norm through the C++ autograd node (the ``cuda_node`` backend's eager path), or
    None where it does not apply (``_node``)."""
    got = _node(x, "rms")
    return None if got is None else got[0].rms_norm(x, w, eps, got[1])


def ln_node(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, eps: float):
    """layer_norm through the C++ autograd node, as ``rms_node``."""
    got = _node(x, "ln")
    return None if got is None else got[0].layer_norm(x, w, b, eps, got[1])


def _node_unavailable() -> str | None:
    return runtime.nvrtc_unavailable() or nodes.why_unavailable()


NODE_BACKEND = ("cuda_node", "CUDA v2 in a C++ autograd node (built once: kernellab build-nodes)")


def register_variants(op: str, make_op) -> None:
    """Register each variant as backend ``VARIANTS[i][0]`` of ``op``: its launchers through
    ``make_op`` (a plumbing ``*_op``), custom ops ``kernellab::<op>_<backend>``; and
    ``cuda_node``: v2's launchers, with the C++ node (``rms_node`` / ``ln_node``) as the
    eager path, available once the extension is built (cuda/nodes.py)."""
    for backend, what in VARIANTS:
        fwd, bwd = LAUNCHERS[backend]
        register_cuda(op, backend, make_op(f"{op}_{backend}", fwd, bwd), MODULE, what)
    backend, what = NODE_BACKEND
    fwd, bwd = LAUNCHERS["cuda"]
    fn = make_op(f"{op}_{backend}", fwd, bwd, node=rms_node if op == "rms_norm" else ln_node)
    register_builtin(op, backend, fn, what, module=MODULE, available=_node_unavailable)
