"""What this machine has (a CUDA GPU, or only the CPU), and where a Triton launch runs:
compiled on a GPU, under Triton's interpreter for tensors on the CPU.

Also the device's *measured* ceilings (``kernellab peaks``): device-to-device copy
bandwidth and matmul rates, measured once and cached per GPU model.
"""

from __future__ import annotations

import functools
import json
import os
import time
from pathlib import Path

import torch


@functools.cache
def has_cuda() -> bool:
    return torch.cuda.is_available()


def default_device() -> str:
    return "cuda" if has_cuda() else "cpu"


def memory_bytes(dev: str) -> int | None:
    """The memory tensors on ``dev`` live in: the current GPU's (cuda), the machine's
    physical memory (cpu); None where it cannot be read."""
    try:
        if dev.startswith("cuda"):
            return torch.cuda.get_device_properties(torch.device(dev)).total_memory if has_cuda() else None
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError, RuntimeError):
        return None


def triton_interpret_forced() -> bool:
    """Whether the user set Triton's own ``TRITON_INTERPRET``: Triton then builds every
    kernel, its own library functions included, for the interpreter, GPU tensors too."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def triton_interpreted(where=None) -> bool:
    """Whether a Triton launch on ``where`` (a tensor, a torch.device or a device type;
    None: this machine's default device) runs under Triton's interpreter: anything off a
    CUDA device does, and everything does when ``triton_interpret_forced``."""
    if isinstance(where, torch.Tensor):  # (is_cuda: a fraction of device.type's cost)
        return not where.is_cuda or triton_interpret_forced()
    if where is None:
        kind = default_device()
    elif isinstance(where, str):
        kind = where.split(":")[0]
    else:
        kind = getattr(where, "device", where).type
    return kind != "cuda" or triton_interpret_forced()


def gpu_name() -> str:
    if not has_cuda():
        return "cpu"
    return torch.cuda.get_device_name()


def capability() -> tuple[int, int] | None:
    return torch.cuda.get_device_capability() if has_cuda() else None


@functools.cache
def is_sm90(index: int) -> bool:
    """Whether CUDA device ``index`` is Hopper (sm_90: wgmma, warp specialization): asked
    once per device, not per call."""
    return torch.cuda.get_device_capability(index) == (9, 0)


def arch() -> str | None:
    cap = capability()
    return f"sm_{cap[0]}{cap[1]}" if cap else None


def l2_bytes(index: int | None = None) -> int:
    """L2 bytes of CUDA device ``index`` (None: the current one; 50 MiB where torch cannot
    say); 0 without a GPU."""
    if not has_cuda():
        return 0
    props = torch.cuda.get_device_properties(torch.cuda.current_device() if index is None else index)
    return int(getattr(props, "L2_cache_size", 0) or 50 * 2**20)


def summary() -> dict:
    d = {"device": gpu_name(), "torch": torch.__version__}
    try:
        import triton

        d["triton"] = triton.__version__
    except ImportError:  # pragma: no cover - triton is a dependency on Linux
        d["triton"] = None
    if has_cuda():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        d.update(
            capability=arch(),
            sms=props.multi_processor_count,
            l2_mb=round(l2_bytes() / 2**20, 1),
            memory_gb=round(props.total_memory / 2**30, 1),
            cuda=torch.version.cuda,
        )
    else:
        d["triton_mode"] = "interpreter"
    return d


# --------------------------------------------------------------------------- ceilings


def cache_root() -> Path:
    """kernellab's cache directory ($KERNELLAB_CACHE, else $XDG_CACHE_HOME or ~/.cache, then
    kernellab), not created: for readers."""
    return Path(os.environ.get("KERNELLAB_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "kernellab"))  # fmt: skip


def cache_dir() -> Path:
    """``cache_root``, created: for writers."""
    p = cache_root()
    p.mkdir(parents=True, exist_ok=True)
    return p


def _peaks_path() -> Path:
    safe = "".join(c if c.isalnum() else "_" for c in gpu_name())
    return cache_dir() / f"peaks-{safe}.json"


def _median_ms(fn, reps: int) -> float:
    start = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    end = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        start[i].record()
        fn()
        end[i].record()
    torch.cuda.synchronize()
    times = sorted(s.elapsed_time(e) for s, e in zip(start, end))
    return times[len(times) // 2]


def _copy_gbps(n: int) -> float:
    src = torch.randn(n, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    ms = _median_ms(lambda: dst.copy_(src), 30)
    return 2 * n * src.element_size() / ms / 1e6  # bytes read + bytes written


def _matmul_tflops(mm: int, dtype: torch.dtype) -> float:
    a = torch.randn(mm, mm, device="cuda", dtype=dtype)  # random data: zeros run faster
    b = torch.randn(mm, mm, device="cuda", dtype=dtype)
    for _ in range(3):
        a @ b
    ms = _median_ms(lambda: a @ b, 10)
    return 2 * mm**3 / ms / 1e9


def measure_peaks(copy_gib: float = 1.0, mm: int = 8192, progress=None) -> dict:
    """Measure copy bandwidth (bytes read + written) and matmul rates on random data."""
    if not has_cuda():
        raise RuntimeError("kernellab peaks needs a CUDA GPU; this machine has none")
    copy_gbps = _copy_gbps(int(copy_gib * 2**30) // 4)
    torch.cuda.empty_cache()
    rates = {}
    old_tf32 = torch.backends.cuda.matmul.allow_tf32
    try:
        for label, dtype, tf32 in [
            ("fp32", torch.float32, False),
            ("tf32", torch.float32, True),
            ("fp16", torch.float16, False),
            ("bf16", torch.bfloat16, False),
        ]:
            if progress:
                progress(label)
            torch.backends.cuda.matmul.allow_tf32 = tf32
            rates[label] = round(_matmul_tflops(mm, dtype), 1)
            torch.cuda.empty_cache()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old_tf32
    return {
        "gpu": gpu_name(),
        "copy_gbps": round(copy_gbps, 1),
        "matmul_tflops": rates,
        "measured": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "torch": torch.__version__,
    }


def peaks(measure_if_missing: bool = True, refresh: bool = False) -> dict | None:
    """The cached ceilings of this GPU (measured on first use); None on the CPU."""
    if not has_cuda():
        return None
    path = _peaks_path()
    if path.exists() and not refresh:
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            pass
    if not measure_if_missing and not refresh:
        return None
    result = measure_peaks()
    path.write_text(json.dumps(result, indent=2))
    return result
