"""The eager path of layer_norm's and rms_norm's ``triton`` backends: their Triton kernels
launched from the C++ autograd node (``triton_norm`` in kernellab/cuda/nodes.cpp), once the
extension is built (``kernellab build-nodes``; ``kernellab.config.cpp_nodes``).

Why: through the Python node a forward+backward costs the host a Python frame, the custom
op's dispatch and Triton's launcher per kernel. The node runs the same kernels (bitwise the
same numbers) with its saved tensors and backward in C++.

Per (shape, dtype, device, rms, bias) the plan is what ``triton_kernels._fwd_plan`` and
``_bwd_plan`` choose for the Python path. Each kernel of it is compiled once (``warmup``)
and described to the node as a launch block (nodes.cpp's head): its CUfunction, grid,
threads, dynamic shared memory and one (code, value) per parameter of the compiled kernel,
read from the compiled signature (constexprs, and integers Triton specialized into
constants, are not parameters) and from its PTX entry (the trailing scratch pointers
Triton adds, passed as null: kernels that need scratch memory are not taken). Shapes the
node does not take (empty, rows wider than ``MAX_D``, a kernel it cannot describe) keep
the Python path.
"""

from __future__ import annotations

import re

import torch

from kernellab import triton_support
from kernellab.cuda import nodes
from kernellab.ops.norm_kernels import plumbing
from kernellab.ops.norm_kernels import triton_kernels as tk

# parameter codes (nodes.cpp)
I32, I64, EPS, NULL = 100, 101, 102, 103
FWD_SLOTS = {"x_ptr": 0, "w_ptr": 1, "b_ptr": 2, "r_ptr": 0, "h_ptr": 3, "y_ptr": 3, "mean_ptr": 4,
             "rstd_ptr": 5}  # fmt: skip
BWD_SLOTS = {"dy_ptr": 0, "x_ptr": 1, "w_ptr": 2, "mean_ptr": 3, "rstd_ptr": 4, "dx_ptr": 5, "dres_ptr": 5,
             "dw_part_ptr": 6, "db_part_ptr": 7, "dw_ptr": 8, "db_ptr": 9}  # fmt: skip
MAX_SCRATCH = 2  # Triton's global and profile scratch pointers


class NotCoded(ValueError):
    """A compiled kernel the node cannot launch (the call keeps the Python path)."""


def ptx_params(ptx: str, name: str) -> int:
    """The number of parameters of kernel ``name``'s ``.entry`` in ``ptx``."""
    m = re.search(r"\.entry\s+" + re.escape(name) + r"\s*\((.*?)\)", ptx, re.S)
    if m is None:
        raise NotCoded(f"no .entry {name} in the PTX")
    return len(re.findall(r"\.param\b", m.group(1)))


def param_codes(arg_names, signature: dict, slots: dict, scalars: dict, n_ptx: int) -> list[int]:
    """The (code, value) pairs of a compiled kernel's parameters, flat: a pointer argument
    by its tensor slot, an integer by its value (i32 or i64 as the signature says), ``eps``
    as float32, and nulls for the trailing parameters the PTX entry has beyond the
    arguments."""
    out: list[int] = []
    n = 0
    for name in arg_names:
        ty = signature[name]
        if ty == "constexpr":
            continue
        n += 1
        if ty.startswith("*"):
            if name not in slots:
                raise NotCoded(f"pointer {name} has no slot")
            out += [slots[name], 0]
        elif name == "eps":
            if ty != "fp32":
                raise NotCoded(f"eps typed {ty}")
            out += [EPS, 0]
        elif ty in ("i32", "i64") and name in scalars:
            out += [I32 if ty == "i32" else I64, int(scalars[name])]
        else:
            raise NotCoded(f"{name}: parameter of type {ty} is not coded")
    extra = n_ptx - n
    if not 0 <= extra <= MAX_SCRATCH:
        raise NotCoded(f"{n} arguments but {n_ptx} PTX parameters")
    return out + [NULL, 0] * extra


def launch_block(compiled, grid, slots: dict, scalars: dict) -> list[int]:
    """The launch block of a compiled kernel (a Triton CompiledKernel)."""
    compiled._init_handles()  # (loads the module: its CUfunction, the shared-memory attribute set)
    md = compiled.metadata
    for what in ("global_scratch_size", "profile_scratch_size"):
        if getattr(md, what, 0):
            raise NotCoded(f"{md.name} needs {what} {getattr(md, what)}")
    if (
        getattr(md, "num_ctas", 1) != 1
        or getattr(md, "launch_cooperative_grid", False)
        or getattr(md, "launch_pdl", False)
    ):
        raise NotCoded(f"{md.name}: a launch that cuLaunchKernel cannot make")
    codes = param_codes(
        list(compiled.src.fn.arg_names),
        compiled.src.signature,
        slots,
        scalars,
        ptx_params(compiled.asm["ptx"], md.name),
    )
    g = tuple(grid) + (1,) * (3 - len(grid))
    return [int(compiled.function), *map(int, g), md.num_warps * 32, md.shared, len(codes) // 2, *codes]


def kernels_of(x: torch.Tensor, w: torch.Tensor, has_bias: bool, rms: bool):
    """(meta, [(bound, args, slots, scalars), ...]) of the plan the Python path runs for
    this shape (forward, backward, and the partials' sum unless the backward is the small
    one), with stand-in arguments of the call's dtypes, or None where the node does not take
    the shape. The stand-ins are fresh tensors (so aligned as the node's own): what the
    kernels are specialized on is their dtype and 16-byte alignment, never the address."""
    if x.dim() == 0:
        return None
    n_rows, n_cols = plumbing.rows_of(x)
    if not (n_rows and n_cols) or n_cols > tk.MAX_D:
        return None
    fp = tk._fwd_plan(x, rms, has_bias, False, tk.CONFIG)
    bp = tk._bwd_plan(x, w, rms, has_bias, False, tk.CONFIG)
    if fp.launch is None or bp.launch is None:
        return None
    y, dx, dw = torch.empty_like(x), torch.empty_like(x), torch.empty_like(w)
    rstd = torch.empty(n_rows, dtype=torch.float32, device=x.device)
    stats = rstd if rms else torch.empty_like(rstd)
    sizes = {"n_rows": n_rows, "n_cols": n_cols}
    fargs = [x, w, w, x, y, y, stats, rstd]
    if fp.row_kernel:
        fargs += [n_cols, 1e-5]
    elif fp.per:
        fargs += [n_rows, n_cols, 1e-5, fp.per]
    else:
        fargs += [n_rows, n_cols, 1e-5]
    out = [(fp.launch, fargs, FWD_SLOTS, {**sizes, "per": fp.per})]
    if bp.small:
        args = [x, x, w, stats, rstd, dx, dx, dw, dw, n_rows, n_cols, 1e-5]
        out.append((bp.launch, args, BWD_SLOTS, sizes))
    else:
        part = torch.empty((bp.programs, n_cols), dtype=bp.part_dtype, device=x.device)
        per = bp.rows_per_program
        db_part = rstd if rms else part
        out.append((bp.launch, [x, x, w, stats, rstd, dx, dx, part, db_part, n_rows, n_cols, per], BWD_SLOTS,
                    {**sizes, "rows_per_prog": per, "per": per}))  # fmt: skip
        out.append((bp.psum, [part, db_part, dw, dw, bp.programs, n_cols], BWD_SLOTS,
                    {"n_parts": bp.programs, "n_cols": n_cols}))  # fmt: skip
    meta = [int(rms), int(has_bias), int(bp.small), bp.programs, int(bp.part_dtype == torch.float64)]
    return meta, out


def make_plan(x: torch.Tensor, w: torch.Tensor, has_bias: bool, rms: bool):
    """(meta, fwd, bwd, psum, compiled kernels) for the node, or False where it does not
    take this shape (the Python path runs it). The kernels are compiled and loaded on x's
    device (Triton loads a kernel into the current device's context; the node launches it
    in x's)."""
    got = kernels_of(x, w, has_bias, rms)
    if got is None:
        return False
    meta, launches = got
    compiled, blocks = [], []
    try:
        with torch.cuda.device(x.device.index):
            for bound, args, slots, scalars in launches:
                ck = bound.kernel.warmup(*args, grid=bound.grid, **bound.kw)  # (compiles; runs nothing)
                compiled.append(ck)
                blocks.append(launch_block(ck, bound.grid, slots, scalars))
    except NotCoded:
        return False
    psum = blocks[2] if len(blocks) == 3 else [0, 1, 1, 1, 32, 0, 0]  # (small: not launched)
    return meta, blocks[0], blocks[1], psum, compiled


_PLANS: dict = {}


def _call(x, w, b, eps: float, rms: bool):
    mod = nodes.module()
    if mod is None or w.dtype != x.dtype or (b is not None and b.dtype != x.dtype):
        return None  # (the node refuses a weight or bias of another dtype)
    key = (x.shape, x.dtype, x.device.index, rms, b is not None)
    plan = triton_support.kept_plan(_PLANS, key, lambda: make_plan(x, w, b is not None, rms))
    if plan is False:
        return None
    meta, fwd, bwd, psum, _ = plan
    return mod.triton_norm(x, w, b, eps, meta, fwd, bwd, psum)


def ln_node(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, eps: float):
    """layer_norm through the C++ node, or None where it does not apply (no built
    extension, a shape or tensors the node does not take)."""
    return _call(x, w, b, eps, False)


def rms_node(x: torch.Tensor, w: torch.Tensor, eps: float):
    """rms_norm through the C++ node, as ``ln_node``."""
    return _call(x, w, None, eps, True)
