"""The cubin the runtime's one-run NVRTC compile makes against cuda.core's Program compile
of the same module: their SASS (cuobjdump -sass), for every Module the package builds at
import, at sm_90 (sm_90a where the module is built for it). No GPU needed.

    PYTHONPATH=src python lab/cpu_sass_equal_cuda_core.py

Written when runtime.compile_source moved from cuda.core's Program to one raw NVRTC run
(cubin, PTX and ptxas log together) in a session with no GPU: the code a GPU would load
is the same code.
"""

import gc
import subprocess
import tempfile

from cuda.core import Program, ProgramOptions

import kernellab  # noqa: F401  (builds every op's Module)
from kernellab.cuda import runtime
from kernellab.inspect import asm


def sass(cubin: bytes, cuobjdump: str) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([cuobjdump, "-sass", f.name], capture_output=True, text=True, check=True).stdout


def cuda_core_cubin(m: runtime.Module, arch: str) -> bytes:
    kw = dict(name=m.label, arch=arch, std="c++17",
              include_path=[str(m.path.parent), str(runtime.HERE), *runtime.include_dirs()])  # fmt: skip
    macros = [o[2:].partition("=")[::2] if "=" in o else o[2:] for o in m.options if o.startswith("-D")]
    if macros:
        kw["define_macro"] = macros
    return Program(m.source, code_type="c++", options=ProgramOptions(**kw)).compile("cubin").code


def main() -> int:
    cuobjdump = asm.find_tool("cuobjdump")
    mods = {}
    for o in gc.get_objects():
        if isinstance(o, runtime.Module) and o.path is not None:
            mods.setdefault((str(o.path), o.options, o.archs), o)
    bad = 0
    for _, m in sorted(mods.items(), key=lambda kv: kv[0][0]):
        arch = m.target_arch("sm_90")
        same = sass(m.compile("sm_90"), cuobjdump) == sass(cuda_core_cubin(m, arch), cuobjdump)
        bad += not same
        print(m.label, m.options, arch, "SASS equal" if same else "SASS DIFFERS", flush=True)
    print(f"{len(mods)} modules, {bad} differ")
    return int(bad > 0)


if __name__ == "__main__":
    raise SystemExit(main())
