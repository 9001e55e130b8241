"""Host cost per call of the CUDA launch path, piece by piece, against torch.add.

Each line: microseconds of host time per call, calls issued back to back on a 1024-element
fp32 tensor (the GPU work is far shorter than the launch, so this is pure host cost);
median of 5 interleaved rounds.
Writes JSON rows to the file given as argv[1] (optional).
"""

import json
import sys
import time

import torch

import kernellab
from kernellab.core.spec import get_spec
from kernellab.ops import _elementwise_cuda as elementwise
from kernellab.ops.add import cuda as add_cuda


def per_call_us(fn, n=20000):
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


a = torch.randn(1024, device="cuda")
b = torch.randn(1024, device="cuda")
y = torch.empty_like(a)
spec = get_spec("add")
impl = kernellab.get("add", "cuda")
k = add_cuda.MODULE.kernel("add_f32", ("ptr", "ptr", "ptr", "i64"), 0)

rows = {
    "torch.add(a, b)": lambda: torch.add(a, b),
    "torch.empty_like(a)": lambda: torch.empty_like(a),
    "spec.validate": lambda: spec.validate((a, b), {}, ("cuda",)),
    "Kernel(...) launch only, preallocated y": lambda: k(1, 256, a, b, y, 1024, device_index=0),
    "elementwise.launch (alloc + launch)": lambda: elementwise.launch(add_cuda.MODULE, "add", [a, b]),
    "kernellab.get('add','cuda')(a, b)": lambda: impl(a, b),
    "kernellab.add(a, b, backend='cuda')": lambda: kernellab.add(a, b, backend="cuda"),
    "torch.nn.functional.gelu(a)": lambda: torch.nn.functional.gelu(a, approximate="tanh"),
    "kernellab.gelu(a, backend='cuda')": lambda: kernellab.gelu(a, backend="cuda"),
}
# Separate Kernel objects for the comparison paths (the cached one stays on ctypes).
Kernel = type(k)
k_kernel = Kernel(k._core_kernel, "add_f32", k.signature)
k_kernel._handle = int(k._core_kernel.handle)  # CUkernel: resolved per launch by the driver
rows["Kernel(...) with the CUkernel handle"] = lambda: k_kernel(1, 256, a, b, y, 1024, device_index=0)
k_core = Kernel(k._core_kernel, "add_f32", k.signature)
k_core._use_core = True
rows["Kernel(...) via cuda.core.launch"] = lambda: k_core(1, 256, a, b, y, 1024, device_index=0)
# Rows interleaved over several rounds, median per row: the host is a shared VM, and one
# pass per row picked up slow periods (the same row read 11 and 15 us in two runs).
samples = {name: [] for name in rows}
for _ in range(5):
    for name, fn in rows.items():
        samples[name].append(per_call_us(fn, 1000 if "cuda.core" in name else 4000))
out = [{"what": name, "host_us": round(sorted(v)[len(v) // 2], 2)} for name, v in samples.items()]
base = out[0]["host_us"]
print(f"{'what':45s} {'host us/call':>12s} {'vs torch.add':>12s}")
for r in out:
    print(f"{r['what']:45s} {r['host_us']:12.2f} {r['host_us'] / base:11.2f}x")
if len(sys.argv) > 1:
    with open(sys.argv[1], "w") as f:
        for r in out:
            f.write(json.dumps({**r, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__}) + "\n")
