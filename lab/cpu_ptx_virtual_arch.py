"""Whether NVRTC's PTX for a real arch (sm_90, sm_90a) equals its PTX for the matching
virtual arch (compute_90, compute_90a), which skips ptxas, for every Module the package
builds at import, and what each compile costs. No GPU needed.

    PYTHONPATH=src python lab/cpu_ptx_virtual_arch.py [--archs sm_80 sm_90]

Written to decide whether a PTX-only request (tests that read the PTX, `kernellab asm`
before a cubin is cached) may compile for the virtual arch. Result (CPU, 2026-12-07): the
PTX is byte-equal for all 32 modules at sm_80 / sm_90 / sm_90a, the virtual compile takes
49% of the time (163 s against 335). Tried in compile_source and reverted: the tests read
the PTX of most builds before their cubin or log, which then paid NVRTC's front end twice
(the six CUDA-heavy test files at -n 2: 301 s against 263).
"""

import argparse
import gc
import tempfile
import time

import kernellab  # noqa: F401  (builds every op's Module)
from kernellab.cuda import runtime


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--archs", nargs="+", default=["sm_80", "sm_90"])
    a = ap.parse_args()
    mods = {}
    for o in gc.get_objects():
        if isinstance(o, runtime.Module) and o.path is not None:
            mods.setdefault((str(o.path), o.options, o.archs), o)
    bad, t_real, t_virt = 0, 0.0, 0.0
    for _, m in sorted(mods.items(), key=lambda kv: kv[0][0]):
        for want in a.archs:
            try:
                arch = m.target_arch(want)
            except runtime.CudaError:  # (a module built for sm_90a only)
                continue
            kw = dict(options=m.options, base_dir=m.path.parent, name=m.label, use_cache=False)
            t0 = time.perf_counter()
            real = runtime.compile_source(m.source, arch, target="ptx", **kw)
            t1 = time.perf_counter()
            virt = runtime.compile_source(m.source, "compute_" + arch[3:], target="ptx", **kw)
            t2 = time.perf_counter()
            t_real, t_virt = t_real + t1 - t0, t_virt + t2 - t1
            same = real == virt
            bad += not same
            print(f"{m.label} {' '.join(m.options)} {arch}: real {t1 - t0:.1f} s, virtual {t2 - t1:.1f} s, "
                  f"{'PTX equal' if same else 'PTX DIFFERS'}", flush=True)  # fmt: skip
    print(f"{len(mods)} modules, {bad} builds differ; real {t_real:.0f} s, virtual {t_virt:.0f} s")
    return int(bad > 0)


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as d:
        import os

        os.environ["KERNELLAB_CACHE"] = d
        raise SystemExit(main())
