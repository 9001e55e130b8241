"""What a check reports and how the parallel check splits it: the result types of
``kernellab check`` (``CaseResult`` per case, ``Report`` per implementation x dtype), the
statuses, and the stage groups and op weights by which ``harness.parallel`` splits a heavy
implementation over workers. ``harness.check`` makes them; ``harness.parallel`` and the CLI
read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PASS, FAIL, REFUSED, SKIP = "pass", "fail", "refused", "skip"


@dataclass
class CaseResult:
    # shape | rerun | special | layout | option | boundary | grad | integrity | recall | double
    # | opcheck | bad | fuzz | compile
    kind: str
    name: str
    status: str
    err: float | None = None
    bound: float | None = None
    detail: str = ""
    seconds: float = 0.0  # wall time of the case (set by check_impl)

    @property
    def ratio(self) -> float | None:
        if self.err is None or not self.bound:
            return None
        return self.err / self.bound


@dataclass
class Report:
    op: str
    backend: str
    dtype: str | None
    device: str
    status: str  # pass | fail | unavailable | compiled
    reason: str = ""
    seed: int = 0
    cases: list[CaseResult] = field(default_factory=list)
    seconds: float = 0.0  # wall time of the whole check of this implementation and dtype
    stage_seconds: dict[str, float] = field(default_factory=dict)  # per stage, in run order

    @property
    def failures(self) -> list[CaseResult]:
        return [c for c in self.cases if c.status == FAIL]

    @property
    def worst_ratio(self) -> float | None:
        r = [c.ratio for c in self.cases if c.ratio is not None and c.status == PASS]
        return max(r) if r else None

    def to_dict(self) -> dict:
        return {
            "op": self.op,
            "backend": self.backend,
            "dtype": self.dtype,
            "device": self.device,
            "status": self.status,
            "reason": self.reason,
            "seed": self.seed,
            "seconds": round(self.seconds, 3),
            "stage_seconds": {k: round(v, 3) for k, v in self.stage_seconds.items()},
            "cases": [c.__dict__ for c in self.cases],
        }


# How the parallel check splits one heavy implementation x dtype over 2 or 3 workers
# (method names of _Runner, in run order): forward cases; options and gradients; the rest.
STAGE_GROUPS = (
    ("shapes", "specials", "layouts", "arg_layouts"),
    ("options", "boundaries", "grads"),
    ("integrity_and_recall", "double_backward", "bad_inputs", "fuzz", "opchecks"),
)


# Ops whose kernels have many compiled variants (attention: causal x window x softcap x
# GQA x head-dim padding, forward and three backward kernels; conv2d and matmul: tile and
# epilogue variants): a quick check of one of their kernel backends takes 3-6x an
# elementwise op's on a GPU host. The parallel check splits an item
# this heavy over STAGE_GROUPS.
_OP_WEIGHT = {"attention": 6.0, "conv2d": 3.0, "matmul": 3.0, "batch_norm2d": 1.5, "bn_relu_pool2d": 1.5,
              "layer_norm": 1.5}  # fmt: skip
SPLIT_WEIGHT = 3.0
