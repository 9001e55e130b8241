"""The course's MNIST CNN, its ops from kernellab's registry, trained with plain SGD.

    conv3x3(1 -> 32, pad 1) -> batch_norm2d -> relu -> maxpool2      28x28 -> 14x14
    conv3x3(32 -> 64, pad 1) -> batch_norm2d -> relu -> maxpool2     14x14 -> 7x7
    flatten -> linear(64*7*7 -> 128) -> relu -> linear(128 -> 10) -> cross-entropy (log-softmax + NLL)

Batch norm uses batch statistics only (no running statistics, in training and evaluation
alike: ``nn.BatchNorm2d(track_running_stats=False)``); SGD without momentum or schedule.

One module, :class:`CNN`, owns the parameters as PyTorch modules (nn.Conv2d, nn.BatchNorm2d,
nn.Linear: PyTorch's initialization, drawn from one seed), and runs its forward through an
op set, as ``kernellab.models.gpt`` does. Each op is a named slot (SLOTS):

- ``"pytorch"``: the modules themselves (nn.Conv2d (cuDNN), nn.BatchNorm2d, F.relu,
  F.max_pool2d, nn.Linear, F.cross_entropy): the reference model of ``--compare``.
- a kernellab backend name (``"triton"``, ``"cuda"``, ...) or None (kernellab's default per
  op) for every slot: kernellab.conv2d, batch_norm2d, relu, max_pool2d, matmul (linear: x @
  w.T + bias, the first one with its relu in the matmul's epilogue) and cross_entropy.
- a dict slot -> backend for anything finer (the value ``"pytorch"`` keeps PyTorch's op
  for that slot).

With kernellab's bn, relu and pool, each block runs as conv2d -> bn_relu_pool2d (batch
norm, relu and 2x2 max pool in one op: no full-size activation between them; see
``CNN.set_ops`` for when, and ``fuse_pool=False`` for the unfused chain).

The same seed gives both op sets the same weights, the same data order and the same
batches, so their losses agree step by step up to rounding.

Data: ``kernellab.data.mnist.load`` (MNIST's IDX files, or the shipped digits), the whole
set on the device. :class:`Batches` draws a batch as a gather through a device-side
permutation (new each epoch) at a device-side cursor: no host work and no host-to-device
copy per step, so the whole step (batch load included) can be captured in a CUDA graph.

Variants of a training step (``Trainer``), timed by the course's protocol (batch load +
forward + backward + SGD update + zero-grad, averaged over 100 steps after warm-up, one
synchronization on each side of the timed window):
  eager     op by op from Python;
  compile   torch.compile of the forward and loss (PyTorch's ops; the update stays eager);
  graph     the whole step captured once in a CUDA graph and replayed (GPU only).
"""

from __future__ import annotations

import contextlib
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import record_function

import kernellab
from kernellab import optim

SLOTS = ("conv", "bn", "relu", "pool", "linear", "ce")
_OP_OF = {"conv": "conv2d", "bn": "batch_norm2d", "relu": "relu", "pool": "max_pool2d", "linear": "matmul",
          "ce": "cross_entropy"}  # fmt: skip
VARIANTS = ("eager", "compile", "graph")
BN_EPS = 1e-5


# --------------------------------------------------------------------------- op sets


# Layer slots (conv, bn, linear) take the nn module holding the parameters: PyTorch's op set
# calls the module itself (nn.Conv2d, nn.BatchNorm2d, nn.Linear: the reference model), a
# kernellab one reads its weight and bias.


def _kl_op(slot: str, be):
    if slot == "conv":
        return lambda x, m: kernellab.conv2d(x, m.weight, m.bias, 1, 1, backend=be)
    if slot == "bn":
        return lambda x, m, relu=False: kernellab.batch_norm2d(x, m.weight, m.bias, BN_EPS, relu, backend=be)
    if slot == "relu":
        return lambda x: kernellab.relu(x, backend=be)
    if slot == "pool":
        return lambda x: kernellab.max_pool2d(x, 2, backend=be)
    if slot == "ce":
        # check_targets=False: the labels were range-checked once when the data set was
        # loaded (kernellab.data.mnist refuses a label > 9); a per-step check would cost a
        # host wait (torch, manual backends) that PyTorch's F.cross_entropy does not pay.
        return lambda logits, y: kernellab.cross_entropy(logits, y, backend=be, check_targets=False)

    def linear(x, m, act=None):  # kernellab.matmul takes [M, K] @ [K, N]; bias and relu in its epilogue
        return kernellab.matmul(x, m.weight.t(), m.bias, act, backend=be)

    return linear


def _torch_ops() -> dict:
    def linear(x, m, act=None):
        y = m(x)
        return F.relu(y) if act == "relu" else y

    return dict(
        conv=lambda x, m: m(x),
        # nn.BatchNorm2d(track_running_stats=False): batch statistics always
        bn=lambda x, m, relu=False: F.relu(m(x)) if relu else m(x),
        relu=F.relu,
        pool=lambda x: F.max_pool2d(x, 2),
        linear=linear,
        ce=F.cross_entropy,
    )


def op_set(backends="pytorch") -> dict:
    """slot -> backend ('pytorch' for PyTorch's op) for ``backends`` (see the module doc)."""
    if isinstance(backends, dict):
        unknown = set(backends) - set(SLOTS)
        if unknown:
            raise ValueError(f"backends: unknown op slots {sorted(unknown)}; slots are {SLOTS}")
        chosen = {s: "pytorch" for s in SLOTS} | dict(backends)
    else:
        chosen = {s: backends for s in SLOTS}
    for slot, be in chosen.items():
        if be == "pytorch":
            continue
        if be is not None and not isinstance(be, str):
            raise TypeError(f"backends: {slot} must be a backend name, 'pytorch' or None, got {be!r}")
        op = _OP_OF[slot]
        if not callable(getattr(kernellab, op, None)):
            raise ValueError(f"backends: {slot} needs kernellab.{op}, which this build does not have")
        if be is not None:
            kernellab.get(op, be)  # KeyError naming the registered backends
    return chosen


# --------------------------------------------------------------------------- the model


class CNN(nn.Module):
    """The course's CNN (module docstring); ``backends`` picks the op set."""

    def __init__(self, backends="pytorch", channels=(32, 64), hidden=128, classes=10, fuse_bn_relu=None,
                 fuse_pool=None):  # fmt: skip
        super().__init__()
        c1, c2 = channels
        self.conv1 = nn.Conv2d(1, c1, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(c1, eps=BN_EPS, track_running_stats=False)
        self.conv2 = nn.Conv2d(c1, c2, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(c2, eps=BN_EPS, track_running_stats=False)
        self.fc1 = nn.Linear(c2 * 7 * 7, hidden)
        self.fc2 = nn.Linear(hidden, classes)
        self.set_ops(backends, fuse_bn_relu, fuse_pool)
        self.ranges = False  # profiler ranges per layer (``--profile``)

    def set_ops(self, backends, fuse_bn_relu=None, fuse_pool=None) -> None:
        """``fuse_bn_relu``: the blocks' relu inside kernellab.batch_norm2d (relu=True: one
        read and one write of the activation fewer each way); None: fused when the bn slot
        is kernellab's (then the relu slot serves no layer: fc1's relu is matmul's epilogue).

        ``fuse_pool``: each block's batch norm, relu and pool as one op,
        kernellab.bn_relu_pool2d (no full-size activation written or read; two launches
        fewer per block each way). None: fused when the bn, relu and pool slots are all
        kernellab's, bn and relu are fused (``fuse_bn_relu`` not False) and bn_relu_pool2d
        has the bn slot's backend (or the bn slot is kernellab's default); the fused op then
        runs with the bn slot's backend. True: fused whatever the slots, with that backend
        where bn_relu_pool2d has it, else its default."""
        self.chosen = op_set(backends)
        torch_ops = _torch_ops()
        self.ops = {s: (torch_ops[s] if be == "pytorch" else _kl_op(s, be)) for s, be in self.chosen.items()}
        self.fuse = self.chosen["bn"] != "pytorch" if fuse_bn_relu is None else bool(fuse_bn_relu)
        bn = self.chosen["bn"]
        has = bn is None or (bn != "pytorch" and any(i.backend == bn for i in kernellab.impls("bn_relu_pool2d")))
        if fuse_pool is None:
            kl = all(self.chosen[s] != "pytorch" for s in ("bn", "relu", "pool"))
            self.fuse_pool = kl and has and self.fuse
        else:
            self.fuse_pool = bool(fuse_pool)
        if self.fuse_pool:
            be = bn if has else None
            self.ops["block"] = lambda x, m: kernellab.bn_relu_pool2d(x, m.weight, m.bias, BN_EPS, backend=be)

    @property
    def is_pytorch(self) -> bool:
        return all(be == "pytorch" for be in self.chosen.values())

    def _range(self, name):
        return record_function(name) if self.ranges else contextlib.nullcontext()

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        o = self.ops
        for i, (conv, bn) in enumerate(((self.conv1, self.bn1), (self.conv2, self.bn2)), 1):
            with self._range(f"conv{i}"):
                x = o["conv"](x, conv)
            if self.fuse_pool:
                with self._range(f"bn{i}+relu+pool{i}"):
                    x = o["block"](x, bn)
                continue
            if self.fuse:
                with self._range(f"bn{i}+relu"):
                    x = o["bn"](x, bn, relu=True)
            else:
                with self._range(f"bn{i}"):
                    x = o["bn"](x, bn)
                with self._range(f"relu{i}"):
                    x = o["relu"](x)
            with self._range(f"pool{i}"):
                x = o["pool"](x)
        x = x.reshape(x.shape[0], -1)
        with self._range("fc1+relu"):
            x = o["linear"](x, self.fc1, "relu")
        with self._range("fc2"):
            return o["linear"](x, self.fc2)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = self.logits(x)
        with self._range("cross_entropy"):
            return self.ops["ce"](logits, y)


def make(backends="pytorch", device=None, seed=0, dtype=torch.float32, fuse_bn_relu=None, fuse_pool=None) -> CNN:
    """A CNN with weights drawn from ``seed`` (the same for every op set)."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(seed)
    return CNN(backends, fuse_bn_relu=fuse_bn_relu, fuse_pool=fuse_pool).to(device=device, dtype=dtype)


def default_choices(batch: int, device: str, data=None) -> list[dict]:
    """What kernellab's default (``backends=None``) runs for each op of a training step at
    ``batch`` on ``device``: one forward of a fresh model (weights requiring grad, so the
    forward+backward rows) through ``registry.recording_choices``."""
    from kernellab.core import registry

    model = make(None, device, 0)
    x = data.train_x[:batch] if data is not None else torch.zeros(batch, 1, 28, 28, device=device)
    y = data.train_y[:batch] if data is not None else torch.zeros(batch, dtype=torch.long, device=device)
    with registry.recording_choices() as rec:
        model(x, y)
    return rec


# --------------------------------------------------------------------------- data


class Batches:
    """Batches of ``batch`` images drawn without replacement through a device-side
    permutation: ``next()`` gathers rows perm[cursor : cursor + batch] (cursor a device
    tensor, advanced in place), so it is capturable in a CUDA graph. ``new_epoch()``
    draws a new permutation (in place) and rewinds; an epoch is ``len(x) // batch`` steps
    (the tail that does not fill a batch is left out, as drop_last does)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, batch: int, seed: int = 0):
        if not 1 <= batch <= x.shape[0]:
            raise ValueError(f"batch size must be in [1, {x.shape[0]}] (the training images), got {batch}")
        self.x, self.y, self.batch = x, y, batch
        self.n = x.shape[0]
        self.steps_per_epoch = self.n // batch
        self.gen = torch.Generator(device=x.device).manual_seed(seed)
        self.perm = torch.empty(self.n, dtype=torch.int64, device=x.device)
        self.cursor = torch.zeros((), dtype=torch.int64, device=x.device)
        self.offsets = torch.arange(batch, device=x.device)
        self.new_epoch()

    def new_epoch(self) -> None:
        self.perm.copy_(torch.randperm(self.n, generator=self.gen, device=self.x.device))
        self.cursor.zero_()

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        # (cursor + offsets) % n: a capture replayed past the epoch's end wraps around
        # instead of reading out of bounds (the training loop starts a new epoch first).
        idx = self.perm.index_select(0, (self.cursor + self.offsets) % self.n)
        self.cursor.add_(self.batch)
        return self.x.index_select(0, idx), self.y.index_select(0, idx)


# --------------------------------------------------------------------------- training step


class Trainer:
    """One model, its SGD update and a step function in one of VARIANTS.

    PyTorch's op set updates with torch.optim.SGD (foreach: the multi-tensor kernel);
    kernellab's packs its parameters (``optim.pack_``) and updates them with one launch of
    ``kernellab.sgd_step`` (``sgd`` backend; default: triton where Triton runs compiled, else
    torch's foreach) and zeroes the packed gradients with one fill."""

    def __init__(self, model: CNN, batches: Batches, variant: str = "eager", lr: float = 0.05, sgd=None):
        if variant not in VARIANTS:
            raise ValueError(f"variant: unknown {variant!r}; variants: {', '.join(VARIANTS)}")
        self.model, self.batches, self.variant, self.lr = model, batches, variant, float(lr)
        self.params = list(model.parameters())
        self.cuda = self.params[0].is_cuda
        if variant == "graph" and not self.cuda:
            raise ValueError("variant: 'graph' (a CUDA graph of the whole step) needs a GPU")
        self.fwd = torch.compile(model) if variant == "compile" else model
        if model.is_pytorch:
            self.opt = torch.optim.SGD(self.params, lr=self.lr, foreach=True)
            self.grads = None
        else:
            self.opt = None
            _, self.flat_grad = optim.pack_(self.params)
            self.grads = [p.grad for p in self.params]
            self.sgd = sgd
        self.graph = None
        self.loss = None
        self.warm_losses: list[float] = []

    def _step(self) -> torch.Tensor:
        x, y = self.batches.next()
        loss = self.fwd(x, y)
        loss.backward()
        if self.opt is not None:
            self.opt.step()
            self.opt.zero_grad(set_to_none=self.graph is None and self.variant != "graph")
        else:
            kernellab.sgd_step(self.params, self.grads, self.lr, backend=self.sgd)
            self.flat_grad.zero_()
        return loss.detach()

    def _capture(self) -> None:
        # Warm up on a side stream (allocations, lazy initialization, Triton compilation),
        # then capture one whole step. The warm-up steps train like any other step.
        if self.opt is not None:
            self.opt.zero_grad(set_to_none=False)
            for p in self.params:  # grads must exist before capture (accumulated in place)
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            warm = [self._step() for _ in range(3)]
        torch.cuda.current_stream().wait_stream(s)
        self.warm_losses = [float(v) for v in warm]  # steps 1-3 (the first replay is step 4)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.loss = self._step()

    def step(self) -> torch.Tensor:
        """One training step; returns the loss (a device tensor; in the graph variant the
        graph's static output, overwritten by the next step: clone it to keep it)."""
        if self.variant == "graph":
            if self.graph is None:
                self._capture()
            self.graph.replay()
            return self.loss
        return self._step()


# --------------------------------------------------------------------------- evaluation


@torch.no_grad()
def accuracy(model: CNN, x: torch.Tensor, y: torch.Tensor, batch: int = 1000) -> float:
    """Fraction of ``x`` classified right, in batches of ``batch`` (batch statistics: the
    model keeps no running ones)."""
    right = 0
    for i in range(0, x.shape[0], batch):
        right += int((model.logits(x[i : i + batch]).argmax(1) == y[i : i + batch]).sum())
    return right / max(1, x.shape[0])


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def time_steps(trainer: Trainer, warmup: int = 10, steps: int = 100) -> dict:
    """The course's protocol: ``warmup`` steps, then ``steps`` steps between two syncs
    (batch load + forward + backward + update + zero-grad each); ms per step. Also the
    loss of the first warm-up step (the variants' sanity check: same seed, same loss)."""
    dev = trainer.params[0].device
    t0 = time.perf_counter()
    first = float(trainer.step())
    if trainer.warm_losses:  # a graph: the first replay was step 4
        first = trainer.warm_losses[0]
    for _ in range(warmup - 1):
        trainer.step()
    _sync(dev)
    warm = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(steps):
        trainer.step()
    _sync(dev)
    ms = (time.perf_counter() - t0) / steps * 1e3
    return {"ms_per_step": ms, "steps": steps, "warmup": warmup, "warmup_s": warm, "first_loss": first}


# --------------------------------------------------------------------------- runs


def train(
    backends="pytorch",
    batch_size=64,
    epochs=1,
    lr=0.05,
    data_dir=None,
    device=None,
    seed=0,
    variant="eager",
    sgd=None,
    max_steps=None,
    on_step=None,
    on_epoch=None,
    data=None,
    fuse_pool=None,
) -> dict:
    """Train for ``epochs`` epochs; returns ``losses`` (every step), ``test_acc`` (after
    every epoch), ``ms_per_step`` (mean over all steps, host timed, the first epoch's
    warm-up included) and ``source``. ``on_step(i, loss, acc, ms)`` is called after each step
    (it reads the loss: one sync per step); ``on_epoch(epoch, test_acc)`` after each epoch.
    ``max_steps`` stops early (tests). ``fuse_pool``: see ``CNN.set_ops`` (None: where it
    applies)."""
    from kernellab.data import mnist as mnist_data

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    d = data if data is not None else mnist_data.load(data_dir, device)
    model = make(backends, device, seed, fuse_pool=fuse_pool)
    batches = Batches(d.train_x, d.train_y, batch_size, seed)
    trainer = Trainer(model, batches, variant, lr, sgd)
    losses, accs, times = [], [], []
    step = 0
    for epoch in range(epochs):
        if epoch:
            batches.new_epoch()
        while int(batches.cursor) + batches.batch <= batches.steps_per_epoch * batches.batch:
            t0 = time.perf_counter()
            first_capture = variant == "graph" and trainer.graph is None
            loss = float(trainer.step())
            ms = (time.perf_counter() - t0) * 1e3
            if first_capture:  # the capture trained 3 warm-up steps before the first replay
                losses += trainer.warm_losses
                step += len(trainer.warm_losses)
            losses.append(loss)
            times.append(ms)
            step += 1
            if on_step is not None:
                on_step(step, loss, ms)
            if max_steps is not None and step >= max_steps:
                break
        accs.append(accuracy(model, d.test_x, d.test_y))
        if on_epoch is not None:
            on_epoch(epoch + 1, accs[-1])
        if max_steps is not None and step >= max_steps:
            break
    return {"losses": losses, "test_acc": accs, "ms_per_step": statistics.mean(times), "source": d.source,
            "steps_per_epoch": batches.steps_per_epoch, "model": model}  # fmt: skip


# Variants of ``compare``: name -> (op set, step variant). The kernellab op set is the
# ``backend`` argument of compare().
COMPARE = {
    "pytorch_eager": ("pytorch", "eager"),
    "pytorch_compile": ("pytorch", "compile"),
    "pytorch_graph": ("pytorch", "graph"),
    "kernellab_eager": ("kernellab", "eager"),
    "kernellab_graph": ("kernellab", "graph"),
}


def compare(
    batch_sizes=(64, 256, 1024),
    variants=tuple(COMPARE),
    backend=None,
    data_dir=None,
    device=None,
    warmup=10,
    steps=100,
    lr=0.05,
    seed=0,
    profile=False,
    on_row=None,
    on_note=None,
    data=None,
    fuse_bn_relu=None,
    fuse_pool=None,
) -> list[dict]:
    """ms per training step of every variant x batch size, same weights and data. A
    variant that cannot run here (a CUDA graph on the CPU) is skipped with a note; one that
    fails gives a row with ``error``. ``profile``: a torch.profiler table per variant and
    batch size (per-layer ranges, ``CNN.ranges``) in the row's ``profile`` field."""
    from kernellab.data import mnist as mnist_data

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    d = data if data is not None else mnist_data.load(data_dir, device)
    rows = []
    for b in batch_sizes:
        for name in variants:
            ops, variant = COMPARE[name]
            row = {"bench": "mnist_step", "variant": name, "batch": b, "ops": ops if ops == "pytorch" else
                   f"kernellab:{backend or 'default'}", "device": device}  # fmt: skip
            if variant == "graph" and torch.device(device).type != "cuda":
                if on_note is not None:
                    on_note(f"{name} at batch {b}: skipped (a CUDA graph needs a GPU)")
                continue
            try:
                model = make("pytorch" if ops == "pytorch" else backend, device, seed, fuse_bn_relu=fuse_bn_relu,
                             fuse_pool=None if ops == "pytorch" else fuse_pool)  # fmt: skip
                row["fused_bn_relu"] = model.fuse
                row["fused_pool"] = model.fuse_pool
                trainer = Trainer(model, Batches(d.train_x, d.train_y, b, seed), variant, lr)
                row.update(time_steps(trainer, warmup, steps))
                if profile:
                    row["profile"] = profile_steps(trainer)
            except Exception as e:  # noqa: BLE001 - reported in its row
                row["error"] = f"{type(e).__name__}: {e}"[:400]
            torch._dynamo.reset()
            rows.append(row)
            if on_row is not None:
                on_row(row)
    return rows


def profile_steps(trainer: Trainer, steps: int = 5, rows: int = 25) -> str:
    """torch.profiler table of ``steps`` steps (per-layer ranges on), by device time on a
    GPU (CPU time here)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = trainer.cuda
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    trainer.model.ranges = True
    try:
        _sync(trainer.params[0].device)
        with profile(activities=acts) as prof:
            for _ in range(steps):
                trainer.step()
            _sync(trainer.params[0].device)
    finally:
        trainer.model.ranges = False
    key = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=rows)
