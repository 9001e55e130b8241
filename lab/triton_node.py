"""Lab prototype: kernellab's Triton layer_norm / rms_norm kernels behind a C++ autograd node
(``lab/triton_node.cpp``), for an eager forward+backward at PyTorch's host cost.

    from triton_node import TritonNode
    node = TritonNode()                      # builds the extension (torch cpp_extension)
    y = node.layer_norm(x, w, b, eps)        # None where the node does not take the call
    y = node.rms_norm(x, w, eps)

Per (shape, dtype, device, rms, bias) the plan is what ``triton_kernels._fwd_plan`` and
``_bwd_plan`` choose for the Python path; each of its kernels is compiled once through
``warmup`` and described to the node as a launch block (see the .cpp's head):
its CUfunction, grid, threads, dynamic shared memory and one (code, value) per parameter of
the compiled kernel, read from its signature (constexprs and arguments Triton specialized
away are not parameters) and its PTX entry (the trailing scratch pointers, passed as null:
the plan refuses kernels that need scratch). ``--cpu-dry-run`` checks the parameter coding
against kernels compiled for sm_90 here (no GPU: Triton compiles for a named target).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402

# parameter codes (triton_node.cpp)
I32, I64, EPS, NULL = 100, 101, 102, 103
FWD_SLOTS = {
    "x_ptr": 0,
    "w_ptr": 1,
    "b_ptr": 2,
    "r_ptr": 0,
    "h_ptr": 3,
    "y_ptr": 3,
    "mean_ptr": 4,
    "rstd_ptr": 5,
}
BWD_SLOTS = {
    "dy_ptr": 0,
    "x_ptr": 1,
    "w_ptr": 2,
    "mean_ptr": 3,
    "rstd_ptr": 4,
    "dx_ptr": 5,
    "dres_ptr": 5,
    "dw_part_ptr": 6,
    "db_part_ptr": 7,
    "dw_ptr": 8,
    "db_ptr": 9,
}


def ptx_params(ptx: str, name: str) -> int:
    """The number of parameters of kernel ``name``'s .entry in ``ptx``."""
    m = re.search(r"\.entry\s+" + re.escape(name) + r"\s*\((.*?)\)", ptx, re.S)
    if m is None:
        raise ValueError(f"no .entry {name} in the PTX")
    return len(re.findall(r"\.param\b", m.group(1)))


def param_codes(arg_names, signature: dict, slots: dict, scalars: dict, n_ptx: int) -> list[int]:
    """The (code, value) pairs of a compiled kernel's parameters, flat: a pointer argument
    by its tensor slot, an int by its value (i32 / i64 as the signature says), ``eps`` as
    float32, and nulls for the trailing parameters the PTX entry has beyond the arguments
    (Triton's global and profile scratch)."""
    out = []
    n = 0
    for name in arg_names:
        ty = signature[name]
        if ty == "constexpr":
            continue
        n += 1
        if ty.startswith("*"):
            out += [slots[name], 0]
        elif name == "eps":
            if ty != "fp32":
                raise ValueError(f"eps typed {ty}")
            out += [EPS, 0]
        elif ty in ("i32", "i64"):
            out += [I32 if ty == "i32" else I64, int(scalars[name])]
        else:
            raise ValueError(f"{name}: parameter type {ty} is not coded")
    extra = n_ptx - n
    if not 0 <= extra <= 2:
        raise ValueError(f"{n} arguments but {n_ptx} PTX parameters")
    return out + [NULL, 0] * extra


def block(compiled, grid, slots: dict, scalars: dict) -> list[int]:
    """The launch block of a compiled kernel (a triton CompiledKernel after _init_handles)."""
    compiled._init_handles()  # (loads the module: the CUfunction, its shared-memory attribute)
    md = compiled.metadata
    for what in ("global_scratch_size", "profile_scratch_size"):
        if getattr(md, what, 0):
            raise ValueError(f"{md.name} needs {what} {getattr(md, what)}: not coded")
    if (
        getattr(md, "num_ctas", 1) != 1
        or getattr(md, "launch_cooperative_grid", False)
        or getattr(md, "launch_pdl", False)
    ):
        raise ValueError(f"{md.name}: a launch cuLaunchKernel cannot make")
    names = list(compiled.src.fn.arg_names)
    codes = param_codes(
        names, compiled.src.signature, slots, scalars, ptx_params(compiled.asm["ptx"], md.name)
    )
    g = tuple(grid) + (1,) * (3 - len(grid))
    return [int(compiled.function), *map(int, g), md.num_warps * 32, md.shared, len(codes) // 2, *codes]


class TritonNode:
    def __init__(self, verbose: bool = False):
        from torch.utils import cpp_extension

        self.ext = cpp_extension.load(
            name="kernellab_lab_triton_node",
            sources=[str(Path(__file__).with_name("triton_node.cpp"))],
            extra_cflags=["-O2"],
            verbose=verbose,
        )
        self.plans = {}

    def _plan(self, x, w, b, eps, rms):
        from kernellab.ops.norm_kernels import triton_kernels as tk

        has_bias = b is not None
        fp = tk._fwd_plan(x, rms, has_bias, False, tk.CONFIG)
        bp = tk._bwd_plan(x, w, rms, has_bias, False, tk.CONFIG)
        n_rows, n_cols = fp.n_rows, fp.n_cols
        y = torch.empty_like(x)
        rstd = torch.empty(n_rows, dtype=torch.float32, device=x.device)
        stats = rstd if rms else torch.empty_like(rstd)
        fargs = [x, w, b if has_bias else w, x, y, y, stats, rstd]
        fsc = {"n_rows": n_rows, "n_cols": n_cols, "per": fp.per}
        fargs += (
            [n_cols, eps]
            if fp.row_kernel
            else ([n_rows, n_cols, eps, fp.per] if fp.per else [n_rows, n_cols, eps])
        )
        fwd = block(
            fp.launch.kernel.warmup(*fargs, grid=fp.launch.grid, **fp.launch.kw),
            fp.launch.grid,
            FWD_SLOTS,
            fsc,
        )
        dx = torch.empty_like(x)
        dw = torch.empty_like(w)
        if bp.small:
            bargs = [x, x, w, stats, rstd, dx, dx, dw, dw, n_rows, n_cols, eps]
            bsc = {"n_rows": n_rows, "n_cols": n_cols}
            bwd = block(
                bp.launch.kernel.warmup(*bargs, grid=bp.launch.grid, **bp.launch.kw),
                bp.launch.grid,
                BWD_SLOTS,
                bsc,
            )
            psum = [0, 1, 1, 1, 32, 0, 0]
        else:
            part = torch.empty((bp.programs, n_cols), dtype=bp.part_dtype, device=x.device)
            bargs = [
                x,
                x,
                w,
                stats,
                rstd,
                dx,
                dx,
                part,
                part if not rms else rstd,
                n_rows,
                n_cols,
                bp.rows_per_program,
            ]
            bsc = {
                "n_rows": n_rows,
                "n_cols": n_cols,
                "rows_per_prog": bp.rows_per_program,
                "per": bp.rows_per_program,
            }
            bwd = block(
                bp.launch.kernel.warmup(*bargs, grid=bp.launch.grid, **bp.launch.kw),
                bp.launch.grid,
                BWD_SLOTS,
                bsc,
            )
            pargs = [part, part if not rms else rstd, dw, dw, bp.programs, n_cols]
            ps = bp.psum
            psum = block(
                ps.kernel.warmup(*pargs, grid=ps.grid, **ps.kw),
                ps.grid,
                {"dw_part_ptr": 6, "db_part_ptr": 7, "dw_ptr": 8, "db_ptr": 9},
                {"n_parts": bp.programs, "n_cols": n_cols},
            )
        meta = [int(rms), int(has_bias), int(bp.small), bp.programs, int(bp.part_dtype == torch.float64)]
        return meta, fwd, bwd, psum

    def norm(self, x, w, b, eps, rms):
        key = (x.shape, x.dtype, x.device, rms, b is None)
        plan = self.plans.get(key)
        if plan is None:
            plan = self.plans[key] = self._plan(x, w, b, eps, rms)
        return self.ext.norm(x, w, b, eps, *plan)

    def layer_norm(self, x, w, b=None, eps=1e-5):
        return self.norm(x, w, b, float(eps), False)

    def rms_norm(self, x, w, eps=1e-6):
        return self.norm(x, w, None, float(eps), True)


def _cpu_dry_run() -> int:
    """The parameter coding of the forward row kernel, the backward and the partial sum,
    compiled for sm_90 on this machine, against their PTX entries."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from kernellab.ops.norm_kernels import triton_kernels as tk

    def compiled(kernel, types: dict, constexprs: dict, warps=4):
        sig = {
            n: ("constexpr" if p.is_constexpr else types[n]) for n, p in zip(kernel.arg_names, kernel.params)
        }
        src = ASTSource(fn=kernel, signature=sig, constexprs=constexprs)
        return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps)), sig

    ptr = "*bf16"
    cases = [
        (
            tk._norm_fwd_row_kernel,
            {
                **{n: ptr for n in FWD_SLOTS},
                "mean_ptr": "*fp32",
                "rstd_ptr": "*fp32",
                "n_cols": "i32",
                "eps": "fp32",
            },
            dict(BLOCK=1024, RMS=False, HAS_BIAS=True, RES=False, EVEN=False, WIDE=True),
            FWD_SLOTS,
            {"n_cols": 768},
            [0, 0, 1, 0, 2, 0, 0, 0, 3, 0, 3, 0, 4, 0, 5, 0, I32, 768, EPS, 0],
        ),
        (
            tk._partials_sum_kernel,
            {
                "dw_part_ptr": "*fp32",
                "db_part_ptr": "*fp32",
                "dw_ptr": ptr,
                "db_ptr": ptr,
                "n_parts": "i32",
                "n_cols": "i32",
            },
            dict(HAS_DB=True, BLOCK_P=512, BLOCK_C=8, ACC=triton.language.float32),
            {"dw_part_ptr": 6, "db_part_ptr": 7, "dw_ptr": 8, "db_ptr": 9},
            {"n_parts": 264, "n_cols": 768},
            [6, 0, 7, 0, 8, 0, 9, 0, I32, 264, I32, 768],
        ),
    ]
    bad = 0
    for kernel, types, constexprs, slots, scalars, want in cases:
        ck, sig = compiled(kernel, types, constexprs)
        n_ptx = ptx_params(ck.asm["ptx"], ck.metadata.name)
        got = param_codes(kernel.arg_names, sig, slots, scalars, n_ptx)
        scratch = n_ptx - len(want) // 2
        ok = got == want + [NULL, 0] * scratch and 0 <= scratch <= 2
        bad += not ok
        print(
            f"{ck.metadata.name}: {n_ptx} PTX parameters ({scratch} scratch), shared {ck.metadata.shared}: "
            f"{'ok' if ok else f'MISMATCH {got}'}"
        )
    print(f"triton {triton.__version__}: {'all match' if not bad else f'{bad} mismatched'}")
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu-dry-run", action="store_true")
    a = ap.parse_args()
    if a.cpu_dry_run:
        return _cpu_dry_run()
    ap.error("run lab/gpu_triton_node.py on a GPU, or --cpu-dry-run here")  # (exits 2)


if __name__ == "__main__":
    sys.exit(main())
