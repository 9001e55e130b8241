"""The lecture's MLP: ``layers`` x (Linear(dim, dim) -> GeLU), trained with SGD.

The GeLU is kernellab's (any registered backend), so the model exercises the custom op's
forward and backward inside a real training step; each step is an NVTX range (and a
torch.profiler range) with forward / backward / optimizer phases inside.
"""

from __future__ import annotations

import time

import torch
from torch import nn
from torch.profiler import record_function

import kernellab
from kernellab.profile.nvtx import nvtx_range


class MLP(nn.Module):
    def __init__(self, dim: int, layers: int, gelu_backend: str | None = None):
        super().__init__()
        if dim < 1 or layers < 1:
            raise ValueError(f"dim and layers must be >= 1, got dim={dim}, layers={layers}")
        self.layers = nn.ModuleList(nn.Linear(dim, dim) for _ in range(layers))
        self.gelu_backend = gelu_backend

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = kernellab.gelu(layer(x), backend=self.gelu_backend)
        return x


def make(dim=128, layers=16, batch=128, device=None, gelu_backend=None, seed=0):
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(seed)
    model = MLP(dim, layers, gelu_backend).to(device)
    x = torch.randn(batch, dim, device=device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    return model, x, opt


def train_step(model, x, opt, i: int, sync_loss: bool = False):
    """One step; with ``sync_loss`` the loss is read back to the host (``loss.item()``, the
    "print the loss" habit), which makes the CPU wait for the GPU every step."""
    with nvtx_range(f"step_{i}"), record_function(f"step_{i}"):
        with nvtx_range("forward"):
            loss = model(x).mean()
        with nvtx_range("backward"):
            opt.zero_grad(set_to_none=True)
            loss.backward()
        with nvtx_range("optimizer.step"):
            opt.step()
        if sync_loss:
            loss.item()
    return loss


def run(model, x, opt, steps: int, sync_loss: bool = False) -> float:
    """Wall time per step in ms (the final synchronize included: the work is all done)."""
    cuda = x.is_cuda
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(steps):
        train_step(model, x, opt, i, sync_loss)
    if cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps * 1e3
