"""kernellab's process-wide options in one object, ``kernellab.config`` (this module's ``config``).

Each option is an attribute. Set it in code (``kernellab.config.attn_autotune = False``,
or for a block ``with kernellab.config.override(attn_autotune=False): ...``), or through
its environment variable. The variable is read when the option is first used, never when
a module is imported; the value is then kept (``config.reset()`` forgets it, so the
variable is read again).

| option | variable | default | what it switches |
|---|---|---|---|
| ``attn_autotune`` | KERNELLAB_ATTN_AUTOTUNE | True | attention's Triton kernels time their candidate tiles (False: the first that fits) |
| ``attn_ws`` | KERNELLAB_ATTN_WS | "1" | attention's warp-specialized forward on Hopper ("0": the plain kernel) |
| ``attn_ws_bwd`` | KERNELLAB_ATTN_WS_BWD | "1" | its backward: "1" head-major layouts, "views" a fused projection's views too, "0" off |
| ``attn_split_d`` | KERNELLAB_ATTN_SPLIT_D | True | attention head dims 80, 96, ... in two tiles |
| ``check_targets`` | KERNELLAB_CHECK_TARGETS | False | cross_entropy's fused and linear_cross_entropy's triton backends check target values on the GPU too (one host sync a call) |
| ``triton_launch`` | KERNELLAB_TRITON_LAUNCH | "" | "jit": plain ``kernel[grid]`` launches instead of the lean launcher |
| ``fp32_dots`` | KERNELLAB_FP32_DOTS | "ieee" | matmul's Triton kernels with fp32 operands and TF32 off: "ieee" FMA products, "x3" three TF32 tensor-core dots a product (``ops/_triton_dots.py``) |
| ``matmul_plans`` | KERNELLAB_MATMUL_PLANS | True | matmul's Triton forward keeps per-shape launch plans (False: derives every launch per call) |
| ``cuda_launch`` | KERNELLAB_LAUNCH | "" | "core": CUDA kernels launch through ``cuda.core`` instead of ``cuLaunchKernel`` |
| ``cpp_nodes`` | KERNELLAB_CPP_NODES | "auto" | C++ autograd nodes (cuda/nodes.py): "auto" when built (on a GPU built in a background process), "build" at first use, "off" |
| ``default_by`` | KERNELLAB_DEFAULT_BY | "queued" | how ``backend=None`` ranks a table row: "queued" (device time alone where the fastest kernel takes 20 us or more: its host cost hides behind queued work; below that the larger of device and loop time), "loop" (the larger of device and loop time always); set before the first call (``registry.clear_cache()`` after a change) |

Paths are not options here: ``KERNELLAB_CACHE`` (the cache directory) and
``KERNELLAB_TABLES`` (tuning tables) are read where a path is needed.
"""

from __future__ import annotations

import contextlib
import os


def _flag(raw: str) -> bool:
    return raw not in ("", "0", "false", "False", "no")


# option -> (environment variable, parse, default)
_OPTIONS = {
    "attn_autotune": ("KERNELLAB_ATTN_AUTOTUNE", _flag, True),
    "attn_ws": ("KERNELLAB_ATTN_WS", str, "1"),
    "attn_ws_bwd": ("KERNELLAB_ATTN_WS_BWD", str, "1"),
    "attn_split_d": ("KERNELLAB_ATTN_SPLIT_D", _flag, True),
    "check_targets": ("KERNELLAB_CHECK_TARGETS", _flag, False),
    "triton_launch": ("KERNELLAB_TRITON_LAUNCH", str, ""),
    "fp32_dots": ("KERNELLAB_FP32_DOTS", str, "ieee"),
    "matmul_plans": ("KERNELLAB_MATMUL_PLANS", _flag, True),
    "cuda_launch": ("KERNELLAB_LAUNCH", str, ""),
    "cpp_nodes": ("KERNELLAB_CPP_NODES", str, "auto"),
    "default_by": ("KERNELLAB_DEFAULT_BY", str, "queued"),
}


class Config:
    """The options (module docstring). A value set or read once lives in the instance's
    ``__dict__``, so a hot path reads it as a plain attribute."""

    def __getattr__(self, name: str):
        spec = _OPTIONS.get(name)
        if spec is None:
            raise AttributeError(f"kernellab.config has no option {name!r}; options: {', '.join(_OPTIONS)}")
        env, parse, default = spec
        raw = os.environ.get(env)
        value = default if raw is None else parse(raw)
        self.__dict__[name] = value
        return value

    def __setattr__(self, name: str, value) -> None:
        if name not in _OPTIONS:
            raise AttributeError(f"kernellab.config has no option {name!r}; options: {', '.join(_OPTIONS)}")
        default = _OPTIONS[name][2]
        if not isinstance(value, type(default)):
            raise TypeError(f"kernellab.config.{name}: expected {type(default).__name__}, got {value!r}")
        self.__dict__[name] = value

    def reset(self, name: str | None = None) -> None:
        """Forget the value of ``name`` (None: of every option): the next use reads its
        environment variable again."""
        if name is not None and name not in _OPTIONS:
            raise AttributeError(f"kernellab.config has no option {name!r}; options: {', '.join(_OPTIONS)}")
        for n in [name] if name else list(_OPTIONS):
            self.__dict__.pop(n, None)

    @contextlib.contextmanager
    def override(self, **values):
        """The options set to ``values`` inside the block, as they were after it."""
        old = {n: self.__dict__.get(n, _UNSET) for n in values}
        try:
            for n, v in values.items():
                setattr(self, n, v)
            yield self
        finally:
            for n, v in old.items():
                if v is _UNSET:
                    self.__dict__.pop(n, None)
                else:
                    self.__dict__[n] = v

    def as_dict(self) -> dict:
        """Every option's value now (reading the unread ones' variables)."""
        return {n: getattr(self, n) for n in _OPTIONS}

    def __repr__(self) -> str:
        return "kernellab.config(" + ", ".join(f"{n}={getattr(self, n)!r}" for n in _OPTIONS) + ")"


_UNSET = object()
config = Config()
