"""What `kernellab asm` compiles is what the launchers launch: each op's Triton kernel
specs (``Impl.triton_kernels``) against the launch config of the shape the spec names
(constexprs, warps, stages, dot precision)."""

from __future__ import annotations

import re

import pytest
import torch

import kernellab
from kernellab.inspect import asm

TORCH = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _specs(op: str, dtype: str, backend: str = "triton") -> dict:
    """kernel name -> (constexprs, compile options) of the op's specs."""
    out = {}
    for kernel, _sig, cx, launch in kernellab.get(op, backend).triton_kernels(dtype):
        name = getattr(kernel, "__name__", None) or getattr(kernel, "fn", kernel).__name__
        out[name] = (cx, launch if isinstance(launch, dict) else {"num_warps": launch})
    return out


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_attention_specs_take_the_pruned_first_config_and_the_launch_precision(dtype):
    # fp32 keeps only tiles of at most 64 x 64 and 2 stages (_fit): the first config of the
    # unpruned list (64 x 64, 3 stages) is not what runs; its dots are "ieee" with TF32 off.
    from kernellab.ops.attention import triton as at

    t = TORCH[dtype]
    specs = _specs("attention", dtype)
    nargs = {"Q": torch.empty(0, dtype=t, device="meta"), "S_Q_KEY": 4096, "S_K_KEY": 4096}
    for tuner in (at._attn_fwd, at._attn_bwd_dkdv, at._attn_bwd_dq):
        cx, options = specs[tuner.fn.__name__]
        (cfg, *_) = tuner.early_config_prune(list(tuner.configs), nargs, BLOCK_D=128, BLOCK_D2=0)
        assert {k: cx[k] for k in cfg.kwargs} == cfg.kwargs, tuner.fn.__name__
        assert options == {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
        assert cx["PREC"] == at._prec(t, False)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_attention_specs_on_hopper_are_the_warp_specialized_backward(dtype):
    # At the spec's problem (S = 4096, D = 128, causal) a Hopper GPU runs the 16-bit backward
    # as _attn_bwd_pre + the warp-specialized dK/dV and dQ passes with their one tile each
    # (_ws_bwd_fits); fp32, and other archs, the autotuned ones after the same pre pass.
    from kernellab.ops.attention import triton as at

    impl = kernellab.get("attention", "triton")
    assert 4096 >= at.WS_BWD_MIN_S and 4096 % 128 == 0
    hopper = {getattr(k, "__name__", None) or k.fn.__name__: (cx, o) for k, _s, cx, o in
              asm.kernel_specs(impl, dtype, "sm_90")}  # fmt: skip
    other = _specs("attention", dtype)
    assert set(other) == {"_attn_fwd", "_attn_bwd_pre", "_attn_bwd_dkdv", "_attn_bwd_dq"}
    assert other["_attn_bwd_pre"][0]["BLOCK_M"] == 64  # the launcher's pre_m on a GPU
    if dtype == "fp32":
        assert hopper.keys() == other.keys()
        return
    assert set(hopper) == {"_attn_fwd", "_attn_bwd_pre", "_attn_bwd_dkdv_ws", "_attn_bwd_dq_ws"}
    for name, tile in (("_attn_bwd_dkdv_ws", at._WS_BWD_DKDV), ("_attn_bwd_dq_ws", at._WS_BWD_DQ)):
        cx, options = hopper[name]
        assert (cx["BLOCK_M"], cx["BLOCK_N"]) == (tile["BLOCK_M"], tile["BLOCK_N"])
        assert (cx["HEAD_D"], cx["CAUSAL"]) == (128, True)
        assert options == {"num_warps": tile["num_warps"], "num_stages": tile["num_stages"]}


def test_attention_ws_backward_compiles_for_sm90_with_tma():
    kernels, note = asm.triton_report(kernellab.get("attention", "triton"), "bf16", "sm_90")
    by = {k.name: k for k in kernels}
    assert {"_attn_bwd_dkdv_ws", "_attn_bwd_dq_ws", "_attn_bwd_pre", "_attn_fwd"} <= set(by), note
    for name in ("_attn_bwd_dkdv_ws", "_attn_bwd_dq_ws"):
        assert by[name].counts["ptx_tma"] > 0 and "wgmma" in by[name].ptx, name


def test_attention_fp32_compiles_without_tf32_dots():
    # PREC "ieee" (TF32 off, the launch's default): no TF32 MMA in the compiled forward.
    kernels, note = asm.triton_report(kernellab.get("attention", "triton"), "fp32", "sm_90")
    (fwd,) = [k for k in kernels if k.name == "_attn_fwd"]
    assert ".tf32" not in fwd.ptx, note
    (threads,) = re.findall(r"\.reqntid (\d+)", fwd.ptx)
    assert int(threads) == 32 * 4


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_conv2d_specs_take_each_gemms_tiles(dtype):
    # Each kernel with the tiles its launcher plans at the spec's layers (1: C 1 -> K 32,
    # 2: C 32 -> K 64, and C 8 -> K 16; 3x3): dgrad's N is C (BLOCK_N 32, not the forward's 64).
    from kernellab.ops.conv2d import triton as kt

    specs = _specs("conv2d", dtype)
    gpu = torch.device("cuda")
    tdt = torch.float32 if dtype == "fp32" else torch.bfloat16
    want = {
        "_conv_fwd_kernel": kt.fwd_plan(1, 3, 3, 32, tdt, gpu)[1],
        "_conv_dgrad_spread_kernel": kt.dgrad_plan(1, 3, 3, 32, tdt, gpu)[1],
        "_conv_dgrad_gather_kernel": dict(BLOCK=kt.dgrad_plan(1, 3, 3, 32, tdt, gpu)[1]["GATHER"],
                                          num_warps=4),  # fmt: skip
        "_conv_dgrad_stencil_kernel": kt.stencil_config(gpu),
        "_conv_dgrad_kernel": kt.dgrad_plan(8, 3, 3, 16, tdt, gpu)[1],
        "_conv_wgrad_kernel": kt.wgrad_plan(1, 3, 3, 32, tdt, gpu)[1],
        "_conv_fwd_taps_kernel": kt.fwd_plan(32, 3, 3, 64, tdt, gpu)[1],
        "_conv_dgrad_taps_kernel": kt.dgrad_plan(32, 3, 3, 64, tdt, gpu)[1],
        "_conv_wgrad_taps_kernel": kt.wgrad_plan(32, 3, 3, 64, tdt, gpu)[1],
    }
    assert set(specs) == set(want)
    for name, cfg in want.items():
        cx, options = specs[name]
        assert options["num_warps"] == cfg["num_warps"], name
        tiles = [b for b in ("BLOCK", "BLOCK_M", "BLOCK_N", "BLOCK_K", "ACC64") if b in cfg]
        assert {b: cx[b] for b in tiles} == {b: cfg[b] for b in tiles}, name
    assert specs["_conv_dgrad_taps_kernel"][0]["BLOCK_N"] == 32


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_matmul_specs_take_their_configs_stages(dtype):
    # fp32's 128 x 128 x 32 tile with 4 warps is a 4-stage config; Triton's default is 3.
    from kernellab.ops.matmul.triton import fma_config, matmul_configs, skinny_config

    specs = _specs("matmul", dtype)
    cx, options = specs["_matmul_kernel"]
    tile = {k: cx[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")}
    cfg = next(c for c in matmul_configs() if c.kwargs == tile and c.num_warps == options["num_warps"])
    assert options["num_stages"] == cfg.num_stages
    if dtype == "fp32":
        assert options["num_stages"] == 4
    if dtype == "fp32":  # TF32 off: the FMA kernel, M = 1 in a block of 1 row
        *_, warps, stages = fma_config(1, 4096, 4096, 132)
        assert specs["_skinny_fma_kernel"][0]["BLOCK_M"] == 1 and "_skinny_kernel" not in specs
        assert specs["_skinny_fma_kernel"][1] == {"num_warps": warps, "num_stages": stages}
    else:
        *_, warps, stages = skinny_config(1, 4096, 4096, 132, 2)
        assert specs["_skinny_kernel"][1] == {"num_warps": warps, "num_stages": stages}


@pytest.mark.parametrize("op, bits", [("int8_weight_only_matmul", 8), ("int4_weight_only_matmul", 4)])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_weight_only_specs_take_the_configs_stages(op, bits, dtype):
    # The M = 16 dot kernel launches with wo_config's 4 stages (Triton's default is 3).
    from kernellab.ops.weight_only_matmul.triton import wo_config

    specs = _specs(op, dtype)
    for name, m in (("_wo_gemv_kernel", 1), ("_wo_dot_kernel", 16)):
        cfg = wo_config(m, 14336, 4096, bits, 132)
        assert specs[name][1] == {"num_warps": cfg.warps, "num_stages": cfg.stages}, name
    assert specs["_wo_dot_kernel"][1]["num_stages"] == 4


def test_batch_norm_specs_split_as_the_launch_on_132_sms(monkeypatch):
    # SPLIT_P2 (the partials a channel's statistics reduce) follows the SM count: at the
    # specs' layer (C = 32 over 256 x 28 x 28) a 132-SM GPU cuts a channel in 33, so 64.
    from kernellab.ops.batch_norm_kernels import triton_kernels as bk

    monkeypatch.setattr(bk.triton_support, "sm_count", lambda index=None: 132)
    gpu = torch.device("cuda", 0)  # grid_of's GPU branch: nothing is allocated there
    c, m = bk.SPEC_C, bk.SPEC_M
    stats = bk.triton_support.next_pow2(bk.grid_of(c, m, gpu)[1])
    pooled = bk.triton_support.next_pow2(bk.grid_of(c, m // 4, gpu)[1])
    assert stats == 64
    assert pooled == 32  # bn_relu_pool2d's dx pass reads the pooled gradient's 25 partials
    want = {"_bn_fwd_apply_kernel": stats, "_bn_bwd_apply_kernel": stats, "_fwd_kernel": stats}
    want["_bwd_dx_kernel"] = pooled
    got = {**_specs("batch_norm2d", "fp32"), **_specs("bn_relu_pool2d", "fp32")}
    assert {name: got[name][0]["SPLIT_P2"] for name in want} == want
