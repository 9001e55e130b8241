"""Nsight Compute front-end: profile one call of an op's kernels and summarize what matters.

``kernellab profile OP --ncu`` re-runs itself under ``ncu`` as a target process that warms
the op up and then makes one call inside the NVTX range ``kernellab_profile``; ncu profiles
only kernels in that range (``--nvtx-include kernellab_profile/``), with the GPU clocks left
as they are (``--clock-control none``). The CSV it prints (``--page details``) is parsed into
one summary per kernel: speed-of-light memory and compute throughput, achieved and
theoretical occupancy and the limiter of the theoretical one, registers per thread and
shared memory per block.
"""

from __future__ import annotations

import csv
import io
import os
import shutil
import subprocess
import sys

NVTX_RANGE = "kernellab_profile"
SECTIONS = ("SpeedOfLight", "Occupancy", "LaunchStats")

# ncu metric name -> our key
_METRICS = {
    "Memory Throughput": "mem_sol_pct",
    "DRAM Throughput": "dram_pct",
    "Compute (SM) Throughput": "compute_sol_pct",
    "Duration": "duration",
    "Achieved Occupancy": "achieved_occupancy_pct",
    "Theoretical Occupancy": "theoretical_occupancy_pct",
    "Registers Per Thread": "registers_per_thread",
    "Static Shared Memory Per Block": "static_smem_per_block",
    "Dynamic Shared Memory Per Block": "dynamic_smem_per_block",
    "Block Size": "block_size",
    "Grid Size": "grid_size",
    "Block Limit Registers": "limit_registers",
    "Block Limit Shared Mem": "limit_shared_mem",
    "Block Limit Warps": "limit_warps",
    "Block Limit SM": "limit_sm",
}
_LIMITS = {
    "limit_registers": "registers",
    "limit_shared_mem": "shared memory",
    "limit_warps": "warps per SM",
    "limit_sm": "blocks per SM",
}


def find_ncu() -> str | None:
    found = shutil.which("ncu")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if root and os.access(os.path.join(root, "bin", "ncu"), os.X_OK):
            return os.path.join(root, "bin", "ncu")
    return None


def _number(text: str):
    t = (text or "").strip().replace(",", "")
    try:
        return float(t)
    except ValueError:
        return None


_TIME_TO_US = {
    "nsecond": 1e-3,
    "ns": 1e-3,
    "usecond": 1.0,
    "us": 1.0,
    "msecond": 1e3,
    "ms": 1e3,
    "second": 1e6,
    "s": 1e6,
}


def parse_csv(text: str) -> list[dict]:
    """Kernels from ``ncu --csv --page details`` output (lines before the header, such as
    ``==PROF==`` messages and the program's own output, are skipped)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        return []
    kernels: dict[str, dict] = {}
    for row in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        kid = row.get("ID")
        if kid is None or row.get("Kernel Name") is None:
            continue
        k = kernels.setdefault(kid, {"id": int(kid) if kid.isdigit() else kid, "kernel": row["Kernel Name"]})
        key = _METRICS.get(row.get("Metric Name", ""))
        if key is None:
            continue
        val = _number(row.get("Metric Value", ""))
        unit = (row.get("Metric Unit") or "").strip()
        if key == "duration" and val is not None:
            # ncu writes "nsecond"/"usecond"/"msecond" or, in newer releases, "ns"/"us"/"ms".
            val = val * _TIME_TO_US.get(unit, 1.0)
            k["duration_unit_seen"] = unit
            key = "duration_us"
        elif key in ("static_smem_per_block", "dynamic_smem_per_block") and val is not None:
            val = val * {"byte": 1, "B": 1, "Kbyte": 1024, "KB": 1024, "Mbyte": 2**20, "MB": 2**20}.get(
                unit, 1
            )
        k[key] = val
    out = []
    for k in kernels.values():
        limits = {name: k[key] for key, name in _LIMITS.items() if k.get(key) is not None}
        if limits:
            k["occupancy_limiter"] = min(limits, key=limits.get)
        out.append(k)
    return out


def run(op: str, backend: str, shape: str, dtype: str, mode: str = "fwd", timeout: int = 600) -> dict:
    """Profile under ncu; returns {"kernels": [...], "command": ...} or {"error": why}."""
    ncu = find_ncu()
    if ncu is None:
        return {
            "error": "Nsight Compute (ncu) is not installed or not on PATH; install it with the CUDA toolkit"
        }
    cmd = [
        ncu,
        "--clock-control",
        "none",
        "--target-processes",
        "all",
        "--nvtx",
        "--nvtx-include",
        f"{NVTX_RANGE}/",
        *[a for s in SECTIONS for a in ("--section", s)],
        "--csv",
        "--page",
        "details",
        sys.executable,
        "-m",
        "kernellab",
        "profile",
        op,
        "--backend",
        backend,
        "--shape",
        shape,
        "--dtype",
        dtype,
        "--mode",
        mode,
        "--ncu-target",
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"ncu did not finish in {timeout} s", "command": " ".join(cmd)}
    text = proc.stdout + "\n" + proc.stderr
    if "ERR_NVGPUCTRPERM" in text:
        return {
            "error": "ncu is not permitted to read the GPU's performance counters here "
            "(ERR_NVGPUCTRPERM: needs admin rights or NVreg_RestrictProfilingToAdminUsers=0)",
            "command": " ".join(cmd),
        }
    kernels = parse_csv(proc.stdout)
    if not kernels:
        tail = "\n".join(text.strip().splitlines()[-8:])
        return {
            "error": f"ncu profiled no kernel (exit {proc.returncode}):\n{tail}",
            "command": " ".join(cmd),
        }
    return {"kernels": kernels, "command": " ".join(cmd)}
