"""Reading the machine code: PTX, SASS and resource usage of a backend's kernels.

CUDA backends: the module's source is compiled here with NVRTC (PTX, and a cubin for the
chosen arch), so this works without a GPU. SASS and the resource report (registers, stack,
shared and local memory per thread/block) come from ``cuobjdump``, found on PATH, in a CUDA
toolkit, or in Triton's wheel (which ships one).

Triton backends: each declares its kernels and their signatures for a dtype
(``Impl.triton_kernels``); ``triton_report`` compiles them ahead of time for the chosen arch
with ``triton.compile`` and a ``GPUTarget`` - no GPU needed (Triton 3.9 does this on the CPU
machine). Where that fails, on a GPU ``triton_artifacts`` runs the backend once in a fresh
process with a private TRITON_CACHE_DIR and reads what Triton wrote.

The summary counts what usually decides speed: 16-byte global accesses (``ld.global.v4`` /
``LDG.E.128``), local-memory traffic (spills: ``LDL``/``STL``), tensor-core instructions
(``HMMA``, ``HGMMA``), special-function instructions (``MUFU``), shared-memory loads and
stores (``LDS`` / ``STS``), tensor-memory-accelerator copies (``UTMALDG`` / ``UTMASTG`` /
``UTMAREDG``: Hopper's bulk tile loads, stores and reductions, which take the place of
per-thread global loads).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path


def find_tool(name: str) -> str | None:
    """cuobjdump / nvdisasm: PATH, CUDA_HOME/bin, /usr/local/cuda/bin, Triton's wheel."""
    found = shutil.which(name)
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if root and os.access(os.path.join(root, "bin", name), os.X_OK):
            return os.path.join(root, "bin", name)
    try:
        import triton

        p = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
        if os.access(p, os.X_OK):
            return str(p)
    except ImportError:
        pass
    return None


@dataclass
class KernelAsm:
    name: str
    registers: int | None = None
    stack_bytes: int | None = None
    shared_bytes: int | None = None
    local_bytes: int | None = None
    counts: dict = field(default_factory=dict)
    ptx: str = ""
    sass: str = ""

    def to_dict(self, with_text: bool = False) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k not in ("ptx", "sass")}
        if with_text:
            d.update(ptx=self.ptx, sass=self.sass)
        return d


def split_ptx(ptx: str) -> dict[str, str]:
    """PTX text of each ``.entry``."""
    starts = [(m.start(), m.group(1)) for m in re.finditer(r"\.(?:visible\s+)?\.entry\s+(\w+)", ptx)]
    out = {}
    for i, (pos, name) in enumerate(starts):
        end = starts[i + 1][0] if i + 1 < len(starts) else len(ptx)
        out[name] = ptx[pos:end]
    return out


def parse_res_usage(text: str) -> dict[str, dict]:
    """``cuobjdump -res-usage`` -> {function: {REG, STACK, SHARED, LOCAL}}."""
    out, current = {}, None
    for line in text.splitlines():
        m = re.match(r"\s*Function\s+(\S+?):?\s*$", line)
        if m:
            current = m.group(1)
            continue
        if current and "REG:" in line:
            out[current] = {k: int(v) for k, v in re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", line)}
            current = None
    return out


def split_sass(text: str) -> dict[str, str]:
    """``cuobjdump -sass`` -> {function: instructions} (encoding-only lines dropped)."""
    out, name, lines = {}, None, []
    for line in text.splitlines():
        m = re.match(r"\s*Function\s*:\s*(\S+)", line)
        if m:
            if name:
                out[name] = "\n".join(lines)
            name, lines = m.group(1), []
            continue
        if name and re.search(r"/\*[0-9a-f]{4}\*/", line):
            lines.append(re.sub(r"\s*/\* 0x[0-9a-f]+ \*/\s*$", "", line).rstrip())
    if name:
        out[name] = "\n".join(lines)
    return out


def _ptx_global(op: str, vec: str):
    # qualifiers may include cache policies such as .L1::evict_last
    return (rf"{op}\.global(?:\.[\w:]+)*\.{vec}\.", "ptx")


def _sass_wide(op: str, bits: int):
    return (rf"\b{op}\.E\.{bits}\b|\b{op}\.E\.(?:\w+\.)*{bits}\b", "sass")


_PATTERNS = {
    "ptx_ld_global_v4": _ptx_global("ld", "v4"),
    "ptx_st_global_v4": _ptx_global("st", "v4"),
    "ptx_ld_global_v2": _ptx_global("ld", "v2"),
    "ptx_local": (r"\b(?:ld|st)\.local\b", "ptx"),
    "LDG_128": _sass_wide("LDG", 128),
    "STG_128": _sass_wide("STG", 128),
    "LDG_64": _sass_wide("LDG", 64),
    "LDG": (r"\bLDG\b", "sass"),
    "STG": (r"\bSTG\b", "sass"),
    "LDL_STL": (r"\b(?:LDL|STL)\b", "sass"),
    "ptx_shared": (r"\b(?:ld|st)\.shared\b", "ptx"),
    "LDS": (r"\bLDS\b", "sass"),  # shared-memory loads and stores (LDS.U16, LDS.128 too; not LDSM)
    "STS": (r"\bSTS\b", "sass"),
    "ptx_cp_async_16": (r"\bcp\.async\.c[ag]\.shared\.global(?:\.[\w:]+)*\s+\[[^]]*\],\s*\[[^]]*\],\s*16\b",
                        "ptx"),
    "LDGSTS_128": (r"\bLDGSTS\.E(?:\.\w+)*\.128\b", "sass"),  # cp.async: global -> shared, 16 bytes
    "ptx_tma": (r"\bcp\.(?:async\.bulk|reduce\.async\.bulk)\.tensor\b", "ptx"),  # TMA copies
    "TMA": (r"\bUTMA(?:LDG|STG|REDG)\b", "sass"),
    "HMMA": (r"\bHMMA\b", "sass"),
    "HGMMA": (r"\bHGMMA\b", "sass"),
    "MUFU": (r"\bMUFU\b", "sass"),
}


def count_instructions(ptx: str, sass: str) -> dict:
    text = {"ptx": ptx, "sass": sass}
    c = {k: len(re.findall(pat, text[src])) for k, (pat, src) in _PATTERNS.items()}
    c["sass_instructions"] = len([ln for ln in sass.splitlines() if ln.strip()])
    return c


def analyze(ptx: str, cubin: bytes | None, names_filter=None) -> tuple[list[KernelAsm], str]:
    """KernelAsm per entry of ``ptx`` (optionally filtered by a callable on the name); with
    a cubin and cuobjdump, SASS and resources too. Returns (kernels, note)."""
    ptx_by = split_ptx(ptx)
    names = [n for n in ptx_by if names_filter is None or names_filter(n)]
    res, sass_by, note = {}, {}, ""
    tool = find_tool("cuobjdump")
    if cubin is None:
        note = "no cubin: PTX only"
    elif tool is None:
        note = "cuobjdump not found: PTX only (install the CUDA toolkit or Triton)"
    else:
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "k.cubin")
            with open(path, "wb") as f:
                f.write(cubin)
            r = subprocess.run([tool, "-res-usage", path], capture_output=True, text=True, timeout=120)
            s = subprocess.run([tool, "-sass", path], capture_output=True, text=True, timeout=120)
        res = parse_res_usage(r.stdout)
        sass_by = split_sass(s.stdout)
        if not sass_by:
            note = f"cuobjdump printed no SASS: {(s.stderr or r.stderr).strip()[:200]}"
    out = []
    for n in names:
        u = res.get(n, {})
        sass = sass_by.get(n, "")
        out.append(
            KernelAsm(
                n,
                u.get("REG"),
                u.get("STACK"),
                u.get("SHARED"),
                u.get("LOCAL"),
                count_instructions(ptx_by[n], sass),
                ptx_by[n],
                sass,
            )
        )
    return out, note


def cuda_backend_filter(backend: str, dtype_suffix: str | None):
    """Kernel names of a backend, by the naming contract of our .cu files: cuda_vN owns
    ``*_vN_*``; ``cuda`` owns the names without a version tag; a dtype suffix narrows."""
    m = re.fullmatch(r"cuda_v(\d+)", backend)

    def keep(name: str) -> bool:
        if dtype_suffix and not name.endswith("_" + dtype_suffix):
            return False
        if m:
            return f"_v{m.group(1)}_" in name
        return re.search(r"_v\d+_", name) is None

    return keep


def cuda_parts(module, arch: str, backend: str) -> list[tuple]:
    """(module, backends) pairs whose kernels ``backend`` launches on ``arch``. A module may
    name the variants an alias backend runs: ``module.asm_aliases = {"cuda": ("cuda_v7",
    "cuda_v9")}`` (matmul's ``cuda`` is v7 for fp32 and v9 for fp16/bf16), or, where they
    live in several modules or depend on the arch, ``module.asm_parts = {backend: [(module,
    backends), ...]}`` or a callable of the arch giving that list."""
    parts = getattr(module, "asm_parts", {}).get(backend)
    if parts is None:
        return [(module, getattr(module, "asm_aliases", {}).get(backend, (backend,)))]
    return list(parts(arch) if callable(parts) else parts)


def _module_report(module, arch, targets, dtype_suffix, rx, fallback=True):
    ptx = module.compile(arch, target="ptx").decode()
    cubin = module.compile(arch)
    names = list(split_ptx(ptx))

    def chooser(suffix):
        keeps = [cuda_backend_filter(b, suffix) for b in targets]
        return lambda n: any(k(n) for k in keeps) and (rx is None or rx.search(n) is not None)

    keep = chooser(dtype_suffix)
    if fallback and dtype_suffix and not any(keep(n) for n in names) and any(chooser(None)(n) for n in names):
        # e.g. a tensor-core variant asked for fp32: show its kernels for the dtypes it has
        kernels, note = analyze(ptx, cubin, chooser(None))
        extra = f"{'/'.join(targets)} has no {dtype_suffix} kernel; showing its other dtypes"
        return kernels, f"{note}; {extra}" if note else extra
    return analyze(ptx, cubin, keep)


def cuda_report(module, arch: str, backend: str, dtype_suffix: str | None, kernel_regex: str | None = None):
    """The kernels ``backend`` launches (``cuda_parts``), compiled for ``arch`` with NVRTC."""
    rx = re.compile(kernel_regex) if kernel_regex else None
    parts = cuda_parts(module, arch, backend)
    # several parts: those with kernels of the dtype (fp32 matmul on sm_90 runs v7, not v15);
    # none has any: every part's other dtypes, as one part shows them
    for fallback in (len(parts) == 1, True):
        kernels, notes = [], []
        for part, targets in parts:
            k, note = _module_report(part, arch, targets, dtype_suffix, rx, fallback)
            kernels += k
            if note:
                notes.append(note)
        if kernels or fallback:
            break
    return kernels, "; ".join(dict.fromkeys(notes))


def triton_artifacts(op: str, shape, dtype: str) -> tuple[list[KernelAsm], str]:
    """Run ``op``'s Triton backend once in a fresh process (so it really compiles) with a
    private TRITON_CACHE_DIR, then analyze the PTX and cubin Triton wrote there."""
    import sys

    from kernellab import device

    if not device.has_cuda():
        return [], (
            "Triton compiles kernels only for a GPU here; on this machine kernellab runs them under "
            "the Triton interpreter, which produces no PTX or SASS - run `kernellab asm` on a GPU"
        )
    code = (
        "import torch\n"
        "from kernellab.core.spec import parse_dtype\n"
        "from kernellab.profile.torchprof import op_call\n"
        f"op_call({op!r}, 'triton', {tuple(shape)!r}, parse_dtype({dtype!r}))()\n"
        "torch.cuda.synchronize()\n"
    )
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, TRITON_CACHE_DIR=d)
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600
        )
        if proc.returncode != 0:
            return [], f"running the Triton backend failed: {proc.stderr.strip()[-400:]}"
        ptxs = sorted(Path(d).rglob("*.ptx"))
        if not ptxs:
            return [], "Triton wrote no PTX to its cache"
        kernels, notes = [], []
        for p in ptxs:
            cubins = list(p.parent.glob("*.cubin"))
            ks, note = analyze(p.read_text(), cubins[0].read_bytes() if cubins else None)
            kernels += ks
            if note:
                notes.append(note)
        return kernels, "; ".join(sorted(set(notes)))


_TRITON_TYPES = {"fp32": "fp32", "fp16": "fp16", "bf16": "bf16"}


def _jit(kernel):
    """The JITFunction behind a kernel (an InterpretedFunction's Python function otherwise)."""
    from triton.runtime.jit import JITFunction

    return kernel if isinstance(kernel, JITFunction) else JITFunction(kernel.fn)


def kernel_specs(impl, dtype: str, arch: str | None = None) -> list:
    """The backend's declared kernels for ``dtype``; a spec function that takes ``arch``
    (where the launcher picks other kernels on some GPUs) is given it."""
    import inspect

    if "arch" in inspect.signature(impl.triton_kernels).parameters:
        return impl.triton_kernels(dtype, arch=arch)
    return impl.triton_kernels(dtype)


def compile_triton_kernels(op: str, backend: str, dtype_name: str, arch: str, out_dir: str) -> list[str]:
    """Compile the backend's declared kernels with triton.compile for ``arch`` and write
    ``<kernel>.ptx`` / ``<kernel>.cubin`` into ``out_dir``; returns error lines. Runs in a
    process with TRITON_INTERPRET=0: a user's TRITON_INTERPRET=1 makes Triton build its own
    library functions (the combine functions of tl.max, tl.sum) for the interpreter, and
    those cannot compile."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from kernellab.core import registry

    impl = registry.get(op, backend)
    cap = int(arch.removeprefix("sm_").rstrip("a"))
    errors = []
    for kernel, signature, constexprs, launch in kernel_specs(impl, _TRITON_TYPES[dtype_name], arch):
        # launch: the warps, or the compile options the launcher passes (num_warps, ...),
        # with "values": the integer arguments at the spec's shape where it gives them
        options = dict(launch) if isinstance(launch, dict) else {"num_warps": launch}
        values = options.pop("values", {})
        fn = _jit(kernel)
        # an integer of value 1 is a constant of the compiled kernel, as at a launch
        ones = {n: 1 for n, v in values.items() if v == 1 and signature.get(n, "constexpr") != "constexpr"}
        signature = dict(signature, **dict.fromkeys(ones, "constexpr"))
        constexprs = dict(constexprs, **ones)
        # in the kernel's parameter order: older Triton (3.6) keys constexprs by that index
        signature = {n: signature[n] for n in fn.arg_names if n in signature}
        names = list(signature)
        # The specialization Triton makes at run time for our launches: every pointer is
        # 16-byte aligned (the allocator); an integer is marked a multiple of 16 where its
        # value at the spec's shape is one, or, with no value given, as at benchmark
        # shapes. (Without the marks the compiled code has no 16-byte accesses; with a
        # mark the launch would not get - 14, 28 - it shows accesses that do not run.)
        attrs = {
            (i,): [["tt.divisibility", 16]]
            for i, n in enumerate(names)
            if signature[n] != "constexpr" and values.get(n, 16) % 16 == 0
        }
        attempts = (constexprs, {(fn.arg_names.index(k),): v for k, v in constexprs.items()})
        compiled, err = None, None
        for cx in attempts:  # constexpr keys by name (Triton 3.9) or by index (older)
            try:
                src = ASTSource(fn=fn, signature=signature, constexprs=cx, attrs=attrs)
                compiled = triton.compile(src, target=GPUTarget("cuda", cap, 32), options=options)
                break
            except Exception as e:  # noqa: BLE001 - reported to the caller
                err = e
        if compiled is None:
            errors.append(f"{fn.__name__}: triton.compile failed: {type(err).__name__}: {str(err)[-300:]}")
            continue
        base = os.path.join(out_dir, fn.__name__)
        with open(base + ".ptx", "w") as f:
            f.write(compiled.asm["ptx"])
        with open(base + ".ttgir", "w") as f:  # (the layouts Triton chose for each access)
            f.write(compiled.asm["ttgir"])
        if compiled.asm.get("cubin"):
            with open(base + ".cubin", "wb") as f:
                f.write(compiled.asm["cubin"])
    return errors


def triton_report(impl, dtype_name: str, arch: str) -> tuple[list[KernelAsm], str]:
    """Ahead-of-time compile of the backend's declared kernels (``impl.triton_kernels``) for
    ``arch`` - no GPU needed - in a fresh process, then analyze the PTX and cubins."""
    import json
    import sys

    if impl.triton_kernels is None:
        return [], f"{impl.name} declares no Triton kernels to compile ahead of time"
    with tempfile.TemporaryDirectory() as d:
        code = (
            "import json, sys\n"
            "from kernellab.inspect.asm import compile_triton_kernels\n"
            f"errs = compile_triton_kernels({impl.op!r}, {impl.backend!r}, {dtype_name!r}, {arch!r}, {d!r})\n"
            "print(json.dumps(errs))\n"
        )
        env = dict(os.environ, TRITON_INTERPRET="0")
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600
        )
        notes = []
        try:
            notes += json.loads(proc.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            notes.append(f"ahead-of-time compile failed: {proc.stderr.strip()[-400:]}")
        kernels = []
        for p in sorted(Path(d).glob("*.ptx")):
            cubin = p.with_suffix(".cubin")
            ks, note = analyze(p.read_text(), cubin.read_bytes() if cubin.exists() else None)
            kernels += ks
            if note:
                notes.append(note)
    return kernels, "; ".join(sorted(set(notes)))
